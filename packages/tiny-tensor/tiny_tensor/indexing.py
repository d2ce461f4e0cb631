"""Tensor indexing: `t[idx]` (ints, slices with any step, None, ..., lists, int and bool Tensors) and `t[idx] = v`.

Basic indices become movement ops (shrink, flip, pad+reshape for steps); tensor indices a one-hot mask and a sum.
`IndexingMixin` is one of `Tensor`'s bases.

Typing: each method opens with `if TYPE_CHECKING: assert isinstance(self, Tensor)`, which narrows `self` to
`Tensor` for mypy and IDEs at no run-time cost, so a body is checked against Tensor's own signatures (a Protocol
or stub base would restate them all, and still not be a `Tensor` where one is passed or returned).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tiny_uop.dtype import dtypes, sum_acc_dtype
from tiny_uop.helpers import ceildiv
from tiny_uop.uop import GroupOp, Ops, UOp, sint, ssimplify
from tiny_tensor import engine
from tiny_tensor.helpers import _assign_view, _broadcast_shape, _view_bottom, _writable_view
from tiny_tensor.live import _capturing, _lazy_tensors, _live

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor

__all__ = ["IndexingMixin"]


def _sym_name(u: Any) -> str:
  """A symbolic int for an error message: a Variable's name, or the expression over the names."""
  if not isinstance(u, UOp): return str(u)
  if u.op is Ops.BIND: u = u.src[0]
  return str(u.arg[0]) if u.op is Ops.DEFINE_VAR else u.render()


def _symbolic_bound(b: Any, s: int, d: int) -> Any:
  """A slice bound that may be symbolic (a bound Variable or an expression of one): a negative one counts from the
  end, as in Python; one whose sign depends on the Variable's value has no single meaning and is refused."""
  if not isinstance(b, UOp): return b + s if b < 0 else b
  if b.vmin >= 0: return b
  if b.vmax < 0: return ssimplify(b + s)
  raise IndexError(f"symbolic slice bound {_sym_name(b)} ranges over [{b.vmin}, {b.vmax}] at dimension {d}: it is "
                   f"negative for some values and not for others; bound the Variable so its sign is fixed")


def _symbolic_slice(i: slice, s: int, d: int) -> tuple[tuple[Any, Any], int, Any]:
  """((start, stop), step, length) of a slice with symbolic bounds over a dim of size `s`. The length may be symbolic
  (`a[:, :i]`) with step 1; another positive int step needs a constant length (`a[i:i+4:2]`): every k-th element of a
  symbolic length is a dim whose size is a quotient of the Variable, which a shape can't hold (tinygrad refuses steps
  with symbolic bounds: TypeError too)."""
  if i.step is not None and (isinstance(i.step, UOp) or not isinstance(i.step, int) or i.step <= 0):
    raise TypeError(f"a slice with symbolic bounds needs a positive int step, got {_sym_name(i.step)} in "
                    f"{_sym_name(i.start)}:{_sym_name(i.stop)}:{_sym_name(i.step)}")
  k = 1 if i.step is None else i.step
  start = 0 if i.start is None else _symbolic_bound(i.start, s, d)
  stop = s if i.stop is None else _symbolic_bound(i.stop, s, d)
  length = ssimplify(stop - start)
  lo, hi = (start.vmin if isinstance(start, UOp) else start), (stop.vmax if isinstance(stop, UOp) else stop)
  if lo < 0 or hi > s:
    raise IndexError(f"symbolic slice {_sym_name(start)}:{_sym_name(stop)} spans [{lo}, {hi}) at its extremes, "
                     f"out of bounds for dimension {d} with size {s}")
  if isinstance(length, UOp) and length.vmin < 0:
    raise IndexError(f"symbolic slice {_sym_name(start)}:{_sym_name(stop)} at dimension {d} has length "
                     f"{_sym_name(length)}, negative for some values of its Variables (range [{length.vmin}, "
                     f"{length.vmax}])")
  if isinstance(length, int):
    if length < 0: length = 0
    return (start, stop), k, ceildiv(length, k)
  if k != 1:
    raise TypeError(f"a slice with symbolic bounds and a step needs a constant length, got length "
                    f"{_sym_name(length)} with step {k}")
  return (start, stop), 1, length


# the values with no buffer of their own to write through to (a setitem into a view of one changes the view only)
_NO_BUFFER_OPS = frozenset({Ops.CONST, Ops.BIND, Ops.DEFINE_VAR, Ops.MULTI, Ops.BUFFER})


def _view_bottom_at(u: UOp, target: UOp) -> bool:
  """Whether `u` is `target` or a view of it (movement ops and DETACHes on top of it)."""
  while u is not target and (u.op in GroupOp.Movement or u.op is Ops.DETACH): u = u.src[0]
  return u is target


def _view_bottom_buffer(u: UOp) -> UOp | None:
  """The BUFFER a view (movement ops and DETACHes) reads, when `u` is one; else None."""
  bv = engine.buffer_view(n := _view_bottom(u))
  return bv[0] if bv is not None else (n if n.op is Ops.BUFFER else None)


def _is_index_list(indices: Any) -> bool:
  """Whether a list index means one index per dim, as a tuple would: a list holding anything but ints (a list, a
  tuple, a slice, a Tensor...). torch and tinygrad 0.14 read `t[[[0, 1], [2, 0]]]` as `t[[0, 1], [2, 0]]`; a list
  of ints (or bools) is one index into the first dim."""
  return isinstance(indices, list) and not all(isinstance(i, (int, np.integer)) for i in indices)


class IndexingMixin:
  """`__getitem__`/`__setitem__` of `Tensor`."""
  __slots__ = ()

  def _index_plan(self, indices: Any) -> dict:
    """Parse an index into movement steps (shrink, flip, stride, reshape) and the tensor indices left over."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    idx = list(indices) if isinstance(indices, tuple) or _is_index_list(indices) else [indices]
    norm: list[Any] = []
    for i in idx:
      if isinstance(i, np.integer): i = int(i)
      if isinstance(i, (list, tuple, np.ndarray)): i = type(self)(i, device=self.device, requires_grad=False)
      if isinstance(i, type(self)) and i.dtype == dtypes.bool:
        arr = i.numpy()
        norm.extend(type(self)(n.astype(np.int32), device=self.device, requires_grad=False) for n in np.nonzero(arr))
        if arr.ndim == 0: raise IndexError("a 0-d boolean tensor index is not supported")
        continue
      if isinstance(i, bool) or not (i is None or i is Ellipsis or isinstance(i, (int, slice, type(self), UOp))):
        raise IndexError(f"{type(i).__name__} {i!r} is not a valid index; valid: int, slice, None, ..., list, Tensor")
      norm.append(i)
    if sum(1 for i in norm if i is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for i in norm if i is not None and i is not Ellipsis)
    if consumed > self.ndim: raise IndexError(f"too many indices ({consumed}) for tensor of dimension {self.ndim}")
    fill = [slice(None)] * (self.ndim - consumed)
    if any(i is Ellipsis for i in norm):
      e = next(j for j, i in enumerate(norm) if i is Ellipsis)
      norm = norm[:e] + fill + norm[e + 1:]
    else: norm = norm + fill
    shrink: list[tuple[sint, sint]] = []
    flips: list[int] = []
    strides: list[int] = []
    mid_shape: list[sint] = []
    out_shape: list[sint] = []
    tensors: list[tuple[int, Tensor, int]] = []  # (output axis, index tensor, size of the dim it indexes)
    d = 0
    for i in norm:
      if i is None:
        out_shape.append(1)
        continue
      s = self.shape[d]
      if not isinstance(s, int):  # each branch below compares indices with the size
        raise TypeError(f"can't index dim {d} of a tensor of shape ({', '.join(_sym_name(x) for x in self.shape)}): "
                        f"its size {_sym_name(s)} is symbolic; shrink or reshape it to a concrete size first")
      if isinstance(i, UOp):  # a bound Variable: a symbolic int index (jit replays bind other values)
        if i.dtype not in dtypes.ints or not (0 <= i.vmin and i.vmax < s):
          raise IndexError(f"symbolic index {_sym_name(i)} with range [{i.vmin}, {i.vmax}] is out of bounds for "
                           f"dimension {d} with size {s}")
        shrink.append((i, i + 1)); strides.append(1); mid_shape.append(1)  # noqa: E702
      elif isinstance(i, slice) and any(isinstance(x, UOp) for x in (i.start, i.stop, i.step)):
        (start, stop), k, n = _symbolic_slice(i, s, d)
        shrink.append((start, stop if k == 1 else start + (n - 1) * k + 1)); strides.append(k)  # noqa: E702
        mid_shape.append(n); out_shape.append(n)  # noqa: E702
      elif isinstance(i, int):
        if not -s <= i < s: raise IndexError(f"index {i} is out of bounds for dimension {d} with size {s}")
        i = i + s if i < 0 else i
        shrink.append((i, i + 1)); strides.append(1); mid_shape.append(1)  # noqa: E702
      elif isinstance(i, slice):
        start, stop, step = i.indices(s)
        # the shrink spans n*|step| elements where the dim has them, so taking every |step|-th one needs no PAD (a
        # view with no PAD is one a setitem can write through: `t[0, ::2][1] = v`)
        if step > 0:
          n = max(0, ceildiv(stop - start, step))
          shrink.append((start, min(s, start + n * step)) if n else (0, 0))
        else:
          n = max(0, ceildiv(start - stop, -step))
          shrink.append((max(0, start + 1 + n * step), start + 1) if n else (0, 0))
          if n: flips.append(d)
        strides.append(abs(step)); mid_shape.append(n); out_shape.append(n)  # noqa: E702
      else:
        shrink.append((0, s)); strides.append(1); mid_shape.append(s)  # noqa: E702
        tensors.append((len(out_shape), i, s))
        out_shape.append(s)
      d += 1
    return {"shrink": shrink, "flips": flips, "strides": strides, "mid": mid_shape, "out": out_shape,
            "tensors": tensors}

  def _strided(self, strides: list[int], mid: list[int]) -> Tensor:
    """Take every k-th element per dim: pad to a multiple of k, reshape (n, k), keep column 0."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if all(k == 1 for k in strides): return self
    x = self._pad_raw(tuple((0, n * k - s) if k > 1 and n else (0, 0) for s, k, n in zip(self.shape, strides, mid)))
    x = x.reshape([v for s, k, n in zip(x.shape, strides, mid) for v in ((n, k) if k > 1 else (s, 1))])
    x = x.shrink(tuple((0, v) if j % 2 == 0 else (0, 1) for j, v in enumerate(x.shape)))
    return x.reshape(mid)

  def _unstrided(self, strides: list[int], mid: list[int], sizes: list[int]) -> Tensor:
    """The inverse of `_strided`: element j goes to j*k, zeros in between; `sizes` are the shrunk dim sizes."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if all(k == 1 for k in strides): return self
    x = self.reshape([v for n, k in zip(mid, strides) for v in (n, 1)])
    x = x._pad_raw(tuple((0, 0) if j % 2 == 0 else (0, strides[j // 2] - 1) for j in range(x.ndim)))
    x = x.reshape([n * k for n, k in zip(mid, strides)])
    return x.shrink(tuple((0, sz) for sz in sizes))

  def _unshrink(self, shrink: list[tuple[Any, Any]], shape: tuple[sint, ...]) -> Tensor:
    """The inverse of `shrink`: this tensor placed at [start, end) of each dim of `shape`, zeros around it. A symbolic
    start (a bound Variable) pads by the whole dim on both sides, then shrinks at the symbolic offset: out[i] =
    padded[i - start + s] (PAD takes constant amounts only; a symbolic SHRINK is a load at an offset)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    sym = [not (isinstance(a, int) and isinstance(b, int)) for a, b in shrink]
    if not any(sym): return self._pad_raw(tuple((a, s - b) for (a, b), s in zip(shrink, shape)))
    x = self._pad_raw(tuple((s, s) if y else (a, s - b) for (a, b), s, y in zip(shrink, shape, sym)))
    return x.shrink([(s - a, 2 * s - a) if y else None for (a, _), s, y in zip(shrink, shape, sym)])

  def __getitem__(self, indices: Any) -> Tensor:
    """numpy-style indexing: ints, slices (any step), None, ..., lists and int/bool Tensors.

    >>> t = Tensor.arange(12).reshape(3, 4)
    >>> t[1].tolist(), t[:, ::-2].tolist(), t[Tensor([2, 0]), 1].tolist(), t[t > 9].tolist()
    ([4, 5, 6, 7], [[3, 1], [7, 5], [11, 9]], [9, 1], [10, 11])
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    plan = self._index_plan(indices)
    x = self.shrink(plan["shrink"]) if self.ndim else self
    if plan["flips"]: x = x.flip(plan["flips"])
    x = x._strided(plan["strides"], plan["mid"]).reshape(plan["out"])
    if not plan["tensors"]: return x
    return x._gather_tensors(plan["tensors"])

  def _gather_tensors(self, tensors: list[tuple[int, Tensor, int]]) -> Tensor:
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    pos = [p for p, _, _ in tensors]
    idxs = []
    for _, t, s in tensors:
      if not dtypes.is_int(t.dtype): raise IndexError(f"tensors used as indices must be int or bool, got {t.dtype}")
      # while a jit captures (in this thread: the capture state is per thread), data isn't read
      if engine.is_realized(t.uop) and t.numel() and not _capturing.jits:
        arr = t.numpy()
        if (bad := arr[(arr < -s) | (arr >= s)]).size:
          raise IndexError(f"index {bad.flat[0]} is out of bounds for a dimension of size {s}")
      idxs.append((t < 0).where(t + s, t))
    big = _broadcast_shape(*[t.shape for t in idxs])
    rest = [i for i in range(self.ndim) if i not in pos]
    k, nb = len(pos), len(big)
    x = self.permute(pos + rest)
    x = x.reshape((1,) * nb + x.shape)
    # one mask per index, applied one after the other (not and-ed into one mask tensor the scheduler would store):
    # the kernel is a sum over one-hot masks, which codegen folds into a load at the index (lower/gather.py), so it
    # costs the number of elements read, not that times the indexed dims' sizes
    picked = x
    for j, (t, (_, _, s)) in enumerate(zip(idxs, tensors)):
      ar = type(self).arange(s, device=self.device)
      ar = ar.reshape((1,) * nb + (1,) * j + (s,) + (1,) * (k - j - 1 + len(rest)))
      m = t._broadcast_to(big).reshape(big + (1,) * (k + len(rest))) == ar
      picked = m.where(picked, 0) if self.dtype != dtypes.bool else m & picked
    out = picked.sum(tuple(range(nb, nb + k)), dtype=sum_acc_dtype(self.dtype)).cast(self.dtype) \
      if self.dtype != dtypes.bool else picked.any(tuple(range(nb, nb + k)))
    if pos == list(range(pos[0], pos[0] + k)) and pos[0] != 0:  # consecutive: the new dims go where they were
      order = list(range(nb, nb + pos[0])) + list(range(nb)) + list(range(nb + pos[0], out.ndim))
      out = out.permute(order)
    return out

  def _lazy_readers(self) -> list[Tensor]:
    """Other live lazy tensors whose graphs read this tensor's buffer (they must be computed before it is written)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if (bv := engine.buffer_view(self.uop)) is None: return []
    buf = bv[0]
    # (a view of the buffer, made of movement ops and detach, reads it after the write: it sees the new values)
    cands = [t for t in _live(_lazy_tensors) if t is not self and not engine.is_realized(t.uop)
             and t.uop.op is not Ops.ASSIGN and _view_bottom_buffer(t.uop) is not buf]
    if not cands: return []
    # one walk over all their graphs together (a node's toposort is not cached: one walk per tensor would repeat the
    # graphs they share), marking every node that reaches the buffer
    reads: dict[UOp, bool] = {}
    for n in UOp.sink(*dict.fromkeys(t.uop for t in cands)).toposort():
      reads[n] = n is buf or any(reads[x] for x in n.src)
    return [t for t in cands if reads[t.uop]]

  def _scatter_tensors(self, tensors: list[tuple[int, Tensor, int]], v: Tensor) -> Tensor:
    """self (a basic view) with `v` (shaped like `self[tensor indices]`) written at the tensor indices; where several
    index tuples are equal the last one wins (numpy's rule), and an out-of-range lazy index writes nothing.

    Cost: the index tuples times the size of the indexed dims (to find the last writer of each place), then one
    element read per place (a one-hot sum over the writers that codegen folds into a load)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    T = type(self)
    pos = [p for p, _, _ in tensors]
    k = len(pos)
    idxs = [(t < 0).where(t + s, t) for _, t, s in tensors]
    big = tuple(s for s in _broadcast_shape(*[t.shape for t in idxs]) if isinstance(s, int))
    if len(big) != max(t.ndim for t in idxs):
      raise TypeError(f"tensor indices of symbolic shapes {[t.shape for t in idxs]} can't be written through; "
                      "give them concrete sizes")
    nb, nw = len(big), int(np.prod(big, dtype=np.int64))
    rest = [i for i in range(self.ndim) if i not in pos]
    sizes = [s for _, _, s in tensors]
    # v's layout: the index dims where the first tensor index was when they are consecutive, else in front
    front = 0 if not (pos == list(range(pos[0], pos[0] + k)) and pos[0] != 0) else pos[0]
    vorder = list(range(front, front + nb)) + list(range(front)) + list(range(front + nb, v.ndim))
    vw = v.permute(vorder).reshape(nw, *[self.shape[i] for i in rest])  # (writers, *rest)
    hit: Tensor | None = None
    for j, t in enumerate(idxs):
      ar = T.arange(sizes[j], device=self.device).reshape((1,) + (1,) * j + (sizes[j],) + (1,) * (k - j - 1))
      m = t._broadcast_to(big).reshape((nw,) + (1,) * k) == ar
      hit = m if hit is None else hit & m
    assert hit is not None
    writers = T.arange(1, nw + 1, device=self.device).reshape((nw,) + (1,) * k)
    last = hit.where(writers, 0).max(0) - 1  # (*sizes): the last writer of each place, -1 for none
    one = last.reshape(*sizes, 1) == T.arange(nw, device=self.device).reshape((1,) * k + (nw,))
    one = one.reshape(*sizes, nw, *[1] * len(rest))
    vals = vw.reshape((1,) * k + vw.shape)
    got = one.where(vals, 0).sum(k, dtype=self.dtype) if self.dtype != dtypes.bool else (one & vals).any(k)
    xp = self.permute(pos + rest)
    new = (last >= 0).reshape(*sizes, *[1] * len(rest)).where(got, xp)
    return new.permute([int(i) for i in np.argsort(pos + rest)])

  def __setitem__(self, indices: Any, v: Any) -> None:
    """Write `v` into the indexed part of this tensor, like torch and tinygrad 0.14:

    - a realized tensor, or a view of one (permute, flip, shrink, reshape, `detach()`, chained `t[1][2] = v`): the
      write goes into the buffer (an ASSIGN), so every tensor on the buffer sees it; live lazy tensors that compute
      from the old values (not views) are computed first, as if run eagerly;
    - a lazy tensor: it becomes the updated graph; a live view of it (which can't see the write) is refused;
    - a Tensor value must have this tensor's dtype (RuntimeError otherwise); a Python value is cast to it.

    >>> t = Tensor.zeros(2, 3).contiguous().realize()
    >>> t.permute(1, 0)[2] = Tensor([1.0, 2.0]); t.tolist()
    [[0.0, 0.0, 1.0], [0.0, 0.0, 2.0]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    T = type(self)
    if isinstance(v, T) and v.dtype != self.dtype:
      raise RuntimeError(f"setitem dtype mismatch: the tensor is {self.dtype}, the value is {v.dtype}; cast the value "
                         f"first (value.cast({self.dtype}))")
    view_shape = self[indices].shape  # (the view itself must not live on: it would be a lazy reader of the target)
    vt = v if isinstance(v, T) else T(v, device=self.device, dtype=self.dtype)
    vt = vt._broadcast_to(view_shape)
    if any(d == 0 for d in view_shape): return  # nothing to write
    plan = self._index_plan(indices)
    sym = next((n for n in plan["out"] if isinstance(n, UOp)), None)
    if sym is not None and not engine.is_realized(self.uop) and _writable_view(self.uop) is None:
      # a slice of symbolic length (`t[:, :i] = v`) is written through a view of a buffer (a PAD can't place a
      # symbolic-sized value): a lazy tensor gets its buffer first
      if self.requires_grad:
        raise RuntimeError(f"setitem at a slice of symbolic length ({_sym_name(sym)}) into a lazy tensor that requires "
                           f"grad is not supported; realize the tensor first or slice with a constant length")
      self.realize()
    if not (engine.is_realized(self.uop) or self.uop.op is Ops.ASSIGN):
      if (w := _writable_view(self.uop)) is None and not self.requires_grad and \
         (b := _view_bottom(self.uop)) is not self.uop and b.op not in _NO_BUFFER_OPS and self._viewed_elsewhere(b):
        # a view of a lazy value another tensor holds (`t[1][2] = v` on a computed t): the value gets its buffer now
        # (every tensor on it, this view too, then reads that buffer), so the write reaches t as in torch (in tinygrad
        # it is lost); a value only this tensor holds is just replaced, below
        T._new(b, False).realize()
        w = _writable_view(self.uop)
      if w is not None:  # a view of a realized buffer: the write goes through to it
        if (av := _assign_view(w)) is not None and av[1] is not None:
          raise RuntimeError(f"can't setitem into a view of a realized buffer made with {av[1]} (shape {self.shape}): "
                             f"its elements have no one-to-one place in the buffer; index the base tensor in one go "
                             f"(t[0, ::3][1] = v is t[0, 3] = v)")
        T._new(w, False)._write(plan, vt)
        return
      self._refuse_live_views(v)
    self._write(plan, vt)

  def _viewed_elsewhere(self, b: UOp) -> bool:
    """Whether a live tensor other than this one is the lazy value `b` or a view of it."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return any(t is not self and _view_bottom(t.uop) is b for t in _live(_lazy_tensors))

  def _refuse_live_views(self, v: Any) -> None:
    """tinygrad's rule for a setitem into a lazy tensor: no other live tensor may be a view of it (movement ops,
    detach), since that view keeps the old graph and could not see the write (torch's views would)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    target = self.uop
    views = [t for t in _live(_lazy_tensors) if t is not self and t is not v and _view_bottom_at(t.uop, target)]
    if views and isinstance(v, type(self)):  # a view the value reads (`t[2:4] = t[0:2]`) is fine
      in_v = set(v.uop.toposort())
      views = [t for t in views if t.uop not in in_v]
    if views:
      raise RuntimeError(f"can't setitem on a tensor with other uses: a live view of it (shape {views[0].shape}) "
                         f"would not see the write; realize the tensor first (t.realize()) so its views share its "
                         f"buffer, or drop the view")

  def _write(self, plan: dict, vt: Tensor) -> None:
    """Write `vt` (shaped like the indexed part) at `plan` (see `_index_plan`) into this tensor."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    writable = engine.is_realized(self.uop) or _assign_view(self.uop) is not None
    if (writable or self.uop.op is Ops.ASSIGN) and vt.requires_grad:
      raise RuntimeError(f"setitem of a value that requires grad into a realized tensor (shape {self.shape}): the "
                         f"write goes into its buffer, which carries no gradient; set into a lazy copy "
                         f"(t = t.contiguous(); t[...] = v) to get the value's gradient, or write v.detach()")
    if not plan["tensors"] and self.ndim and all(k == 1 for k in plan["strides"]) and writable:
      # a box of a realized buffer (int or Variable offsets, flips): an assign into that view writes only its elements
      # (rebinding `view`: a live intermediate view would be a lazy reader of the old values, copied first)
      view = self.shrink(plan["shrink"])
      if plan["flips"]: view = view.flip(plan["flips"])
      view = view.reshape(plan["out"])
      if not engine.is_realized(view.uop):  # (the whole buffer, reshaped, is assigned as this tensor, below)
        view.assign(vt)
        return
      del view
    if plan["tensors"]:  # the tensor-indexed part is scattered in the basic view, which then goes back like a slice
      base = self.shrink(plan["shrink"]) if self.ndim else self
      if plan["flips"]: base = base.flip(plan["flips"])
      base = base._strided(plan["strides"], plan["mid"]).reshape(plan["out"])
      vt = base._scatter_tensors(plan["tensors"], vt)
    sizes = [b - a for a, b in plan["shrink"]]
    def inverse(t: Tensor) -> Tensor:
      t = t.reshape(plan["mid"])._unstrided(plan["strides"], plan["mid"], sizes)
      if plan["flips"]: t = t.flip(plan["flips"])
      return t._unshrink(plan["shrink"], self.shape) if self.ndim else t
    mask = inverse(type(self).full(plan["out"], True, dtype=dtypes.bool, device=self.device))
    new = mask.where(inverse(vt.detach() if not vt.requires_grad else vt), self)
    if writable or self.uop.op is Ops.ASSIGN:
      readers = self._lazy_readers()
      self.assign(new.cast(self.dtype))  # (a view of a realized buffer: written now, through the view)
      self.realize(*readers)  # lazy reads made before this write see the old values, as if run eagerly
    else:
      t: Tensor = self  # (`self.uop = ...` here would read to mypy as this mixin declaring its own `uop`)
      t.uop = new.cast(self.dtype).uop
