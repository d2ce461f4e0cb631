"""The state that `Tensor`, its mixins and `TinyJit` share, kept below all of them so that none imports another for
it: the registries of live tensors (by id, held weakly) that realize and setitem list, and which `TinyJit` is
capturing in this thread.

Everything here is plain data over `Tensor` objects; this module imports no other module of tiny_tensor.
"""
from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor


class _Registry:
  """Live tensors by id, held weakly: a lighter `weakref.WeakValueDictionary` (every eager op registers its result in
  `_lazy_tensors` and every realize lists it). An entry is a plain weak reference (CPython keeps one per object, so
  registering costs no allocation) and a dead one is dropped when the registry is listed, or when it has doubled in
  size since the last sweep; a dead tensor's id that a new object reuses is never taken for it (its reference is
  dead). Writers hold `_registry_lock`."""
  __slots__ = ("data", "limit")

  def __init__(self) -> None:
    self.data: dict[int, weakref.ReferenceType[Tensor]] = {}
    self.limit = 64

  def __setitem__(self, k: int, t: Tensor) -> None:
    self.data[k] = weakref.ref(t)
    if len(self.data) > self.limit: self.live()

  def put_ref(self, k: int, r: weakref.ReferenceType[Tensor]) -> None:
    """`self[k] = t` with `r`, a live weak reference to `t` (taken from another registry: no new one is made)."""
    self.data[k] = r
    if len(self.data) > self.limit: self.live()

  def __contains__(self, k: int) -> bool: return (r := self.data.get(k)) is not None and r() is not None
  def pop(self, k: int, default: Any = None) -> Any:
    r = self.data.pop(k, None)
    return default if r is None or (t := r()) is None else t

  def only(self, ts: list[Tensor]) -> bool:
    """Whether no live tensor but those of `ts` is in the registry (found at once when it holds just them; with dead
    entries left over, False: the caller lists the registry, which sweeps them)."""
    if len(self.data) > len(ts): return False
    for r in list(self.data.values()):
      if (t := r()) is None: continue
      for x in ts:
        if t is x: break
      else: return False
    return True

  def only_one(self, t: Tensor) -> bool:
    """`only([t])` in one or two dict reads (the eager hot path): the registry holds `t` alone, or nothing. A few
    dead entries beside it (the temporaries of `a - 2`: its broadcast constant's Tensor) are dropped on the way
    (the caller holds `_registry_lock`, as writers do)."""
    d = self.data
    if not d or (len(d) == 1 and (r := d.get(id(t))) is not None and r() is t): return True
    if len(d) > 8: return False  # (a longer sweep is `only`'s, which the caller runs next)
    dead = []
    for k, r in d.items():
      if (x := r()) is None: dead.append(k)
      elif x is not t: return False
    for k in dead: del d[k]
    return True

  def live(self) -> list[Tensor]:
    """The live tensors now (a list: another thread may add meanwhile); drops the dead entries. Under the lock."""
    out, dead = [], []
    for k, r in self.data.items():
      if (t := r()) is None: dead.append(k)
      else: out.append(t)
    for k in dead: del self.data[k]
    self.limit = max(64, 2 * len(self.data))
    return out


# registries of live tensors, by id (a WeakSet would compare Tensors with ==, which builds a Tensor)
_grad_tensors = _Registry()  # requires_grad is True
_leaf_tensors = _Registry()  # ... set so by the user
_lazy_tensors = _Registry()  # may hold a lazy graph
_origin_tensors = _Registry()  # remember a graph
_real_tensors = _Registry()  # were set to a realized buffer without keeping a graph (data, assigns): backward's leaves
_registry_lock = threading.Lock()  # changes to the registries above vs. listing them from another thread


def _live(reg: _Registry) -> list[Tensor]:
  """The tensors of a registry now (a list: another thread may add to it meanwhile)."""
  with _registry_lock: return reg.live()


class _Capturing(threading.local):
  """Per thread: the TinyJit capturing in this thread (at most one); indexing reads no data while one captures."""
  def __init__(self) -> None: self.jits: list[Any] = []


_capturing = _Capturing()
