"""Issue #38: comparisons of values that may be NaN must not be folded to constants by value-range analysis.

A NaN in a WHERE branch (pow builds `where(base<0, nan, ...)`) once gave the branch a NaN range bound, and a later
comparison against it folded to always-false. References are numpy (forward) and torch (gradients).
"""
import numpy as np
import torch

from tiny_tensor import Tensor


def test_pow_then_compare_matches_numpy():
  a = np.array([0.5, 2.0, 0.0, 1.0], dtype=np.float32)
  np.testing.assert_array_equal((Tensor(a).pow(0.7) > 1.0).numpy(), np.power(a, 0.7) > 1.0)
  np.testing.assert_array_equal((Tensor(a).pow(0.7) <= 1.0).numpy(), np.power(a, 0.7) <= 1.0)


def test_where_nan_branch_then_compare_matches_numpy():
  a = np.array([1.0, -1.0, 0.0, -0.0, np.inf, -np.inf, np.nan], dtype=np.float32)
  x = Tensor(a)
  w_np = np.where(a < 0, np.nan, a)
  for got, want in [(((x < 0).where(float("nan"), x) > 0), w_np > 0),
                    (((x < 0).where(float("nan"), x) < 0.5), w_np < 0.5),
                    (((x < 0).where(float("nan"), 2.0) == 2.0), np.where(a < 0, np.nan, 2.0) == 2.0),
                    (((x < 0).where(float("nan"), 2.0) != 2.0), np.where(a < 0, np.nan, 2.0) != 2.0),
                    (((x < 0).where(float("nan"), x).maximum(0.0) > 0), np.maximum(w_np, 0.0) > 0)]:
    np.testing.assert_array_equal(got.numpy(), want)


def test_pow_clip_gradient_matches_torch():
  v = [0.5, 2.0, 0.9, 3.0]
  x = Tensor(v, requires_grad=True)
  x.pow(0.7).clip(0, 1).sum().backward()
  t = torch.tensor(v, requires_grad=True)
  t.pow(0.7).clip(0, 1).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5)


def test_adding_zero_gives_positive_zero_like_numpy():
  a = np.array([-0.0, 0.0, 1.0, -2.0], dtype=np.float32)
  np.testing.assert_array_equal(np.signbit((Tensor(a) + 0).numpy()), np.signbit(a + np.float32(0)))
  np.testing.assert_array_equal(np.signbit((Tensor(a) - 0).numpy()), np.signbit(a - np.float32(0)))
