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

import struct
from dataclasses import dataclass
from typing import Any, Sequence

from tiny_uop.device import BufferSpec, Compiled, LRUAllocator, Program
from tiny_uop.helpers import del_errors
from tiny_uop.target import Target

# the driver API (cuda.h subset, result codes, Driver) lives in cuda_api: the mock libcuda builds on it too
from tiny_runtime_nv.cuda_api import (ATTR_COMPUTE_CAPABILITY_MAJOR, ATTR_COMPUTE_CAPABILITY_MINOR,
                                      LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE, LAUNCH_PARAM_END,
                                      MEMHOSTALLOC_PORTABLE, CUDAError, Driver, ffi)


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

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    if getattr(self, "module", None) is None: return  # the load failed: nothing to unload
    with _errors("CUDAProgram.__del__ (cuModuleUnload)"): self.dev.drv.lib.cuModuleUnload(self.module)


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

