"""Learning-rate schedulers with torch.optim.lr_scheduler's names, arguments and values.

A scheduler owns no state on the device: it counts steps on the host and writes the new rate into the optimizer's
`lr` buffer (a one-element realized tensor). A `TinyJit`-compiled training step reads that buffer on every replay,
so stepping the scheduler outside the jitted function changes the rate without recompiling anything.

As in torch, constructing a scheduler applies its rate at step 0, and `step()` advances one step (call it after
`opt.step()`); `get_last_lr()` is the rate(s) in use. With an `OptimizerGroup` every optimizer gets its own rate,
scaled from its own base rate.

>>> from tiny_tensor import Tensor, nn
>>> opt = nn.optim.SGD([Tensor([1.0], requires_grad=True)], lr=0.1)
>>> sched = nn.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
>>> lrs = []
>>> for _ in range(5): lrs.append(round(sched.get_last_lr()[0], 6)); sched.step()
>>> lrs
[0.1, 0.1, 0.05, 0.05, 0.025]
"""
from __future__ import annotations

import bisect
import math
from typing import Callable, Sequence

import numpy as np

from tiny_tensor.nn.optim import Optimizer, OptimizerGroup
from tiny_tensor.tensor import Tensor

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "ExponentialLR", "LinearLR", "CosineAnnealingLR",
           "OneCycleLR", "SequentialLR", "ReduceLROnPlateau", "LRSchedulerGroup"]


def _leaf_optimizers(opt: Optimizer) -> list[Optimizer]:
  """The optimizers whose `lr` a scheduler drives: the members of an OptimizerGroup (nested ones too), or `opt`."""
  out, stack = [], [opt]
  while stack:
    o = stack.pop()
    if isinstance(o, OptimizerGroup): stack.extend(reversed(o.optimizers))
    else: out.append(o)
  return out


def _read_lr(o: Optimizer) -> float: return float(o.lr.numpy().reshape(-1)[0])


def _write_lr(o: Optimizer, lr: float) -> None:
  """Copy `lr` into the optimizer's rate buffer in place (a jitted step keeps reading the same buffer)."""
  o.lr.assign(Tensor(np.full(tuple(o.lr.shape), lr, dtype=np.float32), device=o.lr.device, dtype=o.lr.dtype))
  o.lr.realize()


class LRScheduler:
  """Base class: `lr_at(i, epoch)` is the closed form of the schedule for optimizer `i`; `step()` advances
  `last_epoch`. `base_lrs` are the optimizers' rates when the scheduler is built (OneCycleLR: its initial rates)."""

  def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
    if not isinstance(optimizer, Optimizer):
      raise TypeError(f"{type(self).__name__} needs an nn.optim optimizer, got {type(optimizer).__name__}")
    if last_epoch != -1: raise ValueError(f"last_epoch={last_epoch}: resuming a schedule is not supported, use -1")
    self.optimizer = optimizer
    self.optimizers = _leaf_optimizers(optimizer)
    # as torch's group["initial_lr"]: the rate before any scheduler touched it, shared by every scheduler of `o`
    for o in self.optimizers:
      if getattr(o, "initial_lr", None) is None: o.initial_lr = _read_lr(o)
    self.base_lrs: list[float] = [_read_lr(o) if o.initial_lr is None else o.initial_lr for o in self.optimizers]
    self.last_epoch = -1
    self._last_lr: list[float] = []
    self.step()  # step 0: apply the schedule's first rate, as torch does

  def lr_at(self, i: int, epoch: int) -> float:
    """The rate of optimizer `i` (base rate `base_lrs[i]`) at step `epoch`."""
    raise NotImplementedError(f"{type(self).__name__} must implement lr_at")

  def get_last_lr(self) -> list[float]:
    """The rates the last `step()` set, one per optimizer."""
    return list(self._last_lr)

  def _apply(self, lrs: list[float]) -> None:
    for o, lr in zip(self.optimizers, lrs): _write_lr(o, lr)
    self._last_lr = lrs

  def step(self) -> None:
    """Advance one step and write the new rate(s) into the optimizer(s)."""
    self.last_epoch += 1
    self._apply([self.lr_at(i, self.last_epoch) for i in range(len(self.base_lrs))])


class LambdaLR(LRScheduler):
  """lr = base_lr * lr_lambda(epoch)."""

  def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float], last_epoch: int = -1):
    self.lr_lambda = lr_lambda
    super().__init__(optimizer, last_epoch)

  def lr_at(self, i: int, epoch: int) -> float: return self.base_lrs[i] * float(self.lr_lambda(epoch))


class StepLR(LRScheduler):
  """lr = base_lr * gamma ** (epoch // step_size)."""

  def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
    if not isinstance(step_size, int) or step_size <= 0:
      raise ValueError(f"step_size={step_size!r}: must be an int > 0")
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer, last_epoch)

  def lr_at(self, i: int, epoch: int) -> float: return self.base_lrs[i] * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
  """lr = base_lr * gamma ** (number of milestones <= epoch); a milestone listed twice counts twice (as in torch)."""

  def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1):
    self.milestones, self.gamma = sorted(int(m) for m in milestones), gamma
    super().__init__(optimizer, last_epoch)

  def lr_at(self, i: int, epoch: int) -> float:
    return self.base_lrs[i] * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
  """lr = base_lr * gamma ** epoch."""

  def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
    self.gamma = gamma
    super().__init__(optimizer, last_epoch)

  def lr_at(self, i: int, epoch: int) -> float: return self.base_lrs[i] * self.gamma ** epoch


class LinearLR(LRScheduler):
  """Linear warmup (or decay) of the factor from `start_factor` to `end_factor` over `total_iters` steps, then kept:
  lr = base_lr * (start + (end - start) * min(epoch, total_iters) / total_iters)."""

  def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5,
               last_epoch: int = -1):
    if not 0 < start_factor <= 1: raise ValueError(f"start_factor={start_factor}: must be in (0, 1]")
    if not 0 <= end_factor <= 1: raise ValueError(f"end_factor={end_factor}: must be in [0, 1]")
    if total_iters <= 0: raise ValueError(f"total_iters={total_iters}: must be > 0")
    self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
    super().__init__(optimizer, last_epoch)

  def lr_at(self, i: int, epoch: int) -> float:
    frac = min(epoch, self.total_iters) / self.total_iters
    return self.base_lrs[i] * (self.start_factor + (self.end_factor - self.start_factor) * frac)


class CosineAnnealingLR(LRScheduler):
  """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (SGDR without restarts; past T_max the
  cosine goes on, as torch's does)."""

  def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
    if T_max <= 0: raise ValueError(f"T_max={T_max}: must be > 0")
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer, last_epoch)

  def lr_at(self, i: int, epoch: int) -> float:
    return self.eta_min + (self.base_lrs[i] - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class OneCycleLR(LRScheduler):
  """The 1cycle policy (Smith & Topin): from max_lr/div_factor up to max_lr over the first `pct_start` of
  `total_steps`, then down to max_lr/div_factor/final_div_factor (`three_phase`: back to the initial rate first, then
  down), annealed by cosine ('cos') or linearly ('linear'); torch's phase boundaries.

  The momentum cycling of torch (`cycle_momentum=True`, its default) is not done here: the optimizers' momenta are
  constants of the compiled step, so it must be False."""

  def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float], total_steps: int | None = None,
               epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
               anneal_strategy: str = "cos", cycle_momentum: bool = False, div_factor: float = 25.0,
               final_div_factor: float = 1e4, three_phase: bool = False, last_epoch: int = -1):
    if cycle_momentum:
      raise ValueError("cycle_momentum=True is not supported (momenta are compiled into the optimizer's step); "
                       "pass cycle_momentum=False")
    if total_steps is None:
      if epochs is None or steps_per_epoch is None:
        raise ValueError("OneCycleLR needs total_steps, or both epochs and steps_per_epoch")
      total_steps = epochs * steps_per_epoch
    if total_steps <= 0: raise ValueError(f"total_steps={total_steps}: must be > 0")
    if not 0 <= pct_start <= 1: raise ValueError(f"pct_start={pct_start}: must be in [0, 1]")
    if anneal_strategy not in ("cos", "linear"):
      raise ValueError(f"anneal_strategy={anneal_strategy!r}: valid are 'cos' and 'linear'")
    n = len(_leaf_optimizers(optimizer))
    maxs = [float(max_lr)] * n if isinstance(max_lr, (int, float)) else [float(m) for m in max_lr]
    if len(maxs) != n: raise ValueError(f"max_lr has {len(maxs)} values for {n} optimizers")
    self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
    self._rates = [(m / div_factor, m, m / div_factor / final_div_factor) for m in maxs]  # (initial, max, min)
    up = float(pct_start * total_steps) - 1
    # phases: (end step, start rate, end rate) with rates 0=initial, 1=max, 2=min (torch's boundaries)
    self._phases = [(up, 0, 1), (float(2 * pct_start * total_steps) - 2, 1, 0), (total_steps - 1, 0, 2)] \
      if three_phase else [(up, 0, 1), (total_steps - 1, 1, 2)]
    for o, r in zip(_leaf_optimizers(optimizer), self._rates): o.initial_lr = r[0]
    super().__init__(optimizer, last_epoch)

  def _anneal(self, start: float, end: float, pct: float) -> float:
    if self.anneal_strategy == "cos": return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
    return (end - start) * pct + start

  def lr_at(self, i: int, epoch: int) -> float:
    if epoch > self.total_steps:
      raise ValueError(f"stepped {epoch} times, past total_steps={self.total_steps}")
    rates = self._rates[i]
    start = 0.0
    for i, (end, a, b) in enumerate(self._phases):
      if epoch <= end or i == len(self._phases) - 1:
        return self._anneal(rates[a], rates[b], (epoch - start) / (end - start))
      start = end
    raise AssertionError("unreachable: the last phase always returns")


class SequentialLR(LRScheduler):
  """Runs `schedulers[0]` until `milestones[0]`, then `schedulers[1]` from its own step 0, and so on (e.g. a LinearLR
  warmup followed by CosineAnnealingLR). Every scheduler must drive the same optimizer."""

  def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
               last_epoch: int = -1):
    if len(schedulers) < 1: raise ValueError("SequentialLR needs at least one scheduler")
    if len(milestones) != len(schedulers) - 1:
      raise ValueError(f"SequentialLR needs {len(schedulers) - 1} milestones for {len(schedulers)} schedulers, "
                       f"got {len(milestones)}")
    for i, s in enumerate(schedulers):
      if not isinstance(s, LRScheduler):
        raise ValueError(f"scheduler {i} is a {type(s).__name__}: only closed-form schedulers can be sequenced")
      if s.optimizer is not optimizer: raise ValueError(f"scheduler {i} drives another optimizer than SequentialLR's")
    self.schedulers, self.milestones = list(schedulers), [int(m) for m in milestones]
    super().__init__(optimizer, last_epoch)

  def lr_at(self, i: int, epoch: int) -> float:
    k = bisect.bisect_right(self.milestones, epoch)
    return self.schedulers[k].lr_at(i, epoch - (self.milestones[k - 1] if k else 0))


class ReduceLROnPlateau:
  """Multiplies the rate by `factor` once a metric passed to `step(metric)` has not improved for `patience` steps
  (torch's rule: 'rel' or 'abs' threshold, `cooldown`, `min_lr`, changes smaller than `eps` are skipped)."""

  def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
               threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
               min_lr: float | Sequence[float] = 0.0, eps: float = 1e-8):
    if mode not in ("min", "max"): raise ValueError(f"mode={mode!r}: valid are 'min' and 'max'")
    if threshold_mode not in ("rel", "abs"): raise ValueError(f"threshold_mode={threshold_mode!r}: valid: 'rel', 'abs'")
    if factor >= 1.0: raise ValueError(f"factor={factor}: must be < 1")
    self.optimizer, self.optimizers = optimizer, _leaf_optimizers(optimizer)
    n = len(self.optimizers)
    self.min_lrs = [float(min_lr)] * n if isinstance(min_lr, (int, float)) else [float(m) for m in min_lr]
    if len(self.min_lrs) != n: raise ValueError(f"min_lr has {len(self.min_lrs)} values for {n} optimizers")
    self.mode, self.factor, self.patience, self.threshold = mode, factor, patience, threshold
    self.threshold_mode, self.cooldown, self.eps = threshold_mode, cooldown, eps
    self.best = math.inf if mode == "min" else -math.inf
    self.num_bad_epochs = self.cooldown_counter = 0
    self.last_epoch = 0
    self._last_lr = [_read_lr(o) for o in self.optimizers]

  def get_last_lr(self) -> list[float]:
    """The rates in use, one per optimizer."""
    return list(self._last_lr)

  def is_better(self, current: float) -> bool:
    """Whether `current` improves on the best metric seen by more than the threshold."""
    sign = -1 if self.mode == "min" else 1
    bar = self.best * (1 + sign * self.threshold) if self.threshold_mode == "rel" else self.best + sign * self.threshold
    return current < bar if self.mode == "min" else current > bar

  def step(self, metric: float | Tensor) -> None:
    """Record one value of the watched metric (a float or a one-element Tensor) and reduce the rate if it stalled."""
    current = float(metric.item() if isinstance(metric, Tensor) else metric)
    self.last_epoch += 1
    if self.is_better(current): self.best, self.num_bad_epochs = current, 0
    else: self.num_bad_epochs += 1
    if self.cooldown_counter > 0: self.cooldown_counter, self.num_bad_epochs = self.cooldown_counter - 1, 0
    if self.num_bad_epochs > self.patience:
      for i, o in enumerate(self.optimizers):
        old = self._last_lr[i]
        new = max(old * self.factor, self.min_lrs[i])
        if old - new > self.eps:
          _write_lr(o, new)
          self._last_lr[i] = new
      self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0


class LRSchedulerGroup:
  """Steps several schedulers together (e.g. one per optimizer of an OptimizerGroup)."""

  def __init__(self, *schedulers: LRScheduler): self.schedulers = schedulers

  def step(self) -> None:
    """Step every scheduler."""
    for s in self.schedulers: s.step()
