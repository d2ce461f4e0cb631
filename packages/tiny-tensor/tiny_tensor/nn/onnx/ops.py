"""ONNX operators as Tensor ops: `OPS[op_type](ctx, inputs, attrs) -> output | tuple of outputs`.

`op` registers a function in `OPS`; this module, `ops_more`, `ops_nn` and `ops_seq` define them, and the runner
imports all four (`_operators` in `__init__`): a table read before then is partial.

Each function follows the ONNX operator specification (onnx/docs/Operators.md) for every opset from 7 up to the
default one, switching on `ctx.opset` where versions differ (an attribute that became an input, a changed default).
Inputs are Tensors, None (an omitted optional input), lists (sequences) or, for strings, numpy object arrays.

Local helpers stand in for Tensor ops this library does not have yet (`_atan`, `_asin`, `_acos`, `_fmod`); they are
listed in the package README so they can move onto Tensor.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Literal

import numpy as np

from tiny_uop.dtype import DType, dtypes, to_numpy
from tiny_uop.helpers import prod
from tiny_uop.uop import Ops, UOp, sint_to_uop, ssimplify
from tiny_tensor.nn.onnx.base import _DTYPES, STRING, OnnxError, _range_count, known_value, to_tensor
from tiny_tensor.tensor import Tensor

OPS: dict[str, Callable[..., Any]] = {}


def op(*names: str) -> Callable:
  """Register the decorated function as the implementation of the ONNX operators `names`."""
  def deco(fn: Callable) -> Callable:
    for n in names: OPS[n] = fn
    return fn
  return deco


# ***** helpers *****
def _np(x: Any) -> np.ndarray:
  """Host value of a Tensor: the one the runner knows (a shape value, a constant; no device read) or else read from
  the device (numpy arrays pass through)."""
  if isinstance(x, np.ndarray): return x
  known = known_value(x)
  return known if known is not None else x.numpy()


def _item(x: Any) -> Any:
  """The single value of a Tensor as a Python scalar (read as `_np` does)."""
  return _np(x).reshape(-1)[0].item()


def _ints(x: Any) -> list[int]:
  """A Tensor / array / list of ints as a Python list."""
  if x is None: return []
  if isinstance(x, (list, tuple)): return [int(v) for v in x]
  return [int(v) for v in _np(x).reshape(-1).tolist()]


def _sints(x: Any) -> list[Any]:
  """Like `_ints`, keeping symbolic sizes (UOps) of a symbolic shape value (see host.py) as they are."""
  if x is None: return []
  known = known_value(x) if not isinstance(x, np.ndarray) else x
  if known is not None and known.dtype == object:
    return [v if isinstance(v, UOp) else int(v) for v in known.reshape(-1).tolist()]
  return _ints(x)


def _symbolic_value(x: Any) -> bool:
  """Whether Tensor `x`'s host value is a symbolic shape value (host.py: an object array of ints and UOps)."""
  known = known_value(x)
  return known is not None and known.dtype == object


def _axis(a: int, n: int) -> int:
  if not -max(n, 1) <= a < max(n, 1): raise OnnxError(f"axis {a} is out of range for rank {n}")
  return a + n if a < 0 else a


def _like(x: Tensor, v: Any, dt: DType | None = None) -> Tensor:
  return Tensor(np.asarray(v, dtype=to_numpy(dt or x.dtype)), device=x.device)


def _full(shape: tuple, value: Any, dt: DType, device: str) -> Tensor:
  return Tensor.full(tuple(shape), value, dtype=dt, device=device) if all(shape) else \
    Tensor(np.full(shape, value, dtype=to_numpy(dt)), device=device)


def _is_float(x: Tensor) -> bool: return dtypes.is_float(x.dtype)


def _opt(inputs: list, i: int) -> Any:
  return inputs[i] if len(inputs) > i else None


# ***** elementwise *****
def _atan(x: Tensor) -> Tensor:
  """atan by two half-angle reductions (atan x = 2 atan(x / (1 + sqrt(1 + x^2)))) and a Taylor series on |t| < 0.2."""
  t = x
  for _ in range(2): t = t / (1 + (1 + t * t).sqrt())
  t2, acc = t * t, t * 0
  for k in reversed(range(12)): acc = acc * t2 + ((-1) ** k) / (2 * k + 1)
  return 4 * t * acc


def _asin(x: Tensor) -> Tensor: return 2 * _atan(x / (1 + (1 - x * x).sqrt()))
def _acos(x: Tensor) -> Tensor: return math.pi / 2 - _asin(x)


def _unary(fn: Callable[[Tensor], Tensor]) -> Callable:
  return lambda ctx, inp, attrs: fn(inp[0])


for _name, _fn in {
  "Abs": Tensor.abs, "Neg": Tensor.neg, "Exp": Tensor.exp, "Log": Tensor.log, "Sqrt": Tensor.sqrt,
  "Reciprocal": Tensor.reciprocal, "Sin": Tensor.sin, "Cos": Tensor.cos, "Tan": Tensor.tan, "Sinh": Tensor.sinh,
  "Cosh": Tensor.cosh, "Tanh": Tensor.tanh, "Asinh": Tensor.asinh, "Acosh": Tensor.acosh, "Atanh": Tensor.atanh,
  # Tensor's own atan/asin/acos where this tiny has them, else the local series (see the module doc)
  "Atan": getattr(Tensor, "atan", _atan), "Asin": getattr(Tensor, "asin", _asin),
  "Acos": getattr(Tensor, "acos", _acos), "Erf": Tensor.erf, "Sign": Tensor.sign, "Floor": Tensor.floor,
  "Ceil": Tensor.ceil, "Relu": Tensor.relu, "Sigmoid": Tensor.sigmoid, "Softsign": Tensor.softsign,
  "HardSwish": Tensor.hardswish, "Mish": Tensor.mish, "IsNaN": Tensor.isnan, "Not": Tensor.logical_not,
  "BitwiseNot": Tensor.bitwise_not, "Softplus": lambda x: (1 + x.exp()).log(),
}.items(): OPS[_name] = _unary(_fn)


@op("Round")
def round_(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  # half to even: floor(x + 0.5), minus one where x + 0.5 is an odd integer that came from an exact .5
  f = (x + 0.5).floor()
  tie = (f - x).eq(0.5) & (f.cast(dtypes.int64) % 2).ne(0)
  return tie.where(f - 1, f).cast(x.dtype)


@op("Identity")
def identity(ctx: Any, inp: list, attrs: dict) -> Any: return inp[0]


@op("IsInf")
def isinf(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
  out = x.eq(float("inf")) & bool(pos)
  return out | (x.eq(float("-inf")) & bool(neg))


def _binop(fn: Callable) -> Callable:
  return lambda ctx, inp, attrs: fn(inp[0], inp[1])


def _str_eq(a: np.ndarray, b: np.ndarray) -> Tensor:
  return Tensor(np.asarray(np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)) == b, dtype=bool))


def _div(a: Tensor, b: Tensor) -> Tensor:
  if _is_float(a): return a / b
  q = (a.cast(dtypes.float64) / b.cast(dtypes.float64)).trunc()
  return q.cast(a.dtype)


for _name, _fn in {
  "Add": lambda a, b: a + b, "Equal": lambda a, b: _str_eq(a, b) if isinstance(a, np.ndarray) else a.eq(b),
  "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b, "Div": _div,
  "Greater": lambda a, b: a > b, "Less": lambda a, b: a < b,
  "GreaterOrEqual": lambda a, b: a >= b, "LessOrEqual": lambda a, b: a <= b, "And": lambda a, b: a & b,
  "Or": lambda a, b: a | b, "Xor": lambda a, b: a ^ b, "BitwiseAnd": lambda a, b: a & b,
  "BitwiseOr": lambda a, b: a | b, "BitwiseXor": lambda a, b: a ^ b,
}.items(): OPS[_name] = _binop(_fn)


def _small_int_exponent(ctx: Any, a: Tensor) -> int | None:
  """Pow's exponent as a Python int when it is one host-known integral value in [-8, 8] that broadcasting doesn't
  widen (tanh-GELU's `x ** 3`); else None. Tensor.pow then multiplies (x*x*x, fused into the elementwise kernel
  around it) instead of the general exp/log pow with its sign and special-value selects in every element."""
  host = ctx.host_value(1)
  if host is None or host.size != 1 or host.ndim > a.ndim or not np.issubdtype(host.dtype, np.number): return None
  v = float(host.reshape(-1)[0])
  return int(v) if -8 <= v <= 8 and v == int(v) else None  # (nan and inf fail the range test)


@op("Pow")
def pow_(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, b = inp
  if _is_float(a) and (k := _small_int_exponent(ctx, a)) is not None:  # a half's products rounded once, in float32
    return (a.float() if a.dtype.itemsize < 4 else a).pow(k).cast(a.dtype)
  if _is_float(a): return a.pow(b.cast(a.dtype) if isinstance(b, Tensor) else b).cast(a.dtype)
  return a.cast(dtypes.float64).pow(b.cast(dtypes.float64)).round().cast(a.dtype)


def _fmod(a: Tensor, b: Tensor) -> Tensor:
  """C fmod: the remainder with the sign of the dividend."""
  if _is_float(a): return a - (a / b).trunc() * b
  q = (a.cast(dtypes.float64) / b.cast(dtypes.float64)).trunc().cast(a.dtype)
  return a - q * b


@op("Mod")
def mod(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, b = inp
  r = _fmod(a, b)
  if _is_float(a): r = (b.isinf() & ~a.isinf()).where(a, r)  # fmod(x, +-inf) = x
  if attrs.get("fmod", 0): return r
  # Python-style: the remainder takes the divisor's sign
  fix = r.ne(0) & ((r < 0).ne(b < 0))
  return fix.where(r + b, r)


@op("BitShift")
def bitshift(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, b = inp
  # a shift by a tensor of amounts: multiply or floor-divide by 2**b; amounts outside [0, bits) give 0 (-1 for a
  # right shift of a negative signed value), as the onnx reference does
  bits = a.dtype.itemsize * 8
  bf = b.cast(dtypes.float64)
  out_range = (bf < 0) | (bf >= bits)
  powv = (bf.clip(0, bits - 1) * math.log(2)).exp().round()
  if attrs["direction"] == "LEFT":
    wide = dtypes.uint64 if dtypes.is_unsigned(a.dtype) else dtypes.int64
    r = (a.cast(wide) * powv.cast(wide)).cast(a.dtype)
    return out_range.where(0, r).cast(a.dtype)
  r = (a.cast(dtypes.float64) / powv).floor().cast(a.dtype)
  return out_range.where((a < 0).where(-1, 0) if not dtypes.is_unsigned(a.dtype) else 0, r).cast(a.dtype)


def _variadic(fn: Callable) -> Callable:
  def run(ctx: Any, inp: list, attrs: dict) -> Tensor:
    out = inp[0]
    for x in inp[1:]: out = fn(out, x)
    return out
  return run


OPS["Sum"] = _variadic(lambda a, b: a + b)
OPS["Max"] = _variadic(lambda a, b: a.maximum(b))
OPS["Min"] = _variadic(lambda a, b: a.minimum(b))


@op("Mean")
def mean(ctx: Any, inp: list, attrs: dict) -> Tensor: return _variadic(lambda a, b: a + b)(ctx, inp, attrs) / len(inp)


@op("Where")
def where(ctx: Any, inp: list, attrs: dict) -> Tensor: return inp[0].where(inp[1], inp[2])


# ***** activations *****
@op("LeakyRelu")
def leakyrelu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, a = inp[0], attrs.get("alpha", 0.01)
  return (x < 0).where(x * a, x)


@op("PRelu")
def prelu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, s = inp
  return (x < 0).where(x * s, x)


@op("Elu")
def elu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, a = inp[0], attrs.get("alpha", 1.0)
  return (x < 0).where(a * (x.exp() - 1), x)


@op("Selu")
def selu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  a, g = attrs.get("alpha", 1.67326319217681884765625), attrs.get("gamma", 1.05070102214813232421875)
  return g * (x <= 0).where(a * (x.exp() - 1), x)


@op("Celu")
def celu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, a = inp[0], attrs.get("alpha", 1.0)
  return x.maximum(0) + (a * ((x / a).exp() - 1)).minimum(0)


@op("HardSigmoid")
def hardsigmoid(ctx: Any, inp: list, attrs: dict) -> Tensor:
  return (attrs.get("alpha", 0.2) * inp[0] + attrs.get("beta", 0.5)).clip(0, 1)


@op("ThresholdedRelu")
def thresholdedrelu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  return (x > attrs.get("alpha", 1.0)).where(x, 0)


@op("Shrink")
def shrink(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, b, l = inp[0], attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
  return (x < -l).where(x + b, (x > l).where(x - b, 0)).cast(x.dtype)


@op("Gelu")
def gelu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  if attrs.get("approximate", "none") == "tanh":
    return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
  return 0.5 * x * (1 + (x / math.sqrt(2)).erf())


@op("Swish")
def swish(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  return x * (x * attrs.get("alpha", 1.0)).sigmoid()


@op("SwiGLU")
def swiglu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, b = inp
  return (a * (a * attrs.get("alpha", 1.0)).sigmoid()).cast(a.dtype) * b


@op("Clip")
def clip(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  lo, hi = (attrs.get("min"), attrs.get("max")) if ctx.opset < 11 else (_opt(inp, 1), _opt(inp, 2))
  if lo is not None: x = x.maximum(lo)
  if hi is not None: x = x.minimum(hi)
  return x


def _softmax_like(kind: str) -> Callable:
  def run(ctx: Any, inp: list, attrs: dict) -> Tensor:
    x = inp[0]
    if ctx.opset < 13:  # the input is seen as 2-D: dims before `axis` vs the rest
      ax = _axis(attrs.get("axis", 1), x.ndim)
      flat = x.reshape(int(np.prod(x.shape[:ax], dtype=np.int64)), -1)
      return _softmax_axis(flat, 1, kind).reshape(x.shape)
    return _softmax_axis(x, _axis(attrs.get("axis", -1), x.ndim), kind)
  return run


def _softmax_axis(x: Tensor, ax: int, kind: str) -> Tensor:
  if kind == "softmax":
    # exp * (1 / row sum): a reciprocal per row, not a division per element. Attention's probabilities stay inline
    # in P@V's kernel, where each element is read once per column tile of the output: x / sum redid the division
    # there every time (tiny BERT: 72 us a layer), the reciprocal is loop-invariant and leaves one multiply
    _, e, ss = x._softmax(ax, None)
    return e * ss.reciprocal()
  if kind == "logsoftmax": return x.log_softmax(ax)
  n = x.shape[ax]
  idx = x.argmax(ax, keepdim=True)
  ar = Tensor.arange(n, device=x.device).reshape([n if i == ax else 1 for i in range(x.ndim)])
  return ar.eq(idx).cast(x.dtype)


OPS["Softmax"], OPS["LogSoftmax"], OPS["Hardmax"] = (_softmax_like(k) for k in ("softmax", "logsoftmax", "hardmax"))


# ***** casts *****
def _np_dtype_for(et: int) -> Any:
  import ml_dtypes
  return {17: ml_dtypes.float8_e4m3fn, 18: ml_dtypes.float8_e4m3fnuz, 19: ml_dtypes.float8_e5m2,
          20: ml_dtypes.float8_e5m2fnuz, 21: ml_dtypes.uint4, 22: ml_dtypes.int4, 23: ml_dtypes.float4_e2m1fn,
          24: ml_dtypes.float8_e8m0fnu, 25: getattr(ml_dtypes, "uint2", None), 26: getattr(ml_dtypes, "int2", None),
          16: ml_dtypes.bfloat16}[et]


def _saturate_limits(et: int) -> tuple[float, float] | None:
  return {17: (-448.0, 448.0), 18: (-240.0, 240.0), 19: (-57344.0, 57344.0), 20: (-57344.0, 57344.0),
          23: (-6.0, 6.0)}.get(et)


def cast_to(x: Any, et: int, saturate: int = 1, device: str | None = None) -> Any:
  """`x` cast to ONNX element type `et` (strings and the types tiny lacks go through the host)."""
  if isinstance(x, np.ndarray):  # from strings
    if et == STRING: return x
    vals = np.array([float(str(v).replace("INF", "inf")) if str(v).lower() not in ("nan", "-nan") else np.nan
                     for v in x.reshape(-1)], np.float64).reshape(x.shape)
    return cast_to(Tensor(vals, device=device), et, saturate, device)
  if et == STRING:
    arr = x.numpy()
    return np.array([_fmt_float(v) if arr.dtype.kind == "f" else str(v) for v in arr.reshape(-1)],
                    dtype=object).reshape(arr.shape)
  dt = _DTYPES.get(et)
  if dt is None: raise OnnxError(f"Cast to ONNX element type {et} is not supported")
  if et in (17, 18, 19, 20, 21, 22, 23, 24, 25, 26):
    arr = x.cast(dtypes.float32).numpy() if et not in (21, 22, 25, 26) or _is_float(x) else x.numpy()
    if saturate and (lim := _saturate_limits(et)) is not None and not (et in (19, 20) and not saturate):
      arr = np.where(np.isinf(arr), arr, np.clip(arr, *lim)) if et in (19,) else np.clip(arr, *lim)
      if et in (18, 20, 17, 23): arr = np.where(np.isnan(x.cast(dtypes.float32).numpy()), np.nan, arr)
    if et in (21, 22, 25, 26) and arr.dtype.kind == "f": arr = np.round(arr)  # ints round half to even
    return to_tensor(arr.astype(_np_dtype_for(et)), device, et)
  if dt == dtypes.bool: return x.ne(0)
  if dt == dtypes.bfloat16 and x.dtype != dtypes.bfloat16:
    from tiny_tensor.nn.onnx.base import _back_to
    return _back_to(x.cast(dtypes.float32), dtypes.bfloat16)
  if x.dtype == dtypes.float64 and dt in (dtypes.float16, dtypes.bfloat16):
    # through float32: the CPU backend's direct double -> half conversion calls a runtime helper it doesn't link
    # (a segfault, reported); the double rounding differs from a direct one only on exact ties
    return x.cast(dtypes.float32).cast(dt)
  return x.cast(dt)


def _fmt_float(v: float) -> str:
  if np.isnan(v): return "NaN"
  if np.isinf(v): return "INF" if v > 0 else "-INF"
  return f"{float(v):.9g}" if float(v) != int(v) or abs(v) >= 1e16 else str(float(v)).rstrip("0").rstrip(".") \
    if "e" not in str(float(v)) else f"{float(v):.9g}"


@op("Cast")
def cast(ctx: Any, inp: list, attrs: dict) -> Any:
  return cast_to(inp[0], attrs["to"], attrs.get("saturate", 1), ctx.device)


@op("CastLike")
def castlike(ctx: Any, inp: list, attrs: dict) -> Any:
  like = inp[1]
  et = _elem_type(ctx, 1)
  return cast_to(inp[0], et, attrs.get("saturate", 1), ctx.device) if et is not None else inp[0].cast(like.dtype)


def _elem_type(ctx: Any, i: int) -> int | None:
  """The ONNX element type of the node's i-th input as the graph declares it (None when not declared)."""
  name = ctx.node.input[i]
  for v in list(ctx.runner.model.graph.input) + list(ctx.runner.model.graph.value_info) + \
           list(ctx.runner.model.graph.initializer):
    if v.name == name:
      return v.data_type if hasattr(v, "data_type") and not hasattr(v, "type") else v.type.tensor_type.elem_type
  x = ctx.scope.get(name)
  if isinstance(x, np.ndarray): return STRING
  if isinstance(x, Tensor):
    rev = {v: k for k, v in reversed(list(_DTYPES.items()))}
    return rev.get(x.dtype)
  return None


# ***** shapes and movement *****
@op("Shape")
def shape(ctx: Any, inp: list, attrs: dict) -> Tensor:
  s = list(inp[0].shape)
  n = len(s)
  start, end = attrs.get("start", 0), attrs.get("end", n)
  start, end = min(max(start + n if start < 0 else start, 0), n), min(max(end + n if end < 0 else end, 0), n)
  return Tensor(np.array(s[start:end], np.int64), device=ctx.device)


@op("Size")
def size(ctx: Any, inp: list, attrs: dict) -> Tensor:
  return Tensor(np.array(int(np.prod(inp[0].shape, dtype=np.int64)), np.int64), device=ctx.device)


@op("Reshape")
def reshape(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  shp = attrs["shape"] if ctx.opset < 5 else _sints(inp[1])
  if any(isinstance(v, UOp) for v in (*shp, *x.shape)):
    plan = sym_reshape_plan(x.shape, shp, attrs.get("allowzero", 0))
    if isinstance(plan, str): raise OnnxError(f"node {ctx.node.name!r} (Reshape): {plan}")
    return x.reshape(plan)
  if not attrs.get("allowzero", 0):
    shp = [x.shape[i] if isinstance(s, int) and s == 0 else s for i, s in enumerate(shp)]
  return x.reshape(shp)


def _same_size(a: Any, b: Any) -> bool:
  """Whether sizes `a` and `b` (ints or symbolic) are equal for every value of their Variables."""
  d = (sint_to_uop(a) - b).simplify()
  return d.vmin == d.vmax == 0


def _factors(x: Any) -> tuple[int, list[UOp]]:
  """A size as (int coefficient, symbolic factors) through its MUL tree (explicit stack)."""
  coef, out, todo = 1, [], [x]
  while todo:
    u = todo.pop()
    if isinstance(u, int): coef *= u
    elif u.op is Ops.CONST: coef *= int(u.arg)
    elif u.op is Ops.MUL: todo.extend(u.src)
    else: out.append(u)
  return coef, out


def _divide_out(numel: Any, rest: Any) -> Any:
  """numel / rest for Reshape's -1 where the sizes are symbolic: the factors of `rest` cancelled from `numel`'s
  (b*s*3 / (b*3) is s); None when they don't all cancel."""
  (cn, fn), (cr, fr) = _factors(numel), _factors(rest)
  if cr == 0 or cn % cr: return None
  left = list(fn)
  for f in fr:
    if not any(g is f for g in left): return None
    left.pop(next(i for i, g in enumerate(left) if g is f))
  return ssimplify(prod(left, cn // cr)) if left else cn // cr


def sym_reshape_plan(shape: tuple, shp: list, allowzero: int) -> list | str:
  """Reshape's target for a symbolic shape or target (dynamic dims under jit, see the runner's doc), its 0s and -1
  resolved, or why it isn't the same size for every value of the Variables."""
  if not allowzero: shp = [shape[i] if isinstance(v, int) and v == 0 else v for i, v in enumerate(shp)]
  numel = prod(shape)
  if sum(1 for v in shp if isinstance(v, int) and v == -1) == 1:
    rest = prod(v for v in shp if not (isinstance(v, int) and v == -1))
    infer = _divide_out(numel, rest)
    if infer is None or isinstance(rest, int) and rest == 0: return f"target {shp} has a -1 that no size fills"
    shp = [infer if isinstance(v, int) and v == -1 else v for v in shp]
  if not _same_size(prod(shp), numel):
    return f"target {_sym_list(shp)} isn't the size of {_sym_list(shape)} for every size"
  return shp


@op("Flatten")
def flatten(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  ax = _axis(attrs.get("axis", 1), x.ndim + 1) if attrs.get("axis", 1) >= 0 else attrs["axis"] + x.ndim
  return x.reshape(prod(x.shape[:ax]), prod(x.shape[ax:]))  # (symbolic dims stay symbolic)


@op("Squeeze")
def squeeze(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  axes = attrs.get("axes") if ctx.opset < 13 else _ints(_opt(inp, 1)) or None
  if axes is None: return x.reshape([s for s in x.shape if s != 1])
  axes = {_axis(a, x.ndim) for a in axes}
  return x.reshape([s for i, s in enumerate(x.shape) if i not in axes])


@op("Unsqueeze")
def unsqueeze(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  axes = attrs["axes"] if ctx.opset < 13 else _ints(inp[1])
  n = x.ndim + len(axes)
  axes = sorted(_axis(a, n) for a in axes)
  shp = list(x.shape)
  for a in axes: shp.insert(a, 1)
  return x.reshape(shp)


@op("Transpose")
def transpose(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  return x.permute(attrs.get("perm", list(range(x.ndim))[::-1]))


@op("Concat")
def concat(ctx: Any, inp: list, attrs: dict) -> Tensor:
  xs = [x for x in inp if x is not None]
  ax = _axis(attrs["axis"], xs[0].ndim)
  xs = [x for x in xs if x.shape[ax] != 0] or xs[:1]
  return xs[0].cat(*xs[1:], dim=ax) if len(xs) > 1 else xs[0]


@op("Split")
def split(ctx: Any, inp: list, attrs: dict) -> tuple:
  x = inp[0]
  ax = _axis(attrs.get("axis", 0), x.ndim)
  sizes = attrs.get("split") if ctx.opset < 13 else (_ints(_opt(inp, 1)) or None)
  n_out = len(ctx.node.output)
  if sizes is None:
    n = attrs.get("num_outputs", n_out)
    chunk = -(-x.shape[ax] // n)
    sizes = [min(chunk, x.shape[ax] - i * chunk) for i in range(n)]
  return tuple(x.split(sizes, ax))


def _slice_params(shape: tuple, starts: list, ends: list, axes: list | None, steps: list | None) -> list:
  nd = len(shape)
  axes = [_axis(a, nd) for a in axes] if axes else list(range(len(starts)))
  steps = steps or [1] * len(axes)
  sl = [slice(None)] * nd
  for a, s, e, st in zip(axes, starts, ends, steps):
    n = shape[a]
    if st == 0: raise OnnxError("Slice step can't be 0")
    s = s + n if s < 0 else s
    e = e + n if e < 0 else e
    if st > 0: s, e = min(max(s, 0), n), min(max(e, 0), n)
    else: s, e = min(max(s, -1), n - 1), min(max(e, -1), n - 1)
    sl[a] = slice(s, e if not (st < 0 and e < 0) else None, st)
  return sl


@op("Slice")
def slice_(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  if ctx.opset < 10: starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
  else: starts, ends, axes, steps = _sints(inp[1]), _sints(inp[2]), _ints(_opt(inp, 3)), _ints(_opt(inp, 4))
  if any(isinstance(v, UOp) for v in (*starts, *ends, *x.shape)): return _sym_slice(ctx, x, starts, ends, axes, steps)
  sl = _slice_params(x.shape, starts, ends, axes, steps)
  return _apply_slices(x, sl)


def _at_least(a: Any, b: Any) -> bool:
  """Whether size a >= size b for every value of their Variables (ints or symbolic)."""
  return (sint_to_uop(a) - b).simplify().vmin >= 0


def _sym_clamp(v: Any, n: Any) -> Any:
  """Slice bound `v` (an int, negative from the end, or a symbolic size) clamped to [0, n] where n or v is
  symbolic; None when the Variables' ranges don't decide the clamp."""
  if isinstance(v, UOp):
    if v.vmin < 0: return None
    if isinstance(n, int): return v if v.vmax <= n else None
    return v if _at_least(n, v) else None
  if isinstance(n, int): return min(max(v + n if v < 0 else v, 0), n)
  if v >= n.vmax: return n
  if v >= 0: return v if v <= n.vmin else None
  return (n + v).ssimplify() if v + n.vmin >= 0 else None


def sym_slice_plan(shape: tuple, starts: list, ends: list, axes: list | None, steps: list | None) -> list | str:
  """The slices of a Slice with symbolic sizes or bounds (dynamic dims under jit, see the runner's doc), or why it
  can't be done symbolically: step 1 only, bounds that the Variables' ranges keep inside the dim."""
  nd = len(shape)
  axes = [_axis(a, nd) for a in axes] if axes else list(range(len(starts)))
  if any(st != 1 for st in (steps or [])): return f"steps {steps} over a symbolic shape (only step 1 is supported)"
  sl: list[tuple[Any, Any] | None] = [None] * nd
  for a, s, e in zip(axes, starts, ends):
    lo, hi = _sym_clamp(s, shape[a]), _sym_clamp(e, shape[a])
    if lo is None or hi is None or not _at_least(hi, lo):
      return (f"bounds [{_sym_text(s)}, {_sym_text(e)}) over a dim of size {_sym_text(shape[a])} are not kept inside "
              "it, in order")
    sl[a] = (lo, hi)
  return sl


def _sym_text(v: Any) -> str: return v.render() if isinstance(v, UOp) else str(v)
def _sym_list(vs: Any) -> str: return "[" + ", ".join(_sym_text(v) for v in vs) + "]"


def _sym_slice(ctx: Any, x: Tensor, starts: list, ends: list, axes: list | None, steps: list | None) -> Tensor:
  """Slice with symbolic sizes or bounds (see sym_slice_plan; the runner falls back before a refused one runs)."""
  sl = sym_slice_plan(x.shape, starts, ends, axes, steps)
  if isinstance(sl, str): raise OnnxError(f"node {ctx.node.name!r} (Slice): {sl}")
  return x.shrink(sl)


def _apply_slices(x: Tensor, sl: list) -> Tensor:
  shp = [len(range(*s.indices(n))) for s, n in zip(sl, x.shape)]
  if 0 in shp: return Tensor(np.zeros(shp, to_numpy(x.dtype)), device=x.device)
  return x[tuple(sl)]


@op("Gather")
def gather(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, idx = inp
  ax = _axis(attrs.get("axis", 0), x.ndim)
  n = x.shape[ax]
  if isinstance(n, UOp): return _gather_symbolic_axis(ctx, x, idx, ax)
  if idx.ndim == 0:  # a scalar index is read on the host (the output drops the axis)
    i = int(_item(idx))
    if not -n <= i < n:
      raise OnnxError(f"node {ctx.node.name!r} (Gather): index {i} is out of range [{-n}, {n - 1}] for axis {ax} of "
                      f"size {n}; ONNX makes this an error")
    return x[tuple([slice(None)] * ax + [i + n if i < 0 else i])]
  ctx.check_indices(1, idx, n, f"axis-{ax}")
  idx = (idx < 0).where(idx + n, idx)
  if idx.numel() == 0:
    return Tensor(np.zeros(x.shape[:ax] + idx.shape + x.shape[ax + 1:], to_numpy(x.dtype)), device=x.device)
  return x[tuple([slice(None)] * ax + [idx.cast(dtypes.int32)])]


def _gather_symbolic_axis(ctx: Any, x: Tensor, idx: Tensor, ax: int) -> Tensor:
  """Gather along an axis of symbolic size n (a dynamic dim under jit): each index compared with arange(n) (the
  arange of n's largest value shrunk to n), the one matching element kept, summed over the axis."""
  n = x.shape[ax]
  assert isinstance(n, UOp), "the caller routes only symbolic axes here"
  ctx.check_indices(1, idx, n, f"axis-{ax}")
  nt = Tensor(n, device=x.device).cast(dtypes.int32)  # this call's n (a bound Variable's value at replay)
  i = idx.cast(dtypes.int32)
  i = (i < 0).where(i + nt, i)
  ar = Tensor.arange(n.vmax, device=x.device).cast(dtypes.int32).shrink(((0, n),))  # (n,)
  rest = [d for d in range(x.ndim) if d != ax]
  xm = x.permute(ax, *rest)                                                     # (n, *rest)
  hot = (i.unsqueeze(-1) == ar).reshape(*i.shape, n, *[1] * len(rest))          # (*I, n, 1...)
  acc = dtypes.int32 if x.dtype == dtypes.bool else x.dtype
  out = hot.where(xm.cast(acc), 0).sum(axis=i.ndim).cast(x.dtype)              # (*I, *rest)
  # back to ONNX's order: x's dims before the axis, the index dims, x's dims after it
  pre, post = list(range(i.ndim, i.ndim + ax)), list(range(i.ndim + ax, out.ndim))
  return out.permute(*pre, *range(i.ndim), *post) if pre else out


@op("GatherElements")
def gather_elements(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, idx = inp
  ax = _axis(attrs.get("axis", 0), x.ndim)
  ctx.check_indices(1, idx, x.shape[ax], f"axis-{ax}")
  idx = (idx < 0).where(idx + x.shape[ax], idx)
  return x.gather(ax, idx)


@op("GatherND")
def gather_nd(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, idx = inp
  b = attrs.get("batch_dims", 0)
  k = idx.shape[-1]
  if not isinstance(k, int) or k > x.ndim - b:
    raise OnnxError(f"GatherND: indices' last dim {k} must be at most the data's rank {x.ndim} - batch_dims {b}")
  bshape, inner = x.shape[:b], x.shape[b:b + k]
  ctx.check_indices(1, idx, list(inner), f"dims {b}..{b + k - 1}")
  nb = int(np.prod(bshape, dtype=np.int64))
  xf = x.reshape(nb, int(np.prod(inner, dtype=np.int64)), *x.shape[b + k:])
  idx = idx.cast(dtypes.int64)
  strides = np.cumprod([1, *inner[::-1]])[::-1][1:]
  lin: Tensor | None = None
  for j in range(k):
    ij = idx[..., j]
    ij = (ij < 0).where(ij + inner[j], ij)
    lin = ij * int(strides[j]) if lin is None else lin + ij * int(strides[j])
  if lin is None:  # k = 0: each index row picks the whole slice
    lin = Tensor.zeros(*idx.shape[:-1], dtype=dtypes.int64, device=idx.device)
  lin = lin.reshape(nb, -1)                                           # (nb, m)
  rows = [xf[i][lin[i].cast(dtypes.int32)] for i in range(nb)]
  out = rows[0].stack(*rows[1:]) if nb > 1 else rows[0].unsqueeze(0)
  return out.reshape(*idx.shape[:-1], *x.shape[b + k:])


def _scatter_reduce(x: Tensor, ax: int, idx: Tensor, upd: Tensor, red: str) -> Tensor:
  idx = (idx < 0).where(idx + x.shape[ax], idx)
  if red == "none": return x.scatter(ax, idx, upd)
  return x.scatter_reduce(ax, idx, upd, _SCATTER_REDUCE[red])


_SCATTER_REDUCE: dict[str, Literal["sum", "prod", "amax", "amin"]] = {"add": "sum", "mul": "prod", "max": "amax",
                                                                      "min": "amin"}


@op("ScatterElements", "Scatter")
def scatter_elements(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, idx, upd = inp
  ax = _axis(attrs.get("axis", 0), x.ndim)
  ctx.check_indices(1, idx, x.shape[ax], f"axis-{ax}")
  return _scatter_reduce(x, ax, idx, upd, attrs.get("reduction", "none"))


@op("ScatterND")
def scatter_nd(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, idx, upd = inp
  k = idx.shape[-1]
  inner = x.shape[:k]
  ctx.check_indices(1, idx, list(inner), f"dims 0..{k - 1}")
  n = int(np.prod(inner, dtype=np.int64))
  strides = np.cumprod([1, *inner[::-1]])[::-1][1:]
  idx = idx.cast(dtypes.int64)
  idx = (idx < 0).where(idx + Tensor(np.array(inner, np.int64), device=idx.device), idx)  # -1: the last, as onnxruntime
  lin = sum(idx[..., j] * int(strides[j]) for j in range(k))
  m = int(np.prod(idx.shape[:-1], dtype=np.int64))
  rest = x.shape[k:]
  xf = x.reshape(n, *rest)
  uf = upd.reshape(m, *rest)
  li = lin.reshape(m, *[1] * len(rest)).expand(m, *rest)
  red = attrs.get("reduction", "none")
  if red == "none": return xf.scatter(0, li.cast(dtypes.int32), uf).reshape(x.shape)
  return _scatter_reduce(xf, 0, li.cast(dtypes.int32), uf, red).reshape(x.shape)


@op("Expand")
def expand(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, shp = inp[0], _sints(inp[1])
  plan = expand_plan(x.shape, shp)
  if isinstance(plan, str): raise ValueError(f"Expand: {plan}")
  return x.reshape(plan[0]).expand(plan[1])


def expand_plan(shape: tuple, shp: list) -> tuple[list, list] | str:
  """(the input's shape aligned at the right, the output shape) of Expand, or why `shape` doesn't broadcast to
  `shp`; symbolic sizes (dynamic dims under jit) pair with an equal size or with 1."""
  n = max(len(shp), len(shape))
  xs, ss = [1] * (n - len(shape)) + list(shape), [1] * (n - len(shp)) + list(shp)
  bad = [i for i, (a, b) in enumerate(zip(xs, ss)) if not _one(a) and not _one(b) and not _same_size(a, b)]
  if bad:
    return (f"input shape {_sym_list(shape)} doesn't broadcast to shape {_sym_list(shp)} "
            f"(aligned at the right, dim {bad[0]}: {_sym_text(xs[bad[0]])} vs {_sym_text(ss[bad[0]])}; each pair "
            "must be equal or one of them 1)")
  return xs, [b if _one(a) else a for a, b in zip(xs, ss)]


def _one(d: Any) -> bool:
  """Whether size `d` is the int 1 (a symbolic size, at least 1 for a Variable dim, is not)."""
  return isinstance(d, int) and d == 1


@op("Tile")
def tile(ctx: Any, inp: list, attrs: dict) -> Tensor: return inp[0].repeat(_ints(inp[1]))


@op("ConstantOfShape")
def constant_of_shape(ctx: Any, inp: list, attrs: dict) -> Tensor:
  arr, et = attrs.get("value", (np.zeros(1, np.float32), 1))
  shp = _sints(inp[0])
  if any(isinstance(d, UOp) for d in shp):  # a symbolic shape (see host.py): a constant Tensor of that shape
    return to_tensor(arr.reshape(-1)[:1], ctx.device, et).reshape(*[1] * len(shp)).expand(*shp)
  return to_tensor(np.full(shp, arr.reshape(-1)[0], dtype=arr.dtype), ctx.device, et)


@op("Constant")
def constant(ctx: Any, inp: list, attrs: dict) -> Any:
  if "value" in attrs: return to_tensor(attrs["value"][0], ctx.device, attrs["value"][1])
  if "value_float" in attrs: return Tensor(np.array(attrs["value_float"], np.float32), device=ctx.device)
  if "value_floats" in attrs: return Tensor(np.array(attrs["value_floats"], np.float32), device=ctx.device)
  if "value_int" in attrs: return Tensor(np.array(attrs["value_int"], np.int64), device=ctx.device)
  if "value_ints" in attrs: return Tensor(np.array(attrs["value_ints"], np.int64), device=ctx.device)
  if "value_string" in attrs: return np.array(attrs["value_string"], dtype=object)
  if "value_strings" in attrs: return np.array(attrs["value_strings"], dtype=object)
  raise OnnxError(f"Constant with attributes {sorted(attrs)} is not supported")


@op("Range")
def range_(ctx: Any, inp: list, attrs: dict) -> Tensor:
  if any(_symbolic_value(x) for x in inp):  # a symbolic limit (dynamic dims under jit)
    plan = sym_range_plan(*[_sints(x)[0] for x in inp])
    if isinstance(plan, str): raise OnnxError(f"node {ctx.node.name!r} (Range): {plan}")
    (start, delta, count), dt = plan, inp[0].dtype
    # the values for the largest count, a constant, shrunk to this call's count
    return (Tensor.arange(count.vmax, device=ctx.device).cast(dt) * delta + start).cast(dt).shrink(((0, count),))
  s, l, d = (_item(x) for x in inp)
  n = _range_count(ctx.node, s, l, d)
  return (Tensor.arange(n, device=ctx.device).cast(inp[0].dtype) * d + s).cast(inp[0].dtype) if n else \
    Tensor(np.zeros(0, to_numpy(inp[0].dtype)), device=ctx.device)


def sym_range_plan(start: Any, limit: Any, delta: Any) -> tuple[int, int, UOp] | str:
  """(start, delta, symbolic count) of a Range whose limit is a symbolic size, or why it can't be one: start and
  delta plain ints, delta > 0, a count >= 0 for every value of the Variables."""
  if isinstance(start, UOp) or isinstance(delta, UOp) or not isinstance(limit, UOp) or delta <= 0:
    return f"start {_sym_text(start)}, limit {_sym_text(limit)}, delta {_sym_text(delta)}: only a symbolic limit " \
           "with int start and positive int delta is supported"
  count = ((limit - start + (delta - 1)) // delta).simplify() if delta > 1 else (limit - start).simplify()
  if count.vmin < 0: return f"its count {count.render()} may be negative"
  return start, delta, count


@op("EyeLike")
def eyelike(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  dt = _DTYPES[attrs["dtype"]] if "dtype" in attrs else x.dtype
  r, c = x.shape
  k = attrs.get("k", 0)
  ii = Tensor.arange(r, device=x.device).reshape(r, 1)
  jj = Tensor.arange(c, device=x.device).reshape(1, c)
  return (jj - ii).eq(k).cast(dt)


@op("OneHot")
def onehot(ctx: Any, inp: list, attrs: dict) -> Tensor:
  idx, depth, vals = inp
  d = int(_item(depth))
  if d <= 0: raise ValueError(f"OneHot depth is {d}; it must be positive (the number of classes)")
  ax = attrs.get("axis", -1)
  ax = ax + idx.ndim + 1 if ax < 0 else ax
  idx = (idx < 0).where(idx + d, idx)
  ar = Tensor.arange(d, device=idx.device).reshape([d if i == ax else 1 for i in range(idx.ndim + 1)])
  hot = idx.unsqueeze(ax).cast(dtypes.int64).eq(ar.cast(dtypes.int64))
  return hot.where(vals[1], vals[0])


@op("Trilu")
def trilu(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  k = int(_item(_opt(inp, 1))) if _opt(inp, 1) is not None else 0
  r, c = x.shape[-2:]
  ii = Tensor.arange(r, device=x.device).reshape(r, 1)
  jj = Tensor.arange(c, device=x.device).reshape(1, c)
  keep = (jj - ii) >= k if attrs.get("upper", 1) else (jj - ii) <= k
  return keep.where(x, 0).cast(x.dtype) if x.numel() else x


def _cum(kind: str) -> Callable:
  def run(ctx: Any, inp: list, attrs: dict) -> Tensor:
    x = inp[0]
    ax = _axis(int(_item(inp[1])), x.ndim)
    if attrs.get("reverse", 0): x = x.flip(ax)
    y = x.cumsum(ax) if kind == "sum" else x.cumprod(ax)
    if attrs.get("exclusive", 0):
      ident = 0 if kind == "sum" else 1
      pads = [(0, 0)] * x.ndim
      pads[ax] = (1, 0)
      y = y.pad(tuple(pads), value=ident).shrink(tuple((0, s) for s in x.shape))
    if attrs.get("reverse", 0): y = y.flip(ax)
    return y.cast(x.dtype)
  return run


OPS["CumSum"], OPS["CumProd"] = _cum("sum"), _cum("prod")


@op("Compress")
def compress(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, cond = inp
  keep = np.nonzero(_np(cond).astype(bool))[0]
  if "axis" not in attrs: x, ax = x.flatten(), 0
  else: ax = _axis(attrs["axis"], x.ndim)
  keep = keep[keep < x.shape[ax]]
  return x[tuple([slice(None)] * ax + [Tensor(keep.astype(np.int32), device=x.device)])] if len(keep) else \
    Tensor(np.zeros(x.shape[:ax] + (0,) + x.shape[ax + 1:], to_numpy(x.dtype)), device=x.device)


@op("NonZero")
def nonzero(ctx: Any, inp: list, attrs: dict) -> Tensor:
  return Tensor(np.array(np.nonzero(_np(inp[0])), dtype=np.int64).reshape(inp[0].ndim, -1), device=ctx.device)


@op("DepthToSpace")
def depth_to_space(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, b = inp[0], attrs["blocksize"]
  n, c, h, w = x.shape
  if attrs.get("mode", "DCR") == "DCR":
    y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
  else: y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
  return y.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth")
def space_to_depth(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, b = inp[0], attrs["blocksize"]
  n, c, h, w = x.shape
  if attrs.get("mode", "DCR") == "CRD":
    return x.reshape(n, c, h // b, b, w // b, b).permute(0, 1, 3, 5, 2, 4).reshape(n, c * b * b, h // b, w // b)
  return x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4).reshape(n, c * b * b, h // b, w // b)


@op("Pad")
def pad(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  mode = attrs.get("mode", "constant")
  if ctx.opset < 11: pads, value, axes = attrs["pads"], attrs.get("value", 0.0), None
  else:
    pads = _ints(inp[1])
    cv = _opt(inp, 2)
    value = _item(cv) if cv is not None and cv.numel() else 0
    axes = _ints(_opt(inp, 3)) or None
  nd = x.ndim
  axes = [_axis(a, nd) for a in axes] if axes else list(range(nd))
  k = len(axes)
  pairs = [(0, 0)] * nd
  for i, a in enumerate(axes): pairs[a] = (pads[i], pads[i + k])
  if mode == "constant": return x.pad(tuple(pairs), value=value)
  if mode == "wrap":
    for a, (b, e) in enumerate(pairs):
      if b or e:
        n = x.shape[a]
        reps = -(-(b + e) // n) + 1
        big = x.repeat([reps + 1 if i == a else 1 for i in range(nd)])
        start = (n - b % n) % n
        x = big.shrink(tuple((start, start + n + b + e) if i == a else None for i in range(nd)))
    return x
  return x.pad(tuple(pairs), mode={"reflect": "reflect", "edge": "replicate"}[mode])


@op("ReverseSequence")
def reverse_sequence(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x, lens = inp[0], _ints(inp[1])
  ba, ta = attrs.get("batch_axis", 1), attrs.get("time_axis", 0)
  t = x.shape[ta]
  idx = np.tile(np.arange(t), (len(lens), 1))
  for b, l in enumerate(lens): idx[b, :l] = np.arange(l)[::-1]
  shp = [1] * x.ndim
  shp[ba], shp[ta] = len(lens), t
  idx_arr = idx if ba < ta else idx.T
  it = Tensor(idx_arr.reshape(shp).astype(np.int64), device=x.device).expand(x.shape)
  return x.gather(ta, it)


@op("TopK")
def topk(ctx: Any, inp: list, attrs: dict) -> tuple:
  x = inp[0]
  k = attrs["k"] if ctx.opset < 10 else int(_item(inp[1]))
  ax = _axis(attrs.get("axis", -1), x.ndim)
  largest = bool(attrs.get("largest", 1))
  arr = _np(x)
  key = -arr if largest else arr
  if arr.dtype.kind == "u" and largest: key = np.iinfo(arr.dtype).max - arr
  order = np.argsort(key, axis=ax, kind="stable")
  idx = np.take(order, np.arange(k), axis=ax)
  return Tensor(np.take_along_axis(arr, idx, ax), device=x.device), Tensor(idx.astype(np.int64), device=x.device)


@op("Unique")
def unique(ctx: Any, inp: list, attrs: dict) -> tuple:
  arr = _np(inp[0])
  ax = attrs.get("axis")
  srt = attrs.get("sorted", 1)
  u, idx, inv, cnt = np.unique(arr, return_index=True, return_inverse=True, return_counts=True, axis=ax)
  if not srt:
    order = np.argsort(idx)
    u = np.take(u, order, axis=ax if ax is not None else 0)
    remap = np.argsort(order)
    idx, inv, cnt = idx[order], remap[inv.reshape(-1)], cnt[order]
  d = ctx.device
  return (Tensor(u, device=d).cast(inp[0].dtype), Tensor(idx.astype(np.int64), device=d),
          Tensor(inv.reshape(-1).astype(np.int64), device=d), Tensor(cnt.astype(np.int64), device=d))


# ***** reductions *****
_REDUCE_IDENT = {"ReduceSum": 0.0, "ReduceProd": 1.0, "ReduceMax": -math.inf, "ReduceMin": math.inf,
                 "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceSumSquare": 0.0, "ReduceLogSum": -math.inf,
                 "ReduceLogSumExp": -math.inf, "ReduceMean": math.nan}


def _reduce(name: str) -> Callable:
  def run(ctx: Any, inp: list, attrs: dict) -> Tensor:
    x = inp[0]
    axes_from_input = ctx.opset >= (13 if name == "ReduceSum" else 18)
    axes = _ints(_opt(inp, 1)) if axes_from_input else attrs.get("axes", [])
    keep = bool(attrs.get("keepdims", 1))
    if not axes:
      if attrs.get("noop_with_empty_axes", 0): return x
      axes = list(range(x.ndim))
    axes = tuple(sorted({_axis(a, x.ndim) for a in axes}))
    if any(x.shape[a] == 0 for a in axes):
      shp = tuple(1 if i in axes else s for i, s in enumerate(x.shape)) if keep else \
        tuple(s for i, s in enumerate(x.shape) if i not in axes)
      ident = _REDUCE_IDENT[name]
      if x.dtype == dtypes.bool: ident = name == "ReduceMin" or name == "ReduceProd"
      elif dtypes.is_int(x.dtype) and math.isinf(ident): ident = x.dtype.min if ident > 0 else x.dtype.max
      if dtypes.is_int(x.dtype) and name in ("ReduceMax",): ident = x.dtype.min
      if dtypes.is_int(x.dtype) and name in ("ReduceMin",): ident = x.dtype.max
      return Tensor(np.full(shp, ident, to_numpy(x.dtype)), device=x.device)
    if name == "ReduceSum": out = x.sum(axes, keepdim=keep)
    elif name == "ReduceMean": out = x.mean(axes, keepdim=keep)
    elif name == "ReduceMax": out = x.max(axes, keepdim=keep)
    elif name == "ReduceMin": out = x.min(axes, keepdim=keep)
    elif name == "ReduceProd": out = x.prod(axes, keepdim=keep)
    elif name == "ReduceL1": out = x.abs().sum(axes, keepdim=keep)
    elif name == "ReduceL2": out = (x * x).sum(axes, keepdim=keep).sqrt()
    elif name == "ReduceSumSquare": out = (x * x).sum(axes, keepdim=keep)
    elif name == "ReduceLogSum": out = x.sum(axes, keepdim=keep).log()
    else: out = (x if _is_float(x) else x.cast(dtypes.float64)).logsumexp(axes, keepdim=keep)
    return out.cast(x.dtype)
  return run


for _r in _REDUCE_IDENT: OPS[_r] = _reduce(_r)


def _arg(kind: str) -> Callable:
  def run(ctx: Any, inp: list, attrs: dict) -> Tensor:
    x = inp[0]
    ax = _axis(attrs.get("axis", 0), x.ndim)
    keep = bool(attrs.get("keepdims", 1))
    if attrs.get("select_last_index", 0):
      n = x.shape[ax]
      r = _arg(kind)(ctx, [x.flip(ax)], {"axis": ax, "keepdims": attrs.get("keepdims", 1)})
      return (n - 1 - r).cast(dtypes.int64)
    out = x.argmax(ax, keepdim=keep) if kind == "max" else x.argmin(ax, keepdim=keep)
    return out.cast(dtypes.int64)
  return run


OPS["ArgMax"], OPS["ArgMin"] = _arg("max"), _arg("min")


# ***** linear algebra *****
@op("MatMul")
def matmul(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, b = inp
  if not isinstance(a.shape[-1], int) or a.shape[-1]: return a.matmul(b)  # (a symbolic size is at least 1)
  # an empty inner dimension: zeros of the product's shape (numpy computes the shape)
  shape = np.matmul(np.zeros(a.shape, np.float32), np.zeros(b.shape, np.float32)).shape
  return _like(a, np.zeros(shape))


@op("Gemm")
def gemm(ctx: Any, inp: list, attrs: dict) -> Tensor:
  a, b, c = inp[0], inp[1], _opt(inp, 2)
  if attrs.get("transA", 0): a = a.T
  if attrs.get("transB", 0): b = b.T
  # alpha = beta = 1 (what exporters write for Linear layers) multiply nothing: a scaled product is no longer the
  # plain multiply-accumulate that the kernel optimizer tiles as a matmul
  alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
  y = a @ b if alpha == 1.0 else alpha * (a @ b)
  if c is not None: y = y + (c if beta == 1.0 else beta * c)
  return y.cast(a.dtype)


@op("Einsum")
def einsum(ctx: Any, inp: list, attrs: dict) -> Tensor:
  return Tensor.einsum(attrs["equation"].replace(" ", ""), *inp)


@op("Det")
def det(ctx: Any, inp: list, attrs: dict) -> Tensor:
  x = inp[0]
  return Tensor(np.linalg.det(_np(x)).astype(to_numpy(x.dtype)), device=x.device)

