"""NVIDIA's driver API as this package uses it: the subset of `cuda.h` (cffi declarations, result codes, attribute
and launch constants) and `Driver`, which calls libcuda, or a mock with the same functions, and checks each result.

Both the CUDA device (`cuda`) and the mock libcuda (`mock.libcuda`) build on it: the mock returns these result codes
and the device checks them, and neither imports the other for it (issue #33).
"""
from __future__ import annotations

import ctypes.util
from typing import Any

import cffi

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
