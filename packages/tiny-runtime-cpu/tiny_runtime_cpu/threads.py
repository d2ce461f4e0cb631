"""A persistent pool of worker threads that run the `core_id` shares of a CPU kernel launch.

A launch of `n` shares puts itself on the queue once per helper it wants; each helper (and the launching thread)
claims share numbers from the launch's counter until none are left, so a launch never waits for a busy worker
and several Python threads can launch at once. Native kernels are called through ctypes, which releases the GIL,
so the shares run in parallel.

With native dispatch (`make_native`: the CPU device's `native_pool.NativePool`), a kernel launch (`run_native`) is
instead published in a shared block that the helpers poll natively, without the GIL, for `native_spin_s` after
their last launch; shares are claimed and run there too, and the launching thread waits for the last share natively:
it spins for twice its own share's time, then blocks (futex) until the last share's thread wakes it, giving its core
to a helper the OS had descheduled; a polling helper yields its core once past its own last share's time
(`native_pool`; x86-64 Linux, elsewhere both spin).
A helper that saw no launch for that long blocks on the queue, and the next native launch puts a token there for
it. One native launch runs at a time: a launch from a second Python thread meanwhile takes the queue path.
"""
from __future__ import annotations

import _thread
import atexit
import ctypes
import itertools
import os
import queue
import threading
import time
from typing import Any, Callable

GEN_MAX = 0x7FFFFFFF
"""The largest launch generation (it is the high half of the native block's `next` word, kept below 2**31)."""


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

  native_spin_s = 1e-3
  """With native dispatch: how long a helper that ran a launch's shares polls for the next launch (natively, without
  the GIL) before it blocks in Python. OpenMP runtimes and OpenBLAS keep their workers spinning for longer."""

  def __init__(self, workers: int, make_native: Callable[[], Any] | None = None):
    """`make_native()`, called when the first helper starts, gives a `native_pool.NativePool`: launches of native
    kernels (`run_native`) are then published to the helpers and claimed without the GIL. None: Python dispatch only."""
    self.workers = max(0, workers)
    self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
    self.threads: list[threading.Thread] = []
    self._lock = threading.Lock()
    self.make_native, self.native = make_native, None
    self.native_iters = 0  # native_spin_s in ticks or polls (`_calibrate`): measured when the first helper starts
    self.asleep: list[bool] = []  # per helper: blocked in Python (a native launch puts a token on the queue for each)
    self._native_lock = threading.Lock()  # one native launch at a time; others take the Python path
    self._native_busy = False  # a native launch or replay runs: set (under the GIL) before sleeping helpers are counted
    self._gen = 0  # the last launch generation published (1..GEN_MAX; under _native_lock)
    if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=self._after_fork)
    if make_native is not None: atexit.register(self._join_at_exit)

  def _join_at_exit(self) -> None:
    """Before the interpreter tears modules down (and with them the loaded code the helpers may still be polling
    in, for up to `native_spin_s`): stop the helpers and wait for them."""
    threads = list(self.threads)
    self.close()
    for t in threads: t.join(1.0)

  def _calibrate(self) -> int:
    """The helpers' idle bound, `native_spin_s`, in what `native.helper` counts: ticks of the CPU's tick counter
    where the helpers yield (a yield can give the core away for a scheduler slice, so polls would not measure time),
    else native polls (a poll's cost differs by CPU: x86's `pause` is 10-150 cycles)."""
    assert self.native is not None
    if (ticks := self.native.ticks) is not None:  # two clocks read around a sleep: the ratio holds under any load
      t0, w0 = ticks(), time.perf_counter()
      time.sleep(2e-3)
      t1, w1 = ticks(), time.perf_counter()
      return max(1, int((t1 - t0) / max(w1 - w0, 1e-9) * self.native_spin_s))
    probe, n, best = (ctypes.c_int64 * 8)(), 1 << 14, float("inf")
    for _ in range(3):
      st = time.perf_counter()
      self.native.helper(ctypes.addressof(probe), 0, n)  # the block never changes: n polls
      best = min(best, time.perf_counter() - st)
    return max(1, int(n * self.native_spin_s / max(best, 1e-9)))

  def _after_fork(self) -> None:
    """A forked child has none of the parent's threads: start afresh (on the next launch). A native launch the
    parent had running is abandoned: its remaining shares can no longer be claimed."""
    self.queue = queue.SimpleQueue()
    self.threads = []
    self._lock = threading.Lock()
    self._native_lock = threading.Lock()
    self._native_busy = False
    self.asleep = []
    if self.native is not None: self.native.state[1] = 0  # `next` of generation 0, which no launch uses

  def _start(self) -> None:
    with self._lock:
      if self.make_native is not None and self.native is None and self.workers:
        self.native = self.make_native()
        self.native_iters = self._calibrate()
      while len(self.threads) < self.workers:
        self.asleep.append(False)
        t = threading.Thread(target=self._loop, args=(len(self.threads),), name=f"tiny-cpu-{len(self.threads)}",
                             daemon=True)
        t.start()
        self.threads.append(t)

  def _loop(self, index: int) -> None:
    if self.native is not None: return self._native_loop(index)
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

  def _native_loop(self, index: int) -> None:
    """A helper with native dispatch: poll natively for launches and run their shares, staying in native code from
    one launch to the next (no GIL to wait for); after `native_spin_s` without one, block on the queue (a native
    launch puts a token there for each blocked helper; Python launches and the stop marker come there too)."""
    native, q = self.native, self.queue
    asleep = self.asleep  # this helper's list: close() (or a fork) gives the pool a new one while it may still poll
    assert native is not None
    seen = -1  # join whatever launch is published now (if it still has shares)
    while True:
      # runs the shares of every launch published while it polls; returns after native_spin_s without a new one
      seen = native.helper(native.state_addr, seen, self.native_iters)
      if not self._drain(q): return  # Python launches and tokens queued meanwhile
      asleep[index] = True
      # A launch that began while this helper waited for the GIL to get here counted it awake and put no token for
      # it: it would sleep through that launch (a whole replay). Both flags are set under the GIL, so either the
      # launch saw `asleep` or this sees `_native_busy`.
      if self._native_busy:
        asleep[index] = False
        continue
      try: item = q.get()
      finally: asleep[index] = False
      if not self._take(item) or not self._drain(q): return
      seen = -1

  @staticmethod
  def _take(item: Any) -> bool:
    """Handle one queue item of a native helper: a Python launch (run its shares), a wake token (nothing), or the
    stop marker (False)."""
    if item is None: return False
    if isinstance(item, _Launch): item.work()
    return True

  def _drain(self, q: queue.SimpleQueue[Any]) -> bool:
    """Take every item the queue holds now (tokens left by launches this helper joined anyway, Python launches made
    while a native one ran); False on the stop marker."""
    while True:
      try: item = q.get_nowait()
      except queue.Empty: return True
      if not self._take(item): return False

  def run_native(self, tramp: int, fn: int, args: Any, n: int) -> bool:
    """Run shares 0..n-1 of native kernel `fn` (called through trampoline `tramp` with argument block `args`) on the
    helpers and this thread, claimed natively; False, having run nothing, when there is no native dispatch or another
    thread's native launch is running (then use `run`)."""
    if self.native is None and self.make_native is not None and self.workers: self._start()
    if (native := self.native) is None or not self._native_lock.acquire(False): return False
    try:
      if len(self.threads) < self.workers: self._start()
      self._native_busy = True
      for _ in range(min(sum(self.asleep), n - 1)): self.queue.put(True)  # wake blocked helpers
      native.main(native.state_addr, self._reserve(1), n, tramp, fn, ctypes.addressof(args))
    finally:
      self._native_busy = False
      self._native_lock.release()
    return True

  def _reserve(self, count: int) -> int:
    """The first of `count` consecutive fresh launch generations (each in 1..GEN_MAX, none equal to the last one
    published, so a helper that saw that one joins the next); call with `_native_lock` held."""
    first = self._gen + 1 if self._gen + count <= GEN_MAX else 1  # wrapped: the last one was near GEN_MAX
    self._gen = first + count - 1
    return first

  def run_graph(self, runner: Callable[[int, int], None], launches: int, max_shares: int) -> bool:
    """Call `runner(state, gen)` (a device graph's native replay, `graph.CPUGraph`) with the native dispatch block
    (its address, 0 when there is no native dispatch: then split kernels run their shares inline) and the first of
    `launches` fresh generations (one per kernel it may launch on the pool). `max_shares` > 1: it launches split
    kernels, so blocked helpers are woken first. False, having run nothing, when another thread's native launch is
    running."""
    if self.native is None and self.make_native is not None and self.workers and max_shares > 1: self._start()
    if (native := self.native) is None:
      runner(0, 1)
      return True
    if not self._native_lock.acquire(False): return False
    try:
      if max_shares > 1:
        if len(self.threads) < self.workers: self._start()
        self._native_busy = True
        for _ in range(min(sum(self.asleep), max_shares - 1)): self.queue.put(True)  # wake blocked helpers
      runner(native.state_addr, self._reserve(max(1, launches)))
    finally:
      self._native_busy = False
      self._native_lock.release()
    return True

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
      self.threads, self.asleep = [], []


def default_threads(setting: int) -> int:
  """Threads per launch: `setting` when positive (CPU_THREADS), else the cores this process may use."""
  if setting > 0: return setting
  try: return max(1, len(os.sched_getaffinity(0)))
  except AttributeError: return max(1, os.cpu_count() or 1)
