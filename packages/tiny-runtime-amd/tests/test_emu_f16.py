"""RDNA3 emulator, 16-bit float ALU with gfx11 true16 halves: VOP1/VOP2/VOP3/VOPC f16 ops, v_cndmask_b16,
v_pack_b32_f16, v_cvt_pk_rtz_f16_f32, v_div_fixup_f16, global d16_hi stores. Expected values from numpy float16
(one rounding of the exact result), operands chosen where float64 holds the exact result."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_runtime_amd.emu.encode import V, Code, glob, vop1, vop2, vop3, vopc

from tiny_runtime_amd.emu.rdna3 import EXEC_LO, LITERAL, VCC_LO, Emulator, Wave

M32 = 0xFFFFFFFF
rng = np.random.default_rng(2)
X = rng.standard_normal(32).astype(np.float16)
Y = rng.standard_normal(32).astype(np.float16)
Z = rng.standard_normal(32).astype(np.float16)


def run(*parts: list[int], vgpr: dict[int, list[int]] | None = None, sgpr: dict[int, int] | None = None) -> Wave:
  code, w = Code(*parts), Wave()
  for k, vs in (vgpr or {}).items(): w.vgpr[k] = [int(v) for v in vs]
  for k, v in (sgpr or {}).items(): w.sgpr[k] = v
  w.sgpr[EXEC_LO] = M32
  Emulator().run(w, code.addr)
  return w


def hb(x) -> list[int]: return [int(v) for v in np.asarray(x, dtype=np.float16).view(np.uint16)]
def lo(bits) -> np.ndarray: return np.array([b & 0xFFFF for b in bits], dtype=np.uint16).view(np.float16)
def hi(bits) -> np.ndarray: return np.array([b >> 16 for b in bits], dtype=np.uint16).view(np.float16)
def f64(x) -> np.ndarray: return np.asarray(x).astype(np.float64)
def packed(l, h) -> list[int]: return [a | (b << 16) for a, b in zip(hb(l), hb(h))]


def test_fma_min_max_f16_and_opsel_halves():
  # v_fma_f16 v3.h = v0.h * v1.l + v2.l (opsel: src0 hi, dst hi); v_max_f16 e32 v4.l; v_min_f16 e32 into v4.h
  w = run(vop3(0x248, 3, V(0), V(1), V(2), sdst=(1 | 8) << 3), vop2(57, 4, V(0), 1), vop2(58, 4 | 128, V(0) | 128, 1),
          vgpr={0: packed(X, Z), 1: hb(Y), 2: hb(X), 3: [0x1234] * 32, 4: [0] * 32})
  np.testing.assert_array_equal(hi(w.vgpr[3]), (f64(Z) * f64(Y) + f64(X)).astype(np.float16))
  assert [v & 0xFFFF for v in w.vgpr[3]] == [0x1234] * 32  # the other half is kept
  np.testing.assert_array_equal(lo(w.vgpr[4]), np.maximum(X, Y))
  np.testing.assert_array_equal(hi(w.vgpr[4]), np.minimum(Z, Y))  # src0 = v0.h


def test_fmac_fmamk_fmaak_f16():
  k = np.float16(1.5)
  kb = int(np.array(k).view(np.uint16))
  w = run(vop2(54, 2, V(0), 1), vop2(55, 3, V(0), 1), [kb], vop2(56, 4, V(0), 1), [kb],
          vgpr={0: hb(X), 1: hb(Y), 2: hb(Z)})
  np.testing.assert_array_equal(lo(w.vgpr[2]), (f64(X) * f64(Y) + f64(Z)).astype(np.float16))
  np.testing.assert_array_equal(lo(w.vgpr[3]), (f64(X) * f64(k) + f64(Y)).astype(np.float16))
  np.testing.assert_array_equal(lo(w.vgpr[4]), (f64(X) * f64(Y) + f64(k)).astype(np.float16))


def test_vop1_f16():
  pos = np.abs(X) + np.float16(0.25)
  w = run(vop1(84, 2, V(0)), vop1(85, 3, V(0)), vop1(88, 4, V(1)), vop1(87, 5, V(0)), vop1(91, 6, V(1)),
          vop1(93, 7, V(1)), vop1(94, 8, V(1)), vop1(83, 9, V(1)), vop1(81, 10, V(11)), vop1(96, 12, V(13)),
          vgpr={0: hb(pos), 1: hb(X * np.float16(7)), 11: [(i - 16) & 0xFFFF for i in range(32)],
                13: hb(np.arange(32) / 8)})
  np.testing.assert_array_equal(lo(w.vgpr[2]), (1 / f64(pos)).astype(np.float16))
  np.testing.assert_array_equal(lo(w.vgpr[3]), np.sqrt(f64(pos)).astype(np.float16))
  np.testing.assert_array_equal(lo(w.vgpr[4]), np.exp2(f64(X * np.float16(7))).astype(np.float16))
  np.testing.assert_array_equal(lo(w.vgpr[5]), np.log2(f64(pos)).astype(np.float16))
  x7 = X * np.float16(7)
  np.testing.assert_array_equal(lo(w.vgpr[6]), np.floor(x7))
  np.testing.assert_array_equal(lo(w.vgpr[7]), np.trunc(x7))
  np.testing.assert_array_equal(lo(w.vgpr[8]), np.rint(x7))  # round half to even
  assert [v & 0xFFFF for v in w.vgpr[9]] == [int(np.trunc(v)) & 0xFFFF for v in x7]  # v_cvt_i16_f16
  np.testing.assert_array_equal(lo(w.vgpr[10]), np.arange(-16, 16).astype(np.float16))  # v_cvt_f16_i16
  # v_sin_f16 takes revolutions: sin(2*pi*x); exact half rounding of the double result
  np.testing.assert_array_equal(lo(w.vgpr[12]), np.sin(2 * np.pi * f64(np.arange(32) / 8)).astype(np.float16))


def test_vopc_f16_and_class():
  x = X.copy()
  x[:3] = [np.nan, np.inf, -0.0]
  w = run(vopc(0x01, V(0), 1), vop3(0x04, 3, V(0), V(1)), vopc(0x7D, V(0), 2),
          vgpr={0: hb(x), 1: hb(Y), 2: [(1 << 1) | (1 << 9) | (1 << 5)] * 32})
  with np.errstate(invalid="ignore"):
    assert w.sgpr[3] == sum(1 << i for i in range(32) if x[i] > Y[i])  # v_cmp_gt_f16_e64
  assert w.sgpr[VCC_LO] == 0b111  # the last compare: class of qNaN, +inf, -0 -> VCC
  w = run(vopc(0x01, V(0), 1), vgpr={0: hb(x), 1: hb(Y)})
  with np.errstate(invalid="ignore"): assert w.sgpr[VCC_LO] == sum(1 << i for i in range(32) if x[i] < Y[i])


def test_cndmask_b16_pack_and_cvt_pk_rtz():
  w = run(vop3(0x25D, 2, V(0), V(1), 4), vop3(0x311, 3, V(0), V(1), sdst=(2 << 3)),
          vop2(47, 5, V(6), 7), vgpr={0: hb(X), 1: packed(Y, Z),
                                      6: [int(v) for v in np.float32([1 / 3] * 32).view(np.uint32)],
                                      7: [int(v) for v in np.float32([-1e6] * 32).view(np.uint32)]},
          sgpr={4: 0xF0F0F0F0})
  assert [v & 0xFFFF for v in w.vgpr[2]] == [hb(Y)[i] if 0xF0F0F0F0 >> i & 1 else hb(X)[i] for i in range(32)]
  assert w.vgpr[3] == packed(X, Z)  # v_pack_b32_f16 v0.l, v1.h (op_sel[1])
  # 1/3 rounds down in f16 anyway; -1e6 overflows: toward zero it is the largest finite half, not -inf
  third = np.float16(1 / 3)
  assert lo(w.vgpr[5])[0] == third and np.float32(third) <= np.float32(1 / 3)
  assert hi(w.vgpr[5])[0] == np.float16(-65504)


def test_cvt_pk_rtz_rounds_toward_zero():
  x = np.float32(1 + 2**-10 + 2**-11 + 2**-13)  # just above a tie: round to nearest goes up, toward zero goes down
  bits = int(np.array(x).view(np.uint32))
  w = run(vop2(47, 2, V(0), 0), vgpr={0: [bits] * 32})
  assert lo(w.vgpr[2])[0] == np.float16(1 + 2**-10) and np.float16(x) == np.float16(1 + 2**-9)


def test_div_fixup_f16():
  n, d = X, np.abs(Y) + np.float16(0.5)
  w = run(vop3(0x254, 2, V(0), V(1), V(0)), vgpr={0: hb(n), 1: hb(d)})
  np.testing.assert_array_equal(lo(w.vgpr[2]), (f64(n) / f64(d)).astype(np.float16))
  w = run(vop3(0x254, 2, V(0), V(1), V(0)), vgpr={0: hb([1.0] * 32), 1: hb([0.0] * 32)})
  assert np.isinf(lo(w.vgpr[2])).all()


def test_global_store_d16_hi():
  dst = np.zeros(64, dtype=np.uint16)
  da = dst.ctypes.data
  run(glob(37, addr=0, saddr=2, data=1), glob(36, addr=3, saddr=2, data=1),
      vgpr={0: [2 * i for i in range(32)], 1: [(0xAB00 + i) << 16 | 0x1111 for i in range(32)],
            3: [64 + i for i in range(32)]}, sgpr={2: da & M32, 3: da >> 32})
  assert dst[:32].tolist() == [0xAB00 + i for i in range(32)]
  assert dst.view(np.uint8)[64:96].tolist() == [i for i in range(32)]  # the low byte of the high half


@pytest.mark.parametrize("op", [0x254, 0x248])
def test_literal_halves(op):
  # a literal in a 16-bit op is used through its low 16 bits
  one = int(np.array(np.float16(1)).view(np.uint16))
  w = run(vop3(op, 2, V(0), LITERAL, V(0)), [0xFFFF0000 | one], vgpr={0: hb(X)})
  want = (f64(X) * 1 + f64(X)).astype(np.float16) if op == 0x248 else X
  np.testing.assert_array_equal(lo(w.vgpr[2]), want)


def test_vop3_16bit_destination_above_v127():
  # VOP3 names a full 8-bit VGPR; the half comes from op_sel[3] (only e32 encodings use bit 7 for .h)
  w = run(vop3(0x132, 130, V(0), V(1), sdst=8 << 3), vop3(0x248, 131, V(0), V(1), V(0)),
          vgpr={0: hb(X), 1: hb(Y), 2: [0] * 32, 3: [0] * 32, 130: [0x1111] * 32, 131: [0x2222_0000] * 32})
  np.testing.assert_array_equal(hi(w.vgpr[130]), X + Y)
  assert [v & 0xFFFF for v in w.vgpr[130]] == [0x1111] * 32 and w.vgpr[2] == [0] * 32 and w.vgpr[3] == [0] * 32
  np.testing.assert_array_equal(lo(w.vgpr[131]), (f64(X) * f64(Y) + f64(X)).astype(np.float16))
  assert [v >> 16 for v in w.vgpr[131]] == [0x2222] * 32
