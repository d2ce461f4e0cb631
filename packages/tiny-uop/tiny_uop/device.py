"""The device interfaces every backend implements (docs/ARCHITECTURE.md §6; the full contract: docs/PLUGINS.md).

- `Renderer`: linear UOps -> source text; its capabilities steer the optimizer; it owns its `Compiler`.
- `Compiler`: source -> binary bytes, with an on-disk cache keyed by content hash.
- `Allocator`: device memory; `LRUAllocator` keeps freed blocks for reuse.
- `Program`: a loaded binary; calling it runs the kernel.
- `Compiled`: one opened device: its allocator, renderers and program class.
- `Buffer`: a typed allocation on a device, with bounds-checked copies.
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Generic, Sequence, TypeVar

from tiny_uop.dtype import DType, ImageDType, PtrDType, dtypes
from tiny_uop.helpers import CACHELEVEL, cache_dir, config_changed, del_errors
from tiny_uop.uop import Ops, UOp
from tiny_uop import plugins as _plugins  # the device registry (Buffer.allocator); it imports nothing of this module


class CompileError(Exception):
  """A compiler rejected generated source; the message carries the source location and compiler output."""


class Compiler:
  """Turns rendered source into a binary. Subclasses implement `compile`; `compile_cached` adds a disk cache."""
  cachekey: str | None = None  # None: no disk cache

  def __init__(self, cachekey: str | None = None):
    self.cachekey = cachekey if CACHELEVEL >= 1 else None

  def compile(self, src: str) -> bytes:
    """Source text to binary bytes; raise CompileError with the compiler's message on failure."""
    raise NotImplementedError(f"{type(self).__name__} does not implement compile")

  def compile_cached(self, src: str) -> bytes:
    if self.cachekey is None: return self.compile(src)
    key = hashlib.sha256(f"{self.cachekey}\0{src}".encode()).hexdigest()
    if (lib := diskcache_get("compile", key)) is not None: return lib
    lib = self.compile(src)
    diskcache_put("compile", key, lib)
    return lib

  def disassemble(self, lib: bytes) -> str:
    """Human-readable form of a binary, where the target has a disassembler."""
    raise NotImplementedError(f"{type(self).__name__} has no disassembler")


@dataclass(frozen=True)
class TensorCore:
  """A matrix-multiply-accumulate unit: (N, M, K) tile, input/output dtypes, threads sharing it."""
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  threads: int
  elements_per_thread: tuple[int, int, int]
  opts: tuple[str, ...] = ()
  swizzle: tuple = ()

  def __str__(self) -> str: return f"WMMA_{'_'.join(map(str, self.dims))}_{self.dtype_in.name}_{self.dtype_out.name}"


class Renderer:
  """Linear UOps to source text. Capabilities are class attributes; dialects override tables, not `if`s."""
  device: str = ""
  suffix: str = ""
  has_local: bool = True
  has_shared: bool = True
  has_threads: bool = False   # CPU-style: the runtime passes a thread index instead of gpu dims
  vectorize_upcast: bool = False  # lowering makes one UPCAST axis per store native vectors (LLVM on a CPU)
  buffer_align: int = 0       # bytes every buffer argument is aligned to (0: none promised; vector loads need it)
  supports_float4: bool = True
  global_max: tuple[int, ...] | None = (0x8FFFFFFF,) * 3
  local_max: tuple[int, ...] | None = (0x8FFFFFFF,) * 3
  shared_max: int = 32768      # bytes of local (shared) memory one workgroup may use
  max_workgroup_size: int | None = None  # threads per workgroup; None: max(local_max)
  warp_size: int = 32          # threads that run in lockstep (a warp / wavefront / subgroup)
  tensor_cores: list[TensorCore] = []
  extra_matcher: Any = None   # a PatternMatcher applied at the end of lowering
  exact_fmod: bool = True     # float CMOD renders as an exact fmod (libm, OpenCL); False: lowering decomposes it
                              # (tiny_codegen.lower.decomp.exact_fmod), rendering a MULACC "fma" fused
  code_for_op: dict[Ops, Callable] = {}
  compiler_cls: type[Compiler] = Compiler

  def __init__(self, arch: str = ""):
    self.arch = arch
    self.compiler = self.make_compiler()

  def make_compiler(self) -> Compiler: return self.compiler_cls()

  def render(self, uops: list[UOp]) -> str:
    """Source text of the program `uops` (a linearized list ending in SINK)."""
    raise NotImplementedError(f"{type(self).__name__} does not implement render")

  def supported_dtypes(self) -> tuple[DType, ...]: return dtypes.all

  def __reduce__(self) -> Any: return (type(self), (self.arch,))
  def __repr__(self) -> str: return f"{type(self).__name__}({self.arch!r})"


# ***** memory *****
@dataclass(frozen=True, eq=True)
class BufferSpec:
  """Options of an allocation: host-visible, uncached, image layout, ..."""
  image: ImageDType | None = None
  uncached: bool = False
  cpu_access: bool = False
  host: bool = False
  nolru: bool = False
  external_ptr: int | None = None


T = TypeVar("T")
_DEFAULT_SPEC = BufferSpec()  # `options=None`: made once (a frozen dataclass is slow to build and to hash)


class Allocator(Generic[T]):
  """Device memory. Subclasses implement `_alloc`, `_free`, `_copyin`, `_copyout` and optionally `_transfer`,
  `_offset` (a view into an allocation) and `_as_buffer` (a zero-copy host memoryview); docs/PLUGINS.md has the
  contract. Without `_offset`, a `Buffer.view` is a copy of the viewed bytes, taken when the view is allocated."""

  def alloc(self, size: int, options: BufferSpec | None = None) -> T:
    if not isinstance(size, int) or size < 0:
      raise ValueError(f"allocation size must be a non-negative int, got {size!r}")
    return self._alloc(size, options if options is not None else _DEFAULT_SPEC)

  def free(self, opaque: T, size: int, options: BufferSpec | None = None) -> None:
    self._free(opaque, options if options is not None else _DEFAULT_SPEC)

  def _alloc(self, size: int, options: BufferSpec) -> T: raise NotImplementedError("need _alloc")
  def _free(self, opaque: T, options: BufferSpec) -> None: pass
  def _copyin(self, dest: T, src: memoryview) -> None: raise NotImplementedError("need _copyin")
  def _copyout(self, dest: memoryview, src: T) -> None: raise NotImplementedError("need _copyout")


class LRUAllocator(Allocator[T]):
  """Keeps freed allocations by (size, options) and hands them back instead of allocating again. Blocks of the default
  options are kept by size alone in `plain` (the eager hot path frees and reuses one such block per op: no key tuple,
  no dataclass hash, no new list per free); the others in `cache` by (size, options)."""

  def __init__(self) -> None:
    self.cache: dict[tuple[int, BufferSpec | None], list[T]] = {}
    self.plain: dict[int, list[T]] = {}
    self.lock = threading.Lock()

  def alloc(self, size: int, options: BufferSpec | None = None) -> T:
    plain = options is None or options == _DEFAULT_SPEC
    self.lock.acquire()  # (not `with`: a with statement makes two bound methods; this is the eager hot path)
    try:
      if (lst := self.plain.get(size) if plain else self.cache.get((size, options))): return lst.pop()
    finally: self.lock.release()
    try: return super().alloc(size, options)
    except MemoryError:
      self.free_cache()
      return super().alloc(size, options)

  def free(self, opaque: T, size: int, options: BufferSpec | None = None) -> None:
    if options is None or options == _DEFAULT_SPEC:
      self.lock.acquire()  # (not `with`: see `alloc`)
      try:
        if (lst := self.plain.get(size)) is None: self.plain[size] = [opaque]
        else: lst.append(opaque)
      finally: self.lock.release()
      return
    if options.nolru or options.external_ptr is not None: return super().free(opaque, size, options)
    with self.lock: self.cache.setdefault((size, options), []).append(opaque)

  def free_cache(self) -> None:
    with self.lock:
      for lst in self.plain.values():
        for opaque in lst: self._free(opaque, _DEFAULT_SPEC)
      for (_, opts), lst in self.cache.items():
        for opaque in lst: self._free(opaque, opts if opts is not None else _DEFAULT_SPEC)
      self.plain.clear()
      self.cache.clear()


class Program:
  """A kernel loaded on a device. `__call__` runs it and returns seconds taken when `wait`, else None."""

  def __init__(self, device: Compiled, name: str, lib: bytes, **kwargs: Any):
    self.device, self.name, self.lib = device, name, lib

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    raise NotImplementedError(f"{type(self).__name__} does not implement __call__")


class Compiled:
  """An opened device. `renderers` lists renderer classes, the first being the default; `DEV=CPU:CLANG` picks one
  by name."""
  profile_events: ClassVar[list] = []

  def __init__(self, device: str, allocator: Allocator, renderers: Sequence[type[Renderer]],
               program_cls: type[Program] | Callable,
               graph: type | None = None, arch: str = ""):
    self.device, self.allocator, self.program_cls, self.graph = device, allocator, program_cls, graph
    self.renderer_classes = list(renderers)
    self.arch = arch
    self._renderer: Renderer | None = None
    self._programs: dict[tuple[str, bytes], Any] = {}

  @property
  def renderer(self) -> Renderer:
    """The renderer chosen by the device string's renderer field (`CPU:CLANG`), else the default."""
    if self._renderer is None: self._renderer = self.select_renderer(None)
    return self._renderer

  @renderer.setter
  def renderer(self, r: Renderer) -> None:
    self._renderer = r
    config_changed()  # what compiles changed: caches kept by ContextVar.version (eager replays) check again

  def select_renderer(self, name: str | None) -> Renderer:
    if not self.renderer_classes: raise RuntimeError(f"device {self.device} has no renderer")
    if name is None: return self.renderer_classes[0](self.arch)
    for c in self.renderer_classes:
      spellings = (c.__name__.upper(), c.__name__.upper().removesuffix("RENDERER"), getattr(c, "device", "").upper())
      if name.upper() in spellings:
        return c(self.arch)
    names = [c.__name__.upper().removesuffix("RENDERER") or c.__name__ for c in self.renderer_classes]
    raise ValueError(f"device {self.device} has no renderer {name!r}; its renderers: {', '.join(names)} "
                     f"(DEV={self.device.split(':')[0]}:{names[0]})")

  def get_program(self, name: str, lib: bytes, **kwargs: Any) -> Any:
    """The loaded program for a binary, loaded once per device."""
    key = (name, lib)
    if (p := self._programs.get(key)) is None: p = self._programs[key] = self.program_cls(self, name, lib, **kwargs)
    return p

  def synchronize(self) -> None:
    """Wait for all queued work on this device."""

  def finalize(self) -> None:
    """Release device resources (called at exit)."""

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.device}>"


class Buffer:
  """`size` elements of `dtype` on `device`, allocated on first use. `view(size, dtype, offset)` shares the memory.

  `Buffer.host_read_hooks` (callables taking the Buffer) are called before each read of device data into host memory
  (`copyout`, and `as_buffer`'s zero-copy view); a hook may raise to refuse the read (TinyJit does while capturing).
  """
  host_read_hooks: ClassVar[list[Callable[[Buffer], None]]] = []

  def __init__(self, device: str, size: int, dtype: DType, opaque: Any = None, options: BufferSpec | None = None,
               initial_value: bytes | None = None, base: Buffer | None = None, offset: int = 0,
               preallocate: bool = False):
    if isinstance(dtype, PtrDType) and not isinstance(dtype, ImageDType): dtype = dtype.base
    if not isinstance(size, int) or size < 0: raise ValueError(f"Buffer size must be a non-negative int, got {size!r}")
    self.device, self.size, self.dtype, self.options, self.offset = device, size, dtype, options, offset
    self._base = base
    self._opaque = opaque
    self._copied_view = False  # a view made by copying (the allocator has no _offset): it owns its memory
    if base is not None:
      if offset < 0 or offset + self.nbytes > base.nbytes:
        raise ValueError(f"view of {self.nbytes} bytes at offset {offset} is outside its base of {base.nbytes} bytes")
    if initial_value is not None:
      self.allocate()
      self.copyin(memoryview(initial_value))
    elif preallocate: self.allocate()

  @property
  def base(self) -> Buffer: return self._base if self._base is not None else self
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def is_allocated(self) -> bool:
    return self._opaque is not None or (self._base is not None and self._base.is_allocated)

  @property
  def allocator(self) -> Allocator:
    # hot path (every allocation and free): an opened device by its canonical name, without canonicalizing again
    return (_plugins.Device._opened.get(self.device) or _plugins.Device[self.device]).allocator

  def ensure_allocated(self) -> Buffer: return self if self._opaque is not None else self.allocate()

  def allocate(self, opaque: Any = None) -> Buffer:
    if self._opaque is not None: return self
    if self._base is not None:
      self._base.ensure_allocated()
      alloc = self.allocator
      if hasattr(alloc, "_offset"): self._opaque = alloc._offset(self._base._opaque, self.nbytes, self.offset)
      else: self._opaque = self._copy_of_base(alloc)
    else:
      self._opaque = opaque if opaque is not None else self.allocator.alloc(self.nbytes, self.options)
    return self

  def _copy_of_base(self, alloc: Allocator) -> Any:
    """A view on a device whose allocator has no `_offset`: new memory holding the viewed bytes as they are now.
    Reads through it are right; writes through it (or to the base later) are not shared (docs/PLUGINS.md)."""
    base = self.base
    opaque = alloc.alloc(self.nbytes, self.options)
    if self.nbytes:
      host = memoryview(bytearray(base.nbytes))
      alloc._copyout(host, base._opaque)  # the allocator directly: this is no host read of the user's
      alloc._copyin(opaque, host[self.offset:self.offset + self.nbytes])
    self._copied_view = True
    return opaque

  @property
  def _buf(self) -> Any:
    if self._opaque is None: self.allocate()
    return self._opaque

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    if getattr(self, "_opaque", None) is None: return  # never allocated (or refused by __init__)
    with _errors("Buffer.__del__ (allocator.free)"):
      owned = self.options is None or self.options.external_ptr is None
      if (self._base is None or self._copied_view) and owned:
        self.allocator.free(self._opaque, self.nbytes, self.options)

  def view(self, size: int, dtype: DType, offset: int) -> Buffer:
    """A buffer sharing this one's memory, starting `offset` bytes in."""
    return Buffer(self.device, size, dtype, base=self.base, offset=self.offset + offset, options=self.options)

  def _check(self, mv: memoryview, what: str) -> memoryview:
    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    if mv.nbytes != self.nbytes:
      raise ValueError(f"{what} of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes "
                       f"({self.size} x {self.dtype}): sizes must match")
    return mv

  def copyin(self, mv: memoryview) -> Buffer:
    """Copy host bytes in; the size must match exactly (never reads or writes past either side)."""
    mv = self._check(memoryview(mv), "copyin")
    self.allocator._copyin(self._buf, mv)
    return self

  def copyout(self, mv: memoryview) -> memoryview:
    """Copy the contents out into a host memoryview of exactly this buffer's size."""
    for hook in Buffer.host_read_hooks: hook(self)
    mv = self._check(memoryview(mv), "copyout")
    self.allocator._copyout(mv, self._buf)
    return mv

  def as_buffer(self, allow_zero_copy: bool = False, force_zero_copy: bool = False) -> memoryview:
    """The contents as host memory: zero-copy where the allocator supports it, else a copy."""
    alloc = self.allocator
    if (allow_zero_copy or force_zero_copy) and hasattr(alloc, "_as_buffer"):
      for hook in Buffer.host_read_hooks: hook(self)
      return alloc._as_buffer(self._buf)
    if force_zero_copy: raise RuntimeError(f"device {self.device} has no zero-copy host view")
    return self.copyout(memoryview(bytearray(self.nbytes)))

  def numpy(self) -> Any:
    import numpy as np
    from tiny_uop.dtype import to_numpy
    return np.frombuffer(self.as_buffer(), dtype=to_numpy(self.dtype)).copy()

  def __repr__(self) -> str:
    offset = f" offset:{self.offset}" if self._base else ""
    return f"<buf device:{self.device} size:{self.size} dtype:{self.dtype}{offset}>"


# ***** a small on-disk cache (sqlite) shared by compilers and BEAM *****
_db_lock = threading.Lock()
_db_conn: sqlite3.Connection | None = None


def _db() -> sqlite3.Connection:
  global _db_conn
  if _db_conn is None:
    _db_conn = sqlite3.connect(os.path.join(cache_dir(), "cache.db"), timeout=30, check_same_thread=False)
  return _db_conn


def diskcache_get(table: str, key: str) -> Any:
  if CACHELEVEL < 1: return None
  with _db_lock:
    try: row = _db().execute(f"SELECT val FROM {table}_v1 WHERE key=?", (key,)).fetchone()
    except sqlite3.OperationalError: return None
  return row[0] if row else None


def diskcache_put(table: str, key: str, val: bytes) -> None:
  if CACHELEVEL < 1: return
  with _db_lock:
    try:
      db = _db()
      db.execute(f"CREATE TABLE IF NOT EXISTS {table}_v1 (key TEXT PRIMARY KEY, val BLOB)")
      db.execute(f"INSERT OR REPLACE INTO {table}_v1 (key, val) VALUES (?, ?)", (key, val))
      db.commit()
    except sqlite3.OperationalError: pass  # a read-only or locked cache must never fail a compile


@dataclass
class ProgramSpec:
  """What the runtime needs to launch a compiled kernel (the tiny-tensor engine builds it from a PROGRAM UOp)."""
  name: str
  src: str
  device: str
  lib: bytes | None = None
  global_size: tuple[int, ...] = (1, 1, 1)
  local_size: tuple[int, ...] | None = None
  vars: list[UOp] = field(default_factory=list)  # DEFINE_VARs, in argument order
  globals: list[int] = field(default_factory=list)  # PARAM slots, in argument order
  outs: list[int] = field(default_factory=list)
  ins: list[int] = field(default_factory=list)
  estimates: Any = None
  uops: list[UOp] | None = None
  cost: int = 0  # a split CPU kernel's work (`tiny_codegen.lower.dims.kernel_cost`), for its launch path; 0 unknown
