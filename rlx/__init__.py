"""RLX: a source-to-source ML compiler for tensor programs.

>>> import rlx
>>> g = rlx.Graph("double")
>>> x = g.input("x", [3])
>>> g.set_outputs([g.add_(x, x)])
>>> rlx.reference.run(g, {"x": rlx.np.arange(3, dtype="float32")})[0].tolist()
[0.0, 2.0, 4.0]

`import rlx` loads the driver (`Session`, `Device`), the config and the errors; every other public
name (the IR's classes, the tracer, the runtime, the optimizer's entry points, autodiff, the numpy
reference, artifact loading) loads on first use (`_LAZY`, PEP 562), so a warm start that finds its
built object by recipe never imports the IR's op classes.
"""

from __future__ import annotations

# ruff: noqa: E402 - the import hook goes in before anything else loads
# First: the hook that records compiler modules as they load from their files (the driver's compile
# index trusts only those: see rlx.pristine), installed before any of them loads.
from rlx import pristine as _pristine

_pristine.install()

import sys
import types
from typing import TYPE_CHECKING

from rlx.lazy import lazy_names


class _Package(types.ModuleType):
    """rlx's module type: an import of the submodule `rlx.trace` binds the function `trace` here, not the module.

    (The import system sets a package's attribute to each submodule that loads; `rlx.trace` is a public
    function whose module has the same name, and loads lazily, so any later import of the module
    would otherwise replace the function.)
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name == "trace" and isinstance(value, types.ModuleType) and value.__name__ == "rlx.trace":
            value = value.trace
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

import numpy as np

from rlx.config import Config
from rlx.driver import Device, Session
from rlx.errors import (
    ArtifactError,
    BuildError,
    CacheError,
    CudaError,
    ExecutionError,
    IRError,
    RlxError,
    ShapeError,
)
from rlx.version import __version__

if TYPE_CHECKING:
    from rlx.ir.graph import Graph

#: Public names that load on first use: name -> (module, attribute; None for the module itself). The IR,
#: the tracer and the runtime stay out of `import rlx`: a warm start (`rlx.models.SentenceEmbedder` on a
#: cache hit) needs none of the IR's op classes.
_LAZY: dict[str, tuple[str, str | None]] = {
    "cache": ("rlx.cache", None),
    "CompiledGraph": ("rlx.runtime.compiled", "CompiledGraph"),
    "DType": ("rlx.ir.dtype", "DType"),
    "Graph": ("rlx.ir.graph", "Graph"),
    "HirModule": ("rlx.ir.hir", "HirModule"),
    "LirModule": ("rlx.ir.lir", "LirModule"),
    "GraphModule": ("rlx.ir.module", "GraphModule"),
    "Dim": ("rlx.ir.shape", "Dim"),
    "Shape": ("rlx.ir.shape", "Shape"),
    "CustomOp": ("rlx.trace", "CustomOp"),
    "TracedTensor": ("rlx.trace", "TracedTensor"),
    "Tracer": ("rlx.trace", "Tracer"),
    "custom_op": ("rlx.trace", "custom_op"),
    "trace": ("rlx.trace", "trace"),  # the function; the submodule never takes its place (_Package)
    "devices": ("rlx.toolchain.devices", "devices"),
    "grad": ("rlx.opt.autodiff", "grad"),
    "jacfwd": ("rlx.opt.autodiff", "jacfwd"),
    "jvp": ("rlx.opt.autodiff", "jvp"),
    "vjp": ("rlx.opt.autodiff", "vjp"),
    "plan": ("rlx.opt.memplan", "plan"),
    "optimize": ("rlx.opt.pipeline", "optimize"),
    "load": ("rlx.runtime.artifact_load", "load"),
    "reference": ("rlx.reference", None),
    # the frontends (and onnx) and tensor parallelism (the BERT model code) stay out of `import rlx`
    "from_onnx": ("rlx.frontends.onnx", "from_onnx"),
    "shard": ("rlx.distributed.tp", "shard"),
}


def quantize(graph: object, mode: str = "int8-dynamic") -> Graph:
    """`graph` (a MIR Graph, HirModule or GraphModule) optimized, its linear layers in int8.

    `rlx.opt.quantize.quantize` on the graph's MIR: weights stay f32 params (set_param takes
    them as before; the CPU quantizes them per output channel when set), activations are
    quantized per row at run time.

    >>> import rlx
    >>> g = rlx.Graph("lin")
    >>> x, w = g.input("x", [2, 8]), g.param("w", [4, 8])
    >>> g.set_outputs([g.matmul(x, g.transpose(w, [1, 0]))])
    >>> [n.kind for n in rlx.quantize(g, "int8-dynamic").nodes]
    ['input', 'param', 'int8_matmul']
    """
    from rlx.driver import to_mir
    from rlx.opt.quantize import quantize as quantize_mir

    return quantize_mir(to_mir(graph), mode)


__getattr__, __dir__ = lazy_names(globals(), _LAZY, cache=True)


# Last: everything above loaded from its files and no user code has run yet (any `import rlx.x`
# runs this file first), so the driver's compile index may trust these modules as they are now.
_pristine.end_own_import()


__all__ = [
    "grad", "jacfwd", "jvp", "vjp",
    "__version__",
    "ArtifactError",
    "BuildError",
    "CacheError",
    "CompiledGraph",
    "Config",
    "CudaError",
    "CustomOp",
    "DType",
    "Device",
    "Dim",
    "ExecutionError",
    "Graph",
    "GraphModule",
    "HirModule",
    "IRError",
    "LirModule",
    "RlxError",
    "Shape",
    "Session",
    "ShapeError",
    "TracedTensor",
    "Tracer",
    "cache",
    "custom_op",
    "devices",
    "from_onnx",
    "quantize",
    "shard",
    "load",
    "np",
    "optimize",
    "plan",
    "reference",
    "trace",
]
