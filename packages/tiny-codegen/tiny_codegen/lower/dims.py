"""Launch dimensions: CPU threads (`core_id`) or GPU `SPECIAL` gidx/lidx indices.

CPU-style renderers (`has_threads`): an optimizer's THREAD axis becomes `core_id`; without one, the outermost
GLOBAL/LOOP range that every store depends on is split across
`renderer.threads` threads: range `r` of bound N becomes `core_id*chunk + r'` with `r'` in
[0, min(chunk, N - core_id*chunk)) and chunk = ceil(N / threads). Small kernels (fewer than
`renderer.thread_min_work` iterations in all) run on one thread. The kernel always takes `int core_id` last.

GPU-style renderers (`has_local`): GLOBAL ranges, and the constant-bound LOOP ranges every store uses, become
SPECIAL("gidx{i}") (at most 3 dims, within `global_max`; others stay loops); LOCAL ranges become SPECIAL("lidx{i}").
gidx0/lidx0 are the innermost dimensions.
"""
from __future__ import annotations

from dataclasses import dataclass

from tiny_uop.device import Renderer
from tiny_uop.dtype import dtypes
from tiny_uop.helpers import prod
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen.lower.reduce import _stores, range_key


@dataclass
class Dims:
  """The launch shape a lowered kernel needs."""
  global_size: tuple[int, ...] = (1, 1, 1)
  local_size: tuple[int, ...] | None = None


def _store_ranges(sink: UOp) -> list[UOp]:
  """Ranges every store of the kernel depends on, outermost first."""
  stores = _stores(sink)
  if not stores: return []
  common = [r for r in stores[0].ranges if r.op is Ops.RANGE]
  for st in stores[1:]: common = [r for r in common if r in st.ranges]
  return sorted(common, key=range_key)


def _work(sink: UOp) -> int:
  bounds = [r.src[0].arg if r.src[0].op is Ops.CONST else 1 << 16 for r in sink.toposort() if r.op is Ops.RANGE]
  return prod(bounds)


def add_threads(sink: UOp, renderer: Renderer) -> tuple[UOp, Dims]:
  """Split the outermost loop across `renderer.threads` CPU threads (see the module docstring). A THREAD axis the
  optimizer made (bound T) is used as it is: it becomes `core_id` and the kernel launches T threads."""
  thr = [r for r in _store_ranges(sink) if r.arg[1] is AxisType.THREAD and r.src[0].op is Ops.CONST]
  if thr:
    t = int(thr[0].src[0].arg)
    core = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, t),), "core_id")
    return sink.substitute({thr[0]: core}, name="thread_axis"), Dims((t, 1, 1))
  nthreads = max(1, int(getattr(renderer, "threads", 1)))
  cands = [r for r in _store_ranges(sink) if r.arg[1] in (AxisType.GLOBAL, AxisType.LOOP, AxisType.THREAD)]
  if nthreads == 1 or not cands or _work(sink) < getattr(renderer, "thread_min_work", 0): return sink, Dims()
  r = cands[0]
  bound = r.src[0]
  if bound.op is Ops.CONST: nthreads = min(nthreads, int(bound.arg))
  if nthreads <= 1: return sink, Dims()
  core_id = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, nthreads),), "core_id")
  if bound.op is Ops.CONST:
    n = int(bound.arg)
    chunk: UOp | int = -(-n // nthreads)
    start = core_id * chunk
    left = UOp.const(dtypes.index, n) - start
    new_bound = UOp.const(dtypes.index, chunk) if n % nthreads == 0 else \
      (left < chunk).where(left, UOp.const(dtypes.index, chunk))
  else:
    chunk = (bound + (nthreads - 1)) // nthreads
    start = core_id * chunk
    new_bound = (bound - start < chunk).where(bound - start, chunk)
  new_r = UOp(Ops.RANGE, r.dtype, (new_bound,), r.arg)
  return sink.substitute({r: start + new_r}, name="add_threads"), Dims((nthreads, 1, 1))


def add_gpudims(sink: UOp, renderer: Renderer) -> tuple[UOp, Dims]:
  """GLOBAL/LOCAL ranges (and, unoptimized, the stores' LOOP ranges) become SPECIAL gidx/lidx."""
  rngs = sorted({u: None for u in sink.toposort() if u.op is Ops.RANGE}, key=range_key)
  gmax = renderer.global_max or (0x7FFFFFFF,) * 3
  lmax = renderer.local_max or (0x7FFFFFFF,) * 3
  store_rngs = _store_ranges(sink)
  glob = [r for r in rngs if r.src[0].op is Ops.CONST and
          (r.arg[1] is AxisType.GLOBAL or (r.arg[1] is AxisType.LOOP and r in store_rngs))]
  loc = [r for r in rngs if r.arg[1] is AxisType.LOCAL and r.src[0].op is Ops.CONST]
  glob, loc = glob[-3:], loc[-3:]  # the innermost ones; any others stay loops
  subs: dict[UOp, UOp] = {}
  gsz, lsz = [1, 1, 1], [1, 1, 1]
  for prefix, lst, sz, mx in (("gidx", glob, gsz, gmax), ("lidx", loc, lsz, lmax)):
    for i, r in enumerate(reversed(lst)):
      n = int(r.src[0].arg)
      if n > mx[i]: continue  # too big for this dimension: stays a loop
      subs[r] = UOp(Ops.SPECIAL, dtypes.index, (r.src[0],), f"{prefix}{i}")
      sz[i] = n
  if not subs: return sink, Dims((1, 1, 1), (1, 1, 1))
  return sink.substitute(subs, name="add_gpudims"), Dims(tuple(gsz), tuple(lsz))
