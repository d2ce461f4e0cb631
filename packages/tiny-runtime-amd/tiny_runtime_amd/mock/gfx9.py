"""The gfx9 (CDNA3, MI300 / gfx942) parts of the mock: gc_9_4_3's compute registers, the gfx9 forms of RELEASE_MEM and
ACQUIRE_MEM, a gfx942 topology node, and DISPATCH_DIRECT launching wave64 waves in the CDNA3 emulator
(`emu/cdna3.py`).

Sources (read for facts; tests/test_oracle_gfx9.py compares every register, field and packet layout here with
tinygrad 0.14.0's bindings of the same headers, `autogen/am/regs.py` gc_9_4_3 and `autogen/am/pm4_soc15.py`):
- registers: gc_9_4_3_offset.h / _sh_mask.h (`regCOMPUTE_*`, GC segment-0 base 0x2000 on gfx9, in dwords);
- packets: Linux soc15d.h (PACKET3_RELEASE_MEM with the EOP_* cache actions, PACKET3_ACQUIRE_MEM with CP_COHER_CNTL,
  6 body dwords) and the cache actions amdgpu's gfx_v9_0/gfx_v9_4_3 fence and mem-sync program;
- the node: what KFD's topology reports for an MI300X partition in CPX mode (one XCC per node: 38 CUs of 4 SIMDs,
  wave64, gfx_target_version 90402, num_xcc 1). In SPX mode (how MI300X ships) one node spans 8 XCCs (num_xcc 8,
  `gfx942_spx`): an AQL queue runs on every XCC, but a PM4 queue "will be only processed in one XCC" (amdkfd "Add PM4
  target XCC"), the one queue_percentage bits 15:8 name (CREATE_QUEUE refuses an XCC the node lacks), so its
  dispatches run on that XCC's 38 CUs and its fences need no cross-XCC barrier.
- the L2 after an SDMA copy (decided from the kernel sources, issue #32): what a GPU's L2 does with a line depends on
  the MTYPE of the page, which amdgpu picks per mapping in gmc_v9_0.c `gmc_v9_0_get_coherence_flags` (case
  IP_VERSION(9, 4, 3), a dGPU): KFD's UNCACHED (AMDGPU_GEM_CREATE_UNCACHED) -> UC; VRAM of the mapping GPU ->
  `mtype_local`, MTYPE_RW by default (amdgpu_drv.c `amdgpu_mtype_local` 0); EXT_COHERENT: local VRAM CC, else UC;
  another GPU's VRAM -> NC; GTT / userptr (system memory) -> UC; `snoop` set on every mapping. UC is never cached in L2.
  RW and CC lines are probe-invalidated by snooped writes, and mmhub_v1_8.c `mmhub_v1_8_init_snoop_override_regs` forces
  the SDMA write client snooped ("SDMA writes probe-invalidates RW lines", amdgpu "Set snoop bit for SDMA for MI
  series"; LLVM AMDGPUUsage, GFX942 memory model: local-memory L2 lines are invalidated by coherent writes of other
  agents). NC lines (another GPU's VRAM) are not: that GPU's L2 may keep a stale copy until a TC invalidate. So on
  gfx942 an SDMA copy into a GPU's own VRAM or into system memory leaves its L2 valid (tinygrad's HCQ graph relies on
  it: only the CU caches are invalidated between the copy and the kernel), and one into a peer's VRAM does not.
Wave launch on gfx90a+ (LLVM AMDGPUUsage "Initial Kernel Execution State"): user SGPRs, then the enabled work-group
ids, then the private segment wave offset (SCRATCH_EN); work-item ids packed in v0 (x | y << 10 | z << 20).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tiny_runtime_amd import kfd
from tiny_runtime_amd.emu.cdna3 import CDNA3Emulator
from tiny_runtime_amd.mock import pm4 as mpm4
from tiny_runtime_amd.mock import sdma as msdma
from tiny_runtime_amd.mock.fields import Field, Layout, require
from tiny_runtime_amd.mock.gfx11 import PERFCOUNT, PIPELINESTAT, RESTART, GFX11, _layout, run_groups
from tiny_runtime_amd.mock.gpu import ARCHS, CheckedMemory, GPUHang, MockGPU, MockQueue

if TYPE_CHECKING:
  from tiny_runtime_amd.mock.driver import MockAlloc

WAVE = 64
GC_BASE_GFX9 = 0x2000  # soc15 GC_BASE.instance[0].segment[0] on gfx9 (dwords)


def _reg(dword: int) -> int: return (GC_BASE_GFX9 + dword) * 4


DISPATCH_INITIATOR = _layout(
  compute_shader_en=(0, 0), partial_tg_en=(1, 1), force_start_at_000=(2, 2), ordered_append_enbl=(3, 3),
  ordered_append_mode=(4, 4), use_thread_dimensions=(5, 5), order_mode=(6, 6), scalar_l1_inv_vol=(10, 10),
  vector_l1_inv_vol=(11, 11), reserved=(12, 12), restore=(14, 14))
RSRC1 = _layout(vgprs=(0, 5), sgprs=(6, 9), priority=(10, 11), float_mode=(12, 19), priv=(20, 20), dx10_clamp=(21, 21),
                debug_mode=(22, 22), ieee_mode=(23, 23), bulky=(24, 24), cdbg_user=(25, 25), fp16_ovfl=(26, 26))
RSRC2 = _layout(scratch_en=(0, 0), user_sgpr=(1, 5), trap_present=(6, 6), tgid_x_en=(7, 7), tgid_y_en=(8, 8),
                tgid_z_en=(9, 9), tg_size_en=(10, 10), tidig_comp_cnt=(11, 12), excp_en_msb=(13, 14),
                lds_size=(15, 23), excp_en=(24, 30), skip_usgpr0=(31, 31))
RSRC3 = _layout(accum_offset=(0, 5), trap_on_start=(10, 10), trap_on_end=(11, 11), tg_split=(16, 16))
NUM_THREAD = _layout(num_thread_full=(0, 15), num_thread_partial=(16, 31))
TMPRING_SIZE = _layout(waves=(0, 11), wavesize=(12, 24))
RESOURCE_LIMITS = _layout(waves_per_sh=(0, 9), tg_per_cu=(12, 15), lock_threshold=(16, 21), simd_dest_cntl=(22, 22),
                          force_simd_dist=(23, 23), cu_group_count=(24, 26), simd_disable=(27, 30))
DATA32, DATA8, START = _layout(data=(0, 31)), _layout(data=(0, 7)), _layout(start=(0, 31))

SH_REGISTERS: dict[int, tuple[str, Layout]] = {  # byte address -> (regCOMPUTE_* name, fields), gc_9_4_3
  _reg(0xE04): ("COMPUTE_START_X", START), _reg(0xE05): ("COMPUTE_START_Y", START),
  _reg(0xE06): ("COMPUTE_START_Z", START), _reg(0xE07): ("COMPUTE_NUM_THREAD_X", NUM_THREAD),
  _reg(0xE08): ("COMPUTE_NUM_THREAD_Y", NUM_THREAD), _reg(0xE09): ("COMPUTE_NUM_THREAD_Z", NUM_THREAD),
  _reg(0xE0A): ("COMPUTE_PIPELINESTAT_ENABLE", PIPELINESTAT), _reg(0xE0B): ("COMPUTE_PERFCOUNT_ENABLE", PERFCOUNT),
  _reg(0xE1B): ("COMPUTE_RESTART_X", RESTART), _reg(0xE1C): ("COMPUTE_RESTART_Y", RESTART),
  _reg(0xE1D): ("COMPUTE_RESTART_Z", RESTART),
  _reg(0xE0C): ("COMPUTE_PGM_LO", DATA32), _reg(0xE0D): ("COMPUTE_PGM_HI", DATA8),
  _reg(0xE10): ("COMPUTE_DISPATCH_SCRATCH_BASE_LO", DATA32), _reg(0xE11): ("COMPUTE_DISPATCH_SCRATCH_BASE_HI", DATA8),
  _reg(0xE12): ("COMPUTE_PGM_RSRC1", RSRC1), _reg(0xE13): ("COMPUTE_PGM_RSRC2", RSRC2),
  _reg(0xE15): ("COMPUTE_RESOURCE_LIMITS", RESOURCE_LIMITS), _reg(0xE18): ("COMPUTE_TMPRING_SIZE", TMPRING_SIZE),
  _reg(0xE2D): ("COMPUTE_PGM_RSRC3", RSRC3),
  **{_reg(0xE40 + i): (f"COMPUTE_USER_DATA_{i}", DATA32) for i in range(16)},
}
REG = {name: addr for addr, (name, _) in SH_REGISTERS.items()}

# gfx9 RELEASE_MEM dword 1 (soc15d.h / PM4_MEC_RELEASE_MEM for gfx9): event, EOP cache actions, cache policy
RELEASE_MEM_DW1 = Layout((
  Field("event_type", 0, 6), Field("event_index", 8, 4, mpm4.RELEASE_EVENT_INDEX), Field("tcl1_vol_action_ena", 12),
  Field("tc_vol_action_ena", 13), Field("tc_wb_action_ena", 15), Field("tcl1_action_ena", 16),
  Field("tc_action_ena", 17), Field("tc_nc_action_ena", 19), Field("tc_wc_action_ena", 20),
  Field("tc_md_action_ena", 21), Field("cache_policy", 25, 2, mpm4.CACHE_POLICY), Field("execute", 28)))
RELEASE_MEM_DW2 = Layout((Field("dst_sel", 16, 2, mpm4.DST_SEL), Field("int_sel", 24, 3, mpm4.INT_SEL),
                          Field("data_sel", 29, 3, mpm4.DATA_SEL)))
# gfx9 ACQUIRE_MEM dword 1: CP_COHER_CNTL (soc15d.h PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_*); COHER_SIZE_HI is 24 bits
COHER_CNTL = Layout((
  Field("tc_nc_action_ena", 3), Field("tc_wc_action_ena", 4), Field("tc_inv_metadata_action_ena", 5),
  Field("tcl1_vol_action_ena", 15), Field("tc_wb_action_ena", 18), Field("tcl1_action_ena", 22),
  Field("tc_action_ena", 23), Field("cb_action_ena", 25), Field("db_action_ena", 26),
  Field("sh_kcache_action_ena", 27), Field("sh_kcache_vol_action_ena", 28), Field("sh_icache_action_ena", 29),
  Field("sh_kcache_wb_action_ena", 30)))
COHER_SIZE_HI = Layout((Field("coher_size_hi", 0, 24),))


def decode_release_mem9(body: list[int], where: str) -> dict[str, int]:
  mpm4._len("RELEASE_MEM", body, 7, where)
  f = mpm4._dw(RELEASE_MEM_DW1, body, 0, "RELEASE_MEM", where)
  f.update(mpm4._dw(RELEASE_MEM_DW2, body, 1, "RELEASE_MEM", where))
  f["addr"] = body[2] | (body[3] << 32)
  mpm4._dw(mpm4.ADDR_LO_QWORD if f["data_sel"] in (2, 3) else mpm4.ADDR_LO_DWORD, body, 2, "RELEASE_MEM", where)
  f.update(data=body[4] | (body[5] << 32), int_ctxid=body[6])
  return f


def decode_acquire_mem9(body: list[int], where: str) -> dict[str, int]:
  mpm4._len("ACQUIRE_MEM", body, 6, where)
  f = mpm4._dw(COHER_CNTL, body, 0, "ACQUIRE_MEM", where)
  f["coher_size"] = body[1] | (mpm4.coher_size_hi(COHER_SIZE_HI, body, 2, where) << 32)
  f["coher_base"] = body[3] | (mpm4._dw(mpm4.COHER_BASE_HI, body, 4, "ACQUIRE_MEM", where)["coher_base_hi"] << 32)
  f.update(mpm4._dw(mpm4.POLL_INTERVAL, body, 5, "ACQUIRE_MEM", where))
  return f


DECODERS9 = {**mpm4.DECODERS, 0x49: decode_release_mem9, 0x58: decode_acquire_mem9}

# MI300X in CPX mode: each XCC is a KFD node of its own (38 CUs, 4 SIMDs each)
GFX942_PROPERTIES = {
  "cpu_cores_count": 0, "simd_count": 152, "simd_per_cu": 4, "max_waves_per_simd": 8, "lds_size_in_kb": 64,
  "gfx_target_version": 90402, "vendor_id": 0x1002, "device_id": 0x74A1, "wave_front_size": 64,
  "array_count": 4, "simd_arrays_per_engine": 1, "cu_per_simd_array": 10, "max_slots_scratch_cu": 32,
  "num_sdma_engines": 2, "num_gws": 64, "num_xcc": 1,
}


class GFX9(GFX11):
  """A gfx942 (CDNA3) GPU: PM4 compute queues with the gfx9 packet forms, wave64 dispatches in the CDNA3 emulator."""
  arch = "gfx942"
  properties = GFX942_PROPERTIES
  ip_versions = {11: (9, 4, 3), 42: (4, 4, 2), 108: (7, 9, 0)}  # MI300: GC 9.4.3, SDMA 4.4.2, NBIO 7.9.0
  sdma_layouts = msdma.LAYOUTS_V4
  sh_registers = SH_REGISTERS
  needs_priv_with_cwsr = False
  sdma_writes_through_l2 = False  # SDMA v4.4.2 reaches memory through the MMHUB, not through the GC's L2 (TCC)
  sdma_writes_snooped = True  # mmhub_v1_8.c mmhub_v1_8_init_snoop_override_regs (module docstring)
  pm4_decoders = DECODERS9

  def l2_mtype(self, alloc: MockAlloc | None) -> str:
    """The MTYPE `alloc` gets in this GPU's VM: gmc_v9_0.c gmc_v9_0_get_coherence_flags, IP_VERSION(9, 4, 3), dGPU,
    amdgpu_mtype_local at its default (RW). Memory the mock does not know is taken as NC (cached, not coherent)."""
    if alloc is None: return "NC"
    if alloc.flags & kfd.ALLOC_UNCACHED: return "UC"  # AMDGPU_GEM_CREATE_UNCACHED
    local = bool(alloc.flags & kfd.ALLOC_VRAM) and alloc.owner is self  # is_local: VRAM of this device
    if alloc.flags & kfd.ALLOC_EXT_COHERENT: return "CC" if local else "UC"  # ext_coherent (rev_id > 0, MI300X)
    if not alloc.flags & kfd.ALLOC_VRAM: return "UC"  # system memory on a dGPU: not local, not VRAM
    return "RW" if local else "NC"                    # local -> mtype_local; remote VRAM -> NC

  def l2_coherent_after_sdma_write(self, copier: MockGPU, alloc: MockAlloc | None) -> bool:
    """UC lines are never in L2; RW and CC lines are probe-invalidated by a snooped SDMA write; NC lines stay
    stale."""
    mtype = self.l2_mtype(alloc)
    return mtype == "UC" or (mtype in ("RW", "CC") and copier.sdma_writes_snooped)

  def make_emulator(self) -> Any: return CDNA3Emulator(CheckedMemory(self))

  def reg(self, q: MockQueue, name: str) -> dict[str, int]:
    addr = REG[name]
    return SH_REGISTERS[addr][1].decode(q.regs.get(addr, 0), name)

  def _release_mem(self, f: dict[str, int], where: str) -> None:
    ev, idx = f["event_type"], f["event_index"]
    eop = {5: (4, 20, 40), 6: (47,)}[idx]
    require(ev in eop, where, f"EVENT_TYPE {ev} ({mpm4.EVENT_TYPES.get(ev, 'not a compute event')}) with EVENT_INDEX "
            f"{idx}; valid: {', '.join(f'{e} {mpm4.EVENT_TYPES[e]}' for e in eop)}")
    require(f["execute"] == 0, where, "EXECUTE = 1 is not modelled")
    require(f["dst_sel"] in (0, 1), where, f"DST_SEL {mpm4.DST_SEL[f['dst_sel']]} is not modelled")
    require(f["data_sel"] <= 3, where, f"DATA_SEL {mpm4.DATA_SEL[f['data_sel']]} is not modelled")
    require(f["int_sel"] in (0, 2), where, f"INT_SEL {f['int_sel']} ({mpm4.INT_SEL[f['int_sel']]}) is not modelled; "
            "KFD reads the event mailbox in the interrupt handler, so the interrupt must follow the confirmed write "
            "(2, SEND_INTERRUPT_AFTER_WRITE_CONFIRM)")
    # a write-back: amdgpu's gfx_v9_0_ring_emit_fence sets EOP_TC_WB with either the invalidating actions (TC, TCL1,
    # TC_MD) or, for a write-back-only fence (AMDGPU_FENCE_FLAG_TC_WB_ONLY), EOP_TC_NC (what tinygrad's signal uses)
    if f["tc_wb_action_ena"] and (f["tc_action_ena"] or f["tc_nc_action_ena"]): self.write_back_l2()
    self._release_write(f, where, "amdgpu's gfx9 fence writes back: EOP TC_WB with TC (and TCL1, TC_MD) or TC_NC")

  def _acquire_mem(self, f: dict[str, int], where: str) -> None:
    require(f["cb_action_ena"] == 0 and f["db_action_ena"] == 0, where, "CB/DB actions on a compute queue")
    require(f["coher_base"] == 0 and f["coher_size"] >= (1 << 40) - 1, where, f"COHER_BASE {f['coher_base']:#x} / "
            f"COHER_SIZE {f['coher_size']:#x} (in 256-byte units): only actions over the whole address space are "
            "modelled")
    if f["tc_wb_action_ena"]: self.write_back_l2()
    if f["sh_kcache_action_ena"] and f["tcl1_action_ena"]:  # the CU-side caches (scalar K$, vector TCL1)
      self.cu_caches_valid = True
      if f["sh_icache_action_ena"] and f["tc_action_ena"]: self.caches_valid = True

  def dispatch(self, q: MockQueue, dims: tuple[int, int, int], initiator: int, where: str) -> None:
    """DISPATCH_DIRECT: check the dispatch state, then run every wave64 of every work-group in the emulator."""
    ini = DISPATCH_INITIATOR.decode(initiator, f"{where} dword 4 (COMPUTE_DISPATCH_INITIATOR)")
    require(ini["compute_shader_en"] == 1, where, "COMPUTE_SHADER_EN = 0: nothing would run")
    for k in ("partial_tg_en", "ordered_append_enbl", "ordered_append_mode", "use_thread_dimensions", "order_mode",
              "reserved", "restore"):
      require(ini[k] == 0, where, f"DISPATCH_INITIATOR.{k.upper()} = 1 is not modelled")
    if not ini["force_start_at_000"]:
      starts = [self.reg(q, f"COMPUTE_START_{a}")["start"] for a in "XYZ"]
      require(starts == [0, 0, 0], where, f"COMPUTE_START_X/Y/Z = {starts}: only dispatches from group 0 are modelled")
    self.check_restart(q, where)
    r2, r3 = self.reg(q, "COMPUTE_PGM_RSRC2"), self.reg(q, "COMPUTE_PGM_RSRC3")
    self.reg(q, "COMPUTE_PGM_RSRC1")
    for k in ("trap_present", "tg_size_en", "excp_en_msb", "excp_en", "skip_usgpr0"):
      require(r2[k] == 0, where, f"COMPUTE_PGM_RSRC2.{k.upper()} = {r2[k]} is not modelled")
    require(r3["trap_on_start"] == 0 and r3["trap_on_end"] == 0 and r3["tg_split"] == 0, where,
            "COMPUTE_PGM_RSRC3 TRAP_ON_START/END, TG_SPLIT: not modelled")
    local = [self.reg(q, f"COMPUTE_NUM_THREAD_{a}") for a in "XYZ"]
    require(all(n["num_thread_partial"] == 0 for n in local), where, "partial work-groups are not modelled")
    lx, ly, lz = (n["num_thread_full"] for n in local)
    threads = lx * ly * lz
    require(0 < threads <= 1024, where, f"a work-group of {lx}x{ly}x{lz} work-items; valid: 1..1024")
    lds_bytes = r2["lds_size"] * 512  # 128-dword granules (AMDGPUUsage: GFX7-GFX11)
    require(lds_bytes <= self.props["lds_size_in_kb"] << 10, where, f"LDS_SIZE {r2['lds_size']} asks for {lds_bytes} "
            f"bytes of LDS; a work-group has {self.props['lds_size_in_kb']} KiB")
    entry = ((self.reg(q, "COMPUTE_PGM_HI")["data"] << 32) | self.reg(q, "COMPUTE_PGM_LO")["data"]) << 8
    self.check(entry, 4, "instruction fetch")
    n_waves = (threads + WAVE - 1) // WAVE
    scratch = self.scratch_setup9(q, n_waves, where) if r2["scratch_en"] else None
    n_user, tgid_en = r2["user_sgpr"], (r2["tgid_x_en"], r2["tgid_y_en"], r2["tgid_z_en"])
    user = [q.regs.get(REG[f"COMPUTE_USER_DATA_{i}"], 0) for i in range(n_user)]
    self.emu.begin_dispatch()
    wave_offset = None
    if scratch is not None:  # the private segment wave offset: this wave's slot
      def slot(gid: Any, wv: Any) -> Any: return np.broadcast_to(wv * scratch, np.broadcast(gid, wv).shape)
      wave_offset = (slot, scratch // WAVE)
    run_groups(self.emu, entry, dims, (lx, ly, lz), WAVE, user, tgid_en, lds_bytes, wave_offset)

  def scratch_setup9(self, q: MockQueue, n_waves: int, where: str) -> int:
    """SCRATCH_EN on gfx9: COMPUTE_DISPATCH_SCRATCH_BASE must hold WAVES * WAVESIZE KiB; the bytes per wave."""
    tmp = self.reg(q, "COMPUTE_TMPRING_SIZE")
    slots, wave_bytes = tmp["waves"], tmp["wavesize"] * 1024
    require(slots > 0 and wave_bytes > 0, where, f"SCRATCH_EN with COMPUTE_TMPRING_SIZE WAVES={slots} "
            f"WAVESIZE={tmp['wavesize']} (both must be nonzero)")
    if n_waves > slots:
      raise GPUHang(f"{where}: a work-group of {n_waves} waves needs that many scratch slots but TMPRING_SIZE.WAVES "
                    f"is {slots}: the dispatch would never start")
    base = ((self.reg(q, "COMPUTE_DISPATCH_SCRATCH_BASE_HI")["data"] << 32) |
            self.reg(q, "COMPUTE_DISPATCH_SCRATCH_BASE_LO")["data"]) << 8
    self.check(base, slots * wave_bytes, f"scratch ({slots} wave slots x {wave_bytes} bytes)")
    return wave_bytes


class GFX9SPX(GFX9):
  """A gfx942 node in SPX mode: one KFD node over all 8 XCCs (num_xcc 8, 304 CUs). A PM4 queue runs on its target
  XCC only (see the module docstring)."""
  arch = "gfx942"
  properties = {**GFX942_PROPERTIES, "simd_count": 1216, "array_count": 32, "num_xcc": 8}


ARCHS["gfx942"] = GFX9
ARCHS["gfx942_spx"] = GFX9SPX
