"""SDMA (gfx11, SDMA v6) packets and `AMDCopyQueue`.

Opcodes and layouts: Linux `drivers/gpu/drm/amd/amdgpu/sdma_v6_0_0_pkt_open.h` (`SDMA_OP_*`, `SDMA_SUBOP_*`,
`SDMA_PKT_COPY_LINEAR`, `SDMA_PKT_FENCE`, `SDMA_PKT_POLL_REGMEM`, `SDMA_PKT_TIMESTAMP`): a header dword with op in
bits 7:0 and sub-op in 15:8, then the body.
"""
from __future__ import annotations

from tiny_uop.hcq import HCQSignal, HWQueue, Val, hi32, lo32

OP_NOP, OP_COPY, OP_FENCE, OP_TRAP, OP_POLL_REGMEM, OP_TIMESTAMP = 0, 1, 5, 6, 8, 13
SUBOP_COPY_LINEAR, SUBOP_TIMESTAMP_GET_GLOBAL = 0, 2
POLL_FUNC_GEQ = 5  # compare functions: 0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >
MAX_COPY = 1 << 22  # bytes per COPY_LINEAR (count field: bytes - 1)
PACKET_DWORDS = {OP_NOP: 1, OP_COPY: 7, OP_FENCE: 4, OP_TRAP: 2, OP_POLL_REGMEM: 6, OP_TIMESTAMP: 3}


def header(op: int, sub_op: int = 0, extra: int = 0) -> int: return (op & 0xFF) | ((sub_op & 0xFF) << 8) | (extra << 16)


class AMDCopyQueue(HWQueue):
  """An SDMA queue: linear copies, fences (signal values), polls (waits) and timestamps."""

  def copy(self, dest: Val, src: Val, size: int) -> AMDCopyQueue:
    """Copy `size` bytes (split into COPY_LINEAR packets of at most MAX_COPY bytes)."""
    if isinstance(dest, int) and isinstance(src, int):
      for off in range(0, size, MAX_COPY):
        n = min(MAX_COPY, size - off)
        s, d = src + off, dest + off
        self.q(header(OP_COPY, SUBOP_COPY_LINEAR), n - 1, 0, lo32(s), hi32(s), lo32(d), hi32(d))
    else:
      if size > MAX_COPY: raise ValueError(f"a symbolic copy must fit one packet ({MAX_COPY} bytes), got {size}")
      self.q(header(OP_COPY, SUBOP_COPY_LINEAR), size - 1, 0, lo32(src), hi32(src), lo32(dest), hi32(dest))
    return self

  def fence(self, addr: Val, value: Val) -> AMDCopyQueue:
    """Write a 32-bit `value` to `addr` once earlier packets finished."""
    self.q(header(OP_FENCE), lo32(addr), hi32(addr), value)
    return self

  def signal(self, signal: HCQSignal, value: Val = 0) -> AMDCopyQueue:
    """The 64-bit signal value as two fences: the high word first, so a poller never sees a torn larger value."""
    return self.fence(signal.addr + 4, hi32(value)).fence(signal.addr, lo32(value))

  def wait(self, signal: HCQSignal, value: Val = 0) -> AMDCopyQueue:
    self.q(header(OP_POLL_REGMEM, extra=(POLL_FUNC_GEQ << 12) | (1 << 15)), lo32(signal.addr), hi32(signal.addr),
           lo32(value), 0xFFFFFFFF, (0xFFF << 16) | 10)
    return self

  def timestamp(self, signal: HCQSignal) -> AMDCopyQueue:
    self.q(header(OP_TIMESTAMP, SUBOP_TIMESTAMP_GET_GLOBAL), lo32(signal.addr + 8), hi32(signal.addr + 8))
    return self

  def memory_barrier(self) -> AMDCopyQueue: return self  # SDMA packets complete in order

  def _submit(self, dev, dwords: list[int]) -> None: dev.copy_ring.submit(dwords)
