"""The compile report: its data (stages, source lines, memory plan, trace times) and the page in a real browser."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.models import bert as B
from rlx.report.html import build_report_data, render_report, trace_times, write_report

CFG = B.BertConfig(vocab_size=60, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                   max_position_embeddings=40)


@pytest.fixture(scope="module")
def bert_data() -> dict:
    return build_report_data(B.bert_hir(CFG, max_batch=4, max_seq=16))


def test_stages_hir_mir_lir(bert_data: dict):
    names = [s["name"] for s in bert_data["stages"]]
    assert names == ["HIR", "MIR", "LIR"]
    hir, mir, lir = bert_data["stages"]
    assert any(n["kind"] == "hir.linear" for n in hir["nodes"])
    assert not any(n["kind"].startswith("fused") for n in mir["nodes"])
    fused = [n for n in lir["nodes"] if n["group"]]
    assert fused and all(len(n["group"]) >= 2 for n in fused)
    gemm = next(n for n in fused if n["kind"] == "fused_matmul_bias_act")
    assert gemm["group"][:2] == ["matmul", "add bias"] and gemm["name"].startswith("encoder.layer.0.")
    assert gemm["flops"] > 0 and gemm["bytes"] > 0


def test_lir_nodes_link_to_their_kernel_in_the_source(bert_data: dict):
    lir = bert_data["stages"][-1]
    src = bert_data["source"]
    linked = [n for n in lir["nodes"] if n["line"]]
    assert len(linked) >= len([n for n in lir["nodes"] if n["storage"] == "arena"])
    for n in linked:
        head = src[n["line"] - 1]
        assert head.startswith(f"/* %{n['id']} ")
        # next: the node's function, the kernel body it shares with nodes like it, or why it has no code
        assert f"rlx_op_{n['id']}" in src[n["line"]] or "no code" in src[n["line"]], src[n["line"]]


def test_memory_plan_lifetimes_never_overlap(bert_data: dict):
    mem = bert_data["memory"]
    bufs = mem["buffers"]
    assert bufs and all(0 <= b["start"] <= b["end"] <= mem["steps"] for b in bufs)
    assert max(b["offset"] + b["bytes"] for b in bufs) <= mem["arena_bytes"]
    for i, a in enumerate(bufs):  # two buffers live at the same step never share arena bytes
        for b in bufs[i + 1:]:
            live_together = a["start"] <= b["end"] and b["start"] <= a["end"]
            overlap = a["offset"] < b["offset"] + b["bytes"] and b["offset"] < a["offset"] + a["bytes"]
            assert not (live_together and overlap), (a, b)


def test_trace_times_colour_the_lir(tmp_path: Path):
    g = rlx.Graph("traced")
    x = g.input("x", [rlx.Dim.dynamic("n", max=16), 32])
    g.set_outputs([g.softmax(g.activation("gelu", g.matmul(x, g.param("w", [32, 32]))), -1)])
    cg = rlx.Session(profile=True).compile(g)
    cg.set_param("w", np.eye(32, dtype=np.float32))
    cg.run(x=np.ones((16, 32), np.float32))
    trace = json.loads(cg.save_trace(tmp_path / "t.json").read_text())
    data = build_report_data(g, trace=trace)
    times = data["trace"]["times_us"]
    lir_ids = {str(n["id"]) for n in data["stages"][-1]["nodes"]}
    assert times and set(times) <= lir_ids  # the trace's nodes are the report's LIR nodes
    assert data["trace"]["total_us"] == pytest.approx(sum(times.values()))
    assert trace_times({"traceEvents": []}) == {}


def test_page_is_self_contained_and_escapes_names(tmp_path: Path):
    g = rlx.Graph("esc")
    from rlx.ir import ops as O

    x = g.input("x", [4])
    g.set_outputs([g.add(O.Activation("relu"), [x], name="</script><img src=x onerror=alert(1)>")])
    html = render_report(build_report_data(g))
    assert "</script><img" not in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "<link" not in html and " src=" not in html.split("rlx-data")[0]


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the inflated (filtered) scanlines of an 8-bit PNG."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(raw):
        length, ctype = struct.unpack(">I4s", raw[pos:pos + 8])
        body = raw[pos + 8:pos + 8 + length]
        if ctype == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif ctype == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary (apt-get install chromium)")
def test_the_page_renders_the_graphs_in_a_browser(tmp_path: Path):
    page = write_report(B.bert_hir(CFG, max_batch=4, max_seq=16), tmp_path / "report.html")
    data = build_report_data(B.bert_hir(CFG, max_batch=4, max_seq=16))
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
            f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    # the page's script ran and drew every stage's nodes into SVG, the memory plan and the source
    assert 'data-rendered="yes"' in dom
    for stage in data["stages"]:
        svg = dom.split(f'data-stage="{stage["name"]}"', 1)[1].split("</svg>", 1)[0]
        assert svg.count('class="node') == len(stage["nodes"]), stage["name"]
        for n in stage["nodes"][:5]:
            assert f'data-id="{n["id"]}"' in svg
    assert dom.count('class="buffer"') == len(data["memory"]["buffers"])
    assert dom.count('class="line') == len(data["source"])
    assert dom.count('class="group"') == sum(1 for n in data["stages"][-1]["nodes"] if n["group"])
    shot = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1280, 800)
    assert len(set(pixels)) > 16, "the screenshot is blank"


# A DOM just big enough for report.js: elements record their tag, attributes and children; the script's
# output is each stage's SVG as JSON (its markers, its edges' paths and markers, its nodes' boxes).
NODE_DOM = r"""
const fs = require("fs");
class El {
  constructor(tag) { this.tag = tag; this.attrs = {}; this.children = []; this.textContent = "";
    this.classList = {add() {}, remove() {}, toggle() {}}; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  getAttribute(k) { return this.attrs[k]; }
  appendChild(c) { this.children.push(c); return c; }
  addEventListener() {}
  walk(f) { f(this); this.children.forEach(c => c.walk(f)); }
}
const byId = {views: new El("section"), tabs: new El("nav"), details: new El("aside"), summary: new El("p")};
byId["rlx-data"] = Object.assign(new El("script"), {textContent: fs.readFileSync(process.argv[2], "utf8")});
global.document = {getElementById: id => byId[id], createElement: t => new El(t),
                   createElementNS: (ns, t) => new El("svg:" + t), querySelectorAll: () => [], body: new El("body")};
global.location = {hash: ""};
eval(fs.readFileSync(process.argv[3], "utf8"));
const out = [];
byId.views.walk(e => {
  if (e.tag !== "svg:svg" || !e.attrs["data-stage"]) return;
  const stage = {name: e.attrs["data-stage"], markers: {}, edges: [], boxes: {}};
  e.walk(x => {
    if (x.tag === "svg:marker") stage.markers[x.attrs.id] = x.children.some(c => c.tag === "svg:path");
    if (x.tag === "svg:path" && x.attrs["class"] === "edge") stage.edges.push([x.attrs.d, x.attrs["marker-end"]]);
    if (x.tag === "svg:g" && x.attrs["data-id"] !== undefined) stage.boxes[x.attrs["data-id"]] = x.attrs.transform;
  });
  out.push(stage);
});
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node binary to run the page's script")
def test_every_graph_runs_top_down_with_an_arrowhead_on_each_edge(bert_data: dict, tmp_path: Path):
    from rlx.templates_path import templates_dir

    (tmp_path / "data.json").write_text(json.dumps(bert_data))
    (tmp_path / "dom.js").write_text(NODE_DOM)
    proc = subprocess.run(["node", str(tmp_path / "dom.js"), str(tmp_path / "data.json"),
                           str(templates_dir() / "report" / "report.js")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    stages = {s["name"]: s for s in json.loads(proc.stdout)}
    assert list(stages) == ["HIR", "MIR", "LIR"]
    for data in bert_data["stages"]:
        drawn = stages[data["name"]]
        (marker,) = drawn["markers"].items()
        assert marker[1], "the arrowhead marker has no shape"
        assert len(drawn["edges"]) == sum(len(n["inputs"]) for n in data["nodes"])
        for d, end in drawn["edges"]:
            assert end == f"url(#{marker[0]})"
            numbers = [float(v) for v in d.replace("M", " ").replace("C", " ").replace(",", " ").split()]
            assert numbers[-1] > numbers[1], f"{data['name']}: an edge runs upwards: {d}"  # producer above consumer
        top = {int(k): float(t.split(",")[1].rstrip(")")) for k, t in drawn["boxes"].items()}
        for n in data["nodes"]:
            assert all(top[i] < top[n["id"]] for i in n["inputs"]), (data["name"], n["id"])
