"""Random numbers: threefry bit-exact with the reference, reproducible per seed, sane distributions."""
import numpy as np
import pytest

from tiny_tensor import Tensor, dtypes
from tiny_uop.alu import threefry2x32


def test_threefry_matches_reference():
  x0 = np.array([0, 1, 0xffffffff, 12345, 2**31], np.uint32)
  x1 = np.array([7, 0, 0xffffffff, 999, 3], np.uint32)
  for k0, k1 in [(0, 0), (0xdeadbeef, 42), (0xffffffff, 0xffffffff)]:
    lo, hi = Tensor._threefry2x32(Tensor(x0), Tensor(x1), k0, k1)
    got = [int(h) << 32 | int(lo_) for lo_, h in zip(lo.numpy(), hi.numpy())]
    assert got == [threefry2x32(int(b) << 32 | int(a), k1 << 32 | k0) for a, b in zip(x0, x1)]


def test_seed_reproducible_and_advancing():
  Tensor.manual_seed(3)
  a, b = Tensor.rand(5, 7).numpy(), Tensor.rand(5, 7).numpy()
  Tensor.manual_seed(3)
  assert np.array_equal(Tensor.rand(5, 7).numpy(), a) and not np.array_equal(a, b)
  Tensor.manual_seed(4)
  assert not np.array_equal(Tensor.rand(5, 7).numpy(), a)


def test_distributions():
  Tensor.manual_seed(0)
  u = Tensor.rand(20000).numpy()
  assert u.dtype == np.float32 and 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
  n = Tensor.randn(20000).numpy()
  assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
  m = Tensor.normal(20000, mean=3.0, std=0.5).numpy()
  assert abs(m.mean() - 3) < 0.02 and abs(m.std() - 0.5) < 0.02
  un = Tensor.uniform(20000, low=-2.0, high=4.0).numpy()
  assert -2 <= un.min() and un.max() < 4 and abs(un.mean() - 1) < 0.1
  ri = Tensor.randint(5000, low=3, high=7)
  assert ri.dtype == dtypes.int32 and set(np.unique(ri.numpy())) == {3, 4, 5, 6}
  assert Tensor.rand(3, dtype=dtypes.float16).dtype == dtypes.float16 and Tensor.randn(2, 2).shape == (2, 2)
  assert Tensor.rand(0, 3).shape == (0, 3)


def test_initializers():
  Tensor.manual_seed(0)
  for fn, bound in [(Tensor.scaled_uniform, 1 / np.sqrt(64 * 32)), (Tensor.glorot_uniform, np.sqrt(6 / 96)),
                    (Tensor.kaiming_uniform, np.sqrt(3.0) * np.sqrt(2.0 / (1 + 0.01 ** 2)) / np.sqrt(32))]:
    w = fn(64, 32).numpy()
    assert w.shape == (64, 32) and np.abs(w).max() <= bound + 1e-6 and np.abs(w).max() > bound * 0.9
  k = Tensor.kaiming_normal(256, 64).numpy()
  assert abs(k.std() - np.sqrt(2.0 / (1 + 0.01 ** 2)) / 8) < 0.01
  assert Tensor.rand(2, 2).rand_like().shape == (2, 2) and Tensor.rand(3, requires_grad=True).requires_grad


def test_rand_errors():
  with pytest.raises(ValueError, match="float"): Tensor.rand(3, dtype=dtypes.int32)
  with pytest.raises(ValueError, match="shape"): Tensor.rand(-1, 2)
  with pytest.raises(ValueError, match="low"): Tensor.randint(3, low=5, high=5)


def test_counter_lives_on_the_device_so_jit_replays_draw_new_numbers():
  from tiny_tensor import TinyJit
  Tensor.manual_seed(7)
  a = Tensor.rand(6).numpy()
  dev = Tensor.rand(1).device
  assert Tensor._rng_counters[dev].tolist() == [7]  # 6 words, then 1
  Tensor.manual_seed(7)

  @TinyJit
  def f(x: Tensor) -> Tensor: return (x + Tensor.rand(6)).realize()
  outs = [f(Tensor(np.zeros(6, np.float32))).numpy() for _ in range(4)]
  assert np.array_equal(outs[0], a)  # same seed, same first draw, jitted or not
  assert len({o.tobytes() for o in outs}) == 4  # replays (calls 3, 4) advance the device counter too
