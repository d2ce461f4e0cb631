"""gates_to_bounds: a sum's padding is skipped by its loop bounds instead of being multiplied by zero.

A conv's input gradient is a conv of the padded output gradient: its REDUCE reads `pad(g)` at `y + ky - p`, a load
gated by `p - 1 < y + ky` and `y + ky < p + H`, and the product with the weight is 0 wherever that gate is false.
Near the border most filter taps read the padding (a 5x5 filter over a 20-row map padded by 4: 17% of the taps in
rows). When a REDUCE(ADD)'s value is zero wherever a clause `c < r + f` or `r + f < c` is false (the clause gates a
factor of a product: a gated load, or `where(clause, x, 0)`), with `r` one of its REDUCE loops (a plain loop: not
unrolled or upcast) and `c`, `f` independent of `r` and of every UPCAST/UNROLL lane, the loop is narrowed to where
the clauses hold: `r = lo + r'` with `r'` over `[0, hi - lo)` (`lo = max(0, c - f + 1, ...)`, `hi = min(N, c - f,
...)`; an empty range when `hi <= lo`), and those clauses become true. The skipped terms were exact zeros times the
other factors (an infinite or NaN weight times a padded zero is not summed: as in a convolution that never reads
its padding). Runs after the optimizer (which sees constant bounds) and before the expander.
"""
from __future__ import annotations

from tiny_uop.dtype import dtypes
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen.lower.expander import _affine_stride
from tiny_codegen.lower.gather import _and_terms
from tiny_codegen.lower.simplify import simplify_graph

__all__ = ["gates_to_bounds"]

_LANES = (AxisType.UPCAST, AxisType.UNROLL)


def _zero_unless(v: UOp) -> set[UOp]:
  """Clauses such that `v` is 0 wherever one of them is false: a gated load's gate terms, `where(c, x, 0)`'s terms,
  and those of any factor of a product (through casts)."""
  out: set[UOp] = set()
  stack = [v]
  while stack:
    n = stack.pop()
    if n.op is Ops.MUL: stack.extend(n.src)
    elif n.op is Ops.CAST and dtypes.is_float(n.dtype): stack.append(n.src[0])
    elif n.op is Ops.WHERE and n.src[2].op is Ops.CONST and n.src[2].arg == 0:
      out.update(_and_terms(n.src[0]))
      stack.append(n.src[1])
    elif n.op is Ops.LOAD and n.src[0].op is Ops.INDEX and len(n.src[0].src) > 2:
      out.update(_and_terms(n.src[0].src[2]))
  return out


def _bound_of(clause: UOp, r: UOp, red: UOp) -> tuple[str, UOp] | None:
  """('lo', x) for a clause `c < r + f` (r >= c - f + 1), ('hi', x) for `r + f < c` (r < c - f); None otherwise,
  and when `c` or `f` depends on a lane or on a loop of `red` itself (the bound must be known before the loop)."""
  if clause.op is not Ops.CMPLT: return None
  a, b = clause.src
  side, e, c = ("lo", b, a) if r in b.ranges and r not in a.ranges else ("hi", a, b) if r in a.ranges and \
    r not in b.ranges else (None, None, None)
  if side is None or e is None or c is None or _affine_stride(e, r) != 1: return None
  f = e.substitute({r: UOp.const(r.dtype, 0)})
  if any(x.arg[1] in _LANES or x in red.src[1:] for x in (*f.ranges, *c.ranges) if x.op is Ops.RANGE):
    return None
  return (side, c - f + 1) if side == "lo" else (side, c - f)


def _narrow(red: UOp) -> UOp | None:
  if red.arg is not Ops.ADD or red.dtype.count != 1: return None
  clauses = _zero_unless(red.src[0])
  for r in red.src[1:]:
    if r.op is not Ops.RANGE or r.arg[1] is not AxisType.REDUCE or r.src[0].op is not Ops.CONST: continue
    used = [(cl, b) for cl in clauses if r in cl.ranges and (b := _bound_of(cl, r, red)) is not None]
    if not used: continue
    lo: UOp = UOp.const(r.dtype, 0)
    hi: UOp = r.src[0]
    for _, (side, x) in used:
      if side == "lo": lo = lo.maximum(x)
      else: hi = (x < hi).where(x, hi)
    nr = UOp.range(simplify_graph(hi - lo), r.arg[0], AxisType.REDUCE, r.dtype)
    true = UOp.const(dtypes.bool, True)
    # RANGEs are interned: a length that simplifies back to r's own (0 <= lo, hi <= N and hi - lo == N, so lo == 0)
    # gives r itself, and `r -> lo + r` would contain its own key. The clauses then hold on all of r: only drop them.
    subs = {cl: true for cl, _ in used} if nr is r else {**{cl: true for cl, _ in used}, r: lo + nr}
    val = red.src[0].substitute(subs, name="gates_to_bounds")
    return red.replace(src=(val, *(nr if x is r else x for x in red.src[1:])))
  return None


pm_gates_to_bounds = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _narrow)], name="gates_to_bounds")


def gates_to_bounds(sink: UOp) -> UOp:
  """Narrow each REDUCE(ADD) loop whose terms are gated to zero outside a range (see the module docstring)."""
  return graph_rewrite(sink, pm_gates_to_bounds, name="gates_to_bounds")
