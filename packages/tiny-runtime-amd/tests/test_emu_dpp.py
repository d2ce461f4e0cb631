"""RDNA3 emulator, cross-lane modifiers: DPP16 (quad_perm, row_shl/shr/ror, row_mirror/half_mirror, row_share,
row_xmask; row/bank masks, bound_ctrl, fetch-inactive), DPP8, v_permlane16/x16. Expected lanes computed here from the
ISA's definitions (rows of 16 lanes)."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_runtime_amd.emu.encode import V, Code, dpp8, dpp16, vop1, vop2, vop3

from tiny_runtime_amd.emu.rdna3 import DPP8, DPP16, EXEC_LO, Emulator, UnsupportedInstruction, Wave

M32 = 0xFFFFFFFF
SRC = [100 + i for i in range(32)]
OLD = [7] * 32


def run(*parts, vgpr=None, sgpr=None, exec_mask=M32) -> Wave:
  code, w = Code(*parts), Wave()
  for k, vs in (vgpr or {}).items(): w.vgpr[k] = [int(v) for v in vs]
  for k, v in (sgpr or {}).items(): w.sgpr[k] = v
  w.sgpr[EXEC_LO] = exec_mask
  Emulator().run(w, code.addr)
  return w


def test_dpp_encoding_matches_llvm_mc():
  # bytes from `llvm-mc-15 --arch=amdgcn --mcpu=gfx1100 --show-encoding`
  def words(bs): return [int.from_bytes(bytes(bs[i:i + 4]), "little") for i in range(0, len(bs), 4)]
  assert vop1(1, 0, DPP16) + dpp16(0x111, 1) == words([0xfa, 0x02, 0x00, 0x7e, 0x01, 0x11, 0x01, 0xff])
  assert vop2(3, 0, DPP16, 2) + dpp16(0b10110001, 1, bound_ctrl=1) == \
    words([0xfa, 0x04, 0x00, 0x06, 0x01, 0xb1, 0x08, 0xff])
  assert vop1(1, 0, DPP8) + dpp8([7, 6, 5, 4, 3, 2, 1, 0], 1) == words([0xe9, 0x02, 0x00, 0x7e, 0x01, 0x77, 0x39, 0x05])
  assert vop2(3, 0, DPP8, 2) + dpp8([1, 0, 3, 2, 5, 4, 7, 6], 1) == \
    words([0xe9, 0x04, 0x00, 0x06, 0x01, 0xc1, 0x54, 0xde])


def row_lane(ln: int, j: int | None) -> int | None:
  return None if j is None or not 0 <= j < 16 else (ln & ~15) + j


@pytest.mark.parametrize("ctrl, fn", [
  (0b00011011, lambda i: (i & ~3) | (3 - (i & 3))),  # quad_perm [3,2,1,0]
  (0x101, lambda i: i + 1), (0x10F, lambda i: i + 15),  # row_shl
  (0x111, lambda i: i - 1), (0x114, lambda i: i - 4),   # row_shr
  (0x123, lambda i: (i - 3) % 16),                       # row_ror
  (0x140, lambda i: 15 - i), (0x141, lambda i: (i & 8) | (7 - (i & 7))),  # row_mirror / row_half_mirror
  (0x155, lambda i: 5), (0x163, lambda i: i ^ 3),       # row_share:5 / row_xmask:3
])
@pytest.mark.parametrize("bound_ctrl", [0, 1])
def test_dpp16_mov(ctrl, fn, bound_ctrl):
  w = run(vop1(1, 2, DPP16), dpp16(ctrl, 1, bound_ctrl=bound_ctrl), vgpr={1: SRC, 2: OLD})
  for ln in range(32):
    j = row_lane(ln, fn(ln & 15))
    want = SRC[j] if j is not None else (0 if bound_ctrl else OLD[ln])  # invalid lane: 0 or no write
    assert w.vgpr[2][ln] == want, (ctrl, ln)


def test_dpp16_masks_inactive_sources_and_fetch_inactive():
  # row_mask 0b01: only row 0 writes; bank_mask 0b0101: lanes 0-3 and 8-11 of each row
  w = run(vop1(1, 2, DPP16), dpp16(0x140, 1, row_mask=0b01, bank_mask=0b0101), vgpr={1: SRC, 2: OLD})
  assert w.vgpr[2] == [SRC[15 - i] if i < 16 and (i >> 2) in (0, 2) else 7 for i in range(32)]
  ex = M32 & ~(1 << 14)  # lane 14 is off: lane 1 (mirror of 14) has an invalid source
  w = run(vop1(1, 2, DPP16), dpp16(0x140, 1), vgpr={1: SRC, 2: OLD}, exec_mask=ex)
  assert w.vgpr[2][1] == 7 and w.vgpr[2][14] == 7 and w.vgpr[2][0] == SRC[15]
  w = run(vop1(1, 2, DPP16), dpp16(0x140, 1, fi=1), vgpr={1: SRC, 2: OLD}, exec_mask=ex)
  assert w.vgpr[2][1] == SRC[14]  # fetch-inactive reads the disabled lane anyway


def test_dpp_on_vop2_float_with_src0_modifiers():
  x = np.arange(32, dtype=np.float32) - 10
  y = np.full(32, 0.5, np.float32)
  xb, yb = x.view(np.uint32).tolist(), y.view(np.uint32).tolist()
  # v_add_f32_dpp v2, -|v1| (row_shr:1, bound_ctrl), v3: a reduction step
  w = run(vop2(3, 2, DPP16, 3), dpp16(0x111, 1, bound_ctrl=1, neg0=1, abs0=1), vgpr={1: xb, 3: yb})
  got = np.array(w.vgpr[2], dtype=np.uint32).view(np.float32)
  want = np.array([(-abs(x[i - 1]) if i % 16 else np.float32(-0.0)) + y[i] for i in range(32)], np.float32)
  np.testing.assert_array_equal(got, want)


def test_dpp8():
  sel = [3, 1, 4, 1, 5, 0, 2, 6]
  w = run(vop1(1, 2, DPP8), dpp8(sel, 1), vgpr={1: SRC})
  assert w.vgpr[2] == [SRC[(i & ~7) | sel[i & 7]] for i in range(32)]
  w = run(vop2(37, 2, DPP8, 3), dpp8(sel, 1), vgpr={1: SRC, 3: [1000] * 32}, exec_mask=M32 & ~(1 << 3))
  assert w.vgpr[2][0] == 1000 and w.vgpr[2][1] == SRC[1] + 1000  # lane 0 reads inactive lane 3: 0


def test_permlane16_and_x16():
  sel = list(range(15, -1, -1))  # reverse within the row
  lo = sum(s << (4 * i) for i, s in enumerate(sel[:8]))
  hi = sum(s << (4 * i) for i, s in enumerate(sel[8:]))
  w = run(vop3(0x25B, 2, V(1), 4, 5), vop3(0x25C, 3, V(1), 4, 5), vgpr={1: SRC}, sgpr={4: lo, 5: hi})
  assert w.vgpr[2] == [SRC[(i & 16) | (15 - (i & 15))] for i in range(32)]
  assert w.vgpr[3] == [SRC[((i & 16) ^ 16) | (15 - (i & 15))] for i in range(32)]


def test_dpp_on_16bit_op_is_refused():
  with pytest.raises(UnsupportedInstruction, match="DPP on a 16/64-bit"): run(vop2(50, 2, DPP16, 3), dpp16(0x140, 1))


def test_vop3_dpp():
  # v_add_f32_e64_dpp v0, v1, v2 row_shr:1 (bytes from llvm-mc-15) and v_max_f32_e64_dpp v3, -v1, v2 row_mirror
  def words(bs): return [int.from_bytes(bytes(bs[i:i + 4]), "little") for i in range(0, len(bs), 4)]
  enc = words([0x00, 0x00, 0x03, 0xd5, 0xfa, 0x04, 0x02, 0x00, 0x01, 0x11, 0x01, 0xff])
  assert enc == vop3(0x103, 0, DPP16, V(2)) + dpp16(0x111, 1)
  x, y = np.arange(32, dtype=np.float32), np.full(32, 0.25, np.float32)
  w = run(enc, vop3(0x110, 3, DPP16, V(2), neg=1) + dpp16(0x140, 1),
          vgpr={0: [0] * 32, 1: x.view(np.uint32), 2: y.view(np.uint32)})
  got0, got3 = (np.array(w.vgpr[r], np.uint32).view(np.float32) for r in (0, 3))
  np.testing.assert_array_equal(got0[[i for i in range(32) if i % 16]], [x[i - 1] + y[i] for i in range(32) if i % 16])
  assert got0[0] == 0 and got0[16] == 0  # row_shr:1 with bound_ctrl off: lanes 0 and 16 keep their old value
  np.testing.assert_array_equal(got3, [max(-x[(i & 16) | (15 - (i & 15))], y[i]) for i in range(32)])
  with pytest.raises(UnsupportedInstruction, match="DPP on this VOP3 opcode"):
    run(vop3(0x2FE, 4, DPP16, V(2), V(0)) + dpp16(0x140, 1))
