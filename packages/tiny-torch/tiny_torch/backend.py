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

Layers: stage 2 (`TinyTensor`, `Storage`, `read`/`write`, host copies) lives in `tiny_torch._core`, below the op
tables (`tiny_torch.ops`, `tiny_torch.ops_nn`), which this module's dispatcher reads; the dispatcher is passed down to
`_core` with `set_dispatcher` at import. This module re-exports `_core`'s public names.
"""
from __future__ import annotations

import types
import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map
from tiny_tensor import Device, Tensor

from tiny_torch import ops
from tiny_torch._core import (BACKEND, FLUSH_WRITES, TINY_TO_TORCH, TORCH_TO_TINY, Storage, TinyTensor, _dev_index,
                              _tensors, _to_meta, _unwrap, _wrap_out, flush, from_torch, meta_run, read, resize,
                              set_dispatcher, tiny_device_name, to_cpu, to_tiny_dtype, torch_index, wrap, write)

__all__ = ["BACKEND", "FLUSH_WRITES", "TINY_TO_TORCH", "TORCH_TO_TINY", "Storage", "TinyTensor", "allow_cpu_fallback",
           "dispatch", "flush", "from_torch", "meta_run", "read", "register", "resize", "tiny_device_name", "to_cpu",
           "to_tiny_dtype", "torch_index", "wrap", "write"]


# ***** dispatch *****

_cpu_fallback = [False]
_warned: set[str] = set()


def allow_cpu_fallback(enabled: bool = True) -> None:
  """Run aten ops the tiny backend lacks on the CPU (copying the tensors there and back, with a warning naming each
  op once) instead of raising NotImplementedError. Off by default: a missing op is an error naming it."""
  if not isinstance(enabled, bool): raise TypeError(f"allow_cpu_fallback takes a bool, got {enabled!r}")
  _cpu_fallback[0] = enabled


def _check_devices(func: Any, args: tuple, kwargs: dict) -> None:
  """torch's rule: every tensor of an op on one device, except 0-dim CPU tensors (scalars)."""
  devs = {str(t.device) for t in _tensors((args, kwargs)) if not (t.device.type == "cpu" and t.dim() == 0)}
  if len(devs) > 1:
    a, b = sorted(devs)[:2]
    raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {b} and {a}! "
                       f"(when calling {func})")


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
  # torch.tensor(data, device="tiny") copies with the Python key off: these see it
  lib.impl("_copy_from", ops.SPECIAL[torch.ops.aten._copy_from.default])
  lib.impl("_copy_from_and_resize", ops.SPECIAL[torch.ops.aten._copy_from_and_resize.default])


_libs: list[Any] = []


# the tensor below the op tables (tiny_torch._core) reaches the dispatcher through this: ops can't be imported there
set_dispatcher(dispatch)
