"""tiny_runtime_cpu's plugin descriptors: names, targets, priorities, entry points, and a cheap import."""
import importlib.metadata
import subprocess
import sys

import pytest

import tiny_runtime_cpu
from tiny_uop.plugins import PLUGIN_API, DevicePlugin

DESCRIPTORS = {
  "CPU": ("CPU_PLUGIN", "tiny_runtime_cpu.cpu:CPUDevice", True),
  "PYTHON": ("PYTHON_PLUGIN", "tiny_runtime_cpu.python:PythonDevice", False),
  "NULL": ("NULL_PLUGIN", "tiny_runtime_cpu.null:NullDevice", False),
  "DISK": ("DISK_PLUGIN", "tiny_runtime_cpu.disk:DiskDevice", False),
}


@pytest.mark.parametrize("name", DESCRIPTORS)
def test_descriptor(name):
  attr, target, default_ok = DESCRIPTORS[name]
  p = getattr(tiny_runtime_cpu, attr)
  assert isinstance(p, DevicePlugin)
  assert (p.name, p.target, p.default_ok, p.api) == (name, target, default_ok, PLUGIN_API)


def test_cpu_is_the_last_real_device():
  cpu = tiny_runtime_cpu.CPU_PLUGIN
  others = [tiny_runtime_cpu.PYTHON_PLUGIN, tiny_runtime_cpu.NULL_PLUGIN, tiny_runtime_cpu.DISK_PLUGIN]
  assert all(cpu.priority < p.priority for p in others)
  assert cpu.priority >= 90  # GPU plugins use 10-40


@pytest.mark.parametrize("name", DESCRIPTORS)
def test_entry_point(name):
  eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="tiny.devices")}
  assert name in eps, f"{name} is not registered in tiny.devices: {sorted(eps)}"
  assert eps[name].value == f"tiny_runtime_cpu:{DESCRIPTORS[name][0]}"
  assert eps[name].load() is getattr(tiny_runtime_cpu, DESCRIPTORS[name][0])


def test_import_is_cheap():
  """Importing the package (what entry-point discovery does) imports none of the device modules."""
  code = "import sys, tiny_runtime_cpu; print(sorted(m for m in sys.modules if m.startswith('tiny_runtime_cpu.')))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "[]"
