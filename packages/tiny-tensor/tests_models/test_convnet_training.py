"""A small convnet's TinyJit training steps (conv 5x5 -> BatchNorm -> max-pool -> conv 3x3 -> max-pool -> linear,
Adam) against torch with the same initial weights and data: the loss of every step and every parameter and running
statistic after the last. Sized so the backward takes the paths `bench/bench_train.py` times: BatchNorm statistics
and conv bias gradients summed as per-image partials (`_split_channel_reduce`: 64 x 16 >= 1024 (image, channel)
pairs, 36864 elements per channel), conv weight gradients split over batch chunks and blocked around their taps with
widened channel vectors."""
import numpy as np
import torch
import torch.nn as tnn
import torch.nn.functional as F

from tiny_tensor import Tensor, TinyJit, nn
from tiny_tensor.nn.state import get_parameters

BS, STEPS = 64, 3


class _Net:
  def __init__(self) -> None:
    self.c1, self.bn, self.c2, self.fc = nn.Conv2d(1, 16, 5), nn.BatchNorm(16), nn.Conv2d(16, 32, 3), \
      nn.Linear(800, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.bn(self.c1(x).relu()).max_pool2d()
    return self.fc(self.c2(x).relu().max_pool2d().flatten(1))


def test_convnet_adam_steps_match_torch():
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  xs, ys = rng.random((BS, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, BS).astype(np.int32)
  ref = tnn.Sequential(tnn.Conv2d(1, 16, 5), tnn.ReLU(), tnn.BatchNorm2d(16), tnn.MaxPool2d(2), tnn.Conv2d(16, 32, 3),
                       tnn.ReLU(), tnn.MaxPool2d(2), tnn.Flatten(), tnn.Linear(800, 10))
  net = _Net()
  pairs = [(net.c1, ref[0]), (net.bn, ref[2]), (net.c2, ref[4]), (net.fc, ref[8])]
  for ours, theirs in pairs:
    ours.weight = Tensor(theirs.weight.detach().numpy().copy(), requires_grad=True)
    ours.bias = Tensor(theirs.bias.detach().numpy().copy(), requires_grad=True)
  # eps 1e-3, not 1e-8: a dead ReLU channel's gradient is 0 in exact arithmetic and ~1e-9 of float32 round-off in
  # either library, which Adam with eps 1e-8 turns into a step of ~0.1 lr of either sign
  opt = nn.optim.Adam(get_parameters(net), lr=1e-2, eps=1e-3)
  topt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-3)
  x, y = Tensor(xs, requires_grad=False), Tensor(ys, requires_grad=False)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = net(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()

  tx, ty = torch.from_numpy(xs), torch.from_numpy(ys).long()
  for i in range(STEPS):
    topt.zero_grad()
    tloss = F.cross_entropy(ref(tx), ty)
    tloss.backward()
    topt.step()
    np.testing.assert_allclose(step(x, y).item(), tloss.item(), rtol=2e-4, err_msg=f"loss of step {i}")
  for (ours, theirs), name in zip(pairs, ["conv1", "bn", "conv2", "fc"]):
    for p in ("weight", "bias"):
      np.testing.assert_allclose(getattr(ours, p).numpy(), getattr(theirs, p).detach().numpy(), rtol=1e-3, atol=1e-4,
                                 err_msg=f"{name}.{p} after {STEPS} steps")
  np.testing.assert_allclose(net.bn.running_mean.numpy(), ref[2].running_mean.numpy(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(net.bn.running_var.numpy(), ref[2].running_var.numpy(), rtol=1e-4, atol=1e-6)


STEP_KERNELS = 56
"""Kernels in one training step of `_Net` (forward, backward, Adam) on the CPU: a bound that must not go up. 62 until
the conv bias gradients summed the weight gradient's channels-last copy (the second conv's input gradient then has
one reader left, and is stored as that channels-last copy with the ReLU backward fused), 60 until BatchNorm's
backward was given in closed form, 58 until ReLU's gradient was taken from its output (each conv's ReLU then fuses
into it: the map before the ReLU is no longer stored for the backward)."""


def test_convnet_step_kernel_count_does_not_go_up():
  from tiny_tensor import Device, engine
  net = _Net()
  opt = nn.optim.Adam(get_parameters(net), lr=1e-2, eps=1e-3)
  rng = np.random.default_rng(0)
  x = Tensor(rng.random((BS, 1, 28, 28), dtype=np.float32), requires_grad=False)
  y = Tensor(rng.integers(0, 10, BS).astype(np.int32), requires_grad=False)

  def step() -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = net(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()
  step()  # (the first step also creates Adam's state)
  calls: list = []
  with engine.capture(calls.append): loss = step().item()
  kernels = [c.spec.name for c in calls if c.kind == "kernel"]
  if Device.DEFAULT == "CPU": assert len(kernels) <= STEP_KERNELS, (len(kernels), kernels)
  assert np.isfinite(loss)  # (the values against torch: `test_convnet_adam_steps_match_torch`)
