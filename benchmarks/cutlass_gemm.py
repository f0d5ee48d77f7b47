"""The CUTLASS sm90 GEMM unit alone on an H100: what its epilogue's erf GELU costs, against cuBLASLt.

    python benchmarks/cutlass_gemm.py [--shapes 16384x1536x384,1024x1536x384] [--rounds 5] [--iters 50]

Compiles `templates/cuda/kernels/gemm_cutlass.cu` (f16) three ways, each at both tiles, into one scratch
library (nvcc, in parallel: about a minute), and calls the launchers on torch's tensors:

| peer | what |
| --- | --- |
| `gelu` | the unit as programs call it: bias + rlx_gelu_erfc (gelu_erfc.cuh: a polynomial and one ex2) |
| `gelu_libm` | bias + CUTLASS's thread::GELU (libm erff): the unit before gelu_erfc.cuh |
| `bias` | bias only: the floor of this kernel's epilogue |
| `cublaslt_bias` | `torch.addmm` (cuBLASLt, bias in its epilogue, no activation) |
| `cublaslt_gelu` | `torch.addmm` then `F.gelu` (exact): what runs without the unit |

The tile is the one programs pick (gemm_call in ops.cu.j2): 256 rows when those tiles cover the GPU twice,
else 128. Time per call is the sum of kernel durations CUPTI records (benchmarks/minilm_cuda.kernel_ms) over
`--iters` calls; medians over `--rounds`, the peers alternating. Every output is checked against torch's f32
GELU of the f32 product of the same f16 operands: `max err` is the largest absolute difference.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilm_cuda import kernel_ms  # benchmarks/minilm_cuda.py (a script's own folder is on sys.path)

from rlx.toolchain.compiler import run_compiler
from rlx.toolchain.cuda import detect_nvcc_toolchain
from rlx.toolchain.cuda_units import ACTIVATIONS, CutlassUnitToolchain, cutlass_for, cutlass_status, unit_path

#: peer -> (RLX_CUTLASS_ACT, extra defines); the ids of templates/activations.toml
VARIANTS = {"gelu": (ACTIVATIONS["gelu"], ()), "gelu_libm": (ACTIVATIONS["gelu"], ("-DRLX_CUTLASS_GELU_LIBM=1",)),
            "bias": (0, ())}
TILES = (128, 256)
SM_COUNT_TILES = 2  # a 256-row tile only when the grid covers the GPU this many times


def _flags(unit: CutlassUnitToolchain, act: int, extra: tuple[str, ...], fn: str) -> list[str]:
    keep = [f for f in unit.object_flags if not f.startswith(("-DRLX_CUTLASS_ACT=", "-DRLX_CUTLASS_FN="))]
    return [*keep, f"-DRLX_CUTLASS_ACT={act}", f"-DRLX_CUTLASS_FN={fn}", *extra]


def build_library(workdir: Path) -> ctypes.CDLL:
    """Every (variant, tile) launcher, as `bench_<variant>_m<tile>`, in one shared library."""
    nvcc = detect_nvcc_toolchain()
    cutlass = cutlass_for()
    why = cutlass_status(nvcc, cutlass)
    if why:
        raise SystemExit(f"cannot build the CUTLASS unit: {why}")
    jobs = []
    for name, (act, extra) in VARIANTS.items():
        for tile in TILES:
            unit = CutlassUnitToolchain(nvcc, cutlass, "f16", "gelu", tile)
            fn = f"bench_{name}_m{tile}"
            out = workdir / f"{fn}.o"
            cmd = [nvcc.nvcc, *_flags(unit, act, extra, fn), "-Xcompiler", "-fvisibility=default", "-c", "-o",
                   str(out), str(unit_path())]
            jobs.append((cmd, out))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for f in [pool.submit(run_compiler, cmd, unit_path(), out, "nvcc", timeout=1800) for cmd, out in jobs]:
            f.result()
    lib = workdir / "bench_cutlass.so"
    run_compiler([nvcc.nvcc, "-shared", "-o", str(lib), *(str(o) for _, o in jobs), "-lcudart", "-lcuda"],
                 unit_path(), lib, "nvcc", timeout=600)
    print(f"built {len(jobs)} unit objects in {time.perf_counter() - t0:.1f} s")
    dll = ctypes.CDLL(str(lib))
    for name in VARIANTS:
        for tile in TILES:
            f = getattr(dll, f"bench_{name}_m{tile}")
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_longlong] * 3 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                                 ctypes.c_void_p, ctypes.c_char_p,
                                                                                 ctypes.c_size_t]
    return dll


def bench_shape(dll: ctypes.CDLL, m: int, n: int, k: int, rounds: int, iters: int) -> None:
    """Time every peer on one product and print its rows of the table."""
    import torch
    import torch.nn.functional as F

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = (torch.randn(m, k, device="cuda", generator=gen) * 0.5).half()
    b = (torch.randn(k, n, device="cuda", generator=gen) / k ** 0.5 * 2).half()
    bias = torch.randn(n, device="cuda", generator=gen).half()
    product = a.float() @ b.float() + bias.float()
    want = F.gelu(product)
    tile = 256 if ((m + 255) // 256) * ((n + 127) // 128) >= SM_COUNT_TILES * sms else 128
    stream = torch.cuda.current_stream().cuda_stream
    err = ctypes.create_string_buffer(512)
    outs = {p: torch.empty(m, n, device="cuda", dtype=torch.half) for p in (*VARIANTS, "cublaslt_bias")}

    def unit(name: str):
        fn = getattr(dll, f"bench_{name}_m{tile}")
        out = outs[name]

        def call() -> None:
            if fn(a.data_ptr(), b.data_ptr(), bias.data_ptr(), out.data_ptr(), m, n, k, None, 0, stream, err,
                  len(err)):
                raise SystemExit(err.value.decode())
        return call

    def cublaslt_gelu() -> None:
        outs["cublaslt_gelu"] = F.gelu(torch.addmm(bias, a, b))

    peers = {name: unit(name) for name in VARIANTS}
    peers["cublaslt_bias"] = lambda: torch.addmm(bias, a, b, out=outs["cublaslt_bias"])
    peers["cublaslt_gelu"] = cublaslt_gelu
    samples: dict[str, list[float]] = {p: [] for p in peers}
    for fn in peers.values():
        fn()
    for _ in range(rounds):
        for p, fn in peers.items():
            time.sleep(0.2)
            samples[p].append(kernel_ms(fn, iters)[0] * 1e3)
    flop = 2.0 * m * n * k
    base = statistics.median(samples["gelu"])
    for p, s in samples.items():
        us = statistics.median(s)
        e = (outs[p].float() - (want if "gelu" in p else product)).abs().max().item()
        t = tile if p in VARIANTS else "-"
        print(f"| {m}x{n}x{k} | {p} | {t} | {us:.1f} | {flop / us / 1e6:.0f} | {us / base:.2f} | {e:.3g} |")


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="16384x1536x384,1024x1536x384", help="MxNxK, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="rlx-cutlass-bench-") as tmp:
        dll = build_library(Path(tmp))
        print("| M x N x K | peer | tile | kernel us | TFLOP/s | x gelu | max err |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for shape in args.shapes.split(","):
            m, n, k = (int(v) for v in shape.split("x"))
            bench_shape(dll, m, n, k, args.rounds, args.iters)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
