"""BEAM search: time candidate opt sequences on the device and keep the fastest (`BEAM=n`).

Candidates grow one opt at a time from the `n` fastest kernels so far, until no candidate improves. The winner is
cached on disk by (kernel AST, renderer), so a kernel is searched once per machine. Timing needs the device the
renderer belongs to; it is opened through the plugin registry (codegen never imports a runtime).
"""
from __future__ import annotations

import hashlib
import math
import pickle
import time

from tiny_uop.device import Buffer, Renderer, diskcache_get, diskcache_put
from tiny_uop.dtype import PtrDType
from tiny_uop.helpers import DEBUG, getenv
from tiny_uop.uop import KernelInfo, Ops, UOp, structure_key

from tiny_codegen.opt.kernel import Kernel, KernelOptError, Opt, OptOps

ACTIONS: list[Opt] = [
  *[Opt(OptOps.UPCAST, axis, amt) for amt in (0, 2, 3, 4, 5, 7, 8) for axis in range(6)],
  *[Opt(OptOps.UNROLL, axis, amt) for amt in (0, 4, 7, 8, 16) for axis in range(4)],
  *[Opt(OptOps.LOCAL, axis, amt) for amt in (2, 3, 4, 8, 13, 16, 29, 32) for axis in range(6)],
  *[Opt(OptOps.GROUPTOP, axis, amt) for amt in (13, 16, 28, 29, 32, 49, 64, 256) for axis in range(3)],
  *[Opt(OptOps.GROUP, axis, amt) for amt in (0, 4, 8, 16) for axis in range(3)],
  *[Opt(OptOps.PADTO, axis, 32) for axis in range(6)],
  Opt(OptOps.NOLOCALS),
]


def _time_kernel(ast: UOp, renderer: Renderer, bufs: list[Buffer], runs: int = 3) -> float:
  from tiny_codegen.program import get_program
  from tiny_uop.plugins import Device
  dev = Device[renderer.device]
  spec = get_program(ast, renderer)
  prg = dev.get_program(spec.name, spec.lib)
  args = [bufs[s]._buf for s in spec.globals]
  vals = tuple(v.arg[1] for v in spec.vars)  # symbolic sizes are timed at their smallest value
  best = math.inf
  for _ in range(runs):
    st = time.perf_counter()
    t = prg(*args, global_size=spec.global_size, local_size=spec.local_size, vals=vals, wait=True)
    best = min(best, t if t is not None else time.perf_counter() - st)
  return best


def _buffers_for(ast: UOp, device: str) -> list[Buffer]:
  params = sorted({u: None for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda u: u.arg)
  out: list[Buffer] = []
  for p in params:
    assert isinstance(p.dtype, PtrDType)
    size = p.dtype.size if p.dtype.size > 0 else 1
    out.append(Buffer(device, size, p.dtype.base).allocate())
  return out


def _cache_key(ast: UOp, renderer: Renderer, amt: int) -> str:
  """The disk-cache key of a search: beam width, renderer, arch and the kernel's exact structure (`structure_key`
  hashes every node; a printed AST is cut in the middle for big graphs, so two kernels could share a key)."""
  return hashlib.sha256(f"{amt}\0{type(renderer).__name__}\0{renderer.arch}\0{structure_key(ast)}".encode()).hexdigest()


def beam_search(ast: UOp, renderer: Renderer, amt: int) -> tuple[Opt, ...]:
  """The fastest opt sequence found with beam width `amt` (cached on disk)."""
  key = _cache_key(ast, renderer, amt)
  if getenv("IGNORE_BEAM_CACHE", 0) == 0 and (hit := diskcache_get("beam", key)) is not None:
    return pickle.loads(hit)
  bufs = _buffers_for(ast, renderer.device)
  base = Kernel(ast, renderer)
  # the unoptimized kernel, marked as such (no opts to apply) so that compiling it doesn't start another search
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  plain = ast.replace(arg=KernelInfo(info.name, (), (), info.dont_use_locals))
  beam: list[tuple[Kernel, float]] = [(base, _time_kernel(plain, renderer, bufs))]
  seen: set[UOp] = {ast}
  st = time.perf_counter()
  while True:
    cands: list[tuple[Kernel, float]] = []
    for k, _ in beam:
      for act in ACTIONS:
        k2 = k.copy()
        try: k2.apply_opt(act)
        except KernelOptError: continue
        if k2.ast in seen: continue
        seen.add(k2.ast)
        try: t = _time_kernel(k2.get_optimized_ast(), renderer, bufs)
        except Exception as e:  # noqa: BLE001 -- a candidate that fails to compile or run is just not a candidate
          if DEBUG >= 3: print(f"BEAM: {k2.applied_opts} failed: {e}")
          continue
        cands.append((k2, t))
    if not cands: break
    cands.sort(key=lambda c: c[1])
    if cands[0][1] >= beam[0][1]: break
    beam = cands[:amt]
    if DEBUG >= 2: print(f"BEAM {time.perf_counter() - st:6.2f}s: {beam[0][1] * 1e6:9.2f} us {beam[0][0].applied_opts}")
  best = tuple(beam[0][0].applied_opts)
  diskcache_put("beam", key, pickle.dumps(best))
  return best
