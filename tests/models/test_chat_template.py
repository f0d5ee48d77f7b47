"""Chat templates rendered as transformers' `apply_chat_template(tokenize=False)` renders them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlx.errors import ArtifactError, ExecutionError
from rlx.models.chat_template import TemplateRefused, render
from rlx.models.hf_tokenizer import HfTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_checkpoints import CHATML, LLAMA2, write_tokenizer

#: Exercises what transformers' environment adds: tojson (no HTML escaping, indent), namespace, loop controls,
#: trim_blocks / lstrip_blocks around block tags, a generation block, and the special tokens.
TOOLISH = """{{ bos_token }}
{% set ns = namespace(count=0) %}
{% for m in messages %}
    {% if m.role == 'system' %}{% continue %}{% endif %}
    {% set ns.count = ns.count + 1 %}
<{{ m.role }} n={{ ns.count }}>{{ m.content | tojson }}
    {% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}{% endif %}
{% endfor %}
{{ {'k': '<&é>', 'n': [1, 2]} | tojson(indent=2) }}
{% if add_generation_prompt %}<assistant>{% endif %}"""

MESSAGES = {
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "w5 w6"}],
    "multi_turn": [{"role": "user", "content": "w5"}, {"role": "assistant", "content": "w7 w8"},
                   {"role": "user", "content": "w9 <b> & é"}],
    "generation_prompt": [{"role": "user", "content": "w10"}],
}


@pytest.fixture(scope="module", params=["chatml", "llama2", "toolish"])
def tokenizers(request, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    template = {"chatml": CHATML, "llama2": LLAMA2, "toolish": TOOLISH}[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    write_tokenizer(directory, template)
    return HfTokenizer.from_dir(directory), transformers.AutoTokenizer.from_pretrained(str(directory))


@pytest.mark.parametrize("case", sorted(MESSAGES))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendered_like_transformers(tokenizers, case, add_generation_prompt):
    ours, theirs = tokenizers
    expected = theirs.apply_chat_template(MESSAGES[case], tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(MESSAGES[case], add_generation_prompt=add_generation_prompt) == expected


def test_raise_exception_is_a_clear_error():
    with pytest.raises(TemplateRefused, match="roles must alternate"):
        render(LLAMA2, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
               special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    assert issubclass(TemplateRefused, ExecutionError)


def test_bad_templates_and_messages():
    with pytest.raises(ArtifactError, match="does not parse"):
        render("{% for %}", [])
    with pytest.raises(ArtifactError, match=r"the chat template failed: UndefinedError: .*nope"):
        render("{{ messages[0].content.nope() }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ExecutionError, match="message 0 must be a dict"):
        render(CHATML, [("user", "x")])
    with pytest.raises(ArtifactError, match=r"failed: SecurityError: .*cannot set namespace attribute '_x'"):
        render("{% set ns = namespace(_x=1) %}", [])


def test_tokenizer_round_trip_and_incremental_text(tmp_path):
    write_tokenizer(tmp_path)
    tok = HfTokenizer.from_dir(tmp_path)
    ids = tok.encode("w5 w6 w7")
    assert ids == [5, 6, 7] and tok.decode(ids) == "w5 w6 w7"
    stream = tok.incremental_decoder()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == tok.decode(ids)
    assert tok.stop_ids == frozenset({2})
    assert HfTokenizer.from_dir(tmp_path / "none") is None
