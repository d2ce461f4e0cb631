"""64-bit indices through the Tensor API: a buffer past 2**31 elements is read and written at the right places.

`test_uint8_buffer_past_2_31_on_cpu` allocates one 2**31+64-byte buffer (about 2.2 GB resident, nothing else that
large), fills, writes and reads it past index 2**31 on the CPU, in a process of its own; it is marked `bigmem` (run
it alone, not next to another big test: `-m bigmem`). The others force int64 indices on small tensors (the
scheduler's threshold lowered) so every op path runs with them, on the CPU and on the PYTHON reference interpreter.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from tiny_tensor import Tensor
from tiny_uop import Context

from tiny_codegen.schedule import schedule as sched_mod

_BIG_SCRIPT = """
import numpy as np
from tiny_tensor import Tensor, dtypes
BIG = 2**31 + 64
a = Tensor.zeros(BIG, dtype=dtypes.uint8, device="CPU").contiguous().realize()
a[2**31 + 5] = 7   # a kernel writing one element past 2**31 (as an int32 index: negative)
a[2**31 - 3] = 9
a.assign(a + 1).realize()  # one kernel over every element, in place
tail = a[2**31 - 4:].numpy()
want = np.ones(68, np.uint8)
want[1], want[9] = 10, 8
np.testing.assert_array_equal(tail, want)
assert a.cast(dtypes.int64).sum().item() == BIG + 7 + 9  # a reduce reading all of it
assert (a[2**31:] * 2).max().item() == 16
assert a[:8].numpy().tolist() == [1] * 8
print("ok")
"""


@pytest.mark.bigmem
def test_uint8_buffer_past_2_31_on_cpu():
  # in a process of its own: the 2.2 GB block is returned at its exit, and it doesn't split this process's address
  # space (kernels loaded later keep their code and data sections within 2 GB of each other)
  proc = subprocess.run([sys.executable, "-c", _BIG_SCRIPT], capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


@pytest.fixture
def forced_int64(monkeypatch):
  monkeypatch.setattr(sched_mod, "INT32_MAX", 8)  # every schedule with a value of more than 8 elements is int64
  sched_mod.clear_schedule_cache()
  yield
  sched_mod.clear_schedule_cache()


# the RDNA3 emulator (MOCK+AMD) has no 64-bit integer multiply-add yet (VOP3 0x2ff, V_MAD_I64_I32): int64 kernels run
# on the devices that execute them here; the AMDGPU renderer's int64 source is checked in tiny-codegen's test_index64
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_forced_int64_ops_match_numpy(forced_int64, device):
  with Context(DEV=device): _forced_int64_ops()


def _forced_int64_ops() -> None:
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
