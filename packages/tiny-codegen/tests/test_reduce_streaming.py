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


def padded_conv1d_ast(O: int, H: int, K: int, P: int, plus: bool = False) -> UOp:
  """out[y] = sum_k pad(x, P)[y + k] * w[k] with x of H elements (the pad a gated load, as the scheduler writes it);
  `plus`: the terms are pad(x)[y + k] + w[k] instead (not zero in the padding)."""
  out, x, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((O, H, K)))
  y, k = UOp.range(O, 0), UOp.range(K, 1, AxisType.REDUCE)
  valid = ((P - 1) < (y + k)) & ((y + k) < (P + H))
  xv = valid.where(x.index(y + k - P, valid).load(), UOp.const(dtypes.float, 0.0))
  term = xv + w.index(k).load() if plus else xv * w.index(k).load()
  return out.index(y).store(term.reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo("r_padconv", opts_to_apply=()))


def _ref_conv1d(x: np.ndarray, w: np.ndarray, P: int, plus: bool = False) -> np.ndarray:
  xp = np.pad(x.astype(np.float64), P)
  O = len(xp) - len(w) + 1
  return np.array([sum((xp[y + k] + w[k]) if plus else xp[y + k] * w[k] for k in range(len(w))) for y in range(O)])


def test_padding_is_skipped_by_loop_bounds() -> None:
  from tiny_codegen.lower import lower
  ren = Device["CPU"].renderer
  rng = np.random.default_rng(6)
  for H, K, P in ((12, 5, 4), (3, 5, 4), (8, 3, 2)):  # a map narrower than the filter too: some loops are empty
    ast = padded_conv1d_ast(H + 2 * P - K + 1, H, K, P)
    uops = lower(ast, ren).uops
    loops = [u for u in uops if u.op is Ops.RANGE and u.arg[1] is AxisType.REDUCE]
    assert len(loops) == 1 and loops[0].src[0].op is not Ops.CONST  # the filter loop narrowed per output
    assert not any(u.op is Ops.INDEX and len(u.src) > 2 for u in uops)  # and its loads no longer gated
    x, w = rng.standard_normal(H).astype(np.float32), rng.standard_normal(K).astype(np.float32)
    np.testing.assert_allclose(run(ast, "CPU", [x, w], H + 2 * P - K + 1), _ref_conv1d(x, w, P), rtol=1e-5, atol=1e-5)
    # on the PYTHON device (the IR's reference interpreter) too
    np.testing.assert_allclose(run(ast, "PYTHON", [x, w], H + 2 * P - K + 1), _ref_conv1d(x, w, P), rtol=1e-5,
                               atol=1e-5)


def test_terms_not_zero_in_the_padding_keep_their_loop() -> None:
  from tiny_codegen.lower import lower
  ast = padded_conv1d_ast(16, 12, 5, 4, plus=True)  # pad(x)[y+k] + w[k]: w is summed over the padding too
  uops = lower(ast, Device["CPU"].renderer).uops
  assert all(u.src[0].op is Ops.CONST for u in uops if u.op is Ops.RANGE)
  rng = np.random.default_rng(7)
  x, w = rng.standard_normal(12).astype(np.float32), rng.standard_normal(5).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [x, w], 16), _ref_conv1d(x, w, 4, plus=True), rtol=1e-5, atol=1e-5)


def test_narrowed_loop_whose_body_ignores_the_output_index() -> None:
  # cumsum as a padded window sum: out[i, j] = sum_k pad(x)[i, j + k - 49] over k < 50; narrowed to k >= 49 - j, the
  # body reads x[i, k'] (no j) while the bound still uses j: the loop and its accumulator stay inside j's loop
  out, x = UOp(Ops.PARAM, dtypes.float.ptr(200), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(200), arg=1)
  i, j, k = UOp.range(4, 0), UOp.range(50, 1), UOp.range(50, 2, AxisType.REDUCE)
  valid = UOp.const(dtypes.index, 48) < (j + k)
  v = valid.where(x.index(i * 50 + j + k - 49, valid).load(), UOp.const(dtypes.float, 0.0))
  ast = out.index(i * 50 + j).store(v.reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo("r_cumsum", opts_to_apply=()))
  data = np.random.default_rng(8).standard_normal((4, 50)).astype(np.float32)
  for dev in ("CPU", "PYTHON"):
    np.testing.assert_allclose(run(ast, dev, [data.ravel()], 200).reshape(4, 50), np.cumsum(data, 1), rtol=1e-4,
                               atol=1e-4)


def test_threaded_channel_sum_keeps_vector_loads() -> None:
  # split across 2 threads, the index is core_id*16*400 + c*400 + n*... + lane: LLVM must know core_id's range to
  # prove the 16 unrolled lanes contiguous (else it gathers them: ~10x slower); results vs numpy, both threads run
  import kernel_runner as kr
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  ast = channel_sum_ast(16, 32, 20, 20)
  ren = LLVMRenderer()
  ren.threads, ren.thread_min_work = 2, 0
  spec = get_program(ast, ren)
  assert spec.global_size[0] == 2 and "i32 range(i32 0, 2) %core_id" in spec.src
  ir = ren.make_compiler().optimized_ir(spec.src)
  assert "masked.gather" not in ir and "load <16 x float>" in ir
  data = np.random.default_rng(5).standard_normal((16, 32, 20, 20)).astype(np.float32)
  out = np.zeros(32, np.float32)
  kr.run(spec, [out, data.ravel()], threaded=True)
  np.testing.assert_allclose(out, data.astype(np.float64).sum((0, 2, 3)), rtol=1e-5, atol=1e-3)
  one = LLVMRenderer()
  one.threads = 1
  assert "range(" not in get_program(ast, one).src.split("\n", 1)[0]  # one thread: core_id is always 0, no attribute


def test_conv_with_exp2_epilogue_runs_its_reduce_once_as_vectors() -> None:
  # a conv whose output goes through exp2 (a sigmoid's or SiLU's): exp2's int32 exponent bits (`cast(int32) << 23`)
  # are vector data, not index math; gathered lane by lane they copied the conv's whole REDUCE per lane (scalar
  # accumulators next to the vector ones: the conv ran twice, a 1x1 conv + sigmoid 17x slower than + relu)
  base = conv2d_ast(1, 16, 8, 6, 6, 3, channels_last=True)
  st = base.src[0]
  ast = st.src[0].store(st.src[1].exp2()).sink(arg=KernelInfo())
  spec = get_program(ast, Device["CPU"].renderer)
  regs = [u for u in spec.uops if u.op is Ops.DEFINE_REG]
  assert regs and all(u.dtype.base.count > 1 for u in regs), [str(u.dtype) for u in regs]
  rng = np.random.default_rng(5)
  x, w = rng.standard_normal((1, 8, 6, 6)).astype(np.float32), rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
  import torch
  want = torch.exp2(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w))).numpy()
  got = run(ast, "CPU", [x.ravel(), w.transpose(1, 2, 3, 0).ravel()], want.size).reshape(want.shape)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
