"""The NV device: NVIDIA GPUs through the kernel driver's RM and UVM ioctls, no CUDA library (HCQ,
docs/ARCHITECTURE.md §6).

`NVDevice("NV[:n]")` opens /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia<minor> (`rm.RMIface`; an unsupported
driver branch is an error naming the supported ones), allocates the RM objects of one GPU (device, subdevice, virtual
memory, a page-faulting VA space registered with UVM, a channel group with one subcontext), picks the usermode,
GPFIFO, compute and copy classes from the GPU's class list, maps the usermode doorbell page, creates a compute and a
copy GPFIFO channel (ring and USERD in CPU-visible VRAM below 2**40) and binds their objects. Memory has the same GPU
and CPU address (`rm.NVMemory`). Work is recorded as methods (`push.py`), copied into a command ring and submitted as
GPFIFO entries (write the entry, GP_PUT in USERD, the channel's work-submit token to the doorbell). Kernels are cubins
(`NVProgram`: `cubin.py` reads their launch facts) launched with QMD descriptors (03_00 on Ampere/Ada, 04_00 on
Hopper) whose constant bank 0 holds the driver's window addresses and the parameters. Signals are host-memory
semaphores (value, then GPU time in ns).

`MOCK+NV[:n]` runs the same code against `mock/rm.py` (an H200 as GPU 0, an A100 as GPU 1), whose GPU decodes what
is submitted and runs the kernels' PTX on the package's PTX executor. Without a GPU, opening `NV` says why:
no /dev/nvidiactl (no driver), no permission, or an unsupported driver version.
"""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from tiny_uop.hcq import ArgsLayout, FileIOInterface, HCQAllocator, HCQBuffer, HCQCompiled, HCQProgram, \
  HCQSignal, HWQueue, Val, backoff_sleep
from tiny_uop.hcq2 import HCQ2Graph
from tiny_uop.helpers import del_errors
from tiny_uop.target import Target

from tiny_runtime_nv import push, rm
from tiny_runtime_nv.cubin import load_kernel_info
from tiny_runtime_nv.encode import pm_lower
from tiny_runtime_nv.push import QMD, NVComputeQueue, NVCopyQueue, Windows

NVIDIACTL_PATH = rm.NVIDIACTL
DOORBELL = 0x90          # clc361.h NVC361_NOTIFY_CHANNEL_PENDING: write a channel's work-submit token here
USERMODE_SIZE = 0x10000
USERD_GP_GET, USERD_GP_PUT = 0x88, 0x8C   # clc56f.h AmpereAControlGPFifo: GPGet, GPPut (byte offsets in USERD)
GPFIFO_ENTRIES = 0x4000
CMDQ_SIZE = 2 << 20
SIGNAL_PAGE = 0x10000
KERNARGS_SIZE = 4 << 20
ERROR_NOTIFIER_SIZE = 0x1000
NOTIFIER = struct.Struct("<IIIHH")  # NvNotification (nvtypes/cl0000.h): timeStamp[2], info32, info16, status
# constant bank 0's driver area, as NVIDIA's ptxas-compiled SASS reads it (sm_80 and sm_90 cubins decoded in
# tests/test_nv_cubin.py test_cbank0_driver_area_is_what_ptxas_code_reads): %ntid.x/y/z at bytes 0x0/0x4/0x8,
# %nctaid.x/y/z at 0xc/0x10/0x14, the shared and local window bases at 0x18/0x20 (cvta.shared / cvta.local), and at
# 0x28 the stack pointer every kernel loads into R1 at entry. Its value 0xfffdc0 (= 2**24 - 0x240) is tinygrad's NV
# driver's (ops_nv.py), as is the LOCAL_RESERVE that keeps the 0x240 bytes above that stack inside local memory
CB0_NTID, CB0_NCTAID = 0x0, 0xC
CB0_SHARED_WINDOW, CB0_LOCAL_WINDOW, CB0_UNKNOWN, CB0_UNKNOWN_VALUE = 0x18, 0x20, 0x28, 0xFFFDC0
LOCAL_RESERVE = 0x240    # bytes of local memory per thread beyond the stack (2**24 - the stack pointer's start)
SHARED_RESERVE = 0x400   # shared memory the SM keeps per CTA on sm_80+ (CUDA Programming Guide, "Shared Memory")


def round_up(x: int, a: int) -> int: return (x + a - 1) // a * a


def cubin_renderers(jit: Any = None) -> list[type]:
  """PTXRenderer and NVPTXRenderer (same names) whose compilers always give a cubin: ptxas's, or with `jit` (a
  `cuda.Driver`) the driver's JIT linker's (`jit.DriverJITCompiler`)."""
  from tiny_codegen.compiler.ptx import PTXCompiler
  from tiny_codegen.renderer import nvptx, ptx

  def assembler(arch: str) -> Any:
    if jit is None: return PTXCompiler(arch, use_ptxas=True)
    from tiny_runtime_nv.jit import DriverJITCompiler
    return DriverJITCompiler(arch, jit)

  class PTXRenderer(ptx.PTXRenderer):
    """PTXRenderer compiling to cubins for the NV device."""
    def make_compiler(self) -> Any: return assembler(self.arch or "sm_90")

  class NVPTXRenderer(nvptx.NVPTXRenderer):
    """NVPTXRenderer compiling to cubins for the NV device."""
    def make_compiler(self) -> Any:
      c = nvptx.NVPTXCompiler(self.arch or "sm_90")
      c.ptxas = assembler(self.arch or "sm_90")
      return c
  return [PTXRenderer, NVPTXRenderer]


@dataclass
class GPFifo:
  """One channel: its ring of 64-bit GPFIFO entries, USERD (GP_PUT/GP_GET), work-submit token and error notifier."""
  ring: int
  userd: int
  entries: int
  token: int
  notifier: HCQBuffer
  handle: int
  put: int = 0

  @property
  def gp_get(self) -> int: return ctypes.c_uint32.from_address(self.userd + USERD_GP_GET).value


class NVSignal(HCQSignal):
  """A semaphore in host memory (value, then the GPU time in ns). The RM interface here has no wait-for-interrupt, so
  a long wait sleeps in growing steps (`backoff_sleep`) instead of spinning a core."""

  def _idle(self, waited_s: float, left_s: float) -> None: backoff_sleep(waited_s)


class NVProgram(HCQProgram):
  """A kernel of a cubin, uploaded to GPU memory through the copy engine (the whole cubin as it is, so each section is
  at the image's address + its file offset).

  Argument region (`args_layout`): constant bank 0 (`cbank0_size` rounded to 256 bytes: the driver area, then the
  parameters at the cubin's EIATTR_PARAM_CBANK offset, laid out as EIATTR_KPARAM_INFO says: a 64-bit address per
  buffer, then an int32 per value), then this launch's QMD (256 bytes in 03_00, 384 in 04_00), filled from a
  per-program template with the constant-bank address (`fill_args`) and the launch sizes (`fill_launch`)."""

  def __init__(self, dev: NVDevice, name: str, lib: bytes, **kwargs: Any):
    super().__init__(dev, name, lib)
    self.dev: NVDevice = dev
    self.info = info = load_kernel_info(lib, name)
    if info.arch != dev.arch:
      raise RuntimeError(f"kernel {name} was compiled for {info.arch}; {dev.device} is {dev.arch}")
    self.image = dev._gpu_alloc(round_up(len(lib), 0x1000) + 0x1000)  # a page of slack for code prefetch
    dev.allocator._copyin(self.image, memoryview(lib))
    self.prog_addr = self.image.va_addr + info.text_offset
    self.cb0_size = round_up(max(info.cbank0_size, info.param_offset + info.param_size), 256)
    self.local_size = round_up(info.local_size + LOCAL_RESERVE, 16)
    dev.ensure_local_memory(self.local_size)
    self.shared_size = round_up(info.shared_size + SHARED_RESERVE, 128)
    if self.shared_size > dev.max_shared:
      raise RuntimeError(f"kernel {name} needs {self.shared_size} bytes of shared memory; {dev.arch} has "
                         f"{dev.max_shared} per block")
    self.qmd_version = ver = dev.qmd_version
    q = QMD(version=ver)
    if ver.major == 3: q["SM_GLOBAL_CACHING_ENABLE"] = 1
    else: q["QMD_TYPE"] = push.QMD_TYPE_GRID_CTA  # 04_00: a grid of CTAs (no clusters)
    for k, v in (("QMD_MAJOR_VERSION", ver.major), (ver.minor, 0), ("QMD_GROUP_ID", 0x3F),
                 ("INVALIDATE_TEXTURE_HEADER_CACHE", 1),
                 ("INVALIDATE_TEXTURE_SAMPLER_CACHE", 1), ("INVALIDATE_TEXTURE_DATA_CACHE", 1),
                 ("INVALIDATE_SHADER_DATA_CACHE", 1), ("CWD_MEMBAR_TYPE", push.CWD_MEMBAR_TYPE_L1_SYSMEMBAR),
                 ("API_VISIBLE_CALL_LIMIT", push.API_VISIBLE_CALL_LIMIT_NO_CHECK),
                 ("SAMPLER_INDEX", push.SAMPLER_INDEX_VIA_HEADER_INDEX), ("BARRIER_COUNT", 1),
                 ("SHARED_MEMORY_SIZE", self.shared_size), (ver.registers, info.registers),
                 ("SHADER_LOCAL_MEMORY_HIGH_SIZE", self.local_size), ("SASS_VERSION", dev.gpu.sass_version),
                 ("PROGRAM_ADDRESS_LOWER", self.prog_addr & 0xFFFFFFFF),
                 ("PROGRAM_ADDRESS_UPPER", self.prog_addr >> 32),
                 ("CONSTANT_BUFFER_VALID_0", 1), ("CONSTANT_BUFFER_INVALIDATE_0", 1),
                 ("CONSTANT_BUFFER_SIZE_SHIFTED4_0", self.cb0_size >> 4)):
      q[k] = v
    cfg = dev.smem_config(self.shared_size)
    q["MIN_SM_CONFIG_SHARED_MEM_SIZE"] = q["TARGET_SM_CONFIG_SHARED_MEM_SIZE"] = cfg
    q["MAX_SM_CONFIG_SHARED_MEM_SIZE"] = dev.smem_config(dev.max_shared)
    self.qmd = bytes(q)
    self.max_threads = min(1024, (65536 // round_up(max(info.registers, 1) * 32, 256)) // 4 * 4 * 32)
    self.cb0_head = struct.pack("<QQQ", dev.windows.shared, dev.windows.local, CB0_UNKNOWN_VALUE)

  def args_layout(self, n_bufs: int, n_vals: int) -> ArgsLayout:
    ps = self.info.params
    want = [8] * n_bufs + [4] * n_vals
    if [p.size for p in ps] != want:
      raise RuntimeError(f"kernel {self.name}: the cubin's parameters are {[p.size for p in ps]} bytes; a launch with "
                         f"{n_bufs} buffers and {n_vals} values needs {want}")
    base = self.info.param_offset
    return ArgsLayout(self.cb0_size + self.qmd_version.size, 0, tuple(base + p.offset for p in ps[:n_bufs]),
                      tuple(base + p.offset for p in ps[n_bufs:]))

  def fill_args(self, base: int, bufs: Sequence[int], vals: Sequence[int]) -> int:
    lay = self.args_layout(len(bufs), len(vals))
    ctypes.memset(base, 0, self.cb0_size)
    ctypes.memmove(base + CB0_SHARED_WINDOW, self.cb0_head, len(self.cb0_head))
    for o, a in zip(lay.buf_offsets, bufs): ctypes.c_uint64.from_address(base + o).value = a
    for o, v in zip(lay.val_offsets, vals): ctypes.c_int32.from_address(base + o).value = v
    qmd = base + self.cb0_size
    q = QMD(self.qmd, self.qmd_version)
    q.set_cb0(base)
    ctypes.memmove(qmd, bytes(q), self.qmd_version.size)
    return base

  def fill_launch(self, base: int, global_size: Sequence[int], local_size: Sequence[int]) -> None:
    """The grid (03_00 CTA_RASTER_*, 04_00 GRID_*) and block (CTA_THREAD_DIMENSION*) sizes into this region's QMD,
    and into constant bank 0's driver area, where ptxas-compiled code reads %ntid and %nctaid."""
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size) + (1, 1, 1))[:3]
    ctypes.memmove(base + CB0_NTID, struct.pack("<6I", *ls, *gs), 24)
    self._write_qmd(base + self.cb0_size, *zip(self.qmd_version.grid, gs),
                    *zip(("CTA_THREAD_DIMENSION0", "CTA_THREAD_DIMENSION1", "CTA_THREAD_DIMENSION2"), ls))

  def _write_qmd(self, addr: int, *fields: tuple[str, int]) -> None:
    ver = self.qmd_version
    q = QMD(ctypes.string_at(addr, ver.size), ver)
    for k, v in fields: q[k] = v
    ctypes.memmove(addr, bytes(q), ver.size)

  def launch_fields(self, global_size: Any, local_size: Any) -> list[tuple[int, int, Any]]:
    """`fill_launch`'s fields (bit offset in the region, width, value): the grid size (CTA_RASTER_* in 03_00,
    GRID_* in 04_00) and CTA_THREAD_DIMENSION0/1/2 in the QMD, and the same sizes in constant bank 0 (%ntid,
    %nctaid)."""
    lay = self.qmd_version.layout
    names = (*self.qmd_version.grid, "CTA_THREAD_DIMENSION0", "CTA_THREAD_DIMENSION1", "CTA_THREAD_DIMENSION2")
    qmd = [(8 * self.cb0_size + lay[n][1], lay[n][0] - lay[n][1] + 1, v)
           for n, v in zip(names, (*global_size[:3], *local_size[:3]))]
    cb0 = [(8 * (start + 4 * i), 32, v) for start, dims in ((CB0_NTID, local_size), (CB0_NCTAID, global_size))
           for i, v in enumerate(dims[:3])]
    return qmd + cb0

  def qmd_addr(self, args_addr: Val) -> Val: return args_addr + self.cb0_size

  def check_launch(self, gs: Sequence[int], ls: Sequence[int]) -> None:
    threads = ls[0] * ls[1] * ls[2]
    if threads > self.max_threads or any(not 1 <= d <= m for d, m in zip(ls, (1024, 1024, 64))) or \
       any(not 1 <= d <= m for d, m in zip(gs, (0x7FFFFFFF, 65535, 65535))):
      raise RuntimeError(f"kernel {self.name}: launch of {tuple(gs)} blocks of {tuple(ls)} threads is out of range "
                         f"(grid <= (2**31-1, 65535, 65535), block <= (1024, 1024, 64) and {self.max_threads} threads "
                         f"with {self.info.registers} registers each)")

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size or (1, 1, 1)) + (1, 1, 1))[:3]
    self.check_launch(gs, ls)
    dev = self.dev
    base = dev.kernargs_alloc(self.args_layout(len(bufs), len(vals)).size)
    addr = self.fill_args(base, [b.va_addr for b in bufs], vals)
    self.fill_launch(base, gs, ls)
    q = NVComputeQueue().wait(dev.timeline_signal, dev.timeline_value - 1).memory_barrier()
    if wait: q.timestamp(dev.time_signals[0])
    q.exec(self, addr, gs, ls)
    if wait: q.timestamp(dev.time_signals[1])
    q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
    if not wait: return None
    dev.synchronize()
    return (dev.time_signals[1].timestamp - dev.time_signals[0].timestamp) / 1e6

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    if getattr(self, "image", None) is None: return  # refused before its code image was allocated
    with _errors("NVProgram.__del__ (freeing its code image)"):
      self.dev.defer_free(self.image, self.dev.timeline_value - 1)


class NVDevice(HCQCompiled):
  """``NV[:n]`` (the NVIDIA kernel driver) and ``MOCK+NV[:n]`` (`mock/rm.py`)."""
  hw_compute_queue_t = NVComputeQueue
  hw_copy_queue_t = NVCopyQueue
  pm_lower = pm_lower  # HCQ2's encoder (encode.py)

  def __init__(self, device: str):
    target = Target.parse(device).check_interface()
    self.index = target.indices[0] if target.indices else 0
    fio: type[FileIOInterface] = FileIOInterface
    self._mock: Any = None
    if target.interface == "MOCK":
      from tiny_runtime_nv.mock.rm import MockFileIO, driver
      fio, self._mock = MockFileIO, driver()
    self.rm = r = rm.RMIface(fio)
    from tiny_codegen.compiler.ptx import find_ptxas
    jit = None
    if find_ptxas() is None:
      if self._mock is not None:
        raise RuntimeError(f"{device} needs NVIDIA's ptxas to build cubins (pip install nvidia-cuda-nvcc, a CUDA "
                           "toolkit, or PTXAS=/path/to/ptxas)")
      from tiny_runtime_nv.cuda import Driver
      try: jit = Driver.open()
      except (RuntimeError, OSError) as e:
        raise RuntimeError(f"{device} loads cubins and builds them with NVIDIA's ptxas (pip install "
                           "nvidia-cuda-nvcc, a CUDA toolkit, or PTXAS=/path/to/ptxas) or the driver's JIT in "
                           f"libcuda.so.1; neither is here ({e})") from e
    if not 0 <= self.index < len(r.cards):
      raise RuntimeError(f"{device}: no such NVIDIA GPU; this machine has {len(r.cards)}: NV:0..{len(r.cards) - 1}")
    gpu_id, minor = r.cards[self.index]
    self.gpu_fd = r.gpu_fd(minor)
    info = r.control(r.root, rm.CTRL_GPU_GET_ID_INFO_V2, gpuId=gpu_id)
    dev = r.alloc(r.root, rm.NV01_DEVICE_0, deviceId=info.deviceInstance, hClientShare=r.root)
    sub = r.alloc(dev, rm.NV20_SUBDEVICE_0)
    virtmem = r.alloc(dev, rm.NV01_MEMORY_VIRTUAL, limit=0x1FFFFFFFFFFFF)
    classes = r.control(dev, rm.CTRL_GPU_GET_CLASSLIST_V2)
    have = {int(classes.classList[i]) for i in range(classes.numClasses)}

    def pick(kind: str, options: tuple[int, ...]) -> int:
      for c in options:
        if c in have: return c
      raise RuntimeError(f"{device}: the GPU offers no {kind} class this driver knows "
                         f"({', '.join(f'{c:#x}' for c in options)}); it lists {sorted(hex(c) for c in have)}")
    self.usermode_class, self.gpfifo_class = pick("usermode", rm.USERMODE_CLASSES), pick("GPFIFO", rm.GPFIFO_CLASSES)
    self.compute_class, self.dma_class = pick("compute", rm.COMPUTE_CLASSES), pick("copy", rm.DMA_CLASSES)
    self.qmd_version = push.qmd_of_class(self.compute_class)  # Hopper's compute class reads QMD 04_00
    usermode = r.alloc(sub, self.usermode_class)
    self.doorbell = r.map_to_cpu(dev, minor, usermode, USERMODE_SIZE)
    vaspace = r.alloc(dev, rm.FERMI_VASPACE_A, vaBase=0x1000, vaSize=0x1FFFFFB000000,
                      flags=rm.VASPACE_FLAGS_ENABLE_PAGE_FAULTING | rm.VASPACE_FLAGS_IS_EXTERNALLY_OWNED)
    gid = r.control(sub, rm.CTRL_GPU_GET_GID_INFO, flags=rm.GID_FLAGS_FORMAT_BINARY, length=16)
    uuid = bytes(gid.data[0:16])
    self.handles = h = rm.NVDeviceHandles(dev, sub, virtmem, vaspace, uuid, minor)
    uid = {"uuid": list(uuid)}
    r.uvm(rm.UVM_REGISTER_GPU, gpu_uuid=uid, rmCtrlFd=-1)
    r.uvm(rm.UVM_REGISTER_GPU_VASPACE, gpuUuid=uid, rmCtrlFd=r._fd(r.ctl), hClient=r.root, hVaSpace=vaspace)
    self.mem = rm.NVMemory(r, h, self.gpu_fd)
    gr = [rm.GR_INFO_SM_VERSION, rm.GR_INFO_NUM_GPCS, rm.GR_INFO_NUM_TPC_PER_GPC, rm.GR_INFO_NUM_SM_PER_TPC,
          rm.GR_INFO_MAX_WARPS_PER_SM]
    lst = r.ffi.new(f"NV2080_CTRL_GR_INFO[{len(gr)}]", [{"index": i} for i in gr])
    r.control(sub, rm.CTRL_GR_GET_INFO, grInfoListSize=len(gr), grInfoList=int(r.ffi.cast("uintptr_t", lst)))
    v = [int(x.data) for x in lst]
    self.gpu = rm.GPUInfo(v[0], v[1], v[2], v[3], v[4])
    self.windows = Windows()
    self.max_shared = (227 << 10) if self.gpu.sm_version >= 0x900 else (163 << 10) if self.gpu.sm_version == 0x800 \
      else (99 << 10)  # CUDA Programming Guide, "Features and Technical Specifications": max shared memory per block
    # channels: a channel group with one subcontext on our VA space, a compute and a copy GPFIFO in it
    group = r.alloc(dev, rm.KEPLER_CHANNEL_GROUP_A, engineType=rm.ENGINE_TYPE_GRAPHICS)
    ctxshare = r.alloc(group, rm.FERMI_CONTEXT_SHARE_A, hVASpace=vaspace, flags=rm.CTXSHARE_FLAGS_SUBCONTEXT_ASYNC)
    stride = round_up(GPFIFO_ENTRIES * 8 + 0x1000, 0x10000)
    # default (uncached) CPU mapping: GP_PUT must be visible before the doorbell write that follows it (a
    # write-combined mapping would need a store fence Python can't issue)
    self.gpfifo_area = self.mem.alloc(2 * stride, cpu_access=True, low=True, contiguous=True)
    self.compute_fifo = self._new_fifo(group, ctxshare, 0, self.compute_class)
    self.copy_fifo = self._new_fifo(group, ctxshare, stride, self.dma_class)
    r.control(group, rm.CTRL_GPFIFO_SCHEDULE, bEnable=1)
    self.cmdq = self.mem.alloc(CMDQ_SIZE, host=True, low=True)
    self.cmdq_put = 0
    self.cmdq_submitted = 0  # the timeline value of the last submission handed to a channel
    self.signal_page = self.mem.alloc(SIGNAL_PAGE, host=True, low=True)
    self._free_signals = list(range(self.signal_page.va_addr, self.signal_page.va_addr + SIGNAL_PAGE, 16))[::-1]
    self.kernargs = self.mem.alloc(KERNARGS_SIZE, host=True, low=True)
    self._kernargs_ptr = 0
    self.local_per_thread = 0
    self.local_mem: HCQBuffer | None = None
    self._old_local: list[HCQBuffer] = []
    if self._mock is not None:
      from tiny_runtime_nv.mock.compiler import mock_renderers
      renderers = mock_renderers(cubin=True)  # ptxas cubins carrying their PTX (the mock GPU runs the PTX)
    else: renderers = cubin_renderers(jit)
    super().__init__(device, HCQAllocator(self), renderers, NVProgram, HCQ2Graph, arch=self.gpu.arch)
    self.time_signals = [self.new_signal(), self.new_signal()]
    NVComputeQueue().bind_object(self.compute_class).setup(self.windows.shared, self.windows.local) \
      .signal(self.timeline_signal, self.next_timeline()).submit(self)
    NVCopyQueue().wait(self.timeline_signal, self.timeline_value - 1).bind_object(self.dma_class) \
      .signal(self.timeline_signal, self.next_timeline()).submit(self)
    self.synchronize()

  def _new_fifo(self, group: int, ctxshare: int, offset: int, engine_class: int) -> GPFifo:
    r, area = self.rm, self.gpfifo_area
    notifier = self.mem.alloc(ERROR_NOTIFIER_SIZE, host=True, low=True)
    userd_off = offset + GPFIFO_ENTRIES * 8
    ch = r.alloc(group, self.gpfifo_class, gpFifoOffset=area.va_addr + offset, gpFifoEntries=GPFIFO_ENTRIES,
                 hContextShare=ctxshare, hObjectError=notifier.meta.handle, hObjectBuffer=area.meta.handle,
                 hUserdMemory=[area.meta.handle], userdOffset=[userd_off])
    r.alloc(ch, engine_class)
    token = r.control(ch, rm.CTRL_GPFIFO_GET_WORK_SUBMIT_TOKEN, workSubmitToken=0xFFFFFFFF).workSubmitToken
    base = self.mem.low.alloc(0x4000000)  # UVM's per-channel VA (RM places channel buffers there): taken from the low
    r.fio().munmap(base, 0x4000000)       # range and left without a host mapping (never returned to LowVA)
    r.uvm(rm.UVM_REGISTER_CHANNEL, gpuUuid={"uuid": list(self.handles.uuid)}, rmCtrlFd=r._fd(r.ctl), hClient=r.root,
          hChannel=ch, base=base, length=0x4000000)
    return GPFifo(area.va_addr + offset, area.va_addr + userd_off, GPFIFO_ENTRIES, int(token), notifier, ch)

  # ***** submission *****
  def push_dwords(self, dwords: list[int]) -> tuple[int, int]:
    """Copy method dwords into the command ring; (address, count). Wrapping waits for everything submitted so far."""
    n = 4 * len(dwords)
    if n > CMDQ_SIZE: raise ValueError(f"a submission of {len(dwords)} dwords does not fit the {CMDQ_SIZE}-byte ring")
    if self.cmdq_put + n > CMDQ_SIZE:
      # wait for what was submitted before, not `synchronize()`: the submission being built has taken its timeline
      # value already and is not submitted yet, so waiting for it stalled forever (at the ring's first wrap)
      self.timeline_signal.wait(self.cmdq_submitted)
      self.cmdq_put = 0
    addr = self.cmdq.va_addr + self.cmdq_put
    # typeshed: a c_uint32 array slice takes ints
    (ctypes.c_uint32 * len(dwords)).from_address(addr)[:] = dwords  # type: ignore[assignment]
    self.cmdq_put = round_up(self.cmdq_put + n, 16)
    return addr, len(dwords)

  def submit_gpfifo(self, queue: HWQueue, *entries: tuple[int, int]) -> None:
    """Append a GPFIFO entry per (address, dwords) to the queue's channel, publish GP_PUT, ring the doorbell once."""
    self._submit_entries(self.copy_fifo if isinstance(queue, NVCopyQueue) else self.compute_fifo, entries)

  def hcq_submitter(self, engine: str) -> Any:
    """HCQ2's submit: on the compute or copy channel, each list of method dwords is copied into the command ring and
    each `(address, ndwords)` (a bound command buffer) runs in place, one GPFIFO entry per part, one doorbell."""
    fifo = {"compute": self.compute_fifo, "copy": self.copy_fifo}[engine]
    push_dwords, submit = self.push_dwords, self._submit_entries
    return lambda parts: submit(fifo, [push_dwords(p) if isinstance(p, list) else p for p in parts])

  def _submit_entries(self, fifo: GPFifo, entries: Sequence[tuple[int, int]]) -> None:
    for addr, ndwords in entries:
      while (fifo.put - fifo.gp_get) % fifo.entries >= fifo.entries - 1: self.progress()
      ctypes.c_uint64.from_address(fifo.ring + 8 * (fifo.put % fifo.entries)).value = push.gp_entry(addr, ndwords)
      fifo.put += 1
    ctypes.c_uint32.from_address(fifo.userd + USERD_GP_PUT).value = fifo.put % fifo.entries
    ctypes.c_uint32.from_address(self.doorbell + DOORBELL).value = fifo.token
    self.cmdq_submitted = self.timeline_value - 1  # every value taken so far is in a submitted entry now

  # ***** memory, signals, local memory *****
  def _gpu_alloc(self, size: int, host: bool = False) -> HCQBuffer:
    return self.mem.alloc(size, host=True, low=True) if host else self.mem.alloc(size)

  def _gpu_free(self, buf: HCQBuffer) -> None: self.mem.free(buf)

  def new_signal(self, value: int = 0) -> HCQSignal:
    if not self._free_signals:
      raise RuntimeError(f"{self.device}: all {SIGNAL_PAGE // HCQSignal.SIZE} signals are in use")
    return NVSignal(self._free_signals.pop(), value, timestamp_divider=1000.0, progress=self.progress)

  def smem_config(self, nbytes: int) -> int:
    """The SM shared-memory carveout (QMD *_SM_CONFIG_SHARED_MEM_SIZE: KiB / 4 + 1, as Mesa NVK computes it) of the
    smallest configuration of this architecture holding `nbytes` (CUDA Programming Guide carveouts per arch)."""
    kib = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228) if self.gpu.sm_version >= 0x900 else \
      (0, 8, 16, 32, 64, 100, 132, 164) if self.gpu.sm_version == 0x800 else (0, 8, 16, 32, 64, 100)
    return next(k for k in kib if k << 10 >= min(nbytes, kib[-1] << 10)) // 4 + 1

  def ensure_local_memory(self, per_thread: int) -> None:
    """Grow the local-memory buffer to `per_thread` bytes for every warp slot of every TPC, and tell the compute
    engine (SET_SHADER_LOCAL_MEMORY_*). A replaced buffer stays allocated: queues recorded before may still use it."""
    if per_thread <= self.local_per_thread: return
    g = self.gpu
    per_tpc = round_up(round_up(per_thread * 32, 0x200) * g.max_warps_per_sm * g.num_sm_per_tpc, 0x8000)
    buf = self.mem.alloc(round_up(per_tpc * g.num_tpc_per_gpc * g.num_gpcs, 0x20000))
    if self.local_mem is not None: self._old_local.append(self.local_mem)
    self.local_mem, self.local_per_thread = buf, per_thread
    NVComputeQueue().wait(self.timeline_signal, self.timeline_value - 1) \
      .set_local_memory(buf.va_addr, per_tpc, 0xFF).signal(self.timeline_signal, self.next_timeline()).submit(self)

  def progress(self) -> None:
    """Let the mock GPU run; then report a channel error the driver wrote to an error notifier (RuntimeError)."""
    if self._mock is not None: self._mock.process()
    for fifo in (self.compute_fifo, self.copy_fifo):
      ts0, ts1, info32, info16, status = NOTIFIER.unpack(ctypes.string_at(fifo.notifier.va_addr, NOTIFIER.size))
      if status or info32:
        ctypes.memset(fifo.notifier.va_addr, 0, NOTIFIER.size)
        detail = self._mock.last_fault if self._mock is not None else ""
        what = "compute" if fifo is self.compute_fifo else "copy"
        raise RuntimeError(f"{self.device}: the {what} channel reported error {info32} (Xid; 31: MMU fault, 13: "
                           f"graphics exception), status {status:#x}{': ' + detail if detail else ''}")
