"""Tensor indexing: `t[idx]` (ints, slices with any step, None, ..., lists, int and bool Tensors) and `t[idx] = v`.

Basic indices become movement ops (shrink, flip, pad+reshape for steps); tensor indices a one-hot mask and a sum.
`IndexingMixin` is one of `Tensor`'s bases.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tiny_uop.dtype import dtypes, sum_acc_dtype
from tiny_uop.helpers import ceildiv
from tiny_uop.uop import Ops
from tiny_tensor import engine
from tiny_tensor.helpers import _broadcast_shape, _view_base

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor

__all__ = ["IndexingMixin"]


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
      if isinstance(i, bool) or not (i is None or i is Ellipsis or isinstance(i, (int, slice, type(self)))):
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
      if isinstance(i, int):
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
      if engine.is_realized(t.uop) and t.numel():
        arr = t.numpy()
        if (bad := arr[(arr < -s) | (arr >= s)]).size:
          raise IndexError(f"index {bad.flat[0]} is out of bounds for a dimension of size {s}")
      idxs.append((t < 0).where(t + s, t))
    big = _broadcast_shape(*[t.shape for t in idxs])
    rest = [i for i in range(self.ndim) if i not in pos]
    k, nb = len(pos), len(big)
    x = self.permute(pos + rest)
    x = x.reshape((1,) * nb + x.shape)
    mask: Tensor | None = None
    for j, (t, (_, _, s)) in enumerate(zip(idxs, tensors)):
      ar = type(self).arange(s, device=self.device)
      ar = ar.reshape((1,) * nb + (1,) * j + (s,) + (1,) * (k - j - 1 + len(rest)))
      m = t._broadcast_to(big).reshape(big + (1,) * (k + len(rest))) == ar
      mask = m if mask is None else mask & m
    assert mask is not None
    picked = mask.where(x, x.zeros_like()) if self.dtype != dtypes.bool else mask & x
    out = picked.sum(tuple(range(nb, nb + k)), dtype=sum_acc_dtype(self.dtype)).cast(self.dtype) \
      if self.dtype != dtypes.bool else picked.any(tuple(range(nb, nb + k)))
    if pos == list(range(pos[0], pos[0] + k)) and pos[0] != 0:  # consecutive: the new dims go where they were
      order = list(range(nb, nb + pos[0])) + list(range(nb)) + list(range(nb + pos[0], out.ndim))
      out = out.permute(order)
    return out

  def __setitem__(self, indices: Any, v: Any) -> None:
    """Write `v` into the indexed part of this tensor (an ASSIGN into its buffer when realized)."""
    view = self[indices]
    vt = v if isinstance(v, type(self)) else type(self)(v, device=self.device, dtype=self.dtype)
    vt = vt.cast(self.dtype)._broadcast_to(view.shape)
    if view.numel() == 0: return  # nothing to write
    plan = self._index_plan(indices)
    if plan["tensors"]:
      n = int(self.numel())
      ids = type(self).arange(n, device=self.device).reshape(self.shape)[indices].flatten()
      onehot = ids.reshape(-1, 1) == type(self).arange(n, device=self.device).reshape(1, n)
      hit = onehot.any(0)
      vals = onehot.where(vt.flatten().reshape(-1, 1), 0).sum(0, dtype=sum_acc_dtype(self.dtype))
      vals = vals.cast(self.dtype)
      new = hit.reshape(self.shape).where(vals.reshape(self.shape), self)
    else:
      sizes = [b - a for a, b in plan["shrink"]]
      def inverse(t: Tensor) -> Tensor:
        t = t.reshape(plan["mid"])._unstrided(plan["strides"], plan["mid"], sizes)
        if plan["flips"]: t = t.flip(plan["flips"])
        return t._pad_raw(tuple((a, s - b) for (a, b), s in zip(plan["shrink"], self.shape))) if self.ndim else t
      mask = inverse(type(self).full(view.shape, True, dtype=dtypes.bool, device=self.device))
      new = mask.where(inverse(vt.detach() if not vt.requires_grad else vt), self)
    if engine.is_realized(self.uop) or self.uop.op is Ops.ASSIGN:
      self.assign(new.cast(self.dtype))
      self.realize()
    elif _view_base(self.uop) is not None:
      raise RuntimeError("can't setitem into a non-contiguous view of a realized buffer; index the base tensor instead")
    else: self.uop = new.cast(self.dtype).uop
