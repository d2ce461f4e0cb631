"""Float sums of any size (issue #38): the counts past 2**31 elements, and the accuracy of float32 accumulation.

The scheduler blocks every big float sum (`_blocked_sum`: no accumulator adds more than REDUCE_BLOCK elements or
REDUCE_FANIN partials), so sums of ones are exact wherever float32 holds the count, and the error on other data is of
the order of numpy's pairwise `np.sum`. References: the exact count rounded to float32 by numpy, float64 numpy sums,
and numpy's own float32 error on the same data. Cross-package: through tiny-tensor's Tensor."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import Ops, UOp
from tiny_uop.dtype import dtypes

from tiny_codegen.schedule import create_schedule

tt = pytest.importorskip("tiny_tensor")
EPS = 2.0 ** -24  # float32's unit roundoff


@pytest.mark.parametrize("shape", [(2**31 + 5, 1), (2**18, 2**18), (2**16, 2**16 + 1), (3, 2**25 + 5)])
def test_sum_of_ones_is_the_count_rounded_to_float32(shape: tuple[int, int]) -> None:
  # (before: 16777216.0, 17179869184.0 and 4294983680.0 for the first three; a float32 running sum of ones stops at
  # 2**24). The reference is the exact count rounded once to float32: 2**31+5 -> 2**31 (torch gives the same)
  got = tt.Tensor.ones(*shape).sum().item()
  assert got == float(np.float32(shape[0] * shape[1])), (shape, got)


def test_sum_of_ones_per_row_and_mean_of_ones() -> None:
  rows = tt.Tensor.ones(3, 2**25 + 5).sum(1).numpy()  # a few outputs of an odd count each
  np.testing.assert_array_equal(rows, np.full(3, np.float32(2**25 + 5)))
  assert tt.Tensor.ones(2**16, 2**16 + 1).mean().item() == 1.0
  assert tt.Tensor.ones(2**31 + 5).mean().item() == 1.0


def test_reduce_past_int32_counts_uses_int64_indices() -> None:
  # PIPELINE.md §3: a schedule holding a value of more than 2**31-1 elements has int64 index math; the blocked
  # sum's kernels (its ranges, and the partial sums' split) follow it for a virtual (expanded const) input too
  sched = create_schedule(UOp.sink(tt.Tensor.ones(2**16, 2**16 + 1).sum().uop))
  rngs = [u for k in sched.kernels for u in k.src[0].toposort() if u.op is Ops.RANGE]
  assert rngs and all(r.dtype == dtypes.int64 for r in rngs), {r.dtype for r in rngs}


def _rel(got: float, ref: float) -> float:
  return abs(got - ref) / abs(ref)


def _bound(np_err: float) -> float:
  """Of the same order as numpy's pairwise float32 error: within 10x of it, or within 4 units of roundoff (numpy's
  error on one sample can be far below its typical size)."""
  return max(10 * np_err, 4 * EPS)


@pytest.mark.parametrize("n", [10**3, 10**4, 10**5, 10**6, 10**7, 2**26 + 3])
def test_sum_and_mean_of_random_data_as_accurate_as_numpy(n: int) -> None:
  x = np.random.default_rng(n % 1000).random(n, dtype=np.float32)  # positive: the sum's relative error is its worst
  ref = x.astype(np.float64).sum()
  t = tt.Tensor(x)
  got_sum, got_mean = t.sum().item(), t.mean().item()
  np_err = _rel(float(np.sum(x)), ref)
  assert _rel(got_sum, ref) <= _bound(np_err), (n, _rel(got_sum, ref), np_err)
  assert _rel(got_mean, ref / n) <= _bound(_rel(float(np.mean(x)), ref / n)) + EPS, (n, _rel(got_mean, ref / n))


@pytest.mark.parametrize("n", [10**5, 10**7])
def test_var_and_std_of_offset_random_data_as_accurate_as_numpy(n: int) -> None:
  # an offset of 100 over a unit spread: a one-pass E[x^2]-E[x]^2 would lose every digit; var is two-pass
  x = (np.random.default_rng(7).standard_normal(n) + 100).astype(np.float32)
  ref_var = x.astype(np.float64).var(ddof=1)
  t = tt.Tensor(x)
  got_var, got_std = t.var().item(), t.std().item()
  np_err = _rel(float(x.var(ddof=1)), ref_var)
  assert _rel(got_var, ref_var) <= _bound(np_err), (n, _rel(got_var, ref_var), np_err)
  assert _rel(got_std, np.sqrt(ref_var)) <= _bound(np_err), (n, _rel(got_std, np.sqrt(ref_var)))


def test_sum_mean_var_of_a_virtual_10_to_the_8_elements_as_accurate_as_numpy() -> None:
  # (i % 1000) * 0.001 for i < 10**8: computed in the kernel from an index (no input buffer); numpy's float32
  # pairwise sum and two-pass var of the same values are the yardstick (before: 66% off for the sum)
  n = 10**8
  xs = (np.arange(n) % 1000).astype(np.float32) * np.float32(0.001)
  x64 = xs.astype(np.float64)
  ref_sum, ref_var = x64.sum(), x64.var(ddof=1)
  x = (tt.Tensor.arange(n) % 1000).cast(tt.dtypes.float32) * np.float32(0.001)
  got_sum, got_mean, got_var = x.sum().item(), x.mean().item(), x.var().item()
  assert _rel(got_sum, ref_sum) <= _bound(_rel(float(xs.sum()), ref_sum)), _rel(got_sum, ref_sum)
  assert _rel(got_mean, ref_sum / n) <= _bound(_rel(float(xs.mean()), ref_sum / n)) + EPS
  assert _rel(got_var, ref_var) <= _bound(_rel(float(xs.var(ddof=1)), ref_var)), _rel(got_var, ref_var)


def test_sum_over_a_leading_axis_of_ones_is_exact() -> None:
  # a reduce over a leading axis is blocked with its reduced axes moved last (before: 2**24 in each column)
  got = tt.Tensor.ones(2**25 + 3, 3).sum(0).numpy()
  np.testing.assert_array_equal(got, np.full(3, np.float32(2**25 + 3)))


def test_long_rows_of_many_outputs_as_accurate_as_numpy() -> None:
  # 1024 rows of 2**18+7 values (a virtual input: a periodic row plus a per-row offset): many outputs, each a sum of
  # SPLIT_REDUCE_MIN or more elements, is blocked in one kernel (before: 3e-3 off; numpy's pairwise: 1.3e-7)
  n, rows = 2**18 + 7, 1024
  row = (tt.Tensor.arange(n) % 1000).cast(tt.dtypes.float32) * np.float32(0.001)
  offs = tt.Tensor.arange(rows).cast(tt.dtypes.float32).reshape(rows, 1) * np.float32(0.5)
  got = (row.reshape(1, n).expand(rows, n) + offs).sum(1).numpy()
  xs = (np.arange(n) % 1000).astype(np.float32) * np.float32(0.001)
  full = xs[None, :] + (np.arange(rows, dtype=np.float32) * np.float32(0.5))[:, None]
  ref = full.astype(np.float64).sum(1)
  np_err = float((np.abs(full.sum(1) - ref) / ref).max())
  assert float((np.abs(got - ref) / ref).max()) <= _bound(np_err), (np.abs(got - ref) / ref).max()
