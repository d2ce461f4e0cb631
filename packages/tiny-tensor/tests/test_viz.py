"""VIZ: the trace a program writes (schedules, kernels, every rewrite step, launches), the reader, the server, the CLI,
VIZ=1 at exit, and the demo's trace. The page in a real browser: test_viz_browser.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from tiny_tensor import Tensor, TinyJit, viz
from tiny_tensor.viz.__main__ import main as viz_main
from tiny_tensor.viz.server import make_server, serve_in_thread
from tiny_uop import Ops, UOp, dtypes, trace

# These tests pin the CPU: the nox sessions on other devices (tiny-tensor@MOCK+AMD, ...) leave them to the CPU session
# and run test_viz_device.py, which records on their device.
# CPU-pinned VIZ test: it runs in the CPU session; test_viz_device.py runs here
# (the conftest deselects it in the other sessions)
pytestmark = pytest.mark.dev_session("CPU")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(autouse=True)
def _cpu():
  from tiny_uop import Context
  with Context(DEV="CPU"): yield


def small_program(n: int) -> np.ndarray:
  """Kernels on CPU (a reduce and an elementwise one) for a (4, n) input: each test picks its own n, so its kernels
  are not in the compile caches of this process yet and their whole pipeline runs while it records."""
  a = Tensor(np.arange(4 * n, dtype=np.float32).reshape(4, n))
  s = (a * 3 + 1).relu().sum(axis=1)
  return (s.reshape(4, 1) * a - 7).contiguous().numpy()


def test_records_schedule_kernels_steps_and_launches(tmp_path):
  path = str(tmp_path / "t.jsonl")
  with viz.record(path) as rec:
    out = small_program(6)
  x = np.arange(24, dtype=np.float32).reshape(4, 6)
  np.testing.assert_allclose(out, np.maximum(x * 3 + 1, 0).sum(1, keepdims=True) * x - 7)
  assert trace.RECORDER is None and rec.closed
  t = viz.load(path)
  assert t.header["pid"] == os.getpid()
  assert len(t.schedules) >= 1 and len(t.kernels) >= 1
  # every kernel the schedules made was compiled here, so its pipeline is in the trace
  kernel_asts = {k.info["ast"] for k in t.kernels}
  for s in t.schedules:
    assert s.steps[-1].kind == "schedule" and t.nodes[s.steps[-1].after].op == "LINEAR"
    assert set(s.info["kernels"]) <= kernel_asts
    assert len(t.graph(s.steps[-1].after)) > len(t.graph(s.steps[-1].before)) // 2
  for k in t.kernels:
    names = [st.name for st in k.steps]
    assert names[-1] == "linearize" and "expander" in names and "ends" in names, names
    assert t.nodes[k.info["ast"]].op == "SINK" and k.info["device"] == "CPU"
    assert k.source and k.name in k.source  # the final source defines the kernel's function
    assert any(st.rules for st in k.steps), "some rewrite of the pipeline fires rules"
    assert all(t.rules[r].where.count(":") == 1 for st in k.steps for r, _ in st.rules)
  launched = [ln.name for ln in t.launches]
  assert sorted(launched) == sorted(k.name for k in t.kernels)
  assert all(ln.device == "CPU" and ln.ms >= 0 for ln in t.launches)


def test_source_is_the_compiled_program(tmp_path):
  from tiny_tensor.engine import _program_cache
  path = str(tmp_path / "t.jsonl")
  with viz.record(path):
    (Tensor(np.ones((3, 5), np.float32)) * 2 + 5).realize()
  t = viz.load(path)
  (k,) = t.kernels
  calls = [t.nodes[i] for i in t.nodes[t.schedules[-1].steps[-1].after].src]
  assert [c.op for c in calls] == ["CALL"] and calls[0].src[0] == k.info["ast"]
  spec = next(s for s, _ in _program_cache.values() if s.name == k.name)  # what the engine launched
  assert spec.src == k.source


def test_step_graphs_match_the_uops(tmp_path):
  """Each step's before/after graph in the trace has exactly the nodes of the UOp graphs graph_rewrite saw."""
  seen: list[tuple[UOp, UOp | None]] = []

  class Both(viz.VizRecorder):
    def rewrite_end(self, token, result, fired, seconds):
      if token is not None: seen.append((token[3], result))
      super().rewrite_end(token, result, fired, seconds)
  rec = Both(str(tmp_path / "t.jsonl"))
  old = trace.install(rec)
  try: (Tensor(np.ones((8, 13), np.float32)).exp2().sum(axis=0) + 1).realize()
  finally:
    trace.install(old)
    rec.close()
  t = viz.load(rec.path)
  steps = sorted((s for c in t.contexts.values() for s in c.steps if s.kind == "rewrite"), key=lambda s: s.id)
  assert len(steps) == len(seen) > 3
  sizes = sorted((len(t.graph(s.before)), len(t.graph(s.after)) if s.after is not None else -1) for s in steps)
  want = sorted((len(b.toposort()), len(a.toposort()) if a is not None else -1) for b, a in seen)
  assert sizes == want
  for s in steps:  # ops of the root survive the round trip
    assert t.nodes[s.before].op in {o.name for o in Ops}


def test_nodes_are_stored_once(tmp_path):
  path = str(tmp_path / "t.jsonl")
  with viz.record(path):
    small_program(9)
  nodes = [json.loads(line) for line in open(path) if line.startswith('["n"')]
  ids = [n[1] for n in nodes]
  assert ids == list(range(len(ids)))  # each id written once, in order
  keys = [(n[2], n[3], n[4], tuple(n[5]), n[6]) for n in nodes]
  # a node is written again only when it was freed and built again (the writer holds nodes weakly): rare
  assert len(keys) - len(set(keys)) <= len(keys) // 20
  t = viz.load(path)
  total = sum(len(t.graph(s.before)) + (len(t.graph(s.after)) if s.after is not None else 0)
              for c in t.contexts.values() for s in c.steps)
  assert len(nodes) * 4 < total  # steps share most of their nodes


def test_recording_keeps_no_buffer_alive(tmp_path):
  import gc

  from tiny_tensor import GlobalCounters
  with viz.record(str(tmp_path / "t.jsonl")):
    gc.collect()
    before = GlobalCounters.mem_used
    x = (Tensor(np.ones((256, 257), np.float32)) * 3).contiguous().realize()
    assert GlobalCounters.mem_used >= before + 256 * 257 * 4
    del x
    gc.collect()
    assert GlobalCounters.mem_used <= before  # freed while still recording


def test_deep_graph_without_recursion(tmp_path):
  x = UOp.variable("x", 0, 10)
  for i in range(6000): x = x + UOp.const(dtypes.index, i % 7 + 1)
  rec = viz.VizRecorder(str(tmp_path / "deep.jsonl"))
  try: root = rec.node(x)
  finally: rec.close()
  t = viz.load(rec.path)
  assert len(t.graph(root)) == len(x.toposort()) > 6000


def test_jit_replays_are_recorded(tmp_path):
  @TinyJit
  def f(a: Tensor) -> Tensor: return (a * 2 + 1).realize()
  path = str(tmp_path / "t.jsonl")
  with viz.record(path):
    for i in range(4): out = f(Tensor(np.full((7,), i, np.float32)))
  np.testing.assert_allclose(out.numpy(), np.full((7,), 7, np.float32))
  t = viz.load(path)
  (k,) = [k for k in t.kernels]
  assert [ln.name for ln in t.launches] == [k.name] * 4  # 2 through the engine, 2 jit replays


def test_viz_off_writes_nothing(tmp_path):
  assert trace.RECORDER is None
  files = set(os.listdir(tmp_path))
  small_program(10)
  assert set(os.listdir(tmp_path)) == files and trace.RECORDER is None


def test_a_failing_kernel_context_is_recorded(tmp_path, monkeypatch):
  import tiny_codegen.program as program
  path = str(tmp_path / "t.jsonl")

  def broken(*a):
    raise RuntimeError("renderer broke")
  monkeypatch.setattr(program, "lower", broken)
  program._to_program.cache_clear()
  with viz.record(path), pytest.raises(RuntimeError, match="renderer broke"):
    (Tensor(np.ones((11,), np.float32)) * 13).realize()
  program._to_program.cache_clear()
  t = viz.load(path)
  (k,) = t.kernels
  assert k.info["error"] == "RuntimeError: renderer broke" and k.source is None


# ***** reader *****
@pytest.mark.parametrize("text, msg", [
  ("", "empty file"),
  ('["something", 1, {}]\n', "not a VIZ trace"),
  ('["tiny-viz", 99, {}]\n', "format version 99"),
  ('["tiny-viz", 1, {}]\n{"a": 1}\n', ":2: a record is a non-empty JSON array"),
  ('["tiny-viz", 1, {}]\n["n", 0, "ADD", "int", "", [5], null]\n', ":2: node 0 refers to nodes [5]"),
  ('["tiny-viz", 1, {}]\n["x", 1]\n', ":2: unknown record type 'x'"),
  ('["tiny-viz", 1, {}]\n["n", 0]\n', ":2: a 'n' record has 7 items"),
  ('["tiny-viz", 1, {}]\nnot json\n', ":2: not JSON"),
])
def test_reader_rejects_bad_files(tmp_path, text, msg):
  p = tmp_path / "bad.jsonl"
  p.write_text(text)
  with pytest.raises(viz.TraceError, match=msg.replace("[", r"\[").replace("]", r"\]")):
    viz.load(str(p))


def test_reader_keeps_steps_of_an_unfinished_context(tmp_path):
  p = tmp_path / "cut.jsonl"
  p.write_text('["tiny-viz", 1, {}]\n["n", 0, "CONST", "int", "1", [], null]\n'
               '["s", 0, 7, "simplify", 0, 0, 0, [], 0.1, "rewrite"]\n')
  t = viz.load(str(p))
  assert t.contexts[7].kind == "unfinished" and [s.name for s in t.contexts[7].steps] == ["simplify"]


# ***** server and command line *****
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  from tiny_uop import Context
  path = str(tmp_path_factory.mktemp("viz") / "t.jsonl")
  with Context(DEV="CPU"), viz.record(path):
    small_program(5)
  return path


def test_server_routes(recorded):
  srv, url = serve_in_thread(recorded)
  try:
    page = urllib.request.urlopen(url).read().decode()
    assert '<script src="viz.js">' in page and 'id="kernels"' in page
    js = urllib.request.urlopen(url + "viz.js").read().decode()
    assert "function layout(" in js
    assert urllib.request.urlopen(url + "viz.css").headers["Content-Type"].startswith("text/css")
    assert urllib.request.urlopen(url + "trace.jsonl").read() == open(recorded, "rb").read()
    with pytest.raises(urllib.error.HTTPError, match="404"):
      urllib.request.urlopen(url + "nothing")
  finally:
    srv.shutdown()
    srv.server_close()


def test_port_in_use_is_a_clear_error(recorded):
  srv = make_server(recorded, 0)
  try:
    with pytest.raises(OSError, match=f"port {srv.server_address[1]} on 127.0.0.1 is in use"):
      make_server(recorded, srv.server_address[1])
  finally: srv.server_close()


def test_cli_summary_and_errors(recorded, tmp_path, capsys):
  assert viz_main(["--summary", recorded]) == 0
  out = capsys.readouterr().out
  t = viz.load(recorded)
  assert f"{len(t.kernels)} kernels" in out
  for k in t.kernels: assert f"kernel {k.name} on CPU: {len(k.steps)} steps, 1 launches" in out
  bad = tmp_path / "bad.jsonl"
  bad.write_text("nope\n")
  assert viz_main([str(bad)]) == 2
  assert "bad.jsonl:1: not JSON" in capsys.readouterr().err
  assert viz_main([str(tmp_path / "missing.jsonl")]) == 2
  assert "No such file" in capsys.readouterr().err


def _run(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
  full = {**os.environ, "DEV": "CPU", **env}
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout,
                        stdin=subprocess.DEVNULL)


def test_viz_env_writes_the_trace_and_prints_the_command_without_blocking(tmp_path):
  out = str(tmp_path / "run-{pid}.jsonl")
  code = "from tiny_tensor import Tensor; print((Tensor([1.0, 2.0]) * 5).tolist())"
  r = _run(code, {"VIZ": "1", "VIZ_OUT": out})  # stdout is a pipe: it must not serve (the timeout would fire)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "[5.0, 10.0]"
  (written,) = list(tmp_path.iterdir())
  assert f"VIZ: view it with: {os.path.basename(sys.executable)}" in r.stderr or sys.executable in r.stderr
  assert r.stderr.strip().endswith(f"-m tiny_tensor.viz {written}")
  t = viz.load(str(written))
  assert len(t.kernels) == 1 and len(t.launches) == 1 and t.kernels[0].source


def _own_terminal_session() -> None:
  """In the child before exec: a new session whose controlling terminal is its stdout (the pty's slave), so the pty
  is its own, and SIGINT at its default: a test run detached (`setsid nohup nox ... &`) inherits SIGINT ignored."""
  import fcntl
  import signal
  import termios
  fcntl.ioctl(1, termios.TIOCSCTTY, 0)  # start_new_session made this process a session leader: take the pty
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def _viz_in_a_pty(tmp_path, preexec) -> tuple[subprocess.Popen, int, str]:
  import pty
  out = tmp_path / "t.jsonl"
  master, slave = pty.openpty()
  env = {**os.environ, "DEV": "CPU", "VIZ": "1", "VIZ_OUT": str(out)}
  proc = subprocess.Popen([sys.executable, "-c", "from tiny_tensor import Tensor; (Tensor([3.0]) * 4).realize()"],
                          stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                          start_new_session=True, preexec_fn=preexec)
  os.close(slave)
  return proc, master, str(out)


def test_viz_env_serves_at_exit_when_stdout_is_a_terminal(tmp_path):
  """The child runs in its own session on its own pty, whatever terminal (or none) pytest has; Ctrl-C typed on that
  terminal (the pty turns ^C into SIGINT for its foreground process group) stops the server and the program."""
  import re
  import select
  proc, master, out = _viz_in_a_pty(tmp_path, _own_terminal_session)
  try:
    err, url = b"", None
    while url is None:
      ready, _, _ = select.select([proc.stderr], [], [], 120)
      assert ready and proc.poll() is None, f"no server came up: {err.decode()}"
      err += os.read(proc.stderr.fileno(), 4096)  # type: ignore[union-attr]
      if (m := re.search(rb"serving .* at (http://127\.0\.0\.1:\d+/)", err)): url = m.group(1).decode()
    with open(out, "rb") as f: assert urllib.request.urlopen(url + "trace.jsonl", timeout=30).read() == f.read()
    assert b'id="kernels"' in urllib.request.urlopen(url, timeout=30).read()
    os.write(master, b"\x03")  # Ctrl-C on the child's terminal
    assert proc.wait(timeout=60) == 0
  finally:
    if proc.poll() is None: proc.kill()
    proc.wait()
    os.close(master)


def _sigint_ignored() -> None:
  import signal
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_viz_env_does_not_serve_when_sigint_is_ignored(tmp_path):
  """A terminal on stdout but SIGINT ignored (how `cmd &` starts a job without job control): Ctrl-C could not stop a
  server, so it prints the command, says why it doesn't serve, and exits instead of blocking forever."""
  proc, master, out = _viz_in_a_pty(tmp_path, _sigint_ignored)
  try:
    assert proc.wait(timeout=120) == 0
    err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert f"-m tiny_tensor.viz {out}" in err and "not serving: SIGINT is ignored" in err, err
    assert "serving" not in err.replace("not serving", "")
  finally:
    if proc.poll() is None: proc.kill()
    proc.wait()
    os.close(master)


def test_viz_off_in_a_subprocess(tmp_path):
  r = _run("import tiny_tensor; from tiny_uop import trace; print(trace.RECORDER)",
           {"VIZ": "0", "VIZ_OUT": str(tmp_path / "x.jsonl")})
  assert r.returncode == 0 and r.stdout.strip() == "None" and "VIZ" not in r.stderr
  assert not list(tmp_path.iterdir())


def test_demo_trace(tmp_path):
  """VIZ=1 on the demo (3 steps: the jit compiles, captures and replays once): every kernel it compiled is listed
  with its pipeline and source, the training step's schedule's kernels are there, and the launches name those
  kernels. (Not every schedule's: a realize that writes a buffer other lazy tensors read may schedule once to see
  which values get buffers, then run a schedule that also computes those readers; the first one's kernels that the
  second doesn't share never compile.)"""
  out = tmp_path / "demo.jsonl"
  env = {**os.environ, "VIZ": "1", "VIZ_OUT": str(out), "DEV": "CPU", "PYTHONDONTWRITEBYTECODE": "1"}
  r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--steps", "3", "--quiet"],
                     capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "held-out test accuracy" in r.stdout and f"-m tiny_tensor.viz {out}" in r.stderr
  t = viz.load(str(out))
  kernels = {k.info["ast"]: k for k in t.kernels}
  assert len(kernels) >= 20
  ran = [s for s in t.schedules if set(s.info["kernels"]) <= set(kernels)]
  train = max(ran, key=lambda s: s.info["calls"])  # the training step's schedule
  assert len(train.info["kernels"]) >= 50
  for k in kernels.values():
    names = [s.name for s in k.steps]
    assert k.source and names[-1] == "linearize" and {"expander", "reduce", "dims", "decomp", "ends"} <= set(names)
  assert sum(any(s.rules for s in k.steps) for k in kernels.values()) > len(kernels) // 2  # rules fired and counted
  per_step = {ln.name for ln in t.launches}
  assert per_step <= {k.name for k in kernels.values()}
  assert len(t.launches) >= 3 * len(train.info["kernels"])  # 3 training steps (2 engine, 1 jit replay) at least


def test_docstring_example():
  import doctest
  res = doctest.testmod(viz)
  assert res.failed == 0 and res.attempted >= 4
