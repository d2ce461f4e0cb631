"""Hand-coded optimizations for GPU renderers (`has_local`), sized by the renderer's capabilities.

In order, the first that applies:
- under `TC=1`, a matmul whose dtypes and shape fit one of the renderer's tensor cores gets TC (and nothing else);
- a reduction with a large reduce (>= GROUP_MIN_REDUCE elements per output) and few outputs (<= GROUP_MAX_OUTPUTS,
  or no more than the reduce has elements) -- a sum, softmax/layernorm statistics, a conv's weight gradient, a
  matvec -- gets GROUPTOP: one workgroup per output whose threads each reduce a slice, then combine their partial
  results through local (shared) memory. The group is split over up to two reduce axes of the largest REDUCE; its
  thread count fits `max_workgroup_size` (else `max(local_max)`) and each local dim's `local_max`, and its
  partial-result slots fit `shared_max` bytes (checked by lowering the grouped reduce, so only a group that really
  becomes a workgroup reduction is kept). GPU dims are three, so a kernel with more output axes (a conv weight's
  four) first turns its smallest extra ones into whole LOCAL axes;
- otherwise the CPU register blocking and reduce unroll (matmuls, convs), then LOCAL splits of up to three output
  axes that become GPU dims: the axis contiguous in the store first (up to a warp, `warp_size`, for coalesced
  accesses), then the others, at most LOCAL_TARGET threads and within `local_max` per dim. An elementwise kernel
  on a renderer reading images (OpenCL `IMAGE=1`) first upcasts the store's contiguous axis by 4, so each thread
  uses whole float4 texels (constant channels, one read per texel).
"""
from __future__ import annotations

from tiny_uop.device import Renderer
from tiny_uop.dtype import PtrDType
from tiny_uop.helpers import USE_TC, prod
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen.opt.heuristic_common import (_output_axes_with_bounds, _register_block, _store_index, _try,
                                               _unroll_reduce, _upcast_contiguous)
from tiny_codegen.opt.kernel import Kernel, Opt, OptOps, _bound, stride_of

GROUP_MIN_REDUCE = 32    # reduce elements per output below which one thread's serial loop beats a workgroup
GROUP_MAX_OUTPUTS = 2048  # with more outputs, one thread per output already fills the GPU
GROUP_TARGET = 256       # at most this many threads cooperate on one reduce
LOCAL_TARGET = 128       # threads per workgroup the LOCAL splits aim for


def gpu_hand_coded_optimizations(k: Kernel) -> Kernel:
  """Apply the GPU heuristic opts to `k` (in place) and return it."""
  has_reduce = any(u.op is Ops.REDUCE for u in k.ast.toposort())
  # a matmul of tensor-core dtypes and shape: one warp per tile (TC takes the whole kernel; nothing applies after it)
  if USE_TC and has_reduce and k.renderer.tensor_cores and not k.applied_opts and _try(k, Opt(OptOps.TC, 0, -1)):
    return k
  if has_reduce and not k.applied_opts and _group_reduce(k): return k
  if has_reduce:
    _register_block(k, _store_index(k), k.loads())
    _unroll_reduce(k, k.loads())
  elif getattr(k.renderer, "images", False): _upcast_contiguous(k, _store_index(k))  # whole float4 texels a thread
  _add_locals(k)
  return k


def max_threads(ren: Renderer) -> int:
  """Threads one workgroup of `ren` may have."""
  if ren.max_workgroup_size is not None: return ren.max_workgroup_size
  return max(ren.local_max) if ren.local_max else 1 << 30


def _divisors(n: int, cap: int) -> list[int]:
  """Divisors d of n with 2 <= d <= cap, largest first."""
  return [d for d in range(min(n, cap), 1, -1) if n % d == 0]


def _group_plans(k: Kernel, red: UOp, budget: int) -> list[tuple[tuple[UOp, int], ...]]:
  """Ways to split `red`'s reduce axes into a group of <= `budget` threads: one axis, or two when one alone gives
  fewer than a warp; most threads first (then fewer axes)."""
  axes = sorted([r for r in red.src[1:] if r.arg[1] is AxisType.REDUCE and (_bound(r) or 0) > 1],
                key=lambda r: -(_bound(r) or 0))
  plans: list[tuple[tuple[UOp, int], ...]] = []
  for i, a in enumerate(axes):
    for d in _divisors(_bound(a) or 0, budget):
      plans.append(((a, d),))
      if d >= k.renderer.warp_size: continue
      for b in axes[i + 1:]:
        plans.extend(((a, d), (b, e)) for e in _divisors(_bound(b) or 0, budget // d))
  return sorted(plans, key=lambda p: (-prod(amt for _, amt in p), len(p)))


def _group_reduce(k: Kernel) -> bool:
  """GROUPTOP the largest REDUCE of a kernel with few outputs (see the module docstring). False: nothing applied."""
  ren = k.renderer
  if not ren.has_shared or k.dont_use_locals: return False
  outs = [_bound(r) for r in k.output_axes]
  if any(n is None for n in outs): return False
  nout = prod(n for n in outs if n is not None)
  reds = [u for u in k.ast.toposort() if u.op is Ops.REDUCE]
  sizes = [prod(_bound(r) or 0 for r in red.src[1:]) for red in reds]
  size, red = max(zip(sizes, reds), key=lambda x: x[0])
  if size < GROUP_MIN_REDUCE or (nout > GROUP_MAX_OUTPUTS and size < nout): return False
  # each thread reduces >= 4 elements once the group is bigger than 16
  budget = min(max_threads(ren), GROUP_TARGET, max(16, size // 4))
  # GPU dims are three: more output axes (a conv weight's) would leave one a loop around the reduce, which lowering
  # can't group; the smallest extra ones become whole LOCAL axes (more threads per workgroup instead)
  base = k.copy()
  loops = [r for r in base.output_axes if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL) and (_bound(r) or 0) > 1]
  for r in sorted(loops, key=lambda r: _bound(r) or 0)[:max(0, len(loops) - 3)]:
    budget //= _bound(r) or 1
    if budget < 2 or not _try(base, Opt(OptOps.LOCAL, base.output_axes.index(r), 0)): return False
  for plan in _group_plans(base, red, budget)[:8]:
    trial = base.copy()
    if all(_try(trial, Opt(OptOps.GROUPTOP, trial.reduce_axes.index(r), amt)) for r, amt in plan) and \
       _lowers_to_shared(trial):
      k.ast, k.applied_opts = trial.ast, trial.applied_opts
      return True
  return False


def _lowers_to_shared(k: Kernel) -> bool:
  """Whether lowering turns `k`'s GROUP_REDUCE axes into a workgroup reduction within the renderer's limits (it
  leaves them serial where the local dims or the shared memory wouldn't fit, or a reduce sits in a non-GPU loop)."""
  from tiny_codegen.lower.dims import group_reduces
  ren = k.renderer
  sink = group_reduces(k.get_optimized_ast(), ren)
  lds = [u for u in sink.toposort() if u.op is Ops.DEFINE_LOCAL]
  return bool(lds) and sum(u.dtype.size * u.dtype.base.itemsize for u in lds if isinstance(u.dtype, PtrDType)) \
    <= ren.shared_max


def _local_dims_fit(k: Kernel) -> bool:
  """The LOCAL axes (innermost = lidx0) within the renderer's per-dim `local_max`, at most 3."""
  loc = sorted([r for r in k.rngs if r.arg[1] is AxisType.LOCAL], key=lambda r: r.arg[0])
  lmax = k.renderer.local_max
  if len(loc) > 3: return False
  return lmax is None or all((_bound(r) or 0) <= lmax[i] for i, r in enumerate(reversed(loc)))


def _add_locals(k: Kernel) -> None:
  """LOCAL splits of up to three output axes among those that become GPU dims (see the module docstring). The
  contiguous axis is split last so it gets the newest axis id: the innermost local dim, lidx0, whose neighbouring
  threads then touch neighbouring addresses."""
  ren = k.renderer
  if not ren.has_local or k.dont_use_locals: return
  axes = [r for _, r, _ in _output_axes_with_bounds(k)][-3:]  # the innermost three become gidx dims
  if not axes: return
  sidx = _store_index(k)
  rngs = k.rngs
  contiguous = [r for r in axes if sidx is not None and stride_of(sidx, r, rngs) == 1]
  order = contiguous[:1] + [r for r in reversed(axes) if r not in contiguous[:1]]
  budget = min(max_threads(ren), LOCAL_TARGET)
  plan: list[tuple[UOp, int]] = []
  best, threads = k, 1
  for n, r in enumerate(order):
    cap = min(ren.warp_size, budget) if n == 0 else min(8, budget // threads)
    for amt in _divisors(_bound(r) or 0, cap):
      trial = k.copy()
      if all(_try(trial, Opt(OptOps.LOCAL, trial.output_axes.index(x), a)) for x, a in reversed([*plan, (r, amt)])) \
         and _local_dims_fit(trial):
        best, threads = trial, threads * amt
        plan.append((r, amt))
        break
    if threads >= budget: break
  k.ast, k.applied_opts = best.ast, best.applied_opts
