"""NV's HCQ2 encoder: `pm_lower`, one PatternMatcher from HCQ2 queue ops to pushbuffer methods.

Each rule records the op with the builders the eager path uses (`push.NVComputeQueue`, `push.NVCopyQueue`), which
accept UOp values; the dwords become a `PACKET` (constants or expressions that tiny_uop.hcq2 patches). A dispatch is
SEND_PCAS_A of the QMD inside its argument region (the launch sizes live in that QMD: `NVProgram.launch_fields`).
INDIRECT is not encoded: the GPU fetches a bound command buffer in place as a GPFIFO entry of its own, which
`NVDevice.hcq_submitter` writes for the `(address, ndwords)` parts of a submission.
"""
from __future__ import annotations

from typing import Any

from tiny_uop import Ops, PatternMatcher, UPat
from tiny_uop.hcq2 import exec_packet, packet


def _q(ctx: Any, engine: str) -> Any:
  """A new queue of the graph's device for `engine` (`push.NVComputeQueue` or `push.NVCopyQueue`)."""
  return ctx.dev.hw_compute_queue_t() if engine == "compute" else ctx.dev.hw_copy_queue_t()


pm_lower = PatternMatcher([
  (UPat(Ops.EXEC, name="x"), lambda ctx, x: exec_packet(_q(ctx, "compute"), x, "launch")),
  (UPat(Ops.XFER, name="x"), lambda ctx, x: packet(_q(ctx, "copy").copy(x.src[1], x.src[2], x.arg.nbytes), "copy")),
  (UPat(Ops.WAIT, name="x"), lambda ctx, x: packet(_q(ctx, x.arg[0]).wait(x.arg[1], x.src[0]), "wait")),
  (UPat(Ops.SIGNAL, name="x"), lambda ctx, x: packet(_q(ctx, x.arg[0]).signal(x.arg[1], x.src[0]), "signal")),
  (UPat(Ops.MEMBAR, name="x"), lambda ctx, x: packet(_q(ctx, x.arg).memory_barrier(), "barrier")),
], name="nv pm_lower")
