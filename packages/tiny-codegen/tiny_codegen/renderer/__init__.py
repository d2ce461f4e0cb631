"""Renderers: linear UOps (docs/PIPELINE.md §4) to source text.

- `cstyle.ClangRenderer`: C for clang/gcc (device CPU, `DEV=CPU:CLANG`), compiled to a shared object.
- `llvmir.LLVMRenderer`: LLVM IR for the host, compiled in-process by llvmlite to an ELF object (the CPU default).

Both use the CPU calling convention `void name(T0* data0, ..., int var0, ..., int core_id)`.
"""
from __future__ import annotations

import os
from typing import Callable

from tiny_uop.device import Renderer
from tiny_uop.helpers import CPU_THREADS
from tiny_uop.uop import Ops, UOp

__all__ = ["CPURenderer", "count_uses", "kernel_params"]


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


def count_uses(uops: list[UOp], twice: Callable[[UOp], bool]) -> dict[UOp, int]:
  """How often each value is used in code (GROUP/END/SINK and the ordering-only sources of LOAD/STORE don't count);
  a user for which `twice(user)` holds counts double (it spells an operand twice, so it needs a variable)."""
  uses: dict[UOp, int] = {}
  for u in uops:
    if u.op in (Ops.GROUP, Ops.END, Ops.SINK): continue
    for x in (u.src[:1] if u.op is Ops.LOAD else u.src[:2] if u.op is Ops.STORE else u.src):
      uses[x] = uses.get(x, 0) + (2 if twice(u) else 1)
  return uses


def kernel_params(uops: list[UOp]) -> tuple[list[UOp], list[UOp]]:
  """The kernel's buffer PARAMs (by slot) and DEFINE_VARs (by name): its argument order before `core_id`."""
  params = sorted({u: None for u in uops if u.op is Ops.PARAM}, key=lambda u: u.arg)
  dvars = sorted({u: None for u in uops if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
  return params, dvars
