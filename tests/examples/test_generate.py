"""rlxc generate: bad sampling options are usage errors before any model loads, a missing GPU is said
plainly, the timing line says why generation stopped (the context limit included) and, speculating, how
many draft tokens were proposed and accepted."""

from __future__ import annotations

import re

import pytest

from rlx.cli import main as rlxc
from rlx.examples import generate
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs

CONFIG = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                       head_dim=8, ffn_size=48, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=8, context_length=64, tie_embeddings=True, bos_id=1, eos_id=-1)


class WordTokenizer:
    """Enough of a tokenizer for the example: a token per word (ids 3..63), text "<id>" per token."""

    stop_ids = ()

    def encode(self, text: str) -> list[int]:
        return [3 + sum(map(ord, word)) % 61 for word in text.split()]

    def incremental_decoder(self) -> object:
        class Decoder:
            def push(self, token: int) -> str:
                return f"<{token}>"

            def flush(self) -> str:
                return ""

        return Decoder()


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kw: object) -> CausalLM:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(CausalLM, "from_gguf", refuse)


@pytest.mark.parametrize(("argv", "message"), [
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--top-p", "2"], r"--top-p must be in \(0, 1\], got 2.0"),
    (["--top-p", "0"], r"--top-p must be in \(0, 1\], got 0.0"),
    (["--top-k", "0"], "--top-k must be >= 1, got 0"),
    (["-n", "-1"], "-n must be >= 0, got -1"),
    (["--max-context", "0"], "--max-context must be >= 1, got 0"),
])
def test_bad_sampling_options_are_usage_errors_before_loading(no_model_load: None, capsys: pytest.CaptureFixture,
                                                              argv: list[str], message: str) -> None:
    assert rlxc(["generate", *argv, "Once upon a time"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rlxc generate")
    assert re.search(message, err), err


def test_cuda_without_a_gpu_says_so_without_suggesting_target(no_model_load: None, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    import rlx.toolchain.cuda

    monkeypatch.setattr(rlx.toolchain.cuda, "visible_gpu_arch", lambda: None)
    assert generate.main(["--device", "cuda", "hello"]) == 1
    err = capsys.readouterr().err
    assert "none is visible here" in err and "leave out --device" in err and "--target" not in err


@pytest.mark.parametrize(("argv", "why"), [
    (["-n", "40", "--max-context", "8"], "stopped at the context limit (8 tokens, prompt included; raise "
                                         "--max-context)"),
    (["-n", "3"], "stopped at -n 3"),
])
def test_the_timing_line_says_why_generation_stopped(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                                     argv: list[str], why: str) -> None:
    def tiny(path: object, **kw: object) -> CausalLM:
        return CausalLM(CONFIG, random_tensors(random_specs(CONFIG), seed=1), WordTokenizer(), device="reference",
                        max_context=kw["max_context"])

    monkeypatch.setattr(CausalLM, "from_gguf", tiny)
    assert generate.main([*argv, "--model", "unused.gguf", "once upon a time"]) == 0
    out, err = capsys.readouterr()
    new = out.count("<")
    assert new == (8 - 4 + 1 if "--max-context" in argv else 3)  # a 4-token prompt; the cache holds 8
    assert f"{new} new tokens" in err and why in err


def test_speculative_generation_reports_draft_tokens_proposed_and_accepted(monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """--speculative prompt_lookup on an echoing prompt: the timing line's counts are the model's totals
    (`CausalLM.speculation_stats`), which add up each generation's `timings`."""
    models: list[CausalLM] = []

    def tiny(path: object, **kw: object) -> CausalLM:
        models.append(CausalLM(CONFIG, random_tensors(random_specs(CONFIG), seed=1), WordTokenizer(),
                               device="reference", max_context=kw["max_context"]))
        return models[-1]

    monkeypatch.setattr(CausalLM, "from_gguf", tiny)
    prompt = "a b c d e a b c d e a b c"
    assert generate.main(["--model", "unused.gguf", "-n", "12", "--speculative", "prompt_lookup", prompt]) == 0
    err = capsys.readouterr().err
    stats = models[0].speculation_stats
    assert stats["draft_tokens"] > 0 and stats["produced_tokens"] == 12
    m = re.search(r"(\d+) of (\d+) draft tokens accepted \((\d+)%\), (\d+) verify steps", err)
    assert m is not None, err
    assert [int(g) for g in m.groups()] == [stats["accepted_tokens"], stats["draft_tokens"],
                                            round(100 * stats["acceptance_rate"]), stats["speculative_steps"]]
    stream = models[0].stream(WordTokenizer().encode(prompt), 12, speculative="prompt_lookup")
    assert len(list(stream)) == 12
    again = stream.timings
    after = models[0].speculation_stats
    for key in ("speculative_steps", "draft_tokens", "accepted_tokens"):
        assert after[key] == stats[key] + again[key]
