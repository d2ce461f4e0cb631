"""The RDNA3 ISA as data and pure functions, below the interpreter (`rdna3.Emulator`) and the batched engine
(`batch*.py`), which both read it: register and operand codes, the lane functions of the ALU (float conversions,
fused multiply-adds, the opcode tables `opcode -> (mnemonic, lane function, ...)`), compares, atomics, and the names
of the memory and program-control opcodes. No wave state and no decoding here (`emu/state.py`).

Opcode numbers and semantics: AMD's "RDNA3 Instruction Set Architecture" reference guide (see `rdna3.py`), the GFX9
VOP3-only ops at the end: the "AMD Instinct MI300 (CDNA3) ISA" guide (see `cdna3.py`).
"""
from __future__ import annotations

import functools
import math
import operator
from fractions import Fraction
import struct
from typing import Any, Callable

MASK32, MASK64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
WAVE = 32
VCC_LO, VCC_HI, NULL, M0, EXEC_LO, EXEC_HI, SCC_SRC, LITERAL = 106, 107, 124, 125, 126, 127, 253, 255
DPP8, DPP8_FI, DPP16 = 233, 234, 250  # src0 codes that announce a DPP dword
# inline float constants (operand codes 240..248) as float32 bits
INLINE_F32 = {240: 0x3F000000, 241: 0xBF000000, 242: 0x3F800000, 243: 0xBF800000, 244: 0x40000000, 245: 0xC0000000,
              246: 0x40800000, 247: 0xC0800000, 248: 0x3E22F983}


class UnsupportedInstruction(NotImplementedError):
  """The emulator met an encoding/opcode it does not implement."""


def f32(bits: int) -> float: return struct.unpack("<f", struct.pack("<I", bits & MASK32))[0]


def bits32(x: float) -> int:
  """float -> float32 bits (round to nearest even; overflow to inf)."""
  try: return struct.unpack("<I", struct.pack("<f", x))[0]
  except OverflowError: return 0x7F800000 if x > 0 else 0xFF800000


def sext(v: int, bits: int) -> int: return v - (1 << bits) if v & (1 << (bits - 1)) else v
def i32(v: int) -> int: return sext(v & MASK32, 32)


def _fmin(a: float, b: float) -> float:
  """V_MIN_*: a NaN operand yields the other one; -0 counts as less than +0."""
  if a != a: return b
  if b != b or a < b: return a
  return b if b < a or math.copysign(1.0, b) < 0 else a


def _fmax(a: float, b: float) -> float:
  """V_MAX_*: a NaN operand yields the other one; +0 counts as greater than -0."""
  if a != a: return b
  if b != b or a > b: return a
  return b if b > a or math.copysign(1.0, b) > 0 else a


def _cvt_i32(x: float) -> int:
  """V_CVT_I32_F32/F64 (f32_to_i32, f64_to_i32): truncate toward zero; out of range, infinities included, saturates
  to INT_MIN/INT_MAX; NaN gives 0. The clamp comes before int(), which has no value for an infinity."""
  if math.isnan(x): return 0
  return (-(1 << 31) if x <= -(1 << 31) else (1 << 31) - 1 if x >= (1 << 31) - 1 else int(x)) & MASK32


def _cvt_u32(x: float) -> int:
  """V_CVT_U32_F32/F64 (f32_to_u32, f64_to_u32): truncate; below 0 (-inf too) gives 0, above 2**32-1 (+inf too)
  saturates; NaN gives 0."""
  if math.isnan(x) or x <= 0: return 0
  return MASK32 if x >= MASK32 else int(x)


def _rcp(x: float) -> float: return math.copysign(math.inf, x) if x == 0 else 1.0 / x
def _sqrt(x: float) -> float: return math.nan if x < 0 or math.isnan(x) else math.sqrt(x)
def _log2(x: float) -> float: return -math.inf if x == 0 else math.nan if x < 0 or math.isnan(x) else math.log2(x)


def _exp2(x: float) -> float:
  try: return math.pow(2.0, x)
  except OverflowError: return math.inf


def _ldexp(x: float, e: int) -> float:
  try: return math.ldexp(x, max(-2000, min(2000, e)))
  except OverflowError: return math.copysign(math.inf, x)


def _div_fixup(q: int, den: int, num: int) -> int:
  """V_DIV_FIXUP_F32: the final quotient num/den with IEEE special cases (NaN, inf, 0); the approximation `q` from
  the V_DIV_SCALE/V_RCP/V_FMA/V_DIV_FMAS sequence is the correctly rounded quotient, which is computed directly."""
  n, d = f32(num), f32(den)
  if math.isnan(n) or math.isnan(d): return 0x7FC00000
  if d == 0: return 0x7FC00000 if n == 0 else (0x7F800000 | ((num ^ den) & 0x80000000))
  if math.isinf(d): return 0x7FC00000 if math.isinf(n) else (num ^ den) & 0x80000000
  return bits32(n / d)


def _i24(a: int) -> int: return sext(a & 0xFFFFFF, 24)


def _bfe_i32(a: int, off: int, width: int) -> int:
  return (sext((a >> off) & ((1 << width) - 1), width) if width else 0) & MASK32


def _f16(bits: int) -> float: return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]


def _f16_bits(x: float) -> int:
  """float -> half bits, round to nearest even (overflow to inf)."""
  try: return struct.unpack("<H", struct.pack("<e", x))[0]
  except OverflowError: return 0x7C00 | (0x8000 if x < 0 else 0)


def f64(bits: int) -> float: return struct.unpack("<d", struct.pack("<Q", bits & MASK64))[0]
def bits64(x: float) -> int: return struct.unpack("<Q", struct.pack("<d", x))[0]


# inline float constants for 64-bit float operands (operand codes 240..248)
INLINE_F64 = {k: bits64(f32(v)) if k != 248 else 0x3FC45F306DC9C882 for k, v in INLINE_F32.items()}


def _fract(x: float, below_one: int) -> float:
  """V_FRACT: x - floor(x), never rounding up to 1.0 (the largest value below 1: `below_one` bits); inf -> NaN."""
  if math.isinf(x) or math.isnan(x): return math.nan
  r = x - math.floor(x)
  top = f32(below_one) if below_one == 0x3F7FFFFF else f64(below_one)
  return min(r, top)


def _frexp_exp(x: float) -> int: return 0 if math.isinf(x) or math.isnan(x) else math.frexp(x)[1] & MASK32


def _fd(fn: Callable[..., float]) -> Callable[..., int]:
  """A float64 op on 64-bit patterns."""
  def op(*a: int) -> int:
    try: return bits64(fn(*map(f64, a)))
    except OverflowError: return 0x7FF0000000000000
    except (ValueError, ZeroDivisionError): return 0x7FF8000000000000
  return op


def _div_fixup64(den: int, num: int) -> int:
  n, d = f64(num), f64(den)
  if math.isnan(n) or math.isnan(d): return 0x7FF8000000000000
  if d == 0: return 0x7FF8000000000000 if n == 0 else (0x7FF0000000000000 | ((num ^ den) & (1 << 63)))
  if math.isinf(d): return 0x7FF8000000000000 if math.isinf(n) else (num ^ den) & (1 << 63)
  return bits64(n / d)


def vec_f32(fn: Callable[..., float], *cols: list[int]) -> list[int]:
  """Apply a float op lane-wise to columns of float32 bit patterns, converting whole columns at once (the hot path
  of the emulator); falls back to one lane at a time when a result overflows float32."""
  si, sf = _structs(len(cols[0]))
  res = list(map(fn, *(sf.unpack(si.pack(*c)) for c in cols)))
  try: return list(si.unpack(sf.pack(*res)))
  except OverflowError: return [bits32(r) for r in res]


@functools.lru_cache(maxsize=8)
def _dwords(n: int) -> struct.Struct: return struct.Struct(f"<{n}I")


_SUBDWORD = {(8, False): struct.Struct("<B"), (8, True): struct.Struct("<b"), (16, False): struct.Struct("<H"),
             (16, True): struct.Struct("<h")}  # (bits, signed) -> one element


@functools.lru_cache(maxsize=64)
def _structs(n: int) -> tuple[struct.Struct, struct.Struct]: return struct.Struct(f"<{n}I"), struct.Struct(f"<{n}f")


def _mul_dx9(a: float, b: float) -> float:
  """V_MUL_DX9_ZERO_F32: a zero operand gives +0 whatever the other one is (inf, NaN), else a * b."""
  return 0.0 if a == 0 or b == 0 else a * b


def _fma(a: float, b: float, c: float) -> float:
  """a*b+c for float32/half/mixed operands, as a double rounded to odd: rounding it once more to float32 or half
  gives the correctly rounded fused multiply-add (the product is exact in a double; TwoSum recovers the sum's
  rounding error, and a 53-bit round-to-odd result rounds correctly to any format of 51 bits or fewer)."""
  p = a * b
  s = p + c
  if s - s != 0: return s  # inf / nan
  bb = s - p
  e = (p - (s - bb)) + (c - bb)
  if e == 0 or int(math.frexp(s)[0] * 9007199254740992.0) & 1: return s
  return math.nextafter(s, math.inf if e > 0 else -math.inf)


def _fma64(a: float, b: float, c: float) -> float:
  """The correctly rounded double fused multiply-add (exact rational arithmetic; IEEE special cases and the sign of
  an exact zero as the standard has them)."""
  if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)): return a * b + c
  exact = Fraction(a) * Fraction(b) + Fraction(c)
  if exact == 0: return -0.0 if math.copysign(1, a * b) < 0 and math.copysign(1, c) < 0 else 0.0
  try: return float(exact)
  except OverflowError: return math.copysign(math.inf, exact)


def _ff(fn: Callable[..., float]) -> Callable[..., int]:
  """A float32 op on bit patterns: decode the operands, compute in double, round to float32."""
  return lambda *a: bits32(fn(*map(f32, a)))


# ***** opcode tables (RDNA3 ISA guide, "Instructions" chapter) *****
# VOP1: op -> fn(src) -> bits
def _cvt_f32_ubyte(n: int) -> Callable[[int], int]:
  """V_CVT_F32_UBYTEn: byte n of the source as a float32."""
  def fn(a: int) -> int: return bits32(float((a >> (8 * n)) & 0xFF))
  return fn


def _lshl_add(n: int) -> Callable[[int, int], int]:
  """S_LSHLn_ADD_U32: (a << n) + b (the caller masks to 32 bits and sets SCC)."""
  def fn(a: int, b: int) -> int: return (a << n) + b
  return fn


VOP1: dict[int, tuple[str, Callable[[int], int]]] = {
  1: ("v_mov_b32", lambda a: a),
  5: ("v_cvt_f32_i32", lambda a: bits32(float(i32(a)))), 6: ("v_cvt_f32_u32", lambda a: bits32(float(a))),
  7: ("v_cvt_u32_f32", lambda a: _cvt_u32(f32(a))), 8: ("v_cvt_i32_f32", lambda a: _cvt_i32(f32(a))),
  33: ("v_trunc_f32", _ff(lambda x: x if math.isinf(x) or math.isnan(x) else float(math.trunc(x)))),
  34: ("v_ceil_f32", _ff(lambda x: x if math.isinf(x) or math.isnan(x) else float(math.ceil(x)))),
  36: ("v_floor_f32", _ff(lambda x: x if math.isinf(x) or math.isnan(x) else float(math.floor(x)))),
  37: ("v_exp_f32", _ff(_exp2)), 39: ("v_log_f32", _ff(_log2)),
  42: ("v_rcp_f32", _ff(_rcp)), 43: ("v_rcp_iflag_f32", _ff(_rcp)),
  51: ("v_sqrt_f32", _ff(_sqrt)),
  **{17 + n: (f"v_cvt_f32_ubyte{n}", _cvt_f32_ubyte(n)) for n in range(4)},
  55: ("v_not_b32", lambda a: ~a & MASK32), 56: ("v_bfrev_b32", lambda a: int(f"{a:032b}"[::-1], 2)),
  35: ("v_rndne_f32", _ff(lambda x: _round_even(x))), 32: ("v_fract_f32", lambda a: bits32(_fract(f32(a), 0x3F7FFFFF))),
  46: ("v_rsq_f32", _ff(lambda x: _rsq(x))),
  53: ("v_sin_f32", _ff(lambda x: _sin_rev(x))), 54: ("v_cos_f32", _ff(lambda x: _cos_rev(x))),
  64: ("v_frexp_mant_f32", _ff(lambda x: x if math.isinf(x) or math.isnan(x) else math.frexp(x)[0])),
  63: ("v_frexp_exp_i32_f32", lambda a: _frexp_exp(f32(a))),
  57: ("v_clz_i32_u32", lambda a: MASK32 if a == 0 else 32 - a.bit_length()),
  58: ("v_ctz_i32_b32", lambda a: MASK32 if a == 0 else (a & -a).bit_length() - 1),
  # v_cls_i32 (RDNA3 ISA): position, from the MSB, of the first bit unlike the sign bit; -1 for 0 and -1. LLVM uses
  # it to convert int64 to float
  59: ("v_cls_i32", lambda a: MASK32 if a in (0, MASK32) else 32 - (a if a < 0x80000000 else ~a & MASK32).bit_length()),
  13: ("v_cvt_floor_i32_f32", lambda a: _cvt_i32(_whole(math.floor)(f32(a)))),
  12: ("v_cvt_nearest_i32_f32", lambda a: _cvt_i32(_whole(math.floor)(f32(a) + 0.5))),
}
# VOP2: op -> (name, fn(src0, src1) -> bits); v_cndmask/v_fmac/carry ops are handled in execute
VOP2: dict[int, tuple[str, Callable[[int, int], int]]] = {
  3: ("v_add_f32", _ff(lambda a, b: a + b)), 4: ("v_sub_f32", _ff(lambda a, b: a - b)),
  7: ("v_mul_dx9_zero_f32", _ff(lambda a, b: _mul_dx9(a, b))),
  5: ("v_subrev_f32", _ff(lambda a, b: b - a)), 8: ("v_mul_f32", _ff(lambda a, b: a * b)),
  9: ("v_mul_i32_i24", lambda a, b: (sext(a & 0xFFFFFF, 24) * sext(b & 0xFFFFFF, 24)) & MASK32),
  10: ("v_mul_hi_i32_i24", lambda a, b: ((sext(a & 0xFFFFFF, 24) * sext(b & 0xFFFFFF, 24)) >> 32) & MASK32),
  12: ("v_mul_hi_u32_u24", lambda a, b: ((a & 0xFFFFFF) * (b & 0xFFFFFF)) >> 32),
  11: ("v_mul_u32_u24", lambda a, b: ((a & 0xFFFFFF) * (b & 0xFFFFFF)) & MASK32),
  15: ("v_min_f32", _ff(_fmin)), 16: ("v_max_f32", _ff(_fmax)),
  17: ("v_min_i32", lambda a, b: min(i32(a), i32(b)) & MASK32),
  18: ("v_max_i32", lambda a, b: max(i32(a), i32(b)) & MASK32),
  19: ("v_min_u32", min), 20: ("v_max_u32", max),
  24: ("v_lshlrev_b32", lambda a, b: (b << (a & 31)) & MASK32), 25: ("v_lshrrev_b32", lambda a, b: b >> (a & 31)),
  26: ("v_ashrrev_i32", lambda a, b: (i32(b) >> (a & 31)) & MASK32),
  27: ("v_and_b32", lambda a, b: a & b), 28: ("v_or_b32", lambda a, b: a | b), 29: ("v_xor_b32", lambda a, b: a ^ b),
  37: ("v_add_nc_u32", lambda a, b: (a + b) & MASK32), 38: ("v_sub_nc_u32", lambda a, b: (a - b) & MASK32),
  39: ("v_subrev_nc_u32", lambda a, b: (b - a) & MASK32),
}
# VOP1 ops executed by special cases in Emulator.vop1 (e32 only): their names, for the decoder
VOP1_SPECIAL = {2: "v_readfirstlane_b32", 10: "v_cvt_f16_f32", 11: "v_cvt_f32_f16", 15: "v_cvt_f32_f64",
                16: "v_cvt_f64_f32", 28: "v_mov_b16", 106: "v_cvt_i32_i16", 107: "v_cvt_u32_u16"}
VOP2_FLOAT = {3: operator.add, 4: operator.sub, 5: lambda a, b: b - a, 8: operator.mul,
              15: _fmin, 16: _fmax, 7: _mul_dx9}  # VOP2 float ops by column (vec_f32)
VOPD_FLOAT = {3: 8, 4: 3, 5: 4, 6: 5, 10: 16, 11: 15, 7: 7}  # VOPD op -> VOP2 op, for the float ones
VOP2_CNDMASK, VOP2_FMAC, VOP2_FMAMK, VOP2_FMAAK, VOP2_ADD_CO_CI = 1, 43, 44, 45, 32
VOP2_SPECIAL = {1: "v_cndmask_b32", 43: "v_fmac_f32", 44: "v_fmamk_f32", 45: "v_fmaak_f32", 32: "v_add_co_ci_u32",
                33: "v_sub_co_ci_u32", 34: "v_subrev_co_ci_u32", 54: "v_fmac_f16", 55: "v_fmamk_f16", 56: "v_fmaak_f16",
                47: "v_cvt_pk_rtz_f16_f32"}
# VOP3-only: op -> (name, fn(a, b, c) -> bits)
VOP3: dict[int, tuple[str, Callable[[int, int, int], int]]] = {
  0x20A: ("v_mad_i32_i24", lambda a, b, c: (_i24(a) * _i24(b) + c) & MASK32),
  0x20B: ("v_mad_u32_u24", lambda a, b, c: ((a & 0xFFFFFF) * (b & 0xFFFFFF) + c) & MASK32),
  0x219: ("v_min3_f32", _ff(lambda a, b, c: _fmin(_fmin(a, b), c))),
  0x21A: ("v_min3_i32", lambda a, b, c: min(i32(a), i32(b), i32(c)) & MASK32), 0x21B: ("v_min3_u32", min),
  0x21C: ("v_max3_f32", _ff(lambda a, b, c: _fmax(_fmax(a, b), c))),
  0x21D: ("v_max3_i32", lambda a, b, c: max(i32(a), i32(b), i32(c)) & MASK32), 0x21E: ("v_max3_u32", max),
  0x220: ("v_med3_i32", lambda a, b, c: sorted((i32(a), i32(b), i32(c)))[1] & MASK32),
  0x221: ("v_med3_u32", lambda a, b, c: sorted((a, b, c))[1]),
  0x210: ("v_bfe_u32", lambda a, b, c: (a >> (b & 31)) & ((1 << (c & 31)) - 1)),
  0x211: ("v_bfe_i32", lambda a, b, c: _bfe_i32(a, b & 31, c & 31)),
  0x212: ("v_bfi_b32", lambda a, b, c: (a & b) | (~a & c & MASK32)),
  0x213: ("v_fma_f32", _ff(_fma)),
  0x246: ("v_lshl_add_u32", lambda a, b, c: ((a << (b & 31)) + c) & MASK32),
  0x247: ("v_add_lshl_u32", lambda a, b, c: ((a + b) << (c & 31)) & MASK32),
  0x255: ("v_add3_u32", lambda a, b, c: (a + b + c) & MASK32),
  0x256: ("v_lshl_or_b32", lambda a, b, c: ((a << (b & 31)) & MASK32) | c),
  0x257: ("v_and_or_b32", lambda a, b, c: (a & b) | c), 0x258: ("v_or3_b32", lambda a, b, c: a | b | c),
  0x227: ("v_div_fixup_f32", lambda a, b, c: _div_fixup(a, b, c)),
  0x31C: ("v_ldexp_f32", lambda a, b, c: bits32(_ldexp(f32(a), i32(b)))),
  0x216: ("v_alignbit_b32", lambda a, b, c: (((a << 32) | b) >> (c & 31)) & MASK32),
  0x245: ("v_xad_u32", lambda a, b, c: ((a ^ b) + c) & MASK32),
  0x32E: ("v_mul_hi_i32", lambda a, b, c: ((i32(a) * i32(b)) >> 32) & MASK32),
  0x32C: ("v_mul_lo_u32", lambda a, b, c: (a * b) & MASK32), 0x32D: ("v_mul_hi_u32", lambda a, b, c: (a * b) >> 32),
}
VOP3_ADD_CO_U32, VOP3_SUB_CO_U32, VOP3_MAD_U64_U32, VOP3_LSHLREV_B64 = 0x300, 0x301, 0x2FE, 0x33C
VOP3_MAD_I64_I32 = 0x2FF  # v_mad_i64_i32 (VOP3SD): the signed twin of v_mad_u64_u32
# float64 VOP3 ops: op -> (name, fn on 64-bit patterns); ldexp takes an int32 second operand
VOP3_F64: dict[int, tuple[str, Callable[..., int]]] = {
  0x214: ("v_fma_f64", _fd(_fma64)), 0x327: ("v_add_f64", _fd(lambda a, b: a + b)),
  0x328: ("v_mul_f64", _fd(lambda a, b: a * b)), 0x329: ("v_min_f64", _fd(_fmin)), 0x32A: ("v_max_f64", _fd(_fmax)),
  0x228: ("v_div_fixup_f64", lambda q, d, n: _div_fixup64(d, n)),
}
VOP1_F64 = {  # op -> (name, source is f64, destination is f64, fn)
  3: ("v_cvt_i32_f64", True, False, lambda x: _cvt_i32(f64(x))),
  4: ("v_cvt_f64_i32", False, True, lambda a: bits64(i32(a))),
  21: ("v_cvt_u32_f64", True, False, lambda x: _cvt_u32(f64(x))),
  22: ("v_cvt_f64_u32", False, True, lambda a: bits64(a)),
  23: ("v_trunc_f64", True, True, _fd(lambda x: x if math.isinf(x) or math.isnan(x) else float(math.trunc(x)))),
  24: ("v_ceil_f64", True, True, _fd(lambda x: x if math.isinf(x) or math.isnan(x) else float(math.ceil(x)))),
  26: ("v_floor_f64", True, True, _fd(lambda x: x if math.isinf(x) or math.isnan(x) else float(math.floor(x)))),
  47: ("v_rcp_f64", True, True, _fd(_rcp)), 52: ("v_sqrt_f64", True, True, _fd(_sqrt)),
  49: ("v_rsq_f64", True, True, _fd(lambda x: _rsq(x))), 25: ("v_rndne_f64", True, True, _fd(lambda x: _round_even(x))),
  62: ("v_fract_f64", True, True, _fd(lambda x: _fract(x, 0x3FEFFFFFFFFFFFFF))),
  61: ("v_frexp_mant_f64", True, True, _fd(lambda x: x if math.isinf(x) or math.isnan(x) else math.frexp(x)[0])),
  60: ("v_frexp_exp_i32_f64", True, False, lambda a: _frexp_exp(f64(a))),
}
def _h(fn: Callable[..., float]) -> Callable[..., int]:
  """A float16 op on 16-bit patterns (computed in double, rounded once to half); `.raw` is the float op, for
  vec_f16."""
  op: Any = lambda *a: _f16_bits(fn(*map(_f16, a)))
  op.raw = fn
  return op


def vec_f16(fn: Callable[..., int], *cols: list[int]) -> list[int]:
  """Apply a 16-bit op lane-wise to columns of 16-bit patterns: an _h float op converts whole columns at once (a
  result beyond the half range falls back to one lane at a time), any other op maps lane by lane."""
  raw = getattr(fn, "raw", None)
  if raw is None: return list(map(fn, *cols))
  n = len(cols[0])
  sh, se = struct.Struct(f"<{n}H"), struct.Struct(f"<{n}e")
  res = list(map(raw, *(se.unpack(sh.pack(*c)) for c in cols)))
  try: return list(sh.unpack(se.pack(*res)))
  except (OverflowError, struct.error): return [_f16_bits(r) for r in res]


def _s16(v: int) -> int: return sext(v & 0xFFFF, 16)


# 16-bit VOP3 ops (gfx11 true16: halves chosen by opsel): op -> (name, operands, is float, fn on 16-bit patterns)
VOP3_16: dict[int, tuple[str, int, bool, Callable[..., int]]] = {
  0x132: ("v_add_f16", 2, True, _h(lambda a, b: a + b)), 0x133: ("v_sub_f16", 2, True, _h(lambda a, b: a - b)),
  0x134: ("v_subrev_f16", 2, True, _h(lambda a, b: b - a)), 0x135: ("v_mul_f16", 2, True, _h(lambda a, b: a * b)),
  0x303: ("v_add_nc_u16", 2, False, lambda a, b: (a + b) & 0xFFFF),
  0x304: ("v_sub_nc_u16", 2, False, lambda a, b: (a - b) & 0xFFFF),
  0x305: ("v_mul_lo_u16", 2, False, lambda a, b: (a * b) & 0xFFFF),
  0x338: ("v_lshlrev_b16", 2, False, lambda a, b: (b << (a & 15)) & 0xFFFF),
  0x339: ("v_lshrrev_b16", 2, False, lambda a, b: b >> (a & 15)),
  0x33A: ("v_ashrrev_i16", 2, False, lambda a, b: (_s16(b) >> (a & 15)) & 0xFFFF),
  0x362: ("v_and_b16", 2, False, lambda a, b: a & b), 0x363: ("v_or_b16", 2, False, lambda a, b: a | b),
  0x364: ("v_xor_b16", 2, False, lambda a, b: a ^ b),
  0x241: ("v_mad_u16", 3, False, lambda a, b, c: (a * b + c) & 0xFFFF),
  0x24A: ("v_min3_i16", 3, False, lambda a, b, c: min(_s16(a), _s16(b), _s16(c)) & 0xFFFF),
  0x24B: ("v_min3_u16", 3, False, lambda a, b, c: min(a, b, c)),
  0x24D: ("v_max3_i16", 3, False, lambda a, b, c: max(_s16(a), _s16(b), _s16(c)) & 0xFFFF),
  0x24E: ("v_max3_u16", 3, False, lambda a, b, c: max(a, b, c)),
}


def _round_even(x: float) -> float: return x if math.isinf(x) or math.isnan(x) else float(round(x))
def _whole(fn: Callable[[float], float]) -> Callable[[float], float]:
  return lambda x: x if math.isinf(x) or math.isnan(x) else float(fn(x))


def _cvt_int16(x: float, signed: bool) -> int:
  """half -> (u)int16: truncate, saturate (infinities too: clamped before int()), NaN -> 0."""
  if math.isnan(x): return 0
  lo, hi = (-(1 << 15), (1 << 15) - 1) if signed else (0, 0xFFFF)
  return (lo if x <= lo else hi if x >= hi else int(x)) & 0xFFFF


def _sin_rev(x: float) -> float: return math.nan if math.isinf(x) or math.isnan(x) else math.sin(2 * math.pi * x)
def _cos_rev(x: float) -> float: return math.nan if math.isinf(x) or math.isnan(x) else math.cos(2 * math.pi * x)
def _rsq(x: float) -> float: return _rcp(_sqrt(x)) if x != 0 else math.copysign(math.inf, x)
def _med3(a: float, b: float, c: float) -> float: return _fmax(_fmin(a, b), _fmin(_fmax(a, b), c))


def _div_fixup16(den: int, num: int) -> int:
  """V_DIV_FIXUP_F16: the correctly rounded half quotient num/den with the IEEE special cases (see _div_fixup)."""
  n, d = _f16(num), _f16(den)
  if math.isnan(n) or math.isnan(d): return 0x7E00
  if d == 0: return 0x7E00 if n == 0 else (0x7C00 | ((num ^ den) & 0x8000))
  if math.isinf(d): return 0x7E00 if math.isinf(n) else (num ^ den) & 0x8000
  return _f16_bits(n / d)


def _f16_bits_rtz(x: float) -> int:
  """float -> half bits rounding toward zero (V_CVT_PK_RTZ_F16_F32): a finite value never becomes inf."""
  if math.isnan(x): return 0x7E00
  r = _f16_bits(x)
  if math.isinf(x): return r
  if abs(_f16(r)) > abs(x): r -= 1  # rounded away from zero: the next half toward zero (same sign)
  return r


VOP3_16.update({
  0x139: ("v_max_f16", 2, True, _h(_fmax)), 0x13A: ("v_min_f16", 2, True, _h(_fmin)),
  0x13B: ("v_ldexp_f16", 2, True, lambda a, b: _f16_bits(_ldexp(_f16(a), _s16(b)))),
  0x248: ("v_fma_f16", 3, True, _h(_fma)),
  0x249: ("v_min3_f16", 3, True, _h(lambda a, b, c: _fmin(_fmin(a, b), c))),
  0x24C: ("v_max3_f16", 3, True, _h(lambda a, b, c: _fmax(_fmax(a, b), c))),
  0x24F: ("v_med3_f16", 3, True, _h(_med3)),
  0x254: ("v_div_fixup_f16", 3, True, lambda q, d, n: _div_fixup16(d, n)),
  0x309: ("v_max_u16", 2, False, max), 0x30A: ("v_max_i16", 2, False, lambda a, b: max(_s16(a), _s16(b)) & 0xFFFF),
  0x30B: ("v_min_u16", 2, False, min), 0x30C: ("v_min_i16", 2, False, lambda a, b: min(_s16(a), _s16(b)) & 0xFFFF),
  0x30D: ("v_add_nc_i16", 2, False, lambda a, b: (a + b) & 0xFFFF),
  0x30E: ("v_sub_nc_i16", 2, False, lambda a, b: (a - b) & 0xFFFF),
  0x253: ("v_mad_i16", 3, False, lambda a, b, c: (_s16(a) * _s16(b) + _s16(c)) & 0xFFFF),
  0x250: ("v_med3_i16", 3, False, lambda a, b, c: sorted((_s16(a), _s16(b), _s16(c)))[1] & 0xFFFF),
  0x251: ("v_med3_u16", 3, False, lambda a, b, c: sorted((a, b, c))[1]),
  0x180 + 105: ("v_not_b16", 1, False, lambda a: ~a & 0xFFFF),
  # VOP1 16-bit ops promoted to VOP3 (0x180 + VOP1 opcode)
  0x180 + 80: ("v_cvt_f16_u16", 1, False, lambda a: _f16_bits(float(a))),
  0x180 + 81: ("v_cvt_f16_i16", 1, False, lambda a: _f16_bits(float(_s16(a)))),
  0x180 + 82: ("v_cvt_u16_f16", 1, True, lambda a: _cvt_int16(_f16(a), False)),
  0x180 + 83: ("v_cvt_i16_f16", 1, True, lambda a: _cvt_int16(_f16(a), True)),
  0x180 + 84: ("v_rcp_f16", 1, True, _h(_rcp)), 0x180 + 85: ("v_sqrt_f16", 1, True, _h(_sqrt)),
  0x180 + 86: ("v_rsq_f16", 1, True, _h(_rsq)), 0x180 + 87: ("v_log_f16", 1, True, _h(_log2)),
  0x180 + 88: ("v_exp_f16", 1, True, _h(_exp2)), 0x180 + 91: ("v_floor_f16", 1, True, _h(_whole(math.floor))),
  0x180 + 92: ("v_ceil_f16", 1, True, _h(_whole(math.ceil))),
  0x180 + 93: ("v_trunc_f16", 1, True, _h(_whole(math.trunc))),
  0x180 + 94: ("v_rndne_f16", 1, True, _h(_round_even)),
  0x180 + 96: ("v_sin_f16", 1, True, _h(_sin_rev)), 0x180 + 97: ("v_cos_f16", 1, True, _h(_cos_rev)),
})
# VOP2 e32 opcodes with a 16-bit VOP3 twin (register bit 7 picks the half)
VOP2_16 = {50: 0x132, 51: 0x133, 52: 0x134, 53: 0x135, 57: 0x139, 58: 0x13A, 59: 0x13B}
VOP1_16 = {op - 0x180: op for op in VOP3_16 if 0x180 <= op < 0x200}  # VOP1 e32 16-bit ops -> their VOP3 twin


def _bf16(bits: int) -> float: return f32((bits & 0xFFFF) << 16)


def _bf16_bits(x: float) -> int:
  """float -> bfloat16 bits: round the float32 to nearest even in its top 16 bits (NaN stays a quiet NaN)."""
  b = bits32(x)
  if (b & 0x7F800000) == 0x7F800000 and b & 0x7FFFFF: return (b >> 16) | 0x40
  return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def _u16(v: int) -> int: return v & 0xFFFF


# VOP3P packed 16-bit ops: op -> (name, operands, kind, fn on 16-bit patterns); kind "f" float (neg flips the sign
# bit), "i" integer (neg not allowed). Each half of the result takes its operands' halves chosen by op_sel (low
# result) and op_sel_hi (high result); gfx11 packed ops read an inline float constant as its half in both halves.
VOP3P_PK: dict[int, tuple[str, int, str, Callable[..., int]]] = {
  0: ("v_pk_mad_i16", 3, "i", lambda a, b, c: (_s16(a) * _s16(b) + _s16(c)) & 0xFFFF),
  1: ("v_pk_mul_lo_u16", 2, "i", lambda a, b: (a * b) & 0xFFFF),
  2: ("v_pk_add_i16", 2, "i", lambda a, b: (a + b) & 0xFFFF),
  3: ("v_pk_sub_i16", 2, "i", lambda a, b: (a - b) & 0xFFFF),
  4: ("v_pk_lshlrev_b16", 2, "i", lambda a, b: (b << (a & 15)) & 0xFFFF),
  5: ("v_pk_lshrrev_b16", 2, "i", lambda a, b: b >> (a & 15)),
  6: ("v_pk_ashrrev_i16", 2, "i", lambda a, b: (_s16(b) >> (a & 15)) & 0xFFFF),
  7: ("v_pk_max_i16", 2, "i", lambda a, b: max(_s16(a), _s16(b)) & 0xFFFF),
  8: ("v_pk_min_i16", 2, "i", lambda a, b: min(_s16(a), _s16(b)) & 0xFFFF),
  9: ("v_pk_mad_u16", 3, "i", lambda a, b, c: (a * b + c) & 0xFFFF),
  10: ("v_pk_add_u16", 2, "i", lambda a, b: (a + b) & 0xFFFF),
  11: ("v_pk_sub_u16", 2, "i", lambda a, b: (a - b) & 0xFFFF),
  12: ("v_pk_max_u16", 2, "i", max), 13: ("v_pk_min_u16", 2, "i", min),
  14: ("v_pk_fma_f16", 3, "f", _h(_fma)), 15: ("v_pk_add_f16", 2, "f", _h(lambda a, b: a + b)),
  16: ("v_pk_mul_f16", 2, "f", _h(lambda a, b: a * b)), 17: ("v_pk_min_f16", 2, "f", _h(_fmin)),
  18: ("v_pk_max_f16", 2, "f", _h(_fmax)),
}
VOP3P_NAMES = {19: "v_dot2_f32_f16", 22: "v_dot4_i32_iu8", 23: "v_dot4_u32_u8", 26: "v_dot2_f32_bf16",
               32: "v_fma_mix_f32", 33: "v_fma_mixlo_f16", 34: "v_fma_mixhi_f16",
               64: "v_wmma_f32_16x16x16_f16", 65: "v_wmma_f32_16x16x16_bf16", 66: "v_wmma_f16_16x16x16_f16",
               67: "v_wmma_bf16_16x16x16_bf16", 68: "v_wmma_i32_16x16x16_iu8", 69: "v_wmma_i32_16x16x16_iu4",
               **{k: v[0] for k, v in VOP3P_PK.items()}}
# WMMA (wave32): op -> (input half -> float, output is float32, output 16-bit pattern from float)
WMMA = {64: (_f16, True, None), 65: (_bf16, True, None), 66: (_f16, False, _f16_bits), 67: (_bf16, False, _bf16_bits)}


# VOP3 opcodes whose result is a float32 (the ones omod/clamp may modify)
VOP3_F32_RESULT = {*(0x100 + o for o in (3, 4, 5, 7, 8, 15, 16, 43)), 0x213, 0x219, 0x21C, 0x227, 0x237, 0x31C,
                   *(0x180 + o for o in (5, 6, 17, 18, 19, 20, 33, 34, 36, 37, 39, 42, 43, 51))}
# ops with a scalar carry-out (sdst) in bits 14:8
VOP3SD = {0x120, 0x121, 0x122, 0x2FC, 0x2FD, 0x2FE, 0x2FF, 0x300, 0x301, 0x302}
# VOPC: compare kinds by (op & 0x7F) >> 3 group; cmp functions by op & 7 (f, lt, eq, le, gt, ne/lg, ge, t)
_CMP = [lambda a, b: False, lambda a, b: a < b, lambda a, b: a == b, lambda a, b: a <= b, lambda a, b: a > b,
        lambda a, b: a != b, lambda a, b: a >= b, lambda a, b: True]
_F32_CMP = {0x10: "f", 0x11: "lt", 0x12: "eq", 0x13: "le", 0x14: "gt", 0x15: "lg", 0x16: "ge", 0x17: "o", 0x18: "u",
            0x19: "nge", 0x1A: "nlg", 0x1B: "ngt", 0x1C: "nle", 0x1D: "neq", 0x1E: "nlt", 0x1F: "t"}

# Python float comparisons are false when either side is NaN, which is the ordered (o) semantics; n* are negations
_F32_FN: dict[int, Callable[[float, float], bool]] = {
  0x10: lambda x, y: False, 0x11: lambda x, y: x < y, 0x12: lambda x, y: x == y, 0x13: lambda x, y: x <= y,
  0x14: lambda x, y: x > y, 0x15: lambda x, y: x < y or x > y, 0x16: lambda x, y: x >= y,
  0x17: lambda x, y: x == x and y == y, 0x18: lambda x, y: x != x or y != y, 0x19: lambda x, y: not x >= y,
  0x1A: lambda x, y: not (x < y or x > y), 0x1B: lambda x, y: not x > y, 0x1C: lambda x, y: not x <= y,
  0x1D: lambda x, y: not x == y, 0x1E: lambda x, y: not x < y, 0x1F: lambda x, y: True}


def fp_class(bits: int) -> int:
  """The V_CMP_CLASS bit index of a float32: 0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denorm, 5 -0, 6 +0, 7 +denorm,
  8 +normal, 9 +inf."""
  exp, man, neg = (bits >> 23) & 0xFF, bits & 0x7FFFFF, bits >> 31 & 1
  if exp == 0xFF: return (1 if man >> 22 else 0) if man else (2 if neg else 9)
  if exp == 0: return (5 if neg else 6) if man == 0 else (4 if neg else 7)
  return 3 if neg else 8


def fp_class16(bits: int) -> int:
  """The V_CMP_CLASS bit index of a half (same numbering as fp_class)."""
  exp, man, neg = (bits >> 10) & 0x1F, bits & 0x3FF, bits >> 15 & 1
  if exp == 0x1F: return (1 if man >> 9 else 0) if man else (2 if neg else 9)
  if exp == 0: return (5 if neg else 6) if man == 0 else (4 if neg else 7)
  return 3 if neg else 8


def fp_class64(bits: int) -> int:
  """The V_CMP_CLASS bit index of a float64 (same numbering as fp_class; exponent 2047 is inf/NaN)."""
  exp, man, neg = (bits >> 52) & 0x7FF, bits & ((1 << 52) - 1), bits >> 63 & 1
  if exp == 0x7FF: return (1 if man >> 51 else 0) if man else (2 if neg else 9)
  if exp == 0: return (5 if neg else 6) if man == 0 else (4 if neg else 7)
  return 3 if neg else 8


def vopc_compare(op: int) -> tuple[str, Callable[[int, int], bool]]:
  """The name and per-lane predicate of VOPC opcode `op` (0x10.. f32, 0x40.. i32, 0x48.. u32)."""
  base = op & 0x7F
  if base == 0x7D: return f"v_cmp{'x' if op & 0x80 else ''}_class_f16", lambda a, b: bool(b >> fp_class16(a) & 1)
  if base < 0x10:  # f16 compares: operands are half patterns
    fn16 = _F32_FN[base + 0x10]
    return f"v_cmp{'x' if op & 0x80 else ''}_{_F32_CMP[base + 0x10]}_f16", lambda a, b: fn16(_f16(a), _f16(b))
  if base == 0x7E: return f"v_cmp{'x' if op & 0x80 else ''}_class_f32", lambda a, b: bool(b >> fp_class(a) & 1)
  if base == 0x7F:  # a 64-bit src0, a 32-bit class mask in src1
    return f"v_cmp{'x' if op & 0x80 else ''}_class_f64", lambda a, b: bool(b >> fp_class64(a) & 1)
  if 0x20 <= base < 0x30:
    fn64 = _F32_FN[base - 0x10]
    return f"v_cmp{'x' if op & 0x80 else ''}_{_F32_CMP[base - 0x10]}_f64", lambda a, b: fn64(f64(a), f64(b))
  if base in _F32_CMP:
    fn = _F32_FN[base]
    return f"v_cmp{'x' if op & 0x80 else ''}_{_F32_CMP[base]}_f32", lambda a, b: fn(f32(a), f32(b))
  if 0x31 <= base <= 0x36 or 0x39 <= base <= 0x3E:  # 16-bit integer compares (operands are halves)
    signed, fn = base < 0x38, _CMP[base & 7]
    names = ["f", "lt", "eq", "le", "gt", "ne", "ge", "t"]
    return (f"v_cmp{'x' if op & 0x80 else ''}_{names[base & 7]}_{'i' if signed else 'u'}16",
            (lambda a, b: fn(_s16(a), _s16(b))) if signed else fn)
  if 0x40 <= base < 0x60:  # 0x40 i32, 0x48 u32, 0x50 i64, 0x58 u64
    signed, bits, fn = not base & 8, 32 if base < 0x50 else 64, _CMP[base & 7]
    names = ["f", "lt", "eq", "le", "gt", "ne", "ge", "t"]
    return (f"v_cmp{'x' if op & 0x80 else ''}_{names[base & 7]}_{'i' if signed else 'u'}{bits}",
            (lambda a, b: fn(sext(a, bits), sext(b, bits))) if signed else fn)
  raise UnsupportedInstruction(f"VOPC opcode {op:#x}")


SOP2: dict[int, tuple[str, Callable[[int, int], int]]] = {
  0: ("s_add_u32", lambda a, b: a + b), 1: ("s_sub_u32", lambda a, b: a - b),
  2: ("s_add_i32", lambda a, b: i32(a) + i32(b)), 3: ("s_sub_i32", lambda a, b: i32(a) - i32(b)),
  8: ("s_lshl_b32", lambda a, b: a << (b & 31)), 10: ("s_lshr_b32", lambda a, b: a >> (b & 31)),
  12: ("s_ashr_i32", lambda a, b: i32(a) >> (b & 31)),
  18: ("s_min_i32", lambda a, b: min(i32(a), i32(b))), 19: ("s_min_u32", min),
  20: ("s_max_i32", lambda a, b: max(i32(a), i32(b))), 21: ("s_max_u32", max),
  22: ("s_and_b32", lambda a, b: a & b), 24: ("s_or_b32", lambda a, b: a | b), 26: ("s_xor_b32", lambda a, b: a ^ b),
  34: ("s_and_not1_b32", lambda a, b: a & ~b & MASK32),
  44: ("s_mul_i32", lambda a, b: i32(a) * i32(b)), 45: ("s_mul_hi_u32", lambda a, b: (a * b) >> 32),
  28: ("s_nand_b32", lambda a, b: ~(a & b) & MASK32), 30: ("s_nor_b32", lambda a, b: ~(a | b) & MASK32),
  32: ("s_xnor_b32", lambda a, b: ~(a ^ b) & MASK32), 36: ("s_or_not1_b32", lambda a, b: (a | ~b) & MASK32),
  6: ("s_absdiff_i32", lambda a, b: abs(i32(a) - i32(b))),
  42: ("s_bfm_b32", lambda a, b: (((1 << (a & 31)) - 1) << (b & 31)) & MASK32),
  50: ("s_pack_ll_b32_b16", lambda a, b: (a & 0xFFFF) | ((b & 0xFFFF) << 16)),
  51: ("s_pack_lh_b32_b16", lambda a, b: (a & 0xFFFF) | (b & 0xFFFF0000)),
  52: ("s_pack_hh_b32_b16", lambda a, b: (a >> 16) | (b & 0xFFFF0000)),
  46: ("s_mul_hi_i32", lambda a, b: (i32(a) * i32(b)) >> 32),
  **{13 + n: (f"s_lshl{n}_add_u32", _lshl_add(n)) for n in (1, 2, 3, 4)},
  39: ("s_bfe_i32", lambda a, b: _bfe_i32(a, b & 31, (b >> 16) & 0x7F)),
}
SOP2_ADDC, SOP2_SUBB, SOP2_LSHL_B64, SOP2_AND_B64, SOP2_CSELECT_B32, SOP2_BFE_U32 = 4, 5, 9, 23, 48, 38
SOP2_B64 = {9: "s_lshl_b64", 11: "s_lshr_b64", 13: "s_ashr_i64", 23: "s_and_b64", 25: "s_or_b64", 27: "s_xor_b64",
            29: "s_nand_b64", 31: "s_nor_b64", 33: "s_xnor_b64", 35: "s_and_not1_b64", 37: "s_or_not1_b64",
            40: "s_bfe_u64", 41: "s_bfe_i64", 49: "s_cselect_b64"}
SOPC_NAMES = [*(f"s_cmp_{c}" for c in ("eq_i32", "lg_i32", "gt_i32", "ge_i32", "lt_i32", "le_i32", "eq_u32", "lg_u32",
                                        "gt_u32", "ge_u32", "lt_u32", "le_u32")),
              "s_bitcmp0_b32", "s_bitcmp1_b32", "s_bitcmp0_b64", "s_bitcmp1_b64", "s_cmp_eq_u64", "s_cmp_lg_u64"]
_SOPC_FN = [_CMP[2], _CMP[5], _CMP[4], _CMP[6], _CMP[1], _CMP[3]]
SOPP_NAMES = {0: "s_nop", 5: "s_clause", 7: "s_delay_alu", 8: "s_waitcnt_depctr", 9: "s_waitcnt", 32: "s_branch",
              33: "s_cbranch_scc0", 34: "s_cbranch_scc1", 35: "s_cbranch_vccz", 36: "s_cbranch_vccnz",
              37: "s_cbranch_execz", 38: "s_cbranch_execnz", 48: "s_endpgm", 54: "s_sendmsg", 61: "s_barrier",
              4: "s_set_inst_prefetch_distance", 31: "s_code_end", 3: "s_sleep", 53: "s_setprio", 18: "s_denorm_mode",
              17: "s_round_mode"}
SMEM_LOADS = {0: 1, 1: 2, 2: 4, 3: 8, 4: 16}  # s_load_b32/64/128/256/512: dwords
GLOBAL_LOADS = {16: (1, False, 8), 17: (1, True, 8), 18: (1, False, 16), 19: (1, True, 16), 20: (1, False, 32),
                21: (2, False, 32), 22: (3, False, 32), 23: (4, False, 32)}  # op: (dwords, signed, bits)
GLOBAL_STORES = {24: (1, 8), 25: (1, 16), 26: (1, 32), 27: (2, 32), 28: (3, 32), 29: (4, 32)}
GLOBAL_D16 = {30: (8, False, 0), 31: (8, True, 0), 32: (16, False, 0), 33: (8, False, 16), 34: (8, True, 16),
              35: (16, False, 16)}  # op: (bits, signed, destination shift)
# DS (LDS) ops: op -> (name, kind, dwords or bits, stride): kind "st"/"ld" single address (16-bit offset),
# "st2"/"ld2" two addresses (offset0/offset1 times stride bytes)
DS_OPS = {13: ("ds_store_b32", "st", 32, 0), 14: ("ds_store_2addr_b32", "st2", 32, 4),
          15: ("ds_store_2addr_stride64_b32", "st2", 32, 256), 30: ("ds_store_b8", "st", 8, 0),
          31: ("ds_store_b16", "st", 16, 0), 77: ("ds_store_b64", "st", 64, 0),
          78: ("ds_store_2addr_b64", "st2", 64, 8),
          222: ("ds_store_b96", "st", 96, 0), 223: ("ds_store_b128", "st", 128, 0),
          54: ("ds_load_b32", "ld", 32, 0), 55: ("ds_load_2addr_b32", "ld2", 32, 4),
          56: ("ds_load_2addr_stride64_b32", "ld2", 32, 256), 57: ("ds_load_i8", "ld", -8, 0),
          58: ("ds_load_u8", "ld", 8, 0), 59: ("ds_load_i16", "ld", -16, 0), 60: ("ds_load_u16", "ld", 16, 0),
          118: ("ds_load_b64", "ld", 64, 0), 119: ("ds_load_2addr_b64", "ld2", 64, 8),
          254: ("ds_load_b96", "ld", 96, 0),
          255: ("ds_load_b128", "ld", 128, 0)}
DS_OPS.update({79: ("ds_store_2addr_stride64_b64", "st2", 64, 512),
               120: ("ds_load_2addr_stride64_b64", "ld2", 64, 512)})
# DS d16 ops: op -> (name, bits, signed, half): loads fill one VGPR half (keeping the other), stores write from the
# high half (half = 1)
DS_D16 = {160: ("ds_store_b8_d16_hi", 8, False, 1), 161: ("ds_store_b16_d16_hi", 16, False, 1),
          162: ("ds_load_u8_d16", 8, False, 0), 163: ("ds_load_u8_d16_hi", 8, False, 1),
          164: ("ds_load_i8_d16", 8, True, 0), 165: ("ds_load_i8_d16_hi", 8, True, 1),
          166: ("ds_load_u16_d16", 16, False, 0), 167: ("ds_load_u16_d16_hi", 16, False, 1)}
DS_NAMES = {**{k: v[0] for k, v in DS_OPS.items()}, **{k: v[0] for k, v in DS_D16.items()}}
DS_PERMUTE = {53: "ds_swizzle_b32", 178: "ds_permute_b32", 179: "ds_bpermute_b32"}
FLAT_NAMES = {30: "load_d16_u8", 31: "load_d16_i8", 32: "load_d16_b16", 33: "load_d16_hi_u8", 34: "load_d16_hi_i8",
              35: "load_d16_hi_b16", 16: "load_u8", 17: "load_i8", 18: "load_u16", 19: "load_i16", 20: "load_b32",
              21: "load_b64",
              22: "load_b96", 23: "load_b128", 24: "store_b8", 25: "store_b16", 26: "store_b32", 27: "store_b64",
              28: "store_b96", 29: "store_b128", 36: "store_d16_hi_b8", 37: "store_d16_hi_b16"}
# FLAT/GLOBAL atomics: op -> (kind, bits); the name is {kind}_{b32|u32|...} as in the ISA
_ATOMIC_KINDS = ["swap_b", "cmpswap_b", "add_u", "sub_u", "csub_u", "min_i", "min_u", "max_i", "max_u", "and_b",
                 "or_b", "xor_b", "inc_u", "dec_u"]
FLAT_ATOMICS: dict[int, tuple[str, int]] = {
  **{51 + i: (k + "32", 32) for i, k in enumerate(_ATOMIC_KINDS)},
  **{65 + i: (k + "64", 64) for i, k in enumerate(k for k in _ATOMIC_KINDS if k != "csub_u")},
  80: ("cmpswap_f32", 32), 81: ("min_f32", 32), 82: ("max_f32", 32), 86: ("add_f32", 32)}
# DS atomics: op -> (kind, bits, returns the old value)
_DS_KINDS = {0: "add_u", 1: "sub_u", 2: "rsub_u", 3: "inc_u", 4: "dec_u", 5: "min_i", 6: "max_i", 7: "min_u",
             8: "max_u", 9: "and_b", 10: "or_b", 11: "xor_b", 16: "cmpswap_b"}
DS_ATOMICS: dict[int, tuple[str, int, bool]] = {
  **{op: (k + "32", 32, False) for op, k in _DS_KINDS.items()},
  **{op + 32: (k + "32", 32, True) for op, k in _DS_KINDS.items()}, 45: ("swap_b32", 32, True),
  18: ("min_f32", 32, False), 19: ("max_f32", 32, False), 21: ("add_f32", 32, False),
  50: ("min_f32", 32, True), 51: ("max_f32", 32, True), 121: ("add_f32", 32, True),
  **{op + 64: (k + "64", 64, False) for op, k in _DS_KINDS.items()},
  **{op + 96: (k + "64", 64, True) for op, k in _DS_KINDS.items()}, 109: ("swap_b64", 64, True)}


def atomic_result(kind: str, bits: int, old: int, data: int, cmp: int = 0) -> int:
  """The value an atomic leaves in memory (RDNA3 ISA "FLAT/GLOBAL atomics" and "DS atomics"); `kind` is e.g.
  add_u32, min_i64, cmpswap_b32 (data = new value, cmp = the compare value), add_f32."""
  mask = (1 << bits) - 1
  op = kind[:-2]
  if op.endswith("_f"):
    a, b = f32(old), f32(data)
    if op == "add_f": return bits32(a + b)
    if op == "min_f": return bits32(_fmin(a, b))
    if op == "max_f": return bits32(_fmax(a, b))
    if op == "cmpswap_f": return data if a == f32(cmp) else old
  sa, sd = sext(old, bits), sext(data, bits)
  r = {"swap_b": lambda: data, "cmpswap_b": lambda: data if old == cmp else old, "add_u": lambda: old + data,
       "sub_u": lambda: old - data, "rsub_u": lambda: data - old, "csub_u": lambda: max(old - data, 0),
       "min_i": lambda: min(sa, sd), "max_i": lambda: max(sa, sd), "min_u": lambda: min(old, data),
       "max_u": lambda: max(old, data), "and_b": lambda: old & data, "or_b": lambda: old | data,
       "xor_b": lambda: old ^ data, "inc_u": lambda: 0 if old >= data else old + 1,
       "dec_u": lambda: data if old == 0 or old > data else old - 1}.get(op)
  if r is None: raise UnsupportedInstruction(f"atomic {kind}")
  return r() & mask


SAVEEXEC: dict[int, tuple[str, Callable[[int, int], int]]] = {  # SOP1 op -> (name, fn(src, exec) -> new exec)
  32: ("s_and_saveexec_b32", lambda s, e: s & e), 34: ("s_or_saveexec_b32", lambda s, e: s | e),
  36: ("s_xor_saveexec_b32", lambda s, e: s ^ e), 38: ("s_nand_saveexec_b32", lambda s, e: ~(s & e) & MASK32),
  40: ("s_nor_saveexec_b32", lambda s, e: ~(s | e) & MASK32),
  42: ("s_xnor_saveexec_b32", lambda s, e: ~(s ^ e) & MASK32),
  44: ("s_and_not0_saveexec_b32", lambda s, e: ~s & e & MASK32),
  46: ("s_or_not0_saveexec_b32", lambda s, e: (~s | e) & MASK32),
  48: ("s_and_not1_saveexec_b32", lambda s, e: s & ~e & MASK32),
  50: ("s_or_not1_saveexec_b32", lambda s, e: (s | ~e) & MASK32)}


VOPD_OPS = {0: "fmac_f32", 1: "fmaak_f32", 2: "fmamk_f32", 3: "mul_f32", 4: "add_f32", 5: "sub_f32", 6: "subrev_f32",
            8: "mov_b32", 9: "cndmask_b32", 10: "max_f32", 11: "min_f32", 16: "add_nc_u32", 17: "lshlrev_b32",
            18: "and_b32", 7: "mul_dx9_zero_f32", 12: "dot2acc_f32_f16", 13: "dot2acc_f32_bf16"}
_VOPD_TO_VOP2 = {3: 8, 4: 3, 5: 4, 6: 5, 10: 16, 11: 15, 16: 37, 17: 24, 18: 27, 7: 7}


# GFX9/CDNA3 VOP3-only ops the RDNA3 tables lack (cdna3.py decodes them; batch_g9.py runs them):
# name -> fn(a, b, c) on 32-bit patterns
def _popcount(v: int) -> int: return bin(v).count("1")


def _perm(a: int, b: int, sel: int) -> int:
  """V_PERM_B32: each byte of the result picks (by the selector byte of S2) a byte of {S0, S1}, a sign-replicated
  byte (8..11), 0x00 (12) or 0xFF (13 and up)."""
  src, out = (a << 32) | b, 0
  for i in range(4):
    s = (sel >> (8 * i)) & 0xFF
    if s < 8: v = (src >> (8 * s)) & 0xFF
    elif s < 12: v = 0xFF if (src >> (16 * (s - 8) + 15)) & 1 else 0
    elif s == 12: v = 0
    else: v = 0xFF
    out |= v << (8 * i)
  return out


VOP3_EXTRA: dict[str, Callable[[int, int, int], int]] = {
  "v_med3_f32": _ff(_med3), "v_perm_b32": _perm,
  "v_alignbyte_b32": lambda a, b, c: (((a << 32) | b) >> (8 * (c & 3))) & MASK32,
  "v_bcnt_u32_b32": lambda a, b, c: (_popcount(a) + b) & MASK32,
  "v_bfm_b32": lambda a, b, c: (((1 << (a & 31)) - 1) << (b & 31)) & MASK32,
  "v_add_i32": lambda a, b, c: (i32(a) + i32(b)) & MASK32,
  "v_sub_i32": lambda a, b, c: (i32(a) - i32(b)) & MASK32,
}
