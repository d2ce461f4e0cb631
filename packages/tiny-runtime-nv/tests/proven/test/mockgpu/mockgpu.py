"""`MockFileIOInterface`: tinygrad 0.14's `FileIOInterface` calls answered by tiny-runtime-nv's mock RM/UVM driver.

tinygrad's `runtime/support/hcq.py` imports this class in place of its FileIOInterface when DEV's interface starts with
MOCK (`DEV=MOCK:2+NV:PTX`). tinygrad's NV driver then opens /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidiaN through
it, sends its ctypes parameter structs as ioctls, and maps memory through it. This adapter only converts calling
conventions (ctypes structs to the byte buffers `tiny_runtime_nv.mock.rm.MockFileIO` decodes, and the results back);
every check and every answer is the mock driver's. Test-only: `tests/test_nv_proven.py` puts this folder on sys.path
in a subprocess.

The mock GPU runs when something polls it (`MockRM.process`). tinygrad's signal waits only read memory, so a daemon
thread here polls the mock GPU the way a real GPU runs beside the host: it executes what the doorbell made visible
(GP_PUT) and writes the semaphores tinygrad's waits read.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

from tiny_uop.hcq import FileIOInterface as _OSFileIO
from tiny_runtime_nv.mock import rm as mock_rm

# every (path, ioctl request) tinygrad sent, in order: tests/test_nv_proven.py compares it with our driver's stream
IOCTL_LOG: list[tuple[str, int, bytes]] = []
_gpu_thread: threading.Thread | None = None


def _gpu_loop() -> None:
  """Run the mock GPUs' channels whenever they have work (the GPU beside the host)."""
  drv = mock_rm.driver()
  while True:
    drv.process()
    time.sleep(0.0002)


def _start_gpu() -> None:
  global _gpu_thread
  if _gpu_thread is None:
    _gpu_thread = threading.Thread(target=_gpu_loop, name="mock-nv-gpu", daemon=True)
    _gpu_thread.start()


class MockFileIOInterface:
  """tinygrad's FileIOInterface shape (path, fd, ioctl, mmap, read, write, listdir, static anon_mmap/munmap/exists)."""

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    self.path = path
    self._f = mock_rm.MockFileIO(path, flags)
    self.fd: int = self._f.fd if self._f.fd is not None else -1
    _start_gpu()

  def ioctl(self, request: int, arg: Any) -> int:
    """Send tinygrad's ctypes struct `arg` as the ioctl's byte buffer; copy what the driver wrote back into it."""
    size = ctypes.sizeof(arg)
    buf = bytearray(ctypes.string_at(ctypes.addressof(arg), size))
    IOCTL_LOG.append((self.path, request, bytes(buf)))
    ret = self._f.ioctl(request, buf)
    ctypes.memmove(ctypes.addressof(arg), bytes(buf), size)
    return ret

  def mmap(self, start: int | None, sz: int, prot: int, flags: int, offset: int) -> int:
    """Map what NV_ESC_RM_MAP_MEMORY prepared on this file (the mock driver decides the address and backing)."""
    return self._f.mmap(start or 0, sz, prot, flags, offset)

  def read(self, size: int | None = None, binary: bool = False, offset: int | None = None) -> Any:
    raise OSError(22, f"mock NV driver: read of {self.path} (the NV driver reads no files)")

  def write(self, content: Any, binary: bool = False, offset: int | None = None) -> Any:
    raise OSError(22, f"mock NV driver: write to {self.path} (the NV driver writes no files)")

  def listdir(self) -> list[str]: return []

  @staticmethod
  def anon_mmap(start: int, sz: int, prot: int, flags: int, offset: int) -> int:
    """Anonymous host memory at `start` (tinygrad passes an offset argument; anonymous maps have none)."""
    return _OSFileIO.anon_mmap(start, sz, prot, flags)

  @staticmethod
  def munmap(buf: int, sz: int) -> None: _OSFileIO().munmap(buf, sz)

  @staticmethod
  def exists(path: str) -> bool: return mock_rm.MockFileIO.exists(path)

  @staticmethod
  def readlink(path: str) -> str: raise OSError(2, f"mock NV driver: no link {path!r}")

  @staticmethod
  def eventfd(initval: int, flags: int | None = None) -> Any: raise OSError(38, "mock NV driver: no eventfd")
