"""The eager hot path (issue #23): a realize whose graph has the structure of a cached schedule replays the recorded
kernels (engine `_replay`) without building the schedule; the result must be exactly what scheduling would give."""
import numpy as np
import pytest

import tiny_codegen.schedule as sched_mod
from tiny_tensor import Context, GlobalCounters, Tensor, Variable, engine
from tiny_uop import trace


@pytest.fixture
def count_schedules(monkeypatch):
  """How often the engine builds a schedule (create_schedule) from here on."""
  real, calls = sched_mod.create_schedule, []
  monkeypatch.setattr(sched_mod, "create_schedule", lambda *a, **k: calls.append(1) or real(*a, **k))
  return calls


def _x(seed: int, shape=(16, 16)) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_cached_op_launches_one_kernel_without_the_scheduler(count_schedules):
  x = _x(0)
  a = Tensor(x)
  first = (a + 1).realize()  # scheduled and compiled once
  count_schedules.clear()
  outs = []
  for _ in range(3):
    GlobalCounters.reset()
    outs.append((a + 1).realize())
    assert GlobalCounters.kernel_count == 1
  assert not count_schedules
  # a new output buffer per call (every earlier result is still alive and keeps its value)
  bufs = [engine.buffer_view(t.uop)[0] for t in (first, *outs)]
  assert len(set(bufs)) == 4
  assert len({id(engine.get_buffer(b)._buf) for b in bufs}) == 4  # four allocations
  for t in (first, *outs): np.testing.assert_array_equal(t.numpy(), x + 1)


def test_replay_counts_what_scheduling_counts():
  a, b = Tensor(_x(1)), Tensor(_x(2))
  f = lambda: ((a * b).exp() + a).sum(axis=1).realize()  # noqa: E731
  GlobalCounters.reset()
  ref = f()  # scheduled
  counted = (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem)
  GlobalCounters.reset()
  out = f()  # replayed
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == counted
  assert GlobalCounters.time_sum_s > 0
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
  np.testing.assert_allclose(out.numpy(), (np.exp(_x(1) * _x(2)) + _x(1)).sum(axis=1), rtol=1e-4)


def test_replay_reads_the_new_inputs_and_not_old_ones(count_schedules):
  # the same structure over other buffers (and the inputs in the other order) computes with those buffers
  xs = [_x(i, (8, 4)) for i in range(4)]
  ts = [Tensor(x) for x in xs]
  (ts[0] - ts[1] * 2).realize()
  count_schedules.clear()
  for i, j in ((2, 3), (3, 2), (1, 0)):
    np.testing.assert_allclose((ts[i] - ts[j] * 2).realize().numpy(), xs[i] - xs[j] * 2, rtol=1e-6)
  assert not count_schedules
  # one buffer in both places is another structure (one input): scheduled, and right
  np.testing.assert_allclose((ts[2] - ts[2] * 2).realize().numpy(), -xs[2], rtol=1e-6)
  assert len(count_schedules) == 1


def test_several_outputs_and_multi_kernel_schedules_replay(count_schedules):
  x = _x(3, (32, 8))
  a = Tensor(x)
  def f():
    s = a.softmax(axis=1)  # reductions: several kernels
    return s, a.max(axis=0)
  Tensor.realize(*f())
  count_schedules.clear()
  GlobalCounters.reset()
  s, m = f()
  Tensor.realize(s, m)
  k = GlobalCounters.kernel_count
  assert not count_schedules and k >= 2
  e = np.exp(x - x.max(axis=1, keepdims=True))
  np.testing.assert_allclose(s.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
  np.testing.assert_allclose(m.numpy(), x.max(axis=0), rtol=1e-6)


def test_clearing_the_schedule_cache_schedules_again(count_schedules):
  a = Tensor(_x(4))
  (a * 3).realize()
  sched_mod.clear_schedule_cache()
  count_schedules.clear()
  np.testing.assert_allclose((a * 3).realize().numpy(), _x(4) * 3, rtol=1e-6)
  assert len(count_schedules) == 1


def test_what_must_see_the_schedule_still_does(count_schedules):
  a = Tensor(_x(5))
  (a + 2).realize()
  count_schedules.clear()

  class Kinds(trace.Recorder):  # a VIZ-like recorder: every schedule and every launch
    def __init__(self): self.kinds, self.launches = [], 0
    def context(self, kind, fn, args, kwargs):
      self.kinds.append(kind)
      return fn(*args, **kwargs)
    def launch(self, device, name, start_s, seconds): self.launches += 1

  rec = Kinds()
  old = trace.install(rec)
  try: (a + 2).realize()
  finally: trace.install(old)
  assert rec.kinds.count("schedule") == 1 and rec.launches == 1
  calls = []
  with engine.capture(calls.append): (a + 2).realize()  # TinyJit's capture sees the kernel
  assert [c.kind for c in calls] == ["kernel"]
  with Context(DEBUG=1): (a + 2).realize()  # DEBUG prints per realize: scheduled
  assert len(count_schedules) == 3


def test_variables_and_copies_are_scheduled_each_time(count_schedules):
  v = Variable("n", 1, 8)
  a = Tensor(_x(6, (8,)))
  for n in (3, 5):  # a bound variable: its value is an argument of this run
    np.testing.assert_allclose((a * Tensor(v.bind(n))).realize().numpy(), _x(6, (8,)) * n, rtol=1e-6)
  b = Tensor(_x(7, (4,)), device="PYTHON")
  for _ in range(2): np.testing.assert_allclose(b.to("CPU").realize().numpy(), _x(7, (4,)))
  assert len(count_schedules) == 4


def _new_nodes(fn) -> int:
  """How many UOp nodes `fn()` interns anew (entries it adds to the interning table, counted by wrapping its
  setdefault: the only way a new node gets in besides replacing a dead entry)."""
  from tiny_uop.uop import UOpMetaClass
  real, added = UOpMetaClass.ucache, []
  class Counting(dict):
    def setdefault(self, key, ref):
      got = super().setdefault(key, ref)
      if got is ref: added.append(key[0])
      return got
  UOpMetaClass.ucache = Counting(real)
  try: fn()
  finally:
    new = UOpMetaClass.ucache
    UOpMetaClass.ucache = real
    real.clear(); real.update(new)  # the nodes made meanwhile stay interned (their callbacks look in `real`)
  return len(added)


def test_a_cached_op_makes_one_node_and_no_schedule(count_schedules):
  from tiny_uop.uop import Ops
  a = Tensor(_x(8))
  (a + 1).realize()
  count_schedules.clear()
  kinds = []
  n = _new_nodes(lambda: kinds.append((a + 1).realize()))
  # the op's ADD only: its output Buffer is pending on the Tensor (no UNIQUE, BUFFER, view yet); the normalized
  # graph, its cache key and the DEVICE are found, not made
  assert n == 1, n
  out = kinds[0]
  # the result's nodes are made when read: UNIQUE + BUFFER and the (16, 16) view of it, once
  views = []
  assert _new_nodes(lambda: views.extend([out.uop, out.uop])) == 3
  assert views[0] is views[1]
  assert out.uop.op is Ops.RESHAPE and out.uop.src[0].op is Ops.BUFFER and out.shape == (16, 16)
  assert not count_schedules
  np.testing.assert_array_equal(out.numpy(), _x(8) + 1)


def test_the_one_node_normalization_matches_the_walk():
  # cached_template's shortcut for one new node over remembered ones finds the same entry and inputs as the walk
  import importlib
  from tiny_uop import UOp
  S = importlib.import_module("tiny_codegen.schedule.schedule")
  _Normalizer, _norm_over_remembered = S._Normalizer, S._norm_over_remembered
  a, b = Tensor(_x(9)), Tensor(_x(10))
  for f in (lambda: a * b + 1, lambda: (a * 2) - (b * 3), lambda: b + a):
    f().realize()
    g = f().uop
    norm = _Normalizer()
    want = norm.node(g)  # its sources remember their forms, numbered as in this walk (as after a realize) ...
    S._norm_memo.pop(g)  # ... and g is new (the memo is the scheduler's, not on the node)
    got = _norm_over_remembered(g)
    assert got is not None and got[0] is want and got[1] == norm.inputs
    found = sched_mod.cached_template((g,))
    assert found is not None and found[1] == norm.inputs
    assert found[0] is S._cache.get(S._schedule_key(UOp.sink(want), frozenset()))
  # one buffer read through both sources is numbered once by the walk: the shortcut declines
  for g in ((a * b - b * 2).uop, (a + a).uop):
    _Normalizer().node(g)
    S._norm_memo.pop(g)
    assert _norm_over_remembered(g) is None


def test_replayed_scalars_and_repeated_tensors_keep_shapes_and_values(count_schedules):
  s = Tensor([2.5]).reshape(()).realize()
  for _ in range(3):  # a 0-d result: the replay gives its () view, not the buffer's (1,)
    r = (s * 2).realize()
    assert r.shape == () and r.item() == 5.0
  a = Tensor(_x(11, (4, 3)))
  t = a + 3
  Tensor.realize(t, t)  # the same tensor twice: applied once
  np.testing.assert_allclose(t.numpy(), _x(11, (4, 3)) + 3, rtol=1e-6)
  assert engine.is_realized(t.uop) and t._origin is not None and t._origin.op.name == "ADD"
  assert len(count_schedules) == 2  # once per structure: later runs replay


def test_a_codegen_flag_set_later_compiles_anew(count_schedules):
  # NOOPT (a codegen flag) set after the kernel was compiled and its replay recorded: the engine runs what a compile
  # under NOOPT gives -- its program cache and the replay record are keyed by the flags -- and caches that too
  from tiny_codegen import get_program
  from tiny_uop import Ops
  from tiny_uop.plugins import Device
  x, y = _x(20, (32, 32)), _x(21, (32, 32))
  a, b = Tensor(x), Tensor(y)
  f = lambda: (a @ b).realize()  # noqa: E731
  ast = next(c.src[0] for c in engine.plan([(a @ b).uop]).calls if c.src[0].op is Ops.SINK)
  renderer = Device[a.device].renderer

  def launched_src() -> str:
    calls = []
    with engine.capture(calls.append): out = f()
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-4, atol=1e-4)
    return calls[0].spec.src

  assert launched_src() == get_program(ast, renderer).src
  for _ in range(2): f()  # recorded, then replayed
  count_schedules.clear()
  with Context(NOOPT=1):
    assert launched_src() == get_program(ast, renderer).src  # the program cache: compiled under NOOPT
    np.testing.assert_allclose(f().numpy(), x @ y, rtol=1e-4, atol=1e-4)  # not the default-flags replay ...
    assert len(count_schedules) == 2  # (the capture's and this one's)
    for _ in range(2): np.testing.assert_allclose(f().numpy(), x @ y, rtol=1e-4, atol=1e-4)
    assert len(count_schedules) == 2  # ... recorded again under NOOPT, then replayed
  np.testing.assert_allclose(f().numpy(), x @ y, rtol=1e-4, atol=1e-4)


def test_a_cached_op_schedules_lowers_and_walks_nothing(count_schedules, monkeypatch):
  # issue #39: on a cached op the engine launches the recorded kernel on a fresh buffer; nothing of the scheduler,
  # the lowering/compiler or the program cache runs, and no graph is walked (counted by wrapping each entry point)
  import importlib
  import tiny_codegen.program as prog_mod
  from tiny_uop import UOp
  S = importlib.import_module("tiny_codegen.schedule.schedule")
  x = _x(30, (64, 64))
  a = Tensor(x)
  for _ in range(2): (a + 1).realize()  # scheduled, compiled and recorded; then replayed
  count_schedules.clear()
  counts: dict[str, int] = {}

  def counting(owner, name):
    real = getattr(owner, name)
    def wrapped(*args, **kwargs):
      counts[name] = counts.get(name, 0) + 1
      return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapped)

  for owner, name in ((prog_mod, "get_program"), (prog_mod, "to_program"), (prog_mod, "_to_program"),
                      (engine, "_get_runner"), (engine, "run_schedule"), (S, "_schedule"), (S._Normalizer, "node"),
                      (UOp, "toposort"), (UOp, "substitute")):
    counting(owner, name)
  GlobalCounters.reset()
  outs = [(a + 1).realize() for _ in range(5)]
  assert counts == {} and not count_schedules
  assert GlobalCounters.kernel_count == 5
  for t in outs: np.testing.assert_array_equal(t.numpy(), x + 1)
  # the wrappers do count: a new structure goes through them
  (a * 7).realize()
  assert counts.get("_schedule") == 1 and counts.get("_get_runner", 0) >= 1 and len(count_schedules) == 1


def test_replayed_buffers_are_fresh_canonical_nodes_and_never_a_wrong_launch(count_schedules):
  # issue #39: a replay builds its output BUFFER over the DEVICE node kept in its record (not interned again). The
  # node must still be the one `UOp.new_buffer` makes (the interned DEVICE, a UNIQUE from the same counter as every
  # other buffer, shape and device set), and replays of other structures (constant, dtype, shape) interleaved with it
  # must each run their own kernel: numbers against numpy
  from tiny_uop import UOp
  from tiny_uop.uop import Ops
  x, y = _x(40, (8, 12)), _x(41, (12, 8))
  xi = (np.arange(96).reshape(8, 12) - 40).astype(np.int32)
  a, b, ai = Tensor(x), Tensor(y), Tensor(xi)
  ops = [(lambda: a + 1, x + 1), (lambda: a + 2, x + 2), (lambda: b + 1, y + 1), (lambda: ai + 1, xi + 1),
         (lambda: a * 3, x * 3)]
  for build, _ in ops: build().realize()  # each structure scheduled and recorded once
  count_schedules.clear()
  seen_unique: set[int] = set()
  for _ in range(3):
    for build, want in ops:
      other = UOp.new_buffer("CPU", 4, Tensor([1]).dtype)  # a buffer made elsewhere between replays
      t = build().realize()
      buf = engine.buffer_view(t.uop)[0]
      assert buf.op is Ops.BUFFER and buf.src[1] is UOp(Ops.DEVICE, arg=buf.device)
      assert buf.src[0].op is Ops.UNIQUE and buf.src[0].arg not in seen_unique and buf.src[0].arg != other.src[0].arg
      seen_unique |= {buf.src[0].arg, other.src[0].arg}
      assert buf.shape == (buf.arg,) and buf.arg == want.size and t.shape == want.shape
      got = t.numpy()
      assert got.dtype == want.dtype
      np.testing.assert_array_equal(got, want)
  assert not count_schedules  # all of them replayed


def test_the_structure_memo_never_finds_another_structures_launch(count_schedules):
  # issue #39: a fresh root (`a + 1`, a new ADD each time) finds its cached schedule by (op, dtype, its sources'
  # normalized forms, tag), without interning its normalized node. Roots that differ only in the dtype (casts of
  # one source), in the strides of a view (a.T), in the device, or in input order must each run their own kernel
  import importlib
  from tiny_uop import dtypes
  S = importlib.import_module("tiny_codegen.schedule.schedule")
  x, y = _x(50, (6, 6)), _x(51, (6, 6))
  a, b = Tensor(x).realize(), Tensor(y).realize()
  ap = Tensor(x, device="PYTHON").realize()
  at = a.T.contiguous().realize()  # a (6, 6) buffer: `at + 1` and `a.T + 1` have the same shape, other strides
  ops = [(lambda: a.cast(dtypes.int32), x.astype(np.int32)), (lambda: a.cast(dtypes.float16), x.astype(np.float16)),
         (lambda: (a.abs() * 10).cast(dtypes.uint8), (np.abs(x) * 10).astype(np.uint8)),
         (lambda: a - b, x - y), (lambda: b - a, y - x), (lambda: at + 1, x.T + 1), (lambda: a.T + 1, x.T + 1),
         (lambda: a + 1, x + 1), (lambda: ap + 1, x + 1), (lambda: a.abs().sqrt(), np.sqrt(np.abs(x))),
         (lambda: a.abs().exp2(), np.exp2(np.abs(x)))]
  for build, _ in ops: build().realize()  # each structure scheduled and recorded once
  count_schedules.clear()
  S._tmpl_by_struct.clear()  # found by the walk once more, then by structure
  for _ in range(3):
    for build, want in ops:
      got = build().realize().numpy()
      assert got.dtype == want.dtype and got.shape == want.shape
      np.testing.assert_allclose(got, want, rtol=1e-3 if want.dtype == np.float16 else 1e-6)
  assert len(S._tmpl_by_struct) >= 8  # the one-new-node roots went through the memo
  assert not count_schedules  # all of them replayed


def test_gradients_flow_through_replayed_results_and_assigns_replay_in_place(count_schedules):
  # issue #39: a replayed result takes its fresh buffer without `_realized_node`'s alias walks; it must still keep its
  # graph for autograd (requires_grad None/True), keep none for a detached one, and an assign (whose output is its
  # target, not a fresh buffer) still writes in place. Gradients against torch, values against numpy
  import torch
  x, y = _x(60, (5, 7)), _x(61, (5, 7))
  w, c = Tensor(x, requires_grad=True), Tensor(y)
  for _ in range(2): ((w * 3).realize(), (w.detach() * 3).realize(), (c * w).realize())  # recorded
  count_schedules.clear()
  h = (w * 3).realize()  # replayed: a buffer, its graph kept as its origin
  d = (w.detach() * 3).realize()
  p = (c * w).realize()
  assert not count_schedules and engine.is_realized(h.uop) and engine.is_realized(p.uop)
  assert d._origin is None and h._origin is not None
  ((h * h).sum() + (p * 2).sum() + d.sum()).backward()
  tw = torch.tensor(x, requires_grad=True)
  ((tw * 3) * (tw * 3)).sum().add((torch.tensor(y) * tw * 2).sum()).backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)
  # a view of a realized buffer (no kernel, no copy): the result is the input's buffer, not a fresh one, and its
  # graph (which holds that buffer) must not become its origin (backward would substitute it into itself)
  from tiny_tensor.live import _lazy_tensors, _live
  for _ in range(3):
    v = h.reshape(35).contiguous()
    _live(_lazy_tensors)  # (drops the dead reshape's entry: v is the one lazy tensor, the replay's case)
    v.realize()
    assert engine.buffer_view(v.uop)[0] is engine.buffer_view(h.uop)[0]
  w.grad = None
  (v * v).sum().backward()
  tw.grad = None
  (tw * 3).reshape(35).pow(2).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)
  b = Tensor(np.zeros((5, 7), np.float32)).realize()
  for k in range(1, 4):  # the same assign structure each time: replayed into b's own buffer
    buf = engine.buffer_view(b.uop)[0]
    b.assign(b + 1)
    _live(_lazy_tensors)
    b.realize()
    assert engine.buffer_view(b.uop)[0] is buf
    np.testing.assert_array_equal(b.numpy(), np.full((5, 7), k, np.float32))


def test_a_device_whose_renderer_changed_schedules_again(count_schedules, monkeypatch):
  # issue #39: a replay checks that each device it recorded is still the opened one with the same renderer (one dict
  # read per device). A new renderer drops the record: scheduled again, numbers against numpy, then replayed again
  from tiny_uop.plugins import Device
  x = _x(70, (4, 4))
  a = Tensor(x, device="PYTHON").realize()
  for _ in range(2): (a * 5).realize()
  count_schedules.clear()
  dev = Device["PYTHON"]
  monkeypatch.setattr(dev, "renderer", type(dev.renderer)(dev.arch))
  for _ in range(3): np.testing.assert_allclose((a * 5).realize().numpy(), x * 5, rtol=1e-6)
  assert len(count_schedules) == 1  # recorded again under the new renderer, then replayed


def test_a_renderer_set_on_the_cpu_device_schedules_again_without_a_flag_write(count_schedules, monkeypatch):
  # issue #39: a record checked at this ContextVar.version skips the renderer check; setting a device's renderer
  # (the CPU's `TargetRenderer` setter) moves the version, so the next realize checks, finds it new and schedules
  from tiny_uop.helpers import ContextVar
  from tiny_uop.plugins import Device
  x = _x(71, (4, 4))
  a = Tensor(x, device="CPU").realize()  # the CPU device in every session (the default may be a mock GPU)
  for _ in range(3): (a * 6).realize()
  count_schedules.clear()
  dev, ver = Device["CPU"], ContextVar.version
  monkeypatch.setattr(dev, "renderer", type(dev.renderer)(dev.renderer.arch))
  assert ContextVar.version != ver
  for _ in range(3): np.testing.assert_allclose((a * 6).realize().numpy(), x * 6, rtol=1e-6)
  assert len(count_schedules) == 1  # recorded again under the new renderer, then replayed


def test_a_scalar_ops_result_is_a_registered_lazy_tensor():
  # issue #39: `a + 1` makes its Tensor without the uop setter's checks; it must still be a lazy tensor realize knows
  # of (an assign to `a` realized later computes it from a's old values first, as if run eagerly) and a gradient
  # tensor when its input is one. Values vs numpy, gradients vs torch
  import torch
  x = _x(80, (3, 5))
  for _ in range(2):  # the second time through: every op replays
    a = Tensor(x).realize()
    b, c = a + 1, 2 - a
    a.assign(a * 0 + 5).realize()
    np.testing.assert_array_equal(b.numpy(), x + 1)
    np.testing.assert_array_equal(c.numpy(), 2 - x)
    np.testing.assert_array_equal(a.numpy(), np.full((3, 5), 5, np.float32))
  w = Tensor(x, requires_grad=True)
  y = (w * 3).realize()
  assert y.requires_grad
  (y * y).sum().backward()
  tw = torch.tensor(x, requires_grad=True)
  ((tw * 3) ** 2).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)


def test_the_scalar_constant_cache_is_keyed_by_value_dtype_shape_and_device():
  # issue #39: `a + c` finds the broadcast constant c in a cache keyed by (dtype, repr(c), device, shape), read from
  # the node's cached fields; -0.0 and 0.0, 1 and 1.0, and tensors of other shapes, dtypes and devices must each get
  # their own constant. Values (and zero signs) vs numpy
  x = _x(90, (3, 4))
  o, o2, op_ = Tensor(np.ones((3, 4), np.float32)), Tensor(np.ones((4, 3), np.float32)), Tensor(x, device="PYTHON")
  ai = Tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
  cases = [(lambda: o * -0.0, np.full((3, 4), -0.0, np.float32)), (lambda: o * 0.0, np.zeros((3, 4), np.float32)),
           (lambda: o + 1, np.full((3, 4), 2, np.float32)), (lambda: o2 + 1, np.full((4, 3), 2, np.float32)),
           (lambda: op_ + 1, x + 1),
           (lambda: o + 1.5, np.full((3, 4), 2.5, np.float32)), (lambda: ai + 1, ai.numpy() + 1),
           (lambda: ai * 3, ai.numpy() * 3)]
  for _ in range(3):
    for build, want in cases:
      got = build().realize().numpy()
      assert got.shape == want.shape
      np.testing.assert_array_equal(got, want)
      np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def _pending(t: Tensor) -> bool:
  """Whether `t` holds a replay's pending result (its buffer view not made yet)."""
  return t._u is None


def test_a_pending_result_frees_its_buffer_when_dropped_read_or_unread(count_schedules):
  import gc
  a = Tensor(_x(20, (32, 8)))
  (a * 3).realize()
  count_schedules.clear()
  gc.collect()
  base = GlobalCounters.mem_used
  r = (a * 3).realize()
  assert _pending(r) and GlobalCounters.mem_used == base + 32 * 8 * 4
  del r  # unread: its Buffer goes with the Tensor
  assert GlobalCounters.mem_used == base
  r = (a * 3).realize()
  v = r.uop  # read: the BUFFER node holds the Buffer now, and the Tensor the node
  assert not _pending(r) and engine.get_buffer(v.src[0]).is_allocated
  del r
  assert GlobalCounters.mem_used == base + 32 * 8 * 4  # the view read out keeps it alive
  np.testing.assert_array_equal(engine.get_buffer(v.src[0]).as_buffer().cast("f").tolist(),
                                (_x(20, (32, 8)) * 3).reshape(-1))
  del v
  assert GlobalCounters.mem_used == base
  assert not count_schedules


def test_a_pending_result_acts_as_a_realized_tensor(count_schedules):
  x = _x(21, (4, 6))
  a = Tensor(x)
  (a - 2).realize()
  count_schedules.clear()
  r = (a - 2).realize()
  assert _pending(r)
  assert r.realize() is r and _pending(r)  # realized already: nothing runs, nothing made
  np.testing.assert_array_equal(r.numpy(), x - 2)  # read through its Buffer
  assert _pending(r)
  assert (r.shape, r.dtype, r.device) == ((4, 6), a.dtype, a.device)
  assert engine.is_realized(r.uop)
  np.testing.assert_allclose((r * r + 1).numpy(), (x - 2) ** 2 + 1, rtol=1e-6)  # its view in a new graph
  # written in place: the pending view is made first, and the assign lands in its buffer
  s = (a - 2).realize()
  s.assign(s + 10).realize()
  np.testing.assert_allclose(s.numpy(), x + 8, rtol=1e-6)
  s += 1
  np.testing.assert_allclose(s.numpy(), x + 9, rtol=1e-6)
  assert not count_schedules or len(count_schedules) <= 3  # (the assigns' graphs are new structures)


def test_gradients_through_pending_results_match_torch():
  import torch
  x = _x(22, (5, 3))
  w = Tensor(x, requires_grad=True)
  for _ in range(2): (w * 2).realize()  # scheduled, then replayed
  h = (w * 2).realize()
  assert _pending(h)
  loss = (h * h + w).sum()
  loss.backward()
  tw = torch.tensor(x, requires_grad=True)
  th = tw * 2
  (th * th + tw).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)
  np.testing.assert_allclose(loss.numpy(), (th * th + tw).sum().detach().numpy(), rtol=1e-5)


def test_a_pending_result_reads_one_view_from_many_threads():
  import threading
  a = Tensor(_x(23, (8, 8)))
  for _ in range(2): (a + 5).realize()
  for _ in range(20):
    r = (a + 5).realize()
    assert _pending(r)
    got: list = []
    barrier = threading.Barrier(4)
    def read(r: Tensor = r, got: list = got, barrier: threading.Barrier = barrier) -> None:
      barrier.wait()
      got.append(r.uop)
    ts = [threading.Thread(target=read) for _ in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)
    np.testing.assert_array_equal(r.numpy(), _x(23, (8, 8)) + 5)


def test_a_jit_takes_pending_results_as_inputs():
  from tiny_tensor import TinyJit
  a = Tensor(_x(24, (6,)))
  for _ in range(2): (a * 4).realize()
  f = TinyJit(lambda t: (t + 1).realize())
  for _ in range(4):
    r = (a * 4).realize()
    assert _pending(r)
    np.testing.assert_allclose(f(r).numpy(), _x(24, (6,)) * 4 + 1, rtol=1e-6)


def test_a_live_view_of_a_buffer_exposes_nothing(monkeypatch):
  # a lazy view of a realized buffer (an ONNX runner's cached conv weight: a PERMUTE of its buffer) shares no value
  # with other graphs: realizing one that reads the view exposes nothing, and both read the right numbers
  w = _x(25, (4, 3))
  wt = Tensor(w)
  p = wt.permute(1, 0)
  exposed: list[int] = []
  real = engine.realize
  def counting(uops, expose=(), replay=True):
    exposed.append(len(expose))
    return real(uops, expose, replay)
  monkeypatch.setattr(engine, "realize", counting)
  other = (wt * 5).sum()  # a live lazy graph that does compute: what it shares is still exposed
  y = (p * 2 + 1)
  GlobalCounters.reset()
  y.realize()
  assert exposed == [0] and GlobalCounters.kernel_count == 1
  np.testing.assert_allclose(y.numpy(), w.T * 2 + 1, rtol=1e-6)
  np.testing.assert_array_equal(p.numpy(), w.T)
  z = (wt * 5).sum() + (wt * 5).sum().exp() * 0
  exposed.clear()
  z.realize()
  assert exposed and exposed[0] > 0  # shares (wt * 5).sum() with `other`
  np.testing.assert_allclose(other.numpy(), (w * 5).sum(), rtol=1e-5)
  np.testing.assert_allclose(z.numpy(), (w * 5).sum(), rtol=1e-5)
