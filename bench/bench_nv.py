"""MOCK+CUDA and MOCK+NV: PTX executor kernels per second, and the host-side cost of a TinyJit replay through the
device's graph (CUDAGraph on MOCK+CUDA, HCQ2Graph on MOCK+NV).

1. kernels/s the PTX executor runs behind the mock driver (libcuda; or the RM/UVM driver whose GPU decodes GPFIFO
   entries, methods and QMDs), through jitted replays waited for: a small elementwise kernel (`a * b + a`, N floats)
   and a small matmul (M x M). Both results are checked against numpy.
2. µs per call of a jitted one-kernel function once replaying (MOCK+CUDA runs a kernel when it is launched, so this
   includes executing it; MOCK+NV's GPU runs when the host waits, so it is the host's cost of a replay: patch and
   submit), next to the first capture's cost, and the number of graphs built during the timed replays (it must stay
   0: a replay patches what was built after the capture).

`python bench/bench_nv.py` prints the rows; `run()` returns them.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np

DEVS = ("MOCK+CUDA", "MOCK+NV")
N = 256      # elementwise size
M = 16       # matmul size
REPS = 20    # waited replays per kernels/s measurement
CALLS = 200  # replays per host-overhead measurement


def _graph_cls(dev: str) -> Any:
  """The device's TinyJit graph class (MOCK+NV: HCQ2Graph; MOCK+CUDA: CUDAGraph)."""
  from tiny_uop.plugins import Device
  return Device[dev].graph


def _kernels_per_s(name: str, fn: Callable[[], Any], kernels: int, reps: int) -> float:
  """Kernels per second of process CPU time (the executor runs in this process; CPU time holds on a shared, loaded
  machine where wall time does not)."""
  from tiny_uop.plugins import Device
  dev = Device[name]
  for _ in range(3): fn()  # run, capture, first replay
  dev.synchronize()
  st = time.process_time()
  for _ in range(reps): fn()
  dev.synchronize()
  return reps * kernels / (time.process_time() - st)


def elementwise_kernels_per_s(name: str = DEVS[0]) -> float:
  from tiny_tensor import Tensor, TinyJit
  rng = np.random.default_rng(0)
  an, bn = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  a, b = Tensor(an, device=name).realize(), Tensor(bn, device=name).realize()
  f = TinyJit(lambda a, b: (a * b + a).realize())
  rate = _kernels_per_s(name, lambda: f(a, b), 1, REPS)
  np.testing.assert_allclose(f(a, b).numpy(), an * bn + an, rtol=1e-6)
  return rate


def matmul_kernels_per_s(name: str = DEVS[0]) -> float:
  from tiny_tensor import Tensor, TinyJit
  rng = np.random.default_rng(1)
  an, bn = rng.standard_normal((M, M)).astype(np.float32), rng.standard_normal((M, M)).astype(np.float32)
  a, b = Tensor(an, device=name).realize(), Tensor(bn, device=name).realize()
  f = TinyJit(lambda a, b: (a @ b).realize())
  f(a, b)
  f(a, b)
  rate = _kernels_per_s(name, lambda: f(a, b), f.captured.kernel_count, REPS)
  np.testing.assert_allclose(f(a, b).numpy(), an @ bn, rtol=1e-4, atol=1e-4)
  return rate


def replay_overhead(name: str = DEVS[0]) -> tuple[float, float, int]:
  """(µs per replay call, µs of the first capture, graphs built during the timed replays)."""
  Graph = _graph_cls(name)
  from tiny_tensor import Tensor, TinyJit
  from tiny_uop.plugins import Device
  dev = Device[name]
  x = Tensor(np.ones(16, np.float32), device=name).realize()
  f = TinyJit(lambda x: (x + 1).realize())
  f(x)  # call 1 compiles
  dev.synchronize()
  st = time.perf_counter()
  f(x)  # call 2 captures (and builds the graph)
  capture_us = (time.perf_counter() - st) * 1e6
  f(x)
  dev.synchronize()
  builds = Graph.builds
  means = []
  for _ in range(5):
    st = time.perf_counter()
    for _ in range(CALLS): f(x)
    means.append((time.perf_counter() - st) / CALLS)
    dev.synchronize()
  rebuilt = Graph.builds - builds
  assert f(x).tolist() == [2.0] * 16
  return sorted(means)[2] * 1e6, capture_us, rebuilt


def run() -> dict[str, dict[str, Any]]:
  rows: dict[str, dict[str, Any]] = {}
  for dev in DEVS:
    replay_us, capture_us, rebuilt = replay_overhead(dev)
    graph = _graph_cls(dev).__name__
    rows.update({
      f"{dev} kernels/s, elementwise {N}": {"tiny": elementwise_kernels_per_s(dev), "unit": "/s", "better": "higher"},
      f"{dev} kernels/s, matmul {M}x{M}": {"tiny": matmul_kernels_per_s(dev), "unit": "/s", "better": "higher"},
      f"{dev} TinyJit replay host cost, 1 kernel": {"tiny": replay_us, "tiny first capture": capture_us,
                                                     "unit": "us", "better": "lower",
                                                     "target": "replay << capture (no per-call build)"},
      f"{dev} {graph} builds during {5 * CALLS} replays": {"tiny": float(rebuilt), "unit": "", "better": "lower",
                                                           "target": "0"},
    })
  return rows


if __name__ == "__main__":
  for case, r in run().items():
    print(case, "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
  sys.exit(0)
