"""Time a jitted `OnnxRunner` call spends outside its graph replay (issue #39).

`OnnxRunner(path, jit=True)(feeds)["y"].numpy()` as bench_models.py calls it (numpy feeds in, a numpy array out), per
model (default mobilenet_v3_small and bert_tiny; `BENCH_ONNX_CALL_N` calls, default 400, after 4 warm-up calls):
- `call`: median wall µs of the whole call; `replay`: median µs of its `CapturedJit` call (the graph replay);
  `outside`: median of (call - replay) per call, and of that the input's copy-in (`engine.copy_into` or
  `Buffer.copyin`) and the output's `.numpy()`; `thread`: median thread CPU µs of the whole call.
- `host`: thread CPU µs per call with the replay replaced by returning its outputs as they are (least of 7 rounds of
  2000 calls): the layers alone, caches warm.
The figures in situ move with the machine's load: run base and branch in separate processes in turns. Run:
`python bench/bench_onnx_call.py [model ...]`.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DEV", "CPU")

N = int(os.environ.get("BENCH_ONNX_CALL_N", "400"))


def measure(name: str, path: str, feeds: dict[str, Any]) -> dict[str, float]:
  from tiny_tensor import Tensor, engine
  from tiny_tensor import jit as J
  from tiny_tensor.nn.onnx import OnnxRunner
  from tiny_uop.device import Buffer
  acc: dict[str, int] = {}
  saved: list[tuple[Any, str, Any]] = []

  def wrap(obj: Any, attr: str, key: str) -> None:
    f = getattr(obj, attr)
    saved.append((obj, attr, f))

    def g(*a: Any, **k: Any) -> Any:
      t = time.perf_counter_ns()
      r = f(*a, **k)
      acc[key] = acc.get(key, 0) + time.perf_counter_ns() - t
      return r
    setattr(obj, attr, g)
  r = OnnxRunner(path, jit=True)
  for _ in range(4): r(feeds)["y"].numpy()
  wrap(J.CapturedJit, "__call__", "replay")
  wrap(engine, "copy_into", "copy_into")
  wrap(Buffer, "copyin", "copyin")  # (copy_into calls it: the copy-in is the larger of the two)
  wrap(Tensor, "numpy", "numpy")
  rows = []
  for _ in range(N):
    acc.clear()
    t, c = time.perf_counter_ns(), time.thread_time_ns()
    r(feeds)["y"].numpy()
    c, t = time.thread_time_ns() - c, time.perf_counter_ns() - t
    rows.append((t, acc["replay"], max(acc.get("copy_into", 0), acc.get("copyin", 0)), acc.get("numpy", 0), c))
  for obj, attr, f in reversed(saved): setattr(obj, attr, f)
  med = [statistics.median(x[i] for x in rows) / 1e3 for i in range(5)]
  out = {"call": med[0], "replay": med[1], "outside": statistics.median(x[0] - x[1] for x in rows) / 1e3,
         "copy_in": med[2], "numpy": med[3], "thread": med[4]}
  orig = J.CapturedJit.__call__
  J.CapturedJit.__call__ = lambda self, inputs, var_vals: self.ret  # type: ignore[method-assign]
  try:
    best = float("inf")
    for _ in range(7):
      c = time.thread_time_ns()
      for _ in range(2000): r(feeds)["y"].numpy()
      best = min(best, (time.thread_time_ns() - c) / 2000 / 1e3)
  finally: J.CapturedJit.__call__ = orig  # type: ignore[method-assign]
  out["host"] = best
  return out


def main(models: list[str]) -> None:
  from bench_models import export_model
  with tempfile.TemporaryDirectory() as d:
    for name in models:
      path = os.path.join(d, f"{name}.onnx")
      _, feeds = export_model(name, path)
      row = measure(name, path, feeds)
      print(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()) + " (us)", flush=True)


if __name__ == "__main__": main(sys.argv[1:] or ["mobilenet_v3_small", "bert_tiny"])
