"""The plugin registry: devices and renderers discovered from entry points, lazily and in isolation.

Packages register into two entry-point groups in their ``pyproject.toml``::

    [project.entry-points."tiny.devices"]
    AMD = "tiny_runtime_amd:plugin"        # a cheap DevicePlugin descriptor
    [project.entry-points."tiny.renderers"]
    LLVM = "tiny_codegen.renderer.llvmir:LLVMRenderer"

Rules:

- Importing ``tiny_uop`` scans nothing and imports no plugin. The first ``Device[...]`` or ``Device.DEFAULT`` scans
  the entry points once; only the descriptors needed are imported, and only the device asked for is opened.
- A plugin that fails (its import raises -- any exception, `SystemExit` included, only `KeyboardInterrupt` passes --,
  its entry point is not a `DevicePlugin`, it was built for a `PLUGIN_API` this tiny-uop can't serve: another major, or
  a newer minor, see `api_mismatch`; or opening its device raises) is recorded with a reason and never breaks other
  devices.
  ``python -m tiny_uop.plugins`` prints every device and renderer with its package, version, status and reason.
- ``TINY_PLUGINS=CPU,AMD`` is an allow-list of device plugins; ``DEV=`` picks the default device (see
  `tiny_uop.target`).

>>> from tiny_uop.plugins import Device
>>> Device.DEFAULT                      # doctest: +SKIP
'CPU'
>>> Device["CPU"]                       # doctest: +SKIP
<tiny_runtime_cpu.cpu.CPUDevice object at ...>
"""
from __future__ import annotations

import importlib
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tiny_uop.helpers import DEV, TINY_PLUGINS
from tiny_uop.target import Target

if TYPE_CHECKING: import importlib.metadata

__all__ = ["PLUGIN_API", "api_mismatch", "DEVICE_GROUP", "RENDERER_GROUP", "DevicePlugin", "PluginRecord",
           "UnknownDeviceError", "DeviceUnavailableError", "Device", "register_device", "unregister_device",
           "renderers", "load_renderer"]

PLUGIN_API: tuple[int, int] = (0, 2)  # 0.2 added DevicePlugin.interfaces
"""(major, minor) of the plugin contract (docs/PLUGINS.md). A plugin declares the version it was built for
(`DevicePlugin.api`); `api_mismatch` says which ones load: the same major, and a minor no newer than this one."""


def api_mismatch(api: tuple[int, int], package: str | None = None) -> str | None:
  """Why a plugin built for plugin API `api` can't load into this tiny-uop, or None when it can.

  Same major and ``api.minor <= PLUGIN_API.minor``: loads (a minor release only adds to the contract). Another major
  (older or newer): refused, the contract changed incompatibly. Same major, newer minor: refused, the plugin may call
  what this tiny-uop doesn't have yet.
  """
  who, ours, theirs = package or "the plugin", f"{PLUGIN_API[0]}.{PLUGIN_API[1]}", f"{api[0]}.{api[1]}"
  if api[0] != PLUGIN_API[0]:
    newer = api[0] > PLUGIN_API[0]
    fix = (f"upgrade tiny-uop to a release with plugin API {api[0]}.x" if newer else
           f"install a {who} release built for plugin API {PLUGIN_API[0]}.x")
    return f"built for plugin API {theirs}, this tiny-uop provides {ours} (another major version); {fix}"
  if api[1] > PLUGIN_API[1]:
    return (f"built for plugin API {theirs}, newer than this tiny-uop's {ours}; upgrade tiny-uop to a release with "
            f"plugin API >= {theirs}, or install a {who} release built for {ours} or older")
  return None

DEVICE_GROUP = "tiny.devices"
RENDERER_GROUP = "tiny.renderers"

# devices this monorepo ships, and the package that provides each: used to say what to install
KNOWN_DEVICES: dict[str, str] = {
  "CPU": "tiny-runtime-cpu", "PYTHON": "tiny-runtime-cpu", "NULL": "tiny-runtime-cpu", "DISK": "tiny-runtime-cpu",
  "AMD": "tiny-runtime-amd", "NV": "tiny-runtime-nv", "CUDA": "tiny-runtime-nv", "QCOM": "tiny-runtime-qcom",
  "CL": "tiny-runtime-qcom",
}


class UnknownDeviceError(LookupError):
  """A device name that no installed (or allowed) plugin provides."""


class DeviceUnavailableError(RuntimeError):
  """A device whose plugin is installed but failed to load or to open.

  A device class raises it itself when it knows the whole story (the hardware is absent, and what to use instead):
  the registry then reports the message alone, without the driver's traceback."""


def _import_target(target: str) -> Any:
  """Import ``"package.module:attr.sub"`` and return the attribute."""
  mod_name, sep, attr = target.partition(":")
  if not sep or not mod_name or not attr:
    raise ValueError(f"plugin target {target!r} is not of the form 'module:attr'")
  obj: Any = importlib.import_module(mod_name)
  for part in attr.split("."): obj = getattr(obj, part)
  return obj


@dataclass(frozen=True)
class DevicePlugin:
  """A cheap descriptor of a device backend: what an entry point in ``tiny.devices`` must point to.

  Building one imports nothing; `load` imports the device class. Lower `priority` is tried first when choosing the
  default device; `default_ok=False` devices (PYTHON, NULL, DISK) are never chosen as the default.

  >>> CPU_PLUGIN = DevicePlugin("CPU", "tiny_runtime_cpu.cpu:CPUDevice", priority=90)
  """
  name: str                           # device name, upper-case, as in DEV strings ("AMD")
  target: str                         # "module:attr" of the device class, imported by load()
  api: tuple[int, int] = PLUGIN_API   # the PLUGIN_API this plugin was built for
  priority: int = 50                  # default-device order: lower first (GPUs 10-40, CPU 90)
  default_ok: bool = True             # may be chosen as Device.DEFAULT when DEV is not set
  interfaces: tuple[str, ...] = ()    # other kernel interfaces it opens with, e.g. ("MOCK",): DEV=MOCK+AMD (API 0.2)

  def __post_init__(self) -> None:
    if not isinstance(self.name, str) or not self.name.isidentifier() or self.name != self.name.upper():
      raise ValueError(f"DevicePlugin name {self.name!r} must be an upper-case identifier, e.g. 'AMD'")
    if not isinstance(self.target, str) or self.target.count(":") != 1:
      raise ValueError(f"DevicePlugin target {self.target!r} must be 'module:attr'")
    if not (isinstance(self.api, tuple) and len(self.api) == 2 and all(isinstance(x, int) for x in self.api)):
      raise ValueError(f"DevicePlugin api {self.api!r} must be a (major, minor) tuple of ints")
    if not (isinstance(self.interfaces, tuple) and all(isinstance(x, str) and x.isidentifier() and x == x.upper()
                                                       for x in self.interfaces)):
      raise ValueError(f"DevicePlugin interfaces {self.interfaces!r} must be a tuple of upper-case names: ('MOCK',)")

  def load(self) -> Callable[[str], Any]:
    """Import and return the device class; it is called as ``cls("AMD:1")`` to open a device."""
    cls = _import_target(self.target)
    if not callable(cls): raise TypeError(f"{self.target} is a {type(cls).__name__}, not a device class")
    return cls


@dataclass
class PluginRecord:
  """What the registry knows about one entry point: where it comes from and, once tried, why it failed."""
  kind: str                                 # "device" or "renderer"
  name: str                                 # entry-point name ("CPU", "LLVM")
  value: str                                # entry-point value ("tiny_runtime_cpu:CPU_PLUGIN")
  package: str | None                       # distribution name, None if registered by code
  version: str | None
  loader: Callable[[], Any] = field(repr=False)
  loaded: bool = False
  obj: Any = None                           # the DevicePlugin (devices) or the renderer class (renderers)
  reason: str | None = None                 # why it is unavailable; None: fine so far

  def get(self) -> Any:
    """Load once; on failure keep the reason and return None. Never raises."""
    if not self.loaded:
      self.loaded = True
      try: self.obj = self.loader()
      except KeyboardInterrupt: raise
      except BaseException as e:  # noqa: BLE001 -- SystemExit/GeneratorExit in a plugin's import must not end us
        self.reason = f"import of {self.value} failed: {type(e).__name__}: {e}"
        return None
      if self.kind == "device": self._check_device()
    return self.obj if self.reason is None else None

  def _check_device(self) -> None:
    p = self.obj
    if not isinstance(p, DevicePlugin):
      self.reason = f"entry point {self.value} is a {type(p).__name__}, not a tiny_uop.plugins.DevicePlugin"
    elif p.name != self.name:
      self.reason = f"entry point {self.name!r} points to a DevicePlugin named {p.name!r}"
    elif (why := api_mismatch(p.api, self.package)) is not None:
      self.reason = why
      warnings.warn(f"tiny: device plugin {self.name} ({self.package or self.value}) disabled: {self.reason}",
                    RuntimeWarning, stacklevel=4)


class _Registry:
  """Entry points of both groups, scanned once on first use. Code may add records with register_device."""

  def __init__(self) -> None:
    self._lock = threading.RLock()
    self._scanned = False
    self.devices: dict[str, PluginRecord] = {}
    self.renderers: dict[str, PluginRecord] = {}
    self.overrides: dict[str, PluginRecord] = {}   # registered by code; win over entry points of the same name
    self._merged: dict[str, PluginRecord] | None = None

  def scan(self) -> None:
    import importlib.metadata  # here, not at import: importing tiny_uop stays cheap
    with self._lock:
      if self._scanned: return
      for group, kind, table in ((DEVICE_GROUP, "device", self.devices), (RENDERER_GROUP, "renderer", self.renderers)):
        for ep in importlib.metadata.entry_points(group=group):
          if ep.name in table:
            prev = table[ep.name]
            if prev.value != ep.value:
              warnings.warn(f"tiny: {kind} {ep.name!r} is registered by both {prev.package} ({prev.value}) and "
                            f"{_dist(ep)[0]} ({ep.value}); using {prev.package}'s", RuntimeWarning, stacklevel=3)
            continue
          table[ep.name] = PluginRecord(kind, ep.name, ep.value, *_dist(ep), loader=ep.load)
      self._scanned = True

  def device_records(self) -> dict[str, PluginRecord]:
    """All device records, code-registered ones overriding entry points. Not filtered by TINY_PLUGINS."""
    if self._merged is None:
      self.scan()
      self._merged = {**self.devices, **self.overrides}
    return self._merged

  def set_override(self, name: str, rec: PluginRecord | None) -> None:
    self.scan()
    if rec is None: self.overrides.pop(name, None)
    else: self.overrides[name] = rec
    self._merged = None


def _dist(ep: importlib.metadata.EntryPoint) -> tuple[str | None, str | None]:
  dist = getattr(ep, "dist", None)
  return (dist.name, dist.version) if dist is not None else (None, None)


def _allowed() -> set[str] | None:
  """The TINY_PLUGINS allow-list (upper-case names), or None when every plugin is allowed."""
  val = str(TINY_PLUGINS.value or "").strip()
  return {x.strip().upper() for x in val.split(",") if x.strip()} if val else None


_registry = _Registry()


class _Device:
  """The device registry: ``Device["CPU"]`` opens (once) and returns a device; ``Device.DEFAULT`` names the default.

  Device names are canonical ``[IFACE+]DEVICE[:INDEX]`` or ``DISK:PATH`` strings (see `canonicalize`); a renderer
  or arch in a name (``"CPU:LLVM"``) selects how kernels are built, not which device, and is available from
  `target`.
  """

  def __init__(self) -> None:
    self._opened: dict[str, Any] = {}
    self._failed: dict[str, str] = {}
    self._auto_default: dict[frozenset[str] | None, str] = {}
    self._dev_default: dict[tuple[str, str], str] = {}
    self._lock = threading.RLock()

  # ***** names *****
  @staticmethod
  def canonicalize(name: str) -> str:
    """The canonical device name: ``"cpu"`` -> ``"CPU"``, ``"CPU:0"`` -> ``"CPU"``, ``"CPU:LLVM"`` -> ``"CPU"``,
    ``"mock+amd:1"`` -> ``"MOCK+AMD:1"``, ``"disk:/x"`` -> ``"DISK:/x"``.

    Only the grammar is checked (a ValueError for a malformed name), not whether the device is installed.
    """
    return Target.parse(name).name

  def installed(self) -> list[str]:
    """Names of the device plugins installed and allowed by TINY_PLUGINS, in default-priority order where known."""
    allowed = _allowed()
    names = [n for n in _registry.device_records() if allowed is None or n in allowed]
    return sorted(names, key=lambda n: (self._priority(n), names.index(n)))

  def _priority(self, name: str) -> int:
    p = _registry.device_records()[name].get()
    return p.priority if p is not None else 1000

  def _record(self, target: Target, asked: str, source: str = "") -> PluginRecord:
    """The record of the plugin for target.device, or an error that names what is installed and what is close."""
    rec, allowed = _registry.device_records().get(target.device), _allowed()
    if rec is not None and (allowed is None or target.device in allowed): return rec
    installed = self.installed()
    if rec is not None:
      raise UnknownDeviceError(f"device {target.device!r}{source} is disabled by TINY_PLUGINS={TINY_PLUGINS.value!r};"
                               f" allowed: {', '.join(installed) or 'none'}")
    inst = ", ".join(installed) or "none"
    if target.device in KNOWN_DEVICES:
      raise UnknownDeviceError(f"device {target.device!r}{source} is not installed; pip install "
                               f"{KNOWN_DEVICES[target.device]}; installed: {inst}")
    msg = f"unknown device {asked!r}{source}; installed: {inst}"
    import difflib
    close = difflib.get_close_matches(target.device, list(dict.fromkeys(installed + list(KNOWN_DEVICES))), n=1)
    if close:
      hint = "" if close[0] in installed else f" (not installed: pip install {KNOWN_DEVICES[close[0]]})"
      msg += f"; did you mean {close[0]!r}{hint}?"
    raise UnknownDeviceError(msg)

  def plugin(self, name: str) -> DevicePlugin:
    """The `DevicePlugin` for a device name; raises UnknownDeviceError or DeviceUnavailableError."""
    target = Target.parse(name)
    rec = self._record(target, name)
    if (p := rec.get()) is None: raise DeviceUnavailableError(f"device {target.device!r} is unavailable: {rec.reason}")
    return p

  # ***** opening *****
  def __getitem__(self, name: str) -> Any:
    """Open (once per canonical name) and return the device. ``Device["CPU"] is Device["cpu:0"]``."""
    canon = self.canonicalize(name)
    if (dev := self._opened.get(canon)) is not None: return dev
    with self._lock:
      if (dev := self._opened.get(canon)) is not None: return dev
      if canon in self._failed: raise DeviceUnavailableError(f"device {canon!r} is unavailable: {self._failed[canon]}")
      plugin = self.plugin(canon)
      try:
        dev = plugin.load()(canon)
      except DeviceUnavailableError as e:  # the driver's own complete answer ("no /dev/kfd; ..."): no traceback chain
        self._failed[canon] = str(e)
        raise DeviceUnavailableError(f"device {canon!r} is unavailable: {e}") from None
      except KeyboardInterrupt: raise
      except BaseException as e:  # noqa: BLE001 -- a plugin's sys.exit() while opening is its failure, not ours
        self._failed[canon] = f"{type(e).__name__}: {e}"
        raise DeviceUnavailableError(f"device {canon!r} is unavailable: {self._failed[canon]}") from e
      self._opened[canon] = dev
      return dev

  def status(self, name: str) -> str | None:
    """None if the device opens, else the reason it does not. Never raises for a well-formed name."""
    try: self[name]
    except (UnknownDeviceError, DeviceUnavailableError) as e: return str(e)
    return None

  def _why(self, name: str) -> str:
    """Short reason why an installed device is not a default candidate (after get_available_devices tried it)."""
    rec = _registry.device_records()[name]
    if (p := rec.get()) is None: return str(rec.reason)
    if not p.default_ok: return "never the default"
    return self._failed.get(name, "not tried")

  def get_available_devices(self) -> Iterator[str]:
    """Names of the devices that may be the default (``default_ok``) and open, in priority order."""
    for name in self.installed():
      p = _registry.device_records()[name].get()
      if p is not None and p.default_ok and self.status(name) is None: yield name

  # ***** the default device *****
  @property
  def DEFAULT(self) -> str:
    """``DEV``'s first device (canonical name) if set, else the first ``default_ok`` device that opens, by priority.

    Assigning ``Device.DEFAULT = "CPU"`` sets ``DEV``; ``with Context(DEV="PYTHON"):`` scopes it.
    """
    if dev := str(DEV.value or "").strip():
      # hot path (every new Tensor asks): validate each (DEV, TINY_PLUGINS) pair once
      if (name := self._dev_default.get(key := (dev, str(TINY_PLUGINS.value)))) is not None: return name
      target = Target.parse_list(dev)[0]
      self._record(target, dev.split(";")[0].strip(), source=f" (from DEV={dev!r})")
      self._dev_default[key] = target.name
      return target.name
    allow = frozenset(a) if (a := _allowed()) is not None else None
    if allow in self._auto_default: return self._auto_default[allow]
    with self._lock:
      for name in self.get_available_devices():
        self._auto_default[allow] = name
        return name
      reasons = "; ".join(f"{n}: {self._why(n)}" for n in self.installed())
      raise DeviceUnavailableError(f"no device can be the default; set DEV= to choose one. Devices: {reasons or 'none'}"
                                   f" (see python -m tiny_uop.plugins)")

  @DEFAULT.setter
  def DEFAULT(self, name: str) -> None:
    target = Target.parse_list(name)[0]
    self._record(target, name)
    DEV.value = str(name)

  def target(self, name: str | None = None) -> Target:
    """The full `Target` for a device: DEV's entry for it (renderer, arch) if DEV names it, else parsed from name."""
    dev_targets = Target.parse_list(dev) if (dev := str(DEV.value or "").strip()) else ()
    if name is None: return dev_targets[0] if dev_targets else Target.parse(self.DEFAULT)
    t = Target.parse(name)
    if t.renderer is None:
      for dt in dev_targets:
        if t.name in dt.names: return dt
    return t

  # ***** for tests and tools *****
  def _forget(self, device: str | None = None) -> None:
    """Drop opened devices, failures and the cached default (all, or those of one device name)."""
    with self._lock:
      for d in (self._opened, self._failed):
        for k in [k for k in d if device is None or Target.parse(k).device == device]: del d[k]
      self._auto_default.clear()
      self._dev_default.clear()

  def __repr__(self) -> str: return f"<Device registry: {', '.join(self.installed()) or 'no devices'}>"


Device = _Device()
"""The singleton device registry."""


def register_device(plugin: DevicePlugin | Callable[[], Any], name: str | None = None, package: str | None = None,
                    version: str | None = None) -> None:
  """Register a device plugin from code (tests, notebooks); it overrides an entry point of the same name.

  ``plugin`` is a `DevicePlugin`, or a zero-argument callable standing in for an entry point's load() (so tests can
  exercise the same failure paths as installed packages: a loader that raises, or returns the wrong type).
  """
  if isinstance(plugin, DevicePlugin): name, loader, value = plugin.name, (lambda: plugin), plugin.target
  elif callable(plugin) and name is not None: loader, value = plugin, f"<{getattr(plugin, '__name__', 'loader')}>"
  else: raise TypeError(f"register_device wants a DevicePlugin, or a loader callable and name=; got {plugin!r}")
  _registry.set_override(name, PluginRecord("device", name, value, package, version, loader=loader))
  Device._forget(name)


def unregister_device(name: str) -> None:
  """Remove a device registered with `register_device` (entry-point plugins of that name come back)."""
  _registry.set_override(name, None)
  Device._forget(name)


def renderers() -> dict[str, PluginRecord]:
  """Records of the renderers in the ``tiny.renderers`` group (not loaded)."""
  _registry.scan()
  return dict(_registry.renderers)


def load_renderer(name: str) -> Any:
  """Import and return the renderer class registered as ``name`` ("LLVM", "C", ...)."""
  recs = renderers()
  if (rec := recs.get(name.upper())) is None:
    import difflib
    close = difflib.get_close_matches(name.upper(), list(recs), n=1)
    raise UnknownDeviceError(f"unknown renderer {name!r}; installed: {', '.join(recs) or 'none'}"
                             + (f"; did you mean {close[0]!r}?" if close else ""))
  if (cls := rec.get()) is None: raise DeviceUnavailableError(f"renderer {name!r} is unavailable: {rec.reason}")
  return cls
