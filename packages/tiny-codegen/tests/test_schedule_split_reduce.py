"""A big reduce into a few outputs (`a.sum()` of a big tensor) is scheduled in two stages: per-group partials (run
on the CPU's threads, vector accumulators) then their reduce. Results against numpy, kernel counts, launch sizes.
Cross-package: through tiny-tensor's Tensor (installed with every package in `nox -s tests`)."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import Ops, UOp
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.opt import OptOps, optimize_kernel
from tiny_codegen.schedule import create_schedule
import tiny_codegen.schedule.schedule as S
from tiny_codegen.schedule.schedule import SPLIT_REDUCE_MIN
from tiny_uop.helpers import prod

tt = pytest.importorskip("tiny_tensor")


def _run(shape: tuple[int, ...], op: Ops, axes: tuple[int, ...], data: np.ndarray) -> tuple[np.ndarray, list]:
  x = tt.Tensor(data.reshape(shape))
  out = tt.Tensor(x.uop.r(op, axes))
  sched = create_schedule(UOp.sink(out.uop))
  return out.numpy(), sched.kernels


@pytest.mark.parametrize("op,ref", [(Ops.ADD, np.sum), (Ops.MAX, np.max)])
def test_full_reduce_is_split_in_two_kernels(op: Ops, ref) -> None:
  n = 1 << 20
  data = np.random.default_rng(0).standard_normal(n).astype(np.float32)
  got, kernels = _run((n,), op, (0,), data)
  assert len(kernels) == 2, [k.src[0].arg for k in kernels]
  np.testing.assert_allclose(got.reshape(()), ref(data.astype(np.float64)), rtol=1e-5)
  ren = Device["CPU"].renderer
  part = get_program(kernels[0].src[0], ren)
  assert part.global_size[0] == min(getattr(ren, "threads", 1), 64)  # the groups run on the threads
  if "LLVM" in type(ren).__name__: assert "<16 x float>" in part.src  # one vector of accumulators


def test_trailing_axes_reduce_with_a_few_outputs_is_split() -> None:
  data = np.random.default_rng(1).standard_normal((3, 512, 1024)).astype(np.float32)
  got, kernels = _run(data.shape, Ops.ADD, (1, 2), data)
  assert len(kernels) == 2
  np.testing.assert_allclose(got.reshape(3), data.astype(np.float64).sum((1, 2)), rtol=1e-4)


def test_small_odd_or_leading_reduces_stay_one_kernel() -> None:
  rng = np.random.default_rng(2)
  small = rng.standard_normal(SPLIT_REDUCE_MIN // 2).astype(np.float32)
  got, kernels = _run(small.shape, Ops.ADD, (0,), small)
  assert len(kernels) == 1
  np.testing.assert_allclose(got.reshape(()), small.astype(np.float64).sum(), rtol=1e-4)
  odd = rng.standard_normal(SPLIT_REDUCE_MIN + 1).astype(np.float32)  # not a multiple of the groups' lanes
  got, kernels = _run(odd.shape, Ops.ADD, (0,), odd)
  assert len(kernels) == 1
  np.testing.assert_allclose(got.reshape(()), odd.astype(np.float64).sum(), rtol=1e-4)
  lead = rng.standard_normal((1 << 18, 4)).astype(np.float32)  # reduces a leading axis: left as it is
  got, kernels = _run(lead.shape, Ops.ADD, (0,), lead)
  assert len(kernels) == 1
  np.testing.assert_allclose(got.reshape(4), lead.astype(np.float64).sum(0), rtol=1e-4)


def test_split_sum_of_ints_is_exact() -> None:
  data = np.random.default_rng(3).integers(-1000, 1000, 1 << 19).astype(np.int32)
  got, kernels = _run(data.shape, Ops.ADD, (0,), data)
  assert len(kernels) == 2 and int(got.reshape(())) == int(data.sum())


def test_split_reduce_broadcast_back_and_shared_with_a_later_realize() -> None:
  # a split reduce that is broadcast (softmax over a big vector), and one another lazy tensor still uses after it is
  # realized (it must read the realized value, not sum again)
  data = np.random.default_rng(4).standard_normal(1 << 19).astype(np.float32)
  x = tt.Tensor(data)
  e = (x - x.max()).exp()
  sm = (e / e.sum()).numpy()
  ref = np.exp(data.astype(np.float64) - data.max())
  np.testing.assert_allclose(sm, ref / ref.sum(), rtol=1e-4, atol=1e-10)
  total = x.sum()
  later = total * 2
  np.testing.assert_allclose(total.numpy(), data.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)
  sched = create_schedule(UOp.sink(later.uop))
  assert len(sched.kernels) == 1  # just the multiply: the sum is a buffer now
  np.testing.assert_allclose(later.numpy(), 2 * data.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)


# ***** a streaming reduce (many outputs sharing inputs bigger than L2: a conv's weight gradient) *****


def _conv_weight_grad(shape_x: tuple[int, ...], shape_w: tuple[int, ...], **kw):
  """(x, w, gy, w.grad's schedule kernels, w.grad) for sum(conv2d(x, w, **kw) * gy), w.grad not yet realized."""
  rng = np.random.default_rng(5)
  x = tt.Tensor(xs := rng.standard_normal(shape_x).astype(np.float32))
  w = tt.Tensor(ws := rng.standard_normal(shape_w).astype(np.float32), requires_grad=True)
  out = x.conv2d(w, **kw)
  gy = rng.standard_normal(out.shape).astype(np.float32)
  (out * tt.Tensor(gy)).sum().backward()
  return (xs, ws, gy), create_schedule(UOp.sink(w.grad.uop)).kernels, w.grad


def _torch_weight_grad(xs: np.ndarray, ws: np.ndarray, gy: np.ndarray, **kw) -> np.ndarray:
  import torch  # test-only oracle (a TEST_DEPS package: installed by `nox -s tests`)
  w = torch.tensor(ws, dtype=torch.float64, requires_grad=True)
  (torch.nn.functional.conv2d(torch.tensor(xs, dtype=torch.float64), w, **kw) * torch.tensor(gy, dtype=torch.float64)
   ).sum().backward()
  assert w.grad is not None
  return w.grad.numpy()


def _out_sizes(kernels: list) -> list[int]:
  return [k.src[1].arg for k in kernels]  # each kernel's first buffer is its output


def test_big_conv_weight_gradient_is_split_over_batch_chunks_and_matches_torch() -> None:
  # x 32x16x24x24 (1.18 MB) and the gradient 32x16x20x20 (0.82 MB): 2.0 MB of inputs > CHUNK_BYTES, 16*16*5*5 = 6400
  # outputs, each input element read by 400 of them: two chunks of 16 images (<= 1 MiB each)
  (xs, ws, gy), kernels, grad = _conv_weight_grad((32, 16, 24, 24), (16, 16, 5, 5))
  assert S.CHUNK_BYTES == 1 << 20
  outs = 16 * 16 * 5 * 5
  sizes = _out_sizes(kernels)
  assert 2 * outs in sizes and sizes[-1] == outs, sizes  # the partial sums (2 chunks), then their sum
  assert sizes.index(2 * outs) == len(sizes) - 2
  np.testing.assert_allclose(grad.numpy(), _torch_weight_grad(xs, ws, gy), rtol=1e-4, atol=1e-3)


def test_small_conv_weight_gradient_is_not_split(monkeypatch) -> None:
  # 16x16x8x8 and 16x16x6x6 inputs (102 KB): they fit in L2, one kernel sums the batch and pixels into 2304 outputs
  shapes = (16, 16, 8, 8), (16, 16, 3, 3)
  (xs, ws, gy), kernels, grad = _conv_weight_grad(*shapes)
  assert _out_sizes(kernels) == [16 * 16 * 6 * 6, 2304]  # the gradient channels-last, the weight gradient
  np.testing.assert_allclose(grad.numpy(), _torch_weight_grad(xs, ws, gy), rtol=1e-4, atol=1e-4)
  # with a 64 KB chunk budget: two chunks of 8 images (51 KB each), one kernel more
  monkeypatch.setattr(S, "CHUNK_BYTES", 64 << 10)
  (xs, ws, gy), split, grad = _conv_weight_grad(*shapes)
  assert _out_sizes(split) == [16 * 16 * 6 * 6, 2 * 2304, 2304]
  np.testing.assert_allclose(grad.numpy(), _torch_weight_grad(xs, ws, gy), rtol=1e-4, atol=1e-4)
  # with a 32 KB one it would take 4 chunks, whose partials (37 KB) are more than a quarter of the inputs: no split
  monkeypatch.setattr(S, "CHUNK_BYTES", 32 << 10)
  assert _out_sizes(_conv_weight_grad(*shapes)[1]) == [16 * 16 * 6 * 6, 2304]
  # 4 -> 2 channels 5x5 (200 outputs, under STREAMING_REDUCE_MIN_OUTPUTS): not split with an 8 KB budget, though its
  # 45 KB of inputs are each read by 18+ outputs and 8 chunks' partials would be 6.4 KB
  monkeypatch.setattr(S, "CHUNK_BYTES", 8 << 10)
  assert S.STREAMING_REDUCE_MIN_OUTPUTS == 256
  (xs, ws, gy), few, grad = _conv_weight_grad((16, 4, 12, 12), (2, 4, 5, 5))
  assert _out_sizes(few) == [16 * 2 * 8 * 8, 200]
  np.testing.assert_allclose(grad.numpy(), _torch_weight_grad(xs, ws, gy), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape_x, shape_w, kw", [((1, 512, 7, 7), (512, 512, 3, 3), dict(padding=1)),
                                                  ((1, 256, 14, 14), (512, 256, 3, 3), dict(padding=1, stride=2))])
def test_forward_conv_with_big_weights_is_not_split(shape_x, shape_w, kw) -> None:
  # resnet18's last stage: 9.4 MB (4.7 MB) of weights > CHUNK_BYTES, but each output's reduce is Cin*3*3 (4608, 2304)
  # elements: a block of STREAMING_BLOCK_OUTPUTS outputs streams 590 KB (295 KB), no chunk of it needs L2's help.
  # Split, it was 16 (8) partial 512x7x7 maps summed in a kernel of their own. One conv kernel, against torch
  import torch  # test-only oracle (a TEST_DEPS package)
  rng = np.random.default_rng(11)
  xs, ws = rng.standard_normal(shape_x).astype(np.float32), rng.standard_normal(shape_w).astype(np.float32)
  out = tt.Tensor(xs).conv2d(tt.Tensor(ws), **kw)
  assert prod(shape_w[1:]) * S.STREAMING_BLOCK_OUTPUTS * 4 <= S.CHUNK_BYTES < ws.nbytes
  sizes = _out_sizes(create_schedule(UOp.sink(out.uop)).kernels)
  assert sizes[-1] == prod(out.shape) and all(s in (ws.size, prod(out.shape)) for s in sizes), sizes
  want = torch.nn.functional.conv2d(torch.tensor(xs, dtype=torch.float64), torch.tensor(ws, dtype=torch.float64), **kw)
  np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kw", [dict(padding=2, stride=2), dict(groups=2, dilation=2)])
def test_split_conv_weight_gradient_with_padding_stride_groups_matches_torch(monkeypatch, kw) -> None:
  monkeypatch.setattr(S, "CHUNK_BYTES", 64 << 10)  # ~100 KB of inputs: two chunks
  monkeypatch.setattr(S, "STREAMING_BLOCK_OUTPUTS", 256)  # (its 392-512 element reduce: 32 outputs stream < 64 KB)
  wshape = (16, 16 // kw.get("groups", 1), 3, 3)
  (xs, ws, gy), kernels, grad = _conv_weight_grad((8, 16, 12, 12), wshape, **kw)
  outs = prod(wshape)
  assert _out_sizes(kernels)[-2:] == [2 * outs, outs], _out_sizes(kernels)
  np.testing.assert_allclose(grad.numpy(), _torch_weight_grad(xs, ws, gy, **kw), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape_x, shape_w", [((16, 32, 24, 24), (32, 32, 5, 5)), ((8, 32, 10, 10), (64, 32, 3, 3))])
def test_conv_weight_gradient_keeps_the_fma_units_busy(vector_registers, shape_x, shape_w) -> None:
  # AVX-512's register file: the weight gradient's vector is 16 output channels and its rows a kernel row's taps (5;
  # 3 x 2). Those alone are fewer chains than FMA latency x FMAs a cycle (8): the output channels are widened too
  # (32 -> 32 5x5 of the MNIST step: 25 -> 16 ms of one thread). Results against torch
  from tiny_codegen.machine import machine_of
  from tiny_codegen.opt.heuristic import matvec_accumulators
  vector_registers(32, 64)
  ren = Device["CPU"].renderer
  assert ren.vectorize_upcast, f"the CPU default renderer is expected to be LLVM, got {type(ren).__name__}"
  (xs, ws, gy), kernels, grad = _conv_weight_grad(shape_x, shape_w)
  # the gradient's kernel: the one with the most loop ranges (chunk, co, ci, ky, kx; images, rows, pixels)
  big = max(kernels, key=lambda k: sum(u.op is Ops.RANGE for u in k.src[0].toposort()))
  opts = optimize_kernel(big.src[0], ren).arg.applied_opts
  lanes = prod(o.arg for o in opts if o.op is OptOps.UPCAST)
  assert lanes // 16 >= matvec_accumulators(machine_of(ren)), opts
  np.testing.assert_allclose(grad.numpy(), _torch_weight_grad(xs, ws, gy), rtol=1e-4, atol=1e-3)

def test_conv_backward_kernel_counts() -> None:
  # the whole backward of conv + bias (input, weight and bias gradients): 8 kernels for the small conv (which were 8
  # for both before the split); the big one has one more, the weight gradient's partial sums
  def count(shape_x: tuple[int, ...], c: int) -> tuple[int, list[int]]:
    rng = np.random.default_rng(6)
    x = tt.Tensor(rng.standard_normal(shape_x).astype(np.float32), requires_grad=True)
    w = tt.Tensor(rng.standard_normal((c, shape_x[1], 5, 5)).astype(np.float32), requires_grad=True)
    b = tt.Tensor(rng.standard_normal(c).astype(np.float32), requires_grad=True)
    x.conv2d(w, b).relu().sum().backward()
    ks = create_schedule(UOp.sink(x.grad.uop, w.grad.uop, b.grad.uop)).kernels
    return len(ks), _out_sizes(ks)
  small, _ = count((2, 4, 12, 12), 4)
  big, sizes = count((32, 16, 24, 24), 16)
  assert (small, big) == (8, 9) and 2 * 16 * 16 * 5 * 5 in sizes, (small, big)


def test_linear_layer_of_a_short_prompt_is_not_split() -> None:
  """x @ W.T with 32 rows of x and a 6 MB W: each weight is read by only 32 outputs, so output blocks re-read W a few
  times and a K split (which ran the prefill's linear layers 3x slower) is not made; a long-K matmul whose inputs are
  each read by 64 outputs still is."""
  rng = np.random.default_rng(3)
  x, w = rng.standard_normal((32, 2048)).astype(np.float32), rng.standard_normal((768, 2048)).astype(np.float32)
  out = tt.Tensor(x) @ tt.Tensor(w).T
  # no partial sums: the result, and (where W passes the machine's L2) W packed into register-block panels
  sizes = _out_sizes(create_schedule(UOp.sink(out.uop)).kernels)
  assert sizes[-1] == 32 * 768 and set(sizes[:-1]) <= {768 * 2048} and len(sizes) <= 2, sizes
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-3)
  a, b = rng.standard_normal((64, 32768)).astype(np.float32), rng.standard_normal((32768, 64)).astype(np.float32)
  long_k = tt.Tensor(a) @ tt.Tensor(b)
  assert len(create_schedule(UOp.sink(long_k.uop)).kernels) == 2
  np.testing.assert_allclose(long_k.numpy(), a.astype(np.float64) @ b, rtol=1e-3, atol=1e-2)


def test_sum_over_a_batch_and_a_big_matmul_are_not_split() -> None:
  rng = np.random.default_rng(7)
  # a (256, 4096) sum over its batch: 4 MB of inputs, but each element is read once (no output block re-reads it)
  a = rng.standard_normal((256, 4096)).astype(np.float32)
  got, kernels = _run(a.shape, Ops.ADD, (0,), a)
  assert len(kernels) == 1
  np.testing.assert_allclose(got.reshape(4096), a.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
  # a 512x512 @ 512x512 matmul: 2 MB of inputs, but two chunks' partials (2 MB) would be as big as the inputs
  b, c = tt.Tensor(rng.standard_normal((512, 512)).astype(np.float32)), tt.Tensor(np.ones((512, 512), np.float32))
  # (one reduce kernel: on AVX2 a copy of c into column panels comes first, `gemm_panel`)
  kernels = create_schedule(UOp.sink((b @ c).uop)).kernels
  assert sum(any(u.op is Ops.REDUCE for u in k.toposort()) for k in kernels) == 1, kernels


def test_blocked_split_sum_keeps_its_vector_accumulators() -> None:
  # 2**23 elements: each of the 1024 partial sums adds 8192 rows, 8 blocks of REDUCE_BLOCK; the level above the
  # blocks (8 partials) is a loop around theirs, not unrolled in place of the 16 vector lanes (`_unroll_reduce`)
  n = 1 << 23
  assert n // (S.SPLIT_REDUCE_GROUPS * S.SPLIT_REDUCE_LANES) == 8 * S.REDUCE_BLOCK
  data = np.random.default_rng(8).standard_normal(n).astype(np.float32)
  got, kernels = _run((n,), Ops.ADD, (0,), data)
  assert len(kernels) == 2, [k.src[0].arg for k in kernels]
  np.testing.assert_allclose(got.reshape(()), data.astype(np.float64).sum(), rtol=1e-5, atol=1e-2)
  ren = Device["CPU"].renderer
  if "LLVM" in type(ren).__name__: assert "<16 x float>" in get_program(kernels[0].src[0], ren).src


# ***** a sum over outer and trailing axes into a few outputs (BatchNorm's statistics, a conv bias's gradient) *****


@pytest.mark.parametrize("shape", [(128, 8, 20, 20), (300, 4, 9, 7)])
def test_channel_sum_is_split_into_contiguous_partials(shape: tuple[int, ...]) -> None:
  # a (N, C, H, W) sum over (N, H, W): one partial per (n, c) over its H*W contiguous floats (unrolled lanes), then the
  # N partials of each channel (300: not a multiple of REDUCE_FANIN, a tail block). One kernel before, whose index
  # math gathered every element alone (2-5 GB/s)
  data = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
  n, c = shape[:2]
  assert n * c >= S.REDUCE_SPLIT_OUTPUTS and prod(shape) // c >= S.BLOCKED_SUM_MIN
  got, kernels = _run(shape, Ops.ADD, (0, 2, 3), data)
  sizes = _out_sizes(kernels)
  assert sizes == [n * c, c], sizes
  np.testing.assert_allclose(got.reshape(c), data.astype(np.float64).sum((0, 2, 3)), rtol=1e-4, atol=1e-3)


def test_channel_sum_of_ones_is_exact_and_small_ones_stay_whole() -> None:
  ones = np.ones((128, 8, 20, 20), np.float32)
  got, kernels = _run(ones.shape, Ops.ADD, (0, 2, 3), ones)
  assert len(kernels) == 2 and np.array_equal(got.reshape(8), np.full(8, 128 * 400, np.float32))
  # 64 * 8 = 512 partials: too few for a kernel of their own, left to `_blocked_reduce` (one kernel)
  data = np.random.default_rng(10).standard_normal((64, 8, 20, 20)).astype(np.float32)
  got, kernels = _run(data.shape, Ops.ADD, (0, 2, 3), data)
  assert len(kernels) == 1
  np.testing.assert_allclose(got.reshape(8), data.astype(np.float64).sum((0, 2, 3)), rtol=1e-4, atol=1e-3)
  # 2 trailing elements: the partials would be half the input's bytes (more than 1/PARTIAL_SHARE), left whole
  assert S.PARTIAL_SHARE == 4
  pairs = np.random.default_rng(12).standard_normal((16384, 8, 1, 2)).astype(np.float32)
  got, kernels = _run(pairs.shape, Ops.ADD, (0, 2, 3), pairs)
  assert len(kernels) == 1
  np.testing.assert_allclose(got.reshape(8), pairs.astype(np.float64).sum((0, 2, 3)), rtol=1e-4, atol=1e-3)
  # trailing pixels past REDUCE_BLOCK (40x40 = 1600): one partial would add more than a block, left whole
  big = np.random.default_rng(11).standard_normal((16, 64, 40, 40)).astype(np.float32)
  got, kernels = _run(big.shape, Ops.ADD, (0, 2, 3), big)
  assert len(kernels) == 1
  np.testing.assert_allclose(got.reshape(64), big.astype(np.float64).sum((0, 2, 3)), rtol=1e-4, atol=1e-3)
