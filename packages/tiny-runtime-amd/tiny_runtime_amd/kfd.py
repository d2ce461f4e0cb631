"""The KFD kernel interface: ioctl argument structs (cffi), ioctl numbers, the process's `/dev/kfd` (`KFDProcess`) and
one GPU's view of it (`KFDIface`: topology, VM, memory, events).

Struct layouts, ioctl numbers and flag values are those of the Linux UAPI header `include/uapi/linux/kfd_ioctl.h`
(KFD ioctl interface 1.x; `AMDKFD_IOCTL_BASE 'K'`, `AMDKFD_IOR/IOW/IOWR(nr, struct)`); tests compare every one of them
with tinygrad 0.14.0's generated bindings of that header (`autogen/kfd.py`). Topology comes from sysfs
(`/sys/devices/virtual/kfd/kfd/topology/nodes/<n>/properties`, `gpu_id`), as the kernel's `kfd_topology.c` writes it.
What the kernel does with each call (read for facts: `drivers/gpu/drm/amd/amdkfd/kfd_chardev.c`, `kfd_events.c`):
- a process has one KFD context however often it opens /dev/kfd; RUNTIME_ENABLE is per process, before its first
  queue (EEXIST after), and a second call fails with EBUSY;
- ALLOC_MEMORY_OF_GPU returns a handle whose high 32 bits are the owning gpu_id; MAP_MEMORY_TO_GPU takes a list of
  gpu ids (a peer GPU maps another GPU's memory that way) and counts them in n_success;
- signal events share one event page per process: a user allocation of at least KFD_SIGNAL_EVENT_LIMIT * 8 bytes,
  handed over with the first CREATE_EVENT; each event has a 64-bit slot there (UNSIGNALED_EVENT_SLOT = all ones). A GPU
  signals event `id` by writing its slot and raising an interrupt carrying `id` (RELEASE_MEM INT_SEL / SDMA TRAP);
  WAIT_EVENTS sleeps until then.
All file access goes through a `FileIOInterface`, so `MOCK+AMD` substitutes an in-process driver (`mock/`).
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import cffi

from tiny_uop.hcq import MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE, \
  FileIOInterface, HCQBuffer, errno_name, ioc

ffi = cffi.FFI()
# from include/uapi/linux/kfd_ioctl.h (field order and widths exactly as there; __u32/__u64 -> uint32_t/uint64_t)
ffi.cdef("""
struct kfd_ioctl_get_version_args { uint32_t major_version; uint32_t minor_version; };
struct kfd_ioctl_create_queue_args {
  uint64_t ring_base_address; uint64_t write_pointer_address; uint64_t read_pointer_address; uint64_t doorbell_offset;
  uint32_t ring_size; uint32_t gpu_id; uint32_t queue_type; uint32_t queue_percentage; uint32_t queue_priority;
  uint32_t queue_id;
  uint64_t eop_buffer_address; uint64_t eop_buffer_size; uint64_t ctx_save_restore_address;
  uint32_t ctx_save_restore_size; uint32_t ctl_stack_size; uint32_t sdma_engine_id; uint32_t pad;
};
struct kfd_ioctl_destroy_queue_args { uint32_t queue_id; uint32_t pad; };
struct kfd_ioctl_create_event_args {
  uint64_t event_page_offset; uint32_t event_trigger_data; uint32_t event_type; uint32_t auto_reset; uint32_t node_id;
  uint32_t event_id; uint32_t event_slot_index;
};
struct kfd_ioctl_destroy_event_args { uint32_t event_id; uint32_t pad; };
struct kfd_ioctl_wait_events_args {
  uint64_t events_ptr; uint32_t num_events; uint32_t wait_for_all; uint32_t timeout; uint32_t wait_result;
};
struct kfd_event_data { uint8_t union_data[32]; uint64_t kfd_event_data_ext; uint32_t event_id; uint32_t pad; };
struct kfd_ioctl_acquire_vm_args { uint32_t drm_fd; uint32_t gpu_id; };
struct kfd_ioctl_alloc_memory_of_gpu_args {
  uint64_t va_addr; uint64_t size; uint64_t handle; uint64_t mmap_offset; uint32_t gpu_id; uint32_t flags;
};
struct kfd_ioctl_free_memory_of_gpu_args { uint64_t handle; };
struct kfd_ioctl_map_memory_to_gpu_args {
  uint64_t handle; uint64_t device_ids_array_ptr; uint32_t n_devices; uint32_t n_success;
};
struct kfd_ioctl_unmap_memory_from_gpu_args {
  uint64_t handle; uint64_t device_ids_array_ptr; uint32_t n_devices; uint32_t n_success;
};
struct kfd_ioctl_runtime_enable_args { uint64_t r_debug; uint32_t mode_mask; uint32_t capabilities_mask; };
""")

# kfd_ioctl.h: KFD_IOC_QUEUE_TYPE_*, KFD_IOC_EVENT_*, KFD_IOC_WAIT_RESULT_*, KFD_IOC_ALLOC_MEM_FLAGS_*, ...
QUEUE_TYPE_COMPUTE, QUEUE_TYPE_SDMA, QUEUE_TYPE_COMPUTE_AQL = 0, 1, 2
EVENT_SIGNAL, EVENT_MEMORY = 0, 8
WAIT_RESULT_COMPLETE, WAIT_RESULT_TIMEOUT, WAIT_RESULT_FAIL = 0, 1, 2
SIGNAL_EVENT_LIMIT = 4096  # KFD_SIGNAL_EVENT_LIMIT: slots in the event page, 8 bytes each
ALLOC_VRAM, ALLOC_GTT, ALLOC_USERPTR, ALLOC_DOORBELL = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ALLOC_WRITABLE, ALLOC_EXECUTABLE, ALLOC_PUBLIC = 1 << 31, 1 << 30, 1 << 29
ALLOC_NO_SUBSTITUTE, ALLOC_AQL_QUEUE_MEM, ALLOC_COHERENT, ALLOC_UNCACHED = 1 << 28, 1 << 27, 1 << 26, 1 << 25
ALLOC_MMIO_REMAP, ALLOC_EXT_COHERENT = 1 << 4, 1 << 24  # KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP / _EXT_COHERENT
MIN_QUEUE_RING_SIZE = 1024  # KFD_MIN_QUEUE_RING_SIZE: CREATE_QUEUE clamps a smaller (power of 2 or 0) ring to it
RUNTIME_ENABLE_MODE_ENABLE_MASK, RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK = 1, 2

_IOW, _IOR, _IOWR = 1, 2, 3
# name: (direction, nr, struct) -- the AMDKFD_IOC_* defines of kfd_ioctl.h
IOCTLS: dict[str, tuple[int, int, str]] = {
  "GET_VERSION": (_IOR, 0x01, "kfd_ioctl_get_version_args"),
  "CREATE_QUEUE": (_IOWR, 0x02, "kfd_ioctl_create_queue_args"),
  "DESTROY_QUEUE": (_IOWR, 0x03, "kfd_ioctl_destroy_queue_args"),
  "CREATE_EVENT": (_IOWR, 0x08, "kfd_ioctl_create_event_args"),
  "DESTROY_EVENT": (_IOW, 0x09, "kfd_ioctl_destroy_event_args"),
  "WAIT_EVENTS": (_IOWR, 0x0C, "kfd_ioctl_wait_events_args"),
  "ACQUIRE_VM": (_IOW, 0x15, "kfd_ioctl_acquire_vm_args"),
  "ALLOC_MEMORY_OF_GPU": (_IOWR, 0x16, "kfd_ioctl_alloc_memory_of_gpu_args"),
  "FREE_MEMORY_OF_GPU": (_IOW, 0x17, "kfd_ioctl_free_memory_of_gpu_args"),
  "MAP_MEMORY_TO_GPU": (_IOWR, 0x18, "kfd_ioctl_map_memory_to_gpu_args"),
  "UNMAP_MEMORY_FROM_GPU": (_IOWR, 0x19, "kfd_ioctl_unmap_memory_from_gpu_args"),
  "RUNTIME_ENABLE": (_IOWR, 0x25, "kfd_ioctl_runtime_enable_args"),
}


def ioctl_number(name: str) -> int:
  """`AMDKFD_IOC_<name>` as the kernel computes it: `_IOC(dir, 'K', nr, sizeof(struct))`."""
  d, nr, st = IOCTLS[name]
  return ioc(d, "K", nr, ffi.sizeof(f"struct {st}"))


IOCTL_BY_NUMBER: dict[int, str] = {ioctl_number(n): n for n in IOCTLS}

KFD_PATH = "/dev/kfd"
TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"


class KFDError(RuntimeError):
  """An ioctl on /dev/kfd failed."""


@dataclass(frozen=True)
class GPUNode:
  """One GPU node of the KFD topology (fields from its sysfs `properties` file)."""
  node: int
  gpu_id: int
  gfx_target_version: int   # e.g. 110000 for gfx1100 (major*10000 + minor*100 + stepping)
  simd_count: int
  simd_per_cu: int
  lds_size_in_kb: int
  drm_render_minor: int
  props: tuple[tuple[str, int], ...] = ()

  @property
  def arch(self) -> str:
    """The LLVM target name: 110000 -> gfx1100, 90010 -> gfx90a."""
    v = self.gfx_target_version
    return f"gfx{v // 10000}{(v // 100) % 100:x}{v % 100:x}"

  @property
  def cu_count(self) -> int: return self.simd_count // max(self.simd_per_cu, 1)

  @property
  def num_xcc(self) -> int:
    """XCCs (compute dies) this node spans: 8 for an MI300X in SPX mode, 1 for a CPX partition or a one-die GPU."""
    return max(dict(self.props).get("num_xcc", 1), 1)

  @property
  def shader_engines(self) -> int:
    """Shader engines: array_count (shader arrays) / simd_arrays_per_engine (1 when the topology lacks them)."""
    p = dict(self.props)
    return max(p.get("array_count", 1) // max(p.get("simd_arrays_per_engine", 1), 1), 1)

  @property
  def cwsr(self) -> CWSRSizes | None:
    """The CWSR area sizes compute queues on this node need (`cwsr_sizes`)."""
    return cwsr_sizes(dict(self.props))


@dataclass(frozen=True)
class CWSRSizes:
  """The compute-wave save/restore (CWSR) area a compute queue must come with, in bytes.

  `ctx_save_restore_size` and `ctl_stack_size` go to CREATE_QUEUE as they are (the kernel refuses other values); the
  area itself is `alloc_size` bytes: per XCC a control stack (starting with a 40-byte HsaUserContextSaveAreaHeader)
  and the work-group save data, then `debug_memory_size` bytes per XCC for the debugger.
  """
  ctl_stack_size: int
  ctx_save_restore_size: int
  debug_memory_size: int
  alloc_size: int
  eop_buffer_size: int
  num_xcc: int = 1


PAGE = 0x1000
CTX_HEADER_SIZE = 40  # sizeof(HsaUserContextSaveAreaHeader)


def _align(x: int, a: int) -> int: return (x + a - 1) // a * a


def cwsr_alloc_size(ctx_save_restore_size: int, cw: CWSRSizes) -> int:
  """The CWSR BO KFD requires for a queue asking `ctx_save_restore_size` (kfd_queue.c kfd_queue_acquire_buffers:
  ALIGN((ctx_save_restore_area_size + debug_memory_size) * NUM_XCC, PAGE_SIZE))."""
  return _align((ctx_save_restore_size + cw.debug_memory_size) * cw.num_xcc, PAGE)


def cwsr_sizes(props: dict[str, int]) -> CWSRSizes | None:
  """CWSR sizes for a GPU node from its topology properties, as the amdgpu KFD computes and checks them (kfd_queue.c;
  the ROCm thunk's queues.c agrees): per CU the VGPR file (0x60000 bytes on gfx1100/1101/1200/1201, 0x80000 on
  gfx908/90a/94x/950, else 0x40000) + 0x4000 SGPRs + LDS (0x10000; gfx950: its LDS size) + 0x1000 HW registers; a
  control stack of 12 bytes per wave (8 before gfx10.1) + 8, 32 waves per CU on gfx10.1+. None before gfx8.0.1."""
  gfxv = props.get("gfx_target_version", 0)
  if gfxv < 80001 or not props.get("simd_count") or not props.get("simd_per_cu"): return None
  num_xcc = max(props.get("num_xcc", 1), 1)
  cu_num = props["simd_count"] // props["simd_per_cu"] // num_xcc
  if gfxv < 100100:
    wave_num = min(cu_num * 40, props.get("array_count", 1) // max(props.get("simd_arrays_per_engine", 1), 1) * 512)
  else: wave_num = cu_num * 32
  if gfxv // 100 * 100 == 90400 or gfxv in (90010, 90008, 90500): vgpr = 0x80000
  elif gfxv in (110000, 110001, 120000, 120001): vgpr = 0x60000
  else: vgpr = 0x40000
  lds = props.get("lds_size_in_kb", 64) << 10 if gfxv == 90500 else 0x10000
  wg_data = _align(cu_num * (vgpr + 0x4000 + lds + 0x1000), PAGE)
  ctl_stack = _align(CTX_HEADER_SIZE + wave_num * (12 if gfxv >= 100100 else 8) + 8, PAGE)
  if gfxv // 10000 == 10: ctl_stack = min(ctl_stack, 0x7000)  # gfx10's hardware limit
  debug = _align(wave_num * 32, 64)
  cwsr = ctl_stack + wg_data
  return CWSRSizes(ctl_stack, cwsr, debug, _align((cwsr + debug) * num_xcc, PAGE),
                   0x8000 if gfxv == 80002 else 4096, num_xcc)


def parse_properties(text: str) -> dict[str, int]:
  """A sysfs `properties` file ("name value" per line) as a dict of ints."""
  out: dict[str, int] = {}
  for line in text.splitlines():
    if len(parts := line.split()) == 2 and parts[1].lstrip("-").isdigit(): out[parts[0]] = int(parts[1])
  return out


def gpu_nodes(fio: type[FileIOInterface] = FileIOInterface) -> list[GPUNode]:
  """The topology's GPU nodes (CPU-only nodes have gpu_id 0), in node order."""
  out: list[GPUNode] = []
  if not fio.exists(TOPOLOGY): return out
  for n in sorted(fio.listdir(TOPOLOGY), key=lambda s: int(s) if s.isdigit() else -1):
    if not n.isdigit(): continue
    gpu_id = int(fio(f"{TOPOLOGY}/{n}/gpu_id").read().strip() or 0)
    if gpu_id == 0: continue
    p = parse_properties(fio(f"{TOPOLOGY}/{n}/properties").read())
    if p.get("simd_count", 0) == 0: continue
    out.append(GPUNode(int(n), gpu_id, p.get("gfx_target_version", 0), p["simd_count"], p.get("simd_per_cu", 2),
                       p.get("lds_size_in_kb", 64), p.get("drm_render_minor", 128), tuple(sorted(p.items()))))
  return out


def _call(kfd: FileIOInterface, name: str, **fields: Any) -> Any:
  """Run `AMDKFD_IOC_<name>` on `kfd` with a fresh argument struct filled from `fields`; the struct after the call."""
  if name not in IOCTLS: raise ValueError(f"unknown KFD ioctl {name!r}; known: {', '.join(IOCTLS)}")
  st = ffi.new(f"struct {IOCTLS[name][2]} *")
  for k, v in fields.items(): setattr(st, k, v)
  try: kfd.ioctl(ioctl_number(name), ffi.buffer(st))
  except OSError as e:
    raise KFDError(f"KFD ioctl {name}({fields}) failed: {errno_name(e.errno or 0)} ({e.strerror})") from e
  return st


@dataclass
class KFDMem:
  """A KFD allocation (`HCQBuffer.meta`): its handle and the gpu ids it is mapped to (the owner first)."""
  handle: int
  gpu_ids: list[int]


@dataclass(frozen=True)
class KFDEvent:
  """A KFD signal event: its id (the interrupt context id a GPU raises for it) and the VA of its mailbox slot in the
  process's event page (where the GPU writes the id before the interrupt)."""
  event_id: int
  mailbox: int


class KFDProcess:
  """This process's KFD context: `/dev/kfd` opened once per FileIOInterface class, the runtime enabled once (before any
  queue), and the event page that every GPU of the process writes its event mailboxes to."""
  _by_fio: ClassVar[dict[type, KFDProcess]] = {}

  def __init__(self, fio: type[FileIOInterface]):
    self.fio = fio
    self.kfd = fio(KFD_PATH, os.O_RDWR | os.O_CLOEXEC)
    ver = _call(self.kfd, "GET_VERSION")
    if ver.major_version != 1:
      raise RuntimeError(f"KFD ioctl interface {ver.major_version}.{ver.minor_version}; need 1.x")
    self.version = (ver.major_version, ver.minor_version)
    self.runtime_enabled = False
    self.event_page: HCQBuffer | None = None

  @classmethod
  def get(cls, fio: type[FileIOInterface]) -> KFDProcess:
    if (p := cls._by_fio.get(fio)) is None: p = cls._by_fio[fio] = KFDProcess(fio)
    return p

  def enable_runtime(self) -> None:
    """AMDKFD_IOC_RUNTIME_ENABLE, as ROCr does before its first queue: the KFD debugger can attach to this process,
    and on MES GPUs the kernel programs the per-process CWSR/trap setup. EBUSY means it is already enabled."""
    if self.runtime_enabled: return
    try: _call(self.kfd, "RUNTIME_ENABLE", r_debug=0, mode_mask=RUNTIME_ENABLE_MODE_ENABLE_MASK)
    except KFDError as e:
      if not isinstance(e.__cause__, OSError) or e.__cause__.errno != errno.EBUSY: raise
    self.runtime_enabled = True


class KFDIface:
  """The driver's view of one GPU through KFD: `KFDIface(dev_id=0)` picks the dev_id-th GPU node of the topology,
  checks permissions with a clear error, acquires the GPU VM for this process, and offers `alloc`/`map`/`free`,
  queues, and signal events (`create_event`, `wait_event`)."""

  def __init__(self, dev_id: int = 0, fio: type[FileIOInterface] = FileIOInterface):
    self.fio = fio
    if not fio.exists(KFD_PATH):
      from tiny_uop.plugins import DeviceUnavailableError
      raise DeviceUnavailableError(f"no {KFD_PATH} (no AMD GPU driver on this machine); for an emulated AMD GPU use "
                                   "DEV=MOCK+AMD")
    if not fio.access(KFD_PATH, os.R_OK | os.W_OK):
      raise RuntimeError(f"{KFD_PATH} is not readable and writable by this user: join the 'render' and 'video' groups "
                         "(sudo usermod -aG render,video $USER, then log in again)")
    self.nodes = gpu_nodes(fio)
    if not self.nodes: raise RuntimeError(f"{KFD_PATH} exists but the KFD topology ({TOPOLOGY}) lists no GPU node")
    if not 0 <= dev_id < len(self.nodes):
      n = len(self.nodes)
      raise RuntimeError(f"AMD:{dev_id} does not exist; this machine has {n} AMD GPU(s): AMD:0..{n - 1}")
    self.node = self.nodes[dev_id]
    render = f"/dev/dri/renderD{self.node.drm_render_minor}"
    if not fio.access(render, os.R_OK | os.W_OK):
      raise RuntimeError(f"{render} is not readable and writable by this user: join the 'render' group")
    self.proc = KFDProcess.get(fio)
    self.kfd, self.version = self.proc.kfd, self.proc.version
    self.drm = fio(render, os.O_RDWR | os.O_CLOEXEC)
    self.ioctl("ACQUIRE_VM", drm_fd=self.drm.fd if self.drm.fd is not None else 0, gpu_id=self.node.gpu_id)

  @staticmethod
  def gpu_nodes(fio: type[FileIOInterface] = FileIOInterface) -> list[GPUNode]:
    return gpu_nodes(fio)

  def ioctl(self, name: str, **fields: Any) -> Any:
    """Run `AMDKFD_IOC_<name>` with a fresh argument struct filled from `fields`; return the struct after the call."""
    return _call(self.kfd, name, **fields)

  def alloc(self, size: int, host: bool = False, uncached: bool = False, cpu_access: bool = False) -> HCQBuffer:
    """GPU memory mapped to this GPU: VRAM (host-visible when cpu_access) or host memory (GTT) when `host`.
    The VA is reserved on the host first so the buffer has the same address on both sides."""
    size = (size + 0xFFF) & ~0xFFF
    va = self.fio.anon_mmap(0, size, 0, MAP_PRIVATE | MAP_NORESERVE)
    flags = ALLOC_WRITABLE | ALLOC_EXECUTABLE | ALLOC_NO_SUBSTITUTE
    flags |= (ALLOC_GTT if host else ALLOC_VRAM) | (ALLOC_PUBLIC if cpu_access or host else 0)
    flags |= ALLOC_COHERENT | ALLOC_UNCACHED if uncached else 0
    mem = self.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va, size=size, gpu_id=self.node.gpu_id, flags=flags)
    mapped = bool(cpu_access or host)
    if mapped:
      addr = self.drm.mmap(va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, mem.mmap_offset)
      if addr != va: raise KFDError(f"render node mmap landed at {addr:#x}, not the reserved {va:#x}")
    buf = HCQBuffer(va, size, meta=KFDMem(mem.handle, []), cpu_mapped=mapped)
    self.map(buf)
    return buf

  def _map_ioctl(self, name: str, mem: KFDMem, gpu_ids: list[int]) -> None:
    ids = ffi.new(f"uint32_t[{len(gpu_ids)}]", gpu_ids)
    r = self.ioctl(name, handle=mem.handle, device_ids_array_ptr=int(ffi.cast("uintptr_t", ids)),
                   n_devices=len(gpu_ids), n_success=0)
    if r.n_success != len(gpu_ids):
      raise KFDError(f"KFD {name} of handle {mem.handle:#x} reached {r.n_success} of the GPUs {gpu_ids}")

  def map(self, buf: HCQBuffer) -> HCQBuffer:
    """Map `buf` (an allocation of any GPU of this process) into this GPU's VM too: one MAP_MEMORY_TO_GPU with every
    gpu id it should be mapped to (KFD skips those already mapped). A peer GPU reaches another's memory this way."""
    mem: KFDMem = (buf.base or buf).meta
    if self.node.gpu_id in mem.gpu_ids: return buf
    self._map_ioctl("MAP_MEMORY_TO_GPU", mem, mem.gpu_ids + [self.node.gpu_id])
    mem.gpu_ids.append(self.node.gpu_id)
    return buf

  def free(self, buf: HCQBuffer) -> None:
    """Unmap from every GPU it is mapped to, free, and drop the host reservation."""
    mem: KFDMem = buf.meta
    if mem.gpu_ids: self._map_ioctl("UNMAP_MEMORY_FROM_GPU", mem, mem.gpu_ids)
    mem.gpu_ids = []
    self.ioctl("FREE_MEMORY_OF_GPU", handle=mem.handle)
    self.fio().munmap(buf.va_addr, buf.size)

  def create_event(self) -> KFDEvent:
    """A signal event for this GPU's interrupts (auto reset). The first event of the process hands KFD the event page
    (allocated here, host memory); every GPU that signals events gets the page mapped."""
    extra: dict[str, int] = {}
    if self.proc.event_page is None:
      self.proc.event_page = self.alloc(SIGNAL_EVENT_LIMIT * 8, host=True, uncached=True)
      extra["event_page_offset"] = self.proc.event_page.meta.handle
    self.map(self.proc.event_page)
    ev = self.ioctl("CREATE_EVENT", event_type=EVENT_SIGNAL, auto_reset=1, node_id=self.node.node, **extra)
    return KFDEvent(ev.event_id, self.proc.event_page.va_addr + 8 * ev.event_slot_index)

  def wait_event(self, event: KFDEvent, timeout_ms: int) -> bool:
    """Sleep in the kernel until `event` is signaled (True) or `timeout_ms` passed (False)."""
    data = ffi.new("struct kfd_event_data[1]")
    data[0].event_id = event.event_id
    r = self.ioctl("WAIT_EVENTS", events_ptr=int(ffi.cast("uintptr_t", data)), num_events=1, wait_for_all=1,
                   timeout=max(int(timeout_ms), 0))
    if r.wait_result == WAIT_RESULT_FAIL: raise KFDError(f"KFD WAIT_EVENTS on event {event.event_id} failed")
    return r.wait_result == WAIT_RESULT_COMPLETE

  def create_queue(self, **fields: Any) -> Any:
    """CREATE_QUEUE on this GPU, the process runtime enabled first (ROCr's order; KFD refuses it after a queue)."""
    self.proc.enable_runtime()
    return self.ioctl("CREATE_QUEUE", gpu_id=self.node.gpu_id, **fields)
