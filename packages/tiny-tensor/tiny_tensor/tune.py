"""Warm this machine's BEAM cache for the benchmark kernels: `python -m tiny_tensor.tune`.

BEAM (`BEAM=n`) times candidate opt sequences of each kernel on the device and keeps the fastest, never one slower
than the hand-coded heuristics' (which derive their blocking from the machine model, `tiny_codegen.machine`). Its
winners are cached on disk (`TINY_CACHE_DIR`, default ~/.cache/tiny, table "beam") under a key made of the kernel's
structure, the renderer and its settings, the compiler's identity (CPU name and features) and the machine model, so
the cache is per machine. This command runs the searches once for the kernels the benchmarks time (fp32 matmuls of
the given sizes, with the panel copy the heuristics put before a big one, and a few conv shapes); afterwards a run
with the same `BEAM=n` finds their winners in the cache instead of searching.

    python -m tiny_tensor.tune                      # BEAM=2 over matmul 1024 and 4096 and the conv shapes
    python -m tiny_tensor.tune --sizes 1024 --beam 4
    python -m tiny_tensor.tune --list               # what is cached for these kernels (nothing is searched)

A 4096^2 search times each candidate for seconds: expect tens of minutes on a small machine.
"""
from __future__ import annotations

import argparse
import pickle
import sys
import time
from typing import Iterator

from tiny_uop import Ops, UOp

CONV_SHAPES: tuple[tuple[int, int, int, int, int], ...] = (
  (8, 32, 32, 5, 28),   # (batch, in channels, out channels, kernel, map size): MNIST's second conv
  (8, 64, 64, 3, 56),   # a ResNet stage-1 3x3 conv
)
"""The conv benchmarks' shapes: float32 NCHW, stride 1, no padding."""


def bench_kernels(sizes: tuple[int, ...], convs: bool = True) -> Iterator[tuple[str, UOp]]:
  """(a label, the kernel AST) of each kernel the CPU schedules for the benchmark ops: `a @ b` at each size in
  `sizes` (the panel copy included where the heuristics pack B), then the `CONV_SHAPES` forward convs."""
  from tiny_tensor import Tensor
  outs: list[tuple[str, Tensor]] = [(f"matmul {n}x{n}", Tensor.empty(n, n) @ Tensor.empty(n, n)) for n in sizes]
  if convs:
    for b, ci, co, k, hw in CONV_SHAPES:
      outs.append((f"conv {b}x{ci}x{hw}x{hw} -> {co}, {k}x{k}", Tensor.empty(b, ci, hw, hw).conv2d(
        Tensor.empty(co, ci, k, k))))
  for label, t in outs:
    for call in t.schedule().calls:
      ast = call.src[0]
      if ast.op is Ops.SINK: yield f"{label}: {ast.arg.name}", ast


def main(argv: list[str] | None = None) -> int:
  """Run (or with --list, look up) the BEAM searches of `bench_kernels`; prints one line per kernel."""
  from tiny_uop.device import diskcache_get
  from tiny_uop.plugins import Device

  from tiny_codegen.machine import host_machine
  from tiny_codegen.opt.heuristic import hand_coded_optimizations
  from tiny_codegen.opt.kernel import Kernel
  from tiny_codegen import get_program
  from tiny_codegen.opt.search import as_optimized, beam_search, cache_key
  ap = argparse.ArgumentParser(prog="python -m tiny_tensor.tune", description=__doc__.split("\n\n")[0])
  ap.add_argument("--beam", type=int, default=2, help="beam width (run with the same BEAM=n to use the winners)")
  ap.add_argument("--sizes", type=int, nargs="*", default=[1024, 4096], help="square fp32 matmul sizes")
  ap.add_argument("--no-conv", action="store_true", help="leave out the conv shapes")
  ap.add_argument("--list", action="store_true", help="show the cached winners; search nothing")
  args = ap.parse_args(argv)
  if args.beam < 1: ap.error(f"--beam must be 1 or more, got {args.beam}")
  if any(n < 1 for n in args.sizes): ap.error(f"--sizes must be positive, got {args.sizes}")
  try: machine = host_machine()
  except ValueError as e: ap.error(str(e))  # a bad TINY_MACHINE: its message names the field or value
  ren = Device["CPU"].renderer
  print(f"machine: {machine}")
  for label, ast in bench_kernels(tuple(args.sizes), not args.no_conv):
    key = cache_key(as_optimized(ast), ren, args.beam)
    if key is None:
      print(f"{label}: not cacheable (the compile cache is off: CACHELEVEL=0)")
      continue
    if args.list:
      hit = diskcache_get("beam", key)
      print(f"{label}: {'not tuned' if hit is None else pickle.loads(hit)}")
      continue
    heur = hand_coded_optimizations(Kernel(as_optimized(ast), ren)).applied_opts
    st = time.perf_counter()
    win = beam_search(ast, ren, args.beam, compile=get_program)
    same = " (the heuristics')" if tuple(win) == tuple(heur) else f" (heuristics: {heur})"
    print(f"{label}: {win}{same} in {time.perf_counter() - st:.1f} s")
  return 0


if __name__ == "__main__":
  from tiny_uop.plugins.cli import run_main
  sys.exit(run_main(main, "python -m tiny_tensor.tune"))
