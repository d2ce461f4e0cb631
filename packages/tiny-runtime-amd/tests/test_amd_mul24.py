"""64-bit integer multiplies of values masked to 24 bits, through `Tensor` on MOCK+AMD (gfx1100) and its gfx942, against
numpy. LLVM 22.1's AMDGPU backend drops the masks of `(a & 0xFFFFFF) * (b & 0xFFFFFF) + c` when it fuses the multiply
and the add into v_mad_u64_u32 (README, Known issues); the emulators run that instruction as the ISA defines it, so a
missing guard (`AMDGPURenderer`'s `mul24_guard`) shows here as wrong values: bits 24-31 of a and b leak into the
product. Inputs have bits 24-31 (and 32-62) set so a leak cannot go unnoticed."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_tensor import Tensor, dtypes
from tiny_uop.helpers import Context

M = 0xFFFFFF
DEVS = ("MOCK+AMD", "MOCK+AMD:LLVM:gfx942")
CASES = {  # name: f(a, b), applied to Tensors and to numpy arrays alike
  "both_masked_plus_a": lambda a, b: (a & M) * (b & M) + a,  # the reproduction: wrong before the guard
  "both_masked_plus_b": lambda a, b: (a & M) * (b & M) + b,
  "masked_times_const_plus_a": lambda a, b: (a & M) * 0x123456 + a,  # one mask, a 21-bit constant factor
  "both_masked_plus_const": lambda a, b: (a & M) * (b & M) + 12345,
  "mod_2_24_plus_a": lambda a, b: (a % (1 << 24)) * (b % (1 << 24)) + a,  # inputs >= 0: C's and numpy's % agree
  "xor_of_masked_plus_a": lambda a, b: ((a & M) ^ (b & M)) * (b & M) + a,
  "low_bits_mask_plus_a": lambda a, b: (a & 0xFFFF00) * (b & M) + a,
  "a_minus_both_masked": lambda a, b: a - (a & M) * (b & M),
  "both_masked": lambda a, b: (a & M) * (b & M),
  "one_masked_plus_a": lambda a, b: (a & M) * b + a,  # b full width: no 24-bit multiply, right before and after
  "masked_22_bits_plus_a": lambda a, b: (a & 0x3FFFFF) * (b & 0x3FFFFF) + a,
}
NP = {dtypes.int64: np.int64, dtypes.uint64: np.uint64, dtypes.int32: np.int32, dtypes.uint32: np.uint32}


def _inputs(npdt: type) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(24)
  bits = 8 * np.dtype(npdt).itemsize - 1  # below the sign bit: numpy's int wrap is then the same as ours
  a, b = (rng.integers(0, 1 << bits, 256, dtype=np.int64 if bits > 31 else np.int32).astype(npdt) for _ in range(2))
  return a | npdt(0x7F000000), b | npdt(0x5A000000)  # bits 24-30 set in every lane


@pytest.mark.parametrize("dev", DEVS)
@pytest.mark.parametrize("dt", list(NP), ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_masked_multiply_add_matches_numpy(dev: str, dt, case: str):
  a, b = _inputs(NP[dt])
  fn = CASES[case]
  with Context(DEV=dev):
    got = fn(Tensor(a, dtype=dt, device=dev), Tensor(b, dtype=dt, device=dev)).numpy()
  with np.errstate(over="ignore"): want = fn(a, b)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dev", DEVS)
def test_masked_products_summed_match_numpy(dev: str):
  """A reduction adds the products: the add the fold wants can be the accumulator's."""
  a, b = _inputs(np.int64)
  with Context(DEV=dev):
    got = ((Tensor(a, device=dev) & M) * (Tensor(b, device=dev) & M)).reshape(16, 16).sum(1).numpy()
  np.testing.assert_array_equal(got, ((a & M) * (b & M)).reshape(16, 16).sum(1))


@pytest.mark.parametrize("dev", DEVS)
def test_int32_masks_widened_to_int64_match_numpy(dev: str):
  a, b = _inputs(np.int32)
  with Context(DEV=dev):
    ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
    got = ((ta & M).cast(dtypes.int64) * (tb & M).cast(dtypes.int64) + ta.cast(dtypes.int64)).numpy()
  np.testing.assert_array_equal(got, (a & M).astype(np.int64) * (b & M).astype(np.int64) + a.astype(np.int64))
