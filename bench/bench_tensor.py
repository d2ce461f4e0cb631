"""Tensor eager overhead: `(a + 1).realize()` on a 64x64 float32 tensor, with the kernel already compiled and cached.

This measures everything around the kernel: building the graph, finding its cached schedule by structure and
replaying it (the engine's eager replay: no schedule is built), buffer allocation and the launch. Side by side with
torch (`a + 1`) and tinygrad (`(a + 1).realize()`) when they are importable (tinygrad's CPU device needs clang on
PATH). Target: <= 15 us for tiny (issue #39; it was <= 50 us in issue #23).
`tiny cpu` is the same loop in process CPU time (steadier than wall time on a shared machine). The breakdown: building
the graph, then that and finding its cached schedule (`cached_template`), then that and building the schedule as a
realize did before the replay (`create_schedule`, cached). The last row is the same op with VIZ off (the recording
hooks cost one check each) next to VIZ=1 (recording every schedule and launch into a trace: every realize is
scheduled).
`python bench/bench_tensor.py` prints the table; `run()` returns it.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any, Callable

import numpy as np

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU: with an OpenCL ICD installed (PoCL)
                                    # tinygrad would otherwise pick CL

REPS = 200


def per_call_us(fn: Callable[[], Any], reps: int = REPS, clock: Callable[[], float] = time.perf_counter) -> float:
  """Median-of-5 of the mean time per call over `reps` calls, in microseconds (after warm-up)."""
  for _ in range(10): fn()
  means = []
  for _ in range(5):
    st = clock()
    for _ in range(reps): fn()
    means.append((clock() - st) / reps)
  return sorted(means)[2] * 1e6


def run() -> dict[str, dict[str, Any]]:
  x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
  row: dict[str, Any] = {"unit": "us", "target": "tiny <= 15 us", "better": "lower"}
  from tiny_tensor import Tensor
  a = Tensor(x)
  row["tiny"] = per_call_us(lambda: (a + 1).realize())
  row["tiny cpu"] = per_call_us(lambda: (a + 1).realize(), clock=time.process_time)
  try:
    import torch
    ta = torch.from_numpy(x)
    row["torch"] = per_call_us(lambda: ta + 1)
  except ImportError: pass
  if shutil.which("clang") is None: row["tinygrad"] = "n/a (its CPU device compiles with clang: not on PATH)"
  else:
    try:
      import tinygrad  # type: ignore[import-not-found]
      ga = tinygrad.Tensor(x).realize()
      row["tinygrad"] = per_call_us(lambda: (ga + 1).realize())
    except ImportError: pass
  row["numpy"] = per_call_us(lambda: x + 1)
  # where the time goes: building the graph, scheduling it (cached by structure), then running the kernel
  from tiny_codegen.schedule import cached_template, create_schedule
  from tiny_uop import UOp
  parts: dict[str, Any] = {"unit": "us", "better": "lower"}
  parts["tiny graph"] = per_call_us(lambda: a + 1)
  parts["tiny find schedule"] = per_call_us(lambda: cached_template(((a + 1).uop,)))
  parts["tiny schedule (built)"] = per_call_us(lambda: create_schedule(UOp.sink((a + 1).uop)))
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
