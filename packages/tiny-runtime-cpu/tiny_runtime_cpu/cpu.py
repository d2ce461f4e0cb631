"""The CPU device: kernels compiled to native code, run on a persistent pool of threads.

- memory: 64-byte aligned host blocks (`HostAllocator`), zero-copy views and host memoryviews.
- renderers: `LLVMRenderer` (default; LLVM IR compiled in-process by llvmlite to an ELF object; on x86-64 our loader
  (`elfload.LoadedObject`) places each object in one mapping, elsewhere llvmlite's MCJIT links it: `object_loader`,
  ``CPU_LOADER``) and
  `ClangRenderer` (C compiled to a shared object, loaded with ctypes, by the first of ``$CC``, clang, cc, gcc or
  ziglang's ``zig cc``: `tiny_uop.tools.find_tool("cc")`). ``DEV=CPU:CLANG`` picks it.
- calling convention (PIPELINE.md §4): ``void name(T0* data0, ..., int var0, ..., int core_id)``; a launch with
  ``global_size[0] == n`` calls the kernel once per ``core_id`` in ``range(n)``, spread over the thread pool
  (``CPU_THREADS=k`` sets its size; default one per core). One share runs inline on the calling thread.
"""
from __future__ import annotations

import ctypes
import functools
import importlib
import operator
import os
import struct
import tempfile
import threading
import time
from typing import Any, Callable

from tiny_uop.device import Compiled, Program, Renderer
from tiny_uop.helpers import CPU_LOADER, CPU_THREADS, DEV, config_changed
from tiny_uop.plugins import DeviceUnavailableError
from tiny_uop.target import Target
from tiny_uop.tools import find_tool

from tiny_runtime_cpu.graph import ENTRY_WORDS, RUNNER_IR, RUNNER_PROTO, CPUGraph
from tiny_runtime_cpu.elfload import EM_X86_64, LoadedObject, ObjectLoadError, UnresolvedSymbolError
from tiny_runtime_cpu.memory import HostAllocator, HostMem
from tiny_runtime_cpu.native_pool import NativePool, call_ir
from tiny_runtime_cpu.threads import ThreadPool, default_threads

ELF_MAGIC = b"\x7fELF"
ET_REL, ET_DYN = 1, 3  # e_type values (elf.h): relocatable object, shared object
SHT_SYMTAB, SHN_UNDEF = 2, 0  # elf.h: the symbol table section type; st_shndx of an undefined symbol


class OutOfBoundsError(RuntimeError):
  """A CHECK_OOB kernel accessed memory outside a buffer (the access was skipped; see renderer.OOBCheck)."""


def elf_undefined_symbols(obj: bytes) -> list[str]:
  """Names of the undefined symbols of an ELF64 little-endian object (the functions it expects the loader to find).

  Layouts from the ELF specification (elf.h): e_shoff at 0x28 (u64), e_shentsize at 0x3A, e_shnum at 0x3C (u16);
  Elf64_Shdr (64 bytes) sh_type at 4 (u32), sh_offset at 24, sh_size at 32 (u64), sh_link at 40 (u32, the string
  table), sh_entsize at 56; Elf64_Sym (24 bytes) st_name at 0 (u32), st_shndx at 6 (u16)."""
  if obj[:4] != ELF_MAGIC or obj[4] != 2 or obj[5] != 1:
    raise ValueError(f"not a 64-bit little-endian ELF object: header {bytes(obj[:6])!r}")
  shoff = struct.unpack_from("<Q", obj, 0x28)[0]
  shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
  shdrs = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
  out = []
  for _, sh_type, _, _, off, size, link, _, _, entsize in shdrs:
    if sh_type != SHT_SYMTAB: continue
    str_off = shdrs[link][4]
    for k in range(1, size // (entsize or 24)):  # entry 0 is the null symbol
      st_name, _, _, st_shndx = struct.unpack_from("<IBBH", obj, off + k * (entsize or 24))
      if st_shndx == SHN_UNDEF and st_name:
        end = obj.index(b"\0", str_off + st_name)
        out.append(obj[str_off + st_name:end].decode())
  return out


def _renderer_classes() -> tuple[list[type[Renderer]], dict[str, str]]:
  """The CPU renderers from tiny-codegen, LLVM first, and why any of them failed to import (name -> reason)."""
  out: list[type[Renderer]] = []
  errors: dict[str, str] = {}
  for name, mod, attr in (("LLVM", "tiny_codegen.renderer.llvmir", "LLVMRenderer"),
                          ("CLANG", "tiny_codegen.renderer.cstyle", "ClangRenderer")):
    try: out.append(getattr(importlib.import_module(mod), attr))
    except (ImportError, AttributeError) as e: errors[name] = f"{type(e).__name__}: {e}"
  return out, errors


class TargetRenderer:
  """Mixin for `Compiled` devices: `renderer` follows the renderer/arch the DEV string names for this device
  (``DEV=CPU:CLANG``), re-read on every access so ``Context(DEV=...)`` scopes it; renderers are built once each."""
  _by_target: dict[tuple[str | None, str | None], Renderer]

  @property
  def renderer(self) -> Renderer:
    dev = DEV.value
    if (last := self.__dict__.get("_last_renderer")) is not None and last[0] == dev: return last[1]  # hot path
    from tiny_uop.plugins import Device
    t = Device.target(self.device)  # type: ignore[attr-defined]
    key = (t.renderer, t.arch)
    if (r := self.__dict__.setdefault("_by_target", {}).get(key)) is None:
      r = self._by_target[key] = self.make_renderer(t.renderer, t.arch)
    self.__dict__["_last_renderer"] = (dev, r)
    return r

  @renderer.setter
  def renderer(self, r: Renderer) -> None:
    from tiny_uop.plugins import Device
    t = Device.target(self.device)  # type: ignore[attr-defined]
    self.__dict__.setdefault("_by_target", {})[(t.renderer, t.arch)] = r
    self.__dict__.pop("_last_renderer", None)
    config_changed()  # what compiles changed: caches kept by ContextVar.version (eager replays) check again

  def make_renderer(self, name: str | None, arch: str | None) -> Renderer:
    r: Renderer = self.select_renderer(name)  # type: ignore[attr-defined]
    return r if arch is None or arch == r.arch else type(r)(arch)


_TABLE = ctypes.c_int64 * ENTRY_WORDS  # a one-kernel graph table: an inline run of a split kernel's shares
_ADDR = operator.attrgetter("addr")  # a HostMem's address (a kernel argument)


def _launch1(fxn: Any) -> Callable[..., None]:
  return lambda a: fxn(a.addr, 0)


def _launch2(fxn: Any) -> Callable[..., None]:
  return lambda a, b: fxn(a.addr, b.addr, 0)


def _launch3(fxn: Any) -> Callable[..., None]:
  return lambda a, b, c: fxn(a.addr, b.addr, c.addr, 0)


# `CPUProgram.launcher` of a kernel of 1-3 buffers without CHECK_OOB: the addresses read by name and passed as they
# are (the general launcher's `map` and star call cost ~0.3 us of the eager hot path, an elementwise op's launch)
_DIRECT_LAUNCH: dict[int, Callable[[Any], Callable[..., None]]] = {1: _launch1, 2: _launch2, 3: _launch3}


class CPUProgram(Program):
  """A native kernel: an ELF relocatable object (LLVM) placed by our loader (x86-64) or MCJIT (other machines), or a
  shared object (clang) loaded with ctypes."""

  python_min_work = 3 << 20
  """A launch of several shares through this Python path (`__call__`: ctypes, then the pool's dispatch) of a kernel
  whose cost (`ProgramSpec.cost`: `lower.dims.kernel_cost`, given to `get_program` as `cost=`) is below this runs its
  shares on the launching thread instead (`inline_launches` counts those); the renderer splits kernels from its much
  lower `thread_min_work`, sized for replays, whose helpers poll natively and join in ~0.1 µs.

  It is not derived from the machine model because what it stands for is no property of the CPU: launches made from
  Python are further apart than the helpers' native poll (`ThreadPool.native_spin_s`), so the helper is blocked in
  Python, and a split launch waits for the OS to wake it (a token on the pool's queue) and for it to take the GIL
  and reach its native poll. That wake-up is the host's latency: 50-100 µs on a VM whose idle vCPU halts (an IPI
  through the hypervisor), ~5-10 µs on bare metal or with halt-polling, and under load whatever the scheduler
  gives; a split pays from ~2 wake-ups of one thread's work. Measuring it when the pool starts was rejected: one
  wake-up varies 10x with the load of that moment, and its least of several, the robust figure, is the quiet-host
  figure, which would split kernels that then lose under load. So it stays the one measured value, with what it
  was measured as: a kernel of ~30-60 µs on one thread (at the 50-90 units/ns of `CPURenderer.thread_min_work`),
  12x the renderer's minimum, from a 2-core znver4 under load ~6 (bench_cpu `launch_shares`; a+b 262144, 3.4M units,
  207 -> 70 µs split; per-row sums of 262144, 2.1M units, 15 -> 24 µs, a loss). Set it per process where the host
  wakes threads faster (lower) or slower (higher); it changes no result, only which thread runs a share."""
  inline_launches = 0

  def __init__(self, device: CPUDevice, name: str, lib: bytes, **kwargs: Any):
    super().__init__(device, name, lib)
    if not isinstance(lib, (bytes, bytearray)) or lib[:4] != ELF_MAGIC or len(lib) < 64:  # 64: an ELF64 header
      raise ValueError(f"CPU program {name!r}: expected an ELF object or shared library, got {bytes(lib[:16])!r}...")
    e_type = struct.unpack_from("<H", lib, 16)[0]
    self._oob: Any = None  # the CHECK_OOB record (renderer.OOBCheck) of a kernel compiled with the checks
    self.loader = ""  # what placed the code: "elf" (elfload), "mcjit" or "dlopen" (a shared object)
    if e_type == ET_REL:
      self.addr, oob = self._load_object(device, name, bytes(lib))
      if oob: self._oob = (ctypes.c_int64 * 4).from_address(oob)
    elif e_type == ET_DYN:
      self.loader = "dlopen"
      self.addr = self._load_shared(name, bytes(lib))
      try: self._oob = (ctypes.c_int64 * 4).in_dll(self._dll, f"{name}_oob")
      except ValueError: pass  # compiled without CHECK_OOB
    else: raise ValueError(f"CPU program {name!r}: ELF type {e_type} is neither an object (1) nor a shared library (3)")
    self._fxns: dict[tuple[int, int], Any] = {}
    self.pool = device.pool
    self.cost = int(kwargs.get("cost", 0))  # the kernel's `kernel_cost` when the compiler said (0: unknown)
    self._inline: dict[tuple[int, int], tuple[int, Any]] = {}  # (trampoline, runner) per argument signature
    self._native_load = device.native_load

  def _load_object(self, device: CPUDevice, name: str, obj: bytes) -> tuple[int, int]:
    """(address of function `name`, address of its CHECK_OOB record or 0), placed by `object_loader(obj)`'s choice.
    Our loader's refusal (`ObjectLoadError`: a relocation type it doesn't know, a malformed object, ...) is an error,
    never a silent switch to MCJIT: on x86-64 MCJIT is what aborted the process, and a refusal is a gap to fix."""
    self.loader = object_loader(obj)
    if self.loader == "mcjit": return device.jit.load(name, obj, f"{name}_oob")
    try: self._image = LoadedObject(obj, f"kernel {name!r}")  # kept as long as this program: unmapped with it
    except ObjectLoadError as e:
      raise ObjectLoadError(f"{e} (CPU_LOADER=MCJIT links LLVM objects with llvmlite's MCJIT instead, which can abort "
                            "the process when a multi-GB buffer splits the address space)") from e
    if not (addr := self._image.symbol(name)): raise ValueError(f"object file for kernel {name!r} defines no function "
                                                                f"{name!r}")
    return addr, self._image.symbol(f"{name}_oob")

  def _load_shared(self, name: str, lib: bytes) -> int:
    fd, path = tempfile.mkstemp(prefix=f"tiny_{name}_", suffix=".so")
    try:
      with os.fdopen(fd, "wb") as f: f.write(lib)
      try: self._dll = ctypes.CDLL(path)  # kept: unloading it would free the code (RTLD_NOW: all symbols bound now)
      except OSError as e:
        if "undefined symbol" not in str(e): raise
        raise UnresolvedSymbolError(f"kernel {name!r} can't be loaded: {str(e).split(': ', 1)[-1]} (a function the "
                                    "compiler called that this process doesn't provide)") from e
    finally: os.unlink(path)
    try: fn = getattr(self._dll, name)
    except AttributeError as e: raise ValueError(f"shared library for {name!r} has no symbol {name!r}") from e
    return ctypes.cast(fn, ctypes.c_void_p).value or 0

  def _fxn(self, nbufs: int, nvals: int) -> Any:
    if (f := self._fxns.get((nbufs, nvals))) is None:
      proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs), *([ctypes.c_int32] * (nvals + 1)))
      f = self._fxns[(nbufs, nvals)] = proto(self.addr)
    return f

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    fxn = self._fxn(len(bufs), len(vals))
    args = [b.addr if isinstance(b, HostMem) else b for b in bufs]
    args.extend(vals)
    n = global_size[0] if global_size else 1
    st = time.perf_counter() if wait else 0.0
    if n == 1: fxn(*args, 0)
    elif 0 < self.cost < self.python_min_work: self._run_inline(args, len(bufs), len(vals), n)
    elif not ((native := self.pool.native) is not None and
              self.pool.run_native(native.tramp(len(bufs), len(vals)), self.addr, native.args(args), n)):
      self.pool.run(functools.partial(fxn, *args), n)  # share i calls fxn(*args, i)
    if self._oob is not None and self._oob[0]: self._raise_oob(bufs)
    return time.perf_counter() - st if wait else None

  def _run_inline(self, args: list[int], nbufs: int, nvals: int, n: int) -> None:
    """Shares 0..n-1 on this thread, in order, in one native call: the graph runner (`graph.RUNNER_IR`) over a
    one-entry table, given no dispatch block (as a replay without helpers runs a split kernel)."""
    tramp, runner = self._inline_fns(nbufs, nvals)
    block = (ctypes.c_int64 * max(1, len(args)))(*args)
    table = _TABLE(tramp, self.addr, ctypes.addressof(block), n)  # both kept alive through the call
    runner(ctypes.addressof(table), 1, None, 0, None)
    CPUProgram.inline_launches += 1

  def _inline_fns(self, nbufs: int, nvals: int) -> tuple[int, Any]:
    """(trampoline address, graph runner) for inline runs of this kernel with `nbufs` buffers and `nvals` values."""
    if (inl := self._inline.get((nbufs, nvals))) is None:
      load = self._native_load
      inl = self._inline[(nbufs, nvals)] = (load(f"tiny_call_{nbufs}_{nvals}", call_ir(nbufs, nvals)),
                                            RUNNER_PROTO(load("tiny_graph_run", RUNNER_IR)))
    return inl

  def launcher(self, nbufs: int, global_size: tuple[int, ...] | None,
               local_size: tuple[int, ...] | None = None) -> Callable[..., None] | None:
    """A function of the kernel's `nbufs` buffers (HostMem: what the CPU allocator gives) that launches it as
    `__call__` does with no variables and no wait, its argument conversion decided once (the engine's eager replay):
    a split kernel under `python_min_work` runs its shares inline, as `__call__` does; None when the kernel runs in
    shares on the thread pool (then `__call__` is the way)."""
    n, oob = (global_size[0] if global_size else 1), self._oob
    if n != 1:
      if not 0 < self.cost < self.python_min_work: return None
      (tramp, runner), block_t, addr = self._inline_fns(nbufs, 0), ctypes.c_int64 * max(1, nbufs), self.addr

      def inline(*bufs: HostMem) -> None:  # as `_run_inline`, the argument block's type made once
        block = block_t(*map(_ADDR, bufs))
        table = _TABLE(tramp, addr, ctypes.addressof(block), n)
        runner(ctypes.addressof(table), 1, None, 0, None)
        CPUProgram.inline_launches += 1
        if oob is not None and oob[0]: self._raise_oob(bufs)
      return inline
    fxn = self._fxn(nbufs, 0)
    if oob is None and nbufs in _DIRECT_LAUNCH: return _DIRECT_LAUNCH[nbufs](fxn)

    def launch(*bufs: HostMem) -> None:
      fxn(*map(_ADDR, bufs), 0)
      if oob is not None and oob[0]: self._raise_oob(bufs)
    return launch

  def _raise_oob(self, bufs: tuple[Any, ...]) -> None:
    kind, slot, idx, size = list(self._oob)
    self._oob[0] = 0  # reported once: the next launch starts clean
    what = f"buffer data{slot}" if slot >= 0 else "a register array"
    raise OutOfBoundsError(f"CHECK_OOB: kernel {self.name!r} {'wrote' if kind == 2 else 'read'} element {idx} of "
                           f"{what}, which holds {size} elements (valid: 0..{size - 1}); the access was skipped")


def object_loader(obj: bytes) -> str:
  """Which loader places an LLVM relocatable object on this machine: ``"elf"`` (ours, `elfload.LoadedObject`: each
  kernel in one mapping) for an x86-64 object on a POSIX host, ``"mcjit"`` (llvmlite's MCJIT, `MCJIT`) for any other
  machine (aarch64, ...), where llvmlite's own memory manager keeps an object's sections together. ``CPU_LOADER=ELF``
  or ``CPU_LOADER=MCJIT`` overrides the choice (ELF on another machine's object is refused by the loader naming the
  machine); any other value is an error. The choice is made per object and never changes after a failure."""
  want = str(CPU_LOADER.value).upper()
  if want not in ("", "ELF", "MCJIT"):
    raise ValueError(f"CPU_LOADER={CPU_LOADER.value!r}: valid are '' (tiny's ELF loader on x86-64, MCJIT elsewhere), "
                     "ELF and MCJIT")
  if want: return want.lower()
  return "elf" if struct.unpack_from("<H", obj, 18)[0] == EM_X86_64 and os.name == "posix" else "mcjit"


class MCJIT:
  """ELF objects linked into llvmlite MCJIT execution engines: the loader on machines other than x86-64 (there
  llvmlite's own memory manager keeps an object's sections together). Kernels with the same name but different code
  go into different engines (an engine resolves a symbol name once). On x86-64 with the default memory manager a
  multi-GB buffer can put a later kernel's code and constant pool more than 2 GB apart (a relocation overflow that
  aborts the process): `elfload` exists for that."""

  def __init__(self) -> None:
    self.engines: list[tuple[Any, set[str]]] = []
    self.lock = threading.Lock()
    self.tm: Any = None

  def _new_engine(self) -> tuple[Any, set[str]]:
    import llvmlite.binding as llvm
    if self.tm is None:
      llvm.initialize_native_target()
      llvm.initialize_native_asmprinter()
      self.tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
    eng: tuple[Any, set[str]] = (llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm), set())
    self.engines.append(eng)
    return eng

  def load(self, name: str, obj: bytes, data: str | None = None) -> tuple[int, int]:
    """Link object `obj`: the addresses of its function `name` and of its global `data` (0 if absent). Every symbol
    it leaves undefined must resolve in this process first: MCJIT would otherwise finalize anyway and the call jump
    to address 0."""
    import llvmlite.binding as llvm
    with self.lock:
      engine, names = next((e for e in self.engines if name not in e[1]), None) or self._new_engine()
      missing = [sym for sym in elf_undefined_symbols(obj) if not llvm.address_of_symbol(sym)]
      if missing:
        raise UnresolvedSymbolError(f"kernel {name!r} calls {', '.join(map(repr, missing))}, which this process can't "
                                    "resolve (a runtime-library helper the compiler emitted); the kernel is not run")
      engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
      engine.finalize_object()
      names.add(name)
      if not (addr := engine.get_function_address(name)):
        raise ValueError(f"object file for kernel {name!r} defines no function {name!r}")
      return addr, (engine.get_global_value_address(data) if data is not None else 0)


class CPUDevice(TargetRenderer, Compiled):
  """The host CPU. ``Device["CPU"]``; ``DEV=CPU:LLVM`` (default) or ``DEV=CPU:CLANG`` picks the renderer."""

  def __init__(self, device: str = "CPU"):
    Target.parse(device).check_interface(valid=(None,))  # no MOCK (or other) interface: not a driver
    classes, self.renderer_errors = _renderer_classes()
    super().__init__(device, HostAllocator(), classes, CPUProgram, graph=CPUGraph)
    self.jit = MCJIT()
    self._load_lock = threading.Lock()
    # the launching thread is one of them; launches are dispatched natively (native_pool) once the helpers start
    self.pool = ThreadPool(default_threads(int(CPU_THREADS.value)) - 1, make_native=self._make_native)

  def _make_native(self) -> NativePool:
    return NativePool(self.native_load, self.native_triple)

  @functools.cached_property
  def _native_compiler(self) -> Any:
    from tiny_codegen.compiler.llvm import LLVMCompiler
    return LLVMCompiler()

  @property
  def native_triple(self) -> str:
    """The target triple of the device's own native code (thread pool dispatch, graph runner)."""
    return str(self._native_compiler.triple)

  def native_load(self, name: str, ir: str) -> int:
    """Compile LLVM IR (cached) and load it: the address of its function `name` (the pool's and graph's code)."""
    return int(self.get_program(name, self._native_compiler.compile_cached(ir)).addr)

  def select_renderer(self, name: str | None) -> Renderer:
    if name is not None and name.upper() in ("CLANG", "C", "CLANGRENDERER") and find_tool("cc") is None:
      raise DeviceUnavailableError(f"DEV={self.device}:{name} needs a C compiler (clang or gcc), none is installed: "
                                   f"apt-get install clang (or gcc), or pip install ziglang; or use "
                                   f"{self.device}:LLVM, which needs only llvmlite")
    if name is not None and name.upper() == "C": name = "CLANG"
    if name is not None and name.upper() in self.renderer_errors:
      raise RuntimeError(f"renderer {name} for {self.device} failed to import: {self.renderer_errors[name.upper()]}")
    if not self.renderer_classes:
      raise RuntimeError(f"device {self.device} has no renderer: tiny-codegen's LLVMRenderer/ClangRenderer failed to "
                         f"import ({self.renderer_errors}); pip install tiny-codegen llvmlite")
    return super().select_renderer(name)

  def get_program(self, name: str, lib: bytes, **kwargs: Any) -> Any:
    """The loaded program for a binary, loaded once even when several threads ask at the same time."""
    if (p := self._programs.get((name, lib))) is not None:
      if not p.cost and (cost := int(kwargs.get("cost", 0))): p.cost = cost  # loaded first by a caller that didn't say
      return p
    with self._load_lock: return super().get_program(name, lib, **kwargs)

  def finalize(self) -> None: self.pool.close()
