"""Stride-2 (and 3) windows read as one wide load and a shuffle on the CPU (issue #39).

A stride-2 conv or pool blocked along its output row reads each filter tap's input row every other element. Its lanes
were gathered one at a time (a scalar load and an insert each); the expander now loads the elements from lane 0's to
the last lane's as one vector (a power of two wide, the elements past the last lane's masked off unless the index's
bounds put them in the buffer) and keeps every other one with a `shufflevector`; a padded row's border lanes are
masked. Values against torch for strides 2 and 3, with and without padding, at sizes where the last vector's lanes end
at the input buffer's last element (a load of the whole power of two there would read past it), on both CPU
renderers (the C renderer doesn't vectorize: its lanes stay scalar); the LLVM source of a stride-2 depthwise conv and
of a stride-2 max pool.
"""
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Context, Tensor
from tiny_uop.tools import find_tool

NEEDS_CLANG = pytest.mark.skipif(find_tool("cc") is None, reason="CPU:CLANG: no C compiler (pip install ziglang)")
RENDERERS = ["CPU:LLVM", pytest.param("CPU:CLANG", marks=NEEDS_CLANG)]

rng = np.random.default_rng(11)


def _arr(*shape: int) -> np.ndarray:
  return rng.standard_normal(shape).astype(np.float32)


def _t(a: np.ndarray) -> Tensor:
  """A CPU tensor: these checks are of the CPU's kernels (the mock-GPU sessions that re-run this folder would only
  emulate the same convs slowly)."""
  return Tensor(a, device="CPU")


@pytest.mark.parametrize("dev", RENDERERS)
@pytest.mark.parametrize("c,groups,cout,h,w,k,stride,pad", [
  (8, 8, 8, 29, 29, 3, 2, 0),     # depthwise, the last row's last tap is the buffer's last element
  (8, 8, 8, 28, 28, 3, 2, 1),     # depthwise, padded: mobilenet's 72x28x28 from 56x56
  (6, 6, 6, 31, 33, 5, 2, 2),     # depthwise 5x5, odd sizes
  (5, 5, 5, 25, 25, 3, 3, 0),     # stride 3, ending at the buffer's end
  (5, 5, 5, 26, 23, 3, 3, 1),     # stride 3, padded
  (3, 1, 8, 37, 37, 7, 2, 3),     # a stem: 7x7 stride 2, padding 3
  (4, 1, 6, 21, 21, 3, 2, 0),     # dense, unpadded, ending at the buffer's end
])
def test_strided_convs_match_torch(dev, c, groups, cout, h, w, k, stride, pad):
  x, wt, b = _arr(1, c, h, w), _arr(cout, c // groups, k, k), _arr(cout)
  with Context(DEV=dev):
    got = _t(x).conv2d(_t(wt), _t(b), groups=groups, stride=stride, padding=pad).numpy()
  want = F.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), groups=groups, stride=stride,
                  padding=pad).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dev", RENDERERS)
@pytest.mark.parametrize("shape,k,stride,pad", [
  ((1, 6, 57, 57), 3, 2, 0),      # ends at the buffer's end: 28 outputs a row, the last reading element 56
  ((1, 6, 56, 56), 3, 2, 1),      # resnet18's max pool, smaller
  ((2, 3, 31, 27), 2, 2, 0),      # 2x2 stride 2
  ((1, 4, 25, 25), 3, 3, 0),      # stride 3, ending at the buffer's end
  ((1, 4, 29, 26), 3, 3, 1),      # stride 3, padded
])
def test_strided_pools_match_torch(dev, shape, k, stride, pad):
  x = _arr(*shape)
  with Context(DEV=dev):
    got_max = _t(x).max_pool2d(k, stride, padding=pad).numpy()
    got_avg = _t(x).avg_pool2d(k, stride, padding=pad).numpy()
  np.testing.assert_array_equal(got_max, F.max_pool2d(torch.from_numpy(x), k, stride, padding=pad).numpy())
  want_avg = F.avg_pool2d(torch.from_numpy(x), k, stride, padding=pad).numpy()
  np.testing.assert_allclose(got_avg, want_avg, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", RENDERERS)
@pytest.mark.parametrize("hw,k,stride,pad,ceil", [
  ((29, 29), 3, 2, 1, False),     # a padded 3x3/2 row: its three taps one shared load, the left border masked
  ((30, 57), 3, 2, 1, True),      # odd width, ceil_mode: the last window past the row's end
  ((31, 33), 5, 2, 2, False),     # 5x5/2: five taps, more than one load holds
  ((27, 27), 3, 2, 0, False),     # unpadded, the last tap at the buffer's end
])
def test_strided_max_pools_propagate_nan_like_torch(dev, hw, k, stride, pad, ceil):
  # one NaN a row, each row at the next column (so every tap of every lane, border lanes too, meets one), a row of
  # -inf and a -inf column, +inf in the last element: the taps that share a load each keep their own elements
  x = _arr(2, 3, *hw)
  for r in range(hw[0]): x[r % 2, r % 3, r, r % hw[1]] = np.nan
  x[1, 2, 3, :], x[0, 1, :, 0], x[-1, -1, -1, -1] = -np.inf, -np.inf, np.inf
  with Context(DEV=dev): got = _t(x).max_pool2d(k, stride, padding=pad, ceil_mode=ceil).numpy()
  want = F.max_pool2d(torch.from_numpy(x), k, stride, padding=pad, ceil_mode=ceil).numpy()
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_array_equal(got, want)


def _source(capsys, fn) -> str:
  """The LLVM source of the kernels `fn` compiles (printed by DEBUG=4), from the first reduce kernel on."""
  with Context(DEBUG=4, DEV="CPU:LLVM"):
    capsys.readouterr()
    out = fn()
  src = capsys.readouterr().out
  return out, src[src.index("define void @r_"):]


def _shuffles(src: str) -> list[tuple[int, int, str]]:
  """(wide load's lanes, kept lanes, kept lane indices) of each `shufflevector` in `src`."""
  return [(int(a), int(b), keep) for a, b, keep in
          re.findall(r"shufflevector <(\d+) x float> \S+, <\d+ x float> poison, <(\d+) x i32> <([^>]*)>", src)]


def _taps_of_loads(src: str) -> dict[str, list[int]]:
  """For each 32-wide load in `src` that `shufflevector`s keep 14 lanes of: the first element each keeps, sorted."""
  out: dict[str, list[int]] = {}
  for v, keep in re.findall(r"= shufflevector <32 x float> (%t\d+), <32 x float> poison, <14 x i32> <i32 (\d+),", src):
    out.setdefault(v, []).append(int(keep))
  return {v: sorted(ks) for v, ks in out.items()}


def test_stride2_depthwise_conv_is_wide_loads_and_shuffles(capsys):
  c = 40 + random.Random().randrange(1000)  # a shape no other test compiled: its source is printed here
  x, w = _t(_arr(1, c, 56, 56)), _t(_arr(c, 1, 3, 3))
  with Context(DEV="CPU:LLVM"): x.realize(), w.realize()
  out, src = _source(capsys, lambda: x.conv2d(w, groups=c, stride=2, padding=1).realize())
  np.testing.assert_allclose(out.numpy(), F.conv2d(torch.from_numpy(x.numpy()), torch.from_numpy(w.numpy()),
                                                   groups=c, stride=2, padding=1).numpy(), rtol=1e-4, atol=1e-4)
  # (the 14-lane store, on an AVX-512 target one 16-lane masked store: its value widened, `odd_lanes`)
  shuf = [s for s in _shuffles(src) if (s[0], s[1]) != (14, 16)]
  # each tap of the 14-lane row: 32 elements (27 of them lanes 0..13's span) and every other one kept, from element
  # 0, 1 or 2 of one load: a filter row's three taps share it (29 elements of the 32)
  assert shuf and all(wide == 32 and n == 14 and keep == ", ".join(f"i32 {o + 2 * j}" for j in range(14))
                      for wide, n, keep in shuf for o in [int(keep.split(",")[0][4:])]), shuf
  taps = _taps_of_loads(src)
  assert taps and all(ks == [0, 1, 2] for ks in taps.values()), taps
  loads = re.findall(r"(%t\d+) = (?:call <32 x float> @llvm.masked.load.v32f32|load <32 x float>)", src)
  assert sorted(loads) == sorted(taps), (loads, taps)  # every wide load is a shared row's
  assert "@llvm.masked.load.v32f32" in src, src  # the left border lane and the buffer's end: masked
  # nothing gathered: the loads left scalar are the weights' taps (one a tap), no input element a lane
  scalars = re.findall(r"(%t\d+) = load float,", src)
  inserted = set(re.findall(r"insertelement <14 x float> \S+, float (%t\d+)", src))
  assert len(scalars) <= 9 and inserted <= set(scalars), (scalars, inserted)  # broadcasts of the weights only


def test_stride2_max_pool_is_wide_loads_and_shuffles(capsys):
  c = 40 + random.Random().randrange(1000)
  x = _t(_arr(1, c, 56, 56))
  with Context(DEV="CPU:LLVM"): x.realize()
  out, src = _source(capsys, lambda: x.max_pool2d(3, 2, padding=1).realize())
  np.testing.assert_array_equal(out.numpy(), F.max_pool2d(torch.from_numpy(x.numpy()), 3, 2, padding=1).numpy())
  # (on an AVX512DQ target each 14-lane max is one 16-lane `vrange`: the row widened to 16 lanes and its 14 taken
  # back, shuffles of the max's own, not of the loads)
  vrange = "llvm.x86.avx512.mask.range.ps.512" in src
  resize = [s for s in _shuffles(src) if (s[0], s[1]) in ((14, 16), (16, 14))]
  shuf = [s for s in _shuffles(src) if s not in resize]
  assert shuf and all(wide == 32 and n == 14 for wide, n, _ in shuf), shuf
  taps = _taps_of_loads(src)  # a filter row's three taps: one load, kept from its elements 0, 1 and 2
  assert taps and all(ks == [0, 1, 2] for ks in taps.values()), taps
  assert len(re.findall(r"= call <32 x float> @llvm.masked.load.v32f32", src)) == len(taps), src
  assert bool(resize) == vrange and all(keep.startswith("i32 0, i32 1, ") for _, _, keep in resize), resize
  assert "@llvm.masked.load.v32f32" in src and not re.findall(r"= load float,", src), src
