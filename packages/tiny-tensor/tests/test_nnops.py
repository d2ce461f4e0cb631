"""tiny_tensor.nnops against torch: conv, pooling, interpolation, normalization, dropout, attention and losses.

Forward values and gradients are compared with torch (a test-only dependency). Shapes stay small: every distinct
shape compiles its own kernels.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_tensor import Tensor, dtypes
from tiny_uop import Ops

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(0)


def randn(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)


def compare(tiny_fn, torch_fn, *arrays: np.ndarray, grad: bool = True, atol: float = 1e-4, rtol: float = 1e-4):
  """Run both on the same inputs; compare outputs, then the gradients of a random weighting of the output."""
  xs = [Tensor(a) for a in arrays]
  ts = [torch.tensor(a, requires_grad=grad) for a in arrays]
  out, ref = tiny_fn(*xs), torch_fn(*ts)
  assert tuple(out.shape) == tuple(ref.shape), f"shape {out.shape} != torch {tuple(ref.shape)}"
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=atol, rtol=rtol)
  if not grad: return
  w = randn(*ref.shape)
  grads = (out * Tensor(w)).sum().gradient(*xs)
  (ref * torch.tensor(w)).sum().backward()
  for i, (g, t) in enumerate(zip(grads, ts)):
    np.testing.assert_allclose(g.numpy(), t.grad.numpy(), atol=atol * 10, rtol=rtol * 10,
                               err_msg=f"gradient of input {i}")


# ***** conv2d *****

CONV_CASES = [  # x shape, w shape, kwargs (tiny == torch unless noted)
  ((1, 2, 5, 5), (3, 2, 3, 3), {}),
  ((2, 2, 6, 5), (3, 2, 3, 2), {"stride": 2, "padding": 1}),
  ((1, 3, 7, 6), (2, 3, 3, 3), {"dilation": 2, "padding": (1, 2)}),
  ((1, 4, 5, 5), (6, 2, 3, 3), {"groups": 2}),
  ((1, 4, 5, 4), (4, 1, 3, 3), {"groups": 4, "stride": (2, 1), "padding": 1}),  # depthwise
  ((2, 3, 4, 4), (5, 3, 1, 1), {"stride": 2}),
  ((1, 2, 3, 3), (2, 2, 3, 3), {"padding": 2, "dilation": (1, 2)}),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_CASES)
def test_conv2d(xs, ws, kw):
  b = randn(ws[0])
  compare(lambda x, w, b: x.conv2d(w, b, **kw), lambda x, w, b: F.conv2d(x, w, b, **kw), randn(*xs), randn(*ws), b)


def test_conv2d_flat_padding_is_left_right_top_bottom():
  # torch-style flat padding: (left, right, top, bottom); negative values crop
  compare(lambda x, w: x.conv2d(w, padding=(1, 0, 2, 1)), lambda x, w: F.conv2d(F.pad(x, (1, 0, 2, 1)), w),
          randn(1, 2, 4, 5), randn(2, 2, 2, 3))
  compare(lambda x, w: x.conv2d(w, padding=(0, -1, -1, 1)), lambda x, w: F.conv2d(F.pad(x, (0, -1, -1, 1)), w),
          randn(1, 2, 5, 5), randn(1, 2, 2, 2))


@pytest.mark.parametrize("kw", [{"padding": "same"}, {"padding": "same", "dilation": (2, 1)}, {"padding": "valid"}])
@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note about its own implementation
def test_conv2d_same_and_valid_padding(kw):
  compare(lambda x, w: x.conv2d(w, **kw), lambda x, w: F.conv2d(x, w, **kw), randn(1, 2, 5, 6), randn(2, 2, 4, 3))


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_conv2d_random_configs(data):
  groups = data.draw(st.sampled_from([1, 2]))
  k = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
  s, d = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3))), data.draw(st.tuples(st.integers(1, 2),
                                                                                           st.integers(1, 2)))
  p = data.draw(st.tuples(st.integers(0, 2), st.integers(0, 2)))
  hw = tuple(max(data.draw(st.integers(1, 7)), di * (ki - 1) + 1 - 2 * pi) for ki, di, pi in zip(k, d, p))
  x, w = randn(2, 2 * groups, *hw), randn(2 * groups, 2, *k)
  compare(lambda x, w: x.conv2d(w, groups=groups, stride=s, dilation=d, padding=p),
          lambda x, w: F.conv2d(x, w, groups=groups, stride=s, dilation=d, padding=p), x, w)  # gradients too


def test_conv1d_and_conv3d_through_conv2d():
  compare(lambda x, w: x.conv2d(w, stride=2, padding=1), lambda x, w: F.conv1d(x, w, stride=2, padding=1),
          randn(2, 3, 7), randn(4, 3, 3))
  compare(lambda x, w: x.conv2d(w, padding=(1, 0, 1)), lambda x, w: F.conv3d(x, w, padding=(1, 0, 1)),
          randn(1, 2, 3, 4, 3), randn(2, 2, 2, 2, 2))


def test_conv2d_accumulation_dtype_and_int_inputs():
  x, w = rng.integers(-3, 4, (1, 2, 4, 4)).astype(np.int32), rng.integers(-3, 4, (2, 2, 3, 3)).astype(np.int32)
  out = Tensor(x).conv2d(Tensor(w))
  np.testing.assert_array_equal(out.numpy(), F.conv2d(torch.tensor(x).double(), torch.tensor(w).double()).numpy())
  xh, wh = randn(1, 2, 4, 4).astype(np.float16), randn(2, 2, 3, 3).astype(np.float16)
  acc = Tensor(xh).conv2d(Tensor(wh), dtype=dtypes.float32)
  assert acc.dtype == dtypes.float32
  want = F.conv2d(torch.tensor(xh).float(), torch.tensor(wh).float()).numpy()
  np.testing.assert_allclose(acc.numpy(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("xs,ws,kw,needle", [
  ((1, 4, 5, 5), (6, 3, 3, 3), {}, "4 channels"),
  ((1, 4, 5, 5), (6, 2, 3, 3), {"groups": 4}, "groups=4"),
  ((1, 4, 5, 5), (5, 2, 3, 3), {"groups": 2}, "divisible by groups"),
  ((1, 2, 2, 2), (1, 2, 3, 3), {}, "larger than"),
  ((1, 2, 5, 5), (1, 2, 3), {}, "spatial dims"),
  ((1, 2, 5, 5), (1, 2, 3, 3), {"padding": (1, 2, 3)}, "padding=(1, 2, 3)"),
  ((1, 2, 5, 5), (1, 2, 3, 3), {"stride": 0}, "stride"),
  ((1, 2, 5, 5), (1, 2, 3, 3), {"groups": 0}, "groups=0"),
  ((1, 2, 5, 5), (1, 2, 3, 3), {"padding": "full"}, "'full'"),
  ((1, 2, 5, 5), (1, 2, 3, 3), {"padding": "same", "stride": 2}, "stride=2"),
])
def test_conv2d_errors_name_the_bad_value(xs, ws, kw, needle):
  with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
    Tensor.zeros(*xs).conv2d(Tensor.zeros(*ws), **kw)


# ***** conv_transpose2d *****

CONVT_CASES = [
  ((1, 2, 3, 3), (2, 3, 3, 3), {}),
  ((2, 2, 3, 4), (2, 2, 3, 2), {"stride": 2}),
  ((1, 2, 4, 4), (2, 1, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
  ((1, 2, 3, 3), (2, 2, 2, 3), {"dilation": 2, "padding": (1, 0)}),
  ((1, 4, 3, 3), (4, 3, 3, 3), {"groups": 2, "stride": (1, 2)}),
  ((1, 2, 4, 3), (2, 2, 3, 3), {"stride": 3, "padding": 2, "output_padding": (2, 0), "dilation": 1}),
]


@pytest.mark.parametrize("xs,ws,kw", CONVT_CASES)
def test_conv_transpose2d(xs, ws, kw):
  b = randn(ws[1] * kw.get("groups", 1))
  compare(lambda x, w, b: x.conv_transpose2d(w, b, **kw), lambda x, w, b: F.conv_transpose2d(x, w, b, **kw),
          randn(*xs), randn(*ws), b)


def test_conv_transpose1d_and_3d():
  compare(lambda x, w: x.conv_transpose2d(w, stride=2, padding=1), lambda x, w: F.conv_transpose1d(x, w, stride=2,
          padding=1), randn(1, 2, 5), randn(2, 3, 3))
  compare(lambda x, w: x.conv_transpose2d(w, stride=(1, 2, 1)), lambda x, w: F.conv_transpose3d(x, w, stride=(1, 2, 1)),
          randn(1, 2, 2, 3, 2), randn(2, 1, 2, 2, 2))


def test_conv_transpose2d_errors():
  with pytest.raises(ValueError, match="output_padding"):
    Tensor.zeros(1, 2, 3, 3).conv_transpose2d(Tensor.zeros(2, 2, 3, 3), stride=2, output_padding=2)
  with pytest.raises(ValueError, match="3 channels"):
    Tensor.zeros(1, 3, 3, 3).conv_transpose2d(Tensor.zeros(2, 2, 3, 3))


# ***** pooling *****

AVG_CASES = [
  {"kernel_size": 2},
  {"kernel_size": 3, "stride": 2, "padding": 1},
  {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
  {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
  {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
  {"kernel_size": (2, 3), "stride": (1, 2)},
  {"kernel_size": 3, "stride": 3, "ceil_mode": True},
  {"kernel_size": (3, 2), "stride": 2, "padding": (1, 0), "ceil_mode": True},
]


@pytest.mark.parametrize("kw", AVG_CASES)
def test_avg_pool2d(kw):
  compare(lambda x: x.avg_pool2d(**kw), lambda x: F.avg_pool2d(x, **kw), randn(2, 2, 7, 6))


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_pool_random_configs(data):
  k = data.draw(st.tuples(st.integers(1, 4), st.integers(1, 4)))
  s = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
  p = tuple(data.draw(st.integers(0, ki // 2)) for ki in k)  # torch allows at most half the kernel
  ceil, incl = data.draw(st.booleans()), data.draw(st.booleans())
  hw = tuple(max(data.draw(st.integers(1, 8)), ki) for ki in k)
  x = rng.permutation(2 * 6 * 8 * 8)[:2 * 3 * hw[0] * hw[1]].astype(np.float32).reshape(2, 3, *hw)
  kw = {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": ceil}
  compare(lambda x: x.avg_pool2d(**kw, count_include_pad=incl), lambda x: F.avg_pool2d(x, **kw,
          count_include_pad=incl), x, grad=False)
  out, idx = Tensor(x).max_pool2d(**kw, return_indices=True)
  ref, ref_idx = F.max_pool2d(torch.tensor(x), **kw, return_indices=True)
  np.testing.assert_array_equal(out.numpy(), ref.numpy())
  np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())


def test_max_pool2d_indices_of_whole_window():
  # one 4x4 window per plane, read as contiguous rows: the argmax over its 16 values is an unrolled chain of int
  # MAXes, which the OpenCL renderer once spelled as a 2 MB kernel (each MAX repeated its inline operands) that
  # crashed PoCL on MOCK+QCOM with IMAGE=1
  x = rng.permutation(2 * 3 * 16).astype(np.float32).reshape(2, 3, 4, 4)
  out, idx = Tensor(x).max_pool2d(kernel_size=4, return_indices=True)
  ref, ref_idx = F.max_pool2d(torch.tensor(x), kernel_size=4, return_indices=True)
  np.testing.assert_array_equal(out.numpy(), ref.numpy())
  np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())


def test_avg_pool_1d_3d_and_default_kernel():
  compare(lambda x: x.avg_pool2d(kernel_size=(3,), stride=2, padding=1),
          lambda x: F.avg_pool1d(x, 3, stride=2, padding=1), randn(1, 2, 8))
  compare(lambda x: x.avg_pool2d(kernel_size=(2, 2, 2)), lambda x: F.avg_pool3d(x, 2), randn(1, 1, 4, 4, 2))
  compare(lambda x: x.avg_pool2d(), lambda x: F.avg_pool2d(x, 2), randn(1, 1, 4, 6))


MAX_CASES = [
  {"kernel_size": 2},
  {"kernel_size": 3, "stride": 2, "padding": 1},
  {"kernel_size": 3, "stride": 1, "dilation": 2},
  {"kernel_size": 3, "stride": 2, "ceil_mode": True},
  {"kernel_size": (2, 3), "stride": (2, 1), "padding": (1, 1), "ceil_mode": True},
  {"kernel_size": 2, "stride": 3},
]


@pytest.mark.parametrize("kw", MAX_CASES)
def test_max_pool2d(kw):
  x = rng.permutation(2 * 2 * 7 * 6).astype(np.float32).reshape(2, 2, 7, 6)  # distinct values: one argmax each
  compare(lambda x: x.max_pool2d(**kw), lambda x: F.max_pool2d(x, **kw), x)
  out, idx = Tensor(x).max_pool2d(**kw, return_indices=True)
  ref, ref_idx = F.max_pool2d(torch.tensor(x), **kw, return_indices=True)
  np.testing.assert_array_equal(out.numpy(), ref.numpy())
  np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())


def test_max_pool_ints_1d_and_ties():
  x = np.array([[[3, -7, 3, 2, 9, 9]]], dtype=np.int32)
  out, idx = Tensor(x).max_pool2d(kernel_size=(2,), stride=1, return_indices=True)
  assert out.tolist() == [[[3, 3, 3, 9, 9]]]
  assert idx.tolist() == [[[0, 2, 2, 4, 4]]]  # the first maximum in each window
  compare(lambda x: x.max_pool2d(kernel_size=(2, 2, 2)), lambda x: F.max_pool3d(x, 2), randn(1, 2, 4, 2, 4))


def test_max_unpool2d_inverts_max_pool():
  x = rng.permutation(1 * 2 * 4 * 6).astype(np.float32).reshape(1, 2, 4, 6)
  out, idx = Tensor(x).max_pool2d(kernel_size=2, return_indices=True)
  ref, ref_idx = F.max_pool2d(torch.tensor(x), 2, return_indices=True)
  np.testing.assert_array_equal(out.max_unpool2d(idx, kernel_size=2).numpy(), F.max_unpool2d(ref, ref_idx, 2).numpy())
  big = out.max_unpool2d(idx, kernel_size=2, output_size=(5, 7))
  np.testing.assert_array_equal(big.numpy(), F.max_unpool2d(ref, ref_idx, 2, output_size=(5, 7)).numpy())


def test_pool_errors():
  with pytest.raises(ValueError, match="larger than"):
    Tensor.zeros(1, 1, 2, 2).max_pool2d(kernel_size=3)
  with pytest.raises(ValueError, match="padding"):
    Tensor.zeros(1, 1, 4, 4).avg_pool2d(padding=(1, 1, 1))
  with pytest.raises(ValueError, match="kernel_size"):
    Tensor.zeros(3).avg_pool2d(kernel_size=(2, 2))


# ***** interpolate *****

@pytest.mark.parametrize("size,mode,align", [
  ((7,), "linear", False), ((3,), "linear", True), ((9,), "linear", True), ((1,), "linear", True),
  ((7, 3), "linear", False), ((2, 8), "linear", True), ((7, 3), "nearest", False), ((3, 9), "nearest", False),
  ((7, 3), "nearest-exact", False), ((3, 10), "nearest-exact", False), ((3, 5, 2), "linear", False),
])
def test_interpolate(size, mode, align):
  nd = len(size)
  x = randn(1, 2, *[(5, 4, 3)[i] for i in range(nd)])
  tmode = {1: "linear", 2: "bilinear", 3: "trilinear"}[nd] if mode == "linear" else mode
  kw = {"align_corners": align} if mode == "linear" else {}
  compare(lambda t: t.interpolate(size, mode=mode, **kw), lambda t: F.interpolate(t, size=size, mode=tmode, **kw), x,
          atol=1e-5)


def test_interpolate_keeps_dtype_and_batch_dims():
  x = np.arange(12, dtype=np.int32).reshape(3, 4)
  out = Tensor(x).interpolate((6,), mode="nearest")  # only the last dim; the first is a batch dim
  assert out.dtype == Tensor(x).dtype
  np.testing.assert_array_equal(out.numpy(), x[:, [0, 0, 1, 2, 2, 3]])  # floor(dst * 4/6)


def test_interpolate_linear_keeps_infs_local():
  x = np.array([[[0.0, np.inf, 0.0, 1.0, 2.0, -np.inf, 3.0]]], np.float32)
  got = Tensor(x).interpolate((12,)).numpy()
  want = F.interpolate(torch.tensor(x), size=(12,), mode="linear").numpy()
  # torch multiplies the unused neighbour of output 0 by a zero weight (0*inf = nan); we read only the used one
  assert got[0, 0, 0] == 0.0 and np.isnan(want[0, 0, 0])
  np.testing.assert_allclose(got[..., 1:], want[..., 1:], rtol=1e-6)


def test_interpolate_errors():
  with pytest.raises(ValueError, match="bicubic"): Tensor.zeros(1, 4).interpolate((2,), mode="bicubic")
  with pytest.raises(ValueError, match="align_corners"): Tensor.zeros(1, 4).interpolate((2,), "nearest", True)
  with pytest.raises(ValueError, match="size"): Tensor.zeros(4).interpolate((2, 2))
  with pytest.raises(ValueError, match="size"): Tensor.zeros(4).interpolate((0,))


# ***** normalization, dropout, attention *****

def test_layernorm():
  compare(lambda x: x.layernorm(), lambda x: F.layer_norm(x, (5,)), randn(3, 4, 5))
  compare(lambda x: x.layernorm(axis=(-2, -1), eps=1e-3), lambda x: F.layer_norm(x, (4, 5), eps=1e-3), randn(3, 4, 5))


def test_batchnorm():
  x, w, b, m, v = randn(2, 3, 4), randn(3), randn(3), randn(3), np.abs(randn(3)) + 0.5
  invstd = (1 / np.sqrt(v + 1e-5)).astype(np.float32)
  def ref(x, w, b, m, s): return (x - m.reshape(1, 3, 1)) * w.reshape(1, 3, 1) * s.reshape(1, 3, 1) + b.reshape(1, 3, 1)
  compare(lambda x, w, b, m, s: x.batchnorm(w, b, m, s), ref, x, w, b, m, invstd)
  # the same as torch's batch_norm with running statistics
  want = F.batch_norm(torch.tensor(x), torch.tensor(m), torch.tensor(v), torch.tensor(w), torch.tensor(b), eps=1e-5)
  got = Tensor(x).batchnorm(Tensor(w), Tensor(b), Tensor(m), Tensor(invstd))
  np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)
  got = Tensor(x).batchnorm(None, None, Tensor(m[:2]), Tensor(invstd[:2]), axis=0)
  np.testing.assert_allclose(got.numpy(), (x - m[:2, None, None]) * invstd[:2, None, None], atol=1e-5, rtol=1e-5)


def test_dropout():
  x, before = Tensor.ones(4000), Tensor.training
  try:
    Tensor.training = False
    np.testing.assert_array_equal(x.dropout(0.5).numpy(), np.ones(4000, np.float32))
    Tensor.training = True
    d = x.dropout(0.25).numpy()
    assert set(np.unique(d).tolist()) <= {0.0, float(np.float32(1 / 0.75))}
    assert 0.2 < (d == 0).mean() < 0.3
    np.testing.assert_array_equal(x.dropout(1.0).numpy(), np.zeros(4000, np.float32))
    np.testing.assert_array_equal(x.dropout(0.0).numpy(), np.ones(4000, np.float32))
    with pytest.raises(ValueError, match="1.5"): x.dropout(1.5)
  finally:
    Tensor.training = before


@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_scaled_dot_product_attention(mask):
  q, k, v = randn(2, 3, 4, 8), randn(2, 3, 5, 8), randn(2, 3, 5, 6)
  m = None
  if mask == "bool":
    m = rng.random((4, 5)) > 0.3
    m[:, 0] = True  # every query sees at least one key
  if mask == "float": m = randn(2, 1, 4, 5)
  causal = mask == "causal"
  def tiny(q, k, v): return q.scaled_dot_product_attention(k, v, None if m is None else Tensor(m), is_causal=causal)
  def ref(q, k, v): return F.scaled_dot_product_attention(q, k, v, None if m is None else torch.tensor(m),
                                                          is_causal=causal)
  compare(tiny, ref, q, k, v)


def test_sdpa_gqa_and_errors():
  q, k, v = randn(1, 4, 3, 8), randn(1, 2, 3, 8), randn(1, 2, 3, 8)
  compare(lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=True),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, v)
  with pytest.raises(ValueError, match="is_causal"):
    Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(q), attn_mask=Tensor.ones(3, 3), is_causal=True)


# ***** losses *****

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(reduction):
  p, y = rng.uniform(0.05, 0.95, (3, 4)).astype(np.float32), rng.integers(0, 2, (3, 4)).astype(np.float32)
  compare(lambda p, y: p.binary_crossentropy(y, reduction), lambda p, y: F.binary_cross_entropy(p, y,
          reduction=reduction), p, y)
  x = (randn(3, 4) * 30).astype(np.float32)  # large logits: the stable formula must not overflow
  pw = np.abs(randn(4)) + 0.5
  compare(lambda x, y: x.binary_crossentropy_logits(y, reduction), lambda x, y: F.binary_cross_entropy_with_logits(
          x, y, reduction=reduction), x, y)
  compare(lambda x, y: x.binary_crossentropy_logits(y, reduction, pos_weight=Tensor(pw)),
          lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction, pos_weight=torch.tensor(pw)), x, y)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_sparse_categorical_crossentropy(reduction, smoothing):
  x, y = randn(6, 5), rng.integers(0, 5, 6)
  def tiny(x): return x.sparse_categorical_crossentropy(Tensor(y), label_smoothing=smoothing, reduction=reduction)
  compare(tiny, lambda x: F.cross_entropy(x, torch.tensor(y), label_smoothing=smoothing, reduction=reduction), x)
  y_ign = y.copy(); y_ign[[1, 4]] = 2  # noqa: E702
  def tiny_ign(x): return x.sparse_categorical_crossentropy(Tensor(y_ign), ignore_index=2, label_smoothing=smoothing,
                                                           reduction=reduction)
  compare(tiny_ign, lambda x: F.cross_entropy(x, torch.tensor(y_ign), ignore_index=2, label_smoothing=smoothing,
                                              reduction=reduction), x)


def test_sparse_categorical_crossentropy_batched_and_default_ignore():
  x, y = randn(2, 3, 4), rng.integers(0, 4, (2, 3))
  compare(lambda x: x.sparse_categorical_crossentropy(Tensor(y)),
          lambda x: F.cross_entropy(x.permute(0, 2, 1), torch.tensor(y)), x)
  y[0, 0] = -1  # the default ignore_index=-1 counts the row but matches no class (tinygrad's rule)
  got = Tensor(x).sparse_categorical_crossentropy(Tensor(y), reduction="sum").item()
  lp = torch.log_softmax(torch.tensor(x), -1).numpy()
  want = -sum(lp[i, j, y[i, j]] for i in range(2) for j in range(3) if y[i, j] >= 0)
  assert got == pytest.approx(want, rel=1e-5)
  with pytest.raises(ValueError, match="label_smoothing"):
    Tensor(x).sparse_categorical_crossentropy(Tensor(y), label_smoothing=2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
  x, y = randn(4, 5, 3), rng.integers(0, 5, (4, 3))
  compare(lambda x: x.cross_entropy(Tensor(y), reduction), lambda x: F.cross_entropy(x, torch.tensor(y),
          reduction=reduction), x)
  probs = np.abs(randn(4, 5)); probs /= probs.sum(1, keepdims=True)
  compare(lambda x, p: x.cross_entropy(p, reduction, label_smoothing=0.1),
          lambda x, p: F.cross_entropy(x, p, reduction=reduction, label_smoothing=0.1), randn(4, 5), probs)
  compare(lambda x: x.cross_entropy(Tensor(np.array(2)), reduction, label_smoothing=0.3),
          lambda x: F.cross_entropy(x, torch.tensor(2), reduction=reduction, label_smoothing=0.3), randn(5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
  x, y, w = randn(6, 4), rng.integers(0, 4, 6), np.abs(randn(4)) + 0.1
  y[2] = -100
  compare(lambda x: x.log_softmax(1).nll_loss(Tensor(y), Tensor(w), ignore_index=-100, reduction=reduction),
          lambda x: F.nll_loss(torch.log_softmax(x, 1), torch.tensor(y), torch.tensor(w), reduction=reduction), x)
  y3 = rng.integers(0, 4, (2, 3))
  compare(lambda x: x.nll_loss(Tensor(y3), reduction=reduction),
          lambda x: F.nll_loss(x, torch.tensor(y3), reduction=reduction), randn(2, 4, 3))


def test_loss_errors():
  with pytest.raises(ValueError, match="'avg'"): Tensor.zeros(3).binary_crossentropy(Tensor.zeros(3), "avg")
  with pytest.raises(ValueError, match=r"\(4,\)"): Tensor.zeros(3, 5).cross_entropy(Tensor.zeros(4, dtype=dtypes.int32))
  with pytest.raises(ValueError, match=r"\(2,\)"):
    Tensor.zeros(3, 5).sparse_categorical_crossentropy(Tensor.zeros(2, dtype=dtypes.int32))


def test_one_hot():
  y = rng.integers(0, 5, (2, 3))
  np.testing.assert_array_equal(Tensor(y).one_hot(6).numpy(), F.one_hot(torch.tensor(y), 6).numpy())
  np.testing.assert_array_equal(Tensor(y).one_hot(int(y.max()) + 1).numpy(), F.one_hot(torch.tensor(y)).numpy())
  assert Tensor([1, 0]).one_hot(2).tolist() == [[0, 1], [1, 0]]


def test_one_hot_errors():
  with pytest.raises(TypeError, match="float"): Tensor([1.0]).one_hot(2)
  with pytest.raises(ValueError, match="-3"): Tensor([1]).one_hot(-3)


def test_docstring_examples_run():
  import doctest

  from tiny_tensor import nnops
  res = doctest.testmod(nnops, optionflags=doctest.ELLIPSIS)
  assert res.failed == 0 and res.attempted >= 30, res


def test_conv2d_input_gradient_is_a_plain_conv():
  # the input gradient is the transposed conv of the incoming gradient (a conv over it, padded): no kernel indexes
  # through div/mod, as differentiating the sliding-window view would (a scatter computing mostly zeros)
  x, w = Tensor(randn(2, 3, 12, 12), requires_grad=True), Tensor(randn(4, 3, 5, 5), requires_grad=True)
  (x.conv2d(w) * Tensor(randn(2, 4, 8, 8))).sum().backward()
  asts = [c.src[0] for c in x.grad.schedule().calls if c.src[0].op is Ops.SINK]
  assert asts and not any(u.op in (Ops.CDIV, Ops.CMOD) for a in asts for u in a.toposort())


@pytest.mark.parametrize("shape, groups, panel", [((32, 8, 3, 3), 1, 16), ((32, 8, 3, 3), 1, 0), ((32, 4, 3, 3), 2, 16),
                                                  ((48, 4, 5), 1, 16)])
def test_conv_weight_prepared_once_matches_torch(shape, groups, panel):
  """A weight laid out once by `conv_weight_channels_last(realize=True)` (channels-last, or in panels of output
  channels) convolves like the plain weight (torch's numbers), and conv2d copies it no more: one kernel a conv."""
  import torch

  from tiny_tensor.engine import GlobalCounters
  from tiny_tensor.nnops import conv_weight_channels_last
  rng = np.random.default_rng(2)
  w = rng.standard_normal(shape).astype(np.float32)
  x = rng.standard_normal((1, shape[1] * groups, *[9] * (len(shape) - 2))).astype(np.float32)
  prepared = conv_weight_channels_last(Tensor(w), realize=True, panel=panel)
  xt = Tensor(x).realize()
  GlobalCounters.reset()
  got = xt.conv2d(prepared, groups=groups, padding=1).realize()
  assert GlobalCounters.kernel_count == 1
  conv = torch.nn.functional.conv2d if len(shape) == 4 else torch.nn.functional.conv1d
  want = conv(torch.from_numpy(x), torch.from_numpy(w), groups=groups, padding=1).numpy()
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="panel=5 must divide Cout=32"):
    conv_weight_channels_last(Tensor(w[:32]), panel=5)


@pytest.mark.parametrize("cin, cout, hw, kw", [
  (5, 64, (9, 13), dict(padding=1)),                             # two vectors of channels x 13 pixels' divisor
  (6, 64, (11, 14), dict(padding=(2, 1), dilation=2)),           # dilated, uneven padding
  (8, 96, (10, 7), dict(padding=1, groups=2)),                   # 48 channels a group: 3 vectors, not widened
  (4, 32, (12, 12), dict(stride=2, padding=2, dilation=(1, 2))),
  (3, 64, (8, 16), dict(padding=0)),
])
@pytest.mark.parametrize("act", ["relu", "silu"])
def test_conv2d_blocked_channels_with_fused_activation_matches_torch(cin, cout, hw, kw, act):
  """Convs whose output channels take two vectors of the register block (`_widen_conv_channels`), with a bias and an
  activation as their epilogue, at odd sizes, strides, padding, dilation and groups: torch's numbers. The conv, its
  bias and a relu are one kernel (weight prepared once, as the ONNX runner does)."""
  from tiny_tensor.engine import GlobalCounters
  from tiny_tensor.nnops import conv_weight_channels_last
  r = np.random.default_rng(7)
  x = r.standard_normal((1, cin, *hw)).astype(np.float32)
  w = r.standard_normal((cout, cin // kw.get("groups", 1), 3, 3)).astype(np.float32)
  b = r.standard_normal(cout).astype(np.float32)
  xt, wt, bt = Tensor(x).realize(), conv_weight_channels_last(Tensor(w), realize=True), Tensor(b).realize()
  GlobalCounters.reset()
  y = xt.conv2d(wt, bt, **kw)
  got = (y.relu() if act == "relu" else y.silu()).realize()
  if act == "relu": assert GlobalCounters.kernel_count == 1
  ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), **kw)
  want = (F.relu(ref) if act == "relu" else F.silu(ref)).numpy()
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
