"""The mock RM/UVM driver accepts what the real one accepts, where tinygrad 0.14's NV driver showed it did not (each
case decided from NVIDIA's open-gpu-kernel-modules, cited in `tiny_runtime_nv/mock/rm.py`): alloc parameter blocks are
sized by their class, not by NVOS21.paramsSize; memory may be freed in RM while UVM still maps it; the pointer form of
the GPU class list; the GA102 mock GPU with the classes its class list in the kernel source names; UVM_INITIALIZE
with the flags uvm_api_initialize accepts; UVM calls that need a registered GPU or GPU VA space refuse with
NV_ERR_INVALID_DEVICE."""
from __future__ import annotations

import pytest

from tiny_uop.plugins import Device

from tiny_runtime_nv import rm
from tiny_runtime_nv.rm import RMError

# open-gpu-kernel-modules src/nvidia/generated/g_gpu_class_list.c, gpuGetClassDescriptorList_GA102: the classes of
# the kinds tinygrad and our driver pick from
GA102_CLASSES = {0xC7C0, 0xC7B5, 0xC56F, 0xC461, 0xC561}


@pytest.fixture(scope="module")
def dev():
  return Device["MOCK+NV"]


def _raw_alloc(r, parent: int, cls: int, params, params_size: int) -> int:
  """NV_ESC_RM_ALLOC with exactly the given pAllocParms and paramsSize; the returned status."""
  args = r._new("NVOS21_PARAMETERS", {"hRoot": r.root, "hObjectParent": parent, "hClass": cls,
                                      "pAllocParms": int(r.ffi.cast("uintptr_t", params)) if params else 0,
                                      "paramsSize": params_size})
  r.escape(r.ctl, rm.ESC_RM_ALLOC, args, "raw alloc")
  return int(args.status)


def test_alloc_params_sized_by_class_not_params_size(dev):
  # RM takes the block's size from the class (param_copy.c rmapiParamsCopyInit -> rmapiGetClassAllocParamSize);
  # NVOS21.paramsSize is not read: 0 (what tinygrad sends) and a wrong size both allocate
  r = dev.rm
  for size in (0, 3):
    p = r._new("NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS", {"limit": 0xFFFFFFF})
    assert _raw_alloc(r, dev.handles.device, rm.NV01_MEMORY_VIRTUAL, p, size) == rm.NV_OK
  # a NULL block for a class that needs one is refused with NV_ERR_INVALID_ARGUMENT
  assert _raw_alloc(r, dev.handles.device, rm.NV01_MEMORY_VIRTUAL, None, 0) == rm.NV_ERR_INVALID_ARGUMENT


def test_rm_free_while_uvm_maps_then_uvm_free(dev):
  # uvm_map_external.c dups the handle (nvUvmInterfaceDupMemory "takes a ref count on the physical allocation"), so
  # NV_ESC_RM_FREE before UVM_FREE succeeds and the GPU mapping lives until UVM_FREE (tinygrad frees in this order)
  from tiny_runtime_nv.mock.rm import driver
  buf = dev.mem.alloc(0x2000)
  va, r = buf.va_addr, dev.rm
  r.free(dev.handles.device, buf.meta.handle)
  assert va in driver().mapped and driver().memory.find(va) is not None
  r.uvm(rm.UVM_FREE, base=va, length=0x2000)
  assert va not in driver().mapped and driver().memory.find(va) is None
  dev.mem._release_va(va, 0x2000, buf.meta.low)


def test_classlist_pointer_form(dev):
  # NV0080_CTRL_CMD_GPU_GET_CLASSLIST (gpuGetClassList): NULL list -> the count; a list -> filled; too short -> refused
  r, h = dev.rm, dev.handles.device
  n = int(r.control(h, rm.CTRL_GPU_GET_CLASSLIST, numClasses=0, classList=0).numClasses)
  v2 = r.control(h, rm.CTRL_GPU_GET_CLASSLIST_V2)
  want = [int(v2.classList[i]) for i in range(v2.numClasses)]
  assert n == len(want) > 10
  lst = r.ffi.new("uint32_t[]", n)
  got = r.control(h, rm.CTRL_GPU_GET_CLASSLIST, numClasses=n, classList=int(r.ffi.cast("uintptr_t", lst)))
  assert int(got.numClasses) == n and list(lst) == want
  with pytest.raises(RMError, match="NV_ERR_INVALID_PARAM_STRUCT"):
    r.control(h, rm.CTRL_GPU_GET_CLASSLIST, numClasses=n - 1, classList=int(r.ffi.cast("uintptr_t", lst)))


def test_debugger_needs_a_compute_object(dev):
  # cl83de.h NV83DE_ALLOC_PARAMETERS.hClass3dObject names the compute object to debug: a subdevice is refused
  r = dev.rm
  with pytest.raises(RMError, match="NV_ERR_INVALID_OBJECT_PARENT"):
    r.alloc(dev.handles.device, rm.GT200_DEBUGGER, hAppClient=r.root, hClass3dObject=dev.handles.subdevice)


def test_ga102_mock_gpu_classes():
  from tiny_runtime_nv.mock.rm import GPUS
  ga102 = GPUS[2]
  assert GA102_CLASSES <= set(ga102.classes) and ga102.sm_version == 0x806 and ga102.pci_device_id == 0x2204
  assert rm.HOPPER_COMPUTE_A not in ga102.classes and rm.AMPERE_COMPUTE_A not in ga102.classes


def test_uvm_initialize_flags():
  # uvm.c uvm_api_initialize: any flags within UVM_INIT_FLAGS_MASK (0x3: DISABLE_HMM, MULTI_PROCESS_SHARING_MODE);
  # others, or re-initializing with different flags, are NV_ERR_INVALID_ARGUMENT
  from types import SimpleNamespace

  from tiny_runtime_nv.mock.rm import UVM, MockRM, RMStatus
  r = MockRM()
  UVM[rm.UVM_INITIALIZE](r, SimpleNamespace(flags=0x1))
  UVM[rm.UVM_INITIALIZE](r, SimpleNamespace(flags=0x1))  # the same flags again
  for flags in (0x0, 0x4):
    with pytest.raises(RMStatus) as e: UVM[rm.UVM_INITIALIZE](r, SimpleNamespace(flags=flags))
    assert e.value.status == rm.NV_ERR_INVALID_ARGUMENT
  UVM[rm.UVM_INITIALIZE](MockRM(), SimpleNamespace(flags=0x3))


def test_uvm_calls_that_need_a_registered_gpu():
  # uvm_va_space_register_gpu_va_space: the GPU must be registered (UVM_REGISTER_GPU); uvm_register_channel and
  # uvm_map_external_allocation: it must have a GPU VA space. Otherwise NV_ERR_INVALID_DEVICE.
  from tiny_runtime_nv.mock.rm import UVM, MockRM, RMStatus
  r = MockRM()

  def params(cmd: int, field: str = "gpuUuid"):
    p = r.ffi.new(f"{rm.UVM_IOCTLS[cmd]} *")
    r.ffi.memmove(getattr(p, field).uuid, r.gpus[0].uuid, 16)
    return p
  for cmd in (rm.UVM_REGISTER_GPU_VASPACE, rm.UVM_REGISTER_CHANNEL):
    with pytest.raises(RMStatus) as e: UVM[cmd](r, params(cmd))
    assert e.value.status == rm.NV_ERR_INVALID_DEVICE, hex(cmd)
  UVM[rm.UVM_REGISTER_GPU](r, params(rm.UVM_REGISTER_GPU, "gpu_uuid"))  # registered, but no GPU VA space yet
  with pytest.raises(RMStatus) as e: UVM[rm.UVM_REGISTER_CHANNEL](r, params(rm.UVM_REGISTER_CHANNEL))
  assert e.value.status == rm.NV_ERR_INVALID_DEVICE
