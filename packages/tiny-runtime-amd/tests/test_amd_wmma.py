"""RDNA3 tensor cores end to end: half and bfloat16 matmuls mapped by the TC opt onto wave32
`v_wmma_f32_16x16x16_{f16,bf16}` (AMDGPURenderer gfx1100), checked in the LLVM IR and the compiler's assembly, and run
on `MOCK+AMD` (the RDNA3 emulator executes the WMMA) against numpy; and the same through tiny-tensor's `a @ b`."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_codegen import get_program
from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, find_ld_lld
from tiny_codegen.opt import Kernel, Opt, OptOps, apply_opts, hand_coded_optimizations
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.dtype import DType
from tiny_uop.plugins import Device
from tiny_uop.uop import AxisType

pytestmark = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
TC = Opt(OptOps.TC, 0, -1)
KIND = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}


def matmul(M: int, N: int, K: int, din: DType, cast_first: bool = False, out: DType = dtypes.float,
           b_t: bool = False, a_off: int = 0) -> UOp:
  """c[i*N+j] = REDUCE(CAST(a[i*K+k] * b[k*N+j]), k) as the scheduler emits `a @ b` on `din` inputs (or with the casts
  on the operands); `out` half casts the result back, `b_t` reads b as N x K (`a @ b.T`), `a_off` reads a from
  element `a_off` on."""
  c, a, b = (UOp(Ops.PARAM, out.ptr(M * N), arg=0), UOp(Ops.PARAM, din.ptr(M * K + a_off), arg=1),
             UOp(Ops.PARAM, din.ptr(K * N), arg=2))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  x, y = a.index(i * K + k + a_off).load(), b.index(j * K + k if b_t else k * N + j).load()
  v = x.cast(dtypes.float) * y.cast(dtypes.float) if cast_first else (x * y).cast(dtypes.float)
  val = UOp(Ops.REDUCE, dtypes.float, (v, k), Ops.ADD)
  return c.index(i * N + j).store(val.cast(out) if out != dtypes.float else val).sink(arg=KernelInfo(f"mm_{M}_{N}_{K}"))


def operands(M: int, N: int, K: int, din: DType, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Random A (M x K), B (K x N) as the buffers hold them (half, or bfloat16 as the top 16 bits of float32), and their
  exact values in float64."""
  rng = np.random.default_rng(seed)
  A, B = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  if din == dtypes.float16: a, b = A.astype(np.float16), B.astype(np.float16)
  else: a, b = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (A, B))

  def exact(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) if x.dtype == np.float16 else (x.astype(np.uint32) << 16).view(np.float32)
            .astype(np.float64))
  return a, b, exact(a), exact(b)


def run_on_mock(spec, out: np.ndarray, *inputs: np.ndarray) -> np.ndarray:
  """Launch the compiled kernel on MOCK+AMD with `inputs` copied in; the output buffer read back as `out`'s dtype."""
  dev = Device["MOCK+AMD"]
  dt = {np.dtype(np.float32): dtypes.float, np.dtype(np.float16): dtypes.float16, np.dtype(np.uint16): dtypes.uint16}
  bufs = [Buffer("MOCK+AMD", x.size, dt[x.dtype]) for x in (out, *inputs)]
  for b, x in zip(bufs[1:], inputs): b.copyin(memoryview(np.ascontiguousarray(x).ravel()))
  prg = dev.get_program(spec.name, spec.lib)
  prg(*[b._buf for b in bufs], global_size=spec.global_size, local_size=spec.local_size, vals=(), wait=True)
  return np.frombuffer(bufs[0].as_buffer(), dtype=out.dtype).copy()


def compile_tc(ast: UOp, din: DType, n_wmma: int = 1):
  ren = AMDGPURenderer("gfx1100")
  with Context(SPEC=1): spec = get_program(apply_opts(ast, ren, [TC]), ren)
  assert spec.src.count(f"call <8 x float> @llvm.amdgcn.wmma.f32.16x16x16.{KIND[din]}(") == n_wmma
  assert "fmul" not in spec.src and "fadd" not in spec.src  # products and sums happen in the tensor core only
  assert f"v_wmma_f32_16x16x16_{KIND[din]}" in AMDGPUCompiler("gfx1100").assembly(spec.src)
  return spec


@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("M,N,K,cast_first", [(16, 16, 16, False), (32, 16, 48, True), (16, 32, 32, False)])
def test_wmma_matmul_on_the_emulator(din, M, N, K, cast_first):
  spec = compile_tc(matmul(M, N, K, din, cast_first), din)
  assert spec.local_size == (32, 1, 1) and np.prod(spec.global_size) == M * N // 256  # one wave32 per 16x16 tile
  a, b, fa, fb = operands(M, N, K, din, M * 7 + N * 3 + K)
  got = run_on_mock(spec, np.zeros(M * N, np.float32), a, b).reshape(M, N)
  np.testing.assert_allclose(got, fa @ fb, rtol=1e-5, atol=1e-5)  # exact products, float32 sums


@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16])
def test_wmma_low_precision_output_on_the_emulator(din):
  # the epilogue casts each float C element back to the input dtype (half: d16_hi stores; bf16: rounded bits)
  M, N, K = 32, 16, 32
  spec = compile_tc(matmul(M, N, K, din, out=din), din)
  a, b, fa, fb = operands(M, N, K, din, 8)
  raw = run_on_mock(spec, np.zeros(M * N, np.float16 if din == dtypes.float16 else np.uint16), a, b).reshape(M, N)
  got = raw.astype(np.float64) if din == dtypes.float16 else (raw.astype(np.uint32) << 16).view(np.float32)
  ref = fa @ fb
  tol = 2.0 ** -10 if din == dtypes.float16 else 2.0 ** -7  # one rounding to the output's precision
  np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
  # and rounded to nearest: the result is the float32 sum's nearest representable value
  exact = ref.astype(np.float32)
  near = exact.astype(np.float16).astype(np.float64) if din == dtypes.float16 else \
    ((exact.view(np.uint32) + 0x7FFF + ((exact.view(np.uint32) >> 16) & 1)) >> 16 << 16).view(np.float32)
  assert np.mean(got == near) > 0.95  # float32 sums of a different order may tip a few ties


@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16])
def test_wmma_one_buffer_as_both_operands_and_epilogue(din):
  # x @ x + x: the fragments read x (bf16: through its uint16 view) and the epilogue reads it as a value, one argument
  S = 32
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(S * S), arg=0), UOp(Ops.PARAM, din.ptr(S * S), arg=1)
  i, j, k = UOp.range(S, 0), UOp.range(S, 1), UOp.range(S, 2, AxisType.REDUCE)
  red = UOp(Ops.REDUCE, dtypes.float, ((a.index(i * S + k).load() * a.index(k * S + j).load()).cast(dtypes.float), k),
            Ops.ADD)
  ast = c.index(i * S + j).store(red + a.index(i * S + j).load().cast(dtypes.float)).sink(arg=KernelInfo("sq"))
  ren = AMDGPURenderer("gfx1100")
  with Context(SPEC=1): spec = get_program(apply_opts(ast, ren, [TC]), ren)
  assert f"@llvm.amdgcn.wmma.f32.16x16x16.{KIND[din]}(" in spec.src and spec.src.count("ptr addrspace(1) noalias") == 2
  x, _, fx, _ = operands(S, S, S, din, 2)
  got = run_on_mock(spec, np.zeros(S * S, np.float32), x).reshape(S, S)
  np.testing.assert_allclose(got, fx @ fx + fx, rtol=1e-5, atol=1e-5)


def test_wmma_chosen_by_the_heuristic_on_mock_amd():
  # the device's own renderer and the hand-coded heuristic choose TC; a bias after the reduce is added per C element
  M = N = K = 32
  c, a, b, d = (UOp(Ops.PARAM, dtypes.float.ptr(M * N), arg=0), UOp(Ops.PARAM, dtypes.half.ptr(M * K), arg=1),
                UOp(Ops.PARAM, dtypes.half.ptr(K * N), arg=2), UOp(Ops.PARAM, dtypes.float.ptr(N), arg=3))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  red = UOp(Ops.REDUCE, dtypes.float, ((a.index(i * K + k).load() * b.index(k * N + j).load()).cast(dtypes.float), k),
            Ops.ADD)
  ast = c.index(i * N + j).store(red + d.index(j).load()).sink(arg=KernelInfo("mm_bias"))
  dev = Device["MOCK+AMD"]
  with Context(TC=1):
    assert hand_coded_optimizations(Kernel(ast, dev.renderer)).applied_opts == [TC]
    spec = get_program(ast, dev.renderer)
  assert "llvm.amdgcn.wmma.f32.16x16x16.f16" in spec.src
  ha, hb, fa, fb = operands(M, N, K, dtypes.float16, 5)
  bias = np.random.default_rng(6).standard_normal(N).astype(np.float32)
  got = run_on_mock(spec, np.zeros(M * N, np.float32), ha, hb, bias).reshape(M, N)
  np.testing.assert_allclose(got, fa @ fb + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16])
def test_wmma_fragments_come_from_vector_loads_where_contiguous(din):
  # A (M x K) holds each lane's 16 k contiguously: two 8-wide loads per fragment; B (K x N) strides k by N: scalar
  # loads; B read as N x K (a @ b.T) is contiguous too. A read from element 1 on: k = 0 alone, then runs aligned to
  # their width (k 1-2, 3-6, 7-14), then k = 15 alone
  M, N, K = 32, 16, 32
  t = "half" if din == dtypes.float16 else "i16"
  a, b, fa, fb = operands(M, N, K, din, 3)
  for b_t, a_off, n_vec, n_scalar in ((False, 0, 2, 16), (True, 0, 4, 0), (True, 1, 3, 2), (False, 1, 1, 18)):
    spec = compile_tc(matmul(M, N, K, din, b_t=b_t, a_off=a_off), din)
    assert spec.src.count(f"load <8 x {t}>, ptr addrspace(1)") == n_vec, (b_t, a_off)
    assert spec.src.count(f"load {t}, ptr addrspace(1)") == n_scalar, (b_t, a_off)
    if a_off: assert f"load <2 x {t}>, ptr addrspace(1)" in spec.src and f"load <4 x {t}>, ptr addrspace(1)" in spec.src
    ha = np.concatenate([np.zeros(a_off, a.dtype), a.ravel()])
    got = run_on_mock(spec, np.zeros(M * N, np.float32), ha, np.ascontiguousarray(b.T) if b_t else b)
    np.testing.assert_allclose(got.reshape(M, N), fa @ fb, rtol=1e-5, atol=1e-5)


# ***** through tiny-tensor *****
def _new_programs(fn) -> list:
  """ProgramSpecs the tiny-tensor engine compiled while running `fn` (test-only peek at its program cache)."""
  from tiny_tensor import engine
  before = set(engine._program_cache)
  fn()
  return [spec for key, (spec, _) in engine._program_cache.items() if key not in before]


@pytest.mark.parametrize("dt", ["half", "bfloat16"])
def test_tensor_matmul_on_null_amdgpu_uses_wmma(dt):
  tt = pytest.importorskip("tiny_tensor")
  a, b = tt.Tensor.rand(32, 48, device="NULL"), tt.Tensor.rand(48, 16, device="NULL")
  with Context(DEV="NULL:AMDGPU:gfx1100", TC=1):
    specs = _new_programs(lambda: (a.cast(getattr(tt.dtypes, dt)) @ b.cast(getattr(tt.dtypes, dt))).realize())
  kind = KIND[getattr(dtypes, dt)]
  wmma = [s for s in specs if f"@llvm.amdgcn.wmma.f32.16x16x16.{kind}(" in s.src]
  assert len(wmma) == 1, [s.name for s in specs]
  assert wmma[0].lib[:4] == b"\x7fELF" and wmma[0].local_size == (32, 1, 1)
  with Context(DEV="NULL:AMDGPU:gfx1100", TC=0):  # TC=0: the same matmul without tensor cores
    assert not any("wmma" in s.src for s in _new_programs(lambda: (a.cast(getattr(tt.dtypes, dt)) @
                                                                   b.cast(getattr(tt.dtypes, dt)) + 1).realize()))


def test_tensor_half_matmul_on_mock_amd_matches_numpy():
  tt = pytest.importorskip("tiny_tensor")
  a, b, fa, fb = operands(32, 16, 32, dtypes.float16, 9)
  got: list[np.ndarray] = []
  with Context(TC=1):
    ta, tb = tt.Tensor(a, device="MOCK+AMD"), tt.Tensor(b, device="MOCK+AMD")
    specs = _new_programs(lambda: got.append((ta @ tb).float().numpy()))
  assert any("llvm.amdgcn.wmma.f32.16x16x16.f16" in s.src for s in specs), [s.name for s in specs]
  np.testing.assert_allclose(got[0].astype(np.float64), fa @ fb, rtol=1e-3, atol=2e-3)  # the result rounds to half
