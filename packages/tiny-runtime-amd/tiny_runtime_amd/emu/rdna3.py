"""An RDNA3 (gfx11, wave32) instruction emulator: decode and execute the instructions of compiled kernels.

Encodings, opcode numbers and semantics follow AMD's "RDNA3 Instruction Set Architecture" reference guide (sections
"Instructions" / "Microcode Formats"; opcode numbers cross-checked with llvm-mc-15 for gfx1100). Supported: SOP1,
SOP2, SOPK, SOPC, SOPP, SMEM loads, VOP1, VOP2, VOP3 (VOP3-only and promoted VOP1/VOP2/VOPC, true16 halves by
op_sel), VOPC, VOPD (dual issue), VOP3P (packed 16-bit math, v_fma_mix*, v_dot*, WMMA 16x16x16), DPP16/DPP8 on
VOP1/VOP2/VOPC/VOP3, v_permlane16/x16; FLAT/GLOBAL loads, stores and atomics, SCRATCH (per-lane private memory),
DS loads/stores/atomics/permutes; EXEC and VCC masking, branches, barriers. Fused multiply-adds round once.
An encoding or opcode it does not know raises `UnsupportedInstruction` naming the format, opcode and address,
never a wrong value. Memory is addressed by integers that are host addresses (the mock maps GPU VAs 1:1).

Speed: vector ops run on whole columns of lane values (a VGPR is a list of 32 ints; with every lane active a result
replaces the list), a wave's nearby dword loads read memory once; `python -m tiny_runtime_amd.emu.bench` measures it.
"""
from __future__ import annotations

import ctypes
import functools
import math
import operator
from fractions import Fraction
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

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
  **{17 + n: (f"v_cvt_f32_ubyte{n}", lambda a, n=n: bits32(float((a >> (8 * n)) & 0xFF))) for n in range(4)},
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
  **{13 + n: (f"s_lshl{n}_add_u32", lambda a, b, n=n: (a << n) + b) for n in (1, 2, 3, 4)},
  39: ("s_bfe_i32", lambda a, b: _bfe_i32(a, b & 31, (b >> 16) & 0x7F)),
}
SOP2_ADDC, SOP2_SUBB, SOP2_LSHL_B64, SOP2_AND_B64, SOP2_CSELECT_B32, SOP2_BFE_U32 = 4, 5, 9, 23, 48, 38
SOP2_B64 = {9: "s_lshl_b64", 11: "s_lshr_b64", 13: "s_ashr_i64", 23: "s_and_b64", 25: "s_or_b64", 27: "s_xor_b64",
            35: "s_and_not1_b64", 37: "s_or_not1_b64", 40: "s_bfe_u64", 41: "s_bfe_i64", 49: "s_cselect_b64"}
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


VOPD_OPS = {0: "fmac_f32", 1: "fmaak_f32", 2: "fmamk_f32", 3: "mul_f32", 4: "add_f32", 5: "sub_f32", 6: "subrev_f32",
            8: "mov_b32", 9: "cndmask_b32", 10: "max_f32", 11: "min_f32", 16: "add_nc_u32", 17: "lshlrev_b32",
            18: "and_b32", 7: "mul_dx9_zero_f32", 12: "dot2acc_f32_f16", 13: "dot2acc_f32_bf16"}
_VOPD_TO_VOP2 = {3: 8, 4: 3, 5: 4, 6: 5, 10: 16, 11: 15, 16: 37, 17: 24, 18: 27, 7: 7}


@dataclass
class Inst:
  """A decoded instruction: encoding name, opcode, fields, size in bytes, mnemonic."""
  fmt: str
  op: int
  f: dict[str, int]
  size: int
  name: str
  literal: int | None = None


def _bits(w: int, lo: int, n: int) -> int: return (w >> lo) & ((1 << n) - 1)


def decode(code: bytes | memoryview, pc: int = 0) -> Inst:
  """Decode the instruction at byte offset `pc` of `code`."""
  w0 = struct.unpack_from("<I", code, pc)[0]
  w1 = struct.unpack_from("<I", code, pc + 4)[0] if pc + 8 <= len(code) else 0

  def lit(inst: Inst, *srcs: int) -> Inst:
    if LITERAL in srcs:
      inst.literal = struct.unpack_from("<I", code, pc + inst.size)[0]
      inst.size += 4
    return inst

  def dpp(inst: Inst) -> Inst:
    """VOP1/VOP2/VOPC with src0 = DPP16 (250) or DPP8 (233, 234 with fetch-inactive): the next dword holds the real
    src0 VGPR and the lane pattern (see Emulator.dpp)."""
    if inst.f["src0"] not in (DPP16, DPP8, DPP8_FI): return inst
    d = struct.unpack_from("<I", code, pc + 4)[0]
    inst.f = {**inst.f, "dpp_kind": inst.f["src0"], "dpp": d, "src0": 256 + (d & 0xFF)}
    inst.size, inst.name = 8, inst.name + ("_dpp" if inst.f["dpp_kind"] == DPP16 else "_dpp8")
    return inst

  top9, top6 = w0 >> 23, w0 >> 26
  if top9 == 0b101111101:
    op = _bits(w0, 8, 8)
    return lit(Inst("SOP1", op, {"sdst": _bits(w0, 16, 7), "ssrc0": w0 & 0xFF}, 4, _sop1_name(op)), w0 & 0xFF)
  if top9 == 0b101111110:
    op = _bits(w0, 16, 7)
    name = SOPC_NAMES[op] if op < len(SOPC_NAMES) else f"sopc_{op}"
    return lit(Inst("SOPC", op, {"ssrc0": w0 & 0xFF, "ssrc1": _bits(w0, 8, 8)}, 4, name), w0 & 0xFF, _bits(w0, 8, 8))
  if top9 == 0b101111111:
    op = _bits(w0, 16, 7)
    return Inst("SOPP", op, {"simm16": w0 & 0xFFFF}, 4, SOPP_NAMES.get(op, f"sopp_{op}"))
  if w0 >> 28 == 0b1011:
    op = _bits(w0, 23, 5)
    names = {0: "s_movk_i32", 2: "s_cmovk_i32", 15: "s_addk_i32", 16: "s_mulk_i32", 23: "s_waitcnt_vmcnt",
             24: "s_waitcnt_vscnt",
             25: "s_waitcnt_expcnt", 26: "s_waitcnt_lgkmcnt",
             **{3 + i: f"s_cmpk_{c}_i32" for i, c in enumerate(("eq", "lg", "gt", "ge", "lt", "le"))},
             **{9 + i: f"s_cmpk_{c}_u32" for i, c in enumerate(("eq", "lg", "gt", "ge", "lt", "le"))}}
    return Inst("SOPK", op, {"sdst": _bits(w0, 16, 7), "simm16": w0 & 0xFFFF}, 4, names.get(op, f"sopk_{op}"))
  if w0 >> 30 == 0b10:
    op = _bits(w0, 23, 7)
    name = SOP2[op][0] if op in SOP2 else {4: "s_addc_u32", 5: "s_subb_u32", 48: "s_cselect_b32", 38: "s_bfe_u32",
                                             **SOP2_B64}.get(op, f"sop2_{op}")
    return lit(Inst("SOP2", op, {"sdst": _bits(w0, 16, 7), "ssrc0": w0 & 0xFF, "ssrc1": _bits(w0, 8, 8)}, 4, name),
               w0 & 0xFF, _bits(w0, 8, 8))
  if top6 == 0b111101:
    op = _bits(w0, 18, 8)
    f = {"sbase": (w0 & 0x3F) * 2, "sdata": _bits(w0, 6, 7), "offset": sext(w1 & 0x1FFFFF, 21), "soffset": w1 >> 25}
    return Inst("SMEM", op, f, 8, f"s_load_b{32 * SMEM_LOADS[op]}" if op in SMEM_LOADS else f"smem_{op}")
  if top6 == 0b110110:
    op = _bits(w0, 18, 8)
    f = {"offset0": w0 & 0xFF, "offset1": _bits(w0, 8, 8), "addr": w1 & 0xFF, "data0": _bits(w1, 8, 8),
         "data1": _bits(w1, 16, 8), "vdst": w1 >> 24}
    name = DS_NAMES.get(op) or DS_PERMUTE.get(op) or (_ds_atomic_name(op) if op in DS_ATOMICS else f"ds_op{op}")
    return Inst("DS", op, f, 8, name)
  if top6 == 0b111000:
    op = _bits(w0, 18, 8)
    return Inst("MUBUF", op, {}, 8, {43: "buffer_gl0_inv", 44: "buffer_gl1_inv"}.get(op, f"buffer_op{op}"))
  if top6 == 0b110111:
    op, seg = _bits(w0, 18, 7), _bits(w0, 16, 2)
    f = {"offset": sext(w0 & 0x1FFF, 13), "seg": seg, "addr": w1 & 0xFF, "data": _bits(w1, 8, 8),
         "saddr": _bits(w1, 16, 7), "sve": _bits(w1, 23, 1), "vdst": w1 >> 24, "glc": _bits(w0, 14, 1)}
    seg_name = ["flat", "scratch", "global"][seg] if seg < 3 else "seg3"
    name = f"{seg_name}_atomic_{FLAT_ATOMICS[op][0]}" if op in FLAT_ATOMICS else \
      f"{seg_name}_{FLAT_NAMES.get(op, f'op{op}')}"
    return Inst("FLAT", op, f, 8, name)
  if top6 == 0b110010:
    opx, opy = _bits(w0, 22, 4), _bits(w0, 17, 5)
    vdstx = w1 >> 24
    f = {"opx": opx, "opy": opy, "src0x": w0 & 0x1FF, "vsrcx1": _bits(w0, 9, 8), "src0y": w1 & 0x1FF,
         "vsrcy1": _bits(w1, 9, 8), "vdstx": vdstx, "vdsty": (_bits(w1, 17, 7) << 1) | ((vdstx & 1) ^ 1)}
    name = f"v_dual_{VOPD_OPS.get(opx, opx)} :: v_dual_{VOPD_OPS.get(opy, opy)}"
    return lit(Inst("VOPD", opx, f, 8, name), f["src0x"], f["src0y"], *([LITERAL] if {opx, opy} & {1, 2} else []))
  if w0 >> 24 == 0xCC:  # VOP3P: op_sel/op_sel_hi pick source halves; neg_lo/neg_hi negate them (0xCD.. VINTERP)
    op = _bits(w0, 16, 7)
    f = {"vdst": w0 & 0xFF, "neg_hi": _bits(w0, 8, 3), "opsel": _bits(w0, 11, 3),
         "opsel_hi": _bits(w1, 27, 2) | (_bits(w0, 14, 1) << 2), "clamp": _bits(w0, 15, 1), "src0": w1 & 0x1FF,
         "src1": _bits(w1, 9, 9), "src2": _bits(w1, 18, 9), "neg": w1 >> 29}
    return lit(Inst("VOP3P", op, f, 8, VOP3P_NAMES.get(op, f"vop3p_{op}")), f["src0"], f["src1"], f["src2"])
  if top6 == 0b110101:
    op = _bits(w0, 16, 10)
    f = {"vdst": w0 & 0xFF, "sdst": _bits(w0, 8, 7), "abs": _bits(w0, 8, 3), "opsel": _bits(w0, 11, 4),
         "clamp": _bits(w0, 15, 1), "src0": w1 & 0x1FF, "src1": _bits(w1, 9, 9), "src2": _bits(w1, 18, 9),
         "omod": _bits(w1, 27, 2), "neg": w1 >> 29}
    if f["src0"] in (DPP8, DPP8_FI, DPP16):  # VOP3 with a DPP dword after the 8 bytes (see Emulator.dpp)
      d = struct.unpack_from("<I", code, pc + 8)[0]
      f = {**f, "dpp_kind": f["src0"], "dpp": d, "src0": 256 + (d & 0xFF)}
      return Inst("VOP3", op, f, 12, _vop3_name(op) + ("_dpp" if f["dpp_kind"] == DPP16 else "_dpp8"))
    return lit(Inst("VOP3", op, f, 8, _vop3_name(op)), f["src0"], f["src1"], f["src2"])
  if w0 >> 25 == 0b0111111:
    op = _bits(w0, 9, 8)
    name = VOP1[op][0] if op in VOP1 else VOP1_F64[op][0] if op in VOP1_F64 else VOP3_16[VOP1_16[op]][0] \
      if op in VOP1_16 else VOP1_SPECIAL.get(op, f"vop1_{op}")
    return dpp(lit(Inst("VOP1", op, {"vdst": _bits(w0, 17, 8), "src0": w0 & 0x1FF}, 4, name), w0 & 0x1FF))
  if w0 >> 25 == 0b0111110:
    op = _bits(w0, 17, 8)
    try: name = vopc_compare(op)[0]
    except UnsupportedInstruction: name = f"vopc_{op}"
    return dpp(lit(Inst("VOPC", op, {"src0": w0 & 0x1FF, "vsrc1": _bits(w0, 9, 8)}, 4, name), w0 & 0x1FF))
  if w0 >> 31 == 0:
    op = _bits(w0, 25, 6)
    name = VOP2[op][0] if op in VOP2 else VOP3_16[VOP2_16[op]][0] if op in VOP2_16 else \
      VOP2_SPECIAL.get(op, f"vop2_{op}")
    inst = Inst("VOP2", op, {"vdst": _bits(w0, 17, 8), "src0": w0 & 0x1FF, "vsrc1": _bits(w0, 9, 8)}, 4, name)
    return dpp(lit(inst, w0 & 0x1FF, *([LITERAL] if op in (VOP2_FMAMK, VOP2_FMAAK, 55, 56) else [])))
  raise UnsupportedInstruction(f"unknown encoding {w0:#010x} at offset {pc:#x}")


def _ds_atomic_name(op: int) -> str:
  kind, bits, rtn = DS_ATOMICS[op]
  k = kind.replace("cmpswap_b", "cmpstore_b").replace("swap_b", "storexchg_b")
  base, suffix = k.rsplit("_", 1)
  return f"ds_{base}_rtn_{suffix}" if rtn else f"ds_{base}_{suffix}"


SAVEEXEC: dict[int, tuple[str, Callable[[int, int], int]]] = {  # SOP1 op -> (name, fn(src, exec) -> new exec)
  32: ("s_and_saveexec_b32", lambda s, e: s & e), 34: ("s_or_saveexec_b32", lambda s, e: s | e),
  36: ("s_xor_saveexec_b32", lambda s, e: s ^ e), 38: ("s_nand_saveexec_b32", lambda s, e: ~(s & e) & MASK32),
  40: ("s_nor_saveexec_b32", lambda s, e: ~(s | e) & MASK32),
  42: ("s_xnor_saveexec_b32", lambda s, e: ~(s ^ e) & MASK32),
  44: ("s_and_not0_saveexec_b32", lambda s, e: ~s & e & MASK32),
  46: ("s_or_not0_saveexec_b32", lambda s, e: (~s | e) & MASK32),
  48: ("s_and_not1_saveexec_b32", lambda s, e: s & ~e & MASK32),
  50: ("s_or_not1_saveexec_b32", lambda s, e: (s | ~e) & MASK32)}


def _sop1_name(op: int) -> str:
  if op in SAVEEXEC: return SAVEEXEC[op][0]
  return {0: "s_mov_b32", 1: "s_mov_b64", 2: "s_cmov_b32", 4: "s_brev_b32", 71: "s_getpc_b64", 72: "s_setpc_b64",
          73: "s_swappc_b64", 9: "s_ctz_i32_b64", 25: "s_bcnt1_i32_b64", 8: "s_ctz_i32_b32", 10: "s_clz_i32_u32",
          14: "s_sext_i32_i8", 15: "s_sext_i32_i16", 16: "s_bitset0_b32", 18: "s_bitset1_b32", 21: "s_abs_i32",
          22: "s_bcnt0_i32_b32", 24: "s_bcnt1_i32_b32", 30: "s_not_b32"}.get(op, f"sop1_{op}")


def _vop3_name(op: int) -> str:
  if op in VOP3_16: return VOP3_16[op][0] + ("_e64" if op < 0x200 else "")
  if op < 0x100:
    try: return vopc_compare(op)[0] + "_e64"
    except UnsupportedInstruction: return f"vop3_vopc_{op}"
  if op < 0x180:
    return (VOP2[op - 0x100][0] if op - 0x100 in VOP2 else VOP2_SPECIAL.get(op - 0x100, f"vop2_{op - 0x100}")) + "_e64"
  if op < 0x200:
    o = op - 0x180
    return (VOP1[o][0] if o in VOP1 else VOP1_SPECIAL.get(o, f"vop1_{o}")) + "_e64"
  if op in VOP3: return VOP3[op][0]
  if op in VOP3_F64: return VOP3_F64[op][0]
  if 0x180 <= op < 0x200 and op - 0x180 in VOP1_F64: return VOP1_F64[op - 0x180][0] + "_e64"
  return {0x25B: "v_permlane16_b32", 0x25C: "v_permlanex16_b32", 0x311: "v_pack_b32_f16", 0x12F: "v_cvt_pk_rtz_f16_f32",
          0x136: "v_fmac_f16_e64", 0x25D: "v_cndmask_b16", 0x33D: "v_lshrrev_b64",
          0x33E: "v_ashrrev_i64", 0x32B: "v_ldexp_f64", 0x2FD: "v_div_scale_f64",
          0x238: "v_div_fmas_f64", VOP3_ADD_CO_U32: "v_add_co_u32", 0x2FC: "v_div_scale_f32", 0x237: "v_div_fmas_f32",
          VOP3_SUB_CO_U32: "v_sub_co_u32", VOP3_MAD_U64_U32: "v_mad_u64_u32", 0x360: "v_readlane_b32",
          0x361: "v_writelane_b32",
          VOP3_LSHLREV_B64: "v_lshlrev_b64"}.get(op, f"vop3_{op:#x}")


class Memory:
  """Byte access to host addresses (the GPU VA space of the mock)."""
  def read(self, addr: int, n: int) -> bytes: return ctypes.string_at(addr, n)
  def write(self, addr: int, data: bytes) -> None: ctypes.memmove(addr, data, len(data))
  def read32(self, addr: int) -> int: return ctypes.c_uint32.from_address(addr).value


class VGPRFile(dict[int, list[int]]):
  """A wave's VGPRs, register number -> one value per lane (`lanes`: 32, or 64 for a wave64); a register is allocated
  (zeros) when first touched, so a wave costs only the registers its code uses. Registers 256..259 are the
  emulator's hidden operands (DPP, SDWA)."""
  lanes = WAVE

  def __missing__(self, r: int) -> list[int]:
    if not 0 <= r <= 259: raise IndexError(f"VGPR {r} is outside v0..v255")
    v = self[r] = [0] * self.lanes
    return v


class VGPRFile64(VGPRFile):
  """The VGPRs of a wave64: 64 lane values per register."""
  lanes = 64


class PrivateMemory(Memory):
  """One lane's private (scratch) memory: byte offsets 0..size-1, bounds-checked. With no size from the dispatch
  (size None) it grows on demand up to SCRATCH_GROW_LIMIT bytes."""
  SCRATCH_GROW_LIMIT = 1 << 20

  def __init__(self, size: int | None):
    self.size, self.buf = size, bytearray(size or 0)

  def _at(self, addr: int, n: int) -> int:
    limit = self.size if self.size is not None else self.SCRATCH_GROW_LIMIT
    if addr < 0 or addr + n > limit:
      raise RuntimeError(f"scratch access of {n} bytes at {addr:#x} is outside the lane's {limit} private bytes"
                         + ("" if self.size is not None else " (no size given: the growth limit)"))
    if addr + n > len(self.buf): self.buf.extend(bytes(addr + n - len(self.buf)))
    return addr

  def read(self, addr: int, n: int) -> bytes: return bytes(self.buf[self._at(addr, n):addr + n])
  def write(self, addr: int, data: bytes) -> None: self.buf[self._at(addr, len(data)):addr + len(data)] = data
  def read32(self, addr: int) -> int: return int.from_bytes(self.read(addr, 4), "little")


@dataclass
class Wave:
  """The state of one wave32: SGPRs (with VCC, M0, EXEC at their operand codes), VGPRs by lane, SCC, PC.
  `size` is the lane count (`Wave64` for the 64 lanes of gfx9 waves)."""
  size: ClassVar[int] = WAVE
  sgpr: list[int] = field(default_factory=lambda: [0] * 128)
  vgpr: VGPRFile = field(default_factory=lambda: VGPRFile())
  scc: int = 0
  pc: int = 0  # byte offset from code_addr, where the wave started
  code_addr: int = 0
  lds: bytearray = field(default_factory=bytearray)  # the work-group's LDS (shared by its waves)
  # private (scratch) bytes per lane, from the dispatch (the kernel descriptor's private_segment_fixed_size, or more
  # when the stack is dynamic); None: not given, each lane's memory grows on demand (PrivateMemory)
  scratch_size: int | None = None
  scratch: dict[int, PrivateMemory] = field(default_factory=dict)

  def private(self, lane: int) -> PrivateMemory:
    """Lane `lane`'s private memory, created on first use."""
    if (m := self.scratch.get(lane)) is None: m = self.scratch[lane] = PrivateMemory(self.scratch_size)
    return m

  @property
  def exec(self) -> int: return self.sgpr[EXEC_LO]
  @exec.setter
  def exec(self, v: int) -> None: self.sgpr[EXEC_LO] = v & MASK32
  @property
  def vcc(self) -> int: return self.sgpr[VCC_LO]
  @vcc.setter
  def vcc(self, v: int) -> None: self.sgpr[VCC_LO] = v & MASK32

  def lanes(self) -> tuple[int, ...]:
    """The active lanes in order (a cached tuple per EXEC value)."""
    return _lanes_cached(self.sgpr[EXEC_LO] & MASK32)


@functools.lru_cache(maxsize=4096)
def _lanes_cached(mask: int) -> tuple[int, ...]: return tuple(i for i in range(WAVE) if mask >> i & 1)


@dataclass
class Wave64(Wave):
  """A wave64 (gfx9/CDNA): 64 lanes; EXEC and VCC are 64-bit masks in the SGPR pairs exec_lo/hi and vcc_lo/hi."""
  size: ClassVar[int] = 64
  vgpr: VGPRFile = field(default_factory=lambda: VGPRFile64())
  agpr: VGPRFile = field(default_factory=lambda: VGPRFile64())  # the accumulation registers (a0..a255) of MFMA

  @property
  def exec(self) -> int: return self.sgpr[EXEC_LO] | (self.sgpr[EXEC_HI] << 32)
  @exec.setter
  def exec(self, v: int) -> None: self.sgpr[EXEC_LO], self.sgpr[EXEC_HI] = v & MASK32, (v >> 32) & MASK32
  @property
  def vcc(self) -> int: return self.sgpr[VCC_LO] | (self.sgpr[VCC_HI] << 32)
  @vcc.setter
  def vcc(self, v: int) -> None: self.sgpr[VCC_LO], self.sgpr[VCC_HI] = v & MASK32, (v >> 32) & MASK32

  def lanes(self) -> tuple[int, ...]: return _lanes_cached64(self.sgpr[EXEC_LO] | (self.sgpr[EXEC_HI] << 32))


@functools.lru_cache(maxsize=4096)
def _lanes_cached64(mask: int) -> tuple[int, ...]: return tuple(i for i in range(64) if mask >> i & 1)




class Emulator:
  """Runs waves of one dispatch: `run(wave, code_addr)` executes from `code_addr` until s_endpgm."""
  decode = staticmethod(decode)  # the instruction decoder (an architecture subclass brings its own)

  def __init__(self, mem: Memory | None = None, max_steps: int = 1_000_000):
    self.mem, self.max_steps = mem or Memory(), max_steps
    self.steps = 0

  # operands
  def sread(self, w: Wave, code: int, inst: Inst) -> int:
    if code < 106 or code in (VCC_LO, VCC_HI, M0, EXEC_LO, EXEC_HI): return w.sgpr[code]
    if code == NULL: return 0
    if 128 <= code <= 192: return code - 128
    if 193 <= code <= 208: return (-(code - 192)) & MASK32
    if code in INLINE_F32: return INLINE_F32[code]
    if code == SCC_SRC: return w.scc
    if code == LITERAL: return inst.literal or 0
    raise UnsupportedInstruction(f"{inst.name}: scalar operand code {code}")

  def sread64(self, w: Wave, code: int, inst: Inst) -> int:
    if code < 106 or code in (VCC_LO, EXEC_LO): return w.sgpr[code] | (w.sgpr[code + 1] << 32)
    if code == LITERAL:  # how a 32-bit literal extends to 64 bits is not pinned down here: refuse, never guess
      raise UnsupportedInstruction(f"{inst.name}: a literal in a 64-bit scalar operand at {w.pc:#x}")
    v = self.sread(w, code, inst)
    return v | (MASK64 ^ MASK32 if 193 <= code <= 208 else 0)

  def swrite(self, w: Wave, code: int, v: int) -> None:
    if code != NULL: w.sgpr[code] = v & MASK32

  def rmask(self, w: Wave, code: int, inst: Inst) -> int:
    """A lane mask operand: one SGPR (wave32) or an SGPR pair (wave64)."""
    return self.sread64(w, code, inst) if w.size == 64 else self.sread(w, code, inst)

  def wmask(self, w: Wave, code: int, v: int) -> None:
    """Write a lane mask: one SGPR (wave32) or an SGPR pair (wave64)."""
    self.swrite(w, code, v)
    if w.size == 64: self.swrite(w, code + 1, v >> 32)

  def vsrc16(self, w: Wave, code: int, lane: int, inst: Inst, fp: bool) -> int:
    """A 16-bit operand: a VGPR half (v.l / v.h by bit 7 of the register number) or a scalar's low 16 bits
    (float inline constants are half precision for 16-bit float ops)."""
    if code >= 256: return (w.vgpr[(code - 256) & 0x7F][lane] >> (16 * ((code - 256) >> 7))) & 0xFFFF
    if fp and code in INLINE_F32: return _f16_bits(f32(INLINE_F32[code]))
    return self.sread(w, code, inst) & 0xFFFF

  def col16(self, w: Wave, code: int, lanes: tuple[int, ...], inst: Inst, fp: bool) -> list[int]:
    """A 16-bit operand for every active lane (see vsrc16): a VGPR half by bit 7 of the register, or a scalar."""
    if code >= 256:
      vr, sh = w.vgpr[(code - 256) & 0x7F], 16 * ((code - 256) >> 7)
      return [(vr[ln] >> sh) & 0xFFFF for ln in lanes]
    return [self.vsrc16(w, code, 0, inst, fp)] * len(lanes)

  @staticmethod
  def store16(w: Wave, reg: int, hi: int, lanes: tuple[int, ...], vals: list[int]) -> None:
    """Write a column of 16-bit results into the low (hi = 0) or high half of VGPR `reg`."""
    vd, sh = w.vgpr[reg], 16 * hi
    keep = ~(0xFFFF << sh) & MASK32
    for ln, v in zip(lanes, vals): vd[ln] = (vd[ln] & keep) | ((v & 0xFFFF) << sh)

  def vwrite16(self, w: Wave, d8: int, lane: int, v: int) -> None:
    """Write a VGPR half: d8 is the register with bit 7 set for the high half (the true16 e32 encoding)."""
    reg, sh = d8 & 0x7F, 16 * (d8 >> 7)
    w.vgpr[reg][lane] = (w.vgpr[reg][lane] & ~(0xFFFF << sh) & MASK32) | ((v & 0xFFFF) << sh)

  def vsrc(self, w: Wave, code: int, lane: int, inst: Inst) -> int:
    return w.vgpr[code - 256][lane] if code >= 256 else self.sread(w, code, inst)

  def begin_dispatch(self) -> None:
    """Forget decoded code: a new dispatch may run different bytes at the same address."""
    self._code: dict[int, dict[int, tuple[Inst, Callable[[Wave, Inst], None] | None]]] = {}

  # run, run_group and run_launch use the batched engine (emu/batch.py: all waves in lockstep as numpy columns, each
  # code object decoded once); batched = False runs the per-wave interpreter below, the reference it is tested against
  batched = True

  def run(self, w: Wave, code_addr: int) -> None:
    """Execute one wave from `code_addr` until s_endpgm; s_barrier is a no-op (a work-group of one wave)."""
    if not self.batched: return self.run_reference(w, code_addr)
    from tiny_runtime_amd.emu.batch import run_waves
    run_waves(self, [[w]], code_addr)

  def run_group(self, waves: list[Wave], code_addr: int) -> None:
    """Execute the waves of one work-group until each reaches s_endpgm, meeting at barriers."""
    if not self.batched: return self.run_group_reference(waves, code_addr)
    from tiny_runtime_amd.emu.batch import run_waves
    run_waves(self, [waves], code_addr)

  def run_launch(self, code_addr: int, launch: Any) -> None:
    """Execute every wave of a dispatch (an `emu.batch.Launch`: the registers the dispatcher sets up) together."""
    from tiny_runtime_amd.emu.batch import launch_waves, run_launch
    if self.batched: run_launch(self, code_addr, launch)
    else:
      for group in launch_waves(launch): self.run_group_reference(group, code_addr)

  def run_reference(self, w: Wave, code_addr: int) -> None:
    """The per-wave interpreter: execute one wave from `code_addr` until s_endpgm."""
    for _ in self.steps_until_barrier(w, code_addr): pass

  def run_group_reference(self, waves: list[Wave], code_addr: int) -> None:
    """The per-wave interpreter on the waves of one work-group, round-robin between barriers: each wave runs until it
    reaches s_barrier (or ends), and all continue once every live wave has arrived."""
    gens = [self.steps_until_barrier(w, code_addr, barriers=len(waves) > 1) for w in waves]
    while gens:
      alive = []
      for g in gens:
        try:
          next(g)
          alive.append(g)
        except StopIteration: pass
      gens = alive

  def steps_until_barrier(self, w: Wave, code_addr: int, barriers: bool = False) -> Iterator[None]:
    """Execute from `code_addr` until s_endpgm (or raise after max_steps), yielding at each s_barrier when
    `barriers`. Each instruction's bytes are read when first reached (16 bytes: the longest encoding, never far past
    the program) and decoded once per dispatch."""
    if not hasattr(self, "_code"): self.begin_dispatch()
    cache = self._code.setdefault(code_addr, {})
    w.pc, w.code_addr = 0, code_addr
    for _ in range(self.max_steps):
      if (ent := cache.get(w.pc)) is None:  # hot loop: walrus on purpose; the handler is looked up once
        inst = self.decode(self.mem.read(code_addr + w.pc, 16), 0)
        fn = None if inst.fmt == "SOPP" else self.dpp if "dpp" in inst.f else getattr(self, inst.fmt.lower())
        ent = cache[w.pc] = (inst, fn)
      inst, fn = ent
      self.steps += 1
      nxt = w.pc + inst.size
      if fn is None:
        if inst.op == 48: return
        if inst.op == 61 and barriers: yield
        nxt = self.sopp(w, inst, nxt)
      elif (to := fn(w, inst)) is not None: nxt = to  # s_setpc/s_swappc: a new pc offset
      w.pc = nxt
    raise RuntimeError(f"wave did not reach s_endpgm in {self.max_steps} instructions")

  def dpp(self, w: Wave, inst: Inst) -> None:
    """DPP on VOP1/VOP2/VOPC, and on VOP3 for the 32-bit ops (promoted VOP1/VOP2/VOPC ops and the VOP3 table)."""
    op = inst.op
    if inst.fmt != "VOP3" or (op not in VOP3SD and op not in VOP3_16 and (
        (0x100 <= op < 0x180 and op - 0x100 in VOP2) or (0x180 <= op < 0x200 and op - 0x180 in VOP1) or op in VOP3
        or (op < 0x100 and (0x10 <= op & 0x7F < 0x20 or 0x40 <= op & 0x7F < 0x50)))):
      return self._dpp(w, inst)
    raise UnsupportedInstruction(f"{inst.name}: DPP on this VOP3 opcode ({op:#x}) at {w.pc:#x}")

  def _dpp(self, w: Wave, inst: Inst) -> None:
    """Run a VOP1/VOP2/VOPC whose src0 comes through DPP. DPP16 (RDNA3 ISA "DPP16"): within each row of 16 lanes,
    quad_perm (0x00-0xFF), row_shl/shr/ror:1-15 (0x101/0x111/0x121+), row_mirror (0x140), row_half_mirror (0x141),
    row_share (0x150+n: lane n of the row), row_xmask (0x160+n: lane i^n); a source lane outside the row or inactive
    (unless FI) is invalid: with BOUND_CTRL the lane reads 0, else it does not write. ROW_MASK / BANK_MASK (lanes
    4b..4b+3 of each row) disable writes. DPP8: lane i reads lane (i & ~7) | sel[i % 8]; an inactive source reads 0
    unless FI. src0's abs/neg (bits 21/20) act on the fetched float32."""
    f, d, op = inst.f, inst.f["dpp"], inst.op
    if (inst.fmt == "VOP1" and (op in VOP1_16 or op in (11, 28) or op in VOP1_F64 or op in (15, 16))) or \
        (inst.fmt == "VOP2" and (op in VOP2_16 or op in (54, 55, 56))) or \
        (inst.fmt == "VOPC" and ((op & 0x7F) < 0x10 or 0x20 <= (op & 0x7F) < 0x40 or 0x50 <= (op & 0x7F) < 0x60
                                 or op & 0x7F in (0x7D, 0x7F))):
      raise UnsupportedInstruction(f"{inst.name}: DPP on a 16/64-bit operand at {w.pc:#x}")
    src, ex = w.vgpr[d & 0xFF], w.exec
    vals, write = [0] * WAVE, 0
    if f["dpp_kind"] == DPP16:
      ctrl, fi, bc = (d >> 8) & 0x1FF, d >> 18 & 1, d >> 19 & 1
      bank, row = (d >> 24) & 0xF, (d >> 28) & 0xF
      if d >> 22 & 3 and inst.fmt != "VOP3": raise UnsupportedInstruction(f"{inst.name}: DPP src1 abs/neg at {w.pc:#x}")
      for ln in range(WAVE):
        i, base = ln & 15, ln & ~15
        if ctrl < 0x100: j = (ctrl >> (2 * (i & 3))) & 3 | (i & ~3)
        elif 0x101 <= ctrl <= 0x10F: j = i + (ctrl & 15)
        elif 0x111 <= ctrl <= 0x11F: j = i - (ctrl & 15)
        elif 0x121 <= ctrl <= 0x12F: j = (i - (ctrl & 15)) & 15
        elif ctrl == 0x140: j = 15 - i
        elif ctrl == 0x141: j = (i & 8) | (7 - (i & 7))
        elif 0x150 <= ctrl <= 0x15F: j = ctrl & 15
        elif 0x160 <= ctrl <= 0x16F: j = i ^ (ctrl & 15)
        else: raise UnsupportedInstruction(f"{inst.name}: DPP control {ctrl:#x} at {w.pc:#x}")
        enabled = (row >> (ln >> 4) & 1) and (bank >> (i >> 2) & 1)
        valid = 0 <= j < 16 and (fi or ex >> (base + j) & 1)
        if valid: vals[ln] = src[base + j]
        if enabled and (valid or bc): write |= 1 << ln
    else:
      sel, fi = d >> 8, f["dpp_kind"] == DPP8_FI
      for ln in range(WAVE):
        j = (ln & ~7) | ((sel >> (3 * (ln & 7))) & 7)
        vals[ln] = src[j] if fi or ex >> j & 1 else 0
      write = MASK32
    if f["dpp_kind"] == DPP16 and d >> 20 & 3 and inst.fmt != "VOP3":  # src0 neg (bit 20) / abs (bit 21)
      vals = [((v & 0x7FFFFFFF) if d >> 21 & 1 else v) ^ (0x80000000 if d >> 20 & 1 else 0) for v in vals]
    w.vgpr[256] = vals  # a hidden VGPR holds the fetched src0 (operand code 512)
    inner = Inst(inst.fmt, inst.op, {k: v for k, v in inst.f.items() if k not in ("dpp", "dpp_kind")}, inst.size,
                 inst.name, inst.literal)
    inner.f["src0"] = 512
    saved = w.exec
    w.exec = saved & write
    try: getattr(self, inst.fmt.lower())(w, inner)
    finally:
      if not (inst.fmt == "VOPC" and inst.op & 0x80): w.exec = saved  # v_cmpx writes EXEC itself

  # scalar
  def sopp(self, w: Wave, inst: Inst, nxt: int) -> int:
    op, target = inst.op, nxt + sext(inst.f["simm16"], 16) * 4
    # nop, sleep, prefetch, clause, delay_alu, waits, sendmsg, setprio, barrier; denorm_mode: denormals are always kept
    if op in (0, 3, 4, 5, 7, 8, 9, 18, 31, 53, 54, 61): return nxt
    if op == 17 and inst.f["simm16"] == 0: return nxt  # s_round_mode to nearest-even (the only mode emulated)
    taken = {32: True, 33: w.scc == 0, 34: w.scc == 1, 35: w.vcc == 0, 36: w.vcc != 0, 37: w.exec == 0,
             38: w.exec != 0}.get(op)
    if taken is None: raise UnsupportedInstruction(f"SOPP opcode {op} at {w.pc:#x}")
    return target if taken else nxt

  def sop1(self, w: Wave, inst: Inst) -> int | None:
    op, d, s = inst.op, inst.f["sdst"], inst.f["ssrc0"]
    if op in (71, 72, 73):  # s_getpc_b64 (address of the next instruction) / s_setpc_b64 / s_swappc_b64
      here = w.code_addr + w.pc + inst.size
      if op != 72:
        self.swrite(w, d, here)
        self.swrite(w, d + 1, here >> 32)
      if op == 71: return None
      return (self.sread64(w, s, inst) - w.code_addr) & MASK64
    if op in (9, 25):  # s_ctz_i32_b64 / s_bcnt1_i32_b64
      v = self.sread64(w, s, inst)
      if op == 25:
        r = bin(v).count("1")
        w.scc = int(r != 0)
      else: r = MASK32 if v == 0 else (v & -v).bit_length() - 1
      self.swrite(w, d, r)
      return None
    if op == 0: self.swrite(w, d, self.sread(w, s, inst))
    elif op == 1:
      v = self.sread64(w, s, inst)
      self.swrite(w, d, v)
      self.swrite(w, d + 1, v >> 32)
    elif op == 4:  # s_brev_b32
      self.swrite(w, d, int(f"{self.sread(w, s, inst):032b}"[::-1], 2))
    elif op == 21:  # s_abs_i32
      v = abs(i32(self.sread(w, s, inst))) & MASK32
      self.swrite(w, d, v)
      w.scc = int(v != 0)
    elif op in (14, 15):  # s_sext_i32_i8 / s_sext_i32_i16
      self.swrite(w, d, sext(self.sread(w, s, inst) & (0xFF if op == 14 else 0xFFFF), 8 if op == 14 else 16))
    elif op == 30:
      v = ~self.sread(w, s, inst) & MASK32
      self.swrite(w, d, v)
      w.scc = int(v != 0)
    elif op in SAVEEXEC:  # s_*_saveexec_b32: sdst = exec; exec = op(src, exec)
      old, src = w.exec, self.sread(w, s, inst)
      w.exec = SAVEEXEC[op][1](src, old)
      self.swrite(w, d, old)
      w.scc = int(w.exec != 0)
    elif op == 2:  # s_cmov_b32
      if w.scc: self.swrite(w, d, self.sread(w, s, inst))
    elif op in (8, 10):  # s_ctz_i32_b32 / s_clz_i32_u32: -1 when no bit is set
      v = self.sread(w, s, inst)
      self.swrite(w, d, MASK32 if v == 0 else ((v & -v).bit_length() - 1 if op == 8 else 32 - v.bit_length()))
    elif op in (22, 24):  # s_bcnt0_i32_b32 / s_bcnt1_i32_b32
      v = self.sread(w, s, inst)
      r = bin(v).count("1") if op == 24 else 32 - bin(v).count("1")
      self.swrite(w, d, r)
      w.scc = int(r != 0)
    elif op in (16, 18):  # s_bitset0_b32 / s_bitset1_b32: D[S0 & 31] = 0 / 1
      bit = 1 << (self.sread(w, s, inst) & 31)
      self.swrite(w, d, (w.sgpr[d] | bit) if op == 18 else (w.sgpr[d] & ~bit))
    else: raise UnsupportedInstruction(f"SOP1 opcode {op} at {w.pc:#x}")
    return None

  def sop2(self, w: Wave, inst: Inst) -> None:
    op, d = inst.op, inst.f["sdst"]
    a, b = self.sread(w, inst.f["ssrc0"], inst), self.sread(w, inst.f["ssrc1"], inst)
    if op in SOP2:
      r = SOP2[op][1](a, b)
      if op == 0: w.scc = int(r > MASK32)
      elif op == 1: w.scc = int(b > a)
      elif op in (2, 3): w.scc = int(r != sext(r & MASK32, 32))  # signed overflow
      elif op in (6, 8, 10, 12, 22, 24, 26, 28, 30, 32, 34, 36, 39): w.scc = int(r & MASK32 != 0)
      elif op in (14, 15, 16, 17): w.scc = int(r > MASK32)
      elif op in (18, 19, 20, 21): w.scc = int(r == (i32(a) if op in (18, 20) else a))
      self.swrite(w, d, r)
    elif op in (SOP2_ADDC, SOP2_SUBB):
      r = a + b + w.scc if op == SOP2_ADDC else a - b - w.scc
      w.scc = int(r > MASK32) if op == SOP2_ADDC else int(r < 0)
      self.swrite(w, d, r)
    elif op == SOP2_CSELECT_B32: self.swrite(w, d, a if w.scc else b)
    elif op == SOP2_BFE_U32:
      r = (a >> (b & 31)) & ((1 << ((b >> 16) & 0x7F)) - 1)
      self.swrite(w, d, r)
      w.scc = int(r != 0)
    elif op in SOP2_B64:
      a64 = self.sread64(w, inst.f["ssrc0"], inst)
      b64 = b if op in (9, 11, 13, 40, 41) else self.sread64(w, inst.f["ssrc1"], inst)
      off, width = b & 63, (b >> 16) & 0x7F
      field = (a64 >> off) & ((1 << width) - 1)
      r = {9: lambda: (a64 << (b & 63)) & MASK64, 11: lambda: a64 >> (b & 63), 13: lambda: sext(a64, 64) >> (b & 63),
           23: lambda: a64 & b64, 25: lambda: a64 | b64, 27: lambda: a64 ^ b64, 35: lambda: a64 & ~b64,
           37: lambda: a64 | (~b64 & MASK64), 40: lambda: field,
           41: lambda: sext(field, width) if width else 0, 49: lambda: a64 if w.scc else b64}[op]() & MASK64
      self.swrite(w, d, r)
      self.swrite(w, d + 1, r >> 32)
      if op != 49: w.scc = int(r != 0)
    else: raise UnsupportedInstruction(f"SOP2 opcode {op} at {w.pc:#x}")

  def sopk(self, w: Wave, inst: Inst) -> None:
    op, d, k = inst.op, inst.f["sdst"], sext(inst.f["simm16"], 16)
    if op == 0: self.swrite(w, d, k)
    elif 3 <= op <= 8: w.scc = int(_SOPC_FN[op - 3](i32(w.sgpr[d]), k))  # s_cmpk_{eq,lg,gt,ge,lt,le}_i32
    elif 9 <= op <= 14: w.scc = int(_SOPC_FN[op - 9](w.sgpr[d], inst.f["simm16"]))  # s_cmpk_*_u32 (zero-extended)
    elif op == 15: self.swrite(w, d, i32(w.sgpr[d]) + k)
    elif op == 2:  # s_cmovk_i32
      if w.scc: self.swrite(w, d, k)
    elif op == 16: self.swrite(w, d, i32(w.sgpr[d]) * k)
    elif 23 <= op <= 26: pass  # s_waitcnt_vmcnt/vscnt/expcnt/lgkmcnt: memory is synchronous here
    else: raise UnsupportedInstruction(f"SOPK opcode {op} at {w.pc:#x}")

  def sopc(self, w: Wave, inst: Inst) -> None:
    op = inst.op
    if op >= len(SOPC_NAMES): raise UnsupportedInstruction(f"SOPC opcode {op} at {w.pc:#x}")
    if 12 <= op < 16:  # s_bitcmp{0,1}_b{32,64}: SCC = bit S1[4:0] (b64: S1[5:0]) of S0 is 0 (bitcmp0) / 1 (bitcmp1)
      b64 = op >= 14
      a = self.sread64(w, inst.f["ssrc0"], inst) if b64 else self.sread(w, inst.f["ssrc0"], inst)
      bit = (a >> (self.sread(w, inst.f["ssrc1"], inst) & (63 if b64 else 31))) & 1
      w.scc = int(bit == op % 2)
      return
    if op >= 16:  # s_cmp_eq_u64 / s_cmp_lg_u64
      a, b = self.sread64(w, inst.f["ssrc0"], inst), self.sread64(w, inst.f["ssrc1"], inst)
      w.scc = int((a == b) if op == 16 else (a != b))
      return
    a, b = self.sread(w, inst.f["ssrc0"], inst), self.sread(w, inst.f["ssrc1"], inst)
    if op < 6: a, b = i32(a), i32(b)
    w.scc = int(_SOPC_FN[op % 6](a, b))

  def smem(self, w: Wave, inst: Inst) -> None:
    if inst.op not in SMEM_LOADS: raise UnsupportedInstruction(f"SMEM opcode {inst.op} at {w.pc:#x}")
    f = inst.f
    base = w.sgpr[f["sbase"]] | (w.sgpr[f["sbase"] + 1] << 32)
    off = f["offset"] + (w.sgpr[f["soffset"]] if f["soffset"] != NULL else 0)
    data = self.mem.read((base + off) & ~3, 4 * SMEM_LOADS[inst.op])
    for i, v in enumerate(struct.unpack(f"<{SMEM_LOADS[inst.op]}I", data)): w.sgpr[f["sdata"] + i] = v

  # vector
  def vop1(self, w: Wave, inst: Inst) -> None:
    op, f = inst.op, inst.f
    if op == 2:  # v_readfirstlane_b32: an SGPR gets the first active lane's value
      lanes = w.lanes()
      self.swrite(w, f["vdst"], self.vsrc(w, f["src0"], lanes[0] if lanes else 0, inst))
      return
    if op in VOP1_F64:
      _, s64, d64, fn = VOP1_F64[op]
      for ln in w.lanes():
        r = fn(self.vsrc64(w, f["src0"], ln, inst, fp=True) if s64 else self.vsrc(w, f["src0"], ln, inst))
        if d64: self.vwrite64(w, f["vdst"], ln, r)
        else: w.vgpr[f["vdst"]][ln] = r & MASK32
      return
    if op in (15, 16):  # v_cvt_f32_f64 / v_cvt_f64_f32
      for ln in w.lanes():
        if op == 16: r = struct.unpack("<Q", struct.pack("<d", f32(self.vsrc(w, f["src0"], ln, inst))))[0]
        else: r = bits32(struct.unpack("<d", struct.pack("<Q", self.vsrc64(w, f["src0"], ln, inst)))[0])
        w.vgpr[f["vdst"]][ln] = r & MASK32
        if op == 16: w.vgpr[f["vdst"] + 1][ln] = r >> 32
      return
    if op in (10, 11, 28):  # 16-bit: v_cvt_f16_f32, v_cvt_f32_f16, v_mov_b16 (true16 halves: register bit 7 = .h)
      for ln in w.lanes():
        if op == 10: self.vwrite16(w, f["vdst"], ln, _f16_bits(f32(self.vsrc(w, f["src0"], ln, inst))))
        elif op == 11: w.vgpr[f["vdst"]][ln] = bits32(_f16(self.vsrc16(w, f["src0"], ln, inst, fp=True)))
        else: self.vwrite16(w, f["vdst"], ln, self.vsrc16(w, f["src0"], ln, inst, fp=False))
      return
    if op in (106, 107):  # v_cvt_i32_i16 / v_cvt_u32_u16: a 16-bit source (bit 7 = .h), a 32-bit result
      for ln in w.lanes():
        v = self.vsrc16(w, f["src0"], ln, inst, False)
        w.vgpr[f["vdst"]][ln] = _s16(v) & MASK32 if op == 106 else v
      return
    if op in VOP1_16:  # 16-bit ops: operand and destination halves by register bit 7
      _, _, fp, fn = VOP3_16[VOP1_16[op]]
      lanes = w.lanes()
      self.store16(w, f["vdst"] & 0x7F, f["vdst"] >> 7, lanes, vec_f16(fn, self.col16(w, f["src0"], lanes, inst, fp)))
      return
    if inst.op not in VOP1: raise UnsupportedInstruction(f"VOP1 opcode {inst.op} ({inst.name}) at {w.pc:#x}")
    lanes = w.lanes()
    self.store(w, f["vdst"], lanes, list(map(VOP1[op][1], self.col(w, f["src0"], lanes, inst))))

  def col(self, w: Wave, code: int, lanes: tuple[int, ...], inst: Inst) -> list[int]:
    """A 32-bit source operand for every active lane (a scalar operand repeated); always a new list."""
    if code >= 256:
      vr = w.vgpr[code - 256]
      return vr[:] if len(lanes) == len(vr) else [vr[ln] for ln in lanes]
    return [self.sread(w, code, inst)] * len(lanes)

  def col64(self, w: Wave, code: int, lanes: tuple[int, ...], inst: Inst) -> list[int]:
    """A 64-bit integer operand for every active lane: a VGPR pair or a 64-bit scalar (see sread64)."""
    if code >= 256:
      lo, hi = w.vgpr[code - 256], w.vgpr[code - 255]
      return [lo[ln] | (hi[ln] << 32) for ln in lanes]
    if code in INLINE_F32: raise UnsupportedInstruction(f"{inst.name}: a float constant as a 64-bit integer operand")
    return [self.sread64(w, code, inst)] * len(lanes)

  @staticmethod
  def store(w: Wave, d: int, lanes: tuple[int, ...], vals: list[int]) -> None:
    """Write a column of results to VGPR `d` for the active lanes (`vals` a fresh list, one per active lane)."""
    if len(lanes) == w.size: w.vgpr[d] = vals
    else:
      vd = w.vgpr[d]
      for ln, v in zip(lanes, vals): vd[ln] = v

  def _vop2_lane(self, w: Wave, op: int, a: int, b: int, d: int, ln: int, inst: Inst, k: int = 0) -> None:
    if op in VOP2: w.vgpr[d][ln] = VOP2[op][1](a, b)
    elif op == VOP2_CNDMASK: w.vgpr[d][ln] = b if w.vcc >> ln & 1 else a
    elif op == VOP2_FMAC: w.vgpr[d][ln] = bits32(_fma(f32(a), f32(b), f32(w.vgpr[d][ln])))
    elif op == VOP2_FMAMK: w.vgpr[d][ln] = bits32(_fma(f32(a), f32(k), f32(b)))
    elif op == VOP2_FMAAK: w.vgpr[d][ln] = bits32(_fma(f32(a), f32(b), f32(k)))
    else: raise UnsupportedInstruction(f"VOP2 opcode {op} ({inst.name}) at {w.pc:#x}")

  def vop2(self, w: Wave, inst: Inst) -> None:
    f = inst.f
    if inst.op in VOP2_FLOAT:
      lanes = w.lanes()
      a, b = self.col(w, f["src0"], lanes, inst), self.col(w, 256 + f["vsrc1"], lanes, inst)
      self.store(w, f["vdst"], lanes, vec_f32(VOP2_FLOAT[inst.op], a, b))
      return
    if inst.op in (VOP2_FMAC, VOP2_FMAMK, VOP2_FMAAK):  # by columns; fmamk/fmaak take the literal K
      lanes = w.lanes()
      a, b = self.col(w, f["src0"], lanes, inst), self.col(w, 256 + f["vsrc1"], lanes, inst)
      k = [inst.literal or 0] * len(lanes)
      c = self.col(w, 256 + f["vdst"], lanes, inst) if inst.op == VOP2_FMAC else k
      self.store(w, f["vdst"], lanes, vec_f32(_fma, a, k, b) if inst.op == VOP2_FMAMK else vec_f32(_fma, a, b, c))
      return
    if inst.op in VOP2_16:
      _, _, fp, fn = VOP3_16[VOP2_16[inst.op]]
      lanes = w.lanes()
      a, b = self.col16(w, f["src0"], lanes, inst, fp), self.col16(w, 256 + f["vsrc1"], lanes, inst, fp)
      self.store16(w, f["vdst"] & 0x7F, f["vdst"] >> 7, lanes, vec_f16(fn, a, b))
      return
    if inst.op in (54, 55, 56):  # v_fmac_f16 (D.l += S0*S1), v_fmamk_f16 (S0*K + S1), v_fmaak_f16 (S0*S1 + K)
      k = (inst.literal or 0) & 0xFFFF
      fma = VOP3_16[0x248][3]
      for ln in w.lanes():
        a, b = self.vsrc16(w, f["src0"], ln, inst, True), self.vsrc16(w, 256 + f["vsrc1"], ln, inst, True)
        r = fma(a, b, self.vsrc16(w, 256 + f["vdst"], ln, inst, True)) if inst.op == 54 else \
          fma(a, k, b) if inst.op == 55 else fma(a, b, k)
        self.vwrite16(w, f["vdst"], ln, r)
      return
    if inst.op == 47:  # v_cvt_pk_rtz_f16_f32: D = {rtz_f16(S1), rtz_f16(S0)}
      for ln in w.lanes():
        a, b = self.vsrc(w, f["src0"], ln, inst), w.vgpr[f["vsrc1"]][ln]
        w.vgpr[f["vdst"]][ln] = _f16_bits_rtz(f32(a)) | (_f16_bits_rtz(f32(b)) << 16)
      return
    if inst.op in (VOP2_ADD_CO_CI, VOP2_ADD_CO_CI + 1, VOP2_ADD_CO_CI + 2):  # add/sub/subrev_co_ci_u32: VCC in/out
      carry = 0
      for ln in w.lanes():
        a, b, c = self.vsrc(w, f["src0"], ln, inst), w.vgpr[f["vsrc1"]][ln], w.vcc >> ln & 1
        r = a + b + c if inst.op == 32 else a - b - c if inst.op == 33 else b - a - c
        w.vgpr[f["vdst"]][ln] = r & MASK32
        if r > MASK32 or r < 0: carry |= 1 << ln
      w.vcc = (w.vcc & ~w.exec) | carry
      return
    lanes = w.lanes()
    if inst.op in VOP2:  # by columns
      self.store(w, f["vdst"], lanes, list(map(VOP2[inst.op][1], self.col(w, f["src0"], lanes, inst),
                                               self.col(w, 256 + f["vsrc1"], lanes, inst))))
      return
    for ln in lanes:
      self._vop2_lane(w, inst.op, self.vsrc(w, f["src0"], ln, inst), w.vgpr[f["vsrc1"]][ln], f["vdst"], ln, inst,
                      inst.literal or 0)

  def vsrc64(self, w: Wave, code: int, lane: int, inst: Inst, fp: bool = False) -> int:
    """A 64-bit operand: a VGPR pair, an SGPR pair, a sign-extended inline integer, an inline double (fp), or a
    literal (fp: the high 32 bits of a double)."""
    if code >= 256: return w.vgpr[code - 256][lane] | (w.vgpr[code - 255][lane] << 32)
    if fp and code in INLINE_F64: return INLINE_F64[code]
    if fp and code == LITERAL: return (inst.literal or 0) << 32
    if code == LITERAL or code in INLINE_F32: raise UnsupportedInstruction(f"{inst.name}: 64-bit literal/float operand")
    return self.sread64(w, code, inst)

  def vwrite64(self, w: Wave, d: int, lane: int, v: int) -> None:
    w.vgpr[d][lane], w.vgpr[d + 1][lane] = v & MASK32, (v >> 32) & MASK32

  def vopc(self, w: Wave, inst: Inst) -> None:
    _, fn = vopc_compare(inst.op)
    base = inst.op & 0x7F
    mask, wide, fp = 0, 0x20 <= base < 0x30 or 0x50 <= base < 0x60, 0x20 <= base < 0x30
    if 0x10 <= base < 0x20 or 0x40 <= base < 0x50 or base == 0x7E:  # 32-bit operands: by columns
      lanes = w.lanes()
      a, b = self.col(w, inst.f["src0"], lanes, inst), self.col(w, 256 + inst.f["vsrc1"], lanes, inst)
      if 0x10 <= base < 0x20 and lanes:  # float32: convert the columns at once
        si, sf = _structs(len(lanes))
        a, b, fn = list(sf.unpack(si.pack(*a))), list(sf.unpack(si.pack(*b))), _F32_FN[base]
      mask = sum(1 << ln for ln, x, y in zip(lanes, a, b) if fn(x, y))
      if inst.op & 0x80: w.exec = mask
      else: w.vcc = mask
      return
    for ln in w.lanes():
      if 0x30 <= base < 0x40 or base < 0x10 or base == 0x7D:  # 16-bit: VGPR halves by register bit 7
        fp16 = base < 0x10 or base == 0x7D
        a, b = self.vsrc16(w, inst.f["src0"], ln, inst, fp16), self.vsrc16(w, 256 + inst.f["vsrc1"], ln, inst, fp16)
      elif base == 0x7F: a, b = self.vsrc64(w, inst.f["src0"], ln, inst, True), w.vgpr[inst.f["vsrc1"]][ln]
      elif wide:
        a, b = self.vsrc64(w, inst.f["src0"], ln, inst, fp), self.vsrc64(w, 256 + inst.f["vsrc1"], ln, inst, fp)
      else: a, b = self.vsrc(w, inst.f["src0"], ln, inst), w.vgpr[inst.f["vsrc1"]][ln]
      if fn(a, b): mask |= 1 << ln
    if inst.op & 0x80: w.exec = mask
    else: w.vcc = mask

  def vopd(self, w: Wave, inst: Inst) -> None:
    f, k = inst.f, inst.literal or 0
    # both halves read their sources before either writes (dual issue); by columns
    results = []
    lanes = w.lanes()
    for which in ("x", "y"):
      op, s0, s1, d = f[f"op{which}"], f[f"src0{which}"], f[f"vsrc{which}1"], f[f"vdst{which}"]
      a = self.col(w, s0, lanes, inst)
      if op == 8:
        results.append((d, a))
        continue
      b = self.col(w, 256 + s1, lanes, inst)
      if op == 0: r = vec_f32(_fma, a, b, self.col(w, 256 + d, lanes, inst))
      elif op in VOPD_FLOAT: r = vec_f32(VOP2_FLOAT[VOPD_FLOAT[op]], a, b)
      elif op == 1: r = vec_f32(_fma, a, b, [k] * len(lanes))
      elif op == 2: r = vec_f32(_fma, a, [k] * len(lanes), b)
      elif op == 9: r = [y if w.vcc >> ln & 1 else x for ln, x, y in zip(lanes, a, b)]
      elif op in (12, 13):  # v_dual_dot2acc_f32_{f16,bf16}: D += S0.lo*S1.lo + S0.hi*S1.hi (one rounding)
        cvt = _f16 if op == 12 else _bf16
        r = [bits32(math.fsum((cvt(x) * cvt(y), cvt(x >> 16) * cvt(y >> 16), f32(z))))
             for x, y, z in zip(a, b, self.col(w, 256 + d, lanes, inst))]
      elif op in _VOPD_TO_VOP2: r = list(map(VOP2[_VOPD_TO_VOP2[op]][1], a, b))
      else: raise UnsupportedInstruction(f"VOPD opcode {op} at {w.pc:#x}")
      results.append((d, r))
    for d, r in results: self.store(w, d, lanes, r)

  def vop3(self, w: Wave, inst: Inst) -> None:
    f, op = inst.f, inst.op
    if op in VOP3SD: f = {**f, "abs": 0, "opsel": 0, "clamp": 0}  # VOP3SD: bits 14:8 are sdst
    if op in VOP3_16 or op in (0x136, 0x25D) or \
        (op < 0x100 and (0x30 <= op & 0x7F < 0x40 or op & 0x7F < 0x10 or op & 0x7F == 0x7D)):  # 16-bit compares
      self.vop3_16(w, inst)
      return
    if op in (0x25B, 0x25C):  # v_permlane16_b32 / v_permlanex16_b32: lane i reads lane sel[i%16] of its (other) row
      if f["src0"] < 256: raise UnsupportedInstruction(f"{inst.name}: src0 must be a VGPR at {w.pc:#x}")
      sel = self.sread(w, f["src1"], inst) | (self.sread(w, f["src2"], inst) << 32)
      fi, bc, src, ex = f["opsel"] & 1, f["opsel"] >> 1 & 1, w.vgpr[f["src0"] - 256], w.exec
      out = {}
      for ln in w.lanes():
        j = ((ln & 16) ^ (16 if op == 0x25C else 0)) | ((sel >> (4 * (ln & 15))) & 15)
        if fi or ex >> j & 1: out[ln] = src[j]
        elif bc: out[ln] = 0
      for ln, v in out.items(): w.vgpr[f["vdst"]][ln] = v
      return
    if op in (0x1EA, 0x1EB) and not (f["omod"] or f["clamp"] or f["abs"] or f["neg"]):  # v_cvt_{i32_i16,u32_u16}
      for ln in w.lanes():
        v = (self.vsrc(w, f["src0"], ln, inst) >> (16 * (f["opsel"] & 1))) & 0xFFFF
        w.vgpr[f["vdst"]][ln] = _s16(v) & MASK32 if op == 0x1EA else v
      return
    if op in (0x311, 0x12F) and not (f["omod"] or f["clamp"]):  # v_pack_b32_f16 / v_cvt_pk_rtz_f16_f32
      for ln in w.lanes():
        a, b = self.vsrc(w, f["src0"], ln, inst), self.vsrc(w, f["src1"], ln, inst)
        if op == 0x12F:
          if f["opsel"]: raise UnsupportedInstruction(f"{inst.name}: opsel at {w.pc:#x}")
          a, b = (self._f32_mods(v, i, f) for i, v in enumerate((a, b)))
          w.vgpr[f["vdst"]][ln] = _f16_bits_rtz(f32(a)) | (_f16_bits_rtz(f32(b)) << 16)
          continue
        h = [((v >> (16 * (f["opsel"] >> i & 1))) & 0xFFFF) for i, v in enumerate((a, b))]
        h = [(v & (0x7FFF if f["abs"] >> i & 1 else 0xFFFF)) ^ (0x8000 if f["neg"] >> i & 1 else 0)
             for i, v in enumerate(h)]
        w.vgpr[f["vdst"]][ln] = h[0] | (h[1] << 16)
      return
    if op in (0x125, 0x126) and f["clamp"] and not (f["omod"] or f["opsel"]):  # v_add/sub_nc_u32 clamp: saturate
      for ln in w.lanes():
        a, b = self.vsrc(w, f["src0"], ln, inst), self.vsrc(w, f["src1"], ln, inst)
        w.vgpr[f["vdst"]][ln] = max(0, min(MASK32, a + b if op == 0x125 else a - b))
      return
    if (f["omod"] or f["clamp"]) and not f["opsel"] and op in VOP3_F32_RESULT:
      # output modifiers of a float32 result: x2 / x4 / /2 (omod 1/2/3), then clamp to [0, 1] (NaN -> 0)
      self.vop3(w, Inst(inst.fmt, op, {**inst.f, "omod": 0, "clamp": 0}, inst.size, inst.name, inst.literal))
      scale, lanes, vd = (1.0, 2.0, 4.0, 0.5)[f["omod"]], w.lanes(), w.vgpr[f["vdst"]]
      for ln in lanes:
        x = f32(vd[ln]) * scale
        if f["clamp"]: x = 0.0 if x != x else min(max(x, 0.0), 1.0)
        vd[ln] = bits32(x)
      return
    if f["omod"] or f["clamp"] or f["opsel"]:
      raise UnsupportedInstruction(f"{inst.name}: omod/clamp/opsel at {w.pc:#x}")

    scalars: dict[int, int] = {}

    def src(i: int, ln: int) -> int:
      code = f[f"src{i}"]
      if code < 256 and i in scalars: return scalars[i]  # a scalar operand is the same for every lane
      v = self.vsrc(w, code, ln, inst)
      if f["abs"] >> i & 1: v &= 0x7FFFFFFF
      if f["neg"] >> i & 1: v ^= 0x80000000
      if code < 256: scalars[i] = v
      return v

    def src64(i: int, ln: int) -> int:
      v = self.vsrc64(w, f[f"src{i}"], ln, inst, fp=True)
      if f["abs"] >> i & 1: v &= ~(1 << 63)
      if f["neg"] >> i & 1: v ^= 1 << 63
      return v
    lanes = w.lanes()

    def cols(n: int) -> list[list[int]]:  # sources 0..n-1 for every active lane, |x| / -x applied (float32 bits)
      out = []
      for i in range(n):
        c = self.col(w, f[f"src{i}"], lanes, inst)
        if f["abs"] >> i & 1: c = [v & 0x7FFFFFFF for v in c]
        if f["neg"] >> i & 1: c = [v ^ 0x80000000 for v in c]
        out.append(c)
      return out
    if op < 0x100:  # VOPC promoted: result to an SGPR
      _, fn = vopc_compare(op)
      if 0x20 <= op & 0x7F < 0x30: mask = sum(1 << ln for ln in w.lanes() if fn(src64(0, ln), src64(1, ln)))
      elif op & 0x7F == 0x7F: mask = sum(1 << ln for ln in w.lanes() if fn(src64(0, ln), src(1, ln)))  # class_f64
      elif 0x50 <= op & 0x7F < 0x60:
        mask = sum(1 << ln for ln in w.lanes()
                   if fn(self.vsrc64(w, f["src0"], ln, inst), self.vsrc64(w, f["src1"], ln, inst)))
      else:
        a, b = cols(2)
        if 0x10 <= op & 0x7F < 0x20 and lanes:  # float32: convert the columns at once
          si, sf = _structs(len(lanes))
          a, b, fn = list(sf.unpack(si.pack(*a))), list(sf.unpack(si.pack(*b))), _F32_FN[op & 0x7F]
        mask = sum(1 << ln for ln, x, y in zip(lanes, a, b) if fn(x, y))
      if op & 0x80: w.exec = mask
      else: self.wmask(w, f["vdst"], mask)
      return
    if op == 0x213:  # v_fma_f32, by columns
      self.store(w, f["vdst"], lanes, vec_f32(_fma, *cols(3)))
      return
    if op in VOP3_F64:
      fn, n = VOP3_F64[op][1], 3 if op in (0x214, 0x228) else 2
      for ln in w.lanes(): self.vwrite64(w, f["vdst"], ln, fn(*(src64(i, ln) for i in range(n))))
      return
    if op == 0x32B:  # v_ldexp_f64
      for ln in w.lanes(): self.vwrite64(w, f["vdst"], ln, bits64(_ldexp(f64(src64(0, ln)), i32(src(1, ln)))))
      return
    if op in (0x2FD, 0x238):  # v_div_scale_f64 (D = S0, VCC = 0) / v_div_fmas_f64 (fma): see _div_fixup
      for ln in w.lanes():
        v = src64(0, ln) if op == 0x2FD else bits64(_fma64(f64(src64(0, ln)), f64(src64(1, ln)), f64(src64(2, ln))))
        self.vwrite64(w, f["vdst"], ln, v)
      if op == 0x2FD: self.wmask(w, f["sdst"], 0)
      return
    if op - 0x180 in VOP1_F64 and 0x180 <= op < 0x200:
      _, s64, d64, fn = VOP1_F64[op - 0x180]
      for ln in w.lanes():
        r = fn(src64(0, ln) if s64 else src(0, ln))
        if d64: self.vwrite64(w, f["vdst"], ln, r)
        else: w.vgpr[f["vdst"]][ln] = r & MASK32
      return
    if f["abs"] or f["neg"]:
      if not (op in (0x101, 0x213, 0x227, 0x237, 0x2FC, 0x31C) or 0x100 + 3 <= op <= 0x100 + 16 or op < 0x100):
        raise UnsupportedInstruction(f"{inst.name}: abs/neg modifiers on an integer op at {w.pc:#x}")
    if op == 0x101:  # v_cndmask_b32_e64: mask in src2's SGPR
      m = self.rmask(w, f["src2"], inst)
      a, b = cols(2)
      self.store(w, f["vdst"], lanes, [y if m >> ln & 1 else x for ln, x, y in zip(lanes, a, b)])
    elif 0x100 <= op < 0x180 and op not in VOP3SD:
      o = op - 0x100
      if o in VOP2_FLOAT: self.store(w, f["vdst"], lanes, vec_f32(VOP2_FLOAT[o], *cols(2)))
      elif o in VOP2: self.store(w, f["vdst"], lanes, list(map(VOP2[o][1], *cols(2))))
      else:
        for ln, a, b in zip(lanes, *cols(2)): self._vop2_lane(w, o, a, b, f["vdst"], ln, inst)
    elif 0x180 <= op < 0x200:
      if op - 0x180 not in VOP1: raise UnsupportedInstruction(f"VOP3 (VOP1) opcode {op - 0x180} at {w.pc:#x}")
      self.store(w, f["vdst"], lanes, list(map(VOP1[op - 0x180][1], *cols(1))))
    elif op in VOP3: self.store(w, f["vdst"], lanes, list(map(VOP3[op][1], *cols(3))))
    elif op == 0x360:  # v_readlane_b32 sdst(vdst field), vsrc0, lane(src1)
      self.swrite(w, f["vdst"], w.vgpr[f["src0"] - 256][self.sread(w, f["src1"], inst) & (w.size - 1)])
    elif op == 0x361:  # v_writelane_b32 vdst, ssrc0, lane(src1): ignores EXEC
      w.vgpr[f["vdst"]][self.sread(w, f["src1"], inst) & (w.size - 1)] = self.sread(w, f["src0"], inst)
    elif op == 0x2FC:  # v_div_scale_f32: D = S0 (no rescaling needed for float32 inputs in double math), VCC = 0
      for ln in w.lanes(): w.vgpr[f["vdst"]][ln] = src(0, ln)
      self.wmask(w, f["sdst"], 0)
    elif op == 0x237:  # v_div_fmas_f32: fma(S0, S1, S2) (VCC scaling is 0 after our div_scale)
      self.store(w, f["vdst"], lanes, vec_f32(_fma, *cols(3)))
    elif op in (0x120, 0x121, 0x122, VOP3_ADD_CO_U32, VOP3_SUB_CO_U32):
      # v_add/sub/subrev_co_ci_u32_e64 (carry in from src2's SGPR) and v_add/sub_co_u32: carry/borrow out to sdst
      cin = self.rmask(w, f["src2"], inst) if op < 0x200 else 0
      a, b = cols(2)
      if op in (0x120, VOP3_ADD_CO_U32): r = [x + y + (cin >> ln & 1) for ln, x, y in zip(lanes, a, b)]
      elif op in (0x121, VOP3_SUB_CO_U32): r = [x - y - (cin >> ln & 1) for ln, x, y in zip(lanes, a, b)]
      else: r = [y - x - (cin >> ln & 1) for ln, x, y in zip(lanes, a, b)]
      self.store(w, f["vdst"], lanes, [v & MASK32 for v in r])
      self.wmask(w, f["sdst"], sum(1 << ln for ln, v in zip(lanes, r) if v > MASK32 or v < 0))
    elif op == VOP3_MAD_U64_U32:
      c = self.col64(w, f["src2"], lanes, inst)
      r = [(x * y + z) & MASK64 for x, y, z in zip(*cols(2), c)]
      self.store(w, f["vdst"], lanes, [v & MASK32 for v in r])
      self.store(w, f["vdst"] + 1, lanes, [v >> 32 for v in r])
      self.wmask(w, f["sdst"], 0)
    elif op in (VOP3_LSHLREV_B64, 0x33D, 0x33E):  # v_lshlrev_b64 / v_lshrrev_b64 / v_ashrrev_i64
      v64, (sh,) = self.col64(w, f["src1"], lanes, inst), cols(1)
      if op == VOP3_LSHLREV_B64: r = [(v << (s & 63)) & MASK64 for v, s in zip(v64, sh)]
      elif op == 0x33D: r = [v >> (s & 63) for v, s in zip(v64, sh)]
      else: r = [(sext(v, 64) >> (s & 63)) & MASK64 for v, s in zip(v64, sh)]
      self.store(w, f["vdst"], lanes, [v & MASK32 for v in r])
      self.store(w, f["vdst"] + 1, lanes, [v >> 32 for v in r])
    else: raise UnsupportedInstruction(f"VOP3 opcode {op:#x} ({inst.name}) at {w.pc:#x}")

  @staticmethod
  def _f32_mods(v: int, i: int, f: dict[str, int]) -> int:
    """VOP3 |x| and -x modifiers of source i on a float32 pattern."""
    if f["abs"] >> i & 1: v &= 0x7FFFFFFF
    return v ^ 0x80000000 if f["neg"] >> i & 1 else v

  def vop3_16(self, w: Wave, inst: Inst) -> None:
    """16-bit VOP3 (and VOPC-in-VOP3) ops: opsel bit i picks the high half of source i, bit 3 of the destination."""
    f, op = inst.f, inst.op
    if f["omod"] or f["clamp"]: raise UnsupportedInstruction(f"{inst.name}: omod/clamp at {w.pc:#x}")
    fp = VOP3_16[op][2] if op in VOP3_16 else op in (0x136,) or (op < 0x100 and (op & 0x7F < 0x10 or op & 0x7F == 0x7D))

    def src(i: int, ln: int) -> int:
      code = f[f"src{i}"]
      if fp and code in INLINE_F32: v = _f16_bits(f32(INLINE_F32[code]))
      else: v = (self.vsrc(w, code, ln, inst) >> (16 * (f["opsel"] >> i & 1))) & 0xFFFF
      if fp and f["abs"] >> i & 1: v &= 0x7FFF
      if fp and f["neg"] >> i & 1: v ^= 0x8000
      return v
    if op < 0x100:
      _, cmp = vopc_compare(op)
      mask = sum(1 << ln for ln in w.lanes() if cmp(src(0, ln), src(1, ln)))
      if op & 0x80: w.exec = mask
      else: self.swrite(w, f["vdst"], mask)
      return
    reg, hi = f["vdst"], f["opsel"] >> 3 & 1  # VOP3: a full 8-bit VGPR number, the half from op_sel[3]
    lanes = w.lanes()
    if op == 0x25D:  # v_cndmask_b16: the mask is src2's SGPR (abs/neg act on the float halves)
      m = self.sread(w, f["src2"], inst)
      fp = True
      self.store16(w, reg, hi, lanes, [src(1, ln) if m >> ln & 1 else src(0, ln) for ln in lanes])
      return
    if op == 0x136:  # v_fmac_f16_e64: D.half = S0 * S1 + D.half
      fma = VOP3_16[0x248][3]
      d = w.vgpr[reg]
      self.store16(w, reg, hi, lanes, [fma(src(0, ln), src(1, ln), (d[ln] >> (16 * hi)) & 0xFFFF) for ln in lanes])
      return
    _, n, _, fn = VOP3_16[op]
    cols = []
    for i in range(n):  # by columns: the half opsel picks, then |x| / -x for float ops
      code, sh = f[f"src{i}"], 16 * (f["opsel"] >> i & 1)
      if fp and code in INLINE_F32: c = [_f16_bits(f32(INLINE_F32[code]))] * len(lanes)
      elif code >= 256: c = [(v >> sh) & 0xFFFF for v in self.col(w, code, lanes, inst)]
      else: c = [(self.sread(w, code, inst) >> sh) & 0xFFFF] * len(lanes)
      if fp and f["abs"] >> i & 1: c = [v & 0x7FFF for v in c]
      if fp and f["neg"] >> i & 1: c = [v ^ 0x8000 for v in c]
      cols.append(c)
    self.store16(w, reg, hi, lanes, vec_f16(fn, *cols))

  def vop3p(self, w: Wave, inst: Inst) -> None:
    """VOP3P: packed 16-bit math, mixed-precision FMA, dot products and WMMA."""
    f, op = inst.f, inst.op
    if op in WMMA: return self.wmma(w, inst)
    if op in (68, 69): return self.wmma_int(w, inst)
    if f["clamp"]: raise UnsupportedInstruction(f"{inst.name}: clamp at {w.pc:#x}")
    if op in VOP3P_PK:
      _, n, kind, fn = VOP3P_PK[op]
      if kind == "i" and (f["neg"] or f["neg_hi"]):
        raise UnsupportedInstruction(f"{inst.name}: neg modifiers on a packed integer op at {w.pc:#x}")
      codes = [f[f"src{i}"] for i in range(n)]
      for ln in w.lanes():
        words = [self._pk_src(w, c, ln, inst, kind == "f") for c in codes]
        lo = fn(*(self._half(words[i], f["opsel"] >> i & 1, f["neg"] >> i & 1) for i in range(n)))
        hi = fn(*(self._half(words[i], f["opsel_hi"] >> i & 1, f["neg_hi"] >> i & 1) for i in range(n)))
        w.vgpr[f["vdst"]][ln] = (hi << 16) | lo
      return
    if op in (19, 26):  # v_dot2_f32_f16 / v_dot2_f32_bf16: D = S0.lo*S1.lo + S0.hi*S1.hi + S2 (float32)
      cvt = _f16 if op == 19 else _bf16
      for ln in w.lanes():
        a, b = (self._pk_src(w, f[f"src{i}"], ln, inst, op == 19) for i in range(2))
        # element 0 takes the halves op_sel picks (negated by neg_lo), element 1 those op_sel_hi picks (neg_hi)
        terms = [cvt(self._half(a, sel & 1, ng & 1)) * cvt(self._half(b, sel >> 1 & 1, ng >> 1 & 1))
                 for sel, ng in ((f["opsel"], f["neg"]), (f["opsel_hi"], f["neg_hi"]))]
        c = self.vsrc(w, f["src2"], ln, inst)
        if f["neg"] >> 2 & 1: c ^= 0x80000000
        w.vgpr[f["vdst"]][ln] = bits32(math.fsum([*terms, f32(c)]))
      return
    if op in (22, 23):  # v_dot4_i32_iu8 / v_dot4_u32_u8: four byte products plus S2 (iu8: neg_lo marks signed)
      if op == 23 and (f["neg"] or f["neg_hi"]):
        raise UnsupportedInstruction(f"{inst.name}: neg modifiers at {w.pc:#x}")
      for ln in w.lanes():
        a, b, c = (self.vsrc(w, f[f"src{i}"], ln, inst) for i in range(3))
        def byte(v: int, k: int, signed: bool) -> int:
          return sext((v >> (8 * k)) & 0xFF, 8) if signed else (v >> 8 * k) & 0xFF
        sa, sb = op == 22 and bool(f["neg"] & 1), op == 22 and bool(f["neg"] & 2)
        w.vgpr[f["vdst"]][ln] = (sum(byte(a, k, sa) * byte(b, k, sb) for k in range(4)) + c) & MASK32
      return
    if op in (32, 33, 34):  # v_fma_mix*: op_sel_hi[i] = 1 reads source i as the half op_sel[i] picks, else float32
      for ln in w.lanes():
        xs = []
        for i in range(3):
          v = self.vsrc(w, f[f"src{i}"], ln, inst)
          if f["opsel_hi"] >> i & 1:
            code = f[f"src{i}"]
            if code in INLINE_F32: x = _f16(_f16_bits(f32(INLINE_F32[code])))
            else: x = _f16(v >> (16 * (f["opsel"] >> i & 1)))
          else: x = f32(v)
          if f["neg_hi"] >> i & 1: x = abs(x)  # for the mix ops neg_hi is |x|
          if f["neg"] >> i & 1: x = -x
          xs.append(x)
        r = _fma(*xs)
        if op == 32: w.vgpr[f["vdst"]][ln] = bits32(r)
        else: self.store16(w, f["vdst"], int(op == 34), (ln,), [_f16_bits(r)])  # mixlo / mixhi
      return
    raise UnsupportedInstruction(f"VOP3P opcode {op} ({inst.name}) at {w.pc:#x}")

  def _pk_src(self, w: Wave, code: int, lane: int, inst: Inst, fp: bool) -> int:
    """A packed operand's 32 bits; an inline float constant is its half-precision pattern in both halves."""
    if fp and code in INLINE_F32:
      h = _f16_bits(f32(INLINE_F32[code]))
      return (h << 16) | h
    return self.vsrc(w, code, lane, inst)

  @staticmethod
  def _half(word: int, hi: int, neg: int) -> int: return ((word >> (16 * hi)) & 0xFFFF) ^ (0x8000 if neg else 0)

  def wmma_int(self, w: Wave, inst: Inst) -> None:
    """V_WMMA_I32_16X16X16_IU8 / _IU4 (wave32): lane l holds row l%16 of A and column l%16 of B as 16 bytes in 4
    VGPRs (iu8) or 16 nibbles in 2 VGPRs (iu4), K from the low bits up; neg_lo[0] / neg_lo[1] make A / B signed;
    C/D are int32 in the f32 WMMA layout; clamp saturates to int32 instead of wrapping."""
    f, op = inst.f, inst.op
    if f["neg_hi"] or f["neg"] & 4: raise UnsupportedInstruction(f"{inst.name}: neg_hi / neg_lo[2] at {w.pc:#x}")
    if w.exec != MASK32: raise UnsupportedInstruction(f"{inst.name} needs all 32 lanes in EXEC, got {w.exec:#010x}")
    if min(f["src0"], f["src1"], f["src2"]) < 256:
      raise UnsupportedInstruction(f"{inst.name}: A, B and C must be VGPRs at {w.pc:#x}")
    bits = 8 if op == 68 else 4
    nreg, per = (4, 4) if op == 68 else (2, 8)
    def row(base: int, ln: int, signed: bool) -> list[int]:
      vals = [(w.vgpr[base + j][ln] >> (bits * k)) & ((1 << bits) - 1) for j in range(nreg) for k in range(per)]
      return [sext(v, bits) for v in vals] if signed else vals
    A = [row(f["src0"] - 256, r, bool(f["neg"] & 1)) for r in range(16)]
    B = [row(f["src1"] - 256, n, bool(f["neg"] & 2)) for n in range(16)]
    c0, out = f["src2"] - 256, [[0] * WAVE for _ in range(8)]
    for i in range(8):
      for ln in range(WAVE):
        acc = sum(x * y for x, y in zip(A[2 * i + ln // 16], B[ln % 16])) + i32(w.vgpr[c0 + i][ln])
        if f["clamp"]: acc = max(-(1 << 31), min((1 << 31) - 1, acc))
        out[i][ln] = acc & MASK32
    for i in range(8): w.vgpr[f["vdst"] + i] = out[i]

  def wmma(self, w: Wave, inst: Inst) -> None:
    """V_WMMA_*_16X16X16 (wave32): D = A x B + C for 16x16 matrices, every lane taking part. Lane l holds row l%16
    of A (src0: 8 VGPRs, 16 halves, K along the halves) and column l%16 of B (src1); lanes 16..31 repeat lanes
    0..15 and are not read. C/D (8 VGPRs): lane l, VGPR i is element (row 2i + l//16, column l%16); a 16-bit D/C
    lives in the half op_sel[2] picks. Products are exact and summed with C exactly (math.fsum), rounded once."""
    f, op = inst.f, inst.op
    cvt, out32, pack = WMMA[op]
    if f["clamp"] or f["neg"] or f["neg_hi"]: raise UnsupportedInstruction(f"{inst.name}: clamp/neg at {w.pc:#x}")
    if w.exec != MASK32: raise UnsupportedInstruction(f"{inst.name} needs all 32 lanes in EXEC, got {w.exec:#010x}")
    if min(f["src0"], f["src1"], f["src2"]) < 256:
      raise UnsupportedInstruction(f"{inst.name}: A, B and C must be VGPRs at {w.pc:#x}")
    a0, b0, c0, d0 = f["src0"] - 256, f["src1"] - 256, f["src2"] - 256, f["vdst"]
    def halves(base: int, ln: int) -> list[float]:
      return [cvt(w.vgpr[base + j][ln] >> (16 * h)) for j in range(8) for h in (0, 1)]
    A = [halves(a0, r) for r in range(16)]  # A[m][k]
    B = [halves(b0, n) for n in range(16)]  # B[n][k] (column n)
    sh = 16 * (f["opsel"] >> 2 & 1)
    out = [[0] * WAVE for _ in range(8)]
    for i in range(8):
      for ln in range(WAVE):
        m, n = 2 * i + ln // 16, ln % 16
        cv = w.vgpr[c0 + i][ln]
        c = f32(cv) if out32 else cvt(cv >> sh)
        acc = math.fsum([*(x * y for x, y in zip(A[m], B[n])), c])
        out[i][ln] = bits32(acc) if pack is None else pack(acc)
    for i in range(8):
      vd = w.vgpr[d0 + i]
      for ln in range(WAVE): vd[ln] = out[i][ln] if out32 else (vd[ln] & ~(0xFFFF << sh) & MASK32) | (out[i][ln] << sh)

  def mubuf(self, w: Wave, inst: Inst) -> None:
    if inst.op not in (43, 44):  # only the cache invalidates (buffer_gl0_inv / buffer_gl1_inv): no-ops here
      raise UnsupportedInstruction(f"MUBUF opcode {inst.op} at {w.pc:#x}")

  def ds(self, w: Wave, inst: Inst) -> None:
    """LDS loads/stores/atomics and the cross-lane permutes; addresses are byte offsets into the work-group's LDS,
    bounds-checked."""
    if inst.op in DS_ATOMICS: return self.ds_atomic(w, inst)
    if inst.op in DS_PERMUTE: return self.ds_permute(w, inst)
    if inst.op in DS_D16: return self.ds_d16(w, inst)
    if inst.op not in DS_OPS: raise UnsupportedInstruction(f"DS opcode {inst.op} ({inst.name}) at {w.pc:#x}")
    _, kind, bits, stride = DS_OPS[inst.op]
    f, nbytes = inst.f, abs(bits) // 8
    def at(a: int, n: int) -> int:
      if a < 0 or a + n > len(w.lds):
        raise RuntimeError(f"LDS access of {n} bytes at {a:#x} is outside the work-group's {len(w.lds)} bytes")
      return a
    if nbytes % 4 == 0:  # dword-sized: whole columns, struct slices of the LDS bytearray
      n, st, lanes, lds = nbytes // 4, _dwords(nbytes // 4), w.lanes(), w.lds
      bases = self.col(w, 256 + f["addr"], lanes, inst)
      offs = [f["offset1"] << 8 | f["offset0"]] if kind in ("st", "ld") else [f["offset0"] * stride,
                                                                                f["offset1"] * stride]
      addrs = [[(b + o) & MASK32 for b in bases] for o in offs]
      for col in addrs:
        if col: at(min(col), nbytes), at(max(col), nbytes)
      if kind.startswith("ld"):
        for j, col in enumerate(addrs):
          vals = [st.unpack_from(lds, a) for a in col]
          for i in range(n): self.store(w, f["vdst"] + j * n + i, lanes, [v[i] for v in vals])
      else:
        data = [[self.col(w, 256 + r + i, lanes, inst) for i in range(n)] for r in (f["data0"], f["data1"])[:len(offs)]]
        for k in range(len(lanes)):  # lane after lane, each lane's accesses in order (later lanes win)
          for j, col in enumerate(addrs): st.pack_into(lds, col[k], *(d[k] for d in data[j]))
      return
    for ln in w.lanes():
      base = w.vgpr[f["addr"]][ln]
      if kind in ("st", "ld"): addrs = [(base + (f["offset1"] << 8 | f["offset0"])) & MASK32]
      else: addrs = [(base + f["offset0"] * stride) & MASK32, (base + f["offset1"] * stride) & MASK32]
      for j, a in enumerate(addrs):
        if kind.startswith("st"):
          src = f["data0"] if j == 0 else f["data1"]
          val = sum(w.vgpr[src + i][ln] << (32 * i) for i in range(max(1, nbytes // 4)))
          w.lds[at(a, nbytes):a + nbytes] = (val & ((1 << (8 * nbytes)) - 1)).to_bytes(nbytes, "little")
        else:
          v = int.from_bytes(w.lds[at(a, nbytes):a + nbytes], "little")
          if bits < 0: v = sext(v, -bits) & MASK32
          dst = f["vdst"] + j * max(1, nbytes // 4)
          for i in range(max(1, nbytes // 4)): w.vgpr[dst + i][ln] = (v >> (32 * i)) & MASK32

  def ds_d16(self, w: Wave, inst: Inst) -> None:
    """ds_load_{u8,i8,u16}_d16[_hi]: a byte/short into one VGPR half (the other kept); ds_store_b{8,16}_d16_hi: the
    data VGPR's high half."""
    f = inst.f
    _, bits, signed, half = DS_D16[inst.op]
    nb, sh, off = bits // 8, 16 * half, f["offset1"] << 8 | f["offset0"]
    for ln in w.lanes():
      a = (w.vgpr[f["addr"]][ln] + off) & MASK32
      if a + nb > len(w.lds):
        raise RuntimeError(f"LDS access of {nb} bytes at {a:#x} is outside the work-group's {len(w.lds)} bytes")
      if inst.op <= 161:
        w.lds[a:a + nb] = ((w.vgpr[f["data0"]][ln] >> 16) & ((1 << bits) - 1)).to_bytes(nb, "little")
        continue
      v = int.from_bytes(w.lds[a:a + nb], "little")
      v = (sext(v, bits) if signed else v) & 0xFFFF
      d = w.vgpr[f["vdst"]]
      d[ln] = (d[ln] & ~(0xFFFF << sh) & MASK32) | (v << sh)

  def ds_atomic(self, w: Wave, inst: Inst) -> None:
    """DS atomics, lane by lane in lane order: data0 is the operand (cmpstore: the new value, data1 the compare);
    the _rtn forms return the old value."""
    f = inst.f
    kind, bits, rtn = DS_ATOMICS[inst.op]
    nb = bits // 8
    for ln in w.lanes():
      a = (w.vgpr[f["addr"]][ln] + (f["offset1"] << 8 | f["offset0"])) & MASK32
      if a + nb > len(w.lds):
        raise RuntimeError(f"LDS access of {nb} bytes at {a:#x} is outside the work-group's {len(w.lds)} bytes")
      old = int.from_bytes(w.lds[a:a + nb], "little")
      data = self._vreg_wide(w, f["data0"], ln, bits)
      cmp = self._vreg_wide(w, f["data1"], ln, bits) if kind.startswith("cmpswap") else 0
      w.lds[a:a + nb] = atomic_result(kind, bits, old, data, cmp).to_bytes(nb, "little")
      if rtn: self._vwrite_wide(w, f["vdst"], ln, bits, old)

  def ds_permute(self, w: Wave, inst: Inst) -> None:
    """ds_permute_b32 (lane (addr/4)%32 of the result gets this lane's data), ds_bpermute_b32 (this lane reads lane
    (addr/4)%32's data; an inactive source reads 0), ds_swizzle_b32 (offset bit 15 = 0: the bitmask mode over groups of
    32; 1: quad permute of groups of 4). No LDS is touched."""
    f, lanes = inst.f, w.lanes()
    off = f["offset1"] << 8 | f["offset0"]
    src = w.vgpr[f["addr"] if inst.op == 53 else f["data0"]]  # ds_swizzle's operand sits in the ADDR field
    active = w.exec
    if inst.op == 53:
      out = {}
      for ln in lanes:
        if off & 0x8000: j = (ln & ~3) | ((off >> (2 * (ln & 3))) & 3)
        else: j = (((ln & (off & 0x1F)) | ((off >> 5) & 0x1F)) ^ ((off >> 10) & 0x1F)) & 31
        out[ln] = src[j] if active >> j & 1 else 0
    elif inst.op == 179:
      out = {}
      for ln in lanes:
        j = ((w.vgpr[f["addr"]][ln] + off) >> 2) & (w.size - 1)
        out[ln] = src[j] if active >> j & 1 else 0
    else:
      out = dict.fromkeys(lanes, 0)
      for ln in lanes:
        j = ((w.vgpr[f["addr"]][ln] + off) >> 2) & (w.size - 1)
        if active >> j & 1: out[j] = src[ln]
    for ln, v in out.items(): w.vgpr[f["vdst"]][ln] = v

  def flat(self, w: Wave, inst: Inst) -> None:
    """FLAT (segment 0: a 64-bit VGPR address; the mock maps no LDS/scratch aperture, so it is global memory),
    SCRATCH (segment 1: per-lane private memory) and GLOBAL (segment 2) loads, stores and atomics."""
    f, op, seg = inst.f, inst.op, inst.f["seg"]
    if seg == 3: raise UnsupportedInstruction(f"FLAT segment 3 (reserved) at {w.pc:#x}")
    if seg != 1 and self._flat_block(w, inst): return
    for ln in w.lanes():
      mem: Memory = self.mem
      if seg == 1:  # scratch: a 32-bit per-lane offset = VGPR (when SVE) + SGPR (unless off) + offset
        addr = (w.vgpr[f["addr"]][ln] if f["sve"] else 0) + (w.sgpr[f["saddr"]] if f["saddr"] != NULL else 0)
        addr, mem = (addr + f["offset"]) & MASK32, w.private(ln)
      elif seg == 2 and f["saddr"] != NULL and f["saddr"] != 0x7F:
        addr = (w.sgpr[f["saddr"]] | (w.sgpr[f["saddr"] + 1] << 32)) + w.vgpr[f["addr"]][ln]
      else: addr = w.vgpr[f["addr"]][ln] | (w.vgpr[f["addr"] + 1][ln] << 32)
      if seg != 1: addr = (addr + f["offset"]) & MASK64
      if op in GLOBAL_LOADS:
        n, signed, bits = GLOBAL_LOADS[op]
        if bits < 32:
          v = int.from_bytes(mem.read(addr, bits // 8), "little")
          w.vgpr[f["vdst"]][ln] = (sext(v, bits) & MASK32) if signed else v
        else:
          for i, v in enumerate(struct.unpack(f"<{n}I", mem.read(addr, 4 * n))): w.vgpr[f["vdst"] + i][ln] = v
      elif op in GLOBAL_D16:
        bits, signed, sh = GLOBAL_D16[op]
        v = int.from_bytes(mem.read(addr, bits // 8), "little")
        v = (sext(v, bits) if signed else v) & 0xFFFF
        w.vgpr[f["vdst"]][ln] = (w.vgpr[f["vdst"]][ln] & ~(0xFFFF << sh) & MASK32) | (v << sh)
      elif op in (36, 37):  # store_d16_hi_b8/b16: the high half of the data VGPR
        hi = w.vgpr[f["data"]][ln] >> 16
        mem.write(addr, (hi & (0xFF if op == 36 else 0xFFFF)).to_bytes(op - 35, "little"))
      elif op in GLOBAL_STORES:
        n, bits = GLOBAL_STORES[op]
        if bits < 32: mem.write(addr, (w.vgpr[f["data"]][ln] & ((1 << bits) - 1)).to_bytes(bits // 8, "little"))
        else: mem.write(addr, struct.pack(f"<{n}I", *(w.vgpr[f["data"] + i][ln] for i in range(n))))
      elif op in FLAT_ATOMICS and seg != 1:
        kind, bits = FLAT_ATOMICS[op]
        nb, d = bits // 8, f["data"]
        old = int.from_bytes(mem.read(addr, nb), "little")
        data = self._vreg_wide(w, d, ln, bits)
        cmp = self._vreg_wide(w, d + bits // 32, ln, bits) if kind.startswith("cmpswap") else 0
        mem.write(addr, atomic_result(kind, bits, old, data, cmp).to_bytes(nb, "little"))
        if f["glc"]: self._vwrite_wide(w, f["vdst"], ln, bits, old)  # GLC: return the value before the op
      else: raise UnsupportedInstruction(f"{inst.name}: FLAT opcode {op} (segment {seg}) at {w.pc:#x}")

  def _flat_block(self, w: Wave, inst: Inst) -> bool:
    """The common cases of loads/stores, with one memory access for the whole wave: a load whose active lanes'
    addresses all lie close together (read once, each lane takes its slice), a store to consecutive addresses (lane
    after lane, no gaps). Byte/short loads (also d16 into a VGPR half) and stores go the same way. Returns False
    (nothing done) for any other access, or when the one-block read faults (the lane-by-lane path then reports the
    lane that is really out of bounds)."""
    f, op = inst.f, inst.op
    sub: tuple[int, bool, int] | None = None  # (bits, signed, d16 shift or -1 for a full VGPR) of a sub-dword load
    if op in GLOBAL_LOADS:
      n, signed, bits = GLOBAL_LOADS[op]
      load, nb = True, 4 * n if bits == 32 else bits // 8
      if bits < 32: sub = (bits, signed, -1)
    elif op in GLOBAL_D16:
      bits, signed, sh = GLOBAL_D16[op]
      n, load, nb, sub = 1, True, bits // 8, (bits, signed, sh)
    elif op in GLOBAL_STORES or op in (36, 37):
      n, bits = GLOBAL_STORES[op] if op in GLOBAL_STORES else (1, 8 * (op - 35))
      load, nb = False, 4 * n if bits == 32 else bits // 8
    else: return False
    lanes = w.lanes()
    if len(lanes) < 2 or (not load and lanes[-1] - lanes[0] != len(lanes) - 1): return False
    va = w.vgpr[f["addr"]]
    if f["seg"] == 2 and f["saddr"] != NULL and f["saddr"] != 0x7F:
      base = (w.sgpr[f["saddr"]] | (w.sgpr[f["saddr"] + 1] << 32)) + f["offset"]
      addrs = [base + va[ln] for ln in lanes]
    else:
      vh = w.vgpr[f["addr"] + 1]
      addrs = [(va[ln] | (vh[ln] << 32)) + f["offset"] for ln in lanes]
    lo, hi = min(addrs), max(addrs)
    if lo < 0 or hi > MASK64 - nb: return False
    if load:
      # a plain Memory reads raw host memory: stay within 4 KiB so the block cannot reach an unmapped page between
      # two addresses the lanes really read; a Memory that checks its reads (the mock's) may read up to 64 KiB
      if hi - lo > (4096 if type(self.mem).read is Memory.read else 65536): return False
      try: buf = self.mem.read(lo, hi - lo + nb)
      except RuntimeError: return False
      if sub is None:
        st = _dwords(n)
        vals = [st.unpack_from(buf, a - lo) for a in addrs]
        for i in range(n): self.store(w, f["vdst"] + i, lanes, [v[i] for v in vals])
        return True
      bits, signed, sh = sub
      st = _SUBDWORD[(bits, signed)]
      col = [st.unpack_from(buf, a - lo)[0] for a in addrs]
      if sh < 0: self.store(w, f["vdst"], lanes, [v & MASK32 for v in col])
      else:
        old, keep = w.vgpr[f["vdst"]], ~(0xFFFF << sh) & MASK32
        self.store(w, f["vdst"], lanes, [(old[ln] & keep) | ((v & 0xFFFF) << sh) for ln, v in zip(lanes, col)])
      return True
    if any(a - lo != i * nb for i, a in enumerate(addrs)): return False
    if bits < 32:
      src = self.col(w, 256 + f["data"], lanes, inst)
      if op in (36, 37): src = [v >> 16 for v in src]
      mask = (1 << bits) - 1
      self.mem.write(lo, struct.pack(f"<{len(lanes)}{'B' if bits == 8 else 'H'}", *(v & mask for v in src)))
      return True
    cols = [self.col(w, 256 + f["data"] + i, lanes, inst) for i in range(n)]
    self.mem.write(lo, struct.pack(f"<{n * len(lanes)}I", *(v for vs in zip(*cols) for v in vs)))
    return True

  @staticmethod
  def _vreg_wide(w: Wave, r: int, ln: int, bits: int) -> int:
    return w.vgpr[r][ln] | (w.vgpr[r + 1][ln] << 32 if bits == 64 else 0)

  @staticmethod
  def _vwrite_wide(w: Wave, r: int, ln: int, bits: int, v: int) -> None:
    w.vgpr[r][ln] = v & MASK32
    if bits == 64: w.vgpr[r + 1][ln] = (v >> 32) & MASK32
