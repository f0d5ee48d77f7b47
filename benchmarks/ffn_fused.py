"""MiniLM's FFN in one kernel (the intermediate kept on chip) against the two-GEMM forms, on one GPU.

    python benchmarks/ffn_fused.py [--rows 16384] [--rounds 5] [--iters 50]

Builds `benchmarks/ffn_fused.cu` (nvcc, `templates/cuda/kernels/ffn_fused.cuh` and `gemm_mma.cuh`) into a scratch
library and times, on MiniLM's FFN (hidden 384, intermediate 1536, f16; `--rows` = batch x sequence, 16384 for
128 x 128), Y = gelu(X W1 + b1) W2 + b2 as:

| peer | what |
| --- | --- |
| `fused_bi128` / `fused_bi64` | `rlx_ffn_fused`: a block 64 rows, the intermediate in chunks of 128 / 64 columns |
| `mma_two` | two `rlx_gemm_mma` launches (FFN1 + bias + erf GELU in its epilogue, FFN2 + bias): the same sums |
| `torch_gelu` | `torch.addmm` (cuBLASLt, bias fused), exact `F.gelu`, `torch.addmm`: three kernels |
| `torch_gemms` | the two `torch.mm` products alone: the floor of any two-GEMM form (no bias, no GELU) |

Time per call is the sum of kernel durations CUPTI records over `--iters` calls (benchmarks/minilm_cuda.kernel_ms),
medians over `--rounds`, the peers alternating. Checks printed beside the times: `fused_*` against `mma_two`
(elements that differ: 0 expected, the same f32 sums in the same order), and every peer's largest absolute
difference from torch's f32 form of the same f16 operands. Timings only: nothing asserts.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilm_cuda import kernel_ms  # benchmarks/minilm_cuda.py

from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import run_compiler
from rlx.toolchain.cuda import detect_nvcc_toolchain

HIDDEN, INTER = 384, 1536
HERE = Path(__file__).resolve().parent


def build(workdir: Path) -> ctypes.CDLL:
    nvcc = detect_nvcc_toolchain()
    src, lib = HERE / "ffn_fused.cu", workdir / "ffn_fused.so"
    cmd = [nvcc.nvcc, "-O3", "-std=c++17", f"-arch={nvcc.arch}", f"-I{templates_dir() / 'cuda' / 'kernels'}",
           "-Xcompiler", "-fPIC", "-shared", "-o", str(lib), str(src)]
    t0 = time.perf_counter()
    run_compiler(cmd, src, lib, "nvcc", timeout=600)
    print(f"built {lib.name} in {time.perf_counter() - t0:.1f} s ({nvcc.arch})")
    dll = ctypes.CDLL(str(lib))
    vp, ll = ctypes.c_void_p, ctypes.c_longlong
    for name in ("ffn_fused_bi128", "ffn_fused_bi64"):
        getattr(dll, name).argtypes = [vp] * 6 + [ll, ll, vp]
        getattr(dll, name).restype = ctypes.c_int
    dll.ffn_mma_two.argtypes = [vp] * 7 + [ll, ll, vp]
    dll.ffn_mma_two.restype = ctypes.c_int
    dll.ffn_smem_bytes.argtypes = [ctypes.c_int]
    return dll


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    m = args.rows
    with tempfile.TemporaryDirectory() as tmp:
        dll = build(Path(tmp))
        gen = torch.Generator(device="cuda").manual_seed(7)
        x = torch.randn(m, HIDDEN, device="cuda", generator=gen).half()
        w1 = (torch.randn(HIDDEN, INTER, device="cuda", generator=gen) / HIDDEN ** 0.5).half()
        b1 = (0.1 * torch.randn(INTER, device="cuda", generator=gen)).half()
        w2 = (torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / INTER ** 0.5).half()
        b2 = (0.1 * torch.randn(HIDDEN, device="cuda", generator=gen)).half()
        h = torch.empty(m, INTER, device="cuda", dtype=torch.half)
        outs = {p: torch.empty(m, HIDDEN, device="cuda", dtype=torch.half)
                for p in ("fused_bi128", "fused_bi64", "mma_two")}
        stream = torch.cuda.current_stream().cuda_stream
        ptr = lambda t: t.data_ptr()  # noqa: E731

        def fused(name: str):
            fn = getattr(dll, f"ffn_{name}")

            def call() -> None:
                if fn(ptr(x), ptr(w1), ptr(b1), ptr(w2), ptr(b2), ptr(outs[name]), m, INTER, stream):
                    raise SystemExit(f"{name}: launch failed")
            return call

        def mma_two() -> None:
            if dll.ffn_mma_two(ptr(x), ptr(w1), ptr(b1), ptr(w2), ptr(b2), ptr(h), ptr(outs["mma_two"]), m, INTER,
                               stream):
                raise SystemExit("mma_two: launch failed")

        def torch_gelu() -> None:
            outs["torch_gelu"] = torch.addmm(b2, F.gelu(torch.addmm(b1, x, w1)), w2)

        def torch_gemms() -> None:
            outs["torch_gemms"] = torch.mm(torch.mm(x, w1), w2)

        peers = {"fused_bi128": fused("fused_bi128"), "fused_bi64": fused("fused_bi64"), "mma_two": mma_two,
                 "torch_gelu": torch_gelu, "torch_gemms": torch_gemms}
        for fn in peers.values():
            fn()
        torch.cuda.synchronize()
        want = (F.gelu(x.float() @ w1.float() + b1.float()).half().float() @ w2.float()) + b2.float()
        samples: dict[str, list[float]] = {p: [] for p in peers}
        for _ in range(args.rounds):
            for p, fn in peers.items():
                time.sleep(0.2)
                samples[p].append(kernel_ms(fn, args.iters)[0] * 1e3)
        flop = 4.0 * m * HIDDEN * INTER
        base = statistics.median(samples["mma_two"])
        smem = {p: dll.ffn_smem_bytes(int(p[len("fused_bi"):])) for p in peers if p.startswith("fused")}
        print(f"FFN {m} x {HIDDEN} -> {INTER} -> {HIDDEN}, f16, {torch.cuda.get_device_name()}; "
              f"{args.iters} calls x {args.rounds} rounds, CUPTI kernel time (medians)")
        print("| peer | us | TFLOP/s | x mma_two | elements != mma_two | max abs err vs f32 |")
        print("|---|---|---|---|---|---|")
        for p, s in samples.items():
            us = statistics.median(s)
            diff = (str(int((outs[p] != outs["mma_two"]).sum().item())) if p.startswith("fused") else "-")
            err = (outs[p].float() - want).abs().max().item() if p != "torch_gemms" else float("nan")
            extra = f" ({smem[p] // 1024} KiB smem)" if p in smem else ""
            print(f"| {p}{extra} | {us:.1f} | {flop / us / 1e6:.0f} | {us / base:.2f} | {diff} | {err:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
