"""Whether the device an example was asked to run on is here, checked before any model is loaded.

An example runs what it compiles, so `--device cuda` needs a visible NVIDIA GPU (cross-compiling for
a GPU elsewhere is `rlxc compile --target cuda:sm_XY`, which runs nothing).

>>> device_missing("cpu") is None
True
"""

from __future__ import annotations


def device_missing(device: str) -> str | None:
    """Why `device` cannot run a model here (a sentence for the user), or None when it can."""
    if device != "cuda":
        return None
    from rlx.toolchain.cuda import visible_gpu_arch

    if visible_gpu_arch() is None:
        return ("--device cuda runs the model on an NVIDIA GPU, and none is visible here (nvidia-smi lists "
                "none); leave out --device to run on the CPU")
    return None


__all__ = ["device_missing"]
