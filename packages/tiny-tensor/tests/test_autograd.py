"""Gradients against torch (a test-only dependency) for elementwise, reduce, movement, indexing and matmul ops."""
import numpy as np
import pytest

from tiny_tensor import Context, Tensor, dtypes
from tiny_tensor.gradient import pm_gradient
from tiny_uop import Ops

torch = pytest.importorskip("torch")
rng = np.random.default_rng(2)


def check_grad(fn_tiny, fn_torch, *arrays, atol=1e-4, rtol=1e-3, seed_grad=True):
  """Compare forward values and d(sum(out * g))/d(inputs) of tiny and torch."""
  tt = [Tensor(a, requires_grad=True) for a in arrays]
  pt = [torch.tensor(a, requires_grad=True) for a in arrays]
  out_t, out_p = fn_tiny(*tt), fn_torch(*pt)
  g = rng.standard_normal(tuple(out_p.shape)).astype(np.float32) if seed_grad \
    else np.ones(tuple(out_p.shape), np.float32)
  (out_t * Tensor(g)).sum().backward()
  (out_p * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(out_t.numpy(), out_p.detach().numpy(), atol=atol, rtol=rtol)
  for t, p in zip(tt, pt):
    assert t.grad is not None and t.grad.shape == t.shape
    np.testing.assert_allclose(t.grad.numpy(), p.grad.numpy(), atol=atol, rtol=rtol)


X = rng.standard_normal((3, 4)).astype(np.float32)
Y = rng.standard_normal((3, 4)).astype(np.float32)
POS = (rng.random((3, 4)) + 0.5).astype(np.float32)
F = torch.nn.functional

UNARY = {
  "exp": (lambda t: t.exp(), torch.exp, X), "log": (lambda t: t.log(), torch.log, POS),
  "log2": (lambda t: t.log2(), torch.log2, POS), "exp2": (lambda t: t.exp2(), torch.exp2, X),
  "sqrt": (lambda t: t.sqrt(), torch.sqrt, POS), "rsqrt": (lambda t: t.rsqrt(), torch.rsqrt, POS),
  "reciprocal": (lambda t: t.reciprocal(), torch.reciprocal, POS), "sin": (lambda t: t.sin(), torch.sin, X),
  "cos": (lambda t: t.cos(), torch.cos, X), "tan": (lambda t: t.tan(), torch.tan, X * 0.5),
  "relu": (lambda t: t.relu(), torch.relu, X), "sigmoid": (lambda t: t.sigmoid(), torch.sigmoid, X),
  "tanh": (lambda t: t.tanh(), torch.tanh, X), "gelu": (lambda t: t.gelu(), lambda p: F.gelu(p, approximate="tanh"), X),
  "silu": (lambda t: t.silu(), F.silu, X), "softplus": (lambda t: t.softplus(), F.softplus, X),
  "mish": (lambda t: t.mish(), F.mish, X), "elu": (lambda t: t.elu(), F.elu, X), "celu": (lambda t: t.celu(), F.celu,
    X),
  "selu": (lambda t: t.selu(), F.selu, X), "leaky_relu": (lambda t: t.leaky_relu(0.1), lambda p: F.leaky_relu(p,
    0.1), X),
  "relu6": (lambda t: t.relu6(), F.relu6, X * 5), "hardswish": (lambda t: t.hardswish(), F.hardswish, X * 3),
  "hardtanh": (lambda t: t.hardtanh(), F.hardtanh, X * 2), "softsign": (lambda t: t.softsign(), F.softsign, X),
  "logsigmoid": (lambda t: t.logsigmoid(), F.logsigmoid, X), "abs": (lambda t: t.abs(), torch.abs, X),
  "square": (lambda t: t.square(), torch.square, X), "neg": (lambda t: -t, torch.neg, X),
  "pow3": (lambda t: t ** 3, lambda p: p ** 3, X), "pow_frac": (lambda t: t ** 1.7, lambda p: p ** 1.7, POS),
  "rpow": (lambda t: 2 ** t, lambda p: 2 ** p, X), "sinh": (lambda t: t.sinh(), torch.sinh, X),
  "clip": (lambda t: t.clip(-0.5, 0.5), lambda p: p.clamp(-0.5, 0.5), X),
  "floor": (lambda t: t.floor() + t, lambda p: p.floor() + p, X),
  "hardsigmoid": (lambda t: t.hardsigmoid(), F.hardsigmoid, X * 4),
  "quick_gelu": (lambda t: t.quick_gelu(), lambda p: p * torch.sigmoid(1.702 * p), X),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_grad(name):
  ft, fp, x = UNARY[name]
  check_grad(ft, fp, x)


@pytest.mark.parametrize("name,ft,fp", [
  ("add", lambda a, b: a + b, lambda a, b: a + b), ("sub", lambda a, b: a - b, lambda a, b: a - b),
  ("mul", lambda a, b: a * b, lambda a, b: a * b), ("div", lambda a, b: a / (b.abs() + 1), lambda a,
    b: a / (b.abs() + 1)),
  ("maximum", lambda a, b: a.maximum(b), torch.maximum), ("minimum", lambda a, b: a.minimum(b), torch.minimum),
  ("where", lambda a, b: (a > b).where(a * 2, b), lambda a, b: torch.where(a > b, a * 2, b)),
  ("pow", lambda a, b: (a.abs() + 0.5) ** b, lambda a, b: (a.abs() + 0.5) ** b),
  ("lerp", lambda a, b: a.lerp(b, 0.3), lambda a, b: torch.lerp(a, b, 0.3)),
])
def test_binary_grad(name, ft, fp):
  check_grad(ft, fp, X, Y)


def test_broadcast_grads():
  a, b = rng.standard_normal((3, 1)).astype(np.float32), rng.standard_normal((4,)).astype(np.float32)
  check_grad(lambda x, y: x * y + x, lambda x, y: x * y + x, a, b)
  check_grad(lambda x, y: (x - y).square(), lambda x, y: (x - y).square(), X, X[1])


@pytest.mark.parametrize("name,ft,fp", [
  ("sum", lambda t: t.sum(1), lambda p: p.sum(1)), ("sum_all", lambda t: t.sum(), lambda p: p.sum()),
  ("mean", lambda t: t.mean(0, keepdim=True), lambda p: p.mean(0, keepdim=True)),
  ("max", lambda t: t.max(1), lambda p: p.amax(1)), ("min", lambda t: t.min(), lambda p: p.amin()),
  ("prod", lambda t: t.prod(1), lambda p: p.prod(1)), ("var", lambda t: t.var(1), lambda p: p.var(1)),
  ("std", lambda t: t.std(), lambda p: p.std()), ("softmax", lambda t: t.softmax(), lambda p: p.softmax(-1)),
  ("log_softmax", lambda t: t.log_softmax(0), lambda p: p.log_softmax(0)),
  ("logsumexp", lambda t: t.logsumexp(1), lambda p: p.logsumexp(1)),
])
def test_reduce_grad(name, ft, fp):
  check_grad(ft, fp, X)


@pytest.mark.parametrize("name,ft,fp", [
  ("reshape", lambda t: t.reshape(2, 6), lambda p: p.reshape(2, 6)), ("permute", lambda t: t.T, lambda p: p.T),
  ("expand", lambda t: t[:, :1].expand(3, 5), lambda p: p[:, :1].expand(3, 5)),
  ("pad", lambda t: t.pad((1, 2, 0, 1)), lambda p: F.pad(p, (1, 2, 0, 1))),
  ("pad_value", lambda t: t.pad((1, 1), value=3.0), lambda p: F.pad(p, (1, 1), value=3.0)),
  ("pad_reflect", lambda t: t.pad((2, 1), mode="reflect"), lambda p: F.pad(p[None], (2, 1), mode="reflect")[0]),
  ("pad_replicate", lambda t: t.pad((2, 1), mode="replicate"), lambda p: F.pad(p[None], (2, 1), mode="replicate")[0]),
  ("pad_circular", lambda t: t.pad((2, 1), mode="circular"), lambda p: F.pad(p[None], (2, 1), mode="circular")[0]),
  ("shrink_step", lambda t: t[1:, ::2], lambda p: p[1:, ::2]), ("flip", lambda t: t.flip(1), lambda p: p.flip(1)),
  ("neg_step", lambda t: t[::-1, 3:0:-2], lambda p: p.flip(0)[:, [3, 1]]),
  ("cat", lambda t: t.cat(t * 2, dim=1), lambda p: torch.cat([p, p * 2], 1)),
  ("stack", lambda t: t.stack(t, dim=0), lambda p: torch.stack([p, p], 0)),
  ("repeat", lambda t: t.repeat(2, 1), lambda p: p.repeat(2, 1)),
  ("getitem_tensor", lambda t: t[Tensor([2, 0, 2])], lambda p: p[[2, 0, 2]]),
  ("getitem_tensor2", lambda t: t[:, Tensor([1, 3])], lambda p: p[:, [1, 3]]),
  ("split", lambda t: t.split(2, 1)[1], lambda p: p.split(2, 1)[1]),
])
def test_movement_grad(name, ft, fp):
  check_grad(ft, fp, X)


def test_matmul_grads():
  a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
  check_grad(lambda x, y: x @ y, lambda x, y: x @ y, a, b)
  v = rng.standard_normal((4,)).astype(np.float32)
  check_grad(lambda x, y: x @ y, lambda x, y: x @ y, v, b)
  w, bias = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3,)).astype(np.float32)
  check_grad(lambda x, y, z: x.linear(y, z).relu(), lambda x, y, z: (x @ y + z).relu(), X, w, bias)


def test_mlp_training_step_matches_torch():
  x, w1, w2 = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32), \
    rng.standard_normal((6, 3)).astype(np.float32)
  labels = np.array([0, 2, 1, 1, 0, 2, 2, 1])
  tw1, tw2 = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
  pw1, pw2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
  onehot = np.eye(3, dtype=np.float32)[labels]
  loss_t = -((Tensor(x) @ tw1).relu().matmul(tw2).log_softmax() * Tensor(onehot)).sum(1).mean()
  loss_p = F.cross_entropy((torch.tensor(x) @ pw1).relu() @ pw2, torch.tensor(labels))
  loss_t.backward()
  loss_p.backward()
  assert loss_t.item() == pytest.approx(loss_p.item(), rel=1e-5)
  np.testing.assert_allclose(tw1.grad.numpy(), pw1.grad.numpy(), atol=1e-5)
  np.testing.assert_allclose(tw2.grad.numpy(), pw2.grad.numpy(), atol=1e-5)


def test_grad_accumulates_and_detach():
  w = Tensor([1.0, 2.0], requires_grad=True)
  (w * 3).sum().backward()
  (w * w).sum().backward()
  assert w.grad.tolist() == [5.0, 7.0]
  w2 = Tensor([1.0, 2.0], requires_grad=True)
  (w2 * w2.detach()).sum().backward()
  assert w2.grad.tolist() == [1.0, 2.0]


def test_gradient_api():
  x = Tensor([1.0, 2.0, 3.0])
  y = (x * x).sum()
  (dx,) = y.gradient(x)
  assert dx.tolist() == [2.0, 4.0, 6.0]
  z = Tensor([5.0])
  assert y.gradient(z)[0].tolist() == [0.0]  # tinygrad 0.14: a target not in the graph gets zeros
  with pytest.raises(RuntimeError, match="not part of the graph"): y.gradient(z, materialize_grads=False)
  v = x * 2
  (dv,) = v.gradient(x, gradient=Tensor([1.0, 0.0, 1.0]))
  assert dv.tolist() == [2.0, 0.0, 2.0]
  with pytest.raises(RuntimeError, match="non-scalar"): v.gradient(x)


def test_requires_grad_propagation_and_errors():
  a, b, c = Tensor([1.0], requires_grad=True), Tensor([2.0]), Tensor([3.0], requires_grad=False)
  assert (a + b).requires_grad is True and (b + c).requires_grad is None and (c * 2).requires_grad is False
  assert a.detach().requires_grad is False
  (c * 2).sum().backward()  # tinygrad 0.14: nothing to fill is no error; requires_grad=False opts c out
  assert c.grad is None
  with pytest.raises(RuntimeError, match="scalar"): Tensor([1.0, 2.0], requires_grad=True).backward()


def test_contiguous_backward_and_half_grads():
  x = Tensor(X, requires_grad=True)
  (x.contiguous_backward() * 2).sum().backward()
  assert np.allclose(x.grad.numpy(), 2)
  h = Tensor(X.astype(np.float16), requires_grad=True)
  (h * h).sum().backward()
  assert h.grad.dtype == dtypes.half
  np.testing.assert_allclose(h.grad.numpy(), 2 * X.astype(np.float16), rtol=1e-2)


def test_pm_gradient_is_a_pattern_matcher_with_rules_per_op():
  covered = set(pm_gradient.pdict)
  for op in (Ops.ADD, Ops.MUL, Ops.SUB, Ops.FDIV, Ops.MAX, Ops.WHERE, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT,
             Ops.RECIPROCAL, Ops.CAST, Ops.REDUCE_AXIS, Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK,
             Ops.FLIP, Ops.CONTIGUOUS, Ops.COPY):
    assert op in covered, op


def test_training_flag():
  assert Tensor.training is False
  with Context(TRAINING=1): assert Tensor.training is True
  with Tensor.train(): assert Tensor.training is True
  assert Tensor.training is False
  Tensor.training = True
  try: assert Tensor.training is True
  finally: Tensor.training = False


def test_gradient_flows_through_values_realized_before_backward():
  x = Tensor([1.0, 2.0], requires_grad=True)
  h = (x * 3).relu()
  assert h.tolist() == [3.0, 6.0]  # realized: h is now a buffer, but the gradient still reaches x
  (h * h).sum().backward()
  assert x.grad.tolist() == [18.0, 36.0]
  y = Tensor([1.0, 2.0])
  z = y * 2
  z.numpy()
  assert z.sum().gradient(y)[0].tolist() == [2.0, 2.0]


def test_training_monkeypatch(monkeypatch):
  monkeypatch.setattr(Tensor, "training", True)
  assert Tensor.training is True
  monkeypatch.undo()
  assert Tensor.training is False


def test_grad_edge_cases():
  e = Tensor(np.zeros((0, 3), np.float32), requires_grad=True)
  (e * 2).sum().backward()
  assert e.grad.shape == (0, 3) and e.grad.numpy().shape == (0, 3)
  s = Tensor(3.0, requires_grad=True)
  (s * s).backward()
  assert s.grad.shape == () and s.grad.item() == 6.0
  w = Tensor(np.ones((2, 3)), requires_grad=True)  # float64
  (w * w).sum().backward()
  assert w.grad.dtype == dtypes.float64 and w.grad.tolist() == [[2.0] * 3] * 2
  f = Tensor([1.0, 2.0], requires_grad=True)
  (Tensor([3, 4]) * f).sum().backward()  # int * float promotes; the gradient is float
  assert f.grad.tolist() == [3.0, 4.0]
  check_grad(lambda x: x.sum(-1) * x.mean(), lambda p: p.sum(-1) * p.mean(), X)
  check_grad(lambda x: x[..., None, :].expand(3, 2, 4).sum(1), lambda p: p[..., None, :].expand(3, 2, 4).sum(1), X)


def test_only_float_tensors_have_gradients():
  x = Tensor([1, 2])
  with pytest.raises(RuntimeError, match="only float"): (x * 2).sum().gradient(x)
  f = Tensor([1.0, 2.0], requires_grad=True)
  i = Tensor([1, 2], requires_grad=True)  # an int tensor in the graph is skipped by backward
  (f * i).sum().backward()
  assert f.grad.tolist() == [1.0, 2.0] and i.grad is None


def test_more_grads():
  m = X > 0
  check_grad(lambda t: t[Tensor(m)] * 2, lambda p: p[torch.tensor(m)] * 2, X)
  check_grad(lambda t: Tensor(m[:1]).where(t, t * 3), lambda p: torch.where(torch.tensor(m[:1]), p, p * 3), X)
  check_grad(lambda t: t[::2, 1:3].flip(0).pad(((1, 0), (0, 2))), lambda p: F.pad(p[::2, 1:3].flip(0), (0, 2, 1, 0)), X)
  check_grad(lambda t: t.reshape(2, 6).permute(1, 0).reshape(3, 4) @ t.T,
             lambda p: p.reshape(2, 6).T.reshape(3, 4) @ p.T, X)
  check_grad(lambda t: t.softmax(0, dtype=dtypes.float64).float(), lambda p: p.double().softmax(0).float(), X)
  check_grad(lambda t: t.max() + t.min(0).sum(), lambda p: p.amax() + p.amin(0).sum(), X)


def test_realized_leaf_after_a_functional_update_gets_its_gradient():
  w = Tensor([1.0, 2.0], requires_grad=True)
  (w * w).sum().backward()
  w = (w - 0.5 * w.grad).detach().requires_grad_()  # a new leaf, realized below
  w.realize()
  (w * 3).sum().backward()
  assert w.grad.tolist() == [3.0, 3.0]
  v = Tensor([1.0, 2.0], requires_grad=True)
  v2 = (v * 2).requires_grad_()  # marked by the user: a target of its own, even once realized
  v2.realize()
  (v2 * v2).sum().backward()
  assert v2.grad.tolist() == [4.0, 8.0]


def test_custom_gradients_are_forgotten_with_their_graph():
  # conv2d registers its own gradient on its result node; building convs in a loop must not keep their graphs alive
  import gc
  from tiny_tensor import gradient
  w = Tensor(np.ones((2, 1, 3, 3), np.float32), requires_grad=True)
  gc.collect()
  before = len(gradient._custom)
  for _ in range(5):
    Tensor(np.random.rand(1, 1, 6, 6).astype(np.float32)).conv2d(w).sum().backward()
    w.grad = None
  gc.collect()
  assert len(gradient._custom) <= before + 1


def test_relu_gradient_at_its_edges_matches_torch():
  # the gradient comes from the output (out > 0): the same mask as x > 0 at 0, -0, a denormal and the infinities
  x = np.array([-2.0, -0.0, 0.0, 1e-40, 3.0, np.inf, -np.inf], np.float32)
  g = np.arange(1, 8, dtype=np.float32)
  t = Tensor(x, requires_grad=True)
  (t.relu() * Tensor(g)).sum().backward()
  p = torch.tensor(x, requires_grad=True)
  (torch.relu(p) * torch.tensor(g)).sum().backward()
  np.testing.assert_array_equal(t.grad.numpy(), p.grad.numpy())
  np.testing.assert_array_equal(t.grad.numpy(), [0, 0, 0, 4, 5, 6, 0])
  # NaN: relu's output is 0 (`(x > 0).where(x, 0)`; torch's is NaN) and so is its gradient, as before
  n = Tensor(np.array([np.nan, 1.0], np.float32), requires_grad=True)
  out = n.relu()
  (out * Tensor(np.array([5.0, 7.0], np.float32))).sum().backward()
  assert out.tolist() == [0.0, 1.0] and n.grad.tolist() == [0.0, 7.0]


def test_relu_backward_reads_the_output_not_the_input():
  # the backward reaches the forward only through the output: neither the pre-ReLU map nor its mask (x > 0) is read
  # again, so the pre-ReLU map needn't be stored and the ReLU fuses into the op before it
  a = Tensor(rng.standard_normal((4, 5)).astype(np.float32), requires_grad=True)
  pre = a * 3 + 1
  out = pre.relu()
  g = Tensor(rng.standard_normal((4, 5)).astype(np.float32))
  da = (out * g).sum().gradient(a)[0]
  fwd = set(out.uop.toposort())
  inner = {pre.uop, *(s for s in out.uop.src if s.op is Ops.CMPLT)}
  assert len(inner) == 2
  assert not [u for u in da.uop.toposort() if u not in fwd and any(s in inner for s in u.src)]
  np.testing.assert_allclose(da.numpy(), np.where(pre.numpy() > 0, 3 * g.numpy(), 0), rtol=1e-6)


def test_relu_second_order_gradient():
  # d/dx of x * relu'(x)-weighted sums: the mask is piecewise constant, so the gradient of a gradient is torch's
  x = np.array([-1.5, 0.5, 2.0, -0.25], np.float32)
  t = Tensor(x, requires_grad=True)
  gt = (t.relu() * t).sum().gradient(t)[0]  # relu(x) + x * relu'(x)
  (gx,) = (gt * gt).sum().gradient(t)
  p = torch.tensor(x, requires_grad=True)
  (gp,) = torch.autograd.grad((torch.relu(p) * p).sum(), p, create_graph=True)
  (px,) = torch.autograd.grad((gp * gp).sum(), p)
  np.testing.assert_allclose(gt.numpy(), gp.detach().numpy(), rtol=1e-6)
  np.testing.assert_allclose(gx.numpy(), px.numpy(), rtol=1e-6)
