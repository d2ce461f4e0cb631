"""Training step of a small MNIST convnet, and TinyJit replay overhead.

1. ms per training step (TinyJit-replayed) of conv5x5 32 -> conv5x5 32 -> BN -> maxpool -> conv3x3 64 -> conv3x3 64 ->
   BN -> maxpool -> linear 576->10, batch 128 of 28x28, Adam; side by side with torch (CPU, its default threads) and
   tinygrad (TinyJit) when importable. Targets: faster than tinygrad, <= 0.8x torch (issue #39).
2. µs per call of a jitted one-kernel function (`(x + 1).realize()` on 16 floats) once replaying: the cost of the
   replay machinery itself. Target: <= 50 µs.

`python bench/bench_train.py` prints the rows; `run()` returns them.

How the step time is sampled: the libraries take turns (`settle.time_in_turns`). Each of `BENCH_TRAIN_ROUNDS`
(default 5) rounds gives every library `settle()`, `warm_up(step)`, then `BENCH_TRAIN_STEPS` (default 3) timed
steps; each library's figure is the median of all its timed steps. On this project's shared 2-core VM the speed of
the same compute-bound kernel drifts by up to 1.8x over seconds (tiny's largest conv kernel: 15-28 ms between
back-to-back calls on 2 threads, 29.6-30.9 ms on 1), so timing one library's steps and then the other's compared two
different machines: the ratio to torch swung 0.88-1.06x over 3 steps and 0.85-1.09x over 7. Taking turns spreads
every library over the same stretch of time.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, also when this file is loaded by path
from settle import time_in_turns  # noqa: E402

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU: with an OpenCL ICD installed (PoCL)
                                    # tinygrad would otherwise pick CL

BS = 128
STEPS = int(os.environ.get("BENCH_TRAIN_STEPS", 3))
ROUNDS = int(os.environ.get("BENCH_TRAIN_ROUNDS", 5))


def _prepare(step: Callable[[], Any], warmup: int = 2) -> Callable[[], Any]:
  """`step` after `warmup` calls (which compile and capture)."""
  for _ in range(warmup): step()
  return step


def train_in_turns(steps: dict[str, Callable[[], Any]], rounds: int = ROUNDS) -> dict[str, float]:
  """Median ms per step of each library, the libraries timed in turns (see the module documentation)."""
  return {name: statistics.median(t) * 1e3 for name, t in time_in_turns(steps, rounds, STEPS).items()}


def _data() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  return rng.random((BS, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, BS).astype(np.int32)


def tiny_train_step() -> Callable[[], Any]:
  from tiny_tensor import Tensor, TinyJit, nn
  from tiny_tensor.nn.state import get_parameters

  class Net:
    def __init__(self) -> None:
      self.layers: list[Callable[[Tensor], Tensor]] = [
        nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32), Tensor.max_pool2d,
        nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, nn.BatchNorm(64), Tensor.max_pool2d,
        lambda x: x.flatten(1), nn.Linear(576, 10)]
    def __call__(self, x: Tensor) -> Tensor:
      for f in self.layers: x = f(x)
      return x
  model = Net()
  opt = nn.optim.Adam(get_parameters(model))
  xs, ys = _data()
  # data: no gradient wanted (tinygrad's semantics would compute x.grad before opt.step overwrites the weights)
  x, y = Tensor(xs, requires_grad=False), Tensor(ys, requires_grad=False)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()
  return _prepare(lambda: step(x, y))


def torch_train_step() -> Callable[[], Any]:
  import torch
  tnn = torch.nn
  model = tnn.Sequential(tnn.Conv2d(1, 32, 5), tnn.ReLU(), tnn.Conv2d(32, 32, 5), tnn.ReLU(), tnn.BatchNorm2d(32),
                         tnn.MaxPool2d(2), tnn.Conv2d(32, 64, 3), tnn.ReLU(), tnn.Conv2d(64, 64, 3), tnn.ReLU(),
                         tnn.BatchNorm2d(64), tnn.MaxPool2d(2), tnn.Flatten(), tnn.Linear(576, 10))
  opt = torch.optim.Adam(model.parameters())
  xs, ys = _data()
  x, y = torch.from_numpy(xs), torch.from_numpy(ys).long()

  def step() -> None:
    opt.zero_grad()
    tnn.functional.cross_entropy(model(x), y).backward()
    opt.step()
  return _prepare(step)


def tinygrad_train_step() -> Callable[[], Any]:
  from tinygrad import Device, Tensor, TinyJit, nn  # type: ignore[import-not-found]
  dev = Device[Device.DEFAULT]  # its CPU queue runs kernels asynchronously: time until they are done
  layers = [nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32), Tensor.max_pool2d,
            nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, nn.BatchNorm(64), Tensor.max_pool2d,
            lambda x: x.flatten(1), nn.Linear(576, 10)]
  opt = nn.optim.Adam(nn.state.get_parameters(layers))
  xs, ys = _data()
  x, y = Tensor(xs), Tensor(ys)

  from tinygrad.helpers import Context  # type: ignore[import-not-found]

  @TinyJit
  def step(x: Any, y: Any) -> Any:
    with Context(TRAINING=1):  # 0.14 has no Tensor.train
      opt.zero_grad()
      loss = x.sequential(layers).sparse_categorical_crossentropy(y).backward()
      return loss.realize(*opt.schedule_step())
  return _prepare(lambda: (step(x, y), dev.synchronize()))


def _replay_us(make: Callable[[], tuple[Callable, Any]], reps: int = 500) -> float:
  fn, x = make()
  for _ in range(5): fn(x)
  means = []
  for _ in range(5):
    st = time.perf_counter()
    for _ in range(reps): fn(x)
    means.append((time.perf_counter() - st) / reps)
  return sorted(means)[2] * 1e6


def tiny_replay_us() -> float:
  def make() -> tuple[Callable, Any]:
    from tiny_tensor import Tensor, TinyJit
    return TinyJit(lambda x: (x + 1).realize()), Tensor(np.ones(16, np.float32)).realize()
  return _replay_us(make)


def tinygrad_replay_us() -> float:
  def make() -> tuple[Callable, Any]:
    from tinygrad import Device, Tensor, TinyJit  # type: ignore[import-not-found]
    dev, jit = Device[Device.DEFAULT], TinyJit(lambda x: (x + 1).realize())
    return (lambda x: (jit(x), dev.synchronize())), Tensor(np.ones(16, np.float32)).realize()  # ours waits too
  return _replay_us(make)


def run() -> dict[str, dict[str, Any]]:
  train: dict[str, Any] = {"unit": "ms", "better": "lower", "target": "faster than tinygrad, <= 0.8x torch (issue #39)"}
  replay: dict[str, Any] = {"unit": "us", "better": "lower", "target": "tiny <= 50 us"}
  steps = {"tiny": tiny_train_step()}
  try: steps["torch"] = torch_train_step()
  except ImportError: pass
  try:
    import tinygrad  # type: ignore[import-not-found]  # noqa: F401
  except ImportError: tinygrad_there = False
  else:
    # tinygrad's CPU device compiles with clang: without it on PATH its column says so instead of failing the bench
    tinygrad_there = shutil.which("clang") is not None
    if tinygrad_there: steps["tinygrad"] = tinygrad_train_step()
    else: train["tinygrad"] = replay["tinygrad"] = "n/a (its CPU device compiles with clang: not on PATH)"
  train.update(train_in_turns(steps))
  replay["tiny"] = tiny_replay_us()
  if tinygrad_there: replay["tinygrad"] = tinygrad_replay_us()
  return {f"convnet train step, batch {BS} 28x28, Adam": train, "TinyJit replay, one kernel": replay}


if __name__ == "__main__":
  for case, r in run().items():
    print(case, "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
  sys.exit(0)
