"""Hand encoders for the RDNA3 microcode formats (field positions from the RDNA3 ISA guide, "Microcode Formats"): build
emulator programs without an assembler (the LLVM here has no gfx11 assembler); used by the tests and benchmarks."""
from __future__ import annotations

import ctypes

from tiny_runtime_amd.emu.isa import NULL


def V(n: int) -> int: return 256 + n  # a VGPR as a 9-bit source operand


def sop2(op, sdst, s0, s1): return [(0b10 << 30) | (op << 23) | (sdst << 16) | (s1 << 8) | s0]
def sop1(op, sdst, s0): return [(0b101111101 << 23) | (sdst << 16) | (op << 8) | s0]
def sopk(op, sdst, imm): return [(0b1011 << 28) | (op << 23) | (sdst << 16) | (imm & 0xFFFF)]
def sopc(op, s0, s1): return [(0b101111110 << 23) | (op << 16) | (s1 << 8) | s0]
def sopp(op, imm=0): return [(0b101111111 << 23) | (op << 16) | (imm & 0xFFFF)]
def endpgm(): return sopp(48)
def smem(op, sdata, sbase, offset, soffset=NULL):
  return [(0b111101 << 26) | (op << 18) | (sdata << 6) | (sbase >> 1), (soffset << 25) | (offset & 0x1FFFFF)]
def vop1(op, vdst, src0): return [(0b0111111 << 25) | (vdst << 17) | (op << 9) | src0]
def vop2(op, vdst, src0, vsrc1): return [(op << 25) | (vdst << 17) | (vsrc1 << 9) | src0]
def vopc(op, src0, vsrc1): return [(0b0111110 << 25) | (op << 17) | (vsrc1 << 9) | src0]
def vop3(op, vdst, s0, s1, s2=0, sdst=0, abs_=0, neg=0, clamp=0, omod=0):
  return [(0b110101 << 26) | (op << 16) | (clamp << 15) | (sdst << 8) | (abs_ << 8) | vdst,
          (neg << 29) | (omod << 27) | (s2 << 18) | (s1 << 9) | s0]
def vop3p(op, vdst, s0, s1, s2=0, opsel=0, opsel_hi=7, neg=0, neg_hi=0, clamp=0):
  return [(0b11001100 << 24) | (op << 16) | (clamp << 15) | ((opsel_hi >> 2 & 1) << 14) | (opsel << 11) | (neg_hi << 8)
          | vdst, (neg << 29) | ((opsel_hi & 3) << 27) | (s2 << 18) | (s1 << 9) | s0]
def vopd(opx, opy, vdstx, vdsty, src0x, vsrcx1, src0y, vsrcy1):
  assert (vdstx ^ vdsty) & 1, "VOPD destinations must differ in parity"
  return [(0b110010 << 26) | (opx << 22) | (opy << 17) | (vsrcx1 << 9) | src0x,
          (vdstx << 24) | ((vdsty >> 1) << 17) | (vsrcy1 << 9) | src0y]
def glob(op, vdst=0, addr=0, saddr=NULL, data=0, offset=0, glc=0, seg=2, sve=0):
  return [(0b110111 << 26) | (op << 18) | (seg << 16) | (glc << 14) | (offset & 0x1FFF),
          (vdst << 24) | (sve << 23) | (saddr << 16) | (data << 8) | addr]
def scratch(op, vdst=0, addr=None, saddr=NULL, data=0, offset=0):
  """A SCRATCH (FLAT segment 1) instruction: `addr` a VGPR offset (None: off), `saddr` an SGPR offset (NULL: off)."""
  return glob(op, vdst, addr or 0, saddr, data, offset, seg=1, sve=int(addr is not None))


def ds(op, addr=0, data0=0, data1=0, vdst=0, offset0=0, offset1=0):
  return [(0b110110 << 26) | (op << 18) | (offset1 << 8) | offset0, (vdst << 24) | (data1 << 16) | (data0 << 8) | addr]


class Code:
  """A program in host memory (the emulator reads code by address)."""
  def __init__(self, *parts: list[int]):
    words = [w for p in parts for w in p] + endpgm() + [0] * 16
    self.buf = (ctypes.c_uint32 * len(words))(*words)
    self.addr = ctypes.addressof(self.buf)
    self.size = 4 * len(words)


def dpp16(ctrl, src0, row_mask=0xF, bank_mask=0xF, bound_ctrl=0, fi=0, neg0=0, abs0=0):
  """The DPP16 dword that follows a VOP1/VOP2/VOPC whose src0 is DPP16 (250); `src0` the VGPR number."""
  return [(row_mask << 28) | (bank_mask << 24) | (abs0 << 21) | (neg0 << 20) | (bound_ctrl << 19) | (fi << 18)
          | (ctrl << 8) | src0]


def dpp8(sel, src0):
  """The DPP8 dword that follows a VOP1/VOP2/VOPC whose src0 is DPP8 (233): lane i reads lane sel[i % 8]."""
  return [sum(s << (3 * i) for i, s in enumerate(sel)) << 8 | src0]
