"""`rlxc serve` as a process: it serves the tiny GGUF on 127.0.0.1, and on SIGTERM stops admitting, finishes
the stream in flight, and exits 0; without the serve extra it names `pip install 'rlx[serve]'`."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from live import free_port

from rlx.errors import RlxError
from rlx.serving import cli
from rlx.serving.engine import MAX_STALL, SamplingParams


@pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("fastapi") is None,
                    reason="the serve extra is not installed")
def test_sigterm_finishes_the_running_stream_then_exits(tiny_gguf) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlx.cli", "serve", "--model", str(tiny_gguf.parent),
                             "--port", str(port), "--max-seqs", "16", "--max-context", "128", "--chunk", "16",
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        models = httpx.get(url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny-llama"]
        body = {"model": "tiny-llama", "prompt": "go", "max_tokens": 100, "temperature": 0, "stream": True,
                "stop": ["never appears \u2603"]}
        chunks = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line)
            chunks.append(next(lines))
            proc.send_signal(signal.SIGTERM)
            chunks += list(lines)
        assert chunks[-1] == "data: [DONE]"
        last = json.loads(chunks[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] in ("length", "stop")
        assert proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):  # no longer admitting
            httpx.get(url + "/health", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_without_the_serve_extra_it_says_what_to_install(monkeypatch, capsys) -> None:
    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None if name == "fastapi" else real(name))
    assert cli.main(["--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'rlx[serve]'" in err and "fastapi" in err


def test_import_rlx_serving_needs_no_fastapi() -> None:
    code = ("import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None; "
            "import rlx, rlx.serving, rlx.cli; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert out.stdout.strip() == "ok"


@pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("fastapi") is None,
                    reason="the serve extra is not installed")
def test_paged_kv_options_are_checked_before_anything_loads() -> None:
    with pytest.raises(RlxError, match=r"--max-context \(100\) must be a multiple of --page-size \(16\)"):
        cli.main(["--max-context", "100"])
    with pytest.raises(RlxError, match="--kv-pages must be >= 1"):
        cli.main(["--kv-pages", "0"])
    cli_args = cli._parser().parse_args(["--kv-layout", "contiguous", "--max-context", "100"])
    assert cli_args.kv_layout == "contiguous" and cli_args.page_size == 16 and cli_args.kv_pages is None
    with pytest.raises(RlxError, match="--deterministic takes the paged KV layout"):
        cli.main(["--deterministic", "--kv-layout", "contiguous"])
    with pytest.raises(RlxError, match="--max-stall must be >= 0"):
        cli.main(["--max-stall", "-1"])
    with pytest.raises(RlxError, match="--kv-dtype f8e4m3fn runs on CUDA"):
        cli.main(["--kv-dtype", "f8e4m3fn"])
    assert cli._parser().parse_args(["--kv-dtype", "f16"]).kv_dtype == "f16"
    with pytest.raises(SystemExit):  # argparse: not a cache dtype
        cli._parser().parse_args(["--kv-dtype", "q8"])
    assert cli._parser().parse_args([]).max_stall == MAX_STALL
    assert cli._parser().parse_args(["--max-stall", "0"]).max_stall == 0


def test_speculative_options_are_checked_before_anything_loads(tmp_path) -> None:
    for argv, message in ((["--speculative", "prompt_lookup", "--draft-model", str(tmp_path)], "give one"),
                          (["--speculative", "prompt_lookup", "--kv-layout", "contiguous"], "paged KV layout"),
                          (["--speculative", "prompt_lookup", "--lora", "a=/x"], "paged KV layout"),
                          (["--speculative", "prompt_lookup", "--max-draft", "0"], "--max-draft must be >= 1"),
                          (["--draft-model", str(tmp_path / "none.gguf")], "no such file")):
        with pytest.raises(RlxError, match=message):
            cli.check_speculative(cli._parser().parse_args(argv))
    with pytest.raises(SystemExit):  # argparse: not a drafter it knows
        cli._parser().parse_args(["--speculative", "medusa"])


@pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("fastapi") is None,
                    reason="the serve extra is not installed")
def test_max_step_tokens_sizes_the_paged_steps(tiny_gguf) -> None:
    """`--max-step-tokens`: the paged runner's rows a step and the scheduler's token budget (at least a row per
    sequence); below 1 it is refused before anything loads."""
    with pytest.raises(RlxError, match="--max-step-tokens must be >= 1"):
        cli.main(["--max-step-tokens", "0"])
    args = cli._parser().parse_args(["--model", str(tiny_gguf), "--max-seqs", "4", "--max-context", "128",
                                     "--max-step-tokens", "24", "--prefix-cache-mb", "0"])
    engine = cli.build_app(args).state.engine
    try:
        assert engine.runner.max_rows == 24 and engine.scheduler.max_step_tokens == 24
        done = engine.generate(list(range(5, 45)), SamplingParams(max_tokens=4))  # a 40-token prompt: 2 steps
        assert len(done.token_ids) == 4
    finally:
        engine.stop()


@pytest.mark.parametrize("drafter", ["prompt_lookup", "draft_model"])
def test_serve_speculative_serves_the_plain_tokens(tiny_gguf, paged_runner, tiny_runner, drafter) -> None:
    """`rlxc serve --speculative prompt_lookup` and `--draft-model` (the tiny model drafting for itself; compiled
    as the tiny_runner fixture's prefiller) answer a greedy request with the tokens of plain decoding, and report
    the drafter's acceptance."""
    from live import live_server

    from rlx.serving.engine import Engine, SamplingParams

    prompt = [89] * 6
    want = Engine(paged_runner).generate(prompt, SamplingParams(max_tokens=24))
    spec = ["--speculative", "prompt_lookup"] if drafter == "prompt_lookup" else ["--draft-model", str(tiny_gguf)]
    args = cli._parser().parse_args(["--model", str(tiny_gguf), "--max-seqs", "16", "--max-context", "128",
                                     "--chunk", "16", *spec, "--max-draft", "4"])
    cli.check_speculative(args)
    app = cli.build_app(args)
    assert app.state.engine.drafter is not None and app.state.engine.max_draft == 4
    with live_server(app) as url:
        body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 24, "temperature": 0}
        done = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        assert done["choices"][0]["text"] == want.text and done["usage"]["completion_tokens"] == 24
        metrics = httpx.get(url + "/metrics").text
        accepted = float(re.search(r"^rlx_speculative_accepted_tokens_total (\S+)$", metrics, re.M).group(1))
        # the draft model (the target itself) has every proposal kept: 23 tokens after the first, 5 a step at most
        assert accepted >= (18 if drafter == "draft_model" else 1)
        assert app.state.engine.stats()["kv_used_pages"] == 0
