"""The QCOM device (a placeholder until the KGSL driver lands) and the CL device (OpenCL, `tiny_runtime_qcom.cl`).

Opening QCOM always raises a RuntimeError that says what is missing, so the registry reports the device as
unavailable with that reason and other devices keep working; CL does the same where no OpenCL is installed.
"""
from __future__ import annotations

import os

from tiny_uop.target import Target

from tiny_runtime_qcom import cl as _cl

KGSL_PATH = "/dev/kgsl-3d0"


def _check_interface(device: str, name: str) -> None:
  if Target.parse(device).check_interface().interface == "MOCK":
    raise RuntimeError(f"{device}: the mock {name} driver is not implemented yet in tiny-runtime-qcom")


class QCOMDevice:
  """``QCOM`` (KGSL ioctls, Adreno). Not implemented: the constructor raises RuntimeError with the reason."""

  def __init__(self, device: str):
    _check_interface(device, "QCOM")
    if not os.path.exists(KGSL_PATH):
      raise RuntimeError(f"{KGSL_PATH} not found: no Adreno GPU on this machine (DEV=MOCK+QCOM is the planned mock)")
    raise RuntimeError(f"{KGSL_PATH} exists, but the QCOM driver is not implemented yet in tiny-runtime-qcom")


class CLDevice(_cl.CLDevice):
  """``CL`` (OpenCL through libOpenCL, or PyPI's PoCL; PoCL runs it on a CPU): see `tiny_runtime_qcom.cl`. Opening
  it without an OpenCL implementation raises RuntimeError with the reason; ``MOCK+CL`` isn't implemented."""

  def __init__(self, device: str = "CL"):
    _check_interface(device, "CL")
    try: _cl.libcl()
    except OSError as e: raise RuntimeError(str(e)) from e
    try: super().__init__(device)
    except _cl.CLError as e: raise RuntimeError(f"{device}: OpenCL is installed but unusable: {e}") from e
