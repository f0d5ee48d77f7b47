"""Fixtures of the serving tests: the tiny GGUF model and its runner, compiled once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_gguf import write_tiny_gguf

from rlx.serving.runner import CausalLMRunner

#: slots of the shared runner (16 concurrent requests, as the batch-invariance tests need)
SLOTS = 16
MAX_CONTEXT = 128
CHUNK = 16


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_runner(tiny_gguf: Path) -> CausalLMRunner:
    # f32 activations: the decode kernels whose sums do not depend on the row count (see test_engine)
    return CausalLMRunner.from_gguf(tiny_gguf, slots=SLOTS, max_context=MAX_CONTEXT, chunk=CHUNK, quant_act="f32")


@pytest.fixture(scope="session")
def paged_runner(tiny_gguf: Path):
    from rlx.serving.runner import PagedRunner

    # pages of 16 tokens, every slot full (128 pages); steps of up to 16 one-token rows
    return PagedRunner.from_gguf(tiny_gguf, slots=SLOTS, max_context=MAX_CONTEXT, page_size=16, quant_act="f32")
