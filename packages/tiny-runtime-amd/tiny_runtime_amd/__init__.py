"""tiny-runtime-amd: the ``AMD`` device (KFD ioctls, PM4 compute queue, SDMA copy queue) and ``MOCK+AMD`` (the same
driver against an in-process mock KFD whose gfx1100 runs code objects in an RDNA3 emulator).

`plugin` registers the device (``python -m tiny_uop.plugins`` lists it). Importing this module is cheap and imports
no driver code; `tiny_runtime_amd.device` is imported on the first ``Device["AMD"]``.
"""
from tiny_uop.plugins import DevicePlugin

__all__ = ["plugin", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

plugin = DevicePlugin("AMD", "tiny_runtime_amd.device:AMDDevice", priority=10, interfaces=("MOCK",))
