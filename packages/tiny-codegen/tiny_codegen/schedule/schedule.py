"""create_schedule: the tensor graph of everything to realize -> an ordered list of CALLs (kernels, COPYs, SLICEs).

Stages (docs/PIPELINE.md §2):
1. normalize: DETACH/CONTIGUOUS_BACKWARD removed, input BUFFERs replaced by numbered placeholders and bound variables
   by their unbound form, so the graph's structure is the schedule cache key. Then rewrites of the tensor graph:
   view round trips removed (`views`), big reduces split (`split_reduces`: `_split_reduce`) and the big
   float sums left blocked (`blocked_sums`). Accumulation contract (docs/PIPELINE.md §2): a big float sum is blocked
   (`_blocked_sum`), no accumulator adds more than REDUCE_BLOCK elements or REDUCE_FANIN partials, so its float32
   error is of the order of numpy's pairwise sum and a sum of ones is exact wherever float32 holds every partial
   (counts past 2**31 included: such a schedule's index math is int64, `_index_dtype`); the order of the additions is
   not part of the contract;
2. decide what is realized: the requested values, CONTIGUOUS, COPY (and its source), ASSIGN, every REDUCE_AXIS
   that reads memory and whose result is broadcast (EXPAND) or used by more than one kernel, and every big
   elementwise value of several buffers that a reduce reads through a broadcasting window (a convolution's or
   pool's input: inlined, it would be recomputed once per window position), and every exp2/log2/sin/pow that is
   broadcast (attention's softmax exp, else evaluated once per head dim). A reduce or exp2 whose only way to a
   broadcast is through such a window input is computed in that input's kernel (a conv with its activation, SiLU's
   exp2 included, as the epilogue), unless a PAD lies between (the conv would run behind the padding's gates). A
   constant pad's fill (WHERE of a padded mask, max pooling's -inf: `_pad_fill`) counts as that PAD: the value under
   it is the window input, stored unpadded, and its reader applies the fill behind the padding's gates. A
   contraction (conv, matmul) that a sum reduces again (a global pool) gets its own kernel with its elementwise
   epilogue: the value the sum reads is realized (`_ends_contraction`);
3. build one kernel per realized value by walking toward its inputs with index expressions (`indexing.py`); a value
   that is only a contiguous view of a buffer costs no kernel (a reshape of it, or a SLICE view at an offset).
   Kernels may store several outputs: a reduce read at the output index of another reduce (softmax's max in its
   sum's kernel), assigns read element-wise by another assign (an optimizer's moments in its parameter update), and
   independent requested values of one shape. A value recomputed at too many indices gets its own kernel instead;
4. order the CALLs by read-after-write and write-after-read dependencies (when assigns can't be ordered, e.g. a swap,
   values go through temporaries and original contents are snapshotted), then let the memory planner reuse freed
   intermediate buffers;
5. put the caller's buffers back in place of the placeholders (the cached part: step 1's rewrites to step 4).

As passes (docs/PIPELINE.md §2, each a step in VIZ and DEBUG): `normalize` (1), then STAGES, the cached part:
`views`, `split_reduces`, `blocked_sums` (1), `decide` (2), `kernels` (3), `order` and `memory` (4), then `rebind` (5).
`views`, `split_reduces`, `blocked_sums` and `memory` are `graph_rewrite`s over PatternMatchers (`pm_*`). A decision
that may fail is a result, not an exception: `KernelBuilder.kernel` returns `NeedsBuffer` or `NotMerged`, `order`
None (`_next_attempt` decides what to try next).
"""
from __future__ import annotations

import functools
import heapq
import itertools
import threading
import time
import weakref
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, cast

from tiny_uop.dtype import DType, dtypes
from tiny_uop.helpers import DEBUG, SPEC, all_int, getenv, prod, strides_for_shape
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite, graph_rewrite_map
from tiny_uop.spec import kernel_spec, maybe_verify, tensor_spec
from tiny_uop import trace as _trace
from tiny_uop.trace import traced
from tiny_uop.uop import GroupOp, Ops, UOp, sint

from tiny_codegen.schedule.indexing import KernelBuilder, NeedsBuffer, NotMerged, shape_of
from tiny_codegen.schedule.memory import memory_plan


@dataclass
class ScheduleResult:
  """What `create_schedule` returns.

  calls: CALL nodes in execution order; becomes: tensor-graph node -> its realized BUFFER (reshaped to the node's
  shape); var_vals: the values of the bound symbolic variables, by name; inputs, template: for a runtime that replays
  cached schedules (`cached_template`).
  """
  calls: list[UOp]
  becomes: dict[UOp, UOp] = field(default_factory=dict)
  var_vals: dict[str, int] = field(default_factory=dict)
  inputs: list[UOp] = field(default_factory=list)  # the graph's input BUFFERs, in the order `cached_template` gives
  template: Any = field(default=None, repr=False)  # the cache entry it came from (None: not cached)

  @property
  def linear(self) -> UOp:
    """The calls as one `LINEAR` node."""
    return UOp(Ops.LINEAR, src=tuple(self.calls))

  @property
  def kernels(self) -> list[UOp]:
    """Only the kernel CALLs (not COPY or SLICE)."""
    return [c for c in self.calls if c.src[0].op is Ops.SINK]


# ***** normalization: the cache key *****
def _placeholder(kind: str, k: int, dtype: Any, device: str, size: int) -> UOp:
  return UOp(Ops.BUFFER, dtype, (UOp(Ops.UNIQUE, arg=(kind, k)), UOp(Ops.DEVICE, arg=device)), size)


NORM_CACHE_MAX_INPUTS = 8
"""A node whose graph reads at most this many input buffers remembers its normalized form (see `_Normalizer`)."""
# may be in `becomes` themselves: never walked over
_NO_REUSE = frozenset({Ops.CONTIGUOUS, Ops.ASSIGN, Ops.COPY, Ops.SINK})
# ops the normalizer tests on every node, as module constants (on Python 3.11 each `Ops.X` read costs ~0.1 us: the
# attribute hook of EnumType; see tiny_uop.uop)
_BUFFER, _BIND = Ops.BUFFER, Ops.BIND
_DROPPED = frozenset({Ops.DETACH, Ops.CONTIGUOUS_BACKWARD})
_SIZED_MOVEMENT = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK})  # args that may hold symbolic sizes
_NEVER = -1  # `_Normalizer.lo` of a node whose form must not be remembered (its graph binds a variable or holds one
             # of _NO_REUSE)
_NONE = 1 << 62  # `_Normalizer.lo` of a node that reads no input
_INT_ONLY = {int}
_NormEntry = tuple[UOp | None, int, tuple[UOp, ...], tuple[UOp, ...], int]


class _MemoRef(weakref.ref):
  """A `_NodeMemo` entry's weak reference to its node, carrying the entry's key (its callback needs no closure)."""
  __slots__ = ("key",)
  key: int


class _NodeMemo:
  """A memo keyed weakly by UOp: an entry lives as long as its node and no longer, and must not refer to its node.
  A dict by `id(node)` of (weak reference to the node, value): a read is `id()`, one dict lookup by int and one
  dereference (`hot_get`'s pattern), where a `WeakKeyDictionary` made a `weakref.ref` per read and, on a hit, compared
  the two references' nodes through `UOp.__eq__` (a Python call): the eager hot path reads it once per source. A
  node's death removes its entry (weakref callback; ids are not reused before it runs)."""
  __slots__ = ("data", "_drop")

  def __init__(self) -> None:
    self.data: dict[int, tuple[_MemoRef, Any]] = {}
    self._drop = self._drop_dead  # one bound method for every entry's reference

  def _drop_dead(self, r: _MemoRef) -> None:
    if (e := self.data.get(r.key)) is not None and e[0] is r: del self.data[r.key]  # (an entry set since: kept)

  def get(self, n: UOp, default: Any = None) -> Any:
    """The value remembered for node `n`, else `default`."""
    if (e := self.data.get(id(n))) is not None and e[0]() is n: return e[1]
    return default

  def __setitem__(self, n: UOp, v: Any) -> None:
    r = _MemoRef(n, self._drop)
    r.key = id(n)
    self.data[r.key] = (r, v)

  def __contains__(self, n: object) -> bool:
    return (e := self.data.get(id(n))) is not None and e[0]() is n

  def pop(self, n: UOp, default: Any = None) -> Any:
    """Forget `n`'s entry; its value, else `default`."""
    if (e := self.data.get(id(n))) is None or e[0]() is not n: return default
    del self.data[id(n)]
    return e[1]

  def __len__(self) -> int: return len(self.data)
  def clear(self) -> None:
    """Forget every entry."""
    self.data.clear()


_norm_memo: _NodeMemo = _NodeMemo()
"""The scheduler's memo of normalized forms (see `_Normalizer`): node -> (normalized node, or None when it is the
node itself; the number of its first input; its inputs; their placeholders; its graph's size). Keyed weakly: an entry
lives as long as its node and no longer (it holds the node's inputs, never the node); `clear_schedule_cache` empties
it. Nothing of it is stored on the UOps."""
# the dict under it, read inline on the normalizer's hot paths: `(e := _norm_memo_data(id(n))) is not None and
# e[0]() is n` is `_norm_memo.get(n)` without a Python call
_norm_memo_data: Callable[[int], tuple[_MemoRef, _NormEntry] | None] = _norm_memo.data.get


class _Normalizer:
  """Stage 1: the graph with DETACH/CONTIGUOUS_BACKWARD dropped, input BUFFERs as placeholders numbered in the order
  a depth-first walk (sources in order, post-order) first meets them, BINDs unbound (their values in `var_vals`).

  Eager reuse: a node whose graph holds no CONTIGUOUS/ASSIGN/COPY/SINK/BIND (nor symbolic movement args) and reads
  at most NORM_CACHE_MAX_INPUTS inputs has its normalized form remembered in `_norm_memo` (the scheduler's, keyed
  weakly by the node; nothing is stored on the node). A later walk with `reuse` takes it without walking below when
  its inputs would get the same numbers (the walk has met exactly that many inputs so far, none of these), so
  `(a + 1).realize()` normalizes one node, not the whole graph. Nodes below a reused one are not in `new` (their
  images are), so `reuse` is off when the caller needs every node's image (`expose`); the nodes that may be in
  `becomes` (_NO_REUSE) are never below a reused one. `clear_schedule_cache()` forgets every remembered form."""
  def __init__(self, reuse: bool = True, budget: int | None = None) -> None:
    self.budget = budget  # walk at most this many nodes, else stop with `over` set (`cached_template`)
    self.over = False
    self.new: dict[UOp, UOp] = {}
    self.inputs: list[UOp] = []
    self.places: list[UOp] = []  # their placeholders
    self.var_vals: dict[str, int] = {}
    self.reuse = reuse
    self.lo: dict[UOp, int] = {}  # node -> the lowest input number in its graph (_NONE: none; _NEVER: binds)
    self.nodes = 0  # the normalized graph's size (a cache entry keeps it alive): nodes walked + reused graphs' sizes

  def arg(self, a: Any) -> Any:
    if isinstance(a, tuple): return tuple(self.arg(x) for x in a)
    if isinstance(a, UOp): return self.node(a)
    return a

  def _take(self, n: UOp, ent: _NormEntry) -> bool:
    """Reuse n's remembered form if its inputs get the same numbers in this walk (see the class doc)."""
    norm, first, inputs, places, size = ent
    new, lo = self.new, self.lo
    if inputs:
      if first != len(self.inputs): return False
      for b in inputs:  # (a loop, not any(): this runs for most nodes of an eager op's walk)
        if b in new: return False
      for k, (b, ph) in enumerate(zip(inputs, places)): new[b], lo[b] = ph, first + k
      self.inputs.extend(inputs)
      self.places.extend(places)
    new[n], lo[n] = (n if norm is None else norm), (first if inputs else _NONE)
    self.nodes += size
    return True

  def node(self, root: UOp) -> UOp:
    new, lo, inputs, places = self.new, self.lo, self.inputs, self.places
    if (done := new.get(root)) is not None: return done
    reuse = self.reuse
    # root.toposort(gate=lambda x: x not in new), inlined: this walk runs on every realize (the eager hot path). An
    # entry is (node, -1, 0) before its sources are walked, (node, inputs met, nodes walked) when they were
    stack: list[tuple[UOp, int, int]] = [(root, -1, 0)]
    while stack:
      n, first, nodes = stack.pop()
      if n in new: continue
      if first < 0:
        if reuse and (e := _norm_memo_data(id(n))) is not None and e[0]() is n and self._take(n, e[1]): continue
        if self.budget is not None:
          if (budget := self.budget - 1) < 0:
            self.over = True
            return root  # the caller looks at `over`, not at this
          self.budget = budget
        stack.append((n, len(inputs), self.nodes))
        for s in reversed(n.src):
          if s not in new: stack.append((s, -1, 0))
        continue
      low = _NONE
      for s in n.src:
        if (v := lo[s]) < low: low = v
      if (op := n.op) is _BUFFER:
        new[n] = ph = _placeholder("in", len(inputs), n.dtype, n.src[1].arg, n.arg)
        low = len(inputs)
        inputs.append(n)
        places.append(ph)
      elif op in _DROPPED: new[n] = new[n.src[0]]
      elif op is _BIND:
        var, val = n.unbind()
        if self.var_vals.get(var.arg[0], val) != val:
          raise ValueError(f"Variable {var.arg[0]!r} is bound to two values ({self.var_vals[var.arg[0]]} and {val})")
        self.var_vals[var.arg[0]] = val
        new[n], low = n.replace(src=(var, UOp.const(var.dtype, var.arg[1]))), _NEVER
      else:
        arg = n.arg
        if op in _SIZED_MOVEMENT and not set(map(type, arg)) <= _INT_ONLY:
          arg, low = self.arg(arg), _NEVER  # symbolic sizes (or PAD/SHRINK's pairs)
          if self.over: return root
        src = tuple(map(new.__getitem__, n.src))
        m = n if arg is n.arg and src == n.src else UOp(op, n.dtype, src, arg, n.tag)
        new[n] = m
        if op in _NO_REUSE: low = _NEVER  # it and every node above it: walked each time (see the class doc)
      lo[n] = low
      self.nodes += 1
      # remember n's form when its graph's inputs are exactly those met during its walk (none met earlier)
      # (a BUFFER never: its entry would hold the BUFFER itself, a reference cycle)
      if low >= first and len(inputs) - first <= NORM_CACHE_MAX_INPUTS and op is not _BUFFER:
        m = new[n]
        _norm_memo[n] = (None if m is n else m, first, tuple(inputs[first:]), tuple(places[first:]),
                         self.nodes - nodes)
    return new[root]


SPLIT_REDUCE_MIN = 1 << 18
"""A reduce of at least this many elements into each of fewer than REDUCE_SPLIT_OUTPUTS outputs (`a.sum()` of a big
tensor) is done in two stages: one fused loop would run on one thread with one accumulator chain."""
SPLIT_REDUCE_GROUPS, SPLIT_REDUCE_LANES = 64, 16

# ***** the accumulation contract of a float sum (docs/PIPELINE.md §2) *****
REDUCE_BLOCK = 1024
"""A float sum's innermost accumulator adds at most this many elements of its input before its partial sum goes to the
level above (blocked summation: the error of a chain of b additions grows with b, a float32 chain of ones stops at
2**24)."""
REDUCE_FANIN = 16
"""... and every accumulator above the innermost adds at most this many partials. With blocks of REDUCE_BLOCK ones a
level's full partials are powers of two, so sums of ones stay exact wherever float32 holds every partial."""
BLOCKED_SUM_MIN = 1 << 14
"""A float sum of at least this many elements into each output (of fewer than REDUCE_SPLIT_OUTPUTS outputs, or of
SPLIT_REDUCE_MIN or more elements into any number) is blocked (`_blocked_sum`); smaller ones, and a matmul's K, keep
one accumulator per output (the optimizer's vector lanes and unrolls shorten its chains)."""
SPLIT_TAG = "split_chunk"
"""The tag of a split streaming reduce's partial REDUCE_AXIS (one chunk's reduce, realized on its own)."""
BLOCK_TAG = "sum_block"
"""The tag of the inner REDUCE_AXIS levels of a blocked sum: `_decide` fuses them into the kernel of the level
above (each level's partials are a register, not a buffer)."""


def _blocked_sum(x: UOp, a: int, first: int | None = None) -> UOp:
  """`x` (static shape) summed over axis `a` (kept as size 1) as a tree of sums: the innermost REDUCE_AXIS adds blocks
  of `first` (default REDUCE_BLOCK) elements, each level above adds REDUCE_FANIN partials of the level below, until
  one level adds at most that many (the last, untagged REDUCE_AXIS; the inner ones carry BLOCK_TAG). A level whose
  size isn't a multiple of its block sums its tail (less than a block, a SHRINK: no masked loads in the loops) on its
  own, and the tails are added to the tree's sum, the lowest level's first. For float32 and n elements the error is
  at most about (first + REDUCE_FANIN * log_FANIN(n / first)) * eps * sum(|x|); for random data it is of the order
  of numpy's pairwise sum, since no accumulator adds more than a block."""
  def static(t: UOp) -> tuple[int, ...]: return cast(tuple[int, ...], t.shape)  # checked by the caller (`_decide`)
  def span(t: UOp, lo: int, hi: int) -> UOp:
    return t.shrink(tuple((lo, hi) if i == a else (0, d) for i, d in enumerate(static(t))))
  tails: list[UOp] = []
  blk = REDUCE_BLOCK if first is None else first
  while (s := static(x)[a]) > blk:
    nb = s // blk
    if s % blk: tails.append(UOp(Ops.REDUCE_AXIS, x.dtype, (span(x, nb * blk, s),), (Ops.ADD, (a,)), BLOCK_TAG))
    head = span(x, 0, nb * blk)
    shp = static(head)
    blocks = head.reshape((*shp[:a], nb, blk, *shp[a + 1:]))
    x = UOp(Ops.REDUCE_AXIS, x.dtype, (blocks,), (Ops.ADD, (a + 1,)), BLOCK_TAG).reshape((*shp[:a], nb, *shp[a + 1:]))
    blk = REDUCE_FANIN
  ret = x.r(Ops.ADD, (a,))
  if not tails: return ret
  total = tails[0]
  for t in tails[1:]: total = total + t
  return total + ret


def _is_float_sum(r: UOp) -> bool:
  return r.arg[0] is Ops.ADD and dtypes.is_float(r.dtype)


def _split_few_outputs_reduce(r: UOp) -> UOp:
  """`r` (a REDUCE_AXIS over the trailing axes of a static shape, SPLIT_REDUCE_MIN or more elements per output, fewer
  than REDUCE_SPLIT_OUTPUTS outputs) as two reduces: the reduced elements as (G groups, M rows, L lanes), partial
  results over M into (outputs, G, L), then those reduced. The partial reduce has G*L >= REDUCE_SPLIT_OUTPUTS
  outputs, so `_decide` gives it its own kernel: its groups run on the CPU's threads, its L lanes (contiguous in
  memory) are vector accumulators (the CPU heuristic upcasts them). A float sum is blocked at both stages
  (`_blocked_sum`: M in blocks of REDUCE_BLOCK, the G*L partials in blocks of REDUCE_FANIN). Any other reduce comes
  back unchanged."""
  op, axes = r.arg
  shp = r.src[0].shape
  if shp is None or not all_int(shp) or not axes: return r
  k = len(shp) - len(axes)
  if tuple(axes) != tuple(range(k, len(shp))): return r
  red, outs, per = prod(shp[k:]), prod(shp[:k]), SPLIT_REDUCE_GROUPS * SPLIT_REDUCE_LANES
  if red < SPLIT_REDUCE_MIN or red % per or outs >= REDUCE_SPLIT_OUTPUTS: return r
  src = r.src[0].reshape((*shp[:k], SPLIT_REDUCE_GROUPS, red // per, SPLIT_REDUCE_LANES))
  if not _is_float_sum(r):
    part = src.r(op, (k + 1,))
    return part.r(op, (k, k + 1, k + 2)).reshape((*shp[:k], *(1,) * len(axes)))  # r.shape: reduced axes kept as 1
  part = _blocked_sum(src, k + 1).reshape((*shp[:k], per))  # (outputs, G*L), realized on its own (`_decide`)
  return _blocked_sum(part, k, REDUCE_FANIN).reshape(cast(tuple[int, ...], r.shape))


def _split_channel_reduce(r: UOp) -> UOp:
  """`r` (a float sum into fewer than REDUCE_SPLIT_OUTPUTS outputs over both the axes after its last kept one,
  PARTIAL_SHARE <= T <= REDUCE_BLOCK elements, and some before it, BLOCKED_SUM_MIN or more elements per output: a
  BatchNorm's statistics, a conv bias's gradient, summing (N, H, W) of an (N, C, H, W) value) in two stages: partial
  sums over the trailing axes, (N, C, 1, 1), then those summed over the outer axes, blocked by REDUCE_FANIN
  (`_blocked_sum`). The partials (REDUCE_SPLIT_OUTPUTS or more of them) get their own kernel (`_decide`), each
  summing T contiguous elements in unrolled lanes, and the second stage reads a small buffer. Left whole,
  `_blocked_reduce` would flatten (N, H, W) behind C: its index math (divisions by H*W) gathers each element alone,
  at 2-5 GB/s of one core's ~20. Any other reduce comes back unchanged."""
  op, axes = r.arg
  shp, out = r.src[0].shape, r.shape
  if not _is_float_sum(r) or not axes or shp is None or out is None or not all_int(shp): return r
  keep = [i for i in range(len(shp)) if i not in axes]
  if not keep: return r
  tail, outer = tuple(range(keep[-1] + 1, len(shp))), tuple(a for a in axes if a < keep[-1])
  if not tail or not outer or set(tail) | set(outer) != set(axes): return r
  red, outs, t = prod(shp[a] for a in axes), prod(out), prod(shp[a] for a in tail)
  if red < BLOCKED_SUM_MIN or outs >= REDUCE_SPLIT_OUTPUTS or t > REDUCE_BLOCK: return r
  if t < PARTIAL_SHARE: return r  # the partials, 1/T of the bytes read, would cost more than a quarter of them
  if outs * (red // t) < REDUCE_SPLIT_OUTPUTS: return r  # too few partials for a kernel of their own (`_decide`)
  part = r.src[0].r(op, tail)  # (..., 1 per trailing axis): T elements each, one accumulator (vector lanes)
  pshp = cast(tuple[int, ...], part.shape)
  flat = part.permute((*keep, *outer, *tail)).reshape((*(pshp[i] for i in keep), red // t))
  return _blocked_sum(flat, len(keep), REDUCE_FANIN).reshape(cast(tuple[int, ...], out))


def _blocked_reduce(r: UOp) -> UOp:
  """`r`, a float sum of BLOCKED_SUM_MIN or more elements into each of fewer than REDUCE_SPLIT_OUTPUTS outputs (or
  of SPLIT_REDUCE_MIN or more into any number), as `_blocked_sum` over its reduced axes moved last and flattened: one
  kernel still (the inner levels are fused), but no accumulator adds more than REDUCE_BLOCK terms. Any other reduce
  comes back unchanged."""
  op, axes = r.arg
  shp, out = r.src[0].shape, r.shape
  if not _is_float_sum(r) or not axes or shp is None or out is None or not all_int(shp): return r
  red, outs = prod(shp[a] for a in axes), prod(out)
  if red < BLOCKED_SUM_MIN or (outs >= REDUCE_SPLIT_OUTPUTS and red < SPLIT_REDUCE_MIN): return r
  keep = tuple(i for i in range(len(shp)) if i not in axes)
  flat = r.src[0].permute((*keep, *axes)).reshape((*(shp[i] for i in keep), red))
  return _blocked_sum(flat, len(keep)).reshape(out)


_split_memo: weakref.WeakKeyDictionary[UOp, dict[str, tuple[tuple[int, ...], UOp | None]]] = \
  weakref.WeakKeyDictionary()
"""What `_memo_split` remembers: reduce -> {kind: (the sizes it was split by, its split or None: unchanged)}. Keyed
weakly: an entry lives as long as its reduce (a split is built over the reduce's source, never over the reduce), so
a graph scheduled again, or one sharing reduces with one scheduled before (a JIT's capture step after its first
step), asks each reduce's split once and gets the same nodes. `clear_schedule_cache` empties it."""


def _memo_split(kind: str, fn: Callable[[UOp], UOp], r: UOp) -> UOp:
  """`fn(r)`, remembered per reduce and sizes (`_split_memo`)."""
  sizes = (REDUCE_BLOCK, REDUCE_FANIN, BLOCKED_SUM_MIN, SPLIT_REDUCE_MIN, CHUNK_BYTES)  # (tests patch them)
  if (ent := _split_memo.get(r)) is None: ent = _split_memo[r] = {}
  if (hit := ent.get(kind)) is not None and hit[0] == sizes: return r if hit[1] is None else hit[1]
  s = fn(r)
  ent[kind] = (sizes, None if s is r else s)
  return s


def _split_reduce_once(r: UOp) -> UOp:
  """`r` split by `_split_few_outputs_reduce` (a few outputs), else by `_split_channel_reduce` (a few outputs over
  outer and trailing axes), else by `_split_streaming_reduce` (many outputs sharing inputs bigger than L2: its chunks
  keep them in cache), else unchanged."""
  if (s := _split_few_outputs_reduce(r)) is not r: return s
  if (s := _split_channel_reduce(r)) is not r: return s
  return _split_streaming_reduce(r)


def _split_reduce(r: UOp) -> UOp:
  """`_split_reduce_once(r)`, remembered (`_memo_split`)."""
  return _memo_split("split", _split_reduce_once, r)


def _new_nodes(s: UOp, below: UOp) -> set[UOp]:
  """The nodes of `s`'s graph above `below`: what a split of a reduce over `below` built (it reads nothing else)."""
  seen, stack = {s}, [s]
  while stack:
    for x in stack.pop().src:
      if x is not below and x not in seen:
        seen.add(x)
        stack.append(x)
  return seen


def _split_rule(ctx: set[UOp], r: UOp) -> UOp | None:
  """# r (a big reduce into few outputs, or one streaming inputs bigger than L2) -> partial reduces, then their
  reduce (`_split_reduce`); the nodes a split made (ctx) are final."""
  if r in ctx or (s := _split_reduce(r)) is r: return None
  ctx.update(_new_nodes(s, r.src[0]))
  return s


def _block_rule(r: UOp) -> UOp | None:
  """# r (a float sum of many elements per output) -> a tree of sums (`_blocked_reduce`); a split's partial
  reduces (tagged: they were blocked as the split needs, or are chunks of a streaming reduce) and the inner levels
  of a tree (BLOCK_TAG) are final."""
  if r.tag is not None or (s := _memo_split("blocked", _blocked_reduce, r)) is r: return None
  return s


def _reshape_round_trip(x: UOp, a: UOp, b: UOp) -> UOp | None:
  """# x.reshape(s).reshape(x.shape) -> x (row-major reshapes compose: back to x's own shape is x)"""
  return x if a.tag is None and b.tag is None and b.arg == x.shape else None


def _permute_round_trip(x: UOp, p: UOp, q: UOp) -> UOp | None:
  """# x.permute(p).permute(q) -> x where p[q] is the identity (`.T.T`)"""
  return x if p.tag is None and q.tag is None and all(p.arg[i] == k for k, i in enumerate(q.arg)) else None


pm_views = PatternMatcher([
  (UPat(Ops.RESHAPE, src=(UPat(Ops.RESHAPE, src=(UPat.var("x"),), name="a"),), name="b"), _reshape_round_trip),
  (UPat(Ops.PERMUTE, src=(UPat(Ops.PERMUTE, src=(UPat.var("x"),), name="p"),), name="q"), _permute_round_trip),
], name="views")
"""Pass `views`: a view that goes back to its source's own layout (reshape and back, permute and back) is the
source itself. (Merging every chain of reshapes, not only round trips, rebuilt most of a ResNet's backward graph
(89 merges) and cost more schedule time than its simpler index expressions saved.)"""
pm_split_reduces = PatternMatcher([(UPat(Ops.REDUCE_AXIS, name="r"), _split_rule)], name="split_reduces")
"""Pass `split_reduces`: big reduces into few outputs, and streaming reduces, in two stages; ctx: the nodes it made."""
pm_blocked_sums = PatternMatcher([(UPat(Ops.REDUCE_AXIS, name="r"), _block_rule)], name="blocked_sums")
"""Pass `blocked_sums`: the accumulation contract (`_blocked_sum`) for every big float sum left."""
pm_reuse_buffers = PatternMatcher([(UPat(Ops.BUFFER, name="b"), lambda ctx, b: ctx.get(b))], name="memory")
"""Pass `memory`: # BUFFER b -> the earlier buffer whose storage it reuses (ctx: `memory_plan`'s map, one step: a
buffer handed out is never itself replaced)."""


CHUNK_BYTES = 1 << 20
"""A chunk of a split streaming reduce reads at most about this many bytes: a CPU core's L2 (1 MiB per core on the
AMD EPYC (Zen 4) and Intel Xeon (Sapphire Rapids: 2 MiB) machines tiny runs on; lscpu). A kernel whose output blocks
each stream more than this from its inputs reads them from L3 (or DRAM) once per block."""
STREAMING_REDUCE_MIN_OUTPUTS = 256
"""`_split_streaming_reduce` only splits reduces into at least this many outputs, enough for a kernel to block them
into several output blocks that share inputs (the MNIST step's first conv, 1 -> 32 channels 5x5, has 800: its
weight gradient ran 3.7-4.1 -> 2.7-3.1 ms of CPU time on one thread, split into 16 chunks)."""
STREAMING_MIN_REUSE = 16
"""... and whose source has at least this many elements per element of its inputs: each input element is read by many
outputs (a conv weight gradient: every gradient element by Cin*k*k of them), so output blocks share their inputs.
A reduce that reads each input once or a few times (a sum over a batch) streams them once anyway."""
STREAMING_MIN_LEAF_REUSE = 64
"""... and, when it reduces a single axis (a matmul's K), whose every input is read by at least this many outputs (the
reduce's elements over the input's): the kernel blocks 8-16 rows of outputs at once, so an input read by fewer is
streamed again only a few times and keeping chunks of it in L2 saves little. A 32-token LLM prefill's linear layers
(x @ W.T, each weight read by the 32 tokens' outputs) ran 3x slower split into K chunks (kernel time 172-217 -> 89-95
ms of the prefill); a (64x32768) @ (32768x64) (each input read by 64) still splits. A conv's weight gradient reduces
over batch and pixels, and each of its output blocks re-reads its input windows: it splits even when an input is read
by few outputs (conv1's gradient, 1 input channel: 25 per element; split 0.81 ms, unsplit 1.24)."""
STREAMING_BLOCK_OUTPUTS = 32
"""... and whose block of this many outputs (two 16-float vectors: the widest output block the CPU heuristic gives a
conv's channels or a matmul's columns) streams more than CHUNK_BYTES over its whole reduce (reduce elements x this x
itemsize): an output block walks its own slice of the partitioned input, and the next block re-reading the shared one
finds it in L2 only when a chunk of the reduce holds it. A forward conv reduces over Cin x k x k (resnet18's 512 ->
512 3x3: 4608 elements, a 32-channel block's weights 590 KB, each read by the 49 pixels of its 7x7 map from L2 while
its pixel blocks run): split into 16 chunks of input channels (its 9.4 MB of weights over CHUNK_BYTES) it wrote 16
partial maps and summed them in a one-thread kernel, 2.4 + 0.17 ms against 1.83 ms unsplit (one thread, Zen 4
EPYC family 25 model 17, thread time). A weight gradient reduces over batch x pixels (32 images of 20x20: 12800
elements, 1.6 MB a block) and still splits; the convnet step's 3x3 ones (128 images of 8x8: 1 MB a block) ran as
fast unsplit (2687 and 3048 us of one thread against 2697 + 49 and 3095 + 70 split in 4)."""
PARTIAL_SHARE = 4  # the partial sums of a split streaming reduce take at most 1/PARTIAL_SHARE of the bytes it reads
_REALIZED_LEAVES = (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN, Ops.REDUCE_AXIS)


def _leaves(x: UOp) -> Iterator[tuple[int, int] | None]:
  """(elements, itemsize) of each distinct value `x`'s kernel would read from memory (buffers, and values realized on
  their own: a CONTIGUOUS, COPY, ASSIGN or REDUCE_AXIS), walking through movement and ALU ops; None for one of symbolic
  size. Lazy: a caller that has seen enough stops the walk."""
  seen, stack = {x}, [x]
  while stack:
    n = stack.pop()
    if n is not x and n.op in _REALIZED_LEAVES:
      shp = shape_of(n) if n.op is not Ops.BUFFER else (n.arg,)
      yield (prod(shp), n.dtype.itemsize) if shp is not None and all_int(shp) else None
      continue
    for s in n.src:
      if s not in seen:
        seen.add(s)
        stack.append(s)


def _leaf_bytes(x: UOp, cap: int) -> int:
  """Bytes of the values `x`'s kernel would read from memory (`_leaves`); counting stops past `cap` (a symbolic one
  counts as past it: the caller checks shapes)."""
  total = 0
  for leaf in _leaves(x):
    if leaf is None: return cap + 1
    total += leaf[0] * leaf[1]
    if total > cap: break
  return total


def _least_leaf_reuse(x: UOp, elements: int) -> float:
  """`elements` (a reduce's source size) over the element count of the biggest value `x`'s kernel reads from memory
  (`_leaves`): how many reduce elements read each element of that input, at least (0 when one is symbolic)."""
  biggest = 1
  for leaf in _leaves(x):
    if leaf is None: return 0.0
    biggest = max(biggest, leaf[0])
  return elements / biggest


def _split_streaming_reduce(r: UOp) -> UOp:
  """`r` (an ADD or MAX REDUCE_AXIS into STREAMING_REDUCE_MIN_OUTPUTS or more outputs, whose inputs are more than
  CHUNK_BYTES) with its outermost reduced axis (size A) cut into G chunks: a partial reduce into (G, *r.shape),
  realized (CONTIGUOUS), then its sum over G. A conv's weight gradient sums (batch, pixels) into Cout*Cin*k*k
  outputs: one kernel blocks its outputs and each block streams the whole input and gradient from L3; each chunk's
  inputs (1/G of them) stay in L2 while all its output blocks are computed, and the chunks run on the CPU's threads.

  G is the smallest divisor of A with inputs/G <= CHUNK_BYTES, and the split is made only when the partials
  (G * outputs) are at most 1/PARTIAL_SHARE of the inputs' bytes (writing and reading them again costs less than the
  traffic saved), an output block's reduce streams more than a chunk (STREAMING_BLOCK_OUTPUTS) and, for a one-axis
  reduce, every input is read by STREAMING_MIN_LEAF_REUSE or more outputs. Any other reduce comes back unchanged."""
  op, axes = r.arg
  shp, out = r.src[0].shape, r.shape
  if op not in (Ops.ADD, Ops.MAX) or not axes or shp is None or out is None or not all_int(shp) or not all_int(out):
    return r
  outs, a = prod(out), min(axes)
  if outs < STREAMING_REDUCE_MIN_OUTPUTS or shp[a] < 2: return r
  if prod(shp[x] for x in axes) * STREAMING_BLOCK_OUTPUTS * r.dtype.itemsize <= CHUNK_BYTES: return r
  part_bytes = outs * r.dtype.itemsize
  inputs = _leaf_bytes(r.src[0], prod(shp) * r.dtype.itemsize // STREAMING_MIN_REUSE)  # past it: no split
  if inputs <= CHUNK_BYTES or inputs * STREAMING_MIN_REUSE > prod(shp) * r.dtype.itemsize: return r
  if len(axes) == 1 and _least_leaf_reuse(r.src[0], prod(shp)) < STREAMING_MIN_LEAF_REUSE: return r
  g = next((d for d in range(2, shp[a] + 1) if shp[a] % d == 0 and inputs <= CHUNK_BYTES * d), shp[a])
  if g * part_bytes * PARTIAL_SHARE > inputs: return r
  src = r.src[0].reshape((*shp[:a], g, shp[a] // g, *shp[a + 1:]))  # axis a -> (g, A/g): later axes move up one
  # (.., g, 1, ..): g stays where axis a was; tagged: `blocked_sums` leaves a chunk's sum as it is
  part = UOp(Ops.REDUCE_AXIS, r.dtype, (src,), (op, tuple(sorted(x + 1 for x in axes))), SPLIT_TAG).contiguous()
  return part.r(op, (a,)).reshape(out)


# ***** the cached part *****
@dataclass
class _Template:
  calls: list[UOp]
  becomes: list[tuple[UOp, UOp, UOp | None]]  # (normalized node, buffer placeholder, view over it or None)
  new_buffers: list[UOp]
  inputs: list[UOp] | None = None  # the input placeholders it uses (`_inputs_of`), found on first use
  runtime: Any = None  # a runtime's own record for running this schedule again without building it (see
                       # `cached_template`); it goes with the cache entry
  becomes_nodes: set[UOp] = field(default_factory=set)  # the nodes of `becomes` (found with `inputs`)
  graph: UOp | None = None  # the tensor graph after the rewrite passes, kept alive with the entry: a later graph that
                            # shares most of it (a JIT's capture step) rewrites into the same interned nodes, whose
                            # shapes and devices are known already


def _unbind(x: sint, memo: dict[UOp, UOp], dt: DType = dtypes.index) -> UOp:
  """A size or offset as a kernel expression of index dtype `dt`: ints become CONSTs, bound variables their
  DEFINE_VAR (cast to `dt` when wider: a kernel argument stays int32)."""
  if isinstance(x, int): return UOp.const(dt, x)
  if (ret := memo.get(x)) is None:
    sub: dict[UOp, UOp] = {}
    for n in x.toposort():
      if n.op is Ops.BIND: sub[n] = n.src[0] if n.src[0].dtype == dt else n.src[0].cast(dt)
      elif n.op is Ops.DEFINE_VAR: sub[n] = n if n.dtype == dt else n.cast(dt)
      elif n.op is Ops.CONST: sub[n] = n if n.dtype == dt or not dtypes.is_int(n.dtype) else UOp.const(dt, n.arg)
      else: sub[n] = n.replace(dtype=dt if n.dtype == dtypes.index else n.dtype, src=tuple(sub[s] for s in n.src))
    ret = memo[x] = sub[x]
  return ret


INT32_MAX = 2**31 - 1


def _index_dtype(sink: UOp) -> DType:
  """int64 when some value or buffer of the graph has more than 2**31-1 elements (its indices would wrap in int32),
  else int32: one index dtype for every kernel of the schedule."""
  for n in sink.toposort():
    if n.op is Ops.BUFFER and isinstance(n.arg, int) and n.arg > INT32_MAX: return dtypes.int64
    if (shp := n.shape) is not None:
      sz = 1
      for d in shp: sz *= d if isinstance(d, int) else int(_unbind(d, {}).vmax)
      if sz > INT32_MAX: return dtypes.int64
  return dtypes.index


def _max_int(x: sint, memo: dict[UOp, UOp]) -> int:
  return x if isinstance(x, int) else int(_unbind(x, {}, dtypes.int64).vmax)


def _view_of(u: UOp, base_buf: dict[UOp, UOp]) -> tuple[UOp, int] | None:
  """(buffer, element offset) when `u` is a contiguous view (RESHAPE/SHRINK chain) of a realized buffer, else None."""
  chain: list[UOp] = []
  x = u
  while x.op not in (Ops.BUFFER,) and x not in base_buf:
    if x.op not in (Ops.RESHAPE, Ops.SHRINK, Ops.CONTIGUOUS): return None
    if x.op is not Ops.CONTIGUOUS: chain.append(x)
    x = x.src[0]
  buf = x if x.op is Ops.BUFFER else base_buf[x]
  shape = shape_of(x)
  if not all_int(shape): return None
  strides, offset = strides_for_shape(shape), 0
  for m in reversed(chain):
    if not all_int(shape_of(m)) or any(isinstance(a, UOp) for a in _flat(m.arg)): return None
    if m.op is Ops.RESHAPE:
      if not _contiguous(shape, strides): return None
      shape, strides = shape_of(m), strides_for_shape(shape_of(m))
    else:
      offset += sum(b * st for (b, _), st in zip(m.arg, strides))
      shape = shape_of(m)
  if not _contiguous(shape, strides): return None
  return buf, offset


def _flat(a: Any) -> list[Any]:
  """The leaves of a nested tuple (a movement op's arg), in order."""
  out: list[Any] = []
  stack = [iter(a)]
  while stack:
    if (x := next(stack[-1], _END)) is _END: stack.pop()
    elif isinstance(x, tuple): stack.append(iter(x))
    else: out.append(x)
  return out


_END = object()


def _contiguous(shape: tuple[sint, ...], strides: tuple[sint, ...]) -> bool:
  canon = strides_for_shape(shape)
  return all(s == 1 or st == c for s, st, c in zip(shape, strides, canon))


def _grows(e: UOp) -> bool:
  """An EXPAND that really broadcasts (some size-1 dim becomes larger)."""
  return any(not (isinstance(a, int) and isinstance(b, int) and a == b)
             for a, b in zip(shape_of(e.src[0]), shape_of(e)))


MAX_FUSED_DEPTH = 512
"""An elementwise value more than this many ops deep in one fused kernel gets its own buffer: compilers' optimizers
(LLVM's included) take time superlinear in a kernel's longest chain, so a 10,000-op chain is 20 kernels, not one."""
SHARED_MIN_BUFFERS = 4
"""An elementwise value read by two or more kernels gets its own buffer when it reads at least this many buffers:
recomputed, each of c readers reads its k inputs again (c*k reads), stored it costs k reads, one write and c reads;
at c = 2 that pays from k = 4. (A transformer's residual stream, recomputed by every later layer, made kernels that
read 100 buffers.)"""
REDUCE_SPLIT_OUTPUTS = 1024
"""A reduce whose result (at least this many elements) is reduced again into fewer than this many outputs gets its
own kernel: fused, the outer kernel would run the inner reduce's outputs as a serial loop (`(a@b).sum()`: one thread,
no vector lanes); split, the inner one runs in parallel and the outer one sums a buffer."""
_TRANSCENDENTAL = (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW)
"""An exp2/log2/sin/pow that is broadcast (a growing EXPAND before any realized value or reduce) gets its own buffer:
fused, the kernel reading the broadcast would evaluate it once per broadcast element. Attention's P@V read the softmax's
exp of each score once per head dim (64x): a 32-token prefill's P@V kernels took 4 ms per layer."""
WINDOW_MIN_BUFFERS = 2  # an elementwise value read by a windowed reduce gets its own kernel when it reads this many
WINDOW_MIN_SIZE = 1 << 14  # buffers and has at least this many elements (smaller ones are cheap to recompute)
WINDOW_MIN_EVALS = 1 << 20
"""Or when its elements times the broadcast that the contraction reading it applies (a 1x1 conv's output channels,
a matmul's columns: `_decide`'s `growth`) reach this many: fused, the contraction evaluates the value once per
register block along the broadcast axis, so a small value under a wide broadcast is recomputed tens of times, each
time loading all of its buffers in the inner loop. efficientnet_b0's residual sums on 7x7 (192 channels, 9408
elements, read by a 1x1 conv to 1152 channels) and 14x14 (80 channels, to 480) were recomputed inside the next
block's expand conv: one thread of the Zen 4 (AVX-512), the 7x7 conv reading a sum of four buffers 441 us against
244 for the same conv reading one. It is WINDOW_MIN_SIZE elements under a broadcast of 64 (2^14 x 2^6), the widest
block a CPU's conv or matmul makes across its broadcast axis (2 vectors of 16 lanes x 2): below it, the value is
evaluated about once a block anyway. Not a matrix-vector product's vector (its contraction's outputs no more than
the broadcast: one row): the product streams its matrix, against which the vector's prologue costs little, and a
quantized product's int8 path (`x86_vnni`) takes the activations' quantization fused."""


def _walk_past_windows(users: Iterable[UOp], want: set[UOp], window: set[UOp], expands_w: dict[UOp, bool],
                       stops_w: dict[UOp, tuple[UOp, ...]],
                       padded_w: dict[UOp, bool]) -> tuple[bool, tuple[UOp, ...], bool]:
  """One step of `_decide`'s users-first walk with the window rule's values as stops too: (a growing EXPAND is
  reached before any stop, up to two stops reached, a PAD is passed before a window stop) from a node's `users`'
  answers.

  A value that reaches a window input only through that input's own kernel is fused there as its producer (a conv's
  activation, SiLU included, becomes the conv's epilogue), unless a PAD lies between: the window input then spans the
  padding too, and a reduce computed behind its padding gates can't be blocked (resnet18's stem conv inside the max
  pool's padded input ran 4x slower), so `_decide` realizes such a reduce itself."""
  exp, pad = False, False
  st: tuple[UOp, ...] = ()
  for c in users:
    if c.op is Ops.EXPAND and _grows(c): exp = True
    elif c in want or c in window or c.op in (Ops.REDUCE_AXIS, Ops.SINK):
      if c not in st and len(st) < 2: st = (*st, c)
    else:
      exp, pad = exp or expands_w[c], pad or padded_w[c] or (c.op is Ops.PAD and any(y in window for y in stops_w[c]))
      for y in stops_w[c]:
        if y not in st and len(st) < 2: st = (*st, y)
  return exp, st, pad


_EPILOGUE_MOVES = (Ops.RESHAPE, Ops.PERMUTE, Ops.CAST)  # what may sit between a contraction and its epilogue's ALU


def _read_by_reduce(x: UOp, children: dict[UOp, list[UOp]]) -> bool:
  """Whether a sum (REDUCE_AXIS with ADD: a global average pool, `.sum()`) reads `x` directly or through
  reshapes/permutes/casts only. Not a max: a 2x2 max pool of a conv + ReLU stays one kernel (its window's four
  positions unroll over the conv's block)."""
  stack = [x]
  while stack:
    for c in children.get(stack.pop(), ()):
      if c.op is Ops.REDUCE_AXIS and c.arg[0] is Ops.ADD: return True
      if c.op in _EPILOGUE_MOVES: stack.append(c)
  return False


def _ends_contraction(n: UOp, want: set[UOp], reduced_into: int | None, broadcasts: dict[UOp, bool],
                      below: dict[UOp, bool], children: dict[UOp, list[UOp]]) -> bool:
  """`_decide`'s rule for a contraction reduced again (`_contraction_reduced_again`), for node `n` (not wanted),
  visited sources first: whether `n` is the value to realize. The contraction gets its own kernel with its
  elementwise epilogue (SiLU): the value the outer reduce reads (through reshapes only) is realized, the contraction
  itself where the outer reduce reads it directly. `below[n]` is set: such a contraction is below `n`, through
  elementwise ops only; `reduced_into`: `_decide`'s, None where `n` reads no memory."""
  if n.op is Ops.REDUCE_AXIS:
    below[n] = n.tag != BLOCK_TAG and reduced_into is not None and all_int(shape_of(n)) and \
      prod(shape_of(n)) >= REDUCE_SPLIT_OUTPUTS and _contraction_reduced_again(n, broadcasts)
  elif n.op in GroupOp.ALU or n.op in _EPILOGUE_MOVES:
    below[n] = any(below.get(s, False) for s in n.src if s not in want)
  return below.get(n, False) and n.op not in _EPILOGUE_MOVES and _read_by_reduce(n, children)


def _contraction_reduced_again(r: UOp, broadcasts: dict[UOp, bool]) -> bool:
  """Whether REDUCE_AXIS `r` (reduced again by a reduce fused with it) is a contraction: a product whose operands are
  broadcast over each other's outputs (a conv, a matmul: `broadcasts` of its source). Fused into the outer reduce
  (a global pool after a 1x1 conv, `(a @ b).sum(1)`), each outer output would run the inner reduce's outputs as a
  serial loop: no register block reuses an operand across them, so the contraction runs at a fraction of its own
  kernel's speed (efficientnet_b0's last 1x1 conv + SiLU inside the pool: 24 GFLOPS). Split, it is a blocked
  GEMM-shaped kernel and the outer reduce sums its output, one extra buffer of the inner outputs."""
  return r.src[0] in broadcasts and broadcasts[r.src[0]]


EPILOGUE_MAX_OPS = 64
"""How many nodes `_epilogue_end` looks at past a contraction (a bias, a batch norm and an activation are a dozen):
a bound on the walk, so `_decide` stays linear in the graph."""


def _is_product(r: UOp, broadcasts: dict[UOp, bool]) -> bool:
  """Whether REDUCE_AXIS `r` sums a product of two different operands, one broadcast over the other's outputs (a
  conv, a matmul, a GEMV: `_epilogue_end`'s contractions). Not a variance or a sum of squares (`d * d`): a norm's
  statistics merge into one kernel (`_merges`), which reads its reduces themselves."""
  x = r.src[0]
  while x.op is Ops.CAST: x = x.src[0]
  return x.op is Ops.MUL and x.src[0] is not x.src[1] and broadcasts[x]


def _epilogue_region(r: UOp, want: set[UOp], children: dict[UOp, list[UOp]],
                     index: dict[UOp, int]) -> tuple[UOp, list[UOp]]:
  """The end of sum `r`'s elementwise epilogue (see `_epilogue_end`) and the region's nodes up to it in graph order
  (empty where the end is `r` itself)."""
  if not all_int(shape_of(r)) or r.arg[0] is not Ops.ADD: return r, []
  size, best, upto = prod(shape_of(r)), r, 0
  outside = {r: len(children.get(r, ()))}  # per region node: its users not in the region yet
  still_read = 1 if outside[r] else 0  # region nodes with users outside it
  heap = [(index[c], c) for c in children.get(r, ())]
  heapq.heapify(heap)
  seen, popped = {c for _, c in heap}, []
  while heap and len(outside) <= EPILOGUE_MAX_OPS:
    _, c = heapq.heappop(heap)
    if c in want or not (c.op in GroupOp.ALU or c.op in _EPILOGUE_MOVES) or not all_int(sh := shape_of(c)) or \
        prod(sh) != size: break
    popped.append(c)
    for s in dict.fromkeys(c.src):
      if s in outside:
        outside[s] -= 1
        still_read -= outside[s] == 0
    outside[c] = len(children.get(c, ()))
    still_read += outside[c] > 0
    if c.op in GroupOp.ALU and still_read == 1 and outside[c]: best, upto = c, len(popped)
    for u in children.get(c, ()):
      if u not in seen:
        seen.add(u)
        heapq.heappush(heap, (index[u], u))
  return best, popped[:upto]


def _epilogue_end(r: UOp, want: set[UOp], children: dict[UOp, list[UOp]], index: dict[UOp, int],
                  broadcasts: dict[UOp, bool]) -> UOp:
  """What `_decide` realizes for sum `r`, which the next product broadcasts (`expands_w`; where `r` is realized for
  other reasons, e.g. read by several kernels, this is not asked): the end of its elementwise epilogue where `r` is
  a contraction (`_is_product`) or the end feeds a product (`_feeds_product`: a pool's mean), else `r` itself.
  Realizing `r` left its epilogue (Gemm's bias, a batch norm, Hardswish, the mean's `/ n`) to every reader's load:
  mobilenet_v3_small's classifier evaluated the Hardswish between its two Gemms once per output column, 1000 times
  over its 1024 values, and the second Gemm's body was too big for its dot-product lanes. The epilogue is the region
  of ALU ops (and `_EPILOGUE_MOVES`) of `r`'s size reached from `r` in graph order, none of them wanted; its end is
  the last ALU op of it that is the only one read from outside it (Hardswish reads its input three times, all
  inside), so nothing else in the region is needed apart and the kernel count stays the same."""
  best, _ = _epilogue_region(r, want, children, index)
  return best if _is_product(r, broadcasts) or _feeds_product(best, children) else r


def _shared_epilogue(r: UOp, want: set[UOp], children: dict[UOp, list[UOp]],
                     index: dict[UOp, int]) -> tuple[UOp, list[UOp]]:
  """What `_decide` realizes for sum `r` read by two or more kernels through one elementwise epilogue with a
  transcendental in it (a depthwise conv's SiLU read by the squeeze-excite's mean and by its scale): the epilogue's end
  and its region, so the exp2 is evaluated once in the sum's kernel; else `r` itself and no region. Realizing `r` left
  the epilogue to its readers, and the transcendental rule then stored the exp2 in a kernel of its own:
  efficientnet_b0 wrote its depthwise conv, read it back to store exp2 of it, and read both in the two readers."""
  end, region = _epilogue_region(r, want, children, index)
  return (end, region) if any(x.op in _TRANSCENDENTAL for x in region) else (r, [])


def _feeds_product(x: UOp, children: dict[UOp, list[UOp]]) -> bool:
  """Whether `x` is broadcast (through movement ops) into a product that a sum reduces: a pool's mean read by the
  next Gemm, whose `/ n` was evaluated once per weight. Not a norm's mean (read by a subtraction) nor a softmax's
  sum (its reciprocal multiplies values that no sum reduces directly): their reduces merge into one kernel
  (`_merges`), which needs the reduces themselves realized."""
  stack = list(children.get(x, ()))
  while stack:
    c = stack.pop()
    if c.op in GroupOp.Movement: stack.extend(children.get(c, ()))
    elif c.op is Ops.MUL and (us := children.get(c, ())) and all(u.op is Ops.REDUCE_AXIS and u.arg[0] is Ops.ADD
                                                                  for u in us): return True
  return False


def _decide(sink: UOp) -> tuple[dict[UOp, None], dict[UOp, bool]]:
  """The nodes to realize, in graph order, and which nodes read memory.

  Linear in the graph: every property is one pass over the toposort (sources first) or its reverse (users first).
  A user's decision never depends on what is decided for a node before it, so the per-node questions below are
  answered about the graph's fixed `want` set (requested values, CONTIGUOUS, COPY and its source, ASSIGN); the one
  exception is a sum's epilogue realized with it (`_sum_realized`), decided with the sum for the nodes up to its end."""
  nodes = list(sink.toposort())
  index = {n: i for i, n in enumerate(nodes)}
  children: dict[UOp, list[UOp]] = defaultdict(list)
  for n in nodes:
    for s in dict.fromkeys(n.src): children[s].append(n)
  want: set[UOp] = set(sink.src)
  reads_memory: dict[UOp, bool] = {}
  # up to WINDOW_MIN_BUFFERS distinct memory leaves (BUFFER/COPY/ASSIGN) below each node (unions of capped sets)
  leaves: dict[UOp, tuple[UOp, ...]] = {}
  # a growing EXPAND below the node before any REDUCE_AXIS: a REDUCE_AXIS over one is a contraction (conv, matmul)
  broadcasts: dict[UOp, bool] = {}
  for n in nodes:
    mem = n.op in (Ops.BUFFER, Ops.COPY, Ops.ASSIGN)
    reads_memory[n] = mem or any(reads_memory[s] for s in n.src)
    broadcasts[n] = (n.op is Ops.EXPAND and _grows(n)) or (n.op is not Ops.REDUCE_AXIS and any(broadcasts[s]
                                                                                                for s in n.src))
    lv: tuple[UOp, ...] = (n,) if mem else ()
    for s in n.src:
      for x in leaves[s]:
        if len(lv) >= WINDOW_MIN_BUFFERS: break
        if x not in lv: lv = (*lv, x)
    leaves[n] = lv
    if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN): want.add(n)
    if n.op is Ops.COPY: want.add(n.src[0])

  # users first: must_realize[x] = (a growing EXPAND is reached before any stop, up to two stops reached), walking
  # from x to its users and stopping at wanted values, REDUCE_AXIS and SINK; windowed[x][g] = a REDUCE_AXIS is reached
  # through movement ops (then also ALU ops, once `g`: a broadcasting EXPAND was passed) with g true at the reduce.
  # The window rule is decided here (`window`: its test needs only windowed[x], known once x's users are walked), and
  # the same walk again with those values as stops too gives expands_w, stops_w and padded_w (a PAD passed before a
  # stop): what a value's kernel will really see past a window input that gets its own buffer anyway.
  expands: dict[UOp, bool] = {}
  stops: dict[UOp, tuple[UOp, ...]] = {}
  expands_w: dict[UOp, bool] = {}
  stops_w: dict[UOp, tuple[UOp, ...]] = {}
  padded_w: dict[UOp, bool] = {}
  window: set[UOp] = set()
  windowed: dict[UOp, tuple[bool, bool, int, int]] = {}  # and the widest such EXPAND, the most outputs of a reduce
  reduced_into: dict[UOp, int | None] = {}  # the fewest outputs of a REDUCE_AXIS that reduces this value (fused)
  for x in reversed(nodes):
    exp, w0, w1, g, o = False, False, False, 0, 0
    st: tuple[UOp, ...] = ()
    ri: int | None = None
    for c in children.get(x, ()):
      grows = c.op is Ops.EXPAND and _grows(c)
      if grows: exp = True
      elif c in want or c.op in (Ops.REDUCE_AXIS, Ops.SINK):
        if c not in st and len(st) < 2: st = (*st, c)
        if c.op is Ops.REDUCE_AXIS and c not in want and all_int(shape_of(c)):
          ri = prod(shape_of(c)) if ri is None else min(ri, prod(shape_of(c)))
      else:
        exp = exp or expands[c]
        for y in stops[c]:
          if y not in st and len(st) < 2: st = (*st, y)
        if (cri := reduced_into.get(c)) is not None: ri = cri if ri is None else min(ri, cri)
      if c in want: continue
      if c.op is Ops.REDUCE_AXIS: w1, o = True, max(o, _largest_size(shape_of(c)))
      elif c.op in GroupOp.Movement or _pad_fill(c, reads_memory):
        cw0, cw1, cg, co = windowed[c]
        w0, w1, o = w0 or (cw1 if grows else cw0), w1 or cw1, max(o, co)
        g = max(g, _largest_size(shape_of(c)) // max(1, _largest_size(shape_of(x))) if grows and cw1 else cg * cw0)
      elif c.op in GroupOp.ALU: w1, o = w1 or windowed[c][1], max(o, windowed[c][3])
    expands[x], stops[x], windowed[x], reduced_into[x] = exp, st, (w0, w1, g, o), ri
    expands_w[x], stops_w[x], padded_w[x] = _walk_past_windows(children.get(x, ()), want, window, expands_w, stops_w,
                                                               padded_w)
    if x.op in GroupOp.ALU and x not in want and w0 and _window_stored(x, g, o, leaves, reads_memory): window.add(x)

  # sources first, with the decisions made so far: what each node reads (a realized value is one buffer) and its depth
  contraction_below: dict[UOp, bool] = {}  # a contraction reduced again is below, through elementwise ops only
  depth: dict[UOp, int] = {}  # ops on the longest chain from a realized value (or an input) to this one
  reads: dict[UOp, tuple[UOp, ...]] = {}  # up to SHARED_MIN_BUFFERS distinct buffers its kernel would read for it
  in_epilogue: set[UOp] = set()  # a shared epilogue's region, realized with its sum (`_shared_epilogue`): not apart
  for n in nodes:
    if (end := _sum_realized(n, want, reads_memory, (expands_w, stops_w, padded_w), reduced_into, children, index,
                             broadcasts, in_epilogue)) is not None: want.add(end)
    elif n in window: want.add(n)
    elif n.op in _TRANSCENDENTAL and n not in want and n not in in_epilogue and reads_memory[n] and expands[n] and \
        (expands_w[n] or len(stops_w[n]) > 1):
      want.add(n)  # of any shape: one over a Variable (a dynamic batch or sequence) is recomputed the same way
    if n not in want and _ends_contraction(n, want, reduced_into[n] if reads_memory[n] else None, broadcasts,
                                           contraction_below, children): want.add(n)
    rd: tuple[UOp, ...] = (n,) if n.op in (Ops.BUFFER, Ops.COPY, Ops.ASSIGN) else ()
    for s in n.src:
      for x in ((s,) if s in want else reads[s]):
        if len(rd) >= SHARED_MIN_BUFFERS: break
        if x not in rd: rd = (*rd, x)
    if n.op in GroupOp.ALU and n not in want and n not in in_epilogue and len(stops[n]) > 1 and \
        len(rd) >= SHARED_MIN_BUFFERS and all_int(shape_of(n)): want.add(n)
    reads[n] = rd
    d = max((depth[s] for s in n.src), default=0) + (n.op in GroupOp.Elementwise or n.op is Ops.REDUCE_AXIS)
    if n.op in GroupOp.Elementwise and d > MAX_FUSED_DEPTH and n.shape is not None and all_int(n.shape): want.add(n)
    depth[n] = 0 if n in want else d
  return {n: None for n in nodes if n in want and n.op is not Ops.SINK}, reads_memory


def _sum_realized(n: UOp, want: set[UOp], reads_memory: dict[UOp, bool],
                  walk: tuple[dict[UOp, bool], dict[UOp, tuple[UOp, ...]], dict[UOp, bool]],
                  reduced_into: dict[UOp, int | None], children: dict[UOp, list[UOp]], index: dict[UOp, int],
                  broadcasts: dict[UOp, bool], in_epilogue: set[UOp]) -> UOp | None:
  """`_decide`'s rule for a sum (REDUCE_AXIS `n`, not wanted, visited sources first): what to realize for it, None if
  nothing. `walk` is `_walk_past_windows`' answers (expands_w, stops_w, padded_w). A sum gets its own kernel where the
  next product broadcasts it (with its epilogue: `_epilogue_end`), where two or more kernels read it (with its
  epilogue where that holds a transcendental: `_shared_epilogue`, whose region is added to `in_epilogue`), where a
  padding lies between it and a window, and where a reduce fused with it would have fewer than REDUCE_SPLIT_OUTPUTS
  outputs while it has at least that many."""
  expands_w, stops_w, padded_w = walk
  if n.op is not Ops.REDUCE_AXIS or n in want or not reads_memory[n] or n.tag == BLOCK_TAG: return None
  shared, ri, sh = len(stops_w[n]) > 1, reduced_into[n], shape_of(n)
  split = ri is not None and ri < REDUCE_SPLIT_OUTPUTS and all_int(sh) and prod(sh) >= REDUCE_SPLIT_OUTPUTS
  if not (expands_w[n] or shared or padded_w[n] or split): return None
  if expands_w[n]: return _epilogue_end(n, want, children, index, broadcasts)
  if not shared or padded_w[n]: return n
  end, region = _shared_epilogue(n, want, children, index)
  in_epilogue.update(region)
  return end


def _window_stored(x: UOp, growth: int, outputs: int, leaves: dict[UOp, tuple[UOp, ...]],
                   reads_memory: dict[UOp, bool]) -> bool:
  """The window rule for elementwise value `x`, read by a contraction (`_decide`'s windowed[x][0]) that broadcasts it
  `growth` times into `outputs` outputs: it reads WINDOW_MIN_BUFFERS buffers, is not a constant pad's fill, and has
  WINDOW_MIN_SIZE elements or WINDOW_MIN_EVALS evaluations where the contraction has more outputs than the broadcast
  (not a matrix-vector product's vector)."""
  size = _largest_size(shape_of(x))
  return reads_memory[x] and len(leaves[x]) >= WINDOW_MIN_BUFFERS and not _pad_fill(x, reads_memory) and \
    (size >= WINDOW_MIN_SIZE or (size * growth >= WINDOW_MIN_EVALS and outputs > growth))


def _pad_fill(x: UOp, reads_memory: dict[UOp, bool]) -> bool:
  """Whether `x` is a constant pad's fill (`Tensor.pad(value=v)`, max pooling's -inf border): WHERE(PAD of a
  constant mask, PAD of a value, a constant). `_decide`'s window rule sees through it as through the PAD itself:
  the value under the PAD is the window input (a conv with its ReLU as the epilogue, stored unpadded) and the pool
  reads it behind the padding's gates with the fill as their else, where before the padded copy was realized (its
  own kernel: resnet18's stem wrote a 114x114 copy of each 112x112 channel for the max pool)."""
  if x.op is not Ops.WHERE: return False
  mask, val, fill = x.src
  return mask.op is Ops.PAD and val.op is Ops.PAD and mask.arg == val.arg and not reads_memory[mask] and \
    not reads_memory[fill]


def _largest_size(shape: tuple[sint, ...] | None) -> int:
  """The most elements a value of `shape` holds (a symbolic dim at its Variable's largest value; 0 for no shape).
  The window rule of `_decide` weighs a value of symbolic shape by it, not by a typical size: realizing a value
  that turns out small costs one more launch, while recomputing a big one per window position (GELU's erf per
  column block of the next matmul, scalar) cost bert_tiny's symbolic FFN 2.3 ms against 0.4 ms realized."""
  if shape is None: return 0
  return prod(_max_int(d, {}) for d in shape)


def _plain_assign(a: UOp) -> bool:
  """An ASSIGN whose target is its whole buffer, contiguously (so it writes element i of the buffer at index i)."""
  return _whole(_strip_assign(a.src[0]), _assign_base(a.src[0])[0])


def _whole(view: UOp, buf: UOp) -> bool:
  """Whether `view` is all of `buf`, contiguously from element 0 (a prefix of it is not)."""
  return _view_of(view, {}) == (buf, 0) and prod(shape_of(view)) == buf.arg


def _merges(realize: dict[UOp, None]) -> dict[UOp, list[UOp]]:
  """Multi-output kernels: {v: [u, ...]} where reduce u (same shape and device as reduce v) is read directly by v's
  kernel (softmax's max by its sum, layernorm's mean by its variance), so v's kernel computes u and stores it too.
  Likewise an ASSIGN whose value reads another ASSIGN's result (an optimizer's parameter update reading the new
  moments) performs both, when both write whole buffers of the same shape."""
  out: dict[UOp, list[UOp]] = {}
  merged: set[UOp] = set()
  for v in realize:
    if v.op not in (Ops.REDUCE_AXIS, Ops.ASSIGN) or v in merged: continue
    if v.op is Ops.ASSIGN and not _plain_assign(v): continue
    direct: dict[UOp, None] = {}
    stack, seen = list(v.src[1:] if v.op is Ops.ASSIGN else v.src), set(v.src)
    while stack:
      x = stack.pop()
      if x in realize:
        direct[x] = None
        continue
      for s in x.src:
        if s not in seen:
          seen.add(s)
          stack.append(s)
    for u in direct:
      if u.op is not v.op or u in merged or u in out or u.shape != v.shape or u.device != v.device: continue
      if u.op is Ops.ASSIGN and (not _plain_assign(u) or _assign_base(u.src[0])[0] is _assign_base(v.src[0])[0]):
        continue
      if any(u in w.toposort() for w in direct if w is not u): continue  # v would wait for a reader of u: a cycle
      out.setdefault(v, []).append(u)
      merged.add(u)
  return out


def _costly(reads_memory: dict[UOp, bool], u: UOp) -> bool:
  """Whether recomputing `u` is worth a buffer: it reads memory and is not itself a buffer, constant or view."""
  return reads_memory.get(u, False) and u.op not in (Ops.BUFFER, Ops.CONST, Ops.BIND, Ops.DEFINE_VAR) and \
    u.op not in GroupOp.Movement


def _schedule(sink: UOp, expose: frozenset[UOp] = frozenset(), started: tuple[_Scheduler, UOp] | None = None) \
    -> _Template:
  """Schedule a normalized sink: the passes of STAGES in order. `expose`: nodes that, when they get a buffer anyway,
  are reported in `becomes` (and kept out of buffer reuse); `started`: an attempt that ran the passes up to `decide`
  (`_run_stages`) and that pass's output, to go on from.

  When the `order` pass finds a cycle, `_next_attempt` decides how to build the kernels again (from `kernels` on)."""
  if started is None:
    st = _Scheduler(sink, expose=expose)
    graph, start = _run_stages(st, sink, 0, _STAGE_AT["decide"] + 1), _STAGE_AT["decide"] + 1
  else: (st, graph), start = started, _STAGE_AT["decide"] + 1
  st.expose_pre = expose
  while True:
    assert graph is not None, "the passes before `order` always give a graph"
    if _run_stages(st, graph, start) is not None: return st.template()
    st, graph = st.retry()


def _run_stages(st: _Scheduler, graph: UOp, start: int, stop: int | None = None) -> UOp | None:
  """Run STAGES[start:stop] on `graph` with attempt `st`, each shown as a step (`_show_stage`); the last one's output,
  None when a pass gives None (`order`: a cycle)."""
  for name, fn in STAGES[start:stop]:
    t0 = time.perf_counter()
    if (nxt := fn(st, graph)) is None: return None
    _show_stage(name, graph, nxt, t0)
    graph = nxt
  return graph


def _next_attempt(st: _Scheduler) -> tuple[bool, bool]:
  """(merge, safe_assign) for the next attempt after `st`'s calls could not be ordered (a dependency cycle): without
  multi-output kernels when it had some; then, when it assigns (e.g. a swap), every ASSIGN computing its value into a
  temporary first (all reads happen before all writes). A RuntimeError when neither is left to try."""
  if st.merges: return False, st.safe_assign
  if not st.safe_assign and st.writers: return False, True
  raise RuntimeError("can't order this schedule: some value needs a buffer as it was between two ASSIGNs into it "
                     "(after one and before the next); realize that value before the second assign")


def _show_stage(name: str, before: UOp, after: UOp, t0: float) -> None:
  """A scheduler stage's step for tracing: VIZ (`Recorder.stage`), `DEBUG>=3` a line (its output's size and time),
  `DEBUG>=7` its output graph."""
  if _trace.RECORDER is not None: _trace.RECORDER.stage(name, before, after)
  if DEBUG >= 3:
    print(f"  sched {name:9s} {len(after.src):6d} {'calls' if after.op is Ops.LINEAR else 'values'} in "
          f"{(time.perf_counter() - t0) * 1e3:.2f} ms")
  if DEBUG >= 7: print(f"after {name}:\n{after}")


class _Scheduler:
  """One attempt at scheduling a normalized sink: the state that the passes of STAGES (decide, kernels, order,
  memory) share. `merge`: multi-output kernels; `safe_assign`: every ASSIGN computes its value into a temporary
  first. Lives for one `_schedule` attempt; nothing of it is stored on the graph."""

  def __init__(self, sink: UOp, merge: bool = True, safe_assign: bool = False, expose: frozenset[UOp] = frozenset(),
               decided: tuple[dict[UOp, None], dict[UOp, bool]] | None = None) -> None:
    self.merge, self.safe_assign = merge, safe_assign
    self.expose_pre = expose  # as the caller names them (nodes of the normalized graph) ...
    self.expose: frozenset[UOp] = expose  # ... and their images after the graph passes (the `kernels` pass)
    self.image: dict[UOp, UOp] | None = None  # normalized node -> its image after views/split_reduces/blocked_sums
    self.decided = decided  # (values to realize in graph order, which nodes read memory): the `decide` pass
    self.decided_sink = sink  # the graph `decide` was given (a retry starts over from `kernels` with it)
    self.realize: dict[UOp, None] = {}
    self.costly: Any = None
    self.memo: dict[UOp, UOp] = {}
    self.idx_dt: DType = dtypes.index  # (the `decide` pass: `_index_dtype` of its graph)
    self.new_buffers: list[UOp] = []
    self.roots: set[UOp] = set(sink.src)
    self.bufs: dict[UOp, UOp] = {}       # realized node -> BUFFER holding it contiguously (read through it)
    self.view_bufs: dict[UOp, UOp] = {}  # realized node that is a view: the buffer standing for it (walked through)
    self.producer: dict[UOp, int] = {}   # realized node (or ASSIGN) -> index of the call that makes it
    self.buf_producer: dict[UOp, int] = {}  # new BUFFER -> index of the call that writes it
    self.calls: list[UOp] = []
    self.deps: list[set[int]] = []
    self.call_reads: list[list[UOp]] = []
    self.call_assigns: list[list[UOp]] = []   # the ASSIGN results each call reads (it runs after them)
    self.readers: dict[tuple[UOp, UOp | None], list[int]] = defaultdict(list)   # (BUFFER, ASSIGN version) -> calls
    self.writers: list[tuple[int, UOp, UOp | None]] = []                       # (call, BUFFER, version it overwrites)
    self.becomes: list[tuple[UOp, UOp, UOp | None]] = []
    self.slice_bufs: set[UOp] = set()
    self.snapshots: dict[UOp, UOp] = {}
    self.merges: dict[UOp, list[UOp]] = {}
    self.merged: set[UOp] = set()
    self.ordered: list[UOp] = []      # the calls in execution order (the `order` pass)
    self.planned: list[UOp] = []      # ... with buffers reused (the `memory` pass)

  # ***** the passes (STAGES): each takes the graph the one before gave *****
  def rewritten(self, sink: UOp, m: dict[UOp, UOp]) -> UOp:
    """`sink`'s image under a tensor-graph rewrite whose node map is `m`; each normalized node's image is kept (what
    the template's `becomes` and `expose` are translated through)."""
    self.image = m if self.image is None else {k: m[v] for k, v in self.image.items() if v in m}
    return m[sink]

  def views(self, sink: UOp) -> UOp:
    """Pass `views` (stage 1b, `pm_views`): the normalized sink with view round trips (reshape or permute and back)
    removed."""
    return self.rewritten(sink, graph_rewrite_map(sink, pm_views, name="views"))

  def split_reduces(self, sink: UOp) -> UOp:
    """Pass `split_reduces` (stage 1c, `pm_split_reduces`): a big reduce into few outputs, or one whose inputs are
    bigger than L2, as partial reduces and their reduce (`_split_reduce`)."""
    return self.rewritten(sink, graph_rewrite_map(sink, pm_split_reduces, ctx=set(), name="split_reduces"))

  def blocked_sums(self, sink: UOp) -> UOp:
    """Pass `blocked_sums` (stage 1d, `pm_blocked_sums`): every big float sum `split_reduces` left as a tree of sums
    (`_blocked_reduce`, the accumulation contract); inner levels carry BLOCK_TAG."""
    return self.rewritten(sink, graph_rewrite_map(sink, pm_blocked_sums, name="blocked_sums"))

  def decide(self, sink: UOp) -> UOp:
    """Pass `decide` (stage 2): the rewritten sink -> a SINK of the values to realize, in graph order (`_decide`)."""
    if self.decided is None: self.decided = _decide(sink)
    self.decided_sink = sink
    self.realize, reads_memory = self.decided
    self.costly = functools.partial(_costly, reads_memory)
    self.idx_dt, self.roots = _index_dtype(sink), set(sink.src)
    return UOp.sink(*self.realize)

  def kernels(self, realized: UOp) -> UOp:
    """Pass `kernels` (stage 3): the SINK of values to realize -> a LINEAR of their CALLs in the order they were
    built (`build_kernels`)."""
    img = self.image
    self.expose = self.expose_pre if img is None else frozenset(img[e] for e in self.expose_pre if e in img)
    self.build_kernels()
    return UOp(Ops.LINEAR, src=tuple(self.calls))

  def order(self, built: UOp) -> UOp | None:
    """Pass `order` (stage 4): the built CALLs -> a LINEAR of them in execution order, from read-after-write and
    write-after-read dependencies (plus the copies `snapshot_exposed_versions` adds); None when they have a cycle."""
    deps, buf_producer, producer = self.deps, self.buf_producer, self.producer
    for i, reads in enumerate(self.call_reads):
      deps[i] |= {buf_producer[b] for b in reads if b in buf_producer and buf_producer[b] != i}
      deps[i] |= {producer[a] for a in self.call_assigns[i] if producer[a] != i}
    for i, b, ver in self.writers:  # write-after-read: every reader of the overwritten version runs first
      for j in self.readers[(b, ver)]:
        if j != i: deps[i].add(j)
    self.snapshot_exposed_versions()
    if (order := _toposort_calls(deps)) is None: return None
    self.ordered = [self.calls[i] for i in order]
    return UOp(Ops.LINEAR, src=tuple(self.ordered))

  def memory(self, ordered: UOp) -> UOp:
    """Pass `memory` (stage 4): the ordered CALLs -> the same with intermediate buffers reused once freed
    (`memory_plan`); the caller's buffers (inputs, results, SLICE views) are kept."""
    calls = list(ordered.src)
    inputs = {b for b in itertools.chain.from_iterable(c.src[1:] for c in calls) if b.src[0].arg[0] == "in"}
    keep_bufs = {b for _, b, _ in self.becomes} | self.slice_bufs | inputs
    if plan := memory_plan(calls, keep_bufs): ordered = graph_rewrite(ordered, pm_reuse_buffers, plan, name="memory")
    self.planned = list(ordered.src)
    return ordered

  def retry(self) -> tuple[_Scheduler, UOp]:
    """The next attempt (`_next_attempt`) after this one's calls could not be ordered, and its `decide` output: it
    goes on from `kernels`, with this one's graph passes and decisions."""
    merge, safe_assign = _next_attempt(self)
    nxt = _Scheduler(self.decided_sink, merge, safe_assign, self.expose_pre, self.decided)
    nxt.image = self.image
    return nxt, nxt.decide(self.decided_sink)

  def template(self) -> _Template:
    """The cache entry: the planned calls, what the values become (named by the normalized nodes they are images
    of), the new buffers they use."""
    used = {b for c in self.planned for b in c.src[1:]} | {b for _, b, _ in self.becomes}
    becomes = self.becomes
    if self.image is not None:
      wanted, pre = {n for n, _, _ in becomes}, defaultdict(list)
      for k, v in self.image.items():
        if v in wanted: pre[v].append(k)
      becomes = [(k, b, view) for n, b, view in becomes for k in pre.get(n, (n,))]
    return _Template(self.planned, becomes, [b for b in self.new_buffers if b in used], graph=self.decided_sink)

  # ***** helpers *****
  def ks(self, x: sint) -> UOp: return _unbind(x, self.memo, self.idx_dt)

  def new_buffer(self, like: UOp, device: Any) -> UOp:
    b = _placeholder("new", len(self.new_buffers), like.dtype, device, _max_int(prod(shape_of(like)), self.memo))
    self.new_buffers.append(b)
    return b

  def add_call(self, call: UOp, reads: list[UOp], assigns: list[UOp] | None = None) -> int:
    self.calls.append(call)
    self.deps.append(set())
    self.call_reads.append(reads)
    self.call_assigns.append(assigns or [])
    return len(self.calls) - 1

  def builder(self, current: UOp, inline: set[UOp] | None = None) -> KernelBuilder:
    """A KernelBuilder for `current`'s kernel (reading the values realized so far, not those in `inline`; an
    assigned buffer's original value from its snapshot, if it has one)."""
    kb = KernelBuilder(functools.partial(_buffer_of, current, inline or set(), self.bufs), self.ks, self.costly)
    kb.snapshots = self.snapshots
    return kb

  def built(self, u: UOp) -> bool: return u in self.bufs or u in self.view_bufs or u in self.producer

  # ***** stage 3: one kernel per realized value *****
  def kernel(self, r: UOp, extra: tuple[tuple[UOp, UOp], ...] = (), also: tuple[UOp, ...] = ()) -> NotMerged | None:
    """Build r's kernel (storing `extra` and `also` too); a value it would recompute at too many indices gets its own
    kernel first, then r's is built again (an explicit stack of the kernels waiting). NotMerged: a value meant to be
    stored by r's kernel isn't computed there (nothing was built for r)."""
    stored_here = set(also) | {u for u, _ in extra}
    stack: list[tuple[UOp, tuple[tuple[UOp, UOp], ...], tuple[UOp, ...]]] = [(r, extra, also)]
    while stack:
      node, ex, al = stack[-1]
      res = self.kernel_once(node, ex, al)
      if isinstance(res, NotMerged): return res
      if res is None:
        stack.pop()
        continue
      if len(stack) == 1 and res.node in stored_here: return NotMerged("a value stored here is recomputed")
      if res.node in self.bufs: raise RuntimeError(f"scheduler: realizing {res.node.op} did not stop its recomputation")
      stack.append((res.node, (), ()))  # every source of it comes earlier in graph order, so it can be built now
    return None

  def kernel_once(self, r: UOp, extra: tuple[tuple[UOp, UOp], ...] = (),
                  also: tuple[UOp, ...] = ()) -> NeedsBuffer | NotMerged | None:
    """Build r's kernel, or say why not (a value to realize first; a merge that doesn't hold)."""
    inline = {u for u, _ in extra} | set(also)
    kb = self.builder(r, inline)
    kb.inline = {u for u in inline if u.op is Ops.ASSIGN}
    if r.op is Ops.ASSIGN:
      res = self.assign_ast(kb, r, extra)
      if not isinstance(res, tuple): return res
      ast, kb, out = res
    else:
      out = self.bufs[r] if r in self.bufs else self.new_buffer(r, r.device)
      also_bufs = tuple((a, self.bufs[a] if a in self.bufs else self.new_buffer(a, a.device)) for a in also)
      built = kb.kernel(r.src[0] if r.op is Ops.CONTIGUOUS else r, out, shape_of(r), extra=extra,
                        also=tuple((a.src[0] if a.op is Ops.CONTIGUOUS else a, b) for a, b in also_bufs))
      if not isinstance(built, UOp): return built
      ast = built
      extra = extra + also_bufs
    nout = 1 + len(extra)
    if len(devs := {b.src[1].arg for b in kb.params}) > 1:
      raise ValueError(f"a kernel for {r.op} {shape_of(r)} reads buffers on several devices {sorted(devs)}; "
                       f"move them to one device first (Tensor.to / COPY)")
    i = self.add_call(UOp(Ops.CALL, src=(ast, *kb.params)), list(kb.params)[nout:], kb.assigns_read)
    for b, ver in kb.buffer_reads: self.readers[(b, ver)].append(i)
    self.producer[r] = i
    if r.op is Ops.ASSIGN:
      for a, _ in ((r, out), *extra):
        abuf, aver = _assign_base(a.src[0])
        if aver is not None: self.call_assigns[i].append(aver)
        self.writers.append((i, abuf, aver))
        self.producer[a] = i
        tv = _strip_assign(a.src[0])
        self.becomes.append((a, abuf, None if _whole(tv, abuf) else tv))
      return None
    for u, b in ((r, out), *extra):
      self.bufs[u], self.producer[u], self.buf_producer[b] = b, i, i
      if u in self.roots or u.op is Ops.CONTIGUOUS or u in self.expose: self.becomes.append((u, b, None))
    return None

  def assign_ast(self, kb: KernelBuilder, r: UOp, extra: tuple[tuple[UOp, UOp], ...]) \
      -> tuple[UOp, KernelBuilder, UOp] | NeedsBuffer | NotMerged:
    """The kernel AST of ASSIGN `r` (and the assigns in `extra`), its builder and the buffer it writes; a value that
    reads the target elsewhere than where it writes (e.g. `x.assign(x.T)`, or every ASSIGN under `safe_assign`) is
    computed into a temporary first (a call of its own)."""
    target, value = r.src
    out = _assign_base(target)[0]
    ast = kb.kernel(value, out, shape_of(r), out_view=target, extra=extra)
    if not isinstance(ast, UOp): return ast
    if extra and any(_reads_elsewhere(ast, kb.params[b]) for b in (out, *(b for _, b in extra))):
      return NotMerged("an assign in this kernel reads a target at other elements")
    if self.safe_assign or _reads_elsewhere(ast, kb.params[out]):
      tmp = self.new_buffer(r, r.device)
      kt = self.builder(value)
      if not isinstance(tast := kt.kernel(value, tmp, shape_of(r)), UOp): return tast
      it = self.add_call(UOp(Ops.CALL, src=(tast, *kt.params)), list(kt.params)[1:], kt.assigns_read)
      for b, ver in kt.buffer_reads: self.readers[(b, ver)].append(it)
      self.buf_producer[tmp] = it
      kb = KernelBuilder(functools.partial(_buffer_of, r, set(), self.bufs), self.ks, self.costly)
      ast = kb.kernel(tmp.reshape(shape_of(r)), out, shape_of(r), out_view=target)
      assert isinstance(ast, UOp), "a kernel copying a temporary reads nothing twice"
    return ast, kb, out

  def snapshot_assigned(self) -> None:
    """safe_assign: copy every assigned buffer first; reads of its old value read the copy (no read waits on a
    write)."""
    for a in self.realize:
      if a.op is not Ops.ASSIGN or (base := _assign_base(a.src[0])[0]) in self.snapshots: continue
      snap = self.new_buffer(base, base.src[1].arg)
      kc = KernelBuilder(functools.partial(_buffer_of, snap, set(), self.bufs), self.ks)
      ast = kc.kernel(base, snap, (base.arg,))
      assert isinstance(ast, UOp), "a copy of a buffer reads nothing twice"
      i = self.add_call(UOp(Ops.CALL, src=(ast, *kc.params)), [base])
      self.readers[(base, None)].append(i)
      self.snapshots[base], self.buf_producer[snap] = snap, i

  def copy(self, r: UOp) -> None:
    """A COPY: a call copying its (realized) source to a new buffer on its device."""
    src = r.src[0]
    inb = self.bufs.get(src, self.view_bufs.get(src, src if src.op is Ops.BUFFER else None))
    if inb is None: raise RuntimeError(f"COPY source {src.op} was not realized")
    out = self.new_buffer(r, r.src[1].arg)
    i = self.add_call(UOp(Ops.CALL, src=(UOp(Ops.COPY), out, inb)), [inb])
    self.readers[(inb, None)].append(i)
    self.bufs[r], self.producer[r], self.buf_producer[out] = out, i, i
    self.becomes.append((r, out, None))

  def view(self, r: UOp, base: UOp, off: int, keep: bool) -> None:
    """A value that is a contiguous view of buffer `base` at element offset `off`: no kernel (the buffer itself, or a
    SLICE call)."""
    if off == 0 and prod(shape_of(r)) == base.arg: self.view_bufs[r] = base
    else:
      out = self.new_buffer(r, r.device)
      i = self.add_call(UOp(Ops.CALL, src=(UOp(Ops.SLICE, arg=off * base.dtype.itemsize), out, base)), [base])
      self.readers[(base, None)].append(i)
      self.slice_bufs.update((out, base))
      self.view_bufs[r] = out
      self.producer[r] = self.buf_producer[out] = i
    if keep: self.becomes.append((r, self.view_bufs[r], None))

  def build_kernels(self) -> None:
    """Stage 3: a call for every realized value, in graph order (kernels, COPYs, SLICE views)."""
    self.merges = _merges(self.realize) if self.merge else {}
    self.merged = {u for us in self.merges.values() for u in us}
    for u in self.merged:
      if u.op is not Ops.ASSIGN: self.bufs[u] = self.new_buffer(u, u.device)  # an ASSIGN writes its target's buffer
    if self.safe_assign: self.snapshot_assigned()
    grouped: set[UOp] = set()
    topos: dict[UOp, dict[UOp, None]] = {}  # a requested value's graph, walked once however many siblings ask
    merges, merged, realize, roots = self.merges, self.merged, self.realize, self.roots
    pending_roots = [r for r in realize if r in roots and r.op in _GROUPABLE and r not in merged and r not in merges]
    for r in realize:
      keep = r in roots or r.op in (Ops.CONTIGUOUS, Ops.ASSIGN, Ops.COPY) or r in self.expose
      if r.op is Ops.BUFFER:
        if keep: self.becomes.append((r, r, None))
        continue
      if r in merged: continue  # stored by the kernel of the reduce that reads it
      if r.op is Ops.COPY:
        self.copy(r)
        continue
      if r.op is not Ops.ASSIGN and (v := _view_of(r.src[0] if r.op is Ops.CONTIGUOUS else r, self.bufs)) is not None:
        self.view(r, v[0], v[1], keep)
        continue
      if r in grouped: continue  # stored by the kernel of an earlier output of the same shape
      if r in merges:
        extra = tuple((u, self.bufs[u] if u.op is not Ops.ASSIGN else _assign_base(u.src[0])[0]) for u in merges[r])
        if self.kernel(r, extra) is None: continue
        for u in merges[r]: self.kernel(u)  # each gets its own kernel after all
      also = _siblings(r, pending_roots, realize, self.built, topos) if self.merge and r in roots and \
        r.op is not Ops.ASSIGN else ()
      grouped.update(also)
      if self.kernel(r, also=also) is not None:  # the siblings get their own kernels when their turn comes
        grouped.difference_update(also)
        self.kernel(r)

  # ***** stage 4 *****
  def snapshot_exposed_versions(self) -> None:
    """An ASSIGN result that other live graphs read (`expose`) but that a later ASSIGN of this schedule overwrites
    can't be read from its buffer afterwards: it is copied into a buffer of its own right after its kernel (before the
    overwrite), and that copy is what it `becomes`. (Two `Tensor.rand` draws, the second realized first: the first
    draw's counter version was the counter's final value, so the first draw repeated the second's numbers.)"""
    for k, (node, buf, _) in enumerate(self.becomes):
      if node.op is not Ops.ASSIGN or node not in self.expose or (pa := self.producer.get(node)) is None: continue
      later = [i for i, b, _ in self.writers if b is buf and i != pa and _reaches(self.deps, i, pa)]
      if not later: continue
      snap = self.new_buffer(node, node.device)
      kb = KernelBuilder(functools.partial(_buffer_of, snap, set(), self.bufs), self.ks, self.costly)
      ast = kb.kernel(node, snap, shape_of(node))
      assert isinstance(ast, UOp), "a copy of an assigned buffer reads nothing twice"
      i = self.add_call(UOp(Ops.CALL, src=(ast, *kb.params)), [], kb.assigns_read)
      self.deps[i].add(pa)
      for j in later: self.deps[j].add(i)
      self.becomes[k] = (node, snap, None)



STAGES: list[tuple[str, Callable[[_Scheduler, UOp], UOp | None]]] = [
  ("views", _Scheduler.views),
  ("split_reduces", _Scheduler.split_reduces),
  ("blocked_sums", _Scheduler.blocked_sums),
  ("decide", _Scheduler.decide),
  ("kernels", _Scheduler.kernels),
  ("order", _Scheduler.order),
  ("memory", _Scheduler.memory),
]
"""The cached part of the scheduler as named passes, in order (docs/PIPELINE.md §2): each, a method of the attempt's
`_Scheduler` (the state they share), takes the graph the one before returned and returns its own (shown in VIZ and by
DEBUG, `_show_stage`); `order` returns None when the calls have a cycle (`_next_attempt`). The first three rewrite
the tensor graph (`graph_rewrite` with `pm_views`, `pm_split_reduces`, `pm_blocked_sums`), `memory` the CALLs' buffers
(`pm_reuse_buffers`). `normalize` before them and
`rebind` after them run outside the schedule cache, in `create_schedule`."""
_STAGE_AT = {name: k for k, (name, _) in enumerate(STAGES)}


def _reaches(deps: list[set[int]], i: int, target: int) -> bool:
  """Whether call `i` depends on call `target`, directly or not."""
  stack, seen = [i], {i}
  while stack:
    x = stack.pop()
    if x == target: return True
    for d in deps[x] - seen:
      seen.add(d)
      stack.append(d)
  return False


def _reads_elsewhere(ast: UOp, out_param: UOp) -> bool:
  """Whether a kernel reads its output buffer anywhere but at the element it writes (a write/read hazard)."""
  store_idx = next(st.src[0] for st in ast.src if st.op is Ops.STORE and st.src[0].src[0] is out_param)
  return any(u.op is Ops.INDEX and u.src[0] is out_param and u is not store_idx and u.src[1] is not store_idx.src[1]
             for u in ast.toposort())


_GROUPABLE = GroupOp.Elementwise | {Ops.REDUCE_AXIS, Ops.CONTIGUOUS}


def _siblings(r: UOp, pending: list[UOp], realize: dict[UOp, None], built: Any,
              topos: dict[UOp, dict[UOp, None]]) -> tuple[UOp, ...]:
  """Requested values after `r` with r's shape and device that share its kernel (one kernel, several STOREs): none
  depends on another, and every realized value they read already has its kernel. `topos` memoizes their graphs."""
  def topo(u: UOp) -> dict[UOp, None]:
    if (t := topos.get(u)) is None: t = topos[u] = u.toposort()
    return t
  out: list[UOp] = []
  for s in pending:
    if s is r or s.shape != r.shape or s.device != r.device or built(s): continue
    if any(g in topo(s) or s in topo(g) for g in (r, *out)): continue
    stack, seen, ok = list(s.src), set(s.src), True
    while stack and ok:
      x = stack.pop()
      if x.op is Ops.BUFFER or built(x): continue
      if x in realize:
        ok = False
        break
      for y in x.src:
        if y not in seen:
          seen.add(y)
          stack.append(y)
    if ok: out.append(s)
  return tuple(out)


def _buffer_of(current: UOp, inline: set[UOp], bufs: dict[UOp, UOp], u: UOp) -> UOp | None:
  """The buffer a kernel for `current` reads `u` from: input BUFFERs and realized values (not `current` itself, nor
  the values it computes and stores as extra outputs)."""
  if u is current or u in inline: return None
  return u if u.op is Ops.BUFFER else bufs.get(u)


def _assign_base(target: UOp) -> tuple[UOp, UOp | None]:
  """The BUFFER an ASSIGN writes and the ASSIGN whose result it overwrites (None: the buffer's original value): the
  first ASSIGN on the way down the target's view chain, and the BUFFER at its bottom (through nested ASSIGNs)."""
  x, version = target, None
  while x.op is not Ops.BUFFER:
    if x.op is Ops.ASSIGN and version is None: version = x
    x = x.src[0]
  return x, version


def _strip_assign(view: UOp) -> UOp:
  """A target view with every ASSIGN in it replaced by that assign's own target (the same memory)."""
  new: dict[UOp, UOp] = {}
  for n in view.toposort():
    new[n] = new[n.src[0]] if n.op is Ops.ASSIGN else n.replace(src=tuple(new[s] for s in n.src))
  return new[view]


def _toposort_calls(deps: list[set[int]]) -> list[int] | None:
  """Call indices in an order where every call comes after those it depends on (`deps[i]`), the lowest index first
  among those ready; None when the dependencies have a cycle."""
  users: dict[int, list[int]] = defaultdict(list)
  indeg = [len(d) for d in deps]
  for i, d in enumerate(deps):
    for j in d: users[j].append(i)
  ready = [i for i, n in enumerate(indeg) if n == 0]
  heapq.heapify(ready)
  out: list[int] = []
  while ready:
    i = heapq.heappop(ready)
    out.append(i)
    for u in users[i]:
      indeg[u] -= 1
      if indeg[u] == 0: heapq.heappush(ready, u)
  return out if len(out) == len(deps) else None


# ***** public entry point *****
SCHEDULE_CACHE = getenv("SCHEDULE_CACHE", 1)
"""SCHEDULE_CACHE=0 schedules every graph from scratch."""
SCHEDULE_CACHE_NODES = getenv("SCHEDULE_CACHE_NODES", 1 << 20)
"""The schedule cache keeps graph structures (each holds its normalized graph) up to this many nodes in all, and at
most SCHEDULE_CACHE_ENTRIES of them; the least recently used go first."""
SCHEDULE_CACHE_ENTRIES = 1024


class _LRU:
  """A dict bounded by entry count and by a total size (each entry's `size` given when stored), least recently used
  first out; thread-safe."""
  def __init__(self, max_entries: int, max_size: int):
    self.max_entries, self.max_size = max_entries, max_size
    self.data: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
    self.size = 0
    self.lock = threading.Lock()

  def get(self, key: Any) -> Any:
    with self.lock:
      if (hit := self.data.get(key)) is None: return None
      self.data.move_to_end(key)
      return hit[0]

  def put(self, key: Any, value: Any, size: int) -> None:
    with self.lock:
      if (old := self.data.pop(key, None)) is not None: self.size -= old[1]
      self.data[key] = (value, size)
      self.size += size
      while self.data and (len(self.data) > self.max_entries or self.size > self.max_size):
        self.size -= self.data.popitem(last=False)[1][1]

  def clear(self) -> None:
    with self.lock: self.data.clear(); self.size = 0  # noqa: E702

  def __len__(self) -> int: return len(self.data)


_cache = _LRU(SCHEDULE_CACHE_ENTRIES, SCHEDULE_CACHE_NODES)     # _schedule_key(sink, exposed) -> _Template
_realized = _LRU(SCHEDULE_CACHE_ENTRIES, SCHEDULE_CACHE_NODES)  # _schedule_key(sink, None) -> what gets buffers


@traced("schedule")  # VIZ: the tensor graph -> the CALLs (one check when nothing records)
def create_schedule(sink: UOp, expose: Iterable[UOp] = ()) -> ScheduleResult:
  """Schedule everything `sink` (a SINK of tensor-graph values) needs: kernels, copies and views, in order.

  `expose`: nodes of the graph that other live values still use; those that get a buffer along the way are reported
  in `becomes` too (so they aren't computed again later), not only the sink's values.

  >>> from tiny_uop import UOp, dtypes
  >>> a = UOp.new_buffer("CPU", 16, dtypes.float32).reshape((4, 4))
  >>> len(create_schedule(UOp.sink((a + 1) * 2)).calls)
  1
  """
  if sink.op is not Ops.SINK: raise TypeError(f"create_schedule needs a SINK of tensor values, got {sink.op}")
  maybe_verify(sink, tensor_spec, "tensor graph")
  st = time.perf_counter()
  norm = _Normalizer(reuse=not expose)  # expose: each exposed node's image is needed, so every node is walked
  nsink = norm.node(sink)
  if show := (_trace.RECORDER is not None or DEBUG >= 3): _show_stage("normalize", sink, nsink, st)
  nexpose: frozenset[UOp] = frozenset()
  started = None
  nodes = norm.nodes  # the normalized graph's size: what a cache entry keeps alive
  if expose:  # only the nodes that get a buffer anyway matter (and only they key the cache)
    if (realized := _realized.get(rkey := _schedule_key(nsink, None))) is None:
      started = _start_schedule(nsink)
      realized = _realized_nodes(started[0]) - set(nsink.src)
      _realized.put(rkey, realized, nodes)
    nexpose = frozenset(n for u in expose if (n := norm.new.get(u)) is not None and n in realized)
  key = _schedule_key(nsink, nexpose)
  tmpl = _cache.get(key) if SCHEDULE_CACHE else None
  hit = tmpl is not None
  if tmpl is None:
    tmpl = _schedule(nsink, expose=nexpose, started=started)
    if SCHEDULE_CACHE: _cache.put(key, tmpl, nodes)
  # pass `rebind` (step 5): the caller's buffers in place of the placeholders, a new BUFFER for each buffer the
  # schedule makes
  t_rebind = time.perf_counter() if show else 0.0
  if tmpl.inputs is None: tmpl.inputs, tmpl.becomes_nodes = _inputs_of(tmpl), {n for n, _, _ in tmpl.becomes}
  ins = norm.inputs
  sub: dict[UOp, UOp] = {ph: ins[ph.src[0].arg[1]] for ph in tmpl.inputs}
  for b in tmpl.new_buffers: sub[b] = UOp.new_buffer(b.src[1].arg, b.arg, b.dtype)
  calls = [UOp(Ops.CALL, c.dtype, (c.src[0], *[sub[b] for b in c.src[1:]]), c.arg, c.tag) for c in tmpl.calls]
  inv: dict[UOp, list[UOp]] = {}  # normalized node in becomes -> the caller's nodes it stands for
  want = tmpl.becomes_nodes
  for orig, n in norm.new.items():
    if n in want: inv.setdefault(n, []).append(orig)
  becomes: dict[UOp, UOp] = {}
  for node, buf, view in tmpl.becomes:
    real = sub.get(buf, buf)
    for orig in inv.get(node, ()):
      if view is None: becomes[orig] = real if orig.shape == real.shape else real.reshape(shape_of(orig))
      else: becomes[orig] = _rebase(view, sub)
  if show: _show_stage("rebind", UOp(Ops.LINEAR, src=tuple(tmpl.calls)), UOp(Ops.LINEAR, src=tuple(calls)), t_rebind)
  if DEBUG >= 3:
    print(f"schedule: {len(calls)} calls ({sum(c.src[0].op is Ops.SINK for c in calls)} kernels) in "
          f"{(time.perf_counter() - st) * 1e3:.2f} ms{' (cached)' if hit else ''}")
  if SPEC:
    for c in calls:
      if c.src[0].op is Ops.SINK: maybe_verify(c.src[0], kernel_spec, "scheduled kernel")
  return ScheduleResult(calls, becomes, dict(norm.var_vals), norm.inputs, tmpl if SCHEDULE_CACHE else None)


def _schedule_sizes() -> tuple:
  """The sizes the graph passes split and block reduces by (the cached part reads them; tests patch them)."""
  return (REDUCE_BLOCK, REDUCE_FANIN, BLOCKED_SUM_MIN, SPLIT_REDUCE_MIN, CHUNK_BYTES)


def _schedule_key(nsink: UOp, nexpose: frozenset[UOp] | None) -> tuple:
  """The schedule cache's key: the normalized sink, the exposed nodes among those realized anyway, and
  `_schedule_sizes()`."""
  return (nsink, nexpose, *_schedule_sizes())


# cached_template's eager hot path: a normalized one-root graph's root -> (the sizes then, a weak reference to its
# cache entry), so a hit builds no key (a SINK) and takes no lock; the scheduler's own table (no state on the UOps),
# an entry dying with its node, the entry's life the cache's
_tmpl_memo: _NodeMemo = _NodeMemo()
_tmpl_memo_data: Callable[[int], tuple[_MemoRef, tuple[tuple, weakref.ref]] | None] = _tmpl_memo.data.get
# ... and for a fresh root with no arg (`a + 1`: a new ADD each time) by its structure, (op, dtype, its sources'
# normalized forms, tag), which is its normalized node's key: a hit neither interns that node nor makes a weak
# reference to look it up. Holds the normalized sources (placeholders and constants the cache entries hold anyway);
# bounded by TMPL_STRUCT_MAX (emptied when full)
_tmpl_by_struct: dict[tuple, tuple[tuple, weakref.ref]] = {}
TMPL_STRUCT_MAX = 4096


def _start_schedule(nsink: UOp) -> tuple[_Scheduler, UOp]:
  """An attempt at scheduling `nsink` that ran the passes up to `decide`, and that pass's output (`_schedule` goes on
  from there)."""
  st = _Scheduler(nsink)
  graph = _run_stages(st, nsink, 0, _STAGE_AT["decide"] + 1)
  assert graph is not None, "the passes before `order` always give a graph"
  return st, graph


def _realized_nodes(st: _Scheduler) -> frozenset[UOp]:
  """The normalized nodes whose images the `decide` pass of `st` realizes (buffers aside)."""
  real = {u for u in st.realize if u.op is not Ops.BUFFER}
  if st.image is None: return frozenset(real)
  return frozenset(k for k, v in st.image.items() if v in real)


def cached_template(roots: tuple[UOp, ...], max_nodes: int = 64) -> tuple[Any, list[UOp]] | None:
  """The cache entry of the schedule that `create_schedule(UOp.sink(*roots))` (nothing exposed) would give, and the
  graph's input BUFFERs in the entry's placeholder order, without building the schedule; None when there is no such
  entry, when the cache is off or SPEC verification on, when the graph binds a variable, or when more than
  `max_nodes` new nodes would have to be normalized (a big graph: `create_schedule` will normalize it once).

  For runtimes that replay schedules (tiny-tensor's engine): an entry's `runtime` slot holds what the runtime recorded
  from a `create_schedule` result of it (`ScheduleResult.template`); the schedule of an entry, with input placeholder
  `i` standing for `inputs[i]` and new buffers made fresh, is the schedule `create_schedule` would return."""
  if not SCHEDULE_CACHE or SPEC.value: return None
  if len(roots) == 1 and max_nodes > 0 and (r := roots[0]).arg is None and (fresh := _norm_srcs(r)) is not None:
    # the eager hot path: one new node over sources that remember their forms, found by structure
    if (memo := _tmpl_by_struct.get((r.op, r.dtype, fresh[0], r.tag))) is not None and \
       memo[0] == _schedule_sizes() and (t := memo[1]()) is not None:
      return t, fresh[1]
  if len(roots) == 1 and max_nodes > 0 and (one := _norm_over_remembered(roots[0])) is not None:
    nroots, inputs = [one[0]], one[1]
    # the eager hot path: the entry found for this normalized root before (a weak reference: the entry's life is the
    # cache's), without its key (a SINK) and the cache's lock
    if (e := _tmpl_memo_data(id(one[0]))) is not None and e[0]() is one[0] and (memo := e[1])[0] == _schedule_sizes() \
       and (t := memo[1]()) is not None:
      return t, inputs
  else:
    norm = _Normalizer(budget=max_nodes)
    nroots = []
    for r in roots:
      nroots.append(norm.node(r))
      if norm.over: return None
    if norm.var_vals: return None
    inputs = norm.inputs
  key = _schedule_key(UOp(_SINK, dtypes.void, tuple(nroots)), _NOTHING_EXPOSED)
  tmpl = _cache.get(key)
  if tmpl is None: return None
  if len(nroots) == 1:
    _tmpl_memo[nroots[0]] = memo = (key[2:], weakref.ref(tmpl))
    if (n := nroots[0]).arg is None and n.op not in _NORM_SPECIAL:
      if len(_tmpl_by_struct) >= TMPL_STRUCT_MAX: _tmpl_by_struct.clear()
      _tmpl_by_struct[(n.op, n.dtype, n.src, n.tag)] = memo
  return tmpl, inputs


_SINK = Ops.SINK
_NOTHING_EXPOSED: frozenset[UOp] = frozenset()
# ops whose normalized form is the node over its sources' forms (`_Normalizer.node`'s last case) when their args are
# static: what `_norm_over_remembered` may build
_NORM_SPECIAL = frozenset({Ops.BUFFER, Ops.BIND}) | _DROPPED | _NO_REUSE


def _norm_over_remembered(r: UOp) -> tuple[UOp, list[UOp]] | None:
  """`_Normalizer().node(r)` and its inputs, without a walk, when r remembers its normalized form or is a node whose
  sources all do, with their inputs numbered from 0 in source order, none read twice: the eager hot path (`a + 1`
  over a realized `a`: one new node over two known ones). None otherwise (the caller walks the graph)."""
  if (e := _norm_memo_data(id(r))) is not None and e[0]() is r:
    norm, first, ins, _, _ = e[1]
    return ((r if norm is None else norm), list(ins)) if first == 0 or not ins else None
  if (op := r.op) in _NORM_SPECIAL or (op in _SIZED_MOVEMENT and not set(map(type, r.arg)) <= _INT_ONLY): return None
  if (got := _norm_srcs(r)) is None: return None
  nsrc, inputs = got
  return (r if nsrc == r.src else UOp(op, r.dtype, nsrc, r.arg, r.tag)), inputs


def _norm_srcs(r: UOp) -> tuple[tuple[UOp, ...], list[UOp]] | None:
  """The normalized forms of `r`'s sources and their inputs, numbered from 0 in source order, when r's op is one whose
  normalized form is the node over those forms (not `_NORM_SPECIAL`), each source remembers its form and no input is
  read twice; else None. `r` itself is not looked up."""
  if r.op in _NORM_SPECIAL: return None
  src: list[UOp] = []
  inputs: list[UOp] = []
  for s in r.src:
    if (e := _norm_memo_data(id(s))) is None or e[0]() is not s: return None
    norm, first, ins, _, _ = e[1]
    if ins:
      if first != len(inputs): return None
      for b in ins:  # (loops by identity, not `in` or any(): `in` calls UOp.__eq__ on each other node; the hot path)
        for x in inputs:
          if x is b: return None
      inputs.extend(ins)
    src.append(s if norm is None else norm)
  return tuple(src), inputs


def _inputs_of(tmpl: _Template) -> list[UOp]:
  seen: dict[UOp, None] = {}
  for c in tmpl.calls:
    for b in c.src[1:]:
      if b.src[0].arg[0] == "in": seen[b] = None
  for _, b, view in tmpl.becomes:
    if b.src[0].arg[0] == "in": seen[b] = None
    if view is not None:
      for x in view.toposort():
        if x.op is Ops.BUFFER and x.src[0].arg[0] == "in": seen[x] = None
  return list(seen)


def _rebase(view: UOp, sub: dict[UOp, UOp]) -> UOp:
  new: dict[UOp, UOp] = {}
  for n in view.toposort():
    new[n] = sub[n] if n in sub else n.replace(src=tuple(new[s] for s in n.src))
  return new[view]


def clear_schedule_cache() -> None:
  """Forget every cached schedule (and the normalized forms nodes remember)."""
  _norm_memo.clear()
  _tmpl_memo.clear()
  _tmpl_by_struct.clear()
  _cache.clear()
  _realized.clear()
  _split_memo.clear()
