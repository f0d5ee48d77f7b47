"""`rlx.models.transpose.converted_transpose`: blocks of rows converted and transposed on threads give the bits of
numpy's whole-matrix `ascontiguousarray(convert(data).T)`, for the conversions a decoder's float weights take
(bf16 bits widened to f32 or kept, f16 widened or kept, f32), shapes off the block size, a memory-mapped source,
and small matrices done in one piece; a conversion's error reaches the caller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlx.ir.dtype import bits_to_bfloat16
from rlx.models import transpose as T
from rlx.models.llama import _as_f32, _as_stored

CONVERSIONS = {
    "bf16->f32": (np.uint16, lambda b: _as_f32(b, "bf16")),
    "bf16": (np.uint16, lambda b: _as_stored(b, "bf16")),
    "f16->f32": (np.float16, lambda b: _as_f32(b, "f16")),
    "f16": (np.float16, lambda b: _as_stored(b, "f16")),
    "f32": (np.float32, lambda b: _as_f32(b, "f32")),
}


def _matrix(dtype: type, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype is np.uint16:  # every bf16 bit pattern, NaNs and infinities included
        return rng.integers(0, 1 << 16, shape, dtype=np.uint16)
    return (rng.standard_normal(shape) * 3).astype(dtype)


@pytest.mark.parametrize("kind", sorted(CONVERSIONS))
@pytest.mark.parametrize("shape", [(1000, 4200), (129, 33000), (7, 5)])
def test_blocks_give_numpy_s_bits(kind: str, shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    dtype, convert = CONVERSIONS[kind]
    data = _matrix(dtype, shape)
    want = np.ascontiguousarray(convert(data).T)
    monkeypatch.setattr(T, "PARALLEL_MIN", 1 << 12)  # blocks on threads even for these small test matrices
    got = T.converted_transpose(data, convert)
    assert got.flags.c_contiguous and got.dtype == want.dtype and got.shape == (shape[1], shape[0])
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_a_memory_mapped_source(tmp_path: Path) -> None:
    data = _matrix(np.uint16, (700, 6000), seed=1)
    path = tmp_path / "w.bin"
    data.tofile(path)
    mapped = np.memmap(path, np.uint16, "r", shape=data.shape)
    got = T.converted_transpose(mapped, lambda b: _as_stored(b, "bf16"))
    want = bits_to_bfloat16(np.ascontiguousarray(data.T))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))  # (bits: NaNs among them)


def test_one_thread_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _matrix(np.float16, (600, 9000), seed=2)
    monkeypatch.setattr(T.os, "cpu_count", lambda: 1)
    np.testing.assert_array_equal(T.converted_transpose(data, lambda b: b.astype(np.float32)),
                                  data.T.astype(np.float32))
    monkeypatch.setattr(T.os, "cpu_count", lambda: 4)

    def failing(b: np.ndarray) -> np.ndarray:
        if b.shape[0] < T.BLOCK_ROWS:  # the last, short block
            raise RuntimeError("bad block")
        return b

    with pytest.raises(RuntimeError, match="bad block"):
        T.converted_transpose(data, failing)
    with pytest.raises(ValueError, match="2-D"):
        T.converted_transpose(np.zeros(3), lambda b: b)
