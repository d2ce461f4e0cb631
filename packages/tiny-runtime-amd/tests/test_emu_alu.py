"""RDNA3 emulator, ALU ops found in compiled kernels beyond the first families: the SOP1 saveexec family (opcode
numbers checked against llvm-mc-15's gfx1100 disassembly), s_ctz/s_clz/s_bcnt/s_cmov/s_bitset, 16-bit integer VOP3
ops, med3, and the 16->32-bit conversions. Expected values from the ISA's definitions, computed with Python ints."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_runtime_amd.emu.encode import V, Code, sop1, sop2, sopk, sopp, vop1, vop2, vop3, vopd

from tiny_runtime_amd.emu.rdna3 import EXEC_LO, Emulator, UnsupportedInstruction, Wave

M32 = 0xFFFFFFFF
rng = np.random.default_rng(4)


def run(*parts, vgpr=None, sgpr=None, exec_mask=M32, scc=0) -> Wave:
  code, w = Code(*parts), Wave()
  for k, vs in (vgpr or {}).items(): w.vgpr[k] = [int(v) for v in vs]
  for k, v in (sgpr or {}).items(): w.sgpr[k] = v
  w.sgpr[EXEC_LO], w.scc = exec_mask, scc
  Emulator().run(w, code.addr)
  return w


@pytest.mark.parametrize("op, fn", [
  (32, lambda s, e: s & e), (34, lambda s, e: s | e), (36, lambda s, e: s ^ e), (38, lambda s, e: ~(s & e)),
  (40, lambda s, e: ~(s | e)), (42, lambda s, e: ~(s ^ e)), (44, lambda s, e: ~s & e), (46, lambda s, e: ~s | e),
  (48, lambda s, e: s & ~e), (50, lambda s, e: s | ~e)])
def test_saveexec_family(op, fn):
  src, ex = 0x0F0F_3C3C, 0x00FF_F00F
  w = run(sop1(op, 2, 0), sgpr={0: src}, exec_mask=ex)
  assert w.sgpr[2] == ex and w.sgpr[EXEC_LO] == fn(src, ex) & M32 and w.scc == int(fn(src, ex) & M32 != 0)


def test_scalar_bit_ops():
  w = run(sop1(8, 2, 0), sop1(10, 3, 0), sop1(24, 4, 0), sop1(22, 5, 0), sop1(8, 6, 1), sop1(18, 7, 132),
          sop1(16, 8, 129), sop1(2, 9, 0), sgpr={0: 0x0012_3400, 1: 0, 7: 0, 8: 0xFF}, scc=1)
  assert (w.sgpr[2], w.sgpr[3], w.sgpr[4], w.sgpr[5]) == (10, 11, 5, 27)  # ctz, clz, bcnt1, bcnt0 of 0x00123400
  assert w.sgpr[6] == M32 and w.sgpr[7] == 16 and w.sgpr[8] == 0xFD and w.sgpr[9] == 0x0012_3400
  assert run(sop1(2, 9, 0), sgpr={0: 5, 9: 1}, scc=0).sgpr[9] == 1  # s_cmov with SCC = 0 keeps the destination


def s16(v: int) -> int: return (v & 0xFFFF) - (1 << 16 if v & 0x8000 else 0)


def test_16bit_integer_vop3_and_med3():
  a, b, c = (rng.integers(0, 2**32, 32).tolist() for _ in range(3))
  w = run(vop3(0x309, 3, V(0), V(1)), vop3(0x30A, 4, V(0), V(1)), vop3(0x30B, 5, V(0), V(1)),
          vop3(0x30C, 6, V(0), V(1), sdst=(1 | 2 | 8) << 3), vop3(0x253, 7, V(0), V(1), V(2)),
          vop3(0x250, 8, V(0), V(1), V(2)), vop3(0x220, 9, V(0), V(1), V(2)), vop3(0x221, 10, V(0), V(1), V(2)),
          vgpr={0: a, 1: b, 2: c, **{r: [0] * 32 for r in range(3, 9)}})
  lo = lambda v: v & 0xFFFF
  assert w.vgpr[3] == [max(lo(x), lo(y)) for x, y in zip(a, b)]
  assert w.vgpr[4] == [max(s16(x), s16(y)) & 0xFFFF for x, y in zip(a, b)]
  assert w.vgpr[5] == [min(lo(x), lo(y)) for x, y in zip(a, b)]
  assert w.vgpr[6] == [(min(s16(x >> 16), s16(y >> 16)) & 0xFFFF) << 16 for x, y in zip(a, b)]  # .h halves, dst .h
  assert w.vgpr[7] == [(s16(x) * s16(y) + s16(z)) & 0xFFFF for x, y, z in zip(a, b, c)]
  assert w.vgpr[8] == [sorted((s16(x), s16(y), s16(z)))[1] & 0xFFFF for x, y, z in zip(a, b, c)]
  sx = lambda v: v - (1 << 32) if v >> 31 else v
  assert w.vgpr[9] == [sorted((sx(x), sx(y), sx(z)))[1] & M32 for x, y, z in zip(a, b, c)]
  assert w.vgpr[10] == [sorted((x, y, z))[1] for x, y, z in zip(a, b, c)]


def test_16_to_32bit_conversions_and_not_b16():
  a = rng.integers(0, 2**32, 32).tolist()
  w = run(vop1(106, 2, V(0) | 128), vop1(107, 3, V(0)), vop3(0x1EA, 4, V(0), 0), vop1(105, 5, V(0)),
          vgpr={0: a, 5: [0xABCD_0000] * 32})
  assert w.vgpr[2] == [s16(x >> 16) & M32 for x in a]  # e32: v0.h
  assert w.vgpr[3] == [x & 0xFFFF for x in a]
  assert w.vgpr[4] == [s16(x) & M32 for x in a]
  assert w.vgpr[5] == [0xABCD_0000 | (~x & 0xFFFF) for x in a]


def test_float32_output_modifiers():
  def words(bs): return [int.from_bytes(bytes(bs[i:i + 4]), "little") for i in (0, 4)]
  assert vop3(0x110, 0, V(1), V(2), clamp=1) == words([0x00, 0x80, 0x10, 0xd5, 0x01, 0x05, 0x02, 0x00])  # llvm-mc-15
  assert vop3(0x103, 0, V(1), V(2), omod=1) == words([0x00, 0x00, 0x03, 0xd5, 0x01, 0x05, 0x02, 0x08])
  x = (rng.standard_normal(32) * 2).astype(np.float32)
  x[:2] = [np.nan, np.inf]
  y = rng.standard_normal(32).astype(np.float32)
  y[1] = 1.0
  w = run(vop3(0x110, 3, V(0), V(1), clamp=1), vop3(0x103, 4, V(0), V(1), omod=1),
          vop3(0x213, 5, V(0), V(1), V(1), omod=3, clamp=1), vgpr={0: x.view(np.uint32), 1: y.view(np.uint32)})
  f = lambda r: np.array(w.vgpr[r], np.uint32).view(np.float32)
  with np.errstate(invalid="ignore"):
    np.testing.assert_array_equal(f(3), np.nan_to_num(np.clip(np.fmax(x, y), 0, 1), nan=0.0))  # max, then clamp
    np.testing.assert_array_equal(f(4), (x + y) * 2)  # mul:2
    fused = np.array([float(a) * float(b) + float(b) for a, b in zip(x, y)]) / 2  # fma, then div:2, then clamp
    np.testing.assert_allclose(f(5)[2:], np.clip(fused[2:], 0, 1).astype(np.float32), rtol=1e-6)
    assert f(5)[0] == 0.0 and f(5)[1] == 1.0  # NaN clamps to 0; inf to 1


def test_vop1_float_and_bit_counting():
  x = (rng.standard_normal(32) * 10).astype(np.float32)
  x[:4] = [2.5, -2.5, -1e-9, 0.0]
  xb = x.view(np.uint32).tolist()
  ints = [0, 1, 0x80000000, 0x00F0_0000] + rng.integers(0, 2**32, 28).tolist()
  w = run(vop1(35, 2, V(0)), vop1(32, 3, V(0)), vop1(64, 4, V(0)), vop1(63, 5, V(0)), vop1(57, 6, V(1)),
          vop1(58, 7, V(1)), vop1(13, 8, V(0)), vop1(12, 9, V(0)), vop1(53, 10, V(11)), vop1(46, 12, V(13)),
          vgpr={0: xb, 1: ints, 11: np.float32(np.arange(32) / 16).view(np.uint32), 13: np.abs(x).view(np.uint32)})
  f = lambda r: np.array(w.vgpr[r], np.uint32).view(np.float32)
  np.testing.assert_array_equal(f(2), np.rint(x))  # v_rndne_f32: ties to even (2.5 -> 2, -2.5 -> -2)
  fr = x.astype(np.float64) - np.floor(x.astype(np.float64))
  want = np.minimum(fr.astype(np.float32), np.float32(1 - 2.0**-24))
  np.testing.assert_array_equal(f(3), want)  # v_fract_f32: -1e-9 gives the largest float below 1, not 1.0
  assert f(3)[2] == np.float32(1 - 2.0**-24)
  m, e = np.frexp(x)
  np.testing.assert_array_equal(f(4), m)
  assert w.vgpr[5] == [int(v) & M32 for v in e]
  assert w.vgpr[6] == [M32 if v == 0 else 32 - v.bit_length() for v in ints]  # v_clz_i32_u32
  assert w.vgpr[7] == [M32 if v == 0 else (v & -v).bit_length() - 1 for v in ints]  # v_ctz_i32_b32
  # v_cls_i32: leading bits equal to the sign bit, counted from bit 30 (bit 31 - i is the first that differs)
  sints = [0, M32, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0x40000000, 0xC0000000] + rng.integers(0, 2**32, 24).tolist()
  wc = run(vop1(59, 2, V(1)), vgpr={1: sints})
  want = [next((i for i in range(1, 32) if (v >> (31 - i)) & 1 != v >> 31), M32) for v in sints]
  assert wc.vgpr[2] == want and want[:8] == [M32, M32, 31, 1, 1, 31, 1, 2]
  assert w.vgpr[8] == [int(np.floor(v)) & M32 for v in x]
  assert w.vgpr[9] == [int(np.floor(np.float64(v) + 0.5)) & M32 for v in x]
  np.testing.assert_array_equal(f(10), np.sin(2 * np.pi * (np.arange(32) / 16)).astype(np.float32))  # revolutions
  ax = np.abs(x).astype(np.float64)
  with np.errstate(divide="ignore"):
    np.testing.assert_allclose(f(12)[4:], (1 / np.sqrt(ax)).astype(np.float32)[4:], rtol=1e-7)


@pytest.mark.parametrize("op, fn, sets_scc", [
  (28, lambda a, b: ~(a & b), True), (30, lambda a, b: ~(a | b), True), (32, lambda a, b: ~(a ^ b), True),
  (36, lambda a, b: a | ~b, True), (6, lambda a, b: abs(s32(a) - s32(b)), True),
  (42, lambda a, b: ((1 << (a & 31)) - 1) << (b & 31), False), (50, lambda a, b: (a & 0xFFFF) | (b << 16), False),
  (51, lambda a, b: (a & 0xFFFF) | (b & 0xFFFF0000), False), (52, lambda a, b: (a >> 16) | (b & 0xFFFF0000), False)])
def test_sop2_logic_pack_bfm(op, fn, sets_scc):
  for a, b in [(0x1234_5678, 0x8765_4321), (0xFFFF_FFFF, 0xFFFF_FFFF), (5, 12)]:
    w = run(sop2(op, 2, 0, 1), sgpr={0: a, 1: b}, scc=1)
    assert w.sgpr[2] == fn(a, b) & M32, (op, a, b)
    if sets_scc: assert w.scc == int(fn(a, b) & M32 != 0)


def s32(v: int) -> int: return v - (1 << 32) if v >> 31 else v


def test_getpc_setpc_swappc_and_64bit_counts():
  # s_getpc_b64 s[0:1] (= code + 4); s_add_u32 s0, s0, 24; s_addc_u32 s1, s1, 0; s_swappc_b64 s[4:5], s[0:1] to
  # code + 28, skipping s_movk_i32 s6, 1 and s_movk_i32 s7, 2 (at 20 and 24); s_movk_i32 s8, 3 is the target
  prog = [*sop1(71, 0, 0), *sop2(0, 0, 0, LIT), 24, *sop2(4, 1, 1, 128), *sop1(73, 4, 0), *sopk(0, 6, 1),
          *sopk(0, 7, 2), *sopk(0, 8, 3)]
  code, w = Code(prog), Wave()
  w.sgpr[EXEC_LO] = M32
  Emulator().run(w, code.addr)
  assert (w.sgpr[6], w.sgpr[7], w.sgpr[8]) == (0, 0, 3)
  assert w.sgpr[4] | (w.sgpr[5] << 32) == code.addr + 20  # s_swappc saved the address after itself
  w = run(sop1(25, 2, 0), sop1(9, 3, 0), sopk(2, 4, -5), sgpr={0: 0, 1: 0x0000_0F00}, scc=1)
  assert (w.sgpr[2], w.sgpr[3], w.sgpr[4], w.scc) == (4, 40, (-5) & M32, 1)
  w = run(sopp(17, 0), sopp(18, 15), sopp(3, 1), sopp(53, 1))  # round to nearest, denorm mode, sleep, setprio: no-ops
  with pytest.raises(UnsupportedInstruction, match="SOPP opcode 17"): run(sopp(17, 5))  # another rounding mode


LIT = 255


def test_mul_dx9_zero_and_dual_dot2acc():
  def words(bs): return [int.from_bytes(bytes(bs[i:i + 4]), "little") for i in range(0, len(bs), 4)]
  assert vopd(7, 8, 0, 3, V(1), 2, V(4), 0) == words([0x01, 0x05, 0xd0, 0xc9, 0x04, 0x01, 0x02, 0x00])  # llvm-mc-15
  x = np.array([0, 0, np.inf, np.nan, 2, -3] + [1.5] * 26, np.float32)
  y = np.array([np.inf, np.nan, 0, -0.0, 4, 0.5] + [-2] * 26, np.float32)
  w = run(vop2(7, 2, V(0), 1), vopd(7, 8, 4, 5, V(0), 1, V(0), 0), vgpr={0: x.view(np.uint32), 1: y.view(np.uint32)})
  with np.errstate(invalid="ignore"): want = np.where((x == 0) | (y == 0), np.float32(0), x * y)
  for r in (2, 4):
    assert np.array_equal(np.array(w.vgpr[r], np.uint32).view(np.float32), want)  # no NaN: a zero wins over inf/NaN
  h = rng.standard_normal((2, 32, 2)).astype(np.float16)
  pk = [[int(lo) | (int(hi) << 16) for lo, hi in v.view(np.uint16)] for v in h]
  acc = rng.standard_normal(32).astype(np.float32)
  w = run(vopd(12, 8, 6, 7, V(0), 1, V(0), 0), vgpr={0: pk[0], 1: pk[1], 6: acc.view(np.uint32)})
  h64 = h.astype(np.float64)
  want = (h64[0, :, 0] * h64[1, :, 0] + h64[0, :, 1] * h64[1, :, 1] + acc).astype(np.float32)
  np.testing.assert_allclose(np.array(w.vgpr[6], np.uint32).view(np.float32), want, rtol=1e-7)
  assert w.vgpr[7] == pk[0]  # the Y half: v_dual_mov_b32 v7, v0


@pytest.mark.parametrize("src", [0x0000_FFFF_1234_5678, 0xFFFF_FFFF_FFFF_FFFF, 0, 0x8000_0000_0000_0001])
def test_s_not_b64(src):
  # RDNA3 ISA, SOP1 S_NOT_B64 (opcode 31 = 0x1f; LLVM gfx11_asm_sop1.s encodes s_not_b64 s[0:1], s[2:3] as
  # 02 1f 80 be): D.u64 = ~S0.u64, SCC = D.u64 != 0. Reference: numpy's 64-bit bitwise not.
  assert bytes(np.array(sop1(31, 0, 2), np.uint32).view(np.uint8)) == bytes([0x02, 0x1F, 0x80, 0xBE])
  w = run(sop1(31, 4, 2), sgpr={2: src & M32, 3: src >> 32}, scc=1 - int(src != 2**64 - 1))
  want = int(np.invert(np.uint64(src)))
  assert (w.sgpr[4], w.sgpr[5], w.scc) == (want & M32, want >> 32, int(want != 0))
  assert (w.sgpr[2], w.sgpr[3]) == (src & M32, src >> 32)  # the source pair is untouched


def test_s_not_b64_inline_constant_source():
  # an inline integer constant in a 64-bit operand is the 64-bit value: ~(-1) = 0 (SCC 0), ~5 = 0xFFFF_FFFF_FFFF_FFFA
  w = run(sop1(31, 4, 193), sop1(31, 6, 133), scc=1)
  assert (w.sgpr[4], w.sgpr[5]) == (0, 0) and (w.sgpr[6], w.sgpr[7]) == (int(np.invert(np.uint64(5))) & M32, M32)
  assert w.scc == 1  # the last op's result (~5) is non-zero
  assert run(sop1(31, 4, 193), scc=1).scc == 0


def test_mad_i64_i32_and_mad_u64_u32_carry_out():
  # RDNA3 ISA, VOP3SD: V_MAD_U64_U32 {D1.u1, D0.u64} = S0.u32 * S1.u32 + S2.u64 and V_MAD_I64_I32 (opcode 0x2ff)
  # {D1.i1, D0.i64} = S0.i32 * S1.i32 + S2.i64, both as 65-bit results: D1 (the sdst lane bit) is bit 64
  a, b = rng.integers(0, 2**32, 32).tolist(), rng.integers(0, 2**32, 32).tolist()
  c = rng.integers(0, 2**64, 32, dtype=np.uint64).tolist()
  a[:3], b[:3], c[:3] = [M32, 0x8000_0000, 5], [M32, 0x8000_0000, 7], [2**64 - 1, 0, 2**63]
  vg = {0: a, 1: b, 2: [v & M32 for v in c], 3: [v >> 32 for v in c]}
  w = run(vop3(0x2FF, 4, V(0), V(1), V(2), sdst=8), vop3(0x2FE, 6, V(0), V(1), V(2), sdst=9), vgpr=vg)
  sx = lambda v, n: v - (1 << n) if v >> (n - 1) & 1 else v
  signed = [sx(x, 32) * sx(y, 32) + sx(z, 64) for x, y, z in zip(a, b, c)]
  unsigned = [x * y + z for x, y, z in zip(a, b, c)]
  assert [lo | hi << 32 for lo, hi in zip(w.vgpr[4], w.vgpr[5])] == [v % 2**64 for v in signed]
  assert w.sgpr[8] == sum(1 << i for i, v in enumerate(signed) if (v % 2**65) >> 64)
  assert [lo | hi << 32 for lo, hi in zip(w.vgpr[6], w.vgpr[7])] == [v % 2**64 for v in unsigned]
  assert w.sgpr[9] == sum(1 << i for i, v in enumerate(unsigned) if v >> 64) and w.sgpr[9] & 1


def test_u24_multiplies_mask_their_sources():
  # RDNA3 ISA: V_MUL_U32_U24 (VOP2 0xb) D = S0[23:0] * S1[23:0] (low 32 bits), V_MUL_HI_U32_U24 (VOP2 0xc) the bits
  # 63:32 of that 48-bit product, V_MAD_U32_U24 (VOP3 0x20b) D = S0[23:0] * S1[23:0] + S2; high source bits ignored.
  # (the 24-bit mask LLVM drops before v_mad_u64_u32 is LLVM's issue: README "Known issues")
  a, b, c = (rng.integers(0, 2**32, 32).tolist() for _ in range(3))
  a[0], b[0] = M32, M32
  w = run(vop2(11, 3, V(0), 1), vop2(12, 4, V(0), 1), vop3(0x20B, 5, V(0), V(1), V(2)),
          vgpr={0: a, 1: b, 2: c, **{r: [0] * 32 for r in (3, 4, 5)}})
  p = [(x & 0xFFFFFF) * (y & 0xFFFFFF) for x, y in zip(a, b)]
  assert w.vgpr[3] == [v & M32 for v in p] and w.vgpr[4] == [v >> 32 for v in p]
  assert w.vgpr[5] == [(v + z) & M32 for v, z in zip(p, c)]


@pytest.mark.parametrize("op, fn", [(29, lambda a, b: ~(a & b)), (31, lambda a, b: ~(a | b)),
                                    (33, lambda a, b: ~(a ^ b))])
@pytest.mark.parametrize("a, b", [(2**64 - 1, 2**64 - 1), (0, 0), (0x8000_0000_0000_0001, 0xFFFF_FFFF),
                                  (0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210)])
def test_sop2_nand_nor_xnor_b64(op, fn, a, b):
  """s_nand/nor/xnor_b64 (RDNA3 SOP2 29/31/33; the ISA: D.u64 = ~(S0 op S1), SCC = D != 0) on SGPR pairs."""
  w = run(sop2(op, 4, 0, 2), sgpr={0: a & M32, 1: a >> 32, 2: b & M32, 3: b >> 32})
  want = fn(a, b) & (2**64 - 1)
  assert (w.sgpr[4] | (w.sgpr[5] << 32), w.scc) == (want, int(want != 0))
