"""Jitted programs the HCQ graph tests run on several devices and replay paths (HCQ2, JIT=2) to compare results."""
from __future__ import annotations

import numpy as np


def train_losses(device: str, steps: int) -> tuple[list[float], int, list[np.ndarray]]:
  """A small convnet trained with Adam by a TinyJit step on `device`: (the losses of `steps` steps, kernels per step,
  the trained weights)."""
  from tiny_tensor import Tensor, TinyJit, nn
  from tiny_tensor.nn.state import get_parameters
  rng = np.random.default_rng(0)
  conv, lin = nn.Conv2d(1, 4, 3), nn.Linear(4 * 6 * 6, 10)
  for p in get_parameters([conv, lin]): p.replace(p.to(device)).realize()
  opt = nn.optim.Adam(get_parameters([conv, lin]), lr=0.01)
  xs = [Tensor(rng.standard_normal((4, 1, 8, 8)).astype(np.float32), device=device) for _ in range(steps)]
  ys = [Tensor(rng.integers(0, 10, 4).astype(np.int32), device=device) for _ in range(steps)]

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = lin(conv(x).relu().flatten(1)).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()
  losses = [step(x, y).item() for x, y in zip(xs, ys)]
  return losses, step.captured.kernel_count, [p.numpy() for p in get_parameters([conv, lin])]


def several_kernels(device: str, reps: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
  """A jitted function of several kernels, a bound Variable and two inputs replayed `reps` times with new values:
  the outputs of every call, checked against numpy here."""
  from tiny_tensor import Tensor, TinyJit
  from tiny_uop import Variable

  @TinyJit
  def f(a: Tensor, b: Tensor, k) -> tuple[Tensor, Tensor]:
    h = (a * 2 + b).relu().contiguous()
    s = (h * Tensor.from_uop(k, device=device).cast(a.dtype)).sum(axis=1)
    return s.realize(), (h - a).exp2().realize()
  v = Variable("k", 1, 100)
  outs = []
  for i in range(reps):
    rng = np.random.default_rng(i)
    an, bn = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    s, e = f(Tensor(an, device=device), Tensor(bn, device=device), v.bind(1 + 3 * i))
    outs.append((s.numpy(), e.numpy()))
    h = np.maximum(an * 2 + bn, 0)
    np.testing.assert_allclose(outs[-1][0], (h * (1 + 3 * i)).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[-1][1], np.exp2(h - an), rtol=1e-5)
  return outs
