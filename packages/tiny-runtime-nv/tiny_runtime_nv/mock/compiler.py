"""What the mock devices compile with: NVIDIA's ptxas (the real cubin, loaded by the real loaders) with the kernel's
PTX carried in one more ELF section, `.tiny.ptx`, which real loaders ignore and the mock GPUs execute.

`mock_renderers()` gives the renderer classes of `MOCK+NV` / `MOCK+CUDA`: PTXRenderer and NVPTXRenderer whose
compilers add that section (same class names, so `DEV=MOCK+NV:PTX` / `:NVPTX` pick them). Without ptxas the
compilers return the PTX text itself (the CUDA driver, real or mock, loads PTX; the NV device needs a cubin).
"""
from __future__ import annotations

from typing import Any

from tiny_codegen.compiler.ptx import PTXCompiler
from tiny_codegen.renderer import nvptx, ptx

from tiny_runtime_nv.elf import ELF, add_section

PTX_SECTION = ".tiny.ptx"


def with_ptx(lib: bytes, src: str) -> bytes:
  """The cubin `lib` with the PTX `src` in a `.tiny.ptx` section (PTX text stays as it is)."""
  return add_section(lib, PTX_SECTION, src.encode()) if lib.startswith(b"\x7fELF") else lib


def ptx_of(image: bytes) -> str:
  """The PTX a mock GPU executes for a loaded image: the `.tiny.ptx` section of a cubin, or PTX text."""
  if image.startswith(b"\x7fELF"):
    elf = ELF(image)
    if elf.section(PTX_SECTION) is None:
      raise ValueError("this cubin has no .tiny.ptx section: the mock GPU runs PTX, so compile with the mock "
                       "device's renderer (a cubin from plain ptxas carries only SASS)")
    return elf.data(PTX_SECTION).decode()
  return image.rstrip(b"\0").decode()


class MockPTXCompiler(PTXCompiler):
  """ptxas's cubin plus the PTX (see the module docstring)."""

  def __init__(self, arch: str = "sm_90"):
    super().__init__(arch)
    self.cachekey = f"mock_{self.cachekey}" if self.cachekey else None

  def compile(self, src: str) -> bytes: return with_ptx(super().compile(src), src)


class MockNVPTXCompiler(nvptx.NVPTXCompiler):
  """LLVM's PTX assembled by ptxas, plus that PTX."""

  def __init__(self, arch: str = "sm_90"):
    super().__init__(arch)
    self.cachekey = f"mock_{self.cachekey}" if self.cachekey else None

  def compile(self, src: str) -> bytes:
    text = self.to_ptx(src)
    return with_ptx(self.ptxas.compile(text), text)


class PTXRenderer(ptx.PTXRenderer):
  """PTXRenderer whose compiler keeps the PTX in the cubin for the mock GPU."""
  def make_compiler(self) -> Any: return MockPTXCompiler(self.arch or "sm_90")


class NVPTXRenderer(nvptx.NVPTXRenderer):
  """NVPTXRenderer whose compiler keeps the PTX in the cubin for the mock GPU."""
  def make_compiler(self) -> Any: return MockNVPTXCompiler(self.arch or "sm_90")


def mock_renderers() -> list[type]: return [PTXRenderer, NVPTXRenderer]
