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

Layers: the ISA tables and lane functions are `emu/isa.py`, the decoder and wave state `emu/state.py`; this module is
the per-wave interpreter over them (`Emulator`) and re-exports their names. The batched engine (`emu/batch*.py`) reads
isa/state too, never this module, so `Emulator.run*` can hand waves to it without an import circle.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Callable, Iterator

from tiny_runtime_amd.emu.isa import (DPP16, DPP8, DPP8_FI, DS_ATOMICS, DS_D16, DS_NAMES, DS_OPS, DS_PERMUTE, EXEC_HI,
                                      EXEC_LO, FLAT_ATOMICS, GLOBAL_D16, GLOBAL_LOADS, GLOBAL_STORES, INLINE_F32,
                                      INLINE_F64, LITERAL, M0, MASK32, MASK64, NULL, SAVEEXEC, SCC_SRC, SMEM_LOADS,
                                      SOP2, SOP2_ADDC, SOP2_B64, SOP2_BFE_U32, SOP2_CSELECT_B32, SOP2_SUBB, SOPC_NAMES,
                                      SOPP_NAMES, UnsupportedInstruction, VCC_HI, VCC_LO, VOP1, VOP1_16, VOP1_F64,
                                      VOP1_SPECIAL, VOP2, VOP2_16, VOP2_ADD_CO_CI, VOP2_CNDMASK, VOP2_FLOAT,
                                      VOP2_FMAAK, VOP2_FMAC, VOP2_FMAMK, VOP2_SPECIAL, VOP3, VOP3P_PK, VOP3SD, VOP3_16,
                                      VOP3_ADD_CO_U32, VOP3_F32_RESULT, VOP3_F64, VOP3_LSHLREV_B64,
                                      VOP3_MAD_U64_U32, VOP3_SUB_CO_U32, VOPD_FLOAT, WAVE, WMMA, _F32_FN, _SOPC_FN,
                                      _SUBDWORD, _VOPD_TO_VOP2, _bf16, _bfe_i32, _cvt_i32, _dwords, _f16, _f16_bits,
                                      _f16_bits_rtz, _ff, _fma, _fma64, _fmax, _fmin, _ldexp, _med3, _s16, _sqrt,
                                      _structs, atomic_result, bits32, bits64, f32, f64, i32, sext, vec_f16, vec_f32,
                                      vopc_compare)
from tiny_runtime_amd.emu.isa import VOP3_MAD_I64_I32
from tiny_runtime_amd.emu.state import Inst, Memory, PrivateMemory, Wave, Wave64, _bits, decode


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

  # run, run_group and run_launch use the batched engine (emu/engine.py over emu/batch.py: all waves in lockstep as
  # numpy columns, each code object decoded once); batched = False runs the per-wave interpreter below, the reference
  # it is tested against
  batched = True

  def run(self, w: Wave, code_addr: int) -> None:
    """Execute one wave from `code_addr` until s_endpgm; s_barrier is a no-op (a work-group of one wave)."""
    if not self.batched: return self.run_reference(w, code_addr)
    from tiny_runtime_amd.emu.engine import run_waves
    run_waves(self, [[w]], code_addr)

  def run_group(self, waves: list[Wave], code_addr: int) -> None:
    """Execute the waves of one work-group until each reaches s_endpgm, meeting at barriers."""
    if not self.batched: return self.run_group_reference(waves, code_addr)
    from tiny_runtime_amd.emu.engine import run_waves
    run_waves(self, [waves], code_addr)

  def run_launch(self, code_addr: int, launch: Any) -> None:
    """Execute every wave of a dispatch (an `emu.batch.Launch`: the registers the dispatcher sets up) together."""
    from tiny_runtime_amd.emu.engine import launch_waves, run_launch
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
    elif op == 31:  # s_not_b64: D.u64 = ~S0.u64; SCC = D.u64 != 0 (opcode 0x1f, LLVM gfx11_asm_sop1.s)
      v = ~self.sread64(w, s, inst) & MASK64
      self.swrite(w, d, v)
      self.swrite(w, d + 1, v >> 32)
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
           23: lambda: a64 & b64, 25: lambda: a64 | b64, 27: lambda: a64 ^ b64, 29: lambda: ~(a64 & b64),
           31: lambda: ~(a64 | b64), 33: lambda: ~(a64 ^ b64), 35: lambda: a64 & ~b64,
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
      k16 = (inst.literal or 0) & 0xFFFF
      fma = VOP3_16[0x248][3]
      for ln in w.lanes():
        x, y = self.vsrc16(w, f["src0"], ln, inst, True), self.vsrc16(w, 256 + f["vsrc1"], ln, inst, True)
        r16 = fma(x, y, self.vsrc16(w, 256 + f["vdst"], ln, inst, True)) if inst.op == 54 else \
          fma(x, k16, y) if inst.op == 55 else fma(x, y, k16)
        self.vwrite16(w, f["vdst"], ln, r16)
      return
    if inst.op == 47:  # v_cvt_pk_rtz_f16_f32: D = {rtz_f16(S1), rtz_f16(S0)}
      for ln in w.lanes():
        x, y = self.vsrc(w, f["src0"], ln, inst), w.vgpr[f["vsrc1"]][ln]
        w.vgpr[f["vdst"]][ln] = _f16_bits_rtz(f32(x)) | (_f16_bits_rtz(f32(y)) << 16)
      return
    if inst.op in (VOP2_ADD_CO_CI, VOP2_ADD_CO_CI + 1, VOP2_ADD_CO_CI + 2):  # add/sub/subrev_co_ci_u32: VCC in/out
      carry = 0
      for ln in w.lanes():
        x, y, ci = self.vsrc(w, f["src0"], ln, inst), w.vgpr[f["vsrc1"]][ln], w.vcc >> ln & 1
        r = x + y + ci if inst.op == 32 else x - y - ci if inst.op == 33 else y - x - ci
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
    for ln in w.lanes():  # one lane at a time: x, y are its two operands
      if 0x30 <= base < 0x40 or base < 0x10 or base == 0x7D:  # 16-bit: VGPR halves by register bit 7
        fp16 = base < 0x10 or base == 0x7D
        x, y = self.vsrc16(w, inst.f["src0"], ln, inst, fp16), self.vsrc16(w, 256 + inst.f["vsrc1"], ln, inst, fp16)
      elif base == 0x7F: x, y = self.vsrc64(w, inst.f["src0"], ln, inst, True), w.vgpr[inst.f["vsrc1"]][ln]
      elif wide:
        x, y = self.vsrc64(w, inst.f["src0"], ln, inst, fp), self.vsrc64(w, 256 + inst.f["vsrc1"], ln, inst, fp)
      else: x, y = self.vsrc(w, inst.f["src0"], ln, inst), w.vgpr[inst.f["vsrc1"]][ln]
      if fn(x, y): mask |= 1 << ln
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
      fi, bc, s0col, ex = f["opsel"] & 1, f["opsel"] >> 1 & 1, w.vgpr[f["src0"] - 256], w.exec
      out = {}
      for ln in w.lanes():
        j = ((ln & 16) ^ (16 if op == 0x25C else 0)) | ((sel >> (4 * (ln & 15))) & 15)
        if fi or ex >> j & 1: out[ln] = s0col[j]
        elif bc: out[ln] = 0
      for ln, v in out.items(): w.vgpr[f["vdst"]][ln] = v
      return
    if op in (0x1EA, 0x1EB) and not (f["omod"] or f["clamp"] or f["abs"] or f["neg"]):  # v_cvt_{i32_i16,u32_u16}
      for ln in w.lanes():
        v = (self.vsrc(w, f["src0"], ln, inst) >> (16 * (f["opsel"] & 1))) & 0xFFFF
        w.vgpr[f["vdst"]][ln] = _s16(v) & MASK32 if op == 0x1EA else v
      return
    if op == 0x18B and not (f["omod"] or f["clamp"]):  # v_cvt_f32_f16_e64: |x| / -x on the half's own sign (bit 15)
      for ln in w.lanes():
        half = (self.vsrc(w, f["src0"], ln, inst) >> (16 * (f["opsel"] & 1))) & 0xFFFF
        half = (half & 0x7FFF if f["abs"] & 1 else half) ^ (0x8000 if f["neg"] & 1 else 0)
        w.vgpr[f["vdst"]][ln] = bits32(_f16(half))
      return
    if op in (0x311, 0x12F) and not (f["omod"] or f["clamp"]):  # v_pack_b32_f16 / v_cvt_pk_rtz_f16_f32
      for ln in w.lanes():
        x, y = self.vsrc(w, f["src0"], ln, inst), self.vsrc(w, f["src1"], ln, inst)
        if op == 0x12F:
          if f["opsel"]: raise UnsupportedInstruction(f"{inst.name}: opsel at {w.pc:#x}")
          x, y = (self._f32_mods(v, i, f) for i, v in enumerate((x, y)))
          w.vgpr[f["vdst"]][ln] = _f16_bits_rtz(f32(x)) | (_f16_bits_rtz(f32(y)) << 16)
          continue
        h = [((v >> (16 * (f["opsel"] >> i & 1))) & 0xFFFF) for i, v in enumerate((x, y))]
        h = [(v & (0x7FFF if f["abs"] >> i & 1 else 0xFFFF)) ^ (0x8000 if f["neg"] >> i & 1 else 0)
             for i, v in enumerate(h)]
        w.vgpr[f["vdst"]][ln] = h[0] | (h[1] << 16)
      return
    if op in (0x125, 0x126) and f["clamp"] and not (f["omod"] or f["opsel"]):  # v_add/sub_nc_u32 clamp: saturate
      for ln in w.lanes():
        x, y = self.vsrc(w, f["src0"], ln, inst), self.vsrc(w, f["src1"], ln, inst)
        w.vgpr[f["vdst"]][ln] = max(0, min(MASK32, x + y if op == 0x125 else x - y))
      return
    if (f["omod"] or f["clamp"]) and not f["opsel"] and op in VOP3_F32_RESULT:
      # output modifiers of a float32 result: x2 / x4 / /2 (omod 1/2/3), then clamp to [0, 1] (NaN -> 0)
      self.vop3(w, Inst(inst.fmt, op, {**inst.f, "omod": 0, "clamp": 0}, inst.size, inst.name, inst.literal))
      scale, lanes, vd = (1.0, 2.0, 4.0, 0.5)[f["omod"]], w.lanes(), w.vgpr[f["vdst"]]
      for ln in lanes:
        fx = f32(vd[ln]) * scale
        if f["clamp"]: fx = 0.0 if fx != fx else min(max(fx, 0.0), 1.0)
        vd[ln] = bits32(fx)
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
      elif 0x10 <= op & 0x7F < 0x20 and lanes:  # float32: convert the columns at once
        si, sf = _structs(len(lanes))
        ca, cb = cols(2)
        fcmp = _F32_FN[op & 0x7F]
        mask = sum(1 << ln for ln, x, y in zip(lanes, sf.unpack(si.pack(*ca)), sf.unpack(si.pack(*cb))) if fcmp(x, y))
      else:
        ca, cb = cols(2)
        mask = sum(1 << ln for ln, x, y in zip(lanes, ca, cb) if fn(x, y))
      if op & 0x80: w.exec = mask
      else: self.wmask(w, f["vdst"], mask)
      return
    if op == 0x213:  # v_fma_f32, by columns
      self.store(w, f["vdst"], lanes, vec_f32(_fma, *cols(3)))
      return
    if op in VOP3_F64:
      f64op, n = VOP3_F64[op][1], 3 if op in (0x214, 0x228) else 2
      for ln in w.lanes(): self.vwrite64(w, f["vdst"], ln, f64op(*(src64(i, ln) for i in range(n))))
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
      _, s64, d64, f1op = VOP1_F64[op - 0x180]
      for ln in w.lanes():
        res = f1op(src64(0, ln) if s64 else src(0, ln))
        if d64: self.vwrite64(w, f["vdst"], ln, res)
        else: w.vgpr[f["vdst"]][ln] = res & MASK32
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
    elif op in (VOP3_MAD_U64_U32, VOP3_MAD_I64_I32):
      # {D1.u1, D0.u64} = 65-bit S0.u32 * S1.u32 + S2.u64 / S0.i32 * S1.i32 + S2.i64 (sign-extended): D1 is the
      # 65-bit result's top bit (the carry out; for i64 the sign of the exact result)
      c, (a, b) = self.col64(w, f["src2"], lanes, inst), cols(2)
      if op == VOP3_MAD_U64_U32: full = [x * y + z for x, y, z in zip(a, b, c)]
      else: full = [sext(x, 32) * sext(y, 32) + sext(z, 64) for x, y, z in zip(a, b, c)]
      r = [v & MASK64 for v in full]
      self.store(w, f["vdst"], lanes, [v & MASK32 for v in r])
      self.store(w, f["vdst"] + 1, lanes, [v >> 32 for v in r])
      self.wmask(w, f["sdst"], sum(1 << ln for ln, v in zip(lanes, full) if v >> 64 & 1))
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
    for ln in w.lanes():  # one lane at a time: its one or two addresses
      base = w.vgpr[f["addr"]][ln]
      if kind in ("st", "ld"): lane_addrs = [(base + (f["offset1"] << 8 | f["offset0"])) & MASK32]
      else: lane_addrs = [(base + f["offset0"] * stride) & MASK32, (base + f["offset1"] * stride) & MASK32]
      for j, a in enumerate(lane_addrs):
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


# the ISA tables, decoder and wave state are re-exported: `from tiny_runtime_amd.emu.rdna3 import Wave, EXEC_LO`
__all__ = ["DPP16", "DPP8", "DPP8_FI", "DS_ATOMICS", "DS_D16", "DS_NAMES", "DS_OPS", "DS_PERMUTE", "EXEC_HI",
           "EXEC_LO", "Emulator", "FLAT_ATOMICS", "GLOBAL_D16", "GLOBAL_LOADS", "GLOBAL_STORES", "INLINE_F32",
           "INLINE_F64", "Inst", "LITERAL", "M0", "MASK32", "MASK64", "Memory", "NULL", "PrivateMemory", "SAVEEXEC",
           "SCC_SRC", "SMEM_LOADS", "SOP2", "SOP2_ADDC", "SOP2_B64", "SOP2_BFE_U32", "SOP2_CSELECT_B32", "SOP2_SUBB",
           "SOPC_NAMES", "SOPP_NAMES", "UnsupportedInstruction", "VCC_HI", "VCC_LO", "VOP1", "VOP1_16", "VOP1_F64",
           "VOP1_SPECIAL", "VOP2", "VOP2_16", "VOP2_ADD_CO_CI", "VOP2_CNDMASK", "VOP2_FLOAT", "VOP2_FMAAK",
           "VOP2_FMAC", "VOP2_FMAMK", "VOP2_SPECIAL", "VOP3", "VOP3P_PK", "VOP3SD", "VOP3_16", "VOP3_ADD_CO_U32",
           "VOP3_F32_RESULT", "VOP3_F64", "VOP3_LSHLREV_B64",
           "VOP3_MAD_I64_I32", "VOP3_MAD_U64_U32", "VOP3_SUB_CO_U32", "VOPD_FLOAT",
           "WAVE", "WMMA", "Wave", "Wave64", "_F32_FN", "_SOPC_FN", "_SUBDWORD", "_VOPD_TO_VOP2", "_bf16", "_bfe_i32",
           "_bits", "_cvt_i32", "_dwords", "_f16", "_f16_bits", "_f16_bits_rtz", "_ff", "_fma", "_fma64", "_fmax",
           "_fmin", "_ldexp", "_med3", "_s16", "_sqrt", "_structs", "atomic_result", "bits32", "bits64", "decode",
           "f32", "f64", "i32", "sext", "vec_f16", "vec_f32", "vopc_compare"]
