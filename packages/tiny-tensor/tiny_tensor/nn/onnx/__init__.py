"""Run ONNX models with tiny: `OnnxRunner(path_or_model)(inputs) -> outputs`.

>>> import onnx, numpy as np                                       # doctest: +SKIP
>>> from tiny_tensor import Tensor
>>> from tiny_tensor.nn.onnx import OnnxRunner
>>> run = OnnxRunner("model.onnx")                                 # doctest: +SKIP
>>> out = run({"input": Tensor(np.zeros((1, 3, 224, 224), np.float32))})  # doctest: +SKIP

The `onnx` package (`pip install tiny-tensor[onnx]`) parses the protobuf; everything that computes is a Tensor op
(`ops.py`: one function per ONNX operator, registered by name with the opset it was written against). A node's
attributes arrive as Python values with the operator's defaults filled in where they matter; its inputs as Tensors,
None for an omitted optional input, or lists for ONNX sequences. Inputs that ONNX treats as shape data (Reshape's
shape, Slice's starts, ...) are needed on the host: an ONNX graph mixes data and shapes, a tiny kernel does not. Shape
arithmetic stays on the host (`host.py`): `Shape`/`Size` and the nodes that compute only from them and from constants
(Gather, Slice, Concat, Unsqueeze, Cast, Add, Range, ConstantOfShape, ...) are evaluated with numpy, and operators
read such values without touching the device (`known_value`). Only shape data computed from a graph input's values
(or a data-dependent operator: NonZero, TopK, Unique, ...) is read back from the device, which TinyJit refuses.

Subgraphs (If, Loop, Scan, SequenceMap) run through the same runner with the outer scope's values visible.

Values of ONNX types tiny has no dtype for: strings are numpy object arrays (the string operators work on them on the
host); int4/uint4 are held in int8/uint8, float4e2m1 and the fnuz/e8m0 float8 kinds in float32, with their values
rounded to what the type can hold (`Cast` and the quantize ops do the rounding). float8e4m3fn/e5m2 are held in float32
too: tiny has their dtypes but the CPU backend can't compute with them yet.

bfloat16 inputs are computed in float32 and the float results rounded back to bfloat16 (the CPU backend's LLVM
renderer fails on some bfloat16 kernels: reported), and so are float16 inputs of Attention (the reference
accumulates in float32).
"""
from __future__ import annotations

import functools
import math
import os
import threading
from typing import Any, Sequence

import numpy as np

from tiny_uop.dtype import DType, dtypes, from_numpy
from tiny_uop.helpers import DEBUG, ONNX_WINO
from tiny_uop.plugins import Device
from tiny_uop.uop import Ops, UOp, Variable
from tiny_tensor import engine
from tiny_tensor.jit import JitError, TinyJit
from tiny_tensor.nnops import conv_weight_channels_last
from tiny_tensor.tensor import Tensor
from tiny_tensor.nn.onnx.base import (_ACTIVE, _DTYPES, STRING, OnnxError, OnnxModelError, _back_to, onnx_dtype,
                                     to_tensor)

__all__ = ["OnnxRunner", "OnnxError", "OnnxModelError", "onnx_dtype", "to_tensor"]


def _onnx() -> Any:
  try:
    import onnx
  except ImportError as e:
    raise ImportError("tiny_tensor.nn.onnx needs the onnx package: pip install 'tiny-tensor[onnx]'") from e
  return onnx


def _attr(a: Any, onnx: Any, base_dir: str | None = None) -> Any:
  """An AttributeProto as a Python value (tensors as numpy arrays, graphs as GraphProto); `base_dir`: the folder
  external tensor data may be read from (see _tensor_value)."""
  A = onnx.AttributeProto
  if a.type == A.FLOAT: return a.f
  if a.type == A.INT: return a.i
  if a.type == A.STRING: return a.s.decode("utf-8", errors="replace")
  if a.type == A.TENSOR: return _tensor_value(a.t, onnx, base_dir)
  if a.type == A.GRAPH: return a.g
  if a.type == A.FLOATS: return list(a.floats)
  if a.type == A.INTS: return list(a.ints)
  if a.type == A.STRINGS: return [s.decode("utf-8", errors="replace") for s in a.strings]
  if a.type == A.SPARSE_TENSOR: return a.sparse_tensor
  if a.type == A.TENSORS: return [_tensor_value(t, onnx, base_dir) for t in a.tensors]
  if a.type == A.GRAPHS: return list(a.graphs)
  raise OnnxError(f"attribute {a.name!r} has unsupported type {a.type}")


def _tensor_value(t: Any, onnx: Any, base_dir: str | None = None) -> Any:
  """(numpy array, ONNX elem_type) of a TensorProto. External data is read only from inside folder `base_dir`
  (None: refused), with the file name, offset and length checked (see _read_external)."""
  from onnx import numpy_helper
  if t.data_location == onnx.TensorProto.EXTERNAL:
    t2 = onnx.TensorProto()
    t2.CopyFrom(t)
    t2.raw_data = _read_external(t, base_dir)
    t2.data_location = onnx.TensorProto.DEFAULT
    del t2.external_data[:]
    t = t2
  try: return (numpy_helper.to_array(t), t.data_type)
  except (ValueError, TypeError, KeyError) as e:  # data that doesn't fit its dims, an unknown element type
    raise OnnxModelError(f"tensor {t.name!r} (dims {list(t.dims)}, element type {t.data_type}) can't be read: "
                         f"{type(e).__name__}: {e}") from e


def _read_external(t: Any, base_dir: str | None) -> bytes:
  """The bytes of TensorProto `t`'s external data: its `location` resolved (symlinks too) must be a file inside
  `base_dir`, and `offset`/`length` inside that file; anything else raises OnnxModelError naming the tensor."""
  info = {e.key: e.value for e in t.external_data}
  loc = info.get("location", "")
  what = f"tensor {t.name!r} has external data at location {loc!r}"
  if base_dir is None:
    raise OnnxModelError(f"{what}, but the model was given as bytes or a ModelProto: external data is read only next "
                         "to a model loaded from a path, or from the folder passed as OnnxRunner(..., base_dir=...)")
  if not loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or ".." in loc.replace("\\", "/").split("/"):
    raise OnnxModelError(f"{what}: the location must be a relative path inside the model's folder {base_dir!r} "
                         "(no '..', no absolute path)")
  root = os.path.realpath(base_dir)
  path = os.path.realpath(os.path.join(root, loc))
  if os.path.commonpath([root, path]) != root or not os.path.isfile(path):
    raise OnnxModelError(f"{what}, which is not a file inside the model's folder {root!r}")
  try: offset, length = int(info.get("offset", 0)), int(info["length"]) if "length" in info else None
  except ValueError as e: raise OnnxModelError(f"{what}: offset/length {info} are not integers") from e
  size = os.path.getsize(path)
  if offset < 0 or offset > size or (length is not None and (length < 0 or offset + length > size)):
    raise OnnxModelError(f"{what}: offset {offset} and length {length} are outside the file's {size} bytes")
  with open(path, "rb") as f:
    f.seek(offset)
    return f.read(size - offset if length is None else length)


_KEEP_DTYPE = {"Cast", "CastLike", "DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "Shape", "Size"}


def _low_precision(op_type: str, args: list[Any]) -> DType | None:
  """The dtype whose inputs `op_type` computes in float32 (see the module doc), or None."""
  if op_type in _KEEP_DTYPE: return None
  dts = {a.dtype for a in args if isinstance(a, Tensor)}
  if dtypes.bfloat16 in dts: return dtypes.bfloat16
  if op_type == "Attention" and dtypes.float16 in dts: return dtypes.float16
  return None


def _checked_input(name: str, v: Any, et: int) -> Any:
  """Graph input `name` as declared element type `et` requires (see OnnxRunner's doc): arrays and Tensors must have
  it already; Python values are converted when exact."""
  if v is None: return v
  want = _DTYPES.get(et)
  if isinstance(v, Tensor):
    if want is not None and v.dtype != want:
      raise TypeError(f"ONNX input {name!r} is declared {_et_name(et)}, but a Tensor of {v.dtype} was given; cast it "
                      f"to {want} (onnxruntime refuses another element type too)")
    return v
  np_want = _np_dtype(et)
  if isinstance(v, (np.ndarray, np.generic)):
    ok = v.dtype.kind in "OUS" if et == STRING else v.dtype == np_want
    if not ok:
      raise TypeError(f"ONNX input {name!r} is declared {_et_name(et)}, but an array of {v.dtype} was given; convert "
                      f"it with .astype(np.{np_want.name}) if that is what you mean (onnxruntime refuses another "
                      "element type too)")
    return np.asarray(v)
  given = np.asarray(v)
  if et == STRING or given.dtype.kind in "OUS": return given
  with np.errstate(all="ignore"): conv = given.astype(np_want)
  if given.dtype.kind == "f" and np_want.kind == "f": return conv  # a float literal rounds, as writing it in code does
  if given.dtype.kind not in "biuf" or not np.array_equal(conv.astype(given.dtype), given):
    raise TypeError(f"ONNX input {name!r} is declared {_et_name(et)}, but {v!r:.80} isn't exactly representable in "
                    "it; pass a numpy array of that type")
  return conv


@functools.cache
def _np_dtype(et: int) -> np.dtype:
  """The numpy dtype of ONNX element type `et` (object for strings), as onnx's helper gives it: looked up once."""
  from onnx import helper
  return np.dtype(object) if et == STRING else np.dtype(helper.tensor_dtype_to_np_dtype(et))


def _et_name(et: int) -> str:
  from onnx import TensorProto
  return f"tensor({TensorProto.DataType.Name(et).lower()})" if et in TensorProto.DataType.values() else f"type {et}"


def _declared_dims(declared: Any) -> list[int | str | None]:
  """A TensorShapeProto's dims as Python values: a size, a dim_param name, or None for an unknown dim."""
  return [d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
          for d in declared.dim]


def _check_shape(name: str, given: tuple, want: list[int | str | None], dims: dict[str, tuple[str, int]]) -> None:
  """Input `name`'s shape against its declared dims (`_declared_dims`); `dims` collects the sizes of symbolic dims."""
  if len(want) == len(given) and all(w == g for w, g in zip(want, given)): return  # every dim a fixed, equal size
  shown = "[" + ", ".join("?" if w is None else str(w) for w in want) + "]"
  if len(want) != len(given):
    raise ValueError(f"ONNX input {name!r} is declared with shape {shown} (rank {len(want)}), but one of shape "
                     f"{list(given)} (rank {len(given)}) was given")
  for i, (w, g) in enumerate(zip(want, given)):
    if not isinstance(g, int) or w is None: continue
    if isinstance(w, int) and w != g:
      raise ValueError(f"ONNX input {name!r} is declared with shape {shown}, but one of shape {list(given)} was given "
                       f"(dim {i}: {g} != {w})")
    if isinstance(w, str):
      first = dims.setdefault(w, (name, g))
      if first[1] != g:
        raise ValueError(f"ONNX input {name!r} has size {g} in dim {i}, declared {w!r}, but input {first[0]!r} "
                         f"gave {w!r} size {first[1]}; inputs that share a symbolic dim must agree on its size")


def _constant_value(attrs: dict[str, Any]) -> np.ndarray | None:
  """The numpy value of a Constant node with attributes `attrs` (None for strings and sparse tensors)."""
  if "value" in attrs: return attrs["value"][0]
  for key, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                  ("value_ints", np.int64)):
    if key in attrs: return np.array(attrs[key], dt)
  return None


def _raise_bad_indices(checks: list[tuple[Any, str, bool]], vals: np.ndarray) -> None:
  """Raise OnnxError for the first runtime index check (node, what, negative) whose row of `vals` (count out of
  range, min bad, max bad, the axis size) counted a bad index."""
  for (node, what, negative), (cnt, lo, hi, n) in zip(checks, vals.tolist()):
    if cnt:
      bad = lo if lo < 0 else hi  # out-of-range values only: in-range ones counted as 0
      raise OnnxError(f"node {node.name!r} ({node.op_type}): {cnt} {what} index value(s) out of range, e.g. {bad} "
                      f"(valid: [{-n if negative else 0}, {n - 1}] for a size of {n}); ONNX makes this an error")


class _CallState(threading.local):
  """What one OnnxRunner call keeps while it runs, per thread (see OnnxRunner.__init__)."""

  def __init__(self) -> None:
    self.host: dict[int, tuple[Tensor, np.ndarray]] = {}
    self.foldable: set[int] = set()  # ids of the host values not fed as inputs: shape arithmetic (see host.py)
    self.deferred: list[tuple[Any, str, bool, Tensor]] = []
    self.own_jit = False  # the call runs inside the runner's own TinyJit (jit=True), which returns the index checks
    self.jit_checks: list[tuple[Any, str, bool]] = []  # the checks the last _jit_body run returned
    # jit=True: (input name, shape, numpy dtype) -> the Tensor that numpy-fed input is copied into on every call, so
    # a replay gets the very inputs it got last time (TinyJit's fast path) and no new Tensor is made per call
    self.staging: dict[tuple, Tensor] = {}
    # jit=True, inputs all staged: their staging keys -> (symbolic, the Tensors the jit is called with, the jit's key,
    # the Variables' values), so a repeated signature skips re-deriving them (see OnnxRunner._call_jit)
    self.prepared: dict[tuple, tuple[bool, dict[str, Any], tuple, dict[str, int]]] = {}
    # jit=True with dynamic dims: (a jit output's BUFFER, this call's shape) -> a Tensor viewing its first elements
    self.views: dict[tuple, Tensor] = {}
    # jit=True: the last replayed signature whose inputs are all staged, of static shapes (see OnnxRunner._fast_call):
    # (its staging keys, the staged Tensors, their Buffers, the jit's key in runner.jits, its index checks)
    self.fast: tuple[tuple, list[Tensor], list[Any], tuple, list[tuple[Any, str, bool]]] | None = None
    # jit=False (see OnnxRunner's doc, "Eager calls"): per input signature, _SEEN after its first call, then the graph
    # its second call built and recorded (_EagerGraph), or None when it can't be replayed (every call builds it)
    self.eager: dict[tuple, Any] = {}
    self.node: Any = None  # the node running now (named when a jit capture fails in it)
    self.symbolic = False  # the graph runs on inputs with symbolic dims (jit=True, see OnnxRunner's doc)
    self.symbolic_refused: str | None = None  # why the graph can't run symbolically: the node, the reason


_SEEN = object()  # an eager signature called once (see _CallState.eager)
_EAGER_GRAPHS_MAX = 64  # eager signatures remembered per thread (see OnnxRunner's doc); more clear them all


class _EagerGraph:
  """What a repeated eager call of one input signature replays (see OnnxRunner's doc, "Eager calls"): the schedule of
  its outputs' graphs (and of the runtime index checks' statistics, the last root when `checks`), recorded over the
  staged inputs, and the checks as (node, what, negative)."""
  __slots__ = ("rec", "checks")

  def __init__(self, rec: engine.Recorded, checks: list[tuple[Any, str, bool]]):
    self.rec, self.checks = rec, checks


_HOST_FLOAT_MAX = 4096  # float values are remembered on the host up to this many elements (integer ones always)

# Operators that run on Tensors with symbolic dims (Tensor ops only, no Python arithmetic on sizes); a node of
# another operator that gets such a Tensor makes the runner fall back to a capture per input size (see the doc)
SYMBOLIC_OPS = frozenset({
  "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Erf", "Gelu",
  "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Cast", "CastLike",
  "Identity", "Dropout", "Reciprocal", "LeakyRelu", "Softplus", "HardSigmoid", "HardSwish", "Clip", "Max", "Min",
  "Reshape", "Flatten", "Transpose", "Unsqueeze", "Squeeze", "Concat", "Slice", "Expand", "Shape", "Size", "Gather",
  "ConstantOfShape", "MatMul", "Gemm", "Softmax", "LogSoftmax", "LayerNormalization", "Conv", "MaxPool",
  "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "ReduceMean", "ReduceSum", "Split",
  "GatherElements", "IsNaN", "IsInf", "Sign", "Floor", "Ceil", "Round", "Sin", "Cos", "Xor", "Elu", "Selu",
})
# Operators of SYMBOLIC_OPS that need their `axis` attribute (default) to pick a dim of plain int size in their
# first input (None: refused when any input has a symbolic shape)
_STATIC_AXIS = {"Split": 0, "GatherElements": 0, "Concat": None}
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})  # refused outright under symbolic sizes
# The inputs, per operator, that may hold a symbolic shape value (read on the host as shape data, see host.py);
# a symbolic value reaching another input would be read as data: the runner falls back instead
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {"Reshape": (1,), "Expand": (1,), "Slice": (1, 2), "ConstantOfShape": (0,),
                                            "Range": (1,)}


def _operators() -> dict[str, Any]:
  """Every operator by op_type. The modules that define them, listed here, register them with `ops.op` as they are
  imported (ops.py used to import the other three at its bottom, while they import ops.py: issue #33)."""
  from tiny_tensor.nn.onnx import ops, ops_more, ops_nn, ops_seq  # noqa: F401 -- importing them fills ops.OPS
  return ops.OPS


def _conv_panel(w: Tensor) -> int:
  """The panel width the CPU heuristics lay a fixed conv weight `w` out in (`conv_weight_panel`; 0: plain
  channels-last), for a float weight of int shape on a device whose renderer knows its vector registers."""
  dims = [d for d in w.shape if isinstance(d, int)]
  if not isinstance(w.device, str) or len(dims) != w.ndim or not dtypes.is_float(w.dtype): return 0
  renderer = Device[w.device].renderer
  if not hasattr(renderer, "vector_registers"): return 0
  from tiny_codegen.opt.heuristic import conv_weight_panel
  return conv_weight_panel(renderer, dims[0], math.prod(dims[1:]), w.dtype.itemsize)


class _Ctx:
  """What an operator function sees besides its inputs and attributes."""

  def __init__(self, runner: OnnxRunner, node: Any, scope: dict[str, Any]):
    self.runner, self.node, self.scope = runner, node, scope

  @property
  def opset(self) -> int: return self.runner.opset
  @property
  def device(self) -> str | None: return self.runner.device

  def host_value(self, i: int) -> np.ndarray | None:
    """The node's `i`-th input as a numpy array when its value is known on the host without reading a device: an
    initializer, a Constant node's output or a graph input fed as a numpy array; else None."""
    if i >= len(self.node.input) or not self.node.input[i]: return None
    v = self.scope.get(self.node.input[i])
    hit = self.runner._call.host.get(id(v)) if isinstance(v, Tensor) else None
    return hit[1] if hit is not None and hit[0] is v else None

  def check_indices(self, i: int, idx: Tensor, size: Any, what: str, negative: bool = True) -> None:
    """Refuse index values outside [-size, size-1] (`negative=False`: [0, size-1]) in the node's `i`-th input `idx`
    (`size`: an int, or one size per entry of idx's last axis, as GatherND's index tuples). Host-known indices are
    checked now; others once the graph has run (see OnnxRunner's doc)."""
    if isinstance(size, UOp):  # a symbolic size (dynamic dims under jit): checked once the graph has run
      self.runner._defer_index_check(self.node, idx, size, what, negative)
      return
    n = np.asarray(size, dtype=np.int64)
    if (host := self.host_value(i)) is not None:
      bad = (host < (-n if negative else 0)) | (host >= n)
      if bad.any():
        v, at = host[bad].reshape(-1)[0], int(np.broadcast_to(n, host.shape)[bad].reshape(-1)[0])
        raise OnnxError(f"node {self.node.name!r} ({self.node.op_type}): {what} index {int(v)} is out of range "
                        f"[{-at if negative else 0}, {at - 1}] (a size of {at}); ONNX makes this an error")
      return
    if idx.numel() == 0: return
    self.runner._defer_index_check(self.node, idx, n, what, negative)

  def conv_weight(self, w: Any, i: int) -> Any:
    """`w`, the node's `i`-th input, a convolution weight, in conv2d's weight layout (`conv_weight_channels_last`):
    for a model initializer, the runner's own copy in that layout, made on first use and kept, so conv2d doesn't
    copy the weight again in every call (and every jit replay: one copy kernel per conv); other weights as given."""
    runner = self.runner
    initializer = runner._consts.get(self.node.input[i]) is w  # a bool: no narrowing of `w` by the identity test
    if not isinstance(w, Tensor) or w.ndim < 3 or not initializer: return w
    hit = runner._conv_weights.get(id(w))
    if hit is None or hit[0] is not w:
      hit = (w, conv_weight_channels_last(w, realize=True, panel=_conv_panel(w)))
      runner._conv_weights[id(w)] = hit
    return hit[1]

  def winograd(self, x: Any, w: Any, i: int, attrs: dict, pads: Any) -> tuple[int, Any]:
    """(m, the transformed weight) for a Conv node to run as Winograd F(m x m, 3 x 3) (`tiny_tensor.winograd`), or
    (0, None) for the direct conv: a 3x3, stride-1, dilation-1, ungrouped 2-d conv of a float32 initializer weight (in
    half or bfloat16, F(4,3)'s error, 2.7e-6 of the scale in float32, would be ~1e-2) on a
    CPU device (its renderer knows its vector registers: the rule is over the CPU machine model), static spatial sizes,
    `ONNX_WINO` on, and `winograd_tile` choosing an m for its shape. The weight is transformed once (realized) and kept
    like `conv_weight`'s copies, so a jit replay never transforms it again."""
    runner = self.runner
    initializer = runner._consts.get(self.node.input[i]) is w  # a bool: no narrowing of `w` by the identity test
    if not ONNX_WINO or not isinstance(w, Tensor) or not initializer or x.dtype != dtypes.float32: return 0, None
    if w.ndim != 4 or tuple(w.shape[2:]) != (3, 3) or attrs.get("group", 1) != 1 or w.dtype != dtypes.float32:
      return 0, None
    if any(v != 1 for v in (*attrs.get("strides", [1, 1]), *attrs.get("dilations", [1, 1]))): return 0, None
    if not isinstance(w.device, str) or not hasattr(Device[w.device].renderer, "vector_registers"): return 0, None
    dims = [v for v in (x.shape[0], *(s + b + a - 2 for s, (b, a) in zip(x.shape[2:], pads)), *w.shape[:2])
            if isinstance(v, int) and v > 0]
    if len(dims) != 5: return 0, None  # (a symbolic size, or no output)
    from tiny_codegen.machine import machine_of
    from tiny_tensor.winograd import winograd_tile, winograd_weight
    bs, ho, wo, cout, cin = dims
    m = winograd_tile(machine_of(Device[w.device].renderer), bs, cin, cout, ho, wo, w.dtype.itemsize)
    if not m: return 0, None
    hit = runner._conv_weights.get((id(w), m))
    if hit is None or hit[0] is not w:
      hit = (w, winograd_weight(w, m, realize=True))
      runner._conv_weights[(id(w), m)] = hit
    return m, hit[1]

  def run_graph(self, graph: Any, inputs: list[Any]) -> list[Any]:
    """Run a subgraph with `inputs` bound to its formal inputs, the current scope visible; its outputs in order."""
    return self.runner._run_graph(graph, dict(zip([i.name for i in graph.input], inputs)), outer=self.scope)


class OnnxRunner:
  """An ONNX model ready to run: `OnnxRunner(path_or_model_or_bytes, device=None)`; call it with
  `{input name: Tensor | numpy array}` to get `{output name: Tensor}` (lists for sequence outputs).

  `opset` is the model's default-domain opset version; operators follow that version's semantics where versions
  differ. Unsupported operators raise OnnxError naming them (all of a model's are listed before anything runs).

  Inputs are checked against the graph's declarations, as onnxruntime does: a numpy array or Tensor of another
  element type than declared raises TypeError (no cast: feed `x.astype(np.int64)` yourself); a plain Python value
  (scalar, list) is converted to the declared type only when that is exact (a float to a float type rounds, as a
  literal does), else TypeError. A shape of another rank or a fixed dim of another size raises ValueError naming the
  input, the declared and the given shape; a symbolic dim (`dim_param`) takes any size but the same size everywhere
  it appears among the inputs.

  Index values are data, so checking them needs their values. Index-taking operators (Gather, GatherElements,
  GatherND, ScatterElements, ScatterND; MaxUnpool in [0, size-1]) refuse an index outside [-size, size-1] with
  OnnxError naming the node (OneHot's out-of-range indices are all-off rows, as the spec says):
  - indices known on the host (initializers, Constant nodes, graph inputs fed as numpy arrays) are checked when the
    node runs, with no device work;
  - other indices (computed in the graph, or fed as Tensors) get a lazy "how many out of range" count; after the
    graph has run, the runner reads all those counts in one small host read (the outputs stay lazy) and raises for
    the first node that had one. The operator itself reads 0 for an out-of-range index, so the check is what stops
    a wrong result from getting out.
  A TinyJit capture refuses host reads, so a runner with runtime index checks can't be captured inside your own
  TinyJit; pass `runtime_index_checks=False` to capture it: runtime indices are then unchecked (an out-of-range one
  reads 0, as in tiny's own indexing). Host-known indices are still checked. With `jit=True` (below) the checks do
  work: the runner's jit returns their counts as one more output and the runner reads them after each call.

  `jit=True` runs the graph under a TinyJit of the runner's own, one per input signature (names, shapes, dtypes):
  call 1 runs eagerly, call 2 captures, later calls with inputs of that signature replay the captured kernels with
  no Python per node; inputs of a new shape get a capture of their own (`runner.jits`, {signature: TinyJit}; each
  keeps its intermediate buffers: `runner.jits.clear()` frees them). Input checks run before each call as above.
  Numpy-fed inputs are copied into Tensors the runner keeps per input signature (and thread), so a replay reads the
  very inputs it read last time and makes no Tensor per call (measured: the tiny GPT-2 of bench/bench_models.py spent
  ~190 us of CPU per call around its kernels, ~73 us after, on a 2-core Xeon family 6 model 207, AVX-512). A call
  whose inputs are numpy arrays of the shapes and dtypes of the last replay (a dict with exactly those names) skips
  re-deriving and re-checking them: each array's bytes are copied into its staged buffer and the capture replays; any
  other call takes the full path, checks and errors included.
  Under jit, inputs are data: their values are never used on the host (numpy-fed indices are checked at run time).
  The graph must not need device data on the host (a data-dependent shape: NonZero, Compress, TopK, Unique, Loop
  and If on computed values): its capture raises OnnxError naming the node; run it with jit=False. The returned
  Tensors are the jit's own, overwritten by the next call of the same signature (copy what you keep: `.numpy()` or
  `.clone()`). `debug=True` runs eagerly.

  Dynamic dims (`max_dims`, issue #39): a graph input's dim declared as a `dim_param` ("batch", "seq"), or left
  unknown (named "<input>.<i>" then), that `max_dims` names becomes a bound `Variable` in [1, max_dims[name]], so one
  capture serves every size in range: `OnnxRunner(m, jit=True, max_dims={"batch": 64, "seq": 512})`. The host shape
  arithmetic (host.py) carries the symbolic sizes (Shape -> Gather -> Concat -> Reshape, Mul/Div/Add on shapes,
  Equal/Where decided by the Variables' ranges, Expand/Slice/ConstantOfShape/Range targets). The capture's buffers
  are allocated for the largest sizes; the returned Tensors are views of this call's sizes into them, overwritten by
  the next call of *any* size. A size outside its range runs a capture of its own. A node that can't run on symbolic
  sizes (an operator outside `SYMBOLIC_OPS`, a reshape that isn't the same size for every value, a symbolic shape
  value read as data, ...) makes the runner fall back, for good, to a capture per input size: `runner.symbolic`
  turns False and `DEBUG=1` prints the node and why; the answers are the same either way. Opt-in, not the default:
  kernels compiled for a symbolic size replay somewhat slower than fixed-size ones on the CPU (the tiny BERT and
  GPT-2 of bench/bench_models.py at 64 tokens, one thread of a Xeon 6/207: 0.72-0.79 ms against 0.63-0.66 ms a
  call; the attention kernels, symbolic in two axes, lose most), so name a dim where recompiling per size (seconds)
  costs more than that. A signature seen before (every input numpy-fed, the same shapes) reuses what its last call
  derived from them: the staged inputs, the jit's key, the Variables' values, the outputs' views.

  Eager calls (`jit=False`, the default) return Tensors of their own, never overwritten, and run any model, data-
  dependent shapes included. Building a model's graph node by node in Python costs far more than running its kernels
  (a tiny BERT: ~20 ms of Python against ~0.7 ms of kernels), so with `reuse_graphs=True` (the default) a repeated
  input signature (every input a numpy array of numbers; the names, shapes and dtypes, the default dtypes, the
  device and `runtime_index_checks` alike) builds the graph once more and then replays it: call 1 runs as described
  above; call 2 copies the inputs into Tensors this thread keeps for the signature, builds the graph over them
  without using their values on the host (as under jit: numpy-fed indices are checked at run time), realizes its
  outputs and records the schedule; later calls copy the inputs in and run the recorded kernels into fresh output
  buffers, with no graph built or walked (`engine.replay_recorded`). A signature whose graph depends on more than
  the inputs' shapes is built by every call, as call 1 is: one whose build runs a kernel or reads device data on the
  host (a data-dependent shape, a random operator), an output that is an input or not a Tensor, a schedule with a
  copy between devices. The results are the same either way; from call 2 on a signature's outputs come realized.
  `reuse_graphs=False` builds the graph in every call (outputs stay lazy, as tinygrad 0.14's OnnxRunner's).

  jit stays off by default, as in tinygrad 0.14 (whose OnnxRunner never jits; the user wraps the call in TinyJit):
  a default jit would hand out Tensors the next call overwrites, or pay a copy of every output each call (measured:
  +0.16 ms on the tiny BERT's 1.1 ms replay at 64 tokens, 14%), and a model whose capture fails (a data-dependent
  shape) would need a silent eager fallback.

  External tensor data is read only from the model's folder (a model given by path) or from `base_dir` (required
  for a model given as bytes or a ModelProto); a location outside that folder (`..`, an absolute path, a symlink out)
  or an offset/length outside the file raises OnnxModelError (a ValueError) naming the tensor and the location.
  Malformed models are refused at load with OnnxModelError (a graph output nothing makes, local functions that call
  themselves); a Loop that would run more than `max_loop_trips` iterations (default 10**5: each runs its body in
  Python, ~0.5 ms, so the default bounds a runaway Loop to about a minute) raises OnnxModelError naming the node.
  """

  def __init__(self, model: Any, device: str | None = None, runtime_index_checks: bool = True, jit: bool = False,
               base_dir: str | os.PathLike | None = None, max_loop_trips: int = 10**5,
               max_dims: dict[str, int] | None = None, reuse_graphs: bool = True):
    onnx = _onnx()
    bad = {k: v for k, v in (max_dims or {}).items()
           if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad or not isinstance(max_dims, (dict, type(None))):
      raise ValueError(f"max_dims must map dim names (str) to an int >= 1, got {bad or max_dims!r}")
    self.max_dims = dict(max_dims or {})
    # jit=True: whether the dims named in max_dims become Variables; False for good once a node can't run symbolically
    self.symbolic = bool(self.max_dims)
    if isinstance(model, (str, os.PathLike)):
      if base_dir is None: base_dir = os.path.dirname(os.path.abspath(os.fspath(model)))
      try: model = onnx.load(os.fspath(model), load_external_data=False)  # read by _tensor_value, checked
      except OSError: raise
      except Exception as e:  # protobuf's DecodeError and friends: no common public base class
        raise OnnxModelError(f"{os.fspath(model)!r} is not a valid ONNX model: {type(e).__name__}: {e}") from e
    elif isinstance(model, (bytes, bytearray)):
      try: model = onnx.load_from_string(bytes(model))
      except Exception as e:  # protobuf's DecodeError and friends: no common public base class
        raise OnnxModelError(f"the bytes given are not a valid ONNX model: {type(e).__name__}: {e}") from e
    self.base_dir = None if base_dir is None else os.fspath(base_dir)
    if not isinstance(model, onnx.ModelProto):
      raise TypeError(f"OnnxRunner needs a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    self.model, self.device, self._onnx = model, device, onnx
    self.runtime_index_checks = runtime_index_checks
    self.reuse_graphs = reuse_graphs
    if not isinstance(max_loop_trips, int) or max_loop_trips < 0:
      raise ValueError(f"max_loop_trips must be an int >= 0, got {max_loop_trips!r}")
    self.max_loop_trips = max_loop_trips
    self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    self.functions = {(f.domain, f.name): f for f in model.functions}
    self._ops = _operators()
    missing = sorted({n.op_type for n in self._all_nodes(model.graph)
                      if n.op_type not in self._ops and (n.domain, n.op_type) not in self.functions})
    if missing: raise OnnxError(f"unsupported ONNX operators: {missing} (opset {self.opset})")
    self._check_function_cycles()
    self._check_outputs_made(model.graph)
    # per thread, for the call it runs: `host`, id(Tensor) -> (Tensor, its value as numpy) for the values known on
    # the host (initializers, numpy-fed inputs, Constant outputs; see _Ctx.host_value); `deferred`, the runtime index
    # checks queued, (node, what, lazy [count out of range, min bad, max bad, axis size])
    self._call = _CallState()
    self._consts = {t.name: self._init_value(t) for t in model.graph.initializer}
    # id(initializer) -> (it, its copy in conv2d's weight layout): made by _Ctx.conv_weight on first use
    self._conv_weights: dict[int | tuple[int, int], tuple[Tensor, Tensor]] = {}
    self._const_host = dict(self._call.host)
    self.inputs = {i.name: i for i in model.graph.input if i.name not in self._consts}
    # per tensor-typed input: (element type, declared dims or None), read from the protobuf once
    self._declared = {k: (i.type.tensor_type.elem_type, _declared_dims(i.type.tensor_type.shape)
                          if i.type.tensor_type.HasField("shape") else None)
                      for k, i in self.inputs.items() if i.type.HasField("tensor_type")}
    self.outputs = [o.name for o in model.graph.output]
    self.jit = jit
    # jit=True: one TinyJit per input signature (names, shapes, dtypes; a capture fits only its shapes)
    self.jits: dict[tuple, Any] = {}
    # per signature, the runtime index checks its capture returns, in order: (node, what, negative)
    self._jit_checks: dict[tuple, list[tuple[Any, str, bool]]] = {}

  def _subgraphs(self, nodes: Any) -> list[Any]:
    """The graphs in the attributes of `nodes` (one level: If branches, Loop/Scan bodies)."""
    A = self._onnx.AttributeProto
    return [g for n in nodes for a in n.attribute for g in ([a.g] if a.type == A.GRAPH else
                                                             list(a.graphs) if a.type == A.GRAPHS else [])]

  def _check_function_cycles(self) -> None:
    """Refuse a model whose local functions call each other in a cycle (it would recurse forever): OnnxModelError
    naming the cycle. Iterative depth-first search over the call graph."""
    calls: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for key, f in self.functions.items():
      callees, todo = set(), [list(f.node)]
      while todo:
        nodes = todo.pop()
        callees |= {(n.domain, n.op_type) for n in nodes if (n.domain, n.op_type) in self.functions}
        todo.extend(list(g.node) for g in self._subgraphs(nodes))
      calls[key] = sorted(callees)
    state: dict[tuple[str, str], int] = {}  # 1: on the current path, 2: done
    for root in calls:
      if state.get(root): continue
      path, stack = [root], [iter(calls[root])]
      state[root] = 1
      while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
          state[path.pop()] = 2
          stack.pop()
        elif state.get(nxt) == 1:
          cyc = path[path.index(nxt):] + [nxt]
          raise OnnxModelError(f"local function {nxt[1]!r} (domain {nxt[0]!r}) calls itself: "
                               + " -> ".join(c[1] for c in cyc) + "; recursive functions can't be run")
        elif not state.get(nxt):
          state[nxt] = 1
          path.append(nxt)
          stack.append(iter(calls[nxt]))

  def _check_outputs_made(self, graph: Any) -> None:
    """Refuse a graph (or subgraph) with an output that no input, initializer or node makes (nor an outer scope's
    value): OnnxModelError naming it."""
    todo: list[tuple[Any, frozenset[str]]] = [(graph, frozenset())]
    while todo:
      g, outer = todo.pop()
      known = set(outer) | {i.name for i in g.input} | {t.name for t in g.initializer}
      known |= {t.values.name for t in g.sparse_initializer}
      known |= {o for n in g.node for o in n.output if o}
      for o in g.output:
        if o.name not in known:
          raise OnnxModelError(f"graph {g.name!r} has output {o.name!r}, which no node, input or initializer makes")
      todo.extend((sub, frozenset(known)) for sub in self._subgraphs(g.node))

  def _all_nodes(self, graph: Any) -> list[Any]:
    out, todo = [], [graph]
    while todo:
      g = todo.pop()
      for n in g.node:
        out.append(n)
        for a in n.attribute:
          if a.type == self._onnx.AttributeProto.GRAPH: todo.append(a.g)
          elif a.type == self._onnx.AttributeProto.GRAPHS: todo.extend(a.graphs)
    return out

  def _init_value(self, t: Any) -> Any:
    arr, et = _tensor_value(t, self._onnx, self.base_dir)
    return self._remember(to_tensor(arr, self.device, et), arr)

  def _remember(self, v: Any, arr: Any, foldable: bool = True) -> Any:
    """Note that Tensor `v` holds numpy `arr` (integer and bool data; float data up to _HOST_FLOAT_MAX elements, in
    the Tensor's own dtype only: shape arithmetic mixes in small float constants). `foldable`: a constant, which
    host.py's operators may compute with (False for the values of inputs, which are data)."""
    if not (isinstance(v, Tensor) and isinstance(arr, np.ndarray)): return v
    if arr.dtype.kind in "iub" or (arr.dtype.kind == "f" and arr.size <= _HOST_FLOAT_MAX and
                                   arr.dtype.itemsize == v.dtype.itemsize):
      self._call.host[id(v)] = (v, np.asarray(arr))
      if foldable: self._call.foldable.add(id(v))
    return v

  def __call__(self, inputs: dict[str, Any] | None = None, debug: bool = False) -> dict[str, Any]:
    if self.jit and not debug and (fast := self._call.fast) is not None and (got := self._fast_call(fast, inputs)):
      return got
    inputs = dict(inputs or {})
    unknown = [k for k in inputs if k not in self.inputs]
    if unknown: raise KeyError(f"unknown ONNX input(s) {unknown}; the model's inputs: {list(self.inputs)}")
    jit = self.jit and not debug
    self._call.host, self._call.foldable, self._call.deferred = dict(self._const_host), set(self._const_host), []
    feed: dict[str, Any] = {}
    dims: dict[str, tuple[str, int]] = {}  # dim_param -> (the first input that has it, its size there)
    if jit and not self.jits:  # runner.jits.clear() frees the staged inputs and their views too
      self._call.fast = None
      self._call.staging.clear()
      self._call.prepared.clear()
      self._call.views.clear()
    sig: list[tuple] | None = [] if jit else None  # the staging keys of the inputs, while all are staged
    # eager: (name, shape, dtype) per input while every one is a numpy array of numbers (see "Eager calls")
    eager: list[tuple] | None = [] if not jit and not debug and self.reuse_graphs and not engine.capturing() else None
    checked: dict[str, tuple[Any, int]] = {}  # not jit: input name -> (its checked value, element type)
    for name in self.inputs:
      if name not in inputs:
        raise KeyError(f"ONNX input {name!r} is missing; the model's inputs: {list(self.inputs)}")
      if (decl := self._declared.get(name)) is None:
        feed[name] = to_tensor(inputs[name], self.device, None)
        sig = eager = None
        continue
      et, want = decl
      v = _checked_input(name, inputs[name], et)
      if v is not None and want is not None: _check_shape(name, tuple(v.shape), want, dims)
      if not jit:
        checked[name] = (v, et)
        if eager is not None and isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
          eager.append((name, v.shape, v.dtype.str))
        else: eager = None
        continue
      # under jit an input's value changes from call to call: only its shape may be used on the host
      if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
        feed[name], skey = self._staged(name, v, et)
        if sig is not None: sig = None if skey is None else [*sig, skey]
        continue
      feed[name], sig = to_tensor(v, self.device, et), None
    if jit: return self._call_jit(feed, None if sig is None else tuple(sig))
    if eager is not None:
      ekey = (*eager, self.runtime_index_checks, dtypes.default_float, dtypes.default_int,
              self.device if self.device is not None else Device.DEFAULT)
      if (state := self._call.eager.get(ekey)) is not None: return self._eager_call(ekey, state, checked, feed)
      if ekey not in self._call.eager:
        if len(self._call.eager) >= _EAGER_GRAPHS_MAX:
          self._call.eager.clear()
          self._call.staging.clear()
        self._call.eager[ekey] = _SEEN
    return self._eager_plain(checked, feed, debug)

  def _eager_call(self, ekey: tuple, state: Any, checked: dict[str, tuple[Any, int]],
                  feed: dict[str, Any]) -> dict[str, Any]:
    """An eager call of a signature called before (see the class doc, "Eager calls"): the numpy inputs are copied
    into this thread's staged Tensors; the second call builds the graph over them (their values unseen, as under
    jit) and records its schedule, later ones replay that schedule. A signature whose graph can't be replayed
    (its build ran a kernel or read device data on the host, an output isn't a new Tensor, the schedule has a copy)
    runs like a first call from then on: this call's results are right either way."""
    staged = {}
    for name, (v, et) in checked.items():
      feed[name], skey = self._staged(name, v, et)
      if skey is None:  # (a dtype converted on the way: not staged) this signature is never replayed
        self._call.eager[ekey] = None
        return self._eager_plain(checked, feed)
      staged[name] = skey
    if isinstance(state, _EagerGraph):
      outs = [Tensor(u) for u in engine.replay_recorded(state.rec)]
      if state.checks: _raise_bad_indices(state.checks, outs.pop().numpy())
      return dict(zip(self.outputs, outs))
    ran: list[Any] = []  # kernels run or device data read while the graph is built
    prev, _ACTIVE.host = _ACTIVE.host, self._call.host
    try:
      with engine.capture(ran.append, ran.append):
        outs = self._run_graph(self.model.graph, feed, outer=dict(self._consts))
    finally: _ACTIVE.host = prev
    checks, self._call.deferred = self._call.deferred, []
    roots = [o.uop for o in outs if isinstance(o, Tensor)]
    if ran or len(roots) != len(outs) or any(engine.is_realized(u) or not isinstance(u.device, str) for u in roots):
      # every later call builds the graph; this call's results may view the staged inputs: not refilled again
      self._call.eager[ekey] = None
      for k in staged.values(): self._call.staging.pop(k, None)
      self._call.deferred = checks
      self._run_deferred_checks(outs)
      return dict(zip(self.outputs, outs))
    if checks: roots.append(Tensor.stack(*[c[3] for c in checks]).uop)
    del outs
    becomes, rec = engine.realize_recorded(roots)
    got = [Tensor(becomes[u]) for u in roots]
    marks = [c[:3] for c in checks]
    self._call.eager[ekey] = None if rec is None else _EagerGraph(rec, marks)
    if rec is None:
      for k in staged.values(): self._call.staging.pop(k, None)
    if marks: _raise_bad_indices(marks, got.pop().numpy())
    return dict(zip(self.outputs, got))

  def _eager_plain(self, checked: dict[str, tuple[Any, int]], feed: dict[str, Any],
                   debug: bool = False) -> dict[str, Any]:
    """An eager call that builds the graph on the inputs (`checked` as fresh Tensors, their values known on the host,
    and `feed`, the other ones); its outputs stay lazy unless runtime index checks realized them."""
    for name, (v, et) in checked.items(): feed[name] = self._remember(to_tensor(v, self.device, et), v, foldable=False)
    prev, _ACTIVE.host = _ACTIVE.host, self._call.host
    try: outs = self._run_graph(self.model.graph, feed, outer=dict(self._consts), debug=debug)
    finally: _ACTIVE.host = prev
    self._run_deferred_checks(outs)
    return dict(zip(self.outputs, outs))

  def _fast_call(self, fast: tuple, inputs: Any) -> dict[str, Any] | None:
    """A jitted call with the signature of the last replay (`fast`, see _CallState.fast: every input a numpy array of
    the shape and dtype that call checked and staged, no dynamic dims): each array's bytes copied straight into its
    staged Buffer, the capture replayed and its index checks read, without re-deriving what that call derived. None (the
    call takes the full path, which checks and reports everything) when the inputs differ in any way or the jit was
    reset or cleared."""
    sig, staged, bufs, key, checks = fast
    if type(inputs) is not dict or len(inputs) != len(sig) or (fn := self.jits.get(key)) is None or fn.cnt < 2:
      return None
    arrs: list[Any] = []
    for name, shape, dt in sig:
      if type(v := inputs.get(name)) is not np.ndarray or v.shape != shape or v.dtype.str != dt: return None
      arrs.append(v if v.flags.c_contiguous else np.ascontiguousarray(v))
    with engine.lock:  # (as engine.copy_into: the device's copy-in waits until its kernels are done with the buffer)
      for b, v in zip(bufs, arrs):
        if b.nbytes: b.copyin(memoryview(v).cast("B"))
    outs = fn(*staged)
    if checks:
      stats, outs = outs[-1], outs[:-1]
      _raise_bad_indices(checks, stats.numpy())
    return dict(zip(self.outputs, outs))

  def _staged(self, name: str, arr: np.ndarray, et: int) -> tuple[Any, tuple | None]:
    """Input `name` (a numpy array of numbers) as the Tensor this thread's jitted calls of its shape and dtype read it
    from: made by the first call, its buffer refilled with `arr`'s bytes by every later one (a copy-in waits for the
    device to be done with the buffer). Inputs whose bytes aren't the Tensor's as they are (a dtype converted on the
    way) get a fresh Tensor per call. Returns (the Tensor, its staging key or None when it isn't staged)."""
    key = (name, arr.shape, arr.dtype.str)
    if (t := self._call.staging.get(key)) is not None:
      engine.copy_into(t.uop, np.ascontiguousarray(arr))
      return t, key
    t = to_tensor(arr, self.device, et)
    if engine.buffer_view(t.uop) is None or t.dtype != from_numpy(arr.dtype): return t, None
    self._call.staging[key] = t
    return t, key

  def _dynamic_dims(self, name: str, v: Tensor) -> tuple[Any, ...] | None:
    """Input `name`'s shape with its dynamic dims named in `max_dims` (a `dim_param`, or `"input.i"` for a dim the
    model leaves unknown) as bound Variables ranging over [1, max_dims[name]]; None when one is out of its range (that
    call runs a capture of its own sizes)."""
    tt = self.inputs[name].type.tensor_type
    if not tt.HasField("shape"): return tuple(v.shape)
    out: list[Any] = []
    for i, (d, g) in enumerate(zip(tt.shape.dim, v.shape)):
      dim = None if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else f"{name}.{i}"
      if dim is None or dim not in self.max_dims:
        out.append(g)
        continue
      hi = self.max_dims[dim]
      if not isinstance(g, int) or not 1 <= g <= hi:
        if DEBUG >= 1: print(f"OnnxRunner: input {name!r} dim {dim!r} size {g} is outside [1, {hi}] (max_dims): "
                             "this size gets a capture of its own")
        return None
      out.append(Variable(dim, 1, hi).bind(g))
    return tuple(out)

  def _symbolic_feed(self, feed: dict[str, Any]) -> dict[str, Any] | None:
    """The inputs with their dims named in `max_dims` as bound Variables (a view of each one's realized buffer), or
    None when none has one or one is out of range (see _dynamic_dims)."""
    out, any_dyn = dict(feed), False
    for k, v in feed.items():
      if v is None: continue
      if (shape := self._dynamic_dims(k, v)) is None: return None
      if all(isinstance(d, int) for d in shape): continue
      view = engine.buffer_view(v.uop)
      if view is None: view = engine.buffer_view(v.contiguous().realize().uop)
      if view is None: return None  # not one buffer (a multi-device Tensor): a capture of its own sizes
      out[k], any_dyn = Tensor(view[0].reshape(shape)), True
    return out if any_dyn else None

  def _call_jit(self, feed: dict[str, Any], sig: tuple | None = None) -> dict[str, Any]:
    """Run the graph through the runner's TinyJit (call 1 eager, call 2 captures, then replays); the runtime index
    checks come back as one more output, read after the call, outside the capture. With dynamic dims the inputs are
    bound Variables' views (one capture for every size) unless the model can't run symbolically. `sig`: the staging
    keys when every input is staged (the same Tensors as the last call of that signature): what is derived from the
    inputs' shapes is then taken from the last such call."""
    if sig is not None and (memo := self._call.prepared.get(sig)) is not None: is_sym, run_feed, key, vv = memo
    else:
      bad = {k: type(v).__name__ for k, v in feed.items() if v is not None and not isinstance(v, Tensor)}
      if bad:
        raise TypeError(f"OnnxRunner(jit=True) runs models whose inputs are tensors; inputs {bad} are not (strings "
                        "and sequences run on the host): build the runner with jit=False")
      sym = self._symbolic_feed(feed) if self.symbolic else None
      is_sym, run_feed = sym is not None, sym if sym is not None else feed
      key = tuple((k, None) if v is None else (k, _unbound(v.shape), v.dtype) for k, v in run_feed.items())
      vv = _var_vals(run_feed) if is_sym else {}
      if sig is not None: self._call.prepared[sig] = (is_sym, run_feed, key, vv)
    if (fn := self.jits.get(key)) is None:
      fn = self.jits[key] = TinyJit(self._jit_body)
    ran_python = fn.cnt < 2  # calls 1 (eager) and 2 (capture) run _jit_body; replays don't
    self._call.symbolic, self._call.symbolic_refused = is_sym, None
    try: outs = fn(*[run_feed[k] for k in self.inputs])
    except JitError as e:  # a capture that can't replay faithfully: say which node, and what to do
      node, self._call.node = self._call.node, None
      where = f"node {node.name!r} ({node.op_type}) needs device data on the host" if node is not None else "it"
      raise OnnxError(f"OnnxRunner(jit=True) can't capture this model: {where}: {e}. Build the runner with "
                      "jit=False to run it eagerly") from e
    finally: self._call.symbolic = False
    if (why := self._call.symbolic_refused) is not None:  # (call 1 ran eagerly up to that node: nothing captured)
      self._call.symbolic_refused, self.symbolic = None, False
      del self.jits[key]
      self._call.prepared.clear()  # (this thread's; a stale entry of another thread comes this way once)
      if DEBUG >= 1: print(f"OnnxRunner: {why}: falling back to one jit capture per input size")
      return self._call_jit(feed, sig)
    if ran_python: self._jit_checks[key] = self._call.jit_checks
    elif sig is not None and not is_sym:  # a replay of staged inputs: later ones of this signature take _fast_call
      staged = [run_feed[k] for k in self.inputs]
      bvs = [engine.buffer_view(t.uop) for t in staged]
      if all(bv is not None for bv in bvs):
        self._call.fast = (sig, staged, [engine.get_buffer(bv[0]) for bv in bvs if bv is not None], key,
                           self._jit_checks[key])
    if checks := self._jit_checks[key]:
      stats, outs = outs[-1], outs[:-1]
      _raise_bad_indices(checks, stats.numpy())  # the jit's realized output: a plain copy, no kernel
    if is_sym:
      at = tuple(vv.items())
      views = self._call.views
      outs = tuple(o if not isinstance(o, Tensor) else v if (v := views.get((o.uop, at))) is not None
                   else self._concrete(o, vv, at) for o in outs)
    return dict(zip(self.outputs, outs))

  def _concrete(self, out: Tensor, var_vals: dict[str, int], at: tuple) -> Tensor:
    """Jit output `out` as a Tensor of this call's sizes (the Variables' values `var_vals`, as the tuple `at`): when
    its shape is symbolic, a view of the first elements of its buffer (which is allocated for the Variables' largest
    values; contiguous, so this call's elements come first). Kept in `views` by (output, `at`): a view reads the
    buffer as it is, so it serves every later replay of those sizes."""
    if all(isinstance(d, int) for d in out.shape): return out
    shape = tuple(d if isinstance(d, int) else int(_unbound((d,))[0].sym_infer(var_vals)) for d in out.shape)
    view = engine.buffer_view(out.uop)
    if view is None: raise OnnxError(f"a jit output of symbolic shape {_shape_text(out.shape)} is not a buffer")
    n = int(np.prod(shape, dtype=np.int64))
    base = engine.get_buffer(view[0])
    u = engine.register_buffer(UOp.new_buffer(base.device, n, out.dtype), base.view(n, out.dtype, 0))
    if len(self._call.views) >= 1024: self._call.views.clear()  # (outputs of captures that are gone)
    t = self._call.views[(out.uop, at)] = Tensor(u.reshape(shape))
    return t

  def _jit_body(self, *args: Any) -> tuple:
    """The function the runner's TinyJit captures: the graph on `args` (the inputs in declaration order); its
    outputs, and a (checks, 4) Tensor of the runtime index checks' statistics when there are any."""
    self._call.host, self._call.foldable, self._call.deferred = dict(self._const_host), set(self._const_host), []
    prev, _ACTIVE.host, self._call.own_jit = _ACTIVE.host, self._call.host, True
    try: outs = self._run_graph(self.model.graph, dict(zip(self.inputs, args)), outer=dict(self._consts))
    finally: _ACTIVE.host, self._call.own_jit = prev, False
    self._call.node = None  # the graph ran: a JitError from here on is about the capture as a whole
    if self._call.symbolic and self._call.symbolic_refused is None:
      from tiny_tensor.nn.onnx import host
      made = [o for o in outs if isinstance(o, Tensor) and host.is_symbolic(self._host_of(o))]
      if made: self._call.symbolic_refused = "a graph output is a symbolic shape value"
    if self._call.symbolic_refused is not None:
      self._call.deferred = []
      return ()
    checks, self._call.deferred = self._call.deferred, []
    self._call.jit_checks = [(node, what, negative) for node, what, negative, _ in checks]
    if not checks: return tuple(outs)
    return (*outs, Tensor.stack(*[c[3] for c in checks]))

  def _defer_index_check(self, node: Any, idx: Tensor, size: Any, what: str, negative: bool) -> None:
    """Queue a check of runtime indices `idx` against [-size, size-1], run after the graph (see the class doc)."""
    if not self.runtime_index_checks: return
    from tiny_tensor.jit import _capturing
    if _capturing.jits and not self._call.own_jit:
      raise OnnxError(f"node {node.name!r} ({node.op_type}) takes runtime indices, whose range check reads them on "
                      "the host, which a TinyJit capture refuses: build the runner with "
                      "OnnxRunner(..., runtime_index_checks=False) to capture it (runtime indices are then unchecked)")
    i = idx.cast(dtypes.int64)
    n = Tensor(size, device=idx.device).cast(dtypes.int64)  # (a symbolic size: this call's value)
    bad = (i < (-n if negative else 0)) | (i >= n)
    stats = Tensor.stack(bad.cast(dtypes.int64).sum(), bad.where(i, 0).min(), bad.where(i, 0).max(),
                         bad.where(n, 0).max())
    self._call.deferred.append((node, what, negative, stats))

  def _run_deferred_checks(self, outs: Sequence[Any] = ()) -> None:
    """Read all queued runtime index checks at once; raise OnnxError for the first node that had a bad index. The
    checks are realized with the graph's Tensor outputs `outs` in one schedule: they read the graph's own index
    values, so realizing them alone first would compute those nodes once for the checks and substitute their
    buffers into the outputs' graphs (an eager tiny BERT: ~10% of its call). A bad index reads 0 (see the class
    doc), so computing the outputs before the error is raised is safe."""
    if not self._call.deferred: return
    stats = Tensor.stack(*[c[3] for c in self._call.deferred])
    # (the per-check tensors are dropped first: lazy graphs sharing the stack's nodes, which realize would expose)
    checks, self._call.deferred = [c[:3] for c in self._call.deferred], []
    Tensor.realize(stats, *[o for o in outs if isinstance(o, Tensor)])
    _raise_bad_indices(checks, stats.numpy())

  def _run_graph(self, graph: Any, feed: dict[str, Any], outer: dict[str, Any], debug: bool = False) -> list[Any]:
    scope = dict(outer)
    # the main graph's initializers are the runner's (`_consts`, in `outer`): made once, not again in every call
    if graph is not self.model.graph:
      for t in graph.initializer: scope[t.name] = self._init_value(t)
    scope.update(feed)
    for node in graph.node:
      self._run_node(node, scope, debug)
      if self._call.symbolic_refused is not None: return [None] * len(graph.output)  # see _call_jit
    return [scope[o.name] for o in graph.output]

  def _host_of(self, v: Any) -> Any:
    """The host value the running call knows for Tensor `v`, or None."""
    hit = self._call.host.get(id(v)) if isinstance(v, Tensor) else None
    return hit[1] if hit is not None and hit[0] is v else None

  def _refuses_symbolic(self, node: Any, args: list[Any]) -> str | None:
    """Why device operator `node` can't run on these arguments symbolically (a symbolic-shaped Tensor for an
    operator outside SYMBOLIC_OPS, a symbolic shape value where it would be read as data), or None."""
    from tiny_tensor.nn.onnx import host
    where = f"node {node.name!r} ({node.op_type})"
    if node.op_type in _SUBGRAPH_OPS: return f"{where} runs a subgraph, which symbolic sizes don't enter"
    for i, a in enumerate(args):
      if not isinstance(a, Tensor): continue
      if host.is_symbolic(self._host_of(a)) and i not in SHAPE_INPUTS.get(node.op_type, ()):
        return f"{where} reads the symbolic shape value {node.input[i]!r} as data"
      if any(not isinstance(d, int) for d in a.shape) and not self._symbolic_op(node, args[0]):
        return f"{where} can't take input {node.input[i]!r} of symbolic shape {_shape_text(a.shape)}"
    return self._symbolic_plan_refusal(node, args, where)

  def _symbolic_plan_refusal(self, node: Any, args: list[Any], where: str) -> str | None:
    """Why the symbolic Reshape/Expand/Range/Slice `node` can't be planned (ops.py's sym_*_plan/expand_plan: a size
    not the same for every value, bounds not kept inside a dim, ...), or None."""
    from tiny_tensor.nn.onnx import host
    from tiny_tensor.nn.onnx.ops import _ints, _sints, expand_plan, sym_range_plan, sym_reshape_plan, sym_slice_plan
    op, x = node.op_type, (args[0] if args else None)
    sym = isinstance(x, Tensor) and any(isinstance(d, UOp) for d in x.shape)
    why: Any = None
    if op == "Reshape" and self.opset >= 5 and isinstance(x, Tensor):
      shp = _sints(args[1])
      if sym or any(isinstance(v, UOp) for v in shp):
        why = sym_reshape_plan(x.shape, shp, next((a.i for a in node.attribute if a.name == "allowzero"), 0))
    elif op == "Expand" and isinstance(x, Tensor):
      shp = _sints(args[1])
      if sym or any(isinstance(v, UOp) for v in shp): why = expand_plan(x.shape, shp)
    elif op == "Range" and host.is_symbolic(self._host_of(args[1])):
      if any(self._host_of(a) is None for a in args): return f"{where}: its start or delta is not known on the host"
      why = sym_range_plan(*[_sints(a)[0] for a in args])
    elif op == "Slice" and self.opset >= 10 and isinstance(x, Tensor):
      starts, ends = _sints(args[1]), _sints(args[2])
      if sym or any(isinstance(v, UOp) for v in (*starts, *ends)):
        axes, steps = (_ints(args[j]) if len(args) > j else [] for j in (3, 4))
        why = sym_slice_plan(x.shape, starts, ends, axes, steps)
    return f"{where}: {why}" if isinstance(why, str) else None

  @staticmethod
  def _symbolic_op(node: Any, x: Any) -> bool:
    """Whether `node`'s operator runs on inputs of symbolic shape, its first input `x` (see SYMBOLIC_OPS,
    _STATIC_AXIS)."""
    if node.op_type not in SYMBOLIC_OPS: return False
    if node.op_type not in _STATIC_AXIS: return True
    ax = next((a.i for a in node.attribute if a.name == "axis"), _STATIC_AXIS[node.op_type])
    return ax is not None and isinstance(x, Tensor) and -x.ndim <= ax < x.ndim and isinstance(x.shape[ax], int)

  def _run_node(self, node: Any, scope: dict[str, Any], debug: bool) -> None:
    self._call.node = node
    try: args = [scope[i] if i else None for i in node.input]
    except KeyError as e:
      raise OnnxError(f"node {node.name!r} ({node.op_type}) reads {e}, which nothing made") from None
    attrs = {a.name: _attr(a, self._onnx, self.base_dir) for a in node.attribute}
    ctx = _Ctx(self, node, scope)
    outs: Any  # a Tensor, a tuple of them, a list (a sequence) or a numpy array (strings)
    if (node.domain, node.op_type) in self.functions: outs = self._run_function(node, args, attrs, ctx)
    else:
      host = self._host_inputs(node, args, attrs)
      if self._call.symbolic and host is None and (why := self._refuses_symbolic(node, args)) is not None:
        self._call.symbolic_refused = why
        return
      low = _low_precision(node.op_type, args) if host is None else None
      if low is not None:
        args = [a.cast(dtypes.float32) if isinstance(a, Tensor) and a.dtype == low else a for a in args]
      try:
        if host is not None: outs = self._run_on_host(ctx, args, host, attrs)
        else: outs = self._ops[node.op_type](ctx, args, attrs)
        if low is not None: outs = _back_to(outs, low)
      except OnnxError: raise
      except (NotImplementedError, ValueError, TypeError, IndexError, RuntimeError, KeyError) as e:
        shapes = [getattr(a, "shape", type(a).__name__) for a in args]
        raise OnnxError(f"node {node.name!r} ({node.op_type}, opset {self.opset}) with inputs {shapes} and "
                        f"attributes {sorted(attrs)} failed: {type(e).__name__}: {e}") from e
    if not isinstance(outs, tuple): outs = (outs,)
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"): self._remember(outs[0], _constant_value(attrs))
    for name, v in zip(node.output, outs):
      if name: scope[name] = v
    if debug: print(f"{node.op_type:24s} {node.name:30s} -> " + ", ".join(str(getattr(o, 'shape', o)) for o in outs))

  def _host_inputs(self, node: Any, args: list[Any], attrs: dict[str, Any]) -> list[Any] | None:
    """The node's inputs as numpy values when it is evaluated on the host (see host.py: a Shape/Size, or shape
    arithmetic on constants known on the host), else None."""
    from tiny_tensor.nn.onnx.host import FROM_SHAPE, HOST_OPS, host_can_run
    if node.domain not in ("", "ai.onnx") or node.op_type not in HOST_OPS: return None
    if node.op_type in FROM_SHAPE: return [] if isinstance(args[0], Tensor) else None
    vals: list[np.ndarray | None] = []
    for a in args:
      if a is None:
        vals.append(None)
        continue
      hit = self._call.host.get(id(a)) if isinstance(a, Tensor) else None
      if hit is None or hit[0] is not a or id(a) not in self._call.foldable: return None
      vals.append(hit[1])
    return vals if vals and host_can_run(node.op_type, vals, attrs) else None

  def _run_on_host(self, ctx: _Ctx, args: list[Any], vals: list[Any], attrs: dict[str, Any]) -> Tensor | None:
    """Evaluate the node with numpy (host.py); its output is a Tensor whose value the runner remembers (None, with
    the call's `symbolic_refused` set, for symbolic values the operator can't carry)."""
    from tiny_tensor.nn.onnx.host import FROM_SHAPE, HOST_OPS, is_symbolic, sym_array
    op_type = ctx.node.op_type
    fn = HOST_OPS[op_type]
    out = fn(ctx, vals, attrs, tuple(args[0].shape)) if op_type in FROM_SHAPE else fn(ctx, vals, attrs)
    if out is None:  # symbolic values the operator can't carry (see host.py)
      self._call.symbolic_refused = f"node {ctx.node.name!r} ({op_type}) can't compute with symbolic shape values"
      return None
    arr = np.asarray(out)
    if is_symbolic(arr):
      arr = sym_array(arr.reshape(-1).tolist(), arr.shape)  # all ints again (a static dim picked): a plain array
    if not is_symbolic(arr): return self._remember(to_tensor(arr, self.device), arr)
    # a placeholder Tensor holding this call's sizes: never read as data (see _refuses_symbolic)
    concrete = np.array([_bound_value(x) for x in arr.reshape(-1).tolist()], np.int64).reshape(arr.shape)
    t = to_tensor(concrete, self.device)
    self._call.host[id(t)] = (t, arr)
    self._call.foldable.add(id(t))
    return t

  def _run_function(self, node: Any, args: list[Any], attrs: dict[str, Any], ctx: _Ctx) -> tuple:
    """A model-local function: its body with the formal inputs bound and attribute references resolved."""
    f = self.functions[(node.domain, node.op_type)]
    inner = {formal: a for formal, a in zip(f.input, args)}
    for a in f.attribute_proto:
      if a.name not in attrs: attrs[a.name] = _attr(a, self._onnx, self.base_dir)
    body = self._onnx.helper.make_graph([self._bind_attrs(n, attrs) for n in f.node], f.name, [], [])
    scope = dict(ctx.scope)
    scope.update(inner)
    for n in body.node: self._run_node(n, scope, False)
    return tuple(scope[o] for o in f.output)

  def _bind_attrs(self, n: Any, attrs: dict[str, Any]) -> Any:
    n2 = self._onnx.NodeProto()
    n2.CopyFrom(n)
    keep = []
    for a in n2.attribute:
      if a.ref_attr_name:
        if a.ref_attr_name not in attrs: continue
        keep.append(self._onnx.helper.make_attribute(a.name, attrs[a.ref_attr_name]))
      else: keep.append(a)
    del n2.attribute[:]
    n2.attribute.extend(keep)
    return n2


def _shape_text(shape: tuple) -> str:
  return "(" + ", ".join(str(d) if isinstance(d, int) else d.render() for d in shape) + ")"


def _bound_value(x: Any) -> int:
  """An int, or a bound symbolic expression's value in this call."""
  if not isinstance(x, UOp): return int(x)
  return int(x.sym_infer({b.src[0].arg[0]: b.src[1].arg for b in x.toposort() if b.op is Ops.BIND}))


def _unbound(shape: tuple) -> tuple:
  """A shape with its bound Variables' names in place of their values (the jit key of a symbolic signature)."""
  return tuple(d if isinstance(d, int) else d.substitute({b: b.src[0] for b in d.toposort() if b.op is Ops.BIND})
               for d in shape)


def _var_vals(feed: dict[str, Any]) -> dict[str, int]:
  """The values of the Variables bound in the inputs' shapes, by name."""
  out: dict[str, int] = {}
  for v in feed.values():
    for d in getattr(v, "shape", ()):
      if isinstance(d, UOp):
        for b in d.toposort():
          if b.op is Ops.BIND: out[b.src[0].arg[0]] = b.src[1].arg
  return out


