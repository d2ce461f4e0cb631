"""PM4 type-3 packets for the compute queue (MEC): `AMDComputeQueue` (gfx11) and `AMDComputeQueue9` (gfx9: CDNA3
gfx942, whose RELEASE_MEM/ACQUIRE_MEM cache controls and some registers differ; see that class).

Sources of the numbers (each is cross-checked in tests against tinygrad 0.14.0's generated bindings of the same
headers, `autogen/amd_gpu.py` = nvd.h and `autogen/am/pm4_nv.py`, see tests/test_oracle.py):
- opcodes and the gfx10+ field encodings: Linux `drivers/gpu/drm/amd/amdgpu/nvd.h` (PACKET3_*);
- field widths and the reserved bits of each dword: the MEC packet definitions of ROCm's PM4 headers
  (`PM4_MEC_RELEASE_MEM`, `PM4_MEC_ACQUIRE_MEM`, `PM4_MEC_WAIT_REG_MEM`, `PM4_MEC_EVENT_WRITE`, gfx10/gfx11);
- compute register byte addresses: Mesa `src/amd/common/sid.h` (`R_00B8xx_COMPUTE_*`), i.e. gc_11_0_0's
  `regCOMPUTE_*` dword offsets plus the GC segment-0 base 0x1260, times 4. SET_SH_REG takes the dword index
  relative to SH register 0x2C00 (byte 0xB000);
- cache actions: what amdgpu's `gfx_v11_0_ring_emit_fence` (RELEASE_MEM) and `gfx_v11_0_emit_mem_sync`
  (ACQUIRE_MEM) program.
"""
from __future__ import annotations

from typing import Any, Sequence

from tiny_uop.hcq import HCQSignal, HWQueue, Val, hi32, lo32

# nvd.h opcodes (PACKET3_*)
NOP, SET_SH_REG, DISPATCH_DIRECT, ACQUIRE_MEM, RELEASE_MEM, WAIT_REG_MEM, INDIRECT_BUFFER, EVENT_WRITE = \
  0x10, 0x76, 0x15, 0x58, 0x49, 0x3C, 0x3F, 0x46
OPCODE_NAMES = {NOP: "NOP", SET_SH_REG: "SET_SH_REG", DISPATCH_DIRECT: "DISPATCH_DIRECT", ACQUIRE_MEM: "ACQUIRE_MEM",
                RELEASE_MEM: "RELEASE_MEM", WAIT_REG_MEM: "WAIT_REG_MEM", INDIRECT_BUFFER: "INDIRECT_BUFFER",
                EVENT_WRITE: "EVENT_WRITE"}
SH_REG_BASE = 0xB000  # byte address of SH register 0x2C00 (nvd.h PACKET3_SET_SH_REG_START)
SH_REG_END = 0xC000   # PACKET3_SET_SH_REG_END 0x3000, in bytes

# sid.h register byte addresses (gc_11_0_0 regCOMPUTE_* + 0x1260, * 4)
COMPUTE_DISPATCH_INITIATOR = 0xB800
COMPUTE_START_X, COMPUTE_START_Y, COMPUTE_START_Z = 0xB810, 0xB814, 0xB818
COMPUTE_NUM_THREAD_X, COMPUTE_NUM_THREAD_Y, COMPUTE_NUM_THREAD_Z = 0xB81C, 0xB820, 0xB824
COMPUTE_PGM_LO, COMPUTE_PGM_HI = 0xB830, 0xB834
COMPUTE_DISPATCH_SCRATCH_BASE_LO, COMPUTE_DISPATCH_SCRATCH_BASE_HI = 0xB840, 0xB844  # gfx11+: scratch VA >> 8
COMPUTE_PGM_RSRC1, COMPUTE_PGM_RSRC2 = 0xB848, 0xB84C
COMPUTE_RESOURCE_LIMITS, COMPUTE_TMPRING_SIZE, COMPUTE_PGM_RSRC3 = 0xB854, 0xB860, 0xB8A0
COMPUTE_USER_DATA_0 = 0xB900  # USER_DATA_0..15 follow, 4 bytes apart

# COMPUTE_PGM_RSRC1/2 fields the dispatcher sets (gc_11_0_0_sh_mask.h; LLVM AMDGPUUsage "compute_pgm_rsrc1/2")
RSRC1_PRIV = 1 << 20
RSRC2_SCRATCH_EN, RSRC2_LDS_SIZE_SHIFT, RSRC2_LDS_SIZE_MASK = 1 << 0, 15, 0x1FF

# VGT_EVENT_TYPE (soc21 enum) and event indices
CS_PARTIAL_FLUSH, CACHE_FLUSH_AND_INV_TS_EVENT = 0x07, 0x14
EVENT_INDEX_CS_PARTIAL_FLUSH = 4   # PACKET3_EVENT_WRITE__EVENT_INDEX__CS_PARTIAL_FLUSH
EVENT_INDEX_END_OF_PIPE = 5        # event_index__mec_release_mem__end_of_pipe

# RELEASE_MEM dword 1: cache actions (nvd.h PACKET3_RELEASE_MEM_GCR_*), cache policy; dword 2: selects
GCR_GLM_WB, GCR_GLM_INV, GCR_GLV_INV, GCR_GL1_INV, GCR_GL2_US = 1 << 12, 1 << 13, 1 << 14, 1 << 15, 1 << 16
GCR_GL2_INV, GCR_GL2_WB, GCR_SEQ = 1 << 20, 1 << 21, 1 << 22
RELEASE_CACHE_POLICY_SHIFT, CACHE_POLICY_BYPASS = 25, 3
DST_SEL_SHIFT, INT_SEL_SHIFT, DATA_SEL_SHIFT = 16, 24, 29
DST_SEL_MEMORY = 0                          # dst_sel__mec_release_mem__memory_controller
INT_SEL_NONE, INT_SEL_AFTER_WRITE_CONFIRM = 0, 2  # int_sel__mec_release_mem__send_interrupt_after_write_confirm
DATA_SEL_NONE, DATA_SEL_32, DATA_SEL_64, DATA_SEL_TIMESTAMP = 0, 1, 2, 3
# amdgpu's gfx11 fence: write back and invalidate every cache level before the value lands, so whoever reads the
# value (the host, or another queue) also sees what the kernels wrote. GLM_INV "must be set with GLM_WB".
RELEASE_CACHE_ACTIONS = GCR_SEQ | GCR_GL2_WB | GCR_GL2_INV | GCR_GL2_US | GCR_GL1_INV | GCR_GLV_INV | GCR_GLM_INV | \
  GCR_GLM_WB

# WAIT_REG_MEM dword 1 (PACKET3_WAIT_REG_MEM__FUNCTION / __MEM_SPACE / __OPERATION)
WAIT_FUNC_ALWAYS, WAIT_FUNC_LT, WAIT_FUNC_LE, WAIT_FUNC_EQ, WAIT_FUNC_NE, WAIT_FUNC_GEQ, WAIT_FUNC_GT = range(7)
WAIT_MEM_SPACE_SHIFT, WAIT_MEM_SPACE_MEMORY, WAIT_OPERATION_SHIFT, WAIT_OPERATION_WAIT = 4, 1, 6, 0
WAIT_POLL_INTERVAL = 4

# ACQUIRE_MEM dword 7: GCR_CNTL (nvd.h PACKET3_ACQUIRE_MEM_GCR_CNTL_*); dword 3: COHER_SIZE_HI is 8 bits
ACQ_GLI_INV_ALL, ACQ_GLM_WB, ACQ_GLM_INV, ACQ_GLK_WB, ACQ_GLK_INV = 1 << 0, 1 << 4, 1 << 5, 1 << 6, 1 << 7
ACQ_GLV_INV, ACQ_GL1_INV, ACQ_GL2_INV, ACQ_GL2_WB = 1 << 8, 1 << 9, 1 << 14, 1 << 15
# what gfx_v11_0_emit_mem_sync invalidates before work that reads what others wrote (+ GLK_WB, as tinygrad does)
ACQUIRE_CACHE_ACTIONS = ACQ_GLI_INV_ALL | ACQ_GLM_WB | ACQ_GLM_INV | ACQ_GLK_WB | ACQ_GLK_INV | ACQ_GLV_INV | \
  ACQ_GL1_INV | ACQ_GL2_INV | ACQ_GL2_WB
ACQUIRE_POLL_INTERVAL = 0xA

# DISPATCH_DIRECT dword 4 = COMPUTE_DISPATCH_INITIATOR (gc_11_0_0_sh_mask.h)
DISPATCH_COMPUTE_SHADER_EN, DISPATCH_FORCE_START_AT_000, DISPATCH_CS_W32_EN = 1 << 0, 1 << 2, 1 << 15
IB_VALID = 1 << 23  # INDIRECT_BUFFER dword 3: IB_SIZE in bits 19:0, VALID bit 23


def header(op: int, body_dwords: int, compute: bool = True) -> int:
  """PACKET3(op, count): type 3 in bits 31:30, count = body dwords - 1 in 29:16, opcode 15:8, SHADER_TYPE bit 1."""
  if not 1 <= body_dwords <= 0x4000: raise ValueError(f"PM4 packet body of {body_dwords} dwords; valid: 1..16384")
  return (3 << 30) | ((body_dwords - 1) << 16) | ((op & 0xFF) << 8) | (int(compute) << 1)


def decode_header(h: int) -> tuple[int, int, int]:
  """(type, opcode, body dwords) of a PM4 header dword."""
  return h >> 30, (h >> 8) & 0xFF, ((h >> 16) & 0x3FFF) + 1


def sh_reg_index(addr: int) -> int:
  """SET_SH_REG's register offset for a byte address in the SH register space."""
  if not SH_REG_BASE <= addr < SH_REG_END or addr % 4:
    raise ValueError(f"SH register byte address {addr:#x} is outside {SH_REG_BASE:#x}..{SH_REG_END - 4:#x} or "
                     "unaligned")
  return (addr - SH_REG_BASE) // 4


class AMDComputeQueue(HWQueue):
  """A gfx11 compute queue: each command appends PM4 packets; `_submit` hands the dwords to the device's ring."""

  def pkt3(self, op: int, *body: Val) -> AMDComputeQueue:
    self.q(header(op, len(body)), *body)
    return self

  def set_sh_reg(self, addr: int, *values: Val) -> AMDComputeQueue:
    return self.pkt3(SET_SH_REG, sh_reg_index(addr), *values)

  def release_mem(self, addr: Val, value: Val, data_sel: int, int_sel: int = INT_SEL_NONE,
                  ctxid: Val = 0) -> AMDComputeQueue:
    """End-of-pipe write of `value` (DATA_SEL_32/64) or the GPU clock (DATA_SEL_TIMESTAMP) to `addr` once earlier
    dispatches finished, after writing back and invalidating the caches (RELEASE_CACHE_ACTIONS); with `int_sel`,
    an interrupt carrying `ctxid` follows the write (KFD signals the event whose id that is)."""
    return self.pkt3(RELEASE_MEM,
                     CACHE_FLUSH_AND_INV_TS_EVENT | (EVENT_INDEX_END_OF_PIPE << 8) | RELEASE_CACHE_ACTIONS |
                     (CACHE_POLICY_BYPASS << RELEASE_CACHE_POLICY_SHIFT),
                     (data_sel << DATA_SEL_SHIFT) | (int_sel << INT_SEL_SHIFT) | (DST_SEL_MEMORY << DST_SEL_SHIFT),
                     lo32(addr), hi32(addr), lo32(value), hi32(value), ctxid)

  def wait_reg_mem(self, addr: Val, ref: Val, mask: int = 0xFFFFFFFF, func: int = WAIT_FUNC_GEQ) -> AMDComputeQueue:
    """Stall the queue until `(*(u32*)addr & mask) <func> ref` (WAIT_REG_MEM on memory; GEQ: 5, never 3 = EQ)."""
    dw1 = func | (WAIT_MEM_SPACE_MEMORY << WAIT_MEM_SPACE_SHIFT) | (WAIT_OPERATION_WAIT << WAIT_OPERATION_SHIFT)
    return self.pkt3(WAIT_REG_MEM, dw1, lo32(addr), hi32(addr), ref, mask, WAIT_POLL_INTERVAL)

  def wait(self, signal: HCQSignal, value: Val = 0) -> AMDComputeQueue:
    """Wait until the signal's low 32 bits reach `value` (timeline values stay below 2**32)."""
    return self.wait_reg_mem(signal.addr, lo32(value))

  def signal(self, signal: HCQSignal, value: Val = 0) -> AMDComputeQueue:
    """Write the 64-bit value; when the signal has a KFD event (`signal.event`), also write the event id into the
    event's mailbox slot and raise the interrupt that wakes a thread sleeping in WAIT_EVENTS."""
    self.release_mem(signal.addr, value, DATA_SEL_64)
    if (ev := getattr(signal, "event", None)) is not None:
      self.release_mem(ev.mailbox, ev.event_id, DATA_SEL_32, INT_SEL_AFTER_WRITE_CONFIRM, ev.event_id)
    return self

  def timestamp(self, signal: HCQSignal) -> AMDComputeQueue:
    return self.release_mem(signal.addr + 8, 0, DATA_SEL_TIMESTAMP)

  def acquire_mem(self) -> AMDComputeQueue:
    """ACQUIRE_MEM over the whole address space (COHER_SIZE 2**40 - 1 units: its hi field is 8 bits wide): write
    back and invalidate the shader caches so the next dispatch sees what the host, SDMA and earlier kernels wrote."""
    return self.pkt3(ACQUIRE_MEM, 0, 0xFFFFFFFF, 0xFF, 0, 0, ACQUIRE_POLL_INTERVAL, ACQUIRE_CACHE_ACTIONS)

  def memory_barrier(self) -> AMDComputeQueue:
    """Wait for earlier dispatches (EVENT_WRITE CS_PARTIAL_FLUSH), then `acquire_mem`."""
    self.pkt3(EVENT_WRITE, CS_PARTIAL_FLUSH | (EVENT_INDEX_CS_PARTIAL_FLUSH << 8))
    return self.acquire_mem()

  def indirect_buffer(self, addr: Val, ndwords: int) -> AMDComputeQueue:
    if not 0 < ndwords < 1 << 20: raise ValueError(f"an indirect buffer of {ndwords} dwords; IB_SIZE is 20 bits")
    return self.pkt3(INDIRECT_BUFFER, lo32(addr), hi32(addr), ndwords | IB_VALID)

  RSRC3_REG = COMPUTE_PGM_RSRC3
  INITIATOR = DISPATCH_COMPUTE_SHADER_EN | DISPATCH_FORCE_START_AT_000 | DISPATCH_CS_W32_EN

  def exec(self, prg: Any, args_addr: Val, global_size: Sequence[Val], local_size: Sequence[Val]) -> AMDComputeQueue:
    """Dispatch `prg` (an `AMDProgram`: entry address, rsrc1/2/3, user SGPR layout) over `global_size` work-groups
    of `local_size` work-items, its kernarg segment at `args_addr`."""
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size) + (1, 1, 1))[:3]
    self.set_sh_reg(COMPUTE_PGM_LO, lo32(prg.entry_addr >> 8), hi32(prg.entry_addr >> 8))
    self.set_sh_reg(COMPUTE_PGM_RSRC1, prg.rsrc1, prg.rsrc2)
    self.set_sh_reg(self.RSRC3_REG, prg.rsrc3)
    if (scratch := prg.scratch()) is not None:  # (base address, TMPRING_SIZE) of the device's scratch buffer
      base, tmpring = scratch
      self.set_sh_reg(COMPUTE_DISPATCH_SCRATCH_BASE_LO, lo32(base >> 8), hi32(base >> 8))
      self.set_sh_reg(COMPUTE_TMPRING_SIZE, tmpring)
    else: self.set_sh_reg(COMPUTE_TMPRING_SIZE, 0)
    if (user := prg.user_data(args_addr)): self.set_sh_reg(COMPUTE_USER_DATA_0, *user)
    self.set_sh_reg(COMPUTE_RESOURCE_LIMITS, 0)
    self.set_sh_reg(COMPUTE_START_X, 0, 0, 0, *ls)
    return self.pkt3(DISPATCH_DIRECT, *gs, self.INITIATOR)

  def _submit(self, dev: Any, dwords: list[int]) -> None: dev.compute_ring.submit(dwords)


# ***** gfx9 (CDNA3 gfx942): Linux soc15d.h (PACKET3_*, EOP_*), gc_9_4_3_offset.h/_sh_mask.h, gfx_v9_4_3.c *****
# RELEASE_MEM dword 1 cache actions (soc15d.h EOP_*): what gfx_v9_0/gfx_v9_4_3_ring_emit_fence program
EOP_TCL1_VOL_ACTION_EN, EOP_TC_VOL_ACTION_EN, EOP_TC_WB_ACTION_EN = 1 << 12, 1 << 13, 1 << 15
EOP_TCL1_ACTION_EN, EOP_TC_ACTION_EN, EOP_TC_NC_ACTION_EN, EOP_TC_MD_ACTION_EN = 1 << 16, 1 << 17, 1 << 19, 1 << 21
RELEASE_CACHE_ACTIONS9 = EOP_TCL1_ACTION_EN | EOP_TC_ACTION_EN | EOP_TC_WB_ACTION_EN | EOP_TC_MD_ACTION_EN
# ACQUIRE_MEM dword 1 = CP_COHER_CNTL (soc15d.h PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_*): gfx_v9_0_emit_mem_sync's set
COHER_TC_WB_ACTION_ENA, COHER_TCL1_ACTION_ENA, COHER_TC_ACTION_ENA = 1 << 18, 1 << 22, 1 << 23
COHER_SH_KCACHE_ACTION_ENA, COHER_SH_ICACHE_ACTION_ENA = 1 << 27, 1 << 29
ACQUIRE_COHER_CNTL9 = COHER_SH_ICACHE_ACTION_ENA | COHER_SH_KCACHE_ACTION_ENA | COHER_TC_ACTION_ENA | \
  COHER_TCL1_ACTION_ENA | COHER_TC_WB_ACTION_ENA
# gc_9_4_3: regCOMPUTE_PGM_RSRC3 is dword 0x0e2d of GC segment 0 (base 0x2000): byte 0xB8B4 (gfx11: 0xB8A0). The
# other compute registers the driver writes have the same byte addresses as on gfx11.
COMPUTE_PGM_RSRC3_GFX9 = 0xB8B4
TMPRING_WAVESIZE_GRANULE_GFX9 = 1024  # COMPUTE_TMPRING_SIZE.WAVESIZE counts 1 KiB units on gfx9 (256 bytes on gfx11)


class AMDComputeQueue9(AMDComputeQueue):
  """The gfx9 (CDNA3, gfx942) compute queue: RELEASE_MEM's dword 1 carries the gfx9 EOP cache actions (TC/TCL1
  write back + invalidate, as amdgpu's gfx9 fence), ACQUIRE_MEM is the 6-dword gfx9 form with CP_COHER_CNTL (no
  GCR_CNTL), COMPUTE_PGM_RSRC3 (ACCUM_OFFSET, TG_SPLIT) sits at 0xB8B4, and DISPATCH_INITIATOR has no CS_W32_EN:
  gfx9 waves are wave64."""
  RSRC3_REG = COMPUTE_PGM_RSRC3_GFX9
  INITIATOR = DISPATCH_COMPUTE_SHADER_EN | DISPATCH_FORCE_START_AT_000

  def release_mem(self, addr: Val, value: Val, data_sel: int, int_sel: int = INT_SEL_NONE,
                  ctxid: Val = 0) -> AMDComputeQueue:
    return self.pkt3(RELEASE_MEM,
                     CACHE_FLUSH_AND_INV_TS_EVENT | (EVENT_INDEX_END_OF_PIPE << 8) | RELEASE_CACHE_ACTIONS9,
                     (data_sel << DATA_SEL_SHIFT) | (int_sel << INT_SEL_SHIFT) | (DST_SEL_MEMORY << DST_SEL_SHIFT),
                     lo32(addr), hi32(addr), lo32(value), hi32(value), ctxid)

  def acquire_mem(self) -> AMDComputeQueue:
    """gfx9 ACQUIRE_MEM (soc15d.h: COHER_CNTL, COHER_SIZE, COHER_SIZE_HI, COHER_BASE, COHER_BASE_HI, POLL_INTERVAL)
    over the whole address space, invalidating the instruction, scalar, L1 and L2 caches and writing L2 back."""
    return self.pkt3(ACQUIRE_MEM, ACQUIRE_COHER_CNTL9, 0xFFFFFFFF, 0xFFFFFF, 0, 0, ACQUIRE_POLL_INTERVAL)
