"""RLX: a source-to-source ML compiler for tensor programs.

>>> import rlx
>>> g = rlx.Graph("double")
>>> x = g.input("x", [3])
>>> g.set_outputs([g.add_(x, x)])
>>> rlx.reference.run(g, {"x": rlx.np.arange(3, dtype="float32")})[0].tolist()
[0.0, 2.0, 4.0]

`import rlx` loads what building a graph and a warm compile need; the optimizer's entry points,
autodiff, the numpy reference and artifact loading load on first use (`_LAZY`).
"""

# ruff: noqa: E402 - the import hook goes in before anything else loads
# First: the hook that records compiler modules as they load from their files (the driver's compile
# index trusts only those: see rlx.pristine), installed before any of them loads.
from rlx import pristine as _pristine

_pristine.install()

import importlib

import numpy as np

from rlx import cache, driver
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
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.hir import HirModule
from rlx.ir.lir import LirModule
from rlx.ir.module import GraphModule
from rlx.ir.shape import Dim, Shape
from rlx.runtime.compiled import CompiledGraph

# Not lazy: `rlx.trace` is also a submodule's name, which an import of that submodule would bind here.
from rlx.trace import CustomOp, TracedTensor, Tracer, custom_op, trace
from rlx.version import __version__

#: Public names that load on first use: name -> (module, attribute; None for the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
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
    from rlx.opt.quantize import quantize as quantize_mir

    return quantize_mir(driver.to_mir(graph), mode)


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'rlx' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
