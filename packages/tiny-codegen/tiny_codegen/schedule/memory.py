"""The memory planner: intermediate buffers whose last reader has run give their storage to later outputs."""
from __future__ import annotations

from collections import defaultdict

from tiny_uop.uop import Ops, UOp


def _n_outputs(call: UOp) -> int:
  ast = call.src[0]
  if ast.op is Ops.SINK: return sum(1 for s in ast.src if s.op is Ops.STORE) or 1
  return 1  # COPY and SLICE write buffers[0]


def memory_plan(calls: list[UOp], keep: set[UOp] | frozenset[UOp] = frozenset()) -> dict[UOp, UOp]:
  """Map intermediate BUFFERs to earlier ones of the same device, size and dtype that are no longer read.

  `calls` are CALLs in execution order. Buffers in `keep` (inputs, buffers the caller holds, views and their bases)
  are never replaced nor handed out. Returns {buffer: buffer whose storage it reuses}; apply it to the CALL sources.
  A buffer is freed after the call that last uses it, so an output never shares storage with its own kernel's inputs.
  """
  last_use: dict[UOp, int] = {}
  for i, c in enumerate(calls):
    for b in c.src[1:]: last_use[b] = i
  free: dict[tuple, list[UOp]] = defaultdict(list)
  assigned: dict[UOp, UOp] = {}
  seen: set[UOp] = set()
  for i, c in enumerate(calls):
    nout = _n_outputs(c)
    for b in c.src[1:1 + nout]:
      if b in seen or b in keep or b.op is not Ops.BUFFER: continue
      key = (b.src[1].arg, b.arg, b.dtype)
      if free[key]: assigned[b] = free[key].pop()
    seen.update(c.src[1:])
    for b in dict.fromkeys(c.src[1:]):
      if last_use[b] == i and b not in keep and b.op is Ops.BUFFER:
        free[(b.src[1].arg, b.arg, b.dtype)].append(assigned.get(b, b))
  return assigned
