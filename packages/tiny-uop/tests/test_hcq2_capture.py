"""HCQ2's capture values of launch sizes: a symbolic size is evaluated with the captured variables, a size over a
variable only a replay gives stands in as 1 until the replay patches it, and a size that can't be evaluated is an error
(it used to be silently written as 1: a kernel launched with one workgroup)."""
import pytest

from tiny_uop import Variable
from tiny_uop.dtype import dtypes
from tiny_uop.hcq2 import HCQ2Ctx, _capture_value
from tiny_uop.uop import Ops, UOp


def test_symbolic_size_uses_the_captured_values():
  n = Variable("n", 1, 64)
  ctx = HCQ2Ctx(dev=None, defaults={"n": 5})
  for expr, ref in ((n * 2 + 1, lambda v: v * 2 + 1), ((n + 3) // 2, lambda v: (v + 3) // 2)):
    assert _capture_value(expr, ctx) == ref(5)
  assert _capture_value(UOp.const(dtypes.index, 7), ctx) == 7


def test_a_size_only_a_replay_knows_is_a_placeholder():
  ctx = HCQ2Ctx(dev=None, defaults={"n": 5}, hooks=[(object(), ("launch0.g0", "launch0.l0"))])
  assert _capture_value(Variable("launch0.g0", 0, (1 << 31) - 1), ctx) == 1
  assert _capture_value(Variable("m", 1, 8) * 4, ctx) == 1  # m: every replay must give it (the replay's _need)


def test_a_size_that_cant_be_evaluated_is_an_error():
  ctx = HCQ2Ctx(dev=None, defaults={"n": 5})
  odd = Variable("n", 1, 64) + UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 4),), "gidx0")
  with pytest.raises(TypeError, match="can't evaluate Ops.SPECIAL"):
    _capture_value(odd, ctx)
