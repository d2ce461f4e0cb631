"""Autograd cases that ran without error and gave wrong gradients (issue #38), each against torch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor


def _close(a, b, tol=1e-4):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


def _rand(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ***** 1: a conv weight used twice in a chain *****

def test_conv_weight_twice_ones():
  w, x = Tensor.ones(1, 1, 1, 1, requires_grad=True), Tensor.ones(1, 1, 1, 1)
  x.conv2d(w).conv2d(w).sum().backward()
  wt = torch.ones(1, 1, 1, 1, requires_grad=True)
  F.conv2d(F.conv2d(torch.ones(1, 1, 1, 1), wt), wt).sum().backward()
  _close(w.grad.numpy(), wt.grad.numpy())


@pytest.mark.parametrize("n", [2, 3])
def test_conv_weight_chain_relu_bias(n):
  xn, wn, bn = _rand(2, 3, 7, 7), _rand(3, 3, 3, 3, seed=1), _rand(3, seed=2)
  x, w, b = Tensor(xn), Tensor(wn, requires_grad=True), Tensor(bn, requires_grad=True)
  xt, wt, bt = torch.tensor(xn), torch.tensor(wn, requires_grad=True), torch.tensor(bn, requires_grad=True)
  y, yt = x, xt
  for i in range(n):
    y, yt = y.conv2d(w, b, padding=i % 2), F.conv2d(yt, wt, bt, padding=i % 2)
    if i < n - 1: y, yt = y.relu(), yt.relu()
  y.sum().backward()
  yt.sum().backward()
  _close(w.grad.numpy(), wt.grad.numpy())
  _close(b.grad.numpy(), bt.grad.numpy())


def test_conv_weight_twice_stride_padding():
  xn, wn = _rand(1, 2, 9, 9), _rand(2, 2, 3, 3, seed=3)
  w, wt = Tensor(wn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  (Tensor(xn).conv2d(w, stride=2, padding=1).conv2d(w, padding=2) ** 2).sum().backward()
  (F.conv2d(F.conv2d(torch.tensor(xn), wt, stride=2, padding=1), wt, padding=2) ** 2).sum().backward()
  _close(w.grad.numpy(), wt.grad.numpy())


def test_conv_transpose_weight_twice():
  xn, wn = _rand(1, 2, 4, 4), _rand(2, 2, 3, 3, seed=4)
  w, wt = Tensor(wn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  Tensor(xn).conv_transpose2d(w, stride=2).conv_transpose2d(w).sum().backward()
  F.conv_transpose2d(F.conv_transpose2d(torch.tensor(xn), wt, stride=2), wt).sum().backward()
  _close(w.grad.numpy(), wt.grad.numpy())


# ***** 2: parameters built from constants are identities *****

def test_const_param_vs_equal_const():
  w = Tensor(2.0, requires_grad=True)
  (Tensor([1.0, 2.0, 3.0]) * w + Tensor([1.0, 2.0, 3.0]) * 2.0).sum().backward()
  wt = torch.tensor(2.0, requires_grad=True)
  (torch.tensor([1.0, 2.0, 3.0]) * wt + torch.tensor([1.0, 2.0, 3.0]) * 2.0).sum().backward()
  _close(w.grad.numpy(), wt.grad.numpy())


def test_two_equal_const_params():
  a, c = Tensor(0.5, requires_grad=True), Tensor(0.5, requires_grad=True)
  (a * 3 + c * 5).backward()
  at, ct = torch.tensor(0.5, requires_grad=True), torch.tensor(0.5, requires_grad=True)
  (at * 3 + ct * 5).backward()
  _close(a.grad.numpy(), at.grad.numpy())
  _close(c.grad.numpy(), ct.grad.numpy())


def test_zeros_param_vs_relu_of_const_graph():
  x, b = Tensor([1.0, -1.0, 3.0]), Tensor.zeros(3, requires_grad=True)
  ((x + b) * (x * 2).relu()).sum().backward()
  xt, bt = torch.tensor([1.0, -1.0, 3.0]), torch.zeros(3, requires_grad=True)
  ((xt + bt) * (xt * 2).relu()).sum().backward()
  _close(b.grad.numpy(), bt.grad.numpy())


@pytest.mark.parametrize("other", [False, True])
def test_realized_ones_param_is_a_target(other):
  g = Tensor.ones(3, requires_grad=True).realize()
  x = Tensor([1.0, -2.0, 3.0])
  loss = (x * g).sum()
  if other: loss = loss + (Tensor([4.0, 5.0, 6.0], requires_grad=True) * 2).sum()
  loss.backward()
  gt = torch.ones(3, requires_grad=True)
  (torch.tensor([1.0, -2.0, 3.0]) * gt).sum().backward()
  assert g.grad is not None
  _close(g.grad.numpy(), gt.grad.numpy())


def test_arange_param_is_its_own():
  a = Tensor.arange(3.0, requires_grad=True)
  (a * 2 + Tensor.arange(3.0) * 3).sum().backward()
  at = torch.arange(3.0, requires_grad=True)
  (at * 2 + torch.arange(3.0) * 3).sum().backward()
  _close(a.grad.numpy(), at.grad.numpy())


# ***** 3: smooth functions at 0, at kinks and at extremes *****

_PTS = [0.0, -3.0, 3.0, 6.0, -1.0, 1.0, 1e-3, -1e-3, 20.0, -20.0, 100.0, -100.0, 1000.0, -1000.0]
_ACTS = {
  "softplus": (lambda t: t.softplus(), F.softplus),
  "softplus_beta2": (lambda t: t.softplus(2.0), lambda t: F.softplus(t, 2.0)),
  "logsigmoid": (lambda t: t.logsigmoid(), F.logsigmoid),
  "elu": (lambda t: t.elu(), F.elu), "elu_alpha2": (lambda t: t.elu(2.0), lambda t: F.elu(t, 2.0)),
  "erf": (lambda t: t.erf(), torch.erf),
  "gelu_tanh": (lambda t: t.gelu(), lambda t: F.gelu(t, approximate="tanh")),
  "gelu_none": (lambda t: t.gelu("none"), F.gelu),
  "silu": (lambda t: t.silu(), F.silu), "mish": (lambda t: t.mish(), F.mish),
  "softsign": (lambda t: t.softsign(), F.softsign), "hardswish": (lambda t: t.hardswish(), F.hardswish),
  "hardsigmoid": (lambda t: t.hardsigmoid(), F.hardsigmoid), "relu6": (lambda t: t.relu6(), F.relu6),
  "hardtanh": (lambda t: t.hardtanh(), F.hardtanh), "celu": (lambda t: t.celu(), F.celu),
  "celu_alpha2": (lambda t: t.celu(2.0), lambda t: F.celu(t, 2.0)),
  "selu": (lambda t: t.selu(1.6732632423543772, 1.0507009873554805), F.selu),
  "leaky_relu": (lambda t: t.leaky_relu(), F.leaky_relu), "relu": (lambda t: t.relu(), F.relu),
  "sigmoid": (lambda t: t.sigmoid(), torch.sigmoid), "tanh": (lambda t: t.tanh(), torch.tanh),
  "abs": (lambda t: t.abs(), torch.abs), "asinh": (lambda t: t.asinh(), torch.asinh),
  "bce_logits": (lambda t: t.binary_crossentropy_logits(Tensor([0.3] * len(_PTS)), reduction="none"),
                 lambda t: F.binary_cross_entropy_with_logits(t, torch.full((len(_PTS),), 0.3), reduction="none")),
  "logsumexp": (lambda t: t[:12].reshape(3, 4).logsumexp(1), lambda t: t[:12].reshape(3, 4).logsumexp(1)),
}


@pytest.mark.parametrize("name", list(_ACTS))
def test_activation_value_and_gradient(name):
  tf, rf = _ACTS[name]
  x = Tensor(np.array(_PTS, np.float32), requires_grad=True)
  out = tf(x)
  out.sum().backward()
  xt = torch.tensor(_PTS, requires_grad=True)
  ref = rf(xt)
  ref.sum().backward()
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)


# ***** 4: a realized contiguous copy of a reshaped parameter *****

def test_realized_contiguous_reshape_of_param():
  p = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  q = p.reshape(3, 1).contiguous().realize()
  (q * Tensor([[1.0], [2.0], [3.0]])).sum().backward()
  pt = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
  (pt.reshape(3, 1).contiguous() * torch.tensor([[1.0], [2.0], [3.0]])).sum().backward()
  _close(p.grad.numpy(), pt.grad.numpy())


# ***** 5: normalize with p <= 0 *****

@pytest.mark.parametrize("p", [-1, -2, -0.5, 0, 0.5, 2, 3])
def test_normalize_p(p):
  xn = np.array([[1.0, -2.0, 0.5], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
  x = Tensor(xn, requires_grad=True)
  out = x.normalize(p=p)
  ref = F.normalize(torch.tensor(xn), p=p)
  _close(out.numpy(), ref.numpy())
  if p > 0:  # torch's gradient is NaN at the zero row for p <= 0 (|0|**p is inf)
    (out * Tensor(_rand(3, 3))).sum().backward()
    xt = torch.tensor(xn, requires_grad=True)
    (F.normalize(xt, p=p) * torch.tensor(_rand(3, 3))).sum().backward()
    _close(x.grad.numpy(), xt.grad.numpy())



# ***** 5: odd functions near 0 and past x**2's overflow, relative to torch in float64 *****

_TINY = [1e-30, 1e-12, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 0.03, 0.032, -1e-7, -0.02, 0.5, 3.0]


@pytest.mark.parametrize("name", ["tanh", "sinh", "asinh", "atanh", "erf"])
@pytest.mark.parametrize("npdt", [np.float32, np.float64])
def test_odd_functions_keep_relative_precision_near_0(name, npdt):
  """2*sigmoid(2x)-1 gave tanh(1e-6) = 1.07e-6 and tanh(1e-8) = 0; erf's 1.5e-7 absolute error was the whole value
  below ~1e-7; -0.0 lost its sign. Within a few ulp of torch's float64 result, relative, signs of zeros kept."""
  x = np.array([v for v in _TINY if name != "atanh" or abs(v) < 1] + [-0.0], npdt)
  got = getattr(Tensor(x), name)().numpy()
  want = getattr(torch, name)(torch.tensor(x, dtype=torch.float64)).numpy()
  rtol = {np.float32: 2e-6, np.float64: 1e-13}[npdt] if name != "erf" or abs(x).max() < 2 ** -5 else 6e-6
  small = np.abs(x) < 2 ** -5  # where the series runs; above, the formula's own (absolute) error
  np.testing.assert_allclose(got[small], want[small], rtol=rtol, atol=0)
  np.testing.assert_allclose(got, want, rtol=1e-5 if npdt == np.float32 else 4e-6, atol=2e-7)
  assert (np.signbit(got) == np.signbit(want)).all()


def test_asinh_acosh_past_the_square_overflow_and_hardswish_at_minus_inf():
  x = np.array([1e19, -1e19, 1e30, -3e38, 2.0 ** 27 + 8], np.float32)
  np.testing.assert_allclose(Tensor(x).asinh().numpy(), torch.asinh(torch.tensor(x, dtype=torch.float64)).numpy(),
                             rtol=1e-6)
  ax = np.abs(x)
  np.testing.assert_allclose(Tensor(ax).acosh().numpy(), torch.acosh(torch.tensor(ax, dtype=torch.float64)).numpy(),
                             rtol=1e-6)
  h = np.array([-np.inf, -1e30, -3.0, -88.0, np.inf, np.nan, 1.0], np.float32)
  got, want = Tensor(h).hardswish().numpy(), F.hardswish(torch.tensor(h)).numpy()
  np.testing.assert_array_equal(got, want)  # NaN at -inf (-inf * 0), -0.0 below -3, as torch
  assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()
