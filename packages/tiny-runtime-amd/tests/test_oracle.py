"""Every hardware fact the AMD driver and its mock encode, against tinygrad 0.14.0's generated bindings of the same
headers (the test-only oracle, `amd_oracle.py`): KFD ioctl numbers, struct layouts and flags (kfd_ioctl.h); PM4
opcodes, packets and fields (nvd.h, the MEC packet headers); gc_11_0_0 register offsets and fields; SDMA v6 packets
(sdma_v6_0_0_pkt_open.h); the AMDHSA kernel descriptor (LLVM). Packets are built by the driver's own queue methods and
compared dword by dword, field by field, with the same packet encoded through the oracle's macros; the mock's decoding
tables (fields and so reserved bits) are compared with the oracle's too."""
from __future__ import annotations

import ctypes
import struct

import amd_oracle as o
import pytest

from tiny_runtime_amd import elf, kfd, pm4, sdma
from tiny_runtime_amd.mock import driver as mdriver
from tiny_runtime_amd.mock import gfx11 as mgfx11
from tiny_runtime_amd.mock import pm4 as mpm4
from tiny_runtime_amd.mock import sdma as msdma
from tiny_runtime_amd.mock.fields import Layout
from tiny_uop.hcq import HCQSignal, HCQVar

nv, gpu, p4, kd = o.module("pm4_nv"), o.module("amd_gpu"), o.module("pm4_nv"), o.module("amdgpu_kd")


def assert_packets(name: str, ours: list[int], theirs: list[int], fields: dict[int, dict[str, int]] | None = None):
  """Dword-by-dword equality; on a difference, name the dword and (when given) which oracle fields differ."""
  assert len(ours) == len(theirs), f"{name}: {len(ours)} dwords, the oracle's encoding has {len(theirs)}"
  for i, (a, b) in enumerate(zip(ours, theirs)):
    if a == b: continue
    diff = [f"{f}: ours {(a & m) >> (m & -m).bit_length() - 1}, oracle {(b & m) >> (m & -m).bit_length() - 1}"
            for f, m in (fields or {}).get(i, {}).items() if (a ^ b) & m]
    raise AssertionError(f"{name} dword {i}: ours {a:#010x}, oracle {b:#010x} ({'; '.join(diff) or 'unnamed bits'})")


# ***** KFD: kfd_ioctl.h *****
@pytest.mark.parametrize("name", list(kfd.IOCTLS))
def test_ioctl_numbers_and_struct_layouts(name):
  d, base, nr, st = o.ioctl(name)
  ours_d, ours_nr, ours_st = kfd.IOCTLS[name]
  assert (ours_d, ours_nr, base) == (d, nr, ord("K")), name
  assert kfd.ioctl_number(name) == o.ioctl_number(name)
  assert kfd.ffi.sizeof(f"struct {ours_st}") == st.SIZE
  ctype = kfd.ffi.typeof(f"struct {ours_st}")
  ours = [(f, kfd.ffi.offsetof(f"struct {ours_st}", f), kfd.ffi.sizeof(fld.type)) for f, fld in ctype.fields]
  assert ours == o.struct_fields(st)


def test_event_data_layout_and_the_mock_reads_it_where_the_kernel_does():
  st = o.value("kfd", "struct_kfd_event_data")
  fields = {f: (off, size) for f, off, size in o.struct_fields(st)}
  assert kfd.ffi.sizeof("struct kfd_event_data") == st.SIZE == mdriver.EVENT_DATA_SIZE
  for f in ("kfd_event_data_ext", "event_id", "pad"):
    assert kfd.ffi.offsetof("struct kfd_event_data", f) == fields[f][0], f
  assert fields["event_id"][0] == mdriver.EVENT_DATA_ID_OFFSET
  union = kfd.ffi.typeof("struct kfd_event_data").fields[0][1]
  assert union.offset == 0 and kfd.ffi.sizeof(union.type) == fields["kfd_event_data_ext"][0] == \
    max(size for f, (off, size) in fields.items() if off == 0)  # the union of the three event-data structs


def test_kfd_constants():
  pairs = {
    "QUEUE_TYPE_COMPUTE": "KFD_IOC_QUEUE_TYPE_COMPUTE", "QUEUE_TYPE_SDMA": "KFD_IOC_QUEUE_TYPE_SDMA",
    "QUEUE_TYPE_COMPUTE_AQL": "KFD_IOC_QUEUE_TYPE_COMPUTE_AQL", "EVENT_SIGNAL": "KFD_IOC_EVENT_SIGNAL",
    "EVENT_MEMORY": "KFD_IOC_EVENT_MEMORY", "WAIT_RESULT_COMPLETE": "KFD_IOC_WAIT_RESULT_COMPLETE",
    "WAIT_RESULT_TIMEOUT": "KFD_IOC_WAIT_RESULT_TIMEOUT", "WAIT_RESULT_FAIL": "KFD_IOC_WAIT_RESULT_FAIL",
    "SIGNAL_EVENT_LIMIT": "KFD_SIGNAL_EVENT_LIMIT",
    "RUNTIME_ENABLE_MODE_ENABLE_MASK": "KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK",
    "RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK": "KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK",
    **{f"ALLOC_{f}": f"KFD_IOC_ALLOC_MEM_FLAGS_{f}" for f in ("VRAM", "GTT", "USERPTR", "DOORBELL", "WRITABLE",
                                                              "EXECUTABLE", "PUBLIC", "NO_SUBSTITUTE", "AQL_QUEUE_MEM",
                                                              "COHERENT", "UNCACHED")},
  }
  for ours, theirs in pairs.items(): assert getattr(kfd, ours) == o.value("kfd", theirs) & 0xFFFFFFFF, ours


# ***** PM4: opcodes, header, registers *****
def test_pm4_opcodes_and_header():
  for name in ("NOP", "SET_SH_REG", "DISPATCH_DIRECT", "ACQUIRE_MEM", "RELEASE_MEM", "WAIT_REG_MEM", "INDIRECT_BUFFER",
               "EVENT_WRITE"):
    assert getattr(pm4, name) == o.value("amd_gpu", f"PACKET3_{name}") == o.value("pm4_nv", f"PACKET3_{name}"), name
    assert mpm4.OPCODE_NAMES[getattr(pm4, name)] == name
  for op in (pm4.SET_SH_REG, pm4.RELEASE_MEM, pm4.DISPATCH_DIRECT):
    for n in (1, 2, 7, 0x4000):
      h = pm4.header(op, n)
      assert h == nv.PACKET3_COMPUTE(op, n - 1)
      assert (nv.CP_PACKET_GET_TYPE(h), nv.CP_PACKET3_GET_OPCODE(h), nv.CP_PACKET_GET_COUNT(h) + 1) == \
        pm4.decode_header(h) == (3, op, n)
      dec = mpm4.decode_header(h, "test")
      assert (dec.opcode, dec.body, dec.shader_type) == (op, n, 1)
  assert pm4.SH_REG_BASE == 4 * nv.PACKET3_SET_SH_REG_START and pm4.SH_REG_END == 4 * nv.PACKET3_SET_SH_REG_END


DRIVER_REGISTERS = ("COMPUTE_DISPATCH_INITIATOR", "COMPUTE_START_X", "COMPUTE_START_Y", "COMPUTE_START_Z",
                    "COMPUTE_NUM_THREAD_X", "COMPUTE_NUM_THREAD_Y", "COMPUTE_NUM_THREAD_Z", "COMPUTE_PGM_LO",
                    "COMPUTE_PGM_HI", "COMPUTE_DISPATCH_SCRATCH_BASE_LO", "COMPUTE_DISPATCH_SCRATCH_BASE_HI",
                    "COMPUTE_PGM_RSRC1", "COMPUTE_PGM_RSRC2", "COMPUTE_RESOURCE_LIMITS", "COMPUTE_TMPRING_SIZE",
                    "COMPUTE_PGM_RSRC3", "COMPUTE_USER_DATA_0")


@pytest.mark.parametrize("name", DRIVER_REGISTERS)
def test_driver_register_addresses(name):
  dword, _ = o.gc11_register(name)
  assert getattr(pm4, name) == 4 * dword
  assert getattr(pm4, name) // 4 == gpu.__dict__[f"reg{name}"] + gpu.GC_BASE__INST0_SEG0  # the same, via amd_gpu.py


def _layout_fields(lay: Layout) -> dict[str, tuple[int, int]]:
  return {f.name: (f.lo, f.lo + f.width - 1) for f in lay.fields}


def test_mock_register_table_is_gc_11_0_0():
  for addr, (name, lay) in mgfx11.SH_REGISTERS.items():
    dword, fields = o.gc11_register(name)
    assert addr == 4 * dword, name
    assert _layout_fields(lay) == fields, name
  _, fields = o.gc11_register("COMPUTE_DISPATCH_INITIATOR")
  assert _layout_fields(mgfx11.DISPATCH_INITIATOR) == fields
  # start, num_thread, pipelinestat/perfcount enable, pgm, scratch base, rsrc1-3, limits, tmpring, restart, user data
  assert len(mgfx11.SH_REGISTERS) == 36


def test_dispatch_and_resource_bits():
  _, ini = o.gc11_register("COMPUTE_DISPATCH_INITIATOR")
  assert pm4.DISPATCH_COMPUTE_SHADER_EN == 1 << ini["compute_shader_en"][0]
  assert pm4.DISPATCH_FORCE_START_AT_000 == 1 << ini["force_start_at_000"][0]
  assert pm4.DISPATCH_CS_W32_EN == 1 << ini["cs_w32_en"][0]
  _, r1 = o.gc11_register("COMPUTE_PGM_RSRC1")
  assert pm4.RSRC1_PRIV == 1 << r1["priv"][0] == kd.COMPUTE_PGM_RSRC1_PRIV
  _, r2 = o.gc11_register("COMPUTE_PGM_RSRC2")
  assert pm4.RSRC2_SCRATCH_EN == 1 << r2["scratch_en"][0] == kd.COMPUTE_PGM_RSRC2_ENABLE_PRIVATE_SEGMENT
  assert (pm4.RSRC2_LDS_SIZE_SHIFT, pm4.RSRC2_LDS_SIZE_MASK.bit_length()) == \
    (r2["lds_size"][0], r2["lds_size"][1] - r2["lds_size"][0] + 1) == \
    (kd.COMPUTE_PGM_RSRC2_GRANULATED_LDS_SIZE_SHIFT, kd.COMPUTE_PGM_RSRC2_GRANULATED_LDS_SIZE_WIDTH)


# ***** PM4: packets the driver builds vs the oracle's encoding *****
def _sig():
  mem = (ctypes.c_uint64 * 2)()
  return HCQSignal(ctypes.addressof(mem)), mem


def _oracle_wait_reg_mem(addr: int, ref: int) -> list[int]:
  geq = nv.PACKET3_WAIT_REG_MEM__FUNCTION__GREATER_THAN_OR_EQUAL_REFERENCE_VALUE
  return [nv.PACKET3_COMPUTE(nv.PACKET3_WAIT_REG_MEM, 5),
          gpu.WAIT_REG_MEM_FUNCTION(geq) |
          gpu.WAIT_REG_MEM_MEM_SPACE(nv.PACKET3_WAIT_REG_MEM__MEM_SPACE__MEMORY_SPACE) |
          gpu.WAIT_REG_MEM_OPERATION(nv.PACKET3_WAIT_REG_MEM__OPERATION__WAIT_REG_MEM) | gpu.WAIT_REG_MEM_ENGINE(0),
          nv.PACKET3_WAIT_REG_MEM__MEM_POLL_ADDR_LO((addr & 0xFFFFFFFF) >> 2),
          nv.PACKET3_WAIT_REG_MEM__MEM_POLL_ADDR_HI(addr >> 32), nv.PACKET3_WAIT_REG_MEM__REFERENCE(ref),
          nv.PACKET3_WAIT_REG_MEM__MASK(0xFFFFFFFF), nv.PACKET3_WAIT_REG_MEM__POLL_INTERVAL(4)]


WAIT_FIELDS = {1: {"FUNCTION": 0x7, "MEM_SPACE": 0x30, "OPERATION": 0xC0}}


def test_wait_reg_mem_is_greater_or_equal_as_pm4_defines_it():
  """The packet that was wrong: function 3 is EQUAL in PM4, >= is 5."""
  assert pm4.WAIT_FUNC_GEQ == nv.PACKET3_WAIT_REG_MEM__FUNCTION__GREATER_THAN_OR_EQUAL_REFERENCE_VALUE == 5
  assert pm4.WAIT_FUNC_EQ == nv.PACKET3_WAIT_REG_MEM__FUNCTION__EQUAL_TO_THE_REFERENCE_VALUE == 3
  sig, _ = _sig()
  ours = pm4.AMDComputeQueue().wait(sig, 0x1234).resolved()
  assert_packets("WAIT_REG_MEM", ours, _oracle_wait_reg_mem(sig.addr, 0x1234), WAIT_FIELDS)
  assert mpm4.decode_wait_reg_mem(ours[1:], "test")["function"] == 5  # the mock reads it as GE


def _oracle_release_mem(addr: int, data: int, data_sel: int, int_sel: int, ctxid: int) -> list[int]:
  gcr = gpu.PACKET3_RELEASE_MEM_GCR_SEQ | gpu.PACKET3_RELEASE_MEM_GCR_GL2_WB | gpu.PACKET3_RELEASE_MEM_GCR_GL2_INV | \
    gpu.PACKET3_RELEASE_MEM_GCR_GL2_US | gpu.PACKET3_RELEASE_MEM_GCR_GL1_INV | gpu.PACKET3_RELEASE_MEM_GCR_GLV_INV | \
    gpu.PACKET3_RELEASE_MEM_GCR_GLM_INV | gpu.PACKET3_RELEASE_MEM_GCR_GLM_WB
  return [nv.PACKET3_COMPUTE(nv.PACKET3_RELEASE_MEM, 6),
          gpu.PACKET3_RELEASE_MEM_EVENT_TYPE(nv.CACHE_FLUSH_AND_INV_TS_EVENT) |
          gpu.PACKET3_RELEASE_MEM_EVENT_INDEX(nv.event_index__mec_release_mem__end_of_pipe) | gcr |
          gpu.PACKET3_RELEASE_MEM_CACHE_POLICY(nv.PACKET3_WRITE_DATA__CACHE_POLICY__BYPASS),
          gpu.PACKET3_RELEASE_MEM_DATA_SEL(data_sel) | gpu.PACKET3_RELEASE_MEM_INT_SEL(int_sel) |
          gpu.PACKET3_RELEASE_MEM_DST_SEL(nv.dst_sel__mec_release_mem__memory_controller),
          addr & 0xFFFFFFFF, addr >> 32, data & 0xFFFFFFFF, data >> 32, ctxid]


class _Ev:
  event_id, mailbox = 9, 0x7000_0048


def test_signal_and_timestamp_release_mem_with_cache_write_back_and_the_event_interrupt():
  sig, _ = _sig()
  sig.event = _Ev()  # a signal with a KFD event: the mailbox write and its interrupt follow the value
  ours = pm4.AMDComputeQueue().signal(sig, HCQVar("v")).timestamp(sig).resolved({"v": 0x5_0000_0007})
  theirs = _oracle_release_mem(sig.addr, 0x5_0000_0007, nv.data_sel__mec_release_mem__send_64_bit_data,
                               nv.int_sel__mec_release_mem__none, 0) + \
    _oracle_release_mem(_Ev.mailbox, _Ev.event_id, nv.data_sel__mec_release_mem__send_32_bit_low,
                        nv.int_sel__mec_release_mem__send_interrupt_after_write_confirm, _Ev.event_id) + \
    _oracle_release_mem(sig.addr + 8, 0, nv.data_sel__mec_release_mem__send_gpu_clock_counter,
                        nv.int_sel__mec_release_mem__none, 0)
  assert_packets("RELEASE_MEM x3", ours, theirs, {1: {"GCR": 0x7FF000}, 2: {"DATA_SEL": 7 << 29, "INT_SEL": 7 << 24}})
  for i in range(0, len(ours), 8):  # and the mock decodes each as intended
    f = mpm4.decode_release_mem(ours[i + 1:i + 8], "test")
    assert f["gl2_wb"] and f["glm_wb"] and f["glm_inv"] and f["event_index"] == 5 and f["event_type"] == 0x14


def test_memory_barrier_event_write_and_acquire_mem():
  ours = pm4.AMDComputeQueue().memory_barrier().resolved()
  gcr = gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLI_INV(1) | gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_WB(1) | \
    gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_INV(1) | gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLK_WB(1) | \
    gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLK_INV(1) | gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLV_INV(1) | \
    gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL1_INV(1) | gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_INV(1) | \
    gpu.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_WB(1)
  theirs = [nv.PACKET3_COMPUTE(nv.PACKET3_EVENT_WRITE, 0),
            nv.PACKET3_EVENT_WRITE__EVENT_TYPE(o.value("soc_11", "CS_PARTIAL_FLUSH")) |
            nv.PACKET3_EVENT_WRITE__EVENT_INDEX(nv.PACKET3_EVENT_WRITE__EVENT_INDEX__CS_PARTIAL_FLUSH),
            nv.PACKET3_COMPUTE(nv.PACKET3_ACQUIRE_MEM, 6), 0, nv.PACKET3_ACQUIRE_MEM__COHER_SIZE(0xFFFFFFFF),
            nv.PACKET3_ACQUIRE_MEM__COHER_SIZE_HI(0xFFFFFFFF), nv.PACKET3_ACQUIRE_MEM__COHER_BASE_LO(0),
            nv.PACKET3_ACQUIRE_MEM__COHER_BASE_HI(0), nv.PACKET3_ACQUIRE_MEM__POLL_INTERVAL(10),
            nv.PACKET3_ACQUIRE_MEM__GCR_CNTL(gcr)]
  assert_packets("EVENT_WRITE + ACQUIRE_MEM", ours, theirs)
  assert pm4.CS_PARTIAL_FLUSH == o.value("soc_11", "CS_PARTIAL_FLUSH")
  assert pm4.CACHE_FLUSH_AND_INV_TS_EVENT == o.value("soc_11", "CACHE_FLUSH_AND_INV_TS_EVENT")


def test_indirect_buffer_and_dispatch_sequence():
  addr = 0x7FAB_CDE0_1234 & ~3
  ours = pm4.AMDComputeQueue().indirect_buffer(addr, 77).resolved()
  theirs = [nv.PACKET3_COMPUTE(nv.PACKET3_INDIRECT_BUFFER, 2), nv.PACKET3_INDIRECT_BUFFER__IB_BASE_LO(addr >> 2),
            nv.PACKET3_INDIRECT_BUFFER__IB_BASE_HI(addr >> 32),
            nv.PACKET3_INDIRECT_BUFFER__IB_SIZE(77) | nv.PACKET3_INDIRECT_BUFFER__VALID(1)]
  assert_packets("INDIRECT_BUFFER", ours, theirs)

  class Prg:  # what AMDComputeQueue.exec reads from a program
    entry_addr, rsrc1, rsrc2, rsrc3 = 0x7F12_3456_7800, 0x60AF0041, 0x0000198C, 0x5

    def scratch(self): return (0x7F00_0000_0000, 0x15200)
    def user_data(self, args): return [args & 0xFFFFFFFF, args >> 32]
  args = 0x7F55_0000_0040
  ours = pm4.AMDComputeQueue().exec(Prg(), args, (3, 2, 1), (64, 1, 1)).resolved()

  def sh(name: str, *vals: int) -> list[int]:
    return [nv.PACKET3_COMPUTE(nv.PACKET3_SET_SH_REG, len(vals)),
            nv.PACKET3_SET_SH_REG__REG_OFFSET(o.gc11_register(name)[0] - nv.PACKET3_SET_SH_REG_START), *vals]
  _, ini = o.gc11_register("COMPUTE_DISPATCH_INITIATOR")
  initiator = sum(1 << ini[f][0] for f in ("compute_shader_en", "force_start_at_000", "cs_w32_en"))
  theirs = sh("COMPUTE_PGM_LO", (Prg.entry_addr >> 8) & 0xFFFFFFFF, Prg.entry_addr >> 40) + \
    sh("COMPUTE_PGM_RSRC1", Prg.rsrc1, Prg.rsrc2) + sh("COMPUTE_PGM_RSRC3", Prg.rsrc3) + \
    sh("COMPUTE_DISPATCH_SCRATCH_BASE_LO", (0x7F00_0000_0000 >> 8) & 0xFFFFFFFF, 0x7F00_0000_0000 >> 40) + \
    sh("COMPUTE_TMPRING_SIZE", 0x15200) + sh("COMPUTE_USER_DATA_0", args & 0xFFFFFFFF, args >> 32) + \
    sh("COMPUTE_RESOURCE_LIMITS", 0) + sh("COMPUTE_START_X", 0, 0, 0, 64, 1, 1) + \
    [nv.PACKET3_COMPUTE(nv.PACKET3_DISPATCH_DIRECT, 3), 3, 2, 1, initiator]
  assert_packets("dispatch", ours, theirs)


# ***** the mock's PM4 decoding tables vs the oracle's field macros *****
def _mask(lay: Layout, name: str) -> int: return next(f.mask for f in lay.fields if f.name == name)


def test_mock_pm4_field_layouts():
  m = o.field_mask
  checks = [  # (mock layout, mock field, oracle in-place mask)
    (mpm4.WAIT_REG_MEM_DW1, "function", m(nv, "PACKET3_WAIT_REG_MEM__FUNCTION")),
    (mpm4.WAIT_REG_MEM_DW1, "mem_space", m(nv, "PACKET3_WAIT_REG_MEM__MEM_SPACE")),
    (mpm4.WAIT_REG_MEM_DW1, "operation", m(nv, "PACKET3_WAIT_REG_MEM__OPERATION")),
    (mpm4.WAIT_REG_MEM_DW1, "mes_intr_pipe", m(nv, "PACKET3_WAIT_REG_MEM__MES_INTR_PIPE")),
    (mpm4.WAIT_REG_MEM_DW1, "mes_action", m(nv, "PACKET3_WAIT_REG_MEM__MES_ACTION")),
    (mpm4.WAIT_REG_MEM_DW1, "cache_policy", m(nv, "PACKET3_WAIT_REG_MEM__CACHE_POLICY")),
    (mpm4.ADDR_LO_DWORD, "addr_lo", m(nv, "PACKET3_WAIT_REG_MEM__MEM_POLL_ADDR_LO")),
    (mpm4.REG_ADDR, "reg_addr", m(nv, "PACKET3_WAIT_REG_MEM__REG_POLL_ADDR")),
    (mpm4.WAIT_REG_MEM_DW6, "poll_interval", m(nv, "PACKET3_WAIT_REG_MEM__POLL_INTERVAL")),
    (mpm4.WAIT_REG_MEM_DW6, "optimize_ace_offload_mode", m(nv, "PACKET3_WAIT_REG_MEM__OPTIMIZE_ACE_OFFLOAD_MODE")),
    (mpm4.COHER_SIZE_HI, "coher_size_hi", m(nv, "PACKET3_ACQUIRE_MEM__COHER_SIZE_HI")),
    (mpm4.COHER_BASE_HI, "coher_base_hi", m(nv, "PACKET3_ACQUIRE_MEM__COHER_BASE_HI")),
    (mpm4.POLL_INTERVAL, "poll_interval", m(nv, "PACKET3_ACQUIRE_MEM__POLL_INTERVAL")),
    (mpm4.EVENT_WRITE_DW1, "event_type", m(nv, "PACKET3_EVENT_WRITE__EVENT_TYPE")),
    (mpm4.EVENT_WRITE_DW1, "event_index", m(nv, "PACKET3_EVENT_WRITE__EVENT_INDEX")),
    (mpm4.IB_CONTROL, "ib_size", m(nv, "PACKET3_INDIRECT_BUFFER__IB_SIZE")),
    (mpm4.IB_CONTROL, "chain", m(nv, "PACKET3_INDIRECT_BUFFER__CHAIN")),
    (mpm4.IB_CONTROL, "offload_polling", m(nv, "PACKET3_INDIRECT_BUFFER__OFFLOAD_POLLING")),
    (mpm4.IB_CONTROL, "valid", m(nv, "PACKET3_INDIRECT_BUFFER__VALID")),
    (mpm4.IB_CONTROL, "vmid", m(nv, "PACKET3_INDIRECT_BUFFER__VMID")),
    (mpm4.IB_CONTROL, "cache_policy", m(nv, "PACKET3_INDIRECT_BUFFER__CACHE_POLICY")),
    (mpm4.IB_CONTROL, "priv", m(nv, "PACKET3_INDIRECT_BUFFER__PRIV")),
    (mpm4.IB_CONTROL, "pre_resume", gpu.INDIRECT_BUFFER_PRE_RESUME(1)),
    (mpm4.SET_SH_REG_DW1, "reg_offset", m(nv, "PACKET3_SET_SH_REG__REG_OFFSET")),
    (mpm4.SET_SH_REG_DW1, "vmid_shift", m(nv, "PACKET3_SET_SH_REG__VMID_SHIFT")),
    (mpm4.SET_SH_REG_DW1, "index", m(nv, "PACKET3_SET_SH_REG__INDEX")),
    (mpm4.RELEASE_MEM_DW1, "execute", gpu.PACKET3_RELEASE_MEM_EXECUTE),
  ]
  for name in ("glm_wb", "glm_inv", "glv_inv", "gl1_inv", "gl2_us", "gl2_discard", "gl2_inv", "gl2_wb"):
    checks.append((mpm4.RELEASE_MEM_DW1, name, getattr(gpu, f"PACKET3_RELEASE_MEM_GCR_{name.upper()}")))
  for name in ("gl2_range", "seq"):  # the oracle defines their low bit
    checks.append((mpm4.RELEASE_MEM_DW1, name, getattr(gpu, f"PACKET3_RELEASE_MEM_GCR_{name.upper()}") * 3))
  for name in ("event_type", "event_index", "cache_policy"):  # shift macros: field max value, shifted
    f = next(f for f in mpm4.RELEASE_MEM_DW1.fields if f.name == name)
    checks.append((mpm4.RELEASE_MEM_DW1, name, getattr(gpu, f"PACKET3_RELEASE_MEM_{name.upper()}")((1 << f.width) - 1)))
  for name in ("dst_sel", "int_sel", "data_sel"):
    f = next(f for f in mpm4.RELEASE_MEM_DW2.fields if f.name == name)
    checks.append((mpm4.RELEASE_MEM_DW2, name, getattr(gpu, f"PACKET3_RELEASE_MEM_{name.upper()}")((1 << f.width) - 1)))
  for f in mpm4.GCR_CNTL.fields:
    if f.name == "range_is_pa": checks.append((mpm4.GCR_CNTL, f.name, gpu.PACKET3_ACQUIRE_MEM_GCR_RANGE_IS_PA))
    else: checks.append((mpm4.GCR_CNTL, f.name, getattr(gpu, f"PACKET3_ACQUIRE_MEM_GCR_CNTL_{f.name.upper()}")(
      (1 << f.width) - 1)))
  for lay, name, mask in checks: assert _mask(lay, name) == mask, (name, hex(_mask(lay, name)), hex(mask))
  assert mpm4.GCR_CNTL.valid == m(nv, "PACKET3_ACQUIRE_MEM__GCR_CNTL")  # 19 bits, the rest reserved


def test_mock_pm4_enumerations():
  def enum(prefix: str) -> dict[int, str]:
    return {v: k[len(prefix):] for k, v in vars(nv).items() if k.startswith(prefix) and isinstance(v, int)}
  assert set(mpm4.WAIT_FUNCTIONS) == set(enum("PACKET3_WAIT_REG_MEM__FUNCTION__"))
  assert set(mpm4.WAIT_REG_MEM_DW1.fields[1].values) == set(enum("PACKET3_WAIT_REG_MEM__MEM_SPACE__"))
  assert set(mpm4.WAIT_REG_MEM_DW1.fields[2].values) == set(enum("PACKET3_WAIT_REG_MEM__OPERATION__"))
  assert set(mpm4.CACHE_POLICY) == set(enum("PACKET3_WAIT_REG_MEM__CACHE_POLICY__"))
  assert set(mpm4.INT_SEL) == set(nv.enum_mec_release_mem_int_sel_enum)
  assert set(mpm4.DATA_SEL) == set(nv.enum_mec_release_mem_data_sel_enum)
  assert set(mpm4.DST_SEL) == set(nv.enum_mec_release_mem_dst_sel_enum)
  assert set(mpm4.RELEASE_EVENT_INDEX) == set(nv.enum_mec_release_mem_event_index_enum)
  assert set(mpm4.EVENT_WRITE_DW1.fields[1].values) == set(enum("PACKET3_EVENT_WRITE__EVENT_INDEX__"))
  assert set(mpm4.SET_SH_REG_DW1.fields[2].values) == set(enum("PACKET3_SET_SH_REG__INDEX__"))
  vgt = o.value("soc_11", "enum_VGT_EVENT_TYPE")
  for v, name in mpm4.EVENT_TYPES.items(): assert vgt[v] == name, (v, name)


# ***** SDMA v6 *****
def test_sdma_opcodes():
  sd = o.module("sdma_6_0_0")
  assert (sdma.OP_NOP, sdma.OP_COPY, sdma.OP_FENCE, sdma.OP_TRAP, sdma.OP_POLL_REGMEM, sdma.OP_TIMESTAMP) == \
    (sd.SDMA_OP_NOP, sd.SDMA_OP_COPY, sd.SDMA_OP_FENCE, sd.SDMA_OP_TRAP, sd.SDMA_OP_POLL_REGMEM, sd.SDMA_OP_TIMESTAMP)
  assert (sdma.SUBOP_COPY_LINEAR, sdma.SUBOP_TIMESTAMP_GET_GLOBAL) == \
    (sd.SDMA_SUBOP_COPY_LINEAR, sd.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL)
  for (op, _sub), name in msdma.PACKETS.items():
    assert msdma.OP_NAMES[op] == next(k[len("SDMA_OP_"):] for k, v in vars(sd).items()
                                      if k.startswith("SDMA_OP_") and v == op and "AQL" not in k), name
  assert msdma.PACKETS[(sd.SDMA_OP_TIMESTAMP, sd.SDMA_SUBOP_TIMESTAMP_GET)] == "TIMESTAMP_GET"
  assert msdma.PACKETS[(sd.SDMA_OP_POLL_REGMEM, 0)] == "POLL_REGMEM"


def _sd(packet: str, dword: str, **vals: int) -> int:
  sd = o.module("sdma_6_0_0")
  out = 0
  for f, v in vals.items(): out |= getattr(sd, f"SDMA_PKT_{packet}_{dword}_{f.upper()}")(v)
  return out


def test_sdma_packets_the_driver_builds():
  sd = o.module("sdma_6_0_0")
  sig, _ = _sig()
  sig.event = _Ev()
  src, dst = 0x7F10_0000_0000, 0x7F20_0000_0010
  q = sdma.AMDCopyQueue().copy(dst, src, sdma.MAX_COPY + 16).wait(sig, 77).signal(sig, 0x3_0000_0009).timestamp(sig)
  copy = lambda s, d, n: [_sd("COPY_LINEAR", "HEADER", op=sd.SDMA_OP_COPY, sub_op=sd.SDMA_SUBOP_COPY_LINEAR),  # noqa: E731
                          _sd("COPY_LINEAR", "COUNT", count=n - 1), 0, s & 0xFFFFFFFF, s >> 32, d & 0xFFFFFFFF, d >> 32]
  # fences uncached (MTYPE 3), as amdgpu's sdma_v6_0_ring_emit_fence and tinygrad's SDMA queue write them
  fence = lambda a, v: [_sd("FENCE", "HEADER", op=sd.SDMA_OP_FENCE, mtype=3), a & 0xFFFFFFFF, a >> 32, v]  # noqa: E731
  theirs = copy(src, dst, sdma.MAX_COPY) + copy(src + sdma.MAX_COPY, dst + sdma.MAX_COPY, 16) + \
    [_sd("POLL_REGMEM", "HEADER", op=sd.SDMA_OP_POLL_REGMEM, func=5, mem_poll=1), sig.addr & 0xFFFFFFFF,
     sig.addr >> 32, 77, 0xFFFFFFFF, _sd("POLL_REGMEM", "DW5", interval=10, retry_count=0xFFF)] + \
    fence(sig.addr + 4, 3) + fence(sig.addr, 9) + fence(_Ev.mailbox, _Ev.event_id) + \
    [_sd("TRAP", "HEADER", op=sd.SDMA_OP_TRAP), _sd("TRAP", "INT_CONTEXT", int_context=_Ev.event_id)] + \
    [_sd("TIMESTAMP_GET_GLOBAL", "HEADER", op=sd.SDMA_OP_TIMESTAMP, sub_op=sd.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL),
     _sd("TIMESTAMP_GET_GLOBAL", "WRITE_ADDR_LO", write_addr_31_3=(sig.addr + 8) >> 3), (sig.addr + 8) >> 32]
  assert_packets("SDMA", q.resolved(), theirs)
  # gfx942's SDMA v4.4.2: the FENCE header is op and sub-op only (sdma_4_0_0's bindings have no MTYPE field)
  s4 = o.module("sdma_4_0_0")
  assert not hasattr(s4, "SDMA_PKT_FENCE_HEADER_MTYPE")
  assert sdma.AMDCopyQueue9().fence(sig.addr, 9).resolved() == \
    [s4.SDMA_PKT_FENCE_HEADER_OP(s4.SDMA_OP_FENCE), sig.addr & 0xFFFFFFFF, sig.addr >> 32, 9]
  assert sdma.TRAP_INT_CONTEXT_MASK == o.sdma_dword("TRAP", "INT_CONTEXT")[1]["int_context"]
  assert sdma.MAX_COPY - 1 <= o.sdma_dword("COPY_LINEAR", "COUNT")[1]["count"]


SDMA_DWORDS = {"NOP": ["HEADER"], "COPY_LINEAR": ["HEADER", "COUNT", "PARAMETER"], "FENCE": ["HEADER"],
               "TRAP": ["HEADER", "INT_CONTEXT"], "POLL_REGMEM": ["HEADER", "DW5"],
               "TIMESTAMP_GET_GLOBAL": ["HEADER", "WRITE_ADDR_LO"], "TIMESTAMP_GET": ["HEADER", "WRITE_ADDR_LO"]}


@pytest.mark.parametrize("packet", list(SDMA_DWORDS))
def test_mock_sdma_layouts_are_sdma_v6(packet):
  """Each decoded dword: the same fields at the same bits as the header (so the same bits reserved)."""
  lays = msdma.LAYOUTS[packet]
  for dword in SDMA_DWORDS[packet]:
    idx, fields = o.sdma_dword(packet, dword)
    lay = lays[idx]
    assert lay is not None, (packet, dword)
    assert {f.name: f.mask for f in lay.fields} == fields, (packet, dword)
  for i, lay in enumerate(lays):  # full-value dwords: addresses and data, 32 bits in the header too
    if lay is None: assert packet != "NOP" and i > 0


def test_sdma_compare_functions_are_pm4s():
  assert msdma.FUNCS == mpm4.WAIT_FUNCTIONS  # "func: 0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >" in both headers
  assert sdma.POLL_FUNC_GEQ == nv.PACKET3_WAIT_REG_MEM__FUNCTION__GREATER_THAN_OR_EQUAL_REFERENCE_VALUE


# ***** the kernel descriptor (LLVM AMDHSA) *****
def test_kernel_descriptor_layout_and_properties():
  st = kd.llvm_amdhsa_kernel_descriptor_t
  assert st.SIZE == 64
  fields = {f: off for f, off, _ in o.struct_fields(st)}
  raw = bytearray(64)
  vals = {"group_segment_fixed_size": 1024, "private_segment_fixed_size": 96, "kernarg_size": 40,
          "kernel_code_entry_byte_offset": -0x1B40, "compute_pgm_rsrc3": 3, "compute_pgm_rsrc1": 0x60AF0041,
          "compute_pgm_rsrc2": 0x1A9, "kernel_code_properties": 0x408}
  fmt = {"kernel_code_entry_byte_offset": "<q", "kernel_code_properties": "<H"}
  for f, v in vals.items(): struct.pack_into(fmt.get(f, "<I"), raw, fields[f], v)
  d = elf.KernelDescriptor.parse(bytes(raw))
  assert (d.group_segment_fixed_size, d.private_segment_fixed_size, d.kernarg_size, d.kernel_code_entry_byte_offset,
          d.rsrc3, d.rsrc1, d.rsrc2, d.kernel_code_properties) == tuple(vals.values())
  props = [(n, getattr(kd, f"KERNEL_CODE_PROPERTY_ENABLE_SGPR_{n.upper()}_SHIFT")) for n, _ in d.USER_SGPRS]
  assert [s for _, s in props] == list(range(len(props)))  # the enable bits, in SGPR order
  assert d.user_sgprs() == [("kernarg_segment_ptr", 2)] and d.wave32
  assert 0x400 == 1 << kd.KERNEL_CODE_PROPERTY_ENABLE_WAVEFRONT_SIZE32_SHIFT
