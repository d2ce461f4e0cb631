"""A fresh mock KFD per test (four gfx1100s by default), with the real driver's `KFDIface` on it and raw PM4/SDMA
queues whose dwords a test writes itself: for feeding the mock command processors packets the driver would never
build (wrong compare functions, reserved bits, bad lengths) without disturbing the process's `MOCK+AMD` devices."""
from __future__ import annotations

import ctypes
from typing import Any

from tiny_runtime_amd import kfd
from tiny_runtime_amd.kfd import KFDIface
from tiny_runtime_amd.mock.driver import MockFileIO, MockKFD


class Harness:
  """`drv` (the mock), `iface` (GPU `dev_id` through the real KFDIface), and lazily created raw queues."""

  def __init__(self, dev_id: int = 0, drv: MockKFD | None = None):
    self.drv = drv or MockKFD()
    self.fio = type("HarnessIO", (MockFileIO,), {"kfd_fn": staticmethod(lambda: self.drv)})
    self.iface = KFDIface(dev_id, self.fio)
    self.gpu = self.drv.by_id[self.iface.node.gpu_id]
    self._queues: dict[int, tuple[Any, Any, int, list[int]]] = {}

  def queue(self, qtype: int, cwsr: bool = True) -> tuple[Any, Any, int, list[int]]:
    """(queue struct, ring buffer, doorbell address, [write pointer]) of a raw queue of `qtype` (created once)."""
    if qtype not in self._queues:
      ring, ptrs = self.iface.alloc(0x4000, host=True), self.iface.alloc(0x1000, host=True)
      extra: dict[str, int] = {}
      if qtype == kfd.QUEUE_TYPE_COMPUTE and cwsr:
        cw = self.iface.node.cwsr
        assert cw is not None
        ctx, eop = self.iface.alloc(cw.alloc_size, host=True), self.iface.alloc(0x1000)
        extra = dict(eop_buffer_address=eop.va_addr, eop_buffer_size=cw.eop_buffer_size,
                     ctx_save_restore_address=ctx.va_addr, ctx_save_restore_size=cw.ctx_save_restore_size,
                     ctl_stack_size=cw.ctl_stack_size)
      q = self.iface.create_queue(ring_base_address=ring.va_addr, ring_size=ring.size, queue_type=qtype,
                                  queue_percentage=100, queue_priority=7, read_pointer_address=ptrs.va_addr,
                                  write_pointer_address=ptrs.va_addr + 8, **extra)
      page = self.iface.kfd.mmap(0, 0x2000, 3, 1, q.doorbell_offset & ~0x1FFF)
      self._queues[qtype] = (q, ring, page + (q.doorbell_offset & 0x1FFF), [0])
    return self._queues[qtype]

  def submit(self, qtype: int, dwords: list[int], run: bool = True) -> None:
    """Append `dwords` to the queue's ring, ring its doorbell, and (with `run`) let the mock GPUs run."""
    _, ring, doorbell, wptr = self.queue(qtype)
    per = 1 if qtype == kfd.QUEUE_TYPE_COMPUTE else 4
    arr = (ctypes.c_uint32 * (ring.size // 4)).from_address(ring.va_addr)
    for d in dwords:
      arr[(wptr[0] // per) % len(arr)] = d
      wptr[0] += per
    ctypes.c_uint64.from_address(doorbell).value = wptr[0]
    if run: self.drv.process()

  def pm4(self, dwords: list[int], run: bool = True) -> None: self.submit(kfd.QUEUE_TYPE_COMPUTE, dwords, run)
  def sdma(self, dwords: list[int], run: bool = True) -> None: self.submit(kfd.QUEUE_TYPE_SDMA, dwords, run)

  def mock_queue(self, qtype: int) -> Any: return self.drv.queues[self.queue(qtype)[0].queue_id]

  def word(self, buf: Any, off: int = 0) -> int: return ctypes.c_uint32.from_address(buf.va_addr + off).value
