"""Pushbuffer methods, GPFIFO entries and the QMD: what the NV device writes for the GPU's host, compute and copy
engines, and `NVComputeQueue`/`NVCopyQueue` (HWQueues recording methods).

Sources (NVIDIA open-gpu-doc / open-gpu-kernel-modules `class/`): the GPFIFO host classes `clc56f.h`
(AMPERE_CHANNEL_GPFIFO_A) and `clc86f.h` (HOPPER_CHANNEL_GPFIFO_A): `NVC56F_DMA_*` method headers, `NVC56F_GP_ENTRY*`,
`NVC56F_SEM_*`, `NVC56F_WFI`; the compute classes `clc6c0.h` (AMPERE_COMPUTE_A; `clc7c0.h`, `clc9c0.h`, `clcbc0.h`
use the same offsets for the methods here); the copy classes `clc6b5.h` (AMPERE_DMA_COPY_A; `clc7b5.h`, `clc8b5.h`
likewise); the QMD: version 03_00 (`clc6c0qmd.h`, `NVC6C0_QMDV03_00_*`) for the Ampere and Ada compute classes, version
04_00 (open-gpu-doc `classes/compute/clcbc0qmd.h`, `NVCBC0_QMDV04_00_*`, 3072 bits) for HOPPER_COMPUTE_A, as Mesa's
NVK launches Hopper grids (`QMD_VERSIONS`). clcbc0qmd.h also lists a 03_00 layout, but no driver known to work on
Hopper launches it there (tinygrad 0.14 does not drive Hopper's compute class at all), so this driver does not either.
`tests/test_nv_oracle.py` checks every offset, field and value of 03_00 against tinygrad 0.14.0's `nv_580.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self, Sequence

from tiny_uop.hcq import HCQSignal, HCQVar, HWQueue, Val, hi32, lo32

# ***** method headers and GPFIFO entries (clc56f.h) *****

SEC_OP_INC_METHOD = 1                 # NVC56F_DMA_SEC_OP (31:29): incrementing method, `count` data dwords follow
MAX_METHOD_COUNT = (1 << 13) - 1      # NVC56F_DMA_METHOD_COUNT (28:16)
SUBCH_COMPUTE, SUBCH_COPY = 1, 4      # subchannels the objects are bound to (SET_OBJECT), RM's own convention


def method(subch: int, mthd: int, count: int) -> int:
  """An incrementing-method header: `count` dwords for methods `mthd`, `mthd + 4`, ... on subchannel `subch`."""
  if not 0 <= subch <= 7 or mthd % 4 or not 0 <= mthd < 0x4000 or not 1 <= count <= MAX_METHOD_COUNT:
    raise ValueError(f"method {mthd:#x} x{count} on subchannel {subch}: needs subchannel 0..7, a 4-byte aligned "
                     f"method below 0x4000 and 1..{MAX_METHOD_COUNT} dwords")
  return (SEC_OP_INC_METHOD << 29) | (count << 16) | (subch << 13) | (mthd >> 2)


def decode_method(h: int) -> tuple[int, int, int, int]:
  """(sec_op, subchannel, method byte offset, count) of a method header dword."""
  return h >> 29, (h >> 13) & 7, (h & 0xFFF) << 2, (h >> 16) & 0x1FFF


GP_ENTRY_LEVEL_SUBROUTINE = 1         # NVC56F_GP_ENTRY1_LEVEL (9:9)
MAX_GP_LENGTH = (1 << 21) - 1         # NVC56F_GP_ENTRY1_LENGTH (30:10), in dwords


def gp_entry(addr: int, ndwords: int) -> int:
  """The 64-bit GPFIFO entry that runs `ndwords` method dwords at `addr`: GET (31:2) and GET_HI (7:0 of the second
  word: address bits 39:32), LEVEL, LENGTH."""
  if addr % 4 or addr >> 40: raise ValueError(f"pushbuffer at {addr:#x}: must be 4-byte aligned and below 2**40")
  if not 1 <= ndwords <= MAX_GP_LENGTH: raise ValueError(f"pushbuffer of {ndwords} dwords; valid 1..{MAX_GP_LENGTH}")
  return (addr & 0xFFFFFFFC) | ((addr >> 32) << 32) | (GP_ENTRY_LEVEL_SUBROUTINE << 41) | (ndwords << 42)


# ***** host methods (clc56f.h / clc86f.h) *****

SET_OBJECT, NON_STALL_INTERRUPT, SEM_ADDR_LO, SEM_PAYLOAD_LO, SEM_EXECUTE, WFI = 0x00, 0x20, 0x5C, 0x64, 0x6C, 0x78
SEM_OP_RELEASE, SEM_OP_ACQ_CIRC_GEQ = 1, 3            # SEM_EXECUTE_OPERATION (2:0)
SEM_RELEASE_WFI_SHIFT, SEM_PAYLOAD_SIZE_SHIFT, SEM_RELEASE_TIMESTAMP_SHIFT = 20, 24, 25
SEM_PAYLOAD_SIZE_64BIT = 1

# ***** compute methods (clc6c0.h) *****

SET_SHADER_SHARED_MEMORY_WINDOW_A, SEND_PCAS_A, SEND_SIGNALING_PCAS2_B = 0x2A0, 0x2B4, 0x2C0
SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, SET_SHADER_LOCAL_MEMORY_A = 0x2E4, 0x790
SET_SHADER_LOCAL_MEMORY_WINDOW_A = 0x7B0
INVALIDATE_SHADER_CACHES_NO_WFI = 0x1698
INVALIDATE_INSTRUCTION, INVALIDATE_GLOBAL_DATA, INVALIDATE_CONSTANT = 1 << 0, 1 << 4, 1 << 12
PCAS_ACTION_INVALIDATE_COPY_SCHEDULE = 3              # SEND_SIGNALING_PCAS2_B_PCAS_ACTION (3:0)

# ***** copy-engine methods (clc6b5.h) *****

SET_SEMAPHORE_A, LAUNCH_DMA, OFFSET_IN_UPPER, LINE_LENGTH_IN = 0x240, 0x300, 0x400, 0x418
DMA_TRANSFER_NON_PIPELINED = 2        # LAUNCH_DMA_DATA_TRANSFER_TYPE (1:0)
DMA_FLUSH_ENABLE_SHIFT = 2            # LAUNCH_DMA_FLUSH_ENABLE (2:2)
DMA_SEMAPHORE_TYPE_SHIFT, DMA_SEMAPHORE_RELEASE_FOUR_WORD = 3, 2   # LAUNCH_DMA_SEMAPHORE_TYPE (4:3)
DMA_SRC_LAYOUT_SHIFT, DMA_DST_LAYOUT_SHIFT, DMA_LAYOUT_PITCH = 7, 8, 1
MAX_COPY = 1 << 31                    # bytes per LAUNCH_DMA (LINE_LENGTH_IN is 32 bits; halves keep it signed-safe)

# ***** QMD version 03_00 (clc6c0qmd.h, clcbc0qmd.h): field -> (high bit, low bit) *****

QMD_SIZE = 256  # bytes (2048 bits)
QMD_V03_00: dict[str, tuple[int, int]] = {
  "QMD_GROUP_ID": (133, 128), "SM_GLOBAL_CACHING_ENABLE": (134, 134),
  "INVALIDATE_TEXTURE_HEADER_CACHE": (186, 186), "INVALIDATE_TEXTURE_SAMPLER_CACHE": (187, 187),
  "INVALIDATE_TEXTURE_DATA_CACHE": (188, 188), "INVALIDATE_SHADER_DATA_CACHE": (189, 189),
  "INVALIDATE_INSTRUCTION_CACHE": (190, 190), "INVALIDATE_SHADER_CONSTANT_CACHE": (191, 191),
  "CWD_MEMBAR_TYPE": (369, 368), "API_VISIBLE_CALL_LIMIT": (378, 378), "SAMPLER_INDEX": (382, 382),
  "CTA_RASTER_WIDTH": (415, 384), "CTA_RASTER_HEIGHT": (431, 416), "CTA_RASTER_DEPTH": (463, 448),
  "SHARED_MEMORY_SIZE": (561, 544), "MIN_SM_CONFIG_SHARED_MEM_SIZE": (567, 562),
  "MAX_SM_CONFIG_SHARED_MEM_SIZE": (574, 569), "QMD_VERSION": (579, 576), "QMD_MAJOR_VERSION": (583, 580),
  "CTA_THREAD_DIMENSION0": (607, 592), "CTA_THREAD_DIMENSION1": (623, 608), "CTA_THREAD_DIMENSION2": (639, 624),
  "CONSTANT_BUFFER_VALID_0": (640, 640), "REGISTER_COUNT_V": (656, 648),
  "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (662, 657), "SHADER_LOCAL_MEMORY_LOW_SIZE": (759, 736),
  "BARRIER_COUNT": (767, 763),
  "CONSTANT_BUFFER_ADDR_LOWER_0": (1055, 1024), "CONSTANT_BUFFER_ADDR_UPPER_0": (1072, 1056),
  "CONSTANT_BUFFER_INVALIDATE_0": (1074, 1074), "CONSTANT_BUFFER_SIZE_SHIFTED4_0": (1087, 1075),
  "PROGRAM_ADDRESS_LOWER": (1567, 1536), "PROGRAM_ADDRESS_UPPER": (1584, 1568),
  "SHADER_LOCAL_MEMORY_HIGH_SIZE": (1623, 1600), "SASS_VERSION": (1663, 1656),
  # not set by this driver; tinygrad 0.14's driver sets them (program prefetch, chained QMDs, release semaphores)
  "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": (287, 256), "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1640, 1632),
  "PROGRAM_PREFETCH_SIZE": (1649, 1641),
  "DEPENDENT_QMD0_POINTER": (511, 480), "DEPENDENT_QMD0_ENABLE": (512, 512), "DEPENDENT_QMD0_ACTION": (515, 513),
  "DEPENDENT_QMD0_PREFETCH": (516, 516),
  "RELEASE0_ADDRESS_LOWER": (799, 768), "RELEASE0_ADDRESS_UPPER": (807, 800), "RELEASE0_ENABLE": (823, 823),
  "RELEASE0_STRUCTURE_SIZE": (831, 830), "RELEASE0_PAYLOAD_LOWER": (863, 832), "RELEASE0_PAYLOAD_UPPER": (895, 864),
  "RELEASE1_ADDRESS_LOWER": (927, 896), "RELEASE1_ADDRESS_UPPER": (935, 928), "RELEASE1_ENABLE": (951, 951),
  "RELEASE1_STRUCTURE_SIZE": (959, 958), "RELEASE1_PAYLOAD_LOWER": (991, 960), "RELEASE1_PAYLOAD_UPPER": (1023, 992),
}
DEPENDENT_QMD_ACTION_SCHEDULE = 1     # clc6c0qmd.h QMDV03_00_DEPENDENT_QMD0_ACTION_QMD_SCHEDULE
# QMDV03_00_RELEASE0_STRUCTURE_SIZE_SEMAPHORE_*: 64-bit payload + timestamp, 32-bit payload, 64-bit payload
RELEASE_STRUCTURE_FOUR_WORDS, RELEASE_STRUCTURE_ONE_WORD, RELEASE_STRUCTURE_TWO_WORDS = 0, 1, 2
# ***** QMD version 04_00 (open-gpu-doc classes/compute/clcbc0qmd.h, NVCBC0_QMDV04_00_*): the fields used here *****

QMD_V04_00: dict[str, tuple[int, int]] = {
  "QMD_GROUP_ID": (21, 16), "QMD_TYPE": (25, 23),
  "CONSTANT_BUFFER_VALID_0": (416, 416), "CONSTANT_BUFFER_INVALIDATE_0": (419, 419),
  "SHADER_LOCAL_MEMORY_LOW_SIZE": (535, 512), "SASS_VERSION": (543, 536), "SHADER_LOCAL_MEMORY_HIGH_SIZE": (567, 544),
  "API_VISIBLE_CALL_LIMIT": (568, 568), "SAMPLER_INDEX": (569, 569), "QMD_MINOR_VERSION": (579, 576),
  "QMD_MAJOR_VERSION": (583, 580), "SHARED_MEMORY_SIZE": (601, 584),
  "INVALIDATE_TEXTURE_HEADER_CACHE": (602, 602), "INVALIDATE_TEXTURE_SAMPLER_CACHE": (603, 603),
  "INVALIDATE_TEXTURE_DATA_CACHE": (604, 604), "INVALIDATE_SHADER_DATA_CACHE": (605, 605),
  "INVALIDATE_INSTRUCTION_CACHE": (606, 606), "INVALIDATE_SHADER_CONSTANT_CACHE": (607, 607),
  "MIN_SM_CONFIG_SHARED_MEM_SIZE": (613, 608), "MAX_SM_CONFIG_SHARED_MEM_SIZE": (619, 614),
  "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (625, 620),
  "GRID_WIDTH": (1055, 1024), "GRID_HEIGHT": (1071, 1056), "GRID_DEPTH": (1103, 1088), "CWD_MEMBAR_TYPE": (1137, 1136),
  "CTA_THREAD_DIMENSION0": (1167, 1152), "CTA_THREAD_DIMENSION1": (1183, 1168), "CTA_THREAD_DIMENSION2": (1199, 1184),
  "REGISTER_COUNT": (1208, 1200), "BARRIER_COUNT": (1215, 1211),
  "PROGRAM_ADDRESS_LOWER": (1247, 1216), "PROGRAM_ADDRESS_UPPER": (1272, 1248),
  "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_0": (1567, 1536), "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_0": (1586, 1568),
  "CONSTANT_BUFFER_SIZE_SHIFTED4_0": (1599, 1587),
}
QMD_TYPE_GRID_CTA = 2                 # NVCBC0_QMDV04_00_QMD_TYPE_GRID_CTA (a plain grid of CTAs, no clusters)
QMD_MAJOR, QMD_MINOR = 3, 0           # the 03_00 template's version (QMD() without a version)
CWD_MEMBAR_TYPE_L1_SYSMEMBAR = 1      # QMDV03_00/QMDV04_00_CWD_MEMBAR_TYPE_L1_SYSMEMBAR
API_VISIBLE_CALL_LIMIT_NO_CHECK = 1
SAMPLER_INDEX_VIA_HEADER_INDEX = 1


@dataclass(frozen=True)
class QMDVersion:
  """One QMD version: its field layout, size, and the names of the fields whose name or meaning differs between
  versions (the grid size, the register count, the minor version, constant bank 0's address and its shift)."""
  major: int
  layout: dict[str, tuple[int, int]]
  size: int                           # bytes
  grid: tuple[str, str, str]
  registers: str
  minor: str
  cb0_lower: str
  cb0_upper: str
  cb0_shift: int                      # the address fields hold address >> cb0_shift


QMD_03_00 = QMDVersion(3, QMD_V03_00, QMD_SIZE, ("CTA_RASTER_WIDTH", "CTA_RASTER_HEIGHT", "CTA_RASTER_DEPTH"),
                       "REGISTER_COUNT_V", "QMD_VERSION", "CONSTANT_BUFFER_ADDR_LOWER_0",
                       "CONSTANT_BUFFER_ADDR_UPPER_0", 0)
QMD_04_00 = QMDVersion(4, QMD_V04_00, 384, ("GRID_WIDTH", "GRID_HEIGHT", "GRID_DEPTH"), "REGISTER_COUNT",
                       "QMD_MINOR_VERSION", "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_0",
                       "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_0", 6)
QMD_VERSIONS = {3: QMD_03_00, 4: QMD_04_00}
QMD_MAJOR_BITS = (583, 580)           # QMD_MAJOR_VERSION sits here in both versions: a reader learns which it has
QMD_MAX_SIZE = max(v.size for v in QMD_VERSIONS.values())
# the QMD version each compute class reads (clc6c0qmd.h / clc7c0 / clc9c0qmd.h: 03_00; clcbc0qmd.h: Hopper, 04_00)
QMD_OF_CLASS = {0xC6C0: QMD_03_00, 0xC7C0: QMD_03_00, 0xC9C0: QMD_03_00, 0xCBC0: QMD_04_00}


def qmd_of_class(cls: int) -> QMDVersion:
  """The QMD version compute class `cls` reads; ValueError for a class this driver has no QMD for."""
  if cls not in QMD_OF_CLASS:
    raise ValueError(f"compute class {cls:#x} has no known QMD version; known: "
                     f"{', '.join(f'{c:#x}: {v.major}.0' for c, v in QMD_OF_CLASS.items())}")
  return QMD_OF_CLASS[cls]


class QMD:
  """A QMD under construction (`version`: 03_00 by default): `q["FIELD"] = v` checks that v fits the field's bits;
  `bytes()` the result."""

  def __init__(self, data: bytes | None = None, version: QMDVersion = QMD_03_00):
    self.version = version
    self.bits = int.from_bytes(data, "little") if data is not None else 0

  def _field(self, name: str) -> tuple[int, int]:
    if name not in self.version.layout:
      raise KeyError(f"QMD {self.version.major}.0 has no field {name}")
    return self.version.layout[name]

  def __setitem__(self, name: str, value: int) -> None:
    hi, lo = self._field(name)
    if not 0 <= value < 1 << (hi - lo + 1):
      raise ValueError(f"QMD field {name} ({hi}:{lo}) can't hold {value:#x}: valid 0..{(1 << (hi - lo + 1)) - 1:#x}")
    self.bits = (self.bits & ~(((1 << (hi - lo + 1)) - 1) << lo)) | (value << lo)

  def __getitem__(self, name: str) -> int:
    hi, lo = self._field(name)
    return (self.bits >> lo) & ((1 << (hi - lo + 1)) - 1)

  def __bytes__(self) -> bytes: return self.bits.to_bytes(self.version.size, "little")

  def set_cb0(self, addr: int) -> None:
    """Constant bank 0's address, in the version's fields (04_00 stores address >> 6: 64-byte aligned)."""
    v = self.version
    if addr % (1 << v.cb0_shift): raise ValueError(f"constant bank 0 at {addr:#x} is not {1 << v.cb0_shift}-aligned")
    self[v.cb0_lower], self[v.cb0_upper] = (addr >> v.cb0_shift) & 0xFFFFFFFF, addr >> v.cb0_shift >> 32

  def cb0(self) -> int:
    v = self.version
    return (self[v.cb0_lower] | self[v.cb0_upper] << 32) << v.cb0_shift


# ***** queues *****

class NVQueue(HWQueue):
  """Methods recorded as dwords; `_submit` copies them into the device's command memory and appends a GPFIFO entry
  (the device's `submit_gpfifo`)."""
  subch = 0

  def m(self, mthd: int, *data: Val, subch: int | None = None) -> Self:
    """Method `mthd` with `data` (consecutive methods)."""
    self.q(method(self.subch if subch is None else subch, mthd, len(data)), *data)
    return self

  def _sem(self, addr: Val, value: Val, execute: int) -> Self:
    return self.m(SEM_ADDR_LO, lo32(addr), hi32(addr), lo32(value), hi32(value), execute, subch=0)

  def wait(self, signal: HCQSignal, value: Val = 0) -> Self:
    """Stall the channel until the signal's 64-bit value >= `value` (ACQ_CIRC_GEQ, 64-bit payload)."""
    return self._sem(signal.addr, value, SEM_OP_ACQ_CIRC_GEQ | (SEM_PAYLOAD_SIZE_64BIT << SEM_PAYLOAD_SIZE_SHIFT))

  def release(self, addr: Val, value: Val, timestamp: bool = False) -> Self:
    """After all earlier work (RELEASE_WFI), write the 64-bit `value` to `addr` (and the GPU time to `addr + 8`)."""
    return self._sem(addr, value, SEM_OP_RELEASE | (1 << SEM_RELEASE_WFI_SHIFT) | (int(timestamp) <<
                     SEM_RELEASE_TIMESTAMP_SHIFT) | (SEM_PAYLOAD_SIZE_64BIT << SEM_PAYLOAD_SIZE_SHIFT))

  def signal(self, signal: HCQSignal, value: Val = 0) -> Self:
    return self.release(signal.addr, value, timestamp=True)

  def timestamp(self, signal: HCQSignal) -> Self:
    """The GPU time into the signal's timestamp (a release of value 0: use a signal kept for timing)."""
    return self.release(signal.addr, 0, timestamp=True)

  def memory_barrier(self) -> Self:
    """Wait for the channel's engines to go idle (host WFI), so later work sees earlier writes."""
    return self.m(WFI, 0, subch=0)

  def bind_object(self, cls: int) -> Self:
    """SET_OBJECT: bind the channel's object of class `cls` to this queue's subchannel."""
    return self.m(SET_OBJECT, cls)

  def _submit(self, dev: Any, dwords: list[int]) -> None:
    """The dwords as one GPFIFO entry, published with one doorbell."""
    dev.submit_gpfifo(self, dev.push_dwords(dwords))


class NVComputeQueue(NVQueue):
  """The compute channel: semaphores, barriers and QMD launches (SEND_PCAS_A + SEND_SIGNALING_PCAS2_B)."""
  subch = SUBCH_COMPUTE

  def memory_barrier(self) -> NVComputeQueue:
    """WFI, then invalidate the SM's instruction, global-data and constant caches."""
    super().memory_barrier()
    self.m(INVALIDATE_SHADER_CACHES_NO_WFI, INVALIDATE_INSTRUCTION | INVALIDATE_GLOBAL_DATA | INVALIDATE_CONSTANT)
    return self

  def setup(self, shared_window: int, local_window: int) -> NVComputeQueue:
    """Windows of the generic address space that mean shared and local memory (addresses >> 0: A = upper bits)."""
    self.m(SET_SHADER_SHARED_MEMORY_WINDOW_A, hi32(shared_window), lo32(shared_window))
    return self.m(SET_SHADER_LOCAL_MEMORY_WINDOW_A, hi32(local_window), lo32(local_window))

  def set_local_memory(self, addr: int, bytes_per_tpc: int, max_sm: int) -> NVComputeQueue:
    """The local-memory (stack) buffer: its address, bytes per TPC and the SMs it serves."""
    self.m(SET_SHADER_LOCAL_MEMORY_A, hi32(addr), lo32(addr))
    return self.m(SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, hi32(bytes_per_tpc), lo32(bytes_per_tpc),
                  max_sm)

  def launch(self, qmd_addr: Val) -> NVComputeQueue:
    """Schedule the QMD at `qmd_addr` (256-byte aligned, below 2**40)."""
    a = qmd_addr._derive(">>8", lambda v: v >> 8) if isinstance(qmd_addr, HCQVar) else qmd_addr >> 8
    if isinstance(qmd_addr, int) and qmd_addr % 256: raise ValueError(f"QMD at {qmd_addr:#x} is not 256-byte aligned")
    self.m(SEND_PCAS_A, a)
    return self.m(SEND_SIGNALING_PCAS2_B, PCAS_ACTION_INVALIDATE_COPY_SCHEDULE)

  def exec(self, prg: Any, args_addr: Val, global_size: Sequence[Val], local_size: Sequence[Val]) -> NVComputeQueue:
    """Launch `prg` (an NVProgram) whose argument region (constant bank 0, then its QMD) is at `args_addr`; the launch
    sizes are written into that QMD by `prg.fill_launch` (eager calls) or patched by HCQ2."""
    return self.launch(prg.qmd_addr(args_addr))


class NVCopyQueue(NVQueue):
  """The copy-engine channel: linear copies and four-word semaphore releases (payload, 0, 64-bit timestamp)."""
  subch = SUBCH_COPY

  def copy(self, dest: Val, src: Val, size: int) -> NVCopyQueue:
    """Copy `size` bytes, one non-pipelined (ordered) pitch-linear LAUNCH_DMA per 2**31 bytes."""
    if size <= 0: raise ValueError(f"copy of {size} bytes")
    for off in range(0, size, MAX_COPY):
      s, d = (src + off, dest + off) if off else (src, dest)
      self.m(OFFSET_IN_UPPER, hi32(s), lo32(s), hi32(d), lo32(d))
      self.m(LINE_LENGTH_IN, min(MAX_COPY, size - off))
      self.m(LAUNCH_DMA, DMA_TRANSFER_NON_PIPELINED | (DMA_LAYOUT_PITCH << DMA_SRC_LAYOUT_SHIFT) |
             (DMA_LAYOUT_PITCH << DMA_DST_LAYOUT_SHIFT))
    return self

  def signal(self, signal: HCQSignal, value: Val = 0) -> NVCopyQueue:
    """After earlier copies, release a four-word semaphore: the low 32 bits of `value` (timeline values stay below
    2**32), a zero word, then the GPU time, which is HCQSignal's layout (value, timestamp)."""
    self.m(SET_SEMAPHORE_A, hi32(signal.addr), lo32(signal.addr), lo32(value))
    return self.m(LAUNCH_DMA, (1 << DMA_FLUSH_ENABLE_SHIFT) |
                  (DMA_SEMAPHORE_RELEASE_FOUR_WORD << DMA_SEMAPHORE_TYPE_SHIFT))

  def timestamp(self, signal: HCQSignal) -> NVCopyQueue: return self.signal(signal, 0)


@dataclass(frozen=True)
class Windows:
  """Generic-address windows for shared and local memory (must not overlap any allocation; 4 GiB aligned: Mesa NVK
  notes Hopper needs the shared window 4 GiB aligned)."""
  shared: int = 0xFE_0000_0000
  local: int = 0xFF_0000_0000
