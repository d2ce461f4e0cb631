"""Hand-coded optimizations, chosen per renderer from the kernel's structure.

CPU renderers (no locals; threads split the outermost loop in lowering):
- matmul-like reduces (a loaded buffer that doesn't depend on an output axis): register blocking — upcast the
  output axis that is contiguous in the store (8 lanes, the vector width) and one more reused axis (4), so each
  loaded value is used by several accumulators;
- plain reduces (sum/max over a contiguous axis): unroll the innermost reduce axis so several independent partial
  results hide the add latency;
- elementwise kernels: left to LLVM's loop vectorizer.
GPU renderers: the same upcasts plus a LOCAL split of the innermost output axis, and GROUPTOP for large reduces
into few outputs.
"""
from __future__ import annotations

from tiny_uop.device import Renderer
from tiny_uop.uop import AxisType, Ops, UOp

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


def hand_coded_optimizations(k: Kernel) -> Kernel:
  """Apply the heuristic opts for `k.renderer` to `k` (in place) and return it."""
  ren: Renderer = k.renderer
  has_reduce = any(u.op is Ops.REDUCE for u in k.ast.toposort())
  sidx = _store_index(k)
  loads = k.loads()
  if has_reduce:
    _register_block(k, sidx, loads)
    _unroll_reduce(k, k.loads())
  elif not getattr(ren, "has_threads", False):
    _upcast_contiguous(k, sidx)
  if ren.has_local and not k.dont_use_locals: _add_locals(k, has_reduce)
  return k


def _output_axes_with_bounds(k: Kernel) -> list[tuple[int, UOp, int]]:
  return [(i, r, n) for i, r in enumerate(k.output_axes) if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)
          and (n := _bound(r) or 0) > 1]


def _window_or_nonaffine(r: UOp, loads: list[UOp], rngs: list[UOp], reds: list[UOp]) -> bool:
  """Whether some load walks `r` non-affinely (div/mod) or as a sliding window (same stride as a reduce axis):
  upcasting such an axis duplicates index math or loads that aren't shared between lanes."""
  for ld in loads:
    idx = ld.src[0].src[1]
    if r not in idx.ranges: continue
    s = stride_of(idx, r, rngs)
    if s is None: return True
    if any(red in idx.ranges and stride_of(idx, red, rngs) == s for red in reds): return True
  return False


def _register_block(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> None:
  """Upcast output axes that some load doesn't depend on (so the load is reused across the lanes): the axis
  contiguous in the store first (up to 16 lanes), then one more (up to 8), at most 128 accumulators in all. Axes
  that loads walk as a sliding window or through div/mod come last."""
  rngs, reds = k.rngs, k.reduce_axes
  cands = []
  for i, r, n in _output_axes_with_bounds(k):
    reuse = any(r not in ld.src[0].src[1].ranges for ld in loads)
    if not reuse: continue
    contiguous = sidx is not None and stride_of(sidx, r, rngs) == 1
    cands.append((not contiguous, _window_or_nonaffine(r, loads, rngs, reds), -i, r, n))
  cands.sort(key=lambda c: c[:3])
  chosen = 0
  for not_contig, _, _, r, n in cands:
    for amt in ((16, 8, 4, 2) if not not_contig and chosen == 0 else (8, 4, 2)):
      if n % amt == 0 and k.upcast_size * amt <= 128:
        axis = k.output_axes.index(r)
        if _try(k, Opt(OptOps.UPCAST, axis, amt)):
          chosen += 1
          break
    if chosen >= 2: break


def _unroll_reduce(k: Kernel, loads: list[UOp]) -> None:
  """Unroll the innermost reduce axis: a small one (<= 8, e.g. a filter width) fully, a larger one by 16/8/4 when
  loads walk it contiguously (independent partial results hide the add latency); at most 256 lanes in all."""
  reds = k.reduce_axes
  if not reds: return
  r = reds[-1]
  n = _bound(r)
  if n is None or n < 2: return
  if n <= 8 and _try(k, Opt(OptOps.UNROLL, len(reds) - 1, 0)): return
  rngs = k.rngs
  if n < 8 or not any(stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in loads): return
  for amt in (16, 8, 4):
    if n % amt == 0 and k.upcast_size * amt <= 256 and _try(k, Opt(OptOps.UNROLL, len(reds) - 1, amt)): return


def _upcast_contiguous(k: Kernel, sidx: UOp | None) -> None:
  if sidx is None: return
  rngs = k.rngs
  for i, r, n in reversed(_output_axes_with_bounds(k)):
    if stride_of(sidx, r, rngs) == 1 and n % 4 == 0:
      _try(k, Opt(OptOps.UPCAST, i, 4))
      return


def _add_locals(k: Kernel, has_reduce: bool) -> None:
  axes = _output_axes_with_bounds(k)
  if not axes: return
  i, _, n = axes[-1]
  for amt in (16, 8, 4, 2):
    if n % amt == 0 and _try(k, Opt(OptOps.LOCAL, i, amt)): return
