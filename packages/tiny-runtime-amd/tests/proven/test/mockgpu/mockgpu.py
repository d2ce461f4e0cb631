"""`MockFileIOInterface`: tinygrad 0.14's `FileIOInterface` (runtime/support/hcq.py) answered by our mock KFD.

tinygrad's AMD driver (`ops_amd.KFDIface`) opens `/dev/kfd`, the render node and the KFD topology / ip_discovery sysfs
files, issues its ioctls with ctypes structs, and maps memory, doorbells and VA reservations through this class. Each
call is handed to `tiny_runtime_amd.mock.driver.MockFileIO` (the same seam our own driver uses), so everything
tinygrad's driver does is checked by our mock exactly as ours is. The signatures follow tinygrad's (`anon_mmap` with
an offset, `listdir()` of the opened path, ...), which differ from our `FileIOInterface`'s in small ways.

Real GPUs run asynchronously; tinygrad's driver spins on signal memory and only sleeps in WAIT_EVENTS after 200 ms.
So a daemon thread plays the GPU: it runs the mock's command processors (`MockKFD.process`) whenever a queue has work.
An error the mock raises there (a bad packet, a page fault) is kept and re-raised at the host's next ioctl, so a test
fails with the mock's message instead of a wait timeout.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from typing import Any

from tiny_uop.hcq import MAP_ANONYMOUS, FileIOInterface
from tiny_runtime_amd.mock.driver import MockFileIO, MockKFD, mock_fileio



def _fileio() -> type[MockFileIO]:
  """Which mocked GPUs tinygrad finds: $PROVEN_AMD_ARCH's (gfx1100, the default mock, or gfx942: four MI300 nodes)."""
  return mock_fileio(os.environ.get("PROVEN_AMD_ARCH") or None)


__all__ = ["MockFileIOInterface", "gpu_errors", "ioctl_log"]

gpu_errors: list[BaseException] = []      # what the GPU thread's mock raised (a test asserts it is empty)
ioctl_log: list[tuple[str, int]] = []     # (path, request) of every ioctl tinygrad issued, in order
_gpu_thread: threading.Thread | None = None


def _gpu_loop(drv: MockKFD) -> None:
  """The asynchronous GPU: run every queue up to its doorbell, then idle briefly."""
  while True:
    try:
      with drv.lock:
        if any(q.pending() for q in drv.queues.values()): drv.process()
    except Exception as e:  # noqa: BLE001  (kept and re-raised on the host side; the GPU keeps running)
      gpu_errors.append(e)
    time.sleep(0.0005)  # process() ran everything it could; let the host write more


def _start_gpu(drv: MockKFD) -> None:
  global _gpu_thread
  if _gpu_thread is None:
    _gpu_thread = threading.Thread(target=_gpu_loop, args=(drv,), name="mock-amd-gpu", daemon=True)
    _gpu_thread.start()


class MockFileIOInterface:
  """tinygrad's FileIOInterface over the process's mock KFD (four gfx1100 GPUs, or $PROVEN_AMD_ARCH's)."""

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    if fd is not None: raise OSError(errno.ENODEV, f"mock KFD: file descriptors from outside ({fd}) are not modeled")
    self.path = path
    self.io = _fileio()(path, flags)
    self.fd = self.io.fd
    _start_gpu(self.io.drv)

  def ioctl(self, request: int, arg: Any) -> int:
    """An ioctl with tinygrad's ctypes struct: decoded by our mock through the same kfd_ioctl.h layout."""
    if gpu_errors: raise RuntimeError(f"the mock GPU failed: {gpu_errors[0]!r}") from gpu_errors[0]
    ioctl_log.append((self.path, request))
    return self.io.ioctl(request, arg)

  def mmap(self, start: int, sz: int, prot: int, flags: int, offset: int) -> int:
    """mmap of this file (doorbells on /dev/kfd, allocations on the render node)."""
    return self.io.mmap(start, sz, prot, flags, offset)

  def read(self, size: int | None = None, binary: bool = False, offset: int | None = None) -> Any:
    """A sysfs file's text (or bytes with `binary`)."""
    data = self.io.read(binary=binary, offset=offset)
    return data if size is None else data[:size]

  def write(self, content: Any, binary: bool = False, offset: int | None = None) -> None:
    raise OSError(errno.EACCES, f"mock KFD: {self.path!r} is read-only")

  def listdir(self) -> list[str]:
    """The entries of this sysfs directory."""
    return _fileio().listdir(self.path)

  def seek(self, offset: int) -> None: pass

  @staticmethod
  def anon_mmap(start: int, sz: int, prot: int, flags: int, offset: int) -> int:
    """Anonymous host memory or a VA reservation: real, as on a machine with the driver."""
    return FileIOInterface.anon_mmap(start, sz, prot, flags | MAP_ANONYMOUS)

  @staticmethod
  def munmap(buf: int, sz: int) -> None: FileIOInterface().munmap(buf, sz)

  @staticmethod
  def exists(path: str) -> bool: return _fileio().exists(path)

  @staticmethod
  def readlink(path: str) -> str: raise OSError(errno.ENOENT, f"mock KFD: no link {path!r}")

  @staticmethod
  def eventfd(initval: int, flags: int | None = None) -> Any:
    raise OSError(errno.ENODEV, "mock KFD: eventfd is not modeled (tinygrad's KFD path does not use it)")


def kfd() -> MockKFD:
  """The mock KFD tinygrad's driver talks to."""
  return _fileio().kfd_fn()
