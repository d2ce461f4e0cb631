"""Optimizers against torch.optim (SGD variants, Adam, AdamW) and numpy references (LAMB, LARS), over several steps."""
import numpy as np
import pytest

from tiny_tensor import GlobalCounters, Tensor, nn

torch = pytest.importorskip("torch")

STEPS = 5
W0 = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
B0 = np.random.default_rng(1).standard_normal((3,)).astype(np.float32)
X = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)


def _loss(w, b, x):  # works for both frameworks: a smooth non-quadratic loss
  y = (x @ w + b).tanh()
  return (y * y).sum() + (w * w * w).sum() * 0.1


def _tiny(make, steps=STEPS):
  w, b = Tensor(W0.copy(), requires_grad=True), Tensor(B0.copy(), requires_grad=True)
  opt = make([w, b])
  x = Tensor(X)
  with Tensor.train():
    for _ in range(steps):
      opt.zero_grad()
      _loss(w, b, x).backward()
      opt.step()
  return w.numpy(), b.numpy()


def _torch(make, steps=STEPS):
  w, b = torch.tensor(W0.copy(), requires_grad=True), torch.tensor(B0.copy(), requires_grad=True)
  opt = make([w, b])
  x = torch.tensor(X)
  for _ in range(steps):
    opt.zero_grad()
    _loss(w, b, x).backward()
    opt.step()
  return w.detach().numpy(), b.detach().numpy()


CASES = {
  "sgd": (lambda p: nn.optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
  "sgd_momentum": (lambda p: nn.optim.SGD(p, lr=0.05, momentum=0.9),
                   lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
  "sgd_nesterov_wd": (lambda p: nn.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
                      lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
  "adam": (lambda p: nn.optim.Adam(p, lr=0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
  "adam_betas": (lambda p: nn.optim.Adam(p, lr=0.02, b1=0.8, b2=0.99, eps=1e-6),
                 lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6)),
  "adamw": (lambda p: nn.optim.AdamW(p, lr=0.05, weight_decay=0.1),
            lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
  ours, theirs = CASES[name]
  for a, b in zip(_tiny(ours), _torch(theirs)): np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  assert not np.allclose(_tiny(ours)[0], W0)  # it moved


def _np_grads(w, b):
  wt, bt = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
  _loss(wt, bt, torch.tensor(X)).backward()
  return wt.grad.numpy(), bt.grad.numpy()


def test_lamb_matches_numpy_reference():
  lr, b1, b2, eps, wd = 0.05, 0.9, 0.999, 1e-6, 0.01
  ps = [W0.astype(np.float64), B0.astype(np.float64)]
  m, v = [np.zeros_like(p) for p in ps], [np.zeros_like(p) for p in ps]
  for t in range(1, STEPS + 1):
    gs = _np_grads(ps[0].astype(np.float32), ps[1].astype(np.float32))
    for i, g in enumerate(gs):
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      up = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * ps[i]
      r1, r2 = np.linalg.norm(ps[i]), np.linalg.norm(up)
      ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
      ps[i] = ps[i] - lr * ratio * up
  ours = _tiny(lambda p: nn.optim.LAMB(p, lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd))
  for a, b in zip(ours, ps): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_lars_matches_numpy_reference():
  lr, mom, wd, tc = 0.1, 0.9, 1e-3, 0.01
  ps = [W0.astype(np.float64), B0.astype(np.float64)]
  buf = [np.zeros_like(p) for p in ps]
  for _ in range(STEPS):
    gs = _np_grads(ps[0].astype(np.float32), ps[1].astype(np.float32))
    for i, g in enumerate(gs):
      r1, r2 = np.linalg.norm(ps[i]), np.linalg.norm(g)
      trust = tc * r1 / (r2 + wd * r1) if r1 > 0 and r2 > 0 else 1.0
      g = (g + wd * ps[i]) * trust * lr  # classic: the rate goes in before the momentum buffer
      buf[i] = mom * buf[i] + g
      ps[i] = ps[i] - buf[i]
  ours = _tiny(lambda p: nn.optim.LARS(p, lr=lr, momentum=mom, weight_decay=wd, tcoef=tc))
  for a, b in zip(ours, ps): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


class _TorchGroup:
  def __init__(self, *opts): self.opts = opts
  def zero_grad(self): [o.zero_grad() for o in self.opts]
  def step(self): [o.step() for o in self.opts]


def test_optimizer_group_steps_both():
  def make(p): return nn.optim.OptimizerGroup(nn.optim.SGD([p[0]], lr=0.1), nn.optim.Adam([p[1]], lr=0.05))
  ref = _torch(lambda p: _TorchGroup(torch.optim.SGD([p[0]], lr=0.1), torch.optim.Adam([p[1]], lr=0.05)))
  for a, b in zip(_tiny(make), ref): np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_step_realizes_in_one_schedule_with_few_kernels():
  ps = [Tensor(np.ones((8, 8), np.float32), requires_grad=True) for _ in range(4)]
  opt = nn.optim.Adam(ps, lr=0.1)
  with Tensor.train():
    sum(((p * p).sum() for p in ps[1:]), (ps[0] * ps[0]).sum()).backward()
    for p in ps: p.grad.realize()
    GlobalCounters.reset()
    opt.step()
  # one kernel per buffer written (param, m, v per parameter, plus b1^t and b2^t): every elementwise chain of the
  # update (about a dozen ops per parameter) fuses into the kernel that stores it
  assert 0 < GlobalCounters.kernel_count <= 3 * len(ps) + 2
  assert np.allclose(ps[0].numpy(), 1 - 0.1, atol=1e-4)  # Adam's first step moves by ~lr


def test_errors():
  with pytest.raises(ValueError, match="learning rate"): nn.optim.SGD([Tensor([1.0], requires_grad=True)], lr=-1)
  with pytest.raises(ValueError, match="no parameter"): nn.optim.Adam([Tensor([1.0], requires_grad=False)])
  w = Tensor([1.0], requires_grad=True)
  opt = nn.optim.SGD([w], lr=0.1)
  (w * w).sum().backward()
  with pytest.raises(RuntimeError, match="training mode"): opt.step()
  opt.zero_grad()
  with Tensor.train(), pytest.raises(RuntimeError, match="backward"): opt.step()


def _np_newton_schulz(g, steps, coefs, eps=1e-7):
  """Muon's orthogonalization in float64: X = G/|G|_F (transposed if tall), X <- a X + b (XX^T) X + c (XX^T)^2 X."""
  tall = g.shape[0] > g.shape[1]
  x = g.T if tall else g
  x = x / (np.linalg.norm(x) + eps)
  for _ in range(steps):
    gram = x @ x.T
    x = coefs[0] * x + coefs[1] * gram @ x + coefs[2] * gram @ gram @ x
  return x.T if tall else x


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_numpy_reference(nesterov):
  lr, mom, wd, steps, coefs = 0.02, 0.95, 0.1, 5, (3.4445, -4.775, 2.0315)
  ps = [W0.astype(np.float64), B0.astype(np.float64)]
  buf = [np.zeros_like(p) for p in ps]
  for _ in range(STEPS):
    gs = _np_grads(ps[0].astype(np.float32), ps[1].astype(np.float32))
    for i, g in enumerate(gs):
      buf[i] = mom * buf[i] + g
      u = g + mom * buf[i] if nesterov else buf[i]
      u = _np_newton_schulz(u.reshape(u.shape[0], -1), steps, coefs).reshape(u.shape)  # a bias is a (n, 1) column
      ps[i] = ps[i] - lr * u - lr * wd * ps[i]
  ours = _tiny(lambda p: nn.optim.Muon(p, lr=lr, momentum=mom, weight_decay=wd, nesterov=nesterov))
  for a, b in zip(ours, ps): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert not np.allclose(ours[0], W0, atol=1e-2)


def test_muon_matches_torch_muon():
  # torch.optim.Muon: momentum buffer lerped ((1-m) times ours: Newton-Schulz normalizes that away), nesterov by
  # default, decoupled weight decay, lr scaled by sqrt(max(1, rows/cols)) (1 for a wide matrix, as here); its
  # Newton-Schulz runs in bfloat16, hence the tolerance
  w0 = np.random.default_rng(5).standard_normal((3, 5)).astype(np.float32)
  x = np.random.default_rng(6).standard_normal((4, 3)).astype(np.float32)
  w, tw = Tensor(w0.copy(), requires_grad=True), torch.tensor(w0.copy(), requires_grad=True)
  opt, topt = nn.optim.Muon([w], lr=0.02, weight_decay=0.1), torch.optim.Muon([tw], lr=0.02, weight_decay=0.1)
  with Tensor.train():
    for _ in range(STEPS):
      opt.zero_grad(); topt.zero_grad()  # noqa: E702
      (Tensor(x) @ w).sin().sum().backward()
      (torch.tensor(x) @ tw).sin().sum().backward()
      opt.step(); topt.step()  # noqa: E702
  moved = np.abs(tw.detach().numpy() - w0).max()
  assert moved > 0.05
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), atol=0.02 * moved)


def test_lars_takes_tinygrads_positional_arguments():
  # LARS(params, lr, momentum, weight_decay, ns_steps, ns_coefficients, nesterov, classic, pre_wd, tcoef)
  w = Tensor([1.0, 2.0], requires_grad=True)
  opt = nn.optim.LARS([w], 0.1, 0.9, 0.0, 0, None, True, False, True, 0.0)
  assert (opt.momentum, opt.nesterov, opt.classic, opt.pre_wd, opt.tcoef) == (0.9, True, False, True, 0.0)
  with pytest.raises(ValueError, match="Newton-Schulz"): nn.optim.LARS([w], 0.1, ns_steps=0, ns_coefficients=(1.0,))
