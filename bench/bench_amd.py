"""MOCK+AMD: emulated kernels per second, and the host-side cost of a TinyJit replay through HCQ2 (its device graph).

1. kernels/s the mock gfx1100 runs (PM4 decoded by the mock command processor, code executed by the RDNA3
   emulator), through jitted replays waited for: a small elementwise kernel (`a * b + a`, N floats) and a small
   matmul (M x M). Both results are checked against numpy.
2. µs per call of a jitted one-kernel function once replaying (host side only: the calls are not waited for, the mock
   GPU runs the queued kernels after the clock stops): the process CPU time per call, the least over batches (robust
   on a shared, loaded machine), and the median wall time per call; next to the first capture's cost, and the number
   of command buffers built during the timed replays (it must stay 0: a replay patches and resubmits the command
   buffer built after the capture). Next to it in the same run: the same calls replayed kernel by kernel without a
   graph (`JIT=2`, an eager launch per kernel).

`python bench/bench_amd.py` prints the rows; `run()` returns them. Needs ld.lld (the AMDGPU compiler links with it).
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np

DEV = "MOCK+AMD"
N = 256      # elementwise size
M = 16       # matmul size
REPS = 20    # waited replays per kernels/s measurement
CALLS = 200  # replays per host-overhead measurement (fits the ring: nothing runs while the clock runs)
BATCHES = 9  # host-overhead measurements


def _kernels_per_s(fn: Callable[[], Any], kernels: int, reps: int) -> float:
  """Kernels per second of process CPU time (the mock GPU runs in this process; CPU time holds on a shared, loaded
  machine where wall time does not)."""
  from tiny_uop.plugins import Device
  dev = Device[DEV]
  for _ in range(3): fn()  # run, capture, first replay
  dev.synchronize()
  st = time.process_time()
  for _ in range(reps): fn()
  dev.synchronize()
  return reps * kernels / (time.process_time() - st)


def elementwise_kernels_per_s() -> float:
  from tiny_tensor import Tensor, TinyJit
  rng = np.random.default_rng(0)
  an, bn = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  a, b = Tensor(an, device=DEV).realize(), Tensor(bn, device=DEV).realize()
  f = TinyJit(lambda a, b: (a * b + a).realize())
  rate = _kernels_per_s(lambda: f(a, b), 1, REPS)
  np.testing.assert_allclose(f(a, b).numpy(), an * bn + an, rtol=1e-6)
  return rate


def matmul_kernels_per_s() -> float:
  from tiny_tensor import Tensor, TinyJit
  rng = np.random.default_rng(1)
  an, bn = rng.standard_normal((M, M)).astype(np.float32), rng.standard_normal((M, M)).astype(np.float32)
  a, b = Tensor(an, device=DEV).realize(), Tensor(bn, device=DEV).realize()
  f = TinyJit(lambda a, b: (a @ b).realize())
  f(a, b)
  f(a, b)
  rate = _kernels_per_s(lambda: f(a, b), f.captured.kernel_count, REPS)
  np.testing.assert_allclose(f(a, b).numpy(), an @ bn, rtol=1e-4, atol=1e-4)
  return rate


def replay_overhead(jit: int = 1) -> tuple[float, float, float, int]:
  """(CPU µs per replay call (least over batches), wall µs per call (median batch), µs of the first capture, command
  buffers built during the timed replays), through HCQ2's graph (`jit=1`) or kernel by kernel (`jit=2`)."""
  from tiny_tensor import Tensor, TinyJit
  from tiny_uop import Context
  from tiny_uop.hcq2 import HCQ2Graph
  from tiny_uop.plugins import Device
  dev = Device[DEV]
  with Context(JIT=jit):
    x = Tensor(np.ones(16, np.float32), device=DEV).realize()
    f = TinyJit(lambda x: (x + 1).realize())
    f(x)  # call 1 compiles
    dev.synchronize()
    st = time.perf_counter()
    f(x)  # call 2 captures (and builds the graph)
    capture_us = (time.perf_counter() - st) * 1e6
    f(x)
    dev.synchronize()
    builds = HCQ2Graph.builds
    walls, cpus = [], []
    for _ in range(BATCHES):
      st, cst = time.perf_counter(), time.process_time()
      for _ in range(CALLS): f(x)
      cpus.append((time.process_time() - cst) / CALLS)
      walls.append((time.perf_counter() - st) / CALLS)
      dev.synchronize()  # the mock GPU runs the queued replays here, off the clock
    rebuilt = HCQ2Graph.builds - builds
    assert f(x).tolist() == [2.0] * 16
    graphs = [type(c.graph) for c in f.captured.plan if hasattr(c, "graph")]
    assert graphs == ([HCQ2Graph] if jit == 1 else [])
  return min(cpus) * 1e6, sorted(walls)[len(walls) // 2] * 1e6, capture_us, rebuilt


def run() -> dict[str, dict[str, Any]]:
  replay_us, wall_us, capture_us, rebuilt = replay_overhead(1)
  eager_us, eager_wall_us, _, _ = replay_overhead(2)
  return {
    f"MOCK+AMD kernels/s, elementwise {N}": {"tiny": elementwise_kernels_per_s(), "unit": "/s", "better": "higher"},
    f"MOCK+AMD kernels/s, matmul {M}x{M}": {"tiny": matmul_kernels_per_s(), "unit": "/s", "better": "higher"},
    "MOCK+AMD TinyJit replay host cost, 1 kernel": {"tiny": replay_us, "tiny wall": wall_us,
                                                    "tiny first capture": capture_us, "JIT=2": eager_us,
                                                    "JIT=2 wall": eager_wall_us, "unit": "us", "better": "lower",
                                                    "target": "replay << capture (no per-call build)"},
    f"MOCK+AMD HCQ2Graph builds during {BATCHES * CALLS} replays": {"tiny": float(rebuilt), "unit": "",
                                                              "better": "lower", "target": "0"},
  }


if __name__ == "__main__":
  for case, r in run().items():
    print(case, "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
  sys.exit(0)
