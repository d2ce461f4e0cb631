"""The scheduler through tiny-tensor's Tensor (cross-package: skipped when tiny-tensor is not installed).

Kernel counts of issue #4's table for graphs exactly as Tensor builds them, and the realized values vs numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

from tiny_uop import Ops

from tiny_codegen.schedule import schedule as schedule_mod

tt = pytest.importorskip("tiny_tensor")
Tensor = tt.Tensor
pytestmark = pytest.mark.integration

rng = np.random.default_rng(1)
A, B = rng.standard_normal((6, 6)).astype(np.float32), rng.standard_normal((6, 6)).astype(np.float32)
W, BIAS = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _layernorm(x):
  return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


CASES = {  # name: (build(a, b, w, bias), numpy reference, max kernels)
  "chain": (lambda a, b, w, bias: ((a + b) * a - 2).exp(), lambda: np.exp((A + B) * A - 2), 1),
  "sum": (lambda a, b, w, bias: (a + b).sum(), lambda: (A + B).sum(), 1),
  "sum_axis1": (lambda a, b, w, bias: (a * b).sum(axis=1), lambda: (A * B).sum(1), 1),
  "matmul_bias_relu": (lambda a, b, w, bias: (a @ w + bias).relu(), lambda: np.maximum(A @ W + BIAS, 0), 1),
  "transpose": (lambda a, b, w, bias: a.T.contiguous(), lambda: A.T, 1),
  "flip": (lambda a, b, w, bias: a.flip(0) + a, lambda: A[::-1] + A, 1),
  "pad": (lambda a, b, w, bias: a.pad(((1, 1), (2, 2))) * 2, lambda: np.pad(A, ((1, 1), (2, 2))) * 2, 1),
  "slice": (lambda a, b, w, bias: a[1:3], lambda: A[1:3], 0),
  "arange": (lambda a, b, w, bias: a + Tensor.arange(6), lambda: A + np.arange(6), 1),
  "eye": (lambda a, b, w, bias: a * Tensor.eye(6), lambda: A * np.eye(6), 1),
  "softmax": (lambda a, b, w, bias: a.softmax(-1), lambda: _softmax(A), 2),
  "layernorm": (lambda a, b, w, bias: a.layernorm(), lambda: _layernorm(A), 2),
  "cumsum": (lambda a, b, w, bias: a.cumsum(1), lambda: np.cumsum(A, 1), 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tensor_kernel_counts_and_values(name):
  build, expect, max_kernels = CASES[name]
  a, b, w, bias = Tensor(A), Tensor(B), Tensor(W), Tensor(BIAS)
  Tensor.realize(a, b, w, bias)
  out = build(a, b, w, bias)
  sched = out.schedule()
  assert sum(c.src[0].op is Ops.SINK for c in sched.calls) <= max_kernels
  np.testing.assert_allclose(out.numpy(), expect(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_tensor_arange_has_no_loop(n):
  # Tensor.arange sums a triangle of ones; the scheduler turns that sum into index arithmetic
  out = Tensor.arange(n) * 3 + 1
  sched = out.schedule()
  assert len(sched.calls) == 1 and not any(u.op is Ops.REDUCE for u in sched.calls[0].src[0].toposort())
  np.testing.assert_equal(out.numpy(), np.arange(n) * 3 + 1)


def test_training_step_schedules_once():
  def step(x: np.ndarray) -> float:
    w = Tensor(W, requires_grad=True)
    loss = (Tensor(x) @ w).relu().sum()
    loss.backward()
    return float(w.grad.numpy().sum())
  step(A)
  n = len(schedule_mod._cache)
  got = step(B)
  assert len(schedule_mod._cache) == n  # same structure, new buffers: the cached schedule is reused
  np.testing.assert_allclose(got, (B.T @ ((B @ W) > 0).astype(np.float32)).sum(), rtol=1e-4)


def test_assign_through_tensor():
  a = Tensor(A.copy()).realize()
  old = (a * 2).contiguous()
  a.assign(a + 1)
  Tensor.realize(old, a)
  np.testing.assert_allclose(a.numpy(), A + 1, rtol=1e-6)
  np.testing.assert_allclose(old.numpy(), A * 2, rtol=1e-6)


def _small_resnet(make, tiny: bool, conv, maxpool, rng):
  """A two-block ResNet step (conv, batchnorm, relu, maxpool, strided block with a 1x1 shortcut, mean, linear), for
  tiny (`tiny`) or torch; `make(array, is_param)` makes a tensor. Returns (loss, params)."""
  params = []

  def p(*shape):
    params.append(make(rng.standard_normal(shape).astype(np.float32) * 0.2, True))
    return params[-1]

  def mean(x, axis):
    return x.mean(axis, keepdim=True) if tiny else x.mean(dim=axis, keepdim=True)

  def bn(x, c):
    w, b = p(c), p(c)
    xc = x - mean(x, (0, 2, 3))
    return xc * (mean(xc * xc, (0, 2, 3)) + 1e-5).rsqrt() * w.reshape(1, c, 1, 1) + b.reshape(1, c, 1, 1)

  x = make(rng.standard_normal((2, 3, 10, 10)).astype(np.float32), False)
  x = maxpool(bn(conv(x, p(8, 3, 3, 3), 1, 1), 8).relu())
  out = bn(conv(bn(conv(x, p(16, 8, 3, 3), 2, 1), 16).relu(), p(16, 16, 3, 3), 1, 1), 16)
  x = (out + bn(conv(x, p(16, 8, 1, 1), 2, 0), 16)).relu()
  logits = mean(x, (2, 3)).reshape(2, 16) @ p(16, 5)
  return (logits.exp().sum(-1).log() - logits[:, 0]).mean(), params


@pytest.mark.slow
def test_small_resnet_gradients_match_torch():
  torch = pytest.importorskip("torch")
  F = torch.nn.functional
  loss, params = _small_resnet(lambda a, is_param: Tensor(a).requires_grad_() if is_param else Tensor(a), True,
                               lambda x, w, s, pd: x.conv2d(w, stride=s, padding=pd), lambda x: x.max_pool2d((2, 2)),
                               np.random.default_rng(3))
  loss.backward()
  Tensor.realize(loss, *[t.grad for t in params])
  ref_loss, ref_params = _small_resnet(lambda a, is_param: torch.tensor(a).requires_grad_(is_param), False,
                                       lambda x, w, s, pd: F.conv2d(x, w, stride=s, padding=pd),
                                       lambda x: F.max_pool2d(x, 2), np.random.default_rng(3))
  ref_loss.backward()
  np.testing.assert_allclose(loss.numpy(), ref_loss.item(), rtol=1e-4)
  for t, r in zip(params, ref_params):
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=2e-3, atol=2e-4)


def test_broadcast_exp_gets_its_own_buffer():
  """Attention's P@V: the softmax's exp, broadcast over the head dim, is realized once instead of evaluated in the
  matmul once per head dim (a 32-token prefill's P@V went from 4 ms to ~0.25 ms per layer); an exp that isn't
  broadcast stays fused (softmax is still 2 kernels)."""
  heads, t, d = 4, 8, 16
  q, k, v = (rng.standard_normal((heads, t, d)).astype(np.float32) for _ in range(3))
  s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
  want = _softmax(s) @ v
  tq, tk, tv = (Tensor(x).realize() for x in (q, k, v))
  out = ((tq @ tk.transpose(1, 2)) / np.sqrt(d)).softmax(-1) @ tv
  kernels = [c.src[0] for c in out.schedule().calls if c.src[0].op is Ops.SINK]
  exps = [kn for kn in kernels if any(u.op is Ops.EXP2 for u in kn.toposort())]
  # the kernel holding the exp doesn't also do the P@V product (no reduce over a broadcast exp)
  final = kernels[-1]
  assert not any(u.op is Ops.EXP2 for u in final.toposort()), "P@V recomputes exp"
  assert exps and all(kn is not final for kn in exps)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
  x = rng.standard_normal((64, 64)).astype(np.float32)
  sm = Tensor(x).softmax(-1)
  assert sum(c.src[0].op is Ops.SINK for c in sm.schedule().calls) <= 2
  np.testing.assert_allclose(sm.numpy(), _softmax(x), rtol=1e-5, atol=1e-6)
