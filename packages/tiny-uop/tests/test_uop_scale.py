"""The IR at scale: 100,000-node graphs through the rewrite engine, substitute, toposort and ranges without
recursion; nothing a node caches refers back to it (a dropped graph is freed at once, no cyclic GC needed);
interning is one object per node across threads."""
from __future__ import annotations

import gc
import threading

from tiny_uop import Ops, UOp, dtypes
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite
from tiny_uop.uop import AxisType, UOpMetaClass

N = 100_000


def _chain(n: int, leaf: UOp) -> UOp:
  e = leaf
  for i in range(n): e = e * 2 if i % 2 else e + 1
  return e


def test_100k_nodes_rewrite_substitute_toposort_ranges():
  r = UOp.range(1000, 0, AxisType.LOOP)
  e = _chain(N, r)
  assert len(e.toposort()) == N + 4  # the chain, r, its bound and the two constants
  # x*2 -> x+x over the whole chain, bottom up
  out = graph_rewrite(e, PatternMatcher([(UPat.var("x") * 2, lambda x: x + x)]))
  assert sum(1 for u in out.toposort() if u.op is Ops.MUL) == 0
  assert sum(1 for u in out.toposort() if u.op is Ops.ADD) == N
  assert e.ranges == {r: None}
  v = UOp.variable("v", 0, 9)
  sub = e.substitute({r: v})
  assert sub.ranges == {} and v in sub.toposort() and r not in sub.toposort()
  # evaluate both at one point, iteratively: the substitution kept every op
  vals: dict[UOp, int] = {}
  for u in sub.toposort():
    if u.op is Ops.DEFINE_VAR: vals[u] = 3
    elif u.op is Ops.CONST: vals[u] = u.arg
    else: vals[u] = (vals[u.src[0]] + vals[u.src[1]]) if u.op is Ops.ADD else (vals[u.src[0]] * vals[u.src[1]])
    if u.op in (Ops.ADD, Ops.MUL): vals[u] %= 1 << 61
  x = 3
  for i in range(N): x = (x * 2 if i % 2 else x + 1) % (1 << 61)
  assert vals[sub] == x


def test_a_dropped_graph_is_freed_without_the_cyclic_gc():
  gc.collect()
  gc.disable()
  try:
    before = len(UOpMetaClass.ucache)
    e = _chain(20_000, UOp.range(77, 1, AxisType.LOOP))
    e.toposort(), e.ranges, e.vmin, e.simplify()  # fill every per-node cache
    assert len(UOpMetaClass.ucache) > before + 20_000
    del e
    assert len(UOpMetaClass.ucache) < before + 100  # freed by reference counting alone: no cycles
  finally:
    gc.enable()


def test_interning_is_one_object_across_threads():
  got: list[list[UOp]] = [[] for _ in range(8)]
  start = threading.Barrier(8)

  def build(i: int) -> None:
    start.wait()
    x = UOp.variable("t", 0, 100, dtypes.int32)
    for k in range(3000): got[i].append(x * k + (k % 7))
  ts = [threading.Thread(target=build, args=(i,)) for i in range(8)]
  for t in ts: t.start()
  for t in ts: t.join()
  for k in range(3000): assert len({id(g[k]) for g in got}) == 1
