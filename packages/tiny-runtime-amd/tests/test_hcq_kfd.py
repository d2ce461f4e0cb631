"""The HCQ layer (tiny_uop.hcq), the KFD ioctl layer (struct layouts, ioctl numbers, KFDIface over the mock) and
the PM4/SDMA packet builders' errors (their numbers are checked against tinygrad's bindings in test_oracle.py)."""
from __future__ import annotations

import ctypes
import os

import pytest

from tiny_runtime_amd import kfd, pm4, sdma
from tiny_runtime_amd.mock.driver import GPU_ID, MockFileIO
from tiny_uop.hcq import MAP_PRIVATE, PROT_READ, PROT_WRITE, FileIOInterface, HCQSignal, HCQVar, HWQueue


# ***** tiny_uop.hcq *****
def test_hcqvar_resolve_and_derived_values():
  v = HCQVar("addr")
  vals = {"addr": 0x1_2345_6780}
  assert v.resolve(vals) == 0x1_2345_6780 and (v + 0x10).lo.resolve(vals) == 0x2345_6790 and v.hi.resolve(vals) == 1
  assert (v + (2**64 - 1)).resolve({"addr": 1}) == 0  # 64-bit wraparound
  with pytest.raises(KeyError, match="addr"): v.resolve({"other": 1})


def test_hwqueue_records_symbols_and_resubmits_with_new_values():
  sent = []
  class Q(HWQueue):
    def _submit(self, dev, dwords): sent.append(dwords)
  a = HCQVar("a")
  q = Q().q(1, a.lo, a.hi, (a + 4).lo)
  assert q.symbols() == {"a"} and len(q) == 4
  q.submit(None, {"a": 0x5_0000_0000})
  q.submit(None, {"a": 8})
  assert sent == [[1, 0, 5, 4], [1, 8, 0, 12]]
  with pytest.raises(ValueError, match="32 bits"): Q().q(a).submit(None, {"a": 2**33})


def test_signal_value_timestamp_and_timeout():
  mem = (ctypes.c_uint64 * 2)()
  s = HCQSignal(ctypes.addressof(mem), 5, timestamp_divider=100.0)
  assert mem[0] == 5 and s.value == 5
  mem[1] = 2500
  assert s.timestamp == 25.0
  calls = []
  s.progress = lambda: (calls.append(1), setattr(s, "value", 9))
  s.wait(9)
  assert calls and s.value == 9
  s.progress = None
  with pytest.raises(TimeoutError, match="waiting for 10"): s.wait(10, timeout_ms=10)

  class Sleepy(HCQSignal):  # a device with interrupts overrides _idle (AMD: KFD WAIT_EVENTS) instead of spinning
    def _idle(self, waited_s, left_s):
      idles.append((waited_s, left_s))
      if len(idles) == 3: self.value = 12
  idles: list[tuple[float, float]] = []
  Sleepy(ctypes.addressof(mem)).wait(12, timeout_ms=5000)
  assert len(idles) == 3 and all(0 <= w < 5 and 0 < left <= 5 for w, left in idles) and idles[0][0] <= idles[2][0]


def test_fileio_reads_files_and_maps_memory(tmp_path):
  p = tmp_path / "props"
  p.write_text("simd_count 8\n")
  assert FileIOInterface(str(p)).read() == "simd_count 8\n"
  addr = FileIOInterface.anon_mmap(0, 0x2000, PROT_READ | PROT_WRITE, MAP_PRIVATE)
  ctypes.c_uint32.from_address(addr + 0x1000).value = 77
  assert ctypes.c_uint32.from_address(addr + 0x1000).value == 77
  FileIOInterface().munmap(addr, 0x2000)


def test_fileio_ioctl_fills_the_argument_buffer():
  import termios
  r, w = os.pipe()
  try:
    os.write(w, b"12345")
    arg = bytearray(4)
    FileIOInterface(fd=r).ioctl(termios.FIONREAD, arg)  # bytes waiting in the pipe, written into arg by the kernel
    assert int.from_bytes(arg, "little") == 5
  finally:
    os.close(r)
    os.close(w)


# ***** kfd.py (numbers and layouts: test_oracle.py) *****
def test_topology_properties_and_arch():
  assert kfd.parse_properties("a 1\nb -2\nname gfx\n") == {"a": 1, "b": -2}
  n = kfd.GPUNode(1, 7, 110000, 192, 2, 64, 128)
  assert (n.arch, n.cu_count) == ("gfx1100", 96)
  assert kfd.GPUNode(1, 7, 90010, 8, 2, 64, 128).arch == "gfx90a"
  assert kfd.GPUNode(1, 7, 110501, 8, 2, 64, 128).arch == "gfx1151"


def test_cwsr_sizes_for_known_gpus():
  # gfx1100 (RX 7900 XTX): 96 CUs, 32 waves each; per CU 0x60000 VGPR + 0x4000 SGPR + 0x10000 LDS + 0x1000 HWREG
  props = {"gfx_target_version": 110000, "simd_count": 192, "simd_per_cu": 2, "lds_size_in_kb": 64,
           "array_count": 12, "simd_arrays_per_engine": 2}
  cw = kfd.cwsr_sizes(props)
  assert cw.ctl_stack_size == 0xA000  # 40 + 3072 * 12 + 8 = 36912 -> page aligned
  assert cw.ctx_save_restore_size == 0xA000 + 96 * 0x75000 == 0x2BEA000
  assert cw.debug_memory_size == 3072 * 32 == 0x18000
  assert cw.alloc_size == 0x2C02000 and cw.eop_buffer_size == 4096 and cw.num_xcc == 1
  assert kfd.GPUNode(1, 7, 110000, 192, 2, 64, 128, tuple(props.items())).cwsr == cw
  # gfx1030 (RX 6900 XT): 80 CUs, 0x40000 VGPRs per CU, the control stack clamped to gfx10's 0x7000
  cw = kfd.cwsr_sizes({**props, "gfx_target_version": 100300, "simd_count": 160})
  assert cw.ctl_stack_size == 0x7000 and cw.ctx_save_restore_size == 0x7000 + 80 * 0x55000
  # gfx90a (MI210, 104 CUs of 4 SIMDs): 8 bytes per wave, waves min(40 per CU, arrays / arrays per engine * 512)
  cw = kfd.cwsr_sizes({"gfx_target_version": 90010, "simd_count": 416, "simd_per_cu": 4, "array_count": 8,
                       "simd_arrays_per_engine": 1})
  assert cw.ctl_stack_size == 0x9000 and cw.debug_memory_size == 4096 * 32  # min(4160, 4096) waves
  assert cw.ctx_save_restore_size == 0x9000 + 104 * 0x95000
  assert kfd.cwsr_sizes({"gfx_target_version": 70002, "simd_count": 8, "simd_per_cu": 4}) is None  # before gfx8.0.1


def test_compute_queue_gets_its_cwsr_area_and_the_mock_checks_it():
  from tiny_runtime_amd.device import AMDDevice
  from tiny_uop.plugins import Device
  dev: AMDDevice = Device["MOCK+AMD"]
  cw = dev.iface.node.cwsr
  ring = dev.compute_ring
  assert ring.ctx is not None and ring.ctx.size == cw.alloc_size
  # the header's DebugOffset/DebugSize point past the save area
  assert list((ctypes.c_uint32 * 2).from_address(ring.ctx.va_addr + 16)) == [cw.ctx_save_restore_size, 0x18000]
  iface = dev.iface
  rb, ptrs = iface.alloc(0x1000, host=True), iface.alloc(0x1000, host=True)
  good = dict(ring_base_address=rb.va_addr, ring_size=0x1000, gpu_id=iface.node.gpu_id,
              queue_type=kfd.QUEUE_TYPE_COMPUTE, read_pointer_address=ptrs.va_addr,
              write_pointer_address=ptrs.va_addr + 8, eop_buffer_address=ring.eop.va_addr, eop_buffer_size=4096,
              ctx_save_restore_address=ring.ctx.va_addr, ctx_save_restore_size=cw.ctx_save_restore_size,
              ctl_stack_size=cw.ctl_stack_size)
  for bad, match in (({"ctl_stack_size": 0x1000}, "ctl_stack_size 0x1000"),
                     ({"ctx_save_restore_size": 0x1000}, "ctx_save_restore_size"),
                     ({"eop_buffer_size": 0x800}, "eop_buffer_size"),
                     ({"ctx_save_restore_address": rb.va_addr}, "CWSR area")):
    with pytest.raises(kfd.KFDError, match=match): iface.ioctl("CREATE_QUEUE", **{**good, **bad})
  q = iface.ioctl("CREATE_QUEUE", **good)
  iface.ioctl("DESTROY_QUEUE", queue_id=q.queue_id)


def test_kfdiface_on_the_mock():
  iface = kfd.KFDIface(0, MockFileIO)
  assert iface.node.gpu_id == GPU_ID and iface.node.arch == "gfx1100" and iface.node.lds_size_in_kb == 64
  assert iface.version[0] == 1 and iface.proc is kfd.KFDIface(1, MockFileIO).proc  # one /dev/kfd per process
  assert (iface.node.shader_engines, iface.node.cu_count) == (6, 96)
  buf = iface.alloc(100, host=True)
  assert buf.size == 0x1000 and buf.cpu_mapped and buf.meta.gpu_ids == [GPU_ID]
  buf.host_view()[:4] = b"abcd"
  assert ctypes.string_at(buf.va_addr, 4) == b"abcd"
  iface.free(buf)
  assert buf.meta.gpu_ids == []
  ev = iface.create_event()  # the process's event page: one 8-byte slot per event
  assert iface.proc.event_page is not None and ev.mailbox == iface.proc.event_page.va_addr + 8 * ev.event_id
  assert not iface.wait_event(ev, 0)  # nothing signaled it: a zero-timeout wait polls and returns
  with pytest.raises(kfd.KFDError, match="FREE_MEMORY_OF_GPU"): iface.ioctl("FREE_MEMORY_OF_GPU", handle=99999)
  with pytest.raises(RuntimeError, match="AMD:4 does not exist; this machine has 4 AMD GPU"):
    kfd.KFDIface(4, MockFileIO)


def test_clear_errors_without_kfd_or_permission():
  class NoKFD(MockFileIO):
    @staticmethod
    def exists(path): return False
  class NoAccess(MockFileIO):
    @staticmethod
    def access(path, mode): return False
  with pytest.raises(RuntimeError, match=r"no /dev/kfd .*use DEV=MOCK\+AMD"): kfd.KFDIface(0, NoKFD)
  class NoRenderAccess(MockFileIO):
    @staticmethod
    def access(path, mode): return not path.startswith("/dev/dri/")
  with pytest.raises(RuntimeError, match="'render' and 'video' groups"): kfd.KFDIface(0, NoAccess)
  with pytest.raises(RuntimeError, match=r"/dev/dri/renderD128 is not readable .* join the 'render' group"):
    kfd.KFDIface(0, NoRenderAccess)
  with pytest.raises(RuntimeError, match=r"/dev/dri/renderD129 is not readable"): kfd.KFDIface(1, NoRenderAccess)
  if not os.path.exists("/dev/kfd"):
    with pytest.raises(RuntimeError, match=r"no /dev/kfd .*use DEV=MOCK\+AMD"): kfd.KFDIface(0)


# ***** pm4.py / sdma.py: packets are compared with the oracle's encoding in test_oracle.py *****
def test_pm4_header_and_register_index_errors():
  assert pm4.decode_header(pm4.header(pm4.RELEASE_MEM, 7)) == (3, pm4.RELEASE_MEM, 7)
  assert pm4.sh_reg_index(pm4.COMPUTE_PGM_LO) == 0x20C and pm4.sh_reg_index(pm4.COMPUTE_USER_DATA_0) == 0x240
  with pytest.raises(ValueError, match="0xa000"): pm4.sh_reg_index(0xA000)
  with pytest.raises(ValueError, match="1..16384"): pm4.header(pm4.NOP, 0)
  with pytest.raises(ValueError, match="IB_SIZE is 20 bits"): pm4.AMDComputeQueue().indirect_buffer(0x1000, 1 << 20)


def test_signals_without_an_event_raise_no_interrupt():
  mem = (ctypes.c_uint64 * 2)()
  sig = HCQSignal(ctypes.addressof(mem))
  assert len(pm4.AMDComputeQueue().signal(sig, 1)) == 8 and len(sdma.AMDCopyQueue().signal(sig, 1)) == 8
  d = sdma.AMDCopyQueue().copy(0x2000_0000, 0x1000_0000, sdma.MAX_COPY + 16).resolved()
  assert len(d) == 14 and d[1] == sdma.MAX_COPY - 1 and d[8] == 15  # split at MAX_COPY
  # a symbolic destination splits the same way, each packet at the variable + its offset (HCQ2 records UOps alike)
  d = sdma.AMDCopyQueue().copy(HCQVar("d"), 0x1000, sdma.MAX_COPY + 1).resolved({"d": 0x3_0000_0000})
  assert len(d) == 14 and d[1] == sdma.MAX_COPY - 1 and d[8] == 0
  assert (d[5], d[6], d[12], d[13]) == (0, 3, sdma.MAX_COPY, 3) and d[10] == 0x1000 + sdma.MAX_COPY
