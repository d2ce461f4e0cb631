"""Tests for the plugin registry: lazy discovery, failure isolation, DEV / TINY_PLUGINS, errors for people.

Fake devices live in small modules written to a temporary folder, so nothing here needs a runtime package installed;
one test also installs a fake distribution (a .dist-info folder with entry points) to exercise real discovery.
"""
import json
import os
import subprocess
import sys
import textwrap
import uuid
import warnings

import pytest

from tiny_uop import plugins
from tiny_uop.helpers import Context
from tiny_uop.plugins import (PLUGIN_API, Device, DevicePlugin, DeviceUnavailableError, UnknownDeviceError,
                              register_device, unregister_device)

FAKE_DEVICES = '''
OPENED = []
class GoodDevice:
  def __init__(self, name):
    OPENED.append(name)
    self.name = name
class FailingDevice:
  def __init__(self, name):
    raise RuntimeError(f"/dev/fake not found: no FAKE hardware for {name}")
NOT_A_CLASS = 42
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
  """Writes fake device modules with unique names; registers plugins through reg(); undoes everything after."""
  uid = uuid.uuid4().hex[:8]
  mods = {"good": f"fakedev_{uid}", "broken": f"fakebroken_{uid}"}
  (tmp_path / f"{mods['good']}.py").write_text(FAKE_DEVICES)
  (tmp_path / f"{mods['broken']}.py").write_text("raise ImportError('libfake.so: cannot open shared object file')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  names: list[str] = []

  class Fake:
    good, broken = mods["good"], mods["broken"]

    @staticmethod
    def reg(plugin, **kw):
      register_device(plugin, **kw)
      names.append(kw.get("name") or plugin.name)

  with Context(DEV="", TINY_PLUGINS=""):
    yield Fake
  for n in names: unregister_device(n)
  for m in mods.values(): sys.modules.pop(m, None)


def test_plugin_api_is_exported():
  import tiny_uop
  assert isinstance(PLUGIN_API, tuple) and len(PLUGIN_API) == 2 and all(isinstance(x, int) for x in PLUGIN_API)
  assert tiny_uop.PLUGIN_API == PLUGIN_API, "tiny_uop.PLUGIN_API and tiny_uop.plugins.PLUGIN_API disagree"


def test_good_device_opens_once_per_canonical_name(fake):
  fake.reg(DevicePlugin("GOODX", f"{fake.good}:GoodDevice"))
  d = Device["GOODX"]
  assert d.name == "GOODX"
  assert Device["goodx"] is d and Device["GOODX:0"] is d and Device["GOODX:LLVM"] is d
  d1 = Device["GOODX:1"]
  assert d1 is not d and d1.name == "GOODX:1"
  assert sys.modules[fake.good].OPENED == ["GOODX", "GOODX:1"]


def test_failure_isolation(fake):
  """Each kind of broken plugin is reported with its reason; the good one keeps working."""
  fake.reg(DevicePlugin("GOODX", f"{fake.good}:GoodDevice"))
  fake.reg(DevicePlugin("BROKENX", f"{fake.broken}:Device"))
  fake.reg(DevicePlugin("OPENFAILX", f"{fake.good}:FailingDevice"))
  fake.reg(DevicePlugin("NOTCLASSX", f"{fake.good}:NOT_A_CLASS"))
  fake.reg(DevicePlugin("MISSINGX", f"{fake.good}:NoSuchDevice"))
  fake.reg(lambda: 42, name="WRONGX")
  fake.reg(lambda: (_ for _ in ()).throw(ImportError("no module named fake_ep")), name="EPFAILX")
  fake.reg(lambda: DevicePlugin("OTHERNAME", f"{fake.good}:GoodDevice"), name="RENAMEDX")
  expected = {
    "BROKENX": "libfake.so: cannot open shared object file",
    "OPENFAILX": "RuntimeError: /dev/fake not found: no FAKE hardware for OPENFAILX",
    "NOTCLASSX": "is a int, not a device class",
    "MISSINGX": "has no attribute 'NoSuchDevice'",
    "WRONGX": "is a int, not a tiny_uop.plugins.DevicePlugin",
    "EPFAILX": "ImportError: no module named fake_ep",
    "RENAMEDX": "points to a DevicePlugin named 'OTHERNAME'",
  }
  for name, reason in expected.items():
    with pytest.raises(DeviceUnavailableError) as e: Device[name]
    assert f"device {name!r} is unavailable" in str(e.value) and reason in str(e.value), str(e.value)
    assert Device.status(name) is not None and reason in Device.status(name)
  assert Device["GOODX"].name == "GOODX"
  assert Device.status("GOODX") is None
  # the report lists each of them with its reason
  from tiny_uop.plugins.__main__ import rows
  table = {r["name"]: r for r in rows() if r["kind"] == "device"}
  assert table["GOODX"]["status"] == "ok"
  for name, reason in expected.items():
    assert table[name]["status"] == "unavailable" and reason in table[name]["reason"]


def test_open_failure_keeps_cause(fake):
  fake.reg(DevicePlugin("OPENFAILX", f"{fake.good}:FailingDevice"))
  with pytest.raises(DeviceUnavailableError) as e: Device["OPENFAILX"]
  assert isinstance(e.value.__cause__, RuntimeError)
  # a failed open is remembered, not retried every time
  with pytest.raises(DeviceUnavailableError, match="/dev/fake not found"): Device["OPENFAILX"]


def test_major_api_mismatch_disables_with_one_warning(fake):
  major = PLUGIN_API[0] + 1
  fake.reg(DevicePlugin("OLDAPIX", f"{fake.good}:GoodDevice", api=(major, 0)))
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for _ in range(3):
      with pytest.raises(DeviceUnavailableError, match=f"built for plugin API {major}.0"): Device["OLDAPIX"]
  msgs = [str(x.message) for x in w if "OLDAPIX" in str(x.message)]
  assert len(msgs) == 1 and "disabled" in msgs[0] and f"provides {PLUGIN_API[0]}.{PLUGIN_API[1]}" in msgs[0]
  assert fake.good not in sys.modules or sys.modules[fake.good].OPENED == []  # never opened


def test_older_minor_api_loads(fake):
  """A plugin built for an older minor of the same major loads: a minor release only adds to the contract."""
  assert PLUGIN_API[1] >= 1, "test needs a minor above 0 to build an older one"
  fake.reg(DevicePlugin("OLDMINORX", f"{fake.good}:GoodDevice", api=(PLUGIN_API[0], PLUGIN_API[1] - 1)))
  assert Device["OLDMINORX"].name == "OLDMINORX"


def test_newer_minor_api_is_refused_with_the_fix(fake):
  """A plugin built for a newer minor may call what this tiny-uop lacks: refused, saying what to upgrade."""
  newer = (PLUGIN_API[0], PLUGIN_API[1] + 1)
  fake.reg(DevicePlugin("NEWMINORX", f"{fake.good}:GoodDevice", api=newer), package="tiny-newminor")
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with pytest.raises(DeviceUnavailableError) as e: Device["NEWMINORX"]
  msg = str(e.value)
  ours = f"{PLUGIN_API[0]}.{PLUGIN_API[1]}"
  assert f"built for plugin API {newer[0]}.{newer[1]}, newer than this tiny-uop's {ours}" in msg
  assert "upgrade tiny-uop" in msg and "tiny-newminor release built for" in msg
  assert any("NEWMINORX" in str(x.message) and "disabled" in str(x.message) for x in w)
  assert fake.good not in sys.modules or sys.modules[fake.good].OPENED == []  # never opened


@pytest.mark.parametrize("api, loads", [((PLUGIN_API[0], 0), True), (PLUGIN_API, True),
                                        ((PLUGIN_API[0], PLUGIN_API[1] + 1), False),
                                        ((PLUGIN_API[0] + 1, 0), False), ((PLUGIN_API[0] + 1, PLUGIN_API[1]), False)]
                         + ([((PLUGIN_API[0] - 1, PLUGIN_API[1]), False)] if PLUGIN_API[0] > 0 else []))
def test_api_mismatch_rules(api, loads):
  from tiny_uop.plugins import api_mismatch
  why = api_mismatch(api, "pkg")
  assert (why is None) == loads, why
  if not loads: assert f"built for plugin API {api[0]}.{api[1]}" in why and "pkg" in why or "upgrade tiny-uop" in why


def test_opening_one_device_imports_only_its_module(fake):
  fake.reg(DevicePlugin("GOODX", f"{fake.good}:GoodDevice"))
  fake.reg(DevicePlugin("BROKENX", f"{fake.broken}:Device"))
  assert fake.good not in sys.modules and fake.broken not in sys.modules  # registering imports nothing
  Device["GOODX"]
  assert fake.good in sys.modules and fake.broken not in sys.modules


def test_unknown_device_names_installed_and_closest(fake):
  fake.reg(DevicePlugin("GOODX", f"{fake.good}:GoodDevice"))
  with pytest.raises(UnknownDeviceError) as e: Device["AMDD"]
  msg = str(e.value)
  assert msg.startswith("unknown device 'AMDD'; installed: ")
  for name in Device.installed(): assert name in msg
  assert "GOODX" in msg and "did you mean 'AMD'" in msg
  with pytest.raises(UnknownDeviceError, match="did you mean 'GOODX'"): Device["GOODY"]


def test_unknown_device_from_dev(fake):
  with Context(DEV="AMDD"):
    with pytest.raises(UnknownDeviceError) as e: Device.DEFAULT
  msg = str(e.value)
  assert "unknown device 'AMDD' (from DEV='AMDD')" in msg and "installed: " in msg and "did you mean 'AMD'" in msg


def test_unknown_device_from_dev_env_in_subprocess():
  env = {**os.environ, "DEV": "AMDD"}
  code = "from tiny_uop.plugins import Device\ntry: Device.DEFAULT\nexcept LookupError as e: print(e)"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
  assert "unknown device 'AMDD'" in out and "did you mean 'AMD'" in out, out


def test_known_but_not_installed(fake, monkeypatch):
  monkeypatch.setitem(plugins.KNOWN_DEVICES, "ZZTOP", "tiny-runtime-zztop")
  with pytest.raises(UnknownDeviceError, match="device 'ZZTOP' is not installed; pip install tiny-runtime-zztop"):
    Device["ZZTOP"]


def test_malformed_name():
  with pytest.raises(ValueError, match="bad DEV string 'CPU:a:b:c'"): Device["CPU:a:b:c"]


def test_tiny_plugins_allow_list(fake):
  fake.reg(DevicePlugin("GOODX", f"{fake.good}:GoodDevice"))
  fake.reg(DevicePlugin("GOODY", f"{fake.good}:GoodDevice"))
  with Context(TINY_PLUGINS="goody"):
    assert Device.installed() == ["GOODY"]
    with pytest.raises(UnknownDeviceError, match="device 'GOODX' is disabled by TINY_PLUGINS='goody'; allowed: GOODY"):
      Device["GOODX"]
    assert Device["GOODY"].name == "GOODY"


def test_default_priority_order(fake):
  fake.reg(DevicePlugin("NODEFX", f"{fake.good}:GoodDevice", priority=0, default_ok=False))
  fake.reg(DevicePlugin("FAILFIRSTX", f"{fake.good}:FailingDevice", priority=1))
  fake.reg(DevicePlugin("BROKENX", f"{fake.broken}:Device", priority=2))
  fake.reg(DevicePlugin("SECONDX", f"{fake.good}:GoodDevice", priority=5))
  fake.reg(DevicePlugin("THIRDX", f"{fake.good}:GoodDevice", priority=7))
  with Context(TINY_PLUGINS="NODEFX,FAILFIRSTX,BROKENX,SECONDX,THIRDX"):
    assert Device.installed() == ["NODEFX", "FAILFIRSTX", "BROKENX", "SECONDX", "THIRDX"]
    assert Device.DEFAULT == "SECONDX"
    assert list(Device.get_available_devices()) == ["SECONDX", "THIRDX"]
  with Context(TINY_PLUGINS="THIRDX,FAILFIRSTX"):
    assert Device.DEFAULT == "THIRDX"
  with Context(TINY_PLUGINS="NODEFX,FAILFIRSTX"):
    with pytest.raises(DeviceUnavailableError) as e: Device.DEFAULT
    assert "set DEV=" in str(e.value) and "NODEFX: never the default" in str(e.value)
    assert "FAILFIRSTX: RuntimeError: /dev/fake not found" in str(e.value)


def test_dev_picks_default_and_target(fake):
  fake.reg(DevicePlugin("GOODX", f"{fake.good}:GoodDevice", priority=99))
  fake.reg(DevicePlugin("GOODY", f"{fake.good}:GoodDevice", priority=1))
  with Context(DEV="goodx:1:llvm:arch9;GOODY"):
    assert Device.DEFAULT == "GOODX:1"
    t = Device.target()
    assert (t.device, t.indices, t.renderer, t.arch) == ("GOODX", (1,), "LLVM", "arch9")
    assert Device.target("GOODX:1").renderer == "LLVM"
    assert Device.target("GOODX").renderer is None    # DEV names index 1, not 0
    assert Device.target("GOODY").renderer is None
  with Context(DEV="MOCK+GOODX"):
    assert Device.DEFAULT == "MOCK+GOODX"
    assert Device[Device.DEFAULT].name == "MOCK+GOODX"


def test_default_setter_sets_dev_and_context_scopes(fake):
  fake.reg(DevicePlugin("GOODX", f"{fake.good}:GoodDevice"))
  fake.reg(DevicePlugin("GOODY", f"{fake.good}:GoodDevice"))
  Device.DEFAULT = "goodx"
  assert Device.DEFAULT == "GOODX"
  with Context(DEV="GOODY"):
    assert Device.DEFAULT == "GOODY"
  assert Device.DEFAULT == "GOODX"
  with pytest.raises(UnknownDeviceError, match="did you mean 'GOODX'"): Device.DEFAULT = "GOODXX"
  assert Device.DEFAULT == "GOODX"


def test_canonicalize():
  assert Device.canonicalize("cpu") == "CPU"
  assert Device.canonicalize("CPU:0") == "CPU"
  assert Device.canonicalize("CPU:LLVM") == "CPU"
  assert Device.canonicalize("mock+amd:1") == "MOCK+AMD:1"
  assert Device.canonicalize("disk:/tmp/A.bin") == "DISK:/tmp/A.bin"


def test_register_device_validation():
  with pytest.raises(TypeError, match="wants a DevicePlugin"): register_device("CPU")  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="upper-case identifier"): DevicePlugin("amd", "m:A")
  with pytest.raises(ValueError, match="'module:attr'"): DevicePlugin("AMD", "tiny_runtime_amd.AMDDevice")
  with pytest.raises(ValueError, match="api"): DevicePlugin("AMD", "m:A", api=(1,))  # type: ignore[arg-type]
  with pytest.raises(AttributeError): DevicePlugin("AMD", "m:A").priority = 3  # type: ignore[misc]


def test_unknown_renderer():
  with pytest.raises(LookupError, match="unknown renderer 'NOPE'; installed: "): plugins.load_renderer("NOPE")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)


def test_import_tiny_uop_imports_no_plugin():
  code = textwrap.dedent("""
    import sys, tiny_uop, tiny_uop.plugins
    assert not tiny_uop.plugins._registry._scanned, "entry points scanned at import"
    print(sorted(m for m in sys.modules if m.startswith(("tiny_runtime", "tiny_codegen", "tiny_tensor"))))
  """)
  r = _run(code)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "[]"


FAKE_DIST_MODULE = '''
from tiny_uop.plugins import DevicePlugin, PLUGIN_API
GOOD = DevicePlugin("GOODEP", "fake_ep_devices:GoodDevice", priority=1)
OLD = DevicePlugin("OLDEP", "fake_ep_devices:GoodDevice", api=(PLUGIN_API[0] + 1, 0), priority=2)
NOT_A_PLUGIN = "CPU"
class GoodDevice:
  def __init__(self, name): self.name = name
'''


def test_entry_point_discovery_with_a_fake_distribution(tmp_path):
  """A real .dist-info with entry points: broken ones are listed with reasons, the good one works."""
  (tmp_path / "fake_ep_devices.py").write_text(FAKE_DIST_MODULE)
  (tmp_path / "fake_ep_broken.py").write_text("import no_such_module_for_tiny_tests\n")
  info = tmp_path / "tiny_fake_plugins-1.2.3.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-fake-plugins\nVersion: 1.2.3\n")
  (info / "entry_points.txt").write_text(textwrap.dedent("""
    [tiny.devices]
    GOODEP = fake_ep_devices:GOOD
    OLDEP = fake_ep_devices:OLD
    WRONGEP = fake_ep_devices:NOT_A_PLUGIN
    BROKENEP = fake_ep_broken:plugin
    [tiny.renderers]
    FAKER = fake_ep_broken:Renderer
  """))
  env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
         "TINY_PLUGINS": "GOODEP,OLDEP,WRONGEP,BROKENEP", "DEV": ""}
  r = subprocess.run([sys.executable, "-m", "tiny_uop.plugins", "--json"], env={**os.environ, **env},
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  assert "Traceback" not in r.stderr
  table = {r["name"]: r for r in json.loads(r.stdout)}
  assert table["GOODEP"]["status"] == "ok" and table["GOODEP"]["package"] == "tiny-fake-plugins"
  assert table["GOODEP"]["version"] == "1.2.3"
  assert table["OLDEP"]["status"] == "unavailable" and "built for plugin API" in table["OLDEP"]["reason"]
  assert table["WRONGEP"]["status"] == "unavailable" and "is a str, not a" in table["WRONGEP"]["reason"]
  assert table["BROKENEP"]["status"] == "unavailable"
  assert "No module named 'no_such_module_for_tiny_tests'" in table["BROKENEP"]["reason"]
  assert table["FAKER"]["kind"] == "renderer" and table["FAKER"]["status"] == "unavailable"
  if "CPU" in table: assert table["CPU"]["status"] == "disabled"
  # in a program: the good device works and is the default; the old one warns once, on stderr
  code = textwrap.dedent("""
    from tiny_uop.plugins import Device
    print(Device.DEFAULT, Device["GOODEP"].name)
    for _ in range(2):
      try: Device["OLDEP"]
      except RuntimeError as e: print("OLDEP:", e)
  """)
  r = _run(code, **env)
  assert r.returncode == 0, r.stderr
  assert r.stdout.splitlines()[0] == "GOODEP GOODEP"
  assert r.stdout.count("OLDEP: device 'OLDEP' is unavailable: built for plugin API") == 2
  assert r.stderr.count("disabled") == 1, r.stderr
  # the table itself prints
  r = subprocess.run([sys.executable, "-m", "tiny_uop.plugins"], env={**os.environ, **env}, capture_output=True,
                     text=True)
  assert r.returncode == 0 and "GOODEP" in r.stdout and "default device: GOODEP" in r.stdout, r.stdout + r.stderr


def test_plugin_package_checks_fail_on_bad_packages():
  """tiny_uop.plugins.testing (used by every runtime package's tests) rejects what it should."""
  from tiny_uop.plugins.testing import check_descriptor, check_entry_point, check_import_is_cheap
  good = DevicePlugin("GOOD", "good_pkg.device:GoodDevice", priority=20)
  check_descriptor(good, "GOOD", "good_pkg", gpu=True)
  with pytest.raises(AssertionError, match="named 'GOOD', expected 'BAD'"): check_descriptor(good, "BAD", "good_pkg")
  slow = DevicePlugin("SLOW", "good_pkg.device:X", priority=95, default_ok=False)
  check_descriptor(slow, "SLOW", "good_pkg")  # the default: no GPU promises, fine for an accelerator-less device
  with pytest.raises(AssertionError, match="can never be the default"): check_descriptor(slow, "SLOW", "good_pkg", True)
  with pytest.raises(AssertionError, match="GPUs come before CPU"):
    check_descriptor(DevicePlugin("SLOW", "good_pkg.device:X", priority=95), "SLOW", "good_pkg", gpu=True)
  check_descriptor(DevicePlugin("OLD", "good_pkg.device:X", api=(PLUGIN_API[0], 0)), "OLD", "good_pkg")
  with pytest.raises(AssertionError, match="newer than this tiny-uop"):
    check_descriptor(DevicePlugin("NEW", "good_pkg.device:X", api=(PLUGIN_API[0], PLUGIN_API[1] + 1)), "NEW",
                     "good_pkg")
  with pytest.raises(AssertionError, match="is not registered"): check_entry_point("NOPE", "x:y", "z")
  with pytest.raises(AssertionError, match=r"import tiny_uop imported \["): check_import_is_cheap("tiny_uop")


def test_plugins_cli_help():
  r = subprocess.run([sys.executable, "-m", "tiny_uop.plugins", "--help"], capture_output=True, text=True)
  assert r.returncode == 0 and r.stdout.startswith("usage: python -m tiny_uop.plugins"), r.stdout + r.stderr
  assert "--json" in r.stdout and "--tools" in r.stdout
  r = subprocess.run([sys.executable, "-m", "tiny_uop.plugins", "--bogus"], capture_output=True, text=True)
  assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


def test_plugins_cli_lists_interfaces(fake):
  """A descriptor's interfaces become rows of their own (MOCK+NAME), opened like the device."""
  fake.reg(DevicePlugin("IFACEX", f"{fake.good}:GoodDevice", interfaces=("MOCK",)))
  from tiny_uop.plugins.__main__ import rows
  table = {r["name"]: r for r in rows() if r["kind"] == "device"}
  assert table["IFACEX"]["status"] == "ok" and table["MOCK+IFACEX"]["status"] == "ok"
  assert table["MOCK+IFACEX"]["reason"] == "(never chosen as the default device)"


def test_descriptor_rejects_bad_interfaces():
  with pytest.raises(ValueError, match="interfaces"): DevicePlugin("X", "m:c", interfaces=("mock",))
  with pytest.raises(ValueError, match="interfaces"): DevicePlugin("X", "m:c", interfaces="MOCK")  # type: ignore[arg-type]
