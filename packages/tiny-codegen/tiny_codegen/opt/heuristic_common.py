"""What the CPU heuristics (`heuristic`) and the GPU ones (`heuristic_gpu`) share: trying an opt, the store's index,
the output axes and their bounds, register blocking, unrolling a reduce and upcasting the contiguous store axis. Both
import it; it imports neither (they used to import each other: issue #33)."""
from __future__ import annotations

from typing import Any

from tiny_uop.dtype import dtypes
from tiny_uop.uop import AxisType, GroupOp, Ops, UOp

from tiny_codegen.lower.dims import representative_trips
from tiny_codegen.machine import Machine, machine_of
from tiny_codegen.opt.kernel import Kernel, KernelOptError, Opt, OptOps, _bound, stride_of

def _try(k: Kernel, opt: Opt) -> bool:
  try:
    k.apply_opt(opt)
    return True
  except KernelOptError:
    return False


def _store_index(k: Kernel) -> UOp | None:
  st = k.stores()
  return st[0].src[0].src[1] if st and st[0].src[0].op is Ops.INDEX else None


def representative_size(r: UOp) -> int:
  """The size the heuristics weigh range `r` by: its bound when constant, else `representative_trips` of its
  symbolic bound (the geometric middle of the bound's range; see there why). Only sizes are weighed with it: an opt
  that splits a symbolic range takes a masked tail (`Kernel._split_tail`) or doesn't apply."""
  return representative_trips(r.src[0])


def _trips(rngs: Any) -> int:
  """The product of the ranges' sizes (a symbolic bound by its `representative_size`): how many times a body under
  them all runs."""
  n = 1
  for r in rngs: n *= representative_size(r)
  return n


def _output_axes_with_bounds(k: Kernel) -> list[tuple[int, UOp, int]]:
  return [(i, r, n) for i, r in enumerate(k.output_axes) if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)
          and (n := _bound(r) or 0) > 1]


def _awkward(r: UOp, loads: list[UOp], rngs: list[UOp], reds: list[UOp]) -> tuple[bool, bool]:
  """(some load walks `r` non-affinely (through div/mod), some load walks it as a sliding window (the same stride as
  a reduce axis)): upcasting such an axis copies index math, or loads that aren't shared between lanes."""
  nonaffine = window = False
  for ld in loads:
    idx = ld.src[0].src[1]
    if r not in idx.ranges: continue
    s = stride_of(idx, r, rngs)
    if s is None or any(u.op in (Ops.CDIV, Ops.CMOD) and r in u.ranges for u in idx.toposort()): nonaffine = True
    elif any(red in idx.ranges and stride_of(idx, red, rngs) == s for red in reds): window = True
  return nonaffine, window


def _register_block(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> None:
  """Upcast output axes that some load doesn't depend on (so the load is reused across the lanes): the axis
  contiguous in the store first (up to 16 lanes; 8 when a small innermost reduce axis will be unrolled; whole when
  it is <= 8, a filter row), then the one that leaves the fewest loads per iteration (up to 8), at most 128
  accumulators in all (fewer with that unroll, so it fits 256 lanes). Axes that loads index through div/mod come
  last."""
  rngs, reds = k.rngs, k.reduce_axes
  cands = []
  # a CPU kernel's symbolic axes (attention's query and key positions) block like constant ones, with a masked tail
  symbolic = [] if k.renderer.has_local else symbolic_output_axes(k)
  for i, r, n in _output_axes_with_bounds(k) + symbolic:
    reuse = any(r not in ld.src[0].src[1].ranges for ld in loads)
    if not reuse: continue
    contiguous = sidx is not None and stride_of(sidx, r, rngs) == 1
    nonaffine, window = _awkward(r, loads, rngs, reds)
    cands.append((nonaffine, not contiguous, window, -i, r, n))
  cands.sort(key=lambda c: c[:4])
  # leave room to unroll a small innermost reduce axis (a filter row) fully: the unroll pays more than wider blocks
  inner = _bound(reds[-1]) if reds else None
  max_acc = max(8, min(128, 256 // inner)) if inner is not None and 1 < inner <= 8 else 128
  chosen = 0
  while cands and chosen < 2:
    if chosen == 1:  # the second axis: the fewest loads per iteration, given the first (loads can share lanes)
      cands.sort(key=lambda c: (c[0], _loads_after(k, c[4], _amount(k, c[5], (8, 4, 2), max_acc,
                                                                    _bound(c[4]) is None)), *c[1:4]))
    _, not_contig, _, _, r, n = cands.pop(0)
    if not not_contig and chosen == 0 and _bound(r) is None and k.renderer.vectorize_upcast and \
       any(stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in loads):
      n = max(n, _register_lanes(k))  # the vector axis of the store and a load: a masked tail is one masked vector
    amts = (16, 8, 4, 2) if not not_contig and chosen == 0 and max_acc >= 128 and not _aliased_rows(k, r, loads) \
      else (8, 4, 2)
    if not not_contig and chosen == 0 and n <= 8 and _bound(r) is not None:
      amts = (n, *amts)  # a short store row (a filter row) whole; a symbolic one may be long (its tail is masked)
    if (amt := _amount(k, n, amts, max_acc, _bound(r) is None)) and \
       _try(k, Opt(OptOps.UPCAST, k.output_axes.index(r), amt)): chosen += 1


def _register_lanes(k: Kernel) -> int:
  """The lanes of one vector register of the store's dtype (`Machine.vector_bytes`; 0 when unknown). A symbolic axis
  that the store and a load walk contiguously, which a vectorizing renderer makes their vector (a masked tail:
  `llvm.masked.load/store`, PIPELINE.md §3), is blocked by up to this many lanes whatever its representative size:
  its last block is one masked vector either way, and a half-register vector halves every FMA (attention's scores
  over 64 tokens, keys as 8 vs 16 lanes, one thread of the Xeon 6/207, AVX-512: 28.7 vs 21.0 us)."""
  st = k.stores()
  vb = machine_of(k.renderer).vector_bytes
  return vb // st[0].src[1].dtype.itemsize if st and vb and st[0].src[1].dtype.itemsize else 0


def alias_bytes(m: Machine) -> int:
  """Rows this many bytes apart (or a multiple) map to the same L1d sets: the L1d's size over its ways
  (`Machine.l1d_set_span`; 4 KB on Zen 4's 32 KB 8-way and on a 48 KB 12-way L1d, 16 KB on Neoverse N1's 64 KB
  4-way)."""
  return m.l1d_set_span


def _aliased_rows(k: Kernel, r: UOp, loads: list[UOp]) -> bool:
  """Whether a load reads a different row per lane of axis `r` with a row stride that is a multiple of
  `alias_bytes`: 16 such lanes each keep a line in one L1d set (8-way on znver4) and evict each other every step of
  the reduce. A 32-token prefill's (32x2048) @ (768x2048)^T (nn.Linear's layout: both operands contiguous along K)
  with 16 x 8 strided rows ran 2.2-3.1 ms, 8 x 8 0.97-1.6 ms; the same kernel with K=768 (3 KB rows) is fine with
  16."""
  span = alias_bytes(machine_of(k.renderer))
  for ld in loads:
    st = stride_of(ld.src[0].src[1], r, k.rngs)
    if isinstance(st, int) and st > 1 and st * ld.dtype.itemsize % span == 0: return True
  return False


def _amount(k: Kernel, n: int, amts: tuple[int, ...], max_acc: int, tail: bool = False) -> int:
  """The first of `amts` that divides `n` (with a masked `tail`, a symbolic axis of representative size `n`: that is
  at most `n`) and keeps the accumulators within `max_acc` (0: none)."""
  return next((a for a in amts if (a <= n if tail else n % a == 0) and k.upcast_size * a <= max_acc), 0)


def symbolic_output_axes(k: Kernel) -> list[tuple[int, UOp, int]]:
  """(index, range, `representative_size`) of the LOOP/GLOBAL output axes whose bound is symbolic (a batch or
  sequence Variable) and more than 1 at that size: the CPU heuristics block such an axis like a constant one, by at
  most its representative size, its last block masked (`Kernel._split_tail`)."""
  return [(i, r, n) for i, r in enumerate(k.output_axes) if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)
          and _bound(r) is None and (n := representative_size(r)) > 1]


def _loads_after(k: Kernel, r: UOp, amt: int) -> int:
  """How many distinct loads one iteration does after upcasting `r` by `amt` (a load is copied per upcast lane of
  each axis it depends on)."""
  ups = [x for x in k.rngs if x.arg[1] is AxisType.UPCAST]
  total = 0
  for ld in k.loads():
    rs = ld.src[0].src[1].ranges
    c = amt if r in rs else 1
    for u in ups:
      if u in rs: c *= _bound(u) or 1
    total += c
  return total


def _unroll_reduce(k: Kernel, loads: list[UOp], latency: bool = True) -> bool:
  """Unroll the innermost reduce axis of each REDUCE (a kernel may hold several, e.g. a norm's mean and variance):
  a small one (<= 8, e.g. a filter width) fully, a larger one by 16/8/4 when loads walk it contiguously (independent
  partial results hide the add latency; the expander gives each lane of a streaming reduce its own accumulator) as
  long as that REDUCE's body is cheap; at most 256 lanes in all. True when it unrolled or a load walks the axis
  contiguously (no case for `_vector_accumulators`). `latency`: False leaves a larger axis as it is.
  A REDUCE whose body runs another REDUCE's loop once per iteration (an upper level of a blocked sum: it adds the
  partial sums of the blocks below) is not unrolled: its body is a loop, and unrolling it would copy that loop where
  the lanes or the innermost level's unroll should go."""
  inner: dict[UOp, UOp] = {}  # innermost REDUCE range -> its REDUCE
  for red in (u for u in k.ast.toposort() if u.op is Ops.REDUCE):
    if (rs := [r for r in red.src[1:] if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE]) and \
       not _runs_a_loop_per_iteration(red, rs):
      inner.setdefault(max(rs, key=lambda r: r.arg[0]), red)
  done = False
  for r, red in sorted(inner.items(), key=lambda x: -x[0].arg[0]):
    if r in k.reduce_axes: done = _unroll_one(k, r, red, loads, latency) or done
  return done


def _runs_a_loop_per_iteration(red: UOp, rngs: list[UOp]) -> bool:
  """True when `red`'s value holds a REDUCE that depends on one of `rngs` (red's own ranges): that REDUCE's loop
  runs again on every iteration of red's (a softmax's max, computed once per output, does not)."""
  own = set(rngs)
  return any(u.op is Ops.REDUCE and any(r in own for r in u.ranges) for u in red.src[0].toposort())


def _unroll_one(k: Kernel, r: UOp, red: UOp, loads: list[UOp], latency: bool = True) -> bool:
  n = _bound(r)
  if n is None or n < 2: return False
  if n <= 8 and _try(k, Opt(OptOps.UNROLL, k.reduce_axes.index(r), 0)): return True
  rngs = k.rngs
  if n < 8 or not latency: return False
  if not any(stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in loads): return False
  cost = _alu_cost(red.src[0])
  # a renderer with native vectors packs the unrolled lanes of a contiguous reduce into vectors (LLVM's SLP
  # vectorizer), so its budget is per vector, not per lane, in a kernel that runs long enough to repay compiling the
  # lanes: a softmax's sum of exp (decomposed exp2, ~25 ops) unrolls into 16-lane vector code, 4096² 59 -> 19 ms
  # (numpy 45), where a 64x64 one would compile in ~80 ms instead of ~15 for a few µs of work
  # so is a reduce over packed bytes (a quantized weight decoded in a matvec) whatever its size: its lanes are one
  # byte vector; with a per-lane budget a 768x768 Q4_K matvec (grouped K, ~8 ops a lane) unrolled only 8 and ran
  # scalar, 526 -> 94 us with 16 lanes (one thread, loaded Xeon AVX-512)
  packed = any(ld.dtype.itemsize == 1 and stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in loads)
  lanes = 1 if k.renderer.vectorize_upcast and (packed or _trips(k.rngs) >= VECTOR_UNROLL_MIN_ITERS) else None
  for amt in (16, 8, 4):
    if n % amt == 0 and k.upcast_size * amt <= 256 and cost * (lanes or amt) <= UNROLL_ALU_BUDGET and \
       _try(k, Opt(OptOps.UNROLL, k.reduce_axes.index(r), amt)): return True
  return True


VECTOR_UNROLL_MIN_ITERS = 1 << 20  # loop-body iterations (all ranges) from which an unroll's budget is per vector


UNROLL_ALU_BUDGET = 64  # value ALU ops a latency-hiding unroll may copy per lane (per vector where the renderer
                        # vectorizes the lanes): more only slows compiling a compute-bound loop
_EXPENSIVE = {Ops.EXP2: 20, Ops.LOG2: 20, Ops.SIN: 30, Ops.SQRT: 2, Ops.RECIPROCAL: 2, Ops.POW: 40}


def _alu_cost(ast: UOp) -> int:
  """A rough count of the value (non-index) ALU instructions one iteration of one lane of the kernel's body becomes
  (transcendentals expand)."""
  return sum(_EXPENSIVE.get(u.op, 1) for u in ast.toposort() if u.op in GroupOp.ALU and u.dtype.scalar() != dtypes.index
             and not dtypes.is_int(u.dtype))


def _upcast_contiguous(k: Kernel, sidx: UOp | None) -> None:
  if sidx is None: return
  rngs = k.rngs
  for i, r, n in reversed(_output_axes_with_bounds(k)):
    if stride_of(sidx, r, rngs) == 1 and n % 4 == 0:
      _try(k, Opt(OptOps.UPCAST, i, 4))
      return
