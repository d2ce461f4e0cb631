"""Tensor forward results against numpy: elementwise math, activations, reductions, broadcasting and dtypes."""
import math

import numpy as np
import pytest

from tiny_tensor import Tensor, dtypes

rng = np.random.default_rng(0)


def close(t: Tensor, ref, atol=1e-5, rtol=1e-5):
  got = t.numpy()
  ref = np.asarray(ref)
  assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
  np.testing.assert_allclose(got, ref, atol=atol, rtol=rtol, equal_nan=True)


X = rng.standard_normal((3, 4)).astype(np.float32)
POS = (rng.random((3, 4)) * 3 + 0.1).astype(np.float32)


def _sig(x): return 1 / (1 + np.exp(-x))


def _softplus(x): return np.log1p(np.exp(x))


UNARY = {
  "exp": (np.exp, X), "exp2": (np.exp2, X), "log": (np.log, POS), "log2": (np.log2, POS), "sqrt": (np.sqrt, POS),
  "rsqrt": (lambda x: 1 / np.sqrt(x), POS), "reciprocal": (lambda x: 1 / x, POS), "sin": (np.sin, X), "cos": (np.cos,
    X),
  "tan": (np.tan, X), "square": (np.square, X), "abs": (np.abs, X), "sign": (np.sign, X), "neg": (np.negative, X),
  "relu": (lambda x: np.maximum(x, 0), X), "sigmoid": (_sig, X), "tanh": (np.tanh, X),
  "gelu": (lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), X),
  "quick_gelu": (lambda x: x * _sig(1.702 * x), X), "silu": (lambda x: x * _sig(x),
    X), "swish": (lambda x: x * _sig(x), X),
  "softplus": (_softplus, X), "mish": (lambda x: x * np.tanh(_softplus(x)), X),
  "elu": (lambda x: np.where(x > 0, x, np.exp(x) - 1), X),
  "celu": (lambda x: np.maximum(x, 0) + np.minimum(0, np.exp(x) - 1), X),
  "selu": (lambda x: 1.0507 * np.where(x >= 0, x, 1.67326 * (np.exp(x) - 1)), X),
  "leaky_relu": (lambda x: np.where(x < 0, 0.01 * x, x), X), "relu6": (lambda x: np.clip(x, 0, 6), X * 5),
  "hardswish": (lambda x: x * np.clip(x + 3, 0, 6) / 6, X * 3), "hardtanh": (lambda x: np.clip(x, -1, 1), X),
  "hardsigmoid": (lambda x: np.clip(x / 6 + 0.5, 0, 1), X * 4), "softsign": (lambda x: x / (1 + np.abs(x)), X),
  "logsigmoid": (lambda x: -_softplus(-x), X), "sinh": (np.sinh, X), "cosh": (np.cosh, X),
  "floor": (np.floor, X * 3), "ceil": (np.ceil, X * 3), "trunc": (np.trunc, X * 3),
  "round": (np.round, np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 1.2, -1.7], np.float32)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
  fn, x = UNARY[name]
  close(getattr(Tensor(x), name)(), fn(x).astype(np.float32), atol=1e-5, rtol=1e-4)


def test_erf():
  import math as m
  x = np.linspace(-3, 3, 13).astype(np.float32)
  close(Tensor(x).erf(), np.array([m.erf(v) for v in x], np.float32), atol=2e-6)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv", "maximum", "minimum", "pow"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (2, 3)), ((0, 3), (1,
  3))])
def test_binary_broadcast(op, shapes):
  a = rng.standard_normal(shapes[0]).astype(np.float32)
  b = rng.standard_normal(shapes[1]).astype(np.float32)
  if op == "pow": a = np.abs(a) + 0.5
  npf = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.divide, "maximum": np.maximum,
         "minimum": np.minimum, "pow": np.power}[op]
  ta, tb = Tensor(a), Tensor(b)
  t = getattr(ta, op)(tb) if op in ("maximum", "minimum") else getattr(ta, f"__{op}__")(tb)
  close(t, npf(a, b), rtol=1e-4)


def test_python_scalars_and_reflected():
  a = X
  t = Tensor(a)
  close(2 + t, 2 + a); close(2 - t, 2 - a); close(2 * t, 2 * a); close(2 / (t + 5), 2 / (a + 5))  # noqa: E702
  close(t ** 2, a ** 2); close(2 ** t, 2 ** a, rtol=1e-4); close(-t, -a)  # noqa: E702
  close(t * np.float32(3), a * 3); close(np.int64(2) + Tensor([1, 2]), np.array([3, 4]))  # noqa: E702


def test_pow_negative_base_int_exponent():
  b = np.array([-2.0, -1.5, 0.0, 1.5, 2.0], np.float32)
  with np.errstate(divide="ignore"):
    for e in [3, 2, -1, -2, 0, 1, 5]: close(Tensor(b) ** e, np.power(b, float(e)), rtol=1e-5)
  e = np.array([3.0, 2.0, 0.5, 0.0, -1.0], np.float32)
  close(Tensor(b) ** Tensor(e), np.power(b, e), rtol=1e-5)  # (-1.5)**0.5 is nan, 0**0 is 1


def test_int_ops():
  a = np.array([7, -7, 5, -5, 0, 9], np.int32)
  b = np.array([2, 2, -3, -3, 4, 9], np.int32)
  ta, tb = Tensor(a), Tensor(b)
  close(ta // tb, a // b); close(ta % tb, a % b); close(ta.idiv(tb), np.trunc(a / b).astype(np.int32))  # noqa: E702
  close(ta + tb, a + b); close(ta * 3, a * 3); close(ta & tb, a & b); close(ta | tb, a | b)  # noqa: E702
  close(ta ^ tb, a ^ b); close(~ta, ~a); close(ta << 2, a << 2)  # noqa: E702
  close(Tensor(np.abs(a)) >> 1, np.abs(a) >> 1)
  close(ta.abs(), np.abs(a)); close(ta.sign(), np.sign(a)); close(ta.maximum(tb), np.maximum(a, b))  # noqa: E702
  close(ta.minimum(tb), np.minimum(a, b))
  assert (ta / tb).dtype == dtypes.float32
  close(ta / tb, a / b)


def test_float_floordiv_mod():
  a = np.array([7.5, -7.5, 5.0, -5.0], np.float32)
  b = np.array([2.0, 2.0, -3.0, -3.0], np.float32)
  close(Tensor(a) // Tensor(b), a // b); close(Tensor(a) % Tensor(b), np.mod(a, b))  # noqa: E702


def test_comparisons_and_where():
  a, b = X, X.T.copy().reshape(3, 4)
  ta, tb = Tensor(a), Tensor(b)
  for op in ["__lt__", "__gt__", "__le__", "__ge__", "__eq__", "__ne__"]:
    r = getattr(ta, op)(tb)
    assert r.dtype == dtypes.bool
    close(r, getattr(a, op)(b))
  close((ta > 0).where(ta, tb), np.where(a > 0, a, b))
  close((ta > 0).where(1.0, 0), np.where(a > 0, 1.0, 0.0))
  nan = Tensor([math.nan, 1.0])
  assert (nan >= 1.0).tolist() == [False, True] and (nan <= 1.0).tolist() == [False, True]
  assert nan.isnan().tolist() == [True, False]
  assert Tensor([math.inf, -math.inf, 1.0]).isinf().tolist() == [True, True, False]
  assert Tensor([math.inf, -math.inf, 1.0]).isinf(detect_negative=False).tolist() == [True, False, False]


def test_clip_lerp_logical():
  close(Tensor(X).clip(-0.5, 0.5), np.clip(X, -0.5, 0.5))
  close(Tensor(X).clamp(min_=0), np.maximum(X, 0))
  close(Tensor(X).lerp(Tensor(POS), 0.25), X + (POS - X) * 0.25)
  b = np.array([True, False, True])
  close(Tensor(b).logical_not(), ~b)
  close(Tensor(b) & Tensor([True, True, False]), b & [True, True, False])
  with pytest.raises(RuntimeError, match="min_"): Tensor(X).clip()


def test_dtype_promotion():
  i, f, h, bb = Tensor([1, 2]), Tensor([1.0, 2.0]), Tensor([1.0, 2.0], dtype=dtypes.half), Tensor([True, False])
  assert (i + 1).dtype == dtypes.int32 and (i + 1.5).dtype == dtypes.float32 and (i + True).dtype == dtypes.int32
  assert (h + 1.5).dtype == dtypes.half and (h + f).dtype == dtypes.float32 and (i + h).dtype == dtypes.half
  assert (bb + 1).dtype == dtypes.int32 and (bb + True).dtype == dtypes.bool and (bb * 2.0).dtype == dtypes.float32
  assert (Tensor([1], dtype=dtypes.uint8) + Tensor([1], dtype=dtypes.int8)).dtype == dtypes.int16
  assert (i + 1.5).tolist() == [2.5, 3.5]
  assert Tensor([1, 2.5]).dtype == dtypes.float32 and Tensor([True]).dtype == dtypes.bool
  assert Tensor(np.arange(3, dtype=np.int64)).dtype == dtypes.int64


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float64, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.bool])
def test_cast_and_dtypes(dt):
  a = np.array([-3.7, -1.0, 0.0, 0.4, 2.6, 100.2], np.float32)
  t = Tensor(a).cast(dt)
  assert t.dtype == dt
  np_dt = {dtypes.float16: np.float16, dtypes.float64: np.float64, dtypes.int8: np.int8, dtypes.uint8: np.uint8,
           dtypes.int64: np.int64, dtypes.bool: np.bool_}[dt]
  ref = a.astype(np_dt) if dt != dtypes.uint8 else np.clip(a, 0, None).astype(np_dt)
  src = a if dt != dtypes.uint8 else np.clip(a, 0, None)
  close(Tensor(src).cast(dt), ref)
  assert t.element_size() == np.dtype(np_dt).itemsize and t.nbytes() == 6 * np.dtype(np_dt).itemsize


def test_bitcast_and_helpers():
  a = np.array([1.0, -2.0], np.float32)
  close(Tensor(a).bitcast(dtypes.uint32), a.view(np.uint32))
  t = Tensor([1, 2])
  assert t.float().dtype == dtypes.float32 and t.half().dtype == dtypes.float16 and t.double().dtype == dtypes.float64
  assert t.long().dtype == dtypes.int64 and t.bool().dtype == dtypes.bool and t.float().int().dtype == dtypes.int32
  assert Tensor([1.5], dtype=dtypes.bfloat16).numpy().tolist() == [1.5]


def _bf16(x: np.ndarray) -> np.ndarray:  # float32 rounded to bfloat16 (nearest even), as float32
  u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def test_bfloat16_matmul_and_elementwise_vectorized():
  # the optimizer upcasts these kernels to vectors; renderers without bf16 arithmetic compute them lane-wise in float32
  # (vector loads of the raw bits, rounding on every bf16 cast and store). Vectors of bfloat16 once reached LLVM IR as
  # `insertelement <8 x bfloat> ..., float`: an invalid module
  r = np.random.default_rng(3)
  a, b = r.standard_normal((16, 40)).astype(np.float32), r.standard_normal((40, 24)).astype(np.float32)
  ta, tb = Tensor(a).cast(dtypes.bfloat16), Tensor(b).cast(dtypes.bfloat16)
  got = (ta @ tb).cast(dtypes.float32).numpy()
  np.testing.assert_allclose(got, _bf16(_bf16(a) @ _bf16(b)), rtol=1e-2, atol=3e-2)
  x = r.standard_normal(4096).astype(np.float32)
  got = (Tensor(x).cast(dtypes.bfloat16) * 3 + 1).cast(dtypes.float32).numpy()
  assert np.array_equal(got, _bf16(_bf16(_bf16(x) * 3) + 1))  # each bf16 op rounds: bit exact


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_low_precision_matmul_multiplies_in_float(dt):
  # half/bfloat16 operands: the products are exact in float32 and summed there, rounded once at the end (as torch);
  # a product rounded to the input dtype first would be off by ~1e-3 relative. The kernel's MUL is float32 and its
  # loads stay in the input dtype (converted in registers)
  r = np.random.default_rng(11)
  a, b = r.standard_normal((3, 48, 64)).astype(np.float32), r.standard_normal((3, 64, 40)).astype(np.float32)
  ta, tb = Tensor(a).cast(getattr(dtypes, dt)).realize(), Tensor(b).cast(getattr(dtypes, dt)).realize()
  ra, rb = (ta.cast(dtypes.float32).numpy().astype(np.float64), tb.cast(dtypes.float32).numpy().astype(np.float64))
  out = ta.dot(tb, dtype=dtypes.float32)
  ast = out.schedule().kernels[-1].src[0]
  muls = [u for u in ast.toposort() if u.op.name == "MUL" and u.dtype.scalar() != dtypes.index]
  assert muls and all(u.dtype == dtypes.float32 for u in muls), [u.dtype for u in muls]
  np.testing.assert_allclose(out.numpy(), ra @ rb, rtol=2e-5, atol=2e-5)
  half = (ta @ tb)  # the default output dtype is the operands': the float sum rounded once
  assert half.dtype == getattr(dtypes, dt)
  want = (ra @ rb).astype(np.float32)
  want = want.astype(np.float16).astype(np.float32) if dt == "float16" else _bf16(want)
  got = half.cast(dtypes.float32).numpy()
  assert np.mean(got == want) > 0.99, np.mean(got == want)  # float32 vs float64 sums may round a tie differently


REDUCE_SHAPES = [((3, 4, 5), None), ((3, 4, 5), 1), ((3, 4, 5), -1), ((3, 4, 5), (0, 2)), ((4,), 0), ((), None)]


@pytest.mark.parametrize("shape,axis", REDUCE_SHAPES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(shape, axis, keepdim):
  a = rng.standard_normal(shape).astype(np.float32)
  t = Tensor(a)
  ax = tuple(axis) if isinstance(axis, tuple) else axis
  close(t.sum(axis, keepdim), np.sum(a, axis=ax, keepdims=keepdim), atol=1e-4)
  close(t.max(axis, keepdim), np.max(a, axis=ax, keepdims=keepdim))
  close(t.min(axis, keepdim), np.min(a, axis=ax, keepdims=keepdim))
  close(t.mean(axis, keepdim), np.mean(a, axis=ax, keepdims=keepdim), atol=1e-5)
  close(t.prod(axis, keepdim), np.prod(a, axis=ax, keepdims=keepdim), atol=1e-5)
  if a.size > 1 and (axis is None or np.prod([shape[i] for i in np.atleast_1d(axis)]) > 1):
    close(t.var(axis, keepdim), np.var(a, axis=ax, keepdims=keepdim, ddof=1), atol=1e-5)
    close(t.std(axis, keepdim, correction=0), np.std(a, axis=ax, keepdims=keepdim), atol=1e-5)


def test_reduce_dtypes_and_bools():
  i8 = Tensor(np.full((300,), 100, np.int8))
  assert i8.sum().dtype == dtypes.int32 and i8.sum().item() == 30000
  assert Tensor([1, 2], dtype=dtypes.uint8).sum().dtype == dtypes.uint32
  assert Tensor([2, 3], dtype=dtypes.int8).prod().dtype == dtypes.int8
  assert Tensor([2, 3]).prod(dtype="int64").item() == 6
  h = Tensor(np.ones(10, np.float16))
  assert h.sum().dtype == dtypes.half and h.sum().item() == 10
  assert Tensor([1, 2, 3]).mean().dtype == dtypes.float32 and Tensor([1, 2, 4]).mean().item() == pytest.approx(7 / 3)
  b = np.array([[True, False], [False, False]])
  close(Tensor(b).any(), b.any()); close(Tensor(b).all(1), b.all(1)); close(Tensor(b).any(0), b.any(0))  # noqa: E702
  assert Tensor([3, -1, 7], dtype=dtypes.uint8).max().item() == 255
  assert Tensor([3, 1, 7], dtype=dtypes.uint8).min().item() == 1
  assert Tensor([5, -9, 2]).min().item() == -9


def test_var_mean_std_mean_and_correction():
  a = rng.standard_normal((4, 6)).astype(np.float32)
  v, m = Tensor(a).var_mean(1)
  close(v, a.var(1, ddof=1), atol=1e-5); close(m, a.mean(1))  # noqa: E702
  s, m = Tensor(a).std_mean(0, correction=0)
  close(s, a.std(0), atol=1e-5); close(m, a.mean(0))  # noqa: E702
  close(Tensor(a).var(1, correction=0.5), a.var(1, ddof=0.5), atol=1e-5)  # a real number, as torch's (typed float)



def test_mean_of_a_long_offset_vector_as_accurate_as_numpy():
  # 32771 float32s around 100 (issue #38): the sum is blocked (no accumulator adds more than 1024 terms), so the mean
  # is within 10x (or 4 roundoffs) of numpy's pairwise float32 error against float64 (one running sum per lane was off
  # by 2.1e-4). Small: the mock GPUs of CI run this file too (sums, var, std and bigger sizes: tiny-codegen's
  # test_reduce_accuracy.py)
  a = (np.random.default_rng(38).standard_normal(32771) + 100).astype(np.float32)
  ref = a.astype(np.float64).mean()
  got = Tensor(a).mean().item()
  assert abs(got - ref) <= max(10 * abs(float(a.mean()) - ref), 4 * 2.0**-24 * abs(ref)), (got, ref)

def test_softmax_family():
  a = rng.standard_normal((3, 5)).astype(np.float32) * 4
  e = np.exp(a - a.max(-1, keepdims=True))
  sm = e / e.sum(-1, keepdims=True)
  close(Tensor(a).softmax(), sm); close(Tensor(a).log_softmax(), np.log(sm), atol=1e-5)  # noqa: E702
  close(Tensor(a).softmax(0), np.exp(a) / np.exp(a).sum(0), atol=1e-5)
  lse = np.log(np.exp(a).sum(1))
  close(Tensor(a).logsumexp(1), lse, atol=1e-5)
  close(Tensor(a).logsumexp(1, keepdim=True), lse[:, None], atol=1e-5)
  close(Tensor(a * 100).logsumexp(), (a * 100).max() + np.log(np.exp(a * 100 - (a * 100).max()).sum()), rtol=1e-5)


def test_argmax_argmin():
  a = np.array([[1, 5, 5, 2], [7, 0, 7, -1], [0, 0, 0, 0]], np.float32)
  close(Tensor(a).argmax(1), a.argmax(1)); close(Tensor(a).argmax(0), a.argmax(0))  # noqa: E702
  close(Tensor(a).argmax(), a.argmax())
  close(Tensor(a).argmin(1), a.argmin(1))
  close(Tensor(a).argmax(-1, keepdim=True), a.argmax(-1)[:, None])
  assert Tensor(a).argmax(1).dtype == dtypes.int32


def test_matmul_dot_linear():
  for sa, sb in [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
                 ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((0, 4), (4, 3))]:
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    close(Tensor(a) @ Tensor(b), a @ b, atol=1e-4)
    close(Tensor(a).dot(Tensor(b)), np.matmul(a, b), atol=1e-4)
  w, bias, x = rng.standard_normal((4, 3)).astype(np.float32), np.ones(3, np.float32), X
  close(Tensor(x).linear(Tensor(w), Tensor(bias)), x @ w + bias, atol=1e-5)
  ai, bi = np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(6, dtype=np.int32).reshape(3, 2)
  r = Tensor(ai) @ Tensor(bi)
  assert r.dtype == dtypes.int32 and r.tolist() == (ai @ bi).tolist()


def test_empty_and_zero_size():
  z = Tensor.zeros(0, 3)
  assert z.shape == (0, 3) and z.numpy().shape == (0, 3)
  assert z.sum().item() == 0 and z.sum(0).tolist() == [0, 0, 0] and (z + 1).numpy().shape == (0, 3)
  assert Tensor([]).shape == (0,) and Tensor([]).dtype == dtypes.float32 and Tensor([]).tolist() == []
  assert Tensor.empty(2, 3).shape == (2, 3)
  assert Tensor.ones(3, 0).sum(1).tolist() == [0, 0, 0]
  e = Tensor.zeros(0)
  assert e.max().item() == -math.inf and math.isnan(e.mean().item()) and e.prod().item() == 1 and e.sum().item() == 0
  assert (Tensor.ones(3, 0) @ Tensor.ones(0, 2)).tolist() == [[0.0, 0.0]] * 3
  x = Tensor.zeros(3, 0)
  assert x[1].shape == (0,) and x.T.shape == (0, 3) and x.pad((1, 1)).tolist() == [[0.0, 0.0]] * 3
  assert Tensor([]).cat(Tensor([1.0])).tolist() == [1.0] and Tensor.ones(2, 0).softmax().shape == (2, 0)


def test_scalars():
  t = Tensor(3.5)
  assert t.shape == () and t.ndim == 0 and t.numel() == 1 and t.item() == 3.5 and t.tolist() == 3.5
  assert (t * Tensor([1.0, 2.0])).tolist() == [3.5, 7.0] and Tensor(2).dtype == dtypes.int32
  assert Tensor(True).dtype == dtypes.bool and Tensor(7, dtype=dtypes.float16).item() == 7
  assert Tensor(np.float32(2.5)).item() == 2.5
  assert Tensor(np.array(4)).shape == ()


def test_data_access():
  t = Tensor([[1, 2], [3, 4]], dtype=dtypes.int32)
  mv = t.data()
  assert mv.shape == (2, 2) and mv.tolist() == [[1, 2], [3, 4]] and mv.format == "i"
  assert t.tolist() == [[1, 2], [3, 4]] and Tensor(b"\x01\x02").tolist() == [1, 2]
  assert Tensor(b"\x01\x02").dtype == dtypes.uint8
  assert "shape=(2, 2)" in repr(t) and "int" in repr(t)
  with pytest.raises(ValueError, match="exactly one element"): t.item()


@pytest.mark.parametrize("npdt", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
def test_int_dtypes_wrap_like_numpy(npdt):
  info = np.iinfo(npdt)
  a = np.array([info.min, info.max, 7, 100 % info.max, info.max // 3], dtype=npdt)
  b = np.array([3, 2, 5, 7, 9], dtype=npdt)
  ta, tb = Tensor(a), Tensor(b)
  with np.errstate(over="ignore"):
    for got, ref in [(ta + tb, a + b), (ta - tb, a - b), (ta * tb, a * b), (ta // tb, a // b), (ta % tb, a % b),
                     (ta.maximum(tb), np.maximum(a, b)), (ta ^ tb, a ^ b), (ta < tb, a < b)]:
      assert got.dtype == (dtypes.bool if ref.dtype == np.bool_ else ta.dtype)
      np.testing.assert_array_equal(got.numpy(), ref)
  assert ta.max().item() == info.max and ta.min().item() == info.min
