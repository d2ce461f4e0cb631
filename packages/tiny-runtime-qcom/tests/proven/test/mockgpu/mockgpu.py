"""`MockFileIOInterface`: tinygrad 0.14's `FileIOInterface` (runtime/support/hcq.py) answered by our mock KGSL.

tinygrad's QCOM driver (`ops_qcom.QCOMDevice`) opens `/dev/kgsl-3d0`, issues its ioctls with ctypes structs and maps
GPU objects through this class. Each call goes to `tiny_runtime_qcom.mock.driver.MockFileIO` (the seam our own
driver uses), which decodes the ctypes struct's bytes with the same msm_kgsl.h layout as ours, so everything
tinygrad's driver does is checked by our mock exactly as our driver's calls are.

The mock runs a context's submissions when the host waits for or reads a timestamp. tinygrad's driver sleeps in
DEVICE_WAITTIMESTAMP_CTXTID only for its timeline signal; other signals it spins on in memory. So a daemon thread
plays the asynchronous GPU: it runs every context's queued submissions. An error the mock raises there (a bad
packet, a page fault) is kept and re-raised at the host's next ioctl, so a test fails with the mock's message
instead of a wait timeout.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from typing import Any

from tiny_uop.hcq import MAP_ANONYMOUS, FileIOInterface
from tiny_runtime_qcom import kgsl
from tiny_runtime_qcom.mock.driver import MockFileIO, MockKGSL, driver

__all__ = ["MockFileIOInterface", "gpu_errors", "gpu_running", "ioctl_log", "kgsl_driver"]

gpu_errors: list[BaseException] = []      # what the GPU thread's mock raised (a test asserts it is empty)
ioctl_log: list[str] = []                 # the name of every ioctl tinygrad issued, in order
_gpu_thread: threading.Thread | None = None
# cleared: the GPU thread idles and submissions run only at the host's timestamp waits, so a fault is raised to the
# waiter, deterministically (a case that expects one clears it)
gpu_running = threading.Event()
gpu_running.set()


def _gpu_loop(drv: MockKGSL) -> None:
  """The asynchronous GPU: run every context's queued submissions, then idle briefly."""
  while True:
    gpu_running.wait()
    try:
      with drv.lock:
        for ctx in list(drv.contexts.values()):
          if ctx["queue"]: drv.run(ctx, ctx["issued"])
    except Exception as e:  # noqa: BLE001  (kept and re-raised on the host side; the GPU keeps running)
      gpu_errors.append(e)
    time.sleep(0.0005)


def _start_gpu(drv: MockKGSL) -> None:
  global _gpu_thread
  if _gpu_thread is None:
    _gpu_thread = threading.Thread(target=_gpu_loop, args=(drv,), name="mock-a630-gpu", daemon=True)
    _gpu_thread.start()


class MockFileIOInterface:
  """tinygrad's FileIOInterface over the process's mock KGSL (one Adreno 630)."""

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    if fd is not None: raise OSError(errno.ENODEV, f"mock KGSL: file descriptors from outside ({fd}) are not modeled")
    self.path = path
    self.io = MockFileIO(path, flags)
    self.fd = self.io.fd
    _start_gpu(self.io.drv)

  def ioctl(self, request: int, arg: Any) -> int:
    """An ioctl with tinygrad's ctypes struct, decoded by our mock through msm_kgsl.h's layout."""
    if gpu_errors: raise RuntimeError(f"the mock GPU failed: {gpu_errors[0]!r}") from gpu_errors[0]
    ioctl_log.append(kgsl.IOCTL_BY_NUMBER.get(request, hex(request)))
    return self.io.ioctl(request, arg)

  def mmap(self, start: int, sz: int, prot: int, flags: int, offset: int) -> int:
    """mmap of a GPU object (offset: its id times the page size)."""
    return self.io.mmap(start, sz, prot, flags, offset)

  def read(self, size: int | None = None, binary: bool = False, offset: int | None = None) -> Any:
    raise OSError(errno.EINVAL, f"mock KGSL: reading {self.path!r} is not modeled")

  def write(self, content: Any, binary: bool = False, offset: int | None = None) -> None:
    raise OSError(errno.EACCES, f"mock KGSL: {self.path!r} is not writable (sysfs is not modeled)")

  def listdir(self) -> list[str]: raise OSError(errno.ENOTDIR, f"mock KGSL: {self.path!r} is not a directory")

  def seek(self, offset: int) -> None: pass

  @staticmethod
  def anon_mmap(start: int, sz: int, prot: int, flags: int, offset: int) -> int:
    """Anonymous host memory: real, as on a machine with the driver."""
    return FileIOInterface.anon_mmap(start, sz, prot, flags | MAP_ANONYMOUS)

  @staticmethod
  def munmap(buf: int, sz: int) -> None:
    """munmap of a GPU object's CPU mapping (the mock drops its GPU range with it), or of anonymous memory."""
    drv = driver()
    with drv.lock:
      if buf in drv.ranges: drv.unmap(buf, sz)
      else: FileIOInterface().munmap(buf, sz)

  @staticmethod
  def exists(path: str) -> bool: return MockFileIO.exists(path)

  @staticmethod
  def readlink(path: str) -> str: raise OSError(errno.ENOENT, f"mock KGSL: no link {path!r}")

  @staticmethod
  def eventfd(initval: int, flags: int | None = None) -> Any:
    raise OSError(errno.ENODEV, "mock KGSL: eventfd is not modeled (tinygrad's QCOM driver does not use it)")


def kgsl_driver() -> MockKGSL:
  """The mock KGSL tinygrad's driver talks to."""
  return driver()
