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
import ctypes
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
KGSL_MAX_SYNCPOINTS = 32  # kgsl.h: the most sync points one submission may carry
# The process's GPU address range, as _verify_ib checks an IB against it: kgsl_mmu.c kgsl_mmu_gpuaddr_in_range ->
# kgsl_iommu.c kgsl_iommu_addr_in_range: false for address 0, true inside the pagetable's va, compat_va or svm range
# (setup_64bit_pagetable, a 64-bit process). The lowest of those starts at KGSL_IOMMU_SVM_BASE32 (msm-4.9
# kgsl_iommu.h: 0x300000, the compat range). The mock's GPU addresses are its objects' CPU mappings (USE_CPU_MAP: SVM,
# GPU address = CPU address), which on a 64-bit host lie anywhere below 2**48 (the 48-bit user address space of
# aarch64, x86-64's 47 within it), so the mock's one range ends there where KGSL's SVM range ends at 0x800000000.
PT_RANGE = (0x300000, 1 << 48)
# the GPU object flags kgsl.c gpumem_alloc_entry keeps (it drops every other bit): GPUREADONLY, CACHEMODE, MEMTYPE,
# MEMALIGN, USE_CPU_MAP, SECURE, FORCE_32BIT (msm_kgsl.h values)
KNOWN_MEM_FLAGS = kgsl.MEMFLAGS_USE_CPU_MAP | kgsl.MEMALIGN_MASK | kgsl.CACHEMODE_MASK | kgsl.MEMTYPE_MASK | \
  kgsl.MEMFLAGS_GPUREADONLY | kgsl.MEMFLAGS_SECURE | kgsl.MEMFLAGS_FORCE_32BIT


def _command_kind(flags: int, numcmds: int, numsyncs: int) -> tuple[str, ...]:
  """kgsl.c _process_command_input: what a GPU_COMMAND makes. The MARKER flag makes a marker and the SYNC flag a sync
  object whatever the counts say; else sync points and commands make a sync object and a command, and a submission
  with no commands is a marker."""
  if flags & kgsl.DRAWOBJ_MARKER: return ("marker",)
  if flags & kgsl.DRAWOBJ_SYNC: return ("sync",)
  return (("sync",) if numsyncs else ()) + (("cmd",) if numcmds else () if numsyncs else ("marker",))


def _user_list(ptr: int, count: int, usize: int, struct: str, what: str) -> list[Any]:
  """A user array read as KGSL reads it (kgsl_drawobj.c _verify_input_list, kgsl.h _copy_from_user): no count,
  pointer and size at all is an empty list, some but not all of them EINVAL; each element is the first
  min(usize, sizeof) bytes at ptr + i * sizeof(struct) -- KGSL steps by its own struct size, not the caller's --
  and the bytes past the caller's size read as zero."""
  if not (count or ptr or usize): return []
  if not (count and ptr and usize):
    raise OSError(22, f"GPU_COMMAND {what}: count {count}, pointer {ptr:#x}, size {usize}: all or none must be set")
  ksize = kgsl.ffi.sizeof(f"struct {struct}")
  n, out = min(ksize, usize), []
  for i in range(count):
    el = kgsl.ffi.new(f"struct {struct} *")
    kgsl.ffi.buffer(el)[0:n] = ctypes.string_at(ptr + i * ksize, n)
    out.append(el)
  return out


def _fence_syncpoint(sp: Any, k: int) -> None:
  """A fence sync point, as kgsl_drawobj.c kgsl_drawobj_sync_add_sync / drawobj_add_sync_fence and kgsl_sync.c
  kgsl_sync_fence_async_wait take it: its payload must be exactly `struct kgsl_cmd_syncpoint_fence` (one int, the
  fd), else EINVAL; sync_file_get_fence(fd) of an fd that is not an open sync_file is NULL: EINVAL. A real sync_file
  (another driver's fence) is refused as not mocked (EOPNOTSUPP): the mock GPU can't wait on the host's fences."""
  if sp.size != ctypes.sizeof(ctypes.c_int32):
    raise OSError(22, f"GPU_COMMAND synclist[{k}]: a FENCE sync point of {sp.size} bytes; "
                      "struct kgsl_cmd_syncpoint_fence is 4 (the fd)")
  fd = ctypes.c_int32.from_address(int(sp.priv)).value
  if not _is_sync_file(fd):
    raise OSError(22, f"GPU_COMMAND synclist[{k}]: FENCE sync point fd {fd} is not an open sync_file")
  raise OSError(95, f"GPU_COMMAND synclist[{k}]: waiting on sync_file fd {fd} is not mocked")


def _is_sync_file(fd: int) -> bool:
  """Whether `fd` is an open sync_file of this process (what sync_file_get_fence accepts): the kernel's sync_file is an
  anonymous inode named "sync_file"."""
  link = f"/proc/self/fd/{fd}"
  return fd >= 0 and os.path.islink(link) and os.readlink(link) == "anon_inode:sync_file"


class MockKGSL:
  """The state of the mock driver and its GPU: GPU objects, draw contexts, queued submissions, timestamps."""

  def __init__(self) -> None:
    self.objs: dict[int, tuple[int, int]] = {}   # id -> (address, size) once mapped, (0, size) before
    self.obj_flags: dict[int, int] = {}          # id -> the flags GPUOBJ_ALLOC kept
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
                                    "pwr_constraint": None, "running": False, "frees": []}

  def _drawctxt_destroy(self, a: Any) -> None:
    """kgsl.c kgsl_ioctl_drawctxt_destroy: an unknown context is EINVAL; detaching it cancels its events, and a
    cancelled GPUOBJ_FREE event frees its object (gpumem_free_func runs for every result)."""
    ctx = self.contexts.pop(a.drawctxt_id, None)
    if ctx is None: raise OSError(22, f"DRAWCTXT_DESTROY of {a.drawctxt_id}")
    for o, _ in ctx["frees"]: self._free(o)

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
    self.obj_flags[a.id] = a.flags

  def map(self, obj: int, size: int) -> int:
    """mmap of an object: host memory, which becomes its GPU address too. kgsl.c get_mmap_entry: an unknown object is
    EINVAL, a USE_CPU_MAP mapping of another length than the footprint ERANGE; _gpu_set_svm_region: an object that
    already has its GPU address EBUSY."""
    with self.lock:
      if obj not in self.objs: raise OSError(22, f"mmap of unknown GPU object {obj}")
      if size != self.objs[obj][1]:
        raise OSError(34, f"mmap of {size:#x} bytes of a {self.objs[obj][1]:#x}-byte USE_CPU_MAP object: KGSL maps "
                          "the whole footprint")
      if self.objs[obj][0]: raise OSError(16, f"mmap of GPU object {obj}, which is mapped (has its GPU address)")
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
    """kgsl.c kgsl_ioctl_gpuobj_info: id 0 or unknown is EINVAL; gpuaddr (0 until the USE_CPU_MAP object is mapped),
    flags, size and va_len (the footprint: the size here) are written, va_addr always 0 ("the user should already
    know their mappings")."""
    if a.id == 0 or a.id not in self.objs: raise OSError(22, f"GPUOBJ_INFO of unknown object {a.id}")
    addr, size = self.objs[a.id]
    a.gpuaddr, a.flags, a.size, a.va_len, a.va_addr = addr, self.obj_flags.get(a.id, 0), size, size, 0

  def _gpuobj_free(self, a: Any) -> None:
    """kgsl.c kgsl_ioctl_gpuobj_free: an unknown id is EINVAL; without KGSL_GPUOBJ_FREE_ON_EVENT the object goes now;
    with it, event type TIMESTAMP frees it once that context timestamp retired (gpuobj_free_on_timestamp: the
    payload read with _copy_from_user, context 0 or unknown EINVAL); event type FENCE (gpuobj_free_on_fence: the
    payload's fd, read the same way, negative or not an open sync_file EINVAL, the object kept; a real sync_file is not
    mocked, EOPNOTSUPP); any other type EINVAL."""
    if a.id not in self.objs or any(a.id == o for c in self.contexts.values() for o, _ in c["frees"]):
      raise OSError(22, f"GPUOBJ_FREE of unknown object {a.id}")
    if a.flags & kgsl.GPUOBJ_FREE_ON_EVENT:
      if a.type == kgsl.GPU_EVENT_FENCE:
        fd = ctypes.c_int32(0)  # struct kgsl_gpu_event_fence { int fd; }: min(len, 4) bytes, the rest zero
        if (n := min(a.len, 4) if a.priv else 0): ctypes.memmove(ctypes.addressof(fd), a.priv, n)
        if not _is_sync_file(fd.value):
          raise OSError(22, f"GPUOBJ_FREE on a fence event: fd {fd.value} is not an open sync_file")
        raise OSError(95, f"GPUOBJ_FREE on sync_file fd {fd.value} is not mocked")
      if a.type != kgsl.GPU_EVENT_TIMESTAMP:
        raise OSError(22, f"GPUOBJ_FREE event type {a.type}; valid: 1 (TIMESTAMP), 2 (FENCE)")
      ev = kgsl.ffi.new("struct kgsl_gpu_event_timestamp *")
      n = min(a.len, kgsl.ffi.sizeof(ev[0]))
      if n == 0: raise OSError(22, "GPUOBJ_FREE on a timestamp with an event payload of 0 bytes")
      kgsl.ffi.buffer(ev)[0:n] = ctypes.string_at(a.priv, n)
      ctx = self.contexts.get(ev.context_id) if ev.context_id else None
      if ctx is None: raise OSError(22, f"GPUOBJ_FREE on a timestamp of unknown context {ev.context_id}")
      ctx["frees"].append((a.id, ev.timestamp))
      self._free_on_retire(ctx)
      return
    self._free(a.id)

  def _free_on_retire(self, ctx: dict[str, Any]) -> None:
    """Free the context's deferred objects whose timestamp has retired (kgsl_add_event fires at once on a retired
    timestamp)."""
    due = [(o, ts) for o, ts in ctx["frees"] if ts <= ctx["retired"]]
    for o, ts in due:
      ctx["frees"].remove((o, ts))
      self._free(o)

  def _free(self, obj: int) -> None:
    self.obj_flags.pop(obj, None)
    addr, _ = self.objs.pop(obj)
    if addr:
      self.ranges.pop(addr)
      self.range_starts = sorted(self.ranges)

  def _gpu_command(self, a: Any) -> None:
    """kgsl.c kgsl_ioctl_gpu_command, checked in KGSL's order: _process_command_input (counts, then the kind: the
    MARKER or SYNC flag decides it, else sync points and/or commands, and nothing at all is a marker), the context,
    the sync list (kgsl_drawobj_sync_add_synclist), the command list (kgsl_drawobj_cmd_add_cmdlist) and the object
    list (kgsl_drawobj_cmd_add_memlist), which a marker ignores, then each IB (adreno_dispatch.c _verify_ib). A
    marker or a command takes the context's next timestamp; a sync-only submission takes none (_queue_syncobj: 0)
    and holds back what the context queues after it."""
    # kgsl.c _process_command_input: too many of anything is EINVAL before the context is looked up
    if a.numcmds > KGSL_MAX_NUMIBS or a.numobjs > KGSL_MAX_NUMIBS or a.numsyncs > KGSL_MAX_SYNCPOINTS:
      raise OSError(22, f"GPU_COMMAND numcmds {a.numcmds}, numobjs {a.numobjs}, numsyncs {a.numsyncs}: KGSL takes "
                        f"at most {KGSL_MAX_NUMIBS} commands and objects and {KGSL_MAX_SYNCPOINTS} sync points")
    kind = _command_kind(a.flags, a.numcmds, a.numsyncs)
    ctx = self.contexts.get(a.context_id)
    if ctx is None: raise OSError(22, f"GPU_COMMAND on unknown context {a.context_id}")
    syncs = self._synclist(a, ctx) if "sync" in kind else []
    ibs: list[tuple[int, int]] = []
    if "cmd" in kind:  # kgsl_drawobj_cmd_add_cmdlist / _add_memlist return at once for a MARKER
      ibs = [self._ib(c, k) for k, c in enumerate(_user_list(a.cmdlist, a.numcmds, a.cmdsize,
                                                             "kgsl_command_object", "cmdlist"))]
      for k, o in enumerate(_user_list(a.objlist, a.numobjs, a.objsize, "kgsl_command_object", "objlist")):
        if not o.flags & kgsl.OBJLIST_MEMOBJ:  # kgsl_drawobj_cmd_add_memlist: the objects only inform KGSL
          raise OSError(22, f"GPU_COMMAND objlist[{k}] flags {o.flags:#x} lack KGSL_OBJLIST_MEMOBJ (0x8)")
    if kind == ("sync",):  # adreno_dispatch.c _queue_syncobj: no timestamp of its own
      a.timestamp = 0
      ctx["queue"].append((ctx["issued"] + 1, [], syncs))
      return
    ctx["issued"] += 1
    a.timestamp = ctx["issued"]
    ctx["queue"].append((ctx["issued"], ibs, syncs))

  def _synclist(self, a: Any, ctx: dict[str, Any]) -> list[tuple[int, int]]:
    """kgsl_drawobj.c kgsl_drawobj_sync_add_synclist / kgsl_drawobj_sync_add_sync / drawobj_add_sync_timestamp: a
    sync-carrying submission needs a list (count, pointer and size all nonzero); each sync point's payload must be
    exactly its type's struct; a timestamp sync point names an existing context, and on the submitting context no
    timestamp past the last queued one. Returns (context id, timestamp) pairs."""
    if not (a.numsyncs and a.synclist and a.syncsize):
      raise OSError(22, f"GPU_COMMAND sync list: numsyncs {a.numsyncs}, synclist {a.synclist:#x}, syncsize "
                        f"{a.syncsize}: a sync submission needs all three")
    out = []
    for k, sp in enumerate(_user_list(a.synclist, a.numsyncs, a.syncsize, "kgsl_command_syncpoint", "synclist")):
      if sp.type == kgsl.CMD_SYNCPOINT_TYPE_FENCE: _fence_syncpoint(sp, k)
      want = kgsl.ffi.sizeof("struct kgsl_cmd_syncpoint_timestamp")
      if sp.type != kgsl.CMD_SYNCPOINT_TYPE_TIMESTAMP or sp.size != want:
        raise OSError(22, f"GPU_COMMAND synclist[{k}]: type {sp.type}, {sp.size} bytes; valid: type 0 (TIMESTAMP) "
                          f"of {want} bytes, type 1 (FENCE) of 4")
      ts = kgsl.ffi.cast("struct kgsl_cmd_syncpoint_timestamp*", sp.priv)
      other = self.contexts.get(ts.context_id)
      if other is None: raise OSError(22, f"GPU_COMMAND synclist[{k}]: unknown context {ts.context_id}")
      if other is ctx and ts.timestamp > ctx["issued"]:
        raise OSError(22, f"GPU_COMMAND synclist[{k}]: timestamp {ts.timestamp} of its own context is in the future "
                          f"(last queued {ctx['issued']})")
      out.append((ts.context_id, ts.timestamp))
    return out

  def _ib(self, c: Any, k: int) -> tuple[int, int]:
    """One cmdlist entry: kgsl_drawobj_cmd_add_cmdlist wants one of the CMDLIST flags; adreno_dispatch.c _verify_ib
    a size of 1 byte to 0xFFFFF dwords at a dword-aligned address (the CP runs size >> 2 dwords) inside the process's
    GPU address range (kgsl_mmu_gpuaddr_in_range, `PT_RANGE`): EINVAL otherwise, before anything is queued. Whether
    an address in that range is mapped is the GPU's to find out: such an IB page-faults when it runs, as on the
    hardware."""
    known = kgsl.CMDLIST_IB | kgsl.CMDLIST_CTXTSWITCH_PREAMBLE | kgsl.CMDLIST_IB_PREAMBLE
    if not c.flags & known:
      raise OSError(22, f"GPU_COMMAND cmdlist[{k}] flags {c.flags:#x}: KGSL needs CMDLIST_IB (0x1), "
                        "CTXTSWITCH_PREAMBLE (0x2) or IB_PREAMBLE (0x4)")
    # A preamble IB (CTXTSWITCH_PREAMBLE, IB_PREAMBLE) runs like any other on sdm845's msm-4.9 kgsl:
    # kgsl_drawobj_add_memobject keeps the flags in mem->flags and sets mem->priv = 0, and
    # adreno_ringbuffer_submitcmd NOPs out only an IB whose priv has MEMOBJ_PREAMBLE (set by the legacy ibdesc path
    # alone) when no context switch happened. (Later kgsl releases skip a CTXTSWITCH_PREAMBLE IB by its flag.)
    if c.size == 0 or c.size >> 2 > 0xFFFFF or c.gpuaddr % 4:
      raise OSError(22, f"GPU_COMMAND cmdlist[{k}]: {c.size} bytes at {c.gpuaddr:#x}; KGSL takes 1 byte to 0xFFFFF "
                        "dwords at a 4-byte aligned address")
    if not PT_RANGE[0] <= c.gpuaddr < PT_RANGE[1]:
      raise OSError(22, f"GPU_COMMAND cmdlist[{k}]: IB address {c.gpuaddr:#x} is outside the process's GPU address "
                        f"range [{PT_RANGE[0]:#x}, {PT_RANGE[1]:#x}) (kgsl_mmu_gpuaddr_in_range)")
    return c.gpuaddr, c.size >> 2

  def run(self, ctx: dict[str, Any], upto: int) -> None:
    """Run the context's queued submissions up to timestamp `upto`; a fault retires the faulting one and raises.
    A submission's sync points run the contexts they wait on first (KGSL dispatches it once they retired)."""
    ctx["running"] = True
    try:
      while ctx["queue"] and ctx["queue"][0][0] <= upto:
        for cid, ts in ctx["queue"][0][2]: self._wait_sync(cid, ts)
        ts, ibs, _ = ctx["queue"].popleft()
        self._execute(ctx, ts, ibs)
    finally: ctx["running"] = False

  def _wait_sync(self, cid: int, ts: int) -> None:
    """Satisfy one timestamp sync point: that context runs up to `ts` (a destroyed context's events are cancelled,
    which expires the sync point). One never submitted, or a cycle of waits, would hang the real GPU: ETIMEDOUT."""
    other = self.contexts.get(cid)
    if other is None or other["retired"] >= ts: return
    if ts > other["issued"] or other.get("running"):
      raise OSError(110, f"a submission waits on context {cid} timestamp {ts}, which can never retire (issued "
                         f"{other['issued']}{', a cycle of sync points' if other.get('running') else ''})")
    self.run(other, ts)

  def _execute(self, ctx: dict[str, Any], ts: int, ibs: list[tuple[int, int]]) -> None:
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
      ctx["retired"] = max(ctx["retired"], ts if ts <= ctx["issued"] else ctx["retired"])
      self._free_on_retire(ctx)

  def _device_waittimestamp_ctxtid(self, a: Any) -> None:
    ctx = self.contexts.get(a.context_id)
    if ctx is None: raise OSError(22, f"WAITTIMESTAMP on unknown context {a.context_id}")
    if a.timestamp > ctx["issued"]:
      raise OSError(110, f"WAITTIMESTAMP for {a.timestamp}, but only {ctx['issued']} submissions were issued")
    self.run(ctx, a.timestamp)

  def _cmdstream_readtimestamp_ctxtid(self, a: Any) -> None:
    """kgsl.c kgsl_ioctl_cmdstream_readtimestamp_ctxtid / adreno.c adreno_readtimestamp: an unknown context or type
    is EINVAL; QUEUED is the context's last queued timestamp, CONSUMED and RETIRED what the GPU reached (the mock
    GPU runs what is queued first: it finishes every submission it starts, so the two are the same)."""
    ctx = self.contexts.get(a.context_id)
    if ctx is None: raise OSError(22, f"READTIMESTAMP of unknown context {a.context_id}")
    if a.type == kgsl.TIMESTAMP_QUEUED: a.timestamp = ctx["issued"]
    elif a.type in (kgsl.TIMESTAMP_CONSUMED, kgsl.TIMESTAMP_RETIRED):
      self.run(ctx, ctx["issued"])
      a.timestamp = ctx["retired"]
    else: raise OSError(22, f"READTIMESTAMP type {a.type}; valid: 1 (CONSUMED), 2 (RETIRED), 3 (QUEUED)")


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
    """An ioctl on the device node: kgsl.c's kgsl_fops (.unlocked_ioctl = kgsl_ioctl) serve /dev/kgsl-3d0, the only
    file KGSL's ioctls go to (the mock opens no other)."""
    if self.path != kgsl.KGSL_PATH: raise OSError(25, f"ioctl on {self.path!r}: mock supports {kgsl.KGSL_PATH} only")
    # kgsl_ioctl.c kgsl_ioctl_helper: the function is found by _IOC_NR alone; kgsl_ioctl_copy_in/_copy_out move
    # min(the caller's _IOC_SIZE, the kernel's) bytes, each only when both directions have it, so a caller's struct
    # of another size is taken (its missing tail reads as zero); an unknown number ends in ENOTTY (ENOIOCTLCMD)
    nr, usize, udir = request & 0xFF, (request >> 16) & 0x3FFF, request >> 30
    name = kgsl.IOCTL_BY_NR.get(nr)
    if name is None: raise OSError(25, f"mock KGSL: ioctl {request:#x} (nr {nr:#x}) is unknown or not mocked")
    kdir, _, struct = kgsl.IOCTLS[name]
    kst = kgsl.ffi.new(f"struct {struct} *")
    n = min(usize, kgsl.ffi.sizeof(kst[0]))
    ubuf = kgsl.ffi.buffer(kgsl.ffi.from_buffer(arg))
    if len(ubuf) < usize: raise OSError(14, f"ioctl {name}: {len(ubuf)}-byte argument, _IOC_SIZE says {usize}")
    if kdir & udir & 1: kgsl.ffi.buffer(kst)[0:n] = ubuf[0:n]
    self.drv.ioctl(name, kst)
    if kdir & udir & 2: ubuf[0:n] = kgsl.ffi.buffer(kst)[0:n]
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
