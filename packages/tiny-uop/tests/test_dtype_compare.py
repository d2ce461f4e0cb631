"""DType comparisons after the fast `==`/`!=` and the membership sets: identity equality, the other operand's `__eq__`
still asked for non-DTypes, ordering for sorting, and is_float/is_int/is_unsigned against numpy's classification."""
import numpy as np
import pytest

from tiny_uop.dtype import DType, dtypes


class _EqualsAll:
  def __eq__(self, o: object) -> bool: return True
  def __ne__(self, o: object) -> bool: return False
  __hash__ = object.__hash__


def test_equality_is_identity_and_defers_to_other_types() -> None:
  f = dtypes.float32
  assert f == dtypes.float and not (f != dtypes.float) and f != dtypes.int32 and not (f == dtypes.int32)
  assert f.vec(4) == dtypes.float32.vec(4) and f.vec(4) != f and f.ptr() == f.ptr() and f.ptr() != f
  assert f != "float32" and not (f == 13)
  assert f == _EqualsAll() and not (f != _EqualsAll())  # NotImplemented for a non-DType: the other side answers
  assert len({f, dtypes.float, f.vec(2), f.vec(2), f.ptr()}) == 3
  assert f in (dtypes.int8, dtypes.float32) and f not in (dtypes.int8, dtypes.half)


def test_ordering_still_sorts() -> None:
  got = sorted([dtypes.float64, dtypes.bool, dtypes.int32, dtypes.half, dtypes.uint8])
  assert got == [dtypes.bool, dtypes.uint8, dtypes.int32, dtypes.half, dtypes.float64]
  assert dtypes.int8 < dtypes.int16 and not (dtypes.float32 < dtypes.float16)


@pytest.mark.parametrize("dt", [d for d in dtypes.all if d.fmt is not None])
@pytest.mark.parametrize("lanes", [1, 4])
def test_kind_predicates_match_numpy(dt: DType, lanes: int) -> None:
  nd, v = np.dtype(dt.fmt), dt.vec(lanes)
  assert dtypes.is_float(v) == np.issubdtype(nd, np.floating)
  assert dtypes.is_int(v) == np.issubdtype(nd, np.integer)
  assert dtypes.is_unsigned(v) == np.issubdtype(nd, np.unsignedinteger)
  assert dtypes.is_bool(v) == (nd == np.bool_)
  # a pointer is none of them; an image counts as float
  p = dt.ptr()
  assert not (dtypes.is_float(p) or dtypes.is_int(p) or dtypes.is_unsigned(p) or dtypes.is_bool(p))
  assert dtypes.is_float(dtypes.imagef((2, 2, 4))) and not dtypes.is_int(dtypes.imageh((2, 2, 4)))
