"""sin/cos/tan, exp2/log2 and pow over the whole float range on the session's default device, against numpy.

The GPU renderers (PTX, NVPTX, AMD) lower SIN to tiny's polynomial after a Payne-Hanek reduction
(tiny_codegen.lower.transcendental); the CPU uses libm. Both must be accurate for every finite argument: the
reference is numpy's float64 result rounded to the tested dtype, the bound a few units in the last place."""
from __future__ import annotations

import decimal

import numpy as np
import pytest
from tiny_tensor import Device, Tensor, dtypes

NP = {dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}
_PI = decimal.Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863")


def _need(dt) -> None:
  """Skip (with the reason) a dtype the default device's renderer does not have; float32 every renderer has."""
  if dt != dtypes.float32 and dt not in Device[Device.DEFAULT].renderer.supported_dtypes():
    pytest.skip(f"{dt.name} is not in {Device.DEFAULT}'s renderer's supported_dtypes()")


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """|got - want| in units in the last place of `want`'s dtype (monotone integer mapping of the bit patterns)."""
  it = {2: np.int16, 4: np.int32, 8: np.int64}[got.itemsize]
  def key(v: np.ndarray) -> np.ndarray:
    i = v.view(it).astype(object)
    return np.where(i < 0, -(i & ~(1 << (8 * v.itemsize - 1))), i)
  return np.abs(key(got) - key(want)).astype(np.float64)


def args(np_dt) -> np.ndarray:
  """Log-spaced magnitudes from the smallest subnormal to the dtype's max (both signs) and the floats nearest k*pi/2
  for k up to the dtype's range (where the reduced argument nearly cancels)."""
  rng = np.random.default_rng(11)
  fi = np.finfo(np_dt)
  lo, hi = np.log(float(fi.smallest_subnormal)), np.log(float(fi.max))
  mags = np.concatenate([np.exp(rng.uniform(lo, hi, 600)), [float(fi.max), 1e5, 3e7, 6e3, 7e3]])
  with np.errstate(over="ignore"): x = (mags * rng.choice([-1.0, 1.0], len(mags))).astype(np_dt)  # inf: dropped
  ctx = decimal.Context(prec=90)
  ks = [int(k) for k in np.concatenate([np.arange(1, 60), 2.0 ** rng.uniform(4, np.log2(float(fi.max)) - 1, 100)])]
  near = np.array([float(ctx.multiply(decimal.Decimal(k), ctx.divide(_PI, 2))) for k in ks]).astype(np_dt)
  out = np.concatenate([x, near])
  return out[np.isfinite(out)]


def np_ref(fn, x: np.ndarray) -> np.ndarray:
  with np.errstate(all="ignore"): return fn(x.astype(np.float64)).astype(x.dtype)


DTS = [dtypes.float32, dtypes.float16, dtypes.float64]


@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_sin_every_finite_argument(dt):
  _need(dt)
  x = args(NP[dt])
  d = ulps(Tensor(x).sin().numpy(), np_ref(np.sin, x))
  assert d.max() <= 1, f"{int((d > 1).sum())}/{len(x)} beyond 1 ulp; worst {d.max()} at x={x[d.argmax()]!r}"


@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_cos_and_tan_every_finite_argument(dt):
  """cos is sin(2x)/(2 sin x) (1 - 2 sin(x/2)**2 near 0 and beyond max/4, where 2x overflows; that form cancels near
  cos's zeros, so there the bound is absolute); tan is sin/cos."""
  _need(dt)
  x = args(NP[dt])
  c, t = Tensor(x).cos().numpy(), Tensor(x).tan().numpy()
  rc, rt = np_ref(np.cos, x), np_ref(np.tan, x)
  far = np.abs(x.astype(np.float64)) > float(np.finfo(NP[dt]).max) / 4
  dc = ulps(c[~far], rc[~far])
  assert dc.max() <= 4, f"cos: worst {dc.max()} ulp at x={x[~far][dc.argmax()]!r}"
  eps = float(np.finfo(NP[dt]).eps)
  np.testing.assert_allclose(c[far].astype(np.float64), rc[far].astype(np.float64), rtol=0, atol=4 * eps)
  ok = ~far & np.isfinite(rt)
  dt_ = ulps(t[ok], rt[ok])
  assert dt_.max() <= 6, f"tan: worst {dt_.max()} ulp at x={x[ok][dt_.argmax()]!r}"


@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_special_values(dt):
  """+-inf and nan give nan; sin(-0.0) and tan(-0.0) keep the sign; a subnormal is its own sine."""
  _need(dt)
  tiny = np.finfo(NP[dt]).smallest_subnormal
  x = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, tiny, -5 * tiny], NP[dt])
  s, c, t = Tensor(x).sin().numpy(), Tensor(x).cos().numpy(), Tensor(x).tan().numpy()
  assert np.isnan(s[:3]).all() and np.isnan(c[:3]).all() and np.isnan(t[:3]).all()
  np.testing.assert_array_equal(np.signbit(s[3:5]), [True, False])
  np.testing.assert_array_equal(np.signbit(t[3:5]), [True, False])
  np.testing.assert_array_equal(s[3:], x[3:])
  np.testing.assert_array_equal(c[3:], np.ones(4, NP[dt]))


@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_exp2_log2_edges(dt):
  """exp2 overflows to inf and underflows through the subnormals to 0 where numpy does, exp2(-0.0) = 1; log2 of every
  positive float (subnormals too), of +-0.0 (-inf), of a negative (nan) and of inf."""
  _need(dt)
  f = NP[dt]
  fi = np.finfo(f)
  lo, hi = -(fi.maxexp + fi.nmant + 3), fi.maxexp + 2
  e = np.concatenate([np.linspace(lo, hi, 700), [-0.0, 0.0, fi.maxexp, -(fi.maxexp + fi.nmant - 1)]]).astype(f)
  ex, want = Tensor(e).exp2().numpy(), np_ref(np.exp2, e)
  np.testing.assert_array_equal(np.isinf(ex), np.isinf(want))
  np.testing.assert_array_equal(ex == 0, want == 0)
  d = ulps(ex, want)
  assert d.max() <= 2, f"exp2: worst {d.max()} ulp at {e[d.argmax()]!r}"
  rng = np.random.default_rng(3)
  x = np.exp(rng.uniform(np.log(float(fi.smallest_subnormal)), np.log(float(fi.max)), 700)).astype(f)
  x = np.concatenate([x, [1.0, 2.0, 0.5, float(fi.max), float(fi.smallest_subnormal)]]).astype(f)
  d = ulps(Tensor(x).log2().numpy(), np_ref(np.log2, x))
  assert d.max() <= 2, f"log2: worst {d.max()} ulp at {x[d.argmax()]!r}"
  sp = Tensor(np.array([-0.0, 0.0, -1.0, np.inf, np.nan], f)).log2().numpy()
  assert sp[0] == -np.inf and sp[1] == -np.inf and np.isnan(sp[2]) and sp[3] == np.inf and np.isnan(sp[4])


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_pow_edges(dt):
  """C's pow rules against numpy: signed zeros, infinities, nan, negative bases with integer exponents, results that
  overflow to inf or underflow to 0 (and subnormals). pow is exp2(y) with y = e*log2(|b|) rounded to the format, so
  its error grows with |y| (about |y| ulp; known limitation, see CHANGELOG): the bound is 4 + 2|y| ulp."""
  _need(dt)
  f = NP[dt]
  big = float(np.finfo(f).max)
  bases = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 10.0, np.inf, -np.inf, np.nan, 1e-30, big, 1.5], f)
  exps = np.array([0.0, -0.0, 1.0, -1.0, 2.0, 3.0, -3.0, 0.5, -0.5, 2.5, 1e5, -1e5, 200.0, -200.0, np.inf, -np.inf,
                   np.nan, 1100.0, -1100.0, 255.0, -255.0, -300.0], f)
  b, e = (g.ravel() for g in np.meshgrid(bases, exps))
  got = (Tensor(b) ** Tensor(e)).numpy()
  with np.errstate(all="ignore"):
    want = np.power(b.astype(np.float64), e.astype(np.float64)).astype(f)
    y = np.abs(e.astype(np.float64) * np.log2(np.abs(b.astype(np.float64))))
  nan_differs = np.isnan(got) != np.isnan(want)
  assert not nan_differs.any(), list(zip(b[nan_differs], e[nan_differs], got[nan_differs]))
  fin = ~np.isnan(want)
  zero = fin & (want == 0)
  np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))
  inf = fin & np.isinf(want)
  np.testing.assert_array_equal(got[inf], want[inf])
  ok = fin & ~inf
  bound = 4 + 2 * np.nan_to_num(y[ok], nan=0.0, posinf=0.0)
  bad = ulps(got[ok], want[ok]) > bound
  assert not bad.any(), list(zip(b[ok][bad], e[ok][bad], got[ok][bad], want[ok][bad]))
