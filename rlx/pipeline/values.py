"""The values the back half of the pipeline passes on: what `render` gives, what `build` gives.

A backend's source names its own cache key (in the manifest it embeds), and the key is a digest of
the source: so `render` gives the source rendered with the key pending (`KEY_PENDING`, the text
whose sha256 is `digest`) and `with_key`, the same render with a key filled in (nothing else
differs), which `build` calls once, on a cache miss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from rlx.ir.lir import LirModule



@dataclass(frozen=True)
class Rendered:
    """The render stage's value: the decided LIR that was rendered, its source and the key components.

    `components["source"]` is `digest`, the sha256 of `text`; `extra` holds what one backend's build
    needs beyond the text (the Metal program's dispatch manifest).
    """

    backend: str
    lir: LirModule
    text: str
    with_key: Callable[[str], str] = field(repr=False, compare=False)
    components: dict[str, str] = field(compare=False)
    extra: Any = field(default=None, compare=False)

    @property
    def digest(self) -> str:
        """sha256 of the rendered source (with the key pending): `compiled.source_digest`."""
        return self.components["source"]


@dataclass(frozen=True)
class Built:
    """The build stage's value: where the built program is (`library`: a shared object, or a Metal
    program directory), its kept source, its cache key, whether it was a cache hit, its source digest."""

    library: Path
    source: Path
    key: str
    hit: bool
    digest: str
    seconds: float = 0.0


__all__ = ["Built", "Rendered"]
