"""Hand-coded optimizations, chosen per renderer from the kernel's structure.

CPU renderers (no locals; threads split the outermost loop in lowering):
- matmul/conv-like reduces (a loaded buffer that doesn't depend on an output axis): register blocking — upcast the
  output axis that is contiguous in the store (16 lanes, 8 for convs; with native vectors (LLVM) the widest divisor
  up to 16 of a short conv row, which else got 4 or 2 scalar lanes: conv backward on a 10x10 map ran 7x faster) and
  one more reused axis (8), so each loaded value is used by several accumulators; a matmul's block then widens
  along its vector axis to half the renderer's vector registers (AVX-512: 8 rows x 2 vectors; AVX2: a vector of one
  register, 8 floats, 4 rows x 2 vectors; every block's accumulators within half the registers). Axes that a load
  indexes through div/mod (conv backward's windows) or as a sliding window (a conv's output row) are blocked last:
  their lanes share no loads, only index math;
- streaming reduces (each element read about once) whose reduce axis is strided in memory but whose innermost output
  axis is contiguous (a column sum, a split `sum()`'s partials): that output axis is upcast into vector accumulators;
- matrix-vector products (reuse below REUSE_MIN, a load the rows share): with native vectors, a float `x @ W` whose
  weight the output walks contiguously gets N as vectors of accumulators enough to hide the FMA latency
  (`_matvec_block`); a float `x @ W.T` (each output a dot product along a contiguous K, a multiple of the vector)
  is left to K's unroll with one accumulator a lane (`_dot_products`); else four row lanes share each load of the
  vector, except over packed bytes (a quantized weight), whose rows are read contiguously along K instead;
- sliding windows with no operand shared across channels (depthwise convs, poolings: `_window_vector`): the output
  row, which the input's window walks contiguously, becomes a native vector; a depthwise conv's channels then
  independent accumulators (`_window_channels`; a row split in several vectors, or a whole one whose filter row has
  fewer than `GATHER_TAPS_MIN` taps: `SPLIT_ROW_CHANNELS` of them);
- the innermost reduce axis of each REDUCE (a norm's mean and variance are two): a small one (a filter row, <= 8)
  is unrolled fully (the block leaves room for it); a larger contiguous one (a plain sum) is unrolled by up to 16,
  each lane its own accumulator (the expander), so independent adds hide the add latency, as long as the loop body
  is cheap (an unrolled exp2 only slows compiling); a short one the unroll leaves alone (a squeeze-excite's 7x7 mean:
  49, no divisor among 16/8/4) and not a multiple of a register's lanes gets its channels upcast by those lanes
  instead (`_short_reduce_channels`: one gathered vector a step, the fused producer's math in vectors);
- elementwise kernels: left to LLVM's loop vectorizer, but for a big output (streamed past the cache: the renderer's
  `nontemporal_min_bytes`), whose contiguous store axis is upcast to one cache line of lanes, for a transcendental
  (sigmoid, SiLU: `_upcast_transcendental`), whose store axis becomes one vector register of lanes, and for gathered
  or gated loads (`_upcast_awkward_elementwise`), whose store axis gets explicit lanes; a transpose (a load that
  gathers along the store's axis walks another one contiguously) has that other axis upcast first, a square block
  of vector loads (`_transpose_block`).
GPU renderers (`has_local`) have their own heuristics in `heuristic_gpu`; what both use is in `heuristic_common`.

A symbolic bound (a Variable batch or sequence, issue #39) weighs as its `representative_size` (the geometric middle
of its range) in every size decision (reuse, budgets, thresholds); the CPU blocks (`_vector_block`'s rows,
`_register_block`) upcast a symbolic axis by at most that size, its last block masked (`Kernel._split_tail`), but
for the store's contiguous axis on a vectorizing renderer, which gets up to one vector register of lanes (its tail is
one masked vector, PIPELINE.md §3: `_register_lanes`); unrolls stay on constant axes.

Thresholds that depend on the caches (when to pack B, when and how far to tile the rows, which row strides alias in
L1) are functions of the machine model (`tiny_codegen.machine`, `machine_of(renderer)`), each docstring saying how it
derives; the constants left (`PACK_MIN_BYTES_STRIDED`, `PACK_STRIDED_ROWS`, `PACK_MIN_ROWS`, `REUSE_MIN`, the unroll
budgets) weigh instruction costs, not cache sizes, and say so.
"""
from __future__ import annotations

import math

from tiny_uop.device import Renderer
from tiny_uop.dtype import PtrDType, dtypes
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen.lower.expander import LANE_ACCUMULATORS, VECTOR_LANES
from tiny_codegen.machine import Machine, fma_chains, machine_of
from tiny_codegen.opt.heuristic_common import (_awkward, _output_axes_with_bounds, _register_block, _store_index,
                                               _trips, _try, _unroll_reduce, _upcast_contiguous,
                                               symbolic_output_axes)
from tiny_codegen.opt.kernel import MAX_LANES, Kernel, Opt, OptOps, _bound, stride_of


def hand_coded_optimizations(k: Kernel) -> Kernel:
  """Apply the heuristic opts for `k.renderer` to `k` (in place) and return it."""
  ren: Renderer = k.renderer
  if ren.has_local and not k.dont_use_locals:
    from tiny_codegen.opt.heuristic_gpu import gpu_hand_coded_optimizations
    return gpu_hand_coded_optimizations(k)
  has_reduce = any(u.op is Ops.REDUCE for u in k.ast.toposort())
  sidx = _store_index(k)
  loads = k.loads()
  if has_reduce:
    matvec = False
    if (blocked := _reuse(k, loads) >= REUSE_MIN):
      if not (ren.vectorize_upcast and (_fused_prologue_block(k, loads) or _vector_block(k, loads))):
        _register_block(k, sidx, loads)
    elif ren.vectorize_upcast and (matvec := _matvec_block(k, sidx, loads)): blocked = True
    elif not (ren.vectorize_upcast and (_window_vector(k, sidx, loads) or _dot_products(k, loads))):
      _shared_load_block(k, loads)  # (a dot product's K: lane accumulators from `_unroll_reduce` instead)
    # vector accumulators only where nothing above upcast (a matrix-vector product has its four shared-load lanes)
    # a register-blocked matmul has independent accumulators enough: unrolling its K as well (AVX2's 4 x 2 x 8
    # block, 64 lanes) ran 1.6x slower
    # (nor a matvec block: its vectors are the accumulators that hide the latency)
    latency = not (blocked and k.upcast_size >= BLOCK_NO_UNROLL_LANES and _gemm_like(k, loads)) and not matvec
    if not _unroll_reduce(k, k.loads(), latency) and not blocked and k.upcast_size == 1:
      _vector_accumulators(k, sidx, k.loads())
    elif not blocked and not matvec and k.upcast_size == 1 and ren.vectorize_upcast:
      _short_reduce_channels(k, sidx, k.loads())  # (a contiguous reduce its unroll left alone)
  elif not ren.has_threads:
    _upcast_contiguous(k, sidx)
  elif ren.vectorize_upcast:
    _upcast_stacked(k, sidx, loads)
    _upcast_awkward_elementwise(k, sidx, loads)
    if k.upcast_size == 1: _upcast_streaming_store(k, sidx)
    if k.upcast_size == 1: _upcast_transcendental(k, sidx)
    if k.upcast_size == 1: _upcast_short_row(k, sidx)
  return k


REUSE_MIN = 4
"""Register blocking only for kernels that re-read their data at least this many times on average (matmuls, convs,
attention scores): a streaming reduction (a layernorm over a recomputed residual sum, a bias gradient) reads each
element about once, so copying its body per lane only costs compile time (and registers), whatever small vector
(a bias) the lanes would share."""


def _reuse(k: Kernel, loads: list[UOp]) -> float:
  """How many times the kernel's loads read each element they touch, on average: the loads executed over the
  elements they can touch (the product of the bounds of the ranges in its index). A load that walks a reduce range
  runs once per iteration of that reduce's loop nest (the output loops it sits in, then its own); one under a REDUCE
  that doesn't walk its ranges is hoisted out of them (once per element it touches); one outside every reduce runs
  once per output element."""
  out_iters = _trips(k.output_axes)
  inner: dict[UOp, UOp] = {}  # load -> the innermost REDUCE it sits under
  for red in (u for u in k.ast.toposort() if u.op is Ops.REDUCE):
    for x in red.src[0].toposort(gate=lambda x: x.op is not Ops.REDUCE):
      if x.op is Ops.LOAD: inner[x] = red
  executed = touched = 0
  for ld in loads:
    fp = _trips(ld.src[0].src[1].ranges)
    if (rd := inner.get(ld)) is not None:
      walks = any(r in ld.ranges for r in rd.src[1:])
      n = _trips({**rd.ranges, **dict.fromkeys(rd.src[1:])}) if walks else fp
    else: n = out_iters
    executed, touched = executed + n, touched + fp
  return executed / max(touched, 1)


def _shared_load_block(k: Kernel, loads: list[UOp]) -> None:
  """A reduction that reads most of its data once (reuse below REUSE_MIN) but has a load some output axis doesn't move
  (a matrix-vector product: the vector, shared by every output row) gets that axis upcast by 4: four independent
  accumulators sharing each load of the vector, where one accumulator chains every add (latency-bound). On the CPU
  (LLVM, one thread) a 2048x768 f32 matrix-vector product ran 2.4x faster (1.0 -> 0.42 ms), a 768x2048 one too."""
  for _, r, n in _output_axes_with_bounds(k):
    if _packed_rows(r, loads): continue
    if n % 4 == 0 and any(r not in ld.src[0].src[1].ranges for ld in loads):
      _try(k, Opt(OptOps.UPCAST, k.output_axes.index(r), 4))
      return


def matvec_accumulators(m: Machine) -> int:
  """The independent vector accumulators a matrix-vector product needs to issue an FMA every slot (FMA latency x FMAs
  a cycle: 8 on AVX2, AVX-512 and NEON cores with two FMA pipes, 4 with one): the machine model's `fma_chains`."""
  return fma_chains(m)


def _matvec_block(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> bool:
  """A float matrix-vector product whose weight is walked contiguously along the output (`x @ W`, W K x N row-major:
  the reduce strided, a row of W per step), with a batch of a few rows (reuse below REUSE_MIN: 1 or 2): the weight's
  contiguous axis N becomes `v` native vectors (`vector_bytes` / itemsize lanes each) of accumulators and the batch
  rows are upcast whole, so each step of K loads `v` vectors of one row of W (whole lines, the prefetcher's stream),
  shares each across the batch rows and issues rows x v independent FMAs. `v` is the fewest vectors whose rows x v
  accumulators reach `matvec_accumulators` (the FMA latency hidden), within `ACC_REGISTER_SHARE` of the registers,
  dividing N, and leaving at least one block of N a core (the threads split N: each reads a disjoint part of W).
  Where before the product had four scalar-strided lanes of N (16 bytes of each row of W a step) and one chain of
  adds: one row, TinyJit, two threads, Xeon 6/207 (AVX-512, load 2-3): 768x768 283 -> 54 us (numpy 34), 768x2048
  870 -> 157 (numpy 125); two rows of 768x768 624 -> 69 (numpy 113). False (nothing applied) where N is not a
  multiple of 4 lanes (N a multiple of half a register only: that many lanes, e.g. 1000 = 125 x 8 on AVX-512), the
  weight is packed bytes (`_packed_rows`), or the register file is unknown."""
  regs, width, itemsize = _register_file(k)
  if sidx is None or not regs or not width or width % itemsize: return False
  if any(not dtypes.is_float(u.dtype) for u in k.ast.toposort() if u.op is Ops.REDUCE): return False
  if any(len(ld.src[0].src) > 2 for ld in loads): return False  # gated (padded) loads: not a plain product
  rngs, outs = k.rngs, _output_axes_with_bounds(k)
  if not outs or len(k.reduce_axes) != 1: return False
  i, r, n = outs[-1]
  walked = [ld for ld in loads if r in ld.src[0].src[1].ranges]
  # a matrix-vector product: besides the weight a vector that N doesn't move (a column sum has none: its own rule)
  if len(walked) == len(loads) or stride_of(sidx, r, rngs) != 1 or not walked or _packed_rows(r, loads): return False
  if not all(stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in walked): return False
  # the register's lanes, else half of them and so on down to 4 (N = 1000 on AVX-512: 8 lanes, a half register)
  m = machine_of(k.renderer)
  lanes = next((w for w in (width // itemsize >> s for s in range(4)) if w >= 4 and n % w == 0), 0)
  if not lanes: return False
  batch = [(j, x, b) for j, x, b in outs[:-1] if all(x not in ld.src[0].src[1].ranges for ld in walked)]
  rows = 1
  for _, _, b in batch: rows *= b
  budget = int(regs * ACC_REGISTER_SHARE)
  if rows > budget or len(batch) != len(outs) - 1: return False
  want = min(-(-matvec_accumulators(m) // rows), budget // rows)
  cores = max(1, getattr(k.renderer, "threads", 1) or 1)
  v = next((c for c in range(want, 0, -1) if n % (lanes * c) == 0 and n // (lanes * c) >= cores), 1)
  if not _try(k, Opt(OptOps.UPCAST, i, lanes)): return False
  for rid, amt in [(r.arg[0], v)] + [(x.arg[0], b) for _, x, b in batch]:
    left = [j for j, x in enumerate(k.output_axes) if x.arg[0] == rid and x.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)]
    if amt > 1 and left: _try(k, Opt(OptOps.UPCAST, left[0], amt))
  return True


def _dot_products(k: Kernel, loads: list[UOp]) -> bool:
  """A float matrix-vector product whose loads all walk the (one) reduce axis K contiguously (`x @ W.T`: nn.Linear's
  and ONNX Gemm transB's layout, each output a dot product): True (nothing upcast here) when K is a multiple of the
  vector's lanes (`vector_bytes` / itemsize, at most the expander's `LANE_ACCUMULATORS`), so that the K unroll of
  `_unroll_reduce` keeps one accumulator a lane (the expander's lane accumulators, one vector that LLVM packs: a
  horizontal sum once at the end). `_shared_load_block`'s four output lanes would make the reduce a blocked one,
  whose unrolled lanes the expander adds up every step: a scalar chain. One row of 768x768 (TinyJit, two threads,
  Xeon 6/207 AVX-512, load 2): 85-88 -> 28-29 us (numpy 19); two rows 124-324 -> 60 us (numpy 184-196). Only the
  loads under the REDUCE count: an ONNX Gemm's bias added after it (a load no K step reads) had sent a CNN's
  classifier head to `_shared_load_block`'s gathered lanes, 2x slower (bench/README.md, issue #39 session 8)."""
  regs, width, itemsize = _register_file(k)
  if not regs or not width or len(k.reduce_axes) != 1 or not loads: return False
  if any(not dtypes.is_float(u.dtype) for u in k.ast.toposort() if u.op is Ops.REDUCE): return False
  if any(not dtypes.is_float(ld.dtype) or len(ld.src[0].src) > 2 for ld in loads): return False
  r, rngs = k.reduce_axes[0], k.rngs
  lanes = min(width // itemsize, LANE_ACCUMULATORS)
  n = _bound(r)
  if n is None or lanes < 2 or n % lanes: return False
  # the product's operands: the loads under its REDUCE (an epilogue's bias, loaded once an output, is no operand)
  inner = [ld for ld in loads if any(ld in red.src[0].toposort() for red in k.ast.toposort() if red.op is Ops.REDUCE)]
  shared = any(any(x not in ld.src[0].src[1].ranges for _, x, _ in _output_axes_with_bounds(k)) for ld in inner)
  return shared and all(stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in inner)


def _window_vector(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> bool:
  """A sliding-window reduce with no operand reused across output channels (a depthwise conv: each channel its own
  filter; a pooling), so `_vector_block` finds no vector to share and `_reuse` counts each window as read once: the
  output axis contiguous in the store, which a load walks contiguously as a window (the input row: the same stride
  as a filter axis), becomes a native vector (`_window_width`: the widest divisor from 4 to 16, a 14- or 7-wide row
  whole, a 56-wide one 14 lanes; cut to one register where a wider vector would span two and the row allows it, as in
  `_vector_block`). Each filter tap is then one vector of the input row times a broadcast of the tap's weight, where
  scalar lanes loaded and multiplied one pixel at a time. efficientnet_b0's depthwise convs, one thread on the
  loaded Xeon 6/207 (AVX-512), per kernel: 672x14x14 5x5 2106 -> 524 us, 144x56x56 3x3 1902 -> 446, 32x112x112 3x3
  1813 -> 277, 1152x7x7 5x5 850 -> 185 (torch, one thread: 163, 501, 457, 124). A stride-2 window (`_window_row`)
  reads each tap as one wide load and a shuffle (the expander's strided lanes; gathered before, when it still got
  one vector FMA per tap: 672x7x7 from 14x14, 5x5, 453 -> 102 us, 96x56x56 from 112x112, 3x3, 995 -> 855), a max
  pool's too (`WINDOW_STRIDES`). False (nothing applied) when no axis qualifies."""
  if sidx is None: return False
  rngs, reds = k.rngs, k.reduce_axes
  outs = _output_axes_with_bounds(k)
  if not outs or not reds: return False
  i, r, n = outs[-1]
  if stride_of(sidx, r, rngs) != 1 or not (amt := _window_width(n)): return False
  if not any(_window_row(ld.src[0].src[1], r, rngs, reds) for ld in loads): return False
  regs, width, itemsize = _register_file(k)
  if width and amt * itemsize > width and n % (width // itemsize) == 0: amt = width // itemsize
  # a filter's taps: a load the row doesn't move (a conv's weight; a pool has none), told before the row is split
  weighted = any(r not in ld.src[0].src[1].ranges and any(x in ld.src[0].src[1].ranges for x in reds) for ld in loads)
  if not _try(k, Opt(OptOps.UPCAST, i, amt)): return False
  # a whole row of a conv (a sum) at stride 1 or 2; a max pool blocks its output rows instead (`_pool_rows`)
  strides = (1, 2) if all(u.arg is Ops.ADD for u in k.ast.toposort() if u.op is Ops.REDUCE) else (1,)
  if (amt == n or weighted) and any(_window_row(ld.src[0].src[1], r, rngs, reds, strides) for ld in loads):
    gathered = amt == n and _row_taps(loads, r, rngs, reds) >= GATHER_TAPS_MIN  # whole: channels the vector
    _window_channels(k, r, amt * itemsize, regs, width, None if gathered else SPLIT_ROW_CHANNELS)
  elif not weighted and all(u.arg is Ops.MAX for u in k.ast.toposort() if u.op is Ops.REDUCE):
    _pool_rows(k, r, amt * itemsize, regs, width)
  return True


POOL_TAPS = 8
"""The filter axes `_pool_rows` unrolls whole: those of at most this many taps (a 3x3 or 5x5 pool's)."""


def _pool_rows(k: Kernel, row: UOp, row_bytes: int, regs: int, width: int) -> None:
  """After `_window_vector` made a max pool's output row the vector (`row`, `row_bytes` of accumulator), its output
  rows (the axis that moves the input by a window stride times the filter's row axis) are upcast by the largest
  divisor up to the machine's `fma_chains` (latency x vector pipes: the independent chains that keep the units busy),
  within `ACC_REGISTER_SHARE` of the vector registers at the row's registers each, and its filter axes (`POOL_TAPS`)
  unrolled whole. A pool's window is one chain of dependent maxes (three vector ops each with the NaN select), and
  its output rows overlap: a 3x3/2's input row 2y+1 is its output rows y's and y+1's, loaded once for both (with
  the expander's shared taps, one wide load and three shuffles a row). resnet18's 3x3/2 max pool, padding 1, on
  1x64x112x112, one thread of the Zen 4 (znver4, fma_chains 8), TinyJit, thread CPU time, least of 40: 227 us (the
  filter row alone unrolled, one output row) -> 211 (the window unrolled) -> 165 (2 rows) -> 141-142 (4, 7 or 8)."""
  rngs, reds, loads = k.rngs, k.reduce_axes, k.loads()
  chains = fma_chains(machine_of(k.renderer))
  if regs and width: chains = min(chains, int(regs * ACC_REGISTER_SHARE) // -(-row_bytes // width))
  for j, x, n in _output_axes_with_bounds(k):
    if x is row or not any(_window_rows(ld.src[0].src[1], x, rngs, reds) for ld in loads): continue
    if (amt := next((a for a in range(min(n, chains), 1, -1) if n % a == 0), 0)): _try(k, Opt(OptOps.UPCAST, j, amt))
    break
  for r in list(k.reduce_axes):
    if (t := _bound(r)) is not None and t <= POOL_TAPS: _try(k, Opt(OptOps.UNROLL, k.reduce_axes.index(r), 0))


def _window_rows(idx: UOp, x: UOp, rngs: list[UOp], reds: list[UOp]) -> bool:
  """Whether index `idx` walks output axis `x` by a window stride (`WINDOW_STRIDES`) times the stride of one of the
  reduce axes `reds` it depends on: `x` is a window's output rows, that reduce axis the filter's rows."""
  if not (sx := stride_of(idx, x, rngs)): return False
  return any(y in idx.ranges and (sy := stride_of(idx, y, rngs)) and sx in [s * sy for s in WINDOW_STRIDES]
             for y in reds)


def _window_channels(k: Kernel, row: UOp, row_bytes: int, regs: int, width: int, most: int | None = None) -> None:
  """After `_window_vector` made a stride-1 output row, whole (`row`), its lanes (`row_bytes` of accumulators), a
  depthwise conv's channels (the output axis its weight's load walks: a load of the filter taps that the row doesn't
  move) are upcast too: the largest divisor of the channels up to the machine's `fma_chains` (FMA latency x FMA
  pipes), within `ACC_REGISTER_SHARE` of the vector registers at the row's registers each. Alone, the row is one
  accumulator whose chain of dependent FMAs over every tap waits on the FMA latency. With the channels the expander
  makes them the vector (the channels-last taps are contiguous along them: one vector load a tap) and each pixel of
  the row its own accumulator, its input gathered one plane a lane: as many independent chains as pixels, the
  padding known when compiling (the row is whole). A pool (no weight) is left as it was. One thread of the Zen 4
  (AVX-512, fma_chains 8), the conv alone under TinyJit, thread CPU time, least of 60, no channels -> 8:
  672x14x14 5x5 150 -> 108 us, 1152x7x7 5x5 82 -> 51. A whole stride-2 row too, now that its taps are wide loads
  and shuffles, not gathers (the expander's strided lanes): 672x7x7 from 14x14 5x5 81 -> 53, 288x7x7 from 14x14
  5x5 36 -> 24, 14-wide rows even (96x14x14 from 28x28 5x5 41 -> 39, 240x14x14 from 28x28 3x3 37 -> 38; with
  gathered lanes 240x14x14 had measured 41 -> 47). Not a row split in several vectors (its edge vectors' padding
  gated per lane at run time), where the blocks measured no better or worse: 144x56x56 3x3 252 -> 306 with 8 (196
  with 4), 32x112x112 3x3 127 -> 277, 240x28x28 5x5 220 -> 245. A row split in several vectors, and a whole one
  whose filter row has fewer than `GATHER_TAPS_MIN` taps (a 3x3: each gathered lane used by 3 taps only), gets at
  most `most` channels (`SPLIT_ROW_CHANNELS`), its vector staying the row."""
  reds, loads = k.reduce_axes, k.loads()
  taps = [ld for ld in loads if row not in ld.src[0].src[1].ranges and any(x in ld.src[0].src[1].ranges for x in reds)]
  if not taps: return
  chains = fma_chains(machine_of(k.renderer)) if most is None else min(most, fma_chains(machine_of(k.renderer)))
  if regs and width: chains = min(chains, int(regs * ACC_REGISTER_SHARE) // -(-row_bytes // width))
  for j, x, n in reversed(_output_axes_with_bounds(k)):
    if not all(x in ld.src[0].src[1].ranges for ld in taps): continue
    if (amt := next((a for a in range(min(n, chains), 1, -1) if n % a == 0), 0)): _try(k, Opt(OptOps.UPCAST, j, amt))
    return


SPLIT_ROW_CHANNELS = VECTOR_LANES[0] - 1
"""The channels `_window_channels` gives a depthwise conv whose output row `_window_vector` split in several vectors
(a 56-wide row as 4 x 14 lanes): fewer than the expander's narrowest vector, so the channels stay independent
accumulators, each its own chain of FMAs, and the row stays the vector (4 or more, the expander's `_vector_axis` may
pick the channels, whose contiguous tap loads outscore the row's, as for a whole row: 4-lane vectors, each pixel an
accumulator, the epilogue (a SiLU) run on quarter registers; 240x28x28 5x5 + SiLU, one thread, 328 -> 452 us). Its
padding (the vectors' border lanes) stays one masked load a tap. One thread of the Zen 4 (znver4), a depthwise conv
+ SiLU + its squeeze-excite under TinyJit, the conv's kernel alone, thread CPU time, least of 30, two turns, one
channel -> 3 (2 for 32 channels): 144x56x56 3x3 494 -> 381-390 us, 240x28x28 5x5 327-330 -> 271-285, 32x112x112 3x3
244-255 -> 223-232, 96x56x56 from 112 3x3 363-364 -> 293-312, 96x56x56 from 112 5x5 731-759 -> 637-650, 144x28x28
from 56 5x5 280-295 -> 249-299."""


GATHER_TAPS_MIN = 4
"""The filter-row taps from which `_window_channels` makes a whole row's channels the vector (each pixel an
accumulator, its input gathered a lane at a time: a scalar load and an insert on the shuffle port a lane, that lane
then used by up to a row's taps of FMAs) rather than leaving the row the vector with `SPLIT_ROW_CHANNELS` channels
(each tap one vector load of the row and a weight broadcast, no gathers). An instruction-cost weight, not a cache
size: the gather pays where its lane feeds 4 or more taps. One thread of the Zen 4 (znver4), a depthwise conv +
activation + its squeeze-excite under TinyJit, the conv's kernel alone, thread CPU time, least of 40, channels the
vector -> the row: 3x3 480x14x14 94 -> 61 us, 240x14x14 from 28 68 -> 38, 576x7x7 31 -> 26, 384x14x14 from 28
109 -> 61; 5x5 (left to the channels) 672x14x14 167 -> 172, 1152x7x7 78 -> 103, 672x7x7 from 14 69 -> 74, 576x7x7
(hardswish) 26 -> 34, 96x14x14 from 28 39 -> 30 (SiLU), 22 -> 23 (hardswish)."""


def _row_taps(loads: list[UOp], r: UOp, rngs: list[UOp], reds: list[UOp]) -> int:
  """The taps of a filter row (`_window_vector`'s output row `r`): the largest bound of a reduce axis that a load
  walking `r` as a window (`_window_row`) walks contiguously (the filter's column); 0 when none is known."""
  return max((b for ld in loads if _window_row(idx := ld.src[0].src[1], r, rngs, reds) for x in reds
              if x in idx.ranges and stride_of(idx, x, rngs) == 1 and (b := _bound(x)) is not None), default=0)


def _window_width(n: int) -> int:
  """The lanes of a window row's vector (`_window_vector`): the widest divisor of the row's `n` from 4 to 16 (0: none),
  where `_vector_width` prefers 8 to the widest: a 56-wide row as 14 lanes, whose four vectors LLVM widens to 16,
  ran 3.4x faster than as 8 (144x56x56 3x3 depthwise, one thread: 2205 -> 637 us; 96x56x56 5x5 1507 -> 1160); a
  112-wide row as 16 and 14 within 5%."""
  return next((a for a in range(min(n, 16), 3, -1) if n % a == 0), 0)


WINDOW_STRIDES = (1, 2)
"""The strides along the output row with which `_window_vector` vectorizes a window (1: each tap one contiguous
vector; 2: a stride-2 conv or pool, each tap one load of twice the lanes and a shuffle keeping every other element,
the expander's `STRIDED_LANES`); wider strides are left. A max pool's stride-2 row was kept scalar while its lanes
were gathered one by one (resnet18's 3x3 stride-2 max pool, padding 1, on 2x64x112x112, one thread, Xeon 6/207:
4384 -> 1142 us as a TinyJit replay against the gathered vector); as a wide load, the padding a mask, it is faster than
the scalar window: 1x64x112x112, one thread, thread CPU time, least of 30, Zen 4 (znver4): 440 -> 331-334 us."""


def _window_row(idx: UOp, r: UOp, rngs: list[UOp], reds: list[UOp],
                strides: tuple[int, ...] = WINDOW_STRIDES) -> bool:
  """Whether index `idx` walks output axis `r` as a sliding window along a row: with a stride in `strides`,
  while one of the reduce axes `reds` it depends on (the filter's column) walks it contiguously."""
  return stride_of(idx, r, rngs) in strides and \
    any(x in idx.ranges and stride_of(idx, x, rngs) == 1 for x in reds)


def _packed_rows(r: UOp, loads: list[UOp]) -> bool:
  """True when every load the output axis `r` moves reads bytes (a matrix-vector product over a quantized weight:
  uint8 blocks decoded in the kernel): lanes along `r` would each gather single bytes a row of blocks apart, where
  the K unroll that `_unroll_reduce` gives the kernel instead reads each row's bytes contiguously. Q8_0 and Q4_K
  2048x768 matvecs (CPU, 2 threads, loaded Xeon 6/207, min of 25): 469 -> 250 and 783 -> 654 us."""
  moved = [ld for ld in loads if r in ld.src[0].src[1].ranges]
  return bool(moved) and all(ld.dtype.itemsize == 1 for ld in moved)


FUSED_ROWS = 2
"""Query rows `_fused_prologue_block` blocks together (each row's statistic loaded once for its whole value row)."""


def fused_row_vectors(m: Machine) -> int:
  """The vectors of one output row `_fused_prologue_block` makes at most: its FUSED_ROWS rows x this many vectors are
  the block's accumulators, as many as keep the FMA units busy (`fma_chains`: 8 -> 4 vectors a row)."""
  return max(1, fma_chains(m) // FUSED_ROWS)


def _fused_prologue_block(k: Kernel, loads: list[UOp]) -> bool:
  """A matmul whose left operand is computed per element from a per-row statistic (attention's P @ V with the
  softmax's normalization fused: `exp(s - max) * (1/sum)`, the NaN guard) and whose right operand is a row the
  store walks contiguously (V, 64 wide, maybe plus its bias): that row is the vector, whole (up to
  `fused_row_vectors` vectors), and FUSED_ROWS rows are blocked, so each left element is computed once per block of rows
  and broadcast over the whole row; a vector across the rows (the 1/sum is contiguous there) gathered the left
  operand and recomputed it once per 8 columns. 2 heads x 64 x 64 x 64, one thread of the Xeon 6/207, both
  layouts compiled in one process and timed in turns: BERT's 33.7 -> 15.0 us, GPT-2's 28.4 -> 16.7 us.
  False (nothing applied) when the kernel isn't one."""
  sidx, rngs, reds = _store_index(k), k.rngs, k.reduce_axes
  regs, width, itemsize = _register_file(k)
  if sidx is None or len(reds) != 1 or not width: return False
  red = next((u for u in k.ast.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ADD and len(u.src) == 2), None)
  if red is None or red.src[0].op is not Ops.MUL or red.src[1] is not reds[0]: return False
  lanes = width // itemsize
  for i, d, n in _output_axes_with_bounds(k):
    if stride_of(sidx, d, rngs) != 1 or n % lanes or n > fused_row_vectors(machine_of(k.renderer)) * lanes: continue
    for a, b in (red.src[0].src, red.src[0].src[::-1]):
      b_loads = [u for u in b.toposort() if u.op is Ops.LOAD and d in u.ranges]  # V (plus its bias: BERT's)
      if d in a.ranges or not b_loads or any(stride_of(u.src[0].src[1], d, rngs) != 1 for u in b_loads): continue
      rows = [(j, x, m) for j, x, m in _output_axes_with_bounds(k) if x in a.ranges and x not in b.ranges]
      # a computed per element (not a plain load) from a statistic of its row (a load not over the reduce axis)
      stat = [u for u in a.toposort() if u.op is Ops.LOAD and reds[0] not in u.ranges and rows[0][1] in u.ranges] \
        if len(rows) == 1 else []
      if a.op is Ops.LOAD or not stat or rows[0][2] % FUSED_ROWS: continue
      return _try(k, Opt(OptOps.UPCAST, i, lanes)) and _try(k, Opt(OptOps.UPCAST, i, n // lanes)) and \
        _try(k, Opt(OptOps.UPCAST, rows[0][0], FUSED_ROWS))
  return False


def _vector_block(k: Kernel, loads: list[UOp]) -> bool:
  """Register blocking around a native vector (renderers whose expander vectorizes an UPCAST axis): the output axis
  (16 or 8 lanes, else the widest divisor from 4 to 16: a conv's 20-wide row as 10) that a load walks contiguously
  while other output axes don't move it — that load is one vector, reused by every lane of those axes (conv: the
  input row, reused across output channels; matmul: a row of B, reused across rows of A); of two as wide, the one
  the store walks contiguously in a GEMM-shaped kernel (`_store_vector_axis`), then the one reused across more axes.
  Then those axes are blocked (8/4/2 lanes) up to 8 vector accumulators. False if no axis qualifies (nothing
  applied)."""
  rngs, outs = k.rngs, _output_axes_with_bounds(k)
  best: tuple[int, int, int, int, UOp, list[tuple[int, UOp, int]]] | None = None
  store_axis = _store_vector_axis(k, loads)
  for i, r, n in outs:
    if not (amt := _vector_width(n)): continue
    for ld in loads:
      idx = ld.src[0].src[1]
      if stride_of(idx, r, rngs) != 1: continue
      others = [(j, x, m) for j, x, m in outs + symbolic_output_axes(k) if x is not r and x not in idx.ranges]
      key = (amt, int(r is store_axis), len(others))
      if others and (best is None or key > best[:3]): best = (*key, i, r, others)
  if best is None: return False
  amt, _, _, i, r, others = best
  gemm = _gemm_like(k, loads)
  regs, width, itemsize = _register_file(k)
  if width and amt * itemsize > width and (r_n := _bound(r)) and r_n % (width // itemsize) == 0:
    amt = width // itemsize  # one register per vector (AVX2: 8 floats); a matmul's `_widen_vector_block` adds more
  if not _try(k, Opt(OptOps.UPCAST, i, amt)): return False
  vectors, budget, blocked = 1, 8, 0
  if regs and width:  # the accumulators within ACC_REGISTER_SHARE of the registers (a matmul's rows in half of it,
    # leaving room to widen). On AVX2 (16 ymm) 8 x 16 lanes took all 16 and spilled in the reduce loop: 1024^2 f32,
    # one thread on znver3, 26 -> 36 GFLOPS as 4 rows x 2 x 8 lanes; conv2 of the MNIST step (32 -> 32 channels, 5x5,
    # 24x24 maps) 37 -> 56 GFLOPS as 8 channels x 4 pixels x 2 rows (119 -> 24 stack accesses in the loop)
    budget = max(2, min(8, int(regs * ACC_REGISTER_SHARE) // -(-amt * itemsize // width) // (2 if gemm else 1)))
  # block (up to two of) the axes the vector is reused across: plain ones first, innermost first
  others.sort(key=lambda o: (_awkward(o[1], loads, rngs, k.reduce_axes)[0], -o[0]))
  rows: tuple[int, int] | None = None  # (id, lanes) of the first axis blocked around the vector
  padded = [x for _, x, _ in others if _padded_window(x, loads, rngs, k.reduce_axes)]
  taps = False  # the first axis blocked is a window's taps (`_window_taps`: a conv's weight gradient)
  windows: list[UOp] = []  # the sliding-window axes blocked (a conv's output pixels)
  for _, x, m in others:
    if x in padded and padded[0] is not x: continue  # one padded window axis only (`_padded_window`)
    got = _row_block(x, m, budget // vectors, widest=x in padded)
    first_taps = rows is None and _window_taps(x, loads, rngs, k.reduce_axes)
    if got and _try(k, Opt(OptOps.UPCAST, k.output_axes.index(x), got)):
      vectors, blocked = vectors * got, blocked + 1
      rows, taps = rows or (x.arg[0], got), taps or first_taps
      if _awkward(x, loads, rngs, k.reduce_axes)[1]: windows.append(x)
    if blocked == 2 or vectors * 2 > budget: break
  if gemm: _widen_vector_block(k, r.arg[0], amt, vectors)
  elif taps: _widen_for_latency(k, r.arg[0], amt, vectors)
  elif windows and not _awkward(r, loads, rngs, k.reduce_axes)[1]: _widen_conv_channels(k, r.arg[0], amt, vectors)
  if gemm and rows is not None: _tile_rows(k, *rows)
  return True


def _store_vector_axis(k: Kernel, loads: list[UOp]) -> UOp | None:
  """In a GEMM-shaped kernel (`_gemm_like`), the output axis its store walks contiguously: `_vector_block` takes it
  as the vector over another candidate as wide (both operands walk an output axis contiguously: a 1x1 conv on NCHW
  maps, whose channels-last weight walks the output channels and whose input walks the pixels; `a.T @ b`). Each
  output vector is then one store, where a vector along the other axis is stored across rows: LLVM transposes the
  block with about one shuffle per lane of each output vector, on the FP ports the FMAs and the epilogue use, which
  a short reduce (a few FMAs per output) does not amortize. The block is then the other axis' rows around the
  vector, as many as `_vector_block` gives a GEMM's rows (a quarter of the vector registers: 8 on AVX-512, the
  `fma_chains` that keep its two FMA pipes busy), widened along the vector where what is left of it divides.
  16 rows around one vector spilled in the SiLU epilogue (967 us), 4 x 2 rows x 16 pixels 866, 8 x 2 768.
  On the 2-core znver4 (one thread, thread CPU time, least of 40, load ~5-10): efficientnet's 16 -> 96 1x1 conv +
  SiLU on 112x112 885-905 -> 695-741 us (16 pixels x 8 channels, where 2 x 16 channels x 8 pixels were), 32 -> 16
  221 -> 178 us, 64 -> 96 1981 -> 1813-1843, 256 -> 96 (no activation) 8.6-9.6 -> 6.2-6.4 ms; `a.T @ b` 16 x 512 x
  512 124-130 -> 84-88 us, K=64 256^2 85 -> 79-81, K=512 589-605 -> 584-593."""
  sidx = _store_index(k)
  if sidx is None or not _gemm_like(k, loads): return None
  return next((r for r in k.output_axes if stride_of(sidx, r, k.rngs) == 1), None)


def _window_taps(x: UOp, loads: list[UOp], rngs: list[UOp], reds: list[UOp]) -> bool:
  """Output axis `x` slides over a longer reduce axis in some load (the same stride in its index, `_awkward`'s
  window) and is the shorter of the two: it is a window's taps, the reduce its pixels (a conv's weight gradient:
  kw taps over ow pixels, where a conv's forward has ow pixels over kw taps)."""
  if (n := _bound(x)) is None: return False
  for ld in loads:
    idx = ld.src[0].src[1]
    if x not in idx.ranges or (s := stride_of(idx, x, rngs)) is None: continue
    for red in reds:
      if red in idx.ranges and stride_of(idx, red, rngs) == s and (m := _bound(red)) is not None and m > n: return True
  return False


def _widen_for_latency(k: Kernel, rid: int, amt: int, vectors: int) -> None:
  """After `_vector_block` blocked a window's taps around the vector (a conv's weight gradient: output channels as
  the vector, a kernel row's 5 taps as the rows; `_window_taps`) into fewer accumulators than keep the FMA units
  busy (`matvec_accumulators` of the machine model: FMA latency x FMAs a cycle), the vector axis is upcast again
  (`_widen`, within the register budget): each reduce step's broadcast load then feeds that many more independent
  FMAs instead of waiting on the chains. The MNIST step's 32 -> 32 channel 5x5 weight gradient: co 16 x 5 taps = 5
  chains, 25-26 ms of thread CPU on one thread; co 2 x 16 x 5 = 10 chains, 16 ms (torch: 20)."""
  if vectors < matvec_accumulators(machine_of(k.renderer)): _widen(k, rid, amt, vectors, (4, 3, 2))


def _widen_conv_channels(k: Kernel, rid: int, amt: int, vectors: int) -> None:
  """After `_vector_block` blocked a conv's output pixels (`vectors` accumulators of `amt` output channels, the
  channels-last weight's vector along the axis of id `rid`), take a second vector of output channels (by 2: the
  first that divides what is left of the axis) while the accumulators fit `ACC_REGISTER_SHARE` of the vector
  registers (`_widen`; AVX-512's 32: 2 x 8 pixels, 2 x 7; AVX2's 16: none past 4 pixels). Each input pixel's
  broadcast then feeds two FMAs: per filter tap 2 weight vectors + P broadcasts for 2P FMAs, where one vector left
  P + 1 loads for P FMAs, and the core's load ports, not its FMAs, set the pace. Not where the weight strip one
  block reads over its reduce (`_l1_weight_strip`) fits half the L1d and twice it would not: the block's output
  rows re-read it from the L1 (a split reduce's 32-channel chunk of resnet18's 512 -> 512 conv, 18 KB: 2021 ->
  2297 us widened). resnet18's stride-1 3x3 convs, padding 1, one thread, Xeon 6/207 (AVX-512, 48 KB L1d), least of
  five in turns at load ~7.5 (each kernel's thread CPU time): 64 -> 64 on 56x56 2057 -> 1669 us, 128 -> 128 on
  28x28 2059 -> 1894, 256 -> 256 on 14x14 1984 -> 1856. Four vectors (28 accumulators, past the share) were no
  better. Only where the vector's axis is not a window itself (NCHW weights make the output row the vector)."""
  strip = _l1_weight_strip(k, amt)
  half_l1 = machine_of(k.renderer).l1d // 2
  if strip is not None and strip <= half_l1 < 2 * strip: return
  _widen(k, rid, amt, vectors, (2,))


def _l1_weight_strip(k: Kernel, amt: int) -> int | None:
  """The bytes of the reused vector's operand (a conv's weight) that one register block reads over its whole reduce:
  `amt` lanes of the reduce's dtype per reduce iteration (None: a reduce axis of symbolic size)."""
  sizes = [_bound(x) for x in k.reduce_axes]
  if any(n is None for n in sizes): return None
  return math.prod(n for n in sizes if n is not None) * amt * _register_file(k)[2]


def _padded_window(x: UOp, loads: list[UOp], rngs: list[UOp], reds: list[UOp]) -> bool:
  """Whether output axis `x` is a sliding window (`_awkward`) that some load is gated along (a padded conv's output
  rows and columns). Around a vector of output channels, only the innermost such axis is blocked, by its widest
  divisor that fits (`_row_block(widest=True)`): the lanes of a second one each read their own input row and carry
  their own padding gates, which the filter loops can no longer skip for the whole block (`lower/bounds.py` narrows
  a loop per output row, not per lane). resnet18's 128 -> 128 3x3 conv on 28x28 maps (padding 1, one thread, AVX-512)
  blocked 16 channels x 4 pixels x 2 rows ran 62 GFLOPS, x 4 x 4 81, 16 x 7 pixels 120; 64 -> 64 on 56x56, 16 x 8
  pixels 115, x 8 x 2 rows 65. Unpadded convs keep both axes (`conv2d` without padding, the MNIST step's 5x5)."""
  gated = any(len(ld.src[0].src) > 2 and x in ld.src[0].src[2].ranges for ld in loads)
  return gated and _awkward(x, loads, rngs, reds)[1]


def _row_block(x: UOp, m: int, most: int, widest: bool = False) -> int:
  """The lanes to block output axis `x` of size `m` by, with room for `most` more accumulators (0: none): the first
  of `_block_amounts` that divides a constant `m` (`widest`: its widest divisor that fits first, for an axis blocked
  alone: 28 as 7, not 4); for a symbolic bound (`m` its representative size) the first that is at most `m`, since
  the masked tail takes any remainder, and a block wider than the typical size would mostly compute masked lanes."""
  if _bound(x) is not None:
    amts = _block_amounts(m, most)
    if widest: amts = tuple(sorted(amts, key=lambda a: (m % a != 0, -a)))
    return next((a for a in amts if m % a == 0), 0)
  return next((a for a in _block_amounts(m, most) if a <= m), 0)


def tile_min_bytes(m: Machine) -> int:
  """The size of a matmul's reused operand (B: the load no row axis moves) above which `_tile_rows` tiles the rows:
  one core's L2 (its share when SMT siblings share it), or its share of the L3 when that is smaller (Sapphire Rapids:
  105 MB over 56 cores, 1.9 MB against a 2 MB L2). Untiled, each block of rows walks all of B; it stays in the L2
  between blocks only while it fits there, and past it every block streams B from the L3: 2 vectors of B a step for
  the 8 x 2 block's 16 FMAs, 16 bytes a cycle at the FMAs' peak, more than a mesh L3 (or a virtual machine's shared
  one) gives a core. Tiled, a B panel is reused from L2 by every block of the tile. 1024^2 float32 (B 4 MB, packed)
  on the 2-vCPU Xeon 6/207 (2 MB L2, AVX-512, two threads, `search._Timer`, in turns, load 3-7): untiled 50-95
  GFLOPS, tiled (8-64 blocks a tile) 82-222 in the same runs, tiled ahead in each of five. On Zen 3/4 (32 MB L3 over
  8 cores) 1024^2 ran the same with and without tiles (the L3 feeds the block there); their L2 (512 KB, 1 MB) now
  tiles it too."""
  return min(m.l2 // max(1, m.l2_shared), m.l3_per_core)


def tile_bytes(m: Machine) -> int:
  """The most bytes of A (rows x K) a row tile spans: half the core's L3 share, the other half left to B's strips as
  they stream through and to C's rows (BLIS sizes a cache's resident block to about half of it). Zen 3/4: 2 MB (tiles
  of 1 to 8 MB of A measured within the noise of each other on the znver4, `_tile_rows`)."""
  return m.l3_per_core // 2


def _tile_rows(k: Kernel, rid: int, lanes: int) -> None:
  """Cache blocking of a big matmul on a CPU's vector registers: the rows' loop (output axis id `rid`, its `lanes`
  already a register block) is tiled (`OptOps.TILE`) so that B's column loop runs inside a tile of rows. Else each
  block of rows walks all of B: at 2048^2 float32 that is 16 MB, past this VM's share of L3, so every block of 4 rows
  streamed B from memory: 36 GFLOPS against 131-140 with tiles of 64-128 blocks (2-4 MB of A) on the 2-core znver3
  (AVX2, two threads); on the znver4 (AVX-512, 8-row blocks, packed B, one thread beside a CI run, processes
  alternated) 74-81 -> 103-111, 128x4096x4096 61-63 -> 91, tiles of 1 to 8 MB of A within the noise. 1024^2 (4 MB of
  B) ran the same with or without tiles there (its L3 fed the block), and 1.5-2x faster tiled on the Xeon 6/207 VM
  (`tile_min_bytes`). The tile is the most blocks within `tile_bytes` of A that leaves a tile per thread; B must be
  more than `tile_min_bytes` (both derived from the machine model). Rows few enough for half the L2 (a prefill's 32)
  are one tile, the threads splitting B's columns instead (`_whole_row_tile`)."""
  regs, _, itemsize = _register_file(k)
  if not regs: return
  loop = [(j, x) for j, x in enumerate(k.output_axes) if x.arg[0] == rid and x.arg[1] in (AxisType.LOOP,
                                                                                           AxisType.GLOBAL)]
  row = next((x for x in k.rngs if x.arg[0] == rid), None)
  if not loop or row is None: return
  j, n = loop[0][0], _bound(loop[0][1]) or 0
  reused = [ld for ld in k.loads() if row not in ld.src[0].src[1].ranges]
  b_bytes = max((ld.src[0].src[0].dtype.size * ld.dtype.itemsize for ld in reused
                 if isinstance(ld.src[0].src[0].dtype, PtrDType)), default=0)
  m = machine_of(k.renderer)
  if b_bytes <= tile_min_bytes(m): return
  block = lanes * _trips(k.reduce_axes) * itemsize  # A's bytes per block of rows
  threads = max(1, int(getattr(k.renderer, "threads", 1)))
  if _whole_row_tile(k, rid, n * block, threads, m): tile = n
  else:
    most = min(tile_bytes(m) // max(block, 1), n // threads)
    tile = next((t for t in range(min(most, n - 1), 1, -1) if n % t == 0), 0)
  if tile: _try(k, Opt(OptOps.TILE, j, tile))


def _whole_row_tile(k: Kernel, rid: int, a_bytes: int, threads: int, m: Machine) -> bool:
  """Whether a matmul's rows (output axis id `rid`, `a_bytes` of A in all) are few enough to be one tile: all of A
  within half the core's L2 share (`tile_min_bytes`; the other half for B's strip streaming through), and the other
  output loops (B's column blocks) at least `threads` iterations. Then B's column loop is outermost, the threads split
  B's columns, and each strip of B, loaded once, serves every block of rows while A stays in the L2 (the blocking
  BLIS uses: A's block in L2, B's panel streaming): B streams from L3/memory once in all. A tile per thread
  (`_tile_rows` otherwise) streams all of B once per thread: the skinny products of a 32-token prefill (4 blocks of 8
  rows: two tiles of two) read B twice. 32 x 768 @ 768 x 768 (B 2.4 MB) on the loaded Xeon 6/207 (2 threads, TinyJit,
  best of 300 calls, in turns): 430-443 -> 344-347 us; 64 x 768 @ 768 x 2048 (packed B) 1977-2263 -> 1371-1829 us;
  32 x 768 @ 768 x 2048 and 32 x 2048 @ 2048 x 768 even (1297-1360 and 1371-1457, 1267-1423 and 1269-1320 us): B's
  in-place strip, its rows 8 KB apart, keeps few lines in the L2's sets either way (`gemm_panel` packs from 64
  rows)."""
  if a_bytes > tile_min_bytes(m) // 2: return False
  cols = 1
  for x in k.output_axes:
    if x.arg[0] != rid and x.arg[1] in (AxisType.LOOP, AxisType.GLOBAL): cols *= _bound(x) or 0
  return cols >= threads


def _register_file(k: Kernel) -> tuple[int, int, int]:
  """The renderer's vector registers (count, bytes; 0, 0 when unknown) and the widest REDUCE's itemsize (what an
  accumulator lane takes)."""
  regs, width = getattr(k.renderer, "vector_registers", (0, 0))
  reds = [u for u in k.ast.toposort() if u.op is Ops.REDUCE]
  return regs, width, max((u.dtype.scalar().itemsize for u in reds), default=4)


def _block_amounts(m: int, most: int) -> tuple[int, ...]:
  """Upcast amounts to try, in order, for an axis of size `m` blocked around a vector with room for `most` more
  accumulators: the whole axis when it fits, 8 or 4, else its largest divisor that fits (a 10-wide conv row: 5,
  where 2 left 2 x 2 accumulators, whose chains of dependent FMAs stalled on the FMA latency: the input gradient of a
  3x3 conv on 10x10 maps ran 2.4x faster), else 2."""
  widest = next((a for a in range(min(m, most), 2, -1) if m % a == 0), 0)
  return tuple(dict.fromkeys(a for a in ((m,) if m <= most else ()) + (8, 4, widest, 2) if 1 < a <= most))


def _gemm_like(k: Kernel, loads: list[UOp]) -> bool:
  """A matmul-shaped kernel (plain or batched): no load walks an axis through div/mod or as a sliding window (a
  conv's rows, its backward's windows: those kernels keep `_vector_block`'s blocking as tuned for them)."""
  rngs, reds = k.rngs, k.reduce_axes
  for r in k.output_axes:
    nonaffine, window = _awkward(r, loads, rngs, reds)
    if window or (nonaffine and not _panel_walk(k, r, loads)): return False
  return True


def _panel_walk(k: Kernel, r: UOp, loads: list[UOp]) -> bool:
  """Whether every div/mod that a load takes of output axis `r` divides by a multiple of the renderer's vector lanes:
  a matmul whose right operand was packed into panels (`gemm_panel`) reads column n at (n // P, k, n % P), and a
  block of whole vectors along `r` walks each panel affinely (the output's (m, n // P, n % P) axes arrive merged,
  since the store is contiguous across them)."""
  regs, width, itemsize = _register_file(k)
  if not width: return False
  lanes = width // itemsize
  for ld in loads:
    for u in ld.src[0].src[1].toposort():
      if u.op in (Ops.CDIV, Ops.CMOD) and r in u.ranges and \
         not (u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int) and u.src[1].arg % lanes == 0): return False
  return True


def pack_min_bytes(m: Machine, regs: int) -> int:
  """The right operand's size from which `gemm_panel` packs it (B contiguous in its columns; strided with fewer
  than `PACK_STRIDED_ROWS` rows: from `m.l2`). In place, the register block's column strip walks rows of B n floats
  apart, so the strip's lines spread over few L2 sets; they stay cached between row blocks only while all of B fits
  the L2 beside A's rows, and beyond that they come from L3 once per block of rows. A block of R rows (R = half the
  registers' accumulator share, `_vector_block`: 4 on AVX2's 16, 8 on AVX-512's 32) reuses each load of B R times,
  so L3's bandwidth feeds it as well as L2 feeds a 4-row block while B is within L2 x R / 4. Packing from there:
  AVX2 from the L2 (znver3, 512 KB: 256^2 (256 KB) lost packed, 34 -> 31 GFLOPS, 512^2 (1 MB) gained, 32 -> 45),
  AVX-512 from two L2s (znver4, 1 MB L2, one thread beside a CI run, in place and packed alternated: 1024x512x1024
  (2 MB) 103 and 104, 1024^2 (4 MB) 98-102 and 104-106, 1024x2048x2048 100 and 110; 512^2 (1 MB) lost, 105 -> 94)."""
  rows = max(1, int(regs * ACC_REGISTER_SHARE) // 2)
  return m.l2 * rows // 4


PACK_MIN_BYTES_STRIDED = 256 << 10
"""The size from which a right operand read across its rows (`x @ w.T`, nn.Linear's weight: the vector lanes of a column
strip lie K elements apart, a gather each) is packed when A has `PACK_STRIDED_ROWS` rows or more; with fewer (but
`pack_min_rows_strided`), from the L2's size (`pack_min_bytes` of a 4-row block); on either register file. Not
derived from the caches: a gather costs its lanes' loads whether they hit L1 or not (256^3, a 32 KB strip per column
panel, within the L1, and 1024x256x256, the same strip, came out even and 57 -> 73), so this weighs the copy and its
launch against the gathers it saves, a ratio of instruction costs that no sysfs file reports. On the znver4, one
thread beside a CI run, alternated: 1024^2 14 -> 99 GFLOPS packed, 512^2 27 -> 81, 1024x256x256 (256 KB) 57 -> 73,
256^3 51 and 50; 128^3 (64 KB) lost, 12 -> 7. Two threads, quiet, alternated: 64x512x512 (1 MB) 13-14 -> 42-45,
2048x128x512 (256 KB) 97-131 -> 155-169, 512x256x256 81-91 -> 84-98; but a 256-row product of a 256 KB B, a small
GPT's projections, lost to the extra launch and copy (256x128x512 70-74 -> 54-58, 256x512x128 68 -> 53) and 512 KB
ones at 256 rows came out even. A strided B is packed from two panels wide (not `pack_min_columns`); one thread
beside the CI run, processes alternated: 4096x1024x64 52 -> 77-95, 4096x1024x128 41 -> 100, the long-K 64x32768x64
5 -> 39; one panel (32 columns) gained nothing."""
PACK_STRIDED_ROWS = 512
"""A's rows from which a strided B of `PACK_MIN_BYTES_STRIDED` is packed: like that size, where the copy's cost
meets the gathers' (not a cache property)."""


def pack_min_columns(m: Machine, itemsize: int) -> int:
  """B's columns from which `gemm_panel` packs it: rows of a quarter page or less (1 KB of float32 in 4 KB pages)
  put four or more consecutive rows of a column strip in one page, and the hardware prefetchers, which follow a
  stream within a page (Intel's optimization manual, the L2 streamer; AMD's L2 stream prefetcher likewise), keep
  fetching it in place (a long-K (64 x 32768) @ (32768 x 64) reads it in four strips and splits its K instead,
  `SPLIT_REDUCE_MIN`)."""
  return max(1, m.page_size // 4 // max(1, itemsize))


PACK_MIN_ROWS = 64
"""The left operand's rows from which packing pays: the copy costs as much as a matmul of a few rows (decode's
matrix-vector products read each weight once and are left alone). Like `PACK_MIN_BYTES_STRIDED`, an amortization of
the copy and its launch, not a cache property."""


def gemm_panel(renderer: Renderer, m: int, k: int, n: int, itemsize: int, strided: bool = False) -> int:
  """The columns of the panels a CPU matmul (m x k) @ (k x n) should first copy its right operand into, (n // P, k, P)
  contiguous, or 0 to read it in place; `strided`: B is read across its rows (a transposed view, K contiguous).
  The register block (`_vector_block`: 4 rows x 2 vectors on AVX2's 16 registers, 8 x 2 on AVX-512's 32) walks a
  2-vector-wide column strip of B down all of K; in place that strip's rows are n floats apart, so at 1024 columns
  (4 KB) its 1024 lines share 16 L2 sets and come from L3 on every row block, and on the znver3 (AVX2) 1024^2 float32
  ran 0.45-0.46x numpy. Packed, a strip is one contiguous panel that stays in L2: 0.76-0.90x (two threads, quiet), a
  transposed (nn.Linear) right operand 18 -> 104-111 GFLOPS (bench/README.md). The sizes come from the machine model
  (`machine_of(renderer)`): B is packed from `pack_min_bytes` (the L2 on AVX2, two L2s on AVX-512, whose 8-row block
  reads B from L3 at the core's peak longer); a strided B from the L2 on either, and from `PACK_MIN_BYTES_STRIDED`
  under `PACK_STRIDED_ROWS` rows or more. The strip is P = two vectors of 32-bit floats; other dtypes and small or
  narrow matrices (`pack_min_columns`, two panels when strided, `PACK_MIN_ROWS`; strided,
  `pack_min_rows_strided`) are read in place."""
  regs, width = getattr(renderer, "vector_registers", (0, 0))
  if not regs or width < 32 or itemsize != 4: return 0
  mach = machine_of(renderer)
  panel = 2 * width // itemsize
  size = k * n * itemsize
  if strided: least = PACK_MIN_BYTES_STRIDED if m >= PACK_STRIDED_ROWS else pack_min_bytes(mach, 16)
  else: least = pack_min_bytes(mach, regs)
  rows = pack_min_rows_strided(regs) if strided else PACK_MIN_ROWS
  if n % panel or n < (2 * panel if strided else pack_min_columns(mach, itemsize)) or m < rows or size < least:
    return 0
  return panel


PACK_STRIDED_BLOCKS = 4
"""The blocks of rows (`_vector_block`'s register block) from which a strided right operand (`x @ w.T`) is packed
(`pack_min_rows_strided`): in place each block gathers all of B once, a vector of 16 lanes K elements apart per step;
the copy reads B once with the same gathers and writes it, and the blocks then read it contiguously. One block
gathers B once either way, so packing can't pay there; on the loaded Xeon 6/207 (AVX-512, 8-row blocks, two
threads, TinyJit, best of 200 in turns) 8 rows lost (768x768 222-224 -> 311-317 us), 16 (two blocks) came out mixed
(768x768 408-415 -> 356-383, 2048x768 1075-1122 -> 1255-1428), 32 (four) gained (768x768 838-842 ->
466-477, 2048x768 2153-2232 -> 1765-2050). Like `PACK_MIN_ROWS`, a ratio of instruction costs (a gather pass against
a copy), not a cache size; counted in blocks, so a register file with shorter blocks (AVX2's 4 rows) packs from
proportionally fewer rows."""


def pack_min_rows_strided(regs: int) -> int:
  """A's rows from which `gemm_panel` packs a strided B: `PACK_STRIDED_BLOCKS` register blocks of rows, a block
  being half the accumulator share of `regs` vector registers (`_vector_block`: 8 rows on AVX-512's 32, 4 on AVX2's
  16), and never more than `PACK_MIN_ROWS` (what a contiguous B needs)."""
  return min(PACK_MIN_ROWS, PACK_STRIDED_BLOCKS * max(1, int(regs * ACC_REGISTER_SHARE) // 2))


def conv_weight_panel(renderer: Renderer, cout: int, taps: int, itemsize: int) -> int:
  """The output channels of the panels a CPU conv's fixed weight should be laid out in, (Cout/P, Cin/groups, *kernel,
  P) contiguous, or 0 for plain channels-last (Cin/groups, *kernel, Cout); `taps` = Cin/groups x the kernel's size.
  The conv's register block (`_vector_block`) walks a strip of P output channels (one vector) down all the taps,
  reused by every block of pixels. Channels-last, the strip's `taps` lines lie Cout x itemsize bytes apart, so they
  fall into L2 x line / (that stride) of the L2's lines (the sets that stride reaches, times the ways): the strip
  stays cached between pixel blocks only while taps x Cout x itemsize (the whole weight) is within the L2
  (`Machine.l2`); past it each block streams its strip from L3. A panel is one cache line of channels (`Machine.line`,
  16 float32s), so a strip is contiguous. Loaded Xeon 6/207 (2 MB L2), one thread, 3x3 convs: 256 -> 256 channels on
  14x14 (2.4 MB of weight) 35 -> 128 GFLOPS, 512 -> 512 on 7x7 (9.4 MB) 18 -> 107; 128 -> 128 on 28x28 (0.6 MB) 123
  and 125; 64 -> 64 on 56x56 127 in place. 0 for renderers without a known vector register file, a Cout that isn't
  a multiple of two panels, or a weight within the L2."""
  regs, width = getattr(renderer, "vector_registers", (0, 0))
  if not regs or not width or itemsize <= 0: return 0
  m = machine_of(renderer)
  panel = max(1, m.line // itemsize)
  if cout % panel or cout < 2 * panel or taps * cout * itemsize <= m.l2: return 0
  return panel


ACC_REGISTER_SHARE = 0.5
"""Of the renderer's vector registers, the share a register block's accumulators may take: the rest hold the reused
vectors (one per vector of the block's row), the broadcasts and what LLVM hoists. On the 2-core znver4 (32 zmm, one
thread, process CPU time, best of 15 under load): a 1024^2 float32 matmul's 8 rows x 2 vectors of 16 lanes (16
accumulators) ran 86 -> 101 GFLOPS over 8 x 1 (the core's peak is ~100); 8 x 3 (24) lost on 3072x768x3072
(84 -> 70; 8 x 2: 83) and 768^2 (102 -> 97-100); 8 x 4 (32) spilled (1024^2: 47)."""


def _widen_vector_block(k: Kernel, rid: int, amt: int, vectors: int) -> None:
  """After `_vector_block` (`vectors` accumulators of `amt` lanes along the output axis of id `rid`), upcast what is
  left of that axis again by 4, 3 or 2 (the first that divides it) while the accumulators fit `ACC_REGISTER_SHARE`
  of the renderer's vector registers (`_widen`): each broadcast load (a row's element) then feeds that many more
  FMAs; loads per FMA fall from (1 + r)/r to (c + r)/(r*c) for r rows by c vectors. The rows stay as `_vector_block`
  blocked them (up to 8): more rows, each walking its own strided line, thrash an 8-way L1 set when the row stride
  is a multiple of 4 KB (1024^2: 16 rows x 1 vector ran 49 GFLOPS against 80 for 8 x 1)."""
  _widen(k, rid, amt, vectors, (4, 3, 2))


def _widen(k: Kernel, rid: int, amt: int, accs: int, extras: tuple[int, ...], most: int | None = None) -> None:
  """Upcast what is left of the output axis of id `rid` (its `amt` lanes already upcast, `accs` accumulators of them)
  again by the first of `extras` that divides it, while the accumulators fit `ACC_REGISTER_SHARE` of the renderer's
  vector registers (`vector_registers`: count, bytes; an accumulator of `amt` lanes of the reduce's dtype takes one
  register or more; none known: unchanged), and at most `most` registers per REDUCE when given."""
  regs, width, itemsize = _register_file(k)
  reds = [u for u in k.ast.toposort() if u.op is Ops.REDUCE]
  if not regs or not width or not reds: return
  per_acc = -(-amt * itemsize // width)
  budget = int(regs * ACC_REGISTER_SHARE)
  if most is not None: budget = min(most, budget) * len(reds)
  # what is left of the axis outside the vector lanes keeps its id (gone when the lanes took it whole)
  left = [(j, x) for j, x in enumerate(k.output_axes)
          if x.arg[0] == rid and x.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)]
  if not left: return
  j, n = left[0][0], _bound(left[0][1]) or 0
  for extra in extras:
    if n % extra == 0 and accs * extra * per_acc <= budget and k.upcast_size * extra <= MAX_LANES // 2 and \
       _try(k, Opt(OptOps.UPCAST, j, extra)): return


def _vector_width(n: int) -> int:
  """The lanes of a native vector along an axis of size `n`: 16 or 8 when they divide it, else the widest divisor
  from 4 to 16 (a conv's short output row: 20 -> 10, 10, 6 whole; LLVM widens such a vector to the next register
  size, so a 10-lane vector is one 16-lane register, not a scalar chain); 0 when there is none (a prime row)."""
  if n % 16 == 0: return 16
  if n % 8 == 0: return 8
  return next((a for a in range(min(n, 16), 3, -1) if n % a == 0), 0)


def _vector_accumulators(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> None:
  """A streaming reduce (each element read about once) whose innermost reduce axis no load walks contiguously
  (`_unroll_reduce` found nothing to do), but whose innermost output axis both the store and a load do (a column
  sum; the partial sums of a split `sum()`): that output axis is upcast (16 or 8 lanes; float reduces of ungated
  loads only), so each reduce step is one contiguous (vector) load into that many independent accumulators instead
  of one strided scalar per output."""
  reds, rngs = k.reduce_axes, k.rngs
  if sidx is None or not reds: return
  # only float reduces of plain (ungated) loads, 8 or 16 lanes: what the sums above are. (An int32 counting reduce
  # of `sort`, upcast by 3, computed wrong values on CPU:LLVM and right ones on CPU:CLANG: kept out until understood.)
  if any(not dtypes.is_float(u.dtype) for u in k.ast.toposort() if u.op is Ops.REDUCE): return
  if any(len(ld.src[0].src) > 2 for ld in loads): return
  outs = _output_axes_with_bounds(k)
  if not outs: return
  i, r, n = outs[-1]
  if stride_of(sidx, r, rngs) != 1 or not any(stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in loads): return
  if (amt := next((a for a in (16, 8) if n % a == 0), 0)) and _try(k, Opt(OptOps.UPCAST, i, amt)):
    _widen_accumulators(k, r.arg[0], amt)


def _short_reduce_channels(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> bool:
  """A short contiguous float reduce (a squeeze-excite's or a classifier's global mean over a 7x7 or 14x14 map): its
  innermost reduce axis, of `n` elements that a load walks contiguously, is not a multiple of one vector register's
  lanes (`machine_of`: vector bytes over the item; 49 or 196 floats against 16) and the reduce's own unroll left it
  alone (no divisor of `n` among its amounts, or a body over its budget: a fused SiLU), while the kernel's one store
  walks its innermost output axis (the channels) contiguously. That output axis is upcast by the register's lanes
  (or half of them where those don't divide it): each reduce step is then one gathered vector (the channels, `n`
  apart) into a vector accumulator, the fused producer's math (a bias and a hardswish or SiLU) vectorized, where
  each channel was one scalar chain. Only while one block of channels (lanes x n items) fits in half the L1d, so
  each gathered line is read from memory once. One thread, Zen 4: mobilenet_v3_small's 576x7x7 mean with bias +
  hardswish 25 -> 7.6 us, a 1152x7x7 one with SiLU 159 -> 25; a 14x14 one its unroll takes by 4 was faster so
  (efficientnet_b0's 480x14x14: 9 us, 15 as channels): the unroll goes first. Whether it upcast (the reduce stays a
  loop)."""
  reds, rngs = k.reduce_axes, k.rngs
  if sidx is None or len(reds) != 1 or len(k.stores()) != 1: return False
  if any(u.op is Ops.REDUCE and (not dtypes.is_float(u.dtype) or u.dtype.count != 1) for u in k.ast.toposort()):
    return False
  if any(len(ld.src[0].src) > 2 for ld in loads): return False  # gated (padded) loads: not a plain map
  m = machine_of(k.renderer)
  r, n = reds[0], _bound(reds[0])
  outs = _output_axes_with_bounds(k)
  if n is None or not outs or not m.vector_bytes: return False
  i, c, nc = outs[-1]
  walked = [ld for ld in loads if r in ld.src[0].ranges]
  if not walked: return False
  # the sizes first (most reduces stop here), then the strides
  item = max(ld.dtype.itemsize for ld in walked)
  lanes = m.vector_bytes // item
  if lanes < 4 or n % lanes == 0 or n < 2: return False
  amt = next((a for a in (lanes, lanes // 2) if a >= 4 and nc % a == 0), 0)
  if not amt or amt * n * item > m.l1d // 2: return False
  if stride_of(sidx, c, rngs) != 1: return False
  if not all(stride_of(ld.src[0].src[1], r, rngs) == 1 for ld in walked): return False
  if any(stride_of(ld.src[0].src[1], c, rngs) == 1 for ld in walked): return False  # channels contiguous: no gather
  return _try(k, Opt(OptOps.UPCAST, i, amt))


STREAM_ACC_VECTORS = 8
"""`_vector_accumulators` widens a column sum's block to up to this many vectors of accumulators: each step of its
strided reduce then loads that many contiguous vectors (8 x 64 B) from one row instead of one line per row and page.
A 4096² float32 column sum on the 2-core znver4 (min of 15): 16 columns 5.0 ms, 64 columns 3.3 ms, 128 columns 2.9
ms (numpy 3.5-4.0)."""


def _widen_accumulators(k: Kernel, rid: int, amt: int) -> None:
  """Upcast what is left of the output axis of id `rid` (its `amt` vector lanes already upcast) again by 8, 4 or 2
  (the first that divides it) while each REDUCE's accumulators stay within STREAM_ACC_VECTORS vector registers and
  `ACC_REGISTER_SHARE` of the renderer's (`_widen`)."""
  _widen(k, rid, amt, sum(1 for u in k.ast.toposort() if u.op is Ops.REDUCE), (8, 4, 2), STREAM_ACC_VECTORS)


BLOCK_NO_UNROLL_LANES = 32
"""A register-blocked matmul with this many lanes or more gets no latency unroll of its K (see
`hand_coded_optimizations`)."""


STACK_UNROLL_MAX = 64
"""The most lanes `_upcast_stacked` unrolls (the product of the stacked axes' sizes): each lane is its own copy of the
kernel's body, and after the gates fold each copy holds one stacked piece's terms, so the code grows by about the
pieces' total size (a Winograd F(4,3) input tile's 36 points, each a sum of up to 16 loads, is the largest user)."""


def _upcast_stacked(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> None:
  """An elementwise kernel that stacks pieces along small output axes (`Tensor.stack` / `cat`: a sum of padded
  pieces, each load gated on the axis's value; a Winograd transform's points) gets those axes upcast whole (outermost
  first, while their product stays within `STACK_UNROLL_MAX`), other than the store's contiguous axis, which
  `_upcast_awkward_elementwise` gives lanes: each lane's index is then a constant, its gates fold and it computes its
  own piece, where the loop computed every piece for every element and kept one (a Winograd F(4,3) input transform
  of 64 channels on 56x56, one thread, Zen 4: 234 ms). An axis counts as stacked when more distinct gates depend on
  it than it has values minus one (a padded conv's border gates a long axis twice)."""
  if sidx is None: return
  rngs = k.rngs
  gates = {ld.src[0].src[2] for ld in loads if len(ld.src[0].src) > 2}
  if not gates: return
  prod, picks = 1, list[tuple[UOp, int]]()
  for _, r, n in _output_axes_with_bounds(k):
    if stride_of(sidx, r, rngs) == 1 or prod * n > STACK_UNROLL_MAX: continue
    if (on_r := sum(1 for g in gates if r in g.ranges)) >= n - 1 and on_r > 2:
      prod, picks = prod * n, picks + [(r, n)]
  for r, n in picks:
    i = next(x for x, a in enumerate(k.output_axes) if a.arg[0] == r.arg[0])
    _try(k, Opt(OptOps.UPCAST, i, n))


def _upcast_awkward_elementwise(k: Kernel, sidx: UOp | None, loads: list[UOp]) -> None:
  """An elementwise kernel LLVM's loop vectorizer gives up on — a load that is gated (padding), indexed through
  div/mod (a pooling's backward) or strided along the store's contiguous axis (a transpose) — gets that axis upcast
  (whole up to 16, else 8 or 4 lanes, else whole up to 32): the expander makes the lanes explicit, vectors where it
  can."""
  if sidx is None: return
  rngs = k.rngs
  for i, r, n in reversed(_output_axes_with_bounds(k)):
    if stride_of(sidx, r, rngs) != 1: continue
    awkward = any(len(ld.src[0].src) > 2 or stride_of(ld.src[0].src[1], r, rngs) not in (0, 1) or
                  any(u.op in (Ops.CDIV, Ops.CMOD) for u in ld.src[0].src[1].toposort()) for ld in loads)
    if not awkward or (amt := _awkward_lanes(n)) <= 1: return
    if amt >= 4 and _transpose_block(k, sidx, loads, r, amt):  # (the axis moved where the block took a whole axis)
      i = next(x for x, a in enumerate(k.output_axes) if a.arg[0] == r.arg[0])
    _try(k, Opt(OptOps.UPCAST, i, amt))
    return


def _awkward_lanes(n: int) -> int:
  """The lanes `_upcast_awkward_elementwise` gives the store's contiguous axis of size `n` (0: none)."""
  return n if n <= 16 else next((a for a in (8, 4) if n % a == 0), n if n <= 32 else 0)


def _transpose_block(k: Kernel, sidx: UOp, loads: list[UOp], store: UOp, lanes: int) -> bool:
  """In a transpose (an elementwise kernel with a load that strides along the store's contiguous axis `store` but
  walks another output axis contiguously: a conv gradient's channels-last copy, NCHW -> NHWC), upcast that other axis
  first, before `_upcast_awkward_elementwise` gives `store` its `lanes`: to as many lanes (or the widest divisor of
  its size from there down to 4, or all of it when smaller), a square block whose gathering load becomes that many
  vectors, each feeding as many stores, where the store's lanes alone had one scalar load per lane and input. The
  MNIST step's 128x32x24x24 gradient copied channels-last with the ReLU backward fused (one thread, least of 20, load
  4-5): 2.5-3.3 -> 1.4-1.6 ms as 8 pixels x 8 channels; 8 channels x 8 pixels (the store's lanes innermost) 1.7-2.3.
  Whether it upcast."""
  rngs = k.rngs
  for j, r2, n2 in reversed(_output_axes_with_bounds(k)):
    if r2 is store or stride_of(sidx, r2, rngs) in (0, 1): continue
    if not any(len(ld.src[0].src) == 2 and stride_of(ld.src[0].src[1], r2, rngs) == 1 and
               stride_of(ld.src[0].src[1], store, rngs) not in (0, 1) for ld in loads): continue
    amt = n2 if n2 <= lanes else next((a for a in range(lanes, 3, -1) if n2 % a == 0), 0)
    return amt > 1 and _try(k, Opt(OptOps.UPCAST, j, amt))
  return False


def _upcast_streaming_store(k: Kernel, sidx: UOp | None) -> None:
  """A plain elementwise kernel whose output is big enough to be streamed past the cache (the renderer's
  `nontemporal_min_bytes`): the store's contiguous axis is upcast to one cache line of lanes (16 float32s), so each
  store is a whole line the renderer can stream (LLVM's loop vectorizer refuses a streaming store it can't prove
  aligned, so the vectors must be explicit)."""
  least, line = getattr(k.renderer, "nontemporal_min_bytes", 0), getattr(k.renderer, "cache_line", 0)
  st = k.stores()
  if sidx is None or not least or not line or len(st) != 1: return
  buf = st[0].src[0].src[0]
  if buf.op is not Ops.PARAM or (size := getattr(buf.dtype, "size", -1)) <= 0: return
  item = buf.dtype.base.itemsize
  if size * item < least or line % item or line // item not in VECTOR_LANES: return  # uint8: 64 lanes, no vector
  rngs, lanes = k.rngs, line // item
  for i, r, n in reversed(_output_axes_with_bounds(k)):
    if stride_of(sidx, r, rngs) != 1: continue
    if n % lanes == 0: _try(k, Opt(OptOps.UPCAST, i, lanes))
    return


TRANSCENDENTAL = (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW)
"""The ops the CPU renderers decompose into polynomial ALU code (exp2's exponent built with integer shifts and bit
casts): tens of instructions an element, so an elementwise kernel of them is compute bound, and the lanes LLVM's loop
vectorizer leaves to a scalar remainder loop per row (a 28-wide row: 16 lanes and 12 scalar) cost as much as the
vector part."""


def _upcast_transcendental(k: Kernel, sidx: UOp | None) -> None:
  """An elementwise kernel with a transcendental (`TRANSCENDENTAL`: sigmoid, SiLU, tanh, GELU, exp) gets the store's
  contiguous axis upcast to one native vector: its widest divisor up to the lanes of one vector register
  (`vector_registers`' bytes over the stored item: 16 float32s on AVX-512, 8 on AVX2 and NEON's pairs, 4 on NEON),
  at least 4, so a row the register's lanes don't divide has no scalar remainder. efficientnet_b0's standalone
  sigmoids (one thread, AVX-512, Xeon 6/207), when LLVM vectorized at 8 lanes: 96x112x112 1389 -> 937 us as 16
  lanes, 144x56x56 657-807 -> 450 as 14 (8: 540-711, a half register), 240x28x28 403 -> 182 as 14; with the
  kernels' `prefer-vector-width` at the register's width (LLVM then vectorizes at 16 lanes, a remainder per row),
  quiet, TinyJit, two rounds: 240x28x28 387-458 -> 179-255 us, 144x56x56 532-566 -> 429-611, 96x112x112 837-1247
  -> 897-1325 (even)."""
  regs, width = getattr(k.renderer, "vector_registers", (0, 0))
  st = k.stores()
  if sidx is None or not width or len(st) != 1: return
  if not any(u.op in TRANSCENDENTAL for u in k.ast.toposort()): return
  lanes = width // st[0].src[1].dtype.scalar().itemsize  # STORE(INDEX, value)
  rngs = k.rngs
  for i, r, n in reversed(_output_axes_with_bounds(k)):
    if stride_of(sidx, r, rngs) != 1: continue
    if amt := next((a for a in range(min(n, lanes), 3, -1) if n % a == 0), 0): _try(k, Opt(OptOps.UPCAST, i, amt))
    return


def _upcast_short_row(k: Kernel, sidx: UOp | None) -> None:
  """A plain elementwise kernel whose store's contiguous axis is shorter than one vector register of lanes (the
  register's bytes over the stored item) but at least 4, in a kernel of at least as many rows as a register has
  lanes: that axis is upcast whole, one vector a row. LLVM's loop vectorizer leaves such a row scalar (its vector
  loop never runs), and the loop's exit is mispredicted once a row: mobilenet_v3_small's squeeze-excite scales (a
  240x14x14 map times a gate per channel; 576x7x7) took 44.5 and 26.1 us, one thread, Zen 4, where a 16x56x56 one
  of more elements took 5.9; as vectors 6.3 and 5.8. (A few rows run the loop a few times: nothing to win.)"""
  regs, width = getattr(k.renderer, "vector_registers", (0, 0))
  st = k.stores()
  if sidx is None or not width or len(st) != 1: return
  lanes, rngs, outs = width // st[0].src[1].dtype.scalar().itemsize, k.rngs, _output_axes_with_bounds(k)
  short = {r for _, r, n in outs if 4 <= n < lanes and math.prod(b for _, x, b in outs if x is not r) >= lanes}
  if not short: return  # (before any stride is taken: most kernels stop here)
  for i, r, n in reversed(outs):
    if stride_of(sidx, r, rngs) != 1: continue
    if r in short: _try(k, Opt(OptOps.UPCAST, i, n))
    return
