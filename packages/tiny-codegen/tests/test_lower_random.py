"""Property test: random reduce kernels, with random UPCAST/UNROLL splits and thread counts, vs numpy (LLVM)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.renderer.llvmir import LLVMRenderer

import kernel_runner as kr

NP_RED = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}


def split(n: int, amt: int, axis_id: int, inner_type: AxisType, outer_type: AxisType) -> tuple[UOp, list[UOp]]:
  """An index over [0, n) as outer*amt + inner (amt divides n), or one range when amt == 1."""
  if amt == 1:
    r = UOp.range(n, axis_id, outer_type)
    return r, [r]
  outer, inner = UOp.range(n // amt, axis_id, outer_type), UOp.range(amt, axis_id + 10, inner_type)
  return outer * amt + inner, [outer, inner]


@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([1, 2, 4, 6, 8, 12]), k=st.sampled_from([1, 2, 3, 4, 8]), op=st.sampled_from(list(NP_RED)),
       up=st.sampled_from([1, 2, 4]), unroll=st.sampled_from([1, 2, 4]), threads=st.integers(1, 5),
       second=st.booleans(), seed=st.integers(0, 2**16))
def test_random_reduce_kernels(n, k, op, up, unroll, threads, second, seed):
  up = up if n % up == 0 else 1
  unroll = unroll if k % unroll == 0 else 1
  c0, c1, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(s), arg=i) for i, s in enumerate((n, n, n * k, n)))
  i, _ = split(n, up, 0, AxisType.UPCAST, AxisType.LOOP)
  j, _ = split(k, unroll, 1, AxisType.UNROLL, AxisType.REDUCE)
  jrngs = [x for x in j.toposort() if x.op is Ops.RANGE]
  red = (a.index(i * k + j).load() * 0.5 + b.index(i).load()).reduce(*jrngs, arg=op)
  stores = [c0.index(i).store(red.exp2() if op is Ops.MAX else red)]
  if second:  # a second output sharing the reduce, plus an elementwise input
    stores.append(c1.index(i).store(red * b.index(i).load() + 1.0))
  ast = UOp.sink(*stores, arg=KernelInfo(f"rand_{n}_{k}_{op.name}_{up}_{unroll}_{int(second)}"))
  r = LLVMRenderer()
  r.threads, r.thread_min_work = threads, 0
  with Context(NOOPT=1): spec = get_program(ast, r)
  rng = np.random.default_rng(seed)
  A, B = rng.uniform(0.5, 1.5, n * k).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
  C0, C1 = np.zeros(n, np.float32), np.zeros(n, np.float32)
  kr.run(spec, [C0, C1, A, B], threaded=threads > 1)
  ref = NP_RED[op](A.reshape(n, k) * np.float32(0.5) + B[:, None], axis=1)
  np.testing.assert_allclose(C0, np.exp2(ref) if op is Ops.MAX else ref, rtol=2e-5, atol=1e-5)
  if second: np.testing.assert_allclose(C1, ref * B + 1, rtol=2e-5, atol=1e-5)
  rows = n // up
  assert spec.global_size[0] == -(-rows // -(-rows // min(threads, rows)))  # a share per thread, none empty
