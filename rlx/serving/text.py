"""A sequence's text as its tokens come: incremental detokenization that holds back a possible stop string.

>>> class Bytes:  # a tokenizer whose token i is the byte i
...     def incremental_decoder(self):
...         from rlx.models.gguf_tokenizer import IncrementalDecoder
...         return IncrementalDecoder(lambda i: bytes([i]))
>>> t = StopText(Bytes(), stop=("lo w",))
>>> [t.push(c) for c in b"hello wor"], t.stopped
(['', '', '', 'h', 'e', 'l', '', '', ''], True)
>>> t.flush()
''
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StopText:
    """`push(token)` returns the text now safe to show; `stopped` turns True when a stop string
    appears (the text ends before it); `flush()` returns what was held back at the end."""

    def __init__(self, tokenizer: Any | None, stop: Sequence[str] = (), skip_special: bool | None = None) -> None:
        # skip_special: whether the tokenizer's decoder leaves special tokens out (None: ask its signature)
        skip = takes_skip(tokenizer) if skip_special is None else skip_special
        self._decoder = tokenizer.incremental_decoder(skip_special=True) if skip else (
            tokenizer.incremental_decoder() if tokenizer is not None else None)
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""  # decoded, not yet shown (it may begin a stop string)
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self._decoder is None or self.stopped:
            return ""
        piece = self._decoder.push(token_id)
        # what `_release` would give, without its search, in the two common cases: no stop strings (nothing is
        # ever held back: `_pending` is empty), or no new text (what is held back was searched already)
        if not self._stop:
            if not self._pending:
                return piece
        elif not piece:
            return ""
        else:  # `_release(final=False)` inlined
            pending = self._pending + piece
            cut = -1
            for s in self._stop:
                at = pending.find(s)
                if at >= 0 and (cut < 0 or at < cut):
                    cut = at
            if cut >= 0:
                self._pending, self.stopped = "", True
                return pending[:cut]
            keep = self._hold
            if len(pending) <= keep:
                self._pending = pending
                return ""
            self._pending = pending[len(pending) - keep:]
            return pending[:len(pending) - keep]
        self._pending += piece
        return self._release(final=False)

    def flush(self) -> str:
        if self._decoder is not None and not self.stopped:
            self._pending += self._decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        cut = -1  # where the first stop string begins
        for s in self._stop:
            at = self._pending.find(s)
            if at >= 0 and (cut < 0 or at < cut):
                cut = at
        if cut >= 0:
            out, self._pending, self.stopped = self._pending[:cut], "", True
            return out
        keep = 0 if final else min(self._hold, len(self._pending))
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        return out


def takes_skip(tokenizer: Any | None) -> bool:
    """Whether the tokenizer's incremental decoder can leave special tokens out of the text."""
    if tokenizer is None:
        return False
    import inspect

    try:
        return "skip_special" in inspect.signature(tokenizer.incremental_decoder).parameters
    except (TypeError, ValueError):
        return False
