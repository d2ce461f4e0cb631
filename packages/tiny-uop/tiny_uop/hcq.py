"""HCQ: the hardware-command-queue layer shared by command-queue GPUs (AMD, NV, QCOM) (docs/ARCHITECTURE.md §6).

- `FileIOInterface`: the one seam through which a driver touches the kernel (open/ioctl/mmap/read/write/listdir).
  A mock kernel driver subclasses it (the `MOCK+` interface) and the driver code above it does not change.
- `HCQVar`: a symbolic 32/64-bit value placed in a command stream; `HWQueue.submit(dev, var_vals)` resolves it, so
  one recorded queue can be resubmitted with other values.
- `HWQueue`: a recorded list of command dwords; backends implement the commands (`wait`, `signal`, `timestamp`,
  `memory_barrier`, `exec`, `copy`) by appending packets with `q(...)`, and `_submit` to hand them to the GPU.
- `HCQSignal`: a 64-bit value and a 64-bit timestamp in GPU-visible memory.
- `HCQCompiled`: a `Compiled` device with a timeline signal; `HCQBuffer`; `HCQAllocator` (copies through the CPU
  mapping of host-mapped buffers, else through host staging buffers on the copy queue); `HCQProgram` (how a
  kernel's arguments are laid out in memory). TinyJit's device graph on these devices is `tiny_uop.hcq2.HCQ2Graph`
  (a batch of kernels lowered to command buffers by named rewrites, patched and resubmitted per replay).

Addresses here are integers: a GPU virtual address that is also mapped at the same host address (KFD's SVM
layout; the mock follows it), so host code reads and writes device-visible memory through `ctypes`.
Standard library only.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

from tiny_uop.device import BufferSpec, Compiled, LRUAllocator, Program, Renderer

# ***** the kernel seam *****

PROT_READ, PROT_WRITE = 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000


@functools.cache
def _libc() -> Any:
  libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
  libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                             ctypes.c_int, ctypes.c_int, ctypes.c_long]
  libc.munmap.restype, libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
  return libc


class FileIOInterface:
  """A kernel file (`/dev/kfd`, a sysfs file) opened through one seam: `ioctl`, `mmap`, `read`, `write`.

  The real implementation calls the OS. A mock driver subclasses this class and overrides `__init__`, `ioctl`,
  `mmap`, `munmap`, `read`, `write`, and the static helpers `exists`/`listdir`/`access`, so that driver code
  written against this interface runs unchanged against an in-process emulation of the kernel driver.
  """

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    self.path = path
    self.fd: int | None = fd if fd is not None else (os.open(path, flags) if path else None)

  def __del__(self) -> None:
    if getattr(self, "fd", None) is not None and self.path:
      try: os.close(self.fd)  # type: ignore[arg-type]
      except OSError: pass

  def ioctl(self, request: int, arg: Any) -> int:
    """`ioctl(fd, request, arg)`; `arg` is a writable buffer (cffi buffer, bytearray) the kernel reads and fills."""
    import fcntl  # POSIX only: imported here so that tiny_uop.hcq imports everywhere
    return fcntl.ioctl(self.fd, request, arg, True)  # type: ignore[arg-type]

  def mmap(self, start: int, size: int, prot: int, flags: int, offset: int) -> int:
    """Map `size` bytes of this file (or anonymous memory when `fd` is None) and return the host address."""
    fd = -1 if self.fd is None else self.fd
    addr = _libc().mmap(start or None, size, prot, flags, fd, offset)
    if addr is None or addr == ctypes.c_void_p(-1).value:
      e = ctypes.get_errno()
      raise OSError(e, f"mmap of {size:#x} bytes at {start:#x} (offset {offset:#x}) of {self.path!r} failed: "
                       f"{os.strerror(e)}")
    return addr

  def munmap(self, addr: int, size: int) -> None:
    """Unmap memory returned by `mmap`."""
    if _libc().munmap(addr, size) != 0: raise OSError(ctypes.get_errno(), f"munmap({addr:#x}, {size:#x}) failed")

  def read(self, size: int | None = None, binary: bool = False, offset: int | None = None) -> Any:
    """Read the file (from its start when offset is None); str unless binary."""
    assert self.fd is not None, "read of an anonymous FileIOInterface"
    data = os.pread(self.fd, size or (1 << 20), offset or 0)
    return data if binary else data.decode()

  def write(self, content: Any, binary: bool = False, offset: int | None = None) -> int:
    """Write `content` (str or bytes) at `offset` (0 when None)."""
    assert self.fd is not None, "write to an anonymous FileIOInterface"
    return os.pwrite(self.fd, content if binary else content.encode(), offset or 0)

  @staticmethod
  def exists(path: str) -> bool: return os.path.exists(path)
  @staticmethod
  def listdir(path: str) -> list[str]: return sorted(os.listdir(path))
  @staticmethod
  def access(path: str, mode: int) -> bool: return os.access(path, mode)
  @staticmethod
  def anon_mmap(start: int, size: int, prot: int, flags: int) -> int:
    """Anonymous memory (or a VA reservation with PROT_NONE) at `start` (0: anywhere)."""
    return FileIOInterface().mmap(start, size, prot, flags | MAP_ANONYMOUS, 0)


def ioc(direction: int, typ: str, nr: int, size: int) -> int:
  """Linux `_IOC(dir, type, nr, size)` (include/uapi/asm-generic/ioctl.h): dir 1 write, 2 read, 3 both."""
  return (direction << 30) | (size << 16) | (ord(typ) << 8) | nr


def errno_name(e: int) -> str: return errno.errorcode.get(e, str(e))


def backoff_sleep(waited_s: float, spin_s: float = 2e-4, cap_s: float = 1e-3) -> None:
  """A pause for a host thread polling GPU memory, after it waited `waited_s` seconds: yield the CPU for the first
  `spin_s` (short waits stay fast), then sleep about a quarter of the time waited so far, between 50 µs and `cap_s`
  (long waits leave the core to other work and still notice completion within ~25%). An `HCQSignal._idle` for devices
  without a way to sleep until the GPU interrupts (NV)."""
  if waited_s < spin_s: time.sleep(0)
  else: time.sleep(min(max(waited_s / 4, 5e-5), cap_s))


# ***** symbolic values in command streams *****

class HCQVar:
  """A value placed in a command stream and filled in at submit: `HCQVar("a")`, `v + 16`, `v.lo`, `v.hi`.

  `resolve(var_vals)` evaluates it; derived values keep a function of their parent (64-bit wraparound).
  """

  def __init__(self, name: str, fn: Callable[[int], int] | None = None, parent: HCQVar | None = None):
    self.name, self.fn, self.parent = name, fn, parent

  def resolve(self, var_vals: dict[str, int]) -> int:
    root = self
    while root.parent is not None: root = root.parent
    if root.name not in var_vals:
      raise KeyError(f"HCQVar {root.name!r} has no value; given: {sorted(var_vals)}")
    return self._eval(var_vals[root.name])

  def _eval(self, v: int) -> int:
    if self.parent is not None: v = self.parent._eval(v)
    return self.fn(v) if self.fn is not None else v

  def _derive(self, tag: str, fn: Callable[[int], int]) -> HCQVar: return HCQVar(f"{self.name}{tag}", fn, self)
  def __add__(self, o: int) -> HCQVar: return self._derive(f"+{o}", lambda v: (v + o) & 0xFFFFFFFFFFFFFFFF)
  @property
  def lo(self) -> HCQVar: return self._derive(".lo", lambda v: v & 0xFFFFFFFF)
  @property
  def hi(self) -> HCQVar: return self._derive(".hi", lambda v: (v >> 32) & 0xFFFFFFFF)
  def __repr__(self) -> str: return f"HCQVar({self.name!r})"


Val = int | HCQVar


# the low and high 32 bits of an int, an HCQVar or a UOp expression (HCQ2 records UOps through the same builders)
def lo32(v: Val) -> Val: return v.lo if isinstance(v, HCQVar) else v & 0xFFFFFFFF
def hi32(v: Val) -> Val: return v.hi if isinstance(v, HCQVar) else (v >> 32) & 0xFFFFFFFF


def resolve(v: Val, var_vals: dict[str, int]) -> int: return v.resolve(var_vals) if isinstance(v, HCQVar) else v


# ***** signals *****

class HCQSignal:
  """A GPU-visible signal: a uint64 value at `addr` and a uint64 timestamp at `addr + 8`.

  `timestamp_divider` converts GPU timestamp ticks to microseconds. `wait` polls; `progress` (set by mock drivers
  that run the GPU lazily) is called while polling, `_idle` between polls.
  """
  SIZE = 16

  def __init__(self, addr: int, value: int = 0, timestamp_divider: float = 1.0,
               progress: Callable[[], None] | None = None):
    self.addr, self.timestamp_divider, self.progress = addr, timestamp_divider, progress
    self.value = value

  @property
  def value(self) -> int: return ctypes.c_uint64.from_address(self.addr).value
  @value.setter
  def value(self, v: int) -> None: ctypes.c_uint64.from_address(self.addr).value = v
  @property
  def timestamp(self) -> float:
    """The timestamp written with the last signal, in microseconds."""
    return ctypes.c_uint64.from_address(self.addr + 8).value / self.timestamp_divider

  def __repr__(self) -> str: return f"{type(self).__name__}({self.addr:#x})"

  def wait(self, value: int, timeout_ms: int = 30000) -> None:
    """Return once `self.value >= value`; raise TimeoutError naming both values after `timeout_ms`."""
    start = time.monotonic()
    deadline = start + timeout_ms / 1000
    while self.value < value:
      if self.progress is not None: self.progress()
      if self.value >= value: break
      if (now := time.monotonic()) > deadline:
        raise TimeoutError(f"signal at {self.addr:#x} stayed at {self.value} waiting for {value} ({timeout_ms} ms)")
      self._idle(now - start, deadline - now)

  def _idle(self, waited_s: float, left_s: float) -> None:
    """Between two polls of `wait` (after `waited_s`, `left_s` before the timeout): yield the CPU and poll again.
    Devices whose kernel driver can put the thread to sleep until the GPU interrupts override it (AMD: KFD events)."""
    time.sleep(0)


# ***** command queues *****

class HWQueue:
  """Commands recorded as dwords (ints or `HCQVar`s). Backends define the packets; `submit` resolves and sends.

  Command methods return `self` so they chain: `q.wait(sig, 1).exec(...).signal(sig, 2).submit(dev)`.
  """

  def __init__(self) -> None:
    self._q: list[Val] = []

  def q(self, *dwords: Val) -> HWQueue:
    """Append raw dwords (32-bit ints or HCQVars resolving to 32-bit values)."""
    self._q.extend(dwords)
    return self

  def __len__(self) -> int: return len(self._q)

  def resolved(self, var_vals: dict[str, int] | None = None) -> list[int]:
    """The command dwords with every HCQVar replaced by its value (each must fit 32 bits). The constant dwords are
    checked once and kept as a template, so resubmitting a queue only evaluates its HCQVars."""
    tmpl = self.__dict__.get("_tmpl")
    if tmpl is None or tmpl[0] != len(self._q):
      for i, d in enumerate(self._q):
        if not isinstance(d, HCQVar) and not 0 <= d <= 0xFFFFFFFF:
          raise ValueError(f"command dword {i} = {d:#x} does not fit 32 bits")
      tmpl = self._tmpl = (len(self._q), [0 if isinstance(d, HCQVar) else d for d in self._q],
                           [(i, d) for i, d in enumerate(self._q) if isinstance(d, HCQVar)])
    out = tmpl[1].copy()
    vv = var_vals or {}
    for i, v in tmpl[2]:
      x = v.resolve(vv)
      if not 0 <= x <= 0xFFFFFFFF: raise ValueError(f"command dword {i} = {x:#x} ({v.name}) does not fit 32 bits")
      out[i] = x
    return out

  def symbols(self) -> set[str]:
    """Names of the HCQVars this queue needs at submit."""
    out = set()
    for d in self._q:
      if isinstance(d, HCQVar):
        while d.parent is not None: d = d.parent
        out.add(d.name)
    return out

  # commands: backends implement them
  def _missing(self, what: str) -> NotImplementedError: return NotImplementedError(f"{type(self).__name__}.{what}")
  def wait(self, signal: HCQSignal, value: Val = 0) -> HWQueue: raise self._missing("wait")
  def signal(self, signal: HCQSignal, value: Val = 0) -> HWQueue: raise self._missing("signal")
  def timestamp(self, signal: HCQSignal) -> HWQueue: raise self._missing("timestamp")
  def memory_barrier(self) -> HWQueue: raise self._missing("memory_barrier")
  def exec(self, prg: Any, args_addr: Val, global_size: Sequence[Val], local_size: Sequence[Val]) -> HWQueue:
    raise self._missing("exec")
  def copy(self, dest: Val, src: Val, size: int) -> HWQueue: raise self._missing("copy")

  def submit(self, dev: HCQCompiled, var_vals: dict[str, int] | None = None) -> HWQueue:
    """Resolve the symbols with `var_vals` and hand the dwords to the device; the queue can be resubmitted."""
    if self._q: self._submit(dev, self.resolved(var_vals))
    return self

  def _submit(self, dev: Any, dwords: list[int]) -> None: raise NotImplementedError(f"{type(self).__name__}._submit")


# ***** buffers, allocator, device *****

@dataclass
class HCQBuffer:
  """Device memory at GPU virtual address `va_addr` (also its host address when `cpu_mapped`)."""
  va_addr: int
  size: int
  meta: Any = None        # the driver's handle (e.g. the KFD allocation args)
  cpu_mapped: bool = False
  base: HCQBuffer | None = None

  def offset(self, offset: int, size: int) -> HCQBuffer:
    """A view `size` bytes long starting `offset` bytes in."""
    if offset < 0 or offset + size > self.size:
      raise ValueError(f"view [{offset}, {offset + size}) is outside a buffer of {self.size} bytes")
    return HCQBuffer(self.va_addr + offset, size, self.meta, self.cpu_mapped, self.base or self)

  def host_view(self) -> memoryview:
    """The bytes through the host mapping (only for `cpu_mapped` buffers)."""
    if not self.cpu_mapped: raise RuntimeError(f"buffer at {self.va_addr:#x} is not mapped on the host")
    return memoryview((ctypes.c_char * self.size).from_address(self.va_addr)).cast("B")


DeviceT = TypeVar("DeviceT", bound="HCQCompiled")


class HCQAllocator(LRUAllocator[HCQBuffer], Generic[DeviceT]):
  """Allocates through the device's `_gpu_alloc`. Copies of buffers mapped on the host (`cpu_mapped`) go through that
  mapping once the device is idle (the only way on a device without a copy queue, `hw_copy_queue_t = None`: QCOM);
  others go through a host-visible staging buffer (`batch_size` bytes per copy command) on the device's copy queue,
  ordered by its timeline signal."""

  def __init__(self, dev: DeviceT, batch_size: int = 2 << 20):
    super().__init__()
    self.dev, self.batch_size = dev, batch_size
    self._staging: HCQBuffer | None = None

  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer: return self.dev._gpu_alloc(size, host=options.host)
  def _free(self, opaque: HCQBuffer, options: BufferSpec) -> None:
    self.dev.synchronize()
    self.dev._gpu_free(opaque)

  def _offset(self, buf: HCQBuffer, size: int, offset: int) -> HCQBuffer: return buf.offset(offset, size)

  def staging(self) -> HCQBuffer:
    if self._staging is None: self._staging = self.dev._gpu_alloc(self.batch_size, host=True)
    return self._staging

  def _cpu_copy(self, *bufs: HCQBuffer) -> bool:
    """Whether a copy goes through the CPU mapping: every buffer is mapped on the host (any backend), or the device
    has no copy queue (QCOM), where an unmapped buffer can't be copied at all."""
    if all(b.cpu_mapped for b in bufs): return True
    if getattr(self.dev, "hw_copy_queue_t", None) is None:
      raise RuntimeError(f"{self.dev.device} has no copy queue and a buffer at "
                         f"{next(b for b in bufs if not b.cpu_mapped).va_addr:#x} is not mapped on the host")
    return False

  def _copyin(self, dest: HCQBuffer, src: memoryview) -> None:
    if self._cpu_copy(dest):  # after the GPU is done with the buffer (it may read or write it still)
      self.dev.synchronize()
      dest.host_view()[:src.nbytes] = src.cast("B") if src.format != "B" else src
      return
    stg = self.staging()
    for i in range(0, src.nbytes, self.batch_size):
      n = min(self.batch_size, src.nbytes - i)
      self.dev.synchronize()  # the staging buffer is free once earlier copies finished
      stg.host_view()[:n] = src[i:i + n]
      self.dev.run_copy(dest.va_addr + i, stg.va_addr, n)
    self.dev.synchronize()

  def _copyout(self, dest: memoryview, src: HCQBuffer) -> None:
    if self._cpu_copy(src):
      self.dev.synchronize()
      dest[:] = src.host_view()[:dest.nbytes]
      return
    stg = self.staging()
    self.dev.synchronize()
    for i in range(0, dest.nbytes, self.batch_size):
      n = min(self.batch_size, dest.nbytes - i)
      self.dev.run_copy(stg.va_addr, src.va_addr + i, n)
      self.dev.synchronize()
      dest[i:i + n] = stg.host_view()[:n]

  def _transfer(self, dest: HCQBuffer, src: HCQBuffer, size: int) -> None:
    """Device-to-device copy on this device's copy queue (both buffers mapped in its address space), or through the
    CPU mappings where both are mapped on the host."""
    if self._cpu_copy(dest, src):
      self.dev.synchronize()
      ctypes.memmove(dest.va_addr, src.va_addr, size)
      return
    self.dev.run_copy(dest.va_addr, src.va_addr, size)
    self.dev.synchronize()


class HCQCompiled(Compiled):
  """A command-queue device. Subclasses provide `_gpu_alloc(size, host)`, `_gpu_free(buf)`, `hw_compute_queue_t`,
  `hw_copy_queue_t` (None: no copy engine, the allocator copies through the CPU mapping) and `new_signal()`; and,
  for `kernargs_alloc`, `kernargs` (a host-visible HCQBuffer) with `_kernargs_ptr = 0`.
  `timeline_signal` counts finished submissions: a submission that signals `next_timeline()` is done when the signal
  reaches that value."""
  hw_compute_queue_t: type[HWQueue]
  hw_copy_queue_t: type[HWQueue] | None
  _deferred: list[tuple[int, HCQBuffer]]
  _deferred_lock = threading.Lock()   # one for all devices: held for a list operation, never across a wait
  kernargs: HCQBuffer
  _kernargs_ptr: int

  def __init__(self, device: str, allocator: HCQAllocator, renderers: Sequence[type[Renderer]],
               program_cls: type[Program] | Callable, graph: type | None = None, arch: str = ""):
    super().__init__(device, allocator, renderers, program_cls, graph, arch)
    self.timeline_signal: HCQSignal = self.new_signal(0)
    self.timeline_value = 1  # the value the next submission signals

  def hcq_submitter(self, engine: str) -> Callable[[list], None]:
    """HCQ2's submit primitive: a function taking a submission's parts (lists of dwords to copy into the `engine`'s
    queue, or `(address, ndwords)` of a command buffer the queue runs in place) that hands them to the GPU."""
    raise NotImplementedError(f"{type(self).__name__}.hcq_submitter")

  def new_signal(self, value: int = 0) -> HCQSignal: raise NotImplementedError(f"{type(self).__name__}.new_signal")
  def _gpu_alloc(self, size: int, host: bool = False) -> HCQBuffer: raise NotImplementedError
  def _gpu_free(self, buf: HCQBuffer) -> None: raise NotImplementedError

  def next_timeline(self) -> int:
    """Reserve and return the timeline value for the next submission."""
    v, self.timeline_value = self.timeline_value, self.timeline_value + 1
    return v

  def kernargs_alloc(self, size: int) -> int:
    """A 256-byte aligned slice of the device's kernel-argument ring (`self.kernargs`, an HCQBuffer the device
    allocates host-visible, and `self._kernargs_ptr`, its next free byte); the ring wraps after waiting for the GPU to
    finish with what it holds."""
    size = (size + 255) & ~255
    ring = self.kernargs.size
    if size > ring: raise ValueError(f"{size} bytes of kernel arguments; {self.device}'s argument ring holds {ring}")
    if self._kernargs_ptr + size > ring:
      self.synchronize()
      self._kernargs_ptr = 0
    addr = self.kernargs.va_addr + self._kernargs_ptr
    self._kernargs_ptr += size
    return addr

  def synchronize(self) -> None:
    """Wait until every submission so far has signaled the timeline, then free what `defer_free` was given for
    values the timeline reached. Another thread may submit and defer a free between the wait and the free: that
    buffer stays deferred (its `after` is past the value waited for), so a running kernel never loses its memory."""
    self.timeline_signal.wait(reached := self.timeline_value - 1)
    with self._deferred_lock:
      deferred = self.__dict__.get("_deferred", [])
      done = [buf for after, buf in deferred if after <= reached]
      self._deferred = [(after, buf) for after, buf in deferred if after > reached]
    for buf in done: self._gpu_free(buf)

  def defer_free(self, buf: HCQBuffer, after: int) -> None:
    """Free `buf` once the timeline reached `after` (at a later `synchronize`): the GPU may still read it."""
    if after <= self.timeline_signal.value: self._gpu_free(buf)
    else:
      with self._deferred_lock: self.__dict__.setdefault("_deferred", []).append((after, buf))

  def run_copy(self, dest: int, src: int, size: int) -> None:
    """Queue `size` bytes from `src` to `dest` (GPU addresses) after all earlier work, signaling the timeline."""
    if self.hw_copy_queue_t is None: raise RuntimeError(f"{self.device} has no copy queue")
    q = self.hw_copy_queue_t().wait(self.timeline_signal, self.timeline_value - 1).copy(dest, src, size)
    q.signal(self.timeline_signal, self.next_timeline()).submit(self)


@dataclass(frozen=True)
class ArgsLayout:
  """Where a program's kernel arguments go in its argument region (byte offsets from the region's start)."""
  size: int                      # bytes to reserve
  args_offset: int               # `exec` gets region + args_offset (AMD: after a 64-byte dispatch packet)
  buf_offsets: tuple[int, ...]   # a 64-bit GPU address per buffer
  val_offsets: tuple[int, ...]   # an int32 per variable value


class HCQProgram(Program):
  """A program of an HCQ device. Its argument region is laid out by `args_layout` and written by `fill_args` and
  `fill_launch`; eager launches and HCQ2 use the same three methods. The default: buffer addresses, then
  int32 values, no launch data."""

  def args_layout(self, n_bufs: int, n_vals: int) -> ArgsLayout:
    return ArgsLayout(8 * n_bufs + 4 * n_vals, 0, tuple(8 * i for i in range(n_bufs)),
                      tuple(8 * n_bufs + 4 * i for i in range(n_vals)))

  def fill_args(self, base: int, bufs: Sequence[int], vals: Sequence[int]) -> int:
    """Write the buffer addresses and values into the region at `base`; return the address `exec` takes."""
    lay = self.args_layout(len(bufs), len(vals))
    for o, a in zip(lay.buf_offsets, bufs): ctypes.c_uint64.from_address(base + o).value = a
    for o, v in zip(lay.val_offsets, vals): ctypes.c_int32.from_address(base + o).value = v
    return base + lay.args_offset

  def fill_launch(self, base: int, global_size: Sequence[int], local_size: Sequence[int]) -> None:
    """Write launch data the kernel reads from memory (AMD: the dispatch packet's sizes); nothing by default."""

  def launch_fields(self, global_size: Sequence[Any], local_size: Sequence[Any]) -> list[tuple[int, int, Any]]:
    """Where `fill_launch` puts each launch value: `(bit offset from the region's start, bits, value)` with the
    values computed from these (possibly symbolic) sizes; HCQ2 patches the ones that change between replays."""
    return []
