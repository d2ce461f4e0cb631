"""TinyJit: capture/replay against eager execution, input checks, side-effect detection, Variables, pickling."""
import pickle

import numpy as np
import pytest

from tiny_uop import Variable
from tiny_tensor import Context, GlobalCounters, Tensor, TinyJit, nn
from tiny_tensor.jit import JitError
from tiny_tensor.nn.state import get_parameters


def _t(*shape, seed=0):
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_replay_matches_numpy_with_new_inputs():
  @TinyJit
  def f(a, b): return (a * 2 + b).realize()
  for i in range(6):
    a, b = _t(3, 4, seed=i), _t(3, 4, seed=100 + i)
    np.testing.assert_allclose(f(a, b).numpy(), a.numpy() * 2 + b.numpy(), rtol=1e-6)
  assert f.cnt == 6 and f.captured is not None and f.captured.kernel_count >= 1


def test_replay_runs_no_scheduler(monkeypatch):
  @TinyJit
  def f(a): return (a + 1).sum().realize()
  for i in range(2): f(_t(8, seed=i))
  import tiny_codegen.schedule as sched_mod
  x = _t(8, seed=7)
  x_np = x.numpy()
  real, scheduled = sched_mod.create_schedule, []
  monkeypatch.setattr(sched_mod, "create_schedule", lambda *a, **k: scheduled.append(1) or real(*a, **k))
  GlobalCounters.reset()
  out = f(x)
  assert not scheduled and GlobalCounters.kernel_count == f.captured.kernel_count
  np.testing.assert_allclose(out.numpy(), (x_np + 1).sum(), rtol=1e-5)


def test_returned_tensor_is_overwritten_in_place():
  @TinyJit
  def f(a): return (a * 3).realize()
  outs = [f(Tensor([float(i)] * 2)) for i in range(4)]
  assert outs[2] is outs[3]  # replays return the captured tensors
  assert outs[3].tolist() == [9.0, 9.0]


def test_jit_disabled_runs_eagerly():
  calls = []

  @TinyJit
  def f(a):
    calls.append(1)
    return (a + 1).realize()
  with Context(JIT=0):
    for i in range(4): assert f(Tensor([float(i)])).tolist() == [i + 1.0]
  assert len(calls) == 4 and f.captured is None


def test_reset_recaptures_new_shapes():
  @TinyJit
  def f(a): return (a * 2).realize()
  for _ in range(3): f(_t(4))
  with pytest.raises(JitError, match=r"changed shape: captured \(4,\), now \(5,\)"): f(_t(5))
  f.reset()
  for i in range(3): np.testing.assert_allclose(f(_t(5, seed=i)).numpy(), _t(5, seed=i).numpy() * 2)


def test_input_changes_are_errors():
  @TinyJit
  def f(a, b): return (a + b).realize()
  for _ in range(3): f(_t(4), _t(4))
  with pytest.raises(JitError, match="dtype"): f(_t(4), Tensor(np.ones(4, np.int32)))
  with pytest.raises(JitError, match="arguments changed"): f(_t(4), b=_t(4))
  with pytest.raises(JitError, match="arguments changed"): f(_t(4), 3.0)


def test_plain_python_argument_change_is_an_error():
  @TinyJit
  def f(a, scale): return (a * scale).realize()
  for _ in range(3): f(_t(4), 2.0)
  with pytest.raises(JitError, match="non-Tensor argument changed"): f(_t(4), 3.0)
  with pytest.raises(JitError, match="numpy array"): TinyJit(lambda a: (a + 1).realize())(np.ones(3))


def test_non_tensor_return_is_an_error():
  @TinyJit
  def f(a): return (a + 1).realize(), 5
  f(_t(3))
  with pytest.raises(JitError, match=r"return value\[1\] is a int"): f(_t(3))


def test_reading_data_during_capture_is_an_error():
  @TinyJit
  def f(a):
    s = (a * 2).sum()
    return (a * s.item()).realize()
  f(_t(3))
  with pytest.raises(JitError, match=r"reads tensor data into Python"): f(_t(3))
  # the engine is restored after the failed capture
  assert (Tensor([1.0, 2.0]) + 1).tolist() == [2.0, 3.0]


def test_returning_a_view_of_an_input_is_an_error():
  # (the input itself may be returned: test_setitem_semantics.py::test_tinyjit_sets_an_item_of_its_input_and_returns_it)
  @TinyJit
  def f(a, b):
    (b * 2).realize()
    return a.reshape(1, 2)
  f(_t(2), _t(2))
  with pytest.raises(JitError, match="returns a view of one of its inputs"): f(_t(2), _t(2))


def test_duplicate_inputs_and_empty_function():
  @TinyJit
  def f(a, b): return (a + b).realize()
  x = _t(3)
  with pytest.raises(JitError, match="passed to TinyJit twice"): f(x, x)

  @TinyJit
  def g(a): return None
  g(_t(2))
  with pytest.raises(JitError, match="captured no kernel"): g(_t(2))


def test_nested_jit_is_an_error():
  inner = TinyJit(lambda a: (a + 1).realize())

  @TinyJit
  def outer(a):
    inner.cnt = 1  # make the inner one capture now
    return inner(a)
  outer(_t(2))
  with pytest.raises(JitError, match="nested"): outer(_t(2))


def test_replaying_a_jit_inside_another_capture_is_an_error():
  # the outer capture can't see a replay's kernels: it would silently replay a stale inner result
  inner = TinyJit(lambda a: (a * 2).realize())
  x = _t(4).realize()
  for _ in range(3): inner(x)  # inner now replays, with x as its last input (the fast path)

  @TinyJit
  def outer(a): return (inner(a) + 1).realize()
  assert outer(x).tolist() == (x.numpy() * 2 + 1).tolist()  # the eager call: a plain replay, fine
  with pytest.raises(JitError, match="nested"): outer(x)
  with pytest.raises(JitError, match="nested"): outer(_t(4, seed=1))
  assert inner(x).tolist() == (x.numpy() * 2).tolist()  # outside any capture it still replays


def test_symbolic_variable_argument():
  # the Variable's value reaches the kernel at replay: a different bound value changes the result
  @TinyJit
  def f(a, v): return (a * Tensor.from_uop(v).cast(a.dtype)).realize()
  vv = Variable("k", 1, 10)
  for i in range(1, 7):
    np.testing.assert_allclose(f(_t(4), vv.bind(i)).numpy(), _t(4).numpy() * i, rtol=1e-6)


def test_method_jit_and_kwargs():
  class M:
    def __init__(self): self.w = Tensor([1.0, 2.0, 3.0]).realize()
    @TinyJit
    def __call__(self, x, *, bias): return (x * self.w + bias).realize()
  m = M()
  for i in range(4):
    x = Tensor([float(i)] * 3)
    assert m(x, bias=Tensor([1.0, 1.0, 1.0])).tolist() == [i + 1.0, 2 * i + 1.0, 3 * i + 1.0]


def test_pickle_captured_jit_replays():
  w = Tensor([1.0, -1.0, 2.0]).realize()

  @TinyJit
  def f(x): return (x * w).sum().realize()
  for i in range(3): f(Tensor([float(i)] * 3))
  g = pickle.loads(pickle.dumps(f))
  assert g(Tensor([1.0, 2.0, 3.0])).item() == pytest.approx(1 - 2 + 6)
  with pytest.raises(JitError, match="before it captured"): pickle.dumps(TinyJit(lambda x: x))


class _MLP:
  def __init__(self):
    self.l1, self.l2 = nn.Linear(6, 16), nn.Linear(16, 3)
  def __call__(self, x): return self.l2(self.l1(x).relu())


def _train(jit: bool, steps: int) -> tuple[list[float], list[np.ndarray]]:
  Tensor.manual_seed(3)
  model = _MLP()
  opt = nn.optim.Adam(get_parameters(model), lr=0.01)
  rng = np.random.default_rng(0)
  X, Y = rng.standard_normal((steps, 8, 6)).astype(np.float32), rng.integers(0, 3, (steps, 8)).astype(np.int32)

  def step(x, y):
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()
  fn = TinyJit(step) if jit else step
  losses = [fn(Tensor(X[i]), Tensor(Y[i])).item() for i in range(steps)]
  return losses, [p.numpy() for p in get_parameters(model)]


def test_adam_training_jit_is_bit_identical_to_eager():
  eager_loss, eager_w = _train(False, 100)
  jit_loss, jit_w = _train(True, 100)
  assert eager_loss == jit_loss  # bit-identical, every step
  for a, b in zip(eager_w, jit_w): np.testing.assert_array_equal(a, b)
  assert jit_loss[-1] < jit_loss[0]


def test_same_inputs_fast_path_then_new_inputs():
  @TinyJit
  def f(a): return (a * a).realize()
  x, y = Tensor([2.0, 3.0]).realize(), Tensor([4.0, 5.0]).realize()
  for _ in range(5): assert f(x).tolist() == [4.0, 9.0]  # replays with the very same input take the fast path
  assert f(y).tolist() == [16.0, 25.0]
  x.assign(Tensor([6.0, 7.0])).realize()  # same buffer, new contents
  assert f(x).tolist() == [36.0, 49.0]
  with pytest.raises(JitError, match="shape"): f(Tensor([1.0, 2.0, 3.0]))


def test_device_graph_contract_batches_the_kernels_once_and_replays_them(monkeypatch):
  # a device's `graph` class gets the captured kernels once (docs/PIPELINE.md §7) and every replay after that
  from tiny_uop.plugins import Device
  built, replays = [], []

  class RecordingGraph:
    def __init__(self, dev, kernels):
      built.append(len(kernels))
      self.kernels = kernels

    def __call__(self, inputs, var_vals):
      replays.append(dict(var_vals))
      for k in self.kernels:
        gs, ls = k.launch(var_vals)
        k.prg(*[inputs[b] if isinstance(b, int) else b for b in k.bufs], global_size=gs, local_size=ls,
              vals=tuple(var_vals.get(n, v) for n, v in k.vars))
  monkeypatch.setattr(Device[Device.DEFAULT], "graph", RecordingGraph)

  @TinyJit
  def f(a, b, v): return ((a * Tensor.from_uop(v, device=a.device).cast(a.dtype)).contiguous() + b).sum().realize()
  vv = Variable("m", 1, 20)
  for i in range(5):
    a, b = _t(6, seed=i), _t(6, seed=40 + i)
    np.testing.assert_allclose(f(a, b, vv.bind(i + 1)).numpy(), (a.numpy() * (i + 1) + b.numpy()).sum(), rtol=1e-5)
  assert built == [f.captured.kernel_count] and f.captured.kernel_count >= 2
  assert [r["m"] for r in replays] == [3, 4, 5]
