"""OpenCL C checking: the "binary" of an OpenCL kernel is its source (OpenCL runtimes build source at load time).

`OpenCLCompiler.compile` checks the source first, so errors surface at compile time with our source attached:
with clang (`-x cl -cl-std=CL2.0 -target spir64 -fsyntax-only`, clang's own OpenCL header) when it is installed;
without clang the source is returned unchecked. `build_spir(src)` gives SPIR LLVM bitcode (for inspection/tests).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from tiny_uop.device import CompileError, Compiler

CL_ARGS = ("-x", "cl", "-cl-std=CL2.0", "-target", "spir64", "-Xclang", "-finclude-default-header")


def find_clang() -> str | None:
  """clang on PATH (any version with an OpenCL front end), else None."""
  return shutil.which("clang")


class OpenCLCompiler(Compiler):
  """OpenCL C source -> the same source as bytes, after clang's syntax and type check (see the module docstring)."""

  def __init__(self, check: bool = True):
    self.clang = find_clang() if check else None
    super().__init__(f"opencl_{self.clang}")

  def _clang(self, src: str, *args: str) -> subprocess.CompletedProcess:
    assert self.clang is not None
    return subprocess.run([self.clang, *CL_ARGS, *args, "-"], input=src.encode(), capture_output=True)

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
    if self.clang is None: raise CompileError("clang is not installed: can't build SPIR (apt-get install clang)")
    with tempfile.TemporaryDirectory(prefix="tiny_cl_") as d:
      out = os.path.join(d, "kernel.bc")
      proc = self._clang(src, "-c", "-emit-llvm", "-O2", "-o", out)
      if proc.returncode != 0:
        err = proc.stderr.decode(errors='replace')
        raise CompileError(f"clang failed to build SPIR:\n{err}\n--- source ---\n{src}")
      with open(out, "rb") as f: return f.read()

  def disassemble(self, lib: bytes) -> str: return lib.decode()
