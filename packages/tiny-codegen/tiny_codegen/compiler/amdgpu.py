"""AMDGPU LLVM IR -> HSA code object (an ELF shared object the ROCm/KFD loader accepts), in-process with llvmlite.

`AMDGPUCompiler(arch)`: parse and verify the IR, optimize (-O2 new pass manager), emit a relocatable object for
`amdgcn-amd-amdhsa` / `arch` with llvmlite's AMDGPU backend (which writes the kernel descriptor `name.kd` in
`.rodata` and the AMDGPU msgpack metadata note), then link it into a shared object (`ET_DYN`) with `ld.lld -shared`
when ld.lld is installed (`$LD_LLD` overrides the path; `apt-get install lld`). Without ld.lld the relocatable
object is returned (it has the same sections and descriptor but a loader can't map it directly); `linked`
tells which. `disassemble` uses llvm-objdump when installed.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Any

from tiny_uop.device import CompileError, Compiler

TRIPLE = "amdgcn-amd-amdhsa"
_lock = threading.Lock()


@functools.cache
def _llvm() -> Any:
  import llvmlite.binding as llvm
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  return llvm


@functools.cache
def _target_machine(arch: str, opt: int) -> Any:
  llvm = _llvm()
  try: target = llvm.Target.from_triple(TRIPLE)
  except RuntimeError as e: raise CompileError(f"this llvmlite has no AMDGPU target: {e}") from e
  return target.create_target_machine(cpu=arch, features="", opt=opt, reloc="pic", codemodel="default")


def amdgpu_datalayout(arch: str = "gfx1100") -> str:
  """LLVM's data layout for amdgcn-amd-amdhsa (allocas in addrspace 5, LDS pointers 32 bits)."""
  return str(_target_machine(arch, 2).target_data)


def find_ld_lld() -> str | None:
  """$LD_LLD, else ld.lld on PATH (also versioned names such as ld.lld-15), else None."""
  for c in (os.environ.get("LD_LLD"), "ld.lld", *(f"ld.lld-{v}" for v in range(20, 13, -1))):
    if c and (p := shutil.which(c)): return p
  return None


class AMDGPUCompiler(Compiler):
  """LLVM IR text -> HSA code object bytes for `arch` (see the module docstring)."""

  def __init__(self, arch: str = "gfx1100", opt: int = 2, link: bool = True):
    self.arch, self.opt = arch, opt
    self.ld_lld = find_ld_lld() if link else None
    super().__init__(f"amdgpu_{arch}_O{opt}_{self.ld_lld}")

  @property
  def linked(self) -> bool:
    """Whether `compile` returns a linked shared object (ld.lld found), not a relocatable object."""
    return self.ld_lld is not None

  def compile_object(self, src: str) -> bytes:
    """The relocatable ELF object (`ET_REL`) for `src`, before linking."""
    return self._emit(src, asm=False)  # type: ignore[return-value]

  def assembly(self, src: str) -> str:
    """The GCN/RDNA assembly (with the `.amdhsa_kernel` directives and YAML metadata) LLVM makes from `src`."""
    return self._emit(src, asm=True)  # type: ignore[return-value]

  def _emit(self, src: str, asm: bool) -> bytes | str:
    llvm = _llvm()
    with _lock:  # llvmlite's global context is not thread-safe
      try:
        mod = llvm.parse_assembly(src)
        mod.verify()
      except RuntimeError as e:
        raise CompileError(f"invalid AMDGPU LLVM IR: {e}\n--- source ---\n{src}") from e
      tm = _target_machine(self.arch, self.opt)
      mod.triple = TRIPLE
      mod.data_layout = str(tm.target_data)
      if self.opt > 0:
        pto = llvm.create_pipeline_tuning_options(speed_level=self.opt)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
      try: return str(tm.emit_assembly(mod)) if asm else bytes(tm.emit_object(mod))
      except RuntimeError as e: raise CompileError(f"AMDGPU backend failed for {self.arch}: {e}\n--- source ---\n{src}") from e

  def link(self, obj: bytes) -> bytes:
    """`ld.lld -shared` of a relocatable object: the code object the HSA loader maps."""
    if self.ld_lld is None: raise CompileError("ld.lld is not installed (apt-get install lld); can't link the code object")
    with tempfile.TemporaryDirectory(prefix="tiny_amdgpu_") as d:
      o, so = os.path.join(d, "kernel.o"), os.path.join(d, "kernel.hsaco")
      with open(o, "wb") as f: f.write(obj)
      proc = subprocess.run([self.ld_lld, "-shared", "--no-undefined", o, "-o", so], capture_output=True)
      if proc.returncode != 0:
        raise CompileError(f"ld.lld failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace')}")
      with open(so, "rb") as f: return f.read()

  def compile(self, src: str) -> bytes:
    """IR -> object -> linked code object (or the object itself without ld.lld)."""
    obj = self.compile_object(src)
    return self.link(obj) if self.ld_lld is not None else obj

  def disassemble(self, lib: bytes) -> str:
    """llvm-objdump -d of the code object (when llvm-objdump is installed)."""
    if (tool := shutil.which("llvm-objdump")) is None: raise RuntimeError("llvm-objdump is not installed")
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
      f.write(lib)
      f.flush()
      return subprocess.run([tool, "-d", f"--mcpu={self.arch}", f.name], capture_output=True, text=True, check=True).stdout
