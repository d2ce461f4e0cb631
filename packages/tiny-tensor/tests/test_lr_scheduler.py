"""LR schedulers against torch.optim.lr_scheduler: the rate sequence step by step (read back from the optimizer's lr
buffer), sequenced warmup + cosine, ReduceLROnPlateau on a metric sequence, several optimizers, and a TinyJit-compiled
training step whose rate the scheduler changes between replays (the weights then equal torch's)."""
import numpy as np
import pytest

from tiny_tensor import Tensor, TinyJit, nn

torch = pytest.importorskip("torch")
LS, TLS = nn.lr_scheduler, torch.optim.lr_scheduler
STEPS = 12


def _pair(lr=0.1):
  ours = nn.optim.SGD([Tensor([1.0, 2.0], requires_grad=True)], lr=lr, momentum=0.9)
  theirs = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=lr, momentum=0.9)
  return ours, theirs


def _rates(ours, theirs, sched, tsched, steps=STEPS):
  got, want = [], []
  for _ in range(steps):
    got.append(float(ours.lr.numpy()[0]))  # what the step would use: the buffer itself
    want.append(theirs.param_groups[0]["lr"])
    assert sched.get_last_lr()[0] == pytest.approx(tsched.get_last_lr()[0], rel=1e-6, abs=1e-12)
    theirs.step()
    sched.step(); tsched.step()  # noqa: E702
  return np.array(got), np.array(want)


CASES = {
  "step": (lambda o: LS.StepLR(o, step_size=3, gamma=0.5), lambda o: TLS.StepLR(o, step_size=3, gamma=0.5)),
  "multistep": (lambda o: LS.MultiStepLR(o, [2, 5, 5, 9], gamma=0.3), lambda o: TLS.MultiStepLR(o, [2, 5, 5, 9], 0.3)),
  "exponential": (lambda o: LS.ExponentialLR(o, 0.8), lambda o: TLS.ExponentialLR(o, 0.8)),
  "linear_warmup": (lambda o: LS.LinearLR(o, start_factor=0.1, total_iters=4),
                    lambda o: TLS.LinearLR(o, start_factor=0.1, total_iters=4)),
  "lambda": (lambda o: LS.LambdaLR(o, lambda e: 1 / (1 + e)), lambda o: TLS.LambdaLR(o, lambda e: 1 / (1 + e))),
  "cosine": (lambda o: LS.CosineAnnealingLR(o, T_max=5, eta_min=0.01),
             lambda o: TLS.CosineAnnealingLR(o, T_max=5, eta_min=0.01)),
  "onecycle_cos": (lambda o: LS.OneCycleLR(o, max_lr=1.0, total_steps=STEPS),
                   lambda o: TLS.OneCycleLR(o, max_lr=1.0, total_steps=STEPS, cycle_momentum=False)),
  "onecycle_linear_3phase": (
    lambda o: LS.OneCycleLR(o, max_lr=0.5, epochs=3, steps_per_epoch=4, pct_start=0.25, anneal_strategy="linear",
                            three_phase=True, div_factor=10, final_div_factor=100),
    lambda o: TLS.OneCycleLR(o, max_lr=0.5, epochs=3, steps_per_epoch=4, pct_start=0.25, anneal_strategy="linear",
                             three_phase=True, div_factor=10, final_div_factor=100, cycle_momentum=False)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rates_match_torch(name):
  ours, theirs = _pair()
  mk, tmk = CASES[name]
  got, want = _rates(ours, theirs, mk(ours), tmk(theirs))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  assert len(set(np.round(want, 8))) > 2  # the schedule moved


def test_warmup_then_cosine_sequence():
  ours, theirs = _pair(0.2)
  seq = LS.SequentialLR(ours, [LS.LinearLR(ours, 0.25, total_iters=3), LS.CosineAnnealingLR(ours, T_max=6)], [3])
  tseq = TLS.SequentialLR(theirs, [TLS.LinearLR(theirs, 0.25, total_iters=3), TLS.CosineAnnealingLR(theirs, T_max=6)],
                          [3])
  got, want = _rates(ours, theirs, seq, tseq, steps=10)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  with pytest.raises(ValueError, match="milestones"): LS.SequentialLR(ours, [LS.StepLR(ours, 2)], [3])


def test_reduce_on_plateau():
  ours, theirs = _pair(1.0)
  kw = {"mode": "min", "factor": 0.5, "patience": 2, "threshold": 0.05, "cooldown": 1, "min_lr": 0.1}
  sched, tsched = LS.ReduceLROnPlateau(ours, **kw), TLS.ReduceLROnPlateau(theirs, **kw)
  metrics = [5, 4, 4, 4, 4, 3.99, 3.99] + [2] * 16
  for m in metrics:
    sched.step(Tensor([m]) if m == 2 else m); tsched.step(m)  # noqa: E702
    assert sched.get_last_lr()[0] == pytest.approx(theirs.param_groups[0]["lr"])
    assert float(ours.lr.numpy()[0]) == pytest.approx(theirs.param_groups[0]["lr"], rel=1e-6)
  assert theirs.param_groups[0]["lr"] == pytest.approx(0.1)  # it reduced down to min_lr


def test_optimizer_group_keeps_each_base_rate():
  a, b = Tensor([1.0], requires_grad=True), Tensor([1.0], requires_grad=True)
  group = nn.optim.OptimizerGroup(nn.optim.SGD([a], lr=0.1), nn.optim.Adam([b], lr=0.01))
  sched = LS.StepLR(group, step_size=1, gamma=0.5)
  sched.step(); sched.step()  # noqa: E702
  assert sched.get_last_lr() == pytest.approx([0.025, 0.0025])
  assert [float(o.lr.numpy()[0]) for o in group.optimizers] == pytest.approx([0.025, 0.0025])


def test_jitted_step_reads_the_scheduled_rate():
  w0 = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
  xs = [np.random.default_rng(1 + i).standard_normal((4, 3)).astype(np.float32) for i in range(6)]
  w = Tensor(w0.copy(), requires_grad=True)
  opt = nn.optim.SGD([w], lr=0.5, momentum=0.5)
  sched = LS.CosineAnnealingLR(opt, T_max=4, eta_min=0.05)

  @TinyJit
  def train(x):
    with Tensor.train():
      opt.zero_grad()
      loss = (x @ w).tanh().square().sum()
      loss.backward()
      opt.step()
    return loss.realize()

  tw = torch.tensor(w0.copy(), requires_grad=True)
  topt = torch.optim.SGD([tw], lr=0.5, momentum=0.5)
  tsched = TLS.CosineAnnealingLR(topt, T_max=4, eta_min=0.05)
  for x in xs:
    train(Tensor(x))
    topt.zero_grad()
    (torch.tensor(x) @ tw).tanh().square().sum().backward()
    topt.step()
    sched.step(); tsched.step()  # noqa: E702
  assert train.captured is not None  # the later steps were replays
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-5)  # float32 rates: torch keeps doubles


def test_errors():
  opt, _ = _pair()
  with pytest.raises(ValueError, match="step_size"): LS.StepLR(opt, 0)
  with pytest.raises(ValueError, match="cycle_momentum"): LS.OneCycleLR(opt, 1.0, total_steps=5, cycle_momentum=True)
  with pytest.raises(ValueError, match="total_steps"): LS.OneCycleLR(opt, 1.0)
  with pytest.raises(ValueError, match="anneal_strategy"): LS.OneCycleLR(opt, 1.0, total_steps=4, anneal_strategy="x")
  with pytest.raises(TypeError, match="optimizer"): LS.StepLR(torch.optim.SGD([torch.zeros(1)], lr=0.1), 2)
  s = LS.OneCycleLR(opt, 1.0, total_steps=2)
  s.step(); s.step()  # noqa: E702
  with pytest.raises(ValueError, match="past total_steps"): s.step()
