"""The reference semantics of every ALU op: `exec_alu(op, dtype, operands)`, bit-exact, in pure Python.

This is the definition the constant folder, the PYTHON device and the tests of every renderer agree on. Values are
Python scalars (`bool`, `int` in the dtype's range, `float` holding a value of the dtype); a vector dtype takes tuples
(a scalar operand broadcasts) and applies the op lane by lane. `dtype` is the type of the result.

Integers (two's complement, results wrap to the dtype):
  ADD SUB MUL NEG MULACC wrap; MAX; CMPLT CMPNE CMPEQ -> bool; XOR OR AND.
  CDIV truncates toward zero and CMOD has the sign of the dividend (C's `/` and `%`): `-7 // 2 = -3`, `-7 % 2 = -1`.
  Division by zero is defined: `x CDIV 0 = 0` and `x CMOD 0 = 0` (numpy gives the same); `INT_MIN CDIV -1` wraps to
  INT_MIN. SHL/SHR take the shift count modulo the bit width (`b & (bits-1)`, what x86 does for 32/64-bit shifts, and
  what a renderer must emit to agree); SHR is arithmetic for signed and logical for unsigned types.
  POW: `a ** b` wrapped for b >= 0; for b < 0 the truncated real result (1 for a == 1, +-1 for a == -1, else 0).
  TRUNC is the identity. FDIV, EXP2, LOG2, SIN, SQRT, RECIPROCAL, LDEXP are float-only (a TypeError otherwise).
Floats: every op is computed exactly (or in float64, which is correctly rounded for + - * / sqrt of narrower types)
  and rounded once to the dtype (`round_float`); MULACC rounds after the multiply and after the add (not fused).
  IEEE specials as numpy: MAX propagates NaN (`np.maximum`) and MAX(-0, +0) = +0; comparisons with NaN are False
  except CMPNE; FDIV and RECIPROCAL by +-0 give a signed inf (0/0 NaN); LOG2(0) = -inf, LOG2(<0) = NaN;
  SQRT(<0) = NaN; SIN(+-inf) = NaN; EXP2 overflows to inf; TRUNC keeps the sign of zero; POW follows C's `pow`; CDIV is
  `trunc(a / b)` (the quotient rounded to the dtype first) and CMOD is C's `fmod`. LDEXP(a, b) is a * 2**b for an
  integer-valued b of a's dtype in int32's range, rounded once (overflow to inf, subnormal results kept), NaN for a
  NaN a; only the exp2 decomposition makes it (|b| <= 152), for renderers that list the dtype in `ldexp_ops`
  (computed here for other b as 2**floor(b), `vscalefps`'s rule, which is not part of the contract). NaN payloads
  are not kept (Python floats): a NaN result, and BITCAST of a NaN, is the quiet NaN of its sign.
Bool: ops compute on 0/1 and the result is `!= 0` (ADD is OR, MUL is AND, SUB is XOR, MAX is OR).
CAST: float -> int truncates toward zero (out of range: see `dtype.float_to_int`); int -> float rounds to nearest
  even; anything -> bool is `!= 0` (NaN is True); bool -> number is 0/1; float -> float rounds to nearest even.
BITCAST: reinterprets the bytes (little-endian); the source dtype is inferred from the value when that is
  unambiguous (ints, bools, float32/float64), else pass `src_dtype=`.
THREEFRY: threefry2x32 with 20 rounds (Random123); `x` and `key` are uint64 counters/keys whose low 32 bits are word
  0; the result packs output word 1 in the high half.
"""
from __future__ import annotations

import math
import operator
import struct
from typing import Any, Callable

from tiny_uop.dtype import (DType, PtrDType, bits_to_float, dtypes, float_to_bits, float_to_int, int_to_float,
                            round_float, truncate_int)
from tiny_uop.uop import GroupOp, Ops

__all__ = ["exec_alu", "threefry2x32", "python_alu"]


# ***** integer helpers *****
def _cdiv(a: int, b: int) -> int:
  """C division: truncate toward zero; by zero -> 0."""
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q


def _cmod(a: int, b: int) -> int:
  """C remainder: sign of the dividend; by zero -> 0."""
  if b == 0: return 0
  r = abs(a) % abs(b)
  return -r if a < 0 else r


def _ipow(a: int, b: int) -> int:
  if b >= 0: return a ** b
  if a == 1: return 1
  if a == -1: return 1 if b % 2 == 0 else -1
  return 0


# ***** float helpers (float64 results; the caller rounds to the dtype) *****
_INF, _NAN = math.inf, math.nan


def _fdiv(a: float, b: float) -> float:
  try: return a / b
  except ZeroDivisionError:
    if a != a or a == 0: return _NAN
    return math.copysign(_INF, a) * math.copysign(1.0, b)


def _recip(x: float) -> float:
  try: return 1.0 / x
  except ZeroDivisionError: return math.copysign(_INF, x)


def _ldexp(a: float, b: float) -> float:
  if a != a or b != b: return _NAN
  if math.isinf(b): return a * (_INF if b > 0 else 0.0)  # (0 * 2**inf, inf * 2**-inf: NaN)
  if a == 0 or math.isinf(a): return a
  m, e = math.frexp(a)
  n = e + int(math.floor(b))  # a * 2**floor(b) = m * 2**n, 1/2 <= |m| < 1: beyond float64's exponents, inf or 0
  if n > 1024: return math.copysign(_INF, a)
  return math.ldexp(m, max(n, -1100))


def _exp2(x: float) -> float:
  try: return 2.0 ** x
  except OverflowError: return _INF


def _log2(x: float) -> float:
  if x > 0: return math.log2(x)
  if x == 0: return -_INF
  return _NAN  # negative or NaN


def _sqrt(x: float) -> float: return math.sqrt(x) if x >= 0 else _NAN  # keeps -0.0; NaN -> NaN


def _sin(x: float) -> float: return math.sin(x) if x - x == 0 else _NAN  # inf and NaN -> NaN


def _ftrunc(x: float) -> float:
  if x - x != 0: return x  # inf, NaN
  return math.copysign(float(math.trunc(x)), x)


def _is_odd_int(y: float) -> bool: return math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0


def _fpow(x: float, y: float) -> float:
  """C99 pow: pow(x, +-0) = 1, pow(1, y) = 1 (even for NaN), negative ** non-integer = NaN, overflow = +-inf."""
  try: return math.pow(x, y)
  except OverflowError: return -_INF if x < 0 and _is_odd_int(y) else _INF
  except ValueError:
    if x == 0: return math.copysign(_INF, x) if _is_odd_int(y) else _INF  # 0 ** negative
    return _NAN  # negative ** non-integer


def _fmax(a: float, b: float) -> float:
  if a != a or b != b: return _NAN
  if a != b: return a if a > b else b
  return b if a == 0 and math.copysign(1.0, a) < 0 else a  # IEEE 754-2019 maximum: +0 > -0 (numpy varies by dtype)


def _fcmod(a: float, b: float) -> float:
  try: return math.fmod(a, b)
  except ValueError: return _NAN  # x % 0, inf % y


def _fmulacc(dt: DType) -> Callable:
  def mulacc(a: float, b: float, c: float) -> float: return round_float(a * b, dt) + c
  return mulacc


# ***** threefry2x32 (Random123), 20 rounds *****
_ROT = ((13, 15, 26, 6), (17, 29, 16, 24))
_M32 = 0xffffffff


def threefry2x32(x: int, key: int) -> int:
  """threefry2x32-20 of the counter `x` (uint64: word 0 in the low 32 bits) with `key` (same layout)."""
  x0, x1, k0, k1 = x & _M32, (x >> 32) & _M32, key & _M32, (key >> 32) & _M32
  ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
  x0, x1 = (x0 + k0) & _M32, (x1 + k1) & _M32
  for i in range(5):
    for r in _ROT[i % 2]:
      x0 = (x0 + x1) & _M32
      x1 = (((x1 << r) | (x1 >> (32 - r))) & _M32) ^ x0
    x0 = (x0 + ks[(i + 1) % 3]) & _M32
    x1 = (x1 + ks[(i + 2) % 3] + i + 1) & _M32
  return x1 << 32 | x0


# ***** CAST and BITCAST *****
def _cast(x: Any, dt: DType) -> Any:
  if dt is dtypes.bool: return x != 0  # NaN != 0 is True
  if isinstance(x, float):
    if dtypes.is_int(dt): return float_to_int(x, dt)
    return round_float(x, dt)
  if dtypes.is_int(dt): return truncate_int(int(x), dt)
  return int_to_float(int(x), dt)


_FMT: dict[DType, str] = {dtypes.bool: "?", dtypes.int8: "b", dtypes.uint8: "B", dtypes.int16: "h", dtypes.uint16: "H",
                          dtypes.int32: "i", dtypes.uint32: "I", dtypes.int64: "q", dtypes.uint64: "Q"}
_UINT_FMT = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _to_bits(x: Any, dt: DType) -> int:
  if dtypes.is_float(dt): return float_to_bits(x, dt)
  return int(x) & ((1 << (8 * dt.itemsize)) - 1)


def _from_bits(b: int, dt: DType) -> Any:
  if dtypes.is_float(dt): return bits_to_float(b, dt)
  if dt is dtypes.bool: return b != 0
  return truncate_int(b, dt)


def _infer_src(x: Any, size: int, dt: DType) -> DType:
  if isinstance(x, bool): return dtypes.bool
  if isinstance(x, int): return {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[size]
  if isinstance(x, float) and size in (4, 8): return dtypes.float32 if size == 4 else dtypes.float64
  raise TypeError(f"BITCAST to {dt}: can't tell the source dtype of {x!r} ({size} bytes a lane); pass src_dtype=")


def _bitcast(operand: Any, dtype: DType, src_dtype: DType | None) -> Any:
  lanes = operand if isinstance(operand, tuple) else (operand,)
  if src_dtype is None:
    if dtype.itemsize % len(lanes): raise TypeError(f"BITCAST to {dtype}: {len(lanes)} lanes don't divide the size")
    src_dtype = _infer_src(lanes[0], dtype.itemsize // len(lanes), dtype).vec(len(lanes))
  ss = src_dtype.scalar()
  if ss.itemsize * len(lanes) != dtype.itemsize:
    raise TypeError(f"BITCAST from {src_dtype} ({len(lanes)} lanes, {ss.itemsize * len(lanes)} bytes) to {dtype} "
                    f"({dtype.itemsize} bytes): sizes must be equal")
  raw = b"".join(struct.pack("<" + _UINT_FMT[ss.itemsize], _to_bits(v, ss)) for v in lanes)
  ds = dtype.scalar()
  out = tuple(_from_bits(v, ds) for v in struct.unpack(f"<{dtype.count}{_UINT_FMT[ds.itemsize]}", raw))
  return out if dtype.count > 1 else out[0]


# ***** the per-dtype tables *****
def _wrap_fn(dt: DType) -> Callable[[int], int]:
  """A fast wrap to `dt`: values already in range (the common case) pass with one chained comparison."""
  bits, lo, hi = 8 * dt.itemsize, int(dtypes.min(dt)), int(dtypes.max(dt))
  mask, off = (1 << bits) - 1, 0 if dtypes.is_unsigned(dt) else 1 << (bits - 1)

  def wrap(x: int) -> int: return x if lo <= x <= hi else ((x + off) & mask) - off
  return wrap


def _int_table(dt: DType) -> dict[Ops, Callable]:
  # the hot ops inline the wrap (one call instead of two): this table is the constant folder's inner loop
  w, bits = _wrap_fn(dt), 8 * dt.itemsize
  lo, hi, sh = int(dtypes.min(dt)), int(dtypes.max(dt)), bits - 1
  mask, off = (1 << bits) - 1, 0 if dtypes.is_unsigned(dt) else 1 << (bits - 1)

  def add(a: int, b: int) -> int: return x if lo <= (x := a + b) <= hi else ((x + off) & mask) - off
  def sub(a: int, b: int) -> int: return x if lo <= (x := a - b) <= hi else ((x + off) & mask) - off
  def mul(a: int, b: int) -> int: return x if lo <= (x := a * b) <= hi else ((x + off) & mask) - off
  def neg(a: int) -> int: return x if lo <= (x := -a) <= hi else ((x + off) & mask) - off
  def shl(a: int, b: int) -> int: return x if lo <= (x := a << (b & sh)) <= hi else ((x + off) & mask) - off
  def cdiv(a: int, b: int) -> int:
    if b == 0: return 0
    x = abs(a) // abs(b) if (a < 0) == (b < 0) else -(abs(a) // abs(b))
    return x if x <= hi else ((x + off) & mask) - off  # only INT_MIN // -1 overflows
  def cmod(a: int, b: int) -> int:
    if b == 0: return 0
    return -(abs(a) % abs(b)) if a < 0 else abs(a) % abs(b)
  return {
    Ops.ADD: add, Ops.SUB: sub, Ops.MUL: mul, Ops.NEG: neg, Ops.MAX: max,
    Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq,
    Ops.XOR: lambda a, b: w(a ^ b), Ops.OR: lambda a, b: w(a | b), Ops.AND: lambda a, b: w(a & b),
    Ops.SHL: shl, Ops.SHR: lambda a, b: w(a >> (b & sh)), Ops.CDIV: cdiv, Ops.CMOD: cmod,
    Ops.POW: (lambda a, b: w(pow(a, b, 1 << bits)) if b >= 0 else w(_ipow(a, b))),
    Ops.TRUNC: lambda a: a, Ops.MULACC: lambda a, b, c: w(a * b + c), Ops.WHERE: lambda c, a, b: a if c else b,
    Ops.CAST: lambda x: _cast(x, dt),
    **({Ops.THREEFRY: threefry2x32} if dt is dtypes.uint64 else {})}


def _bool_table() -> dict[Ops, Callable]:
  def b2(fn: Callable) -> Callable: return lambda a, b: fn(int(a), int(b)) != 0
  return {
    Ops.ADD: b2(operator.add), Ops.SUB: b2(operator.sub), Ops.MUL: b2(operator.mul), Ops.NEG: lambda a: bool(a),
    Ops.MAX: lambda a, b: bool(a or b), Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq,
    Ops.XOR: b2(operator.xor), Ops.OR: b2(operator.or_), Ops.AND: b2(operator.and_), Ops.SHL: b2(lambda a, b: a << b),
    Ops.SHR: b2(lambda a, b: a >> b), Ops.CDIV: b2(_cdiv), Ops.CMOD: b2(_cmod), Ops.POW: b2(_ipow),
    Ops.TRUNC: lambda a: bool(a), Ops.MULACC: lambda a, b, c: bool(int(a) * int(b) + int(c)),
    Ops.WHERE: lambda c, a, b: a if c else b, Ops.CAST: lambda x: _cast(x, dtypes.bool)}


def _float_table(dt: DType) -> dict[Ops, Callable]:
  def r1(fn: Callable) -> Callable:
    if dt is dtypes.float64: return lambda a: float(fn(a))
    return lambda a: round_float(fn(a), dt)

  def r2(fn: Callable) -> Callable:
    if dt is dtypes.float64: return lambda a, b: float(fn(a, b))
    return lambda a, b: round_float(fn(a, b), dt)
  mulacc = _fmulacc(dt)
  return {
    Ops.ADD: r2(operator.add), Ops.SUB: r2(operator.sub), Ops.MUL: r2(operator.mul), Ops.NEG: operator.neg,
    Ops.MAX: _fmax, Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq,
    Ops.FDIV: r2(_fdiv), Ops.CDIV: lambda a, b: _ftrunc(round_float(_fdiv(a, b), dt)),
    Ops.CMOD: r2(_fcmod), Ops.POW: r2(_fpow), Ops.LDEXP: r2(_ldexp),
    Ops.EXP2: r1(_exp2), Ops.LOG2: r1(_log2), Ops.SIN: r1(_sin), Ops.SQRT: r1(_sqrt), Ops.RECIPROCAL: r1(_recip),
    Ops.TRUNC: _ftrunc, Ops.MULACC: (lambda a, b, c: round_float(mulacc(a, b, c), dt)),
    Ops.WHERE: lambda c, a, b: a if c else b, Ops.CAST: lambda x: _cast(x, dt)}


python_alu: dict[DType, dict[Ops, Callable]] = {
  dtypes.bool: _bool_table(), **{dt: _int_table(dt) for dt in dtypes.ints},
  **{dt: _float_table(dt) for dt in dtypes.floats}}
"""Per scalar dtype, per op: the Python function computing it (operands in, result of that dtype out)."""


def _undefined(op: Ops, dtype: DType) -> TypeError:
  valid = sorted(o.name for o in python_alu[dtype]) if dtype in python_alu else []
  if op not in GroupOp.ALU and op not in (Ops.CAST, Ops.BITCAST):
    return TypeError(f"exec_alu: {op} is not an ALU op; valid ops: ALU ops, CAST and BITCAST")
  if not valid: return TypeError(f"exec_alu: no values of dtype {dtype!r}; valid: bool, int, float (or vectors)")
  return TypeError(f"exec_alu: {op} is not defined for {dtype!r}; defined there: {', '.join(valid)}")


def exec_alu(op: Ops, dtype: DType, operands: tuple | list, src_dtype: DType | None = None) -> Any:
  """The result of ALU op `op` with result type `dtype` on `operands` (see the module docstring for the semantics).

  `src_dtype` is only read by BITCAST (the operand's dtype, when its value doesn't tell).

  >>> exec_alu(Ops.ADD, dtypes.int8, (127, 1))
  -128
  >>> exec_alu(Ops.CDIV, dtypes.int32, (-7, 2))
  -3
  """
  # hot path (the constant folder): a scalar dtype and a table function
  try: fn = python_alu[dtype][op]  # measured: faster than two .get()s or a (dtype, op) key
  except KeyError: fn = None
  if fn is not None:
    try: return fn(*operands)
    except TypeError:
      if not any(isinstance(x, tuple) for x in operands): raise
  if op is Ops.BITCAST:
    if len(operands) != 1: raise TypeError(f"exec_alu: BITCAST takes one operand, got {len(operands)}")
    return _bitcast(operands[0], dtype, src_dtype)
  if isinstance(dtype, PtrDType): raise _undefined(op, dtype)
  count = max([len(x) for x in operands if isinstance(x, tuple)], default=dtype.count)
  if count > 1 or dtype.count > 1:
    for x in operands:
      if isinstance(x, tuple) and len(x) != count:
        widths = [len(x) for x in operands if isinstance(x, tuple)]
        raise ValueError(f"exec_alu: {op} on vectors of different widths {widths}")
    sd = dtype.scalar()
    if (stbl := python_alu.get(sd)) is None or (sfn := stbl.get(op)) is None: raise _undefined(op, sd)
    return tuple(sfn(*[x[i] if isinstance(x, tuple) else x for x in operands]) for i in range(count))
  raise _undefined(op, dtype)
