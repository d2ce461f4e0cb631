"""tiny_runtime_qcom: cheap descriptors, entry points, lazy import, and honest errors until the driver exists."""
import os

import pytest
import tiny_runtime_qcom
from tiny_uop.helpers import Context
from tiny_uop.plugins.testing import check_import_is_cheap, check_plugin, check_unavailable, hardware_present

CASES = [
  ('QCOM', 'QCOM_PLUGIN', '/dev/kgsl-3d0', '/dev/kgsl-3d0 not found'),
  ('CL', 'CL_PLUGIN', 'libOpenCL', 'libOpenCL: not installed'),
]


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_descriptor_and_entry_point(name, attr, path, msg):
  check_plugin("tiny_runtime_qcom", attr, name, gpu=name != "CL")  # CL: see test_cl_is_never_the_default_device


def test_import_is_cheap():
  check_import_is_cheap("tiny_runtime_qcom")


@pytest.mark.parametrize("name, attr, path, msg", CASES)
def test_open_without_hardware_is_a_clear_error(name, attr, path, msg, monkeypatch):
  from tiny_runtime_qcom import cl
  from tiny_uop.plugins import Device
  if name == "CL":  # a machine with no OpenCL at all: no libOpenCL, no PoCL wheel (nox installs one, so pretend)
    monkeypatch.setattr(cl.ctypes.util, "find_library", lambda lib: None)
    monkeypatch.setattr(cl, "pypi_pocl", lambda: None)
    cl.libcl.cache_clear()
  elif hardware_present(path): pytest.skip(f"{name} hardware or library present on this machine")
  Device._forget(name)
  try:
    with Context(TINY_PLUGINS="", DEV=""):
      check_unavailable(name, msg)
      check_unavailable("MOCK+" + name, "not implemented yet")
  finally:  # the real OpenCL again for the tests after this one
    cl.libcl.cache_clear()
    Device._forget(name)


def test_cl_is_never_the_default_device():
  # an installed OpenCL ICD (PoCL on a CI machine) must not take the default from CPU: DEV=CL chooses it
  import subprocess
  import sys
  env = {k: v for k, v in os.environ.items() if k not in ("DEV", "TINY_PLUGINS")}
  code = "from tiny_uop.plugins import Device; print(Device.DEFAULT)"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
  assert out.strip() == "CPU" and tiny_runtime_qcom.CL_PLUGIN.default_ok is False
