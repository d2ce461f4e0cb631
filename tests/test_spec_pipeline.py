"""SPEC=1 verifies every stage's graph (tensor graph, scheduled kernels, optimized AST, linear program)."""
import numpy as np
import pytest
from tiny_tensor import Tensor
from tiny_uop import Context, Ops, UOp, dtypes
from tiny_uop.spec import SpecError


def test_spec_mode_runs_a_real_program() -> None:
  with Context(SPEC=1):
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    out = ((a.T @ a).relu().sum(axis=1) + Tensor.arange(4)).softmax().numpy()
  x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
  want = np.maximum(x.T @ x, 0).sum(axis=1) + np.arange(4)
  want = np.exp(want - want.max()) / np.exp(want - want.max()).sum()
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)


def test_spec_mode_rejects_a_bad_kernel() -> None:
  from tiny_codegen.lower import lower
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  p = UOp(Ops.PARAM, dtypes.float.ptr(4), arg=0)
  bad = p.index(UOp.const(dtypes.float, 1.0)).store(UOp.const(dtypes.float, 1.0)).sink()  # a float index
  with Context(SPEC=1), pytest.raises(SpecError):
    lower(bad, LLVMRenderer())
