"""The `tiny` PyTorch device: a `torch.Tensor` wrapper subclass over tiny Tensors, and how aten ops reach tiny.

The contract, stage by stage:
1. Registration (`register()`, run once by `import tiny_torch`): PyTorch's PrivateUse1 backend is renamed `tiny`
   and set up as a Python backend (a Python device guard and hooks, `torch.tiny` as its device module); the factory
   ops with no tensor argument (`empty`, `empty_strided`, `arange`, `full`, ...) are registered for the PrivateUse1
   dispatch key with `torch.library`, so `torch.randn(3, device="tiny")` makes a `TinyTensor`.
2. Storage and views: a `TinyTensor` is torch's metadata (sizes, strides, storage offset, dtype, device `tiny:N`)
   over a `Storage`, a 1-D tiny Tensor of the storage's elements. A view op (`func.is_view`) makes a new TinyTensor
   over the same Storage, its metadata computed by running the op on a meta tensor (so every view op torch has is
   a view here too, with torch's strides). `read()` turns (storage, sizes, strides, offset) into a tiny Tensor with
   movement ops; `write()` puts new values back into the storage, so an in-place op on a view writes through to its
   base and every other view of it, as in torch.
3. Dispatch (`TinyTensor.__torch_dispatch__`, below autograd, so torch's autograd, optimizers and nn work
   unchanged), in this order: special ops (copies between devices, `.item()`, random draws); the device check; the
   ops of `tiny_torch.ops.OPS` (tiny Tensor code); CompositeImplicit ops (their own decomposition); views;
   `_foreach_*` lists (per element); in-place and `out=` variants (the functional op, then `write()`); torch's
   decomposition of the op into smaller aten ops (`torch._decomp`); the CPU when `allow_cpu_fallback(True)`; else
   NotImplementedError naming the op.
   Output shapes and dtypes come from running the op on meta tensors first: a shape mismatch raises torch's own
   RuntimeError before tiny runs anything, and tiny's result is cast to torch's dtype (int64 indices, promotion).
4. Laziness: tiny Tensors stay lazy; a storage written in place keeps a growing graph until it is realized, so
   written storages are realized together every `FLUSH_WRITES` writes and when data is read to the host.

Random numbers (`normal_`, `uniform_`, `bernoulli_`, `random_`, ...) are drawn from torch's CPU generator (or the
`generator=` given) and copied to the device: `torch.manual_seed(s)` makes a run on `tiny` draw exactly the numbers
the same run draws on the CPU.
"""
from __future__ import annotations

import math
import types
import warnings
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


# ***** dispatch *****

_cpu_fallback = [False]
_warned: set[str] = set()


def allow_cpu_fallback(enabled: bool = True) -> None:
  """Run aten ops the tiny backend lacks on the CPU (copying the tensors there and back, with a warning naming each
  op once) instead of raising NotImplementedError. Off by default: a missing op is an error naming it."""
  if not isinstance(enabled, bool): raise TypeError(f"allow_cpu_fallback takes a bool, got {enabled!r}")
  _cpu_fallback[0] = enabled


def _tensors(tree: Any) -> list[torch.Tensor]:
  return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _check_devices(func: Any, args: tuple, kwargs: dict) -> None:
  """torch's rule: every tensor of an op on one device, except 0-dim CPU tensors (scalars)."""
  devs = {str(t.device) for t in _tensors((args, kwargs)) if not (t.device.type == "cpu" and t.dim() == 0)}
  if len(devs) > 1:
    a, b = sorted(devs)[:2]
    raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {b} and {a}! "
                       f"(when calling {func})")


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


def _write_outs(dst: Any, src: Any) -> None:
  """Write an op's result(s) into its out= tensor(s); an out= tensor of another shape is resized first, with torch's
  warning when it had elements (torch's `resize_output`)."""
  if isinstance(dst, TinyTensor):
    if tuple(dst.shape) != tuple(src.shape):
      if dst.numel() != 0:
        warnings.warn(f"An output with one or more elements was resized since it had shape {list(dst.shape)}, which "
                      f"does not match the required output shape {list(src.shape)}. This behavior is deprecated, and "
                      "in a future PyTorch release outputs will not be resized unless they have zero elements. You "
                      "can explicitly reuse an out tensor t by resizing it, inplace, to zero elements with "
                      "t.resize_(0).", UserWarning, stacklevel=4)
      resize(dst, tuple(src.shape))
    write(dst, read(src))
  elif isinstance(dst, (tuple, list)):
    for d, s in zip(dst, src): _write_outs(d, s)


def _overload(packet: Any, names: list[str]) -> Any:
  for n in names:
    if n in packet.overloads(): return getattr(packet, n)
  return None


def _functional_of(func: Any) -> Any:
  """The functional op of an in-place `foo_.X` (`foo.X`) or an `out=` `foo.X_out` / `foo.out` (`foo.X`/`foo`)."""
  name, ov = func._schema.name.split("::")[1], func._overloadname
  if name.endswith("_") and not name.endswith("__"): name = name[:-1]
  packet = getattr(torch.ops.aten, name, None)
  if packet is None: return None
  if any(a.is_out for a in func._schema.arguments):
    # the overload taking the same arguments less the out= ones (and optional keywords: arange's dtype, device)
    pos = [(a.name, str(a.type)) for a in func._schema.arguments if not a.is_out and not a.kwarg_only]
    kw = {(a.name, str(a.type)) for a in func._schema.arguments if not a.is_out and a.kwarg_only}
    for cand in packet.overloads():
      args = getattr(packet, cand)._schema.arguments
      if [(a.name, str(a.type)) for a in args if not a.kwarg_only] == pos and all(
          (a.name, str(a.type)) in kw or a.has_default_value() for a in args if a.kwarg_only) and \
          kw <= {(a.name, str(a.type)) for a in args}: return getattr(packet, cand)
  if ov == "out": return _overload(packet, ["default", "Tensor"])
  if ov.endswith("_out"): return _overload(packet, [ov[:-4], "default"])
  return _overload(packet, [ov, "default"])


def _mutated_args(func: Any, args: tuple, kwargs: dict) -> tuple[list[Any], list[Any]]:
  """(positional/keyword values that the op writes, the out= ones among them)."""
  written, outs = [], []
  for i, a in enumerate(func._schema.arguments):
    if a.alias_info is None or not a.alias_info.is_write: continue
    val = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
    written.append(val)
    if a.is_out: outs.append(val)
  return written, outs


def _run_foreach(func: Any, args: tuple, kwargs: dict) -> Any:
  """`_foreach_op(lists...)`: the op on each element (`aten.op`, in place for `_foreach_op_`)."""
  name, ov = func._schema.name.split("::")[1][len("_foreach_"):], func._overloadname
  packet = getattr(torch.ops.aten, name)
  order = {"Scalar": ["Scalar", "Tensor", "default"], "ScalarList": ["Scalar", "Tensor", "default"],
           "List": ["Tensor", "default"], "Tensor": ["Tensor", "default"], "default": ["default", "Tensor", "self"]}
  op = _overload(packet, order.get(ov, [ov, "default", "Tensor"]))
  if op is None: raise NotImplementedError(f"tiny_torch: no per-element op for {func}")
  n = len(args[0])

  def pick(x: Any, i: int) -> Any: return x[i] if isinstance(x, (list, tuple)) and len(x) == n else x
  outs = [dispatch(op, tuple(pick(a, i) for a in args), {k: pick(v, i) for k, v in kwargs.items()})
          for i in range(n)]
  return None if name.endswith("_") else outs


def _cpu_run(func: Any, args: tuple, kwargs: dict) -> Any:
  name = str(func)
  if name not in _warned:
    _warned.add(name)
    warnings.warn(f"tiny_torch: {name} is not implemented for the tiny device; running it on the CPU", stacklevel=3)
  index = next((t.device.index or 0 for t in _tensors((args, kwargs)) if isinstance(t, TinyTensor)), 0)
  cpu_of: dict[int, torch.Tensor] = {}

  def to_c(x: Any) -> Any:
    if isinstance(x, TinyTensor): return cpu_of.setdefault(id(x), to_cpu(x))
    return x
  out = func(*tree_map(to_c, args), **tree_map(to_c, kwargs))
  written, _ = _mutated_args(func, args, kwargs)
  for w in _tensors(written):
    if isinstance(w, TinyTensor): write(w, read(from_torch(cpu_of[id(w)], index)))
  # an output that is a written argument (in-place ops return self) is that TinyTensor; other tensors are copied
  by_id = {id(cpu_of[id(t)]): t for t in _tensors((args, kwargs)) if isinstance(t, TinyTensor) and id(t) in cpu_of}

  def back(x: Any) -> Any:
    if not isinstance(x, torch.Tensor): return x
    return by_id[id(x)] if id(x) in by_id else from_torch(x, index)
  return tree_map(back, out)


_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
             torch.ops.aten._index_put_impl_.default}


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
  """Run aten op `func` with TinyTensor arguments (stage 3 of the module docstring)."""
  from tiny_torch import ops  # the op table imports this module
  if func in ops.SPECIAL: return ops.SPECIAL[func](*args, **kwargs)
  if func in _INDEXING:  # torch lets CPU index tensors index a tensor on another device
    index = args[0].device.index or 0
    idx = [from_torch(i, index) if isinstance(i, torch.Tensor) and i.device.type == "cpu" else i for i in args[1]]
    args = (args[0], idx, *args[2:])
  _check_devices(func, args, kwargs)
  if func in ops.OPS: return _run_table(func, args, kwargs)
  implicit = func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
  if implicit: return func.decompose(*args, **kwargs)  # (`to`, `reshape`, ...: written with other aten ops)
  if func.is_view: return _run_view(func, args, kwargs)
  if func._schema.name.startswith("aten::_foreach_"): return _run_foreach(func, args, kwargs)
  written, outs = _mutated_args(func, args, kwargs)
  if written:  # (an op that also writes other arguments, like native_batch_norm, decomposes below)
    fn = _functional_of(func)
    if fn is not None and fn is not func and (fn in ops.OPS or fn in ops.DECOMPS or fn.has_kernel_for_dispatch_key(
        torch._C.DispatchKey.CompositeImplicitAutograd)):
      if outs:
        fargs = {k: v for k, v in kwargs.items() if k not in {a.name for a in func._schema.arguments if a.is_out}}
        if not _tensors((args, fargs)) and "device" in {a.name for a in fn._schema.arguments}:
          # a factory's out= variant (arange.start_out): the result is made on the out= tensor's device, its dtype
          res = fn(*args, **fargs, dtype=outs[0].dtype, device=outs[0].device)
        else: res = dispatch(fn, args, fargs)
        _write_outs(outs[0] if len(outs) == 1 else outs, res)
        return outs[0] if len(outs) == 1 else tuple(outs)
      if len(written) == 1 and written[0] is args[0]:
        res = dispatch(fn, args, kwargs)
        write(args[0], read(res))
        return args[0]
  if func in ops.DECOMPS: return ops.DECOMPS[func](*args, **kwargs)
  if _cpu_fallback[0]: return _cpu_run(func, args, kwargs)
  raise NotImplementedError(f"aten op {func} is not implemented for the tiny device (tiny_torch); "
                            "tiny_torch.allow_cpu_fallback(True) runs such ops on the CPU instead")


def _run_view(func: Any, args: tuple, kwargs: dict) -> Any:
  """A view op: new TinyTensors over the input's storage, with the sizes/strides/offset torch gives the view."""
  base = args[0]
  st, index = base._st, base.device.index or 0
  numel = base._st.data.shape[0]
  mbase = torch.empty(numel, dtype=base.dtype, device="meta").as_strided(base.shape, base.stride(),
                                                                          base.storage_offset())
  margs = (mbase,) + tree_map(_to_meta, args[1:])
  out = func(*margs, **tree_map(_to_meta, kwargs))
  if isinstance(out, torch.Tensor) and out.dtype != base.dtype:
    raise NotImplementedError(f"{func}: a view as another dtype ({base.dtype} -> {out.dtype}) is not supported on "
                              "the tiny device")

  def mk(m: Any) -> Any:
    if not isinstance(m, torch.Tensor): return m
    return TinyTensor(st, tuple(m.shape), tuple(m.stride()), m.storage_offset(), m.dtype, index)
  return tree_map(mk, out)


def _run_table(func: Any, args: tuple, kwargs: dict) -> Any:
  from tiny_torch import ops
  meta = None if func in ops.NO_META else meta_run(func, args, kwargs)
  targs, tkwargs = tree_map(_unwrap, args), tree_map(_unwrap, kwargs)
  if (policy := ops.PROMOTE.get(func)) is not None:
    if policy == ops.OUT:
      if meta is None: raise RuntimeError(f"{func}: its dtype comes from the meta run's output, but it is in NO_META")
      dt = (meta[0] if isinstance(meta, (tuple, list)) else meta).dtype
    else: dt = torch.result_type(*[_to_meta(a) for a in args[:2]]) if len(args) > 1 else args[0].dtype
    tdt = TORCH_TO_TINY[dt]
    targs = tuple(a.cast(tdt) if isinstance(a, Tensor) and a.dtype != tdt else a for a in targs)
    tkwargs = {k: a.cast(tdt) if isinstance(a, Tensor) and a.dtype != tdt else a for k, a in tkwargs.items()}
  out = ops.OPS[func](*targs, **tkwargs)
  if func in ops.RAW_OUT: return out
  return _wrap_out(out, meta, func)


# ***** registration *****

def _factory(size: Any, dtype: Any, device: Any, fill: Callable[[tuple[int, ...], Any, str], Tensor]) -> TinyTensor:
  dt = dtype if dtype is not None else torch.get_default_dtype()
  shape = tuple(int(s) for s in size)
  return wrap(fill(shape, to_tiny_dtype(dt), tiny_device_name(_dev_index(device))), dt)


def _empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
           memory_format: Any = None) -> TinyTensor:
  return _factory(size, dtype, device, lambda s, d, dev: Tensor.zeros(*s, dtype=d, device=dev).contiguous())


def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> TinyTensor:
  return _empty(size, dtype, layout, device)


def _full(size: Any, fill_value: Any, dtype: Any = None, layout: Any = None, device: Any = None,
          pin_memory: Any = None) -> TinyTensor:
  if dtype is None:
    dtype = torch.bool if isinstance(fill_value, bool) else torch.int64 if isinstance(fill_value, int) else \
      torch.get_default_dtype()
  return _factory(size, dtype, device, lambda s, d, dev: Tensor.full(s, fill_value, dtype=d, device=dev).contiguous())


def _arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None, layout: Any = None, device: Any = None,
            pin_memory: Any = None) -> TinyTensor:
  if dtype is None:
    dtype = torch.int64 if all(isinstance(x, int) for x in (start, end, step)) else torch.get_default_dtype()
  cpu = torch.arange(start, end, step, dtype=dtype)  # torch's own length and values (rounding of float steps)
  return from_torch(cpu, _dev_index(device))


def _scalar_tensor(s: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> Any:
  return from_torch(torch.scalar_tensor(s, dtype=dtype or torch.get_default_dtype()), _dev_index(device))


class _DeviceModule(types.ModuleType):
  """`torch.tiny`: what torch asks of a device module (availability, count, current device, seeding)."""

  def __init__(self) -> None:
    super().__init__("torch.tiny")
    self._current = 0

  def is_available(self) -> bool:
    """Whether tiny has a default device (it always has: the CPU at least)."""
    return True

  def is_initialized(self) -> bool:
    """torch asks this before lazy initialization; there is none to do."""
    return True

  def _is_in_bad_fork(self) -> bool:
    return False

  def device_count(self) -> int:
    """How many `tiny:N` devices there are: the default tiny device's count when it reports one, else 1."""
    return int(getattr(Device[Device.DEFAULT], "device_count", 1) or 1)

  def current_device(self) -> int:
    """The index `tiny` means without one."""
    return self._current

  def set_device(self, index: int) -> None:
    """Make `tiny` mean `tiny:index`."""
    self._current = int(index)

  def manual_seed(self, seed: int) -> None:
    """Random numbers on tiny come from torch's CPU generator: torch.manual_seed already seeds them."""

  def manual_seed_all(self, seed: int) -> None:
    """See manual_seed."""

  def synchronize(self, device: Any = None) -> None:
    """Wait for the device: realize every pending in-place write."""
    flush()


_registered = [False]


def register() -> None:
  """Register the `tiny` device (idempotent): PrivateUse1 renamed, a Python device guard, the factory ops."""
  if _registered[0]: return
  _registered[0] = True
  from torch.utils import backend_registration
  setup = getattr(backend_registration, "_setup_privateuseone_for_python_backend", None)
  if setup is None:
    raise ImportError(f"tiny_torch needs a torch with a Python device guard for PrivateUse1 "
                      f"(torch.utils.backend_registration._setup_privateuseone_for_python_backend); torch "
                      f"{torch.__version__} has none: upgrade torch (tested with 2.13)")
  setup(rename=BACKEND, backend_module=_DeviceModule())
  lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
  _libs.append(lib)
  lib.impl("empty.memory_format", _empty)
  lib.impl("empty_strided", _empty_strided)
  lib.impl("full", _full)
  lib.impl("arange.start_step", _arange)
  lib.impl("scalar_tensor", _scalar_tensor)
  from tiny_torch import ops  # torch.tensor(data, device="tiny") copies with the Python key off: these see it
  lib.impl("_copy_from", ops.SPECIAL[torch.ops.aten._copy_from.default])
  lib.impl("_copy_from_and_resize", ops.SPECIAL[torch.ops.aten._copy_from_and_resize.default])


_libs: list[Any] = []


# TorchDynamo can't trace this Python subclass: code under torch.compile that meets a TinyTensor graph-breaks and runs
# eagerly, and the eager dispatch must not itself be traced (it would be compiled as a graph over meta tensors)
_dispatch_untraced = torch._dynamo.disable(dispatch, recursive=True)
