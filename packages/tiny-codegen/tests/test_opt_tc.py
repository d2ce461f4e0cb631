"""The TC opt: a half matmul kernel AST mapped onto PTX `mma.sync` (one warp per output tile), checked by the PTX
executor (tiny_runtime_nv.ptx) against numpy, by ptxas where installed, and its illegal uses; and onto RDNA3
wave32 WMMA (layout, IR and assembly here; numbers on the RDNA3 emulator in tiny-runtime-amd)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.compiler.ptx import PTXCompiler, find_ptxas
from tiny_codegen.opt import Kernel, KernelOptError, Opt, OptOps, apply_opts, hand_coded_optimizations
from tiny_codegen.renderer.llvmir import LLVMRenderer
from tiny_codegen.renderer.ptx import PTXRenderer

import tiny_runtime_nv.ptx as ptxi  # the PTX executor of tiny-runtime-nv (a test-only dependency)

TC = Opt(OptOps.TC, 0, -1)


def matmul(M: int, N: int, K: int, din: DType = dtypes.float16, cast_first: bool = False, out: DType = dtypes.float,
           bias: bool = False) -> UOp:
  """c[i*N+j] = REDUCE(CAST(a[i*K+k] * b[k*N+j]), k) as tiny-tensor schedules `a @ b` on half inputs (or with the
  casts on the operands); `out` half casts the result back, `bias` adds d[j] after the reduce."""
  c, a, b = (UOp(Ops.PARAM, out.ptr(M * N), arg=0), UOp(Ops.PARAM, din.ptr(M * K), arg=1),
             UOp(Ops.PARAM, din.ptr(K * N), arg=2))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  x, y = a.index(i * K + k).load(), b.index(k * N + j).load()
  v = x.cast(dtypes.float) * y.cast(dtypes.float) if cast_first else (x * y).cast(dtypes.float)
  val = UOp(Ops.REDUCE, dtypes.float, (v, k), Ops.ADD)
  if bias: val = val + UOp(Ops.PARAM, dtypes.float.ptr(N), arg=3).index(j).load()
  return c.index(i * N + j).store(val.cast(out) if out != dtypes.float else val).sink(arg=KernelInfo(f"mm_{M}_{N}_{K}"))


def run_ptx(ast: UOp, ren: PTXRenderer, M: int, N: int, K: int, out: DType = dtypes.float, bias: bool = False,
            opt: bool = True) -> tuple[str, np.ndarray, np.ndarray]:
  with Context(NOOPT=0 if opt else 1, SPEC=1, TC=1): spec = get_program(ast, ren)
  if find_ptxas() is not None: assert PTXCompiler(ren.arch).compile(spec.src)[:4] == b"\x7fELF"
  rng = np.random.default_rng(M * 7 + N * 3 + K)
  A, B = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
  D = rng.standard_normal(N).astype(np.float32)
  C = np.zeros(M * N, np.float16 if out == dtypes.float16 else np.float32)
  bufs = [C, A.ravel(), B.ravel()] + ([D] if bias else [])
  ptxi.run(spec.src, spec.name, bufs, spec.global_size, spec.local_size, (), list(spec.globals))
  # the scheduler's product is in half (CAST(a*b)): the reference rounds it there too, unless TC's exact products
  prods = A.astype(np.float64)[:, :, None] * B.astype(np.float64)[None, :, :]
  if "mma.sync" not in spec.src: prods = A[:, :, None] * B[None, :, :]  # float16 * float16 rounds to float16
  ref = prods.astype(np.float64).sum(axis=1) + (D if bias else 0)
  return spec.src, C.reshape(M, N), ref


@pytest.mark.parametrize("M,N,K,cast_first", [(16, 8, 16, False), (32, 32, 32, True), (48, 24, 64, False)])
def test_tc_matmul_sm90(M, N, K, cast_first):
  ren = PTXRenderer("sm_90")
  ast = apply_opts(matmul(M, N, K, cast_first=cast_first), ren, [TC])
  src, got, ref = run_ptx(ast, ren, M, N, K)
  assert src.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 1
  assert "fma" not in src and "mul.rn.f" not in src  # the products happen in the tensor core only
  assert "add.rn.f" not in src  # and the sums: the accumulator over the outer k is the mma's C operand
  assert re.search(r"mma\.sync[^;]*\{(%f\d+, ){3}%f\d+\};", src)
  assert "ld.global.v" not in src  # no buffer_align on PTX (a SLICE view may start at any byte): scalar fragment loads
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_tc_matmul_sm75_m16n8k8():
  ren = PTXRenderer("sm_75")
  src, got, ref = run_ptx(apply_opts(matmul(16, 16, 24), ren, [TC]), ren, 16, 16, 24)
  assert "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32" in src
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_tc_epilogue_half_out_and_bias():
  # what follows the reduce (a bias indexed by the N axis, the cast back to half) is computed per C element
  ren = PTXRenderer("sm_80")
  src, got, ref = run_ptx(apply_opts(matmul(32, 16, 32, out=dtypes.float16, bias=True), ren, [TC]), ren, 32, 16, 32,
                          out=dtypes.float16, bias=True)
  assert "mma.sync" in src
  np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-3, atol=2e-3)


def test_heuristic_picks_tc_on_ptx_only():
  with Context(TC=0): assert OptOps.TC not in [o.op for o in hand_coded_optimizations(
    Kernel(matmul(32, 32, 32), PTXRenderer("sm_90"))).applied_opts]
  with Context(TC=1): k = hand_coded_optimizations(Kernel(matmul(32, 32, 32), PTXRenderer("sm_90")))
  assert k.applied_opts == [TC]
  src, got, ref = run_ptx(matmul(32, 32, 32), PTXRenderer("sm_90"), 32, 32, 32, opt=True)
  assert "mma.sync" in src
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  # no tensor cores (sm_70, CPU), or a shape/dtype that doesn't fit: the usual opts, same numbers
  with Context(TC=1):
    for ren in (PTXRenderer("sm_70"), LLVMRenderer()):
      assert OptOps.TC not in [o.op for o in hand_coded_optimizations(Kernel(matmul(32, 32, 32), ren)).applied_opts]
    assert OptOps.TC not in [o.op for o in hand_coded_optimizations(Kernel(matmul(24, 32, 32),
                                                                             PTXRenderer())).applied_opts]
  src, got, ref = run_ptx(matmul(24, 8, 16), PTXRenderer("sm_90"), 24, 8, 16, opt=True)
  assert "mma.sync" not in src
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ast,ren,opts,match", [
  (matmul(24, 8, 16), PTXRenderer("sm_90"), [TC], "M axis 0 of size 24 is not a multiple of 16"),
  (matmul(16, 12, 16), PTXRenderer("sm_90"), [TC], "N axis 1 of size 12 is not a multiple of 8"),
  (matmul(16, 8, 24), PTXRenderer("sm_90"), [TC], "K axis 2 of size 24 is not a multiple of 16"),
  (matmul(16, 8, 16, din=dtypes.float), PTXRenderer("sm_90"), [TC], "inputs float accumulating in float fit none of"),
  (matmul(16, 8, 16), PTXRenderer("sm_70"), [TC], "PTXRenderer has no tensor cores"),
  (matmul(16, 8, 16), LLVMRenderer(), [TC], "LLVMRenderer has no tensor cores"),
  (matmul(16, 8, 16), PTXRenderer("sm_90"), [Opt(OptOps.TC, 0, 7)], "tc_select 7 invalid"),
  (matmul(16, 8, 16), PTXRenderer("sm_90"), [Opt(OptOps.TC, 3, -1)], "axis 3 out of range"),
  (matmul(32, 8, 16), PTXRenderer("sm_90"), [Opt(OptOps.UPCAST, 0, 2), TC], "TC must be the first opt"),
  (matmul(32, 8, 16), PTXRenderer("sm_90"), [TC, Opt(OptOps.UPCAST, 0, 2)], "no opts apply after TC"),
  (matmul(16, 8, 16), PTXRenderer("sm_90"), [Opt(OptOps.NOLOCALS), TC], "TC needs local"),
])
def test_illegal_tc_raises(ast, ren, opts, match):
  with pytest.raises(KernelOptError, match=match): apply_opts(ast, ren, opts)


def test_tc_needs_a_matmul():
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(16), arg=0), UOp(Ops.PARAM, dtypes.float16.ptr(256), arg=1)
  i, k = UOp.range(16, 0), UOp.range(16, 1, AxisType.REDUCE)
  x = a.index(i * 16 + k).load()
  ast = c.index(i).store(UOp(Ops.REDUCE, dtypes.float, ((x * x).cast(dtypes.float), k), Ops.ADD)).sink()
  with pytest.raises(KernelOptError, match="no REDUCE-ADD of a product"): apply_opts(ast, PTXRenderer(), [TC])


@pytest.mark.parametrize("cast_first", [False, True])
def test_tc_bf16_matmul(cast_first):
  # bfloat16 buffers hold the top 16 bits of float32; the fragments reach mma.sync as those bits
  M, N, K = 16, 16, 32
  ren = PTXRenderer("sm_90")
  with Context(SPEC=1): spec = get_program(apply_opts(matmul(M, N, K, din=dtypes.bfloat16, cast_first=cast_first),
                                                      ren, [TC]), ren)
  assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in spec.src
  if find_ptxas() is not None: assert PTXCompiler("sm_90").compile(spec.src)[:4] == b"\x7fELF"
  rng = np.random.default_rng(1)
  A, B = ((rng.standard_normal(s).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) for s in ((M, K), (K, N)))
  C = np.zeros(M * N, np.float32)
  ptxi.run(spec.src, spec.name, [C, A.ravel(), B.ravel()], spec.global_size, spec.local_size, (), list(spec.globals))
  fA, fB = ((x.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for x in (A, B))
  np.testing.assert_allclose(C.reshape(M, N), fA @ fB, rtol=1e-5, atol=1e-5)
  with pytest.raises(KernelOptError, match="fit none of"):  # tc_select 0 is the half tensor core
    apply_opts(matmul(M, N, K, din=dtypes.bfloat16), ren, [Opt(OptOps.TC, 0, 0)])


# ***** AMD RDNA3 wave32 WMMA (numbers checked on the emulator in tiny-runtime-amd's test_amd_wmma.py) *****
def test_rdna3_fragment_layout_covers_each_tile_element():
  # A and B: lanes 0-15 hold each (row, k) / (k, col) exactly once and lanes 16-31 repeat them; C: the 32 lanes x 8
  # elements hold each of the 16x16 outputs exactly once
  from tiny_codegen.opt.kernel import TC_FRAGMENTS
  frag = TC_FRAGMENTS["wmma.16x16x16"]
  lane = UOp.range(32, 9, AxisType.LOCAL)

  def at(kind: str, e: int, ln: int) -> tuple[int, int]:
    return tuple(x if isinstance(x, int) else int(x.substitute({lane: UOp.const(dtypes.int, ln)}).simplify().arg)
                 for x in frag(kind, e, lane))  # type: ignore[return-value]
  for kind in ("a", "b"):
    lo = [at(kind, e, ln) for ln in range(16) for e in range(16)]
    assert sorted(lo) == [(r, c) for r in range(16) for c in range(16)]
    assert [at(kind, e, ln + 16) for ln in range(16) for e in range(16)] == lo
  assert at("a", 5, 3) == (3, 5) and at("b", 5, 3) == (5, 3)  # A row = lane, B column = lane; element = k
  c = [at("c", e, ln) for ln in range(32) for e in range(8)]
  assert sorted(c) == [(r, col) for r in range(16) for col in range(16)]
  assert at("c", 3, 17) == (7, 1)  # D[2*e + lane//16][lane%16]


@pytest.mark.parametrize("din,kind", [(dtypes.float16, "f16"), (dtypes.bfloat16, "bf16")])
def test_tc_amdgpu_wmma_renders_and_compiles(din, kind):
  from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, find_ld_lld
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  ren = AMDGPURenderer("gfx1100")
  M, N, K = 32, 16, 48
  with Context(SPEC=1): spec = get_program(apply_opts(matmul(M, N, K, din=din), ren, [TC]), ren)
  assert spec.src.count(f"call <8 x float> @llvm.amdgcn.wmma.f32.16x16x16.{kind}(") == 1
  assert "fmul" not in spec.src and "fadd" not in spec.src  # products and sums happen in the WMMA only
  # the accumulator (a vector register carried over the outer k loop) is the WMMA's C operand
  wmma = re.search(r"= call <8 x float> @llvm\.amdgcn\.wmma\S+\(.*, <8 x float> (%t\d+)\)", spec.src)
  assert wmma and re.search(rf"{wmma.group(1)} = load <8 x float>, ptr addrspace\(5\)", spec.src)
  assert spec.local_size == (32, 1, 1) and np.prod(spec.global_size) == M * N // 256  # one wave32 per 16x16 tile
  asm = AMDGPUCompiler("gfx1100").assembly(spec.src)
  assert f"v_wmma_f32_16x16x16_{kind}" in asm
  if find_ld_lld() is not None: assert spec.lib[:4] == b"\x7fELF"


def test_tc_amdgpu_archs_and_shape_checks():
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  with pytest.raises(KernelOptError, match="AMDGPURenderer has no tensor cores"):  # RDNA2 has no WMMA
    apply_opts(matmul(16, 16, 16), AMDGPURenderer("gfx1030"), [TC])
  for arch in ("gfx90a", "gfx942"):  # CDNA2/3: MFMA, one wave64 per 16x16 tile
    spec = get_program(apply_opts(matmul(16, 16, 16), AMDGPURenderer(arch), [TC]), AMDGPURenderer(arch))
    assert "@llvm.amdgcn.mfma.f32.16x16x16f16(" in spec.src and spec.local_size == (64, 1, 1)
  with pytest.raises(KernelOptError, match="N axis 1 of size 8 is not a multiple of 16"):
    apply_opts(matmul(16, 8, 16), AMDGPURenderer("gfx1100"), [TC])
  with Context(TC=1):
    assert hand_coded_optimizations(Kernel(matmul(32, 32, 32), AMDGPURenderer("gfx1100"))).applied_opts == [TC]
