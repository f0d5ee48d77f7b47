"""CPU instruction-set requirements of a built library, and whether this CPU meets them.

An artifact records the CPU features its code may use: for an ISA level
(`x86-64-v3`) the features that level guarantees; for `-march=native` the
code-generation-relevant features of the CPU that built it. Before loading,
`check_cpu` compares them with this CPU's `/proc/cpuinfo` flags, so running an
AVX-512 build on an AVX2 machine is a clear `ArtifactError`, not SIGILL.

Feature names are the Linux `/proc/cpuinfo` spellings (`pni` is SSE3, `abm`
is LZCNT).

>>> required_features("x86-64-v2", arch="x86_64")
('cx16', 'lahf_lm', 'pni', 'popcnt', 'sse', 'sse2', 'sse4_1', 'sse4_2', 'ssse3')
>>> missing_features(("avx2", "fma"), {"avx2", "sse2"})
('fma',)
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from pathlib import Path

from rlx.errors import ArtifactError

_V1 = ("sse", "sse2")
_V2 = (*_V1, "cx16", "lahf_lm", "pni", "popcnt", "sse4_1", "sse4_2", "ssse3")
_V3 = (*_V2, "abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave")
_V4 = (*_V3, "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")

#: The x86-64 psABI micro-architecture levels, as /proc/cpuinfo flags.
X86_LEVELS: dict[str, tuple[str, ...]] = {
    "x86-64": _V1, "x86-64-v1": _V1, "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4,
}

#: x86 flags a compiler may emit instructions for under -march=native (others, like `vmx`, never matter).
X86_CODEGEN_FLAGS = frozenset({
    *_V4, "sse4a", "adx", "aes", "pclmulqdq", "sha_ni", "rdrand", "rdseed", "gfni", "vaes", "vpclmulqdq",
    "avx_vnni", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq",
    "avx512_bf16", "avx512_fp16", "avx512_vp2intersect", "amx_tile", "amx_int8", "amx_bf16", "xsaveopt", "xsavec",
    "clflushopt", "clwb", "movdiri", "movdir64b", "serialize", "waitpkg", "fsgsbase", "prefetchw",
})

#: aarch64 `Features` a compiler may use under -mcpu=native.
ARM_CODEGEN_FLAGS = frozenset({
    "fp", "asimd", "fphp", "asimdhp", "asimddp", "asimdfhm", "asimdrdm", "atomics", "crc32", "aes", "pmull",
    "sha1", "sha2", "sha3", "sha512", "sve", "sve2", "i8mm", "bf16", "svei8mm", "svebf16", "sm4", "dcpop",
})


def machine() -> str:
    """This machine's architecture, normalized (`x86_64`, `aarch64`, ...)."""
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """This CPU's feature flags from /proc/cpuinfo, or None where that file does not exist."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


def required_features(cpu_target: str, *, arch: str | None = None,
                      build_flags: Iterable[str] | None = None) -> tuple[str, ...]:
    """The CPU features code built for `cpu_target` may use (sorted).

    `cpu_target` is an x86-64 level, or `native` (then `build_flags`, the
    building CPU's flags, default: this CPU's, are filtered to those a
    compiler can emit code for). Other targets (`generic`, a named CPU the
    table does not know) need nothing beyond the architecture.
    """
    arch = arch or machine()
    if cpu_target in X86_LEVELS:
        if arch != "x86_64":
            raise ArtifactError(f"CPU target {cpu_target!r} is an x86-64 level but this machine is {arch}")
        return tuple(sorted(X86_LEVELS[cpu_target]))
    if cpu_target == "native":
        flags = cpu_flags() if build_flags is None else frozenset(build_flags)
        relevant = X86_CODEGEN_FLAGS if arch == "x86_64" else ARM_CODEGEN_FLAGS if arch == "aarch64" else frozenset()
        return tuple(sorted(frozenset(flags or ()) & relevant))
    return ()


def missing_features(required: Iterable[str], available: Iterable[str]) -> tuple[str, ...]:
    """The required features `available` lacks, sorted."""
    return tuple(sorted(set(required) - set(available)))


def check_cpu(isa: dict, what: str = "artifact") -> None:
    """Raise ArtifactError unless this machine can run code described by `isa`.

    `isa` is the manifest's record: {"arch": ..., "cpu_target": ..., "features": [...]}.
    """
    want_arch = isa.get("arch")
    here = machine()
    if want_arch and want_arch != here:
        raise ArtifactError(f"{what} was built for {want_arch}; this machine is {here}")
    features = isa.get("features") or ()
    if not features:
        return
    flags = cpu_flags()
    if flags is None:
        return  # no /proc/cpuinfo (not Linux): nothing to compare against, trust the user
    lacking = missing_features(features, flags)
    if lacking:
        target = isa.get("cpu_target", "?")
        raise ArtifactError(
            f"{what} was built for CPU target {target!r} and uses {', '.join(lacking)}, which this CPU lacks; "
            "rebuild it on this machine (rlxc compile) or build it with RLX_CPU_TARGET set to a level both CPUs "
            "support (e.g. x86-64-v2)")


def describe(cpu_target: str) -> dict:
    """The ISA record an artifact stores for code built for `cpu_target` on this machine."""
    return {"arch": machine(), "cpu_target": cpu_target, "features": list(required_features(cpu_target))}
