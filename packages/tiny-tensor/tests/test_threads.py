"""Concurrent use from threads: realize, the caches, the RNG counters and TinyJit (per-thread capture state).

8 threads start together and each, several times over: runs mixed ops (matmul, reduce, pad, where, a cast) and
checks them against numpy; draws random numbers; calls its own TinyJit and a TinyJit shared by all threads with its
own inputs. Every draw must be new: the draws of all threads together are exactly the blocks a single thread gets
drawing as many, in some order (none repeated, none skipped).
"""
from __future__ import annotations

import threading

import numpy as np
from tiny_tensor import Tensor, TinyJit

THREADS, ROUNDS, DRAW = 8, 4, 16


def _run_threads(fn) -> None:
  errors: list[BaseException] = []
  start = threading.Barrier(THREADS)

  def body(i: int) -> None:
    try:
      start.wait()
      fn(i)
    except BaseException as e:  # reported below, with the thread that raised it
      errors.append(e)
  ts = [threading.Thread(target=body, args=(i,)) for i in range(THREADS)]
  for t in ts: t.start()
  for t in ts: t.join()
  if errors: raise errors[0]


def test_threads_mixed_ops_rand_and_jits_match_numpy():
  Tensor.manual_seed(1234)
  draws: list[np.ndarray] = []
  draws_lock = threading.Lock()
  shared = TinyJit(lambda x, w: ((x @ w).relu() * 2 + x.sum(1, keepdim=True)).realize())

  def work(i: int) -> None:
    rng = np.random.default_rng(i)
    own = TinyJit(lambda x: (x.exp() - x * i).sum(0).realize())
    w = rng.standard_normal((5, 3)).astype(np.float32)
    W = Tensor(w).realize()
    for _ in range(ROUNDS):
      a, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
      A, B = Tensor(a), Tensor(b)
      got = ((A @ W) + (A > B).where(A, B).pad(((0, 0), (0, 0))).sum(1, keepdim=True) - A.cast("float16").float()
             .max()).numpy()
      want = (a @ w) + np.where(a > b, a, b).sum(1, keepdims=True) - a.astype(np.float16).astype(np.float32).max()
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
      r = Tensor.rand(DRAW).numpy()
      with draws_lock: draws.append(r)
      x = rng.standard_normal((4, 5)).astype(np.float32)
      np.testing.assert_allclose(own(Tensor(x)).numpy(), (np.exp(x) - x * i).sum(0), rtol=1e-4, atol=1e-4)
      np.testing.assert_allclose(shared(Tensor(x), W).numpy(), np.maximum(x @ w, 0) * 2 + x.sum(1, keepdims=True),
                                 rtol=1e-4, atol=1e-4)
    assert own.captured is not None and shared.captured is not None  # both replayed in this thread

  _run_threads(work)
  assert len(draws) == THREADS * ROUNDS
  Tensor.manual_seed(1234)
  sequential = [Tensor.rand(DRAW).numpy() for _ in range(THREADS * ROUNDS)]
  key = lambda d: d.tobytes()  # noqa: E731
  assert sorted(map(key, draws)) == sorted(map(key, sequential)), "a draw repeated (or skipped) another's numbers"


def test_rand_realized_out_of_order_never_repeats():
  Tensor.manual_seed(7)
  a, b = Tensor.rand(8), Tensor.rand(8)
  bv, av = b.numpy(), a.numpy()  # b's graph holds a's counter update: realizing it first must not shift a's draw
  Tensor.manual_seed(7)
  np.testing.assert_array_equal(av, Tensor.rand(8).numpy())
  np.testing.assert_array_equal(bv, Tensor.rand(8).numpy())
