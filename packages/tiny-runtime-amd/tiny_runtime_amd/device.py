"""The AMD device: `AMD` (the KFD driver of a real GPU) and `MOCK+AMD` (the same driver code against `mock/`).

`AMDDevice(HCQCompiled)` opens KFD through a `FileIOInterface` (`KFDIface`), creates one PM4 compute queue and one
SDMA copy queue (rings in host-visible memory, doorbells mmapped from /dev/kfd), keeps signals in a host-visible page,
loads code objects (`AMDProgram`) and copies through host staging buffers (`HCQAllocator`).
Without an AMD GPU, `AMDDevice("AMD")` raises DeviceUnavailableError("no /dev/kfd ...; for an emulated AMD GPU use
DEV=MOCK+AMD"), which the registry reports as it is (no traceback); `DEV=MOCK+AMD` always works (an in-process
gfx1100 with the RDNA3 emulator).
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any

from tiny_uop.hcq import MAP_SHARED, PROT_READ, PROT_WRITE, ArgsLayout, FileIOInterface, HCQAllocator, HCQBuffer, \
  HCQCompiled, HCQGraph, HCQProgram, HCQSignal
from tiny_uop.target import Target

from tiny_runtime_amd import kfd
from tiny_runtime_amd.elf import ELF
from tiny_runtime_amd.kfd import KFD_PATH, KFDIface
from tiny_runtime_amd.pm4 import AMDComputeQueue
from tiny_runtime_amd.sdma import AMDCopyQueue

__all__ = ["AMDDevice", "AMDProgram", "KFD_PATH"]

SIGNAL_PAGE = 0x10000
KERNARGS_SIZE = 1 << 20


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
    q = iface.ioctl("CREATE_QUEUE", ring_base_address=self.ring.va_addr, ring_size=size, gpu_id=iface.node.gpu_id,
                    queue_type=qtype, queue_percentage=100, queue_priority=7,
                    read_pointer_address=self.ptrs.va_addr, write_pointer_address=self.ptrs.va_addr + 8, **extra)
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
    ring[start:start + first] = dwords[:first]
    if first < len(dwords): ring[:len(dwords) - first] = dwords[first:]
    self.wptr += len(dwords) * per
    ctypes.c_uint64.from_address(self.ptrs.va_addr + 8).value = self.wptr
    ctypes.c_uint64.from_address(self.doorbell).value = self.wptr


class AMDProgram(HCQProgram):
  """A code object loaded into GPU memory: its kernel descriptor gives the entry point and the register values.

  Argument region (`args_layout`): a 64-byte `hsa_kernel_dispatch_packet_t` prefix (for kernels that read their
  sizes through dispatch_ptr; `fill_launch` writes it), then the kernarg segment: buffer addresses, then int32 values
  (at least the descriptor's kernarg_size bytes)."""

  def __init__(self, dev: AMDDevice, name: str, lib: bytes, **kwargs: Any):
    super().__init__(dev, name, lib)
    self.dev: AMDDevice = dev
    elf = ELF.parse(lib)
    image = elf.image()
    self.kname, kd_off, self.kd = elf.kernel(name if name + ".kd" in elf.symbols else None)
    if not self.kd.wave32:
      raise RuntimeError(f"kernel {self.kname}: wave64 code objects are not supported (gfx11 runs wave32)")
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
    self.rsrc1, self.rsrc2, self.rsrc3 = self.kd.rsrc1, (self.kd.rsrc2 & ~(0x1FF << 15)) | (lds << 15), self.kd.rsrc3
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
      out += [a & 0xFFFFFFFF, a >> 32] if isinstance(a, int) else [a.lo, a.hi]
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

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size or (1, 1, 1)) + (1, 1, 1))[:3]
    dev = self.dev
    base = dev.kernargs_alloc(self.args_layout(len(bufs), len(vals)).size)
    self.fill_launch(base, gs, ls)
    addr = self.fill_args(base, [b.va_addr for b in bufs], vals)
    q = AMDComputeQueue().wait(dev.timeline_signal, dev.timeline_value - 1).memory_barrier()
    if wait: q.timestamp(dev.time_signals[0])
    q.exec(self, addr, gs, ls)
    if wait: q.timestamp(dev.time_signals[1])
    q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
    if not wait: return None
    dev.synchronize()
    return (dev.time_signals[1].timestamp - dev.time_signals[0].timestamp) / 1e6


class AMDDevice(HCQCompiled):
  """``AMD[:n]`` (KFD) and ``MOCK+AMD[:n]`` (mock KFD + RDNA3 emulator)."""
  hw_compute_queue_t = AMDComputeQueue
  hw_copy_queue_t = AMDCopyQueue

  def __init__(self, device: str):
    target = Target.parse(device).check_interface()
    fio: type[FileIOInterface] = FileIOInterface
    self._driver: Any = None
    if target.interface == "MOCK":
      from tiny_runtime_amd.mock.driver import MockFileIO, driver
      fio, self._driver = MockFileIO, driver()
    self.iface = KFDIface(target.indices[0] if target.indices else 0, fio)
    self.signal_page = self.iface.alloc(SIGNAL_PAGE, host=True, uncached=True)
    base = self.signal_page.va_addr
    self._free_signals = list(range(base, base + SIGNAL_PAGE, HCQSignal.SIZE))[::-1]
    self.kernargs = self.iface.alloc(KERNARGS_SIZE, host=True)
    self._kernargs_ptr = 0
    self.scratch_buf: HCQBuffer | None = None  # grows on demand (ensure_scratch); earlier ones stay allocated
    self.scratch_wave_bytes, self.tmpring_size, self._old_scratch = 0, 0, []
    from tiny_codegen.renderer.amdgpu import AMDGPURenderer
    super().__init__(device, HCQAllocator(self), [AMDGPURenderer], AMDProgram, HCQGraph, arch=self.iface.node.arch)
    self.time_signals = [self.new_signal(), self.new_signal()]
    self.compute_ring = AMDRing(self, kfd.QUEUE_TYPE_COMPUTE)
    self.copy_ring = AMDRing(self, kfd.QUEUE_TYPE_SDMA)

  def progress(self) -> None:
    """Let the mock GPU run (no-op on real hardware, which runs by itself)."""
    if self._driver is not None: self._driver.process()

  def new_signal(self, value: int = 0) -> HCQSignal:
    if not self._free_signals:
      raise RuntimeError(f"{self.device}: all {SIGNAL_PAGE // HCQSignal.SIZE} signals are in use")
    # gfx11 timestamps tick at 100 MHz: 100 ticks per microsecond
    return HCQSignal(self._free_signals.pop(), value, timestamp_divider=100.0,
                     progress=self.progress if self._driver is not None else None)

  def _gpu_alloc(self, size: int, host: bool = False) -> HCQBuffer: return self.iface.alloc(max(size, 1), host=host)
  def _gpu_free(self, buf: HCQBuffer) -> None: self.iface.free(buf)

  def ensure_scratch(self, lane_bytes: int) -> None:
    """Make the scratch buffer hold `lane_bytes` private bytes per work-item for every wave slot of the GPU.

    Per wave: lane_bytes * 32 rounded up to 256 bytes (COMPUTE_TMPRING_SIZE.WAVESIZE counts 256-byte units on gfx11);
    wave slots: CUs * max_slots_scratch_cu (TMPRING_SIZE.WAVES, at most 4095). It grows at least 2x at a time; a
    replaced buffer stays allocated, because command buffers recorded before (JIT graphs) still point at it and it
    is big enough for their kernels."""
    wave = (lane_bytes * 32 + 255) // 256 * 256
    if wave <= self.scratch_wave_bytes: return
    wave = max(wave, 2 * self.scratch_wave_bytes)
    if wave // 256 >= 1 << 15:
      raise RuntimeError(f"{self.device}: {lane_bytes} bytes of scratch per work-item is more than the "
                         f"{((1 << 15) - 1) * 256 // 32} a gfx11 wave can have")
    props = dict(self.iface.node.props)
    waves = min(self.iface.node.cu_count * props.get("max_slots_scratch_cu", 32), 4095)
    if self.scratch_buf is not None: self._old_scratch.append(self.scratch_buf)
    self.scratch_buf = self.iface.alloc(waves * wave)
    self.scratch_wave_bytes, self.tmpring_size = wave, waves | (wave // 256) << 12

  def kernargs_alloc(self, size: int) -> int:
    """A 256-byte aligned slice of the kernarg buffer; wraps after waiting for the GPU to finish with it."""
    size = (size + 255) & ~255
    if self._kernargs_ptr + size > KERNARGS_SIZE:
      self.synchronize()
      self._kernargs_ptr = 0
    addr = self.kernargs.va_addr + self._kernargs_ptr
    self._kernargs_ptr += size
    return addr
