"""AMD's HCQ2 encoder: `pm_lower`, one PatternMatcher from HCQ2 queue ops to PM4 (compute) and SDMA (copy) packets.

Every rule records the op with the packet builders the eager path uses (the device's `hw_compute_queue_t`, a PM4 queue
of `pm4.py`, and `hw_copy_queue_t`, `sdma.AMDCopyQueue`; `ctx.dev` is the graph's device), so no encoding is written
twice: the builders accept UOp values (addresses, launch sizes, timeline values), and the recorded dwords become a
`PACKET` whose sources are constants or expressions (tiny_uop.hcq2 patches the latter).
An INDIRECT on the compute engine is an INDIRECT_BUFFER packet to the body's command buffer (bufferized by HCQ2); on
the copy engine (SDMA, whose indirect packet this driver doesn't use) the body's dwords are copied into the kick.
"""
from __future__ import annotations

from typing import Any

from tiny_uop import Ops, PatternMatcher, UPat
from tiny_uop.hcq2 import exec_packet, indirect_packet, inline_body, packet


def _q(ctx: Any, engine: str) -> Any:
  """A new queue of the graph's device for `engine`: its PM4 queue class (per architecture) or its SDMA queue."""
  return ctx.dev.hw_compute_queue_t() if engine == "compute" else ctx.dev.hw_copy_queue_t()


pm_lower = PatternMatcher([
  (UPat(Ops.EXEC, name="x"), lambda ctx, x: exec_packet(_q(ctx, "compute"), x)),
  (UPat(Ops.XFER, name="x"), lambda ctx, x: packet(_q(ctx, "copy").copy(x.src[1], x.src[2], x.arg.nbytes), "copy")),
  (UPat(Ops.WAIT, name="x"), lambda ctx, x: packet(_q(ctx, x.arg[0]).wait(x.arg[1], x.src[0]), "wait")),
  (UPat(Ops.SIGNAL, name="x"), lambda ctx, x: packet(_q(ctx, x.arg[0]).signal(x.arg[1], x.src[0]), "signal")),
  (UPat(Ops.MEMBAR, name="x"), lambda ctx, x: packet(_q(ctx, x.arg).memory_barrier(), "barrier")),
  (UPat(Ops.INDIRECT, arg="compute", src=(UPat(Ops.QUEUE),), name="x"),
   lambda ctx, x: indirect_packet(_q(ctx, "compute"), x)),
  (UPat(Ops.INDIRECT, arg="copy", src=(UPat(Ops.QUEUE),), name="x"), inline_body),
], name="amd pm_lower")
