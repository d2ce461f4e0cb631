"""GROUP_REDUCE axes on GPU-style renderers: a workgroup reduction through shared memory (DEFINE_LOCAL + BARRIER),
checked for structure and run on PoCL (real barriers) through the OpenCL renderer."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Renderer
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.lower import lower

import gpu_cl_runner as clr


class FakeGPU(Renderer):
  device = "FAKEGPU"
  has_local = True
  has_shared = True
  global_max = (1 << 20, 1024, 1024)
  local_max = (256, 256, 64)


def grouped_sum(n: int, k: int, g: int, op: Ops = Ops.ADD, local: int = 1) -> UOp:
  """out[i] = reduce_j a[i*k + j] with j split as r*g + gr (gr a GROUP_REDUCE axis of g threads); optionally the
  output axis split into a LOCAL axis of `local`."""
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(n * k), arg=1)
  if local > 1: i = UOp.range(n // local, 0) * local + UOp.range(local, 3, AxisType.LOCAL)
  else: i = UOp.range(n, 0)
  r, gr = UOp.range(k // g, 1, AxisType.REDUCE), UOp.range(g, 2, AxisType.GROUP_REDUCE)
  return c.index(i).store(a.index(i * k + r * g + gr).load().reduce(r, gr, arg=op)).sink(arg=KernelInfo())


def test_structure():
  low = lower(grouped_sum(4, 32, 8), FakeGPU(), optimize=False)
  ops = [u.op for u in low.uops]
  assert ops.count(Ops.DEFINE_LOCAL) == 1 and ops.count(Ops.BARRIER) == 1
  assert low.dims.global_size == (4, 1, 1) and low.dims.local_size == (8, 1, 1)
  assert ops.index(Ops.BARRIER) < max(i for i, u in enumerate(low.uops) if u.op is Ops.LOAD)
  # the global store is gated to the group's first thread
  st = [u for u in low.uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]
  assert len(st) == 1 and len(st[0].src[0].src) == 3


def test_stays_serial_without_shared_memory():
  class NoShared(FakeGPU):
    has_shared = False
  low = lower(grouped_sum(4, 32, 8), NoShared(), optimize=False)
  assert Ops.DEFINE_LOCAL not in [u.op for u in low.uops] and low.dims.local_size == (1, 1, 1)


@pytest.mark.skipif(clr.available() is not None, reason=str(clr.available()))
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
@pytest.mark.parametrize("n,k,g,local", [(4, 32, 8, 1), (6, 12, 4, 2), (2, 64, 64, 1)])
def test_runs_on_opencl(op, n, k, g, local):
  from tiny_codegen.renderer.opencl import OpenCLRenderer
  ast = grouped_sum(n, k, g, op, local)
  with Context(NOOPT=1): spec = get_program(ast, OpenCLRenderer())
  assert spec.local_size is not None and spec.local_size[0] * spec.local_size[1] == g * local
  A = np.random.default_rng(0).standard_normal(n * k).astype(np.float32)
  C = np.zeros(n, np.float32)
  clr.run(spec, [C, A], ())
  ref = (np.sum if op is Ops.ADD else np.max)(A.reshape(n, k), axis=1)
  np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5)
