"""GPU kernels agree with the reference ALU semantics (tiny_uop.alu.exec_alu) on the edge cases hardware defines
differently: integer division by 0 and -1, shift counts, float MAX with NaN and signed zeros, float CMOD, bool SUB,
float -> int casts out of range. PTX runs in the PTX interpreter, OpenCL on PoCL."""
from __future__ import annotations

import math

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.alu import exec_alu
from tiny_uop.dtype import float_to_int, to_numpy

from tiny_codegen import get_program
from tiny_codegen.renderer.opencl import OpenCLHalfStorageRenderer, OpenCLRenderer
from tiny_codegen.renderer.ptx import PTXRenderer


import gpu_cl_runner as clr
import tiny_runtime_nv.ptx as ptxi  # the PTX executor of tiny-runtime-nv (a test-only dependency)
_why = clr.available()  # type: ignore[attr-defined]
TARGETS = pytest.mark.parametrize("target", [pytest.param("opencl", marks=pytest.mark.skipif(_why is not None,
                                                                                           reason=_why or "")), "ptx"])
I32 = [0, 1, -1, 7, -7, 2**31 - 1, -2**31, 3, -3, 100]
CASES = [
  (Ops.CDIV, dtypes.int32, I32), (Ops.CMOD, dtypes.int32, I32),
  (Ops.CDIV, dtypes.uint32, [0, 1, 7, 2**32 - 1, 3, 2**31]), (Ops.CDIV, dtypes.int8, [0, 1, -1, -128, 127, 5, -5]),
  (Ops.SHL, dtypes.int32, [0, 1, 5, 31, 32, 33, 40, -1]), (Ops.SHR, dtypes.int32, [0, 1, 5, 31, 32, 33, -8, -1]),
  (Ops.SHR, dtypes.uint32, [0, 1, 5, 31, 32, 33, 2**32 - 1]),
  (Ops.MAX, dtypes.float32, [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf]),
  (Ops.MAX, dtypes.float64, [0.0, -0.0, 2.5, math.nan, -math.inf]),
  (Ops.MAX, dtypes.float16, [0.0, -0.0, 1.5, math.nan, -math.inf]),
  (Ops.CMOD, dtypes.float32, [5.5, -5.5, 2.0, -2.0, 0.75, 1000.0, 3.0]),
  (Ops.CMOD, dtypes.float64, [5.5, -5.5, 2.0, -0.75, 1e6, 3.0]),
  (Ops.SUB, dtypes.bool, [False, True]), (Ops.ADD, dtypes.bool, [False, True]), (Ops.MAX, dtypes.bool, [False, True]),
]


def same(a, b) -> bool:
  if isinstance(b, float) and math.isnan(b): return math.isnan(a)
  if isinstance(b, float): return a == b and math.copysign(1, a) == math.copysign(1, b)
  return a == b


def _cl_renderer() -> OpenCLRenderer:
  # a device without cl_khr_fp16 (PoCL) gets half as storage only, math in float rounded to half (as the CL device)
  return OpenCLRenderer() if "cl_khr_fp16" in clr.extensions() else OpenCLHalfStorageRenderer()  # type: ignore


def run(target: str, ast: UOp, bufs: list[np.ndarray]) -> None:
  with Context(NOOPT=1): spec = get_program(ast, _cl_renderer() if target == "opencl" else PTXRenderer("sm_90"))
  if target == "opencl": clr.run(spec, bufs)  # type: ignore[attr-defined]
  else: ptxi.run(spec.src, spec.name, bufs, spec.global_size, spec.local_size, (), list(spec.globals))  # type: ignore


@TARGETS
@pytest.mark.parametrize("op,dt,vals", CASES, ids=[f"{o.name}-{d.name}" for o, d, _ in CASES])
def test_alu_matches_reference(target, op, dt, vals):
  xs, ys = [a for a in vals for _ in vals], [b for _ in vals for b in vals]
  n = len(xs)
  c, a, b = (UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(3))
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load().alu(op, b.index(i).load())).sink(arg=KernelInfo())
  npdt = to_numpy(dt)
  X, Y, C = np.array(xs, dtype=npdt), np.array(ys, dtype=npdt), np.zeros(n, npdt)
  run(target, ast, [C, X, Y])
  for x, y, got in zip(X.tolist(), Y.tolist(), C.tolist()):
    ref = exec_alu(op, dt, (x, y))
    assert same(got, ref), f"{op.name}({x!r}, {y!r}) in {dt}: got {got!r}, reference {ref!r}"


FLOATS = [0.0, -0.5, 1.9, -1.9, 127.7, 128.0, -129.0, 300.0, 65535.9, 2.0**31, -2.0**31, 3e9, 1e10, -1e10, 1e19,
          math.inf, -math.inf, math.nan]


@TARGETS
@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
                                dtypes.int64, dtypes.uint64], ids=lambda d: d.name)
def test_float_to_int_casts_match_reference(target, dt):
  n = len(FLOATS)
  c, a = UOp(Ops.PARAM, dt.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(n), arg=1)
  i = UOp.range(n, 0)
  ast = c.index(i).store(a.index(i).load().cast(dt)).sink(arg=KernelInfo())
  X, C = np.array(FLOATS, np.float32), np.zeros(n, to_numpy(dt))
  run(target, ast, [C, X])
  for x, got in zip(X.tolist(), C.tolist()): assert got == float_to_int(x, dt), f"{x!r} -> {dt}: got {got}"


@TARGETS
def test_bitcast_between_8_bit_ints_reextends(target):
  # int8 <-> uint8 keep the byte; widening afterwards must see the new signedness (PTX keeps 8-bit values extended in
  # 16-bit registers, and has no mov.b8)
  vals = [0, 1, 127, -128, -1, -77]
  n = len(vals)
  c, d, a = UOp(Ops.PARAM, dtypes.uint32.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.int32.ptr(n), arg=1), \
    UOp(Ops.PARAM, dtypes.int8.ptr(n), arg=2)
  i = UOp.range(n, 0)
  u8 = a.index(i).load().bitcast(dtypes.uint8)
  ast = UOp.sink(c.index(i).store(u8.cast(dtypes.uint32)),
                 d.index(i).store(u8.bitcast(dtypes.int8).cast(dtypes.int32)), arg=KernelInfo())
  A = np.array(vals, np.int8)
  C, D = np.zeros(n, np.uint32), np.zeros(n, np.int32)
  run(target, ast, [C, D, A])
  assert C.tolist() == A.view(np.uint8).astype(np.uint32).tolist() and D.tolist() == vals
