"""`MOCK+AMD`: an in-process stand-in for the amdgpu KFD driver and `GPUS` gfx1100 GPUs (MOCK+AMD:0..GPUS-1).

`MockFileIO` implements the `FileIOInterface` seam: opening `/dev/kfd`, the render node and the sysfs topology
files, ioctls decoded from the same cffi structs as the real driver uses, and mmaps. Memory allocated through it is
real host memory mapped at the GPU virtual address the driver chose, so "GPU" and host see the same bytes. Queues
are rings in that memory; `MockKFD.process()` (the command processor) runs every queue up to the value last written
to its doorbell: PM4 (`pm4.py`) on compute queues and SDMA packets (`sdma.py`) on copy queues. DISPATCH_DIRECT runs
the dispatched code with the RDNA3 emulator (`emu/`): each wave gets the user SGPRs, the enabled work-group ids and,
with RSRC2.SCRATCH_EN, the private segment wave byte offset, and `Wave.scratch_size` = the private bytes per lane
(COMPUTE_TMPRING_SIZE.WAVESIZE * 256 / 32; the emulator keeps each lane's private memory itself). The GPU runs
when the host polls a signal (see `HCQSignal.progress`), like a real GPU that runs asynchronously.
"""
from __future__ import annotations

import bisect
import ctypes
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tiny_uop.hcq import MAP_FIXED, MAP_PRIVATE, PROT_READ, PROT_WRITE, FileIOInterface

from tiny_runtime_amd import kfd, pm4, sdma
from tiny_runtime_amd.emu.rdna3 import EXEC_LO, Emulator, Memory, Wave


class GPUPageFault(RuntimeError):
  """An emulated kernel touched an address outside every allocation of the mock GPU."""


class CheckedMemory(Memory):
  """Emulator memory that only reaches the mock's allocations (a bad address raises instead of crashing Python)."""

  def __init__(self, drv: MockKFD):
    self.drv = drv

  def check(self, addr: int, n: int, what: str) -> None:
    starts = self.drv.range_starts
    i = bisect.bisect_right(starts, addr) - 1
    if i < 0 or addr + n > self.drv.ranges[starts[i]]:
      raise GPUPageFault(f"GPU page fault: {what} of {n} bytes at {addr:#x} is outside every allocation")

  def read(self, addr: int, n: int) -> bytes:
    self.check(addr, n, "read")
    return super().read(addr, n)

  def write(self, addr: int, data: bytes) -> None:
    self.check(addr, len(data), "write")
    super().write(addr, data)

GPU_ID = 0x1100  # any nonzero id; the topology and every ioctl agree on it
RENDER_MINOR = 128
GPUS = 4  # gfx1100 nodes in the topology (MOCK+AMD:0..3): node i+1 has gpu_id GPU_ID+i and render node RENDER_MINOR+i
GPU_IDS = tuple(GPU_ID + i for i in range(GPUS))
DOORBELL_PAGE = 0x2000
TIMESTAMP_HZ = 100_000_000
LDS_GRANULE = 512  # COMPUTE_PGM_RSRC2.LDS_SIZE unit on gfx10+ (128 dwords)  # gfx11 GPU timestamps count at 100 MHz

GFX1100_PROPERTIES = {
  "cpu_cores_count": 0, "simd_count": 192, "simd_per_cu": 2, "max_waves_per_simd": 16, "lds_size_in_kb": 64,
  "gfx_target_version": 110000, "vendor_id": 0x1002, "device_id": 0x744C, "drm_render_minor": RENDER_MINOR,
  "wave_front_size": 32, "array_count": 12, "simd_arrays_per_engine": 2, "cu_per_simd_array": 8,
  "max_slots_scratch_cu": 32, "num_sdma_engines": 2, "num_gws": 64, "num_xcc": 1,
}


def sysfs_files() -> dict[str, str]:
  """The topology files of one CPU node (0) and `GPUS` gfx1100 nodes (1..GPUS), each with its own render node."""
  t = kfd.TOPOLOGY
  out = {f"{t}/0/gpu_id": "0\n", f"{t}/0/properties": "cpu_cores_count 16\nsimd_count 0\n"}
  for i, gid in enumerate(GPU_IDS):
    props = {**GFX1100_PROPERTIES, "drm_render_minor": RENDER_MINOR + i}
    out[f"{t}/{i + 1}/gpu_id"] = f"{gid}\n"
    out[f"{t}/{i + 1}/properties"] = "\n".join(f"{k} {v}" for k, v in props.items()) + "\n"
  return out


def render_paths() -> dict[str, int]:
  """Render node path -> the gpu_id of its GPU."""
  return {f"/dev/dri/renderD{RENDER_MINOR + i}": gid for i, gid in enumerate(GPU_IDS)}


@dataclass
class MockQueue:
  """A user-mode queue registered by CREATE_QUEUE."""
  qid: int
  qtype: int
  ring: int
  ring_size: int
  wptr_addr: int
  rptr_addr: int
  doorbell: int
  rptr: int = 0  # in dwords (PM4) or bytes (SDMA), like the hardware's pointers
  regs: dict[int, int] = field(default_factory=dict)


class MockKFD:
  """The state of the mock driver and its GPU: allocations, queues, events, and the command processor."""

  def __init__(self) -> None:
    self.files = sysfs_files()
    self.allocs: dict[int, tuple[int, int, int]] = {}  # handle -> (va, size, flags)
    self.mapped: set[int] = set()
    self.queues: dict[int, MockQueue] = {}
    self.events: dict[int, int] = {}
    self.alloc_gpu: dict[int, int] = {}  # handle -> the gpu_id it was allocated on
    self.next_handle, self.next_queue, self.next_event = 1, 1, 1
    self.vms: set[int] = set()  # gpu_ids whose VM this process acquired
    self.doorbells = (ctypes.c_uint64 * (DOORBELL_PAGE // 8))()
    self.ranges: dict[int, int] = {}  # start -> end of every allocation the GPU can reach
    self.range_starts: list[int] = []
    self.emu = Emulator(CheckedMemory(self))
    self.dispatches = 0
    self.lock = threading.RLock()

  # ioctls: each takes the decoded cffi struct and fills its outputs
  def ioctl(self, name: str, a: Any) -> None:
    handler = getattr(self, f"_{name.lower()}", None)
    if handler is None: raise OSError(22, f"mock KFD does not implement {name}")
    handler(a)

  def _get_version(self, a: Any) -> None: a.major_version, a.minor_version = 1, 14

  def _acquire_vm(self, a: Any) -> None:
    if a.gpu_id not in GPU_IDS: raise OSError(22, f"ACQUIRE_VM: unknown gpu_id {a.gpu_id:#x}")
    self.vms.add(a.gpu_id)

  def _alloc_memory_of_gpu(self, a: Any) -> None:
    if a.gpu_id not in GPU_IDS: raise OSError(22, f"ALLOC_MEMORY_OF_GPU: unknown gpu_id {a.gpu_id:#x}")
    if a.gpu_id not in self.vms: raise OSError(22, f"ALLOC_MEMORY_OF_GPU on gpu {a.gpu_id:#x} before its ACQUIRE_VM")
    if a.size == 0 or a.size % 0x1000: raise OSError(22, f"ALLOC_MEMORY_OF_GPU: size {a.size:#x} is not page aligned")
    if not a.flags & kfd.ALLOC_USERPTR:  # back the reserved VA with memory (the GPU and the host share it)
      FileIOInterface.anon_mmap(a.va_addr, a.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED)
    a.handle, self.next_handle = self.next_handle, self.next_handle + 1
    a.mmap_offset = a.handle << 12
    self.allocs[a.handle] = (a.va_addr, a.size, a.flags)
    self.alloc_gpu[a.handle] = a.gpu_id
    self.ranges[a.va_addr] = a.va_addr + a.size
    self.range_starts = sorted(self.ranges)

  def _free_memory_of_gpu(self, a: Any) -> None:
    if a.handle not in self.allocs: raise OSError(22, f"FREE_MEMORY_OF_GPU: unknown handle {a.handle}")
    if a.handle in self.mapped: raise OSError(16, f"FREE_MEMORY_OF_GPU: handle {a.handle} is still mapped")
    va, _, _ = self.allocs.pop(a.handle)
    self.alloc_gpu.pop(a.handle, None)
    self.ranges.pop(va, None)
    self.range_starts = sorted(self.ranges)

  def _map_memory_to_gpu(self, a: Any) -> None:
    if a.handle not in self.allocs: raise OSError(22, f"MAP_MEMORY_TO_GPU: unknown handle {a.handle}")
    ids = ctypes.cast(a.device_ids_array_ptr, ctypes.POINTER(ctypes.c_uint32))
    if (bad := [ids[i] for i in range(a.n_devices) if ids[i] not in self.vms]):
      raise OSError(22, f"MAP_MEMORY_TO_GPU: gpu id {bad[0]:#x} is unknown or its VM isn't acquired")
    self.mapped.add(a.handle)
    a.n_success = a.n_devices

  def _unmap_memory_from_gpu(self, a: Any) -> None:
    if a.handle not in self.mapped: raise OSError(22, f"UNMAP_MEMORY_FROM_GPU: handle {a.handle} is not mapped")
    self.mapped.discard(a.handle)
    a.n_success = a.n_devices

  def _create_queue(self, a: Any) -> None:
    if a.gpu_id not in self.vms: raise OSError(22, f"CREATE_QUEUE: gpu id {a.gpu_id:#x} is unknown or has no VM")
    if a.queue_type not in (kfd.QUEUE_TYPE_COMPUTE, kfd.QUEUE_TYPE_SDMA):
      raise OSError(22, f"CREATE_QUEUE: mock supports PM4 compute and SDMA queues, not type {a.queue_type}")
    if a.ring_size & (a.ring_size - 1): raise OSError(22, f"CREATE_QUEUE: ring size {a.ring_size} is not a power of 2")
    if a.queue_type == kfd.QUEUE_TYPE_COMPUTE: self._check_compute_queue_buffers(a)
    qid = self.next_queue
    self.next_queue += 1
    a.queue_id, a.doorbell_offset = qid, (0xD << 28) | (qid * 8)  # page-aligned part selects the doorbell page
    self.queues[qid] = MockQueue(qid, a.queue_type, a.ring_base_address, a.ring_size, a.write_pointer_address,
                                 a.read_pointer_address, ctypes.addressof(self.doorbells) + qid * 8)

  def _check_compute_queue_buffers(self, a: Any) -> None:
    """What kfd_queue_acquire_buffers checks: the EOP and CWSR sizes equal the node's, and the CWSR area is one
    allocation of exactly (cwsr + debug) * num_xcc bytes, page aligned."""
    cw = kfd.cwsr_sizes(GFX1100_PROPERTIES)
    assert cw is not None
    if a.eop_buffer_address and a.eop_buffer_size != cw.eop_buffer_size:
      raise OSError(22, f"CREATE_QUEUE: eop_buffer_size {a.eop_buffer_size:#x}, node needs {cw.eop_buffer_size:#x}")
    if a.ctl_stack_size != cw.ctl_stack_size:
      raise OSError(22, f"CREATE_QUEUE: ctl_stack_size {a.ctl_stack_size:#x}, node needs {cw.ctl_stack_size:#x}")
    if a.ctx_save_restore_size != cw.ctx_save_restore_size:
      raise OSError(22, f"CREATE_QUEUE: ctx_save_restore_size {a.ctx_save_restore_size:#x}, node needs "
                        f"{cw.ctx_save_restore_size:#x}")
    size = self.ranges.get(a.ctx_save_restore_address, 0) - a.ctx_save_restore_address
    if size != cw.alloc_size:
      raise OSError(22, f"CREATE_QUEUE: the CWSR area at {a.ctx_save_restore_address:#x} is {max(size, 0):#x} bytes "
                        f"of one allocation; need {cw.alloc_size:#x}")

  def _destroy_queue(self, a: Any) -> None:
    if self.queues.pop(a.queue_id, None) is None: raise OSError(22, f"DESTROY_QUEUE: unknown queue {a.queue_id}")

  def _create_event(self, a: Any) -> None:
    a.event_id, self.next_event = self.next_event, self.next_event + 1
    a.event_slot_index = a.event_id
    self.events[a.event_id] = 0

  def _destroy_event(self, a: Any) -> None: self.events.pop(a.event_id, None)

  def _wait_events(self, a: Any) -> None:
    self.process()
    a.wait_result = kfd.WAIT_RESULT_COMPLETE

  # the command processor
  def process(self) -> None:
    """Run every queue up to its doorbell (a queue blocked on a wait yields to the others; repeat while progress)."""
    with self.lock:
      progress = True
      while progress:
        progress = False
        for q in list(self.queues.values()):
          target = ctypes.c_uint64.from_address(q.doorbell).value
          while q.rptr < target:
            step = self._pm4_packet(q) if q.qtype == kfd.QUEUE_TYPE_COMPUTE else self._sdma_packet(q)
            if step == 0: break  # waiting
            q.rptr += step
            ctypes.c_uint64.from_address(q.rptr_addr).value = q.rptr
            progress = True

  def _ring_dwords(self, q: MockQueue, start_dw: int, n: int) -> list[int]:
    size_dw = q.ring_size // 4
    arr = (ctypes.c_uint32 * size_dw).from_address(q.ring)
    return [arr[(start_dw + i) % size_dw] for i in range(n)]

  def _pm4_packet(self, q: MockQueue) -> int:
    hdr = self._ring_dwords(q, q.rptr, 1)[0]
    typ, op, n = pm4.decode_header(hdr)
    if typ != 3: raise RuntimeError(f"PM4 queue {q.qid}: packet type {typ} (header {hdr:#010x}); only type 3")
    body = self._ring_dwords(q, q.rptr + 1, n)
    try: return 1 + n if self.exec_pm4(q, op, body) else 0
    except Exception:  # a faulting packet is skipped (like a GPU reset of that dispatch) and the error surfaces
      q.rptr += 1 + n
      ctypes.c_uint64.from_address(q.rptr_addr).value = q.rptr
      raise

  def exec_pm4(self, q: MockQueue, op: int, body: list[int]) -> bool:
    """Execute one PM4 packet; False when it must wait (WAIT_REG_MEM not yet satisfied)."""
    if op == pm4.SET_SH_REG:
      for i, v in enumerate(body[1:]): q.regs[pm4.SH_REG_BASE + 4 * (body[0] + i)] = v
    elif op == pm4.WAIT_REG_MEM:
      addr = body[1] | (body[2] << 32)
      if body[0] & 7 != pm4.WAIT_FUNC_GEQ: raise RuntimeError(f"WAIT_REG_MEM function {body[0] & 7}; mock knows GEQ")
      return (ctypes.c_uint32.from_address(addr).value & body[4]) >= body[3]
    elif op == pm4.RELEASE_MEM:
      sel, addr = body[1] >> 29, body[2] | (body[3] << 32)
      if sel == pm4.DATA_SEL_32: ctypes.c_uint32.from_address(addr).value = body[4]
      elif sel == pm4.DATA_SEL_64: ctypes.c_uint64.from_address(addr).value = body[4] | (body[5] << 32)
      elif sel == pm4.DATA_SEL_TIMESTAMP: ctypes.c_uint64.from_address(addr).value = self.timestamp()
    elif op == pm4.DISPATCH_DIRECT: self.dispatch(q.regs, body[:3])
    elif op == pm4.INDIRECT_BUFFER:
      addr, n = body[0] | (body[1] << 32), body[2] & 0xFFFFF
      ib = list((ctypes.c_uint32 * n).from_address(addr))
      i = 0
      while i < n:
        _, iop, cnt = pm4.decode_header(ib[i])
        if not self.exec_pm4(q, iop, ib[i + 1:i + 1 + cnt]):
          raise RuntimeError("WAIT_REG_MEM inside an IB is not mocked")
        i += 1 + cnt
    elif op in (pm4.ACQUIRE_MEM, pm4.NOP, pm4.EVENT_WRITE): pass
    else: raise RuntimeError(f"PM4 opcode {op:#x} is not implemented by the mock command processor")
    return True

  def _sdma_packet(self, q: MockQueue) -> int:
    hdr = self._ring_dwords(q, q.rptr // 4, 1)[0]
    op, sub = hdr & 0xFF, (hdr >> 8) & 0xFF
    if op not in sdma.PACKET_DWORDS: raise RuntimeError(f"SDMA opcode {op} (header {hdr:#010x}) is not mocked")
    n = sdma.PACKET_DWORDS[op]
    b = self._ring_dwords(q, q.rptr // 4 + 1, n - 1)
    if op == sdma.OP_COPY:
      if sub != sdma.SUBOP_COPY_LINEAR: raise RuntimeError(f"SDMA COPY sub-op {sub}; mock knows LINEAR")
      ctypes.memmove(b[4] | (b[5] << 32), b[2] | (b[3] << 32), b[0] + 1)
    elif op == sdma.OP_FENCE: ctypes.c_uint32.from_address(b[0] | (b[1] << 32)).value = b[2]
    elif op == sdma.OP_POLL_REGMEM:
      if (ctypes.c_uint32.from_address(b[0] | (b[1] << 32)).value & b[3]) < b[2]: return 0
    elif op == sdma.OP_TIMESTAMP: ctypes.c_uint64.from_address(b[0] | (b[1] << 32)).value = self.timestamp()
    return 4 * n

  @staticmethod
  def timestamp() -> int: return time.perf_counter_ns() // (1_000_000_000 // TIMESTAMP_HZ)

  def dispatch(self, regs: dict[int, int], grid: list[int]) -> None:
    """DISPATCH_DIRECT: run every wave of every work-group with the emulator (waves in order, one at a time)."""
    entry = ((regs.get(pm4.COMPUTE_PGM_HI, 0) << 32) | regs.get(pm4.COMPUTE_PGM_LO, 0)) << 8
    rsrc2 = regs.get(pm4.COMPUTE_PGM_RSRC2, 0)
    n_user, tgid_en = (rsrc2 >> 1) & 0x1F, [(rsrc2 >> b) & 1 for b in (7, 8, 9)]
    user = [regs.get(pm4.COMPUTE_USER_DATA_0 + 4 * i, 0) for i in range(n_user)]
    num = (pm4.COMPUTE_NUM_THREAD_X, pm4.COMPUTE_NUM_THREAD_Y, pm4.COMPUTE_NUM_THREAD_Z)
    local = [regs.get(r, 1) or 1 for r in num]
    threads = local[0] * local[1] * local[2]
    n_waves = (threads + 31) // 32
    self.dispatches += 1
    lane_bytes = self.scratch_setup(regs) if rsrc2 & 1 else 0  # RSRC2.SCRATCH_EN
    wave_bytes = lane_bytes * 32
    self.emu.begin_dispatch()
    lds_bytes = ((rsrc2 >> 15) & 0x1FF) * LDS_GRANULE
    for gz in range(grid[2]):
      for gy in range(grid[1]):
        for gx in range(grid[0]):
          lds, waves = bytearray(lds_bytes), []
          for wv in range(n_waves):
            w = Wave(lds=lds)
            w.sgpr[:n_user] = user
            s = n_user
            for en, g in zip(tgid_en, (gx, gy, gz)):
              if en: w.sgpr[s], s = g, s + 1
            if lane_bytes:  # the private segment wave byte offset (a wave slot per wave of the group), and the
              w.sgpr[s] = wv * wave_bytes  # emulator's per-lane private memory size
              w.scratch_size = lane_bytes
            tids = range(wv * 32, min(threads, wv * 32 + 32))
            for ln, t in enumerate(tids):
              x, y, z = t % local[0], (t // local[0]) % local[1], t // (local[0] * local[1])
              w.vgpr[0][ln] = x | (y << 10) | (z << 20)  # gfx11: work-item ids packed in v0
            w.sgpr[EXEC_LO] = (1 << len(tids)) - 1
            waves.append(w)
          self.emu.run_group(waves, entry)

  def scratch_setup(self, regs: dict[int, int]) -> int:
    """A dispatch with RSRC2.SCRATCH_EN: check that COMPUTE_DISPATCH_SCRATCH_BASE points at an allocation holding
    TMPRING_SIZE.WAVES waves of WAVESIZE * 256 bytes, and return the private bytes per lane (wave32)."""
    tmpring = regs.get(pm4.COMPUTE_TMPRING_SIZE, 0)
    waves, wave_bytes = tmpring & 0xFFF, ((tmpring >> 12) & 0x7FFF) * 256
    base = ((regs.get(pm4.COMPUTE_DISPATCH_SCRATCH_BASE_HI, 0) << 32) | regs.get(pm4.COMPUTE_DISPATCH_SCRATCH_BASE_LO,
                                                                                   0)) << 8
    if not waves or not wave_bytes:
      raise RuntimeError(f"dispatch with SCRATCH_EN but COMPUTE_TMPRING_SIZE = {tmpring:#x} (WAVES and WAVESIZE "
                         "must be nonzero)")
    CheckedMemory(self).check(base, waves * wave_bytes, "scratch buffer")
    return wave_bytes // 32


_DRIVER: MockKFD | None = None


def driver() -> MockKFD:
  """The process's mock driver (`GPUS` mock gfx1100s), created on first use."""
  global _DRIVER
  if _DRIVER is None: _DRIVER = MockKFD()
  return _DRIVER


class MockFileIO(FileIOInterface):
  """`FileIOInterface` over the mock driver: the same calls the real driver makes, answered in-process."""

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    self.path, self.fd = path, None
    if path and not self.exists(path): raise FileNotFoundError(2, f"mock KFD: no such file {path!r}")
    self.drv = driver()
    fds = {kfd.KFD_PATH: 3, **{p: 4 + i for i, p in enumerate(render_paths())}}
    self.fd = fds.get(path, 100) if path else None

  def __del__(self) -> None: pass

  def ioctl(self, request: int, arg: Any) -> int:
    if self.path != kfd.KFD_PATH: raise OSError(25, f"ioctl on {self.path!r}: mock supports /dev/kfd only")
    name = kfd.IOCTL_BY_NUMBER.get(request)
    if name is None: raise OSError(25, f"mock KFD: unknown ioctl {request:#x}")
    st = kfd.ffi.from_buffer(f"struct {kfd.IOCTLS[name][2]} *", arg)
    self.drv.ioctl(name, st)
    return 0

  def mmap(self, start: int, size: int, prot: int, flags: int, offset: int) -> int:
    if self.path == kfd.KFD_PATH and offset >> 28 == 0xD: return ctypes.addressof(self.drv.doorbells)
    if (gid := render_paths().get(self.path)) is not None:
      va, sz, _ = self.drv.allocs.get(offset >> 12, (0, 0, 0))
      if va != start or size > sz or self.drv.alloc_gpu.get(offset >> 12) != gid:
        raise OSError(22, f"mock render mmap of {self.path} at {start:#x} size {size:#x} offset {offset:#x} matches no "
                          f"allocation of its GPU")
      return start  # the allocation is already backed at its VA
    raise OSError(19, f"mock mmap of {self.path!r} offset {offset:#x} is not supported")

  def read(self, size: int | None = None, binary: bool = False, offset: int | None = None) -> Any:
    data = self.drv.files[self.path][offset or 0:]
    return data.encode() if binary else data

  @staticmethod
  def exists(path: str) -> bool:
    files = driver().files
    return path == kfd.KFD_PATH or path in render_paths() or path in files or \
      any(f.startswith(path.rstrip("/") + "/") for f in files)

  @staticmethod
  def listdir(path: str) -> list[str]:
    pre = path.rstrip("/") + "/"
    return sorted({f[len(pre):].split("/")[0] for f in driver().files if f.startswith(pre)})

  @staticmethod
  def access(path: str, mode: int) -> bool: return MockFileIO.exists(path)
