"""PTX -> cubin with NVIDIA's `ptxas` when it is installed; otherwise the PTX text itself is the binary (the CUDA
driver JIT-compiles PTX at module load).

`PTXCompiler(arch)`: `compile(src)` runs `ptxas -arch=<arch> -O3` on the source and returns the cubin (an ELF);
errors raise CompileError with ptxas's message and the numbered source. `$PTXAS` overrides the ptxas path; without
it ptxas is looked for on PATH, in /usr/local/cuda/bin and in NVIDIA's `nvidia-cuda-nvcc` wheel (pip);
`PTX_ONLY=1` (or `use_ptxas=False`) skips ptxas and returns the PTX text.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

from tiny_uop.device import CompileError, Compiler
from tiny_uop.tools import find_tool


@functools.cache
def find_ptxas() -> str | None:
  """$PTXAS, else ptxas on PATH or in /usr/local/cuda/bin, else the one in the nvidia-cuda-nvcc wheel, else None
  (`tiny_uop.tools.find_tool`)."""
  return cmd[0] if (cmd := find_tool("ptxas")) is not None else None


def _numbered(src: str) -> str: return "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))


class PTXCompiler(Compiler):
  """PTX text -> cubin bytes (ptxas) or the PTX text (no ptxas); see the module docstring."""

  def __init__(self, arch: str = "sm_90", use_ptxas: bool | None = None):
    self.arch = arch
    if use_ptxas is None: use_ptxas = os.environ.get("PTX_ONLY", "0") in ("", "0")
    self.ptxas = find_ptxas() if use_ptxas else None
    super().__init__(f"ptx_{arch}_{self.ptxas}")

  def compile(self, src: str) -> bytes:
    """Assemble PTX `src` for `self.arch`: the cubin with ptxas, the PTX bytes without it."""
    if self.ptxas is None: return src.encode()
    with tempfile.TemporaryDirectory(prefix="tiny_ptx_") as d:
      pth, out = os.path.join(d, "kernel.ptx"), os.path.join(d, "kernel.cubin")
      with open(pth, "w") as f: f.write(src)
      proc = subprocess.run([self.ptxas, f"-arch={self.arch}", "-O3", pth, "-o", out], capture_output=True)
      if proc.returncode != 0:
        raise CompileError(f"ptxas -arch={self.arch} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr.decode(errors='replace')}\n--- source ---\n{_numbered(src)}")
      with open(out, "rb") as f: return f.read()

  def disassemble(self, lib: bytes) -> str:
    """PTX text as it is; a cubin through `cuobjdump -sass` when installed."""
    if not lib.startswith(b"\x7fELF"): return lib.decode()
    if (tool := shutil.which("cuobjdump")) is None: raise RuntimeError("cuobjdump is not installed")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
      f.write(lib)
      f.flush()
      return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
