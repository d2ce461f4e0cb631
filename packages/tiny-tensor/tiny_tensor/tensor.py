"""`Tensor`: a lazy n-dimensional array over the UOp graph, with autograd (the public API follows tinygrad's).

Every op builds UOps (docs/PIPELINE.md §1); nothing runs until `realize()`, `numpy()`, `item()`, `tolist()` or
`data()`. Data given as a list/numpy array/bytes is copied into a device buffer at once.

Realize (engine.py) returns the scheduler's `becomes` map; every live tensor whose node was realized then points at
its buffer, and lazy tensors whose graphs use a realized node get the buffer substituted in. A realized tensor keeps
the graph it came from (`_origin`) so that backward still reaches the leaves. Creation and random numbers live in
creation.py, indexing in indexing.py, autograd rules in gradient.py; the higher-level ops (conv2d, losses, ...) in
nnops.py and the composed math ops in mathops.py: each of those modules is a mixin class that `Tensor` inherits.

>>> from tiny_tensor import Tensor
>>> (Tensor([1.0, 2.0, 3.0]) * 2 + 1).tolist()
[3.0, 5.0, 7.0]
"""
from __future__ import annotations

import itertools
import math
import os
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tiny_uop.dtype import (_FLOATS, _INTS, DType, dtypes, float_to_narrow_bits, from_numpy, least_upper_dtype,
                            least_upper_float, ml_dtypes_name, narrow_bits_to_float32, sum_acc_dtype, to_dtype,
                            to_numpy, truncate_int)
from tiny_uop.helpers import TRAINING, Context, ceildiv, polyN, prod, unwrap
from tiny_uop.uop import _INTERN, GroupOp, Ops, UOp, sint
from tiny_tensor import engine
from tiny_tensor import multi as _multi
from tiny_tensor.creation import CreationMixin
from tiny_tensor import gradient as _gradient
from tiny_tensor.gradient import compute_gradient
from tiny_tensor.helpers import ArgumentError as _ArgumentError
from tiny_tensor.helpers import DTypeArgumentError as _DTypeArgumentError
from tiny_tensor.helpers import _assign_view, _base_buffer, _broadcast_shape, _canonical_device, argfix
from tiny_tensor.indexing import IndexingMixin, _view_bottom_buffer
from tiny_tensor.mathops import MathOpsMixin, bitcast_sized, with_gradient
from tiny_tensor.nnops import NNOpsMixin, float_divmod
from tiny_tensor.live import (_grad_tensors, _lazy_tensors, _leaf_tensors, _live, _origin_tensors, _real_tensors,
                              _registry_lock)

__all__ = ["Tensor"]


# ops read on every eager op, as module constants (on Python 3.11 each `Ops.X` read costs ~0.1 us: see tiny_uop.uop)
_MULTI, _BUFFER, _RESHAPE, _ASSIGN, _COPY = Ops.MULTI, Ops.BUFFER, Ops.RESHAPE, Ops.ASSIGN, Ops.COPY
_ADD, _MUL = Ops.ADD, Ops.MUL
_PY_SCALARS = (int, float, bool)
_pending_lock = threading.Lock()  # making a pending result's view (`Tensor._uop`): one view per result
_scalar_cache: dict[tuple, UOp] = {}  # (dtype, repr(value), device, shape) -> the broadcast constant
_SAME_DTYPE_OPS = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR})  # result dtype = operands' dtype


def tensor_seq(fname: str, first: Any, rest: tuple) -> list[Tensor]:
  """The tensors of `Tensor.stack(a, b)`, `a.stack(b)` or `Tensor.stack((a, b))` / `([a, b])` (as tinygrad's `stack`
  and torch's `stack`/`cat` take them); anything that is not a Tensor is a TypeError naming it."""
  ts = list(first) + list(rest) if isinstance(first, (tuple, list)) else [first, *rest]
  if not ts: raise ValueError(f"{fname} needs at least one tensor, got an empty sequence")
  if bad := [t for t in ts if not isinstance(t, Tensor)]:
    raise TypeError(f"{fname} takes Tensors (separately or as one tuple/list), got {type(bad[0]).__name__} {bad[0]!r}")
  return ts


def _np_from(data: Any, dtype: DType | None) -> np.ndarray:
  try: arr = np.array(data)
  except ValueError as e: raise ValueError(f"can't make a Tensor from a ragged nested sequence: {e}") from e
  if arr.dtype == object:
    raise TypeError(f"can't make a Tensor from {type(data).__name__} with items of mixed or unknown types")
  return arr


class _TensorMeta(type):
  @property
  def training(cls) -> bool:
    """Training mode (dropout etc.); `Context(TRAINING=1)` or `Tensor.training = True` sets it."""
    return bool(TRAINING.value)

  @training.setter
  def training(cls, v: bool) -> None: TRAINING.value = int(bool(v))

  @training.deleter
  def training(cls) -> None:  # `monkeypatch.setattr(Tensor, "training", ...)` undoes with a delete: back to the default
    from tiny_uop.helpers import getenv
    TRAINING.value = getenv("TRAINING", 0)


_weakref = weakref.ref  # (a module constant: read on the eager hot path)


def _plain_sizes(shape: tuple) -> bool:
  """Whether every dim of `shape` is a non-negative int (not a bool, not symbolic, not -1 or None)."""
  for s in shape:  # (a loop, not all(): graph building's hot path)
    if s.__class__ is not int or s < 0: return False
  return True


class Tensor(CreationMixin, IndexingMixin, NNOpsMixin, MathOpsMixin, metaclass=_TensorMeta):
  """A lazy n-dimensional array: `Tensor(data, device=None, dtype=None, requires_grad=None)`.

  `data` is a Python scalar (a lazy constant), a (nested) list/tuple, a numpy array, `bytes` (uint8), a `UOp`, or None
  (an empty tensor).

  >>> Tensor([[1, 2], [3, 4]]).shape
  (2, 2)
  >>> (Tensor([1.0, 2.0]) * 2 + 1).tolist()
  [3.0, 5.0]
  """
  # `_u`: the UOp graph or buffer view (read through `_uop`); None while the tensor holds a replay's pending result
  # (`_pend`, see `_uop`), whose nodes are made on first read
  __slots__ = ("_u", "_pend", "_requires_grad", "grad", "_origin_uop", "__weakref__")
  _u: UOp | None
  _pend: engine.Pending | None
  __array_ufunc__ = None  # `np.float32(2) * t` defers to Tensor.__rmul__ instead of making an object array

  def __init__(self, data: Any = None, device: str | None = None, dtype: Any = None, requires_grad: bool | None = None):
    dt = to_dtype(dtype) if dtype is not None else None
    if isinstance(data, UOp):
      uop = data if dt is None or data.dtype == dt else data.cast(dt)
      if uop.device is None and uop.shape == ():  # a bound Variable: a scalar value on a device
        uop = UOp.const(uop.dtype, 0, _canonical_device(device), ()).alu(Ops.ADD, uop)
      if device is not None and isinstance(data.device, str) and _canonical_device(device) != data.device:
        uop = uop.copy_to_device(_canonical_device(device))
    elif isinstance(device, (tuple, list)):  # data on several devices: made on the first, copied to the others
      uop = _multi.shard_uop(Tensor(data, device=device[0], dtype=dtype).uop, _canonical_device(device), None)
    else:
      dev = _canonical_device(device)
      if data is None: uop = engine.buffer_from_bytes(dev, 0, dt or dtypes.default_float, None)
      elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
        dt = dt or dtypes.from_py(data)  # an int beyond int32 picks int64/uint64 (an explicit int dtype wraps)
        uop = UOp.const(dt, dtypes.as_const(data, dt), dev, ())
      elif isinstance(data, (bytes, bytearray, memoryview)):
        uop = self._from_numpy(np.frombuffer(bytes(data), dtype=np.uint8), dev, dt)
      elif isinstance(data, (list, tuple)):
        dt = dt or dtypes.from_py(data)
        arr = _np_from(data, dt)
        uop = self._from_numpy(arr, dev, dt)
      elif isinstance(data, (np.ndarray, np.generic)): uop = self._from_numpy(np.asarray(data), dev, dt)
      else:
        raise TypeError(f"can't make a Tensor from {type(data).__name__}; valid: scalar, list, tuple, numpy array, "
                        f"bytes, UOp or None")
    self.uop = uop
    self.grad: Tensor | None = None
    self._origin_uop: UOp | None = None
    self.requires_grad = requires_grad

  @staticmethod
  def _from_numpy(arr: np.ndarray, dev: str, dt: DType | None) -> UOp:
    target = dt if dt is not None else from_numpy(arr.dtype)
    if (ml := ml_dtypes_name(target)) is not None and (arr.dtype.name == ml or target in dtypes.fp8s):
      # an ml_dtypes array of the type: its bits as they are; fp8 from other data: rounded here (no device computes
      # fp8, so a lazy cast could never run)
      bits = arr.view(f"u{arr.dtype.itemsize}") if arr.dtype.name == ml else float_to_narrow_bits(arr, target)
      bits = np.ascontiguousarray(bits).reshape(arr.shape)
      return engine.buffer_from_bytes(dev, bits.size, target, bits.tobytes() if bits.size else None).reshape(arr.shape)
    try: npdt = to_numpy(target)
    except TypeError: npdt = None  # bfloat16: store as float32, cast lazily
    if npdt is None:
      return Tensor._from_numpy(arr.astype(np.float32), dev, dtypes.float32).cast(target)
    if arr.dtype != npdt:
      if target == dtypes.bool: arr = arr != 0
      else:
        with np.errstate(all="ignore"): arr = arr.astype(npdt)
    arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (np.ascontiguousarray would make 0-d 1-d)
    buf = engine.buffer_from_bytes(dev, arr.size, target, arr.tobytes() if arr.size else None)
    return buf.reshape(arr.shape)

  @staticmethod
  def _new(uop: UOp, requires_grad: bool | None = None) -> Tensor:
    t = object.__new__(Tensor)
    t.uop, t._requires_grad, t.grad, t._origin_uop = uop, requires_grad, None, None
    if requires_grad:  # propagated from an input: not a leaf
      with _registry_lock: _grad_tensors[id(t)] = t
    return t

  @staticmethod
  def _new_lazy(uop: UOp, requires_grad: bool | None) -> Tensor:
    """`Tensor._new(uop, requires_grad)` for an op node over a source on one device (a str) and a constant: not a
    buffer view, not sharded, so the `uop` setter's checks are known (the eager hot path: `a + 1`)."""
    t = object.__new__(Tensor)
    t._u, t._requires_grad, t.grad, t._origin_uop = uop, requires_grad, None, None  # (`_pend` unread while `_u` set)
    _registry_lock.acquire()  # (not `with`: see `realize`)
    try:
      (d := _lazy_tensors.data)[id(t)] = _weakref(t)  # `_lazy_tensors[id(t)] = t`, inlined (the eager hot path)
      if len(d) > _lazy_tensors.limit: _lazy_tensors.live()
      if requires_grad: _grad_tensors[id(t)] = t  # propagated from an input: not a leaf
    finally: _registry_lock.release()
    return t

  def _wrap(self, uop: UOp, *others: Tensor) -> Tensor:
    """A new tensor of `uop` (an op over self and `others`): requires_grad True if any operand's is, else None if
    any's is None, else False."""
    rg = self._requires_grad
    if others:  # (a loop, not lists and any(): every op's result comes through here)
      for o in others:
        if (org := o._requires_grad): rg = org
        elif org is None and not rg: rg = None
    return Tensor._new(uop, True if rg else (None if rg is None else False))

  @staticmethod
  def from_uop(u: UOp, device: str | None = None) -> Tensor:
    """A Tensor around an existing UOp (a BIND becomes a scalar constant)."""
    return Tensor(u, device=device)

  # ***** properties *****
  @property
  def _uop(self) -> UOp:
    """The UOp graph (or realized buffer view) this tensor is, without the `uop` setter's checks on writes. An eagerly
    realized result (`engine._replay_root_locked`) holds its new Buffer pending, with no nodes yet: its BUFFER view is
    made here on first read (once, whichever thread reads first), so a result dropped unread costs no interning."""
    if (u := self._u) is not None: return u
    with _pending_lock:
      if (u := self._u) is None:
        if (p := self._pend) is None: raise RuntimeError("Tensor holds neither a graph nor a pending result (a bug)")
        u = self._u = engine.pending_view(p)
        self._pend = None
    return u

  @_uop.setter
  def _uop(self, u: UOp) -> None:
    self._u = u
    self._pend = None

  @property
  def uop(self) -> UOp:
    """The UOp graph (or realized buffer view) this tensor is."""
    return u if (u := self._u) is not None else self._uop  # (the slot first: read on every op)

  @uop.setter
  def uop(self, u: UOp) -> None:
    if (op := u.op) is not _MULTI and (isinstance(u.device, tuple) or (op is _COPY and u.src[0].op is _MULTI)):
      u = _multi.lower(u)  # an op on a sharded tensor (or a gather of one to a single device)
      op = u.op
    self._u, self._pend = u, None  # (the `_uop` setter, inlined: every op's result comes through here)
    if op is not _BUFFER and (op is not _RESHAPE or u.src[0].op is not _BUFFER):  # not is_realized(u)
      with _registry_lock:  # `_lazy_tensors[id(self)] = self`, inlined
        (d := _lazy_tensors.data)[id(self)] = _weakref(self)
        if len(d) > _lazy_tensors.limit: _lazy_tensors.live()
    else:  # a leaf backward may fill .grad of (found through here when it is in no other registry)
      with _registry_lock: _real_tensors[id(self)] = self

  @property
  def requires_grad(self) -> bool | None:
    """Whether backward() fills this tensor's `.grad`: None (the default) and True when it is a float tensor in the
    graph (True also gives a constant-only tensor a buffer of its own, and makes optimizers train it); False never
    (`detach()` gives False). An op's result is True if an operand is, else None if one is, else False."""
    return self._requires_grad

  @requires_grad.setter
  def requires_grad(self, v: bool | None) -> None:
    self._requires_grad = v
    if v:
      if not _has_identity(self._uop): self._materialize()
      with _registry_lock: _grad_tensors[id(self)] = _leaf_tensors[id(self)] = self

  def _materialize(self) -> None:
    """Compute this tensor into a fresh buffer of its own, now. A parameter is an identity: built from constants
    alone (`Tensor(2.0)`, `Tensor.zeros(3)`, arange) its graph would be the very node (UOps are hash-consed) of every
    equal constant, which would then share its gradient."""
    shape = tuple(int(s) for s in self.shape)
    buf = engine.buffer_from_bytes(self.device, prod(shape), self.dtype, None).reshape(shape)
    self.uop = buf.assign(self._uop)
    self.realize()

  @property
  def _origin(self) -> UOp | None:
    """The graph this tensor had before realize swapped it for a buffer (autograd goes through it)."""
    return self._origin_uop

  @_origin.setter
  def _origin(self, u: UOp | None) -> None:
    self._origin_uop = u
    if u is not None:
      with _registry_lock: _origin_tensors[id(self)] = self

  @property
  def shape(self) -> tuple[sint, ...]:
    """The shape, a tuple of ints (or symbolic UOps)."""
    if (u := self._u) is None:
      if (p := self._pend) is not None: return (p[2],) if p[4] is None else p[4]  # pending: read, no view made
      u = self._uop
    if (s := u.shape) is None: raise RuntimeError(f"Tensor's UOp {u.op} has no shape")
    return s

  @property
  def dtype(self) -> DType:
    """The element type."""
    if (u := self._u) is None:
      if (p := self._pend) is not None: return p[3]  # pending: read, no view made
      u = self._uop
    return u.dtype
  @property
  def device(self) -> Any:
    """The canonical name of the device the data lives on (a tuple of names for a sharded tensor)."""
    if (u := self._u) is None:
      if (p := self._pend) is not None: return p[1].arg  # pending: read, no view made
      u = self._uop
    d = u.device
    return d if isinstance(d, (str, tuple)) else str(d)
  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def max_shape(self) -> tuple[int, ...]:
    """The shape with every symbolic dim replaced by its maximum."""
    return tuple(s if isinstance(s, int) else int(s.vmax) for s in self.shape)
  def numel(self) -> sint:
    """Number of elements.

    >>> Tensor.ones(2, 3).numel()
    6
    """
    return prod(self.shape)

  def size(self, dim: int | None = None) -> sint | tuple[sint, ...]:
    """The shape, or the size of one dim."""
    return self.shape if dim is None else self.shape[self._resolve_dim(dim)]
  def element_size(self) -> int:
    """Bytes per element."""
    return self.dtype.itemsize
  def nbytes(self) -> int:
    """Bytes of all elements."""
    return int(self.numel()) * self.element_size()
  def is_floating_point(self) -> bool:
    """True for float dtypes."""
    return dtypes.is_float(self.dtype)
  @property
  def T(self) -> Tensor:
    """The transpose of a 2-D tensor (last two axes swapped for more)."""
    return self.transpose()
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return int(self.shape[0])
  def __iter__(self) -> Iterator[Tensor]: return (self[i] for i in range(len(self)))
  def __bool__(self) -> bool: raise TypeError("the truth value of a Tensor is ambiguous; use .item(), .any() or .all()")
  __hash__ = object.__hash__

  def __repr__(self) -> str:
    state = "realized" if engine.is_realized(self.uop) else "lazy"
    return (f"<Tensor shape={self.shape} dtype={self.dtype!r} device={self.device} {state}"
            f"{' requires_grad' if self.requires_grad else ''} grad={'None' if self.grad is None else 'set'}>")

  # ***** running and data access *****
  def realize(self, *lst: Tensor) -> Tensor:
    """Compute this tensor (and the others given) into device buffers. `Tensor.realize(a, b)` works too.

    >>> t = (Tensor([1.0, 2.0]) + 1).realize()
    >>> t.uop.op
    Ops.BUFFER
    """
    if not lst and ((u := self._u) is None or u.op is _BUFFER or (u.op is _RESHAPE and u.src[0].op is _BUFFER)):
      return self  # a replay's pending result, or a realized buffer (a view of one): nothing to run, no graph to walk
    # the locks of the eager hot path are taken by acquire/release, not `with` (a with statement looks up __enter__
    # and __exit__ and makes two bound methods: ~1k machine instructions a lock)
    (elock := engine.lock).acquire()  # other threads' realizes see this one's results whole (see tiny_tensor.engine)
    try:
      tried = False
      u = self._u
      if not lst and u is None: return self  # realized by another thread meanwhile
      if not lst and u is not None and (op := u.op) is not _MULTI and op is not _BUFFER and \
         (op is not _RESHAPE or u.src[0].op is not _BUFFER):  # one lazy tensor (not is_realized(u)): the eager hot path
        _registry_lock.acquire()  # (`_lazy_tensors.only_one(self)`'s first case read inline: self alone)
        try:
          alone = tried = (len(d := _lazy_tensors.data) == 1 and (r := d.get(id(self))) is not None and r() is self) \
            or _lazy_tensors.only_one(self)
        finally: _registry_lock.release()
        if alone and (got := engine._replay_root_locked(u)) is not None:  # a cached op: its recorded kernels
          view, pend = got
          if pend is not None: _take_fresh(self, pend)
          elif view is not None: _take_realized(self, view)
          return self
      ts = [self, *lst]
      uops = [s for t in ts for s in (t._uop.src if t._uop.op is _MULTI else (t._uop,))]  # sharded: its shards
      with _registry_lock: alone = _lazy_tensors.only(ts)
      if alone:  # no other lazy tensor: none reads old values or shares nodes
        if (becomes := engine.realize(uops, replay=not tried)) and not _apply_becomes_alone(ts, becomes):
          _apply_becomes(becomes)
        return self
      else:
        # a lazy tensor that reads a buffer this realize writes (e.g. the loss, after opt.step()) is computed in the
        # same schedule (which reads before it writes), unless the values it reads get buffers anyway: as if run
        # eagerly
        uops += [s for t in _old_value_readers(uops, ts) for s in _shards(t.uop)]
        becomes = engine.realize(uops, _shared_with_other_graphs(uops))
      if becomes: _apply_becomes(becomes)
    finally: elock.release()
    return self

  def schedule(self, *lst: Tensor) -> Any:
    """The scheduler's result for this tensor (and others), without running it."""
    from tiny_codegen.schedule import create_schedule
    return create_schedule(UOp.sink(*[t.uop for t in (self, *lst)]))

  def _buffer(self) -> Any:
    self.realize()
    if self._u is None and (p := self._pend) is not None: return p[0]  # a replay's pending result: its Buffer
    if (bv := engine.buffer_view(self.uop)) is None:
      raise RuntimeError(f"realize left {self.uop.op} instead of a buffer; the scheduler must map it in becomes")
    return engine.get_buffer(bv[0]).ensure_allocated()

  def numpy(self) -> np.ndarray:
    """The data as a numpy array (computes it first). bfloat16/fp8 come back as float32.

    >>> Tensor([[1, 2], [3, 4]]).T.numpy()
    array([[1, 3],
           [2, 4]], dtype=int32)
    """
    if isinstance(self.device, tuple): return self.to(self.device[0]).numpy()
    shape = tuple(int(s) for s in self.shape)
    narrow = ml_dtypes_name(self.dtype) is not None  # bfloat16/fp8: their bits, decoded on the host (exact)
    npdt = np.dtype(f"u{self.dtype.itemsize}") if narrow else to_numpy(self.dtype)
    if prod(shape) == 0: return np.zeros(shape, dtype=np.float32 if narrow else npdt)
    with engine.lock:  # a device's queues are the engine's to drive: one thread at a time
      data = self._buffer().as_buffer()
    arr = np.frombuffer(data, dtype=npdt).reshape(shape)
    return narrow_bits_to_float32(arr, self.dtype) if narrow else arr

  def data(self) -> memoryview:
    """The data as a memoryview of the tensor's shape."""
    return self.numpy().copy(order="C").data

  def item(self) -> Any:
    """The single element as a Python number."""
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with exactly one element, got shape {self.shape}")
    return self.numpy().reshape(-1)[0].item()

  def tolist(self) -> Any:
    """The data as (nested) Python lists."""
    return self.numpy().tolist()

  def to(self, device: str | tuple[str, ...] | None) -> Tensor:
    """This tensor on another device (a COPY); a tuple of devices replicates it there, and a sharded tensor moved to
    one device is gathered there."""
    dev = _canonical_device(device)
    if dev == self.device: return self
    if isinstance(dev, tuple):
      if isinstance(self.device, tuple): raise RuntimeError(f"can't move a tensor sharded on {self.device} to {dev}")
      return self.shard(dev)
    ret = self._wrap(self.uop.copy_to_device(dev))
    return ret

  def shard(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
    """This tensor split along `axis` into equal parts over `devices` (None: a full copy on each), as one tensor
    whose ops run on every device (see multi.py).

    >>> Tensor([[1, 2], [3, 4]]).shard(("CPU:0", "CPU:1"), axis=0).sum(1).tolist()
    [3, 7]
    """
    if isinstance(self.device, tuple): raise RuntimeError(f"can't shard a tensor that is already on {self.device}")
    devs = _canonical_device(tuple(devices))
    if len(devs) == 1: return self.to(devs[0])
    return self._wrap(_multi.shard_uop(self.uop, devs, None if axis is None else self._resolve_dim(axis)))

  def shard_(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
    """Shard this tensor in place; returns self."""
    self.uop = self.shard(devices, axis).uop
    return self

  def shard_like(self, y: Tensor) -> Tensor:
    """This tensor sharded like `y` (same devices and axis)."""
    if not isinstance(y.device, tuple): return self.to(y.device)
    return self.shard(y.device, y.uop.arg)

  def to_(self, device: str | None) -> Tensor:
    """Move this tensor to another device in place."""
    self.uop = self.to(device).uop
    return self

  def clone(self) -> Tensor:
    """A copy in its own buffer."""
    return Tensor.empty(self.shape, dtype=self.dtype, device=self.device, requires_grad=self.requires_grad).assign(self)

  def assign(self, x: Any) -> Tensor:
    """Write `x` into this tensor (in place for a realized tensor: an ASSIGN into its buffer)."""
    if not isinstance(x, Tensor): x = Tensor(x, device=self.device, dtype=self.dtype)
    if x.device != self.device: raise RuntimeError(f"assign: value is on {x.device}, target on {self.device}")
    if x.shape != self.shape: x = x._broadcast_to(self.shape)
    if x.dtype != self.dtype: raise RuntimeError(f"assign: dtype mismatch, target is {self.dtype}, value is {x.dtype}")
    if self.uop.op is Ops.MULTI and all(engine.is_realized(u) or u.op is Ops.ASSIGN for u in self.uop.src):
      self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, x.uop))  # lowered into one ASSIGN per shard
    elif engine.is_realized(self.uop): self.uop = self.uop.assign(x.uop)
    elif self.uop.op is Ops.ASSIGN: self.uop = self.uop.src[0].assign(x.uop)
    elif (view := _assign_view(self.uop)) is not None:
      # a view (reshape, permute, shrink at int or Variable offsets, flip) of a realized buffer: one kernel over the
      # view's elements writes them in the buffer, now (so every tensor on that buffer sees it, and live lazy readers
      # of the old values are computed first, in the same schedule); under TinyJit the offsets are the kernel's
      # variables, so a replay writes at the newly bound position
      if view[1] is not None:
        raise RuntimeError(f"can't assign into a view of a realized buffer made with {view[1]} (shape {self.shape}): "
                           f"an {view[1]} has no one-to-one place in the buffer; views made of reshape, permute, "
                           f"shrink and flip are writable")
      old, self.uop = self.uop, UOp(Ops.ASSIGN, self.dtype, (self.uop, x.uop))
      try: self.realize()
      except BaseException:
        self.uop = old  # a failed write leaves this view as it was
        raise
      self._origin = None
      return self
    else: self.uop = x.uop
    self._origin = None
    return self

  def replace(self, x: Tensor) -> Tensor:
    """Make this tensor point to x's graph (shapes must match)."""
    if x.shape != self.shape: raise ValueError(f"replace: shape {x.shape} is not {self.shape}")
    self.uop, self._origin = x.uop, None
    return self

  # ***** autograd *****
  def requires_grad_(self, requires_grad: bool | None = True) -> Tensor:
    """Set requires_grad in place; returns self."""
    self.requires_grad = requires_grad
    return self

  def detach(self) -> Tensor:
    """This value, cut from the gradient graph."""
    return Tensor._new(self.uop.detach(), False)

  def contiguous(self) -> Tensor:
    """This value in its own contiguous buffer once realized."""
    return self._wrap(self.uop.contiguous())

  def contiguous_backward(self) -> Tensor:
    """Identity forward; makes the gradient contiguous."""
    return self._wrap(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))

  def _root_grad(self, gradient: Tensor | None) -> Tensor:
    """The gradient flowing into self for gradient()/backward(): `gradient`, checked, or 1 for a scalar."""
    if gradient is None:
      if self.shape != ():
        raise RuntimeError(f"the gradient of a non-scalar tensor (shape {self.shape}) needs gradient= (a tensor of "
                           f"that shape), or call it on a scalar such as .sum()")
      return Tensor(1.0, dtype=self.dtype, device=self.device, requires_grad=False)
    if not isinstance(gradient, Tensor): raise TypeError(f"gradient= must be a Tensor, not {type(gradient).__name__}")
    if gradient.shape != self.shape: raise ValueError(f"gradient shape {gradient.shape} != tensor shape {self.shape}")
    return gradient

  def gradient(self, *targets: Tensor, gradient: Tensor | None = None, materialize_grads: bool = True) -> list[Tensor]:
    """d(self)/d(target) for each target, as new (lazy) tensors. A target self does not depend on (not in its graph,
    or reached only through comparisons, detach, ...) gets zeros, as in tinygrad; `materialize_grads=False` raises for
    one not in the graph instead.

    >>> x, y = Tensor([1.0, 2.0]), Tensor([3.0])
    >>> [g.tolist() for g in (x * x).sum().gradient(x, y)]
    [[2.0, 4.0], [0.0]]
    """
    gradient = self._root_grad(gradient)
    if not dtypes.is_float(self.dtype) or any(not dtypes.is_float(t.dtype) for t in targets):
      raise RuntimeError(f"only float Tensors have gradients; got {self.dtype} w.r.t. {[t.dtype for t in targets]}")
    if isinstance(self.device, tuple) or any(isinstance(t.device, tuple) for t in targets):
      mg = _multi.gradient(self, targets, gradient, _expand_origins)
      if not materialize_grads and any(g is None for g in mg): raise RuntimeError("a target is not part of the graph")
      return [t.zeros_like() if g is None else g for t, g in zip(targets, mg)]
    keep = {t.uop for t in targets if t is not self}  # (self is its own target: the root's gradient)
    root = _expand_origins(self.uop, keep)
    grads = compute_gradient(root, gradient.uop.cast(self.dtype), keep)
    if not materialize_grads:
      nodes = root.toposort()
      if lost := [t for t in targets if t is not self and t.uop not in nodes]:
        raise RuntimeError(f"{lost[0]!r} is not part of the graph of {self!r}; no gradient (materialize_grads=True "
                           f"gives zeros)")
    return [gradient.cast(self.dtype) if t is self else Tensor._new(grads[t.uop]) if t.uop in grads else
            t.zeros_like() for t in targets]

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(t) into `t.grad` for every live floating-point tensor t in self's graph, as tinygrad
    does: parameters and inputs without requires_grad=True too, and intermediate tensors still held (a realized one
    is looked through, so the gradient also reaches what it was computed from). `requires_grad=False` opts a tensor
    out; int/bool tensors get none. A tensor of constants alone (unrealized `Tensor.ones(3)`) gets none unless its
    requires_grad is True: it is the very graph node of every equal constant, whose uses can't be told apart.

    >>> w = Tensor([1.0, 2.0])
    >>> (w * w).sum().backward().item(), w.grad.tolist()
    (5.0, [2.0, 4.0])
    """
    root_grad = self._root_grad(gradient)
    if not dtypes.is_float(self.dtype):
      raise RuntimeError(f"only float Tensors have gradients; backward() on a {self.dtype} tensor (cast it first)")
    cands = _grad_candidates()
    # a leaf is a target as it is: no graph kept, set so by the user, or realized from constants alone (looking
    # through those would give a constant node); a realized derived tensor is looked through (its pre-realize graph),
    # as in torch, and is the target of the node its graph expands to
    leaves: list[Tensor] = []
    derived: list[Tensor] = []
    for t in cands:
      is_leaf = t._origin is None or id(t) in _leaf_tensors or not _has_identity(t._origin)
      (leaves if is_leaf else derived).append(t)
    keep = {s for t in leaves for s in _shards(t.uop)}
    sink = _expand_origins(UOp.sink(self.uop, *[t._origin for t in derived if t._origin is not None]), keep)
    root, nodes = sink.src[0], sink.src[0].toposort()
    pairs = [(t, t.uop) for t in leaves if any(s in nodes for s in _shards(t.uop)) and _has_identity(t.uop)]
    pairs += [(t, o) for t, o in zip(derived, sink.src[1:]) if any(s in nodes for s in _shards(o))]
    if isinstance(self.device, tuple) or any(isinstance(t.device, tuple) for t, _ in pairs):
      # sharded: through the multi-device gradient, a derived target standing in as a tensor of its expanded graph
      pairs = _multi_targets(self, pairs)
      targets = [t for t, _ in pairs]
      grads = self.gradient(*[t if n is t.uop else Tensor._new(n) for t, n in pairs], gradient=root_grad)
    else:
      targets = [t for t, _ in pairs]
      gmap = compute_gradient(root, root_grad.uop.cast(self.dtype), {n for _, n in pairs})
      grads = [Tensor._new(gmap[n]) if n in gmap else t.zeros_like() for t, n in pairs]
    for t, g in zip(targets, grads):
      if g.shape != t.shape: raise RuntimeError(f"gradient shape {g.shape} doesn't match tensor shape {t.shape}")
      g = g.cast(t.dtype) if g.dtype != t.dtype else g
      t.grad = g if t.grad is None else (t.grad + g)
    return self

  @staticmethod
  def train(mode: bool = True) -> Context:
    """`with Tensor.train():` scopes training mode."""
    return Context(TRAINING=int(mode))

  # ***** broadcasting and elementwise building blocks *****
  def _broadcast_to(self, shape: tuple[sint, ...]) -> Tensor:
    shape = tuple(shape)
    if self.shape == shape: return self
    if self.ndim > len(shape):
      raise ValueError(f"cannot broadcast tensor of shape {self.shape} to {shape}: too few dims")
    padded = (1,) * (len(shape) - self.ndim) + self.shape
    for s, n in zip(padded, shape):
      if s != n and s != 1: raise ValueError(f"cannot broadcast tensor of shape {self.shape} to {shape}")
    return self._wrap(self.uop.reshape(padded).expand(shape))

  def _scalar_uop(self, y: Any) -> UOp:
    """Python scalar `y` of this tensor's dtype, broadcast to its shape (cached: a hot path of `x + 1`)."""
    if (u := self._u) is None: u = self._uop  # (the slot first: the hot path of `x + 1`)
    if "shape" in (c := u._cache) and "device" in c: key = (u.dtype, repr(y), c["device"], c["shape"])  # (no property)
    else: key = (u.dtype, repr(y), u.device, u.shape)
    if (cu := _scalar_cache.get(key)) is None:
      if len(_scalar_cache) > 512: _scalar_cache.clear()
      cu = _scalar_cache[key] = self._const_for(y)._broadcast_to(self.shape).uop
    return cu

  def _const_for(self, y: Any) -> Tensor:
    """A Python scalar as a constant tensor next to self, with tinygrad's dtype rule (the tensor's dtype wins)."""
    if isinstance(y, UOp): return Tensor(y, device=self.device)
    if isinstance(y, np.generic) and y.ndim == 0: y = y.item()  # numpy scalars act like Python ones
    if not isinstance(y, (bool, int, float)):
      raise TypeError(f"can't combine a Tensor with {type(y).__name__} {y!r}; valid: Tensor, int, float, bool")
    x = self.dtype
    if dtypes.is_float(x) or (dtypes.is_int(x) and isinstance(y, int)): ydt = x
    else: ydt = dtypes.from_py(y)
    if type(y) is int and dtypes.is_int(ydt) and not dtypes.min(ydt) <= y <= dtypes.max(ydt):
      raise ValueError(f"Python int {y} is out of range for the tensor's dtype {ydt!r}, which holds "
                       f"[{dtypes.min(ydt)}, {dtypes.max(ydt)}]; cast the tensor first (.cast(dtypes.int64))")
    return Tensor._new(UOp.const(ydt, dtypes.as_const(y, ydt), self.device, ()), False)

  def _broadcasted(self, y: Any, reverse: bool = False, match_dtype: bool = True) -> tuple[Tensor, Tensor]:
    x: Tensor = self
    if type(y) in (int, float, bool) and (dtypes.is_float(x.dtype) or (dtypes.is_int(x.dtype) and type(y) is int)):
      yt = Tensor._new(self._scalar_uop(y), False)  # hot path: the constant takes this tensor's dtype and shape
      return (yt, x) if reverse else (x, yt)
    yt = y if isinstance(y, Tensor) else self._const_for(y)
    if x.device != yt.device: raise RuntimeError(f"tensors on different devices: {x.device} and {yt.device}")
    if match_dtype and x.dtype != yt.dtype:
      out = least_upper_dtype(x.dtype, yt.dtype)
      x, yt = x.cast(out), yt.cast(out)
    if reverse: x, yt = yt, x
    if (xs := x.shape) == (ys := yt.shape): return x, yt  # the same shape: nothing to broadcast (most ops)
    shape = _broadcast_shape(xs, ys)
    return x._broadcast_to(shape), yt._broadcast_to(shape)

  def _binop(self, op: Ops, y: Any, reverse: bool = False) -> Tensor:
    if (u := self._u) is None: u = self._uop  # (the slot first: the hot path of `x + 1`)
    dt = u.dtype
    # `dtypes.is_float(dt) or (dtypes.is_int(dt) and type(y) is int)`, its sets read inline (a frame less per op)
    if (ty := type(y)) in _PY_SCALARS and ((sd := dt._scalar or dt) in _FLOATS or (ty is int and sd in _INTS) or
                                           dtypes.is_float(dt)):
      # hot path: no temporary Tensor for the constant (`_scalar_uop(y)`, its cache read inline when it has it)
      if "shape" not in (c := u._cache) or "device" not in c or \
         (cu := _scalar_cache.get((dt, repr(y), c["device"], c["shape"]))) is None: cu = self._scalar_uop(y)
      if op in _SAME_DTYPE_OPS and cu.dtype is u.dtype:  # what alu builds, without its dtype checks (interned)
        # (`_INTERN(UOp, ...)` is `UOp(...)` without the metaclass's call slot: ~2.5k machine instructions less)
        new = _INTERN(UOp, op, u.dtype, (cu, u) if reverse else (u, cu))
        if (d := (c := u._cache).get("device")).__class__ is str:
          # an elementwise op over u and a constant of its shape: u's shape and device, known (the next op reads them)
          if "shape" not in (nc := new._cache): nc["shape"], nc["device"] = c["shape"], d
          return Tensor._new_lazy(new, self._requires_grad)
        return Tensor._new(new, self._requires_grad)
      return Tensor._new(cu.alu(op, u) if reverse else u.alu(op, cu), self._requires_grad)
    a, b = self._broadcasted(y, reverse)
    return a._wrap(a.uop.alu(op, b.uop), b)

  def _unop(self, op: Ops) -> Tensor: return self._wrap(self.uop.alu(op))
  def _float(self) -> Tensor: return self if dtypes.is_float(self.dtype) else self.cast(least_upper_float(self.dtype))

  def _inverse(self) -> Tensor:
    """An order-reversing bijection: -x for floats, ~x for ints, not x for bools."""
    if dtypes.is_float(self.dtype): return -self
    return self.logical_not() if self.dtype == dtypes.bool else ~self

  # ***** dtypes *****
  def cast(self, dtype: Any) -> Tensor:
    """This tensor converted to `dtype`."""
    dt = to_dtype(dtype)
    return self if self.dtype == dt else self._wrap(self.uop.cast(dt))

  def bitcast(self, dtype: Any) -> Tensor:
    """The same bytes read as `dtype` (the last dim rescales when the item sizes differ)."""
    dt = to_dtype(dtype)
    if self.dtype == dt: return self
    if dt.itemsize != self.dtype.itemsize:
      if not self.shape or (self.shape[-1] * self.dtype.itemsize) % dt.itemsize:
        raise RuntimeError(f"bitcast {self.dtype} -> {dt}: shape {self.shape} doesn't fit the new item size")
      return bitcast_sized(self, dt)
    return self._wrap(self.uop.bitcast(dt))

  # ***** binary math *****
  def add(self, x: Any, reverse: bool = False) -> Tensor:
    """self + x, broadcasting."""
    return self._binop(Ops.ADD, x, reverse)

  def sub(self, x: Any, reverse: bool = False) -> Tensor:
    """self - x, broadcasting."""
    a, b = self._broadcasted(x, reverse)
    if a.dtype == dtypes.bool: raise TypeError("subtracting bool tensors is not supported; use ^ (xor) or logical ops")
    return a._wrap(a.uop.alu(Ops.SUB, b.uop), b)

  def mul(self, x: Any, reverse: bool = False) -> Tensor:
    """self * x, broadcasting."""
    return self._binop(Ops.MUL, x, reverse)

  def div(self, x: Any, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    """self / x; `rounding_mode` None (true division, float result), "trunc" or "floor"."""
    a, b = self._broadcasted(x, reverse)
    if rounding_mode is None:
      a, b = a._float(), b._float()
      return a._wrap(a.uop.alu(Ops.FDIV, b.uop), b)
    if rounding_mode not in ("trunc", "floor"):
      raise ValueError(f"rounding_mode {rounding_mode!r}; valid: None, 'trunc', 'floor'")
    if dtypes.is_float(a.dtype):
      if rounding_mode == "floor": return float_divmod(a, b)[0]
      return a._wrap(a.uop.alu(Ops.FDIV, b.uop), b).trunc()
    if a.dtype == dtypes.bool: a, b = a.int(), b.int()
    q = a._wrap(a.uop.alu(Ops.CDIV, b.uop), b)
    if rounding_mode == "trunc" or dtypes.is_unsigned(a.dtype): return q
    r = a._wrap(a.uop.alu(Ops.CMOD, b.uop), b)
    fix = (r != 0) & ((r < 0) != (b < 0))  # truncation rounded toward zero where floor rounds down
    return fix.where(q - 1, q)

  def idiv(self, x: Any, reverse: bool = False) -> Tensor:
    """Integer division rounding toward zero."""
    return self.div(x, reverse, rounding_mode="trunc")

  def mod(self, x: Any, reverse: bool = False) -> Tensor:
    """Python-style remainder (the sign of the divisor)."""
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_float(a.dtype): return float_divmod(a, b)[1]  # numpy's, exactly
    ret = a - a.div(b, rounding_mode="floor") * b
    return b.eq(0).where(0, ret)  # int x % 0 is 0 (as numpy, and CMOD)

  def pow(self, x: Any, reverse: bool = False) -> Tensor:
    """self ** x with C's pow rules: negative bases with integer exponents, x ** 0 == 1 ** y == 1, +-inf and -0.0.

    >>> (Tensor([-2.0, 4.0, 0.0]) ** Tensor([3.0, 0.5, -1.0])).tolist()
    [-8.0, 2.0, inf]
    """
    if not reverse and isinstance(x, int) and not isinstance(x, bool) and x < 0 and not dtypes.is_float(self.dtype):
      # torch refuses it and tinygrad 0.14 too (a RuntimeError there): 2 ** -1 has no integer result
      raise _ArgumentError(f"an integer tensor ({self.dtype}) to the negative integer power {x} is not defined; "
                           f"cast it to a float dtype first, or pass a float exponent ({float(x)})")
    if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool):
      if x == 0:
        return self.ones_like() if dtypes.is_float(self.dtype) or isinstance(x, int) else self.ones_like().float()
      if x == 1: return self if isinstance(x, int) or dtypes.is_float(self.dtype) else self._float()
      if x == 0.5: return self.sqrt()
      if x == int(x) and 1 < x <= 8:
        ret = self if isinstance(x, int) or dtypes.is_float(self.dtype) else self._float()
        base, out = ret, None
        for _ in range(int(x)): out = base if out is None else out * base
        return out  # type: ignore[return-value]
      if x == int(x) and -8 <= x < 0: return self.pow(-x).reciprocal()
    base, exp = self._broadcasted(x, reverse)
    out_int = not dtypes.is_float(base.dtype)
    b, e = base._float(), exp._float()
    ret = _pow_float(b, e)
    return ret.round().cast(base.dtype) if out_int else ret

  def maximum(self, x: Any) -> Tensor:
    """Elementwise max (ties share the gradient)."""
    return self._binop(Ops.MAX, x)

  def minimum(self, x: Any) -> Tensor:
    """Elementwise min."""
    a, b = self._broadcasted(x)
    return a._inverse().maximum(b._inverse())._inverse()

  def where(self, x: Any, y: Any) -> Tensor:
    """`x` where self (a bool tensor) is true, else `y` (broadcasting; x and y promote to a common dtype)."""
    if self.dtype != dtypes.bool:  # tinygrad 0.14 and torch refuse it (a RuntimeError): 0.5 is not a truth value
      raise _DTypeArgumentError(f"where's condition must be a bool tensor, got {self.dtype}; compare it first "
                                "(`t != 0`) or cast it (`t.cast(dtypes.bool)`)")
    if isinstance(x, Tensor): x, y = x._broadcasted(y)
    elif isinstance(y, Tensor): y, x = y._broadcasted(x)
    cond, xt = self._broadcasted(x, match_dtype=False)
    cond, yt = cond._broadcasted(y, match_dtype=False)
    xt, yt = xt._broadcasted(yt)
    cond, xt = cond._broadcasted(xt, match_dtype=False)
    cond, yt = cond._broadcasted(yt, match_dtype=False)
    c = cond.cast(dtypes.bool)
    return c._wrap(c.uop.where(xt.uop, yt.uop), xt, yt)

  def lerp(self, end: Any, weight: Any) -> Tensor:
    """self + (end - self) * weight."""
    return self + (end - self) * weight

  def _check_bitwise(self) -> None:
    if not (dtypes.is_int(self.dtype) or self.dtype == dtypes.bool):
      raise RuntimeError(f"bitwise ops need an int or bool tensor, got {self.dtype}")

  def _bit_pattern(self, y: Any) -> Any:
    """A Python int operand of a bitwise op on an int tensor as the bits it spells in the tensor's width:
    `x | 0xFFFFFFFF` on int32 is `x | -1` (as tinygrad), `u32 & -1` is `u32 & 0xFFFFFFFF`. An int wider than the
    dtype stays as it is (and is refused as out of range: its high bits would be dropped silently)."""
    if type(y) is not int or not dtypes.is_int(self.dtype): return y
    bits = self.dtype.itemsize * 8
    return truncate_int(y, self.dtype) if -(1 << (bits - 1)) <= y < (1 << bits) else y

  def bitwise_and(self, x: Any, reverse: bool = False) -> Tensor:
    """Bitwise (logical for bool) and."""
    self._check_bitwise()
    return self._binop(Ops.AND, self._bit_pattern(x), reverse)

  def bitwise_or(self, x: Any, reverse: bool = False) -> Tensor:
    """Bitwise (logical for bool) or."""
    self._check_bitwise()
    return self._binop(Ops.OR, self._bit_pattern(x), reverse)

  def bitwise_xor(self, x: Any, reverse: bool = False) -> Tensor:
    """Bitwise (logical for bool) xor."""
    self._check_bitwise()
    return self._binop(Ops.XOR, self._bit_pattern(x), reverse)

  def bitwise_not(self) -> Tensor:
    """Bitwise not (logical not for bool)."""
    self._check_bitwise()
    if self.dtype == dtypes.bool: return self.logical_not()
    return self ^ (self.dtype.max if dtypes.is_unsigned(self.dtype) else -1)

  def _check_shift(self, x: Any) -> None:
    if not dtypes.is_int(self.dtype): raise RuntimeError(f"shifts need an int tensor, got {self.dtype}")
    if isinstance(x, Tensor) and not dtypes.is_int(x.dtype): raise RuntimeError(f"shift by a {x.dtype} tensor")
    if not isinstance(x, Tensor) and (not isinstance(x, int) or isinstance(x, bool) or x < 0):
      raise ValueError(f"shift amount {x!r} must be a non-negative int (or an int tensor)")

  def lshift(self, x: Any, reverse: bool = False) -> Tensor:
    """Shift bits left (int tensors); `x` a non-negative int or an int tensor."""
    self._check_shift(x)
    return self._binop(Ops.SHL, x, reverse)

  def rshift(self, x: Any, reverse: bool = False) -> Tensor:
    """Shift bits right (arithmetic for signed ints); `x` a non-negative int or an int tensor."""
    self._check_shift(x)
    return self._binop(Ops.SHR, x, reverse)

  def logical_not(self) -> Tensor:
    """True where self is false."""
    return self.cast(dtypes.bool)._binop(Ops.CMPNE, True)

  # comparisons
  def __lt__(self, x: Any) -> Tensor: return self._binop(Ops.CMPLT, x)
  def __gt__(self, x: Any) -> Tensor: return self._binop(Ops.CMPLT, x, reverse=True)
  def __le__(self, x: Any) -> Tensor: return (self < x) | (self == x)
  def __ge__(self, x: Any) -> Tensor: return (self > x) | (self == x)
  def __eq__(self, x: Any) -> Tensor: return self._binop(Ops.CMPEQ, x)  # type: ignore[override]
  def __ne__(self, x: Any) -> Tensor: return self._binop(Ops.CMPNE, x)  # type: ignore[override]
  def eq(self, x: Any) -> Tensor:
    """Elementwise ==, as a bool tensor."""
    return self == x
  def ne(self, x: Any) -> Tensor:
    """Elementwise !=, as a bool tensor."""
    return self != x

  # python operators
  def __neg__(self) -> Tensor: return self.logical_not() if self.dtype == dtypes.bool else self._unop(Ops.NEG)
  # `+` and `*` go to `_binop` directly (what add/mul do, one Python frame less: the eager hot path `a + 1`)
  def __add__(self, x: Any) -> Tensor: return self._binop(_ADD, x)
  def __radd__(self, x: Any) -> Tensor: return self._binop(_ADD, x, True)
  def __sub__(self, x: Any) -> Tensor: return self.sub(x)
  def __rsub__(self, x: Any) -> Tensor: return self.sub(x, True)
  def __mul__(self, x: Any) -> Tensor: return self._binop(_MUL, x)
  def __rmul__(self, x: Any) -> Tensor: return self._binop(_MUL, x, True)
  def __truediv__(self, x: Any) -> Tensor: return self.div(x)
  def __rtruediv__(self, x: Any) -> Tensor: return self.div(x, True)
  def __floordiv__(self, x: Any) -> Tensor: return self.div(x, rounding_mode="floor")
  def __rfloordiv__(self, x: Any) -> Tensor: return self.div(x, True, rounding_mode="floor")
  def __mod__(self, x: Any) -> Tensor: return self.mod(x)
  def __rmod__(self, x: Any) -> Tensor: return self.mod(x, True)
  def __pow__(self, x: Any) -> Tensor: return self.pow(x)
  def __rpow__(self, x: Any) -> Tensor: return self.pow(x, True)
  def __matmul__(self, x: Tensor) -> Tensor: return self.matmul(x)
  def __rmatmul__(self, x: Tensor) -> Tensor: return self.matmul(x, True)
  def __and__(self, x: Any) -> Tensor: return self.bitwise_and(x)
  def __rand__(self, x: Any) -> Tensor: return self.bitwise_and(x, True)
  def __or__(self, x: Any) -> Tensor: return self.bitwise_or(x)
  def __ror__(self, x: Any) -> Tensor: return self.bitwise_or(x, True)
  def __xor__(self, x: Any) -> Tensor: return self.bitwise_xor(x)
  def __rxor__(self, x: Any) -> Tensor: return self.bitwise_xor(x, True)
  def __lshift__(self, x: Any) -> Tensor: return self.lshift(x)
  def __rshift__(self, x: Any) -> Tensor: return self.rshift(x)
  def __rlshift__(self, x: Any) -> Tensor: return self.lshift(x, True)
  def __rrshift__(self, x: Any) -> Tensor: return self.rshift(x, True)
  def __invert__(self) -> Tensor: return self.bitwise_not()
  def __abs__(self) -> Tensor: return self.abs()
  def __iadd__(self, x: Any) -> Tensor: return self.assign(self.add(x))
  def __isub__(self, x: Any) -> Tensor: return self.assign(self.sub(x))
  def __imul__(self, x: Any) -> Tensor: return self.assign(self.mul(x))
  def __itruediv__(self, x: Any) -> Tensor: return self.assign(self.div(x))
  def __ifloordiv__(self, x: Any) -> Tensor: return self.assign(self // x)
  def __imod__(self, x: Any) -> Tensor: return self.assign(self.mod(x))
  def __ipow__(self, x: Any) -> Tensor: return self.assign(self.pow(x))
  def __imatmul__(self, x: Tensor) -> Tensor: return self.assign(self.matmul(x))
  def __iand__(self, x: Any) -> Tensor: return self.assign(self.bitwise_and(x))
  def __ior__(self, x: Any) -> Tensor: return self.assign(self.bitwise_or(x))
  def __ixor__(self, x: Any) -> Tensor: return self.assign(self.bitwise_xor(x))
  def __ilshift__(self, x: Any) -> Tensor: return self.assign(self.lshift(x))
  def __irshift__(self, x: Any) -> Tensor: return self.assign(self.rshift(x))

  # ***** unary math *****
  def neg(self) -> Tensor:
    """Negation."""
    return -self
  def exp(self) -> Tensor:
    """e ** self."""
    return (self._float() * (1 / math.log(2))).exp2()
  def exp2(self) -> Tensor:
    """2 ** self."""
    return self._float()._unop(Ops.EXP2)
  def log(self) -> Tensor:
    """Natural logarithm."""
    return self.log2() * math.log(2)
  def log2(self) -> Tensor:
    """Base-2 logarithm."""
    return self._float()._unop(Ops.LOG2)
  def sqrt(self) -> Tensor:
    """Square root."""
    return self._float()._unop(Ops.SQRT)
  def rsqrt(self) -> Tensor:
    """1 / sqrt(self)."""
    return self.sqrt().reciprocal()
  def reciprocal(self) -> Tensor:
    """1 / self."""
    return self._float()._unop(Ops.RECIPROCAL)
  def sin(self) -> Tensor:
    """Sine."""
    return self._float()._unop(Ops.SIN)
  def tan(self) -> Tensor:
    """Tangent."""
    return self.sin() / self.cos()
  def square(self) -> Tensor:
    """self * self."""
    return self * self
  def trunc(self) -> Tensor:
    """Round toward zero."""
    return self._unop(Ops.TRUNC) if dtypes.is_float(self.dtype) else self
  def floor(self) -> Tensor:
    """Round down to an integer value."""
    if not dtypes.is_float(self.dtype): return self
    b = self.trunc()
    return (b > self).where(b - 1, b)
  def ceil(self) -> Tensor:
    """Round up to an integer value."""
    if not dtypes.is_float(self.dtype): return self
    b = self.trunc()
    return (b < self).where(b + 1, b)
  def round(self) -> Tensor:
    """Round half to even (like numpy and tinygrad)."""
    if not dtypes.is_float(self.dtype): return self
    f = self.floor()
    d = self - f
    odd = (f * 0.5).floor() * 2 != f
    return (d > 0.5).where(f + 1, (d < 0.5).where(f, odd.where(f + 1, f)))
  def isnan(self) -> Tensor:
    """True where the element is NaN."""
    return self != self
  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    """True where the element is +inf (detect_positive) or -inf (detect_negative)."""
    return (self == math.inf) * detect_positive + (self == -math.inf) * detect_negative
  def isfinite(self) -> Tensor:
    """True where the element is neither inf nor NaN."""
    return (self.isinf() | self.isnan()).logical_not()
  def sign(self) -> Tensor:
    """-1, 0 or 1 by the sign of each element (NaN stays NaN)."""
    if self.dtype == dtypes.bool: return self
    one, zero = self.full_like(1), self.full_like(0)
    neg = self.full_like(-1) if not dtypes.is_unsigned(self.dtype) else zero
    ret = self.ne(0).where((self < 0).where(neg, one), zero)
    return self.isnan().where(self, ret) if dtypes.is_float(self.dtype) else ret  # (ret + self*0 made inf NaN)
  def abs(self) -> Tensor:
    """Absolute value."""
    if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool: return self
    return self * self.sign() if dtypes.is_float(self.dtype) else (self < 0).where(-self, self)
  def clip(self, min_: Any = None, max_: Any = None) -> Tensor:
    """Clamp into [min_, max_]; the gradient is 1 inside the closed interval (as torch), NaN stays NaN.

    >>> Tensor([-1.0, 0.5, 2.0]).clip(0, 1).tolist()
    [0.0, 0.5, 1.0]
    """
    if min_ is None and max_ is None: raise RuntimeError("clip: at least one of 'min_' or 'max_' must not be None")
    ret = self
    if min_ is not None: ret = (ret < min_).where(min_, ret)
    if max_ is not None: ret = (ret > max_).where(max_, ret)
    return ret
  clamp = clip

  # activations
  def relu(self) -> Tensor:
    """max(x, 0). Its gradient is taken from the output, (out > 0) * g: the same mask as x > 0 for every x (NaN
    included: its output is 0), but the backward then reads the map the next layer reads anyway, so x itself need not
    be stored and the ReLU fuses into the op before it (a conv's output was stored before and after its ReLU)."""
    out = (self > 0).where(self, 0)
    _gradient.custom_gradient(out.uop, (self.uop,), lambda g, o: ((o.const_like(0) < o).where(g, g.const_like(0)),))
    return out
  def sigmoid(self) -> Tensor:
    """1 / (1 + exp(-x)); its gradient s * (1 - s) stays finite at any input.

    >>> Tensor([-1000.0, 0.0, 1000.0]).sigmoid().tolist()
    [0.0, 0.5, 1.0]
    """
    x = self._float()
    out = (1 + (x * (-1 / math.log(2))).exp2()).reciprocal()
    return with_gradient(out, (x,), lambda g, s, _: (g * s * (1 - s),))
  def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
    """Piecewise-linear sigmoid: clip(alpha*x + beta, 0, 1); the gradient is alpha strictly inside (0 at the kinks, as
    torch)."""
    y = alpha * self + beta
    return (y <= 0).where(0, (y >= 1).where(1, y))
  def logsigmoid(self) -> Tensor:
    """log(sigmoid(x)), computed stably."""
    return -(-self).softplus()
  def _odd_near_0(self, big: Tensor, series: Sequence[float]) -> Tensor:
    """`big` (a formula that cancels near 0), or where |x| < 2**-5 the odd series x * p(x**2) (`series`: p's
    coefficients, highest first, to x**9: below 2**-5 its first omitted term is under 1e-16 of the value): tanh(1e-6)
    was 1.07e-6 through 2*sigmoid(2x)-1, tanh(1e-8) 0, and -0.0 lost its sign. The series sees 0 elsewhere, so its
    unused gradient stays finite (x**9 of a large x overflowed: inf * 0 is NaN)."""
    small = self.abs() < 2 ** -5
    xs = small.where(self, 0)
    return small.where(xs * polyN(xs.square(), series), big)
  def tanh(self) -> Tensor:
    """Hyperbolic tangent (its Taylor series near 0, see `_odd_near_0`)."""
    return self._odd_near_0(2.0 * ((2.0 * self).sigmoid()) - 1.0, [62 / 2835, -17 / 315, 2 / 15, -1 / 3, 1.0])
  def sinh(self) -> Tensor:
    """Hyperbolic sine (its Taylor series near 0, see `_odd_near_0`)."""
    return self._odd_near_0((self.exp() - self.neg().exp()) / 2, [1 / 362880, 1 / 5040, 1 / 120, 1 / 6, 1.0])
  def cosh(self) -> Tensor:
    """Hyperbolic cosine."""
    return (self.exp() + self.neg().exp()) / 2
  def atanh(self) -> Tensor:
    """Inverse hyperbolic tangent (its Taylor series near 0, see `_odd_near_0`)."""
    return self._odd_near_0(((1 + self) / (1 - self)).log() / 2, [1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0])
  def asinh(self) -> Tensor:
    """Inverse hyperbolic sine, odd: log(a + sqrt(a^2 + 1)) of a = |x| (x + sqrt(x^2 + 1) cancels for x << 0),
    log(a) + log(2) past 2**27 (a^2 overflowed from 1.8e19 in float32: asinh(1e30) was inf), its Taylor series near
    0 (see `_odd_near_0`)."""
    neg = self < 0
    a = neg.where(-self, self)
    huge = a > 2 ** 27  # (each branch sees a value it is finite at, so the unused one's gradient is too)
    am = huge.where(1, a)
    r = huge.where(huge.where(a, 1).log() + math.log(2), (am + (am.square() + 1).sqrt()).log())
    return self._odd_near_0(neg.where(-r, r), [105 / 3456, -15 / 336, 3 / 40, -1 / 6, 1.0])
  def acosh(self) -> Tensor:
    """Inverse hyperbolic cosine: log(x + sqrt((x - 1)(x + 1))) (x - 1 is exact near 1, where x^2 - 1 cancelled),
    log(x) + log(2) past 2**27 (x^2 overflowed)."""
    huge = self > 2 ** 27
    x, xh = huge.where(2, self), huge.where(self, 1)
    return huge.where(xh.log() + math.log(2), (x + ((x - 1) * (x + 1)).sqrt()).log())
  def erf(self) -> Tensor:
    """Error function (Abramowitz-Stegun 7.1.26, |err| < 1.5e-7; its Taylor series near 0, where that absolute error
    was the whole value: erf(1e-8) gave 0); its gradient is the exact 2/sqrt(pi) exp(-x^2)
    (the approximation's own, through |x| and sign(x), is 0 at 0)."""
    x = self._float()
    t = 1.0 / (1.0 + 0.3275911 * x.abs())
    out = x.sign() * (1.0 - t * polyN(t, [1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592]) *
                      (-x.square()).exp())
    out = x._odd_near_0(out, [2 / math.sqrt(math.pi) * c for c in (1 / 216, -1 / 42, 1 / 10, -1 / 3, 1.0)])
    return with_gradient(out, (x,), lambda g, _, x: (g * (2 / math.sqrt(math.pi)) * (-x.square()).exp(),))
  def gelu(self, approximate: str = "tanh") -> Tensor:
    """GELU: `approximate="tanh"` (the default, as tinygrad) or `"none"` (exact, through erf)."""
    if approximate == "tanh": return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self ** 3)).tanh())
    if approximate == "none": return self * 0.5 * (1.0 + (self / math.sqrt(2)).erf())
    raise ValueError(f"gelu approximate={approximate!r}; valid: 'tanh', 'none'")
  def quick_gelu(self) -> Tensor:
    """x * sigmoid(1.702 x)."""
    return self * (self * 1.702).sigmoid()
  def silu(self) -> Tensor:
    """x * sigmoid(x) (swish)."""
    return self * self.sigmoid()
  swish = silu
  def relu6(self) -> Tensor:
    """min(max(x, 0), 6); the gradient is 1 strictly inside (0 at 0 and 6, as torch)."""
    return self.hardtanh(0, 6)
  def hardswish(self) -> Tensor:
    """x * relu6(x + 3) / 6, with torch's gradient at the kinks (x/3 + 1/2 on (-3, 3), 0 at -3, 1 at 3)."""
    return (self <= -3).where(self * 0, (self < 3).where(self * (self + 3) * (1 / 6), self))  # -0.0, NaN at -inf
  def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
    """Clamp into [min_val, max_val]; the gradient is 1 strictly inside (0 at the bounds, as torch)."""
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
  def _negative_part(self) -> Tensor:
    """x where x <= 0, else 0: an argument for the x <= 0 branch of a piecewise function that stays finite (exp(x) of
    a large x the other branch takes would be inf, and its 0 gradient times inf NaN)."""
    return (self > 0).where(0, self)
  def elu(self, alpha: float = 1.0) -> Tensor:
    """Exponential linear unit: x if x > 0 else alpha*(exp(x)-1) (the gradient at 0 is alpha, as torch)."""
    return (self > 0).where(self, alpha * (self._negative_part().exp() - 1))
  def celu(self, alpha: float = 1.0) -> Tensor:
    """Continuously differentiable ELU: max(0,x) + min(0, alpha*(exp(x/alpha)-1))."""
    return (self > 0).where(self, alpha * ((self._negative_part() / alpha).exp() - 1))
  def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
    """Scaled ELU: gamma * (x if x > 0 else alpha*(exp(x)-1)) (the gradient at 0 is gamma*alpha, as torch)."""
    return gamma * (self > 0).where(self, alpha * (self._negative_part().exp() - 1))
  def softplus(self, beta: float = 1.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, computed stably as max(bx, 0) + log(1 + exp(-|bx|)) with both pieces written
    through x's sign (the derivative is sigmoid(bx) everywhere: 0.5 at 0, where |x| alone would give 0)."""
    bx = self * beta
    pos, neg = (bx > 0).where(bx, 0), bx._negative_part()  # bx = pos + neg, -|bx| = neg - pos
    return (pos + (1 + (neg - pos).exp()).log()) * (1 / beta)
  def mish(self) -> Tensor:
    """x * tanh(softplus(x))."""
    return self * self.softplus().tanh()
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
    """x if x > 0 else neg_slope * x (the gradient at 0 is neg_slope, as torch)."""
    return (self > 0).where(self, neg_slope * self)
  def softsign(self) -> Tensor:
    """x / (1 + |x|)."""
    return self / (1 + self.abs())

  # ***** reductions *****
  def _resolve_dim(self, dim: int, extra: bool = False) -> int:
    total = self.ndim + int(extra)
    if not isinstance(dim, int) or isinstance(dim, bool): raise TypeError(f"dim must be an int, got {dim!r}")
    if not -max(1, total) <= dim < max(1, total):
      raise IndexError(f"dim {dim} is out of range for a tensor of {self.ndim} dims; valid: "
                       f"[{-max(1, total)}, {max(1, total) - 1}]")
    return dim + total if dim < 0 else dim

  def _axes(self, axis: Any) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    ret = tuple(self._resolve_dim(a) for a in axes)
    if self.ndim == 0: return ()
    if len(set(ret)) != len(ret): raise ValueError(f"axis {axis} repeats a dimension")
    return tuple(sorted(ret))

  def _reduce(self, op: Ops, axis: Any = None, keepdim: bool = False) -> Tensor:
    axes = self._axes(axis)
    ret = self._wrap(self.uop.r(op, axes)) if axes else self
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """Sum over `axis` (all by default); ints accumulate in at least int32, half in float32.

    >>> t = Tensor([[1, 2], [3, 4]])
    >>> t.sum().item(), t.sum(0).tolist(), t.sum(1, keepdim=True).tolist()
    (10, [4, 6], [[3], [7]])
    """
    acc = sum_acc_dtype(self.dtype) if dtype is None else to_dtype(dtype)
    ret = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
    narrow = (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s)
    return ret.cast(self.dtype) if dtype is None and self.dtype in narrow else ret

  def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """Product over `axis`, in this tensor's dtype unless `dtype` is given. The gradient is the product of the other
    elements, also where some are 0 (as torch).

    >>> Tensor([[1, 2], [3, 4]]).prod(1).tolist()
    [2, 12]
    """
    x = self.cast(to_dtype(dtype) if dtype is not None else self.dtype)
    out = x._reduce(Ops.MUL, axis, keepdim)
    if not dtypes.is_float(x.dtype): return out
    axes, kshape = x._axes(axis), tuple(1 if i in x._axes(axis) else s for i, s in enumerate(x.shape))
    def grad(g: Tensor, _: Tensor, x: Tensor) -> tuple[Tensor]:
      zero = x == 0
      nzero = zero.cast(dtypes.int32)._reduce(Ops.ADD, axes, True)
      nz_prod = zero.where(1.0, x)._reduce(Ops.MUL, axes, True)  # the product of the nonzero elements
      gi = zero.where((nzero == 1).where(nz_prod, 0.0), (nzero == 0).where(nz_prod / zero.where(1.0, x), 0.0))
      return (g.reshape(kshape) * gi,)
    return with_gradient(out, (x,), grad)

  def max(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """Maximum over `axis`."""
    return self._reduce(Ops.MAX, axis, keepdim)

  def min(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """Minimum over `axis`."""
    return self._inverse().max(axis, keepdim)._inverse()

  def any(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """True where some element along `axis` is true."""
    return self.bool().max(axis, keepdim)
  def all(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """True where every element along `axis` is true."""
    return self.logical_not().any(axis, keepdim).logical_not()

  def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """Mean over `axis` (float result; NaN for an empty reduction)."""
    out_dt = self.dtype if dtypes.is_float(self.dtype) else dtypes.float32
    n = prod([self.shape[i] for i in self._axes(axis)])
    # ints (and bools) sum in float64, as numpy's mean does: an int32 sum overflows (1000 x 2**30 gave 0.0), and
    # float64 holds any sum of up to 2**21 int32s exactly
    acc = sum_acc_dtype(self.dtype) if dtypes.is_float(self.dtype) else dtypes.float64
    return self.cast(acc).sum(axis, keepdim).div(n).cast(out_dt)

  def var(self, axis: Any = None, keepdim: bool = False, correction: float = 1) -> Tensor:
    """Variance over `axis` with Bessel's `correction` (1 by default; any real number, as torch's)."""
    squares = (self - self.mean(axis, keepdim=True)).square()
    n = prod([self.shape[i] for i in self._axes(axis)])
    return squares.sum(axis, keepdim).div(max(0, n - correction))

  def std(self, axis: Any = None, keepdim: bool = False, correction: float = 1) -> Tensor:
    """Standard deviation over `axis`."""
    return self.var(axis, keepdim, correction).sqrt()

  def var_mean(self, axis: Any = None, keepdim: bool = False, correction: float = 1) -> tuple[Tensor, Tensor]:
    """(var, mean) over `axis`."""
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

  def std_mean(self, axis: Any = None, keepdim: bool = False, correction: float = 1) -> tuple[Tensor, Tensor]:
    """(std, mean) over `axis`."""
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

  def _softmax(self, axis: int, dtype: Any = None) -> tuple[Tensor, Tensor, Tensor]:
    x = self.cast(dtype) if dtype is not None else self._float()
    m = x - x.max(axis=axis, keepdim=True).detach()
    e = m.exp()
    return m, e, e.sum(axis=axis, keepdim=True)

  def softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) along `axis`."""
    _, e, ss = self._softmax(axis, dtype)
    return e.div(ss)

  def log_softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """log(softmax(x)) along `axis`, computed stably."""
    m, _, ss = self._softmax(axis, dtype)
    return m - ss.log()

  def logsumexp(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over `axis`, computed stably."""
    m = self.max(axis=axis, keepdim=True).detach()
    m = m.isinf().where(0, m)
    ret = (self - m).exp().sum(axis=axis, keepdim=True).log() + m
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in self._axes(axis)))

  def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the (first) maximum along `axis` (of the flattened tensor when None); of the first NaN, if any."""
    if axis is None: return self.flatten().argmax(0)
    axis = self._resolve_dim(axis)
    if self.ndim == 0: return Tensor(0, dtype=dtypes.int32, device=self.device)
    n = self.shape[axis]
    if n == 0: raise IndexError(f"argmax of an empty dimension {axis} (shape {self.shape})")
    is_max = self == self.max(axis=axis, keepdim=True)
    if dtypes.is_float(self.dtype): is_max = is_max | self.isnan()  # max is NaN where one is: the first NaN wins
    rev = Tensor.arange(n, 0, -1, device=self.device).reshape(n, *[1] * (self.ndim - axis - 1))
    return (is_max * rev).max(axis=axis, keepdim=keepdim).sub(n, reverse=True).cast(dtypes.int32)  # n - max

  def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the (first) minimum along `axis`."""
    return self._inverse().argmax(axis, keepdim)

  # ***** movement *****
  def reshape(self, shape: Any, *args: Any) -> Tensor:
    """The same data in a new shape; one dim may be -1 (inferred), None keeps that dim.

    >>> Tensor.arange(6).reshape(2, -1).shape
    (2, 3)
    """
    new = argfix(shape, *args)
    if _plain_sizes(new) and _plain_sizes(cur := self.shape):  # all non-negative ints (most reshapes): checked here
      if new == cur: return self
      if math.prod(new) == math.prod(cur): return self._wrap(self.uop.reshape(new))
    if (bad := [s for s in new if not (s is None or isinstance(s, (UOp, int, np.integer)))
                or isinstance(s, (bool, np.bool_))]):
      raise TypeError(f"reshape {new}: dimension {bad[0]!r} is a {type(bad[0]).__name__}; valid: ints, one -1, None "
                      "(keep that dim) or a symbolic Variable")
    new = tuple(int(s) if isinstance(s, np.integer) else s for s in new)
    new = tuple(self.shape[i] if s is None else s for i, s in enumerate(new))
    if sum(1 for s in new if isinstance(s, int) and s == -1) > 1:
      raise _ArgumentError(f"reshape {new}: only one dim can be -1")  # a RuntimeError in tinygrad 0.14 and torch
    if any(isinstance(s, int) and s < -1 for s in new): raise ValueError(f"reshape {new}: negative dimension")
    if -1 in new:
      rest = prod([s for s in new if not (isinstance(s, int) and s == -1)])
      if rest == 0 or self.numel() % rest: raise ValueError(f"shape mismatch, can't reshape {self.shape} -> {new}")
      new = tuple(self.numel() // rest if isinstance(s, int) and s == -1 else s for s in new)
    if _size_differs(prod(new), self.numel()):
      raise ValueError(f"shape mismatch, can't reshape {self.shape} (size {self.numel()}) -> {new}")
    return self if new == self.shape else self._wrap(self.uop.reshape(new))

  def view(self, shape: Any, *args: Any) -> Tensor:
    """Alias of `reshape`."""
    return self.reshape(shape, *args)

  def permute(self, order: Any, *args: Any) -> Tensor:
    """Reorder the dims: `x.permute(2, 0, 1)`."""
    o = tuple(self._resolve_dim(i) for i in argfix(order, *args))
    if sorted(o) != list(range(self.ndim)):
      raise RuntimeError(f"permute order {argfix(order, *args)} is not a permutation of {self.ndim} dims")
    return self if o == tuple(range(self.ndim)) else self._wrap(self.uop.permute(o))

  def expand(self, shape: Any, *args: Any) -> Tensor:
    """Broadcast size-1 dims to `shape` (-1 keeps a dim)."""
    new = argfix(shape, *args)
    if len(new) < self.ndim: raise ValueError(f"expand {new}: fewer dims than shape {self.shape}")
    cur = (1,) * (len(new) - self.ndim) + self.shape
    return self._broadcast_to(tuple(c if isinstance(n, int) and n == -1 else n for c, n in zip(cur, new)))

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    """Swap two dims."""
    order = list(range(self.ndim))
    d0, d1 = self._resolve_dim(dim0), self._resolve_dim(dim1)
    order[d0], order[d1] = order[d1], order[d0]
    return self.permute(order)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one."""
    if self.ndim == 0: return self.reshape(1)
    s, e = self._resolve_dim(start_dim), self._resolve_dim(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

  def unflatten(self, dim: int, sizes: tuple[int, ...]) -> Tensor:
    """Split dim into `sizes`."""
    d = self._resolve_dim(dim)
    return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])

  def squeeze(self, dim: int | None = None) -> Tensor:
    """Remove size-1 dims (all, or only `dim` if it has size 1)."""
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    d = self._resolve_dim(dim)
    return self if not self.ndim or self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])

  def unsqueeze(self, dim: int) -> Tensor:
    """Insert a size-1 dim at `dim`."""
    d = self._resolve_dim(dim, extra=True)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

  def shrink(self, arg: Sequence[tuple[sint, sint] | None]) -> Tensor:
    """Keep [start, end) of each dim (None keeps the dim whole)."""
    if len(arg) != self.ndim: raise ValueError(f"shrink {arg} has {len(arg)} entries for {self.ndim} dims")
    a = tuple((0, s) if x is None else (x[0], x[1]) for x, s in zip(arg, self.shape))
    for (b, e), s in zip(a, self.shape):
      if not (isinstance(b, int) and isinstance(e, int)): continue
      if not 0 <= b <= e <= s: raise ValueError(f"shrink {arg} is out of bounds for shape {self.shape}")
    return self._wrap(self.uop.shrink(a)) if any(x != (0, s) for x, s in zip(a, self.shape)) else self

  def flip(self, axis: Any, *args: Any) -> Tensor:
    """Reverse the order of elements along the given axes."""
    axes_ = [self._resolve_dim(a) for a in argfix(axis, *args)]
    if len(set(axes_)) != len(axes_):  # tinygrad 0.14 and torch refuse it (a RuntimeError)
      raise _ArgumentError(f"flip {argfix(axis, *args)}: each dim may appear at most once")
    axes = set(axes_)
    return self._wrap(self.uop.flip(tuple(i in axes for i in range(self.ndim)))) if axes else self

  def _pad_raw(self, arg: tuple[tuple[sint, sint], ...], value: Any = 0.0) -> Tensor:
    if all(b == 0 and a == 0 for b, a in arg): return self
    ret = self._wrap(self.uop.pad(arg))
    if value == 0: return ret
    mask = Tensor._new(UOp.const(dtypes.bool, True, self.device, self.shape).pad(arg), False)
    return mask.where(ret, value)

  def pad(self, padding: Sequence, mode: str = "constant", value: Any = 0.0) -> Tensor:
    """Pad with `value` ("constant") or by "reflect", "replicate", "circular": `Tensor([1, 2]).pad((1, 2))`.

    `padding` is flat like torch `(left, right, top, bottom, ...)` from the last dim backward, or one `(before, after)`
    pair (or None) per dim from the first. Negative padding shrinks.
    """
    if mode not in ("constant", "reflect", "replicate", "circular"):
      raise NotImplementedError(f"pad mode {mode!r}; valid: 'constant', 'reflect', 'replicate', 'circular'")
    padding = tuple(padding)
    flat = not any(p is None or isinstance(p, (tuple, list)) for p in padding)
    if not flat and (bad := [q for q in padding if not (q is None or (isinstance(q, (tuple, list)) and len(q) == 2))]):
      raise _ArgumentError(f"pad {padding}: give flat ints, or a (before, after) pair or None per dim; got {bad[0]!r}")
    amounts = padding if flat else [v for q in padding if q is not None for v in q]
    if bad := [v for v in amounts if not isinstance(v, (int, np.integer, UOp)) or isinstance(v, (bool, np.bool_))]:
      raise _ArgumentError(f"pad {padding}: padding amounts must be ints, got {bad[0]!r}")  # tinygrad: RuntimeError
    if flat:
      padding = tuple(int(v) if isinstance(v, np.integer) else v for v in padding)
      if len(padding) % 2: raise ValueError(f"flat padding {padding} must have an even number of values")
      if len(padding) // 2 > self.ndim: raise ValueError(f"padding {padding} has more dims than shape {self.shape}")
      pairs = ((0, 0),) * (self.ndim - len(padding) // 2) + tuple(zip(padding[-2::-2], padding[::-2]))
    else:
      if len(padding) != self.ndim: raise ValueError(f"padding {padding} needs one pair per dim of shape {self.shape}")
      pairs = tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    if mode != "constant" and value != 0: raise ValueError(f"pad mode {mode!r} takes no value (got {value})")
    for d, ((b, a), s) in enumerate(zip(pairs, self.shape)):
      if isinstance(s, int) and -min(b, 0) - min(a, 0) > s:
        raise ValueError(f"pad {padding}: dim {d} of size {s} with padding ({b}, {a}) would remove "
                         f"{-min(b, 0) - min(a, 0)} elements; negative padding may remove at most the dim's {s}")
    # negative padding shrinks: first for constant and circular (wrapping sees the kept part), last for reflect and
    # replicate (they mirror/repeat the full data first: [1, 2] reflect-padded by (1, -1) is [2, 1], as torch)
    x, crop = self, tuple((-min(b, 0), min(a, 0)) for b, a in pairs)
    if any(c != (0, 0) for c in crop) and mode in ("constant", "circular"):
      x, crop = x.shrink(tuple((lo, s + hi) for (lo, hi), s in zip(crop, x.shape))), ()
    pairs = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
    if mode == "constant": return x._pad_raw(pairs, value)
    for d, (b, a) in enumerate(pairs):
      if b == 0 and a == 0: continue
      s = x.shape[d]
      def sl(lo: sint, hi: sint, xx: Tensor = x, dd: int = d) -> Tensor:
        return xx.shrink(tuple((lo, hi) if i == dd else None for i in range(xx.ndim)))
      if mode == "reflect":
        if b >= s or a >= s: raise ValueError(f"reflect padding ({b}, {a}) must be < the dim size {s} (dim {d})")
        parts = [sl(1, b + 1).flip(d), x, sl(s - 1 - a, s - 1).flip(d)]
      elif mode == "replicate":
        if s == 0: raise ValueError(f"replicate padding of an empty dim {d}")
        parts = [sl(0, 1).expand(tuple(b if i == d else -1 for i in range(x.ndim))), x,
                 sl(s - 1, s).expand(tuple(a if i == d else -1 for i in range(x.ndim)))]
      else:
        if b > s or a > s: raise ValueError(f"circular padding ({b}, {a}) must be <= the dim size {s} (dim {d})")
        parts = [sl(s - b, s), x, sl(0, a)]
      x = Tensor.cat(*[p for p in parts if p.shape[d] != 0], dim=d)
    if any(c != (0, 0) for c in crop): x = x.shrink(tuple((lo, s + hi) for (lo, hi), s in zip(crop, x.shape)))
    return x

  def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Concatenate along `dim`; the other dims must match."""
    self, *others = tensor_seq("cat", self, args)
    d = self._resolve_dim(dim)
    ts = [self, *others]
    for t in others:
      if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(self.shape, t.shape)) if i != d):
        raise ValueError(f"cat: shapes {self.shape} and {t.shape} differ outside dim {d}")
    dt = least_upper_dtype(*[t.dtype for t in ts])
    ts = [t.cast(dt) for t in ts]
    ends = list(itertools.accumulate([t.shape[d] for t in ts], initial=0))
    padded = [t._pad_raw(tuple((ends[i], ends[-1] - ends[i + 1]) if j == d else (0, 0) for j in range(t.ndim)))
              for i, t in enumerate(ts)]
    ret = padded[0]
    for p in padded[1:]: ret = ret | p if dt == dtypes.bool else ret + p
    return ret

  def stack(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Stack tensors of one shape along a new dim (`Tensor.stack(a, b)`, `a.stack(b)` or `Tensor.stack([a, b])`)."""
    ts = tensor_seq("stack", self, args)
    if bad := [t.shape for t in ts if t.shape != ts[0].shape]:
      raise ValueError(f"stack needs tensors of one shape, got {ts[0].shape} and {bad[0]}")
    d = ts[0]._resolve_dim(dim, extra=True)
    return Tensor.cat(*[t.unsqueeze(d) for t in ts], dim=d)

  def repeat(self, repeats: Any, *args: Any) -> Tensor:
    """Tile the tensor: `repeats` per dim (may add leading dims)."""
    reps = argfix(repeats, *args)
    if bad := [r for r in reps if not isinstance(r, int) or isinstance(r, bool) or r < 0]:
      raise ValueError(f"repeat {tuple(reps)}: repeats must be non-negative ints, got {bad[0]!r}")
    if len(reps) < self.ndim: raise ValueError(f"repeat {reps} has fewer dims than shape {self.shape}")
    base = (1,) * (len(reps) - self.ndim) + self.shape
    x = self.reshape([v for s in base for v in (1, s)]).expand([v for r, s in zip(reps, base) for v in (r, s)])
    return x.reshape([r * s for r, s in zip(reps, base)])

  def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
    """Repeat each element `repeats` times along `dim` (of the flattened tensor when None)."""
    x, d = (self.flatten(), 0) if dim is None else (self, self._resolve_dim(dim))
    shp = x.shape
    return x.reshape(*shp[:d + 1], 1, *shp[d + 1:]).expand(*shp[:d + 1], repeats, *shp[d + 1:]) \
            .reshape(*shp[:d], shp[d] * repeats, *shp[d + 1:])

  def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Split along `dim` into chunks of `sizes` (an int: equal chunks, the last smaller)."""
    d = self._resolve_dim(dim)
    n = self.shape[d]
    parts: Sequence[sint]
    if isinstance(sizes, int):
      if sizes <= 0: raise ValueError(f"split size must be > 0, got {sizes}")
      parts = [min(sizes, n - i) for i in range(0, max(n, 1), sizes)] if n else [0]
    else: parts = sizes
    if sum(parts) != n: raise ValueError(f"split sizes {list(parts)} don't sum to dim {d} of size {n}")
    starts = list(itertools.accumulate(parts, initial=0))
    return tuple(self.shrink(tuple((starts[i], starts[i] + sz) if j == d else None for j in range(self.ndim)))
                 for i, sz in enumerate(parts))

  def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
    """Split into `chunks` pieces along `dim`."""
    if chunks <= 0: raise ValueError(f"chunk: chunks must be > 0, got {chunks}")
    n = self.shape[self._resolve_dim(dim)]
    return list(self.split(ceildiv(n, chunks) if n else [0] * chunks, dim=dim))

  # ***** linear algebra *****
  def dot(self, w: Tensor, dtype: Any = None) -> Tensor:
    """Matrix product with tinygrad's/numpy's rules for 1-D and batched operands.

    >>> (Tensor([[1.0, 2.0], [3.0, 4.0]]) @ Tensor([1.0, 1.0])).tolist()
    [3.0, 7.0]
    """
    dx, dw = self.ndim, w.ndim
    if dx == 0 or dw == 0: raise RuntimeError(f"both tensors need to be at least 1D, got {dx}D and {dw}D")
    axis_w = -min(dw, 2)
    if self.shape[-1] != w.shape[axis_w]:
      raise RuntimeError(f"cannot dot {self.shape} and {w.shape}: inner dims {self.shape[-1]} != {w.shape[axis_w]}")
    in_dt = least_upper_dtype(self.dtype, w.dtype)
    out_dt = in_dt if dtype is None else to_dtype(dtype)
    acc = sum_acc_dtype(in_dt) if dtype is None else out_dt
    bf16 = dx == 2 and dw == 2 and dtype is None and self.dtype == w.dtype == dtypes.bfloat16
    bf16k = _bf16_kernel(self, w) if bf16 else None
    whole = bf16k is not None  # one kernel of its own takes the product
    if bf16k == "avx512_bf16": return _bf16_whole(self, w, acc)
    panel = _gemm_panel(self, w, acc) if dx >= 2 and dw >= 2 and not whole else 0
    if panel and dw == 2:
      # the CPU's register block reads B in column strips: B realized once as contiguous (n // P, k, P) panels; an A
      # of 3 or more dims has its rows flattened into `_packed_product`'s one graph and its batch dims restored
      out = _packed_product(self if dx == 2 else self.reshape(-1, self.shape[-1]), w, panel, acc, out_dt)
      return out if dx == 2 else out.reshape(*self.shape[:-1], w.shape[-1])
    # (a batched B packed into panels needs no contiguous copy first: the panel copy gathers it once already)
    if dx >= 2 and dw >= 3 and not panel and _batched_strided_pack(self, w): w = w.contiguous()
    x = self.reshape(*self.shape[:-1], *[1] * min(dx - 1, dw - 1, 1), self.shape[-1])
    ww = w.reshape(*w.shape[:-2], *[1] * min(dx - 1, dw - 1, 1), *w.shape[axis_w:]).transpose(-1, axis_w)
    if dtypes.is_float(in_dt) and dtypes.is_float(acc) and acc.itemsize > in_dt.itemsize:
      x, ww = x.cast(acc), ww.cast(acc)  # half/bfloat16: exact products summed in float, rounded once (as torch)
    if whole:
      # AMX tiles (tiny_codegen.x86_amx) or vdpbf16ps (x86_bf16): one kernel, the plain float32 sum of bf16 products
      # rounded to bf16, which the kernels' recogniser matches; they pack B's k-pairs themselves (no second launch)
      if bf16k == "amx" and (pad := _amx_row_pad(self, w)):  # A's rows a cache line further apart (`a_row_pad`)
        (m, k), n = self.shape, w.shape[1]
        x = self.pad(((0, 0), (0, pad))).contiguous().shrink(((0, m), (0, k))).reshape(m, 1, k).cast(acc)
      out = (x * ww).sum(-1).cast(out_dt)
      # the kernel's own launch: an epilogue fused into it (a bias, an activation) is no AST either kernel matches,
      # and the plain sum lowered unpacked would be far slower than the float32 GEMM it replaces
      return out.contiguous()
    if panel:
      # a batched B likewise, each matrix its own panels: (*batch, n // P, k, P), broadcast over A's rows
      bw, (k, n) = w.shape[:-2], w.shape[-2:]
      nb = len(bw)
      wp = ww.transpose(-1, -2).reshape(*bw, k, n // panel, panel)
      wp = wp.permute(*range(nb), nb + 1, nb, nb + 2).contiguous().reshape(*bw, 1, n // panel, k, panel)
      xp = x.reshape(*self.shape[:-1], 1, k, 1)
      out = (xp * wp).sum(-2, dtype=dtype).cast(out_dt)
      return out.reshape(*out.shape[:-2], n)
    return (x * ww).sum(-1, dtype=dtype).cast(out_dt)

  def matmul(self, x: Tensor, reverse: bool = False, dtype: Any = None) -> Tensor:
    """self @ x."""
    return x.dot(self, dtype=dtype) if reverse else self.dot(x, dtype=dtype)

  def sequential(self, ll: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
    """Apply the callables in order: `x.sequential([layer1, Tensor.relu, layer2])`."""
    ret = self
    for f in ll: ret = f(ret)
    return ret

  def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """self @ weight + bias (a 1-D weight scales elementwise)."""
    x = self.mul(weight) if weight.ndim == 1 else self.dot(weight)
    return x.add(bias) if bias is not None else x

  # ***** casts by name *****
  # last in the class: these methods are named bool/int/float, and a type checker would read those names in the
  # annotations below them (`keepdim: bool`) as the methods, not the builtins
  def float(self) -> Tensor:
    """Cast to float32."""
    return self.cast(dtypes.float32)
  def half(self) -> Tensor:
    """Cast to float16."""
    return self.cast(dtypes.float16)
  def double(self) -> Tensor:
    """Cast to float64."""
    return self.cast(dtypes.float64)
  def bfloat16(self) -> Tensor:
    """Cast to bfloat16."""
    return self.cast(dtypes.bfloat16)
  def int(self) -> Tensor:
    """Cast to int32."""
    return self.cast(dtypes.int32)
  def long(self) -> Tensor:
    """Cast to int64."""
    return self.cast(dtypes.int64)
  def short(self) -> Tensor:
    """Cast to int16."""
    return self.cast(dtypes.int16)
  def char(self) -> Tensor:
    """Cast to int8."""
    return self.cast(dtypes.int8)
  def bool(self) -> Tensor:
    """Cast to bool (nonzero is True)."""
    return self.cast(dtypes.bool)



_BF16_KERNELS: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # `_bf16_kernel`'s answers, with what they depend on
_BF16_MODS: list[Any] = []  # `_bf16_kernel`'s modules (cpu_probe, x86_amx, x86_bf16) and Device, once imported


def _bf16_kernel(x: Tensor, w: Tensor) -> str | None:
  """Which CPU kernel takes bfloat16 `x @ w` (2-D) whole: "amx" (`_amx_tiles`), else "avx512_bf16" where
  `tiny_codegen.x86_bf16`'s `vdpbf16ps` kernel takes the shape on the CPU device (`x86_bf16.for_renderer`: the LLVM
  renderer, the shape's plan, the probe ran the instruction); None: the packed float32 GEMM. Kept per CPU renderer
  object and shape with everything else the answer depends on (the renderer's threads and machine model, the
  threads' stack size, the probe's switch, the probe functions themselves: a test may replace one; their results
  last the process), each compared by identity on a hit: asked afresh, the chain of checks took 160-190 us of CPU a
  call right after a 1024^2 product's kernel had evicted the interpreter's data (Zen 4), 3% of its 2-thread kernel
  time; hashing the machine model into a key cost ~30 us of that."""
  if x.device != "CPU" or w.device != "CPU": return None
  (m, k), n = x.shape, w.shape[1]
  if not isinstance(m, int) or not isinstance(k, int) or not isinstance(n, int): return None  # symbolic shapes
  if not _BF16_MODS:  # imported once, not by an import statement a call (~16 us cold after the kernel)
    from tiny_codegen import cpu_probe, x86_amx, x86_bf16
    from tiny_uop.plugins import Device
    _BF16_MODS.extend((cpu_probe, x86_amx, x86_bf16, Device))
  cpu_probe, x86_amx, x86_bf16, Device = _BF16_MODS
  r = (Device._opened.get("CPU") or Device["CPU"]).renderer  # (the open device first: `[]` parses the name)
  deps = (getattr(r, "threads", 1), getattr(r, "machine", None), x86_amx.thread_stack_limit(),
          os.environ.get("TINY_CPU_PROBE"), cpu_probe.probe, cpu_probe.executes, x86_amx.request_tile_state,
          x86_amx._arch_prctl_tiles, x86_bf16.usable)
  if (hit := _BF16_KERNELS.get((r, m, k, n))) is not None and all(a is b or a == b for a, b in zip(hit[1], deps)):
    return hit[0]
  if len(_BF16_KERNELS) >= 256: _BF16_KERNELS.clear()  # a bound: the renderer objects it holds stay few
  kind = "amx" if _amx_tiles(x, w) else "avx512_bf16" if x86_bf16.for_renderer(r, m, n, k) is not None else None
  _BF16_KERNELS[(r, m, k, n)] = (kind, deps)
  return kind


def _bf16_whole(x: Tensor, w: Tensor, acc: DType) -> Tensor:
  """`dot`'s graph for a 2-D bfloat16 `x @ w` that `x86_bf16`'s kernel takes whole (`_bf16_kernel`): the plain
  float32 sum of the widened products, rounded to bfloat16, in its own buffer (what the kernel's recogniser matches),
  its nodes made directly as `_packed_product` makes its own: through `Tensor`'s ops (two reshapes, a transpose, two
  casts, the broadcasts, the sum's reshape: ~12 Tensors and their checks) the graph took 0.1 ms of CPU a call warm,
  0.28 cold after the product's own kernel, 3% of a 1024^2 product's one-thread kernel time (Zen 4). The nodes are
  interned as the UOp methods would make them (`_INTERN`), without the movement ops' eager shape checks (the shapes
  are `dot`'s, checked), and the result's device is x's (`_bf16_kernel`: both on the CPU), set on it rather than
  found by a walk of the new nodes: 48 + 25 us of the call's ~110 us of graph building, cold after the kernel."""
  (m, k), n = x.shape, w.shape[1]
  if not (isinstance(m, int) and isinstance(k, int) and isinstance(n, int)):  # never: `_bf16_kernel` took int shapes
    raise TypeError(f"bfloat16 matmul kernel needs int shapes, got {x.shape} @ {w.shape}")
  full, xb, wb, dt = (m, n, k), x.uop, w.uop, x.dtype
  xu = _INTERN(UOp, Ops.CAST, acc, (_INTERN(UOp, _RESHAPE, xb.dtype, (xb,), (m, 1, k)),))
  if n != 1: xu = _INTERN(UOp, Ops.EXPAND, acc, (xu,), full)  # (`expand` to its own shape is the node itself)
  wt = _INTERN(UOp, Ops.PERMUTE, wb.dtype, (_INTERN(UOp, _RESHAPE, wb.dtype, (wb,), (1, k, n)),), (0, 2, 1))
  wu = _INTERN(UOp, Ops.CAST, acc, (wt,))
  if m != 1: wu = _INTERN(UOp, Ops.EXPAND, acc, (wu,), full)
  red = _INTERN(UOp, Ops.REDUCE_AXIS, acc, (_INTERN(UOp, Ops.MUL, acc, (xu, wu)),), (Ops.ADD, (2,)))
  out = _INTERN(UOp, Ops.CONTIGUOUS, dt, (_INTERN(UOp, Ops.CAST, dt, (_INTERN(UOp, _RESHAPE, acc, (red,), (m, n)),)),))
  if "device" not in (c := out._cache) and (dev := xb._cache.get("device")) is not None: c["device"] = dev
  return x._wrap(out, w)


def _amx_tiles(x: Tensor, w: Tensor) -> bool:
  """Whether `dot` sends bfloat16 `x @ w` (2-D) to the CPU's AMX tile kernel: both on the CPU device with the LLVM
  renderer, int shapes the kernel's 32 x 32 blocks divide, and `request_tile_state()` (the probe ran the tiles in a
  child process and this process got the tile state): never an instruction the probe didn't confirm."""
  if x.device != "CPU" or w.device != "CPU": return False
  (m, k), n = x.shape, w.shape[1]
  if not isinstance(m, int) or not isinstance(k, int) or not isinstance(n, int): return False  # symbolic shapes
  from tiny_codegen import x86_amx
  if not x86_amx.fits(m, n, k): return False
  from tiny_uop.plugins import Device
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  return isinstance(Device["CPU"].renderer, LLVMRenderer) and x86_amx.request_tile_state()


def _amx_row_pad(x: Tensor, w: Tensor) -> int:
  """Elements `dot` pads A's rows by before the AMX tile kernel (`x86_amx.a_row_pad` for the CPU's L1d set span)."""
  from tiny_codegen import x86_amx
  from tiny_codegen.machine import machine_of
  from tiny_uop.plugins import Device
  k, n = x.shape[1], w.shape[1]
  if not isinstance(k, int) or not isinstance(n, int): return 0  # never: `_amx_tiles` held
  mach = machine_of(Device["CPU"].renderer)
  return x86_amx.a_row_pad(n, k, mach.l1d_set_span, mach.l1d_ways)


def _packed_product(x: Tensor, w: Tensor, panel: int, acc: DType, out_dt: DType) -> Tensor:
  """`x @ w` for a 2-D `x` (M, K) and a 2-D `w` (K, N) that `dot` packs (`panel` columns, `_gemm_panel`): B realized
  once as contiguous (n // P, k, P) panels and the products summed over k in `acc`, then cast to `out_dt` (`dot`'s
  dtypes: half/bfloat16 operands as exact float32 products, an explicit `dtype` as the sum's). The one graph of
  every packed 2-D B (a batched A is flattened to 2-D first), its nodes made directly (the shapes are known ints):
  the same graph through `Tensor`'s movement ops (reshape's checks, two transposes that cancel, ~14 Tensors) took
  0.2-0.4 ms of CPU a call on the Xeon 6/207 (now 0.09-0.14), 2-4% of a two-thread 1024^2 product's kernel time."""
  (m, k), n = x.shape, w.shape[1]
  if not (isinstance(m, int) and isinstance(k, int) and isinstance(n, int)):  # never: `_gemm_panel` packs int shapes
    raise TypeError(f"packed matmul needs int shapes, got {x.shape} @ {w.shape}")
  # the products' dtype: both operands' common one, or `acc` where it is a wider float (as `dot`'s other branches)
  prod_dt = least_upper_dtype(x.dtype, w.dtype)
  if dtypes.is_float(prod_dt) and dtypes.is_float(acc) and acc.itemsize > prod_dt.itemsize: prod_dt = acc
  xu, wu = (u if u.dtype == prod_dt else u.cast(prod_dt) for u in (x.uop, w.uop))
  full = (m, n // panel, k, panel)
  wp = wu.reshape((k, n // panel, panel)).permute((1, 0, 2)).contiguous().reshape((1, *full[1:])).expand(full)
  prods = xu.reshape((m, 1, k, 1)).expand(full).alu(Ops.MUL, wp)
  out = (prods if prod_dt == acc else prods.cast(acc)).r(Ops.ADD, (2,)).reshape((m, n))
  return x._wrap(out if acc == out_dt else out.cast(out_dt), w)


def _gemm_panel(x: Tensor, w: Tensor, acc: DType) -> int:
  """The panel width `dot` packs its right operand `w` into for `x @ w` on x's device (0: don't): the CPU
  heuristics' call (`tiny_codegen.opt.heuristic.gemm_panel`), for plain ints shapes on one device whose renderer
  knows its vector registers. `w` is read across its rows (strided) when it is a transposed view (`w.T`, as
  nn.Linear passes its weight; `w.transpose(-1, -2)` batched). A batched `w` (3-D or more) is judged per matrix,
  with A's last-but-one axis as its rows: in place each matrix's column strip thrashes the L2 as a 2-D one does
  ((4, 1024, 1024) @ (4, 1024, 1024) float32, one thread, Xeon 6/207: 72 GFLOPS of CPU time against 149 for one
  packed 1024^2 product and numpy's 154)."""
  if not isinstance(x.device, str) or x.device != w.device or not all(isinstance(s, int) for s in (*x.shape, *w.shape)):
    return 0
  k, n = x.shape[-1], w.shape[-1]
  if not isinstance(k, int) or not isinstance(n, int): return 0  # never (all dims are ints): narrows the types
  from tiny_uop.plugins import Device
  renderer = Device[x.device].renderer
  if not hasattr(renderer, "vector_registers"): return 0
  from tiny_codegen.opt.heuristic import gemm_panel
  nd = w.ndim
  strided = w.uop.op is Ops.PERMUTE and w.uop.arg == (*range(nd - 2), nd - 1, nd - 2)
  # a 2-D B serves all of A's rows; a batched one (each matrix its own) at least A's last-but-one axis
  rows = prod(x.shape[:-1]) if nd == 2 else x.shape[-2]
  if not isinstance(rows, int): return 0
  return gemm_panel(renderer, rows, k, n, acc.itemsize if dtypes.is_float(acc) else 0, strided)


def _batched_strided_pack(x: Tensor, w: Tensor) -> bool:
  """Whether `dot` copies a batched right operand contiguous first: attention's `q @ k.T` gets k as a permuted view
  whose K axis is the source's last (contiguous) one, so the CPU's register block, whose vector runs along B's
  columns, would gather each vector's lanes K elements apart, once per block of rows; the copy gathers them once.
  The same rule as a 2-D strided B (`tiny_codegen.opt.heuristic.pack_min_rows_strided`: from that many rows of
  A, counted in register blocks); any size, since a gather costs its loads even from L1 (64 tokens, 2 heads of 64:
  36 -> 20 us a product with the copy, one thread of the Xeon 6/207, AVX-512). Seen through elementwise ops with
  scalar other operands (an EXPAND: a broadcast constant), which the copy then computes once."""
  if not isinstance(x.device, str) or x.device != w.device or not dtypes.is_float(w.dtype): return False
  u = w.uop
  for _ in range(4):  # through a few elementwise ops (`k * scale`: GPT-2 scales k^T) whose other sources are scalars
    if u.op not in GroupOp.Elementwise: break
    full = [s for s in u.src if s.op is not Ops.EXPAND]
    if len(full) != 1: return False
    u = full[0]
  if u.op is not Ops.PERMUTE or u.arg[-2] != len(u.arg) - 1 or u.arg[-1] == len(u.arg) - 1: return False
  if not all(isinstance(s, int) for s in (*x.shape, *w.shape)): return False
  from tiny_uop.plugins import Device
  regs = getattr(Device[x.device].renderer, "vector_registers", (0, 0))[0]
  if not regs: return False
  from tiny_codegen.opt.heuristic import pack_min_rows_strided
  rows = x.shape[-2]
  return isinstance(rows, int) and rows >= pack_min_rows_strided(regs)


def _pow_float(b: Tensor, e: Tensor) -> Tensor:
  """b ** e for float tensors with C's pow special cases, and torch's gradients (finite at b == 0)."""
  neg = (b < 0) | ((b == 0) & (b.reciprocal() < 0))  # -0.0 is negative for the sign of odd powers
  ab = (b < 0).where(-b, b)
  mag = (ab == 1).where(1.0, (e * ab.log2()).exp2())  # |b| == 1: log2 is 0, and 0 * inf would be NaN
  e_int = e == e.trunc()  # +-inf count as even integers
  e_odd = e_int & ((e * 0.5) != (e * 0.5).trunc())
  ret = (neg & e_odd).where(-mag, mag)
  ret = ((b < 0) & (b != -math.inf) & e_int.logical_not()).where(math.nan, ret)  # a negative base, fractional power
  out = ((e == 0) | (b == 1)).where(1.0, ret)
  def grad(g: Tensor, r: Tensor, b: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    db = (e == 0).where(0.0, g * e * _pow_float(b.detach(), e.detach() - 1))
    de = ((b == 0) & (e >= 0)).where(0.0, g * r * b.log())
    return db, de
  return with_gradient(out, (b, e), grad)


def _grad_candidates() -> list[Tensor]:
  """The live floating-point tensors whose requires_grad is not False (backward may fill their .grad), each once:
  every such tensor is in one of these registries (lazy, realized with or without its graph, or set requires_grad)."""
  seen: set[int] = set()
  out: list[Tensor] = []
  for reg in (_grad_tensors, _lazy_tensors, _origin_tensors, _real_tensors):
    for t in _live(reg):
      if id(t) not in seen and t._requires_grad is not False and dtypes.is_float(t._uop.dtype):
        seen.add(id(t))
        out.append(t)
  return out


def _multi_targets(root: Tensor, pairs: list[tuple[Tensor, UOp]]) -> list[tuple[Tensor, UOp]]:
  """The (tensor, node) targets backward can fill through the multi-device gradient, which stops at every target's
  shards (one shard of a replicated tensor may be a copy of another): the root, realized tensors, tensors set
  requires_grad=True, and a lazy or realized derived tensor whose graph holds no other target (a `.shard()` of
  data). A held intermediate computed from another target is left out: stopping at it would cut that one's gradient."""
  def plain(t: Tensor, n: UOp) -> bool:
    return t is root or id(t) in _leaf_tensors or (n is t.uop and all(engine.is_realized(s) for s in _shards(n)))
  shard_of = {s: t for t, n in pairs for s in _shards(n)}
  def upstream_free(t: Tensor, n: UOp) -> bool:
    return all(shard_of.get(u, t) is t for u in UOp.sink(*_shards(n)).toposort())
  return [(t, n) for t, n in pairs if plain(t, n) or upstream_free(t, n)]


def _shards(u: UOp) -> tuple[UOp, ...]:
  """The per-device graphs of a sharded tensor's UOp (the UOp itself otherwise)."""
  return u.src if u.op is Ops.MULTI else (u,)


def _has_identity(u: UOp) -> bool:
  """Whether `u` is unlike any other graph: it reads a buffer (a realized tensor, a random number's counter). One of
  constants alone (consts, arange) is equal to (the same node as) every equal graph; a sharded or symbolic-shaped
  one is left as it is."""
  if engine.is_realized(u) or u.op is _MULTI or isinstance(u.device, tuple): return True
  if any(not isinstance(s, int) for s in (u.shape or ())): return True
  stack, seen = [u], {u}
  while stack:  # depth first, stopping at the first buffer (a realized source is usually a few nodes down)
    n = stack.pop()
    if n.op is _BUFFER: return True
    for s in n.src:
      if s not in seen:
        seen.add(s)
        stack.append(s)
  return False


def _size_differs(a: sint, b: sint) -> bool:
  """a != b for sizes; symbolic ones are compared after simplifying (4*n*1 is 4*n)."""
  if isinstance(a, int) and isinstance(b, int): return a != b
  a2, b2 = (x.simplify() if isinstance(x, UOp) else x for x in (a, b))
  return a2 is not b2 and not (isinstance(a2, int) and isinstance(b2, int) and a2 == b2)


def _expand_origins(root: UOp, keep: set[UOp]) -> UOp:
  """root's graph with realized tensors replaced by the graphs they were computed from (not those in `keep`), so
  gradients flow through values that were realized (e.g. printed) before backward."""
  origins: dict[UOp, UOp] = {}
  views: dict[UOp, UOp] = {}  # origins that are a view chain of their own node's buffer (realize copied nothing)
  for t in _live(_origin_tensors):
    if t._origin is None or t.uop in keep: continue
    for u, o in zip(_shards(t.uop), _shards(t._origin)):
      if u in keep or o is u: continue  # (a node that is another value's: no origin of its own)
      if engine.is_realized(u) and _chain_base(o) is (u if u.op is _BUFFER else u.src[0]): views[u] = o
      else: origins[u] = o
  # a node two tensors were realized into: the one computed wins over one that only views it; views of one buffer
  # realized into each other (`a.flatten()` and `a.flatten().reshape(())` both realized) lead nowhere but in a loop
  origins.update(_acyclic_views({u: o for u, o in views.items() if u not in origins}))
  for _ in range(32):
    if not origins or not any(u in origins for u in root.toposort()): break
    root = root.substitute(origins)
  return root


def _acyclic_views(views: dict[UOp, UOp]) -> dict[UOp, UOp]:
  """`views` without the entries that lead back to themselves through the others' chains (each chain is a few
  one-source nodes, so the walks are short)."""
  succ = {u: [n for n in _chain(o) if n in views and n is not u] for u, o in views.items()}
  def loops(u: UOp) -> bool:
    seen, stack = set(), list(succ[u])
    while stack:
      if (n := stack.pop()) is u: return True
      if n not in seen:
        seen.add(n)
        stack.extend(succ[n])
    return False
  return {u: o for u, o in views.items() if not loops(u) and not _on_chain(o, u)}


def _chain(u: UOp) -> list[UOp]:
  """u and the nodes down its chain of one-source ops."""
  out = [u]
  while len(u.src) == 1 and u.op is not _BUFFER:
    u = u.src[0]
    out.append(u)
  return out


def _on_chain(o: UOp, u: UOp) -> bool: return any(n is u for n in _chain(o))


def _old_value_readers(uops: list[UOp], ts: list[Tensor]) -> list[Tensor]:
  """Live lazy tensors (other than `ts`) whose graphs read, not through the ASSIGN, a buffer that an ASSIGN among
  `uops` writes, and would still read it after this realize: they want its value from before the write.

  Realizing `uops` gives buffers to the values other graphs share with them (`_shared_with_other_graphs`), and a
  reader whose reads of the buffer all go through such values is fine (e.g. the loss reads the forward's activations,
  which the backward computes); so this plans the schedule once to see which values get buffers."""
  targets: set[UOp] = set()
  for u in uops:  # (a loop: this runs on every realize)
    if u.op is Ops.ASSIGN and (b := _base_buffer(u.src[0])) is not None: targets.add(b)
  if not targets: return []
  # a view of a target (movement ops and detach: torch's views) reads the buffer after the write, and sees it
  cands = [t for t in _live(_lazy_tensors) if not any(t is x for x in ts) and not engine.is_realized(t.uop)
           and _view_bottom_buffer(t.uop) not in targets]
  if not cands: return []
  def reading(done: Any) -> list[Tensor]:
    # one walk over all their graphs (toposorts are not cached on nodes: a walk per tensor would repeat the graphs
    # they share): a node reads an old value if it is a target buffer or, unless it is an ASSIGN (its value is the
    # new one) or gets a buffer in this realize (`done`), one of its sources does
    old: dict[UOp, bool] = {}
    for n in UOp.sink(*dict.fromkeys(t.uop for t in cands)).toposort():
      old[n] = n in targets or (n.op is not Ops.ASSIGN and n not in done and any(old[x] for x in n.src))
    return [t for t in cands if old[t.uop]]
  if not (cands := reading(())): return []
  return reading(engine.plan(uops, _shared_with_other_graphs(uops)).becomes)


def _shared_with_other_graphs(uops: list[UOp]) -> set[UOp]:
  """Nodes of the graphs of `uops` that other lazy tensors' graphs use too: if realizing `uops` gives one of them a
  buffer anyway, those tensors read it instead of computing it again (e.g. `opt.step()` then `loss.realize()` must not
  run the forward pass twice)."""
  roots = set(uops)
  # (a pure view of a buffer computes nothing and no schedule gives it a buffer: it shares no value worth exposing,
  # e.g. the ONNX runner's cached conv weights, PERMUTEs of their buffers, which would expose every weight)
  others = [u for t in _live(_lazy_tensors) if (u := t.uop) not in roots and not _buffer_view_chain(u)]
  if not others: return set()
  mine = UOp.sink(*uops).toposort()
  # one walk over all the other graphs together (linear in their size, however many tensors share them)
  return {u for u in UOp.sink(*dict.fromkeys(others)).toposort()
          if u in mine and u.op not in _NO_VALUE and not _buffer_view_chain(u)}


_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.FLIP})  # views that read no padding
_NO_VALUE = frozenset({Ops.DEVICE, Ops.UNIQUE})  # graph leaves that are no value: never given a buffer


def _buffer_view_chain(u: UOp) -> bool:
  """Whether `u` is a BUFFER or a chain of movement ops (no PAD) down to one: a view of a realized buffer."""
  while u.op in _VIEW_OPS: u = u.src[0]
  return u.op is _BUFFER


def _apply_becomes(becomes: dict[UOp, UOp]) -> None:
  """Point every live tensor at the realized buffers: a tensor whose node was realized takes its buffer, and a lazy
  tensor whose graph uses a realized node has it substituted (so it is not computed again). The graph a tensor had
  before is kept in `_origin` for autograd."""
  # a 0-d value may come back 1-d
  fixed = {k: (v if v.shape == k.shape else v.reshape(unwrap(k.shape))) for k, v in becomes.items()}
  lazy: list[Tensor] = []
  for t in _live(_lazy_tensors):
    if (n := fixed.get(t._uop)) is not None:
      n, origin = _realized_node(t, n)
      if origin is not t._origin_uop: t._origin = origin
      t.uop = n
    if (u := t._uop).op is _BUFFER or (u.op is _RESHAPE and u.src[0].op is _BUFFER):  # is_realized(u)
      with _registry_lock: _lazy_tensors.pop(id(t), None)
    else: lazy.append(t)
  if not lazy: return
  # which lazy graphs use a realized node: one walk over all of them, marking every node that reaches one
  uses: dict[UOp, bool] = {}
  for u in UOp.sink(*dict.fromkeys(t.uop for t in lazy)).toposort():
    uses[u] = u in fixed or any(uses[x] for x in u.src)
  todo = [t for t in lazy if uses[t.uop]]
  if not todo: return
  roots = list(dict.fromkeys(t.uop for t in todo))
  new = dict(zip(roots, UOp.sink(*roots).substitute(fixed, name="apply becomes").src))
  for t in todo:
    # as for a realized tensor (`_realized_node`): a graph that collapses onto a node it is made of
    # (`x.flatten().reshape(())` once `x.flatten()` is realized is x's own node) keeps that node as its origin, not
    # its old graph, which would contain its own key
    n = new[t.uop]
    if _keeps_origin(t, n): t._origin = t.uop
    elif _keeps_origin(t) or (t._origin_uop is not None and _aliases(t._origin_uop, n)): t._origin = n
    t.uop = n


def _apply_becomes_alone(ts: list[Tensor], becomes: dict[UOp, UOp]) -> bool:
  """`_apply_becomes` when `ts` are the only live lazy tensors and each one's node was realized (the eager hot path):
  each takes its buffer (its graph kept in `_origin`), with no walk over other graphs. False (nothing done) when some
  tensor of `ts` is not a key of `becomes` (a sharded one, one realized already, a view whose shape differs): the
  caller applies `becomes` in general."""
  if len(ts) > 1 and len({id(t) for t in ts}) != len(ts): return False  # `Tensor.realize(a, a)`
  new = []
  for t in ts:
    if (n := becomes.get(t._uop)) is None or (n.op is not _BUFFER and n.op is not _RESHAPE): return False
    if n.shape != t._uop.shape: return False  # (a 0-d root's buffer may come back 1-d from the scheduler)
    new.append(_realized_node(t, n))
  with _registry_lock:
    for t, (n, origin) in zip(ts, new):
      _set_origin(t, origin)
      t._uop = n  # a buffer view: no longer lazy (what the `uop` setter does for a realized node)
      _lazy_tensors.pop(id(t), None)
  return True


def _realized_node(t: Tensor, new: UOp) -> tuple[UOp, UOp | None]:
  """The node tensor `t` takes when realize gives it `new`, and the origin it keeps for autograd (`_keeps_origin`).

  An origin must not contain its own key: substituting it at backward would lead back to itself (`substitute: ...
  leads back to itself (cycle)`). Realize copies nothing for a pure view of a realized buffer and gives `t` a view
  of that buffer, which can be a node of `t`'s own graph (or origin):
  - a bare BUFFER (`x.flatten()` of a realized 0-d `x`, whose node is `RESHAPE(B, ())`, is `B` itself) is the bottom
    of every such chain and leads to no leaf: `t` takes a same-shape RESHAPE of it, a node of its own (unless that
    one is on the chain too), so that its origin, which reads `B`, still leads gradients to `x`;
  - another view that is on the chain (`x.flatten().reshape(())` is `x`'s own node): `t` is that node, whose graph
    leads to the leaves by itself; its origin is that node itself (a no-op at backward), not none, which would make
    backward take the node for a leaf's and stop there (`c = y.contiguous()` realized with `y` is `y`'s node)."""
  origin = t._origin_uop
  if new.op is _BUFFER and t._requires_grad is not False and \
     (_chain_base(t._uop) is new or (origin is not None and _chain_base(origin) is new)):
    own = UOp(_RESHAPE, new.dtype, (new,), new.shape)
    if not (_aliases(t._uop, own) or (origin is not None and _aliases(origin, own))): new = own
  if origin is not None: return new, (new if _aliases(origin, new) else origin)
  if _keeps_origin(t, new): return new, t._uop
  return new, (new if _keeps_origin(t) else None)


def _chain_base(u: UOp) -> UOp:
  """The node at the bottom of `u`'s chain of one-source ops (views, contiguous): the buffer a pure view reads."""
  while len(u.src) == 1 and u.op is not _BUFFER: u = u.src[0]
  return u


def _set_origin(t: Tensor, origin: UOp | None) -> None:
  """Record the graph `t` keeps for autograd once realized (under `_registry_lock`): one with a graph is found by
  backward in `_origin_tensors`, one without is a leaf of backward's (`_real_tensors`)."""
  if origin is not t._origin_uop:
    t._origin_uop = origin
    if origin is not None: _origin_tensors[id(t)] = t
  if origin is None: _real_tensors[id(t)] = t


def _take_realized(t: Tensor, new: UOp) -> None:
  """`_apply_becomes_alone([t], {t.uop: new})` for a lone lazy tensor `t` whose realized view `new` has its shape
  already (`engine.replay_root`'s): `t` takes it (`_realized_node`), its graph kept as its origin."""
  n, origin = _realized_node(t, new)
  with _registry_lock:
    _set_origin(t, origin)
    t._uop = n  # a buffer view: no longer lazy (what the `uop` setter does for a realized node)
    _lazy_tensors.pop(id(t), None)


def _take_fresh(t: Tensor, pending: engine.Pending) -> None:
  """`_take_realized(t, view)` for a buffer the replay just made, pending (`engine._replay_root_locked`: `t._uop`
  makes its view when read; the eager hot path): no graph of `t`'s (nor its origin) can hold it, so
  `_realized_node` keeps `t`'s origin if it has one, else takes `t`'s graph as its origin unless `t` doesn't track
  gradients (requires_grad False) or is an assign. `t` holds a graph (`t._u` set: the caller read it)."""
  u, origin = t._u, t._origin_uop
  assert u is not None  # (for mypy; the caller replayed this very node)
  if origin is None and t._requires_grad is not False and u.op is not _ASSIGN: origin = u
  _registry_lock.acquire()  # (not `with`: see `Tensor.realize`)
  try:
    # its entry leaves the lazy registry; its weak reference (one per object) goes on into the next registry
    r = _lazy_tensors.data.pop(id(t), None)
    if r is None or r() is not t: r = _weakref(t)  # (not registered, or a dead tensor's entry of the same id)
    reg = _real_tensors if origin is None else None
    if origin is not t._origin_uop:
      t._origin_uop = origin
      reg = _origin_tensors
    if reg is not None:  # `reg.put_ref(id(t), r)`, inlined
      (d := reg.data)[id(t)] = r
      if len(d) > reg.limit: reg.live()
    t._u, t._pend = None, pending  # a buffer, its view made when read: no longer lazy
  finally: _registry_lock.release()


def _keeps_origin(t: Tensor, new: UOp | None = None) -> bool:
  """Whether `t`'s graph is kept for autograd when it is realized (into `new`): not for requires_grad=False, nor for
  an assign (a sharded one too): that is a leaf written in place, whose old graph contains its own buffer; nor when
  `new` is a view the old graph is made of (`p.reshape(3, 1).contiguous()` of a realized `p` is p's buffer, no copy):
  the realized view leads to the leaves itself, and an origin that contains it would substitute into itself."""
  u = t._uop
  return t._requires_grad is not False and t._origin_uop is None and \
    (u.op is not _ASSIGN if u.op is not _MULTI else all(s.op is not _ASSIGN for s in u.src)) and \
    (new is None or not _aliases(u, new))


def _aliases(old: UOp, new: UOp) -> bool:
  """Whether `new` (a realized view) is reached from `old` down its chain of one-source ops (contiguous, views): the
  scheduler gave `old` an existing buffer instead of a copy. A chain walk, so cheap on every realize."""
  while True:
    if old is new: return True
    if len(old.src) != 1 or old.op is _BUFFER: return False
    old = old.src[0]


_gradient.set_cos(lambda x: Tensor(x).cos().uop)  # d sin x = cos x as Tensor.cos builds it (gradient.py is below)
