"""Error bounds of `dequant_matmul(act="q8")` products against rlx.reference, shared by the CUDA tests of int8
activations (tests/codegen/test_cuda_q8_emulated.py on the CPU shim, tests/gpu/test_cuda_q8_act.py on a GPU).

- `q8_bound`, the integer-dot paths: the block dots are exact, so only the f32 scale products and the f32 sum over
  the K/32 blocks (plus the min terms) round: (K/32 + 4) u sum|terms|, + u|y| for the reference's own rounding
  (as tests/codegen/test_cpu_quant.py's).
- `prefill_bound`, steps past the GEMV rows: x' = q * d (X quantized, widened again) times the dequantized
  weight in an f32 GEMM: (K + 5) u sum|x' w| (the +1: rounding q * d), + u|y|.
- `flip_allowance`: a kernel that normalizes x itself (the fused decode GEMV's RMSNorm) rounds h apart from the
  reference, so a value of h next to a rounding boundary of h / d may quantize one step apart.
"""

from __future__ import annotations

import numpy as np

from rlx.ir import quant as Q

U32 = 2.0 ** -24


def q8_terms(x: np.ndarray, raw: np.ndarray, fmt: str, k: int) -> np.ndarray:
    """sum over blocks of |dw dx| dot(|qx|, |qw|) + |cw| |dx sum(qx)| per output (|q| terms cover either split of
    q4_0's offset, q - 8)."""
    qx, dx = Q.quantize_act(x, "q8")
    qw, dw, mw = Q.weight_ints(raw, fmt, k)
    cw = 8 * np.abs(dw) if fmt == "q4_0" else np.abs(mw)
    qw = qw + 8 if fmt == "q4_0" else qw
    ax = np.abs(qx.reshape(x.shape[0], -1, 32).astype(np.float64))
    dots = np.einsum("mbi,nbi->mnb", ax, np.abs(qw).astype(np.float64))
    sx = np.abs(dx * ax.sum(-1))
    return (dots * np.abs(dw[None] * dx[:, None]) + cw[None] * sx[:, None]).sum(-1)


def q8_bound(x: np.ndarray, raw: np.ndarray, fmt: str, k: int, want: np.ndarray) -> np.ndarray:
    """The integer-dot bound."""
    return (k // 32 + 4) * U32 * q8_terms(x, raw, fmt, k) + U32 * np.abs(want)


def prefill_scale(x: np.ndarray, raw: np.ndarray, fmt: str, k: int) -> np.ndarray:
    """sum |x' w| per output: x' = q * d, w's terms (`abs_terms`)."""
    qx, dx = Q.quantize_act(x, "q8")
    xr = np.abs(qx.reshape(x.shape[0], -1, 32).astype(np.float64) * dx[..., None].astype(np.float64))
    return xr.reshape(x.shape) @ Q.abs_terms(raw, fmt, k).astype(np.float64).T


def prefill_bound(x: np.ndarray, raw: np.ndarray, fmt: str, k: int, want: np.ndarray) -> np.ndarray:
    return (k + 5) * U32 * prefill_scale(x, raw, fmt, k) + U32 * np.abs(want)


def flip_allowance(h: np.ndarray, raw: np.ndarray, fmt: str, k: int) -> np.ndarray:
    """Per output: each value of h within 1e-3 of a rounding boundary of h / d may move the product by
    |dx| (|dw qw| + |mw|) (|qw| + 8 for q4_0's offset); a block maximum a few ulps apart moves d, and every term of the
    block, by as many u (4 u sum|terms|)."""
    _, dx = Q.quantize_act(h, "q8")
    scaled = h.reshape(h.shape[0], -1, 32) / np.where(dx == 0, 1, dx)[..., None].astype(np.float64)
    near = (np.abs(np.abs(scaled - np.floor(scaled)) - 0.5) < 1e-3).astype(np.float64)  # [M, nb, 32]
    qw, dw, mw = Q.weight_ints(raw, fmt, k)
    # a step of q_i moves the dot by qw_i and the sum of q (the min term) by 1: |dw| |qw_i| + |mw| in units of dx
    step = (np.abs(qw).astype(np.float64) + (8 if fmt == "q4_0" else 0)) * np.abs(dw)[..., None] \
        + np.abs(mw)[..., None]  # [N, nb, 32]
    flips = np.einsum("mbi,nbi,mb->mn", near, step, dx.astype(np.float64))
    return flips + 4 * U32 * q8_terms(h, raw, fmt, k)


def rms(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm in f64, rounded to f32 (what the reference's f32 graph holds)."""
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + eps) * gamma).astype(np.float32)


def fused_checks(kind: str, a: np.ndarray, b: np.ndarray, ba: np.ndarray, bb: np.ndarray, y0: np.ndarray,
                 y1: np.ndarray, res: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(got, want, bound) of a fused decode GEMV group's outputs, from its two products a, b (reference, f64) and their
    bounds ba, bb: `plain` the two products, `norm_swiglu` silu(a) * b (|d silu| <= 1.1, plus the f32 rounding of
    the epilogue), `residual` a + res."""
    if kind == "norm_swiglu":
        with np.errstate(over="ignore"):  # exp(-a) of a large negative a: silu(a) = -0
            want = a / (1 + np.exp(-a)) * b
        return [(y0, want, 1.1 * ba * np.abs(b) + np.abs(a) * bb + 1.1 * ba * bb + 4 * U32 * np.abs(want))]
    if kind == "residual":
        want = a + res
        return [(y0, want, ba + U32 * np.abs(want))]
    return [(y0, a, ba), (y1, b, bb)]
