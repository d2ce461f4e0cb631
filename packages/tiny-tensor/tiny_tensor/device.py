"""The device registry, re-exported: `Device["CPU"]` opens a device, `Device.DEFAULT` names the default one."""
from tiny_uop.plugins import Device, DeviceUnavailableError, UnknownDeviceError

__all__ = ["Device", "DeviceUnavailableError", "UnknownDeviceError"]
