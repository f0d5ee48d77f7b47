/* The RLX compile report's script (inlined into the page by rlx/report/html.py).
 * It reads the report data (the <script id="rlx-data"> JSON) and draws every view into the DOM:
 * one layered SVG graph per stage (HIR, MIR, LIR; fused LIR nodes outlined with the ops they fuse,
 * nodes coloured by kernel time when a trace was given), the memory plan as buffer lifetimes
 * against arena offsets, and the generated C source with a line anchor per line.
 * Text from the data is always inserted as text (textContent), never parsed as HTML. */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("rlx-data").textContent);
  var views = document.getElementById("views");
  var tabs = document.getElementById("tabs");
  var details = document.getElementById("details");
  var times = data.trace ? data.trace.times_us : null;
  var maxTime = 0;
  for (var t in times || {}) maxTime = Math.max(maxTime, times[t]);

  function el(tag, attrs, text) {
    var e = tag.indexOf("svg:") === 0 ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function human(n) {
    var units = ["", "K", "M", "G", "T"], i = 0;
    while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i ? n.toFixed(1) : String(n)) + units[i];
  }
  function bytes(n) {
    var units = ["B", "KiB", "MiB", "GiB"], i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }

  /* ── tabs ─────────────────────────────────────────────────────────── */
  var panes = {};
  function addView(name) {
    var pane = el("div", {"class": "view", id: "view-" + name});
    var button = el("button", {type: "button", "data-view": name}, name);
    button.addEventListener("click", function () { show(name); });
    tabs.appendChild(button);
    views.appendChild(pane);
    panes[name] = {pane: pane, button: button};
    return pane;
  }
  function show(name) {
    for (var k in panes) {
      panes[k].pane.classList.toggle("active", k === name);
      panes[k].button.classList.toggle("active", k === name);
    }
  }

  /* ── the graph of one stage, layered top to bottom ────────────────── */
  var W = 190, LINE = 13, GAP_X = 24, GAP_Y = 34;
  function heat(us) {  /* white (no time) to red (the slowest op) */
    var t = maxTime > 0 ? Math.max(0, Math.min(1, us / maxTime)) : 0;
    return "rgb(255," + Math.round(255 - 190 * t) + "," + Math.round(255 - 215 * t) + ")";
  }
  function drawGraph(stage, pane) {
    var byId = {}, depth = {}, layers = [];
    stage.nodes.forEach(function (n) { byId[n.id] = n; });
    /* Ops: one layer below their deepest op input. Leaves (inputs, params, constants): the layer just
       above their first consumer, so weights sit next to the op that reads them. */
    var firstUse = {};
    stage.nodes.forEach(function (n) {  /* nodes come in topological order */
      if (!n.inputs.length) return;
      var d = 1;
      n.inputs.forEach(function (i) { if (depth[i] !== undefined) d = Math.max(d, depth[i] + 1); });
      depth[n.id] = d;
      n.inputs.forEach(function (i) { if (!byId[i].inputs.length) firstUse[i] = Math.min(firstUse[i] || d, d); });
    });
    stage.nodes.forEach(function (n) { if (!n.inputs.length) depth[n.id] = Math.max((firstUse[n.id] || 1) - 1, 0); });
    stage.nodes.forEach(function (n) { (layers[depth[n.id]] = layers[depth[n.id]] || []).push(n); });
    layers = layers.filter(function (l) { return l; });
    var outputs = {};
    stage.outputs.forEach(function (o) { outputs[o] = true; });
    var pos = {}, y = 10, width = 0;
    layers.forEach(function (layer) {
      var tallest = 0;
      layer.forEach(function (n, i) {
        var lines = 2 + (n.name ? 1 : 0) + n.group.length;
        var h = lines * LINE + 10 + (n.group.length ? 8 : 0);
        pos[n.id] = {x: 10 + i * (W + GAP_X), y: y, h: h};
        tallest = Math.max(tallest, h);
      });
      width = Math.max(width, 10 + layer.length * (W + GAP_X));
      y += tallest + GAP_Y;
    });
    var svg = el("svg:svg", {width: width + 10, height: y, "class": "graph", "data-stage": stage.name});
    /* each edge runs down from the bottom of a value's box to the top of its consumer's, ending in an
       arrowhead (one marker per stage's SVG: ids are shared by the whole page) */
    var arrow = "arrow-" + stage.name;
    var marker = el("svg:marker", {id: arrow, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                                   markerHeight: 7, orient: "auto", markerUnits: "strokeWidth"});
    marker.appendChild(el("svg:path", {"class": "arrowhead", d: "M0,0 L10,5 L0,10 z"}));
    svg.appendChild(el("svg:defs")).appendChild(marker);
    var edges = el("svg:g", {"class": "edges"});
    svg.appendChild(edges);
    stage.nodes.forEach(function (n) {
      var p = pos[n.id];
      n.inputs.forEach(function (i) {
        var q = pos[i];
        if (!q) return;
        var x1 = q.x + W / 2, y1 = q.y + q.h, x2 = p.x + W / 2, y2 = p.y, my = (y1 + y2) / 2;
        edges.appendChild(el("svg:path", {"class": "edge", "marker-end": "url(#" + arrow + ")",
                                          d: "M" + x1 + "," + y1 + " C" + x1 + "," + my + " " +
                                             x2 + "," + my + " " + x2 + "," + y2}));
      });
    });
    stage.nodes.forEach(function (n) {
      var p = pos[n.id];
      var leaf = n.inputs.length === 0;
      var cls = "node" + (leaf ? " leaf" : "") + (outputs[n.id] ? " output" : "") + (n.group.length ? " fused" : "");
      var g = el("svg:g", {"class": cls, "data-id": String(n.id), "data-kind": n.kind,
                           transform: "translate(" + p.x + "," + p.y + ")"});
      var box = el("svg:rect", {"class": "box", width: W, height: p.h});
      if (times && stage.name === "LIR" && times[String(n.id)] !== undefined)
        box.setAttribute("style", "fill:" + heat(times[String(n.id)]));
      g.appendChild(box);
      var title = el("svg:title", {}, "%" + n.id + " " + n.op + "\n" + n.shape + (n.name ? "\n" + n.name : "") +
                     (times && times[String(n.id)] !== undefined ? "\n" + times[String(n.id)].toFixed(1) + " us" : ""));
      g.appendChild(title);
      var ty = LINE + 2;
      function text(s, cls) {
        g.appendChild(el("svg:text", {x: 6, y: ty, "class": cls || ""}, s.length > 30 ? s.slice(0, 29) + "\u2026" : s));
        ty += LINE;
      }
      text("%" + n.id + " " + n.kind);
      text(n.shape);
      if (n.name) text(n.name, "name");
      if (n.group.length) {  /* a fusion group: the ops it fuses, outlined */
        var top = ty - LINE + 4;
        g.appendChild(el("svg:rect", {"class": "group", x: 3, y: top, width: W - 6, height: n.group.length * LINE + 6}));
        ty += 4;
        n.group.forEach(function (part) { text("\u2022 " + part); });
      }
      g.addEventListener("click", function () { select(stage, n, g); });
      svg.appendChild(g);
    });
    pane.appendChild(el("p", {"class": "legend"}, stage.name + ": " + stage.nodes.length + " nodes, inputs at the top, " +
      "arrows from each value to its consumers" +
      (stage.name === "LIR" ? "; dashed outlines: fusion groups" + (times ? "; red: share of kernel time" : "") : "")));
    pane.appendChild(svg);
  }

  function select(stage, n, g) {
    document.querySelectorAll(".node.selected").forEach(function (s) { s.classList.remove("selected"); });
    g.classList.add("selected");
    details.textContent = "";
    details.appendChild(el("h2", {}, stage.name + " %" + n.id + " " + n.kind));
    var dl = el("dl");
    function row(k, v) { dl.appendChild(el("dt", {}, k)); dl.appendChild(el("dd", {}, v)); }
    row("op", n.op);
    row("shape", n.shape);
    if (n.name) row("source name", n.name);
    row("inputs", n.inputs.map(function (i) { return "%" + i; }).join(", ") || "none");
    if (n.storage) row("storage", n.storage);
    row("cost at the bounds", human(n.flops) + "FLOP, " + bytes(n.bytes));
    if (n.group.length) row("fuses", n.group.join("; "));
    if (times && times[String(n.id)] !== undefined)
      row("kernel time", times[String(n.id)].toFixed(1) + " us (" +
          (100 * times[String(n.id)] / data.trace.total_us).toFixed(1) + "% of the traced kernel time)");
    details.appendChild(dl);
    if (n.line) {
      var a = el("a", {href: "#L" + n.line, "class": "source-link"}, "generated C: line " + n.line);
      a.addEventListener("click", function (ev) { ev.preventDefault(); gotoLine(n.line); });
      details.appendChild(el("p")).appendChild(a);
    }
  }

  /* ── the memory plan: buffers as rectangles, schedule step x arena offset ── */
  function drawMemory(pane) {
    var m = data.memory, H = 420, LEFT = 70, Wm = Math.max(600, m.steps * 8);
    pane.appendChild(el("p", {"class": "legend"}, "arena " + bytes(m.arena_bytes) + " (naive " + bytes(m.naive_bytes) +
      "), " + m.buffers.length + " buffers over " + m.steps + " scheduled nodes; x: schedule step, y: arena offset"));
    var svg = el("svg:svg", {width: LEFT + Wm + 20, height: H + 40, "class": "memory"});
    var sx = Wm / Math.max(m.steps, 1), sy = H / Math.max(m.arena_bytes, 1);
    svg.appendChild(el("svg:line", {"class": "axis", x1: LEFT, y1: 10, x2: LEFT, y2: H + 10}));
    svg.appendChild(el("svg:line", {"class": "axis", x1: LEFT, y1: H + 10, x2: LEFT + Wm, y2: H + 10}));
    svg.appendChild(el("svg:text", {x: 4, y: 20}, bytes(m.arena_bytes)));
    svg.appendChild(el("svg:text", {x: 4, y: H + 10}, "0"));
    m.buffers.forEach(function (b, i) {
      var r = el("svg:rect", {"class": "buffer", "data-id": String(b.id), x: LEFT + b.start * sx, y: 10 + H - (b.offset + b.bytes) * sy,
                              width: Math.max((b.end - b.start + 1) * sx, 2), height: Math.max(b.bytes * sy, 1),
                              fill: "hsl(" + ((i * 47) % 360) + ",65%,62%)"});
      r.appendChild(el("svg:title", {}, "%" + b.id + " " + b.kind + " " + b.shape + (b.name ? " (" + b.name + ")" : "") +
                       "\narena[" + b.offset + ":" + (b.offset + b.bytes) + "] live steps " + b.start + ".." + b.end));
      svg.appendChild(r);
    });
    pane.appendChild(svg);
  }

  /* ── the generated source ─────────────────────────────────────────── */
  var sourcePane;
  function drawSource(pane) {
    var pre = el("pre", {"class": "source"});
    data.source.forEach(function (line, i) {
      pre.appendChild(el("span", {"class": "line", id: "L" + (i + 1), "data-n": String(i + 1)}, line));
    });
    pane.appendChild(pre);
    sourcePane = pane;
  }
  function gotoLine(n) {
    show("Source");
    document.querySelectorAll(".line.hit").forEach(function (s) { s.classList.remove("hit"); });
    var line = document.getElementById("L" + n);
    if (!line) return;
    for (var i = 0; i < 12 && line; i++, line = line.nextElementSibling) line.classList.add("hit");
    document.getElementById("L" + n).scrollIntoView({block: "start"});
  }

  var syms = data.symbols.map(function (s) { return s[0] + "\u2264" + s[1]; }).join(", ") || "none";
  document.getElementById("summary").textContent = "-O" + data.opt_level + ", dynamic dims " + syms + "; " +
    data.stages.map(function (s) { return s.name + " " + s.nodes.length + " nodes"; }).join(", ") +
    (data.trace ? "; kernel time traced: " + (data.trace.total_us / 1000).toFixed(3) + " ms" : "");
  data.stages.forEach(function (stage) { drawGraph(stage, addView(stage.name)); });
  drawMemory(addView("Memory"));
  drawSource(addView("Source"));
  /* #HIR, #MIR, #LIR, #Memory or #Source in the address opens that view; the LIR otherwise */
  var wanted = decodeURIComponent(location.hash.slice(1));
  show(panes[wanted] ? wanted : data.stages[data.stages.length - 1].name);
  document.body.setAttribute("data-rendered", "yes");
})();
