"""The ``CL`` device: any OpenCL 2.0 platform through cffi (`tiny_runtime_qcom.opencl`), e.g. PoCL on a CPU.

Buffers are `cl_mem` buffers; views are sub-buffers at offsets the device's base alignment
(`CL_DEVICE_MEM_BASE_ADDR_ALIGN`) allows, and copies made when the view is made elsewhere. Programs are
OpenCL C source (what `OpenCLRenderer` renders and `OpenCLCompiler` returns), built at load time for the first
device of the first platform; a failed build raises CompileError with the build log and the source. A kernel's image
params (`IMAGE=1`: the source's `/* image dataN HxW */` lines) are made at each launch: an RGBA float image of h x w
texels, filled from the buffer passed for that param (`clEnqueueCopyBufferToImage`) -- the buffer's floats in order,
4 a texel; outputs stay buffers. Launches are queued in order on one in-order queue; `wait=True` finishes the queue
and returns the seconds it took. A device without `cl_khr_fp16` gets `OpenCLHalfStorageRenderer` (half in memory,
half math in float rounded to half). The renderer's workgroup and local-memory limits are the device's own
(clGetDeviceInfo).
"""
from __future__ import annotations

import re
import time
from typing import Any

from tiny_uop.device import Allocator, BufferSpec, Compiled, CompileError, Program
from tiny_uop.helpers import del_errors

from tiny_runtime_qcom.opencl import CL_DEVICE_LOCAL_MEM_SIZE, CL_DEVICE_MAX_WORK_GROUP_SIZE, \
  CL_DEVICE_MAX_WORK_ITEM_SIZES, CL_BUFFER_CREATE_TYPE_REGION, CL_FLOAT, CL_INVALID_BUFFER_SIZE, \
  CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_MEM_OBJECT_IMAGE2D, CL_MEM_READ_ONLY, CL_MEM_READ_WRITE, CL_RGBA, \
  BuildError, CLError, Context, check, ffi, info_int

IMAGE_LINE = re.compile(r"^/\* image data(\d+) (\d+)x(\d+) \*/$", re.M)

__all__ = ["CLBuf", "CLAllocator", "CLProgram", "CLDevice", "CLError", "image_desc"]


def image_desc(h: int, w: int, row_pitch: int = 0) -> tuple[Any, Any]:
  """(cl_image_format*, cl_image_desc*) of an RGBA float32 2D image of h x w texels."""
  fmt = ffi.new("cl_image_format*", {"image_channel_order": CL_RGBA, "image_channel_data_type": CL_FLOAT})
  desc = ffi.new("cl_image_desc*", {"image_type": CL_MEM_OBJECT_IMAGE2D, "image_width": w, "image_height": h,
                                    "image_depth": 1, "image_array_size": 1, "image_row_pitch": row_pitch})
  return fmt, desc


class CLBuf:
  """A `cl_mem` of `nbytes`; a view's (`base` set) is released with it (the allocator frees only bases)."""
  __slots__ = ("mem", "nbytes", "base", "cl")

  def __init__(self, cl: Any, mem: Any, nbytes: int, base: CLBuf | None = None):
    self.cl, self.mem, self.nbytes, self.base = cl, mem, nbytes, base

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    if self.base is None: return
    with _errors("CLBuf.__del__ (clReleaseMemObject)"): self.cl.clReleaseMemObject(self.mem)

  def __repr__(self) -> str: return f"<CLBuf {self.nbytes} bytes>"


class CLAllocator(Allocator[CLBuf]):
  """`cl_mem` buffers on the device's context; copies are blocking."""

  def __init__(self, dev: CLDevice): self.dev = dev

  def _create(self, size: int) -> Any:
    err = ffi.new("cl_int*")
    mem = self.dev.cl.clCreateBuffer(self.dev.ctx.ctx, CL_MEM_READ_WRITE, max(size, 1), ffi.NULL, err)
    if err[0] in (CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_INVALID_BUFFER_SIZE):
      raise MemoryError(f"OpenCL can't allocate {size} bytes (error {err[0]})")
    check(err[0], f"clCreateBuffer({size})")
    return mem

  def _alloc(self, size: int, options: BufferSpec) -> CLBuf: return CLBuf(self.dev.cl, self._create(size), size)
  def _free(self, opaque: CLBuf, options: BufferSpec) -> None: self.dev.cl.clReleaseMemObject(opaque.mem)

  def _copyin(self, dest: CLBuf, src: memoryview) -> None:
    if src.nbytes == 0: return
    host = ffi.from_buffer(src)
    check(self.dev.cl.clEnqueueWriteBuffer(self.dev.ctx.queue, dest.mem, 1, 0, src.nbytes, host, 0, ffi.NULL,
                                           ffi.NULL), "clEnqueueWriteBuffer")

  def _copyout(self, dest: memoryview, src: CLBuf) -> None:
    if dest.nbytes == 0: return
    self.dev.synchronize()
    host = ffi.from_buffer(dest.cast("B"), require_writable=True)
    check(self.dev.cl.clEnqueueReadBuffer(self.dev.ctx.queue, src.mem, 1, 0, dest.nbytes, host, 0, ffi.NULL,
                                          ffi.NULL), "clEnqueueReadBuffer")

  def _transfer(self, dest: CLBuf, src: CLBuf, sz_: int, **kwargs: Any) -> None:
    check(self.dev.cl.clEnqueueCopyBuffer(self.dev.ctx.queue, src.mem, dest.mem, 0, 0, sz_, 0, ffi.NULL, ffi.NULL),
          "clEnqueueCopyBuffer")

  def _offset(self, buf: CLBuf, size: int, offset: int) -> CLBuf:
    """A view: a sub-buffer at offsets the device's base alignment allows; elsewhere (a kernel argument can't start
    mid-alignment in OpenCL) a copy of the bytes as they are now, which later writes to the base don't reach."""
    if offset < 0 or size < 0 or offset + size > buf.nbytes:
      raise ValueError(f"view of {size} bytes at offset {offset} is outside a CL buffer of {buf.nbytes} bytes")
    cl = self.dev.cl
    if offset % self.dev.base_align:
      mem = self._create(size)
      if size: check(cl.clEnqueueCopyBuffer(self.dev.ctx.queue, buf.mem, mem, offset, 0, size, 0, ffi.NULL,
                                            ffi.NULL), "clEnqueueCopyBuffer")
      return CLBuf(cl, mem, size, buf)
    err = ffi.new("cl_int*")
    region = ffi.new("cl_buffer_region*", {"origin": offset, "size": max(size, 1)})
    mem = cl.clCreateSubBuffer(buf.mem, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, region, err)
    check(err[0], f"clCreateSubBuffer(offset={offset}, size={size})")
    return CLBuf(cl, mem, size, buf)


class CLProgram(Program):
  """An OpenCL C kernel built for the device (see the module docstring for image params)."""

  def __init__(self, device: Compiled, name: str, lib: bytes, **kwargs: Any):
    super().__init__(device, name, lib)
    assert isinstance(device, CLDevice)
    self.dev, src = device, lib.decode()
    try: self.prg, self.kernel = device.ctx.build(src, name)
    except BuildError as e: raise CompileError(str(e)) from e
    sig = re.search(rf"__kernel void {re.escape(name)}\((.*?)\)\s*\{{", src, re.S)
    slots = [int(x) for x in re.findall(r"\bdata(\d+)\b", sig.group(1))] if sig else []
    shapes = {int(m.group(1)): (int(m.group(2)), int(m.group(3))) for m in IMAGE_LINE.finditer(src)}
    self.images = {i: shapes[slot] for i, slot in enumerate(slots) if slot in shapes}  # arg position -> (h, w)

  def _image(self, buf: CLBuf, hw: tuple[int, int]) -> Any:
    cl, err = self.dev.cl, ffi.new("cl_int*")
    h, w = hw
    if buf.nbytes < h * w * 16: raise ValueError(f"{self.name}: a {buf.nbytes}-byte buffer can't fill a {h}x{w} image")
    fmt, desc = image_desc(h, w)
    img = cl.clCreateImage(self.dev.ctx.ctx, CL_MEM_READ_ONLY, fmt, desc, ffi.NULL, err)
    check(err[0], f"clCreateImage({h}x{w})")
    origin, region = ffi.new("size_t[3]", [0, 0, 0]), ffi.new("size_t[3]", [w, h, 1])
    check(cl.clEnqueueCopyBufferToImage(self.dev.ctx.queue, buf.mem, img, 0, origin, region, 0, ffi.NULL, ffi.NULL),
          "clEnqueueCopyBufferToImage")
    return img

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    cl = self.dev.cl
    images = []
    arg = ffi.new("cl_mem*")
    for i, b in enumerate(bufs):
      arg[0] = b.mem
      if i in self.images:
        arg[0] = self._image(b, self.images[i])
        images.append(arg[0])
      check(cl.clSetKernelArg(self.kernel, i, ffi.sizeof("cl_mem"), arg), f"clSetKernelArg({i})")
    cv = ffi.new("cl_int*")
    for j, v in enumerate(vals):
      cv[0] = v
      check(cl.clSetKernelArg(self.kernel, len(bufs) + j, 4, cv), f"clSetKernelArg({len(bufs) + j})")
    lsz = tuple(local_size or (1, 1, 1))
    gsz = tuple(int(g) * int(x) for g, x in zip(global_size, lsz))
    st = time.perf_counter()
    check(cl.clEnqueueNDRangeKernel(self.dev.ctx.queue, self.kernel, len(gsz), ffi.NULL,
                                    ffi.new("size_t[]", list(gsz)), ffi.new("size_t[]", list(lsz)), 0, ffi.NULL,
                                    ffi.NULL), f"clEnqueueNDRangeKernel({self.name})")
    for img in images: cl.clReleaseMemObject(img)  # freed once the kernel that uses it is done
    if not wait: return None
    self.dev.synchronize()
    return time.perf_counter() - st

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    if getattr(self, "kernel", None) is None: return  # the build failed: nothing was made
    with _errors(f"CLProgram.__del__ ({getattr(self, 'name', '?')})"):
      self.dev.cl.clReleaseKernel(self.kernel)
      self.dev.cl.clReleaseProgram(self.prg)


class CLDevice(Compiled):
  """``CL``: the first device of the first OpenCL platform, with `OpenCLRenderer` (``IMAGE=1`` for images)."""

  def __init__(self, device: str = "CL"):
    self.ctx = ctx = Context()
    self.cl = ctx.cl
    self.base_align, self.extensions = ctx.base_align, ctx.extensions
    # the renderer's arch names the OpenCL device: loaded programs are cached per (renderer class, arch), so this
    # keeps them apart from NULL:OPENCL's (which compile the same source but launch nothing)
    self.device_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", ctx.name).strip("_") or "cl"
    from tiny_codegen.renderer.opencl import OpenCLHalfStorageRenderer, OpenCLRenderer
    ren = OpenCLRenderer if "cl_khr_fp16" in self.extensions else OpenCLHalfStorageRenderer  # half math in float
    super().__init__(device, CLAllocator(self), [ren], CLProgram, arch=self.device_name)
    # the optimizer sizes workgroups and shared memory by the device's own limits
    wg = info_int(self.cl, "clGetDeviceInfo", ctx.device, CL_DEVICE_MAX_WORK_GROUP_SIZE, "size_t")
    items = ffi.new("size_t[3]")
    check(self.cl.clGetDeviceInfo(ctx.device, CL_DEVICE_MAX_WORK_ITEM_SIZES, ffi.sizeof(items), items, ffi.NULL),
          "clGetDeviceInfo(CL_DEVICE_MAX_WORK_ITEM_SIZES)")
    lmem = info_int(self.cl, "clGetDeviceInfo", ctx.device, CL_DEVICE_LOCAL_MEM_SIZE, "cl_ulong")
    self.caps = {"max_workgroup_size": wg, "local_max": tuple(min(int(x), wg) for x in items), "shared_max": lmem}

  def select_renderer(self, name: str | None) -> Any:
    """The renderer, with this device's workgroup and local-memory limits as its capabilities."""
    r = super().select_renderer(name)
    for k, v in getattr(self, "caps", {}).items(): setattr(r, k, v)
    return r

  def synchronize(self) -> None: self.ctx.finish()
