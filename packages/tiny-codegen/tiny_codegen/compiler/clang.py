"""C -> shared object, with clang (preferred), the system C compiler (cc, gcc) or ``zig cc`` from the ziglang package.

The compiler is found by `tiny_uop.tools.find_tool("cc")`: ``$CC``, else clang, cc or gcc on PATH, else ziglang's
bundled clang (``pip install ziglang``)."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile

from tiny_uop.device import CompileError, Compiler
from tiny_uop.tools import find_tool


def _host_cpu() -> str:
  """The host CPU name and features (-march=native code is only valid on the same CPU kind)."""
  try:
    from tiny_codegen.compiler.llvm import host_target
    return "_".join(host_target()[1:])
  except ImportError:  # without llvmlite: the machine string must do
    return platform.processor()


def find_cc() -> list[str] | None:
  """The command line of the C compiler to use: $CC, else clang, cc or gcc on PATH, else ``zig cc`` (ziglang)."""
  return find_tool("cc")


def _is_clang(cmd: list[str]) -> bool:
  """clang itself, or zig's clang driver (``zig cc``)."""
  return "clang" in os.path.basename(cmd[0]) or (os.path.basename(cmd[0]) == "zig" and cmd[1:2] in (["cc"], ["clang"]))


class ClangCompiler(Compiler):
  """`cc -shared -O2 -march=native -fPIC -ffp-contract=off -fwrapv`, returning the .so's bytes."""

  def __init__(self, cc: str | list[str] | None = None, args: tuple[str, ...] = ()):
    self.cmd: list[str] | None = ([cc] if isinstance(cc, str) else list(cc)) if cc else find_cc()
    self.cc = " ".join(self.cmd) if self.cmd else None
    self.is_clang = self.cmd is not None and _is_clang(self.cmd)
    march = "-mcpu=native" if platform.machine() in ("arm64", "aarch64") and not self.is_clang else "-march=native"
    self.args = ("-shared", "-O2", march, "-fPIC", "-ffp-contract=off", "-fwrapv", "-fno-math-errno", "-x", "c",
                 *args)
    super().__init__(f"cc_{self.cc}_{' '.join(self.args)}_{platform.machine()}_{_host_cpu()}")

  def compile(self, src: str) -> bytes:
    """Compile C source `src` to shared-object bytes; raise CompileError with the compiler output on failure."""
    if self.cmd is None:
      raise CompileError("no C compiler found (tried $CC, clang, cc, gcc, ziglang); install clang or gcc, or "
                         "pip install ziglang, or use CPU:LLVM")
    with tempfile.TemporaryDirectory(prefix="tiny_cc_") as d:
      out = os.path.join(d, "kernel.so")
      proc = subprocess.run([*self.cmd, *self.args, "-", "-o", out, "-lm"], input=src.encode(), capture_output=True)
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
