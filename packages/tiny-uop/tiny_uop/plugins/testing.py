"""Checks every device-plugin package should pass, shared by tiny's own runtimes and usable by third parties.

Each function raises AssertionError with a message saying what is wrong:

>>> from tiny_uop.plugins.testing import check_descriptor, check_entry_point, check_import_is_cheap
>>> check_descriptor(my_pkg.MY_PLUGIN, "MYDEV", "my_pkg")     # doctest: +SKIP
"""
from __future__ import annotations

import ctypes.util
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys

from tiny_uop.plugins import DevicePlugin, api_mismatch

CPU_PRIORITY = 90


def hardware_present(need: str) -> bool:
  """Whether what a device needs is on this machine: a device node (`/dev/kfd`) or a shared library (`libcuda`).
  Tests of "no hardware, clear error" skip where it is present."""
  if need.startswith("/"): return os.path.exists(need)
  return ctypes.util.find_library(need.removeprefix("lib")) is not None


def check_descriptor(plugin: object, name: str, module: str, gpu: bool = False) -> None:
  """`plugin` is a DevicePlugin named `name`, built for a PLUGIN_API this tiny-uop loads, whose device lives under
  `module`. `gpu=True` also checks what a GPU's descriptor promises: it may be the default, and comes before CPU."""
  assert isinstance(plugin, DevicePlugin), f"{plugin!r} is not a DevicePlugin"
  assert plugin.name == name, f"descriptor named {plugin.name!r}, expected {name!r}"
  assert (why := api_mismatch(plugin.api)) is None, f"{name}: {why}"
  assert plugin.target.startswith(f"{module}."), f"{name} points at {plugin.target!r}, outside {module}"
  if gpu:
    assert plugin.default_ok, f"{name} can never be the default device"
    assert plugin.priority < CPU_PRIORITY, "GPUs come before CPU when choosing the default device"


def check_plugin(package: str, attr: str, name: str, gpu: bool = False, dist: str | None = None) -> None:
  """Import package `package` exports the DevicePlugin `attr` for device `name` (`check_descriptor`; `gpu=True` for a
  GPU), registered as its `tiny.devices` entry point by distribution `dist` (default: `package` with dashes)."""
  check_descriptor(getattr(importlib.import_module(package), attr), name, package, gpu)
  check_entry_point(name, f"{package}:{attr}", dist or package.replace("_", "-"))


def check_entry_point(name: str, value: str, dist: str) -> None:
  """Device `name` is registered in `tiny.devices` as `value` by distribution `dist`."""
  eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="tiny.devices")}
  assert name in eps, f"{name} is not registered in tiny.devices: {sorted(eps)}"
  assert eps[name].value == value, f"{name} -> {eps[name].value!r}, expected {value!r}"
  owner = eps[name].dist
  assert owner is not None and owner.name == dist, f"{name} is registered by {owner}"


def check_import_is_cheap(module: str) -> None:
  """Importing `module` (in a fresh interpreter) imports none of its submodules: descriptors only."""
  code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('{module}.')))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "[]", f"import {module} imported {out.strip()}"


def check_unavailable(name: str, msg: str) -> None:
  """Opening `name` fails with a DeviceUnavailableError matching `msg`, the registry keeps the reason, and the
  device is not offered as available (call inside `Context(TINY_PLUGINS="", DEV="")`)."""
  from tiny_uop.plugins import Device, DeviceUnavailableError
  try:
    Device[name]
  except DeviceUnavailableError as e:
    assert re.search(msg, str(e)), f"opening {name} failed with {e!s}, which doesn't say {msg!r}"
  else:
    raise AssertionError(f"opening {name} succeeded; expected an error matching {msg!r}")
  status = Device.status(name)
  assert status is not None and re.search(msg, status), f"status of {name} is {status!r}"
  assert name not in list(Device.get_available_devices()), f"{name} is listed as available"
