"""The AMD device: a placeholder until the KFD driver lands.

Opening it always raises a RuntimeError that says what is missing, so the registry reports the device as
unavailable with that reason and other devices keep working.
"""
from __future__ import annotations

import os

from tiny_uop.target import Target

KFD_PATH = "/dev/kfd"


class AMDDevice:
  """``AMD`` / ``MOCK+AMD``. Not implemented: the constructor raises RuntimeError with the reason."""

  def __init__(self, device: str):
    target = Target.parse(device)
    if target.interface == "MOCK":
      raise RuntimeError(f"{device}: the mock KFD and RDNA3 emulator are not implemented yet in tiny-runtime-amd")
    if target.interface is not None:
      raise RuntimeError(f"{device}: unknown interface {target.interface!r} for AMD; valid: none (real KFD) or MOCK")
    if not os.path.exists(KFD_PATH):
      raise RuntimeError(f"{KFD_PATH} not found: no AMD GPU on this machine (DEV=MOCK+AMD is the planned emulator)")
    raise RuntimeError(f"{KFD_PATH} exists, but the AMD driver is not implemented yet in tiny-runtime-amd")
