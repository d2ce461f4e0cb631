"""tiny_tensor.nnops' tinygrad extras against numpy/torch: unfold, diagonal, diag, meshgrid, rearrange, normalize,
softmin, multinomial and randperm."""
import numpy as np
import pytest
from tiny_tensor import Tensor, dtypes

rng = np.random.default_rng(2)


@pytest.mark.parametrize("shape,dim,size,step", [((7,), 0, 3, 2), ((2, 6, 3), 1, 2, 1), ((4, 5), -1, 5, 3),
                                                 ((5, 2), 0, 1, 4)])
def test_unfold(shape, dim, size, step):
  torch = pytest.importorskip("torch")
  x = rng.standard_normal(shape).astype(np.float32)
  want = torch.tensor(x).unfold(dim, size, step).numpy()
  np.testing.assert_array_equal(Tensor(x).unfold(dim, size, step).numpy(), want)


def test_unfold_errors():
  with pytest.raises(ValueError, match="size=4"): Tensor.zeros(3).unfold(0, 4, 1)
  with pytest.raises(ValueError, match="step=0"): Tensor.zeros(3).unfold(0, 2, 0)


@pytest.mark.parametrize("shape,offset,d1,d2", [((3, 3), 0, 0, 1), ((3, 4), 1, 0, 1), ((4, 3), -2, 0, 1),
                                                ((2, 3, 4), 0, 1, 2), ((2, 3, 4), 1, 2, 0), ((3, 3), 5, 0, 1)])
def test_diagonal(shape, offset, d1, d2):
  x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
  np.testing.assert_array_equal(Tensor(x).diagonal(offset, d1, d2).numpy(), np.diagonal(x, offset, d1, d2))


def test_diag_and_errors():
  np.testing.assert_array_equal(Tensor([1.0, 2.0, 3.0]).diag().numpy(), np.diag([1.0, 2.0, 3.0]))
  assert Tensor.zeros(0).diag().shape == (0, 0)
  with pytest.raises(ValueError, match=r"\(2, 2\)"): Tensor.zeros(2, 2).diag()
  with pytest.raises(ValueError, match="same dim"): Tensor.zeros(2, 2).diagonal(0, 1, -1)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing):
  a, b, c = np.arange(2), np.arange(3) + 10, np.arange(4) + 20
  got = Tensor(a).meshgrid(Tensor(b), Tensor(c), indexing=indexing)
  for g, w in zip(got, np.meshgrid(a, b, c, indexing=indexing)): np.testing.assert_array_equal(g.numpy(), w)
  with pytest.raises(ValueError, match="'yx'"): Tensor(a).meshgrid(Tensor(b), indexing="yx")


@pytest.mark.parametrize("formula,shape,sizes,ref", [
  ("a b -> b a", (2, 3), {}, lambda x: x.T),
  ("b (h w) c -> b c h w", (2, 6, 3), {"h": 2}, lambda x: x.reshape(2, 2, 3, 3).transpose(0, 3, 1, 2)),
  ("b c h w -> b (h w c)", (2, 3, 2, 2), {}, lambda x: x.transpose(0, 2, 3, 1).reshape(2, 12)),
  ("... h w -> ... w h", (2, 3, 4, 5), {}, lambda x: x.swapaxes(-1, -2)),
  ("a ... -> ... a", (2, 3, 4), {}, lambda x: np.moveaxis(x, 0, -1)),
  ("a 1 b -> b a", (2, 1, 3), {}, lambda x: x[:, 0].T),
  ("a b -> a 1 b ()", (2, 3), {}, lambda x: x.reshape(2, 1, 3, 1)),
  ("(a b) c -> c b a", (6, 2), {"b": 3}, lambda x: x.reshape(2, 3, 2).transpose(2, 1, 0)),
])
def test_rearrange(formula, shape, sizes, ref):
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  np.testing.assert_array_equal(Tensor(x).rearrange(formula, **sizes).numpy(), ref(x))


@pytest.mark.parametrize("formula,sizes,needle", [
  ("a b c -> a", {}, "names 3 dims"), ("a b -> b", {}, "same axes"), ("a (b c) -> a b c", {"b": 4}, "size 6"),
  ("a b -> b a", {"z": 2}, "'z'"), ("a b c -> a b c", {}, "shape"), ("a b", {}, "'->'"), ("a (b -> a b", {}, "unbal"),
  ("a b$ -> a", {}, "'b\\$'"),
])
def test_rearrange_errors(formula, sizes, needle):
  with pytest.raises(ValueError, match=needle): Tensor.zeros(2, 6).rearrange(formula, **sizes)


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 0), (3.0, -1), (0, 1)])
def test_normalize_and_softmin(p, dim):
  torch = pytest.importorskip("torch")
  x = rng.standard_normal((3, 4)).astype(np.float32)
  x[1, 2] = 0.0
  want = torch.nn.functional.normalize(torch.tensor(x), p=p, dim=dim).numpy()
  np.testing.assert_allclose(Tensor(x).normalize(p, dim).numpy(), want, rtol=1e-5, atol=1e-6)
  want = torch.nn.functional.softmin(torch.tensor(x), dim).numpy()
  np.testing.assert_allclose(Tensor(x).softmin(dim).numpy(), want, rtol=1e-5)


def test_multinomial_with_replacement_follows_weights():
  Tensor.manual_seed(3)
  w = np.array([[0.0, 1.0, 3.0, 0.0], [5.0, 0.0, 0.0, 5.0]], np.float32)
  s = Tensor(w).multinomial(4000, replacement=True).numpy()
  assert s.shape == (2, 4000) and s.dtype == np.int32
  assert set(np.unique(s[0])) <= {1, 2} and set(np.unique(s[1])) <= {0, 3}  # zero weight: never drawn
  assert abs((s[0] == 2).mean() - 0.75) < 0.04 and abs((s[1] == 0).mean() - 0.5) < 0.04
  one = Tensor([1, 0, 0]).multinomial()
  assert one.shape == (1,) and one.tolist() == [0]


def test_multinomial_without_replacement_draws_distinct():
  Tensor.manual_seed(4)
  s = Tensor(np.ones((3, 5), np.float32)).multinomial(5).numpy()
  for row in s: assert sorted(row.tolist()) == [0, 1, 2, 3, 4]
  heavy = Tensor(np.array([1e-6, 1e-6, 100.0, 1e-6], np.float32)).multinomial(2).numpy()
  assert heavy[0] == 2 and heavy[1] != 2
  with pytest.raises(ValueError, match="5 samples"): Tensor.ones(4).multinomial(5)
  with pytest.raises(ValueError, match=r"\(2, 2, 2\)"): Tensor.ones(2, 2, 2).multinomial()


def test_randperm():
  Tensor.manual_seed(5)
  p = Tensor.randperm(17)
  assert p.dtype == dtypes.int32 and sorted(p.tolist()) == list(range(17))
  assert p.tolist() != list(range(17))  # 1/17! chance of failing for a correct permutation
  assert Tensor.randperm(4, dtype=dtypes.int64).dtype == dtypes.int64


def test_ops_on_the_python_device_match_cpu():
  """The PYTHON device interprets kernels with GPU semantics: the same ops there must give the CPU's numbers, and
  every constant the ops create (arange, ones, rand) must land on the input's device."""
  try:
    Tensor([1.0], device="PYTHON").realize()
  except Exception as e:
    pytest.skip(f"the PYTHON device is unavailable: {type(e).__name__}: {e}")
  x, w = rng.standard_normal((1, 2, 4, 4)).astype(np.float32), rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
  def run(dev: str) -> list[np.ndarray]:
    X, W = Tensor(x, device=dev), Tensor(w, device=dev)
    v, i = X.reshape(-1).sort(descending=True)
    outs = [X.conv2d(W, padding=1), X.max_pool2d(return_indices=True)[1], X.interpolate((3, 5)), v, i,
            X.cumsum(-1), X.reshape(2, 16).sparse_categorical_crossentropy(Tensor([3, 1], device=dev)), X.triu()]
    assert all(o.device == dev for o in outs), [o.device for o in outs]
    return [o.numpy() for o in outs]
  for a, b in zip(run("PYTHON"), run("CPU")): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


GRAD_CASES = {  # name: (input shapes, tiny fn(*tensors), reference fn(torch, *torch tensors))
  "einsum": ([(2, 3), (3, 4)], lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda T, a, b: a @ b),
  "einsum_diag": ([(3, 3)], lambda a: Tensor.einsum("ii->i", a), lambda T, a: a.diagonal()),
  "cumprod": ([(3, 4)], lambda a: a.cumprod(1), lambda T, a: a.cumprod(1)),
  "cummax": ([(3, 4)], lambda a: a.cummax(0)[0], lambda T, a: a.cummax(0)[0]),
  "logcumsumexp": ([(3, 4)], lambda a: a.logcumsumexp(1), lambda T, a: a.logcumsumexp(1)),
  "unfold": ([(2, 7)], lambda a: a.unfold(1, 3, 2), lambda T, a: a.unfold(1, 3, 2)),
  "normalize": ([(3, 4)], lambda a: a.normalize(), lambda T, a: T.nn.functional.normalize(a)),
  "roll": ([(3, 4)], lambda a: a.roll((1, -2), (0, 1)), lambda T, a: a.roll((1, -2), (0, 1))),
  "tril": ([(3, 4)], lambda a: a.tril(1), lambda T, a: a.tril(1)),
  "diagonal": ([(3, 4)], lambda a: a.diagonal(-1), lambda T, a: a.diagonal(-1)),
  "rearrange": ([(2, 6)], lambda a: a.rearrange("a (b c) -> c a b", b=2),
                lambda T, a: a.reshape(2, 2, 3).permute(2, 0, 1)),
  "pad2d": ([(2, 3)], lambda a: a.pad2d((1, -1, 2, 0)), lambda T, a: T.nn.functional.pad(a, (1, -1, 2, 0))),
  "topk": ([(3, 5)], lambda a: a.topk(2)[0], lambda T, a: a.topk(2)[0]),
  "scatter": ([(3, 4), (2, 4)], lambda a, s: a.scatter(0, Tensor([[0, 2, 1, 0], [1, 0, 2, 2]]), s),
              lambda T, a, s: a.scatter(0, T.tensor([[0, 2, 1, 0], [1, 0, 2, 2]]), s)),
}


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradients_vs_torch(name):
  torch = pytest.importorskip("torch")
  shapes, tiny_fn, torch_fn = GRAD_CASES[name]
  xs = [rng.permutation(int(np.prod(s))).astype(np.float32).reshape(s) / 4 + 0.5 for s in shapes]  # no ties
  ts = [torch.tensor(x, requires_grad=True) for x in xs]
  ref = torch_fn(torch, *ts)
  w = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
  (ref * torch.tensor(w)).sum().backward()
  tx = [Tensor(x) for x in xs]
  out = tiny_fn(*tx)
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
  for g, t in zip((out * Tensor(w)).sum().gradient(*tx), ts):
    np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)
