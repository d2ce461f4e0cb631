"""The NULL device: compile-only. Kernels are rendered and compiled for any renderer and arch, and run nothing.

``DEV=NULL`` uses the host LLVM renderer; ``DEV=NULL:CLANG``, ``DEV=NULL:PTX:sm_90``, ``DEV=NULL:AMDGPU:gfx1100``
(alias AMD), ``DEV=NULL:OPENCL`` (alias CL)
load the renderer registered under that name in the ``tiny.renderers`` entry points (or tiny-codegen's PYTHON
renderer) with that arch. Allocations take no memory; copying data in is accepted and dropped; copying data out
raises, because there is none.
"""
from __future__ import annotations

from typing import Any

from tiny_uop.device import Allocator, BufferSpec, Compiled, Program, Renderer
from tiny_uop.target import Target

from tiny_runtime_cpu.cpu import TargetRenderer


class NullMem:
  """A placeholder for `nbytes` bytes that do not exist."""
  __slots__ = ("nbytes",)

  def __init__(self, nbytes: int): self.nbytes = nbytes
  def __repr__(self) -> str: return f"<NullMem {self.nbytes} bytes>"


class NullAllocator(Allocator[NullMem]):
  """Allocations that cost nothing. Views are checked against their base like real ones."""

  def _alloc(self, size: int, options: BufferSpec) -> NullMem: return NullMem(size)
  def _copyin(self, dest: NullMem, src: memoryview) -> None:
    if src.nbytes != dest.nbytes:
      raise ValueError(f"copyin of {src.nbytes} bytes into a NULL buffer of {dest.nbytes} bytes")

  def _copyout(self, dest: memoryview, src: NullMem) -> None:
    raise RuntimeError("NULL device buffers hold no data: NULL only compiles kernels; run on a real device "
                       "(DEV=CPU, DEV=PYTHON) to read results")

  def _offset(self, buf: NullMem, size: int, offset: int) -> NullMem:
    if offset < 0 or size < 0 or offset + size > buf.nbytes:
      raise ValueError(f"view of {size} bytes at offset {offset} is outside a NULL buffer of {buf.nbytes} bytes")
    return NullMem(size)

  def _transfer(self, dest: NullMem, src: NullMem, sz: int, **kwargs: Any) -> None: pass


class NullProgram(Program):
  """A loaded-nowhere kernel: calling it does nothing and takes no time."""

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    return 0.0 if wait else None


def _renderer_class(name: str) -> type[Renderer]:
  """The renderer class for a DEV renderer name: an entry point of ``tiny.renderers``, or PYTHON."""
  from tiny_uop.plugins import UnknownDeviceError, load_renderer, renderers
  aliases = {"CLANG": "C", "LLVMIR": "LLVM", "AMD": "AMDGPU", "NV": "PTX", "CUDA": "PTX", "CL": "OPENCL"}
  if name.upper() == "PYTHON":
    from tiny_codegen.renderer.python import PythonRenderer
    return PythonRenderer
  key = aliases.get(name.upper(), name.upper())
  if key not in renderers() and name.upper() in renderers(): key = name.upper()
  try: return load_renderer(key)
  except UnknownDeviceError as e: raise ValueError(f"NULL device: {e}") from e


class NullDevice(TargetRenderer, Compiled):
  """Compile-only device. ``DEV=NULL:PTX:sm_90``: kernels are rendered and compiled with PTX for sm_90."""

  def __init__(self, device: str = "NULL"):
    Target.parse(device).check_interface(valid=(None,))  # no MOCK (or other) interface: not a driver
    super().__init__(device, NullAllocator(), [], NullProgram)

  def make_renderer(self, name: str | None, arch: str | None) -> Renderer:
    return _renderer_class(name or "LLVM")(arch or "")
