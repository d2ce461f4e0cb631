"""Property test: random reduce kernels with GLOBAL/LOCAL/UPCAST output splits and UNROLL reduce splits, on the GPU
renderers. OpenCL runs on PoCL vs numpy; the same ASTs must compile for PTX (ptxas) and AMDGPU with the same launch
dims (the lowering is shared; only the renderers differ), and the PTX runs in our PTX interpreter vs numpy too."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.compiler.ptx import find_ptxas
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_codegen.renderer.opencl import OpenCLRenderer
from tiny_codegen.renderer.ptx import PTXRenderer

import gpu_cl_runner as clr

import tiny_runtime_nv.ptx as ptxi  # the PTX executor of tiny-runtime-nv (a test-only dependency)

NP_RED = {Ops.ADD: np.sum, Ops.MAX: np.max}
_why = clr.available()


def split(n: int, amt: int, axis_id: int, inner: AxisType, outer: AxisType) -> UOp:
  """An index over [0, n) as outer*amt + inner (amt divides n), or one range when amt == 1."""
  if amt == 1: return UOp.range(n, axis_id, outer)
  return UOp.range(n // amt, axis_id, outer) * amt + UOp.range(amt, axis_id + 10, inner)


@settings(max_examples=25, deadline=None)
@given(n=st.sampled_from([2, 4, 8, 12, 16]), k=st.sampled_from([1, 3, 4, 8]), op=st.sampled_from(list(NP_RED)),
       local=st.sampled_from([1, 2, 4]), inner=st.sampled_from([AxisType.LOCAL, AxisType.UPCAST]),
       unroll=st.sampled_from([1, 2, 4]), rows=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_random_gpu_kernels(n, k, op, local, inner, unroll, rows, seed):
  local = local if n % local == 0 else 1
  unroll = unroll if k % unroll == 0 else 1
  out, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(s), arg=i) for i, s in enumerate((rows * n, rows * n * k, n)))
  r = UOp.range(rows, 5, AxisType.GLOBAL)
  i = split(n, local, 0, inner, AxisType.GLOBAL)
  j = split(k, unroll, 1, AxisType.UNROLL, AxisType.REDUCE)
  jr = [x for x in j.toposort() if x.op is Ops.RANGE]
  val = a.index((r * n + i) * k + j).load() * b.index(i).load() + (i < n // 2).where(1.0, -1.0)
  ast = out.index(r * n + i).store(val.reduce(*jr, arg=op)).sink(arg=KernelInfo("rnd"))
  rng = np.random.default_rng(seed)
  A, B = rng.uniform(-1, 1, rows * n * k).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
  sign = np.where(np.arange(n) < n // 2, 1, -1).astype(np.float32)
  ref = NP_RED[op](A.reshape(rows, n, k) * B[None, :, None] + sign[None, :, None], axis=2)
  with Context(NOOPT=1): specs = {R: get_program(ast, R(arch)) for R, arch in
                                  ((OpenCLRenderer, ""), (PTXRenderer, "sm_90"), (AMDGPURenderer, "gfx1100"))}
  spec = specs[OpenCLRenderer]
  if inner is AxisType.LOCAL and local > 1: assert spec.local_size is not None and spec.local_size[0] == local
  for other in (specs[PTXRenderer], specs[AMDGPURenderer]):
    assert (other.global_size, other.local_size) == (spec.global_size, spec.local_size)
  assert specs[AMDGPURenderer].lib[:4] == b"\x7fELF"
  if find_ptxas() is not None: assert specs[PTXRenderer].lib[:4] == b"\x7fELF"
  runs = [("ptx", specs[PTXRenderer])] + ([("opencl", spec)] if _why is None else [])
  for target, sp in runs:
    C = np.zeros(rows * n, np.float32)
    if target == "opencl": clr.run(sp, [C, A, B])
    else: ptxi.run(sp.src, sp.name, [C, A, B], sp.global_size, sp.local_size, (), list(sp.globals))
    np.testing.assert_allclose(C.reshape(rows, n), ref, rtol=2e-5, atol=1e-5, err_msg=target)
