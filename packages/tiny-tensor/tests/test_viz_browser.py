"""The VIZ page in a real browser: headless Chromium loads it from the standard-library server on 127.0.0.1.

Needs a Chromium (or Chrome) binary: `.ci/run` installs Debian's `chromium` (no PyPI package ships a usable one);
elsewhere `apt-get install chromium`, or point `$CHROMIUM` at any Chrome/Chromium binary. Without one the tests skip,
except under nox (TINY_REQUIRE_TOOLS=1, as in CI), where they fail; `-k "not browser"` leaves them out on purpose.

The DOM is read through the DevTools protocol (a websocket client from the standard library below, RFC 6455): the
test clicks with real mouse events, waits for the page's JavaScript, and compares what it shows with the trace read in
Python. The screenshot comes from `chromium --headless --screenshot` and is decoded here (PNG, zlib) to check that it
shows a page, not a blank.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
import zlib
from typing import Any

import numpy as np
import pytest

from tiny_tensor import Tensor, viz
from tiny_tensor.viz.server import serve_in_thread

# These tests pin the CPU: the nox sessions on other devices (tiny-tensor@MOCK+AMD, ...) leave them to the CPU session
# and run test_viz_device.py, which records on their device.
# CPU-pinned VIZ test: it runs in the CPU session; test_viz_device.py runs here
# (the conftest deselects it in the other sessions)
pytestmark = pytest.mark.dev_session("CPU")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--window-size=1400,900"]
MAX_NODES = 2500  # viz.js draws at most this many nodes of a graph


def find_chromium() -> str | None:
  """$CHROMIUM, else a Chromium/Chrome on PATH."""
  if (env := os.environ.get("CHROMIUM")): return env if os.access(env, os.X_OK) else shutil.which(env)
  for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
    if (p := shutil.which(name)): return p
  return None


def need_chromium() -> str:
  chrome = find_chromium()
  if chrome is not None: return chrome
  # Chromium is the one test tool no PyPI package provides: without one these tests skip (also under nox), except
  # where TINY_REQUIRE_CHROMIUM=1 says a browser was installed for them (.ci/run installs Debian's chromium and sets it)
  msg = ("no Chromium/Chrome found (no PyPI package ships one; CI installs Debian's chromium package): install one and "
         "set CHROMIUM=/path/to/it to run the VIZ page's browser tests")
  if os.environ.get("TINY_REQUIRE_CHROMIUM") == "1": pytest.fail(msg)
  pytest.skip(msg)


# ***** a websocket client (RFC 6455), enough for the DevTools protocol *****
class WebSocket:
  GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3

  def __init__(self, url: str, timeout: float = 30):
    u = urllib.parse.urlsplit(url)
    self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
    self.sock.sendall(request.encode())
    self.buf = bytearray()
    while b"\r\n\r\n" not in self.buf: self._fill()
    end = self.buf.index(b"\r\n\r\n")
    head = bytes(self.buf[:end]).decode("latin-1")
    del self.buf[:end + 4]
    if " 101 " not in head.split("\r\n")[0]: raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")
    accept = base64.b64encode(hashlib.sha1((key + self.GUID).encode()).digest()).decode()
    if accept not in head: raise ConnectionError("websocket handshake: wrong Sec-WebSocket-Accept")

  def _fill(self) -> None:
    chunk = self.sock.recv(1 << 16)
    if not chunk: raise ConnectionError("websocket closed by the browser")
    self.buf += chunk

  def _read(self, n: int) -> bytes:
    while len(self.buf) < n: self._fill()
    out = bytes(self.buf[:n])
    del self.buf[:n]
    return out

  def _frame(self, opcode: int, payload: bytes) -> None:
    n = len(payload)
    head = bytearray([0x80 | opcode])
    if n < 126: head.append(0x80 | n)
    elif n < 1 << 16: head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else: head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = os.urandom(4)  # client frames are masked (§5.3)
    body = (np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), n)).tobytes() if n else b""
    self.sock.sendall(bytes(head) + mask + body)

  def send(self, text: str) -> None: self._frame(0x1, text.encode())

  def recv(self) -> str:
    message = b""
    while True:
      b0, b1 = self._read(2)
      n = b1 & 0x7F
      if n == 126: n = struct.unpack(">H", self._read(2))[0]
      elif n == 127: n = struct.unpack(">Q", self._read(8))[0]
      mask = self._read(4) if b1 & 0x80 else None
      data = self._read(n)
      if mask: data = (np.frombuffer(data, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), n)).tobytes()
      op = b0 & 0x0F
      if op == 0x8: raise ConnectionError("websocket closed by the browser")
      if op == 0x9: self._frame(0xA, data); continue  # noqa: E702 -- ping: pong
      if op == 0xA: continue
      message += data
      if b0 & 0x80: return message.decode()

  def close(self) -> None: self.sock.close()


class Page:
  """One browser tab driven through the DevTools protocol."""

  def __init__(self, ws: WebSocket):
    self.ws, self.next_id = ws, 0

  def call(self, method: str, **params: Any) -> dict:
    self.next_id += 1
    self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
    while True:
      msg = json.loads(self.ws.recv())
      if msg.get("id") == self.next_id:
        if "error" in msg: raise RuntimeError(f"{method}: {msg['error']}")
        return msg["result"]

  def js(self, expr: str) -> Any:
    r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
    if "exceptionDetails" in r: raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
    return r["result"].get("value")

  def wait(self, expr: str, timeout: float = 30) -> Any:
    end = time.monotonic() + timeout
    while True:
      if (v := self.js(expr)): return v
      if time.monotonic() > end: raise TimeoutError(f"the page never made {expr!r} true")
      time.sleep(0.05)

  def click(self, selector: str) -> None:
    """A real left click (mouse events) in the middle of the element, scrolled into view first."""
    pos = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                  "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                  "return [r.left + r.width / 2, r.top + r.height / 2]; })()")
    if pos is None: raise LookupError(f"nothing on the page matches {selector!r}")
    x, y = pos
    self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
    for t in ("mousePressed", "mouseReleased"):
      self.call("Input.dispatchMouseEvent", type=t, x=x, y=y, button="left", clickCount=1)


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
  from tiny_uop import Context
  path = str(tmp_path_factory.mktemp("vizb") / "trace.jsonl")
  with Context(DEV="CPU"), viz.record(path):
    a = Tensor(np.arange(35, dtype=np.float32).reshape(5, 7))
    b = ((a * 2 - 3).exp2().sum(axis=1).reshape(5, 1) + a).contiguous()
    (b.max(axis=0) * 0.5).realize()
  return path


@pytest.fixture(scope="module")
def served(trace_path):
  srv, url = serve_in_thread(trace_path)
  yield url
  srv.shutdown()
  srv.server_close()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
  chrome = need_chromium()
  prof = tmp_path_factory.mktemp("chromium-profile")
  log = open(prof.parent / "chromium.log", "wb")  # noqa: SIM115
  proc = subprocess.Popen([chrome, *FLAGS, f"--user-data-dir={prof}", "--remote-debugging-port=0", "about:blank"],
                          stdout=log, stderr=log, stdin=subprocess.DEVNULL)
  try:
    port_file, end = prof / "DevToolsActivePort", time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
      if proc.poll() is not None or time.monotonic() > end:
        raise RuntimeError(f"Chromium did not start (exit {proc.poll()}): {open(log.name).read()[-2000:]}")
      time.sleep(0.1)
    port = int(port_file.read_text().split()[0])
    targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
    ws = WebSocket(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
    yield Page(ws)
    ws.close()
  finally:
    proc.terminate()
    try: proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()


def open_page(page: Page, url: str) -> None:
  page.call("Page.navigate", url=url)
  page.wait("document.readyState === 'complete' && document.body && document.body.dataset.ready")
  assert page.js("document.body.dataset.ready") == "1", page.js("document.getElementById('error').textContent")


def shown_graph_size(t: viz.Trace, roots: list[int]) -> int:
  return min(MAX_NODES, len(set(n for r in roots for n in t.graph(r))))


def test_browser_kernels_list_and_every_rewrite_step(page, served, trace_path):
  t = viz.load(trace_path)
  assert len(t.kernels) >= 2
  open_page(page, served)
  assert page.js("[...document.querySelectorAll('#kernels li')].map(li => li.dataset.name)") == \
    [k.name.lower() for k in t.kernels]
  assert page.js("document.getElementById('n-kernels').textContent") == f"({len(t.kernels)})"
  assert len(page.js("[...document.querySelectorAll('#schedules li')]")) == len(t.schedules)

  k = max(t.kernels, key=lambda c: len(c.steps))
  page.click(f'#kernels li[data-ctx="{k.id}"] a')
  page.wait(f"document.querySelectorAll('#steps li').length === {len(k.steps)}")
  assert page.js("document.querySelector('#ctx-head h2').textContent") == k.name
  assert page.js("[...document.querySelectorAll('#steps .nm')].map(e => e.textContent)") == [s.name for s in k.steps]

  for i, s in enumerate(k.steps):  # click every step: its graph is drawn with exactly the trace's nodes
    page.click(f'#steps li[data-step="{i}"] a')
    page.wait(f"document.getElementById('step-title').textContent.startsWith('{i}: ')")
    want = shown_graph_size(t, [s.after if s.after is not None else s.before])
    assert page.js("+document.getElementById('graph').dataset.nodes") == want, (i, s.name)
    assert page.js("document.querySelectorAll('#graph g.node').length") == want
    n_edges = len({(src, n) for n in t.graph(s.after) for src in t.nodes[n].src}) if want < MAX_NODES else None
    if n_edges is not None: assert page.js("document.querySelectorAll('#graph path.edge').length") == n_edges
    fired = page.js("[...document.querySelectorAll('#rules-table tr')].slice(1).map(r => [r.cells[0].textContent,"
                    "r.querySelector('b').textContent])")
    assert (fired or []) == [[str(c), t.rules[r].fn] for r, c in s.rules]

  # the diff of a step that changed the graph: added and removed nodes marked, as many as the trace says
  # (a step that only dropped nodes -- its result a node of the graph before -- has nothing added to mark)
  i, s = next((i, s) for i, s in enumerate(k.steps) if s.changed and s.kind in ("rewrite", "stage")
              and set(t.graph(s.after)) - set(t.graph(s.before)))
  page.click(f'#steps li[data-step="{i}"] a')
  page.wait(f"document.getElementById('step-title').textContent.startsWith('{i}: ')")
  page.click('.modes a[data-mode="diff"]')
  page.wait("document.querySelector('.modes a.sel').dataset.mode === 'diff'")
  before, after = set(t.graph(s.before)), set(t.graph(s.after))
  assert page.js("document.querySelectorAll('#graph g.node.added').length") == len(after - before) > 0
  assert page.js("document.querySelectorAll('#graph g.node.removed').length") == len(before - after)
  assert page.js("document.querySelectorAll('#graph g.node').length") == shown_graph_size(t, [s.after, s.before])

  # "vs prev": a step's graph against the previous step's (same depth or above), e.g. across a stage between them
  def previous(j: int) -> int:
    for p in reversed(k.steps[:j]):
      if p.depth <= k.steps[j].depth: return p.after if p.after is not None else p.before
    return k.steps[j].before
  j = next(j for j in range(1, len(k.steps)) if set(t.graph(previous(j))) != set(t.graph(k.steps[j].after)))
  page.click(f'#steps li[data-step="{j}"] a')
  page.wait(f"document.getElementById('step-title').textContent.startsWith('{j}: ')")
  page.click('.modes a[data-mode="prev"]')
  page.wait("document.querySelector('.modes a.sel').dataset.mode === 'prev'")
  old_g, new_g = set(t.graph(previous(j))), set(t.graph(k.steps[j].after))
  assert page.js("+document.getElementById('graph').dataset.added") == len(new_g - old_g)
  assert page.js("+document.getElementById('graph').dataset.removed") == len(old_g - new_g)
  assert len(new_g - old_g) + len(old_g - new_g) > 0
  page.click('.modes a[data-mode="diff"]')
  page.click(f'#steps li[data-step="{i}"] a')
  page.wait(f"document.getElementById('step-title').textContent.startsWith('{i}: ')")

  # a node's details, the kernel's source
  visible = page.js("(() => { const b = document.getElementById('graph').getBoundingClientRect();"
                    "for (const g of document.querySelectorAll('#graph g.node.added')) {"
                    "const r = g.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;"
                    "if (x > b.left && x < b.right && y > b.top && y < b.bottom) return +g.dataset.id; }"
                    "return null; })()")
  assert visible is not None, "fit shows the added nodes"
  page.click(f'#graph g.node[data-id="{visible}"] rect')
  page.wait("document.querySelector('.tabs a.sel').dataset.tab === 'node'")
  nid = page.js("+document.querySelector('#graph g.node.sel').dataset.id")
  assert nid in after - before
  assert page.js("document.querySelector('#tab-node dl').textContent").startswith(f"node#{nid}op{t.nodes[nid].op}")
  page.click('.tabs a[data-tab="source"]')
  assert page.js("document.getElementById('kernel-source').textContent") == k.source

  # a schedule opens on its step tensor graph -> CALLs, each kernel AST drawn as one node until asked for in full
  sched = t.schedules[0]
  page.click(f'#schedules li[data-ctx="{sched.id}"] a')
  page.wait(f"document.querySelectorAll('#steps li').length === {len(sched.steps)}")
  page.wait(f"document.getElementById('step-title').textContent === '{len(sched.steps) - 1}: schedule'")
  page.click('.modes a[data-mode="after"]')
  page.wait("document.querySelector('.modes a.sel').dataset.mode === 'after'")
  linear = sched.steps[-1].after
  calls = [t.nodes[c] for c in t.nodes[linear].src]
  kernel_asts = {c.src[0] for c in calls if t.nodes[c.src[0]].op == "SINK"}
  assert kernel_asts == set(sched.info["kernels"])
  reachable = set()  # what the page draws: the graph under LINEAR without going into the kernel ASTs
  stack = [linear]
  while stack:
    n = stack.pop()
    if n in reachable: continue
    reachable.add(n)
    if n not in kernel_asts: stack.extend(t.nodes[n].src)
  assert len(reachable) < len(t.graph(linear))
  assert page.js("+document.getElementById('graph').dataset.nodes") == len(reachable)
  assert page.js("document.querySelectorAll('#graph g.node.collapsed').length") == len(kernel_asts)
  page.click("#collapse")
  page.wait(f"+document.getElementById('graph').dataset.nodes === {shown_graph_size(t, [linear])}")

  # the timeline: one bar per launch, on its device's lane
  page.click("#timeline-link")
  page.wait("!document.getElementById('timeline-view').hidden")
  assert page.js("document.querySelectorAll('#timeline rect.launch').length") == len(t.launches)
  assert page.js("[...document.querySelectorAll('#launch-table td:first-child')].map(e => e.textContent).sort()") == \
    sorted({ln.name for ln in t.launches})


def png_pixels(data: bytes) -> tuple[int, int, np.ndarray]:
  """(width, height, pixels as an (h, w, channels) uint8 array) of an 8-bit RGB/RGBA non-interlaced PNG (the
  format's chunk layout and the five row filters, PNG spec §11.2.2, §9.2)."""
  if data[:8] != b"\x89PNG\r\n\x1a\n": raise ValueError("not a PNG (bad signature)")
  pos, idat, ihdr = 8, bytearray(), None
  while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]:
      raise ValueError(f"PNG chunk {kind!r}: bad CRC")
    if kind == b"IHDR": ihdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT": idat += body
    elif kind == b"IEND": break
    pos += 12 + n
  if ihdr is None: raise ValueError("PNG without IHDR")
  w, h, depth, color, _, _, interlace = ihdr
  if depth != 8 or color not in (2, 6) or interlace: raise ValueError(f"PNG kind not handled here: {ihdr}")
  bpp = 3 if color == 2 else 4
  raw = zlib.decompress(bytes(idat))
  if len(raw) != h * (1 + w * bpp): raise ValueError(f"PNG data is {len(raw)} bytes, want {h * (1 + w * bpp)}")
  out = np.zeros((h, w * bpp), np.uint8)
  prev = np.zeros(w * bpp, np.int32)
  for y in range(h):
    f, row = raw[y * (1 + w * bpp)], np.frombuffer(raw, np.uint8, w * bpp, y * (1 + w * bpp) + 1).astype(np.int32)
    if f == 0: cur = row
    elif f == 1: cur = np.cumsum(row.reshape(w, bpp), axis=0).reshape(-1) & 255
    elif f == 2: cur = (row + prev) & 255
    elif f in (3, 4):  # average, Paeth: each byte depends on the reconstructed byte to its left
      r, up, cur_l = row.tolist(), prev.tolist(), [0] * (w * bpp)
      for i in range(w * bpp):
        a = cur_l[i - bpp] if i >= bpp else 0
        b = up[i]
        if f == 3: cur_l[i] = (r[i] + ((a + b) >> 1)) & 255
        else:
          c = up[i - bpp] if i >= bpp else 0
          p = a + b - c
          pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
          cur_l[i] = (r[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
      cur = np.array(cur_l, np.int32)
    else: raise ValueError(f"PNG row {y}: unknown filter {f}")
    out[y] = cur
    prev = cur
  return w, h, out.reshape(h, w, bpp)


def test_browser_screenshot_of_a_rewrite_step(served, trace_path, tmp_path):
  chrome = need_chromium()
  t = viz.load(trace_path)
  k = max(t.kernels, key=lambda c: len(c.steps))
  i = next(i for i, s in enumerate(k.steps) if s.changed and s.kind == "rewrite")
  shot = tmp_path / "step.png"
  r = subprocess.run([chrome, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
                      f"--screenshot={shot}", f"{served}#ctx={k.id}&step={i}&mode=diff"],
                     capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
  assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
  if (keep := os.environ.get("VIZ_SCREENSHOT")): shutil.copy(shot, keep)  # to look at it
  w, h, px = png_pixels(shot.read_bytes())
  assert (w, h) == (1400, 900)
  colors, counts = np.unique(px[..., :3].reshape(-1, 3), axis=0, return_counts=True)
  assert len(colors) > 200, "a page of text and graphs has many colors (anti-aliasing)"
  assert counts.max() < 0.9 * w * h, "one color covers the whole picture: blank"
  # the header bar (#1d2330) is at the top, the added nodes' green (#c9f2d0) in the graph
  assert tuple(px[5, w // 2, :3]) == (0x1D, 0x23, 0x30)
  assert ((px[..., :3] == (0xC9, 0xF2, 0xD0)).all(-1)).sum() > 100


# ***** a hostile trace: every string the page shows is markup that would run script if it were parsed as HTML *****
XSS = ['<img src=x onerror="window.__pwned=(window.__pwned||0)+1">',
       '"><svg onload="window.__pwned=(window.__pwned||0)+1">',
       "</title><script>window.__pwned=(window.__pwned||0)+1</script>",
       "javascript:window.__pwned=(window.__pwned||0)+1"]


def hostile_trace(path: str) -> None:
  x = lambda k: XSS[k % len(XSS)] + f" #{k}"  # noqa: E731 -- a hostile string per field, each told apart
  lines = [["tiny-viz", 1, {"argv": [x(0)], "pid": 1, "time": 1.0}],
           ["n", 0, x(1), x(2), x(3), [], x(4)],
           ["n", 1, "SINK", x(5), x(6), [0], None],
           ["r", 0, x(7), x(8), x(9)],
           ["s", 0, 2, x(10), 0, 1, 0, [[0, 3]], 0.5, x(11)],
           ["s", 1, 2, x(12), 1, 1, 1, [], 0.1, "rewrite"],
           ["c", 2, "kernel", x(13), None, {"device": x(14), "renderer": x(15), "source": x(16), "ast": 1,
                                           "error": x(17)}],
           ["c", 3, "schedule", x(18), None, {"calls": 1, "kernels": [1]}],
           ["l", x(19), x(13), 0.0, 0.25]]
  with open(path, "w") as f:
    for rec in lines: f.write(json.dumps(rec) + "\n")


def test_browser_hostile_trace_shows_text_and_runs_no_script(page, tmp_path):
  path = str(tmp_path / "hostile.jsonl")
  hostile_trace(path)
  srv, url = serve_in_thread(path)
  try:
    open_page(page, url)
    assert page.js("document.querySelector('#kernels li a').firstChild.textContent") == XSS[13 % 4] + " #13"
    page.click('#kernels li[data-ctx="2"] a')
    page.wait("document.querySelectorAll('#steps li').length === 2")
    for tab in ("rules", "source", "node"):
      page.click(f'.tabs a[data-tab="{tab}"]')
      if tab == "node": page.click("#graph g.node")
      time.sleep(0.2)
    assert page.js("document.querySelector('#ctx-head h2').textContent") == XSS[13 % 4] + " #13"
    assert page.js("document.getElementById('kernel-source').textContent") == XSS[16 % 4] + " #16"
    page.click('#steps li[data-step="0"] a')
    page.click('.modes a[data-mode="diff"]')
    page.call("Page.navigate", url=url + "#timeline")
    page.wait("document.querySelectorAll('#timeline rect.launch').length === 1")
    page.call("Page.navigate", url=url + "#ctx=3")
    page.wait("document.querySelector('#ctx-head h2') && document.querySelector('#ctx-head h2').textContent.length")
    time.sleep(0.5)
    # no element the trace's text names exists, and none of its handlers ran
    assert page.js("document.querySelectorAll('img, script:not([src]), [onerror], [onload]').length") == 0
    assert page.js("window.__pwned || 0") == 0
  finally:
    srv.shutdown()
    srv.server_close()
