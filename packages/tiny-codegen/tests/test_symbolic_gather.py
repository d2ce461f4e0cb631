"""Index math over a symbolic divisor and one-hot gathers over a symbolic range (issue #39): a dynamic sequence's
position ids (`mask[arange(seq) + past]`, GPT-2's ONNX export) reached the kernel as a one-hot sum over the sequence
whose index held `(i*seq + j) // seq`; the simplifier left it (it compares value bounds, and `j < seq` is only
structural), so the gather stayed a reduce over the sequence per output (50-73 us against 3-6 folded). Checked
against brute-force evaluation and numpy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.plugins import Device
from tiny_uop.uop import _cdiv, _cmod

import kernel_runner as kr
from tiny_codegen import get_program
from tiny_codegen.lower import pre_optimize
from tiny_codegen.lower.simplify import simplify_graph


def _eval(e: UOp, env: dict[UOp, int]) -> int:
  """e's value with the given nodes (ranges, variables) set, by substitution and constant folding."""
  out = simplify_graph(e.substitute({k: UOp.const(k.dtype, v) for k, v in env.items()}), "eval")
  assert out.op is Ops.CONST, out.render()
  return int(out.arg)


@pytest.mark.parametrize("shift", [0, 2, -3])
def test_div_mod_by_a_symbolic_divisor_match_brute_force(shift: int) -> None:
  s = UOp.variable("seq", 1, 9)
  i, j = UOp.range(s, 0), UOp.range(s, 1)
  n = i * s + (j + shift)
  div, mod = simplify_graph(n // s), simplify_graph(n % s)
  if shift == 0:  # (i*seq + j) // seq -> i ; (i*seq + j) % seq -> j: the structural fold, no division left
    assert div is i and mod is j, (div.render(), mod.render())
  for sv in range(1, 10):
    for iv, jv in itertools.product(range(sv), range(sv)):
      env = {s: sv, i: iv, j: jv}
      nv = iv * sv + jv + shift
      assert _eval(div, env) == _cdiv(nv, sv) and _eval(mod, env) == _cmod(nv, sv), (sv, iv, jv)


def gather_ast(cap: int) -> UOp:
  """out[i] = sum_j where(idx[(i*s + j) // s] == (i*s + j) % s, x[j], 0) over a Variable s in [1, cap]: a gather of
  x at idx[i] written as a one-hot sum (index math as the scheduler writes a reshaped view)."""
  s = UOp.variable("s", 1, cap)
  out, idx, x = (UOp(Ops.PARAM, dt.ptr(cap), arg=k) for k, dt in enumerate((dtypes.float, dtypes.int32, dtypes.float)))
  i, j = UOp.range(s, 0), UOp.range(s, 1, AxisType.REDUCE)
  flat = i * s + j
  hit = idx.index(flat // s).load().eq(flat % s)
  val = hit.where(x.index(j).load(), UOp.const(dtypes.float, 0.0)).reduce(j, arg=Ops.ADD)
  return out.index(i).store(val).sink(arg=KernelInfo("gather_sym"))


def test_one_hot_sum_over_a_symbolic_range_becomes_a_gather() -> None:
  cap = 16
  ast = pre_optimize(gather_ast(cap))
  assert not any(u.op is Ops.REDUCE for u in ast.toposort()), "the one-hot sum over the sequence was not folded"
  spec = get_program(gather_ast(cap), Device["CPU"].renderer)
  rng = np.random.default_rng(5)
  for sv in (1, 2, 7, 16):
    x = rng.standard_normal(cap).astype(np.float32)
    idx = rng.integers(-3, sv + 3, cap).astype(np.int32)  # out-of-range indices (negative, >= s) give 0
    out = np.full(cap, 7.0, np.float32)
    kr.run(spec, [out, idx, x], (sv,))
    want = np.where((idx[:sv] >= 0) & (idx[:sv] < sv), x[np.clip(idx[:sv], 0, sv - 1)], 0.0)
    np.testing.assert_array_equal(out[:sv], want)
    assert (out[sv:] == 7.0).all()
