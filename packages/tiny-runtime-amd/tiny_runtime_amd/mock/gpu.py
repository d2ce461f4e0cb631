"""One mocked GPU: its VM, its queues and the command processors that run them (PM4 on compute queues, SDMA v6 on
copy queues), with a model of the caches that a driver must manage.

`MockGPU` is architecture-neutral: an architecture subclass (`gfx11.GFX11`) supplies the topology properties, the
compute (SH) register table and `dispatch` (launching waves in a shader emulator); `ARCHS` maps an LLVM target name to
it, so another GPU (a CDNA part, another queue format) plugs in as one more subclass.

Cache model (what the mock checks, from amdgpu's gfx11 fence and mem-sync packets):
- after a dispatch, its writes may sit in the GPU's L2 (`l2_dirty`) and its CUs' L0/L1 caches are not coherent with
  anything else: a RELEASE_MEM that writes a host-visible location (a signal, a timestamp) while L2 is dirty must
  write L2 back (GCR GL2_WB), else the host could see the signal before the data. GLM_WB needs GLM_INV with it.
- a dispatch may read what the host (kernargs, new code) or SDMA wrote: since the GPU last noticed a doorbell (all
  doorbells rung since the previous pass count as rung together, before any queue runs) or an SDMA copy, an
  ACQUIRE_MEM must have invalidated the instruction, scalar, vector, L1 and L2 caches over the whole address space
  (`caches_valid`). Whether an SDMA copy leaves a GPU's L2 valid is the architecture's `l2_coherent_after_sdma_write`:
  on gfx11, where SDMA is a GL2 client, its own GPU's L2 and any GL2 that maps the destination MTYPE_UC (COHERENT /
  UNCACHED BOs, `gmc_v11_0_get_vm_pte`); on gfx942 every GPU that maps the destination MTYPE_RW
  (its own VRAM: SDMA writes probe-invalidate RW lines) or MTYPE_UC (system memory), not one that maps it MTYPE_NC (a
  peer's VRAM); `mock/gfx9.py` cites the kernel sources. What an earlier
  dispatch of the same GPU wrote sits in (or behind) that GPU's L2, which every CU reads through: between two
  dispatches only the CU-side caches (scalar GLK, vector GLV, GL1; gfx9: K$, TCL1) must be invalidated
  (`cu_caches_valid`), as tinygrad's HCQ graph does (an ACQUIRE_MEM without GLI/GL2 before each kernel).
- an SDMA FENCE whose MTYPE is not UC (3) writes through the GPU's L2 (amdgpu's
  `sdma_v5_0/v5_2/v6_0/v7_0_ring_emit_fence` set MTYPE 3, "Ucached(UC)", so a fence is visible to the host at once):
  when the address is host-visible (a signal, an event mailbox) the value waits in `l2_lines`, where the GPU's own
  polls see it but the host and KFD's interrupt
  handler do not, until an L2 write-back (GL2_WB / TC_WB) puts it in memory. (The SDMA engine does not reject the
  packet: the write is cached, so a driver that leaves MTYPE 0 sees its signals late or never.)
Memory the GPU reaches (rings, packets' addresses, the emulator's loads and stores) must be mapped in its VM, else
GPUPageFault.
"""
from __future__ import annotations

import bisect
import ctypes
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tiny_runtime_amd import kfd
from tiny_runtime_amd.emu.rdna3 import Memory
from tiny_runtime_amd.mock import pm4 as mpm4
from tiny_runtime_amd.mock import sdma as msdma
from tiny_runtime_amd.mock.fields import Layout, MockGPUError, PacketError, require

if TYPE_CHECKING:
  from tiny_runtime_amd.mock.driver import MockAlloc, MockKFD

SH_REG_BASE = 0xB000  # byte address of SH register dword 0x2C00 (SET_SH_REG offsets count from it)
TIMESTAMP_HZ = 100_000_000


class GPUPageFault(MockGPUError):
  """The mocked GPU touched an address outside every allocation mapped into its VM."""


class GPUHang(MockGPUError):
  """A wait the GPU can never leave, or a host wait no interrupt will ever end."""


class ShaderFault(MockGPUError):
  """A wave stopped by the emulator: an instruction it does not model, a register or scratch access out of range, a
  loop that never reaches s_endpgm. Like a GPU that kills the faulting dispatch, the command processor goes on with
  the next packet (the dispatch's memory writes so far stay), so one bad kernel does not wedge the queue."""


class CheckedMemory(Memory):
  """Emulator memory that only reaches allocations mapped into one GPU's VM (a bad address raises GPUPageFault)."""

  def __init__(self, gpu: MockGPU):
    self.gpu = gpu

  def read(self, addr: int, n: int) -> bytes:
    self.gpu.check(addr, n, "shader read")
    return super().read(addr, n)

  def write(self, addr: int, data: bytes) -> None:
    self.gpu.check(addr, len(data), "shader write")
    super().write(addr, data)

  def region(self, addr: int) -> tuple[int, int, Any] | None:
    """(start, end, writable numpy uint8 view) of the allocation mapped into the GPU's VM that holds `addr`, or
    None: the batched emulator accesses memory through it (a lane outside it goes the per-wave way, which reports the
    fault)."""
    g = self.gpu
    i = bisect.bisect_right(g.range_starts, addr) - 1
    if i < 0: return None
    start = g.range_starts[i]
    end = g.ranges[start]
    if addr >= end: return None
    views = self.__dict__.setdefault("_views", {})
    if (v := views.get((start, end))) is None:
      if len(views) > 4096: views.clear()
      from tiny_runtime_amd.emu.batch import host_span
      v = views[(start, end)] = host_span(start, end - start)
    return start, end, v

  def code_bytes(self, addr: int) -> bytes | None:
    """The bytes from `addr` to the end of the allocation holding it (at most 1 MiB): what a kernel's code can be,
    so the emulator keeps compiled code by content."""
    r = self.region(addr)
    if r is None: return None
    start, end, view = r
    return bytes(view[addr - start:min(end, addr + (1 << 20)) - start])

  @property
  def generation(self) -> int:
    """Changes whenever the GPU's mappings change (a cached region is checked against it)."""
    return self.gpu.vm_generation


# NBIO BIF_BX_PF0_GPU_HDP_FLUSH_REQ / _DONE dword offsets (nbio_4_3_0_offset.h for gfx11's NBIO 4.3, the same values in
# nbio_7_9_0_offset.h for MI300's NBIO 7.9: base 0 + 0x0e26 / 0x0e27), what amdgpu's HDP flush packet names
HDP_FLUSH_REQ_DONE = (0xE26, 0xE27)

@dataclass
class MockQueue:
  """A user-mode queue registered by CREATE_QUEUE."""
  qid: int
  qtype: int
  gpu: MockGPU
  ring: int
  ring_size: int
  wptr_addr: int
  rptr_addr: int
  doorbell: int
  cwsr: bool = False
  xcc: int = 0   # the XCC a PM4 queue runs on (a multi-XCC node runs each PM4 queue on one XCC)
  # the doorbell/pointer units: dwords on PM4 queues (gfx_v11_0_ring_set_wptr_compute writes ring->wptr, counted in
  # dwords), bytes on SDMA queues (sdma_v6_0_ring_set_wptr / sdma_v4_4_2_ring_set_wptr write ring->wptr << 2)
  rptr: int = 0
  seen_doorbell: int = 0
  regs: dict[int, int] = field(default_factory=dict)
  ib: list[int] | None = None  # [address, dwords, position] of the indirect buffer being executed
  blocked: str = ""            # what the queue waits for, when it waits

  @property
  def kind(self) -> str: return "PM4 compute" if self.qtype == kfd.QUEUE_TYPE_COMPUTE else "SDMA"

  def pending(self) -> bool:
    return self.ib is not None or self.rptr < ctypes.c_uint64.from_address(self.doorbell).value


class MockGPU:
  """A GPU node of the mock KFD. Subclasses (one per architecture) set `arch`, `properties`, `sh_registers` and
  implement `dispatch` and `make_emulator`."""
  arch = ""
  properties: dict[str, int] = {}
  sh_registers: dict[int, tuple[str, Layout]] = {}  # byte address -> (name, fields)
  needs_priv_with_cwsr = False                      # gfx11: RSRC1.PRIV must be set when the queue has a CWSR area
  pm4_decoders = mpm4.DECODERS                      # PM4 opcode -> body decoder (gfx9 has its own RELEASE/ACQUIRE_MEM)
  sdma_layouts = msdma.LAYOUTS                      # SDMA packet layouts (gfx9: SDMA v4.4.2's)
  # gfx10+: the SDMA engines are GL2 clients (their packets carry GL2 cache policies/MTYPEs, see the FENCE model
  # below), so a copy is coherent with the same GPU's L2 and only the CU caches need invalidating after it
  sdma_writes_through_l2 = False
  # MI-series (mmhub 1.7/1.8): the SDMA write client is forced snooped, so its writes probe-invalidate L2 lines of
  # MTYPE RW/CC (Linux mmhub_v1_8.c mmhub_v1_8_init_snoop_override_regs: "SDMA writes probe-invalidates RW lines")
  sdma_writes_snooped = False
  # IP discovery: hardware id (soc15_hw_ip.h GC_HWID 11, SDMA0_HWID 42, NBIF_HWID 108) -> (major, minor, revision),
  # what amdgpu_discovery.c lists under the render node's device/ip_discovery/die/0/<hw_id>/0/
  ip_versions: dict[int, tuple[int, int, int]] = {}

  def __init__(self, kfd_: MockKFD, node: int, gpu_id: int, render_minor: int):
    self.kfd, self.node, self.gpu_id, self.render_minor = kfd_, node, gpu_id, render_minor
    self.props = {**self.properties, "drm_render_minor": render_minor}
    self.ranges: dict[int, int] = {}  # start -> end of every allocation mapped into this GPU's VM
    self.vm_generation = 0  # bumped on every map and unmap (the emulator caches memory regions against it)
    self.range_starts: list[int] = []
    self.doorbells = (ctypes.c_uint64 * 1024)()  # one 8 KiB doorbell page
    self.next_doorbell = 1
    self.vm_fd: int | None = None      # the render node fd ACQUIRE_VM bound this GPU's VM to
    self.l2_dirty, self.caches_valid, self.cu_caches_valid = False, False, False
    self.l2_lines: dict[int, int] = {}  # host-visible dwords written with a cached MTYPE: in L2, not yet in memory
    self.dispatches = self.copies = 0
    self.emu = self.make_emulator()

  # ***** VM *****
  def map_range(self, start: int, end: int) -> None:
    self.ranges[start] = end
    self.range_starts = sorted(self.ranges)
    self.vm_generation += 1

  def unmap_range(self, start: int) -> None:
    self.ranges.pop(start, None)
    self.range_starts = sorted(self.ranges)
    self.vm_generation += 1

  def check(self, addr: int, n: int, what: str) -> None:
    """GPUPageFault unless [addr, addr+n) lies in one allocation mapped into this GPU's VM."""
    starts = self.range_starts
    i = bisect.bisect_right(starts, addr) - 1
    if i < 0 or addr + n > self.ranges[starts[i]]:
      raise GPUPageFault(f"GPU page fault on {self.name}: {what} of {n} bytes at {addr:#x} is outside every "
                         "allocation mapped into this GPU's VM")

  def check_queue_buffer(self, addr: int, size: int, what: str) -> None:
    """kfd_queue.c kfd_queue_buffer_get (CREATE_QUEUE): `addr`'s page must be the first page of a BO mapped into this
    GPU's VM, and that mapping exactly `size` bytes long when `size` is a page or more (a queue buffer is a whole BO);
    else EINVAL."""
    page = addr & ~(kfd.PAGE - 1)
    if (end := self.ranges.get(page)) is None:
      raise OSError(22, f"CREATE_QUEUE: the {what} at {addr:#x} is not in the first page of a BO mapped into "
                        f"{self.name} (kfd_queue_buffer_get: the mapping must start at its page)")
    if size >= kfd.PAGE and end - page != size // kfd.PAGE * kfd.PAGE:
      raise OSError(22, f"CREATE_QUEUE: the {what} BO at {page:#x} is {end - page:#x} bytes; KFD wants exactly "
                        f"{size // kfd.PAGE * kfd.PAGE:#x} (kfd_queue_buffer_get)")

  @property
  def name(self) -> str: return f"gpu {self.gpu_id:#x} ({self.arch}, node {self.node})"

  def sysfs(self) -> str: return "".join(f"{k} {v}\n" for k, v in self.props.items())

  # ***** architecture hooks *****
  # ***** the L2 lines the host can't see *****
  def read32(self, addr: int) -> int:
    """A dword as the GPU's command processors read it: through L2 (a cached SDMA write not yet in memory)."""
    return self.l2_lines.get(addr, ctypes.c_uint32.from_address(addr).value)

  def write_back_l2(self) -> None:
    """An L2 write-back (GCR GL2_WB, gfx9 TC_WB): kernels' results and cached SDMA writes reach memory."""
    for addr, v in self.l2_lines.items(): ctypes.c_uint32.from_address(addr).value = v
    self.l2_lines.clear()
    self.l2_dirty = False

  def l2_coherent_after_sdma_write(self, copier: MockGPU, alloc: MockAlloc | None) -> bool:
    """Whether this GPU's L2 holds no stale line after `copier`'s SDMA engine wrote into `alloc`, so a dispatch here
    needs only the CU caches invalidated. This default, for an architecture without its own rule: only the copying
    GPU's own L2 saw the write, when its SDMA is a GL2 client; any other GPU may cache the memory non-coherently."""
    return copier is self and self.sdma_writes_through_l2

  def make_emulator(self) -> Any: raise NotImplementedError(f"{type(self).__name__}.make_emulator")
  def dispatch(self, q: MockQueue, dims: tuple[int, int, int], initiator: int, where: str) -> None:
    raise NotImplementedError(f"{type(self).__name__}.dispatch")
  def check_compute_queue(self, a: Any) -> None: """CREATE_QUEUE checks of a compute queue (EOP/CWSR sizes)."""

  # ***** the command processors *****
  def notice_doorbell(self, q: MockQueue) -> int:
    """The doorbell value of `q`; new work from the host, which may have written memory the caches hold, invalidates
    the cache state."""
    target = ctypes.c_uint64.from_address(q.doorbell).value
    if target != q.seen_doorbell: q.seen_doorbell, self.caches_valid, self.cu_caches_valid = target, False, False
    return target

  def run_queue(self, q: MockQueue) -> bool:
    """Run `q` up to its doorbell; True if anything ran. A failing packet is skipped (the queue goes on with the next
    one, like a GPU resetting that work) and its error raised."""
    target = self.notice_doorbell(q)
    ran = False
    while q.ib is not None or q.rptr < target:
      step = self._pm4_step(q, target) if q.qtype == kfd.QUEUE_TYPE_COMPUTE else self._sdma_step(q, target)
      if step == 0: return ran
      q.blocked, ran = "", True
    return ran

  def _ring(self, q: MockQueue, start_dw: int, n: int) -> list[int]:
    size_dw = q.ring_size // 4
    arr = (ctypes.c_uint32 * size_dw).from_address(q.ring)
    s = start_dw % size_dw
    return list(arr[s:s + n]) if s + n <= size_dw else list(arr[s:]) + list(arr[:s + n - size_dw])

  def _advance(self, q: MockQueue, n: int) -> None:
    q.rptr += n
    ctypes.c_uint64.from_address(q.rptr_addr).value = q.rptr

  # PM4
  def _pm4_step(self, q: MockQueue, target: int) -> int:
    if q.ib is not None: return self._ib_step(q)
    where = f"{self.name} queue {q.qid}, ring dword {q.rptr:#x}"
    word = self._ring(q, q.rptr, 1)[0]
    skip = min(2 + ((word >> 16) & 0x3FFF), target - q.rptr)  # on an error: past the packet, within the submission
    try:
      hdr = mpm4.decode_header(word, where)
      if q.rptr + 1 + hdr.body > target:
        raise PacketError(f"{where}: PM4 {hdr.name} header {word:#010x} claims {hdr.body} body dwords but the "
                          f"submission ends after {target - q.rptr - 1}")
      body = self._ring(q, q.rptr + 1, hdr.body)
      if not self.exec_pm4(q, hdr, body, where, in_ib=False): return 0
      self.traced(hdr, body)
    except MockGPUError:
      self._advance(q, skip)
      raise
    self._advance(q, 1 + hdr.body)
    return 1 + hdr.body

  def _ib_step(self, q: MockQueue) -> int:
    assert q.ib is not None
    addr, n, pos = q.ib
    where = f"{self.name} queue {q.qid}, indirect buffer {addr:#x} dword {pos:#x}"
    try:
      word = ctypes.c_uint32.from_address(addr + 4 * pos).value
      hdr = mpm4.decode_header(word, where)
      if pos + 1 + hdr.body > n:
        raise PacketError(f"{where}: PM4 {hdr.name} header {word:#010x} claims {hdr.body} body dwords but the "
                          f"indirect buffer ends after {n - pos - 1}")
      body = list((ctypes.c_uint32 * hdr.body).from_address(addr + 4 * (pos + 1)))
      if not self.exec_pm4(q, hdr, body, where, in_ib=True): return 0
      self.traced(hdr, body)
    except MockGPUError:
      q.ib = None  # the rest of a faulting indirect buffer is dropped
      raise
    q.ib[2] = pos + 1 + hdr.body
    if q.ib[2] >= n: q.ib = None
    return 1 + hdr.body

  def traced(self, hdr: mpm4.Header, body: list[int]) -> None:
    """Add an executed PM4 packet to the KFD's trace (when tracing): SET_SH_REG names its registers."""
    if self.kfd.trace is None or hdr.opcode == 0x10: return
    detail = ""
    if hdr.opcode == 0x76:
      base = SH_REG_BASE + 4 * (body[0] & 0xFFFF)
      detail = ",".join(self.sh_registers.get(base + 4 * i, (hex(base + 4 * i),))[0] for i in range(len(body) - 1))
    self.kfd.trace.append(("PM4", hdr.name, detail))

  def exec_pm4(self, q: MockQueue, hdr: mpm4.Header, body: list[int], where: str, in_ib: bool) -> bool:
    """Execute one PM4 packet; False when it must wait (WAIT_REG_MEM not yet satisfied)."""
    op = hdr.opcode
    if op == 0x10: return True  # NOP: the body is skipped
    if (dec := self.pm4_decoders.get(op)) is None:
      raise PacketError(f"{where}: PM4 {hdr.name} (header opcode {op:#x}) is not modelled by the mock MEC; modelled: "
                        f"NOP, {', '.join(mpm4.OPCODE_NAMES[o] for o in self.pm4_decoders)}")
    where = f"{where}: PM4 {hdr.name}"
    f = dec(body, where)
    if op == 0x76: self._set_sh_reg(q, f["reg_offset"], body[1:], f, where)
    elif op == 0x3C: return self._wait_reg_mem(q, f, where)
    elif op == 0x49: self._release_mem(f, where)
    elif op == 0x58: self._acquire_mem(f, where)
    elif op == 0x46: self._event_write(f, where)
    elif op == 0x15:
      require(self.caches_valid, where, "a dispatch with no ACQUIRE_MEM since the host or SDMA last wrote memory: "
              "the kernel could read stale kernargs, code or inputs from the GPU caches (invalidate GLI, GLK, GLV, GL1 "
              "and GL2 over the whole address space first)")
      require(self.cu_caches_valid, where, "a dispatch with no ACQUIRE_MEM since the previous dispatch wrote memory: "
              "its results are in L2, but the CUs' scalar, vector and L1 caches may hold stale lines (invalidate GLK, "
              "GLV and GL1 first)")
      try: self.dispatch(q, (f["dim_x"], f["dim_y"], f["dim_z"]), f["initiator"], where)
      except MockGPUError: raise
      except Exception as e:  # from the emulator's waves: re-raised as the dispatch's fault, the queue moves on
        self.l2_dirty, self.cu_caches_valid = True, False  # waves may have written memory before stopping
        raise ShaderFault(f"{where}: the dispatch's waves stopped: {type(e).__name__}: {e}") from e
      self.dispatches += 1
      self.kfd.dispatches += 1
      self.l2_dirty, self.cu_caches_valid = True, False
    elif op == 0x3F:
      require(not in_ib, where, "an INDIRECT_BUFFER inside an indirect buffer (the MEC runs one level)")
      require(f["valid"] == 1, where, "VALID (bit 23 of dword 3) is 0: the CP would skip the buffer")
      for k in ("chain", "offload_polling", "vmid", "pre_resume", "priv"):
        require(f[k] == 0, where, f"{k.upper()} = {f[k]} is not modelled (a user queue's IB leaves it 0)")
      require(f["ib_size"] > 0, where, "IB_SIZE is 0")
      self.check(f["addr"], 4 * f["ib_size"], "indirect buffer fetch")
      q.ib = [f["addr"], f["ib_size"], 0]
    return True

  def _set_sh_reg(self, q: MockQueue, offset: int, values: list[int], f: dict[str, int], where: str) -> None:
    require(f["vmid_shift"] == 0 and f["index"] == 0, where, "VMID_SHIFT/INDEX are not modelled (leave them 0)")
    for i, v in enumerate(values):
      addr = SH_REG_BASE + 4 * (offset + i)
      if (reg := self.sh_registers.get(addr)) is None:
        raise PacketError(f"{where}: SH register {addr:#x} (dword {addr // 4:#x}) is not a compute register the "
                          f"{self.arch} mock models")
      reg[1].decode(v, f"{where}: {reg[0]} = {v:#010x}")
      q.regs[addr] = v

  def _wait_reg_mem(self, q: MockQueue, f: dict[str, int], where: str) -> bool:
    if f["mem_space"] == 0: return self._hdp_flush(f, where)
    require(f["operation"] == 0, where, f"OPERATION {f['operation']} is not modelled (0: WAIT_REG_MEM)")
    require(f["mes_intr_pipe"] == 0 and f["mes_action"] == 0 and f["optimize_ace_offload_mode"] == 0, where,
            "the MES/offload fields are for the MES firmware; a user queue leaves them 0")
    self.check(f["addr"], 4, "WAIT_REG_MEM poll")
    v = self.read32(f["addr"]) & f["mask"]
    if compare(f["function"], v, f["reference"]): return True
    q.blocked = (f"WAIT_REG_MEM: (*(u32*){f['addr']:#x} = {v}) & {f['mask']:#x} "
                 f"{mpm4.WAIT_FUNCTIONS[f['function']]} {f['reference']} is false")
    return False

  def _hdp_flush(self, f: dict[str, int], where: str) -> bool:
    """WAIT_REG_MEM on registers: the one pair a user queue writes and polls is the HDP flush (amdgpu's
    gfx_v11_0_ring_emit_hdp_flush / gfx_v9_0_ring_emit_hdp_flush: write GPU_HDP_FLUSH_REQ, wait until
    GPU_HDP_FLUSH_DONE & mask == ref). The mock has no HDP (host writes land in memory at once), so the flush is done
    at once: DONE reads back the requested bits."""
    req, done = HDP_FLUSH_REQ_DONE
    require((f["addr"], f["reg_done"]) == (req, done) and f["operation"] == 1, where,
            f"MEM_SPACE REGISTER: only the HDP flush is modelled (operation 1 WR_WAIT_WR_REG, write {req:#x} "
            f"GPU_HDP_FLUSH_REQ, poll {done:#x} GPU_HDP_FLUSH_DONE); got operation {f['operation']}, "
            f"registers {f['addr']:#x}/{f['reg_done']:#x}")
    require(f["mes_intr_pipe"] == 0 and f["mes_action"] == 0 and f["optimize_ace_offload_mode"] == 0, where,
            "the MES/offload fields are for the MES firmware; a user queue leaves them 0")
    require(compare(f["function"], f["reference"] & f["mask"], f["reference"]), where,
            f"HDP flush: DONE & {f['mask']:#x} {mpm4.WAIT_FUNCTIONS[f['function']]} {f['reference']:#x} can never "
            "hold (DONE reads back the requested bits)")
    return True

  def _release_mem(self, f: dict[str, int], where: str) -> None:
    ev, idx = f["event_type"], f["event_index"]
    eop = {5: (4, 20, 40), 6: (47,)}[idx]  # end-of-pipe timestamp events; shader-done: CS_DONE
    require(ev in eop, where, f"EVENT_TYPE {ev} ({mpm4.EVENT_TYPES.get(ev, 'not a compute event')}) with EVENT_INDEX "
            f"{idx}; valid: {', '.join(f'{e} {mpm4.EVENT_TYPES[e]}' for e in eop)}")
    for k in ("execute", "gl2_discard", "mes_intr_pipe", "mes_action_id"):
      require(f[k] == 0, where, f"{k.upper()} = {f[k]} is not modelled")
    require(f["gl2_range"] == 0, where, f"GL2_RANGE {f['gl2_range']}: only whole-cache (0, ALL) actions are modelled")
    require(not f["glm_wb"] or f["glm_inv"], where, "GLM_WB without GLM_INV (amdgpu: GLM_INV must be set with GLM_WB)")
    require(f["dst_sel"] in (0, 1), where, f"DST_SEL {mpm4.DST_SEL[f['dst_sel']]} is not modelled")
    require(f["data_sel"] <= 3, where, f"DATA_SEL {mpm4.DATA_SEL[f['data_sel']]} is not modelled")
    require(f["int_sel"] in (0, 2), where, f"INT_SEL {f['int_sel']} ({mpm4.INT_SEL[f['int_sel']]}) is not modelled; "
            "KFD reads the event mailbox in the interrupt handler, so the interrupt must follow the confirmed write "
            "(2, SEND_INTERRUPT_AFTER_WRITE_CONFIRM)")
    if f["gl2_wb"]: self.write_back_l2()
    self._release_write(f, where, "amdgpu's gfx11 fence writes back and invalidates: SEQ, GL2_WB/INV/US, "
                        "GL1/GLV/GLM_INV, GLM_WB")

  def _release_write(self, f: dict[str, int], where: str, hint: str) -> None:
    """RELEASE_MEM's write (DATA_SEL) and interrupt (INT_SEL 2), once the cache actions were applied: a host-visible
    write while L2 still holds a kernel's results is an error (`hint`: the cache actions a driver should use)."""
    if (sel := f["data_sel"]):
      n = 4 if sel == 1 else 8
      addr = f["addr"]
      self.check(addr, n, "RELEASE_MEM write")
      if self.l2_dirty and self.kfd.host_visible(addr):
        raise PacketError(f"{where}: writes host-visible memory at {addr:#x} (a signal the host reads) after a "
                          f"dispatch without an L2 write-back: the kernel's results may still sit in L2 when the host "
                          f"sees the value ({hint})")
      val = f["data"] if sel == 2 else f["data"] & 0xFFFFFFFF if sel == 1 else self.timestamp()
      for a in range(addr, addr + n, 4): self.l2_lines.pop(a, None)  # the write replaces any cached line there
      (ctypes.c_uint32 if n == 4 else ctypes.c_uint64).from_address(addr).value = val
    if f["int_sel"] == 2: self.kfd.interrupt(self, f["int_ctxid"], 32)

  def _acquire_mem(self, f: dict[str, int], where: str) -> None:
    require(f["range_is_pa"] == 0 and f["gl2_discard"] == 0, where, "RANGE_IS_PA / GL2_DISCARD are not modelled")
    require(not f["glm_wb"] or f["glm_inv"], where, "GLM_WB without GLM_INV (amdgpu: GLM_INV must be set with GLM_WB)")
    whole = f["coher_base"] == 0 and f["coher_size"] >= (1 << 40) - 1 and f["gl1_range"] == 0 and \
      f["gl2_range"] == 0 and f["gli_inv"] in (0, 1)
    require(whole, where, f"COHER_BASE {f['coher_base']:#x} * 256 / COHER_SIZE {f['coher_size']:#x} * 256 with GL1/GL2 "
            f"range modes {f['gl1_range']}/{f['gl2_range']} and GLI_INV {f['gli_inv']}: only actions over the whole "
            "48-bit address space are modelled")
    if f["gl2_wb"]: self.write_back_l2()
    if all(f[k] for k in ("glk_inv", "glv_inv", "gl1_inv")):
      self.cu_caches_valid = True
      if f["gli_inv"] == 1 and f["gl2_inv"]: self.caches_valid = True

  def _event_write(self, f: dict[str, int], where: str) -> None:
    require(f["event_type"] == 7 and f["event_index"] == 4, where, f"EVENT_TYPE {f['event_type']} "
            f"({mpm4.EVENT_TYPES.get(f['event_type'], '?')}) with EVENT_INDEX {f['event_index']}: a compute queue's "
            "EVENT_WRITE without an address is CS_PARTIAL_FLUSH (7) with EVENT_INDEX 4")
    require(f["offload_enable"] == 0, where, "OFFLOAD_ENABLE is not modelled")

  # SDMA
  def _sdma_step(self, q: MockQueue, target: int) -> int:
    where = f"{self.name} queue {q.qid}, ring byte {q.rptr:#x}"
    header = self._ring(q, q.rptr // 4, 1)[0]
    skip = target - q.rptr  # on an error: past the packet when its length is known, else the rest of the submission
    try:
      name, n = msdma.packet_of(header, where)
      skip = min(4 * n, skip)
      if q.rptr + 4 * n > target:
        raise PacketError(f"{where}: SDMA {name} takes {n} dwords but the submission ends after "
                          f"{(target - q.rptr) // 4}")
      words = self._ring(q, q.rptr // 4, n)
      if not self.exec_sdma(q, name, words, f"{where}: SDMA {name}"): return 0
      if self.kfd.trace is not None: self.kfd.trace.append(("SDMA", name, ""))
    except MockGPUError:
      self._advance(q, skip)
      raise
    self._advance(q, 4 * n)
    return 4 * n

  def exec_sdma(self, q: MockQueue, name: str, words: list[int], where: str) -> bool:
    f = msdma.decode(name, words, where, self.sdma_layouts)
    if name == "COPY_LINEAR":
      for k in ("encrypt", "tmz", "backwards", "broadcast", "dst_sw", "src_sw"):
        require(f[k] == 0, where, f"{k.upper()} = {f[k]} is not modelled")
      n, src, dst = f["count"] + 1, f["dw3"] | (f["dw4"] << 32), f["dw5"] | (f["dw6"] << 32)
      self.check(src, n, "SDMA copy read")
      self.check(dst, n, "SDMA copy write")
      ctypes.memmove(dst, src, n)
      self.copies += 1
      dst_alloc = self.kfd.alloc_at(dst)
      for g in self.kfd.gpus:
        g.cu_caches_valid = False  # no SDMA write reaches the CUs' own caches
        if not g.l2_coherent_after_sdma_write(self, dst_alloc): g.caches_valid = False
    elif name == "FENCE":
      require(f.get("gpa", 0) == 0, where, "GPA (a physical address) is not modelled")
      addr = f["dw1"] | (f["dw2"] << 32)
      require(addr % 4 == 0, where, f"address {addr:#x} is not dword aligned")
      self.check(addr, 4, "SDMA fence write")
      # SDMA v4.4.2 has no MTYPE in the header (the page's own memory type applies: the signal page is uncached)
      if f.get("mtype", msdma.MTYPE_UC) != msdma.MTYPE_UC and self.kfd.host_visible(addr):
        self.l2_lines[addr] = f["dw3"]  # a cached write: in L2 until a write-back (see the module docstring)
      else:
        self.l2_lines.pop(addr, None)
        ctypes.c_uint32.from_address(addr).value = f["dw3"]
    elif name == "TRAP": self.kfd.interrupt(self, f["int_context"], 28)
    elif name == "POLL_REGMEM":
      require(f["mem_poll"] == 1 and f["hdp_flush"] == 0, where, "register polls / HDP flushes are not modelled")
      require(f["retry_count"] == 0xFFF, where,
              f"RETRY_COUNT {f['retry_count']}: only 0xFFF (poll forever) is modelled")
      addr = f["dw1"] | (f["dw2"] << 32)
      require(addr % 4 == 0, where, f"address {addr:#x} is not dword aligned")
      self.check(addr, 4, "SDMA poll")
      v = self.read32(addr) & f["dw4"]
      if not compare(f["func"], v, f["dw3"]):
        q.blocked = (f"POLL_REGMEM: (*(u32*){addr:#x} = {v}) & {f['dw4']:#x} {msdma.FUNCS[f['func']]} {f['dw3']} "
                     "is false")
        return False
    elif name.startswith("TIMESTAMP"):
      addr = (f["write_addr_31_3"] << 3) | (f["dw2"] << 32)
      self.check(addr, 8, "SDMA timestamp write")
      ctypes.c_uint64.from_address(addr).value = self.timestamp()
    return True  # NOP

  @staticmethod
  def timestamp() -> int: return time.perf_counter_ns() // (1_000_000_000 // TIMESTAMP_HZ)


def compare(func: int, v: int, ref: int) -> bool:
  """WAIT_REG_MEM / POLL_REGMEM compare functions (unsigned): 0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >."""
  return (True, v < ref, v <= ref, v == ref, v != ref, v >= ref, v > ref)[func]


ARCHS: dict[str, type[MockGPU]] = {}  # LLVM target name -> MockGPU subclass (filled by the arch modules)
