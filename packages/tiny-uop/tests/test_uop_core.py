"""Hash-consing invariants of UOp that the rest of the IR relies on."""
from tiny_uop import Ops, UOp, dtypes


def test_equal_nodes_are_the_same_object() -> None:
  a = UOp.variable("n", 1, 8) * 4 + 3
  assert a is UOp.variable("n", 1, 8) * 4 + 3


def test_signed_zero_and_int_float_args_stay_distinct() -> None:
  pz, nz = UOp.const(dtypes.float, 0.0), UOp.const(dtypes.float, -0.0)
  assert pz is not nz and str(nz.arg) == "-0.0"
  assert UOp(Ops.CONST, dtypes.float, arg=1) is not UOp(Ops.CONST, dtypes.float, arg=1.0)
  assert UOp(Ops.CONST, dtypes.bool, arg=True) is not UOp(Ops.CONST, dtypes.bool, arg=1)


def test_replace_returns_self_when_unchanged() -> None:
  x = UOp.variable("x", 0, 10) + 1
  assert x.replace(op=Ops.ADD) is x and x.replace(arg=None) is x
  assert x.replace(op=Ops.MUL) is not x


def test_movement_errors_name_the_shapes() -> None:
  import pytest
  buf = UOp.new_buffer("CPU", 12, dtypes.float)
  with pytest.raises(ValueError, match=r"can't reshape \(12,\) \(size 12\) to \(5,\) \(size 5\)"):
    buf.reshape((5,))
  with pytest.raises(ValueError, match="only size-1 dimensions expand"):
    buf.reshape((3, 4)).expand((6, 4))
