"""`Tensor` is declared from mixin classes (issue #33): its higher-level ops are methods of `NNOpsMixin` and
`MathOpsMixin`, found through its bases (so type checkers and IDEs see them), not attached with setattr at import;
and the state and rules those modules share with tensor.py sit below it (tiny_tensor.live, gradient.set_cos)."""
import inspect

import numpy as np
import pytest
import torch

from tiny_tensor import Tensor
from tiny_tensor.creation import CreationMixin
from tiny_tensor.indexing import IndexingMixin
from tiny_tensor.mathops import MathOpsMixin
from tiny_tensor.nnops import NNOpsMixin


def test_the_ops_are_declared_on_the_mixins_and_inherited():
  assert {CreationMixin, IndexingMixin, NNOpsMixin, MathOpsMixin} <= set(Tensor.__mro__)
  for mixin, names in [(NNOpsMixin, ("conv2d", "sort", "cumsum", "scaled_dot_product_attention", "einsum")),
                       (MathOpsMixin, ("acos", "isclose", "qr", "nonzero"))]:
    for n in names:
      assert n in vars(mixin) and n not in vars(Tensor), n
      assert inspect.getattr_static(Tensor, n) is vars(mixin)[n], n


def test_methods_calling_methods_match_torch():
  # sort/argsort/topk/cummin and allclose call each other through the class now, not as module functions
  x = np.array([[3.0, -1.0, 2.5, 0.0], [1.0, 4.0, -2.0, 4.0]], dtype=np.float32)
  t = torch.tensor(x)
  v, i = Tensor(x).topk(2, 1)
  tv, ti = t.topk(2, 1)
  np.testing.assert_allclose(v.numpy(), tv.numpy())
  np.testing.assert_array_equal(i.numpy(), ti.numpy())
  np.testing.assert_allclose(Tensor(x).cummin(1)[0].numpy(), torch.cummin(t, 1).values.numpy())
  assert Tensor(x).allclose(Tensor(x + 1e-9)) and not Tensor(x).allclose(Tensor(x + 1.0))


def test_randperm_is_a_permutation_of_the_class():
  p = Tensor.randperm(7, dtype="int64")
  assert type(p) is Tensor and sorted(p.tolist()) == list(range(7))
  assert list(inspect.signature(Tensor.randperm).parameters)[:3] == ["n", "device", "dtype"]


@pytest.mark.parametrize("x", [
  [0.5, -2.0, 100.0],
  # large x is where sin(pi/2 - x) would be wrong; every device's sin reduces it exactly (libm on the CPU, the
  # Payne-Hanek reduction of tiny_codegen.lower.transcendental on the GPU renderers)
  pytest.param([0.5, -2.0, 3e7], id="large"),
])
def test_sin_gradient_uses_tensor_cos_against_torch(x):
  # d sin x = cos x through gradient.set_cos (gradient.py no longer imports tensor.py)
  x = np.array(x, dtype=np.float32)
  a = Tensor(x, requires_grad=True)
  a.sin().sum().backward()
  t = torch.tensor(x, requires_grad=True)
  t.sin().sum().backward()
  np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_ops_reworded_for_the_type_checker_match_numpy_and_torch():
  # tensor.py is type-checked now: data() returns the array's own memoryview, argmax subtracts with sub(reverse=True),
  # split's sizes got a typed name
  for v in ([[1.0, 2.0], [3.0, 4.0]], [True, False, True], [1, -2, 3]):
    m, ref = Tensor(v).data(), memoryview(np.array(v, dtype=Tensor(v).numpy().dtype))
    assert (m.format, m.shape, m.tolist()) == (ref.format, ref.shape, ref.tolist())
  x = np.array([[1.0, 5.0, 2.0, 5.0], [7.0, 0.0, 7.0, -1.0]], dtype=np.float32)
  np.testing.assert_array_equal(Tensor(x).argmax(1).numpy(), torch.tensor(x).argmax(1).numpy())
  parts = Tensor(np.arange(7.0)).split([3, 4])
  assert [p.tolist() for p in parts] == [a.tolist() for a in np.split(np.arange(7.0), [3])]
