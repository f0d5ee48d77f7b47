"""What the AOT cache's listing and `explain` report: `EntryInfo`, `Difference`, `Explanation`.

In a module of their own, which `rlx.toolchain.cache` loads when it lists entries or explains a key: a
warm start's cache hit needs none of them (and defining a frozen dataclass costs about a millisecond).

>>> print(Explanation(key="ab12", hit=False, nearest="cd34", differences=(Difference("flags", "-O3", "-O2"),)))
ab12: not cached
  nearest entry cd34 differs in 1 component(s):
    flags: wanted '-O3', cached '-O2'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EntryInfo:
    """One entry as listed by `AotCache.entries()` (not verified)."""

    key: str
    dir: Path
    layer: str
    bytes: int
    created: float
    last_use: float
    components: dict = field(compare=False, repr=False)
    name: str = ""  # the graph's name: meta.json "info", else the generated source's header ("" if unknown)


@dataclass(frozen=True)
class Difference:
    """One key component that differs between the wanted key and a cached entry."""

    component: str
    wanted: Any
    cached: Any


@dataclass(frozen=True)
class Explanation:
    """What `AotCache.explain` found: a hit, or the nearest entry and what differs from it."""

    key: str
    hit: bool
    where: Path | None = None
    nearest: str | None = None
    differences: tuple[Difference, ...] = ()
    note: str = ""

    def __str__(self) -> str:
        if self.hit:
            return f"{self.key}: cached in {self.where} (a hit)"
        lines = [f"{self.key}: not cached"]
        if self.note:
            lines.append(f"  {self.note}")
        if self.nearest is not None:
            lines.append(f"  nearest entry {self.nearest} differs in {len(self.differences)} component(s):")
            for d in self.differences:
                lines.append(f"    {d.component}: wanted {_short(d.wanted)}, cached {_short(d.cached)}")
        return "\n".join(lines)


def _short(value: Any, limit: int = 72) -> str:
    if value is None:
        return "(absent)"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " / ".join(line.strip() for line in text.splitlines() if line.strip()) or repr(text)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


__all__ = ["Difference", "EntryInfo", "Explanation"]
