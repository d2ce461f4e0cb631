"""`MOCK+QCOM`: an in-process stand-in for the KGSL driver (`/dev/kgsl-3d0`) and an Adreno 630.

`MockFileIO` implements the `FileIOInterface` seam: opening `/dev/kgsl-3d0`, ioctls decoded from the same cffi structs
the real driver uses (`kgsl.py`), and mmaps of GPU objects. GPU memory is host memory, and a GPU object's GPU address
is its CPU mapping's (KGSL_MEMFLAGS_USE_CPU_MAP). GPU_COMMAND queues the submitted indirect buffers with the
context's next timestamp; the GPU runs them, in order, when the host waits for a timestamp (DEVICE_WAITTIMESTAMP_CTXTID)
or reads one -- like a GPU that runs on its own, which the host only observes through timestamps and memory. The
command processor (`cp.py`) decodes every packet and rejects malformed ones; dispatches run on PoCL (`gpu.py`).
A faulting submission is retired (as KGSL does after a GPU fault) and the fault raised to the waiter.
"""
from __future__ import annotations

import atexit
import bisect
import json
import os
import threading
from collections import deque
from typing import Any

from tiny_uop.hcq import MAP_PRIVATE, PROT_READ, PROT_WRITE, FileIOInterface

from tiny_runtime_qcom import kgsl
from tiny_runtime_qcom.mock.cp import CommandProcessor
from tiny_runtime_qcom.mock.gpu import GPUFault, Runner

CHIP_ID, GPU_ID, GMEM = 0x06030001, 630, 1 << 20  # Adreno 630 (Snapdragon 845): chip id 6.3.0 patch 1, 1 MiB GMEM
# the draw-context flags the mock keeps (adreno_drawctxt_create keeps these and a few more: PER_CONTEXT_TS,
# USER_GENERATED_TS, CTX_SWITCH, IFH_NOP, SECURE) and drops the rest
KNOWN_CONTEXT_FLAGS = kgsl.CONTEXT_PREAMBLE | kgsl.CONTEXT_NO_GMEM_ALLOC | kgsl.CONTEXT_NO_FAULT_TOLERANCE | \
  kgsl.CONTEXT_PWR_CONSTRAINT | kgsl.CONTEXT_PRIORITY_MASK | kgsl.CONTEXT_TYPE_MASK | kgsl.CONTEXT_PREEMPT_STYLE_MASK
# kgsl.h: the most command objects one GPU_COMMAND may carry (sdm845's msm-4.9 kgsl; later kgsl releases: 2000)
KGSL_MAX_NUMIBS = 100000
# the GPU object flags kgsl.c gpumem_alloc_entry keeps (it drops every other bit): GPUREADONLY, CACHEMODE, MEMTYPE,
# MEMALIGN, USE_CPU_MAP, SECURE, FORCE_32BIT (msm_kgsl.h values)
KNOWN_MEM_FLAGS = kgsl.MEMFLAGS_USE_CPU_MAP | kgsl.MEMALIGN_MASK | kgsl.CACHEMODE_MASK | kgsl.MEMTYPE_MASK | \
  kgsl.MEMFLAGS_GPUREADONLY | kgsl.MEMFLAGS_SECURE | kgsl.MEMFLAGS_FORCE_32BIT


class MockKGSL:
  """The state of the mock driver and its GPU: GPU objects, draw contexts, queued submissions, timestamps."""

  def __init__(self) -> None:
    self.objs: dict[int, tuple[int, int]] = {}   # id -> (address, size) once mapped, (0, size) before
    self.ranges: dict[int, int] = {}             # start -> end of every mapped object
    self.range_starts: list[int] = []
    self.contexts: dict[int, dict[str, Any]] = {}
    self.next_id = 1
    self.lock = threading.RLock()
    self._runner: Runner | None = None
    self._cp: CommandProcessor | None = None

  @property
  def runner(self) -> Runner:
    """The PoCL runner (opened on first use)."""
    if self._runner is None: self._runner = Runner()
    return self._runner

  @property
  def cp(self) -> CommandProcessor:
    if self._cp is None: self._cp = CommandProcessor(self, self.runner)
    return self._cp

  # GPU memory
  def check(self, addr: int, n: int, what: str) -> None:
    """GPUFault unless [addr, addr + n) lies in one mapped GPU object."""
    i = bisect.bisect_right(self.range_starts, addr) - 1
    if i < 0 or addr + n > self.ranges[self.range_starts[i]]:
      raise GPUFault(f"GPU page fault: {what}: {n} bytes at {addr:#x} are outside every GPU object")

  def alloc_start(self, addr: int) -> int:
    """The start of the GPU object holding `addr` (GPUFault when none does)."""
    self.check(addr, 1, "buffer address")
    return self.range_starts[bisect.bisect_right(self.range_starts, addr) - 1]

  def alloc_end(self, addr: int) -> int:
    """The end of the GPU object holding `addr` (GPUFault when none does)."""
    self.check(addr, 1, "buffer address")
    return self.ranges[self.range_starts[bisect.bisect_right(self.range_starts, addr) - 1]]

  # ioctls: each takes the decoded cffi struct and fills its outputs
  def ioctl(self, name: str, a: Any) -> None:
    with self.lock: getattr(self, f"_{name.lower()}")(a)

  def _device_getproperty(self, a: Any) -> None:
    if a.type == kgsl.PROP_DEVICE_INFO:
      if a.sizebytes != kgsl.ffi.sizeof("struct kgsl_devinfo"):
        raise OSError(22, f"KGSL_PROP_DEVICE_INFO of {a.sizebytes} bytes; struct kgsl_devinfo is "
                          f"{kgsl.ffi.sizeof('struct kgsl_devinfo')}")
      info = kgsl.ffi.cast("struct kgsl_devinfo*", a.value)
      info.device_id, info.chip_id, info.mmu_enabled, info.gpu_id, info.gmem_sizebytes = 0, CHIP_ID, 1, GPU_ID, GMEM
    elif a.type == kgsl.PROP_VERSION:
      v = kgsl.ffi.cast("struct kgsl_version*", a.value)
      v.drv_major, v.drv_minor, v.dev_major, v.dev_minor = 3, 14, 3, 14
    else: raise OSError(22, f"KGSL_PROP {a.type:#x} is not mocked")

  def _setproperty(self, a: Any) -> None:
    """KGSL_PROP_PWR_CONSTRAINT only, checked as KGSL's adreno_setproperty does: a struct kgsl_device_constraint of its
    size, for an existing context; type NONE clears the context's constraint, type PWRLEVEL carries a struct
    kgsl_device_constraint_pwrlevel whose level is PWR_MIN or PWR_MAX (KGSL_CONSTRAINT_PWR_MAXLEVELS is 2)."""
    if a.type != kgsl.PROP_PWR_CONSTRAINT:
      raise OSError(22, f"SETPROPERTY {a.type:#x} is not mocked (PWR_CONSTRAINT {kgsl.PROP_PWR_CONSTRAINT:#x} is)")
    want = kgsl.ffi.sizeof("struct kgsl_device_constraint")
    if a.sizebytes != want:
      raise OSError(22, f"SETPROPERTY PWR_CONSTRAINT of {a.sizebytes} bytes; struct kgsl_device_constraint is {want}")
    c = kgsl.ffi.cast("struct kgsl_device_constraint*", a.value)
    ctx = self.contexts.get(c.context_id)
    if ctx is None: raise OSError(22, f"SETPROPERTY PWR_CONSTRAINT for unknown context {c.context_id}")
    if c.type == kgsl.CONSTRAINT_NONE: ctx["pwr_constraint"] = None
    elif c.type == kgsl.CONSTRAINT_PWRLEVEL:
      if c.size != kgsl.ffi.sizeof("struct kgsl_device_constraint_pwrlevel"):
        raise OSError(22, f"PWRLEVEL constraint data of {c.size} bytes; struct kgsl_device_constraint_pwrlevel is 4")
      level = kgsl.ffi.cast("struct kgsl_device_constraint_pwrlevel*", c.data).level
      if level not in (kgsl.CONSTRAINT_PWR_MIN, kgsl.CONSTRAINT_PWR_MAX):
        raise OSError(22, f"PWRLEVEL constraint level {level}; valid: 0 (PWR_MIN), 1 (PWR_MAX)")
      ctx["pwr_constraint"] = level
    else: raise OSError(22, f"power constraint type {c.type}; valid: 0 (NONE), 1 (PWRLEVEL)")

  def _drawctxt_create(self, a: Any) -> None:
    """adreno_drawctxt.c adreno_drawctxt_create: bits it does not know are dropped (the kept flags are written back);
    a context without both PREAMBLE and NO_GMEM_ALLOC is EINVAL ("legacy context switch not supported")."""
    a.flags &= KNOWN_CONTEXT_FLAGS
    need = kgsl.CONTEXT_PREAMBLE | kgsl.CONTEXT_NO_GMEM_ALLOC
    if a.flags & need != need:
      raise OSError(22, f"DRAWCTXT_CREATE flags {a.flags:#x}: KGSL needs PREAMBLE (0x10) and NO_GMEM_ALLOC (0x2), "
                        "legacy context switching is not supported")
    a.drawctxt_id, self.next_id = self.next_id, self.next_id + 1
    self.contexts[a.drawctxt_id] = {"issued": 0, "retired": 0, "queue": deque(), "fault": None, "flags": a.flags,
                                    "pwr_constraint": None}

  def _drawctxt_destroy(self, a: Any) -> None:
    if self.contexts.pop(a.drawctxt_id, None) is None: raise OSError(22, f"DRAWCTXT_DESTROY of {a.drawctxt_id}")

  def _gpuobj_alloc(self, a: Any) -> None:
    """kgsl.c kgsl_ioctl_gpuobj_alloc / gpumem_alloc_entry: unknown flag bits are dropped; a size of 0 or above
    UINT_MAX is EINVAL; the object is whole pages (kgsl_allocate_user), and size, flags, mmapsize and id are outputs."""
    a.flags &= KNOWN_MEM_FLAGS
    if a.size == 0 or a.size > 0xFFFFFFFF:
      raise OSError(22, f"GPUOBJ_ALLOC size {a.size:#x}: KGSL allocates 1 byte to 4 GiB - 1 (UINT_MAX)")
    if a.flags & kgsl.MEMFLAGS_SECURE: raise OSError(95, "GPUOBJ_ALLOC of secure memory is not mocked")
    if not a.flags & kgsl.MEMFLAGS_USE_CPU_MAP: raise OSError(22, "GPUOBJ_ALLOC without USE_CPU_MAP is not mocked")
    a.size = a.mmapsize = (a.size + kgsl.PAGE - 1) // kgsl.PAGE * kgsl.PAGE
    a.id, self.next_id = self.next_id, self.next_id + 1
    self.objs[a.id] = (0, a.size)

  def map(self, obj: int, size: int) -> int:
    """mmap of an object: host memory, which becomes its GPU address too."""
    with self.lock:
      if obj not in self.objs or self.objs[obj][0]: raise OSError(22, f"mmap of GPU object {obj}: unknown or mapped")
      if size != self.objs[obj][1]: raise OSError(22, f"mmap of {size:#x} bytes of a {self.objs[obj][1]:#x} object")
      addr = FileIOInterface.anon_mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE)
      self.objs[obj] = (addr, size)
      self.ranges[addr] = addr + size
      self.range_starts = sorted(self.ranges)
      return addr

  def unmap(self, addr: int, size: int) -> None:
    """munmap of an object's CPU mapping: its GPU address range goes with it, at once and under the lock, since the
    host may hand that address to the next mmap (another thread's object) before this one's GPUOBJ_FREE."""
    with self.lock:
      if self.ranges.get(addr) != addr + size: raise OSError(22, f"munmap of {size:#x} bytes at {addr:#x}")
      FileIOInterface().munmap(addr, size)
      self.ranges.pop(addr)
      self.range_starts = sorted(self.ranges)
      for obj, (a, n) in self.objs.items():
        if a == addr: self.objs[obj] = (0, n)  # unmapped: GPUOBJ_FREE then has no range to drop

  def _gpuobj_info(self, a: Any) -> None:
    if a.id not in self.objs: raise OSError(22, f"GPUOBJ_INFO of unknown object {a.id}")
    addr, size = self.objs[a.id]
    a.gpuaddr, a.size, a.va_addr, a.va_len = addr, size, addr, size

  def _gpuobj_free(self, a: Any) -> None:
    if a.id not in self.objs: raise OSError(22, f"GPUOBJ_FREE of unknown object {a.id}")
    addr, _ = self.objs.pop(a.id)
    if addr:
      self.ranges.pop(addr)
      self.range_starts = sorted(self.ranges)

  def _gpu_command(self, a: Any) -> None:
    """kgsl.c kgsl_ioctl_gpu_command: more than KGSL_MAX_NUMIBS commands is EINVAL (_process_command_input), so is an
    unknown context; no commands makes a marker, which retires with the context's next timestamp; each command object
    needs a CMDLIST flag (kgsl_drawobj.c kgsl_drawobj_cmd_add_cmdlist; the mock runs plain IBs, and takes the
    command objects at their own size only)."""
    if a.numcmds > KGSL_MAX_NUMIBS: raise OSError(22, f"GPU_COMMAND numcmds {a.numcmds} > {KGSL_MAX_NUMIBS}")
    ctx = self.contexts.get(a.context_id)
    if ctx is None: raise OSError(22, f"GPU_COMMAND on unknown context {a.context_id}")
    if a.numobjs or a.numsyncs: raise OSError(22, "GPU_COMMAND with object or sync lists is not mocked")
    if a.numcmds and a.cmdsize != kgsl.ffi.sizeof("struct kgsl_command_object"):
      raise OSError(22, f"GPU_COMMAND cmdsize {a.cmdsize}: the mock reads struct kgsl_command_object "
                        f"({kgsl.ffi.sizeof('struct kgsl_command_object')} bytes) only")
    cmds = kgsl.ffi.cast("struct kgsl_command_object*", a.cmdlist)
    ibs = []
    for k in range(a.numcmds):
      c = cmds[k]
      if c.flags != kgsl.CMDLIST_IB or c.size % 4 or c.size == 0 or c.gpuaddr % 4:
        raise OSError(22, f"GPU_COMMAND object {k}: flags {c.flags:#x}, {c.size} bytes at {c.gpuaddr:#x}")
      self.check(c.gpuaddr, c.size, "GPU_COMMAND indirect buffer")
      ibs.append((c.gpuaddr, c.size // 4))
    ctx["issued"] += 1
    a.timestamp = ctx["issued"]
    ctx["queue"].append((ctx["issued"], ibs))

  def run(self, ctx: dict[str, Any], upto: int) -> None:
    """Run the context's queued submissions up to timestamp `upto`; a fault retires the faulting one and raises."""
    while ctx["queue"] and ctx["queue"][0][0] <= upto:
      ts, ibs = ctx["queue"].popleft()
      try:
        self.cp.stats["submissions"] += 1
        for addr, n in ibs: self.cp.run(addr, n)
      except GPUFault:
        self.cp.stats["rejected"] += 1
        raise
      finally:
        # KGSL ends every submission (a faulting one too) with its own CP_EVENT_WRITE CACHE_FLUSH_TS, the event that
        # writes the context's end-of-pipe timestamp (msm kgsl adreno_a6xx_ringbuffer.c a6xx_ringbuffer_addcmds)
        self.cp.cache.flush()
        ctx["retired"] = ts

  def _device_waittimestamp_ctxtid(self, a: Any) -> None:
    ctx = self.contexts.get(a.context_id)
    if ctx is None: raise OSError(22, f"WAITTIMESTAMP on unknown context {a.context_id}")
    if a.timestamp > ctx["issued"]:
      raise OSError(110, f"WAITTIMESTAMP for {a.timestamp}, but only {ctx['issued']} submissions were issued")
    self.run(ctx, a.timestamp)

  def _cmdstream_readtimestamp_ctxtid(self, a: Any) -> None:
    ctx = self.contexts.get(a.context_id)
    if ctx is None or a.type != kgsl.TIMESTAMP_RETIRED: raise OSError(22, "READTIMESTAMP: context or type")
    self.run(ctx, ctx["issued"])
    a.timestamp = ctx["retired"]


_DRIVER: MockKGSL | None = None


def driver() -> MockKGSL:
  """The process's mock driver (one mock a630), created on first use. With MOCK_QCOM_STATS=path set, its command
  processor's counts (submissions, packets, dispatches, those with textures, rejected) are appended there as a JSON
  line at exit (one line per process: test runs with several workers add theirs up)."""
  global _DRIVER
  if _DRIVER is None:
    _DRIVER = MockKGSL()
    if (path := os.environ.get("MOCK_QCOM_STATS")): atexit.register(_write_stats, _DRIVER, path)
  return _DRIVER


def _write_stats(drv: MockKGSL, path: str) -> None:
  with open(path, "a") as f: f.write(json.dumps(drv.cp.stats if drv._cp is not None else {}) + "\n")


class MockFileIO(FileIOInterface):
  """`FileIOInterface` over the mock driver: the same calls the real driver makes, answered in-process."""

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    self.path, self.fd = path, None
    if path and path != kgsl.KGSL_PATH: raise FileNotFoundError(2, f"mock KGSL: no such file {path!r}")
    self.drv = driver()
    self.fd = 3 if path else None

  def __del__(self) -> None: pass

  def ioctl(self, request: int, arg: Any) -> int:
    if self.path != kgsl.KGSL_PATH: raise OSError(25, f"ioctl on {self.path!r}: mock supports {kgsl.KGSL_PATH} only")
    name = kgsl.IOCTL_BY_NUMBER.get(request)
    if name is None: raise OSError(25, f"mock KGSL: unknown ioctl {request:#x}")
    self.drv.ioctl(name, kgsl.ffi.from_buffer(f"struct {kgsl.IOCTLS[name][2]} *", arg))
    return 0

  def mmap(self, start: int, size: int, prot: int, flags: int, offset: int) -> int:
    if self.path != kgsl.KGSL_PATH or offset % kgsl.PAGE or start:
      raise OSError(22, f"mock mmap of {self.path!r} at {start:#x} offset {offset:#x}")
    return self.drv.map(offset // kgsl.PAGE, size)

  def munmap(self, addr: int, size: int) -> None: self.drv.unmap(addr, size)

  @staticmethod
  def exists(path: str) -> bool: return path == kgsl.KGSL_PATH
  @staticmethod
  def access(path: str, mode: int) -> bool: return path == kgsl.KGSL_PATH
