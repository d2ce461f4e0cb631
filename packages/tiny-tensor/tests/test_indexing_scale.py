"""Advanced indexing at scale and setitem semantics: gathers cost the elements read (codegen folds the one-hot sums
into loads), setitem with tensor indices follows numpy (the last duplicate wins), an out-of-range lazy index writes
nothing, lazy reads made before a write see the old values, 2-d indices, and setitem inside TinyJit."""
import numpy as np
import pytest
from tiny_codegen.lower.gather import fold_onehot_reduces
from tiny_tensor import Tensor, TinyJit, Variable, dtypes
from tiny_uop.uop import Ops

rng = np.random.default_rng(3)


def _reduce_sizes(t: Tensor) -> list[int]:
  """For each kernel realizing t (after the one-hot fold), the product of its REDUCE loop bounds."""
  out = []
  for c in t.schedule().calls:
    if c.src[0].op is not Ops.SINK: continue
    for u in fold_onehot_reduces(c.src[0]).toposort():
      if u.op is Ops.REDUCE: out.append(int(np.prod([r.src[0].arg for r in u.src[1:]])))
  return out


def test_gather_is_folded_into_loads():
  x = Tensor(rng.standard_normal((6, 50, 7, 40)).astype(np.float32)).realize()
  i, j = Tensor([[3], [49], [-1]]).realize(), Tensor([0, 39, 5, 5]).realize()
  y = x[:, i, :, j]
  assert _reduce_sizes(y) == []  # no loop over the 50 * 40 indexed places per output element
  np.testing.assert_array_equal(y.numpy(), x.numpy()[:, np.array([[3], [49], [-1]]), :, np.array([0, 39, 5, 5])])
  assert Tensor([True, False, True])[Tensor([2, 1, 0])].tolist() == [True, False, True]


def test_out_of_range_lazy_index_reads_zero_and_writes_nothing():
  t = Tensor([1.0, 2.0, 3.0, 4.0]).contiguous().realize()
  assert t[Tensor([9]) + 0].tolist() == [0.0] and t[Tensor([-9]) + 0].tolist() == [0.0]
  t[Tensor([9]) + 0] = 5.0
  assert t.tolist() == [1.0, 2.0, 3.0, 4.0]
  with pytest.raises(IndexError, match="9"): t[Tensor([9])] = 5.0  # a realized index is checked


def test_duplicate_indices_last_write_wins():
  t = Tensor.zeros(4).contiguous().realize()
  t[Tensor([1, 1])] = Tensor([7.0, 8.0])
  assert t.tolist() == [0.0, 8.0, 0.0, 0.0]
  a = np.zeros((3, 4), np.int32)
  t = Tensor(a).contiguous().realize()
  idx = (np.array([2, 0, 2, 2]), np.array([1, 3, 1, 0]))
  a[idx] = [5, 6, 7, 8]
  t[Tensor(idx[0]), Tensor(idx[1])] = Tensor([5, 6, 7, 8])
  np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("case", range(6))
def test_setitem_tensor_indices_like_numpy(case):
  shape, idx = [
    ((5,), (np.array([1, 3, -1]),)),
    ((4, 5), (slice(None), np.array([[0], [4]]))),
    ((4, 5, 6), (np.array([1, 2]), slice(1, 4), np.array([0, 5]))),
    ((4, 5, 6), (slice(None, None, 2), np.array([1, 2]), np.array([0, 5]))),
    ((4, 5, 6), (np.array([-1, 2]), None, slice(None, None, -2))),
    ((3, 4), (np.array([[0, 1], [2, 2]]), np.array([[1], [3]]))),
  ][case]
  a = rng.standard_normal(shape).astype(np.float32)
  t = Tensor(a).contiguous().realize()
  v = rng.standard_normal(a[idx].shape).astype(np.float32)
  a[idx] = v
  t[tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in idx)] = Tensor(v)
  np.testing.assert_array_equal(t.numpy(), a)


def test_issue_example_five_dims():
  # the indexed plane is 20 x 40 and there are 24 writers: no kernel loops over the 12M-element source per element
  t = Tensor.zeros(10, 20, 30, 40, 50, dtype=dtypes.int).contiguous().realize()
  i1, i2 = Tensor([5, 3, 7, 8]), Tensor([[[0], [1], [2]], [[3], [4], [5]]])
  v = Tensor.arange(2 * 3 * 4 * 10 * 30 * 50).reshape(2, 3, 4, 10, 30, 50)
  assert max(_reduce_sizes(t[:, i1, :, i2, :]), default=0) == 0
  t[:, i1, :, i2, :] = v
  a = np.zeros((10, 20, 30, 40, 50), np.int32)
  a[:, np.array([5, 3, 7, 8]), :, i2.numpy(), :] = np.arange(2 * 3 * 4 * 10 * 30 * 50).reshape(2, 3, 4, 10, 30, 50)
  np.testing.assert_array_equal(t.numpy(), a)


def test_lazy_reads_before_a_write_see_old_values():
  t = Tensor.arange(6).float().contiguous().realize()
  a = t[1:3] * 1
  b = t[Tensor([1, 4])] + 0
  t[1:3] = Tensor([10.0, 20.0])
  c = t[Tensor([1, 2])] + 0
  t[Tensor([2])] = Tensor([30.0])
  assert a.tolist() == [1.0, 2.0] and b.tolist() == [1.0, 4.0] and c.tolist() == [10.0, 20.0]
  assert t.tolist() == [0.0, 10.0, 30.0, 3.0, 4.0, 5.0]


def test_setitem_in_tinyjit_with_tensor_index():
  t = Tensor.zeros(6).contiguous().realize()

  @TinyJit
  def f(i, x):
    t[i] = x
    return t.realize()
  for k in range(5): out = f(Tensor([k]), Tensor([float(k + 1)]))
  assert out.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 0.0]


def test_variable_index_reads_and_setitem_says_unsupported():
  t = Tensor.arange(6).float().contiguous().realize()
  v = Variable("i", 0, 4).bind(2)
  assert t[v].item() == 2.0 and t[v:v + 2].tolist() == [2.0, 3.0]
  with pytest.raises(IndexError, match="out of bounds"): t[Variable("j", 0, 9).bind(1)]
  with pytest.raises(NotImplementedError, match="symbolic"): t[v] = 1.0
