"""Short contiguous reduces (a squeeze-excite's global mean over a 7x7 or 14x14 map) as vectors of channels (#39).

A float reduce whose contiguous axis is not a multiple of one vector register's lanes (49, 196, odd lengths) got no
unroll and added each channel into one scalar chain, its fused producer (a conv's bias and hardswish or SiLU)
computed a lane at a time; the CPU heuristic now upcasts the channels by the register's lanes
(`_short_reduce_channels`): one vector accumulator a block of channels, the producer's math in vectors. Values
against torch (NaN and inf included), and the LLVM source: the vector accumulator where the rule applies, for
AVX-512's and AVX2's register files, none where the reduce is a multiple of the lanes.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor, engine

rng = np.random.default_rng(39)


def _t(a: np.ndarray, device: str | None = None) -> Tensor: return Tensor(a, device=device).realize()


def _kernels(fn, *args: Tensor) -> tuple[np.ndarray, list]:
  calls: list = []
  with engine.capture(calls.append): out = fn(*args).realize().numpy()
  return out, [c for c in calls if c.kind == "kernel"]


ACTS = {"none": (lambda z: z, lambda z: z), "hardswish": (Tensor.hardswish, F.hardswish), "silu": (Tensor.silu, F.silu)}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("c,h,w", [(576, 7, 7), (96, 14, 14), (40, 7, 7), (17, 14, 14), (3, 5, 5)])
def test_spatial_mean_with_its_producer(act: str, c: int, h: int, w: int):
  # a squeeze-excite's mean of (x + bias) through its activation, NCHW: the mean over each channel's h*w values
  x, b = rng.standard_normal((1, c, h, w)).astype(np.float32) * 3, rng.standard_normal((1, c, 1, 1)).astype(np.float32)
  f, tf = ACTS[act]
  got = f(_t(x) + _t(b)).mean((2, 3), keepdim=True).numpy()
  want = tf(torch.from_numpy(x) + torch.from_numpy(b)).mean((2, 3), keepdim=True).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 3, 5, 13, 49, 97, 196])
@pytest.mark.parametrize("c", [16, 64, 48])
def test_odd_length_means_and_sums(n: int, c: int):
  x = rng.standard_normal((c, n)).astype(np.float32)
  np.testing.assert_allclose(_t(x).mean(-1).numpy(), torch.from_numpy(x).mean(-1).numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(_t(x).sum(-1).numpy(), x.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(_t(x).max(-1).numpy(), x.max(-1))


@pytest.mark.parametrize("act", list(ACTS))
def test_nan_and_inf_stay_in_their_channel(act: str):
  c, n = 48, 49
  x = rng.standard_normal((1, c, 7, 7)).astype(np.float32)
  flat = x.reshape(c, n)
  flat[0, 0], flat[5, 48], flat[17, 20], flat[33, 7] = np.nan, np.inf, np.inf, np.nan
  if act != "hardswish": flat[40, 3] = -np.inf  # (hardswish(-inf) is 0 here, NaN in torch: tensor.py's, not this)
  b = np.zeros((1, c, 1, 1), np.float32)
  f, tf = ACTS[act]
  got = f(_t(x) + _t(b)).mean((2, 3)).numpy()
  want = tf(torch.from_numpy(x) + torch.from_numpy(b)).mean((2, 3)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # NaN where torch's is NaN, inf where inf
  assert np.isnan(got[0, 0]) and np.isnan(got[0, 33]) and np.isinf(got[0, 5]) and np.isfinite(got[0, 1:5]).all()


@pytest.mark.parametrize("regs,width", [(32, 64), (16, 32)])
def test_short_reduce_is_a_vector_of_channels(vector_registers, regs: int, width: int):
  # the rule: a reduce of 49 (no divisor among the unroll's amounts) or of 196 with a SiLU (a body over the unroll's
  # budget), not a multiple of the register's 16 or 8 floats, over channels the store walks contiguously, keeps one
  # <lanes x float> accumulator a block of channels; a plain 196 (unrolled by 4) and a 64 (a multiple) do not
  vector_registers(regs, width)
  lanes = width // 4
  for c, n, act, short in ((576 + lanes, 49, "hardswish", True), (96 + lanes, 196, "silu", True),
                           (96 + lanes, 196, "none", False), (96 + lanes, 64, "hardswish", False)):
    x, b = rng.standard_normal((1, c, n)).astype(np.float32), rng.standard_normal((1, c, 1)).astype(np.float32)
    f, tf = ACTS[act]
    got, ks = _kernels(lambda x, b, f=f: f(x + b).mean(-1), _t(x, "CPU"), _t(b, "CPU"))  # (the CPU's heuristic)
    np.testing.assert_allclose(got, tf(torch.from_numpy(x + b)).mean(-1).numpy(), rtol=1e-5, atol=1e-6)
    assert len(ks) == 1
    assert (f"alloca [1 x <{lanes} x float>]" in ks[0].spec.src) == short, (c, n, act, ks[0].spec.src)
