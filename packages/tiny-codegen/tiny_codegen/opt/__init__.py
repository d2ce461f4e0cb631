"""The kernel optimizer hook (a stub until the optimizer lands).

`optimize_kernel(ast, renderer)` is where opts (UPCAST, UNROLL, LOCAL, GROUP, ...) get applied to a kernel AST: it
splits ranges and marks their `AxisType`. The lowering pipeline calls it first and handles every axis type it can
produce. This stub returns the AST unchanged.
"""
from __future__ import annotations

from tiny_uop.device import Renderer
from tiny_uop.uop import UOp


def optimize_kernel(ast: UOp, renderer: Renderer) -> UOp:
  """The kernel AST with optimizations applied for `renderer` (stub: unchanged)."""
  return ast
