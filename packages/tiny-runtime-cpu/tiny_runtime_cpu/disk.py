"""The DISK device: buffers backed by a file through mmap, ``Device["DISK:/path/to/file.bin"]``.

An allocation of `n` bytes maps the first `n` bytes of the file (growing the file when it is shorter; a new file is
created). Views (`_offset`) and host memoryviews (`_as_buffer`) are zero-copy slices of the mapping, so a tensor
loaded from a safetensors file is read only where it is sliced. A read-only file maps read-only: copying into it
raises. DISK runs no kernels: copy to a compute device first.
"""
from __future__ import annotations

import mmap
import os
from typing import Any

from tiny_uop.device import Allocator, BufferSpec, Compiled, Program, Renderer


class DiskMem:
  """`nbytes` bytes of the file starting at byte `offset`; `mv` is the zero-copy memoryview of them."""
  __slots__ = ("device", "offset", "nbytes", "mv")

  def __init__(self, device: DiskDevice, offset: int, nbytes: int, mv: memoryview):
    self.device, self.offset, self.nbytes, self.mv = device, offset, nbytes, mv

  def __repr__(self) -> str: return f"<DiskMem {self.device.path}[{self.offset}:{self.offset + self.nbytes}]>"


class DiskAllocator(Allocator[DiskMem]):
  """Allocations are mappings of the device's file; no LRU cache (every allocation sees the file's bytes)."""

  def __init__(self, device: DiskDevice):
    self.device = device

  def _alloc(self, size: int, options: BufferSpec) -> DiskMem:
    return DiskMem(self.device, 0, size, self.device.map(size)[:size])

  def _copyin(self, dest: DiskMem, src: memoryview) -> None:
    if src.nbytes != dest.nbytes:
      raise ValueError(f"copyin of {src.nbytes} bytes into a DISK buffer of {dest.nbytes} bytes")
    if dest.nbytes == 0: return
    if dest.mv.readonly: raise PermissionError(f"{self.device.path} is read-only: can't copy into a DISK buffer of it")
    dest.mv[:] = src.cast("B") if src.format != "B" or src.ndim != 1 else src

  def _copyout(self, dest: memoryview, src: DiskMem) -> None:
    if dest.nbytes != src.nbytes:
      raise ValueError(f"copyout of a DISK buffer of {src.nbytes} bytes into {dest.nbytes} bytes")
    dest[:] = src.mv

  def _as_buffer(self, src: DiskMem) -> memoryview: return src.mv

  def _offset(self, buf: DiskMem, size: int, offset: int) -> DiskMem:
    if offset < 0 or size < 0 or offset + size > buf.nbytes:
      raise ValueError(f"view of {size} bytes at offset {offset} is outside a DISK buffer of {buf.nbytes} bytes")
    return DiskMem(self.device, buf.offset + offset, size, buf.mv[offset:offset + size])


class DiskProgram(Program):
  """DISK has no kernels; building one raises."""

  def __init__(self, device: Compiled, name: str, lib: bytes, **kwargs: Any):
    raise RuntimeError(f"can't run kernel {name!r} on {device.device}: DISK holds file-backed buffers and runs no "
                       f"kernels; copy the data to a compute device (CPU, PYTHON, ...) first")


class DiskDevice(Compiled):
  """File-backed buffers. The file is opened on the first allocation."""

  def __init__(self, device: str):
    if device.upper() != "DISK" and (not device.upper().startswith("DISK:") or len(device) <= 5):
      raise ValueError(f"DISK device {device!r} is not of the form DISK:/path/to/file.bin")
    self.path = device[5:]  # "" for the bare "DISK" (opens, for listings; allocating on it raises)
    self._mm: mmap.mmap | None = None
    self._fd: int | None = None
    self.readonly = False
    super().__init__(device, DiskAllocator(self), [], DiskProgram)

  @property
  def renderer(self) -> Renderer:
    raise RuntimeError(f"device {self.device} runs no kernels (DISK holds file-backed buffers); "
                       f"copy the data to a compute device (CPU, PYTHON, ...) first")

  @renderer.setter
  def renderer(self, r: Renderer) -> None: raise RuntimeError(f"device {self.device} runs no kernels")

  def map(self, size: int) -> memoryview:
    """A memoryview of at least `size` bytes of the file (grown when shorter unless read-only).

    The file is checked on every allocation: when it was replaced (another inode) or changed size since it was
    mapped, it is opened and mapped again, so a rewritten file is never read through a stale or too-long mapping."""
    if not self.path: raise ValueError("the DISK device needs a file path to allocate: use DISK:/path/to/file.bin")
    if self._fd is not None:
      try: st = os.stat(self.path)
      except FileNotFoundError: st = None
      cur = os.fstat(self._fd)
      if st is None or (st.st_dev, st.st_ino) != (cur.st_dev, cur.st_ino):  # replaced or deleted: start over
        os.close(self._fd)
        self._fd, self._mm = None, None
      elif self._mm is not None and len(self._mm) != cur.st_size: self._mm = None  # resized: map it again
    if self._mm is not None and len(self._mm) >= size: return memoryview(self._mm)
    if self._fd is None:
      try: self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      except PermissionError:
        self._fd, self.readonly = os.open(self.path, os.O_RDONLY), True
    fsize = os.fstat(self._fd).st_size
    if fsize < size:
      if self.readonly: raise ValueError(f"{self.path} has {fsize} bytes and is read-only; can't map {size} bytes")
      os.ftruncate(self._fd, size)
      fsize = size
    if fsize == 0: return memoryview(b"")  # mmap can't map an empty file
    # an old mapping stays open while views of it live; the new one covers the whole file
    self._mm = mmap.mmap(self._fd, fsize, access=mmap.ACCESS_READ if self.readonly else mmap.ACCESS_WRITE)
    return memoryview(self._mm)

  def finalize(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None
