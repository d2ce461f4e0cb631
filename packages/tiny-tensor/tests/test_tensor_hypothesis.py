"""Property tests against numpy: random indexing, broadcasting and reductions."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny_tensor import Tensor

shapes = st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple)


@st.composite
def shape_and_index(draw):
  shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
  idx = []
  for s in shape:
    kind = draw(st.sampled_from(["int", "slice", "none"]))
    if kind == "int": idx.append(draw(st.integers(-s, s - 1)))
    elif kind == "slice":
      bound = st.one_of(st.none(), st.integers(-s - 2, s + 2))
      start, stop = draw(bound), draw(bound)
      step = draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
      idx.append(slice(start, stop, step))
    else:
      idx.append(None)
      idx.append(slice(None))
  return shape, tuple(idx)


@settings(max_examples=50)
@given(shape_and_index())
def test_getitem_matches_numpy(si):
  shape, idx = si
  a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
  got = Tensor(a)[idx].numpy()
  ref = a[idx]
  assert got.shape == ref.shape and np.array_equal(got, ref)


@settings(max_examples=30)
@given(shape_and_index(), st.integers(-50, 50))
def test_setitem_matches_numpy(si, v):
  shape, idx = si
  a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
  t = Tensor(a.copy())
  t[idx] = v
  a[idx] = v
  assert np.array_equal(t.numpy(), a)


@st.composite
def broadcastable(draw):
  out = draw(st.lists(st.integers(0, 3), min_size=0, max_size=3))
  def sub():
    k = draw(st.integers(0, len(out)))
    return tuple(1 if draw(st.booleans()) else s for s in out[len(out) - k:])
  return sub(), sub()


@settings(max_examples=40)
@given(broadcastable(), st.sampled_from(["add", "mul", "sub", "maximum", "lt"]))
def test_broadcast_binary_matches_numpy(shapes_ab, op):
  sa, sb = shapes_ab
  rng = np.random.default_rng(len(sa) * 7 + len(sb))
  a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
  ref = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum, "lt": np.less}[op](a, b)
  t = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "sub": lambda x, y: x - y,
       "maximum": lambda x, y: x.maximum(y), "lt": lambda x, y: x < y}[op](Tensor(a), Tensor(b))
  got = t.numpy()
  assert got.shape == ref.shape
  np.testing.assert_allclose(got, ref, rtol=1e-6)


@settings(max_examples=40)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.data())
def test_reduce_matches_numpy(shape, data):
  axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
  keepdim = data.draw(st.booleans())
  a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
  t = Tensor(a)
  np.testing.assert_allclose(t.sum(axis, keepdim).numpy(), a.sum(axis, keepdims=keepdim), atol=1e-5)
  np.testing.assert_allclose(t.max(axis, keepdim).numpy(), a.max(axis, keepdims=keepdim))
  np.testing.assert_allclose(t.mean(axis, keepdim).numpy(), a.mean(axis, keepdims=keepdim), atol=1e-6)
  if axis is not None: np.testing.assert_array_equal(t.argmax(axis).numpy(), a.argmax(axis))
