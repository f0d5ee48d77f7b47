"""Exception hierarchy: every failure RLX reports is one of these."""

from __future__ import annotations


class RlxError(Exception):
    """Base class of every error raised by RLX."""


class IRError(RlxError, ValueError):
    """A malformed graph: bad shapes, unknown ops, broken references, bad JSON."""


class ShapeError(IRError):
    """Shapes or dtypes that an op cannot accept."""


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
