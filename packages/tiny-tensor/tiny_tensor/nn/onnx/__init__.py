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
shape, Slice's starts, ...) are read back to the host: an ONNX graph mixes data and shapes, a tiny kernel does not.

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

import os
from typing import Any

import numpy as np

from tiny_uop.dtype import DType, dtypes
from tiny_tensor.tensor import Tensor

__all__ = ["OnnxRunner", "OnnxError", "onnx_dtype", "to_tensor"]


class OnnxError(RuntimeError):
  """An ONNX model tiny can't run: an unsupported operator or attribute, or a node that failed (the message names
  the node, its operator and inputs)."""


def _onnx() -> Any:
  try:
    import onnx
  except ImportError as e:
    raise ImportError("tiny_tensor.nn.onnx needs the onnx package: pip install 'tiny-tensor[onnx]'") from e
  return onnx


# TensorProto.DataType -> tiny dtype (types tiny lacks map to the dtype that holds their values; see the module doc)
_DTYPES: dict[int, DType] = {
  1: dtypes.float32, 2: dtypes.uint8, 3: dtypes.int8, 4: dtypes.uint16, 5: dtypes.int16, 6: dtypes.int32,
  7: dtypes.int64, 9: dtypes.bool, 10: dtypes.float16, 11: dtypes.float64, 12: dtypes.uint32, 13: dtypes.uint64,
  16: dtypes.bfloat16, 17: dtypes.float32, 18: dtypes.float32, 19: dtypes.float32, 20: dtypes.float32,
  21: dtypes.uint8, 22: dtypes.int8, 23: dtypes.float32, 24: dtypes.float32, 25: dtypes.uint8, 26: dtypes.int8,
}
STRING = 8


def onnx_dtype(elem_type: int) -> DType:
  """The tiny dtype that holds values of ONNX element type `elem_type` (a TensorProto.DataType number)."""
  if elem_type not in _DTYPES:
    raise OnnxError(f"ONNX element type {elem_type} has no tiny dtype; supported: {sorted(_DTYPES)}")
  return _DTYPES[elem_type]


def to_tensor(x: Any, device: str | None = None, elem_type: int | None = None) -> Any:
  """A Tensor from a numpy array (or scalar); string arrays stay numpy object arrays; lists (sequences) and None
  pass through."""
  if x is None or isinstance(x, Tensor): return x
  if isinstance(x, list): return [to_tensor(v, device, elem_type) for v in x]
  arr = np.asarray(x)
  if arr.dtype.kind in "OUS": return arr.astype(object)
  if elem_type is not None and elem_type in _DTYPES and elem_type != 16:
    return Tensor(arr.astype(np.float32) if arr.dtype.kind == "V" or arr.dtype.itemsize < 1 else arr,
                  device=device, dtype=_DTYPES[elem_type])
  if arr.dtype.name == "bfloat16": return Tensor(arr.view(np.uint16), device=device).bitcast(dtypes.bfloat16)
  if arr.dtype.kind == "V" or arr.dtype.name.startswith(("float8", "float4", "int4", "uint4")):
    kind = dtypes.int8 if arr.dtype.name == "int4" else dtypes.uint8 if arr.dtype.name == "uint4" else dtypes.float32
    return Tensor(arr.astype(np.float32), device=device).cast(kind)
  return Tensor(arr, device=device)


def _attr(a: Any, onnx: Any) -> Any:
  """An AttributeProto as a Python value (tensors as numpy arrays, graphs as GraphProto)."""
  A = onnx.AttributeProto
  if a.type == A.FLOAT: return a.f
  if a.type == A.INT: return a.i
  if a.type == A.STRING: return a.s.decode("utf-8", errors="replace")
  if a.type == A.TENSOR: return _tensor_value(a.t, onnx)
  if a.type == A.GRAPH: return a.g
  if a.type == A.FLOATS: return list(a.floats)
  if a.type == A.INTS: return list(a.ints)
  if a.type == A.STRINGS: return [s.decode("utf-8", errors="replace") for s in a.strings]
  if a.type == A.SPARSE_TENSOR: return a.sparse_tensor
  if a.type == A.TENSORS: return [_tensor_value(t, onnx) for t in a.tensors]
  if a.type == A.GRAPHS: return list(a.graphs)
  raise OnnxError(f"attribute {a.name!r} has unsupported type {a.type}")


def _tensor_value(t: Any, onnx: Any) -> Any:
  """(numpy array, ONNX elem_type) of a TensorProto."""
  from onnx import numpy_helper
  return (numpy_helper.to_array(t), t.data_type)


_KEEP_DTYPE = {"Cast", "CastLike", "DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "Shape", "Size"}


def _low_precision(op_type: str, args: list[Any]) -> DType | None:
  """The dtype whose inputs `op_type` computes in float32 (see the module doc), or None."""
  if op_type in _KEEP_DTYPE: return None
  dts = {a.dtype for a in args if isinstance(a, Tensor)}
  if dtypes.bfloat16 in dts: return dtypes.bfloat16
  if op_type == "Attention" and dtypes.float16 in dts: return dtypes.float16
  return None


def _back_to(outs: Any, dt: DType) -> Any:
  if isinstance(outs, tuple): return tuple(_back_to(o, dt) for o in outs)
  if not (isinstance(outs, Tensor) and outs.dtype == dtypes.float32): return outs
  if dt != dtypes.bfloat16: return outs.cast(dt)
  # float32 -> bfloat16 rounding to nearest even with integer ops: the CPU backend's vectorized fptrunc to bfloat16
  # renders invalid LLVM IR (reported)
  bits = outs.bitcast(dtypes.uint32)
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).cast(dtypes.uint16).bitcast(dtypes.bfloat16)


class _Ctx:
  """What an operator function sees besides its inputs and attributes."""

  def __init__(self, runner: OnnxRunner, node: Any, scope: dict[str, Any]):
    self.runner, self.node, self.scope = runner, node, scope

  @property
  def opset(self) -> int: return self.runner.opset
  @property
  def device(self) -> str | None: return self.runner.device

  def run_graph(self, graph: Any, inputs: list[Any]) -> list[Any]:
    """Run a subgraph with `inputs` bound to its formal inputs, the current scope visible; its outputs in order."""
    return self.runner._run_graph(graph, dict(zip([i.name for i in graph.input], inputs)), outer=self.scope)


class OnnxRunner:
  """An ONNX model ready to run: `OnnxRunner(path_or_model_or_bytes, device=None)`; call it with
  `{input name: Tensor | numpy array}` to get `{output name: Tensor}` (lists for sequence outputs).

  `opset` is the model's default-domain opset version; operators follow that version's semantics where versions
  differ. Unsupported operators raise OnnxError naming them (all of a model's are listed before anything runs).
  """

  def __init__(self, model: Any, device: str | None = None):
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)): model = onnx.load(os.fspath(model))
    elif isinstance(model, (bytes, bytearray)): model = onnx.load_from_string(bytes(model))
    if not isinstance(model, onnx.ModelProto):
      raise TypeError(f"OnnxRunner needs a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    self.model, self.device, self._onnx = model, device, onnx
    self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    self.functions = {(f.domain, f.name): f for f in model.functions}
    from tiny_tensor.nn.onnx.ops import OPS
    self._ops = OPS
    missing = sorted({n.op_type for n in self._all_nodes(model.graph)
                      if n.op_type not in OPS and (n.domain, n.op_type) not in self.functions})
    if missing: raise OnnxError(f"unsupported ONNX operators: {missing} (opset {self.opset})")
    self._consts = {t.name: self._init_value(t) for t in model.graph.initializer}
    self.inputs = {i.name: i for i in model.graph.input if i.name not in self._consts}
    self.outputs = [o.name for o in model.graph.output]

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
    arr, et = _tensor_value(t, self._onnx)
    return to_tensor(arr, self.device, et)

  def __call__(self, inputs: dict[str, Any] | None = None, debug: bool = False) -> dict[str, Any]:
    inputs = dict(inputs or {})
    unknown = [k for k in inputs if k not in self.inputs]
    if unknown: raise KeyError(f"unknown ONNX input(s) {unknown}; the model's inputs: {list(self.inputs)}")
    feed: dict[str, Any] = {}
    for name, info in self.inputs.items():
      if name not in inputs:
        raise KeyError(f"ONNX input {name!r} is missing; the model's inputs: {list(self.inputs)}")
      et = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else None
      feed[name] = to_tensor(inputs[name], self.device, et)
    outs = self._run_graph(self.model.graph, feed, outer=dict(self._consts), debug=debug)
    return dict(zip(self.outputs, outs))

  def _run_graph(self, graph: Any, feed: dict[str, Any], outer: dict[str, Any], debug: bool = False) -> list[Any]:
    scope = dict(outer)
    for t in graph.initializer: scope[t.name] = self._init_value(t)
    scope.update(feed)
    for node in graph.node:
      self._run_node(node, scope, debug)
    return [scope[o.name] for o in graph.output]

  def _run_node(self, node: Any, scope: dict[str, Any], debug: bool) -> None:
    try: args = [scope[i] if i else None for i in node.input]
    except KeyError as e:
      raise OnnxError(f"node {node.name!r} ({node.op_type}) reads {e}, which nothing made") from None
    attrs = {a.name: _attr(a, self._onnx) for a in node.attribute}
    ctx = _Ctx(self, node, scope)
    if (node.domain, node.op_type) in self.functions: outs = self._run_function(node, args, attrs, ctx)
    else:
      low = _low_precision(node.op_type, args)
      if low is not None:
        args = [a.cast(dtypes.float32) if isinstance(a, Tensor) and a.dtype == low else a for a in args]
      try:
        outs = self._ops[node.op_type](ctx, args, attrs)
        if low is not None: outs = _back_to(outs, low)
      except OnnxError: raise
      except (NotImplementedError, ValueError, TypeError, IndexError, RuntimeError, KeyError) as e:
        shapes = [getattr(a, "shape", type(a).__name__) for a in args]
        raise OnnxError(f"node {node.name!r} ({node.op_type}, opset {self.opset}) with inputs {shapes} and "
                        f"attributes {sorted(attrs)} failed: {type(e).__name__}: {e}") from e
    if not isinstance(outs, tuple): outs = (outs,)
    for name, v in zip(node.output, outs):
      if name: scope[name] = v
    if debug: print(f"{node.op_type:24s} {node.name:30s} -> " + ", ".join(str(getattr(o, 'shape', o)) for o in outs))

  def _run_function(self, node: Any, args: list[Any], attrs: dict[str, Any], ctx: _Ctx) -> tuple:
    """A model-local function: its body with the formal inputs bound and attribute references resolved."""
    f = self.functions[(node.domain, node.op_type)]
    inner = {formal: a for formal, a in zip(f.input, args)}
    for a in f.attribute_proto:
      if a.name not in attrs: attrs[a.name] = _attr(a, self._onnx)
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
