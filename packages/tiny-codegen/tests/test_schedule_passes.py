"""The scheduler's passes one at a time (`tiny_codegen.schedule.schedule.STAGES`, docs/PIPELINE.md §2): each pass's
output checked on its own, and the calls it gives run by the numpy reference evaluator (test_schedule_ref.py)
against numpy on the same inputs. Also: every pass is a step for VIZ and DEBUG, and the scheduler's source keeps the
shape issue #33 asks for (no exception used to steer it, no function over 100 lines, no recursion)."""
from __future__ import annotations

import ast
import pathlib
from types import SimpleNamespace

import numpy as np

from tiny_uop import Ops, UOp, dtypes
from tiny_uop import trace
from tiny_uop.helpers import Context

from tiny_codegen.schedule import clear_schedule_cache, create_schedule
from tiny_codegen.schedule import schedule as S
from tiny_codegen.schedule.indexing import KernelBuilder, NeedsBuffer

import test_schedule_ref as ref

RNG = np.random.default_rng(33)
SCHEDULE_DIR = pathlib.Path(S.__file__).parent


def tensor(*shape: int) -> tuple[UOp, UOp, np.ndarray]:
  b = UOp.new_buffer("CPU", int(np.prod(shape)), dtypes.float32)
  return b, b.reshape(shape), RNG.standard_normal(shape).astype(np.float32)


def run_passes(sink: UOp, upto: str, **kw) -> tuple[S._Normalizer, S._Scheduler, dict[str, UOp | None]]:
  """Normalize `sink`, then run STAGES up to and including `upto`; each pass's output by name."""
  norm = S._Normalizer(reuse=False)
  graph: UOp | None = norm.node(sink)
  st, outs = S._Scheduler(graph, **kw), {}
  for name, fn in S.STAGES:
    graph = outs[name] = fn(st, graph)
    if name == upto or graph is None: break
  return norm, st, outs


def run_calls(calls: UOp, norm: S._Normalizer, inputs: dict[UOp, np.ndarray]) -> dict[UOp, np.ndarray]:
  """Execute a LINEAR of CALLs (over the normalizer's placeholders) with the reference evaluator."""
  ph = {norm.places[norm.inputs.index(b)]: v for b, v in inputs.items()}
  env = ref.run_schedule(SimpleNamespace(calls=list(calls.src), var_vals={}), ph)
  return {b: env[norm.places[norm.inputs.index(b)]] for b in inputs} | {"env": env}  # type: ignore[dict-item]


def value_of(st: S._Scheduler, norm: S._Normalizer, env: dict, orig: UOp) -> np.ndarray:
  """The value a pass's calls gave `orig` (a requested value, or an intermediate with a buffer of its own)."""
  node = norm.new[orig]
  buf = next((b for n, b, v in st.becomes if n is node and v is None), None)
  if buf is None: buf = st.bufs[node]
  return env[buf].reshape(orig.shape)


def softmax(x: UOp, shape: tuple[int, int]) -> tuple[UOp, UOp, UOp]:
  m = x.r(Ops.MAX, (1,))
  e = (x - m.expand(shape)).exp2()
  s = e.r(Ops.ADD, (1,))
  return m, s, e / s.expand(shape)


def np_softmax(v: np.ndarray) -> np.ndarray:
  e = np.exp2(v - v.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


# ***** each pass alone *****
def _reduce_sizes(g: UOp) -> list[tuple[int, int]]:
  """(elements added per output, outputs) of every REDUCE_AXIS in `g`."""
  out = []
  for u in g.toposort():
    if u.op is Ops.REDUCE_AXIS:
      shp = u.src[0].shape
      out.append((int(np.prod([shp[a] for a in u.arg[1]])), int(np.prod(u.shape))))
  return out


def test_views_pass_removes_view_round_trips():
  xb, x, xv = tensor(2, 3, 4)
  y = x.reshape((6, 4)).reshape((2, 3, 4)).permute((2, 0, 1)).permute((1, 2, 0)).exp2()  # = exp2(x)
  z = x.reshape((4, 6)).reshape((6, 4)) * 2  # not a round trip: kept
  norm, st, outs = run_passes(UOp.sink(y, z), "views")
  ny, nz = st.image[norm.new[y]], st.image[norm.new[z]]
  assert ny.op is Ops.EXP2 and ny.src[0] is norm.new[x]  # the round trips are gone
  assert ny is outs["views"].src[0]  # each normalized node's image is kept for `becomes`
  assert nz is norm.new[z] and nz.src[0].op is Ops.RESHAPE and nz.src[0].src[0].op is Ops.RESHAPE
  sched = create_schedule(UOp.sink(y, z))
  env = ref.run_schedule(sched, {xb: xv})
  np.testing.assert_allclose(ref.realized_value(sched, env, y), np.exp2(xv), rtol=1e-6)
  np.testing.assert_allclose(ref.realized_value(sched, env, z), xv.reshape(6, 4) * 2, rtol=1e-6)


def test_becomes_names_the_callers_nodes_through_the_rewrites():
  # a requested value and an exposed one whose images the views pass changed: `becomes` still maps the caller's nodes
  ab, a, av = tensor(4, 8)
  c = (a * 2).contiguous()
  v = c.reshape((8, 4)).reshape((4, 8))  # a round trip: its image is c
  out = v.permute((1, 0)).permute((1, 0)) + 1  # the requested value reads v through another round trip
  clear_schedule_cache()
  sched = create_schedule(UOp.sink(out), expose=[v])
  assert len(sched.kernels) == 2 and {c, v, out} <= set(sched.becomes)
  env = ref.run_schedule(sched, {ab: av})
  np.testing.assert_allclose(ref.realized_value(sched, env, v), av * 2, rtol=1e-6)
  np.testing.assert_allclose(ref.realized_value(sched, env, out), av * 2 + 1, rtol=1e-6)


def test_blocked_sums_pass_bounds_every_accumulator_and_matches_numpy():
  n = 3 * S.REDUCE_BLOCK * S.REDUCE_FANIN + 5  # above BLOCKED_SUM_MIN, below SPLIT_REDUCE_MIN: blocked, not split
  assert S.BLOCKED_SUM_MIN <= n < S.SPLIT_REDUCE_MIN
  xb, x, _ = tensor(n)
  xv = (RNG.standard_normal(n) + 100).astype(np.float32)  # an offset: a single float32 chain would drift
  total = x.r(Ops.ADD, (0,))
  norm, st, outs = run_passes(UOp.sink(total), "blocked_sums")
  assert _reduce_sizes(norm.new[total]) == [(n, 1)]
  assert outs["split_reduces"] is norm.new[UOp.sink(total)]  # not one for the split
  blocked = _reduce_sizes(outs["blocked_sums"])
  assert len(blocked) > 2 and all(k <= S.REDUCE_BLOCK for k, _ in blocked), blocked
  sched = create_schedule(UOp.sink(total))
  assert len(sched.kernels) == 1  # the levels of the tree are one kernel
  got = ref.realized_value(sched, ref.run_schedule(sched, {xb: xv}), total)
  np.testing.assert_allclose(got.reshape(()), xv.astype(np.float64).sum(), rtol=2e-6)


def test_split_reduces_pass_splits_a_big_sum_into_partials_and_matches_numpy():
  n = S.SPLIT_REDUCE_MIN  # one output of 2**18 elements: partial sums into G*L outputs, then their sum
  xb, x, _ = tensor(n)
  xv = RNG.standard_normal(n).astype(np.float32)
  total = x.r(Ops.ADD, (0,))
  norm, st, outs = run_passes(UOp.sink(total), "blocked_sums")
  assert outs["blocked_sums"] is outs["split_reduces"]  # the split blocked what it needed: nothing left to block
  sizes = _reduce_sizes(outs["split_reduces"])
  assert any(o == S.SPLIT_REDUCE_GROUPS * S.SPLIT_REDUCE_LANES for _, o in sizes), sizes  # the partials
  assert all(k <= S.REDUCE_BLOCK for k, _ in sizes), sizes  # both stages blocked
  sched = create_schedule(UOp.sink(total))
  assert len(sched.kernels) == 2
  got = ref.realized_value(sched, ref.run_schedule(sched, {xb: xv}), total)
  np.testing.assert_allclose(got.reshape(()), xv.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)


def test_decide_pass_realizes_the_broadcast_reduces_only():
  xb, x, xv = tensor(4, 8)
  m, s, out = softmax(x, (4, 8))
  norm, st, outs = run_passes(UOp.sink(out), "decide")
  realized = outs["decide"]
  assert realized.op is Ops.SINK
  assert norm.new[m] in realized.src and norm.new[s] in realized.src and norm.new[out] in realized.src
  assert norm.new[x - m.expand((4, 8))] not in realized.src  # elementwise: fused into its readers
  # the decision is one the rest of the pipeline computes the right numbers from
  sched = create_schedule(UOp.sink(out))
  env = ref.run_schedule(sched, {xb: xv})
  np.testing.assert_allclose(ref.realized_value(sched, env, out), np_softmax(xv), rtol=1e-5)


def test_kernels_pass_builds_softmax_in_two_kernels_that_match_numpy():
  xb, x, xv = tensor(4, 8)
  m, s, out = softmax(x, (4, 8))
  norm, st, outs = run_passes(UOp.sink(out), "kernels")
  built = outs["kernels"]
  assert built.op is Ops.LINEAR and all(c.op is Ops.CALL for c in built.src)
  assert len(built.src) == 2  # the max stored by its sum's kernel (multi-output), then the output
  assert len(built.src[0].src[0].src) == 2  # that first kernel's two STOREs
  env = run_calls(built, norm, {xb: xv})["env"]  # a graph without assigns: build order is an execution order
  np.testing.assert_allclose(value_of(st, norm, env, out), np_softmax(xv), rtol=1e-5)
  np.testing.assert_allclose(value_of(st, norm, env, s).reshape(4), np.exp2(xv - xv.max(1, keepdims=True)).sum(1),
                             rtol=1e-5)


def test_order_pass_reports_a_cycle_and_the_next_attempt_orders_a_swap():
  (ab, a, av), (bb, b, bv) = tensor(2, 3), tensor(2, 3)
  sink = UOp.sink(a.assign(b), b.assign(a))
  norm, st, outs = run_passes(sink, "order")
  assert outs["order"] is None  # a cycle: a result, not an exception
  assert S._next_attempt(st) == (False, True)
  norm, st, outs = run_passes(sink, "order", merge=False, safe_assign=True)
  env = run_calls(outs["order"], norm, {ab: av, bb: bv})
  np.testing.assert_equal(env[ab].reshape(2, 3), bv)
  np.testing.assert_equal(env[bb].reshape(2, 3), av)


def test_next_attempt_gives_up_with_a_clear_error():
  st = S._Scheduler(UOp(Ops.SINK, dtypes.void, ()), merge=False, safe_assign=True)
  st.writers.append((0, UOp.new_buffer("CPU", 1, dtypes.float32), None))
  try:
    S._next_attempt(st)
  except RuntimeError as e:
    assert "can't order this schedule" in str(e)
  else: raise AssertionError("no attempt is left: _next_attempt must say so")


def test_memory_pass_reuses_freed_buffers_and_keeps_the_numbers():
  xb, x, xv = tensor(4, 8)
  y, want = x, xv
  for _ in range(4):  # a chain of broadcast reduces: each realized, each read only by the next step
    y = (y - y.r(Ops.MAX, (1,)).expand((4, 8))).exp2() * y.r(Ops.ADD, (1,)).expand((4, 8))
    want = np.exp2(want - want.max(1, keepdims=True)) * want.sum(1, keepdims=True)
  norm, st, outs = run_passes(UOp.sink(y), "memory")
  bufs = lambda g: {b for c in g.src for b in c.src[1:]}  # noqa: E731
  assert len(bufs(outs["memory"])) < len(bufs(outs["order"]))
  assert [c.src[0] for c in outs["memory"].src] == [c.src[0] for c in outs["order"].src]  # same kernels, same order
  env = run_calls(outs["memory"], norm, {xb: xv})["env"]
  np.testing.assert_allclose(value_of(st, norm, env, y), want, rtol=1e-4)


def test_normalize_pass_numbers_inputs_and_drops_detach():
  (ab, a, av), (bb, b, bv) = tensor(3, 3), tensor(3, 3)
  out = (b.detach() * a) + b
  norm = S._Normalizer(reuse=False)
  nout = norm.node(UOp.sink(out))
  assert norm.inputs == [bb, ab]  # depth-first, sources in order
  assert not any(u.op in (Ops.DETACH, Ops.BUFFER) and u in (ab, bb) for u in nout.toposort())
  assert all(u.op is not Ops.DETACH for u in nout.toposort())
  sched = create_schedule(UOp.sink(out))
  env = ref.run_schedule(sched, {ab: av, bb: bv})
  np.testing.assert_allclose(ref.realized_value(sched, env, out), bv * av + bv, rtol=1e-6)


def test_kernel_builder_says_which_value_needs_a_buffer():
  ab, a, av = tensor(64)
  y = (a * a + a).exp2()  # reads memory: costly to recompute
  z = y.pad(((40, 40),)).shrink(((40, 104),))
  for k in range(1, 40): z = z + y.pad(((40, 40),)).shrink(((40 + k, 104 + k),))  # y at 40 indices
  norm = S._Normalizer(reuse=False)
  nz = norm.node(UOp.sink(z)).src[0]
  _, reads_memory = S._decide(UOp.sink(nz))
  kb = KernelBuilder(lambda u: u if u.op is Ops.BUFFER else None, lambda v: UOp.const(dtypes.index, v),
                     lambda u: S._costly(reads_memory, u))
  res = kb.kernel(nz, UOp.new_buffer("CPU", 64, dtypes.float32), (64,))
  assert isinstance(res, NeedsBuffer) and res.node is norm.new[y]
  sched = create_schedule(UOp.sink(z))  # the scheduler gives y its own kernel, then builds z's again
  assert sum(c.src[0].op is Ops.SINK for c in sched.calls) == 2
  env = ref.run_schedule(sched, {ab: av})
  yv, pad = np.exp2(av * av + av), np.zeros(40, np.float32)
  want = sum(np.concatenate([pad, yv, pad])[40 + k:104 + k] for k in range(40))
  np.testing.assert_allclose(ref.realized_value(sched, env, z), want, rtol=1e-4)


def test_rebind_pass_puts_the_callers_buffers_into_a_cached_schedule():
  (ab, a, _), (bb, b, _) = tensor(4, 8), tensor(4, 8)
  (cb, c, cv), (db, d, dv) = tensor(4, 8), tensor(4, 8)
  clear_schedule_cache()
  first = create_schedule(UOp.sink(softmax(a * b, (4, 8))[2]))
  rec = _Stages()
  old = trace.install(rec)
  try: sched = create_schedule(UOp.sink(out := softmax(c * d, (4, 8))[2]))  # same structure: a cache hit
  finally: trace.install(old)
  assert [n for n, _, _ in rec.seen] == ["normalize", "rebind"] and sched.template is first.template
  before, after = rec.seen[1][1], rec.seen[1][2]
  assert {x.src[0].arg[0] for call in before.src for x in call.src[1:]} == {"in", "new"}  # placeholders
  bufs = {x for call in after.src for x in call.src[1:]}
  assert {cb, db} <= bufs and not bufs & {ab, bb} and not bufs & {x for call in first.calls for x in call.src[1:]}
  env = ref.run_schedule(sched, {cb: cv, db: dv})
  np.testing.assert_allclose(ref.realized_value(sched, env, out), np_softmax(cv * dv), rtol=1e-5)


# ***** tracing *****
class _Stages(trace.Recorder):
  def __init__(self) -> None: self.seen: list[tuple[str, UOp, UOp]] = []
  def stage(self, name: str, before: UOp, after: UOp) -> None: self.seen.append((name, before, after))


def test_every_pass_is_a_step_in_viz_and_in_debug(capsys):
  xb, x, xv = tensor(4, 8)
  _, _, out = softmax(x * 3, (4, 8))
  clear_schedule_cache()
  rec = _Stages()
  old = trace.install(rec)
  try: sched = create_schedule(UOp.sink(out))
  finally: trace.install(old)
  assert [n for n, _, _ in rec.seen] == ["normalize", *(n for n, _ in S.STAGES), "rebind"]
  assert [n for n, _ in S.STAGES] == ["views", "split_reduces", "blocked_sums", "decide", "kernels", "order", "memory"]
  for (_, _, after), (_, before, _) in zip(rec.seen[1:], rec.seen[2:-1]): assert after is before  # a chain
  assert list(rec.seen[-1][2].src) == sched.calls
  env = ref.run_schedule(sched, {xb: xv})
  np.testing.assert_allclose(ref.realized_value(sched, env, out), np_softmax(xv * 3), rtol=1e-5)
  clear_schedule_cache()
  with Context(DEBUG=3): create_schedule(UOp.sink(out))
  printed = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("  sched ")]
  assert printed == ["normalize", *(n for n, _ in S.STAGES), "rebind"]


class _Rewrites(trace.Recorder):
  def __init__(self) -> None: self.names: list[str] = []
  def rewrite_begin(self, name: str, sink: UOp) -> None: self.names.append(name)


def test_the_graph_rewrite_passes_are_traced_one_by_one_in_order():
  # VIZ lists each graph_rewrite by name (tiny_uop.trace): the scheduler's are there, in the order of STAGES
  xb, x, xv = tensor(4, 8)
  y, want = x.reshape((32,)).reshape((4, 8)), xv
  for _ in range(4):  # a chain of broadcast reduces, each read only by the next step: the memory pass reuses buffers
    y = (y - y.r(Ops.MAX, (1,)).expand((4, 8))).exp2() * y.r(Ops.ADD, (1,)).expand((4, 8))
    want = np.exp2(want - want.max(1, keepdims=True)) * want.sum(1, keepdims=True)
  clear_schedule_cache()
  rec = _Rewrites()
  old = trace.install(rec)
  try: sched = create_schedule(UOp.sink(y))
  finally: trace.install(old)
  ours = [n for n in rec.names if n in {name for name, _ in S.STAGES}]
  assert ours == ["views", "split_reduces", "blocked_sums", "memory"], rec.names
  env = ref.run_schedule(sched, {xb: xv})
  np.testing.assert_allclose(ref.realized_value(sched, env, y), want, rtol=1e-4)


# ***** the shape of the code (issue #33) *****
def _functions() -> list[tuple[str, ast.FunctionDef]]:
  out = []
  for f in sorted(SCHEDULE_DIR.glob("*.py")):
    out += [(f.name, n) for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.FunctionDef)]
  return out


def test_scheduler_functions_are_short_and_not_recursive():
  long = [(f, n.name, n.end_lineno - n.lineno + 1) for f, n in _functions() if n.end_lineno - n.lineno + 1 > 100]
  assert not long, long
  recursive = []
  for f, n in _functions():
    called = {c.func.id for c in ast.walk(n) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    called |= {c.func.attr for c in ast.walk(n) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
               and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"}
    if n.name in called: recursive.append((f, n.name))
  assert recursive == [("schedule.py", "arg")], recursive  # (the normalizer's walk over a nested arg tuple)


def test_scheduler_defines_no_exception_classes():
  for f in SCHEDULE_DIR.glob("*.py"):
    for n in ast.walk(ast.parse(f.read_text())):
      if isinstance(n, ast.ClassDef):
        assert not any(isinstance(b, ast.Name) and b.id.endswith(("Exception", "Error")) for b in n.bases), n.name
