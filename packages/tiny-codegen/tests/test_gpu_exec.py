"""GPU kernels run against numpy without a GPU: OpenCL C on PoCL (CPU OpenCL) and PTX on tiny-runtime-nv's PTX
executor (tiny_runtime_nv.ptx, which follows PTX's documented semantics for the instructions PTXRenderer emits).

PoCL runs skip, with the reason, where no OpenCL platform is installed (`apt-get install pocl-opencl-icd`)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.compiler.opencl import OpenCLCompiler, find_clang
from tiny_codegen.renderer.opencl import OpenCLHalfStorageRenderer, OpenCLRenderer
from tiny_codegen.renderer.ptx import PTXRenderer

import gpu_cl_runner as clr
import test_gpu_render

import tiny_runtime_nv.ptx as ptxi  # the PTX executor of tiny-runtime-nv (a test-only dependency)

_why = clr.available()
needs_pocl = pytest.mark.skipif(_why is not None, reason=_why or "")
TARGETS = pytest.mark.parametrize("target", [pytest.param("opencl", marks=needs_pocl), "ptx"])
needs_clang = pytest.mark.skipif(find_clang() is None, reason="clang not installed (apt-get install clang)")
OPT = pytest.mark.parametrize("opt", [False, True], ids=["noopt", "opt"])
rng = np.random.default_rng(0)


def P(slot: int, size: int, dt: DType = dtypes.float) -> UOp: return UOp(Ops.PARAM, dt.ptr(size), arg=slot)


def cl_renderer() -> OpenCLRenderer:
  """The OpenCL renderer for the installed device: half in memory only where it lacks cl_khr_fp16 (PoCL on CPU)."""
  return OpenCLRenderer() if "cl_khr_fp16" in clr.extensions() else OpenCLHalfStorageRenderer()


def gpu_run(target: str, ast: UOp, bufs: list[np.ndarray], opt: bool = False, vals: tuple[int, ...] = ()) -> object:
  """Compile `ast` for `target` ("opencl": run on PoCL; "ptx": PTXRenderer, run in the PTX interpreter)."""
  ren = cl_renderer() if target == "opencl" else PTXRenderer("sm_90")
  with Context(NOOPT=0 if opt else 1): spec = get_program(ast, ren)
  if target == "opencl": clr.run(spec, bufs, vals)
  else: ptxi.run(spec.src, spec.name, bufs, spec.global_size, spec.local_size, vals, list(spec.globals))
  return spec


@needs_clang
def test_clang_rejects_bad_source_with_message():
  from tiny_uop.device import CompileError
  with pytest.raises(CompileError, match="undeclared|use of"):
    OpenCLCompiler().compile("__kernel void k(__global float* d) { d[0] = nope; }")


@TARGETS
@OPT
def test_elementwise(target, opt):
  n = 37
  c, a, b = P(0, n), P(1, n), P(2, n)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load() * b.index(i).load() + 1.0).sink(arg=KernelInfo())
  A, B, C = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
  gpu_run(target, ast, [C, A, B], opt)
  np.testing.assert_array_equal(C, A * B + np.float32(1))


@TARGETS
@OPT
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
def test_reduce(target, op, opt):
  n, k = 64, 24
  c, a = P(0, n), P(1, n * k)
  i, j = UOp.range(n, 0), UOp.range(k, 1, AxisType.REDUCE)
  ast = c.index(i).store(a.index(i * k + j).load().reduce(j, arg=op)).sink(arg=KernelInfo())
  A = rng.standard_normal(n * k).astype(np.float32)
  C = np.zeros(n, np.float32)
  spec = gpu_run(target, ast, [C, A], opt)
  ref = A.reshape(n, k).sum(1) if op is Ops.ADD else A.reshape(n, k).max(1)
  np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5)
  if opt: assert spec.local_size is not None and np.prod(spec.local_size) > 1  # the optimizer used work-groups


@TARGETS
def test_unrolled_int_argmax_chain(target):
  # out[i] = max_j (a[i*n+j] == a[i*n+n-1] ? n - j : 0), the n-wide int MAX chain of an unrolled argmax (max_pool2d's
  # return_indices): each MAX spells its operands twice, so inline ones made the OpenCL source 2**n times an
  # operand (a 16-wide chain was 2 MB of nested ternaries, and PoCL's work-group compiler overflowed its thread's
  # stack walking them: the MOCK+QCOM IMAGE=1 segfault in test_pool_random_configs)
  rows, n = 8, 12
  c, a = P(0, rows, dtypes.int32), P(1, rows * n)
  i = UOp.range(rows, 0)
  last = a.index(i * n + n - 1).load()
  hits = [a.index(i * n + j).load().eq(last).where(n - j, 0) for j in range(n)]
  best = hits[0]
  for h in hits[1:]: best = best.maximum(h)
  ast = c.index(i).store(best).sink(arg=KernelInfo("argmax_chain"))
  A = rng.permutation(rows * n).astype(np.float32) % 5  # repeats: several j match, the max picks the first
  C = np.zeros(rows, np.int32)
  spec = gpu_run(target, ast, [C, A])
  M = A.reshape(rows, n)
  np.testing.assert_array_equal(C, n - np.argmax(M == M[:, -1:], axis=1))
  if target == "opencl": assert len(spec.src) < 4000, f"{len(spec.src)} characters for {n} MAXes: operands repeated"


@TARGETS
@OPT
def test_matmul(target, opt):
  M, K, N = 16, 12, 32
  c, a, b = P(0, M * N), P(1, M * K), P(2, K * N)
  i, j, kk = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  ast = c.index(i * N + j).store((a.index(i * K + kk).load() * b.index(kk * N + j).load()).reduce(kk, arg=Ops.ADD)) \
    .sink(arg=KernelInfo())
  A, B = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  C = np.zeros(M * N, np.float32)
  gpu_run(target, ast, [C, A.reshape(-1), B.reshape(-1)], opt)
  np.testing.assert_allclose(C.reshape(M, N), A @ B, rtol=1e-5, atol=1e-5)


@TARGETS
def test_gated_pad_and_var(target):
  # out[i] = (i < n) ? a[i] : -1 ... with a DEFINE_VAR n, and a gated (padded) read
  c, a = P(0, 16), P(1, 16)
  n = UOp.variable("n", 1, 16)
  i = UOp.range(16, 0)
  ast = c.index(i).store((i < n).where(a.index(i, i < 12).load(), -1.0)).sink(arg=KernelInfo())
  A = rng.standard_normal(16).astype(np.float32)
  C = np.zeros(16, np.float32)
  gpu_run(target, ast, [C, A], vals=(10,))
  ref = np.where(np.arange(16) < 10, np.where(np.arange(16) < 12, A, 0), -1).astype(np.float32)
  np.testing.assert_array_equal(C, ref)


@TARGETS
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.float64, dtypes.bool],
                         ids=lambda d: d.name)
def test_dtypes_cast_and_math(target, dt):
  for ext, t in (("cl_khr_fp64", dtypes.float64),):  # half without cl_khr_fp16: OpenCLHalfStorageRenderer
    if target == "opencl" and dt == t and ext not in clr.extensions(): pytest.skip(f"this OpenCL device lacks {ext}")
  # out = cast(a*3 - 1, dt), and the bool mask (out != 0) in a second output
  n = 24
  c, m, a = P(0, n, dt), P(1, n, dtypes.bool), P(2, n, dtypes.float)
  i = UOp.range(n, 0)
  v = (a.index(i).load() * 3.0 - 1.0).cast(dt)
  ast = UOp.sink(c.index(i).store(v), m.index(i).store(v.ne(UOp.const(dt, 0)))).replace(arg=KernelInfo())
  A = rng.uniform(-20, 20, n).astype(np.float32)
  A[:3] = [0.0, 1 / 3, 2 / 3]
  np_dt = {dtypes.float16: np.float16, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int64: np.int64,
           dtypes.float64: np.float64, dtypes.bool: np.bool_}[dt]
  C, Mk = np.zeros(n, np_dt), np.zeros(n, np.bool_)
  gpu_run(target, ast, [C, Mk, A])
  x = A * np.float32(3) - np.float32(1)
  ref = (x != 0) if dt == dtypes.bool else (x.astype(np.int64).astype(np_dt) if dtypes.is_int(dt) else x.astype(np_dt))
  np.testing.assert_array_equal(C, ref)
  np.testing.assert_array_equal(Mk, ref != 0)


@needs_pocl
def test_half_storage_only_rounds_like_half():
  # half math in float, rounded to half after every op: numpy's float16 results bit for bit, including the rounding
  # that float32 math alone wouldn't do (2048 + 1 = 2048 in half), casts in and out and bitcasts of the bits
  n = 8
  c, b, a = P(0, n, dtypes.float16), P(1, n, dtypes.uint16), P(2, n, dtypes.float16)
  i = UOp.range(n, 0)
  x = a.index(i).load()
  y = (x * x + UOp.const(dtypes.float16, 1.0)) / UOp.const(dtypes.float16, 3.0)
  ast = UOp.sink(c.index(i).store(y), b.index(i).store(y.bitcast(dtypes.uint16))).replace(arg=KernelInfo("hst"))
  spec = get_program(ast, OpenCLHalfStorageRenderer())
  assert "cl_khr_fp16" not in spec.src and "__global ushort* restrict data0" in spec.src and "_rh(" in spec.src
  A = np.array([45.25, 0.1, -3.0, 65504, 1e-3, 2.0, 255.9, -0.0], np.float16)
  C, B = np.zeros(n, np.float16), np.zeros(n, np.uint16)
  clr.run(spec, [C, B, A])
  with np.errstate(over="ignore"): ref = (A * A + np.float16(1)) / np.float16(3)  # 65504**2: inf, as in half
  np.testing.assert_array_equal(C, ref)
  np.testing.assert_array_equal(B, ref.view(np.uint16))


@TARGETS
def test_int8_wraps(target):
  c, a = P(0, 4, dtypes.int8), P(1, 4, dtypes.int8)
  i = UOp.range(4, 0)
  ast = c.index(i).store(a.index(i).load() + UOp.const(dtypes.int8, 100)).sink(arg=KernelInfo())
  A, C = np.array([0, 27, 28, 100], np.int8), np.zeros(4, np.int8)
  gpu_run(target, ast, [C, A])
  np.testing.assert_array_equal(C, (A.astype(np.int32) + 100).astype(np.int8))


@TARGETS
@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT])
def test_transcendentals_within_ulps(target, op):
  n = 64
  c, a = P(0, n), P(1, n)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load().alu(op)).sink(arg=KernelInfo())
  A = rng.uniform(0.01, 20, n).astype(np.float32)
  C = np.zeros(n, np.float32)
  gpu_run(target, ast, [C, A])
  ref = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt}[op](A.astype(np.float64))
  np.testing.assert_allclose(C, ref, rtol=4 * 2.0 ** -23, atol=4 * 2.0 ** -23)  # OpenCL: <= 3-4 ulp


@TARGETS
def test_bfloat16_through_float(target):
  n = 8
  c, a = P(0, n, dtypes.bfloat16), P(1, n, dtypes.bfloat16)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load() * 2.0 + 1.0).sink(arg=KernelInfo())
  vals = np.array([1.5, -2.25, 3.0, 0.0, 100.0, -0.5, 7.0, 1.0], np.float32)
  A = (vals.view(np.uint32) >> 16).astype(np.uint16)
  C = np.zeros(n, np.uint16)
  gpu_run(target, ast, [C, A])
  np.testing.assert_array_equal((C.astype(np.uint32) << 16).view(np.float32), vals * 2 + 1)


def run_linear(target: str, prg: list[UOp], bufs: list[np.ndarray], gsz: tuple, lsz: tuple) -> None:
  """Render a hand-built linear program for `target` and run it."""
  name = prg[-1].arg.name
  if target == "opencl":
    spec = SimpleNamespace(name=name, src=OpenCLRenderer().render(prg), globals=list(range(len(bufs))),
                           global_size=gsz, local_size=lsz)
    clr.run(spec, bufs)
  else: ptxi.run(PTXRenderer("sm_90").render(prg), name, bufs, gsz, lsz)


@TARGETS
def test_shared_memory_and_barrier_run(target):
  prg = test_gpu_render.shared_reverse_program(16)
  A = rng.standard_normal(64).astype(np.float32)
  C = np.zeros(64, np.float32)
  run_linear(target, prg, [C, A], (4, 1, 1), (16, 1, 1))
  np.testing.assert_array_equal(C, A.reshape(4, 16)[:, ::-1].reshape(-1))


@TARGETS
def test_vector_load_store_run(target):
  prg = test_gpu_render.vector_program()
  A = rng.standard_normal(64).astype(np.float32)
  C = np.zeros(64, np.float32)
  run_linear(target, prg, [C, A], (16, 1, 1), (1, 1, 1))
  np.testing.assert_array_equal(C, A * 2)


def image_program(h: int, w: int) -> list[UOp]:
  """out_image[y, x] = in_image[y, x+1] * 2 + 1 (float4 texels; the last column reads outside: a gated load -> 0)."""
  out, img = UOp(Ops.PARAM, dtypes.imagef((h, w, 4)), arg=0), UOp(Ops.PARAM, dtypes.imagef((h, w, 4)), arg=1)
  x = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, w),), "lidx0")
  y = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, h),), "gidx0")
  x1 = x + UOp.const(dtypes.int32, 1)
  src_xy = UOp(Ops.VECTORIZE, dtypes.int32.vec(2), (x1, y))
  texel = UOp(Ops.LOAD, dtypes.float.vec(4), (img.index(src_xy, x1 < UOp.const(dtypes.int32, w)),))
  val = texel * UOp(Ops.VECTORIZE, dtypes.float.vec(4), (UOp.const(dtypes.float, 2.0),) * 4) + \
    UOp(Ops.VECTORIZE, dtypes.float.vec(4), (UOp.const(dtypes.float, 1.0),) * 4)
  st = UOp(Ops.STORE, dtypes.void, (out.index(UOp(Ops.VECTORIZE, dtypes.int32.vec(2), (x, y))), val))
  return list(UOp(Ops.SINK, dtypes.void, (st,), KernelInfo("img")).toposort())


def test_image_kernel_text():
  cl = OpenCLRenderer().render(image_program(3, 5))
  assert "write_only image2d_t data0, read_only image2d_t data1)" in cl and "__constant sampler_t smp" in cl
  assert "read_imagef(data1, smp, vec" in cl and "write_imagef(data0, vec" in cl
  if find_clang() is not None: OpenCLCompiler().compile(cl)


@needs_pocl
def test_image_kernel_runs_on_pocl():
  h, w = 3, 5
  A = rng.standard_normal((h, w, 4)).astype(np.float32)
  C = np.zeros((h, w, 4), np.float32)
  spec = SimpleNamespace(name="img", src=OpenCLRenderer().render(image_program(h, w)), globals=[0, 1],
                         global_size=(h, 1, 1), local_size=(w, 1, 1))
  clr.run(spec, [C, A])
  ref = np.concatenate([A[:, 1:] * 2 + 1, np.ones((h, 1, 4), np.float32)], axis=1)
  np.testing.assert_array_equal(C, ref)


@pytest.mark.parametrize("k,din", [(16, dtypes.float16), (16, dtypes.uint16), (8, dtypes.float16)],
                         ids=["m16n8k16_f16", "m16n8k16_bf16", "m16n8k8_f16"])
def test_ptx_wmma_computes_a_matmul(k, din):
  # one warp: D (16x8) = A (16xk) @ B (kx8) + C, fragments placed per the PTX ISA layout (tiny_runtime_nv.ptx.mma). This
  # checks operand order, shapes and the f16/bf16 types; it can't see the half-packing order (a permutation of k
  # applied to A and B alike leaves A @ B unchanged), which follows PTX's `mov.b32 d, {lo, hi}`.
  render = test_gpu_render
  n_a, n_b = (8, 4) if k == 16 else (4, 2)
  name = "wmma_bf16" if din == dtypes.uint16 else "wmma"
  prg = render.wmma_program(n_a, n_b, 4, din=din, name=name)  # type: ignore[attr-defined]
  A, B, C = rng.standard_normal((16, k)), rng.standard_normal((k, 8)), rng.standard_normal((16, 8)).astype(np.float32)
  if din == dtypes.float16: A, B = A.astype(np.float16), B.astype(np.float16)
  else:  # bfloat16: the top 16 bits of float32
    A, B = ((x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) for x in (A, B))
  fa, fb, fc = np.zeros(32 * n_a, A.dtype), np.zeros(32 * n_b, B.dtype), np.zeros(32 * 4, np.float32)
  for lane in range(32):
    for i in range(n_a): fa[lane * n_a + i] = A[ptxi.frag_a(k, i, lane)]
    for i in range(n_b): fb[lane * n_b + i] = B[ptxi.frag_b(k, i, lane)]
    for i in range(4): fc[lane * 4 + i] = C[ptxi.frag_c(i, lane)]
  D = np.zeros(32 * 4, np.float32)
  ptxi.run(PTXRenderer("sm_90").render(prg), prg[-1].arg.name, [D, fa, fb, fc], (1, 1, 1), (32, 1, 1))
  got = np.zeros((16, 8), np.float32)
  for lane in range(32):
    for i in range(4): got[ptxi.frag_c(i, lane)] = D[lane * 4 + i]
  fA, fB = (x.astype(np.float32) if din == dtypes.float16 else (x.astype(np.uint32) << 16).view(np.float32)
            for x in (A, B))
  np.testing.assert_allclose(got, fA.astype(np.float64) @ fB + C, rtol=1e-5, atol=1e-5)
