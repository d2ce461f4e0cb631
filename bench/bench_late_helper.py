"""The jit call's time distribution of ONNX models when a helper thread comes late (issue #39, wt-pool3).

A 2-thread replay's median is set by the calls where a thread of the pool loses its vCPU (another process, the host)
at the wrong time. This times `LATE_CALLS` jitted calls of each model (perf_counter per call, after a warm-up) and
prints min / median / p90 / max in µs, the process's and the launching thread's CPU time per call (the difference:
the helper's, shares and polls), how many shares the helper ran and how often the launching thread blocked
(`NativePool.helper_shares`, `launcher_blocks`, where the runtime has them). `--burn K` runs K processes that spin
(`python -c "while 1: pass"`) meanwhile: controlled interference on top of whatever else the machine runs.

`CPU_THREADS=2 python bench/bench_late_helper.py [--burn 1] mobilenet_v3_small efficientnet_b0`
(run it once per tree to compare, in turns, its packages on PYTHONPATH).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

os.environ.setdefault("CPU_THREADS", "2")
os.environ.setdefault("DEV", "CPU")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CALLS = int(os.environ.get("LATE_CALLS", 200))


def pct(xs: list[float], p: float) -> float:
  s = sorted(xs)
  return s[min(len(s) - 1, int(p * len(s)))]


def main() -> None:
  from bench_split_bound import model_call
  from tiny_uop.plugins import Device
  args, burn = sys.argv[1:], 0
  if "--burn" in args:
    i = args.index("--burn")
    burn = int(args[i + 1])
    del args[i:i + 2]
  calls = {name: model_call(name) for name in args or ["mobilenet_v3_small", "efficientnet_b0"]}
  for call in calls.values():
    for _ in range(5): call()
  native = getattr(Device["CPU"].pool, "native", None)
  burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(burn)]
  try:
    time.sleep(0.2 if burn else 0)
    for name, call in calls.items():
      h0, b0 = getattr(native, "helper_shares", 0), getattr(native, "launcher_blocks", 0)
      ts, c0, t0 = [], time.process_time(), time.thread_time()
      for _ in range(CALLS):
        st = time.perf_counter()
        call()
        ts.append((time.perf_counter() - st) * 1e6)
      cpu, mine = (time.process_time() - c0) / CALLS * 1e6, (time.thread_time() - t0) / CALLS * 1e6
      h1, b1 = getattr(native, "helper_shares", 0), getattr(native, "launcher_blocks", 0)
      print(f"{name:20s} burn={burn} min {min(ts):8.0f} med {pct(ts, 0.5):8.0f} p90 {pct(ts, 0.9):8.0f} "
            f"max {max(ts):8.0f} us  cpu/call {cpu:6.0f} (launcher {mine:6.0f}) us  "
            f"helper shares/call {(h1 - h0) / CALLS:6.1f}  "
            f"blocks/call {(b1 - b0) / CALLS:6.2f}  load {os.getloadavg()[0]:.1f}", flush=True)
  finally:
    for p in burners: p.kill()
    for p in burners: p.wait()


if __name__ == "__main__": main()
