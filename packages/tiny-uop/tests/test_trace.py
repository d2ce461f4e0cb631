"""tiny_uop.trace: the recording hooks graph_rewrite calls (what VIZ builds on)."""
from __future__ import annotations

import pytest

from tiny_uop import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite, graph_rewrite_map, trace


class Log(trace.Recorder):
  """Remembers every hook call."""

  def __init__(self) -> None:
    self.begun: list[tuple[str, UOp]] = []
    self.ended: list[tuple[str, UOp | None, dict, int]] = []
    self.depth = 0
    self.contexts: list[str] = []

  def rewrite_begin(self, name: str, sink: UOp) -> object:
    self.begun.append((name, sink))
    self.depth += 1
    return (name, self.depth - 1)

  def rewrite_end(self, token: object, result: UOp | None, fired: dict, seconds: float) -> None:
    assert seconds >= 0
    self.depth -= 1
    name, depth = token  # type: ignore[misc]
    self.ended.append((name, result, {trace.rule_location(r)[0]: n for r, n in fired.items()}, depth))

  def context(self, kind, fn, args, kwargs):
    self.contexts.append(kind)
    return fn(*args, **kwargs)


@pytest.fixture
def log():
  rec = Log()
  old = trace.install(rec)
  try: yield rec
  finally: trace.install(old)


def add_zero(x: UOp) -> UOp: return x


def mul_one(x: UOp) -> UOp: return x


PM = PatternMatcher([(UPat.var("x") + 0, add_zero), (UPat.var("x") * 1, mul_one)], name="identities")


def chain(n: int) -> UOp:
  """SINK(v0 + 0, ..., v{n-1} + 0) * 1: n distinct nodes that `add_zero` folds, one that `mul_one` folds."""
  xs = [UOp.variable(f"v{i}", 0, 10) + UOp.const(dtypes.index, 0) for i in range(n)]
  return UOp.sink(*xs, UOp.variable("w", 0, 10) * UOp.const(dtypes.index, 1))


def folded(n: int) -> UOp: return UOp.sink(*[UOp.variable(f"v{i}", 0, 10) for i in range(n)], UOp.variable("w", 0, 10))


def test_counts_each_rule_that_fired(log):
  g = chain(5)
  out = graph_rewrite(g, PM, name="ids")
  assert out is folded(5)
  assert [b[0] for b in log.begun] == ["ids"] and log.begun[0][1] is g
  name, result, fired, depth = log.ended[0]
  assert (name, result, depth) == ("ids", out, 0)
  assert fired == {"add_zero": 5, "mul_one": 1}


def test_same_result_as_untraced():
  g = chain(7)
  plain = graph_rewrite(g, PM)
  old = trace.install(Log())
  try: traced = graph_rewrite(g, PM)
  finally: trace.install(old)
  assert traced is plain


def test_matcher_name_when_unnamed_and_map_and_bottom_up(log):
  g = chain(2)
  m = graph_rewrite_map(g, PM)
  assert m[g] is folded(2)
  graph_rewrite(g, PM, bottom_up=True)
  assert [b[0] for b in log.begun] == ["identities", "identities"]
  assert log.ended[1][2] == {"add_zero": 2, "mul_one": 1}  # bottom_up rules are counted too


def test_nested_rewrites_have_depth(log):
  def fold_inside(m: UOp) -> UOp | None:  # a rule that runs a rewrite of its own
    return graph_rewrite(m.src[0], PM, name="inner") if m.src[0].op is Ops.ADD else None
  outer = PatternMatcher([(UPat(Ops.MUL, name="m"), fold_inside)], name="outer")
  x = UOp.variable("x", 0, 10)
  out = graph_rewrite((x + UOp.const(dtypes.index, 0)) * UOp.const(dtypes.index, 3), outer, name="outer")
  assert out is x
  assert [(e[0], e[3]) for e in log.ended] == [("inner", 1), ("outer", 0)]
  assert log.ended[0][2] == {"add_zero": 1}
  assert list(log.ended[1][2].items()) == [("test_nested_rewrites_have_depth.<locals>.fold_inside", 1)]


def test_a_raising_rewrite_is_ended_with_none(log):
  def boom(x: UOp) -> UOp: raise ValueError("rule failed")
  with pytest.raises(ValueError, match="rule failed"):
    graph_rewrite(chain(1), PatternMatcher([(UPat(Ops.ADD, name="x"), boom)]), name="bad")
  assert log.ended == [("bad", None, {}, 0)]


def test_traced_decorator_runs_the_function_once(log):
  calls = []

  @trace.traced("kernel")
  def work(a, b=2):
    """Doc."""
    calls.append((a, b))
    return a + b
  assert work(1, b=5) == 6 and calls == [(1, 5)] and log.contexts == ["kernel"]
  assert work.__doc__ == "Doc." and work.__name__ == "work"


def test_nothing_recorded_without_a_recorder():
  assert trace.RECORDER is None
  rec = Log()
  trace.install(rec)
  trace.install(None)
  graph_rewrite(chain(2), PM)
  assert rec.begun == [] and trace.RECORDER is None


def test_install_checks_its_argument():
  with pytest.raises(TypeError, match="Recorder"):
    trace.install(object())  # type: ignore[arg-type]


def test_rule_location_names_the_function_and_line():
  fn, where = trace.rule_location(PM.patterns[0])
  assert fn == "add_zero"
  assert where == f"test_trace.py:{add_zero.__code__.co_firstlineno}"


def test_interpreted_rules_are_counted(log):
  # a pattern with any-count sources is not compiled: the counting matcher interprets it
  pm = PatternMatcher([(UPat(Ops.SINK, src=UPat(Ops.ADD), name="s"), lambda s: UOp.sink(*[x.src[0] for x in s.src]))])
  a, b = UOp.variable("a", 0, 3), UOp.variable("b", 0, 3)
  out = graph_rewrite(UOp.sink(a + 1, b + 2), pm, name="strip")
  assert out is UOp.sink(a, b) and list(log.ended[0][2].values()) == [1]


def test_docstring_example():
  import doctest
  res = doctest.testmod(trace)
  assert res.failed == 0 and res.attempted >= 5
