// tiny VIZ: the page. Reads /trace.jsonl (format: tiny_tensor/viz/recorder.py), lists the schedules and kernels,
// shows a context's steps, each step's graph laid out in layers (our own layout, below), a diff of the graph before and
// after a step, the rules that fired, the kernel's source, and a timeline of launches per device.
// Routing is by location.hash (#ctx=ID&step=K&mode=after|before|diff&tab=rules|source|node, or #timeline), so every
// view has a link and the browser's back button works. Graph walks are iterative: graphs can be deep.
// Every text from the trace goes into the page as text: elements are built with E()/S() below (createElement,
// setAttribute, text nodes), never by parsing HTML, so a trace cannot inject markup or script (the server also sends
// a Content-Security-Policy that allows only this file's script).
"use strict";

const MAX_NODES = 2500;   // nodes drawn at most; bigger graphs show the part nearest the root
const GAP_X = 14, GAP_Y = 34, ROW_H = 34, CHAR_W = 6.7;

const T = { header: null, nodes: [], rules: [], ctx: new Map(), launches: [] };   // the trace
const V = { ctx: null, step: 0, mode: "after", tab: "rules", sel: null, hideNoop: false, graph: null, view: null,
            tlCollapse: true, collapse: true, leaf: null };
const topoCache = new Map();

const $ = (id) => document.getElementById(id);
const SVG_NS = "http://www.w3.org/2000/svg";
// an element `tag` with attributes `attrs` (names from this file; values set as attribute text) and children: nodes,
// or anything else inserted as a text node; null/false/"" children are left out
function build(el, attrs, kids) {
  for (const k in attrs || {}) if (attrs[k] != null && attrs[k] !== false) el.setAttribute(k, String(attrs[k]));
  for (const c of kids.flat()) if (c != null && c !== false && c !== "") el.append(c instanceof Node ? c : String(c));
  return el;
}
const E = (tag, attrs, ...kids) => build(document.createElement(tag), attrs, kids);   // HTML
const S = (tag, attrs, ...kids) => build(document.createElementNS(SVG_NS, tag), attrs, kids);   // SVG
const short = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

// ***** loading *****
// what each record's fields must be (the format: tiny_tensor/viz/recorder.py; the same checks as viz/reader.py)
const isId = (x) => Number.isInteger(x) && x >= 0, isStr = (x) => typeof x === "string";
const isNum = (x) => typeof x === "number" && Number.isFinite(x);
const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
const orNull = (f) => (x) => x === null || f(x), isIds = (x) => Array.isArray(x) && x.every(isId);
const isPair = (p) => isIds(p) && p.length === 2;   // [rule id, times fired]
const RECORDS = {
  n: [isId, isStr, isStr, isStr, isIds, orNull(isStr)],
  r: [isId, isStr, isStr, isStr],
  s: [isId, isId, isStr, isId, orNull(isId), isId, (x) => Array.isArray(x) && x.every(isPair), isNum, isStr],
  c: [isId, isStr, isStr, orNull(isId), isObj],
  l: [isStr, isStr, isNum, isNum],
};
const INFO = { source: orNull(isStr), device: isStr, renderer: isStr, error: isStr, ast: isId, kernels: isIds,
               calls: isId, uops: isId, outputs: isId, ms: isNum };
function checkRecord(r, line) {
  const bad = (what) => { throw new Error(`trace line ${line}: ${what}`); };
  if (!Array.isArray(r) || !r.length) bad("a record is a non-empty JSON array");
  if (r[0] === "tiny-viz") {
    if (r.length !== 3 || r[1] !== 1 || !isObj(r[2])) bad('the header must be ["tiny-viz", 1, {...}] (version 1)');
    return;
  }
  const f = Object.prototype.hasOwnProperty.call(RECORDS, r[0]) ? RECORDS[r[0]] : null;
  if (!f) bad(`unknown record type ${JSON.stringify(r[0]).slice(0, 40)}`);
  if (r.length !== f.length + 1) bad(`a ${r[0]} record has ${f.length + 1} items, got ${r.length}`);
  f.forEach((ok, k) => { if (!ok(r[k + 1])) bad(`item ${k + 1} of a ${r[0]} record has the wrong type`); });
  if (r[0] === "n") for (const s of r[5]) if (!T.nodes[s]) bad(`node ${r[1]} refers to node ${s}, undefined before it`);
  if (r[0] === "s") {
    for (const n of [r[4], r[5]]) if (n != null && !T.nodes[n]) bad(`step ${r[1]} refers to undefined node ${n}`);
  }
  if (r[0] === "c") {
    for (const k in INFO) if (k in r[5] && !INFO[k](r[5][k])) bad(`info.${k} of context ${r[1]} has the wrong type`);
    if ("ast" in r[5] && !T.nodes[r[5].ast]) bad(`info.ast of context ${r[1]} refers to undefined node ${r[5].ast}`);
  }
}
function parseTrace(text) {
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (!line) continue;
    let r;
    try { r = JSON.parse(line); } catch (e) { throw new Error(`trace line ${i + 1}: not JSON (${e.message})`); }
    checkRecord(r, i + 1);
    switch (r[0]) {
      case "tiny-viz": T.header = r[2]; break;
      case "n": T.nodes[r[1]] = { op: r[2], dt: r[3], arg: r[4], src: r[5], tag: r[6] }; break;
      case "r": T.rules[r[1]] = { fn: r[2], where: r[3], pat: r[4] }; break;
      case "s": stepsOf(r[2]).push({ id: r[1], name: r[3], before: r[4], after: r[5], depth: r[6], rules: r[7], ms: r[8],
                                     kind: r[9] }); break;
      case "c": Object.assign(ctxOf(r[1]), { kind: r[2], name: r[3], parent: r[4], info: r[5] || {} }); break;
      case "l": T.launches.push({ dev: r[1], name: r[2], start: r[3], ms: r[4] }); break;
      default: throw new Error(`trace line ${i + 1}: unknown record ${JSON.stringify(r[0])}`);
    }
  }
  if (!T.header) throw new Error("not a VIZ trace (no tiny-viz header line)");
  for (const c of T.ctx.values()) {
    c.steps.sort((a, b) => a.id - b.id);
    if (!c.kind) Object.assign(c, { kind: "unfinished", name: `context ${c.id} (did not finish)`, info: {} });
  }
}
function ctxOf(id) {
  if (!T.ctx.has(id)) T.ctx.set(id, { id, steps: [], kind: null, name: "", info: {} });
  return T.ctx.get(id);
}
function stepsOf(cid) { return ctxOf(cid).steps; }

// ***** graphs *****
// node ids under `roots` (restricted to `allow` when given; the sources of nodes in `leaf` left out), sources first
function topo(roots, allow, leaf) {
  const out = [], seen = new Set(), stack = [];
  for (let i = roots.length - 1; i >= 0; i--) if (roots[i] != null) stack.push(roots[i], 0);
  while (stack.length) {
    const ready = stack.pop(), n = stack.pop();
    if (seen.has(n)) continue;
    if (ready) { seen.add(n); out.push(n); continue; }
    stack.push(n, 1);
    const src = leaf && leaf.has(n) ? [] : T.nodes[n].src;
    for (let i = src.length - 1; i >= 0; i--) {
      const s = src[i];
      if (!seen.has(s) && (!allow || allow.has(s))) stack.push(s, 0);
    }
  }
  return out;
}
function graphOf(root) {
  if (root == null) return [];
  if (!topoCache.has(root)) topoCache.set(root, topo([root]));
  return topoCache.get(root);
}
// at most MAX_NODES nodes: those nearest the roots (breadth first)
function nearest(roots, limit, leaf) {
  const keep = new Set(), queue = roots.filter((r) => r != null);
  for (let qi = 0; qi < queue.length && keep.size < limit; qi++) {
    const n = queue[qi];
    if (keep.has(n)) continue;
    keep.add(n);
    if (leaf && leaf.has(n)) continue;
    for (const s of T.nodes[n].src) if (!keep.has(s)) queue.push(s);
  }
  return keep;
}
function stepDelta(step) {
  if (step.delta) return step.delta;
  const a = graphOf(step.before), b = graphOf(step.after);
  const sa = new Set(a), sb = new Set(b);
  let added = 0, removed = 0;
  for (const n of b) if (!sa.has(n)) added++;
  for (const n of a) if (!sb.has(n)) removed++;
  step.delta = { added, removed, nBefore: a.length, nAfter: b.length };
  return step.delta;
}

const OP_COLORS = [
  [/^(BUFFER|PARAM|DEFINE_VAR|DEFINE_REG|DEFINE_LOCAL|UNIQUE|DEVICE|BIND)$/, "#e3ecfb"],
  [/^(CONST|VCONST)$/, "#f1f1f1"],
  [/^(RESHAPE|PERMUTE|EXPAND|PAD|SHRINK|FLIP)$/, "#fdf1d8"],
  [/^(LOAD|STORE|INDEX)$/, "#dff3f6"],
  [/^(RANGE|END|IF|ENDIF|BARRIER|SPECIAL)$/, "#efe3fb"],
  [/^(REDUCE|REDUCE_AXIS|WMMA)$/, "#fbe0e9"],
  [/^(SINK|KERNEL|CALL|LINEAR|PROGRAM|COPY|SLICE|ASSIGN|CONTIGUOUS|AFTER|GROUP|NOOP)$/, "#fde6cf"],
  [/^(VECTORIZE|GEP|CAT|PTRCAT|UNROLL|CONTRACT)$/, "#e6f4df"],
];
function opColor(op) {
  for (const [re, c] of OP_COLORS) if (re.test(op)) return c;
  return "#ffffff";   // ALU
}
function nodeLabel(n, id) {
  const l1 = n.dt && n.dt !== "void" ? `${n.op} ${n.dt}` : n.op;
  const k = id != null && V.leaf && V.leaf.has(id) ? kernelOfAst().get(id) : null;
  const l2 = k ? `kernel ${short(k.name, 26)} ▸` : n.arg ? short(n.arg, 34) : "";
  return [l1, l2];
}

// Layered layout (Sugiyama style, our own): a node's layer is its longest path to a graph output (outputs at the
// bottom, sources above their users); order within layers by barycenter sweeps; x by placing each layer's nodes as
// near as the order allows to the mean x of their neighbours, from both sides, averaged.
function layout(ids, leaf) {
  const inSet = new Set(ids), N = ids.length;
  const users = new Map(), srcs = new Map(), W = new Map(), H = new Map(), rank = new Map();
  for (const id of ids) { users.set(id, []); srcs.set(id, []); }
  for (const id of ids) {
    const seen = new Set();
    for (const s of leaf && leaf.has(id) ? [] : T.nodes[id].src) {
      if (!inSet.has(s) || seen.has(s)) continue;
      seen.add(s); srcs.get(id).push(s); users.get(s).push(id);
    }
    const [l1, l2] = nodeLabel(T.nodes[id], id);
    W.set(id, Math.max(44, Math.max(l1.length, l2.length) * CHAR_W + 14));
    H.set(id, l2 ? ROW_H : 20);
  }
  let maxRank = 0;
  for (let i = N - 1; i >= 0; i--) {   // ids are topological: users come later, so walk backwards
    const id = ids[i];
    let r = 0;
    for (const u of users.get(id)) r = Math.max(r, rank.get(u) + 1);
    rank.set(id, r);
    maxRank = Math.max(maxRank, r);
  }
  const layers = Array.from({ length: maxRank + 1 }, () => []);
  for (const id of ids) layers[rank.get(id)].push(id);   // initial order: depth-first discovery
  const X = new Map();   // centre x
  const pack = (layer) => {
    let w = 0;
    for (const id of layer) w += W.get(id) + GAP_X;
    let x = -w / 2;
    for (const id of layer) { X.set(id, x + W.get(id) / 2); x += W.get(id) + GAP_X; }
  };
  layers.forEach(pack);
  const mean = (arr, fallback) => {
    if (!arr.length) return fallback;
    let s = 0;
    for (const v of arr) s += X.get(v);
    return s / arr.length;
  };
  const big = N > 1500;
  for (let it = 0; it < (big ? 2 : 4); it++) {   // order: sweep down (by sources), then up (by users)
    for (let r = maxRank - 1; r >= 0; r--) reorder(layers[r], (id) => mean(srcs.get(id), X.get(id)));
    for (let r = 1; r <= maxRank; r++) reorder(layers[r], (id) => mean(users.get(id), X.get(id)));
  }
  function reorder(layer, key) {
    const k = new Map(layer.map((id, i) => [id, [key(id), i]]));
    layer.sort((a, b) => (k.get(a)[0] - k.get(b)[0]) || (k.get(a)[1] - k.get(b)[1]));
    pack(layer);
  }
  const place = (layer, want) => {   // keep the order, no overlap, each node as close to want(id) as possible
    const n = layer.length, L = new Array(n), R = new Array(n);
    for (let i = 0; i < n; i++) {
      const w = W.get(layer[i]), d = want(layer[i]) - w / 2;
      L[i] = i ? Math.max(d, L[i - 1] + W.get(layer[i - 1]) + GAP_X) : d;
    }
    for (let i = n - 1; i >= 0; i--) {
      const w = W.get(layer[i]), d = want(layer[i]) - w / 2;
      R[i] = i < n - 1 ? Math.min(d, R[i + 1] - w - GAP_X) : d;
    }
    for (let i = 0; i < n; i++) X.set(layer[i], (L[i] + R[i]) / 2 + W.get(layer[i]) / 2);
  };
  for (let it = 0; it < (big ? 2 : 5); it++) {
    for (let r = maxRank - 1; r >= 0; r--) place(layers[r], (id) => mean(srcs.get(id).concat(users.get(id)), X.get(id)));
    for (let r = 1; r <= maxRank; r++) place(layers[r], (id) => mean(users.get(id).concat(srcs.get(id)), X.get(id)));
  }
  const pos = new Map();
  let minX = Infinity, maxX = -Infinity;
  for (const id of ids) {
    const x = X.get(id) - W.get(id) / 2, y = (maxRank - rank.get(id)) * (ROW_H + GAP_Y);
    pos.set(id, { x, y, w: W.get(id), h: H.get(id) });
    minX = Math.min(minX, x); maxX = Math.max(maxX, x + W.get(id));
  }
  return { pos, srcs, bbox: { x: minX, y: 0, w: maxX - minX, h: maxRank * (ROW_H + GAP_Y) + ROW_H } };
}

// "vs prev": the graph of the step before this one at the same nesting depth or above (the pipeline's previous
// state; between two steps a stage that is not a graph_rewrite may have changed it), else this step's input
function previousGraph(step) {
  const steps = V.ctx.steps, i = steps.indexOf(step);
  for (let j = i - 1; j >= 0; j--) {
    const p = steps[j];
    if (p.depth <= step.depth) return p.after != null ? p.after : p.before;
  }
  return step.before;
}

function renderGraph(step) {
  const svg = $("graph");
  const mode = V.mode;
  let roots, status = null;
  if (mode === "before" || step.after == null) roots = [step.before];
  else if (mode === "after") roots = [step.after];
  else {   // diff: the union of two graphs, what the later one added and removed marked
    const old = mode === "prev" ? previousGraph(step) : step.before;
    roots = [step.after, old];
    const a = new Set(graphOf(old)), b = new Set(graphOf(step.after));
    status = (n) => (b.has(n) ? (a.has(n) ? "" : "added") : "removed");
  }
  roots = roots.filter((r, i) => r != null && roots.indexOf(r) === i);
  // a schedule's CALLs hold whole kernel ASTs: drawn as one node each unless asked for
  const kernels = new Set();
  for (const r of roots) for (const n of graphOf(r)) {
    const x = T.nodes[n];
    if (x.op === "CALL" && x.src.length && T.nodes[x.src[0]].op === "SINK") kernels.add(x.src[0]);
  }
  $("collapse-wrap").hidden = !kernels.size;
  const leaf = V.leaf = kernels.size && V.collapse ? kernels : null;
  const total = leaf ? topo(roots, null, leaf).length : new Set(roots.flatMap(graphOf)).size;
  const allow = total > MAX_NODES ? nearest(roots, MAX_NODES, leaf) : null;
  const ids = topo(roots, allow, leaf);
  const lay = layout(ids, leaf);
  const edges = [], nodes = [];
  let nAdded = 0, nRemoved = 0;
  for (const id of ids) {
    const p = lay.pos.get(id), ss = lay.srcs.get(id);
    ss.forEach((s, k) => {
      const q = lay.pos.get(s);
      const x1 = q.x + q.w / 2, y1 = q.y + q.h, x2 = p.x + (p.w * (k + 1)) / (ss.length + 1), y2 = p.y;
      const dy = Math.max(20, (y2 - y1) / 2);
      const cls = status ? (status(id) === "removed" || status(s) === "removed" ? " removed"
        : (status(id) === "added" || status(s) === "added" ? " added" : "")) : "";
      edges.push(S("path", { class: `edge${cls}`, "data-s": s, "data-t": id,
                             d: `M${x1},${y1} C${x1},${y1 + dy} ${x2},${y2 - dy} ${x2},${y2}` }));
    });
    const n = T.nodes[id], [l1, l2] = nodeLabel(n, id);
    const st = (status ? status(id) : "") + (leaf && leaf.has(id) ? " collapsed" : "");
    if (st.startsWith("added")) nAdded++;
    if (st.startsWith("removed")) nRemoved++;
    const sp = l1.indexOf(" ");
    const t1 = sp < 0 ? [S("tspan", { class: "op" }, l1)]
      : [S("tspan", { "font-weight": 700 }, l1.slice(0, sp)), l1.slice(sp)];
    nodes.push(S("g", { class: `node${st ? " " + st : ""}${V.sel === id ? " sel" : ""}`, "data-id": id,
                        transform: `translate(${p.x},${p.y})` },
      S("title", {}, `#${id} ${n.op} ${n.dt}${n.arg ? "\n" + n.arg : ""}`),
      S("rect", { width: p.w, height: p.h, fill: opColor(n.op) }),
      S("text", { x: 7, y: 14 }, t1), l2 ? S("text", { x: 7, y: 28 }, l2) : null));
  }
  svg.replaceChildren(S("g", { id: "vp" }, edges, nodes));
  V.graph = { bbox: lay.bbox, ids };
  svg.dataset.nodes = ids.length;
  svg.dataset.added = nAdded;
  svg.dataset.removed = nRemoved;
  const info = `${ids.length} nodes` + (allow ? ` (of ${total}: the ${MAX_NODES} nearest the root)` : "") +
    (leaf ? `, ${leaf.size} kernels as one node each` : "");
  $("graph-info").replaceChildren(info, ...(status ? [" · ", E("span", { class: "plus" }, `+${nAdded} added`), " ",
                                                      E("span", { class: "minus" }, `−${nRemoved} removed`)] : []));
  fitGraph();
}

// ***** pan and zoom *****
function applyView() {
  const vp = $("vp");
  if (vp && V.view) vp.setAttribute("transform", `translate(${V.view.x},${V.view.y}) scale(${V.view.k})`);
}
function fitGraph() {
  const svg = $("graph"), b = V.graph && V.graph.bbox;
  if (!b) return;
  const W = svg.clientWidth || 800, H = svg.clientHeight || 600, pad = 20;
  const k = Math.min(1.2, (W - 2 * pad) / Math.max(b.w, 1), (H - 2 * pad) / Math.max(b.h, 1));
  const kk = Math.max(k, 0.35);   // too small to read: start readable at the bottom (the outputs), pan up for more
  V.view = { k: kk, x: (W - b.w * kk) / 2 - b.x * kk, y: b.h * kk <= H - 2 * pad ? (H - b.h * kk) / 2 : H - pad - b.h * kk };
  if (b.w * kk > W) V.view.x = W / 2 - (b.x + b.w / 2) * kk;
  applyView();
}
function setupPanZoom() {
  const svg = $("graph");
  let drag = null;
  svg.addEventListener("mousedown", (e) => {
    if (!V.view) return;
    drag = { x: e.clientX, y: e.clientY, vx: V.view.x, vy: V.view.y, moved: false };
    svg.classList.add("dragging");
  });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    V.view.x = drag.vx + dx; V.view.y = drag.vy + dy;
    applyView();
  });
  window.addEventListener("mouseup", (e) => {
    if (!drag) return;
    const moved = drag.moved;
    drag = null;
    svg.classList.remove("dragging");
    if (!moved) {
      const g = e.target.closest && e.target.closest("g.node");
      if (g) selectNode(+g.dataset.id);
    }
  });
  svg.addEventListener("wheel", (e) => {
    if (!V.view) return;
    e.preventDefault();
    const r = svg.getBoundingClientRect(), mx = e.clientX - r.left, my = e.clientY - r.top;
    const f = Math.exp(-e.deltaY * 0.0015), k = Math.min(4, Math.max(0.02, V.view.k * f));
    V.view.x = mx - ((mx - V.view.x) * k) / V.view.k;
    V.view.y = my - ((my - V.view.y) * k) / V.view.k;
    V.view.k = k;
    applyView();
  }, { passive: false });
  $("fit").addEventListener("click", fitGraph);
}

function selectNode(id) {
  V.sel = id;
  for (const g of document.querySelectorAll("g.node.sel")) g.classList.remove("sel");
  for (const p of document.querySelectorAll("path.edge.hl")) p.classList.remove("hl");
  const g = document.querySelector(`g.node[data-id="${id}"]`);
  if (g) g.classList.add("sel");
  for (const p of document.querySelectorAll(`path.edge[data-s="${id}"], path.edge[data-t="${id}"]`)) p.classList.add("hl");
  renderNodeTab();
  setTab("node", false);
}

let astIndex = null;
function kernelOfAst() {   // kernel AST node id -> its kernel context
  if (!astIndex) {
    astIndex = new Map();
    for (const c of T.ctx.values()) if (c.kind === "kernel" && !astIndex.has(c.info.ast)) astIndex.set(c.info.ast, c);
  }
  return astIndex;
}

// ***** side list *****
function ctxLink(c) {
  const a = document.createElement("a");
  a.href = `#ctx=${c.id}`;
  a.dataset.ctx = c.id;
  let sub = `${c.steps.length} steps`;
  if (c.kind === "kernel") sub = `${c.info.device || "?"} · ${sub}`;
  a.append(c.name, E("span", { class: "sub" }, sub));
  a.title = `${c.name} (${sub})` + (c.info.error ? `\n${c.info.error}` : "");
  const li = document.createElement("li");
  li.dataset.ctx = c.id;
  li.dataset.name = c.name.toLowerCase();
  if (c.info.error) li.classList.add("error");
  li.appendChild(a);
  return li;
}
function buildSide() {
  const lists = { kernel: $("kernels"), schedule: $("schedules") };
  let nk = 0, ns = 0, no = 0;
  for (const c of T.ctx.values()) {
    const ul = lists[c.kind] || $("others");
    ul.appendChild(ctxLink(c));
    if (c.kind === "kernel") nk++; else if (c.kind === "schedule") ns++; else no++;
  }
  $("n-kernels").textContent = `(${nk})`;
  $("n-schedules").textContent = `(${ns})`;
  if (!no) $("other-head").hidden = true;
  const h = T.header || {};
  const argv = (h.argv || []).join(" ");
  $("trace-info").textContent = `${argv || "trace"} · ${nk} kernels, ${ns} schedules, ${T.nodes.length} nodes, ` +
    `${T.launches.length} launches` + (h.time ? ` · ${new Date(h.time * 1000).toLocaleString()}` : "");
  $("filter").addEventListener("input", (e) => {
    const q = e.target.value.toLowerCase();
    for (const li of document.querySelectorAll(".ctx-list li")) li.hidden = q && !li.dataset.name.includes(q);
  });
}

// ***** a context: its steps, graph and details *****
function showView(id) { for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== id; }

function renderCtx(c, stepIdx) {
  showView("ctx-view");
  for (const li of document.querySelectorAll(".ctx-list li")) li.classList.toggle("sel", +li.dataset.ctx === c.id);
  const i = c.info, meta = [c.kind];
  if (i.device) meta.push(`on ${i.device}`);
  if (i.renderer) meta.push(i.renderer);
  if (i.calls != null) meta.push(`${i.calls} calls`);
  if (i.uops != null) meta.push(`${i.uops} linear uops`);
  if (i.ms != null) meta.push(`${i.ms.toFixed(1)} ms`);
  meta.push(`${c.steps.length} steps`);
  $("ctx-head").replaceChildren(E("h2", {}, c.name), E("span", { class: "meta" }, meta.join(" · ")),
                               i.error ? E("div", { class: "error" }, i.error) : "");
  if (V.ctx !== c) {
    V.ctx = c;
    const ol = $("steps");
    ol.replaceChildren();
    c.steps.forEach((s, k) => {
      const d = stepDelta(s);
      const li = document.createElement("li");
      li.dataset.step = k;
      if (!d.added && !d.removed) li.classList.add("noop");
      const fired = s.rules.reduce((a, r) => a + r[1], 0);
      const nm = E("span", { class: "nm" }, s.name);
      nm.style.paddingLeft = `${s.depth * 10}px`;   // the style object: the CSP allows no style attribute
      const title = `${s.name}: ${fired} rewrites, +${d.added} −${d.removed} nodes, ${s.ms} ms`;
      li.append(E("a", { href: `#ctx=${c.id}&step=${k}`, title },
        E("span", { class: "idx" }, k), nm,
        s.kind !== "rewrite" ? E("span", { class: `kind ${s.kind}` }, s.kind) : null,
        E("span", { class: "delta" }, d.added ? E("span", { class: "plus" }, `+${d.added}`) : null,
          d.added ? " " : null, d.removed ? E("span", { class: "minus" }, `−${d.removed}`) : null)));
      ol.appendChild(li);
    });
    applyHideNoop();
  }
  if (!c.steps.length) {
    $("graph").replaceChildren();
    $("graph-info").textContent = "no steps: compiled before recording started";
    $("step-title").textContent = "";
    V.step = null;
  } else {
    const k = Math.min(Math.max(stepIdx, 0), c.steps.length - 1);
    V.step = k;
    for (const li of document.querySelectorAll("#steps li")) li.classList.toggle("sel", +li.dataset.step === k);
    const cur = document.querySelector(`#steps li[data-step="${k}"]`);
    if (cur && cur.scrollIntoView) cur.scrollIntoView({ block: "nearest" });
    const s = c.steps[k];
    $("step-title").textContent = `${k}: ${s.name}` + (s.after == null ? " (raised)" : "");
    for (const a of document.querySelectorAll(".modes a")) {
      a.classList.toggle("sel", a.dataset.mode === V.mode);
      a.href = hashFor(c.id, k, a.dataset.mode);
    }
    renderGraph(s);
  }
  renderRulesTab();
  renderSourceTab();
  renderNodeTab();
  setTab(V.tab, false);
}
function applyHideNoop() {
  for (const li of document.querySelectorAll("#steps li")) li.classList.toggle("hidden", V.hideNoop && li.classList.contains("noop"));
}

function renderRulesTab() {
  const el = $("tab-rules"), c = V.ctx, s = c && V.step != null ? c.steps[V.step] : null;
  if (!s) { el.replaceChildren(E("p", { class: "empty" }, "no step")); return; }
  const d = stepDelta(s);
  const head = E("p", {}, E("b", {}, s.name), ` (${s.kind}${s.depth ? `, nested ${s.depth} deep` : ""}): ${s.ms} ms, ` +
    `${d.nBefore} → ${d.nAfter} nodes, `, E("span", { class: "plus" }, `+${d.added}`), " ",
    E("span", { class: "minus" }, `−${d.removed}`));
  if (!s.rules.length) {
    el.replaceChildren(head, E("p", { class: "empty" }, s.kind === "rewrite" ? "no rule fired in this rewrite" :
      "not one graph_rewrite: see the diff for what it changed"));
    return;
  }
  const table = E("table", { id: "rules-table" }, E("tr", {}, E("th", {}, "fired"), E("th", {}, "rule")));
  for (const [rid, n] of s.rules) {
    const r = T.rules[rid] || { fn: `rule ${rid}`, where: "?", pat: "" };
    table.append(E("tr", {}, E("td", { class: "n" }, n), E("td", {}, E("b", {}, r.fn), " ",
      E("span", { class: "mono" }, r.where), E("div", { class: "pat mono" }, r.pat))));
  }
  el.replaceChildren(head, table);
}
function renderSourceTab() {
  const el = $("tab-source"), c = V.ctx;
  if (!c) return;
  if (c.kind === "kernel") {
    el.replaceChildren(c.info.source != null ? E("pre", { class: "source", id: "kernel-source" }, c.info.source)
      : E("p", { class: "empty" }, "no source (compiling raised)"));
  } else if (c.kind === "schedule") {
    const byAst = new Map();
    for (const k of T.ctx.values()) if (k.kind === "kernel") byAst.set(k.info.ast, k);
    const ks = (c.info.kernels || []).map((a) => byAst.get(a));
    el.replaceChildren(E("p", {}, `${ks.length} kernels in this schedule:`), E("ol", {}, ks.map((k) => (k
      ? E("li", {}, E("a", { href: `#ctx=${k.id}` }, k.name))
      : E("li", { class: "empty" }, "(compiled before recording, or from the cache)")))));
  } else el.replaceChildren(E("p", { class: "empty" }, "no source for this context"));
}
function renderNodeTab() {
  const el = $("tab-node");
  if (V.sel == null || !T.nodes[V.sel]) {
    el.replaceChildren(E("p", { class: "empty" }, "click a node of the graph"));
    return;
  }
  const n = T.nodes[V.sel];
  const srcs = [];
  n.src.forEach((s, k) => srcs.push(k ? ", " : null, E("a", { href: "#", "data-node": s }, `#${s} ${T.nodes[s].op}`)));
  const k = kernelOfAst().get(V.sel);
  el.replaceChildren(E("dl", { class: "node-info" }, E("dt", {}, "node"), E("dd", {}, `#${V.sel}`), E("dt", {}, "op"),
    E("dd", {}, n.op), E("dt", {}, "dtype"), E("dd", { class: "mono" }, n.dt), E("dt", {}, "arg"),
    E("dd", { class: "mono" }, n.arg || "—"), n.tag ? [E("dt", {}, "tag"), E("dd", { class: "mono" }, n.tag)] : null,
    E("dt", {}, "sources"), E("dd", {}, srcs.length ? srcs : "none")),
    k ? E("p", {}, "the AST of kernel ", E("a", { href: `#ctx=${k.id}` }, k.name), ": its pipeline, step by step")
      : "");
}
function setTab(tab, updateHash = true) {
  V.tab = tab;
  for (const a of document.querySelectorAll(".tabs a")) a.classList.toggle("sel", a.dataset.tab === tab);
  for (const t of document.querySelectorAll(".tab")) t.classList.toggle("sel", t.id === `tab-${tab}`);
  $("detail-pane").classList.toggle("wide", tab === "source");   // room for source lines
  if (updateHash && V.ctx) history.replaceState(null, "", hashFor(V.ctx.id, V.step || 0));
}

// ***** timeline *****
// real time (ms) <-> timeline position: idle gaps longer than a launch on average are shrunk to that (collapse)
function timeMap(L, collapse) {
  const iv = L.map((l) => [l.start, l.start + l.ms]).sort((x, y) => x[0] - y[0]);
  const merged = [];
  for (const [s, e] of iv) {
    if (merged.length && s <= merged[merged.length - 1][1]) merged[merged.length - 1][1] = Math.max(merged[merged.length - 1][1], e);
    else merged.push([s, e]);
  }
  let busy = 0;
  for (const l of L) busy += l.ms;
  const cap = Math.max(busy / L.length, 1e-3), R = [merged[0][0]], C = [0], gaps = [];
  merged.forEach(([s, e], i) => {
    if (i) {
      const gap = s - merged[i - 1][1], g = collapse ? Math.min(gap, cap) : gap;
      R.push(s); C.push(C[C.length - 1] + g);
      if (g < gap) gaps.push(C[C.length - 1] - g / 2);
    }
    R.push(e); C.push(C[C.length - 1] + (e - s));
  });
  const interp = (xs, ys, v) => {   // piecewise linear, xs increasing
    let lo = 0, hi = xs.length - 1;
    if (v <= xs[0]) return ys[0] + (v - xs[0]);
    if (v >= xs[hi]) return ys[hi] + (v - xs[hi]);
    while (hi - lo > 1) { const m = (lo + hi) >> 1; if (xs[m] <= v) lo = m; else hi = m; }
    return xs[hi] === xs[lo] ? ys[lo] : ys[lo] + ((v - xs[lo]) * (ys[hi] - ys[lo])) / (xs[hi] - xs[lo]);
  };
  return { f: (t) => interp(R, C, t), inv: (c) => interp(C, R, c), total: C[C.length - 1], gaps };
}

function renderTimeline() {
  showView("timeline-view");
  const L = T.launches, svg = $("timeline");
  if (!L.length) { $("timeline-info").textContent = "no kernel launches recorded"; svg.replaceChildren(); return; }
  const devs = [...new Set(L.map((l) => l.dev))].sort();
  let t0 = Infinity, t1 = -Infinity;
  for (const l of L) { t0 = Math.min(t0, l.start); t1 = Math.max(t1, l.start + l.ms); }
  const busy = new Map();
  for (const l of L) busy.set(l.dev, (busy.get(l.dev) || 0) + l.ms);
  const tm = timeMap(L, V.tlCollapse);
  $("timeline-info").textContent = `${L.length} launches on ${devs.length} device${devs.length > 1 ? "s" : ""} over ` +
    `${(t1 - t0).toFixed(2)} ms; busy: ` + devs.map((d) => `${d} ${busy.get(d).toFixed(2)} ms`).join(", ") +
    (tm.gaps.length ? `; ${tm.gaps.length} idle gaps collapsed (dashed lines)` : "") +
    ". Wheel to zoom, drag to pan, click a launch for its kernel.";
  const laneH = 26, left = 110, width = Math.max(900, ($("timeline-wrap").clientWidth || 1000) - 4);
  const kernelIds = new Map();
  for (const c of T.ctx.values()) if (c.kind === "kernel" && !kernelIds.has(c.name)) kernelIds.set(c.name, c.id);
  V.tl = { a: 0, b: tm.total * 1.01 + 1e-6, left, width };
  V.tlDraw = () => {
    const view = V.tl, sx = (width - left - 10) / (view.b - view.a), X = (c) => left + (c - view.a) * sx;
    const bottom = 24 + devs.length * laneH;
    const h = [];
    for (let i = 0, ticks = 8; i <= ticks; i++) {
      const c = view.a + ((view.b - view.a) * i) / ticks, x = X(c);
      h.push(S("line", { class: "axis", x1: x, x2: x, y1: 18, y2: bottom }),
             S("text", { x: x + 2, y: 12 }, `${(tm.inv(c) - t0).toFixed(2)} ms`));
    }
    if (tm.gaps.length < 2000) {
      for (const g of tm.gaps) {
        if (g >= view.a && g <= view.b) h.push(S("line", { class: "gap", x1: X(g), x2: X(g), y1: 18, y2: bottom }));
      }
    }
    let drawn = 0;
    devs.forEach((d, di) => {
      const y = 22 + di * laneH;
      h.push(S("text", { x: 4, y: y + 16, "font-weight": 700 }, d));
      for (const l of L) {
        if (l.dev !== d || drawn > 20000) continue;
        const c0 = tm.f(l.start), c1 = tm.f(l.start + l.ms);
        if (c1 < view.a || c0 > view.b) continue;
        const x = X(c0), w = Math.max(1, (c1 - c0) * sx);
        const cid = kernelIds.get(l.name);
        h.push(S("rect", { class: "launch", x, y, width: w, height: laneH - 6, fill: hue(l.name), "data-ctx": cid },
          S("title", {}, `${l.name} on ${d}: ${l.ms.toFixed(4)} ms at ${(l.start - t0).toFixed(3)} ms`)));
        const label = short(l.name, Math.floor(w / 6.5));
        if (w > 60) h.push(S("text", { x: x + 3, y: y + 14, "pointer-events": "none" }, label));
        drawn++;
      }
    });
    svg.setAttribute("width", width);
    svg.setAttribute("height", 30 + devs.length * laneH);
    svg.replaceChildren(...h);
  };
  V.tlDraw();
  if (!svg.dataset.wired) {
    svg.dataset.wired = "1";
    const span = () => V.tl.width - V.tl.left - 10;
    svg.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = svg.getBoundingClientRect(), frac = Math.min(1, Math.max(0, (e.clientX - r.left - V.tl.left) / span()));
      const c = V.tl.a + (V.tl.b - V.tl.a) * frac, f = Math.exp(e.deltaY * 0.0015);
      V.tl.a = c - (c - V.tl.a) * f; V.tl.b = c + (V.tl.b - c) * f;
      V.tlDraw();
    }, { passive: false });
    let drag = null;
    svg.addEventListener("mousedown", (e) => { drag = { x: e.clientX, a: V.tl.a, b: V.tl.b, moved: false }; });
    window.addEventListener("mousemove", (e) => {
      if (!drag) return;
      const dc = ((e.clientX - drag.x) / span()) * (drag.b - drag.a);
      if (Math.abs(e.clientX - drag.x) > 3) drag.moved = true;
      V.tl.a = drag.a - dc; V.tl.b = drag.b - dc;
      V.tlDraw();
    });
    window.addEventListener("mouseup", (e) => {
      if (drag && !drag.moved && e.target.dataset && e.target.dataset.ctx) location.hash = `ctx=${e.target.dataset.ctx}`;
      drag = null;
    });
    $("tl-collapse").addEventListener("change", (e) => { V.tlCollapse = e.target.checked; renderTimeline(); });
  }
  const per = new Map();
  for (const l of L) {
    const k = `${l.dev}\u0000${l.name}`, p = per.get(k) || { dev: l.dev, name: l.name, n: 0, ms: 0 };
    p.n++; p.ms += l.ms; per.set(k, p);
  }
  const rows = [...per.values()].sort((a, b) => b.ms - a.ms);
  const head = ["kernel", "device", "launches", "total ms", "mean µs"].map((t) => E("th", {}, t));
  $("launch-table").replaceChildren(E("tr", {}, head),
    ...rows.map((p) => E("tr", {},
      E("td", {}, kernelIds.has(p.name) ? E("a", { href: `#ctx=${kernelIds.get(p.name)}` }, p.name) : p.name),
      E("td", {}, p.dev), E("td", { class: "n" }, p.n), E("td", { class: "n" }, p.ms.toFixed(3)),
      E("td", { class: "n" }, ((p.ms / p.n) * 1e3).toFixed(1)))));
}
function hue(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return `hsl(${h % 360}, 60%, 72%)`;
}

// ***** routing *****
function hashFor(cid, step, mode = V.mode, tab = V.tab) { return `#ctx=${cid}&step=${step}&mode=${mode}&tab=${tab}`; }
function route() {
  const h = location.hash.replace(/^#/, "");
  if (h === "timeline") { V.ctx = null; renderTimeline(); return; }
  const p = new URLSearchParams(h);
  if (p.has("mode") && ["after", "before", "diff", "prev"].includes(p.get("mode"))) V.mode = p.get("mode");
  if (p.has("tab") && ["rules", "source", "node"].includes(p.get("tab"))) V.tab = p.get("tab");
  const c = p.has("ctx") ? T.ctx.get(+p.get("ctx")) : null;
  if (!c) { V.ctx = null; showView("welcome"); return; }
  let step = p.has("step") ? +p.get("step") : defaultStep(c);
  if (!Number.isFinite(step)) step = 0;
  renderCtx(c, step);
}
function defaultStep(c) {   // a schedule opens on its tensor graph -> kernels step
  const k = c.steps.findIndex((s) => s.kind === "schedule");
  return k >= 0 ? k : 0;
}

function wire() {
  $("hide-noop").addEventListener("change", (e) => { V.hideNoop = e.target.checked; applyHideNoop(); });
  $("collapse").addEventListener("change", (e) => {
    V.collapse = e.target.checked;
    if (V.ctx && V.step != null) renderGraph(V.ctx.steps[V.step]);
  });
  for (const a of document.querySelectorAll(".tabs a")) a.addEventListener("click", (e) => { e.preventDefault(); setTab(a.dataset.tab); });
  $("tab-node").addEventListener("click", (e) => {
    const a = e.target.closest("a[data-node]");
    if (a) { e.preventDefault(); selectNode(+a.dataset.node); }
  });
  document.addEventListener("keydown", (e) => {   // j/k or arrows: next/previous step
    if (!V.ctx || V.step == null || e.target.tagName === "INPUT") return;
    const d = e.key === "ArrowDown" || e.key === "j" ? 1 : e.key === "ArrowUp" || e.key === "k" ? -1 : 0;
    if (!d) return;
    e.preventDefault();
    const n = Math.min(Math.max(V.step + d, 0), V.ctx.steps.length - 1);
    location.hash = hashFor(V.ctx.id, n).slice(1);
  });
  setupPanZoom();
}

async function main() {
  wire();
  try {
    const r = await fetch("trace.jsonl", { cache: "no-store" });
    if (!r.ok) throw new Error(`GET trace.jsonl: HTTP ${r.status}`);
    parseTrace(await r.text());
  } catch (e) {
    $("trace-info").textContent = "no trace";
    $("error").textContent = `could not load the trace: ${e.message}`;
    document.body.dataset.ready = "error";
    return;
  }
  buildSide();
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "1";
}
main();
