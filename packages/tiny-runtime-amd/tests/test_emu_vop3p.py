"""RDNA3 emulator, VOP3P family: WMMA (wave32 16x16x16), packed 16-bit math with op_sel/op_sel_hi/neg, v_fma_mix*,
v_dot*. Expected values come from numpy on the documented semantics and lane layouts (RDNA3 ISA guide, "Wave Matrix
Multiply Accumulate": lane l holds row l%16 of A and column l%16 of B, 16 halves in 8 VGPRs; C/D VGPR i of lane l is
element (2i + l//16, l%16))."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_runtime_amd.emu.encode import V, Code, vop3p

from tiny_runtime_amd.emu.rdna3 import EXEC_LO, Emulator, UnsupportedInstruction, Wave

M32 = 0xFFFFFFFF
rng = np.random.default_rng(1)


def run(*parts: list[int], vgpr: dict[int, list[int]] | None = None, exec_mask: int = M32) -> Wave:
  code, w = Code(*parts), Wave()
  for k, vs in (vgpr or {}).items(): w.vgpr[k] = [int(v) for v in vs]
  w.sgpr[EXEC_LO] = exec_mask
  Emulator().run(w, code.addr)
  return w


def h16(x) -> np.ndarray: return np.asarray(x, dtype=np.float16).view(np.uint16).astype(np.uint32)
def f32bits(x) -> list[int]: return [int(v) for v in np.asarray(x, dtype=np.float32).view(np.uint32)]
def as_f32(bits) -> np.ndarray: return np.array(bits, dtype=np.uint32).view(np.float32)
def as_h(bits) -> np.ndarray: return np.array([b & 0xFFFF for b in bits], dtype=np.uint16).view(np.float16)


def test_encoder_matches_llvm_mc():
  # bytes from `llvm-mc-15 --arch=amdgcn --mcpu=gfx1100 --show-encoding`
  def words(bs): return [int.from_bytes(bytes(bs[i:i + 4]), "little") for i in (0, 4)]
  assert vop3p(64, 0, V(8), V(16), V(0)) == words([0x00, 0x40, 0x40, 0xcc, 0x08, 0x21, 0x02, 0x1c])
  assert vop3p(14, 0, V(1), V(2), V(3), opsel=0b101, opsel_hi=0b010, neg=0b001, neg_hi=0b010) == \
    words([0x00, 0x2a, 0x0e, 0xcc, 0x01, 0x05, 0x0e, 0x34])
  assert vop3p(32, 0, V(1), V(2), V(3), opsel_hi=0) == words([0x00, 0x00, 0x20, 0xcc, 0x01, 0x05, 0x0e, 0x04])


# ***** WMMA *****
def wmma_regs(a_bits: np.ndarray, b_bits: np.ndarray) -> tuple[list[list[int]], list[list[int]]]:
  """Pack 16x16 A and B (16-bit patterns) into 8 VGPRs each, both lane halves holding the same data."""
  ra = [[int(a_bits[l % 16, 2 * j]) | (int(a_bits[l % 16, 2 * j + 1]) << 16) for l in range(32)] for j in range(8)]
  rb = [[int(b_bits[2 * j, l % 16]) | (int(b_bits[2 * j + 1, l % 16]) << 16) for l in range(32)] for j in range(8)]
  return ra, rb


def c_regs(c32_bits: np.ndarray) -> list[list[int]]:
  return [[int(c32_bits[2 * i + l // 16, l % 16]) for l in range(32)] for i in range(8)]


def d_matrix(w: Wave, base: int, conv=lambda v: v) -> np.ndarray:
  d = np.zeros((16, 16), dtype=np.uint32)
  for i in range(8):
    for l in range(32): d[2 * i + l // 16, l % 16] = conv(w.vgpr[base + i][l])
  return d


def _run_wmma(op, a_bits, b_bits, c_bits, vdst=0, **kw):
  ra, rb = wmma_regs(a_bits, b_bits)
  vg = {**{8 + j: ra[j] for j in range(8)}, **{16 + j: rb[j] for j in range(8)},
        **{24 + i: r for i, r in enumerate(c_regs(c_bits))}}
  return run(vop3p(op, vdst, V(8), V(16), V(24), **kw), vgpr=vg)


@pytest.mark.parametrize("exact", [True, False])
def test_wmma_f32_16x16x16_f16(exact):
  if exact:  # small multiples of 1/4: every product and sum is exact in float32, so D must match bit for bit
    a, b = (rng.integers(-16, 17, (2, 16, 16)) / 4).astype(np.float16)
    c = rng.integers(-100, 100, (16, 16)).astype(np.float32)
  else:
    (a, b), c = rng.standard_normal((2, 16, 16)).astype(np.float16), rng.standard_normal((16, 16)).astype(np.float32)
  w = _run_wmma(64, h16(a), h16(b), c.view(np.uint32))
  want = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)
  got = d_matrix(w, 0).view(np.float32)
  if exact: np.testing.assert_array_equal(got, want)
  else: np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_wmma_f32_16x16x16_bf16():
  a32, b32 = rng.standard_normal((2, 16, 16)).astype(np.float32)
  a_bits, b_bits = a32.view(np.uint32) >> 16, b32.view(np.uint32) >> 16  # truncate to bf16 patterns
  a, b = (a_bits << 16).astype(np.uint32).view(np.float32), (b_bits << 16).astype(np.uint32).view(np.float32)
  c = rng.standard_normal((16, 16)).astype(np.float32)
  w = _run_wmma(65, a_bits, b_bits, c.view(np.uint32))
  want = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)
  np.testing.assert_allclose(d_matrix(w, 0).view(np.float32), want, rtol=1e-6, atol=1e-6)


def test_wmma_f16_output_uses_the_half_op_sel_picks():
  a, b = (rng.integers(-8, 9, (2, 16, 16)) / 2).astype(np.float16)
  c = rng.integers(-50, 50, (16, 16)).astype(np.float16)
  c_bits = (h16(c) << 16) | 0x1234  # C in the high halves; the low halves must survive
  w = _run_wmma(66, h16(a), h16(b), c_bits, vdst=24, opsel=0b100)  # accumulate in place, as compilers do
  d = d_matrix(w, 24)
  want = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float16)
  np.testing.assert_array_equal((d >> 16).astype(np.uint16).view(np.float16), want)
  assert (d & 0xFFFF == 0x1234).all()


def test_wmma_needs_full_exec():
  with pytest.raises(UnsupportedInstruction, match="all 32 lanes"):
    run(vop3p(64, 0, V(8), V(16), V(24)), exec_mask=0xFFFF)


# ***** packed 16-bit *****
X, Y, Z = (rng.standard_normal((32, 2)).astype(np.float16) for _ in range(3))
def pk(x: np.ndarray) -> list[int]: return [int(lo) | (int(hi) << 16) for lo, hi in h16(x).reshape(32, 2)]


def halves(bits: list[int]) -> tuple[np.ndarray, np.ndarray]:
  return as_h(bits), as_h([b >> 16 for b in bits])


def f16_fma(a, b, c) -> np.ndarray:  # one rounding: a*b is exact in float64, the sum is rounded to half once
  return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float16)


def test_pk_add_mul_fma_f16_default_selects():
  w = run(vop3p(15, 3, V(0), V(1)), vop3p(16, 4, V(0), V(1)), vop3p(14, 5, V(0), V(1), V(2)),
          vgpr={0: pk(X), 1: pk(Y), 2: pk(Z)})
  for r, want in [(3, X + Y), (4, X * Y), (5, f16_fma(X, Y, Z))]:
    lo, hi = halves(w.vgpr[r])
    np.testing.assert_array_equal(lo, want[:, 0])
    np.testing.assert_array_equal(hi, want[:, 1])


def test_pk_fma_f16_op_sel_and_neg():
  # lo = fma(-x.hi, y.lo, z.hi); hi = fma(x.lo, -y.hi, z.lo)  (op_sel [1,0,1], op_sel_hi [0,1,0], neg_lo/neg_hi)
  w = run(vop3p(14, 3, V(0), V(1), V(2), opsel=0b101, opsel_hi=0b010, neg=0b001, neg_hi=0b010),
          vgpr={0: pk(X), 1: pk(Y), 2: pk(Z)})
  lo, hi = halves(w.vgpr[3])
  np.testing.assert_array_equal(lo, f16_fma(-X[:, 1], Y[:, 0], Z[:, 1]))
  np.testing.assert_array_equal(hi, f16_fma(X[:, 0], -Y[:, 1], Z[:, 0]))


def test_pk_inline_constant_is_a_half_in_both_halves():
  w = run(vop3p(15, 3, V(0), 242), vop3p(16, 4, V(0), 246), vgpr={0: pk(X)})  # + 1.0, * 4.0
  for r, want in [(3, X + np.float16(1)), (4, X * np.float16(4))]:
    lo, hi = halves(w.vgpr[r])
    np.testing.assert_array_equal(lo, want[:, 0])
    np.testing.assert_array_equal(hi, want[:, 1])


def test_pk_integer_ops():
  a, b = rng.integers(0, 2**16, (2, 32, 2))
  pa, pb = [int(x) | (int(y) << 16) for x, y in a], [int(x) | (int(y) << 16) for x, y in b]
  w = run(vop3p(10, 3, V(0), V(1)), vop3p(7, 4, V(0), V(1)), vop3p(1, 5, V(0), V(1)), vop3p(4, 6, V(0), V(1)),
          vgpr={0: pa, 1: pb})
  s16 = lambda v: v.astype(np.int64) - (v >= 2**15) * 2**16
  for r, fn in [(3, lambda x, y: (x + y) % 2**16), (4, lambda x, y: np.maximum(s16(x), s16(y)) % 2**16),
                (5, lambda x, y: (x * y) % 2**16), (6, lambda x, y: (y << (x & 15)) % 2**16)]:
    want = fn(a, b)
    assert w.vgpr[r] == [int(lo) | (int(hi) << 16) for lo, hi in want], r


def test_fma_mix_f32_and_mixlo_mixhi():
  x32 = rng.standard_normal(32).astype(np.float32)
  # v_fma_mix_f32 v3 = x32 * y.hi + z.lo (src0 float32: op_sel_hi bit 0 clear; src1 f16 high half; src2 f16 low)
  w = run(vop3p(32, 3, V(0), V(1), V(2), opsel=0b010, opsel_hi=0b110),
          vop3p(33, 4, V(1), V(1), V(0), opsel=0b010, opsel_hi=0b011, neg=0b100),  # mixlo: y.lo*y.hi - x32 -> v4.l
          vop3p(34, 4, V(2), 242, V(0), opsel_hi=0b011),  # mixhi: z.lo*1.0 + x32 -> v4.h
          vgpr={0: f32bits(x32), 1: pk(Y), 2: pk(Z), 4: [0] * 32})
  want = x32.astype(np.float64) * Y[:, 1].astype(np.float64) + Z[:, 0].astype(np.float64)
  np.testing.assert_array_equal(as_f32(w.vgpr[3]), want.astype(np.float32))
  lo, hi = halves(w.vgpr[4])
  np.testing.assert_array_equal(lo, (Y[:, 0].astype(np.float64) * Y[:, 1] - x32).astype(np.float16))
  np.testing.assert_array_equal(hi, (Z[:, 0].astype(np.float64) + x32).astype(np.float16))


def test_dot2_and_dot4():
  c = rng.standard_normal(32).astype(np.float32)
  w = run(vop3p(19, 3, V(0), V(1), V(2)), vgpr={0: pk(X), 1: pk(Y), 2: f32bits(c)})
  x64, y64 = X.astype(np.float64), Y.astype(np.float64)
  want = (x64[:, 0] * y64[:, 0] + x64[:, 1] * y64[:, 1] + c).astype(np.float32)
  np.testing.assert_allclose(as_f32(w.vgpr[3]), want, rtol=1e-7)
  a, b = rng.integers(0, 2**32, (2, 32))
  acc = rng.integers(0, 2**32, 32)
  w = run(vop3p(22, 3, V(0), V(1), V(2), neg=0b011), vop3p(23, 4, V(0), V(1), V(2)), vgpr={0: a, 1: b, 2: acc})
  ab, bb = a.astype(np.uint32).view(np.uint8).reshape(32, 4), b.astype(np.uint32).view(np.uint8).reshape(32, 4)
  signed = (ab.view(np.int8).astype(np.int64) * bb.view(np.int8)).sum(1)
  unsigned = (ab.astype(np.int64) * bb).sum(1)
  assert w.vgpr[3] == [int(v) for v in (signed + acc) % 2**32]
  assert w.vgpr[4] == [int(v) for v in (unsigned + acc) % 2**32]


def test_unknown_vop3p_opcode_names_the_encoding():
  with pytest.raises(UnsupportedInstruction, match="VOP3P opcode 99"): run(vop3p(99, 0, V(0), V(1)))


def test_vinterp_and_lds_direct_are_not_taken_for_vop3p():
  # v_interp_p10_f32 (0xCD...) and lds_direct_load (0xCE...) share VOP3P's top 6 bits; bytes from llvm-mc-15
  with pytest.raises(UnsupportedInstruction, match="unknown encoding 0xcd000000"): run([0xCD000000, 0x040E0501])
  with pytest.raises(UnsupportedInstruction, match="unknown encoding 0xce1f0001"): run([0xCE1F0001])


@pytest.mark.parametrize("op, bits, signed, clamp", [(68, 8, (1, 1), 1), (68, 8, (0, 1), 0), (69, 4, (1, 0), 0),
                                                    (69, 4, (0, 0), 1)])
def test_wmma_i32_iu8_iu4(op, bits, signed, clamp):
  def words(bs): return [int.from_bytes(bytes(bs[i:i + 4]), "little") for i in (0, 4)]
  assert vop3p(68, 0, V(8), V(16), V(0), neg=0b011, clamp=1) == \
    words([0x00, 0xc0, 0x44, 0xcc, 0x08, 0x21, 0x02, 0x7c])  # llvm-mc-15, neg_lo:[1,1,0] clamp
  lim = 1 << bits
  a_raw, b_raw = rng.integers(0, lim, (2, 16, 16))
  def val(raw, s): return raw - lim * (raw >= lim // 2) if s else raw
  A, B = val(a_raw, signed[0]), val(b_raw, signed[1])
  c = rng.integers(-2**31, 2**31, (16, 16))
  c[0, 0] = 2**31 - 1  # with clamp, adding to it saturates instead of wrapping
  per, nreg = 32 // bits, 16 * bits // 32
  def pack(get) -> list[list[int]]:  # VGPR j of lane l: elements j*per .. j*per+per-1, lowest bits first
    return [[sum(int(get(l % 16, j * per + k)) << (bits * k) for k in range(per)) for l in range(32)]
            for j in range(nreg)]
  ra, rb = pack(lambda r, k: a_raw[r, k]), pack(lambda n, k: b_raw[k, n])
  vg = {**{8 + j: ra[j] for j in range(nreg)}, **{16 + j: rb[j] for j in range(nreg)},
        **{24 + i: [int(c[2 * i + l // 16, l % 16]) & M32 for l in range(32)] for i in range(8)}}
  w = run(vop3p(op, 0, V(8), V(16), V(24), neg=signed[0] | signed[1] << 1, clamp=clamp), vgpr=vg)
  want = A.astype(object) @ B.astype(object) + c.astype(object)
  want = np.clip(want, -2**31, 2**31 - 1) if clamp else want
  got = d_matrix(w, 0).astype(np.int64)
  assert ((got - (want.astype(np.int64) % 2**32)) == 0).all()
