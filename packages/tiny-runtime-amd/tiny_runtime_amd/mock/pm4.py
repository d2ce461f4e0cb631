"""Strict decoding of PM4 type-3 packets as a gfx10/gfx11 compute micro engine (MEC) reads them.

Written from the packet definitions, independently of the driver's encoders in `tiny_runtime_amd/pm4.py`:
- header: `PM4_MEC_TYPE_3_HEADER` (type 31:30, count 29:16 = body dwords - 1, opcode 15:8, shader_type bit 1,
  predicate bit 0; bits 7:2 reserved);
- bodies: the MEC packets of ROCm's PM4 headers for gfx10/gfx11 (`PM4_MEC_RELEASE_MEM`, `PM4_MEC_ACQUIRE_MEM`,
  `PM4_MEC_WAIT_REG_MEM`, `PM4_MEC_EVENT_WRITE`, `PM4_MEC_SET_SH_REG`, `PM4_MEC_DISPATCH_DIRECT`) and Linux nvd.h's
  field macros (GCR cache-control bits, INDIRECT_BUFFER control); enumerations from the same headers
  (`mec_release_mem_*_enum`, `PACKET3_WAIT_REG_MEM__FUNCTION__*`, VGT_EVENT_TYPE).
Each decoder checks the body length, that reserved bits are zero and that enumerated fields hold a defined value, and
returns the fields by name. tests/test_oracle.py compares these layouts with tinygrad's bindings of the headers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tiny_runtime_amd.mock.fields import ANY32, Field, Layout, PacketError

OPCODE_NAMES = {  # nvd.h PACKET3_* (the ones a compute queue may meet; for messages)
  0x10: "NOP", 0x15: "DISPATCH_DIRECT", 0x16: "DISPATCH_INDIRECT", 0x1E: "ATOMIC_MEM", 0x22: "COND_EXEC",
  0x37: "WRITE_DATA", 0x39: "MEM_SEMAPHORE", 0x3C: "WAIT_REG_MEM", 0x3F: "INDIRECT_BUFFER", 0x40: "COPY_DATA",
  0x46: "EVENT_WRITE", 0x49: "RELEASE_MEM", 0x50: "DMA_DATA", 0x58: "ACQUIRE_MEM", 0x5A: "INTERRUPT",
  0x76: "SET_SH_REG", 0x79: "SET_UCONFIG_REG", 0x93: "WAIT_REG_MEM64", 0x99: "AQL_PACKET", 0xA0: "SET_RESOURCES",
  0xA2: "MAP_QUEUES",
}

HEADER = Layout((Field("predicate", 0), Field("shader_type", 1, 1, {0: "GRAPHICS", 1: "COMPUTE"}),
                 Field("opcode", 8, 8), Field("count", 16, 14), Field("type", 30, 2)))

CACHE_POLICY = {0: "LRU", 1: "STREAM", 2: "NOA", 3: "BYPASS"}
# VGT_EVENT_TYPE values a compute queue uses (soc21 enum), for messages and checks
EVENT_TYPES = {4: "CACHE_FLUSH_TS", 6: "CACHE_FLUSH", 7: "CS_PARTIAL_FLUSH", 20: "CACHE_FLUSH_AND_INV_TS_EVENT",
               22: "CACHE_FLUSH_AND_INV_EVENT", 40: "BOTTOM_OF_PIPE_TS", 47: "CS_DONE"}

# SET_SH_REG dword 1: the register offset from 0x2C00 (REG_OFFSET 15:0), VMID_SHIFT 27:23, INDEX 31:28
SET_SH_REG_DW1 = Layout((Field("reg_offset", 0, 16), Field("vmid_shift", 23, 5),
                         Field("index", 28, 4, {0: "DEFAULT", 1: "INSERT_VMID"})))

# WAIT_REG_MEM (PM4_MEC_WAIT_REG_MEM: 6 body dwords)
WAIT_FUNCTIONS = {0: "ALWAYS", 1: "LT", 2: "LE", 3: "EQ", 4: "NE", 5: "GE", 6: "GT"}
WAIT_REG_MEM_DW1 = Layout((Field("function", 0, 3, WAIT_FUNCTIONS),
                           Field("mem_space", 4, 2, {0: "REGISTER", 1: "MEMORY"}),
                           Field("operation", 6, 2,
                                 {0: "WAIT_REG_MEM", 1: "WR_WAIT_WR_REG", 3: "WAIT_MEM_PREEMPTABLE"}),
                           Field("mes_intr_pipe", 22, 2), Field("mes_action", 24),
                           Field("cache_policy", 25, 2, CACHE_POLICY)))
ADDR_LO_DWORD = Layout((Field("addr_lo", 2, 30),))     # a dword-aligned address: bits 1:0 reserved
ADDR_LO_QWORD = Layout((Field("addr_lo", 3, 29),))     # a qword-aligned address: bits 2:0 reserved
REG_ADDR = Layout((Field("reg_addr", 0, 18),))
WAIT_REG_MEM_DW6 = Layout((Field("poll_interval", 0, 16), Field("optimize_ace_offload_mode", 31)))

# RELEASE_MEM (gfx11 PM4_MEC_RELEASE_MEM: 7 body dwords)
RELEASE_EVENT_INDEX = {5: "END_OF_PIPE", 6: "SHADER_DONE"}
GCR_SEQ = {0: "PARALLEL", 1: "FORWARD", 2: "REVERSE"}
RELEASE_MEM_DW1 = Layout((
  Field("event_type", 0, 6), Field("event_index", 8, 4, RELEASE_EVENT_INDEX),
  # gcr_cntl (12:24): nvd.h PACKET3_RELEASE_MEM_GCR_*
  Field("glm_wb", 12), Field("glm_inv", 13), Field("glv_inv", 14), Field("gl1_inv", 15), Field("gl2_us", 16),
  Field("gl2_range", 17, 2), Field("gl2_discard", 19), Field("gl2_inv", 20), Field("gl2_wb", 21),
  Field("seq", 22, 2, GCR_SEQ),
  Field("cache_policy", 25, 2, CACHE_POLICY), Field("execute", 28), Field("glk_inv", 30)))
DST_SEL = {0: "MEMORY_CONTROLLER", 1: "TC_L2", 2: "QUEUE_WRITE_POINTER_REGISTER",
           3: "QUEUE_WRITE_POINTER_POLL_MASK_BIT"}
INT_SEL = {0: "NONE", 1: "SEND_INTERRUPT_ONLY", 2: "SEND_INTERRUPT_AFTER_WRITE_CONFIRM",
           3: "SEND_DATA_AFTER_WRITE_CONFIRM", 4: "UNCONDITIONALLY_SEND_INT_CTXID",
           5: "CONDITIONALLY_SEND_INT_CTXID_BASED_ON_32_BIT_COMPARE",
           6: "CONDITIONALLY_SEND_INT_CTXID_BASED_ON_64_BIT_COMPARE"}
DATA_SEL = {0: "NONE", 1: "SEND_32_BIT_LOW", 2: "SEND_64_BIT_DATA", 3: "SEND_GPU_CLOCK_COUNTER",
            4: "SEND_CP_PERFCOUNTER_HI_LO", 5: "STORE_GDS_DATA_TO_MEMORY"}
RELEASE_MEM_DW2 = Layout((Field("dst_sel", 16, 2, DST_SEL), Field("mes_intr_pipe", 20, 2),
                          Field("mes_action_id", 22, 2), Field("int_sel", 24, 3, INT_SEL),
                          Field("data_sel", 29, 3, DATA_SEL)))

# ACQUIRE_MEM (gfx10+ PM4_MEC_ACQUIRE_MEM: 7 body dwords; dword 1 reserved)
ACQUIRE_MEM_DW1 = Layout(())
COHER_SIZE_HI = Layout((Field("coher_size_hi", 0, 8),))
COHER_BASE_HI = Layout((Field("coher_base_hi", 0, 24),))
POLL_INTERVAL = Layout((Field("poll_interval", 0, 16),))
GLI_INV = {0: "NOP", 1: "ALL", 2: "RANGE", 3: "FIRST_LAST"}
GCR_CNTL = Layout((  # nvd.h PACKET3_ACQUIRE_MEM_GCR_CNTL_*, 19 bits
  Field("gli_inv", 0, 2, GLI_INV), Field("gl1_range", 2, 2), Field("glm_wb", 4), Field("glm_inv", 5),
  Field("glk_wb", 6), Field("glk_inv", 7), Field("glv_inv", 8), Field("gl1_inv", 9), Field("gl2_us", 10),
  Field("gl2_range", 11, 2), Field("gl2_discard", 13), Field("gl2_inv", 14), Field("gl2_wb", 15),
  Field("seq", 16, 2, GCR_SEQ), Field("range_is_pa", 18)))

# EVENT_WRITE (PM4_MEC_EVENT_WRITE: 1 body dword without an address)
EVENT_WRITE_DW1 = Layout((Field("event_type", 0, 6),
                          Field("event_index", 8, 4, {0: "OTHER", 2: "SAMPLE_PIPELINESTAT", 4: "CS_PARTIAL_FLUSH",
                                                      8: "SAMPLE_STREAMOUTSTATS", 9: "SAMPLE_STREAMOUTSTATS1",
                                                      10: "SAMPLE_STREAMOUTSTATS2", 11: "SAMPLE_STREAMOUTSTATS3"}),
                          Field("offload_enable", 31)))

# INDIRECT_BUFFER (3 body dwords): a dword-aligned base, then IB_SIZE and the control bits (nvd.h)
IB_CONTROL = Layout((Field("ib_size", 0, 20), Field("chain", 20), Field("offload_polling", 21), Field("valid", 23),
                     Field("vmid", 24, 4), Field("cache_policy", 28, 2, CACHE_POLICY), Field("pre_resume", 30),
                     Field("priv", 31)))


@dataclass(frozen=True)
class Header:
  opcode: int
  name: str
  body: int        # body dwords
  shader_type: int


def decode_header(word: int, where: str) -> Header:
  """The type-3 header; PacketError for another packet type, the predicate bit or reserved bits."""
  if word >> 30 != 3:
    raise PacketError(f"{where}: PM4 packet type {word >> 30} (header {word:#010x}); a gfx10+ compute queue takes "
                      "type 3 packets only")
  f = HEADER.decode(word, f"{where}: PM4 header")
  if f["predicate"]:
    raise PacketError(f"{where}: PM4 header {word:#010x} sets PREDICATE (bit 0); no SET_PREDICATION is modelled")
  op = f["opcode"]
  return Header(op, OPCODE_NAMES.get(op, f"opcode {op:#x}"), f["count"] + 1, f["shader_type"])


def _len(name: str, body: list[int], n: int, where: str) -> None:
  if len(body) != n:
    raise PacketError(f"{where}: PM4 {name} has {len(body)} body dwords; it takes exactly {n}")


def _dw(layout: Layout, body: list[int], i: int, name: str, where: str) -> dict[str, int]:
  return layout.decode(body[i], f"{where}: PM4 {name} dword {i + 1}")


def decode_wait_reg_mem(body: list[int], where: str) -> dict[str, int]:
  _len("WAIT_REG_MEM", body, 6, where)
  f = _dw(WAIT_REG_MEM_DW1, body, 0, "WAIT_REG_MEM", where)
  if f["mem_space"] == 1:
    f["addr"] = (_dw(ADDR_LO_DWORD, body, 1, "WAIT_REG_MEM", where)["addr_lo"] << 2) | body[2] << 32
  else:  # registers: dword 1 the one written (operation WR_WAIT_WR_REG) or polled, dword 2 the one polled after a write
    f["addr"] = _dw(REG_ADDR, body, 1, "WAIT_REG_MEM", where)["reg_addr"]
    f["reg_done"] = _dw(REG_ADDR, body, 2, "WAIT_REG_MEM", where)["reg_addr"]
  f.update(reference=body[3], mask=body[4], **_dw(WAIT_REG_MEM_DW6, body, 5, "WAIT_REG_MEM", where))
  return f


def decode_release_mem(body: list[int], where: str) -> dict[str, int]:
  _len("RELEASE_MEM", body, 7, where)
  f = _dw(RELEASE_MEM_DW1, body, 0, "RELEASE_MEM", where)
  f.update(_dw(RELEASE_MEM_DW2, body, 1, "RELEASE_MEM", where))
  # the address: dword aligned for 32-bit data, qword aligned for 64-bit data and timestamps (address_lo_32b/_64b)
  lo = ADDR_LO_QWORD if f["data_sel"] in (2, 3) else ADDR_LO_DWORD
  f["addr"] = body[2] | (body[3] << 32)
  _dw(lo, body, 2, "RELEASE_MEM", where)
  f.update(data=body[4] | (body[5] << 32), int_ctxid=body[6])
  return f


def coher_size_hi(layout: Layout, body: list[int], i: int, where: str) -> int:
  """ACQUIRE_MEM's COHER_SIZE_HI (body dword `i`, COHER_SIZE before it). "All memory" is written with more ones than
  the field has: amdgpu's gfx_v11_0_emit_mem_sync puts 0xffffff in gfx11's 8-bit field, tinygrad 0xffffffff in gfx11's
  and gfx9's (24 bits); the CP takes the field's bits. So a full-range size (COHER_SIZE and the field all ones) may set
  the bits above the field; any other size must leave them 0."""
  ones = (1 << layout.fields[0].width) - 1
  if body[i - 1] == 0xFFFFFFFF and body[i] & ones == ones: return ones
  return _dw(layout, body, i, "ACQUIRE_MEM", where)[layout.fields[0].name]


def decode_acquire_mem(body: list[int], where: str) -> dict[str, int]:
  _len("ACQUIRE_MEM", body, 7, where)
  _dw(ACQUIRE_MEM_DW1, body, 0, "ACQUIRE_MEM", where)
  f = {"coher_size": body[1] | (coher_size_hi(COHER_SIZE_HI, body, 2, where) << 32),
       "coher_base": body[3] | (_dw(COHER_BASE_HI, body, 4, "ACQUIRE_MEM", where)["coher_base_hi"] << 32)}
  f.update(_dw(POLL_INTERVAL, body, 5, "ACQUIRE_MEM", where))
  f.update(_dw(GCR_CNTL, body, 6, "ACQUIRE_MEM", where))
  return f


def decode_event_write(body: list[int], where: str) -> dict[str, int]:
  _len("EVENT_WRITE", body, 1, where)
  return _dw(EVENT_WRITE_DW1, body, 0, "EVENT_WRITE", where)


def decode_indirect_buffer(body: list[int], where: str) -> dict[str, int]:
  _len("INDIRECT_BUFFER", body, 3, where)
  f = {"addr": (_dw(ADDR_LO_DWORD, body, 0, "INDIRECT_BUFFER", where)["addr_lo"] << 2) | (body[1] << 32)}
  f.update(_dw(IB_CONTROL, body, 2, "INDIRECT_BUFFER", where))
  return f


def decode_set_sh_reg(body: list[int], where: str) -> dict[str, int]:
  if len(body) < 2: raise PacketError(f"{where}: PM4 SET_SH_REG has {len(body)} body dwords; it takes 2 or more")
  return _dw(SET_SH_REG_DW1, body, 0, "SET_SH_REG", where)


def decode_dispatch_direct(body: list[int], where: str) -> dict[str, int]:
  _len("DISPATCH_DIRECT", body, 4, where)
  return {"dim_x": body[0], "dim_y": body[1], "dim_z": body[2], "initiator": body[3]}


DECODERS: dict[int, Callable[[list[int], str], dict[str, int]]] = {
  0x3C: decode_wait_reg_mem, 0x49: decode_release_mem, 0x58: decode_acquire_mem, 0x46: decode_event_write,
  0x3F: decode_indirect_buffer, 0x76: decode_set_sh_reg, 0x15: decode_dispatch_direct,
}

__all__ = ["ANY32", "decode_header", "DECODERS", "OPCODE_NAMES", "EVENT_TYPES"]
