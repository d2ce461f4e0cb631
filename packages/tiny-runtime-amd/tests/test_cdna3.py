"""gfx942 (CDNA3, MI300): the CDNA3 emulator's opcode tables against AMD's ISA XML, its decoder against LLVM's listing
of every kernel compiled here, kernels (MFMA matmuls in half and bfloat16 included) run on MOCK+AMD's gfx942 against
numpy, and the gfx9 hardware facts of the driver and the mock (kernel descriptor, registers, packets) against
tinygrad 0.14.0's bindings of the headers (test-only oracle, tests/amd_oracle.py)."""
from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np
import pytest
from amd_listing import check_decode_matches_assembly
from amd_oracle import cdna_opcodes, gc943_register, sdma_dword, value
from tiny_codegen import get_program
from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, find_ld_lld
from tiny_codegen.opt import Opt, OptOps, apply_opts
from tiny_codegen.opt.kernel import TC_FRAGMENTS
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType

from tiny_runtime_amd import pm4
from tiny_runtime_amd.elf import ELF
from tiny_runtime_amd.emu import cdna3
from tiny_runtime_amd.mock import gfx9
from tiny_runtime_amd.mock.driver import DEFAULT_ARCHS, MockFileIO, MockKFD, mock_fileio
from tiny_runtime_amd.mock.fields import PacketError

pytestmark = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
ARCH, DEV = "gfx942", "MOCK+AMD"
N = 200  # more than 3 waves of 64: a partial last wave, several work-groups
NP = {dtypes.float16: np.float16, dtypes.float: np.float32, dtypes.double: np.float64, dtypes.int16: np.int16,
      dtypes.int8: np.int8, dtypes.int: np.int32, dtypes.uint16: np.uint16, dtypes.uint8: np.uint8,
      dtypes.int64: np.int64}

# LLVM's gfx940+ mnemonics where AMD's XML names the same opcode differently
ALIASES = {"v_fma_mix_f32": "v_mad_mix_f32", "v_fma_mixlo_f16": "v_mad_mixlo_f16", "v_fma_mixhi_f16": "v_mad_mixhi_f16",
           "v_accvgpr_read_b32": "v_accvgpr_read", "v_accvgpr_write_b32": "v_accvgpr_write"}


def _strip(n: str) -> str: return n.removesuffix("_e32").removesuffix("_e64")


@pytest.mark.parametrize("table, enum, prefix", [
  (cdna3.SOP1_9, "SOP1Op", ""), (cdna3.SOP2_9, "SOP2Op", ""), (cdna3.SOPK_9, "SOPKOp", ""),
  (cdna3.SOPC_9, "SOPCOp", ""), (cdna3.SOPP_9, "SOPPOp", ""), (cdna3.SMEM_9, "SMEMOp", ""),
  (cdna3.VOP1_9, "VOP1Op", ""), (cdna3.VOP2_9, "VOP2Op", ""), (cdna3.VOP3_9, "VOP3Op", ""),
  (cdna3.VOP3SD_9, "VOP3SDOp", ""), (cdna3.VOP3P_9, "VOP3POp", ""), (cdna3.DS_9, "DSOp", ""),
  (cdna3.FLAT_9, "FLATOp", "flat_"), (cdna3.FLAT_9, "GLOBALOp", "global_"), (cdna3.MUBUF_9, "MUBUFOp", ""),
  ({op: n for op, (n, _) in cdna3.VOPC_9.items()}, "VOPCOp", ""),
  ({256 + op: n for op, n in cdna3.VOP2_9.items() if op not in (23, 24)}, "VOP3Op", ""),  # VOP2 ops as VOP3: 256+op
  ({320 + op: n for op, n in cdna3.VOP1_9.items()}, "VOP3Op", ""),   # VOP1 ops in the VOP3 encoding: 320 + op
])
def test_opcode_tables_match_amd_isa_xml(table, enum, prefix):
  xml = {op: _strip(n) for op, n in cdna_opcodes(enum).items()}
  carry = {256 + o for o in range(25, 31)}  # the carry ops are VOP3SD in the VOP3 encoding (checked with VOP3SDOp)
  mine = {op: ALIASES.get(prefix + n, prefix + n) for op, n in table.items() if op not in carry}
  assert {op: xml.get(op) for op in mine} == mine


def test_vopc_table_maps_each_compare_to_its_rdna3_twin():
  """Every GFX9 compare runs as the RDNA3 compare of the same name (V_CMP_TRU is RDNA3's V_CMP_T)."""
  from tiny_runtime_amd.emu.rdna3 import UnsupportedInstruction, vopc_compare
  for op, (name, r3op) in cdna3.VOPC_9.items():
    if name.endswith(("_f_i16", "_t_i16", "_f_u16", "_t_u16")):  # RDNA3 dropped these constant compares
      with pytest.raises(UnsupportedInstruction): vopc_compare(r3op)
      continue
    assert vopc_compare(r3op)[0] == name.replace("_tru_", "_t_"), (op, name)


def _spec(ast: UOp, opts: list | None = None):
  ren = AMDGPURenderer(ARCH)
  return get_program(apply_opts(ast, ren, opts) if opts else ast, ren)


def _elementwise(fn, din: DType, dout: DType, n: int = N) -> UOp:
  c, x, y = UOp(Ops.PARAM, dout.ptr(n), arg=0), UOp(Ops.PARAM, din.ptr(n), arg=1), UOp(Ops.PARAM, din.ptr(n), arg=2)
  i = UOp.range(n, 0)
  return c.index(i).store(fn(x.index(i).load(), y.index(i).load())).sink(arg=KernelInfo("k"))


@functools.cache
def gfx942(index: int = 0):
  """An AMDDevice on the process's gfx942 mock (its own instance: the registry's MOCK+AMD may be a gfx1100 opened by
  another test file)."""
  from tiny_runtime_amd.device import AMDDevice
  with Context(DEV=f"{DEV}:LLVM:{ARCH}"): dev = AMDDevice(DEV if index == 0 else f"{DEV}:{index}")
  assert dev.arch == ARCH and dev.wave_size == 64
  return dev


def _run(spec, out: np.ndarray, *inputs: np.ndarray, dev=None) -> np.ndarray:
  """Launch the compiled kernel on a gfx942 with `inputs` copied in; the output read back as `out`'s dtype."""
  dev = dev or gfx942()
  alloc = dev.allocator
  bufs = [alloc.alloc(max(x.nbytes, 1)) for x in (out, *inputs)]
  for b, x in zip(bufs[1:], inputs): alloc._copyin(b, memoryview(np.ascontiguousarray(x).ravel()).cast("B"))
  prg = dev.get_program(spec.name, spec.lib)
  prg(*bufs, global_size=spec.global_size, local_size=spec.local_size, vals=(), wait=True)
  res = np.empty_like(out)
  alloc._copyout(memoryview(res).cast("B"), bufs[0])
  return res


rng = np.random.default_rng(42)
FA, FB = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
HA, HB = FA.astype(np.float16), FB.astype(np.float16)
IA, IB = rng.integers(-100, 100, N).astype(np.int32), rng.integers(1, 50, N).astype(np.int32)
CASES = {  # name: (fn, din, dout, a, b, reference)
  "f32_math": (lambda x, y: (x * y + x).exp2() / (y * y + 1), dtypes.float, dtypes.float, FA, FB,
               lambda a, b: np.exp2(a * b + a) / (b * b + 1)),
  "f32_where": (lambda x, y: (x < y).where(x.sqrt(), y.maximum(x)), dtypes.float, dtypes.float, np.abs(FA), FB,
                lambda a, b: np.where(a < b, np.sqrt(a), np.maximum(a, b))),
  "f16_math": (lambda x, y: (x * y + x).maximum(y), dtypes.float16, dtypes.float16, HA, HB,
               lambda a, b: np.maximum(a * b + a, b)),
  "f16_to_f32": (lambda x, y: x.cast(dtypes.float) * y.cast(dtypes.float), dtypes.float16, dtypes.float, HA, HB,
                 lambda a, b: a.astype(np.float32) * b.astype(np.float32)),
  "i32_divmod": (lambda x, y: x // y + x % y * 3, dtypes.int, dtypes.int, IA, IB,
                 lambda a, b: (np.trunc(a / b) + np.fmod(a, b) * 3).astype(np.int32)),
  "i8_add": (lambda x, y: x + y, dtypes.int8, dtypes.int8, IA.astype(np.int8), IB.astype(np.int8),
             lambda a, b: a + b),
  "f64_mul_add": (lambda x, y: x * y + 1.5, dtypes.double, dtypes.double, FA.astype(np.float64), FB.astype(np.float64),
                  lambda a, b: a * b + 1.5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_decode_like_llvm_and_run_on_the_gfx942_mock(case):
  fn, din, dout, a, b, ref = CASES[case]
  spec = _spec(_elementwise(fn, din, dout))
  check_decode_matches_assembly(spec, ARCH)
  got = _run(spec, np.zeros(N, NP[dout]), a, b)
  want = ref(a, b).astype(NP[dout])
  if dout in (dtypes.int, dtypes.int8): np.testing.assert_array_equal(got, want)
  else: np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3 if din == dtypes.float16
                                   else 1e-6, atol=1e-6)


def _matmul(M: int, N_: int, K: int, din: DType) -> UOp:
  c, a, b = UOp(Ops.PARAM, dtypes.float.ptr(M * N_), arg=0), UOp(Ops.PARAM, din.ptr(M * K), arg=1), \
    UOp(Ops.PARAM, din.ptr(K * N_), arg=2)
  i, j, k = UOp.range(M, 0), UOp.range(N_, 1), UOp.range(K, 2, __import__("tiny_uop").uop.AxisType.REDUCE)
  v = (a.index(i * K + k).load() * b.index(k * N_ + j).load()).cast(dtypes.float)
  return c.index(i * N_ + j).store(UOp(Ops.REDUCE, dtypes.float, (v, k), Ops.ADD)).sink(arg=KernelInfo("mm"))


def test_mfma_fragment_layout_covers_each_tile_element_once():
  frag = TC_FRAGMENTS["mfma.16x16x16"]
  for kind in "abc":
    cells = sorted(frag(kind, e, ln) for e in range(4) for ln in range(64))
    assert cells == [(r, c) for r in range(16) for c in range(16)], kind


@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("M,N_,K", [(16, 16, 16), (32, 16, 48)])
def test_mfma_matmul_on_the_emulator(din, M, N_, K):
  spec = _spec(_matmul(M, N_, K, din), [Opt(OptOps.TC, 0, -1)])
  kind = "16x16x16f16" if din == dtypes.float16 else "16x16x16bf16.1k"
  assert spec.src.count(f"call <4 x float> @llvm.amdgcn.mfma.f32.{kind}(") == 1
  assert spec.local_size == (64, 1, 1)  # one wave64 per 16x16 tile
  asm = AMDGPUCompiler(ARCH).assembly(spec.src)
  assert f"v_mfma_f32_16x16x16_{'f16' if din == dtypes.float16 else 'bf16'}" in asm
  check_decode_matches_assembly(spec, ARCH)
  r = np.random.default_rng(M + K)
  A, B = r.standard_normal((M, K)).astype(np.float32), r.standard_normal((K, N_)).astype(np.float32)
  if din == dtypes.float16: a, b = A.astype(np.float16), B.astype(np.float16)
  else: a, b = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (A, B))
  exact = (lambda x: x.astype(np.float64)) if din == dtypes.float16 else \
    (lambda x: (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64))
  got = _run(spec, np.zeros(M * N_, np.float32), a, b).reshape(M, N_)
  np.testing.assert_allclose(got, exact(a) @ exact(b), rtol=1e-5, atol=1e-5)


def test_kernel_descriptor_is_wave64_with_accum_offset():
  spec = _spec(_elementwise(lambda x, y: x + y, dtypes.float, dtypes.float))
  _, _, kd = ELF.parse(spec.lib).kernel()
  props = value("amdgpu_kd", "KERNEL_CODE_PROPERTY_ENABLE_WAVEFRONT_SIZE32")
  assert not kd.kernel_code_properties & props and not kd.wave32
  # RSRC3 on gfx90a+: ACCUM_OFFSET (AGPRs start at (ACCUM_OFFSET + 1) * 4), the rest of the word reserved
  assert value("amdgpu_kd", "COMPUTE_PGM_RSRC3_GFX90A_ACCUM_OFFSET") == 0x3F
  assert kd.rsrc3 & ~(0x3F | value("amdgpu_kd", "COMPUTE_PGM_RSRC3_GFX90A_TG_SPLIT")) == 0
  assert ".amdhsa_accum_offset" in AMDGPUCompiler(ARCH).assembly(spec.src)


def test_wave_size_mismatch_is_refused():
  from tiny_runtime_amd.device import AMDProgram
  spec11 = get_program(_elementwise(lambda x, y: x + y, dtypes.float, dtypes.float), AMDGPURenderer("gfx1100"))
  with pytest.raises(RuntimeError, match="wave32 code object; gfx942 runs wave64"):
    AMDProgram(gfx942(), spec11.name, spec11.lib)


def test_gfx9_registers_match_gc_9_4_3():
  for addr, (name, layout) in gfx9.SH_REGISTERS.items():
    off, fields = gc943_register(name)
    assert addr == (0x2000 + off) * 4, name
    assert {f.name: (f.lo, f.lo + f.width - 1) for f in layout.fields} == fields, name
  assert pm4.COMPUTE_PGM_RSRC3_GFX9 == (0x2000 + gc943_register("COMPUTE_PGM_RSRC3")[0]) * 4


def test_gfx9_packets_match_soc15d():
  o = lambda n: value("pm4_soc15", n)  # noqa: E731
  assert pm4.RELEASE_CACHE_ACTIONS9 == o("EOP_TCL1_ACTION_EN") | o("EOP_TC_ACTION_EN") | o("EOP_TC_WB_ACTION_EN") | \
    o("EOP_TC_MD_ACTION_EN")
  coher = {n: o(f"PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_{n.upper()}")(1) for n in (
    "tc_nc_action_ena", "tc_wc_action_ena", "tc_inv_metadata_action_ena", "tcl1_vol_action_ena", "tc_wb_action_ena",
    "tcl1_action_ena", "tc_action_ena", "cb_action_ena", "db_action_ena", "sh_kcache_action_ena",
    "sh_kcache_vol_action_ena", "sh_icache_action_ena", "sh_kcache_wb_action_ena")}
  assert {f.name: f.mask for f in gfx9.COHER_CNTL.fields} == coher
  assert pm4.ACQUIRE_COHER_CNTL9 == coher["sh_icache_action_ena"] | coher["sh_kcache_action_ena"] | \
    coher["tc_action_ena"] | coher["tcl1_action_ena"] | coher["tc_wb_action_ena"]
  eop = {f"EOP_{f.name.upper().removesuffix('_ENA')}_EN": f.mask for f in gfx9.RELEASE_MEM_DW1.fields
         if f.name.endswith("_ena")}
  known = {n: m for n, m in eop.items() if hasattr(__import__("amd_oracle").module("pm4_soc15"), n)}
  assert len(known) == 7 and all(o(n) == m for n, m in known.items())  # soc15d.h has no EOP_TC_WC_ACTION_EN
  assert o("PACKET3_ACQUIRE_MEM__COHER_SIZE_HI_VG10")(0xFFFFFFFF) == 0xFFFFFF  # 24 bits from Vega10 on
  q = pm4.AMDComputeQueue9().acquire_mem()
  assert q._q[0] == pm4.header(pm4.ACQUIRE_MEM, 6) and q._q[1] == pm4.ACQUIRE_COHER_CNTL9  # 6 body dwords on gfx9
  assert pm4.AMDComputeQueue9.INITIATOR == value("regs", "gc_9_4_3")["regCOMPUTE_DISPATCH_INITIATOR"][2][
    "compute_shader_en"][0] + 1 + (1 << 2)  # COMPUTE_SHADER_EN | FORCE_START_AT_000, and no CS_W32_EN on gfx9


class Harness9:
  """A fresh mock with gfx942s and a raw PM4 queue, for packets the driver would never build."""

  def __init__(self, archs: tuple[str, ...] = ("gfx942",)):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from mock_harness import Harness
    self.h = Harness(drv=MockKFD(archs))


def test_gfx9_mock_rejects_the_gfx11_packet_forms():
  h = Harness9().h
  gfx11_acquire = pm4.AMDComputeQueue().acquire_mem()._q  # 7 body dwords with GCR_CNTL: not a gfx9 ACQUIRE_MEM
  with pytest.raises(PacketError, match="ACQUIRE_MEM has 7 body dwords; it takes exactly 6"):
    h.pm4(list(gfx11_acquire))
  sig = h.iface.alloc(0x1000, host=True)
  gfx11_release = pm4.AMDComputeQueue().release_mem(sig.va_addr, 1, pm4.DATA_SEL_32)._q  # GCR bits 22/25: reserved
  with pytest.raises(PacketError, match="reserved bit"): h.pm4(list(gfx11_release))
  h.pm4(list(pm4.AMDComputeQueue9().release_mem(sig.va_addr, 7, pm4.DATA_SEL_32)._q))
  assert h.word(sig) == 7


def test_gfx942_topology_and_spx_node():
  h = Harness9().h
  node = h.iface.node
  assert (node.arch, node.cu_count, dict(node.props)["wave_front_size"], node.num_xcc) == ("gfx942", 38, 64, 1)
  spx = Harness9(("gfx942_spx",)).h
  cw1, cw8 = node.cwsr, spx.iface.node.cwsr
  assert cw8 is not None and cw1 is not None and cw8.num_xcc == spx.iface.node.num_xcc == 8
  assert spx.iface.node.cu_count == 8 * 38  # MI300X in SPX mode: one node over 8 XCCs of 38 CUs
  assert cw8.alloc_size == -(-(cw8.ctx_save_restore_size + cw8.debug_memory_size) * 8 // 4096) * 4096


def test_mi300x_in_spx_mode_runs_kernels_and_copies_on_one_xcc(monkeypatch):
  """An MI300X in SPX mode (one KFD node, num_xcc 8) opens and runs: its PM4 queue is processed by one XCC (amdkfd
  "Add PM4 target XCC": queue_percentage bits 15:8), so fences need no cross-XCC barrier and scratch is one XCC's wave
  slots. A kernel with scratch and an SDMA round trip, against numpy; the old driver refused the node."""
  from tiny_runtime_amd import device, kfd
  from tiny_runtime_amd.mock import driver
  drv = MockKFD(("gfx942_spx",) * 2)
  fio = type("SPXFileIO", (MockFileIO,), {"kfd_fn": staticmethod(lambda: drv)})
  monkeypatch.setattr(driver, "mock_fileio", lambda arch: fio)
  dev = device.AMDDevice("MOCK+AMD:LLVM:gfx942")
  assert dev.iface.node.num_xcc == 8 and dev.arch == "gfx942"
  q = next(q for q in drv.queues.values() if q.qtype == kfd.QUEUE_TYPE_COMPUTE and q.gpu is drv.gpus[0])
  assert q.xcc == device.PM4_TARGET_XCC == 0
  n = 256
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(n), arg=1)
  i = UOp.range(n, 0)
  spec = get_program(c.index(i).store(a.index(i).load() * 3.0 - 1.0).sink(arg=KernelInfo("spx_axpb")), dev.renderer)
  x = np.arange(n, dtype=np.float32) - 100
  src, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
  dev.allocator._copyin(src, memoryview(x).cast("B"))  # through the SDMA queue
  dev.get_program(spec.name, spec.lib)(out, src, global_size=spec.global_size, local_size=spec.local_size, wait=True)
  got = np.empty(n, np.float32)
  dev.allocator._copyout(memoryview(got).cast("B"), out)
  np.testing.assert_array_equal(got, x * 3 - 1)
  dev.ensure_scratch(64)  # one XCC's wave slots: 38 CUs x 32 (max_slots_scratch_cu), not the node's 304 CUs
  assert dev.tmpring_size & 0xFFF == 38 * 32
  # the mock refuses a PM4 queue on an XCC the node lacks (KFD passes bits 15:8 on to the MQD unchecked)
  with pytest.raises(kfd.KFDError, match=r"PM4 target XCC 8 \(queue_percentage bits 15:8\); .* XCCs 0\.\.7"):
    dev.iface.create_queue(ring_base_address=dev.compute_ring.ring.va_addr, ring_size=0x1000,
                           queue_type=kfd.QUEUE_TYPE_COMPUTE, queue_percentage=100 | 8 << 8, queue_priority=7,
                           read_pointer_address=dev.compute_ring.ptrs.va_addr,
                           write_pointer_address=dev.compute_ring.ptrs.va_addr + 8)


def test_mock_fileio_picks_the_arch():
  assert mock_fileio(None) is MockFileIO and mock_fileio("gfx1100") is MockFileIO
  fio = mock_fileio("gfx942")
  # as many gfx942 nodes as the default mock has gfx1100s (MOCK+AMD:0..3 exist whichever arch DEV names)
  assert fio is mock_fileio("gfx942") and [g.arch for g in fio.kfd_fn().gpus] == ["gfx942"] * len(DEFAULT_ARCHS)
  with pytest.raises(ValueError, match="no gfx1200 GPU; mocked archs"): mock_fileio("gfx1200")


def test_unknown_instruction_raises_by_name():
  emu = cdna3.CDNA3Emulator()
  from tiny_runtime_amd.emu.rdna3 import UnsupportedInstruction, Wave64
  code = (ctypes.c_uint32 * 4)(0xD1C40000, 0, 0xBF810000, 0)  # v_cubeid_f32 (VOP3 452), then s_endpgm
  w = Wave64()
  w.exec = (1 << 64) - 1
  with pytest.raises(UnsupportedInstruction, match="v_cubeid_f32|vop3_452"):
    emu.run(w, ctypes.addressof(code))


@pytest.mark.parametrize("packet, dwords", [("COPY_LINEAR", ["HEADER", "COUNT", "PARAMETER"]), ("FENCE", ["HEADER"]),
                                            ("TRAP", ["HEADER", "INT_CONTEXT"]), ("POLL_REGMEM", ["HEADER", "DW5"]),
                                            ("TIMESTAMP_GET_GLOBAL", ["HEADER", "WRITE_ADDR_LO"])])
def test_sdma_packets_are_the_same_on_mi300s_sdma_v4(packet, dwords):
  """gfx942's SDMA engines are v4.4: every dword of the packets the driver builds (SDMA v6 encodings) has the same
  fields at the same bits in sdma_4_0_0, except COPY_LINEAR's COUNT, 22 bits there, which MAX_COPY - 1 fits."""
  from tiny_runtime_amd import sdma
  for dw in dwords:
    i4, f4 = sdma_dword(packet, dw, "sdma_4_0_0")
    i6, f6 = sdma_dword(packet, dw)
    assert i4 == i6
    if (packet, dw) == ("COPY_LINEAR", "COUNT"):
      assert f4["count"] == (1 << 22) - 1 and sdma.MAX_COPY - 1 <= f4["count"]
      continue
    assert {k: v for k, v in f6.items() if k in f4} == f4, (packet, dw)


def test_two_gfx942s_peer_copy_then_compute():
  """MOCK+AMD:1 under a gfx942 DEV is the second gfx942 of the same mock process: data copied GPU 0 -> GPU 1 on GPU 1's
  SDMA engine over a peer mapping, computed there, read back."""
  d0, d1 = gfx942(0), gfx942(1)
  assert d0.iface.proc is d1.iface.proc and d0.iface.node.gpu_id != d1.iface.node.gpu_id
  spec = _spec(_elementwise(lambda x, y: x * y + x, dtypes.float, dtypes.float))
  src = d0.allocator.alloc(N * 4)
  d0.allocator._copyin(src, memoryview(FA).cast("B"))
  dst = d1.allocator.alloc(N * 4)
  d1.allocator._transfer(dst, src, N * 4, src_dev=d0)
  out = d1.allocator.alloc(N * 4)
  d1.get_program(spec.name, spec.lib)(out, dst, dst, global_size=spec.global_size, local_size=spec.local_size,
                                      vals=(), wait=True)
  res = np.empty(N, np.float32)
  d1.allocator._copyout(memoryview(res).cast("B"), out)
  np.testing.assert_array_equal(res, FA * FA + FA)


def _run_words(words: list[int], setup) -> object:
  """Run hand-encoded GFX9 instruction words (then s_endpgm) on one full wave64; `setup(wave)` fills registers."""
  from tiny_runtime_amd.emu.rdna3 import Wave64
  code = (ctypes.c_uint32 * (len(words) + 2))(*words, 0xBF810000, 0)
  w = Wave64()
  w.exec = (1 << 64) - 1
  setup(w)
  cdna3.CDNA3Emulator().run(w, ctypes.addressof(code))
  return w


def test_fmac_f64_accumulates_into_its_destination():
  """v_fmac_f64 v[0:1], v[2:3], v[4:5] (VOP2 opcode 4, e32): D = S0 * S1 + D, one rounding, on all 64 lanes."""
  a, b, c = rng.standard_normal(64), rng.standard_normal(64), rng.standard_normal(64)
  def setup(w):
    for reg, x in ((0, c), (2, a), (4, b)):
      raw = x.view(np.uint64)
      w.vgpr[reg], w.vgpr[reg + 1] = [int(v) & 0xFFFFFFFF for v in raw], [int(v) >> 32 for v in raw]
  w = _run_words([(4 << 25) | (0 << 17) | (4 << 9) | (256 + 2)], setup)
  got = np.array([lo | (hi << 32) for lo, hi in zip(w.vgpr[0], w.vgpr[1])], np.uint64).view(np.float64)
  from fractions import Fraction
  want = [float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a, b, c)]  # exact, rounded once
  np.testing.assert_array_equal(got, want)


def test_vopc_cmpx_writes_exec_and_vcc_on_gfx9():
  """v_cmpx_gt_f32_e32 vcc, v0, v1 (VOPC opcode 0x54): before GFX10 the result goes to EXEC *and* VCC."""
  x, y = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
  def setup(w):
    w.vgpr[0], w.vgpr[1] = [int(v) for v in x.view(np.uint32)], [int(v) for v in y.view(np.uint32)]
  w = _run_words([(0b0111110 << 25) | (0x54 << 17) | (1 << 9) | 256], setup)
  want = sum(1 << i for i in range(64) if x[i] > y[i])
  assert w.exec == want and w.vcc == want


def test_16bit_op_zeroes_the_high_half_on_gfx9():
  """v_add_f16_e32 v2, v0, v1 (VOP2 opcode 31): the half sum in bits 15:0, bits 31:16 zeroed (GFX9), while the
  op_sel VOP3 v_fma_f16 (opcode 518) with op_sel[3] writes the high half and keeps the low one."""
  h = rng.standard_normal(64).astype(np.float16)
  def setup(w):
    w.vgpr[0] = [int(v) | 0xABCD0000 for v in h.view(np.uint16)]
    w.vgpr[1] = [int(v) for v in h.view(np.uint16)]
    w.vgpr[2] = [0xFFFFFFFF] * 64
    w.vgpr[3] = [0x1234] * 64
  w = _run_words([(31 << 25) | (2 << 17) | (1 << 9) | 256,
                  0xD0000000 | (518 << 16) | (1 << 14) | 3, 256 | (257 << 9) | (257 << 18)], setup)  # v3.h = v0*v1+v1
  np.testing.assert_array_equal(np.array(w.vgpr[2], np.uint32) >> 16, 0)
  np.testing.assert_array_equal(np.array(w.vgpr[2], np.uint32).astype(np.uint16).view(np.float16), h + h)
  hi = (np.array(w.vgpr[3], np.uint32) >> 16).astype(np.uint16).view(np.float16)
  np.testing.assert_array_equal(hi, (h.astype(np.float64) * h + h).astype(np.float16))
  assert all(v & 0xFFFF == 0x1234 for v in w.vgpr[3])


@pytest.mark.parametrize("lit", [80, 0x7FFFFFFF])
def test_mov_b64_of_a_literal(lit):
  """v_mov_b64_e32 v[0:1], lit (VOP1 opcode 56, src0 255: a literal dword follows): LLVM emits it for a 64-bit integer
  constant past the inline range (an int64 index offset of 80 broke a conv on gfx942); the pair holds the value."""
  w = _run_words([(0b0111111 << 25) | (0 << 17) | (56 << 9) | 255, lit], lambda w: None)
  assert w.vgpr[0] == [lit] * 64 and w.vgpr[1] == [0] * 64


def test_mov_b64_of_a_literal_past_2_31_is_refused():
  # zero- and sign-extension disagree there; LLVM does not emit one (see CDNA3Emulator.sread64)
  with pytest.raises(cdna3.UnsupportedInstruction, match="v_mov_b64_e32: a literal >= 2\\*\\*31"):
    _run_words([(0b0111111 << 25) | (0 << 17) | (56 << 9) | 255, 0x80000000], lambda w: None)


def test_scratch_kernel_on_gfx942():
  """A private array in scratch: TMPRING_SIZE in 1 KiB units over the whole GPU's wave slots, the scratch base, and
  each lane's private bytes handed to the emulator."""
  from test_device import _scratch_kernel
  dev, n = gfx942(), 40
  prg = dev.get_program(f"scr{n}", AMDGPUCompiler(ARCH).compile(_scratch_kernel(n)))
  assert prg.private_size >= 4 * n
  slots = dev.iface.node.cu_count * 32
  assert dev.tmpring_size == slots | (dev.scratch_wave_bytes // 1024) << 12 and dev.scratch_wave_bytes % 1024 == 0
  assert dev.scratch_wave_bytes >= prg.private_size * 64 and dev.scratch_buf.size >= slots * dev.scratch_wave_bytes
  x = rng.standard_normal(n).astype(np.float32)
  inp, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * 64)
  dev.allocator._copyin(inp, memoryview(x).cast("B"))
  prg(out, inp, global_size=(1, 1, 1), local_size=(64, 1, 1), wait=True)
  res = np.empty(64, np.float32)
  dev.allocator._copyout(memoryview(res).cast("B"), out)
  np.testing.assert_array_equal(res, x[np.arange(64) % n])
  regs = dev._driver.queues[dev.compute_ring.queue_id].regs
  assert regs[gfx9.REG["COMPUTE_TMPRING_SIZE"]] == dev.tmpring_size


def _f64_specials() -> np.ndarray:
  """64 float64s covering every V_CMP_CLASS class: signaling and quiet NaNs, +-inf, +-normal, +-denormal, +-0."""
  special = np.array([0x7FF0000000000001, 0xFFF0000000000001, 0x7FF8000000000000, 0xFFF8000000000000,  # sNaN, qNaN
                      0x7FF0000000000000, 0xFFF0000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF,  # inf, denorm
                      0x0000000000000000, 0x8000000000000000, 0x0010000000000000, 0xFFEFFFFFFFFFFFFF],  # 0, normal
                     np.uint64).view(np.float64)
  return np.concatenate([special, rng.standard_normal(26) * 1e-310, rng.standard_normal(26) * 1e300])


def _class_want(x: np.ndarray, mask: np.ndarray) -> int:
  """The CDNA3 ISA's V_CMP_CLASS_F64 by numpy's float classification: bit 0 sNaN, 1 qNaN, 2 -inf, 3 -normal,
  4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf; the lane's result is that bit of its mask."""
  bits, neg = x.view(np.uint64), np.signbit(x)
  quiet = (bits >> np.uint64(51)) & np.uint64(1) == 1
  tiny = (x != 0) & (np.abs(x) < np.finfo(np.float64).tiny) & ~np.isnan(x)
  cls = np.select([np.isnan(x) & ~quiet, np.isnan(x), np.isinf(x), tiny, x == 0],
                  [0, 1, np.where(neg, 2, 9), np.where(neg, 4, 7), np.where(neg, 5, 6)], np.where(neg, 3, 8))
  return sum(1 << i for i in range(64) if mask[i] >> cls[i] & 1)


def _set_f64(w, reg: int, x: np.ndarray) -> None:
  raw = x.view(np.uint64)
  w.vgpr[reg], w.vgpr[reg + 1] = [int(v) & 0xFFFFFFFF for v in raw], [int(v) >> 32 for v in raw]


# encodings from LLVM's assembler (llvm-mc -arch=amdgcn -mcpu=gfx90a -show-encoding; gfx90a's GFX9 VOPC/VOP1 encodings
# are gfx942's): v_cmp_class_f64_e64 s[0:1], v[0:1], v2 = d0120000 00020500; v_cmpx_class_f64_e64 = d0130000 ...;
# v_cmp_class_f64_e32 vcc, v[0:1], v2 = 7c240500
@pytest.mark.parametrize("word0, to", [(0xD0120000, "sgpr"), (0xD0130000, "exec"), (0x7C240500, "vcc")])
def test_cmp_class_f64(word0, to):
  """V_CMP_CLASS_F64 (VOPC opcode 0x12, V_CMPX 0x13): the lane's bit is mask[class(S0.f64)] of the 32-bit S1; NaN
  signaling/quiet, +-inf, +-denormal, +-0 each hit, every lane a different mask (and a full mask for each class)."""
  x = _f64_specials()
  mask = rng.integers(0, 1 << 10, 64)
  mask[:12] = [1 << c for c in (0, 0, 1, 1, 9, 2, 7, 4, 6, 5, 8, 3)]  # each special value's own class bit alone
  def setup(w):
    _set_f64(w, 0, x)
    w.vgpr[2] = [int(m) for m in mask]
  words = [word0] if to == "vcc" else [word0, 256 | (258 << 9)]
  w = _run_words(words, setup)
  want = _class_want(x, mask)
  assert want & 0xFFF == 0xFFF  # the specials' own bits: the reference and the table above agree
  got = w.vcc if to == "vcc" else w.sgpr[0] | (w.sgpr[1] << 32)
  assert got == want
  if to == "exec": assert w.exec == want  # V_CMPX writes EXEC too (GFX9)


def test_cmp_class_f64_neg_modifier():
  """v_cmp_class_f64_e64 s[0:1], -v[0:1], v2 (neg[0], VOP3 bit 61): the class of -S0 (NaNs stay NaNs)."""
  x, mask = _f64_specials(), rng.integers(0, 1 << 10, 64)
  def setup(w):
    _set_f64(w, 0, x)
    w.vgpr[2] = [int(m) for m in mask]
  w = _run_words([0xD0120000, 256 | (258 << 9) | (1 << 29)], setup)
  assert w.sgpr[0] | (w.sgpr[1] << 32) == _class_want(-x, mask)


def _ffbh_i32(v: int) -> int:
  """The ISA's V_FFBH_I32 loop: D = -1; for i in 1..31: if S0[31-i] != S0[31]: D = i; break."""
  for i in range(1, 32):
    if (v >> (31 - i) & 1) != v >> 31: return i
  return 0xFFFFFFFF


# v_ffbh_i32_e32 v0, v1 = 7e005f01; v_ffbh_i32_e64 v0, v1 = d16f0000 00000101 (llvm-mc, gfx90a)
@pytest.mark.parametrize("words", [[0x7E005F01], [0xD16F0000, 0x00000101]])
def test_ffbh_i32(words):
  """V_FFBH_I32 (VOP1 opcode 47): leading bits equal to the sign bit, counted from the MSB; -1 for 0 and -1."""
  vals = [0, 0xFFFFFFFF, 1, 0x7FFFFFFF, 0x80000000, 0xC0000000, 0x40000000, 0xFFFFFFFE, 0x3FFFFFFF]
  vals += [int(v) >> (i % 32) for i, v in enumerate(rng.integers(0, 1 << 32, 32, dtype=np.uint64))]  # long runs of 0
  vals += [~(int(v) >> (i % 32)) & 0xFFFFFFFF for i, v in enumerate(rng.integers(0, 1 << 32, 23, dtype=np.uint64))]
  def setup(w): w.vgpr[1] = vals
  w = _run_words(words, setup)
  assert w.vgpr[0] == [_ffbh_i32(v) for v in vals]
  assert w.vgpr[0][:9] == [0xFFFFFFFF, 0xFFFFFFFF, 31, 1, 1, 2, 1, 31, 2]


# s_{nand,nor,xnor}_b64 s[0:1], s[2:3], s[4:5] = 8b800402 / 8c800402 / 8d800402 (llvm-mc, gfx90a): SOP2 23/25/27
@pytest.mark.parametrize("word, fn", [(0x8B800402, lambda a, b: ~(a & b)), (0x8C800402, lambda a, b: ~(a | b)),
                                      (0x8D800402, lambda a, b: ~(a ^ b))])
@pytest.mark.parametrize("a, b", [(0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF), (0, 0), (0xFFFFFFFFFFFFFFFF, 0),
                                  (0x8000000000000001, 0x00000000FFFFFFFF), (0x0123456789ABCDEF, 0xFEDCBA9876543210)])
def test_sop2_nand_nor_xnor_b64(word, fn, a, b):
  """S_NAND/NOR/XNOR_B64: D.u64 = ~(S0 op S1) over all 64 bits, SCC = (D != 0) (numpy uint64 reference)."""
  def setup(w):
    w.sgpr[2], w.sgpr[3], w.sgpr[4], w.sgpr[5] = a & 0xFFFFFFFF, a >> 32, b & 0xFFFFFFFF, b >> 32
  w = _run_words([word], setup)
  want = int(fn(np.uint64(a), np.uint64(b)))
  assert (w.sgpr[0] | (w.sgpr[1] << 32), w.scc) == (want, int(want != 0))
