"""The conformance suite (tiny_tensor.conformance) passes on our devices, and fails (exit status 1) on a broken one.

Under ``DEV=...`` (the ``tiny-tensor@MOCK+AMD`` nox session) it checks that device only; otherwise CPU, PYTHON and
MOCK+AMD.
"""
import os
import subprocess
import sys

import pytest
from tiny_tensor import conformance
from tiny_uop.device import Compiled
from tiny_uop.plugins import DevicePlugin, register_device, unregister_device

DEVICES = [os.environ["DEV"]] if os.environ.get("DEV") else ["CPU", "PYTHON", "MOCK+AMD"]
NO_GRAPH = {"PYTHON"}  # CPU replays through CPUGraph (tiny-runtime-cpu graph.py)


@pytest.mark.parametrize("device", DEVICES)
def test_our_devices_conform(device):
  results = conformance.run(device)
  failed = [r for r in results if r.status == "FAIL"]
  assert not failed, "\n" + conformance.format_table(failed)
  assert {r.group for r in results} == set(conformance.GROUPS)
  na = {(r.group, r.name) for r in results if r.status == "n/a"}
  assert na == ({("graph", "device graph replay")} if device in NO_GRAPH else set()), na


def test_cli_prints_a_table_and_exits_0():
  r = subprocess.run([sys.executable, "-m", "tiny_tensor.conformance", "--device", "CPU", "--only", "views,copies"],
                     capture_output=True, text=True, env={**os.environ, "DEV": ""})
  assert r.returncode == 0, r.stdout + r.stderr
  lines = r.stdout.splitlines()
  assert lines[0] == "tiny conformance: device CPU"
  assert lines[1].split() == ["GROUP", "CHECK", "RESULT", "TIME", "DETAIL"]
  assert any(line.split()[:2] == ["views", "slicing"] and "pass" in line.split() for line in lines)
  assert lines[-1] == "7 passed, 0 failed, 0 n/a"


def test_cli_unknown_device_and_group():
  r = subprocess.run([sys.executable, "-m", "tiny_tensor.conformance", "--device", "NOPEDEV"], capture_output=True,
                     text=True)
  assert r.returncode == 2 and "unknown device 'NOPEDEV'" in r.stderr, r.stderr
  r = subprocess.run([sys.executable, "-m", "tiny_tensor.conformance", "--device", "CPU", "--only", "opz"],
                     capture_output=True, text=True)
  assert r.returncode == 2 and "unknown check group(s) opz; valid: ops, nn, views" in r.stderr, r.stderr


# a device that is CPU except that reading device memory back flips one bit of the first byte: the suite must see it
BROKEN = '''
from tiny_runtime_cpu.cpu import CPUDevice
from tiny_runtime_cpu.memory import HostAllocator
class BrokenAllocator(HostAllocator):
  def _copyout(self, dest, src):
    super()._copyout(dest, src)
    if len(dest): dest[0] ^= 1
class BrokenDevice(CPUDevice):
  def __init__(self, name):
    super().__init__(name)
    self.allocator = BrokenAllocator()
'''


@pytest.fixture
def broken(tmp_path, monkeypatch):
  (tmp_path / "broken_conf_dev.py").write_text(BROKEN)
  monkeypatch.syspath_prepend(str(tmp_path))
  register_device(DevicePlugin("BROKENCONF", "broken_conf_dev:BrokenDevice", default_ok=False))
  yield tmp_path
  unregister_device("BROKENCONF")
  sys.modules.pop("broken_conf_dev", None)


def test_a_broken_device_fails(broken):
  results = conformance.run("BROKENCONF", ["copies", "ops"])
  failed = {r.name for r in results if r.status == "FAIL"}
  # a flipped float LSB is within tolerance; in an int or a byte it is not
  assert {"host round trip", "int32 arithmetic"} <= failed, conformance.format_table(results)
  assert all("AssertionError" in r.detail for r in results if r.status == "FAIL")
  assert issubclass(type(__import__("broken_conf_dev").BrokenDevice("X")), Compiled)


def test_cli_exit_status_1_on_failure(broken):
  code = ("import sys; sys.path.insert(0, sys.argv[1]); from tiny_uop.plugins import DevicePlugin, register_device\n"
          "register_device(DevicePlugin('BROKENCONF', 'broken_conf_dev:BrokenDevice', default_ok=False))\n"
          "from tiny_tensor.conformance import main\n"
          "raise SystemExit(main(['--device', 'BROKENCONF', '--only', 'copies']))")
  r = subprocess.run([sys.executable, "-c", code, str(broken)], capture_output=True, text=True)
  assert r.returncode == 1, r.stdout + r.stderr
  assert "FAIL" in r.stdout and r.stdout.splitlines()[-1].endswith("0 n/a") and " failed" in r.stdout
