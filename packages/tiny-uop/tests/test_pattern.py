"""UPat / PatternMatcher / graph_rewrite: matching features, compiled matcher vs the interpreter, deep graphs."""
from __future__ import annotations

import time

import pytest

from tiny_uop import Context, Ops, PatternMatcher, UOp, UPat, Variable, dtypes, graph_rewrite, graph_rewrite_map

x, y, z = Variable("x", 0, 10), Variable("y", 0, 10), Variable("z", 0, 10)
one, two = UOp.const(dtypes.index, 1), UOp.const(dtypes.index, 2)


def _both(pm: PatternMatcher, u: UOp, ctx=None):
  """The compiled result, checked against the interpreter (TRACK_MATCH_STATS uses UPat.match)."""
  ret = pm.rewrite(u, ctx)
  with Context(TRACK_MATCH_STATS=1): assert pm.rewrite(u, ctx) is ret
  return ret


def test_permutations_of_commutative_sources():
  pm = PatternMatcher([(UPat.var("a") * UPat.cvar("c"), lambda a, c: a + c.arg)])
  assert _both(pm, x * 3) is x + 3
  assert _both(pm, UOp(Ops.MUL, dtypes.index, (two, x))) is x + 2
  assert _both(pm, x * y) is None


def test_tuple_sources_are_ordered():
  pm = PatternMatcher([(UPat(Ops.SUB, src=(UPat.var("a"), UPat.cvar("c"))), lambda a, c: a)])
  assert _both(pm, x - 1) is x
  assert _both(pm, UOp(Ops.SUB, dtypes.index, (one, x))) is None


def test_named_captures_must_agree():
  pm = PatternMatcher([(UPat.var("a") + UPat.var("a"), lambda a: a * 2)])
  assert _both(pm, x + x) is x * 2
  assert _both(pm, x + y) is None


def test_allow_any_len_and_any_count_sources():
  pm = PatternMatcher([(UPat(Ops.SINK, src=(UPat.var("first"),), allow_any_len=True), lambda first: first)])
  assert _both(pm, UOp.sink(x, y, z)) is x
  pm_all = PatternMatcher([(UPat(Ops.SINK, src=UPat(Ops.DEFINE_VAR), name="s"), lambda s: s.src[-1])])
  assert _both(pm_all, UOp.sink(x, y)) is y
  assert _both(pm_all, UOp.sink(x, one)) is None
  pm_exact = PatternMatcher([(UPat(Ops.SINK, src=(UPat.var("first"),)), lambda first: first)])
  assert _both(pm_exact, UOp.sink(x, y)) is None


def test_dtype_arg_and_custom_checks():
  pm = PatternMatcher([
    (UPat(Ops.CONST, dtype=dtypes.float32, name="c"), lambda c: UOp.const(dtypes.float32, 0.0) if c.arg != 0 else None),
    (UPat(Ops.DEFINE_VAR, arg=("y", 0, 10)), lambda: z),
    (UPat(Ops.ADD, custom=lambda u: u.src[0] is z, name="u"), lambda u: u.src[1])])
  assert _both(pm, UOp.const(dtypes.float32, 2.0)).arg == 0.0
  assert _both(pm, UOp.const(dtypes.int32, 2)) is None
  assert _both(pm, y) is z and _both(pm, x) is None
  assert _both(pm, z + x) is x and _both(pm, x + z) is None


def test_any_alternatives():
  pm = PatternMatcher([(UPat.any(UPat(Ops.ADD, name="u"), UPat(Ops.MUL, name="u")), lambda u: u.src[1])])
  assert _both(pm, x + y) is y and _both(pm, x * z) is z and _both(pm, x - y) is None
  nested = PatternMatcher([(UPat(Ops.NEG, src=(UPat.any(UPat(Ops.ADD), UPat(Ops.MUL)).named("i"),)), lambda i: i)])
  assert _both(nested, -(x + y)) is x + y and _both(nested, -(x - y)) is None


def test_ctx_is_passed_when_first_param_is_ctx():
  seen = []
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: seen.append((ctx, v)))])
  graph_rewrite(x + y, pm, ctx="C")
  assert ("C", x) in seen and ("C", y) in seen
  pm2 = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v))])
  assert graph_rewrite(x + y, pm2, ctx={x: z}) is z + y


def test_first_matching_rule_wins_and_composition():
  pm1 = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: z if v is x else None)], name="a")
  pm2 = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: y if v is not y else None)], name="b")
  both = pm1 + pm2
  assert len(both) == 2 and both.name == "a+b"
  assert both.rewrite(x) is z                # pm1 first
  assert both.rewrite(z) is y                # pm1 says None, pm2 applies
  assert (pm2 + pm1).rewrite(x) is y


def test_rule_returning_input_is_no_match():
  pm = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda u: u), (UPat(Ops.ADD, name="u"), lambda u: u.src[0])])
  assert pm.rewrite(x + y) is x


def test_top_pattern_needs_an_op():
  with pytest.raises(ValueError, match="must name its op"): PatternMatcher([(UPat.var("x"), lambda x: x)])


def test_graph_rewrite_fixed_point_and_sharing():
  # x+1 -> x, applied until nothing matches; a node met again (here the rebuilt x+1) reuses its earlier result
  calls = []

  def drop_one(a):
    calls.append(a)
    return a
  pm = PatternMatcher([(UPat.var("a") + 1, drop_one)])
  shared = ((x + 1) + 1) + 1
  out = graph_rewrite(UOp.sink(shared * 2, shared * 3), pm)
  assert out is UOp.sink(x * 2, x * 3)
  assert len(calls) == 1


def test_bottom_up_vs_default():
  # -(-(-x)): top-down sees the outer pair first, bottom-up-from-sources pairs the inner two first
  pm = PatternMatcher([(UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("a"),)),)), lambda a: a)])
  e = UOp(Ops.NEG, dtypes.index, (UOp(Ops.NEG, dtypes.index, (-x,)),))
  assert graph_rewrite(e, pm) is -x
  assert graph_rewrite(e, pm, bottom_up=True) is -x
  # a rule that replaces a whole subtree: bottom_up sees the parent before its sources are rewritten
  seen: list[str] = []
  pm2 = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda u: seen.append(u.src[1].op.name))])
  graph_rewrite(x + (y * 2), PatternMatcher([(UPat(Ops.MUL, name="m"), lambda m: m.src[0])]) + pm2)
  assert seen == ["DEFINE_VAR"]        # default: sources first, so the ADD sees y
  seen.clear()
  graph_rewrite(x + (y * 2), PatternMatcher([(UPat(Ops.MUL, name="m"), lambda m: m.src[0])]) + pm2, bottom_up=True)
  assert seen[0] == "MUL"              # bottom_up: the ADD is tried before its MUL source is rewritten


def test_graph_rewrite_map():
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: z if v is x else None)])
  e = (x + y) * 2
  m = graph_rewrite_map(e, pm)
  assert m[e] is (z + y) * 2 and m[x] is z and m[y] is y


def test_cycle_is_reported():
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: v + 0 if v is x else None)])
  with pytest.raises(RuntimeError): graph_rewrite(x * 2, pm)


def test_200k_chain_no_recursion_and_fast():
  n = 200_000
  e = x
  for i in range(n): e = UOp(Ops.NEG, dtypes.index, (e,)) if i % 2 else UOp(Ops.ADD, dtypes.index, (e, one))
  # drop every +1: the result is the chain of NEGs alone
  pm = PatternMatcher([(UPat(Ops.ADD, src=[UPat.var("a"), UPat.const(dtypes.index, 1)]), lambda a: a)])
  t0 = time.perf_counter()
  out = graph_rewrite(e, pm)
  dt = time.perf_counter() - t0
  depth, u = 0, out
  while u.op is Ops.NEG: depth, u = depth + 1, u.src[0]
  assert u is x and depth == n // 2
  assert dt < 30, f"200k-node rewrite took {dt:.1f}s"
  assert graph_rewrite(e, PatternMatcher([(UPat(Ops.MUL), lambda: None)])) is e


def test_compiled_rule_source_is_inspectable():
  pm = PatternMatcher([(UPat.var("a") * UPat.cvar("c"), lambda a, c: a)])
  src = pm.cdict[Ops.MUL][0].__doc__
  assert "def rule(u, ctx)" in src and "for " in src   # the permutation loop
