"""`MOCK+NV`: an in-process stand-in for NVIDIA's kernel driver (RM escapes, UVM) and two GPUs, behind the
`FileIOInterface` seam.

`MockFileIO` opens /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia0..1 and answers the same ioctls and mmaps the
real driver does, decoding each parameter block with the driver branch's cffi layouts (`rm.layouts("580")`). It
checks what the real driver checks: escape numbers, the file each escape is sent on (`ESCAPE_FILES`), parameter-block
sizes, object handles and their parents, classes the GPU offers, control commands and parameter sizes, alignment and
overlap of UVM ranges, that memory is DMA-mapped in the VA space before UVM maps it. Memory is host memory at the GPU
virtual address (GPU VA = CPU VA), so the GPU (`mock/gpu.py`, the PTX executor behind it) and the host see the same
bytes. GPU 0 is an H200 (Hopper
classes, sm_90), GPU 1 an A100 (Ampere classes, sm_80), GPU 2 a GA102 / RTX 3090 (AMPERE_COMPUTE_B, sm_86: the GPU
tinygrad 0.14's NV driver opens in tests/test_nv_proven.py); the driver version is 580.95.05. The GPU runs when the host
polls (`MockRM.process`, called by the device's signal waits).
"""
from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from tiny_uop.hcq import MAP_FIXED, MAP_SHARED, PROT_READ, PROT_WRITE, FileIOInterface

from tiny_runtime_nv import rm
from tiny_runtime_nv.ptx import Memory

VERSION = "580.95.05"
BRANCH = "580"
COMMON_CLASSES = (rm.NV01_ROOT_CLIENT, rm.NV01_DEVICE_0, rm.NV20_SUBDEVICE_0, rm.NV01_MEMORY_VIRTUAL,
                  rm.NV1_MEMORY_USER, rm.NV1_MEMORY_SYSTEM, rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, rm.FERMI_VASPACE_A,
                  rm.KEPLER_CHANNEL_GROUP_A, rm.FERMI_CONTEXT_SHARE_A, rm.GT200_DEBUGGER)


@dataclass(frozen=True)
class GPUConfig:
  """One mock GPU: its name, classes, and the GR facts NV2080_CTRL_CMD_GR_GET_INFO reports."""
  name: str
  classes: tuple[int, ...]
  sm_version: int
  num_gpcs: int
  num_tpc_per_gpc: int
  num_sm_per_tpc: int
  max_warps_per_sm: int
  max_shared: int           # bytes of shared memory a block may use
  pci_device_id: int = 0    # what NV_ESC_CARD_INFO reports as pci_info.device_id

  @property
  def gr_info(self) -> dict[int, int]:
    return {rm.GR_INFO_SM_VERSION: self.sm_version, rm.GR_INFO_NUM_GPCS: self.num_gpcs,
            rm.GR_INFO_NUM_TPC_PER_GPC: self.num_tpc_per_gpc, rm.GR_INFO_NUM_SM_PER_TPC: self.num_sm_per_tpc,
            rm.GR_INFO_MAX_WARPS_PER_SM: self.max_warps_per_sm}


H200 = GPUConfig("NVIDIA H200 (MOCK+NV)", COMMON_CLASSES + (
  rm.TURING_USERMODE_A, rm.AMPERE_USERMODE_A, rm.HOPPER_USERMODE_A, rm.HOPPER_CHANNEL_GPFIFO_A, rm.HOPPER_COMPUTE_A,
  rm.HOPPER_DMA_COPY_A), 0x900, 8, 9, 2, 64, 227 << 10, 0x2335)
A100 = GPUConfig("NVIDIA A100 (MOCK+NV)", COMMON_CLASSES + (
  rm.TURING_USERMODE_A, rm.AMPERE_USERMODE_A, rm.AMPERE_CHANNEL_GPFIFO_A, rm.AMPERE_COMPUTE_A, rm.AMPERE_DMA_COPY_A),
  0x800, 8, 8, 2, 64, 163 << 10, 0x20B2)
# GA102 (GeForce RTX 3090): AMPERE_COMPUTE_B, AMPERE_DMA_COPY_B, AMPERE_CHANNEL_GPFIFO_A and the Turing/Ampere usermode
# classes, as open-gpu-kernel-modules' src/nvidia/generated/g_gpu_class_list.c gpuGetClassDescriptorList_GA102 lists
# them. tinygrad 0.14's NV driver picks its compute class from BLACKWELL_COMPUTE_B, ADA_COMPUTE_A and
# AMPERE_COMPUTE_B only, so this is the mock GPU it opens (tests/test_nv_proven.py).
RTX3090 = GPUConfig("NVIDIA GeForce RTX 3090 (MOCK+NV)", COMMON_CLASSES + (
  rm.TURING_USERMODE_A, rm.AMPERE_USERMODE_A, rm.AMPERE_CHANNEL_GPFIFO_A, rm.AMPERE_COMPUTE_B, rm.AMPERE_DMA_COPY_B),
  0x806, 7, 6, 2, 48, 99 << 10, 0x2204)
GPUS = (H200, A100, RTX3090)


# Which file each escape the driver sends must be issued on: "ctl" (/dev/nvidiactl), "gpu" (/dev/nvidiaN) or "any".
# A wrong file fails the ioctl itself with EINVAL: RM's NV_CTL_DEVICE_ONLY / NV_ACTUAL_DEVICE_ONLY checks return
# NV_ERR_INVALID_ARGUMENT from rm_ioctl, which nvidia_ioctl turns into -EINVAL (open-gpu-kernel-modules 595.45.04,
# src/nvidia/arch/nvalloc/unix/src/escape.c RmIoctl; kernel-open/nvidia/nv.c nvidia_ioctl, whose own escapes use the
# same two macros with -EINVAL).
ESCAPE_FILES: dict[int, str] = {
  rm.ESC_RM_ALLOC_MEMORY: "gpu",     # escape.c RmIoctl: NV_ACTUAL_DEVICE_ONLY (OS descriptors and NVOS02 memory)
  rm.ESC_RM_FREE: "ctl",             # escape.c RmIoctl: NV_CTL_DEVICE_ONLY
  rm.ESC_RM_CONTROL: "ctl",          # escape.c RmIoctl: NV_CTL_DEVICE_ONLY
  rm.ESC_RM_ALLOC: "ctl",            # escape.c RmIoctl: NV_CTL_DEVICE_ONLY for every class but NV01_EVENT*
  rm.ESC_RM_MAP_MEMORY: "ctl",       # escape.c RmIoctl: NV_CTL_DEVICE_ONLY (the mmap then goes to params.fd)
  rm.ESC_RM_MAP_MEMORY_DMA: "ctl",   # escape.c RmIoctl: NV_CTL_DEVICE_ONLY
  rm.ESC_REGISTER_FD: "any",         # escape.c RmIoctl: "valid for both actual devices and ctrl devices"
  rm.ESC_CARD_INFO: "ctl",           # nv.c nvidia_ioctl: NV_CTL_DEVICE_ONLY
}
FILE_KIND_NAMES = {"ctl": "/dev/nvidiactl", "gpu": "a per-GPU /dev/nvidiaN", "any": "any RM file"}


def file_kind(path: str) -> str:
  """"ctl" for /dev/nvidiactl, "gpu" for /dev/nvidiaN (NV_FLAG_CONTROL is set on the control device only)."""
  return "ctl" if path == rm.NVIDIACTL else "gpu"


class RMStatus(Exception):
  """An RM call the mock refuses: the NV_STATUS it returns and why (kept in `MockRM.last_error`)."""

  def __init__(self, status: int, why: str):
    super().__init__(why)
    self.status = status


@dataclass
class Obj:
  """An RM object: class, parent handle, and what the class keeps."""
  cls: int
  parent: int
  gpu: int = -1
  data: dict[str, Any] = field(default_factory=dict)


@dataclass
class MemObj:
  """A memory object: its size, kind ("vram", "sysmem", "os") and where host memory backs it (None: not yet)."""
  size: int
  kind: str
  backing: int | None = None
  dma: set[int] = field(default_factory=set)   # VAs it is DMA-mapped at (NV_ESC_RM_MAP_MEMORY_DMA)


class MockRM:
  """The mock driver's state: objects, memory, UVM ranges and mappings, open files, and the GPUs (`mock/gpu.py`)."""

  def __init__(self, gpus: tuple[GPUConfig, ...] = GPUS):
    from tiny_runtime_nv.mock.gpu import MockGPU
    self.ffi = rm.layouts(BRANCH)
    self.configs = gpus
    self.objects: dict[int, Obj] = {}
    self.mems: dict[int, MemObj] = {}
    self.next_handle = 0xC1D00000
    self.files: dict[int, tuple[str, dict[str, Any]]] = {}   # fd -> (path, state)
    self.next_fd = 100
    self.uvm_initialized, self.uvm_init_flags = False, 0
    self.uvm_gpus: set[bytes] = set()
    self.uvm_gpu_vaspaces: set[bytes] = set()  # GPUs with a GPU VA space registered (UVM_REGISTER_GPU_VASPACE)
    self.ranges: dict[int, int] = {}          # UVM external ranges: base -> length
    self.mapped: dict[int, tuple[int, int]] = {}  # UVM mappings: base -> (length, memory handle)
    self.memory = Memory()                    # what the GPUs can reach (the PTX executor's view)
    self.gpus = [MockGPU(self, i, cfg) for i, cfg in enumerate(gpus)]
    self.last_error = ""
    self.last_fault = ""
    self.lock = threading.RLock()

  # ***** objects *****
  def _handle(self) -> int:
    self.next_handle += 1
    return self.next_handle

  def obj(self, h: int, *classes: int, what: str = "object") -> Obj:
    o = self.objects.get(h)
    if o is None: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"{what} handle {h:#x} does not exist")
    if classes and o.cls not in classes:
      raise RMStatus(rm.NV_ERR_INVALID_OBJECT_PARENT, f"{what} {h:#x} is of class {o.cls:#x}, not one of "
                     f"{', '.join(hex(c) for c in classes)}")
    return o

  def gpu_of(self, h: int) -> int: return self.objects[h].gpu

  def params(self, struct: str, addr: int, size: int) -> Any:
    """The caller's parameter block at `addr` as `struct` (NV_ERR_INVALID_PARAM_STRUCT when the size differs)."""
    want = self.ffi.sizeof(struct)
    if size != want: raise RMStatus(rm.NV_ERR_INVALID_PARAM_STRUCT, f"{struct}: {size} bytes given, the driver's "
                                    f"is {want}")
    if not addr: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"{struct}: NULL parameter pointer")
    return self.ffi.cast(f"{struct} *", addr)

  # ***** escapes *****
  def escape(self, fd: int, nr: int, size: int, buf: Any) -> None:
    path, state = self.files[fd]
    name = rm.ESCAPES.get(nr)
    want = ESCAPE_FILES.get(nr)
    if want is None: raise OSError(25, f"mock RM: unknown escape {nr:#x} on {path}")
    if want != "any" and file_kind(path) != want:
      raise OSError(22, f"mock RM: escape {nr:#x} ({name or 'NV_ESC_CARD_INFO'}) on {path}: RM accepts it only on "
                    f"{FILE_KIND_NAMES[want]} (escape.c/nv.c NV_{'CTL' if want == 'ctl' else 'ACTUAL'}_DEVICE_ONLY: "
                    "NV_ERR_INVALID_ARGUMENT, -EINVAL)")
    if nr == rm.ESC_CARD_INFO:
      n = size // self.ffi.sizeof("nv_ioctl_card_info_t")
      if n * self.ffi.sizeof("nv_ioctl_card_info_t") != size:
        raise OSError(22, f"NV_ESC_CARD_INFO: {size} bytes is not an array of nv_ioctl_card_info_t (on {path})")
      cards = self.ffi.from_buffer("nv_ioctl_card_info_t[]", buf)
      for i, _ in enumerate(self.gpus[:n]):
        cards[i].valid, cards[i].gpu_id, cards[i].minor_number = 1, 0x100 + i, i
        cards[i].pci_info.vendor_id, cards[i].pci_info.device_id = 0x10DE, self.configs[i].pci_device_id
      return
    assert name is not None
    if size != self.ffi.sizeof(name):
      raise OSError(22, f"mock RM: escape {nr:#x} ({name}) with a {size}-byte block; the driver's is "
                    f"{self.ffi.sizeof(name)}")
    p = self.ffi.from_buffer(f"{name} *", buf)
    if nr == rm.ESC_REGISTER_FD:
      # escape.c RmIoctl NV_ESC_REGISTER_FD: ctl_fd must be a control file, not this one, and this file must not be
      # registered already (NV_ERR_INVALID_ARGUMENT / NV_ERR_INVALID_STATE: -EINVAL either way)
      if self.files.get(p.ctl_fd, ("",))[0] != rm.NVIDIACTL or p.ctl_fd == fd:
        raise OSError(22, f"REGISTER_FD: {p.ctl_fd} is not another open /dev/nvidiactl")
      if state.get("registered"): raise OSError(22, f"REGISTER_FD: {path} (fd {fd}) is registered already")
      state["registered"] = True
      return
    st = p.params if name.endswith("_with_fd") else p
    with self.lock:
      try:
        self.last_error = ""
        {rm.ESC_RM_ALLOC: self._alloc, rm.ESC_RM_CONTROL: self._control, rm.ESC_RM_FREE: self._free,
         rm.ESC_RM_ALLOC_MEMORY: self._alloc_os_memory, rm.ESC_RM_MAP_MEMORY: self._map_memory,
         rm.ESC_RM_MAP_MEMORY_DMA: self._map_dma}[nr](p)
        st.status = rm.NV_OK
      except RMStatus as e:
        self.last_error = str(e)
        st.status = e.status

  def _alloc(self, p: Any) -> None:
    cls, parent = p.hClass, p.hObjectParent
    if cls not in rm.ALLOC_PARAMS: raise RMStatus(rm.NV_ERR_INVALID_CLASS, f"class {cls:#x} is unknown")
    pname = rm.ALLOC_PARAMS[cls]
    # RM sizes the parameter block by its class, not by NVOS21's paramsSize, which it ignores: param_copy.c
    # rmapiParamsCopyInit takes paramsSize from rmapiGetClassAllocParamSize(hClass) and refuses only a NULL block for a
    # class that needs one (NV_ERR_INVALID_ARGUMENT). tinygrad 0.14's driver leaves paramsSize 0.
    if pname is None: a = None
    elif not p.pAllocParms:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"class {cls:#x} needs a {pname} block; pAllocParms is NULL")
    else: a = self.params(pname, p.pAllocParms, self.ffi.sizeof(pname))
    if cls == rm.NV01_ROOT_CLIENT:
      if parent or p.hRoot: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_PARENT, "a root client has no parent")
      h = p.hObjectNew or self._handle()
      self.objects[h] = Obj(cls, 0)
      p.hObjectNew = h
      return
    self.obj(p.hRoot, rm.NV01_ROOT_CLIENT, what="root client")
    handler = ALLOCATORS.get(cls) or (_alloc_engine if cls in rm.USERMODE_CLASSES + rm.COMPUTE_CLASSES +
                                      rm.DMA_CLASSES else _alloc_gpfifo)
    gpu, data = handler(self, cls, parent, a)
    if gpu >= 0 and cls not in self.configs[gpu].classes:
      raise RMStatus(rm.NV_ERR_INVALID_CLASS, f"{self.configs[gpu].name} does not offer class {cls:#x}")
    h = p.hObjectNew or self._handle()
    if h in self.objects: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"handle {h:#x} is in use")
    self.objects[h] = Obj(cls, parent, gpu, data)
    if "mem" in data: self.mems[h] = data["mem"]
    if cls in rm.GPFIFO_CLASSES: self.gpus[gpu].add_channel(h, cls, data)
    if cls in rm.COMPUTE_CLASSES + rm.DMA_CLASSES: self.gpus[gpu].channels[parent].engines.add(cls)
    p.hObjectNew = h

  def _control(self, p: Any) -> None:
    cmd = p.cmd
    if cmd not in rm.CONTROLS: raise RMStatus(rm.NV_ERR_NOT_SUPPORTED, f"control {cmd:#x} is not known to the mock")
    if p.hClient not in self.objects: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"client {p.hClient:#x}")
    a = self.params(rm.CONTROLS[cmd], p.params, p.paramsSize)
    CONTROLS[cmd](self, p.hObject, a)

  def _free(self, p: Any) -> None:
    o = self.obj(p.hObjectOld, what="object to free")
    # Freeing memory UVM still maps is allowed: UVM_MAP_EXTERNAL_ALLOCATION dups the handle into UVM's own client,
    # "takes a ref count on the physical allocation so it can't go away under us" (kernel-open/nvidia-uvm/
    # uvm_map_external.c, nvUvmInterfaceDupMemory), so the mapping (`self.mapped`) lives on until UVM_FREE.
    # tinygrad 0.14's driver frees in that order (NV_ESC_RM_FREE, then UVM_FREE).
    if p.hObjectParent != o.parent and o.cls in (rm.NV1_MEMORY_USER, rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR):
      raise RMStatus(rm.NV_ERR_INVALID_OBJECT_PARENT, f"{p.hObjectOld:#x}'s parent is {o.parent:#x}")
    self.objects.pop(p.hObjectOld)
    self.mems.pop(p.hObjectOld, None)

  def _alloc_os_memory(self, args: Any) -> None:
    p = args.params
    if p.hClass != rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
      raise RMStatus(rm.NV_ERR_INVALID_CLASS, f"NV_ESC_RM_ALLOC_MEMORY of class {p.hClass:#x}; the mock knows OS "
                     "descriptors (0x71)")
    self.obj(p.hObjectParent, rm.NV01_DEVICE_0, what="parent device")
    size = p.limit + 1
    if p.pMemory % rm.PAGE or size % rm.PAGE:
      raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"OS memory at {p.pMemory:#x}+{size:#x} is not page aligned")
    if not p.hObjectNew or p.hObjectNew in self.objects:
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"OS memory needs a new client-chosen handle, got {p.hObjectNew:#x}")
    m = MemObj(size, "os", p.pMemory)
    self.objects[p.hObjectNew] = Obj(p.hClass, p.hObjectParent, self.gpu_of(p.hObjectParent), {"mem": m})
    self.mems[p.hObjectNew] = m

  def _map_memory(self, p: Any) -> None:
    st = p.params
    if p.fd not in self.files or not self.files[p.fd][1].get("registered"):
      raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"NV_ESC_RM_MAP_MEMORY: fd {p.fd} is not a registered /dev/nvidiaN")
    o = self.obj(st.hMemory, what="memory to map")
    if o.cls in rm.USERMODE_CLASSES: size = 0x10000
    elif st.hMemory in self.mems: size = self.mems[st.hMemory].size
    else: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"{st.hMemory:#x} (class {o.cls:#x}) can't be CPU-mapped")
    if st.offset + st.length > size:
      raise RMStatus(rm.NV_ERR_INVALID_LIMIT, f"map of {st.length:#x} bytes at {st.offset:#x} of a {size:#x}-byte "
                     "object")
    self.files[p.fd][1]["map"] = (st.hMemory, int(st.length))

  def _map_dma(self, p: Any) -> None:
    self.obj(p.hDma, rm.NV01_MEMORY_VIRTUAL, what="hDma")
    m = self.mems.get(p.hMemory)
    if m is None: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"hMemory {p.hMemory:#x} is not memory")
    if not (p.flags >> rm.OS46_FLAGS_DMA_OFFSET_FIXED_SHIFT) & 1:
      raise RMStatus(rm.NV_ERR_NOT_SUPPORTED, "the mock maps at fixed offsets only (NVOS46_FLAGS_DMA_OFFSET_FIXED)")
    if p.dmaOffset % rm.PAGE or p.length > m.size or p.length == 0:
      raise RMStatus(rm.NV_ERR_INVALID_OFFSET, f"DMA map of {p.length:#x} bytes at {p.dmaOffset:#x} (object of "
                     f"{m.size:#x})")
    m.dma.add(int(p.dmaOffset))

  # ***** UVM *****
  def uvm(self, cmd: int, buf: Any) -> None:
    name = rm.UVM_IOCTLS.get(cmd)
    if name is None: raise OSError(25, f"mock UVM: unknown ioctl {cmd:#x}")
    if len(buf) != self.ffi.sizeof(name): raise OSError(22, f"mock UVM: {name} of {len(buf)} bytes")
    p = self.ffi.from_buffer(f"{name} *", buf)
    with self.lock:
      try:
        if cmd != rm.UVM_INITIALIZE and not self.uvm_initialized:
          raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"{name} before UVM_INITIALIZE")
        UVM[cmd](self, p)
        p.rmStatus = rm.NV_OK
      except RMStatus as e:
        self.last_error = str(e)
        p.rmStatus = e.status

  def back(self, va: int, size: int) -> None:
    """Give the GPU virtual range [va, va + size) host memory (the driver reserved it)."""
    FileIOInterface.anon_mmap(va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED)

  def process(self) -> None:
    """Run every GPU's channels as far as they can go."""
    with self.lock:
      for g in self.gpus: g.process()


# ***** allocation handlers: (rm, class, parent, params) -> (gpu index, data) *****

def _alloc_device(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  r.obj(parent, rm.NV01_ROOT_CLIENT, what="device parent")
  if not 0 <= a.deviceId < len(r.gpus): raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"deviceId {a.deviceId}")
  return a.deviceId, {}


def _alloc_child(*parents: int) -> Callable[..., tuple[int, dict]]:
  def f(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
    r.obj(parent, *parents, what=f"parent of class {cls:#x}")
    return r.gpu_of(parent), {}
  return f


def _alloc_vram(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  r.obj(parent, rm.NV01_DEVICE_0, what="memory parent")
  if a.size == 0 or a.size % rm.PAGE or a.limit != a.size - 1:
    raise RMStatus(rm.NV_ERR_INVALID_LIMIT, f"memory of size {a.size:#x}, limit {a.limit:#x}")
  return r.gpu_of(parent), {"mem": MemObj(int(a.size), "vram" if cls == rm.NV1_MEMORY_USER else "sysmem")}


def _alloc_vaspace(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  r.obj(parent, rm.NV01_DEVICE_0, what="VA space parent")
  if not a.flags & rm.VASPACE_FLAGS_IS_EXTERNALLY_OWNED:
    raise RMStatus(rm.NV_ERR_INVALID_FLAGS, "UVM can only register an externally owned VA space")
  return r.gpu_of(parent), {}


def _alloc_group(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  r.obj(parent, rm.NV01_DEVICE_0, what="channel group parent")
  if a.engineType != rm.ENGINE_TYPE_GRAPHICS: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"engine {a.engineType}")
  return r.gpu_of(parent), {"scheduled": False}


def _alloc_ctxshare(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  r.obj(parent, rm.KEPLER_CHANNEL_GROUP_A, what="context share parent")
  r.obj(a.hVASpace, rm.FERMI_VASPACE_A, what="context share VA space")
  return r.gpu_of(parent), {}


def _alloc_engine(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  if cls in rm.USERMODE_CLASSES: r.obj(parent, rm.NV20_SUBDEVICE_0, what="usermode parent")
  else: r.obj(parent, *rm.GPFIFO_CLASSES, what=f"engine object {cls:#x} parent (a channel)")
  return r.gpu_of(parent), {}


def _alloc_gpfifo(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  r.obj(parent, rm.KEPLER_CHANNEL_GROUP_A, what="channel parent")
  ctx = r.obj(a.hContextShare, rm.FERMI_CONTEXT_SHARE_A, what="hContextShare")
  if ctx.parent != parent: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "hContextShare belongs to another group")
  n = a.gpFifoEntries
  if n < 2 or n & (n - 1): raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"gpFifoEntries {n} is not a power of two")
  err = r.mems.get(a.hObjectError)
  if err is None or err.size < 16: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, "hObjectError is not memory")
  userd = r.mems.get(a.hUserdMemory[0])
  if userd is None or a.userdOffset[0] + 0x200 > userd.size or a.userdOffset[0] % 0x200:
    raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"USERD at offset {a.userdOffset[0]:#x} of {a.hUserdMemory[0]:#x}")
  if a.gpFifoOffset % 8: raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"GPFIFO at {a.gpFifoOffset:#x}")
  return r.gpu_of(parent), {"ring": int(a.gpFifoOffset), "entries": int(n), "userd_mem": a.hUserdMemory[0],
                            "userd_off": int(a.userdOffset[0]), "error": a.hObjectError, "group": parent}


def _alloc_debugger(r: MockRM, cls: int, parent: int, a: Any) -> tuple[int, dict]:
  """GT200_DEBUGGER under a device, bound to a compute object of the client (cl83de.h NV83DE_ALLOC_PARAMETERS)."""
  dev = r.obj(parent, rm.NV01_DEVICE_0, what="debugger parent")
  r.obj(a.hAppClient, rm.NV01_ROOT_CLIENT, what="debugger hAppClient")
  r.obj(a.hClass3dObject, *rm.COMPUTE_CLASSES, what="debugger hClass3dObject")
  return dev.gpu, {}


ALLOCATORS: dict[int, Callable[..., tuple[int, dict]]] = {
  rm.NV01_DEVICE_0: _alloc_device, rm.NV20_SUBDEVICE_0: _alloc_child(rm.NV01_DEVICE_0),
  rm.NV01_MEMORY_VIRTUAL: _alloc_child(rm.NV01_DEVICE_0), rm.NV1_MEMORY_USER: _alloc_vram,
  rm.NV1_MEMORY_SYSTEM: _alloc_vram, rm.FERMI_VASPACE_A: _alloc_vaspace, rm.KEPLER_CHANNEL_GROUP_A: _alloc_group,
  rm.FERMI_CONTEXT_SHARE_A: _alloc_ctxshare, rm.GT200_DEBUGGER: _alloc_debugger}


# ***** controls: (rm, object, params) *****

def _ctrl_version(r: MockRM, h: int, a: Any) -> None:
  r.obj(h, rm.NV01_ROOT_CLIENT, what="client")
  for f in ("driverVersionBuffer", "versionBuffer"):
    r.ffi.memmove(getattr(a, f), VERSION.encode() + b"\0", len(VERSION) + 1)


def _ctrl_id_info(r: MockRM, h: int, a: Any) -> None:
  r.obj(h, rm.NV01_ROOT_CLIENT, what="client")
  if not 0x100 <= a.gpuId < 0x100 + len(r.gpus): raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"gpuId {a.gpuId:#x}")
  a.deviceInstance = a.gpuId - 0x100


def _ctrl_classlist(r: MockRM, h: int, a: Any) -> None:
  o = r.obj(h, rm.NV01_DEVICE_0, what="device")
  cls = r.configs[o.gpu].classes
  a.numClasses = len(cls)
  for i, c in enumerate(cls): a.classList[i] = c


def _ctrl_classlist_ptr(r: MockRM, h: int, a: Any) -> None:
  """NV0080_CTRL_CMD_GPU_GET_CLASSLIST: deviceCtrlCmdGpuGetClasslist_IMPL -> gpuGetClassList (gpu.c): with a NULL
  classList it returns the count in numClasses; with a list, numClasses must hold them all
  (NV_ERR_INVALID_PARAM_STRUCT otherwise) and the list is filled."""
  o = r.obj(h, rm.NV01_DEVICE_0, what="device")
  cls = r.configs[o.gpu].classes
  if a.classList:
    if a.numClasses < len(cls):
      raise RMStatus(rm.NV_ERR_INVALID_PARAM_STRUCT, f"class list of {a.numClasses} entries; the GPU has {len(cls)}")
    lst = r.ffi.cast("uint32_t *", a.classList)
    for i, c in enumerate(cls): lst[i] = c
  a.numClasses = len(cls)


def _ctrl_perf_boost(r: MockRM, h: int, a: Any) -> None:
  """NV2080_CTRL_CMD_PERF_BOOST: accepted on a subdevice; the mock's clocks do not change."""
  r.obj(h, rm.NV20_SUBDEVICE_0, what="subdevice")


def _ctrl_gid(r: MockRM, h: int, a: Any) -> None:
  o = r.obj(h, rm.NV20_SUBDEVICE_0, what="subdevice")
  if a.flags != rm.GID_FLAGS_FORMAT_BINARY or a.length != 16:
    raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"GID info flags {a.flags}, length {a.length}: the mock gives 16-byte "
                   "binary UUIDs")
  r.ffi.memmove(a.data, r.gpus[o.gpu].uuid, 16)


def _ctrl_gr_info(r: MockRM, h: int, a: Any) -> None:
  o = r.obj(h, rm.NV20_SUBDEVICE_0, what="subdevice")
  if not 0 < a.grInfoListSize <= 100: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"grInfoListSize {a.grInfoListSize}")
  lst = r.ffi.cast("NV2080_CTRL_GR_INFO *", a.grInfoList)
  info = r.configs[o.gpu].gr_info
  for i in range(a.grInfoListSize):
    if lst[i].index not in info: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"GR info index {lst[i].index:#x}")
    lst[i].data = info[lst[i].index]


def _ctrl_schedule(r: MockRM, h: int, a: Any) -> None:
  o = r.obj(h, rm.KEPLER_CHANNEL_GROUP_A, what="channel group")
  o.data["scheduled"] = bool(a.bEnable)


def _ctrl_token(r: MockRM, h: int, a: Any) -> None:
  o = r.obj(h, *rm.GPFIFO_CLASSES, what="channel")
  a.workSubmitToken = r.gpus[o.gpu].channels[h].token


CONTROLS: dict[int, Callable[[MockRM, int, Any], None]] = {
  rm.CTRL_SYSTEM_GET_BUILD_VERSION_V2: _ctrl_version, rm.CTRL_GPU_GET_ID_INFO_V2: _ctrl_id_info,
  rm.CTRL_GPU_GET_CLASSLIST_V2: _ctrl_classlist, rm.CTRL_GPU_GET_GID_INFO: _ctrl_gid,
  rm.CTRL_GR_GET_INFO: _ctrl_gr_info, rm.CTRL_GPFIFO_SCHEDULE: _ctrl_schedule,
  rm.CTRL_GPFIFO_GET_WORK_SUBMIT_TOKEN: _ctrl_token, rm.CTRL_GPU_GET_CLASSLIST: _ctrl_classlist_ptr,
  rm.CTRL_PERF_BOOST: _ctrl_perf_boost}


# ***** UVM handlers *****

UVM_INIT_FLAGS_MASK = 0x3  # uvm_types.h: UVM_INIT_FLAGS_DISABLE_HMM 0x1 | UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE 0x2


def _uvm_init(r: MockRM, p: Any) -> None:
  """uvm.c uvm_api_initialize: flags outside UVM_INIT_FLAGS_MASK, or a second INITIALIZE with other flags than the
  first, is NV_ERR_INVALID_ARGUMENT; the same flags again are fine."""
  if p.flags & ~UVM_INIT_FLAGS_MASK:
    raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT,
                   f"UVM_INITIALIZE flags {p.flags:#x}: valid bits {UVM_INIT_FLAGS_MASK:#x}")
  if r.uvm_initialized and p.flags != r.uvm_init_flags:
    raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"UVM_INITIALIZE flags {p.flags:#x}: the VA space was initialized with "
                   f"{r.uvm_init_flags:#x}")
  r.uvm_initialized, r.uvm_init_flags = True, p.flags


def _uvm_mm_init(r: MockRM, p: Any) -> None:
  if r.files.get(p.uvmFd, ("",))[0] != rm.NVIDIA_UVM: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"uvmFd {p.uvmFd}")


def _uuid(r: MockRM, u: Any) -> bytes:
  b = bytes(r.ffi.buffer(u.uuid, 16))
  if not any(g.uuid == b for g in r.gpus): raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"GPU UUID {b.hex()} unknown")
  return b


def _uvm_register_gpu(r: MockRM, p: Any) -> None: r.uvm_gpus.add(_uuid(r, p.gpu_uuid))


def _with_gpu_va_space(r: MockRM, u: Any, what: str) -> bytes:
  """The GPU `u` names, which must have a GPU VA space in this UVM VA space: uvm_user_channel.c uvm_register_channel
  and uvm_map_external.c look it up with uvm_va_space_get_gpu_by_uuid_with_gpu_va_space, NV_ERR_INVALID_DEVICE
  when there is none."""
  if (b := _uuid(r, u)) not in r.uvm_gpu_vaspaces:
    raise RMStatus(rm.NV_ERR_INVALID_DEVICE, f"{what}: GPU {b.hex()} has no GPU VA space registered with UVM "
                   "(UVM_REGISTER_GPU, then UVM_REGISTER_GPU_VASPACE)")
  return b


def _uvm_register_vaspace(r: MockRM, p: Any) -> None:
  # uvm_va_space.c uvm_va_space_register_gpu_va_space: a GPU not registered (UVM_REGISTER_GPU) is
  # NV_ERR_INVALID_DEVICE (uvm_va_space_retain_gpu_by_uuid)
  if (b := _uuid(r, p.gpuUuid)) not in r.uvm_gpus:
    raise RMStatus(rm.NV_ERR_INVALID_DEVICE, f"UVM_REGISTER_GPU_VASPACE: GPU {b.hex()} is not registered with UVM")
  if r.files.get(p.rmCtrlFd, ("",))[0] != rm.NVIDIACTL: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, "rmCtrlFd")
  r.obj(p.hVaSpace, rm.FERMI_VASPACE_A, what="hVaSpace")
  r.uvm_gpu_vaspaces.add(b)


def _uvm_register_channel(r: MockRM, p: Any) -> None:
  _with_gpu_va_space(r, p.gpuUuid, "UVM_REGISTER_CHANNEL")
  r.obj(p.hChannel, *rm.GPFIFO_CLASSES, what="hChannel")
  if p.base % rm.PAGE or p.length % rm.PAGE or not p.length:
    raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"channel VA {p.base:#x}+{p.length:#x}")


def _uvm_create_range(r: MockRM, p: Any) -> None:
  base, n = int(p.base), int(p.length)
  if base % rm.PAGE or n % rm.PAGE or not n: raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"range {base:#x}+{n:#x}")
  for b, ln in r.ranges.items():
    if base < b + ln and b < base + n:
      raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"range {base:#x}+{n:#x} overlaps the range at {b:#x}")
  r.ranges[base] = n


def _uvm_map_external(r: MockRM, p: Any) -> None:
  base, n = int(p.base), int(p.length)
  rng = next(((b, ln) for b, ln in r.ranges.items() if b <= base and base + n <= b + ln), None)
  if rng is None: raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"{base:#x}+{n:#x} is in no external range")
  m = r.mems.get(p.hMemory)
  if m is None: raise RMStatus(rm.NV_ERR_INVALID_OBJECT_HANDLE, f"hMemory {p.hMemory:#x}")
  if p.offset + n > m.size: raise RMStatus(rm.NV_ERR_INVALID_LIMIT, f"map of {n:#x} bytes of a {m.size:#x}-byte object")
  if base not in m.dma:
    raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"memory {p.hMemory:#x} is not DMA-mapped at {base:#x} in the VA space "
                   "(NV_ESC_RM_MAP_MEMORY_DMA first)")
  if p.gpuAttributesCount != 1: raise RMStatus(rm.NV_ERR_INVALID_ARGUMENT, f"{p.gpuAttributesCount} GPU attributes")
  _with_gpu_va_space(r, p.perGpuAttributes[0].gpuUuid, "UVM_MAP_EXTERNAL_ALLOCATION")
  if m.backing is None:
    r.back(base, m.size)
    m.backing = base
  elif m.backing != base:
    raise RMStatus(rm.NV_ERR_NOT_SUPPORTED, f"the mock maps memory at its CPU address only ({m.backing:#x}, not "
                   f"{base:#x})")
  r.mapped[base] = (n, int(p.hMemory))
  r.memory.add(base, n)


def _uvm_free(r: MockRM, p: Any) -> None:
  base = int(p.base)
  if base not in r.ranges: raise RMStatus(rm.NV_ERR_INVALID_ADDRESS, f"UVM_FREE of {base:#x}: no such range")
  r.ranges.pop(base)
  if r.mapped.pop(base, None) is not None: r.memory.remove(base)


UVM: dict[int, Callable[[MockRM, Any], None]] = {
  rm.UVM_INITIALIZE: _uvm_init, rm.UVM_MM_INITIALIZE: _uvm_mm_init, rm.UVM_REGISTER_GPU: _uvm_register_gpu,
  rm.UVM_REGISTER_GPU_VASPACE: _uvm_register_vaspace, rm.UVM_REGISTER_CHANNEL: _uvm_register_channel,
  rm.UVM_CREATE_EXTERNAL_RANGE: _uvm_create_range, rm.UVM_MAP_EXTERNAL_ALLOCATION: _uvm_map_external,
  rm.UVM_FREE: _uvm_free}


_DRIVER: MockRM | None = None


def driver() -> MockRM:
  """The process's mock driver (created on first use)."""
  global _DRIVER
  if _DRIVER is None: _DRIVER = MockRM()
  return _DRIVER


def _dev_paths() -> set[str]: return {rm.NVIDIACTL, rm.NVIDIA_UVM, *(f"/dev/nvidia{i}" for i in range(len(GPUS)))}


class MockFileIO(FileIOInterface):
  """`FileIOInterface` over the mock driver: opens, ioctls and mmaps answered in-process."""

  def __init__(self, path: str = "", flags: int = os.O_RDONLY, fd: int | None = None):
    self.path, self.fd = path, None
    if not path: return
    if path not in _dev_paths(): raise FileNotFoundError(2, f"mock NV driver: no such file {path!r}")
    d = driver()
    d.next_fd += 1
    self.fd = d.next_fd
    d.files[self.fd] = (path, {})

  def __del__(self) -> None: pass

  def ioctl(self, request: int, arg: Any) -> int:
    d = driver()
    if self.path == rm.NVIDIA_UVM:
      d.uvm(request, arg)
      return 0
    typ, nr, size, direction = (request >> 8) & 0xFF, request & 0xFF, (request >> 16) & 0x3FFF, request >> 30
    if typ != ord(rm.NV_IOCTL_MAGIC) or direction != 3:
      raise OSError(25, f"mock RM: ioctl {request:#x} is not an NV escape (_IOWR('F', nr, size))")
    if size != len(arg): raise OSError(14, f"mock RM: ioctl size {size} but a {len(arg)}-byte buffer")
    assert self.fd is not None
    d.escape(self.fd, nr, size, arg)
    return 0

  def mmap(self, start: int, size: int, prot: int, flags: int, offset: int) -> int:
    d = driver()
    if self.fd is None: return FileIOInterface.mmap(self, start, size, prot, flags, offset)
    state = d.files[self.fd][1]
    if "map" not in state: raise OSError(22, f"mock RM: mmap of {self.path} without NV_ESC_RM_MAP_MEMORY on this fd")
    handle, length = state.pop("map")
    if size > length or offset: raise OSError(22, f"mock RM: mmap of {size:#x} bytes, {length:#x} were mapped")
    o = d.objects[handle]
    if o.cls in rm.USERMODE_CLASSES: return ctypes.addressof(d.gpus[o.gpu].usermode)
    m = d.mems[handle]
    if not flags & MAP_FIXED: start = FileIOInterface.anon_mmap(0, size, 0, 0x02 | 0x4000)
    d.back(start, size)
    m.backing = start
    return start

  @staticmethod
  def exists(path: str) -> bool: return path in _dev_paths()

  @staticmethod
  def access(path: str, mode: int) -> bool: return path in _dev_paths()
