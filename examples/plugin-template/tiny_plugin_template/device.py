"""The TEMPLATE device, written from tiny's device interfaces (`tiny_uop.device`; docs/PLUGINS.md in tiny):

- `TemplateAllocator(Allocator)`: memory. Here plain host memory (ctypes arrays); a GPU would map device memory.
  It implements the four required methods and none of the optional ones: without `_offset`, tiny makes a view of a
  buffer (a slice of a realized tensor) by copying the viewed bytes; without `_as_buffer`, reads go through `_copyout`.
- `TemplateCompiler(Compiler)`: source -> binary. The renderer emits LLVM IR; this compiler runs LLVM's optimizer
  (llvmlite, in-process) and returns the optimized IR text as the "binary". A real backend would emit machine code.
- `TemplateProgram(Program)`: a loaded binary; calling it runs the kernel. Here llvmlite's MCJIT compiles the IR for
  the host and ctypes calls it, once per thread index (tiny's CPU calling convention: PIPELINE.md §4).
- `TemplateRenderer(LLVMRenderer)`: tiny-codegen's LLVM IR renderer, told which compiler to use. Most backends reuse
  one of tiny-codegen's renderers (C, LLVM IR, PTX, OpenCL C, AMDGPU) and bring their own runtime.
- `TemplateDevice(Compiled)`: ties them together; tiny calls ``TemplateDevice("TEMPLATE")`` to open it.

Opening fails with `DeviceUnavailableError` when the device can't work here (no hardware, a missing library): say
why and what to use instead; tiny shows that message and keeps every other device working.
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from tiny_codegen.compiler.llvm import LLVMCompiler
from tiny_codegen.renderer.llvmir import LLVMRenderer
from tiny_uop.device import Allocator, BufferSpec, Compiled, Compiler, Program
from tiny_uop.plugins import DeviceUnavailableError


class TemplateMem:
  """One allocation: `nbytes` bytes at `addr` (kept alive by `raw`)."""
  __slots__ = ("raw", "addr", "nbytes")

  def __init__(self, nbytes: int):
    self.raw = (ctypes.c_uint8 * max(nbytes, 1))()
    self.addr, self.nbytes = ctypes.addressof(self.raw), nbytes


class TemplateAllocator(Allocator[TemplateMem]):
  """Required: `_alloc`, `_free`, `_copyin`, `_copyout` (docs/PLUGINS.md). `Allocator.alloc/free` call them."""

  def _alloc(self, size: int, options: BufferSpec) -> TemplateMem: return TemplateMem(size)
  def _free(self, opaque: TemplateMem, options: BufferSpec) -> None: pass  # ctypes frees `raw` with the object
  def _copyin(self, dest: TemplateMem, src: memoryview) -> None: ctypes.memmove(dest.addr, bytes(src), dest.nbytes)
  def _copyout(self, dest: memoryview, src: TemplateMem) -> None:
    dest[:] = memoryview(src.raw).cast("B")[:src.nbytes]


class TemplateCompiler(Compiler):
  """LLVM IR text -> optimized LLVM IR text (bytes). `compile_cached` (inherited) caches it on disk by the key."""

  def __init__(self) -> None:
    self.llvm = LLVMCompiler()      # tiny-codegen's: host target machine and LLVM's -O2 pipeline
    super().__init__("template_ir_v1")

  def compile(self, src: str) -> bytes: return self.llvm.optimized_ir(src).encode()
  def disassemble(self, lib: bytes) -> str: return lib.decode()


class TemplateRenderer(LLVMRenderer):
  """LLVM IR for the host, compiled by `TemplateCompiler`; one thread per kernel launch keeps the program simple."""
  device = "TEMPLATE"
  compiler_cls = TemplateCompiler

  def __init__(self, arch: str = ""):
    super().__init__(arch)
    self.threads = 1

  def make_compiler(self) -> TemplateCompiler: return TemplateCompiler()  # type: ignore[override]


_jit_lock = threading.Lock()


class TemplateProgram(Program):
  """The kernel `name` from `lib` (optimized LLVM IR), JIT-compiled for the host by llvmlite's MCJIT."""

  def __init__(self, device: TemplateDevice, name: str, lib: bytes, **kwargs: Any):
    super().__init__(device, name, lib)
    import llvmlite.binding as llvm
    with _jit_lock:
      llvm.initialize_native_asmprinter()
      # the target machine the IR was optimized for: the host CPU and its features (F16C for half, AVX, ...)
      tm = device.compiler.llvm.target_machine
      self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(lib.decode()), tm)  # kept: it owns the code
      self.engine.finalize_object()
      self.addr = self.engine.get_function_address(name)
    if not self.addr: raise ValueError(f"TEMPLATE program {name!r}: the binary defines no function {name!r}")
    self._fxns: dict[tuple[int, int], Any] = {}

  def __call__(self, *bufs: TemplateMem, global_size: tuple[int, ...] = (1, 1, 1),
               local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    """Run: buffers by address, then the variable values, then the thread index (`core_id`), for each thread."""
    if (fxn := self._fxns.get((len(bufs), len(vals)))) is None:
      proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(bufs)), *([ctypes.c_int32] * (len(vals) + 1)))
      fxn = self._fxns[(len(bufs), len(vals))] = proto(self.addr)
    st = time.perf_counter()
    for core_id in range(global_size[0] if global_size else 1): fxn(*(b.addr for b in bufs), *vals, core_id)
    return time.perf_counter() - st if wait else None


class TemplateDevice(Compiled):
  """``Device["TEMPLATE"]``: runs kernels on the host CPU through the interfaces above."""

  def __init__(self, device: str = "TEMPLATE"):
    try: import llvmlite.binding  # noqa: F401
    except ImportError as e:  # the kind of check a real device makes for its driver or hardware
      raise DeviceUnavailableError(f"{device} needs llvmlite: pip install llvmlite ({e})") from None
    super().__init__(device, TemplateAllocator(), [TemplateRenderer], TemplateProgram)
    self.compiler = TemplateCompiler()  # for its target machine (TemplateProgram)
