"""The kernel optimizer: opts (UPCAST, UNROLL, LOCAL, GROUP, GROUPTOP, NOLOCALS, PADTO, TC, THREAD, TILE) applied
to a kernel AST by splitting its ranges and marking their `AxisType`; chosen by hand-coded heuristics, by BEAM search
(`BEAM=n`, timed on the device, cached on disk), or given explicitly in `KernelInfo.opts_to_apply`.

`optimize_kernel(ast, renderer)` is the hook the lowering pipeline calls first.
"""
from __future__ import annotations

from tiny_uop.device import Renderer
from tiny_uop.helpers import BEAM, NOOPT
from tiny_uop.uop import KernelInfo, Ops, UOp

from tiny_codegen.opt.heuristic import hand_coded_optimizations
from tiny_codegen.opt.kernel import Kernel, KernelOptError, Opt, OptOps

__all__ = ["optimize_kernel", "apply_opts", "Kernel", "KernelOptError", "Opt", "OptOps", "hand_coded_optimizations"]


def apply_opts(ast: UOp, renderer: Renderer, opts: tuple[Opt, ...] | list[Opt]) -> UOp:
  """`ast` with exactly `opts` applied in order (KernelOptError names the first that can't apply)."""
  k = Kernel(ast, renderer)
  for o in opts: k.apply_opt(o)
  return k.get_optimized_ast()


def optimize_kernel(ast: UOp, renderer: Renderer) -> UOp:
  """The kernel AST with optimizations for `renderer`: explicit `opts_to_apply`, else BEAM (if `BEAM>=1`), else the
  hand-coded heuristics (unless `NOOPT=1`). Already-optimized ASTs (any applied opts) pass through."""
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  if info.applied_opts: return ast
  if info.opts_to_apply is not None: return apply_opts(ast, renderer, info.opts_to_apply)
  if not any(u.op is Ops.RANGE for u in ast.toposort()) or NOOPT: return ast
  if BEAM >= 1:
    from tiny_codegen.opt.search import beam_search
    return apply_opts(ast, renderer, beam_search(ast, renderer, int(BEAM.value)))
  return hand_coded_optimizations(Kernel(ast, renderer)).get_optimized_ast()
