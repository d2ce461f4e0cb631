"""Which tensors backward() fills `.grad` of, and what gradient() gives, as tinygrad 0.14 (issue #35).

tinygrad 0.14 fills `.grad` for every live floating-point tensor in the graph, with no requires_grad=True needed;
`requires_grad=False` opts out here. Numbers are checked against torch (with requires_grad=True where tinygrad infers
it) and, for the cases torch has no answer for (a comparison's gradient), against tinygrad itself on its PYTHON
device.
"""
import numpy as np
import pytest

from tiny_tensor import Tensor, dtypes, nn

torch = pytest.importorskip("torch")
rng = np.random.default_rng(35)


def _arr(*shape: int) -> np.ndarray:
  return rng.standard_normal(shape).astype(np.float32)


def _close(t: Tensor | None, ref, atol: float = 1e-4) -> None:
  assert t is not None, "no .grad was filled"
  np.testing.assert_allclose(t.numpy(), ref.detach().numpy() if hasattr(ref, "detach") else ref, atol=atol, rtol=1e-3)


def _tinygrad_python(fn):
  """fn(tinygrad.Tensor) run on tinygrad's own PYTHON device (no compiler needed): the reference implementation."""
  tinygrad = pytest.importorskip("tinygrad")
  from tinygrad.helpers import Context
  with Context(DEV="PYTHON"): return fn(tinygrad.Tensor)


def _layer_case(tiny_layer, torch_layer, x: np.ndarray, names=("weight", "bias")):
  """Copy tiny's parameters into torch's layer, run sum(layer(x) * g) backward in both, compare every grad."""
  with torch.no_grad():
    for n in names: getattr(torch_layer, n).copy_(torch.tensor(getattr(tiny_layer, n).numpy()))
  g = _arr(*torch_layer(torch.tensor(x)).shape)
  xt, xp = Tensor(x), torch.tensor(x, requires_grad=True)
  (tiny_layer(xt) * Tensor(g)).sum().backward()
  (torch_layer(xp) * torch.tensor(g)).sum().backward()
  for n in names:
    assert getattr(tiny_layer, n).requires_grad is None  # no opt-in was needed
    _close(getattr(tiny_layer, n).grad, getattr(torch_layer, n).grad)
  _close(xt.grad, xp.grad)  # the input is a float tensor in the graph too


def test_layernorm_weight_grads_without_requires_grad():
  _layer_case(nn.LayerNorm(6), torch.nn.LayerNorm(6), _arr(3, 6))


def test_linear_weight_grads_without_requires_grad():
  _layer_case(nn.Linear(5, 4), torch.nn.Linear(5, 4), _arr(3, 5))


def test_conv2d_weight_grads_without_requires_grad():
  _layer_case(nn.Conv2d(2, 3, 3, padding=1), torch.nn.Conv2d(2, 3, 3, padding=1), _arr(2, 2, 5, 5))


def test_batchnorm_weight_grads_without_requires_grad():
  bn, ref = nn.BatchNorm(3), torch.nn.BatchNorm2d(3)
  with Tensor.train(): _layer_case(bn, ref.train(), _arr(4, 3, 2, 2))


def test_realized_parameters_still_get_grads():
  # realized before use (Tensor.realize(*params), or a realized forward): looked through, still a target
  lin, ref = nn.Linear(3, 2), torch.nn.Linear(3, 2)
  Tensor.realize(lin.weight, lin.bias)
  x = _arr(4, 3)
  out = lin(Tensor(x)).relu().sum()
  out.realize()
  out.backward()
  with torch.no_grad():
    ref.weight.copy_(torch.tensor(lin.weight.numpy()))
    ref.bias.copy_(torch.tensor(lin.bias.numpy()))
  ref(torch.tensor(x)).relu().sum().backward()
  _close(lin.weight.grad, ref.weight.grad)
  _close(lin.bias.grad, ref.bias.grad)


def test_requires_grad_false_opts_out():
  a, b = _arr(4), _arr(4)
  x, w = Tensor(a), Tensor(b, requires_grad=False)
  (x * w).sum().backward()
  assert w.grad is None
  xp = torch.tensor(a, requires_grad=True)
  (xp * torch.tensor(b)).sum().backward()
  _close(x.grad, xp.grad)
  # nothing left to fill is no error (tinygrad returns self)
  c = Tensor(a, requires_grad=False)
  assert (c * 2).sum().backward() is not None and c.grad is None


def test_int_tensors_get_no_grad():
  a = _arr(3)
  i, x = Tensor([1, 2, 3]), Tensor(a)
  (i.float() * x).sum().backward()
  assert i.grad is None and i.dtype == dtypes.int32
  _close(x.grad, np.array([1.0, 2.0, 3.0], np.float32))
  with pytest.raises(RuntimeError, match="only float"): i.sum().backward()


def test_gradient_of_unrelated_target_is_zeros():
  a, b = _arr(3), _arr(2)
  x, z = Tensor(a), Tensor(b)
  dx, dz = (x * x).sum().gradient(x, z)
  xp, zp = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  ref = torch.autograd.grad((xp * xp).sum(), (xp, zp), allow_unused=True, materialize_grads=True)
  _close(dx, ref[0])
  _close(dz, ref[1])
  assert dz.shape == (2,)
  with pytest.raises(RuntimeError, match="not part of the graph"): (x * x).sum().gradient(z, materialize_grads=False)


def test_where_on_a_comparison_backward():
  a = np.array([1.5, -2.0, 0.5, -0.25], np.float32)
  x = Tensor(a)
  (x > 0).where(x, 0).sum().backward()
  xp = torch.tensor(a, requires_grad=True)
  torch.where(xp > 0, xp, 0.0).sum().backward()
  _close(x.grad, xp.grad)
  assert x.grad.tolist() == _tinygrad_python(lambda T: _tg_where_grad(T, a))


def _tg_where_grad(T, a):
  x = T(a.tolist())
  (x > 0).where(x, 0).sum().backward()
  return x.grad.tolist()


def _tg_cmp_grads(T, a, b):
  x, y = T(a.tolist()), T(b.tolist())
  ((x < y).float() * 3).sum().backward()
  return x.grad.tolist(), y.grad.tolist()


def test_comparison_float_backward_is_zero():
  # torch has no gradient through a comparison (backward raises); tinygrad gives the operands zeros
  a, b = np.array([1.0, -2.0, 3.0], np.float32), np.array([2.0, -3.0, 1.0], np.float32)
  x, y = Tensor(a), Tensor(b)
  ((x < y).float() * 3).sum().backward()
  ref = _tinygrad_python(lambda T: _tg_cmp_grads(T, a, b))
  assert (x.grad.tolist(), y.grad.tolist()) == ref == ([0.0] * 3, [0.0] * 3)


def test_detach_stops_the_gradient():
  a = _arr(4)
  x = Tensor(a)
  (x.detach() * x * x).sum().backward()
  xp = torch.tensor(a, requires_grad=True)
  (xp.detach() * xp * xp).sum().backward()
  _close(x.grad, xp.grad)


def test_multiple_backward_accumulates():
  a, b = _arr(3), _arr(3)
  x, w = Tensor(a), Tensor(b)
  (x * w).sum().backward()
  (x * x * w).sum().backward()
  xp, wp = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  (xp * wp).sum().backward()
  (xp * xp * wp).sum().backward()
  _close(x.grad, xp.grad)
  _close(w.grad, wp.grad)


def test_intermediate_tensors_get_grads():
  # tinygrad fills every live tensor in the graph; torch gives them with retain_grad()
  a = _arr(3)
  x = Tensor(a)
  h = x * 2
  loss = (h * h).sum()
  loss.backward()
  xp = torch.tensor(a, requires_grad=True)
  hp = xp * 2
  hp.retain_grad()
  (hp * hp).sum().backward()
  _close(h.grad, hp.grad)
  _close(x.grad, xp.grad)
  assert loss.grad is not None and loss.grad.item() == 1.0


def test_constant_only_tensor_gets_no_grad():
  # an unrealized Tensor.ones is the same node as the `+ 1` constant: backward can't tell their uses apart
  c = Tensor.ones(3)
  (c * 2 + 1).sum().backward()
  assert c.grad is None
  p = Tensor.ones(3).realize()  # with a buffer of its own it is a leaf like any other
  (p * 2 + 1).sum().backward()
  pp = torch.ones(3, requires_grad=True)
  (pp * 2 + 1).sum().backward()
  _close(p.grad, pp.grad)


def test_sgd_trains_layers_without_requires_grad():
  lin, ref = nn.LayerNorm(4), torch.nn.LayerNorm(4)
  opt, opt_ref = nn.optim.SGD([lin.weight, lin.bias], lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
  x, g = _arr(2, 4), _arr(2, 4)
  for _ in range(2):
    opt.zero_grad()
    (lin(Tensor(x)) * Tensor(g)).sum().backward()
    with Tensor.train(): opt.step()
    opt_ref.zero_grad()
    (ref(torch.tensor(x)) * torch.tensor(g)).sum().backward()
    opt_ref.step()
  _close(lin.weight, ref.weight)
  _close(lin.bias, ref.bias)


NONDIFF = {  # name: (tiny fn, torch fn): each mixes a non-differentiable op with x so torch has a gradient too
  "le": (lambda x, y: (x <= y).float() * x, lambda x, y: (x <= y).float() * x),
  "argmax": (lambda x, y: x.argmax().float() + x.sum(), lambda x, y: x.argmax().float() + x.sum()),
  "and_of_comparisons": (lambda x, y: ((x > 0) & (y > 0)).float() * x, lambda x, y: ((x > 0) & (y > 0)).float() * x),
  "int_cast": (lambda x, y: x.cast(dtypes.int32).float() + x, lambda x, y: x.int().float() + x),
  "floor_round": (lambda x, y: x.floor() + x.round() * y + x, lambda x, y: x.floor() + x.round() * y + x),
}


@pytest.mark.parametrize("name", sorted(NONDIFF))
def test_non_differentiable_ops_give_zero_gradient(name):
  # before: "no gradient rule for Ops.OR/AND" (le, argmax, &), or the gradient went through the int cast (2, not 1)
  a, b = np.array([1.5, -2.0, 0.5, -0.25, 3.0], np.float32), np.array([3.0, -0.25, 0.5, -2.0, 1.5], np.float32)
  fn, ref = NONDIFF[name]
  x, y = Tensor(a), Tensor(b)
  fn(x, y).sum().backward()
  xp, yp = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  ref(xp, yp).sum().backward()
  _close(x.grad, xp.grad)
  if yp.grad is not None: _close(y.grad, yp.grad)


@pytest.mark.parametrize("gather", [False, True])
def test_sharded_parameters_get_grads_without_requires_grad(gather):
  from tiny_tensor import Device
  devs = tuple(f"{Device.DEFAULT.split(':')[0]}:{i}" for i in range(2))
  a, x = _arr(4, 3), _arr(6, 4)
  w = Tensor(a).shard(devs).realize()  # a realized replicated parameter
  xs = Tensor(x).shard(devs, 0)  # a lazy input split over the devices
  out = xs @ w  # a held intermediate (computed from both: it gets no .grad on this path)
  loss = (out.to(devs[0]) if gather else out).square().sum()
  loss.backward()
  wp, xp = torch.tensor(a, requires_grad=True), torch.tensor(x, requires_grad=True)
  (xp @ wp).square().sum().backward()
  for t, ref in ((w, wp), (xs, xp)):
    _close(t.grad.to(devs[0]) if isinstance(t.grad.device, tuple) else t.grad, ref.grad, atol=1e-3)


def test_tracking_holds_no_dead_tensors():
  # every realized tensor is now tracked for backward (weakly): dropped ones must not pile up in the registries
  from tiny_tensor import tensor as tensor_mod
  base = np.ones(4, np.float32)
  for i in range(600):
    t = Tensor(base + i)
    (t * 2).realize()
  del t
  regs = (tensor_mod._real_tensors, tensor_mod._lazy_tensors, tensor_mod._origin_tensors)
  assert all(len(r.data) < 400 for r in regs), [len(r.data) for r in regs]
  assert len(tensor_mod._grad_candidates()) < 100
