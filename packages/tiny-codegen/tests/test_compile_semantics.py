"""Compiled kernels agree with the reference ALU semantics (tiny_uop.alu.exec_alu) on the edge cases hardware and C
leave undefined or define differently: integer division by 0 and -1, shift counts, float max with NaN and signed
zeros, float CDIV/CMOD, bool arithmetic."""
from __future__ import annotations

import math

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.alu import exec_alu
from tiny_uop.dtype import to_numpy

from tiny_codegen import get_program
from tiny_codegen.renderer.cstyle import ClangRenderer
from tiny_codegen.renderer.llvmir import LLVMRenderer

import kernel_runner as kr

RENDERERS = [pytest.param(LLVMRenderer, id="llvm"),
             pytest.param(ClangRenderer, id="clang")]

I32 = [0, 1, -1, 7, -7, 2**31 - 1, -2**31, 3, -3, 100]
CASES = [
  (Ops.CDIV, dtypes.int32, I32), (Ops.CMOD, dtypes.int32, I32),
  (Ops.CDIV, dtypes.uint32, [0, 1, 7, 2**32 - 1, 3, 2**31]), (Ops.CMOD, dtypes.uint32, [0, 1, 7, 2**32 - 1, 3, 2**31]),
  (Ops.CDIV, dtypes.int8, [0, 1, -1, -128, 127, 5, -5]),
  (Ops.SHL, dtypes.int32, [0, 1, 5, 31, 32, 33, 40, -1]), (Ops.SHR, dtypes.int32, [0, 1, 5, 31, 32, 33, -8, -1]),
  (Ops.SHR, dtypes.uint32, [0, 1, 5, 31, 32, 33, 2**32 - 1]),
  (Ops.MAX, dtypes.float32, [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf]),
  (Ops.MAX, dtypes.float64, [0.0, -0.0, 2.5, math.nan, -math.inf]),
  (Ops.CMOD, dtypes.float32, [5.5, -5.5, 2.0, -2.0, 0.75, 1e30, 3.0]),
  (Ops.CDIV, dtypes.float32, [5.5, -5.5, 2.0, -2.0, 0.75, 7.0, 3.0]),
  (Ops.POW, dtypes.int32, [0, 1, -1, 2, -2, 3, 10, 31, -5, 40]), (Ops.POW, dtypes.uint8, [0, 1, 2, 3, 7, 255]),
  (Ops.SUB, dtypes.bool, [False, True]), (Ops.ADD, dtypes.bool, [False, True]), (Ops.MAX, dtypes.bool, [False, True]),
]


def same(a, b) -> bool:
  if isinstance(b, float) and math.isnan(b): return math.isnan(a)
  if isinstance(b, float): return a == b and math.copysign(1, a) == math.copysign(1, b)
  return a == b


@pytest.mark.parametrize("R", RENDERERS)
@pytest.mark.parametrize("op,dt,vals", CASES, ids=[f"{o.name}-{d.name}" for o, d, _ in CASES])
def test_matches_reference(R, op, dt, vals):
  xs = [a for a in vals for _ in vals]
  ys = [b for _ in vals for b in vals]
  n = len(xs)
  c, a, b = (UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(3))
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load().alu(op, b.index(i).load())).sink(arg=KernelInfo())
  r = R()
  r.threads = 1
  with Context(NOOPT=1): spec = get_program(ast, r)
  npdt = to_numpy(dt)
  X, Y, C = np.array(xs, dtype=npdt), np.array(ys, dtype=npdt), np.zeros(n, npdt)
  kr.run(spec, [C, X, Y])
  for x, y, got in zip(X.tolist(), Y.tolist(), C.tolist()):  # operands as the dtype holds them
    ref = exec_alu(op, dt, (x, y))
    assert same(got, ref), f"{op.name}({x!r}, {y!r}) in {dt}: got {got!r}, reference {ref!r}"


FLOAT_TO_INT = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64]


@pytest.mark.parametrize("R", RENDERERS)
@pytest.mark.parametrize("dt", FLOAT_TO_INT, ids=[d.name for d in FLOAT_TO_INT])
def test_float_to_int_casts_wrap_like_reference(R, dt):
  xs = [0.0, -0.5, 1.9, -1.9, 127.5, 200.0, 300.0, -300.0, 65535.0, 70000.7, -70000.7, 3e9, -3e9]
  n = len(xs)
  c, a = UOp(Ops.PARAM, dt.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=1)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load().cast(dt)).sink(arg=KernelInfo())
  r = R()
  r.threads = 1
  with Context(NOOPT=1): spec = get_program(ast, r)
  X, C = np.array(xs, np.float32), np.zeros(n, to_numpy(dt))
  kr.run(spec, [C, X])
  for x, got in zip(X.tolist(), C.tolist()):
    if dt == dtypes.int64 or abs(x) < 2**31: assert got == exec_alu(Ops.CAST, dt, (x,), dtypes.float32), (x, got)


MAX_VALS = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 2.5, -2.5, 1e-40]


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("lanes", [4, 8, 14, 16])
def test_vector_max_matches_reference(dt, lanes):
  # a float MAX of `lanes`-wide vectors (UPCAST): on an x86-64 target with AVX512DQ one `vrange` (`range_widths`,
  # the vector widened to the form's lanes) plus the NaN select after it, else `llvm.maximum`; every pair of NaN,
  # +-0, +-inf and a denormal against the reference, the pairs in every lane position
  from tiny_codegen.opt.kernel import Opt, OptOps
  from tiny_codegen.renderer.llvmir import range_lanes, range_widths
  pairs = [(x, y) for x in MAX_VALS for y in MAX_VALS]
  n = lanes * len(pairs)
  xs = [p[0] for k in range(lanes) for p in pairs[k:] + pairs[:k]]  # each pair once in each lane
  ys = [p[1] for k in range(lanes) for p in pairs[k:] + pairs[:k]]
  c, a, b = (UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(3))
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load().maximum(b.index(i).load())).sink(
    arg=KernelInfo(f"vmax_{lanes}", opts_to_apply=(Opt(OptOps.UPCAST, 0, lanes),)))
  r = LLVMRenderer()
  r.threads = 1
  spec = get_program(ast, r)
  vrange = bool(range_lanes(range_widths(r.compiler.triple, r.compiler.features), dt.vec(lanes)))
  assert ("llvm.x86.avx512.mask.range" in spec.src) == vrange and ("llvm.maximum" in spec.src) != vrange, spec.src
  npdt = to_numpy(dt)
  X, Y, C = np.array(xs, dtype=npdt), np.array(ys, dtype=npdt), np.zeros(n, npdt)
  kr.run(spec, [C, X, Y])
  for x, y, got in zip(X.tolist(), Y.tolist(), C.tolist()):
    ref = exec_alu(Ops.MAX, dt, (x, y))
    assert same(got, ref), f"MAX({x!r}, {y!r}) in {dt} x{lanes}: got {got!r}, reference {ref!r}"


def test_range_widths_and_lanes():
  # the vrange forms by target: AVX512DQ gives the 512-bit one, with AVX512VL the 128/256-bit ones too; none off
  # x86-64 or without DQ. Lanes: the narrowest form holding the vector; 0 for scalars and wider vectors
  from tiny_codegen.renderer.llvmir import range_lanes, range_widths
  assert range_widths("x86_64-unknown-linux-gnu", "+avx512f,+avx512dq,+avx512vl") == (128, 256, 512)
  assert range_widths("x86_64-unknown-linux-gnu", "+avx512f,+avx512dq,-avx512vl") == (512,)
  assert range_widths("x86_64-unknown-linux-gnu", "+avx512f,-avx512dq,+avx512vl") == ()
  assert range_widths("aarch64-unknown-linux-gnu", "+avx512dq,+avx512vl") == ()
  w = (128, 256, 512)
  assert [range_lanes(w, dtypes.float32.vec(c)) for c in (2, 4, 5, 8, 14, 16, 32)] == [4, 4, 8, 8, 16, 16, 0]
  assert [range_lanes(w, dtypes.float64.vec(c)) for c in (2, 3, 8, 16)] == [2, 4, 8, 0]
  assert range_lanes(w, dtypes.float32) == 0 and range_lanes(w, dtypes.float16.vec(8)) == 0
  assert range_lanes((512,), dtypes.float32.vec(4)) == 16 and range_lanes((), dtypes.float32.vec(16)) == 0


ODD_DTYPES = [dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.int8]


@pytest.mark.parametrize("dt", ODD_DTYPES, ids=[d.name for d in ODD_DTYPES])
@pytest.mark.parametrize("lanes", [5, 6, 7, 12, 14, 16])
def test_odd_lane_vectors_one_masked_access(dt, lanes):
  # a vector load and store of `lanes` elements (UPCAST): where the target masks 4- and 8-byte lanes in one
  # instruction (`masked_widths`: AVX-512F) and the count is not a power of two, one `llvm.masked.load`/`store` of the
  # next form's lanes under a constant mask of the first `lanes` (`odd_lanes`), else plain; the values against
  # numpy, and the elements past the kernel's last vector (a sentinel) never written
  from tiny_codegen.opt.kernel import Opt, OptOps
  from tiny_codegen.renderer.llvmir import masked_widths, odd_lanes
  n = lanes * 5
  c, a, b = (UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(3))
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load() * b.index(i).load() + a.index(i).load()).sink(
    arg=KernelInfo(f"odd_{dt.name}_{lanes}", opts_to_apply=(Opt(OptOps.UPCAST, 0, lanes),)))
  r = LLVMRenderer()
  r.threads = 1
  spec = get_program(ast, r)
  w = odd_lanes(masked_widths(r.compiler.triple, r.compiler.features), dt.vec(lanes))
  mask = "<" + ", ".join(["i1 true"] * lanes + ["i1 false"] * (w - lanes)) + ">"
  assert (f"<{w} x i1> {mask}" in spec.src) == bool(w), spec.src
  avx512 = "+avx512f" in r.compiler.features.split(",") and r.compiler.triple.startswith("x86_64")
  assert bool(w) == (dt.itemsize in (4, 8) and lanes & (lanes - 1) != 0 and lanes * dt.itemsize < 64 and avx512)
  if w: assert spec.src.count("= call") == 2 and spec.src.count("call void @llvm.masked.store") == 1, spec.src
  npdt, rng = to_numpy(dt), np.random.default_rng(lanes)
  X, Y = (rng.integers(-9, 9, n).astype(npdt) for _ in range(2))
  C = np.full(n + 16, 77, npdt)  # the kernel's buffer is the first n; the 16 after them must stay as they are
  kr.run(spec, [C, X, Y])
  np.testing.assert_array_equal(C[:n], X * Y + X)
  np.testing.assert_array_equal(C[n:], np.full(16, 77, npdt))


def test_masked_widths_and_odd_lanes():
  # masked forms by target: AVX512F the 512-bit one, with AVX512VL the 128/256-bit ones; none off x86-64 or without
  # AVX512F. Lanes: the narrowest form holding a vector of 3+ lanes, not a power of two, of 4- or 8-byte elements
  from tiny_codegen.renderer.llvmir import masked_widths, odd_lanes
  assert masked_widths("x86_64-unknown-linux-gnu", "+avx512f,+avx512vl") == (128, 256, 512)
  assert masked_widths("x86_64-unknown-linux-gnu", "+avx512f,-avx512vl") == (512,)
  assert masked_widths("x86_64-unknown-linux-gnu", "+avx2,-avx512f") == ()
  assert masked_widths("aarch64-unknown-linux-gnu", "+avx512f") == ()
  w = (128, 256, 512)
  assert [odd_lanes(w, dtypes.float32.vec(c)) for c in (2, 3, 4, 5, 7, 8, 12, 14, 16, 28)] == [0, 4, 0, 8, 8, 0, 16,
                                                                                                16, 0, 0]
  assert [odd_lanes(w, dtypes.float64.vec(c)) for c in (3, 6, 7, 14)] == [4, 8, 8, 0]
  assert odd_lanes(w, dtypes.float32) == 0 and odd_lanes(w, dtypes.float16.vec(14)) == 0
  assert odd_lanes(w, dtypes.bool.vec(14)) == 0 and odd_lanes((512,), dtypes.float32.vec(7)) == 16
  assert odd_lanes((), dtypes.float32.vec(14)) == 0
