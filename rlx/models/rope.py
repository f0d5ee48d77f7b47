"""Rotary position tables: the inverse frequencies of each RoPE scaling scheme Hugging Face configs name.

A `RopeSpec` is one frozen record of a config's `rope_parameters` (or its older `rope_theta` /
`rope_scaling` keys); `inv_freq(spec, n_rot)` gives the `n_rot / 2` frequencies and the factor
the cos/sin tables are multiplied by (YaRN's attention factor, 1 elsewhere). The schemes follow
the published formulas (the YaRN paper; Meta's Llama 3.1 frequency smoothing); the host computes
the tables, the graph only reads them (`rope` takes cos/sin as inputs).

>>> f, scale = inv_freq(RopeSpec(base=10000.0), 8)
>>> [round(float(v), 4) for v in f], scale
([1.0, 0.1, 0.01, 0.001], 1.0)
>>> f2, _ = inv_freq(RopeSpec(base=10000.0, kind="linear", factor=2.0), 8)
>>> float(f2[0])
0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlx.errors import ArtifactError

#: RoPE schemes `inv_freq` computes ("default" is plain RoPE).
ROPE_KINDS = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    """One RoPE scheme: `base` (theta), `kind` and its parameters (unused ones keep their defaults)."""

    base: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise ArtifactError(f"RoPE scaling {self.kind!r} is not supported; supported: {', '.join(ROPE_KINDS)}")
        if not self.base > 0 or not self.factor > 0:
            raise ArtifactError(f"RoPE base and factor must be positive, got {self.base!r} and {self.factor!r}")
        if self.kind in ("llama3", "yarn") and self.original_max_positions < 1:
            raise ArtifactError(f"RoPE scaling {self.kind!r} needs original_max_position_embeddings")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inv_freq(spec: RopeSpec, n_rot: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies f64 `[n_rot/2]`, cos/sin multiplier) of `spec` for `n_rot` rotated dims."""
    base = spec.base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    freq = 1.0 / base
    if spec.kind == "default":
        return freq, 1.0
    if spec.kind == "linear":
        return freq / spec.factor, 1.0
    if spec.kind == "llama3":
        old = spec.original_max_positions
        low_wavelen, high_wavelen = old / spec.low_freq_factor, old / spec.high_freq_factor
        wavelen = 2 * math.pi / freq
        scaled = np.where(wavelen > low_wavelen, freq / spec.factor, freq)
        smooth = (old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)
        smoothed = (1 - smooth) * scaled / spec.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled), 1.0
    # yarn: frequencies below the correction range interpolated, above it kept, a linear ramp between
    factor = spec.factor
    attention = spec.attention_factor
    if attention is None:
        if spec.mscale and spec.mscale_all_dim:
            attention = _yarn_mscale(factor, spec.mscale) / _yarn_mscale(factor, spec.mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return n_rot * math.log(spec.original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(spec.base))

    low, high = correction_dim(spec.beta_fast), correction_dim(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, n_rot - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(n_rot // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1 where the frequency is extrapolated (kept), 0 where interpolated
    return freq / factor * (1 - keep) + freq * keep, float(attention)


def tables(spec: RopeSpec, n_rot: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin f32 `[*positions.shape, n_rot/2]` of `spec` at `positions`."""
    freq, scale = inv_freq(spec, n_rot)
    angles = np.asarray(positions, dtype=np.float64)[..., None] * freq
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)
