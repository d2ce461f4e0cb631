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


@pytest.mark.parametrize("device,shape", [("CPU", (10, 20, 30, 40, 50)), (None, (2, 9, 3, 6, 4))],
                         ids=["issue-size-on-CPU", "small-on-default-device"])
def test_issue_example_five_dims(device, shape):
  # the issue's example (a CPU kernel that ran for minutes) at its size on CPU, where it was reported: the indexed plane
  # is 20 x 40 and there are 24 writers, so no kernel loops over the 12M-element source per element; the same
  # structure at a small size on the default device (an emulated GPU runs 12M elements for many minutes)
  t = Tensor.zeros(*shape, dtype=dtypes.int, device=device).contiguous().realize()
  i1, i2 = Tensor([5, 3, 7, 8], device=device), Tensor([[[0], [1], [2]], [[3], [4], [5]]], device=device)
  vshape = (2, 3, 4, shape[0], shape[2], shape[4])
  v = Tensor.arange(int(np.prod(vshape)), device=device).reshape(vshape)
  assert max(_reduce_sizes(t[:, i1, :, i2, :]), default=0) == 0
  t[:, i1, :, i2, :] = v
  a = np.zeros(shape, np.int32)
  a[:, np.array([5, 3, 7, 8]), :, i2.numpy(), :] = np.arange(int(np.prod(vshape))).reshape(vshape)
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


def test_variable_index_reads_and_bounds():
  t = Tensor.arange(6).float().contiguous().realize()
  v = Variable("i", 0, 4).bind(2)
  assert t[v].item() == 2.0 and t[v:v + 2].tolist() == [2.0, 3.0]
  with pytest.raises(IndexError, match="symbolic index j with range"): t[Variable("j", 0, 9).bind(1)]
  k = Variable("k", 0, 5).bind(1)
  with pytest.raises(IndexError, match=r"symbolic slice k:\(k\+2\) spans \[0, 7\)"): t[k:k + 2]
  assert t[k:].sum().item() == np.arange(6)[1:].sum()  # a symbolic length (see test_symbolic_slicing.py)
  with pytest.raises(TypeError, match="constant length"): t[k::2]
  assert t[:Variable("n", 1, 6).bind(4)].sum().item() == float(np.arange(6)[:4].sum())
  with pytest.raises(IndexError, match="negative for some values"): t[k:1]


def test_setitem_at_variable_index_eager():
  t = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
  x = Tensor(t.copy()).realize()
  i, j = Variable("i", 0, 3).bind(1), Variable("j", 0, 4).bind(3)
  x[i] = -1.0
  x[2, j:j + 2, i] = Tensor([7.0, 8.0])
  x[:, 1, j] = Tensor([1.0, 2.0, 3.0, 4.0])
  t[1] = -1.0
  t[2, 3:5, 1] = [7.0, 8.0]
  t[:, 1, 3] = [1.0, 2.0, 3.0, 4.0]
  np.testing.assert_array_equal(x.numpy(), t)
  y = Tensor.arange(6).reshape(2, 3).contiguous()  # lazy target: the write lands in its graph
  y[Variable("r", 0, 1).bind(1), Tensor([2, 0])] = Tensor([-5, -6])
  assert y.tolist() == [[0, 1, 2], [-6, 4, -5]]


def test_setitem_at_variable_index_replays_in_jit():
  t = Tensor.zeros(5, 4).contiguous().realize()
  before = t * 1  # a lazy read made before the writes sees zeros

  @TinyJit
  def put(row, vals):
    t[row, 1:3] = vals
    return t.realize()

  v = Variable("row", 0, 4)
  for k in (3, 0, 4, 1):
    put(v.bind(k), Tensor([float(k + 1), -float(k + 1)]))
  assert put.captured is not None and put.captured.kernel_count <= 2  # one write (and a copy back)
  want = np.zeros((5, 4), np.float32)
  for k in (3, 0, 4, 1): want[k, 1:3] = [k + 1, -(k + 1)]
  np.testing.assert_array_equal(t.numpy(), want)
  assert before.numpy().sum() == 0


def test_assign_into_a_variable_window_in_jit():
  # tinygrad's form: assign into a shrink at a Variable offset writes the window of the buffer
  @TinyJit
  def f(t, a, v): t.shrink(((v, v + 1), None)).assign(a).realize()

  t = Tensor.zeros(6, 6).contiguous().realize()
  want = np.zeros((6, 6), np.float32)
  for i in (0, 5, 2, 3, 1, 4):
    f(t, Tensor.full((1, 6), i + 1.0).contiguous(), Variable("v", 0, 5).bind(i))
    want[i] = i + 1
    np.testing.assert_array_equal(t.numpy(), want)
  x = Tensor.arange(12).reshape(3, 4).float().contiguous().realize()
  rows = x[1:3]  # a lazy view: it reads the new values once computed
  x.shrink(((1, 3), (1, 3))).shrink(((1, 2), None)).assign(Tensor([[-1.0, -2.0]]))
  assert x.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, -1, -2, 11]] and rows.tolist()[1] == [8, -1, -2, 11]
  x.permute(1, 0).shrink(((3, 4), None)).assign(Tensor([[-3.0, -7.0, -11.0]]))  # column 3, through a permute
  assert x.tolist() == [[0, 1, 2, -3], [4, 5, 6, -7], [8, -1, -2, -11]]
  with pytest.raises(RuntimeError, match="PAD"): x.pad(((1, 0), None)).assign(Tensor.zeros(4, 4))
