"""`rlxc serve --lora`: PEFT adapters (made by PEFT for a Hugging Face LLaMA of the tiny GGUF model's shape)
served as models of their own, live on 127.0.0.1 through the openai client: /v1/models lists them, an
unknown model is a 404, and requests of different adapters (and none) decoding in the same engine steps
get, token for token, what each gets alone and what `CausalLM.generate(adapter=)` gives."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("peft")
openai = pytest.importorskip("openai")

from live import live_server  # noqa: E402
from tiny_gguf import CONFIG  # noqa: E402

from rlx.errors import RlxError  # noqa: E402
from rlx.serving.cli import _parser, build_app  # noqa: E402
from rlx.serving.engine import Completion, Engine, SamplingParams  # noqa: E402
from rlx.serving.runner import CausalLMRunner  # noqa: E402
from rlx.serving.server import create_app  # noqa: E402

MODEL = "tiny-llama"
ADAPTERS = {
    "sql": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]),
    "chat": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["k_proj", "gate_proj", "up_proj"]),
    "all": dict(r=2, lora_alpha=2, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"]),
}
GREEDY = SamplingParams(max_tokens=20, temperature=0.0)


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random PEFT adapters of the tiny model's shape, saved by PEFT (B random: PEFT's default 0 is a no-op)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=CONFIG.vocab_size, hidden_size=CONFIG.hidden_size,
                                      intermediate_size=CONFIG.ffn_size, num_hidden_layers=CONFIG.num_layers,
                                      num_attention_heads=CONFIG.num_heads, num_key_value_heads=CONFIG.num_kv_heads,
                                      head_dim=CONFIG.head_dim))
    root = tmp_path_factory.mktemp("lora")
    dirs = {}
    for name, kw in ADAPTERS.items():
        model = get_peft_model(hf, LoraConfig(init_lora_weights=False, lora_dropout=0.0, **kw))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 1.0)
        model.save_pretrained(str(root / name))
        hf = model.unload()  # the base model back, without this adapter's layers
        dirs[name] = root / name
    return dirs


@pytest.fixture(scope="module")
def runner(tiny_gguf: Path, adapter_dirs: dict[str, Path]) -> CausalLMRunner:
    r = CausalLMRunner.from_gguf(tiny_gguf, slots=4, max_context=64, chunk=16, quant_act="f32",
                                 max_adapters=len(ADAPTERS), max_lora_rank=8)
    for name, d in adapter_dirs.items():
        r.load_adapter(d, name)
    return r


@pytest.fixture(scope="module")
def alone(runner: CausalLMRunner) -> dict[str | None, list[Completion]]:
    """Each prompt's greedy completion with each adapter (and none), one request at a time through the engine."""
    engine = Engine(runner, prefix_cache_bytes=1 << 20)
    return {name: [engine.generate(p, GREEDY, adapter=name) for p in PROMPTS] for name in (None, *ADAPTERS)}


PROMPTS = [list(b"select * from"), list(b"hello there, how are"), list(b"select * from")]


def test_an_adapter_alone_equals_causal_lm_generate_with_it(runner, alone) -> None:
    lm = runner.prefiller  # one row, chunks of 16: the engine's prefill, then one-token steps
    for name in (None, *ADAPTERS):
        for prompt, got in zip(PROMPTS, alone[name]):
            assert got.token_ids == lm.generate(prompt, GREEDY.max_tokens, adapter=name).token_ids
    for name in ADAPTERS:  # each adapter changes the tokens (else the mixing test proves nothing)
        assert [c.token_ids for c in alone[name]] != [c.token_ids for c in alone[None]]


def test_mixed_adapters_share_decode_steps_and_each_row_equals_alone(runner, alone, monkeypatch) -> None:
    steps: list[tuple[str | None, ...]] = []
    decode = runner.decode

    def spy(slots, tokens, logits, adapters=None):
        steps.append(tuple(adapters or [None] * len(slots)))
        return decode(slots, tokens, logits, adapters=adapters)

    monkeypatch.setattr(runner, "decode", spy)
    engine = Engine(runner, max_step_tokens=64)  # every prompt's prefill fits beside the decode rows
    # four requests, each prompt under two different adapters: all decode together in 4 rows
    order = [("sql", 0), (None, 0), ("chat", 1), ("all", 2)]
    requests = [engine.submit(PROMPTS[i], GREEDY, adapter=name) for name, i in order]
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    for (name, i), r in zip(order, requests):
        assert [e.token_id for e in r if e.token_id is not None] == alone[name][i].token_ids
    assert max(len(set(s)) for s in steps) == 4  # one step mixed three adapters and the base model
    with pytest.raises(RlxError, match="no adapter named 'nope' is loaded"):
        engine.submit(PROMPTS[0], GREEDY, adapter="nope")


@pytest.fixture(scope="module")
def server(runner):
    engine = Engine(runner, max_waiting=16, prefix_cache_bytes=1 << 20).start()
    with live_server(create_app(engine, MODEL)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=60)


def test_models_lists_the_base_and_its_adapters_and_an_unknown_model_is_a_404(client) -> None:
    listed = client.models.list().data
    assert [m.id for m in listed] == [MODEL, *sorted(ADAPTERS)]
    assert all(getattr(m, "parent", None) == MODEL for m in listed[1:])
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert err.value.body["code"] == "model_not_found" and "nope" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=f"{MODEL}:nope", prompt="hi", max_tokens=2)


def test_concurrent_requests_of_different_adapters_equal_each_alone(client, alone) -> None:
    """Eight concurrent requests over the four slots (base, each adapter by name and as "base:name",
    streaming and not): each gets the text and token count it gets alone."""
    jobs = [(model, i, stream) for i in (0, 1) for model, stream in
            ((MODEL, False), ("sql", True), (f"{MODEL}:chat", False), ("all", True))]
    results: dict[int, tuple[str, int, str]] = {}

    def run(k: int) -> None:
        model, i, stream = jobs[k]
        kw = dict(model=model, prompt=PROMPTS[i], max_tokens=GREEDY.max_tokens, temperature=0)
        if stream:
            chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            results[k] = (text, chunks[-1].usage.completion_tokens, chunks[0].model)
        else:
            done = client.completions.create(**kw)
            results[k] = (done.choices[0].text, done.usage.completion_tokens, done.model)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(len(jobs)))
    for k, (model, i, _) in enumerate(jobs):
        want = alone[None if model == MODEL else model.rpartition(":")[2]][i]
        assert results[k] == (want.text, len(want.token_ids), model)


def test_rlxc_serve_lora_flags_load_the_adapters(tiny_gguf, adapter_dirs) -> None:
    # the runner fixture's shapes: its compiled graphs come from the cache
    args = _parser().parse_args(["--model", str(tiny_gguf), "--max-seqs", "4", "--max-context", "64", "--chunk", "16",
                                 *[f"--lora={n}={d}" for n, d in adapter_dirs.items()]])
    app = build_app(args)
    try:
        runner = app.state.engine.runner
        assert runner.adapters == sorted(ADAPTERS)
        assert runner.decoder._lora.rank == max(kw["r"] for kw in ADAPTERS.values())
        assert runner.decoder.gguf_qk_rows and runner.prefiller.gguf_qk_rows
    finally:
        app.state.engine.stop()
    with pytest.raises(RlxError, match="given twice"):
        build_app(_parser().parse_args(["--model", str(tiny_gguf), "--lora", "a=x", "--lora", "a=y"]))
    with pytest.raises(RlxError, match="served model's name 'tiny-llama'"):
        build_app(_parser().parse_args(["--model", str(tiny_gguf), "--lora", f"tiny-llama={adapter_dirs['sql']}"]))
    with pytest.raises(RlxError, match="NAME=PATH"):
        build_app(_parser().parse_args(["--model", str(tiny_gguf), "--lora", str(adapter_dirs["sql"])]))
