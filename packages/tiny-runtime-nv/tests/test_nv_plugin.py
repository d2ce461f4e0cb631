"""tiny_runtime_nv: cheap descriptors, entry points, lazy import, and clear reasons when the hardware is missing."""
import re
import subprocess
import sys

import pytest
from tiny_uop.helpers import Context
from tiny_uop.plugins.testing import check_import_is_cheap, check_plugin, check_unavailable, hardware_present

CASES = [
  ('NV', 'NV_PLUGIN', '/dev/nvidiactl', r'no NVIDIA GPU \(/dev/nvidiactl missing'),
  ('CUDA', 'CUDA_PLUGIN', 'libcuda', r'libcuda.so.1 not found: no NVIDIA driver'),
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
  out = subprocess.run([sys.executable, "-m", "tiny_uop.plugins"], capture_output=True, text=True, check=True).stdout
  line = next(ln for ln in out.splitlines() if ln.split()[:2] == ["device", name])
  assert "unavailable" in line and re.search(msg, line), line  # `python -m tiny_uop.plugins` shows why


def test_mock_nv_opens_an_h200_and_an_a100():
  from tiny_uop.plugins import Device
  h, a = Device["MOCK+NV"], Device["MOCK+NV:1"]
  assert (h.arch, a.arch) == ("sm_90", "sm_80") and h.renderer.__class__.__name__ == "PTXRenderer"
  assert Device["CPU"] is not None


def test_mock_cuda_opens_and_other_devices_keep_working():
  from tiny_uop.plugins import Device
  dev = Device["MOCK+CUDA"]
  assert dev.arch == "sm_90" and dev.renderer.__class__.__name__ == "PTXRenderer"
  assert Device["CPU"] is not None


def test_nvptx_renderer_is_an_entry_point():
  from tiny_uop.plugins import load_renderer
  from tiny_codegen.renderer.nvptx import NVPTXRenderer
  assert load_renderer("NVPTX") is NVPTXRenderer
