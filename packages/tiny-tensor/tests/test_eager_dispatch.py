"""Eager dispatch cost cuts (issue #39, the small op and graph building): what each cut could break, checked against
independent references (numpy, torch, tinygrad 0.14's rules)."""
import numpy as np
import pytest

from tiny_tensor import Context, GlobalCounters, Tensor, dtypes, engine
from tiny_uop.helpers import NOOPT, ContextVar


def _x(seed: int, shape=(16, 16)) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_every_flag_write_moves_the_version_and_the_codegen_flags_follow_it():
  # `_codegen_flags()` is kept while ContextVar.version stands still: every write of a flag's value (a Context, or a
  # direct `.value =`) must move it, and the next call must read the new values
  old = NOOPT.value
  v0 = ContextVar.version
  try:
    NOOPT.value = 1  # a direct write, no Context
    assert ContextVar.version != v0
    assert engine._codegen_flags()[0] == 1
    v1 = ContextVar.version
    NOOPT.value = 1  # the same value written again still moves it (a write is a write)
    assert ContextVar.version != v1
    with Context(NOOPT=0):
      assert engine._codegen_flags()[0] == 0
    assert engine._codegen_flags()[0] == 1
  finally:
    NOOPT.value = old
  assert engine._codegen_flags()[0] == old


def test_a_direct_flag_write_takes_effect_at_the_next_replay():
  # a replay recorded under the default flags, then NOOPT set by a direct `.value =` (not a Context): the next
  # realize must launch the NOOPT program, as a compile under NOOPT gives it, with numbers against numpy
  from tiny_codegen import get_program
  from tiny_uop import Ops
  from tiny_uop.plugins import Device
  x, y = _x(1, (24, 24)), _x(2, (24, 24))
  a, b = Tensor(x), Tensor(y)
  f = lambda: (a @ b).realize()  # noqa: E731
  for _ in range(3): np.testing.assert_allclose(f().numpy(), x @ y, rtol=1e-4, atol=1e-4)  # recorded, replayed
  ast = next(c.src[0] for c in engine.plan([(a @ b).uop]).calls if c.src[0].op is Ops.SINK)
  renderer = Device[a.device].renderer
  old = NOOPT.value
  try:
    NOOPT.value = 1
    want = get_program(ast, renderer).src
    calls: list = []
    with engine.capture(calls.append): out = f()
    assert calls[0].spec.src == want
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-4, atol=1e-4)
    for _ in range(2): np.testing.assert_allclose(f().numpy(), x @ y, rtol=1e-4, atol=1e-4)
  finally:
    NOOPT.value = old
  calls = []
  with engine.capture(calls.append): f()
  assert calls[0].spec.src == get_program(ast, renderer).src != want
