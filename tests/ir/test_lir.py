"""The LIR hash: stable across processes and constructions, sensitive to everything that shapes the code."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from rlx.ir import ops as O
from rlx.ir import ops_user as U
from rlx.ir.graph import Graph
from rlx.ir.lir import LirModule
from rlx.ir.shape import Dim, Shape
from rlx.opt.memplan import plan
from rlx.opt.pipeline import optimize
from tests.ir.user_ops import swish_beta

REPO = Path(__file__).resolve().parents[2]


def program(hidden: int = 16, seq_max: int = 32) -> Graph:
    """A small encoder layer: dynamic dims, constants, transposed params, fusions, views."""
    g = Graph("encoder")
    b, s = Dim.dynamic("batch", max=4), Dim.dynamic("seq", max=seq_max)
    x = g.input("x", [b, s, hidden])
    mask = g.input("mask", [b, s])
    w = {k: g.param(f"{k}.weight", [hidden, hidden]) for k in ("q", "k", "v", "o")}
    bias = {k: g.param(f"{k}.bias", [hidden]) for k in ("q", "k", "v", "o")}
    qkv = [g.add_(g.matmul(x, g.transpose(w[k], [1, 0])), bias[k]) for k in ("q", "k", "v")]
    a = g.attention(*qkv, num_heads=2, head_dim=hidden // 2, mask="padding", mask_input=mask)
    h = g.add_(g.add_(g.matmul(a, g.transpose(w["o"], [1, 0])), bias["o"]), x)
    h = g.layer_norm(h, g.param("ln.weight", [hidden]), g.param("ln.bias", [hidden]), eps=1e-12)
    scale = g.constant(np.linspace(0.5, 1.5, hidden).astype(np.float32))
    y = g.activation("tanh", g.mul(g.activation("gelu", h), scale))
    g.set_outputs({"hidden": y, "flat": g.reshape(y, [b * s, hidden])})
    return g


def program_lir() -> LirModule:
    return plan(optimize(program(), 2))


# ── stability ──────────────────────────────────────────────────────────


def test_stable_across_constructions() -> None:
    a, b = program_lir(), program_lir()
    assert a is not b and a.graph is not b.graph
    assert a.canonical() == b.canonical() and a.hash() == b.hash()
    assert len(a.hash()) == 64 and int(a.hash(), 16) >= 0


def test_stable_across_serialization_round_trip() -> None:
    g = optimize(program(), 2)
    assert plan(Graph.from_json(g.to_json())).hash() == plan(g).hash()


@pytest.mark.parametrize("seed", ["0", "4242"])
def test_stable_across_processes(seed: str) -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('lir_case', {str(Path(__file__))!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(m.program_lir().hash())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120, check=True)
    assert out.stdout.strip() == program_lir().hash()


def test_canonical_is_plain_sorted_json() -> None:
    text = program_lir().canonical()
    assert text.isascii()
    doc = json.loads(text)
    assert json.dumps(doc, sort_keys=True, separators=(",", ":")) == text
    assert doc["symbols"] == [["batch", 4], ["seq", 32]]


def test_manifest_describes_the_abi() -> None:
    m = program_lir().manifest()
    assert [i["name"] for i in m["inputs"]] == ["x", "mask"]
    assert [o["name"] for o in m["outputs"]] == ["hidden", "flat"]
    q = next(p for p in m["params"] if p["name"] == "q.weight")
    assert q["shape"] == ["16", "16"] and q["layout"] == [1, 0]  # user layout, pre-transposed once
    assert m["symbols"] == [{"name": "batch", "max": 4}, {"name": "seq", "max": 32}]


# ── sensitivity ────────────────────────────────────────────────────────

Build = Callable[[Graph, object], None]


def _one(fn: str = "neg", dims: list = (4,), dtype: str = "f32") -> Build:
    return lambda g, v: g.set_outputs([g.activation(fn, g.input("x", list(dims), dtype))])


def _build_attention() -> Build:
    base = {"num_heads": 2, "head_dim": 4, "mask": "none", "scale": None, "num_kv_heads": None}

    def build(g: Graph, v: object) -> None:
        kw = dict(base)
        kw.update(v)  # type: ignore[arg-type]
        q = g.input("q", [1, 3, 8])
        kv_width = kw["head_dim"] * (kw["num_kv_heads"] or kw["num_heads"])
        k, val = g.input("k", [1, 3, kv_width]), g.input("v", [1, 3, kv_width])
        g.set_outputs([g.attention(q, k, val, **kw)])

    return build


def _build_rope(g: Graph, v: object) -> None:
    kw = {"head_dim": 8, "n_rot": 4, "variant": "neox"}
    kw.update(v)  # type: ignore[arg-type]
    rot = kw["n_rot"] or kw["head_dim"]
    x = g.input("x", [1, 3, 8])
    cos, sin = g.input("cos", [3, rot // 2]), g.input("sin", [3, rot // 2])
    g.set_outputs([g.rope(x, cos, sin, **kw)])


def _build_cached_attention(g: Graph, v: object) -> None:
    kw = {"num_heads": 2, "head_dim": 4, "num_kv_heads": 1, "scale": None}
    kw.update(v)  # type: ignore[arg-type]
    kv_width = kw["head_dim"] * (kw["num_kv_heads"] or kw["num_heads"])
    q = g.input("q", [1, 3, kw["num_heads"] * kw["head_dim"]])
    k, val = g.input("k", [1, 3, kv_width]), g.input("v", [1, 3, kv_width])
    page = kw.get("page_size")
    shape = [1, 8, kv_width] if page is None else [4, page, kv_width]
    kc, vc = g.state("kc", shape), g.state("vc", shape)
    table = None if page is None else g.input("block_table", [1, 8 // page], "i32")
    g.set_outputs([g.cached_attention(q, k, val, kc, vc, g.input("pos", [1], "i32"), block_table=table, **kw)])


def _build_quant(kind: str) -> Build:
    """dequant_matmul / dequantize of a [4, 32] weight in format v (row bytes follow the format)."""
    from rlx.ir.quant import row_bytes

    def build(g: Graph, v: object) -> None:
        w = g.param("w", [4, row_bytes(str(v), 32)], "u8")
        if kind == "dequant_matmul":
            g.set_outputs([g.dequant_matmul(g.input("x", [2, 32]), w, quant=str(v))])
        else:
            g.set_outputs([g.dequantize(w, quant=str(v))])

    return build


def _sq(build: Callable[[Graph, int, object], int]) -> Build:
    """Apply an op to a 4x4 input (square, so most attribute changes keep the shape)."""
    def inner(g: Graph, v: object) -> None:
        g.set_outputs([build(g, g.input("x", [4, 4]), v)])
    return inner


def _region(g: Graph, v: object) -> None:
    x, y = g.input("x", [4]), g.input("y", [4])
    g.set_outputs([g.add(O.ElementwiseRegion(v), [x, y])])


def _fused(op_of: Callable[[object], O.Op], n_inputs: int, shapes: list[list[int]]) -> Build:
    def build(g: Graph, v: object) -> None:
        ins = [g.input(f"i{k}", shapes[k]) for k in range(n_inputs)]
        g.set_outputs([g.add(op_of(v), ins)])
    return build


def _outputs(g: Graph, v: object) -> None:
    x = g.input("x", [4])
    a, b = g.activation("neg", x), g.activation("exp", x)
    g.set_outputs(v(a, b))  # type: ignore[operator]


def _node_name(g: Graph, v: object) -> None:
    x = g.input("x", [4])
    g.set_outputs([g.add(O.Activation("neg"), [x], name=v)])  # type: ignore[arg-type]


def _graph_name(g: Graph, v: object) -> None:
    g.name = v  # type: ignore[assignment]
    _one()(g, None)


def _param_layout(g: Graph, v: object) -> None:
    x = g.input("x", [3, 4])
    p = g.add(O.Param("w", g.shape(x).with_dims([4, 4]), v), name="w")  # type: ignore[arg-type]
    g.set_outputs([g.matmul(x, p)])


def _param_rounds(g: Graph, v: object) -> None:
    x = g.input("x", [4])
    g.set_outputs([g.add_(x, g.add(O.Param("p", g.shape(x), rounds_f32=v), name="p"))])  # type: ignore[arg-type]


def _dyn(name: str, bound: int) -> Build:
    return lambda g, v: _one(dims=[Dim.dynamic(name, max=bound), 4])(g, v)


def _ssm(g: Graph, v: object) -> None:
    n, carry = v if isinstance(v, tuple) else (v, False)
    x = g.input("x", [1, 3, 4])
    a, bc = g.input("a", [4, n]), g.input("bc", [1, 3, n])
    state = g.input("s", [1, 4, n]) if carry else None
    g.set_outputs([g.selective_scan(x, x, a, bc, bc, state=state)])


def _gdn(g: Graph, v: object) -> None:
    kw = dict(v)  # type: ignore[call-overload]
    n = kw.pop("n", 4)
    q, gb = g.input("q", [1, 3, 2, n]), g.input("gb", [1, 3, 2])
    state = g.input("s", [1, 2, n, n]) if kw.pop("carry", False) else None
    g.set_outputs([g.gated_delta_net(q, q, q, gb, gb, state=state, **kw)])


def _conv(g: Graph, v: object) -> None:
    ksize, reverse, carry = (*v, False)[:3] if isinstance(v, tuple) else (v, False, False)
    x, w = g.input("x", [1, 3, 4]), g.input("w", [4, ksize])
    if carry:  # the conv state (each row's last k-1 inputs) and each row's real length
        pad, lengths = g.input("pad", [1, ksize - 1, 4]), g.input("len", [1], "i32")
        g.set_outputs([g.depthwise_conv1d_causal(x, w, pad, lengths=lengths)])
    else:
        g.set_outputs([g.depthwise_conv1d_causal(x, w, reverse=reverse)])


def _scan(g: Graph, v: object) -> None:
    kw = dict(v)  # type: ignore[call-overload]
    fn = kw.pop("fn", "tanh")
    body = Graph("step")
    c, x = body.input("c", [4]), body.input("x", [4])
    body.set_outputs([body.activation(fn, body.add_(c, x))])
    length = kw.pop("length", 6)
    xs = g.input("xs", [length, 4])
    bc = [g.input("b", [4])] if kw.pop("bcast", False) else []
    if bc:
        body2 = Graph("step")
        c2, b2, x2 = body2.input("c", [4]), body2.input("b", [4]), body2.input("x", [4])
        body2.set_outputs([body2.activation(fn, body2.add_(body2.add_(c2, b2), x2))])
        body = body2
    if kw.pop("no_xs", False):  # the same step with x a broadcast input instead of a per-step row
        g.set_outputs([g.scan(body, g.input("c0", [4]), bcasts=[g.input("b", [4])], length=length, **kw)])
        return
    g.set_outputs([g.scan(body, g.input("c0", [4]), xs=[xs], bcasts=bc, **kw)])


def _cfn(g: Graph, v: object) -> None:
    kw = dict(v)  # type: ignore[call-overload]
    fwd = Graph("f")
    fx = fwd.input("x", [4])
    fwd.set_outputs([fwd.activation(kw.get("fn", "tanh"), fx)])
    vjp = jvp = None
    if kw.get("vjp"):
        vjp = Graph("v")
        vx, _, vd = vjp.input("x", [4]), vjp.input("primal_output", [4]), vjp.input("d_output", [4])
        vjp.set_outputs([vjp.mul(vx, vd)])
    if kw.get("jvp"):
        jvp = Graph("j")
        jx, jt = jvp.input("x", [4]), jvp.input("tangent_0", [4])
        jvp.set_outputs([jvp.mul(jx, jt)])
    g.set_outputs([g.custom_fn([g.input("x", [4])], fwd, vjp=vjp, jvp=jvp)])


def _control(g: Graph, v: object) -> None:
    """A cond feeding a while_loop; `v` changes one attribute (a branch's or body's fn, max_trips)."""
    kw = dict(v)  # type: ignore[call-overload]

    def unary(name: str, fn: str) -> Graph:
        b = Graph(name)
        b.set_outputs([b.activation(fn, b.input("c", [4]))])
        return b

    pred = Graph("p")
    pc = pred.input("c", [4])
    pred.set_outputs([pred.compare(kw.get("cmp", "lt"), pred.reduce("sum", pc), pred.constant(np.float32(9)))])
    x = g.input("x", [4])
    y = g.cond(g.compare("gt", g.reduce("sum", x), g.constant(np.float32(0))), unary("t", kw.get("true", "tanh")),
               unary("f", kw.get("false", "neg")), [x])
    g.set_outputs([g.while_loop(pred, unary("b", kw.get("body", "exp")), y, max_trips=kw.get("max_trips", 8))])


def _user(g: Graph, kw: dict) -> None:
    """swish_beta (or a second registration of it, `name`), with a traced vjp when asked."""
    op = swish_beta(kw.get("name", "swish_beta"))
    vjp = None
    if kw.get("vjp"):
        vjp = Graph("v")
        ins = [vjp.input(n, s) for n, s in (("x", [4]), ("beta", []), ("primal_output", [4]), ("d_output", [4]))]
        vjp.set_outputs([vjp.mul(ins[0], ins[3]), ins[1]])
    g.set_outputs([g.user_op(op.name, [g.input("x", [4]), g.input("beta", [])], vjp=vjp)])


def _user_digest(g: Graph, v: str) -> None:
    op = swish_beta()
    g.set_outputs([g.add(U.UserOp(op.name, v), [g.input("x", [4]), g.input("beta", [])])])


R = O.RegionStep
def _iota(g: Graph, v: tuple) -> None:
    """An iota whose length is `v[0]` times a dynamic dim of an input (start, delta, dtype from the rest)."""
    n = Dim.dynamic("n", max=8)
    g.input("x", [n])
    g.set_outputs([g.iota(n * v[0], *v[1:])])


# (what, op kind and field covered or None, builder, value a, value b)

def _collective(make: Callable[[object], O.Op]) -> Build:
    """A [4, 4] input through one collective op."""
    return lambda g, v: g.set_outputs([g.add(make(v), [g.input("x", [4, 4])])])

CASES: list[tuple[str, tuple[str, str] | None, Build, object, object]] = [
    ("input name", ("input", "name"), lambda g, v: g.set_outputs([g.input(v, [4])]), "x", "y"),
    ("input dims", ("input", "shape"), lambda g, v: _one(dims=v)(g, None), [4], [5]),
    ("input dtype", None, lambda g, v: _one(fn="neg", dtype=v)(g, None), "f32", "f16"),
    ("dynamic bound", None, lambda g, v: _dyn("n", v)(g, None), 8, 16),
    ("dynamic name", None, lambda g, v: _dyn(v, 8)(g, None), "n", "m"),
    ("param name", ("param", "name"), lambda g, v: g.set_outputs([g.add_(g.input("x", [4]), g.param(v, [4]))]),
     "p", "q"),
    ("param shape", ("param", "shape"),
     lambda g, v: g.set_outputs([g.add_(g.input("x", [4]), g.param("p", [v]))]), 4, 1),
    ("param layout", ("param", "layout"), _param_layout, None, (1, 0)),
    ("param rounds_f32", ("param", "rounds_f32"), _param_rounds, False, True),
    ("constant data", ("constant", "data"),
     lambda g, v: g.set_outputs([g.add_(g.input("x", [4]), g.constant(np.full(4, v, np.float32)))]), 1.0, 2.0),
    ("constant -0.0", None,
     lambda g, v: g.set_outputs([g.add_(g.input("x", [4]), g.constant(np.float32(v)))]), 0.0, -0.0),
    ("constant shape", ("constant", "shape"),
     lambda g, v: g.set_outputs([g.add_(g.input("x", [2, 2]), g.constant(np.ones(v, np.float32)))]), [2, 2], [1, 2, 2]),
    ("activation", ("activation", "fn"), lambda g, v: _one(fn=v)(g, None), "gelu", "gelu_tanh"),
    ("binary", ("binary", "fn"), _sq(lambda g, x, v: g.binary(v, x, x)), "add", "mul"),
    ("compare", ("compare", "fn"), _sq(lambda g, x, v: g.compare(v, x, x)), "lt", "le"),
    ("cast", ("cast", "dtype"), _sq(lambda g, x, v: g.cast(x, v)), "f16", "bf16"),
    ("reduce fn", ("reduce", "fn"), _sq(lambda g, x, v: g.reduce(v, x, [1])), "sum", "mean"),
    ("reduce axes", ("reduce", "axes"), _sq(lambda g, x, v: g.reduce("sum", x, v)), [0], [1]),
    ("reduce keep_dim", ("reduce", "keep_dim"), _sq(lambda g, x, v: g.reduce("sum", x, [0, 1], v)), False, True),
    ("softmax", ("softmax", "axis"), _sq(lambda g, x, v: g.softmax(x, v)), -1, 0),
    ("argmax", ("argmax", "axis"), _sq(lambda g, x, v: g.argmax(x, v)), -1, 0),
    ("layer_norm", ("layer_norm", "eps"),
     _sq(lambda g, x, v: g.layer_norm(x, g.param("a", [4]), g.param("b", [4]), eps=v)), 1e-5, 1e-6),
    ("rms_norm", ("rms_norm", "eps"), _sq(lambda g, x, v: g.rms_norm(x, g.param("a", [4]), eps=v)), 1e-5, 1e-6),
    ("reshape", ("reshape", "shape"), _sq(lambda g, x, v: g.reshape(x, v)), [2, 8], [8, 2]),
    ("reshape -1", None, _sq(lambda g, x, v: g.reshape(x, v)), [2, 8], [2, -1]),
    ("transpose", ("transpose", "perm"), lambda g, v: g.set_outputs([g.transpose(g.input("x", [4, 4, 4]), v)]),
     [1, 0, 2], [0, 2, 1]),
    ("narrow axis", ("narrow", "axis"), _sq(lambda g, x, v: g.narrow(x, v, 1, 2)), 0, 1),
    ("narrow start", ("narrow", "start"), _sq(lambda g, x, v: g.narrow(x, 0, v, 2)), 0, 1),
    ("narrow length", ("narrow", "length"), _sq(lambda g, x, v: g.narrow(x, 0, 0, v)), 2, 3),
    ("concat", ("concat", "axis"), _sq(lambda g, x, v: g.transpose(g.concat([x, x], v), [0, 1])
                                       if v == 0 else g.concat([x, x], v)), 0, 1),
    ("expand", ("expand", "shape"), lambda g, v: g.set_outputs([g.expand(g.input("x", [1, 4]), v)]),
     [3, 4], [2, 3, 4]),
    ("gather", ("gather", "axis"), lambda g, v: g.set_outputs([g.gather(g.input("t", [4, 4]),
                                                                         g.input("i", [2], "i32"), v)]), 0, 1),
    ("attention num_heads", ("attention", "num_heads"), _build_attention(),
     {"num_heads": 2, "head_dim": 4}, {"num_heads": 4, "head_dim": 2}),
    ("attention head_dim", ("attention", "head_dim"), _build_attention(),
     {"num_heads": 2, "head_dim": 4, "num_kv_heads": 1}, {"num_heads": 4, "head_dim": 2, "num_kv_heads": 2}),
    ("attention mask", ("attention", "mask"), _build_attention(), {"mask": "none"}, {"mask": "causal"}),
    ("attention scale", ("attention", "scale"), _build_attention(), {"scale": None}, {"scale": 0.5}),
    ("attention kv heads", ("attention", "num_kv_heads"), _build_attention(),
     {"num_kv_heads": None}, {"num_kv_heads": 2}),
    ("selective_scan state_size", ("selective_scan", "state_size"), _ssm, 4, 8),
    ("selective_scan carry", ("selective_scan", "carry_state"), _ssm, 4, (4, True)),
    ("gated_delta_net state_size", ("gated_delta_net", "state_size"), _gdn, {"n": 4}, {"n": 8}),
    ("gated_delta_net carry", ("gated_delta_net", "carry_state"), _gdn, {}, {"carry": True}),
    ("gated_delta_net scale", ("gated_delta_net", "scale"), _gdn, {}, {"scale": 0.5}),
    ("conv kernel_size", ("depthwise_conv1d_causal", "kernel_size"), _conv, 3, 4),
    ("conv reverse", ("depthwise_conv1d_causal", "reverse"), _conv, (3, False), (3, True)),
    ("conv carry", ("depthwise_conv1d_causal", "carry_state"), _conv, (3, False), (3, False, True)),
    ("scan body", ("scan", "body"), _scan, {}, {"fn": "exp"}),
    ("scan length", ("scan", "length"), _scan, {}, {"length": 7}),
    ("scan bcasts", ("scan", "num_bcast"), _scan, {}, {"bcast": True}),
    ("scan xs", ("scan", "num_xs"), _scan, {}, {"no_xs": True}),
    ("scan trajectory", ("scan", "save_trajectory"), _scan, {}, {"save_trajectory": True}),
    ("scan reverse", ("scan", "reverse"), _scan, {}, {"reverse": True}),
    ("scan checkpoints", ("scan", "num_checkpoints"), _scan, {}, {"num_checkpoints": 2}),
    ("custom_fn fwd", ("custom_fn", "fwd"), _cfn, {}, {"fn": "exp"}),
    ("custom_fn vjp", ("custom_fn", "vjp"), _cfn, {}, {"vjp": True}),
    ("custom_fn jvp", ("custom_fn", "jvp"), _cfn, {}, {"jvp": True}),
    ("cond true branch", ("cond", "true_body"), _control, {}, {"true": "exp"}),
    ("cond false branch", ("cond", "false_body"), _control, {}, {"false": "exp"}),
    ("while_loop cond", ("while_loop", "cond_body"), _control, {}, {"cmp": "le"}),
    ("while_loop body", ("while_loop", "body"), _control, {}, {"body": "tanh"}),
    ("while_loop max_trips", ("while_loop", "max_trips"), _control, {}, {"max_trips": None}),
    ("user_op name", ("user_op", "name"), _user, {}, {"name": "swish_beta_renamed"}),
    ("user_op digest", ("user_op", "digest"), _user_digest, "a" * 64, "b" * 64),
    ("user_op vjp", ("user_op", "vjp"), _user, {}, {"vjp": True}),
    ("input state", ("input", "state"),
     lambda g, v: g.set_outputs([g.activation("neg", g.add(O.Input("s", Shape.of([4]), state=v), name="s"))]),
     False, True),
    ("cached_attention num_heads", ("cached_attention", "num_heads"), _build_cached_attention,
     {"num_heads": 2}, {"num_heads": 4}),
    ("cached_attention head_dim", ("cached_attention", "head_dim"), _build_cached_attention,
     {"head_dim": 4}, {"head_dim": 8}),
    ("cached_attention kv heads", ("cached_attention", "num_kv_heads"), _build_cached_attention,
     {"num_kv_heads": 1}, {"num_kv_heads": 2}),
    ("cached_attention scale", ("cached_attention", "scale"), _build_cached_attention,
     {"scale": None}, {"scale": 0.5}),
    ("cached_attention window", ("cached_attention", "window"), _build_cached_attention,
     {"window": None}, {"window": 4}),
    ("cached_attention page_size", ("cached_attention", "page_size"), _build_cached_attention,
     {"page_size": 4}, {"page_size": 8}),
    ("rope head_dim", ("rope", "head_dim"), _build_rope, {"head_dim": 8}, {"head_dim": 4}),
    ("rope n_rot", ("rope", "n_rot"), _build_rope, {"n_rot": 8}, {"n_rot": None, "head_dim": 8}),
    ("rope variant", ("rope", "variant"), _build_rope, {"variant": "neox"}, {"variant": "interleaved"}),
    ("dequant_matmul quant", ("dequant_matmul", "quant"), _build_quant("dequant_matmul"), "q4_0", "q5_0"),
    ("dequantize quant", ("dequantize", "quant"), _build_quant("dequantize"), "q4_0", "q5_0"),
    ("moe_topk top_k", ("moe_topk", "top_k"),
     lambda g, v: g.set_outputs([g.moe_router(g.input("l", [2, 4]), top_k=v, normalize=True)[0]]), 1, 2),
    ("moe_gate normalize", ("moe_gate", "normalize"),
     lambda g, v: g.set_outputs([g.moe_router(g.input("l", [2, 4]), top_k=2, normalize=v)[1]]), True, False),
    ("moe_matmul quant", ("moe_matmul", "quant"),
     lambda g, v: g.set_outputs([g.moe_matmul(g.input("x", [2, 32]), g.input("ids", [2, 2], "i32"),
                                              g.param("w", [4, 3, {"q4_0": 18, "q5_0": 22}[v]], "u8"),
                                              quant=v)]), "q4_0", "q5_0"),
    ("dequant_matmul act", ("dequant_matmul", "act"),
     lambda g, v: g.set_outputs([g.dequant_matmul(g.input("x", [2, 32]), g.param("w", [4, 18], "u8"),
                                                  quant="q4_0", act=v)]), "f32", "q8"),
    ("int8 matmul act", ("int8_matmul", "activation"),
     lambda g, v: g.set_outputs([g.int8_matmul(g.input("x", [2, 4]), g.param("w", [4, 3]), activation=v)]),
     None, "gelu"),
    ("fused matmul act", ("fused_matmul_bias_act", "activation"),
     _fused(lambda v: O.FusedMatMulBiasAct(v), 3, [[2, 4], [4, 4], [4]]), None, "gelu"),
    ("fused residual ln", ("fused_residual_layer_norm", "eps"),
     _fused(lambda v: O.FusedResidualLayerNorm(v), 4, [[2, 4], [2, 4], [4], [4]]), 1e-5, 1e-12),
    ("fused residual rms", ("fused_residual_rms_norm", "eps"),
     _fused(lambda v: O.FusedResidualRmsNorm(v), 3, [[2, 4], [2, 4], [4]]), 1e-5, 1e-6),
    ("all_reduce world", ("all_reduce", "world"), _collective(lambda v: O.AllReduce(world=v)), 2, 4),
    ("all_reduce reduce", ("all_reduce", "reduce"), _collective(lambda v: O.AllReduce(2, v)), "sum", "max"),
    ("all_gather world", ("all_gather", "world"), _collective(lambda v: O.AllGather(world=v)), 2, 4),
    ("all_gather axis", ("all_gather", "axis"), _collective(lambda v: O.AllGather(2, axis=v)), 0, 1),
    ("reduce_scatter world", ("reduce_scatter", "world"), _collective(lambda v: O.ReduceScatter(v)), 2, 4),
    ("reduce_scatter reduce", ("reduce_scatter", "reduce"), _collective(lambda v: O.ReduceScatter(2, v)),
     "sum", "max"),
    ("reduce_scatter axis", ("reduce_scatter", "axis"), _collective(lambda v: O.ReduceScatter(2, axis=v)), 0, 1),
    *[(f"conv {name}", ("conv", name),
       lambda g, v: g.set_outputs([g.conv(g.input("x", [1, 4, 6, 6]), g.param("w", [4, 2, 3, 3]), **v)]),
       {"groups": 2, **a}, {"groups": 2, **b})
      for name, a, b in (("strides", {}, {"strides": (2, 2)}), ("dilations", {}, {"dilations": (2, 1)}),
                         ("pads", {}, {"pads": (1, 1, 1, 1)}), ("activation", {}, {"activation": "relu"}))],
    ("conv groups", ("conv", "groups"),
     lambda g, v: g.set_outputs([g.conv(g.input("x", [1, 4, 6, 6]), g.param("w", [4, 4 // v, 1, 1]), groups=v)]),
     1, 2),
    *[(f"pool {name}", ("pool", name),
       lambda g, v: g.set_outputs([g.pool(v.get("fn", "max"), g.input("x", [1, 2, 7, 7]), v.get("kernel", (2, 2)),
                                          **{k: x for k, x in v.items() if k not in ("fn", "kernel")})]), a, b)
      for name, a, b in (("fn", {}, {"fn": "avg"}), ("kernel", {}, {"kernel": (3, 2)}),
                         ("strides", {}, {"strides": (2, 2)}), ("pads", {}, {"pads": (1, 1, 1, 1)}),
                         ("dilations", {}, {"dilations": (2, 2)}), ("ceil_mode", {"strides": (2, 2)},
                                                                    {"strides": (2, 2), "ceil_mode": True}),
                         ("count_include_pad", {"fn": "avg", "pads": (1, 1, 1, 1)},
                          {"fn": "avg", "pads": (1, 1, 1, 1), "count_include_pad": True}))],
    *[(f"iota {name}", ("iota", name), _iota, a, b)
      for name, a, b in (("length", (1,), (2,)), ("start", (1, 0), (1, 1)), ("delta", (1, 0, 1), (1, 0, 2)),
                         ("dtype", (1, 0, 1, "i64"), (1, 0, 1, "i32")))],
    ("batch_norm eps", ("batch_norm", "eps"),
     lambda g, v: g.set_outputs([g.batch_norm(g.input("x", [2, 3, 4]), *(g.param(n, [3]) for n in "sbmv"), eps=v)]),
     1e-5, 1e-3),
    ("region op", ("elementwise_region", "steps"), _region,
     (R(O.Binary("add"), (0, 1)), R(O.Activation("relu"), (2,))),
     (R(O.Binary("add"), (0, 1)), R(O.Activation("tanh"), (2,)))),
    ("region args", None, _region, (R(O.Binary("sub"), (0, 1)),), (R(O.Binary("sub"), (1, 0)),)),
    ("node name", None, _node_name, "", "h"),
    ("graph name", None, _graph_name, "a", "b"),
    ("output names", None, lambda g, v: _outputs(g, lambda a, b: dict(zip(v, [a, b]))), ["p", "q"], ["q", "p"]),
    ("output order", None, _outputs, lambda a, b: [a, b], lambda a, b: [b, a]),
    ("output duplicated", None, _outputs, lambda a, b: [a, b], lambda a, b: [a, b, a]),
]


def _lir(build: Build, v: object) -> LirModule:
    g = Graph("case")
    build(g, v)
    return plan(g)


@pytest.mark.parametrize("what,field,build,a,b", CASES, ids=[c[0] for c in CASES])
def test_hash_sensitive_to(what: str, field: object, build: Build, a: object, b: object) -> None:
    la, la2, lb = _lir(build, a), _lir(build, a), _lir(build, b)
    assert la.hash() == la2.hash(), f"{what}: unstable"
    assert la.hash() != lb.hash(), f"{what}: {a!r} and {b!r} hash the same"


def test_cases_cover_every_op_attribute() -> None:
    covered = {c[1] for c in CASES if c[1] is not None}
    every = {(kind, f.name) for kind, cls in O.OPS.items() for f in dataclasses.fields(cls)}
    assert every - covered == set()


def test_hash_sensitive_to_the_buffer_plan() -> None:
    lir = program_lir()
    arena = next(n for n, b in lir.buffers.items() if b.storage == "arena")
    moved = dict(lir.buffers)
    moved[arena] = dataclasses.replace(moved[arena], offset=moved[arena].offset + 64)
    assert dataclasses.replace(lir, buffers=moved).hash() != lir.hash()
    assert dataclasses.replace(lir, arena_bytes=lir.arena_bytes + 64).hash() != lir.hash()


def test_arena_spans_see_through_views() -> None:
    """`LirModule.arena_span`: a node's own arena bytes; a view's from its start in the root buffer to the root's
    end (a strided view may reach past its own size); None outside the arena. `arena_overlap` compares them."""
    g = Graph("spans")
    x = g.input("x", [4, 8])
    a, a2 = g.activation("relu", x), g.activation("sigmoid", x)  # both live until `both`
    whole, half = g.reshape(a, [8, 4]), g.narrow(a, 0, 2, 2)
    both = g.add_(a2, a)
    g.set_outputs([g.activation("relu", whole), g.activation("relu", half), both])
    lir = plan(g)
    start = lir.buffers[a].offset
    assert lir.arena_span(a) == (start, start + 128) and lir.arena_span(whole) == (start, start + 128)
    assert lir.arena_span(half) == (start + 64, start + 128) and lir.root(half) == a
    assert lir.arena_span(x) is None and lir.arena_span(both) is None  # an input, an output
    assert lir.arena_overlap(a, half) and lir.arena_overlap(whole, half)
    assert not lir.arena_overlap(a, a2) and not lir.arena_overlap(x, a)
