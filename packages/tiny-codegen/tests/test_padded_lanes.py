"""Upcast lanes that are padding: their gated values (0/0 = NaN before the gate) must never reach the result.

Issue #38: the gradient of a 1-pixel-wide padded max-pool (`where(valid, (x == max) / count * grad, 0)` summed over
the window), upcast 4 wide with its window unrolled, came out NaN on the CPU's LLVM kernels on AVX-512 hosts. LLVM
22's x86 backend takes lanes of `(uitofp <N x i1> b) / d` whose bool is known false to be 0 (they are 0/0 = NaN) and
so drops the constant part of the `select` mask that was to zero them: the NaN leaks. The LLVM renderer now writes
bool -> float as a select, and an int vector -> float (`sitofp`, the same bug through an int load) through
`llvm.arithmetic.fence`, which the backend reads correctly.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.opt import Opt, OptOps

# the kernel the gradient fuzzer found (3 channels; a 5x5-strided view of the padded 2x2 conv output, 3x3 window)
C, OUT = 3, 48
OPTS = (Opt(OptOps.UPCAST, 2, 4), Opt(OptOps.UNROLL, 1, 0))  # what the heuristics chose: the failing pair


def window_gates() -> tuple[tuple[UOp, ...], tuple[UOp, ...]]:
  """The output's (a, b) and reduce (c, d) ranges' window arithmetic shared by both kernels: the ranges, then
  the gates (in bounds, the two pool windows) and the window rows/columns p // 5, q // 5, with p = a + 4c,
  q = b + 4d."""
  a, b = UOp.range(4, 1), UOp.range(4, 2)
  c, d = UOp.range(4, 3, AxisType.REDUCE), UOp.range(4, 4, AxisType.REDUCE)
  p, q = a + c * 4, b + d * 4
  pr, pc, qr, qc = p // 5, p % 5, q // 5, q % 5
  w2 = (pr < 3) & (pc < 2) & (qr < 3) & (qc < 2)
  w1 = (pr < 3) & (pc < 1) & (qr < 3) & (qc < 1)
  return (a, b, c, d), ((p < 15) & (q < 15), w2, w1, pr, qr)


def pool_grad_ast(opts: tuple[Opt, ...] | None) -> UOp:
  """out[i, a, b] = sum over c, d of where(valid(p, q), float(v == mx[i]) / cnt[i] * g[i], 0) with p = a + 4c,
  q = b + 4d, v the conv output (conv[i] + bias[i]) at window cell (p // 5, q // 5), -inf in the padding."""
  out = UOp(Ops.PARAM, dtypes.float.ptr(OUT), arg=0)
  conv = UOp(Ops.PARAM, dtypes.float.ptr(4 * C), arg=1)
  bias, mx, cnt, g = (UOp(Ops.PARAM, dtypes.float.ptr(C), arg=k) for k in (2, 3, 4, 5))
  i, (a, b, c, d), (inb, w2, w1, pr, qr) = UOp.range(C, 0), *window_gates()
  zero = UOp.const(dtypes.int, 0)
  real = (zero < pr) & (pr < 3) & (zero < qr) & (qr < 3)  # not padding
  gate = inb & w2 & w1
  v = real.where(conv.index(pr * 2 + qr + i * 4 - 3, gate & real).load() + bias.index(i, gate & real).load(), 0.0)
  v = real.where(v, -np.inf)
  e = v.eq(mx.index(i, gate).load()).cast(dtypes.float) / cnt.index(i, gate).load() * g.index(i, gate).load()
  val = inb.where(w2.where(w1.where(e, 0.0), 0.0), 0.0)
  return out.index(i * 16 + a * 4 + b).store(val.reduce(c, d, arg=Ops.ADD)).sink(arg=KernelInfo(opts_to_apply=opts))


def numpy_ref(conv: np.ndarray, bias: np.ndarray, mx: np.ndarray, cnt: np.ndarray, g: np.ndarray) -> np.ndarray:
  """The same sum, element by element in numpy (float32), only where valid (nothing divided in the padding)."""
  out = np.zeros(OUT, np.float32)
  for i, a, b, c, d in itertools.product(range(C), range(4), range(4), range(4), range(4)):
    p, q = a + 4 * c, b + 4 * d
    if not (p < 15 and q < 15 and p // 5 < 3 and q // 5 < 3 and p % 5 < 1 and q % 5 < 1): continue
    pr, qr = p // 5, q // 5
    v = conv[pr * 2 + qr + i * 4 - 3] + bias[i] if 0 < pr and 0 < qr else np.float32(-np.inf)
    out[i * 16 + a * 4 + b] += np.float32(v == mx[i]) / cnt[i] * g[i]
  return out


def _run(ast: UOp, device: str, inputs: list[np.ndarray]) -> np.ndarray:
  dev = Device[device]
  spec = get_program(ast, dev.renderer)
  bufs = [Buffer(device, OUT, dtypes.float).allocate()] + \
    [Buffer(device, x.size, dtypes.float, initial_value=x.tobytes()) for x in inputs]
  prg = dev.get_program(spec.name, spec.lib)
  prg(*[bufs[s]._buf for s in spec.globals], global_size=spec.global_size, local_size=spec.local_size, vals=(),
      wait=True)
  return np.frombuffer(bufs[0].as_buffer(), dtype=np.float32).copy()


def _inputs() -> list[np.ndarray]:
  rng = np.random.default_rng(0)
  conv, bias = rng.standard_normal(4 * C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
  mx = conv.reshape(C, 4)[:, 0] + bias  # each channel's max sits at the conv's first pixel
  return [conv, bias, mx, np.array([1.0, 2.0, 1.0], np.float32), rng.standard_normal(C).astype(np.float32)]


@pytest.mark.parametrize("dev", ["CPU:LLVM", "CPU:CLANG", "PYTHON"])
@pytest.mark.parametrize("opts", [(), OPTS], ids=["noopt", "upcast_unroll"])
def test_padding_lanes_stay_out_of_the_sum(dev: str, opts: tuple[Opt, ...]) -> None:
  ins = _inputs()
  want = numpy_ref(*ins)
  assert np.count_nonzero(want) == C  # the window's one real max per channel, so the test sees the gradient
  with Context(DEV=dev):
    got = _run(pool_grad_ast(opts), dev.split(":")[0], ins)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_llvm_bool_to_float_is_a_select() -> None:
  """The rendered cast, so the guard holds on hosts without AVX-512 too (where the miscompile doesn't show)."""
  with Context(DEV="CPU:LLVM"):
    src = get_program(pool_grad_ast(OPTS), Device["CPU"].renderer).src
  assert "uitofp" not in src and "select <4 x i1>" in src, src


def int_lane_ast(opts: tuple[Opt, ...]) -> UOp:
  """pool_grad_ast's gates with an int buffer's gated load as the numerator: out = sum of where(valid, float(n[i]) /
  cnt[i] * g[i], 0); the padding lanes are sitofp of known-0 ints, divided by 0."""
  out = UOp(Ops.PARAM, dtypes.float.ptr(OUT), arg=0)
  n = UOp(Ops.PARAM, dtypes.int.ptr(C), arg=1)
  cnt, g = (UOp(Ops.PARAM, dtypes.float.ptr(C), arg=k) for k in (2, 3))
  i, (a, b, c, d), (inb, w2, w1, _, _) = UOp.range(C, 0), *window_gates()
  gate = inb & w2 & w1
  e = n.index(i, gate).load().cast(dtypes.float) / cnt.index(i, gate).load() * g.index(i, gate).load()
  val = inb.where(w2.where(w1.where(e, 0.0), 0.0), 0.0)
  return out.index(i * 16 + a * 4 + b).store(val.reduce(c, d, arg=Ops.ADD)).sink(arg=KernelInfo(opts_to_apply=opts))


@pytest.mark.parametrize("dev", ["CPU:LLVM", "CPU:CLANG", "PYTHON"])
def test_int_to_float_padding_lanes(dev: str) -> None:
  """The same miscompile through `sitofp` of an int load's known-0 padding lanes (NaN on AVX-512 hosts before)."""
  nv, cnt = np.array([1, 0, 2], np.int32), np.array([1.0, 2.0, 4.0], np.float32)
  g = np.array([3.0, 5.0, 7.0], np.float32)
  want = np.zeros(OUT, np.float32)  # numpy, term by term where valid (p, q in 0, 5, 10)
  for i, a, b, c, d in itertools.product(range(C), range(4), range(4), range(4), range(4)):
    if (a + 4 * c) in (0, 5, 10) and (b + 4 * d) in (0, 5, 10):
      want[i * 16 + a * 4 + b] += np.float32(nv[i]) / cnt[i] * g[i]
  device = dev.split(":")[0]
  with Context(DEV=dev):
    spec = get_program(int_lane_ast(OPTS), Device[device].renderer)
    bufs = [Buffer(device, OUT, dtypes.float).allocate(), Buffer(device, C, dtypes.int, initial_value=nv.tobytes())] + \
      [Buffer(device, C, dtypes.float, initial_value=x.tobytes()) for x in (cnt, g)]
    prg = Device[device].get_program(spec.name, spec.lib)
    prg(*[bufs[s]._buf for s in spec.globals], global_size=spec.global_size, local_size=spec.local_size, vals=(),
        wait=True)
  np.testing.assert_allclose(np.frombuffer(bufs[0].as_buffer(), dtype=np.float32), want, rtol=1e-6, atol=0)


def test_llvm_int_to_float_vector_is_fenced() -> None:
  """The rendered cast (the guard holds on hosts without AVX-512 too, where the miscompile doesn't show)."""
  with Context(DEV="CPU:LLVM"):
    src = get_program(int_lane_ast(OPTS), Device["CPU"].renderer).src
  assert "call <4 x float> @llvm.arithmetic.fence.v4f32(<4 x float>" in src, src
