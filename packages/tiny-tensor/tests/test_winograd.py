"""Winograd F(m x m, 3 x 3) convolutions (`tiny_tensor.winograd`, issue #39): the transform matrices against their
definition (exactly, in rationals), conv numbers against torch in float64 for paddings 0/1/2, odd sizes, batch 2,
channel counts no vector width divides, with and without bias; `WINO=1` conv2d and its gradients against torch; the
kernels of one conv; and the machine-model rule's choices on a Zen 4-like, an AVX2 and an aarch64 model.

Error bounds (measured, against a float64 reference, per output relative to the conv of |x| with |w|): F(2,3) within
2.2e-7 (float32's direct conv: 1.8e-7), F(4,3) within 2.7e-6 (its B^T has entries up to 5 and G's 1/24: cancellation);
the tolerances below are 5x those."""
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Context, Tensor
from tiny_tensor.engine import GlobalCounters
from tiny_tensor.winograd import winograd_conv, winograd_matrices, winograd_tile, winograd_weight
from tiny_codegen.machine import Machine

rng = np.random.default_rng(39)
TOL = {2: 1e-6, 4: 1.4e-5}


def _arr(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("m", [2, 4])
def test_matrices_compute_the_correlation_exactly(m):
  at, g, bt = winograd_matrices(m)
  n = m + 2
  assert (len(at), len(at[0]), len(g), len(g[0]), len(bt), len(bt[0])) == (m, n, n, 3, n, n)
  assert all(v.denominator == 1 for row in (*at, *bt) for v in row)  # exact in float32: small integers
  r = np.random.default_rng(m)
  for _ in range(5):
    d = [Fraction(int(v)) for v in r.integers(-9, 9, n)]
    k = [Fraction(int(v)) for v in r.integers(-9, 9, 3)]
    gk = [sum(gi * kk for gi, kk in zip(row, k)) for row in g]
    bd = [sum(b * dd for b, dd in zip(row, d)) for row in bt]
    y = [sum(a * u * v for a, u, v in zip(row, gk, bd)) for row in at]
    assert y == [sum(k[j] * d[i + j] for j in range(3)) for i in range(m)]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("bs,cin,cout,h,w,pad,bias", [
  (1, 3, 5, 7, 9, 1, True),    # odd sizes, tiles past the edge
  (2, 17, 6, 8, 5, 0, False),  # batch 2, no padding, Cin no vector width divides
  (1, 4, 19, 6, 11, 2, True),  # padding 2
  (2, 8, 8, 3, 3, 1, False),   # one output tile
])
def test_conv_matches_torch_float64(m, bs, cin, cout, h, w, pad, bias):
  x, wt, b = _arr(bs, cin, h, w), _arr(cout, cin, 3, 3), _arr(cout)
  X, W = torch.tensor(x, dtype=torch.float64), torch.tensor(wt, dtype=torch.float64)
  ref = F.conv2d(X, W, torch.tensor(b, dtype=torch.float64) if bias else None, padding=pad).numpy()
  B = torch.tensor(np.abs(b), dtype=torch.float64) if bias else None
  scale = F.conv2d(X.abs(), W.abs(), B, padding=pad).numpy()
  got = winograd_conv(Tensor(x), Tensor(wt), Tensor(b) if bias else None, ((pad, pad), (pad, pad)), m).numpy()
  assert got.shape == ref.shape
  assert (np.abs(got - ref) / scale).max() < TOL[m]


def test_prepared_weight_is_read_as_is_and_conv_is_four_kernels():
  x, wt = Tensor(_arr(1, 16, 12, 12)).realize(), _arr(24, 16, 3, 3)
  u = winograd_weight(Tensor(wt), 4, realize=True)
  assert u.shape == (36, 16, 24)
  GlobalCounters.reset()
  y = winograd_conv(x, u, None, ((1, 1), (1, 1)), 4).relu().realize()
  # the input transform, the product, the output transform, the NCHW copy with the ReLU fused: no weight transform
  assert GlobalCounters.kernel_count == 4
  ref = F.conv2d(torch.tensor(x.numpy()), torch.tensor(wt), padding=1).relu().numpy()
  np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_asymmetric_and_negative_padding():
  x, wt = _arr(1, 3, 9, 10), _arr(4, 3, 3, 3)
  ref = F.conv2d(F.pad(torch.tensor(x), (2, 0, -1, 1)), torch.tensor(wt)).numpy()
  got = winograd_conv(Tensor(x), Tensor(wt), None, ((-1, 1), (2, 0)), 2).numpy()
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_wino_flag_conv2d_and_gradients_match_torch():
  x, wt, b = _arr(2, 5, 9, 7), _arr(6, 5, 3, 3), _arr(6)
  tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, wt, b))
  ref = F.conv2d(tx, tw, tb, padding=1)
  (ref * ref).sum().backward()
  with Context(WINO=1):
    X, W, B = (Tensor(a, requires_grad=True) for a in (x, wt, b))
    GlobalCounters.reset()
    y = X.conv2d(W, B, padding=1).realize()
    assert GlobalCounters.kernel_count == 5  # the weight's transform too
    (y * y).sum().backward()
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    for got, want in ((X.grad, tx.grad), (W.grad, tw.grad), (B.grad, tb.grad)):
      assert got is not None and want is not None
      np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_wino_flag_leaves_other_convs_direct():
  x, wt = _arr(1, 4, 9, 9), _arr(4, 4, 3, 3)
  with Context(WINO=1):
    for kw in ({"stride": 2}, {"dilation": 2}, {"groups": 2}):
      w = wt[:, :2] if "groups" in kw else wt
      GlobalCounters.reset()
      got = Tensor(x).conv2d(Tensor(w), padding=1, **kw).realize()
      assert GlobalCounters.kernel_count <= 2  # a direct conv: the weight's channels-last copy and the conv
      np.testing.assert_allclose(got.numpy(), F.conv2d(torch.tensor(x), torch.tensor(w), padding=1, **kw).numpy(),
                                 rtol=1e-4, atol=1e-4)


RESNET18 = [(64, 56), (128, 28), (256, 14), (512, 7)]  # its 3x3 stride-1 convs: channels, output map


@pytest.mark.parametrize("machine,want", [
  # Zen 4-like (AVX-512, 1 MB L2, 4 MB of L3 a core): F(4,3) where the weight is small, F(2,3) on 256 channels (the
  # F(4,3) weight, 9.4 MB, streams past the L3 share), direct on 512 channels at 7x7 (F(2,3)'s 16.8 MB weight)
  (Machine.default(vector_bytes=64, vector_registers=32, cores=2), [4, 4, 2, 0]),
  # AVX2 with a 512 KB L2: half the FMA rate, so the 512-channel stage's multiplies saved outweigh its weight's bytes
  (Machine.default(vector_bytes=32, vector_registers=16).with_overrides("l2=512K"), [4, 4, 2, 2]),
  # aarch64 (NEON, no L3): a quarter of the FMA rate, F(4,3) down to 14x14
  (Machine.default(arch="aarch64", vector_bytes=16, vector_registers=32).with_overrides("l3=0"), [4, 4, 4, 2]),
])
def test_rule_on_machine_models(machine, want):
  assert [winograd_tile(machine, 1, c, c, h, h) for c, h in RESNET18] == want
  assert winograd_tile(machine, 1, 3, 64, 224, 224) == 0  # a 3-channel stem: the transforms cost more than they save
  assert winograd_tile(machine, 8, 512, 512, 7, 7) == 4   # batch 8: 8x the tiles to reuse each transformed weight over


def test_weight_of_another_tile_or_shape_is_refused():
  x = Tensor(_arr(1, 4, 8, 8))
  u2 = winograd_weight(Tensor(_arr(5, 4, 3, 3)), 2, realize=True)
  with pytest.raises(ValueError, match=r"transformed for F\(2,3\), not F\(4,3\)"):
    winograd_conv(x, u2, None, ((1, 1),) * 2, 4)
  with pytest.raises(ValueError, match=r"needs a \(Cout, 4, 3, 3\) weight"):
    winograd_conv(x, Tensor(_arr(5, 3, 3, 3)), None, ((1, 1),) * 2, 2)
