"""A conv's activation fused into the conv's kernel when the next conv or pool reads it through a window (issue #39).

The scheduler gives a window input (an activation a depthwise conv or pool reads once per window position) its own
buffer; the conv that produces it now runs in that kernel, its activation (ReLU, SiLU's exp included) as the epilogue,
instead of a conv kernel, a sigmoid kernel and a multiply kernel. Not behind padding: a max pool's -inf padding is
read behind gates in the pool's kernel, after the stem conv's own. A conv that a global pool sums runs in its own
kernel, its SiLU as the epilogue, not inside the pool. Values against torch (sigmoid / SiLU / exp at large
magnitudes included); kernel counts as the schedule makes them now.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor
from tiny_tensor.engine import GlobalCounters

rng = np.random.default_rng(39)


def _t(a: np.ndarray) -> Tensor:
  """A CPU tensor: these checks are of the CPU's schedule and LLVM source (the mock-GPU sessions that re-run this
  folder would only emulate the same convs slowly)."""
  return Tensor(a, device="CPU")


def _arr(*shape: int) -> np.ndarray:
  return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def _kernels(fn, *args: Tensor) -> tuple[np.ndarray, int]:
  """`fn(*args)` realized: its value and the kernels that took (the weights' layout copies included)."""
  for a in args: a.realize()
  GlobalCounters.reset()
  out = fn(*args).realize()
  n = GlobalCounters.kernel_count
  return out.numpy(), n


def test_conv_silu_depthwise_one_kernel_per_conv():
  # 1x1 expand conv -> SiLU -> 3x3 stride-2 depthwise (efficientnet's MBConv without squeeze-excite): 6 kernels before
  # (weight copies 2, conv, sigmoid, x * sigmoid, depthwise), the SiLU now the 1x1 conv's epilogue: 4
  x, w1, b1, wd = _arr(1, 8, 32, 32), _arr(48, 8, 1, 1), _arr(48), _arr(48, 1, 3, 3)
  got, n = _kernels(lambda x, w1, b1, wd: x.conv2d(w1, b1).silu().conv2d(wd, groups=48, stride=2, padding=1),
                    _t(x), _t(w1), _t(b1), _t(wd))
  tx = F.silu(F.conv2d(torch.from_numpy(x), torch.from_numpy(w1), torch.from_numpy(b1)))
  want = F.conv2d(tx, torch.from_numpy(wd), groups=48, stride=2, padding=1).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert n == 4, n


def test_mbconv_squeeze_excite_values_and_kernels():
  # the whole MBConv block with squeeze-excite and the residual: 17 kernels before, 15 with the first SiLU fused, 14
  # with the depthwise conv's SiLU computed in the conv's kernel (`_shared_epilogue`: no kernel storing its exp2);
  # that SiLU stays realized once for the pool and the excite multiply, not evaluated in the pool
  C, E, H = 8, 48, 32
  a = [_arr(*s) for s in [(1, C, H, H), (E, C, 1, 1), (E,), (E, 1, 3, 3), (E,), (4, E, 1, 1), (4,), (E, 4, 1, 1), (E,),
                          (C, E, 1, 1), (C,)]]

  def block(x, w1, b1, wd, bd, ws1, bs1, ws2, bs2, w2, b2, F=None):
    if F is None:
      h = x.conv2d(w1, b1).silu()
      h = h.conv2d(wd, bd, groups=E, padding=1).silu()
      s = h.mean((2, 3), keepdim=True).conv2d(ws1, bs1).silu().conv2d(ws2, bs2).sigmoid()
      return (h * s).conv2d(w2, b2) + x
    h = F.silu(F.conv2d(x, w1, b1))
    h = F.silu(F.conv2d(h, wd, bd, groups=E, padding=1))
    s = torch.sigmoid(F.conv2d(F.silu(F.conv2d(h.mean((2, 3), keepdim=True), ws1, bs1)), ws2, bs2))
    return F.conv2d(h * s, w2, b2) + x
  got, n = _kernels(block, *[_t(v) for v in a])
  want = block(*[torch.from_numpy(v) for v in a], F=F).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert n == 14, n


def test_residual_relu_fused_into_the_conv():
  # resnet's basic block: conv -> ReLU -> conv, + skip, ReLU, read by the next 3x3 conv: 6 kernels (3 weight copies,
  # 3 convs), each ReLU (and the skip add) its conv's epilogue, as before this change
  x, w1, w2, w3 = _arr(1, 16, 24, 24), _arr(16, 16, 3, 3), _arr(16, 16, 3, 3), _arr(16, 16, 3, 3)

  def blk(x, w1, w2, w3, F=None):
    if F is None: return (x.conv2d(w1, padding=1).relu().conv2d(w2, padding=1) + x).relu().conv2d(w3, padding=1)
    return F.conv2d(F.relu(F.conv2d(F.relu(F.conv2d(x, w1, padding=1)), w2, padding=1) + x), w3, padding=1)
  got, n = _kernels(blk, _t(x), _t(w1), _t(w2), _t(w3))
  want = blk(*[torch.from_numpy(v) for v in (x, w1, w2, w3)], F=F).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert n == 6, n


@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0)])
def test_stem_conv_not_fused_behind_max_pool_padding(k: int, s: int, p: int):
  # resnet18's stem: a 7x7 stride-2 conv -> ReLU -> max pool. With padding the conv + ReLU is stored unpadded (the
  # -inf fill is seen through as the PAD it is) and the pool reads it behind the padding's gates, -inf their else:
  # 3 kernels (weight copy, conv + ReLU, pool); before, 4 (a padded copy of the ReLU's output as well). The conv
  # never runs behind the padding's gates (4x slower). Unpadded: the weight copy, then conv, ReLU and pool in one.
  x, w, b = _arr(1, 3, 96, 96), _arr(16, 3, 7, 7), _arr(16)
  got, n = _kernels(lambda x, w, b: x.conv2d(w, b, stride=2, padding=3).relu().max_pool2d(k, s, padding=p),
                    _t(x), _t(w), _t(b))
  tw = F.relu(F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride=2, padding=3))
  want = F.max_pool2d(tw, k, s, padding=p).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert n == (3 if p else 2), n


def test_fused_activations_at_large_magnitudes_match_torch():
  # exp's polynomial as fused multiply-adds and its rounding by the shifter (lower/transcendental.py) under a conv
  # epilogue and alone: sigmoid / SiLU / exp of large, tiny, infinite and NaN inputs behave as torch's (0 and 1
  # exactly at the saturated ends, inf -> inf, underflow -> 0, NaN stays NaN), everything else within float32 rounding
  special = np.array([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 87.5, 88.8, 89.0, -87.0, -88.8, -103.0, -104.0, 150.0,
                      -150.0, 1e4, -1e4, 3e38, -3e38, np.inf, -np.inf, np.nan], np.float32)
  x = np.concatenate([special, rng.uniform(-120, 120, 490).astype(np.float32)]).reshape(2, 16, 4, 4)
  for name in ("sigmoid", "silu", "exp"):
    got = getattr(_t(x), name)().numpy()
    want = getattr(torch, name, getattr(F, name, None))(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=name)
    # relative, so tiny values must match too: exp(x) as exp2(x * log2(e)) carries x's product's rounding, |x| 2**-24
    # relative, up to ~8e-6 at |x| = 88
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-40, err_msg=name)
  # the same SiLU as a 1x1 conv's epilogue, inputs scaled up so the pre-activations reach +-1e3 and beyond
  w, b = _arr(8, 16, 1, 1) * 40, _arr(8) * 40
  xs = np.nan_to_num(x, nan=0.0, posinf=50.0, neginf=-50.0).clip(-50, 50)
  got = _t(xs).conv2d(_t(w), _t(b)).silu().numpy()
  want = F.silu(F.conv2d(torch.from_numpy(xs), torch.from_numpy(w), torch.from_numpy(b))).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_last_conv_split_from_the_global_pool():
  # efficientnet_b0's head: 1x1 conv 320 -> 1280 on 7x7, SiLU, global average pool. Fused into the pool (1280
  # outputs, too many for the few-outputs split) the conv ran as 49 serial GEMVs per channel (`r_1_1280_1_1`, 24
  # GFLOPS, its SiLU scalar); now the conv + SiLU is one kernel (a GEMM with its epilogue, vector code) and the pool
  # sums that kernel's output (no exp2 of its own). One kernel more (weight copy, conv, pool), the values as torch's
  from tiny_tensor import engine
  x, w, b = _arr(1, 320, 7, 7), _arr(1280, 320, 1, 1), _arr(1280)
  tx, tw, tb = _t(x).realize(), _t(w).realize(), _t(b).realize()
  calls: list = []
  with engine.capture(calls.append): got = tx.conv2d(tw, tb).silu().mean((2, 3)).realize().numpy()
  want = F.silu(F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b))).mean((2, 3)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  kernels = [c.spec for c in calls if c.kind == "kernel"]
  pool = kernels[-1]
  assert len(kernels) == 3, [k.name for k in kernels]
  conv = [k for k in kernels if "1280_7_7" in k.name]
  assert len(conv) == 1 and "call <16 x float> @llvm.fma.v16f32" in conv[0].src, [k.name for k in kernels]
  assert [c.bufs[0].size for c in calls if c.kind == "kernel" and c.spec is conv[0]] == [1280 * 49]
  assert pool.src.count("@llvm.fma.") == 0, pool.src  # the SiLU's polynomial is in the conv's kernel, not the pool's


def test_sigmoid_silu_wide_range_vs_torch():
  # sigmoid's 1 + exp2(-x*log2(e)) computes its exp2 without underflow lanes (an exp2 below 2**-25 rounds away in the
  # sum): a 0.01 grid from -200 to 200, normal samples and the extremes agree with torch, NaN and +-inf as torch's
  x = np.concatenate([np.linspace(-200, 200, 40001), rng.standard_normal(4000) * 8,
                      [0.0, -0.0, 1e-30, -1e-30, 16.6, 17.3, -16.6, -17.3, 87.3, -87.3, 88.8, -88.8, 103.9, -103.9,
                       3e38, -3e38, np.inf, -np.inf, np.nan]])
  x = x.astype(np.float32)
  tx = torch.from_numpy(x)
  for ours, theirs in ((lambda t: t.sigmoid(), torch.sigmoid), (lambda t: t.silu(), F.silu)):
    got, want = ours(_t(x)).numpy(), theirs(tx).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=1e-37)
  # relative error where the sigmoid is tiny but normal (x down to -87): exp's argument rounding only
  small = np.linspace(-87, -20, 2001).astype(np.float32)
  np.testing.assert_allclose(_t(small).sigmoid().numpy(), torch.sigmoid(torch.from_numpy(small)).numpy(), rtol=2e-5)


@pytest.mark.parametrize("cin,cout,hw", [(16, 96, 28), (24, 144, 14)])
def test_conv1x1_silu_vs_torch(cin, cout, hw):
  # efficientnet's 1x1 expand conv with its SiLU epilogue in one kernel (the weights' layout copy besides), values at
  # activations large enough to reach sigmoid's saturated range
  x, w, b = _arr(1, cin, hw, hw) * 20, _arr(cout, cin, 1, 1), _arr(cout) * 10
  got, n = _kernels(lambda x, w, b: x.conv2d(w, b).silu(), _t(x), _t(w), _t(b))
  want = F.silu(F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b))).numpy()
  assert want.max() > 25 and want.min() < -0.2
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert n <= 2, n


@pytest.mark.parametrize("c,hw,k,s,lanes", [(12, 56, 3, 1, 14), (12, 112, 3, 2, 14), (12, 28, 5, 1, 14)])
def test_split_row_depthwise_silu_vs_torch(c, hw, k, s, lanes):
  # efficientnet's depthwise conv + SiLU read by its squeeze-excite, on an output row split in several vectors (56 as
  # 4 x 14, 28 as 2 x 14): 3 channels' rows in the conv's kernel, each its own accumulator chain, the row still the
  # vector (`SPLIT_ROW_CHANNELS`), its border lanes masked; values against torch with pre-activations reaching
  # sigmoid's saturated range
  r = np.random.default_rng(hw * 10 + k + s)  # its own draws: the range check below holds whatever runs before
  x, w, b = (r.standard_normal(sh).astype(np.float32) * f for sh, f in (((1, c, hw, hw), 6), ((c, 1, k, k), 0.3),
                                                                        ((c,), 3)))
  tx, tw, tb = _t(x).realize(), _t(w).realize(), _t(b).realize()

  def block(x, w, b, F=None):
    if F is None:
      h = x.conv2d(w, b, groups=c, stride=s, padding=k // 2).silu()
      return h * h.mean((2, 3), keepdim=True).sigmoid()
    h = F.silu(F.conv2d(x, w, b, groups=c, stride=s, padding=k // 2))
    return h * torch.sigmoid(h.mean((2, 3), keepdim=True))
  from tiny_tensor import engine
  calls: list = []
  with engine.capture(calls.append): got = block(tx, tw, tb).realize().numpy()
  want = block(*(torch.from_numpy(v) for v in (x, w, b)), F=F).numpy()
  assert np.abs(want).max() > 25
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  conv = [cl.spec for cl in calls if cl.kind == "kernel" and cl.spec.name.startswith(f"r_1_{c}_{hw // s}_{hw // s}")]
  assert len(conv) == 1, [cl.spec.name for cl in calls if cl.kind == "kernel"]
  assert conv[0].src.count(f"alloca [1 x <{lanes} x float>]") == 3 and "<3 x float>" not in conv[0].src, conv[0].src
