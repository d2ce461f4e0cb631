"""Value ranges and range folds of float expressions against brute-force evaluation (issue #38).

The reference evaluates every node with `exec_alu` (the ALU semantics: NaN compares false both ways, MAX propagates
NaN) at sample values that include NaN, +-inf and -0.0, and compares with the simplified expression's value
(NaN == NaN; the sign of a zero must match). It also checks each node's value lies in its [vmin, vmax] and that a
float range narrower than [-inf, inf] is only given to a node that is never NaN (the contract in `_compute_min_max`).
"""
from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from tiny_uop import Ops, UOp, dtypes
from tiny_uop.alu import exec_alu
from tiny_uop.symbolic import simplify

INF, NAN = math.inf, math.nan
SAMPLES = (NAN, INF, -INF, -0.0, 0.0, 0.5, 1.0, -1.0, 2.0, -3.5)


def fvar(name: str) -> UOp:
  """A float leaf that may hold any value, NaN included (its range is the whole float range)."""
  return UOp(Ops.DEFINE_VAR, dtypes.float32, arg=(name, -INF, INF))


X, Y = fvar("x"), fvar("y")


def ref_eval(root: UOp, env: dict[str, float]) -> dict[UOp, object]:
  """Every node's value under `env`, each op through `exec_alu`."""
  vals: dict[UOp, object] = {}
  for n in root.toposort():
    if n.op is Ops.CONST: v = n.arg
    elif n.op is Ops.DEFINE_VAR: v = env[n.arg[0]]
    elif n.op is Ops.CAST: v = exec_alu(Ops.CAST, n.dtype, (vals[n.src[0]],), src_dtype=n.src[0].dtype)
    else: v = exec_alu(n.op, n.dtype, tuple(vals[s] for s in n.src))
    vals[n] = v
  return vals


def _same(a: object, b: object) -> bool:
  """Equal values of the same type: NaN matches NaN, and -0.0 does not match 0.0."""
  if isinstance(a, float) and isinstance(b, float):
    return (a != a and b != b) or (a == b and math.copysign(1.0, a) == math.copysign(1.0, b))
  return a == b and type(a) is type(b)


def _check_node_ranges(vals: dict[UOp, object]) -> None:
  for n, v in vals.items():
    lo, hi = n.vmin, n.vmax
    assert lo == lo and hi == hi, f"{n.render()} has a NaN bound [{lo}, {hi}]"
    if isinstance(v, float) and v != v:
      assert (lo, hi) == (dtypes.min(n.dtype), dtypes.max(n.dtype)), \
        f"{n.render()} is NaN but its range [{lo}, {hi}] says it never is"
    else: assert lo <= v <= hi, f"value {v} of {n.render()} outside its range [{lo}, {hi}]"


def check_against_brute_force(e: UOp, names: tuple[str, ...] = ("x", "y")) -> None:
  """simplify(e) agrees with e at every combination of SAMPLES, and every node's value lies in its range."""
  s = simplify(e)
  for pt in itertools.product(SAMPLES, repeat=len(names)):
    env = dict(zip(names, pt))
    ve, vs = ref_eval(e, env), ref_eval(s, env)
    assert _same(ve[e], vs[s]), f"{e.render()} = {ve[e]!r} but simplified {s.render()} = {vs[s]!r} at {env}"
    _check_node_ranges(ve)
    _check_node_ranges(vs)


# the cases of issue #38: a NaN in a WHERE branch made a comparison fold to a constant
@pytest.mark.parametrize("name, e", [
  ("where(x<0, nan, x) > 0", UOp.const(dtypes.float32, 0.0) < (X < 0.0).where(NAN, X)),
  ("where(x<0, nan, x) < 0", (X < 0.0).where(NAN, X) < 0.0),
  ("where(x<0, x, nan) < 1", (X < 0.0).where(X, NAN) < 1.0),
  ("where(x<0, nan, 2) > 1", UOp.const(dtypes.float32, 1.0) < (X < 0.0).where(NAN, 2.0)),
  ("where(x<0, 2, nan) == 2", (X < 0.0).where(2.0, NAN).eq(2.0)),
  ("where(x<0, 2, nan) != 2", (X < 0.0).where(2.0, NAN).ne(2.0)),
  ("where(x<0, nan, 3) != where(x<0, nan, 3)", (X < 0.0).where(NAN, 3.0).ne((Y < 0.0).where(NAN, 3.0))),
  ("where(x<0, inf, -inf) < 0", (X < 0.0).where(INF, -INF) < 0.0),
  ("where(x<0, nan, inf) < inf", (X < 0.0).where(NAN, INF) < INF),
  ("cast(where(x<0, nan, 1)) to int", (X < 0.0).where(NAN, 1.0).cast(dtypes.int32) < 2),
  ("cast(where(x<0, nan, 1)) to bool", (X < 0.0).where(NAN, 1.0).cast(dtypes.bool)),
  ("where(x<0, nan, 1) as double > 0", UOp.const(dtypes.float64, 0.0) < (X < 0.0).where(NAN, 1.0).cast(dtypes.float64)),
  ("max(where(x<0, nan, 1), 0) > 0", UOp.const(dtypes.float32, 0.0) < (X < 0.0).where(NAN, 1.0).maximum(0.0)),
])
def test_nan_branch_comparison_is_not_folded(name: str, e: UOp):
  check_against_brute_force(e)


def test_nan_constant_range_is_unknown():
  # a NaN constant's range is the whole float range: NaN has no place on the number line
  c = UOp.const(dtypes.float32, NAN)
  assert (c.vmin, c.vmax) == (-INF, INF)
  w = (X < 0.0).where(NAN, 1.0)
  assert (w.vmin, w.vmax) == (-INF, INF)
  assert (Y < 0.0).where(-0.0, 2.0).vrange == (-0.0, 2.0)  # no NaN: a real range is kept


def test_non_nan_float_ranges_still_fold():
  # where(c, 1, 2) is never NaN: 0 < it is always true, it < 0 always false
  w = (X < 0.0).where(1.0, 2.0)
  assert simplify(UOp.const(dtypes.float32, 0.0) < w).arg is True
  assert simplify(w < 0.0).arg is False


# ***** random float expression trees with special constants *****
_SPECIAL = [NAN, INF, -INF, -0.0, 0.0, 1.0, -1.0, 0.5, 3.0]


def _fexpr(draw, depth: int) -> UOp:
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    if draw(st.booleans()): return draw(st.sampled_from([X, Y]))
    return UOp.const(dtypes.float32, draw(st.sampled_from(_SPECIAL)))
  kind = draw(st.sampled_from(["+", "-", "*", "/", "max", "min", "where", "neg", "cast", "pow"]))
  a = _fexpr(draw, depth - 1)
  if kind == "neg": return -a
  if kind == "cast":
    through = draw(st.sampled_from([dtypes.float64, dtypes.float16, dtypes.int32, dtypes.bool]))
    return a.cast(through).cast(dtypes.float32)
  b = _fexpr(draw, depth - 1)
  if kind == "+": return a + b
  if kind == "-": return a - b
  if kind == "*": return a * b
  if kind == "/": return UOp(Ops.FDIV, dtypes.float32, (a, b))
  if kind == "max": return a.maximum(b)
  if kind == "min": return a.minimum(b)
  if kind == "pow": return UOp(Ops.POW, dtypes.float32, (a, b))
  return _fcmp(draw, depth - 1).where(a, b)


def _compare(draw, a: UOp, b: UOp) -> UOp:
  """One of the comparisons the simplifier folds by ranges, drawn: a < b, a != b, a == b or not (a < b)."""
  kind = draw(st.sampled_from(["<", "!=", "==", "not<"]))
  if kind == "<": return a < b
  if kind == "!=": return a.ne(b)
  if kind == "==": return a.eq(b)
  return (a < b).logical_not()


def _fcmp(draw, depth: int) -> UOp:
  return _compare(draw, _fexpr(draw, depth), _fexpr(draw, depth))


@st.composite
def float_expressions(draw):
  return _fcmp(draw, 3) if draw(st.booleans()) else _fexpr(draw, 3)


@settings(max_examples=250, deadline=None)
@given(float_expressions())
def test_float_simplify_matches_brute_force(e: UOp):
  check_against_brute_force(e)


def test_where_of_two_python_scalars_keeps_their_values():
  # cond.where(0.5, 2.0) once built the 0.5 as a bool constant (True) cast to float: 1.0
  for x, y in ((0.5, 2.0), (NAN, 1.0), (-0.0, 3)):
    w = (X < 0.0).where(x, y)
    for v in SAMPLES:
      got = ref_eval(w, {"x": v})[w]
      assert _same(got, float(x if v < 0.0 else y)), f"where({v} < 0, {x}, {y}) = {got}"


@pytest.mark.parametrize("e, folds", [(X + 0.0, False), (X + (-0.0), True), (X - 0.0, True), (X - (-0.0), False),
                                      (UOp.const(dtypes.float32, 0.0) + X, False)])
def test_adding_zero_keeps_the_sign_of_zero(e: UOp, folds: bool):
  # -0.0 + 0.0 is +0.0: x+0.0 -> x would keep a -0.0 (1/(x+0) = -inf instead of inf); x + (-0.0) is exactly x
  s = simplify(e)
  assert (s is X) == folds
  for v in SAMPLES:
    want, got = ref_eval(e, {"x": v})[e], ref_eval(s, {"x": v})[s]
    assert _same(want, got), f"{e.render()} at {v}: {got}"


# ***** ints and floats mixed: casts both ways, int division and remainder with negative values *****
V = UOp.variable("v", -6, 6)
_INT_DTS = [dtypes.int32, dtypes.uint8, dtypes.int8, dtypes.int64, dtypes.uint32]


def _mixed_float(draw, depth: int) -> UOp:
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    k = draw(st.integers(0, 2))
    if k == 0: return X
    if k == 1: return V.cast(dtypes.float32)
    return UOp.const(dtypes.float32, draw(st.sampled_from(_SPECIAL + [2.5, -2.5, 255.5, 1e10])))
  kind = draw(st.sampled_from(["+", "*", "max", "where", "cast", "icast"]))
  if kind == "icast": return _mixed_int(draw, depth - 1).cast(dtypes.float32)
  a = _mixed_float(draw, depth - 1)
  if kind == "cast":
    return a.cast(draw(st.sampled_from([dtypes.float16, dtypes.float64, dtypes.bool, *_INT_DTS]))).cast(dtypes.float32)
  b = _mixed_float(draw, depth - 1)
  if kind == "+": return a + b
  if kind == "*": return a * b
  if kind == "max": return a.maximum(b)
  return _mixed_cmp(draw, depth - 1).where(a, b)


def _mixed_int(draw, depth: int) -> UOp:
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    return V if draw(st.booleans()) else UOp.const(dtypes.index, draw(st.integers(-300, 300)))
  kind = draw(st.sampled_from(["+", "*", "max", "where", "fcast", "//", "%", "cast"]))
  if kind == "fcast": return _mixed_float(draw, depth - 1).cast(draw(st.sampled_from(_INT_DTS))).cast(dtypes.index)
  a = _mixed_int(draw, depth - 1)
  if kind == "cast": return a.cast(draw(st.sampled_from([dtypes.bool, *_INT_DTS]))).cast(dtypes.index)
  if kind == "//": return a // draw(st.sampled_from([-7, -2, -1, 1, 3, 4]))
  if kind == "%": return a % draw(st.sampled_from([-7, -2, 1, 3, 4]))
  b = _mixed_int(draw, depth - 1)
  if kind == "+": return a + b
  if kind == "*": return a * b
  if kind == "max": return a.maximum(b)
  return _mixed_cmp(draw, depth - 1).where(a, b)


def _mixed_cmp(draw, depth: int) -> UOp:
  if draw(st.booleans()): a, b = _mixed_float(draw, depth), _mixed_float(draw, depth)
  else: a, b = _mixed_int(draw, depth), _mixed_int(draw, depth)
  return _compare(draw, a, b)


@st.composite
def mixed_expressions(draw):
  k = draw(st.integers(0, 2))
  return _mixed_cmp(draw, 3) if k == 0 else _mixed_float(draw, 3) if k == 1 else _mixed_int(draw, 3)


@settings(max_examples=150, deadline=None)
@given(mixed_expressions())
def test_mixed_int_float_simplify_matches_brute_force(e: UOp):
  s = simplify(e)
  for x, v in itertools.product(SAMPLES, (-6, -1, 0, 5, 6)):
    env = {"x": x, "v": v}
    ve, vs = ref_eval(e, env), ref_eval(s, env)
    assert _same(ve[e], vs[s]), f"{e.render()} = {ve[e]!r} but simplified {s.render()} = {vs[s]!r} at {env}"
    _check_node_ranges(ve)
    _check_node_ranges(vs)
