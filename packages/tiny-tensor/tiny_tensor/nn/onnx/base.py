"""What the ONNX runner (`__init__`), its operators (`ops*.py`) and its host arithmetic (`host.py`) share: the errors,
ONNX element types and tiny's dtypes for them, `to_tensor`, the host values of the running call (`known_value`).
It imports none of them (they imported the runner's module for these, and it imports them: issue #33)."""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from tiny_uop.dtype import DType, dtypes
from tiny_tensor.tensor import Tensor


class OnnxError(RuntimeError):
  """An ONNX model tiny can't run: an unsupported operator or attribute, or a node that failed (the message names
  the node, its operator and inputs)."""


class OnnxModelError(OnnxError, ValueError):
  """An ONNX model that is malformed or asks for too much: external data outside its folder, a graph output nothing
  makes, a recursive function, a Range with delta 0, a Loop past `max_loop_trips` (the message names the culprit)."""


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


def _back_to(outs: Any, dt: DType) -> Any:
  if isinstance(outs, tuple): return tuple(_back_to(o, dt) for o in outs)
  if not (isinstance(outs, Tensor) and outs.dtype == dtypes.float32): return outs
  if dt != dtypes.bfloat16: return outs.cast(dt)
  # float32 -> bfloat16 rounding to nearest even with integer ops: the CPU backend's vectorized fptrunc to bfloat16
  # renders invalid LLVM IR (reported)
  bits = outs.bitcast(dtypes.uint32)
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).cast(dtypes.uint16).bitcast(dtypes.bfloat16)


def _range_count(node: Any, start: Any, limit: Any, delta: Any) -> int:
  """The element count of ONNX Range(start, limit, delta), max(ceil((limit - start) / delta), 0); a delta of 0 or a
  start/limit/delta that is infinite or NaN raises OnnxModelError naming the node."""
  s, l, d = float(start), float(limit), float(delta)
  if d == 0 or not all(math.isfinite(v) for v in (s, l, d)):
    raise OnnxModelError(f"node {node.name!r} (Range): start {start}, limit {limit}, delta {delta} give no finite "
                         "range; delta must be nonzero and all three finite")
  return max(int(math.ceil((l - s) / d)), 0)


class _Active(threading.local):
  """The host values of the OnnxRunner call running in this thread (None outside a call): `known_value` reads them."""
  host: dict[int, tuple[Tensor, np.ndarray]] | None = None


_ACTIVE = _Active()
def known_value(x: Any) -> np.ndarray | None:
  """The numpy value of Tensor `x` when the running OnnxRunner call knows it on the host (an initializer, a Constant,
  a numpy-fed input outside jit, a shape value), else None. Operators read shape data through this (`ops._np`), so a
  shape computed on the host never needs a device read."""
  if not isinstance(x, Tensor) or _ACTIVE.host is None: return None
  hit = _ACTIVE.host.get(id(x))
  return hit[1] if hit is not None and hit[0] is x else None
