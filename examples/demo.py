"""tiny's first demo: train a small convolutional network on handwritten digits, on the CPU, in about a minute.

    python examples/demo.py            # (nox -s demo)
    python examples/demo.py --steps 100 --quiet

Uses MNIST when its idx files are on disk ($MNIST_DIR or ~/.cache/mnist), else scikit-learn's bundled 8x8 digits
(real handwritten data, no download). The training step is a TinyJit: after two calls it replays its kernels with no
Python scheduling. Prints held-out test accuracy, training steps/s and kernels per step.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

from tiny_tensor import GlobalCounters, Tensor, TinyJit, nn  # noqa: E402
from tiny_tensor.nn.state import get_parameters  # noqa: E402
from tiny_tensor.progress import tqdm  # noqa: E402


class ConvNet:
  """A small LeNet-style network: conv-BN-relu blocks with max-pooling, then a linear layer."""

  def __init__(self, size: int):
    if size >= 28:  # MNIST: the bench network (conv5 32, conv5 32, BN, pool, conv3 64, conv3 64, BN, pool)
      self.blocks = [[nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32),
                      Tensor.max_pool2d],
                     [nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, nn.BatchNorm(64),
                      Tensor.max_pool2d]]
      feats = 64 * 3 * 3
    else:  # 8x8 digits: conv-BN-relu, pool to 4x4, conv-BN-relu (98% in torch with this recipe)
      self.blocks = [[nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm(16), Tensor.relu, Tensor.max_pool2d,
                      nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm(16), Tensor.relu]]
      feats = 16 * (size // 2) * (size // 2)
    self.head = nn.Linear(feats, 10)

  def __call__(self, x: Tensor) -> Tensor:
    for block in self.blocks:
      for layer in block: x = layer(x)
    return self.head(x.flatten(1))


def augment(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Shift each image by up to one pixel in each direction (zero fill): cheap augmentation for the small 8x8 set."""
  n, _, h, w = x.shape
  padded = np.pad(x[:, 0], ((0, 0), (1, 1), (1, 1)))  # (n, h+2, w+2)
  dy, dx = rng.integers(0, 3, n), rng.integers(0, 3, n)
  rows = (dy[:, None] + np.arange(h))[:, :, None]  # (n, h, 1)
  cols = (dx[:, None] + np.arange(w))[:, None, :]  # (n, 1, w)
  return padded[np.arange(n)[:, None, None], rows, cols][:, None].astype(np.float32)


def main(argv: list[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", 0)) or None,
                  help="training steps (default: 1000)")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--seed", type=int, default=42)
  ap.add_argument("--augment", action="store_true", help="shift training images by up to a pixel")
  ap.add_argument("--quiet", action="store_true", help="no progress bar")
  args = ap.parse_args(argv)

  X_train, Y_train, X_test, Y_test, name = mnist_data.load()
  size = X_train.shape[-1]
  steps = args.steps or 1000
  print(f"dataset: {name}: {len(X_train)} train / {len(X_test)} test images of {size}x{size}")

  Tensor.manual_seed(args.seed)
  rng = np.random.default_rng(args.seed)
  model = ConvNet(size)
  opt = nn.optim.Adam(get_parameters(model), lr=args.lr)

  @TinyJit
  def train_step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()

  @TinyJit
  def predict(x: Tensor) -> Tensor: return model(x).argmax(axis=1).realize()

  t0 = time.perf_counter()
  kernels, timed, t_steady = 0, 0, 0.0
  bar = tqdm(range(steps), desc="train", disable=args.quiet, mininterval=0.5)
  for i in bar:
    idx = rng.integers(0, len(X_train), args.batch)
    # the batch is data: requires_grad=False, or backward would fill x.grad too (tinygrad's semantics)
    x = Tensor(augment(X_train[idx], rng) if args.augment else X_train[idx], requires_grad=False)
    y = Tensor(Y_train[idx], requires_grad=False)
    if i in (int(steps * 0.6), int(steps * 0.85)):  # step decay: lr is a tensor the jitted kernels read
      opt.lr.assign(opt.lr * 0.3).realize()
    GlobalCounters.reset()
    st = time.perf_counter()
    loss = train_step(x, y)
    if i >= 2:  # steady state: the jit replays (calls 1 and 2 compile and capture)
      t_steady += time.perf_counter() - st
      timed += 1
      kernels = GlobalCounters.kernel_count
    if i % 20 == 0 or i == steps - 1: bar.set_description(f"train loss {loss.item():.3f}")
  train_s = time.perf_counter() - t0

  # held-out accuracy, in fixed-size batches (the jitted predict needs one shape: pad the last batch)
  n, bs = len(X_test), 128
  correct = 0
  for s in range(0, n, bs):
    xb = X_test[s:s + bs]
    pad = bs - len(xb)
    if pad: xb = np.concatenate([xb, np.zeros((pad, *xb.shape[1:]), dtype=xb.dtype)])
    pred = predict(Tensor(xb)).numpy()[:bs - pad]
    correct += int((pred == Y_test[s:s + bs]).sum())
  acc = correct / n
  res = {"dataset": name, "test_accuracy": acc, "steps": steps, "train_s": train_s,
         "steps_per_s": timed / t_steady if t_steady else 0.0, "kernels_per_step": kernels}
  print(f"held-out test accuracy: {acc * 100:.2f}% ({correct}/{n})")
  print(f"training: {steps} steps of batch {args.batch} in {train_s:.1f} s (compile included); "
        f"{res['steps_per_s']:.1f} steps/s replayed by TinyJit; {kernels} kernels/step")
  return res


if __name__ == "__main__":
  from tiny_uop.plugins.cli import run_main
  sys.exit(run_main(main, "demo"))
