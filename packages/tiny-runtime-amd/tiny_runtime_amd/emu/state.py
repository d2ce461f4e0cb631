"""The RDNA3 decoder and wave state, below the interpreter (`rdna3.Emulator`) and the batched engine (`batch*.py`):
`decode` turns instruction bytes into an `Inst` (encoding, opcode, fields, size, mnemonic); `Memory` is byte access to
host addresses; `Wave`/`Wave64` hold one wave's SGPRs, VGPR columns, EXEC/VCC, pc and private memory.
Encodings: AMD's "RDNA3 Instruction Set Architecture" reference guide, "Microcode Formats" (see `rdna3.py`).
"""
from __future__ import annotations

import ctypes
import functools
import struct
from dataclasses import dataclass, field
from typing import ClassVar

from tiny_runtime_amd.emu.isa import VOP3_MAD_I64_I32
from tiny_runtime_amd.emu.isa import (DPP16, DPP8, DPP8_FI, DS_ATOMICS, DS_NAMES, DS_PERMUTE, EXEC_HI, EXEC_LO,
                                      FLAT_ATOMICS, FLAT_NAMES, LITERAL, MASK32, SAVEEXEC, SMEM_LOADS, SOP2, SOP2_B64,
                                      SOPC_NAMES, SOPP_NAMES, UnsupportedInstruction, VCC_HI, VCC_LO, VOP1, VOP1_16,
                                      VOP1_F64, VOP1_SPECIAL, VOP2, VOP2_16, VOP2_FMAAK, VOP2_FMAMK, VOP2_SPECIAL,
                                      VOP3, VOP3P_NAMES, VOP3_16, VOP3_ADD_CO_U32, VOP3_F64, VOP3_LSHLREV_B64,
                                      VOP3_MAD_U64_U32, VOP3_SUB_CO_U32, VOPD_OPS, WAVE, sext, vopc_compare)


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


def _sop1_name(op: int) -> str:
  if op in SAVEEXEC: return SAVEEXEC[op][0]
  return {0: "s_mov_b32", 1: "s_mov_b64", 2: "s_cmov_b32", 4: "s_brev_b32", 71: "s_getpc_b64", 72: "s_setpc_b64",
          73: "s_swappc_b64", 9: "s_ctz_i32_b64", 25: "s_bcnt1_i32_b64", 8: "s_ctz_i32_b32", 10: "s_clz_i32_u32",
          14: "s_sext_i32_i8", 15: "s_sext_i32_i16", 16: "s_bitset0_b32", 18: "s_bitset1_b32", 21: "s_abs_i32",
          22: "s_bcnt0_i32_b32", 24: "s_bcnt1_i32_b32", 30: "s_not_b32",
          31: "s_not_b64"}.get(op, f"sop1_{op}")


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
          VOP3_SUB_CO_U32: "v_sub_co_u32", VOP3_MAD_U64_U32: "v_mad_u64_u32",
          VOP3_MAD_I64_I32: "v_mad_i64_i32", 0x360: "v_readlane_b32",
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
