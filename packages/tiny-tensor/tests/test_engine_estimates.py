"""The engine's reading of a program's estimates: a symbolic estimate counts 0; a value of any other kind is an error
naming the kernel and the value (it used to be counted 0 silently, so DEBUG's GFLOPS were wrong with no sign)."""
from types import SimpleNamespace

import pytest

from tiny_tensor.engine import _est
from tiny_uop import Variable
from tiny_uop.dtype import dtypes
from tiny_uop.uop import UOp


def test_numbers_and_constant_estimates_are_read():
  assert _est(SimpleNamespace(estimates={"ops": 12}), "ops") == 12
  assert _est(SimpleNamespace(estimates=SimpleNamespace(ops=2.0e3, mem=None)), "ops") == 2000
  assert _est(SimpleNamespace(estimates={"mem": UOp.const(dtypes.index, 64)}), "mem") == 64
  assert _est(SimpleNamespace(estimates=None), "ops") == 0


def test_a_symbolic_estimate_counts_zero():
  assert _est(SimpleNamespace(estimates={"ops": Variable("n", 1, 8) * 4}), "ops") == 0


def test_an_estimate_of_another_kind_is_an_error():
  spec = SimpleNamespace(name="r_4_4", estimates={"ops": [16]})
  with pytest.raises(TypeError, match=r"kernel r_4_4: estimate 'ops' is \[16\] \(list\); expected an int"):
    _est(spec, "ops")
