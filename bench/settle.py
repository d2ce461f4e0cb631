"""Start every timing from the same state: other libraries' thread pools idle, this one's warm.

`settle()`: numpy's OpenBLAS and torch's OpenMP keep their worker threads busy-waiting for new work for a while
after a call (OpenBLAS: 2**28 cycles by default, ~0.1 s), each on a core. On a 2-core machine a library timed in
that window runs with one core instead of two: tiny's 1024² matmul timed right after numpy's `a @ b` read 107-141
GFLOPS, after a 0.5 s pause 132-184 (same process, alternating). Every timing function here calls `settle()` first,
whichever library it times, so none starts with another's spinning threads.

`warm_up(fn)`: after that pause the machine's idle cores are slow to come back. On the shared 2-core VM (KVM) a plain
C program splitting a 64 MB sum over two pthreads ran 1.6-2.1 ms when its runs came 0.3 ms apart, but 3.2-4.2 ms when
they came 100 ms apart (its second thread started 0.7-1.4 ms late, and even the first read memory at half speed);
tiny's two-thread `a.sum()` took 30-40 calls (~0.1 s) after a 0.5 s pause to come down from ~3.5 to ~2 ms, while
numpy's single thread was at its rate from the second call. One warm-up call measured that ramp, not the library.
So each timing first calls the function for WARM_S seconds (at least once), the same for every library: the
figures are steady-state ones, as `timeit`'s repeated loops give.
"""
from __future__ import annotations

import time
from typing import Any, Callable

SETTLE_S = 0.5
WARM_S = 0.25


def settle(seconds: float = SETTLE_S) -> None:
  """Sleep long enough for other libraries' idle workers to stop spinning and block."""
  time.sleep(seconds)


def warm_up(fn: Callable[[], Any], seconds: float = WARM_S) -> int:
  """Call `fn` until `seconds` have passed (at least once); the number of calls."""
  end, calls = time.perf_counter() + seconds, 0
  while True:
    fn()
    calls += 1
    if time.perf_counter() >= end: return calls


def time_in_turns(fns: dict[str, Callable[[], Any]], rounds: int, reps: int,
                  min_s: float = 0.0) -> dict[str, list[float]]:
  """Seconds per call of each of `fns`, the libraries taking turns: in each of `rounds` rounds every function gets
  `settle()`, `warm_up(fn)` and then `reps` timed calls, or as many as fill `min_s` seconds at the warm-up's pace
  (a 1 ms model's median of 4 calls a round is decided by one preempted call; 100 ms of them samples the machine).
  This 2-core VM's speed drifts over seconds (the same compute-bound kernel, called back to back, 15-28 ms on 2
  threads), so timing one library and then the next compares two different machines; in turns, each library's calls
  sample the same stretch of time."""
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      settle()
      calls = warm_up(fn)
      for _ in range(max(reps, int(calls * min_s / WARM_S))):
        st = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - st)
  return times
