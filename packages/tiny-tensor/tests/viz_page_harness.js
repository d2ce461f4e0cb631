// Runs the VIZ page's script (viz.js) under node against a small stand-in DOM, for test_viz_hostile.py: loads a
// trace, opens every context, step, graph mode and tab and the timeline, and prints as JSON the text the page shows
// and whether anything was parsed as HTML (the stand-in throws on innerHTML/outerHTML/insertAdjacentHTML).
// usage: node viz_page_harness.js VIZ_JS TRACE_JSONL
"use strict";
const fs = require("fs"), vm = require("vm");
const [jsPath, tracePath] = process.argv.slice(2);
const byId = new Map(), listeners = [];
const htmlUsed = [];

class Nd {}
class Txt extends Nd { constructor(t) { super(); this.data = t; } get textContent() { return this.data; } }
class El extends Nd {
  constructor(tag) {
    super();
    Object.assign(this, { tagName: tag.toUpperCase(), kids: [], attrs: {}, dataset: {}, style: {}, hidden: false });
    const cls = new Set();
    this.classList = { add: (c) => cls.add(c), remove: (c) => cls.delete(c), contains: (c) => cls.has(c),
                       toggle: (c, on) => ((on === undefined ? !cls.has(c) : on) ? cls.add(c) : cls.delete(c)) };
  }
  setAttribute(k, v) {
    if (/^on/i.test(k)) throw new Error(`event handler attribute ${k} set`);
    this.attrs[k] = String(v);
    if (k === "id") byId.set(String(v), this);
    if (k.startsWith("data-")) this.dataset[k.slice(5).replace(/-(\w)/g, (m, c) => c.toUpperCase())] = String(v);
  }
  getAttribute(k) { return this.attrs[k]; }
  append(...xs) { for (const x of xs) this.kids.push(x instanceof Nd ? x : new Txt(String(x))); }
  appendChild(x) { this.append(x); return x; }
  replaceChildren(...xs) { this.kids = []; this.append(...xs); }
  get textContent() { return this.kids.map((k) => k.textContent).join(""); }
  set textContent(t) { this.kids = [new Txt(String(t))]; }
  set innerHTML(h) { htmlUsed.push(`innerHTML = ${String(h).slice(0, 80)}`); }
  set outerHTML(h) { htmlUsed.push("outerHTML"); }
  insertAdjacentHTML() { htmlUsed.push("insertAdjacentHTML"); }
  addEventListener() {}
  closest() { return null; }
  scrollIntoView() {}
  getBoundingClientRect() { return { left: 0, top: 0, width: 800, height: 600 }; }
  get clientWidth() { return 800; }
  get clientHeight() { return 600; }
  set title(t) { this.attrs.title = String(t); }
  set href(h) { this.attrs.href = String(h); }
}
const el = (id) => { if (!byId.has(id)) { const e = new El("div"); e.attrs.id = id; byId.set(id, e); } return byId.get(id); };
const body = new El("body");
const document = {
  body, getElementById: el, createElement: (t) => new El(t), createElementNS: (ns, t) => new El(t),
  querySelector: () => null, querySelectorAll: () => [], addEventListener: () => {},
};
const location = { hash: "" };
const ctx = vm.createContext({
  document, location, console, URLSearchParams, Map, Set, Node: Nd,
  history: { replaceState: (a, b, h) => { location.hash = h; } },
  window: { addEventListener: (t, f) => listeners.push([t, f]) },
  fetch: async () => ({ ok: true, status: 200, text: async () => fs.readFileSync(tracePath, "utf8") }),
});
vm.runInContext(fs.readFileSync(jsPath, "utf8"), ctx, { filename: "viz.js" });

function texts(e, out) {   // every text node under e, and every attribute value
  const stack = [e];
  while (stack.length) {
    const n = stack.pop();
    if (n instanceof Txt) { out.push(n.data); continue; }
    for (const v of Object.values(n.attrs)) out.push(v);
    for (const k of n.kids) stack.push(k);
  }
  return out;
}
setTimeout(() => {
  const shown = [];
  const run = (code) => vm.runInContext(code, ctx);
  if (body.dataset.ready === "1") {
    for (const id of run("[...T.ctx.keys()]")) {
      const n = run(`T.ctx.get(${id}).steps.length`);
      for (let k = 0; k < Math.max(n, 1); k++) {
        for (const mode of ["after", "before", "diff", "prev"]) {
          location.hash = `#ctx=${id}&step=${k}&mode=${mode}&tab=rules`;
          run("route()");
          for (const nid of run("V.graph ? V.graph.ids : []")) run(`selectNode(${nid})`);
          for (const v of byId.values()) texts(v, shown);
        }
      }
    }
    location.hash = "#timeline";
    run("route()");
    for (const v of byId.values()) texts(v, shown);
  }
  process.stdout.write(JSON.stringify({ ready: body.dataset.ready, error: el("error").textContent, htmlUsed,
                                        shown: [...new Set(shown)] }));
}, 200);
