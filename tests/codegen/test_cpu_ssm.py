"""CPU selective_scan, gated_delta_net(_carry) and depthwise_conv1d_causal.

Each op is checked three ways: the RLX reference against the published
recurrences written out here in numpy (mamba's `selective_scan_ref`,
flash-linear-attention's `naive_recurrent_gated_delta_rule`, PyTorch's grouped
`conv1d` with k-1 left padding as Mamba uses it), and the compiled CPU kernel
against the reference, with a dynamic sequence length.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import check, compile_graph

import rlx
from rlx.errors import BuildError, ShapeError
from rlx.reference import run as reference_run

MAXS = 48


# ── the published reference recurrences, in numpy ──────────────────────


def mamba_selective_scan_ref(u, delta, A, B, C):
    """mamba_ssm.ops.selective_scan_interface.selective_scan_ref, variable B and C, no D/z/bias/softplus.

    Layout as in mamba: u, delta [b, d, l]; A [d, n]; B, C [b, n, l].
    """
    batch, dim, dstate = u.shape[0], A.shape[0], A.shape[1]
    deltaA = np.exp(np.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = np.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    x = np.zeros((batch, dim, dstate))
    ys = []
    for i in range(u.shape[2]):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        ys.append(np.einsum("bdn,bn->bd", x, C[:, :, i]))
    return np.stack(ys, axis=2)  # [b, d, l]


def fla_naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale, initial_state=None):
    """fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule on [B, T, H, K] inputs."""
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [B, H, T, K]
    beta, g = beta.transpose(0, 2, 1), g.transpose(0, 2, 1)  # [B, H, T]
    b, h, t, kd = k.shape
    vd = v.shape[-1]
    o = np.zeros((b, h, t, vd))
    s = np.zeros((b, h, kd, vd)) if initial_state is None else initial_state.copy()
    q = q * scale
    for i in range(t):
        b_q, b_k, b_v = q[:, :, i], k[:, :, i], v[:, :, i].copy()
        s = s * np.exp(g[:, :, i])[..., None, None]
        b_v = b_v - (s * b_k[..., None]).sum(-2)
        b_v = b_v * beta[:, :, i][..., None]
        s = s + b_k[..., :, None] * b_v[..., None, :]
        o[:, :, i] = np.einsum("bhd,bhdm->bhm", b_q, s)
    return o.transpose(0, 2, 1, 3), s


def torch_causal_conv1d(x, w):
    """F.conv1d(x.transpose(1,2), w[:, None, :], padding=k-1, groups=c)[..., :seqlen] in numpy."""
    b, s, c = x.shape
    k = w.shape[1]
    xp = np.concatenate([np.zeros((b, k - 1, c)), x], axis=1)
    out = np.zeros((b, s, c))
    for bi in range(b):
        for ci in range(c):
            out[bi, :, ci] = np.correlate(xp[bi, :, ci], w[ci], mode="valid")
    return out


# ── graphs and data ─────────────────────────────────────────────────────


def _ssm_graph(h: int, n: int) -> rlx.Graph:
    seq = rlx.Dim.dynamic("seq", MAXS)

    def fn(t):
        return t.selective_scan(t.input("x", [2, seq, h]), t.input("dt", [2, seq, h]), t.param("A", [h, n]),
                                t.input("B", [2, seq, n]), t.input("C", [2, seq, n]))

    return rlx.trace("ssm", fn)


def _ssm_data(rng, s: int, h: int, n: int) -> tuple[dict, dict]:
    ins = {"x": rng.standard_normal((2, s, h)), "dt": rng.uniform(0.01, 0.3, (2, s, h)),
           "B": rng.standard_normal((2, s, n)), "C": rng.standard_normal((2, s, n))}
    return ({k: v.astype(np.float32) for k, v in ins.items()},
            {"A": -rng.uniform(0.5, 2.0, (h, n)).astype(np.float32)})


def _gdn_data(rng, b: int, s: int, h: int, n: int) -> dict:
    def unit(shape):  # q and k are L2-normalized per head, as the models feed them
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    return {k: v.astype(np.float32) for k, v in {
        "q": unit((b, s, h, n)), "k": unit((b, s, h, n)), "v": rng.standard_normal((b, s, h, n)),
        "g": -rng.uniform(0.01, 0.5, (b, s, h)), "beta": rng.uniform(0.1, 1.0, (b, s, h))}.items()}


def _gdn_graph(b, h: int, n: int, *, carry: bool = False, scale: float | None = None) -> rlx.Graph:
    seq = rlx.Dim.dynamic("seq", MAXS)

    def fn(t):
        ins = [t.input(name, [b, seq, h, n]) for name in "qkv"] + [t.input(name, [b, seq, h]) for name in
                                                                     ("g", "beta")]
        return t.gated_delta_net(*ins, scale=scale)

    if not carry:
        return rlx.trace("gdn", fn)
    g = rlx.Graph("gdn_carry")
    q, k, v = (g.input(name, [b, seq, h, n]) for name in "qkv")
    gg, beta = (g.input(name, [b, seq, h]) for name in ("g", "beta"))
    st = g.state("state", [b, h, n, n])
    g.set_outputs([g.gated_delta_net_carry(q, k, v, gg, beta, st, scale=scale)])
    return g


# ── selective_scan ─────────────────────────────────────────────────────


def test_reference_selective_scan_is_mambas_recurrence() -> None:
    rng = np.random.default_rng(0)
    ins, params = _ssm_data(rng, 7, 5, 4)
    got = reference_run(_ssm_graph(5, 4), ins, params)[0]
    f64 = {k: v.astype(np.float64) for k, v in {**ins, **params}.items()}
    want = mamba_selective_scan_ref(f64["x"].transpose(0, 2, 1), f64["dt"].transpose(0, 2, 1), f64["A"],
                                    f64["B"].transpose(0, 2, 1), f64["C"].transpose(0, 2, 1)).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("h", "n"), [(20, 16), (3, 5)])
def test_cpu_selective_scan_matches_reference_dynamic_seq(h: int, n: int) -> None:
    g = _ssm_graph(h, n)
    rng = np.random.default_rng(h)
    _, params = _ssm_data(rng, 1, h, n)
    cg = compile_graph(g, params)
    for s in (1, 17, MAXS):
        ins, _ = _ssm_data(rng, s, h, n)
        check(g, ins, params, rtol=1e-4, atol=1e-4, cg=cg)


def test_cpu_selective_scan_carry_chunks_equal_one_pass() -> None:
    """Prefill then decode through a state input (a recurrent cache) equals one scan of the whole sequence;
    a step with delta 0 (a padded token) leaves the state exactly as it was."""
    h, n = 20, 16
    g = rlx.Graph("ssm_carry")
    seq = rlx.Dim.dynamic("seq", MAXS)
    x, dt = g.input("x", [2, seq, h]), g.input("dt", [2, seq, h])
    bm, cm = g.input("B", [2, seq, n]), g.input("C", [2, seq, n])
    g.set_outputs([g.selective_scan(x, dt, g.param("A", [h, n]), bm, cm, state=g.state("state", [2, h, n]))])
    rng = np.random.default_rng(11)
    full, params = _ssm_data(rng, 12, h, n)
    cg = compile_graph(g, params)
    f64 = {k: v.astype(np.float64) for k, v in {**full, **params}.items()}
    want = mamba_selective_scan_ref(f64["x"].transpose(0, 2, 1), f64["dt"].transpose(0, 2, 1), f64["A"],
                                    f64["B"].transpose(0, 2, 1), f64["C"].transpose(0, 2, 1)).transpose(0, 2, 1)
    state, ref_state = np.zeros((2, h, n), np.float32), np.zeros((2, h, n), np.float32)
    outs = []
    for lo, hi in ((0, 8), (8, 9), (9, 12)):
        step = {k: np.ascontiguousarray(v[:, lo:hi]) for k, v in full.items()}
        got = cg.run({**step, "state": state})[0]
        ref = reference_run(g, {**step, "state": ref_state}, params)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(state, ref_state, rtol=1e-4, atol=1e-4)
        outs.append(got)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-4, atol=1e-4)
    before = state.copy()
    skip = {k: np.ascontiguousarray(v[:, :3]) for k, v in full.items()}
    skip["dt"] = np.zeros_like(skip["dt"])
    cg.run({**skip, "state": state})
    np.testing.assert_array_equal(state, before)


# ── gated_delta_net ────────────────────────────────────────────────────


def test_reference_gated_delta_net_is_flas_naive_recurrence() -> None:
    rng = np.random.default_rng(1)
    ins = _gdn_data(rng, 2, 6, 3, 8)
    got = reference_run(_gdn_graph(2, 3, 8), ins)[0]
    f64 = {k: v.astype(np.float64) for k, v in ins.items()}
    want, _ = fla_naive_recurrent_gated_delta_rule(f64["q"], f64["k"], f64["v"], f64["beta"], f64["g"],
                                                   scale=8 ** -0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("h", "n", "scale"), [(3, 16, None), (2, 64, 0.5)])
def test_cpu_gated_delta_net_matches_reference_dynamic_seq(h: int, n: int, scale: float | None) -> None:
    g = _gdn_graph(2, h, n, scale=scale)
    cg = compile_graph(g)
    rng = np.random.default_rng(n)
    for s in (1, 9, 40):
        check(g, _gdn_data(rng, 2, s, h, n), rtol=1e-4, atol=1e-4, cg=cg)


def test_cpu_gated_delta_net_carry_prefill_then_decode_equals_one_pass() -> None:
    b, h, n = 2, 2, 16
    g = _gdn_graph(b, h, n, carry=True)
    cg = compile_graph(g)
    rng = np.random.default_rng(5)
    full = _gdn_data(rng, b, 12, h, n)
    f64 = {k: v.astype(np.float64) for k, v in full.items()}
    want, want_state = fla_naive_recurrent_gated_delta_rule(f64["q"], f64["k"], f64["v"], f64["beta"], f64["g"],
                                                            scale=n ** -0.5)
    state = np.zeros((b, h, n, n), np.float32)
    ref_state = np.zeros((b, h, n, n), np.float32)
    outs = []
    for lo, hi in ((0, 8), (8, 9), (9, 10), (10, 12)):  # a prefill chunk, then decode steps
        step = {k: np.ascontiguousarray(v[:, lo:hi]) for k, v in full.items()}
        got = cg.run({**step, "state": state})[0]
        ref = reference_run(g, {**step, "state": ref_state})[0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        outs.append(got)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ref_state, want_state, rtol=1e-5, atol=1e-5)


def test_gated_delta_net_from_a_plain_input_state_reads_it() -> None:
    b, h, n = 1, 2, 8
    g = rlx.Graph("gdn_init")
    seq = rlx.Dim.dynamic("seq", MAXS)
    q, k, v = (g.input(name, [b, seq, h, n]) for name in "qkv")
    gg, beta = (g.input(name, [b, seq, h]) for name in ("g", "beta"))
    s0 = g.input("s0", [b, h, n, n])
    g.set_outputs([g.gated_delta_net_carry(q, k, v, gg, beta, s0)])
    rng = np.random.default_rng(9)
    ins = {**_gdn_data(rng, b, 5, h, n), "s0": rng.standard_normal((b, h, n, n)).astype(np.float32)}
    before = ins["s0"].copy()
    check(g, ins, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(ins["s0"], before)  # a plain input is never written


# ── depthwise_conv1d_causal ────────────────────────────────────────────


def _conv_graph(c: int, k: int, pad: bool) -> rlx.Graph:
    seq = rlx.Dim.dynamic("seq", MAXS)

    def fn(t):
        lp = t.input("pad", [2, k - 1, c]) if pad else None
        return t.depthwise_conv1d_causal(t.input("x", [2, seq, c]), t.param("w", [c, k]), lp)

    return rlx.trace("conv", fn)


def test_reference_conv_is_torch_padded_conv1d() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 9, 5)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    got = reference_run(_conv_graph(5, 4, False), {"x": x}, {"w": w})[0]
    np.testing.assert_allclose(got, torch_causal_conv1d(x.astype(np.float64), w.astype(np.float64)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("c", "k", "pad"), [(24, 4, False), (7, 3, True), (5, 1, False)])
def test_cpu_conv_matches_reference_dynamic_seq(c: int, k: int, pad: bool) -> None:
    g = _conv_graph(c, k, pad)
    rng = np.random.default_rng(c)
    params = {"w": rng.standard_normal((c, k)).astype(np.float32)}
    cg = compile_graph(g, params)
    for s in (1, 2, 30):
        ins = {"x": rng.standard_normal((2, s, c)).astype(np.float32)}
        if pad:
            ins["pad"] = rng.standard_normal((2, k - 1, c)).astype(np.float32)
        check(g, ins, params, rtol=1e-5, atol=1e-5, cg=cg)


def test_conv_with_left_pad_continues_a_sequence() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 10, 6))
    w = rng.standard_normal((6, 4))
    whole = torch_causal_conv1d(x, w)
    tail = reference_run(_conv_graph(6, 4, True), {"x": x[:, 7:].astype(np.float32),
                                                   "pad": x[:, 4:7].astype(np.float32)},
                         {"w": w.astype(np.float32)})[0]
    np.testing.assert_allclose(tail, whole[:, 7:], rtol=1e-5, atol=1e-5)


def _conv_carry_graph(c: int, k: int) -> rlx.Graph:
    g = rlx.Graph("conv_carry")
    x = g.input("x", [2, rlx.Dim.dynamic("seq", MAXS), c])
    lengths = g.input("lengths", [2], "i32")
    g.set_outputs([g.depthwise_conv1d_causal(x, g.param("w", [c, k]), g.state("conv_state", [2, k - 1, c]),
                                             lengths=lengths)])
    return g


def test_cpu_conv_carry_state_keeps_each_rows_last_inputs() -> None:
    """A ragged batch through a carried conv state: each row's outputs are the conv of its whole sequence so
    far, and the state holds its last k-1 real inputs (a row of length 0 keeps its state; short rows shift)."""
    c, k = 6, 4
    g = _conv_carry_graph(c, k)
    rng = np.random.default_rng(4)
    params = {"w": rng.standard_normal((c, k)).astype(np.float32)}
    cg = compile_graph(g, params)
    state, ref_state = np.zeros((2, k - 1, c), np.float32), np.zeros((2, k - 1, c), np.float32)
    seen: list[list[np.ndarray]] = [[], []]
    for s, lengths in ((5, (5, 2)), (3, (0, 3)), (1, (1, 1)), (2, (2, 1))):
        x = rng.standard_normal((2, s, c)).astype(np.float32)
        ins = {"x": x, "lengths": np.array(lengths, np.int32)}
        got = cg.run({**ins, "conv_state": state})[0]
        ref = reference_run(g, {**ins, "conv_state": ref_state}, params)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(state, ref_state, rtol=1e-6, atol=1e-6)
        for row, n in enumerate(lengths):
            history = np.concatenate([np.zeros((0, c)), *seen[row]]) if seen[row] else np.zeros((0, c))
            whole = torch_causal_conv1d(np.concatenate([history, x[row, :n]])[None].astype(np.float64),
                                        params["w"].astype(np.float64))[0]
            np.testing.assert_allclose(got[row, :n], whole[len(history):], rtol=1e-4, atol=1e-4)
            seen[row].append(x[row, :n].astype(np.float64))
            tail = np.concatenate([np.zeros((k - 1, c)), *seen[row]])[-(k - 1):]
            np.testing.assert_allclose(state[row], tail, rtol=1e-6, atol=1e-6)


def test_conv_carry_length_outside_the_step_is_an_error() -> None:
    from rlx.errors import ExecutionError

    g = _conv_carry_graph(3, 2)
    params = {"w": np.ones((3, 2), np.float32)}
    ins = {"x": np.ones((2, 2, 3), np.float32), "lengths": np.array([1, 3], np.int32),
           "conv_state": np.zeros((2, 1, 3), np.float32)}
    with pytest.raises(ExecutionError, match="row 1 has length 3"):
        compile_graph(g, params).run(dict(ins))
    with pytest.raises(ExecutionError, match="lengths must lie in"):
        reference_run(g, dict(ins), params)


# ── bad input ───────────────────────────────────────────────────────────


def test_shape_errors_name_the_problem() -> None:
    g = rlx.Graph("bad")
    x = g.input("x", [1, 4, 8])
    with pytest.raises(ShapeError, match=r"selective_scan A must be \[8,16\]"):
        g.selective_scan(x, x, g.input("A", [4, 16]), g.input("B", [1, 4, 16]), g.input("C", [1, 4, 16]))
    q = g.input("q", [1, 4, 2, 8])
    with pytest.raises(ShapeError, match=r"gated_delta_net beta must be \[1,4,2\]"):
        g.gated_delta_net(q, q, q, g.input("g", [1, 4, 2]), g.input("beta", [1, 4, 3]))
    with pytest.raises(ShapeError, match=r"gated_delta_net state must be \[1,2,8,8\]"):
        g.gated_delta_net_carry(q, q, q, g.input("g2", [1, 4, 2]), g.input("b2", [1, 4, 2]),
                                g.input("s", [1, 2, 8, 4]))
    with pytest.raises(ShapeError, match=r"left_pad must be \[1,2,8\]"):
        g.depthwise_conv1d_causal(x, g.input("w", [8, 3]), g.input("p", [1, 3, 8]))


def test_state_too_large_for_the_cpu_kernel_is_refused_before_building() -> None:
    g = rlx.Graph("big")
    q = g.input("q", [1, 2, 1, 192])
    g.set_outputs([g.gated_delta_net(q, q, q, g.input("g", [1, 2, 1]), g.input("beta", [1, 2, 1]))])
    assert "state_size 192 > 128" in rlx.Session().first_unsupported_op(g)[1]
    with pytest.raises(BuildError, match="state_size 192"):
        compile_graph(g)


def test_reverse_conv_is_the_transpose() -> None:
    """<conv(x), y> == <x, conv_reverse(y)>: the anti-causal form the derivative uses, compiled and reference."""
    seq = rlx.Dim.dynamic("seq", MAXS)
    g = rlx.Graph("rconv")
    y = g.input("y", [2, seq, 5])
    g.set_outputs([g.depthwise_conv1d_causal(y, g.param("w", [5, 3]), reverse=True)])
    rng = np.random.default_rng(11)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    cg = compile_graph(g, {"w": w})
    for s in (1, 2, 9):
        x = rng.standard_normal((2, s, 5))
        yy = rng.standard_normal((2, s, 5)).astype(np.float32)
        got = check(g, {"y": yy}, {"w": w}, rtol=1e-5, atol=1e-5, cg=cg)[0]
        lhs = float(np.sum(torch_causal_conv1d(x, w.astype(np.float64)) * yy))
        assert abs(lhs - float(np.sum(x * got))) < 1e-4 * max(1.0, abs(lhs))
    with pytest.raises(ShapeError, match="takes no left_pad"):
        g.depthwise_conv1d_causal(y, g.param("w2", [5, 3]), g.input("p", [2, 2, 5]), reverse=True)
