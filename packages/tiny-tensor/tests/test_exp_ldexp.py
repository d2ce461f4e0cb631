"""exp2/exp/sigmoid/SiLU over the float32 range against torch (issue #39): exp2 scales 2**n * p by LDEXP (one
`vscalefps`) where the device's renderer lists float32 in `ldexp_ops` (LLVM on an AVX-512 host), by exponent bits
elsewhere; both agree with torch, the special values exactly. On the CPU the source check holds for this host."""
import numpy as np
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor

rng = np.random.default_rng(3939)
F32 = np.finfo(np.float32)


def _args(lo: float, hi: float) -> np.ndarray:
  """A 1/64 grid over [lo, hi], random values, half-integers (round-to-even ties), the special values."""
  return np.concatenate([np.arange(lo, hi, 1 / 64), rng.uniform(lo, hi, 5000), np.arange(np.floor(lo), hi) + 0.5,
                         [0.0, -0.0, F32.smallest_subnormal, -F32.smallest_subnormal, 1e-30, -1e-30, 3e38, -3e38,
                          np.inf, -np.inf, np.nan]]).astype(np.float32)


def _same_specials(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """NaN where torch has NaN, +-inf and +-0 exactly where torch has them; the mask of the other (finite) lanes."""
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  special = np.isinf(want) | (want == 0)
  np.testing.assert_array_equal(got[special], want[special])
  np.testing.assert_array_equal(np.signbit(got[special]), np.signbit(want[special]))
  return np.isfinite(want) & ~special


def test_exp2_full_range_vs_torch():
  # from below the least subnormal result (-149) through overflow (128): within 1 ulp of torch's exp2 where normal,
  # within one subnormal step below (torch's and ours each round once)
  x = _args(-160, 140)
  got, want = Tensor(x).exp2().numpy(), torch.exp2(torch.from_numpy(x)).numpy()
  fin = _same_specials(got, want)
  normal = fin & (np.abs(want) >= F32.tiny)
  np.testing.assert_allclose(got[normal], want[normal], rtol=2.5e-7, atol=0)
  np.testing.assert_allclose(got[fin & ~normal], want[fin & ~normal], rtol=0, atol=F32.smallest_subnormal)


def test_exp_sigmoid_silu_full_range_vs_torch():
  # exp(x) = exp2(x * log2(e)): the product's rounding (|x| * 2**-24 relative) bounds the error at large |x|
  x = _args(-110, 95)
  tx = torch.from_numpy(x)
  got, want = Tensor(x).exp().numpy(), torch.exp(tx).numpy()
  fin = _same_specials(got, want)
  normal = fin & (want >= F32.tiny)
  np.testing.assert_allclose(got[normal], want[normal], rtol=1e-5, atol=0)
  np.testing.assert_allclose(got[fin & ~normal], want[fin & ~normal], rtol=1e-5, atol=2 * F32.smallest_subnormal)
  for ours, theirs in ((Tensor.sigmoid, torch.sigmoid), (Tensor.silu, F.silu)):
    g, w = ours(Tensor(x)).numpy(), theirs(tx).numpy()
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    np.testing.assert_array_equal(g[np.isinf(w)], w[np.isinf(w)])
    ok = np.isfinite(w)
    np.testing.assert_allclose(g[ok], w[ok], rtol=1e-5, atol=1e-37)


def test_exp2_scalef_in_the_source_where_the_renderer_lists_ldexp():
  from tiny_uop.plugins import Device

  from tiny_tensor import engine
  x = rng.standard_normal((64, 64)).astype(np.float32)
  calls: list = []
  t = Tensor(x, device="CPU").realize()
  with engine.capture(calls.append): got = t.sigmoid().realize().numpy()
  np.testing.assert_allclose(got, torch.sigmoid(torch.from_numpy(x)).numpy(), rtol=1e-6)
  srcs = [c.spec.src for c in calls if c.kind == "kernel"]
  ren = Device["CPU"].renderer
  assert len(srcs) == 1, srcs
  assert ("scalef.ps" in srcs[0] or "llvm.ldexp" in srcs[0]) == bool(getattr(ren, "ldexp_ops", ())), srcs[0]


def test_silu_and_gate_divide_once():
  # x * sigmoid(x) is x / (1 + exp2(-x * log2(e))) in the kernel (`_sigmoid_product`): one division, no reciprocal
  # of 1.0 and multiply; rounded once, so within half an ulp of the exact quotient of the kernel's own denominator
  from tiny_tensor import engine
  x = (rng.standard_normal(4096) * 6).astype(np.float32)
  x[:6] = [np.inf, -np.inf, np.nan, -0.0, 200.0, -200.0]
  t = Tensor(x, device="CPU").realize()
  calls: list = []
  with engine.capture(calls.append): got = t.silu().realize().numpy()
  want = F.silu(torch.from_numpy(x)).numpy()
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
  ok = np.isfinite(want)
  np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6, atol=1e-37)
  assert got[5] == 0 and np.signbit(got[5]) and got[4] == 200.0
  srcs = [c.spec.src for c in calls if c.kind == "kernel"]
  assert len(srcs) == 1 and "fdiv" in srcs[0] and "(float 1.0)" not in srcs[0] and "float 1.0, " not in srcs[0], srcs
