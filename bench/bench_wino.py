"""resnet18 (or any `bench_models` model) through the ONNX runner's TinyJit with its 3x3 convs direct (`ONNX_WINO=0`)
and as Winograd where `tiny_tensor.winograd.winograd_tile` picks it (`ONNX_WINO=1`, the default), next to
onnxruntime, the three taking turns (`settle.time_in_turns`), on `CPU_THREADS` threads (onnxruntime's intra-op threads
the same): median ms per inference, the jit's kernels per replay, each side's outputs checked against onnxruntime's.
Also each conv's choice (the rule's per-conv m, by output shape).

`CPU_THREADS=1 python bench/bench_wino.py [model ...]` (needs onnx, onnxruntime and torch).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile

os.environ.setdefault("DEV", "CPU")
os.environ.setdefault("CPU_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_models as bm  # noqa: E402
from settle import time_in_turns  # noqa: E402


def run(name: str, turns: int = 5, reps: int = 10) -> dict[str, float]:
  import onnxruntime as ort
  from tiny_tensor.nn.onnx import OnnxRunner
  from tiny_uop.helpers import Context
  threads = int(os.environ["CPU_THREADS"])
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{name}.onnx")
    _, feeds = bm.export_model(name, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    runners = {"direct": OnnxRunner(path, jit=True), "winograd": OnnxRunner(path, jit=True)}
  want = sess.run(None, feeds)[0]
  for k, r in runners.items():
    with Context(ONNX_WINO=int(k == "winograd")):
      for i in range(3): bm._close(name, f"{k} call {i + 1}", r(feeds)["y"].numpy(), want)
  fns = {"direct": lambda: runners["direct"](feeds)["y"].numpy(),
         "winograd": lambda: runners["winograd"](feeds)["y"].numpy(), "onnxruntime": lambda: sess.run(None, feeds)}
  times = time_in_turns(fns, turns, reps, min_s=bm.TURN_S)
  row = {k: statistics.median(t) * 1e3 for k, t in times.items()}
  for k, r in runners.items(): row[f"{k}_kernels"] = float(next(iter(r.jits.values())).captured.kernel_count)
  return row


if __name__ == "__main__":
  for name in sys.argv[1:] or ["resnet18"]:
    row = run(name)
    print(f"{name} ({bm.cpu_name()}, {os.environ['CPU_THREADS']} thread(s)): " +
          ", ".join(f"{k} {v:.2f} ms" if not k.endswith("kernels") else f"{k} {v:.0f}" for k, v in row.items()) +
          f"; winograd/onnxruntime {row['winograd'] / row['onnxruntime']:.3f}x, "
          f"direct/onnxruntime {row['direct'] / row['onnxruntime']:.3f}x", flush=True)
