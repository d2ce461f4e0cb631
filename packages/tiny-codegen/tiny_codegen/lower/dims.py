"""Launch dimensions: CPU threads (`core_id`) or GPU `SPECIAL` gidx/lidx indices.

CPU-style renderers (`has_threads`): an optimizer's THREAD axis becomes `core_id`; without one, the outermost
GLOBAL/LOOP range that every store depends on is split across `renderer.threads` threads: range `r` of bound N
becomes `core_id*chunk + r'` with `r'` in [0, min(chunk, N - core_id*chunk)) and chunk = ceil(N / shares). Small
kernels run on one thread: those whose cost (`kernel_cost`: bytes loaded and stored in global memory plus ALU lane
ops, each times the iterations of the loops it depends on) is below `renderer.thread_min_work`, since waking a helper
thread costs more than such a kernel's work; and no share gets less than half of it (on many cores a kernel just past
the minimum gets a few shares, not one per core). A launch's shares are claimed by the threads as they come free, so a
big kernel (cost at least `renderer.balance_min_work`) gets `renderer.shares_per_thread` shares per thread: when one
core runs slower than the other (a busy hyperthread sibling, a VM's vCPU losing time to the host, a hybrid CPU's
efficiency cores) the faster ones take more shares instead of waiting for it. Shares never come out empty: with a
constant N their count is ceil(N / chunk). Where those shares leave the threads unequal work (3 channel blocks on 2
threads: 2 and 1), each outer iteration's next loop is split too, into k parts, n * k shares in all (`_finer_split`).
The kernel always takes `int core_id` last.

GPU-style renderers (`has_local`): GLOBAL ranges, and the constant-bound LOOP ranges every store uses, become
SPECIAL("gidx{i}") (at most 3 dims, within `global_max`; others stay loops); LOCAL ranges become SPECIAL("lidx{i}").
gidx0/lidx0 are the innermost dimensions.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from tiny_uop.device import Renderer
from tiny_uop.dtype import AddrSpace, DType, dtypes
from tiny_uop.helpers import ceildiv, prod
from tiny_uop.uop import AxisType, GroupOp, Ops, UOp

from tiny_codegen.lower.reduce import _stores, range_key


@dataclass
class Dims:
  """The launch shape a lowered kernel needs."""
  global_size: tuple[int, ...] = (1, 1, 1)
  local_size: tuple[int, ...] | None = None
  cost: int = 0
  """A split CPU kernel's `kernel_cost` (0 otherwise): the runtime's Python launch path runs the shares of one
  cheaper than its own minimum inline (`ProgramInfo.cost`, docs/PIPELINE.md §4)."""


def _special(name: str, bound: int, dt: DType) -> UOp:
  """A launch index (`core_id`, `gidx0`, ...): int32 as hardware and kernel arguments give it, cast to `dt` when
  the kernel's indices are int64 (its own bound always fits: launch sizes are 32-bit)."""
  if bound > 0x7FFFFFFF: raise ValueError(f"launch dimension {name} of {bound} exceeds 2**31-1")
  sp = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, bound),), name)
  return sp if dt == dtypes.int32 else sp.cast(dt)


def _store_ranges(sink: UOp) -> list[UOp]:
  """Ranges every store of the kernel depends on, outermost first."""
  stores = _stores(sink)
  if not stores: return []
  common = [r for r in stores[0].ranges if r.op is Ops.RANGE]
  for st in stores[1:]: common = [r for r in common if r in st.ranges]
  return sorted(common, key=range_key)


def representative_trips(bound: UOp) -> int:
  """The iterations a loop of bound `bound` is weighed by: the constant itself; for a symbolic bound (a Variable: a
  batch, a sequence length, a KV cache position, or an expression of one) the geometric middle of its range
  [max(vmin, 1), vmax], rounded. Not vmax: `max_dims` and a KV cache's length are caps, and a kernel sized for the cap
  is over-blocked and over-threaded for the small calls that are typical (a 1-token decode step under a 512-token
  cap); not vmin (often 1), which made every symbolic kernel look like a tiny one (issue #39). The middle in log space
  is off from either end by the same factor. The CPU heuristics (`heuristic_common.representative_size`) and the
  threading decision (`kernel_cost`) both weigh a symbolic loop by it."""
  if bound.op is Ops.CONST: return int(bound.arg)
  lo, hi = bound.vmin, bound.vmax
  if not isinstance(lo, int) or not isinstance(hi, int): return 1
  lo = max(lo, 1)
  return max(1, round(math.sqrt(lo * max(hi, lo))))


def _global_access(u: UOp) -> bool:
  """Whether LOAD/STORE `u` reaches a kernel buffer (PARAM), not a register array."""
  p = u.src[0]
  while p.op in (Ops.INDEX, Ops.CAST, Ops.BITCAST) and p.src: p = p.src[0]
  return p.op is Ops.PARAM


def kernel_cost(sink: UOp) -> int:
  """A kernel's work in one unit: bytes it loads and stores in global memory plus its ALU ops (one per vector lane),
  each times the iterations of the loops it depends on (a loop with a variable bound counts its
  `representative_trips`: once 2**16, which threaded every kernel over a sequence Variable, each launch waking the
  helpers for a few microseconds of work). Run
  after the expander and reduce lowering, so loops are RANGEs and upcast axes are vector lanes. Bytes and ops weigh
  alike: the small kernels this decides about run from cache, where one thread does 50-90 units per ns of either
  (see `CPURenderer.thread_min_work`)."""
  cost = 0
  for u in sink.toposort():
    if u.op is Ops.LOAD or u.op is Ops.STORE:
      dt = u.dtype if u.op is Ops.LOAD else u.src[1].dtype
      units = dt.itemsize if _global_access(u) else dt.count
    elif u.op in GroupOp.ALU: units = u.dtype.count
    else: continue
    trips = 1
    for r in u.ranges: trips *= representative_trips(r.src[0])
    cost += units * trips
  return cost


def add_threads(sink: UOp, renderer: Renderer) -> tuple[UOp, Dims]:
  """Split the outermost loop across `renderer.threads` CPU threads (see the module docstring). A THREAD axis the
  optimizer made (bound T) is used as it is: it becomes `core_id` and the kernel launches T threads."""
  thr = [r for r in _store_ranges(sink) if r.arg[1] is AxisType.THREAD and r.src[0].op is Ops.CONST]
  if thr:
    t = int(thr[0].src[0].arg)
    core = _special("core_id", t, thr[0].dtype)
    return sink.substitute({thr[0]: core}, name="thread_axis"), Dims((t, 1, 1), cost=kernel_cost(sink))
  nthreads = max(1, int(getattr(renderer, "threads", 1)))
  cands = [r for r in _store_ranges(sink) if r.arg[1] in (AxisType.GLOBAL, AxisType.LOOP, AxisType.THREAD)]
  if nthreads == 1 or not cands or (cost := kernel_cost(sink)) < getattr(renderer, "thread_min_work", 0):
    return sink, Dims()
  if (least_share := int(getattr(renderer, "thread_min_work", 0)) // 2) > 0:
    nthreads = min(nthreads, cost // least_share)  # each share at least half the minimum: many cores, few shares
  if (least := getattr(renderer, "balance_min_work", 0)) > 0 and cost >= least:
    nthreads *= max(1, int(getattr(renderer, "shares_per_thread", 1)))
  r = cands[0]
  bound = r.src[0]
  if bound.op is Ops.CONST:
    n = int(bound.arg)
    nthreads = -(-n // -(-n // min(nthreads, n)))  # as many shares as chunks of ceil(n / shares): none empty
  if nthreads <= 1: return sink, Dims()
  if bound.op is Ops.CONST and (finer := _finer_split(cands, int(bound.arg), int(getattr(renderer, "threads", 1)),
                                                      nthreads)) is not None:
    return _split_two(sink, r, *finer, cost)
  dt = r.dtype  # int64 in a kernel over more than 2**31-1 elements
  core_id = _special("core_id", nthreads, dt)
  if bound.op is Ops.CONST:
    n = int(bound.arg)
    chunk: UOp | int = -(-n // nthreads)
    start = core_id * UOp.const(dt, chunk)
    left = UOp.const(dt, n) - start
    new_bound = UOp.const(dt, chunk) if n % nthreads == 0 else (left < chunk).where(left, UOp.const(dt, chunk))
  else:
    chunk = (bound + (nthreads - 1)) // nthreads
    start = core_id * chunk
    new_bound = (bound - start < chunk).where(bound - start, chunk)
  new_r = UOp(Ops.RANGE, r.dtype, (new_bound,), r.arg)
  return sink.substitute({r: start + new_r}, name="add_threads"), Dims((nthreads, 1, 1), cost=cost)


def _finer_split(cands: list[UOp], n: int, threads: int, shares: int) -> tuple[UOp, int] | None:
  """(the next loop, k) when splitting the outermost loop (bound `n`, into `shares` shares of ceil(n / shares)
  iterations) leaves the `threads` threads unequal work and splitting each of its iterations's next loop into k
  parts as well (n * k shares, a multiple of `threads`) evens it out: 3 channel blocks on 2 threads are shares of 2
  and 1 blocks, the second thread idle a third of the time; 3 x 2 half-blocks are 3 shares each. Compared in
  iterations of the next loop the slowest thread runs; taken when that is at least 1/8 less (every share is a claim
  of a cache line the threads share, and the parts of a loop read their operands twice). None: keep the split."""
  if len(cands) < 2 or (inner := cands[1]).src[0].op is not Ops.CONST or threads <= 1: return None
  n1 = int(inner.src[0].arg)
  chunk = ceildiv(n, shares)
  now = ceildiv(ceildiv(n, chunk), threads) * chunk * n1  # shares claimed in turn: the slowest thread's iterations
  step = threads // math.gcd(n, threads)
  k = ceildiv(shares, n * step) * step  # at least `shares` shares, a multiple of `threads`
  if k < 2 or k > n1 or ceildiv(n1, c1 := ceildiv(n1, k)) != k: return None  # one part, or an empty one
  return (inner, k) if 8 * ceildiv(n * k, threads) * c1 <= 7 * now else None


def _split_two(sink: UOp, outer: UOp, inner: UOp, k: int, cost: int) -> tuple[UOp, Dims]:
  """Share s runs iteration s // k of loop `outer` and part s % k (of ceil(n1 / k) iterations) of loop `inner`."""
  n, n1 = int(outer.src[0].arg), int(inner.src[0].arg)
  c1 = ceildiv(n1, k)
  core = _special("core_id", n * k, outer.dtype)
  part = core % UOp.const(outer.dtype, k)
  if part.dtype != inner.dtype: part = part.cast(inner.dtype)
  start = part * UOp.const(inner.dtype, c1)
  left = UOp.const(inner.dtype, n1) - start
  new_bound = UOp.const(inner.dtype, c1) if n1 % k == 0 else (left < c1).where(left, UOp.const(inner.dtype, c1))
  new_r = UOp(Ops.RANGE, inner.dtype, (new_bound,), inner.arg)
  subs = {outer: core // UOp.const(outer.dtype, k), inner: start + new_r}
  return sink.substitute(subs, name="add_threads"), Dims((n * k, 1, 1), cost=cost)


def gpu_axes(sink: UOp, renderer: Renderer) -> tuple[list[UOp], list[UOp]]:
  """The ranges that become gidx and lidx dims (outermost first), each list at most 3 and within the limits."""
  rngs = sorted({u: None for u in sink.toposort() if u.op is Ops.RANGE}, key=range_key)
  gmax = renderer.global_max or (0x7FFFFFFF,) * 3
  lmax = renderer.local_max or (0x7FFFFFFF,) * 3
  store_rngs = _store_ranges(sink)
  glob = [r for r in rngs if r.src[0].op is Ops.CONST and
          (r.arg[1] is AxisType.GLOBAL or (r.arg[1] is AxisType.LOOP and r in store_rngs))]
  loc = [r for r in rngs if r.arg[1] is AxisType.LOCAL and r.src[0].op is Ops.CONST]
  glob, loc = glob[-3:], loc[-3:]  # the innermost ones; any others stay loops
  glob = [r for i, r in enumerate(reversed(glob)) if int(r.src[0].arg) <= gmax[i]][::-1]
  loc = [r for i, r in enumerate(reversed(loc)) if int(r.src[0].arg) <= lmax[i]][::-1]
  return glob, loc


def add_gpudims(sink: UOp, renderer: Renderer) -> tuple[UOp, Dims]:
  """GLOBAL/LOCAL ranges (and, unoptimized, the stores' LOOP ranges) become SPECIAL gidx/lidx."""
  glob, loc = gpu_axes(sink, renderer)
  subs: dict[UOp, UOp] = {}
  gsz, lsz = [1, 1, 1], [1, 1, 1]
  for prefix, lst, sz in (("gidx", glob, gsz), ("lidx", loc, lsz)):
    for i, r in enumerate(reversed(lst)):
      subs[r] = _special(f"{prefix}{i}", int(r.src[0].arg), r.dtype)
      sz[i] = int(r.src[0].arg)
  if not subs: return sink, Dims((1, 1, 1), (1, 1, 1))
  return sink.substitute(subs, name="add_gpudims"), Dims(tuple(gsz), tuple(lsz))


def group_reduces(sink: UOp, renderer: Renderer) -> UOp:
  """REDUCEs over GROUP_REDUCE axes become a workgroup reduction through shared memory.

  REDUCE(v, *R, *G) -> each thread of the group (G become lidx dims) reduces its share over R into `partial`, writes
  it to DEFINE_LOCAL[local ids, G], BARRIER, then reduces the group's slots over new REDUCE ranges G'. Stores that
  don't depend on G are gated to the group's first thread; the G ranges become LOCAL ranges (lidx dims later).
  Runs before reduces are lowered. Reduces stay serial (G as a loop) where one sits inside a loop that is not a GPU
  dim, where the local dims would exceed 3 or `local_max`, or where the slots exceed `shared_max`.
  """
  reds = [u for u in sink.toposort() if u.op is Ops.REDUCE and
          any(r.arg[1] is AxisType.GROUP_REDUCE and r.src[0].op is Ops.CONST for r in u.src[1:])]
  if not reds: return sink
  glob_l, loc = gpu_axes(sink, renderer)
  glob = set(glob_l)
  all_g = sorted({r: None for red in reds for r in red.src[1:] if r.arg[1] is AxisType.GROUP_REDUCE}, key=range_key)
  new_loc = loc + all_g
  lmax = renderer.local_max or (0x7FFFFFFF,) * 3
  if len(new_loc) > 3 or any(int(r.src[0].arg) > lmax[i] for i, r in enumerate(reversed(new_loc))) or \
     any(r.src[0].op is not Ops.CONST for r in all_g) or prod(int(r.src[0].arg) for r in new_loc) > max(lmax):
    return sink
  next_id = max(u.arg[0] for u in sink.toposort() if u.op is Ops.RANGE) + 1
  subs: dict[UOp, UOp] = {}
  shared_bytes = 0
  for n, red in enumerate(reds):
    gs = [r for r in red.src[1:] if r.arg[1] is AxisType.GROUP_REDUCE]
    rest = [r for r in red.src[1:] if r not in gs]
    partial = UOp(Ops.REDUCE, red.dtype, (red.src[0], *rest), red.arg) if rest else red.src[0]
    if any(r not in glob and r not in new_loc for r in partial.ranges if r.op is Ops.RANGE): return sink
    size = prod(int(r.src[0].arg) for r in new_loc)
    shared_bytes += size * red.dtype.itemsize
    if shared_bytes > renderer.shared_max: return sink
    flat = _flat(new_loc)
    lds = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(size, AddrSpace.LOCAL), arg=n)
    bar = UOp(Ops.BARRIER, src=(lds.index(flat).store(partial),))
    g2 = {g: UOp.range(g.src[0], next_id + k, AxisType.REDUCE, g.dtype) for k, g in enumerate(gs)}
    next_id += len(gs)
    read = lds.index(_flat([g2.get(r, r) for r in new_loc])).load(bar)
    subs[red] = read.reduce(*g2.values(), arg=red.arg)
  sink = sink.substitute(subs, name="group_reduce")
  as_local = {g: UOp.range(g.src[0], g.arg[0], AxisType.LOCAL, g.dtype) for g in all_g}
  sink = sink.substitute(as_local, name="group_as_local")
  all_g = list(as_local.values())
  gated = []
  for st in _stores(sink):
    if st.src[0].op is not Ops.INDEX or st.src[0].src[0].op is not Ops.PARAM:
      gated.append(st)
      continue
    missing = [g for g in all_g if g not in st.src[0].src[1].ranges]  # every thread of the group has the value
    if not missing:
      gated.append(st)
      continue
    valid = functools.reduce(lambda a, b: a & b, [g.eq(0) for g in missing])
    idx = st.src[0]
    valid = idx.src[2] & valid if len(idx.src) > 2 else valid
    gated.append(st.replace(src=(idx.replace(src=(idx.src[0], idx.src[1], valid)), *st.src[1:])))
  return sink.replace(src=tuple(gated))


def _flat(rngs: list[UOp]) -> UOp:
  """Row-major linear index of `rngs` (last fastest), as int32: it indexes workgroup memory, always small."""
  idx: UOp = UOp.const(dtypes.int32, 0)
  for r in rngs: idx = idx * int(r.src[0].arg) + (r if r.dtype == dtypes.int32 else r.cast(dtypes.int32))
  return idx
