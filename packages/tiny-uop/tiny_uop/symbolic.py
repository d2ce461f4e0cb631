"""Symbolic algebra: the simplifier every index expression goes through.

Rule sets (PatternMatchers, compose with `+`):
  `symbolic_simple`  constant folding (`exec_alu`, bit-exact) and local identities (`x*1 -> x`, `x//x -> 1`, ...).
  `symbolic`         + value-range folding (a node whose vmin == vmax is a constant), the linear normal form of
                     integer sums (like terms combined, terms sorted, constants last), `//` and `%` folding with known
                     ranges, comparison normalization, nested div/mod.
  `symbolic_flat`    `symbolic`: its normal form already distributes constant factors over sums.
Entry points: `simplify(u)` (what `UOp.simplify()` calls), `simplify_valid(valid)` and `uop_given_valid(valid, u)`
for the validity masks of padded loads.

Semantics: integer ops wrap (two's complement) and `//`, `%` (CDIV, CMOD) truncate toward zero like C, so every fold
here is checked against the ranges: a rewrite that is only true without overflow first proves, from vmin/vmax, that
the exact (mathematical) value of the expression fits the dtype. The linear normal form itself is a ring identity
modulo 2**bits, true with or without overflow.
"""
from __future__ import annotations

import functools
import math
from typing import Any

from tiny_uop.alu import exec_alu
from tiny_uop.dtype import DType, dtypes, truncate_int
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite
from tiny_uop.uop import GroupOp, Ops, UOp, _cdiv

__all__ = ["symbolic_simple", "symbolic", "symbolic_flat", "simplify", "simplify_valid", "uop_given_valid",
           "parse_valid", "split_and", "sort_key"]

_SINTS = frozenset(dtypes.sints)
_INTS = frozenset(dtypes.ints)


def _is_sint(u: UOp) -> bool: return u.dtype in _SINTS
_LIMITS = {dt: (int(dtypes.min(dt)), int(dtypes.max(dt))) for dt in dtypes.ints}


def _wrap(v: int, dt: DType) -> int:
  """`v` wrapped to int dtype `dt` (hot: values already in range return at once)."""
  lo, hi = _LIMITS[dt]
  return v if lo <= v <= hi else truncate_int(v, dt)


def _const(dt: DType, v: Any) -> UOp: return UOp(Ops.CONST, dt, (), _wrap(v, dt) if dt in _LIMITS else v)
def _fits(dt: DType, lo: int, hi: int) -> bool: return dtypes.min(dt) <= lo and hi <= dtypes.max(dt)


# ***** a deterministic structural order: canonical forms sort by it *****
def _argkey(u: UOp) -> tuple:
  a = u.arg
  if a is None: return (0,)
  if type(a) in (int, float, bool): return (1, a)
  if u.op is Ops.RANGE and isinstance(a, tuple) and a and isinstance(a[0], int): return (1, a[0], repr(a[1:]))
  if u.op is Ops.DEFINE_VAR: return (2, str(a[0]), repr(a[1:]))
  return (2, str(a), "")


def sort_key(u: UOp) -> tuple:
  """A structural key (op, arg, dtype, sources' keys), cached: equal keys mean equal trees (up to tags)."""
  if (k := u._cache.get("skey")) is not None: return k
  stack = [u]
  while stack:
    n = stack[-1]
    if "skey" in n._cache:
      stack.pop()
      continue
    todo = [s for s in n.src if "skey" not in s._cache]
    if todo:
      stack.extend(todo)
      continue
    stack.pop()
    n._cache["skey"] = (n.op.value, _argkey(n), n.dtype.name, n.dtype.count, tuple(s._cache["skey"] for s in n.src),
                        repr(n.tag) if n.tag is not None else "")
  return u._cache["skey"]


# ***** constant folding and local identities *****
def _fold_const(x: UOp) -> UOp | None:
  # op(c0, c1, ...) -> exec_alu(op, c0, c1, ...)
  if x.dtype.count != 1: return None
  for s in x.src:
    if s.op is not Ops.CONST: return None
  try: val = exec_alu(x.op, x.dtype, tuple(s.arg for s in x.src))
  except (TypeError, ValueError, KeyError, ZeroDivisionError, OverflowError): return None
  return _const(x.dtype, val)


def _cast_cast(x: UOp, y: UOp, z: UOp) -> UOp | None:
  # cast(cast(z, mid), out) -> cast(z, out) when mid holds every value z can take (ints and bools only)
  zd, mid = z.dtype, y.dtype
  if not (zd in _INTS or zd == dtypes.bool) or mid not in _INTS or zd.count != 1: return None
  if not _fits(mid, int(z.vmin), int(z.vmax)): return None
  return z if x.dtype == zd else UOp(Ops.CAST, x.dtype, (z,))


def _where_not(c: UOp, a: UOp, b: UOp) -> UOp: return UOp(Ops.WHERE, a.dtype, (c, b, a))


def _is_additive_identity(c: UOp, dt: DType, sub: bool) -> bool:
  """Whether `x + c` (or `x - c` when `sub`) is `x` for every x of dtype `dt`. For floats only x + (-0.0) and
  x - (+0.0) are: -0.0 + 0.0 is +0.0, so folding x + 0.0 -> x would turn a +0.0 into -0.0 (and 1/(x+0) into -inf)."""
  if c.arg != 0: return False
  if not dtypes.is_float(dt): return True
  return (math.copysign(1.0, c.arg) > 0) == sub


def _neq_bool(x: UOp, c: UOp) -> UOp | None:
  # x != False -> x (bool x)
  return x if x.dtype == dtypes.bool and c.arg is False else None


def _div_self(x: UOp) -> UOp | None:
  # x//x -> 1 when x can't be 0
  return _const(x.dtype, 1) if x.dtype in _INTS and (x.vmin > 0 or x.vmax < 0) else None


def _neg_divisor(x: UOp, d: UOp) -> UOp | None:
  # x//(-c) -> (x//c)*-1, x%(-c) -> x%c (C semantics; not for INT_MIN)
  if d.arg >= 0 or -d.arg > dtypes.max(d.dtype): return None
  return UOp(Ops.MUL, x.dtype, (UOp(Ops.CDIV, x.dtype, (x, _const(d.dtype, -d.arg))), _const(x.dtype, -1)))


symbolic_simple = PatternMatcher([
  # op(consts...) -> const
  (UPat(tuple(GroupOp.ALU | {Ops.CAST}), name="x"), _fold_const),
  # x+0 -> x, x*1 -> x, x-0 -> x, x//1 -> x, x/1 -> x (floats: x+(-0.0) and x-(+0.0) only, see _is_additive_identity)
  (UPat.var("x") + UPat.cvar("c", vec=False), lambda x, c: x if _is_additive_identity(c, x.dtype, sub=False) else None),
  (UPat.var("x") * 1, lambda x: x),
  (UPat.var("x") - UPat.cvar("c", vec=False), lambda x, c: x if _is_additive_identity(c, x.dtype, sub=True) else None),
  (UPat.var("x") // 1, lambda x: x),
  (UPat.var("x") / 1.0, lambda x: x),
  # x*0 -> 0 (ints only: 0*inf is NaN)
  (UPat.var("x", dtype=tuple(_INTS)) * 0, lambda x: _const(x.dtype, 0)),
  # x%1 -> 0, x-x -> 0, x%x -> 0 (x%0 is defined as 0) (ints)
  (UPat.var("x", dtype=tuple(_INTS)) % 1, lambda x: _const(x.dtype, 0)),
  (UPat(Ops.SUB, src=(UPat.var("x"), UPat.var("x")), dtype=tuple(_INTS), name="s"), lambda s, x: _const(s.dtype, 0)),
  (UPat(Ops.CMOD, src=(UPat.var("x"), UPat.var("x")), dtype=tuple(_INTS), name="s"), lambda s, x: _const(s.dtype, 0)),
  # x//x -> 1 (ints, x != 0)
  (UPat(Ops.CDIV, src=(UPat.var("x"), UPat.var("x"))), _div_self),
  # x//(-c) -> (x//c)*-1, x%(-c) -> x%c
  (UPat.var("x", dtype=tuple(_SINTS)) // UPat.cvar("d", vec=False), _neg_divisor),
  (UPat.var("x", dtype=tuple(_SINTS)) % UPat.cvar("d", vec=False),
   lambda x, d: UOp(Ops.CMOD, x.dtype, (x, _const(d.dtype, -d.arg))) if 0 > d.arg > dtypes.min(d.dtype) else None),
  # where(True, a, b) -> a, where(False, a, b) -> b, where(c, a, a) -> a, where(!c, a, b) -> where(c, b, a)
  (UPat(Ops.WHERE, src=(UPat.cvar("c", vec=False), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
  (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("a"), UPat.var("a"))), lambda a: a),
  (UPat(Ops.WHERE, src=(UPat.var("c", dtypes.bool).ne(True), UPat.var("a"), UPat.var("b"))), _where_not),
  # max(x, x) -> x, x&x -> x, x|x -> x
  (UPat((Ops.MAX, Ops.AND, Ops.OR), src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
  # x^x -> 0 (ints, bools)
  (UPat(Ops.XOR, src=(UPat.var("x"), UPat.var("x")), name="s"),
   lambda s, x: _const(s.dtype, False if s.dtype == dtypes.bool else 0) if s.dtype.count == 1 else None),
  # bool: x&True -> x, x&False -> False, x|False -> x, x|True -> True, x^False -> x, x!=False -> x
  (UPat.var("x", dtypes.bool) & UPat.const(dtypes.bool, True), lambda x: x),
  (UPat.var("x", dtypes.bool) & UPat.const(dtypes.bool, False), lambda x: _const(dtypes.bool, False)),
  (UPat.var("x", dtypes.bool) | UPat.const(dtypes.bool, False), lambda x: x),
  (UPat.var("x", dtypes.bool) | UPat.const(dtypes.bool, True), lambda x: _const(dtypes.bool, True)),
  (UPat.var("x", dtypes.bool) ^ UPat.const(dtypes.bool, False), lambda x: x),
  (UPat.var("x").ne(UPat.cvar("c", dtypes.bool, vec=False)), _neq_bool),
  # !!x -> x (x != True != True), -(-x) -> x
  (UPat.var("x", dtypes.bool).ne(True).ne(True), lambda x: x),
  (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), lambda x: x),
  # x<x -> False, x!=x -> False, x==x -> True (ints and bools: NaN != NaN)
  (UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.var("x"))), lambda x: _const(dtypes.bool, False)),
  (UPat(Ops.CMPNE, src=(UPat.var("x"), UPat.var("x"))),
   lambda x: _const(dtypes.bool, False) if x.dtype in _INTS or x.dtype == dtypes.bool else None),
  (UPat(Ops.CMPEQ, src=(UPat.var("x"), UPat.var("x"))),
   lambda x: _const(dtypes.bool, True) if x.dtype in _INTS or x.dtype == dtypes.bool else None),
  # cast(x) -> x when already of that dtype; cast(cast(z)) -> cast(z) through a wide enough int
  (UPat(Ops.CAST, name="x", src=(UPat.var("y"),)), lambda x, y: y if x.dtype == y.dtype else None),
  (UPat(Ops.CAST, name="x", src=(UPat(Ops.CAST, name="y", src=(UPat.var("z"),)),)), _cast_cast),
], name="symbolic_simple")


# ***** the linear normal form of integer sums: sum(c_i * atom_i) + k *****
def _factors(u: UOp) -> tuple[list[UOp], int]:
  """A product flattened: its non-constant factors (through nested MULs of the same dtype) and the constant."""
  fs: list[UOp] = []
  k, stack, dt = 1, [u], u.dtype
  while stack:
    n = stack.pop()
    if n.op is Ops.MUL and n.dtype is dt: stack.extend(n.src)
    elif n.op is Ops.CONST: k *= n.arg
    else: fs.append(n)
  return fs, k


def _build_prod(fs: list[UOp], dt: DType) -> UOp:
  if len(fs) > 1: fs = sorted(fs, key=sort_key)
  ret = fs[0]
  for f in fs[1:]: ret = UOp(Ops.MUL, dt, (ret, f))
  return ret


def _terms(u: UOp) -> tuple[dict[UOp, int], int]:
  """`u` as {atom: coefficient} and a constant (exact integers; equal to `u` modulo 2**bits)."""
  acc: dict[UOp, int] = {}
  k, dt = 0, u.dtype
  stack = [(u, 1)]
  while stack:
    n, c = stack.pop()
    op = n.op
    if n.dtype is not dt and op is not Ops.CONST: acc[n] = acc.get(n, 0) + c
    elif op is Ops.CONST: k += c * n.arg
    elif op is Ops.ADD: stack += ((n.src[1], c), (n.src[0], c))
    elif op is Ops.SUB: stack += ((n.src[1], -c), (n.src[0], c))
    elif op is Ops.NEG: stack.append((n.src[0], -c))
    elif op is Ops.MUL:
      a, b = n.src
      if b.op is Ops.CONST: stack.append((a, c * b.arg))
      elif a.op is Ops.CONST: stack.append((b, c * a.arg))
      else:
        fs, fk = _factors(n)
        atom = _build_prod(fs, dt)
        acc[atom] = acc.get(atom, 0) + c * fk
    else: acc[n] = acc.get(n, 0) + c
  return acc, k


def _combine_divmod(acc: dict[UOp, int]) -> bool:
  """Recombine split indices in place; True when something combined. With C semantics (c, d > 0 for the second):
    (x//d)*(m*d) + (x%d)*m -> x*m                       (x = (x//d)*d + x%d, for any d != 0)
    ((x//c)%d)*(k*c) + (x%c)*k -> (x%(c*d))*k           (x%(c*d) = ((x//c)%d)*c + x%c)
  """
  changed, again = False, True
  while again:
    again = False
    for a in [a for a in acc if a.op is Ops.CMOD and a.src[1].op is Ops.CONST and a.src[1].arg != 0]:
      if not (m := acc.get(a)): continue
      x, d = a.src[0], a.src[1].arg
      q = UOp(Ops.CDIV, a.dtype, a.src)
      if acc.get(q) != m * d:  # the x//d may have been simplified from another form of x: x' with x'%d == a
        q = next((t for t, c in acc.items() if c == m * d and t.op is Ops.CDIV and t.src[1] is a.src[1] and
                  simplify(UOp(Ops.CMOD, a.dtype, t.src)) is a), a)
      if q is not a and acc.get(q) == m * d:
        del acc[a], acc[q]
        x = q.src[0]
        sub, sk = _terms(x)
        for t, c in sub.items(): acc[t] = acc.get(t, 0) + c * m
        acc[_KEY_CONST] = acc.get(_KEY_CONST, 0) + sk * m
        changed = again = True
        continue
      if x.op is Ops.CDIV and (cn := x.src[1]).op is Ops.CONST and cn.arg > 0 and d > 0 and m % cn.arg == 0:
        c, y = cn.arg, x.src[0]
        b = UOp(Ops.CMOD, a.dtype, (y, cn))
        if (k := acc.get(b)) and m == k * c and _fits(a.dtype, c * d, c * d):
          del acc[a], acc[b]
          merged = UOp(Ops.CMOD, a.dtype, (y, _const(a.dtype, c * d)))
          acc[merged] = acc.get(merged, 0) + k
          changed = again = True
          continue
      if d > 0 and (found := _merge_split_mod(acc, a, m, d)) is not None:
        sub, sk = _terms(found[0])
        for t, c in sub.items(): acc[t] = acc.get(t, 0) + c * found[1]
        acc[_KEY_CONST] = acc.get(_KEY_CONST, 0) + sk * found[1]
        changed = again = True
  return changed


def _merge_split_mod(acc: dict[UOp, int], a: UOp, m: int, d: int) -> tuple[UOp, int] | None:
  """(y%d)*(k*c) + b*k -> (x%(c*d))*k where y and b are the simplified x//c and x%c of x = c*y + b.

  The split parts of an index are often simplified apart ((I//16) becomes (L//16 + g*12) when I = L + g*192), so the
  exact pattern above can't see them; this proves the pair is ((x//c)%d, x%c) by simplifying x//c and x%c of the
  candidate x and comparing nodes (simplification is canonical and preserves values, wrapping included).
  """
  global _merge_depth
  if _merge_depth > 4: return None  # nested proofs stay shallow (each one simplifies smaller expressions)
  _merge_depth += 1
  try: return _find_split_mod(acc, a, m, d)
  finally: _merge_depth -= 1


_merge_depth = 0


def _find_split_mod(acc: dict[UOp, int], a: UOp, m: int, d: int) -> tuple[UOp, int] | None:
  y, dt = a.src[0], a.dtype
  for b, k in list(acc.items()):
    if b is a or b.op is not Ops.CMOD or (cn := b.src[1]).op is not Ops.CONST or cn.arg <= 0 or not k: continue
    c = cn.arg
    if m != k * c or not _fits(dt, c * d, c * d): continue
    x = simplify(UOp(Ops.ADD, dt, (UOp(Ops.MUL, dt, (y, cn)), b)))
    if b in _terms(x)[0]: continue  # x didn't recombine: merging would only undo the split that made this form
    if simplify(UOp(Ops.CDIV, dt, (x, cn))) is not y or simplify(UOp(Ops.CMOD, dt, (x, cn))) is not b: continue
    del acc[a], acc[b]
    return simplify(UOp(Ops.CMOD, dt, (x, _const(dt, c * d)))), k
  return None


_KEY_CONST = UOp(Ops.NOOP, arg="linear-constant")  # a dict key for a constant picked up while combining


def _build_sum(items: list[tuple[UOp, int]], k: int, dt: DType) -> UOp:
  """The canonical node of sum(c*atom) + k: terms sorted by atom, `atom*c` (c != 1), the constant last."""
  if len(items) > 1: items = sorted(items, key=lambda it: sort_key(it[0]))
  ret: UOp | None = None
  for a, c in items:
    t = a if c == 1 else UOp(Ops.MUL, dt, (a, _const(dt, c)))
    if ret is None: ret = t
    else:
      ret = UOp(Ops.ADD, dt, (ret, t))
      ret._cache["linear"] = True  # a prefix of a normal form is a normal form: the rewrite needn't re-derive it
  if ret is None: return _const(dt, k)
  if k != 0:
    ret = UOp(Ops.ADD, dt, (ret, _const(dt, k)))
    ret._cache["linear"] = True
  return ret


def _linear(x: UOp) -> tuple[list[tuple[UOp, int]], int]:
  acc, k = _terms(x)
  dt = x.dtype
  if len(acc) > 1 and _combine_divmod(acc): k += acc.pop(_KEY_CONST, 0)
  items = [(a, w) for a, c in acc.items() if (w := _wrap(c, dt)) != 0]
  return items, _wrap(k, dt)


def _normalize(x: UOp) -> UOp | None:
  # sum(c_i*a_i) + k: like terms combined (x*2+x*3 -> x*5, x-x -> 0), sorted, constants folded and last
  if x.dtype not in _SINTS or "linear" in x._cache: return None
  items, k = _linear(x)
  ret = _build_sum(items, k, x.dtype)
  if ret is x: x._cache["linear"] = True
  return None if ret is x else ret


def _math_range(items: list[tuple[UOp, int]], k: int) -> tuple[int, int]:
  """The exact range of sum(c*atom) + k from the atoms' ranges (no wrapping)."""
  lo = hi = k
  for a, c in items:
    amin, amax = int(a.vmin), int(a.vmax)
    if c > 0: lo, hi = lo + c * amin, hi + c * amax
    else: lo, hi = lo + c * amax, hi + c * amin
  return lo, hi


# ***** // and % by a positive constant *****
@functools.lru_cache(maxsize=1024)
def _divisors_desc(d: int) -> tuple[int, ...]:
  """The divisors of d strictly between 1 and d, largest first."""
  small = [i for i in range(2, math.isqrt(d) + 1) if d % i == 0]
  return tuple(sorted(set(small + [d // i for i in small]), reverse=True))


def _floor_divmod(items: list[tuple[UOp, int]], k: int, d: int, dt: DType, is_div: bool) -> UOp | None:
  """floor(v/d) or v mod d for v = sum(c*atom) + k >= 0 known not to wrap; None when nothing simplifies."""
  q_items = [(a, c // d) for a, c in items if c % d == 0]
  r_items = [(a, c) for a, c in items if c % d != 0]
  qk, rk = divmod(k, d)
  if not is_div:  # v mod d = (sum((c mod d)*a) + k mod d) mod d: smaller (positive) coefficients
    r_items = [(a, c % d if c > 0 else c) for a, c in r_items]
  rlo, rhi = _math_range(r_items, rk)
  if rlo // d == rhi // d:  # the remainder part's quotient is fixed: (a*4+b)//4 -> a, (a*4+b)%4 -> b for 0<=b<4
    q0 = rlo // d
    if is_div: return _build_sum(q_items, qk + q0, dt)
    return _build_sum(r_items, rk - q0 * d, dt)
  if rlo < 0: return None  # a negative remainder part can't be divided with C semantics
  if not _fits(dt, rlo, rhi): return None  # the remainder part is divided below: its node must not wrap
  # R = g*S + small with g | d and 0 <= small < g: R//d = S//(d/g), R%d = (S%(d/g))*g + small
  # ((g*4 + l) % 8 -> (g%2)*4 + l for 0 <= l < 4; the plain gcd case is small = the constant's remainder)
  for g in _divisors_desc(d):
    big = [(a, c // g) for a, c in r_items if c % g == 0]
    small = [(a, c) for a, c in r_items if c % g != 0]
    slo, shi = _math_range(small, rk % g)
    if slo < 0 or shi >= g: continue
    s_node, m = _build_sum(big, rk // g, dt), d // g
    if is_div:
      quot = UOp(Ops.CDIV, dt, (s_node, _const(dt, m)))
      return UOp(Ops.ADD, dt, (quot, _build_sum(q_items, qk, dt))) if q_items or qk else quot
    rem = UOp(Ops.MUL, dt, (UOp(Ops.CMOD, dt, (s_node, _const(dt, m))), _const(dt, g)))
    return UOp(Ops.ADD, dt, (rem, _build_sum(small, rk % g, dt))) if small or rk % g else rem
  if not q_items and qk == 0 and (is_div or (r_items == items and rk == k)): return None
  # v//d = Q + R//d, v%d = R%d (R >= 0)
  r_node = _build_sum(r_items, rk, dt)
  if is_div: return UOp(Ops.ADD, dt, (UOp(Ops.CDIV, dt, (r_node, _const(dt, d))), _build_sum(q_items, qk, dt)))
  return UOp(Ops.CMOD, dt, (r_node, _const(dt, d)))


def _fold_divmod(x: UOp) -> UOp | None:
  a, dn = x.src
  d, dt, is_div = dn.arg, x.dtype, x.op is Ops.CDIV
  if dt not in _SINTS or d <= 0: return None
  lo, hi = int(a.vmin), int(a.vmax)
  if is_div:
    # x//d -> const when the quotient is the same over x's range
    if _cdiv(lo, d) == _cdiv(hi, d): return _const(dt, _cdiv(lo, d))
    # (x//c1)//c2 -> x//(c1*c2) (c1, c2 > 0)
    if a.op is Ops.CDIV and a.src[1].op is Ops.CONST and a.src[1].arg > 0 and _fits(dt, 0, a.src[1].arg * d):
      return UOp(Ops.CDIV, dt, (a.src[0], _const(dt, a.src[1].arg * d)))
  else:
    # x%d -> x when |x| < d
    if -d < lo and hi < d: return a
    # (x%c1)%c2 -> x%c2 when c2 divides c1
    if a.op is Ops.CMOD and a.src[1].op is Ops.CONST and a.src[1].arg != 0 and a.src[1].arg % d == 0:
      return UOp(Ops.CMOD, dt, (a.src[0], dn))
  if d == 1: return None
  items, k = _linear(a)
  mlo, mhi = _math_range(items, k)
  if not _fits(dt, mlo, mhi): return None  # might wrap: the sum isn't its exact value
  if mlo >= 0: return _floor_divmod(items, k, d, dt, is_div)
  if mhi <= 0 and _fits(dt, -mhi, -mlo):  # C: x//d = -((-x)//d), x%d = -((-x)%d)
    ret = _floor_divmod([(t, -c) for t, c in items], -k, d, dt, is_div)
    return None if ret is None else UOp(Ops.MUL, dt, (ret, _const(dt, -1)))
  return None


def _nowrap_mul(a: UOp, b: UOp) -> bool:
  prods = [int(p * q) for p in (a.vmin, a.vmax) for q in (b.vmin, b.vmax)]
  return _fits(a.dtype, min(prods), max(prods))


def _divmod_var(x: UOp) -> UOp | None:
  # (a*b)//b -> a, (a*b)%b -> 0 when b != 0 and a*b doesn't wrap
  n, b = x.src
  if x.dtype not in _SINTS or b.op is Ops.CONST or not (b.vmin > 0 or b.vmax < 0) or n.op is not Ops.MUL: return None
  fs, k = _factors(n)
  if b not in fs: return None
  fs.remove(b)
  rest = _build_sum([(_build_prod(fs, x.dtype), k)], 0, x.dtype) if fs else _const(x.dtype, k)
  if not _nowrap_mul(rest, b): return None
  return rest if x.op is Ops.CDIV else _const(x.dtype, 0)


# ***** comparisons *****
def _cmp_parts(e: UOp, c: int) -> tuple[list[tuple[UOp, int]], int, int] | None:
  """e vs c as (items, c - k, gcd) where e = sum(items) + k doesn't wrap; None when e may wrap."""
  items, k = _linear(e)
  if not items: return None
  mlo, mhi = _math_range(items, k)
  if not _fits(e.dtype, mlo, mhi): return None
  return items, c - k, math.gcd(*(abs(cc) for _, cc in items))


def _scaled_sum(items: list[tuple[UOp, int]], g: int, dt: DType) -> UOp | None:
  """sum(c/g * atom) as a node, or None when its exact value might not fit the dtype (it would wrap)."""
  items = [(a, c // g) for a, c in items]
  lo, hi = _math_range(items, 0)
  return _build_sum(items, 0, dt) if _fits(dt, lo, hi) else None


def _cmp_const(x: UOp, e: UOp, c: UOp, const_first: bool) -> UOp | None:
  """`e < c` (or `c < e` when `const_first`) with e linear: the constant part moves to c and the common factor g
  divides out, rounding c the way that keeps the comparison exact (e + k < c -> e < c-k; g*e < c -> e < ceil(c/g);
  c < g*e -> floor(c/g) < e; a negated sum flips sides)."""
  if e.dtype not in _SINTS or (p := _cmp_parts(e, c.arg)) is None: return None
  items, cc, g = p
  neg = all(v < 0 for _, v in items)
  if neg: items, cc = [(a, -v) for a, v in items], -cc
  if (s := _scaled_sum(items, g, e.dtype)) is None: return None
  s_first = const_first == neg  # the scaled sum ends up on the left: s < ceil(cc/g), else floor(cc/g) < s
  nc = -((-cc) // g) if s_first else cc // g
  if not _fits(e.dtype, nc, nc): return None
  ret = UOp(Ops.CMPLT, dtypes.bool, (s, _const(e.dtype, nc)) if s_first else (_const(e.dtype, nc), s))
  return None if ret is x else ret


def _eq_const(x: UOp, e: UOp, c: UOp) -> UOp | None:
  # e + k == c -> e == c-k (a bijection, wrap or not); g*e == c -> e == c/g, or never when g doesn't divide c
  if e.dtype not in _SINTS: return None
  items, k = _linear(e)
  if not items: return None
  mlo, mhi = _math_range(items, k)
  cc = c.arg - k
  g = math.gcd(*(abs(v) for _, v in items))
  if g > 1 and _fits(e.dtype, mlo, mhi) and _fits(e.dtype, *_math_range(items, 0)):
    if cc % g != 0: return _const(dtypes.bool, x.op is Ops.CMPNE)
    items, cc = [(a, v // g) for a, v in items], cc // g
  ret = UOp(x.op, dtypes.bool, (_build_sum(items, 0, e.dtype), _const(e.dtype, cc)))
  return None if ret is x else ret


def _not_lt(a: UOp, b: UOp) -> UOp | None:
  # !(a < c) -> (c-1) < a, !(c < a) -> a < (c+1) (ints)
  if a.dtype not in _SINTS: return None
  if b.op is Ops.CONST and b.arg > dtypes.min(b.dtype):
    return UOp(Ops.CMPLT, dtypes.bool, (_const(b.dtype, b.arg - 1), a))
  if a.op is Ops.CONST and a.arg < dtypes.max(a.dtype):
    return UOp(Ops.CMPLT, dtypes.bool, (b, _const(a.dtype, a.arg + 1)))
  return None


def _fold_range(x: UOp) -> UOp | None:
  # an int/bool value whose range is a single point is that constant
  dt = x.dtype
  if dt.count != 1 or not (dt in _INTS or dt == dtypes.bool): return None
  lo, hi = x._min_max
  return _const(dt, lo) if lo == hi else None


def _max_range(x: UOp, a: UOp, b: UOp) -> UOp | None:
  # max(a, b) -> a when a >= b everywhere (ints)
  if x.dtype not in _INTS: return None
  if a.vmin >= b.vmax: return a
  if b.vmin >= a.vmax: return b
  return None


_LINEAR_OPS = (Ops.ADD, Ops.SUB, Ops.NEG, Ops.MUL)
_SINT_T = tuple(_SINTS)

symbolic = symbolic_simple + PatternMatcher([
  # vmin == vmax -> const (decided comparisons, x%1, ...)
  (UPat(tuple(GroupOp.ALU | {Ops.CAST}), name="x"), _fold_range),
  # sums and products of ints -> the linear normal form: x*2+x*3 -> x*5, (y+x)+1 -> (x+y)+1, (x+y)*3 -> x*3+y*3,
  # (x//c)*c + x%c -> x, ((x//c)%d)*c + x%c -> x%(c*d)
  (UPat(_LINEAR_OPS, dtype=_SINT_T, name="x"), _normalize),
  # // and % by a constant, with ranges: (a*4+b)//4 -> a, (a*4+b)%4 -> b (0<=b<4), (g*4+l)%8 -> (g%2)*4+l (0<=l<4),
  # (x*6+4)//4 -> (x*3)//2+1, (x//c1)//c2 -> x//(c1*c2), (x%c1)%c2 -> x%c2 (c2 | c1), x%c -> x (|x| < c);
  # (a*b)//b -> a, (a*b)%b -> 0 (b != 0, no wrap)
  (UPat((Ops.CDIV, Ops.CMOD), src=(UPat.var(), UPat.cvar(vec=False)), name="x"), _fold_divmod),
  (UPat((Ops.CDIV, Ops.CMOD), src=(UPat(Ops.MUL), UPat.var()), name="x"), _divmod_var),
  # comparisons against constants: x+k < c -> x < c-k, x*g < c -> x < ceil(c/g), -x < c -> -c < x,
  # x*g == c -> x == c/g (or False), !(x < c) -> c-1 < x
  (UPat(Ops.CMPLT, src=(UPat.var("e"), UPat.cvar("c", vec=False)), name="x"),
   lambda x, e, c: _cmp_const(x, e, c, const_first=False)),
  (UPat(Ops.CMPLT, src=(UPat.cvar("c", vec=False), UPat.var("e")), name="x"),
   lambda x, e, c: _cmp_const(x, e, c, const_first=True)),
  (UPat((Ops.CMPNE, Ops.CMPEQ), src=(UPat(_LINEAR_OPS, name="e"), UPat.cvar("c", vec=False)), name="x"), _eq_const),
  (UPat(Ops.CMPLT, src=(UPat.var("a"), UPat.var("b"))).ne(True), _not_lt),
  # max(a, b) decided by ranges
  (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b")), name="x"), _max_range),
], name="symbolic")

symbolic_flat = PatternMatcher(symbolic.patterns, name="symbolic_flat")


def simplify(u: UOp) -> UOp:
  """`u` rewritten with `symbolic` to a fixed point (cached on the node).

  >>> from tiny_uop import Variable
  >>> a, b = Variable("a", 0, 10), Variable("b", 0, 3)
  >>> ((a * 4 + b) // 4).simplify().render()
  'a'
  """
  if (ret := u._cache.get("simplified")) is not None: return u if ret is True else ret
  ret = graph_rewrite(u, symbolic, name="simplify")
  u._cache["simplified"] = True if ret is u else ret  # True, not u itself: no reference cycle
  ret._cache["simplified"] = True
  return ret


# ***** validity masks *****
def split_and(valid: UOp) -> list[UOp]:
  """The clauses of a conjunction `c0 & c1 & ...`, in order."""
  out: list[UOp] = []
  stack = [valid]
  while stack:
    n = stack.pop()
    if n.op is Ops.AND and n.dtype == dtypes.bool: stack += (n.src[1], n.src[0])
    else: out.append(n)
  return out


def _parse_clause(c: UOp) -> tuple[UOp, int, int] | None:
  """A clause as (expr, lo, hi): `e<k` is e <= k-1, `k<e` is e >= k+1, `!(e<k)` is e >= k, `!(k<e)` is e <= k."""
  neg = c.op is Ops.CMPNE and c.src[1].op is Ops.CONST and c.src[1].arg is True
  if neg: c = c.src[0]
  if c.op is not Ops.CMPLT: return None
  a, b = c.src
  if a.dtype not in _INTS: return None
  inf = 2**100
  if b.op is Ops.CONST and a.op is not Ops.CONST: return (a, b.arg, inf) if neg else (a, -inf, b.arg - 1)
  if a.op is Ops.CONST and b.op is not Ops.CONST: return (b, -inf, a.arg) if neg else (b, a.arg + 1, inf)
  return None


def parse_valid(valid: UOp) -> dict[UOp, tuple[int, int]]:
  """What a validity mask says about its expressions: {expr: (lo, hi)}, intersected with their own ranges.

  Bounds on a sum also bound its atoms: from (x + y*4) < 10 with x >= 0 follows y <= 2.
  """
  bounds: dict[UOp, tuple[int, int]] = {}

  def add(e: UOp, lo: int, hi: int) -> None:
    plo, phi = bounds.get(e, (int(e.vmin), int(e.vmax)))
    bounds[e] = (max(plo, lo), min(phi, hi))
  clauses = [p for c in split_and(valid) if (p := _parse_clause(c)) is not None]
  for e, lo, hi in clauses: add(e, lo, hi)
  for e, _, _ in clauses:
    if e.op not in _LINEAR_OPS or e.dtype not in _SINTS: continue
    items, k = _linear(e)
    mlo, mhi = _math_range(items, k)
    if len(items) < 1 or not _fits(e.dtype, mlo, mhi): continue
    elo, ehi = bounds[e]
    for j, (a, c) in enumerate(items):
      rlo, rhi = _math_range(items[:j] + items[j + 1:], k)
      tlo, thi = elo - rhi, ehi - rlo  # c*a in [tlo, thi]
      if c > 0: add(a, _ceil_div(tlo, c), thi // c)
      else: add(a, _ceil_div(thi, c), tlo // c)
  return bounds


def _ceil_div(a: int, b: int) -> int: return -((-a) // b)


def _subst_bounds(bounds: dict[UOp, tuple[int, int]], u: UOp) -> UOp:
  """`u` simplified as if each bounded expression only took values in its bounds."""
  fake: dict[UOp, UOp] = {}
  for i, (e, (lo, hi)) in enumerate(bounds.items()):
    if (lo, hi) != (e.vmin, e.vmax) and e.dtype.count == 1: fake[e] = UOp.variable(f"_valid{i}", lo, hi, e.dtype)
  if not fake: return u.simplify()
  back = {v: e for e, v in fake.items()}
  return u.substitute(fake).simplify().substitute(back)


def uop_given_valid(valid: UOp, uop: UOp) -> UOp | None:
  """`uop` simplified for the points where `valid` holds; None when `valid` is never true."""
  bounds = parse_valid(valid)
  if any(lo > hi for lo, hi in bounds.values()): return None
  return _subst_bounds(bounds, uop)


def simplify_valid(valid: UOp) -> UOp:
  """A validity mask (a conjunction of bound checks) with redundant or merged clauses removed, in canonical order.

  Each clause is simplified given the others; one that always holds is dropped, one that never holds makes the whole
  mask False. `(x < 10) & (x < 5)` becomes `x < 5`; with x in [0, 7], `(x < 10) & (0 <= x)` becomes True.
  """
  valid = valid.simplify()
  clauses = split_and(valid)
  if len(clauses) == 1 and _parse_clause(clauses[0]) is None: return valid
  # merge bound clauses per expression
  merged: dict[UOp, list[int]] = {}
  others: list[UOp] = []
  inf = 2**100
  for c in clauses:
    if (p := _parse_clause(c)) is None:
      others.append(c)
      continue
    e, lo, hi = p
    b = merged.setdefault(e, [-inf, inf])
    b[0], b[1] = max(b[0], lo), min(b[1], hi)
  out: list[UOp] = []
  items = list(merged.items())
  for i, (e, (lo, hi)) in enumerate(items):
    # only clauses still kept may justify dropping this one (two clauses can each imply the other)
    rest = out + [_mk_bound(e2, lo2, hi2) for e2, (lo2, hi2) in items[i + 1:]] + others
    ctx = _and_all([r for r in rest if r is not None])
    ge = e.simplify() if ctx is None else uop_given_valid(ctx, e)
    if ge is None: return _const(dtypes.bool, False)
    if ge.op is Ops.CONST: elo = ehi = ge.arg
    else: elo, ehi = _range_given(ctx, e)
    if lo > hi or lo > ehi or hi < elo: return _const(dtypes.bool, False)
    if (cl := _mk_bound(e, lo if lo > elo else None, hi if hi < ehi else None)) is not None: out.append(cl)
  for i, c in enumerate(others):
    ctx = _and_all(out + others[i + 1:])
    gc = c if ctx is None else uop_given_valid(ctx, c)
    if gc is None or (gc.op is Ops.CONST and not gc.arg): return _const(dtypes.bool, False)
    if not (gc.op is Ops.CONST and gc.arg): out.append(gc)
  ret = _and_all(sorted(dict.fromkeys(out), key=sort_key))
  return _const(dtypes.bool, True) if ret is None else ret


def _range_given(ctx: UOp | None, e: UOp) -> tuple[int, int]:
  if ctx is None: return int(e.vmin), int(e.vmax)
  bounds = parse_valid(ctx)
  if e in bounds: return bounds[e]
  fake: dict[UOp, UOp] = {x: UOp.variable(f"_valid{i}", lo, hi, x.dtype)
                          for i, (x, (lo, hi)) in enumerate(bounds.items())
                          if lo <= hi and (lo, hi) != (x.vmin, x.vmax) and x.dtype.count == 1}
  s = e.substitute(fake).simplify() if fake else e.simplify()
  return int(s.vmin), int(s.vmax)


def _mk_bound(e: UOp, lo: int | None, hi: int | None) -> UOp | None:
  inf = 2**99
  lo = None if lo is None or lo < -inf or lo <= e.vmin else lo
  hi = None if hi is None or hi > inf or hi >= e.vmax else hi
  cl = [] if lo is None else [UOp(Ops.CMPLT, dtypes.bool, (_const(e.dtype, lo - 1), e))]
  if hi is not None: cl.append(UOp(Ops.CMPLT, dtypes.bool, (e, _const(e.dtype, hi + 1))))
  return _and_all(cl)


def _and_all(cl: list[UOp]) -> UOp | None:
  if not cl: return None
  ret = cl[0]
  for c in cl[1:]: ret = UOp(Ops.AND, dtypes.bool, (ret, c))
  return ret
