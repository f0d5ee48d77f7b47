"""The Metal toolchain probe, the program written by `rlxc compile --target metal`, and its cache keying."""

from __future__ import annotations

import json
import platform

import rlx
from rlx.cli import main
from rlx.config import Config
from rlx.driver import lower_to_lir
from rlx.ir.serialize import save
from rlx.pipeline.metal import build_metal
from rlx.toolchain.metal import find_metal_toolchain, metal_toolchain_report


def _graph() -> rlx.Graph:
    g = rlx.Graph("tiny")
    x = g.input("x", [2, rlx.Dim.dynamic("n", max=8)])
    g.set_outputs([g.softmax(g.activation("gelu", x), -1)])
    return g


def test_toolchain_is_reported_or_its_absence():
    report = metal_toolchain_report()
    if platform.system() != "Darwin":
        assert find_metal_toolchain() is None
        assert "no Metal toolchain" in report
    else:
        assert report.startswith("metal:")


def test_builds_are_keyed_and_hit(tmp_path):
    config = Config(cache_dir=tmp_path / "cache")
    lir = lower_to_lir(_graph(), 2, backend="metal")
    first = build_metal(lir, config)
    again = build_metal(lir, config)
    assert (first.hit, again.hit, first.key == again.key) == (False, True, True)
    other = build_metal(lower_to_lir(_graph(), 0, backend="metal"), config)
    assert other.key != first.key or other.components["lir"] == first.components["lir"]
    manifest = json.loads(first.manifest.read_text())
    assert manifest["backend"] == "metal" and [d["kernel"] for d in manifest["dispatches"]]
    assert "kernel void" in first.source.read_text()


def test_rlxc_compile_inspect_doctor_target_metal(tmp_path, capsys):
    save(_graph(), tmp_path / "g.json")
    assert main(["compile", str(tmp_path / "g.json"), "--target", "metal", "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.metal").is_file() and (tmp_path / "out" / "manifest.json").is_file()
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "g.json"), "--stage", "source", "--target", "metal"]) == 0
    out = capsys.readouterr().out
    assert "#include <metal_stdlib>" in out and "simd_sum" in out
    main(["doctor"])
    assert any(line.startswith("metal ") for line in capsys.readouterr().out.splitlines())


def test_metallib_build_commands_with_a_stand_in_toolchain(tmp_path):
    """The macOS build step's commands (source → .air → .metallib), run against stand-in executables that
    record their arguments: what `xcrun metal` would be asked, checked where there is no Xcode."""
    log = tmp_path / "calls.txt"
    tools = {}
    for name in ("metal", "metallib"):
        exe = tmp_path / name
        # the stand-in appends its argv to the log and creates the file after -o
        exe.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nwhile [ $# -gt 1 ]; do [ "$1" = -o ] && : > "$2"; '
                       f"shift; done\n")
        exe.chmod(0o755)
        tools[name] = str(exe)
    from rlx.pipeline.metal import write_metal
    from rlx.toolchain.metal import MetalToolchain

    tc = MetalToolchain(tools["metal"], tools["metallib"], "stand-in 1.0")
    built = write_metal(lower_to_lir(_graph(), 2, backend="metal"), tmp_path / "out", toolchain=tc)
    assert built.metallib is not None and built.metallib.is_file()
    compile_line, link_line = log.read_text().splitlines()
    assert compile_line.startswith("metal -std=metal3.1 -fno-fast-math -c ") and compile_line.endswith("model.air")
    assert link_line.startswith("metallib ") and link_line.endswith("model.metallib")
    assert built.components["toolchain"] == "metal stand-in 1.0"


def test_rlxc_emit_source_for_metal(tmp_path, capsys):
    save(_graph(), tmp_path / "g.json")
    assert main(["compile", str(tmp_path / "g.json"), "--target", "metal", "--emit-source"]) == 0
    assert "kernel void rlx_k" in capsys.readouterr().out
