"""fold_onehot_reduces: a reduction over a one-hot mask becomes a load at the index (a gather).

Tensor indexing with integer tensors is written with tensor ops only: `x[idx]` is `sum_r where(idx == r, x[r], 0)`
over a RANGE r of x's indexed dim (and `any_r (idx == r) & x[r]` for bools). As a kernel that loop costs the size of
the indexed dim per output element. Since `idx == r` holds for exactly one r (or none when idx is out of range),

    REDUCE(ADD|MAX, WHERE(AND(idx == r, rest...), v, 0), r, ...)  ->  WHERE(AND(ok, rest[r:=i]), v[r:=i], 0)
    with ok = 0 <= idx < bound(r), i = WHERE(ok, idx, 0)

(bound(r) a constant, or symbolic -- a dynamic sequence -- whose least value is 1, so index 0 is always in range)

(the range is dropped; the REDUCE goes when it has no range left). Substituting the clamped `i` keeps every load in
bounds, `ok` zeroes what an out-of-range index reads. The cost becomes the number of outputs. The pass expects a
kernel AST (docs/PIPELINE.md §3) and keeps its contract; it runs before the optimizer.
"""
from __future__ import annotations

from tiny_uop.dtype import dtypes
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite
from tiny_uop.uop import Ops, UOp

__all__ = ["fold_onehot_reduces"]


def _and_terms(c: UOp) -> list[UOp]:
  """The terms of a tree of ANDs (bool), left to right, without recursion."""
  out, stack = [], [c]
  while stack:
    n = stack.pop()
    if n.op is Ops.AND and n.dtype == dtypes.bool: stack.extend(reversed(n.src))
    else: out.append(n)
  return out


def _and_all(terms: list[UOp]) -> UOp:
  ret = terms[0]
  for t in terms[1:]: ret = UOp(Ops.AND, dtypes.bool, (ret, t))
  return ret


def _as_range(x: UOp, ranges: tuple[UOp, ...]) -> UOp | None:
  """x itself if it is one of `ranges` (through a CAST, or after simplifying its index math), else None."""
  for cand in (x, x.src[0] if x.op is Ops.CAST else None):
    if cand is None: continue
    # one walk of cand's graph for all the ranges (a node's toposort is not cached)
    if cand.op is not Ops.RANGE and not cand.toposort().keys().isdisjoint(ranges): cand = _simplified(cand)
    if cand in ranges: return cand
  return None


def _simplified(x: UOp) -> UOp:
  """`x` with its index math simplified but its RANGEs the kernel's own nodes (simplifying a range's bound, `1*seq`
  to `seq`, would make it another node: another loop)."""
  from tiny_codegen.lower.simplify import simplify_graph
  rngs = [u for u in x.toposort() if u.op is Ops.RANGE]
  back = {sr: r for r in rngs if (sr := simplify_graph(r, "onehot")) is not r}
  s = simplify_graph(x, "onehot")
  return s.substitute(back, name="onehot_ranges") if back else s


def _find_onehot(terms: list[UOp], ranges: tuple[UOp, ...]) -> tuple[int, UOp, UOp] | None:
  """(term position, range, index expression) of the first `index == range` term whose index doesn't use the range."""
  for k, t in enumerate(terms):
    if t.op is not Ops.CMPEQ: continue
    for a, b in (t.src, t.src[::-1]):
      if (r := _as_range(a, ranges)) is None: continue
      # the index may use the range only in index math that simplifies away (`(i*seq + j) // seq` is i)
      if r in b.toposort() and r in (b := _simplified(b)).toposort(): continue
      bound = r.src[0]  # a constant, or a symbolic bound (a dynamic sequence) that is never below 1
      if bound.op is Ops.CONST and isinstance(bound.arg, int) and bound.arg > 0: return k, r, b
      if bound.op is not Ops.CONST and dtypes.is_int(bound.dtype) and bound.vmin >= 1: return k, r, b
  return None


def _fold(red: UOp) -> UOp | None:
  if red.arg not in (Ops.ADD, Ops.MAX): return None
  value, ranges = red.src[0], red.src[1:]
  cast = value.dtype if value.op is Ops.CAST else None
  v = value.src[0] if cast is not None else value
  if v.op is Ops.WHERE and v.src[2].op is Ops.CONST and v.src[2].arg == 0 and red.arg is Ops.ADD:
    terms, payload = _and_terms(v.src[0]), v.src[1]
    while payload.op is Ops.WHERE and payload.src[2] is v.src[2]:  # where(a, where(b, x, 0), 0) = where(a & b, x, 0)
      terms, payload = terms + _and_terms(payload.src[0]), payload.src[1]
  elif v.dtype == dtypes.bool and v.op is Ops.AND and red.arg is Ops.MAX: terms, payload = _and_terms(v), None
  else: return None
  if (found := _find_onehot(terms, ranges)) is None: return None
  k, r, idx = found
  bound = r.src[0] if r.src[0].op is not Ops.CONST else idx.const_like(r.src[0].arg)
  if bound.dtype != idx.dtype: bound = bound.cast(idx.dtype)
  ok = UOp(Ops.AND, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (idx, bound)),
                                  UOp(Ops.CMPLT, dtypes.bool, (idx.const_like(-1), idx))))
  i = UOp(Ops.WHERE, idx.dtype, (ok, idx, idx.const_like(0)))
  if i.dtype != r.dtype: i = i.cast(r.dtype)
  sub = {r: i}
  rest = [t.substitute(sub) for j, t in enumerate(terms) if j != k]
  cond = _and_all([ok, *rest])
  if payload is None: new = cond
  else: new = UOp(Ops.WHERE, v.dtype, (cond, payload.substitute(sub), v.src[2]))
  if cast is not None: new = new.cast(cast)
  left = tuple(x for x in ranges if x is not r)
  return UOp(Ops.REDUCE, red.dtype, (new, *left), red.arg) if left else new


pm_onehot = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _fold)], name="fold_onehot")


def fold_onehot_reduces(sink: UOp) -> UOp:
  """The kernel AST with every one-hot reduction turned into a load at the index (see the module docstring)."""
  if not any(u.op is Ops.REDUCE for u in sink.toposort()): return sink
  return graph_rewrite(sink, pm_onehot, name="fold_onehot")
