"""UOp value ranges (vmin/vmax) against exhaustive evaluation with exec_alu, and expression rendering."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from tiny_uop import AxisType, Ops, UOp, Variable, dtypes
from tiny_uop.alu import exec_alu

INT_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND,
           Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR]


def _interval(draw, dt):
  lo_lim, hi_lim = int(dtypes.min(dt)), int(dtypes.max(dt))
  if draw(st.booleans()):  # near the edges: overflow and wrapping
    lo = draw(st.sampled_from([lo_lim, lo_lim + 3, hi_lim - 5, -5, 0, 2**15]))
  else:
    lo = draw(st.integers(-12, 12))
  lo = min(max(lo, lo_lim), hi_lim)
  hi = min(lo + draw(st.integers(0, 6)), hi_lim)
  return lo, hi


@settings(max_examples=400)
@given(st.data())
def test_binary_ranges_contain_every_value(data):
  dt = data.draw(st.sampled_from([dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.uint32]))
  op = data.draw(st.sampled_from(INT_OPS))
  (a0, a1), (b0, b1) = _interval(data.draw, dt), _interval(data.draw, dt)
  a, b = Variable("a", a0, a1, dt), Variable("b", b0, b1, dt)
  u = UOp(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt, (a, b))
  for va, vb in itertools.product(range(a0, a1 + 1), range(b0, b1 + 1)):
    v = exec_alu(op, u.dtype, (va, vb))
    assert u.vmin <= v <= u.vmax, f"{op} {dt}: {va}, {vb} -> {v} outside [{u.vmin}, {u.vmax}]"


@settings(max_examples=200)
@given(st.data())
def test_unary_and_ternary_ranges(data):
  dt = data.draw(st.sampled_from([dtypes.int32, dtypes.int8, dtypes.uint8]))
  a0, a1 = _interval(data.draw, dt)
  a = Variable("a", a0, a1, dt)
  to = data.draw(st.sampled_from([dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.bool, dtypes.float16,
                                  dtypes.float32]))
  c = a < data.draw(st.integers(-10, 10))
  for u in (UOp(Ops.NEG, dt, (a,)), UOp(Ops.CAST, to, (a,)), c.where(a, UOp.const(dt, 3))):
    for va in range(a0, a1 + 1):
      env = {a: va}
      vals = [env.get(s) if s in env else exec_alu(s.op, s.dtype, (va, s.src[1].arg)) if s.op is Ops.CMPLT
              else s.arg for s in u.src]
      v = exec_alu(u.op, u.dtype, tuple(vals))
      assert u.vmin <= v <= u.vmax, f"{u.render()} at a={va}: {v} outside [{u.vmin}, {u.vmax}]"


def test_known_ranges():
  x = Variable("x", 0, 10)
  r = UOp.range(16, 0)
  assert (r.vmin, r.vmax) == (0, 15)
  assert ((x * 4 + 3).vmin, (x * 4 + 3).vmax) == (3, 43)
  assert ((x % 4).vmin, (x % 4).vmax) == (0, 3)
  assert ((x % 16).vmin, (x % 16).vmax) == (0, 10)          # |x| < 16: x % 16 is x
  assert ((x // 3).vmin, (x // 3).vmax) == (0, 3)
  assert ((x - 20) % 7).vmin == -6 and ((x - 20) % 7).vmax == 0   # C: the dividend's sign
  assert (x < 11).vmin is True and (x < 0).vmax is False
  assert (x.cast(dtypes.bool).vmin, x.cast(dtypes.bool).vmax) == (False, True)
  assert ((x + 1).cast(dtypes.bool).vmin, (x + 1).cast(dtypes.bool).vmax) == (True, True)
  big = Variable("big", 0, 2**30)
  assert ((big * 4).vmin, (big * 4).vmax) == (dtypes.min(dtypes.int32), dtypes.max(dtypes.int32))  # may wrap
  assert ((x < 11).where(x, x + 100).vmax) == 10           # a decided condition picks its side
  cf = (big + 2**25).cast(dtypes.float32)
  assert cf.vmax == float("inf")                           # int -> float32 rounds beyond 2**24


def test_shift_counts_wrap():
  a, s = Variable("a", 4, 4), Variable("s", 0, 40)
  u = a >> s
  for sv in range(41):
    assert u.vmin <= exec_alu(Ops.SHR, dtypes.int32, (4, sv)) <= u.vmax


@pytest.mark.parametrize("expr, text", [
  (lambda g, l, x: g * 4 + l, "((gidx0*4)+lidx1)"),
  (lambda g, l, x: (x // 2) % 3, "((x//2)%3)"),
  (lambda g, l, x: (x < 3).where(x, g), "(x if (x<3) else gidx0)"),
  (lambda g, l, x: x.maximum(l), "max(x, lidx1)"),
  (lambda g, l, x: -x, "(-x)"),
  (lambda g, l, x: UOp.range(8, 2, AxisType.REDUCE) + x, "(rR2+x)"),
])
def test_render(expr, text):
  g = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 16),), "gidx0")
  lidx = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 4),), "lidx1")
  assert expr(g, lidx, Variable("x", 0, 10)).render() == text


def test_render_deep_expression():
  e = Variable("x", 0, 10)
  for _ in range(5000): e = e + 1
  txt = e.render()
  assert txt.startswith("(" * 5000 + "x+1)") and txt.count("+1") == 5000
  assert e.render(simplify=True) == "(x+5000)"


def test_shape_and_device_of_a_new_node_over_new_nodes_need_no_walk(monkeypatch):
  # issue #39: `x.cast(a).cast(b)` and `(x * 2).cast(a)` read the shape/device of a new node whose source is new too:
  # computed one level down without a toposort; the result must be what the walk gives (checked against a graph
  # whose properties come from the walk), and a COPY below still moves the device
  def build(dev: str) -> list[UOp]:
    a = UOp.new_buffer(dev, 24, dtypes.float32).reshape((4, 6))
    return [(a * 2).cast(dtypes.float16), a.cast(dtypes.int32).cast(dtypes.float32), a.copy_to_device("PYTHON") + 1,
            (a.copy_to_device("PYTHON") + 1).cast(dtypes.float16), a.permute((1, 0)).cast(dtypes.int8)]
  walked = build("CPU")
  want = [(w.toposort() and w.shape, w.device) for w in walked]  # (toposort first: the walk's answer)
  assert want == [((4, 6), "CPU"), ((4, 6), "CPU"), ((4, 6), "PYTHON"), ((4, 6), "PYTHON"), ((6, 4), "CPU")]
  del walked
  calls: list[UOp] = []
  real = UOp.toposort
  monkeypatch.setattr(UOp, "toposort", lambda self, *a, **k: calls.append(self) or real(self, *a, **k))
  fresh = build("CPU")
  assert [(u.shape, u.device) for u in fresh] == want
  assert all(u.op is not Ops.CAST or u.src[0].op is not Ops.COPY for u in calls)  # walks only where a COPY sits
  assert not [u for u in calls if u is fresh[1] or u is fresh[4]]  # one level down: no walk
