"""Programs over a bound Variable (a dynamic batch or sequence, issue #39) schedule like their fixed-size analogue:
a broadcast exp2/log2/sin/pow gets its own kernel whatever its shape (fused, the kernel reading the broadcast
recomputed it once per broadcast element: GELU's erf inside the next matmul, 4x per element). Checked against numpy
at several values of the Variable."""
import numpy as np
import pytest
from tiny_tensor import Tensor, TinyJit, Variable
from tiny_tensor import engine
from tiny_tensor.engine import GlobalCounters

N = Variable("n", 1, 32)


def _gelu_matmul(x: Tensor, w: Tensor) -> Tensor: return (x.exp() @ w).realize()


def _rows(out: Tensor, n: int) -> np.ndarray:
  """The first `n` rows of a realized (n, c) result of symbolic n (its buffer is sized for the largest n)."""
  view = engine.buffer_view(out.uop)
  assert view is not None
  c = out.shape[1]
  return Tensor(view[0])[:n * c].reshape(n, c).numpy()


def _kernels(x: Tensor, w: Tensor) -> int:
  GlobalCounters.reset()
  _gelu_matmul(x, w)
  return GlobalCounters.kernel_count


def test_broadcast_exp_of_a_variable_size_is_realized_like_a_fixed_one():
  rng = np.random.default_rng(0)
  X, W = rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal((16, 24)).astype(np.float32)
  x, w = Tensor(X).realize(), Tensor(W).realize()
  fixed = _kernels(x[:5], w)
  assert fixed == _kernels(x[:N.bind(5)], w) == 2  # the exp, then the matmul reading it
  for n in (1, 5, 17, 32):
    np.testing.assert_allclose(_rows(_gelu_matmul(x[:N.bind(n)], w), n), np.exp(X[:n]) @ W, rtol=1e-4, atol=1e-4)


def test_jit_replays_the_realized_exp_at_every_size():
  rng = np.random.default_rng(1)
  X, W = rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
  x, w = Tensor(X).realize(), Tensor(W).realize()
  f = TinyJit(lambda a: (a.exp() @ w).realize())
  for n in (3, 7, 1, 32, 9):
    np.testing.assert_allclose(_rows(f(x[:N.bind(n)]), n), np.exp(X[:n]) @ W, rtol=1e-4, atol=1e-4)
  assert f.captured is not None and f.captured.kernel_count == 2


def _product_matmul(x: Tensor, y: Tensor, w: Tensor) -> Tensor: return ((x * y) @ w).realize()


# CPU only: the window rule needs a big operand (64 x 512), and on the GPU renderers a symbolic axis is a loop inside
# each thread, so the matmul's waves run ~1e6 instructions, past the RDNA3 emulator's runaway-wave limit on MOCK+AMD
@pytest.mark.dev_session("CPU")
def test_big_elementwise_operand_of_a_matmul_over_a_variable_is_realized():
  # x*y (two buffers, 64 x 512 at most) read by the matmul through its broadcast: fused, it is recomputed once per
  # column block; the window rule realizes it from WINDOW_MIN_SIZE elements, a symbolic one by its largest size
  M = Variable("m", 1, 64)
  rng = np.random.default_rng(2)
  X, Y = (rng.standard_normal((64, 512)).astype(np.float32) for _ in range(2))
  W = rng.standard_normal((512, 32)).astype(np.float32)
  x, y, w = (Tensor(a).realize() for a in (X, Y, W))
  GlobalCounters.reset()
  _product_matmul(x, y, w)
  fixed = GlobalCounters.kernel_count
  GlobalCounters.reset()
  _product_matmul(x[:M.bind(40)], y[:M.bind(40)], w)
  assert GlobalCounters.kernel_count == fixed == 2
  for m in (1, 13, 40, 64):
    got = _rows(_product_matmul(x[:M.bind(m)], y[:M.bind(m)], w), m)
    np.testing.assert_allclose(got, (X[:m] * Y[:m]) @ W, rtol=1e-4, atol=1e-3)
