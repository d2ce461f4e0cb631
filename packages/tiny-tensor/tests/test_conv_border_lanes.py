"""Padded windows read as masked vector loads on the CPU (issue #39).

A padded conv or pool blocked along its output row reads each filter tap's input row as one vector whose border
lanes are padding: their gate depends on the lane. Such a load was gathered one lane at a time (14 scalar loads and
an insert each for a 14-wide row, per tap); the LLVM renderer now reads it with one `llvm.masked.load`, whose gated-off
lanes touch no memory (the first lane of a row may lie before the buffer). A 3x3 depthwise conv on 144x56x56 ran
475 -> 275 us (one thread, thread CPU time). Values against torch for odd sizes, strides, paddings, groups and
dilations, convs and pools; the generated source of a depthwise conv.
"""
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Context, Tensor

rng = np.random.default_rng(7)


def _t(a: np.ndarray) -> Tensor:
  """A CPU tensor: these checks are of the CPU's schedule and LLVM source (the mock-GPU sessions that re-run this
  folder would only emulate the same convs slowly)."""
  return Tensor(a, device="CPU")


def _arr(*shape: int) -> np.ndarray:
  return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("cin,cout,groups,hw,k,stride,pad,dil", [
  (12, 12, 12, 29, 3, 1, 1, 1),    # depthwise, odd row
  (10, 10, 10, 23, 5, 2, 2, 1),    # depthwise 5x5 stride 2
  (8, 8, 8, 17, 3, 1, 2, 2),       # dilated, padded by the dilation
  (6, 9, 3, 19, (3, 5), 1, (1, 2), 1),  # grouped, non-square kernel and padding
  (4, 16, 1, 15, 3, 1, 1, 1),      # dense 3x3
  (3, 8, 1, 33, 7, 2, 3, 1),       # a stem: 7x7 stride 2
])
def test_padded_conv_matches_torch(cin, cout, groups, hw, k, stride, pad, dil):
  x, w, b = _arr(1, cin, hw, hw + 2), _arr(cout, cin // groups, *((k, k) if isinstance(k, int) else k)), _arr(cout)
  got = _t(x).conv2d(_t(w), _t(b), groups=groups, stride=stride, padding=pad, dilation=dil).numpy()
  want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), groups=groups, stride=stride,
                  padding=pad, dilation=dil).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,stride,pad", [(3, 2, 1), (3, 1, 1), (5, 1, 2), (2, 2, 1)])
def test_padded_pools_match_torch(k, stride, pad):
  x = _arr(2, 5, 27, 31)
  got_max = _t(x).max_pool2d(k, stride, padding=pad).numpy()
  np.testing.assert_array_equal(got_max, F.max_pool2d(torch.from_numpy(x), k, stride, padding=pad).numpy())
  got_avg = _t(x).avg_pool2d(k, stride, padding=pad).numpy()
  want_avg = F.avg_pool2d(torch.from_numpy(x), k, stride, padding=pad).numpy()
  np.testing.assert_allclose(got_avg, want_avg, rtol=1e-5, atol=1e-6)


def test_first_and_last_lanes_of_the_buffer_padded():
  # the first output row's left tap reads lane 0 at element -1 of the input buffer, the last row's right tap one
  # past its end: masked off, never read (a plain vector load there could fault or read another buffer's values)
  x = np.full((1, 1, 16, 16), 3.0, np.float32)
  got = _t(x).conv2d(_t(np.ones((1, 1, 3, 3), np.float32)), padding=1).numpy()
  want = F.conv2d(torch.from_numpy(x), torch.ones(1, 1, 3, 3), padding=1).numpy()
  np.testing.assert_array_equal(got, want)


def test_depthwise_border_lanes_are_one_masked_load(capsys):
  c = 40 + random.Random().randrange(1000)  # a shape no other test compiled: its source is printed here
  x, w = _t(_arr(1, c, 28, 28)), _t(_arr(c, 1, 3, 3))
  with Context(DEBUG=4, DEV="CPU"):
    x.realize(), w.realize()
    capsys.readouterr()
    out = x.conv2d(w, groups=c, padding=1).realize()
  src = capsys.readouterr().out
  np.testing.assert_allclose(out.numpy(), F.conv2d(torch.from_numpy(x.numpy()), torch.from_numpy(w.numpy()),
                                                   groups=c, padding=1).numpy(), rtol=1e-4, atol=1e-4)
  conv = src[src.index("define void @r_"):]
  assert "@llvm.masked.load" in conv, conv
  # the loads left scalar are the three weights' taps per row of the filter, per channel the kernel computes together
  # (one accumulator each: up to 3 where 3 or 2 divides `c`, the heuristic's SPLIT_ROW_CHANNELS), not 14 lanes per
  # border tap
  accs = len(re.findall(r"%acc\d+ = alloca", conv))
  assert 1 <= accs <= 3 and len(re.findall(r"= load float,", conv)) <= 3 * accs, conv


@pytest.mark.parametrize("act", ["silu", "relu"])
def test_split_row_taps_and_stores_one_masked_access(capsys, act):
  # a 56-wide row as 4 x 14 lanes: on an AVX-512 target each 14-lane tap a padding doesn't gate and each 14-lane store
  # is one 16-lane masked access under the constant mask of its first 14 lanes (`odd_lanes`), not 8 + 4 + 2 pieces
  from tiny_codegen.compiler.llvm import host_target
  from tiny_codegen.renderer.llvmir import masked_widths
  c = 6 + 3 * random.Random().randrange(300)  # a shape no other test compiled: its source is printed here
  x, w, b = _t(_arr(1, c, 56, 56)), _t(_arr(c, 1, 3, 3)), _t(_arr(c))
  with Context(DEBUG=4, DEV="CPU"):
    x.realize(), w.realize(), b.realize()
    capsys.readouterr()
    y = x.conv2d(w, b, groups=c, padding=1)
    out = (y.silu() if act == "silu" else y.relu()).realize()
  src = capsys.readouterr().out
  yt = F.conv2d(*(torch.from_numpy(t.numpy()) for t in (x, w, b)), groups=c, padding=1)
  np.testing.assert_allclose(out.numpy(), (F.silu(yt) if act == "silu" else F.relu(yt)).numpy(), rtol=1e-4, atol=1e-5)
  conv = src[src.index("define void @r_"):]
  conv = conv[:conv.index("\n}\n")]
  triple, _, features = host_target()  # what the CPU device's LLVM renderer compiles for
  first14 = "<16 x i1> <" + ", ".join(["i1 true"] * 14 + ["i1 false"] * 2) + ">"
  assert "<14 x float>" in conv, conv
  # the buffers' addresses (an accumulator's `alloca` stays plain loads and stores, which the optimizer promotes)
  bufs = "|".join(re.findall(r"(%t\d+) = getelementptr (?:inbounds )?float, ptr %data", conv))
  plain = re.findall(rf"load <14 x float>, ptr (?:{bufs})\b|store <14 x float> \S+, ptr (?:{bufs})\b", conv)
  if masked_widths(triple, features):
    assert not plain and first14 in conv and "call void @llvm.masked.store.v16f32.p0(<16 x float>" in conv, conv
  else: assert plain and first14 not in conv, conv
