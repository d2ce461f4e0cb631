"""tinygrad 0.14 API semantics (issue #35): package attributes, Context flag names, dtype arguments and conversions,
and internal errors that must not surface. Each case checks numbers against torch / numpy / ml_dtypes, or names against
tinygrad 0.14 itself."""
import subprocess
import sys

import numpy as np
import pytest

from tiny_tensor import Context, Tensor, dtypes


def test_nn_is_a_lazy_package_attribute():
  # tinygrad: `import tinygrad; tinygrad.nn.Linear` works. A fresh interpreter: other tests may have imported nn
  code = ("import sys, tiny_tensor\n"
          "eager = 'tiny_tensor.nn' in sys.modules\n"
          "lin = tiny_tensor.nn.Linear(3, 2)\n"
          "print(eager, type(lin).__name__, lin.weight.shape, 'nn' in dir(tiny_tensor))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["False", "Linear", "(2,", "3)", "True"]
  import tiny_tensor
  with pytest.raises(AttributeError, match="no attribute 'not_a_module'"): tiny_tensor.not_a_module  # noqa: B018


def _tinygrad_flag_names() -> set[str]:
  import tinygrad.helpers as tgh
  import tinygrad.uop.ops  # noqa: F401  (declares TRACK_MATCH_STATS, REWRITE_STACK_LIMIT)
  return set(tgh.ContextVar._cache)


def test_context_accepts_every_tinygrad_flag():
  names = _tinygrad_flag_names()
  assert {"IGNORE_BEAM_CACHE", "WINO", "JIT_BATCH_SIZE", "DEBUG"} <= names  # the reference really was read
  for name in sorted(names):
    with Context(**{name: 0 if name not in ("DEV", "DEFAULT_FLOAT", "DEFAULT_INT", "EMULATED_DTYPES") else ""}): pass


def test_context_implemented_flags_take_effect_and_unknown_raise():
  from tiny_codegen.opt import search
  from tiny_tensor import multi
  with Context(IGNORE_BEAM_CACHE=1): assert bool(search.IGNORE_BEAM_CACHE)
  assert not search.IGNORE_BEAM_CACHE
  with Context(RING=0): assert not multi.RING
  with pytest.raises(KeyError, match=r"NOT_A_FLAG.*known:.*IGNORE_BEAM_CACHE"): Context(NOT_A_FLAG=1)


def test_context_noop_flags_are_documented():
  import pathlib

  from tiny_uop.helpers import TINYGRAD_NOOP_FLAGS
  readme = (pathlib.Path(__file__).parents[2] / "tiny-uop" / "README.md").read_text()
  assert (missing := [k for k in TINYGRAD_NOOP_FLAGS if f"`{k}`" not in readme]) == [], missing


def test_stack_and_cat_take_a_sequence():
  import torch
  a, b = np.array([1, 2], np.int32), np.array([3, 4], np.int32)
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  np.testing.assert_equal(Tensor.stack((Tensor(a), Tensor(b))).numpy(), torch.stack((ta, tb)).numpy())
  np.testing.assert_equal(Tensor.stack([Tensor(a), Tensor(b)], dim=1).numpy(), torch.stack([ta, tb], dim=1).numpy())
  np.testing.assert_equal(Tensor.cat((Tensor(a), Tensor(b))).numpy(), torch.cat((ta, tb)).numpy())
  with pytest.raises(TypeError, match="int 3"): Tensor.stack((Tensor(a), 3))
  with pytest.raises(ValueError, match=r"\(2,\) and \(3,\)"): Tensor.stack(Tensor(a), Tensor([1, 2, 3]))


@pytest.mark.parametrize("diagonal", [-1, 0, 1])
def test_tril_triu_keep_bool(diagonal):
  import torch
  x = np.array([[1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1]], dtype=bool)
  for name in ("tril", "triu"):
    got = getattr(Tensor(x), name)(diagonal)
    want = getattr(torch, name)(torch.from_numpy(x), diagonal).numpy()
    assert got.dtype == dtypes.bool
    np.testing.assert_equal(got.numpy(), want)


def test_sigmoid_extremes_finite():
  import torch
  v = [-np.inf, -1e4, -1000.0, -100.0, -30.0, 0.0, 30.0, 100.0, 1000.0, 1e4, np.inf]
  for dt, tdt in [("float32", torch.float32), ("float16", torch.float16), ("float64", torch.float64)]:
    x = Tensor(v, dtype=dt, requires_grad=True)
    x.sigmoid().sum().backward()
    tx = torch.tensor(v, dtype=tdt, requires_grad=True)
    torch.sigmoid(tx).sum().backward()
    np.testing.assert_allclose(x.sigmoid().numpy(), torch.sigmoid(tx).detach().numpy(), rtol=1e-3, atol=0)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-30)


@pytest.mark.parametrize("args", [(2**31, 2**31 + 3), (-2**31 - 2, -2**31 + 1), (2**40, 2**40 - 10, -3),
                                  (0, 2**31 + 2, 2**30), (2**62, 2**62 + 5, 2), (5,), (10, 0, -3)])
def test_arange_picks_int64_past_int32(args):
  import torch
  t, want = Tensor.arange(*args), torch.arange(*args)
  assert t.dtype == (dtypes.int32 if want.abs().max() < 2**31 else dtypes.int64)
  np.testing.assert_equal(t.numpy(), want.numpy())
  with pytest.raises(ValueError, match="not representable in dtype dtypes.int32"):
    Tensor.arange(2**31, 2**31 + 3, dtype=dtypes.int32)


def test_bitwise_with_unsigned_spelled_masks():
  a = np.array([1, 2, -5, 2**31 - 1, -2**31], np.int32)
  np.testing.assert_equal((Tensor(a) | 0xFFFFFFFF).numpy(), a | np.uint32(0xFFFFFFFF).view(np.int32))
  np.testing.assert_equal((0xFFFF0000 & Tensor(a)).numpy(), a & np.uint32(0xFFFF0000).view(np.int32))
  np.testing.assert_equal((Tensor(a) ^ 0x80000000).numpy(), a ^ np.uint32(0x80000000).view(np.int32))
  u = a.view(np.uint32)
  np.testing.assert_equal((Tensor(u) & -1).numpy(), u & np.int32(-1).view(np.uint32))
  with pytest.raises(ValueError, match="1099511627776 is out of range"): Tensor(a) | 2**40


@pytest.mark.parametrize("name", ["float16", "half", "bfloat16", "int32", "uint8", "int64", "float64", "bool"])
def test_dtype_names_as_strings(name):
  import torch
  tname = {"half": "float16"}.get(name, name)
  want = torch.tensor([1.5, 0.0, -2.0]).to(getattr(torch, tname))
  got = Tensor([1.5, 0.0, -2.0], dtype=name)
  assert got.dtype == getattr(dtypes, name)
  np.testing.assert_equal(got.numpy(), want.float().numpy() if tname == "bfloat16" else want.numpy())
  np.testing.assert_equal(Tensor([1.5, 0.0, -2.0]).cast(name).numpy(), got.numpy())
  assert Tensor.zeros(2, dtype=name).dtype == Tensor.full((2,), 1, dtype=name).dtype == getattr(dtypes, name)
  with pytest.raises(ValueError, match="unknown dtype 'floatx'; valid names: .*bfloat16"): Tensor([1], dtype="floatx")


def _views_of_realized_scalar(x):
  # the fuzzer's find: realizing x.flatten() (x's own buffer, no copy) left x.flatten().reshape(()) with an origin
  # that contains its new node, x's `RESHAPE(B, ())`: backward raised "replacing Ops.RESHAPE leads back to itself"
  f = x.flatten()
  z = f.reshape(())
  y = z + f.reshape(())
  keep = (z.reshape((1,)), f * z.reshape((1,)))
  f.tolist()
  return y.unsqueeze(0), keep


def _contiguous_then_view(x):  # "replacing Ops.BUFFER leads back to itself"
  c = x.contiguous()
  u = c.unsqueeze(0)
  Tensor.realize(c)
  Tensor.realize(u)
  return u * 2, (c, u)


def _nested_unsqueeze(x):  # the realized view (1, 1) of x's buffer kept no origin: a gradient of 1.0 instead of 8.0
  a = x.unsqueeze(0)
  b = a.unsqueeze(0)
  b.realize()
  return (b * b + b).reshape(1) + a, (a, b)


def _views_realized_into_each_other(x):
  # v = p[None] is p's buffer C itself, then s = v.squeeze() is p's node again: s's origin (a view of v's node) and
  # v's (a view of p's node) led into each other: "replacing Ops.RESHAPE leads back to itself (cycle)"
  p = x * 2
  p.tolist()
  v = p[None]
  w = v + p.reshape(1)
  Tensor.realize(v)
  s = v.squeeze()
  s.tolist()
  return s * 3 + w.sum(), (p, v, w, s)


def _contiguous_realized_with_its_source(x):
  # c = y.contiguous() is y's buffer (no copy): c took y's node with no origin, and backward took that node for a
  # leaf's, stopping there (x.grad None instead of 14)
  y = x * x + x
  y.realize()
  c = y.contiguous()
  Tensor.realize(c, y)
  return c + y, (y, c)


def _realized(f):  # `x -> f(x).realize() * 2`, the realized view kept alive: its gradient was None
  def prog(x):
    v = f(x).realize()
    return v * 2, (v,)
  return prog


_VIEW_PROGRAMS = {  # tiny program, the same values in torch (where realize is a no-op)
  "views": (_views_of_realized_scalar, lambda x: (x + x).unsqueeze(0)),
  "contiguous": (_contiguous_then_view, lambda x: x.unsqueeze(0) * 2),
  "into_each_other": (_views_realized_into_each_other,
                      lambda x: (x * 2) * 3 + ((x * 2)[None] + (x * 2).reshape(1)).sum()),
  "contiguous_with_source": (_contiguous_realized_with_its_source, lambda x: 2 * (x * x + x)),
  "nested_unsqueeze": (_nested_unsqueeze, lambda x: (x * x + x).reshape(1) + x.unsqueeze(0)),
  "flatten": (_realized(lambda x: x.flatten()), lambda x: x.flatten() * 2),
  "unsqueeze": (_realized(lambda x: x.unsqueeze(0)), lambda x: x.unsqueeze(0) * 2),
  "view": (_realized(lambda x: x.view(1, 1)), lambda x: x.view(1, 1) * 2),
  "slice": (_realized(lambda x: x[None]), lambda x: x[None] * 2),
}


@pytest.mark.parametrize("name", list(_VIEW_PROGRAMS))
def test_views_of_a_realized_0d_tensor_backward(name):
  import torch
  prog, ref = _VIEW_PROGRAMS[name]
  x = Tensor(3.0, requires_grad=True)
  out, _keep = prog(x)
  out.sum().backward()
  tx = torch.tensor(3.0, requires_grad=True)
  tout = ref(tx)
  tout.sum().backward()
  np.testing.assert_allclose(out.numpy(), tout.detach().numpy())
  assert x.grad is not None, "gradient lost through the realized view"
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


# ***** ml_dtypes arrays <-> tensors *****
_ML_EXACT = {"bfloat16": "bfloat16", "float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2",
             "float8_e4m3fnuz": "fp8e4m3fnuz", "float8_e5m2fnuz": "fp8e5m2fnuz"}


@pytest.mark.parametrize("name", list(_ML_EXACT))
def test_ml_dtypes_array_to_tensor_and_back_bit_exact(name):
  import ml_dtypes
  mlt = getattr(ml_dtypes, name)
  if name == "bfloat16":  # every class of value: normals, subnormals, zeros, infs, NaN
    a = np.random.default_rng(0).integers(0, 2**16, 4096, dtype=np.uint16).view(mlt).reshape(64, 64)
  else:  # all 256 bit patterns
    a = np.arange(256, dtype=np.uint8).view(mlt).reshape(16, 16)
  t = Tensor(a)
  assert t.dtype == getattr(dtypes, _ML_EXACT[name]) and t.shape == a.shape
  got = t.numpy()
  assert got.dtype == np.float32  # as tinygrad: bfloat16/fp8 come back as float32
  np.testing.assert_array_equal(got, a.astype(np.float32))  # NaN where ml_dtypes has NaN
  np.testing.assert_array_equal(np.signbit(got), np.signbit(a.astype(np.float32)))
  np.testing.assert_array_equal(Tensor(a[3]).numpy(), a[3].astype(np.float32))  # a non-contiguous view
  np.testing.assert_array_equal(Tensor(a[0, 0]).numpy(), a[0, 0].astype(np.float32))  # 0-d


@pytest.mark.parametrize("name", list(_ML_EXACT))
def test_floats_to_narrow_dtype_round_as_ml_dtypes(name):
  import ml_dtypes
  mlt = getattr(ml_dtypes, name)
  fin = ml_dtypes.finfo(mlt)
  rng = np.random.default_rng(1)
  # random magnitudes over the whole finite range (subnormals too) and exact ties between neighbours
  lo, hi = int(np.log2(float(fin.smallest_subnormal))), int(np.log2(float(fin.max)))
  vals = np.float32(rng.uniform(-1, 1, 2000)) * np.float32(2.0) ** rng.integers(lo, hi, 2000)
  grid = np.arange(256, dtype=np.uint8).view(mlt).astype(np.float32) if name != "bfloat16" else \
    np.arange(0, 2**16, 97, dtype=np.uint16).view(mlt).astype(np.float32)
  grid = np.sort(grid[np.isfinite(grid)])
  ties = (grid[1:].astype(np.float64) + grid[:-1]) / 2  # exactly representable in float32
  vals = np.concatenate([vals, ties]).astype(np.float32)
  vals = vals[np.abs(vals) <= float(fin.max)]  # past max, tiny's fp8s saturate (as tinygrad); ml_dtypes gives NaN
  got = Tensor(vals, dtype=getattr(dtypes, _ML_EXACT[name])).numpy()
  np.testing.assert_array_equal(got, vals.astype(mlt).astype(np.float32))


@pytest.mark.parametrize("name, widened, as_type", [
  ("int4", "int8", np.int64), ("uint4", "uint8", np.int64), ("int2", "int8", np.int64), ("uint2", "uint8", np.int64),
  ("float4_e2m1fn", "float16", np.float64), ("float6_e2m3fn", "float16", np.float64),
  ("float6_e3m2fn", "float16", np.float64), ("float8_e4m3", "float16", np.float64),
  ("float8_e3m4", "float16", np.float64), ("float8_e4m3b11fnuz", "float16", np.float64),
  ("float8_e8m0fnu", "float32", np.float64)])
def test_ml_dtypes_without_a_tiny_dtype_widen_exactly(name, widened, as_type):
  import ml_dtypes
  mlt = getattr(ml_dtypes, name)
  if as_type is np.int64:
    info = ml_dtypes.iinfo(mlt)
    a = np.arange(int(info.min), int(info.max) + 1).astype(mlt)
  else:  # every value: the 256 bit patterns (narrower formats repeat theirs)
    a = np.unique(np.arange(256, dtype=np.uint8).view(mlt).astype(np.float64)).astype(mlt)
  t = Tensor(a)
  assert t.dtype == getattr(dtypes, widened)
  np.testing.assert_array_equal(t.numpy().astype(as_type), a.astype(as_type))


def test_numpy_dtype_without_a_tiny_dtype_is_a_clear_error():
  with pytest.raises(TypeError, match=r"numpy dtype 'complex64' has no tiny dtype; supported: .*float8_e4m3fn"):
    Tensor(np.zeros(2, np.complex64))


def test_fnuz_fp8_dtypes_as_tinygrad():
  # tinygrad 0.14 has fp8e4m3fnuz/fp8e5m2fnuz (AMD's fp8s): the names, the bits and the promotion are tinygrad's
  import ml_dtypes
  from tinygrad import dtypes as tg
  for name in ("fp8e4m3fnuz", "fp8e5m2fnuz"):
    ours, theirs = getattr(dtypes, name), getattr(tg, name)
    assert (ours.itemsize, dtypes.finfo(ours)) == (theirs.itemsize, tg.finfo(theirs))
    assert ours in dtypes.fp8s and ours in dtypes.fp8_fnuz and dtypes.is_float(ours)
  from tiny_uop.dtype import least_upper_dtype
  from tinygrad.dtype import least_upper_dtype as tg_lud
  for a, b in [("fp8e4m3fnuz", "int8"), ("fp8e4m3fnuz", "fp8e5m2fnuz"), ("fp8e5m2fnuz", "fp8e4m3"),
               ("fp8e4m3fnuz", "bfloat16"), ("uint64", "fp8e5m2fnuz")]:
    assert repr(least_upper_dtype(getattr(dtypes, a), getattr(dtypes, b))) == \
      repr(tg_lud(getattr(tg, a), getattr(tg, b))).replace("dtypes.half", "dtypes.float16")
  # inf and NaN are the one NaN 0x80, -0.0 is +0.0, overflow saturates (tinygrad); the rest rounds as ml_dtypes
  x = Tensor([np.inf, -np.inf, np.nan, -0.0, 1e6, -1e6, 0.3], dtype=dtypes.fp8e4m3fnuz).numpy()
  want = np.array([np.nan, np.nan, np.nan, 0.0, 240.0, -240.0, np.float32(0.3).astype(ml_dtypes.float8_e4m3fnuz)],
                  np.float32)
  np.testing.assert_array_equal(x, want)
  assert not np.signbit(x[3])


@pytest.mark.parametrize("flt, it", [("float16", "int64"), ("float64", "int16"), ("bfloat16", "int32")])
def test_context_default_float_and_int_as_tinygrad(flt, it):
  import tinygrad
  with tinygrad.Context(DEFAULT_FLOAT=flt, DEFAULT_INT=it):
    want = [tinygrad.Tensor(v).dtype.name for v in ([1.5], [1], [[1, 2.0]])] + \
      [(tinygrad.Tensor([1]) / 2).dtype.name, tinygrad.Tensor.arange(3).dtype.name]
  with Context(DEFAULT_FLOAT=flt, DEFAULT_INT=it):
    got = [Tensor(v).dtype.name for v in ([1.5], [1], [[1, 2.0]])] + \
      [(Tensor([1]) / 2).dtype.name, Tensor.arange(3).dtype.name]
    np.testing.assert_array_equal(Tensor([1.5, -2.25]).numpy(), np.array([1.5, -2.25], np.float32))
  assert got == want
  assert dtypes.default_float == dtypes.float32 and dtypes.default_int == dtypes.int32  # restored
  with pytest.raises(ValueError, match=r"DEFAULT_FLOAT='int8' is not a float dtype; valid: .*float16"):
    with Context(DEFAULT_FLOAT="int8"): Tensor([1.5])
