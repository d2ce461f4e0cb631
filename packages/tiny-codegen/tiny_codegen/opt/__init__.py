"""The kernel optimizer: opts (UPCAST, UNROLL, LOCAL, GROUP, GROUPTOP, NOLOCALS, PADTO, TC, THREAD, TILE) applied
to a kernel AST by splitting its ranges and marking their `AxisType`; chosen by hand-coded heuristics, by BEAM search
(`BEAM=n`, timed on the device, cached on disk), or given explicitly in `KernelInfo.opts_to_apply`.

`optimize_kernel(ast, renderer, search)` is the hook the lowering pipeline calls first; BEAM's `search` is given to it
(by `tiny_codegen.get_program`, through `lower`): the search compiles candidates, so the optimizer can't import it
without an import circle (issue #33).
"""
from __future__ import annotations

from typing import Callable

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


Search = Callable[[UOp, Renderer, int], tuple[Opt, ...]]
"""BEAM's search: (kernel AST, renderer, beam width) -> the opts to apply (`opt.search.beam_search` with a compiler)."""


def optimize_kernel(ast: UOp, renderer: Renderer, search: Search | None = None) -> UOp:
  """The kernel AST with optimizations for `renderer`: explicit `opts_to_apply`, else BEAM (if `BEAM>=1`: `search`
  chooses), else the hand-coded heuristics (unless `NOOPT=1`). Already-optimized ASTs (any applied opts) pass
  through. BEAM without a `search` is a ValueError (compile through `tiny_codegen.get_program`, which gives one)."""
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  if info.applied_opts: return ast
  if info.opts_to_apply is not None: return apply_opts(ast, renderer, info.opts_to_apply)
  if not any(u.op is Ops.RANGE for u in ast.toposort()) or NOOPT: return ast
  if BEAM >= 1:
    if search is None:
      raise ValueError(f"BEAM={BEAM.value} needs a search to time the candidates and none was given: compile "
                       "through tiny_codegen.get_program (it passes one), or pass search= (opt.search.beam_search "
                       "with a compiler)")
    return apply_opts(ast, renderer, search(ast, renderer, int(BEAM.value)))
  return hand_coded_optimizations(Kernel(ast, renderer)).get_optimized_ast()
