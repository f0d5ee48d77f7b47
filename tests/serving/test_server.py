"""`rlxc serve`'s app on the tiny model, live on 127.0.0.1, driven by the official openai client: completions
and chat (streaming and not), logprobs, n, stop, 16 concurrent streams equal to each alone, embeddings,
models/health/metrics, auth, and the fault list (bad bodies, unknown model, context, disconnect, 429,
a failing step)."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

from live import live_server  # noqa: E402

from rlx.serving.engine import Engine  # noqa: E402
from rlx.serving.server import create_app  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
KEY = "test-key"
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    from tiny_bert import write_model_dir

    from rlx.models.embedder import SentenceEmbedder

    return SentenceEmbedder.from_pretrained(write_model_dir(tmp_path_factory.mktemp("bert")), max_seq=16,
                                            max_batch=4)


@pytest.fixture(scope="module")
def server(tiny_runner, embedder):
    engine = Engine(tiny_runner, max_waiting=64, prefix_cache_bytes=1 << 20).start()
    app = create_app(engine, MODEL, embedder=embedder, embedding_model="tiny-bert", api_key=KEY)
    with live_server(app) as url:
        yield url, engine
    assert not engine._thread  # the app's shutdown drained and stopped the engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def _idle(url: str) -> None:
    deadline = time.monotonic() + 10
    while _metric(url, "rlx_running_sequences") or _metric(url, "rlx_kv_used_tokens"):
        assert time.monotonic() < deadline, "sequences left running"
        time.sleep(0.05)


def test_completion_streaming_and_not(client, server, tiny_runner) -> None:
    prompt = "hello there"
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    choice = done.choices[0]
    assert done.usage.prompt_tokens == len(tiny_runner.tokenizer.encode(prompt))
    assert 1 <= done.usage.completion_tokens <= 20 and choice.finish_reason in ("stop", "length")
    want = Engine(tiny_runner).generate(tiny_runner.tokenizer.encode(prompt), _greedy(20))
    assert done.usage.completion_tokens == len(want.token_ids) and choice.text == want.text
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    _idle(server[0])


def _greedy(n: int):
    from rlx.serving.engine import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0)


def test_chat_through_the_template_streaming_and_not(client, tiny_runner) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=16, temperature=0)
    tok = tiny_runner.tokenizer
    assert done.usage.prompt_tokens == len(tok.encode(tok.apply_chat_template(messages)))
    assert done.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == done.choices[0].message.content


def test_logprobs_n_seed_and_stop(client) -> None:
    done = client.completions.create(model=MODEL, prompt="abc", max_tokens=6, temperature=0, logprobs=3)
    lp = done.choices[0].logprobs
    assert len(lp.token_logprobs) == done.usage.completion_tokens and all(len(t) == 3 for t in lp.top_logprobs)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen == pytest.approx(max(top.values())) and chosen <= 0  # greedy picks the most likely
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=2)
    assert all(len(c.top_logprobs) == 2 for c in chat.choices[0].logprobs.content)
    a = client.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=1.0, n=2, seed=5,
                                  extra_body={"top_k": 50})
    b = client.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=1.0, n=2, seed=5,
                                  extra_body={"top_k": 50})
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # same seed, same choices
    assert a.choices[0].text != a.choices[1].text  # the choices are distinct draws
    full = client.completions.create(model=MODEL, prompt="hello", max_tokens=30, temperature=0).choices[0].text
    stop = full[3:5]
    cut = client.completions.create(model=MODEL, prompt="hello", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_sixteen_concurrent_streams_equal_each_alone(client, server) -> None:
    prompts = [f"request {i}: " + "xyz"[i % 3] * (i + 1) for i in range(16)]
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0).choices[0].text
             for p in prompts]
    together: list[str | None] = [None] * 16
    barrier = threading.Barrier(16)

    def run(i: int) -> None:
        barrier.wait()
        stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=24, temperature=0, stream=True)
        together[i] = "".join(c.choices[0].text for c in stream)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == alone
    _idle(server[0])


def test_embeddings_models_health_metrics(client, server, embedder) -> None:
    out = client.embeddings.create(model="tiny-bert", input=["a man eats food", "the horse"])
    got = np.array([d.embedding for d in out.data], dtype=np.float32)
    np.testing.assert_allclose(got, embedder.embed(["a man eats food", "the horse"]), rtol=1e-6, atol=1e-6)
    assert out.usage.prompt_tokens > 0
    assert sorted(m.id for m in client.models.list()) == ["tiny-bert", MODEL]
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok"
    text = httpx.get(server[0] + "/metrics").text
    for name in ("rlx_waiting_sequences", "rlx_kv_free_tokens", "rlx_tokens_per_second",
                 "rlx_time_to_first_token_seconds_count", "rlx_inter_token_latency_seconds_count"):
        assert re.search(rf"^{name} ", text, re.M), name
    assert _metric(server[0], "rlx_time_to_first_token_seconds_count") > 0


def test_a_repeated_prompt_reuses_its_prefix(client, server, tiny_runner) -> None:
    prompt = "You are a terse assistant. Answer in one word: "
    n = len(tiny_runner.tokenizer.encode(prompt + "a"))
    assert n > 32  # full blocks of 16 tokens to reuse (the last token is always prefilled, for its logits)
    before = _metric(server[0], "rlx_prefix_cache_hit_tokens_total")
    first = client.completions.create(model=MODEL, prompt=prompt + "a", max_tokens=8, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prompt + "a", max_tokens=8, temperature=0)
    assert first.choices[0].text == second.choices[0].text
    assert _metric(server[0], "rlx_prefix_cache_hit_tokens_total") - before == (n - 1) // 16 * 16


def test_auth(server) -> None:
    bad = openai.OpenAI(base_url=server[0] + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = httpx.get(server[0] + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"model": "tiny-llama", "prompt": "x", "max_tokens": "ten"}', 400, "max_tokens must be an integer"),
    (b'{"model": "tiny-llama", "prompt": "x", "max_tokens": -3}', 400, "max_tokens must be an integer"),
    (b'{"model": "tiny-llama", "prompt": "x", "max_tokens": 10000000}', 400, "below the context"),
    (b'{"model": "tiny-llama", "prompt": "' + b"x" * 100 + b'", "max_tokens": 100}', 400, "over the context"),
    (b'{"model": "tiny-llama", "prompt": "x", "temperature": "hot"}', 400, "temperature must be a number"),
    (b'{"model": "tiny-llama", "prompt": "x", "stream": "yes"}', 400, "stream must be a boolean"),
    (b'{"model": "tiny-llama", "prompt": ""}', 400, "prompt must be"),
    (b'{"model": "gpt-9", "prompt": "x"}', 404, "does not exist"),
])
def test_bad_requests_get_openai_error_bodies(server, body: bytes, status: int, says: str) -> None:
    r = httpx.post(server[0] + "/v1/completions", content=body,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert says in error["message"] and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}


def test_bad_chat_messages(client) -> None:
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": 5}])


def test_a_client_leaving_mid_stream_cancels_its_sequence(server) -> None:
    url = server[0]
    body = {"model": MODEL, "prompt": "keep going", "max_tokens": 100, "temperature": 0, "stream": True,
            "stop": ["never appears \u2603"]}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    _idle(url)  # the engine dropped it: no slot, no KV held


def test_a_failing_step_fails_only_its_request(client, server, tiny_runner, monkeypatch) -> None:
    real, calls = tiny_runner.decode, []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected fault")
        return real(*args, **kw)

    monkeypatch.setattr(tiny_runner, "decode", failing)
    with pytest.raises(openai.InternalServerError, match="injected fault"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=10, temperature=0,
                                  stop=["never appears \u2603"])
    later = client.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0)
    assert later.usage.completion_tokens >= 1
    _idle(server[0])


def test_an_unexpected_exception_is_a_500_with_an_openai_body(client, server, monkeypatch) -> None:
    url, engine = server

    def broken(*args, **kw):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(engine, "submit", broken)
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error" and "RuntimeError: injected bug" in r.json()["error"]["message"]
    monkeypatch.undo()
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=0).usage.completion_tokens


def test_the_handoff_wakes_the_loop_once_a_batch_and_keeps_the_order() -> None:
    """Events from the engine's thread reach the loop's queues in order, a batch per wake-up of the loop."""
    import queue

    from rlx.serving.server import _Handoff

    class Loop:
        def __init__(self) -> None:
            self.scheduled: list = []

        def call_soon_threadsafe(self, fn):
            self.scheduled.append(fn)

    loop = Loop()
    handoff = _Handoff(loop)  # type: ignore[arg-type]
    a, b = queue.SimpleQueue(), queue.SimpleQueue()
    for i in range(5):  # one step's events for two streams
        handoff.put(a if i % 2 else b, i)
    assert len(loop.scheduled) == 1
    loop.scheduled.pop()()
    assert [b.get_nowait() for _ in range(3)] == [0, 2, 4] and [a.get_nowait() for _ in range(2)] == [1, 3]
    handoff.put(a, 5)  # the next step's: a wake-up of its own
    assert len(loop.scheduled) == 1
    loop.scheduled.pop()()
    assert a.get_nowait() == 5 and a.empty() and b.empty()


def test_a_full_queue_answers_429(tiny_runner) -> None:
    engine = Engine(tiny_runner, max_waiting=1)  # not started: requests wait
    with live_server(create_app(engine, MODEL)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        first: list = []
        t = threading.Thread(target=lambda: first.append(
            client.completions.create(model=MODEL, prompt="q", max_tokens=4, temperature=0)))
        t.start()
        while engine.stats()["waiting"] < 1:
            time.sleep(0.02)
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt="q", max_tokens=4, temperature=0)
        engine.start()
        t.join(30)
        assert first and first[0].usage.completion_tokens >= 1
