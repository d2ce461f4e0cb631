"""The NV and CUDA devices: placeholders until the drivers land.

Opening either always raises a RuntimeError that says what is missing, so the registry reports the device as
unavailable with that reason and other devices keep working.
"""
from __future__ import annotations

import ctypes.util
import os

from tiny_uop.target import Target

NVIDIACTL_PATH = "/dev/nvidiactl"


def _check_interface(device: str, name: str) -> None:
  if Target.parse(device).check_interface().interface == "MOCK":
    raise RuntimeError(f"{device}: the mock {name} driver and PTX executor are not implemented yet in tiny-runtime-nv")


class NVDevice:
  """``NV`` (RM/UVM ioctls). Not implemented: the constructor raises RuntimeError with the reason."""

  def __init__(self, device: str):
    _check_interface(device, "NV")
    if not os.path.exists(NVIDIACTL_PATH):
      raise RuntimeError(f"{NVIDIACTL_PATH} not found: no NVIDIA GPU on this machine (DEV=MOCK+NV is the planned mock)")
    raise RuntimeError(f"{NVIDIACTL_PATH} exists, but the NV driver is not implemented yet in tiny-runtime-nv")


class CUDADevice:
  """``CUDA`` (driver API through cffi). Not implemented: the constructor raises RuntimeError with the reason."""

  def __init__(self, device: str):
    _check_interface(device, "CUDA")
    if ctypes.util.find_library("cuda") is None:
      raise RuntimeError("libcuda not found: no NVIDIA driver on this machine (DEV=NULL:PTX compiles without one)")
    raise RuntimeError("libcuda found, but the CUDA device is not implemented yet in tiny-runtime-nv")
