"""VIZ: see each schedule, each kernel and every rewrite of its pipeline in a browser.

Record, then look:

    VIZ=1 python examples/demo.py --steps 3        # at exit: prints the command below (and serves the page at once
    python -m tiny_tensor.viz /tmp/tiny-viz-123.jsonl   #  when stdout is a terminal); VIZ_OUT=PATH picks the file

While recording, tiny-uop's hooks (`tiny_uop.trace`) hand this package each schedule (the tensor graph -> the
kernels), each kernel's pipeline (every `graph_rewrite`: its name, the graph before and after, the rules that fired
and how often; the lowering stages; the final source) and each kernel launch (device, name, time). They go to a
JSON-lines trace in which every graph node is stored once (format: `tiny_tensor.viz.recorder`). With VIZ off the
hooks cost one check each.

The page (`python -m tiny_tensor.viz [--port N] TRACE`, standard-library HTTP server, static files shipped in
`tiny_tensor/viz/static`) lists the schedules and kernels; a kernel shows its steps, each as a graph (laid out in the
browser in layers, by our own code) with the nodes a step added and removed highlighted, the rules that fired, and
the kernel's source; a timeline shows the launches per device.

In code:

>>> import os, tempfile
>>> from tiny_tensor import Tensor, viz
>>> path = os.path.join(tempfile.mkdtemp(), "trace.jsonl")
>>> with viz.record(path):
...   _ = (Tensor([1.0, 2.0]) * 3 + 1).realize()
>>> t = viz.load(path)
>>> len(t.schedules) >= 1 and all(k.source for k in t.kernels)
True
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import tempfile
from typing import Iterator

from tiny_uop import trace
from tiny_uop.helpers import VIZ_OUT

from tiny_tensor.viz.reader import Trace, TraceError, load
from tiny_tensor.viz.recorder import VizRecorder

__all__ = ["enable", "disable", "record", "load", "Trace", "TraceError", "VizRecorder", "default_path"]


def default_path() -> str:
  """Where VIZ=1 writes: $VIZ_OUT ('{pid}' in it becomes the process id), else tiny-viz-PID.jsonl in the temp dir."""
  out = str(VIZ_OUT.value or "")
  if out: return out.replace("{pid}", str(os.getpid()))
  return os.path.join(tempfile.gettempdir(), f"tiny-viz-{os.getpid()}.jsonl")


def enable(path: str | None = None) -> VizRecorder:
  """Start recording into `path` (default: `default_path()`); an active VIZ recorder is closed first."""
  disable()
  rec = VizRecorder(path or default_path())
  trace.install(rec)
  return rec


def disable() -> str | None:
  """Stop recording; returns the trace file written (None when no VIZ recorder was active)."""
  rec = trace.RECORDER
  if not isinstance(rec, VizRecorder): return None
  trace.install(None)
  rec.close()
  return rec.path


@contextlib.contextmanager
def record(path: str | None = None) -> Iterator[VizRecorder]:
  """Record what runs inside the block into `path`: `with viz.record("t.jsonl"): ...`."""
  rec = enable(path)
  try: yield rec
  finally:
    if trace.RECORDER is rec: disable()
    else: rec.close()


def view_command(path: str) -> str:
  """The command that serves a trace."""
  py = os.path.basename(sys.executable) if os.path.dirname(sys.executable) in os.get_exec_path() else sys.executable
  return f"{py} -m tiny_tensor.viz {path}"


def _at_exit() -> None:
  rec = trace.RECORDER
  if not isinstance(rec, VizRecorder): return
  path = disable()
  assert path is not None
  c = rec.counts
  print(f"VIZ: {c['schedule']} schedules, {c['kernel']} kernels, {rec.n_steps} rewrite steps, {rec.n_launches} "
        f"launches in {path}\nVIZ: view it with: {view_command(path)}", file=sys.stderr, flush=True)
  if not sys.stdout.isatty(): return  # run by another program (stdout not a terminal): never block
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # started with SIGINT ignored (a `cmd &` background job of a non-interactive shell, nohup, some CI runners):
    # Ctrl-C could never stop the server, so serving would block this process forever
    print("VIZ: not serving: SIGINT is ignored in this process, so Ctrl-C could not stop the server",
          file=sys.stderr, flush=True)
    return
  from tiny_tensor.viz.server import serve_forever
  serve_forever(path)


def start_from_env() -> VizRecorder:
  """VIZ=1: record from now on into `default_path()`; at exit print how to view it, and serve it at once when stdout
  is a terminal and SIGINT is not ignored (Ctrl-C stops the server). Called by `import tiny_tensor`."""
  rec = enable()
  atexit.register(_at_exit)
  return rec
