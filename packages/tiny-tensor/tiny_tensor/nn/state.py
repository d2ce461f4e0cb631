"""Model state: find a model's tensors, load/save them (safetensors, PyTorch .pth, GGUF).

>>> from tiny_tensor import nn
>>> model = nn.Linear(3, 2)
>>> sorted(nn.state.get_state_dict(model))
['bias', 'weight']

- `get_state_dict(obj)`: {dotted name: Tensor} found through attributes, lists, tuples and dicts (as in tinygrad).
- `get_parameters(obj)`: those tensors, each once.
- `load_state_dict(model, state_dict, strict=True)`: copies in, checking names and shapes (one error lists them all).
- `safe_save` / `safe_load`: the safetensors format; `safe_load` maps the file through the DISK device (each tensor is
  a zero-copy view of the file until it is copied to a compute device), falling back to reading it into memory.
- `torch_load`: PyTorch's zip checkpoint (`torch.save`) read with our own unpickler (no torch needed).
- `gguf_load`: GGUF v2/v3 metadata and tensors, dequantizing F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.
"""
from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import struct
import zipfile
from collections import OrderedDict
from typing import Any

import numpy as np

from tiny_uop.device import Buffer
from tiny_uop.dtype import DType, dtypes, to_numpy
from tiny_uop.uop import UOp

from tiny_tensor import engine
from tiny_tensor.tensor import Tensor

__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_load", "safe_save", "safe_load_metadata",
           "torch_load", "gguf_load"]


# ***** walking models *****
def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
  """Every Tensor reachable from `obj` through attributes (`__dict__`), lists/tuples (by index) and dicts (by key),
  named by its dotted path: `{"layers.0.weight": ...}`.

  >>> from tiny_tensor import nn
  >>> class Net:
  ...   def __init__(self): self.layers = [nn.Linear(2, 2), nn.Linear(2, 1, bias=False)]
  >>> sorted(get_state_dict(Net()))
  ['layers.0.bias', 'layers.0.weight', 'layers.1.weight']
  """
  out: dict[str, Tensor] = {}
  seen: set[int] = set()

  def walk(x: Any, pre: str) -> None:
    if isinstance(x, tensor_type):
      out[pre.strip(".")] = x
      return
    if id(x) in seen or isinstance(x, (str, bytes, int, float, bool, type(None), np.ndarray, type)): return
    seen.add(id(x))
    if hasattr(x, "_asdict"): x = x._asdict()  # namedtuple
    if isinstance(x, dict):
      for k, v in x.items(): walk(v, f"{pre}{k}.")
    elif isinstance(x, (list, tuple)):
      for i, v in enumerate(x): walk(v, f"{pre}{i}.")
    elif hasattr(x, "__dict__"): walk(vars(x), pre)
  walk(obj, prefix)
  return out


def get_parameters(obj: Any) -> list[Tensor]:
  """The Tensors of `get_state_dict(obj)`, each once (a tensor shared by two layers appears once)."""
  seen: set[int] = set()
  return [t for t in get_state_dict(obj).values() if not (id(t) in seen or seen.add(id(t)))]  # type: ignore[func-returns-value]


def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True, verbose: bool = False,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:
  """Copy `state_dict`'s tensors into the model's (`get_state_dict(model)`), casting to the model's dtypes.

  `strict`: every model tensor must be in `state_dict` and every `state_dict` entry must belong to the model. Shapes
  must always match. One `KeyError`/`ValueError` names every missing, unexpected or mis-shaped key. `consume` removes
  loaded entries from `state_dict`; `realize` copies now. Returns the model tensors that were loaded.
  """
  model_sd = get_state_dict(model)
  missing = [k for k in model_sd if k not in state_dict]
  unexpected = [k for k in state_dict if k not in model_sd]
  shapes = [f"{k}: model {tuple(v.shape)}, state_dict {tuple(state_dict[k].shape)}" for k, v in model_sd.items()
            if k in state_dict and tuple(v.shape) != tuple(state_dict[k].shape)]
  if shapes: raise ValueError(f"load_state_dict: shape mismatch for {len(shapes)} key(s): " + "; ".join(shapes))
  if strict and (missing or unexpected):
    msg = []
    if missing: msg.append(f"missing keys (in the model, not in the state_dict): {missing}")
    if unexpected: msg.append(f"unexpected keys (in the state_dict, not in the model): {unexpected}")
    raise KeyError("load_state_dict(strict=True): " + "; ".join(msg) + " (pass strict=False to skip them)")
  if verbose and (missing or unexpected): print(f"load_state_dict: missing {missing}, unexpected {unexpected}")
  loaded: list[Tensor] = []
  for k, v in model_sd.items():
    if k not in state_dict: continue
    src = state_dict[k].to(v.device)
    if src.dtype != v.dtype: src = src.cast(v.dtype)
    # a realized model tensor is written in place (a TinyJit that captured its buffer sees the new values);
    # a lazy one (not computed yet) becomes a copy of the source
    if engine.is_realized(v.uop): v.assign(src.contiguous() if src is state_dict[k] else src)
    else: v.uop = src.contiguous().uop
    loaded.append(v)
    if consume: del state_dict[k]
  if realize and loaded: Tensor.realize(*loaded)
  return loaded


# ***** safetensors *****
_SAFE_DTYPES: dict[str, DType] = {
  "F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
  "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
  "U64": dtypes.uint64, "U32": dtypes.uint32, "U16": dtypes.uint16, "U8": dtypes.uint8, "BOOL": dtypes.bool,
  "F8_E4M3": dtypes.fp8e4m3, "F8_E5M2": dtypes.fp8e5m2,
}
_SAFE_NAMES = {v: k for k, v in _SAFE_DTYPES.items()}


def _tensor_on(buf: Buffer, shape: tuple[int, ...]) -> Tensor:
  """A Tensor whose storage is the existing `buf` (a DISK view, say): no copy."""
  u = engine.register_buffer(UOp.new_buffer(buf.device, buf.size, buf.dtype), buf)
  return Tensor(u.reshape(shape) if tuple(shape) != (buf.size,) else u)


def _from_bytes(data: bytes | memoryview, dtype: DType, shape: tuple[int, ...]) -> Tensor:
  """A CPU-side Tensor from raw little-endian bytes (bfloat16/fp8 go through their unsigned bit patterns)."""
  try: npdt = to_numpy(dtype)
  except TypeError: npdt = None
  if npdt is None:
    bits = {1: np.uint8, 2: np.uint16}[dtype.itemsize]
    return Tensor(np.frombuffer(data, dtype=bits).reshape(shape).copy()).bitcast(dtype)
  return Tensor(np.frombuffer(data, dtype=npdt).reshape(shape).copy(), dtype=dtype)


def _read_header(f: Any) -> tuple[int, dict[str, Any]]:
  raw = f.read(8)
  if len(raw) != 8: raise ValueError("not a safetensors file: shorter than its 8-byte header length")
  n = struct.unpack("<Q", raw)[0]
  try: header = json.loads(f.read(n))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"not a safetensors file: bad JSON header ({e})") from e
  return 8 + n, header


def safe_load_metadata(fn: str | os.PathLike) -> dict[str, Any]:
  """The `__metadata__` dict of a safetensors file (empty when it has none)."""
  with open(fn, "rb") as f: return _read_header(f)[1].get("__metadata__", {})


def safe_load(fn: str | os.PathLike | Tensor) -> dict[str, Tensor]:
  """Tensors of a safetensors file, by name. Read through the DISK device: each is a zero-copy view of the file until
  used (`.to("CPU")`, `load_state_dict`, math on it); falls back to reading into memory when DISK is unavailable.
  """
  if isinstance(fn, Tensor): return _safe_load_bytes(bytes(fn.numpy().tobytes()))
  path = os.fspath(fn)
  with open(path, "rb") as f: data_start, header = _read_header(f)
  entries = {k: v for k, v in header.items() if k != "__metadata__"}
  for k, v in entries.items():
    if v.get("dtype") not in _SAFE_DTYPES:
      raise ValueError(f"{path}: tensor {k!r} has unsupported dtype {v.get('dtype')!r}; valid: {sorted(_SAFE_DTYPES)}")
  try:
    base = Buffer(f"DISK:{os.path.abspath(path)}", os.path.getsize(path), dtypes.uint8).ensure_allocated()
  except Exception:  # no DISK device (or it can't map the file): read it instead
    with open(path, "rb") as f: return _safe_load_bytes(f.read())
  out: dict[str, Tensor] = {}
  for k, v in entries.items():
    dt, shape = _SAFE_DTYPES[v["dtype"]], tuple(v["shape"])
    start, end = v["data_offsets"]
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if end - start != size * dt.itemsize:
      raise ValueError(f"{path}: tensor {k!r} spans {end - start} bytes but {shape} x {dt} needs {size * dt.itemsize}")
    out[k] = _tensor_on(base.view(size, dt, data_start + start), shape)
  return out


def _safe_load_bytes(data: bytes) -> dict[str, Tensor]:
  data_start, header = _read_header(io.BytesIO(data))
  out = {}
  for k, v in header.items():
    if k == "__metadata__": continue
    if v.get("dtype") not in _SAFE_DTYPES: raise ValueError(f"tensor {k!r} has unsupported dtype {v.get('dtype')!r}")
    start, end = v["data_offsets"]
    out[k] = _from_bytes(data[data_start + start:data_start + end], _SAFE_DTYPES[v["dtype"]], tuple(v["shape"]))
  return out


def _tensor_bytes(t: Tensor) -> bytes:
  if t.dtype.scalar() in (dtypes.bfloat16, *dtypes.fp8s):
    return t.bitcast({2: dtypes.uint16, 1: dtypes.uint8}[t.dtype.itemsize]).numpy().tobytes()
  return t.numpy().tobytes()


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike, metadata: dict[str, Any] | None = None) -> None:
  """Write `tensors` to a safetensors file (header padded to 8 bytes, data in dict order)."""
  header: dict[str, Any] = {}
  if metadata: header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  blobs, offset = [], 0
  for k, t in tensors.items():
    if t.dtype not in _SAFE_NAMES:
      raise ValueError(f"safe_save: tensor {k!r} has dtype {t.dtype}, which safetensors can't store")
    b = _tensor_bytes(t)
    header[k] = {"dtype": _SAFE_NAMES[t.dtype], "shape": [int(s) for s in t.shape],
                 "data_offsets": [offset, offset + len(b)]}
    blobs.append(b)
    offset += len(b)
  hj = json.dumps(header, separators=(",", ":")).encode()
  hj += b" " * (-len(hj) % 8)
  with open(fn, "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for b in blobs: f.write(b)


# ***** PyTorch checkpoints *****
_TORCH_STORAGES: dict[str, DType] = {
  "FloatStorage": dtypes.float32, "DoubleStorage": dtypes.float64, "HalfStorage": dtypes.float16,
  "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
  "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool,
}
_TORCH_DTYPES: dict[str, DType] = {"float32": dtypes.float32, "float": dtypes.float32, "float64": dtypes.float64,
                                   "double": dtypes.float64, "float16": dtypes.float16, "half": dtypes.float16,
                                   "bfloat16": dtypes.bfloat16, "int64": dtypes.int64, "long": dtypes.int64,
                                   "int32": dtypes.int32, "int": dtypes.int32, "int16": dtypes.int16,
                                   "int8": dtypes.int8, "uint8": dtypes.uint8, "bool": dtypes.bool}


class _TorchStorage:
  __slots__ = ("dtype", "key", "data")

  def __init__(self, dtype: DType, key: str, data: bytes): self.dtype, self.key, self.data = dtype, key, data


class _Dummy:
  """Stands in for any class a checkpoint names that we don't need (hooks, metadata)."""

  def __init__(self, *args: Any, **kwargs: Any): pass
  def __setstate__(self, state: Any) -> None: pass
  def __call__(self, *args: Any, **kwargs: Any) -> None: return None


def _rebuild_tensor(storage: _TorchStorage, storage_offset: int, size: tuple, stride: tuple, *args: Any) -> Any:
  """A numpy array (by element strides) over the storage's bytes; made into Tensors at the end of torch_load."""
  dt = storage.dtype
  try: npdt = np.dtype(to_numpy(dt))
  except TypeError: npdt = np.dtype({2: np.uint16, 1: np.uint8}[dt.itemsize])  # bf16/fp8: bit patterns
  base = np.frombuffer(storage.data, dtype=npdt)
  n = int(np.prod(size, dtype=np.int64)) if size else 1
  if n == 0: return _TorchArray(np.zeros(size, dtype=npdt), dt)
  view = np.lib.stride_tricks.as_strided(base[storage_offset:], shape=tuple(size),
                                         strides=tuple(s * npdt.itemsize for s in stride))
  return _TorchArray(np.array(view, order="C"), dt)  # (ascontiguousarray would make a 0-d array 1-d)


class _TorchArray:
  __slots__ = ("arr", "dtype")

  def __init__(self, arr: np.ndarray, dtype: DType): self.arr, self.dtype = arr, dtype

  def tensor(self) -> Tensor:
    if self.arr.dtype in (np.uint16, np.uint8) and self.dtype not in (dtypes.uint16, dtypes.uint8):
      return Tensor(self.arr).bitcast(self.dtype)
    return Tensor(self.arr, dtype=self.dtype)


def _rebuild_parameter(data: Any, requires_grad: bool = False, backward_hooks: Any = None, *args: Any) -> Any:
  return data


class _TorchUnpickler(pickle.Unpickler):
  def __init__(self, f: Any, zf: zipfile.ZipFile, prefix: str):
    super().__init__(f)
    self.zf, self.prefix = zf, prefix
    self.storages: dict[str, _TorchStorage] = {}

  def find_class(self, module: str, name: str) -> Any:
    if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"): return _rebuild_tensor
    if module == "torch._utils" and name == "_rebuild_parameter": return _rebuild_parameter
    if module == "torch" and name in _TORCH_STORAGES: return _TORCH_STORAGES[name]
    if module == "torch" and name in _TORCH_DTYPES: return _TORCH_DTYPES[name]
    if module == "collections" and name == "OrderedDict": return OrderedDict
    if module in ("builtins", "__builtin__") and name in ("set", "frozenset", "dict", "list", "tuple", "int", "float"):
      return {"set": set, "frozenset": frozenset, "dict": dict, "list": list, "tuple": tuple, "int": int,
              "float": float}[name]
    return _Dummy  # anything else (hooks, torch.Size is a tuple, metadata classes) is not needed for the weights

  def persistent_load(self, pid: Any) -> Any:
    # ('storage', storage type (a DType here, or torch.UntypedStorage), key, location, numel)
    if not isinstance(pid, tuple) or pid[0] != "storage": raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
    dt, key = pid[1], str(pid[2])
    if not isinstance(dt, DType): dt = dtypes.uint8
    if key not in self.storages:
      self.storages[key] = _TorchStorage(dt, key, self.zf.read(f"{self.prefix}data/{key}"))
    return self.storages[key]


def torch_load(fn: str | os.PathLike) -> dict[str, Tensor]:
  """The tensors of a PyTorch checkpoint saved with `torch.save` (zip format), without torch.

  Nested dicts/lists of tensors are flattened to dotted names (`{"model": {"w": t}}` -> `"model.w"`); non-tensor
  values are dropped. Raises ValueError for the pre-1.6 legacy (non-zip) format.
  """
  path = os.fspath(fn)
  if not zipfile.is_zipfile(path):
    raise ValueError(f"{path}: not a zip-format PyTorch checkpoint (the pre-1.6 legacy format is not supported; "
                     "re-save it with a recent torch.save)")
  with zipfile.ZipFile(path) as zf:
    pkl = [n for n in zf.namelist() if n.endswith("data.pkl")]
    if not pkl: raise ValueError(f"{path}: a zip file without data.pkl is not a PyTorch checkpoint")
    prefix = pkl[0][:-len("data.pkl")]
    obj = _TorchUnpickler(io.BytesIO(zf.read(pkl[0])), zf, prefix).load()
  out: dict[str, Tensor] = {}

  def flat(x: Any, pre: str) -> None:
    if isinstance(x, _TorchArray): out[pre.strip(".")] = x.tensor()
    elif isinstance(x, dict):
      for k, v in x.items(): flat(v, f"{pre}{k}.")
    elif isinstance(x, (list, tuple)):
      for i, v in enumerate(x): flat(v, f"{pre}{i}.")
  flat(obj, "")
  return out


# ***** GGUF *****
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type -> (block elements, block bytes, name)
_GGML_TYPES = {0: (1, 4, "F32"), 1: (1, 2, "F16"), 30: (1, 2, "BF16"), 2: (32, 18, "Q4_0"), 3: (32, 20, "Q4_1"),
               6: (32, 22, "Q5_0"), 7: (32, 24, "Q5_1"), 8: (32, 34, "Q8_0")}


class _Reader:
  def __init__(self, data: memoryview): self.data, self.pos = data, 0

  def unpack(self, fmt: str) -> Any:
    v = struct.unpack_from(fmt, self.data, self.pos)
    self.pos += struct.calcsize(fmt)
    return v[0] if len(v) == 1 else v

  def string(self) -> str:
    n = self.unpack("<Q")
    s = bytes(self.data[self.pos:self.pos + n]).decode("utf-8")
    self.pos += n
    return s

  def value(self, vtype: int) -> Any:
    if vtype == 8: return self.string()
    if vtype == 9:
      itype, n = self.unpack("<I"), self.unpack("<Q")
      return [self.value(itype) for _ in range(n)]
    if vtype not in _GGUF_SCALARS: raise ValueError(f"GGUF: unknown metadata value type {vtype}")
    return self.unpack(_GGUF_SCALARS[vtype])


def _dequant(raw: np.ndarray, ggml_type: int, n: int) -> np.ndarray:
  """float32 values of `n` elements stored as ggml type `ggml_type` in `raw` (uint8)."""
  if ggml_type == 0: return raw.view(np.float32)[:n].copy()
  if ggml_type == 1: return raw.view(np.float16)[:n].astype(np.float32)
  if ggml_type == 30: return (raw.view(np.uint16)[:n].astype(np.uint32) << 16).view(np.float32)
  be, bb, _ = _GGML_TYPES[ggml_type]
  blocks = raw[:n // be * bb].reshape(-1, bb)
  d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # (nb, 1)
  if ggml_type == 8:  # Q8_0: d, 32 x int8
    return (d * blocks[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)
  if ggml_type in (2, 3):  # Q4_0: d, 16 bytes (x = d*(q-8)); Q4_1: d, m, 16 bytes (x = d*q + m)
    qs = blocks[:, 2:] if ggml_type == 2 else blocks[:, 4:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32)  # low nibbles are elements 0..15
    if ggml_type == 2: return (d * (q - 8)).reshape(-1)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return (d * q + m).reshape(-1)
  # Q5_0: d, qh (uint32), 16 bytes; Q5_1: d, m, qh, 16 bytes. The 5th bit of element j is bit j of qh.
  off = 2 if ggml_type == 6 else 4
  qh = blocks[:, off:off + 4].copy().view(np.uint32)  # (nb, 1)
  qs = blocks[:, off + 4:]
  lo = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.uint32)
  hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4
  q = (lo | hi).astype(np.float32)
  if ggml_type == 6: return (d * (q - 16)).reshape(-1)
  m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
  return (d * q + m).reshape(-1)


def gguf_load(fn: str | os.PathLike | bytes | Tensor) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """(metadata key/values, {name: float32 Tensor}) of a GGUF (v2/v3) file; quantized tensors are dequantized.

  Shapes are numpy order (GGUF lists dims fastest-first, so they come reversed). Supported tensor types: F32, F16,
  BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; others raise naming the type.
  """
  if isinstance(fn, Tensor): data = memoryview(fn.numpy().tobytes())
  elif isinstance(fn, (bytes, bytearray, memoryview)): data = memoryview(bytes(fn))
  else: data = memoryview(pathlib.Path(fn).read_bytes())
  r = _Reader(data)
  if bytes(data[:4]) != b"GGUF": raise ValueError(f"not a GGUF file: magic {bytes(data[:4])!r}, expected b'GGUF'")
  r.pos = 4
  version = r.unpack("<I")
  if version not in (2, 3): raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
  n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
  kv: dict[str, Any] = {}
  for _ in range(n_kv):
    k = r.string()
    kv[k] = r.value(r.unpack("<I"))
  infos = []
  for _ in range(n_tensors):
    name = r.string()
    dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
    infos.append((name, dims, r.unpack("<I"), r.unpack("<Q")))
  align = int(kv.get("general.alignment", 32))
  start = -(-r.pos // align) * align
  out: dict[str, Tensor] = {}
  for name, dims, gtype, offset in infos:
    if gtype not in _GGML_TYPES:
      raise ValueError(f"GGUF tensor {name!r} has ggml type {gtype}; supported: "
                       + ", ".join(f"{v[2]} ({k})" for k, v in _GGML_TYPES.items()))
    n = int(np.prod(dims, dtype=np.int64)) if dims else 1
    be, bb, tname = _GGML_TYPES[gtype]
    if n % be: raise ValueError(f"GGUF tensor {name!r}: {n} elements are not whole {tname} blocks of {be}")
    nbytes = n // be * bb
    raw = np.frombuffer(data, dtype=np.uint8, count=nbytes, offset=start + offset)
    out[name] = Tensor(_dequant(raw, gtype, n).reshape(tuple(reversed(dims))))
  return kv, out
