"""RLX: a source-to-source ML compiler for tensor programs.

>>> import rlx
>>> g = rlx.Graph("double")
>>> x = g.input("x", [3])
>>> g.set_outputs([g.add_(x, x)])
>>> rlx.reference.run(g, {"x": rlx.np.arange(3, dtype="float32")})[0].tolist()
[0.0, 2.0, 4.0]
"""

import numpy as np

from rlx import cache, driver, reference
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
from rlx.opt.autodiff import grad, jacfwd, jvp, vjp
from rlx.opt.memplan import plan
from rlx.opt.pipeline import optimize
from rlx.opt.quantize import quantize as _quantize_mir
from rlx.runtime.artifact_load import load
from rlx.runtime.compiled import CompiledGraph
from rlx.trace import TracedTensor, Tracer, trace
from rlx.version import __version__


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
    return _quantize_mir(driver.to_mir(graph), mode)


# Last: everything above loaded from its files and no user code has run yet (any `import rlx.x`
# runs this file first), so the driver's compile index may trust these modules as they are now.
driver.record_pristine_modules()


def __getattr__(name: str) -> object:
    # rlx.from_onnx is looked up lazily so `import rlx` stays free of the frontends (and of onnx).
    if name == "from_onnx":
        from rlx.frontends.onnx import from_onnx

        return from_onnx
    if name == "shard":  # tensor parallelism (rlx.distributed.tp), lazily: it pulls in the BERT model code
        from rlx.distributed.tp import shard

        return shard
    raise AttributeError(f"module 'rlx' has no attribute {name!r}")


__all__ = [
    "grad", "jacfwd", "jvp", "vjp",
    "__version__",
    "ArtifactError",
    "BuildError",
    "CacheError",
    "CompiledGraph",
    "Config",
    "CudaError",
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
