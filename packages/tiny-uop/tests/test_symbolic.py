"""The symbolic simplifier against brute-force evaluation (an independent C-semantics evaluator written here), plus
unit tests of the folds the scheduler and codegen rely on."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from tiny_uop import Ops, UOp, Variable, dtypes
from tiny_uop.symbolic import parse_valid, simplify, simplify_valid, symbolic_simple, uop_given_valid
from tiny_uop.pattern import graph_rewrite


# ***** an independent reference: C semantics, int32 two's complement *****
def _wrap(x: int) -> int: return ((x + 2**31) & (2**32 - 1)) - 2**31


def _tdiv(a: int, b: int) -> int:
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q


def ref_eval(root: UOp, env: dict[str, int]) -> dict[UOp, object]:
  """Every node's value under `env` (by variable name)."""
  vals: dict[UOp, object] = {}
  for n in root.toposort():
    s = [vals[x] for x in n.src]
    op = n.op
    if op is Ops.CONST: v = n.arg
    elif op is Ops.DEFINE_VAR: v = env[n.arg[0]]
    elif op is Ops.SPECIAL or op is Ops.RANGE: v = env[n.render()]
    elif op is Ops.ADD: v = s[0] or s[1] if n.dtype == dtypes.bool else _wrap(s[0] + s[1])
    elif op is Ops.SUB: v = _wrap(s[0] - s[1])
    elif op is Ops.MUL: v = s[0] and s[1] if n.dtype == dtypes.bool else _wrap(s[0] * s[1])
    elif op is Ops.NEG: v = _wrap(-s[0])
    elif op is Ops.CDIV: v = _wrap(_tdiv(s[0], s[1]))
    elif op is Ops.CMOD: v = 0 if s[1] == 0 else s[0] - _tdiv(s[0], s[1]) * s[1]
    elif op is Ops.MAX: v = max(s[0], s[1])
    elif op is Ops.CMPLT: v = s[0] < s[1]
    elif op is Ops.CMPNE: v = s[0] != s[1]
    elif op is Ops.CMPEQ: v = s[0] == s[1]
    elif op is Ops.AND: v = bool(s[0] and s[1]) if n.dtype == dtypes.bool else s[0] & s[1]
    elif op is Ops.OR: v = bool(s[0] or s[1]) if n.dtype == dtypes.bool else s[0] | s[1]
    elif op is Ops.XOR: v = s[0] != s[1] if n.dtype == dtypes.bool else s[0] ^ s[1]
    elif op is Ops.WHERE: v = s[1] if s[0] else s[2]
    else: raise NotImplementedError(op)
    vals[n] = v
  return vals


# ***** random expressions *****
@st.composite
def variables(draw):
  out = []
  for i in range(3):
    if draw(st.integers(0, 5)) == 0:  # wide: products wrap
      lo = draw(st.sampled_from([-2**31, -2**30, -2**29, 0, 2**27, 2**28, 2**29])) + draw(st.integers(0, 1000))
      hi = lo + draw(st.sampled_from([0, 100, 2**20, 2**28, 2**30]))
    else:
      lo = draw(st.integers(-40, 40))
      hi = lo + draw(st.integers(0, 50))
    out.append(Variable(f"v{i}", lo, hi))
  pos = draw(st.integers(1, 6))
  out.append(Variable("d", pos, pos + draw(st.integers(0, 5))))  # a divisor that is never 0
  neg = draw(st.integers(1, 6))
  out.append(Variable("n", -neg - draw(st.integers(0, 5)), -neg))
  return out


def _int_expr(draw, vs: list[UOp], depth: int) -> UOp:
  if depth == 0 or draw(st.integers(0, 4)) == 0:
    if draw(st.booleans()): return draw(st.sampled_from(vs[:3]))
    return UOp.const(dtypes.index, draw(st.integers(-12, 12)))
  kind = draw(st.sampled_from(["+", "-", "*c", "*", "//c", "%c", "//v", "%v", "max", "min", "where", "neg", "lin"]))
  a = _int_expr(draw, vs, depth - 1)
  if kind == "neg": return -a
  if kind in ("//c", "%c"):
    c = draw(st.integers(-9, 9).filter(lambda x: x != 0))
    return a // c if kind == "//c" else a % c
  if kind in ("//v", "%v"):
    d = draw(st.sampled_from(vs[3:]))
    return a // d if kind == "//v" else a % d
  if kind == "*c": return a * draw(st.integers(-8, 8))
  if kind == "lin":  # a reshape-style index: (a*c1 + b) then // and %
    b = draw(st.sampled_from(vs[:3]))
    c1 = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, 4096]))
    e = a * c1 + b
    d = draw(st.integers(1, 16))
    return e // d if draw(st.booleans()) else e % d
  b = _int_expr(draw, vs, depth - 1)
  if kind == "+": return a + b
  if kind == "-": return a - b
  if kind == "*": return a * b
  if kind == "max": return a.maximum(b)
  if kind == "min": return a.minimum(b)
  cond = _bool_expr(draw, vs, depth - 1)
  return cond.where(a, b)


def _bool_expr(draw, vs: list[UOp], depth: int) -> UOp:
  a, b = _int_expr(draw, vs, max(depth - 1, 0)), _int_expr(draw, vs, max(depth - 1, 0))
  kind = draw(st.sampled_from(["<", ">=", "!=", "==", "&", "|", "not"]))
  if kind == "<": return a < b
  if kind == ">=": return a >= b
  if kind == "!=": return a.ne(b)
  if kind == "==": return a.eq(b)
  c, d = a < b, _int_expr(draw, vs, 0) < _int_expr(draw, vs, 0)
  if kind == "&": return c & d
  if kind == "|": return c | d
  return c.logical_not()


@st.composite
def expressions(draw):
  vs = draw(variables())
  e = _bool_expr(draw, vs, 3) if draw(st.integers(0, 4)) == 0 else _int_expr(draw, vs, 4)
  seed = draw(st.integers(0, 2**32))
  return vs, e, seed


def _points(vs: list[UOp], seed: int, n: int = 12) -> list[dict[str, int]]:
  rng = random.Random(seed)
  pts = []
  for i in range(n):
    env = {}
    for v in vs:
      _, lo, hi = v.arg
      env[v.arg[0]] = lo if i == 0 else hi if i == 1 else rng.choice([lo, hi, rng.randint(lo, hi)])
    pts.append(env)
  return pts


def _check_ranges(u: UOp, vals: dict[UOp, object]) -> None:
  for n, v in vals.items():
    assert n.vmin <= v <= n.vmax, f"value {v} of {n.render()} outside its range [{n.vmin}, {n.vmax}]"


@settings(max_examples=300)
@given(expressions())
def test_simplify_matches_brute_force(case): _check_simplify(*case)


def _check_simplify(vs, e, seed):
  """simplify(e) has e's value at sampled points of its variables, and every node's value lies in its range."""
  s = simplify(e)
  for env in _points(vs, seed):
    ve, vs_ = ref_eval(e, env), ref_eval(s, env)
    assert ve[e] == vs_[s], f"{e.render()} = {ve[e]} but simplified {s.render()} = {vs_[s]} at {env}"
    _check_ranges(e, ve)
    _check_ranges(s, vs_)


@settings(max_examples=100)
@given(expressions())
def test_simplify_is_a_fixed_point(case):
  _, e, _ = case
  s = simplify(e)
  assert graph_rewrite(s, __import__("tiny_uop.symbolic", fromlist=["symbolic"]).symbolic) is s


@st.composite
def index_expressions(draw):
  """Reshape-style index math over 2-3 variables: sums of scaled variables split again by // and %."""
  vs = draw(variables())
  e = UOp.const(dtypes.index, draw(st.integers(-20, 20)))
  for v in draw(st.lists(st.sampled_from(vs), min_size=1, max_size=3)):
    e = e + v * draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, -1, -4, 4096]))
  for _ in range(draw(st.integers(1, 3))):
    c = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, -4]))
    e = e // c if draw(st.booleans()) else e % c
    if draw(st.booleans()): e = e * draw(st.sampled_from([2, 4, 16])) + draw(st.sampled_from(vs))
  return vs, e, draw(st.integers(0, 2**32))


@settings(max_examples=300)
@given(index_expressions())
def test_index_simplify_matches_brute_force(case): _check_simplify(*case)


# ***** unit tests of key folds *****
a, b = Variable("a", 0, 10), Variable("b", 0, 3)
x, y = Variable("x", 0, 10), Variable("y", 0, 10)
gidx0 = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 16),), "gidx0")
lidx0 = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 64),), "lidx0")
lidx1 = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 4),), "lidx1")


@pytest.mark.parametrize("expr, want", [
  ((a * 4 + b) // 4, "a"),
  ((a * 4 + b) % 4, "b"),
  ((b + a * 4) // 4, "a"),
  (x * 2 + x * 3, "(x*5)"),
  (x - x, "0"),
  (x * 1 + 0, "x"),
  (x // 1, "x"),
  (x % 1, "0"),
  ((x * 4 + 8) // 4, "(x+2)"),
  ((x // 4) // 2, "(x//8)"),
  ((x % 8) % 4, "(x%4)"),
  ((x // 4) * 4 + x % 4, "x"),
  (x < 11, "True"),
  (x < 10, "(x<10)"),
  ((x + 3) < 5, "(x<2)"),
  ((x * 4) < 7, "(x<2)"),
  ((x * 4 + y * 8) < 12, "((x+(y*2))<3)"),
  (x.maximum(y + 11), "(y+11)"),
  ((gidx0 * 64 + lidx0) // 16, "((lidx0//16)+(gidx0*4))"),
  ((gidx0 * 64 + lidx0) % 16, "(lidx0%16)"),
  ((lidx1 + gidx0 * 4), "((gidx0*4)+lidx1)"),
  (((gidx0 * 4 + lidx1) // 4) % 16, "gidx0"),
  ((x >= 0) & (x < 11), "True"),
  ((x * 6 + 4) % 4, "((x%2)*2)"),
])
def test_folds(expr: UOp, want: str):
  assert simplify(expr).render() == want


def test_reshape_round_trip_folds_to_the_flat_index():
  # split a flat index by shape (6, 4, 8) and flatten again by (4, 12, 4): the composition is the identity
  r = UOp.range(3, 0)
  flat = (gidx0 * 64 + lidx0) * 3 + r        # in [0, 3072)
  def split(i, shape):
    out, stride = [], 1
    for n in reversed(shape):
      out.append((i // stride) % n)
      stride *= n
    return out[::-1]
  def join(dims, shape):
    ret, stride = None, 1
    for d, n in zip(reversed(dims), reversed(shape)):
      ret = d * stride if ret is None else ret + d * stride
      stride *= n
    return ret
  assert simplify(join(split(flat, [48, 4, 16]), [48, 4, 16])) is simplify(flat)
  twice = join(split(join(split(flat, [6, 32, 16]), [6, 32, 16]), [16, 12, 16]), [16, 12, 16])
  assert simplify(twice) is simplify(flat)


def test_canonical_equality():
  assert simplify((x + 1) + y) is simplify((y + x) + 1)
  assert simplify(x * y * 2) is simplify((y * 2) * x)
  assert simplify((x + y) * 3 - y) is simplify(x * 3 + y * 2)


def test_negative_divisors_c_semantics():
  n = Variable("n", -10, -1)
  assert simplify(n // 16).render() == "0"          # trunc toward zero, not floor (-1)
  assert simplify(n % 16).render() == "n"           # the dividend's sign
  assert simplify(x // -2).render() == "((x//2)*-1)"
  assert simplify(x % -3).render() == "(x%3)"


def test_wrapping_sum_is_not_divided():
  big = Variable("big", 0, 2**30)
  e = (big * 4 + 3) // 4                             # big*4 wraps: the fold would be wrong
  s = simplify(e)
  for v in (0, 2**29, 2**30):
    assert ref_eval(s, {"big": v})[s] == ref_eval(e, {"big": v})[e]


fx = UOp(Ops.DEFINE_VAR, dtypes.float32, arg=("fx", 0, 1))  # stands for any float value
bx = x < 5


@pytest.mark.parametrize("expr, want", [
  (x + 0, x), (x * 1, x), (x - 0, x), (x // 1, x), (x * 0, UOp.const(dtypes.index, 0)),
  (x // x, x // x),                                           # x may be 0: 0//0 is 0, not 1
  ((x + 1) // (x + 1), UOp.const(dtypes.index, 1)),
  (x % x, UOp.const(dtypes.index, 0)), (x - x, UOp.const(dtypes.index, 0)),
  (x.maximum(x), x), (bx.where(y, y), y),
  (UOp.const(dtypes.bool, True).where(x, y), x), (UOp.const(dtypes.bool, False).where(x, y), y),
  (bx & bx, bx), (bx | bx, bx), (bx & True, bx), (bx & False, UOp.const(dtypes.bool, False)),
  (bx | False, bx), (bx | True, UOp.const(dtypes.bool, True)), (bx.logical_not().logical_not(), bx),
  (UOp(Ops.NEG, dtypes.index, (UOp(Ops.NEG, dtypes.index, (x,)),)), x),
  (x.cast(dtypes.index), x), (x.cast(dtypes.int64).cast(dtypes.int32), x),
  (x < x, UOp.const(dtypes.bool, False)), (x.ne(x), UOp.const(dtypes.bool, False)),
  (fx * 1.0, fx), (fx + -0.0, fx), (fx - 0.0, fx), (fx / 1.0, fx),
])
def test_symbolic_simple_identities(expr: UOp, want: UOp):
  assert graph_rewrite(expr, symbolic_simple) is want


def test_float_rules_that_must_not_fire():
  # 0*inf and 0*NaN are NaN; NaN != NaN
  assert graph_rewrite(fx * 0.0, symbolic_simple) is fx * 0.0
  # -0.0 + 0.0 is +0.0: x+0.0 and x-(-0.0) are not x
  assert graph_rewrite(fx + 0.0, symbolic_simple) is fx + 0.0
  assert graph_rewrite(fx - (-0.0), symbolic_simple) is fx - (-0.0)
  assert graph_rewrite(fx.ne(fx), symbolic_simple) is fx.ne(fx)
  assert simplify(fx * 0.0) is fx * 0.0
  # (cast(int8 -> uint8) -> int32) changes negative values: not removable
  n8 = Variable("n8", -5, 5, dtypes.int8)
  e = n8.cast(dtypes.uint8).cast(dtypes.int8)
  assert graph_rewrite(e, symbolic_simple) is e


def test_negated_remainder_that_would_wrap_is_left_alone():
  # (1 + v) % 2 with v near INT_MIN: -(1+v) fits, but the remainder part -v alone does not
  v = Variable("v", -2**31, -2**31 + 100)
  e = (v + 1) % 2
  s = simplify(e)
  for p in (-2**31, -2**31 + 1, -2**31 + 100):
    assert ref_eval(s, {"v": p})[s] == ref_eval(e, {"v": p})[e]


def test_const_folding_uses_exec_alu():
  c = UOp.const(dtypes.int8, 100)
  assert graph_rewrite(c + c, symbolic_simple).arg == -56       # int8 wraps
  assert graph_rewrite(UOp.const(dtypes.index, -7) // 2, symbolic_simple).arg == -3
  assert graph_rewrite(UOp.const(dtypes.float32, 1.5) < 1.7, symbolic_simple).arg is True


def test_deep_expression_no_recursion_error():
  e = x
  for _ in range(20000): e = e + 1
  assert simplify(e).render() == "(x+20000)"


# ***** validity masks *****
def test_simplify_valid_merges_and_drops():
  v = Variable("v", -5, 20)
  assert simplify_valid((v < 10) & (v < 5)).render() == "(v<5)"
  assert simplify_valid((v >= 0) & (v < 30)).render() == "(-1<v)"
  assert simplify_valid((v < 3) & (v >= 4)).render() == "False"
  w = Variable("w", 0, 7)
  assert simplify_valid((w < 10) & (w >= 0)).render() == "True"


def test_simplify_valid_no_circular_drops():
  # each clause implies the other (m1 is 0): one must stay
  m0, m1 = Variable("m0", 0, 1), Variable("m1", 0, 0)
  v = (m0 >= 1) & ((m0 + m1) >= 1)
  s = simplify_valid(v)
  assert s.op is not Ops.CONST
  assert [ref_eval(s, {"m0": p, "m1": 0})[s] for p in (0, 1)] == [False, True]


def test_uop_given_valid_pad_index():
  v = Variable("v", 0, 12)
  valid = (v >= 1) & (v < 11)
  idx = (v - 1) % 10                  # in the valid region v-1 is in [0, 9]
  assert uop_given_valid(valid, idx).render() == "(v+-1)"
  assert uop_given_valid((v < 3) & (v >= 4), idx) is None


def test_parse_valid_bounds_atoms_of_sums():
  p, q = Variable("p", 0, 3), Variable("q", 0, 10)
  bounds = parse_valid((p + q * 4) < 10)
  assert bounds[q] == (0, 2)


@st.composite
def masks(draw):
  """A PAD-style mask (bounds on linear index expressions) and an index expression over the same variables."""
  vs = [Variable(f"m{i}", 0, draw(st.integers(0, 20))) for i in range(2)]
  clauses = []
  for _ in range(draw(st.integers(1, 4))):
    e = draw(st.sampled_from(vs)) * draw(st.sampled_from([1, 1, 2, 3])) + draw(st.integers(-5, 5))
    if draw(st.booleans()): e = e + draw(st.sampled_from(vs)) * draw(st.sampled_from([1, 4]))
    c = draw(st.integers(-3, 25))
    clauses.append(draw(st.sampled_from([e < c, e >= c, (c < e), e <= c])))
  valid = clauses[0]
  for c in clauses[1:]: valid = valid & c
  idx = vs[0] + vs[1] * draw(st.sampled_from([1, 5, 21])) + draw(st.integers(-5, 5))
  for _ in range(draw(st.integers(0, 2))):
    d = draw(st.sampled_from([2, 3, 5, 21]))
    idx = idx // d if draw(st.booleans()) else idx % d
  return vs, valid, idx


@settings(max_examples=200)
@given(masks())
def test_valid_simplification_matches_brute_force(case):
  vs, valid, idx = case
  sv = simplify_valid(valid)
  gi = uop_given_valid(valid, idx)
  ranges = [range(v.arg[1], v.arg[2] + 1) for v in vs]
  for p0 in ranges[0]:
    for p1 in ranges[1]:
      env = {"m0": p0, "m1": p1}
      ok = ref_eval(valid, env)[valid]
      assert ref_eval(sv, env)[sv] == ok, f"{valid.render()} -> {sv.render()} differs at {env}"
      if ok:
        assert gi is not None, f"{valid.render()} holds at {env} but uop_given_valid said never"
        assert ref_eval(gi, env)[gi] == ref_eval(idx, env)[idx], f"{idx.render()} given {valid.render()}: {gi.render()}"
