"""Compile and run hand-built kernel ASTs with both CPU renderers (LLVM IR via llvmlite, C via clang) vs numpy."""
from __future__ import annotations


import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType, to_numpy
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.renderer.cstyle import ClangRenderer
from tiny_codegen.renderer.llvmir import LLVMRenderer

import kernel_runner as kr

OPT = pytest.mark.parametrize("opt", [False, True], ids=["noopt", "opt"])
RENDERERS = [pytest.param(LLVMRenderer, id="llvm"),
             pytest.param(ClangRenderer, id="clang")]


def P(slot: int, size: int, dt: DType = dtypes.float) -> UOp: return UOp(Ops.PARAM, dt.ptr(size), arg=slot)


def compile_run(R: type, ast: UOp, bufs: list[np.ndarray], vals: tuple[int, ...] = (), threads: int = 1,
                threaded: bool = False, opt: bool = False) -> object:
  """Compile `ast` for a fresh renderer R (NOOPT unless `opt`: these tests pin the lowering of the AST as written)
  and run it on `bufs`."""
  r = R()
  r.threads, r.thread_min_work = threads, 0
  with Context(NOOPT=0 if opt else 1): spec = get_program(ast, r)
  kr.run(spec, bufs, vals, threaded=threaded)
  return spec


rng = np.random.default_rng(0)


@pytest.mark.parametrize("R", RENDERERS)
def test_elementwise_mul_add(R):
  n = 37
  c, a, b = P(0, n), P(1, n), P(2, n)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load() * b.index(i).load() + 1.0).sink(arg=KernelInfo())
  A, B = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  C = np.zeros(n, np.float32)
  compile_run(R, ast, [C, A, B])
  np.testing.assert_array_equal(C, A * B + np.float32(1))


@OPT
@pytest.mark.parametrize("R", RENDERERS)
def test_broadcast_index_math(R, opt):
  # out[i] = a[i//4] - b[i%4]: a (8,) broadcast over columns, b (4,) over rows of an (8, 4) output
  c, a, b = P(0, 32), P(1, 8), P(2, 4)
  i = UOp.range(32, 0)
  ast = c.index(i).store(a.index(i // 4).load() - b.index(i % 4).load()).sink(arg=KernelInfo())
  A, B = rng.standard_normal(8).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  C = np.zeros(32, np.float32)
  compile_run(R, ast, [C, A, B], opt=opt)
  np.testing.assert_array_equal(C, (A[:, None] - B[None, :]).reshape(-1))


@OPT
@pytest.mark.parametrize("R", RENDERERS)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL])
def test_reduce(R, op, opt):
  n, k = 6, 10
  c, a = P(0, n), P(1, n * k)
  i, j = UOp.range(n, 0), UOp.range(k, 1, AxisType.REDUCE)
  ast = c.index(i).store(a.index(i * k + j).load().reduce(j, arg=op)).sink(arg=KernelInfo())
  A = rng.uniform(0.5, 1.5, n * k).astype(np.float32)
  C = np.zeros(n, np.float32)
  compile_run(R, ast, [C, A], opt=opt)
  ref = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[op](A.reshape(n, k), axis=1)
  np.testing.assert_allclose(C, ref, rtol=1e-5)


@OPT
@pytest.mark.parametrize("R", RENDERERS)
def test_full_reduce_to_scalar(R, opt):
  c, a = P(0, 1), P(1, 100)
  j = UOp.range(100, 0, AxisType.REDUCE)
  ast = c.index(UOp.const(dtypes.index, 0)).store(a.index(j).load().reduce(j)).sink(arg=KernelInfo())
  A, C = rng.standard_normal(100).astype(np.float32), np.zeros(1, np.float32)
  compile_run(R, ast, [C, A], threads=4, opt=opt)
  np.testing.assert_allclose(C[0], A.sum(), rtol=1e-5, atol=1e-5)


@OPT
@pytest.mark.parametrize("R", RENDERERS)
def test_softmax_like_two_dependent_reduces(R, opt):
  # out[i, j] = exp2(x[i, j] - max_j x[i, :]) / sum_j exp2(x[i, j] - max)  (two reduces, one uses the other)
  n, k = 5, 7
  c, a = P(0, n * k), P(1, n * k)
  i, j = UOp.range(n, 0), UOp.range(k, 1)
  r1, r2 = UOp.range(k, 2, AxisType.REDUCE), UOp.range(k, 3, AxisType.REDUCE)
  mx = a.index(i * k + r1).load().reduce(r1, arg=Ops.MAX)
  sm = (a.index(i * k + r2).load() - mx).exp2().reduce(r2, arg=Ops.ADD)
  ast = c.index(i * k + j).store((a.index(i * k + j).load() - mx).exp2() / sm).sink(arg=KernelInfo())
  A, C = rng.standard_normal(n * k).astype(np.float32), np.zeros(n * k, np.float32)
  compile_run(R, ast, [C, A], threads=2, opt=opt)
  x = A.reshape(n, k)
  e = np.exp2(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(C.reshape(n, k), e / e.sum(1, keepdims=True), rtol=1e-5)


@OPT
@pytest.mark.parametrize("R", RENDERERS)
def test_reduce_then_elementwise_and_multi_output(R, opt):
  # out0[i] = sum_j a[i,j] * 2 ; out1[i] = max_j a[i,j] (same reduce range shared by two reduces)
  n, k = 4, 9
  c0, c1, a = P(0, n), P(1, n), P(2, n * k)
  i, j = UOp.range(n, 0), UOp.range(k, 1, AxisType.REDUCE)
  x = a.index(i * k + j).load()
  ast = UOp.sink(c0.index(i).store(x.reduce(j) * 2.0), c1.index(i).store(x.reduce(j, arg=Ops.MAX)), arg=KernelInfo())
  A = rng.standard_normal(n * k).astype(np.float32)
  C0, C1 = np.zeros(n, np.float32), np.zeros(n, np.float32)
  spec = compile_run(R, ast, [C0, C1, A], opt=opt)
  np.testing.assert_allclose(C0, A.reshape(n, k).sum(1) * 2, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(C1, A.reshape(n, k).max(1))
  assert spec.outs == [0, 1] and spec.ins == [2]
  # the two reduces over the same range share one loop
  if not opt: assert sum(1 for u in spec.uops if u.op is Ops.RANGE) == 2


@OPT
@pytest.mark.parametrize("R", RENDERERS)
def test_gated_load_pad(R, opt):
  # out[i] = a[i-2] for 2 <= i < 10 else 0: a PAD of (2, 3) around 8 elements, reading out of bounds is masked
  c, a = P(0, 13), P(1, 8)
  i = UOp.range(13, 0)
  valid = (i >= 2) & (i < 10)
  ast = c.index(i).store(a.index(i - 2, valid).load() + 1.0).sink(arg=KernelInfo())
  A, C = rng.standard_normal(8).astype(np.float32), np.zeros(13, np.float32)
  compile_run(R, ast, [C, A], opt=opt)
  np.testing.assert_array_equal(C, np.pad(A, (2, 3)) + np.float32(1))


@pytest.mark.parametrize("R", RENDERERS)
def test_gated_store(R):
  c, a = P(0, 10), P(1, 10)
  i = UOp.range(10, 0)
  ast = c.index(i, i < 4).store(a.index(i).load()).sink(arg=KernelInfo())
  A, C = rng.standard_normal(10).astype(np.float32), np.full(10, 7.0, np.float32)
  compile_run(R, ast, [C, A])
  np.testing.assert_array_equal(C, np.concatenate([A[:4], np.full(6, 7.0, np.float32)]))


CASTS = [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float32, dtypes.float16),
         (dtypes.float16, dtypes.float32), (dtypes.float32, dtypes.float64), (dtypes.int32, dtypes.int8),
         (dtypes.uint8, dtypes.float32), (dtypes.float32, dtypes.bool), (dtypes.bool, dtypes.int32),
         (dtypes.int64, dtypes.int32), (dtypes.int16, dtypes.uint32), (dtypes.float32, dtypes.uint8)]


@pytest.mark.parametrize("R", RENDERERS)
@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{s.name}->{d.name}" for s, d in CASTS])
def test_cast(R, src, dst):
  n = 16
  c, a = P(0, n, dst), P(1, n, src)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load().cast(dst)).sink(arg=KernelInfo())
  if src == dtypes.bool: A = rng.integers(0, 2, n).astype(np.bool_)
  elif dtypes.is_float(src):
    A = rng.uniform(0, 200 if dst == dtypes.uint8 else 100, n).astype(to_numpy(src))
    A[:3] = [0, -0.0, 1.5] if dst != dtypes.uint8 else [0, 1.5, 2.75]
  else: A = rng.integers(0 if dtypes.is_unsigned(src) else -1000, 1000, n).astype(to_numpy(src))
  C = np.zeros(n, to_numpy(dst))
  compile_run(R, ast, [C, A])
  trunc = dtypes.is_float(src) and dtypes.is_int(dst)
  ref = np.trunc(A).astype(to_numpy(dst)) if trunc else A.astype(to_numpy(dst))
  np.testing.assert_array_equal(C, ref)


@OPT
@pytest.mark.parametrize("R", RENDERERS)
def test_symbolic_size(R, opt):
  n = UOp.variable("n", 1, 64)
  c, a = P(0, 64), P(1, 64)
  i = UOp.range(n, 0)
  j = UOp.range(n, 1, AxisType.REDUCE)
  ast = c.index(i).store(a.index(j).load().reduce(j) + a.index(i).load()).sink(arg=KernelInfo())
  for nv in (5, 33):
    A, C = rng.standard_normal(64).astype(np.float32), np.zeros(64, np.float32)
    spec = compile_run(R, ast, [C, A], vals=(nv,), threads=3, opt=opt)
    assert [v.arg[0] for v in spec.vars] == ["n"]
    np.testing.assert_allclose(C[:nv], A[:nv].sum() + A[:nv], rtol=1e-5, atol=1e-5)
    assert (C[nv:] == 0).all()


@pytest.mark.parametrize("R", RENDERERS)
def test_two_vars_sorted_by_name(R):
  m, b = UOp.variable("m", 1, 8), UOp.variable("b", 0, 8)
  c = P(0, 16, dtypes.int32)
  i = UOp.range(m, 0)
  ast = c.index(i).store(i * b + m).sink(arg=KernelInfo())
  C = np.zeros(16, np.int32)
  spec = compile_run(R, ast, [C], vals=(3, 5))  # b=3, m=5 (sorted by name)
  assert [v.arg[0] for v in spec.vars] == ["b", "m"]
  np.testing.assert_array_equal(C[:5], np.arange(5) * 3 + 5)


@OPT
@pytest.mark.parametrize("R", RENDERERS)
@pytest.mark.parametrize("n", [1, 7, 64, 1000])
def test_threads_same_result(R, n, opt):
  c, a = P(0, n), P(1, n * 3)
  i, j = UOp.range(n, 0), UOp.range(3, 1, AxisType.REDUCE)
  ast = c.index(i).store(a.index(i * 3 + j).load().reduce(j) * 0.5).sink(arg=KernelInfo())
  A = rng.standard_normal(n * 3).astype(np.float32)
  outs = []
  for t in (1, 4):
    C = np.zeros(n, np.float32)
    spec = compile_run(R, ast, [C, A], threads=t, threaded=True, opt=opt)
    assert spec.global_size[0] == min(t, n) or opt
    outs.append(C)
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_allclose(outs[0], A.reshape(n, 3).sum(1) * 0.5, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("R", RENDERERS)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_transcendentals(R, dt):
  n = 64
  c0, c1, c2, c3, a = P(0, n, dt), P(1, n, dt), P(2, n, dt), P(3, n, dt), P(4, n, dt)
  i = UOp.range(n, 0)
  x = a.index(i).load()
  ast = UOp.sink(c0.index(i).store(x.exp2()), c1.index(i).store(x.log2()), c2.index(i).store(x.sin()),
                 c3.index(i).store(x.sqrt()), arg=KernelInfo())
  A = rng.uniform(0.1, 10, n).astype(to_numpy(dt))
  outs = [np.zeros(n, to_numpy(dt)) for _ in range(4)]
  compile_run(R, ast, [*outs, A])
  tol = 1e-6 if dt == dtypes.float32 else 1e-14
  for o, f in zip(outs, (np.exp2, np.log2, np.sin, np.sqrt)): np.testing.assert_allclose(o, f(A), rtol=tol, atol=tol)


@pytest.mark.parametrize("R", RENDERERS)
def test_int_ops(R):
  n = 32
  c, a, b = P(0, n, dtypes.int32), P(1, n, dtypes.int32), P(2, n, dtypes.int32)
  i = UOp.range(n, 0)
  x, y = a.index(i).load(), b.index(i).load()
  val = (x // y) + (x % y) * 3 + (x.maximum(y) ^ 5) + (x < y).where(x << 1, y >> 1) + ((x & 7) | 8) - (-x)
  ast = c.index(i).store(val).sink(arg=KernelInfo())
  X = rng.integers(-100, 100, n).astype(np.int32)
  Y = rng.integers(1, 9, n).astype(np.int32) * rng.choice([-1, 1], n).astype(np.int32)
  C = np.zeros(n, np.int32)
  compile_run(R, ast, [C, X, Y])
  q = np.trunc(X / Y).astype(np.int32)
  ref = q + (X - q * Y) * 3 + (np.maximum(X, Y) ^ 5) + np.where(X < Y, X << 1, Y >> 1) + ((X & 7) | 8) + X
  np.testing.assert_array_equal(C, ref)


@pytest.mark.parametrize("R", RENDERERS)
def test_half_math(R):
  n = 16
  c, a, b = P(0, n, dtypes.half), P(1, n, dtypes.half), P(2, n, dtypes.half)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load() * b.index(i).load() + a.index(i).load()).sink(arg=KernelInfo())
  A, B = rng.standard_normal(n).astype(np.float16), rng.standard_normal(n).astype(np.float16)
  C = np.zeros(n, np.float16)
  compile_run(R, ast, [C, A, B])
  np.testing.assert_array_equal(C, (A * B) + A)


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
  b = x.astype(np.float32).view(np.uint32)
  return ((b + 0x7fff + ((b >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("R", RENDERERS)
def test_bfloat16_through_float(R):
  n = 16
  c, a, d = P(0, n, dtypes.bfloat16), P(1, n, dtypes.bfloat16), P(2, n, dtypes.float32)
  i = UOp.range(n, 0)
  x = a.index(i).load()
  ast = UOp.sink(c.index(i).store(x * x.const_like(3.0)), d.index(i).store(x.cast(dtypes.float32)), arg=KernelInfo())
  A = _to_bf16_bits(rng.standard_normal(n).astype(np.float32))
  C, D = np.zeros(n, np.uint16), np.zeros(n, np.float32)
  compile_run(R, ast, [C, A, D])
  af = (A.astype(np.uint32) << 16).view(np.float32)
  np.testing.assert_array_equal(D, af)
  np.testing.assert_array_equal(C, _to_bf16_bits(af * np.float32(3)))


@pytest.mark.parametrize("R", RENDERERS)
def test_bool_buffers(R):
  n = 20
  c, a, b = P(0, n, dtypes.bool), P(1, n), P(2, n, dtypes.bool)
  i = UOp.range(n, 0)
  ast = c.index(i).store((a.index(i).load() < 0.0) ^ b.index(i).load()).sink(arg=KernelInfo())
  A, B = rng.standard_normal(n).astype(np.float32), rng.integers(0, 2, n).astype(np.bool_)
  C = np.zeros(n, np.bool_)
  compile_run(R, ast, [C, A, B])
  np.testing.assert_array_equal(C, (A < 0) ^ B)


@OPT
@pytest.mark.parametrize("R", RENDERERS)
def test_upcast_and_unroll(R, opt):
  # matmul (4x8) @ (8x6): output column axis UPCAST by 2 (split), reduce axis UNROLL 4 inside a REDUCE of 2
  M, K, N = 4, 8, 6
  c, a, b = P(0, M * N), P(1, M * K), P(2, K * N)
  i, j0, ju = UOp.range(M, 0), UOp.range(N // 2, 1), UOp.range(2, 2, AxisType.UPCAST)
  k0, ku = UOp.range(K // 4, 3, AxisType.REDUCE), UOp.range(4, 4, AxisType.UNROLL)
  j, k = j0 * 2 + ju, k0 * 4 + ku
  ast = c.index(i * N + j).store((a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k0, ku)).sink(
    arg=KernelInfo())
  A, B = rng.standard_normal(M * K).astype(np.float32), rng.standard_normal(K * N).astype(np.float32)
  C = np.zeros(M * N, np.float32)
  spec = compile_run(R, ast, [C, A, B], threads=2, opt=opt)
  np.testing.assert_allclose(C.reshape(M, N), A.reshape(M, K) @ B.reshape(K, N), rtol=1e-5, atol=1e-5)
  # both upcast lanes accumulate in one reduce loop: 2 accumulators, loops only for i, j0, k0
  if not opt:
    assert sum(1 for u in spec.uops if u.op is Ops.DEFINE_REG) == 2
    assert sorted(u.arg[0] for u in spec.uops if u.op is Ops.RANGE) == [0, 1, 3]


@pytest.mark.parametrize("R", RENDERERS)
def test_kernel_without_loops(R):
  c, a = P(0, 1), P(1, 2)
  zero, one = UOp.const(dtypes.index, 0), UOp.const(dtypes.index, 1)
  ast = c.index(zero).store(a.index(zero).load() * a.index(one).load()).sink(arg=KernelInfo())
  A, C = np.array([3.0, 4.0], np.float32), np.zeros(1, np.float32)
  spec = compile_run(R, ast, [C, A], threads=4)
  assert C[0] == 12.0 and spec.global_size == (1, 1, 1)


@pytest.mark.parametrize("R", RENDERERS)
def test_size_one_loops_and_in_place_update(R):
  # c[i*1 + j] += a[i] over a (6, 1) shape: the bound-1 loop folds away; c is read and written (outs and ins)
  c, a = P(0, 6), P(1, 6)
  i, j = UOp.range(6, 0), UOp.range(1, 1)
  ast = c.index(i + j).store(c.index(i + j).load() + a.index(i).load()).sink(arg=KernelInfo())
  A, C = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
  ref = C + A
  spec = compile_run(R, ast, [C, A])
  np.testing.assert_array_equal(C, ref)
  assert spec.outs == [0] and spec.ins == [0, 1]


@pytest.mark.parametrize("R", RENDERERS)
def test_more_alu_ops(R):
  n = 24
  c0, c1, c2, c3, a, b = P(0, n), P(1, n, dtypes.uint32), P(2, n, dtypes.int8), P(3, n, dtypes.uint64), P(4, n), P(5, n)
  i = UOp.range(n, 0)
  x, y = a.index(i).load(), b.index(i).load()
  fval = UOp(Ops.MULACC, dtypes.float, (x, y, x.reciprocal())) + x.trunc() + x.maximum(0.5).pow(y.maximum(0.0)) + \
    x.eq(y).where(x.const_like(100.0), x.const_like(-1.0)) + (x < y).cast(dtypes.float)
  u = i.cast(dtypes.uint32)
  uval = ((u * 0x9E3779B9) >> 3) ^ (u << 29) | UOp.const(dtypes.uint32, 0x80000000)
  ival = (i.cast(dtypes.int8) * 13 - 100).maximum(UOp.const(dtypes.int8, -128))
  wval = i.cast(dtypes.uint64) * UOp.const(dtypes.uint64, 0xFFFFFFFFFFFFFFF1)
  ast = UOp.sink(c0.index(i).store(fval), c1.index(i).store(uval), c2.index(i).store(ival), c3.index(i).store(wval),
                 arg=KernelInfo())
  X = rng.uniform(0.5, 3, n).astype(np.float32)
  Y = X.copy()
  Y[::2] = rng.uniform(-2, 2, n // 2)
  outs = [np.zeros(n, np.float32), np.zeros(n, np.uint32), np.zeros(n, np.int8), np.zeros(n, np.uint64)]
  compile_run(R, ast, [*outs, X, Y])
  f32 = np.float32
  ref = (X * Y + f32(1) / X) + np.trunc(X) + np.power(np.maximum(X, f32(0.5)), np.maximum(Y, f32(0))) + \
    np.where(X == Y, f32(100), f32(-1)) + (X < Y).astype(np.float32)
  np.testing.assert_allclose(outs[0], ref, rtol=1e-6)
  U = np.arange(n, dtype=np.uint32)
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(outs[1], ((U * np.uint32(0x9E3779B9)) >> 3) ^ (U << 29) | np.uint32(0x80000000))
    np.testing.assert_array_equal(outs[2], np.maximum(np.arange(n).astype(np.int8) * np.int8(13) - np.int8(100), -128))
    np.testing.assert_array_equal(outs[3], np.arange(n, dtype=np.uint64) * np.uint64(0xFFFFFFFFFFFFFFF1))


@pytest.mark.parametrize("R", RENDERERS)
def test_optimizer_thread_axis_becomes_core_id(R):
  # out[o*4 + t] = a[o*4 + t] * 3 with t a THREAD axis of 4: the kernel runs on 4 threads, each t a core_id
  c, a = P(0, 24), P(1, 24)
  o, t = UOp.range(6, 0), UOp.range(4, 1, AxisType.THREAD)
  ast = c.index(o * 4 + t).store(a.index(o * 4 + t).load() * 3.0).sink(arg=KernelInfo())
  A, C = rng.standard_normal(24).astype(np.float32), np.zeros(24, np.float32)
  spec = compile_run(R, ast, [C, A], threads=2, threaded=True)
  assert spec.global_size == (4, 1, 1) and [u.arg for u in spec.uops if u.op is Ops.SPECIAL] == ["core_id"]
  np.testing.assert_array_equal(C, A * np.float32(3))


@pytest.mark.parametrize("R", RENDERERS)
def test_half_transcendentals(R):
  n = 32
  c0, c1, c2, c3, a = [P(k, n, dtypes.half) for k in range(5)]
  i = UOp.range(n, 0)
  x = a.index(i).load()
  ast = UOp.sink(c0.index(i).store(x.exp2()), c1.index(i).store(x.log2()), c2.index(i).store(x.sin()),
                 c3.index(i).store(x.sqrt()), arg=KernelInfo())
  A = rng.uniform(0.1, 8, n).astype(np.float16)
  outs = [np.zeros(n, np.float16) for _ in range(4)]
  compile_run(R, ast, [*outs, A])
  for o, f in zip(outs, (np.exp2, np.log2, np.sin, np.sqrt)):  # computed in float, rounded to half once
    np.testing.assert_array_equal(o, f(A.astype(np.float32)).astype(np.float16))


@pytest.mark.parametrize("R", RENDERERS)
@OPT
def test_nested_reduce(R, opt):
  # out[i] = sum_j max_k a[i, j, k]: the inner reduce's loop sits inside the outer reduce's loop
  n, m, k = 3, 4, 5
  c, a = P(0, n), P(1, n * m * k)
  i, j, kk = UOp.range(n, 0), UOp.range(m, 1, AxisType.REDUCE), UOp.range(k, 2, AxisType.REDUCE)
  inner = a.index(i * (m * k) + j * k + kk).load().reduce(kk, arg=Ops.MAX)
  ast = c.index(i).store(inner.reduce(j)).sink(arg=KernelInfo())
  A, C = rng.standard_normal(n * m * k).astype(np.float32), np.zeros(n, np.float32)
  compile_run(R, ast, [C, A], threads=2, opt=opt)
  np.testing.assert_allclose(C, A.reshape(n, m, k).max(2).sum(1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("R", RENDERERS)
def test_stores_with_non_nesting_ranges(R):
  # out0[i, j] = a[i, j] and out1[j] = b[j] * 2 in one kernel: out1's loop is not inside out0's i loop by itself
  c0, c1, a, b = P(0, 12), P(1, 4), P(2, 12), P(3, 4)
  i, j = UOp.range(3, 0), UOp.range(4, 1)
  ast = UOp.sink(c0.index(i * 4 + j).store(a.index(i * 4 + j).load()), c1.index(j).store(b.index(j).load() * 2.0),
                 arg=KernelInfo())
  A, B = rng.standard_normal(12).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  C0, C1 = np.zeros(12, np.float32), np.zeros(4, np.float32)
  compile_run(R, ast, [C0, C1, A, B], threads=2)
  np.testing.assert_array_equal(C0, A)
  np.testing.assert_array_equal(C1, B * np.float32(2))


@pytest.mark.parametrize("R", RENDERERS)
def test_threefry(R):
  """THREEFRY is decomposed into uint32 rounds, bit-exact with tiny_uop.alu's reference threefry2x32."""
  from tiny_uop.alu import threefry2x32
  n = 16
  c, x, k = P(0, n, dtypes.uint64), P(1, n, dtypes.uint64), P(2, n, dtypes.uint64)
  i = UOp.range(n, 0)
  ast = c.index(i).store(x.index(i).load().alu(Ops.THREEFRY, k.index(i).load())).sink(arg=KernelInfo())
  X = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
  K = rng.integers(0, 2**63, n, dtype=np.uint64)
  C = np.zeros(n, np.uint64)
  compile_run(R, ast, [C, X, K])
  assert [int(v) for v in C] == [threefry2x32(int(a), int(b)) for a, b in zip(X, K)]
