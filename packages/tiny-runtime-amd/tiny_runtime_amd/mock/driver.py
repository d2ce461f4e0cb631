"""`MOCK+AMD`: an in-process stand-in for the amdgpu KFD driver and its GPUs (by default four gfx1100s).

`MockFileIO` implements the `FileIOInterface` seam: opening `/dev/kfd`, each GPU's render node and the sysfs topology
files, ioctls decoded from the same cffi structs the real driver uses, and mmaps. Memory allocated through it is real
host memory at the GPU virtual address the driver chose, so "GPU" and host see the same bytes; each GPU reaches only
what is mapped into its VM (MAP_MEMORY_TO_GPU, possibly from another GPU: a peer mapping). Queues are rings in that
memory; `MockKFD.process()` runs every GPU's queues up to their doorbells (`gpu.py`: PM4 and SDMA decoded strictly,
kernels in the architecture's emulator). The GPUs run when the host sleeps in WAIT_EVENTS (or polls), like real GPUs
running asynchronously.

What the mock enforces as the kernel does (kfd_chardev.c, kfd_events.c, amdgpu_amdkfd_gpuvm.c, read for facts):
ACQUIRE_VM with the GPU's own render node before memory on it; handles carry the owner's gpu_id; FREE of memory still
mapped fails with EBUSY; RUNTIME_ENABLE once (EBUSY) and before any queue (EEXIST); the event page (first
CREATE_EVENT, at least KFD_SIGNAL_EVENT_LIMIT * 8 bytes) is set to UNSIGNALED_EVENT_SLOT (all ones); an interrupt with
context id `id` signals event `id` if its slot was written (else every event whose slot was written), and acknowledges
it by resetting the slot. As the kernel: CREATE_QUEUE works whether or not the runtime was enabled; sizes are
rounded up to pages; every VRAM/GTT allocation can be mmapped through the render node; hardware-exception and memory
events exist (never signaled: the mock raises its faults instead).
A host wait no interrupt can end (every queue drained or stuck, the event unsignaled) raises GPUHang with what each
queue waits for, instead of sleeping until the timeout.
"""
from __future__ import annotations

import bisect
import ctypes
import errno
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from tiny_uop.hcq import MAP_FIXED, MAP_PRIVATE, PROT_READ, PROT_WRITE, FileIOInterface

from tiny_runtime_amd import kfd
from tiny_runtime_amd.mock import gfx9, gfx11  # noqa: F401  (register the gfx9 and gfx11 architectures in ARCHS)
from tiny_runtime_amd.mock.fields import MockGPUError, PacketError
from tiny_runtime_amd.mock.gpu import ARCHS, GPUHang, GPUPageFault, MockGPU, MockQueue, ShaderFault

__all__ = ["MockKFD", "MockFileIO", "driver", "mock_fileio", "GPUPageFault", "GPUHang", "ShaderFault", "PacketError",
           "MockGPUError", "GPU_ID"]

GPU_ID = 0x1100          # the first GPU's id; GPU i has GPU_ID + i (any nonzero ids; topology and ioctls agree)
RENDER_MINOR = 128       # GPU i's render node is /dev/dri/renderD{128 + i}
DEFAULT_ARCHS = ("gfx1100",) * 4  # MOCK+AMD:0..3 (multi-device tests use up to 4)
UNSIGNALED_EVENT_SLOT = (1 << 64) - 1
DOORBELL_MMAP_TYPE = 3   # KFD_MMAP_TYPE_DOORBELL (kfd_priv.h): bits 63:62 of the mmap offset; gpu_id in bits 61:46
EVENT_DATA_SIZE, EVENT_DATA_ID_OFFSET = 48, 40  # struct kfd_event_data: its size, where event_id sits
# kfd_events.h: events other than signal/debug get ids from KFD_FIRST_NONSIGNAL_EVENT_ID (KFD_EVENT_ID_NONSIGNAL_MASK)
FIRST_NONSIGNAL_EVENT_ID = 0x80000000
OTHER_EVENT_TYPES = (3, 8)  # KFD_IOC_EVENT_HW_EXCEPTION, KFD_IOC_EVENT_MEMORY (tinygrad's driver waits on both)


def _err(code: int, msg: str) -> OSError: return OSError(code, msg)


@dataclass
class MockAlloc:
  """An ALLOC_MEMORY_OF_GPU allocation."""
  handle: int
  va: int
  size: int
  flags: int
  owner: MockGPU
  mmap_offset: int
  mapped: set[int] = field(default_factory=set)  # gpu ids

  @property
  def host_visible(self) -> bool: return bool(self.flags & (kfd.ALLOC_GTT | kfd.ALLOC_PUBLIC | kfd.ALLOC_USERPTR))


@dataclass
class MockEvent:
  event_id: int
  auto_reset: bool
  signaled: bool = False


class MockKFD:
  """The process's KFD context and its GPUs: allocations, VMs, queues, events, and the command processors."""

  def __init__(self, archs: tuple[str, ...] = DEFAULT_ARCHS, strict_waits: bool = True):
    unknown = [a for a in archs if a not in ARCHS]
    if unknown or not archs:
      raise ValueError(f"mock GPU archs {list(archs)}: unknown {unknown}; known: {sorted(ARCHS)}")
    self.gpus: list[MockGPU] = [ARCHS[a](self, i + 1, GPU_ID + i, RENDER_MINOR + i) for i, a in enumerate(archs)]
    self.by_id = {g.gpu_id: g for g in self.gpus}
    self.files = self.sysfs_files()
    self.allocs: dict[int, MockAlloc] = {}
    self.by_va: dict[int, MockAlloc] = {}  # start -> allocation, and its sorted starts (host_visible's lookup)
    self.va_starts: list[int] = []
    self.queues: dict[int, MockQueue] = {}
    self.events: dict[int, MockEvent] = {}
    self.event_page: MockAlloc | None = None
    self.next_idr, self.next_queue = 1, 1
    self.runtime_enabled = False
    self.strict_waits = strict_waits
    self.dispatches = self.interrupts = 0
    self.fds: dict[str, int] = {kfd.KFD_PATH: 3, **{f"/dev/dri/renderD{g.render_minor}": 4 + i
                                                    for i, g in enumerate(self.gpus)}}
    self.lock = threading.RLock()
    # when a list: what drivers did, in order: ("ioctl", name, fields), ("PM4", opcode, detail), ("SDMA", op, "")
    # (tests/proven/record_streams.py compares tinygrad's driver's stream with ours)
    self.trace: list[tuple[str, str, str]] | None = None

  @property
  def emu(self) -> Any: return self.gpus[0].emu

  def sysfs_files(self) -> dict[str, str]:
    """The topology: a CPU node 0, then one node per GPU; and each GPU's IP discovery versions (amdgpu_discovery.c's
    sysfs, read by drivers that pick packet formats per IP version)."""
    t = kfd.TOPOLOGY
    out = {f"{t}/0/gpu_id": "0\n", f"{t}/0/properties": "cpu_cores_count 16\nsimd_count 0\n"}
    for g in self.gpus:
      out.update({f"{t}/{g.node}/gpu_id": f"{g.gpu_id}\n", f"{t}/{g.node}/properties": g.sysfs()})
      base = f"/sys/class/drm/renderD{g.render_minor}/device/ip_discovery/die/0"
      for hw_id, ver in g.ip_versions.items():
        out.update({f"{base}/{hw_id}/0/{part}": f"{v}\n" for part, v in zip(("major", "minor", "revision"), ver)})
    return out

  def gpu(self, gpu_id: int, what: str) -> MockGPU:
    if (g := self.by_id.get(gpu_id)) is None:
      raise _err(errno.EINVAL, f"{what}: unknown gpu_id {gpu_id:#x}; this machine has {[hex(i) for i in self.by_id]}")
    return g

  def alloc_of(self, handle: int, what: str) -> MockAlloc:
    if (a := self.allocs.get(handle)) is None: raise _err(errno.EINVAL, f"{what}: unknown handle {handle:#x}")
    return a

  def alloc_at(self, addr: int) -> MockAlloc | None:
    """The allocation `addr` lies in, or None."""
    i = bisect.bisect_right(self.va_starts, addr) - 1
    return a if i >= 0 and addr < (a := self.by_va[self.va_starts[i]]).va + a.size else None

  def host_visible(self, addr: int) -> bool:
    """Whether `addr` lies in memory the host can read (GTT, userptr or CPU-visible VRAM)."""
    return (a := self.alloc_at(addr)) is not None and a.host_visible

  # ***** ioctls: each takes the decoded cffi struct and fills its outputs *****
  def ioctl(self, name: str, a: Any) -> None:
    handler = getattr(self, f"_{name.lower()}", None)
    if handler is None: raise _err(errno.EINVAL, f"mock KFD does not implement {name}")
    with self.lock:
      if self.trace is not None: self.trace.append(("ioctl", name, _ioctl_detail(name, a)))
      handler(a)

  def _get_version(self, a: Any) -> None: a.major_version, a.minor_version = 1, 17

  def _runtime_enable(self, a: Any) -> None:
    if not a.mode_mask & kfd.RUNTIME_ENABLE_MODE_ENABLE_MASK:
      self.runtime_enabled = False
      return
    if self.runtime_enabled: raise _err(errno.EBUSY, "RUNTIME_ENABLE: the runtime is already enabled")
    if self.queues: raise _err(errno.EEXIST, f"RUNTIME_ENABLE after {len(self.queues)} queue(s) were created")
    self.runtime_enabled, a.capabilities_mask = True, 0

  def _acquire_vm(self, a: Any) -> None:
    """kfd_chardev.c kfd_ioctl_acquire_vm: an unknown gpu_id or drm_fd is EINVAL; a GPU that has its VM takes the same
    file again (0) and refuses another (EBUSY); kfd_process.c kfd_process_device_init_vm / amdgpu_file_to_fpriv: a
    file that is no amdgpu render node is EINVAL. KFD does not compare the node with the GPU (it would make that
    node's VM this GPU's); the mock refuses another GPU's node with EINVAL, stricter than KFD."""
    g = self.gpu(a.gpu_id, "ACQUIRE_VM")
    want = self.fds[f"/dev/dri/renderD{g.render_minor}"]
    if a.drm_fd != want:
      raise _err(errno.EINVAL, f"ACQUIRE_VM: drm_fd {a.drm_fd} is not {g.name}'s render node (fd {want})")
    if g.vm_fd is not None and g.vm_fd != a.drm_fd: raise _err(errno.EBUSY, f"ACQUIRE_VM: {g.name} already has a VM")
    g.vm_fd = a.drm_fd

  def _alloc_memory_of_gpu(self, a: Any) -> None:
    g = self.gpu(a.gpu_id, "ALLOC_MEMORY_OF_GPU")
    if g.vm_fd is None: raise _err(errno.EINVAL, f"ALLOC_MEMORY_OF_GPU on {g.name} before its ACQUIRE_VM")
    # kfd_ioctl_alloc_memory_of_gpu refuses size 0; an unaligned va fails when amdgpu_vm_bo_map maps it (the mock
    # refuses it here, at once)
    if a.size == 0 or a.va_addr % 0x1000:
      raise _err(errno.EINVAL, f"ALLOC_MEMORY_OF_GPU: va {a.va_addr:#x} / size {a.size:#x}; the va must be page "
                 "aligned and the size nonzero")
    size = (a.size + 0xFFF) & ~0xFFF  # amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu: aligned_size = PAGE_ALIGN(size)
    flags = a.flags & ~ALLOC_DOMAINS | _alloc_domain(a)
    # amdgpu_vm_bo_map refuses a VA range that overlaps another BO's mapping ("conflict with", EINVAL; at map time)
    i = bisect.bisect_right(self.va_starts, a.va_addr)
    for o in (self.by_va[s] for s in self.va_starts[max(i - 1, 0):i + 1]):  # the neighbours below and above
      if o.va < a.va_addr + size and a.va_addr < o.va + o.size:
        raise _err(errno.EINVAL, f"ALLOC_MEMORY_OF_GPU: [{a.va_addr:#x}, +{size:#x}) overlaps handle {o.handle:#x}")
    if not flags & kfd.ALLOC_USERPTR:  # back the reserved VA with memory (the GPU and the host share it)
      FileIOInterface.anon_mmap(a.va_addr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED)
    a.handle = (g.gpu_id << 32) | self.next_idr  # MAKE_HANDLE(gpu_id, idr handle)
    a.mmap_offset = self.next_idr << 20         # where the render node maps it (a DRM fake offset)
    self.next_idr += 1
    self.allocs[a.handle] = self.by_va[a.va_addr] = MockAlloc(a.handle, a.va_addr, size, flags, g, a.mmap_offset)
    bisect.insort(self.va_starts, a.va_addr)

  def _free_memory_of_gpu(self, a: Any) -> None:
    m = self.alloc_of(a.handle, "FREE_MEMORY_OF_GPU")
    if m is self.event_page:  # kfd_ioctl_free_memory_of_gpu, first: "Free signal BO is not allowed" (EPERM)
      raise _err(errno.EPERM, "FREE_MEMORY_OF_GPU: the event page (signal BO) is freed only with the process")
    if m.mapped:  # amdgpu_amdkfd_gpuvm_free_memory_of_gpu: "BO VA ... is still mapped" (EBUSY)
      raise _err(errno.EBUSY, f"FREE_MEMORY_OF_GPU: handle {a.handle:#x} is still mapped to "
                 f"{sorted(map(hex, m.mapped))}")
    del self.allocs[a.handle], self.by_va[m.va]
    self.va_starts.remove(m.va)

  def _device_ids(self, a: Any, what: str) -> list[MockGPU]:
    if a.n_success > a.n_devices: raise _err(errno.EINVAL, f"{what}: n_success {a.n_success} > n_devices")
    ids = ctypes.cast(a.device_ids_array_ptr, ctypes.POINTER(ctypes.c_uint32))
    gpus = [self.gpu(ids[i], what) for i in range(a.n_devices)]
    for g in gpus:
      if g.vm_fd is None: raise _err(errno.EINVAL, f"{what}: {g.name} has no VM (ACQUIRE_VM first)")
    return gpus

  def _map_memory_to_gpu(self, a: Any) -> None:
    m = self.alloc_of(a.handle, "MAP_MEMORY_TO_GPU")
    for g in self._device_ids(a, "MAP_MEMORY_TO_GPU")[a.n_success:]:
      if g.gpu_id not in m.mapped: m.mapped.add(g.gpu_id); g.map_range(m.va, m.va + m.size)
      a.n_success += 1

  def _unmap_memory_from_gpu(self, a: Any) -> None:
    m = self.alloc_of(a.handle, "UNMAP_MEMORY_FROM_GPU")
    if not m.mapped: raise _err(errno.EINVAL, f"UNMAP_MEMORY_FROM_GPU: handle {a.handle:#x} is not mapped")
    for g in self._device_ids(a, "UNMAP_MEMORY_FROM_GPU")[a.n_success:]:
      if g.gpu_id in m.mapped: m.mapped.discard(g.gpu_id); g.unmap_range(m.va)
      a.n_success += 1

  def _create_queue(self, a: Any) -> None:
    g = self.gpu(a.gpu_id, "CREATE_QUEUE")
    # no runtime check: kfd_ioctl_create_queue creates queues of a process that never enabled the runtime (tinygrad's
    # driver calls RUNTIME_ENABLE with mode_mask 0, i.e. disabled); only the debugger needs it enabled
    if a.queue_type not in (kfd.QUEUE_TYPE_COMPUTE, kfd.QUEUE_TYPE_SDMA):
      raise _err(errno.EINVAL, f"CREATE_QUEUE: the {g.arch} mock models PM4 compute (0) and SDMA (1) queues, not "
                 f"type {a.queue_type}")
    # kfd_chardev.c set_queue_properties_from_user: "Ring size must be a power of 2 or 0" (EINVAL); a smaller one is
    # clamped to KFD_MIN_QUEUE_RING_SIZE (1024 bytes, kfd_ioctl.h), not refused
    if a.ring_size & (a.ring_size - 1):
      raise _err(errno.EINVAL, f"CREATE_QUEUE: ring size {a.ring_size} is not a power of 2 (or 0)")
    ring_size = a.ring_size = max(a.ring_size, kfd.MIN_QUEUE_RING_SIZE)  # written back: the args are _IOWR
    # kfd_chardev.c set_queue_properties_from_user: bits 7:0 the percentage (<= KFD_MAX_QUEUE_PERCENTAGE), bits 15:8
    # the XCC a PM4 queue runs on in a multi-XCC partition ("unlike AQL queues, the PM4 queue will be only processed
    # in one XCC", amdkfd "Add PM4 target XCC"; kfd_mqd_manager_v9.c init_mqd_v9_4_3 pm4_target_xcc_in_xcp)
    pct, xcc = a.queue_percentage & 0xFF, (a.queue_percentage >> 8) & 0xFF
    if pct > 100 or a.queue_priority > 15:  # KFD_MAX_QUEUE_PERCENTAGE, KFD_MAX_QUEUE_PRIORITY (kfd_ioctl.h): EINVAL
      raise _err(errno.EINVAL, f"CREATE_QUEUE: percentage {pct} / priority {a.queue_priority}; "
                 "valid: <= 100 / <= 15")
    n_xcc = max(g.props.get("num_xcc", 1), 1)
    if a.queue_type == kfd.QUEUE_TYPE_COMPUTE and xcc >= n_xcc:  # KFD passes it on unchecked; no XCC has that index
      raise _err(errno.EINVAL, f"CREATE_QUEUE: PM4 target XCC {xcc} (queue_percentage bits 15:8); {g.name} has "
                 f"XCCs 0..{n_xcc - 1}")
    # kfd_queue.c kfd_queue_acquire_buffers: the write and read pointers each in a one-page BO, the ring a BO of
    # exactly ring_size bytes (kfd_queue_buffer_get; a ring under a page is checked for its start only)
    g.check_queue_buffer(a.write_pointer_address, kfd.PAGE, "write pointer")
    g.check_queue_buffer(a.read_pointer_address, kfd.PAGE, "read pointer")
    g.check_queue_buffer(a.ring_base_address, ring_size, "ring")
    if a.queue_type == kfd.QUEUE_TYPE_COMPUTE: g.check_compute_queue(a)
    qid, slot = self.next_queue, g.next_doorbell
    self.next_queue, g.next_doorbell = qid + 1, slot + 1
    a.queue_id = qid
    # kfd_chardev.c kfd_ioctl_create_queue: KFD_MMAP_TYPE_DOORBELL | KFD_MMAP_GPU_ID(gpu_id), and on SOC15 the byte
    # offset of the queue's 64-bit doorbell in the process's 2-page doorbell slice (pqm_create_queue)
    a.doorbell_offset = (DOORBELL_MMAP_TYPE << 62) | (g.gpu_id << 46) | (slot * 8)
    self.queues[qid] = MockQueue(qid, a.queue_type, g, a.ring_base_address, ring_size, a.write_pointer_address,
                                 a.read_pointer_address, ctypes.addressof(g.doorbells) + slot * 8,
                                 cwsr=a.queue_type == kfd.QUEUE_TYPE_COMPUTE and bool(a.ctx_save_restore_address),
                                 xcc=xcc if a.queue_type == kfd.QUEUE_TYPE_COMPUTE else 0)

  def _destroy_queue(self, a: Any) -> None:
    if self.queues.pop(a.queue_id, None) is None: raise _err(errno.EINVAL, f"DESTROY_QUEUE: unknown queue {a.queue_id}")

  def _create_event(self, a: Any) -> None:
    if a.event_type in OTHER_EVENT_TYPES:  # kfd_events.c kfd_event_create: default case, create_other_event
      eid = next(i for i in range(FIRST_NONSIGNAL_EVENT_ID, 1 << 32) if i not in self.events)
      self.events[eid] = MockEvent(eid, bool(a.auto_reset))  # signaled by faults only, which the mock raises instead
      a.event_id = a.event_trigger_data = eid
      return
    if a.event_type != kfd.EVENT_SIGNAL:
      raise _err(errno.EINVAL, f"CREATE_EVENT: event type {a.event_type}; the mock models signal (0), hardware "
                 "exception (3) and memory (8) events")
    if a.event_page_offset:
      # kfd_events.c kfd_kmap_event_page: "Event page is already set" (EINVAL); the handle names the BO
      if self.event_page is not None: raise _err(errno.EINVAL, "CREATE_EVENT: the event page is already set")
      m = self.alloc_of(a.event_page_offset, "CREATE_EVENT event_page_offset")
      if m.size < kfd.SIGNAL_EVENT_LIMIT * 8:  # kfd_events.c kfd_event_page_set: KFD_SIGNAL_EVENT_LIMIT 8-byte slots
        raise _err(errno.EINVAL, f"CREATE_EVENT: an event page of {m.size:#x} bytes; it needs "
                   f"{kfd.SIGNAL_EVENT_LIMIT * 8:#x}")
      # kfd_events.c kfd_kmap_event_page -> amdgpu_amdkfd_gpuvm_map_gtt_bo_to_kernel: "userptr can't be mapped to
      # kernel" (EINVAL); any other BO is pinned in AMDGPU_GEM_DOMAIN_GTT (a VRAM BO, whose allowed domains include
      # GTT, moves there) and kmapped
      if m.flags & kfd.ALLOC_USERPTR:
        raise _err(errno.EINVAL, "CREATE_EVENT: the event page is a userptr allocation, which KFD cannot map into the "
                   "kernel (amdgpu_amdkfd_gpuvm_map_gtt_bo_to_kernel); allocate it as GTT")
      ctypes.memset(m.va, 0xFF, kfd.SIGNAL_EVENT_LIMIT * 8)  # every slot UNSIGNALED_EVENT_SLOT
      self.event_page = m
    eid = next(i for i in range(kfd.SIGNAL_EVENT_LIMIT) if i not in self.events)
    self.events[eid] = MockEvent(eid, bool(a.auto_reset))
    a.event_id = a.event_trigger_data = a.event_slot_index = eid

  def _destroy_event(self, a: Any) -> None:
    if self.events.pop(a.event_id, None) is None: raise _err(errno.EINVAL, f"DESTROY_EVENT: unknown event {a.event_id}")

  def _wait_events(self, a: Any) -> None:
    ids = [ctypes.c_uint32.from_address(a.events_ptr + EVENT_DATA_SIZE * i + EVENT_DATA_ID_OFFSET).value
           for i in range(a.num_events)]
    if (bad := [i for i in ids if i not in self.events]): raise _err(errno.EINVAL, f"WAIT_EVENTS: unknown events {bad}")
    self.process()
    evs = [self.events[i] for i in ids]
    if (all if a.wait_for_all else any)(e.signaled for e in evs):
      for e in evs:
        if e.auto_reset: e.signaled = False
      a.wait_result = kfd.WAIT_RESULT_COMPLETE
      return
    a.wait_result = kfd.WAIT_RESULT_TIMEOUT
    if self.strict_waits and a.timeout > 0:
      raise GPUHang(f"WAIT_EVENTS on events {ids} would sleep the whole {a.timeout} ms: no interrupt will signal "
                    f"them. {self.stall_report()}")

  # ***** interrupts, the command processors *****
  def interrupt(self, gpu: MockGPU, ctxid: int, valid_bits: int) -> None:
    """A GPU interrupt carrying `ctxid` (its low `valid_bits` bits): what kfd_signal_event_interrupt does."""
    self.interrupts += 1
    page = self.event_page
    if page is None: return
    slots = (ctypes.c_uint64 * kfd.SIGNAL_EVENT_LIMIT).from_address(page.va)
    ctxid &= (1 << valid_bits) - 1
    if ctxid in self.events and slots[ctxid] != UNSIGNALED_EVENT_SLOT: hits = [ctxid]
    else:  # the exhaustive search, over signal events (the others have no slot)
      hits = [i for i in self.events if i < kfd.SIGNAL_EVENT_LIMIT and slots[i] != UNSIGNALED_EVENT_SLOT]
    for i in hits:
      slots[i] = UNSIGNALED_EVENT_SLOT
      self.events[i].signaled = True

  def process(self) -> None:
    """Run every GPU's queues up to their doorbells (a queue blocked on a wait yields to the others; repeat while
    anything ran)."""
    with self.lock:
      progress = True
      while progress:
        progress = False
        queues = list(self.queues.values())
        # every doorbell rung since the last pass counts as rung now, before any queue runs: the host rang them in
        # some order the GPU can't see, so a barrier one queue runs in this pass follows all of them (noticing them
        # queue by queue would put a later-seen doorbell after a barrier the host ordered after it)
        for q in queues: q.gpu.notice_doorbell(q)
        for q in queues:
          if q.gpu.run_queue(q): progress = True

  def stall_report(self) -> str:
    stuck = [f"queue {q.qid} ({q.kind} on {q.gpu.name}) waits: {q.blocked}" for q in self.queues.values()
             if q.pending()]
    return ("Blocked: " + "; ".join(stuck)) if stuck else \
      "Every queue is drained: the work that should have signaled never raised an interrupt with the event's mailbox " \
      "slot written (RELEASE_MEM INT_SEL / SDMA TRAP after the signal write)"


ALLOC_DOMAINS = kfd.ALLOC_VRAM | kfd.ALLOC_GTT | kfd.ALLOC_USERPTR | kfd.ALLOC_DOORBELL | kfd.ALLOC_MMIO_REMAP


def _alloc_domain(a: Any) -> int:
  """The one domain flag an ALLOC_MEMORY_OF_GPU gets, in amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu's order: VRAM, else
  GTT, else USERPTR (which needs the user address in mmap_offset), else DOORBELL / MMIO_REMAP (not modelled), else
  EINVAL."""
  for bit in (kfd.ALLOC_VRAM, kfd.ALLOC_GTT):
    if a.flags & bit: return bit
  if a.flags & kfd.ALLOC_USERPTR:
    if not a.mmap_offset:
      raise _err(errno.EINVAL, "ALLOC_MEMORY_OF_GPU: USERPTR without the user address in mmap_offset")
    return kfd.ALLOC_USERPTR
  if a.flags & (kfd.ALLOC_DOORBELL | kfd.ALLOC_MMIO_REMAP):
    raise _err(errno.EINVAL, f"ALLOC_MEMORY_OF_GPU: flags {a.flags:#x}: DOORBELL / MMIO_REMAP BOs are not modelled")
  raise _err(errno.EINVAL, f"ALLOC_MEMORY_OF_GPU: flags {a.flags:#x} name no domain (VRAM, GTT, USERPTR, DOORBELL, "
             "MMIO_REMAP)")


def _ioctl_detail(name: str, a: Any) -> str:
  """The fields of an ioctl that say what was asked (for traces): memory domain and flags, queue and event types."""
  if name == "ALLOC_MEMORY_OF_GPU":
    dom = [n for n, bit in (("VRAM", kfd.ALLOC_VRAM), ("GTT", kfd.ALLOC_GTT), ("USERPTR", kfd.ALLOC_USERPTR),
                            ("PUBLIC", kfd.ALLOC_PUBLIC), ("UNCACHED", kfd.ALLOC_UNCACHED),
                            ("COHERENT", kfd.ALLOC_COHERENT)) if a.flags & bit]
    return "|".join(dom)
  if name == "CREATE_QUEUE":
    return f"type {a.queue_type} cwsr {int(bool(a.ctx_save_restore_address))} eop {int(bool(a.eop_buffer_address))}"
  if name == "CREATE_EVENT": return f"type {a.event_type}" + (" +page" if a.event_page_offset else "")
  if name == "RUNTIME_ENABLE": return f"mode {a.mode_mask}"
  return ""


_DRIVER: MockKFD | None = None


def driver() -> MockKFD:
  """The process's mock KFD (four gfx1100 GPUs), created on first use."""
  global _DRIVER
  if _DRIVER is None: _DRIVER = MockKFD()
  return _DRIVER


_BY_ARCH: dict[str, type[MockFileIO]] = {}


def mock_fileio(arch: str | None = None) -> type[MockFileIO]:
  """The `FileIOInterface` of the process's mock KFD whose GPUs are `arch` (None or gfx1100: `MockFileIO`, the
  default mock; another arch: its own mock KFD, created on first use). ValueError for an arch the mock lacks."""
  if arch is None or arch == DEFAULT_ARCHS[0]: return MockFileIO
  if arch not in ARCHS: raise ValueError(f"MOCK+AMD has no {arch} GPU; mocked archs: {', '.join(sorted(ARCHS))}")
  if (fio := _BY_ARCH.get(arch)) is None:
    drv = MockKFD((arch,) * len(DEFAULT_ARCHS))
    fio = _BY_ARCH[arch] = type(f"MockFileIO_{arch}", (MockFileIO,), {"kfd_fn": staticmethod(lambda: drv)})
  return fio


class MockFileIO(FileIOInterface):
  """`FileIOInterface` over a mock KFD (`kfd_fn()`, the process's by default): the same calls the real driver makes,
  answered in-process. A subclass with another `kfd_fn` talks to another mock (tests)."""
  kfd_fn: Callable[[], MockKFD] = staticmethod(driver)

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    self.path, self.fd = path, None
    if path and not self.exists(path): raise FileNotFoundError(2, f"mock KFD: no such file {path!r}")
    self.drv = type(self).kfd_fn()
    self.fd = self.drv.fds.get(path, 10) if path else None

  def __del__(self) -> None: pass

  def ioctl(self, request: int, arg: Any) -> int:
    if self.path != kfd.KFD_PATH: raise OSError(errno.ENOTTY, f"ioctl on {self.path!r}: mock supports /dev/kfd only")
    name = kfd.IOCTL_BY_NUMBER.get(request)
    if name is None: raise OSError(errno.ENOTTY, f"mock KFD: unknown ioctl {request:#x}")
    self.drv.ioctl(name, kfd.ffi.from_buffer(f"struct {kfd.IOCTLS[name][2]} *", arg))
    return 0

  def mmap(self, start: int, size: int, prot: int, flags: int, offset: int) -> int:
    drv = self.drv
    if self.path == kfd.KFD_PATH and offset >> 62 == DOORBELL_MMAP_TYPE:
      g = drv.gpu((offset >> 46) & 0xFFFF, "doorbell mmap")
      # kfd_doorbell.c kfd_doorbell_mmap: only the whole process doorbell slice (kfd_doorbell_process_slice: 1024
      # 64-bit doorbells, 8 KiB on SOC15) can be mapped, else EINVAL
      if size != ctypes.sizeof(g.doorbells):
        raise OSError(errno.EINVAL, f"doorbell mmap of {size:#x} bytes; KFD maps the whole "
                                    f"{ctypes.sizeof(g.doorbells):#x}-byte process doorbell slice only")
      return ctypes.addressof(g.doorbells)
    if self.path.startswith("/dev/dri/renderD"):
      with drv.lock:  # as the ioctls that add and free allocations (other threads allocate meanwhile)
        m = next((m for m in drv.allocs.values()
                  if m.mmap_offset == offset and self.path == f"/dev/dri/renderD{m.owner.render_minor}"), None)
      if m is None or m.va != start or size > m.size:
        raise OSError(errno.EINVAL, f"mock render mmap at {start:#x} size {size:#x} offset {offset:#x} matches no "
                                    f"allocation of {self.path}")
      # amdgpu_gem_object_mmap refuses userptr BOs (EPERM) and NO_CPU_ACCESS ones; KFD stopped creating the latter
      # ("drm/amdkfd: Allow CPU access for all VRAM BOs": a VRAM BO without PUBLIC gets no CPU_ACCESS flag either
      # way, amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu), so every VRAM and GTT allocation can be mapped.
      if m.flags & kfd.ALLOC_USERPTR:
        raise OSError(errno.EPERM, f"mock render mmap of handle {m.handle:#x}: a userptr allocation is host memory")
      return start  # the allocation is already backed at its VA
    raise OSError(errno.ENODEV, f"mock mmap of {self.path!r} offset {offset:#x} is not supported")

  def read(self, size: int | None = None, binary: bool = False, offset: int | None = None) -> Any:
    data = self.drv.files[self.path][offset or 0:]
    return data.encode() if binary else data

  @classmethod
  def exists(cls, path: str) -> bool:
    drv = cls.kfd_fn()
    return path in drv.fds or path in drv.files or any(f.startswith(path.rstrip("/") + "/") for f in drv.files)

  @classmethod
  def listdir(cls, path: str) -> list[str]:
    pre = path.rstrip("/") + "/"
    return sorted({f[len(pre):].split("/")[0] for f in cls.kfd_fn().files if f.startswith(pre)})

  @classmethod
  def access(cls, path: str, mode: int) -> bool: return cls.exists(path)
