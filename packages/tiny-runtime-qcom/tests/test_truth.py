"""Every hardware fact the QCOM driver encodes, against a source not typed here (tests/oracle.py): Mesa's Adreno
register database and KGSL's UAPI header as tinygrad 0.14.0's wheel ships them, Khronos' OpenCL headers, tinygrad's
own Adreno packet and binary code, and the PoCL library's exported ICD entry points."""
from __future__ import annotations

import ctypes
import itertools
import types

import oracle
import pytest
from oracle import field

from tiny_runtime_qcom import a6xx, adreno, kgsl, opencl
from tiny_runtime_qcom.mock import cp

M = oracle.mesa


# ***** packets *****
def test_packet_headers_match_tinygrad_and_mesa():
  m, q = M(), oracle.ops_qcom()
  assert (a6xx.CP_TYPE4_PKT, a6xx.CP_TYPE7_PKT) == (m["CP_TYPE4_PKT"], m["CP_TYPE7_PKT"])
  for op, cnt in itertools.product(range(0x80), (0, 1, 2, 3, 6, 7, 100, 0x3FFF)):
    assert a6xx.pkt7(op, cnt) == q.pkt7_hdr(op, cnt), (op, cnt)
  for reg, cnt in itertools.product(list(a6xx.REGISTERS) + [0, 1, 0x3FFFF, 0x2AAAA], (1, 2, 7, 10, 0x7F)):
    assert a6xx.pkt4(reg, cnt) == q.pkt4_hdr(reg, cnt), (hex(reg), cnt)
  with pytest.raises(ValueError, match="valid: 1..127"): a6xx.pkt4(0xA9B0, 128)
  with pytest.raises(ValueError, match="7 bits"): a6xx.pkt7(0x80, 1)


def test_opcodes_and_enums_are_mesas():
  m = M()
  for op, name in a6xx.OPCODE_NAMES.items(): assert m[name] == op, name
  names = {"CACHE_FLUSH_TS": a6xx.CACHE_FLUSH_TS, "CACHE_INVALIDATE": a6xx.CACHE_INVALIDATE,
           "WRITE_GE": a6xx.WRITE_GE, "POLL_MEMORY": a6xx.POLL_MEMORY, "RM6_COMPUTE": a6xx.RM6_COMPUTE,
           "ST6_SHADER": a6xx.ST6_SHADER, "ST6_CONSTANTS": a6xx.ST6_CONSTANTS, "ST6_UAV": a6xx.ST6_UAV,
           "SS6_DIRECT": a6xx.SS6_DIRECT, "SS6_INDIRECT": a6xx.SS6_INDIRECT, "SB6_CS_TEX": a6xx.SB6_CS_TEX,
           "SB6_CS_SHADER": a6xx.SB6_CS_SHADER, "ISAMMODE_CL": a6xx.ISAMMODE_CL, "THREAD64": a6xx.THREAD64,
           "THREAD128": a6xx.THREAD128, "CONSTLEN_256": a6xx.CONSTLEN_256,
           "FMT6_32_32_32_32_FLOAT": a6xx.FMT6_32_32_32_32_FLOAT, "FMT6_16_16_16_16_FLOAT": a6xx.FMT6_16_16_16_16_FLOAT,
           "A6XX_TEX_2D": a6xx.A6XX_TEX_2D, "A6XX_TEX_X": a6xx.TEX_X, "A6XX_TEX_Y": a6xx.TEX_Y,
           "A6XX_TEX_Z": a6xx.TEX_Z, "A6XX_TEX_W": a6xx.TEX_W, "A6XX_TEX_NEAREST": a6xx.TEX_NEAREST,
           "A6XX_TEX_CLAMP_TO_BORDER": a6xx.TEX_CLAMP_TO_BORDER, "REG_A6XX_CP_ALWAYS_ON_COUNTER":
           a6xx.REG_CP_ALWAYS_ON_COUNTER, "CP_REG_TO_MEM_0_64B": a6xx.CP_REG_TO_MEM_0_64B}
  for name, v in names.items(): assert m[name] == v, name


def test_every_register_address_is_mesas():
  m = M()
  for reg, name in a6xx.REGISTERS.items():
    base, _, plus = name.partition("+")
    assert m[f"REG_A6XX_{base}"] + int(plus or 0) == reg, name


def test_register_fields_decode_with_mesas_masks():
  m = M()
  v = a6xx.load_state6_0(a6xx.ST6_UAV, a6xx.SS6_INDIRECT, a6xx.SB6_CS_SHADER, 777, dst_off=5)
  names = ("STATE_TYPE", "STATE_SRC", "STATE_BLOCK", "NUM_UNIT", "DST_OFF")
  assert [field(v, f"CP_LOAD_STATE6_0_{f}") for f in names] == [a6xx.ST6_UAV, a6xx.SS6_INDIRECT, a6xx.SB6_CS_SHADER,
                                                                 777, 5]
  # the most units one CP_LOAD_STATE6 can carry (a bigger shader is preloaded in part), in the driver and the mock,
  # is the NUM_UNIT field's width in Mesa's mask
  widest = m["CP_LOAD_STATE6_0_NUM_UNIT__MASK"] >> m["CP_LOAD_STATE6_0_NUM_UNIT__SHIFT"]
  assert a6xx.LOAD_STATE6_MAX_UNITS == widest == (1 << cp.NUM_UNIT_BITS) - 1
  most = a6xx.load_state6_0(a6xx.ST6_SHADER, a6xx.SS6_INDIRECT, a6xx.SB6_CS_SHADER, widest)
  assert field(most, "CP_LOAD_STATE6_0_NUM_UNIT") == widest and field(most, "CP_LOAD_STATE6_0_STATE_BLOCK") == \
    a6xx.SB6_CS_SHADER
  with pytest.raises(ValueError, match=f"valid: 0..{widest}"):
    a6xx.load_state6_0(a6xx.ST6_SHADER, a6xx.SS6_INDIRECT, a6xx.SB6_CS_SHADER, widest + 1)
  v = a6xx.sp_cs_cntl_0(a6xx.THREAD128, 13, 41, 9)
  assert [field(v, f"A6XX_SP_CS_CNTL_0_{f}") for f in ("THREADSIZE", "HALFREGFOOTPRINT", "FULLREGFOOTPRINT",
                                                      "BRANCHSTACK")] == [1, 13, 41, 9]
  v = a6xx.ndrange_0((64, 3, 1024))
  assert [field(v, f"A6XX_SP_CS_NDRANGE_0_{f}") for f in ("KERNELDIM", "LOCALSIZEX", "LOCALSIZEY", "LOCALSIZEZ")] \
    == [3, 63, 2, 1023]
  cfg = a6xx.SP_CS_CONFIG_ENABLED | 3 << a6xx.SP_CS_CONFIG_NTEX_SHIFT | 2 << a6xx.SP_CS_CONFIG_NSAMP_SHIFT | \
    5 << a6xx.SP_CS_CONFIG_NUAV_SHIFT
  assert cfg & m["A6XX_SP_CS_CONFIG_ENABLED"]
  assert [field(cfg, f"A6XX_SP_CS_CONFIG_{f}") for f in ("NTEX", "NSAMP", "NUAV")] == [3, 2, 5]
  assert (a6xx.SP_UPDATE_CNTL_CS_STATE, a6xx.SP_UPDATE_CNTL_CS_UAV) == (m["A6XX_SP_UPDATE_CNTL_CS_STATE"],
                                                                       m["A6XX_SP_UPDATE_CNTL_CS_UAV"])
  assert a6xx.SP_PERFCTR_SHADER_MASK_CS == m["A6XX_SP_PERFCTR_SHADER_MASK_CS"]
  assert a6xx.SP_CS_CONST_CONFIG_ENABLED == m["A6XX_SP_CS_CONST_CONFIG_ENABLED"]
  assert field(a6xx.ISAMMODE_CL << a6xx.SP_MODE_CNTL_ISAMMODE_SHIFT, "A6XX_SP_MODE_CNTL_ISAMMODE") == m["ISAMMODE_CL"]
  assert field(a6xx.ISAMMODE_CL << a6xx.TPL1_MODE_CNTL_ISAMMODE_SHIFT, "A6XX_TPL1_MODE_CNTL_ISAMMODE") == 1
  cntl1 = a6xx.CONSTLEN_256 << 5 | 7
  assert (field(cntl1, "A6XX_SP_CS_CNTL_1_CONSTANTRAMMODE"), field(cntl1, "A6XX_SP_CS_CNTL_1_SHARED_SIZE")) == (2, 7)
  assert field(a6xx.REGID_NONE | a6xx.THREAD64 << 9, "A6XX_SP_CS_WGE_CNTL_THREADSIZE") == a6xx.THREAD64


def _queue_packets(dwords: list[int]) -> list[tuple[int, int, list[int]]]:
  out, i = [], 0
  while i < len(dwords):
    h = dwords[i]
    typ, cnt = h >> 28, (h & 0x7F if h >> 28 == 4 else h & 0x3FFF)
    out.append((typ, (h >> 8) & 0x3FFFF if typ == 4 else (h >> 16) & 0x7F, dwords[i + 1:i + 1 + cnt]))
    i += 1 + cnt
  return out


def test_queue_commands_decode_with_mesas_fields():
  """wait / signal / timestamp / barrier as Mesa's field definitions read them."""
  m = M()
  sig = types.SimpleNamespace(addr=0x1234_5678_9AB0)
  flush = 0x1234_5678_9AF0
  q = type("Q", (a6xx.QCOMComputeQueue,), {"flush_addr": flush})()
  q.wait(sig, 41).signal(sig, 42).timestamp(sig)  # type: ignore[arg-type]
  pk = _queue_packets(q.resolved())
  barrier = _queue_packets(q.memory_barrier().resolved())[len(pk):]
  wait = next(b for t, op, b in pk if t == 7 and op == m["CP_WAIT_REG_MEM"])
  assert field(wait[0], "CP_WAIT_REG_MEM_0_FUNCTION") == m["WRITE_GE"]
  assert field(wait[0], "CP_WAIT_REG_MEM_0_POLL") == m["POLL_MEMORY"]
  assert wait[1] | wait[2] << 32 == sig.addr and wait[3] == 41 and wait[4] == 0xFFFFFFFF
  ev = [b for t, op, b in pk if t == 7 and op == m["CP_EVENT_WRITE"]]
  assert field(ev[0][0], "CP_EVENT_WRITE_0_EVENT") == m["CACHE_FLUSH_TS"] and ev[0][1] | ev[0][2] << 32 == sig.addr
  assert ev[0][3] == 42
  # the barrier in Mesa turnip's tu6_emit_flushes order: write back (CACHE_FLUSH_TS), invalidate, wait for memory
  # writes, wait for idle -- after waiting for the earlier dispatches
  ops = [(op, field(b[0], "CP_EVENT_WRITE_0_EVENT") if op == m["CP_EVENT_WRITE"] else None) for _, op, b in barrier]
  assert ops == [(m["CP_WAIT_FOR_IDLE"], None), (m["CP_EVENT_WRITE"], m["CACHE_FLUSH_TS"]),
                 (m["CP_EVENT_WRITE"], m["CACHE_INVALIDATE"]), (m["CP_WAIT_MEM_WRITES"], None),
                 (m["CP_WAIT_FOR_IDLE"], None)]
  assert barrier[1][2][1] | barrier[1][2][2] << 32 == flush
  r2m = next(b for t, op, b in pk if t == 7 and op == m["CP_REG_TO_MEM"])
  assert field(r2m[0], "CP_REG_TO_MEM_0_REG") == m["REG_A6XX_CP_ALWAYS_ON_COUNTER"]
  assert field(r2m[0], "CP_REG_TO_MEM_0_CNT") == 2 and r2m[0] & m["CP_REG_TO_MEM_0_64B"]
  assert r2m[1] | r2m[2] << 32 == sig.addr + 8


# ***** descriptors *****
def test_texture_descriptor_fields_are_mesas():
  m = M()
  d = a6xx.tex_const(a6xx.TexDesc(a6xx.FMT6_32_32_32_32_FLOAT, 300, 17, 300 * 16 + 64 * 3, 0x1_2345_6780))
  assert len(d) == a6xx.TEX_CONST_DWORDS == 16
  assert field(d[0], "A6XX_TEX_CONST_0_FMT") == m["FMT6_32_32_32_32_FLOAT"]
  assert field(d[0], "A6XX_TEX_CONST_0_TILE_MODE") == m["TILE6_LINEAR"]
  assert [field(d[0], f"A6XX_TEX_CONST_0_SWIZ_{c}") for c in "XYZW"] == [m[f"A6XX_TEX_{c}"] for c in "XYZW"]
  assert (field(d[1], "A6XX_TEX_CONST_1_WIDTH"), field(d[1], "A6XX_TEX_CONST_1_HEIGHT")) == (300, 17)
  assert field(d[2], "A6XX_TEX_CONST_2_TYPE") == m["A6XX_TEX_2D"]
  assert field(d[2], "A6XX_TEX_CONST_2_PITCH") == 300 * 16 + 64 * 3
  assert field(d[2], "A6XX_TEX_CONST_2_PITCHALIGN") == 1  # 4992 = 128 * 39: aligned to 64 << 1
  base = field(d[4], "A6XX_TEX_CONST_4_BASE_LO") << m["A6XX_TEX_CONST_4_BASE_LO__SHIFT"] | \
    field(d[5], "A6XX_TEX_CONST_5_BASE_HI") << 32
  assert base == 0x1_2345_6780
  d2 = a6xx.tex_const(a6xx.TexDesc(a6xx.FMT6_16_16_16_16_FLOAT, 64, 2, 1024, 0x1000))
  assert field(d2[2], "A6XX_TEX_CONST_2_PITCHALIGN") == 4 and field(d2[0], "A6XX_TEX_CONST_0_FMT") == \
    m["FMT6_16_16_16_16_FLOAT"]
  u = a6xx.tex_const(a6xx.TexDesc(a6xx.FMT6_32_32_32_32_FLOAT, 64, 2, 1024, 0x1000), storage=True)
  assert [field(u[0], f"A6XX_TEX_CONST_0_SWIZ_{c}") for c in "XYZW"] == [0] * 4 and u[1:] == d2[1:] and \
    field(u[0], "A6XX_TEX_CONST_0_FMT") == m["FMT6_32_32_32_32_FLOAT"]
  for bad, msg in ((a6xx.TexDesc(a6xx.FMT6_32_32_32_32_FLOAT, 3, 1, 48, 0), "multiple of 64"),
                   (a6xx.TexDesc(a6xx.FMT6_32_32_32_32_FLOAT, 4, 1, 64, 0x1010), "32-byte aligned"),
                   (a6xx.TexDesc(0x30, 4, 1, 64, 0), "texture format")):
    with pytest.raises(ValueError, match=msg): a6xx.tex_const(bad)


def test_sampler_descriptor_fields_are_mesas():
  m = M()
  s = a6xx.tex_samp_nearest_unnorm_border()
  assert len(s) == a6xx.TEX_SAMP_DWORDS == 4
  assert [field(s[0], f"A6XX_TEX_SAMP_0_{f}") for f in ("XY_MAG", "XY_MIN", "WRAP_S", "WRAP_T", "WRAP_R")] == \
    [m["A6XX_TEX_NEAREST"]] * 2 + [m["A6XX_TEX_CLAMP_TO_BORDER"]] * 3
  assert s[1] == m["A6XX_TEX_SAMP_1_UNNORM_COORDS"] | m["A6XX_TEX_SAMP_1_CUBEMAPSEAMLESSFILTOFF"]


# ***** KGSL *****
def test_kgsl_ioctl_numbers_and_struct_layouts_are_the_headers():
  k = oracle.kgsl()
  for name in kgsl.IOCTLS:
    d, typ, nr, st = getattr(k, f"IOCTL_KGSL_{name}").args
    assert kgsl.ioctl_number(name) == (d << 30) | (ctypes.sizeof(st) << 16) | (typ << 8) | nr, name
    ours = kgsl.IOCTLS[name][2]
    assert kgsl.ffi.sizeof(f"struct {ours}") == st.SIZE, ours
    for fname, ftype, off in st._real_fields_:
      assert kgsl.ffi.offsetof(f"struct {ours}", fname) == off, (ours, fname)
      assert kgsl.ffi.sizeof(kgsl.ffi.typeof(f"struct {ours}").fields[[f for f, _ in kgsl.ffi.typeof(
        f"struct {ours}").fields].index(fname)][1].type) == ctypes.sizeof(ftype), (ours, fname)
  for ours, theirs in (("kgsl_devinfo", "struct_kgsl_devinfo"), ("kgsl_version", "struct_kgsl_version"),
                       ("kgsl_command_object", "struct_kgsl_command_object"),
                       ("kgsl_device_constraint", "struct_kgsl_device_constraint"),
                       ("kgsl_device_constraint_pwrlevel", "struct_kgsl_device_constraint_pwrlevel"),
                       ("kgsl_command_syncpoint", "struct_kgsl_command_syncpoint"),
                       ("kgsl_cmd_syncpoint_timestamp", "struct_kgsl_cmd_syncpoint_timestamp"),
                       ("kgsl_gpu_event_timestamp", "struct_kgsl_gpu_event_timestamp")):
    st = getattr(k, theirs)
    assert kgsl.ffi.sizeof(f"struct {ours}") == st.SIZE
    assert {f: kgsl.ffi.offsetof(f"struct {ours}", f) for f, _, _ in st._real_fields_} == \
      {f: off for f, _, off in st._real_fields_}


def test_kgsl_flags_are_the_headers():
  k = oracle.kgsl()
  pairs = {"KGSL_PROP_DEVICE_INFO": kgsl.PROP_DEVICE_INFO, "KGSL_PROP_VERSION": kgsl.PROP_VERSION,
           "KGSL_CONTEXT_NO_GMEM_ALLOC": kgsl.CONTEXT_NO_GMEM_ALLOC, "KGSL_CONTEXT_PREAMBLE": kgsl.CONTEXT_PREAMBLE,
           "KGSL_CONTEXT_NO_FAULT_TOLERANCE": kgsl.CONTEXT_NO_FAULT_TOLERANCE,
           "KGSL_CONTEXT_PRIORITY_SHIFT": kgsl.CONTEXT_PRIORITY_SHIFT, "KGSL_CONTEXT_PRIORITY_MASK":
           kgsl.CONTEXT_PRIORITY_MASK, "KGSL_CONTEXT_TYPE_SHIFT": kgsl.CONTEXT_TYPE_SHIFT,
           "KGSL_CONTEXT_TYPE_MASK": kgsl.CONTEXT_TYPE_MASK, "KGSL_CONTEXT_TYPE_CL": kgsl.CONTEXT_TYPE_CL,
           "KGSL_CONTEXT_PREEMPT_STYLE_SHIFT": kgsl.CONTEXT_PREEMPT_STYLE_SHIFT,
           "KGSL_CONTEXT_PREEMPT_STYLE_MASK": kgsl.CONTEXT_PREEMPT_STYLE_MASK,
           "KGSL_CONTEXT_PREEMPT_STYLE_FINEGRAIN": kgsl.CONTEXT_PREEMPT_STYLE_FINEGRAIN,
           "KGSL_MEMFLAGS_USE_CPU_MAP": kgsl.MEMFLAGS_USE_CPU_MAP, "KGSL_MEMALIGN_SHIFT": kgsl.MEMALIGN_SHIFT,
           "KGSL_MEMALIGN_MASK": kgsl.MEMALIGN_MASK, "KGSL_CACHEMODE_SHIFT": kgsl.CACHEMODE_SHIFT,
           "KGSL_CACHEMODE_MASK": kgsl.CACHEMODE_MASK, "KGSL_CACHEMODE_UNCACHED": kgsl.CACHEMODE_UNCACHED,
           "KGSL_MEMTYPE_SHIFT": kgsl.MEMTYPE_SHIFT, "KGSL_MEMTYPE_MASK": kgsl.MEMTYPE_MASK,
           "KGSL_MEMTYPE_CL": kgsl.MEMTYPE_CL, "KGSL_CMDLIST_IB": kgsl.CMDLIST_IB,
           "KGSL_TIMESTAMP_RETIRED": kgsl.TIMESTAMP_RETIRED,
           "KGSL_TIMESTAMP_CONSUMED": kgsl.TIMESTAMP_CONSUMED, "KGSL_TIMESTAMP_QUEUED": kgsl.TIMESTAMP_QUEUED,
           "KGSL_IOC_TYPE": kgsl.KGSL_IOC_TYPE,
           "KGSL_PROP_PWR_CONSTRAINT": kgsl.PROP_PWR_CONSTRAINT, "KGSL_CONTEXT_PWR_CONSTRAINT":
           kgsl.CONTEXT_PWR_CONSTRAINT, "KGSL_CONSTRAINT_NONE": kgsl.CONSTRAINT_NONE,
           "KGSL_CONSTRAINT_PWRLEVEL": kgsl.CONSTRAINT_PWRLEVEL, "KGSL_CONSTRAINT_PWR_MIN": kgsl.CONSTRAINT_PWR_MIN,
           "KGSL_CONSTRAINT_PWR_MAX": kgsl.CONSTRAINT_PWR_MAX,
           "KGSL_CMDLIST_CTXTSWITCH_PREAMBLE": kgsl.CMDLIST_CTXTSWITCH_PREAMBLE,
           "KGSL_CMDLIST_IB_PREAMBLE": kgsl.CMDLIST_IB_PREAMBLE, "KGSL_OBJLIST_MEMOBJ": kgsl.OBJLIST_MEMOBJ,
           "KGSL_OBJLIST_PROFILE": kgsl.OBJLIST_PROFILE, "KGSL_CMDBATCH_MARKER": kgsl.DRAWOBJ_MARKER,
           "KGSL_CMDBATCH_SYNC": kgsl.DRAWOBJ_SYNC,
           "KGSL_CMD_SYNCPOINT_TYPE_TIMESTAMP": kgsl.CMD_SYNCPOINT_TYPE_TIMESTAMP,
           "KGSL_CMD_SYNCPOINT_TYPE_FENCE": kgsl.CMD_SYNCPOINT_TYPE_FENCE,
           "KGSL_GPUOBJ_FREE_ON_EVENT": kgsl.GPUOBJ_FREE_ON_EVENT, "KGSL_GPU_EVENT_TIMESTAMP": kgsl.GPU_EVENT_TIMESTAMP,
           "KGSL_GPU_EVENT_FENCE": kgsl.GPU_EVENT_FENCE}
  for name, v in pairs.items(): assert getattr(k, name) == v, name


# ***** OpenCL *****
def test_opencl_constants_and_structs_are_khronos():
  cl = oracle.opencl()
  for name in ("CL_SUCCESS", "CL_MEM_READ_WRITE", "CL_MEM_WRITE_ONLY", "CL_MEM_READ_ONLY", "CL_MEM_USE_HOST_PTR",
               "CL_MEM_COPY_HOST_PTR", "CL_MAP_READ", "CL_MAP_WRITE", "CL_PLATFORM_NAME",
               "CL_DEVICE_MAX_WORK_GROUP_SIZE", "CL_DEVICE_MAX_WORK_ITEM_SIZES", "CL_DEVICE_MEM_BASE_ADDR_ALIGN",
               "CL_DEVICE_LOCAL_MEM_SIZE", "CL_DEVICE_NAME", "CL_DEVICE_EXTENSIONS", "CL_PROGRAM_BINARY_SIZES",
               "CL_PROGRAM_BINARIES", "CL_PROGRAM_BUILD_LOG", "CL_BUFFER_CREATE_TYPE_REGION", "CL_RGBA",
               "CL_HALF_FLOAT", "CL_FLOAT", "CL_MEM_OBJECT_IMAGE2D", "CL_OUT_OF_RESOURCES",
               "CL_MEM_OBJECT_ALLOCATION_FAILURE", "CL_INVALID_BUFFER_SIZE"):
    assert getattr(opencl, name) == cl[name], name
  for code, name in opencl.ERROR_NAMES.items():  # CL_PLATFORM_NOT_FOUND_KHR is cl_ext.h's (cl_khr_icd), not cl.h's
    if name != "CL_PLATFORM_NOT_FOUND_KHR": assert cl[name] == code, name
  o = __import__("tinygrad.runtime.autogen.opencl", fromlist=["x"])
  for ours, theirs in (("cl_image_desc", "struct__cl_image_desc"), ("cl_image_format", "struct__cl_image_format"),
                       ("cl_buffer_region", "struct__cl_buffer_region")):
    st = getattr(o, theirs)
    assert opencl.ffi.sizeof(ours) == st.SIZE, ours
    for f, _, off in st._real_fields_:
      if f != "mem_object": assert opencl.ffi.offsetof(ours, f) == off, (ours, f)  # a union with `buffer`


def test_icd_dispatch_table_order_is_the_vendors():
  """The PyPI PoCL library exports a few of its dispatch table's functions by name (POcl*): each sits in the table at
  the member our `struct icd_dispatch` names it."""
  path = opencl.pypi_pocl()
  assert path is not None, "pocl-binary-distribution (a test dependency) is not installed"
  icd = opencl.load_icd(path)
  table = opencl.ffi.cast("void**", icd._dispatch)
  lib = ctypes.CDLL(path)
  for name in ("clRetainEvent", "clReleaseEvent", "clGetExtensionFunctionAddress", "clReleaseDevice"):
    idx = opencl.ffi.offsetof("struct icd_dispatch", name) // opencl.ffi.sizeof("void*")
    assert idx == opencl.ICD_ORDER.index(name)
    assert int(opencl.ffi.cast("uintptr_t", table[idx])) == ctypes.cast(getattr(lib, "POcl" + name[2:]),
                                                                         ctypes.c_void_p).value, name


# ***** the Adreno program binary *****
def test_mock_binaries_parse_the_same_with_tinygrads_parser():
  """tinygrad's parser of the Qualcomm compiler's binaries reads the mock compiler's binaries as ours does: the layout
  the driver relies on is the one seen in the real binaries."""
  from tiny_runtime_qcom.mock.compiler import MockAdrenoCompiler
  from tiny_runtime_qcom.mock.driver import driver
  src = ("__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;\n"
         "/* image data1 3x8 */\n__kernel void k(__global float* restrict data0, read_only image2d_t data1, "
         "__global float* restrict data2, const int n) {\n  for (int i = 0; i < n; i++) data0[i] = "
         "read_imagef(data1, smp, (int2)(i % 8, i / 8)).x + data2[i];\n}\n")
  lib = MockAdrenoCompiler(driver()).compile(src)
  info, blob = adreno.unpack_lib(lib)
  ours = adreno.AdrenoBinary.parse(blob, "k")
  theirs = types.SimpleNamespace(name="k")
  oracle.ops_qcom().QCOMProgram._parse_lib(theirs, blob)
  assert theirs.image == ours.image and theirs.image_size == len(ours.image)
  assert (theirs.fregs, theirs.hregs, theirs.prg_offset, theirs.pvtmem, theirs.shmem, theirs.brnchstck) == \
    (ours.fregs, ours.hregs, ours.pc_offset, ours.pvtmem, ours.shmem, ours.branchstack)
  assert theirs.samp_cnt == ours.samplers + 1 == 2  # tinygrad counts an extra sampler for the blob's own use
  assert (theirs.tex_cnt, theirs.ibo_cnt) == (1, 0)
  assert theirs.buf_offs == [a.const_off for a in ours.args if a.kind == adreno.ARG_CONST]
  assert theirs.consts_info == list(ours.consts) and ours.consts
  assert [a[0] for a in info.args] == ["buf", "tex", "buf", "val"] and info.args[1][1:] == (3, 8)
