"""SDMA (gfx11, SDMA v6) packets and `AMDCopyQueue`; `AMDCopyQueue9` for gfx942's SDMA v4.4.2.

Opcodes and layouts: Linux `drivers/gpu/drm/amd/amdgpu/sdma_v6_0_0_pkt_open.h` (`SDMA_OP_*`, `SDMA_SUBOP_*`,
`SDMA_PKT_COPY_LINEAR`, `SDMA_PKT_FENCE`, `SDMA_PKT_POLL_REGMEM`, `SDMA_PKT_TIMESTAMP_GET_GLOBAL`, `SDMA_PKT_TRAP`):
a header dword with op in bits 7:0 and sub-op in 15:8, then the body. Cross-checked in tests against tinygrad 0.14.0's
bindings of the same header (`autogen/am/sdma_6_0_0.py`). The largest COPY_LINEAR is amdgpu's `copy_max_bytes` for
SDMA v6 (0x400000).

Fences are written uncached: amdgpu's `sdma_v5_0/v5_2/v6_0/v7_0_ring_emit_fence` put MTYPE 3 (UC) in the FENCE
header (bits 18:16, `SDMA_PKT_FENCE_HEADER_MTYPE(0x3)`), so the value goes to memory rather than sitting in the GPU's
L2 where a host poller would not see it (as tinygrad 0.14's SDMA queue does). SDMA v4.4.2 (gfx942) has no MTYPE field
in the FENCE header: `sdma_v4_4_2_ring_emit_fence` writes the bare op, and so does `AMDCopyQueue9`.
"""
from __future__ import annotations

from tiny_uop.hcq import HCQSignal, HWQueue, Val, hi32, lo32

OP_NOP, OP_COPY, OP_FENCE, OP_TRAP, OP_POLL_REGMEM, OP_TIMESTAMP = 0, 1, 5, 6, 8, 13
SUBOP_COPY_LINEAR, SUBOP_TIMESTAMP_GET_GLOBAL = 0, 2
# POLL_REGMEM header: func in bits 30:28 (0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >), mem_poll bit 31
POLL_FUNC_SHIFT, POLL_MEM_POLL = 28, 1 << 31
POLL_FUNC_GEQ = 5
POLL_INTERVAL, POLL_RETRY_SHIFT, POLL_RETRY_FOREVER = 10, 16, 0xFFF
TRAP_INT_CONTEXT_MASK = 0x0FFFFFFF  # SDMA_PKT_TRAP_INT_CONTEXT_int_context: 28 bits
MAX_COPY = 1 << 22  # bytes per COPY_LINEAR (count field: bytes - 1)
FENCE_MTYPE_SHIFT, MTYPE_UC = 16, 3  # SDMA_PKT_FENCE_HEADER_mtype (18:16); amdgpu's MTYPE_UC
PACKET_DWORDS = {OP_COPY: 7, OP_FENCE: 4, OP_TRAP: 2, OP_POLL_REGMEM: 6, OP_TIMESTAMP: 3}


def header(op: int, sub_op: int = 0, extra: int = 0) -> int:
  """The packet header: op in bits 7:0, sub-op in 15:8, `extra` = the op's own header fields (already shifted)."""
  return (op & 0xFF) | ((sub_op & 0xFF) << 8) | extra


class AMDCopyQueue(HWQueue):
  """An SDMA queue: linear copies, fences (signal values), polls (waits), traps (interrupts) and timestamps."""
  fence_header = header(OP_FENCE, extra=MTYPE_UC << FENCE_MTYPE_SHIFT)  # SDMA v5+/v6: uncached fence writes

  def copy(self, dest: Val, src: Val, size: int) -> AMDCopyQueue:
    """Copy `size` bytes (split into COPY_LINEAR packets of at most MAX_COPY bytes)."""
    for off in range(0, size, MAX_COPY):
      n = min(MAX_COPY, size - off)
      s, d = (src + off, dest + off) if off else (src, dest)  # ints, HCQVars or UOp expressions
      self.q(header(OP_COPY, SUBOP_COPY_LINEAR), n - 1, 0, lo32(s), hi32(s), lo32(d), hi32(d))
    return self

  def fence(self, addr: Val, value: Val) -> AMDCopyQueue:
    """Write a 32-bit `value` to `addr` (dword aligned) once earlier packets finished."""
    self.q(self.fence_header, lo32(addr), hi32(addr), value)
    return self

  def trap(self, int_context: Val) -> AMDCopyQueue:
    """Raise an interrupt carrying `int_context` (KFD signals the event with that id: its 28 low bits)."""
    self.q(header(OP_TRAP), int_context)
    return self

  def signal(self, signal: HCQSignal, value: Val = 0) -> AMDCopyQueue:
    """The 64-bit signal value as two fences: the high word first, so a poller never sees a torn larger value. With a
    KFD event (`signal.event`): its id into the event's mailbox slot, then a TRAP that wakes WAIT_EVENTS."""
    self.fence(signal.addr + 4, hi32(value)).fence(signal.addr, lo32(value))
    if (ev := getattr(signal, "event", None)) is not None: self.fence(ev.mailbox, ev.event_id).trap(ev.event_id)
    return self

  def wait(self, signal: HCQSignal, value: Val = 0) -> AMDCopyQueue:
    """POLL_REGMEM until the signal's low 32 bits >= value (memory poll, retried forever)."""
    self.q(header(OP_POLL_REGMEM, extra=(POLL_FUNC_GEQ << POLL_FUNC_SHIFT) | POLL_MEM_POLL), lo32(signal.addr),
           hi32(signal.addr), lo32(value), 0xFFFFFFFF, (POLL_RETRY_FOREVER << POLL_RETRY_SHIFT) | POLL_INTERVAL)
    return self

  def timestamp(self, signal: HCQSignal) -> AMDCopyQueue:
    self.q(header(OP_TIMESTAMP, SUBOP_TIMESTAMP_GET_GLOBAL), lo32(signal.addr + 8), hi32(signal.addr + 8))
    return self

  def memory_barrier(self) -> AMDCopyQueue: return self  # SDMA packets complete in order

  def _submit(self, dev, dwords: list[int]) -> None: dev.copy_ring.submit(dwords)


class AMDCopyQueue9(AMDCopyQueue):
  """gfx942's SDMA v4.4.2 queue: the FENCE header has no MTYPE field (`sdma_v4_4_2_ring_emit_fence`: the bare op)."""
  fence_header = header(OP_FENCE)
