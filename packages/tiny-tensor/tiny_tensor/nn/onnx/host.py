"""Shape arithmetic on the host: `HOST_OPS[op_type](ctx, values, attrs) -> numpy array`.

An exported model computes shapes with graph nodes: `Shape -> Gather -> Unsqueeze -> Concat -> Reshape`. Were those
values device tensors, `Reshape` would have to read its target shape back from the device: a host read per call,
which a TinyJit capture refuses. So the runner evaluates these nodes with numpy instead, when

- the node is `Shape` or `Size` (they need only the input's shape, which is static), or
- its operator is in `HOST_OPS`, every input is a constant known on the host (an initializer, a Constant node's
  output, or the output of an earlier host-evaluated node; never a graph input's value, which is data even when fed
  as a numpy array), and its output has at most `HOST_MAX` elements (`host_can_run`).

The output is still a Tensor in the graph's scope (device operators may consume it: a constant buffer), and the
runner notes its numpy value; operators that take shape data (Reshape's shape, Slice's starts, Expand's shape, ...)
read that value instead of the device. Each function here follows the ONNX specification of its operator for the
values it gets (integer, bool or float arrays); element types tiny lacks are left to the device operators.

Symbolic values. Under `OnnxRunner(jit=True)` a graph input's dynamic dims are bound Variables (see the runner's
doc), so `Shape` gives a vector that holds UOps (`batch`, `seq`) among ints: a numpy *object* array (`is_symbolic`),
each entry an int or a bound symbolic expression. The operators in `SYMBOLIC_HOST` carry such vectors exactly (the
movement ops as numpy does; Add/Sub/Mul/Max/Min entry by entry; Div when the quotient of a non-negative expression
by a positive int; comparisons and Equal when the Variables' ranges decide them); for values they can't carry
(a float Cast of a symbolic size, Range with a symbolic limit, Mod, ...) they return None, and the runner then falls
back to a capture per input size for that model. An object array is never made from data, only from shapes.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tiny_uop.dtype import to_numpy
from tiny_uop.uop import UOp, sint_to_uop
from tiny_tensor.nn.onnx.base import _DTYPES, OnnxError, _range_count

HOST_MAX = 1 << 16  # largest host-evaluated output, in elements: shape values are short, masks built from them not
HOST_OPS: dict[str, Callable[..., np.ndarray]] = {}
FROM_SHAPE = ("Shape", "Size")  # the operators that need only their input's shape
_PLAIN_TYPES = (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13)  # ONNX element types numpy holds exactly


def host_op(*names: str) -> Callable:
  """Register the decorated numpy function as the host evaluation of the ONNX operators `names`."""
  def deco(fn: Callable) -> Callable:
    for n in names: HOST_OPS[n] = fn
    return fn
  return deco


def _ints(v: np.ndarray | None) -> list[int]:
  return [] if v is None else [int(x) for x in np.asarray(v).reshape(-1).tolist()]


def is_symbolic(v: Any) -> bool:
  """Whether host value `v` is a symbolic shape value: an object array of ints and UOps (see the module doc)."""
  return isinstance(v, np.ndarray) and v.dtype == object


def sym_array(items: list[Any], shape: tuple[int, ...] | None = None) -> np.ndarray:
  """`items` (ints and symbolic UOps) as an int64 array, or as an object array when one is symbolic; each UOp is
  simplified (an expression that folds to a constant becomes its int)."""
  vals = [x.ssimplify() if isinstance(x, UOp) else int(x) for x in items]
  shape = (len(vals),) if shape is None else shape
  if not any(isinstance(x, UOp) for x in vals): return np.array(vals, np.int64).reshape(shape)
  out = np.empty(len(vals), dtype=object)
  for i, x in enumerate(vals): out[i] = x
  return out.reshape(shape)


def _sym_map(fn: Callable, *arrays: np.ndarray) -> np.ndarray | None:
  """`fn` applied entry by entry to `arrays` broadcast together (ints and UOps); None when fn returns None for one."""
  b = np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in arrays])
  out = []
  for xs in zip(*[a.reshape(-1).tolist() for a in b]):
    if (r := fn(*xs)) is None: return None
    out.append(r)
  return sym_array(out, b[0].shape)


def _decided(cond: Any) -> bool | None:
  """A symbolic comparison as a bool when the Variables' ranges decide it, else None."""
  if not isinstance(cond, UOp): return bool(cond)
  sx = cond.simplify()
  return bool(sx.vmin) if sx.vmin == sx.vmax else None


def _sym_div(a: Any, b: Any) -> Any:
  """ONNX integer Div (truncating) of a symbolic size by a positive int; None when that isn't the case."""
  if not isinstance(b, int) or isinstance(b, bool) or b <= 0: return None
  if isinstance(a, UOp): return a // b if a.simplify().vmin >= 0 else None
  return int(a / b) if a < 0 else a // b


_SYM_CMP: dict[str, Callable] = {
  "Equal": lambda a, b: True if a is b else sint_to_uop(a).eq(b),
  "Less": lambda a, b: sint_to_uop(a) < b, "Greater": lambda a, b: sint_to_uop(b) < a,
  "LessOrEqual": lambda a, b: (sint_to_uop(b) < a).logical_not(),
  "GreaterOrEqual": lambda a, b: (sint_to_uop(a) < b).logical_not()}


def _sym_binary(op_type: str, vals: list) -> np.ndarray | None:
  """Add/Sub/Mul/Div/Max/Min and the comparisons on symbolic shape values (see the module doc); None where the
  answer isn't an int, a symbolic size or a decided bool."""
  a, b = vals[0], vals[1]
  if op_type in _SYM_CMP:
    plain = {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
             "GreaterOrEqual": np.greater_equal}[op_type]
    bb = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
    out = []
    for x, y in zip(bb[0].reshape(-1).tolist(), bb[1].reshape(-1).tolist()):
      sym = isinstance(x, UOp) or isinstance(y, UOp)
      r = _decided(_SYM_CMP[op_type](x, y)) if sym else bool(plain(x, y))
      if r is None: return None
      out.append(r)
    return np.array(out, bool).reshape(bb[0].shape)
  fns: dict[str, Callable] = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y,
                              "Div": _sym_div, "Max": lambda x, y: sint_to_uop(x).maximum(y),
                              "Min": lambda x, y: sint_to_uop(x).minimum(y)}
  if op_type not in fns or any(v.dtype.kind not in "iuO" for v in vals): return None
  acc: np.ndarray = vals[0]
  for v in vals[1:]:
    step = _sym_map(fns[op_type], acc, v)
    if step is None: return None
    acc = step
  return acc


def _axis(a: int, n: int, node: Any) -> int:
  if not -max(n, 1) <= a < max(n, 1):
    raise OnnxError(f"node {node.name!r} ({node.op_type}): axis {a} is out of range for rank {n}")
  return a + n if a < 0 else a


@host_op("Shape")
def shape(ctx: Any, vals: list, attrs: dict, in_shape: tuple) -> np.ndarray:
  n = len(in_shape)
  start, end = attrs.get("start", 0), attrs.get("end", n)
  start, end = min(max(start + n if start < 0 else start, 0), n), min(max(end + n if end < 0 else end, 0), n)
  return sym_array(list(in_shape[start:end]))


@host_op("Size")
def size(ctx: Any, vals: list, attrs: dict, in_shape: tuple) -> np.ndarray:
  return sym_array([math.prod(in_shape)], ())


@host_op("Gather")
def gather(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  x, idx = vals
  ax = _axis(attrs.get("axis", 0), x.ndim, ctx.node)
  n = x.shape[ax]
  bad = (idx < -n) | (idx >= n)
  if bad.any():
    raise OnnxError(f"node {ctx.node.name!r} (Gather): index {int(idx[bad].reshape(-1)[0])} is out of range "
                    f"[{-n}, {n - 1}] for axis {ax} of size {n}; ONNX makes this an error")
  out = np.take(x, np.where(idx < 0, idx + n, idx), axis=ax)
  return out if isinstance(out, np.ndarray) else sym_array([out], ())  # numpy gives an object array's 0-d pick bare


@host_op("Slice")
def slice_(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  from tiny_tensor.nn.onnx.ops import _slice_params
  x = vals[0]
  if ctx.opset < 10: starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
  else: starts, ends, axes, steps = (_ints(v) for v in (vals + [None] * 5)[1:5])
  return x[tuple(_slice_params(x.shape, starts, ends, axes or None, steps or None))]


@host_op("Concat")
def concat(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  xs = [v for v in vals if v is not None]
  return np.concatenate(xs, axis=_axis(attrs["axis"], xs[0].ndim, ctx.node))


@host_op("Unsqueeze")
def unsqueeze(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  x = vals[0]
  axes = attrs["axes"] if ctx.opset < 13 else _ints(vals[1])
  n = x.ndim + len(axes)
  shp = list(x.shape)
  for a in sorted(_axis(a, n, ctx.node) for a in axes): shp.insert(a, 1)
  return x.reshape(shp)


@host_op("Squeeze")
def squeeze(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  x = vals[0]
  axes = attrs.get("axes") if ctx.opset < 13 else (_ints(vals[1]) if len(vals) > 1 else None) or None
  if axes is None: return x.reshape([s for s in x.shape if s != 1])
  drop = {_axis(a, x.ndim, ctx.node) for a in axes}
  bad = [a for a in drop if x.shape[a] != 1]
  if bad: raise OnnxError(f"node {ctx.node.name!r} (Squeeze): axis {bad[0]} has size {x.shape[bad[0]]}, not 1")
  return x.reshape([s for i, s in enumerate(x.shape) if i not in drop])


@host_op("Reshape")
def reshape(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  x = vals[0]
  shp = attrs["shape"] if ctx.opset < 5 else _ints(vals[1])
  if not attrs.get("allowzero", 0): shp = [x.shape[i] if s == 0 else s for i, s in enumerate(shp)]
  return x.reshape(shp)


@host_op("Cast")
def cast(ctx: Any, vals: list, attrs: dict) -> np.ndarray | None:
  to = attrs["to"]
  if to not in _PLAIN_TYPES: raise NotImplementedError  # not reached: host_can_run checks the type first
  if is_symbolic(vals[0]): return vals[0] if to in (6, 7) else None  # a symbolic size stays one as int32/int64
  return vals[0] != 0 if to == 9 else vals[0].astype(to_numpy(_DTYPES[to]))


def _same(fn: Callable) -> Callable:
  """A binary numpy function whose result keeps the first input's dtype (ONNX operands share theirs); symbolic
  values go to `_sym_binary`."""
  def run(ctx: Any, vals: list, attrs: dict) -> np.ndarray | None:
    if is_symbolic(vals[0]) or is_symbolic(vals[1]): return _sym_binary(ctx.node.op_type, vals)
    return np.asarray(fn(vals[0], vals[1])).astype(vals[0].dtype)
  return run


def _compare(fn: Callable) -> Callable:
  """A numpy comparison or logical function (a bool result); symbolic values go to `_sym_binary`."""
  def run(ctx: Any, vals: list, attrs: dict) -> np.ndarray | None:
    if is_symbolic(vals[0]) or is_symbolic(vals[1]): return _sym_binary(ctx.node.op_type, vals)
    return np.asarray(fn(vals[0], vals[1]))
  return run


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """ONNX integer Div truncates toward zero (numpy's // floors)."""
  if a.dtype.kind == "f": return a / b
  if (np.asarray(b) == 0).any(): raise OnnxError(f"integer Div by zero in shape arithmetic: {a} / {b}")
  q = np.abs(a) // np.abs(b)
  return np.where((a < 0) != (b < 0), -q, q)


_ARITH: dict[str, Callable] = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _int_div}
for _name, _fn in _ARITH.items():
  HOST_OPS[_name] = _same(_fn)
for _name, _fn in {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
                   "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or}.items():
  HOST_OPS[_name] = _compare(_fn)
for _name, _fn in {"Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Floor": np.floor, "Ceil": np.ceil,
                   "Sqrt": np.sqrt}.items():
  HOST_OPS[_name] = (lambda f: lambda ctx, vals, attrs: np.asarray(f(vals[0])).astype(vals[0].dtype))(_fn)


@host_op("Mod")
def mod(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  a, b = vals
  if a.dtype.kind in "iu" and (np.asarray(b) == 0).any():
    raise OnnxError(f"integer Mod by zero in shape arithmetic: {a} % {b}")
  return np.asarray(np.fmod(a, b) if attrs.get("fmod", 0) else np.mod(a, b)).astype(a.dtype)


@host_op("Max", "Min")
def max_min(ctx: Any, vals: list, attrs: dict) -> np.ndarray | None:
  if any(is_symbolic(v) for v in vals): return _sym_binary(ctx.node.op_type, vals)
  fn = np.maximum if ctx.node.op_type == "Max" else np.minimum
  out = vals[0]
  for v in vals[1:]: out = fn(out, v)
  return np.asarray(out).astype(vals[0].dtype)


@host_op("Where")
def where(ctx: Any, vals: list, attrs: dict) -> np.ndarray | None:
  if is_symbolic(vals[1]) or is_symbolic(vals[2]):
    if is_symbolic(vals[0]) or vals[1].dtype.kind not in "iuO" or vals[2].dtype.kind not in "iuO": return None
    w = np.where(vals[0], np.asarray(vals[1], object), np.asarray(vals[2], object))
    return sym_array(w.reshape(-1).tolist(), w.shape)
  return np.asarray(np.where(vals[0], vals[1], vals[2])).astype(vals[1].dtype)


@host_op("ConstantOfShape")
def constant_of_shape(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  arr, _ = attrs.get("value", (np.zeros(1, np.float32), 1))
  return np.full(_ints(vals[0]), arr.reshape(-1)[0], dtype=arr.dtype)


@host_op("Range")
def range_(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  s, l, d = (v.reshape(-1)[0] for v in vals)
  n = _range_count(ctx.node, s, l, d)
  return (s + np.arange(n, dtype=vals[0].dtype) * d).astype(vals[0].dtype)


@host_op("Expand")
def expand(ctx: Any, vals: list, attrs: dict) -> np.ndarray:
  x, shp = vals[0], _ints(vals[1])
  try: out_shape = np.broadcast_shapes(x.shape, tuple(shp))
  except ValueError as e:
    raise OnnxError(f"node {ctx.node.name!r} (Expand): input shape {list(x.shape)} doesn't broadcast to {shp}") from e
  return np.broadcast_to(x, out_shape).copy()


def _broadcast_bound(shapes: list[tuple[int, ...]]) -> int:
  """The element count of `shapes` broadcast together (right-aligned, each dim the largest): exact when they
  broadcast, an upper bound when they don't (the operator then reports the mismatch)."""
  n = max((len(s) for s in shapes), default=0)
  dims = [max((s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0), default=1) for i in range(n)]
  return math.prod(max(d, 0) for d in dims)


_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Mod", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And",
                "Or", "Where", "Max", "Min"}


# the operators whose host evaluation takes symbolic shape values (see the module doc); they return None for the
# values they can't carry
SYMBOLIC_HOST = {"Shape", "Size", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Cast", "Add", "Sub",
                 "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Where"}
# the inputs that may be symbolic, per operator (the others must be plain: axes, indices, starts, ...); None: all
_SYMBOLIC_INPUTS: dict[str, tuple[int, ...] | None] = {
  "Gather": (0,), "Slice": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Reshape": (0,), "Cast": (0,), "Where": (1, 2)}


def _size_of(op_type: str, vals: list, attrs: dict) -> int:
  """An upper bound of the output's element count, known before computing it (for the HOST_MAX limit)."""
  if op_type == "ConstantOfShape": return math.prod(max(d, 0) for d in _ints(vals[0]))
  if op_type == "Expand": return _broadcast_bound([vals[0].shape, tuple(_ints(vals[1]))])
  if op_type in _ELEMENTWISE: return _broadcast_bound([v.shape for v in vals if v is not None])
  if op_type == "Range":
    s, l, d = (float(v.reshape(-1)[0]) for v in vals)
    # a degenerate range (delta 0, inf, NaN) counts 0 here: range_ then raises naming the node
    return max(int(math.ceil((l - s) / d)), 0) if d and all(math.isfinite(v) for v in (s, l, d)) else 0
  return sum(v.size for v in vals if v is not None)


def host_can_run(op_type: str, vals: list, attrs: dict) -> bool:
  """Whether `HOST_OPS[op_type]` handles these host input values (all numeric numpy arrays or None) and attributes
  within HOST_MAX elements."""
  if op_type == "Cast" and attrs.get("to") not in _PLAIN_TYPES: return False
  if op_type == "ConstantOfShape" and attrs.get("value", (None, 1))[1] not in _PLAIN_TYPES: return False
  if any(v is not None and v.dtype.kind not in "biufO" for v in vals): return False
  if any(is_symbolic(v) for v in vals):
    if op_type not in SYMBOLIC_HOST: return False
    ok = _SYMBOLIC_INPUTS.get(op_type)
    if ok is not None and any(is_symbolic(v) for i, v in enumerate(vals) if i not in ok): return False
    return sum(v.size for v in vals if v is not None) <= HOST_MAX
  return _size_of(op_type, vals, attrs) <= HOST_MAX
