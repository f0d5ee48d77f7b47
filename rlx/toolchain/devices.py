"""What this machine can run: `rlx.devices()` (the seeds' `hwinfo`).

The CPU: its architecture, model, logical cores and the instruction-set features RLX's CPU code uses
(`/proc/cpuinfo`; the x86-64 levels they add up to). Each NVIDIA GPU: its name, arch (sm_XY) and
memory, from `nvidia-smi`, or from the CUDA driver (`libcuda`) where nvidia-smi is missing. Metal
devices on macOS, through PyObjC's Metal bindings where installed. Nothing here builds or loads
RLX code; `rlxc doctor` reports the toolchains.

>>> d = devices()
>>> d.cpu.cores >= 1 and "cpu" in d.targets()
True
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rlx.toolchain.isa import cpu_flags, machine

#: The CPU features RLX's kernels and build levels care about, in the order they are listed.
CPU_FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimddp", "fphp",
                "bf16", "i8mm", "sve", "sve2")
#: The x86-64 micro-architecture levels (`RLX_CPU_TARGET`), by the flags each needs beyond the previous one.
X86_LEVELS = (("x86-64-v2", ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")),
              ("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave")),
              ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")))
_PROBE_TIMEOUT = 10.0


@dataclass(frozen=True)
class CpuDevice:
    """The host CPU."""

    arch: str
    model: str
    cores: int
    features: tuple[str, ...]
    #: The highest x86-64 level every flag of which is present ("" off x86-64 or without /proc/cpuinfo).
    level: str


@dataclass(frozen=True)
class GpuDevice:
    """One NVIDIA GPU."""

    index: int
    name: str
    arch: str
    memory_bytes: int
    #: free memory when asked (None where the source does not say)
    free_bytes: int | None
    #: "nvidia-smi" or "cuda-driver"
    source: str


@dataclass(frozen=True)
class MetalDevice:
    """One Metal device (an Apple GPU)."""

    name: str
    #: the working-set size Metal recommends (about the memory a program may use)
    memory_bytes: int


@dataclass(frozen=True)
class Devices:
    """Everything `devices()` found; `targets()` names the `rlxc --target`s that can run here."""

    cpu: CpuDevice
    gpus: tuple[GpuDevice, ...]
    metal: tuple[MetalDevice, ...]

    def targets(self) -> list[str]:
        return ["cpu", *sorted({f"cuda:{g.arch}" for g in self.gpus}), *(["metal"] if self.metal else [])]

    def __str__(self) -> str:
        c = self.cpu
        lines = [f"cpu    {c.arch}, {c.model or 'unknown model'}, {c.cores} logical cores"
                 + (f", {c.level}" if c.level else "") + (f": {' '.join(c.features)}" if c.features else "")]
        for g in self.gpus:
            free = f", {g.free_bytes / 2**30:.1f} GiB free" if g.free_bytes is not None else ""
            lines.append(f"gpu {g.index}  {g.name} ({g.arch}), {g.memory_bytes / 2**30:.1f} GiB{free} [{g.source}]")
        lines += [f"metal  {m.name}, {m.memory_bytes / 2**30:.1f} GiB working set" for m in self.metal]
        if not self.gpus:
            lines.append("gpu    none found (no nvidia-smi GPU, no CUDA driver device)")
        lines.append(f"targets: {', '.join(self.targets())}")
        return "\n".join(lines)


def cpu_device(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuDevice:
    """The CPU, from `cpuinfo` where it exists."""
    flags = cpu_flags(cpuinfo) or frozenset()
    model = ""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("model name", "cpu model", "hardware"):
                model = value.strip()
                break
    except OSError:
        model = platform.processor()
    level = ""
    if machine() == "x86_64" and flags:
        level = "x86-64"
        for name, needs in X86_LEVELS:
            if not set(needs) <= flags:
                break
            level = name
    return CpuDevice(machine(), model, os.cpu_count() or 1, tuple(f for f in CPU_FEATURES if f in flags), level)


def _mib(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) << 20 if text.replace(".", "", 1).isdigit() else None


def gpus_from_nvidia_smi(smi: str | None = None) -> tuple[GpuDevice, ...] | None:
    """Every GPU nvidia-smi lists (None where there is no nvidia-smi or it fails)."""
    smi = smi or shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = "index,name,compute_cap,memory.total,memory.free"
    try:
        proc = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=_PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    found = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        major, _, minor = parts[2].partition(".")
        if not (major.isdigit() and minor.isdigit()):
            continue
        found.append(GpuDevice(int(parts[0]), parts[1], f"sm_{major}{minor}", _mib(parts[3]) or 0, _mib(parts[4]),
                               "nvidia-smi"))
    return tuple(found)


def gpus_from_driver(lib: object | None = None) -> tuple[GpuDevice, ...]:
    """Every GPU the CUDA driver sees (`lib`: libcuda, loaded here when None); () without a driver."""
    if lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1" if platform.system() == "Linux" else "nvcuda.dll")
        except OSError:
            return ()
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()
    found = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        major, minor, total = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_size_t(0)
        if (lib.cuDeviceGet(ctypes.byref(dev), i) != 0 or lib.cuDeviceGetName(name, 256, dev) != 0
                or lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) != 0  # COMPUTE_CAPABILITY_MAJOR
                or lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) != 0  # COMPUTE_CAPABILITY_MINOR
                or lib.cuDeviceTotalMem_v2(ctypes.byref(total), dev) != 0):
            continue
        found.append(GpuDevice(i, name.value.decode(errors="replace"), f"sm_{major.value}{minor.value}", total.value,
                               None, "cuda-driver"))
    return tuple(found)


def metal_devices() -> tuple[MetalDevice, ...]:
    """The Metal devices (macOS with PyObjC's Metal bindings; () elsewhere)."""
    if platform.system() != "Darwin":
        return ()
    try:
        import Metal  # type: ignore[import-not-found]
    except ImportError:
        return ()
    return tuple(MetalDevice(str(d.name()), int(d.recommendedMaxWorkingSetSize())) for d in Metal.MTLCopyAllDevices())


def devices() -> Devices:
    """What this machine can run RLX programs on (CPU, NVIDIA GPUs, Metal devices)."""
    gpus = gpus_from_nvidia_smi()
    return Devices(cpu_device(), gpus if gpus is not None else gpus_from_driver(), metal_devices())
