"""Slicing by a bound Variable (issue #35): a symbolic stop or start gives a dim of symbolic size (`a[:, :i]`,
`a[:, -i:]`), a symbolic offset with a constant length a plain dim (`a[j:j+2]`, with a step too), reductions over the
symbolic dim, setitem at such a slice, and TinyJit replaying one capture for every value of the Variable. Checked
against numpy."""
import numpy as np
import pytest
from tiny_tensor import Tensor, TinyJit, Variable
from tiny_tensor.engine import GlobalCounters

A = np.arange(60, dtype=np.float32).reshape(6, 10)
I = Variable("i", 1, 10)  # a stop over the 10 columns
J = Variable("j", 0, 2)   # an offset over the 6 rows, room for 4 rows after it


def test_slice_to_a_variable_has_a_symbolic_dim():
  a = Tensor(A).realize()
  for k in (3, 1, 10):
    s = a[:, :I.bind(k)]
    assert s.shape[0] == 6 and not isinstance(s.shape[1], int)
    np.testing.assert_allclose(s.sum(1).numpy(), A[:, :k].sum(1))
    np.testing.assert_allclose(s.max(1).numpy(), A[:, :k].max(1))
    np.testing.assert_allclose(s.mean(1).numpy(), A[:, :k].mean(1), rtol=1e-6)
    np.testing.assert_allclose(a[:, I.bind(k):].sum(1).numpy(), A[:, k:].sum(1))
    np.testing.assert_allclose(a[:, -I.bind(k):].sum(1).numpy(), A[:, -k:].sum(1))  # negative: from the end


def test_slice_at_a_variable_offset_with_constant_length():
  a = Tensor(A).realize()
  for m in (0, 2, 1):
    j = J.bind(m)
    np.testing.assert_array_equal(a[j:j + 2].numpy(), A[m:m + 2])
    np.testing.assert_array_equal(a[j + 1, j:j + 3].numpy(), A[m + 1, m:m + 3])


def test_slice_with_a_step():
  a = Tensor(A).realize()
  for m in (0, 1, 2):
    j = J.bind(m)
    np.testing.assert_array_equal(a[j:j + 4:2].numpy(), A[m:m + 4:2])
    np.testing.assert_array_equal(a[1, j:j + 8:3].numpy(), A[1, m:m + 8:3])
  # a step over a symbolic length would make a dim of size ceil(i/2): refused, as tinygrad does (TypeError)
  with pytest.raises(TypeError, match="constant length"): a[:, :I.bind(3):2]
  with pytest.raises(TypeError, match="positive int step"): a[:, :I.bind(3):-1]


def test_reductions_over_a_symbolic_axis():
  a = Tensor(A).realize()
  for k in (4, 1, 10):
    i = I.bind(k)
    np.testing.assert_allclose(a[:, :i].sum().item(), A[:, :k].sum())
    col = a[:, :i].sum(0)  # (i,)
    assert not isinstance(col.shape[0], int)
    np.testing.assert_allclose(col.max().item(), A[:, :k].sum(0).max())
    np.testing.assert_allclose((a[:, :i] * 2).sum(1).numpy(), (A[:, :k] * 2).sum(1))


def test_symbolic_slices_out_of_bounds_are_refused():
  a = Tensor(A).realize()
  with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 6"): a[:I.bind(3)]  # i up to 10 > 6
  with pytest.raises(IndexError, match="negative for some values"): a[:, I.bind(3) - 5:]
  with pytest.raises(IndexError, match="length"): a[:, I.bind(5):5]


def test_setitem_at_a_symbolic_slice():
  for lazy in (False, True):
    t = Tensor(A.copy()) * 1 if lazy else Tensor(A.copy()).realize()
    t[:, :I.bind(4)] = 0.0
    t[J.bind(1):J.bind(1) + 2, 5] = -1.0
    a = A.copy()
    a[:, :4] = 0.0
    a[1:3, 5] = -1.0
    np.testing.assert_array_equal(t.numpy(), a)


def test_tinyjit_replays_one_capture_for_every_value():
  a = Tensor(A).realize()

  @TinyJit
  def f(x: Tensor, i, j) -> list[Tensor]:
    return [t.realize() for t in (x[:, :i].sum(1) + x[j:j + 4:2].sum(), x[:, -i:].max(1), x[j:j + 2, i:].sum())]

  counts, caps = [], []
  for k, m in [(3, 0), (7, 2), (1, 1), (10, 0), (5, 2), (2, 1)]:
    GlobalCounters.reset()
    got = f(a, I.bind(k), J.bind(m))
    counts.append(GlobalCounters.kernel_count)
    caps.append(f.captured)
    np.testing.assert_allclose(got[0].numpy(), A[:, :k].sum(1) + A[m:m + 4:2].sum())
    np.testing.assert_allclose(got[1].numpy(), A[:, -k:].max(1))
    np.testing.assert_allclose(got[2].numpy(), A[m:m + 2, k:].sum())
  assert f.captured is not None and len(set(counts)) == 1 and counts[0] == f.captured.kernel_count
  assert all(c is f.captured for c in caps[1:])  # captured on the second call, replayed for every other value


@pytest.mark.parametrize("names", [("x.0", "esc_x_2e_0"), ("batch size", "n-1")])
def test_variable_names_that_are_not_identifiers(names):
  # ONNX names an unknown dim "x.0", a dim_param may hold any string: every renderer (C, OpenCL, PTX, LLVM IR) spells
  # the kernel argument as a legal identifier, and a name that looks like an escaped one does not collide with it
  u, v = Variable(names[0], 1, 6), Variable(names[1], 1, 10)
  a = Tensor(A).realize()
  for k, m in ((3, 7), (6, 2)):
    s = a[:u.bind(k), :v.bind(m)]
    np.testing.assert_allclose(s.sum().numpy(), A[:k, :m].sum())
    np.testing.assert_allclose((s * 2 - 1).max().numpy(), (A[:k, :m] * 2 - 1).max())
