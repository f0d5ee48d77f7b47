"""The CPU backend: one C file (OpenMP + BLAS) per graph; its emitter, rules and C helpers."""
