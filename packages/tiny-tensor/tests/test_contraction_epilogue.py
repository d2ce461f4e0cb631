"""Elementwise rows shorter than a vector register upcast whole, one vector a row (issue #39).

mobilenet_v3_small's squeeze-excite scales multiply 14x14 and 7x7 maps by a gate per channel: LLVM's loop vectorizer
left those rows scalar. The LLVM source of each kernel (per register file) and the values.
"""
import numpy as np
import pytest

from tiny_tensor import Tensor, engine

rng = np.random.default_rng(39)


def _t(a: np.ndarray) -> Tensor:
  """A realized CPU tensor: these checks are of the CPU's schedule and LLVM source."""
  return Tensor(a, device="CPU").realize()


def _arr(*shape: int) -> np.ndarray:
  return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def _kernels(fn, *args: Tensor) -> tuple[np.ndarray, list]:
  """`fn(*args)` realized: its value and the kernel calls it made."""
  calls: list = []
  with engine.capture(calls.append): out = fn(*args).realize().numpy()
  return out, [c for c in calls if c.kind == "kernel"]


@pytest.mark.parametrize("width", [64, 32])
def test_short_rows_are_one_vector_each(vector_registers, width: int):
  # the squeeze-excite scale of a 14x14 map (and 7x7): rows shorter than a vector register (AVX-512: 16 floats,
  # AVX2: 8), which LLVM's loop vectorizer left scalar, are upcast whole: one 14-lane (7-lane) vector multiply a row;
  # a row of a register or more is left to the loop vectorizer; values as numpy's
  vector_registers(32 if width == 64 else 16, width)
  for c, h in ((240, 14), (576, 7)):
    c += width == 32  # another shape per register file: the compiled kernels are cached by their AST
    x, g = _arr(1, c, h, h), _arr(1, c, 1, 1)
    got, ks = _kernels(lambda x, g: x * g, _t(x), _t(g))
    np.testing.assert_array_equal(got, x * g)
    assert len(ks) == 1 and (f"fmul <{h} x float>" in ks[0].spec.src) == (h < width // 4), ks[0].spec.src
