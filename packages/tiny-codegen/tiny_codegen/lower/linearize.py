"""Linearize: the lowered graph to a list of UOps in execution order.

Expects: a SINK whose sources are STOREs / END trees (see `reduce.add_ends`), every loop range closed by exactly one
END(body, range) (one range per END). Every node is placed in the innermost loop among the ranges it depends on
(loop-invariant code is hoisted for free); a loop is emitted as `RANGE, body..., END`. Within one loop body nodes
are ordered topologically, ties broken by their order in the graph.
Guarantees: sources come before users, a RANGE before everything inside its loop, the SINK last.
"""
from __future__ import annotations

import heapq
from tiny_uop.uop import Ops, UOp

Item = UOp | tuple[str, UOp]  # a node, or ("loop", RANGE) standing for a whole child loop


class LinearizeError(Exception):
  """The graph's loops don't nest (a node needs two loops that are not inside one another)."""


def linearize(sink: UOp) -> list[UOp]:
  """The nodes under `sink` in an order a renderer can emit top to bottom (see the module docstring)."""
  sink.ranges  # noqa: B018 -- fills every node's cached `ranges` in one pass (per-node first calls are quadratic)
  topo = list(sink.toposort())
  pos = {u: i for i, u in enumerate(topo)}
  end_of: dict[UOp, UOp] = {}
  for u in topo:
    if u.op is Ops.END:
      r = u.src[-1]
      if r in end_of: raise LinearizeError(f"range {r.arg} is closed by two ENDs")
      end_of[r] = u
  for u in topo:
    if u.op is Ops.RANGE and u not in end_of: raise LinearizeError(f"range {u.arg} is never closed by an END")
  # the loop each loop sits in: the deepest range its END still depends on
  parent: dict[UOp, UOp | None] = {}
  depth: dict[UOp, int] = {}

  def get_depth(r: UOp) -> int:  # recursion depth is the loop nesting depth: small
    if r in depth: return depth[r]
    # inside every loop its body or its bound depends on (a narrowed loop's bound may use an output index its body
    # doesn't: lower/bounds.py)
    outs = list({x: None for x in (*end_of[r].ranges, *r.src[0].ranges) if x.op is Ops.RANGE and x is not r})
    for x in outs: get_depth(x)
    parent[r] = max(outs, key=lambda x: depth[x]) if outs else None
    depth[r] = depth[parent[r]] + 1 if parent[r] is not None else 1  # type: ignore[index]
    return depth[r]

  for r in end_of: get_depth(r)

  def ancestors(r: UOp | None) -> list[UOp]:
    out = []
    while r is not None:
      out.append(r)
      r = parent[r]
    return out

  # scope of each node: its deepest range; all its ranges must lie on that loop's chain
  scope: dict[UOp, UOp | None] = {}
  for u in topo:
    if u.op is Ops.END:
      scope[u] = u.src[-1]  # an END belongs to the loop it closes (it is that loop's last item)
      continue
    rs = [x for x in u.ranges if x.op is Ops.RANGE]
    if not rs:
      scope[u] = None
      continue
    deepest = max(rs, key=lambda x: depth[x])
    chain = set(ancestors(deepest))
    if any(x not in chain for x in rs):
      raise LinearizeError(f"{u.op} needs loops {[x.arg for x in rs]} that don't nest")
    scope[u] = deepest

  members: dict[UOp | None, list[UOp]] = {}
  for u in topo:
    if u.op is Ops.RANGE: members.setdefault(parent[u], [])  # the RANGE opens its own loop item
    elif u.op is not Ops.END: members.setdefault(scope[u], []).append(u)
  children: dict[UOp | None, list[UOp]] = {}
  for r in end_of: children.setdefault(parent[r], []).append(r)

  def item_in(u: UOp, s: UOp | None) -> Item | None:
    """What `u` is, seen from inside loop `s`: a node of s, a child loop of s, or None (outside s)."""
    cur = u if u.op is Ops.RANGE else scope[u]
    if u.op is not Ops.RANGE and cur == s: return u
    if u.op is Ops.RANGE and parent[u] == s: return ("loop", u)
    while cur is not None:
      if parent[cur] == s: return ("loop", cur)
      cur = parent[cur]
    return None

  # per loop, bottom-up (deepest loops first): the nodes its body uses from outside it, and its first graph position
  def inside(x: UOp, r: UOp) -> bool:
    cur = x if x.op is Ops.RANGE else scope[x]
    while cur is not None and depth[cur] > depth[r]: cur = parent[cur]
    return cur is r
  ext: dict[UOp, set[UOp]] = {}
  first: dict[UOp, int] = {}
  for r in sorted(end_of, key=lambda x: -depth[x]):
    used: set[UOp] = set(r.src)  # the loop's bound is used by the loop: it must come before the RANGE
    body = [*members.get(r, []), end_of[r]]
    for n in body: used.update(n.src)
    fpos = min([pos[r], *(pos[n] for n in body)])
    for c in children.get(r, []):
      used |= ext[c]
      fpos = min(fpos, first[c])
    ext[r] = {x for x in used if not inside(x, r)}
    first[r] = fpos

  def emit(s: UOp | None) -> list[UOp]:
    items: list[Item] = [*members.get(s, []), *(("loop", r) for r in children.get(s, []))]
    deps: dict[Item, set[Item]] = {}
    prio: dict[Item, int] = {}
    for it in items:
      used = ext[it[1]] if isinstance(it, tuple) else it.src
      d: set[Item] = set()
      for src in used:
        if (x := item_in(src, s)) is not None and x != it: d.add(x)
      deps[it] = d
      prio[it] = first[it[1]] if isinstance(it, tuple) else pos[it]
    users: dict[Item, list[Item]] = {it: [] for it in items}
    for it, d in deps.items():
      for x in d: users[x].append(it)
    indeg = {it: len(d) for it, d in deps.items()}
    heap = [(prio[it], i, it) for i, it in enumerate(items) if indeg[it] == 0]
    order = {id(it): i for i, it in enumerate(items)}
    heapq.heapify(heap)
    out: list[UOp] = []
    done = 0
    while heap:
      _, _, it = heapq.heappop(heap)
      done += 1
      if isinstance(it, tuple):
        r = it[1]
        out += [r, *emit(r), end_of[r]]
      else: out.append(it)
      for nx in users[it]:
        indeg[nx] -= 1
        if indeg[nx] == 0: heapq.heappush(heap, (prio[nx], order[id(nx)], nx))
    if done != len(items): raise LinearizeError("cycle between loops (a loop needs a value computed after it)")
    return out

  ret = emit(None)
  if ret[-1] is not sink:
    ret = [u for u in ret if u is not sink] + [sink]
  return ret
