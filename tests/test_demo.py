"""The README's first command, examples/demo.py, shortened: a jitted convnet learns handwritten digits on the CPU.

Needs a digits dataset: MNIST's idx files on disk, else scikit-learn (its bundled 8x8 digits); skipped without both.
"""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name: str):
  spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_demo_learns_digits():
  data = _load("mnist_data")
  if data.load_mnist() is None: pytest.importorskip("sklearn", reason="no MNIST on disk and no scikit-learn digits")
  demo = _load("demo")
  res = demo.main(["--steps", "300", "--quiet"])
  assert res["test_accuracy"] >= 0.97, res  # (98.3% at this seed; the full 1000-step demo 98.9%)
  assert res["kernels_per_step"] > 0 and res["steps_per_s"] > 0
