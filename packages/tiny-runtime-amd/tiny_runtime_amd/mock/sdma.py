"""Strict decoding of SDMA v6 (gfx11) packets, written from Linux `sdma_v6_0_0_pkt_open.h` (`SDMA_PKT_*` field offset /
mask / shift definitions) independently of the driver's encoders in `tiny_runtime_amd/sdma.py`.

Every packet's header is op (7:0) and sub-op (15:8) plus the op's own fields; a bit no field covers is reserved and
must be zero. `decode(words, where)` takes the dwords from the header on and returns (name, dwords, fields), or raises
PacketError naming the packet, dword and field. tests/test_oracle.py compares each dword's fields (and so its reserved
bits) with tinygrad's bindings of the header (`autogen/am/sdma_6_0_0.py`).
"""
from __future__ import annotations

from tiny_runtime_amd.mock.fields import Field, Layout, PacketError

OP_NAMES = {0: "NOP", 1: "COPY", 2: "WRITE", 4: "INDIRECT", 5: "FENCE", 6: "TRAP", 7: "SEM", 8: "POLL_REGMEM",
            9: "COND_EXE", 10: "ATOMIC", 11: "CONST_FILL", 12: "PTEPDE", 13: "TIMESTAMP", 14: "SRBM_WRITE",
            15: "PRE_EXE", 16: "GPUVM_INV", 17: "GCR_REQ"}

OP, SUB_OP = Field("op", 0, 8), Field("sub_op", 8, 8)
FUNCS = {0: "ALWAYS", 1: "LT", 2: "LE", 3: "EQ", 4: "NE", 5: "GE", 6: "GT"}

# per packet: the layout of each dword (index 0 = the header); None: a full 32-bit value
LAYOUTS: dict[str, tuple[Layout | None, ...]] = {
  "NOP": (Layout((OP, SUB_OP, Field("count", 16, 14))),),
  "COPY_LINEAR": (
    Layout((OP, SUB_OP, Field("encrypt", 16), Field("tmz", 18), Field("cpv", 19), Field("backwards", 25),
            Field("broadcast", 27))),
    Layout((Field("count", 0, 30),)),
    Layout((Field("dst_sw", 16, 2), Field("dst_cache_policy", 18, 3), Field("src_sw", 24, 2),
            Field("src_cache_policy", 26, 3))),
    None, None, None, None),
  "FENCE": (
    Layout((OP, SUB_OP, Field("mtype", 16, 3), Field("gcc", 19), Field("sys", 20), Field("snp", 22), Field("gpa", 23),
            Field("l2_policy", 24, 2), Field("llc_policy", 26), Field("cpv", 28))),
    None, None, None),
  "TRAP": (Layout((OP, SUB_OP)), Layout((Field("int_context", 0, 28),))),
  "POLL_REGMEM": (
    Layout((OP, SUB_OP, Field("cache_policy", 20, 3), Field("cpv", 24), Field("hdp_flush", 26),
            Field("func", 28, 3, FUNCS), Field("mem_poll", 31))),
    None, None, None, None,
    Layout((Field("interval", 0, 16), Field("retry_count", 16, 12)))),
  "TIMESTAMP_GET_GLOBAL": (
    Layout((OP, SUB_OP, Field("l2_policy", 24, 2), Field("llc_policy", 26), Field("cpv", 28))),
    Layout((Field("write_addr_31_3", 3, 29),)), None),
}
LAYOUTS["TIMESTAMP_GET"] = LAYOUTS["TIMESTAMP_GET_GLOBAL"]
# SDMA v4.4.2 (gfx942), where it differs for the packets modelled: its FENCE header is op and sub-op only (Linux
# `sdma_v4_4_2_pkt_open.h` SDMA_PKT_FENCE_HEADER; `sdma_v4_4_2_ring_emit_fence` writes the bare op), so the MTYPE bits
# of SDMA v5+ are reserved there
LAYOUTS_V4 = {**LAYOUTS, "FENCE": (Layout((OP, SUB_OP)), None, None, None)}
MTYPE_UC = 3  # amdgpu's AMDGPU_MTYPE_UC; sdma_v5_0/v5_2/v6_0/v7_0_ring_emit_fence: SDMA_PKT_FENCE_HEADER_MTYPE(0x3)
# (op, sub_op) -> packet
PACKETS = {(0, 0): "NOP", (1, 0): "COPY_LINEAR", (5, 0): "FENCE", (6, 0): "TRAP", (8, 0): "POLL_REGMEM",
           (13, 1): "TIMESTAMP_GET", (13, 2): "TIMESTAMP_GET_GLOBAL"}


def packet_of(header: int, where: str) -> tuple[str, int]:
  """(packet name, dwords) of the packet this header starts; PacketError for an op/sub-op the mock doesn't model."""
  op, sub = header & 0xFF, (header >> 8) & 0xFF
  if (name := PACKETS.get((op, sub))) is None:
    what = OP_NAMES.get(op, "an undefined op")
    raise PacketError(f"{where}: SDMA op {op} ({what}) sub-op {sub} (header {header:#010x}) is not modelled; "
                      f"modelled: {', '.join(f'{n} (op {o}, sub-op {s})' for (o, s), n in PACKETS.items())}")
  n = 1 + ((header >> 16) & 0x3FFF) if name == "NOP" else len(LAYOUTS[name])
  return name, n


def decode(name: str, words: list[int], where: str,
           layouts: dict[str, tuple[Layout | None, ...]] = LAYOUTS) -> dict[str, int]:
  """The fields of packet `name` (words[0] is its header): dword i's layout fields, plus `dw<i>` for full values
  (`layouts`: the SDMA version's, LAYOUTS for v6 or LAYOUTS_V4)."""
  out: dict[str, int] = {}
  for i, (lay, w) in enumerate(zip(layouts[name], words)):
    if lay is None: out[f"dw{i}"] = w
    else: out.update(lay.decode(w, f"{where}: SDMA {name} dword {i}"))
  return out
