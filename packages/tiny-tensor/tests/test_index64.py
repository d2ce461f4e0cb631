"""64-bit indices through the Tensor API: a buffer past 2**31 elements is read and written at the right places.

`test_uint8_buffer_past_2_31_on_cpu` allocates one 2**31+64-byte buffer (about 2.2 GB resident, nothing else that
large), fills, writes and reads it past index 2**31 on the CPU; it is marked `bigmem` (run it alone, not next to
another big test). The others force int64 indices on small tensors (the scheduler's threshold lowered) so every op
path runs with them on the session's device (CPU; the RDNA3 emulator in the MOCK+AMD session).
"""
from __future__ import annotations

import numpy as np
import pytest
from tiny_tensor import Tensor, dtypes

from tiny_codegen.schedule import schedule as sched_mod

BIG = 2**31 + 64


@pytest.mark.bigmem
def test_uint8_buffer_past_2_31_on_cpu():
  a = Tensor.zeros(BIG, dtype=dtypes.uint8, device="CPU").contiguous().realize()
  a[2**31 + 5] = 7   # a kernel writing one element past 2**31 (int32: a negative index)
  a[2**31 - 3] = 9
  a.assign(a + 1).realize()  # one kernel over every element, in place
  tail = a[2**31 - 4:].numpy()
  want = np.ones(68, np.uint8)
  want[1], want[9] = 10, 8
  np.testing.assert_array_equal(tail, want)
  assert a.cast(dtypes.int64).sum().item() == BIG + 7 + 9  # a reduce reading all of it
  assert (a[2**31:] * 2).max().item() == 16
  assert a[:8].numpy().tolist() == [1] * 8


@pytest.fixture
def forced_int64(monkeypatch):
  monkeypatch.setattr(sched_mod, "INT32_MAX", 8)  # every schedule with a value of more than 8 elements is int64
  sched_mod.clear_schedule_cache()
  yield
  sched_mod.clear_schedule_cache()


def test_forced_int64_ops_match_numpy(forced_int64):
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((6, 10)).astype(np.float32), rng.standard_normal((10, 4)).astype(np.float32)
  X, W = Tensor(x), Tensor(w)
  np.testing.assert_allclose((X @ W).numpy(), x @ w, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(X.flip(1).pad(((1, 2), (3, 0))).numpy(), np.pad(x[:, ::-1], ((1, 2), (3, 0))))
  np.testing.assert_allclose(X.sum(1).numpy(), x.sum(1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(X.cumsum(1).numpy(), x.cumsum(1), rtol=1e-5, atol=1e-5)
  e = np.exp(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(X.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(Tensor.arange(20).reshape(4, 5).T.numpy(), np.arange(20).reshape(4, 5).T)
