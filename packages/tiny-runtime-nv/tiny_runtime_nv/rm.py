"""NVIDIA's kernel interface for user-space drivers: the resource manager (RM) escapes on `/dev/nvidiactl` and
`/dev/nvidiaN`, and the unified-memory (UVM) ioctls on `/dev/nvidia-uvm`, declared with cffi; `RMIface` drives them.

Facts and their sources (NVIDIA open-gpu-kernel-modules, `src/common/sdk/nvidia/inc/` and `kernel-open/`):
- escapes: `nv_escape.h` (NV_ESC_RM_*), `nv-ioctl-numbers.h` (NV_IOCTL_MAGIC 'F', NV_IOCTL_BASE 200: CARD_INFO,
  REGISTER_FD); an escape is `_IOWR('F', nr, sizeof(params))` (`nv-ioctl.h`); parameter blocks `nvos.h` (NVOS00, 02,
  21, 33, 46, 54) and `nv-ioctl.h` (`nv_ioctl_card_info_t`, `..._with_fd`);
- allocation parameters: `class/cl0080.h`, `cl2080.h`, `cl0070.h`, `cl90f1.h`, `cla06c.h`, `cl9067.h`, `clc36f.h`
  (`NV_CHANNELGPFIFO_ALLOCATION_PARAMETERS`), `nvos.h` (`NV_MEMORY_ALLOCATION_PARAMS`, NVOS02/32/33/46 flags);
- controls: `ctrl/ctrl0000/*`, `ctrl0080gpu.h`, `ctrl2080gpu.h`, `ctrl2080gr.h`, `ctrla06c.h`, `ctrlc36f.h`;
- UVM: `kernel-open/nvidia-uvm/uvm_ioctl.h` (the ioctl number is the command itself, not `_IOC`-encoded);
- status codes: `nvstatuscodes.h`;
- which file an escape goes to (`src/nvidia/arch/nvalloc/unix/src/escape.c` RmIoctl, `kernel-open/nvidia/nv.c`
  nvidia_ioctl): NV_ESC_RM_ALLOC_MEMORY only on the GPU's /dev/nvidiaN (NV_ACTUAL_DEVICE_ONLY); RM_ALLOC, _FREE,
  _CONTROL, _MAP_MEMORY, _MAP_MEMORY_DMA and CARD_INFO only on /dev/nvidiactl (NV_CTL_DEVICE_ONLY); REGISTER_FD on
  either. The wrong file fails the ioctl with EINVAL.
Layouts differ between driver branches (the 570 and 580 headers disagree on five structs used here), so each
supported branch has its own cffi declarations (`layouts(branch)`); the branch is read from the driver with
NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2, whose parameter block is the same in every branch. Every constant,
size and offset here is checked against tinygrad 0.14.0's generated `nv_570.py`/`nv_580.py` in
`tests/test_nv_oracle.py`.

All file access goes through a `FileIOInterface`, so `MOCK+NV` substitutes an in-process driver (`mock/rm.py`).
"""
from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass
from typing import Any

import cffi

from tiny_uop.hcq import MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE, \
  FileIOInterface, HCQBuffer, errno_name, ioc

# ***** parameter blocks *****

# identical in every supported branch (nvos.h, nv-ioctl.h, ctrl0000system.h, ctrl0000gpu.h, uvm_ioctl.h ...)
COMMON_CDEF = """
typedef struct { uint32_t hRoot; uint32_t hObjectParent; uint32_t hObjectNew; uint32_t hClass; uint64_t pAllocParms;
  uint32_t paramsSize; uint32_t status; } NVOS21_PARAMETERS;
typedef struct { uint32_t hClient; uint32_t hObject; uint32_t cmd; uint32_t flags; uint64_t params;
  uint32_t paramsSize; uint32_t status; } NVOS54_PARAMETERS;
typedef struct { uint32_t hRoot; uint32_t hObjectParent; uint32_t hObjectOld; uint32_t status; } NVOS00_PARAMETERS;
typedef struct { uint32_t hRoot; uint32_t hObjectParent; uint32_t hObjectNew; uint32_t hClass; uint32_t flags;
  uint64_t pMemory; uint64_t limit; uint32_t status; } NVOS02_PARAMETERS;
typedef struct { NVOS02_PARAMETERS params; int32_t fd; } nv_ioctl_nvos02_parameters_with_fd;
typedef struct { uint32_t hClient; uint32_t hDevice; uint32_t hMemory; uint64_t offset; uint64_t length;
  uint64_t pLinearAddress; uint32_t status; uint32_t flags; } NVOS33_PARAMETERS;
typedef struct { NVOS33_PARAMETERS params; int32_t fd; } nv_ioctl_nvos33_parameters_with_fd;
typedef struct { uint32_t domain; uint8_t bus; uint8_t slot; uint8_t function; uint16_t vendor_id;
  uint16_t device_id; } nv_pci_info_t;
typedef struct { uint8_t valid; nv_pci_info_t pci_info; uint32_t gpu_id; uint16_t interrupt_line;
  uint64_t reg_address; uint64_t reg_size; uint64_t fb_address; uint64_t fb_size; uint32_t minor_number;
  uint8_t dev_name[10]; } nv_ioctl_card_info_t;
typedef struct { int32_t ctl_fd; } nv_ioctl_register_fd_t;
typedef struct { uint32_t deviceId; uint32_t hClientShare; uint32_t hTargetClient; uint32_t hTargetDevice;
  uint32_t flags; uint64_t vaSpaceSize; uint64_t vaStartInternal; uint64_t vaLimitInternal; uint32_t vaMode;
  } NV0080_ALLOC_PARAMETERS;
typedef struct { uint32_t subDeviceId; } NV2080_ALLOC_PARAMETERS;
typedef struct { uint64_t offset; uint64_t limit; uint32_t hVASpace; } NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS;
typedef struct { uint32_t hObjectError; uint32_t hObjectEccError; uint32_t hVASpace; uint32_t engineType;
  uint8_t bIsCallingContextVgpuPlugin; } NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS;
typedef struct { uint32_t hVASpace; uint32_t flags; uint32_t subctxId; } NV_CTXSHARE_ALLOCATION_PARAMETERS;
typedef struct { uint64_t base; uint64_t size; uint32_t addressSpace; uint32_t cacheAttrib; } NV_MEMORY_DESC_PARAMS;
typedef struct { uint32_t hObjectError; uint32_t hObjectBuffer; uint64_t gpFifoOffset; uint32_t gpFifoEntries;
  uint32_t flags; uint32_t hContextShare; uint32_t hVASpace; uint32_t hUserdMemory[8]; uint64_t userdOffset[8];
  uint32_t engineType; uint32_t cid; uint32_t subDeviceId; uint32_t hObjectEccError; NV_MEMORY_DESC_PARAMS instanceMem;
  NV_MEMORY_DESC_PARAMS userdMem; NV_MEMORY_DESC_PARAMS ramfcMem; NV_MEMORY_DESC_PARAMS mthdbufMem;
  uint32_t hPhysChannelGroup; uint32_t internalFlags; NV_MEMORY_DESC_PARAMS errorNotifierMem;
  NV_MEMORY_DESC_PARAMS eccErrorNotifierMem; uint32_t ProcessID; uint32_t SubProcessID; uint32_t encryptIv[3];
  uint32_t decryptIv[3]; uint32_t hmacNonce[8]; uint32_t tpcConfigID; } NV_CHANNELGPFIFO_ALLOCATION_PARAMETERS;
typedef struct { uint32_t owner; uint32_t type; uint32_t flags; uint32_t width; uint32_t height; int32_t pitch;
  uint32_t attr; uint32_t attr2; uint32_t format; uint32_t comprCovg; uint32_t zcullCovg; uint64_t rangeLo;
  uint64_t rangeHi; uint64_t size; uint64_t alignment; uint64_t offset; uint64_t limit; uint64_t address;
  uint32_t ctagOffset; uint32_t hVASpace; uint32_t internalflags; uint32_t tag; int32_t numaNode;
  } NV_MEMORY_ALLOCATION_PARAMS;
typedef struct { char driverVersionBuffer[256]; char versionBuffer[256]; char driverBranch[256];
  char titleBuffer[256]; uint32_t changelistNumber; uint32_t officialChangelistNumber;
  } NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS;
typedef struct { uint32_t gpuId; uint32_t gpuFlags; uint32_t deviceInstance; uint32_t subDeviceInstance;
  uint32_t sliStatus; uint32_t boardId; uint32_t gpuInstance; int32_t numaId; } NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS;
typedef struct { uint32_t index; uint32_t flags; uint32_t length; uint8_t data[256]; }
  NV2080_CTRL_GPU_GET_GID_INFO_PARAMS;
typedef struct { uint32_t index; uint32_t data; } NV2080_CTRL_GR_INFO;
typedef struct { uint32_t flags; uint64_t route; } NV0080_CTRL_GR_ROUTE_INFO;
typedef struct { uint32_t grInfoListSize; uint64_t grInfoList; NV0080_CTRL_GR_ROUTE_INFO grRouteInfo; }
  NV2080_CTRL_GR_GET_INFO_PARAMS;
typedef struct { uint32_t workSubmitToken; } NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS;
typedef struct { uint8_t uuid[16]; } NvProcessorUuid;
typedef struct { uint64_t flags; uint32_t rmStatus; } UVM_INITIALIZE_PARAMS;
typedef struct { int32_t uvmFd; uint32_t rmStatus; } UVM_MM_INITIALIZE_PARAMS;
typedef struct { NvProcessorUuid gpu_uuid; uint8_t numaEnabled; int32_t numaNodeId; int32_t rmCtrlFd; uint32_t hClient;
  uint32_t hSmcPartRef; uint32_t rmStatus; } UVM_REGISTER_GPU_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; int32_t rmCtrlFd; uint32_t hClient; uint32_t hVaSpace; uint32_t rmStatus; }
  UVM_REGISTER_GPU_VASPACE_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; int32_t rmCtrlFd; uint32_t hClient; uint32_t hChannel; uint64_t base;
  uint64_t length; uint32_t rmStatus; } UVM_REGISTER_CHANNEL_PARAMS;
typedef struct { uint64_t base; uint64_t length; uint32_t rmStatus; } UVM_CREATE_EXTERNAL_RANGE_PARAMS;
typedef struct { NvProcessorUuid gpuUuid; uint32_t gpuMappingType; uint32_t gpuCachingType; uint32_t gpuFormatType;
  uint32_t gpuElementBits; uint32_t gpuCompressionType; } UvmGpuMappingAttributes;
typedef struct { uint64_t base; uint64_t length; uint64_t offset; UvmGpuMappingAttributes perGpuAttributes[256];
  uint64_t gpuAttributesCount; int32_t rmCtrlFd; uint32_t hClient; uint32_t hMemory; uint32_t rmStatus; }
  UVM_MAP_EXTERNAL_ALLOCATION_PARAMS;
typedef struct { uint64_t base; uint64_t length; uint32_t rmStatus; } UVM_FREE_PARAMS;
typedef struct { uint32_t numClasses; uint64_t classList; } NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS;
typedef struct { uint32_t flags; uint32_t duration; } NV2080_CTRL_PERF_BOOST_PARAMS;
typedef struct { uint32_t hDebuggerClient_Obsolete; uint32_t hAppClient; uint32_t hClass3dObject; }
  NV83DE_ALLOC_PARAMETERS;
"""

# what differs between the branches' headers (nvos.h NVOS46, cl90f1.h, ctrl0080gpu.h, ctrla06c.h)
BRANCH_CDEF = {
  "570": """
typedef struct { uint32_t hClient; uint32_t hDevice; uint32_t hDma; uint32_t hMemory; uint64_t offset; uint64_t length;
  uint32_t flags; uint64_t dmaOffset; uint32_t status; } NVOS46_PARAMETERS;
typedef struct { uint32_t index; uint32_t flags; uint64_t vaSize; uint64_t vaStartInternal; uint64_t vaLimitInternal;
  uint32_t bigPageSize; uint64_t vaBase; } NV_VASPACE_ALLOCATION_PARAMETERS;
typedef struct { uint32_t numClasses; uint32_t classList[100]; } NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS;
typedef struct { uint8_t bEnable; uint8_t bSkipSubmit; } NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS;
""",
  "580": """
typedef struct { uint32_t hClient; uint32_t hDevice; uint32_t hDma; uint32_t hMemory; uint64_t offset; uint64_t length;
  uint32_t flags; uint32_t flags2; uint32_t kindOverride; uint64_t dmaOffset; uint32_t status; } NVOS46_PARAMETERS;
typedef struct { uint32_t index; uint32_t flags; uint64_t vaSize; uint64_t vaStartInternal; uint64_t vaLimitInternal;
  uint32_t bigPageSize; uint64_t vaBase; uint32_t pasid; } NV_VASPACE_ALLOCATION_PARAMETERS;
typedef struct { uint32_t numClasses; uint32_t classList[200]; } NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS;
typedef struct { uint8_t bEnable; uint8_t bSkipSubmit; uint8_t bSkipEnable; } NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS;
""",
}
SUPPORTED_BRANCHES = tuple(BRANCH_CDEF)


@functools.cache
def layouts(branch: str) -> cffi.FFI:
  """The cffi declarations of driver branch `branch` ("570", "580")."""
  if branch not in BRANCH_CDEF: raise ValueError(f"no layouts for driver branch {branch}; have {SUPPORTED_BRANCHES}")
  ffi = cffi.FFI()
  ffi.cdef(COMMON_CDEF + BRANCH_CDEF[branch])
  return ffi


def branch_of(version: str) -> str:
  """The layout branch of a driver version string ("580.95.05" -> "580"); RuntimeError for unsupported ones."""
  major = version.split(".")[0]
  if major not in BRANCH_CDEF:
    raise RuntimeError(f"NVIDIA driver {version} is not supported by the NV device: its RM structure layouts are "
                       f"known for driver branches {', '.join(b + '.x' for b in SUPPORTED_BRANCHES)} "
                       "(DEV=CUDA uses any driver through libcuda)")
  return major


# ***** numbers *****

NV_IOCTL_MAGIC = "F"
# nv_escape.h / nv-ioctl-numbers.h: escape -> (parameter block name, or None when the size varies)
ESC_RM_ALLOC_MEMORY, ESC_RM_FREE, ESC_RM_CONTROL, ESC_RM_ALLOC = 0x27, 0x29, 0x2A, 0x2B
ESC_RM_MAP_MEMORY, ESC_RM_MAP_MEMORY_DMA = 0x4E, 0x57
ESC_CARD_INFO, ESC_REGISTER_FD = 200, 201
ESCAPES: dict[int, str] = {ESC_RM_ALLOC_MEMORY: "nv_ioctl_nvos02_parameters_with_fd", ESC_RM_FREE: "NVOS00_PARAMETERS",
                           ESC_RM_CONTROL: "NVOS54_PARAMETERS", ESC_RM_ALLOC: "NVOS21_PARAMETERS",
                           ESC_RM_MAP_MEMORY: "nv_ioctl_nvos33_parameters_with_fd",
                           ESC_RM_MAP_MEMORY_DMA: "NVOS46_PARAMETERS", ESC_REGISTER_FD: "nv_ioctl_register_fd_t"}
MAX_CARDS = 64  # NV_ESC_CARD_INFO fills an array of nv_ioctl_card_info_t (NV_MAX_DEVICES in the open modules' nv.h)

# uvm_ioctl.h: command -> parameter block
UVM_INITIALIZE, UVM_MM_INITIALIZE, UVM_REGISTER_GPU, UVM_REGISTER_GPU_VASPACE = 0x30000001, 0x4B, 0x25, 0x19
UVM_REGISTER_CHANNEL, UVM_CREATE_EXTERNAL_RANGE, UVM_MAP_EXTERNAL_ALLOCATION, UVM_FREE = 0x1B, 0x49, 0x21, 0x22
UVM_IOCTLS: dict[int, str] = {UVM_INITIALIZE: "UVM_INITIALIZE_PARAMS", UVM_MM_INITIALIZE: "UVM_MM_INITIALIZE_PARAMS",
                              UVM_REGISTER_GPU: "UVM_REGISTER_GPU_PARAMS",
                              UVM_REGISTER_GPU_VASPACE: "UVM_REGISTER_GPU_VASPACE_PARAMS",
                              UVM_REGISTER_CHANNEL: "UVM_REGISTER_CHANNEL_PARAMS",
                              UVM_CREATE_EXTERNAL_RANGE: "UVM_CREATE_EXTERNAL_RANGE_PARAMS",
                              UVM_MAP_EXTERNAL_ALLOCATION: "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS",
                              UVM_FREE: "UVM_FREE_PARAMS"}

# RM classes (class/cl*.h, `#define <NAME> (0x...)`)
NV01_ROOT_CLIENT, NV01_DEVICE_0, NV20_SUBDEVICE_0, NV01_MEMORY_VIRTUAL = 0x41, 0x80, 0x2080, 0x70
NV1_MEMORY_USER, NV1_MEMORY_SYSTEM, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR = 0x40, 0x3E, 0x71
FERMI_VASPACE_A, KEPLER_CHANNEL_GROUP_A, FERMI_CONTEXT_SHARE_A = 0x90F1, 0xA06C, 0x9067
TURING_USERMODE_A, AMPERE_USERMODE_A, HOPPER_USERMODE_A = 0xC461, 0xC561, 0xC661
AMPERE_CHANNEL_GPFIFO_A, HOPPER_CHANNEL_GPFIFO_A = 0xC56F, 0xC86F
AMPERE_COMPUTE_A, AMPERE_COMPUTE_B, ADA_COMPUTE_A, HOPPER_COMPUTE_A = 0xC6C0, 0xC7C0, 0xC9C0, 0xCBC0
AMPERE_DMA_COPY_A, AMPERE_DMA_COPY_B, HOPPER_DMA_COPY_A = 0xC6B5, 0xC7B5, 0xC8B5
# the classes this driver can use, most preferred first (a GPU lists its own generation's and some older ones)
USERMODE_CLASSES = (HOPPER_USERMODE_A, AMPERE_USERMODE_A, TURING_USERMODE_A)
GPFIFO_CLASSES = (HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A)
COMPUTE_CLASSES = (HOPPER_COMPUTE_A, ADA_COMPUTE_A, AMPERE_COMPUTE_B, AMPERE_COMPUTE_A)
DMA_CLASSES = (HOPPER_DMA_COPY_A, AMPERE_DMA_COPY_B, AMPERE_DMA_COPY_A)

# controls (ctrl/*.h NV*_CTRL_CMD_*)
CTRL_SYSTEM_GET_BUILD_VERSION_V2, CTRL_GPU_GET_ID_INFO_V2 = 0x13E, 0x205
CTRL_GPU_GET_CLASSLIST_V2, CTRL_GPU_GET_GID_INFO, CTRL_GR_GET_INFO = 0x800292, 0x2080014A, 0x20801201
CTRL_GPFIFO_SCHEDULE, CTRL_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xA06C0101, 0xC36F0108
# the pointer form of the class list (ctrl0080gpu.h; tinygrad 0.14 asks it) and the clock boost CUDA requests
# (ctrl2080perf.h)
CTRL_GPU_GET_CLASSLIST, CTRL_PERF_BOOST = 0x800201, 0x2080200A
GT200_DEBUGGER = 0x83DE  # cl83de.h: a debugger object on a compute object (tinygrad 0.14 allocates one per device)
CONTROLS: dict[int, str] = {CTRL_SYSTEM_GET_BUILD_VERSION_V2: "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS",
                            CTRL_GPU_GET_ID_INFO_V2: "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS",
                            CTRL_GPU_GET_CLASSLIST_V2: "NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS",
                            CTRL_GPU_GET_GID_INFO: "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS",
                            CTRL_GR_GET_INFO: "NV2080_CTRL_GR_GET_INFO_PARAMS",
                            CTRL_GPFIFO_SCHEDULE: "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS",
                            CTRL_GPFIFO_GET_WORK_SUBMIT_TOKEN: "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS",
                            CTRL_GPU_GET_CLASSLIST: "NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS",
                            CTRL_PERF_BOOST: "NV2080_CTRL_PERF_BOOST_PARAMS"}
# allocation parameter blocks by class (None: the class takes no parameters)
ALLOC_PARAMS: dict[int, str | None] = {
  NV01_ROOT_CLIENT: None, NV01_DEVICE_0: "NV0080_ALLOC_PARAMETERS", NV20_SUBDEVICE_0: "NV2080_ALLOC_PARAMETERS",
  NV01_MEMORY_VIRTUAL: "NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS", NV1_MEMORY_USER: "NV_MEMORY_ALLOCATION_PARAMS",
  NV1_MEMORY_SYSTEM: "NV_MEMORY_ALLOCATION_PARAMS", FERMI_VASPACE_A: "NV_VASPACE_ALLOCATION_PARAMETERS",
  KEPLER_CHANNEL_GROUP_A: "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS",
  FERMI_CONTEXT_SHARE_A: "NV_CTXSHARE_ALLOCATION_PARAMETERS", GT200_DEBUGGER: "NV83DE_ALLOC_PARAMETERS",
  **{c: None for c in USERMODE_CLASSES + COMPUTE_CLASSES + DMA_CLASSES},
  **{c: "NV_CHANNELGPFIFO_ALLOCATION_PARAMETERS" for c in GPFIFO_CLASSES}}

GR_INFO_SM_VERSION, GR_INFO_MAX_WARPS_PER_SM = 0x0C, 0x0D          # ctrl2080gr.h NV2080_CTRL_GR_INFO_INDEX_*
GR_INFO_NUM_GPCS, GR_INFO_NUM_TPC_PER_GPC, GR_INFO_NUM_SM_PER_TPC = 0x14, 0x17, 0x20   # ..._LITTER_*
GID_FLAGS_FORMAT_BINARY = 2           # NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY
ENGINE_TYPE_GRAPHICS = 1              # NV2080_ENGINE_TYPE_GRAPHICS
VASPACE_FLAGS_IS_EXTERNALLY_OWNED, VASPACE_FLAGS_ENABLE_PAGE_FAULTING = 0x8, 0x40   # NV_VASPACE_ALLOCATION_FLAGS_*
CTXSHARE_FLAGS_SUBCONTEXT_ASYNC = 1   # NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC
UVM_MAPPING_TYPE_READ_WRITE_ATOMIC = 1  # uvm_types.h UvmGpuMappingType: UvmGpuMappingTypeReadWriteAtomic

# nvos.h: NVOS32 memory attributes (bit positions of the fields, then values) and allocation flags
OS32_TYPE_IMAGE, OS32_TYPE_NOTIFIER = 0, 0xD
OS32_ALLOC_FLAGS_IGNORE_BANK_PLACEMENT, OS32_ALLOC_FLAGS_ALIGNMENT_FORCE = 0x1, 0x100
OS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED, OS32_ALLOC_FLAGS_MAP_NOT_REQUIRED = 0x4000, 0x8000
OS32_ALLOC_FLAGS_PERSISTENT_VIDMEM = 0x10000
OS32_ATTR_PHYSICALITY_SHIFT, OS32_ATTR_PHYSICALITY_CONTIGUOUS, OS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS = 27, 2, 3
OS32_ATTR_LOCATION_SHIFT, OS32_ATTR_LOCATION_PCI = 25, 1
OS32_ATTR2_GPU_CACHEABLE_SHIFT, OS32_ATTR2_GPU_CACHEABLE_YES, OS32_ATTR2_GPU_CACHEABLE_NO = 2, 1, 2
OS32_ATTR2_ZBC_PREFER_NO_ZBC = 1      # NVOS32_ATTR2_ZBC (1:0)
OS02_FLAGS_PHYSICALITY_SHIFT, OS02_FLAGS_PHYSICALITY_NONCONTIGUOUS = 4, 1
OS02_FLAGS_COHERENCY_SHIFT, OS02_FLAGS_COHERENCY_CACHED = 12, 1
OS02_FLAGS_MAPPING_SHIFT, OS02_FLAGS_MAPPING_NO_MAP = 30, 1
OS33_FLAGS_CACHING_TYPE_SHIFT, OS33_FLAGS_CACHING_TYPE_WRITECOMBINED = 23, 2
OS46_FLAGS_CACHE_SNOOP_SHIFT, OS46_FLAGS_PAGE_SIZE_SHIFT, OS46_FLAGS_DMA_OFFSET_FIXED_SHIFT = 4, 8, 15
OS46_FLAGS_PAGE_SIZE_4KB = 1

# nvstatuscodes.h
NV_OK, NV_ERR_INSUFFICIENT_PERMISSIONS, NV_ERR_INVALID_ADDRESS, NV_ERR_INVALID_ARGUMENT = 0, 0x1B, 0x1E, 0x1F
NV_ERR_INVALID_CLASS, NV_ERR_INVALID_COMMAND, NV_ERR_INVALID_FLAGS, NV_ERR_INVALID_LIMIT = 0x22, 0x24, 0x29, 0x2E
NV_ERR_INVALID_OBJECT_HANDLE, NV_ERR_INVALID_OBJECT_PARENT, NV_ERR_INVALID_OFFSET = 0x33, 0x36, 0x37
NV_ERR_INVALID_PARAM_STRUCT, NV_ERR_INVALID_PARAMETER, NV_ERR_NO_MEMORY, NV_ERR_NOT_SUPPORTED = 0x3A, 0x3B, 0x51, 0x56
NV_ERR_OBJECT_NOT_FOUND, NV_ERR_INVALID_DEVICE = 0x57, 0x26
STATUS_NAMES = {v: k for k, v in list(globals().items()) if k.startswith("NV_ERR_") or k == "NV_OK"}


def escape_number(nr: int, size: int) -> int:
  """The ioctl request of RM escape `nr` with a `size`-byte parameter block: `_IOWR('F', nr, size)`."""
  if not 0 < size < 1 << 14: raise ValueError(f"RM escape {nr:#x}: parameter block of {size} bytes does not fit _IOC")
  return ioc(3, NV_IOCTL_MAGIC, nr, size)


def status_name(st: int) -> str: return f"{STATUS_NAMES.get(st, 'NV_ERR_?')} ({st:#x})"


class RMError(RuntimeError):
  """An RM or UVM call failed; the message names the call, its arguments and the NV_STATUS."""

  def __init__(self, msg: str, status: int = 0):
    super().__init__(msg)
    self.status = status


# ***** the interface *****

NVIDIACTL, NVIDIA_UVM = "/dev/nvidiactl", "/dev/nvidia-uvm"
PAGE = 0x1000


@dataclass(frozen=True)
class GPUInfo:
  """What the device's setup learned: GR facts (`ctrl2080gr.h`) and the classes chosen from its class list."""
  sm_version: int          # e.g. 0x900 (sm_90), 0x806 (sm_86)
  num_gpcs: int
  num_tpc_per_gpc: int
  num_sm_per_tpc: int
  max_warps_per_sm: int

  @property
  def arch(self) -> str: return f"sm_{(self.sm_version >> 8) & 0xFF}{self.sm_version & 0xF}"
  @property
  def sass_version(self) -> int:
    """QMD SASS_VERSION: major in bits 7:4, minor in 3:0 (0x90 for sm_90)."""
    return ((self.sm_version >> 4) & 0xF0) | (self.sm_version & 0xF)


@dataclass
class NVMem:
  """An RM memory object mapped for the GPU (and maybe the CPU) at one virtual address."""
  handle: int
  host: bool               # system memory described by our own pages (NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
  cpu_mapped: bool
  low: bool                # below 2**40 (LowVA)


class RMIface:
  """The NVIDIA kernel driver as the NV device sees it, through `fio` (a FileIOInterface class).

  Opens /dev/nvidiactl and /dev/nvidia-uvm, allocates the root client, reads the driver version (RuntimeError for an
  unsupported branch), initializes UVM and lists the GPUs (NV_ESC_CARD_INFO). `gpu_fd(i)` opens /dev/nvidiaN of the
  i-th GPU. `alloc`/`control`/`free` are the RM escapes by name; `uvm` the UVM ioctls; `alloc_memory`/`free_memory`
  give GPU memory whose GPU virtual address is also its CPU address.
  """

  def __init__(self, fio: type[FileIOInterface] = FileIOInterface):
    self.fio = fio
    for path in (NVIDIACTL, NVIDIA_UVM):
      if not fio.exists(path):
        why = "the NVIDIA kernel driver is not loaded" if path == NVIDIACTL else "the nvidia-uvm module is not loaded"
        raise RuntimeError(f"no NVIDIA GPU ({path} missing: {why}; DEV=MOCK+NV runs the NV driver code against a "
                           "mock driver whose GPU is the PTX executor)")
      if not fio.access(path, os.R_OK | os.W_OK):
        raise RuntimeError(f"{path} is not readable and writable by this user (check the device node's group and "
                           "permissions)")
    self.ctl = fio(NVIDIACTL, os.O_RDWR | os.O_CLOEXEC)
    self.uvm_fd = fio(NVIDIA_UVM, os.O_RDWR | os.O_CLOEXEC)
    self.uvm_fd2 = fio(NVIDIA_UVM, os.O_RDWR | os.O_CLOEXEC)
    self.ffi = layouts(SUPPORTED_BRANCHES[-1])  # the root client and the version query are the same in every branch
    self.root = 0
    self.root = self.alloc(0, NV01_ROOT_CLIENT)
    ver = self.control(self.root, CTRL_SYSTEM_GET_BUILD_VERSION_V2)
    self.version = self.ffi.string(ver.driverVersionBuffer).decode()
    self.branch = branch_of(self.version)
    self.ffi = layouts(self.branch)
    self.uvm(UVM_INITIALIZE)
    try: self.uvm(UVM_MM_INITIALIZE, self.uvm_fd2, uvmFd=self._fd(self.uvm_fd))
    except RMError: pass  # the driver refuses a second MM_INITIALIZE of one process; CUDA ignores it as well
    cards = self.ffi.new(f"nv_ioctl_card_info_t[{MAX_CARDS}]")
    self.ctl.ioctl(escape_number(ESC_CARD_INFO, self.ffi.sizeof(cards)), self.ffi.buffer(cards))
    self.cards = [(int(c.gpu_id), int(c.minor_number)) for c in cards if c.valid]
    self.mapped_files: list[FileIOInterface] = []

  @staticmethod
  def _fd(f: FileIOInterface) -> int: return f.fd if f.fd is not None else -1

  def _new(self, struct: str, fields: dict[str, Any]) -> Any:
    st = self.ffi.new(f"{struct} *")
    for k, v in fields.items():
      if isinstance(v, (list, tuple)):
        for i, x in enumerate(v): getattr(st, k)[i] = x
      else: setattr(st, k, v)
    return st

  def escape(self, f: FileIOInterface, nr: int, st: Any, what: str) -> None:
    """Run RM escape `nr` on file `f` with the parameter block `st` (a cffi pointer)."""
    try: f.ioctl(escape_number(nr, self.ffi.sizeof(st[0])), self.ffi.buffer(st))
    except OSError as e: raise RMError(f"{what}: ioctl failed: {errno_name(e.errno or 0)} ({e.strerror})") from e

  def alloc(self, parent: int, cls: int, **params: Any) -> int:
    """NV_ESC_RM_ALLOC of an object of class `cls` under `parent`; `params` fill the class's parameter block."""
    pname = ALLOC_PARAMS.get(cls)
    p = self._new(pname, params) if pname is not None else None
    args = self._new("NVOS21_PARAMETERS", {"hRoot": self.root, "hObjectParent": parent, "hClass": cls})
    if p is not None: args.pAllocParms, args.paramsSize = int(self.ffi.cast("uintptr_t", p)), self.ffi.sizeof(p[0])
    self.escape(self.ctl, ESC_RM_ALLOC, args, f"RM alloc of class {cls:#x}")
    if args.status != NV_OK:
      err = MemoryError if args.status == NV_ERR_NO_MEMORY else RMError
      raise err(f"RM alloc of class {cls:#x} under {parent:#x} ({params}) failed: {status_name(args.status)}")
    return int(args.hObjectNew)

  def control(self, obj: int, cmd: int, **params: Any) -> Any:
    """NV_ESC_RM_CONTROL `cmd` on object `obj`; returns the parameter block after the call."""
    p = self._new(CONTROLS[cmd], params)
    args = self._new("NVOS54_PARAMETERS", {"hClient": self.root, "hObject": obj, "cmd": cmd,
                                           "params": int(self.ffi.cast("uintptr_t", p)),
                                           "paramsSize": self.ffi.sizeof(p[0])})
    self.escape(self.ctl, ESC_RM_CONTROL, args, f"RM control {cmd:#x}")
    if args.status != NV_OK:
      raise RMError(f"RM control {cmd:#x} on {obj:#x} failed: {status_name(args.status)}", args.status)
    return p

  def free(self, parent: int, obj: int) -> None:
    """NV_ESC_RM_FREE of object `obj`."""
    args = self._new("NVOS00_PARAMETERS", {"hRoot": self.root, "hObjectParent": parent, "hObjectOld": obj})
    self.escape(self.ctl, ESC_RM_FREE, args, "RM free")
    if args.status != NV_OK: raise RMError(f"RM free of {obj:#x} failed: {status_name(args.status)}", args.status)

  def uvm(self, cmd: int, f: FileIOInterface | None = None, **params: Any) -> Any:
    """UVM ioctl `cmd` (uvm_ioctl.h) with its parameter block filled from `params`; RMError on a bad rmStatus."""
    p = self._new(UVM_IOCTLS[cmd], params)
    try: (f or self.uvm_fd).ioctl(cmd, self.ffi.buffer(p))
    except OSError as e:
      raise RMError(f"UVM ioctl {UVM_IOCTLS[cmd]}: {errno_name(e.errno or 0)} ({e.strerror})") from e
    if p.rmStatus != NV_OK:
      raise RMError(f"UVM {UVM_IOCTLS[cmd].removesuffix('_PARAMS')} failed: {status_name(p.rmStatus)}", p.rmStatus)
    return p

  def gpu_fd(self, minor: int) -> FileIOInterface:
    """/dev/nvidia<minor>, registered with the control file (NV_ESC_REGISTER_FD)."""
    path = f"/dev/nvidia{minor}"
    if not self.fio.access(path, os.R_OK | os.W_OK):
      raise RuntimeError(f"{path} is missing or not readable and writable by this user")
    f = self.fio(path, os.O_RDWR | os.O_CLOEXEC)
    self.escape(f, ESC_REGISTER_FD, self._new("nv_ioctl_register_fd_t", {"ctl_fd": self._fd(self.ctl)}),
                f"register {path}")
    return f

  def map_to_cpu(self, device: int, minor: int, handle: int, size: int, at: int = 0, flags: int = 0) -> int:
    """Map RM memory object `handle` into this process (NV_ESC_RM_MAP_MEMORY, then mmap of a fresh /dev/nvidiaN fd);
    at `at` (MAP_FIXED) when given. Returns the host address."""
    f = self.gpu_fd(minor)
    args = self._new("nv_ioctl_nvos33_parameters_with_fd", {"fd": self._fd(f)})
    args.params.hClient, args.params.hDevice, args.params.hMemory = self.root, device, handle
    args.params.length, args.params.flags = size, flags
    self.escape(self.ctl, ESC_RM_MAP_MEMORY, args, "RM map memory")
    if args.params.status != NV_OK:
      raise RMError(f"RM map of memory {handle:#x} ({size:#x} bytes) failed: {status_name(args.params.status)}")
    addr = f.mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (MAP_FIXED if at else 0), 0)
    self.mapped_files.append(f)  # the mapping lives as long as its file
    return addr


@dataclass
class NVDeviceHandles:
  """The RM objects of one opened GPU."""
  device: int
  subdevice: int
  virtmem: int
  vaspace: int
  uuid: bytes
  minor: int


MAP_FIXED_NOREPLACE = 0x100000  # Linux include/uapi/asm-generic/mman-common.h
LOW_VA_BASE, LOW_VA_CHUNK, LOW_VA_END = 0x20_0000_0000, 1 << 30, 0xF0_0000_0000


class LowVA:
  """Virtual addresses below 2**40 for what the GPU reaches through 40-bit fields (GPFIFO entries, QMD pointers
  (SEND_PCAS_A: address >> 8 in 32 bits), Ampere's semaphore addresses): 1 GiB chunks reserved inaccessible with
  MAP_FIXED_NOREPLACE from 128 GiB up, handed out first fit in pages; a freed range is made inaccessible again."""

  def __init__(self, fio: type[FileIOInterface]):
    self.fio, self.next_chunk = fio, LOW_VA_BASE
    self.free_ranges: list[tuple[int, int]] = []

  @staticmethod
  def of(fio: type[FileIOInterface]) -> LowVA:
    """The process's allocator (one for every device: they share the address space)."""
    if (lv := _LOW_VA.get(fio)) is None: lv = _LOW_VA[fio] = LowVA(fio)
    return lv

  def alloc(self, size: int) -> int:
    for i, (start, n) in enumerate(self.free_ranges):
      if n >= size:
        self.free_ranges[i:i + 1] = [(start + size, n - size)] if n > size else []
        return start
    while self.next_chunk + max(size, LOW_VA_CHUNK) <= LOW_VA_END:
      want, n = self.next_chunk, max(size, LOW_VA_CHUNK)
      self.next_chunk += n
      try: got = self.fio.anon_mmap(want, n, 0, MAP_PRIVATE | MAP_NORESERVE | MAP_FIXED_NOREPLACE)
      except FileExistsError: continue  # something else is there: try the next chunk
      if got == want:
        self.free_ranges.append((want + size, n - size))
        return want
      self.fio().munmap(got, n)  # an old kernel that treats NOREPLACE as a hint put it elsewhere
    raise MemoryError(f"no free virtual range of {size:#x} bytes below {LOW_VA_END:#x} for GPU-visible host memory")

  def free(self, start: int, size: int) -> None:
    self.fio.anon_mmap(start, size, 0, MAP_PRIVATE | MAP_NORESERVE | MAP_FIXED)
    self.free_ranges.append((start, size))


_LOW_VA: dict[type, LowVA] = {}
_OS_HANDLES = itertools.count(0xCAF00001)  # client-chosen handles for OS-descriptor memory (NVOS02 hObjectNew)


class NVMemory:
  """GPU memory for one device: RM memory objects mapped into the GPU VA space at their CPU address (UVM).

  The virtual range is reserved on the host first (an inaccessible anonymous mapping chosen by the kernel), so the GPU
  address equals the CPU address and nothing else in the process lands there; host-visible memory is then mapped over
  it (the device file for VRAM, anonymous memory for system memory), and UVM maps the RM object at the same address
  (UVM_CREATE_EXTERNAL_RANGE, NV_ESC_RM_MAP_MEMORY_DMA with a fixed offset in the device's virtual memory object,
  UVM_MAP_EXTERNAL_ALLOCATION).
  """

  def __init__(self, rm: RMIface, h: NVDeviceHandles, gpu_file: FileIOInterface | None = None):
    self.rm, self.h = rm, h
    # NV_ESC_RM_ALLOC_MEMORY goes to the GPU's own file: RM refuses it on nvidiactl (escape.c RmIoctl,
    # NV_ACTUAL_DEVICE_ONLY -> NV_ERR_INVALID_ARGUMENT)
    self.gpu_file = gpu_file if gpu_file is not None else rm.gpu_fd(h.minor)
    self.low = LowVA.of(rm.fio)

  def alloc(self, size: int, host: bool = False, cpu_access: bool = False, low: bool = False,
            contiguous: bool = False, map_flags: int = 0) -> HCQBuffer:
    """`size` bytes (rounded up to pages) of VRAM (`host=False`; CPU-visible when `cpu_access`) or of our own host
    pages (`host`), below 2**40 when `low`."""
    rm, size = self.rm, (max(size, 1) + PAGE - 1) // PAGE * PAGE
    va = self.low.alloc(size) if low else rm.fio.anon_mmap(0, size, 0, MAP_PRIVATE | MAP_NORESERVE)
    try:
      if host:
        rm.fio.anon_mmap(va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED)
        args = rm._new("nv_ioctl_nvos02_parameters_with_fd", {"fd": -1})
        p = args.params
        p.hRoot, p.hObjectParent, p.hObjectNew, p.hClass = rm.root, self.h.device, next(_OS_HANDLES), \
          NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
        p.flags = (OS02_FLAGS_PHYSICALITY_NONCONTIGUOUS << OS02_FLAGS_PHYSICALITY_SHIFT) | \
          (OS02_FLAGS_COHERENCY_CACHED << OS02_FLAGS_COHERENCY_SHIFT) | \
          (OS02_FLAGS_MAPPING_NO_MAP << OS02_FLAGS_MAPPING_SHIFT)
        p.pMemory, p.limit = va, size - 1
        rm.escape(self.gpu_file, ESC_RM_ALLOC_MEMORY, args, "RM alloc of OS memory")
        if p.status != NV_OK:
          raise RMError(f"RM alloc of {size:#x} bytes of host memory failed: {status_name(p.status)}", p.status)
        handle = int(p.hObjectNew)
      else:
        attr = (OS32_ATTR_PHYSICALITY_CONTIGUOUS if contiguous else OS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS) \
          << OS32_ATTR_PHYSICALITY_SHIFT
        attr2 = (OS32_ATTR2_GPU_CACHEABLE_YES << OS32_ATTR2_GPU_CACHEABLE_SHIFT) | OS32_ATTR2_ZBC_PREFER_NO_ZBC
        flags = OS32_ALLOC_FLAGS_MAP_NOT_REQUIRED | OS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED | \
          OS32_ALLOC_FLAGS_ALIGNMENT_FORCE | OS32_ALLOC_FLAGS_IGNORE_BANK_PLACEMENT | OS32_ALLOC_FLAGS_PERSISTENT_VIDMEM
        # format 6: the pitch-linear "kind" RM's own NV_MEMORY_ALLOCATION_PARAMS users pass for plain buffers
        handle = rm.alloc(self.h.device, NV1_MEMORY_USER, owner=rm.root, type=OS32_TYPE_IMAGE, flags=flags, attr=attr,
                          attr2=attr2, format=6, size=size, alignment=PAGE, limit=size - 1)
        if cpu_access: rm.map_to_cpu(self.h.device, self.h.minor, handle, size, at=va, flags=map_flags)
      self._gpu_map(va, size, handle)
    except BaseException:
      self._release_va(va, size, low)
      raise
    return HCQBuffer(va, size, meta=NVMem(handle, host, host or cpu_access, low), cpu_mapped=host or cpu_access)

  def _release_va(self, va: int, size: int, low: bool) -> None:
    if low: self.low.free(va, size)
    else: self.rm.fio().munmap(va, size)

  def _gpu_map(self, va: int, size: int, handle: int) -> None:
    rm = self.rm
    rm.uvm(UVM_CREATE_EXTERNAL_RANGE, base=va, length=size)
    args = rm._new("NVOS46_PARAMETERS", {"hClient": rm.root, "hDevice": self.h.device, "hDma": self.h.virtmem,
                                          "hMemory": handle, "length": size, "dmaOffset": va,
                                          "flags": (OS46_FLAGS_PAGE_SIZE_4KB << OS46_FLAGS_PAGE_SIZE_SHIFT) |
                                          (1 << OS46_FLAGS_CACHE_SNOOP_SHIFT) |
                                          (1 << OS46_FLAGS_DMA_OFFSET_FIXED_SHIFT)})
    rm.escape(rm.ctl, ESC_RM_MAP_MEMORY_DMA, args, "RM map memory DMA")
    if args.status != NV_OK or args.dmaOffset != va:
      raise RMError(f"RM DMA map of {handle:#x} at {va:#x} failed: {status_name(args.status)} (offset "
                    f"{int(args.dmaOffset):#x})")
    attrs = rm.ffi.new("UvmGpuMappingAttributes *")
    rm.ffi.memmove(attrs.gpuUuid.uuid, self.h.uuid, 16)
    attrs.gpuMappingType = UVM_MAPPING_TYPE_READ_WRITE_ATOMIC
    p = rm._new("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS", {"base": va, "length": size, "gpuAttributesCount": 1,
                                                       "rmCtrlFd": rm._fd(rm.ctl), "hClient": rm.root,
                                                       "hMemory": handle})
    p.perGpuAttributes[0] = attrs[0]
    try: rm.uvm_fd.ioctl(UVM_MAP_EXTERNAL_ALLOCATION, rm.ffi.buffer(p))
    except OSError as e: raise RMError(f"UVM_MAP_EXTERNAL_ALLOCATION: {errno_name(e.errno or 0)}") from e
    if p.rmStatus != NV_OK: raise RMError(f"UVM map of {handle:#x} at {va:#x} failed: {status_name(p.rmStatus)}")

  def free(self, buf: HCQBuffer) -> None:
    """Unmap from the GPU (UVM_FREE), free the RM object, drop the host mapping."""
    mem: NVMem = buf.meta
    self.rm.uvm(UVM_FREE, base=buf.va_addr, length=buf.size)
    self.rm.free(self.h.device, mem.handle)
    self._release_va(buf.va_addr, buf.size, mem.low)
