"""assign into a view of a realized buffer (tinygrad's `t[a:b].assign(x)`, `t.shrink(...).assign(x)`): one kernel over
the view's elements writes them in the base buffer; the rest of the buffer is untouched; other tensors on the buffer
see the write, lazy readers made before it the old values; under TinyJit a Variable offset replays at the bound
position. Checked against numpy's in-place writes."""
import re

import numpy as np
import pytest
from tiny_tensor import Tensor, TinyJit, Variable, engine
from tiny_tensor.engine import GlobalCounters


def _kernels(fn) -> list:
  calls: list = []
  with engine.capture(calls.append): fn()
  return [c for c in calls if c.kind == "kernel"]


def _loop_size(name: str) -> int:
  """The output elements a kernel loops over: its name is its output shape (E_4_6, r_1_2_64n1)."""
  return int(np.prod([int(d) for d in re.sub(r"n\d+$", "", name).split("_")[1:]]))


A = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)

# (target view of the tensor, the same view of the numpy array) pairs
VIEWS = [
  (lambda t: t[1:3], lambda a: a[1:3]),
  (lambda t: t[2, 1:4, 3:6], lambda a: a[2, 1:4, 3:6]),
  (lambda t: t.shrink(((0, 4), (2, 3), (1, 5))), lambda a: a[:, 2:3, 1:5]),
  (lambda t: t[1:4].shrink(((1, 2), None, (0, 2))), lambda a: a[1:4][1:2, :, 0:2]),  # a shrink of a shrink
  (lambda t: t.permute(2, 0, 1)[3:5], lambda a: a.transpose(2, 0, 1)[3:5]),      # through a permute
  (lambda t: t.flip(1)[0, 0:2], lambda a: a[:, ::-1][0, 0:2]),                      # through a flip
  (lambda t: t.reshape(20, 6)[7:13], lambda a: a.reshape(20, 6)[7:13]),            # a contiguous range, reshaped
  (lambda t: t[1:3].reshape(10, 6).permute(1, 0)[2:4], lambda a: a[1:3].reshape(10, 6).T[2:4]),
]


@pytest.mark.parametrize("i", range(len(VIEWS)))
def test_assign_into_a_view_writes_only_its_elements(i):
  tview, aview = VIEWS[i]
  t, a = Tensor(A.copy()).realize(), A.copy()
  other = t.reshape(120)  # another tensor on the same buffer
  shape = aview(a).shape
  val = -1.0 - np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  v = Tensor(val).realize()
  ks = _kernels(lambda: tview(t).assign(v))
  aview(a)[...] = val
  assert len(ks) == 1 and _loop_size(ks[0].spec.name) == val.size, [k.spec.name for k in ks]
  np.testing.assert_array_equal(t.numpy(), a)  # the view's elements written, every other one untouched
  np.testing.assert_array_equal(other.numpy(), a.reshape(120))


def test_lazy_readers_see_the_old_values_and_views_the_new():
  t = Tensor(A.copy()).realize()
  old = t.sum(axis=2)  # a lazy read made before the write
  view = t[2:4]
  t[1:3, 0].assign(Tensor.full((2, 6), 7.0))
  a = A.copy()
  a[1:3, 0] = 7.0
  np.testing.assert_array_equal(old.numpy(), A.sum(axis=2))
  np.testing.assert_array_equal(view.numpy(), a[2:4])
  np.testing.assert_array_equal((t * 1).numpy(), a)
  # a value that reads the target at other elements (a row copied onto the next)
  t[1:4].assign(t[0:3])
  a[1:4] = a[0:3].copy()
  np.testing.assert_array_equal(t.numpy(), a)


def test_basic_setitem_writes_only_the_box():
  t, a = Tensor(A.copy()).realize(), A.copy()
  ks = _kernels(lambda: t.__setitem__((slice(1, 3), 2, slice(None, None, -1)), Tensor(np.ones(6, np.float32))))
  a[1:3, 2, ::-1] = 1.0
  assert len(ks) == 1 and _loop_size(ks[0].spec.name) == 12, [k.spec.name for k in ks]
  np.testing.assert_array_equal(t.numpy(), a)
  # a box that is the whole buffer (reshaped) still lands in this tensor
  for idx in ((None, slice(None)), slice(None), Ellipsis):
    u, b = Tensor(np.arange(3, dtype=np.int32)).realize(), np.arange(3, dtype=np.int32)
    u[idx] = 7
    b[idx] = 7
    np.testing.assert_array_equal(u.numpy(), b)


def test_variable_offset_replays_at_the_bound_position_with_constant_kernels():
  cache, want = Tensor.zeros(16, 2, 3).contiguous().realize(), np.zeros((16, 2, 3), np.float32)
  pos = Variable("pos", 0, 15)

  @TinyJit
  def put(x: Tensor, p) -> Tensor:
    cache.shrink(((p, p + 1), None, None)).assign((x * 2).reshape(1, 2, 3))
    return cache.shrink(((0, p + 1), None, None)).sum(axis=0).realize()

  counts = []
  for k in (0, 9, 3, 15, 4, 1, 12):
    x = np.full((2, 3), k + 1.0, np.float32) + np.arange(6, dtype=np.float32).reshape(2, 3)
    GlobalCounters.reset()
    got = put(Tensor(x).realize(), pos.bind(k)).numpy()
    counts.append(GlobalCounters.kernel_count)
    want[k] = 2 * x
    np.testing.assert_allclose(got, want[:k + 1].sum(axis=0))
    np.testing.assert_array_equal(cache.numpy(), want)
  assert len(set(counts)) == 1 and put.captured is not None and put.captured.kernel_count == counts[0] == 2


def test_views_without_a_place_in_the_buffer_are_refused():
  t = Tensor(A.copy()).realize()
  with pytest.raises(RuntimeError, match="EXPAND"): t[0:1].expand(3, 5, 6).assign(Tensor.zeros(3, 5, 6))
  with pytest.raises(RuntimeError, match="PAD"): t.pad(((0, 1), None, None)).assign(Tensor.zeros(5, 5, 6))
  np.testing.assert_array_equal(t.numpy(), A)


def test_assign_into_a_view_on_mock_amd():
  t = Tensor(A.copy(), device="MOCK+AMD").realize()
  p = Variable("p", 0, 3)
  for k in (2, 0):
    t.shrink(((p.bind(k), p.bind(k) + 1), (1, 3), None)).assign(Tensor.full((1, 2, 6), -5.0 - k, device="MOCK+AMD"))
  a = A.copy()
  a[2, 1:3], a[0, 1:3] = -7.0, -5.0
  np.testing.assert_array_equal(t.numpy(), a)
