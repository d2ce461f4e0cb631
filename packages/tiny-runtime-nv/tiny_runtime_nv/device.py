"""The NV device (HCQ over NVIDIA's RM ioctls): not implemented yet; it fails with a reason that says what to use.

Opening it checks what a driver would need first, so the reason names the real obstacle: no `/dev/nvidiactl` (no
NVIDIA kernel driver), or no permission on it; with both present it says that the NV driver is not written yet and
that `DEV=CUDA` drives the same GPU through libcuda. `MOCK+NV` likewise points at `MOCK+CUDA`.
"""
from __future__ import annotations

import os

from tiny_uop.hcq import FileIOInterface
from tiny_uop.target import Target

NVIDIACTL_PATH = "/dev/nvidiactl"


class NVDevice:
  """``NV`` (RM/UVM ioctls, GPFIFO, QMD). Not implemented: the constructor raises RuntimeError with the reason."""

  def __init__(self, device: str, fio: type[FileIOInterface] = FileIOInterface):
    if Target.parse(device).check_interface().interface == "MOCK":
      raise RuntimeError(f"{device}: the mock RM driver (the NV HCQ path) is not implemented yet in tiny-runtime-nv; "
                         "DEV=MOCK+CUDA runs NVIDIA kernels on the PTX executor")
    if not fio.exists(NVIDIACTL_PATH):
      raise RuntimeError(f"no NVIDIA GPU ({NVIDIACTL_PATH} missing: the NVIDIA kernel driver is not loaded)")
    if not fio.access(NVIDIACTL_PATH, os.R_OK | os.W_OK):
      raise RuntimeError(f"{NVIDIACTL_PATH} is not readable and writable by this user (check the device node's "
                         "group and permissions)")
    raise RuntimeError(f"{NVIDIACTL_PATH} exists, but the NV (RM ioctl) driver is not implemented yet in "
                       "tiny-runtime-nv; DEV=CUDA uses this GPU through libcuda")
