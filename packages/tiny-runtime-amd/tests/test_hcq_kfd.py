"""The HCQ layer (tiny_uop.hcq), the KFD ioctl layer (struct layouts, ioctl numbers, KFDIface over the mock) and
the PM4/SDMA packet builders, each checked against values fixed by the kernel headers or by their semantics."""
from __future__ import annotations

import ctypes
import os

import pytest

from tiny_runtime_amd import kfd, pm4, sdma
from tiny_runtime_amd.mock.driver import GPU_ID, MockFileIO
from tiny_uop.hcq import MAP_PRIVATE, PROT_READ, PROT_WRITE, FileIOInterface, HCQSignal, HCQVar, HWQueue, ioc


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


# ***** kfd.py: layouts and numbers from include/uapi/linux/kfd_ioctl.h *****
def test_struct_sizes_match_the_uapi_header():
  sizes = {"get_version": 8, "create_queue": 88, "destroy_queue": 8, "create_event": 32, "wait_events": 24,
           "acquire_vm": 8, "alloc_memory_of_gpu": 40, "free_memory_of_gpu": 8, "map_memory_to_gpu": 24,
           "unmap_memory_from_gpu": 24}
  for name, size in sizes.items(): assert kfd.ffi.sizeof(f"struct kfd_ioctl_{name}_args") == size, name
  assert kfd.ffi.offsetof("struct kfd_ioctl_create_queue_args", "eop_buffer_address") == 56


def test_ioctl_numbers():
  # _IOC(dir, 'K', nr, size): e.g. AMDKFD_IOC_GET_VERSION = _IOR('K', 1, 8) = 0x80084b01
  assert kfd.ioctl_number("GET_VERSION") == 0x80084B01
  assert kfd.ioctl_number("CREATE_QUEUE") == 0xC0584B02
  assert kfd.ioctl_number("ACQUIRE_VM") == 0x40084B15
  assert kfd.ioctl_number("ALLOC_MEMORY_OF_GPU") == 0xC0284B16
  assert kfd.ioctl_number("FREE_MEMORY_OF_GPU") == 0x40084B17
  assert kfd.ioctl_number("MAP_MEMORY_TO_GPU") == 0xC0184B18
  assert kfd.ioctl_number("WAIT_EVENTS") == 0xC0184B0C
  assert ioc(3, "K", 0x19, 24) == kfd.ioctl_number("UNMAP_MEMORY_FROM_GPU")
  assert len(kfd.IOCTL_BY_NUMBER) == len(kfd.IOCTLS)


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
  assert iface.version[0] == 1
  buf = iface.alloc(100, host=True)
  assert buf.size == 0x1000 and buf.cpu_mapped
  buf.host_view()[:4] = b"abcd"
  assert ctypes.string_at(buf.va_addr, 4) == b"abcd"
  iface.free(buf)
  ev = iface.ioctl("CREATE_EVENT", event_type=kfd.EVENT_SIGNAL, auto_reset=1)
  assert ev.event_id > 0
  ids = kfd.ffi.new("struct kfd_event_data[1]")
  ids[0].event_id = ev.event_id
  res = iface.ioctl("WAIT_EVENTS", events_ptr=int(kfd.ffi.cast("uintptr_t", ids)), num_events=1, timeout=10)
  assert res.wait_result == kfd.WAIT_RESULT_COMPLETE
  with pytest.raises(kfd.KFDError, match="FREE_MEMORY_OF_GPU"): iface.ioctl("FREE_MEMORY_OF_GPU", handle=99999)
  with pytest.raises(RuntimeError, match="AMD:4 does not exist"): kfd.KFDIface(4, MockFileIO)


def test_mock_has_several_gpus_each_with_its_own_id_vm_and_render_node():
  from tiny_runtime_amd.mock.driver import GPU_IDS, driver
  a, b = kfd.KFDIface(0, MockFileIO), kfd.KFDIface(1, MockFileIO)
  assert (a.node.gpu_id, b.node.gpu_id) == GPU_IDS[:2] and a.node.drm_render_minor + 1 == b.node.drm_render_minor
  buf = b.alloc(64, host=True)  # mapped through GPU 1's render node
  assert driver().alloc_gpu[buf.meta[0]] == GPU_IDS[1]
  with pytest.raises(OSError, match="matches no allocation of its GPU"):  # GPU 0's render node can't map it
    a.drm.mmap(buf.va_addr, buf.size, 0, 0, buf.meta[0] << 12)
  b.free(buf)
  with pytest.raises(kfd.KFDError, match="ACQUIRE_VM.*unknown gpu_id"): a.ioctl("ACQUIRE_VM", drm_fd=4, gpu_id=0x42)
  with pytest.raises(kfd.KFDError, match="unknown gpu_id"):
    a.ioctl("ALLOC_MEMORY_OF_GPU", va_addr=0x7000_0000_0000, size=0x1000, gpu_id=0x42, flags=0)


def test_clear_errors_without_kfd_or_permission():
  class NoKFD(MockFileIO):
    @staticmethod
    def exists(path): return False
  class NoAccess(MockFileIO):
    @staticmethod
    def access(path, mode): return False
  with pytest.raises(RuntimeError, match=r"no AMD GPU \(/dev/kfd missing\)"): kfd.KFDIface(0, NoKFD)
  class NoRenderAccess(MockFileIO):
    @staticmethod
    def access(path, mode): return not path.startswith("/dev/dri/")
  with pytest.raises(RuntimeError, match="'render' and 'video' groups"): kfd.KFDIface(0, NoAccess)
  with pytest.raises(RuntimeError, match=r"/dev/dri/renderD128 is not readable .* join the 'render' group"):
    kfd.KFDIface(0, NoRenderAccess)
  if not os.path.exists("/dev/kfd"):
    with pytest.raises(RuntimeError, match="missing"): kfd.KFDIface(0)


# ***** pm4.py / sdma.py *****
def test_pm4_header_encoding():
  # PACKET3(op, n) = 3 << 30 | n << 16 | op << 8, SHADER_TYPE (bit 1) for compute
  assert pm4.header(pm4.SET_SH_REG, 2) == 0xC0017602
  assert pm4.header(pm4.DISPATCH_DIRECT, 4) == 0xC0031502
  assert pm4.decode_header(pm4.header(pm4.RELEASE_MEM, 7)) == (3, pm4.RELEASE_MEM, 7)
  assert pm4.sh_reg_index(pm4.COMPUTE_PGM_LO) == 0x20C and pm4.sh_reg_index(pm4.COMPUTE_USER_DATA_0) == 0x240
  with pytest.raises(ValueError, match="0xa000"): pm4.sh_reg_index(0xA000)


def test_compute_queue_packets():
  mem = (ctypes.c_uint64 * 2)()
  sig = HCQSignal(ctypes.addressof(mem))
  v = HCQVar("v")
  q = pm4.AMDComputeQueue().wait(sig, 3).signal(sig, v).timestamp(sig)
  d = q.resolved({"v": 0x1_0000_0002})
  addr = ctypes.addressof(mem)
  assert d[:7] == [pm4.header(pm4.WAIT_REG_MEM, 6), 3 | 1 << 4, addr & 0xFFFFFFFF, addr >> 32, 3, 0xFFFFFFFF, 4]
  assert d[7] == pm4.header(pm4.RELEASE_MEM, 7) and d[9] >> 29 == pm4.DATA_SEL_64 and d[12:14] == [2, 1]
  assert d[15] == pm4.header(pm4.RELEASE_MEM, 7) and d[17] >> 29 == pm4.DATA_SEL_TIMESTAMP
  assert d[18] == (addr + 8) & 0xFFFFFFFF


def test_sdma_packets():
  q = sdma.AMDCopyQueue().copy(0x2000_0000, 0x1000_0000, sdma.MAX_COPY + 16)
  d = q.resolved()
  assert len(d) == 14 and d[0] == 1 and d[1] == sdma.MAX_COPY - 1 and d[8] == 15
  assert d[10:12] == [(0x1000_0000 + sdma.MAX_COPY) & 0xFFFFFFFF, 0] and d[12] == 0x2000_0000 + sdma.MAX_COPY
  mem = (ctypes.c_uint64 * 2)()
  d = sdma.AMDCopyQueue().signal(HCQSignal(ctypes.addressof(mem)), 0x7_0000_0001).resolved()
  assert d[0] == sdma.OP_FENCE and d[3] == 7 and d[7] == 1  # high word first, then low
  assert sum(sdma.PACKET_DWORDS[w & 0xFF] for w in (d[0], d[4])) == len(d)
