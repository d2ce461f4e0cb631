"""Emulator speed: `python -m tiny_runtime_amd.emu.bench [gfx1100|gfx942]` compiles an elementwise kernel over 16K
floats, a 64x64 float matmul and a sum of 64K floats (heuristic opts, for that arch), runs each on MOCK+AMD's GPU of
that arch (the RDNA3 or the CDNA3 emulator) and prints kernels/s and emulated instructions/s (process CPU time, best of
a few runs: the figures hold on a shared, busy machine)."""
from __future__ import annotations

import sys
import time
from typing import Any

from tiny_codegen import get_program
from tiny_codegen.opt import Kernel, hand_coded_optimizations
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.helpers import Context
from tiny_uop.uop import AxisType


def elementwise(n: int = 16384) -> UOp:
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i in range(3))
  i = UOp.range(n, 0)
  x, y = a.index(i).load(), b.index(i).load()
  return c.index(i).store(x * y + x).sink(arg=KernelInfo(f"E_{n}"))


def matmul(n: int = 64) -> UOp:
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n * n), arg=i) for i in range(3))
  i, j, k = UOp.range(n, 0), UOp.range(n, 1), UOp.range(n, 2, AxisType.REDUCE)
  val = UOp(Ops.REDUCE, dtypes.float, (a.index(i * n + k).load() * b.index(k * n + j).load(), k), Ops.ADD)
  return c.index(i * n + j).store(val).sink(arg=KernelInfo(f"mm_{n}"))


def reduction(n: int = 65536) -> UOp:
  c, a, _ = (UOp(Ops.PARAM, dtypes.float.ptr(1 if i == 0 else n), arg=i) for i in range(3))
  k = UOp.range(n, 0, AxisType.REDUCE)
  val = UOp(Ops.REDUCE, dtypes.float, (a.index(k).load(), k), Ops.ADD)
  return c.index(UOp.const(dtypes.int, 0)).store(val).sink(arg=KernelInfo(f"r_{n}"))


_DEVS: dict[str, Any] = {}


def bench(ast: UOp, n_elems: int, reps: int = 3, arch: str = "gfx1100") -> tuple[float, float]:
  """(kernels/s, emulated instructions/s) of `ast` on MOCK+AMD's `arch` GPU, best of `reps` runs."""
  from tiny_runtime_amd.device import AMDDevice
  if (dev := _DEVS.get(arch)) is None:
    with Context(DEV=f"MOCK+AMD:LLVM:{arch}"): dev = _DEVS[arch] = AMDDevice("MOCK+AMD")
  ren = AMDGPURenderer(arch)
  spec = get_program(hand_coded_optimizations(Kernel(ast, ren)).get_optimized_ast(), ren)
  bufs = [dev.allocator.alloc(4 * n_elems) for _ in range(3)]
  for b in bufs[1:]: dev.allocator._copyin(b, memoryview(bytearray(4 * n_elems)))
  prg = dev.get_program(spec.name, spec.lib)
  emu = dev._driver.emu
  best, steps = float("inf"), 0
  for _ in range(reps):
    s0, t0 = emu.steps, time.process_time()
    prg(*bufs, global_size=spec.global_size, local_size=spec.local_size, vals=(), wait=True)
    dt = time.process_time() - t0
    if dt < best: best, steps = dt, emu.steps - s0
  return 1 / best, steps / best


if __name__ == "__main__":
  arch = sys.argv[1] if len(sys.argv) > 1 else "gfx1100"
  for name, ast, n in [("elementwise 16K", elementwise(), 16384), ("matmul 64x64", matmul(), 64 * 64),
                       ("sum 64K", reduction(), 65536)]:
    kps, ips = bench(ast, n, arch=arch)
    print(f"{arch} {name:16s} {kps:8.2f} kernels/s {ips:12,.0f} instructions/s")
