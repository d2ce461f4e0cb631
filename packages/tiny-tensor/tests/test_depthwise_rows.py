"""Depthwise convs with their activations and squeeze-excite against torch on the CPU (issue #39).

Whole rows of a 3x3 depthwise conv keep the row as the vector (`GATHER_TAPS_MIN`), a 5x5's make the channels the
vector; split rows (56 as 4 x 14) read their unpadded taps and store their lanes as one masked access each on an
AVX-512 target (`odd_lanes`). Values for both layouts, odd and even rows, stride 1 and 2, with SiLU, hardswish and a
squeeze-excite gate (mean, sigmoid or hardsigmoid, multiply), and the activations' edges: +-3, NaN, +-inf.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor

rng = np.random.default_rng(39)


def _t(a: np.ndarray) -> Tensor: return Tensor(a, device="CPU")


def _block(x, w, b, c, k, s, act, gate, lib):
  if lib == "torch":
    y = F.conv2d(x, w, b, groups=c, stride=s, padding=k // 2)
    y = F.silu(y) if act == "silu" else F.hardswish(y)
    g = y.mean((2, 3), keepdim=True)
    return y * (torch.sigmoid(g) if gate == "sigmoid" else F.hardsigmoid(g))
  y = x.conv2d(w, b, groups=c, stride=s, padding=k // 2)
  y = y.silu() if act == "silu" else y.hardswish()
  g = y.mean((2, 3), keepdim=True)
  return y * (g.sigmoid() if gate == "sigmoid" else g.hardsigmoid())


@pytest.mark.parametrize("c, hw, k, s", [(12, 14, 3, 1), (12, 14, 5, 1), (9, 7, 3, 1), (16, 7, 5, 1), (10, 28, 3, 2),
                                         (6, 28, 5, 2), (9, 14, 3, 2), (6, 56, 3, 1), (6, 28, 5, 1), (5, 13, 3, 1),
                                         (8, 15, 3, 2)])
@pytest.mark.parametrize("act, gate", [("silu", "sigmoid"), ("hardswish", "hardsigmoid")])
def test_depthwise_block_matches_torch(c, hw, k, s, act, gate):
  x, w, b = (rng.standard_normal(sh).astype(np.float32) * 2 for sh in ((1, c, hw, hw), (c, 1, k, k), (c,)))
  got = _block(_t(x), _t(w), _t(b), c, k, s, act, gate, "tiny").numpy()
  want = _block(*(torch.from_numpy(a) for a in (x, w, b)), c, k, s, act, gate, "torch").numpy()
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("hw, k, s", [(14, 3, 1), (7, 5, 1), (56, 3, 1), (28, 3, 2)])
@pytest.mark.parametrize("act", ["silu", "hardswish"])
def test_depthwise_activation_edges(hw, k, s, act):
  # the filter passes its centre tap through (weight 1, the rest 0, no bias): the conv's output is the input, whose
  # planes hold the activations' edges: exactly +-3 and the floats next to them, 0, -0, NaN, +-inf, huge values
  c = 6
  edges = np.array([3.0, -3.0, np.nextafter(3, 4), np.nextafter(3, 2), np.nextafter(-3, -4), np.nextafter(-3, -2),
                    0.0, -0.0, np.nan, np.inf, -np.inf, 1e30, -1e30, 88.0, -88.0, -104.0], np.float32)
  # (hardswish(-inf): tiny's piecewise form gives 0, torch's x * relu6(x + 3) / 6 NaN: that edge left out of it)
  if act == "hardswish": edges = edges[edges != -np.inf]
  x = np.resize(edges, (1, c, hw, hw)).astype(np.float32)
  x[0, 1] = rng.permutation(x[0, 1].ravel()).reshape(hw, hw)  # the edges in other lanes of the row
  w = np.zeros((c, 1, k, k), np.float32)
  w[:, 0, k // 2, k // 2] = 1.0
  tx, tw = _t(x), _t(w)
  y = tx.conv2d(tw, groups=c, stride=s, padding=k // 2)
  got = (y.silu() if act == "silu" else y.hardswish()).numpy()
  yt = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), groups=c, stride=s, padding=k // 2)
  want = (F.silu(yt) if act == "silu" else F.hardswish(yt)).numpy()
  # NaN where torch has NaN (a 0-weight tap times inf is NaN too: NaN spreads to a window's outputs in both)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
