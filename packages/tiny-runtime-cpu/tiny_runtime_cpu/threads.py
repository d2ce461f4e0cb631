"""A persistent pool of worker threads that run the `core_id` shares of a CPU kernel launch.

A launch of `n` shares puts itself on the queue once per helper it wants; each helper (and the launching thread)
claims share numbers from the launch's counter until none are left, so a launch never waits for a busy worker
and several Python threads can launch at once. Native kernels are called through ctypes, which releases the GIL,
so the shares run in parallel.
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
from typing import Callable


class _Launch:
  __slots__ = ("fn", "n", "next", "left", "lock", "done", "error")

  def __init__(self, fn: Callable[[int], None], n: int):
    self.fn, self.n = fn, n
    self.next = itertools.count()    # next() is atomic under the GIL: each share is claimed exactly once
    self.left = n
    self.lock = threading.Lock()
    self.done = threading.Event()
    self.error: BaseException | None = None

  def work(self) -> None:
    finished = 0
    while (i := next(self.next)) < self.n:
      try: self.fn(i)
      except BaseException as e:  # noqa: BLE001 -- reported to the launching thread
        self.error = e
      finished += 1
    if finished:
      with self.lock:
        self.left -= finished
        if self.left == 0: self.done.set()


class ThreadPool:
  """`run(fn, n)` calls `fn(0) ... fn(n-1)` spread over `workers` helper threads plus the caller; returns when done."""

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
    while (launch := self.queue.get()) is not None: launch.work()

  def run(self, fn: Callable[[int], None], n: int) -> None:
    if n <= 0: return
    if n == 1 or self.workers == 0:
      for i in range(n): fn(i)
      return
    if len(self.threads) < self.workers: self._start()
    launch = _Launch(fn, n)
    for _ in range(min(n - 1, self.workers)): self.queue.put(launch)
    launch.work()
    launch.done.wait()
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
