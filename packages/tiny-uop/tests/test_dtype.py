"""dtypes: the promotion lattice (tinygrad's), limits, Python/numpy interop, narrow-float rounding, pickling."""
import itertools
import math
import pickle
import struct

import pytest

from tiny_uop import dtypes, least_upper_dtype, to_dtype
from tiny_uop.dtype import (AddrSpace, bits_to_float, float_to_bits, least_upper_float, round_float, sum_acc_dtype,
                            truncate_int)

D = dtypes
# The promotion table of tinygrad 0.14 (`strong_dtype(least_upper_dtype(a, b))`, read from its lattice), one row
# per dtype in this column order. "F" is the weak float: no int type holds both, so default_float.
ORDER = [D.bool, D.int8, D.uint8, D.int16, D.uint16, D.int32, D.uint32, D.int64, D.uint64, D.fp8e4m3, D.fp8e5m2,
         D.float16, D.bfloat16, D.float32, D.float64]
NAMES = {"b": D.bool, "i8": D.int8, "u8": D.uint8, "i16": D.int16, "u16": D.uint16, "i32": D.int32, "u32": D.uint32,
         "i64": D.int64, "u64": D.uint64, "e4": D.fp8e4m3, "e5": D.fp8e5m2, "h": D.float16, "bf": D.bfloat16,
         "f": D.float32, "d": D.float64}
TABLE = """
b   i8  u8  i16 u16 i32 u32 i64 u64 e4 e5 h  bf f d
i8  i8  i16 i16 i32 i32 i64 i64 F   e4 e5 h  bf f d
u8  i16 u8  i16 u16 i32 u32 i64 u64 e4 e5 h  bf f d
i16 i16 i16 i16 i32 i32 i64 i64 F   e4 e5 h  bf f d
u16 i32 u16 i32 u16 i32 u32 i64 u64 e4 e5 h  bf f d
i32 i32 i32 i32 i32 i32 i64 i64 F   e4 e5 h  bf f d
u32 i64 u32 i64 u32 i64 u32 i64 u64 e4 e5 h  bf f d
i64 i64 i64 i64 i64 i64 i64 i64 F   e4 e5 h  bf f d
u64 F   u64 F   u64 F   u64 F   u64 e4 e5 h  bf f d
e4  e4  e4  e4  e4  e4  e4  e4  e4  e4 h  h  bf f d
e5  e5  e5  e5  e5  e5  e5  e5  e5  h  e5 h  bf f d
h   h   h   h   h   h   h   h   h   h  h  h  f  f d
bf  bf  bf  bf  bf  bf  bf  bf  bf  bf bf f  bf f d
f   f   f   f   f   f   f   f   f   f  f  f  f  f d
d   d   d   d   d   d   d   d   d   d  d  d  d  d d
"""


def _expected(name):
  return None if name == "F" else NAMES[name]


def test_promotion_table_matches_tinygrad():
  rows = [r.split() for r in TABLE.strip().splitlines()]
  assert len(rows) == len(ORDER) and all(len(r) == len(ORDER) for r in rows)
  bad = []
  for (i, a), (j, b) in itertools.product(enumerate(ORDER), enumerate(ORDER)):
    want = _expected(rows[i][j]) or dtypes.default_float
    if least_upper_dtype(a, b) is not want: bad.append((a, b, least_upper_dtype(a, b), want))
  assert not bad, bad


def test_promotion_is_a_lattice():
  for a, b in itertools.product(ORDER, ORDER):
    assert least_upper_dtype(a, b) is least_upper_dtype(b, a)
    assert least_upper_dtype(a, least_upper_dtype(a, b)) is least_upper_dtype(a, b)
  for a, b, c in itertools.product(ORDER, ORDER, ORDER):
    # (not associative: tinygrad's lattice joins fp8e4m3 and fp8e5m2 at float16 *and* bfloat16, and the weak float
    # resolves per call) but the n-ary join is an upper bound of each and the least of the joins' common parents
    r = least_upper_dtype(a, b, c)
    assert all(least_upper_dtype(r, x) is r for x in (a, b, c)), (a, b, c, r)
  for a in ORDER: assert least_upper_dtype(a) is a and least_upper_dtype(a, a) is a


def test_weak_float_follows_default_float():
  old = dtypes.default_float
  try:
    dtypes.default_float = dtypes.float16
    assert least_upper_dtype(dtypes.int64, dtypes.uint64) is dtypes.float16
    assert least_upper_float(dtypes.int32) is dtypes.float16
  finally: dtypes.default_float = old
  assert least_upper_dtype(dtypes.int64, dtypes.uint64) is old
  # three-way: the weak float stays inside the lattice until the end
  assert least_upper_dtype(dtypes.int8, dtypes.uint64, dtypes.fp8e5m2) is dtypes.fp8e5m2


def test_promotion_of_vectors_and_errors():
  assert least_upper_dtype(dtypes.int8.vec(4), dtypes.uint8) is dtypes.int16
  with pytest.raises(TypeError, match="promotion lattice"): least_upper_dtype(dtypes.void, dtypes.int8)


def test_sum_acc_dtype():
  assert [sum_acc_dtype(d) for d in ORDER] == [D.int32, D.int32, D.uint32, D.int32, D.uint32, D.int32, D.uint32,
                                             D.int64, D.uint64, D.float32, D.float32, D.float32, D.float32,
                                             D.float32, D.float64]


def test_min_max():
  for d in dtypes.ints:
    bits = 8 * d.itemsize
    assert (d.min, d.max) == ((0, 2 ** bits - 1) if dtypes.is_unsigned(d) else (-2 ** (bits - 1), 2 ** (bits - 1) - 1))
    assert truncate_int(d.max + 1, d) == d.min and truncate_int(d.min - 1, d) == d.max
  assert (dtypes.bool.min, dtypes.bool.max) == (False, True)
  for d in dtypes.floats: assert (d.min, d.max) == (-math.inf, math.inf)
  assert dtypes.int8.vec(4).max == 127


def test_finfo():
  assert {d: dtypes.finfo(d) for d in dtypes.floats} == {
    D.float16: (5, 10), D.bfloat16: (8, 7), D.float32: (8, 23), D.float64: (11, 52), D.fp8e4m3: (4, 3),
    D.fp8e5m2: (5, 2), D.fp8e4m3fnuz: (4, 3), D.fp8e5m2fnuz: (5, 2)}
  np = pytest.importorskip("numpy")
  for d in (D.float16, D.float32, D.float64):
    fi = np.finfo(d.fmt)
    assert dtypes.finfo(d) == (fi.nexp, fi.nmant)
  with pytest.raises(ValueError, match="not a floating point type"): dtypes.finfo(dtypes.int32)


def test_from_py():
  assert dtypes.from_py(True) is dtypes.bool and dtypes.from_py(3) is dtypes.default_int
  assert dtypes.from_py(3.0) is dtypes.default_float and dtypes.from_py([]) is dtypes.default_float
  assert dtypes.from_py([1, 2]) is dtypes.default_int and dtypes.from_py([True, 2]) is dtypes.default_int
  assert dtypes.from_py([[1, 2.5], [3, 4]]) is dtypes.default_float and dtypes.from_py((True, False)) is dtypes.bool
  with pytest.raises(TypeError, match="can't infer a dtype from str"): dtypes.from_py("x")


def test_as_const_rounds_and_wraps():
  assert dtypes.as_const(0.1, dtypes.float32) == struct.unpack("<f", struct.pack("<f", 0.1))[0]
  assert dtypes.as_const(0.1, dtypes.float64) == 0.1
  assert dtypes.as_const(1e6, dtypes.float16) == math.inf and dtypes.as_const(1.0 + 2 ** -9, dtypes.bfloat16) == 1.0
  assert dtypes.as_const(300, dtypes.uint8) == 44 and dtypes.as_const(-1, dtypes.uint32) == 2 ** 32 - 1
  assert dtypes.as_const(2.7, dtypes.int32) == 2 and dtypes.as_const(-2.7, dtypes.int32) == -2
  assert dtypes.as_const(2, dtypes.bool) is True and dtypes.as_const((1, 2.5), dtypes.float32) == (1.0, 2.5)
  assert dtypes.as_const(float("nan"), dtypes.float32) is math.nan  # one NaN object: equal constants intern


def test_numpy_interop():
  np = pytest.importorskip("numpy")
  from tiny_uop.dtype import from_numpy, to_numpy
  for d in (D.bool, *dtypes.ints, D.float16, D.float32, D.float64):
    assert from_numpy(to_numpy(d)) is d and to_dtype(to_numpy(d)) is d
    assert to_numpy(d).itemsize == d.itemsize
  assert from_numpy(np.float32) is D.float32 and to_dtype(np.int8) is D.int8
  with pytest.raises(TypeError, match="numpy has no dtype for dtypes.bfloat16"): to_numpy(D.bfloat16)
  with pytest.raises(TypeError, match="complex64"): from_numpy(np.complex64)
  assert to_dtype("float32") is D.float32 and to_dtype("half") is D.float16
  with pytest.raises(ValueError, match="unknown dtype 'flaot32'"): to_dtype("flaot32")


def test_pickle():
  for d in [*dtypes.all, D.float32.vec(4), D.int8.vec(16), D.float32.ptr(16), D.half.ptr(8, AddrSpace.LOCAL).vec(4),
            D.int32.ptr(), dtypes.imagef((2, 4, 4)), dtypes.imageh((1, 8, 4)), D.void]:
    assert pickle.loads(pickle.dumps(d)) is d, d
  assert D.float32.ptr(16) is D.float32.ptr(size=16) is D.float32.ptr(16, AddrSpace.GLOBAL)


def test_vec_and_ptr():
  v = dtypes.float32.vec(4)
  assert v.count == 4 and v.itemsize == 16 and v.scalar() is dtypes.float32 and v is dtypes.float32.vec(4)
  assert repr(v) == "dtypes.float32.vec(4)" and repr(dtypes.float32.ptr(16)) == "dtypes.float32.ptr(16)"
  with pytest.raises(ValueError, match="already a vector"): v.vec(2)
  p = dtypes.float32.ptr(16, AddrSpace.LOCAL)
  assert p.base is dtypes.float32 and p.addrspace is AddrSpace.LOCAL and p.size == 16
  with pytest.raises(TypeError, match="pointer to pointer"): p.ptr()


# ***** narrow float rounding *****
FP8_MAX = {D.fp8e4m3: 448.0, D.fp8e5m2: 57344.0}


def test_bfloat16_round_to_nearest_even():
  assert float_to_bits(1.0 + 2 ** -8, D.bfloat16) == 0x3f80             # tie, even stays
  assert float_to_bits(1.0 + 3 * 2 ** -8, D.bfloat16) == 0x3f82         # tie, odd rounds up
  assert float_to_bits(1.0 + 2 ** -8 + 2 ** -40, D.bfloat16) == 0x3f81  # just above the tie: no float32 detour
  assert float_to_bits(3.3895313892515355e38, D.bfloat16) == 0x7f7f and float_to_bits(3.4e38, D.bfloat16) == 0x7f80
  assert float_to_bits(-0.0, D.bfloat16) == 0x8000 and float_to_bits(math.inf, D.bfloat16) == 0x7f80
  assert math.isnan(bits_to_float(float_to_bits(math.nan, D.bfloat16), D.bfloat16))
  assert float_to_bits(2.0 ** -133, D.bfloat16) == 1 and float_to_bits(2.0 ** -134, D.bfloat16) == 0  # subnormal, tie


def test_fp8_hand_values():
  e4, e5 = D.fp8e4m3, D.fp8e5m2
  assert [float_to_bits(x, e4) for x in (1.0, -2.0, 448.0, 1e9, -1e9, 2.0 ** -9, 2.0 ** -10)] == \
    [0x38, 0xc0, 0x7e, 0x7e, 0xfe, 0x01, 0x00]
  assert float_to_bits(math.inf, e4) == 0x7f and float_to_bits(-math.inf, e4) == 0xff
  assert float_to_bits(math.nan, e4) == 0x7f and float_to_bits(-math.nan, e4) == 0xff
  assert bits_to_float(0x7e, e4) == 448.0 and math.isnan(bits_to_float(0xff, e4)) and bits_to_float(0x77, e4) == 240.0
  assert [float_to_bits(x, e5) for x in (1.0, 57344.0, 61440.0, 1e9, math.inf, -math.inf, 2.0 ** -16)] == \
    [0x3c, 0x7b, 0x7b, 0x7b, 0x7c, 0xfc, 0x01]
  assert bits_to_float(0x7c, e5) == math.inf and math.isnan(bits_to_float(0x7d, e5))
  assert bits_to_float(0x04, e5) == 2.0 ** -14
  assert round_float(1.0625, e4) == 1.0 and round_float(1.1875, e4) == 1.25  # ties to even mantissa


@pytest.fixture(scope="module")
def mld():
  return pytest.importorskip("ml_dtypes")


def _float32_samples(np, n=60000):
  rng = np.random.default_rng(7)
  bits = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
  vals = bits.view(np.float32)
  # also dense samples around the fp8 range, including exact ties
  dense = (np.arange(-5000, 5000, dtype=np.float32) / np.float32(64))
  return np.concatenate([vals, dense, np.float32([0.0, -0.0, np.inf, -np.inf])])


def test_bfloat16_vs_ml_dtypes(mld):
  np = pytest.importorskip("numpy")
  x = _float32_samples(np)
  x = x[~np.isnan(x)]
  ref = x.astype(mld.bfloat16).view(np.uint16)
  got = np.array([float_to_bits(float(v), D.bfloat16) for v in x], dtype=np.uint16)
  assert (got == ref).all(), list(zip(x[got != ref][:5], got[got != ref][:5], ref[got != ref][:5]))


@pytest.mark.parametrize("name,dt", [("float8_e4m3fn", D.fp8e4m3), ("float8_e5m2", D.fp8e5m2)])
def test_fp8_vs_ml_dtypes(mld, name, dt):
  np = pytest.importorskip("numpy")
  mdt = getattr(mld, name)
  # decode: all 256 codes
  dec = np.arange(256, dtype=np.uint8).view(mdt).astype(np.float64)
  for b in range(256):
    ours = bits_to_float(b, dt)
    assert (math.isnan(ours) and math.isnan(dec[b])) or struct.pack("<d", ours) == struct.pack("<d", dec[b]), hex(b)
  # encode: every finite float32 up to the largest finite fp8 value (ml_dtypes turns larger ones into NaN/inf;
  # we saturate, like tinygrad)
  x = _float32_samples(np)
  x = x[np.abs(x) <= FP8_MAX[dt]]
  ref = x.astype(mdt).view(np.uint8)
  got = np.array([float_to_bits(float(v), dt) for v in x], dtype=np.uint8)
  assert (got == ref).all(), list(zip(x[got != ref][:5], got[got != ref][:5], ref[got != ref][:5]))


def test_float16_rounding_of_float64_values():
  np = pytest.importorskip("numpy")
  rng = np.random.default_rng(3)
  x = rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 6, 5000)
  with np.errstate(over="ignore"): ref = x.astype(np.float16).view(np.uint16)
  assert [float_to_bits(float(v), D.float16) for v in x] == ref.tolist()
