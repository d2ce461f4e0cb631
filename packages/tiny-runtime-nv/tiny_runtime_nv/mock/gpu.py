"""The mock NVIDIA GPU behind `mock/rm.py`: host (PBDMA), compute and copy engines for each GPFIFO channel.

`MockGPU.process()` runs every scheduled channel from its GP_GET to the GP_PUT in its USERD: each GPFIFO entry is
decoded (address bits 39:2, LENGTH, LEVEL; OPCODE and FETCH must be 0), its method dwords are fetched from GPU memory
and executed in order. Host methods (any subchannel, below 0x100): SET_OBJECT (binds a subchannel to one of the
channel's engine objects), SEM_ADDR_LO/HI, SEM_PAYLOAD_LO/HI, SEM_EXECUTE (RELEASE with optional timestamp,
ACQ_CIRC_GEQ; 32- or 64-bit payloads), WFI, NON_STALL_INTERRUPT. Compute methods: the shared/local windows, the
local-memory buffer, INVALIDATE_SHADER_CACHES_NO_WFI, SEND_PCAS_A + SEND_SIGNALING_PCAS2_B (launch a QMD). Copy
methods: OFFSET_IN/OUT, LINE_LENGTH_IN, SET_SEMAPHORE_A/B/PAYLOAD, LAUNCH_DMA (pitch-linear 1D copies and one- or
four-word semaphore releases). A wait that isn't satisfied parks the channel until the next `process`.

What hardware rejects is rejected: unknown methods (named with the bound class), method opcodes other than
incrementing methods, bits set outside a method's fields, unaligned or unmapped semaphores and pushbuffers, QMDs of
another version than the bound compute class reads (03_00 on Ampere/Ada, 04_00 on HOPPER_COMPUTE_A), bits set
outside the QMD fields the mock implements, launch sizes, register, shared- or local-memory needs beyond what the
QMD grants or the GPU has. A rejection or a kernel's memory fault is reported the way the driver sees channel
errors: the channel's error notifier (NvNotification: info32 = the Xid, 13 for an engine
exception, 31 for an MMU fault; status nonzero) is written and `MockRM.last_fault` keeps the text. A rejected method
drops the rest of its GPFIFO entry; a kernel that faults is cut short and the methods after it still run (a real
channel would need recovery after either; the mock keeps going so the device survives and reports).

A QMD launch decodes every field the driver sets (`MockGPU.last_qmd`), finds the cubin image whose `.text.<kernel>`
is at PROGRAM_ADDRESS in GPU memory (and checks those bytes are the cubin's), refuses a cubin for another SM (read
by the mock itself, by ELF ABI version: `cubin_sm`), checks the QMD against the cubin's facts
(`cubin.load_kernel_info`: registers, shared and local memory, the parameters' place in constant bank 0), and runs the
kernel's PTX (the cubin's `.tiny.ptx` section) on the PTX executor with the parameters read from constant bank 0 in
GPU memory.
"""
from __future__ import annotations

import ctypes
import re
import struct
import time
import uuid as _uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from tiny_runtime_nv import push, rm
from tiny_runtime_nv.cubin import CubinError, KernelInfo, load_kernel_info
from tiny_runtime_nv.elf import EHDR, ELF
from tiny_runtime_nv.mock.compiler import ptx_of
from tiny_runtime_nv.ptx import GPUFault, Kernel, load_kernel

XID_GR_EXCEPTION, XID_MMU_FAULT = 13, 31
READS_LAUNCH_SIZE = re.compile(r"%n(?:tid|ctaid)\b")  # PTX that reads the block or grid size
WINDOW_SIZE = 1 << 32   # the mock treats the shared and local windows as 4 GiB each
QMD_KNOWN_BITS = {v.major: sum(((1 << (hi - lo + 1)) - 1) << lo for hi, lo in v.layout.values())
                  for v in push.QMD_VERSIONS.values()}
# The cubin's SM, read by the mock on its own (not through the driver's `cubin.cubin_arch`, so a driver that misreads
# it is caught here): e_ident[EI_ABIVERSION] (byte 8) picks where e_flags (ELF64: bytes 0x30..0x33) keeps it. LLVM's
# llvm/include/llvm/BinaryFormat/ELF.h: ELFABIVERSION_CUDA_V1 = 7 with EF_CUDA_SM = 0xff (bits 7:0; ptxas <= CUDA 12),
# ELFABIVERSION_CUDA_V2 = 8 with EF_CUDA_SM_MASK = 0xff00, EF_CUDA_SM_OFFSET = 8 (bits 15:8; ptxas 13); its
# ELFObjectFileBase::getNVPTXCPUName reads them the same way. Another ABI version: the mock refuses the image.
CUBIN_SM_FIELD = {7: (0xFF, 0), 8: (0xFF00, 8)}   # ABI version -> (mask, shift) of the SM in e_flags


def cubin_sm(image: bytes) -> int:
  """The SM (major * 10 + minor) a cubin image targets, by its ELF ABI version; ValueError for an unknown one."""
  abi, flags = image[8], struct.unpack_from("<I", image, 0x30)[0]
  if abi not in CUBIN_SM_FIELD:
    raise ValueError(f"cubin ELF ABI version {abi}; the mock reads {sorted(CUBIN_SM_FIELD)} (CUDA 12 / 13 ptxas)")
  mask, shift = CUBIN_SM_FIELD[abi]
  return (flags & mask) >> shift


class ChannelError(Exception):
  """What the hardware would reject or fault on: the Xid and why."""

  def __init__(self, xid: int, why: str):
    super().__init__(why)
    self.xid = xid


def _bits_outside(value: int, fields: tuple[tuple[int, int], ...]) -> int:
  mask = 0
  for hi, lo in fields: mask |= ((1 << (hi - lo + 1)) - 1) << lo
  return value & ~mask & 0xFFFFFFFF


@dataclass
class MockChannel:
  """A GPFIFO channel: ring, USERD, token, error notifier, bound subchannels, engine state."""
  handle: int
  cls: int
  ring: int
  entries: int
  userd_mem: int
  userd_off: int
  error: int
  group: int
  token: int
  engines: set[int] = field(default_factory=set)
  subch: dict[int, int] = field(default_factory=dict)       # subchannel -> bound class
  get: int = 0
  pb: tuple[int, int, int] | None = None                    # the entry being run: (address, dwords, position)
  regs: dict[int, int] = field(default_factory=dict)        # the last value of each method, by (class kind, offset)


class MockGPU:
  """One GPU: its usermode page (the doorbell), channels, and the engines that run them."""

  def __init__(self, drv: Any, index: int, cfg: Any):
    self.drv, self.index, self.cfg = drv, index, cfg
    self.uuid = _uuid.uuid5(_uuid.NAMESPACE_OID, f"tiny-mock-nv-{index}").bytes
    self.usermode = (ctypes.c_uint32 * (0x10000 // 4))()
    self.channels: dict[int, MockChannel] = {}
    self.kernels: dict[tuple[int, int], tuple[Kernel, KernelInfo, str]] = {}
    self.launches = 0
    self.last_qmd: dict[str, Any] = {}
    # ("compute"/"copy" channel, class of the method's engine or 0 for host methods, method offset, value) of every
    # method run, once each, when a list is set here (README's stream comparison with tinygrad's driver)
    self.trace: list[tuple[str, int, int, int]] | None = None
    self._traced: dict[int, tuple[int, int]] = {}

  def add_channel(self, h: int, cls: int, data: dict[str, Any]) -> None:
    self.channels[h] = MockChannel(h, cls, data["ring"], data["entries"], data["userd_mem"], data["userd_off"],
                                   data["error"], data["group"], token=0x3000 + 0x10 * self.index + len(self.channels))

  # ***** memory the GPU reaches *****
  def mapped(self, addr: int, n: int, what: str) -> None:
    r = self.drv.memory.find(addr)
    if r is None or addr + n > r[1]:
      raise ChannelError(XID_MMU_FAULT, f"MMU fault: {what} of {n} bytes at {addr:#x} is not mapped on the GPU")

  def read(self, addr: int, n: int, what: str) -> bytes:
    self.mapped(addr, n, what)
    return ctypes.string_at(addr, n)

  def u32(self, addr: int) -> int: return ctypes.c_uint32.from_address(addr).value

  def _userd(self, ch: MockChannel) -> int:
    m = self.drv.mems[ch.userd_mem]
    if m.backing is None: raise ChannelError(XID_MMU_FAULT, f"USERD of channel {ch.handle:#x} has no memory")
    return m.backing + ch.userd_off

  # ***** the host engine *****
  def process(self) -> None:
    progress = True
    while progress:
      progress = False
      for ch in list(self.channels.values()):
        if not self.drv.objects[ch.group].data.get("scheduled"): continue
        progress |= self._run(ch)

  def _run(self, ch: MockChannel) -> bool:
    userd = self._userd(ch)
    put, ran = self.u32(userd + 0x8C), False  # GP_PUT (clc56f.h AmpereAControlGPFifo.GPPut)
    while ch.get != put or ch.pb is not None:
      if ch.pb is None:
        if put >= ch.entries: return self._fault(ch, ChannelError(XID_GR_EXCEPTION, f"GP_PUT {put} >= {ch.entries}"))
        lo, hi = self.u32(ch.ring + 8 * ch.get), self.u32(ch.ring + 8 * ch.get + 4)
        try: ch.pb = self._gp_entry(ch, lo, hi)
        except ChannelError as e:
          self._fault(ch, e)
          ch.pb = None
        if ch.pb is None:
          self._advance(ch, userd)
          ran = True
          continue
      addr, n, pos = ch.pb
      try:
        done = self._methods(ch, addr, n, pos)
      except ChannelError as e:
        self._fault(ch, e)
        done = True
      if not done: return ran
      ch.pb = None
      self._advance(ch, userd)
      ran = True
    return ran

  def _advance(self, ch: MockChannel, userd: int) -> None:
    ch.get = (ch.get + 1) % ch.entries
    ctypes.c_uint32.from_address(userd + 0x88).value = ch.get  # GP_GET (AmpereAControlGPFifo.GPGet)

  def _gp_entry(self, ch: MockChannel, lo: int, hi: int) -> tuple[int, int, int] | None:
    """Decode a GPFIFO entry (clc56f.h NVC56F_GP_ENTRY0/1): GET (31:2), FETCH (0), GET_HI (7:0), LEVEL (9),
    LENGTH (30:10), SYNC (31). LENGTH 0 is a control entry (OPCODE in 7:0 of the second word): NOP only here."""
    length = (hi >> 10) & 0x1FFFFF
    if length == 0:
      if hi & 0xFF: raise ChannelError(XID_GR_EXCEPTION, f"GPFIFO control entry with opcode {hi & 0xFF}: not mocked")
      return None
    if lo & 3 or (hi >> 8) & 1 or hi >> 31:
      raise ChannelError(XID_GR_EXCEPTION, f"GPFIFO entry {lo:#010x} {hi:#010x}: FETCH_CONDITIONAL, SYNC_WAIT or "
                         "reserved bits set (not mocked)")
    addr = (lo & 0xFFFFFFFC) | ((hi & 0xFF) << 32)
    self.mapped(addr, 4 * length, "pushbuffer fetch")
    return addr, length, 0

  def _fault(self, ch: MockChannel, e: ChannelError) -> bool:
    """Report a channel error through the channel's error notifier."""
    m = self.drv.mems.get(ch.error)
    self.drv.last_fault = f"{self.cfg.name} channel {ch.handle:#x}: {e}"
    if m is not None and m.backing is not None:
      ctypes.memmove(m.backing, struct.pack("<QIHH", time.time_ns(), e.xid, 0, 0xFFFF), 16)
    return True

  def _methods(self, ch: MockChannel, addr: int, n: int, pos: int) -> bool:
    """Run method dwords [pos, n) of the pushbuffer at `addr`; False when parked on a wait (position kept)."""
    words = (ctypes.c_uint32 * n).from_address(addr)
    while pos < n:
      h = words[pos]
      op, subch, mthd, count = push.decode_method(h)
      if op != push.SEC_OP_INC_METHOD:
        raise ChannelError(XID_GR_EXCEPTION, f"method header {h:#010x}: opcode {op} (only incrementing methods, 1, "
                           "are mocked)")
      if pos + 1 + count > n:
        raise ChannelError(XID_GR_EXCEPTION, f"method {mthd:#x} x{count} runs past the pushbuffer's {n} dwords")
      for i in range(count):
        ch.pb = (addr, n, pos)
        if self.trace is not None: self._trace(ch, addr, pos + 1 + i, subch, mthd + 4 * i, words[pos + 1 + i])
        if not self._method(ch, subch, mthd + 4 * i, words[pos + 1 + i]):
          return False  # parked: the method group runs again from its header (its other dwords only set registers)
      pos += 1 + count
    self._traced.pop(ch.handle, None)
    return True

  def _trace(self, ch: MockChannel, addr: int, idx: int, subch: int, m: int, v: int) -> None:
    """Record a method once: a parked group's re-run from its header does not record its dwords again."""
    last = self._traced.get(ch.handle)
    if last is not None and last[0] == addr and idx <= last[1]: return
    self._traced[ch.handle] = (addr, idx)
    assert self.trace is not None
    kind = "compute" if any(c in rm.COMPUTE_CLASSES for c in ch.engines) else "copy"
    self.trace.append((kind, 0 if m < 0x100 else ch.subch.get(subch, -1), m, v))

  def _method(self, ch: MockChannel, subch: int, m: int, v: int) -> bool:
    if m < 0x100: return self._host(ch, m, v)
    cls = ch.subch.get(subch)
    if cls is None:
      raise ChannelError(XID_GR_EXCEPTION, f"method {m:#x} on subchannel {subch}, which no SET_OBJECT bound")
    if cls in rm.COMPUTE_CLASSES: self._compute(ch, cls, m, v)
    else: self._copy(ch, cls, m, v)
    return True

  def _host(self, ch: MockChannel, m: int, v: int) -> bool:
    r = ch.regs
    if m == push.SET_OBJECT:
      cls = v & 0xFFFF
      if v >> 16: raise ChannelError(XID_GR_EXCEPTION, f"SET_OBJECT {v:#x}: ENGINE field set (not mocked)")
      if cls not in ch.engines:
        raise ChannelError(XID_GR_EXCEPTION, f"SET_OBJECT of class {cls:#x}, which channel {ch.handle:#x} has no "
                           f"object of (it has {sorted(hex(c) for c in ch.engines)})")
      # the subchannel comes from the method header; find it from the last header decoded
      ch.subch[self._cur_subch(ch)] = cls
    elif m in (0x5C, 0x60, 0x64, 0x68): r[m] = v
    elif m == push.SEM_EXECUTE: return self._sem_execute(ch, v)
    elif m == push.WFI:
      if v & ~1: raise ChannelError(XID_GR_EXCEPTION, f"WFI {v:#x}: bits outside SCOPE (0:0)")
    elif m == push.NON_STALL_INTERRUPT: pass
    else: raise ChannelError(XID_GR_EXCEPTION, f"unknown host method {m:#x} (class {ch.cls:#x})")
    return True

  def _cur_subch(self, ch: MockChannel) -> int:
    assert ch.pb is not None
    addr, _, pos = ch.pb
    return (self.u32(addr + 4 * pos) >> 13) & 7

  def _sem_execute(self, ch: MockChannel, v: int) -> bool:
    """NVC56F_SEM_EXECUTE: OPERATION (2:0), ACQUIRE_SWITCH_TSG (12), RELEASE_WFI (20), PAYLOAD_SIZE (24),
    RELEASE_TIMESTAMP (25), REDUCTION (30:27), REDUCTION_FORMAT (31)."""
    if bad := _bits_outside(v, ((2, 0), (12, 12), (20, 20), (24, 24), (25, 25), (30, 27), (31, 31))):
      raise ChannelError(XID_GR_EXCEPTION, f"SEM_EXECUTE {v:#x}: reserved bits {bad:#x} set")
    r = ch.regs
    lo, hi = r.get(0x5C, 0), r.get(0x60, 0)
    hi_bits = 25 if ch.cls == rm.HOPPER_CHANNEL_GPFIFO_A else 8   # SEM_ADDR_HI_OFFSET: (24:0) on Hopper, (7:0) Ampere
    if lo & 3 or hi >> hi_bits:
      raise ChannelError(XID_GR_EXCEPTION, f"semaphore address {hi:#x}:{lo:#x}: bits outside SEM_ADDR_LO (31:2) / "
                         f"SEM_ADDR_HI ({hi_bits - 1}:0) set")
    addr, op, b64, ts = lo | (hi << 32), v & 7, (v >> 24) & 1, (v >> 25) & 1
    size = 16 if ts else 8 if b64 else 4
    if addr % size:
      raise ChannelError(XID_GR_EXCEPTION, f"semaphore at {addr:#x} is not {size}-byte aligned ("
                         f"{'a timestamped release' if ts else '64-bit payload' if b64 else '32-bit payload'})")
    self.mapped(addr, size, "semaphore")
    payload = r.get(0x64, 0) | (r.get(0x68, 0) << 32 if b64 else 0)
    if op == push.SEM_OP_RELEASE:
      if (v >> 27) & 0xF or v >> 31: raise ChannelError(XID_GR_EXCEPTION, "semaphore reductions are not mocked")
      if b64: ctypes.c_uint64.from_address(addr).value = payload
      else: ctypes.c_uint32.from_address(addr).value = payload
      if ts: ctypes.c_uint64.from_address(addr + 8).value = time.perf_counter_ns()
      return True
    if op == push.SEM_OP_ACQ_CIRC_GEQ:
      if ts: raise ChannelError(XID_GR_EXCEPTION, "RELEASE_TIMESTAMP on an acquire")
      cur = ctypes.c_uint64.from_address(addr).value if b64 else self.u32(addr)
      bits = 64 if b64 else 32
      diff = (cur - payload) & ((1 << bits) - 1)
      return diff < 1 << (bits - 1)   # circular >=: the difference is non-negative as a signed number
    raise ChannelError(XID_GR_EXCEPTION, f"SEM_EXECUTE operation {op} is not mocked (RELEASE 1, ACQ_CIRC_GEQ 3)")

  # ***** compute engine *****
  COMPUTE_FIELDS = {0x2A0: ((16, 0),), 0x2A4: ((31, 0),), 0x7B0: ((16, 0),), 0x7B4: ((31, 0),), 0x790: ((16, 0),),
                    0x794: ((31, 0),), 0x2E4: ((7, 0),), 0x2E8: ((31, 0),), 0x2EC: ((8, 0),), 0x2B4: ((31, 0),),
                    0x1698: ((0, 0), (4, 4), (12, 12)), 0x2C0: ((3, 0),), 0x110: ((31, 0),)}

  def _compute(self, ch: MockChannel, cls: int, m: int, v: int) -> None:
    if m not in self.COMPUTE_FIELDS:
      raise ChannelError(XID_GR_EXCEPTION, f"unknown method {m:#x} for compute class {cls:#x}")
    if bad := _bits_outside(v, self.COMPUTE_FIELDS[m]):
      raise ChannelError(XID_GR_EXCEPTION, f"compute method {m:#x} = {v:#x}: bits {bad:#x} outside its fields")
    ch.regs[0x10000 | m] = v
    if m == push.SEND_SIGNALING_PCAS2_B:
      # clc6c0.h SEND_SIGNALING_PCAS2_B_PCAS_ACTION: SCHEDULE 2, INVALIDATE_COPY_SCHEDULE 3, PREFETCH_SCHEDULE 9
      # (tinygrad 0.14 launches with it), INVALIDATE_PREFETCH_COPY_SCHEDULE 0xA: each schedules the QMD (the mock has
      # no QMD cache to invalidate or prefetch into)
      if v not in (2, push.PCAS_ACTION_INVALIDATE_COPY_SCHEDULE, 9, 0xA):
        raise ChannelError(XID_GR_EXCEPTION, f"PCAS action {v}: the mock schedules (2, 3, 9, 0xA) only")
      self.launch(ch, ch.regs.get(0x10000 | push.SEND_PCAS_A, 0) << 8)

  def _cregs(self, ch: MockChannel, a: int) -> int:
    """A 64-bit value a compute method pair (A: upper, B: lower) set."""
    return (ch.regs.get(0x10000 | a, 0) << 32) | ch.regs.get(0x10000 | (a + 4), 0)

  # ***** copy engine *****
  COPY_FIELDS = {0x400: ((16, 0),), 0x404: ((31, 0),), 0x408: ((16, 0),), 0x40C: ((31, 0),), 0x418: ((31, 0),),
                 0x240: ((16, 0),), 0x244: ((31, 0),), 0x248: ((31, 0),),
                 0x300: ((1, 0), (2, 2), (4, 3), (6, 5), (7, 7), (8, 8), (9, 9), (25, 25))}

  def _copy(self, ch: MockChannel, cls: int, m: int, v: int) -> None:
    if m not in self.COPY_FIELDS: raise ChannelError(XID_GR_EXCEPTION, f"unknown method {m:#x} for copy class {cls:#x}")
    if bad := _bits_outside(v, self.COPY_FIELDS[m]):
      raise ChannelError(XID_GR_EXCEPTION, f"copy method {m:#x} = {v:#x}: bits {bad:#x} outside its fields")
    ch.regs[0x20000 | m] = v
    if m != push.LAUNCH_DMA: return
    g = lambda a: ch.regs.get(0x20000 | a, 0)  # noqa: E731
    xfer, sem, intr = v & 3, (v >> 3) & 3, (v >> 5) & 3
    if intr: raise ChannelError(XID_GR_EXCEPTION, "LAUNCH_DMA with an interrupt: not mocked")
    if xfer:
      if not ((v >> 7) & 1 and (v >> 8) & 1) or (v >> 9) & 1:
        raise ChannelError(XID_GR_EXCEPTION, f"LAUNCH_DMA {v:#x}: the mock copies pitch-linear, single-line only")
      src, dst, n = (g(0x400) << 32) | g(0x404), (g(0x408) << 32) | g(0x40C), g(0x418)
      self.mapped(src, n, "copy-engine read")
      self.mapped(dst, n, "copy-engine write")
      ctypes.memmove(dst, src, n)
    if sem:
      addr, payload = (g(0x240) << 32) | g(0x244), g(0x248)
      if sem == push.DMA_SEMAPHORE_RELEASE_FOUR_WORD:
        if addr % 16: raise ChannelError(XID_GR_EXCEPTION, f"four-word semaphore at {addr:#x} is not 16-byte aligned")
        self.mapped(addr, 16, "copy-engine semaphore")
        ctypes.memmove(addr, struct.pack("<IIQ", payload, 0, time.perf_counter_ns()), 16)
      elif sem == 1:
        if addr % 4: raise ChannelError(XID_GR_EXCEPTION, f"semaphore at {addr:#x} is not 4-byte aligned")
        self.mapped(addr, 4, "copy-engine semaphore")
        ctypes.c_uint32.from_address(addr).value = payload
      else: raise ChannelError(XID_GR_EXCEPTION, f"LAUNCH_DMA semaphore type {sem} is not mocked")

  # ***** QMD launches *****
  def launch(self, ch: MockChannel, qmd_addr: int) -> None:
    """Run the QMD at `qmd_addr`, then the QMDs it schedules on completion (DEPENDENT_QMD0, a chain: no recursion)."""
    nxt: int | None = qmd_addr
    while nxt is not None: nxt = self._launch_one(ch, nxt)

  def _after_grid(self, d: dict[str, int]) -> int | None:
    """What a 03_00 QMD does when its grid completes: its release semaphores (four words: the 64-bit payload and a
    timestamp; two words: the 64-bit payload; one word: its low 32 bits), then the dependent QMD it schedules (its
    address, or None)."""
    for i in (0, 1):
      if not d.get(f"RELEASE{i}_ENABLE"): continue
      addr = d[f"RELEASE{i}_ADDRESS_LOWER"] | d[f"RELEASE{i}_ADDRESS_UPPER"] << 32
      payload = d[f"RELEASE{i}_PAYLOAD_LOWER"] | d[f"RELEASE{i}_PAYLOAD_UPPER"] << 32
      if d[f"RELEASE{i}_STRUCTURE_SIZE"] == push.RELEASE_STRUCTURE_FOUR_WORDS:
        if addr % 16: raise ChannelError(XID_GR_EXCEPTION, f"QMD release{i} (four words) at {addr:#x}: not 16-aligned")
        self.mapped(addr, 16, f"QMD release{i}")
        ctypes.memmove(addr, struct.pack("<QQ", payload, time.perf_counter_ns()), 16)
      elif d[f"RELEASE{i}_STRUCTURE_SIZE"] == push.RELEASE_STRUCTURE_TWO_WORDS:
        if addr % 8: raise ChannelError(XID_GR_EXCEPTION, f"QMD release{i} (two words) at {addr:#x}: not 8-aligned")
        self.mapped(addr, 8, f"QMD release{i}")
        ctypes.c_uint64.from_address(addr).value = payload
      elif d[f"RELEASE{i}_STRUCTURE_SIZE"] == push.RELEASE_STRUCTURE_ONE_WORD:
        if addr % 4: raise ChannelError(XID_GR_EXCEPTION, f"QMD release{i} (one word) at {addr:#x}: not 4-aligned")
        self.mapped(addr, 4, f"QMD release{i}")
        ctypes.c_uint32.from_address(addr).value = payload & 0xFFFFFFFF
      else: raise ChannelError(XID_GR_EXCEPTION, f"QMD release{i} structure size {d[f'RELEASE{i}_STRUCTURE_SIZE']}")
    if not d.get("DEPENDENT_QMD0_ENABLE"): return None
    if d["DEPENDENT_QMD0_ACTION"] != push.DEPENDENT_QMD_ACTION_SCHEDULE:
      raise ChannelError(XID_GR_EXCEPTION, f"dependent QMD action {d['DEPENDENT_QMD0_ACTION']}: the mock schedules (1)")
    return d["DEPENDENT_QMD0_POINTER"] << 8

  def _launch_one(self, ch: MockChannel, qmd_addr: int) -> int | None:
    """Decode the QMD at `qmd_addr`, check it against the GPU and the cubin, run the kernel; the next QMD or None."""
    # which QMD version a compute class reads: Ampere/Ada 03_00, Hopper 04_00 (clcbc0qmd.h; what Mesa NVK launches on
    # HOPPER_COMPUTE_A). QMD_MAJOR_VERSION has the same bits (583:580) in both, so the header word tells them apart.
    cls = ch.subch.get(push.SUBCH_COMPUTE, 0)
    ver = push.QMD_OF_CLASS.get(cls)
    if ver is None: raise ChannelError(XID_GR_EXCEPTION, f"QMD launch on class {cls:#x}, which reads no known QMD")
    hi, lo = push.QMD_MAJOR_BITS
    major = (int.from_bytes(self.read(qmd_addr + lo // 32 * 4, 4, "QMD read"), "little") >> lo % 32) & 0xF
    if major != ver.major:
      raise ChannelError(XID_GR_EXCEPTION, f"QMD version {major}.x on compute class {cls:#x}, which reads QMD "
                         f"{ver.major}.0 (Ampere/Ada classes 03_00, HOPPER_COMPUTE_A 04_00)")
    q = push.QMD(self.read(qmd_addr, ver.size, "QMD read"), ver)
    if q[ver.minor] != 0: raise ChannelError(XID_GR_EXCEPTION, f"QMD version {major}.{q[ver.minor]}")
    if extra := q.bits & ~QMD_KNOWN_BITS[major]:
      raise ChannelError(XID_GR_EXCEPTION, f"QMD bits set outside the fields the mock implements: first at bit "
                         f"{(extra & -extra).bit_length() - 1}")
    if major == 4 and q["QMD_TYPE"] != push.QMD_TYPE_GRID_CTA:
      raise ChannelError(XID_GR_EXCEPTION, f"QMD_TYPE {q['QMD_TYPE']}: the mock runs GRID_CTA (2) grids")
    d = {k: q[k] for k in ver.layout}
    grid = tuple(d[k] for k in ver.grid)
    block = (d["CTA_THREAD_DIMENSION0"], d["CTA_THREAD_DIMENSION1"], d["CTA_THREAD_DIMENSION2"])
    prog = d["PROGRAM_ADDRESS_LOWER"] | (d["PROGRAM_ADDRESS_UPPER"] << 32)
    cb0 = q.cb0()
    cb0_size = d["CONSTANT_BUFFER_SIZE_SHIFTED4_0"] << 4
    regs = d[ver.registers]
    self.last_qmd = {"fields": d, "version": major, "grid": grid, "block": block, "program": prog,
                     "cb0": (cb0, cb0_size), "registers": regs, "shared": d["SHARED_MEMORY_SIZE"],
                     "local": d["SHADER_LOCAL_MEMORY_HIGH_SIZE"], "sass_version": d["SASS_VERSION"]}
    cfg = self.cfg
    sass = ((cfg.sm_version >> 4) & 0xF0) | (cfg.sm_version & 0xF)
    # SASS_VERSION is the SM version as two nibbles (major << 4 | minor): clc6c0qmd.h / clcbc0qmd.h QMD field
    if d["SASS_VERSION"] != sass:
      raise ChannelError(XID_GR_EXCEPTION, f"QMD SASS_VERSION {d['SASS_VERSION']:#x}; this GPU runs {sass:#x}")
    # CUDA C++ Programming Guide, "Features and Technical Specifications" (CC 8.x/9.0): <= 1024 threads a block, its
    # z dimension <= 64
    if any(g == 0 for g in grid) or any(b == 0 for b in block) or block[0] * block[1] * block[2] > 1024 or \
       block[2] > 64:
      raise ChannelError(XID_GR_EXCEPTION, f"launch of {grid} blocks of {block} threads (each >= 1, <= 1024 threads, "
                         "z <= 64)")
    if not d["CONSTANT_BUFFER_VALID_0"]: raise ChannelError(XID_GR_EXCEPTION, "constant buffer 0 is not valid")
    if self._is_ptx_image(prog):
      if not self._run_ptx_image(ch, prog, cb0, d, grid, block): return None
      return self._after_grid(d)
    k, info, ptx_text = self._kernel(prog)
    threads = block[0] * block[1] * block[2]
    # the same table: <= 255 registers a thread, 64K a block; registers are allocated per warp in units of 256 (the
    # CUDA Occupancy Calculator's "register allocation unit size", granularity warp)
    if regs < info.registers or regs > 255 or threads * ((regs * 32 + 255) // 256 * 256) // 32 > 65536:
      raise ChannelError(XID_GR_EXCEPTION, f"kernel {info.name} uses {info.registers} registers; the QMD gives {regs} "
                         f"for {threads} threads (<= 255 each, 64K per SM)")
    # shared memory a block may use (the CUDA guide's opt-in maximum: 227 KB on sm_90, 163 KB on sm_80, 99 KB on
    # sm_86) plus the 1 KB the driver reserves per block ("1 KB of shared memory is reserved for system use", CC 8.x)
    need_shared = info.shared_size
    if d["SHARED_MEMORY_SIZE"] < need_shared or d["SHARED_MEMORY_SIZE"] > cfg.max_shared + 1024:
      raise ChannelError(XID_GR_EXCEPTION, f"QMD SHARED_MEMORY_SIZE {d['SHARED_MEMORY_SIZE']}: kernel {info.name} "
                         f"needs {need_shared}, the SM has {cfg.max_shared}")
    # the SM's shared-memory carveout fields count 4 KiB units plus one (Mesa nvk_cmd_dispatch.c
    # gv100_sm_config_smem_size: size / 4096 + 1, the size rounded up to 8/16/32/64/96 KiB)
    lo_cfg, tgt, hi_cfg = d["MIN_SM_CONFIG_SHARED_MEM_SIZE"], d["TARGET_SM_CONFIG_SHARED_MEM_SIZE"], \
      d["MAX_SM_CONFIG_SHARED_MEM_SIZE"]
    if not 1 <= lo_cfg <= tgt <= hi_cfg or (tgt - 1) * 4096 < d["SHARED_MEMORY_SIZE"] or \
       (hi_cfg - 1) * 4096 > cfg.max_shared + 1024:
      raise ChannelError(XID_GR_EXCEPTION, f"shared-memory carveout min {lo_cfg} <= target {tgt} <= max {hi_cfg} "
                         f"(KiB/4 + 1) must hold {d['SHARED_MEMORY_SIZE']} bytes and stay within the SM")
    self._check_local(ch, info, d["SHADER_LOCAL_MEMORY_HIGH_SIZE"])
    if cb0_size < info.param_offset + info.param_size:
      raise ChannelError(XID_GR_EXCEPTION, f"constant buffer 0 of {cb0_size} bytes; kernel {info.name} reads "
                         f"parameters up to byte {info.param_offset + info.param_size}")
    self.mapped(cb0, cb0_size, "constant buffer 0")
    sw = self._cregs(ch, push.SET_SHADER_SHARED_MEMORY_WINDOW_A)
    lw = self._cregs(ch, push.SET_SHADER_LOCAL_MEMORY_WINDOW_A)
    # constant bank 0's driver area: the shared and local window base addresses at bytes 0x18 and 0x20, which
    # ptxas-compiled SASS reads for cvta.shared / cvta.local (NVIDIA's ptxas output, tests/test_nv_cubin.py; tinygrad
    # 0.14's ops_nv.py writes them there too; the kernel's own parameters start at cubin.load_kernel_info's
    # param_offset)
    head = ctypes.string_at(cb0 + 0x18, 16)
    if struct.unpack("<QQ", head) != (sw, lw) or not sw or not lw:
      raise ChannelError(XID_GR_EXCEPTION, f"constant bank 0 holds windows {head.hex()}, the channel set shared "
                         f"{sw:#x} and local {lw:#x}")
    # ... and the launch sizes at bytes 0x0-0x14, where ptxas-compiled SASS reads %ntid.x/y/z and %nctaid.x/y/z
    # (NVIDIA's ptxas output, sm_80 and sm_90: tests/test_nv_cubin.py); the mock runs the PTX, so it checks them for
    # a kernel that reads them
    dims = struct.unpack("<6I", ctypes.string_at(cb0, 24))
    if READS_LAUNCH_SIZE.search(ptx_text) and dims != (*block, *grid):
      raise ChannelError(XID_GR_EXCEPTION, f"kernel {info.name} reads %ntid/%nctaid; constant bank 0 bytes 0x0-0x14 "
                         f"hold {dims}, the launch is {grid} blocks of {block} threads")
    for w in (sw, lw):
      for start in self.drv.memory.starts:
        end = self.drv.memory.ranges[start][0]
        if start < w + WINDOW_SIZE and w < end:
          raise ChannelError(XID_GR_EXCEPTION, f"window at {w:#x} overlaps GPU memory at {start:#x}")
    params = ctypes.string_at(cb0 + info.param_offset, info.param_size)
    if len(params) < k.param_size: raise ChannelError(XID_GR_EXCEPTION, f"parameters of {len(params)} bytes; the PTX "
                                                      f"reads {k.param_size}")
    if not self._run_grid(ch, k, params, grid, block): return None
    return self._after_grid(d)

  def _run_grid(self, ch: MockChannel, k: Kernel, params: bytes, grid: tuple[int, ...], block: tuple[int, ...]) -> bool:
    """Run a grid on the executor; a kernel fault is reported (the channel goes on with its next method): False."""
    self.launches += 1
    try: k.launch(self.drv.memory, params, grid, block)
    except GPUFault as e:  # the kernel is cut short and reported; the channel goes on with its next method
      self._fault(ch, ChannelError(XID_GR_EXCEPTION if "misaligned" in str(e) else XID_MMU_FAULT,
                                   f"kernel {k.name}: {e}"))
      return False
    return True

  # tinygrad 0.14's MOCK interface ABI (ops_nv.py MOCKIface): the program image is the PTX text itself; constant bank 0
  # is 0x160 bytes with word 80 the buffer count and word 81 the value count, and the arguments follow it as 64-bit
  # slots (buffer addresses, then values), in the kernel's parameter order.
  MOCK_ABI_CB0_SIZE, MOCK_ABI_COUNTS = 0x160, 80 * 4

  def _is_ptx_image(self, prog: int) -> bool:
    r = self.drv.memory.find(prog)
    if r is None or prog != r[0]: return False
    head = ctypes.string_at(prog, 16).lstrip(b"\n\t ")
    return head.startswith((b".version", b"//"))

  def _run_ptx_image(self, ch: MockChannel, prog: int, cb0: int, d: dict[str, int], grid: tuple[int, ...],
                     block: tuple[int, ...]) -> bool:
    """Launch a PTX-text program image with its arguments in the MOCK ABI's slots after constant bank 0."""
    r = self.drv.memory.find(prog)
    assert r is not None
    text = ctypes.string_at(prog, r[1] - prog).split(b"\0", 1)[0].decode(errors="replace")
    names = re.findall(r"\.entry\s+([A-Za-z_$%][\w$]*)", text)
    if len(names) != 1: raise ChannelError(XID_GR_EXCEPTION, f"PTX program image at {prog:#x} has {len(names)} entries")
    try: k = load_kernel(text, names[0])
    except (ValueError, KeyError, NotImplementedError) as e:
      raise ChannelError(XID_GR_EXCEPTION, f"PTX program image at {prog:#x}: {e}") from None
    if d["SHARED_MEMORY_SIZE"] < k.shared_size:
      raise ChannelError(XID_GR_EXCEPTION, f"QMD SHARED_MEMORY_SIZE {d['SHARED_MEMORY_SIZE']}: kernel {k.name} needs "
                         f"{k.shared_size}")
    if d["SHADER_LOCAL_MEMORY_HIGH_SIZE"] < k.local_size:
      raise ChannelError(XID_GR_EXCEPTION, f"kernel {k.name} needs {k.local_size} bytes of local memory per thread, "
                         f"the QMD gives {d['SHADER_LOCAL_MEMORY_HIGH_SIZE']}")
    self.mapped(cb0, self.MOCK_ABI_CB0_SIZE + 8 * len(k.params), "constant buffer 0 and the MOCK ABI arguments")
    nbufs, nvals = struct.unpack("<II", ctypes.string_at(cb0 + self.MOCK_ABI_COUNTS, 8))
    if nbufs + nvals != len(k.params):
      raise ChannelError(XID_GR_EXCEPTION, f"kernel {k.name} takes {len(k.params)} parameters; constant bank 0 gives "
                         f"{nbufs} buffers and {nvals} values")
    vals = struct.unpack(f"<{len(k.params)}Q", ctypes.string_at(cb0 + self.MOCK_ABI_CB0_SIZE, 8 * len(k.params)))
    return self._run_grid(ch, k, k.pack_params(list(vals)), grid, block)

  def _check_local(self, ch: MockChannel, info: KernelInfo, per_thread: int) -> None:
    if per_thread < info.local_size:
      raise ChannelError(XID_GR_EXCEPTION, f"kernel {info.name} needs {info.local_size} bytes of stack per thread, the "
                         f"QMD gives {per_thread}")
    if not per_thread: return
    buf = self._cregs(ch, push.SET_SHADER_LOCAL_MEMORY_A)
    per_tpc = self._cregs(ch, push.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A)
    c = self.cfg
    # Mesa nvk_device.c nvk_slm_area_ensure: bytes per warp aligned to 0x200, times the SM's max warps, times SMs per
    # TPC: the local memory each TPC needs (SET_SHADER_LOCAL_MEMORY_NON_THROTTLED)
    need = (per_thread * 32 + 0x1FF) // 0x200 * 0x200 * c.max_warps_per_sm * c.num_sm_per_tpc
    if not buf or per_tpc < need:
      raise ChannelError(XID_GR_EXCEPTION, f"local memory of {per_thread} bytes per thread needs {need} bytes per TPC; "
                         f"the channel set {per_tpc} at {buf:#x}")
    self.mapped(buf, per_tpc * c.num_tpc_per_gpc * c.num_gpcs, "local memory buffer")

  def _kernel(self, prog: int) -> tuple[Kernel, KernelInfo, str]:
    """The kernel at `prog`: the cubin image at the start of the allocation holding it (its bytes there checked)."""
    r = self.drv.memory.find(prog)
    if r is None: raise ChannelError(XID_MMU_FAULT, f"MMU fault: program at {prog:#x} is not mapped")
    base = r[0]
    head = ctypes.string_at(base, EHDR.size)
    if head[:4] != b"\x7fELF":
      raise ChannelError(XID_GR_EXCEPTION, f"program at {prog:#x}: no cubin image at its allocation's start {base:#x}")
    h = EHDR.unpack(head)
    size = h[6] + h[11] * h[12]
    image = self.read(base, size, "cubin image")
    key = (prog, zlib.crc32(image))
    if (hit := self.kernels.get(key)) is not None: return hit
    try:
      elf = ELF(image)
      name = next(s.name[6:] for s in elf.sections if s.name.startswith(".text.") and base + s.offset == prog)
      info = load_kernel_info(image, name)
      ptx_text = ptx_of(image)
      sm = cubin_sm(image)
    except (StopIteration, CubinError, ValueError) as e:
      raise ChannelError(XID_GR_EXCEPTION, f"program at {prog:#x}: no kernel's code starts there ({e})") from None
    want = f"sm_{self.cfg.sm_version >> 8}{self.cfg.sm_version & 0xF}"
    # SASS is per SM: the GPU can't run another SM's code (the CUDA driver refuses such a module with
    # CUDA_ERROR_NO_BINARY_FOR_GPU); the SM here is the mock's own reading of the header (`cubin_sm`)
    if f"sm_{sm}" != want:
      raise ChannelError(XID_GR_EXCEPTION, f"cubin for sm_{sm} (ELF ABI {image[8]}, e_flags "
                         f"{struct.unpack_from('<I', image, 0x30)[0]:#010x}) on a {want} GPU")
    k = load_kernel(ptx_text, name)
    self.kernels[key] = (k, info, ptx_text)
    return k, info, ptx_text
