"""The AMD device: `AMD[:n]` (the KFD driver of a real GPU) and `MOCK+AMD[:n]` (the same driver code against `mock/`).

`AMDDevice(HCQCompiled)` opens KFD through a `FileIOInterface` (`KFDIface`), creates one PM4 compute queue and one
SDMA copy queue (rings in host-visible memory, doorbells mmapped from /dev/kfd), keeps signals in a host-visible page,
loads code objects (`AMDProgram`) and copies through host staging buffers (`AMDAllocator`); a copy between two AMD
devices of the process runs on the destination's SDMA engine over a peer mapping of the source memory. A thread
waiting for a signal spins briefly, then sleeps in KFD's WAIT_EVENTS until the GPU's interrupt for the device's event.
Without an AMD GPU, `AMDDevice("AMD")` raises DeviceUnavailableError("no /dev/kfd ...; for an emulated AMD GPU use
DEV=MOCK+AMD"), which the registry reports as it is (no traceback); `DEV=MOCK+AMD` always works (an in-process pair
of gfx1100s running code in the RDNA3 emulator), and `DEV=MOCK+AMD:LLVM:gfx942` gives a pair of MI300s (gfx942:
wave64, the gfx9 PM4 forms of `AMDComputeQueue9`, code run in the CDNA3 emulator). A gfx942 node spanning several
XCCs (an MI300X in SPX mode) runs its PM4 queue on one XCC, as KFD schedules PM4 queues there (`PM4_TARGET_XCC`;
see the MI300 section of the README).
"""
from __future__ import annotations

import ctypes
import struct
import time
from typing import Any

from tiny_uop.hcq import MAP_SHARED, PROT_READ, PROT_WRITE, ArgsLayout, FileIOInterface, HCQAllocator, HCQBuffer, \
  HCQCompiled, HCQProgram, HCQSignal, hi32, lo32
from tiny_uop.hcq2 import HCQ2Graph
from tiny_uop.target import Target

from tiny_runtime_amd import kfd, pm4
from tiny_runtime_amd.elf import ELF
from tiny_runtime_amd.encode import pm_lower
from tiny_runtime_amd.kfd import KFD_PATH, KFDEvent, KFDIface
from tiny_runtime_amd.pm4 import AMDComputeQueue, AMDComputeQueue9
from tiny_runtime_amd.sdma import AMDCopyQueue, AMDCopyQueue9

__all__ = ["AMDDevice", "AMDProgram", "AMDSignal", "AMDAllocator", "KFD_PATH"]

SIGNAL_PAGE = 0x10000
KERNARGS_SIZE = 1 << 20
SPIN_S = 0.002        # a waiter polls this long before it sleeps in KFD's WAIT_EVENTS
SLEEP_MS = 1000       # the longest single sleep (the loop then re-checks the value)
PM4_TARGET_XCC = 0    # the XCC (in the node's partition) that runs the PM4 compute queue on a multi-XCC node


class AMDSignal(HCQSignal):
  """A signal of an AMD device. Queues that write it also write `event`'s mailbox and raise its interrupt, so a waiter
  first spins for SPIN_S, then sleeps in KFD's WAIT_EVENTS instead of burning a CPU core (on the mock: at once,
  since the mock GPU runs inside that call)."""

  def __init__(self, addr: int, dev: AMDDevice, value: int = 0):
    self.dev, self.event = dev, dev.event
    super().__init__(addr, value, timestamp_divider=100.0)  # gfx11 timestamps tick at 100 MHz

  def _idle(self, waited_s: float, left_s: float) -> None:
    if not self.dev.mock and waited_s < SPIN_S: return time.sleep(0)
    self.dev.iface.wait_event(self.event, int(min(left_s * 1000, SLEEP_MS)))


class AMDRing:
  """A user-mode queue: a ring buffer, read/write pointers and a doorbell (PM4: pointers in dwords; SDMA: bytes)."""

  def __init__(self, dev: AMDDevice, qtype: int, size: int = 1 << 16):
    self.dev, self.qtype, self.size = dev, qtype, size
    iface = dev.iface
    self.ring = iface.alloc(size, host=True, uncached=True)
    self.ptrs = iface.alloc(0x1000, host=True, uncached=True)  # rptr at +0, wptr at +8
    extra: dict[str, int] = {}
    self.ctx: HCQBuffer | None = None
    if qtype == kfd.QUEUE_TYPE_COMPUTE:
      # the EOP buffer and the CWSR area, sized as the kernel checks them (kfd.cwsr_sizes)
      cw = iface.node.cwsr
      self.eop = iface.alloc(max(cw.eop_buffer_size if cw else 0x1000, 0x1000))
      extra = {"eop_buffer_address": self.eop.va_addr, "eop_buffer_size": cw.eop_buffer_size if cw else 0x1000}
      if cw is not None:
        self.ctx = iface.alloc(cw.alloc_size, host=True)
        for x in range(cw.num_xcc):  # each XCC's header: where the debugger area is, relative to this header
          ctypes.memmove(self.ctx.va_addr + x * cw.ctx_save_restore_size + 16,
                         struct.pack("<II", (cw.num_xcc - x) * cw.ctx_save_restore_size,
                                     cw.debug_memory_size * cw.num_xcc), 8)
        extra.update(ctx_save_restore_address=self.ctx.va_addr, ctx_save_restore_size=cw.ctx_save_restore_size,
                     ctl_stack_size=cw.ctl_stack_size)
    # queue_percentage bits 7:0 the percentage, bits 15:8 the XCC a PM4 queue runs on in a multi-XCC partition
    # (amdkfd "Add PM4 target XCC": "unlike AQL queues, the PM4 queue will be only processed in one XCC";
    # kfd_chardev.c set_queue_properties_from_user, kfd_mqd_manager_v9.c init_mqd_v9_4_3 pm4_target_xcc_in_xcp)
    pct = 100 | (PM4_TARGET_XCC << 8 if qtype == kfd.QUEUE_TYPE_COMPUTE else 0)
    q = iface.create_queue(ring_base_address=self.ring.va_addr, ring_size=size, queue_type=qtype, queue_percentage=pct,
                           queue_priority=7, read_pointer_address=self.ptrs.va_addr,
                           write_pointer_address=self.ptrs.va_addr + 8, **extra)
    self.queue_id = q.queue_id
    page = q.doorbell_offset & ~0x1FFF
    self.doorbell_page = iface.kfd.mmap(0, 0x2000, PROT_READ | PROT_WRITE, MAP_SHARED, page)
    self.doorbell = self.doorbell_page + (q.doorbell_offset & 0x1FFF)
    self.wptr = 0

  @property
  def rptr(self) -> int: return ctypes.c_uint64.from_address(self.ptrs.va_addr).value

  def submit(self, dwords: list[int]) -> None:
    """Copy `dwords` into the ring (wrapping), publish the write pointer and ring the doorbell."""
    per = 1 if self.qtype == kfd.QUEUE_TYPE_COMPUTE else 4  # pointer increment per dword
    cap = self.size // 4
    if len(dwords) > cap: raise ValueError(f"a submission of {len(dwords)} dwords does not fit a ring of {cap}")
    while (self.wptr - self.rptr) // per + len(dwords) > cap: self.dev.progress()
    ring = (ctypes.c_uint32 * cap).from_address(self.ring.va_addr)
    start = (self.wptr // per) % cap
    first = min(len(dwords), cap - start)
    # typeshed types a ctypes array slice as a list of c_uint32 | int (invariant): ints are what it takes
    ring[start:start + first] = dwords[:first]  # type: ignore[assignment]
    if first < len(dwords): ring[:len(dwords) - first] = dwords[first:]  # type: ignore[assignment]
    self.wptr += len(dwords) * per
    ctypes.c_uint64.from_address(self.ptrs.va_addr + 8).value = self.wptr
    ctypes.c_uint64.from_address(self.doorbell).value = self.wptr


class AMDProgram(HCQProgram):
  """A code object loaded into GPU memory: its kernel descriptor gives the entry point and the register values.

  Argument region (`args_layout`): a 64-byte `hsa_kernel_dispatch_packet_t` prefix (for kernels that read their
  sizes through dispatch_ptr; `fill_launch` writes it), then the kernarg segment: buffer addresses, then int32 values
  (at least the descriptor's kernarg_size bytes).

  COMPUTE_PGM_RSRC1.PRIV is set on gfx11: there shaders run privileged (the ROCm stack's AQL dispatch does it, see
  LLVM's gfx11 trap lowering, llvm-project#85854) and the CWSR trap handler that saves a preempted wave relies on it;
  a PM4 dispatch must set it itself."""

  def __init__(self, dev: AMDDevice, name: str, lib: bytes, **kwargs: Any):
    super().__init__(dev, name, lib)
    self.dev: AMDDevice = dev
    elf = ELF.parse(lib)
    image = elf.image()
    self.kname, kd_off, self.kd = elf.kernel(name if name + ".kd" in elf.symbols else None)
    if self.kd.wave32 != (dev.wave_size == 32):
      raise RuntimeError(f"kernel {self.kname} is a wave{32 if self.kd.wave32 else 64} code object; {dev.arch} runs "
                         f"wave{dev.wave_size} (compile for this device's arch)")
    # scratch: the device's scratch buffer grows (now, at load) to this kernel's private bytes per work-item
    self.private_size = self.kd.private_segment_fixed_size if self.kd.rsrc2 & 1 else 0  # RSRC2.SCRATCH_EN
    if self.private_size: dev.ensure_scratch(self.private_size)
    self.lib_buf = dev.iface.alloc(len(image) + 0x100, host=True)
    self.lib_buf.host_view()[:len(image)] = image
    self.kd_addr = self.lib_buf.va_addr + kd_off
    self.entry_addr = self.kd_addr + self.kd.kernel_code_entry_byte_offset
    if self.entry_addr % 256:
      raise RuntimeError(f"kernel {self.kname}: entry {self.entry_addr:#x} is not 256-byte aligned")
    # the descriptor leaves RSRC2.LDS_SIZE to the dispatcher (AQL takes it from the packet): 512-byte granules on gfx11
    lds = (self.kd.group_segment_fixed_size + 511) // 512
    if lds > 0x80:
      raise RuntimeError(f"kernel {self.kname} wants {self.kd.group_segment_fixed_size} bytes of LDS; max 65536")
    priv = pm4.RSRC1_PRIV if dev.arch.startswith("gfx11") else 0
    lds_mask = pm4.RSRC2_LDS_SIZE_MASK << pm4.RSRC2_LDS_SIZE_SHIFT
    self.rsrc1, self.rsrc2 = self.kd.rsrc1 | priv, (self.kd.rsrc2 & ~lds_mask) | (lds << pm4.RSRC2_LDS_SIZE_SHIFT)
    self.rsrc3 = self.kd.rsrc3
    self.groups = self.kd.user_sgprs()
    supported = ("kernarg_segment_ptr", "dispatch_ptr", "flat_scratch_init", "private_segment_size")
    if unsupported := [g for g, _ in self.groups if g not in supported]:
      raise RuntimeError(f"kernel {self.kname} wants user SGPRs {unsupported}; supported: {', '.join(supported)}")

  def scratch(self) -> tuple[int, int] | None:
    """(scratch buffer address, COMPUTE_TMPRING_SIZE) for a dispatch of this kernel; None without scratch."""
    if not self.private_size or self.dev.scratch_buf is None: return None
    return self.dev.scratch_buf.va_addr, self.dev.tmpring_size

  def user_data(self, args_addr: Any) -> list[Any]:
    """The user SGPR values in descriptor order; the AQL dispatch packet sits 64 bytes before the kernargs;
    flat_scratch_init is the scratch buffer's address (gfx10-style kernels add their wave offset to it)."""
    out: list[Any] = []
    for g, _ in self.groups:
      if g == "private_segment_size":
        out.append(self.private_size)
        continue
      scratch = self.dev.scratch_buf.va_addr if self.dev.scratch_buf is not None else 0
      a = args_addr if g == "kernarg_segment_ptr" else args_addr - 64 if g == "dispatch_ptr" else scratch
      out += [lo32(a), hi32(a)]
    return out

  def args_layout(self, n_bufs: int, n_vals: int) -> ArgsLayout:
    return ArgsLayout(64 + max(8 * n_bufs + 4 * n_vals, self.kd.kernarg_size), 64,
                      tuple(64 + 8 * i for i in range(n_bufs)), tuple(64 + 8 * n_bufs + 4 * i for i in range(n_vals)))

  def fill_args(self, base: int, bufs: Any, vals: Any) -> int:
    args = struct.pack(f"<{len(bufs)}Q{len(vals)}i", *bufs, *vals)
    ctypes.memmove(base + 64, args, len(args))
    return base + 64

  def fill_launch(self, base: int, global_size: Any, local_size: Any) -> None:
    """The start of the hsa_kernel_dispatch_packet_t: setup (3 dims), work-group size, grid size in work-items."""
    pkt = struct.pack("<HHHHHHIIIII", 0, 3, *local_size, 0, *(g * l for g, l in zip(global_size, local_size)), 0, 0)
    ctypes.memmove(base, pkt, len(pkt))

  def launch_fields(self, global_size: Any, local_size: Any) -> list[tuple[int, int, Any]]:
    """`fill_launch`'s fields: workgroup_size_x/y/z (16 bits at bytes 4, 6, 8), grid_size_x/y/z in work-items (32 bits
    at bytes 12, 16, 20) of hsa_kernel_dispatch_packet_t."""
    return [*((8 * (4 + 2 * a), 16, local_size[a]) for a in range(3)),
            *((8 * (12 + 4 * a), 32, global_size[a] * local_size[a]) for a in range(3))]

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size or (1, 1, 1)) + (1, 1, 1))[:3]
    dev = self.dev
    base = dev.kernargs_alloc(self.args_layout(len(bufs), len(vals)).size)
    self.fill_launch(base, gs, ls)
    addr = self.fill_args(base, [b.va_addr for b in bufs], vals)
    q = dev.hw_compute_queue_t().wait(dev.timeline_signal, dev.timeline_value - 1).memory_barrier()
    if wait: q.timestamp(dev.time_signals[0])
    q.exec(self, addr, gs, ls)
    if wait: q.timestamp(dev.time_signals[1])
    q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
    if not wait: return None
    dev.synchronize()
    return (dev.time_signals[1].timestamp - dev.time_signals[0].timestamp) / 1e6


class AMDAllocator(HCQAllocator["AMDDevice"]):
  """`HCQAllocator` plus copies from another AMD device of this process (`_transfer(..., src_dev=)`)."""

  def _transfer(self, dest: HCQBuffer, src: HCQBuffer, size: int, src_dev: Any = None) -> None:
    """Copy `size` bytes from `src` into `dest` (this device's memory). From another AMD device: the copy runs on this
    device's SDMA engine over a peer mapping of `src` (MAP_MEMORY_TO_GPU with this GPU's id), after the work queued on
    both devices; the source device's later work (which may reuse `src`) waits for it. Nothing blocks the host."""
    dev = self.dev
    if src_dev is None or src_dev is dev: return super()._transfer(dest, src, size)
    if not isinstance(src_dev, AMDDevice) or src_dev.iface.proc is not dev.iface.proc:
      raise ValueError(f"{dev.device}: can't copy from {getattr(src_dev, 'device', src_dev)!r}: not an AMD device of "
                       "the same KFD process")
    dev.peer_link(src_dev)
    dev.iface.map(src)
    q = dev.hw_copy_queue_t().wait(src_dev.timeline_signal, src_dev.timeline_value - 1) \
      .wait(dev.timeline_signal, dev.timeline_value - 1).copy(dest.va_addr, src.va_addr, size)
    q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
    src_dev.hw_compute_queue_t().wait(dev.timeline_signal, dev.timeline_value - 1) \
      .signal(src_dev.timeline_signal, src_dev.next_timeline()).submit(src_dev)


  def _peer_copy(self, dest: HCQBuffer, src: HCQBuffer, size: int, src_dev: Any) -> None:
    """The engine's COPY from another device of this backend (docs/PLUGINS.md): `_transfer` from `src_dev`."""
    self._transfer(dest, src, size, src_dev=src_dev)


def dev_arch(device: str) -> str | None:
  """The arch DEV names for `device` or, failing that, for another index of the same device (`DEV=MOCK+AMD:LLVM:gfx942`
  gives gfx942 for MOCK+AMD and MOCK+AMD:1), else None."""
  from tiny_uop.helpers import DEV
  from tiny_uop.plugins import Device
  t = Device.target(device)
  if t.arch is not None: return t.arch
  dev = str(DEV.value or "").strip()
  return next((d.arch for d in (Target.parse_list(dev) if dev else ()) if d.base == t.base and d.arch), None)


class AMDDevice(HCQCompiled):
  """``AMD[:n]`` (KFD) and ``MOCK+AMD[:n]`` (mock KFD + RDNA3 emulator; with a gfx942 DEV arch, CDNA3 emulator)."""
  hw_compute_queue_t = AMDComputeQueue
  hw_copy_queue_t = AMDCopyQueue
  pm_lower = pm_lower  # HCQ2's encoder (encode.py)

  def __init__(self, device: str):
    target = Target.parse(device).check_interface()
    fio: type[FileIOInterface] = FileIOInterface
    self._driver: Any = None
    self.mock = target.interface == "MOCK"
    want = dev_arch(device)
    if self.mock:  # the arch in DEV picks the mocked GPUs: MOCK+AMD:LLVM:gfx942 is a process with four gfx942s
      from tiny_runtime_amd.mock.driver import mock_fileio
      fio = mock_fileio(want)
      self._driver = fio.kfd_fn()
    self.iface = KFDIface(target.indices[0] if target.indices else 0, fio)
    node = self.iface.node
    if want is not None and want != node.arch:
      raise RuntimeError(f"{device}: DEV asks for arch {want} but this GPU is {node.arch}")
    self.wave_size = 64 if node.arch.startswith("gfx9") else 32
    if self.wave_size == 64: self.hw_compute_queue_t, self.hw_copy_queue_t = AMDComputeQueue9, AMDCopyQueue9
    self.event: KFDEvent = self.iface.create_event()
    self.signal_page = self.iface.alloc(SIGNAL_PAGE, host=True, uncached=True)
    base = self.signal_page.va_addr
    self._free_signals = list(range(base, base + SIGNAL_PAGE, HCQSignal.SIZE))[::-1]
    self.kernargs = self.iface.alloc(KERNARGS_SIZE, host=True)
    self._kernargs_ptr = 0
    self.scratch_buf: HCQBuffer | None = None  # grows on demand (ensure_scratch); earlier ones stay allocated
    self.scratch_wave_bytes, self.tmpring_size = 0, 0
    self._old_scratch: list[HCQBuffer] = []
    from tiny_codegen.renderer.amdgpu import AMDGPURenderer
    self._peers: set[int] = set()
    super().__init__(device, AMDAllocator(self), [AMDGPURenderer], AMDProgram, HCQ2Graph, arch=self.iface.node.arch)
    self.time_signals = [self.new_signal(), self.new_signal()]
    self.compute_ring = AMDRing(self, kfd.QUEUE_TYPE_COMPUTE)
    self.copy_ring = AMDRing(self, kfd.QUEUE_TYPE_SDMA)

  def hcq_submitter(self, engine: str) -> Any:
    """HCQ2's submit: the parts' dwords copied into the compute (PM4) or copy (SDMA) ring, one doorbell write (AMD's
    encoder runs bound command buffers through INDIRECT_BUFFER packets, so every part is a list of dwords)."""
    ring = {"compute": self.compute_ring, "copy": self.copy_ring}[engine]

    def submit(parts: list) -> None:
      if len(parts) == 1: return ring.submit(parts[0])
      dwords: list[int] = []
      for p in parts:
        if not isinstance(p, list): raise ValueError(f"{self.device}: a submission part {p!r} is not a list of dwords")
        dwords += p
      ring.submit(dwords)
    return submit

  def progress(self) -> None:
    """Let the mock GPU run (no-op on real hardware, which runs by itself)."""
    if self._driver is not None: self._driver.process()

  def new_signal(self, value: int = 0) -> AMDSignal:
    if not self._free_signals:
      raise RuntimeError(f"{self.device}: all {SIGNAL_PAGE // HCQSignal.SIZE} signals are in use")
    return AMDSignal(self._free_signals.pop(), self, value)

  def peer_link(self, other: AMDDevice) -> None:
    """Map each device's signal page into the other's VM, so either GPU's queues can wait for the other's timeline."""
    if id(other) in self._peers: return
    self.iface.map(other.signal_page)
    other.iface.map(self.signal_page)
    self._peers.add(id(other))
    other._peers.add(id(self))

  def _gpu_alloc(self, size: int, host: bool = False) -> HCQBuffer: return self.iface.alloc(max(size, 1), host=host)
  def _gpu_free(self, buf: HCQBuffer) -> None: self.iface.free(buf)

  def ensure_scratch(self, lane_bytes: int) -> None:
    """Make the scratch buffer hold `lane_bytes` private bytes per work-item for every wave slot of the GPU.

    Per wave: lane_bytes * 32 rounded up to 256 bytes (COMPUTE_TMPRING_SIZE.WAVESIZE counts 256-byte units on gfx11).
    On gfx11 TMPRING_SIZE.WAVES is the wave slots of ONE shader engine (its CUs * max_slots_scratch_cu, at most 4095):
    each engine's waves address their own WAVES * WAVESIZE slice, so the buffer holds shader_engines of them. It
    grows at least 2x at a time; a replaced buffer stays allocated, because command buffers recorded before (JIT
    graphs) still point at it and it is big enough for their kernels."""
    gran, bits = (pm4.TMPRING_WAVESIZE_GRANULE_GFX9, 13) if self.wave_size == 64 else (256, 15)
    wave = (lane_bytes * self.wave_size + gran - 1) // gran * gran
    if wave <= self.scratch_wave_bytes: return
    wave = max(wave, 2 * self.scratch_wave_bytes)
    if wave // gran >= 1 << bits:
      raise RuntimeError(f"{self.device}: {lane_bytes} bytes of scratch per work-item is more than the "
                         f"{((1 << bits) - 1) * gran // self.wave_size} a {self.arch} wave can have")
    node = self.iface.node
    # gfx11: WAVES counts one shader engine's slots (each engine addresses its own slice); gfx9: the whole GPU's
    engines = node.shader_engines if self.wave_size == 32 else 1
    # the PM4 queue runs on one XCC of a multi-XCC node (see AMDRing): that XCC's CUs hold its waves
    cus = node.cu_count // node.num_xcc
    waves_per_se = min(cus // engines * dict(node.props).get("max_slots_scratch_cu", 32), 4095)
    if self.scratch_buf is not None: self._old_scratch.append(self.scratch_buf)
    self.scratch_buf = self.iface.alloc(engines * waves_per_se * wave)
    self.scratch_wave_bytes, self.tmpring_size = wave, waves_per_se | (wave // gran) << 12
