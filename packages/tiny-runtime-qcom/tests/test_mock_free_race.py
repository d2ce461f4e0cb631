"""The mock KGSL when two threads free and allocate at once (MOCK+QCOM with IMAGE=1 under pytest-xdist faulted with
"GPU page fault: buffer address: 1 bytes at 0x7f.. are outside every GPU object").

`KGSLIface.free` unmaps the CPU mapping, then frees the GPU object (GPUOBJ_FREE). Between the two, another thread's
alloc can get the very same virtual address from mmap (the kernel reuses the hole). The mock used to drop the GPU
address range of the *freed* object only at GPUOBJ_FREE, by address: it dropped the new object's range instead, and
the GPU faulted on the new buffer. Here that interleaving is made deterministic, in one thread."""
from __future__ import annotations

import ctypes

from tiny_runtime_qcom.kgsl import PAGE, KGSLIface
from tiny_runtime_qcom.mock.driver import MockFileIO, driver


def test_free_never_drops_a_newer_object_at_the_same_address():
  k = KGSLIface(MockFileIO)
  drv = driver()
  size = 8 * PAGE
  reused = 0
  for _ in range(16):
    a = k.alloc(size)
    k.dev.munmap(a.va_addr, a.size)        # thread 1: KGSLIface.free, first half
    b = k.alloc(size)                      # thread 2: an alloc in between, often at the address just unmapped
    k.ioctl("GPUOBJ_FREE", id=a.meta)      # thread 1: KGSLIface.free, second half
    reused += b.va_addr == a.va_addr
    drv.check(b.va_addr, b.size, "buffer address")  # b is a live GPU object: the GPU may read all of it
    ctypes.memset(b.va_addr, 7, b.size)
    assert bytes((ctypes.c_uint8 * 4).from_address(b.va_addr + b.size - 4)) == b"\x07" * 4
    k.free(b)
  assert reused, "mmap never handed the unmapped address out again: the interleaving was not exercised"
