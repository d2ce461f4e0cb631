"""max_pool2d against torch over the window shapes the schedule and heuristics treat apart (issue #39).

A stride-2 max pool's output row is not vectorized as a gathered window (`opt/heuristic.py` `_window_vector`), and a
constant pad's fill (max pooling's -inf, `Tensor.pad(value=...)`) is read behind the padding's gates in the reading
kernel instead of a realized padded copy (`schedule/schedule.py` `_pad_fill`). Values against torch: odd sizes,
strides 1 to 3, padding, dilation, ceil_mode, -inf and NaN inputs; kernel counts as the schedule makes them now.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor

rng = np.random.default_rng(8)


def _t(a: np.ndarray) -> Tensor:
  """A CPU tensor: these are checks of the CPU's schedule and heuristics."""
  return Tensor(a, device="CPU")


def _with_specials(shape: tuple[int, ...]) -> np.ndarray:
  """Normal values with a NaN, -inf and +inf planted in the first two images and a row of -inf."""
  a = rng.standard_normal(shape).astype(np.float32)
  a[0, 0, 1, 2], a[0, 1, 0, 0], a[-1, -1, -1, -1], a[0, 0, -1, :] = np.nan, -np.inf, np.inf, -np.inf
  return a


@pytest.mark.parametrize("hw, k, s, p, d, ceil", [
  ((17, 23), 3, 2, 1, 1, False), ((17, 23), 3, 2, 1, 1, True), ((16, 16), 3, 1, 1, 1, False),
  ((19, 13), 3, 3, 1, 1, True), ((15, 21), 2, 2, 0, 1, True), ((21, 17), 3, 2, 1, 2, False),
  ((13, 13), (3, 2), (2, 1), (1, 0), 1, False), ((9, 31), 5, 2, 2, 1, True), ((112, 112), 3, 2, 1, 1, False)])
def test_max_pool2d_matches_torch(hw, k, s, p, d, ceil):
  x = _with_specials((2, 3, *hw))
  got = _t(x).max_pool2d(k, s, d, p, ceil_mode=ceil).numpy()
  want = F.max_pool2d(torch.from_numpy(x), k, s, p, d, ceil_mode=ceil).numpy()
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("s", [1, 2])
def test_relu_then_padded_max_pool_reads_no_padded_copy(s: int):
  # an activation of two buffers (x + y, then ReLU) that a padded max pool reads through its window is stored once
  # unpadded (64x64) and the pool reads it behind the padding's gates, -inf their else; before, the -inf fill made
  # the padded 66x66 copy the stored value. 2 kernels either way (the ReLU, the pool)
  from tiny_tensor import engine
  x, y = _with_specials((2, 4, 64, 64)), rng.standard_normal((2, 4, 64, 64)).astype(np.float32)
  x[np.isnan(x)] = 0.5  # (ReLU of NaN is 0 here, as tinygrad's `(x > 0).where(x, 0)`; torch keeps the NaN)
  tx, ty = _t(x).realize(), _t(y).realize()
  calls: list = []
  with engine.capture(calls.append): got = (tx + ty).relu().max_pool2d(3, s, padding=1).realize().numpy()
  want = F.max_pool2d(F.relu(torch.from_numpy(x) + torch.from_numpy(y)), 3, s, padding=1).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  names = [c.spec.name for c in calls if c.kind == "kernel"]
  assert len(names) == 2 and names[0].endswith("_64_64"), names


def test_constant_pad_fill_read_by_conv_matches_torch():
  # a nonzero constant pad before a conv (the fill seen through as a PAD by the window rule): the conv reads the
  # realized sum behind the padding's gates with 1.5 as their else
  x, y = rng.standard_normal((1, 3, 20, 20)).astype(np.float32), rng.standard_normal((1, 3, 20, 20)).astype(np.float32)
  w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  got = (_t(x) + _t(y)).pad((2, 1, 1, 2), value=1.5).conv2d(_t(w), stride=2).numpy()
  want = F.conv2d(F.pad(torch.from_numpy(x) + torch.from_numpy(y), (2, 1, 1, 2), value=1.5), torch.from_numpy(w),
                  stride=2).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
