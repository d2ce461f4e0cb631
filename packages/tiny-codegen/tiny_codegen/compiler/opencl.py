"""OpenCL C checking: the "binary" of an OpenCL kernel is its source (OpenCL runtimes build source at load time).

`OpenCLCompiler.compile` checks the source first, so errors surface at compile time with our source attached:
with clang (`-x cl -cl-std=CL2.0 -target spir64 -fsyntax-only`, clang's own OpenCL header) when it is installed;
without clang the source is returned unchecked. clang is `tiny_uop.tools.find_tool("clang")`: on PATH, else zig's
clang driver (``pip install ziglang``), which has no OpenCL headers of its own and takes them from a package that
ships clang's (`CL_HEADER_PACKAGES`: PoCL's wheel). `build_spir(src)` gives SPIR LLVM bitcode (for inspection/tests).
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import tempfile

from tiny_uop.device import CompileError, Compiler
from tiny_uop.tools import find_tool

CL_ARGS = ("-x", "cl", "-cl-std=CL2.0", "-target", "spir64", "-Xclang", "-finclude-default-header")


# packages that ship clang's OpenCL headers (opencl-c-base.h, opencl-c.h): (distribution, folder in site-packages)
CL_HEADER_PACKAGES = (("pocl-binary-distribution", "pocl_binary_distribution/.libs/share/pocl/include"),)


def _cl_headers() -> str | None:
  for dist, rel in CL_HEADER_PACKAGES:
    try: d = str(importlib.metadata.distribution(dist).locate_file(rel))
    except importlib.metadata.PackageNotFoundError: continue
    if os.path.isfile(os.path.join(d, "opencl-c-base.h")): return d
  return None


def find_clang() -> list[str] | None:
  """The command line of a clang with an OpenCL front end and headers: clang on PATH, else zig's clang with the
  OpenCL headers of an installed package (`CL_HEADER_PACKAGES`), else None."""
  if (cmd := find_tool("clang", registry=False)) is not None: return cmd
  if (cmd := find_tool("clang")) is not None and (inc := _cl_headers()) is not None: return [*cmd, "-I", inc]
  return None


class OpenCLCompiler(Compiler):
  """OpenCL C source -> the same source as bytes, after clang's syntax and type check (see the module docstring)."""

  def __init__(self, check: bool = True):
    self.clang = find_clang() if check else None
    super().__init__(f"opencl_{' '.join(self.clang or [])}")

  def _clang(self, src: str, *args: str) -> subprocess.CompletedProcess:
    assert self.clang is not None
    return subprocess.run([*self.clang, *CL_ARGS, *args, "-"], input=src.encode(), capture_output=True)

  def compile(self, src: str) -> bytes:
    """Check `src` with clang when present; raise CompileError with clang's message and the source on errors."""
    if self.clang is not None:
      proc = self._clang(src, "-fsyntax-only")
      if proc.returncode != 0:
        raise CompileError(f"clang rejected the OpenCL C (exit {proc.returncode}):\n"
                           f"{proc.stderr.decode(errors='replace')}\n--- source ---\n{src}")
    return src.encode()

  def build_spir(self, src: str) -> bytes:
    """SPIR (LLVM bitcode for `spir64`) of `src`; needs clang."""
    if self.clang is None:
      raise CompileError("clang is not installed: can't build SPIR (apt-get install clang, or pip install ziglang "
                         "pocl-binary-distribution)")
    with tempfile.TemporaryDirectory(prefix="tiny_cl_") as d:
      out = os.path.join(d, "kernel.bc")
      proc = self._clang(src, "-c", "-emit-llvm", "-O2", "-o", out)
      if proc.returncode != 0:
        err = proc.stderr.decode(errors='replace')
        raise CompileError(f"clang failed to build SPIR:\n{err}\n--- source ---\n{src}")
      with open(out, "rb") as f: return f.read()

  def disassemble(self, lib: bytes) -> str: return lib.decode()
