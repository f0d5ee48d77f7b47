"""`rlxc serve --ray --replicas 2`: two engine replicas of the tiny model behind one endpoint through Ray Serve, on
a local Ray the test starts (127.0.0.1, 2 CPUs): requests through the openai client reach both replicas, each
answers a greedy request with the tokens of plain decoding, no page stays used, and shutdown closes the port."""

from __future__ import annotations

import threading

import httpx
import pytest
from live import free_port

from rlx.serving import cli, ray_serve
from rlx.serving.engine import Engine, SamplingParams

MODEL = "tiny-llama"


@pytest.fixture
def local_ray(monkeypatch):
    # skipped here, not at import: a module-level skip would leave the file uncollected (tests/test_collection.py)
    ray = pytest.importorskip("ray", reason="ray[serve] is optional (pip install 'rlx[ray]')")
    for name in ("ray.serve", "fastapi", "uvicorn", "openai"):
        pytest.importorskip(name, reason=f"{name} is optional for the Ray Serve test")
    # a busy 2-core machine starts Ray's workers slowly: Serve's proxy gets longer than its 5 s to report ready
    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        monkeypatch.setenv(name, "60")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local test cluster: no token written under ~/.ray
    ray.init(include_dashboard=False, num_cpus=2, object_store_memory=80 << 20, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_two_replicas_serve_one_endpoint(local_ray, tiny_gguf, paged_runner) -> None:
    # the replicas' model is the paged_runner fixture's (same options): compiled already, each replica loads it
    prompt = [89, 40, 41, 42, 89, 40]
    want = Engine(paged_runner).generate(prompt, SamplingParams(max_tokens=12)).text
    port = free_port()
    args = cli._parser().parse_args(["--model", str(tiny_gguf), "--max-seqs", "16", "--max-context", "128",
                                     "--ray", "--replicas", "2", "--port", str(port), "--log-level", "warning"])
    url = ray_serve.start_replicas(args, cli.build_app)
    try:
        assert url == f"http://127.0.0.1:{port}"
        import openai

        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        replicas: list[str] = []
        texts: list[str] = []
        lock = threading.Lock()

        def ask() -> None:
            raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=12,
                                                              temperature=0)
            with lock:
                replicas.append(raw.headers[ray_serve.REPLICA_HEADER])
                texts.append(raw.parse().choices[0].text)

        for _ in range(4):  # rounds of 4 concurrent requests, until both replicas have answered
            threads = [threading.Thread(target=ask) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            if len(set(replicas)) == 2:
                break
        assert len(set(replicas)) == 2 and len(texts) == len(replicas)
        assert set(texts) == {want}  # every replica: the tokens of plain decoding
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=8, temperature=0, stream=True)
        assert sum(1 for c in stream if c.choices and c.choices[0].delta.content) > 0
        for _ in range(4):  # whichever replica answers: nothing running, no page used
            health = httpx.get(url + "/health", timeout=30).json()
            assert health["running"] == 0 and health["kv_used_pages"] == 0
    finally:
        ray_serve.stop_replicas()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=5)
