"""nn layers against torch.nn with the same weights (forward, and BatchNorm's running statistics), plus inits."""
import math

import numpy as np
import pytest

from tiny_uop import dtypes
from tiny_tensor import Tensor, nn

torch = pytest.importorskip("torch")


def _copy(ours, theirs, names):
  for n in names:
    src = getattr(theirs, n)
    if src is None: continue
    dst = getattr(ours, n)
    assert tuple(dst.shape) == tuple(src.shape), (n, dst.shape, src.shape)
    setattr(ours, n, Tensor(src.detach().numpy().copy()))


def _x(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check(ours, theirs, x, rtol=1e-4, atol=1e-5):
  got = ours(Tensor(x)).numpy()
  want = theirs(torch.tensor(x)).detach().numpy()
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_linear():
  for bias in (True, False):
    t = torch.nn.Linear(5, 3, bias=bias)
    o = nn.Linear(5, 3, bias=bias)
    _copy(o, t, ["weight", "bias"])
    _check(o, t, _x(4, 5))
    assert (o.bias is None) == (not bias)


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1}, {"padding": "same", "dilation": 2}, {"groups": 2}])
def test_conv2d(kw):
  t = torch.nn.Conv2d(4, 6, 3, **kw)
  o = nn.Conv2d(4, 6, 3, **kw)
  _copy(o, t, ["weight", "bias"])
  _check(o, t, _x(2, 4, 9, 9))


def test_conv1d_and_transpose():
  t, o = torch.nn.Conv1d(3, 4, 3, padding=1), nn.Conv1d(3, 4, 3, padding=1)
  _copy(o, t, ["weight", "bias"])
  _check(o, t, _x(2, 3, 10))
  t2, o2 = torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), \
    nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1)
  _copy(o2, t2, ["weight", "bias"])
  _check(o2, t2, _x(2, 3, 5, 5))


def test_batchnorm_train_then_eval():
  t, o = torch.nn.BatchNorm2d(3, momentum=0.2), nn.BatchNorm2d(3, momentum=0.2)
  t.weight.data = torch.tensor(_x(3, seed=1))
  t.bias.data = torch.tensor(_x(3, seed=2))
  _copy(o, t, ["weight", "bias"])
  t.train()
  with Tensor.train():
    for i in range(3):
      x = _x(4, 3, 5, 5, seed=10 + i) * 2 + 1
      got = o(Tensor(x))
      Tensor.realize(got, o.running_mean, o.running_var, o.num_batches_tracked)
      np.testing.assert_allclose(got.numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(o.running_mean.numpy(), t.running_mean.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(o.running_var.numpy(), t.running_var.numpy(), rtol=1e-5, atol=1e-6)
  assert o.num_batches_tracked.item() == 3
  t.eval()
  _check(o, t, _x(2, 3, 5, 5, seed=20), atol=1e-4)  # eval mode uses the running statistics


@pytest.mark.parametrize("shape", [(5,), (4, 5)])
def test_layernorm(shape):
  t, o = torch.nn.LayerNorm(shape), nn.LayerNorm(shape)
  t.weight.data, t.bias.data = torch.tensor(_x(*shape, seed=1)), torch.tensor(_x(*shape, seed=2))
  _copy(o, t, ["weight", "bias"])
  _check(o, t, _x(3, 4, 5) * 3 + 2)
  with pytest.raises(ValueError, match="last dims"): o(Tensor(_x(3, 6)))


def test_layernorm2d_groupnorm_instancenorm():
  x = _x(2, 4, 3, 3) * 2 + 1
  o = nn.LayerNorm2d(4)
  want = torch.nn.functional.layer_norm(torch.tensor(x).permute(0, 2, 3, 1), (4,)).permute(0, 3, 1, 2).numpy()
  np.testing.assert_allclose(o(Tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)
  t, g = torch.nn.GroupNorm(2, 4), nn.GroupNorm(2, 4)
  t.weight.data, t.bias.data = torch.tensor(_x(4, seed=1)), torch.tensor(_x(4, seed=2))
  _copy(g, t, ["weight", "bias"])
  _check(g, t, x)
  ti, i = torch.nn.InstanceNorm2d(4, affine=True), nn.InstanceNorm(4)
  ti.weight.data, ti.bias.data = torch.tensor(_x(4, seed=3)), torch.tensor(_x(4, seed=4))
  _copy(i, ti, ["weight", "bias"])
  _check(i, ti, x)
  with pytest.raises(ValueError, match="num_groups"): nn.GroupNorm(3, 4)


def test_rmsnorm():
  t, o = torch.nn.RMSNorm(6, eps=1e-6), nn.RMSNorm(6)
  t.weight.data = torch.tensor(_x(6, seed=1))
  _copy(o, t, ["weight"])
  _check(o, t, _x(3, 6))


def test_embedding():
  t, o = torch.nn.Embedding(7, 4), nn.Embedding(7, 4)
  _copy(o, t, ["weight"])
  idx = np.array([[0, 3, 6], [2, 2, 1]], dtype=np.int32)
  np.testing.assert_allclose(o(Tensor(idx)).numpy(), t(torch.tensor(idx, dtype=torch.long)).detach().numpy())
  with pytest.raises(TypeError, match="integer"): o(Tensor([1.0]))


def test_lstmcell():
  t, o = torch.nn.LSTMCell(3, 5), nn.LSTMCell(3, 5)
  _copy(o, t, ["weight_ih", "weight_hh", "bias_ih", "bias_hh"])
  x, h, c = _x(2, 3), _x(2, 5, seed=1), _x(2, 5, seed=2)
  oh, oc = o(Tensor(x), (Tensor(h), Tensor(c)))
  th, tc = t(torch.tensor(x), (torch.tensor(h), torch.tensor(c)))
  np.testing.assert_allclose(oh.numpy(), th.detach().numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(oc.numpy(), tc.detach().numpy(), rtol=1e-4, atol=1e-5)
  h0, _ = o(Tensor(x))  # no state: zeros
  np.testing.assert_allclose(h0.numpy(), t(torch.tensor(x))[0].detach().numpy(), rtol=1e-4, atol=1e-5)


def test_inits_follow_the_bounds():
  lin = nn.Linear(64, 32)
  w = lin.weight.numpy()
  bound = 1 / math.sqrt(64)
  assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound and abs(w.mean()) < 0.1 * bound
  conv = nn.Conv2d(4, 8, 3)
  assert conv.weight.shape == (8, 4, 3, 3) and np.abs(conv.weight.numpy()).max() <= 1 / math.sqrt(36)
  assert nn.ConvTranspose2d(4, 6, 3, groups=2).weight.shape == (4, 3, 3, 3)
  bn = nn.BatchNorm(3)
  assert bn.weight.tolist() == [1.0] * 3 and bn.running_var.tolist() == [1.0] * 3
  assert bn.num_batches_tracked.dtype == dtypes.int64  # torch.nn.BatchNorm2d: torch.long
  assert nn.BatchNorm(3, affine=False).weight is None
  with pytest.raises(ValueError, match="'same'"): nn.Conv2d(1, 1, 3, padding="valid")
