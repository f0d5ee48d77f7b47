"""Whether CPU builds here multiply on the AMX tile unit, and why not (`rlxc doctor`'s "tile unit" line).

Generated CPU code takes the tile unit where three things hold (templates/cpu/kernels/amx.h): the build's ISA has
it (`-march=native` on a CPU with `amx_tile`; an ISA level such as `x86-64-v4` leaves it out), the CPU has the
product kind (`amx_bf16` for bf16 GEMMs with K a multiple of 32, `amx_int8` for dynamic int8 GEMMs with K a
multiple of 64 and 16 rows or more, and the quantized matmuls' many-row steps), and Linux grants the process the
tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked by the kernels at their first use). Elsewhere the vector paths run.

>>> tile_unit_report(frozenset({"avx512f"}), "native:znver4", lambda: True)
'none on this CPU (the vector paths run)'
>>> tile_unit_report(frozenset({"amx_tile", "amx_bf16", "amx_int8"}), "x86-64-v4", lambda: True)
'AMX-BF16, AMX-INT8 on this CPU, left out by the build ISA x86-64-v4 (RLX_CPU_TARGET=native takes it)'
>>> tile_unit_report(frozenset({"amx_tile", "amx_bf16"}), "native:sapphirerapids", lambda: False)
'AMX-BF16 on this CPU, refused by Linux (arch_prctl): the vector paths run'
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

from rlx.toolchain.isa import machine

#: Linux x86-64: the arch_prctl syscall, its "request permission" code and the tile data feature.
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
#: The tile unit's product kinds: the cpuinfo flag, its name, and the GEMMs of CPU builds that take it.
_PRODUCTS = (("amx_bf16", "AMX-BF16", "bf16 GEMMs with K a multiple of 32"),
             ("amx_int8", "AMX-INT8", "int8 GEMMs with K a multiple of 64 and 16+ rows"))


def linux_grants_tiles() -> bool:
    """Ask Linux for the tile state for this process, as the kernels do (harmless to ask again). Only on x86-64:
    elsewhere the syscall number is another call's."""
    if machine() != "x86_64":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def tile_unit_report(flags: frozenset[str] | None, isa: str, granted: Callable[[], bool] = linux_grants_tiles) -> str:
    """What the tile unit does for builds of `isa` on a CPU with `flags` (None: no /proc/cpuinfo)."""
    products = [(name, use) for flag, name, use in _PRODUCTS if flag in (flags or ())]
    if flags is None or "amx_tile" not in flags or not products:
        return "none on this CPU (the vector paths run)"
    have = ", ".join(name for name, _ in products)
    if not isa.startswith("native"):
        return f"{have} on this CPU, left out by the build ISA {isa} (RLX_CPU_TARGET=native takes it)"
    if not granted():
        return f"{have} on this CPU, refused by Linux (arch_prctl): the vector paths run"
    return f"{have}, granted: {' and '.join(use for _, use in products)} multiply on it"
