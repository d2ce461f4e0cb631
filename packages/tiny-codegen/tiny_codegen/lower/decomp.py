"""Decompositions: rewrite ops and dtypes a target lacks into ones it has.

`pm_gates`: gated INDEX/LOAD/STORE whose gate folded to a constant lose the gate (true) or the access (false: a
LOAD yields 0, a STORE disappears). `pm_decomp`: MULACC -> a*b+c (unfused, exact; a fused one, arg "fma", stays),
BIND -> its DEFINE_VAR, THREEFRY -> uint32 rounds, and the reference semantics (tiny_uop.alu) where hardware differs:
integer division by 0 or -1, shift counts modulo the width, float CDIV as trunc(a/b), TRUNC of an int.
`bf16_to_float`: bfloat16 through float32 for renderers without bf16 arithmetic: loads and stores move the raw 16 bits
(as uint16), math runs in float32 and each bfloat16 result is rounded to bfloat16 (as bf16 hardware and torch do),
float32 -> bfloat16 rounds to nearest even (NaN stays NaN); float64 -> bfloat16 goes through float32 rounded to odd, so
it rounds once. Vectors (after the expander) are handled lane-wise.
"""
from __future__ import annotations

import math
import struct
from typing import Any

from tiny_uop.dtype import DType, PtrDType, dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import GroupOp, Ops, UOp


def _gated_load(idx: UOp, ld: UOp) -> UOp | None:
  if len(idx.src) != 3 or idx.src[2].op is not Ops.CONST: return None
  if idx.src[2].arg: return ld.replace(src=(idx.replace(src=idx.src[:2]), *ld.src[1:]))
  return UOp.const(ld.dtype, 0)  # an invalid read yields 0


def _gated_store(idx: UOp, st: UOp) -> UOp | None:
  if len(idx.src) != 3 or idx.src[2].op is not Ops.CONST: return None
  if idx.src[2].arg: return st.replace(src=(idx.replace(src=idx.src[:2]), *st.src[1:]))
  return UOp(Ops.GROUP)  # never valid: no store


pm_gates = PatternMatcher([
  # end(x, c) -> x: a loop the simplifier folded away (bound 1) needs no END
  (UPat(Ops.END, name="e"), lambda e: e.src[0] if e.src[-1].op is not Ops.RANGE else None),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="ld"), _gated_load),
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="st"), _gated_store),
], name="gates")

def threefry2x32(x: UOp, key: UOp) -> UOp:
  """THREEFRY (uint64 counter, uint64 key) -> uint64 from uint32 add/xor/shift: threefry2x32-20 (Random123), word 0
  in the low 32 bits of each operand and of the result (bit-exact with `tiny_uop.alu.threefry2x32`)."""
  u32, u64 = dtypes.uint32, dtypes.uint64

  def c(v: int) -> UOp: return UOp.const(u32, v & 0xffffffff)
  x0, x1 = x.cast(u32), (x >> UOp.const(u64, 32)).cast(u32)
  k0, k1 = key.cast(u32), (key >> UOp.const(u64, 32)).cast(u32)
  ks = (k0, k1, k0 ^ k1 ^ c(0x1BD11BDA))
  x0, x1 = x0 + k0, x1 + k1
  for i in range(5):
    for r in ((13, 15, 26, 6), (17, 29, 16, 24))[i % 2]:
      x0 = x0 + x1
      x1 = ((x1 << c(r)) | (x1 >> c(32 - r))) ^ x0
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + c(i + 1)
  return (x1.cast(u64) << UOp.const(u64, 32)) | x0.cast(u64)


def _is_int(x: UOp) -> bool: return dtypes.is_int(x.dtype)


def _safe_div(d: UOp) -> UOp | None:
  """Integer CDIV/CMOD with a divisor that may be 0 (or -1, signed): x/0 = x%0 = 0 and INT_MIN/-1 wraps, as the
  reference semantics (tiny_uop.alu) define; hardware traps on both."""
  x, y = d.src
  if not _is_int(d) or y.vmin > 0 or (y.vmax < -1 if not dtypes.is_unsigned(y.dtype) else False): return None
  if y.op is Ops.WHERE and y.src[1].op is Ops.CONST and y.src[1].arg == 1: return None  # already guarded
  one, zero = y.const_like(1), d.const_like(0)
  bad0 = y.eq(0)
  signed = not dtypes.is_unsigned(y.dtype)
  badm1 = y.eq(-1) if signed else None
  bad = bad0 | badm1 if badm1 is not None else bad0
  ys = bad.where(one, y)
  if d.op is Ops.CMOD: return bad.where(zero, x % ys)
  q = x // ys
  return bad0.where(zero, badm1.where(-x, q) if badm1 is not None else q)


def _mask_shift(s: UOp) -> UOp | None:
  """SHL/SHR take the count modulo the bit width (what x86 does; C and LLVM leave larger counts undefined)."""
  x, y = s.src
  bits = x.dtype.scalar().itemsize * 8
  if not _is_int(s) or (0 <= y.vmin and y.vmax < bits): return None
  if y.op is Ops.AND and y.src[1].op is Ops.CONST and y.src[1].arg == bits - 1: return None  # already masked
  return s.replace(src=(x, y & (bits - 1)))


def _int_pow(p: UOp) -> UOp | None:
  """a ** b for ints by squaring over b's bits (wrapping); b < 0 gives the truncated real result (1, +-1 or 0)."""
  a, b = p.src
  if not _is_int(p): return None
  bits = b.dtype.scalar().itemsize * 8
  one = a.const_like(1)
  res, base = one, a
  for k in range(bits - (0 if dtypes.is_unsigned(b.dtype) else 1)):
    res = ((b >> k) & 1).ne(0).where(res * base, res)
    base = base * base
  if dtypes.is_unsigned(b.dtype): return res
  neg = a.eq(1).where(one, a.eq(-1).where((b & 1).ne(0).where(a.const_like(-1), one), a.const_like(0)))
  return (b < 0).where(neg, res)


# float (emax + 1, subnormal exponent, mantissa bits, same-size uint): the range of a quotient |x/y| (2**(128+149)
# for float32) and how much of it one exact step takes
_FMOD_FMT = {dtypes.float32: (128, 149, 24, dtypes.uint32), dtypes.float64: (1024, 1074, 53, dtypes.uint64)}


def exact_fmod(x: UOp, y: UOp) -> UOp:
  """C's `fmod(x, y)` of floats, exact for every pair (the IR's float CMOD), from division, trunc, a fused
  multiply-add (MULACC "fma": one rounding) and bit operations, for targets whose own fmod is not exact (PTX's
  `x - trunc(x/y)*y` was wrong once the quotient passed 2**29, and NaN for an infinite y). r = |x| is reduced modulo
  |y| * 2**k for k stepping down by p-1 bits (p: mantissa bits) to 0; each step's quotient is below 2**(p-1), so
  trunc(r / yk) is the true quotient or one more, fma(-q, yk, r) is exact (the remainder is representable) and one
  add of yk fixes a quotient one too big. A yk that overflows leaves r as it is (r < yk). 13 steps for float32, 41 for
  float64; half precision goes through float32 (its fmod fits back exactly). NaN for y == 0, an infinite x or a NaN;
  x for an infinite y; the sign is x's."""
  dt = x.dtype.scalar()
  if dt not in _FMOD_FMT: return exact_fmod(x.cast(dtypes.float32), y.cast(dtypes.float32)).cast(x.dtype)
  emax1, esub, p, ut = _FMOD_FMT[dt]
  sign = 1 << (ut.itemsize * 8 - 1)
  def c(v: Any) -> UOp: return x.const_like(v)
  def bits(v: UOp) -> UOp: return v.bitcast(ut)
  ax, ay = (bits(x) & (sign - 1)).bitcast(dt), (bits(y) & (sign - 1)).bitcast(dt)
  r, step = ax, p - 1
  for j in reversed(range(-(-(emax1 + esub) // step))):
    yk, k = ay, j * step
    while k: yk, k = yk * c(2.0 ** min(k, emax1 - 2)), k - min(k, emax1 - 2)  # exact: powers of two, or inf
    q = (r / yk).trunc()
    rn = UOp(Ops.MULACC, dt, (-q, yk, r), "fma")
    rn = (rn < c(0.0)).where(rn + yk, rn)
    r = (yk < c(math.inf)).where(rn, r)
  r = (bits(r) | (bits(x) & sign)).bitcast(dt)
  bad = y.eq(c(0.0)) | ax.eq(c(math.inf)) | x.ne(x) | y.ne(y)
  return bad.where(c(math.nan), r)


pm_exact_fmod = PatternMatcher([
  (UPat(Ops.CMOD, dtype=tuple(dtypes.floats), src=(UPat.var("x"), UPat.var("y"))), exact_fmod),
], name="exact_fmod")


pm_late = PatternMatcher([
  # a ** b (ints) -> multiplications (after index simplification: the symbolic rules would expand the products)
  (UPat(Ops.POW, name="p"), _int_pow),
], name="late_decomp")

pm_decomp = PatternMatcher([
  # x / y, x % y (ints, y may be 0 or -1) -> guarded; x // y (floats) -> trunc(x / y)
  (UPat((Ops.CDIV, Ops.CMOD), name="d"), _safe_div),
  (UPat(Ops.CDIV, dtype=tuple(dtypes.floats), src=(UPat.var("x"), UPat.var("y"))), lambda x, y: (x / y).trunc()),
  # x << y, x >> y -> count & (bits-1) where it may be out of range
  (UPat((Ops.SHL, Ops.SHR), name="s"), _mask_shift),
  # trunc(x) -> x (ints)
  (UPat(Ops.TRUNC, src=(UPat.var("x"),)), lambda x: x if _is_int(x) else None),
  # threefry(x, key) -> 32-bit rounds (no target has it natively)
  (UPat(Ops.THREEFRY, src=(UPat.var("x"), UPat.var("key"))), threefry2x32),
  # mulacc(a, b, c) -> a*b+c; a fused one (arg "fma", made only for a renderer with `fused_mulacc`) stays
  (UPat(Ops.MULACC, src=(UPat.var("a"), UPat.var("b"), UPat.var("c")), name="m"),
   lambda m, a, b, c: None if m.arg == "fma" else a * b + c),
  # bind(var, val) -> var: the value comes in as a kernel argument
  (UPat(Ops.BIND, src=(UPat(Ops.DEFINE_VAR, name="v"), UPat())), lambda v: v),
], name="decomp")


# ***** bfloat16 through float32 *****
# After the expander values may be vectors: every helper works lane-wise on `n` lanes (constants broadcast by VECTORIZE)
def _vc(dt: DType, v: Any, n: int) -> UOp:
  c = UOp.const(dt, v)
  return c if n == 1 else UOp(Ops.VECTORIZE, dt.vec(n), (c,) * n)


def _v(dt: DType, n: int) -> DType: return dt.vec(n) if n > 1 else dt


def _bf16_to_f32(bits: UOp) -> UOp:
  """uint16 bfloat16 bits -> float32 (exact)."""
  n = bits.dtype.count
  return (bits.cast(_v(dtypes.uint32, n)) << _vc(dtypes.uint32, 16, n)).bitcast(_v(dtypes.float32, n))


def _f32_to_bf16(x: UOp) -> UOp:
  """float32 -> uint16 bfloat16 bits, round to nearest even; NaN -> quiet NaN."""
  n, u32 = x.dtype.count, dtypes.uint32
  b = x.bitcast(_v(u32, n))
  rounded = (b + (((b >> _vc(u32, 16, n)) & _vc(u32, 1, n)) + _vc(u32, 0x7fff, n))) >> _vc(u32, 16, n)
  is_nan = x.ne(x)
  return is_nan.where(_vc(u32, 0x7fc0, n), rounded).cast(_v(dtypes.uint16, n))


def _f64_to_f32_odd(x: UOp) -> UOp:
  """float64 -> float32 rounded to odd (truncated toward zero, the last bit set when inexact; NaN as it is): a
  narrower rounding to nearest even after it rounds like one rounding from float64 (float32 keeps 16 more bits than
  bfloat16), where two roundings to nearest could round a value twice across a midpoint."""
  n, u32 = x.dtype.count, dtypes.uint32
  f = x.cast(_v(dtypes.float32, n))
  back = f.cast(_v(dtypes.float64, n))
  inexact = back.ne(x) & x.eq(x)
  away = inexact & ((x < back) ^ (x < _vc(dtypes.float64, 0.0, n)))  # |back| > |x|: step back toward zero
  bits = f.bitcast(_v(u32, n))
  return ((bits - away.cast(_v(u32, n))) | inexact.cast(_v(u32, n))).bitcast(_v(dtypes.float32, n))


def _bf16_const_bits(v: Any) -> int | None:
  """The bfloat16 bits of constant `v` when float32 holds it with 16 zero low bits (a bfloat16 value), else None."""
  if not isinstance(v, (int, float)) or isinstance(v, bool): return None
  b = struct.unpack("<I", struct.pack("<f", float(v)))[0]
  return None if b & 0xFFFF or v != v else b >> 16


def _moved_bits(u: UOp, nu: UOp, bits: dict[UOp, UOp]) -> UOp | None:
  """The uint16 bits of bfloat16 value `u` (rewritten to float32 `nu`) when it only moves bits: a CONST that is a
  bfloat16 value, or a VECTORIZE / WHERE of such moves (`bits`: the loads' and earlier moves' bits, by float32 node);
  None when it computes."""
  n = u.dtype.count
  if u.op is Ops.CONST and (c := _bf16_const_bits(u.arg)) is not None: return UOp.const(_v(dtypes.uint16, n), c)
  if u.op is Ops.VECTORIZE and all(s in bits for s in nu.src):
    return UOp(Ops.VECTORIZE, _v(dtypes.uint16, n), tuple(bits[s] for s in nu.src))
  if u.op is Ops.WHERE and nu.src[1] in bits and nu.src[2] in bits:
    return nu.src[0].where(bits[nu.src[1]], bits[nu.src[2]])
  return None


def bf16_to_float(sink: UOp) -> UOp:
  """Every bfloat16 value computed as float32 and stored as uint16 bits (see the module docstring); vectors of
  bfloat16 (after the expander) lane-wise. A value that only moves bits (a load, a BITCAST to bfloat16, a bfloat16
  constant, a WHERE or VECTORIZE of those: a copy, a pad) is stored or bitcast as those bits, with no float32 round
  trip (which made a NaN's payload 0x7FC0 and cost a pad copy of A, 4096 x 4096 bfloat16 on one thread of the Xeon
  6/207, 14.7 ms against 13.2 as a move: that copy is bound by memory)."""
  subs: dict[UOp, UOp] = {}
  bits: dict[UOp, UOp] = {}  # float32 node of a bfloat16 move -> its uint16 bits
  for u in sink.toposort():
    new_src = tuple(subs.get(s, s) for s in u.src)
    nu = u.replace(src=new_src) if new_src != u.src else u
    dt = nu.dtype
    n = dt.count if not isinstance(dt, PtrDType) else 1
    if isinstance(dt, PtrDType) and dt.base == dtypes.bfloat16:
      nu = nu.replace(dtype=dtypes.uint16.ptr(dt.size, dt.addrspace))
    elif isinstance(dt, PtrDType) and dt.base.scalar() == dtypes.bfloat16:  # a pointer to bf16 vectors (vector I/O)
      nu = nu.replace(dtype=dtypes.uint16.vec(dt.base.count).ptr(dt.size, dt.addrspace))
    elif isinstance(dt, PtrDType): pass
    elif u.op is Ops.LOAD and dt.scalar() == dtypes.bfloat16:
      raw = nu.replace(dtype=_v(dtypes.uint16, n))
      nu = _bf16_to_f32(raw)
      bits[nu] = raw
    elif u.op is Ops.STORE and isinstance(u.src[0].dtype, PtrDType) and u.src[0].dtype.base.scalar() == dtypes.bfloat16:
      val = bits[nu.src[1]] if nu.src[1] in bits else _f32_to_bf16(nu.src[1])  # a move stores its bits as they are
      nu = nu.replace(src=(nu.src[0], val, *nu.src[2:]))
    elif u.op is Ops.CONST and dt.scalar() == dtypes.bfloat16:
      nu = UOp.const(_v(dtypes.float32, n), u.arg)
      if (moved := _moved_bits(u, nu, bits)) is not None: bits[nu] = moved
    elif u.op is Ops.VCONST and dt.scalar() == dtypes.bfloat16:
      nu = UOp(Ops.VCONST, _v(dtypes.float32, n), arg=tuple(float(x) for x in u.arg))
    elif u.op is Ops.CAST and dt.scalar() == dtypes.bfloat16:  # rounding to bf16 precision, kept in float32
      src = nu.src[0]
      f32 = _f64_to_f32_odd(src) if src.dtype.scalar() == dtypes.float64 else src.cast(_v(dtypes.float32, n))
      nu = _bf16_to_f32(_f32_to_bf16(f32))
    elif u.op is Ops.BITCAST and dt.scalar() == dtypes.bfloat16:
      raw = nu.src[0].bitcast(_v(dtypes.uint16, n))
      nu = _bf16_to_f32(raw)
      bits[nu] = raw
    elif u.op is Ops.BITCAST and u.src[0].dtype.scalar() == dtypes.bfloat16:
      nu = (bits[nu.src[0]] if nu.src[0] in bits else _f32_to_bf16(nu.src[0])).bitcast(dt)
    elif u.op in GroupOp.ALU and u.op is not Ops.WHERE and dt.scalar() == dtypes.bfloat16:
      nu = _bf16_to_f32(_f32_to_bf16(nu.replace(dtype=_v(dtypes.float32, n))))  # bf16 arithmetic rounds every result
    elif dt.scalar() == dtypes.bfloat16:  # VECTORIZE, GEP, WHERE, ...: the same node in float32
      nu = nu.replace(dtype=_v(dtypes.float32, n))
      if (moved := _moved_bits(u, nu, bits)) is not None: bits[nu] = moved
    if nu is not u: subs[u] = nu
  return subs.get(sink, sink)
