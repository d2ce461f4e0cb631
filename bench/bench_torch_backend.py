"""tiny as a PyTorch backend: one forward+backward step of a ResNet, torch eager vs `tiny` vs `torch.compile`.

Rows (ms per step, lower is better), on the CPU named in the case:
- torch: the model on torch's CPU, eager (its default threads);
- tiny eager: the model moved to `device="tiny"` (tiny_torch's dispatch, each aten op a lazy tiny op);
- tiny compile: `torch.compile(model, backend="tiny")` on the CPU model (AOTAutograd graphs replayed by TinyJit).

The model is torchvision's resnet18 when torchvision is installed, else `SmallResNet` below (BasicBlocks 16-32-64,
two per stage, BatchNorm, ReLU; the same structure at a size a 2-core VM runs in seconds). A step is zero_grad,
forward, cross-entropy, backward, and `loss.item()` (so the device has finished). The implementations take turns
(`settle.time_in_turns`, see bench_train.py for why). `BENCH_TORCH_ROUNDS` (default 3) rounds of
`BENCH_TORCH_STEPS` (default 3) timed steps; the figure is the median.

`python bench/bench_torch_backend.py` prints the rows; `run()` returns them.
"""
from __future__ import annotations

import copy
import os
import platform
import statistics
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, also when this file is loaded by path
from settle import time_in_turns  # noqa: E402

os.environ.setdefault("DEV", "CPU")

STEPS = int(os.environ.get("BENCH_TORCH_STEPS", 3))
ROUNDS = int(os.environ.get("BENCH_TORCH_ROUNDS", 3))


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo on Linux), else what platform reports."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"): return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def make_model() -> tuple[Any, str, tuple[int, ...]]:
  """(model, its name, input shape): torchvision's resnet18 if installed, else SmallResNet."""
  import torch
  import torch.nn as nn
  try:
    import torchvision  # type: ignore[import-not-found]
  except ImportError:
    torchvision = None
  torch.manual_seed(0)
  if torchvision is not None:
    return torchvision.models.resnet18(num_classes=10), "torchvision resnet18", (8, 3, 64, 64)

  class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
      super().__init__()
      self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
      self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
      self.down = None if stride == 1 and cin == cout else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                                         nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
      y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
      return torch.relu(y + (x if self.down is None else self.down(x)))

  class SmallResNet(nn.Module):
    """resnet18's structure, narrower and shallower: stem, 3 stages of 2 BasicBlocks, global pool, linear."""

    def __init__(self) -> None:
      super().__init__()
      self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
      self.stages = nn.Sequential(Block(16, 16, 1), Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1),
                                  Block(32, 64, 2), Block(64, 64, 1))
      self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
      return self.fc(self.stages(self.stem(x)).mean((2, 3)))

  return SmallResNet(), "SmallResNet (torchvision not installed)", (8, 3, 32, 32)


def make_step(model: Any, device: str, shape: tuple[int, ...]) -> Callable[[], float]:
  """A zero_grad + forward + backward + loss.item() step of `model` on `device`."""
  import torch
  x, y = torch.randn(*shape).to(device), torch.randint(0, 10, (shape[0],)).to(device)

  def step() -> float:
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item()
  return step


def run() -> dict[str, dict[str, Any]]:
  """{case: {implementation: ms per step, unit, better}}."""
  import torch
  import tiny_torch  # noqa: F401  (registers the device and the compile backend)
  model, name, shape = make_model()
  steps = {"torch": make_step(copy.deepcopy(model), "cpu", shape),
           "tiny eager": make_step(copy.deepcopy(model).to("tiny"), "tiny", shape),
           "tiny compile": make_step(torch.compile(copy.deepcopy(model), backend="tiny"), "cpu", shape)}
  for fn in steps.values(): fn()  # compile / first-run costs are not steps
  times = time_in_turns(steps, ROUNDS, STEPS)
  row: dict[str, Any] = {"unit": "ms", "better": "lower"}
  row.update({k: statistics.median(v) * 1e3 for k, v in times.items()})
  return {f"{name} fwd+bwd, batch {shape[0]}x{shape[2]}x{shape[3]}, on {cpu_name()}": row}


if __name__ == "__main__":
  for case, r in run().items():
    print(case, "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
  sys.exit(0)
