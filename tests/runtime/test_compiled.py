"""The Python runtime: Session.compile, CompiledGraph's API and every way to call it wrongly."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from cpu_helpers import compile_graph, session

import rlx
from rlx.abi_version import ABI_VERSION
from rlx.ir import ops as O
from rlx.ir.dtype import BFLOAT16
from rlx.ir.shape import Shape


def _mlp(seq_max: int = 16) -> rlx.Graph:
    seq = rlx.Dim.dynamic("seq", max=seq_max)
    g = rlx.Graph("mlp")
    x = g.input("x", [2, seq, 8])
    w = g.param("w", [8, 4])
    b = g.param("b", [4])
    g.set_outputs({"y": g.activation("gelu", g.add_(g.matmul(x, w), b)), "s": g.reduce("sum", x, [2])})
    return g


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(7)
    params = {"w": rng.standard_normal((8, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    g = _mlp()
    return g, compile_graph(g, params, opt_level=2), params


def test_run_dict_keywords_and_lists(mlp):
    g, cg, params = mlp
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    want = rlx.reference.run(g, {"x": x}, params)
    for got in (cg.run({"x": x}), cg.run(x=x), cg.run(x=x.tolist())):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)
    with pytest.raises(rlx.ExecutionError, match="both in the dict and as a keyword"):
        cg.run({"x": x}, x=x)


def test_run_reads_the_callers_dict_without_changing_it(mlp):
    """`run` takes a plain dict as it is (no copy on the call's path) and only reads it; keywords go to a copy."""
    g, cg, params = mlp
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    feed = {"x": x}
    want = rlx.reference.run(g, {"x": x}, params)
    for _ in range(2):
        got = cg.run(feed)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        assert list(feed) == ["x"] and feed["x"] is x


def test_params_never_set_raise_on_every_run_until_set():
    """The check of unset params is skipped only once every param was set (params never become unset)."""
    cg = compile_graph(_mlp())
    x = np.ones((2, 3, 8), np.float32)
    cg.set_param("w", np.ones((8, 4), np.float32))
    for _ in range(2):
        with pytest.raises(rlx.ExecutionError, match=r"params never set: \['b'\]"):
            cg.run(x=x)
    cg.set_param("b", np.full(4, 0.5, np.float32))
    for _ in range(2):
        np.testing.assert_array_equal(cg.run(x=x)[0], np.full((2, 3, 4), 8.5, np.float32))


@pytest.mark.parametrize("positional", [np.zeros((2, 3, 8), np.float32), [np.zeros((2, 3, 8), np.float32)]])
def test_positional_inputs_are_a_type_error_naming_the_inputs(mlp, positional):
    _, cg, _ = mlp
    with pytest.raises(TypeError, match=r"by name, not a positional (ndarray|list): run\(x=\.\.\.\); "
                                        r"the graph's inputs are \['x'\]"):
        cg.run(positional)


@pytest.mark.parametrize(("feed", "message"), [
    ({}, r"missing inputs \['x'\]"),
    ({"x": np.zeros((2, 3, 8), np.float32), "z": 1}, r"unknown inputs \['z'\]"),
    ({"x": np.zeros((2, 3), np.float32)}, "must have rank 3"),
    ({"x": np.zeros((3, 3, 8), np.float32)}, r"must have shape \(2, 3, 8\)"),
    ({"x": np.zeros((2, 3, 9), np.float32)}, r"must have shape \(2, 3, 8\)"),
    ({"x": np.zeros((2, 17, 8), np.float32)}, "seq=17 is outside 1..16"),
    ({"x": np.zeros((2, 0, 8), np.float32)}, "seq=0 is outside 1..16"),
    ({"x": np.zeros((2, 3, 8), np.float64)}, "float64 but the graph takes f32; converting would lose"),
    ({"x": np.zeros((2, 3, 8), np.complex64)}, "complex64 but the graph takes f32"),
])
def test_bad_inputs_raise_before_calling_c(mlp, feed, message):
    _, cg, _ = mlp
    with pytest.raises(rlx.ExecutionError, match=message):
        cg.run(feed)


def test_lossless_input_casts_are_accepted():
    g = rlx.Graph("idx")
    table = g.param("t", [10, 2])
    ids = g.input("ids", [3], "i64")
    h = g.input("h", [3])
    g.set_outputs([g.gather(table, ids), g.mul(h, h)])
    cg = compile_graph(g, {"t": np.arange(20, dtype=np.float32).reshape(10, 2)})
    out = cg.run(ids=np.array([1, 2, 3], np.int32), h=np.array([1, 2, 3], np.float16))
    assert out[0][:, 0].tolist() == [2, 4, 6] and out[1].tolist() == [1, 4, 9]
    with pytest.raises(rlx.ExecutionError, match="int64 but the graph takes i32"):
        g2 = rlx.Graph("i32")
        g2.set_outputs([g2.activation("neg", g2.input("i", [2], "i32"))])
        compile_graph(g2).run(i=np.array([1, 2], np.int64))


def test_params_must_be_set_and_well_formed():
    g = _mlp()
    cg = compile_graph(g)
    x = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(rlx.ExecutionError, match=r"params never set: \['w', 'b'\]"):
        cg.run(x=x)
    with pytest.raises(rlx.ExecutionError, match="unknown param 'nope'"):
        cg.set_param("nope", np.zeros(4))
    with pytest.raises(rlx.ExecutionError, match=r"param 'w' must have shape \(8, 4\)"):
        cg.set_param("w", np.zeros((4, 8)))
    with pytest.raises(rlx.ExecutionError, match="param 'w' is f32; got a <U1 array"):
        cg.set_param("w", np.full((8, 4), "a"))
    with pytest.raises(rlx.ExecutionError, match="param 'w' is f32 but got a float64 array; converting would lose"):
        cg.set_param("w", np.ones((8, 4), np.float64))
    cg.set_param("w", np.ones((8, 4), np.float64), cast=True)  # explicit: converted once
    cg.set_param("b", np.zeros(4, np.float16))  # lossless: accepted as is
    assert cg.run(x=np.ones((2, 3, 8), np.float32))[0].shape == (2, 3, 4)


def test_set_param_with_a_source_keeps_no_reference_to_the_array(rng):
    """`set_param(source=...)`: the graph keeps the recipe, not the array (a converted weight is not held twice);
    `param_arrays` has the values again from it, converted as set_param converted the array."""
    import weakref

    g = _mlp()
    cg = compile_graph(g)
    w = rng.standard_normal((8, 4))  # float64: converted (cast) to f32 on the way in
    arr = w.copy()
    gone = weakref.ref(arr)
    cg.set_param("w", arr, cast=True, source=lambda: w)
    cg.set_param("b", np.zeros(4, np.float32))
    del arr
    assert gone() is None
    again = cg.param_arrays()
    assert again["w"].dtype == np.float32 and again["w"].flags.c_contiguous
    np.testing.assert_array_equal(again["w"], w.astype(np.float32))
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(cg.run(x=x)[0], rlx.reference.run(g, {"x": x}, again)[0], rtol=1e-5, atol=1e-6)


def test_param_layout_is_applied_by_the_library(rng):
    """A param stored transposed (layout pass) still takes the user's layout in set_param."""
    g = rlx.Graph("layout")
    x = g.input("x", [3, 5])
    w = g.add(O.Param("w", Shape.of([4, 5]), layout=(1, 0)), name="w")  # stored [N, K]; user passes [K, N]
    g.set_outputs([g.matmul(x, g.transpose(w, [1, 0]))])
    user_w = rng.standard_normal((5, 4)).astype(np.float32)
    cg = compile_graph(g, {"w": user_w})
    assert cg.manifest["params"][0]["shape"] == ["5", "4"] and cg.manifest["params"][0]["layout"] == [1, 0]
    xv = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(cg.run(x=xv)[0], xv @ user_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cg.run(x=xv)[0], rlx.reference.run(g, {"x": xv}, {"w": user_w})[0], rtol=1e-5,
                               atol=1e-6)


def test_set_param_typed_and_16_bit_params(rng):
    g = rlx.Graph("typed")
    x = g.input("x", [4])
    a = g.param("a", [4])
    hb = g.param("hb", [4], "bf16")
    g.set_outputs([g.mul(x, a), g.mul(g.cast(x, "bf16"), hb)])
    cg = compile_graph(g)
    vals = np.array([1.5, -2.0, 0.25, 3.0], np.float32)
    cg.set_param_typed("a", vals.astype(np.float16).tobytes(), "f16")
    cg.set_param_typed("hb", rlx.ir.dtype.f32_to_bf16(vals), "bf16")
    out = cg.run(x=np.ones(4, np.float32))
    # bf16 outputs come back as real bf16 arrays (ml_dtypes), not widened
    assert out[0].tolist() == vals.tolist() and out[1].tolist() == vals.tolist() and out[1].dtype == BFLOAT16
    with pytest.raises(rlx.ExecutionError, match="param 'hb' is bf16 but got a float64 array"):
        cg.set_param("hb", vals.astype(np.float64))
    cg.set_param("hb", vals)  # bf16 params take float32 values, like bf16 inputs
    assert cg.run(x=np.ones(4, np.float32))[1].tolist() == vals.tolist()
    cg.set_param("hb", vals.astype(np.float64), cast=True)
    assert cg.run(x=np.ones(4, np.float32))[1].tolist() == vals.tolist()
    with pytest.raises(rlx.ExecutionError, match="needs 8 bytes of f16, got 6"):
        cg.set_param_typed("a", b"\0" * 6, "f16")
    with pytest.raises(rlx.ExecutionError, match="array is float32 but dtype=f16"):
        cg.set_param_typed("a", vals, "f16")


def test_session_f16_precision_rounds_f32_params_once(tmp_path):
    """`Session(precision="f16")` stores the graph's f32 params as f16: `set_param` takes the float32 values and
    rounds them to nearest (as for bf16), refusing values f16 cannot hold; the library's manifest records it, so
    a clone and a saved artifact reloaded keep the rule; a param the graph itself declares f16 still takes no
    float32 array without `cast=True`."""
    from rlx.runtime import artifact, artifact_load

    g = rlx.Graph("f16_params")
    x = g.input("x", [4])
    g.set_outputs([g.add_(x, g.param("b", [4]))])
    cg = rlx.Session(precision="f16").compile(g)
    vals = np.array([0.1, -2.5, 1e-3, 60000.0], np.float32)
    cg.set_param("b", vals)
    assert cg.run(x=np.zeros(4, np.float32))[0].tolist() == vals.astype(np.float16).astype(np.float32).tolist()
    with pytest.raises(rlx.ExecutionError, match=r"param 'b': value 1000000\.0 overflows f16"):
        cg.set_param("b", np.full(4, 1e6, np.float32))
    with pytest.raises(rlx.ExecutionError, match="float64 array; converting would lose"):
        cg.set_param("b", vals.astype(np.float64))  # only float32 values are rounded without asking
    assert [p.get("rounds_f32") for p in cg.manifest["params"]] == [True]
    rounded = vals.astype(np.float16).astype(np.float32).tolist()
    twin = cg.clone()
    twin.set_param("b", vals)
    assert twin.run(x=np.zeros(4, np.float32))[0].tolist() == rounded
    again = artifact_load.load(artifact.save(cg, tmp_path / "f16_params"))
    again.set_param("b", vals)
    assert again.run(x=np.zeros(4, np.float32))[0].tolist() == rounded
    plain = rlx.Graph("declared_f16")
    y = plain.input("y", [4], "f16")
    plain.set_outputs([plain.add_(y, plain.param("h", [4], "f16"))])
    with pytest.raises(rlx.ExecutionError, match="param 'h' is f16 but got a float32 array"):
        compile_graph(plain).set_param("h", vals)


def test_int_param_values_must_fit():
    g = rlx.Graph("intp")
    p = g.param("p", [2], "i8")
    g.set_outputs([g.activation("neg", p)])
    cg = compile_graph(g)
    with pytest.raises(rlx.ExecutionError, match="param 'p' is i8 but got a int64 array; converting would lose"):
        cg.set_param("p", np.array([1, -3], np.int64))
    with pytest.raises(rlx.ExecutionError, match=r"do not fit in i8 \(range -128..127, got 1..300\)"):
        cg.set_param("p", np.array([1, 300]), cast=True)
    with pytest.raises(rlx.ExecutionError, match="do not fit in i8"):
        cg.set_param("p", [1, 300])  # a list has no dtype: converted, but only if the values fit
    cg.set_param("p", np.array([1, -3]), cast=True)
    assert cg.run()[0].tolist() == [-1, 3]
    cg.set_param("p", np.array([2, -4], np.int8))
    assert cg.run()[0].tolist() == [-2, 4]


def test_bind_run_reruns_on_refilled_arrays(mlp):
    """bind_run checks its arrays once; each call runs on their current contents, writing the outputs."""
    g, cg, params = mlp
    rng = np.random.default_rng(2)
    x = np.empty((2, 3, 8), np.float32)
    y, s = np.empty((2, 3, 4), np.float32), np.empty((2, 3), np.float32)
    run = cg.bind_run({"x": x}, [y, s])
    for _ in range(3):
        x[...] = rng.standard_normal((2, 3, 8))
        assert run() is None
        want = rlx.reference.run(g, {"x": x}, params)
        np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s, want[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(rlx.ExecutionError, match=r"missing inputs \['x'\]"):
        cg.bind_run({}, [y, s])
    with pytest.raises(rlx.ExecutionError, match="must be float32"):
        cg.bind_run({"x": x.astype(np.float64)}, [y, s])
    with pytest.raises(rlx.ExecutionError, match="overlaps input 'x'"):
        cg.bind_run({"x": x}, [y, x.reshape(-1)[:6].reshape(2, 3)])


def test_run_slots_writes_in_place(mlp):
    g, cg, params = mlp
    x = np.random.default_rng(1).standard_normal((2, 6, 8)).astype(np.float32)
    y = np.empty((2, 6, 4), np.float32)
    s = np.empty((2, 6), np.float32)
    assert cg.run_slots([x], [y, s]) is None
    want = rlx.reference.run(g, {"x": x}, params)
    np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(rlx.ExecutionError, match="takes 1 inputs and 2 outputs"):
        cg.run_slots([x], [y])
    with pytest.raises(rlx.ExecutionError, match="must be float32"):
        cg.run_slots([x.astype(np.float64)], [y, s])
    with pytest.raises(rlx.ExecutionError, match="must be C-contiguous"):
        cg.run_slots([np.asfortranarray(x)], [y, s])
    with pytest.raises(rlx.ExecutionError, match=r"output 'y' must have shape \(2, 6, 4\)"):
        cg.run_slots([x], [np.empty((2, 5, 4), np.float32), s])
    ro = np.empty((2, 6, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(rlx.ExecutionError, match="read-only"):
        cg.run_slots([x], [ro, s])
    with pytest.raises(rlx.ExecutionError, match="overlaps input 'x'"):
        cg.run_slots([x], [y, x.reshape(-1)[:12].reshape(2, 6)])


def test_handles_persist_across_runs():
    """A KV-cache style loop: the cache input stays bound; run_slots writes the next cache into it."""
    g = rlx.Graph("kv")
    cache = g.input("cache", [4])
    x = g.input("x", [4])
    g.set_outputs({"next": g.add_(cache, x), "twice": g.mul(cache, g.constant(np.float32(2.0)))})
    cg = compile_graph(g)
    state = np.zeros(4, np.float32)
    cg.bind_handle("cache", state)
    ones = np.ones(4, np.float32)
    assert cg.run(x=ones)[0].tolist() == [1, 1, 1, 1]
    nxt = np.empty(4, np.float32)
    twice = np.empty(4, np.float32)
    for _ in range(3):
        cg.run_slots([cg.read_handle("cache"), ones], [nxt, twice])
        cg.bind_handle("cache", nxt.copy())
    assert cg.read_handle("cache").tolist() == [3, 3, 3, 3]
    assert cg.run(x=ones)[1].tolist() == [6, 6, 6, 6]
    assert cg.run(x=ones, cache=np.zeros(4, np.float32))[0].tolist() == [1, 1, 1, 1]  # explicit input wins
    with pytest.raises(rlx.ExecutionError, match="unknown input 'nope'"):
        cg.bind_handle("nope", ones)
    cg.unbind_handle("cache")
    with pytest.raises(rlx.ExecutionError, match="no handle is bound"):
        cg.read_handle("cache")
    with pytest.raises(rlx.ExecutionError, match=r"missing inputs \['cache'\]"):
        cg.run(x=ones)


def test_clone_is_independent(mlp):
    _, cg, params = mlp
    twin = cg.clone()
    x = np.ones((2, 2, 8), np.float32)
    np.testing.assert_array_equal(twin.run(x=x)[0], cg.run(x=x)[0])
    twin.set_param("b", params["b"] + 1)
    assert not np.allclose(twin.run(x=x)[0], cg.run(x=x)[0])
    assert twin.num_threads == cg.num_threads


def test_thread_counts_agree(rng):
    g = rlx.Graph("threads")
    x = g.input("x", [256, 300])
    w = g.param("w", [300, 200])
    g.set_outputs([g.softmax(g.activation("silu", g.matmul(x, w)))])
    w_v = rng.standard_normal((300, 200)).astype(np.float32) * 0.05
    xv = rng.standard_normal((256, 300)).astype(np.float32)
    one = compile_graph(g, {"w": w_v})
    one.num_threads = 1
    two = one.clone()
    two.num_threads = 2
    assert (one.num_threads, two.num_threads) == (1, 2)
    np.testing.assert_allclose(one.run(x=xv)[0], two.run(x=xv)[0], rtol=1e-5, atol=1e-9)
    cfg = session(num_threads=1).compile(g)
    assert cfg.num_threads == 1
    with pytest.raises(rlx.ExecutionError, match="must be an int"):
        one.num_threads = "2"


def test_manifest_source_and_cache_hit(mlp):
    g, cg, _ = mlp
    m = cg.manifest
    assert m["abi_version"] == ABI_VERSION and m["target"] == "cpu" and m["key"] == cg.key
    assert m["isa"]["cpu_target"] == "native" and m["symbols"] == [{"name": "seq", "max": 16}]
    assert [p["name"] for p in m["params"]] == ["w", "b"]
    again = compile_graph(g, opt_level=2)
    assert again.cache_hit and again.key == cg.key
    src = cg.source
    assert src is not None and "rlx_run" in src and "sym[0]" in src
    assert "CompiledGraph('mlp'" in repr(cg)


def test_session_accepts_hir_modules_and_rejects_junk():
    m = rlx.GraphModule.define("lin", lambda h: h.linear(h.input("x", [2, 3]), h.param("w", [3, 2]),
                                                        activation="relu"))
    for obj in (m, m.lower(), m.lower("lir")):
        cg = rlx.Session().compile(obj)
        cg.set_param("w", np.ones((3, 2), np.float32))
        assert cg.run(x=np.ones((2, 3), np.float32))[0].tolist() == [[3, 3], [3, 3]]
    with pytest.raises(rlx.IRError, match="cannot compile a str"):
        rlx.Session().compile("graph")
    with pytest.raises(rlx.RlxError, match="unknown device"):
        rlx.Session("tpu")
    with pytest.raises(rlx.RlxError, match=r"opt_level must be 0\.\.3"):
        rlx.Session().compile(m, opt_level=7)


def test_compiler_errors_are_build_errors(tmp_path):
    g = rlx.Graph("cc")
    g.set_outputs([g.activation("neg", g.input("x", [2]))])
    cfg = dataclasses.replace(rlx.Config.from_env(), cc=str(tmp_path / "no-such-cc"))
    with pytest.raises(rlx.BuildError, match="not found"):
        rlx.Session(config=cfg).compile(g)
    fake = tmp_path / "fakecc"
    real = shutil.which("cc")
    if real is None:
        pytest.skip("no C compiler")
    # a compiler that passes every probe but rejects the generated model.c
    fake.write_text(f"#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in *model.c) "
                    f"echo 'model.c:1:1: error: this compiler refuses everything' >&2; exit 1;; esac; done\n"
                    f"exec {real} \"$@\"\n")
    fake.chmod(0o755)
    cfg = dataclasses.replace(rlx.Config.from_env(), cc=str(fake), cache_dir=tmp_path / "cache")
    with pytest.raises(rlx.BuildError, match="refuses everything") as info:
        rlx.Session(config=cfg).compile(g)
    kept = re.search(r"generated source kept at (\S+\.c)", str(info.value)).group(1)
    assert "rlx_run" in Path(kept).read_text()
    Path(kept).unlink()


def test_clones_run_concurrently_from_python_threads(rng):
    """The GIL is released during rlx_run; each thread drives its own clone."""
    import threading

    g = rlx.Graph("concurrent")
    x = g.input("x", [64, 96])
    w = g.param("w", [96, 80])
    g.set_outputs([g.softmax(g.activation("gelu", g.matmul(x, w)))])
    base = compile_graph(g, {"w": rng.standard_normal((96, 80)).astype(np.float32)})
    xs = [rng.standard_normal((64, 96)).astype(np.float32) for _ in range(4)]
    want = [base.run(x=v)[0] for v in xs]
    got: dict[int, list[np.ndarray]] = {}

    def work(i: int) -> None:
        mine = base.clone()
        got[i] = [mine.run(x=v)[0] for v in xs for _ in range(5)][::5]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        for a, b in zip(got[i], want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_bf16_round_trips_bit_exact_through_run_and_set_param():
    # every one of the 65536 bf16 bit patterns (NaN payloads, -0, subnormals, inf) in and back out
    g = rlx.Graph("bf16_io")
    x = g.input("x", [256, 256], "bf16")
    w = g.param("w", [256, 256], "bf16")
    g.set_outputs([g.reshape(x, [65536]), g.reshape(w, [65536])])
    cg = compile_graph(g)
    bits = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    values = bits.view(BFLOAT16)
    cg.set_param("w", values)
    got_x, got_w = cg.run(x=values)
    assert got_x.dtype == BFLOAT16 and got_w.dtype == BFLOAT16
    assert np.array_equal(got_x.view(np.uint16), bits.reshape(-1))
    assert np.array_equal(got_w.view(np.uint16), bits.reshape(-1))
    # f32 values are still accepted for bf16 (rounded to nearest even), and bf16 widens into f32 exactly
    cg.set_param("w", np.full((256, 256), 1.0 + 2.0 ** -9, np.float32))  # a tie: rounds to even (1.0)
    assert np.all(cg.run(x=values)[1].astype(np.float32) == 1.0)
    g32 = rlx.Graph("widen")
    g32.set_outputs([g32.mul(g32.input("x", [4]), g32.param("a", [4]))])
    cg32 = compile_graph(g32)
    half = np.array([1.5, -2.0, 0.25, 3.0], BFLOAT16)
    cg32.set_param("a", half)
    assert cg32.run(x=half)[0].tolist() == [2.25, 4.0, 0.0625, 9.0]


# ── params read in place (read-only arrays: rlx_bind_param) ─────────────


def _lookup_graph() -> rlx.Graph:
    """An embedding table, a norm and a bias (stored as given: bindable) and a GEMM weight (packed: copied)."""
    g = rlx.Graph("lookup")
    ids = g.input("ids", [rlx.Dim.dynamic("n", max=8)], "i32")
    rows = g.layer_norm(g.gather(g.param("table", [50, 16]), ids), g.param("gamma", [16]), g.param("beta", [16]))
    g.set_outputs([g.add_(g.matmul(rows, g.param("w", [16, 8])), g.param("b", [8]))])
    return g


def _read_only(arr: np.ndarray) -> np.ndarray:
    out = arr.copy()
    out.flags.writeable = False
    return out


@pytest.fixture(scope="module")
def lookup():
    rng = np.random.default_rng(11)
    params = {"table": rng.standard_normal((50, 16)), "gamma": rng.standard_normal(16) + 1,
              "beta": rng.standard_normal(16), "w": rng.standard_normal((16, 8)), "b": rng.standard_normal(8)}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    g = _lookup_graph()
    return g, compile_graph(g, opt_level=2), params


def _set_all(cg, params, read_only: bool) -> None:
    for name, value in params.items():
        cg.set_param(name, _read_only(value) if read_only else value.copy())


_IDS = np.array([3, 0, 49, 7, 3], np.int32)


def test_read_only_params_are_read_in_place_and_agree_with_copies(lookup):
    g, cg, params = lookup
    _set_all(cg, params, read_only=False)
    assert cg.params_in_place == ()
    copied = cg.run(ids=_IDS)[0]
    _set_all(cg, params, read_only=True)
    # the GEMM weight is stored packed, so rlx_bind_param refuses it and it is copied
    w_entry = next(line for line in cg.source.splitlines() if line.lstrip().startswith('{"w",'))
    assert "RLX_PARAM_PACK" in w_entry
    assert cg.params_in_place == ("table", "gamma", "beta", "b")
    np.testing.assert_array_equal(cg.run(ids=_IDS)[0], copied)
    np.testing.assert_allclose(copied, rlx.reference.run(g, {"ids": _IDS}, params)[0], rtol=1e-5, atol=1e-5)


def test_a_writable_array_is_copied(lookup):
    _, cg, params = lookup
    _set_all(cg, params, read_only=True)
    want = cg.run(ids=_IDS)[0]
    table = params["table"].copy()
    cg.set_param("table", table)  # writable: copied, replacing the binding
    assert "table" not in cg.params_in_place
    table[:] = 0
    np.testing.assert_array_equal(cg.run(ids=_IDS)[0], want)
    # a read-only view of a writable array can still change through its base: copied too
    base = params["table"].copy()
    view = base[:]
    view.flags.writeable = False
    cg.set_param("table", view)
    assert "table" not in cg.params_in_place
    base[:] = 0
    np.testing.assert_array_equal(cg.run(ids=_IDS)[0], want)


def test_setting_a_bound_param_again_replaces_the_binding(lookup):
    g, cg, params = lookup
    _set_all(cg, params, read_only=True)
    other = dict(params, table=params["table"][::-1].copy())
    cg.set_param("table", _read_only(other["table"]))
    assert "table" in cg.params_in_place
    np.testing.assert_allclose(cg.run(ids=_IDS)[0], rlx.reference.run(g, {"ids": _IDS}, other)[0],
                               rtol=1e-5, atol=1e-5)


def test_the_graph_keeps_a_bound_array_alive(lookup):
    import gc
    import weakref

    g, cg, params = lookup
    _set_all(cg, params, read_only=True)
    table = np.frombuffer(params["table"].tobytes(), np.float32).reshape(50, 16)  # read-only: over bytes
    alive = weakref.ref(table)
    cg.set_param("table", table)
    del table
    gc.collect()
    assert alive() is not None and "table" in cg.params_in_place
    np.testing.assert_allclose(cg.run(ids=_IDS)[0], rlx.reference.run(g, {"ids": _IDS}, params)[0],
                               rtol=1e-5, atol=1e-5)
    twin = cg.clone()  # the clone reads the same memory, and keeps it alive too
    cg.set_param("table", params["table"].copy())  # copied: the graph lets go of the bound array
    gc.collect()
    assert alive() is not None and twin.params_in_place == ("table", "gamma", "beta", "b")
    np.testing.assert_array_equal(twin.run(ids=_IDS)[0], cg.run(ids=_IDS)[0])
    del twin
    gc.collect()
    assert alive() is None


def test_a_memory_mapped_weight_is_bound_and_shared_by_concurrent_runs(lookup, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    g, cg, params = lookup
    _set_all(cg, params, read_only=False)
    np.save(tmp_path / "table.npy", params["table"])
    cg.set_param("table", np.load(tmp_path / "table.npy", mmap_mode="r"))  # a read-only np.memmap
    assert cg.params_in_place == ("table",)
    feeds = [np.array(ids, np.int32) for ids in ([1], [2, 3], [49, 0, 5], [7] * 8)]
    want = [rlx.reference.run(g, {"ids": ids}, params)[0] for ids in feeds]
    cg.max_contexts = 4
    with ThreadPoolExecutor(4) as pool:
        with cg._pool.checkout():  # the primary context is lent out: the next run clones one (rlx_clone)
            np.testing.assert_allclose(pool.submit(lambda: cg.run(ids=feeds[3])[0]).result(), want[3],
                                       rtol=1e-5, atol=1e-5)
        assert cg.num_contexts == 2
        got = list(pool.map(lambda i: cg.run(ids=feeds[i % 4])[0], range(32)))  # on any of the contexts
    for i, out in enumerate(got):
        np.testing.assert_allclose(out, want[i % 4], rtol=1e-5, atol=1e-5)


def test_misaligned_read_only_data_is_copied(lookup):
    g, cg, params = lookup
    _set_all(cg, params, read_only=True)
    raw = b"\0" + params["b"].tobytes()
    b = np.frombuffer(raw, np.float32, offset=1)  # read-only, one byte off its 4-byte alignment
    assert not b.flags.aligned
    cg.set_param("b", b)  # rlx_bind_param refuses it: copied
    assert "b" not in cg.params_in_place
    np.testing.assert_allclose(cg.run(ids=_IDS)[0], rlx.reference.run(g, {"ids": _IDS}, params)[0],
                               rtol=1e-5, atol=1e-5)
