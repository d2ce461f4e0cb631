"""tiny_runtime_qcom: cheap descriptors, entry points, lazy import, clear errors without an Adreno GPU or without
OpenCL, and other devices unaffected."""
import os
import subprocess
import sys

import pytest
import tiny_runtime_qcom
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device, DeviceUnavailableError
from tiny_uop.plugins.testing import check_import_is_cheap, check_plugin, check_unavailable, hardware_present


@pytest.mark.parametrize("name, attr", [("QCOM", "QCOM_PLUGIN"), ("CL", "CL_PLUGIN")])
def test_descriptor_and_entry_point(name, attr):
  check_plugin("tiny_runtime_qcom", attr, name, gpu=name != "CL")  # CL: see test_cl_is_never_the_default_device


def test_import_is_cheap():
  check_import_is_cheap("tiny_runtime_qcom")


def test_qcom_without_kgsl_is_a_clear_error_and_other_devices_keep_working():
  if hardware_present("/dev/kgsl-3d0"): pytest.skip("an Adreno GPU is present on this machine")
  with Context(TINY_PLUGINS="", DEV=""):
    check_unavailable("QCOM", r"no Adreno GPU \(/dev/kgsl-3d0 not found\)")
    check_unavailable("MOCK+CL", "unknown interface 'MOCK' for CL")
    with pytest.raises(DeviceUnavailableError): Device["QCOM"]
    assert "CPU" in list(Device.get_available_devices()) and Device["CPU"] is not None
    assert Device["MOCK+QCOM"].kgsl.info.arch == "a630"  # the mock is there whatever the hardware


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
  e = {k: v for k, v in os.environ.items() if k not in ("DEV", "TINY_PLUGINS")}
  return subprocess.run([sys.executable, "-c", code], env={**e, **env}, capture_output=True, text=True, check=True)


def test_plugins_listing_shows_qcom_with_its_reason():
  out = _run("import runpy; runpy.run_module('tiny_uop.plugins', run_name='__main__')").stdout
  line = next(ln for ln in out.splitlines() if ln.split()[:2] == ["device", "QCOM"])
  assert "tiny-runtime-qcom" in line and ("ok" in line.split() or "/dev/kgsl-3d0 not found" in line)


def test_cl_without_opencl_says_what_was_tried():
  code = ("from tiny_uop.plugins import Device\ntry: Device['CL']\nexcept Exception as e: print(type(e).__name__, e)")
  out = _run(code, TINY_OPENCL_ICD="/nonexistent/libvendor.so").stdout
  assert "DeviceUnavailableError" in out and "/nonexistent/libvendor.so" in out


def test_cl_is_never_the_default_device():
  # an installed OpenCL ICD (PoCL on a CI machine) must not take the default from CPU: DEV=CL chooses it
  out = _run("from tiny_uop.plugins import Device; print(Device.DEFAULT)").stdout
  assert out.strip() == "CPU" and tiny_runtime_qcom.CL_PLUGIN.default_ok is False
