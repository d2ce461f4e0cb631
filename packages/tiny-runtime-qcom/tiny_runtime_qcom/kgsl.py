"""The KGSL kernel interface (`/dev/kgsl-3d0`): ioctl argument structs (cffi), ioctl numbers, flags, and `KGSLIface`.

Struct layouts, ioctl numbers and flag values are those of the Linux UAPI header `include/uapi/linux/msm_kgsl.h`
(`KGSL_IOC_TYPE 0x09`; `_IOW/_IOR/_IOWR(KGSL_IOC_TYPE, nr, struct)`), KGSL 3.14. Field widths are the header's on a
64-bit kernel (`unsigned int` 32 bits; `unsigned long`, `size_t` and pointers 64 bits). All file access goes through a
`FileIOInterface`, so `MOCK+QCOM` substitutes an in-process driver (`mock/`).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import cffi

from tiny_uop.hcq import MAP_SHARED, PROT_READ, PROT_WRITE, FileIOInterface, HCQBuffer, errno_name, ioc

ffi = cffi.FFI()
# msm_kgsl.h, field order and widths as there
ffi.cdef("""
struct kgsl_devinfo { uint32_t device_id; uint32_t chip_id; uint32_t mmu_enabled; uint64_t gmem_gpubaseaddr;
                      uint32_t gpu_id; uint64_t gmem_sizebytes; };
struct kgsl_version { uint32_t drv_major; uint32_t drv_minor; uint32_t dev_major; uint32_t dev_minor; };
struct kgsl_device_getproperty { uint32_t type; void *value; uint64_t sizebytes; };
struct kgsl_device_constraint { uint32_t type; uint32_t context_id; void *data; uint64_t size; };
struct kgsl_device_constraint_pwrlevel { uint32_t level; };
struct kgsl_device_waittimestamp_ctxtid { uint32_t context_id; uint32_t timestamp; uint32_t timeout; };
struct kgsl_cmdstream_readtimestamp_ctxtid { uint32_t context_id; uint32_t type; uint32_t timestamp; };
struct kgsl_drawctxt_create { uint32_t flags; uint32_t drawctxt_id; };
struct kgsl_drawctxt_destroy { uint32_t drawctxt_id; };
struct kgsl_gpuobj_alloc { uint64_t size; uint64_t flags; uint64_t va_len; uint64_t mmapsize; uint32_t id;
                           uint32_t metadata_len; uint64_t metadata; };
struct kgsl_gpuobj_free { uint64_t flags; uint64_t priv; uint32_t id; uint32_t type; uint32_t len; };
struct kgsl_gpuobj_info { uint64_t gpuaddr; uint64_t flags; uint64_t size; uint64_t va_len; uint64_t va_addr;
                          uint32_t id; };
struct kgsl_command_object { uint64_t offset; uint64_t gpuaddr; uint64_t size; uint32_t flags; uint32_t id; };
struct kgsl_gpu_command { uint64_t flags; uint64_t cmdlist; uint32_t cmdsize; uint32_t numcmds; uint64_t objlist;
                          uint32_t objsize; uint32_t numobjs; uint64_t synclist; uint32_t syncsize; uint32_t numsyncs;
                          uint32_t context_id; uint32_t timestamp; };
struct kgsl_command_syncpoint { uint64_t priv; uint64_t size; uint32_t type; };
struct kgsl_cmd_syncpoint_timestamp { uint32_t context_id; uint32_t timestamp; };
struct kgsl_gpu_event_timestamp { uint32_t context_id; uint32_t timestamp; };
""")

KGSL_IOC_TYPE = 0x09
_IOW, _IOR, _IOWR = 1, 2, 3
# name: (direction, nr, struct) -- the IOCTL_KGSL_* defines of msm_kgsl.h
IOCTLS: dict[str, tuple[int, int, str]] = {
  "DEVICE_GETPROPERTY": (_IOWR, 0x02, "kgsl_device_getproperty"),
  "DEVICE_WAITTIMESTAMP_CTXTID": (_IOW, 0x07, "kgsl_device_waittimestamp_ctxtid"),
  "DRAWCTXT_CREATE": (_IOWR, 0x13, "kgsl_drawctxt_create"),
  "SETPROPERTY": (_IOW, 0x32, "kgsl_device_getproperty"),
  "DRAWCTXT_DESTROY": (_IOW, 0x14, "kgsl_drawctxt_destroy"),
  "CMDSTREAM_READTIMESTAMP_CTXTID": (_IOWR, 0x16, "kgsl_cmdstream_readtimestamp_ctxtid"),
  "GPUOBJ_ALLOC": (_IOWR, 0x45, "kgsl_gpuobj_alloc"),
  "GPUOBJ_FREE": (_IOW, 0x46, "kgsl_gpuobj_free"),
  "GPUOBJ_INFO": (_IOWR, 0x47, "kgsl_gpuobj_info"),
  "GPU_COMMAND": (_IOWR, 0x4A, "kgsl_gpu_command"),
}


def ioctl_number(name: str) -> int:
  """`IOCTL_KGSL_<name>` as the kernel computes it: `_IOC(dir, KGSL_IOC_TYPE, nr, sizeof(struct))`."""
  d, nr, st = IOCTLS[name]
  return ioc(d, chr(KGSL_IOC_TYPE), nr, ffi.sizeof(f"struct {st}"))


IOCTL_BY_NUMBER: dict[int, str] = {ioctl_number(n): n for n in IOCTLS}
IOCTL_BY_NR: dict[int, str] = {nr: n for n, (_, nr, _) in IOCTLS.items()}  # KGSL dispatches on _IOC_NR alone

# msm_kgsl.h: properties, context flags, memory flags, command flags, timestamp types
PROP_DEVICE_INFO, PROP_VERSION, PROP_PWR_CONSTRAINT = 0x1, 0x8, 0x12
CONTEXT_NO_GMEM_ALLOC, CONTEXT_PREAMBLE, CONTEXT_NO_FAULT_TOLERANCE = 0x2, 0x10, 0x200
CONTEXT_PWR_CONSTRAINT = 0x800  # the context may carry a power constraint (set with SETPROPERTY PWR_CONSTRAINT)
# struct kgsl_device_constraint: its types, and the PWRLEVEL levels (only two: min and max frequency)
CONSTRAINT_NONE, CONSTRAINT_PWRLEVEL, CONSTRAINT_PWR_MIN, CONSTRAINT_PWR_MAX = 0, 1, 0, 1
CONTEXT_PRIORITY_SHIFT, CONTEXT_PRIORITY_MASK = 12, 0xF000
CONTEXT_TYPE_SHIFT, CONTEXT_TYPE_MASK, CONTEXT_TYPE_CL = 20, 0x01F00000, 2
CONTEXT_PREEMPT_STYLE_SHIFT, CONTEXT_PREEMPT_STYLE_MASK, CONTEXT_PREEMPT_STYLE_FINEGRAIN = 25, 0x0E000000, 0x2
MEMFLAGS_USE_CPU_MAP = 0x10000000
MEMFLAGS_GPUREADONLY, MEMFLAGS_SECURE, MEMFLAGS_FORCE_32BIT = 0x01000000, 0x00000008, 0x100000000
MEMALIGN_SHIFT, MEMALIGN_MASK = 16, 0x00FF0000
CACHEMODE_SHIFT, CACHEMODE_MASK, CACHEMODE_WRITECOMBINE, CACHEMODE_UNCACHED = 26, 0x0C000000, 0, 1
MEMTYPE_SHIFT, MEMTYPE_MASK, MEMTYPE_CL = 8, 0x0000FF00, 10
CMDLIST_IB, CMDLIST_CTXTSWITCH_PREAMBLE, CMDLIST_IB_PREAMBLE = 0x1, 0x2, 0x4  # struct kgsl_command_object flags
OBJLIST_MEMOBJ, OBJLIST_PROFILE = 0x8, 0x10                                     # ... in a GPU_COMMAND's objlist
CMD_SYNCPOINT_TYPE_TIMESTAMP, CMD_SYNCPOINT_TYPE_FENCE = 0, 1                   # struct kgsl_command_syncpoint type
DRAWOBJ_MARKER, DRAWOBJ_SYNC = 0x2, 0x400  # GPU_COMMAND flags (KGSL_CMDBATCH_MARKER, KGSL_CMDBATCH_SYNC)
GPUOBJ_FREE_ON_EVENT, GPU_EVENT_TIMESTAMP, GPU_EVENT_FENCE = 1, 1, 2            # GPUOBJ_FREE flags and event types
TIMESTAMP_CONSUMED, TIMESTAMP_RETIRED, TIMESTAMP_QUEUED = 1, 2, 3  # enum kgsl_timestamp_type
KGSL_PATH = "/dev/kgsl-3d0"
PAGE = 0x1000


def field(value: int, shift: int, mask: int) -> int:
  """`value` placed at `shift` inside `mask` (ValueError when it doesn't fit)."""
  v = value << shift
  if v & ~mask: raise ValueError(f"{value:#x} << {shift} does not fit mask {mask:#x}")
  return v


class KGSLError(RuntimeError):
  """An ioctl on /dev/kgsl-3d0 failed."""


@dataclass(frozen=True)
class DevInfo:
  """KGSL_PROP_DEVICE_INFO of the GPU: chip id 0xMMmmPPxx -> Adreno major.minor.patch (a630: 6.3.0)."""
  chip_id: int
  gpu_id: int
  gmem_bytes: int

  @property
  def version(self) -> tuple[int, int, int]: return (self.chip_id >> 24, (self.chip_id >> 16) & 0xFF,
                                                     (self.chip_id >> 8) & 0xFF)
  @property
  def arch(self) -> str:
    """`a630`-style name."""
    major, minor, patch = self.version
    return f"a{major}{minor}{patch}"


class KGSLIface:
  """The driver's view of KGSL: `/dev/kgsl-3d0` opened through `fio` (a FileIOInterface class).

  Opens the device (a clear error without it), reads the device info (chip id), creates a draw context for compute,
  and offers `alloc`/`free` (GPU objects with a CPU mapping at the same address), `submit` (GPU_COMMAND of command
  buffers in GPU memory, returning the KGSL timestamp) and `wait_timestamp`.
  """

  def __init__(self, fio: type[FileIOInterface] = FileIOInterface):
    self.fio = fio
    if not fio.exists(KGSL_PATH): raise RuntimeError(f"no Adreno GPU ({KGSL_PATH} not found)")
    if not fio.access(KGSL_PATH, os.R_OK | os.W_OK):
      raise RuntimeError(f"{KGSL_PATH} is not readable and writable by this user (on Android: run as a user in the "
                         "graphics group, e.g. adb shell)")
    self.dev = fio(KGSL_PATH, os.O_RDWR | os.O_CLOEXEC)
    info = ffi.new("struct kgsl_devinfo*")
    self.ioctl("DEVICE_GETPROPERTY", type=PROP_DEVICE_INFO, value=info, sizebytes=ffi.sizeof(info[0]))
    self.info = DevInfo(info.chip_id, info.gpu_id, info.gmem_sizebytes)
    if self.info.version[0] != 6:
      raise RuntimeError(f"Adreno {self.info.arch} (chip id {self.info.chip_id:#010x}) is not supported: this driver "
                         "writes a6xx command streams (Adreno 6xx)")
    flags = CONTEXT_PREAMBLE | CONTEXT_NO_GMEM_ALLOC | CONTEXT_NO_FAULT_TOLERANCE | \
      field(CONTEXT_TYPE_CL, CONTEXT_TYPE_SHIFT, CONTEXT_TYPE_MASK) | \
      field(CONTEXT_PREEMPT_STYLE_FINEGRAIN, CONTEXT_PREEMPT_STYLE_SHIFT, CONTEXT_PREEMPT_STYLE_MASK)
    self.ctx = self.ioctl("DRAWCTXT_CREATE", flags=flags).drawctxt_id
    self.last_timestamp = 0
    self._map_lock = threading.Lock()

  def ioctl(self, name: str, **fields: Any) -> Any:
    """Run `IOCTL_KGSL_<name>` with a fresh argument struct filled from `fields`; return the struct after the call."""
    if name not in IOCTLS: raise ValueError(f"unknown KGSL ioctl {name!r}; known: {', '.join(IOCTLS)}")
    st = ffi.new(f"struct {IOCTLS[name][2]} *")
    for k, v in fields.items(): setattr(st, k, v)
    try: self.dev.ioctl(ioctl_number(name), ffi.buffer(st))
    except OSError as e:
      shown = {k: v for k, v in fields.items() if isinstance(v, int)}
      raise KGSLError(f"KGSL ioctl {name}({shown}) failed: {errno_name(e.errno or 0)} ({e.strerror})") from e
    return st

  def alloc(self, size: int, uncached: bool = False) -> HCQBuffer:
    """A GPU object of `size` bytes (rounded up to pages), mapped on the CPU with KGSL_MEMFLAGS_USE_CPU_MAP, so its
    GPU address is the address of the CPU mapping (mmap of the device file at offset id << 12)."""
    size = (max(size, 1) + PAGE - 1) & ~(PAGE - 1)
    flags = MEMFLAGS_USE_CPU_MAP | field(12, MEMALIGN_SHIFT, MEMALIGN_MASK) | field(MEMTYPE_CL, MEMTYPE_SHIFT,
                                                                                     MEMTYPE_MASK)
    if uncached: flags |= field(CACHEMODE_UNCACHED, CACHEMODE_SHIFT, CACHEMODE_MASK)
    with self._map_lock:  # the object and its CPU mapping come and go together (the mapping is its GPU address)
      obj = self.ioctl("GPUOBJ_ALLOC", size=size, flags=flags, va_len=0, mmapsize=size)
      addr = self.dev.mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, obj.id * PAGE)
      info = self.ioctl("GPUOBJ_INFO", id=obj.id)
      if info.gpuaddr != addr:
        self.dev.munmap(addr, size)
        self.ioctl("GPUOBJ_FREE", id=obj.id)
    if info.gpuaddr != addr:
      raise KGSLError(f"GPU object {obj.id}: GPU address {info.gpuaddr:#x} is not its CPU mapping {addr:#x} "
                      "(KGSL_MEMFLAGS_USE_CPU_MAP unsupported?)")
    return HCQBuffer(addr, size, meta=obj.id, cpu_mapped=True)

  def free(self, buf: HCQBuffer) -> None:
    """Unmap and free a GPU object from `alloc`. Both under one lock with `alloc`'s: between the unmap and the free,
    another thread's new mapping could take the same address, which is still this object's GPU address."""
    with self._map_lock:
      self.dev.munmap(buf.va_addr, buf.size)
      self.ioctl("GPUOBJ_FREE", id=buf.meta)

  def submit(self, ib_addr: int, ndwords: int) -> int:
    """GPU_COMMAND of one indirect buffer (`ndwords` dwords at GPU address `ib_addr`); returns its timestamp."""
    obj = ffi.new("struct kgsl_command_object*", {"gpuaddr": ib_addr, "size": ndwords * 4, "flags": CMDLIST_IB})
    cmd = self.ioctl("GPU_COMMAND", cmdlist=int(ffi.cast("uintptr_t", obj)), cmdsize=ffi.sizeof(obj[0]), numcmds=1,
                     context_id=self.ctx)
    self.last_timestamp = cmd.timestamp
    return cmd.timestamp

  def wait_timestamp(self, timestamp: int, timeout_ms: int = 30000) -> None:
    """Sleep until the context retired `timestamp` (DEVICE_WAITTIMESTAMP_CTXTID)."""
    self.ioctl("DEVICE_WAITTIMESTAMP_CTXTID", context_id=self.ctx, timestamp=timestamp, timeout=timeout_ms)

  def retired(self) -> int:
    """The context's last retired timestamp (CMDSTREAM_READTIMESTAMP_CTXTID, KGSL_TIMESTAMP_RETIRED)."""
    return self.ioctl("CMDSTREAM_READTIMESTAMP_CTXTID", context_id=self.ctx, type=TIMESTAMP_RETIRED).timestamp
