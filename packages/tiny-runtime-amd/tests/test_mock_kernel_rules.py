"""What tinygrad 0.14's proven AMD driver does that our mock used to refuse, each decided from the kernel sources
(issue #32; tests/test_amd_proven.py runs that driver end to end). Every case here failed before the mock was fixed.

- CREATE_EVENT of HW_EXCEPTION (3) / MEMORY (8) events: kfd_events.c kfd_event_create's default case
  (create_other_event), ids from KFD_FIRST_NONSIGNAL_EVENT_ID (0x80000000, kfd_events.h).
- CREATE_QUEUE in a process that never enabled the runtime: kfd_ioctl_create_queue has no such check.
- ALLOC_MEMORY_OF_GPU of a size that is not a page multiple: amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu rounds it up
  (aligned_size = PAGE_ALIGN(size)).
- mmap of a VRAM allocation without PUBLIC through the render node: KFD no longer gives such BOs NO_CPU_ACCESS
  ("drm/amdkfd: Allow CPU access for all VRAM BOs"), so amdgpu_gem_object_mmap maps them; userptr BOs it refuses.
- the render node's ip_discovery sysfs (amdgpu_discovery.c): GC/SDMA/NBIO versions.
- the HDP flush (WAIT_REG_MEM on GPU_HDP_FLUSH_REQ/DONE), COMPUTE_RESTART_X/Y/Z = 0, COMPUTE_PIPELINESTAT_ENABLE /
  PERFCOUNT_ENABLE, and ACQUIRE_MEM's full-range COHER_SIZE_HI (amdgpu itself writes 0xffffff there).
- a dispatch after an SDMA copy on gfx11 with only the CU caches invalidated (SDMA v6 is a GL2 client), with the
  doorbells the host rang before the barrier's submission counted before it.
- CREATE_QUEUE with a ring smaller than 1024 bytes (a power of 2, or 0): kfd_chardev.c set_queue_properties_from_user
  clamps it to KFD_MIN_QUEUE_RING_SIZE; only a size that is not a power of 2 is EINVAL.
- an event page in VRAM: kfd_kmap_event_page -> amdgpu_amdkfd_gpuvm_map_gtt_bo_to_kernel pins any BO but a userptr
  one in GTT (a VRAM BO moves there), so only userptr pages are EINVAL.
- ALLOC_MEMORY_OF_GPU naming several domains: amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu takes VRAM, else GTT, else
  USERPTR, so VRAM | GTT is a VRAM BO, not EINVAL.
- FREE_MEMORY_OF_GPU of the event page is EPERM ("Free signal BO is not allowed", checked before the EBUSY of a BO
  that is still mapped).
- a dispatch on one gfx1100 after another's SDMA copy into a COHERENT / UNCACHED BO with only the CU caches
  invalidated: gmc_v11_0.c gmc_v11_0_get_vm_pte maps those BOs MTYPE_UC (never in GL2); any other BO is MTYPE_NC in
  the reader's GL2, still refused.
- the same on gfx942 for a copy into the GPU's own VRAM or into system memory: gmc_v9_0.c
  gmc_v9_0_get_coherence_flags (IP 9.4.3, dGPU) maps local VRAM MTYPE_RW and system memory MTYPE_UC, and
  mmhub_v1_8.c mmhub_v1_8_init_snoop_override_regs makes SDMA writes probe-invalidate RW lines. Still refused, as the
  hardware has the hazard: a GPU reading a peer GPU's VRAM (MTYPE_NC, not probed) after an SDMA write into it with
  its L2 (TC) not invalidated.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import struct

import pytest
from mock_harness import Harness

from tiny_runtime_amd import kfd, pm4
from tiny_runtime_amd.emu.encode import endpgm
from tiny_runtime_amd.kfd import KFDError
from tiny_runtime_amd.mock.driver import PacketError
from tiny_runtime_amd.pm4 import AMDComputeQueue
from tiny_runtime_amd.sdma import AMDCopyQueue
from tiny_uop.hcq import HCQSignal

PM4, SDMA = kfd.QUEUE_TYPE_COMPUTE, kfd.QUEUE_TYPE_SDMA


@pytest.fixture
def h() -> Harness: return Harness()


def test_hw_exception_and_memory_events_exist_and_can_be_waited_on(h):
  sig_ev = h.iface.create_event()  # the event page and a signal event
  ids = []
  for etype in (3, 8):
    ev = h.iface.ioctl("CREATE_EVENT", event_type=etype, auto_reset=0)
    assert ev.event_id >= 0x80000000 and ev.event_trigger_data == ev.event_id
    ids.append(ev.event_id)
  assert ids[0] != ids[1]
  data = (ctypes.c_uint8 * (48 * 2))()  # two struct kfd_event_data, event_id at byte 40
  for i, eid in enumerate(ids): ctypes.c_uint32.from_address(ctypes.addressof(data) + 48 * i + 40).value = eid
  out = h.iface.ioctl("WAIT_EVENTS", events_ptr=ctypes.addressof(data), num_events=2, wait_for_all=0, timeout=0)
  assert out.wait_result == kfd.WAIT_RESULT_TIMEOUT  # nothing faulted
  ctypes.c_uint64.from_address(sig_ev.mailbox).value = sig_ev.event_id  # the signal event's slot written
  h.drv.interrupt(h.gpu, 0xFFFF, 32)  # an unknown context id: the exhaustive search, which skips slotless events
  assert h.drv.events[sig_ev.event_id].signaled and not any(h.drv.events[i].signaled for i in ids)


@pytest.mark.parametrize("flags, ok", [(kfd.ALLOC_VRAM, True), (kfd.ALLOC_GTT, True), (kfd.ALLOC_USERPTR, False)],
                         ids=["VRAM", "GTT", "USERPTR"])
def test_event_page_may_be_any_bo_but_userptr(h, flags, ok):
  size = kfd.SIGNAL_EVENT_LIMIT * 8
  va = h.iface.kfd.anon_mmap(0, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  page = h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va, size=size, gpu_id=h.iface.node.gpu_id,
                       flags=flags | kfd.ALLOC_WRITABLE, mmap_offset=va)
  args = dict(event_type=kfd.EVENT_SIGNAL, auto_reset=1, node_id=h.iface.node.node, event_page_offset=page.handle)
  if not ok:
    with pytest.raises(KFDError, match="the event page is a userptr allocation"): h.iface.ioctl("CREATE_EVENT", **args)
    return
  ev = h.iface.ioctl("CREATE_EVENT", **args)
  assert h.drv.event_page is h.drv.allocs[page.handle]
  assert ctypes.c_uint64.from_address(va + 8 * ev.event_slot_index).value == (1 << 64) - 1  # UNSIGNALED_EVENT_SLOT


def test_several_domains_pick_vram_first_and_the_event_page_is_never_freed(h):
  va = h.iface.kfd.anon_mmap(0, 0x1000, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  a = h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va, size=0x1000, gpu_id=h.iface.node.gpu_id,
                    flags=kfd.ALLOC_VRAM | kfd.ALLOC_GTT | kfd.ALLOC_WRITABLE)
  m = h.drv.allocs[a.handle]
  assert m.flags & (kfd.ALLOC_VRAM | kfd.ALLOC_GTT) == kfd.ALLOC_VRAM and not m.host_visible
  h.iface.create_event()  # the event page, mapped into the GPU
  page = h.iface.proc.event_page
  with pytest.raises(KFDError, match="EPERM"): h.iface.ioctl("FREE_MEMORY_OF_GPU", handle=page.meta.handle)


def test_queues_without_runtime_enable(h):
  h.iface.proc.runtime_enabled = True  # the harness's driver would enable it; pretend it did not
  h.queue(SDMA)
  h.queue(PM4)
  assert not h.drv.runtime_enabled and len(h.drv.queues) == 2


@pytest.mark.parametrize("size, want", [(0, 1024), (256, 1024), (1024, 1024), (0x4000, 0x4000), (3000, None)])
def test_ring_sizes_below_the_minimum_are_clamped(h, size, want):
  ring, ptrs = h.iface.alloc(0x4000, host=True), h.iface.alloc(0x1000, host=True)
  args = dict(ring_base_address=ring.va_addr, ring_size=size, queue_type=SDMA, queue_percentage=100, queue_priority=7,
              read_pointer_address=ptrs.va_addr, write_pointer_address=ptrs.va_addr + 8)
  if want is None:
    with pytest.raises(KFDError, match="ring size 3000 is not a power of 2"): h.iface.create_queue(**args)
    return
  q = h.iface.create_queue(**args)
  assert q.ring_size == want and h.drv.queues[q.queue_id].ring_size == want


def test_allocation_sizes_round_up_to_pages(h):
  gpu = h.iface.node.gpu_id
  va = h.iface.kfd.anon_mmap(0, 0x2000, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  flags = kfd.ALLOC_VRAM | kfd.ALLOC_WRITABLE
  a = h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va, size=0x100, gpu_id=gpu, flags=flags)
  assert h.drv.allocs[a.handle].size == 0x1000
  b = h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va + 0x1000, size=0x1, gpu_id=gpu, flags=flags)  # the next page
  assert h.drv.allocs[b.handle].size == 0x1000
  with pytest.raises(KFDError, match="the va must be page aligned and the size nonzero"):
    h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va + 0x10, size=0x1000, gpu_id=gpu, flags=flags)


def test_render_node_maps_plain_vram_but_not_userptr(h):
  vram = h.iface.alloc(0x1000)  # VRAM without PUBLIC
  m = h.drv.by_va[vram.va_addr]
  assert not m.flags & kfd.ALLOC_PUBLIC
  render = h.fio(f"/dev/dri/renderD{h.gpu.render_minor}")
  prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | 0x10  # MAP_FIXED
  assert render.mmap(m.va, m.size, prot, flags, m.mmap_offset) == m.va
  cpu = h.iface.kfd.anon_mmap(0, 0x1000, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  a = h.iface.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=cpu, size=0x1000, gpu_id=h.iface.node.gpu_id,
                    flags=kfd.ALLOC_USERPTR | kfd.ALLOC_WRITABLE, mmap_offset=cpu)
  u = h.drv.allocs[a.handle]
  with pytest.raises(OSError, match="a userptr allocation is host memory") as e:
    render.mmap(u.va, u.size, prot, flags, u.mmap_offset)
  assert e.value.errno == errno.EPERM


@pytest.mark.parametrize("arch, versions", [("gfx1100", {"11": (11, 0, 0), "42": (6, 0, 0), "108": (4, 3, 0)}),
                                            ("gfx942", {"11": (9, 4, 3), "42": (4, 4, 2), "108": (7, 9, 0)})])
def test_ip_discovery_sysfs(arch, versions):
  from tiny_runtime_amd.mock.driver import MockKFD
  drv = MockKFD((arch,))
  base = f"/sys/class/drm/renderD{drv.gpus[0].render_minor}/device/ip_discovery/die/0"
  got = {hw: tuple(int(drv.files[f"{base}/{hw}/0/{p}"]) for p in ("major", "minor", "revision")) for hw in versions}
  assert got == versions


def test_hdp_flush_runs_and_other_register_waits_are_refused(h):
  sig = HCQSignal(h.iface.alloc(0x1000, host=True, uncached=True).va_addr, 0)
  hdp = [pm4.header(pm4.WAIT_REG_MEM, 6), 3 | 1 << 6, 0xE26, 0xE27, 0xFFFFFFFF, 0xFFFFFFFF, 4]  # EQ, WR_WAIT_WR_REG
  h.pm4(hdp + AMDComputeQueue().release_mem(sig.addr, 5, pm4.DATA_SEL_32 << 29 >> 29).resolved())
  assert sig.value == 5
  other = list(hdp)
  other[2] = 0xE28
  with pytest.raises(PacketError, match="only the HDP flush is modelled"): h.pm4(other)


def _code(h: Harness) -> int:
  code = h.iface.alloc(0x1000, host=True)
  words = endpgm()
  ctypes.memmove(code.va_addr, struct.pack(f"<{len(words)}I", *words), 4 * len(words))
  return code.va_addr


class _Prg:
  rsrc1, rsrc2, rsrc3 = pm4.RSRC1_PRIV | 0x60AF0000, 0, 0
  def __init__(self, entry: int): self.entry_addr = entry
  def scratch(self): return None
  def user_data(self, args): return []


def test_restart_and_counter_enable_registers(h):
  prg = _Prg(_code(h))
  q = AMDComputeQueue().memory_barrier()
  q.set_sh_reg(0xB828, 0, 0).set_sh_reg(0xB86C, 0, 0, 0)  # PIPELINESTAT/PERFCOUNT_ENABLE, RESTART_X/Y/Z
  before = h.gpu.dispatches
  h.pm4(q.exec(prg, 0, (1, 1, 1), (32, 1, 1)).resolved())
  assert h.gpu.dispatches == before + 1
  q = AMDComputeQueue().memory_barrier().set_sh_reg(0xB870, 3)
  with pytest.raises(PacketError, match=r"COMPUTE_RESTART_X/Y/Z = \[0, 3, 0\]: resuming a preempted dispatch"):
    h.pm4(q.exec(prg, 0, (1, 1, 1), (32, 1, 1)).resolved())


def test_dispatch_after_an_sdma_copy_needs_only_the_cu_caches_on_gfx11(h):
  """tinygrad's graph: a barrier, a wait for the copy's signal, then per kernel an ACQUIRE_MEM without GLI/GL2. The
  copy goes through the GPU's L2, so the kernel reads it; the SDMA doorbell the host rang before the compute one
  counts as before the barrier even when the mock looks at the compute queue first."""
  prg = _Prg(_code(h))
  sig = HCQSignal(h.iface.alloc(0x1000, host=True, uncached=True).va_addr, 0)
  src, dst = h.iface.alloc(0x1000), h.iface.alloc(0x1000)
  ctypes.memset(src.va_addr, 7, 0x100)
  h.queue(PM4)  # the compute queue first in the mock's queue order
  cu_only = AMDComputeQueue().acquire_mem().resolved()
  cu_only[-1] &= ~(pm4.ACQ_GL2_INV | pm4.ACQ_GL2_WB | pm4.ACQ_GLI_INV_ALL)
  h.sdma(AMDCopyQueue().copy(dst.va_addr, src.va_addr, 0x100).fence(sig.addr, 1).resolved(), run=False)
  compute = AMDComputeQueue().memory_barrier().wait_reg_mem(sig.addr, 1).resolved()
  h.pm4(compute + cu_only + AMDComputeQueue().exec(prg, 0, (1, 1, 1), (32, 1, 1)).resolved(), run=False)
  before = h.gpu.dispatches
  h.drv.process()
  assert h.gpu.dispatches == before + 1 and ctypes.string_at(dst.va_addr, 4) == b"\x07" * 4


def test_gfx9_full_range_acquire_and_write_back_only_fence():
  """gfx942: ACQUIRE_MEM with COHER_SIZE_HI 0xffffffff (tinygrad; the field is 24 bits) is the whole address space;
  a RELEASE_MEM with EOP TC_WB | TC_NC (amdgpu's write-back-only fence, tinygrad's signal) writes L2 back, so it may
  write a host-visible signal after a dispatch; without TC_WB it may not."""
  from tiny_runtime_amd.mock.driver import MockKFD
  from tiny_runtime_amd.pm4 import EOP_TC_NC_ACTION_EN, EOP_TC_WB_ACTION_EN, AMDComputeQueue9
  h = Harness(drv=MockKFD(("gfx942",)))
  acq = AMDComputeQueue9().acquire_mem().resolved()
  acq[3] = 0xFFFFFFFF
  h.pm4(acq)
  assert h.gpu.caches_valid and h.gpu.cu_caches_valid
  acq[2], acq[3] = 0x1000, 0x1000000  # a sized range: bits above the 24-bit field stay reserved
  with pytest.raises(PacketError, match=r"ACQUIRE_MEM dword 3: reserved bit\(s\) \[24\]"): h.pm4(acq)
  sig = HCQSignal(h.iface.alloc(0x1000, host=True, uncached=True).va_addr, 0)
  rel = AMDComputeQueue9().release_mem(sig.addr, 9, pm4.DATA_SEL_32).resolved()
  rel[1] = (rel[1] & 0xFFF) | EOP_TC_WB_ACTION_EN | EOP_TC_NC_ACTION_EN  # the event, write-back-only actions
  h.gpu.l2_dirty = True  # as after a dispatch
  h.pm4(rel)
  assert sig.value == 9 and not h.gpu.l2_dirty
  rel[1] &= ~EOP_TC_WB_ACTION_EN
  h.gpu.l2_dirty = True
  with pytest.raises(PacketError, match="after a dispatch without an L2 write-back"): h.pm4(rel)


# ***** gfx942: which SDMA writes leave a GPU's L2 coherent (mock/gfx9.py's docstring has the kernel sources) *****
GFX9_ENDPGM = 0xBF810000  # s_endpgm in the GFX9 (CDNA3 ISA) SOPP encoding
COHER_CU_ONLY9 = pm4.COHER_SH_KCACHE_ACTION_ENA | pm4.COHER_TCL1_ACTION_ENA  # tinygrad's acquire_mem(gli=0, gl2=0)


class _Prg9(_Prg):
  rsrc1 = 0x002F0000  # no PRIV on gfx9 (a KFD queue's waves run unprivileged)


def _gfx9_code(h: Harness) -> int:
  code = h.iface.alloc(0x1000, host=True)
  ctypes.memmove(code.va_addr, struct.pack("<2I", GFX9_ENDPGM, 0), 8)
  return code.va_addr


def _gfx9_copy_then_dispatch(copier: Harness, reader: Harness, dst, full_acquire: bool) -> None:
  """On `copier`'s SDMA: copy 0x100 bytes of 7s into `dst` and signal; on `reader`'s PM4 queue: a full barrier, a wait
  for that signal, an ACQUIRE_MEM (the CU caches only, or also TC with write-back), a dispatch."""
  from tiny_runtime_amd.pm4 import AMDComputeQueue9
  from tiny_runtime_amd.sdma import AMDCopyQueue9
  prg = _Prg9(_gfx9_code(reader))
  sig_buf, src = copier.iface.alloc(0x1000, host=True, uncached=True), copier.iface.alloc(0x1000)
  reader.iface.map(sig_buf)
  sig = HCQSignal(sig_buf.va_addr, 0)
  ctypes.memset(src.va_addr, 7, 0x100)
  ctypes.memset(dst.va_addr, 0, 0x100)
  reader.queue(PM4)
  acq = AMDComputeQueue9().acquire_mem().resolved()
  if not full_acquire: acq[1] = COHER_CU_ONLY9
  copier.sdma(AMDCopyQueue9().copy(dst.va_addr, src.va_addr, 0x100).fence(sig.addr, 1).resolved(), run=False)
  q = AMDComputeQueue9().memory_barrier().wait_reg_mem(sig.addr, 1).resolved()
  reader.pm4(q + acq + AMDComputeQueue9().exec(prg, 0, (1, 1, 1), (64, 1, 1)).resolved(), run=False)
  before = reader.gpu.dispatches
  reader.drv.process()
  assert reader.gpu.dispatches == before + 1
  assert ctypes.string_at(dst.va_addr, 0x100) == bytes([7]) * 0x100  # the SDMA engine's bytes, what numpy would copy


@pytest.mark.parametrize("host, uncached, mtype", [(False, False, "RW"), (True, False, "UC"), (True, True, "UC")],
                         ids=["own VRAM", "GTT", "uncached GTT"])
def test_gfx942_dispatch_after_an_sdma_copy_into_coherent_memory_needs_only_the_cu_caches(host, uncached, mtype):
  """tinygrad's HCQ graph on MI300: its buffers are VRAM without UNCACHED (MTYPE_RW in their own GPU's VM), its copy
  staging is host memory (MTYPE_UC); between the copy and the kernel it invalidates only K$ and TCL1."""
  from tiny_runtime_amd.mock.driver import MockKFD
  h = Harness(drv=MockKFD(("gfx942",)))
  dst = h.iface.alloc(0x1000, host=host, uncached=uncached)
  assert h.gpu.l2_mtype(h.drv.alloc_at(dst.va_addr)) == mtype
  _gfx9_copy_then_dispatch(h, h, dst, full_acquire=False)


def test_gfx942_peer_vram_written_by_sdma_is_stale_in_the_readers_l2():
  """A peer's VRAM is MTYPE_NC in the reading GPU's VM: cached in its L2 and not probe-invalidated, so after an SDMA
  write into it a dispatch there must invalidate TC; the owner (MTYPE_RW) needs only its CU caches invalidated."""
  from tiny_runtime_amd.mock.driver import MockKFD
  drv = MockKFD(("gfx942", "gfx942"))
  h0, h1 = Harness(0, drv), Harness(1, drv)
  dst = h0.iface.alloc(0x1000)  # GPU 0's VRAM
  h1.iface.map(dst)
  assert (h0.gpu.l2_mtype(drv.alloc_at(dst.va_addr)), h1.gpu.l2_mtype(drv.alloc_at(dst.va_addr))) == ("RW", "NC")
  with pytest.raises(PacketError, match="a dispatch with no ACQUIRE_MEM since the host or SDMA last wrote memory"):
    _gfx9_copy_then_dispatch(h0, h1, dst, full_acquire=False)
  _gfx9_copy_then_dispatch(h0, h1, dst, full_acquire=True)    # TC invalidated (and written back): accepted
  _gfx9_copy_then_dispatch(h1, h0, dst, full_acquire=False)   # the owner, RW lines probed by GPU 1's SDMA write


@pytest.mark.parametrize("uncached, ok", [(True, True), (False, False)], ids=["COHERENT|UNCACHED (MTYPE_UC)", "NC"])
def test_gfx11_peer_gl2_after_an_sdma_copy_follows_the_mtype(uncached, ok):
  """GPU 0's SDMA writes a host buffer mapped into GPU 1 too; GPU 1 then dispatches with only its CU caches
  invalidated: fine for an MTYPE_UC BO, a stale-GL2 hazard for an MTYPE_NC one."""
  from tiny_runtime_amd.mock.driver import MockKFD
  drv = MockKFD(("gfx1100", "gfx1100"))
  h0, h1 = Harness(0, drv), Harness(1, drv)
  prg = _Prg(_code(h1))
  sig_buf, src = h0.iface.alloc(0x1000, host=True, uncached=True), h0.iface.alloc(0x1000)
  dst = h0.iface.alloc(0x1000, host=True, uncached=uncached)
  for b in (sig_buf, dst): h1.iface.map(b)
  sig = HCQSignal(sig_buf.va_addr, 0)
  ctypes.memset(src.va_addr, 9, 0x100)
  h1.queue(PM4)
  cu_only = AMDComputeQueue().acquire_mem().resolved()
  cu_only[-1] &= ~(pm4.ACQ_GL2_INV | pm4.ACQ_GL2_WB | pm4.ACQ_GLI_INV_ALL)
  h0.sdma(AMDCopyQueue().copy(dst.va_addr, src.va_addr, 0x100).fence(sig.addr, 1).resolved(), run=False)
  q = AMDComputeQueue().memory_barrier().wait_reg_mem(sig.addr, 1).resolved()
  h1.pm4(q + cu_only + AMDComputeQueue().exec(prg, 0, (1, 1, 1), (32, 1, 1)).resolved(), run=False)
  if not ok:
    with pytest.raises(PacketError, match="a dispatch with no ACQUIRE_MEM since the host or SDMA last wrote memory"):
      drv.process()
    return
  before = h1.gpu.dispatches
  drv.process()
  assert h1.gpu.dispatches == before + 1 and ctypes.string_at(dst.va_addr, 0x100) == bytes([9]) * 0x100


def test_gfx942_mtype_table():
  """gmc_v9_0_get_coherence_flags, IP 9.4.3, dGPU, per allocation kind and mapping GPU (the owner / a peer)."""
  from tiny_runtime_amd.mock.driver import MockAlloc, MockKFD
  drv = MockKFD(("gfx942", "gfx942"))
  g0, g1 = drv.gpus
  want = {kfd.ALLOC_VRAM: ("RW", "NC"), kfd.ALLOC_VRAM | kfd.ALLOC_EXT_COHERENT: ("CC", "UC"),
          kfd.ALLOC_VRAM | kfd.ALLOC_UNCACHED: ("UC", "UC"), kfd.ALLOC_GTT: ("UC", "UC"),
          kfd.ALLOC_USERPTR: ("UC", "UC")}
  for flags, mtypes in want.items():
    a = MockAlloc(1, 0x1000, 0x1000, flags, g0, 0)
    assert (g0.l2_mtype(a), g1.l2_mtype(a)) == mtypes, hex(flags)
