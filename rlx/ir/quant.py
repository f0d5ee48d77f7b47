"""GGUF block quantization formats as data, and their exact numpy dequantization.

A GGUF quantized tensor `[rows, cols]` is stored row-major: each row is
`cols / block_size` blocks of `block_bytes` bytes. `dequantize` turns raw
blocks back into float32 exactly as GGUF (ggml) defines each block — same
values, same float32 rounding order — so it is the meaning the
`dequant_matmul` / `dequantize` ops refer to (`rlx/reference.py`).

Block layouts (little-endian; `f16` is an IEEE half):

- q8_0 (32 values, 34 B): f16 d, int8 q[32]; value = q * d.
- q4_0 (32, 18 B): f16 d, 16 bytes of nibbles; byte j holds value j (low
  nibble) and value j+16 (high nibble); value = d * (q - 8).
- q4_1 (32, 20 B): f16 d, f16 m, 16 bytes of nibbles as q4_0; value = d * q + m.
- q5_0 (32, 22 B): f16 d, u32 qh (bit j = 5th bit of value j), nibbles as
  q4_0; value = d * (q - 16).
- q5_1 (32, 24 B): f16 d, f16 m, u32 qh, nibbles; value = d * q + m.
- q4_k (256, 144 B): f16 d, f16 dmin, 12 bytes of 6-bit scales/mins for 8
  sub-blocks of 32, 128 bytes of nibbles (each 32-byte group holds sub-block
  2i in its low nibbles and 2i+1 in its high ones);
  value = (d * sc) * q - dmin * m.
- q6_k (256, 210 B): ql[128] (low 4 bits), qh[64] (high 2 bits), int8
  scales[16] (one per 16 values), f16 d; value = (d * sc) * (q - 32).

>>> fmt = QUANT_FORMATS["q4_1"]
>>> fmt.block_size, fmt.block_bytes, row_bytes("q4_1", 64)
(32, 20, 40)
>>> import numpy as np
>>> w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
>>> raw = quantize(w, "q8_0")
>>> raw.shape, float(np.abs(dequantize(raw, "q8_0", 64) - w).max()) < 0.01
((1, 68), True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlx.errors import IRError

QK_K = 256


@dataclass(frozen=True)
class QuantFormat:
    """One GGUF block format: `block_size` values stored in `block_bytes` bytes."""

    name: str
    block_size: int
    block_bytes: int
    #: The block's fields, in order (documentation).
    doc: str = ""


QUANT_FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat("q8_0", 32, 34, "f16 d, i8 q[32]"),
    QuantFormat("q4_0", 32, 18, "f16 d, u8 nibbles[16]"),
    QuantFormat("q4_1", 32, 20, "f16 d, f16 m, u8 nibbles[16]"),
    QuantFormat("q5_0", 32, 22, "f16 d, u32 qh, u8 nibbles[16]"),
    QuantFormat("q5_1", 32, 24, "f16 d, f16 m, u32 qh, u8 nibbles[16]"),
    QuantFormat("q4_k", QK_K, 144, "f16 d, f16 dmin, u8 scales[12], u8 nibbles[128]"),
    QuantFormat("q6_k", QK_K, 210, "u8 ql[128], u8 qh[64], i8 scales[16], f16 d"),
)}


def quant_format(name: str) -> QuantFormat:
    """The format called `name` (case-insensitive: GGUF's `Q4_1` is `q4_1`); IRError if unknown."""
    key = name.lower() if isinstance(name, str) else name
    fmt = QUANT_FORMATS.get(key)  # type: ignore[arg-type]
    if fmt is None:
        raise IRError(f"unknown quantization format {name!r}; expected one of {sorted(QUANT_FORMATS)}")
    return fmt


def row_bytes(fmt: str | QuantFormat, cols: int) -> int:
    """Bytes of one row of `cols` values; `cols` must be a multiple of the block size.

    >>> row_bytes("q8_0", 576)
    612
    """
    f = fmt if isinstance(fmt, QuantFormat) else quant_format(fmt)
    if isinstance(cols, bool) or not isinstance(cols, int) or cols < 0 or cols % f.block_size:
        raise IRError(f"{f.name} rows hold whole blocks of {f.block_size} values; {cols!r} columns do not")
    return cols // f.block_size * f.block_bytes


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes `[..., 2]` as float32 `[...]` (exact: every f16 is an f32)."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """`[n, 16]` bytes → `[n, 32]` values: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """`[n, 4]` bytes of a little-endian u32 → `[n, 32]` bits (bit j is value j's 5th bit)."""
    bits = np.ascontiguousarray(qh).view("<u4")
    return ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    return b[:, 2:].view(np.int8).astype(np.float32) * d


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    return d * (_nibbles(b[:, 2:18]).astype(np.float32) - np.float32(8))


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
    return d * _nibbles(b[:, 4:20]).astype(np.float32) + m


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    q = _nibbles(b[:, 6:22]) | (_fifth_bits(b[:, 2:6]) << 4)
    return d * (q.astype(np.float32) - np.float32(16))


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
    q = _nibbles(b[:, 8:24]) | (_fifth_bits(b[:, 4:8]) << 4)
    return d * q.astype(np.float32) + m


def k4_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q4_k's 12 scale bytes `[n, 12]` → (scales, mins) `[n, 8]` of its 8 sub-blocks (6 bits each).

    Sub-blocks 0..3 take the low 6 bits of bytes j and j+4; sub-blocks 4..7 take
    a nibble of byte j+4 (low: scale, high: min) and the top 2 bits of bytes j-4 / j.
    """
    s = scales.astype(np.uint8)
    lo_sc, lo_m = s[:, 0:4] & 0x3F, s[:, 4:8] & 0x3F
    hi_sc = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    hi_m = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return np.concatenate([lo_sc, hi_sc], axis=1), np.concatenate([lo_m, hi_m], axis=1)


def _q4_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
    sc, mn = k4_scales(b[:, 4:16])
    ds = (d * sc.astype(np.float32))[:, :, None]  # [n, 8, 1]
    dm = (dmin * mn.astype(np.float32))[:, :, None]
    qs = b[:, 16:144].reshape(n, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return (ds * q - dm).reshape(n, QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])[:, None]
    # each 128-value half: 4 groups of 32 (low/high nibble of ql[0:32] / ql[32:64], 2 bits of qh each)
    lo = np.stack([ql[:, :, 0:32] & 0x0F, ql[:, :, 32:64] & 0x0F, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4], axis=2)
    hi = np.stack([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], axis=2)
    q = ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    return ((d * sc)[:, :, None] * q).reshape(n, QK_K)


_DEQUANT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1,
    "q4_k": _q4_k, "q6_k": _q6_k,
}


def dequantize(raw: np.ndarray, fmt: str | QuantFormat, cols: int) -> np.ndarray:
    """Raw GGUF blocks `uint8 [..., row_bytes(fmt, cols)]` → float32 `[..., cols]`, exactly as GGUF.

    >>> raw = np.zeros((2, 20), np.uint8); raw[:, 1] = 0x3C  # d = 1.0 (f16 0x3C00), m = 0
    >>> raw[:, 4] = 0x21  # value 0 = 1, value 16 = 2
    >>> dequantize(raw, "q4_1", 32)[0, [0, 1, 16]].tolist()
    [1.0, 0.0, 2.0]
    """
    f = fmt if isinstance(fmt, QuantFormat) else quant_format(fmt)
    arr = np.asarray(raw)
    if arr.dtype != np.uint8:
        raise IRError(f"{f.name} blocks must be uint8, got {arr.dtype}")
    width = row_bytes(f, cols)
    if arr.ndim < 1 or arr.shape[-1] != width:
        raise IRError(f"{f.name} rows of {cols} values take {width} bytes, got an array of shape {arr.shape}")
    lead = arr.shape[:-1]
    blocks = np.ascontiguousarray(arr).reshape(-1, f.block_bytes)
    out = _DEQUANT[f.name](blocks).astype(np.float32, copy=False)
    return out.reshape(*lead, cols)


def abs_terms(raw: np.ndarray, fmt: str | QuantFormat, cols: int) -> np.ndarray:
    """|d * q| + |m| for every value of the affine formats (q4_1, q5_1, q4_k), |value| otherwise.

    Kernels that sum x * q per block and add m * sum(x) apart round in proportion to these
    terms, not to |d * q + m| (which may cancel): error bounds of such products use them.

    >>> raw = np.zeros((1, 20), np.uint8); raw[0, 1] = 0x3C; raw[0, 3] = 0xBC  # d = 1, m = -1
    >>> float(dequantize(raw, "q4_1", 32)[0, 0]), float(abs_terms(raw, "q4_1", 32)[0, 0])
    (-1.0, 1.0)
    """
    f = fmt if isinstance(fmt, QuantFormat) else quant_format(fmt)
    if f.name not in ("q4_1", "q5_1", "q4_k"):
        return np.abs(dequantize(raw, f, cols))
    blocks = np.array(raw, dtype=np.uint8).reshape(-1, f.block_bytes)
    blocks[:, 1] &= 0x7F  # d >= 0 (the sign bit of the little-endian half)
    if f.name == "q4_k":
        blocks[:, 3] |= 0x80  # value = d*sc*q - dmin*m: dmin <= 0 makes both terms add
    else:
        blocks[:, 3] &= 0x7F  # m >= 0
    return dequantize(blocks.reshape(np.shape(raw)), f, cols)


#: Weight formats `dequant_matmul(act="q8" / "q16")` takes (integer block dot products with int8 / int16
#: activations).
Q8_ACT_FORMATS = ("q8_0", "q4_0", "q4_1")
#: Weight formats `dequant_matmul(act="q8")` takes: Q8_ACT_FORMATS and q4_k, whose 32-value sub-blocks are integer
#: blocks of scale d * sc and min -dmin * m (int8 activations only; CUDA runs it, the CPU's integer kernels take
#: Q8_ACT_FORMATS).
INT8_ACT_FORMATS = (*Q8_ACT_FORMATS, "q4_k")


def act_formats(act: str) -> tuple[str, ...]:
    """Weight formats `dequant_matmul(act=act)` takes ("f32": every format).

    >>> act_formats("q8")[-1], act_formats("q16")
    ('q4_k', ('q8_0', 'q4_0', 'q4_1'))
    """
    return tuple(QUANT_FORMATS) if act == "f32" else INT8_ACT_FORMATS if act == "q8" else Q8_ACT_FORMATS


#: Largest |q| of each integer activation mode of `dequant_matmul` (scale = max|x| / this).
ACT_LEVELS = {"q8": 127, "q16": 32767}


def quantize_act(x: np.ndarray, act: str = "q8") -> tuple[np.ndarray, np.ndarray]:
    """Activations `[..., K]` → (integers `[..., K]`, f32 scales `[..., K/32]`), per block of 32 values.

    d = max|x| / L (f32; L = 127 for "q8", 32767 for "q16"), q = rint(x * (1/d)) clipped to
    [-L, L] (round half to even; 0 where d = 0): the activation quantization of
    `dequant_matmul(act=...)`, the same in every kernel. int8 for "q8", int16 for "q16".

    >>> q, d = quantize_act(np.arange(32, dtype=np.float32))
    >>> int(q[-1]), bool(float(d[0]) == np.float32(31) / np.float32(127))
    (127, True)
    >>> int(quantize_act(np.arange(32, dtype=np.float32), "q16")[0][-1])
    32767
    """
    if act not in ACT_LEVELS:
        raise IRError(f"unknown integer activation mode {act!r}; expected one of {sorted(ACT_LEVELS)}")
    levels = np.float32(ACT_LEVELS[act])
    xf = np.asarray(x, dtype=np.float32)
    if xf.shape[-1] % 32:
        raise IRError(f"{act} activations need a last axis that is a multiple of 32, got {xf.shape}")
    xb = xf.reshape(*xf.shape[:-1], -1, 32)
    d = (np.abs(xb).max(axis=-1) / levels).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv[..., None]), -levels, levels).astype(np.int8 if act == "q8" else np.int16)
    return q.reshape(xf.shape), d


def quantize_act_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_act(x, "q8")`: int8 per block of 32, scale max|x|/127 (llama.cpp's activations)."""
    return quantize_act(x, "q8")


def weight_ints(raw: np.ndarray, fmt: str | QuantFormat, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A q8_0 / q4_0 / q4_1 / q4_k matrix as (integers `[N, nb, 32]`, d `[N, nb]`, m `[N, nb]`) per 32 values:
    value = d * q + m (q4_k: d = f32(d * sc) and m = -f32(dmin * min) of each sub-block, as it dequantizes)."""
    f = fmt if isinstance(fmt, QuantFormat) else quant_format(fmt)
    if f.name not in INT8_ACT_FORMATS:
        raise IRError(f"{f.name} has no integer form here; expected one of {INT8_ACT_FORMATS}")
    if f.name == "q4_k":
        b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, cols // QK_K, f.block_bytes)
        n, nbk = b.shape[:2]
        sc, mn = k4_scales(b[..., 4:16].reshape(-1, 12))
        d = (_f16(b[..., 0:2].reshape(-1, 2))[:, None] * sc.astype(np.float32)).astype(np.float32)
        m = -(_f16(b[..., 2:4].reshape(-1, 2))[:, None] * mn.astype(np.float32)).astype(np.float32)
        qs = b[..., 16:144].reshape(n, nbk, 4, 1, 32)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(n, nbk * 8, 32).astype(np.int32)
        return q, d.reshape(n, nbk * 8), m.reshape(n, nbk * 8)
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, cols // 32, f.block_bytes)
    d = np.ascontiguousarray(b[..., 0:2]).view("<f2")[..., 0].astype(np.float32)
    m = np.zeros_like(d)
    if f.name == "q8_0":
        q = b[..., 2:34].view(np.int8).astype(np.int32)
    elif f.name == "q4_0":
        q = np.concatenate([b[..., 2:18] & 0x0F, b[..., 2:18] >> 4], axis=-1).astype(np.int32) - 8
    else:
        m = np.ascontiguousarray(b[..., 2:4]).view("<f2")[..., 0].astype(np.float32)
        q = np.concatenate([b[..., 4:20] & 0x0F, b[..., 4:20] >> 4], axis=-1).astype(np.int32)
    return q, d, m


def q8_act_terms(x: np.ndarray, raw: np.ndarray, fmt: str | QuantFormat, cols: int,
                 act: str = "q8") -> tuple[np.ndarray, np.ndarray]:
    """The per-block terms of `x @ dequant(w).T` with x quantized by `quantize_act(x, act)`, float64 `[M, N, nb]`.

    Returns (integer-dot terms `dot(qw, qx) * (dw * dx)`, min terms `mw * (dx * sum(qx))`); their sum
    over blocks is the product (`dw * dx` and `dx * sum(qx)` are f32 products, as the kernels form them).
    """
    qx, dx = quantize_act(np.asarray(x, dtype=np.float32).reshape(-1, cols), act)
    qw, dw, mw = weight_ints(raw, fmt, cols)
    qx = qx.reshape(qx.shape[0], -1, 32).astype(np.int64)
    dots = np.einsum("mbi,nbi->mnb", qx, qw).astype(np.float64)  # exact: |dot| <= 32 * 128 * 32767
    scale = (dw[None, :, :] * dx[:, None, :]).astype(np.float32).astype(np.float64)
    sx = (dx * qx.sum(axis=-1).astype(np.float32)).astype(np.float32)
    mins = mw[None, :, :].astype(np.float64) * sx[:, None, :].astype(np.float64)
    return dots * scale, mins


def _gguf_type(f: QuantFormat):  # type: ignore[no-untyped-def]
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[f.name.upper()]


def quantize(values: np.ndarray, fmt: str | QuantFormat) -> np.ndarray:
    """float32 `[..., cols]` → raw blocks with the `gguf` package's quantizer (for tests and examples).

    Formats the `gguf` package cannot quantize (the k-quants) raise IRError; tests
    make random valid blocks for those instead (`random_blocks`).
    """
    f = fmt if isinstance(fmt, QuantFormat) else quant_format(fmt)
    from gguf import quants

    arr = np.ascontiguousarray(values, dtype=np.float32)
    if arr.ndim < 1 or arr.shape[-1] % f.block_size:
        raise IRError(f"{f.name} needs a last axis that is a multiple of {f.block_size}, got {arr.shape}")
    try:
        return np.ascontiguousarray(quants.quantize(arr, _gguf_type(f)), dtype=np.uint8)
    except (NotImplementedError, quants.QuantError) as exc:
        raise IRError(f"the gguf package cannot quantize {f.name}: {exc}") from exc


def random_blocks(rng: np.random.Generator, rows: int, cols: int, fmt: str | QuantFormat,
                  scale: float = 0.05) -> np.ndarray:
    """Random valid raw blocks `[rows, row_bytes]`: random quant bits, f16 scales near `scale`.

    Scales are finite halves with random sign (negative and subnormal ones included:
    every 8th block gets a subnormal d), so both the sign handling and subnormal
    widening are exercised. Values stay small enough that products do not overflow.
    """
    f = fmt if isinstance(fmt, QuantFormat) else quant_format(fmt)
    nb = rows * (cols // f.block_size)
    raw = rng.integers(0, 256, size=(nb, f.block_bytes), dtype=np.uint8)

    def halves(count: int) -> np.ndarray:
        h = (rng.standard_normal(count) * scale).astype(np.float16)
        sub = np.arange(count) % 8 == 3
        sign = np.where(rng.random(sub.sum()) < 0.5, -1.0, 1.0)
        h[sub] = (rng.integers(1, 1024, sub.sum()) * sign * 2.0 ** -24).astype(np.float16)
        return h.view(np.uint8).reshape(count, 2)

    def put(offset: int, count: int = 1) -> None:
        for i in range(count):
            raw[:, offset + 2 * i: offset + 2 * i + 2] = halves(nb)

    if f.name in ("q8_0", "q4_0", "q5_0"):
        put(0)
    elif f.name in ("q4_1", "q5_1", "q4_k"):
        put(0, 2)
    elif f.name == "q6_k":
        put(208)
    return raw.reshape(rows, row_bytes(f, cols))
