"""Host memory shared by the CPU and PYTHON devices: 64-byte aligned blocks with zero-copy views.

A `HostMem` is one block (or a view into one): its address for native kernels and a byte memoryview for Python.
Views keep their base alive through the memoryview they slice, so freeing a base while a view lives is safe.
"""
from __future__ import annotations

import ctypes
import mmap
from typing import Any

from tiny_uop.device import BufferSpec, LRUAllocator

ALIGN = 64                 # bytes: a cache line, and enough for any vector load (AVX-512)
MMAP_THRESHOLD = 1 << 20   # blocks this large come from anonymous mmap (page aligned, zeroed lazily by the kernel)
HUGEPAGE_THRESHOLD = 4 << 20  # and from this size ask for transparent huge pages


class HostMem:
  """`nbytes` bytes of host memory at `addr`; `mv` is a writable byte memoryview of exactly those bytes."""
  __slots__ = ("addr", "nbytes", "mv", "base")

  def __init__(self, addr: int, nbytes: int, mv: memoryview, base: HostMem | None = None):
    self.addr, self.nbytes, self.mv, self.base = addr, nbytes, mv, base

  def view(self, nbytes: int, offset: int) -> HostMem:
    """The `nbytes` bytes starting `offset` bytes in; raises instead of ever reaching outside this block."""
    if not (isinstance(offset, int) and isinstance(nbytes, int) and 0 <= offset and 0 <= nbytes
            and offset + nbytes <= self.nbytes):
      raise ValueError(f"view of {nbytes} bytes at offset {offset} is outside a block of {self.nbytes} bytes")
    return HostMem(self.addr + offset, nbytes, self.mv[offset:offset + nbytes], self.base or self)

  def __repr__(self) -> str: return f"<HostMem 0x{self.addr:x} {self.nbytes} bytes{' (view)' if self.base else ''}>"


def _addr_of(buf: Any) -> int:
  """The address of a writable buffer (mmap, ctypes array, bytearray)."""
  return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def host_alloc(nbytes: int) -> HostMem:
  """A zero-filled, `ALIGN`-byte aligned block of `nbytes` bytes (nbytes may be 0)."""
  if nbytes >= MMAP_THRESHOLD:
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # page aligned
    if nbytes >= HUGEPAGE_THRESHOLD and hasattr(mmap, "MADV_HUGEPAGE"):
      try: m.madvise(mmap.MADV_HUGEPAGE)  # fewer TLB misses when streaming big buffers (numpy does the same)
      except OSError: pass
    return HostMem(_addr_of(m), nbytes, memoryview(m))
  raw = (ctypes.c_uint8 * (nbytes + ALIGN))()
  addr = ctypes.addressof(raw)
  pad = -addr % ALIGN
  return HostMem(addr + pad, nbytes, memoryview(raw).cast("B")[pad:pad + nbytes])


def copy_bytes(dest: memoryview, src: memoryview) -> None:
  """memcpy between two byte memoryviews of the same size."""
  if dest.nbytes != src.nbytes:
    raise ValueError(f"copy of {src.nbytes} bytes into {dest.nbytes} bytes: sizes must match")
  dest[:] = src if src.format == "B" and src.ndim == 1 else src.cast("B")


class HostAllocator(LRUAllocator[HostMem]):
  """Aligned host memory with an LRU cache of freed blocks, zero-copy `_as_buffer` and `_offset` views."""

  def _alloc(self, size: int, options: BufferSpec) -> HostMem:
    if options.external_ptr is not None:
      mv = memoryview((ctypes.c_uint8 * size).from_address(options.external_ptr)).cast("B")
      return HostMem(options.external_ptr, size, mv)
    try: return host_alloc(size)
    except (OSError, ValueError) as e: raise MemoryError(f"can't allocate {size} bytes of host memory: {e}") from e

  def _free(self, opaque: HostMem, options: BufferSpec) -> None: pass  # the memory goes when the last view does

  def _copyin(self, dest: HostMem, src: memoryview) -> None: copy_bytes(dest.mv, src)
  def _copyout(self, dest: memoryview, src: HostMem) -> None: copy_bytes(dest, src.mv)
  def _as_buffer(self, src: HostMem) -> memoryview: return src.mv
  def _offset(self, buf: HostMem, size: int, offset: int) -> HostMem: return buf.view(size, offset)
