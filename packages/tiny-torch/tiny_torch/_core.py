"""The tiny device's tensor, below the op tables and the dispatcher: what `ops`, `ops_nn`, `dynamo` and `backend` share.

`TinyTensor` (torch's metadata over a shared `Storage`, a 1-D tiny Tensor), the dtype and device maps, reading a
tensor's values out of its storage (`read`) and writing them back through every view (`write`, `resize`), and the
copies between the host and tiny (`from_torch`, `to_cpu`). See `tiny_torch.backend`'s docstring for the contract.

The dispatcher (`backend.dispatch`) sits above this module, because it needs the op tables of `tiny_torch.ops`,
which need this module: it is passed in with `set_dispatcher` when `tiny_torch.backend` is imported, and
`TinyTensor.__torch_dispatch__` and `dispatch` here call it. Nothing here imports the op tables.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Callable

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map
from tiny_tensor import Device, Tensor, dtypes


BACKEND = "tiny"
FLUSH_WRITES = 256  # in-place writes between two realizations of the written storages

# ***** dtypes and devices *****

TORCH_TO_TINY = {torch.float32: dtypes.float32, torch.float16: dtypes.float16, torch.bfloat16: dtypes.bfloat16,
                 torch.float64: dtypes.float64, torch.int8: dtypes.int8, torch.uint8: dtypes.uint8,
                 torch.int16: dtypes.int16, torch.int32: dtypes.int32, torch.int64: dtypes.int64,
                 torch.bool: dtypes.bool}
TINY_TO_TORCH = {v: k for k, v in TORCH_TO_TINY.items()}


def to_tiny_dtype(dt: torch.dtype) -> Any:
  """The tiny dtype of a torch dtype; TypeError names the ones the tiny device has."""
  if dt not in TORCH_TO_TINY:
    raise TypeError(f"dtype {dt} is not supported on the tiny device; supported: {sorted(map(str, TORCH_TO_TINY))}")
  return TORCH_TO_TINY[dt]


def tiny_device_name(index: int | None) -> str:
  """The tiny device behind `tiny:index`: `Device.DEFAULT` for index 0 (so `DEV=AMD` puts `tiny` on the GPU),
  `"<DEFAULT>:1"` for `tiny:1`, and so on."""
  return Device.DEFAULT if not index else f"{Device.DEFAULT}:{index}"


def torch_index(tiny_device: str) -> int:
  """The N of `tiny:N` for a tiny device name ('CPU' -> 0, 'CPU:1' -> 1)."""
  _, _, idx = tiny_device.partition(":")
  return int(idx) if idx.isdigit() else 0


def _dev_index(device: Any) -> int:
  if device is None: return 0
  d = torch.device(device)
  if d.type != BACKEND: raise RuntimeError(f"expected a tiny device, got {d}")
  return d.index or 0


# ***** storage and the tensor subclass *****

class Storage:
  """The elements a tensor and all its views share: `data` is a 1-D tiny Tensor, replaced (not mutated) by writes."""
  __slots__ = ("_data", "__weakref__")

  def __init__(self, data: Tensor) -> None:
    self.data = data

  @property
  def data(self) -> Tensor:
    """The elements (1-D). torch does the autograd: tiny keeps no gradient graph for them (requires_grad=False)."""
    return self._data

  @data.setter
  def data(self, t: Tensor) -> None:
    self._data = t.detach()


_dirty: weakref.WeakSet[Storage] = weakref.WeakSet()
_writes = [0]


def flush() -> None:
  """Realize every storage written in place since the last flush (together, so their kernels can share work)."""
  pending = [s.data for s in list(_dirty)]
  _dirty.clear()
  _writes[0] = 0
  if pending: Tensor.realize(*pending)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
  out, acc = [], 1
  for n in reversed(shape):
    out.append(acc)
    acc *= max(n, 1)
  return tuple(reversed(out))


class TinyTensor(torch.Tensor):
  """A torch tensor on the `tiny` device: torch metadata over a shared tiny `Storage` (see the module docstring).

  >>> import torch, tiny_torch
  >>> (torch.ones(2, device="tiny") * 3).cpu().tolist()
  [3.0, 3.0]
  """
  _st: Storage

  @staticmethod
  def __new__(cls, st: Storage, size: tuple[int, ...], stride: tuple[int, ...], offset: int, dtype: torch.dtype,
              index: int, requires_grad: bool = False) -> TinyTensor:
    r = torch.Tensor._make_wrapper_subclass(cls, size, stride, storage_offset=offset, dtype=dtype,
                                            device=torch.device(BACKEND, index), requires_grad=requires_grad)
    r._st = st
    return r

  __torch_function__ = torch._C._disabled_torch_function_impl

  def __repr__(self, *, tensor_contents: Any = None) -> str:
    base = repr(self.detach().cpu())
    return base[:-1] + f", device='{self.device}')" if base.endswith(")") else base

  @classmethod
  def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    return _dispatch_untraced(func, args, kwargs or {})

  def tiny(self) -> Tensor:
    """This tensor's values as a (lazy) tiny Tensor of the same shape: a copy, not a view."""
    return read(self)


def wrap(t: Tensor, dtype: torch.dtype | None = None) -> TinyTensor:
  """A new contiguous TinyTensor owning the tiny Tensor `t` (cast to `dtype`, a torch dtype, when given)."""
  if dtype is not None and TORCH_TO_TINY[dtype] != t.dtype: t = t.cast(TORCH_TO_TINY[dtype])
  if t.dtype not in TINY_TO_TORCH: raise TypeError(f"tiny dtype {t.dtype} has no torch dtype")
  shape = tuple(int(s) for s in t.shape)
  return TinyTensor(Storage(t.reshape(math.prod(shape))), shape, _contiguous_strides(shape), 0,
                    TINY_TO_TORCH[t.dtype], torch_index(t.device))


def _meta_of(w: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
  return tuple(w.shape), tuple(w.stride()), w.storage_offset()


def _nested_plan(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[tuple[int, int, int]] | None:
  """The non-broadcast dims (axis, size, stride) sorted by stride, largest first, when each dim's elements lie
  within one step of the dim outside it (then movement ops reach them); None otherwise (overlapping windows)."""
  dims = sorted(((i, n, s) for i, (n, s) in enumerate(zip(shape, strides)) if n > 1 and s != 0), key=lambda d: -d[2])
  for j in range(len(dims) - 1):
    extent = sum((n - 1) * s for _, n, s in dims[j + 1:]) + 1
    if extent > dims[j][2]: return None
  return dims


def _window(flat: Tensor, start: int, length: int) -> Tensor:
  size = flat.shape[0]
  if start + length <= size: return flat.shrink(((start, start + length),))
  return flat.shrink(((start, size),)).pad(((0, start + length - size),))


def _fit_last(t: Tensor, length: int) -> Tensor:
  cur = t.shape[-1]
  if length == cur: return t
  if length < cur: return t.shrink(tuple((0, s) for s in t.shape[:-1]) + ((0, length),))
  return t.pad(tuple((0, 0) for _ in t.shape[:-1]) + ((0, length - cur),))


def _flat_index(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> np.ndarray:
  idx = np.full(shape, offset, dtype=np.int64)
  for ax, (n, s) in enumerate(zip(shape, strides)):
    idx = idx + (np.arange(n, dtype=np.int64) * s).reshape([n if a == ax else 1 for a in range(len(shape))])
  return idx


def read(w: torch.Tensor) -> Tensor:
  """The values of TinyTensor `w` as a tiny Tensor of its shape, read from its storage with movement ops."""
  flat = w._st.data
  shape, strides, off = _meta_of(w)
  numel = math.prod(shape)
  if numel == 0: return Tensor.zeros(*shape, dtype=flat.dtype, device=flat.device)
  if off == 0 and numel == flat.shape[0] and strides == _contiguous_strides(shape): return flat.reshape(shape)
  dims = _nested_plan(shape, strides)
  if dims is None:  # overlapping windows (unfold, as_strided): gather the elements
    idx = Tensor(_flat_index(shape, strides, off).reshape(-1).astype(np.int32), device=flat.device)
    return flat[idx].reshape(shape)
  if not dims: t = _window(flat, off, 1)
  else:
    t = _window(flat, off, dims[0][1] * dims[0][2]).reshape(dims[0][1], dims[0][2])
    for _, n, s in dims[1:]: t = _fit_last(t, n * s).reshape(*t.shape[:-1], n, s)
    t = t.shrink(tuple((0, x) for x in t.shape[:-1]) + ((0, 1),)).reshape(t.shape[:-1])
    order = [d[0] for d in dims]
    t = t.permute(*sorted(range(len(order)), key=lambda k: order[k]))
  kept = {d[0] for d in dims}
  t = t.reshape(tuple(n if i in kept else 1 for i, n in enumerate(shape)))
  return t.expand(shape) if t.shape != shape else t


def _mark_written(st: Storage) -> None:
  _dirty.add(st)
  _writes[0] += 1
  if _writes[0] >= FLUSH_WRITES: flush()


def write(w: torch.Tensor, v: Tensor) -> None:
  """Write tiny Tensor `v` (broadcast to `w`'s shape, cast to its dtype) into TinyTensor `w`'s storage: every view
  of that storage sees the new values, as torch's in-place ops do."""
  st = w._st
  flat = st.data
  shape, strides, off = _meta_of(w)
  if v.dtype != flat.dtype: v = v.cast(flat.dtype)
  if tuple(v.shape) != shape: v = v.reshape((1,) * (len(shape) - v.ndim) + tuple(v.shape)).expand(shape)
  if v.device != flat.device: v = v.to(flat.device)
  numel, size = math.prod(shape), flat.shape[0]
  if numel == 0: return
  if any(n > 1 and s == 0 for n, s in zip(shape, strides)):
    raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a single "
                       "memory location. Please clone() the tensor before performing the operation.")
  if off == 0 and numel == size and strides == _contiguous_strides(shape):
    st.data = v.reshape(size)
    return _mark_written(st)
  dims = _nested_plan(shape, strides)
  if dims is None:
    idx = _flat_index(shape, strides, off).reshape(-1)
    if len(np.unique(idx)) != len(idx):
      raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor refer "
                         "to a single memory location. Please clone() the tensor before performing the operation.")
    st.data = flat.scatter(0, Tensor(idx.astype(np.int32), device=flat.device), v.reshape(-1).contiguous())
    return _mark_written(st)
  placed = [v.contiguous(), Tensor.ones(*shape, dtype=dtypes.bool, device=flat.device)]
  for k, t in enumerate(placed):
    if dims:
      t = t.reshape(tuple(n for _, n, _ in sorted(dims))).permute(*[sorted(d[0] for d in dims).index(d[0])
                                                                     for d in dims])
      t = t.reshape(*t.shape, 1).pad(tuple((0, 0) for _ in t.shape) + ((0, dims[-1][2] - 1),))
      for j in range(len(dims) - 1, 0, -1):
        t = _fit_last(t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1]), dims[j - 1][2])
      t = t.reshape(dims[0][1] * dims[0][2])
    else: t = t.reshape(1)
    if off + t.shape[0] > size: t = t.shrink(((0, size - off),))
    placed[k] = t.pad(((off, size - off - t.shape[0]),))
  st.data = placed[1].where(placed[0], flat)
  _mark_written(st)


# ***** host <-> tiny *****

def from_torch(t: torch.Tensor, index: int = 0, realize: bool = True) -> TinyTensor:
  """A TinyTensor on `tiny:index` with the values of CPU tensor `t` (copied now, or lazily with realize=False)."""
  to_tiny_dtype(t.dtype)
  src = t.detach().contiguous()
  arr = src.float().numpy() if src.dtype == torch.bfloat16 else src.numpy()
  tt = Tensor(arr.copy(), device=tiny_device_name(index)).cast(TORCH_TO_TINY[t.dtype]) if arr.size else \
    Tensor.zeros(*src.shape, dtype=TORCH_TO_TINY[t.dtype], device=tiny_device_name(index))
  tt = tt.reshape(tuple(src.shape))
  return wrap(tt.realize() if realize else tt)


def to_cpu(w: torch.Tensor) -> torch.Tensor:
  """A CPU torch tensor with the values of TinyTensor `w` (a host read: realizes what is pending)."""
  flush()
  t = read(w)
  if math.prod(w.shape) == 0: return torch.empty(tuple(w.shape), dtype=w.dtype)
  arr = (t.cast(dtypes.float32) if t.dtype == dtypes.bfloat16 else t).numpy()
  return torch.from_numpy(np.ascontiguousarray(arr).copy()).reshape(tuple(w.shape)).to(w.dtype)


def _tensors(tree: Any) -> list[torch.Tensor]:
  return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _to_meta(x: Any) -> Any:
  if isinstance(x, torch.Tensor):
    return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
  return x


def meta_run(func: Any, args: tuple, kwargs: dict) -> Any:
  """The op run on meta tensors: torch's output shapes, strides and dtypes, and torch's errors for bad input."""
  return func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))


def _unwrap(x: Any) -> Any:
  if isinstance(x, TinyTensor): return read(x)
  if isinstance(x, torch.Tensor):  # a 0-dim CPU tensor next to tiny ones: a scalar
    return x.item()
  return x


def _wrap_out(out: Any, meta: Any, func: Any) -> Any:
  if isinstance(out, Tensor):
    if meta is not None and tuple(meta.shape) != tuple(out.shape):
      raise RuntimeError(f"tiny_torch internal error: {func} computed shape {tuple(out.shape)}, torch's is "
                         f"{tuple(meta.shape)}")
    return wrap(out, meta.dtype if meta is not None else None)
  if isinstance(out, (tuple, list)):
    metas = meta if isinstance(meta, (tuple, list)) else [None] * len(out)
    return type(out)(_wrap_out(o, m, func) for o, m in zip(out, metas))
  return out


def resize(w: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
  """`w.resize_(size)` for TinyTensor `w`, with torch's semantics: the same storage and offset, the new sizes with
  contiguous strides (or `memory_format`'s), the storage grown (with zeros; torch leaves them uninitialized) when
  the new sizes need more elements than it has, so every view of it sees the grown storage. Returns `w`.

  The sizes, strides and errors (negative sizes) are torch's own: the same resize_ runs on a meta tensor first."""
  st = w._st
  numel = int(st.data.shape[0])
  m = torch.empty(numel, dtype=w.dtype, device="meta").as_strided(tuple(w.shape), tuple(w.stride()),
                                                                   w.storage_offset())
  m.resize_(tuple(size), memory_format=memory_format) if memory_format is not None else m.resize_(tuple(size))
  need = m.untyped_storage().nbytes() // m.element_size()
  if need > numel:
    st.data = st.data.pad(((0, need - numel),))
    _mark_written(st)
  meta = (tuple(m.shape), tuple(m.stride()), m.storage_offset())
  if meta != _meta_of(w):
    # the TensorImpl's sizes/strides/offset are replaced in place (torch's `Tensor.data` setter), the Python object
    # (and its autograd identity) stays: what resize_ does to a CPU tensor
    with torch.no_grad():
      w.data = TinyTensor(st, *meta, w.dtype, w.device.index or 0)
  return w




# ***** the dispatcher, passed in from above *****

_dispatcher: list[Callable[[Any, tuple, dict], Any]] = []


def set_dispatcher(fn: Callable[[Any, tuple, dict], Any]) -> None:
  """Install `fn(func, args, kwargs)` as the dispatcher of aten ops on TinyTensors (`backend.dispatch`)."""
  if not callable(fn): raise TypeError(f"set_dispatcher takes a callable (func, args, kwargs) -> result, got {fn!r}")
  _dispatcher[:] = [fn]


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
  """Run aten op `func` with TinyTensor arguments through the installed dispatcher (`backend.dispatch`)."""
  if not _dispatcher:
    raise RuntimeError(f"tiny_torch: no dispatcher installed to run {func}: import tiny_torch (its backend module "
                       "installs it)")
  return _dispatcher[0](func, args, kwargs)


# TorchDynamo can't trace this Python subclass: code under torch.compile that meets a TinyTensor graph-breaks and runs
# eagerly, and the eager dispatch must not itself be traced (it would be compiled as a graph over meta tensors)
_dispatch_untraced = torch._dynamo.disable(dispatch, recursive=True)
