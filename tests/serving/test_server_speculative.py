"""`rlxc serve --speculative prompt_lookup`'s app live on 127.0.0.1, driven by the openai client: greedy completions
(streaming and not, alone and 8 at once, with logprobs) equal plain decoding token for token; /metrics reports the
drafter's acceptance and tokens per step; no KV page is used after each test."""

from __future__ import annotations

import re
import threading

import httpx
import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

from live import live_server  # noqa: E402

from rlx.serving.engine import Completion, Engine, SamplingParams  # noqa: E402
from rlx.serving.server import create_app  # noqa: E402

MODEL = "tiny-llama"
MAX_TOKENS = 32


def _prompts() -> list[list[int]]:
    """Token-id prompts: one repeated token the tiny model keeps repeating (proposals kept), and repeated random
    phrases it does not echo (proposals rejected)."""
    rng = np.random.default_rng(11)
    return [[89] * (5 + i) if i % 2 == 0 else rng.integers(0, 256, 5).tolist() * 3 for i in range(8)]


@pytest.fixture(scope="module")
def plain(paged_runner) -> list[Completion]:
    """Plain decoding's completions, with each token's logprob."""
    engine = Engine(paged_runner)  # run before the server's engine starts: they share the runner's pages
    return [engine.generate(p, SamplingParams(max_tokens=MAX_TOKENS, logprobs=True)) for p in _prompts()]


@pytest.fixture(scope="module")
def server(paged_runner, plain):
    engine = Engine(paged_runner, speculative="prompt_lookup", prefix_cache_bytes=1 << 20).start()
    with live_server(create_app(engine, MODEL)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=60)


def _metric(url: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", httpx.get(url + "/metrics").text, re.M).group(1))


@pytest.fixture(autouse=True)
def no_pages_left(server, paged_runner):
    yield
    assert _metric(server, "rlx_running_sequences") == 0 and _metric(server, "rlx_kv_used_pages") == 0
    assert _metric(server, "rlx_kv_free_pages") + _metric(server, "rlx_kv_cached_pages") == paged_runner.kv_pages


def test_greedy_completions_equal_plain_decoding(client, server, plain) -> None:
    for prompt, want in zip(_prompts()[:4], plain):
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert done.choices[0].text == want.text and done.usage.completion_tokens == len(want.token_ids)
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True)
        assert "".join(c.choices[0].text for c in stream) == want.text
        # with logprobs (from each verify row's logits): token by token
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=0)
        got = done.choices[0].logprobs.token_logprobs
        assert done.choices[0].text == want.text and len(got) == len(want.token_ids)
        np.testing.assert_allclose(got, [e.logprob for e in want.events[:len(got)]], rtol=0, atol=1e-5)
    assert _metric(server, "rlx_speculative_accepted_tokens_total") > MAX_TOKENS
    assert _metric(server, "rlx_speculative_draft_tokens_total") > _metric(server,
                                                                           "rlx_speculative_accepted_tokens_total")
    assert 0 < _metric(server, "rlx_speculative_acceptance_rate") < 1
    steps = _metric(server, "rlx_speculative_tokens_per_step_count")
    tokens = _metric(server, "rlx_speculative_tokens_per_step_sum")
    assert steps > 0 and tokens / steps > 1.2  # several tokens a step on average
    assert tokens < _metric(server, "rlx_generated_tokens_total")  # the first tokens came from prefill


def test_concurrent_greedy_streams_equal_plain_decoding(client, plain) -> None:
    prompts = _prompts()
    together: list[str | None] = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        barrier.wait()
        stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True)
        together[i] = "".join(c.choices[0].text for c in stream)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == [want.text for want in plain]


def test_sampled_requests_run_and_repeat_with_their_seed(client) -> None:
    kw = dict(model=MODEL, prompt=_prompts()[0], max_tokens=16, temperature=0.8, top_p=0.9, seed=5)
    first = client.completions.create(**kw)
    assert first.usage.completion_tokens >= 1
    assert client.completions.create(**kw).choices[0].text == first.choices[0].text
