"""Where one MiniLM call's time goes on the GPU: the CUPTI timeline of one `bind_device` call (a diagnostic, no peers).

    python benchmarks/minilm_timeline.py [--case 1x16] [--precision f16] [--variants rlx,rlx_nopdl] [--calls 50]

For each build (the default one and the `benchmarks/minilm_cuda.py` VARIANTS named), profiles `--calls` calls
with torch.profiler (CUPTI) and prints, for the call whose GPU span is the median: every kernel and copy in
order with its start (µs after the call's first GPU activity), its duration, and the gap since the previous
activity ended (negative: it overlapped, e.g. a PDL kernel waiting); then the span, the sum of own durations, and
the host wall time per call (median over the same calls, without the profiler). With PDL a kernel's duration
includes its wait for the kernel before, so read gaps and the span there, not the sum.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from minilm_cuda import MINILM, VARIANTS, token_batch, variant_lir

from rlx.models.bert import bert_inputs, build_bert, random_weights


def _calls(trace: dict, n: int) -> list[list[dict]]:
    """The GPU activities (kernels, copies, memsets) of the trace, split into `n` calls at the largest gaps."""
    acts = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                   and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if not acts:
        return []
    gaps = sorted(range(1, len(acts)), key=lambda i: acts[i]["ts"] - (acts[i - 1]["ts"] + acts[i - 1]["dur"]))
    cuts = sorted(gaps[-(n - 1):]) if n > 1 else []
    out, start = [], 0
    for c in cuts:
        out.append(acts[start:c])
        start = c
    out.append(acts[start:])
    return out


def timeline(fn, calls: int) -> tuple[float, list[dict]]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            time.sleep(200e-6)  # a clear gap between calls
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    per_call = [c for c in _calls(trace, calls) if c]
    spans = [c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"] for c in per_call]
    mid = sorted(range(len(spans)), key=lambda i: spans[i])[len(spans) // 2]
    return spans[mid], per_call[mid]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="1x16")
    ap.add_argument("--precision", default="f16")
    ap.add_argument("--variants", default="rlx,rlx_nopdl")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()

    import torch

    from rlx.config import Config
    from rlx.driver import Device, Session
    from rlx.pipeline.cuda import compile_cuda

    batch, seq = (int(v) for v in args.case.split("x"))
    graph = build_bert(MINILM, max_batch=max(batch, 8), max_seq=max(seq, 128), output="embeddings")
    weights = random_weights(MINILM, seed=0, scale=0.05)
    ids, mask = token_batch(batch, seq, MINILM.vocab_size)
    dev = torch.device("cuda")
    dfeed = {k: torch.from_numpy(v).to(dev) for k, v in bert_inputs(ids, mask).items()}
    lir = Session(Device.CUDA).lower(graph)
    print(f"device: {torch.cuda.get_device_name(0)}  case {args.case} {args.precision}")
    for name in args.variants.split(","):
        vlir, options = (lir, {}) if name == "rlx" else variant_lir(graph, VARIANTS[name])
        cg = compile_cuda(vlir, Config.from_env(), precision=args.precision, **options)
        for k, v in weights.items():
            cg.set_param(k, v)
        out = torch.empty((batch, MINILM.hidden_size), dtype=torch.float32, device=dev)
        fn = cg.bind_device(dfeed, outputs={"embeddings": out})
        for _ in range(20):
            fn()
        walls = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t0)
        span, acts = timeline(fn, args.calls)
        own = sum(a["dur"] for a in acts)
        print(f"--- {name}: wall {statistics.median(walls) * 1e3:.3f} ms/call, GPU span {span:.1f} us, "
              f"{len(acts)} activities, own durations {own:.1f} us")
        t0, end = acts[0]["ts"], acts[0]["ts"]
        for a in acts:
            gap = a["ts"] - end
            print(f"    {a['ts'] - t0:8.1f} {a['dur']:7.1f} {gap:+7.1f}  {a['name'][:100]}")
            end = max(end, a["ts"] + a["dur"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
