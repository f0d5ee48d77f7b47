"""`rlxc serve`'s app over the paged KV cache (as `rlxc serve` runs by default), live on 127.0.0.1 through the
openai client: completions streaming and not, concurrent greedy streams equal to each alone, a repeated prompt
sharing its pages, and /metrics' KV pages: none used after each test, every page free or cached."""

from __future__ import annotations

import re
import threading

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

from live import live_server  # noqa: E402

from rlx.serving.engine import Engine  # noqa: E402
from rlx.serving.server import create_app  # noqa: E402

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(paged_runner):
    engine = Engine(paged_runner, max_waiting=64, prefix_cache_bytes=1 << 20).start()
    with live_server(create_app(engine, MODEL)) as url:
        yield url, engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=60)


def _metric(url: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", httpx.get(url + "/metrics").text, re.M).group(1))


@pytest.fixture(autouse=True)
def no_pages_left(server, paged_runner):
    yield
    url = server[0]
    assert _metric(url, "rlx_running_sequences") == 0 and _metric(url, "rlx_kv_used_pages") == 0
    assert _metric(url, "rlx_kv_free_pages") + _metric(url, "rlx_kv_cached_pages") == paged_runner.kv_pages


def test_completion_streaming_and_not(client) -> None:
    done = client.completions.create(model=MODEL, prompt="hello there", max_tokens=12, temperature=0)
    assert done.usage.completion_tokens == 12 and done.choices[0].finish_reason == "length"
    streamed = client.completions.create(model=MODEL, prompt="hello there", max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text


def test_concurrent_streams_equal_each_alone(client) -> None:
    prompts = [f"request {i}: " + "xyz"[i % 3] * (i + 1) for i in range(8)]
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0).choices[0].text
             for p in prompts]
    together: list[str | None] = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        barrier.wait()
        stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=16, temperature=0, stream=True)
        together[i] = "".join(c.choices[0].text for c in stream)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == alone


def test_a_repeated_prompt_shares_its_pages(client, server, paged_runner) -> None:
    prompt = "You are a terse assistant. Answer in one word: a"
    n = len(paged_runner.tokenizer.encode(prompt))
    assert n > 32
    before = _metric(server[0], "rlx_prefix_cache_hit_tokens_total")
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert _metric(server[0], "rlx_kv_cached_pages") >= (n - 1) // 16
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert first.choices[0].text == second.choices[0].text
    assert _metric(server[0], "rlx_prefix_cache_hit_tokens_total") - before == (n - 1) // 16 * 16
