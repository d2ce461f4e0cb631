"""tiny-runtime-qcom: the ``QCOM`` device (KGSL ioctls, Adreno a6xx command streams), ``MOCK+QCOM`` (a mock KGSL and
an Adreno 630 that runs kernels on PoCL) and the ``CL`` device (OpenCL through cffi).

The descriptors register both devices so that they are listed by ``python -m tiny_uop.plugins``; opening one that
can't work (no /dev/kgsl-3d0, no OpenCL) raises a RuntimeError that says why. Importing this module is cheap and
imports no driver code.
"""
from tiny_uop.plugins import DevicePlugin

__all__ = ["QCOM_PLUGIN", "CL_PLUGIN", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

QCOM_PLUGIN = DevicePlugin("QCOM", "tiny_runtime_qcom.device:QCOMDevice", priority=30, interfaces=("MOCK",))
# not a default: OpenCL is as often a CPU implementation (PoCL, which CI installs) as a GPU, and must not displace CPU
# just because an ICD is installed; `DEV=CL` picks it
CL_PLUGIN = DevicePlugin("CL", "tiny_runtime_qcom.device:CLDevice", priority=40, default_ok=False)
