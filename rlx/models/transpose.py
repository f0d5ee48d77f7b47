"""A weight matrix converted and transposed to the `[in, out]` layout a decoder graph's matmuls take.

numpy's transposing copy of a whole matrix walks one of the two arrays against its cache lines: a 14336 x 4096 bf16
matrix widened to f32 and transposed took 1.6-1.8 s on a 2-core host, so an 8B checkpoint's ~7.5 G float weight
values took about two minutes of a CUDA build. Blocks of `BLOCK_ROWS` source rows keep both sides in cache (0.30 s
on one thread for that matrix), and numpy's copies release the GIL, so the blocks run on a few threads (0.10 s on
two). The values are the same bits as `np.ascontiguousarray(convert(data).T)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: Source rows a block converts and transposes at once (its bytes stay in a core's cache).
BLOCK_ROWS = 128
#: Matrices of fewer values are done in one piece on the calling thread.
PARALLEL_MIN = 1 << 22
#: The most threads a matrix is shared among.
MAX_THREADS = 8


def converted_transpose(data: np.ndarray, convert: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """`np.ascontiguousarray(convert(data).T)` for a 2-D `data`, bit for bit, converting and transposing blocks of
    rows (on several threads for a large matrix). `convert` maps rows to rows (an element-wise dtype change).

    >>> import numpy as np
    >>> x = np.arange(6, dtype=np.float16).reshape(2, 3)
    >>> converted_transpose(x, lambda b: b.astype(np.float32))
    array([[0., 3.],
           [1., 4.],
           [2., 5.]], dtype=float32)
    """
    data = np.asarray(data)
    if data.ndim != 2:
        raise ValueError(f"converted_transpose takes a 2-D matrix, got shape {data.shape}")
    rows, cols = data.shape
    if data.size < PARALLEL_MIN or rows <= BLOCK_ROWS:
        return np.ascontiguousarray(convert(data).T)
    first = convert(data[:BLOCK_ROWS])
    out = np.empty((cols, rows), first.dtype)

    def block(lo: int) -> None:
        part = first if lo == 0 else convert(data[lo:lo + BLOCK_ROWS])
        out[:, lo:lo + part.shape[0]] = part.T

    starts = range(0, rows, BLOCK_ROWS)
    threads = min(MAX_THREADS, os.cpu_count() or 1, len(starts))
    if threads <= 1:
        for lo in starts:
            block(lo)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="rlx-transpose") as pool:
            list(pool.map(block, starts))  # (list: a block's exception is raised here)
    return out
