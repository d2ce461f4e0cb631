"""Adreno a6xx command streams: packet headers, registers, state loads, descriptors, and `QCOMComputeQueue`.

Sources of the hardware facts (Mesa, `src/freedreno/registers/adreno/`): packet headers and opcodes from
`adreno_pm4.xml` (`pm4_pkt4_hdr`/`pm4_pkt7_hdr` in `freedreno_pm4.h`: odd parity over the count and over the register
or opcode), register offsets and fields from `a6xx.xml` (dword offsets, as a type-4 packet addresses them), texture
and sampler descriptors (`A6XX_TEX_CONST`, 16 dwords; `A6XX_TEX_SAMP`, 4 dwords) and formats from `a6xx.xml` /
`adreno_common.xml`. tests/test_truth.py checks every number here against Mesa's database as shipped in tinygrad's
wheel (`tinygrad/runtime/autogen/mesa.py`), loaded as data.

A queue is a list of dwords: type-4 packets write consecutive registers, type-7 packets run a CP opcode. KGSL runs a
submitted buffer as an indirect buffer on the GPU's ring (see `kgsl.KGSLIface.submit`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tiny_uop.hcq import HCQSignal, HCQVar, HWQueue, Val, hi32, lo32, resolve

# ***** packet headers (adreno_pm4.xml, freedreno_pm4.h) *****
CP_TYPE4_PKT, CP_TYPE7_PKT = 0x40000000, 0x70000000


def odd_parity_bit(v: int) -> int:
  """The bit that makes the number of set bits in (v, bit) odd (`pm4_odd_parity_bit`)."""
  return (bin(v).count("1") + 1) & 1


def pkt4(reg: int, cnt: int) -> int:
  """Type-4 header: write `cnt` (1..127) consecutive registers from dword offset `reg` (18 bits)."""
  if not 1 <= cnt <= 0x7F: raise ValueError(f"type-4 packet of {cnt} registers; valid: 1..127")
  if not 0 <= reg <= 0x3FFFF: raise ValueError(f"register {reg:#x} outside the 18-bit register space")
  return CP_TYPE4_PKT | cnt | odd_parity_bit(cnt) << 7 | reg << 8 | odd_parity_bit(reg) << 27


def pkt7(opcode: int, cnt: int) -> int:
  """Type-7 header: CP opcode `opcode` (7 bits) with `cnt` (0..16383) payload dwords."""
  if not 0 <= cnt <= 0x3FFF: raise ValueError(f"type-7 packet of {cnt} payload dwords; valid: 0..16383")
  if not 0 <= opcode <= 0x7F: raise ValueError(f"CP opcode {opcode:#x} outside 7 bits")
  return CP_TYPE7_PKT | cnt | odd_parity_bit(cnt) << 15 | opcode << 16 | odd_parity_bit(opcode) << 23


# ***** CP opcodes (adreno_pm4.xml, enum adreno_pm4_type3_packets) *****
CP_NOP, CP_WAIT_MEM_WRITES, CP_WAIT_FOR_IDLE, CP_RUN_OPENCL, CP_EXEC_CS = 0x10, 0x12, 0x26, 0x31, 0x33
CP_LOAD_STATE6_FRAG, CP_WAIT_REG_MEM, CP_REG_TO_MEM, CP_INDIRECT_BUFFER = 0x34, 0x3C, 0x3E, 0x3F
CP_EVENT_WRITE, CP_SET_MARKER = 0x46, 0x65
OPCODE_NAMES = {CP_NOP: "CP_NOP", CP_WAIT_MEM_WRITES: "CP_WAIT_MEM_WRITES", CP_WAIT_FOR_IDLE: "CP_WAIT_FOR_IDLE",
                CP_RUN_OPENCL: "CP_RUN_OPENCL", CP_EXEC_CS: "CP_EXEC_CS", CP_LOAD_STATE6_FRAG: "CP_LOAD_STATE6_FRAG",
                CP_WAIT_REG_MEM: "CP_WAIT_REG_MEM", CP_REG_TO_MEM: "CP_REG_TO_MEM",
                CP_INDIRECT_BUFFER: "CP_INDIRECT_BUFFER", CP_EVENT_WRITE: "CP_EVENT_WRITE",
                CP_SET_MARKER: "CP_SET_MARKER"}

# vgt_event_type (CP_EVENT_WRITE_0.EVENT), CP_WAIT_REG_MEM function and poll space, CP_SET_MARKER mode
CACHE_FLUSH_TS, CACHE_INVALIDATE = 4, 49
WRITE_GE, POLL_MEMORY = 5, 1
RM6_COMPUTE = 8
CP_REG_TO_MEM_0_64B = 1 << 30

# CP_LOAD_STATE6 (a6xx_state_type, a6xx_state_src, a6xx_state_block)
ST6_SHADER, ST6_CONSTANTS, ST6_UAV = 0, 1, 3
SS6_DIRECT, SS6_INDIRECT = 0, 2
SB6_CS_TEX, SB6_CS_SHADER = 5, 13


LOAD_STATE6_MAX_UNITS = (1 << 10) - 1  # NUM_UNIT is bits 31:22 of CP_LOAD_STATE6_0


def load_state6_0(state_type: int, state_src: int, state_block: int, num_unit: int, dst_off: int = 0) -> int:
  """CP_LOAD_STATE6_0: DST_OFF 13:0, STATE_TYPE 15:14, STATE_SRC 17:16, STATE_BLOCK 21:18, NUM_UNIT 31:22."""
  if not 0 <= num_unit <= LOAD_STATE6_MAX_UNITS:
    raise ValueError(f"CP_LOAD_STATE6 of {num_unit} units; valid: 0..{LOAD_STATE6_MAX_UNITS}")
  return dst_off | state_type << 14 | state_src << 16 | state_block << 18 | num_unit << 22


# ***** registers (a6xx.xml: dword offsets) *****
REG_CP_ALWAYS_ON_COUNTER = 0x0980
REG_SP_CS_CNTL_0, REG_SP_CS_CNTL_1, REG_SP_CS_BOOLEAN_CF_MASK = 0xA9B0, 0xA9B1, 0xA9B2
REG_SP_CS_PROGRAM_COUNTER_OFFSET, REG_SP_CS_BASE, REG_SP_CS_PVT_MEM_PARAM = 0xA9B3, 0xA9B4, 0xA9B6
REG_SP_CS_PVT_MEM_BASE, REG_SP_CS_PVT_MEM_SIZE, REG_SP_CS_TSIZE, REG_SP_CS_CONFIG = 0xA9B7, 0xA9B9, 0xA9BA, 0xA9BB
REG_SP_CS_INSTR_SIZE, REG_SP_CS_PVT_MEM_STACK_OFFSET = 0xA9BC, 0xA9BD
REG_SP_CS_SAMPLER_BASE, REG_SP_CS_TEXMEMOBJ_BASE, REG_SP_CS_UAV_BASE, REG_SP_CS_USIZE = 0xA9E2, 0xA9E6, 0xA9F2, 0xAA00
REG_SP_MODE_CNTL, REG_SP_PERFCTR_SHADER_MASK = 0xAB00, 0xAE0F
REG_TPL1_CS_BORDER_COLOR_BASE, REG_TPL1_MODE_CNTL, REG_TPL1_DBG_ECO_CNTL = 0xB180, 0xB309, 0xB600
REG_SP_REG_PROG_ID_0, REG_SP_CS_CONST_CONFIG = 0xB983, 0xB987
REG_SP_CS_NDRANGE_0, REG_SP_CS_CONST_CONFIG_0, REG_SP_CS_WGE_CNTL = 0xB990, 0xB997, 0xB998
REG_SP_CS_KERNEL_GROUP_X, REG_SP_UPDATE_CNTL = 0xB999, 0xBB08

# every register a compute dispatch writes, by name (the mock rejects writes to any other)
REGISTERS: dict[int, str] = {
  REG_SP_CS_CNTL_0: "SP_CS_CNTL_0", REG_SP_CS_CNTL_1: "SP_CS_CNTL_1",
  REG_SP_CS_BOOLEAN_CF_MASK: "SP_CS_BOOLEAN_CF_MASK",
  REG_SP_CS_PROGRAM_COUNTER_OFFSET: "SP_CS_PROGRAM_COUNTER_OFFSET", REG_SP_CS_BASE: "SP_CS_BASE",
  REG_SP_CS_BASE + 1: "SP_CS_BASE+1", REG_SP_CS_PVT_MEM_PARAM: "SP_CS_PVT_MEM_PARAM",
  REG_SP_CS_PVT_MEM_BASE: "SP_CS_PVT_MEM_BASE", REG_SP_CS_PVT_MEM_BASE + 1: "SP_CS_PVT_MEM_BASE+1",
  REG_SP_CS_PVT_MEM_SIZE: "SP_CS_PVT_MEM_SIZE", REG_SP_CS_TSIZE: "SP_CS_TSIZE", REG_SP_CS_CONFIG: "SP_CS_CONFIG",
  REG_SP_CS_INSTR_SIZE: "SP_CS_INSTR_SIZE", REG_SP_CS_PVT_MEM_STACK_OFFSET: "SP_CS_PVT_MEM_STACK_OFFSET",
  REG_SP_CS_SAMPLER_BASE: "SP_CS_SAMPLER_BASE", REG_SP_CS_SAMPLER_BASE + 1: "SP_CS_SAMPLER_BASE+1",
  REG_SP_CS_TEXMEMOBJ_BASE: "SP_CS_TEXMEMOBJ_BASE", REG_SP_CS_TEXMEMOBJ_BASE + 1: "SP_CS_TEXMEMOBJ_BASE+1",
  REG_SP_CS_UAV_BASE: "SP_CS_UAV_BASE", REG_SP_CS_UAV_BASE + 1: "SP_CS_UAV_BASE+1", REG_SP_CS_USIZE: "SP_CS_USIZE",
  REG_SP_MODE_CNTL: "SP_MODE_CNTL", REG_SP_PERFCTR_SHADER_MASK: "SP_PERFCTR_SHADER_MASK",
  REG_TPL1_CS_BORDER_COLOR_BASE: "TPL1_CS_BORDER_COLOR_BASE",
  REG_TPL1_CS_BORDER_COLOR_BASE + 1: "TPL1_CS_BORDER_COLOR_BASE+1", REG_TPL1_MODE_CNTL: "TPL1_MODE_CNTL",
  REG_TPL1_DBG_ECO_CNTL: "TPL1_DBG_ECO_CNTL", REG_SP_REG_PROG_ID_0: "SP_REG_PROG_ID_0",
  REG_SP_REG_PROG_ID_0 + 1: "SP_REG_PROG_ID_1", REG_SP_REG_PROG_ID_0 + 2: "SP_REG_PROG_ID_2",
  REG_SP_REG_PROG_ID_0 + 3: "SP_REG_PROG_ID_3", REG_SP_CS_CONST_CONFIG: "SP_CS_CONST_CONFIG",
  **{REG_SP_CS_NDRANGE_0 + i: f"SP_CS_NDRANGE_{i}" for i in range(7)},
  REG_SP_CS_CONST_CONFIG_0: "SP_CS_CONST_CONFIG_0", REG_SP_CS_WGE_CNTL: "SP_CS_WGE_CNTL",
  REG_SP_CS_KERNEL_GROUP_X: "SP_CS_KERNEL_GROUP_X", REG_SP_CS_KERNEL_GROUP_X + 1: "SP_CS_KERNEL_GROUP_Y",
  REG_SP_CS_KERNEL_GROUP_X + 2: "SP_CS_KERNEL_GROUP_Z", REG_SP_UPDATE_CNTL: "SP_UPDATE_CNTL",
}

# register fields (a6xx.xml)
SP_UPDATE_CNTL_CS_STATE, SP_UPDATE_CNTL_CS_UAV = 1 << 5, 1 << 6
SP_MODE_CNTL_ISAMMODE_SHIFT, TPL1_MODE_CNTL_ISAMMODE_SHIFT, ISAMMODE_CL = 1, 0, 1
SP_PERFCTR_SHADER_MASK_CS = 1 << 5
THREAD64, THREAD128 = 0, 1
CONSTLEN_256 = 2  # SP_CS_CNTL_1.CONSTANTRAMMODE
SP_CS_CONFIG_ENABLED, SP_CS_CONFIG_NTEX_SHIFT, SP_CS_CONFIG_NSAMP_SHIFT, SP_CS_CONFIG_NUAV_SHIFT = 1 << 8, 9, 17, 22
SP_CS_CONST_CONFIG_ENABLED = 1 << 8  # CONSTLEN 7:0 holds the vec4 count >> 2 (a6xx.xml: shr="2")
REGID_NONE = 0xFC  # "no register" in register-id fields (a6xx.xml: regid r63.x)


def sp_cs_cntl_0(threadsize: int, hregs: int, fregs: int, branchstack: int) -> int:
  """SP_CS_CNTL_0: HALFREGFOOTPRINT 6:1, FULLREGFOOTPRINT 12:7, BRANCHSTACK 19:14, THREADSIZE 20."""
  if not (0 <= hregs < 64 and 0 <= fregs < 64 and 0 <= branchstack < 64):
    raise ValueError(f"register footprint (half {hregs}, full {fregs}) or branch stack {branchstack} exceeds 6 bits")
  return hregs << 1 | fregs << 7 | branchstack << 14 | threadsize << 20


def ndrange_0(local_size: Sequence[Any]) -> Any:
  """SP_CS_NDRANGE_0: KERNELDIM 1:0 (3), LOCALSIZEX/Y/Z - 1 in 11:2, 21:12, 31:22. A size may be a UOp (HCQ2 records
  a launch whose local size changes between replays): the dword is then an expression; ints are checked here."""
  x, y, z = local_size
  if not all(1 <= v <= 1024 for v in local_size if isinstance(v, int)):
    raise ValueError(f"local size {tuple(local_size)}; each 1..1024")
  return 3 | (x - 1) << 2 | (y - 1) << 12 | (z - 1) << 22


# ***** descriptors (a6xx.xml: A6XX_TEX_CONST, A6XX_TEX_SAMP; a6xx_format, a6xx_tex_type, a6xx_tex_clamp) *****
TEX_CONST_DWORDS, TEX_SAMP_DWORDS = 16, 4
FMT6_16_16_16_16_FLOAT, FMT6_32_32_32_32_FLOAT = 0x62, 0x82
FORMAT_BYTES = {FMT6_16_16_16_16_FLOAT: 8, FMT6_32_32_32_32_FLOAT: 16}  # bytes per RGBA texel
A6XX_TEX_2D = 1
TEX_X, TEX_Y, TEX_Z, TEX_W = 0, 1, 2, 3
TEX_NEAREST, TEX_CLAMP_TO_BORDER = 0, 3
TEX_SAMP_1_CUBEMAPSEAMLESSFILTOFF, TEX_SAMP_1_UNNORM_COORDS = 1 << 4, 1 << 5
PITCH_ALIGN = 64   # bytes: TEX_CONST_2.PITCHALIGN counts log2(pitch alignment) above 64 bytes
BASE_ALIGN = 32    # bytes: TEX_CONST_4.BASE_LO holds address bits 31:5


@dataclass(frozen=True)
class TexDesc:
  """A 2D RGBA texture or storage-image descriptor: `fmt` (FMT6_*), `width` x `height` texels, `pitch` bytes a row,
  at GPU address `base`."""
  fmt: int
  width: int
  height: int
  pitch: int
  base: int


def tex_const(d: TexDesc, storage: bool = False) -> list[int]:
  """The 16 dwords of A6XX_TEX_CONST for `d`: linear tiling, identity swizzle XYZW (none for a `storage` image: a
  UAV is written as it is, and the Qualcomm driver's UAV descriptors leave the swizzle zero), TYPE 2D, PITCHALIGN =
  log2 of the pitch's largest power-of-two divisor - 6, base address, depth 0 (as the Qualcomm OpenCL driver's own
  2D image descriptors leave it)."""
  if d.fmt not in FORMAT_BYTES:
    raise ValueError(f"texture format {d.fmt:#x}; supported: {list(map(hex, FORMAT_BYTES))}")
  if not (1 <= d.width <= 0x7FFF and 1 <= d.height <= 0x7FFF):
    raise ValueError(f"texture of {d.width}x{d.height} texels; width and height 1..32767")
  if d.pitch % PITCH_ALIGN or d.pitch < d.width * FORMAT_BYTES[d.fmt] or d.pitch >= 1 << 22:
    raise ValueError(f"texture pitch {d.pitch} bytes: must be a multiple of {PITCH_ALIGN}, at least width * texel "
                     f"bytes ({d.width * FORMAT_BYTES[d.fmt]}), and below 4 MiB")
  if d.base % BASE_ALIGN: raise ValueError(f"texture base {d.base:#x} is not {BASE_ALIGN}-byte aligned")
  align = (d.pitch & -d.pitch).bit_length() - 7  # log2(largest power of two dividing pitch) - 6
  swizzle = 0 if storage else TEX_X << 4 | TEX_Y << 7 | TEX_Z << 10 | TEX_W << 13
  return [swizzle | d.fmt << 22,
          d.width | d.height << 15,
          min(align, 15) | d.pitch << 7 | A6XX_TEX_2D << 29,
          0, d.base & 0xFFFFFFFF, (d.base >> 32) & 0x1FFFF] + [0] * 10


def tex_samp_nearest_unnorm_border() -> list[int]:
  """A6XX_TEX_SAMP of OpenCL's `CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST`: nearest
  min/mag filter, wrap S/T/R clamp-to-border (the border color table is all zero), unnormalized coordinates."""
  wrap = TEX_CLAMP_TO_BORDER
  return [TEX_NEAREST << 1 | TEX_NEAREST << 3 | wrap << 5 | wrap << 8 | wrap << 11,
          TEX_SAMP_1_CUBEMAPSEAMLESSFILTOFF | TEX_SAMP_1_UNNORM_COORDS, 0, 0]


# ***** the compute queue *****
class QCOMComputeQueue(HWQueue):
  """An a6xx compute queue: commands append type-4/type-7 packets; `_submit` copies the dwords into GPU memory and
  submits them with KGSL's GPU_COMMAND. `indirect_buffer` runs a command buffer in GPU memory (HCQ2's bodies).

  Caches: a dispatch's writes sit in the GPU's L2 (UCHE) until a CACHE_FLUSH_TS writes them back, and CACHE_INVALIDATE
  drops lines, so every dispatch is followed by a write-back and `memory_barrier` writes back before it invalidates
  (Mesa turnip's `tu6_emit_flushes` order: CACHE_FLUSH_TS, CACHE_INVALIDATE, CP_WAIT_MEM_WRITES, CP_WAIT_FOR_IDLE; as
  tinygrad 0.14's QCOM queue). CACHE_FLUSH_TS always writes a timestamp: to `flush_addr`, a dword of the device's that
  nobody reads (each device's queue class sets it, `QCOMDevice.hw_compute_queue_t`)."""
  flush_addr: int = 0

  def pkt7(self, opcode: int, *payload: Val) -> QCOMComputeQueue:
    self.q(pkt7(opcode, len(payload)), *payload)
    return self

  def reg(self, reg: int, *values: Val) -> QCOMComputeQueue:
    """Write `values` to consecutive registers starting at `reg` (one type-4 packet)."""
    self.q(pkt4(reg, len(values)), *values)
    return self

  def wait(self, signal: HCQSignal, value: Val = 0) -> QCOMComputeQueue:
    """CP_WAIT_REG_MEM until the signal's low 32 bits are >= `value` (timeline values stay below 2**32)."""
    return self.pkt7(CP_WAIT_REG_MEM, WRITE_GE | POLL_MEMORY << 4, lo32(signal.addr), hi32(signal.addr), lo32(value),
                     0xFFFFFFFF, 32)

  def signal(self, signal: HCQSignal, value: Val = 0) -> QCOMComputeQueue:
    """After all earlier work: CACHE_FLUSH_TS writes `value` (32 bits) to the signal once caches are flushed."""
    self.pkt7(CP_WAIT_FOR_IDLE)
    return self.pkt7(CP_EVENT_WRITE, CACHE_FLUSH_TS, lo32(signal.addr), hi32(signal.addr), lo32(value))

  def timestamp(self, signal: HCQSignal) -> QCOMComputeQueue:
    """The 64-bit always-on counter (19.2 MHz) into the signal's timestamp (CP_REG_TO_MEM, 2 registers, 64-bit)."""
    self.pkt7(CP_WAIT_FOR_IDLE)
    ts = signal.addr + 8
    return self.pkt7(CP_REG_TO_MEM, REG_CP_ALWAYS_ON_COUNTER | 2 << 18 | CP_REG_TO_MEM_0_64B, lo32(ts), hi32(ts))

  def write_back(self) -> QCOMComputeQueue:
    """CACHE_FLUSH_TS: write the dirty cache lines back to memory (its timestamp goes to `flush_addr`)."""
    if not self.flush_addr:
      raise RuntimeError("QCOMComputeQueue.flush_addr is unset: use the device's queue class (dev.hw_compute_queue_t)")
    return self.pkt7(CP_EVENT_WRITE, CACHE_FLUSH_TS, lo32(self.flush_addr), hi32(self.flush_addr), 0)

  def memory_barrier(self) -> QCOMComputeQueue:
    """Wait for earlier dispatches, write the caches back, invalidate them for what follows, then wait for the memory
    writes (Mesa's flush order, see the class docstring)."""
    self.pkt7(CP_WAIT_FOR_IDLE).write_back().pkt7(CP_EVENT_WRITE, CACHE_INVALIDATE)
    return self.pkt7(CP_WAIT_MEM_WRITES).pkt7(CP_WAIT_FOR_IDLE)

  def exec(self, prg: Any, args_addr: Val, global_size: Sequence[Val], local_size: Sequence[Val]) -> QCOMComputeQueue:
    """Dispatch `prg` (a `QCOMProgram`) over `global_size` work-groups of `local_size` work-items with its argument
    region at `args_addr` (constants, then texture, UAV and sampler descriptors: `QCOMProgram.args_layout`)."""
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size) + (1, 1, 1))[:3]
    if any(isinstance(v, int) and v < 1 for v in (*gs, *ls)):
      raise ValueError(f"launch {gs} x {ls}: sizes must be >= 1")
    lay = prg.layout
    self.pkt7(CP_SET_MARKER, RM6_COMPUTE)
    self.reg(REG_SP_UPDATE_CNTL, SP_UPDATE_CNTL_CS_STATE | SP_UPDATE_CNTL_CS_UAV).reg(REG_SP_UPDATE_CNTL, 0)
    self.reg(REG_SP_CS_TSIZE, 0x80).reg(REG_SP_CS_USIZE, 0x40)  # as the Qualcomm driver sets them (traces)
    self.reg(REG_SP_MODE_CNTL, ISAMMODE_CL << SP_MODE_CNTL_ISAMMODE_SHIFT)
    self.reg(REG_SP_PERFCTR_SHADER_MASK, SP_PERFCTR_SHADER_MASK_CS)
    self.reg(REG_TPL1_MODE_CNTL, ISAMMODE_CL << TPL1_MODE_CNTL_ISAMMODE_SHIFT).reg(REG_TPL1_DBG_ECO_CNTL, 0)
    self.pkt7(CP_WAIT_FOR_IDLE)
    gsize = [Derived(lambda g, l: g * l, g, l) for g, l in zip(gs, ls)]
    nd0 = Derived(lambda x, y, z: ndrange_0((x, y, z)), *ls)
    # NDRANGE_0..6, then CONST_CONFIG_0 (work-group id/size/offset const ids, local id register) and WGE_CNTL as the
    # Qualcomm OpenCL driver programs them for its kernels (traces), then the work-group counts
    self.reg(REG_SP_CS_NDRANGE_0, nd0, gsize[0], 0, gsize[1], 0, gsize[2], 0, 0x00CCC0CF,
             REGID_NONE | THREAD64 << 9, *gs)
    self.reg(REG_SP_CS_CNTL_0, sp_cs_cntl_0(THREAD64, prg.hregs, prg.fregs, prg.branchstack),
             CONSTLEN_256 << 5 | prg.shared_units, 0, prg.pc_offset, lo32(prg.shader_addr), hi32(prg.shader_addr),
             prg.pvtmem_per_item, lo32(prg.dev.stack_addr), hi32(prg.dev.stack_addr), prg.pvtmem_total)
    self.pkt7(CP_LOAD_STATE6_FRAG, load_state6_0(ST6_CONSTANTS, SS6_INDIRECT, SB6_CS_SHADER, lay.const_units),
              lo32(args_addr), hi32(args_addr))
    # a preload: NUM_UNIT has 10 bits, so a bigger shader preloads its first 1023 units and the SP fetches the rest
    # from SP_CS_BASE (SP_CS_INSTR_SIZE units), as Mesa's freedreno preloads only a prefix of big shaders
    preload = min(prg.instr_units, LOAD_STATE6_MAX_UNITS)
    self.pkt7(CP_LOAD_STATE6_FRAG, load_state6_0(ST6_SHADER, SS6_INDIRECT, SB6_CS_SHADER, preload),
              lo32(prg.shader_addr), hi32(prg.shader_addr))
    self.reg(REG_SP_REG_PROG_ID_0, 0xFCFCFCFC, 0xFCFCFCFC, 0xFCFCFCFC, REGID_NONE,
             (lay.const_units >> 2) | SP_CS_CONST_CONFIG_ENABLED)
    self.reg(REG_SP_CS_PVT_MEM_STACK_OFFSET, prg.stack_offset).reg(REG_SP_CS_INSTR_SIZE, prg.instr_units)
    for cnt, off, st, sb, reg in ((lay.n_samp, lay.samp_off, ST6_SHADER, SB6_CS_TEX, REG_SP_CS_SAMPLER_BASE),
                                  (lay.n_tex, lay.tex_off, ST6_CONSTANTS, SB6_CS_TEX, REG_SP_CS_TEXMEMOBJ_BASE),
                                  (lay.n_uav, lay.uav_off, ST6_UAV, SB6_CS_SHADER, REG_SP_CS_UAV_BASE)):
      if not cnt: continue
      a = _add(args_addr, off)
      self.pkt7(CP_LOAD_STATE6_FRAG, load_state6_0(st, SS6_INDIRECT, sb, cnt), lo32(a), hi32(a))
      self.reg(reg, lo32(a), hi32(a))
      if reg == REG_SP_CS_SAMPLER_BASE:
        self.reg(REG_TPL1_CS_BORDER_COLOR_BASE, lo32(prg.dev.border_addr), hi32(prg.dev.border_addr))
    self.reg(REG_SP_CS_CONFIG, SP_CS_CONFIG_ENABLED | lay.n_tex << SP_CS_CONFIG_NTEX_SHIFT |
             lay.n_samp << SP_CS_CONFIG_NSAMP_SHIFT | lay.n_uav << SP_CS_CONFIG_NUAV_SHIFT)
    return self.pkt7(CP_RUN_OPENCL, 0).write_back()  # the results leave the cache (as tinygrad after each exec)

  def indirect_buffer(self, addr: Val, ndwords: Val) -> QCOMComputeQueue:
    """CP_INDIRECT_BUFFER: run the `ndwords` dwords at `addr` (IB_BASE lo, hi; IB_SIZE in dwords, 20 bits), then
    continue here. KGSL runs a submission as IB1, so the buffer it jumps to is an IB2 (a6xx has no IB3)."""
    if isinstance(ndwords, int) and not 0 <= ndwords < 1 << 20:
      raise ValueError(f"CP_INDIRECT_BUFFER of {ndwords} dwords; valid: 0..{(1 << 20) - 1}")
    return self.pkt7(CP_INDIRECT_BUFFER, lo32(addr), hi32(addr), ndwords)

  def _submit(self, dev: Any, dwords: list[int]) -> None: dev.submit_dwords(dwords)


def _add(a: Val, off: int) -> Val: return a + off


class Derived(HCQVar):
  """A command dword computed from several values (ints or HCQVars) when the queue is resolved: a symbolic launch's
  global size in work-items is (work-groups x local size), SP_CS_NDRANGE_0 packs the three local sizes. Without
  HCQVars it is computed now (`Derived(...)` then returns an int, or a UOp expression when HCQ2 records UOps)."""

  def __new__(cls, fn: Any, *args: Any) -> Any:
    if not any(isinstance(a, HCQVar) for a in args): return fn(*args)
    return super().__new__(cls)

  def __init__(self, fn: Any, *args: Val):
    super().__init__("(" + ",".join(a.name if isinstance(a, HCQVar) else str(a) for a in args) + ")")
    self.combine, self.args = fn, args

  def resolve(self, var_vals: dict[str, int]) -> int: return self.combine(*(resolve(a, var_vals) for a in self.args))
