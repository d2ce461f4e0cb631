"""Our own exp2/log2/sin: polynomial decompositions for renderers without native (libm-backed) versions.

`pm_transcendental(dtypes)` rewrites EXP2, LOG2 and SIN on float32/float64 into ALU ops (ADD, MUL, FDIV, TRUNC,
comparisons, casts, bitcasts and shifts). The coefficients are Taylor coefficients computed here in 40-digit decimal
arithmetic, with enough terms that truncation error is far below the format's precision:
  exp2(x) = 2**n * p(f), n = round(x), f = x - n in [-1/2, 1/2], p(f) = sum (ln2 f)**k / k!, scaled by 2**n in two exact
            steps (so subnormal results round once);
  log2(x) = e + 2/ln2 * atanh(s), x = m * 2**e with m in [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1) (odd series in s);
  sin(x)  = +-sin(r) or +-cos(r), x = k*pi/2 + r (Cody-Waite reduction with pi/2 in three parts: accurate for |x|
            below about 6e3 in float32 and 1e7 in float64; larger arguments lose accuracy).
With `via_f64=True` float32 inputs are computed with the float64 decomposition and rounded once (≤ 1 ulp, the
default on CPUs). NaN, +-inf, 0 and subnormals follow C's exp2/log2/sin.
"""
from __future__ import annotations

import decimal
import functools
import math

from tiny_uop.dtype import DType, dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import Ops, UOp

_D = decimal.Context(prec=40)
_PI = decimal.Decimal("3.141592653589793238462643383279502884197169399375")
_LN2 = _D.ln(decimal.Decimal(2))

# per float format: (int dtype, mantissa bits, exponent bias, exp2 degree, log2 terms, sin/cos degree, pi/2 split bits)
_FMT = {dtypes.float32: (dtypes.int32, 23, 127, 8, 6, 12, 12), dtypes.float64: (dtypes.int64, 52, 1023, 14, 11, 18, 30)}


@functools.cache
def _exp2_coeffs(deg: int) -> tuple[float, ...]:
  """ln2**k / k!, highest degree first."""
  return tuple(float(_D.divide(_D.power(_LN2, k), math.factorial(k))) for k in range(deg, -1, -1))


@functools.cache
def _log2_coeffs(n: int) -> tuple[float, ...]:
  """2 / (ln2 * (2k+1)) for k < n, highest first: log2(m) = s * sum c_k s**2k."""
  return tuple(float(_D.divide(2, _D.multiply(_LN2, 2 * k + 1))) for k in range(n - 1, -1, -1))


@functools.cache
def _sincos_coeffs(deg: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """Taylor coefficients of sin(r)/r and cos(r) in r**2, highest first."""
  sin = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(deg // 2, -1, -1))
  cos = tuple((-1) ** k / math.factorial(2 * k) for k in range(deg // 2, -1, -1))
  return sin, cos


@functools.cache
def _pio2_parts(bits: int) -> tuple[float, float, float]:
  """pi/2 = hi + mid + lo, hi and mid with `bits` significant bits (so k*hi and k*mid are exact for small k)."""
  def round_bits(d: decimal.Decimal) -> float:
    e = math.frexp(float(d))[1]
    return math.ldexp(int(_D.multiply(d, decimal.Decimal(2) ** (bits - e)).to_integral_value()), e - bits)
  x = _D.divide(_PI, 2)
  hi = round_bits(x)
  mid = round_bits(_D.subtract(x, decimal.Decimal(hi)))
  lo = float(_D.subtract(_D.subtract(x, decimal.Decimal(hi)), decimal.Decimal(mid)))
  return hi, mid, lo


def _c(x: UOp, v: float) -> UOp: return UOp.const(x.dtype, v)


# ***** error-free transformations (no FMA needed): a value as an unevaluated sum hi + lo *****
def _two_sum(a: UOp, b: UOp) -> tuple[UOp, UOp]:
  """s + e == a + b exactly, s = fl(a + b) (Knuth)."""
  s = a + b
  bb = s - a
  return s, (a - (s - bb)) + (b - bb)


def _split(a: UOp) -> tuple[UOp, UOp]:
  """a == hi + lo with hi holding the upper half of the significand (Veltkamp)."""
  k = {dtypes.float32: 4097.0, dtypes.float64: 134217729.0}[a.dtype.scalar()]
  c = a * _c(a, k)
  hi = c - (c - a)
  return hi, a - hi


def _two_prod(a: UOp, b: UOp) -> tuple[UOp, UOp]:
  """p + e == a * b exactly, p = fl(a * b) (Dekker)."""
  p = a * b
  ah, al = _split(a)
  bh, bl = _split(b)
  return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _df_const(x: UOp, v: decimal.Decimal) -> tuple[UOp, UOp]:
  """Constant v as hi + lo in x's format."""
  fmt = x.dtype.scalar()
  hi = _round_to(float(v), fmt)
  return _c(x, hi), _c(x, _round_to(float(_D.subtract(v, decimal.Decimal(hi))), fmt))


def _round_to(v: float, fmt: DType) -> float:
  from tiny_uop.dtype import round_float
  return round_float(v, fmt)


def _poly(x: UOp, coeffs: tuple[float, ...]) -> UOp:
  """Horner evaluation, coefficients highest degree first."""
  acc = _c(x, coeffs[0])
  for c in coeffs[1:]: acc = acc * x + _c(x, c)
  return acc


def _trunc_round(x: UOp) -> UOp:
  """x rounded to the nearest integer (halves away from zero), as a float."""
  return (x + (x < 0.0).where(_c(x, -0.5), _c(x, 0.5))).trunc()


def _pow2(n: UOp, dt: DType) -> UOp:
  """2**n as float `dt`, for integer n in [1-bias, bias] (built from its bits)."""
  idt, mant, bias, *_ = _FMT[dt]
  return ((n + bias).cast(idt) << mant).bitcast(dt)


def _ldexp(x: UOp, n: UOp) -> UOp:
  """x * 2**n for integer n (same int dtype as the format) in [2-2*bias, 2*bias], in two exact steps."""
  n1 = n >> 1
  return x * _pow2(n1, x.dtype) * _pow2(n - n1, x.dtype)


def exp2(x: UOp) -> UOp:
  """2**x (see the module docstring)."""
  dt = x.dtype
  idt, mant, bias, deg, *_ = _FMT[dt]
  hi, lo = float(bias + 1), float(-(bias + mant + 2))
  xc = (x < lo).where(_c(x, lo), (_c(x, hi) < x).where(_c(x, hi), x))
  nf = _trunc_round(xc)
  f = xc - nf
  p = _poly(f, _exp2_coeffs(deg))
  ret = _ldexp(p, nf.cast(idt))
  return x.ne(x).where(x, ret)  # NaN stays NaN


def log2(x: UOp) -> UOp:
  """log2(x) (see the module docstring)."""
  dt = x.dtype
  idt, mant, bias, _, nterms, *_ = _FMT[dt]
  tiny = math.ldexp(1.0, 1 - bias)
  sub = x < tiny
  xs = sub.where(x * _c(x, 2.0 ** 64), x)
  bits = xs.bitcast(idt)
  e = ((bits >> mant) & ((1 << (8 * dt.itemsize - 1 - mant)) - 1)) - bias
  m = ((bits & ((1 << mant) - 1)) | (bias << mant)).bitcast(dt)
  big = _c(m, math.sqrt(2.0)) < m
  m = big.where(m * 0.5, m)
  ef = e.cast(dt) + big.cast(dt) - sub.cast(dt) * 64.0
  # s = (m-1)/(m+1) as s_hi + s_lo: m-1 is exact, m+1 = g_hi + g_lo, and the division's remainder is exact
  f = m - 1.0
  g_hi, g_lo = _two_sum(m, _c(m, 1.0))
  s_hi = f / g_hi
  p_hi, p_lo = _two_prod(s_hi, g_hi)
  s_lo = (((f - p_hi) - p_lo) - s_hi * g_lo) / g_hi
  # log2(m) = C0 * (s + s**3 * Q(s**2)); the tail is small, so only s and C0 carry a low part
  z = s_hi * s_hi
  tail = s_hi * z * _poly(z, tuple(c / _log2_coeffs(nterms)[-1] for c in _log2_coeffs(nterms)[:-1]))
  a_hi, a_err = _two_sum(s_hi, tail)
  a_lo = a_err + s_lo
  c_hi, c_lo = _df_const(x, _D.divide(2, _LN2))
  q_hi, q_err = _two_prod(c_hi, a_hi)
  q_lo = q_err + (c_hi * a_lo + c_lo * a_hi)
  r_hi, r_err = _two_sum(ef, q_hi)
  ret = r_hi + (r_err + q_lo)
  ret = (x < 0.0).where(_c(x, math.nan), ret)
  ret = x.eq(0.0).where(_c(x, -math.inf), ret)
  ret = x.eq(math.inf).where(x, ret)
  return x.ne(x).where(x, ret)


def sin(x: UOp) -> UOp:
  """sin(x) (see the module docstring)."""
  dt = x.dtype
  idt, _, _, _, _, deg, bits = _FMT[dt]
  finite = x.maximum(-x) < math.inf
  xf = finite.where(x, _c(x, 0.0))
  kf = _trunc_round(xf * _c(x, 2 / math.pi))
  hi, mid, lo = _pio2_parts(bits)
  # r = x - k*pi/2 as r_hi + r_lo: k*hi and k*mid are exact, the subtractions' errors are kept
  t1 = xf - kf * _c(x, hi)
  r_hi, r_lo = _two_sum(t1, -(kf * _c(x, mid)))
  r_lo = r_lo - kf * _c(x, lo)
  r_hi, r_lo = r_hi + r_lo, r_lo - ((r_hi + r_lo) - r_hi)
  # far beyond the exact-reduction range r is meaningless: keep it in [-1, 1] so the result stays bounded
  lost = _c(x, 1.0) < r_hi.maximum(-r_hi)
  r_hi, r_lo = lost.where(_c(x, 1.0), r_hi), lost.where(_c(x, 0.0), r_lo)
  z = r_hi * r_hi
  sc, cc = _sincos_coeffs(deg)
  # sin r = r + r**3 * S(z); cos r = 1 - z/2 + z**2 * C(z): the leading terms are added last, with r's low part
  s = r_hi + (r_lo + r_hi * z * _poly(z, sc[:-1]))
  half_z = z * 0.5
  c_hi = _c(x, 1.0) - half_z
  c = c_hi + ((((_c(x, 1.0) - c_hi) - half_z) - r_hi * r_lo) + z * z * _poly(z, cc[:-2]))
  q = kf.cast(idt) & 3
  ret = (q & 1).eq(0).where(s, c)
  ret = (q & 2).eq(0).where(ret, -ret)
  return finite.where(ret, _c(x, math.nan))


_DECOMP = {Ops.EXP2: exp2, Ops.LOG2: log2, Ops.SIN: sin}


def _decompose(ctx: tuple[frozenset, frozenset], u: UOp) -> UOp | None:
  ops, via_f64 = ctx
  if u.op not in ops or u.dtype.count != 1: return None
  dt = u.dtype
  if dt == dtypes.float32 and u.op in via_f64: return _DECOMP[u.op](u.src[0].cast(dtypes.float64)).cast(dtypes.float32)
  if dt in _FMT: return _DECOMP[u.op](u.src[0])
  if dtypes.is_float(dt): return _DECOMP[u.op](u.src[0].cast(dtypes.float32)).cast(dt)  # half/bf16/fp8 via float32
  return None


pm_transcendental = PatternMatcher([(UPat((Ops.EXP2, Ops.LOG2, Ops.SIN), name="u"), _decompose)],
                                   name="transcendental")
"""Rewrites EXP2/LOG2/SIN; ctx = (ops to decompose, those of them computed for float32 through float64)."""
