"""C -> shared object, with clang (preferred) or the system C compiler."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile

from tiny_uop.device import CompileError, Compiler


def _host_cpu() -> str:
  """The host CPU name and features (-march=native code is only valid on the same CPU kind)."""
  try:
    from tiny_codegen.compiler.llvm import host_target
    return "_".join(host_target()[1:])
  except Exception:  # noqa: BLE001 -- without llvmlite: the machine string must do
    return platform.processor()


def find_cc() -> str | None:
  """The C compiler to use: $CC, else clang, else cc/gcc on PATH."""
  for c in (os.environ.get("CC"), "clang", "cc", "gcc"):
    if c and shutil.which(c): return c
  return None


class ClangCompiler(Compiler):
  """`cc -shared -O2 -march=native -fPIC -ffp-contract=off -fwrapv`, returning the .so's bytes."""

  def __init__(self, cc: str | None = None, args: tuple[str, ...] = ()):
    self.cc = cc or find_cc()
    self.is_clang = self.cc is not None and "clang" in os.path.basename(self.cc)
    march = "-mcpu=native" if platform.machine() in ("arm64", "aarch64") and not self.is_clang else "-march=native"
    self.args = ("-shared", "-O2", march, "-fPIC", "-ffp-contract=off", "-fwrapv", "-fno-math-errno", "-x", "c",
                 *args)
    super().__init__(f"cc_{self.cc}_{' '.join(self.args)}_{platform.machine()}_{_host_cpu()}")

  def compile(self, src: str) -> bytes:
    """Compile C source `src` to shared-object bytes; raise CompileError with the compiler output on failure."""
    if self.cc is None:
      raise CompileError("no C compiler found (tried $CC, clang, cc, gcc); install clang or use CPU:LLVM")
    with tempfile.TemporaryDirectory(prefix="tiny_cc_") as d:
      out = os.path.join(d, "kernel.so")
      proc = subprocess.run([self.cc, *self.args, "-", "-o", out, "-lm"], input=src.encode(), capture_output=True)
      if proc.returncode != 0:
        raise CompileError(f"{self.cc} failed (exit {proc.returncode}):\n{proc.stderr.decode(errors='replace')}\n"
                           f"--- source ---\n{src}")
      with open(out, "rb") as f: return f.read()

  def disassemble(self, lib: bytes) -> str:
    """objdump -d of the shared object (when objdump is installed)."""
    if shutil.which("objdump") is None: raise RuntimeError("objdump is not installed")
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
      f.write(lib)
      f.flush()
      return subprocess.run(["objdump", "-d", f.name], capture_output=True, text=True, check=True).stdout
