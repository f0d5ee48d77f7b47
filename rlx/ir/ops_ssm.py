"""MIR ops of state-space and linear-attention layers (Mamba, Gated DeltaNet) and their causal conv.

These ops register in the MIR op set (`rlx.ir.ops.OPS`) when this module is
imported (`rlx.ir.graph` imports it), so the serializer, the LIR hash and the
backends' rule tables know them like any other op. Their meaning is written
once, in `rlx/reference.py`.

Shapes follow the original RLX IR (rlx-ir 0.2.x):

- `selective_scan(x, delta, A, B, C[, state])`: x, delta `[b, s, h]`, A `[h, n]`, B, C
  `[b, s, n]` → y `[b, s, h]`; the `carry_state` form takes a state input
  `[b, h, n]` it reads as the initial state and updates in place (decode). Mamba's skip term `D * x` and output gate
  `silu(z)` are not part of the op (as in the seeds): they are two
  elementwise ops around it, which the optimizer fuses.
- `gated_delta_net(q, k, v, g, beta[, state])`: q, k, v `[b, s, h, n]`, g and
  beta `[b, s, h]` → o `[b, s, h, n]`; the `carry_state` form takes a state
  input `[b, h, n, n]` it reads as the initial state and updates in place.
- `depthwise_conv1d_causal(x, weight[, left_pad[, lengths]])`: x `[b, s, c]`, weight
  `[c, k]`, left_pad `[b, k-1, c]` (the previous k-1 inputs; zeros when
  absent) → `[b, s, c]`; the `carry_state` form also takes lengths i32 `[b]`
  (how many of each row's s inputs are real) and leaves in left_pad the last
  k-1 inputs of each row up to its length (a conv state, updated in place).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx.errors import ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op, _require_float, _same_float_dtype
from rlx.ir.shape import Dim, Shape


def _want(kind: str, name: str, got: Shape, dims: Sequence[Dim]) -> None:
    if got.dims != tuple(dims):
        raise ShapeError(f"{kind} {name} must be [{','.join(map(str, dims))}], got {got}")


def _positive(kind: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(f"{kind} {name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class SelectiveScan(Op):
    """Mamba's selective scan, state `[n]` per (batch, channel), starting at zero.

    For every batch b and channel h: ``s_t = exp(delta_t * A[h]) * s_{t-1} +
    delta_t * x_t * B_t`` and ``y_t = <s_t, C_t>``. `state_size` is n. With
    `carry_state` a sixth input `[b, h, n]` is the initial state and receives
    the final one (in place, like a KV cache). A step with delta 0 leaves the
    state exactly as it was (how a padded token is skipped).
    """

    kind: ClassVar[str] = "selective_scan"
    arity: ClassVar[tuple[int, int]] = (5, 6)
    state_size: int
    carry_state: bool = False

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _positive("selective_scan", "state_size", self.state_size)
        want = 6 if self.carry_state else 5
        if len(inputs) != want:
            raise ShapeError(f"selective_scan with carry_state={self.carry_state} takes {want} inputs, "
                             f"got {len(inputs)}")
        x, delta, a, b, c = inputs[:5]
        _same_float_dtype("selective_scan", inputs)
        _require_float("selective_scan", x)
        if x.rank != 3:
            raise ShapeError(f"selective_scan x must be [batch, seq, channels], got {x}")
        bsz, seq, h = x.dims
        n = Dim(self.state_size)
        _want("selective_scan", "delta", delta, (bsz, seq, h))
        _want("selective_scan", "A", a, (h, n))
        _want("selective_scan", "B", b, (bsz, seq, n))
        _want("selective_scan", "C", c, (bsz, seq, n))
        if self.carry_state:
            _want("selective_scan", "state", inputs[5], (bsz, h, n))
        return x


@dataclass(frozen=True)
class GatedDeltaNet(Op):
    """The gated delta rule (Qwen3-Next, Kimi-Linear), state `S [n_k, n_v]` per (batch, head).

    Per step t: ``S = exp(g_t) * S``; ``u = beta_t * (v_t - S^T k_t)``;
    ``S = S + k_t u^T``; ``o_t = S^T (scale * q_t)``. `scale` defaults to
    ``1/sqrt(n)``. With `carry_state` a sixth input `[b, h, n, n]` is the
    initial state and receives the final one (in place, like a KV cache);
    otherwise the state starts at zero.
    """

    kind: ClassVar[str] = "gated_delta_net"
    arity: ClassVar[tuple[int, int]] = (5, 6)
    state_size: int
    carry_state: bool = False
    scale: float | None = None

    @property
    def q_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.state_size)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _positive("gated_delta_net", "state_size", self.state_size)
        if self.scale is not None and (isinstance(self.scale, bool) or not isinstance(self.scale, (int, float))
                                       or not math.isfinite(self.scale)):
            raise ShapeError(f"gated_delta_net scale must be a finite number, got {self.scale!r}")
        want = 6 if self.carry_state else 5
        if len(inputs) != want:
            raise ShapeError(f"gated_delta_net with carry_state={self.carry_state} takes {want} inputs, "
                             f"got {len(inputs)}")
        q, k, v, g, beta = inputs[:5]
        _same_float_dtype("gated_delta_net", inputs)
        _require_float("gated_delta_net", q)
        if q.rank != 4 or q.dims[3] != self.state_size:
            raise ShapeError(f"gated_delta_net q must be [batch, seq, heads, {self.state_size}], got {q}")
        bsz, seq, h, n = q.dims
        _want("gated_delta_net", "k", k, q.dims)
        _want("gated_delta_net", "v", v, q.dims)
        _want("gated_delta_net", "g", g, (bsz, seq, h))
        _want("gated_delta_net", "beta", beta, (bsz, seq, h))
        if self.carry_state:
            _want("gated_delta_net", "state", inputs[5], (bsz, h, n, n))
        return q


@dataclass(frozen=True)
class DepthwiseConv1dCausal(Op):
    """Causal depthwise 1-D convolution along the sequence axis.

    ``y[b, t, c] = sum_j weight[c, j] * xp[b, t + j, c]`` where `xp` is
    `left_pad` (or k-1 zeros) followed by x: output t sees inputs t-k+1 .. t.
    With `reverse` (the transpose, which the derivative uses) output t sees
    inputs t .. t+k-1 instead: ``y[t] = sum_j weight[c, j] * x[t + k-1 - j]``,
    zeros past the end, and takes no left pad.

    With `carry_state` the left pad is a conv state: a fourth input `lengths`
    i32 `[b]` says how many of each row's inputs are real (0..s), and after the
    outputs are computed the state receives, in place, the last k-1 rows of
    (left pad, x[:length]) — unchanged for a row of length 0.
    """

    kind: ClassVar[str] = "depthwise_conv1d_causal"
    arity: ClassVar[tuple[int, int]] = (2, 4)
    kernel_size: int
    reverse: bool = False
    carry_state: bool = False

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _positive("depthwise_conv1d_causal", "kernel_size", self.kernel_size)
        x, w = inputs[:2]
        floats = inputs[:3]
        _same_float_dtype("depthwise_conv1d_causal", floats)
        _require_float("depthwise_conv1d_causal", x)
        if x.rank != 3:
            raise ShapeError(f"depthwise_conv1d_causal x must be [batch, seq, channels], got {x}")
        _want("depthwise_conv1d_causal", "weight", w, (x.dims[2], Dim(self.kernel_size)))
        if len(inputs) >= 3 and self.reverse:
            raise ShapeError("depthwise_conv1d_causal with reverse=True takes no left_pad")
        if self.carry_state != (len(inputs) == 4):
            raise ShapeError(f"depthwise_conv1d_causal with carry_state={self.carry_state} takes "
                             f"{'4' if self.carry_state else '2 or 3'} inputs, got {len(inputs)}")
        if len(inputs) >= 3:
            _want("depthwise_conv1d_causal", "left_pad", inputs[2],
                  (x.dims[0], Dim(self.kernel_size - 1), x.dims[2]))
        if self.carry_state:
            lengths = inputs[3]
            if lengths.dtype != DType.I32 or lengths.dims != (x.dims[0],):
                raise ShapeError(f"depthwise_conv1d_causal lengths must be i32 [{x.dims[0]}], got {lengths}")
        return x
