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
from dataclasses import dataclass
from pathlib import Path

from tiny_uop.plugins import DevicePlugin, api_mismatch

CPU_PRIORITY = 90
_IMPORTED = "selftest-imported:"  # the line a selftest's process ends its stderr with: the packages it imported


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


@dataclass(frozen=True)
class SelftestRun:
  """A finished `python -m <runtime>.selftest`: its exit status, its output, and the packages its process imported."""
  returncode: int
  stdout: str
  stderr: str
  imported: frozenset[str]  # top-level names: "tiny_tensor" in it means the selftest imported tiny-tensor itself


@dataclass(frozen=True)
class SourceTreeSelftest:
  """A runtime's `python -m <package>.selftest` run as from a bare source tree, for its tests: PYTHONPATH is
  `root`/packages/ tiny-uop, tiny-codegen, tiny-runtime-cpu, the runtime's own package and tiny-tensor (no installed
  entry points), DEV is unset unless given, the working directory is outside the tree.

  >>> SELFTEST = SourceTreeSelftest("tiny_runtime_amd", ROOT)          # doctest: +SKIP
  >>> assert SELFTEST.run("--mock", "--no-tensor").returncode == 0      # doctest: +SKIP
  """
  package: str  # the runtime's import package, e.g. "tiny_runtime_amd"
  root: Path  # the repository root (the folder holding packages/)

  def run(self, *args: str, dev: str = "", timeout: float = 600) -> SelftestRun:
    """Run the selftest with `args` (DEV=`dev` when given) and return how it ended."""
    packages = ("tiny-uop", "tiny-codegen", "tiny-runtime-cpu", self.package.replace("_", "-"), "tiny-tensor")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(Path(self.root) / "packages" / p) for p in packages)}
    env.pop("DEV", None)
    if dev: env["DEV"] = dev
    code = (f"import runpy, sys\nsys.argv[1:] = {list(args)!r}\n"
            f"try: runpy.run_module('{self.package}.selftest', run_name='__main__')\n"
            f"finally: print({_IMPORTED!r}, *sorted({{m.partition('.')[0] for m in sys.modules}}), file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout,
                       cwd=str(Path(self.root).parent), check=False)
    stderr, found, last = p.stderr.rpartition(_IMPORTED)
    assert found, f"the selftest ended (exit status {p.returncode}) without saying what it imported (killed or " \
                  f"crashed?):\n{p.stdout}{p.stderr}"
    return SelftestRun(p.returncode, p.stdout, stderr, frozenset(last.split()))

  def check_without_gpu(self, gpu: str, *reasons: str) -> None:
    """On a machine without the GPU, the selftest ends at once with exit status 2 and says `no {gpu} usable here` and
    each of `reasons` on stderr."""
    p = self.run(timeout=300)
    assert p.returncode == 2, f"exit status {p.returncode}, expected 2:\n{p.stdout}{p.stderr}"
    for want in (f"no {gpu} usable here", *reasons): assert want in p.stderr, f"{want!r} not in stderr:\n{p.stderr}"
