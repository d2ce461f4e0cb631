"""The scheduler's shape (issue #33): no scheduler state on UOps (its memo of normalized forms is its own, keyed weakly
by node), and its source read with `ast`: no function over 100 lines, no exception class of its own raised to steer
it, at least four named `graph_rewrite` passes."""
from __future__ import annotations

import ast
import gc
import pathlib

import numpy as np

from tiny_uop import UOp, dtypes

from tiny_codegen.schedule import clear_schedule_cache, create_schedule
from tiny_codegen.schedule import schedule as S

import test_schedule_ref as ref

SCHEDULE_DIR = pathlib.Path(S.__file__).parent
RNG = np.random.default_rng(34)


def _trees() -> list[tuple[str, ast.Module]]:
  return [(f.name, ast.parse(f.read_text())) for f in sorted(SCHEDULE_DIR.glob("*.py"))]


# ***** no scheduler state on UOps *****
def test_normalized_forms_are_remembered_by_the_scheduler_not_on_the_nodes():
  clear_schedule_cache()
  ab = UOp.new_buffer("CPU", 12, dtypes.float32)
  a = ab.reshape((3, 4))
  y = (a * 2 + 1).exp2()
  sched = create_schedule(UOp.sink(y))
  graph = y.toposort()
  # what the nodes cache is derived from themselves only (shape, device, ...): no scheduler key on any of them
  assert all("norm" not in n._cache for n in graph)
  assert y in S._norm_memo  # the scheduler's own memo has it, and reuses it: the same schedule comes back
  assert create_schedule(UOp.sink(y)).template is sched.template
  av = RNG.standard_normal((3, 4)).astype(np.float32)
  env = ref.run_schedule(sched, {ab: av})
  np.testing.assert_allclose(ref.realized_value(sched, env, y), np.exp2(av * 2 + 1), rtol=1e-6)
  # keyed weakly: a node that dies takes its entry with it; clear_schedule_cache empties it
  n = len(S._norm_memo)
  del y, graph, sched
  gc.collect()
  assert len(S._norm_memo) < n
  clear_schedule_cache()
  assert len(S._norm_memo) == 0


def test_the_scheduler_reads_no_uop_cache():
  # `_cache` is the node's memo of its own derived properties; scheduler decisions live in the scheduler
  for name, tree in _trees():
    hits = [(name, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "_cache"]
    assert not hits, hits


# ***** the source's shape *****
def test_no_function_in_the_scheduler_is_over_100_lines():
  long = [(name, n.name, n.end_lineno - n.lineno + 1) for name, tree in _trees() for n in ast.walk(tree)
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 100]
  assert not long, long


def _names(node: ast.AST | None) -> set[str]:
  """The class names an `except` clause or a `raise` names (`X`, `X(...)`, `(X, Y)`, `mod.X`)."""
  if node is None: return set()
  if isinstance(node, ast.Call): return _names(node.func)
  if isinstance(node, ast.Tuple): return set().union(*(_names(e) for e in node.elts))
  if isinstance(node, ast.Name): return {node.id}
  if isinstance(node, ast.Attribute): return {node.attr}
  return set()


def test_no_exception_of_the_scheduler_steers_it():
  trees = _trees()
  local = {n.name for _, t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
  raised = set().union(*(_names(n.exc) for _, t in trees for n in ast.walk(t) if isinstance(n, ast.Raise)))
  caught = set().union(*(_names(n.type) for _, t in trees for n in ast.walk(t) if isinstance(n, ast.ExceptHandler)))
  assert not (local & raised & caught), local & raised & caught  # raised here to be caught here: control flow
  # ... nor one that is caught wholesale and dropped
  for name, t in trees:
    for h in (n for n in ast.walk(t) if isinstance(n, ast.ExceptHandler)):
      assert not (_names(h.type) & {"Exception", "BaseException"} or h.type is None) or \
        any(isinstance(s, ast.Raise) for s in ast.walk(h)), (name, h.lineno)


def _named_rewrites() -> list[str]:
  out = []
  for _, t in _trees():
    for n in ast.walk(t):
      if isinstance(n, ast.Call) and _names(n.func) & {"graph_rewrite", "graph_rewrite_map"}:
        out += [ast.unparse(k.value) for k in n.keywords if k.arg == "name"]
  return out


def test_at_least_four_passes_are_named_graph_rewrites():
  named = _named_rewrites()
  stages = [name for name, _ in S.STAGES]
  assert len(named) >= 4 and len(set(named)) == len(named), named
  assert {ast.literal_eval(n) for n in named} <= set(stages), (named, stages)  # each is a stage of the table
  # ... over a PatternMatcher of its own, named as its pass
  matchers = {getattr(S, n).name for n in dir(S) if n.startswith("pm_")}
  assert {ast.literal_eval(n) for n in named} == matchers, matchers
