"""Targets: what a `DEV` string names.

Grammar (several targets may be joined with ``;``)::

    DEV = [IFACE+]DEVICE[:INDEX[,INDEX...]][:RENDERER[:ARCH]]
        | DISK:PATH

    CPU                 device CPU, its default renderer
    CPU:LLVM            device CPU, LLVM renderer
    CPU:1               device CPU, index 1 (a number is an index, never a renderer)
    NULL:PTX:sm_90      compile-only device, PTX renderer, arch sm_90
    AMD:LLVM:gfx1100    AMD, LLVM renderer, arch gfx1100
    MOCK+AMD            AMD driver talking to the MOCK kernel interface
    DISK:/tmp/x.bin     DISK device backed by a file (everything after ``DISK:`` is the path)

Device, interface and renderer names are case-insensitive and stored upper-case; an arch and a path are kept as
written. Parsing is pure string work: it checks the grammar, not whether a device is installed (that is
`tiny_uop.plugins.Device`'s job).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["Target", "GRAMMAR"]

GRAMMAR = "[IFACE+]DEVICE[:INDEX][:RENDERER[:ARCH]] or DISK:PATH, several joined with ';'"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ARCH = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_INDICES = re.compile(r"[0-9]+(,[0-9]+)*\Z")
_EXAMPLES = "CPU, CPU:LLVM, CPU:1, NULL:PTX:sm_90, AMD:LLVM:gfx1100, MOCK+AMD, DISK:/tmp/x.bin"


def _bad(s: str, why: str) -> ValueError:
  return ValueError(f"bad DEV string {s!r}: {why}; expected {GRAMMAR} (e.g. {_EXAMPLES})")


@dataclass(frozen=True)
class Target:
  """One parsed ``DEV`` entry.

  >>> Target.parse("AMD:LLVM:gfx1100")
  Target(device='AMD', renderer='LLVM', arch='gfx1100', interface=None, indices=(), path=None)
  >>> Target.parse("CPU:1").name
  'CPU:1'
  """
  device: str                     # device name, upper-case: "CPU", "AMD", "DISK"
  renderer: str | None = None     # renderer name, upper-case ("LLVM", "PTX"); None: the device's default
  arch: str | None = None         # target architecture as written ("gfx1100", "sm_90"); None: the device's own
  interface: str | None = None    # kernel interface the driver talks to ("MOCK"); None: the real one
  indices: tuple[int, ...] = ()   # device indices; () means the default device (index 0)
  path: str | None = None         # DISK only: the backing file

  @staticmethod
  def parse(s: str) -> Target:
    """Parse one target, e.g. ``"CPU:LLVM"``. Raises ValueError naming the bad string and the grammar."""
    if not isinstance(s, str): raise TypeError(f"DEV must be a str, got {type(s).__name__} {s!r}")
    return _parse(s)

  @staticmethod
  def parse_list(s: str) -> tuple[Target, ...]:
    """Parse a ``;``-separated list of targets, e.g. ``"AMD;CPU:LLVM"``. Empty entries are an error."""
    if not isinstance(s, str): raise TypeError(f"DEV must be a str, got {type(s).__name__} {s!r}")
    return _parse_list(s)

  @property
  def base(self) -> str:
    """Interface and device, no index: ``"MOCK+AMD"``, ``"CPU"``, ``"DISK"``."""
    return f"{self.interface}+{self.device}" if self.interface else self.device

  @property
  def names(self) -> tuple[str, ...]:
    """Canonical device names, one per index: ``"CPU"`` for index 0, ``"CPU:1"``, ``"DISK:/path"``."""
    if self.path is not None: return (f"DISK:{self.path}",)
    return tuple(self.base if i == 0 else f"{self.base}:{i}" for i in (self.indices or (0,)))

  @property
  def name(self) -> str:
    """The canonical device name (renderer and arch are not part of it). Raises if the target names several."""
    if len(names := self.names) != 1:
      raise ValueError(f"target {self} names {len(names)} devices ({', '.join(names)}); use .names")
    return names[0]

  def check_interface(self, valid: tuple[str | None, ...] = (None, "MOCK")) -> Target:
    """This target, if its interface is one of `valid` (None: the real kernel interface); else a RuntimeError that
    names the device string and the valid ones (for a device plugin's constructor)."""
    if self.interface not in valid:
      names = ", ".join("none (the real driver)" if v is None else v for v in valid)
      raise RuntimeError(f"{self}: unknown interface {self.interface!r} for {self.device}; valid: {names}")
    return self

  def __str__(self) -> str:
    if self.path is not None: return f"DISK:{self.path}"
    out = self.base
    if self.indices: out += ":" + ",".join(map(str, self.indices))
    if self.renderer: out += f":{self.renderer}"
    if self.arch: out += f":{self.arch}"
    return out


# Target.parse is on hot paths (every Device[...] and renderer lookup); Targets are immutable, so results are cached
@functools.lru_cache(maxsize=4096)
def _parse(s: str) -> Target:
  if ";" in s: raise _bad(s, "several targets given; use Target.parse_list for ';'-separated lists")
  text = s.strip()
  if not text: raise _bad(s, "empty")
  head, sep, rest = text.partition(":")
  interface: str | None = None
  if "+" in head:
    interface, _, head = head.partition("+")
    if not _NAME.match(interface): raise _bad(s, f"interface {interface!r} is not a name")
  if not _NAME.match(head): raise _bad(s, f"device {head!r} is not a name")
  device = head.upper()
  if device == "DISK":
    if interface is not None: raise _bad(s, "DISK takes no interface")
    if sep and not rest: raise _bad(s, "DISK: needs a path after the colon")
    return Target(device, path=rest or None)
  fields = rest.split(":") if sep else []
  indices: tuple[int, ...] = ()
  if fields and _INDICES.match(fields[0]):
    indices = tuple(int(i) for i in fields.pop(0).split(","))
  if len(fields) > 2: raise _bad(s, f"too many ':' fields ({len(fields)} after the device and index)")
  renderer = fields[0] if fields else None
  arch = fields[1] if len(fields) > 1 else None
  if renderer is not None and not _NAME.match(renderer): raise _bad(s, f"renderer {renderer!r} is not a name")
  if arch is not None and not _ARCH.match(arch): raise _bad(s, f"arch {arch!r} is not a valid arch name")
  return Target(device, renderer.upper() if renderer else None, arch, interface.upper() if interface else None,
                indices)


@functools.lru_cache(maxsize=256)
def _parse_list(s: str) -> tuple[Target, ...]:
  parts = s.split(";")
  if any(not p.strip() for p in parts): raise _bad(s, "empty entry in ';'-separated list")
  return tuple(_parse(p) for p in parts)
