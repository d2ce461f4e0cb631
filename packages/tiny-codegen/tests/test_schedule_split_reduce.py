"""A big reduce into a few outputs (`a.sum()` of a big tensor) is scheduled in two stages: per-group partials (run
on the CPU's threads, vector accumulators) then their reduce. Results against numpy, kernel counts, launch sizes.
Cross-package: through tiny-tensor's Tensor (installed with every package in `nox -s tests`)."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import Ops, UOp
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.schedule import create_schedule
from tiny_codegen.schedule.schedule import SPLIT_REDUCE_MIN

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
