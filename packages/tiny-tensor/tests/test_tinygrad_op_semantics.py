"""tinygrad 0.14 op behaviour and error types (issue #35).

One test per reported case: numbers against torch, and the exception type tinygrad 0.14 raises, hard-coded (with
tinygrad's message in a comment) so the test stands without tinygrad. Then one parametrized test runs a sweep of
validation paths (bad dims, shapes, dtypes, indices, pad modes, ...) on both libraries, tinygrad on its PYTHON device,
and checks that ours raises an instance of tinygrad's exception type (or computes the same numbers). Where we differ on
purpose (tinygrad raises a raw AssertionError or crashes, or torch defines another answer), the case is in INTENDED
with the reason, and the README's "Intended differences from tinygrad 0.14" says so.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor

rng = np.random.default_rng(35)


def _arange(*shape: int) -> np.ndarray:
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


# ***** fancy indexing with tuples / lists of lists *****

@pytest.mark.parametrize("index", [[[0, 1], [2, 0]], [(0, 2), (1, 3)], ((0, 2),), ([0, 2], [1, 3]),
                                   [[[0, 1], [2, 0]], [[1, 1], [0, 3]]], [slice(None), 1]],
                         ids=["list-of-lists", "list-of-tuples", "tuple-in-tuple", "tuple-of-lists", "nested",
                              "list-with-slice"])
def test_getitem_sequences_of_sequences(index: Any):
  # torch (as tinygrad 0.14) reads a list holding lists, tuples or slices as one index per dim; a tuple inside the
  # index is a list of positions
  a = _arange(3, 4)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # torch's "non-tuple sequence for multidimensional indexing"
    want = torch.from_numpy(a)[index].numpy()
  got = Tensor(a)[index].numpy()
  assert got.shape == want.shape
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("index", [[[0, 1], [2, 0]], ((0, 2),), [(0, 2), (1, 3)]],
                         ids=["list-of-lists", "tuple-in-tuple", "list-of-tuples"])
def test_setitem_reads_the_index_as_getitem(index: Any):
  a = _arange(3, 4)
  want = torch.from_numpy(a.copy())
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    want[index] = -1.0
  t = Tensor(a).contiguous().realize()
  t[index] = -1.0
  np.testing.assert_array_equal(t.numpy(), want.numpy())


def test_getitem_int_list_is_one_index():
  a = _arange(3, 4)
  np.testing.assert_array_equal(Tensor(a)[[2, 0, 2]].numpy(), torch.from_numpy(a)[[2, 0, 2]].numpy())


# ***** cross_entropy with (N, 1) class-index targets *****

def test_cross_entropy_n1_target_raises_runtime_error():
  logits, y = rng.standard_normal((4, 3)).astype(np.float32), np.array([[2], [0], [1], [1]])
  with pytest.raises(RuntimeError):  # torch: "0D or 1D target tensor expected, multi-target not supported"
    F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(y))
  # tinygrad 0.14: RuntimeError("shape mismatch: self.shape=(4, 3), Y.shape=(4, 1)")
  with pytest.raises(RuntimeError, match=r"\(4, 1\)"): Tensor(logits).cross_entropy(Tensor(y))
  want = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(y[:, 0])).item()
  assert Tensor(logits).cross_entropy(Tensor(y[:, 0])).item() == pytest.approx(want, rel=1e-5)


# ***** scaled_dot_product_attention with both a mask and is_causal *****

def test_sdpa_mask_and_causal_raises_runtime_error():
  q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
  m = np.tril(np.ones((3, 3), bool))
  # torch's documentation: "An error is thrown if both attn_mask and is_causal are set" (its CPU kernel computes)
  # tinygrad 0.14: RuntimeError("cannot set attn_mask when is_causal=True")
  with pytest.raises(RuntimeError, match="is_causal"):
    Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(q), attn_mask=Tensor(m), is_causal=True)
  want = F.scaled_dot_product_attention(*[torch.from_numpy(q)] * 3, is_causal=True).numpy()
  np.testing.assert_allclose(Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(q), is_causal=True).numpy(),
                             want, rtol=1e-5, atol=1e-6)


# ***** pad reflect / replicate on a size-2 dim with a negative pad *****

@pytest.mark.parametrize("mode,pad", [("reflect", (1, -1)), ("reflect", (-1, 1)), ("reflect", (2, -2)),
                                      ("replicate", (-2, 2)), ("replicate", (3, -1))])
def test_pad_mirrors_before_cropping(mode: str, pad: tuple[int, int]):
  # [1, 2] reflect-padded by (1, -1) is [2, 1]: the mirror sees the whole dim before the crop (torch, tinygrad 0.14)
  a = _arange(2, 3)[:, :2] if pad == (1, -1) or pad == (-1, 1) else _arange(2, 3)
  want = F.pad(torch.from_numpy(a)[None], pad, mode=mode)[0].numpy()
  np.testing.assert_array_equal(Tensor(a).pad(pad, mode=mode).numpy(), want)


def test_pad_reflect_too_large_raises_value_error():
  # tinygrad 0.14: ValueError("Padding (2, 2) should be less than the input size=2 for dim=1.")
  with pytest.raises(ValueError, match="2"): Tensor(_arange(2, 2)).pad((2, 2), mode="reflect")


# ***** unfold(size=0) *****

@pytest.mark.parametrize("step", [1, 2, 5])
def test_unfold_size_zero(step: int):
  a = _arange(3, 4)
  want = torch.from_numpy(a).unfold(1, 0, step)
  got = Tensor(a).unfold(1, 0, step)
  assert got.shape == tuple(want.shape)  # (3, 4 // step + 1, 0)
  assert got.numpy().shape == tuple(want.shape)


def test_unfold_bad_sizes_raise_runtime_error():
  t = Tensor(_arange(3, 4))
  # tinygrad 0.14: RuntimeError("maximum size for tensor at dimension 1 is 4 but size is 5")
  with pytest.raises(RuntimeError, match="size=5"): t.unfold(1, 5, 1)
  # tinygrad 0.14: RuntimeError("size must be >= 0 but got size=-1")
  with pytest.raises(RuntimeError, match="size=-1"): t.unfold(1, -1, 1)
  # tinygrad 0.14: RuntimeError("step must be > 0 but got step=0")
  with pytest.raises(RuntimeError, match="step=0"): t.unfold(1, 2, 0)


# ***** diagonal with equal dims *****

@pytest.mark.parametrize("dims", [(1, 1), (1, -1), (0, -2)])
def test_diagonal_equal_dims_raises_runtime_error(dims: tuple[int, int]):
  with pytest.raises(RuntimeError): torch.zeros(3, 4).diagonal(dim1=dims[0], dim2=dims[1])
  # tinygrad 0.14: RuntimeError("dim1 and dim2 cannot be the same dimension")
  with pytest.raises(RuntimeError, match="same dim"): Tensor(_arange(3, 4)).diagonal(dim1=dims[0], dim2=dims[1])


# ***** meshgrid of 0-d tensors *****

@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_0d(indexing: str):
  for xs in ([np.float32(1.5), np.float32(2.0)], [np.float32(1.5), np.array([2.0, 3.0, 4.0], np.float32)]):
    want = torch.meshgrid(*[torch.tensor(x) for x in xs], indexing=indexing)
    got = Tensor(np.asarray(xs[0])).meshgrid(*[Tensor(np.asarray(x)) for x in xs[1:]], indexing=indexing)
    assert len(got) == len(want)
    for g, w in zip(got, want): np.testing.assert_array_equal(g.numpy(), w.numpy())


# ***** roll with several shifts and no dims *****

def test_roll_several_shifts_no_dims_raises_runtime_error():
  with pytest.raises(RuntimeError): torch.zeros(3, 4).roll((1, 2))
  # tinygrad 0.14: RuntimeError("len(dims)=1 != len(shifts)=2")
  with pytest.raises(RuntimeError, match=r"\(1, 2\)"): Tensor(_arange(3, 4)).roll((1, 2))
  # tinygrad 0.14: RuntimeError("len(dims)=1 != len(shifts)=2")
  with pytest.raises(RuntimeError, match="same length"): Tensor(_arange(3, 4)).roll((1, 2), (0,))
  a = _arange(3, 4)
  for shifts in (5, (5,), -3):
    np.testing.assert_array_equal(Tensor(a).roll(shifts).numpy(), torch.from_numpy(a).roll(shifts).numpy())


# ***** einsum with '...' in several positions *****

@pytest.mark.parametrize("formula,shapes", [
  ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("i...j,j...k->ik", [(2, 3, 4), (4, 3, 5)]),
  ("...j,i...->i...", [(2, 3, 4), (5, 3)]), ("ij->...ij", [(2, 3)]), ("...i,...i", [(2, 3), (3,)]),
  ("b...,...->b...", [(2, 3), (3,)])])
def test_einsum_ellipsis_positions(formula: str, shapes: list[tuple[int, ...]]):
  xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  want = torch.einsum(formula, *[torch.from_numpy(x) for x in xs]).numpy()
  np.testing.assert_allclose(Tensor.einsum(formula, *[Tensor(x) for x in xs]).numpy(), want, rtol=1e-5, atol=1e-5)


def test_einsum_two_ellipses_in_one_term_raises_runtime_error():
  with pytest.raises(RuntimeError): torch.einsum("i...j...->ij", torch.ones(2, 3, 4))
  # tinygrad 0.14: RuntimeError("order is not a valid permutation, getting (0, 1)")
  with pytest.raises(RuntimeError, match="'...'"): Tensor.einsum("i...j...->ij", Tensor(_arange(2, 3, 4)))


# ***** one_hot, int pow, linspace: raised where tinygrad raises *****

def test_one_hot_negative_num_classes_raises_value_error():
  # tinygrad 0.14: ValueError("num_classes must be non-negative, got -1"); torch's -1 ("infer") is not its API
  with pytest.raises(ValueError, match="-1"): Tensor([1, 2]).one_hot(-1)
  # tinygrad 0.14: TypeError (num_classes is a required argument)
  with pytest.raises(TypeError): Tensor([1, 2]).one_hot()  # type: ignore[call-arg]
  # tinygrad 0.14: RuntimeError("expect integer dtype, getting self.dtype=dtypes.float")
  with pytest.raises(RuntimeError, match="float"): Tensor([1.0, 2.0]).one_hot(3)
  y = np.array([-1, 0, 2, 3])  # values outside [0, 3) give a row of zeros (tinygrad 0.14)
  want = F.one_hot(torch.from_numpy(np.clip(y, 0, 2)), 3).numpy() * ((y >= 0) & (y < 3))[:, None]
  np.testing.assert_array_equal(Tensor(y).one_hot(3).numpy(), want)


@pytest.mark.parametrize("exponent", [-1, -2, -9])
def test_int_pow_negative_int_exponent_raises_runtime_error(exponent: int):
  with pytest.raises(RuntimeError): torch.tensor([2, 3]) ** exponent  # "Integers to negative integer powers..."
  # tinygrad 0.14: RuntimeError("base needs to be float")
  with pytest.raises(RuntimeError, match=str(exponent)): Tensor([2, 3]) ** exponent
  with pytest.raises(RuntimeError): Tensor([2, 3]).pow(exponent)


def test_pow_numbers_still_computed():
  b, e = np.array([2, 3, -2], np.int32), np.array([-1, 2, 3], np.int32)
  np.testing.assert_array_equal((Tensor(b) ** Tensor(e)).numpy(), (torch.from_numpy(b) ** torch.from_numpy(e)).numpy())
  np.testing.assert_allclose((Tensor(b) ** -1.0).numpy(), (torch.from_numpy(b) ** -1.0).numpy(), rtol=1e-6)
  np.testing.assert_array_equal((Tensor(b) ** 0).numpy(), (torch.from_numpy(b) ** 0).numpy())
  np.testing.assert_array_equal(((-2) ** Tensor(np.array([0, 1, 2]))).numpy(), [1, -2, 4])


def test_linspace_bad_count():
  # tinygrad 0.14: ValueError("number of steps must be non-negative")
  with pytest.raises(ValueError, match="-1"): Tensor.linspace(0, 1, -1)
  # tinygrad 0.14: ValueError("linspace with bool dtype is not supported")
  with pytest.raises(ValueError, match="bool"): Tensor.linspace(0, 1, 3, dtype="bool")
  for bad in (2.5, 2.0, True, "3"):  # torch: TypeError (tinygrad 0.14 computes ceil(steps) values for a float)
    with pytest.raises(TypeError): torch.linspace(0, 1, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="steps"): Tensor.linspace(0, 1, bad)
  for n in (0, 1, 2, 7, np.int64(4)):
    np.testing.assert_allclose(Tensor.linspace(-1, 3, n).numpy(), torch.linspace(-1, 3, int(n)).numpy(), rtol=1e-6)


# ***** found by the sweep *****

def test_sweep_fixes_raise_tinygrads_types():
  t = Tensor(_arange(2, 3))
  # tinygrad 0.14: RuntimeError("only one dimension can be inferred using -1, getting (-1, -1)")
  with pytest.raises(RuntimeError, match="-1"): t.reshape(-1, -1)
  # tinygrad 0.14: RuntimeError("dim can appear at most once, getting (0, 0)"); torch refuses it too
  with pytest.raises(RuntimeError): torch.zeros(2, 3).flip((0, 0))
  with pytest.raises(RuntimeError, match="at most once"): t.flip((0, 0))
  # tinygrad 0.14: IndexError("shape mismatch: objects cannot be broadcast to a single shape ((2, 3), (4,))")
  with pytest.raises(IndexError, match="broadcast"): t + Tensor(_arange(4))
  # tinygrad 0.14: RuntimeError("_one_hot_along_dim expects int index tensor, getting dtypes.float")
  with pytest.raises(RuntimeError, match="integer"): t.gather(1, Tensor(_arange(2, 3)))
  # tinygrad 0.14: RuntimeError("... contains different values for the same key")
  with pytest.raises(RuntimeError, match="'j'"): Tensor.einsum("ij,jk->ik", t, Tensor(_arange(4, 2)))
  # tinygrad 0.14: RuntimeError("cannot dot (1, 2, 3, 4) and (1, 2, 5, 3)")
  q = Tensor(_arange(1, 2, 3, 4))
  with pytest.raises(RuntimeError, match="last dim"): q.scaled_dot_product_attention(Tensor(_arange(1, 2, 3, 5)), q)
  # tinygrad 0.14: RuntimeError("self.ndim must equal index.ndim, self.ndim=2, index.ndim=1")
  with pytest.raises(RuntimeError, match="dims"): t.gather(1, Tensor([0, 1]))
  # tinygrad 0.14: RuntimeError("_one_hot_along_dim expects int index tensor, getting dtypes.float")
  with pytest.raises(RuntimeError, match="integer"): t.scatter(1, Tensor(_arange(2, 3)), 1.0)
  # tinygrad 0.14: RuntimeError("order is not a valid permutation, getting (0,)")
  with pytest.raises(RuntimeError): torch.einsum("ij->k", torch.ones(2, 3))
  with pytest.raises(RuntimeError, match="'k'"): Tensor.einsum("ij->k", t)
  # tinygrad 0.14: RuntimeError("shape must be int, got dtypes.weakfloat in (1.5,)")
  with pytest.raises(RuntimeError, match="1.5"): Tensor(_arange(3)).pad((1.5, 1))
  # and the ValueError contract of these errors holds
  with pytest.raises(ValueError): t.reshape(-1, -1)
  with pytest.raises(ValueError): t + Tensor(_arange(4))
  with pytest.raises(TypeError): t.gather(1, Tensor(_arange(2, 3)))


def test_where_condition_must_be_bool():
  # a float condition silently meant "nonzero"; torch and tinygrad 0.14 refuse it
  c = [0.0, 0.5, 2.0]
  with pytest.raises(RuntimeError): torch.where(torch.tensor(c), 1.0, 0.0)
  with pytest.raises(RuntimeError): torch.tensor(c).masked_fill(torch.tensor(c), 0.0)
  # tinygrad 0.14: RuntimeError("where cond must be bool, got dtypes.float")
  with pytest.raises(RuntimeError, match="bool"): Tensor(c).where(1.0, 0.0)
  with pytest.raises(RuntimeError, match="bool"): Tensor(c).masked_fill(Tensor(c), 0.0)
  with pytest.raises(TypeError, match="float"): Tensor(c).where(1.0, 0.0)
  c, a = np.array([True, False, True]), _arange(3)
  np.testing.assert_array_equal(Tensor(c).where(Tensor(a), -1.0).numpy(),
                                torch.where(torch.from_numpy(c), torch.from_numpy(a), -1.0).numpy())


# ***** the sweep: exception types compared live with tinygrad 0.14 on its PYTHON device *****

def _f(T: Any, *s: int) -> Any: return T(_arange(*s))
def _i(T: Any, *s: int) -> Any: return T(np.arange(int(np.prod(s)), dtype=np.int32).reshape(s))


SWEEP: dict[str, Callable[[Any], Any]] = {
  "reshape bad": lambda T: _f(T, 2, 3).reshape(4, 2), "reshape two -1": lambda T: _f(T, 2, 3).reshape(-1, -1),
  "reshape neg": lambda T: _f(T, 2, 3).reshape(-2, 3), "permute dup": lambda T: _f(T, 2, 3).permute(0, 0),
  "permute short": lambda T: _f(T, 2, 3).permute(0,), "permute oob": lambda T: _f(T, 2, 3).permute(0, 2),
  "expand bad": lambda T: _f(T, 2, 3).expand(4, 3), "expand fewer": lambda T: _f(T, 2, 3).expand(3),
  "transpose oob": lambda T: _f(T, 2, 3).transpose(0, 2), "flip oob": lambda T: _f(T, 2, 3).flip(2),
  "flip dup": lambda T: _f(T, 2, 3).flip((0, 0)), "squeeze oob": lambda T: _f(T, 2, 3).squeeze(3),
  "unsqueeze oob": lambda T: _f(T, 2, 3).unsqueeze(4), "sum oob": lambda T: _f(T, 2, 3).sum(2),
  "max oob": lambda T: _f(T, 2, 3).max(-3), "softmax oob": lambda T: _f(T, 2, 3).softmax(2),
  "cat mismatch": lambda T: _f(T, 2, 3).cat(_f(T, 2, 4), dim=0), "cat ndim": lambda T: _f(T, 2, 3).cat(_f(T, 3)),
  "cat oob": lambda T: _f(T, 2, 3).cat(_f(T, 2, 3), dim=2), "stack mismatch": lambda T: _f(T, 2, 3).stack(_f(T, 2, 4)),
  "split bad": lambda T: _f(T, 6).split([2, 2]), "chunk zero": lambda T: _f(T, 6).chunk(0),
  "shrink bad": lambda T: _f(T, 2, 3).shrink(((0, 3), None)),
  "shrink rev": lambda T: _f(T, 2, 3).shrink(((1, 0), None)),
  "pad odd": lambda T: _f(T, 2, 3).pad((1, 2, 3)), "pad too many": lambda T: _f(T, 3).pad((1, 1, 1, 1)),
  "pad bad mode": lambda T: _f(T, 2, 3).pad((1, 1), mode="wrap"),
  "pad reflect big": lambda T: _f(T, 2, 3).pad((3, 0), mode="reflect"),
  "pad circular big": lambda T: _f(T, 2, 3).pad((4, 0), mode="circular"),
  "pad pairs short": lambda T: _f(T, 2, 3).pad(((1, 1),)),
  "pad reflect neg": lambda T: _f(T, 2, 2).pad((1, -1), mode="reflect"),
  "pad replicate neg": lambda T: _f(T, 2, 3).pad((-2, 2), mode="replicate"),
  "matmul mismatch": lambda T: _f(T, 2, 3) @ _f(T, 4, 2), "matmul 0d": lambda T: _f(T, 2, 3) @ T(1.0),
  "dot mismatch": lambda T: _f(T, 3).dot(_f(T, 4)), "broadcast add": lambda T: _f(T, 2, 3) + _f(T, 4),
  "where broadcast": lambda T: (_f(T, 2, 3) > 1).where(_f(T, 4), 0),
  "masked_fill broadcast": lambda T: _f(T, 2, 3).masked_fill(T([True, False]), 0),
  "index oob int": lambda T: _f(T, 2, 3)[2], "index oob neg": lambda T: _f(T, 2, 3)[-3],
  "index too many": lambda T: _f(T, 2, 3)[0, 0, 0], "index two ellipsis": lambda T: _f(T, 2, 3)[..., ...],
  "index float": lambda T: _f(T, 2, 3)[1.5], "index str": lambda T: _f(T, 2, 3)["a"],
  "index float tensor": lambda T: _f(T, 2, 3)[T([0.5])], "index float list": lambda T: _f(T, 2, 3)[[0.5, 1]],
  "index slice step0": lambda T: _f(T, 2, 3)[::0], "index bcast": lambda T: _f(T, 3, 3)[[0, 1], [0, 1, 2]],
  "index tensor bcast": lambda T: _f(T, 3, 3)[T([0, 1]), T([0, 1, 2])],
  "index list of lists": lambda T: _f(T, 3, 4)[[[0, 1], [2, 0]]], "index tuple seq": lambda T: _f(T, 3, 4)[(0, 2),],
  "index list of tuples": lambda T: _f(T, 3, 4)[[(0, 2), (1, 3)]],
  "index list with slice": lambda T: _f(T, 3, 4)[[slice(None), 1]],
  "index bool list": lambda T: _f(T, 3)[[True, False, True]],
  "gather oob dim": lambda T: _f(T, 2, 3).gather(2, _i(T, 2, 3)),
  "gather float idx": lambda T: _f(T, 2, 3).gather(1, _f(T, 2, 3)),
  "scatter oob": lambda T: _f(T, 2, 3).scatter(2, _i(T, 2, 3), 1.0),
  "one_hot float": lambda T: _f(T, 3).one_hot(3), "one_hot -1": lambda T: _i(T, 3).one_hot(-1),
  "one_hot neg values": lambda T: T([-1, 2]).one_hot(3),
  "arange step0": lambda T: T.arange(0, 5, 0), "full neg shape": lambda T: T.full((-1, 2), 1.0),
  "zeros neg": lambda T: T.zeros(2, -3), "eye neg": lambda T: T.eye(-1),
  "linspace neg": lambda T: T.linspace(0, 1, -2), "linspace bool dtype": lambda T: T.linspace(0, 1, 3, dtype="bool"),
  "linspace float steps": lambda T: T.linspace(0, 1, 2.5), "linspace one": lambda T: T.linspace(0, 1, 1),
  "conv2d channels": lambda T: _f(T, 1, 3, 4, 4).conv2d(_f(T, 2, 2, 3, 3)),
  "conv2d groups": lambda T: _f(T, 1, 4, 4, 4).conv2d(_f(T, 2, 4, 3, 3), groups=3),
  "avg_pool big": lambda T: _f(T, 1, 1, 2, 2).avg_pool2d(kernel_size=(3, 3)),
  "max_pool big": lambda T: _f(T, 1, 1, 2, 2).max_pool2d(kernel_size=(3, 3)),
  "interpolate mode": lambda T: _f(T, 1, 1, 2, 2).interpolate((4, 4), mode="bicubicc"),
  "cross_entropy N1": lambda T: _f(T, 2, 3).cross_entropy(T([[1], [2]])),
  "cross_entropy bad": lambda T: _f(T, 2, 3).cross_entropy(T([1, 2, 0])),
  "cross_entropy smoothing": lambda T: _f(T, 2, 3).cross_entropy(T([1, 2]), label_smoothing=1.5),
  "sdpa mask causal": lambda T: _f(T, 1, 2, 3, 4).scaled_dot_product_attention(
    _f(T, 1, 2, 3, 4), _f(T, 1, 2, 3, 4), attn_mask=T.ones(3, 3), is_causal=True),
  "sdpa shape": lambda T: _f(T, 1, 2, 3, 4).scaled_dot_product_attention(_f(T, 1, 2, 3, 5), _f(T, 1, 2, 3, 4)),
  "sdpa 1d": lambda T: _f(T, 3).scaled_dot_product_attention(_f(T, 3), _f(T, 3)),
  "layernorm oob": lambda T: _f(T, 2, 3).layernorm(axis=2),
  "roll shifts no dims": lambda T: _f(T, 2, 3).roll((1, 2)), "roll mismatch": lambda T: _f(T, 2, 3).roll((1, 2), 0),
  "roll oob": lambda T: _f(T, 2, 3).roll(1, 2),
  "unfold big": lambda T: _f(T, 2, 3).unfold(1, 4, 1), "unfold step0": lambda T: _f(T, 2, 3).unfold(1, 2, 0),
  "unfold neg size": lambda T: _f(T, 2, 3).unfold(1, -1, 1), "unfold 0": lambda T: _f(T, 3, 4).unfold(1, 0, 1),
  "diagonal same": lambda T: _f(T, 2, 3).diagonal(dim1=0, dim2=-2),
  "diagonal oob": lambda T: _f(T, 2, 3).diagonal(dim1=0, dim2=2),
  "meshgrid indexing": lambda T: _f(T, 2).meshgrid(_f(T, 3), indexing="yx"),
  "meshgrid 0d": lambda T: T(1.5).meshgrid(_f(T, 2)), "meshgrid 2d": lambda T: _f(T, 1, 2).meshgrid(_f(T, 3)),
  "einsum two ellipses": lambda T: T.einsum("i...j...->ij", _f(T, 2, 3, 4)),
  "einsum out ellipsis": lambda T: T.einsum("ij->...ij", _f(T, 2, 3)),
  "einsum operand count": lambda T: T.einsum("ij,jk->ik", _f(T, 2, 3)),
  "einsum bad char": lambda T: T.einsum("i1->i", _f(T, 2, 3)),
  "einsum size mismatch": lambda T: T.einsum("ij,jk->ik", _f(T, 2, 3), _f(T, 4, 2)),
  "einsum rank": lambda T: T.einsum("ijk->i", _f(T, 2, 3)),
  "int pow neg": lambda T: _i(T, 3) ** -2, "int rpow neg base": lambda T: (-2) ** _i(T, 3),
  "int pow float neg": lambda T: _i(T, 3) ** -1.0,
  "bitwise float": lambda T: _f(T, 3) & _f(T, 3), "shift float": lambda T: _f(T, 3) << 1,
  "item multi": lambda T: T(_f(T, 3).item()), "cast bad": lambda T: _f(T, 3).cast("notadtype"),
  "repeat short": lambda T: _f(T, 2, 3).repeat(2), "repeat neg": lambda T: _f(T, 2, 3).repeat(2, -1),
  "topk big": lambda T: _f(T, 3).topk(4), "sort oob": lambda T: _f(T, 3).sort(1),
  "cumsum oob": lambda T: _f(T, 3).cumsum(1), "argmax oob": lambda T: _f(T, 3).argmax(1),
  "dropout p": lambda T: _f(T, 3).dropout(1.5), "rearrange bad": lambda T: _f(T, 2, 3).rearrange("a b -> a c"),
  "multinomial 3d": lambda T: _f(T, 1, 2, 3).multinomial(),
  "tensor from str": lambda T: T("abc"), "ragged list": lambda T: T([[1, 2], [3]]),
  "interpolate size len": lambda T: _f(T, 1, 1, 2, 2).interpolate((4,)),
  "avg_pool stride0": lambda T: _f(T, 1, 1, 4, 4).avg_pool2d(kernel_size=(2, 2), stride=0),
  "conv2d stride0": lambda T: _f(T, 1, 1, 4, 4).conv2d(_f(T, 1, 1, 3, 3), stride=0),
  "conv2d 3d weight": lambda T: _f(T, 1, 1, 4, 4).conv2d(_f(T, 1, 3, 3)),
  "var oob": lambda T: _f(T, 2, 3).var(2), "std oob": lambda T: _f(T, 2, 3).std(-3),
  "logsumexp oob": lambda T: _f(T, 2, 3).logsumexp(2), "cumprod oob": lambda T: _f(T, 3).cumprod(1),
  "cummax oob": lambda T: _f(T, 3).cummax(1), "argsort oob": lambda T: _f(T, 3).argsort(1),
  "topk oob dim": lambda T: _f(T, 3).topk(1, dim=1), "log_softmax oob": lambda T: _f(T, 3).log_softmax(1),
  "mean oob": lambda T: _f(T, 3).mean(1), "any oob": lambda T: (_f(T, 3) > 1).any(1),
  "prod oob": lambda T: _f(T, 3).prod(1), "flatten oob": lambda T: _f(T, 2, 3).flatten(3),
  "unflatten bad": lambda T: _f(T, 6).unflatten(0, (4, 2)),
  "repeat_interleave oob": lambda T: _f(T, 3).repeat_interleave(2, dim=1),
  "split oob": lambda T: _f(T, 4).split(2, dim=1), "chunk oob": lambda T: _f(T, 4).chunk(2, dim=1),
  "gather ndim": lambda T: _f(T, 2, 3).gather(1, T([0, 1])),
  "scatter float idx": lambda T: _f(T, 2, 3).scatter(1, _f(T, 2, 3), 1.0),
  "masked_fill float mask": lambda T: _f(T, 3).masked_fill(_f(T, 3), 0),
  "where float cond": lambda T: _f(T, 3).where(1.0, 0.0), "linear bad": lambda T: _f(T, 2, 3).linear(_f(T, 4, 2)),
  "pad float": lambda T: _f(T, 3).pad((1.5, 1)), "pad reflect empty": lambda T: _f(T, 0).pad((1, 1), mode="reflect"),
  "pad replicate empty": lambda T: _f(T, 2, 0).pad((1, 1), mode="replicate"),
  "pad circular crop all": lambda T: _f(T, 3).pad((-4, 0), mode="circular"),
  "pad constant crop all": lambda T: _f(T, 3).pad((-4, 0)),
  "sdpa gqa heads": lambda T: _f(T, 1, 4, 3, 4).scaled_dot_product_attention(
    _f(T, 1, 3, 3, 4), _f(T, 1, 3, 3, 4), enable_gqa=True),
  "binary_ce shape": lambda T: _f(T, 3).sigmoid().binary_crossentropy(_f(T, 4)),
  "nll shape": lambda T: _f(T, 2, 3).nll_loss(T([1])),
  "cross_entropy reduction": lambda T: _f(T, 2, 3).cross_entropy(T([1, 2]), reduction="avg"),
  "meshgrid no args": lambda T: _f(T, 3).meshgrid(), "diagonal 1d": lambda T: _f(T, 3).diagonal(),
  "unfold 0d": lambda T: T(1.0).unfold(0, 1, 1), "roll 0d": lambda T: T(1.0).roll(1),
  "einsum two arrows": lambda T: T.einsum("ij->j->i", _f(T, 2, 3)),
  "einsum out repeat": lambda T: T.einsum("ij->jj", _f(T, 2, 3)),
  "einsum out unknown": lambda T: T.einsum("ij->k", _f(T, 2, 3)),
  "rand neg": lambda T: T.rand(-1), "full_like str": lambda T: _f(T, 3).full_like("x"),
  "eye float": lambda T: T.eye(2.5), "arange float step int dtype": lambda T: T.arange(0, 3, 0.5, dtype="int32"),
}

# where we differ from tinygrad 0.14 on purpose: the type we raise (None: we compute), and why
INTENDED: dict[str, tuple[type[BaseException] | None, str]] = {
  **{k: (ValueError, "tinygrad raises a bare AssertionError") for k in (
    "cat mismatch", "cat ndim", "stack mismatch", "split bad", "chunk zero", "conv2d channels", "conv2d groups",
    "avg_pool big", "max_pool big", "interpolate mode", "cross_entropy smoothing", "item multi", "rearrange bad",
    "multinomial 3d", "conv2d 3d weight")},
  **{k: (ValueError, "tinygrad divides by the stride (ZeroDivisionError)")
     for k in ("avg_pool stride0", "conv2d stride0")},
  "tensor from str": (TypeError, "a str is the wrong type of argument (torch: TypeError; tinygrad: RuntimeError)"),
  "full_like str": (TypeError, "a str fill value is the wrong type (torch: TypeError; tinygrad: float()'s ValueError)"),
  "nll shape": (ValueError, "torch refuses labels of another batch size; tinygrad broadcasts them"),
  "eye float": (ValueError, "torch refuses a float size; tinygrad computes an eye of another size"),
  "arange float step int dtype": (None, "torch gives [0, 0, 1, 1, 2, 2]; tinygrad gives zeros"),
  "einsum out repeat": (RuntimeError, "torch refuses a repeated output letter; tinygrad fails inside (IndexError)"),
  "arange step0": (ValueError, "tinygrad divides by the step (ZeroDivisionError)"),
  "full neg shape": (ValueError, "tinygrad makes a (1, 2) tensor from shape (-1, 2); torch refuses it"),
  "einsum bad char": (RuntimeError, "tinygrad takes '1' as a letter; torch refuses non-letters (RuntimeError)"),
  "einsum rank": (RuntimeError, "tinygrad's IndexError names an internal dim; torch raises a RuntimeError"),
  "cast bad": (ValueError, "tinygrad raises AttributeError from its dtype table lookup"),
  "index bool list": (None, "a list of bools is a mask (numpy, torch); tinygrad refuses it"),
  "linspace float steps": (TypeError, "torch refuses a non-int count; tinygrad computes ceil(steps) values"),
  "sdpa 1d": (ValueError, "tinygrad fails inside with 'list index out of range'"),
  "int rpow neg base": (None, "torch computes (-2) ** int tensor; tinygrad refuses a negative int base"),
  "meshgrid 2d": (RuntimeError, "torch refuses tensors of 2+ dims; tinygrad flattens them"),
}


def _outcome(fn: Callable[[Any], Any], T: Any) -> tuple[BaseException | None, list[np.ndarray]]:
  """The exception `fn(T)` raises (building or realizing), or None and the results as numpy arrays."""
  try:
    out = fn(T)
    outs = list(out) if isinstance(out, tuple) else [out]
    # tinygrad keeps a constant's tensor on no device: copy it to this (PYTHON) one to realize it
    return None, [(o.clone(device="PYTHON") if getattr(o, "device", "") is None else o).numpy() for o in outs]
  except Exception as e:  # the point of the sweep: which exception each library raises
    return e, []


@pytest.mark.parametrize("name", sorted(SWEEP))
def test_sweep_against_tinygrad(name: str):
  tinygrad = pytest.importorskip("tinygrad", reason="tinygrad==0.14.0 is a test oracle in TEST_DEPS")
  from tinygrad.helpers import Context
  with Context(DEV="PYTHON", IMAGE=0):
    tg_exc, tg_out = _outcome(SWEEP[name], tinygrad.Tensor)
  exc, out = _outcome(SWEEP[name], Tensor)
  if name in INTENDED:
    want, why = INTENDED[name]
    assert (exc is None) if want is None else isinstance(exc, want), f"{name}: expected {want} ({why}), got {exc!r}"
    same = isinstance(exc, type(tg_exc)) if exc is not None and tg_exc is not None else \
      exc is None and tg_exc is None and all(o.shape == w.shape and np.allclose(o, w) for o, w in zip(out, tg_out))
    assert not same, f"{name}: no longer differs from tinygrad ({tg_exc!r}); drop it from INTENDED"
    return
  if tg_exc is not None:
    assert exc is not None, f"{name}: tinygrad raises {tg_exc!r}, we compute"
    assert isinstance(exc, type(tg_exc)), f"{name}: tinygrad raises {type(tg_exc).__name__}, we {exc!r}"
    assert not isinstance(tg_exc, AssertionError), f"{name}: tinygrad asserts; list ours in INTENDED"
  else:
    assert exc is None, f"{name}: tinygrad computes, we raise {exc!r}"
    assert len(out) == len(tg_out)
    for o, w in zip(out, tg_out): np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6)
