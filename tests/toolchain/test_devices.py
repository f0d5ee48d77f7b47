"""rlx.devices() (rlx/toolchain/devices.py): the CPU from /proc/cpuinfo, GPUs from nvidia-smi or the CUDA driver."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import rlx
from rlx.toolchain.devices import Devices, GpuDevice, cpu_device, gpus_from_driver, gpus_from_nvidia_smi


def test_cpu_features_and_level_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    v3 = "fpu cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3 avx avx2 bmi1 bmi2 f16c fma movbe xsave"
    info.write_text(f"processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: {v3} avx512f\n")
    cpu = cpu_device(info)
    assert cpu.model == "Test CPU 9000"
    assert cpu.features == ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f")
    if cpu.arch == "x86_64":
        assert cpu.level == "x86-64-v3"  # avx512f alone is not v4 (bw, cd, dq, vl missing)


def test_gpus_from_nvidia_smi(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, 9.0, 81559, 80000'\n"
                   "echo '1, NVIDIA A10, 8.6, 23028, [N/A]'\n")
    smi.chmod(0o755)
    gpus = gpus_from_nvidia_smi(str(smi))
    assert gpus == (GpuDevice(0, "NVIDIA H100 80GB HBM3", "sm_90", 81559 << 20, 80000 << 20, "nvidia-smi"),
                    GpuDevice(1, "NVIDIA A10", "sm_86", 23028 << 20, None, "nvidia-smi"))
    failing = tmp_path / "broken-smi"
    failing.write_text("#!/bin/sh\nexit 9\n")
    failing.chmod(0o755)
    assert gpus_from_nvidia_smi(str(failing)) is None


class _FakeDriver:
    """The five libcuda entry points devices() calls, for one sm_89 GPU with 24 GiB."""

    def cuInit(self, flags: int) -> int:
        return 0

    def cuDeviceGetCount(self, count) -> int:
        count._obj.value = 1
        return 0

    def cuDeviceGet(self, dev, i: int) -> int:
        dev._obj.value = i
        return 0

    def cuDeviceGetName(self, buf, size: int, dev) -> int:
        ctypes.memmove(buf, b"Fake RTX\0", 9)
        return 0

    def cuDeviceGetAttribute(self, out, attr: int, dev) -> int:
        out._obj.value = {75: 8, 76: 9}[attr]
        return 0

    def cuDeviceTotalMem_v2(self, total, dev) -> int:
        total._obj.value = 24 << 30
        return 0


def test_gpus_from_the_cuda_driver() -> None:
    assert gpus_from_driver(_FakeDriver()) == (GpuDevice(0, "Fake RTX", "sm_89", 24 << 30, None, "cuda-driver"),)


def test_devices_here_and_the_cli(tmp_path: Path) -> None:
    found = rlx.devices()
    assert isinstance(found, Devices) and found.cpu.cores >= 1
    assert found.targets() == ["cpu", *sorted({f"cuda:{g.arch}" for g in found.gpus}),
                               *(["metal"] if found.metal else [])]
    text = str(found)
    assert text.startswith(f"cpu    {found.cpu.arch}") and "targets: cpu" in text
    proc = subprocess.run([sys.executable, "-m", "rlx.cli", "devices", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert '"targets": [' in proc.stdout and '"cores"' in proc.stdout
