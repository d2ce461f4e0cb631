"""Tensor indexing: `t[idx]` (ints, slices with any step, None, ..., lists, int and bool Tensors) and `t[idx] = v`.

Basic indices become movement ops (shrink, flip, pad+reshape for steps); tensor indices a one-hot mask and a sum.
`IndexingMixin` is one of `Tensor`'s bases.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tiny_uop.dtype import dtypes, sum_acc_dtype
from tiny_uop.helpers import ceildiv
from tiny_uop.uop import Ops, UOp, ssimplify
from tiny_tensor import engine
from tiny_tensor.helpers import _broadcast_shape, _view_base

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor

__all__ = ["IndexingMixin"]


def _sym_name(u: Any) -> str:
  """A symbolic int for an error message: a Variable's name, or the expression over the names."""
  if not isinstance(u, UOp): return str(u)
  if u.op is Ops.BIND: u = u.src[0]
  return str(u.arg[0]) if u.op is Ops.DEFINE_VAR else u.render()


class IndexingMixin:
  """`__getitem__`/`__setitem__` of `Tensor`."""
  __slots__ = ()

  def _index_plan(self, indices: Any) -> dict:
    """Parse an index into movement steps (shrink, flip, stride, reshape) and the tensor indices left over."""
    idx = list(indices) if isinstance(indices, tuple) else [indices]
    norm: list[Any] = []
    for i in idx:
      if isinstance(i, np.integer): i = int(i)
      if isinstance(i, (list, np.ndarray)): i = type(self)(i, device=self.device, requires_grad=False)
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
    shrink, flips, strides, mid_shape, out_shape, tensors = [], [], [], [], [], []
    d = 0
    for i in norm:
      if i is None:
        out_shape.append(1)
        continue
      s = self.shape[d]
      if isinstance(i, UOp):  # a bound Variable: a symbolic int index (jit replays bind other values)
        if i.dtype not in dtypes.ints or not (0 <= i.vmin and i.vmax < s):
          raise IndexError(f"symbolic index {_sym_name(i)} with range [{i.vmin}, {i.vmax}] is out of bounds for "
                           f"dimension {d} with size {s}")
        shrink.append((i, i + 1)); strides.append(1); mid_shape.append(1)  # noqa: E702
      elif isinstance(i, slice) and any(isinstance(x, UOp) for x in (i.start, i.stop)):
        start, stop = (0 if i.start is None else i.start), (s if i.stop is None else i.stop)
        n = ssimplify(stop - start)
        # a variable length (t[:v], t[v:]) gives a symbolic dim, as `shrink` does; it must never be negative
        if i.step not in (None, 1) or (n.vmin if isinstance(n, UOp) else n) < 0:
          raise IndexError(f"a symbolic slice needs step 1 and a length that can't be negative, got "
                           f"{_sym_name(i.start)}:{_sym_name(i.stop)}:{_sym_name(i.step)}")
        lo, hi = (start.vmin if isinstance(start, UOp) else start), (stop.vmax if isinstance(stop, UOp) else stop)
        if lo < 0 or hi > s:
          raise IndexError(f"symbolic slice {_sym_name(start)}:{_sym_name(stop)} spans [{lo}, {hi}) at its extremes, "
                           f"out of bounds for dimension {d} with size {s}")
        shrink.append((start, stop)); strides.append(1); mid_shape.append(n); out_shape.append(n)  # noqa: E702
      elif isinstance(i, int):
        if not -s <= i < s: raise IndexError(f"index {i} is out of bounds for dimension {d} with size {s}")
        i = i + s if i < 0 else i
        shrink.append((i, i + 1)); strides.append(1); mid_shape.append(1)  # noqa: E702
      elif isinstance(i, slice):
        start, stop, step = i.indices(s)
        if step > 0:
          n = max(0, ceildiv(stop - start, step))
          shrink.append((start, start + (n - 1) * step + 1) if n else (0, 0))
        else:
          n = max(0, ceildiv(start - stop, -step))
          shrink.append((start + (n - 1) * step, start + 1) if n else (0, 0))
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
    if all(k == 1 for k in strides): return self
    x = self._pad_raw(tuple((0, n * k - s) if k > 1 and n else (0, 0) for s, k, n in zip(self.shape, strides, mid)))
    x = x.reshape([v for s, k, n in zip(x.shape, strides, mid) for v in ((n, k) if k > 1 else (s, 1))])
    x = x.shrink(tuple((0, v) if j % 2 == 0 else (0, 1) for j, v in enumerate(x.shape)))
    return x.reshape(mid)

  def _unstrided(self, strides: list[int], mid: list[int], sizes: list[int]) -> Tensor:
    """The inverse of `_strided`: element j goes to j*k, zeros in between; `sizes` are the shrunk dim sizes."""
    if all(k == 1 for k in strides): return self
    x = self.reshape([v for n, k in zip(mid, strides) for v in (n, 1)])
    x = x._pad_raw(tuple((0, 0) if j % 2 == 0 else (0, strides[j // 2] - 1) for j in range(x.ndim)))
    x = x.reshape([n * k for n, k in zip(mid, strides)])
    return x.shrink(tuple((0, sz) for sz in sizes))

  def _unshrink(self, shrink: list[tuple[Any, Any]], shape: tuple[int, ...]) -> Tensor:
    """The inverse of `shrink`: this tensor placed at [start, end) of each dim of `shape`, zeros around it. A symbolic
    start (a bound Variable) pads by the whole dim on both sides, then shrinks at the symbolic offset: out[i] =
    padded[i - start + s] (PAD takes constant amounts only; a symbolic SHRINK is a load at an offset)."""
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
    plan = self._index_plan(indices)
    x = self.shrink(plan["shrink"]) if self.ndim else self
    if plan["flips"]: x = x.flip(plan["flips"])
    x = x._strided(plan["strides"], plan["mid"]).reshape(plan["out"])
    if not plan["tensors"]: return x
    return x._gather_tensors(plan["tensors"])

  def _gather_tensors(self, tensors: list[tuple[int, Tensor, int]]) -> Tensor:
    pos = [p for p, _, _ in tensors]
    idxs = []
    for _, t, s in tensors:
      if not dtypes.is_int(t.dtype): raise IndexError(f"tensors used as indices must be int or bool, got {t.dtype}")
      from tiny_tensor.jit import _capturing
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
    from tiny_tensor.tensor import _lazy_tensors, _live
    if (bv := engine.buffer_view(self.uop)) is None: return []
    buf = bv[0]
    cands = [t for t in _live(_lazy_tensors) if t is not self and not engine.is_realized(t.uop)
             and t.uop.op is not Ops.ASSIGN]
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
    T = type(self)
    pos = [p for p, _, _ in tensors]
    k = len(pos)
    idxs = [(t < 0).where(t + s, t) for _, t, s in tensors]
    big = _broadcast_shape(*[t.shape for t in idxs])
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
    """Write `v` into the indexed part of this tensor (an ASSIGN into its buffer when realized)."""
    view_shape = self[indices].shape  # (the view itself must not live on: it would be a lazy reader of the target)
    vt = v if isinstance(v, type(self)) else type(self)(v, device=self.device, dtype=self.dtype)
    vt = vt.cast(self.dtype)._broadcast_to(view_shape)
    if any(d == 0 for d in view_shape): return  # nothing to write
    plan = self._index_plan(indices)
    if not plan["tensors"] and self.ndim and all(k == 1 for k in plan["strides"]) and engine.is_realized(self.uop):
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
    if engine.is_realized(self.uop) or self.uop.op is Ops.ASSIGN:
      readers = self._lazy_readers()
      self.assign(new.cast(self.dtype))
      self.realize(*readers)  # lazy reads made before this write see the old values, as if run eagerly
    elif _view_base(self.uop) is not None:
      raise RuntimeError("can't setitem into a non-contiguous view of a realized buffer; index the base tensor instead")
    else: self.uop = new.cast(self.dtype).uop
