"""The PTX executor's compiled blocks (ptx/blocks.py: straight runs of instructions as one generated function each)
against the instruction closures they stand for (`executor.BLOCKS = False`): kernels PTXRenderer emits (float, int,
half, double and conversion ops with special values, reductions through shared memory, a matmul, partial blocks) run
both ways and must leave bit-identical buffers."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_codegen import get_program
from tiny_codegen.opt import Kernel, hand_coded_optimizations
from tiny_codegen.renderer.ptx import PTXRenderer
from tiny_runtime_nv.ptx import executor, run
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.uop import AxisType

NP = {dtypes.float: np.float32, dtypes.int: np.int32, dtypes.uint32: np.uint32, dtypes.half: np.float16,
      dtypes.double: np.float64, dtypes.int64: np.int64}


def _elementwise(name, fn, dt, n=300, dout=None):
  dout = dout or dt
  c, a, b = UOp(Ops.PARAM, dout.ptr(n), arg=0), UOp(Ops.PARAM, dt.ptr(n), arg=1), UOp(Ops.PARAM, dt.ptr(n), arg=2)
  i = UOp.range(n, 0)
  return name, c.index(i).store(fn(a.index(i).load(), b.index(i).load())).sink(arg=KernelInfo(name)), dt, dout, n


def _reduce(name, op, n):
  c, a, _ = (UOp(Ops.PARAM, dtypes.float.ptr(1 if i == 0 else n), arg=i) for i in range(3))
  k = UOp.range(n, 0, AxisType.REDUCE)
  val = UOp(Ops.REDUCE, dtypes.float, (a.index(k).load(), k), op)
  return name, c.index(UOp.const(dtypes.int, 0)).store(val).sink(arg=KernelInfo(name)), dtypes.float, dtypes.float, n


def _matmul(n=16):
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n * n), arg=i) for i in range(3))
  i, j, k = UOp.range(n, 0), UOp.range(n, 1), UOp.range(n, 2, AxisType.REDUCE)
  val = UOp(Ops.REDUCE, dtypes.float, (a.index(i * n + k).load() * b.index(k * n + j).load(), k), Ops.ADD)
  return "matmul", c.index(i * n + j).store(val).sink(arg=KernelInfo("mm")), dtypes.float, dtypes.float, n * n


CASES = [
  _elementwise("float_ops", lambda a, b: (a * b + a) / (b - 1.5) - a.maximum(b), dtypes.float),
  _elementwise("where_exp2", lambda a, b: (a < b).where(a.exp2(), b.sqrt()), dtypes.float),
  _elementwise("int_ops", lambda a, b: (a * b) // (b + 3) + (a % 7) - (a ^ b), dtypes.int),
  _elementwise("shifts", lambda a, b: (a << 3) + (b >> 2) + (a & b | 5), dtypes.uint32),
  _elementwise("int64", lambda a, b: a * b - (a >> 3), dtypes.int64),
  _elementwise("half", lambda a, b: a * b + a.maximum(b), dtypes.half),
  _elementwise("double", lambda a, b: a / b + a * b, dtypes.double),
  _elementwise("casts", lambda a, b: (a.cast(dtypes.int) + b.cast(dtypes.int)).cast(dtypes.float), dtypes.float),
  _elementwise("to_half", lambda a, b: (a + b).cast(dtypes.half), dtypes.float, dout=dtypes.half),
  _reduce("sum", Ops.ADD, 4096), _reduce("max_odd", Ops.MAX, 777), _matmul(),
]


def _inputs(dt, n: int, rng: np.random.Generator) -> list[np.ndarray]:
  npdt, out = NP[dt], []
  for _ in range(2):
    if npdt in (np.int32, np.uint32, np.int64):
      x = rng.integers(-1000 if npdt is not np.uint32 else 0, 1000, n).astype(npdt)
    else:
      x = (rng.standard_normal(n) * 3).astype(npdt)
      x[rng.integers(0, n, 8)] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 65504, -3.5], npdt)
    out.append(x)
  return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_blocks_match_the_instruction_closures(case, monkeypatch):
  name, ast, dt, dout, n = case
  ren = PTXRenderer("sm_90")
  spec = get_program(hand_coded_optimizations(Kernel(ast, ren)).get_optimized_ast(), ren)
  outs = []
  for blocks in (True, False):
    monkeypatch.setattr(executor, "BLOCKS", blocks)
    executor._CACHE.clear()  # compile again: blocks are built per kernel
    x, y = _inputs(dt, n, np.random.default_rng(3))
    c = np.zeros(1 if name in ("sum", "max_odd") else n, NP[dout])
    bufs = {0: c, 1: x, 2: y}
    with np.errstate(all="ignore"):
      k = run(spec.src, spec.name, [bufs[g] for g in spec.globals], spec.global_size, spec.local_size)
    assert bool(k.__dict__.get("blocks")) == blocks  # the first run went through compiled blocks, the second not
    outs.append(c)
  assert np.count_nonzero(outs[1].view(np.uint8)), f"{name}: the kernel wrote nothing"
  np.testing.assert_array_equal(outs[0].view(np.uint8), outs[1].view(np.uint8), err_msg=name)
