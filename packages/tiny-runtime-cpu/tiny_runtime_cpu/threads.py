"""A persistent pool of worker threads that run the `core_id` shares of a CPU kernel launch.

A launch of `n` shares puts itself on the queue once per helper it wants; each helper (and the launching thread)
claims share numbers from the launch's counter until none are left, so a launch never waits for a busy worker
and several Python threads can launch at once. Native kernels are called through ctypes, which releases the GIL,
so the shares run in parallel.
"""
from __future__ import annotations

import _thread
import itertools
import os
import queue
import threading
import time
from typing import Callable


class _Launch:
  """One launch's shares. Both counters are `itertools.count`s, whose `next()` is atomic under the GIL: each share is
  claimed exactly once, and whoever finishes the last share releases `done` (a lock taken at creation), so neither
  side needs a lock or an Event (whose `wait` builds a Condition waiter per call) on the hot path."""
  __slots__ = ("fn", "n", "next", "finished", "done", "error")

  def __init__(self, fn: Callable[[int], None], n: int):
    self.fn, self.n = fn, n
    self.next, self.finished = itertools.count(), itertools.count(1)
    self.done = _thread.allocate_lock()
    self.done.acquire()
    self.error: BaseException | None = None

  def work(self) -> None:
    while (i := next(self.next)) < self.n:
      try: self.fn(i)
      except BaseException as e:  # noqa: BLE001 -- reported to the launching thread
        self.error = e
      if next(self.finished) == self.n: self.done.release()


class ThreadPool:
  """`run(fn, n)` calls `fn(0) ... fn(n-1)` spread over `workers` helper threads plus the caller; returns when done."""

  spin_s = 50e-6
  """How long a helper keeps polling for the next launch after finishing one before it blocks on the queue. A poll
  is `get_nowait` then `sleep(0)`, which gives up the GIL and the core (Linux: for ~50-200 µs of timer slack and
  scheduling under load), so in practice a helper looks once or twice more before blocking: enough that launches in
  a replay, a few µs apart, find it awake, while an idle pool uses no CPU. (A hot spin would hold the GIL that the
  launching thread needs, and take a core the 2-core machines we measure on don't have to spare.)"""

  def __init__(self, workers: int):
    self.workers = max(0, workers)
    self.queue: queue.SimpleQueue[_Launch | None] = queue.SimpleQueue()
    self.threads: list[threading.Thread] = []
    self._lock = threading.Lock()
    if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=self._after_fork)

  def _after_fork(self) -> None:
    """A forked child has none of the parent's threads: start afresh (on the next launch)."""
    self.queue = queue.SimpleQueue()
    self.threads = []
    self._lock = threading.Lock()

  def _start(self) -> None:
    with self._lock:
      while len(self.threads) < self.workers:
        t = threading.Thread(target=self._loop, name=f"tiny-cpu-{len(self.threads)}", daemon=True)
        t.start()
        self.threads.append(t)

  def _loop(self) -> None:
    q, get_nowait, clock, pause = self.queue, self.queue.get_nowait, time.perf_counter, time.sleep
    while True:
      got = False
      if self.spin_s > 0:  # back-to-back launches (a replay) find this thread awake: no futex wake-up to wait for
        until = clock() + self.spin_s
        while not got and clock() < until:
          try: launch, got = get_nowait(), True
          except queue.Empty: pause(0)  # releases the GIL for the launching thread
      if not got: launch = q.get()
      if launch is None: return  # close()'s stop marker, whether it came while polling or blocked
      launch.work()

  def run(self, fn: Callable[[int], None], n: int) -> None:
    if n <= 0: return
    if n == 1 or self.workers == 0:
      for i in range(n): fn(i)
      return
    if len(self.threads) < self.workers: self._start()
    launch = _Launch(fn, n)
    for _ in range(min(n - 1, self.workers)): self.queue.put(launch)
    launch.work()
    launch.done.acquire()  # at once when this thread finished the last share (the common case for short kernels)
    if launch.error is not None: raise launch.error

  def close(self) -> None:
    """Stop the helper threads (they finish the launches already queued)."""
    with self._lock:
      for _ in self.threads: self.queue.put(None)
      self.threads = []


def default_threads(setting: int) -> int:
  """Threads per launch: `setting` when positive (CPU_THREADS), else the cores this process may use."""
  if setting > 0: return setting
  try: return max(1, len(os.sched_getaffinity(0)))
  except AttributeError: return max(1, os.cpu_count() or 1)
