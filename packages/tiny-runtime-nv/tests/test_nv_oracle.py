"""Independent truth for the NV driver's facts: every struct layout, ioctl number, RM class and control id, status code,
flag position, pushbuffer method offset and field, GPFIFO entry field, USERD offset and QMD 03_00 bit position the
driver (`rm.py`, `push.py`, `device.py`) and the mock GPU (`mock/gpu.py`) encode, against tinygrad 0.14.0's bindings
generated from NVIDIA's open-gpu-kernel-modules headers (`tinygrad/runtime/autogen/nv_570.py`, `nv_580.py`: a
test-only dependency, never skipped). The 570 and 580 branches' layouts are checked against their own bindings."""
from __future__ import annotations

import pytest
import tinygrad.runtime.autogen.nv_570 as tg570
import tinygrad.runtime.autogen.nv_580 as tg580
from tinygrad.runtime.support.c import _IOWR

from tiny_runtime_nv import push, rm
from tiny_runtime_nv.mock import gpu as mgpu

ORACLE = {"570": tg570, "580": tg580}
# our struct name -> the binding's name where it differs
RENAMED = {"NV_MEMORY_DESC_PARAMS": "struct_NV_MEMORY_DESC_PARAMS"}


def _structs(branch: str) -> list[str]:
  ffi = rm.layouts(branch)
  names = [n for n in ffi.list_types()[0]]
  assert len(names) >= 35
  return names


@pytest.mark.parametrize("branch", rm.SUPPORTED_BRANCHES)
def test_every_struct_matches_the_branch_headers(branch):
  ffi, tg = rm.layouts(branch), ORACLE[branch]
  for name in _structs(branch):
    theirs = getattr(tg, RENAMED.get(name, name))
    assert ffi.sizeof(name) == theirs.SIZE, f"{branch} {name}: {ffi.sizeof(name)} bytes, header {theirs.SIZE}"
    ours = {f: ffi.offsetof(name, f) for f, _ in ffi.typeof(name).fields}
    fields = {f[0]: f[2] for f in theirs._real_fields_}
    assert ours == fields, f"{branch} {name}: {ours} vs {fields}"


def test_the_branches_really_differ_and_an_unknown_one_is_refused():
  assert rm.layouts("570").sizeof("NVOS46_PARAMETERS") != rm.layouts("580").sizeof("NVOS46_PARAMETERS")
  assert rm.branch_of("580.95.05") == "580" and rm.branch_of("570.133.20") == "570"
  with pytest.raises(RuntimeError, match=r"NVIDIA driver 610\.1\.2 is not supported.*570\.x, 580\.x"):
    rm.branch_of("610.1.2")


def test_escape_and_uvm_numbers():
  tg = tg580
  assert rm.NV_IOCTL_MAGIC == tg.NV_IOCTL_MAGIC and rm.ESC_CARD_INFO == tg.NV_ESC_CARD_INFO == tg.NV_IOCTL_BASE
  for ours, theirs in ((rm.ESC_RM_ALLOC_MEMORY, "NV_ESC_RM_ALLOC_MEMORY"), (rm.ESC_RM_FREE, "NV_ESC_RM_FREE"),
                       (rm.ESC_RM_CONTROL, "NV_ESC_RM_CONTROL"), (rm.ESC_RM_ALLOC, "NV_ESC_RM_ALLOC"),
                       (rm.ESC_RM_MAP_MEMORY, "NV_ESC_RM_MAP_MEMORY"),
                       (rm.ESC_RM_MAP_MEMORY_DMA, "NV_ESC_RM_MAP_MEMORY_DMA"),
                       (rm.ESC_REGISTER_FD, "NV_ESC_REGISTER_FD")):
    assert ours == getattr(tg, theirs), theirs
  import tinygrad.runtime.support.hcq as tghcq

  class Recorder(tghcq.FileIOInterface):  # catches the request tinygrad's _IOWR computes from the header's struct
    def __init__(self): self.req = None
    def ioctl(self, req, arg): self.req = req; return 0  # noqa: E702
  ffi = rm.layouts("580")
  for nr, st in rm.ESCAPES.items():  # _IOWR('F', nr, params) as the kernel module decodes it
    rec = Recorder()
    _IOWR("F", nr, getattr(tg, st))(rec)
    assert rm.escape_number(nr, ffi.sizeof(st)) == rec.req, st
  for cmd, st in rm.UVM_IOCTLS.items():
    assert cmd == getattr(tg, st.removesuffix("_PARAMS")), st


def test_classes_controls_and_status_codes():
  tg = tg580
  names = ["NV01_ROOT_CLIENT", "NV01_DEVICE_0", "NV20_SUBDEVICE_0", "NV01_MEMORY_VIRTUAL", "NV1_MEMORY_USER",
           "NV1_MEMORY_SYSTEM", "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR", "FERMI_VASPACE_A", "KEPLER_CHANNEL_GROUP_A",
           "FERMI_CONTEXT_SHARE_A", "TURING_USERMODE_A", "AMPERE_USERMODE_A", "HOPPER_USERMODE_A",
           "AMPERE_CHANNEL_GPFIFO_A", "HOPPER_CHANNEL_GPFIFO_A", "AMPERE_COMPUTE_A", "AMPERE_COMPUTE_B",
           "ADA_COMPUTE_A",
           "HOPPER_COMPUTE_A", "AMPERE_DMA_COPY_A", "AMPERE_DMA_COPY_B", "HOPPER_DMA_COPY_A", "GT200_DEBUGGER"]
  for n in names: assert getattr(rm, n) == getattr(tg, n), n
  ctrl = {"CTRL_SYSTEM_GET_BUILD_VERSION_V2": "NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2",
          "CTRL_GPU_GET_ID_INFO_V2": "NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2",
          "CTRL_GPU_GET_CLASSLIST_V2": "NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2",
          "CTRL_GPU_GET_GID_INFO": "NV2080_CTRL_CMD_GPU_GET_GID_INFO",
          "CTRL_GR_GET_INFO": "NV2080_CTRL_CMD_GR_GET_INFO",
          "CTRL_GPFIFO_SCHEDULE": "NVA06C_CTRL_CMD_GPFIFO_SCHEDULE",
          "CTRL_GPFIFO_GET_WORK_SUBMIT_TOKEN": "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN",
          "CTRL_GPU_GET_CLASSLIST": "NV0080_CTRL_CMD_GPU_GET_CLASSLIST",
          "CTRL_PERF_BOOST": "NV2080_CTRL_CMD_PERF_BOOST"}
  for ours, theirs in ctrl.items(): assert getattr(rm, ours) == getattr(tg, theirs), theirs
  for v, name in rm.STATUS_NAMES.items(): assert getattr(tg, name) == v, name
  gr = {"GR_INFO_SM_VERSION": "NV2080_CTRL_GR_INFO_INDEX_SM_VERSION",
        "GR_INFO_MAX_WARPS_PER_SM": "NV2080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM",
        "GR_INFO_NUM_GPCS": "NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS",
        "GR_INFO_NUM_TPC_PER_GPC": "NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC",
        "GR_INFO_NUM_SM_PER_TPC": "NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC",
        "GID_FLAGS_FORMAT_BINARY": "NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY",
        "ENGINE_TYPE_GRAPHICS": "NV2080_ENGINE_TYPE_GRAPHICS",
        "VASPACE_FLAGS_IS_EXTERNALLY_OWNED": "NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED",
        "VASPACE_FLAGS_ENABLE_PAGE_FAULTING": "NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING",
        "CTXSHARE_FLAGS_SUBCONTEXT_ASYNC": "NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC"}
  for ours, theirs in gr.items(): assert getattr(rm, ours) == getattr(tg, theirs), theirs


def test_memory_flags():
  tg = tg580
  values = {"OS32_TYPE_IMAGE": "NVOS32_TYPE_IMAGE", "OS32_TYPE_NOTIFIER": "NVOS32_TYPE_NOTIFIER",
            "OS32_ALLOC_FLAGS_IGNORE_BANK_PLACEMENT": "NVOS32_ALLOC_FLAGS_IGNORE_BANK_PLACEMENT",
            "OS32_ALLOC_FLAGS_ALIGNMENT_FORCE": "NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE",
            "OS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED": "NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED",
            "OS32_ALLOC_FLAGS_MAP_NOT_REQUIRED": "NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED",
            "OS32_ALLOC_FLAGS_PERSISTENT_VIDMEM": "NVOS32_ALLOC_FLAGS_PERSISTENT_VIDMEM",
            "OS32_ATTR_PHYSICALITY_CONTIGUOUS": "NVOS32_ATTR_PHYSICALITY_CONTIGUOUS",
            "OS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS": "NVOS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS",
            "OS32_ATTR_LOCATION_PCI": "NVOS32_ATTR_LOCATION_PCI",
            "OS32_ATTR2_GPU_CACHEABLE_YES": "NVOS32_ATTR2_GPU_CACHEABLE_YES",
            "OS32_ATTR2_GPU_CACHEABLE_NO": "NVOS32_ATTR2_GPU_CACHEABLE_NO",
            "OS32_ATTR2_ZBC_PREFER_NO_ZBC": "NVOS32_ATTR2_ZBC_PREFER_NO_ZBC",
            "OS02_FLAGS_PHYSICALITY_NONCONTIGUOUS": "NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS",
            "OS02_FLAGS_COHERENCY_CACHED": "NVOS02_FLAGS_COHERENCY_CACHED",
            "OS02_FLAGS_MAPPING_NO_MAP": "NVOS02_FLAGS_MAPPING_NO_MAP",
            "OS33_FLAGS_CACHING_TYPE_WRITECOMBINED": "NVOS33_FLAGS_CACHING_TYPE_WRITECOMBINED",
            "OS46_FLAGS_PAGE_SIZE_4KB": "NVOS46_FLAGS_PAGE_SIZE_4KB"}
  for ours, theirs in values.items(): assert getattr(rm, ours) == getattr(tg, theirs), theirs
  shifts = {"OS32_ATTR_PHYSICALITY_SHIFT": "NVOS32_ATTR_PHYSICALITY",
            "OS32_ATTR_LOCATION_SHIFT": "NVOS32_ATTR_LOCATION",
            "OS32_ATTR2_GPU_CACHEABLE_SHIFT": "NVOS32_ATTR2_GPU_CACHEABLE",
            "OS02_FLAGS_PHYSICALITY_SHIFT": "NVOS02_FLAGS_PHYSICALITY",
            "OS02_FLAGS_COHERENCY_SHIFT": "NVOS02_FLAGS_COHERENCY", "OS02_FLAGS_MAPPING_SHIFT": "NVOS02_FLAGS_MAPPING",
            "OS33_FLAGS_CACHING_TYPE_SHIFT": "NVOS33_FLAGS_CACHING_TYPE",
            "OS46_FLAGS_CACHE_SNOOP_SHIFT": "NVOS46_FLAGS_CACHE_SNOOP",
            "OS46_FLAGS_PAGE_SIZE_SHIFT": "NVOS46_FLAGS_PAGE_SIZE",
            "OS46_FLAGS_DMA_OFFSET_FIXED_SHIFT": "NVOS46_FLAGS_DMA_OFFSET_FIXED"}
  for ours, theirs in shifts.items(): assert getattr(rm, ours) == getattr(tg, theirs)[1], theirs
  assert tg.NVOS46_FLAGS_CACHE_SNOOP_ENABLE == 1 and tg.NVOS46_FLAGS_DMA_OFFSET_FIXED_TRUE == 1


def test_method_headers_and_gpfifo_entries():
  tg = tg580
  assert tg.NVC56F_DMA_INCR_OPCODE == (31, 29) and tg.NVC56F_DMA_INCR_OPCODE_VALUE == push.SEC_OP_INC_METHOD
  assert tg.NVC56F_DMA_INCR_COUNT == (28, 16) and tg.NVC56F_DMA_INCR_SUBCHANNEL == (15, 13)
  assert tg.NVC56F_DMA_INCR_ADDRESS == (11, 0)
  h = push.method(5, 0x1698, 3)  # fields placed where the header says: opcode, count, subchannel, address >> 2
  assert (h >> 29, (h >> 16) & 0x1FFF, (h >> 13) & 7, h & 0xFFF) == (1, 3, 5, 0x1698 >> 2)
  assert push.MAX_METHOD_COUNT == (1 << (28 - 16 + 1)) - 1
  for cls in ("NVC56F", "NVC86F"):
    assert getattr(tg, f"{cls}_GP_ENTRY0_GET") == (31, 2) and getattr(tg, f"{cls}_GP_ENTRY1_GET_HI") == (7, 0)
    assert getattr(tg, f"{cls}_GP_ENTRY1_LENGTH") == (30, 10) and getattr(tg, f"{cls}_GP_ENTRY1_LEVEL") == (9, 9)
    assert getattr(tg, f"{cls}_GP_ENTRY1_LEVEL_SUBROUTINE") == push.GP_ENTRY_LEVEL_SUBROUTINE
  e = push.gp_entry(0xAB_1234_5678, 77)
  assert (e & 0xFFFFFFFC) | (((e >> 32) & 0xFF) << 32) == 0xAB_1234_5678
  assert (e >> 42) & 0x1FFFFF == 77 and (e >> 41) & 1 == 1 and push.MAX_GP_LENGTH == (1 << 21) - 1
  with pytest.raises(ValueError, match="below 2\\*\\*40"): push.gp_entry(1 << 40, 1)


def test_host_compute_and_copy_methods():
  tg = tg580
  for cls in ("NVC56F", "NVC86F"):
    for ours, theirs in (("SET_OBJECT", "SET_OBJECT"), ("SEM_ADDR_LO", "SEM_ADDR_LO"),
                         ("SEM_PAYLOAD_LO", "SEM_PAYLOAD_LO"), ("SEM_EXECUTE", "SEM_EXECUTE"), ("WFI", "WFI")):
      assert getattr(push, ours) == getattr(tg, f"{cls}_{theirs}"), f"{cls}_{theirs}"
    assert getattr(tg, f"{cls}_SEM_ADDR_HI") == push.SEM_ADDR_LO + 4
    assert getattr(tg, f"{cls}_SEM_PAYLOAD_HI") == push.SEM_PAYLOAD_LO + 4
    assert getattr(tg, f"{cls}_SEM_EXECUTE_OPERATION_RELEASE") == push.SEM_OP_RELEASE
    assert getattr(tg, f"{cls}_SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ") == push.SEM_OP_ACQ_CIRC_GEQ
    for shift, field in ((push.SEM_RELEASE_WFI_SHIFT, "RELEASE_WFI"), (push.SEM_PAYLOAD_SIZE_SHIFT, "PAYLOAD_SIZE"),
                         (push.SEM_RELEASE_TIMESTAMP_SHIFT, "RELEASE_TIMESTAMP")):
      assert getattr(tg, f"{cls}_SEM_EXECUTE_{field}") == (shift, shift), field
  assert tg.NVC56F_SEM_EXECUTE_PAYLOAD_SIZE_64BIT == push.SEM_PAYLOAD_SIZE_64BIT
  assert tg.NVC56F_SEM_EXECUTE_RELEASE_WFI_EN == 1 and tg.NVC86F_SEM_EXECUTE_RELEASE_TIMESTAMP_EN == 1
  assert tg.NVC56F_NON_STALL_INTERRUPT == push.NON_STALL_INTERRUPT
  compute = {"SET_SHADER_SHARED_MEMORY_WINDOW_A": "SET_SHADER_SHARED_MEMORY_WINDOW_A", "SEND_PCAS_A": "SEND_PCAS_A",
             "SEND_SIGNALING_PCAS2_B": "SEND_SIGNALING_PCAS2_B",
             "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A": "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A",
             "SET_SHADER_LOCAL_MEMORY_A": "SET_SHADER_LOCAL_MEMORY_A",
             "SET_SHADER_LOCAL_MEMORY_WINDOW_A": "SET_SHADER_LOCAL_MEMORY_WINDOW_A",
             "INVALIDATE_SHADER_CACHES_NO_WFI": "INVALIDATE_SHADER_CACHES_NO_WFI"}
  for ours, theirs in compute.items(): assert getattr(push, ours) == getattr(tg, f"NVC6C0_{theirs}"), theirs
  assert tg.NVC6C0_SET_SHADER_SHARED_MEMORY_WINDOW_B == push.SET_SHADER_SHARED_MEMORY_WINDOW_A + 4
  assert tg.NVC6C0_SET_SHADER_LOCAL_MEMORY_B == push.SET_SHADER_LOCAL_MEMORY_A + 4
  assert tg.NVC6C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C == push.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A + 8
  assert tg.NVC6C0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_COPY_SCHEDULE == \
    push.PCAS_ACTION_INVALIDATE_COPY_SCHEDULE
  for bit, f in ((push.INVALIDATE_INSTRUCTION, "INSTRUCTION"), (push.INVALIDATE_GLOBAL_DATA, "GLOBAL_DATA"),
                 (push.INVALIDATE_CONSTANT, "CONSTANT")):
    lo = getattr(tg, f"NVC6C0_INVALIDATE_SHADER_CACHES_NO_WFI_{f}")[1]
    assert bit == 1 << lo, f
  copy = {"SET_SEMAPHORE_A": "SET_SEMAPHORE_A", "LAUNCH_DMA": "LAUNCH_DMA", "OFFSET_IN_UPPER": "OFFSET_IN_UPPER",
          "LINE_LENGTH_IN": "LINE_LENGTH_IN"}
  for ours, theirs in copy.items(): assert getattr(push, ours) == getattr(tg, f"NVC6B5_{theirs}"), theirs
  assert (tg.NVC6B5_OFFSET_IN_LOWER, tg.NVC6B5_OFFSET_OUT_UPPER, tg.NVC6B5_OFFSET_OUT_LOWER) == \
    (push.OFFSET_IN_UPPER + 4, push.OFFSET_IN_UPPER + 8, push.OFFSET_IN_UPPER + 12)
  assert tg.NVC6B5_SET_SEMAPHORE_PAYLOAD == push.SET_SEMAPHORE_A + 8
  assert tg.NVC6B5_LAUNCH_DMA_DATA_TRANSFER_TYPE_NON_PIPELINED == push.DMA_TRANSFER_NON_PIPELINED
  assert tg.NVC6B5_LAUNCH_DMA_FLUSH_ENABLE[1] == push.DMA_FLUSH_ENABLE_SHIFT
  assert tg.NVC6B5_LAUNCH_DMA_SEMAPHORE_TYPE[1] == push.DMA_SEMAPHORE_TYPE_SHIFT
  assert tg.NVC6B5_LAUNCH_DMA_SEMAPHORE_TYPE_RELEASE_FOUR_WORD_SEMAPHORE == push.DMA_SEMAPHORE_RELEASE_FOUR_WORD
  assert tg.NVC6B5_LAUNCH_DMA_SRC_MEMORY_LAYOUT[1] == push.DMA_SRC_LAYOUT_SHIFT
  assert tg.NVC6B5_LAUNCH_DMA_DST_MEMORY_LAYOUT[1] == push.DMA_DST_LAYOUT_SHIFT
  assert tg.NVC6B5_LAUNCH_DMA_SRC_MEMORY_LAYOUT_PITCH == push.DMA_LAYOUT_PITCH


def test_mock_method_fields_are_the_headers_fields():
  tg = tg580
  fields = {0x2A0: "SET_SHADER_SHARED_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER",
            0x2A4: "SET_SHADER_SHARED_MEMORY_WINDOW_B_BASE_ADDRESS",
            0x7B0: "SET_SHADER_LOCAL_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER",
            0x7B4: "SET_SHADER_LOCAL_MEMORY_WINDOW_B_BASE_ADDRESS", 0x790: "SET_SHADER_LOCAL_MEMORY_A_ADDRESS_UPPER",
            0x794: "SET_SHADER_LOCAL_MEMORY_B_ADDRESS_LOWER",
            0x2E4: "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A_SIZE_UPPER",
            0x2E8: "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B_SIZE_LOWER",
            0x2EC: "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C_MAX_SM_COUNT",
            0x2B4: "SEND_PCAS_A_QMD_ADDRESS_SHIFTED8", 0x2C0: "SEND_SIGNALING_PCAS2_B_PCAS_ACTION",
            0x110: "WAIT_FOR_IDLE_V"}
  for m, f in fields.items(): assert mgpu.MockGPU.COMPUTE_FIELDS[m] == (getattr(tg, f"NVC6C0_{f}"),), f
  copy = {0x400: "OFFSET_IN_UPPER_UPPER", 0x404: "OFFSET_IN_LOWER_VALUE", 0x408: "OFFSET_OUT_UPPER_UPPER",
          0x40C: "OFFSET_OUT_LOWER_VALUE", 0x418: "LINE_LENGTH_IN_VALUE", 0x240: "SET_SEMAPHORE_A_UPPER",
          0x244: "SET_SEMAPHORE_B_LOWER", 0x248: "SET_SEMAPHORE_PAYLOAD_PAYLOAD"}
  for m, f in copy.items(): assert mgpu.MockGPU.COPY_FIELDS[m] == (getattr(tg, f"NVC6B5_{f}"),), f
  dma = {getattr(tg, f"NVC6B5_LAUNCH_DMA_{f}") for f in ("DATA_TRANSFER_TYPE", "FLUSH_ENABLE", "SEMAPHORE_TYPE",
                                                          "INTERRUPT_TYPE", "SRC_MEMORY_LAYOUT", "DST_MEMORY_LAYOUT",
                                                          "MULTI_LINE_ENABLE", "FLUSH_TYPE")}
  assert set(mgpu.MockGPU.COPY_FIELDS[0x300]) == dma
  assert tg.NVC56F_SEM_ADDR_HI_OFFSET == (7, 0) and tg.NVC86F_SEM_ADDR_HI_OFFSET == (24, 0)  # the mock's widths


def test_userd_offsets():
  from tiny_runtime_nv import device
  f = {n: o for n, _, o in tg580.AmpereAControlGPFifo._real_fields_}
  assert (device.USERD_GP_GET, device.USERD_GP_PUT) == (f["GPGet"], f["GPPut"])


def test_qmd_v03_00_bit_positions():
  tg = tg580
  for name, (hi, lo) in push.QMD_V03_00.items():
    base, _, idx = name.rpartition("_")
    theirs = getattr(tg, f"NVC6C0_QMDV03_00_{base}")(int(idx)) if idx.isdigit() else \
      getattr(tg, f"NVC6C0_QMDV03_00_{name}")
    assert (hi, lo) == theirs, name
  assert tg.NVC6C0_QMDV03_00_CWD_MEMBAR_TYPE_L1_SYSMEMBAR == push.CWD_MEMBAR_TYPE_L1_SYSMEMBAR
  assert tg.NVC6C0_QMDV03_00_API_VISIBLE_CALL_LIMIT_NO_CHECK == push.API_VISIBLE_CALL_LIMIT_NO_CHECK
  assert tg.NVC6C0_QMDV03_00_SAMPLER_INDEX_VIA_HEADER_INDEX == push.SAMPLER_INDEX_VIA_HEADER_INDEX
  assert tg.NVC6C0_QMDV03_00_DEPENDENT_QMD0_ACTION_QMD_SCHEDULE == push.DEPENDENT_QMD_ACTION_SCHEDULE
  sizes = [getattr(tg, f"NVC6C0_QMDV03_00_RELEASE0_STRUCTURE_SIZE_SEMAPHORE_{w}_WORD{'S' * (w != 'ONE')}")
           for w in ("FOUR", "ONE", "TWO")]
  assert sizes == [push.RELEASE_STRUCTURE_FOUR_WORDS, push.RELEASE_STRUCTURE_ONE_WORD, push.RELEASE_STRUCTURE_TWO_WORDS]
  # the PCAS actions the mock GPU schedules on (mock/gpu.py _compute)
  assert (tg.NVC6C0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_PREFETCH_SCHEDULE,
          tg.NVC6C0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_PREFETCH_COPY_SCHEDULE) == (9, 0xA)
  assert max(hi for hi, _ in (getattr(tg, n) for n in dir(tg) if n.startswith("NVC6C0_QMDV03_00_") and
                              isinstance(getattr(tg, n), tuple))) == 8 * push.QMD_SIZE - 1


def test_qmd_fields_refuse_values_that_do_not_fit():
  q = push.QMD()
  q["REGISTER_COUNT_V"] = 511
  with pytest.raises(ValueError, match=r"REGISTER_COUNT_V \(656:648\) can't hold 0x200"): q["REGISTER_COUNT_V"] = 512
  q["CTA_RASTER_WIDTH"] = 0xFFFFFFFF
  assert q["REGISTER_COUNT_V"] == 511 and q["CTA_RASTER_WIDTH"] == 0xFFFFFFFF
  assert int.from_bytes(bytes(q), "little") >> 648 & 0x1FF == 511
