"""A Hugging Face checkpoint's tokenizer: `tokenizer.json` through `tokenizers`, and its chat template.

`HfTokenizer.from_dir(dir)` reads `tokenizer.json` and, where present, `tokenizer_config.json`
(the special tokens and `chat_template`: a string, or a list of named templates of which
"default" is used). It offers what `CausalLM` asks of a tokenizer: `encode`, `decode`,
`incremental_decoder`, `stop_ids` and `apply_chat_template`.

>>> from tokenizers import Tokenizer, models
>>> tok = HfTokenizer(Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>")))
>>> tok.encode("a"), tok.decode([0, 1])
([0], 'a b')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlx.errors import ArtifactError, ExecutionError
from rlx.models.chat_template import render
from rlx.models.weights import load_json

#: The named special tokens a template sees (transformers' SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken dict with its "content"."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class IncrementalText:
    """Text of generated ids one at a time: `push(id) -> str` gives what the new id completes, `flush()`
    what is left (a character cut in the middle of its bytes waits for the next id)."""

    def __init__(self, tokenizer: HfTokenizer, skip_special: bool = False) -> None:
        self._tok, self._skip = tokenizer, skip_special
        self._ids: list[int] = []
        self._sent = 0  # characters of decode(ids) already returned

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        text = self._tok.decode(self._ids, self._skip)
        if text.endswith("\ufffd"):  # an unfinished UTF-8 sequence: wait for its next bytes
            return ""
        piece, self._sent = text[self._sent:], len(text)
        return piece

    def flush(self) -> str:
        text = self._tok.decode(self._ids, self._skip)
        piece, self._sent = text[self._sent:], len(text)
        return piece


class HfTokenizer:
    """`tokenizers.Tokenizer` plus the special tokens and chat template of a checkpoint."""

    def __init__(self, tokenizer: Any, config: Mapping[str, Any] | None = None, stop_ids: Iterable[int] = (),
                 source: str = "<tokenizer>") -> None:
        self._tok = tokenizer
        self.source = source
        config = config or {}
        self.special_tokens = {k: t for k in SPECIAL_TOKEN_KEYS if (t := _token_text(config.get(k))) is not None}
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the "default" one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default")
        self.chat_template: str | None = template if isinstance(template, str) else None
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        stops = set(stop_ids)
        eos = self.special_tokens.get("eos_token")
        if eos is not None and tokenizer.token_to_id(eos) is not None:
            stops.add(tokenizer.token_to_id(eos))
        self.stop_ids: frozenset[int] = frozenset(stops)
        bos = self.special_tokens.get("bos_token")
        self.bos_id = tokenizer.token_to_id(bos) if bos is not None else None

    @classmethod
    def from_dir(cls, model_dir: str | Path, stop_ids: Iterable[int] = ()) -> HfTokenizer | None:
        """The tokenizer of a checkpoint directory, or None when it has no tokenizer.json."""
        d = Path(model_dir)
        if not (d / "tokenizer.json").is_file():
            return None
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as exc:  # the tokenizers package raises its own exception type
            raise ArtifactError(f"cannot read {d / 'tokenizer.json'}: {exc}") from None
        config = load_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
        if "chat_template" not in config and (d / "chat_template.jinja").is_file():
            config = {**config, "chat_template": (d / "chat_template.jinja").read_text(encoding="utf-8")}
        return cls(tok, config, stop_ids, str(d))

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; the tokenizer's own special tokens (BOS) are added unless `add_bos` is False,
        or when the text already starts with the BOS token (a rendered chat template)."""
        if not isinstance(text, str):
            raise ExecutionError(f"encode() takes a str, got {type(text).__name__}")
        bos = self.special_tokens.get("bos_token")
        add = add_bos if add_bos is not None else not (bos and text.startswith(bos))
        try:
            return list(self._tok.encode(text, add_special_tokens=add).ids)
        except Exception as exc:  # e.g. a lone surrogate cannot cross into Rust
            raise ExecutionError(f"cannot encode text: {exc}") from None

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids` (special tokens spelled out unless `skip_special`)."""
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ExecutionError(f"token ids must be in [0, {self.vocab_size})")
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def incremental_decoder(self, skip_special: bool = False) -> IncrementalText:
        return IncrementalText(self, skip_special)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """The chat template rendered for `messages`, as transformers' `apply_chat_template(tokenize=False)`."""
        if not self.chat_template:
            raise ArtifactError(f"{self.source} has no chat template (tokenizer_config.json chat_template)")
        return render(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                      special_tokens=self.special_tokens, **extra)

    def __repr__(self) -> str:
        return f"HfTokenizer({self.source!r}, vocab_size={self.vocab_size})"
