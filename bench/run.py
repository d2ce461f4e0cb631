"""Run every benchmark in bench/ and print one side-by-side table (`nox -s bench`).

Each `bench/bench_*.py` exposes `run() -> dict[str, dict[str, float]]`: for each measured case, a dict of
{implementation: value} plus "unit" and optional "target" (a string) and "better" ("lower" or "higher").
Implementations that are not installed are simply absent. Ratios are against `tiny`.
"""
from __future__ import annotations

import importlib
import os
import pathlib
import sys
import traceback

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU: with an OpenCL ICD installed (PoCL)
                                    # tinygrad would otherwise pick CL

HERE = pathlib.Path(__file__).resolve().parent


def fmt(v: float) -> str:
  if v >= 1000: return f"{v:,.0f}"
  if v >= 10: return f"{v:.1f}"
  return f"{v:.3g}"


def main(argv: list[str]) -> int:
  sys.path.insert(0, str(HERE))
  names = argv or sorted(p.stem for p in HERE.glob("bench_*.py"))
  failed = []
  for name in names:
    print(f"\n=== {name} ===", flush=True)
    try:
      results = importlib.import_module(name).run()
    except Exception:  # one broken benchmark must not hide the others
      traceback.print_exc()
      failed.append(name)
      continue
    for case, row in results.items():
      unit, target, better = row.get("unit", ""), row.get("target", ""), row.get("better", "lower")
      impls = {k: v for k, v in row.items() if k not in ("unit", "target", "better") and isinstance(v, (int, float))}
      tiny = impls.get("tiny")
      cells = []
      for impl, v in impls.items():
        ratio = ""
        if tiny and impl != "tiny" and v:
          r = (v / tiny) if better == "lower" else (tiny / v)
          ratio = f" (tiny {r:.2f}x {'faster' if r >= 1 else 'slower'})" if better in ("lower", "higher") else ""
        cells.append(f"{impl}={fmt(v)}{unit}{ratio}")
      print(f"  {case:40s} " + "  ".join(cells) + (f"   [target: {target}]" if target else ""), flush=True)
  if failed: print(f"\nbenchmarks that failed: {', '.join(failed)}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
