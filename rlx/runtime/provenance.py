"""What the pipeline records on a program it built: the decided LIR it rendered and the source's digest.

`rlx.pipeline` sets both after `load` (`record_build`). After a compile-index hit the LIR was not
computed (the warm path optimizes, plans and decides nothing); `lir` then holds a function that
computes it, called on first access (it runs the pipeline's stages up to `decide`, importing codegen's
rule tables). A program loaded from an artifact has neither: `lir` is None, `source_digest` "".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Provenance:
    """Mixed into the compiled program classes (`CompiledGraph`, `CudaGraph`, `MetalGraph`)."""

    #: sha256 of the rendered source (rendered with the key pending: the AOT key's "source" component).
    source_digest: str = ""
    _decided: Any = None

    @property
    def lir(self) -> Any:
        """The decided LIR that was rendered into this program (computed on first access after a
        compile-index hit; None for a program loaded from an artifact)."""
        if callable(self._decided):
            self._decided = self._decided()
        return self._decided

    def record_build(self, digest: str, lir: Any | Callable[[], Any]) -> None:
        """Record the source digest and the decided LIR (or a function computing it) of this build."""
        self.source_digest = digest
        self._decided = lir


__all__ = ["Provenance"]
