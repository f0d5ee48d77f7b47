"""SSM layers forward: rlx vs JAX (jit) vs PyTorch (eager, torch.compile) vs numpy, where installed; CPU or GPU.

    python benchmarks/ssm.py [--threads N] [--rounds R] [--quick]
    python benchmarks/ssm.py --device cuda [--rounds R] [--quick]

Two ops, float32, the same data for every peer, all in this one process:

- selective_scan (Mamba S6): x, delta [b, s, h], A [h, n], B, C [b, s, n].
- gated_delta_net (Qwen3-Next / Kimi-Linear): q, k, v [b, s, h, n], g, beta [b, s, h];
  s = 1 is the decode step.
- a training step of the Mamba-style classifier of `rlx.examples.train` (in-projection,
  causal conv, selective scan, pooling, cross-entropy, gradients and an Adam update): rlx's
  one compiled step graph (`rlx.grad`, the scan differentiated as a reverse loop) vs the same
  model in JAX (`jax.value_and_grad` + Adam, one `jit`); the first step's losses are compared.

The peers implement the same recurrence the way their users write it without a custom
kernel: JAX with `jax.lax.scan` under `jit`; PyTorch with a Python loop over time (eager, and
`torch.compile`d); numpy with a loop over time vectorized over batch and heads. rlx is the
compiled `selective_scan` / `gated_delta_net` op (kernels/ssm.h). Every peer's output is
checked against rlx's before timing.

Peers run round-robin (one timed sample of each per round) with a pause before each sample,
so background load hits them alike; the median is reported with the ratio to rlx
(x > 1: the peer is slower). `--threads` pins rlx, JAX (XLA's intra-op pool) and torch alike.

`--device cuda` runs the same ops on an NVIDIA GPU, every peer on device-resident float32 data (no
TF32 anywhere): rlx's CUDA kernels (kernels/ssm.cuh: the chunked selective scan for prefill, one warp
per (row, channel) for decode; the gated delta rule one warp per state column), called through
`bind_device` on torch tensors (one C call replaying a captured CUDA graph); PyTorch eager and
`torch.compile` (the step function compiled, driven by a Python loop over time: compiling the whole
loop unrolls thousands of steps); JAX `lax.scan` under `jit`. Each call is timed to completion (torch
synchronizes, JAX blocks, rlx returns once its stream has finished); rlx is checked against the numpy
loop, the peers against rlx. Where `fla-core` (flash-linear-attention's kernels: pure Python and
Triton, so its wheel travels to an offline GPU machine) imports, its hand-written Triton kernels join
the gated delta rule: `chunk_gated_delta_rule` for prefill, `fused_recurrent_gated_delta_rule` for a
decode step (they multiply in tf32, so they are checked against rlx to 2e-2, the error printed).
mamba-ssm's `selective_scan_fn` is not a peer: its CUDA extension only builds from source.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)

SETTLE_SECONDS = 0.2


def round_robin(peers: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    return timing.round_robin(peers, rounds, SETTLE_SECONDS)


# ── numpy peers ─────────────────────────────────────────────────────────


def ssm_numpy(x, dt, a, b, c):
    bsz, s, h = x.shape
    st = np.zeros((bsz, h, a.shape[1]), np.float32)
    y = np.empty_like(x)
    for t in range(s):
        d = dt[:, t, :, None]
        st = np.exp(d * a) * st + d * x[:, t, :, None] * b[:, t, None, :]
        y[:, t] = np.einsum("bhn,bn->bh", st, c[:, t])
    return y


def gdn_numpy(q, k, v, g, beta, scale):
    bsz, s, h, n = q.shape
    st = np.zeros((bsz, h, n, n), np.float32)
    o = np.empty_like(q)
    for t in range(s):
        st = st * np.exp(g[:, t])[..., None, None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhij,bhi->bhj", st, kt))
        st = st + kt[..., :, None] * u[..., None, :]
        o[:, t] = np.einsum("bhij,bhi->bhj", st, q[:, t] * scale)
    return o


# ── JAX peers ───────────────────────────────────────────────────────────


def jax_peers(jax):
    jnp = jax.numpy

    @jax.jit
    def ssm(x, dt, a, b, c):
        def step(st, inp):
            xt, dtt, bt, ct = inp
            st = jnp.exp(dtt[..., None] * a) * st + (dtt * xt)[..., None] * bt[:, None, :]
            return st, jnp.einsum("bhn,bn->bh", st, ct)

        st0 = jnp.zeros((x.shape[0], x.shape[2], a.shape[1]), x.dtype)
        _, ys = jax.lax.scan(step, st0, (x.swapaxes(0, 1), dt.swapaxes(0, 1), b.swapaxes(0, 1), c.swapaxes(0, 1)))
        return ys.swapaxes(0, 1)

    @jax.jit
    def gdn(q, k, v, g, beta):
        scale = q.shape[-1] ** -0.5

        def step(st, inp):
            qt, kt, vt, gt, bt = inp
            st = st * jnp.exp(gt)[..., None, None]
            u = bt[..., None] * (vt - jnp.einsum("bhij,bhi->bhj", st, kt))
            st = st + kt[..., :, None] * u[..., None, :]
            return st, jnp.einsum("bhij,bhi->bhj", st, qt * scale)

        bsz, _, h, n = q.shape
        st0 = jnp.zeros((bsz, h, n, n), q.dtype)
        _, os_ = jax.lax.scan(step, st0, tuple(z.swapaxes(0, 1) for z in (q, k, v, g, beta)))
        return os_.swapaxes(0, 1)

    return ssm, gdn


# ── torch peers ─────────────────────────────────────────────────────────


def torch_peers(torch):
    def ssm(x, dt, a, b, c):
        st = torch.zeros(x.shape[0], x.shape[2], a.shape[1])
        ys = []
        for t in range(x.shape[1]):
            d = dt[:, t, :, None]
            st = torch.exp(d * a) * st + d * x[:, t, :, None] * b[:, t, None, :]
            ys.append(torch.einsum("bhn,bn->bh", st, c[:, t]))
        return torch.stack(ys, 1)

    def gdn(q, k, v, g, beta):
        scale = q.shape[-1] ** -0.5
        st = torch.zeros(q.shape[0], q.shape[2], q.shape[3], q.shape[3])
        os_ = []
        for t in range(q.shape[1]):
            st = st * torch.exp(g[:, t])[..., None, None]
            kt = k[:, t]
            u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhij,bhi->bhj", st, kt))
            st = st + kt[..., :, None] * u[..., None, :]
            os_.append(torch.einsum("bhij,bhi->bhj", st, q[:, t] * scale))
        return torch.stack(os_, 1)

    return ssm, gdn


# ── rlx ─────────────────────────────────────────────────────────────────


def rlx_op(build: Callable, feeds: dict[str, np.ndarray], threads: int) -> Callable[[], object]:
    import dataclasses

    import rlx
    from rlx.config import Config

    g = rlx.Graph("bench")
    g.set_outputs([build(g, {k: g.input(k, list(v.shape)) for k, v in feeds.items()})])
    cg = rlx.Session(config=dataclasses.replace(Config.from_env(), num_threads=threads)).compile(g)
    return lambda: cg.run(feeds)[0]


def bench(name: str, rlx_fn, peers: dict[str, Callable[[], object]], rounds: int, flops: float) -> None:
    want = rlx_fn()
    for pname, fn in peers.items():
        got = np.asarray(fn())
        err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
        if err > 1e-3:
            raise SystemExit(f"{name}: peer {pname} disagrees with rlx (relative error {err:.2e})")
    times = round_robin({"rlx": rlx_fn, **peers}, rounds)
    print(f"{name}")
    for pname, t in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"  {pname:<14} {t * 1e3:9.3f} ms   x{t / times['rlx']:6.2f} of rlx time   "
              f"{flops / t / 1e9:6.2f} GFLOP/s")
    sys.stdout.flush()


def train_block(jax, threads: int, rounds: int, batch: int = 64) -> None:
    """One Adam step of the Mamba-style classifier: rlx's compiled step graph vs jax.jit(value_and_grad)."""
    import dataclasses

    import rlx
    from rlx.config import Config
    from rlx.examples import train as T

    task = T.TASKS["mamba"]
    rng = np.random.default_rng(0)
    weights = task.init(rng)
    x, labels = task.data(rng, batch)
    y = np.eye(task.classes, dtype=np.float32)[labels]
    graph = T.train_step_graph(task, batch, "adam")
    cg = rlx.Session(config=dataclasses.replace(Config.from_env(), num_threads=threads)).compile(graph)
    moments = {f"{k}_{n}": np.zeros_like(w) for n, w in weights.items() for k in ("m", "v")}
    feeds = {"x": x, "y": y, **weights, **moments, "lr": np.array([0.01], np.float32),
             "bc1": np.array([0.1], np.float32), "bc2": np.array([0.001], np.float32)}
    rlx_step = lambda: cg.run(feeds)  # noqa: E731
    peers: dict[str, Callable[[], object]] = {}
    if jax is not None:
        jnp = jax.numpy

        def loss_fn(w, x, y):
            u = x @ w["w_in"]
            k = w["conv"].shape[1]
            s = u.shape[1]
            up = jnp.pad(u, ((0, 0), (k - 1, 0), (0, 0)))
            u = jax.nn.silu(sum(w["conv"][:, j] * up[:, j:j + s] for j in range(k)))
            dt = jax.nn.softplus(u @ w["w_dt"] + w["b_dt"])
            a = -jnp.exp(w["a_log"])
            bm, cm = u @ w["w_b"], u @ w["w_c"]

            def step(st, inp):
                ut, dtt, bt, ct = inp
                st = jnp.exp(dtt[..., None] * a) * st + (dtt * ut)[..., None] * bt[:, None, :]
                return st, jnp.einsum("bhn,bn->bh", st, ct)

            st0 = jnp.zeros((u.shape[0], u.shape[2], a.shape[1]), u.dtype)
            _, ys = jax.lax.scan(step, st0, tuple(z.swapaxes(0, 1) for z in (u, dt, bm, cm)))
            yy = ys.swapaxes(0, 1) + u * w["d"]
            logits = yy.mean(1) @ w["w_out"]
            return -(jax.nn.log_softmax(logits, -1) * y).sum() / x.shape[0]

        @jax.jit
        def jax_step(w, m, v, x, y):
            loss, g = jax.value_and_grad(loss_fn)(w, x, y)
            b1, b2 = T.ADAM_BETAS
            m = jax.tree_util.tree_map(lambda mm, gg: b1 * mm + (1 - b1) * gg, m, g)
            v = jax.tree_util.tree_map(lambda vv, gg: b2 * vv + (1 - b2) * gg * gg, v, g)
            w = jax.tree_util.tree_map(lambda ww, mm, vv: ww - 0.01 * (mm / 0.1) / (jnp.sqrt(vv / 0.001) + T.ADAM_EPS),
                                       w, m, v)
            return loss, w, m, v

        jw = {k: jnp.asarray(v) for k, v in weights.items()}
        jz = {k: jnp.zeros_like(v) for k, v in jw.items()}
        jx, jy = jnp.asarray(x), jnp.asarray(y)
        want = float(jax_step(jw, jz, jz, jx, jy)[0])
        got = float(rlx_step()[0].reshape(()))
        if abs(got - want) > 1e-4 * max(1.0, abs(want)):
            raise SystemExit(f"train step: rlx loss {got} but jax {want}")
        peers["jax.jit"] = lambda: jax.block_until_ready(jax_step(jw, jz, jz, jx, jy))
    times = round_robin({"rlx": rlx_step, **peers}, rounds)
    print(f"mamba-style train step (Adam) b={batch} s={T.SEQ} channels={T.CH} n={T.STATE}")
    for pname, t in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"  {pname:<14} {t * 1e3:9.3f} ms   x{t / times['rlx']:6.2f} of rlx time")


# ── GPU ─────────────────────────────────────────────────────────────────


def torch_cuda_peers(torch):
    """(selective scan, gated delta net) as a step function and a Python loop driving a given step."""

    def ssm_step(st, a, xt, dtt, bt, ct):
        d = dtt[..., None]
        st = torch.exp(d * a) * st + (d * xt[..., None]) * bt[:, None, :]
        return st, torch.einsum("bhn,bn->bh", st, ct)

    def ssm_loop(step, x, dt, a, b, c):
        st = torch.zeros(x.shape[0], x.shape[2], a.shape[1], device=x.device)
        ys = []
        for t in range(x.shape[1]):
            st, y = step(st, a, x[:, t], dt[:, t], b[:, t], c[:, t])
            ys.append(y)
        return torch.stack(ys, 1)

    def gdn_step(st, qt, kt, vt, gt, bt, scale: float):
        st = st * torch.exp(gt)[..., None, None]
        u = bt[..., None] * (vt - torch.einsum("bhij,bhi->bhj", st, kt))
        st = st + kt[..., :, None] * u[..., None, :]
        return st, torch.einsum("bhij,bhi->bhj", st, qt * scale)

    def gdn_loop(step, q, k, v, g, beta):
        n = q.shape[3]
        st = torch.zeros(q.shape[0], q.shape[2], n, n, device=q.device)
        os_ = []
        for t in range(q.shape[1]):
            st, o = step(st, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], n ** -0.5)
            os_.append(o)
        return torch.stack(os_, 1)

    return ssm_step, ssm_loop, gdn_step, gdn_loop


def rlx_cuda_op(build: Callable, tfeeds: dict, out) -> Callable[[], object]:
    """rlx's CUDA build of one op, bound to device-resident torch tensors (each call: one C call)."""
    import rlx

    g = rlx.Graph("bench")
    g.set_outputs([build(g, {k: g.input(k, list(v.shape)) for k, v in tfeeds.items()})])
    cg = rlx.Session(rlx.Device.CUDA).compile(g)
    run = cg.bind_device(tfeeds, outputs={cg.output_names[0]: out})
    return lambda: (run(), out)[1]


def bench_cuda(name: str, torch, want: np.ndarray, rlx_fn, peers: dict[str, Callable[[], object]], rounds: int,
               flops: float) -> None:
    got = rlx_fn().cpu().numpy()
    err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
    if err > 1e-3:
        raise SystemExit(f"{name}: rlx disagrees with the numpy loop (relative error {err:.2e})")
    for pname, fn in list(peers.items()):
        out = fn()
        out = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out)
        err = float(np.max(np.abs(out - got)) / (np.max(np.abs(got)) + 1e-30))
        # flash-linear-attention's Triton kernels multiply on tensor cores (tf32) even for f32 inputs
        tol = 2e-2 if pname.startswith("fla") else 1e-3
        if pname.startswith("fla"):
            print(f"  ({pname} vs rlx: relative error {err:.1e})")
        if err > tol:
            print(f"  {pname} disagrees with rlx (relative error {err:.2e}): not timed")
            del peers[pname]

    def synced(fn):
        def call():
            fn()
            torch.cuda.synchronize()
        return call

    times = round_robin({"rlx": synced(rlx_fn), **{k: synced(f) for k, f in peers.items()}}, rounds)
    print(f"{name}")
    for pname, t in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"  {pname:<14} {t * 1e3:9.3f} ms   x{t / times['rlx']:8.2f} of rlx time   "
              f"{flops / t / 1e9:8.2f} GFLOP/s")
    sys.stdout.flush()


def cuda_main(args: argparse.Namespace) -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch and rlx
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA GPU visible to PyTorch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64  # one compiled step per shape
    try:
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 in the einsums
        jax_ssm, jax_gdn = jax_peers(jax)
        if jax.default_backend() not in ("gpu", "cuda"):
            jax = None
    except ImportError:
        jax = None
    ssm_step, ssm_loop, gdn_step, gdn_loop = torch_cuda_peers(torch)
    try:  # the hand-written Triton kernels of flash-linear-attention (fla-core), where it is installed
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        fla = (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule)
    except Exception as exc:  # not installed, or its Triton stack does not import here
        print(f"flash-linear-attention not available ({type(exc).__name__}: {str(exc)[:80]})")
        fla = None
    c_ssm_step = torch.compile(ssm_step, fullgraph=True, dynamic=False)
    c_gdn_step = torch.compile(gdn_step, fullgraph=True, dynamic=False)
    dev = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()}, rounds {args.rounds}; torch {torch.__version__}, "
          f"jax {jax.__version__ if jax else 'not installed or no GPU (skipped)'}; mamba-ssm not installed "
          f"(its CUDA extension builds from source; no network on this machine); flash-linear-attention "
          f"{'fla-core (Triton)' if fla else 'not installed'}")
    rng = np.random.default_rng(0)
    ssm_shapes = ([(1, 2048, 64, 16), (8, 1, 1024, 16)] if args.quick else
                  [(1, 4096, 256, 16), (1, 1024, 256, 16), (4, 512, 128, 16), (8, 64, 64, 16), (8, 1, 1024, 16)])
    for b, s, h, n in ssm_shapes:
        f = {"x": rng.standard_normal((b, s, h)), "dt": rng.uniform(0.01, 0.2, (b, s, h)),
             "a": -rng.uniform(0.5, 2, (h, n)), "b": rng.standard_normal((b, s, n)),
             "c": rng.standard_normal((b, s, n))}
        f = {k: v.astype(np.float32) for k, v in f.items()}
        tf = {k: torch.from_numpy(v).to(dev) for k, v in f.items()}
        peers: dict[str, Callable[[], object]] = {
            "torch eager": lambda tf=tf: ssm_loop(ssm_step, **tf),
            "torch.compile": lambda tf=tf: ssm_loop(c_ssm_step, **tf)}
        if jax:
            jf = {k: jax.device_put(v) for k, v in f.items()}
            peers["jax.jit"] = lambda jf=jf: jax_ssm(**jf).block_until_ready()
        out = torch.empty((b, s, h), device=dev)
        rlx_fn = rlx_cuda_op(lambda g, i: g.selective_scan(i["x"], i["dt"], i["a"], i["b"], i["c"]), tf, out)
        bench_cuda(f"selective_scan b={b} s={s} h={h} n={n}", torch, ssm_numpy(**f), rlx_fn, peers, args.rounds,
                   6.0 * b * s * h * n)
    gdn_shapes = ([(1, 1024, 8, 64), (2, 512, 4, 128), (8, 1, 16, 64)] if args.quick else
                  [(1, 4096, 8, 64), (1, 1024, 8, 64), (4, 256, 8, 64), (8, 1, 16, 128), (2, 512, 16, 16)])
    for b, s, h, n in gdn_shapes:
        def unit(shape):
            z = rng.standard_normal(shape)
            return z / np.linalg.norm(z, axis=-1, keepdims=True)

        f = {"q": unit((b, s, h, n)), "k": unit((b, s, h, n)), "v": rng.standard_normal((b, s, h, n)),
             "g": -rng.uniform(0.01, 0.3, (b, s, h)), "beta": rng.uniform(0.1, 1, (b, s, h))}
        f = {k: v.astype(np.float32) for k, v in f.items()}
        tf = {k: torch.from_numpy(v).to(dev) for k, v in f.items()}
        peers = {"torch eager": lambda tf=tf: gdn_loop(gdn_step, **tf),
                 "torch.compile": lambda tf=tf: gdn_loop(c_gdn_step, **tf)}
        if jax:
            jf = {k: jax.device_put(v) for k, v in f.items()}
            peers["jax.jit"] = lambda jf=jf: jax_gdn(**jf).block_until_ready()
        if fla:  # fla: the chunked kernel for prefill, the fused recurrent one for a decode step
            kern, label = (fla[1], "fla recurrent") if s == 1 else (fla[0], "fla chunk")
            peers[label] = lambda tf=tf, kern=kern, n=n: kern(tf["q"], tf["k"], tf["v"], tf["g"], tf["beta"],
                                                              scale=n ** -0.5)[0]
        out = torch.empty((b, s, h, n), device=dev)
        rlx_fn = rlx_cuda_op(lambda g, i: g.gated_delta_net(i["q"], i["k"], i["v"], i["g"], i["beta"]), tf, out)
        bench_cuda(f"gated_delta_net b={b} s={s} h={h} n={n}", torch, gdn_numpy(**f, scale=n ** -0.5), rlx_fn,
                   peers, args.rounds, 8.0 * b * s * h * n * n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a few small shapes per op")
    args = ap.parse_args()
    if args.device == "cuda":
        cuda_main(args)
        return
    os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen={'true' if args.threads > 1 else 'false'} "
                                       f"intra_op_parallelism_threads={args.threads}")
    try:
        import jax

        jax_ssm, jax_gdn = jax_peers(jax)
    except ImportError:
        jax = None
    try:
        import torch

        torch.set_num_threads(args.threads)
        t_ssm, t_gdn = torch_peers(torch)
        tc_ssm, tc_gdn = torch.compile(t_ssm), torch.compile(t_gdn)
    except ImportError:
        torch = None
    print(f"threads {args.threads}, rounds {args.rounds}; jax {jax.__version__ if jax else 'not installed (skipped)'}, "
          f"torch {torch.__version__ if torch else 'not installed (skipped)'}")
    rng = np.random.default_rng(0)
    ssm_shapes = [(1, 256, 64, 16)] if args.quick else [(1, 1024, 256, 16), (4, 512, 128, 16), (8, 64, 64, 16)]
    for b, s, h, n in ssm_shapes:
        f = {"x": rng.standard_normal((b, s, h)), "dt": rng.uniform(0.01, 0.2, (b, s, h)),
             "a": -rng.uniform(0.5, 2, (h, n)), "b": rng.standard_normal((b, s, n)),
             "c": rng.standard_normal((b, s, n))}
        f = {k: v.astype(np.float32) for k, v in f.items()}
        peers: dict[str, Callable[[], object]] = {"numpy": lambda f=f: ssm_numpy(**f)}
        if jax:
            jf = {k: jax.numpy.asarray(v) for k, v in f.items()}
            peers["jax.jit"] = lambda jf=jf: jax_ssm(**jf).block_until_ready()
        if torch:
            tf = {k: torch.from_numpy(v) for k, v in f.items()}
            peers["torch eager"] = lambda tf=tf: t_ssm(**tf)
            peers["torch.compile"] = lambda tf=tf: tc_ssm(**tf)
        bench(f"selective_scan b={b} s={s} h={h} n={n}",
              rlx_op(lambda g, i: g.selective_scan(i["x"], i["dt"], i["a"], i["b"], i["c"]), f, args.threads),
              peers, args.rounds, 6.0 * b * s * h * n)
    gdn_shapes = [(1, 128, 4, 64)] if args.quick else [(1, 1024, 8, 64), (4, 256, 8, 64), (8, 1, 16, 128),
                                                      (2, 512, 16, 16)]
    for b, s, h, n in gdn_shapes:
        def unit(shape):
            z = rng.standard_normal(shape)
            return z / np.linalg.norm(z, axis=-1, keepdims=True)

        f = {"q": unit((b, s, h, n)), "k": unit((b, s, h, n)), "v": rng.standard_normal((b, s, h, n)),
             "g": -rng.uniform(0.01, 0.3, (b, s, h)), "beta": rng.uniform(0.1, 1, (b, s, h))}
        f = {k: v.astype(np.float32) for k, v in f.items()}
        peers = {"numpy": lambda f=f, n=n: gdn_numpy(**f, scale=n ** -0.5)}
        if jax:
            jf = {k: jax.numpy.asarray(v) for k, v in f.items()}
            peers["jax.jit"] = lambda jf=jf: jax_gdn(**jf).block_until_ready()
        if torch:
            tf = {k: torch.from_numpy(v) for k, v in f.items()}
            peers["torch eager"] = lambda tf=tf: t_gdn(**tf)
            peers["torch.compile"] = lambda tf=tf: tc_gdn(**tf)
        bench(f"gated_delta_net b={b} s={s} h={h} n={n}",
              rlx_op(lambda g, i: g.gated_delta_net(i["q"], i["k"], i["v"], i["g"], i["beta"]), f, args.threads),
              peers, args.rounds, 8.0 * b * s * h * n * n)
    train_block(jax, args.threads, args.rounds)


if __name__ == "__main__":
    main()
