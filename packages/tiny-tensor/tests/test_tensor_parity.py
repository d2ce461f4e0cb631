"""Ops and semantics added for tinygrad parity, each against torch (forward and backward) or numpy: inverse trig,
copysign/fmod/logaddexp/log10, isclose, nonzero/masked_select, gelu(approximate), bitcast between item sizes, pow's
special cases, sigmoid/clip/prod/normalize gradients, shifts' errors, pad_to/shrink_to, newton_schulz and qr; and the
public surface against tinygrad's."""
import math

import numpy as np
import pytest
from tiny_tensor import Tensor, dtypes
from tiny_uop.plugins import Device

torch = pytest.importorskip("torch")
rng = np.random.default_rng(7)


def check(tiny_fn, torch_fn, *arrays, atol=1e-5, rtol=1e-5, grad=True):
  """Forward and (for float inputs) backward of tiny_fn against torch_fn on the same data."""
  ts = [Tensor(a, requires_grad=grad) for a in arrays]
  qs = [torch.tensor(a, requires_grad=grad) for a in arrays]
  out, want = tiny_fn(*ts), torch_fn(*qs)
  np.testing.assert_allclose(out.numpy(), want.detach().numpy(), atol=atol, rtol=rtol)
  if not grad: return
  w = rng.standard_normal(want.shape).astype(np.float32)
  (out * Tensor(w)).sum().backward()
  (want * torch.tensor(w)).sum().backward()
  for t, q in zip(ts, qs):
    np.testing.assert_allclose(t.grad.numpy(), q.grad.numpy(), atol=atol * 10, rtol=rtol * 10)


@pytest.mark.parametrize("name", ["acos", "asin", "atan"])
def test_inverse_trig(name):
  x = np.concatenate([np.linspace(-0.999, 0.999, 41), [0.0, 0.5, -0.5]]).astype(np.float32)
  if name == "atan": x = np.concatenate([x * 50, [1e30, -1e30, 1.0, -1.0]]).astype(np.float32)
  check(lambda t: getattr(t, name)(), lambda q: getattr(q, name)(), x, atol=2e-6)


def test_inverse_trig_edges():
  np.testing.assert_allclose(Tensor([1.0, -1.0, 2.0]).acos().numpy(), [0.0, math.pi, np.nan], atol=1e-6)
  np.testing.assert_allclose(Tensor([1.0, -1.0, -2.0]).asin().numpy(), [math.pi / 2, -math.pi / 2, np.nan], atol=1e-6)
  np.testing.assert_allclose(Tensor([math.inf, -math.inf, math.nan]).atan().numpy(),
                             [math.pi / 2, -math.pi / 2, np.nan], atol=1e-6)
  assert Tensor([1, 0]).acos().dtype == dtypes.float32


def test_binary_math():
  a = rng.standard_normal(20).astype(np.float32) * 5
  b = np.where(np.abs(x := rng.standard_normal(20).astype(np.float32) * 3) < 0.3, 1.0, x).astype(np.float32)
  check(lambda x, y: x.copysign(y), torch.copysign, a, b)
  check(lambda x, y: x.fmod(y), torch.fmod, a, b)
  check(lambda x, y: x.logaddexp(y), torch.logaddexp, a, b)
  check(lambda x: (x.abs() + 0.1).log10(), lambda q: (q.abs() + 0.1).log10(), a)
  np.testing.assert_array_equal(Tensor([-7, 7, -7, 7]).fmod(Tensor([3, 3, -3, -3])).numpy(),
                                torch.fmod(torch.tensor([-7, 7, -7, 7]), torch.tensor([3, 3, -3, -3])).numpy())
  np.testing.assert_array_equal(Tensor([1.0, 1.0, 2.0]).copysign(Tensor([-0.0, 0.0, -math.inf])).numpy(),
                                [-1.0, 1.0, -2.0])
  np.testing.assert_array_equal(Tensor([-math.inf, math.inf]).logaddexp(Tensor([-math.inf, 1.0])).numpy(),
                                [-math.inf, math.inf])


def test_isclose_allclose():
  a = np.array([1.0, 1.0, math.inf, -math.inf, math.nan, 1e-9, 100.0, math.inf], np.float32)
  b = np.array([1.0 + 1e-6, 1.1, math.inf, math.inf, math.nan, 0.0, 100.001, 1e30], np.float32)
  for kw in ({}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0.0}):
    np.testing.assert_array_equal(Tensor(a).isclose(Tensor(b), **kw).numpy(),
                                  torch.isclose(torch.tensor(a), torch.tensor(b), **kw).numpy())
  assert Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0000001])) and not Tensor([1.0]).allclose(Tensor([1.1]))


def test_nonzero_masked_select():
  x = rng.integers(-2, 3, (3, 4, 5)).astype(np.int32)
  np.testing.assert_array_equal(Tensor(x).nonzero().numpy(), np.argwhere(x))
  np.testing.assert_array_equal(Tensor([0, 0]).nonzero().numpy().shape, (0, 1))
  got = Tensor([0, 3, 0, 4]).nonzero(size=3, fill_value=-1).numpy()
  np.testing.assert_array_equal(got, [[1], [3], [-1]])
  f = rng.standard_normal((4, 6)).astype(np.float32)
  m = f > 0.2
  np.testing.assert_array_equal(Tensor(f).masked_select(Tensor(m)).numpy(), f[m])
  np.testing.assert_array_equal(Tensor(f).masked_select(Tensor(m[0])).numpy(), f[np.broadcast_to(m[0], f.shape)])
  np.testing.assert_array_equal(Tensor([1, 2, 3]).masked_select(Tensor([True, False, True]), size=4, fill_value=9)
                                .numpy(), [1, 3, 9, 9])
  with pytest.raises(TypeError, match="bool mask"): Tensor([1, 2]).masked_select(Tensor([1, 0]))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu(approximate):
  x = np.linspace(-6, 6, 49).astype(np.float32)
  check(lambda t: t.gelu(approximate=approximate),
        lambda q: torch.nn.functional.gelu(q, approximate=approximate), x, atol=2e-6)
  with pytest.raises(ValueError, match="'erf'"): Tensor([1.0]).gelu(approximate="erf")


@pytest.mark.parametrize("src,dst", [(np.float32, np.uint16), (np.float32, np.uint8), (np.uint16, np.uint32),
                                     (np.uint8, np.float32), (np.int64, np.int16), (np.float16, np.int32),
                                     (np.int8, np.uint64), (np.float64, np.float32)])
def test_bitcast_sizes(src, dst):
  x = np.random.default_rng(17).integers(0, 255, (3, 8), dtype=np.uint8).view(src)  # its own seed: not xdist's order
  from tiny_uop.dtype import from_numpy
  got = Tensor(x).bitcast(from_numpy(np.dtype(dst))).numpy()
  np.testing.assert_array_equal(got.view(np.uint8), x.view(dst).view(np.uint8))
  with pytest.raises(RuntimeError, match="doesn't fit"): Tensor.zeros(3, dtype=dtypes.uint8).bitcast(dtypes.uint16)


def test_bitcast_keeps_nan_payloads():
  # a bitcast moves bits: signaling NaNs, payloads and signs come out as they went in (a storage-only half device
  # converts half through float and once quieted them: 0x7d01 came back 0x7f01)
  # The PYTHON device computes with Python floats: its documented semantics (tiny_uop.alu) make a NaN the quiet NaN of
  # its sign
  bits = np.array([0x7d01, 0x7c01, 0xfd55, 0x7e00, 0x7fff, 0x7c00, 0xfc00, 0x3c00, 0x0001, 0x8000], np.uint16)
  want = bits
  if Device.DEFAULT == "PYTHON": want = np.where(np.isnan(bits.view(np.float16)), (bits & 0x8000) | 0x7e00, bits)
  np.testing.assert_array_equal(Tensor(bits.view(np.float16)).bitcast(dtypes.int16).numpy().view(np.uint16), want)
  np.testing.assert_array_equal(Tensor(bits.view(np.float16).reshape(5, 2)).bitcast(dtypes.int32).numpy().view(
    np.uint16).ravel(), want)


def test_pow_special_cases():
  b = np.array([-2, -2, 0, -0.0, 0, 2, -math.inf, -math.inf, math.inf, -1, -1, 1, math.nan, math.nan, 0.5, -0.5, 3],
               np.float32)
  e = np.array([3, 0.5, 0, -1, -1, -math.inf, 3, 0.5, -2, math.inf, -math.inf, math.nan, 0, 1, math.inf, -math.inf,
                -math.inf], np.float32)
  with np.errstate(all="ignore"): want = np.power(b, e)
  np.testing.assert_array_equal((Tensor(b) ** Tensor(e)).numpy(), want)
  np.testing.assert_array_equal((Tensor(b) ** Tensor(e)).numpy(), torch.pow(torch.tensor(b), torch.tensor(e)).numpy())


def test_pow_gradients():
  b = np.array([-2.0, 0.0, 0.0, 1.5, 3.0, 0.0], np.float32)
  e = np.array([3.0, 2.0, 0.0, 0.5, -1.5, 1.0], np.float32)
  check(lambda x, y: x ** y, torch.pow, b, e)
  check(lambda y: 2.0 ** y, lambda y: 2.0 ** y, e)


def test_extreme_sigmoid_and_friends():
  x = np.array([-1000, -100, -20, 0, 20, 100, 1000], np.float32)
  check(lambda t: t.sigmoid(), torch.sigmoid, x)
  check(lambda t: t.silu(), torch.nn.functional.silu, x, atol=1e-4)
  check(lambda t: t.tanh(), torch.tanh, x)


def test_clip_prod_normalize_gradients():
  x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
  check(lambda t: t.clip(0, 1), lambda q: q.clamp(0, 1), x)
  check(lambda t: t.clip(max_=0.5), lambda q: q.clamp(max=0.5), x)
  for arr in (np.array([0.0, 2.0, 3.0], np.float32), np.array([0.0, 0.0, 3.0], np.float32),
              rng.standard_normal((3, 4)).astype(np.float32)):
    check(lambda t: t.prod(), torch.prod, arr)
  z = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]], np.float32).reshape(2, 3, 1)
  z2 = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)
  check(lambda t: t.prod(1, keepdim=True), lambda q: q.prod(1, keepdim=True), z)
  check(lambda t: t.normalize(dim=1), lambda q: torch.nn.functional.normalize(q, dim=1), z2, rtol=1e-4)
  check(lambda t: t.normalize(p=3, dim=0), lambda q: torch.nn.functional.normalize(q, p=3, dim=0), z2, rtol=1e-4)


def test_zero_dim_and_realized_leaf_gradients():
  x = Tensor(3.0, requires_grad=True)
  (x * x).backward()
  assert x.grad.shape == () and x.grad.item() == 6.0
  y = Tensor([1.0, 2.0]).realize().requires_grad_()
  z = Tensor([4.0, 5.0], requires_grad=True).realize()
  (y * z).sum().backward()
  assert y.grad.tolist() == [4.0, 5.0] and z.grad.tolist() == [1.0, 2.0]
  w = Tensor(2.0, requires_grad=True)
  gw, = (w.exp() * 3).gradient(w)
  assert abs(gw.item() - 3 * math.exp(2.0)) < 1e-4


def test_shift_errors_and_reverse():
  assert (Tensor([1, 2], dtype=dtypes.uint8) << 2).tolist() == [4, 8]
  assert (Tensor([-8]) >> 1).tolist() == [-4]
  assert (1 << Tensor([0, 3])).tolist() == [1, 8] and (64 >> Tensor([1, 2])).tolist() == [32, 16]
  with pytest.raises(ValueError, match="-1"): Tensor([1]) << -1
  with pytest.raises(RuntimeError, match="float32"): Tensor([1.0]) << 1
  with pytest.raises(ValueError, match="1.5"): Tensor([1]) >> 1.5


def test_shape_helpers():
  assert Tensor([[1, 2]]).pad_to(2, 3).tolist() == [[1, 2, 0], [0, 0, 0]]
  assert Tensor([[1, 2]]).pad_to(None, 3, value=7).tolist() == [[1, 2, 7]]
  assert Tensor([[1, 2, 3], [4, 5, 6]]).shrink_to(1, 2).tolist() == [[1, 2]]
  with pytest.raises(ValueError, match="smaller"): Tensor([1, 2]).pad_to(1)
  assert Tensor.ones(2, 3).max_shape == (2, 3) and Tensor.ones(2, 3).max_numel() == 6
  assert Tensor([1, 2]).const_like(5).tolist() == [5, 5]
  assert Tensor([1]).usum(Tensor([2]), Tensor([3])).tolist() == [6]
  assert Tensor([2]).uprod(Tensor([3])).tolist() == [6]


def test_newton_schulz_and_qr():
  g = rng.standard_normal((6, 4)).astype(np.float32)
  x = g / (np.linalg.norm(g) + 1e-7)
  x = x.T
  for _ in range(5):
    a = x @ x.T
    x = 3.4445 * x + (-4.775 * a + 2.0315 * a @ a) @ x
  np.testing.assert_allclose(Tensor(g).newton_schulz(5, (3.4445, -4.775, 2.0315)).numpy(), x.T, atol=1e-4)
  for shape in [(4, 4), (5, 3), (3, 5), (2, 4, 3)]:
    a = rng.standard_normal(shape).astype(np.float32)
    q, r = Tensor(a).qr()
    wq, wr = np.linalg.qr(a, mode="complete")
    np.testing.assert_allclose(np.abs(r.numpy()), np.abs(wr), atol=1e-4)
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-4)
    np.testing.assert_allclose(np.abs(q.numpy()), np.abs(wq), atol=1e-4)


# what of tinygrad 0.14's public Tensor surface we leave out, and why (README: "Not from tinygrad")
LEFT_OUT = {
  "from_url": "downloads at run time (no network here)", "decode_hevc_frame": "a video decoder, not a tensor op",
  "keccak": "SHA-3 hashing", "hash": "tinygrad's keccak-based tensor hash", "svd": "not yet: one-sided Jacobi",
  "image_conv2d": "tinygrad's IMAGE=1 Qualcomm path; ours is a renderer option", "image_dot": "as image_conv2d",
  "from_blob": "wraps a raw pointer", "custom_kernel": "tinygrad's kernel DSL", "call": "tinygrad's function IR",
  "callify": "tinygrad's function IR", "as_param": "tinygrad's function IR", "is_param": "tinygrad's function IR",
  "is_param_": "tinygrad's function IR", "linear_with_vars": "tinygrad's schedule internals",
  "schedule_linear": "tinygrad's schedule internals (ours: Tensor.schedule)", "alu": "takes tinygrad's Ops",
  "const": "takes tinygrad's const semantics on UOps", "ufix": "tinygrad's UOp/Tensor mixin plumbing",
  "invalids": "tinygrad's INVALID sentinel", "threefry": "our RNG is Tensor.rand's counter-based threefry",
  "random_bits": "as threefry",
}


def test_surface_matches_tinygrad():
  """Every public name of tinygrad's Tensor exists here or is listed in LEFT_OUT with a reason."""
  pytest.importorskip("tinygrad", reason="tinygrad==0.14.0 is a test oracle in BENCH_DEPS")
  from tinygrad import Tensor as TG
  theirs = {n for n in dir(TG) if not n.startswith("_")}
  ours = {n for n in dir(Tensor) if not n.startswith("_")}
  assert sorted(theirs - ours - set(LEFT_OUT)) == []


# what of tinygrad 0.14's nn, nn.optim, nn.state we leave out, and why (README: "Not from tinygrad")
NN_LEFT_OUT = {
  "state.TensorIO": "a file object over a uint8 Tensor (tinygrad reads archives through it; ours reads bytes)",
  "state.accept_filename": "tinygrad's decorator plumbing (our loaders take a path or a Tensor themselves)",
  "state.fs_store": "tinygrad's TINYFS network store", "state.fs_load": "tinygrad's TINYFS network store",
  "state.zip_extract": "archive member extraction; torch_load reads the zip format itself",
  "state.tar_extract": "archive member extraction (tar); no loader here needs it",
}

# tinygrad 0.14 parameter names we don't take, and why: (module, callable, parameter)
PARAMS_LEFT_OUT = {
  ("state", "safe_load_metadata", "t"): "positional in both; ours is named fn (a path or a Tensor)",
  ("state", "torch_load", "t"): "positional in both; ours is named fn (a path or a Tensor)",
}


def _defined_names(mod) -> dict:
  """Public classes and functions a module defines itself (not the helpers it imports)."""
  import inspect
  return {n: o for n, o in vars(mod).items() if not n.startswith("_") and (inspect.isclass(o) or inspect.isfunction(o))
          and getattr(o, "__module__", None) == mod.__name__}


def test_nn_surface_matches_tinygrad():
  """Every public class/function of tinygrad's nn, nn.optim and nn.state exists here, taking every parameter name
  tinygrad's takes (ours may take more); TinyJit takes tinygrad's `prune`."""
  import inspect
  pytest.importorskip("tinygrad", reason="tinygrad==0.14.0 is a test oracle in BENCH_DEPS")
  from tinygrad import nn as tg_nn
  from tiny_tensor import TinyJit, nn
  missing, params = [], []
  for key, theirs, ours in [("nn", tg_nn, nn), ("optim", tg_nn.optim, nn.optim), ("state", tg_nn.state, nn.state)]:
    for name, obj in _defined_names(theirs).items():
      if not hasattr(ours, name):
        if f"{key}.{name}" not in NN_LEFT_OUT: missing.append(f"{key}.{name}")
        continue
      want = [p for p in inspect.signature(obj).parameters if p not in ("self", "args", "kwargs")]
      have = set(inspect.signature(getattr(ours, name)).parameters)
      params += [f"{key}.{name}({p})" for p in want if p not in have and (key, name, p) not in PARAMS_LEFT_OUT]
  assert missing == [] and params == []
  assert "prune" in inspect.signature(TinyJit).parameters
