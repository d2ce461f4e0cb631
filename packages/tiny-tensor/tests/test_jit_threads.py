"""TinyJit's per-thread state across threads that end: a reused thread ident and many short-lived threads.

A thread's ident (`threading.get_ident()`) is handed to a later thread once the first ends; the later thread must
start its own eager/capture/replay sequence, never replay into the outputs the ended thread returned. A thread's
state must also go away with the thread (a server that runs each request in a new thread).
"""
from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
from tiny_tensor import Tensor, TinyJit


def _in_thread(fn) -> None:
  errors: list[BaseException] = []

  def body() -> None:
    try: fn()
    except BaseException as e:  # re-raised in the caller's thread
      errors.append(e)
  t = threading.Thread(target=body)
  t.start()
  t.join()
  if errors: raise errors[0]


def test_jit_thread_with_a_reused_ident_does_not_overwrite_an_ended_threads_output():
  jit = TinyJit(lambda x: (x * 2 + 1).realize())
  kept: dict[str, object] = {}

  def first() -> None:
    for _ in range(3): kept["out"] = jit(Tensor([1.0, 1.0]))  # eager, capture, replay
    kept["ident"] = threading.get_ident()
  _in_thread(first)
  np.testing.assert_equal(kept["out"].numpy(), np.array([3.0, 3.0], np.float32))  # type: ignore[attr-defined]

  def later() -> None:
    if threading.get_ident() == kept["ident"]: kept["later"] = jit(Tensor([100.0, 100.0]))
  for _ in range(200):  # CPython hands a joined thread's ident to a following thread, usually the very next one
    _in_thread(later)
    if "later" in kept: break
  assert "later" in kept, "no thread reused the first thread's ident in 200 tries; the case was not exercised"
  np.testing.assert_equal(kept["later"].numpy(), np.array([201.0, 201.0], np.float32))  # type: ignore[attr-defined]
  # the ended thread's output is untouched (it read [201, 201] when the reused ident replayed its capture)
  np.testing.assert_equal(kept["out"].numpy(), np.array([3.0, 3.0], np.float32))  # type: ignore[attr-defined]


def test_jit_state_of_ended_threads_is_released():
  jit = TinyJit(lambda x: (x * 3).realize())
  captures: list[weakref.ref] = []
  results: list[float] = []

  def request(i: int) -> None:
    for _ in range(3): out = jit(Tensor([float(i)]))
    results.append(float(out.numpy()[0]))
    captures.append(weakref.ref(jit.captured))
  for i in range(16): _in_thread(lambda i=i: request(i))
  assert sorted(results) == [3.0 * i for i in range(16)]
  gc.collect()
  alive = sum(r() is not None for r in captures)
  assert alive == 0, f"{alive} of 16 ended threads' captures are still held by the jit"
  assert jit.thread_states() == 0


def test_jit_reset_restarts_every_thread_and_live_states_are_counted():
  jit = TinyJit(lambda x: (x + 1).realize())
  for _ in range(3): jit(Tensor([1.0]))
  gate, done = threading.Event(), threading.Event()

  def other() -> None:
    for _ in range(3): jit(Tensor([2.0]))
    gate.set()
    done.wait(10)
  t = threading.Thread(target=other)
  t.start()
  gate.wait(10)
  assert jit.thread_states() == 2  # this thread's and the waiting one's
  jit.reset()
  assert jit.thread_states() == 0 and jit.cnt == 0 and jit.captured is None
  done.set()
  t.join()
  np.testing.assert_equal(jit(Tensor([5.0])).numpy(), np.array([6.0], np.float32))
