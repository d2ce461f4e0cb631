"""Tensor eager overhead: `(a + 1).realize()` on a 64x64 float32 tensor, with the kernel already compiled and cached.

This measures everything around the kernel: building the graph, scheduling (cached by structure), the program cache,
buffer allocation and the launch. Side by side with torch (`a + 1`) and tinygrad (`(a + 1).realize()`) when they are
importable. Target: <= 50 us for tiny (issue #23). The last row is the same op with VIZ off (the recording hooks
cost one check each) next to VIZ=1 (recording every schedule and launch into a trace). `python bench/bench_tensor.py`
prints the table; `run()` returns it.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import numpy as np

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU: with an OpenCL ICD installed (PoCL)
                                    # tinygrad would otherwise pick CL

REPS = 200


def per_call_us(fn: Callable[[], Any], reps: int = REPS) -> float:
  """Median-of-5 of the mean time per call over `reps` calls, in microseconds (after warm-up)."""
  for _ in range(10): fn()
  means = []
  for _ in range(5):
    st = time.perf_counter()
    for _ in range(reps): fn()
    means.append((time.perf_counter() - st) / reps)
  return sorted(means)[2] * 1e6


def run() -> dict[str, dict[str, Any]]:
  x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
  row: dict[str, Any] = {"unit": "us", "target": "tiny <= 50 us", "better": "lower"}
  from tiny_tensor import Tensor
  a = Tensor(x)
  row["tiny"] = per_call_us(lambda: (a + 1).realize())
  try:
    import torch
    ta = torch.from_numpy(x)
    row["torch"] = per_call_us(lambda: ta + 1)
  except ImportError: pass
  try:
    import tinygrad  # type: ignore[import-not-found]
    ga = tinygrad.Tensor(x).realize()
    row["tinygrad"] = per_call_us(lambda: (ga + 1).realize())
  except ImportError: pass
  row["numpy"] = per_call_us(lambda: x + 1)
  # where the time goes: building the graph, scheduling it (cached by structure), then running the kernel
  from tiny_codegen.schedule import create_schedule
  from tiny_uop import UOp
  parts: dict[str, Any] = {"unit": "us", "better": "lower"}
  parts["tiny graph"] = per_call_us(lambda: a + 1)
  parts["tiny schedule"] = per_call_us(lambda: create_schedule(UOp.sink((a + 1).uop)))
  # VIZ: the same cached op with the recording hooks empty (VIZ off, the default: one check per hook) and recording
  viz_row: dict[str, Any] = {"unit": "us", "better": "lower", "target": "VIZ off: as the first row"}
  viz_row["tiny"] = per_call_us(lambda: (a + 1).realize())
  import tempfile
  from tiny_tensor import viz
  with tempfile.TemporaryDirectory() as d, viz.record(os.path.join(d, "bench.jsonl")):
    viz_row["tiny VIZ=1"] = per_call_us(lambda: (a + 1).realize())
  return {"(a+1).realize() 64x64, cached": row, "(a+1) breakdown (tiny)": parts,
          "(a+1).realize() cached: VIZ off | on": viz_row}


if __name__ == "__main__":
  for case, r in run().items():
    print(case, "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
  sys.exit(0)
