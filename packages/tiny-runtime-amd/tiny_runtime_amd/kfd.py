"""The KFD kernel interface: ioctl argument structs (cffi), ioctl numbers, and `KFDIface` (open, topology, ioctls).

Struct layouts and ioctl numbers are those of the Linux UAPI header `include/uapi/linux/kfd_ioctl.h` (KFD ioctl
interface 1.x; `AMDKFD_IOCTL_BASE 'K'`, `AMDKFD_IOR/IOW/IOWR(nr, struct)`). Topology comes from sysfs
(`/sys/devices/virtual/kfd/kfd/topology/nodes/<n>/properties`, `gpu_id`), as the kernel's `kfd_topology.c` writes it.
All file access goes through a `FileIOInterface`, so `MOCK+AMD` substitutes an in-process driver (`mock/`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

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
  uint32_t ctx_save_restore_size; uint32_t ctl_stack_size;
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
""")

# kfd_ioctl.h: KFD_IOC_QUEUE_TYPE_*, KFD_IOC_EVENT_*, KFD_IOC_WAIT_RESULT_*, KFD_IOC_ALLOC_MEM_FLAGS_*
QUEUE_TYPE_COMPUTE, QUEUE_TYPE_SDMA, QUEUE_TYPE_COMPUTE_AQL = 0, 1, 2
EVENT_SIGNAL, EVENT_MEMORY = 0, 8
WAIT_RESULT_COMPLETE, WAIT_RESULT_TIMEOUT, WAIT_RESULT_FAIL = 0, 1, 2
ALLOC_VRAM, ALLOC_GTT, ALLOC_USERPTR, ALLOC_DOORBELL = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ALLOC_WRITABLE, ALLOC_EXECUTABLE, ALLOC_PUBLIC = 1 << 31, 1 << 30, 1 << 29
ALLOC_NO_SUBSTITUTE, ALLOC_AQL_QUEUE_MEM, ALLOC_COHERENT, ALLOC_UNCACHED = 1 << 28, 1 << 27, 1 << 26, 1 << 25

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


class KFDIface:
  """The driver's view of KFD: `/dev/kfd` and the GPU's render node, opened through `fio` (a FileIOInterface class).

  `KFDIface(dev_id=0)` picks the dev_id-th GPU node of the topology, checks permissions with a clear error, acquires
  the GPU VM for this process, and offers `alloc`/`free`/`create_queue`/`create_event`/`wait_events` by name.
  """

  def __init__(self, dev_id: int = 0, fio: type[FileIOInterface] = FileIOInterface):
    self.fio = fio
    if not fio.exists(KFD_PATH):
      from tiny_uop.plugins import DeviceUnavailableError
      raise DeviceUnavailableError(f"no {KFD_PATH} (no AMD GPU driver on this machine); for an emulated AMD GPU use "
                                   "DEV=MOCK+AMD")
    if not fio.access(KFD_PATH, os.R_OK | os.W_OK):
      raise RuntimeError(f"{KFD_PATH} is not readable and writable by this user: join the 'render' and 'video' groups "
                         "(sudo usermod -aG render,video $USER, then log in again)")
    self.kfd = fio(KFD_PATH, os.O_RDWR | os.O_CLOEXEC)
    self.nodes = self.gpu_nodes(fio)
    if not self.nodes: raise RuntimeError(f"{KFD_PATH} exists but the KFD topology ({TOPOLOGY}) lists no GPU node")
    if not 0 <= dev_id < len(self.nodes):
      n = len(self.nodes)
      raise RuntimeError(f"AMD:{dev_id} does not exist; this machine has {n} AMD GPU(s): AMD:0..{n - 1}")
    self.node = self.nodes[dev_id]
    render = f"/dev/dri/renderD{self.node.drm_render_minor}"
    if not fio.access(render, os.R_OK | os.W_OK):
      raise RuntimeError(f"{render} is not readable and writable by this user: join the 'render' group")
    self.drm = fio(render, os.O_RDWR | os.O_CLOEXEC)
    ver = self.ioctl("GET_VERSION")
    if ver.major_version != 1:
      raise RuntimeError(f"KFD ioctl interface {ver.major_version}.{ver.minor_version}; need 1.x")
    self.version = (ver.major_version, ver.minor_version)
    self.ioctl("ACQUIRE_VM", drm_fd=self.drm.fd if self.drm.fd is not None else 0, gpu_id=self.node.gpu_id)

  @staticmethod
  def gpu_nodes(fio: type[FileIOInterface] = FileIOInterface) -> list[GPUNode]:
    """The topology's GPU nodes (CPU-only nodes have gpu_id 0), in node order."""
    out = []
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

  def ioctl(self, name: str, **fields: Any) -> Any:
    """Run `AMDKFD_IOC_<name>` with a fresh argument struct filled from `fields`; return the struct after the call."""
    if name not in IOCTLS: raise ValueError(f"unknown KFD ioctl {name!r}; known: {', '.join(IOCTLS)}")
    st = ffi.new(f"struct {IOCTLS[name][2]} *")
    for k, v in fields.items(): setattr(st, k, v)
    buf = ffi.buffer(st)
    try: self.kfd.ioctl(ioctl_number(name), buf)
    except OSError as e:
      raise KFDError(f"KFD ioctl {name}({fields}) failed: {errno_name(e.errno or 0)} ({e.strerror})") from e
    return st

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
    ids = ffi.new("uint32_t[1]", [self.node.gpu_id])
    self.ioctl("MAP_MEMORY_TO_GPU", handle=mem.handle, device_ids_array_ptr=_addr(ids), n_devices=1)
    return HCQBuffer(va, size, meta=(mem.handle, ids), cpu_mapped=mapped)

  def free(self, buf: HCQBuffer) -> None:
    """Unmap from the GPU, free, and drop the host reservation."""
    handle, ids = buf.meta
    self.ioctl("UNMAP_MEMORY_FROM_GPU", handle=handle, device_ids_array_ptr=_addr(ids), n_devices=1)
    self.ioctl("FREE_MEMORY_OF_GPU", handle=handle)
    self.fio().munmap(buf.va_addr, buf.size)


def _addr(cdata: Any) -> int: return int(ffi.cast("uintptr_t", cdata))
