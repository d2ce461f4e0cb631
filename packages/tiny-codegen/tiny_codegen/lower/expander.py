"""Expander: UPCAST and UNROLL ranges become straight-line copies (one per lane).

Expects: a kernel AST whose UPCAST/UNROLL ranges have constant bounds.
Guarantees: no UPCAST/UNROLL range is left. A STORE that depends on an UPCAST range becomes a GROUP of one STORE
per lane; a REDUCE over an UNROLL (or UPCAST) range combines the lanes' values with the reduce op before reducing
over its remaining ranges. Lane copies are scalar, except on renderers with `vectorize_upcast` (LLVM on the CPU):
there one UPCAST axis of each STORE (4 to 16 lanes, the one most loads walk contiguously; LLVM widens an odd width
such as a conv's 10-wide row to the next register) becomes native vectors first — a load contiguous in it is one
vector LOAD, a contiguous load behind a gate that depends on it (a padded row's border lanes) is one vector LOAD
whose INDEX gate is a vector of lane gates (a masked load), a load whose lanes lie 2 to 4 elements apart (a stride-2
conv or pool's row: `STRIDED_LANES`) is one wide LOAD and a shuffle (a GEP of every s-th lane; a window's taps along
the row, a constant apart, share the LOAD where their elements fit one: `shared`), a load that doesn't
depend on it is broadcast, other loads are gathered lane by lane (VECTORIZE), ALU
ops and reduces run on the vectors, and the STORE is one vector store when contiguous, else one store per lane of a
GEP. (Wider than 16, e.g. a 20-lane row, LLVM's legalization scalarizes the broadcasts: 2x slower than 10 lanes.)
What SLP would have to rediscover from scalar copies (and, in loop nests, often doesn't) is then explicit.
"""
from __future__ import annotations

import functools

from tiny_uop.dtype import PtrDType, dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import AxisType, GroupOp, Ops, UOp

EXPAND_AXES = (AxisType.UPCAST, AxisType.UNROLL)


def _lanes(r: UOp) -> int:
  if r.src[0].op is not Ops.CONST:
    raise ValueError(f"{r.arg[1]} range {r.arg[0]} needs a constant bound to expand, got {r.src[0].render()}")
  return int(r.src[0].arg)


def fast_substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`root` with the RANGEs of `mapping` replaced: only the nodes that depend on one of them (`ranges`, cached per
  node) are walked and rebuilt, so a lane's copy costs the lane-dependent part of the graph, not all of it. A range
  closed by a REDUCE below is not open there, so its reduce is left alone (as it must be)."""
  keys = mapping.keys()
  if root in mapping: return mapping[root]
  if keys.isdisjoint(root.ranges): return root
  out: dict[UOp, UOp] = {}
  for n in root.toposort(gate=lambda x: x.op is not Ops.RANGE and not keys.isdisjoint(x.ranges)):
    src = n.src
    new_src = tuple([m if (m := mapping.get(s)) is not None else out.get(s, s) for s in src])
    out[n] = n if new_src == src else n.replace(src=new_src)
  return out[root]


def _affine_stride(idx: UOp, r: UOp) -> int | None:
  """The coefficient of `r` in `idx` when every node between them is an ADD/SUB/NEG or a MUL by a constant (so idx
  is affine in r, and moving r by one moves idx by exactly that); None when some other op depends on r."""
  coef: dict[UOp, int] = {}
  for n in idx.toposort(gate=lambda x: x is r or (x.op is not Ops.RANGE and r in x.ranges)):
    if n is r: coef[n] = 1
    elif n.op in (Ops.ADD, Ops.SUB):
      a, b = (coef.get(x, 0) if r in x.ranges or x is r else 0 for x in n.src)
      coef[n] = a + b if n.op is Ops.ADD else a - b
    elif n.op is Ops.NEG: coef[n] = -coef[n.src[0]]
    elif n.op is Ops.MUL and (c := next((x for x in n.src if x.op is Ops.CONST), None)) is not None and \
        (o := n.src[1] if c is n.src[0] else n.src[0]) is not c and isinstance(c.arg, int):
      coef[n] = coef.get(o, 0) * c.arg
    else: return None
  return coef.get(idx, 0)


def _expand_over(x: UOp, rngs: list[UOp]) -> list[UOp]:
  """`x` copied once per combination of lanes of `rngs` (first range outermost)."""
  outs = [x]
  for r in rngs:
    outs = [fast_substitute(o, {r: UOp.const(r.dtype, k)}) for o in outs for k in range(_lanes(r))]
  return outs


def _expand_store(st: UOp, vectorize: bool = False) -> UOp | None:
  rngs = [r for r in st.ranges if r.op is Ops.RANGE and r.arg[1] in EXPAND_AXES]
  if not rngs: return None
  if vectorize and (rv := _vector_axis(st, rngs)) is not None:
    st = _vectorize_store(st, rv)
    rngs.remove(rv)
    if not rngs: return st
  return UOp(Ops.GROUP, src=tuple(_expand_over(st, rngs)))


# ***** one UPCAST axis as native vectors *****
VECTOR_LANES = tuple(range(4, 17))
POW2_LANES = (4, 8, 16)  # other widths only where a load walks the axis contiguously: a 10- or 12-lane vector that is
                         # all gathers (a padding's gated loads) ran 1.3-2x slower than its scalar lanes
_VALUE_OPS = GroupOp.ALU | {Ops.CAST, Ops.BITCAST}


def _stride(idx: UOp, r: UOp) -> int | None:
  """How far `idx` moves from any lane of `r` to the next, if that is the same constant for every lane and every
  value of the other ranges (checked symbolically: r as a variable v over all but the last lane, idx(v+1) - idx(v)).
  Unlike `opt.kernel.stride_of` (the step at the origin, enough to guide the heuristics) this decides correctness:
  a vector load reads lanes 0..n-1 from consecutive addresses."""
  if r not in idx.ranges: return 0
  if (k := _affine_stride(idx, r)) is not None: return k
  v = UOp.variable(f"_lane{r.arg[0]}", 0, _lanes(r) - 2, r.dtype)
  d = (idx.substitute({r: v + 1}) - idx.substitute({r: v})).simplify()
  return int(d.arg) if d.op is Ops.CONST else None


def _contiguous(idx_node: UOp, r: UOp) -> bool:
  """An INDEX that walks `r` with stride 1 and whose gate (if any) doesn't depend on `r`."""
  return (len(idx_node.src) < 3 or r not in idx_node.src[2].ranges) and _stride(idx_node.src[1], r) == 1


def _conjuncts(g: UOp) -> set[UOp]:
  """The terms of gate `g` as an AND of bools (`a & (b & c)` -> {a, b, c})."""
  out, stack = set(), [g]
  while stack:
    x = stack.pop()
    if x.op is Ops.AND and x.dtype == dtypes.bool: stack.extend(x.src)
    else: out.add(x)
  return out


def _tail_clamps(idx: UOp, r: UOp, store_gates: set[UOp]) -> dict[UOp, UOp]:
  """The masked-tail clamps of axis `r` in load index `idx` (`Kernel._split_tail`: `valid.where(expr, B - 1)`), each
  mapped to its unclamped `expr`: a WHERE whose condition depends on `r` and is one of the store's gate terms (so a
  lane where it is false stores nothing, and what that lane loads is never used) and whose other value doesn't."""
  return {w: w.src[1] for w in idx.toposort(gate=lambda x: x.op is not Ops.RANGE and r in x.ranges)
          if w.op is Ops.WHERE and w.src[0] in store_gates and r in w.src[0].ranges and r not in w.src[2].ranges}


def _masked_load(idx_node: UOp, r: UOp, store_gates: set[UOp]) -> tuple[UOp, UOp] | None:
  """(unclamped INDEX, lane gate) of a load through INDEX `idx_node` that walks `r` contiguously once its masked-tail
  clamps are taken off: the lanes where the gate holds read what the clamped index reads (the clamp is the identity
  there); the others are masked off (never read). None if it has no such clamp or isn't then contiguous."""
  if not store_gates or not (clamps := _tail_clamps(idx_node.src[1], r, store_gates)): return None
  idx = idx_node.src[1].substitute(clamps, name="tail_unclamp")
  if _stride(idx, r) != 1: return None
  gate = functools.reduce(lambda a, b: a & b, [w.src[0] for w in clamps] + list(idx_node.src[2:]))
  return idx_node.replace(src=(idx_node.src[0], idx)), gate


def _store_gates(st: UOp, r: UOp) -> set[UOp]:
  """The terms of store `st`'s gate that depend on `r` (a masked tail's `outer*amt + inner < B`)."""
  return {g for g in _conjuncts(st.src[0].src[2]) if r in g.ranges} if len(st.src[0].src) > 2 else set()


def _masked_contiguous(idx_node: UOp, r: UOp) -> bool:
  """An INDEX that walks `r` with stride 1 whose gate depends on `r` (a masked tail's store; a padded conv or pool's
  input row, whose border lanes read padding): one masked vector access along `r` whose gate is a vector of lane
  gates, touching no memory for the lanes gated off (the LLVM renderer's `llvm.masked.load/store`), not one access
  per lane."""
  return idx_node.op is Ops.INDEX and len(idx_node.src) > 2 and r in idx_node.src[2].ranges and \
    _stride(idx_node.src[1], r) == 1


STRIDED_LANES = (2, 3, 4)
"""The constant strides with which a load walking the vector axis reads one wide vector and keeps every s-th lane
(`_vectorize_store`'s `strided`): a stride-2 conv or pool's input row (stride 3 and 4 fall out of the same rule). Its
lanes span s*(n-1)+1 elements, s times a vector's registers: wider strides would load more than they keep."""


def _strided(idx_node: UOp, r: UOp) -> int:
  """The stride in STRIDED_LANES with which INDEX `idx_node` walks `r` (its gate may depend on `r`: a padded row), 0
  if another (or none: then not strided)."""
  return s if (s := _stride(idx_node.src[1], r)) in STRIDED_LANES else 0


def _pow2(x: int) -> int: return 1 << (x - 1).bit_length()


def _in_bounds(idx: UOp, w: int) -> bool:
  """Whether `w` elements from INDEX `idx` (of a buffer of known size) lie in the buffer for every value of its
  ranges and variables (from the index's bounds: `vmin`/`vmax`)."""
  buf = idx.src[0].dtype
  return isinstance(buf, PtrDType) and buf.size > 0 and \
    isinstance(lo := idx.src[1].vmin, int) and isinstance(hi := idx.src[1].vmax, int) and lo >= 0 and hi + w <= buf.size


def _vector_axis(st: UOp, rngs: list[UOp]) -> UOp | None:
  """The UPCAST axis of `st` (4 to 16 lanes; other than 4/8/16 only when some load walks it contiguously or with a
  stride of STRIDED_LANES) that the most loads (and the store) walk contiguously (a strided load: one wide load and
  a shuffle, counted half), wider first; None if none does, or the value has ops a vector can't carry."""
  if st.src[0].op is not Ops.INDEX or st.src[1].dtype.count != 1: return None
  if any(u.op in (Ops.WMMA, Ops.VECTORIZE, Ops.GEP) or (u.op is Ops.LOAD and u.dtype.count != 1)
         for u in st.src[1].toposort()): return None
  loads = [u for u in st.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
  best, score = None, 0
  for r in rngs:
    if r.arg[1] is not AxisType.UPCAST or _lanes(r) not in VECTOR_LANES: continue
    if _lanes(r) not in POW2_LANES and \
        not any(_contiguous(ld.src[0], r) or _strided(ld.src[0], r) for ld in loads if r in ld.ranges): continue
    gates = _store_gates(st, r)  # a masked tail's loads and store count as contiguous: masked vectors (§3)
    sc = (sum(4 if _contiguous(ld.src[0], r) or _masked_load(ld.src[0], r, gates) else 2 if _strided(ld.src[0], r)
              else 0 for ld in loads if r in ld.ranges) +
          2 * (_contiguous(st.src[0], r) or _masked_contiguous(st.src[0], r))) * _lanes(r)
    if sc > score: best, score = r, sc
  return best


def _broadcast(x: UOp, n: int) -> UOp:
  return x if x.dtype.count == n else UOp(Ops.VECTORIZE, x.dtype.vec(n), (x,) * n)


def _from_data(v: UOp) -> bool:
  """Whether vectorized value `v` is computed on vector data (a vector LOAD, REDUCE, ALU or CAST), not gathered lane
  by lane (VECTORIZE) nor broadcast. `dtypes.index` is int32 itself, so an int32 op is index math (gathered: each
  lane's address stays a scalar) unless a source is vector data: exp2's exponent bits (`cast(int32) << 23`) in a
  conv's sigmoid/SiLU epilogue. Gathered, that op copied its whole source tree per lane, the conv's REDUCE included:
  the conv ran once as vectors and once more per lane as scalars (a 1x1 conv with a sigmoid epilogue 17x slower)."""
  return v.dtype.count > 1 and v.op is not Ops.VECTORIZE


def _vectorize_store(st: UOp, rv: UOp) -> UOp:
  """`st` with range `rv` (n lanes) computed as n-wide vectors (see the module docstring)."""
  n = _lanes(rv)
  lane = [UOp.const(rv.dtype, k) for k in range(n)]
  at0 = {rv: lane[0]}
  memo: dict[UOp, UOp] = {}

  def gather(x: UOp) -> UOp:
    return UOp(Ops.VECTORIZE, x.dtype.vec(n), tuple(fast_substitute(x, {rv: lane[k]}) for k in range(n)))

  gates = _store_gates(st, rv)

  def masked(idx: UOp, gate: UOp) -> UOp:  # a masked vector access: lane 0's address, the gate one bool per lane
    return idx.replace(src=(idx.src[0], fast_substitute(idx.src[1], at0), _broadcast(vec(gate), n)))

  on, off = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False)

  def is_strided(x: UOp) -> int:
    """The stride with which load `x` takes `vec`'s strided branch (the branches before it don't apply), else 0."""
    if x.op is not Ops.LOAD or x.dtype == dtypes.bool or x.src[0].op is not Ops.INDEX or rv not in x.ranges: return 0
    idx = x.src[0]
    if _contiguous(idx, rv) or _masked_load(idx, rv, gates) is not None or _masked_contiguous(idx, rv): return 0
    return _strided(idx, rv)

  def tap(x: UOp) -> tuple[tuple, int, list[UOp]]:
    """Strided load `x` (stride s) as (its row: buffer, s, lane-0 index less its constant term, the gate's terms that
    don't depend on the lane, the load's other sources; that constant; the gate's terms that do)."""
    idx, at0_idx = x.src[0], fast_substitute(x.src[0].src[1], at0)
    base, c = at0_idx, 0
    if at0_idx.op is Ops.ADD and (k := next((u for u in at0_idx.src if u.op is Ops.CONST), None)) is not None:
      base, c = at0_idx.src[1] if k is at0_idx.src[0] else at0_idx.src[0], int(k.arg)
    terms = {t for t in _conjuncts(idx.src[2]) if t is not on} if len(idx.src) > 2 else set()
    rest = tuple(sorted((t for t in terms if rv not in t.ranges), key=id))
    return (idx.src[0], _strided(idx, rv), base, rest, x.src[1:], x.arg), c, [t for t in terms if rv in t.ranges]

  def wide_load(taps: list[tuple[int, UOp, list[UOp]]], s: int, rest: tuple[UOp, ...]) -> dict[UOp, UOp]:
    """One load of a power of two elements for the strided loads `taps` ((constant, load, lane gate terms), the
    smallest constant first; one row: see `tap`) through the first's lane-0 index, each tap a GEP of its lanes."""
    (c0, x0, _), w = taps[0], s * (n - 1) + 1
    wide = _pow2(taps[-1][0] - c0 + w)
    idx0 = x0.src[0]
    start = fast_substitute(idx0.src[1], at0)
    if all(len(x.src[0].src) == 2 for _, x, _ in taps) and \
        _in_bounds(new_idx := idx0.replace(src=(idx0.src[0], start)), wide):  # ungated
      ld = UOp(Ops.LOAD, x0.dtype.vec(wide), (new_idx, *x0.src[1:]), x0.arg)
    else:
      # element e is read where some tap reads it: at its lanes' elements under the gate terms that depend on the
      # lane (a padded row's border lanes; then nothing between them), else its whole span; the row's terms and'ed
      # to the whole mask
      need: list[list[UOp]] = [[] for _ in range(wide)]
      for c, _, per_lane in taps:
        lane_gate = functools.reduce(lambda a, b: a & b, per_lane) if per_lane else on
        for j in range(w):
          if j % s == 0: need[c - c0 + j].append(fast_substitute(lane_gate, {rv: lane[j // s]}))
          elif not per_lane: need[c - c0 + j].append(on)
      mask = UOp(Ops.VECTORIZE, dtypes.bool.vec(wide), tuple(
        on if any(g is on for g in gs) else functools.reduce(lambda a, b: a | b, dict.fromkeys(gs)) if gs else off
        for gs in need))
      if rest: mask = mask & _broadcast(functools.reduce(lambda a, b: a & b, rest), wide)
      ld = UOp(Ops.LOAD, x0.dtype.vec(wide), (idx0.replace(src=(idx0.src[0], start, mask)), *x0.src[1:]), x0.arg)
    return {x: UOp(Ops.GEP, x0.dtype.vec(n), (ld,), tuple(range(c - c0, c - c0 + w, s))) for c, x, _ in taps}

  # the strided loads of one row (`tap`) whose elements fit one power-of-two load share it (a stride-2
  # 3x3 window's row: three taps, 29 elements of 32), grouped greedily from the smallest constant
  rows: dict[tuple, list[tuple[int, UOp, list[UOp]]]] = {}
  for x in st.src[1].toposort():
    if is_strided(x):
      row, c, per_lane = tap(x)
      rows.setdefault(row, []).append((c, x, per_lane))
  shared: dict[UOp, UOp] = {}
  for row, taps in rows.items():
    s, w = row[1], row[1] * (n - 1) + 1
    taps.sort(key=lambda t: t[0])
    while taps:
      k = 1
      while k < len(taps) and taps[k][0] - taps[0][0] + w <= _pow2(w): k += 1
      shared.update(wide_load(taps[:k], s, row[3]))
      taps = taps[k:]

  def vec(x: UOp) -> UOp:
    if rv not in x.ranges: return x
    if (m := memo.get(x)) is not None: return m
    if x.op is Ops.LOAD and x.src[0].op is Ops.INDEX and _contiguous(x.src[0], rv):
      out = UOp(Ops.LOAD, x.dtype.vec(n), (fast_substitute(x.src[0], at0), *x.src[1:]), x.arg)
    elif x.op is Ops.LOAD and x.src[0].op is Ops.INDEX and (ml := _masked_load(x.src[0], rv, gates)) is not None:
      out = UOp(Ops.LOAD, x.dtype.vec(n), (masked(ml[0], ml[1]), *x.src[1:]), x.arg)
    elif x.op is Ops.LOAD and x.dtype != dtypes.bool and _masked_contiguous(x.src[0], rv):
      # contiguous, gated per lane (a padded window's border lanes): one load of the lanes whose gate holds
      out = UOp(Ops.LOAD, x.dtype.vec(n), (masked(x.src[0], x.src[0].src[2]), *x.src[1:]), x.arg)
    elif x in shared: out = shared[x]
    elif x.op is Ops.REDUCE:
      out = UOp(Ops.REDUCE, x.dtype.vec(n), (_broadcast(vec(x.src[0]), n), *x.src[1:]), x.arg)
    elif x.op in _VALUE_OPS and all(s.dtype.count == 1 for s in x.src) and \
        ((srcs := [vec(s) for s in x.src]) and (x.dtype != dtypes.index or any(map(_from_data, srcs)))):
      out = UOp(x.op, x.dtype.vec(n), tuple(_broadcast(s, n) for s in srcs), x.arg)
    else: out = gather(x)
    memo[x] = out
    return out

  idx, val = st.src[0], vec(st.src[1])
  if _contiguous(idx, rv): return st.replace(src=(fast_substitute(idx, at0), _broadcast(val, n), *st.src[2:]))
  if _masked_contiguous(idx, rv): return st.replace(src=(masked(idx, idx.src[2]), _broadcast(val, n), *st.src[2:]))
  return UOp(Ops.GROUP, src=tuple(st.replace(src=(fast_substitute(idx, {rv: lane[k]}), UOp(Ops.GEP, val.dtype.scalar(),
                                                  (_broadcast(val, n),), (k,)), *st.src[2:])) for k in range(n)))


def _combine(op: Ops, vals: list[UOp]) -> UOp:
  if op is Ops.ADD: return functools.reduce(lambda a, b: a + b, vals)
  if op is Ops.MUL: return functools.reduce(lambda a, b: a * b, vals)
  if op is Ops.MAX: return functools.reduce(lambda a, b: a.maximum(b), vals)
  raise ValueError(f"REDUCE with op {op} is not supported; valid: ADD, MUL, MAX")


LANE_ACCUMULATORS = 16  # at most this many lanes of an unrolled streaming reduce get accumulators of their own


def _lane_accumulators(red: UOp, erngs: list[UOp], rest: tuple[UOp, ...]) -> bool:
  """Whether each lane of `red`'s unrolled ranges keeps its own accumulator over the remaining loop (combined once
  after it) instead of the lanes being combined into one accumulator every iteration: a streaming reduce (scalar, no
  UPCAST lane in its value: a sum, a norm's statistics) whose loop is then a chain of one dependent add per
  iteration, latency-bound (4 cycles on a 2-port FPU); with 16 accumulators the adds are independent. Not for
  blocked reduces (a conv's upcast outputs times its unrolled filter row would multiply the accumulators) nor
  workgroup (GROUP_REDUCE) ones."""
  if not rest or red.dtype.count != 1 or any(r.arg[1] is not AxisType.REDUCE for r in rest): return False
  if any(r.arg[1] is AxisType.UPCAST for r in red.src[0].ranges if r.op is Ops.RANGE): return False
  lanes = 1
  for r in erngs: lanes *= _lanes(r)
  return lanes <= LANE_ACCUMULATORS


def _expand_reduce(red: UOp) -> UOp | None:
  erngs = [r for r in red.src[1:] if r.arg[1] in EXPAND_AXES]
  if not erngs: return None
  rest = tuple(r for r in red.src[1:] if r not in erngs)
  if _lane_accumulators(red, erngs, rest):  # sum over lanes of (sum over the loop): one accumulator per lane
    return _combine(red.arg, _expand_over(UOp(Ops.REDUCE, red.dtype, (red.src[0], *rest), red.arg), erngs))
  val = _combine(red.arg, _expand_over(red.src[0], erngs))
  return UOp(Ops.REDUCE, red.dtype, (val, *rest), red.arg) if rest else val


pm_expander = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), _expand_reduce),
  (UPat(Ops.STORE, name="st"), _expand_store),
], name="expander")

pm_expander_vectors = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), _expand_reduce),
  (UPat(Ops.STORE, name="st"), lambda st: _expand_store(st, vectorize=True)),
], name="expander_vectors")
