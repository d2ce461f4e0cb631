"""Ops that compute with a dim's size (sliding windows, masks, scans, sorting networks, indexing plans) on a tensor
whose dim is symbolic (a bound Variable's, `a[:, :i]`): a TypeError that names the op and the shape, not the raw
"truth value of a UOp is ambiguous" from deep inside; the dims such an op doesn't compute with may stay symbolic
(checked against numpy)."""
import numpy as np
import pytest

from tiny_tensor import Tensor, Variable

I = Variable("i", 1, 10)
A = np.arange(60, dtype=np.float32).reshape(6, 10)


def _sym() -> Tensor:
  return Tensor(A)[:, :I.bind(3)]  # shape (6, i), i bound to 3


@pytest.mark.parametrize("name, op, what", [
  ("cumsum", lambda t: t.cumsum(1), "cumulative op"),
  ("cummax", lambda t: t.cummax(1), "cumulative op"),
  ("tril", lambda t: t.tril(), "tril/triu"),
  ("sort", lambda t: t.sort(1), "sort along its dim"),
  ("gather", lambda t: t.gather(1, Tensor([[0]] * 6)), "gather along its dim"),
  ("cross_entropy", lambda t: t.cross_entropy(Tensor([0, 1, 0, 1, 0, 1])), "cross_entropy's class count"),
  ("diagonal", lambda t: t.diagonal(), "diagonal"),
  ("logcumsumexp", lambda t: t.logcumsumexp(1), "logcumsumexp"),
])
def test_symbolic_dim_is_a_clear_error(name, op, what):
  with pytest.raises(TypeError, match=f"{what}.*symbolic") as e: op(_sym())
  assert "ambiguous" not in str(e.value)
  assert " i" in str(e.value) or "(6, i)" in str(e.value)  # the symbolic size is named


@pytest.mark.parametrize("index", [0, (slice(None), 0), slice(1, 3), (Ellipsis, slice(None, 2))])
def test_indexing_a_symbolic_dim_is_a_clear_error(index):
  with pytest.raises(TypeError, match=r"can't index dim 1 of a tensor of shape \(6, i\): its size i is symbolic"):
    _sym()[index]


def test_ops_over_concrete_dims_keep_working_beside_a_symbolic_dim():
  s = _sym()
  np.testing.assert_allclose(s.cumsum(0).sum(1).numpy(), np.cumsum(A[:, :3], 0).sum(1))  # reduced: concrete
  np.testing.assert_allclose(s.softmax(1).sum(1).numpy(), np.ones(6), rtol=1e-6)
  np.testing.assert_allclose(s.sum(1).numpy(), A[:, :3].sum(1))
