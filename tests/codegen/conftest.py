"""Makes the CPU backend test helpers in tests/codegen/cpu_helpers.py importable as `cpu_helpers`; the nvcc
toolchain (sm_90, cuBLASLt where found) the CUDA compile tests share as the `toolchain` fixture."""

import sys
from pathlib import Path

import pytest

from rlx.errors import BuildError
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def toolchain() -> NvccToolchain:
    """nvcc for sm_90 (compile-only tests: no GPU needed); skips where nvcc is not installed."""
    try:
        path, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    return NvccToolchain(path, text, "sm_90", find_cublas(path))
