"""LLVM IR -> ELF relocatable object, in-process with llvmlite.

parse -> verify -> optimize (new pass manager, -O2) -> `emit_object`, for the host triple, CPU and features (so AVX2,
AVX-512 or NEON get used). The object exports one function per kernel under the kernel's name; calls to libm
(`exp2f`, `log2f`, `sinf`, ...) that LLVM's intrinsics lower to resolve from the loading process.

Objects are position independent (``reloc="pic"``) with the small code model: code reaches its constants through
32-bit PC-relative displacements, so a loader must keep an object's sections within 2 GB of each other (the CPU
device's `tiny_runtime_cpu.elfload` maps each kernel as one block); external functions and globals go through the
PLT/GOT relocations, which a loader can point anywhere. (The large code model would lift the constraint at the cost
of 64-bit absolute addressing in every kernel.)
"""
from __future__ import annotations

import functools
import threading
from typing import Any

from tiny_uop.device import CompileError, Compiler

llvm_lock = threading.Lock()  # one for every llvmlite user: its global context is not thread-safe


@functools.cache
def _llvm() -> Any:
  import llvmlite.binding as llvm
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  llvm.initialize_native_asmparser()
  return llvm


@functools.cache
def host_target() -> tuple[str, str, str]:
  """(triple, cpu name, cpu features) of this machine."""
  llvm = _llvm()
  return llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


@functools.cache
def _target_machine(triple: str, cpu: str, features: str, opt: int) -> Any:
  llvm = _llvm()
  return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic",
                                                               codemodel="default")


def datalayout(triple: str | None = None) -> str:
  """The data layout string for the host target machine."""
  t, cpu, feats = host_target()
  return str(_target_machine(triple or t, cpu, feats, 2).target_data)


def optimize_module(src: str, tm: Any, triple: str, target: str = "", opt: int = 2, vectorize: bool = False) -> Any:
  """LLVM IR `src` parsed and verified (CompileError "invalid {target}LLVM IR" with the source when it isn't), given
  `triple` and `tm`'s data layout, through the new pass manager at -O`opt` (`vectorize`: loop and SLP vectorizers).
  Shared by the CPU, AMDGPU and NVPTX compilers; call it holding `llvm_lock` (llvmlite's context isn't
  thread-safe)."""
  import llvmlite.binding as llvm
  try:
    mod = llvm.parse_assembly(src)
    mod.verify()
  except RuntimeError as e:
    raise CompileError(f"invalid {target}LLVM IR: {e}\n--- source ---\n{src}") from e
  mod.triple, mod.data_layout = triple, str(tm.target_data)
  if opt > 0:
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    if vectorize: pto.loop_vectorization = pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
  return mod


class LLVMCompiler(Compiler):
  """LLVM IR text -> object file bytes (see the module docstring)."""

  def __init__(self, opt: int = 2):
    self.triple, self.cpu, self.features = host_target()
    self.opt = opt
    super().__init__(f"llvm_{self.triple}_{self.cpu}_{self.features}_O{opt}")

  @property
  def target_machine(self) -> Any: return _target_machine(self.triple, self.cpu, self.features, self.opt)

  def optimized_ir(self, src: str) -> str:
    """The module after the optimization pipeline, as text (for inspection and tests)."""
    return str(self._optimize(src))

  def _optimize(self, src: str) -> Any:
    return optimize_module(src, self.target_machine, self.triple, "", self.opt, vectorize=True)

  def compile(self, src: str) -> bytes:
    """Compile LLVM IR `src` to an object file; raise CompileError naming the problem on invalid IR."""
    with llvm_lock:
      mod = self._optimize(src)
      return bytes(self.target_machine.emit_object(mod))

  def disassemble(self, lib: bytes) -> str:
    """Assembly of the kernel (re-emitted from its IR is not possible from bytes; uses llvm's object reader)."""
    llvm = _llvm()
    obj = llvm.ObjectFileRef.from_data(lib)
    return "\n".join(f"{s.name()}: {s.size()} bytes" for s in obj.sections())
