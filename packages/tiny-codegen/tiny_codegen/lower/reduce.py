"""Reduce to accumulators, and loop ENDs for the stores.

`lower_reduces(sink)`: every REDUCE(value, *ranges, arg=op) becomes an accumulator in a register:
  acc = DEFINE_REG(dtype.ptr(1, REG), arg=n)
  init = STORE(INDEX(acc, 0), identity, *outer_ranges)           # once per iteration of the enclosing loops
  upd  = STORE(INDEX(acc, 0), op(LOAD(INDEX(acc, 0), init, *ranges), value))
  END(END(upd, inner), outer)                                    # one END per reduce range, innermost first
  result = LOAD(INDEX(acc, 0), END)                              # read after the loop
The extra sources of LOAD/STORE only order them (renderers ignore them). REDUCEs over the same ranges share one
loop (the expander makes several lanes of one reduce). Reduces are lowered innermost first.

`add_ends(sink)`: the kernel's STOREs get their loops: stores are nested by their (sorted) ranges into one tree of
END nodes, so stores over the same ranges share one loop nest.
"""
from __future__ import annotations

import itertools
from typing import Any

from tiny_uop.dtype import AddrSpace, dtypes
from tiny_uop.uop import AxisType, Ops, UOp

AXIS_ORDER = {AxisType.THREAD: 0, AxisType.GLOBAL: 1, AxisType.LOCAL: 2, AxisType.LOOP: 3, AxisType.GROUP_REDUCE: 4,
              AxisType.REDUCE: 5, AxisType.UPCAST: 6, AxisType.UNROLL: 7}


def range_key(r: UOp) -> tuple[int, Any]:
  """Loop nesting order: thread/global/local/loop ranges outside reduce ranges, then by axis id."""
  axis_id, axis_type = r.arg if isinstance(r.arg, tuple) else (r.arg, AxisType.LOOP)
  return (AXIS_ORDER.get(axis_type, 9), axis_id)


def identity_element(op: Ops, dt: Any) -> Any:
  """The value `op` starts its reduction from."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dt.scalar())
  raise ValueError(f"REDUCE with op {op} is not supported; valid: ADD, MUL, MAX")


def _combine(op: Ops, a: UOp, b: UOp) -> UOp:
  if op is Ops.MAX: return a.maximum(b)
  return a.alu(op, b)


def _end_nest(body: UOp, rngs: list[UOp]) -> UOp:
  """body inside the loops of `rngs` (outermost first): END(...END(body, innermost)..., outermost)."""
  for r in reversed(rngs): body = UOp(Ops.END, src=(body, r))
  return body


def _lane_terms(value: UOp) -> list[UOp]:
  """The terms of an ADD reduce's value as the expander folds its unrolled lanes, ((l0 + l1) + l2) + ...: the left
  spine of ADDs, walked down (no recursion), in order; a value that is no ADD is its own single term."""
  terms: list[UOp] = []
  while value.op is Ops.ADD and value.src[0].dtype == value.dtype:
    terms.append(value.src[1])
    value = value.src[0]
  return [value, *reversed(terms)]


def _update(op: Ops, cur: UOp, value: UOp, chain: bool) -> UOp:
  """The accumulator's new value. `chain` (an ADD reduce with accumulators enough, see `lower_reduces`): the
  value's lane terms are added to the accumulator one by one, ((acc + l0) + l1) + l2, so each term that is a
  product becomes one FMA into the accumulator; acc + ((l0 + l1) + l2) was a MUL, an FMA per further lane and an ADD
  (a 3x3 conv's unrolled filter row: 4 FP instructions per 3 taps instead of 3). The terms' order changes, which the
  accumulation contract allows (docs/PIPELINE.md: the order is not part of it, the bound is)."""
  if not chain: return _combine(op, cur, value)
  for term in _lane_terms(value): cur = cur + term
  return cur


def lower_reduces(sink: UOp, acc_counter: itertools.count | None = None, chains: int = 0) -> UOp:
  """Replace every REDUCE with an accumulator loop (see the module docstring). `chains` > 0: in a loop of at least
  that many ADD accumulators (a conv's or matmul's register block: the FMA ports stay busy on independent chains), an
  accumulator takes its value's unrolled lanes one at a time (`_update`); 0: never."""
  counter = acc_counter if acc_counter is not None else itertools.count()
  while True:
    reduces = [u for u in sink.toposort() if u.op is Ops.REDUCE]
    if not reduces: return sink
    # innermost reduces: their value holds no other REDUCE
    all_groups: dict[tuple[UOp, ...], list[UOp]] = {}
    for r in reduces: all_groups.setdefault(tuple(sorted(r.src[1:], key=range_key)), []).append(r)
    # a group (reduces sharing one loop) is lowered once none of its members holds another REDUCE
    groups = {k: v for k, v in all_groups.items()
              if all(not any(x.op is Ops.REDUCE for x in r.src[0].toposort()) for r in v)}
    if not groups:
      raise ValueError(f"REDUCEs over ranges {[r.arg for r in next(iter(all_groups))]} depend on each other; "
                       "a reduce's value can't use a reduce over the same ranges")
    subs: dict[UOp, UOp] = {}
    for rngs, reds in groups.items():
      # the accumulator starts over in every loop the value or a loop bound depends on (a narrowed loop's bound may
      # use an output index the value doesn't: lower/bounds.py)
      outer = sorted({x: None for red in reds for x in red.src[0].ranges if x not in rngs} |
                     {x: None for r in rngs for x in r.src[0].ranges if x not in rngs}, key=range_key)
      inits, upds, accs = [], [], []
      for red in reds:
        acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1, AddrSpace.REG), arg=next(counter))
        slot = acc.index(UOp.const(dtypes.index, 0))
        init = slot.store(UOp.const(red.dtype, identity_element(red.arg, red.dtype)), *outer)
        cur = slot.load(init, *rngs)
        inits.append(init)
        chain = 0 < chains <= sum(r.arg is Ops.ADD for r in reds) and red.arg is Ops.ADD
        upds.append(slot.store(_update(red.arg, cur, red.src[0], chain)))
        accs.append((red, slot))
      body = upds[0] if len(upds) == 1 else UOp(Ops.GROUP, src=tuple(upds))
      end = _end_nest(body, list(rngs))
      for red, slot in accs: subs[red] = slot.load(end)
    sink = sink.substitute(subs, name="reduce_to_acc")


def _stores(sink: UOp) -> list[UOp]:
  out: list[UOp] = []
  stack = list(reversed(sink.src))
  while stack:
    s = stack.pop()
    if s.op is Ops.GROUP: stack.extend(reversed(s.src))
    else: out.append(s)
  return out


class _Conflict(Exception):
  pass


def add_ends(sink: UOp) -> UOp:
  """Wrap the sink's STOREs in END nodes for their loops, sharing loops between stores with common ranges.
  Stores whose ranges don't nest (one uses r1 only, another r0 and r1) all get the union of the ranges: a store then
  repeats its (identical) writes in the loops it doesn't use, which keeps every range in exactly one loop."""
  items = [(tuple(sorted((r for r in st.ranges if r.op is Ops.RANGE), key=range_key)), st) for st in _stores(sink)]
  try: return sink.replace(src=tuple(_nest(items)))
  except _Conflict:
    union = tuple(sorted({r: None for rs, _ in items for r in rs}, key=range_key))
    return sink.replace(src=tuple(_nest([(union, st) for _, st in items])))


def _nest(items: list[tuple[tuple[UOp, ...], UOp]]) -> list[UOp]:
  seen: dict[UOp, tuple[UOp, ...]] = {}

  def nest(its: list[tuple[tuple[UOp, ...], UOp]], level: int) -> list[UOp]:
    out = [st for rs, st in its if len(rs) == level]
    groups: dict[UOp, list[tuple[tuple[UOp, ...], UOp]]] = {}
    for rs, st in its:
      if len(rs) > level: groups.setdefault(rs[level], []).append((rs, st))
    for r, sub in groups.items():
      if r in seen and seen[r] != sub[0][0][:level]: raise _Conflict(r)
      seen[r] = sub[0][0][:level]
      body = nest(sub, level + 1)
      out.append(UOp(Ops.END, src=(body[0] if len(body) == 1 else UOp(Ops.GROUP, src=tuple(body)), r)))
    return out

  return nest(items, 0)
