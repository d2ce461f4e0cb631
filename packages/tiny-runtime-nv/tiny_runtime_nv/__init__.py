"""tiny-runtime-nv: the ``NV`` device (RM/UVM ioctls, GPFIFO channels, QMD launches of cubins) and the ``CUDA``
device (libcuda's driver API), and their mocks ``MOCK+NV`` / ``MOCK+CUDA`` whose GPU is the package's PTX executor.

The descriptors register the devices so that they are listed by ``python -m tiny_uop.plugins``; opening one without
its hardware raises a RuntimeError that says why. Importing this module is cheap and imports no driver code.
"""
from tiny_uop.plugins import DevicePlugin

__all__ = ["NV_PLUGIN", "CUDA_PLUGIN", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

NV_PLUGIN = DevicePlugin("NV", "tiny_runtime_nv.device:NVDevice", priority=20, interfaces=("MOCK",))
CUDA_PLUGIN = DevicePlugin("CUDA", "tiny_runtime_nv.cuda:CUDADevice", priority=25, interfaces=("MOCK",))
