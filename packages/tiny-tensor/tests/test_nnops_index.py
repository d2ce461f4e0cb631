"""tiny_tensor.nnops against numpy (and torch where numpy has no equivalent): einsum, sort/topk, triangles, cumulative
ops, roll, gather/scatter, masked_fill and pad2d, with edge cases (ties, zero-size dims, negative axes) and errors."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_tensor import GlobalCounters, Tensor, dtypes

rng = np.random.default_rng(1)


def randn(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)


def close(t, want, atol=1e-5, rtol=1e-5):
  got = t.numpy()
  assert got.shape == np.shape(want), f"shape {got.shape} != {np.shape(want)}"
  np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)


# ***** einsum *****

EINSUM_CASES = [
  ("ij,jk->ik", [(2, 3), (3, 4)]), ("ij->ji", [(2, 3)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]),
  ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("...ij,...jk->...ik", [(2, 2, 3), (2, 3, 4)]),
  ("i,j->ij", [(3,), (4,)]), ("ij,ij->", [(2, 3), (2, 3)]), ("ij,jk", [(2, 3), (3, 2)]), ("...i,i", [(2, 3, 4), (4,)]),
  ("i...->...", [(3, 2, 2)]), ("iij->j", [(2, 2, 3)]), ("ijk,ikl,l->ji", [(2, 3, 2), (2, 2, 3), (3,)]),
  ("b h i d, b h j d -> b h i j", [(1, 2, 3, 4), (1, 2, 2, 4)]), ("i,i->i", [(5,), (5,)]), ("ji", [(2, 3)]),
]


@pytest.mark.parametrize("formula,shapes", EINSUM_CASES)
def test_einsum(formula, shapes):
  xs = [randn(*s) for s in shapes]
  close(Tensor.einsum(formula, *[Tensor(x) for x in xs]), np.einsum(formula, *xs), atol=1e-4, rtol=1e-4)


def test_einsum_list_operands_ints_and_size1_broadcast():
  a, b = rng.integers(-5, 5, (2, 3)), rng.integers(-5, 5, (3,))
  got = Tensor.einsum("ij,j->i", [Tensor(a.astype(np.int32)), Tensor(b.astype(np.int32))])
  assert got.dtype == dtypes.int32
  np.testing.assert_array_equal(got.numpy(), a @ b)
  x, y = randn(2, 1, 4), randn(2, 3, 4)  # size-1 'j' broadcasts against 3, as torch.einsum allows
  close(Tensor.einsum("ijk,ijk->ij", Tensor(x), Tensor(y)), (np.broadcast_to(x, y.shape) * y).sum(-1))


@pytest.mark.parametrize("formula,shapes,needle", [
  ("ij,jk->ik", [(2, 3)], "2 operands"), ("ij,jk->ik", [(2, 3), (4, 2)], "sizes 3 and 4"),
  ("ij->iz", [(2, 3)], "'iz'"), ("ijk->i", [(2, 3)], "'ijk'"), ("ii->i", [(2, 3)], "sizes 2 and 3"),
  ("i1->i", [(2, 3)], "'i1'"),
])
def test_einsum_errors(formula, shapes, needle):
  with pytest.raises(ValueError, match=needle): Tensor.einsum(formula, *[Tensor.zeros(*s) for s in shapes])


# ***** sort, argsort, topk *****

def np_sort(x: np.ndarray, axis: int, descending: bool):
  idx = np.argsort(-x if descending else x, axis=axis, kind="stable")  # stable: ties keep their input order
  return np.take_along_axis(x, idx, axis), idx


@pytest.mark.parametrize("shape,dim", [((5,), 0), ((8,), -1), ((3, 6), 1), ((6, 3), 0), ((2, 3, 5), 1), ((1,), 0),
                                       ((2, 13), -1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_floats_with_ties(shape, dim, descending):
  x = rng.integers(-3, 4, shape).astype(np.float32)  # a small range: many ties
  v, i = Tensor(x).sort(dim, descending)
  want_v, want_i = np_sort(x, dim, descending)
  np.testing.assert_array_equal(v.numpy(), want_v)
  np.testing.assert_array_equal(i.numpy(), want_i)
  assert i.dtype == dtypes.int32
  np.testing.assert_array_equal(Tensor(x).argsort(dim, descending).numpy(), want_i)


def test_sort_ints_infs_and_zero_size():
  x = np.array([[5, -2**31, 7, 2**31 - 1, 0], [1, 1, 1, -1, 2**31 - 1]], dtype=np.int32)  # the padding values too
  for desc in (False, True):
    v, i = Tensor(x).sort(-1, desc)
    want_v, want_i = np_sort(x.astype(np.int64), -1, desc)
    np.testing.assert_array_equal(v.numpy(), want_v)
    np.testing.assert_array_equal(i.numpy(), want_i)
  f = np.array([np.inf, 1.0, -np.inf, 0.5, np.inf], np.float32)
  v, i = Tensor(f).sort()
  np.testing.assert_array_equal(v.numpy(), np.sort(f))
  np.testing.assert_array_equal(i.numpy(), np.argsort(f, kind="stable"))
  v, i = Tensor.zeros(3, 0).sort(0)
  assert v.shape == (3, 0) and i.shape == (3, 0)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(-4, 4), min_size=1, max_size=9), st.booleans())
def test_sort_property(values, descending):
  x = np.array(values, dtype=np.int32)
  v, i = Tensor(x).sort(descending=descending)
  want_v, want_i = np_sort(x, 0, descending)
  np.testing.assert_array_equal(v.numpy(), want_v)
  np.testing.assert_array_equal(i.numpy(), want_i)


def test_sort_gradient_follows_values():
  x = Tensor(np.array([3.0, 1.0, 2.0], np.float32))
  v, _ = x.sort()
  (g,) = (v * Tensor([1.0, 10.0, 100.0])).sum().gradient(x)
  np.testing.assert_allclose(g.numpy(), [100.0, 1.0, 10.0])


@pytest.mark.parametrize("k,dim,largest", [(2, -1, True), (1, 0, False), (3, 1, False), (0, 1, True), (4, 1, True)])
def test_topk(k, dim, largest):
  x = rng.permutation(12).astype(np.float32).reshape(3, 4)
  v, i = Tensor(x).topk(k, dim, largest)
  want_v, want_i = np_sort(x, dim, largest)
  sl = tuple(slice(0, k) if d == (dim % 2) else slice(None) for d in range(2))
  np.testing.assert_array_equal(v.numpy(), want_v[sl])
  np.testing.assert_array_equal(i.numpy(), want_i[sl])


def test_sort_topk_errors():
  with pytest.raises(ValueError, match="k=5"): Tensor.zeros(2, 4).topk(5)
  with pytest.raises(IndexError, match="dim 2"): Tensor.zeros(2, 4).sort(2)
  with pytest.raises(IndexError, match="dim -3"): Tensor.zeros(2, 4).topk(1, dim=-3)


# ***** triangles *****

@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 4, 3)])
@pytest.mark.parametrize("diagonal", [-1, 0, 2])
def test_tril_triu(shape, diagonal):
  x = rng.integers(1, 9, shape).astype(np.int32)
  np.testing.assert_array_equal(Tensor(x).tril(diagonal).numpy(), np.tril(x, diagonal))
  np.testing.assert_array_equal(Tensor(x).triu(diagonal).numpy(), np.triu(x, diagonal))
  assert Tensor(x).tril().dtype == dtypes.int32


def test_tril_needs_two_dims():
  with pytest.raises(ValueError, match=r"\(3,\)"): Tensor.zeros(3).tril()


# ***** cumulative ops *****

@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 4), 1), ((3, 4), 0), ((2, 3, 4), -2), ((1,), 0), ((4, 1), 1)])
def test_cumsum_cumprod(shape, axis):
  x = randn(*shape)
  close(Tensor(x).cumsum(axis), np.cumsum(x, axis), atol=1e-5)
  p = rng.uniform(0.5, 1.5, shape).astype(np.float32)
  close(Tensor(p).cumprod(axis), np.cumprod(p, axis), atol=1e-5)


def test_cumsum_ints_zero_size_and_0d():
  x = rng.integers(-9, 9, (3, 5)).astype(np.int32)
  got = Tensor(x).cumsum(1)
  assert got.dtype == dtypes.int32
  np.testing.assert_array_equal(got.numpy(), np.cumsum(x, 1))
  assert Tensor.zeros(0, 3).cumsum(0).shape == (0, 3)
  assert Tensor(3.0).cumsum().item() == 3.0
  np.testing.assert_array_equal(Tensor([True, False, True]).cumsum().numpy(), [1, 1, 2])


def test_cumsum_long_axis_two_stage():
  x = rng.integers(-3, 4, (2, 700)).astype(np.float32)  # > 2*256: the chunked path
  close(Tensor(x).cumsum(-1), np.cumsum(x, -1), atol=1e-3)
  close(Tensor(x[:, :600]).T.cumsum(0), np.cumsum(x[:, :600].T, 0), atol=1e-3)
  m = rng.permutation(1100).astype(np.float32)
  close(Tensor(m).cummax(0)[0], np.maximum.accumulate(m))


def test_cumsum_is_one_kernel():
  x = Tensor(randn(4, 50)).realize()
  GlobalCounters.reset()
  out = x.cumsum(1).realize()
  assert GlobalCounters.kernel_count == 1
  close(out, np.cumsum(x.numpy(), 1), atol=1e-4)


def test_cumsum_gradient():
  torch = pytest.importorskip("torch")
  x, w = randn(3, 4), randn(3, 4)
  t = torch.tensor(x, requires_grad=True)
  (torch.cumsum(t, 1) * torch.tensor(w)).sum().backward()
  xt = Tensor(x)
  (g,) = (xt.cumsum(1) * Tensor(w)).sum().gradient(xt)
  close(g, t.grad.numpy(), atol=1e-5)


def np_cummax(x: np.ndarray, axis: int):
  """Running max and, like tinygrad, the index where each running max first appeared."""
  xm = np.moveaxis(x, axis, -1)
  vals = np.maximum.accumulate(xm, -1)
  idx = np.zeros(xm.shape, np.int32)
  for pos in np.ndindex(xm.shape[:-1]):
    for i in range(xm.shape[-1]):
      idx[pos + (i,)] = int(np.flatnonzero(xm[pos][: i + 1] == vals[pos + (i,)])[0])
  return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cummax_cummin(axis):
  x = rng.integers(-4, 5, (4, 6)).astype(np.float32)
  v, i = Tensor(x).cummax(axis)
  want_v, want_i = np_cummax(x, axis)
  np.testing.assert_array_equal(v.numpy(), want_v)
  np.testing.assert_array_equal(i.numpy(), want_i)
  v, i = Tensor(x).cummin(axis)
  want_v, want_i = np_cummax(-x, axis)
  np.testing.assert_array_equal(v.numpy(), -want_v)
  np.testing.assert_array_equal(i.numpy(), want_i)
  xi = x.astype(np.int32)
  np.testing.assert_array_equal(Tensor(xi).cummin(axis)[0].numpy(), np.minimum.accumulate(xi, axis))


def test_logcumsumexp():
  x = randn(3, 5) * 4
  close(Tensor(x).logcumsumexp(1), np.logaddexp.accumulate(x, 1), atol=1e-5)
  close(Tensor(x).logcumsumexp(0), np.logaddexp.accumulate(x, 0), atol=1e-5)
  big = np.array([1000.0, 1000.0, -1000.0], np.float32)  # the naive formula overflows
  close(Tensor(big).logcumsumexp(), np.logaddexp.accumulate(big), atol=1e-3)


def test_cumulative_errors():
  with pytest.raises(IndexError, match="dim 2"): Tensor.zeros(2, 3).cumsum(2)
  with pytest.raises(IndexError, match="dim -3"): Tensor.zeros(2, 3).cummax(-3)


# ***** roll, masked_fill, pad2d *****

@pytest.mark.parametrize("shifts,dims", [(1, 0), (-2, 1), (7, 1), ((1, -1), (0, 1)), ((1, 2), (1, 1)), (3, None),
                                         (-5, None), (2, -1)])
def test_roll(shifts, dims):
  x = np.arange(12, dtype=np.int32).reshape(3, 4)
  np.testing.assert_array_equal(Tensor(x).roll(shifts, dims).numpy(), np.roll(x, shifts, dims))


def test_roll_zero_size_and_errors():
  assert Tensor.zeros(0, 3).roll(1, 1).shape == (0, 3)
  with pytest.raises(ValueError, match="same length"): Tensor.zeros(2, 3).roll((1, 2), 0)
  with pytest.raises(IndexError, match="dim 2"): Tensor.zeros(2, 3).roll(1, 2)


def test_masked_fill():
  x, m = randn(3, 4), rng.random((1, 4)) > 0.5  # the mask broadcasts
  close(Tensor(x).masked_fill(Tensor(m), -1.5), np.where(m, -1.5, x))
  v = randn(3, 1)
  close(Tensor(x).masked_fill(Tensor(m), Tensor(v)), np.where(m, v, x))
  xi = np.arange(4, dtype=np.int32)
  got = Tensor(xi).masked_fill(Tensor([True, False, False, True]), 9)
  assert got.dtype == dtypes.int32 and got.tolist() == [9, 1, 2, 9]


def test_pad2d():
  x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
  close(Tensor(x).pad2d((1, 2, 0, 1)), np.pad(x, ((0, 0), (0, 1), (1, 2))))
  close(Tensor(x).pad2d((1, -1, -1, 0), value=7.0), np.pad(x, ((0, 0), (0, 0), (1, 0)), constant_values=7)[:, 1:, :-1])
  close(Tensor(x).pad2d((0, 1)), np.pad(x, ((0, 0), (0, 0), (0, 1))))
  with pytest.raises(ValueError, match="pairs"): Tensor(x).pad2d((1, 2, 3))


# ***** gather, scatter, scatter_reduce *****

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
  x = randn(3, 4)
  shape = (2, 6) if dim % 2 == 1 else (5, 3)  # any size along dim, no larger than x elsewhere (torch's rule)
  idx = rng.integers(0, x.shape[dim], shape).astype(np.int32)
  used = x[:shape[0], :] if dim % 2 == 1 else x[:, :shape[1]]
  close(Tensor(x).gather(dim, Tensor(idx)), np.take_along_axis(used, idx, dim))


def test_gather_ints_and_gradient():
  torch = pytest.importorskip("torch")
  xi = rng.integers(-50, 50, (2, 5)).astype(np.int32)
  idx = rng.integers(0, 5, (2, 7)).astype(np.int32)
  got = Tensor(xi).gather(1, Tensor(idx))
  assert got.dtype == dtypes.int32
  np.testing.assert_array_equal(got.numpy(), np.take_along_axis(xi, idx, 1))
  x, w = randn(2, 5), randn(2, 7)
  t = torch.tensor(x, requires_grad=True)
  (torch.gather(t, 1, torch.tensor(idx, dtype=torch.int64)) * torch.tensor(w)).sum().backward()
  xt = Tensor(x)
  (g,) = (xt.gather(1, Tensor(idx)) * Tensor(w)).sum().gradient(xt)
  close(g, t.grad.numpy())


def np_scatter(x, dim, idx, src):
  out = x.copy()
  for pos in np.ndindex(idx.shape):  # in order: a later write wins
    tgt = list(pos)
    tgt[dim] = idx[pos]
    out[tuple(tgt)] = src[pos]
  return out


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_last_write_wins(dim):
  x, src = randn(3, 5), randn(4, 6)
  idx = rng.integers(0, x.shape[dim], (2, 3) if dim == 1 else (3, 4)).astype(np.int32)
  close(Tensor(x).scatter(dim, Tensor(idx), Tensor(src)), np_scatter(x, dim, idx, src))
  got = Tensor(x).scatter(dim, Tensor(idx), 2.5)
  close(got, np_scatter(x, dim, idx, np.full(idx.shape, 2.5, np.float32)))


def test_scatter_reduce_modes_vs_torch():
  torch = pytest.importorskip("torch")
  x, src = randn(3, 5), randn(3, 4)
  idx = rng.integers(0, 5, (3, 4))
  for reduce in ("sum", "prod", "mean", "amax", "amin"):
    for include_self in (True, False):
      got = Tensor(x).scatter_reduce(1, Tensor(idx.astype(np.int32)), Tensor(src), reduce, include_self=include_self)
      want = torch.tensor(x).scatter_reduce(1, torch.tensor(idx), torch.tensor(src), reduce, include_self=include_self)
      close(got, want.numpy(), atol=1e-5)
  rows = idx[:2] % 3  # scatter along dim 0 of x (3 rows)
  for reduce, treduce in (("add", "sum"), ("multiply", "prod")):
    got = Tensor(x).scatter(0, Tensor(rows.astype(np.int32)), 1.5, reduce=reduce)
    want = torch.tensor(x).scatter_reduce(0, torch.tensor(rows), torch.full((2, 4), 1.5), treduce)
    close(got, want.numpy(), atol=1e-5)


def test_scatter_reduce_ints_mean_and_gradient():
  torch = pytest.importorskip("torch")
  xi, si = rng.integers(0, 20, (2, 4)).astype(np.int32), rng.integers(0, 20, (2, 3)).astype(np.int32)
  idx = np.array([[0, 0, 3], [1, 1, 1]])
  got = Tensor(xi).scatter_reduce(1, Tensor(idx.astype(np.int32)), Tensor(si), "mean")
  want = torch.tensor(xi).scatter_reduce(1, torch.tensor(idx), torch.tensor(si), "mean")
  np.testing.assert_array_equal(got.numpy(), want.numpy())
  x, src, w = randn(2, 4), randn(2, 3), randn(2, 4)
  tx, ts = torch.tensor(x, requires_grad=True), torch.tensor(src, requires_grad=True)
  (tx.scatter_reduce(1, torch.tensor(idx), ts, "sum") * torch.tensor(w)).sum().backward()
  a, b = Tensor(x), Tensor(src)
  ga, gb = (a.scatter_reduce(1, Tensor(idx.astype(np.int32)), b, "sum") * Tensor(w)).sum().gradient(a, b)
  close(ga, tx.grad.numpy())
  close(gb, ts.grad.numpy())


def test_gather_scatter_errors():
  x = Tensor.zeros(3, 4)
  with pytest.raises(ValueError, match=r"\(3,\)"): x.gather(0, Tensor([0, 1, 2]))
  with pytest.raises(TypeError, match="integer"): x.gather(0, Tensor([[0.5]]))
  with pytest.raises(ValueError, match=r"\(2, 5\)"): x.gather(0, Tensor.zeros(2, 5, dtype=dtypes.int32))
  with pytest.raises(IndexError, match="dim 5"): x.gather(5, Tensor([[0]]))
  with pytest.raises(TypeError, match="same dtype"): x.scatter(0, Tensor([[0]]), Tensor([[1]]))
  with pytest.raises(ValueError, match="'max'"): x.scatter_reduce(0, Tensor([[0]]), Tensor([[1.0]]), "max")
  with pytest.raises(ValueError, match="'sum'"): x.scatter(0, Tensor([[0]]), 1.0, reduce="sum")
