"""What a PTX kernel's memory instructions reach: host memory ranges registered as GPU memory, with the checks a GPU
makes (an address outside every mapping is a page fault, a misaligned access is an error), as numpy views.

`Memory` keeps (start, end) ranges of host memory; `gather`/`scatter` read and write whole lane columns of addresses
at once. Addresses are host addresses: the mock drivers back GPU virtual addresses with host memory at the same
address, and `tiny_runtime_nv.ptx.run` registers numpy arrays at their own addresses.
"""
from __future__ import annotations

import bisect
import ctypes
from typing import Any

import numpy as np


_SHIFT = {1: 0, 2: 1, 4: 2, 8: 3, 16: 4}  # element size -> log2


class GPUFault(RuntimeError):
  """A kernel touched memory it may not: an unmapped address, a misaligned access or an out-of-range shared offset.
  The executor stops the launch (like a GPU's fault on that context); memory written before the fault stays."""


class Memory:
  """Ranges of host memory a kernel may access: `add(start, size)` / `remove(start)`; `gather`/`scatter`."""

  def __init__(self) -> None:
    self.starts: list[int] = []
    self.ranges: dict[int, tuple[int, np.ndarray]] = {}  # start -> (end, uint8 view)
    self._typed: dict[tuple[int, Any], np.ndarray] = {}
    self._last: tuple[int, int] | None = None  # the range the last access fell in

  def add(self, start: int, size: int, arr: np.ndarray | None = None) -> None:
    """Register `size` bytes at host address `start` (`arr`: an existing uint8 view of them)."""
    if size <= 0: return
    if arr is None: arr = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(start))
    if start in self.ranges: self.remove(start)
    self._last = None
    self.ranges[start] = (start + size, arr.reshape(-1).view(np.uint8))
    bisect.insort(self.starts, start)

  def remove(self, start: int) -> None:
    """Forget the range starting at `start` (a later access to it faults)."""
    if self.ranges.pop(start, None) is None: return
    self.starts.remove(start)
    self._last = None
    for k in [k for k in self._typed if k[0] == start]: del self._typed[k]

  def find(self, addr: int) -> tuple[int, int] | None:
    """(start, end) of the range holding `addr`, or None."""
    i = bisect.bisect_right(self.starts, addr) - 1
    if i < 0: return None
    s = self.starts[i]
    end = self.ranges[s][0]
    return (s, end) if addr < end else None

  def _typed_view(self, start: int, dt: np.dtype) -> np.ndarray:
    key = (start, dt)
    if (v := self._typed.get(key)) is None:
      u8 = self.ranges[start][1]
      v = self._typed[key] = u8[:len(u8) - len(u8) % dt.itemsize].view(dt)
    return v

  def _region(self, addrs: np.ndarray, nbytes: int, what: str) -> int:
    """The start of the one range holding every access `[a, a + nbytes)`, or -1: accesses spread over several ranges
    (or outside all) are split by the caller (`_split`, which reports a fault). The last range found is tried first."""
    lo, hi = int(addrs.min()), int(addrs.max()) + nbytes
    last = self._last
    if last is not None and last[0] <= lo and hi <= last[1]: return last[0]
    r = self.find(lo)
    if r is not None and hi <= r[1]:
      self._last = r
      return r[0]
    return -1

  def _fault(self, addrs: np.ndarray, nbytes: int, what: str) -> GPUFault:
    for a in addrs.tolist():
      r = self.find(a)
      if r is None or a + nbytes > r[1]:
        return GPUFault(f"GPU page fault: {what} of {nbytes} bytes at {a:#x} is outside every mapped range")
    return GPUFault(f"GPU page fault: {what} of {nbytes} bytes")

  def _check_align(self, addrs: np.ndarray, nbytes: int, what: str) -> None:
    if nbytes > 1 and int(np.bitwise_or.reduce(addrs)) & (nbytes - 1):
      a = int(addrs[np.nonzero(addrs & np.uint64(nbytes - 1))[0][0]])
      raise GPUFault(f"misaligned address: {what} of {nbytes} bytes at {a:#x} (must be {nbytes}-byte aligned)")

  def gather(self, addrs: np.ndarray, dt: np.dtype, n: int = 1, what: str = "load") -> np.ndarray:
    """Load `n` consecutive `dt` elements at each address: shape (len(addrs), n)."""
    nbytes = dt.itemsize * n
    if len(addrs) == 0: return np.zeros((0, n), dt)
    self._check_align(addrs, nbytes, what)
    start = self._region(addrs, nbytes, what)
    if start < 0: return self._split(addrs, dt, n, what, None)
    idx = (addrs - np.uint64(start)).astype(np.intp) >> _SHIFT[dt.itemsize]  # aligned: a shift divides
    view = self._typed_view(start, dt)
    return view[idx[:, None] + np.arange(n)] if n > 1 else view[idx][:, None]

  def scatter(self, addrs: np.ndarray, vals: np.ndarray, what: str = "store") -> None:
    """Store `vals` (shape (len(addrs), n)) at each address; the last lane wins where addresses repeat."""
    n, dt = vals.shape[1], vals.dtype
    nbytes = dt.itemsize * n
    if len(addrs) == 0: return
    self._check_align(addrs, nbytes, what)
    start = self._region(addrs, nbytes, what)
    if start < 0:
      self._split(addrs, dt, n, what, vals)
      return
    idx = (addrs - np.uint64(start)).astype(np.intp) >> _SHIFT[dt.itemsize]
    view = self._typed_view(start, dt)
    if n == 1: view[idx] = vals[:, 0]
    else: view[idx[:, None] + np.arange(n)] = vals

  def _split(self, addrs: np.ndarray, dt: np.dtype, n: int, what: str, vals: np.ndarray | None) -> np.ndarray:
    """Accesses that fall into several ranges: group the lanes by range (any lane outside all ranges faults)."""
    nbytes = dt.itemsize * n
    starts = np.array(self.starts, dtype=np.uint64)
    which = np.searchsorted(starts, addrs, side="right") - 1
    if (which < 0).any(): raise self._fault(addrs, nbytes, what)
    out = np.zeros((len(addrs), n), dt) if vals is None else vals
    for w in np.unique(which).tolist():
      sel = np.nonzero(which == w)[0]
      start = self.starts[w]
      sub = addrs[sel]
      if int(sub.max()) + nbytes > self.ranges[start][0]: raise self._fault(sub, nbytes, what)
      idx = ((sub - np.uint64(start)) // np.uint64(dt.itemsize)).astype(np.intp)
      view = self._typed_view(start, dt)
      cols = idx[:, None] + np.arange(n)
      if vals is None: out[sel] = view[cols]
      else: view[cols] = vals[sel]
    return out
