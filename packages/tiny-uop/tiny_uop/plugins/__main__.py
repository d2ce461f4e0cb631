"""``python -m tiny_uop.plugins``: list every device and renderer, its package and version, and whether it works.

Devices are opened (that is how we know whether the hardware is there); renderers are imported. Exit status is 0
even when some plugins are unavailable: this is a report, not a check. ``--json`` prints the rows as JSON.
"""
from __future__ import annotations

import json
import sys
import warnings

from tiny_uop.plugins import PLUGIN_API, Device, _allowed, _registry


def rows() -> list[dict[str, str]]:
  """One row per device and renderer: kind, name, package, version, status ("ok"/"unavailable"/"disabled"), reason."""
  out: list[dict[str, str]] = []
  allowed = _allowed()
  records = _registry.device_records()
  order = {n: i for i, n in enumerate(Device.installed())}
  for name, rec in sorted(records.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
    row = {"kind": "device", "name": name, "package": rec.package or "(code)", "version": rec.version or "-"}
    if allowed is not None and name not in allowed:
      reason: str | None = "disabled by TINY_PLUGINS"
    elif (p := rec.get()) is None:
      reason = rec.reason
    else:
      reason = Device.status(name)
      if reason is not None: reason = reason.split(" is unavailable: ", 1)[-1]
      elif not p.default_ok: reason = "(never chosen as the default device)"
    status = "ok" if reason is None or reason.startswith("(") else "unavailable"
    if reason == "disabled by TINY_PLUGINS": status = "disabled"
    out.append({**row, "status": status, "reason": reason or ""})
  for name, rec in _registry.renderers.items():
    rec.get()
    out.append({"kind": "renderer", "name": name, "package": rec.package or "(code)", "version": rec.version or "-",
                "status": "ok" if rec.reason is None else "unavailable", "reason": rec.reason or ""})
  return out


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  with warnings.catch_warnings(record=True):  # the table shows every reason; don't print them twice
    warnings.simplefilter("always")
    table = rows()
  if "--json" in argv:
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
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
