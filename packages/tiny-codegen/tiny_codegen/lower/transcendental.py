"""Our own exp2/log2/sin: polynomial decompositions for renderers without native (libm-backed) versions.

`pm_transcendental(dtypes)` rewrites EXP2, LOG2 and SIN on float32/float64 into ALU ops (ADD, MUL, FDIV, TRUNC,
comparisons, casts, bitcasts and shifts; LDEXP where the renderer lists the dtype in `ldexp_ops`). The coefficients
are computed here in 40-digit decimal arithmetic (exp2's by Chebyshev interpolation, log2's and sin's Taylor), with
enough terms that the approximation error is far below the format's precision:
  exp2(x) = 2**n * p(f), n = round(x) (by a shifter's low bits), f = x - n in [-1/2, 1/2], p(f) = 1 + f*q(f), q a
            Chebyshev interpolant of (2**f - 1)/f (float32: degree 6, 0.085 ulp of approximation error; float64: 11,
            0.076; the Taylor series needed 7 and 14), scaled by adding n to p's exponent bits (a subnormal result
            by one multiply more, so it rounds once); on a renderer with `fused_mulacc` (LLVM) p's Horner steps are
            fused multiply-adds; added to a constant of magnitude >= 1 (sigmoid's 1 + e), x clamped up to
            -(mant+2) instead (`pm_absorbed_exp2`: smaller results round away in the sum), with no underflow lanes;
            with LDEXP in `ldexp_ops` (float32 on AVX-512: `vscalefps`), 2**n * p is one LDEXP(p, n) instead, which
            rounds once, keeps NaN and needs no subnormal or NaN lanes (the same bits);
  log2(x) = e + 2/ln2 * atanh(s), x = m * 2**e with m in [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1) (odd series in s);
  sin(x)  = +-sin(r) or +-cos(r), x = k*pi/2 + r, |r| <= pi/4: r = x below 1/2, else a Payne-Hanek reduction, exact
            for every finite x: |x|*2/pi mod 4 is the significand times a window of 2/pi's bits (picked by the exponent
            from a table computed at import, by selects), multiplied in 22-bit integer limbs; the fraction becomes
            r as a double-word float (hi + lo) that keeps its significand even for the float nearest a multiple of pi/2.
All three are within 1 ulp of the correctly rounded result for every finite argument (float32 and float64; checked
against numpy by tests/test_lower_transcendental.py). The reduction costs about 200 instructions per float32 sin on
the GPUs (PTX 128 -> 343, gfx1100 79 -> 268; float64 146 -> ~1000, mostly the table selects); a select between a
cheap small-|x| reduction and this one would compute both, branch-free code has no cheaper path.
With `via_f64=True` float32 inputs are computed with the float64 decomposition and rounded once (the default on
CPUs). NaN, +-inf, +-0 and subnormals follow C's exp2/log2/sin (sin(-0.0) = -0.0).
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

# per float format: (int dtype, mantissa bits, exponent bias, exp2 degree, log2 terms, sin/cos degree)
_FMT = {dtypes.float32: (dtypes.int32, 23, 127, 6, 6, 12), dtypes.float64: (dtypes.int64, 52, 1023, 11, 11, 18)}


@functools.cache
def _exp2_coeffs(deg: int) -> tuple[float, ...]:
  """p(f) = 1 + f*q(f) ~ 2**f on [-1/2, 1/2], highest degree first: q of degree deg-1 interpolates (2**f - 1)/f at
  deg Chebyshev nodes (near-minimax; Newton's divided differences, then the monomial form, all in 40 digits). The
  constant term is exactly 1, so 2**n stays exact. Relative error (40-digit check on 2001 points): degree 6 5.1e-9
  (0.085 units of 2**-24), degree 11 8.4e-18 (0.076 units of 2**-53), as the Taylor degrees 7 and 14 were."""
  nodes = [decimal.Decimal(0.5 * math.cos((2 * j + 1) * math.pi / (2 * deg))) for j in range(deg)]
  dd = [_D.divide(_D.exp(_D.multiply(f, _LN2)) - 1, f) for f in nodes]
  for k in range(1, deg):
    for j in range(deg - 1, k - 1, -1): dd[j] = _D.divide(dd[j] - dd[j - 1], nodes[j] - nodes[j - k])
  q = [dd[-1]]  # Newton form to monomials, highest first: q = q * (f - node_k) + dd_k
  for k in range(deg - 2, -1, -1):
    q = [a - _D.multiply(b, nodes[k]) for a, b in zip([*q, decimal.Decimal(0)], [decimal.Decimal(0), *q])]
    q[-1] += dd[k]
  return (*(float(c) for c in q), 1.0)


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


FMA = "fma"
"""MULACC's arg for a fused multiply-add (one rounding): what `_poly` builds with `fma=True`, for a renderer whose
`fused_mulacc` says it renders that as one instruction (LLVM's `llvm.fma`). `pm_decomp` keeps such a MULACC, where it
turns an unfused one into a*b+c."""


def _poly(x: UOp, coeffs: tuple[float, ...], fma: bool = False) -> UOp:
  """Horner evaluation, coefficients highest degree first; with `fma` each step one fused multiply-add (MULACC with
  arg `FMA`): half the instructions, and each step rounds once, so the result is as accurate or more."""
  acc = _c(x, coeffs[0])
  for c in coeffs[1:]: acc = UOp(Ops.MULACC, x.dtype, (acc, x, _c(x, c)), FMA) if fma else acc * x + _c(x, c)
  return acc


def exp2(x: UOp, fma: bool = False, absorbed: bool = False, ldexp: bool = False) -> UOp:
  """2**x (see the module docstring); `fma`: the polynomial as fused multiply-adds (see `_poly`). `absorbed`: the
  result is only added to a constant of magnitude >= 1 (`_absorbed_exp2`), which absorbs any 2**x below
  2**-(mant+2): x is clamped up to -(mant+2) there, so the underflow and subnormal paths (4-6 vector ops) are gone.
  `ldexp` (float32, a renderer with `ldexp_ops`: AVX-512's `vscalefps`): 2**n * p as one LDEXP(p, n), which rounds
  once (subnormals included), overflows to inf and keeps p's NaN: the exponent-bit paths, the subnormal scaling and
  the NaN select are gone (x clamped up to bias+1, and down as above: absorbed, one vmaxps)."""
  dt = x.dtype
  idt, mant, bias, deg, *_ = _FMT[dt]
  hi = float(bias + 1)
  xh = (_c(x, hi) < x).where(_c(x, hi), x)
  if ldexp:
    # absorbed: clamped up to -(mant+2) as below (one vmaxps: compared on the value it picks); else below
    # -(bias+mant) the result rounds to +0: 2**0 computed there instead and 0 taken (no underflowing scalef)
    lo, under = _c(x, float(-(mant + 2))), x < _c(x, float(-(bias + mant)))
    xc = (xh < lo).where(lo, xh) if absorbed else under.where(_c(x, 0.0), xh)
    nf = (xc + _c(x, 1.5 * 2.0 ** mant)) - _c(x, 1.5 * 2.0 ** mant)
    ret = UOp(Ops.LDEXP, dt, (_poly(xc - nf, _exp2_coeffs(deg), fma), nf))
    return ret if absorbed else under.where(_c(x, 0.0), ret)
  if absorbed:  # xh clamped up to -(mant+2) (a select, as above: NaN stays in it): no lane underflows. Compared and
    # selected on the same value, so x86 takes it as one vmaxps (a compare of x, then a blend of xh, were two ops)
    xc = (xh < _c(x, float(-(mant + 2)))).where(_c(x, float(-(mant + 2))), xh)
  else:
    # below -(bias+mant) the result is under half the least subnormal, so it rounds to +0; those lanes compute 2**0
    # instead, because an x86 multiply whose result underflows takes a microcode assist (~14x slower: a masked
    # softmax's exp of -1e9 scores), and take 0 at the end
    under = x < _c(x, float(-(bias + mant)))
    xc = under.where(_c(x, 0.0), xh)
  # n = round(xc) by the shifter 1.5 * 2**mant: |xc| <= bias + mant is far below 2**(mant-1), so xc + shifter has no
  # fraction bits left (rounded to nearest even once) and its low bits are n (two's complement); two adds and an
  # integer subtract where a sign select, add, trunc and convert were
  shifter = 1.5 * 2.0 ** mant
  t = xc + _c(x, shifter)
  nf = t - _c(x, shifter)
  f = xc - nf
  p = _poly(f, _exp2_coeffs(deg), fma)
  # 2**n * p by adding n to p's exponent field: t's bits shifted left by `mant` are n << mant (the shifter's own bits
  # shift out). Exact while the result is normal: n >= 2 - bias (p >= sqrt(1/2)), and up to n = bias + 1 (there
  # f <= 0, so p <= 1: the largest finite values, and inf exactly at x = bias + 1). Below, the result may be
  # subnormal: those lanes add n + 64 and take one multiply by 2**-64, the only rounding; the others multiply by 1
  nbits = t.bitcast(idt) << mant
  if absorbed: return x.ne(x).where(x, (p.bitcast(idt) + nbits).bitcast(dt))  # n >= -(mant+2): always normal
  low = nf < _c(x, float(2 - bias))
  adj = low.where(UOp.const(idt, 64 << mant), UOp.const(idt, 0))
  scaled = ((p.bitcast(idt) + nbits) + adj).bitcast(dt) * low.where(_c(x, 2.0 ** -64), _c(x, 1.0))
  ret = under.where(_c(x, 0.0), scaled)
  return x.ne(x).where(x, ret)  # NaN stays NaN


def log2(x: UOp, fma: bool = False) -> UOp:
  """log2(x) (see the module docstring); `fma`: the series' polynomial as fused multiply-adds (see `_poly`)."""
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
  tail = s_hi * z * _poly(z, tuple(c / _log2_coeffs(nterms)[-1] for c in _log2_coeffs(nterms)[:-1]), fma)
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


# ***** Payne-Hanek reduction: x * 2/pi mod 4 in exact integer arithmetic, for any finite x *****
# bits per limb: a limb product (44 bits) plus a few column terms and a carry fit an int64, and a limb converts to
# float32 exactly. Not 24: LLVM's AMDGPU backend (LLVM 22.1 in llvmlite 0.50; reproduction in tiny-runtime-amd's
# README, Known issues) turns `mul i64 a, (and b, 0xFFFFFF)` into a 24-bit multiply that masks by itself, drops the
# `and`, then fuses the multiply with an add into v_mad_u64_u32, which does not mask: b's high bits leak into the
# product (found on MOCK+AMD; a 22-bit mask stays in the code).
_LIMB = 22
_MASK = (1 << _LIMB) - 1


@functools.cache
def _two_over_pi_words(nwords: int) -> tuple[int, ...]:
  """The first `nwords` limbs of 2/pi's binary fraction (limb j holds bits 22j+1 .. 22j+22 after the point).

  pi comes from Machin's formula, arctan series in integer fixed point with 64 guard bits."""
  nbits = _LIMB * nwords + 64
  one = 1 << nbits

  def arctan_inv(n: int) -> int:  # arctan(1/n) * 2**nbits
    total, term, k, n2 = 0, one // n, 0, n * n
    while term:
      total += term // (2 * k + 1) if k % 2 == 0 else -(term // (2 * k + 1))
      term //= n2
      k += 1
    return total
  pi = 16 * arctan_inv(5) - 4 * arctan_inv(239)  # pi * 2**nbits, off by a few units in the last place
  frac = (2 * one * one // pi) >> 64  # 2/pi * 2**(nbits-64); 2/pi < 1, so these are the fraction's bits
  return tuple((frac >> (_LIMB * (nwords - 1 - j))) & _MASK for j in range(nwords))


# per float format: (zero words before 2/pi's bits, result limbs). The zero words cover the window start of the
# smallest reduced argument (|x| >= 1/2: s - 2 >= -mantissa - 3). The result limbs hold frac(|x|*2/pi / 4) to 88 / 176
# bits, with an absolute error (in units of pi/2) below 2**(mantissa+3-bits): 2**-62 / 2**-121. A float is never
# closer to a nonzero multiple of pi/2 than 2**-29.9 / 2**-61.5 of pi/2 (continued fractions of 2**s * 2/pi, checked
# by tests/test_lower_transcendental.py), so r keeps at least 32 / 59 correct bits.
_PH = {dtypes.float32: (2, 4), dtypes.float64: (3, 8)}
_PH_MIN = 0.5  # |x| from which the Payne-Hanek remainder is used; below it r = x


def _select(idx: UOp, values: list[int]) -> UOp:
  """values[idx] (as uint32) for an int32 idx in range(len(values)), as a chain of selects (no memory table)."""
  acc = UOp.const(dtypes.uint32, values[0])
  for i, v in enumerate(values[1:], 1): acc = (idx < i).where(acc, UOp.const(dtypes.uint32, v))
  return acc


def _payne_hanek(x: UOp) -> tuple[UOp, UOp, UOp]:
  """|x| = q*pi/2 + r for a finite |x| >= 1/2 (other lanes get a harmless value):
  (q mod 4 as int64, r_hi, r_lo) with |r| <= pi/4 and r = r_hi + r_lo to about twice the format's precision.

  |x| = M * 2**s with an integer significand M, so |x|*2/pi mod 4 = 4*frac(M*F) with F = frac(2**(s-2) * 2/pi):
  F's bits are a window of 2/pi's bits starting at bit s-1 (zeros before 2/pi's first bit, for small s), and
  frac(M*F) is the product M*F modulo 1, computed exactly in 22-bit limbs."""
  dt = x.dtype
  idt, mant, bias, *_ = _FMT[dt]
  pad, n = _PH[dt]
  bits = x.bitcast(idt)
  # the window position in int32: small values (and no 64-bit literals in compares, which AMD's VOP3 lacks)
  ebits = ((bits >> mant) & ((1 << (8 * dt.itemsize - 1 - mant)) - 1)).cast(dtypes.int32)
  m = ((bits & ((1 << mant) - 1)) | (1 << mant)).cast(dtypes.int64)  # |x| = m * 2**(ebits-bias-mant) if normal
  p_max = (2 * bias) - bias - mant - 2 + _LIMB * pad  # the largest finite exponent's window start
  p = ebits - (bias + mant + 2 - _LIMB * pad)
  p = (p < 0).where(UOp.const(dtypes.int32, 0), (p_max < p).where(UOp.const(dtypes.int32, p_max), p))
  w, sh = p // _LIMB, (p % _LIMB).cast(dtypes.uint32)
  words = (0,) * pad + _two_over_pi_words(p_max // _LIMB + n + 1 - pad)
  nw = p_max // _LIMB + 1
  t = [_select(w, list(words[i:i + nw])) for i in range(n + 1)]
  # F's limbs, most significant first: 32-bit words suffice (a shift's wrapped-off bits are masked off anyway)
  g = [(((t[i] << sh) | (t[i + 1] >> (_LIMB - sh))) & _MASK).cast(dtypes.int64) for i in range(n)]
  ms = [(m >> (_LIMB * j)) & _MASK for j in range((mant + _LIMB) // _LIMB)]  # M's limbs, least significant first
  # D = M*G mod 2**(22n), G = sum g_i 2**(22(n-1-i)): column c gathers m_j*g_i with (n-1-i)+j = c
  d, carry = [], UOp.const(dtypes.int64, 0)
  for c in range(n):
    col = carry
    for j, mj in enumerate(ms):
      if 0 <= (i := n - 1 - c + j) < n: col = col + mj * g[i]
    d.append(col & _MASK)
    carry = col >> _LIMB
  # 4*frac = D / 2**(22n-2): the top two bits are the quadrant, the next bit rounds it to the nearest
  top_bits = _LIMB - 2
  half = ((d[-1] >> (top_bits - 1)) & 1).ne(0)
  q = ((d[-1] >> top_bits) + half.cast(dtypes.int64)) & 3
  e = d[:-1] + [d[-1] & ((1 << top_bits) - 1)]
  # a rounded-up quadrant leaves r = -(1 - f): negate the fraction limbs exactly (two's complement), keep the sign
  neg_limbs, borrow = [], UOp.const(dtypes.int64, 1)
  for c, ec in enumerate(e):
    mask = _MASK if c < n - 1 else (1 << top_bits) - 1
    v = (ec ^ mask) + borrow
    neg_limbs.append(v & mask)
    borrow = v >> (_LIMB if c < n - 1 else top_bits)
  a = [half.where(nl, ec) for nl, ec in zip(neg_limbs, e)]
  # |f| = sum a_c 2**(22c - 22(n-1) - 20): non-negative terms (22-bit: int32 converts to float in one instruction),
  # summed smallest first as hi + lo (each term exact)
  f_hi, f_lo = _c(x, 0.0), _c(x, 0.0)
  for c, ac in enumerate(a):
    term = ac.cast(dtypes.int32).cast(dt) * _c(x, 2.0 ** (_LIMB * c - _LIMB * (n - 1) - top_bits))
    f_hi, err = _two_sum(term, f_hi)
    f_lo = f_lo + err
  f_hi, f_lo = f_hi + f_lo, f_lo - ((f_hi + f_lo) - f_hi)
  # r = f * pi/2 in double-word arithmetic
  c_hi, c_lo = _df_const(x, _D.divide(_PI, 2))
  r_hi, r_err = _two_prod(f_hi, c_hi)
  r_lo = r_err + (f_hi * c_lo + f_lo * c_hi)
  r_hi, r_lo = r_hi + r_lo, r_lo - ((r_hi + r_lo) - r_hi)
  return q, half.where(-r_hi, r_hi), half.where(-r_lo, r_lo)


def sin(x: UOp, fma: bool = False) -> UOp:
  """sin(x) (see the module docstring); `fma`: the polynomials as fused multiply-adds (see `_poly`)."""
  dt = x.dtype
  *_, deg = _FMT[dt]
  ax = x.maximum(-x)
  finite = ax < math.inf
  big = _c(x, _PH_MIN) <= ax
  q, rb_hi, rb_lo = _payne_hanek(finite.where(ax, _c(x, 1.0)))  # of |x|: the sign is applied below
  neg = x < 0.0
  q = neg.where((UOp.const(dtypes.int64, 4) - q) & 3, q)  # -x = (-q)*pi/2 + (-r)
  r_hi, r_lo = neg.where(-rb_hi, rb_hi), neg.where(-rb_lo, rb_lo)
  # below 1/2 (< pi/4) x is its own remainder: exact, and subnormals keep their value
  q, r_hi, r_lo = big.where(q, UOp.const(dtypes.int64, 0)), big.where(r_hi, x), big.where(r_lo, _c(x, 0.0))
  z = r_hi * r_hi
  sc, cc = _sincos_coeffs(deg)
  # sin r = r + r**3 * S(z); cos r = 1 - z/2 + z**2 * C(z): the leading terms are added last, with r's low part
  s = r_hi + (r_lo + r_hi * z * _poly(z, sc[:-1], fma))
  half_z = z * 0.5
  c_hi = _c(x, 1.0) - half_z
  c = c_hi + ((((_c(x, 1.0) - c_hi) - half_z) - r_hi * r_lo) + z * z * _poly(z, cc[:-2], fma))
  ret = (q & 1).eq(0).where(s, c)
  ret = (q & 2).eq(0).where(ret, -ret)
  ret = x.eq(0.0).where(x, ret)  # sin(-0.0) = -0.0: the reduction's sum would give +0.0
  return finite.where(ret, _c(x, math.nan))


_DECOMP = {Ops.EXP2: exp2, Ops.LOG2: log2, Ops.SIN: sin}


def _sigmoid_product(ctx: tuple[frozenset, frozenset, bool, frozenset], m: UOp, x: UOp, r: UOp, a: UOp, e: UOp,
                     c: UOp) -> UOp | None:
  """x * (1 / (c + exp2(y))) -> x / (c + exp2(y)) for a float32/float64 constant c >= 1: SiLU's x * sigmoid(x), a
  squeeze-excite's scaling by its sigmoid gate. One division instead of a division and a multiply, rounded once
  instead of twice (within half an ulp of the exact quotient, the product within 1); the special values are the
  same (the denominator is >= 1 or +inf or NaN: x * 0 and x / inf, inf * 1 and inf / 1, NaN agree). Applied where
  the exp2 is decomposed (on the way down, before `_absorbed_exp2` sees the sum)."""
  if Ops.EXP2 not in ctx[0] or m.dtype not in _FMT or m.dtype.count != 1 or r.arg is not None: return None
  if not isinstance(c.arg, float) or not c.arg >= 1.0: return None
  return x / a


def _absorbed_exp2(ctx: tuple[frozenset, frozenset, bool, frozenset], a: UOp, e: UOp, c: UOp) -> UOp | None:
  """`c + exp2(x)` with a constant |c| >= 1 (sigmoid's 1 + 2**(-x*log2(e)), SiLU's, tanh's): every exp2(x) below
  2**-(mant+2) rounds away in the sum (under half an ulp of c, strictly), so exp2 may be computed for max(x,
  -(mant+2)) instead, which needs no underflow or subnormal lanes (`exp2(absorbed=True)`): the sum is bit for bit the
  same. Applied on the way down (before the EXP2 itself is decomposed), for float32/float64 computed in their own
  format. On the 2-core znver4, a 16 -> 96 1x1 conv + SiLU epilogue on 112x112 has ~5 fewer vector ops per 16
  outputs of ~30."""
  ops, via_f64, fma, ldexp = ctx
  dt = e.dtype
  if Ops.EXP2 not in ops or dt not in _FMT or dt.count != 1: return None
  if dt == dtypes.float32 and Ops.EXP2 in via_f64: return None  # (computed in float64: `_decompose`'s path)
  if not isinstance(c.arg, float) or not abs(c.arg) >= 1.0: return None  # (NaN: left as it was)
  return a.replace(src=tuple(exp2(e.src[0], fma, True, dt in ldexp) if s is e else s for s in a.src))


def _decompose(ctx: tuple[frozenset, frozenset, bool, frozenset], u: UOp) -> UOp | None:
  ops, via_f64, fma, ldexp = ctx
  if u.op not in ops or u.dtype.count != 1: return None
  dt, fn = u.dtype, _DECOMP[u.op]
  if dt == dtypes.float32 and u.op in via_f64: return fn(u.src[0].cast(dtypes.float64), fma).cast(dtypes.float32)
  if u.op is Ops.EXP2 and dt in ldexp: return exp2(u.src[0], fma, ldexp=True)
  if dt in _FMT: return fn(u.src[0], fma)
  if dtypes.is_float(dt): return fn(u.src[0].cast(dtypes.float32), fma).cast(dt)  # half/bf16/fp8 via float32
  return None


pm_transcendental = PatternMatcher([(UPat((Ops.EXP2, Ops.LOG2, Ops.SIN), name="u"), _decompose)],
                                   name="transcendental")
"""Rewrites EXP2/LOG2/SIN; ctx = (ops to decompose, those of them computed for float32 through float64, whether
the polynomials are fused multiply-adds: the renderer's `fused_mulacc`, the dtypes its `ldexp_ops` renders LDEXP of)."""
_EXP2_PLUS_C = UPat(Ops.ADD, src=[UPat(Ops.EXP2, name="e"), UPat.cvar("c", vec=False)], name="a")
pm_absorbed_exp2 = PatternMatcher([
  (UPat(Ops.MUL, src=[UPat.var("x"), UPat(Ops.RECIPROCAL, src=(_EXP2_PLUS_C,), name="r")], name="m"), _sigmoid_product),
  (_EXP2_PLUS_C, _absorbed_exp2)], name="absorbed_exp2")
"""Run on the way down with `pm_transcendental` (`graph_rewrite`'s `bpm`), same ctx: `_sigmoid_product`, then
`_absorbed_exp2`."""
