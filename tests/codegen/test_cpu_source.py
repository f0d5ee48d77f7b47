"""The generated C source: readable, deterministic, immune to hostile names; the C ABI used
directly (through cffi and from a plain C program); unsupported dtype/op pairs refused at
compile time."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from cpu_helpers import compile_graph

import rlx
from rlx.codegen.cpu.emit import c_string, comment
from rlx.opt.memplan import plan
from rlx.pipeline.cpu import c_context, c_target, render_c
from rlx.runtime.abi import ffi
from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import detect_toolchain

HOSTILE = '*/ #include <stdlib.h>\nstatic int x = system("touch /tmp/rlx_pwned"); /* \\" ??/ \x07'


def _block(name: str = "block") -> rlx.Graph:
    g = rlx.Graph(name)
    seq = rlx.Dim.dynamic("seq", max=32)
    x = g.input("x", [seq, 16])
    w = g.param("w", [16, 16])
    gam = g.param("gamma", [16])
    bet = g.param("beta", [16])
    h = g.add_(g.activation("gelu", g.matmul(x, w)), x)
    g.set_outputs([g.layer_norm(h, gam, bet)])
    return g


def test_one_commented_block_per_scheduled_node():
    lir = plan(_block())
    src = render_c(lir, c_target(detect_toolchain()), {"name": "block"})
    for nid in lir.schedule:
        node = lir.graph.node(nid)
        assert re.search(rf"^/\* %{nid} {node.kind}", src, re.MULTILINE), f"no comment block for %{nid}"
    assert "sym[0]" in src  # dims are expressions of the run-time symbols
    assert src.count("static int rlx_op_") == len(lir.schedule)


def test_context_is_pure_and_rendering_deterministic():
    lir = plan(_block())
    target = c_target(detect_toolchain())
    assert c_context(lir, target, {"k": 1}) == c_context(lir, target, {"k": 1})
    assert render_c(lir, target, {"k": 1}) == render_c(lir, target, {"k": 1})


def test_hostile_names_never_become_code(tmp_path):
    g = rlx.Graph(HOSTILE)
    x = g.input(HOSTILE, [3])
    p = g.param(HOSTILE + "p", [3])
    y = g.add(rlx.ir.ops.Activation("neg"), [g.add_(x, p)], name=HOSTILE)
    g.set_outputs({HOSTILE + "o": y})
    cg = compile_graph(g, {HOSTILE + "p": np.array([1, 2, 3], np.float32)})
    assert cg.run({HOSTILE: np.ones(3, np.float32)})[0].tolist() == [-2, -3, -4]
    assert cg.input_names == [HOSTILE] and cg.output_names == [HOSTILE + "o"]
    src = cg.source
    code = re.sub(r'"(\\.|[^"\\])*"', '""', src)  # drop string literals: what is left is code and comments
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.DOTALL)  # and comments: what is left is code
    assert "system" not in code and "#include <stdlib.h>\nstatic" not in code
    assert "rlx_pwned" not in code


def test_comment_and_string_escaping():
    assert "*/" not in comment("a */ b") and "\n" not in comment("a\nb")
    assert comment("x" * 500, 20).endswith("...") and len(comment("x" * 500, 20)) == 20
    assert c_string('q"\\\n?\x00é') == '"q\\"\\\\\\n\\077\\000\\303\\251"'


def test_unsupported_dtype_op_pairs_are_refused_at_compile_time():
    # f16/bf16 ops the CPU kernels lack are legalized (f32 between casts), not refused
    g = rlx.Graph("ln16")
    x = g.input("x", [2, 8], "f16")
    g.set_outputs([g.layer_norm(x, g.param("g", [8], "f16"), g.param("b", [8], "f16"))])
    cg = compile_graph(g, {"g": np.ones(8, np.float16), "b": np.zeros(8, np.float16)})
    xv = np.arange(16, dtype=np.float16).reshape(2, 8)
    want = rlx.reference.run(g, {"x": xv}, {"g": np.ones(8, np.float16), "b": np.zeros(8, np.float16)})[0]
    np.testing.assert_allclose(cg.run(x=xv)[0], want, rtol=2e-3, atol=1e-3)  # a few f16 ulps
    # other dtypes with no kernel are refused before any build
    g = rlx.Graph("mm64")
    a = g.input("a", [2, 2], "f64")
    g.set_outputs([g.matmul(a, a)])
    with pytest.raises(rlx.BuildError, match="does not support matmul on f64"):
        rlx.Session().compile(g, opt_level=0)


def test_c_abi_directly_through_cffi():
    cg = compile_graph(_block())
    lib = ffi.dlopen(str(cg.library_path))
    ctx = ffi.gc(lib.rlx_create(), lib.rlx_destroy)
    err = lambda: ffi.string(lib.rlx_last_error(ctx)).decode()  # noqa: E731
    w = np.eye(16, dtype=np.float32)
    assert lib.rlx_set_param(ctx, 0, ffi.from_buffer(w), 3) != 0 and "takes 1024 bytes, got 3" in err()
    assert lib.rlx_set_param(ctx, 7, ffi.from_buffer(w), 1024) != 0 and "index 7 is out of range" in err()
    x = np.ones((4, 16), np.float32)
    y = np.empty((4, 16), np.float32)
    sym = ffi.new("int64_t[]", [4])
    ins = ffi.new("void *[]", [ffi.from_buffer(x)])
    outs = ffi.new("void *[]", [ffi.from_buffer(y)])
    assert lib.rlx_run(ctx, sym, ins, outs) != 0 and "param 'w' (#0) was never set" in err()
    for i, arr in enumerate((w, np.ones(16, np.float32), np.zeros(16, np.float32))):
        assert lib.rlx_set_param(ctx, i, ffi.from_buffer(arr), arr.nbytes) == 0
    assert lib.rlx_run(ctx, ffi.NULL, ins, outs) != 0 and "symbols is NULL" in err()
    sym[0] = 33
    assert lib.rlx_run(ctx, sym, ins, outs) != 0 and "'seq' = 33 is outside 1..32" in err()
    sym[0] = 4
    bad_ins = ffi.new("void *[]", [ffi.NULL])
    assert lib.rlx_run(ctx, sym, bad_ins, outs) != 0 and "input 'x' (#0) is NULL" in err()
    assert lib.rlx_run(ctx, sym, ins, outs) == 0 and err() == ""
    assert lib.rlx_set_num_threads(ctx, 0) >= 1 and lib.rlx_set_num_threads(ctx, 1) == 1
    assert lib.rlx_run(ffi.NULL, sym, ins, outs) != 0
    assert np.all(np.isfinite(y))


def test_plain_c_program_uses_the_library(tmp_path):
    """A C user needs only rlx.h and the .so: params in user layout, symbols, inputs, outputs."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    g = rlx.Graph("plain")
    seq = rlx.Dim.dynamic("seq", max=8)
    x = g.input("x", [seq, 3])
    w = g.add(rlx.ir.ops.Param("w", rlx.Shape.of([2, 3]), layout=(1, 0)), name="w")  # user passes [3, 2]
    g.set_outputs([g.matmul(x, g.transpose(w, [1, 0]))])
    cg = compile_graph(g)
    main = tmp_path / "main.c"
    main.write_text("""
#include <stdio.h>
#include "rlx.h"
int main(void) {
    float w[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    float x[2][3] = {{1, 0, 0}, {0, 1, 1}};
    float y[2][2];
    void *ctx = rlx_create();
    if (!ctx || rlx_set_param(ctx, 0, w, sizeof w) != 0) return 2;
    int64_t sym[1] = {2};
    const void *in[1] = {x};
    void *out[1] = {y};
    if (rlx_run(ctx, sym, in, out) != 0) { fprintf(stderr, "%s\\n", rlx_last_error(ctx)); return 3; }
    printf("%g %g %g %g\\n", y[0][0], y[0][1], y[1][0], y[1][1]);
    sym[0] = 9;
    printf("%d %s\\n", rlx_run(ctx, sym, in, out) != 0, rlx_last_error(ctx));
    rlx_destroy(ctx);
    return 0;
}
""")
    exe = tmp_path / "main"
    lib = cg.library_path
    subprocess.run([cc, "-I", str(templates_dir() / "cpu"), str(main), str(lib), f"-Wl,-rpath,{lib.parent}",
                    "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    assert out[0] == "1 2 8 10"
    assert out[1] == "1 dynamic dim 'seq' = 9 is outside 1..8"
