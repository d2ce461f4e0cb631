"""The scheduler's shape (issue #33): no scheduler state on UOps (its memo of normalized forms is its own, keyed weakly
by node), and its source read with `ast`: no function over 100 lines, no exception class of its own raised to steer
it, at least four named `graph_rewrite` passes."""
from __future__ import annotations

import ast
import gc
import pathlib

import numpy as np

from tiny_uop import Ops, UOp, dtypes

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
