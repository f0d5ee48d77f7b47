"""The user op of the op-set fixtures and the custom_op tests: examples/custom_op's swish_beta.

`swish_beta(name)` registers the example (its C, CUDA and Metal headers) under `name`; the example module is
loaded from its file, as a user's own module would be.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import rlx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_op" / "swish_beta.py"


@functools.cache
def example() -> ModuleType:
    """examples/custom_op/swish_beta.py as a module."""
    spec = importlib.util.spec_from_file_location("rlx_example_swish_beta", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def swish_beta(name: str = "swish_beta", **headers: Path) -> rlx.CustomOp:
    """The example op registered as `name` (`c_header=` / `cuda_header=` / `metal_header=` replace its headers)."""
    return example().register(name, **headers)
