"""Index-math simplification for lowering.

`tiny_uop.symbolic` (the shared simplifier, part of tiny-uop, which tiny-codegen depends on) plus a small
constant-folding matcher of our own (it folds the lanes the expander substitutes). An error in either is a bug and
surfaces as one: nothing here falls back to a weaker simplifier.
"""
from __future__ import annotations

import functools

from tiny_uop.dtype import dtypes, truncate_int
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite
from tiny_uop.uop import GroupOp, Ops, UOp, _cdiv, _cmod


def _fold_int(op: Ops, a: int, b: int) -> int | None:
  if op is Ops.ADD: return a + b
  if op is Ops.SUB: return a - b
  if op is Ops.MUL: return a * b
  if op is Ops.CDIV: return _cdiv(a, b) if b != 0 else None
  if op is Ops.CMOD: return _cmod(a, b) if b != 0 else None
  if op is Ops.MAX: return max(a, b)
  if op is Ops.AND: return a & b
  if op is Ops.OR: return a | b
  if op is Ops.XOR: return a ^ b
  return None


def fold_const_alu(x: UOp) -> UOp | None:
  """op(c0, c1) -> c for int/bool ALU on constants (floats are left to the target, which rounds exactly)."""
  if not all(s.op is Ops.CONST for s in x.src) or x.dtype.count != 1: return None
  vals = [s.arg for s in x.src]
  if any(isinstance(v, UOp) for v in vals): return None
  if x.op in GroupOp.Comparison and all(dtypes.is_int(s.dtype) or s.dtype == dtypes.bool for s in x.src):
    a, b = vals
    return UOp.const(dtypes.bool, a < b if x.op is Ops.CMPLT else (a != b if x.op is Ops.CMPNE else a == b))
  if x.op is Ops.WHERE: return x.src[1] if vals[0] else x.src[2]
  if not (dtypes.is_int(x.dtype) or x.dtype == dtypes.bool) or len(vals) != 2: return None
  if (ret := _fold_int(x.op, int(vals[0]), int(vals[1]))) is None: return None
  return UOp.const(x.dtype, bool(ret) if x.dtype == dtypes.bool else truncate_int(ret, x.dtype))


def _is_intlike(x: UOp) -> bool: return dtypes.is_int(x.dtype) or x.dtype == dtypes.bool


def _range_fold(x: UOp) -> UOp | None:
  """An int expression whose value range is one number is that number."""
  if x.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.RANGE, Ops.SPECIAL) or not _is_intlike(x) or x.dtype.count != 1:
    return None
  if x.op not in GroupOp.ALU: return None
  lo, hi = x.vmin, x.vmax
  if lo == hi and isinstance(lo, (int, bool)) and not isinstance(lo, float): return UOp.const(x.dtype, lo)
  return None


def _cmp_same(x: UOp, y: UOp) -> UOp | None:
  return UOp.const(dtypes.bool, False) if _is_intlike(y) else None


def _below(y: UOp, d: UOp) -> bool:
  """0 <= y < d for every value: y a RANGE whose bound is d itself (a symbolic bound, which value bounds can't
  compare), or y's largest value below d's least."""
  if y.vmin < 0: return False
  return (y.op is Ops.RANGE and y.src[0] is d) or y.vmax < d.vmin


def _split_by_symbolic(n: UOp, d: UOp) -> tuple[UOp, UOp] | None:
  """(x, y) with n = x*d + y, all of x, y >= 0, for a divisor d that is not a constant (a Variable: a dynamic
  sequence's `(i*seq + j) // seq`, which the symbolic rules, comparing value bounds, leave alone)."""
  if n.op is not Ops.ADD or d.op is Ops.CONST or d.vmin <= 0: return None
  for m, y in (n.src, n.src[::-1]):
    if m.op is Ops.MUL and d in m.src and y.vmin >= 0:
      x = m.src[1] if m.src[0] is d else m.src[0]
      if x.vmin >= 0: return x, y
  return None


def _div_symbolic(n: UOp, d: UOp) -> UOp | None:
  """(x*d + y) // d -> x + y//d ; y // d -> 0 for 0 <= y < d (d a positive non-constant divisor)."""
  if not dtypes.is_int(n.dtype) or d.op is Ops.CONST: return None
  if _below(n, d): return n.const_like(0)
  if (xy := _split_by_symbolic(n, d)) is None: return None
  return xy[0] if _below(xy[1], d) else xy[0] + xy[1] // d


def _mod_symbolic(n: UOp, d: UOp) -> UOp | None:
  """(x*d + y) % d -> y % d ; y % d -> y for 0 <= y < d (d a positive non-constant divisor)."""
  if not dtypes.is_int(n.dtype) or d.op is Ops.CONST: return None
  if _below(n, d): return n
  if (xy := _split_by_symbolic(n, d)) is None: return None
  return xy[1] if _below(xy[1], d) else xy[1] % d


codegen_fold = PatternMatcher([
  # (x*d + y) // d -> x + y//d ; (x*d + y) % d -> y % d ; y // d -> 0, y % d -> y for 0 <= y < d (d symbolic)
  (UPat(Ops.CDIV, src=(UPat.var("n"), UPat.var("d"))), _div_symbolic),
  (UPat(Ops.CMOD, src=(UPat.var("n"), UPat.var("d"))), _mod_symbolic),
  (UPat(GroupOp.ALU, name="x"), fold_const_alu),
  (UPat(GroupOp.ALU, name="x"), _range_fold),
  # x+0 -> x ; x*1 -> x ; x//1 -> x (ints)
  (UPat.var("x") + UPat.cvar("c", vec=False), lambda x, c: x if c.arg == 0 and _is_intlike(x) else None),
  (UPat.var("x") * UPat.cvar("c", vec=False), lambda x, c: x if c.arg == 1 and _is_intlike(x) else
   (x.const_like(0) if c.arg == 0 and dtypes.is_int(x.dtype) else None)),
  (UPat(Ops.CDIV, src=(UPat.var("x"), UPat.cvar("c", vec=False))), lambda x, c: x if c.arg == 1 else None),
  # x < x -> False (ints)
  (UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.var("y")), name="cmp"),
   lambda x, y, cmp: _cmp_same(x, y) if x is y else None),
  # bool & True -> x ; bool & False -> False
  (UPat(Ops.AND, dtypes.bool, src=[UPat.var("x"), UPat.cvar("c", vec=False)]), lambda x, c: x if c.arg else c),
  # where(c, x, x) -> x
  (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("x"), UPat.var("y"))), lambda x, y: x if x is y else None),
], name="codegen_fold")


@functools.cache
def simplifier() -> PatternMatcher:
  """tiny-uop's symbolic rules plus our constant folding, combined once (combining is costly); the lowering's
  expander stage runs it in the same rewrite as its own rules."""
  from tiny_uop.symbolic import symbolic
  return symbolic + codegen_fold


def simplify_graph(sink: UOp, name: str = "simplify") -> UOp:
  """The graph with index math simplified (tiny-uop's symbolic rules plus constant folding)."""
  return graph_rewrite(sink, simplifier(), name=name)

