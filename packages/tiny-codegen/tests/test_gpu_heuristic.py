"""The GPU heuristic (opt/heuristic_gpu.py): which opts it picks, that the renderer's capabilities (shared memory
size, threads per workgroup, per-dim limits, warp size) bound them, and that the kernels it makes -- a GROUPTOP sum,
a fused softmax, grouped and register-blocked matmuls -- give numpy's results in the PTX interpreter, on PoCL and,
where tiny-runtime-amd is installed, on MOCK+AMD (the RDNA3 emulator running the real code object)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Renderer
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.compiler.amdgpu import find_ld_lld
from tiny_codegen.lower import lower
from tiny_codegen.opt import Kernel, OptOps, hand_coded_optimizations
from tiny_codegen.opt.heuristic_gpu import GROUP_MAX_OUTPUTS, max_threads
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_codegen.renderer.opencl import OpenCLRenderer
from tiny_codegen.renderer.ptx import PTXRenderer


import gpu_cl_runner as clr
import tiny_runtime_nv.ptx as ptxi  # the PTX executor of tiny-runtime-nv (a test-only dependency)
_why = clr.available()  # type: ignore[attr-defined]
needs_pocl = pytest.mark.skipif(_why is not None, reason=_why or "")
rng = np.random.default_rng(1)
LOG2E = 1 / math.log(2)


def P(slot: int, size: int) -> UOp: return UOp(Ops.PARAM, dtypes.float.ptr(size), arg=slot)


def sum_ast(rows: int, n: int) -> UOp:
  """out[i] = sum_j x[i*n + j]."""
  out, x = P(0, rows), P(1, rows * n)
  i, j = UOp.range(rows, 0), UOp.range(n, 1, AxisType.REDUCE)
  return out.index(i).store(x.index(i * n + j).load().reduce(j, arg=Ops.ADD)).sink(arg=KernelInfo("rsum"))


def softmax_ast(rows: int, n: int) -> UOp:
  """out[i, j] = exp(x[i, j] - max_k x[i, k]) / sum_k exp(x[i, k] - max), one fused kernel (two reduces)."""
  out, x = P(0, rows * n), P(1, rows * n)
  i, j = UOp.range(rows, 0), UOp.range(n, 1)
  k1, k2 = UOp.range(n, 2, AxisType.REDUCE), UOp.range(n, 3, AxisType.REDUCE)
  mx = x.index(i * n + k1).load().reduce(k1, arg=Ops.MAX)

  def e(v: UOp) -> UOp: return ((v - mx) * LOG2E).exp2()
  s = e(x.index(i * n + k2).load()).reduce(k2, arg=Ops.ADD)
  return out.index(i * n + j).store(e(x.index(i * n + j).load()) / s).sink(arg=KernelInfo("softmax"))


def matmul_ast(M: int, N: int, K: int) -> UOp:
  """c[i, j] = sum_k a[i, k] * b[k, j]."""
  c, a, b = P(0, M * N), P(1, M * K), P(2, K * N)
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo(f"mm_{M}_{N}_{K}"))


def elementwise_ast(shape: tuple[int, ...]) -> UOp:
  """out = x * 2 over a contiguous `shape`."""
  n = math.prod(shape)
  out, x = P(0, n), P(1, n)
  rs = [UOp.range(s, i) for i, s in enumerate(shape)]
  idx = rs[0]
  for r, s in zip(rs[1:], shape[1:]): idx = idx * s + r
  return out.index(idx).store(x.index(idx).load() * 2.0).sink(arg=KernelInfo("ew"))


def opts_of(ast: UOp, ren: Renderer) -> list:
  return hand_coded_optimizations(Kernel(ast, ren)).applied_opts


def shared_bytes(ast: UOp, ren: Renderer) -> int:
  with Context(NOOPT=0): uops = lower(ast, ren).uops
  return sum(u.dtype.size * u.dtype.base.itemsize for u in uops if u.op is Ops.DEFINE_LOCAL)


def tiny(base: type[Renderer], **caps: object) -> Renderer:
  """An instance of a renderer class `base` with the capabilities `caps` overridden."""
  cls = type(f"Tiny{base.__name__}", (base,), dict(caps))
  return cls("sm_90") if base is PTXRenderer else cls()


# ***** which opts, within the capabilities *****
def test_sum_with_few_outputs_is_grouped():
  ren = PTXRenderer("sm_90")
  opts = opts_of(sum_ast(4, 4096), ren)
  assert [o.op for o in opts] == [OptOps.GROUPTOP] and opts[0].arg == 256
  assert shared_bytes(sum_ast(4, 4096), ren) == 256 * 4


def test_many_outputs_or_short_reduce_are_not_grouped():
  ren = PTXRenderer("sm_90")
  assert not any(o.op is OptOps.GROUPTOP for o in opts_of(sum_ast(GROUP_MAX_OUTPUTS * 2, 64), ren))
  assert not any(o.op is OptOps.GROUPTOP for o in opts_of(sum_ast(16, 8), ren))
  big = opts_of(matmul_ast(64, 64, 64), ren)  # 4096 outputs: register blocking + locals, as before
  assert {o.op for o in big} >= {OptOps.UPCAST, OptOps.LOCAL} and OptOps.GROUPTOP not in {o.op for o in big}


def test_large_matvec_and_weight_gradient_are_grouped():
  # more outputs than GROUP_MAX_OUTPUTS, but each reduces at least as many elements: still one workgroup per output
  ren = PTXRenderer("sm_90")
  assert OptOps.GROUPTOP in {o.op for o in opts_of(matmul_ast(4096, 1, 4096), ren)}  # a matvec
  assert OptOps.GROUPTOP in {o.op for o in opts_of(sum_ast(4096, 8192), ren)}
  assert OptOps.GROUPTOP not in {o.op for o in opts_of(matmul_ast(128, 128, 256), ren)}  # a matmul: blocked


@pytest.mark.parametrize("shared_max,most", [(64, 16), (40, 8), (4, 0)])
def test_tiny_local_memory_bounds_the_group(shared_max, most):
  """A renderer with little shared memory gets a smaller group (or none): never more slots than it has bytes."""
  ren = tiny(PTXRenderer, shared_max=shared_max)
  ast = sum_ast(4, 4096)
  groups = [o for o in opts_of(ast, ren) if o.op is OptOps.GROUPTOP]
  assert (groups[0].arg if groups else 0) == most
  assert shared_bytes(ast, ren) <= shared_max
  if most: assert shared_bytes(ast, ren) == most * 4


@pytest.mark.parametrize("base", [PTXRenderer, OpenCLRenderer])
def test_workgroup_size_limits_threads(base):
  ren = tiny(base, max_workgroup_size=8)
  assert max_threads(ren) == 8
  for ast in (sum_ast(4, 4096), softmax_ast(4, 64), matmul_ast(64, 64, 64), elementwise_ast((64, 64))):
    with Context(NOOPT=0): spec = get_program(ast, ren)
    assert spec.local_size is not None and 1 < math.prod(spec.local_size) <= 8, (ast.arg.name, spec.local_size)


@pytest.mark.parametrize("lmax,threads", [((8, 1, 8), 4), ((8, 8, 8), 8)])
def test_per_dim_local_limits(lmax, threads):
  """Each local dim stays within `local_max` (the heuristic skips a split that doesn't fit; lowering would otherwise
  silently leave that LOCAL axis a loop): every LOCAL amount it chose is a launch dim."""
  ren = tiny(OpenCLRenderer, local_max=lmax)
  ast = elementwise_ast((4, 8, 4))
  locs = [o.arg for o in opts_of(ast, ren) if o.op is OptOps.LOCAL]
  with Context(NOOPT=0): spec = get_program(ast, ren)
  assert spec.local_size is not None and all(s <= m for s, m in zip(spec.local_size, lmax)), spec.local_size
  assert math.prod(spec.local_size) == math.prod(locs) == threads and spec.local_size[0] == 4


@pytest.mark.parametrize("warp", [16, 32, 64])
def test_contiguous_axis_gets_a_warp(warp):
  ren = tiny(PTXRenderer, warp_size=warp)
  with Context(NOOPT=0): spec = get_program(elementwise_ast((8, 256)), ren)
  assert spec.local_size is not None and spec.local_size[0] == warp  # lidx0 walks the store's contiguous axis


def test_capabilities_default_backward_compatible():
  assert Renderer.max_workgroup_size is None and Renderer.warp_size == 32
  assert max_threads(PTXRenderer("sm_90")) == 1024 and max_threads(OpenCLRenderer()) == 256
  assert max_threads(AMDGPURenderer("gfx1100")) == 1024


def test_tensor_cores_stay_first_for_half_matmuls():
  from tiny_uop.helpers import USE_TC
  if not USE_TC: pytest.skip("TC=0")
  c, a, b = UOp(Ops.PARAM, dtypes.float.ptr(256), arg=0), UOp(Ops.PARAM, dtypes.half.ptr(512), arg=1), \
    UOp(Ops.PARAM, dtypes.half.ptr(512), arg=2)
  i, j, k = UOp.range(16, 0), UOp.range(16, 1), UOp.range(32, 2, AxisType.REDUCE)
  v = (a.index(i * 32 + k).load() * b.index(k * 16 + j).load()).cast(dtypes.float).reduce(k, arg=Ops.ADD)
  ast = c.index(i * 16 + j).store(v).sink(arg=KernelInfo("hmm"))
  assert [o.op for o in opts_of(ast, PTXRenderer("sm_90"))] == [OptOps.TC]  # 256 outputs would group otherwise


# ***** numbers: PTX interpreter, PoCL, MOCK+AMD *****
def _np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


CASES = {
  "sum": (lambda: sum_ast(2, 512), lambda x: [x.reshape(2, 512).sum(1)], [(2, 512)], 2),
  "softmax": (lambda: softmax_ast(2, 32), lambda x: [_np_softmax(x)], [(2, 32)], 64),
  "matmul_grouped": (lambda: matmul_ast(4, 8, 64), lambda a, b: [a @ b], [(4, 64), (64, 8)], 32),
  "matmul_blocked": (lambda: matmul_ast(64, 64, 8), lambda a, b: [a @ b], [(64, 8), (8, 64)], 4096),
}


def _operands(case: str) -> tuple[list[np.ndarray], np.ndarray, UOp]:
  mk, ref, shapes, nout = CASES[case]
  ins = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  return ins, ref(*[x.astype(np.float64) for x in ins])[0].reshape(-1), mk()


def _check_opts(case: str, ren: Renderer) -> None:
  ops = {o.op for o in opts_of(CASES[case][0](), ren)}
  if case == "matmul_blocked": assert OptOps.GROUPTOP not in ops and OptOps.UPCAST in ops
  else: assert OptOps.GROUPTOP in ops


@pytest.mark.parametrize("case", list(CASES))
def test_heuristic_kernels_in_ptx_interpreter(case):
  ren = PTXRenderer("sm_90")
  _check_opts(case, ren)
  ins, ref, ast = _operands(case)
  with Context(NOOPT=0): spec = get_program(ast, ren)
  if case != "matmul_blocked": assert ".shared" in spec.src and "bar.sync" in spec.src
  out = np.zeros(ref.size, np.float32)
  ptxi.run(spec.src, spec.name, [out, *[x.reshape(-1) for x in ins]], spec.global_size,  # type: ignore[attr-defined]
           spec.local_size, (), list(spec.globals))
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@needs_pocl
@pytest.mark.parametrize("case", list(CASES))
def test_heuristic_kernels_on_pocl(case):
  ren = OpenCLRenderer()
  _check_opts(case, ren)
  ins, ref, ast = _operands(case)
  with Context(NOOPT=0): spec = get_program(ast, ren)
  if case != "matmul_blocked": assert "__local float" in spec.src
  out = np.zeros(ref.size, np.float32)
  clr.run(spec, [out, *[x.reshape(-1) for x in ins]])  # type: ignore[attr-defined]
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def _mock_amd() -> object:
  if find_ld_lld() is None: pytest.skip("ld.lld not installed: the AMDGPU compiler can't link")
  try:
    from tiny_uop.plugins import Device
    return Device["MOCK+AMD"]
  except Exception as e:  # noqa: BLE001 -- any reason the emulator device can't open is a skip with that reason
    pytest.skip(f"MOCK+AMD unavailable: {e}")


@pytest.mark.parametrize("case", list(CASES))
def test_heuristic_kernels_on_mock_amd(case):
  dev = _mock_amd()
  from tiny_uop.device import Buffer
  ren = AMDGPURenderer("gfx1100")
  _check_opts(case, ren)
  ins, ref, ast = _operands(case)
  with Context(NOOPT=0): spec = get_program(ast, ren)
  if case != "matmul_blocked": assert "addrspace(3)" in spec.src
  bufs = [Buffer("MOCK+AMD", n, dtypes.float) for n in (ref.size, *[x.size for x in ins])]
  for b, x in zip(bufs[1:], ins): b.copyin(memoryview(np.ascontiguousarray(x).reshape(-1)))
  prg = dev.get_program(spec.name, spec.lib)  # type: ignore[attr-defined]
  order = [bufs[s] for s in spec.globals]
  prg(*[b._buf for b in order], global_size=spec.global_size, local_size=spec.local_size, vals=(), wait=True)
  out = np.frombuffer(bufs[0].as_buffer(), dtype=np.float32)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def random_reduce_ast(seed: int) -> tuple[UOp, tuple[int, ...], tuple[int, ...], np.ndarray]:
  """out[o...] = sum (or max) over r... of x[perm(o..., r...)] * 2 + 1: 1-4 output axes, 1-2 reduce axes, the input
  read in a random axis order (so the reduce axes aren't always innermost)."""
  g = np.random.default_rng(seed)
  oshape = tuple(int(x) for x in g.choice([1, 2, 3, 4, 5, 8], size=int(g.integers(1, 5))))
  rshape = tuple(int(x) for x in g.choice([3, 4, 10, 16, 32, 64], size=int(g.integers(1, 3))))
  full = oshape + rshape
  perm = g.permutation(len(full))
  xshape = tuple(full[p] for p in perm)
  out, x = P(0, math.prod(oshape)), P(1, math.prod(full))
  orngs = [UOp.range(s, i) for i, s in enumerate(oshape)]
  rrngs = [UOp.range(s, len(oshape) + i, AxisType.REDUCE) for i, s in enumerate(rshape)]
  rngs = orngs + rrngs
  xidx: UOp = UOp.const(dtypes.int32, 0)
  for p, s in zip(perm, xshape): xidx = xidx * s + rngs[p]
  oidx: UOp = UOp.const(dtypes.int32, 0)
  for r, s in zip(orngs, oshape): oidx = oidx * s + r
  op = Ops.MAX if seed % 3 == 0 else Ops.ADD
  val = (x.index(xidx).load() * 2.0 + 1.0).reduce(*rrngs, arg=op)
  return out.index(oidx).store(val).sink(arg=KernelInfo(f"rr{seed}")), oshape, xshape, perm


@needs_pocl
@pytest.mark.parametrize("seed", range(12))
def test_random_reductions_on_pocl(seed):
  ast, oshape, xshape, perm = random_reduce_ast(seed)
  X = rng.standard_normal(xshape).astype(np.float32)
  full = X.transpose(np.argsort(perm)).astype(np.float64) * 2 + 1  # axes back in (outputs..., reduces...) order
  red = tuple(range(len(oshape), full.ndim))
  ref = (full.max(red) if seed % 3 == 0 else full.sum(red)).reshape(-1)
  with Context(NOOPT=0): spec = get_program(ast, OpenCLRenderer())
  out = np.zeros(ref.size, np.float32)
  clr.run(spec, [out, X.reshape(-1)])  # type: ignore[attr-defined]
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
