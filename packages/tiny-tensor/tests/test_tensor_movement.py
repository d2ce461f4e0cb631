"""Movement, indexing, creation and assignment against numpy."""
import numpy as np
import pytest

from tiny_tensor import Device, Tensor, dtypes

rng = np.random.default_rng(1)
A = rng.standard_normal((2, 3, 4)).astype(np.float32)


def close(t, ref, atol=1e-6):
  got, ref = t.numpy(), np.asarray(ref)
  assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
  np.testing.assert_allclose(got, ref, atol=atol, rtol=1e-6)


def test_reshape_view_permute_transpose():
  t = Tensor(A)
  close(t.reshape(6, 4), A.reshape(6, 4)); close(t.reshape(-1), A.reshape(-1))  # noqa: E702
  close(t.view(4, -1), A.reshape(4, -1))
  close(t.reshape((3, 8)), A.reshape(3, 8)); close(t.reshape(None, 12), A.reshape(2, 12))  # noqa: E702
  close(t.permute(2, 0, 1), A.transpose(2, 0, 1)); close(t.permute((-1, 1, 0)), A.transpose(2, 1, 0))  # noqa: E702
  close(t.transpose(0, 2), A.swapaxes(0, 2)); close(Tensor(A[0]).T, A[0].T)  # noqa: E702
  close(t.transpose(), A.swapaxes(1, 0))


def test_expand_flatten_squeeze():
  t = Tensor(A[:, :1])
  close(t.expand(2, 5, 4), np.broadcast_to(A[:, :1], (2, 5, 4))); close(t.expand(3, -1, 3, -1), np.broadcast_to(A[:,
    :1], (3, 2, 3, 4)))  # noqa: E501,E702
  close(Tensor(A).flatten(), A.reshape(-1)); close(Tensor(A).flatten(1), A.reshape(2, 12))  # noqa: E702
  close(Tensor(A).flatten(0, 1), A.reshape(6, 4))
  close(Tensor(A).unflatten(2, (2, 2)), A.reshape(2, 3, 2, 2))
  close(t.squeeze(), A[:, 0]); close(t.squeeze(1), A[:, 0]); close(t.squeeze(0), A[:, :1])  # noqa: E702
  close(Tensor(A).unsqueeze(0), A[None]); close(Tensor(A).unsqueeze(-1), A[..., None])  # noqa: E702
  assert Tensor(3.0).flatten().shape == (1,)


def test_flip_shrink_pad_constant():
  t = Tensor(A)
  close(t.flip(0), A[::-1]); close(t.flip((1, 2)), A[:, ::-1, ::-1]); close(t.flip(-1), A[..., ::-1])  # noqa: E702
  close(t.shrink(((0, 1), None, (1, 3))), A[0:1, :, 1:3])
  close(t.pad((1, 2)), np.pad(A, ((0, 0), (0, 0), (1, 2))))
  close(t.pad((1, 2, 0, 1)), np.pad(A, ((0, 0), (0, 1), (1, 2))))
  close(t.pad(((1, 0), None, (0, 2))), np.pad(A, ((1, 0), (0, 0), (0, 2))))
  close(t.pad((1, 1), value=5.0), np.pad(A, ((0, 0), (0, 0), (1, 1)), constant_values=5.0))
  close(t.pad((-1, 1)), np.pad(A[..., 1:], ((0, 0), (0, 0), (0, 1))))
  close(Tensor([1, 2, 3]).pad((1, 1), value=-1), np.array([-1, 1, 2, 3, -1]))


@pytest.mark.parametrize("mode,npmode", [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")])
def test_pad_modes(mode, npmode):
  t = Tensor(A)
  close(t.pad((2, 1), mode=mode), np.pad(A, ((0, 0), (0, 0), (2, 1)), mode=npmode))
  close(t.pad((1, 2, 2, 0), mode=mode), np.pad(A, ((0, 0), (2, 0), (1, 2)), mode=npmode))


def test_cat_stack_split_chunk_repeat():
  a, b = A, rng.standard_normal((2, 2, 4)).astype(np.float32)
  close(Tensor(a).cat(Tensor(b), dim=1), np.concatenate([a, b], 1))
  close(Tensor.cat(Tensor(a), Tensor(a), dim=-1), np.concatenate([a, a], -1))
  close(Tensor(a).stack(Tensor(a), dim=1), np.stack([a, a], 1))
  close(Tensor.stack(Tensor(a), Tensor(a)), np.stack([a, a]))
  assert Tensor([True]).cat(Tensor([False])).tolist() == [True, False]
  assert Tensor([1, 2]).cat(Tensor([0.5])).tolist() == [1.0, 2.0, 0.5]
  parts = Tensor(A).split(2, dim=2)
  assert [p.shape for p in parts] == [(2, 3, 2), (2, 3, 2)]
  close(parts[1], A[..., 2:])
  parts = Tensor(A).split([1, 2], dim=1)
  close(parts[0], A[:, :1]); close(parts[1], A[:, 1:])  # noqa: E702
  assert [c.shape for c in Tensor(A).chunk(2, 1)] == [(2, 2, 4), (2, 1, 4)]
  close(Tensor(A).repeat(2, 1, 2), np.tile(A, (2, 1, 2)))
  close(Tensor(A[0]).repeat(2, 1, 1), np.tile(A[0], (2, 1, 1)))
  close(Tensor(A).repeat_interleave(2, dim=1), np.repeat(A, 2, 1))
  close(Tensor(A).repeat_interleave(3), np.repeat(A, 3))


BASIC_INDICES = [
  1, -1, (0, 1), (1, -2, 3), slice(None), slice(1, None), (slice(None), slice(0, 3, 2)), (..., 1), (..., slice(None,
    None, -1)),
  (None, 0), (0, None, slice(1, 3)), (slice(None, None, -2), slice(3, 0, -1)), (Ellipsis, None), (slice(5, 10),),
  (slice(None), slice(2, 1)), (1, ..., slice(-3, None, 2)), (slice(-1, None, -3), None, 2),
]


@pytest.mark.parametrize("idx", BASIC_INDICES, ids=[str(i) for i in BASIC_INDICES])
def test_getitem_basic(idx):
  close(Tensor(A)[idx], A[idx])


def test_getitem_tensor_and_list_indices():
  t = Tensor(A)
  close(t[[1, 0]], A[[1, 0]]); close(t[:, [2, 0, 2]], A[:, [2, 0, 2]])  # noqa: E702
  close(t[Tensor([-1, 0])], A[[-1, 0]])
  close(t[:, Tensor([[0, 1], [2, 2]])], A[:, [[0, 1], [2, 2]]])
  close(t[Tensor([0, 1]), :, Tensor([3, 2])], A[[0, 1], :, [3, 2]])      # non-adjacent: new dims first
  close(t[:, Tensor([0, 2]), Tensor([1, 3])], A[:, [0, 2], [1, 3]])     # adjacent: new dims in place
  close(t[1, Tensor([0, 2])], A[1, [0, 2]])
  m = A > 0
  close(t[Tensor(m)], A[m]); close(t[Tensor(m[:, :, 0])], A[m[:, :, 0]])  # noqa: E702
  ti = Tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
  close(ti[Tensor([2, 0])], np.arange(12).reshape(3, 4)[[2, 0]])
  close(Tensor([True, False, True])[Tensor([2, 0])], np.array([True, True]))
  close(t[np.int64(1), Tensor(2)], A[1, 2]); close(t[np.array([1, 0])], A[[1, 0]])  # noqa: E702


def test_setitem():
  base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  cases = [(0, 7.0), ((1, 2), np.arange(4, dtype=np.float32)), ((slice(None), slice(0, 3, 2), -1), -1.0),
           ((..., slice(None, None, -2)), 9.0), ((slice(None), [0, 2]), 5.0), ((0, slice(1, 3), 1), np.array([3.0,
             4.0]))]
  for idx, v in cases:
    t, ref = Tensor(base.copy()), base.copy()
    t[idx] = v
    ref[idx] = v
    close(t, ref)
  t = Tensor(base.copy())
  t[1] = Tensor(np.ones((3, 4), np.float32)) * 2
  ref = base.copy(); ref[1] = 2  # noqa: E702
  close(t, ref)
  lazy = Tensor.zeros(3, 3).contiguous() + 0
  lazy[1, 1] = 4.0
  assert lazy.tolist() == [[0, 0, 0], [0, 4, 0], [0, 0, 0]]


def test_assign_inplace_ops():
  t = Tensor([1.0, 2.0, 3.0])
  buf_before = t.uop
  t += 1
  t *= 2
  assert t.tolist() == [4.0, 6.0, 8.0]
  t.assign(Tensor([0.0, 0.0, 1.0]))
  assert t.tolist() == [0.0, 0.0, 1.0]
  assert buf_before.op.name == "BUFFER" and t.uop.op.name in ("BUFFER", "RESHAPE")
  i = Tensor([1, 2])
  with pytest.raises(RuntimeError, match="dtype"): i += 1.5
  assert i.tolist() == [1, 2]


def test_assign_into_a_transposed_view():
  t = Tensor(np.zeros((2, 3), np.float32))
  t.T.assign(Tensor(np.arange(6, dtype=np.float32).reshape(3, 2)))
  np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(3, 2).T)
  # a broadcast view has no one-to-one place in the buffer: a clear error, and the buffer is untouched
  with pytest.raises(RuntimeError, match="EXPAND"): t.reshape(2, 1, 3).expand(2, 2, 3).assign(Tensor.ones(2, 2, 3))
  np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(3, 2).T)


def test_creation():
  close(Tensor.zeros(2, 3), np.zeros((2, 3))); close(Tensor.ones((2, 3)), np.ones((2, 3)))  # noqa: E702
  close(Tensor.full((2, 2), 7), np.full((2, 2), 7)); assert Tensor.full((2,), 7).dtype == dtypes.int32  # noqa: E702
  close(Tensor.zeros(2, 3).zeros_like(), np.zeros((2, 3))); close(Tensor([1, 2]).ones_like(), np.ones(2))  # noqa: E702
  assert Tensor([1, 2]).full_like(3.5).dtype == dtypes.int32 and Tensor([1.0]).full_like(3).tolist() == [3.0]
  close(Tensor.arange(5), np.arange(5)); close(Tensor.arange(2, 10, 3), np.arange(2, 10, 3))  # noqa: E702
  close(Tensor.arange(5, 0, -2), np.arange(5, 0, -2))
  close(Tensor.arange(0, 1, 0.25), np.arange(0, 1, 0.25))
  assert Tensor.arange(3).dtype == dtypes.int32 and Tensor.arange(3.0).dtype == dtypes.float32
  assert Tensor.arange(0).shape == (0,) and Tensor.arange(5, 2).shape == (0,)
  close(Tensor.arange(4, dtype=dtypes.float16), np.arange(4))
  close(Tensor.linspace(0, 1, 5), np.linspace(0, 1, 5))
  close(Tensor.linspace(-2, 2, 1), np.linspace(-2, 2, 1))
  close(Tensor.eye(3), np.eye(3)); close(Tensor.eye(2, 4), np.eye(2, 4))  # noqa: E702
  close(Tensor.eye(4, 2), np.eye(4, 2))
  close(Tensor.eye(5, 3), np.eye(5, 3))


def test_constants_are_lazy_graphs():
  # full/arange/eye are built from CONST + movement/ALU/REDUCE ops, no buffers: they fold into their consumers
  for t in (Tensor.full((3, 3), 2.0), Tensor.arange(8), Tensor.eye(4), Tensor.linspace(0, 1, 4)):
    ops = {u.op.name for u in t.uop.toposort()}
    assert "BUFFER" not in ops and "CONST" in ops, ops


def test_to_device_and_clone():
  t = Tensor([1.0, 2.0])
  assert t.device == Device.DEFAULT and t.to(Device.DEFAULT) is t and t.to(None) is t
  c = t.clone()
  assert c.tolist() == [1.0, 2.0] and c.uop is not t.uop
