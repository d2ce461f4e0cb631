"""The mock rejects what hardware rejects, hangs where hardware hangs and faults where it faults: deliberately wrong
packets, missing cache actions, a wrong privilege bit, scratch programmed for too few shader engines, events nobody
signals, and the KFD rules (runtime enable, event page, mapping). Each case runs on a fresh mock (`mock_harness`), or on
the process's MOCK+AMD device and leaves it working."""
from __future__ import annotations

import ctypes
import struct

import pytest
from mock_harness import Harness

from tiny_runtime_amd import kfd, pm4, sdma
from tiny_runtime_amd.emu.encode import endpgm
from tiny_runtime_amd.kfd import KFDError
from tiny_runtime_amd.mock.driver import GPUHang, GPUPageFault, MockKFD, PacketError, ShaderFault
from tiny_runtime_amd.pm4 import AMDComputeQueue
from tiny_runtime_amd.sdma import AMDCopyQueue, AMDCopyQueue9
from tiny_uop.hcq import HCQSignal

PM4, SDMA = kfd.QUEUE_TYPE_COMPUTE, kfd.QUEUE_TYPE_SDMA


@pytest.fixture
def h() -> Harness: return Harness()


def _signal(h: Harness, value: int = 0) -> HCQSignal:
  buf = h.iface.alloc(0x1000, host=True, uncached=True)
  return HCQSignal(buf.va_addr, value)


# ***** WAIT_REG_MEM: the compare function *****
def test_the_drivers_wait_passes_a_value_already_reached_and_the_old_eq_encoding_hangs(h):
  sig, done = _signal(h, 7), _signal(h)
  # the driver's wait (function 5, GE) for a value the signal already passed
  h.pm4(AMDComputeQueue().wait(sig, 5).release_mem(done.addr, 1, pm4.DATA_SEL_64).resolved())
  assert done.value == 1
  # the same wait encoded with function 3 (PM4's EQUAL, the old driver's ">=") never completes
  h.pm4(AMDComputeQueue().wait_reg_mem(sig.addr, 5, func=pm4.WAIT_FUNC_EQ).release_mem(done.addr, 2, pm4.DATA_SEL_64)
        .resolved())
  assert done.value == 1 and "EQ 5 is false" in h.mock_queue(PM4).blocked
  ev = h.iface.create_event()
  with pytest.raises(GPUHang, match=r"waits: WAIT_REG_MEM: \(\*\(u32\*\)0x[0-9a-f]+ = 7\) & 0xffffffff EQ 5 is false"):
    h.iface.wait_event(ev, 100)
  sig.value = 5  # the host makes EQ true: the queue goes on
  h.drv.process()
  assert done.value == 2


@pytest.mark.parametrize("func, value, ref, passes", [(0, 1, 9, True), (1, 1, 2, True), (1, 2, 2, False),
                                                      (2, 2, 2, True), (3, 2, 2, True), (4, 2, 2, False),
                                                      (5, 2, 2, True), (5, 1, 2, False), (6, 3, 2, True),
                                                      (6, 2, 2, False)])
def test_every_wait_reg_mem_function(h, func, value, ref, passes):
  sig, done = _signal(h, value), _signal(h)
  h.pm4(AMDComputeQueue().wait_reg_mem(sig.addr, ref, func=func).release_mem(done.addr, 1, pm4.DATA_SEL_64).resolved())
  assert done.value == int(passes)


def _wait_dwords(addr: int, dw1: int) -> list[int]:
  return [pm4.header(pm4.WAIT_REG_MEM, 6), dw1, addr & 0xFFFFFFFF, addr >> 32, 0, 0xFFFFFFFF, 4]


@pytest.mark.parametrize("dw1, match", [
  (5 | 1 << 4 | 1 << 3, r"dword 1: reserved bit\(s\) \[3\] set"),
  (7 | 1 << 4, r"function = 7 is reserved; valid: 0 ALWAYS, 1 LT, 2 LE, 3 EQ, 4 NE, 5 GE, 6 GT"),
  (5 | 2 << 4, r"mem_space = 2 is reserved"),
  (5, r"MEM_SPACE REGISTER: only the HDP flush is modelled \(operation 1 WR_WAIT_WR_REG, write 0xe26"),
  (5 | 1 << 4 | 1 << 8, r"reserved bit\(s\) \[8\]"),
])
def test_bad_wait_reg_mem_dwords_are_rejected(h, dw1, match):
  addr = _signal(h).addr if dw1 & 0x30 else 0x2C00  # a register space poll takes an 18-bit register offset
  with pytest.raises(PacketError, match=match): h.pm4(_wait_dwords(addr, dw1))


def test_unaligned_poll_address_and_unmapped_memory(h):
  sig = _signal(h)
  with pytest.raises(PacketError, match=r"dword 2: reserved bit\(s\) \[1\]"): h.pm4(_wait_dwords(sig.addr + 2, 5 | 16))
  with pytest.raises(GPUPageFault, match="WAIT_REG_MEM poll of 4 bytes at 0x10"): h.pm4(_wait_dwords(0x10, 5 | 16))


# ***** headers, opcodes, lengths *****
def test_headers_opcodes_and_lengths(h):
  with pytest.raises(PacketError, match="packet type 2"): h.pm4([0x80000000])
  with pytest.raises(PacketError, match="PREDICATE"): h.pm4([pm4.header(pm4.NOP, 1) | 1, 0])
  with pytest.raises(PacketError, match=r"reserved bit\(s\) \[4\]"): h.pm4([pm4.header(pm4.NOP, 1) | 16, 0])
  with pytest.raises(PacketError, match=r"WRITE_DATA \(header opcode 0x37\) is not modelled"):
    h.pm4([pm4.header(0x37, 4), 0, 0, 0, 0])
  with pytest.raises(PacketError, match="RELEASE_MEM has 6 body dwords; it takes exactly 7"):
    h.pm4([pm4.header(pm4.RELEASE_MEM, 6)] + [0] * 6)
  with pytest.raises(PacketError, match="claims 7 body dwords but the submission ends after 2"):
    h.pm4([pm4.header(pm4.RELEASE_MEM, 7), 0, 0])
  with pytest.raises(PacketError, match="SET_SH_REG has 1 body dwords; it takes 2 or more"):
    h.pm4([pm4.header(pm4.SET_SH_REG, 1), 0])
  done = _signal(h)  # after all that, the queue still runs good packets
  h.pm4(AMDComputeQueue().release_mem(done.addr, 5, pm4.DATA_SEL_64).resolved())
  assert done.value == 5


def test_set_sh_reg_checks_each_registers_fields(h):
  with pytest.raises(PacketError, match=r"COMPUTE_PGM_RSRC2 = 0x80000000: reserved bit\(s\) \[31\]"):
    h.pm4(AMDComputeQueue().set_sh_reg(pm4.COMPUTE_PGM_RSRC2, 1 << 31).resolved())
  with pytest.raises(PacketError, match=r"COMPUTE_TMPRING_SIZE = 0x08000000: reserved bit\(s\) \[27\]"):
    h.pm4(AMDComputeQueue().set_sh_reg(pm4.COMPUTE_TMPRING_SIZE, 1 << 27).resolved())
  with pytest.raises(PacketError, match=r"SH register 0xb858 .* is not a compute register"):
    h.pm4(AMDComputeQueue().set_sh_reg(0xB858, 0).resolved())
  h.pm4(AMDComputeQueue().set_sh_reg(pm4.COMPUTE_PGM_RSRC1, 0x60AF0041).resolved())
  assert h.mock_queue(PM4).regs[pm4.COMPUTE_PGM_RSRC1] == 0x60AF0041


# ***** RELEASE_MEM: cache actions, selects, interrupts *****
def _release(addr: int, dw1: int, dw2: int, data: int = 1, ctxid: int = 0) -> list[int]:
  return [pm4.header(pm4.RELEASE_MEM, 7), dw1, dw2, addr & 0xFFFFFFFF, addr >> 32, data, 0, ctxid]


EOP = pm4.CACHE_FLUSH_AND_INV_TS_EVENT | pm4.EVENT_INDEX_END_OF_PIPE << 8


def test_a_host_read_signal_after_a_dispatch_needs_l2_write_back(h):
  sig = _signal(h)
  h.gpu.l2_dirty = True  # as after a dispatch: the kernel's results may sit in L2
  with pytest.raises(PacketError, match="writes host-visible memory .* without an L2 write-back.*GL2_WB"):
    h.pm4(_release(sig.addr, EOP, pm4.DATA_SEL_64 << 29))
  assert sig.value == 0 and h.gpu.l2_dirty
  h.pm4(AMDComputeQueue().signal(sig, 3).resolved())  # the driver's signal writes L2 back first
  assert sig.value == 3 and not h.gpu.l2_dirty


@pytest.mark.parametrize("dw1, dw2, match", [
  (EOP | pm4.GCR_GLM_WB, pm4.DATA_SEL_64 << 29, "GLM_WB without GLM_INV"),
  (pm4.CS_PARTIAL_FLUSH | 5 << 8, pm4.DATA_SEL_64 << 29, "EVENT_TYPE 7 .* with EVENT_INDEX 5"),
  (pm4.CACHE_FLUSH_AND_INV_TS_EVENT | 4 << 8, 0, "event_index = 4 is reserved; valid: 5 END_OF_PIPE, 6 SHADER_DONE"),
  (EOP, 6 << 29, "data_sel = 6 is reserved"),
  (EOP, 4 << 29, "DATA_SEL SEND_CP_PERFCOUNTER_HI_LO is not modelled"),
  (EOP, 1 << 24 | 1 << 29, "INT_SEL 1 .* the interrupt must follow the confirmed write"),
  (EOP, 7 << 24, "int_sel = 7 is reserved"),
  (EOP, 2 << 16 | 1 << 29, "DST_SEL QUEUE_WRITE_POINTER_REGISTER is not modelled"),
  (EOP | 1 << 24, 0, r"reserved bit\(s\) \[24\]"),
  (EOP | pm4.GCR_GL2_WB | 1 << 28, 0, "EXECUTE = 1 is not modelled"),
  (EOP, 1 << 3, r"dword 2: reserved bit\(s\) \[3\]"),
])
def test_bad_release_mem_fields(h, dw1, dw2, match):
  sig = _signal(h)
  with pytest.raises(PacketError, match=match): h.pm4(_release(sig.addr, dw1, dw2))


def test_release_mem_alignment_by_data_size(h):
  sig = _signal(h)
  with pytest.raises(PacketError, match=r"dword 3: reserved bit\(s\) \[2\]"):
    h.pm4(_release(sig.addr + 4, EOP, pm4.DATA_SEL_64 << 29))
  h.pm4(_release(sig.addr + 4, EOP, pm4.DATA_SEL_32 << 29, 0x55))  # 32-bit data: dword alignment is enough
  assert sig.value == 0x55 << 32


# ***** ACQUIRE_MEM before a dispatch; the dispatch state *****
def _dispatch(h: Harness, priv: bool = True, acquire: bool = True, rsrc2: int = 0, tmpring: int = 0,
              scratch: int = 0, initiator_xor: int = 0, program: list[int] | None = None,
              tail: tuple[int, ...] | list[int] = ()) -> None:
  code = h.iface.alloc(0x1000, host=True)
  words = endpgm() if program is None else program
  ctypes.memmove(code.va_addr, struct.pack(f"<{len(words)}I", *words), 4 * len(words))

  class Prg:
    entry_addr, rsrc1, rsrc3 = code.va_addr, (pm4.RSRC1_PRIV if priv else 0) | 0x60AF0000, 0
    def scratch(self): return (scratch, tmpring) if scratch else None
    def user_data(self, args): return []
  Prg.rsrc2 = rsrc2
  q = AMDComputeQueue()
  if acquire: q.memory_barrier()
  dwords = q.exec(Prg(), 0, (2, 1, 1), (64, 1, 1)).resolved()
  dwords[-1] ^= initiator_xor  # DISPATCH_DIRECT's last dword: COMPUTE_DISPATCH_INITIATOR
  h.pm4(dwords + list(tail))


def test_dispatches_need_an_acquire_and_priv_on_a_cwsr_queue(h):
  with pytest.raises(PacketError, match="a dispatch with no ACQUIRE_MEM since the host"): _dispatch(h, acquire=False)
  with pytest.raises(PacketError, match=r"PRIV = 0 on a queue with a CWSR area: on gfx1100 waves run privileged"):
    _dispatch(h, priv=False)
  before = h.gpu.dispatches
  _dispatch(h)
  assert h.gpu.dispatches == before + 1 and h.gpu.l2_dirty and h.gpu.caches_valid and not h.gpu.cu_caches_valid
  acq = AMDComputeQueue().acquire_mem().resolved()
  acq[-1] &= ~pm4.ACQ_GL2_INV
  h.pm4(acq)  # an acquire that keeps L2 after new host work (the doorbell): not enough for the next dispatch
  assert not h.gpu.caches_valid and h.gpu.cu_caches_valid
  with pytest.raises(PacketError, match="no ACQUIRE_MEM since the host"): _dispatch(h, acquire=False)
  for hi in (0xFFFFFF, 0xFFFFFFFF):  # full range: amdgpu's gfx_v11_0_emit_mem_sync writes 0xffffff, tinygrad all ones
    full = AMDComputeQueue().acquire_mem().resolved()
    full[3] = hi
    h.pm4(full)
  bad = AMDComputeQueue().acquire_mem().resolved()
  bad[2], bad[3] = 0x1000, 0x100  # a sized range: COHER_SIZE_HI's bits above 7:0 stay reserved
  with pytest.raises(PacketError, match=r"ACQUIRE_MEM dword 3: reserved bit\(s\) \[8\]"): h.pm4(bad)


def test_dispatch_after_dispatch_needs_only_the_cu_caches_invalidated(h):
  """Two dispatches in one submission: the first one's results are in the GPU's L2, which every CU reads through, so
  an ACQUIRE_MEM of GLK/GLV/GL1 (without GLI and GL2, what tinygrad's HCQ graph puts before each kernel) is enough;
  none at all is not (the CUs' caches may hold stale lines)."""
  code = h.iface.alloc(0x1000, host=True)
  ctypes.memmove(code.va_addr, struct.pack("<1I", *endpgm()), 4)

  class Prg:
    entry_addr, rsrc1, rsrc2, rsrc3 = code.va_addr, pm4.RSRC1_PRIV | 0x60AF0000, 0, 0
    def scratch(self): return None
    def user_data(self, args): return []
  cu_only = AMDComputeQueue().acquire_mem().resolved()
  cu_only[-1] &= ~(pm4.ACQ_GL2_INV | pm4.ACQ_GL2_WB | pm4.ACQ_GLI_INV_ALL)
  q = AMDComputeQueue()
  q.memory_barrier()
  first = q.exec(Prg(), 0, (1, 1, 1), (32, 1, 1)).resolved()
  second = AMDComputeQueue().exec(Prg(), 0, (1, 1, 1), (32, 1, 1)).resolved()
  before = h.gpu.dispatches
  h.pm4(first + cu_only + second)
  assert h.gpu.dispatches == before + 2
  with pytest.raises(PacketError, match="no ACQUIRE_MEM since the previous dispatch wrote memory"):
    h.pm4(first + second)


@pytest.mark.parametrize("bit, match", [(15, "CS_W32_EN = 0 launches wave64 waves"), (0, "COMPUTE_SHADER_EN = 0"),
                                        (1, "PARTIAL_TG_EN = 1 is not modelled"), (8, r"reserved bit\(s\) \[8\]"),
                                        (18, r"reserved bit\(s\) \[18\]")])
def test_dispatch_initiator_fields(h, bit, match):
  with pytest.raises(PacketError, match=match): _dispatch(h, initiator_xor=1 << bit)


def test_nops_are_skipped_whatever_their_body(h):
  sig = _signal(h)
  h.pm4([pm4.header(pm4.NOP, 3), 0xDEAD, 0xBEEF, 0xF00D] + AMDComputeQueue().release_mem(sig.addr, 4, 2).resolved())
  assert sig.value == 4
  h.sdma([sdma.header(sdma.OP_NOP, extra=2 << 16), 0xDEAD, 0xBEEF] + AMDCopyQueue().fence(sig.addr, 5).resolved())
  assert sig.value == 5  # an SDMA NOP with COUNT 2 carries two dwords


def test_scratch_needs_every_shader_engines_slots(h):
  """TMPRING_SIZE.WAVES counts one engine's wave slots: a buffer sized for WAVES waves in all (the old driver) is
  6x too small on a gfx1100 and the dispatch faults; sized engines x WAVES it runs."""
  waves, wave = 16 * 32, 256
  small = h.iface.alloc(waves * wave)
  tmpring = waves | (wave // 256) << 12
  with pytest.raises(GPUPageFault, match=r"scratch \(6 shader engines x 512 wave slots x 256 bytes\)"):
    _dispatch(h, rsrc2=1, tmpring=tmpring, scratch=small.va_addr)
  big = h.iface.alloc(6 * waves * wave)
  _dispatch(h, rsrc2=1, tmpring=tmpring, scratch=big.va_addr)


def test_a_faulting_shader_kills_its_dispatch_not_the_queue(h):
  """An instruction the emulator does not model stops the dispatch with a ShaderFault naming it; the command processor
  has moved past that DISPATCH_DIRECT, so the packets after it in the same submission (a signal) and later dispatches
  still run, as on a GPU that kills the faulting work (before, the queue retried the dispatch forever and every later
  test of a session failed)."""
  sig = _signal(h)
  with pytest.raises(ShaderFault, match=r"DISPATCH_DIRECT: the dispatch's waves stopped: UnsupportedInstruction: "
                                        r"unknown encoding 0xffffffff"):
    _dispatch(h, program=[0xFFFFFFFF] + endpgm(), tail=AMDComputeQueue().release_mem(sig.addr, 7, 2).resolved())
  assert not h.gpu.cu_caches_valid and sig.value == 0
  h.drv.process()  # the rest of the submission: the release after the killed dispatch
  assert sig.value == 7 and not h.mock_queue(PM4).pending()
  before = h.gpu.dispatches
  _dispatch(h)
  assert h.gpu.dispatches == before + 1


# ***** events: the interrupt after the mailbox write *****
def test_event_waits_need_the_mailbox_and_the_interrupt(h):
  ev = h.iface.create_event()
  sig = _signal(h)
  sig.event = ev
  slot = ctypes.c_uint64.from_address(ev.mailbox)
  assert slot.value == (1 << 64) - 1  # KFD set every slot of the event page to UNSIGNALED_EVENT_SLOT
  h.pm4(AMDComputeQueue().signal(sig, 1).resolved(), run=False)
  assert h.iface.wait_event(ev, 100) and sig.value == 1  # the GPU ran inside WAIT_EVENTS; its interrupt woke it
  assert slot.value == (1 << 64) - 1  # and KFD acknowledged the slot
  with pytest.raises(GPUHang, match="never raised an interrupt"): h.iface.wait_event(ev, 100)  # auto reset: consumed
  h.pm4(AMDComputeQueue().release_mem(sig.addr, 2, pm4.DATA_SEL_64, pm4.INT_SEL_AFTER_WRITE_CONFIRM,
                                      ev.event_id).resolved())  # an interrupt, but no mailbox write...
  assert not h.drv.events[ev.event_id].signaled  # ...so KFD finds no signaled slot
  assert not h.iface.wait_event(ev, 0)  # a zero timeout only polls
  h.pm4(AMDComputeQueue().release_mem(sig.addr, 3, pm4.DATA_SEL_64).release_mem(ev.mailbox, ev.event_id,
                                                                                pm4.DATA_SEL_32).resolved())
  assert slot.value == (0xFFFFFFFF << 32) | ev.event_id  # the mailbox written, no interrupt: nobody wakes up
  with pytest.raises(GPUHang, match="never raised an interrupt"): h.iface.wait_event(ev, 100)
  h.sdma(AMDCopyQueue().signal(sig, 4).resolved(), run=False)  # SDMA: fences, mailbox, TRAP
  assert h.iface.wait_event(ev, 100) and sig.value == 4 and slot.value == (1 << 64) - 1


def test_kfd_event_and_runtime_rules():
  h = Harness()
  with pytest.raises(KFDError, match="EBUSY"):  # the harness's first queue enabled the runtime; a second call fails
    h.queue(PM4)
    h.iface.ioctl("RUNTIME_ENABLE", mode_mask=kfd.RUNTIME_ENABLE_MODE_ENABLE_MASK)
  solo = Harness()
  solo.iface.proc.runtime_enabled = True  # pretend, so CREATE_QUEUE goes first: kfd_ioctl_create_queue allows it
  solo.queue(SDMA)                        # (tinygrad's driver calls RUNTIME_ENABLE with mode_mask 0: disabled)
  assert not solo.drv.runtime_enabled and len(solo.drv.queues) == 1
  fresh = Harness()
  fresh.queue(SDMA)
  late = Harness(drv=fresh.drv)  # another opener of the same KFD process: EBUSY means "already enabled"
  late.queue(PM4)
  with pytest.raises(KFDError, match="EEXIST"):
    fresh.drv.runtime_enabled = False
    fresh.iface.ioctl("RUNTIME_ENABLE", mode_mask=kfd.RUNTIME_ENABLE_MODE_ENABLE_MASK)
  small = Harness()
  page = small.iface.alloc(0x1000, host=True)
  with pytest.raises(KFDError, match="an event page of 0x1000 bytes; it needs 0x8000"):
    small.iface.ioctl("CREATE_EVENT", event_type=kfd.EVENT_SIGNAL, auto_reset=1, event_page_offset=page.meta.handle)
  with pytest.raises(KFDError, match=r"event type 9; the mock models signal \(0\), hardware exception \(3\)"):
    small.iface.ioctl("CREATE_EVENT", event_type=9)
  with pytest.raises(KFDError, match="unknown events"):
    small.iface.wait_event(kfd.KFDEvent(77, 0), 10)


def test_memory_rules(h):
  buf = h.iface.alloc(0x2000)
  assert buf.meta.handle >> 32 == h.iface.node.gpu_id  # handles carry the owner's gpu id
  with pytest.raises(KFDError, match="EBUSY"): h.iface.ioctl("FREE_MEMORY_OF_GPU", handle=buf.meta.handle)
  with pytest.raises(KFDError, match="overlaps"):
    h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=buf.va_addr, size=0x1000, gpu_id=h.iface.node.gpu_id,
                  flags=kfd.ALLOC_VRAM)
  with pytest.raises(KFDError, match="name no domain"):
    h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=0x7000_0000_0000, size=0x1000, gpu_id=h.iface.node.gpu_id,
                  flags=kfd.ALLOC_WRITABLE)
  with pytest.raises(KFDError, match="USERPTR without the user address"):
    h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=0x7000_0000_0000, size=0x1000, gpu_id=h.iface.node.gpu_id,
                  flags=kfd.ALLOC_USERPTR, mmap_offset=0)
  other = MockKFD()  # a GPU whose VM nobody acquired refuses memory
  with pytest.raises(KFDError, match="before its ACQUIRE_VM"):
    Harness(drv=other).iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=0x7000_0000_0000, size=0x1000,
                                   gpu_id=other.gpus[1].gpu_id, flags=kfd.ALLOC_VRAM)
  h.iface.free(buf)
  assert h.gpu.ranges.get(buf.va_addr) is None


# ***** SDMA *****
def test_bad_sdma_packets(h):
  sig = _signal(h)
  good = AMDCopyQueue().wait(sig, 0).resolved()
  with pytest.raises(PacketError, match=r"SDMA POLL_REGMEM dword 0: func = 7 is reserved"):
    h.sdma([good[0] | 7 << 28] + good[1:])
  with pytest.raises(PacketError, match=r"SDMA POLL_REGMEM dword 0: reserved bit\(s\) \[16\]"):
    h.sdma([good[0] | 1 << 16] + good[1:])
  with pytest.raises(PacketError, match="RETRY_COUNT 5: only 0xFFF"): h.sdma(good[:5] + [5 << 16 | 10])
  with pytest.raises(PacketError, match=r"SDMA op 11 \(CONST_FILL\) sub-op 0 .* is not modelled"):
    h.sdma([11, 0, 0, 0, 0])
  with pytest.raises(PacketError, match=r"SDMA TRAP dword 1: reserved bit\(s\) \[28\]"): h.sdma([6, 1 << 28])
  with pytest.raises(PacketError, match=r"dword 1: reserved bit\(s\) \[0, 1, 2\]"):
    h.sdma([sdma.header(sdma.OP_TIMESTAMP, sdma.SUBOP_TIMESTAMP_GET_GLOBAL), (sig.addr & 0xFFFFFFFF) | 7, 0])
  with pytest.raises(PacketError, match="not dword aligned"): h.sdma(AMDCopyQueue().fence(sig.addr + 2, 1).resolved())
  with pytest.raises(GPUPageFault, match="SDMA copy read of 16 bytes at 0x1000"):
    h.sdma(AMDCopyQueue().copy(sig.addr, 0x1000, 16).resolved())
  h.sdma(AMDCopyQueue().fence(sig.addr, 9).resolved())
  assert sig.value == 9


# ***** SDMA fences and the L2 *****
def test_the_drivers_sdma_fences_are_uncached_as_amdgpus():
  # sdma_v5_0/v5_2/v6_0/v7_0_ring_emit_fence: SDMA_PKT_FENCE_HEADER_MTYPE(0x3) (UC); v4_4_2 has no MTYPE field
  assert (AMDCopyQueue().fence(0x1000, 1).resolved()[0] >> 16) & 7 == 3
  assert AMDCopyQueue9().fence(0x1000, 1).resolved()[0] == sdma.OP_FENCE


def test_a_cached_sdma_fence_stays_in_l2_until_a_write_back(h):
  """A FENCE with MTYPE 0 is not refused by the SDMA engine: the write goes through L2, where the GPU's own polls see
  it and the host does not, until an L2 write-back (the old driver's signals were late or never seen)."""
  sig, done = _signal(h), _signal(h)
  h.sdma([sdma.header(sdma.OP_FENCE), sig.addr & 0xFFFFFFFF, sig.addr >> 32, 7])
  assert sig.value == 0 and h.gpu.l2_lines == {sig.addr: 7}
  h.sdma(AMDCopyQueue().wait(sig, 7).fence(done.addr, 1).resolved())  # the GPU reads through L2: the poll passes
  assert done.value == 1 and sig.value == 0
  h.pm4(AMDComputeQueue().acquire_mem().resolved())  # GCR GL2_WB: the line reaches memory
  assert sig.value == 7 and not h.gpu.l2_lines
  h.sdma(AMDCopyQueue().fence(sig.addr, 8).resolved())  # the driver's UC fence is visible at once
  assert sig.value == 8


def test_gfx942s_sdma_fence_has_no_mtype_field():
  h = Harness(drv=MockKFD(("gfx942",)))
  sig = _signal(h)
  with pytest.raises(PacketError, match=r"SDMA FENCE dword 0: reserved bit\(s\) \[16, 17\]"):
    h.sdma(AMDCopyQueue().fence(sig.addr, 1).resolved())  # the SDMA v6 header
  h.sdma(AMDCopyQueue9().fence(sig.addr, 2).resolved())
  assert sig.value == 2


# ***** CREATE_QUEUE's buffers (kfd_queue.c kfd_queue_acquire_buffers / kfd_queue_buffer_get) *****
def _queue_args(h: Harness, ring_alloc: int = 0x1000, ring_size: int = 0x1000, ptr_alloc: int = 0x1000,
                ptr_offset: int = 0) -> dict:
  ring, ptrs = h.iface.alloc(ring_alloc, host=True), h.iface.alloc(ptr_alloc, host=True)
  return dict(ring_base_address=ring.va_addr, ring_size=ring_size, queue_type=SDMA, queue_percentage=100,
              queue_priority=7, read_pointer_address=ptrs.va_addr + ptr_offset,
              write_pointer_address=ptrs.va_addr + ptr_offset + 8)


@pytest.mark.parametrize("kw, match", [
  (dict(ring_alloc=0x2000), "the ring BO at .* is 0x2000 bytes; KFD wants exactly 0x1000"),
  (dict(ptr_alloc=0x2000), "the write pointer BO at .* is 0x2000 bytes; KFD wants exactly 0x1000"),
  (dict(ptr_alloc=0x2000, ptr_offset=0x1000), "the write pointer at .* is not in the first page of a BO")])
def test_queue_buffers_must_be_whole_bos(h, kw, match):
  """kfd_queue_buffer_get: the ring is a BO of exactly ring_size bytes, each pointer a one-page BO (its first page)."""
  with pytest.raises(KFDError, match=match): h.iface.create_queue(**_queue_args(h, **kw))
  h.iface.create_queue(**_queue_args(h))  # the same with whole BOs


def test_compute_queue_eop_and_cwsr_bos_follow_kfd():
  """The EOP buffer is a BO of exactly eop_buffer_size; ctx_save_restore_size may exceed the node's cwsr_size (KFD
  refuses only less), the CWSR BO then being ALIGN((that + debug_memory_size) * num_xcc, PAGE)."""
  h = Harness()
  cw = h.iface.node.cwsr
  base = _queue_args(h)
  base.update(queue_type=PM4, ctl_stack_size=cw.ctl_stack_size)
  def args(eop_alloc: int, ctx_size: int, ctx_alloc: int) -> dict:
    eop, ctx = h.iface.alloc(eop_alloc), h.iface.alloc(ctx_alloc, host=True)
    return {**base, "eop_buffer_address": eop.va_addr, "eop_buffer_size": cw.eop_buffer_size,
            "ctx_save_restore_address": ctx.va_addr, "ctx_save_restore_size": ctx_size}
  bigger = cw.ctx_save_restore_size + 0x3000
  want = (bigger + cw.debug_memory_size + 0xFFF) // 0x1000 * 0x1000  # one XCC
  assert kfd.cwsr_alloc_size(bigger, cw) == want == cw.alloc_size + 0x3000
  with pytest.raises(KFDError, match="the EOP buffer BO at .* is 0x2000 bytes; KFD wants exactly 0x1000"):
    h.iface.create_queue(**args(0x2000, cw.ctx_save_restore_size, cw.alloc_size))
  with pytest.raises(KFDError, match="ctx_save_restore_size .* is less than the node's cwsr_size"):
    h.iface.create_queue(**args(0x1000, cw.ctx_save_restore_size - 0x1000, cw.alloc_size))
  with pytest.raises(KFDError, match=f"need {want:#x}"):
    h.iface.create_queue(**args(0x1000, bigger, cw.alloc_size))  # the BO sized for the node's cwsr_size
  q = h.iface.create_queue(**args(0x1000, bigger, want))
  assert h.drv.queues[q.queue_id].cwsr


def test_doorbell_mmap_is_the_whole_slice(h):
  """kfd_doorbell_mmap maps the process's whole doorbell slice (8 KiB on SOC15) or nothing (EINVAL)."""
  q = h.iface.create_queue(**_queue_args(h))
  off = q.doorbell_offset & ~0x1FFF
  for size in (0x1000, 0x4000):
    with pytest.raises(OSError, match="whole 0x2000-byte process doorbell slice") as e:
      h.iface.kfd.mmap(0, size, 3, 1, off)
    assert e.value.errno == 22
  assert h.iface.kfd.mmap(0, 0x2000, 3, 1, off)
