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

    def __init__(self, tokenizer: Any | None, stop: Sequence[str] = ()) -> None:
        self._decoder = tokenizer.incremental_decoder(skip_special=True) if _takes_skip(tokenizer) else (
            tokenizer.incremental_decoder() if tokenizer is not None else None)
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""  # decoded, not yet shown (it may begin a stop string)
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self._decoder is None or self.stopped:
            return ""
        self._pending += self._decoder.push(token_id)
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


def _takes_skip(tokenizer: Any | None) -> bool:
    """Whether the tokenizer's incremental decoder can leave special tokens out of the text."""
    if tokenizer is None:
        return False
    import inspect

    try:
        return "skip_special" in inspect.signature(tokenizer.incremental_decoder).parameters
    except (TypeError, ValueError):
        return False
