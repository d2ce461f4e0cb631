"""The 2-thread bound of ONNX models' TinyJit replays, measured without a free second CPU (issue #39, wt-threads2).

On a machine shared with other work the second vCPU is rarely free, so a 2-thread wall time says little. This
measures what does not need it, per kernel of the replay: one thread's time (its shares in turn, natively: the
kernel's one-kernel `CPUGraph` replay without a pool, least `time.thread_time` of `BOUND_RUNS`) and each share's
CPU time (one ctypes call with its `core_id`, least `thread_time`). The kernel's 2-thread bound is one thread's time
times the part of the work the busier of 2 threads does when they claim the shares in order, each the next free one
(`busier_part`: shares of equal time split 2 ways give 1/2, 3 such shares 2/3; one share 1). The model's bound is the
sum over its kernels. Then `BOUND_CALLS` whole jitted calls on the pool: how many shares the helper ran
(`NativePool.helper_shares`, where the runtime has it) of all the split kernels' shares.

`CPU_THREADS=2 python bench/bench_split_bound.py mobilenet_v3_small efficientnet_b0 resnet18 bert_tiny gpt2_tiny
convnet` (convnet: `bench_train`'s training step)
(run it once per tree to compare, its packages on PYTHONPATH); `-v` prints every kernel.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("CPU_THREADS", "2")
os.environ.setdefault("DEV", "CPU")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_models as bm  # noqa: E402
from profile_models import kernel_graphs, replays_seen  # noqa: E402

RUNS = int(os.environ.get("BOUND_RUNS", 30))
CALLS = int(os.environ.get("BOUND_CALLS", 50))


def busier_part(shares: list[float], threads: int = 2) -> float:
  """The part of the work (shares' times) the busier of `threads` threads does when each share in order goes to the
  thread that comes free first."""
  free = [0.0] * threads
  for s in shares: free[free.index(min(free))] += s
  return max(free) / max(sum(shares), 1e-12)


def model_call(name: str) -> Callable[[], Any]:
  """One jitted call of model `name`: an ONNX model of `bench_models`, or "convnet" (`bench_train`'s training step)."""
  if name == "convnet":
    import bench_train
    return bench_train.tiny_train_step()
  from tiny_tensor.nn.onnx import OnnxRunner
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{name}.onnx")
    _, feeds = bm.export_model(name, path)
    runner = OnnxRunner(path, jit=True)
  return lambda: runner(feeds)["y"].numpy()


def measure(name: str) -> tuple[list[tuple[str, int, float, float]], int, int, int]:
  """([(kernel, shares, one thread us, 2-thread bound us)], helper shares, split shares launched, calls)."""
  from tiny_uop.plugins import Device
  call = model_call(name)
  with replays_seen() as seen:
    for _ in range(3): call()
  rows = []
  for c, g, n, fxn, addrs in kernel_graphs(seen):
    one, shares = float("inf"), [float("inf")] * n
    for _ in range(RUNS):
      st = time.thread_time()
      g.runner(g.table_addr, g.count, None, 0, None)
      one = min(one, time.thread_time() - st)
      if n > 1:
        for i in range(n):
          st = time.thread_time()
          fxn(*addrs, i)
          shares[i] = min(shares[i], time.thread_time() - st)
    rows.append((c.name, n, one * 1e6, one * 1e6 * (busier_part(shares) if n > 1 else 1.0)))
  native = Device["CPU"].pool.native
  h0 = getattr(native, "helper_shares", -1)
  for _ in range(CALLS): call()
  helped = getattr(native, "helper_shares", -1) - h0 if h0 >= 0 else -1
  return rows, helped, CALLS * sum(r[1] for r in rows if r[1] > 1), CALLS


if __name__ == "__main__":
  verbose = "-v" in sys.argv
  for m in [a for a in sys.argv[1:] if a != "-v"] or ["mobilenet_v3_small", "efficientnet_b0"]:
    rows, helped, launched, calls = measure(m)
    one, bound = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"== {m}: {len(rows)} kernels, {sum(r[1] > 1 for r in rows)} split ({sum(r[1] for r in rows)} shares), "
          f"one thread {one:.0f} us, 2-thread bound {bound:.0f} us ({one / bound:.2f}x) | {calls} calls: helper ran "
          f"{helped} of {launched} split shares | CPU_THREADS={os.environ['CPU_THREADS']} "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    if verbose:
      for kname, n, o, b in rows: print(f"  {kname:34s} {n:3d} shares {o:8.1f} us, bound {b:8.1f}")
