"""RDNA3 emulator: one test per instruction family on hand-encoded programs, expected values from the ISA's documented
semantics (computed here with Python ints and numpy float32), and a decode check against the compiler's assembly."""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from amd_oracle import isa_opcodes
from tiny_runtime_amd.emu.encode import (V, Code, ds, glob, smem, sop1, sop2, sopc, sopk, sopp, vop1, vop2, vop3, vopc,
                                           vopd)

from tiny_runtime_amd.emu.rdna3 import EXEC_LO, LITERAL, NULL, VCC_LO, Emulator, UnsupportedInstruction, Wave, decode
from tiny_runtime_amd.emu import rdna3

M32 = 0xFFFFFFFF
rng = np.random.default_rng(0)


def run(*parts: list[int], sgpr: dict[int, int] | None = None, vgpr: dict[int, list[int]] | None = None,
        exec_mask: int = M32, scc: int = 0) -> Wave:
  code, w = Code(*parts), Wave()
  for k, v in (sgpr or {}).items(): w.sgpr[k] = v
  for k, vs in (vgpr or {}).items(): w.vgpr[k] = list(vs)
  w.sgpr[EXEC_LO], w.scc = exec_mask, scc
  Emulator().run(w, code.addr)
  return w


def fbits(x) -> int: return int(np.float32(x).view(np.uint32))
def lanes_f(vals) -> list[int]: return [int(v) for v in np.asarray(vals, dtype=np.float32).view(np.uint32)]
def as_f(bits: list[int]) -> np.ndarray: return np.array(bits, dtype=np.uint32).view(np.float32)



def _vopc_name(op: int) -> str | None:
  try: return rdna3.vopc_compare(op)[0]
  except UnsupportedInstruction: return None


def _named(table: dict) -> dict[int, str]: return {op: v if isinstance(v, str) else v[0] for op, v in table.items()}


@pytest.mark.parametrize("table, enum", [
  (dict(enumerate(rdna3.SOPC_NAMES)), "SOPCOp"), (rdna3.SOPP_NAMES, "SOPPOp"), (rdna3.SOP2, "SOP2Op"),
  (rdna3.SOP2_B64, "SOP2Op"), (rdna3.SAVEEXEC, "SOP1Op"), (rdna3.VOP1, "VOP1Op"), (rdna3.VOP1_F64, "VOP1Op"),
  (rdna3.VOP1_SPECIAL, "VOP1Op"), (rdna3.VOP2, "VOP2Op"), (rdna3.VOP2_SPECIAL, "VOP2Op"), (rdna3.VOP3, "VOP3Op"),
  (rdna3.VOP3_F64, "VOP3Op"), (rdna3.VOP3_16, "VOP3Op"), (rdna3.DS_NAMES, "DSOp"),
  ({0x180 + op: n for op, n in _named(rdna3.VOP1_F64).items()}, "VOP3Op"),  # VOP1 ops as VOP3: 0x180 + op
  ({op: _vopc_name(op) for op in range(256) if _vopc_name(op)}, "VOPCOp"),
])
def test_opcode_tables_match_amd_isa_xml(table, enum):
  """The emulator's opcode numbers and names against AMD's RDNA3 ISA XML (tinygrad 0.14.0's generated enums)."""
  xml = {op: n.removesuffix("_e32").removesuffix("_e64") for op, n in isa_opcodes("rdna3", enum).items()}
  mine = _named(table)
  assert {op: xml.get(op) for op in mine} == mine

# ***** SOP2 / SOP1 / SOPK / SOPC / SOPP *****
@pytest.mark.parametrize("op, a, b, want, scc", [
  (0, 0xFFFFFFFF, 2, 1, 1),                   # s_add_u32: carry out to SCC
  (1, 1, 2, 0xFFFFFFFF, 1),                   # s_sub_u32: borrow
  (2, 0x7FFFFFFF, 1, 0x80000000, 1),          # s_add_i32: signed overflow sets SCC
  (8, 0x80000001, 1, 2, 1),                   # s_lshl_b32
  (12, 0x80000000, 4, 0xF8000000, 1),         # s_ashr_i32 keeps the sign
  (18, 0xFFFFFFFF, 3, 0xFFFFFFFF, 1),         # s_min_i32(-1, 3) = -1, SCC = (result == src0)
  (19, 0xFFFFFFFF, 3, 3, 0),                  # s_min_u32
  (22, 0xF0F0, 0xFF00, 0xF000, 1), (24, 0xF0, 0x0F, 0xFF, 1), (26, 0xFF, 0xFF, 0, 0),
  (34, 0xFF, 0x0F, 0xF0, 1),                  # s_and_not1_b32
  (44, 0xFFFFFFFD, 7, (-21) & M32, None),     # s_mul_i32(-3, 7)
])
def test_sop2(op, a, b, want, scc):
  w = run(sop2(op, 2, 0, 1), sgpr={0: a, 1: b})
  assert w.sgpr[2] == want
  if scc is not None: assert w.scc == scc


def test_sop2_carry_select_bfe_64bit():
  w = run(sop2(4, 2, 0, 1), sgpr={0: 0xFFFFFFFF, 1: 0}, scc=1)  # s_addc_u32: a + b + SCC
  assert (w.sgpr[2], w.scc) == (0, 1)
  w = run(sop2(48, 2, 0, 1), sgpr={0: 11, 1: 22}, scc=0)  # s_cselect_b32 picks src1 when SCC = 0
  assert w.sgpr[2] == 22
  w = run(sop2(38, 2, 0, 1), sgpr={0: 0xABCD1234, 1: 4 | (8 << 16)})  # s_bfe_u32: offset 4, width 8
  assert w.sgpr[2] == (0xABCD1234 >> 4) & 0xFF
  w = run(sop2(9, 4, 0, 2), sgpr={0: 0x80000001, 1: 0x1, 2: 4})  # s_lshl_b64 s[4:5], s[0:1], 4
  assert w.sgpr[4] | (w.sgpr[5] << 32) == (0x180000001 << 4) & (2**64 - 1)


def test_sop1_and_literal():
  w = run(sop1(0, 3, LITERAL), [0xDEADBEEF], sop1(1, 4, 0), sop1(30, 6, 3), sgpr={0: 5, 1: 6})
  assert (w.sgpr[3], w.sgpr[4], w.sgpr[5], w.sgpr[6]) == (0xDEADBEEF, 5, 6, ~0xDEADBEEF & M32)
  w = run(sop1(32, 2, 0), sgpr={0: 0x0000FFFF}, exec_mask=0x00FF00FF)  # s_and_saveexec_b32
  assert (w.sgpr[2], w.sgpr[EXEC_LO], w.scc) == (0x00FF00FF, 0x000000FF, 1)


def test_sopk():
  w = run(sopk(0, 2, 0x8000), sopk(15, 3, 0xFFFF), sgpr={3: 10})  # s_movk sign-extends; s_addk_i32 adds -1
  assert (w.sgpr[2], w.sgpr[3]) == (0xFFFF8000, 9)
  for op, k, want in [(3, 5, True), (4, 5, False), (5, 4, True), (7, 6, True), (8, 4, False)]:  # eq lg gt lt le vs 5
    assert run(sopk(op, 0, k), sgpr={0: 5}).scc == int(want), op


def test_sopc_against_python():
  a, b = rng.integers(-2**31, 2**31, 40), rng.integers(-2**31, 2**31, 40)
  a[:5] = b[:5]
  fns = [lambda x, y: x == y, lambda x, y: x != y, lambda x, y: x > y, lambda x, y: x >= y, lambda x, y: x < y,
         lambda x, y: x <= y]
  for x, y in zip(a.tolist(), b.tolist()):
    for op in range(12):
      xx, yy = (x, y) if op < 6 else (x & M32, y & M32)
      assert run(sopc(op, 0, 1), sgpr={0: x & M32, 1: y & M32}).scc == int(fns[op % 6](xx, yy)), (op, x, y)



def test_sopc_bitcmp():
  """s_bitcmp0/1_b32 (12, 13) test bit S1[4:0] of S0, the _b64 forms (14, 15) bit S1[5:0] of the pair S0 (the ISA's
  "SCC = S0.u32[S1.u32[4 : 0]] == 1'0U"): LLVM emits them in float sin/cos to pick the quadrant's sign."""
  a64 = int(rng.integers(0, 2**63)) | (1 << 63)
  for bit in (0, 5, 31, 32, 40, 63, 64 + 7, 255):  # the index is masked: 64+7 reads bit 7, 255 bit 31 / bit 63
    b32, b64 = (a64 >> (bit & 31)) & 1, (a64 >> (bit & 63)) & 1
    sg = {0: a64 & M32, 1: a64 >> 32, 2: bit}
    assert run(sopc(12, 0, 2), sgpr=sg, scc=b32).scc == 1 - b32, bit
    assert run(sopc(13, 0, 2), sgpr=sg, scc=1 - b32).scc == b32, bit
    assert run(sopc(14, 0, 2), sgpr=sg, scc=b64).scc == 1 - b64, bit
    assert run(sopc(15, 0, 2), sgpr=sg, scc=1 - b64).scc == b64, bit
  assert run(sopc(13, 0, 128 + 3), sgpr={0: 0b1000}).scc == 1  # an inline constant as the bit index
  names = [decode(Code(sopc(op, 0, 2)).buf).name for op in range(12, 16)]
  assert names == ["s_bitcmp0_b32", "s_bitcmp1_b32", "s_bitcmp0_b64", "s_bitcmp1_b64"]

def test_sopp_branches_loop():
  # s0 = 0; s1 = 5; loop: s0 += s1; s1 -= 1; s_cmp_lg_u32 s1, 0; s_cbranch_scc1 loop  -> 5+4+3+2+1
  body = [*sop2(0, 0, 0, 1), *sop2(1, 1, 1, 129), *sopc(7, 1, 128)]
  w = run(sopk(0, 0, 0), sopk(0, 1, 5), body, sopp(34, -(len(body) + 1)))
  assert w.sgpr[0] == 15
  w = run(sopp(32, 1), sopk(0, 0, 1), sopk(0, 1, 2))  # s_branch skips one instruction
  assert (w.sgpr[0], w.sgpr[1]) == (0, 2)
  w = run(sopp(37, 1), sopk(0, 0, 1), exec_mask=0)  # s_cbranch_execz taken
  assert w.sgpr[0] == 0


def test_smem_loads():
  data = (ctypes.c_uint32 * 8)(*range(100, 108))
  addr = ctypes.addressof(data)
  w = run(smem(1, 4, 0, 8), smem(2, 8, 0, 16), sgpr={0: addr & M32, 1: addr >> 32})  # s_load_b64 / s_load_b128
  assert w.sgpr[4:6] == [102, 103] and w.sgpr[8:12] == [104, 105, 106, 107]


# ***** VALU *****
A = rng.standard_normal(32).astype(np.float32) * 10
B = rng.standard_normal(32).astype(np.float32) * 10


@pytest.mark.parametrize("op, fn", [(3, np.add), (4, np.subtract), (5, lambda a, b: b - a), (8, np.multiply),
                                    (15, np.minimum), (16, np.maximum)])
def test_vop2_float(op, fn):
  w = run(vop2(op, 2, V(0), 1), vgpr={0: lanes_f(A), 1: lanes_f(B)})
  np.testing.assert_array_equal(as_f(w.vgpr[2]), fn(A, B).astype(np.float32))


@pytest.mark.parametrize("op, fn", [
  (24, lambda a, b: (b << (a & 31)) & M32), (25, lambda a, b: b >> (a & 31)),
  (26, lambda a, b: (((b ^ 0x80000000) - 0x80000000) >> (a & 31)) & M32),
  (27, lambda a, b: a & b), (28, lambda a, b: a | b), (29, lambda a, b: a ^ b),
  (37, lambda a, b: (a + b) & M32), (38, lambda a, b: (a - b) & M32), (19, min), (20, max),
  (11, lambda a, b: ((a & 0xFFFFFF) * (b & 0xFFFFFF)) & M32)])
def test_vop2_int(op, fn):
  a, b = rng.integers(0, 2**32, 32).tolist(), rng.integers(0, 2**32, 32).tolist()
  w = run(vop2(op, 2, V(0), 1), vgpr={0: a, 1: b})
  assert w.vgpr[2] == [fn(x, y) for x, y in zip(a, b)]


def test_vop2_exec_mask_cndmask_fmac_inline_constants():
  w = run(vop2(37, 2, 193, 1), vgpr={1: list(range(32)), 2: [7] * 32}, exec_mask=0x0000FFFF)  # v_add_nc_u32 -1 + v1
  assert w.vgpr[2] == [(i - 1) & M32 for i in range(16)] + [7] * 16
  w = run(vop2(1, 2, V(0), 1), vgpr={0: [1] * 32, 1: [2] * 32}, sgpr={VCC_LO: 0xAAAAAAAA})  # v_cndmask_b32
  assert w.vgpr[2] == [2 if i % 2 else 1 for i in range(32)]
  w = run(vop2(43, 2, 242, 1), vgpr={1: lanes_f(A), 2: lanes_f(B)})  # v_fmac_f32 v2 += 1.0 * v1
  np.testing.assert_array_equal(as_f(w.vgpr[2]), B + A)
  w = run(vop2(8, 2, 246, 1), vgpr={1: lanes_f(A)})  # inline 4.0
  np.testing.assert_array_equal(as_f(w.vgpr[2]), A * np.float32(4))


def test_vop1():
  x = np.abs(A) + np.float32(0.5)
  w = run(vop1(42, 2, V(0)), vop1(51, 3, V(0)), vop1(37, 4, V(1)), vop1(39, 5, V(0)), vop1(36, 6, V(1)),
          vop1(8, 7, V(1)), vop1(5, 8, V(9)), vop1(55, 10, V(9)),
          vgpr={0: lanes_f(x), 1: lanes_f(A / 4), 9: [(-i) & M32 for i in range(32)]})
  x64, a64 = x.astype(np.float64), (A / 4).astype(np.float64)
  np.testing.assert_array_equal(as_f(w.vgpr[2]), (1 / x64).astype(np.float32))      # v_rcp_f32 (exact here)
  np.testing.assert_array_equal(as_f(w.vgpr[3]), np.sqrt(x64).astype(np.float32))   # v_sqrt_f32
  np.testing.assert_array_equal(as_f(w.vgpr[4]), np.exp2(a64).astype(np.float32))   # v_exp_f32 is 2**x
  np.testing.assert_array_equal(as_f(w.vgpr[5]), np.log2(x64).astype(np.float32))   # v_log_f32 is log2
  np.testing.assert_array_equal(as_f(w.vgpr[6]), np.floor(A / 4))
  assert w.vgpr[7] == [int(np.trunc(v)) & M32 for v in A / 4]                      # v_cvt_i32_f32 truncates
  np.testing.assert_array_equal(as_f(w.vgpr[8]), -np.arange(32, dtype=np.float32))  # v_cvt_f32_i32
  assert w.vgpr[10] == [~((-i) & M32) & M32 for i in range(32)]


def test_vop3():
  a, b, c = (rng.integers(0, 2**32, 32).tolist() for _ in range(3))
  w = run(vop3(0x32C, 3, V(0), V(1)), vop3(0x32D, 4, V(0), V(1)), vop3(0x255, 5, V(0), V(1), V(2)),
          vop3(0x246, 6, V(0), 132, V(2)), vop3(0x210, 7, V(0), 136, 136), vop3(0x211, 8, V(0), 136, 136),
          vgpr={0: a, 1: b, 2: c})
  assert w.vgpr[3] == [(x * y) & M32 for x, y in zip(a, b)] and w.vgpr[4] == [(x * y) >> 32 for x, y in zip(a, b)]
  assert w.vgpr[5] == [(x + y + z) & M32 for x, y, z in zip(a, b, c)]
  assert w.vgpr[6] == [((x << 4) + z) & M32 for x, z in zip(a, c)]
  assert w.vgpr[7] == [(x >> 8) & 0xFF for x in a]
  assert w.vgpr[8] == [(((x >> 8) & 0xFF) - (256 if x >> 15 & 1 else 0)) & M32 for x in a]
  # v_fma_f32 on values where a*b+c is exact, and |.|/neg modifiers on v_add_f32_e64
  ia, ib = np.arange(32, dtype=np.float32), np.arange(32, dtype=np.float32)[::-1].copy()
  w = run(vop3(0x213, 3, V(0), V(1), V(0)), vop3(0x103, 4, V(0), V(1), abs_=2, neg=1),
          vgpr={0: lanes_f(ia), 1: lanes_f(-ib)})
  np.testing.assert_array_equal(as_f(w.vgpr[3]), ia * -ib + ia)
  np.testing.assert_array_equal(as_f(w.vgpr[4]), -ia + ib)


def test_vop3_carries_and_64bit():
  a, b = rng.integers(0, 2**32, 32).tolist(), rng.integers(0, 2**32, 32).tolist()
  w = run(vop3(0x300, 2, V(0), V(1), sdst=4), vop3(0x120, 3, V(1), V(0), 4, sdst=5), vgpr={0: a, 1: b})
  carry = sum(1 << i for i, (x, y) in enumerate(zip(a, b)) if x + y > M32)
  assert w.vgpr[2] == [(x + y) & M32 for x, y in zip(a, b)] and w.sgpr[4] == carry
  assert w.vgpr[3] == [(x + y + (carry >> i & 1)) & M32 for i, (x, y) in enumerate(zip(b, a))]
  w = run(vop3(0x2FE, 4, V(0), V(1), V(2), sdst=NULL), vop3(0x33C, 6, 130, V(2)),
          vgpr={0: a, 1: b, 2: [5] * 32, 3: [1] * 32})  # v_mad_u64_u32 v[4:5] = a*b + v[2:3]; v_lshlrev_b64 by 2
  want = [(x * y + (1 << 32) + 5) % 2**64 for x, y in zip(a, b)]
  assert [lo | (hi << 32) for lo, hi in zip(w.vgpr[4], w.vgpr[5])] == want
  assert [lo | (hi << 32) for lo, hi in zip(w.vgpr[6], w.vgpr[7])] == [((1 << 32) + 5) << 2] * 32


def test_vopc_and_class():
  x = A.copy()
  x[:3] = [np.nan, np.inf, -0.0]
  w = run(vopc(0x11, V(0), 1), vop3(0x14, 3, V(0), V(1)), vgpr={0: lanes_f(x), 1: lanes_f(B)})  # lt -> VCC, gt -> s3
  with np.errstate(invalid="ignore"):
    assert w.sgpr[VCC_LO] == sum(1 << i for i in range(32) if x[i] < B[i])
    assert w.sgpr[3] == sum(1 << i for i in range(32) if x[i] > B[i])
  w = run(vopc(0x7E, LITERAL, 1), [0], vgpr={1: [1 << 1 | 1 << 9 | 1 << 5] * 32})  # class of 0.0 is +0 (bit 6): no
  assert w.sgpr[VCC_LO] == 0
  w = run(vopc(0x7E, V(0), 1), vgpr={0: lanes_f(x), 1: [(1 << 1) | (1 << 9) | (1 << 5)] * 32})  # qNaN, +inf, -0
  assert w.sgpr[VCC_LO] == 0b111
  w = run(vopc(0x44 | 0x80, V(0), 1), vgpr={0: list(range(32)), 1: [10] * 32})  # v_cmpx_gt_i32 writes EXEC
  assert w.sgpr[EXEC_LO] == sum(1 << i for i in range(11, 32))


def test_vopd_reads_before_writes():
  w = run(vopd(8, 8, 0, 1, V(1), 0, V(0), 0), vgpr={0: [1] * 32, 1: [2] * 32})  # swap v0, v1
  assert (w.vgpr[0][0], w.vgpr[1][0]) == (2, 1)
  w = run(vopd(4, 3, 2, 3, V(0), 1, V(0), 1), vopd(8, 16, 4, 5, 129, 0, V(6), 7),
          vgpr={0: lanes_f(A), 1: lanes_f(B), 6: [3] * 32, 7: [4] * 32})
  np.testing.assert_array_equal(as_f(w.vgpr[2]), A + B)
  np.testing.assert_array_equal(as_f(w.vgpr[3]), A * B)
  assert w.vgpr[4] == [1] * 32 and w.vgpr[5] == [7] * 32


def test_global_load_store():
  src = np.arange(64, dtype=np.int32) - 32
  dst = np.zeros(128, dtype=np.int32)
  sa, da = src.ctypes.data, dst.ctypes.data
  w = run(glob(20, vdst=2, addr=0, saddr=0, offset=16), glob(17, vdst=3, addr=1, saddr=0),  # load_b32 +16, load_i8
          glob(18, vdst=4, addr=1, saddr=0),  # load_u16
          glob(26, addr=0, saddr=4, data=2), glob(29, addr=5, saddr=4, data=6, offset=128),  # store_b32, store_b128
          glob(24, addr=10, saddr=4, data=3),  # store_b8 of the low byte
          sgpr={0: sa & M32, 1: sa >> 32, 4: da & M32, 5: da >> 32},
          vgpr={0: [4 * i for i in range(32)], 1: [4 * 3] * 32, 5: [16 * i for i in range(32)],
                6: list(range(32)), 7: [7] * 32, 8: [8] * 32, 9: [9] * 32, 10: [4 * 127] * 32}, exec_mask=0xFFFF)
  assert w.vgpr[2][:16] == [int(v) & M32 for v in src[4:20]] and w.vgpr[2][16:] == [0] * 16
  assert w.vgpr[3][0] == (-29) & M32  # byte 12 of src is the low byte of -29: sign-extended
  assert w.vgpr[4][0] == (-29) & 0xFFFF  # zero-extended 16 bits
  assert dst[:16].tolist() == src[4:20].tolist() and dst[16:32].tolist() == [0] * 16
  assert dst[32:96].reshape(16, 4).tolist() == [[i, 7, 8, 9] for i in range(16)]
  assert dst[127] == (-29) & 0xFF


def test_scalar_64bit_and_extensions():
  w = run(sop2(25, 4, 0, 2), sop2(27, 6, 0, 2), sopc(16, 0, 2), sgpr={0: 0xF0, 1: 0x1, 2: 0x0F, 3: 0x1})
  assert (w.sgpr[4], w.sgpr[5], w.sgpr[6], w.sgpr[7], w.scc) == (0xFF, 1, 0xFF, 0, 0)  # s_or_b64, s_xor_b64, eq_u64
  assert run(sopc(17, 0, 2), sgpr={0: 1, 1: 5, 2: 1, 3: 6}).scc == 1  # s_cmp_lg_u64 sees the high word
  v = 0x8000_00F0_0000_0000
  w = run(sop2(41, 4, 0, 2), sop2(40, 6, 0, 2), sop2(13, 8, 0, 3),
          sgpr={0: v & M32, 1: v >> 32, 2: 36 | (4 << 16), 3: 60})
  assert (w.sgpr[4], w.sgpr[5]) == (M32, M32) and (w.sgpr[6], w.sgpr[7]) == (0xF, 0)  # s_bfe_i64 / s_bfe_u64
  assert (w.sgpr[8], w.sgpr[9]) == ((-8) & M32, M32)  # s_ashr_i64: 0x8000_00F0_0000_0000 >> 60 = -8
  w = run(sop1(14, 2, 0), sop1(15, 3, 0), sop1(21, 4, 1), sop2(15, 5, 0, 1), sop2(45, 6, 0, 1),
          sgpr={0: 0x1234_8081, 1: 0xFFFF_FFF0})
  assert w.sgpr[2] == (-127) & M32 and w.sgpr[3] == (0x8081 - 0x10000) & M32 and w.sgpr[4] == 16
  assert w.sgpr[5] == ((0x1234_8081 << 2) + 0xFFFF_FFF0) & M32 and w.sgpr[6] == (0x1234_8081 * 0xFFFF_FFF0) >> 32


def test_vector_64bit_compare_min_max3_and_conversions():
  a = [(-5 + i) & (2**64 - 1) for i in range(32)]
  w = run(vop3(0x51, 4, V(0), 128), vop3(0x59, 5, V(0), 128),  # v_cmp_lt_i64 / v_cmp_lt_u64 against 0
          vgpr={0: [x & M32 for x in a], 1: [x >> 32 for x in a]})
  assert w.sgpr[4] == 0b11111 and w.sgpr[5] == 0
  b, c = rng.integers(0, 2**32, 32).tolist(), rng.integers(0, 2**32, 32).tolist()
  w = run(vop3(0x21E, 3, V(0), V(1), V(2)), vop3(0x21A, 4, V(0), V(1), V(2)), vop1(18, 5, V(1)), vop1(2, 9, V(2)),
          vgpr={0: [x & M32 for x in a], 1: b, 2: c}, exec_mask=0xFFFFFFFC)
  assert w.vgpr[3][2:] == [max(x & M32, y, z) for x, y, z in zip(a, b, c)][2:]
  assert w.vgpr[4][2:] == [min(sext32(x), sext32(y), sext32(z)) & M32 for x, y, z in zip(a, b, c)][2:]
  assert w.vgpr[5][2:] == [fbits(float((y >> 8) & 0xFF)) for y in b][2:]  # v_cvt_f32_ubyte1
  assert w.sgpr[9] == c[2]  # v_readfirstlane_b32 reads the first active lane
  x = (A * np.float32(1000)).astype(np.float32)
  w = run(vop1(16, 2, V(0)), vop1(15, 4, V(2)), vop1(10, 5 | 128, V(0)), vop1(11, 6, V(5 | 128)),
          vop1(28, 5, V(5 | 128)), vgpr={0: lanes_f(x), 5: [0xAAAA_BBBB] * 32})
  f64 = [lo | (hi << 32) for lo, hi in zip(w.vgpr[2], w.vgpr[3])]
  assert f64 == [int(v) for v in x.astype(np.float64).view(np.uint64)] and w.vgpr[4] == lanes_f(x)
  h = x.astype(np.float16).view(np.uint16).astype(np.uint32)
  assert w.vgpr[5] == [int(v << 16 | v) for v in h]  # cvt_f16_f32 into v5.h, then v_mov_b16 v5.l, v5.h
  np.testing.assert_array_equal(as_f(w.vgpr[6]), x.astype(np.float16).astype(np.float32))


def test_global_d16_loads_keep_the_other_half():
  src = np.array([0x1234, 0x80FF], dtype=np.uint16)
  sa = src.ctypes.data
  w = run(glob(32, vdst=1, addr=0, saddr=0), glob(34, vdst=2, addr=0, saddr=0, offset=2),
          sgpr={0: sa & M32, 1: sa >> 32}, vgpr={0: [0] * 32, 1: [0xAAAA_0000] * 32, 2: [0x5555] * 32})
  assert w.vgpr[1][0] == 0xAAAA_1234 and w.vgpr[2][0] == 0xFFFF_5555  # d16_b16 low; d16_hi_i8 sign-extends 0xFF


def test_float64_alu_compare_and_conversion():
  x, y = rng.standard_normal(32) * 1e3, rng.standard_normal(32)
  def pairs(v):
    u = np.asarray(v).view(np.uint64)
    return [int(b) & M32 for b in u], [int(b) >> 32 for b in u]
  (x0, x1), (y0, y1) = pairs(x), pairs(y)
  w = run(vop3(0x327, 4, V(0), V(2)), vop3(0x328, 6, V(0), V(2), neg=2), vop3(0x214, 8, V(0), V(2), V(0)),
          vopc(0x21, V(0), 2), vop1(3, 10, V(0)), vop1(4, 12, V(10)), vop3(0x32B, 14, V(2), 131),
          vgpr={0: x0, 1: x1, 2: y0, 3: y1})
  def get(r):
    return np.array([lo | (hi << 32) for lo, hi in zip(w.vgpr[r], w.vgpr[r + 1])], dtype=np.uint64).view(np.float64)
  np.testing.assert_array_equal(get(4), x + y)
  np.testing.assert_array_equal(get(6), x * -y)
  from fractions import Fraction
  fused = [float(Fraction(u) * Fraction(v) + Fraction(u)) for u, v in zip(x.tolist(), y.tolist())]
  np.testing.assert_array_equal(get(8), fused)  # v_fma_f64 rounds once: exact rationals, rounded to double
  assert w.sgpr[VCC_LO] == sum(1 << i for i in range(32) if x[i] < y[i])  # v_cmp_lt_f64
  assert w.vgpr[10] == [int(np.trunc(v)) & M32 for v in x] and np.array_equal(get(12), np.trunc(x))
  np.testing.assert_array_equal(get(14), y * 8)  # v_ldexp_f64 by 3



def test_float_to_int_conversions_saturate():
  """v_cvt_i32/u32_f64 and _f32 (VOP1 3/21, 8/7; the VOP3 forms 0x180 + op): truncate toward zero; out-of-range
  values and infinities saturate to the type's limits; NaN converts to 0 (RDNA3 ISA, f64_to_i32 / f32_to_u32)."""
  vals = [-math.inf, math.inf, math.nan, -math.nan, 3e9, -3e9, 2.0**31, -2.0**31 - 1, 2.0**32, -0.99, 0.99, -7.5, 1e300,
          -1e-300, 2.0**31 - 1, 4294967295.5, -2.0**31]
  vals += [0.0] * (32 - len(vals))
  x = np.array(vals, np.float64)
  with np.errstate(over="ignore"): f = x.astype(np.float32)  # the f32 forms see the values rounded (1e300 -> inf)
  lo = [int(b) & M32 for b in x.view(np.uint64)]
  hi = [int(b) >> 32 for b in x.view(np.uint64)]
  w = run(vop1(3, 2, V(0)), vop1(21, 3, V(0)), vop3(0x180 + 3, 4, V(0), 0), vop1(8, 5, V(6)), vop1(7, 7, V(6)),
          vgpr={0: lo, 1: hi, 6: lanes_f(f)})

  def sat(v: float, lo_: int, hi_: int) -> int: return 0 if v != v else int(min(max(np.trunc(v), lo_), hi_))
  want_i = [sat(v, -2**31, 2**31 - 1) & M32 for v in vals]
  want_u = [sat(v, 0, 2**32 - 1) for v in vals]
  assert w.vgpr[2] == want_i and w.vgpr[4] == want_i  # v_cvt_i32_f64, e32 and e64
  assert w.vgpr[3] == want_u  # v_cvt_u32_f64
  assert w.vgpr[5] == [sat(float(v), -2**31, 2**31 - 1) & M32 for v in f]  # v_cvt_i32_f32
  assert w.vgpr[7] == [sat(float(v), 0, 2**32 - 1) for v in f]  # v_cvt_u32_f32
  assert w.vgpr[2][:2] == [0x80000000, 0x7FFFFFFF] and w.vgpr[3][:3] == [0, M32, 0]


def test_cmp_class_f64():
  """v_cmp_class_f64 (VOPC 0x7F; v_cmpx 0xFF; VOP3 0x7F): lane bit = bit class(S0.f64) of the 32-bit mask S1, the
  classes 0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf (the ISA's
  pseudocode). Float64 floor division tests its operands with it."""
  snan, qnan = 0x7FF0000000000001, 0x7FF8000000000000
  vals = [snan, qnan] + [int(b) for b in np.array([-np.inf, -2.5, -5e-324, -0.0, 0.0, 5e-324, 1.0, np.inf]).view(
    np.uint64)]
  bits = (vals * 4)[:32]
  cls = [i % 10 for i in range(32)]  # lane i's value has class i % 10 (vals are listed in class order)
  masks = [int(m) for m in rng.integers(0, 1 << 10, 32)]
  w = run(vopc(0x7F, V(0), 2), vop3(0x7F, 10, V(0), V(2)), vop3(0x7F, 11, V(0), 128 + 0x0C, neg=1),
          vgpr={0: [b & M32 for b in bits], 1: [b >> 32 for b in bits], 2: masks})
  want = sum(1 << ln for ln in range(32) if masks[ln] >> cls[ln] & 1)
  assert w.sgpr[VCC_LO] == want and w.sgpr[10] == want
  neg = [{2: 9, 3: 8, 4: 7, 5: 6, 6: 5, 7: 4, 8: 3, 9: 2}.get(c, c) for c in cls]  # -S0 (VOP3 NEG): the mirror class
  assert w.sgpr[11] == sum(1 << ln for ln in range(32) if 0x0C >> neg[ln] & 1)  # mask 0x0C: -inf or -normal
  w = run(vopc(0xFF, V(0), 2), vgpr={0: [b & M32 for b in bits], 1: [b >> 32 for b in bits], 2: masks})
  assert w.sgpr[EXEC_LO] == want  # v_cmpx_class_f64 writes EXEC

def test_true16_halves():
  a, b = rng.integers(0, 2**16, 32).tolist(), rng.integers(0, 2**16, 32).tolist()
  packed = [(x << 16) | y for x, y in zip(a, b)]
  # v_and_b16 v2.h = v0.h & v0.l (opsel: src0 hi, dst hi); v_max3_i16 v3.l = max(v0.l, v0.h, 5)
  w = run(vop3(0x362, 2, V(0), V(0), sdst=(1 | 8) << 3), vop3(0x24D, 3, V(0), V(0), 133, sdst=2 << 3),
          vop3(0x3C, 4, V(0), V(0), sdst=1 << 3),  # v_cmp_gt_u16_e64 s4, v0.h, v0.l
          vopc(0x3C, V(0) | 128, 0), vgpr={0: packed, 2: [0x1111_2222] * 32, 3: [0] * 32})
  def s16(v): return v - 65536 if v >= 32768 else v
  assert w.vgpr[2] == [((x & y) << 16) | 0x2222 for x, y in zip(a, b)]
  assert w.vgpr[3] == [max(s16(x), s16(y), 5) & 0xFFFF for x, y in zip(a, b)]
  assert w.sgpr[4] == w.sgpr[VCC_LO] == sum(1 << i for i in range(32) if a[i] > b[i])
  h = rng.standard_normal(32).astype(np.float16)
  hb = [int(v) for v in h.view(np.uint16)]
  w = run(vop2(50, 1 | 128, V(0), 0), vgpr={0: hb})  # v_add_f16 v1.h, v0.l, v0.l
  assert [v >> 16 for v in w.vgpr[1]] == [int(v) for v in (h + h).view(np.uint16)]
  w = run(vop2(53, 1, V(0), 0), vop3(0x303, 2, V(0), 193), vgpr={0: hb})  # v_mul_f16 v1.l; v_add_nc_u16 v2.l = v0.l - 1
  assert [v & 0xFFFF for v in w.vgpr[1]] == [int(v) for v in (h * h).view(np.uint16)]
  assert [v & 0xFFFF for v in w.vgpr[2]] == [(x - 1) & 0xFFFF for x in hb]


def test_bitfield_insert_and_16bit_integer_ops():
  a, b, c = (rng.integers(0, 2**32, 32).tolist() for _ in range(3))
  w = run(vop3(0x212, 3, V(0), V(1), V(2)), vop3(0x33A, 4, 132, V(1)), vop3(0x364, 5, V(0), V(1)),
          vop3(0x241, 6, V(0), V(1), V(2)), vgpr={0: a, 1: b, 2: c, 4: [0] * 32, 5: [0] * 32, 6: [0] * 32})
  def s16(v): return (v & 0xFFFF) - (1 << 16 if v & 0x8000 else 0)
  assert w.vgpr[3] == [(x & y) | (~x & z & M32) for x, y, z in zip(a, b, c)]  # v_bfi_b32
  w2 = run(vop3(0x247, 7, V(0), V(1), 131), vgpr={0: a, 1: b})
  assert w2.vgpr[7] == [((x + y) << 3) & M32 for x, y in zip(a, b)]  # v_add_lshl_u32
  assert w.vgpr[4] == [(s16(y) >> 4) & 0xFFFF for y in b]  # v_ashrrev_i16 by 4 (low halves)
  assert w.vgpr[5] == [(x ^ y) & 0xFFFF for x, y in zip(a, b)]
  assert w.vgpr[6] == [(x * y + z) & 0xFFFF for x, y, z in zip((v & 0xFFFF for v in a), (v & 0xFFFF for v in b),
                                                                (v & 0xFFFF for v in c))]


def test_24bit_multiply_add_and_bit_reverse():
  a, b = rng.integers(0, 2**32, 32).tolist(), rng.integers(0, 2**32, 32).tolist()
  w = run(vop3(0x20A, 2, V(0), V(1), V(1)), sop1(4, 5, 0), vgpr={0: a, 1: b}, sgpr={0: 0x0000_0001})
  def i24(x): return (x & 0xFFFFFF) - (1 << 24 if x & 0x800000 else 0)
  assert w.vgpr[2] == [(i24(x) * i24(y) + y) & M32 for x, y in zip(a, b)]
  assert w.sgpr[5] == 0x8000_0000


def test_ds_lds_loads_and_stores():
  code = Code(ds(13, addr=0, data0=1, offset0=4), ds(14, addr=0, data0=2, data1=3, offset0=64, offset1=65),
              ds(54, addr=0, vdst=4, offset0=4), ds(58, addr=0, vdst=5, offset0=4),
              ds(59, addr=0, vdst=6, offset0=6), ds(119, addr=0, vdst=8, offset0=32, offset1=0),
              ds(223, addr=0, data0=1, offset1=4), ds(255, addr=0, vdst=12, offset1=4))
  w = Wave(lds=bytearray(4096))
  w.vgpr[0] = [16 * i for i in range(32)]  # lanes 16 bytes apart: no two lanes write the same bytes
  w.vgpr[1], w.vgpr[2], w.vgpr[3] = [0xFF80_1234 + i for i in range(32)], [100 + i for i in range(32)], [7] * 32
  w.sgpr[EXEC_LO] = M32
  Emulator().run(w, code.addr)
  lane = 3
  assert w.vgpr[4][lane] == 0xFF80_1234 + 3  # ds_store_b32 +4, ds_load_b32 +4
  assert w.vgpr[5][lane] == 0x37 and w.vgpr[6][lane] == 0xFFFF_FF80  # load_u8 of the low byte; load_i16 sign-extends
  # ds_store_2addr_b32 wrote v2 at addr+256 and v3 at addr+260; ds_load_2addr_b64 offsets are in 8-byte units
  assert (w.vgpr[8][lane], w.vgpr[9][lane], w.vgpr[10][lane]) == (103, 7, 0)
  assert [w.vgpr[12 + i][lane] for i in range(4)] == [w.vgpr[r][lane] for r in (1, 2, 3, 4)]  # b128 round trip
  with pytest.raises(RuntimeError, match="outside the work-group"): run(ds(54, addr=0, vdst=1), vgpr={0: [5000] * 32})


def test_waves_of_a_group_meet_at_barriers():
  # each wave writes its id at lds[4*wave], barrier, then reads the next wave's slot: only correct if all wrote first
  prog = Code(ds(13, addr=0, data0=1), sopp(61), ds(54, addr=2, vdst=3))
  lds = bytearray(16)
  waves = []
  for i in range(4):
    w = Wave(lds=lds)
    w.sgpr[EXEC_LO] = 1
    w.vgpr[0][0], w.vgpr[1][0], w.vgpr[2][0] = 4 * i, 10 + i, 4 * ((i + 1) % 4)
    waves.append(w)
  Emulator().run_group(waves, prog.addr)
  assert [w.vgpr[3][0] for w in waves] == [11, 12, 13, 10]


def sext32(v: int) -> int: return (v & M32) - (1 << 32 if v & 0x80000000 else 0)


def test_unknown_instruction_is_an_error_not_a_value():
  with pytest.raises(UnsupportedInstruction, match="VOP1 opcode 99"): run(vop1(99, 0, V(0)))
  with pytest.raises(UnsupportedInstruction, match="unknown encoding"): run([0xFFFFFFFF])


# ***** decode against the compiler's own assembly listing *****
def _kernels():
  from tiny_uop import KernelInfo, Ops, UOp, dtypes
  out = []
  for name, fn, dt in [("E_add", lambda a, b: a + b, dtypes.float),
                       ("E_int", lambda a, b: (a * b) // (b + 3), dtypes.int),
                       ("E_where", lambda a, b: (a < b).where(a.exp2(), b.sqrt()), dtypes.float),
                       ("E_div", lambda a, b: a / b, dtypes.float)]:
    c, a, b = [UOp(Ops.PARAM, dt.ptr(48), arg=i) for i in range(3)]
    i = UOp.range(48, 0)
    out.append(c.index(i).store(fn(a.index(i).load(), b.index(i).load())).sink(arg=KernelInfo(name)))
  return out


def _no_lld() -> bool:
  from tiny_codegen.compiler.amdgpu import find_ld_lld
  return find_ld_lld() is None


@pytest.mark.skipif(_no_lld(), reason="ld.lld not installed: unlinked objects leave the entry offset to a relocation")
@pytest.mark.parametrize("ast", _kernels(), ids=lambda a: a.arg.name)
def test_decode_matches_compiler_assembly(ast):
  from amd_listing import check_decode_matches_assembly
  from tiny_codegen import get_program
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  check_decode_matches_assembly(get_program(ast, AMDGPURenderer("gfx1100")))
