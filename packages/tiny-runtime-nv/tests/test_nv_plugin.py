"""tiny_runtime_nv: cheap descriptors, entry points, lazy import, and honest errors until the driver exists."""

import pytest
from tiny_uop.helpers import Context
from tiny_uop.plugins.testing import check_import_is_cheap, check_plugin, check_unavailable, hardware_present

CASES = [
  ('NV', 'NV_PLUGIN', '/dev/nvidiactl', '/dev/nvidiactl not found'),
  ('CUDA', 'CUDA_PLUGIN', 'libcuda', 'libcuda not found'),
]


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_descriptor_and_entry_point(name, attr, path, msg):
  check_plugin("tiny_runtime_nv", attr, name, gpu=True)


def test_import_is_cheap():
  check_import_is_cheap("tiny_runtime_nv")


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_open_without_hardware_is_a_clear_error(name, attr, path, msg):
  if hardware_present(path): pytest.skip(f"{name} hardware or library present on this machine")
  with Context(TINY_PLUGINS="", DEV=""):
    check_unavailable(name, msg)
    check_unavailable("MOCK+" + name, "not implemented yet")
