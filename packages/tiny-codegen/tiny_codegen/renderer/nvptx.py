"""NVPTX renderer (`NVPTXRenderer`): a second way to NVIDIA PTX — linear UOps -> LLVM IR for `nvptx64-nvidia-cuda`,
turned into PTX by llvmlite's NVPTX backend, then assembled by ptxas like `PTXRenderer`'s output.

The IR is the AMDGPU renderer's (`amdgpu.py`: same loops, casts, ALU and memory code) with NVPTX's target hooks:
globals in `addrspace(1)`, shared memory in `addrspace(3)`, accumulators as plain `alloca`s, gidx/lidx from
`llvm.nvvm.read.ptx.sreg.ctaid.*` / `tid.*`, BARRIER `llvm.nvvm.barrier0`, and the kernel marked through
`!nvvm.annotations`. EXP2/LOG2/SIN all use tiny's polynomials (LLVM's NVPTX backend would call libdevice for them),
so results are accurate rather than SFU-approximate. No tensor cores here (use PTXRenderer).
Useful to cross-check PTXRenderer: both must produce kernels ptxas accepts, with the same signatures.
"""
from __future__ import annotations

import functools
from typing import Any

from tiny_uop.device import CompileError, Compiler
from tiny_uop.dtype import AddrSpace, DType, dtypes
from tiny_uop.uop import Ops, UOp

from tiny_codegen.compiler.llvm import llvm_lock, optimize_module
from tiny_codegen.compiler.ptx import PTXCompiler
from tiny_codegen.renderer.amdgpu import _AMDGPUEmitter
from tiny_codegen.renderer.ptx import NVRenderer, _sm

TRIPLE = "nvptx64-nvidia-cuda"


@functools.cache
def _target_machine(arch: str) -> Any:
  import llvmlite.binding as llvm
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  try: target = llvm.Target.from_triple(TRIPLE)
  except RuntimeError as e: raise CompileError(f"this llvmlite has no NVPTX target: {e}") from e
  return target.create_target_machine(cpu=arch, features="", opt=2)


class NVPTXCompiler(Compiler):
  """NVPTX LLVM IR -> PTX (llvmlite) -> cubin (ptxas, when installed; else the PTX text)."""

  def __init__(self, arch: str = "sm_90"):
    self.arch = arch
    self.ptxas = PTXCompiler(arch)
    super().__init__(f"nvptx_{arch}_{self.ptxas.ptxas}")

  def to_ptx(self, src: str) -> str:
    """The PTX LLVM's NVPTX backend writes for IR `src` (optimized at -O2)."""
    tm = _target_machine(self.arch)
    with llvm_lock: return str(tm.emit_assembly(optimize_module(src, tm, TRIPLE, "NVPTX ")))

  def compile(self, src: str) -> bytes:
    """IR -> PTX -> cubin (or PTX bytes without ptxas)."""
    return self.ptxas.compile(self.to_ptx(src))


class _NVPTXEmitter(_AMDGPUEmitter):
  spaces = {AddrSpace.GLOBAL: 1, AddrSpace.LOCAL: 3, AddrSpace.REG: 0}
  target = "NVPTX"

  def special(self, axis: str) -> str:
    return f"llvm.nvvm.read.ptx.sreg.{'ctaid' if axis[0] == 'g' else 'tid'}.{'xyz'[int(axis[4:])]}"

  def barrier(self) -> None:
    self.decls.add("declare void @llvm.nvvm.barrier0()")
    self.emit("call void @llvm.nvvm.barrier0()")

  def wmma(self, u: UOp) -> str: raise NotImplementedError("NVPTX renderer has no tensor cores; use PTXRenderer")

  def module(self, name: str, args: list[str]) -> str:
    dl = str(_target_machine(self.arch).target_data)
    head = [f'target datalayout = "{dl}"', f'target triple = "{TRIPLE}"', ""]
    return "\n".join(head + self.globals + sorted(self.decls)) + (
      f"\ndefine void @{name}({', '.join(args)}) {{\nentry:\n" +
      "".join(a + "\n" for a in self.allocas) + "\n".join(self.lines) +
      f'\n  ret void\n}}\n!nvvm.annotations = !{{!0}}\n!0 = !{{ptr @{name}, !"kernel", i32 1}}\n')


class NVPTXRenderer(NVRenderer):
  """LLVM IR for NVIDIA GPUs through llvmlite's NVPTX backend (arch `sm_XX`, default sm_90); see the module doc."""
  decompose_ops = (Ops.EXP2, Ops.LOG2, Ops.SIN)
  compiler_cls = NVPTXCompiler

  def __init__(self, arch: str = ""):
    _sm(arch or "sm_90")
    super().__init__(arch or "sm_90")

  def make_compiler(self) -> NVPTXCompiler: return NVPTXCompiler(self.arch or "sm_90")

  def supported_dtypes(self) -> tuple[DType, ...]:
    return tuple(d for d in dtypes.all if d not in (dtypes.bfloat16, *dtypes.fp8s))

  def render(self, uops: list[UOp]) -> str:
    """NVPTX LLVM IR (a module with triple and data layout) of the kernel `uops`."""
    return _NVPTXEmitter(uops, self.arch or "sm_90").render()
