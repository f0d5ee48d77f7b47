"""Exception hierarchy: every failure RLX reports is one of these."""

from __future__ import annotations


class RlxError(Exception):
    """Base class of every error raised by RLX."""


class IRError(RlxError, ValueError):
    """A malformed graph: bad shapes, unknown ops, broken references, bad JSON."""


class ShapeError(IRError):
    """Shapes or dtypes that an op cannot accept."""


class UnboundedDimsError(IRError):
    """An imported model's dynamic axes have no upper bound; `dims` maps each such name to where it
    occurs ("input 'x' axis 0"), in the model's order."""

    def __init__(self, message: str, dims: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.dims = dims


class BuildError(RlxError):
    """The system compiler (cc / nvcc) failed or could not be found."""


class CacheError(RlxError):
    """The AOT cache could not be read, written or locked."""


class ExecutionError(RlxError, RuntimeError):
    """A compiled graph was given bad inputs or failed while running."""


class CudaError(ExecutionError):
    """A CUDA runtime or driver call failed inside a compiled graph."""


class ArtifactError(RlxError):
    """A saved artifact cannot be loaded on this machine."""
