"""exec_alu (the reference ALU semantics) against numpy, op by op and dtype by dtype, plus threefry known answers."""
import math
import struct

import pytest

from tiny_uop import Ops, dtypes
from tiny_uop.alu import exec_alu, python_alu, threefry2x32
from tiny_uop.dtype import float_to_bits, float_to_int, int_to_float, to_numpy

np = pytest.importorskip("numpy")

INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]
FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64]
NUMERIC = INTS + FLOATS
RNG_SEED = 1234


def edge_values(dt):
  """Edge cases of dtype `dt` as numpy array of that dtype."""
  npdt = to_numpy(dt)
  if dt == dtypes.bool: return np.array([False, True])
  if dtypes.is_int(dt):
    lo, hi = int(dtypes.min(dt)), int(dtypes.max(dt))
    vals = {lo, lo + 1, hi, hi - 1, 0, 1, 2, 3, 7, hi // 2, hi // 3 + 1, 100 % (hi + 1)}
    if lo < 0: vals |= {-1, -2, -3, -7, lo // 2, lo // 3}
    return np.array(sorted(vals), dtype=npdt)
  fi = np.finfo(npdt)
  vals = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.5, 0.1, -0.3, 7.0, 1e-3, 100.25, math.pi, float(fi.max), -float(fi.max),
          float(fi.tiny), float(fi.smallest_subnormal), -float(fi.smallest_subnormal), float(fi.eps), 1e4, -65504.0,
          math.inf, -math.inf, math.nan, 2.0 ** 24 + 2, 1e30, -1e-30, 123456.789]
  with np.errstate(all="ignore"): return np.array(vals, dtype=np.float64).astype(npdt)


def random_values(dt, n=300):
  """Random values covering the whole range (random bit patterns: includes NaN, inf and subnormals for floats)."""
  rng = np.random.default_rng(RNG_SEED + dt.itemsize)
  if dt == dtypes.bool: return rng.integers(0, 2, n).astype(bool)
  raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
  return raw.view(to_numpy(dt))


def py(x, dt):
  """A numpy scalar as the Python value exec_alu takes."""
  if dt == dtypes.bool: return bool(x)
  return int(x) if dtypes.is_int(dt) else float(x)


def same(ours, ref, dt, ulp=0):
  """Equal as values of dt: NaN == NaN, -0.0 != 0.0, and within `ulp` units in the last place for floats."""
  if dtypes.is_float(dt):
    ref = float(ref)
    if math.isnan(ref) or math.isnan(ours): return math.isnan(ref) and math.isnan(ours)
    if ulp == 0 or math.isinf(ref) or math.isinf(ours): return float_to_bits(ours, dt) == float_to_bits(ref, dt)
    return abs(_ordered(float_to_bits(ours, dt), dt) - _ordered(float_to_bits(ref, dt), dt)) <= ulp
  return ours == (bool(ref) if dt == dtypes.bool else int(ref))


def _ordered(bits, dt):
  """Float bits as a monotonic integer (adjacent floats differ by 1)."""
  sign = 1 << (8 * dt.itemsize - 1)
  return -(bits & (sign - 1)) if bits & sign else bits


def check(op, dt, args, ref, out_dt=None, ulp=0):
  out_dt = out_dt or dt
  bad = []
  for i in range(len(ref)):
    operands = tuple(py(a[i], d) for a, d in args)
    got = exec_alu(op, out_dt, operands)
    if not same(got, ref[i], out_dt, ulp): bad.append((operands, got, ref[i].item()))
  assert not bad, f"{op} {out_dt}: {len(bad)} mismatches, first: {bad[:5]}"


def pairs(dt):
  """All pairs of edge values plus random pairs, as two numpy arrays of dt."""
  e = edge_values(dt)
  a, b = np.repeat(e, len(e)), np.tile(e, len(e))
  r = random_values(dt, 400)
  return np.concatenate([a, r[:200]]), np.concatenate([b, r[200:]])


def singles(dt): return np.concatenate([edge_values(dt), random_values(dt, 300)])


# ***** binary ops, every dtype numpy has *****
C_DIV_DTS = INTS


def c_div(a, b):
  """C division (truncate toward zero, x/0 = 0) computed exactly from numpy's floor division."""
  q = np.floor_divide(a, b)
  fix = (np.fmod(a, b) != 0) & ((a < 0) != (b < 0))
  return np.where(fix, q + 1, q).astype(a.dtype)


BINARY = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMOD: np.fmod}


@pytest.mark.parametrize("dt", NUMERIC, ids=str)
@pytest.mark.parametrize("op", list(BINARY), ids=str)
def test_binary_vs_numpy(op, dt):
  a, b = pairs(dt)
  with np.errstate(all="ignore"): ref = BINARY[op](a, b)
  if op is Ops.MAX and dtypes.is_float(dt):  # numpy's sign of max(-0.0, 0.0) depends on the dtype; ours is +0.0
    zeros = (a == 0) & (b == 0)
    assert all(exec_alu(op, dt, (float(x), float(y))) == 0.0 for x, y in zip(a[zeros], b[zeros]))
    assert math.copysign(1, exec_alu(op, dt, (-0.0, 0.0))) == math.copysign(1, exec_alu(op, dt, (0.0, -0.0))) == 1
    a, b, ref = a[~zeros], b[~zeros], ref[~zeros]
  check(op, dt, [(a, dt), (b, dt)], ref)


@pytest.mark.parametrize("dt", NUMERIC + [dtypes.bool], ids=str)
@pytest.mark.parametrize("op,fn", [(Ops.CMPLT, np.less), (Ops.CMPNE, np.not_equal), (Ops.CMPEQ, np.equal)], ids=str)
def test_compare_vs_numpy(op, fn, dt):
  a, b = pairs(dt)
  check(op, dt, [(a, dt), (b, dt)], fn(a, b), out_dt=dtypes.bool)


@pytest.mark.parametrize("dt", INTS + [dtypes.bool], ids=str)
@pytest.mark.parametrize("op,fn", [(Ops.XOR, np.bitwise_xor), (Ops.OR, np.bitwise_or), (Ops.AND, np.bitwise_and)],
                         ids=str)
def test_bitwise_vs_numpy(op, fn, dt):
  a, b = pairs(dt)
  check(op, dt, [(a, dt), (b, dt)], fn(a, b))


@pytest.mark.parametrize("dt", [dtypes.bool], ids=str)
@pytest.mark.parametrize("op,fn", [(Ops.ADD, np.add), (Ops.MUL, np.multiply), (Ops.MAX, np.maximum)], ids=str)
def test_bool_arith_vs_numpy(op, fn, dt):
  a, b = pairs(dt)
  check(op, dt, [(a, dt), (b, dt)], fn(a, b))


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_cdiv_vs_numpy(dt):
  a, b = pairs(dt)
  with np.errstate(all="ignore"): ref = c_div(a, b)
  check(Ops.CDIV, dt, [(a, dt), (b, dt)], ref)


@pytest.mark.parametrize("dt", INTS, ids=str)
@pytest.mark.parametrize("op,fn", [(Ops.SHL, np.left_shift), (Ops.SHR, np.right_shift)], ids=str)
def test_shift_vs_numpy(op, fn, dt):
  bits = 8 * dt.itemsize
  a, b = pairs(dt)
  # our shift count is taken modulo the bit width; numpy is defined for 0 <= b < bits, so give it b & (bits-1)
  ref = fn(a, (b.astype(np.uint64) & np.uint64(bits - 1)).astype(a.dtype))
  check(op, dt, [(a, dt), (b, dt)], ref)


def test_shift_count_modulo_width():
  assert exec_alu(Ops.SHL, dtypes.int32, (1, 33)) == 2
  assert exec_alu(Ops.SHL, dtypes.uint8, (1, 9)) == 2
  assert exec_alu(Ops.SHR, dtypes.int8, (-128, 7)) == -1  # arithmetic
  assert exec_alu(Ops.SHR, dtypes.uint8, (128, 7)) == 1   # logical
  assert exec_alu(Ops.SHL, dtypes.int64, (1, 63)) == -2 ** 63
  assert exec_alu(Ops.SHR, dtypes.uint64, (2 ** 63, -1)) == 1  # -1 & 63 == 63


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_fdiv_vs_numpy(dt):
  a, b = pairs(dt)
  with np.errstate(all="ignore"): ref = np.divide(a, b)
  check(Ops.FDIV, dt, [(a, dt), (b, dt)], ref)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_ldexp_vs_numpy(dt):
  """LDEXP(a, b) = a * 2**b rounded once for integer-valued b (np.ldexp): across the exponent range, into subnormals
  and past the largest finite (inf), with NaN/inf/0 operands; ints refuse it."""
  a, _ = pairs(dt)
  fi = np.finfo(to_numpy(dt))
  b = np.random.default_rng(RNG_SEED).integers(-fi.maxexp - fi.nmant - 8, fi.maxexp + 8, len(a))
  b[:6] = [0, 1, -1, fi.maxexp, -fi.maxexp - fi.nmant, -fi.maxexp - fi.nmant - 1]
  with np.errstate(all="ignore"): ref = np.ldexp(a, b.astype(np.int32))
  check(Ops.LDEXP, dt, [(a, dt), (b.astype(to_numpy(dt)), dt)], ref)
  assert math.isnan(exec_alu(Ops.LDEXP, dt, (math.nan, 3.0)))
  assert exec_alu(Ops.LDEXP, dt, (-math.inf, -5.0)) == -math.inf
  assert exec_alu(Ops.LDEXP, dt, (-0.0, 7.0)) == 0 and math.copysign(1, exec_alu(Ops.LDEXP, dt, (-0.0, 7.0))) == -1
  with pytest.raises(TypeError): exec_alu(Ops.LDEXP, dtypes.int32, (1, 2))


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_float_cdiv_is_trunc_of_division(dt):
  a, b = pairs(dt)
  with np.errstate(all="ignore"): ref = np.trunc(np.divide(a, b))
  check(Ops.CDIV, dt, [(a, dt), (b, dt)], ref)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_pow_vs_numpy(dt):
  a, b = pairs(dt)
  with np.errstate(all="ignore"): ref = np.power(a, b)
  check(Ops.POW, dt, [(a, dt), (b, dt)], ref, ulp=2)


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_int_pow_vs_numpy(dt):
  a, b = pairs(dt)
  b = b.astype(np.uint64) % np.uint64(70)  # numpy defines integer powers for exponents >= 0 only
  b = b.astype(a.dtype)
  check(Ops.POW, dt, [(a, dt), (b, dt)], np.power(a, b))
  assert exec_alu(Ops.POW, dtypes.int32, (2, -1)) == 0 and exec_alu(Ops.POW, dtypes.int32, (-1, -3)) == -1


# ***** unary ops *****
@pytest.mark.parametrize("dt", NUMERIC, ids=str)
def test_neg_vs_numpy(dt):
  a = singles(dt)
  with np.errstate(all="ignore"): ref = np.negative(a)
  check(Ops.NEG, dt, [(a, dt)], ref)


UNARY_EXACT = {Ops.SQRT: np.sqrt, Ops.RECIPROCAL: np.reciprocal, Ops.TRUNC: np.trunc}
UNARY_ULP = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin}


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("op", list(UNARY_EXACT), ids=str)
def test_unary_exact_vs_numpy(op, dt):
  a = singles(dt)
  with np.errstate(all="ignore"): ref = UNARY_EXACT[op](a)
  check(op, dt, [(a, dt)], ref)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("op", list(UNARY_ULP), ids=str)
def test_transcendental_vs_numpy(op, dt):
  a = singles(dt)
  with np.errstate(all="ignore"):
    if op is Ops.SIN: a = a[~(np.abs(a.astype(np.float64)) >= 1e6)]  # numpy's float32 sin is inexact for huge args
    ref = UNARY_ULP[op](a)
  check(op, dt, [(a, dt)], ref, ulp=2)


def test_float_special_values():
  f32 = dtypes.float32
  assert exec_alu(Ops.LOG2, f32, (0.0,)) == -math.inf and exec_alu(Ops.LOG2, f32, (-0.0,)) == -math.inf
  assert math.isnan(exec_alu(Ops.LOG2, f32, (-1.0,)))
  assert exec_alu(Ops.RECIPROCAL, f32, (-0.0,)) == -math.inf
  assert math.isnan(exec_alu(Ops.SIN, f32, (math.inf,)))
  assert exec_alu(Ops.EXP2, f32, (200.0,)) == math.inf and exec_alu(Ops.EXP2, dtypes.float64, (2000.0,)) == math.inf
  assert math.copysign(1, exec_alu(Ops.TRUNC, f32, (-0.5,))) == -1
  assert math.isnan(exec_alu(Ops.MAX, f32, (math.nan, 1.0))) and math.isnan(exec_alu(Ops.MAX, f32, (1.0, math.nan)))
  assert exec_alu(Ops.POW, f32, (math.nan, 0.0)) == 1.0 and exec_alu(Ops.POW, f32, (-0.0, -1.0)) == -math.inf
  assert exec_alu(Ops.ADD, f32, (3.4028234663852886e38, 3.4028234663852886e38)) == math.inf


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_int_trunc_is_identity_and_floats_only_ops_raise(dt):
  assert exec_alu(Ops.TRUNC, dt, (5,)) == 5
  with pytest.raises(TypeError, match="EXP2 is not defined"): exec_alu(Ops.EXP2, dt, (1,))


# ***** ternary *****
@pytest.mark.parametrize("dt", NUMERIC, ids=str)
def test_mulacc_and_where_vs_numpy(dt):
  a, b = pairs(dt)
  c = np.roll(a, 7)
  with np.errstate(all="ignore"): ref = np.add(np.multiply(a, b), c)  # unfused: rounded after each step
  check(Ops.MULACC, dt, [(a, dt), (b, dt), (c, dt)], ref)
  cond = random_values(dtypes.bool, len(a))
  check(Ops.WHERE, dt, [(cond, dtypes.bool), (a, dt), (b, dt)], np.where(cond, a, b))


# ***** CAST and BITCAST *****
def _cast_ok(src, dst, x):
  """numpy's float->int casts differ by platform out of range: compare those only where the truncation fits."""
  if not (dtypes.is_float(src) and dtypes.is_int(dst)): return True
  if not math.isfinite(x): return False
  return dtypes.min(dst) <= math.trunc(x) <= dtypes.max(dst)


@pytest.mark.parametrize("src", NUMERIC + [dtypes.bool], ids=str)
def test_cast_vs_numpy(src):
  a = singles(src)
  for dst in NUMERIC + [dtypes.bool]:
    with np.errstate(all="ignore"): ref = a.astype(to_numpy(dst))
    bad = []
    for x, r in zip(a, ref):
      px = py(x, src)
      if not _cast_ok(src, dst, px): continue
      got = exec_alu(Ops.CAST, dst, (px,))
      if not same(got, r, dst): bad.append((px, got, r.item()))
    assert not bad, f"CAST {src} -> {dst}: {len(bad)} mismatches, first: {bad[:5]}"


def test_cast_out_of_range_float_to_int():
  # the documented x86-like model (see dtype.float_to_int)
  assert float_to_int(300.0, dtypes.int8) == 44 and float_to_int(-300.0, dtypes.uint8) == 212
  assert float_to_int(1e10, dtypes.int32) == -2 ** 31 and float_to_int(math.nan, dtypes.int32) == -2 ** 31
  assert float_to_int(math.inf, dtypes.int16) == 0 and float_to_int(1e10, dtypes.uint32) == 1410065408
  assert float_to_int(-1.0, dtypes.uint64) == 2 ** 64 - 1 and float_to_int(2.0 ** 63, dtypes.uint64) == 2 ** 63
  assert float_to_int(2.0 ** 64, dtypes.uint64) == 0 and float_to_int(-1e30, dtypes.int64) == -2 ** 63
  assert float_to_int(-0.99, dtypes.int8) == 0 and float_to_int(-1.99, dtypes.int8) == -1


def test_int_to_float_rounds_once():
  x = 2 ** 60 + 2 ** 36 + 1  # through float64 first, this would round twice and land on 2**60
  assert int_to_float(x, dtypes.float32) == 2.0 ** 60 + 2.0 ** 37
  assert np.float32(np.int64(x)) == np.float32(2.0 ** 60 + 2.0 ** 37)
  assert int_to_float(2 ** 64 - 1, dtypes.float16) == math.inf and int_to_float(65519, dtypes.float16) == 65504.0
  assert int_to_float(-(2 ** 63), dtypes.bfloat16) == -(2.0 ** 63)


@pytest.mark.parametrize("src", NUMERIC + [dtypes.bool], ids=str)
def test_bitcast_vs_numpy(src):
  a = singles(src)
  for dst in NUMERIC + [dtypes.bool]:
    if dst.itemsize != src.itemsize or dtypes.bool in (src, dst): continue
    ref = a.view(to_numpy(dst))
    bad = []
    for x, r in zip(a, ref):
      if dtypes.is_float(src) and np.isnan(x): continue  # NaN payloads don't survive Python floats (documented)
      got = exec_alu(Ops.BITCAST, dst, (py(x, src),), src_dtype=src)
      if not same(got, r, dst): bad.append((x.item(), got, r.item()))
    assert not bad, f"BITCAST {src} -> {dst}: {bad[:5]}"


def test_bitcast_vectors_and_inference():
  assert exec_alu(Ops.BITCAST, dtypes.uint32, (1.0,)) == 0x3f800000  # float32 inferred from 4 bytes
  assert exec_alu(Ops.BITCAST, dtypes.float16.vec(2), (0x3c003c00,), src_dtype=dtypes.uint32) == (1.0, 1.0)
  bf2 = dtypes.bfloat16.vec(2)
  assert exec_alu(Ops.BITCAST, dtypes.uint16.vec(2), ((1.0, -2.0),), src_dtype=bf2) == (0x3f80, 0xc000)
  assert exec_alu(Ops.BITCAST, dtypes.uint32, (-math.nan,)) >> 31 == 1  # a NaN keeps its sign
  assert exec_alu(Ops.BITCAST, dtypes.uint8, (1.0,), src_dtype=dtypes.fp8e4m3) == 0x38
  with pytest.raises(TypeError, match="src_dtype"): exec_alu(Ops.BITCAST, dtypes.uint16, (1.0,))
  with pytest.raises(TypeError, match="sizes must be equal"): exec_alu(Ops.BITCAST, dtypes.uint16, (1,), dtypes.int32)


# ***** narrow floats (bfloat16, fp8) through the ALU *****
def test_narrow_float_ops_round_to_dtype():
  bf = dtypes.bfloat16
  assert exec_alu(Ops.ADD, bf, (1.0, 2.0 ** -8)) == 1.0           # tie -> even
  assert exec_alu(Ops.ADD, bf, (1.0, 2.0 ** -8 + 2.0 ** -20)) == 1.0 + 2.0 ** -7
  assert exec_alu(Ops.MUL, dtypes.fp8e4m3, (300.0, 2.0)) == 448.0  # saturates
  assert exec_alu(Ops.MUL, dtypes.fp8e5m2, (2.0 ** -16, 0.5)) == 0.0  # half the smallest subnormal: tie -> 0
  assert exec_alu(Ops.CAST, dtypes.fp8e5m2, (math.inf,)) == math.inf
  assert math.isnan(exec_alu(Ops.CAST, dtypes.fp8e4m3, (math.inf,)))


# ***** vectors *****
def test_vector_lanes():
  assert exec_alu(Ops.ADD, dtypes.int8.vec(3), ((1, 127, -128), 1)) == (2, -128, -127)
  assert exec_alu(Ops.CMPLT, dtypes.bool.vec(2), ((1.0, 3.0), (2.0, 2.0))) == (True, False)
  assert exec_alu(Ops.WHERE, dtypes.float32.vec(2), ((True, False), (1.0, 2.0), 0.5)) == (1.0, 0.5)
  assert exec_alu(Ops.CAST, dtypes.uint8.vec(2), ((256, -1),)) == (0, 255)
  with pytest.raises(ValueError, match="different widths"): exec_alu(Ops.ADD, dtypes.int32.vec(2), ((1, 2), (1, 2, 3)))


def test_errors_name_the_problem():
  with pytest.raises(TypeError, match="LOAD is not an ALU op"): exec_alu(Ops.LOAD, dtypes.int32, (1,))
  with pytest.raises(TypeError, match="THREEFRY is not defined for dtypes.int32"):
    exec_alu(Ops.THREEFRY, dtypes.int32, (1, 2))


def test_tables_cover_every_alu_op():
  for dt in [dtypes.bool, *INTS]:
    missing = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.MAX, Ops.CDIV, Ops.CMOD, Ops.SHL, Ops.SHR, Ops.XOR, Ops.OR,
               Ops.AND, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE, Ops.MULACC, Ops.POW, Ops.TRUNC, Ops.CAST}
    missing -= set(python_alu[dt])
    assert not missing, (dt, missing)
  for dt in dtypes.floats:
    missing = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.MAX, Ops.FDIV, Ops.CDIV, Ops.CMOD, Ops.EXP2, Ops.LOG2, Ops.SIN,
               Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC, Ops.POW, Ops.WHERE, Ops.MULACC, Ops.CAST,
               Ops.LDEXP} - set(python_alu[dt])
    assert not missing, (dt, missing)


# ***** threefry2x32-20: Random123's known-answer vectors (ctr0 ctr1 key0 key1 -> out0 out1) *****
KAT = [((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x6b200159, 0x99ba4efe)),
       ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
       ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xc4923a9c, 0x483df7a0))]


@pytest.mark.parametrize("inp,out", KAT)
def test_threefry_known_answers(inp, out):
  c0, c1, k0, k1 = inp
  got = exec_alu(Ops.THREEFRY, dtypes.uint64, (c1 << 32 | c0, k1 << 32 | k0))
  assert (got & 0xffffffff, got >> 32) == out
  assert threefry2x32(c1 << 32 | c0, k1 << 32 | k0) == got


# ***** speed of the constant folder's path (a loose bound: it catches an accidental slow path, not noise) *****
def test_int_fast_path_is_fast():
  import time
  t = time.perf_counter()
  for i in range(20000): exec_alu(Ops.ADD, dtypes.int32, (i, 7))
  assert (time.perf_counter() - t) / 20000 < 20e-6


def test_float16_struct_rounding_matches_numpy_on_all_halfway_points():
  # every float16 and the midpoints between neighbours: Python's 'e' packing must round like numpy
  bits = np.arange(0, 0x7c00, dtype=np.uint16)
  vals = bits.view(np.float16).astype(np.float64)
  mids = (vals[:-1] + vals[1:]) / 2
  ref = mids.astype(np.float16).view(np.uint16)
  got = [struct.unpack("<H", struct.pack("<e", m))[0] for m in mids]
  assert got == ref.tolist()


# ***** CAST through the narrow float types (numpy lacks them: ml_dtypes is the reference when installed) *****
@pytest.mark.parametrize("name,dt", [("bfloat16", dtypes.bfloat16), ("float8_e4m3fn", dtypes.fp8e4m3),
                                     ("float8_e5m2", dtypes.fp8e5m2)])
def test_narrow_float_casts_vs_ml_dtypes(name, dt):
  mld = pytest.importorskip("ml_dtypes")
  mdt = getattr(mld, name)
  codes = np.arange(2 ** (8 * dt.itemsize), dtype=np.uint8 if dt.itemsize == 1 else np.uint16).view(mdt)
  codes = codes[np.isfinite(codes.astype(np.float32))][::7 if dt.itemsize > 1 else 1]  # every 7th bfloat16 code
  for dst in (dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.bool):
    with np.errstate(all="ignore"):
      ref = codes.astype(np.float32).astype(to_numpy(dst)) if dst is not dtypes.bool else codes.astype(np.float32) != 0
    bad = []
    for c, r in zip(codes, ref):
      x = float(c)
      if dtypes.is_int(dst) and not dtypes.min(dst) <= math.trunc(x) <= dtypes.max(dst): continue
      if not same(exec_alu(Ops.CAST, dst, (x,)), r, dst): bad.append((x, exec_alu(Ops.CAST, dst, (x,)), r))
    assert not bad, f"CAST {dt} -> {dst}: {bad[:5]}"
  ints = np.arange(-300, 300, dtype=np.int32)
  ints = ints[np.abs(ints) <= (448 if dt is dtypes.fp8e4m3 else 2 ** 16)]
  ref = ints.astype(np.float32).astype(mdt).astype(np.float64)
  assert [exec_alu(Ops.CAST, dt, (int(i),)) for i in ints] == ref.tolist()
  assert exec_alu(Ops.CAST, dt, (True,)) == 1.0 and exec_alu(Ops.CAST, dtypes.bool, (0.0,)) is False
