"""Handwritten digits for the demo, without downloading anything.

`load()` returns `(X_train, Y_train, X_test, Y_test, name)` with X float32 (N, 1, H, W) scaled to [0, 1] and Y int32:
- MNIST (28x28, 60k/10k) when its standard idx files are on disk: in `$MNIST_DIR`, `~/.cache/mnist`, or
  `~/.cache/tinygrad/downloads/mnist` (names `train-images-idx3-ubyte[.gz]` etc.);
- otherwise scikit-learn's bundled `load_digits` (8x8, 1797 real handwritten digits from UCI), split 80/20 with a
  fixed seed (stratified by class).
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _read_idx(path: Path) -> np.ndarray:
  raw = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
  zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
  if zero != 0 or dtype_code != 0x08: raise ValueError(f"{path}: not an idx file of uint8")
  shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
  return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(name: str) -> Path | None:
  dirs = [os.environ.get("MNIST_DIR", ""), "~/.cache/mnist", "~/.cache/tinygrad/downloads/mnist"]
  for d in filter(None, dirs):
    for suffix in ("", ".gz"):
      p = Path(d).expanduser() / (name + suffix)
      if p.is_file(): return p
  return None


def load_mnist() -> tuple[np.ndarray, ...] | None:
  """MNIST from disk, or None when any of its four files is missing."""
  paths = [_find(n) for n in MNIST_FILES]
  if any(p is None for p in paths): return None
  xtr, ytr, xte, yte = (_read_idx(p) for p in paths)  # type: ignore[arg-type]
  f = lambda x: (x.astype(np.float32) / 255.0)[:, None]  # noqa: E731
  return f(xtr), ytr.astype(np.int32), f(xte), yte.astype(np.int32)


def load_sklearn_digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, ...]:
  """scikit-learn's 8x8 digits, split per class into train/test with a fixed seed."""
  from sklearn.datasets import load_digits
  d = load_digits()
  x, y = (d.images.astype(np.float32) / 16.0)[:, None], d.target.astype(np.int32)
  rng = np.random.default_rng(seed)
  test = np.zeros(len(y), dtype=bool)
  for c in range(10):
    idx = rng.permutation(np.flatnonzero(y == c))
    test[idx[:int(round(len(idx) * test_fraction))]] = True
  return x[~test], y[~test], x[test], y[test]


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
  """(X_train, Y_train, X_test, Y_test, dataset name): MNIST when on disk, else scikit-learn's digits."""
  if (m := load_mnist()) is not None: return (*m, "MNIST (28x28, from disk)")
  try: return (*load_sklearn_digits(), "scikit-learn digits (8x8, 1797 real handwritten samples, 20% held out)")
  except ImportError as e:
    raise SystemExit("no digits dataset: put MNIST's idx files in $MNIST_DIR, or `pip install scikit-learn` "
                     "(it ships an 8x8 handwritten digits set)") from e
