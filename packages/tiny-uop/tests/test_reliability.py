"""Regressions of issue #18 in tiny-uop: interning, typing of mixed-dtype ALU, Variable bounds, plugin isolation.

Each test reproduces a bad input that used to give a wrong node or end the program, and asserts the right result or a
clear error naming the bad value and what is valid.
"""
import gc
import math
import sys
import uuid

import pytest

from tiny_uop.dtype import dtypes
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device, DevicePlugin, DeviceUnavailableError, register_device, unregister_device
from tiny_uop.spec import SpecError, program_spec, type_verify
from tiny_uop.uop import Ops, UOp, UOpMetaClass


# ***** interning *****
def test_vconst_negative_zero_is_its_own_node() -> None:
  a = UOp(Ops.VCONST, dtypes.float.vec(2), arg=(-0.0, 1.0))
  b = UOp(Ops.VCONST, dtypes.float.vec(2), arg=(0.0, 1.0))
  assert a is not b and math.copysign(1.0, a.arg[0]) == -1.0 and math.copysign(1.0, b.arg[0]) == 1.0
  assert UOp(Ops.VCONST, dtypes.float.vec(2), arg=(-0.0, 1.0)) is a
  # ints and floats that compare equal stay apart in a VCONST as in a CONST
  assert UOp(Ops.VCONST, dtypes.int.vec(2), arg=(1, 2)) is not UOp(Ops.VCONST, dtypes.int.vec(2), arg=(1.0, 2))


def test_nan_constants_are_one_node() -> None:
  # every NaN compares unequal to itself: a key holding the raw float made each folded NaN a new node
  n1, n2 = float("inf") - float("inf"), float("inf") - float("inf")
  assert n1 is not n2 and math.copysign(1.0, n1) == math.copysign(1.0, n2)
  assert UOp(Ops.CONST, dtypes.float, arg=n1) is UOp(Ops.CONST, dtypes.float, arg=n2)
  folded1 = (UOp.const(dtypes.float, math.inf) - math.inf).simplify()
  folded2 = (UOp.const(dtypes.float, -math.inf) + math.inf).simplify()
  assert folded1.op is Ops.CONST and math.isnan(folded1.arg)
  assert folded1 is UOp(Ops.CONST, dtypes.float, arg=-float("nan") if math.copysign(1, folded1.arg) < 0 else math.nan)
  assert (folded2 is folded1) == (math.copysign(1, folded1.arg) == math.copysign(1, folded2.arg))
  assert UOp(Ops.VCONST, dtypes.float.vec(2), arg=(n1, 1.0)) is UOp(Ops.VCONST, dtypes.float.vec(2), arg=(n2, 1.0))


def test_weakref_callback_of_a_dead_node_keeps_the_newer_entry() -> None:
  """A node whose weakref died before its callback ran (a collected cycle) must not delete the entry of an equal
  node built in between: that would let a third equal node be built."""
  arg = ("reliab", uuid.uuid4().hex)
  old = UOp(Ops.NOOP, arg=arg)
  key = next(k for k, r in UOpMetaClass.ucache.items() if r() is old)
  old_ref = UOpMetaClass.ucache[key]
  callback = old_ref.__callback__
  del UOpMetaClass.ucache[key]          # as if old were dead and a lookup had built ...
  new = UOp(Ops.NOOP, arg=arg)          # ... a new equal node in its place
  assert new is not old
  callback(old_ref)                     # old's callback runs late
  assert UOpMetaClass.ucache[key]() is new
  assert UOp(Ops.NOOP, arg=arg) is new  # still one node for this key
  del old, new
  gc.collect()
  assert key not in UOpMetaClass.ucache


# ***** typing *****
@pytest.mark.parametrize("build", [lambda v: 1.5 + v, lambda v: v + 1.5, lambda v: v * 0.5, lambda v: 2.5 - v,
                                   lambda v: v < 1.5, lambda v: v / 4.0])
def test_float_constant_with_int_variable_is_well_typed(build) -> None:
  v = UOp.variable("v", 0, 10)
  u = build(v)
  want = dtypes.bool if u.op is Ops.CMPLT else dtypes.float32
  assert u.dtype is want
  assert all(s.dtype is dtypes.float32 for s in u.src), [s.dtype for s in u.src]
  assert u.substitute({v: UOp.const(dtypes.int32, 3)}).simplify().arg == build(3)


def test_mixed_int_widths_promote() -> None:
  a, b = UOp.variable("a", 0, 10, dtypes.int32), UOp.variable("b", 0, 10, dtypes.int64)
  s = a + b
  assert s.dtype is dtypes.int64 and [x.dtype for x in s.src] == [dtypes.int64, dtypes.int64]
  w = UOp(Ops.WHERE, dtypes.int32, (a < 3, a, b))  # built by hand: no promotion, and the spec rejects it
  with pytest.raises(SpecError, match="WHERE branches"): type_verify(UOp.sink(w), program_spec, "hand-built")
  with pytest.raises(TypeError, match="branches have different dtypes"): (a < 3).where(a, b)
  sh = b << UOp.const(dtypes.uint32, 2)  # a shift count keeps its own dtype
  assert sh.dtype is dtypes.int64 and sh.src[1].dtype is dtypes.uint32


def test_variable_bounds_must_fit_dtype() -> None:
  with pytest.raises(ValueError, match=r"bounds \[0, 1099511627776\] don't fit its dtype dtypes.int32.*2147483647"):
    UOp.variable("n", 0, 2**40)
  with pytest.raises(ValueError, match=r"\[-1, 3\].*dtypes.uint8.*\[0, 255\]"): UOp.variable("n", -1, 3, dtypes.uint8)
  with pytest.raises(TypeError, match="not an integer dtype"): UOp.variable("n", 0, 3, dtypes.float32)
  assert UOp.variable("n", 0, 2**40, dtypes.int64).vmax == 2**40


def test_well_typed_after_promotion_passes_spec() -> None:
  v = UOp.variable("v", 0, 10)
  type_verify(UOp.sink(1.5 + v), program_spec, "promoted")  # no mixed-dtype ADD left for the spec to reject
  with pytest.raises(SpecError, match="has sources of dtype"):
    type_verify(UOp.sink(UOp(Ops.ADD, dtypes.int32, (UOp.const(dtypes.float32, 1.5), v))), program_spec, "old")


# ***** plugin isolation *****
BAD_PLUGIN = '''
import sys
def loader_exit(): sys.exit(3)
class ExitingDevice:
  def __init__(self, name): raise SystemExit("no hardware")
class InterruptDevice:
  def __init__(self, name): raise KeyboardInterrupt
'''


@pytest.fixture
def bad_module(tmp_path, monkeypatch):
  name = f"reliab_badplugin_{uuid.uuid4().hex[:8]}"
  (tmp_path / f"{name}.py").write_text(BAD_PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  regs: list[str] = []
  with Context(DEV="", TINY_PLUGINS=""):
    yield name, regs
  for n in regs: unregister_device(n)
  sys.modules.pop(name, None)


def test_plugin_systemexit_is_isolated(bad_module) -> None:
  mod, regs = bad_module
  register_device(lambda: __import__(mod).loader_exit(), name="EXITLOADX")
  register_device(DevicePlugin("EXITOPENX", f"{mod}:ExitingDevice"))
  register_device(lambda: (_ for _ in ()).throw(GeneratorExit("gen")), name="GENEXITX")
  regs += ["EXITLOADX", "EXITOPENX", "GENEXITX"]
  with pytest.raises(DeviceUnavailableError, match="EXITLOADX.*SystemExit: 3"): Device["EXITLOADX"]
  with pytest.raises(DeviceUnavailableError, match="EXITOPENX.*SystemExit: no hardware"): Device["EXITOPENX"]
  with pytest.raises(DeviceUnavailableError, match="GENEXITX.*GeneratorExit: gen"): Device["GENEXITX"]
  assert "SystemExit" in str(Device.status("EXITOPENX"))


def test_plugin_keyboard_interrupt_still_interrupts(bad_module) -> None:
  mod, regs = bad_module
  register_device(DevicePlugin("INTRX", f"{mod}:InterruptDevice"))
  register_device(lambda: (_ for _ in ()).throw(KeyboardInterrupt()), name="INTRLOADX")
  regs += ["INTRX", "INTRLOADX"]
  with pytest.raises(KeyboardInterrupt): Device["INTRX"]
  with pytest.raises(KeyboardInterrupt): Device["INTRLOADX"]
