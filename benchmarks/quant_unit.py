"""The quantized-matmul kernel unit against the kernels inlined into a program: decode GEMV time per weight.

    python benchmarks/quant_unit.py [--rounds 7] [--runs 3]

Until the kernels became the kernel unit `templates/cpu/kernels/quant.c`, every quantized matmul of a
program inlined them with its sizes as constants; now a program calls the unit's per-format entry points
(compiled once per toolchain, sizes at run time). `benchmarks/quant_unit.c` times both on SmolLM2-135M's
q4_1 shapes with this machine's RLX flags (the toolchain's object flags, this CPU's ISA), one thread,
thread CPU time: a ratio unit/inline near 1.00 means the unit costs decode nothing. Timings only:
nothing asserts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import detect_toolchain

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="timed passes per case (the best is printed)")
    ap.add_argument("--runs", type=int, default=3, help="times the whole comparison is repeated")
    args = ap.parse_args()
    tc = detect_toolchain()
    flags = [*tc.object_flags, f"-I{templates_dir() / 'cpu'}"]
    with tempfile.TemporaryDirectory() as tmp:
        unit, exe = Path(tmp) / "quant.o", Path(tmp) / "quant_unit"
        subprocess.run([tc.cc, *flags, "-c", "-o", str(unit), str(templates_dir() / "cpu" / "kernels" / "quant.c")],
                       check=True)
        subprocess.run([tc.cc, *flags, "-o", str(exe), str(HERE / "quant_unit.c"), str(unit), "-lm"], check=True)
        print(f"{tc.cc} {' '.join(tc.isa_flags)}")
        for _ in range(args.runs):
            out = subprocess.run([str(exe), str(args.rounds)], check=True, capture_output=True, text=True).stdout
            print(out, end="")


if __name__ == "__main__":
    main()
