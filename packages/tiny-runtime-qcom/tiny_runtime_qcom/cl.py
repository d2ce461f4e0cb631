"""The ``CL`` device: any OpenCL 2.0 platform through libOpenCL (ctypes), e.g. PoCL on a CPU.

The OpenCL implementation (`libcl`) is the system's libOpenCL (an ICD loader, or a vendor's library) when it offers a
platform, else PoCL from PyPI (`pip install pocl-binary-distribution`, a test dependency). That wheel's library exports
only the ICD entry points, so it is called as an ICD loader calls a vendor: `clIcdGetPlatformIDsKHR` (found with
`clGetExtensionFunctionAddress`) gives its platforms, and every OpenCL object starts with a pointer to the vendor's
dispatch table (`struct _cl_icd_dispatch` of Khronos `CL/cl_icd.h`, whose member order is the ICD ABI: `ICD_ORDER`).

Buffers are `cl_mem` buffers; views are sub-buffers at offsets the device's base alignment
(`CL_DEVICE_MEM_BASE_ADDR_ALIGN`) allows, and copies made when the view is made elsewhere. Programs are
OpenCL C source (what `OpenCLRenderer` renders and `OpenCLCompiler` returns), built at load time for the first
device of the first platform. A kernel's image params (`IMAGE=1`: the source's `/* image dataN HxW */` lines) are
made at each launch: an RGBA float image of h x w texels, filled from the buffer passed for that param
(`clEnqueueCopyBufferToImage`) -- the buffer's floats in order, 4 a texel; outputs stay buffers. Launches are
queued in order on one in-order queue; `wait=True` finishes the queue and returns the seconds it took. A device
without `cl_khr_fp16` gets `OpenCLHalfStorageRenderer` (half in memory, half math in float rounded to half).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import re
import time
from pathlib import Path
from typing import Any

from tiny_uop.device import Allocator, BufferSpec, Compiled, CompileError, Program

vp, sz, u32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32
i32p = ctypes.POINTER(ctypes.c_int32)
CL_DEVICE_TYPE_ALL, CL_MEM_READ_WRITE, CL_MEM_READ_ONLY = 0xFFFFFFFF, 1 << 0, 1 << 2
CL_PROGRAM_BUILD_LOG, CL_DEVICE_MEM_BASE_ADDR_ALIGN, CL_BUFFER_CREATE_TYPE_REGION = 0x1183, 0x1019, 0x1220
CL_DEVICE_NAME, CL_DEVICE_EXTENSIONS = 0x102B, 0x1030
CL_DEVICE_MAX_WORK_GROUP_SIZE, CL_DEVICE_MAX_WORK_ITEM_SIZES, CL_DEVICE_LOCAL_MEM_SIZE = 0x1004, 0x1005, 0x1023
CL_RGBA, CL_FLOAT, CL_MEM_OBJECT_IMAGE2D = 0x10B5, 0x10DE, 0x10F1
IMAGE_LINE = re.compile(r"^/\* image data(\d+) (\d+)x(\d+) \*/$", re.M)


class ImageFormat(ctypes.Structure):
  _fields_ = [("order", u32), ("type", u32)]


class ImageDesc(ctypes.Structure):
  _fields_ = [("type", u32), ("width", sz), ("height", sz), ("depth", sz), ("array_size", sz), ("row_pitch", sz),
              ("slice_pitch", sz), ("num_mip_levels", u32), ("num_samples", u32), ("buffer", vp)]


class Region(ctypes.Structure):
  _fields_ = [("origin", sz), ("size", sz)]


class CLError(RuntimeError):
  """An OpenCL call failed; the message names the call and the error code."""


def check(code: int, what: str) -> None:
  """Raise CLError naming `what` when an OpenCL status `code` isn't CL_SUCCESS."""
  if code != 0: raise CLError(f"{what} failed with OpenCL error {code}")


u64 = ctypes.c_uint64
# name: (restype, argtypes), as declared in Khronos CL/cl.h
SIGS: dict[str, tuple[Any, list[Any]]] = {
  "clGetPlatformIDs": (ctypes.c_int32, [u32, vp, ctypes.POINTER(u32)]),
  "clGetDeviceIDs": (ctypes.c_int32, [vp, u64, u32, ctypes.POINTER(vp), vp]),
  "clGetDeviceInfo": (ctypes.c_int32, [vp, u32, sz, vp, vp]),
  "clCreateContext": (vp, [vp, u32, ctypes.POINTER(vp), vp, vp, i32p]),
  "clCreateCommandQueue": (vp, [vp, vp, u64, i32p]),
  "clCreateProgramWithSource": (vp, [vp, u32, ctypes.POINTER(ctypes.c_char_p), vp, i32p]),
  "clBuildProgram": (ctypes.c_int32, [vp, u32, ctypes.POINTER(vp), ctypes.c_char_p, vp, vp]),
  "clGetProgramBuildInfo": (ctypes.c_int32, [vp, vp, u32, sz, vp, vp]),
  "clCreateKernel": (vp, [vp, ctypes.c_char_p, i32p]),
  "clCreateBuffer": (vp, [vp, u64, sz, vp, i32p]),
  "clCreateSubBuffer": (vp, [vp, u64, u32, vp, i32p]),
  "clCreateImage": (vp, [vp, u64, ctypes.POINTER(ImageFormat), ctypes.POINTER(ImageDesc), vp, i32p]),
  "clEnqueueCopyBufferToImage": (ctypes.c_int32, [vp, vp, vp, sz, vp, vp, u32, vp, vp]),
  "clSetKernelArg": (ctypes.c_int32, [vp, u32, sz, vp]),
  "clEnqueueNDRangeKernel": (ctypes.c_int32, [vp, vp, u32, vp, vp, vp, u32, vp, vp]),
  "clEnqueueReadBuffer": (ctypes.c_int32, [vp, vp, u32, sz, sz, vp, u32, vp, vp]),
  "clEnqueueReadImage": (ctypes.c_int32, [vp, vp, u32, vp, vp, sz, sz, vp, u32, vp, vp]),
  "clEnqueueWriteBuffer": (ctypes.c_int32, [vp, vp, u32, sz, sz, vp, u32, vp, vp]),
  "clEnqueueCopyBuffer": (ctypes.c_int32, [vp, vp, vp, sz, sz, sz, u32, vp, vp]),
  "clFinish": (ctypes.c_int32, [vp]),
  "clReleaseMemObject": (ctypes.c_int32, [vp]),
  "clReleaseKernel": (ctypes.c_int32, [vp]),
  "clReleaseProgram": (ctypes.c_int32, [vp]),
}
# struct _cl_icd_dispatch of Khronos CL/cl_icd.h: its members in order (the ICD ABI), up to clCreateImage
ICD_ORDER = (
  "clGetPlatformIDs", "clGetPlatformInfo", "clGetDeviceIDs", "clGetDeviceInfo", "clCreateContext",
  "clCreateContextFromType", "clRetainContext", "clReleaseContext", "clGetContextInfo", "clCreateCommandQueue",
  "clRetainCommandQueue", "clReleaseCommandQueue", "clGetCommandQueueInfo", "clSetCommandQueueProperty",
  "clCreateBuffer", "clCreateImage2D", "clCreateImage3D", "clRetainMemObject", "clReleaseMemObject",
  "clGetSupportedImageFormats", "clGetMemObjectInfo", "clGetImageInfo", "clCreateSampler", "clRetainSampler",
  "clReleaseSampler", "clGetSamplerInfo", "clCreateProgramWithSource", "clCreateProgramWithBinary", "clRetainProgram",
  "clReleaseProgram", "clBuildProgram", "clUnloadCompiler", "clGetProgramInfo", "clGetProgramBuildInfo",
  "clCreateKernel", "clCreateKernelsInProgram", "clRetainKernel", "clReleaseKernel", "clSetKernelArg",
  "clGetKernelInfo", "clGetKernelWorkGroupInfo", "clWaitForEvents", "clGetEventInfo", "clRetainEvent",
  "clReleaseEvent", "clGetEventProfilingInfo", "clFlush", "clFinish", "clEnqueueReadBuffer", "clEnqueueWriteBuffer",
  "clEnqueueCopyBuffer", "clEnqueueReadImage", "clEnqueueWriteImage", "clEnqueueCopyImage",
  "clEnqueueCopyImageToBuffer", "clEnqueueCopyBufferToImage", "clEnqueueMapBuffer", "clEnqueueMapImage",
  "clEnqueueUnmapMemObject", "clEnqueueNDRangeKernel", "clEnqueueTask", "clEnqueueNativeKernel", "clEnqueueMarker",
  "clEnqueueWaitForEvents", "clEnqueueBarrier", "clGetExtensionFunctionAddress", "clCreateFromGLBuffer",
  "clCreateFromGLTexture2D", "clCreateFromGLTexture3D", "clCreateFromGLRenderbuffer", "clGetGLObjectInfo",
  "clGetGLTextureInfo", "clEnqueueAcquireGLObjects", "clEnqueueReleaseGLObjects", "clGetGLContextInfoKHR",
  "clGetDeviceIDsFromD3D10KHR", "clCreateFromD3D10BufferKHR", "clCreateFromD3D10Texture2DKHR",
  "clCreateFromD3D10Texture3DKHR", "clEnqueueAcquireD3D10ObjectsKHR", "clEnqueueReleaseD3D10ObjectsKHR",
  "clSetEventCallback", "clCreateSubBuffer", "clSetMemObjectDestructorCallback", "clCreateUserEvent",
  "clSetUserEventStatus", "clEnqueueReadBufferRect", "clEnqueueWriteBufferRect", "clEnqueueCopyBufferRect",
  "clCreateSubDevicesEXT", "clRetainDeviceEXT", "clReleaseDeviceEXT", "clCreateEventFromGLsyncKHR",
  "clCreateSubDevices", "clRetainDevice", "clReleaseDevice", "clCreateImage",
)


def pypi_pocl() -> str | None:
  """The PoCL library of the `pocl-binary-distribution` wheel (installed as `pyopencl/.libs/`, named by the
  `pocl.icd` file beside it), or None where that wheel isn't installed."""
  spec = importlib.util.find_spec("pocl_binary_distribution")
  if spec is None or spec.origin is None: return None
  libs = Path(spec.origin).parent.parent / "pyopencl" / ".libs"
  icd = libs / "pocl.icd"
  if not icd.is_file(): return None
  lib = libs / icd.read_text().strip()
  return str(lib) if lib.is_file() else None


class ICD:
  """An OpenCL vendor library (an ICD) called through its dispatch table, with the same attributes as a loaded
  libOpenCL (`cl.clGetPlatformIDs(...)`); its clGetPlatformIDs lists the vendor's platforms."""

  def __init__(self, path: str):
    self.path, self.lib = path, ctypes.CDLL(path)
    gefa = self.lib.clGetExtensionFunctionAddress
    gefa.restype, gefa.argtypes = vp, [ctypes.c_char_p]
    if not (fn := gefa(b"clIcdGetPlatformIDsKHR")):
      raise OSError(f"{path} is not an OpenCL ICD: it has no clIcdGetPlatformIDsKHR")
    get = ctypes.CFUNCTYPE(ctypes.c_int32, u32, ctypes.POINTER(vp), ctypes.POINTER(u32))(fn)
    n = u32()
    check(get(0, None, ctypes.byref(n)), f"clIcdGetPlatformIDsKHR of {path}")
    if n.value == 0: raise OSError(f"the OpenCL ICD {path} offers no platform")
    plats = (vp * n.value)()
    check(get(n.value, plats, None), f"clIcdGetPlatformIDsKHR of {path}")
    self.table = ctypes.cast(vp(plats[0]), ctypes.POINTER(ctypes.POINTER(vp)))[0]  # the first member of any object
    for name, (res, args) in SIGS.items():
      if not (addr := self.table[ICD_ORDER.index(name)]): raise OSError(f"the OpenCL ICD {path} has no {name}")
      setattr(self, name, ctypes.CFUNCTYPE(res, *args)(addr))


def _platforms(cl: Any) -> int:
  n = u32()
  code = cl.clGetPlatformIDs(0, None, ctypes.byref(n))
  if code == -1001: return 0  # CL_PLATFORM_NOT_FOUND_KHR: an ICD loader with no vendor installed
  check(code, "clGetPlatformIDs")
  return n.value


@functools.cache
def libcl() -> Any:
  """The OpenCL implementation, with the signatures this device uses: the system's libOpenCL if it offers a platform,
  else PyPI's PoCL through its dispatch table (`ICD`); OSError saying what was tried when there is none."""
  tried = []
  if (name := ctypes.util.find_library("OpenCL")) is not None:
    cl = ctypes.CDLL(name)
    for fn, (res, args) in SIGS.items():
      f = getattr(cl, fn)
      f.restype, f.argtypes = res, args
    if _platforms(cl): return cl
    tried.append(f"{name}: no OpenCL platform installed")
  else: tried.append("libOpenCL: not installed (no ICD loader)")
  if (pocl := pypi_pocl()) is not None: return ICD(pocl)
  tried.append("PoCL from PyPI: not installed")
  raise OSError(f"no OpenCL implementation ({'; '.join(tried)}): pip install pocl-binary-distribution, or "
                "apt-get install ocl-icd-libopencl1 pocl-opencl-icd")


class CLBuf:
  """A `cl_mem` of `nbytes`; a view's (`base` set) is released with it (the allocator frees only bases)."""
  __slots__ = ("mem", "nbytes", "base")

  def __init__(self, mem: Any, nbytes: int, base: CLBuf | None = None):
    self.mem, self.nbytes, self.base = mem, nbytes, base

  def __del__(self) -> None:
    if self.base is None: return
    try: libcl().clReleaseMemObject(self.mem)
    except Exception:  # noqa: BLE001,S110 -- interpreter shutdown: the driver may be gone already
      pass

  def __repr__(self) -> str: return f"<CLBuf {self.nbytes} bytes>"


class CLAllocator(Allocator[CLBuf]):
  """`cl_mem` buffers on the device's context; copies are blocking."""

  def __init__(self, dev: CLDevice): self.dev = dev

  def _alloc(self, size: int, options: BufferSpec) -> CLBuf:
    err = ctypes.c_int32()
    mem = libcl().clCreateBuffer(self.dev.ctx, CL_MEM_READ_WRITE, max(size, 1), None, ctypes.byref(err))
    if err.value == -4 or err.value == -61: raise MemoryError(f"OpenCL can't allocate {size} bytes (error {err.value})")
    check(err.value, f"clCreateBuffer({size})")
    return CLBuf(vp(mem), size)

  def _free(self, opaque: CLBuf, options: BufferSpec) -> None: libcl().clReleaseMemObject(opaque.mem)

  def _copyin(self, dest: CLBuf, src: memoryview) -> None:
    if src.nbytes == 0: return
    host = (ctypes.c_char * src.nbytes).from_buffer_copy(src) if src.readonly else \
      (ctypes.c_char * src.nbytes).from_buffer(src.cast("B"))
    check(libcl().clEnqueueWriteBuffer(self.dev.queue, dest.mem, 1, 0, src.nbytes, host, 0, None, None),
          "clEnqueueWriteBuffer")

  def _copyout(self, dest: memoryview, src: CLBuf) -> None:
    if dest.nbytes == 0: return
    self.dev.synchronize()
    host = (ctypes.c_char * dest.nbytes).from_buffer(dest.cast("B"))
    check(libcl().clEnqueueReadBuffer(self.dev.queue, src.mem, 1, 0, dest.nbytes, host, 0, None, None),
          "clEnqueueReadBuffer")

  def _transfer(self, dest: CLBuf, src: CLBuf, sz_: int, **kwargs: Any) -> None:
    check(libcl().clEnqueueCopyBuffer(self.dev.queue, src.mem, dest.mem, 0, 0, sz_, 0, None, None),
          "clEnqueueCopyBuffer")

  def _offset(self, buf: CLBuf, size: int, offset: int) -> CLBuf:
    """A view: a sub-buffer at offsets the device's base alignment allows; elsewhere (a kernel argument can't start
    mid-alignment in OpenCL) a copy of the bytes as they are now, which later writes to the base don't reach."""
    if offset < 0 or size < 0 or offset + size > buf.nbytes:
      raise ValueError(f"view of {size} bytes at offset {offset} is outside a CL buffer of {buf.nbytes} bytes")
    err = ctypes.c_int32()
    if offset % self.dev.base_align:
      mem = vp(libcl().clCreateBuffer(self.dev.ctx, CL_MEM_READ_WRITE, max(size, 1), None, ctypes.byref(err)))
      check(err.value, f"clCreateBuffer({size})")
      if size: check(libcl().clEnqueueCopyBuffer(self.dev.queue, buf.mem, mem, offset, 0, size, 0, None, None),
                     "clEnqueueCopyBuffer")
      return CLBuf(mem, size, buf)
    region = Region(offset, max(size, 1))
    mem = libcl().clCreateSubBuffer(buf.mem, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, ctypes.byref(region),
                                    ctypes.byref(err))
    check(err.value, f"clCreateSubBuffer(offset={offset}, size={size})")
    return CLBuf(vp(mem), size, buf)


class CLProgram(Program):
  """An OpenCL C kernel built for the device (see the module docstring for image params)."""

  def __init__(self, device: Compiled, name: str, lib: bytes, **kwargs: Any):
    super().__init__(device, name, lib)
    assert isinstance(device, CLDevice)
    self.dev = device
    cl, err, src = libcl(), ctypes.c_int32(), lib.decode()
    s = ctypes.c_char_p(lib)
    self.prg = vp(cl.clCreateProgramWithSource(device.ctx, 1, ctypes.byref(s), None, ctypes.byref(err)))
    check(err.value, "clCreateProgramWithSource")
    if cl.clBuildProgram(self.prg, 1, ctypes.byref(device.dev), b"-cl-std=CL2.0 -w", None, None) != 0:
      log = ctypes.create_string_buffer(1 << 16)
      cl.clGetProgramBuildInfo(self.prg, device.dev, CL_PROGRAM_BUILD_LOG, len(log), log, None)
      raise CompileError(f"OpenCL build of {name} failed:\n{log.value.decode(errors='replace')}\n--- source ---\n{src}")
    self.kernel = vp(cl.clCreateKernel(self.prg, name.encode(), ctypes.byref(err)))
    check(err.value, f"clCreateKernel({name})")
    sig = re.search(rf"__kernel void {re.escape(name)}\((.*?)\)\s*\{{", src, re.S)
    slots = [int(x) for x in re.findall(r"\bdata(\d+)\b", sig.group(1))] if sig else []
    shapes = {int(m.group(1)): (int(m.group(2)), int(m.group(3))) for m in IMAGE_LINE.finditer(src)}
    self.images = {i: shapes[slot] for i, slot in enumerate(slots) if slot in shapes}  # arg position -> (h, w)

  def _image(self, buf: CLBuf, hw: tuple[int, int]) -> Any:
    cl, err = libcl(), ctypes.c_int32()
    h, w = hw
    if buf.nbytes < h * w * 16: raise ValueError(f"{self.name}: a {buf.nbytes}-byte buffer can't fill a {h}x{w} image")
    desc = ImageDesc(CL_MEM_OBJECT_IMAGE2D, w, h, 1, 1, 0, 0, 0, 0, None)
    img = vp(cl.clCreateImage(self.dev.ctx, CL_MEM_READ_ONLY, ctypes.byref(ImageFormat(CL_RGBA, CL_FLOAT)),
                              ctypes.byref(desc), None, ctypes.byref(err)))
    check(err.value, f"clCreateImage({h}x{w})")
    check(cl.clEnqueueCopyBufferToImage(self.dev.queue, buf.mem, img, 0, (sz * 3)(0, 0, 0), (sz * 3)(w, h, 1), 0,
                                        None, None), "clEnqueueCopyBufferToImage")
    return img

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    cl = libcl()
    images = []
    for i, b in enumerate(bufs):
      mem = b.mem
      if i in self.images: images.append(mem := self._image(b, self.images[i]))
      check(cl.clSetKernelArg(self.kernel, i, ctypes.sizeof(vp), ctypes.byref(mem)), f"clSetKernelArg({i})")
    for j, v in enumerate(vals):
      cv = ctypes.c_int32(v)
      check(cl.clSetKernelArg(self.kernel, len(bufs) + j, 4, ctypes.byref(cv)), f"clSetKernelArg({len(bufs) + j})")
    lsz = tuple(local_size or (1, 1, 1))
    gsz = tuple(int(g) * int(x) for g, x in zip(global_size, lsz))
    st = time.perf_counter()
    check(cl.clEnqueueNDRangeKernel(self.dev.queue, self.kernel, len(gsz), None, (sz * len(gsz))(*gsz),
                                    (sz * len(lsz))(*lsz), 0, None, None), f"clEnqueueNDRangeKernel({self.name})")
    for img in images: cl.clReleaseMemObject(img)  # freed once the kernel that uses it is done
    if not wait: return None
    self.dev.synchronize()
    return time.perf_counter() - st

  def __del__(self) -> None:
    try:
      libcl().clReleaseKernel(self.kernel)
      libcl().clReleaseProgram(self.prg)
    except Exception:  # noqa: BLE001,S110 -- interpreter shutdown: the driver may be gone already
      pass


class CLDevice(Compiled):
  """``CL``: the first device of the first OpenCL platform, with `OpenCLRenderer` (``IMAGE=1`` for images)."""

  def __init__(self, device: str = "CL"):
    cl = libcl()
    n = u32()
    check(cl.clGetPlatformIDs(0, None, ctypes.byref(n)), "clGetPlatformIDs")
    if n.value == 0: raise RuntimeError("no OpenCL platform installed (pip install pocl-binary-distribution)")
    plats = (vp * n.value)()
    check(cl.clGetPlatformIDs(n.value, plats, None), "clGetPlatformIDs")
    self.dev = vp()
    check(cl.clGetDeviceIDs(vp(plats[0]), CL_DEVICE_TYPE_ALL, 1, ctypes.byref(self.dev), None), "clGetDeviceIDs")
    err = ctypes.c_int32()
    self.ctx = vp(cl.clCreateContext(None, 1, ctypes.byref(self.dev), None, None, ctypes.byref(err)))
    check(err.value, "clCreateContext")
    self.queue = vp(cl.clCreateCommandQueue(self.ctx, self.dev, 0, ctypes.byref(err)))
    check(err.value, "clCreateCommandQueue")
    bits = u32()
    cl.clGetDeviceInfo(self.dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, 4, ctypes.byref(bits), None)
    self.base_align = max(1, bits.value // 8)
    name = ctypes.create_string_buffer(256)
    cl.clGetDeviceInfo(self.dev, CL_DEVICE_NAME, len(name), name, None)
    # the renderer's arch names the OpenCL device: loaded programs are cached per (renderer class, arch), so this
    # keeps them apart from NULL:OPENCL's (which compile the same source but launch nothing)
    self.device_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.value.decode(errors="replace")).strip("_") or "cl"
    ext = ctypes.create_string_buffer(1 << 14)
    cl.clGetDeviceInfo(self.dev, CL_DEVICE_EXTENSIONS, len(ext), ext, None)
    self.extensions = set(ext.value.decode(errors="replace").split())
    from tiny_codegen.renderer.opencl import OpenCLHalfStorageRenderer, OpenCLRenderer
    ren = OpenCLRenderer if "cl_khr_fp16" in self.extensions else OpenCLHalfStorageRenderer  # half math in float
    super().__init__(device, CLAllocator(self), [ren], CLProgram, arch=self.device_name)
    # the optimizer sizes workgroups and shared memory by the device's own limits
    wg, items, lmem = sz(), (sz * 3)(), ctypes.c_uint64()
    check(cl.clGetDeviceInfo(self.dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, ctypes.sizeof(wg), ctypes.byref(wg), None),
          "clGetDeviceInfo(CL_DEVICE_MAX_WORK_GROUP_SIZE)")
    check(cl.clGetDeviceInfo(self.dev, CL_DEVICE_MAX_WORK_ITEM_SIZES, ctypes.sizeof(items), items, None),
          "clGetDeviceInfo(CL_DEVICE_MAX_WORK_ITEM_SIZES)")
    check(cl.clGetDeviceInfo(self.dev, CL_DEVICE_LOCAL_MEM_SIZE, 8, ctypes.byref(lmem), None),
          "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)")
    self.caps = {"max_workgroup_size": int(wg.value), "local_max": tuple(min(int(x), int(wg.value)) for x in items),
                 "shared_max": int(lmem.value)}

  def select_renderer(self, name: str | None) -> Any:
    """The renderer, with this device's workgroup and local-memory limits as its capabilities."""
    r = super().select_renderer(name)
    for k, v in getattr(self, "caps", {}).items(): setattr(r, k, v)
    return r

  def synchronize(self) -> None: check(libcl().clFinish(self.queue), "clFinish")
