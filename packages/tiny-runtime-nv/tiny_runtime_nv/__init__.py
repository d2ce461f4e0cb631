"""tiny-runtime-nv: the ``NV`` device (RM/UVM ioctls) and the ``CUDA`` device (driver API); later ``MOCK+NV``.

Not implemented yet: the descriptors register the devices so that they are listed by ``python -m tiny_uop.plugins``,
and opening either raises a RuntimeError that says why. Importing this module is cheap and imports no driver code.
"""
from tiny_uop.plugins import DevicePlugin

__all__ = ["NV_PLUGIN", "CUDA_PLUGIN", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

NV_PLUGIN = DevicePlugin("NV", "tiny_runtime_nv.device:NVDevice", priority=20)
CUDA_PLUGIN = DevicePlugin("CUDA", "tiny_runtime_nv.device:CUDADevice", priority=25)
