"""tiny_runtime_amd: cheap descriptors, entry points, lazy import, and a clear error without an AMD GPU."""
import ctypes.util
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

import tiny_runtime_amd
from tiny_uop.helpers import Context
from tiny_uop.plugins import PLUGIN_API, Device, DevicePlugin, DeviceUnavailableError

CASES = [
  ('AMD', 'plugin', '/dev/kfd', r'no AMD GPU \(/dev/kfd missing\)'),
]


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_descriptor(name, attr, path, msg):
  p = getattr(tiny_runtime_amd, attr)
  assert isinstance(p, DevicePlugin) and p.name == name and p.api == PLUGIN_API and p.default_ok
  assert p.target.startswith("tiny_runtime_amd.device:")
  assert p.priority < 90, "GPUs come before CPU (priority 90) when choosing the default device"


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_entry_point(name, attr, path, msg):
  eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="tiny.devices")}
  assert name in eps, f"{name} is not registered in tiny.devices: {sorted(eps)}"
  assert eps[name].value == "tiny_runtime_amd:" + attr
  assert eps[name].dist is not None and eps[name].dist.name == "tiny-runtime-amd"


def test_import_is_cheap():
  code = "import sys, tiny_runtime_amd; print(sorted(m for m in sys.modules if m.startswith('tiny_runtime_amd.')))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "[]"


def _hardware_present(name, path):
  if path is not None: return os.path.exists(path)
  return ctypes.util.find_library("cuda" if name == "CUDA" else "OpenCL") is not None


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_open_without_hardware_is_a_clear_error(name, attr, path, msg):
  if _hardware_present(name, path): pytest.skip(f"{name} hardware or library present on this machine")
  with Context(TINY_PLUGINS="", DEV=""):
    with pytest.raises(DeviceUnavailableError, match=msg): Device[name]
    assert Device.status(name) is not None and re.search(msg, Device.status(name))
    assert name not in list(Device.get_available_devices())


def test_other_devices_keep_working_without_amd():
  if os.path.exists("/dev/kfd"): pytest.skip("/dev/kfd present")
  with Context(TINY_PLUGINS="", DEV=""):
    with pytest.raises(DeviceUnavailableError): Device["AMD"]
    assert "CPU" in list(Device.get_available_devices())
    assert Device["CPU"] is not None
