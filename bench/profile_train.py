"""Per-kernel profile of `bench_train.py`'s jitted convnet step next to torch's per-op profile (issue #39).

tiny: the step's capture replayed, then each kernel run alone with a wait, the least of 5 (wall us and the launching
thread's CPU us); torch: `torch.profiler` self CPU time per op over 5 steps. Threads: `CPU_THREADS` (tiny) and
`torch.set_num_threads` both follow `PROFILE_THREADS` (default 1). Printed: sums, tiny's kernels in replay order and
by kind, torch's ops by self time, so the gaps can be ranked by the ms they lose.

`python bench/profile_train.py`
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

THREADS = int(os.environ.get("PROFILE_THREADS", "1"))
os.environ.setdefault("CPU_THREADS", str(THREADS))
os.environ.setdefault("DEV", "CPU")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_train as bt  # noqa: E402
import profile_models as pm  # noqa: E402


def tiny_kernels(reps: int = 5) -> tuple[list[tuple[float, float, str]], float]:
  """([(least wall us, least thread CPU us, name)] in replay order, least ms of 10 whole steps)."""
  with pm.replays_seen() as seen:
    step = bt.tiny_train_step()
    step()
  whole = min(_timed(step)[0] for _ in range(10)) * 1e3
  rows = []
  for c, run in pm.kernel_runs(seen):
    ts = [_timed(run) for _ in range(reps)]
    rows.append((min(t[0] for t in ts) * 1e6, min(t[1] for t in ts) * 1e6, c.name))
  return rows, whole


def torch_ops(steps: int = 5) -> tuple[list[tuple[float, str, int]], float]:
  """([(self CPU us per step, op name, calls per step)] by self time, least ms of 10 whole steps)."""
  import torch
  from torch.profiler import ProfilerActivity, profile
  torch.set_num_threads(THREADS)
  step = bt.torch_train_step()
  whole = min(_timed(step)[0] for _ in range(10)) * 1e3
  with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(steps): step()
  rows = [(e.self_cpu_time_total / steps, e.key, e.count // steps) for e in prof.key_averages()]
  return sorted(rows, reverse=True), whole


def _timed(fn: Any) -> tuple[float, float]:
  st, ct = time.perf_counter(), time.thread_time()
  fn()
  return time.perf_counter() - st, time.thread_time() - ct


if __name__ == "__main__":
  kernels, tiny_ms = tiny_kernels()
  ops, torch_ms = torch_ops()
  print(f"== threads {THREADS} | tiny: {len(kernels)} kernels, sum wall {sum(k[0] for k in kernels) / 1e3:.2f} ms, "
        f"step {tiny_ms:.2f} ms | torch step {torch_ms:.2f} ms, self sum {sum(o[0] for o in ops) / 1e3:.2f} ms | "
        f"load {os.getloadavg()[0]:.2f}")
  print("-- tiny kernels (wall us, thread CPU us, name)")
  for w, cpu, name in kernels: print(f"  {w:8.0f} {cpu:8.0f}  {name}")
  print("-- torch ops (self CPU us per step, op, calls per step)")
  for us, name, n in ops:
    if us >= 20: print(f"  {us:8.0f}  {name:40s} {n}")
