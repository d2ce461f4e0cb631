"""`python -m tiny_tensor.viz [--port N] [--host H] [--summary] TRACE`: serve a VIZ trace's page, or summarize it."""
from __future__ import annotations

import argparse
import sys

from tiny_tensor.viz.reader import TraceError, load
from tiny_tensor.viz.server import serve_forever


def summary(path: str) -> str:
  """The schedules, kernels (with their steps and launches) and devices of a trace, as text."""
  t = load(path)
  launches: dict[str, int] = {}
  for ln in t.launches: launches[ln.name] = launches.get(ln.name, 0) + 1
  lines = [f"{path}: {len(t.schedules)} schedules, {len(t.kernels)} kernels, {len(t.nodes)} nodes, "
           f"{sum(len(c.steps) for c in t.contexts.values())} steps, {len(t.launches)} launches"]
  for s in t.schedules: lines.append(f"  {s.name}")
  for k in t.kernels:
    lines.append(f"  kernel {k.name} on {k.info.get('device', '?')}: {len(k.steps)} steps, {launches.get(k.name, 0)} "
                 f"launches")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m tiny_tensor.viz",
                               description="Serve a VIZ trace (VIZ=1 writes one) as a web page: schedules, kernels, "
                               "every rewrite step as a graph, sources, launches.")
  ap.add_argument("trace", help="the trace file (.jsonl) VIZ=1 wrote")
  ap.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000; 0: any free port)")
  ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
  ap.add_argument("--summary", action="store_true", help="print what the trace holds and exit")
  args = ap.parse_args(argv)
  if not 0 <= args.port <= 65535: ap.error(f"--port {args.port}: a port is 0..65535")
  try:
    text = summary(args.trace)  # checks the whole file before serving it
  except (OSError, TraceError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.summary:
    print(text)
    return 0
  print(text.splitlines()[0], file=sys.stderr)
  try: serve_forever(args.trace, args.port, args.host, any_port=False)
  except OSError as e:
    print(f"error: {e.strerror or e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  from tiny_uop.plugins.cli import run_main
  sys.exit(run_main(main, "python -m tiny_tensor.viz"))
