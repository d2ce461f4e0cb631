"""tiny_runtime_amd: cheap descriptors, entry points, lazy import, and a clear error without an AMD GPU."""

import pytest
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device, DeviceUnavailableError
from tiny_uop.plugins.testing import check_import_is_cheap, check_plugin, check_unavailable, hardware_present

CASES = [
  ('AMD', 'plugin', '/dev/kfd', r'no /dev/kfd .*; for an emulated AMD GPU use DEV=MOCK\+AMD'),
]


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_descriptor_and_entry_point(name, attr, path, msg):
  check_plugin("tiny_runtime_amd", attr, name, gpu=True)


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


def test_plugins_cli_lists_mock_amd():
  """``python -m tiny_uop.plugins`` lists MOCK+AMD (declared by the descriptor's interfaces) and opens it."""
  import json
  import os
  import subprocess
  import sys
  env = {**os.environ, "DEV": "", "TINY_PLUGINS": ""}
  r = subprocess.run([sys.executable, "-m", "tiny_uop.plugins", "--json"], capture_output=True, text=True, env=env)
  assert r.returncode == 0, r.stderr
  rows = {row["name"]: row for row in json.loads(r.stdout) if row["kind"] == "device"}
  assert rows["MOCK+AMD"]["status"] == "ok" and rows["MOCK+AMD"]["package"] == "tiny-runtime-amd", rows["MOCK+AMD"]
  names = list(rows)
  assert names.index("MOCK+AMD") == names.index("AMD") + 1


def test_dev_amd_without_kfd_is_one_short_error():
  """DEV=AMD on a machine without /dev/kfd: the error says what is missing and what to use instead, with no chained
  driver traceback ("The above exception was the direct cause")."""
  if hardware_present("/dev/kfd"): pytest.skip("/dev/kfd present")
  import os
  import subprocess
  import sys
  env = {**os.environ, "DEV": "AMD", "TINY_PLUGINS": ""}
  r = subprocess.run([sys.executable, "-c", "from tiny_uop.plugins import Device; Device[Device.DEFAULT]"],
                     capture_output=True, text=True, env=env)
  assert r.returncode == 1
  last = r.stderr.strip().splitlines()[-1]
  assert last == ("tiny_uop.plugins.DeviceUnavailableError: device 'AMD' is unavailable: no /dev/kfd (no AMD GPU "
                  "driver on this machine); for an emulated AMD GPU use DEV=MOCK+AMD"), r.stderr
  assert "direct cause" not in r.stderr and "During handling" not in r.stderr, r.stderr
  assert r.stderr.count("Traceback") == 1
