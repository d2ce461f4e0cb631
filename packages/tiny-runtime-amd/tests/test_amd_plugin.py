"""tiny_runtime_amd: cheap descriptors, entry points, lazy import, and a clear error without an AMD GPU."""

import pytest
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device, DeviceUnavailableError
from tiny_uop.plugins.testing import check_import_is_cheap, check_plugin, check_unavailable, hardware_present

CASES = [
  ('AMD', 'plugin', '/dev/kfd', r'no AMD GPU \(/dev/kfd missing\)'),
]


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_descriptor_and_entry_point(name, attr, path, msg):
  check_plugin("tiny_runtime_amd", attr, name)


def test_import_is_cheap():
  check_import_is_cheap("tiny_runtime_amd")


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_open_without_hardware_is_a_clear_error(name, attr, path, msg):
  if hardware_present(path): pytest.skip(f"{name} hardware present on this machine")
  with Context(TINY_PLUGINS="", DEV=""):
    check_unavailable(name, msg)


def test_other_devices_keep_working_without_amd():
  if hardware_present("/dev/kfd"): pytest.skip("/dev/kfd present")
  with Context(TINY_PLUGINS="", DEV=""):
    with pytest.raises(DeviceUnavailableError): Device["AMD"]
    assert "CPU" in list(Device.get_available_devices())
    assert Device["CPU"] is not None
