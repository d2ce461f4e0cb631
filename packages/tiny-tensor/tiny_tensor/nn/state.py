"""Model state: find a model's tensors, load/save them (safetensors, PyTorch .pth, GGUF).

>>> from tiny_tensor import nn
>>> model = nn.Linear(3, 2)
>>> sorted(nn.state.get_state_dict(model))
['bias', 'weight']

- `get_state_dict(obj)`: {dotted name: Tensor} found through attributes, lists, tuples and dicts (as in tinygrad).
- `get_parameters(obj)`: those tensors, each once.
- `load_state_dict(model, state_dict, strict=True)`: copies in, checking the model's names and all shapes (one error
  lists them all).
- `safe_save` / `safe_load`: the safetensors format; `safe_load` reads the file once into host memory (tensors are
  views of that copy, never of the file, so changing the file later changes nothing). `safe_save` writes a new file
  and renames it over the old one: a reader never sees a half-written file.
- `torch_load`: PyTorch's zip checkpoint (`torch.save`) read with our own unpickler (no torch needed, no code run).
- `gguf_load`: GGUF v2/v3 metadata and tensors, dequantizing F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K.

Files are untrusted input: every loader validates the whole header (types, sizes, offsets, overlaps, counts) before
it touches tensor data, and a bad file is a ValueError that names the entry and what is valid -- never a crash, a
read outside the file or a silently wrong tensor.
"""
from __future__ import annotations

import io
import json
import math
import os
import pickle
import struct
import tempfile
import zipfile
import zlib
from collections import OrderedDict
from typing import Any, TypeGuard

import numpy as np

from tiny_uop.device import Buffer
from tiny_uop.dtype import DType, dtypes, to_numpy
from tiny_uop.uop import UOp

from tiny_tensor import engine
from tiny_tensor.tensor import Tensor

__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_load", "safe_save", "safe_load_metadata",
           "torch_load", "gguf_load"]


# ***** walking models *****
def get_state_dict(obj: Any, prefix: str = "", tensor_type: type[Tensor] = Tensor) -> dict[str, Tensor]:
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

  `strict`: every model tensor must be in `state_dict` (a KeyError names the missing ones); entries of `state_dict`
  the model doesn't have are skipped, as in tinygrad (`verbose` names them). Shapes must always match (a scalar and a
  one-element vector count as matching); a ValueError names every mis-shaped key. `consume` removes loaded entries
  from `state_dict`; `realize` copies now. Returns the model tensors that were loaded.
  """
  model_sd = get_state_dict(model)
  missing = [k for k in model_sd if k not in state_dict]
  unexpected = [k for k in state_dict if k not in model_sd]
  # a scalar and a one-element vector load into each other (torch and tinygrad both allow it: old checkpoints store
  # scalars such as num_batches_tracked as (1,)); any other shape difference is an error
  shapes = [f"{k}: model {tuple(v.shape)}, state_dict {tuple(state_dict[k].shape)}" for k, v in model_sd.items()
            if k in state_dict and tuple(v.shape) != tuple(state_dict[k].shape)
            and {tuple(v.shape), tuple(state_dict[k].shape)} != {(), (1,)}]
  if shapes: raise ValueError(f"load_state_dict: shape mismatch for {len(shapes)} key(s): " + "; ".join(shapes))
  # strict is about the model's tensors, as in tinygrad: each must be loaded; extra state_dict entries (a checkpoint's
  # unused head, a buffer the model doesn't keep) are skipped, and named in a missing-key error or when verbose
  if strict and missing:
    msg = [f"missing keys (in the model, not in the state_dict): {missing}"]
    if unexpected: msg.append(f"unexpected keys (in the state_dict, not in the model): {unexpected}")
    raise KeyError("load_state_dict(strict=True): " + "; ".join(msg) + " (pass strict=False to skip them)")
  if verbose and (missing or unexpected): print(f"load_state_dict: missing {missing}, unexpected {unexpected}")
  loaded: list[Tensor] = []
  for k, v in model_sd.items():
    if k not in state_dict: continue
    src = state_dict[k].to(v.device)
    if tuple(src.shape) != tuple(v.shape): src = src.reshape(v.shape)  # () <-> (1,), checked above
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
  """A Tensor whose storage is the existing `buf` (a view of a host buffer, say): no copy."""
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


class _NoDupDict(dict):
  """json object_pairs_hook: a dict that refuses a key given twice (JSON allows it, safetensors doesn't)."""

  def __init__(self, pairs: list[tuple[str, Any]]):
    super().__init__()
    for k, v in pairs:
      if k in self: raise ValueError(f"key {k!r} appears twice in the JSON header")
      self[k] = v


def _is_int(x: Any) -> TypeGuard[int]: return isinstance(x, int) and not isinstance(x, bool)


def _read_header(f: Any, file_size: int) -> tuple[int, dict[str, Any]]:
  """(data start, header dict) of a safetensors file of `file_size` bytes, validated before anything reads data."""
  raw = f.read(8)
  if len(raw) != 8:
    raise ValueError(f"not a safetensors file: {file_size} bytes, shorter than the 8-byte header length")
  n = struct.unpack("<Q", raw)[0]
  if n > file_size - 8:
    raise ValueError(f"not a safetensors file: header length {n} is larger than the {file_size - 8} bytes after it")
  try: header = json.loads(f.read(n), object_pairs_hook=_NoDupDict)
  except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
    raise ValueError(f"not a safetensors file: bad JSON header ({type(e).__name__}: {e})") from e
  except ValueError as e: raise ValueError(f"bad safetensors header: {e}") from e
  if not isinstance(header, dict):
    raise ValueError(f"bad safetensors header: a JSON {type(header).__name__}, expected an object of tensor entries")
  _check_entries(header, file_size - 8 - n)
  return 8 + n, header


def _check_entries(header: dict[str, Any], data_size: int) -> None:
  """Every entry names a known dtype, a shape of non-negative ints and [start, end) offsets inside the data, whose
  length is the shape's bytes; no two tensors share a byte. Raises ValueError naming the entry and what is valid."""
  if (meta := header.get("__metadata__")) is not None and (not isinstance(meta, dict) or
                                                          not all(isinstance(v, str) for v in meta.values())):
    raise ValueError(f"bad safetensors header: __metadata__ must map str to str, got {meta!r:.200}")
  spans = []
  for k, v in header.items():
    if k == "__metadata__": continue
    if not isinstance(v, dict): raise ValueError(f"tensor {k!r}: entry is a {type(v).__name__}, expected an object "
                                                 "with dtype, shape and data_offsets")
    if (missing := [f for f in ("dtype", "shape", "data_offsets") if f not in v]):
      raise ValueError(f"tensor {k!r}: entry lacks {', '.join(missing)} (needs dtype, shape, data_offsets)")
    if not isinstance(v["dtype"], str) or v["dtype"] not in _SAFE_DTYPES:
      raise ValueError(f"tensor {k!r} has unsupported dtype {v['dtype']!r}; valid: {sorted(_SAFE_DTYPES)}")
    shape, offs = v["shape"], v["data_offsets"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
      raise ValueError(f"tensor {k!r}: shape {shape!r:.100} must be a list of non-negative ints")
    _check_representable(f"tensor {k!r}", shape, _SAFE_DTYPES[v["dtype"]].itemsize)
    if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs):
      raise ValueError(f"tensor {k!r}: data_offsets {offs!r:.100} must be [start, end] ints")
    start, end = offs
    if not 0 <= start <= end <= data_size:
      raise ValueError(f"tensor {k!r}: data_offsets [{start}, {end}] are outside the data, which holds "
                       f"[0, {data_size}]")
    need = math.prod(shape) * _SAFE_DTYPES[v["dtype"]].itemsize
    if end - start != need:
      raise ValueError(f"tensor {k!r} spans {end - start} bytes but shape {tuple(shape)} of {v['dtype']} needs {need}")
    if need: spans.append((start, end, k))
  spans.sort()
  for (s0, e0, k0), (s1, e1, k1) in zip(spans, spans[1:]):
    if s1 < e0: raise ValueError(f"tensors {k0!r} [{s0}, {e0}) and {k1!r} [{s1}, {e1}) overlap in the data")


# numpy's limits (and so .numpy()'s): at most 32 dims (numpy 1; numpy 2 allows 64), and an array's bytes -- the
# product of its non-zero dims times the item size, zero dims ignored -- must fit in a signed 64-bit index
_MAX_NDIM, _MAX_ARRAY_BYTES = 32, 2**63 - 1


def _check_representable(what: str, shape: Any, itemsize: int) -> None:
  """A shape of non-negative ints that numpy can hold, else a ValueError naming `what`, the shape and the limit.

  A zero-element tensor with a huge other dim ((0, 2**62) say) is valid when numpy can make it (its bytes, counting
  the non-zero dims only, fit the limit): e.g. (0, 2**40) of float32 loads, (0, 2**62) of float32 does not."""
  if len(shape) > _MAX_NDIM:
    raise ValueError(f"{what}: shape has {len(shape)} dims; at most {_MAX_NDIM} are supported")
  nbytes = math.prod(d for d in shape if d) * itemsize
  if nbytes > _MAX_ARRAY_BYTES:
    raise ValueError(f"{what}: shape {tuple(shape)} needs {nbytes} bytes (its non-zero dims times the {itemsize}-byte "
                     f"item size), over the limit of {_MAX_ARRAY_BYTES} (2**63-1) bytes that numpy can index")


def _check_bools(name: str, data: bytes | memoryview) -> None:
  if (bad := bytes(data).translate(None, b"\x00\x01")):
    raise ValueError(f"tensor {name!r}: BOOL byte {bad[0]} is not 0 or 1")


def safe_load_metadata(fn: str | os.PathLike) -> dict[str, Any]:
  """The `__metadata__` dict of a safetensors file (empty when it has none)."""
  with open(fn, "rb") as f: return _read_header(f, os.fstat(f.fileno()).st_size)[1].get("__metadata__", {})


def safe_load(fn: str | os.PathLike | Tensor) -> dict[str, Tensor]:
  """Tensors of a safetensors file, by name, on the CPU device.

  The file is read once (read(), no memory map) into one host buffer that the tensors are views of: nothing loaded
  depends on the file after the call, so rewriting or truncating it later changes no tensor and can't fault (a map,
  even MAP_PRIVATE, would see later writes and SIGBUS after a truncate). The whole header is validated before any
  tensor is made (ValueError naming the entry): dtypes, shapes, offsets inside the file and not overlapping, sizes
  that match, no duplicate keys, BOOL bytes 0 or 1.
  """
  if isinstance(fn, Tensor): return _safe_load_bytes(bytes(fn.numpy().tobytes()))
  path = os.fspath(fn)
  with open(path, "rb", buffering=0) as f:
    size = os.fstat(f.fileno()).st_size
    try: data_start, header = _read_header(f, size)
    except ValueError as e: raise ValueError(f"{path}: {e}") from e
    host = _host_buffer(size)
    if host is None:  # no host device with zero-copy views: plain memory, one array per tensor
      data = bytearray(size)
      _read_all(f, path, size, memoryview(data))
      return _safe_load_bytes(data, path)
    _read_all(f, path, size, host.as_buffer(force_zero_copy=True))
  entries = {k: v for k, v in header.items() if k != "__metadata__"}
  mem = host.as_buffer(force_zero_copy=True)
  for k, v in entries.items():
    if v["dtype"] == "BOOL":
      try: _check_bools(k, mem[data_start + v["data_offsets"][0]:data_start + v["data_offsets"][1]])
      except ValueError as e: raise ValueError(f"{path}: {e}") from e
  out: dict[str, Tensor] = {}
  for k, v in entries.items():
    dt, shape = _SAFE_DTYPES[v["dtype"]], tuple(v["shape"])
    out[k] = _tensor_on(host.view(math.prod(shape), dt, data_start + v["data_offsets"][0]), shape)
  return out


def _host_buffer(size: int) -> Buffer | None:
  """A CPU Buffer of `size` bytes with zero-copy views and host access (None when the CPU device can't give one)."""
  from tiny_uop.plugins import DeviceUnavailableError, UnknownDeviceError
  try: buf = Buffer("CPU", size, dtypes.uint8).ensure_allocated()
  except (UnknownDeviceError, DeviceUnavailableError):
    return None
  return buf if hasattr(buf.allocator, "_as_buffer") and hasattr(buf.allocator, "_offset") else None


def _read_all(f: Any, path: str, size: int, mv: memoryview) -> memoryview:
  """Read the whole file `f` of `size` bytes into `mv` with readinto (one copy, from the start)."""
  f.seek(0)
  got = 0
  while got < size and (n := f.readinto(mv[got:size])): got += n
  if got != size or f.read(1):
    raise ValueError(f"{path}: the file changed size while it was read ({size} bytes expected, {got} read)")
  return mv


def _safe_load_bytes(data: bytes | bytearray, name: str = "<bytes>") -> dict[str, Tensor]:
  try:
    data_start, header = _read_header(io.BytesIO(data), len(data))
    out = {}
    for k, v in header.items():
      if k == "__metadata__": continue
      start, end = v["data_offsets"]
      raw = memoryview(data)[data_start + start:data_start + end]
      if v["dtype"] == "BOOL": _check_bools(k, raw)
      out[k] = _from_bytes(raw, _SAFE_DTYPES[v["dtype"]], tuple(v["shape"]))
  except ValueError as e: raise ValueError(f"{name}: {e}") from e
  return out


def _tensor_bytes(t: Tensor) -> bytes:
  if t.dtype.scalar() in (dtypes.bfloat16, *dtypes.fp8s):
    return t.bitcast({2: dtypes.uint16, 1: dtypes.uint8}[t.dtype.itemsize]).numpy().tobytes()
  return t.numpy().tobytes()


def _write_atomic(fn: str | os.PathLike, chunks: list[bytes]) -> None:
  """Write `chunks` to a new file next to `fn`, then rename it over `fn`: a reader (or a mapping of the old file, as
  `safe_load` keeps) never sees a half-written or shrunk file; on failure `fn` is untouched."""
  path = os.path.abspath(os.fspath(fn))
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path))
  try:
    with os.fdopen(fd, "wb") as f:
      for c in chunks: f.write(c)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike, metadata: dict[str, Any] | None = None) -> None:
  """Write `tensors` to a safetensors file (header padded to 8 bytes, data in dict order).

  The file is written next to `fn` and renamed over it, so tensors `safe_load`ed from the old file stay valid."""
  header: dict[str, Any] = {}
  if metadata: header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  blobs, offset = [], 0
  for k, t in tensors.items():
    if not isinstance(k, str) or k == "__metadata__":
      raise ValueError(f"safe_save: tensor name {k!r} must be a str other than '__metadata__'")
    if t.dtype not in _SAFE_NAMES:
      raise ValueError(f"safe_save: tensor {k!r} has dtype {t.dtype}, which safetensors can't store; "
                       f"valid: {', '.join(map(repr, _SAFE_NAMES))}")
    b = _tensor_bytes(t)
    header[k] = {"dtype": _SAFE_NAMES[t.dtype], "shape": [int(s) for s in t.shape],
                 "data_offsets": [offset, offset + len(b)]}
    blobs.append(b)
    offset += len(b)
  hj = json.dumps(header, separators=(",", ":")).encode()
  hj += b" " * (-len(hj) % 8)
  _write_atomic(fn, [struct.pack("<Q", len(hj)), hj, *blobs])


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


class _Budget:
  """The bytes torch_load may still allocate (storages read from the archive plus tensors it builds), so a small
  file can't make it allocate gigabytes (a deflate bomb, a stride-0 view of a huge size)."""

  def __init__(self, limit: int, archive_size: int): self.limit, self.used, self.archive_size = limit, 0, archive_size

  def take(self, n: int, what: str) -> None:
    """Count `n` more bytes for `what`, or raise a ValueError naming the budget before anything is allocated."""
    if self.used + n > self.limit:
      raise ValueError(f"{what} needs {n} bytes, over torch_load's memory budget max_bytes={self.limit} "
                       f"({self.used} bytes already used); pass a larger max_bytes= if you trust the file")
    self.used += n


class _TorchStorage:
  __slots__ = ("dtype", "key", "data", "budget")

  def __init__(self, dtype: DType, key: str, data: bytes | bytearray, budget: _Budget):
    self.dtype, self.key, self.data, self.budget = dtype, key, data, budget


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: _Budget) -> bytearray:
  """The bytes of one archive member, read in chunks into a buffer of its declared size (counted in `budget` first):
  a member that decompresses to more or less than its header declares is refused after at most one extra byte, and
  one whose local header or compressed data would lie outside the archive is refused before any read."""
  size = info.file_size
  if not 0 <= info.header_offset <= budget.archive_size - 30 or info.compress_size > budget.archive_size:
    raise ValueError(f"zip member {info.filename!r}: its header offset {info.header_offset} / compressed size "
                     f"{info.compress_size} lie outside the {budget.archive_size}-byte archive")
  budget.take(size, f"zip member {info.filename!r}")
  out = bytearray(size)
  got = 0
  with zf.open(info) as f:
    while got <= size and (chunk := f.read(min(1 << 20, size + 1 - got))):
      if got + len(chunk) > size:
        raise ValueError(f"zip member {info.filename!r} holds more than the {size} bytes its header declares")
      out[got:got + len(chunk)] = chunk
      got += len(chunk)
  if got != size:
    raise ValueError(f"zip member {info.filename!r} is truncated: {got} of the {size} bytes its header declares")
  return out


class _Opaque:
  """Stands in for a class or function a checkpoint names that we don't load (hooks, metadata classes, tensor
  subclasses). Nothing of it runs: building or calling one only records the arguments, so tensors hidden inside can
  be reported instead of silently dropped. Each global gets its own subclass (`find_class`), named after it, holding
  the load's budget: recording copies the arguments (`*args`), and a few bytes of pickle can repeat a call whose
  argument tuple is huge, so every record is charged. (No __init__: object's ignores the arguments.)"""
  _global = "?"
  _budget: _Budget
  args: tuple[tuple, dict]  # the recorded call: (positional, keyword) arguments
  state: Any  # what __setstate__ was given, if anything

  def __new__(cls, *args: Any, **kwargs: Any) -> _Opaque:  # NEWOBJ builds with cls.__new__(cls, *args)
    cls._budget.take(_ITEM_BYTES * (len(args) + len(kwargs) + 1), f"a pickled call of {cls._global}")
    obj = object.__new__(cls)
    obj.args, obj.state = (args, kwargs), None
    return obj

  def __setstate__(self, state: Any) -> None: self.state = state
  def __call__(self, *args: Any, **kwargs: Any) -> Any: return type(self)(*args, **kwargs)
  def __setitem__(self, key: Any, value: Any) -> None: self.state = (self.state, key, value)  # SETITEM(S) on it
  def append(self, x: Any) -> None: self.state = (self.state, x)                             # APPEND(S) on it

  def extend(self, xs: Any) -> None:
    xs = _charged(list, self._budget, f"{self._global}.extend")(xs)
    self.state = (self.state, xs)


def _opaque_class(module: str, name: str, budget: _Budget) -> type[_Opaque]:
  return type(name, (_Opaque,), {"_global": f"{module}.{name}", "_budget": budget,
                                 "__module__": "tiny_tensor.nn.state.unloaded"})


# what one element of a container a pickle rebuilds costs, roughly (a pointer plus hash-table slack): the budget's unit
_ITEM_BYTES = 64


def _charged(fn: Any, budget: _Budget, name: str) -> Any:
  """`fn` (a container type a pickle may call) charging `budget` for the elements it copies first: `list(big)`
  repeated costs a few bytes of pickle per call and a full copy each time."""
  def build(*args: Any) -> Any:
    n = sum(len(a) for a in args if isinstance(a, (list, tuple, dict, set, frozenset, str, bytes)))
    budget.take(_ITEM_BYTES * (n + 1), f"a pickled call {name}() of {n} elements")
    return fn(*args)
  return build


def _check_ints(what: str, xs: Any) -> tuple[int, ...]:
  if not isinstance(xs, (tuple, list)) or not all(_is_int(x) and x >= 0 for x in xs):
    raise ValueError(f"torch_load: tensor {what} {xs!r:.100} must be a tuple of non-negative ints")
  return tuple(xs)


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, *args: Any) -> Any:
  """A numpy array (by element strides) over the storage's bytes; made into Tensors at the end of torch_load. Size,
  stride and offset are checked against the storage first: every element read lies inside it."""
  if not isinstance(storage, _TorchStorage):
    raise ValueError(f"torch_load: a tensor's storage is a {type(storage).__name__}, not a storage record")
  size, stride = _check_ints("size", size), _check_ints("stride", stride)
  if len(size) != len(stride): raise ValueError(f"torch_load: tensor size {size} and stride {stride} differ in rank")
  if not _is_int(storage_offset) or storage_offset < 0:
    raise ValueError(f"torch_load: storage offset {storage_offset!r} must be a non-negative int")
  dt = storage.dtype
  try: npdt = np.dtype(to_numpy(dt))
  except TypeError: npdt = np.dtype({2: np.uint16, 1: np.uint8}[dt.itemsize])  # bf16/fp8: bit patterns
  numel = len(storage.data) // npdt.itemsize
  _check_representable(f"torch_load: tensor on storage {storage.key!r}", size, npdt.itemsize)
  n = math.prod(size)
  if n == 0: return _TorchArray(np.zeros(size, dtype=npdt), dt)
  last = storage_offset + sum((s - 1) * st for s, st in zip(size, stride))  # the highest element index read
  if last >= numel:
    raise ValueError(f"torch_load: tensor of size {size}, stride {stride} at offset {storage_offset} reads element "
                     f"{last} of storage {storage.key!r}, which holds {numel} {dt} elements")
  # an expanded (stride-0) view is n elements once materialised, however few it reads: counted before it's made
  storage.budget.take(n * npdt.itemsize, f"tensor of size {size}, stride {stride} on storage {storage.key!r}")
  base = np.frombuffer(storage.data, dtype=npdt, count=numel)
  view = np.lib.stride_tricks.as_strided(base[storage_offset:], shape=size,
                                         strides=tuple(st * npdt.itemsize for st in stride), writeable=False)
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


_TORCH_UTILS = {"_rebuild_tensor": _rebuild_tensor, "_rebuild_tensor_v2": _rebuild_tensor,
                "_rebuild_parameter": _rebuild_parameter, "_rebuild_parameter_with_state": _rebuild_parameter}
# containers and numbers only: e.g. bytes(10**12) would be a pickle that allocates a terabyte; the containers are
# charged to the budget for what they copy (_charged)
_BUILTINS = {"set": set, "frozenset": frozenset, "dict": dict, "list": list, "tuple": tuple, "int": int,
             "float": float, "bool": bool}
_COPYING = (set, frozenset, dict, list, tuple)


class _TorchUnpickler(pickle.Unpickler):
  """Resolves only the globals a state dict needs (tensor rebuilders, storages, dtypes, plain containers); any other
  name becomes an `_Opaque` stand-in, so a checkpoint can't run code here."""

  def __init__(self, f: Any, zf: zipfile.ZipFile, prefix: str, budget: _Budget, weights_only: bool = False):
    super().__init__(f)
    self.zf, self.prefix, self.budget, self.weights_only = zf, prefix, budget, weights_only
    self.storages: dict[str, _TorchStorage] = {}

  def find_class(self, module: str, name: str) -> Any:
    if module == "torch._utils" and name in _TORCH_UTILS: return _TORCH_UTILS[name]
    if module == "torch" and name in _TORCH_STORAGES: return _TORCH_STORAGES[name]
    if module == "torch" and name in _TORCH_DTYPES: return _TORCH_DTYPES[name]
    if module == "collections" and name == "OrderedDict": return _charged(OrderedDict, self.budget, "OrderedDict")
    if module in ("builtins", "__builtin__") and name in _BUILTINS:
      fn = _BUILTINS[name]
      return _charged(fn, self.budget, name) if fn in _COPYING else fn
    if self.weights_only:
      raise pickle.UnpicklingError(
        f"weights_only=True refuses the global {module}.{name}; allowed: torch._utils.{{{', '.join(_TORCH_UTILS)}}}, "
        "torch.<dtype>/<Type>Storage, collections.OrderedDict, builtins.{" + ", ".join(_BUILTINS) + "}")
    return _opaque_class(module, name, self.budget)  # hooks, torch.Size, metadata classes: recorded, never run

  def persistent_load(self, pid: Any) -> Any:
    # ('storage', storage type (a DType here, or torch.UntypedStorage), key, location, numel)
    if not isinstance(pid, tuple) or len(pid) < 3 or pid[0] != "storage":
      raise pickle.UnpicklingError(f"unknown persistent id {pid!r:.100}; expected ('storage', type, key, ...)")
    dt, key = pid[1], str(pid[2])
    if not isinstance(dt, DType): dt = dtypes.uint8
    if key not in self.storages:
      member = f"{self.prefix}data/{key}"
      try: info = self.zf.getinfo(member)
      except KeyError:
        raise pickle.UnpicklingError(f"storage {key!r} has no file data/{key} in the archive (zip member {member!r} "
                                     "is missing)") from None
      # torch.save writes each storage whole: its record holds exactly numel * itemsize bytes
      if len(pid) > 4 and _is_int(pid[4]) and info.file_size != pid[4] * dt.itemsize:
        raise pickle.UnpicklingError(f"storage {key!r} declares {pid[4]} {dt} elements ({pid[4] * dt.itemsize} "
                                     f"bytes) but data/{key} holds {info.file_size} bytes")
      self.storages[key] = _TorchStorage(dt, key, _read_member(self.zf, info, self.budget), self.budget)
    st = self.storages[key]
    if st.dtype != dt: raise pickle.UnpicklingError(f"storage {key!r} is used as both {st.dtype} and {dt}")
    return st


def _tensors_inside(x: Any) -> bool:
  """Whether an unloaded object holds a tensor (or a storage, the data of one it didn't build) anywhere in its
  arguments or state (iteratively: pickles nest deep)."""
  stack, seen = [x], set()
  while stack:
    y = stack.pop()
    if id(y) in seen: continue
    seen.add(id(y))
    if isinstance(y, (_TorchArray, _TorchStorage)): return True
    if isinstance(y, _Opaque): stack.extend([y.args, y.state])
    elif isinstance(y, dict): stack.extend(list(y.keys()) + list(y.values()))
    elif isinstance(y, (list, tuple, set, frozenset)): stack.extend(y)
  return False


# the first bytes of torch.save's pre-1.6 format: a pickled magic number (0x1950a86a20f9469cfc6c)
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
_PTH_BUDGET_FLOOR, _PTH_BUDGET_FACTOR = 64 << 20, 4


def _not_a_zip(path: str) -> str:
  """Why a file zipfile can't open is not a checkpoint we read, from its first bytes."""
  with open(path, "rb") as f: head = f.read(len(_LEGACY_MAGIC))
  if head.startswith(_LEGACY_MAGIC):
    return "not a zip-format PyTorch checkpoint: the pre-1.6 legacy format is not supported; re-save it with a " \
           "recent torch.save"
  if head.startswith(b"PK"):
    return "a truncated or corrupt zip archive (its end-of-central-directory record is missing or damaged)"
  return f"not a zip-format PyTorch checkpoint: it starts with {head[:8]!r}, not b'PK' (zip) or legacy torch.save"


def _check_pickle_ops(data: bytes | bytearray, member: str) -> None:
  """Opcodes the C unpickler would run with a huge allocation are refused first: a memo index (BINPUT/LONG_BINPUT,
  `r\xff\xff\xff\x7f` is 5 bytes) sizes its memo table to twice the index -- up to 32 GB. Valid pickles number their
  memo entries from 0, one per opcode at most, so an index past the opcode count is corrupt."""
  import pickletools
  n_ops = 0
  try:
    for op, arg, pos in pickletools.genops(io.BytesIO(data)):
      n_ops += 1
      if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and (not _is_int(arg) or not 0 <= arg <= n_ops):
        raise ValueError(f"memo index {arg!r} at byte {pos} is past the {n_ops} opcodes read so far")
  except (pickle.UnpicklingError, UnicodeDecodeError, OverflowError) as e:
    raise ValueError(f"corrupt PyTorch checkpoint ({member}: {type(e).__name__}: {e})") from e
  except ValueError as e:  # genops: an unknown opcode, a truncated argument, no STOP
    raise ValueError(f"corrupt PyTorch checkpoint ({member}: {e})") from e


def torch_load(fn: str | os.PathLike, max_bytes: int | None = None, weights_only: bool = False) -> dict[str, Tensor]:
  """The tensors of a PyTorch checkpoint saved with `torch.save` (zip format), without torch.

  Nested dicts/lists of tensors are flattened to dotted names (`{"model": {"w": t}}` -> `"model.w"`); non-tensor
  values are dropped. Nothing in the file runs: classes other than tensors, storages and plain containers are
  recorded, not imported, and a tensor inside one of them (a tensor subclass, a custom container) is an error that
  names the class, not a silently missing weight. `weights_only=True` (as torch.load's) refuses any global but the
  tensor rebuilders, storages, dtypes and plain containers with a ValueError naming it, instead of recording it.
  Every tensor's size/stride/offset is checked against its storage, every storage against its archive member.

  `max_bytes` bounds what loading allocates (the archive members read plus the tensors built, an expanded stride-0
  view counting its full size); default: 4x the file size, at least 64 MiB. Going over it is a ValueError naming the
  budget, raised before the allocation (a deflate bomb is refused by its declared size, and a member that inflates
  past its declared size is stopped one byte later). Raises ValueError for a truncated or corrupt archive, a missing
  data.pkl or storage record (naming the member), the pre-1.6 legacy format and any other bad file.
  """
  path = os.fspath(fn)
  if max_bytes is not None and (not _is_int(max_bytes) or max_bytes < 0):
    raise ValueError(f"torch_load: max_bytes={max_bytes!r} must be a non-negative int (or None for the default)")
  try: is_zip = zipfile.is_zipfile(path)
  except zipfile.BadZipFile as e: raise ValueError(f"{path}: corrupt zip archive ({e})") from e
  if not is_zip: raise ValueError(f"{path}: {_not_a_zip(path)}")
  file_size = os.path.getsize(path)
  budget = _Budget(max_bytes if max_bytes is not None else max(_PTH_BUDGET_FLOOR, _PTH_BUDGET_FACTOR * file_size),
                   file_size)
  try:
    with zipfile.ZipFile(path) as zf:
      pkl = [n for n in zf.namelist() if n.endswith("data.pkl")]
      if not pkl: raise ValueError(f"a zip archive without a data.pkl member is not a PyTorch checkpoint (members: "
                                   f"{zf.namelist()[:8]!r:.300})")
      prefix = pkl[0][:-len("data.pkl")]
      data = _read_member(zf, zf.getinfo(pkl[0]), budget)
      _check_pickle_ops(data, pkl[0])
      obj = _TorchUnpickler(io.BytesIO(data), zf, prefix, budget, weights_only).load()
  except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, AttributeError, IndexError, TypeError, KeyError,
          struct.error, UnicodeDecodeError, RecursionError, OverflowError, MemoryError, NotImplementedError,
          RuntimeError, zlib.error) as e:  # RuntimeError, NotImplementedError: zipfile's "encrypted", unknown method
    raise ValueError(f"{path}: corrupt PyTorch checkpoint ({type(e).__name__}: {e})") from e
  except ValueError as e: raise ValueError(f"{path}: {e}") from e
  out: dict[str, Tensor] = {}
  skipped: list[str] = []
  stack: list[tuple[Any, str]] = [(obj, "")]
  seen: set[int] = set()
  while stack:  # iterative: a pickle can nest deeper than Python's recursion limit
    x, pre = stack.pop()
    if isinstance(x, _TorchArray): out[pre.strip(".")] = x.tensor()
    elif isinstance(x, (dict, list, tuple, _Opaque)):
      if id(x) in seen: continue
      seen.add(id(x))
      if isinstance(x, dict): stack.extend((v, f"{pre}{k}.") for k, v in reversed(list(x.items())))
      elif isinstance(x, (list, tuple)): stack.extend((v, f"{pre}{i}.") for i, v in reversed(list(enumerate(x))))
      elif _tensors_inside(x): skipped.append(f"{pre.strip('.') or '<root>'} ({x._global})")
  if skipped:
    raise ValueError(f"{path}: tensors inside classes torch_load doesn't load: {', '.join(skipped)}; valid: tensors, "
                     "nn.Parameters and dicts/lists/tuples of them (save a plain state_dict)")
  return out


# ***** GGUF *****
def gguf_load(fn: str | os.PathLike | bytes | Tensor) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """(metadata key/values, {name: float32 Tensor}) of a GGUF (v2/v3) file; quantized tensors are dequantized.

  Shapes are numpy order (GGUF lists dims fastest-first, so they come reversed). Supported tensor types: F32, F16,
  BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; others raise naming the type. The file is parsed and
  validated by `tiny_tensor.llm.gguf.read_gguf` before any tensor is made (a ValueError naming the field, its value
  and what is valid). A path is read into private memory once (no memory map) and every tensor is a new float32
  array: nothing loaded depends on the file after the call (rewriting or truncating it changes nothing).
  """
  from tiny_tensor.llm.gguf import read_gguf  # here: tiny_tensor.llm imports the model code, which needs nn
  kv, ts = read_gguf(fn.numpy().tobytes() if isinstance(fn, Tensor) else fn)
  for name, t in ts.items():  # zero-element tensors with a huge other dim pass the byte checks: can numpy hold them?
    _check_representable(f"GGUF tensor {name!r}", t.shape, dtypes.float32.itemsize)
  return kv, {name: Tensor(t.numpy()) for name, t in ts.items()}
