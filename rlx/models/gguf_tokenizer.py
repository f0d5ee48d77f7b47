"""The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`), as llama.cpp reads it.

Byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: GPT-2, LLaMA 3, Qwen2,
SmolLM, StarCoder...) are rebuilt with the `tokenizers` library: a BPE model from
`tokens` / `merges`, the pre-tokenizer split expressions llama.cpp uses for the file's
`tokenizer.ggml.pre` name (applied one after the other, each splitting the pieces of the
last, as llama.cpp does), a byte-level alphabet mapping and decoder. Tokens the file
types as control (3) are registered as special tokens and user-defined ones (4) as
added tokens, so `"<|im_start|>"` in text is one id, as with llama.cpp's
`parse_special`. Decoding does not clean up spaces: `decode(encode(s)) == s`.

>>> tokens = byte_level_alphabet() + ["Ġh", "Ġhi", "<|end|>"]   # ids 0-255 are the bytes
>>> tok = GgufTokenizer.from_metadata({
...     "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
...     "tokenizer.ggml.merges": ["Ġ h", "Ġh i"], "tokenizer.ggml.token_type": [1] * 258 + [3],
...     "tokenizer.ggml.eos_token_id": 258})
>>> ids = tok.encode("a hi<|end|>")
>>> ids, tok.decode(ids), tok.decode(ids, skip_special=True), sorted(tok.stop_ids)
([97, 257, 258], 'a hi<|end|>', 'a hi', [258])
"""

from __future__ import annotations

import codecs
import datetime
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from rlx.errors import ArtifactError, ExecutionError
from rlx.models.gguf import read_gguf_metadata

# llama.cpp's token types (`llama_token_type`).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# The split expressions of llama.cpp's BPE pre-tokenizers (llama-vocab.cpp), by pre-tokenizer type.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "smollm": (r"\p{N}", _GPT2),  # every digit its own piece, then GPT-2's split
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
}
#: `tokenizer.ggml.pre` names (as llama.cpp spells them) -> the split family above.
PRE_TOKENIZERS: dict[str, str] = {
    "default": "default",
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais", "jina-es", "jina-de",
                     "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "gigachat"), "gpt2"),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), "llama3"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), "qwen2"),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"), "smollm"),
    "falcon": "falcon",
}
#: Families whose BPE takes a whole pre-token that is itself in the vocabulary without merging
#: (llama.cpp's `ignore_merges`; HF's `ignore_merges` in LLaMA 3's tokenizer.json).
_IGNORE_MERGES = frozenset({"llama3"})
#: Families for which llama.cpp adds BOS when the file does not say (`tokenizer_add_bos`).
_ADD_BOS_DEFAULT = frozenset({"llama3"})
#: Texts llama.cpp treats as end of generation wherever they are in the vocabulary.
END_OF_GENERATION_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
                           "<｜end▁of▁sentence｜>", "<|eom_id|>")


@cache
def _alphabet() -> tuple[str, ...]:
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return tuple(out)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte 0..255.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) map, in byte
    order, to U+0100 onwards ("Ġ" is the space, "Ċ" the newline).

    >>> a = byte_level_alphabet()
    >>> a[ord("A")], a[ord(" ")], a[ord("\\n")]
    ('A', 'Ġ', 'Ċ')
    """
    return list(_alphabet())


@cache
def _byte_decoder() -> dict[str, int]:
    """Stand-in character -> byte."""
    return {c: b for b, c in enumerate(_alphabet())}


def _whole_utf8(data: bytes) -> str | None:
    """`data` as text if it is whole, valid UTF-8 characters (what an incremental decoder holding nothing gives
    for it, and then holds nothing), else None."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class IncrementalDecoder:
    """Token ids in, text out as it becomes complete: never half of a multibyte character.

    `push(id)` returns the text that token completes ("" while a character is still partial);
    `flush()` returns what is left (an incomplete trailing character becomes U+FFFD, as `decode` does).

    >>> d = IncrementalDecoder(lambda i: "é".encode()[i:i + 1])
    >>> d.push(0), d.push(1), d.flush()
    ('', 'é', '')
    """

    def __init__(self, token_bytes: Any, skip: frozenset[int] = frozenset(),
                 texts: Sequence[str | None] | None = None) -> None:
        # texts: each token's text where its bytes are whole UTF-8 characters (else None), what a push gives while
        # no partial character is held: a lookup, not a decode
        self._token_bytes, self._skip, self._texts = token_bytes, skip, texts or ()
        self._held = b""  # the bytes of a partial character (utf_8_decode's rest, as codecs' incremental decoder)

    def push(self, token_id: int) -> str:
        if token_id in self._skip:
            return ""
        texts = self._texts
        if not self._held and type(token_id) is int and 0 <= token_id < len(texts):
            text = texts[token_id]
            if text is not None:
                return text
        data = self._held + self._token_bytes(token_id)
        text, used = codecs.utf_8_decode(data, "replace", False)
        self._held = data[used:]
        return text

    def flush(self) -> str:
        text, self._held = codecs.utf_8_decode(self._held, "replace", True)[0], b""
        return text


class GgufTokenizer:
    """Encode / decode / chat-format text the way the GGUF file's model expects.

    Build it with `from_gguf(path)` or `from_metadata(metadata)`.
    """

    def __init__(self, metadata: Mapping[str, Any], source: str = "<metadata>") -> None:
        self.source = source
        kind = metadata.get("tokenizer.ggml.model")
        if kind is None:
            raise ArtifactError(f"{source} has no tokenizer (no tokenizer.ggml.model key)")
        if kind != "gpt2":
            raise ArtifactError(f"{source}: tokenizer model {kind!r} is not supported; only byte-level BPE ('gpt2')")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise ArtifactError(f"{source}: tokenizer.ggml.tokens must be a non-empty list of strings")
        merges = metadata.get("tokenizer.ggml.merges")
        if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
            raise ArtifactError(f"{source}: tokenizer.ggml.merges must be a list of 'left right' strings")
        types = metadata.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
        if not isinstance(types, list) or len(types) != len(tokens) or not all(type(t) is int for t in types):
            raise ArtifactError(f"{source}: tokenizer.ggml.token_type must list one type per token "
                                f"({len(tokens)} tokens)")
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise ArtifactError(f"{source}: pre-tokenizer {pre!r} is not supported; supported: "
                                f"{', '.join(sorted(PRE_TOKENIZERS))}")
        self.pre_tokenizer = pre
        family = PRE_TOKENIZERS[pre]
        # llama.cpp names an empty token [EMPTY_i] (a BPE vocabulary cannot hold two empty strings).
        self.tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.token_types = [int(t) for t in types]
        self.vocab_size = len(self.tokens)

        def special_id(key: str) -> int:
            v = metadata.get(f"tokenizer.ggml.{key}")
            if v is None:
                return -1
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < self.vocab_size:
                raise ArtifactError(f"{source}: tokenizer.ggml.{key} {v!r} is not a token id "
                                    f"(vocabulary of {self.vocab_size})")
            return v

        self.bos_id, self.eos_id = special_id("bos_token_id"), special_id("eos_token_id")
        self.pad_id, self.unk_id = special_id("padding_token_id"), special_id("unknown_token_id")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", family in _ADD_BOS_DEFAULT))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        self.chat_template: str | None = metadata.get("tokenizer.chat_template")
        by_text = {t: i for i, t in enumerate(self.tokens)}
        stop = {self.eos_id} | {special_id(k) for k in ("eot_token_id", "eom_token_id")}
        stop |= {by_text[t] for t in END_OF_GENERATION_TEXTS if t in by_text}
        self.stop_ids: frozenset[int] = frozenset(stop - {-1})
        self.special_ids: frozenset[int] = frozenset(i for i, t in enumerate(self.token_types) if t == TOKEN_CONTROL)
        self._tok = self._build(merges, family)
        self._bytes = [self._spell(i) for i in range(self.vocab_size)]
        # each token's text where its bytes are whole UTF-8 characters, else None (`IncrementalDecoder`'s shortcut):
        # a tuple of str / None, which the garbage collector stops tracking at its first pass (a list it would
        # walk, all ~50k entries, in every collection of its generation)
        self._texts = tuple(_whole_utf8(b) for b in self._bytes)
        # Bytes with no token of their own: BPE would silently drop them, so encode() refuses such text.
        self._missing_bytes = frozenset(b for b, c in enumerate(_alphabet()) if c not in by_text)

    def _build(self, merges: list[str], family: str) -> Any:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        vocab = {t: i for i, t in enumerate(self.tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=family in _IGNORE_MERGES)
        except Exception as exc:  # the tokenizers package raises its own exception type
            raise ArtifactError(f"{self.source}: cannot build the BPE vocabulary: {exc}") from None
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZER_SPLITS[family]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(self.tokens[i], special=True, normalized=False)
                                for i in sorted(self.special_ids)])
        tok.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind in zip(self.tokens, self.token_types) if kind == TOKEN_USER_DEFINED])
        return tok

    def _spell(self, i: int) -> bytes:
        """The bytes token `i` stands for (control / user-defined tokens: their text)."""
        t, table = self.tokens[i], _byte_decoder()
        if self.token_types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED) or not all(c in table for c in t):
            return t.encode("utf-8")
        return bytes(table[c] for c in t)

    # ------------------------------------------------------------------------------------------ building

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], source: str = "<metadata>") -> GgufTokenizer:
        """The tokenizer described by a GGUF metadata dict (`read_gguf(...).metadata`)."""
        return cls(metadata, source)

    @classmethod
    def from_gguf(cls, path: str | Path) -> GgufTokenizer:
        """The tokenizer of the GGUF file at `path` (only its metadata is read)."""
        return cls(read_gguf_metadata(path), str(path))

    # ------------------------------------------------------------------------------------------ encoding

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; BOS first when `add_bos` (None: as the file says), special tokens parsed.

        EOS is appended only where the file sets `tokenizer.ggml.add_eos_token`.
        """
        if not isinstance(text, str):
            raise ExecutionError(f"encode() takes a str, got {type(text).__name__}")
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # e.g. a lone surrogate cannot cross into Rust
            raise ExecutionError(f"cannot encode text: {exc}") from None
        if self._missing_bytes and not self._missing_bytes.isdisjoint(text.encode("utf-8")):
            lost = sorted(self._missing_bytes.intersection(text.encode("utf-8")))
            raise ExecutionError(f"{self.source}: the vocabulary has no token for byte(s) {lost} of this text")
        bos = self.add_bos if add_bos is None else add_bos
        if bos:
            if self.bos_id < 0:
                raise ExecutionError(f"{self.source} names no BOS token; call encode(..., add_bos=False)")
            ids = [self.bos_id, *ids]
        if self.add_eos and self.eos_id >= 0:
            ids.append(self.eos_id)
        return ids

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        out = []
        for i in ids:
            if isinstance(i, bool) or not hasattr(i, "__index__"):
                raise ExecutionError(f"token ids must be ints, got {i!r}")
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ExecutionError(f"token id {i} is out of range for vocab_size {self.vocab_size}")
            out.append(i)
        return out

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids` (control tokens spelled out unless `skip_special`); no space clean-up.

        Bytes that do not form valid UTF-8 become U+FFFD.
        """
        skip = self.special_ids if skip_special else frozenset()
        data = b"".join(self._bytes[i] for i in self._check_ids(ids) if i not in skip)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (may be part of a UTF-8 character)."""
        if type(token_id) is int and 0 <= token_id < self.vocab_size:  # a model's output: nothing to convert
            return self._bytes[token_id]
        return self._bytes[self._check_ids([token_id])[0]]

    def incremental_decoder(self, skip_special: bool = False) -> IncrementalDecoder:
        """A decoder to feed generated ids one at a time (`push(id) -> str`, then `flush()`)."""
        return IncrementalDecoder(self.token_bytes, self.special_ids if skip_special else frozenset(), self._texts)

    def decode_stream(self, ids: Iterable[int], skip_special: bool = False) -> Iterator[str]:
        """Yield the text of `ids` piece by piece as characters complete; pieces join to `decode(ids)`."""
        d = self.incremental_decoder(skip_special)
        for i in ids:
            piece = d.push(i)
            if piece:
                yield piece
        tail = d.flush()
        if tail:
            yield tail

    # ------------------------------------------------------------------------------------------ chat

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render the file's Jinja chat template (sandboxed) for `messages` (`{"role", "content"}` dicts).

        The template sees `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and `extra`,
        with the Jinja options Hugging Face uses (trim_blocks, lstrip_blocks, loop controls).
        """
        if not self.chat_template:
            raise ArtifactError(f"{self.source} has no chat template (tokenizer.chat_template)")
        if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
            raise ExecutionError("messages must be a list of {'role': ..., 'content': ...} dicts")
        for n, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
                raise ExecutionError(f"message {n} must be a dict with a str 'role' and a 'content', got {m!r}")
        template = _compile_template(self.chat_template)
        text = lambda i: self.tokens[i] if i >= 0 else ""  # noqa: E731 - special tokens as the template sees them
        try:
            return template.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                                   bos_token=text(self.bos_id), eos_token=text(self.eos_id), **extra)
        except _TemplateRaise as exc:
            raise ExecutionError(f"the chat template refused the messages: {exc}") from None
        except Exception as exc:  # a Jinja error inside the file's template
            raise ArtifactError(f"{self.source}: the chat template failed: {type(exc).__name__}: {exc}") from None

    def __repr__(self) -> str:
        return f"GgufTokenizer({self.source!r}, vocab_size={self.vocab_size}, pre={self.pre_tokenizer!r})"


class _TemplateRaise(Exception):
    """`raise_exception(...)` called by a chat template (bad roles, ...)."""


@cache
def _compile_template(source: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise _TemplateRaise(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    # Llama 3.x templates print today's date.
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except Exception as exc:  # jinja2.TemplateSyntaxError and friends
        raise ArtifactError(f"the chat template does not parse: {exc}") from None
