"""The norm kinds read once: which of a norm node's inputs is x, the residual, the bias, gamma and beta.

Four op kinds normalize a row: `layer_norm(x, gamma, beta)`, `rms_norm(x, gamma)` and their fused-residual
forms `(x, residual[, bias], gamma[, beta])` (rlx/opt/fusion.py), whose bias is present or not. Every backend
and every fusion decision asks `norm_inputs` instead of testing op classes itself.

>>> from rlx.ir import ops as O
>>> from rlx.ir.graph import Graph
>>> g = Graph("n")
>>> x, r, w = g.input("x", [2, 8]), g.input("r", [2, 8]), g.input("w", [8])
>>> y = g.add(O.FusedResidualRmsNorm(1e-6), [x, r, w])
>>> n = norm_inputs(g.node(y))
>>> n.rms, n.residual == r, n.bias, n.params == (w,), n.kernel_kind
(True, True, None, True, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.errors import IRError
from rlx.ir.graph import Node, NodeId

#: Norm op kind (rlx.ir.ops: LayerNorm, RmsNorm, FusedResidualLayerNorm, FusedResidualRmsNorm) ->
#: (RMS: gamma only, else gamma and beta; has a residual input).
_KINDS = {"layer_norm": (False, False), "rms_norm": (True, False), "fused_residual_layer_norm": (False, True),
          "fused_residual_rms_norm": (True, True)}
#: The op kinds that normalize a row.
NORM_KINDS = tuple(_KINDS)


@dataclass(frozen=True)
class NormInputs:
    """A norm node's inputs by role; `residual`, `bias` and `beta` are None where the kind has none."""

    rms: bool
    x: NodeId
    residual: NodeId | None
    bias: NodeId | None
    gamma: NodeId
    beta: NodeId | None

    @property
    def params(self) -> tuple[NodeId, ...]:
        """gamma, and beta for a layer norm (the norm's learned parameters, last among its inputs)."""
        return (self.gamma,) if self.beta is None else (self.gamma, self.beta)

    @property
    def kernel_kind(self) -> int:
        """The norm's id in the kernels that compute one in their prologue (1: layer norm, 2: RMS norm)."""
        return 2 if self.rms else 1


def is_norm(node: Node) -> bool:
    return node.kind in _KINDS


def norm_inputs(node: Node) -> NormInputs:
    """The roles of `node`'s inputs (`node` is one of NORM_KINDS)."""
    if node.kind not in _KINDS:
        raise IRError(f"%{node.id} ({node.kind}) is not a norm; norms are {NORM_KINDS}")
    rms, fused = _KINDS[node.kind]
    ins = node.inputs
    n_params = 1 if rms else 2
    res = ins[1] if fused else None
    bias = ins[2] if fused and len(ins) == 3 + n_params else None
    return NormInputs(rms=rms, x=ins[0], residual=res, bias=bias, gamma=ins[-n_params],
                      beta=None if rms else ins[-1])
