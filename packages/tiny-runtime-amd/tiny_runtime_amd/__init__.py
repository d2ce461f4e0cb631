"""tiny-runtime-amd: the ``AMD`` device (KFD) and, later, ``MOCK+AMD`` (a mock KFD with an RDNA3 emulator).

Not implemented yet: `plugin` registers the device so that it is listed by ``python -m tiny_uop.plugins``, and
opening it raises a RuntimeError that says why. Importing this module is cheap and imports no driver code.
"""
from tiny_uop.plugins import DevicePlugin

__all__ = ["plugin"]

plugin = DevicePlugin("AMD", "tiny_runtime_amd.device:AMDDevice", priority=10)
