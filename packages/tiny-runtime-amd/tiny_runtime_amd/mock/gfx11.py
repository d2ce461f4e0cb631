"""The gfx11 (RDNA3) parts of the mock: gc_11_0_0's compute registers, a gfx1100 topology node, and DISPATCH_DIRECT
launching wave32 waves in the RDNA3 emulator (`emu/rdna3.py`).

Register byte addresses and fields: gc_11_0_0_offset.h / gc_11_0_0_sh_mask.h (`regCOMPUTE_*` + the GC segment-0 base
0x1260, in dwords; field names as there, lower case); tests/test_oracle.py compares every register and field here with
tinygrad's `autogen/am/regs.py` (`gc_11_0_0`). Wave launch (what the SPI puts in a wave's registers): the user SGPRs
(COMPUTE_USER_DATA_*), then the enabled work-group ids, then the private segment wave offset with SCRATCH_EN; work-item
ids packed in v0 (x | y << 10 | z << 20) on gfx11. Scratch on gfx11: TMPRING_SIZE.WAVES counts one shader engine's
wave slots, each engine's waves address their own WAVES * WAVESIZE * 256-byte slice of the scratch buffer.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tiny_runtime_amd import kfd
from tiny_runtime_amd.emu.batch import MAX_LANES, Launch
from tiny_runtime_amd.emu.rdna3 import Emulator
from tiny_runtime_amd.mock.fields import Field, Layout, PacketError, require
from tiny_runtime_amd.mock.gpu import ARCHS, CheckedMemory, GPUHang, MockGPU, MockQueue

LDS_GRANULE = 512   # COMPUTE_PGM_RSRC2.LDS_SIZE unit on gfx10+ (128 dwords)
WAVE = 32


def _layout(**fields: tuple[int, int]) -> Layout:
  """A register layout from name=(low bit, high bit), as the sh_mask header lists them."""
  return Layout(tuple(Field(n, lo, hi - lo + 1) for n, (lo, hi) in fields.items()))


DISPATCH_INITIATOR = _layout(
  compute_shader_en=(0, 0), partial_tg_en=(1, 1), force_start_at_000=(2, 2), ordered_append_enbl=(3, 3),
  ordered_append_mode=(4, 4), use_thread_dimensions=(5, 5), order_mode=(6, 6), scalar_l1_inv_vol=(10, 10),
  vector_l1_inv_vol=(11, 11), reserved=(12, 12), tunnel_enable=(13, 13), restore=(14, 14), cs_w32_en=(15, 15),
  amp_shader_en=(16, 16), disable_disp_prempt_en=(17, 17))
RSRC1 = _layout(vgprs=(0, 5), sgprs=(6, 9), priority=(10, 11), float_mode=(12, 19), priv=(20, 20), dx10_clamp=(21, 21),
                ieee_mode=(23, 23), bulky=(24, 24), fp16_ovfl=(26, 26), wgp_mode=(29, 29), mem_ordered=(30, 30),
                fwd_progress=(31, 31))
RSRC2 = _layout(scratch_en=(0, 0), user_sgpr=(1, 5), trap_present=(6, 6), tgid_x_en=(7, 7), tgid_y_en=(8, 8),
                tgid_z_en=(9, 9), tg_size_en=(10, 10), tidig_comp_cnt=(11, 12), excp_en_msb=(13, 14),
                lds_size=(15, 23), excp_en=(24, 30))
RSRC3 = _layout(shared_vgpr_cnt=(0, 3), inst_pref_size=(4, 9), trap_on_start=(10, 10), trap_on_end=(11, 11),
                image_op=(31, 31))
NUM_THREAD = _layout(num_thread_full=(0, 15), num_thread_partial=(16, 31))
TMPRING_SIZE = _layout(waves=(0, 11), wavesize=(12, 26))
RESOURCE_LIMITS = _layout(waves_per_sh=(0, 9), tg_per_cu=(12, 15), lock_threshold=(16, 21), simd_dest_cntl=(22, 22),
                          force_simd_dist=(23, 23), cu_group_count=(24, 26))
DATA32, DATA8 = _layout(data=(0, 31)), _layout(data=(0, 7))
START = _layout(start=(0, 31))
RESTART = _layout(restart=(0, 31))  # the group a preempted dispatch resumes at (CWSR restore); 0 for a new one
PIPELINESTAT, PERFCOUNT = _layout(pipelinestat_enable=(0, 0)), _layout(perfcount_enable=(0, 0))

# byte address -> (regCOMPUTE_* name, fields): the compute registers a PM4 queue may set with SET_SH_REG
SH_REGISTERS: dict[int, tuple[str, Layout]] = {
  0xB810: ("COMPUTE_START_X", START), 0xB814: ("COMPUTE_START_Y", START), 0xB818: ("COMPUTE_START_Z", START),
  0xB81C: ("COMPUTE_NUM_THREAD_X", NUM_THREAD), 0xB820: ("COMPUTE_NUM_THREAD_Y", NUM_THREAD),
  0xB824: ("COMPUTE_NUM_THREAD_Z", NUM_THREAD),
  0xB828: ("COMPUTE_PIPELINESTAT_ENABLE", PIPELINESTAT), 0xB82C: ("COMPUTE_PERFCOUNT_ENABLE", PERFCOUNT),
  0xB86C: ("COMPUTE_RESTART_X", RESTART), 0xB870: ("COMPUTE_RESTART_Y", RESTART),
  0xB874: ("COMPUTE_RESTART_Z", RESTART),
  0xB830: ("COMPUTE_PGM_LO", DATA32), 0xB834: ("COMPUTE_PGM_HI", DATA8),
  0xB840: ("COMPUTE_DISPATCH_SCRATCH_BASE_LO", DATA32), 0xB844: ("COMPUTE_DISPATCH_SCRATCH_BASE_HI", DATA8),
  0xB848: ("COMPUTE_PGM_RSRC1", RSRC1), 0xB84C: ("COMPUTE_PGM_RSRC2", RSRC2),
  0xB854: ("COMPUTE_RESOURCE_LIMITS", RESOURCE_LIMITS), 0xB860: ("COMPUTE_TMPRING_SIZE", TMPRING_SIZE),
  0xB8A0: ("COMPUTE_PGM_RSRC3", RSRC3),
  **{0xB900 + 4 * i: (f"COMPUTE_USER_DATA_{i}", DATA32) for i in range(16)},
}
REG = {name: addr for addr, (name, _) in SH_REGISTERS.items()}

GFX1100_PROPERTIES = {
  "cpu_cores_count": 0, "simd_count": 192, "simd_per_cu": 2, "max_waves_per_simd": 16, "lds_size_in_kb": 64,
  "gfx_target_version": 110000, "vendor_id": 0x1002, "device_id": 0x744C, "wave_front_size": 32,
  "array_count": 12, "simd_arrays_per_engine": 2, "cu_per_simd_array": 8, "max_slots_scratch_cu": 32,
  "num_sdma_engines": 2, "num_gws": 64, "num_xcc": 1,
}


def run_groups(emu: Any, entry: int, dims: tuple[int, int, int], local: tuple[int, int, int], wave: int,
               user: list[int], tgid_en: tuple[int, int, int], lds_bytes: int,
               scratch: tuple[Callable[[Any, Any], Any], int] | None) -> None:
  """Launch every work-group of a dispatch in the emulator, in batches of whole groups (`emu.batch.Launch`): the user
  SGPRs, then the enabled work-group ids, then (`scratch`: (fn(group ids, wave in group) -> private segment wave
  offset, private bytes per lane)) the wave's scratch offset; work-item ids packed in v0 (x | y << 10 | z << 20);
  EXEC covers the group's work-items."""
  lx, ly, lz = local
  threads = lx * ly * lz
  n_waves = (threads + wave - 1) // wave
  tids = np.arange(n_waves * wave)  # one work-group's lanes; lanes past its work-items hold 0
  v0 = np.where(tids < threads, (tids % lx) | (((tids // lx) % ly) << 10) | ((tids // (lx * ly)) << 20), 0)
  ex = np.array([(1 << min(wave, threads - wv * wave)) - 1 for wv in range(n_waves)], np.uint64)
  groups = dims[0] * dims[1] * dims[2]
  per = max(1, MAX_LANES // (n_waves * wave))
  for g0 in range(0, groups, per):  # group ids: x fastest, then y, then z
    gid = np.arange(g0, min(groups, g0 + per))
    sgpr: dict[int, Any] = dict(enumerate(user))
    s = len(user)
    for en, g in zip(tgid_en, (gid % dims[0], (gid // dims[0]) % dims[1], gid // (dims[0] * dims[1]))):
      if en: sgpr[s], s = np.repeat(g, n_waves), s + 1
    if scratch is not None: sgpr[s] = scratch[0](gid[:, None], np.arange(n_waves)[None, :]).reshape(-1)
    emu.run_launch(entry, Launch(len(gid) * n_waves, wave, n_waves, np.tile(ex, len(gid)), sgpr,
                                 {0: np.tile(v0, len(gid)).astype(np.uint32)}, lds_bytes,
                                 None if scratch is None else scratch[1]))


class GFX11(MockGPU):
  """A gfx11 GPU: PM4 compute queues whose dispatches run wave32 code in the RDNA3 emulator."""
  arch = "gfx1100"
  properties = GFX1100_PROPERTIES
  ip_versions = {11: (11, 0, 0), 42: (6, 0, 0), 108: (4, 3, 0)}  # Navi 31: GC 11.0.0, SDMA 6.0.0, NBIO 4.3.0
  sh_registers = SH_REGISTERS
  needs_priv_with_cwsr = True
  sdma_writes_through_l2 = True  # SDMA v6 reads and writes through GL2 (its COPY/FENCE packets carry GL2 policies)

  def make_emulator(self) -> Any: return Emulator(CheckedMemory(self))

  def l2_coherent_after_sdma_write(self, copier: MockGPU, alloc: Any) -> bool:
    """gfx11 (GC 11.0.0): SDMA v6 writes through its own GPU's GL2, so that GL2 stays valid. Another GPU's GL2 holds
    no line of a BO mapped MTYPE_UC, which gmc_v11_0.c gmc_v11_0_get_vm_pte gives COHERENT, EXT_COHERENT and
    UNCACHED BOs; any other BO is MTYPE_NC there (cached, not coherent), so that GL2 may be stale."""
    if copier is self and self.sdma_writes_through_l2: return True
    uc = kfd.ALLOC_COHERENT | kfd.ALLOC_EXT_COHERENT | kfd.ALLOC_UNCACHED
    return alloc is not None and bool(alloc.flags & uc)

  def check_compute_queue(self, a: Any) -> None:
    """What kfd_queue.c kfd_queue_acquire_buffers checks of a compute queue (node sizes from
    kfd_queue_ctx_save_restore_size, `kfd.cwsr_sizes`): an EOP buffer, when given, of exactly the node's
    eop_buffer_size in a BO of that size; ctl_stack_size equal to the node's; ctx_save_restore_size at least the
    node's cwsr_size; the CWSR area one BO of exactly ALIGN((ctx_save_restore_size + debug_memory_size) * num_xcc,
    PAGE) bytes."""
    cw = kfd.cwsr_sizes(self.props)
    assert cw is not None
    if a.eop_buffer_address:
      if a.eop_buffer_size != cw.eop_buffer_size:
        raise OSError(22, f"CREATE_QUEUE: eop_buffer_size {a.eop_buffer_size:#x}, node needs {cw.eop_buffer_size:#x}")
      self.check_queue_buffer(a.eop_buffer_address, a.eop_buffer_size, "EOP buffer")
    if a.ctl_stack_size != cw.ctl_stack_size:
      raise OSError(22, f"CREATE_QUEUE: ctl_stack_size {a.ctl_stack_size:#x}, node needs {cw.ctl_stack_size:#x}")
    if a.ctx_save_restore_size < cw.ctx_save_restore_size:
      raise OSError(22, f"CREATE_QUEUE: ctx_save_restore_size {a.ctx_save_restore_size:#x} is less than the node's "
                        f"cwsr_size {cw.ctx_save_restore_size:#x}")
    want = kfd.cwsr_alloc_size(a.ctx_save_restore_size, cw)
    size = self.ranges.get(a.ctx_save_restore_address, 0) - a.ctx_save_restore_address
    if size != want:
      raise OSError(22, f"CREATE_QUEUE: the CWSR area at {a.ctx_save_restore_address:#x} is {max(size, 0):#x} bytes "
                        f"of one allocation mapped into {self.name}; need {want:#x}")

  def reg(self, q: MockQueue, name: str) -> dict[str, int]:
    addr = REG[name]
    return SH_REGISTERS[addr][1].decode(q.regs.get(addr, 0), name)

  def check_restart(self, q: MockQueue, where: str) -> None:
    """COMPUTE_RESTART_X/Y/Z (tinygrad's driver writes 0s): the group a preempted dispatch resumes at."""
    restart = [self.reg(q, f"COMPUTE_RESTART_{a}")["restart"] for a in "XYZ"]
    require(restart == [0, 0, 0], where, f"COMPUTE_RESTART_X/Y/Z = {restart}: resuming a preempted dispatch is not "
            "modelled (a new dispatch leaves them 0)")

  def dispatch(self, q: MockQueue, dims: tuple[int, int, int], initiator: int, where: str) -> None:
    """DISPATCH_DIRECT: check the dispatch state, then run every wave of every work-group in the emulator (batched:
    the waves of many groups in lockstep, see emu/batch.py)."""
    ini = DISPATCH_INITIATOR.decode(initiator, f"{where} dword 4 (COMPUTE_DISPATCH_INITIATOR)")
    require(ini["compute_shader_en"] == 1, where, "COMPUTE_SHADER_EN = 0: nothing would run")
    require(ini["cs_w32_en"] == 1, where, f"CS_W32_EN = 0 launches wave64 waves; the {self.arch} mock runs wave32 code")
    for k in ("partial_tg_en", "ordered_append_enbl", "ordered_append_mode", "use_thread_dimensions", "order_mode",
              "reserved", "tunnel_enable", "restore", "amp_shader_en", "disable_disp_prempt_en"):
      require(ini[k] == 0, where, f"DISPATCH_INITIATOR.{k.upper()} = 1 is not modelled")
    if not ini["force_start_at_000"]:
      starts = [self.reg(q, f"COMPUTE_START_{a}")["start"] for a in "XYZ"]
      require(starts == [0, 0, 0], where, f"COMPUTE_START_X/Y/Z = {starts}: only dispatches from group 0 are modelled")
    self.check_restart(q, where)
    r1, r2, r3 = self.reg(q, "COMPUTE_PGM_RSRC1"), self.reg(q, "COMPUTE_PGM_RSRC2"), self.reg(q, "COMPUTE_PGM_RSRC3")
    if self.needs_priv_with_cwsr and q.cwsr and not r1["priv"]:
      raise PacketError(f"{where}: COMPUTE_PGM_RSRC1.PRIV = 0 on a queue with a CWSR area: on {self.arch} waves run "
                        "privileged and the context-save trap handler relies on it, so a preempted wave would fault "
                        "(set bit 20, as ROCm's dispatcher does)")
    for k in ("trap_present", "tg_size_en", "excp_en_msb", "excp_en"):
      require(r2[k] == 0, where, f"COMPUTE_PGM_RSRC2.{k.upper()} = {r2[k]} is not modelled")
    require(r3["trap_on_start"] == 0 and r3["trap_on_end"] == 0, where, "COMPUTE_PGM_RSRC3 TRAP_ON_START/END: "
            "not modelled")
    local = [self.reg(q, f"COMPUTE_NUM_THREAD_{a}") for a in "XYZ"]
    require(all(n["num_thread_partial"] == 0 for n in local), where, "partial work-groups are not modelled")
    lx, ly, lz = (n["num_thread_full"] for n in local)
    threads = lx * ly * lz
    require(0 < threads <= 1024, where, f"a work-group of {lx}x{ly}x{lz} work-items; valid: 1..1024")
    lds_bytes = r2["lds_size"] * LDS_GRANULE
    require(lds_bytes <= self.props["lds_size_in_kb"] << 10, where, f"LDS_SIZE {r2['lds_size']} asks for {lds_bytes} "
            f"bytes of LDS; a work-group has {self.props['lds_size_in_kb']} KiB")
    entry = ((self.reg(q, "COMPUTE_PGM_HI")["data"] << 32) | self.reg(q, "COMPUTE_PGM_LO")["data"]) << 8
    self.check(entry, 4, "instruction fetch")
    n_waves = (threads + WAVE - 1) // WAVE
    scratch = self.scratch_setup(q, n_waves, where) if r2["scratch_en"] else None
    n_user, tgid_en = r2["user_sgpr"], (r2["tgid_x_en"], r2["tgid_y_en"], r2["tgid_z_en"])
    user = [q.regs.get(REG[f"COMPUTE_USER_DATA_{i}"], 0) for i in range(n_user)]
    engines = self.shader_engines
    self.emu.begin_dispatch()
    wave_offset = None
    if scratch is not None:  # the private segment wave offset: this wave's slot in its engine's slice
      slots, wave_bytes = scratch
      wave_offset = (lambda gid, wv: ((gid % engines) * slots + wv) * wave_bytes, wave_bytes // WAVE)
    run_groups(self.emu, entry, dims, (lx, ly, lz), WAVE, user, tgid_en, lds_bytes, wave_offset)

  @property
  def shader_engines(self) -> int: return self.props["array_count"] // self.props["simd_arrays_per_engine"]

  def scratch_setup(self, q: MockQueue, n_waves: int, where: str) -> tuple[int, int]:
    """A dispatch with RSRC2.SCRATCH_EN: COMPUTE_DISPATCH_SCRATCH_BASE must point at memory holding every engine's
    WAVES * WAVESIZE * 256 bytes; returns (wave slots per engine, bytes per wave)."""
    tmp = self.reg(q, "COMPUTE_TMPRING_SIZE")
    # WAVESIZE granule: 256 bytes on gfx11, 1 KiB before (Mesa ac_gpu_info.c ac_get_scratch_tmpring_size shifts the
    # bytes per wave by 8 from GFX11, by 10 before; gfx9.py's scratch_setup9)
    slots, wave_bytes = tmp["waves"], tmp["wavesize"] * 256
    require(slots > 0 and wave_bytes > 0, where, f"SCRATCH_EN with COMPUTE_TMPRING_SIZE WAVES={slots} "
            f"WAVESIZE={tmp['wavesize']} (both must be nonzero)")
    if n_waves > slots:
      raise GPUHang(f"{where}: a work-group of {n_waves} waves needs that many scratch slots but TMPRING_SIZE.WAVES "
                    f"gives each shader engine {slots}: the dispatch would never start")
    base = ((self.reg(q, "COMPUTE_DISPATCH_SCRATCH_BASE_HI")["data"] << 32) |
            self.reg(q, "COMPUTE_DISPATCH_SCRATCH_BASE_LO")["data"]) << 8
    self.check(base, self.shader_engines * slots * wave_bytes,
               f"scratch ({self.shader_engines} shader engines x {slots} wave slots x {wave_bytes} bytes)")
    return slots, wave_bytes


ARCHS["gfx1100"] = GFX11
