"""The RLX version, in the base layer so that any layer can record it (cache metadata, artifacts)
without importing the `rlx` package root, which imports every layer."""

__version__ = "0.1.0"
