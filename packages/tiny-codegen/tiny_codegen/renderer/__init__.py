"""Renderers: linear UOps (docs/PIPELINE.md §4) to source text.

- `cstyle.ClangRenderer`: C for clang/gcc (device CPU, `DEV=CPU:CLANG`), compiled to a shared object.
- `llvmir.LLVMRenderer`: LLVM IR for the host, compiled in-process by llvmlite to an ELF object (the CPU default).

Both use the CPU calling convention `void name(T0* data0, ..., int var0, ..., int core_id)`.
"""
from __future__ import annotations

import os

from tiny_uop.device import Renderer
from tiny_uop.helpers import CPU_THREADS
from tiny_uop.uop import Ops, UOp

__all__ = ["CPURenderer", "kernel_params"]


class CPURenderer(Renderer):
  """Shared capabilities of the CPU renderers: no GPU dims, a thread index, threads from CPU_THREADS."""
  device = "CPU"
  has_local = False
  has_shared = False
  has_threads = True
  supports_float4 = False
  global_max = None
  local_max = None
  thread_min_work = 1 << 14  # iterations below which a kernel runs on one thread
  decompose_ops: tuple[Ops, ...] = ()  # EXP2/LOG2/SIN listed here use tiny's polynomials instead of libm
  transcendental_via_f64 = True  # float32 polynomials are evaluated in float64 and rounded once

  def __init__(self, arch: str = ""):
    super().__init__(arch)
    self.threads: int = int(CPU_THREADS.value) or os.cpu_count() or 1


def kernel_params(uops: list[UOp]) -> tuple[list[UOp], list[UOp]]:
  """The kernel's buffer PARAMs (by slot) and DEFINE_VARs (by name): its argument order before `core_id`."""
  params = sorted({u: None for u in uops if u.op is Ops.PARAM}, key=lambda u: u.arg)
  dvars = sorted({u: None for u in uops if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
  return params, dvars
