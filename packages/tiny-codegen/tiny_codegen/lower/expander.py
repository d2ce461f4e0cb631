"""Expander: UPCAST and UNROLL ranges become straight-line copies (one per lane).

Expects: a kernel AST whose UPCAST/UNROLL ranges have constant bounds.
Guarantees: no UPCAST/UNROLL range is left. A STORE that depends on an UPCAST range becomes a GROUP of one STORE
per lane; a REDUCE over an UNROLL (or UPCAST) range combines the lanes' values with the reduce op before reducing
over its remaining ranges. Lane copies are scalar; LLVM's SLP vectorizer (and the devectorizer, for renderers with
vector loads) turn neighbouring lanes back into vector instructions.
"""
from __future__ import annotations

import functools

from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import AxisType, Ops, UOp

EXPAND_AXES = (AxisType.UPCAST, AxisType.UNROLL)


def _lanes(r: UOp) -> int:
  if r.src[0].op is not Ops.CONST:
    raise ValueError(f"{r.arg[1]} range {r.arg[0]} needs a constant bound to expand, got {r.src[0].render()}")
  return int(r.src[0].arg)


def fast_substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`root` with the nodes of `mapping` replaced: one pass over its (cached) toposort, rebuilding only what changes.
  Much cheaper than a graph_rewrite when done once per lane."""
  out: dict[UOp, UOp] = {}
  for n in root.toposort():
    if (m := mapping.get(n)) is not None:
      out[n] = m
      continue
    new_src = tuple(out[s] for s in n.src)
    out[n] = n if all(a is b for a, b in zip(new_src, n.src)) else n.replace(src=new_src)
  return out[root]


def _expand_over(x: UOp, rngs: list[UOp]) -> list[UOp]:
  """`x` copied once per combination of lanes of `rngs` (first range outermost)."""
  outs = [x]
  for r in rngs:
    outs = [fast_substitute(o, {r: UOp.const(r.dtype, k)}) for o in outs for k in range(_lanes(r))]
  return outs


def _expand_store(st: UOp) -> UOp | None:
  rngs = [r for r in st.ranges if r.op is Ops.RANGE and r.arg[1] in EXPAND_AXES]
  if not rngs: return None
  return UOp(Ops.GROUP, src=tuple(_expand_over(st, rngs)))


def _combine(op: Ops, vals: list[UOp]) -> UOp:
  if op is Ops.ADD: return functools.reduce(lambda a, b: a + b, vals)
  if op is Ops.MUL: return functools.reduce(lambda a, b: a * b, vals)
  if op is Ops.MAX: return functools.reduce(lambda a, b: a.maximum(b), vals)
  raise ValueError(f"REDUCE with op {op} is not supported; valid: ADD, MUL, MAX")


def _expand_reduce(red: UOp) -> UOp | None:
  erngs = [r for r in red.src[1:] if r.arg[1] in EXPAND_AXES]
  if not erngs: return None
  val = _combine(red.arg, _expand_over(red.src[0], erngs))
  rest = tuple(r for r in red.src[1:] if r not in erngs)
  return UOp(Ops.REDUCE, red.dtype, (val, *rest), red.arg) if rest else val


pm_expander = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), _expand_reduce),
  (UPat(Ops.STORE, name="st"), _expand_store),
], name="expander")
