"""Bad input raises clear errors that name the bad value, and the tensors involved stay usable."""
import numpy as np
import pytest

from tiny_tensor import Tensor
from tiny_uop.plugins import UnknownDeviceError


@pytest.fixture
def t():
  return Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))


def usable(t):
  assert t.sum().item() == 66.0 and t.shape == (3, 4)


def test_broadcast_mismatch(t):
  with pytest.raises(ValueError, match=r"\(3, 4\).*\(5,\)"): t + Tensor.ones(5)
  usable(t)


def test_reshape_mismatch(t):
  with pytest.raises(ValueError, match=r"\(3, 4\).*\(5, 3\)"): t.reshape(5, 3)
  with pytest.raises(ValueError, match="only one dim"): t.reshape(-1, -1)
  usable(t)


def test_bad_axis(t):
  with pytest.raises(IndexError, match="dim 2 is out of range"): t.sum(2)
  with pytest.raises(IndexError, match="dim -3"): t.max(-3)
  with pytest.raises(RuntimeError, match="permutation"): t.permute(0, 0)
  with pytest.raises(IndexError, match="dim 5"): t.transpose(0, 5)
  usable(t)


def test_bad_dtype(t):
  with pytest.raises(ValueError, match="'floaty'"): t.cast("floaty")
  with pytest.raises(ValueError, match="floaty"): Tensor([1, 2], dtype="floaty")
  with pytest.raises(RuntimeError, match="bitwise"): t & 1
  with pytest.raises(TypeError, match="str"): t + "a"
  usable(t)


def test_unknown_device(t):
  with pytest.raises(UnknownDeviceError, match="'NOPE'"): Tensor([1.0], device="NOPE")
  with pytest.raises(UnknownDeviceError, match="NOPE"): t.to("NOPE")
  usable(t)


def test_out_of_range_index(t):
  with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"): t[3]
  with pytest.raises(IndexError, match="index -5 is out of bounds for dimension 1 with size 4"): t[0, -5]
  with pytest.raises(IndexError, match="index 7 is out of bounds"): t[Tensor([0, 7])]
  with pytest.raises(IndexError, match="too many indices"): t[0, 0, 0]
  with pytest.raises(IndexError, match="single ellipsis"): t[..., ...]
  with pytest.raises(IndexError, match="float"): t[1.5]
  with pytest.raises(IndexError, match="index 9"): t[9] = 1.0
  usable(t)


def test_bad_ops(t):
  with pytest.raises(RuntimeError, match=r"cannot dot \(3, 4\) and \(3, 4\)"): t @ t
  with pytest.raises(RuntimeError, match="1D"): Tensor(2.0) @ t
  with pytest.raises(ValueError, match="differ outside dim"): t.cat(Tensor.ones(2, 3))
  with pytest.raises(ValueError, match="split sizes"): t.split([1, 1], 0)
  with pytest.raises(NotImplementedError, match="'wrap'"): t.pad((1, 1), mode="wrap")
  with pytest.raises(ValueError, match="reflect padding"): t.pad((4, 0), mode="reflect")
  with pytest.raises(ValueError, match="ragged"): Tensor([[1, 2], [3]])
  with pytest.raises(TypeError, match="set"): Tensor({1, 2})
  with pytest.raises(ValueError, match="invalid shape"): Tensor.zeros(-1, 2)
  with pytest.raises(TypeError, match="ambiguous"): bool(t)
  with pytest.raises(ValueError, match="rounding_mode"): t.div(2, rounding_mode="up")
  with pytest.raises(TypeError, match="bool"): Tensor([True]) - Tensor([False])
  usable(t)
