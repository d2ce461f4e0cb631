"""The CUDA device: NVIDIA's driver API (`libcuda.so.1`) through cffi, no CUDA toolkit at run time.

`CUDADevice("CUDA[:n]")` initializes the driver, opens device n and creates a context for it; memory is
`cuMemAlloc`ed, copies are async on the context's default stream (through pinned staging memory), programs load
from a cubin (ptxas present) or from PTX (the driver JIT-compiles it), launches pass the packed parameter buffer
(`CU_LAUNCH_PARAM_BUFFER_POINTER`), kernel times come from events, device-to-device copies between contexts use
`cuMemcpyPeerAsync`, and TinyJit replays through `CUDAGraph` (prebuilt parameter buffers, patched per call, launched
back to back). `MOCK+CUDA` runs the same code against `mock.libcuda.MockLibCUDA`, whose GPU is the PTX executor.

Without a driver, opening `CUDA` raises RuntimeError("libcuda.so.1 not found: ..."); with a driver but no GPU, the
driver's own error (CUDA_ERROR_NO_DEVICE) is named.
"""
from __future__ import annotations

import ctypes.util
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import cffi

from tiny_uop.device import BufferSpec, Compiled, LRUAllocator, Program
from tiny_uop.helpers import del_errors
from tiny_uop.target import Target

# the subset of cuda.h used here (types and signatures as in cuda.h of CUDA 12/13; the _v2 entry points are the
# ones cuda.h's macros map the plain names to)
CDEF = """
typedef int CUresult; typedef int CUdevice; typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext; typedef struct CUmod_st *CUmodule; typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream; typedef struct CUevent_st *CUevent; typedef struct CUlinkState_st *CUlinkState;
CUresult cuInit(unsigned int Flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount, CUstream hStream);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuLinkCreate_v2(unsigned int numOptions, int *options, void **optionValues, CUlinkState *stateOut);
CUresult cuLinkAddData_v2(CUlinkState state, int type, void *data, size_t size, const char *name,
                          unsigned int numOptions, int *options, void **optionValues);
CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut);
CUresult cuLinkDestroy(CUlinkState state);
"""
ffi = cffi.FFI()
ffi.cdef(CDEF)

# cuda.h: enum cudaError_enum (the values the driver and the mock return), CUdevice_attribute, launch params
CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_NOT_INITIALIZED = 0, 1, 2, 3
CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE = 100, 101
CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_PTX = 200, 201, 218
CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_FOUND = 400, 500
CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_MISALIGNED_ADDRESS = 700, 701, 716
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_LAUNCH_FAILED = 704, 719
ERROR_NAMES = {v: k for k, v in globals().items() if k.startswith("CUDA_")}
ATTR_MAX_THREADS_PER_BLOCK, ATTR_MULTIPROCESSOR_COUNT = 1, 16
ATTR_COMPUTE_CAPABILITY_MAJOR, ATTR_COMPUTE_CAPABILITY_MINOR = 75, 76
ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8   # CUfunction_attribute
LAUNCH_PARAM_END, LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
MEMHOSTALLOC_PORTABLE = 1
JIT_TARGET, JIT_INPUT_PTX = 9, 1  # CUjit_option CU_JIT_TARGET (value: CUjit_target, e.g. 90), CUjitInputType
LIBCUDA = "libcuda.so.1"


class CUDAError(RuntimeError):
  """A driver API call failed; the message names the call, the CUresult and the driver's text."""


class Driver:
  """libcuda through cffi (or a mock with the same functions): `call("cuMemAlloc_v2", ptr, n)` checks the result."""

  def __init__(self, lib: Any):
    self.lib = lib

  @staticmethod
  def open() -> Driver:
    """The real libcuda.so.1; RuntimeError naming what is missing when there is no NVIDIA driver."""
    try: return Driver(ffi.dlopen(LIBCUDA))
    except OSError:
      if ctypes.util.find_library("cuda") is None:
        raise RuntimeError(f"{LIBCUDA} not found: no NVIDIA driver on this machine (DEV=MOCK+CUDA runs the CUDA "
                           "driver code on the PTX executor; DEV=NULL:PTX compiles only)") from None
      raise

  def check(self, res: int, what: str) -> None:
    if res == CUDA_SUCCESS: return
    s = ffi.new("const char **")
    text = ffi.string(s[0]).decode() if self.lib.cuGetErrorString(res, s) == 0 and s[0] != ffi.NULL else "?"
    raise CUDAError(f"{what} failed: {ERROR_NAMES.get(res, res)} ({res}): {text}")

  def call(self, fn: str, *args: Any) -> None: self.check(getattr(self.lib, fn)(*args), fn)


def pack_args(bufs: Sequence[int], vals: Sequence[int]) -> bytes:
  """The kernel parameter buffer PTX declares: a .u64 address per buffer, then an .s32 per variable."""
  return struct.pack(f"<{len(bufs)}Q{len(vals)}i", *bufs, *vals)


@dataclass(frozen=True)
class CUDABuffer:
  """Device memory: a CUdeviceptr and its size (a class, not an int: TinyJit graphs tell buffers from input
  indices by type)."""
  ptr: int
  size: int


class CUDAAllocator(LRUAllocator[CUDABuffer]):
  """cuMemAlloc'd memory; host copies through a pinned staging buffer."""

  def __init__(self, dev: CUDADevice, staging: int = 4 << 20):
    super().__init__()
    self.dev, self.staging_size = dev, staging
    self._staging: Any = None

  def _alloc(self, size: int, options: BufferSpec) -> CUDABuffer:
    p = ffi.new("CUdeviceptr *")
    self.dev.drv.call("cuCtxSetCurrent", self.dev.ctx)
    try: self.dev.drv.call("cuMemAlloc_v2", p, max(size, 1))
    except CUDAError as e:
      if "OUT_OF_MEMORY" in str(e): raise MemoryError(f"{self.dev.device}: cuMemAlloc({size}) out of memory") from e
      raise
    return CUDABuffer(int(p[0]), size)

  def _free(self, opaque: CUDABuffer, options: BufferSpec) -> None:
    self.dev.synchronize()
    self.dev.drv.call("cuMemFree_v2", opaque.ptr)

  def _offset(self, buf: CUDABuffer, size: int, offset: int) -> CUDABuffer: return CUDABuffer(buf.ptr + offset, size)

  def staging(self) -> Any:
    if self._staging is None:
      pp = ffi.new("void **")
      self.dev.drv.call("cuMemHostAlloc", pp, self.staging_size, MEMHOSTALLOC_PORTABLE)
      self._staging = ffi.cast("char *", pp[0])
    return self._staging

  def _copyin(self, dest: CUDABuffer, src: memoryview) -> None:
    stg, drv = self.staging(), self.dev.drv
    drv.call("cuCtxSetCurrent", self.dev.ctx)
    for i in range(0, src.nbytes, self.staging_size):
      n = min(self.staging_size, src.nbytes - i)
      self.dev.synchronize()  # the staging buffer is free once the copy before finished
      ffi.memmove(stg, src[i:i + n], n)
      drv.call("cuMemcpyHtoDAsync_v2", dest.ptr + i, stg, n, ffi.NULL)
    self.dev.synchronize()

  def _copyout(self, dest: memoryview, src: CUDABuffer) -> None:
    stg, drv = self.staging(), self.dev.drv
    drv.call("cuCtxSetCurrent", self.dev.ctx)
    self.dev.synchronize()
    for i in range(0, dest.nbytes, self.staging_size):
      n = min(self.staging_size, dest.nbytes - i)
      drv.call("cuMemcpyDtoHAsync_v2", stg, src.ptr + i, n, ffi.NULL)
      self.dev.synchronize()
      dest[i:i + n] = ffi.buffer(stg, n)

  def _transfer(self, dest: CUDABuffer, src: CUDABuffer, size: int) -> None:
    """Device to device on this context."""
    self.dev.drv.call("cuCtxSetCurrent", self.dev.ctx)
    self.dev.drv.call("cuMemcpyDtoDAsync_v2", dest.ptr, src.ptr, size, ffi.NULL)
    self.dev.synchronize()

  def _peer_copy(self, dest: CUDABuffer, src: CUDABuffer, size: int, src_dev: CUDADevice) -> None:
    """The engine's COPY from another CUDA device (docs/PLUGINS.md): `peer_copy`."""
    self.peer_copy(dest, src_dev, src, size)

  def peer_copy(self, dest: CUDABuffer, src_dev: CUDADevice, src: CUDABuffer, size: int) -> None:
    """Copy from another CUDA device's memory (its context) into this device's (cuMemcpyPeerAsync)."""
    src_dev.synchronize()
    self.dev.drv.call("cuCtxSetCurrent", self.dev.ctx)
    self.dev.drv.call("cuMemcpyPeerAsync", dest.ptr, self.dev.ctx, src.ptr, src_dev.ctx, size, ffi.NULL)
    self.dev.synchronize()


class CUDAProgram(Program):
  """A module loaded from a cubin or PTX, and its kernel function."""

  def __init__(self, dev: CUDADevice, name: str, lib: bytes, **kwargs: Any):
    super().__init__(dev, name, lib)
    self.dev: CUDADevice = dev
    drv = dev.drv
    drv.call("cuCtxSetCurrent", dev.ctx)
    self.image = ffi.new("char[]", lib + (b"" if lib.startswith(b"\x7fELF") else b"\0"))  # PTX: NUL-terminated
    mod, fn = ffi.new("CUmodule *"), ffi.new("CUfunction *")
    drv.call("cuModuleLoadData", mod, self.image)
    self.module = mod[0]
    drv.call("cuModuleGetFunction", fn, self.module, name.encode())
    self.fn = fn[0]

  def launch_args(self, params: bytes) -> tuple[Any, Any, Any]:
    """(parameter buffer, its size, the `extra` array pointing at them) for cuLaunchKernel."""
    buf = ffi.new("char[]", max(len(params), 8))
    ffi.memmove(buf, params, len(params))
    size = ffi.new("size_t *", len(params))
    extra = ffi.new("void *[5]", [ffi.cast("void *", LAUNCH_PARAM_BUFFER_POINTER), buf,
                                  ffi.cast("void *", LAUNCH_PARAM_BUFFER_SIZE), size,
                                  ffi.cast("void *", LAUNCH_PARAM_END)])
    return buf, size, extra

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size or (1, 1, 1)) + (1, 1, 1))[:3]
    dev, drv = self.dev, self.dev.drv
    drv.call("cuCtxSetCurrent", dev.ctx)
    keep = self.launch_args(pack_args([b.ptr for b in bufs], vals))
    if wait: drv.call("cuEventRecord", dev.events[0], ffi.NULL)
    drv.call("cuLaunchKernel", self.fn, *gs, *ls, 0, ffi.NULL, ffi.NULL, keep[2])
    if not wait: return None
    drv.call("cuEventRecord", dev.events[1], ffi.NULL)
    drv.call("cuEventSynchronize", dev.events[1])
    ms = ffi.new("float *")
    drv.call("cuEventElapsedTime", ms, dev.events[0], dev.events[1])
    return float(ms[0]) / 1e3

  def __del__(self) -> None:
    if getattr(self, "module", None) is None: return  # the load failed: nothing to unload
    with del_errors("CUDAProgram.__del__ (cuModuleUnload)"): self.dev.drv.lib.cuModuleUnload(self.module)


class CUDAGraph:
  """TinyJit's device graph on CUDA (the contract in docs/PIPELINE.md §7): each captured kernel gets a prebuilt
  parameter buffer and `extra` array; a replay patches input addresses and variable values in place and launches
  the kernels back to back (symbolic launch sizes are recomputed per call)."""
  builds = 0

  @staticmethod
  def supports(dev: Any, kernel: Any) -> bool: return isinstance(kernel.prg, CUDAProgram)

  def __init__(self, dev: CUDADevice, kernels: Sequence[Any]):
    self.dev, self.calls = dev, []
    for k in kernels:
      bufs = [0 if isinstance(b, int) else b.ptr for b in k.bufs]
      keep = k.prg.launch_args(pack_args(bufs, [v for _, v in k.vars]))
      patches = [(i, 8 * j) for j, i in enumerate(k.bufs) if isinstance(i, int)]
      var_offs = [(name, 8 * len(k.bufs) + 4 * j) for j, (name, _) in enumerate(k.vars)]
      self.calls.append((k, keep, patches, var_offs))
    CUDAGraph.builds += 1

  def __call__(self, inputs: Sequence[Any], var_vals: dict[str, int] | None = None) -> None:
    var_vals = var_vals or {}
    drv = self.dev.drv
    drv.call("cuCtxSetCurrent", self.dev.ctx)
    for k, keep, patches, var_offs in self.calls:
      buf = keep[0]
      for slot, off in patches: ffi.cast("unsigned long long *", buf + off)[0] = inputs[slot].ptr
      for name, off in var_offs:
        if name in var_vals: ffi.cast("int *", buf + off)[0] = var_vals[name]
      gs, ls = k.launch(var_vals) if not k.static_launch else (k.global_size, k.local_size)
      gs, ls = (tuple(gs) + (1, 1, 1))[:3], (tuple(ls or (1, 1, 1)) + (1, 1, 1))[:3]
      drv.call("cuLaunchKernel", k.prg.fn, *gs, *ls, 0, ffi.NULL, ffi.NULL, keep[2])


class CUDADevice(Compiled):
  """``CUDA[:n]`` (libcuda) and ``MOCK+CUDA[:n]`` (the mock driver and the PTX executor)."""

  def __init__(self, device: str):
    target = Target.parse(device).check_interface()
    self.index = target.indices[0] if target.indices else 0
    self.mock = target.interface == "MOCK"
    if self.mock:
      from tiny_runtime_nv.mock.libcuda import mock_libcuda
      self.drv = Driver(mock_libcuda())
    else: self.drv = Driver.open()
    drv = self.drv
    drv.call("cuInit", 0)
    n = ffi.new("int *")
    drv.call("cuDeviceGetCount", n)
    if not 0 <= self.index < n[0]:
      raise RuntimeError(f"{device}: no such CUDA device; this machine has {n[0]}: CUDA:0..{n[0] - 1}")
    d = ffi.new("CUdevice *")
    drv.call("cuDeviceGet", d, self.index)
    self.cu_device = d[0]
    major, minor = self.attribute(ATTR_COMPUTE_CAPABILITY_MAJOR), self.attribute(ATTR_COMPUTE_CAPABILITY_MINOR)
    ctx = ffi.new("CUcontext *")
    drv.call("cuCtxCreate_v2", ctx, 0, self.cu_device)
    self.ctx = ctx[0]
    ev = [ffi.new("CUevent *") for _ in range(2)]
    for e in ev: drv.call("cuEventCreate", e, 0)
    self.events = [e[0] for e in ev]
    if self.mock:
      from tiny_runtime_nv.mock.compiler import mock_renderers
      renderers = mock_renderers(cubin=False)  # PTX text, as the driver JIT-compiles it; ptxas checks it aside
    else:
      from tiny_codegen.renderer.nvptx import NVPTXRenderer
      from tiny_codegen.renderer.ptx import PTXRenderer
      renderers = [PTXRenderer, NVPTXRenderer]
    super().__init__(device, CUDAAllocator(self), renderers, CUDAProgram, CUDAGraph, arch=f"sm_{major}{minor}")

  def attribute(self, attr: int) -> int:
    v = ffi.new("int *")
    self.drv.call("cuDeviceGetAttribute", v, attr, self.cu_device)
    return int(v[0])

  @property
  def name(self) -> str:
    buf = ffi.new("char[256]")
    self.drv.call("cuDeviceGetName", buf, 256, self.cu_device)
    return ffi.string(buf).decode()

  def synchronize(self) -> None:
    self.drv.call("cuCtxSetCurrent", self.ctx)
    self.drv.call("cuCtxSynchronize")

  def timed(self, fn: Any) -> float:
    """Seconds between two events recorded around `fn()` (GPU time of what fn queues)."""
    self.drv.call("cuEventRecord", self.events[0], ffi.NULL)
    fn()
    self.drv.call("cuEventRecord", self.events[1], ffi.NULL)
    self.drv.call("cuEventSynchronize", self.events[1])
    ms = ffi.new("float *")
    self.drv.call("cuEventElapsedTime", ms, self.events[0], self.events[1])
    return float(ms[0]) / 1e3

