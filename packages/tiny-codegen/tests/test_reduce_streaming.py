"""Streaming reduces on the CPU: merged reduce ranges, one accumulator per unrolled lane, every REDUCE unrolled."""
from __future__ import annotations

import numpy as np
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.lower.merge import merge_reduce_ranges
from tiny_codegen.opt import Opt, OptOps, optimize_kernel

from test_opt import conv2d_ast, run


def channel_sum_ast(N: int, C: int, H: int, W: int, row: int | None = None) -> UOp:
  """out[c] = sum_{n, h, w} x[n, c, h, w] of an NCHW tensor (a norm's statistics); `row` (>= W) reads each row of a
  wider buffer (a view whose rows are not contiguous with each other)."""
  row = W if row is None else row
  out, x = UOp(Ops.PARAM, dtypes.float.ptr(C), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(N * C * H * row), arg=1)
  c = UOp.range(C, 0)
  n, h, w = (UOp.range(b, 1 + i, AxisType.REDUCE) for i, b in enumerate((N, H, W)))
  val = x.index(n * (C * H * row) + c * (H * row) + h * row + w).load().reduce(n, h, w, arg=Ops.ADD)
  return out.index(c).store(val).sink(arg=KernelInfo("r_chansum"))


def _reduce_bounds(ast: UOp) -> list[list[int]]:
  return [[int(r.src[0].arg) for r in u.src[1:]] for u in ast.toposort() if u.op is Ops.REDUCE]


def test_channel_sum_ranges_merge_and_unroll_by_16() -> None:
  ast = channel_sum_ast(8, 4, 10, 10)
  assert _reduce_bounds(merge_reduce_ranges(ast)) == [[8, 100]]  # h, w walked as one run of 100; n strided
  ren = Device["CPU"].renderer
  spec = get_program(ast, ren)
  assert (Opt(OptOps.UNROLL, 1, 4) in optimize_kernel(merge_reduce_ranges(ast), ren).arg.applied_opts)  # 100 = 25*4
  data = np.random.default_rng(0).standard_normal((8, 4, 10, 10)).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [data.ravel()], 4), data.astype(np.float64).sum((0, 2, 3)), rtol=1e-5,
                             atol=1e-4)
  assert sum(u.op is Ops.DEFINE_REG for u in spec.uops) == 4  # one accumulator per unrolled lane
  ast = channel_sum_ast(4, 2, 20, 20)  # 400 = 25*16: unrolled by 16 (a 20-wide row alone allowed 4)
  assert Opt(OptOps.UNROLL, 1, 16) in optimize_kernel(merge_reduce_ranges(ast), ren).arg.applied_opts
  data = np.random.default_rng(1).standard_normal((4, 2, 20, 20)).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [data.ravel()], 2), data.astype(np.float64).sum((0, 2, 3)), rtol=1e-5,
                             atol=1e-4)


def test_ranges_that_are_not_one_run_stay() -> None:
  ast = channel_sum_ast(2, 3, 5, 4, row=6)  # rows 6 apart, 4 read: h and w are not one contiguous run
  assert merge_reduce_ranges(ast) is ast
  data = np.random.default_rng(2).standard_normal((2, 3, 5, 6)).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [data.ravel()], 3), data[..., :4].astype(np.float64).sum((0, 2, 3)),
                             rtol=1e-5, atol=1e-4)
  conv = conv2d_ast(1, 4, 3, 8, 8, 3)  # a conv's window (y + ky) * W + x + kx: ci, ky, kx all stay
  assert merge_reduce_ranges(conv) is conv


def test_every_reduce_of_a_kernel_is_unrolled_and_keeps_results() -> None:
  # mean and (two-pass) variance of each row in one kernel: both reduces' axes unrolled, results vs numpy
  R, K = 8, 256
  out, x = UOp(Ops.PARAM, dtypes.float.ptr(R), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(R * K), arg=1)
  i = UOp.range(R, 0)
  k1, k2 = UOp.range(K, 1, AxisType.REDUCE), UOp.range(K, 2, AxisType.REDUCE)
  mean = x.index(i * K + k1).load().reduce(k1, arg=Ops.ADD) * (1 / K)
  d = x.index(i * K + k2).load() - mean
  ast = out.index(i).store((d * d).reduce(k2, arg=Ops.ADD)).sink(arg=KernelInfo("r_var"))
  opts = optimize_kernel(ast, Device["CPU"].renderer).arg.applied_opts
  assert [o.op for o in opts].count(OptOps.UNROLL) == 2, opts
  data = np.random.default_rng(3).standard_normal((R, K)).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [data.ravel()], R), data.astype(np.float64).var(1) * K, rtol=1e-4)


def test_blocked_reduce_keeps_one_accumulator_per_output_lane() -> None:
  # a matmul upcast by 4 with its reduce unrolled by 4: 4 accumulators (one per output lane), not 16
  from test_opt import matmul_ast
  ast = matmul_ast(8, 8, 16, (Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)))
  spec = get_program(ast, Device["CPU"].renderer)
  assert sum(u.op is Ops.DEFINE_REG for u in spec.uops) == 1 and "<4 x float>" in spec.src
  rng = np.random.default_rng(4)
  a, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [a.ravel(), b.ravel()], 64).reshape(8, 8), a @ b, rtol=1e-4, atol=1e-4)
