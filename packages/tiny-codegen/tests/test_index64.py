"""64-bit indices: a kernel over more than 2**31-1 elements indexes with int64 on every renderer; nothing wraps.

The scheduler picks int64 for every kernel of a schedule that holds a value or buffer of more than 2**31-1 elements
(`schedule._index_dtype`); SPECIAL launch indices and kernel arguments stay int32 and are widened where used. Here:
the AST a 3e9-element buffer schedules to, each renderer's source for it, and hand-built int64 kernels (loops,
gated loads, reduces, workgroup reduces) run on numpy buffers by each target we can execute (LLVM and clang on the
CPU, PTX in the PTX interpreter, OpenCL on PoCL), against numpy. The 2.2 GB run is tiny-tensor's test_index64.
"""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.compiler.opencl import find_clang
from tiny_codegen.lower import lower
from tiny_codegen.opt import Opt, OptOps
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_codegen.renderer.cstyle import ClangRenderer
from tiny_codegen.renderer.llvmir import LLVMRenderer
from tiny_codegen.renderer.opencl import OpenCLRenderer
from tiny_codegen.renderer.ptx import PTXRenderer
from tiny_codegen.renderer.python import PythonRenderer
from tiny_codegen.schedule import create_schedule
from tiny_codegen.schedule import schedule as sched_mod

import gpu_cl_runner as clr
import kernel_runner as kr
import tiny_runtime_nv.ptx as ptxi  # the PTX executor of tiny-runtime-nv (a test-only dependency)

N = 3_000_000_000  # > 2**31: wraps to -1294967296 as an int32
i64 = dtypes.int64


def _wide_ast() -> UOp:
  b = UOp.new_buffer("CPU", N, dtypes.uint8)
  s = create_schedule(UOp.sink(b + UOp.const(dtypes.uint8, 1, "CPU", (N,))))
  assert len(s.kernels) == 1
  return s.kernels[0].src[0]


def test_range_bound_beyond_its_dtype_is_an_error():
  with pytest.raises(ValueError, match="3000000000 doesn't fit dtypes.int"):
    UOp.range(N, 0)
  assert UOp.range(N, 0, dtype=i64).src[0].arg == N


def test_wide_buffer_schedules_int64_indices():
  ast = _wide_ast()
  rngs = [u for u in ast.toposort() if u.op is Ops.RANGE]
  assert rngs and all(r.dtype == i64 and r.src[0].arg == N for r in rngs)
  assert all(u.src[1].dtype == i64 for u in ast.toposort() if u.op is Ops.INDEX)
  # a small schedule keeps int32
  small = create_schedule(UOp.sink(UOp.new_buffer("CPU", 16, dtypes.uint8) + UOp.const(dtypes.uint8, 1, "CPU", (16,))))
  assert all(u.dtype == dtypes.int32 for u in small.kernels[0].src[0].toposort() if u.op is Ops.RANGE)


@pytest.mark.parametrize("ren, wide", [
  (LLVMRenderer(), ("phi i64", "icmp slt i64", "getelementptr inbounds i8, ptr %data0, i64")),
  (ClangRenderer(), ("for (long long", "long long alu")),
  (PTXRenderer("sm_90"), ("cvt.s64.s32", "add.s64")),
  (AMDGPURenderer("gfx1100"), ("sext i32 %gidx0 to i64", "getelementptr inbounds i8, ptr addrspace(1) %data0, i64")),
  (OpenCLRenderer(), ("long alu0", "(long)(gidx0)")),
  (PythonRenderer(), ("CAST\tint64", "ADD\tint64")),
], ids=lambda x: type(x).__name__ if not isinstance(x, tuple) else "")
def test_every_renderer_indexes_a_wide_kernel_in_64_bits(ren, wide):
  src = ren.render(lower(_wide_ast(), ren).uops)
  for w in wide: assert w in src, f"{type(ren).__name__}: {w!r} not in\n{src}"
  assert "-1294967296" not in src  # 3e9 wrapped to int32 would read there
  if not ren.has_local: assert "3000000000" in src or "1500000000" in src  # the bound (or a thread's share of it)


# ***** hand-built int64 kernels, run *****
def P(slot: int, size: int, dt: DType = dtypes.float32) -> UOp: return UOp(Ops.PARAM, dt.ptr(size), arg=slot)
def c64(v: int) -> UOp: return UOp.const(i64, v)


def _kernels() -> list[tuple[str, UOp, list[np.ndarray], np.ndarray]]:
  rng = np.random.default_rng(0)
  n, k = 37, 24
  A = rng.standard_normal(n * k).astype(np.float32)
  out = []
  # elementwise with a gated (padded) load: c[i] = i >= 3 ? a[i-3] : 0, i in [0, n)
  i = UOp.range(n, 0, dtype=i64)
  a, c = P(1, n * k), P(0, n)
  ast = c.index(i).store((c64(2) < i).where(a.index(i - c64(3), c64(2) < i).load(), 0.0)).sink(arg=KernelInfo())
  ref = np.concatenate([np.zeros(3, np.float32), A[:n - 3]])
  out.append(("gated", ast, [np.zeros(n, np.float32), A], ref))
  # a reduce over an int64 range: c[i] = sum_j a[i*k + j]
  i, j = UOp.range(n, 0, dtype=i64), UOp.range(k, 1, AxisType.REDUCE, dtype=i64)
  ast = c.index(i).store(a.index(i * c64(k) + j).load().reduce(j, arg=Ops.ADD)).sink(arg=KernelInfo())
  out.append(("reduce", ast, [np.zeros(n, np.float32), A], A.reshape(n, k).sum(1)))
  return out


def _grouped(ast: UOp) -> UOp:
  """The reduce as a workgroup reduction (8 threads share the int64 reduce range through int32 shared memory)."""
  return ast.replace(arg=KernelInfo(opts_to_apply=(Opt(OptOps.GROUP, 0, 8),)))


KERNELS = pytest.mark.parametrize("name", [k[0] for k in _kernels()])
OPT = pytest.mark.parametrize("opt", [False, True], ids=["noopt", "opt"])


def _run(name: str, opt: bool, execute) -> None:
  _, ast, bufs, ref = next(k for k in _kernels() if k[0] == name)
  execute(ast, bufs, opt)
  np.testing.assert_allclose(bufs[0], ref, rtol=1e-5, atol=1e-5)


def _cpu(ren):
  def execute(ast, bufs, opt):
    with Context(NOOPT=0 if opt else 1): spec = get_program(ast, ren)
    kr.run(spec, bufs)
  return execute


@KERNELS
@OPT
def test_int64_kernels_llvm(name, opt): _run(name, opt, _cpu(LLVMRenderer()))


@pytest.mark.skipif(find_clang() is None, reason="clang not installed (apt-get install clang)")
@KERNELS
@OPT
def test_int64_kernels_clang(name, opt): _run(name, opt, _cpu(ClangRenderer()))


@KERNELS
@OPT
def test_int64_kernels_ptx(name, opt):
  def execute(ast, bufs, opt):
    if opt and name == "reduce": ast = _grouped(ast)
    with Context(NOOPT=0 if opt else 1): spec = get_program(ast, PTXRenderer("sm_90"))
    if opt and name == "reduce": assert ".shared" in spec.src  # a workgroup reduce, indexed in int32 shared memory
    ptxi.run(spec.src, spec.name, bufs, spec.global_size, spec.local_size, (), list(spec.globals))
  _run(name, opt, execute)


@pytest.mark.skipif(clr.available() is not None, reason=clr.available() or "")
@KERNELS
@OPT
def test_int64_kernels_opencl(name, opt):
  def execute(ast, bufs, opt):
    if opt and name == "reduce": ast = _grouped(ast)
    with Context(NOOPT=0 if opt else 1): spec = get_program(ast, OpenCLRenderer())
    clr.run(spec, bufs)
  _run(name, opt, execute)


@pytest.mark.parametrize("name", ["flip_pad", "reshape_misaligned", "arange", "softmax", "cumsum", "matmul_relu"])
def test_scheduled_kernels_forced_wide_match_numpy(name, monkeypatch):
  """Scheduler paths (pad, flip, reshape, reduce, arange, matmul) with int64 indices, by lowering the threshold,
  compiled by LLVM and run, against the reference evaluator."""
  import test_schedule_compiled as tsc
  monkeypatch.setattr(sched_mod, "INT32_MAX", 8)
  sched_mod.clear_schedule_cache()
  try:
    _, out, ins = next(p for p in tsc._programs() if p[0] == name)
    s = create_schedule(UOp.sink(out))
    assert all(u.dtype == i64 for c in s.kernels for u in c.src[0].toposort() if u.op is Ops.RANGE)
    env = tsc.run_compiled(s, ins)
    np.testing.assert_allclose(tsc.ref.realized_value(s, env, out), tsc.ref.eval_graph(out, ins), rtol=1e-4,
                               atol=1e-5)
  finally: sched_mod.clear_schedule_cache()
