"""Multi-device tensors on two (or three) devices of the default kind: sharded matmul and reductions equal one
device, allreduce ring and naive, gathers with to(), ops across different splits, and data-parallel training whose
weights equal single-device training."""
import numpy as np
import pytest
from tiny_tensor import Device, Tensor, nn
from tiny_tensor.multi import allreduce

rng = np.random.default_rng(5)


def _devs(n: int) -> tuple[str, ...]:
  """n devices of the default kind. Two always (a failure to open the second is an error); where the default kind has
  fewer than n > 2 (MOCK+NV presents two GPUs), the n-device case runs on CPU:0..n-1 instead."""
  base = Device.DEFAULT.split(":")[0]
  if n > 2 and Device.status(f"{base}:{n - 1}") is not None: base = "CPU"
  return tuple(f"{base}:{i}" for i in range(n))


@pytest.mark.parametrize("xa,wa", [(0, None), (1, 0), (None, 1), (0, 1)])
def test_sharded_matmul_and_reductions_equal_one_device(xa, wa):
  a, b = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
  D = _devs(2)
  x, w = Tensor(a).shard(D, axis=xa), Tensor(b).shard(D, axis=wa)
  y = x @ w
  assert y.device == tuple(Tensor.empty(1, device=d).device for d in D)
  np.testing.assert_allclose(y.numpy(), a @ b, atol=1e-5)
  np.testing.assert_allclose(y.sum().item(), (a @ b).sum(), atol=1e-4)
  np.testing.assert_allclose(y.max(0).numpy(), (a @ b).max(0), atol=1e-5)
  np.testing.assert_allclose(y.to(D[0]).numpy(), a @ b, atol=1e-5)


def test_ops_across_splits_and_movement():
  a = rng.standard_normal((4, 6)).astype(np.float32)
  D = _devs(2)
  x0, x1, xr = Tensor(a).shard(D, 0), Tensor(a).shard(D, 1), Tensor(a).shard(D)
  np.testing.assert_allclose((x0 + x1 * xr).numpy(), a + a * a, atol=1e-6)
  np.testing.assert_allclose(x0.T.numpy(), a.T)
  np.testing.assert_allclose(x0.reshape(2, 2, 6).sum(1).numpy(), a.reshape(2, 2, 6).sum(1), atol=1e-6)
  np.testing.assert_allclose(x0.reshape(24).numpy(), a.reshape(24))
  np.testing.assert_allclose(x0[1:3].numpy(), a[1:3])
  np.testing.assert_allclose(x0.pad(((1, 0), (0, 0))).numpy(), np.pad(a, ((1, 0), (0, 0))))
  np.testing.assert_allclose(x0.flip(0).numpy(), a[::-1])
  np.testing.assert_allclose(x0.softmax(0).numpy(), np.exp(a) / np.exp(a).sum(0), atol=1e-6)
  with pytest.raises(ValueError, match="evenly"): Tensor(a).shard(_devs(3), 0)
  with pytest.raises(RuntimeError, match="already"): x0.shard(D)


@pytest.mark.parametrize("mode", ["ring", "naive"])
@pytest.mark.parametrize("n", [2, 3])
def test_allreduce(mode, n):
  parts = rng.standard_normal((n, 5, 3)).astype(np.float32)
  t = Tensor(parts.reshape(n * 5, 3)).shard(_devs(n), 0)
  for op, want in (("sum", parts.sum(0)), ("max", parts.max(0))):
    got = allreduce(t, op, mode)
    assert got.uop.arg is None and len(got.uop.src) == n
    for shard in got.uop.src: np.testing.assert_allclose(Tensor(shard).numpy(), want, atol=1e-5)


def test_data_parallel_training_equals_one_device():
  X = rng.standard_normal((8, 5)).astype(np.float32)
  Y = rng.integers(0, 3, 8).astype(np.int32)
  D = _devs(2)

  def train(shard: bool) -> list[np.ndarray]:
    Tensor.manual_seed(0)
    layers = [nn.Linear(5, 7), nn.Linear(7, 3)]
    params = nn.state.get_parameters(layers)
    for p in params:
      p.realize()
      if shard: p.shard_(D).realize()
    opt = nn.optim.Adam(params, lr=0.05)
    x, y = Tensor(X), Tensor(Y)
    if shard: x, y = x.shard(D, 0), y.shard(D, 0)
    with Tensor.train():
      for _ in range(3):
        opt.zero_grad()
        loss = x.sequential([layers[0], Tensor.relu, layers[1]]).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
    return [p.numpy() for p in params]
  for a, b in zip(train(False), train(True)): np.testing.assert_allclose(a, b, atol=1e-5)


def test_tinyjit_on_sharded_inputs_and_outputs():
  import pickle
  from tiny_tensor import TinyJit
  from tiny_tensor.jit import JitError
  D = _devs(2)
  wn = rng.standard_normal((3, 4)).astype(np.float32)
  w = Tensor(wn).shard(D).realize()

  @TinyJit
  def f(x): return (x @ w).relu(), (x @ w).sum()  # a split result and an all-reduced one

  for _ in range(4):
    a = rng.standard_normal((6, 3)).astype(np.float32)
    y, s = f(Tensor(a).shard(D, 0))
    assert y.device == w.device and y.uop.arg == 0
    np.testing.assert_allclose(y.numpy(), np.maximum(a @ wn, 0), atol=1e-5)
    np.testing.assert_allclose(s.item(), (a @ wn).sum(), atol=1e-4)
  assert f.captured is not None and f.captured.n_inputs == 2  # one input per shard
  g = pickle.loads(pickle.dumps(f))
  a = rng.standard_normal((6, 3)).astype(np.float32)
  y, s = g(Tensor(a).shard(D, 0))
  np.testing.assert_allclose(y.numpy(), np.maximum(a @ wn, 0), atol=1e-5)
  with pytest.raises(JitError, match="sharding axis"): f(Tensor(np.zeros((6, 3), np.float32)).shard(D))


def test_tinyjit_data_parallel_step_equals_one_device():
  from tiny_tensor import TinyJit
  X = rng.standard_normal((4, 8, 5)).astype(np.float32)
  D = _devs(2)

  def train(shard: bool) -> np.ndarray:
    Tensor.manual_seed(1)
    lin = nn.Linear(5, 3)
    params = nn.state.get_parameters(lin)
    for p in params:
      p.realize()
      if shard: p.shard_(D).realize()
    opt = nn.optim.SGD(params, lr=0.1, momentum=0.9)

    @TinyJit
    def step(x):
      with Tensor.train():
        opt.zero_grad()
        loss = lin(x).tanh().square().mean()
        loss.backward()
        opt.step()
      return loss.realize()
    for xb in X: step(Tensor(xb).shard(D, 0) if shard else Tensor(xb))
    assert step.captured is not None
    return lin.weight.numpy()
  np.testing.assert_allclose(train(True), train(False), atol=1e-5)


def test_lazy_loss_read_after_the_step_sees_the_old_weights():
  # the step writes the replicated weight's shards; the lazy loss (over a realized sharded input, so no value of its
  # graph gets a buffer on the way) must still see the weights from before the write
  xs = rng.standard_normal((8, 5)).astype(np.float32)
  D = _devs(2)
  w = Tensor(np.full((5, 3), 0.1, np.float32), requires_grad=True).realize().shard(D).realize()
  opt = nn.optim.SGD([w], lr=0.1)
  x = Tensor(xs).shard(D, 0).realize()
  with Tensor.train():
    loss = (x @ w).tanh().square().mean()
    loss.backward()
    opt.step()
  np.testing.assert_allclose(loss.item(), np.square(np.tanh(xs @ np.full((5, 3), 0.1))).mean(), rtol=1e-5)
  assert not np.allclose(w.numpy(), 0.1)
