"""`MOCK+CUDA`: an in-process `libcuda.so.1` with the functions `tiny_runtime_nv.cuda` calls, whose GPUs run kernels
on the PTX executor.

Arguments arrive as the real library gets them through cffi (out-parameters are cffi pointers, handles are opaque
pointers), and results are `CUresult` codes from cuda.h. It rejects what the driver rejects: calls before `cuInit`
(CUDA_ERROR_NOT_INITIALIZED), unknown handles (CUDA_ERROR_INVALID_HANDLE / INVALID_CONTEXT), device pointers
outside every allocation or freed twice (CUDA_ERROR_INVALID_VALUE), launch sizes beyond the limits of compute
capability 9.0 or a parameter buffer of the wrong size (CUDA_ERROR_INVALID_VALUE), images that are neither PTX nor
a cubin (CUDA_ERROR_INVALID_IMAGE), unknown kernel names (CUDA_ERROR_NOT_FOUND). A kernel that touches unmapped or
misaligned memory returns CUDA_ERROR_ILLEGAL_ADDRESS / CUDA_ERROR_MISALIGNED_ADDRESS, and, as on a real context,
that error sticks: later calls on the context return it. Work runs when it is queued (one in-order stream).
"""
from __future__ import annotations

import ctypes
import re
import time
from typing import Any

from tiny_uop.device import CompileError
from tiny_uop.hcq import MAP_PRIVATE, PROT_READ, PROT_WRITE, FileIOInterface

from tiny_runtime_nv import cuda_api as cuda
from tiny_runtime_nv.cuda_api import ffi
from tiny_runtime_nv.mock import compiler
from tiny_runtime_nv.mock.compiler import ptx_of, ptxas_checker
from tiny_runtime_nv.ptx import GPUFault, Memory, PTXParseError, load_kernel

DEVICES = 4  # GPUs the mock machine has (multi-device tests shard over up to 3)
NAME = "NVIDIA H200 (MOCK+CUDA: PTX executor)"
ATTRS = {cuda.ATTR_COMPUTE_CAPABILITY_MAJOR: 9, cuda.ATTR_COMPUTE_CAPABILITY_MINOR: 0,
         cuda.ATTR_MAX_THREADS_PER_BLOCK: 1024, cuda.ATTR_MULTIPROCESSOR_COUNT: 132,
         cuda.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448}
MESSAGES = {0: "no error", 1: "invalid argument", 2: "out of memory", 3: "initialization error",
            101: "invalid device ordinal", 200: "device kernel image is invalid", 201: "invalid device context",
            218: "a PTX JIT compilation failed", 400: "invalid resource handle", 500: "named symbol not found",
            700: "an illegal memory access was encountered", 716: "misaligned address",
            719: "unspecified launch failure"}


def _CHECKER_REF() -> Any: return compiler._CHECKER


def _int(p: Any) -> int: return int(ffi.cast("uintptr_t", p))


class MockContext:
  """A context: its device and the sticky error of a faulted kernel (0: healthy)."""

  def __init__(self, dev: int):
    self.dev, self.error = dev, 0
    self.peers: set[int] = set()


class MockLibCUDA:
  """The mock library: one address space (device pointers are host addresses of real host memory)."""

  def __init__(self) -> None:
    self.initialized = False
    self.mem = Memory()
    self.allocs: dict[int, int] = {}  # device pointer -> size
    self.contexts: dict[int, MockContext] = {}
    self.modules: dict[int, dict[str, Any]] = {}
    self.functions: dict[int, tuple[Any, int]] = {}  # handle -> (kernel, dynamic shared limit)
    self.events: dict[int, float] = {}
    self.host: dict[int, Any] = {}
    self.current: int = 0
    self.next_handle = 0x1000
    self.launches = 0
    self._strings = {k: ffi.new("char[]", v.encode()) for k, v in MESSAGES.items()}
    self.primary: dict[int, int] = {}
    self.links: dict[int, dict[str, Any]] = {}

  def _handle(self) -> int:
    self.next_handle += 0x10
    return self.next_handle

  def _ctx(self) -> int:
    """0, or the error the current context can't get past (not initialized, no context, a sticky fault)."""
    if not self.initialized: return cuda.CUDA_ERROR_NOT_INITIALIZED
    if self.current not in self.contexts: return cuda.CUDA_ERROR_INVALID_CONTEXT
    return self.contexts[self.current].error

  # ***** init, devices, contexts *****
  def cuInit(self, flags: int) -> int:
    if flags != 0: return cuda.CUDA_ERROR_INVALID_VALUE
    self.initialized = True
    return 0

  def cuDriverGetVersion(self, v: Any) -> int:
    v[0] = 13000
    return 0

  def cuGetErrorString(self, res: int, p: Any) -> int:
    if res not in self._strings: return cuda.CUDA_ERROR_INVALID_VALUE
    p[0] = self._strings[res]
    return 0

  def cuDeviceGetCount(self, n: Any) -> int:
    if not self.initialized: return cuda.CUDA_ERROR_NOT_INITIALIZED
    n[0] = DEVICES
    return 0

  def cuDeviceGet(self, d: Any, ordinal: int) -> int:
    if not self.initialized: return cuda.CUDA_ERROR_NOT_INITIALIZED
    if not 0 <= ordinal < DEVICES: return cuda.CUDA_ERROR_INVALID_DEVICE
    d[0] = ordinal
    return 0

  def cuDeviceGetName(self, buf: Any, n: int, dev: int) -> int:
    if not 0 <= dev < DEVICES: return cuda.CUDA_ERROR_INVALID_DEVICE
    b = NAME.encode()[:n - 1] + b"\0"
    ffi.memmove(buf, b, len(b))
    return 0

  def cuDeviceGetAttribute(self, v: Any, attr: int, dev: int) -> int:
    if not 0 <= dev < DEVICES: return cuda.CUDA_ERROR_INVALID_DEVICE
    if attr not in ATTRS: return cuda.CUDA_ERROR_INVALID_VALUE
    v[0] = ATTRS[attr]
    return 0

  def cuDeviceTotalMem_v2(self, v: Any, dev: int) -> int:
    v[0] = 141 << 30
    return 0

  def cuCtxCreate_v2(self, p: Any, flags: int, dev: int) -> int:
    if not self.initialized: return cuda.CUDA_ERROR_NOT_INITIALIZED
    if not 0 <= dev < DEVICES: return cuda.CUDA_ERROR_INVALID_DEVICE
    h = self._handle()
    self.contexts[h] = MockContext(dev)
    self.current = h
    p[0] = ffi.cast("CUcontext", h)
    return 0

  def cuDevicePrimaryCtxRetain(self, p: Any, dev: int) -> int:
    if not self.initialized: return cuda.CUDA_ERROR_NOT_INITIALIZED
    if not 0 <= dev < DEVICES: return cuda.CUDA_ERROR_INVALID_DEVICE
    if dev not in self.primary:
      self.primary[dev] = h = self._handle()
      self.contexts[h] = MockContext(dev)
    p[0] = ffi.cast("CUcontext", self.primary[dev])
    return 0

  def cuCtxDestroy_v2(self, ctx: Any) -> int:
    if self.contexts.pop(_int(ctx), None) is None: return cuda.CUDA_ERROR_INVALID_CONTEXT
    return 0

  def cuCtxSetCurrent(self, ctx: Any) -> int:
    h = _int(ctx)
    if h and h not in self.contexts: return cuda.CUDA_ERROR_INVALID_CONTEXT
    self.current = h
    return 0

  def cuCtxSynchronize(self) -> int:
    if (chk := _CHECKER_REF()) is not None: chk.check()
    return self._ctx()

  def cuStreamSynchronize(self, stream: Any) -> int: return self._ctx()

  def cuCtxEnablePeerAccess(self, peer: Any, flags: int) -> int:
    if (e := self._ctx()): return e
    h = _int(peer)
    if h not in self.contexts: return cuda.CUDA_ERROR_INVALID_CONTEXT
    me = self.contexts[self.current]
    if h in me.peers: return cuda.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    me.peers.add(h)
    return 0

  # ***** memory *****
  def cuMemAlloc_v2(self, p: Any, size: int) -> int:
    if (e := self._ctx()): return e
    if size == 0: return cuda.CUDA_ERROR_INVALID_VALUE
    n = (size + 0xFFF) & ~0xFFF
    addr = FileIOInterface.anon_mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE)
    self.allocs[addr] = n
    self.mem.add(addr, n)
    p[0] = addr
    return 0

  def cuMemFree_v2(self, ptr: int) -> int:
    if (e := self._ctx()): return e
    if (n := self.allocs.pop(ptr, None)) is None: return cuda.CUDA_ERROR_INVALID_VALUE
    self.mem.remove(ptr)
    FileIOInterface().munmap(ptr, n)
    return 0

  def cuMemHostAlloc(self, pp: Any, size: int, flags: int) -> int:
    if (e := self._ctx()): return e
    buf = ffi.new("char[]", max(size, 1))
    self.host[_int(buf)] = buf
    pp[0] = buf
    return 0

  def cuMemFreeHost(self, p: Any) -> int:
    if self.host.pop(_int(p), None) is None: return cuda.CUDA_ERROR_INVALID_VALUE
    return 0

  def _dev_ok(self, ptr: int, size: int) -> bool:
    r = self.mem.find(ptr)
    return r is not None and ptr + size <= r[1]

  def cuMemcpyHtoDAsync_v2(self, dst: int, src: Any, n: int, stream: Any) -> int:
    if (e := self._ctx()): return e
    if not self._dev_ok(dst, n): return cuda.CUDA_ERROR_INVALID_VALUE
    ctypes.memmove(dst, _int(src), n)
    return 0

  def cuMemcpyDtoHAsync_v2(self, dst: Any, src: int, n: int, stream: Any) -> int:
    if (e := self._ctx()): return e
    if not self._dev_ok(src, n): return cuda.CUDA_ERROR_INVALID_VALUE
    ctypes.memmove(_int(dst), src, n)
    return 0

  def cuMemcpyDtoDAsync_v2(self, dst: int, src: int, n: int, stream: Any) -> int:
    if (e := self._ctx()): return e
    if not (self._dev_ok(dst, n) and self._dev_ok(src, n)): return cuda.CUDA_ERROR_INVALID_VALUE
    ctypes.memmove(dst, src, n)
    return 0

  def cuMemcpyPeerAsync(self, dst: int, dctx: Any, src: int, sctx: Any, n: int, stream: Any) -> int:
    if (e := self._ctx()): return e
    if _int(dctx) not in self.contexts or _int(sctx) not in self.contexts: return cuda.CUDA_ERROR_INVALID_CONTEXT
    return self.cuMemcpyDtoDAsync_v2(dst, src, n, stream)

  # ***** modules and launches *****
  def cuModuleLoadData(self, p: Any, image: Any) -> int:
    if (e := self._ctx()): return e
    head = bytes(ffi.buffer(image, 4))
    if head == b"\x7fELF":
      from tiny_runtime_nv.elf import ELF, EHDR
      hdr = EHDR.unpack_from(bytes(ffi.buffer(image, EHDR.size)))
      size = hdr[6] + hdr[11] * hdr[12]  # the section header table ends the cubin
      try: text = ptx_of(bytes(ffi.buffer(image, size)))
      except ValueError: return cuda.CUDA_ERROR_INVALID_IMAGE
      ELF(bytes(ffi.buffer(image, size)))
    else:
      raw = ffi.string(ffi.cast("char *", image))
      if b".entry" not in raw or b".version" not in raw: return cuda.CUDA_ERROR_INVALID_IMAGE
      text = raw.decode()
      if (chk := ptxas_checker()) is not None and (m := re.search(r"\.target\s+(sm_\w+)", text)):
        chk.submit(text, m.group(1))  # NVIDIA's ptxas assembles it in the background (mock/compiler.py)
    h = self._handle()
    self.modules[h] = {"ptx": text}
    p[0] = ffi.cast("CUmodule", h)
    return 0

  def cuModuleUnload(self, mod: Any) -> int:
    if self.modules.pop(_int(mod), None) is None: return cuda.CUDA_ERROR_INVALID_HANDLE
    return 0

  def cuModuleGetFunction(self, p: Any, mod: Any, name: Any) -> int:
    if (e := self._ctx()): return e
    m = self.modules.get(_int(mod))
    if m is None: return cuda.CUDA_ERROR_INVALID_HANDLE
    nm = (name if isinstance(name, bytes) else ffi.string(name)).decode()  # cffi callers pass bytes for char *
    try: k = load_kernel(m["ptx"], nm)
    except PTXParseError as ex:
      return cuda.CUDA_ERROR_NOT_FOUND if "no .entry" in str(ex) else cuda.CUDA_ERROR_INVALID_PTX
    h = self._handle()
    self.functions[h] = (k, 48 << 10)
    p[0] = ffi.cast("CUfunction", h)
    return 0

  def cuFuncSetAttribute(self, fn: Any, attr: int, value: int) -> int:
    h = _int(fn)
    if h not in self.functions: return cuda.CUDA_ERROR_INVALID_HANDLE
    if attr != cuda.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES or not 0 <= value <= ATTRS[97]:
      return cuda.CUDA_ERROR_INVALID_VALUE
    self.functions[h] = (self.functions[h][0], value)
    return 0

  def cuLaunchKernel(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: Any,
                     params: Any, extra: Any) -> int:
    if (e := self._ctx()): return e
    if (f := self.functions.get(_int(fn))) is None: return cuda.CUDA_ERROR_INVALID_HANDLE
    k, shared_limit = f
    if not (1 <= gx <= 0x7FFFFFFF and 1 <= gy <= 65535 and 1 <= gz <= 65535 and 1 <= bx <= 1024 and
            1 <= by <= 1024 and 1 <= bz <= 64 and bx * by * bz <= 1024):
      return cuda.CUDA_ERROR_INVALID_VALUE
    if shared > shared_limit or k.shared_size + shared > ATTRS[97]: return cuda.CUDA_ERROR_INVALID_VALUE
    if (buf := self._params(k, params, extra)) is None: return cuda.CUDA_ERROR_INVALID_VALUE
    self.launches += 1
    try: k.launch(self.mem, buf, (gx, gy, gz), (bx, by, bz), shared)
    except GPUFault as ex:
      err = cuda.CUDA_ERROR_MISALIGNED_ADDRESS if "misaligned" in str(ex) else cuda.CUDA_ERROR_ILLEGAL_ADDRESS
      self.contexts[self.current].error = err
      self.last_fault = str(ex)
      return err
    return 0

  @staticmethod
  def _params(k: Any, params: Any, extra: Any) -> bytes | None:
    """The parameter buffer from `extra` (BUFFER_POINTER/BUFFER_SIZE/END) or from `kernelParams` (a pointer per
    parameter); None when it doesn't match the kernel's parameters."""
    if extra != ffi.NULL:
      ptr, size, i = None, None, 0
      while (key := _int(extra[i])) != cuda.LAUNCH_PARAM_END:
        if key == cuda.LAUNCH_PARAM_BUFFER_POINTER: ptr = extra[i + 1]
        elif key == cuda.LAUNCH_PARAM_BUFFER_SIZE: size = ffi.cast("size_t *", extra[i + 1])[0]
        else: return None
        i += 2
      if ptr is None or size is None or size != k.param_size: return None
      return bytes(ffi.buffer(ptr, size))
    if params == ffi.NULL: return None if k.params else b""
    out = bytearray(max(k.param_size, 1))
    for j, p in enumerate(k.params): out[p.offset:p.offset + p.size] = ffi.buffer(params[j], p.size)
    return bytes(out)

  # ***** the JIT linker: PTX -> cubin, assembled by NVIDIA's ptxas as the driver's JIT would *****
  def cuLinkCreate_v2(self, n: int, options: Any, values: Any, p: Any) -> int:
    if (e := self._ctx()): return e
    target = None
    for i in range(n):
      if options[i] != cuda.JIT_TARGET: return cuda.CUDA_ERROR_INVALID_VALUE  # the mock knows CU_JIT_TARGET only
      target = _int(values[i])
    if target is None: target = 90
    if target not in (80, 86, 89, 90): return cuda.CUDA_ERROR_INVALID_VALUE
    h = self._handle()
    self.links[h] = {"target": target, "ptx": [], "out": None}
    p[0] = ffi.cast("CUlinkState", h)
    return 0

  def cuLinkAddData_v2(self, state: Any, typ: int, data: Any, size: int, name: Any, n: int, o: Any, v: Any) -> int:
    link = self.links.get(_int(state))
    if link is None: return cuda.CUDA_ERROR_INVALID_HANDLE
    if typ != cuda.JIT_INPUT_PTX or n: return cuda.CUDA_ERROR_INVALID_VALUE
    text = bytes(ffi.buffer(data, size)).rstrip(b"\0")
    if b".entry" not in text or b".version" not in text: return cuda.CUDA_ERROR_INVALID_PTX
    link["ptx"].append(text.decode())
    return 0

  def cuLinkComplete(self, state: Any, out: Any, size: Any) -> int:
    link = self.links.get(_int(state))
    if link is None: return cuda.CUDA_ERROR_INVALID_HANDLE
    if len(link["ptx"]) != 1: return cuda.CUDA_ERROR_INVALID_VALUE  # the mock links one module
    from tiny_codegen.compiler.ptx import PTXCompiler, find_ptxas
    if find_ptxas() is None: return cuda.CUDA_ERROR_INVALID_PTX
    src = re.sub(r"\.target\s+sm_\w+", f".target sm_{link['target']}", link["ptx"][0])
    try: cubin = PTXCompiler(f"sm_{link['target']}", use_ptxas=True).compile(src)
    except CompileError:  # ptxas rejected it: the driver's JIT reports an invalid PTX
      return cuda.CUDA_ERROR_INVALID_PTX
    link["out"] = ffi.new("char[]", cubin)
    out[0], size[0] = link["out"], len(cubin)
    return 0

  def cuLinkDestroy(self, state: Any) -> int:
    return 0 if self.links.pop(_int(state), None) is not None else cuda.CUDA_ERROR_INVALID_HANDLE

  # ***** events *****
  def cuEventCreate(self, p: Any, flags: int) -> int:
    if (e := self._ctx()): return e
    h = self._handle()
    self.events[h] = 0.0
    p[0] = ffi.cast("CUevent", h)
    return 0

  def cuEventRecord(self, ev: Any, stream: Any) -> int:
    if (e := self._ctx()): return e
    if _int(ev) not in self.events: return cuda.CUDA_ERROR_INVALID_HANDLE
    self.events[_int(ev)] = time.perf_counter()
    return 0

  def cuEventSynchronize(self, ev: Any) -> int:
    return cuda.CUDA_ERROR_INVALID_HANDLE if _int(ev) not in self.events else self._ctx()

  def cuEventElapsedTime(self, ms: Any, a: Any, b: Any) -> int:
    if _int(a) not in self.events or _int(b) not in self.events: return cuda.CUDA_ERROR_INVALID_HANDLE
    ms[0] = (self.events[_int(b)] - self.events[_int(a)]) * 1e3
    return 0

  def cuEventDestroy_v2(self, ev: Any) -> int:
    return 0 if self.events.pop(_int(ev), None) is not None else cuda.CUDA_ERROR_INVALID_HANDLE


_LIB: MockLibCUDA | None = None


def mock_libcuda() -> MockLibCUDA:
  """The process's mock libcuda (created on first use)."""
  global _LIB
  if _LIB is None: _LIB = MockLibCUDA()
  return _LIB
