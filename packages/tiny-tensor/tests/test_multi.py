"""Multi-device tensors on two (or three) devices of the default kind: sharded matmul and reductions equal one
device, allreduce ring and naive, gathers with to(), ops across different splits, and data-parallel training whose
weights equal single-device training."""
import numpy as np
import pytest
from tiny_tensor import Device, Tensor, nn
from tiny_tensor.multi import allreduce

rng = np.random.default_rng(5)


def _devs(n: int) -> tuple[str, ...]:
  base = Device.DEFAULT.split(":")[0]
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
