"""merge_reduce_ranges: two nested ranges of one REDUCE become one range when every index walks them as one.

A reduce over the trailing axes of a tensor, such as a norm's statistics over (N, H, W) of an NCHW tensor, arrives
with one RANGE per reduced dim: `h` (bound H) outside `w` (bound W), each load at `... + h*W + w`. Substituting
`h -> m // W`, `w -> m % W` for one range `m` over H*W, the simplifier folds `(m//W)*W + m%W -> m` wherever the pair
is used as one contiguous run; if no division or modulo of `m` is left anywhere in the kernel, the merged kernel
computes the same thing over the same elements in the same order, and its innermost reduce loop is H*W long instead
of W: the heuristics can unroll it by 16 (a 20-wide row only allowed 4) and loads walk it contiguously. A pair that
some index uses otherwise (a conv's window `oy + ky`, a padded or permuted view) stays as it is. Output ranges are
left alone (their number and names are what the heuristics and the kernel names follow). The pass expects a kernel
AST (docs/PIPELINE.md §3) before the optimizer and keeps its contract.
"""
from __future__ import annotations

from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen.lower.simplify import simplify_graph

__all__ = ["merge_reduce_ranges"]


def _const_bound(r: UOp) -> int | None:
  return int(r.src[0].arg) if r.src[0].op is Ops.CONST and isinstance(r.src[0].arg, int) else None


def _try_merge(ast: UOp, outer: UOp, inner: UOp) -> UOp | None:
  """`ast` with the nested ranges `outer` and `inner` (constant bounds) as one range in every REDUCE over both, or
  None when some index would keep a div/mod of it (or a REDUCE has only one of them)."""
  a, b = _const_bound(outer), _const_bound(inner)
  if a is None or b is None or a < 2 or b < 2: return None  # (an empty or 1-long range: nothing to gain)
  m = UOp.range(a * b, outer.arg[0], AxisType.REDUCE, outer.dtype)
  hi, lo = m // UOp.const(outer.dtype, b), m % UOp.const(outer.dtype, b)

  def fix(red: UOp) -> UOp | None:  # REDUCE(v, ..., m//b, m%b) -> REDUCE(v, ..., m)
    if hi not in red.src[1:] or lo not in red.src[1:]: return None
    return red.replace(src=(red.src[0], *(m if r is hi else r for r in red.src[1:] if r is not lo)))
  new = ast.substitute({outer: hi, inner: lo}, name="merge_reduce_ranges")
  new = graph_rewrite(new, PatternMatcher([(UPat(Ops.REDUCE, name="red"), fix)]), name="merge_reduce_ranges")
  new = simplify_graph(new, name="merge_reduce_ranges")
  if any(u.op in (Ops.CDIV, Ops.CMOD) and m in u.ranges for u in new.toposort()): return None
  return new


def merge_reduce_ranges(ast: UOp) -> UOp:
  """Merge each pair of adjacent (in loop order) constant-bound REDUCE ranges of one REDUCE that every index of the
  kernel walks as one contiguous run (see the module docstring); the kernel is returned unchanged when none does."""
  while True:
    merged = False
    for red in (u for u in ast.toposort() if u.op is Ops.REDUCE):
      rngs = sorted((r for r in red.src[1:] if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE),
                    key=lambda r: r.arg[0])
      for outer, inner in zip(rngs, rngs[1:]):
        if (new := _try_merge(ast, outer, inner)) is not None:
          ast, merged = new, True
          break
      if merged: break
    if not merged: return ast
