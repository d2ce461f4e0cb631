"""PM4 type-3 packets for the gfx11 compute queue (MEC) and `AMDComputeQueue`.

Opcodes: Linux `drivers/gpu/drm/amd/amdgpu/nvd.h` (PACKET3_*). Compute register byte addresses: Mesa
`src/amd/common/sid.h` (`R_00B8xx_COMPUTE_*`, the same on gfx6..gfx11); SET_SH_REG takes the dword index relative
to SH_REG_START (0x2C00 dwords = byte 0xB000), i.e. `(addr - 0xB000) // 4` (matches `gc_11_0_0_offset.h`
regCOMPUTE_* + the GC base 0x1260). Field layouts of RELEASE_MEM / WAIT_REG_MEM / ACQUIRE_MEM are nvd.h's gfx10+
ones.
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

from tiny_uop.hcq import HCQSignal, HWQueue, Val, hi32, lo32

# nvd.h opcodes
NOP, SET_SH_REG, DISPATCH_DIRECT, ACQUIRE_MEM, RELEASE_MEM, WAIT_REG_MEM, INDIRECT_BUFFER, EVENT_WRITE = \
  0x10, 0x76, 0x15, 0x58, 0x49, 0x3C, 0x3F, 0x46
OPCODE_NAMES = {NOP: "NOP", SET_SH_REG: "SET_SH_REG", DISPATCH_DIRECT: "DISPATCH_DIRECT", ACQUIRE_MEM: "ACQUIRE_MEM",
                RELEASE_MEM: "RELEASE_MEM", WAIT_REG_MEM: "WAIT_REG_MEM", INDIRECT_BUFFER: "INDIRECT_BUFFER",
                EVENT_WRITE: "EVENT_WRITE"}
SH_REG_BASE = 0xB000  # byte address of SH register 0x2C00

# sid.h register byte addresses
COMPUTE_DISPATCH_INITIATOR = 0xB800
COMPUTE_START_X, COMPUTE_START_Y, COMPUTE_START_Z = 0xB810, 0xB814, 0xB818
COMPUTE_NUM_THREAD_X, COMPUTE_NUM_THREAD_Y, COMPUTE_NUM_THREAD_Z = 0xB81C, 0xB820, 0xB824
COMPUTE_PGM_LO, COMPUTE_PGM_HI = 0xB830, 0xB834
COMPUTE_DISPATCH_SCRATCH_BASE_LO, COMPUTE_DISPATCH_SCRATCH_BASE_HI = 0xB840, 0xB844  # gfx11+: scratch VA >> 8
COMPUTE_PGM_RSRC1, COMPUTE_PGM_RSRC2 = 0xB848, 0xB84C
COMPUTE_RESOURCE_LIMITS, COMPUTE_TMPRING_SIZE, COMPUTE_PGM_RSRC3 = 0xB854, 0xB860, 0xB8A0
COMPUTE_USER_DATA_0 = 0xB900  # USER_DATA_0..15 follow, 4 bytes apart

# RELEASE_MEM / EVENT_WRITE events (vgt_event_type) and selects
CACHE_FLUSH_AND_INV_TS_EVENT, EVENT_INDEX_EOP = 0x14, 5
CS_PARTIAL_FLUSH, EVENT_INDEX_PARTIAL_FLUSH = 0x07, 4
DATA_SEL_NONE, DATA_SEL_32, DATA_SEL_64, DATA_SEL_TIMESTAMP = 0, 1, 2, 3
WAIT_FUNC_GEQ, WAIT_MEM_SPACE_MEMORY = 3, 1
DISPATCH_COMPUTE_SHADER_EN, DISPATCH_FORCE_START_AT_000, DISPATCH_CS_W32_EN = 1 << 0, 1 << 2, 1 << 15
IB_VALID = 1 << 23


def header(op: int, body_dwords: int, compute: bool = True) -> int:
  """PACKET3(op, count): type 3 in bits 31:30, count = body dwords - 1 in 29:16, opcode 15:8, SHADER_TYPE bit 1."""
  if not 1 <= body_dwords <= 0x4000: raise ValueError(f"PM4 packet body of {body_dwords} dwords; valid: 1..16384")
  return (3 << 30) | ((body_dwords - 1) << 16) | ((op & 0xFF) << 8) | (int(compute) << 1)


def decode_header(h: int) -> tuple[int, int, int]:
  """(type, opcode, body dwords) of a PM4 header dword."""
  return h >> 30, (h >> 8) & 0xFF, ((h >> 16) & 0x3FFF) + 1


def sh_reg_index(addr: int) -> int:
  if not SH_REG_BASE <= addr < SH_REG_BASE + 0x1000 or addr % 4:
    raise ValueError(f"SH register byte address {addr:#x} is outside 0xB000..0xBFFC or unaligned")
  return (addr - SH_REG_BASE) // 4


class AMDComputeQueue(HWQueue):
  """A gfx11 compute queue: each command appends PM4 packets; `_submit` hands the dwords to the device's ring."""

  def pkt3(self, op: int, *body: Val) -> AMDComputeQueue:
    self.q(header(op, len(body)), *body)
    return self

  def set_sh_reg(self, addr: int, *values: Val) -> AMDComputeQueue:
    return self.pkt3(SET_SH_REG, sh_reg_index(addr), *values)

  def release_mem(self, addr: Val, value: Val, data_sel: int) -> AMDComputeQueue:
    """End-of-pipe write of `value` (DATA_SEL_32/64) or the GPU clock (DATA_SEL_TIMESTAMP) to `addr`."""
    return self.pkt3(RELEASE_MEM, CACHE_FLUSH_AND_INV_TS_EVENT | (EVENT_INDEX_EOP << 8), data_sel << 29,
                     lo32(addr), hi32(addr), lo32(value), hi32(value), 0)

  def wait_reg_mem(self, addr: Val, ref: Val, mask: int = 0xFFFFFFFF) -> AMDComputeQueue:
    """Stall until `*(u32*)addr >= ref` (WAIT_REG_MEM, function GEQ, memory space)."""
    return self.pkt3(WAIT_REG_MEM, WAIT_FUNC_GEQ | (WAIT_MEM_SPACE_MEMORY << 4), lo32(addr), hi32(addr), ref, mask, 0x4)

  def wait(self, signal: HCQSignal, value: Val = 0) -> AMDComputeQueue:
    """Wait until the signal's low 32 bits reach `value` (timeline values stay below 2**32)."""
    return self.wait_reg_mem(signal.addr, lo32(value))

  def signal(self, signal: HCQSignal, value: Val = 0) -> AMDComputeQueue:
    return self.release_mem(signal.addr, value, DATA_SEL_64)

  def timestamp(self, signal: HCQSignal) -> AMDComputeQueue:
    return self.release_mem(signal.addr + 8, 0, DATA_SEL_TIMESTAMP)

  def memory_barrier(self) -> AMDComputeQueue:
    """Wait for earlier dispatches (EVENT_WRITE CS_PARTIAL_FLUSH), then ACQUIRE_MEM over the whole address space
    (invalidate/write back shader caches before the next dispatch)."""
    self.pkt3(EVENT_WRITE, CS_PARTIAL_FLUSH | (EVENT_INDEX_PARTIAL_FLUSH << 8))
    return self.pkt3(ACQUIRE_MEM, 0, 0xFFFFFFFF, 0xFFFFFF, 0, 0, 0xA, 0x0000C3FF)

  def indirect_buffer(self, addr: Val, ndwords: int) -> AMDComputeQueue:
    return self.pkt3(INDIRECT_BUFFER, lo32(addr), hi32(addr), ndwords | IB_VALID)

  def exec(self, prg: Any, args_addr: Val, global_size: Sequence[Val], local_size: Sequence[Val]) -> AMDComputeQueue:
    """Dispatch `prg` (an `AMDProgram`: entry address, rsrc1/2/3, user SGPR layout) over `global_size` work-groups
    of `local_size` work-items, its kernarg segment at `args_addr`."""
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size) + (1, 1, 1))[:3]
    self.set_sh_reg(COMPUTE_PGM_LO, lo32(prg.entry_addr >> 8), hi32(prg.entry_addr >> 8))
    self.set_sh_reg(COMPUTE_PGM_RSRC1, prg.rsrc1, prg.rsrc2)
    self.set_sh_reg(COMPUTE_PGM_RSRC3, prg.rsrc3)
    if (scratch := prg.scratch()) is not None:  # (base address, TMPRING_SIZE) of the device's scratch buffer
      base, tmpring = scratch
      self.set_sh_reg(COMPUTE_DISPATCH_SCRATCH_BASE_LO, lo32(base >> 8), hi32(base >> 8))
      self.set_sh_reg(COMPUTE_TMPRING_SIZE, tmpring)
    else: self.set_sh_reg(COMPUTE_TMPRING_SIZE, 0)
    if (user := prg.user_data(args_addr)): self.set_sh_reg(COMPUTE_USER_DATA_0, *user)
    self.set_sh_reg(COMPUTE_RESOURCE_LIMITS, 0)
    self.set_sh_reg(COMPUTE_START_X, 0, 0, 0, *ls)
    initiator = DISPATCH_COMPUTE_SHADER_EN | DISPATCH_FORCE_START_AT_000 | DISPATCH_CS_W32_EN
    return self.pkt3(DISPATCH_DIRECT, *gs, initiator)

  # a bound queue is an indirect buffer in host-visible GPU memory: `chain` jumps to it, a patch writes it in place
  def _bind_mem(self, dev: Any, dwords: list[int]) -> Any:
    self._ib = dev.iface.alloc(4 * max(len(dwords), 1), host=True)
    mem = (ctypes.c_uint32 * len(dwords)).from_address(self._ib.va_addr)
    mem[:] = dwords
    return mem

  def chain(self, other: HWQueue) -> AMDComputeQueue:
    """Run `other`: an INDIRECT_BUFFER to it when it is bound, else its commands copied in."""
    if not other.bound: return self.q(*other._q)  # type: ignore[return-value]
    return self.indirect_buffer(other._ib.va_addr, len(other._mem))  # type: ignore[attr-defined]

  def _submit_bound(self, dev: Any) -> None:
    dev.compute_ring.submit(AMDComputeQueue().indirect_buffer(self._ib.va_addr, len(self._mem)).resolved())

  def _free_bound(self, dev: Any, after: int) -> None:
    if self._mem is not None: dev.defer_free(self._ib, after)

  def _submit(self, dev: Any, dwords: list[int]) -> None: dev.compute_ring.submit(dwords)
