"""``python -m tiny_uop.plugins``: list every device (with its MOCK+ variants) and renderer, its package and version,
and whether it works; ``--help`` for the options.

Devices are opened (that is how we know whether the hardware is there); renderers are imported. Exit status is 0
even when some plugins are unavailable: this is a report, not a check. ``--json`` prints the rows as JSON,
``--tools`` adds where each external tool (C compiler, ld.lld, ptxas) was found.
"""
from __future__ import annotations

import argparse
import json
import warnings

from tiny_uop.plugins import PLUGIN_API, Device, PluginRecord, _allowed, _registry


def _device_row(name: str, rec: PluginRecord, allowed: set[str] | None, base: str) -> dict[str, str]:
  row = {"kind": "device", "name": name, "package": rec.package or "(code)", "version": rec.version or "-"}
  if allowed is not None and base not in allowed:
    reason: str | None = "disabled by TINY_PLUGINS"
  elif (p := rec.get()) is None:
    reason = rec.reason
  else:
    reason = Device.status(name)
    if reason is not None: reason = reason.split(" is unavailable: ", 1)[-1]
    elif not p.default_ok or name != base: reason = "(never chosen as the default device)"
  status = "ok" if reason is None or reason.startswith("(") else "unavailable"
  if reason == "disabled by TINY_PLUGINS": status = "disabled"
  return {**row, "status": status, "reason": reason or ""}


def rows() -> list[dict[str, str]]:
  """One row per device, per MOCK+ (or other) interface a device declares, and per renderer: kind, name, package,
  version, status ("ok"/"unavailable"/"disabled"), reason."""
  out: list[dict[str, str]] = []
  allowed = _allowed()
  records = _registry.device_records()
  order = {n: i for i, n in enumerate(Device.installed())}
  for name, rec in sorted(records.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
    out.append(_device_row(name, rec, allowed, name))
    p = rec.get() if allowed is None or name in allowed else None
    for iface in (p.interfaces if p is not None else ()):
      out.append(_device_row(f"{iface}+{name}", rec, allowed, name))
  for name, rec in _registry.renderers.items():
    rec.get()
    out.append({"kind": "renderer", "name": name, "package": rec.package or "(code)", "version": rec.version or "-",
                "status": "ok" if rec.reason is None else "unavailable", "reason": rec.reason or ""})
  return out


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m tiny_uop.plugins",
                               description="List tiny's device and renderer plugins (MOCK+ variants included), their "
                                           "packages and versions, and whether each works here.",
                               epilog="TINY_PLUGINS=CPU,AMD limits the device plugins used; DEV= picks the default.")
  ap.add_argument("--json", action="store_true", help="print the rows as JSON")
  ap.add_argument("--tools", action="store_true", help="also say where the external tools were found (C compiler, "
                                                       "ld.lld, ptxas) or how to get them")
  args = ap.parse_args(argv)
  with warnings.catch_warnings(record=True):  # the table shows every reason; don't print them twice
    warnings.simplefilter("always")
    table = rows()
  if args.json:
    print(json.dumps(table, indent=1))
    return 0
  cols = ["kind", "name", "package", "version", "status", "reason"]
  width = {c: max([len(c)] + [len(r[c]) for r in table]) for c in cols[:-1]}
  print(f"tiny plugin API {PLUGIN_API[0]}.{PLUGIN_API[1]}")
  print("  ".join(c.upper().ljust(width.get(c, 0)) for c in cols).rstrip())
  for r in table: print("  ".join(r[c].ljust(width.get(c, 0)) for c in cols).rstrip())
  if not table: print("(no plugins installed: pip install tiny-runtime-cpu)")
  try: default = Device.DEFAULT
  except Exception as e: default = f"none ({e})"
  print(f"default device: {default}")
  if args.tools:
    from tiny_uop.tools import TOOLS, tool_status
    for name in TOOLS: print(f"tool {tool_status(name)}")
  return 0


if __name__ == "__main__":
  from tiny_uop.plugins.cli import run_main
  raise SystemExit(run_main(main, "python -m tiny_uop.plugins"))
