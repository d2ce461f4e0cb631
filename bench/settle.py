"""Let the thread pools of the library timed before go idle before timing the next one.

numpy's OpenBLAS and torch's OpenMP keep their worker threads busy-waiting for new work for a while after a call
(OpenBLAS: 2**28 cycles by default, ~0.1 s), each on a core. On a 2-core machine a library timed in that window runs
with one core instead of two: tiny's 1024² matmul timed right after numpy's `a @ b` read 107-141 GFLOPS, after a
0.5 s pause 132-184 (same process, alternating). Every timing function here calls `settle()` first, whichever
library it times, so none starts with another's spinning threads.
"""
from __future__ import annotations

import time

SETTLE_S = 0.5


def settle(seconds: float = SETTLE_S) -> None:
  """Sleep long enough for other libraries' idle workers to stop spinning and block."""
  time.sleep(seconds)
