"""QCOM's HCQ2 encoder: `pm_lower`, one PatternMatcher from HCQ2 queue ops to a6xx type-4/type-7 packets.

Every rule records the op with the packet builders the eager path uses (`a6xx.QCOMComputeQueue`: `exec`, `wait`,
`signal`, `memory_barrier`, `indirect_buffer`), so no packet is encoded twice: the builders accept UOp values (the
argument-region address, launch sizes, signal values), and the recorded dwords become a `PACKET` whose sources are
constants or expressions (tiny_uop.hcq2 patches the latter in the command buffer).

Adreno has one engine for everything: `QCOMDevice.hcq2_copy_engine = "compute"`, and the JIT gives the graph kernels
only (QCOM copies go through the CPU mapping), so an XFER is not encoded (HCQ2 names it if one ever reaches `lower`).
INDIRECT is a CP_INDIRECT_BUFFER to the body's command buffer: KGSL runs the kick as IB1, the body is its IB2.
The texture and UAV descriptors of image arguments live in each kernel's argument region; their base-address fields
are where `QCOMProgram.args_layout` puts those buffers' addresses, so HCQ2's argument patches rewrite them.
"""
from __future__ import annotations

from typing import Any

from tiny_uop import Ops, PatternMatcher, UPat
from tiny_uop.hcq2 import exec_packet, indirect_packet, packet


def _q(ctx: Any, engine: str) -> Any:
  """A new queue of the graph's device for `engine` (Adreno: the compute queue for every engine)."""
  if engine != "compute": raise ValueError(f"{ctx.dev.device} has only a compute engine, not {engine!r}")
  return ctx.dev.hw_compute_queue_t()


pm_lower = PatternMatcher([
  (UPat(Ops.EXEC, name="x"), lambda ctx, x: exec_packet(_q(ctx, "compute"), x)),
  (UPat(Ops.WAIT, name="x"), lambda ctx, x: packet(_q(ctx, x.arg[0]).wait(x.arg[1], x.src[0]), "wait")),
  (UPat(Ops.SIGNAL, name="x"), lambda ctx, x: packet(_q(ctx, x.arg[0]).signal(x.arg[1], x.src[0]), "signal")),
  (UPat(Ops.MEMBAR, name="x"), lambda ctx, x: packet(_q(ctx, x.arg).memory_barrier(), "barrier")),
  (UPat(Ops.INDIRECT, arg="compute", src=(UPat(Ops.QUEUE),), name="x"),
   lambda ctx, x: indirect_packet(_q(ctx, "compute"), x)),
], name="qcom pm_lower")
