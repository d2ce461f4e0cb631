"""Test helper: run an OpenCL C ProgramSpec on numpy arrays through libOpenCL (PoCL on CPU) with ctypes.

`available()` says why not when there is no OpenCL platform; `run(spec, bufs, vals)` launches
`spec.global_size` work-groups of `spec.local_size` work-items and copies every buffer back into `bufs`. Params the
kernel declares as images (`dtypes.imagef((h, w, 4))`, IMAGE=1) are passed as RGBA float images made from the
arrays' floats in order (h x w texels).
Loaded in tests with importlib (pytest runs in importlib mode).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import numpy as np

CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_MEM_READ_WRITE, CL_MEM_COPY_HOST_PTR = 1 << 0, 1 << 5
CL_PROGRAM_BUILD_LOG, CL_DEVICE_EXTENSIONS = 0x1183, 0x1030
vp, sz = ctypes.c_void_p, ctypes.c_size_t


CL_RGBA, CL_FLOAT, CL_MEM_OBJECT_IMAGE2D = 0x10B5, 0x10DE, 0x10F1


class ImageFormat(ctypes.Structure):
  _fields_ = [("order", ctypes.c_uint32), ("type", ctypes.c_uint32)]


class ImageDesc(ctypes.Structure):
  _fields_ = [("type", ctypes.c_uint32), ("width", sz), ("height", sz), ("depth", sz), ("array_size", sz),
              ("row_pitch", sz), ("slice_pitch", sz), ("num_mip_levels", ctypes.c_uint32),
              ("num_samples", ctypes.c_uint32), ("buffer", vp)]


class CLError(RuntimeError):
  """An OpenCL call failed; carries the error code (and the build log for builds)."""


def _check(code: int, what: str) -> None:
  if code != 0: raise CLError(f"{what} failed with OpenCL error {code}")


@functools.cache
def _lib() -> Any:
  name = ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"
  cl = ctypes.CDLL(name)
  u32, i32p, u64 = ctypes.c_uint32, ctypes.POINTER(ctypes.c_int32), ctypes.c_uint64
  sigs: dict[str, tuple[Any, list[Any]]] = {
    "clGetPlatformIDs": (ctypes.c_int32, [u32, vp, ctypes.POINTER(u32)]),
    "clGetDeviceIDs": (ctypes.c_int32, [vp, u64, u32, ctypes.POINTER(vp), vp]),
    "clCreateContext": (vp, [vp, u32, ctypes.POINTER(vp), vp, vp, i32p]),
    "clCreateCommandQueue": (vp, [vp, vp, u64, i32p]),
    "clCreateProgramWithSource": (vp, [vp, u32, ctypes.POINTER(ctypes.c_char_p), vp, i32p]),
    "clBuildProgram": (ctypes.c_int32, [vp, u32, ctypes.POINTER(vp), ctypes.c_char_p, vp, vp]),
    "clGetProgramBuildInfo": (ctypes.c_int32, [vp, vp, u32, sz, vp, vp]),
    "clCreateKernel": (vp, [vp, ctypes.c_char_p, i32p]),
    "clCreateBuffer": (vp, [vp, u64, sz, vp, i32p]),
    "clSetKernelArg": (ctypes.c_int32, [vp, u32, sz, vp]),
    "clEnqueueNDRangeKernel": (ctypes.c_int32, [vp, vp, u32, vp, vp, vp, u32, vp, vp]),
    "clEnqueueReadBuffer": (ctypes.c_int32, [vp, vp, u32, sz, sz, vp, u32, vp, vp]),
    "clFinish": (ctypes.c_int32, [vp]),
    "clGetDeviceInfo": (ctypes.c_int32, [vp, u32, sz, vp, vp]),
    "clCreateImage": (vp, [vp, u64, ctypes.POINTER(ImageFormat), ctypes.POINTER(ImageDesc), vp, i32p]),
    "clEnqueueReadImage": (ctypes.c_int32, [vp, vp, u32, vp, vp, sz, sz, vp, u32, vp, vp]),
    "clReleaseMemObject": (ctypes.c_int32, [vp]),
  }
  for fn, (res, args) in sigs.items():
    f = getattr(cl, fn)
    f.restype, f.argtypes = res, args
  return cl


@functools.cache
def _context() -> tuple[Any, Any, Any]:
  cl = _lib()
  n = ctypes.c_uint32()
  _check(cl.clGetPlatformIDs(0, None, ctypes.byref(n)), "clGetPlatformIDs")
  if n.value == 0: raise CLError("no OpenCL platform (install pocl-opencl-icd)")
  plats = (vp * n.value)()
  _check(cl.clGetPlatformIDs(n.value, plats, None), "clGetPlatformIDs")
  dev = vp()
  _check(cl.clGetDeviceIDs(vp(plats[0]), CL_DEVICE_TYPE_ALL, 1, ctypes.byref(dev), None), "clGetDeviceIDs")
  err = ctypes.c_int32()
  ctx = cl.clCreateContext(None, 1, ctypes.byref(dev), None, None, ctypes.byref(err))
  _check(err.value, "clCreateContext")
  q = cl.clCreateCommandQueue(vp(ctx), dev, 0, ctypes.byref(err))
  _check(err.value, "clCreateCommandQueue")
  return vp(ctx), dev, vp(q)


def extensions() -> str:
  """The device's CL_DEVICE_EXTENSIONS string ("cl_khr_fp16 cl_khr_fp64 ...")."""
  cl, (_, dev, _) = _lib(), _context()
  buf = ctypes.create_string_buffer(1 << 14)
  cl.clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, len(buf), buf, None)
  return buf.value.decode()


def available() -> str | None:
  """None when an OpenCL device can run kernels, else the reason."""
  try: _context()
  except (OSError, CLError) as e: return f"no OpenCL runtime: {e}"
  return None


def build(src: str, name: str) -> Any:
  """The kernel `name` of OpenCL C `src`, built for the first device; CLError with the build log on failure."""
  cl, (ctx, dev, _) = _lib(), _context()
  err = ctypes.c_int32()
  s = ctypes.c_char_p(src.encode())
  prg = cl.clCreateProgramWithSource(ctx, 1, ctypes.byref(s), None, ctypes.byref(err))
  _check(err.value, "clCreateProgramWithSource")
  if cl.clBuildProgram(prg, 1, ctypes.byref(dev), b"-cl-std=CL2.0", None, None) != 0:
    log = ctypes.create_string_buffer(1 << 16)
    cl.clGetProgramBuildInfo(prg, dev, CL_PROGRAM_BUILD_LOG, len(log), log, None)
    raise CLError(f"clBuildProgram failed:\n{log.value.decode(errors='replace')}\n--- source ---\n{src}")
  k = cl.clCreateKernel(prg, name.encode(), ctypes.byref(err))
  _check(err.value, f"clCreateKernel({name})")
  return vp(k)


def image_shapes(spec: Any, bufs: list[np.ndarray]) -> dict[int, tuple[int, ...]]:
  """PARAM slot -> (height, width, 4) of the params passed as images: those the lowered kernel declares as image
  params (spec.uops), and float32 arrays shaped (height, width, 4) of hand-built image programs."""
  out = {slot: tuple(bufs[slot].shape) for slot in spec.globals
         if bufs[slot].ndim == 3 and bufs[slot].shape[2] == 4 and bufs[slot].dtype == np.float32}
  for u in getattr(spec, "uops", None) or ():
    if u.op.name == "PARAM" and type(u.dtype).__name__ == "ImageDType": out[u.arg] = tuple(u.dtype.shape)
  return out


def run(spec: Any, bufs: list[np.ndarray], vals: tuple[int, ...] = ()) -> None:
  """Launch `spec` (OpenCL source in spec.src) on `bufs` (by PARAM slot) and `vals` (by spec.vars); in place."""
  cl, (ctx, _, q) = _lib(), _context()
  k = build(spec.src, spec.name)
  err = ctypes.c_int32()
  mems = []
  shapes = image_shapes(spec, bufs)
  for slot in spec.globals:
    a = bufs[slot]
    flags = CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR
    if (shp := shapes.get(slot)) is not None:  # an RGBA float image of (height, width, 4), the array's floats in order
      assert a.flags.c_contiguous and a.size == shp[0] * shp[1] * 4, (slot, a.shape, shp)
      desc = ImageDesc(CL_MEM_OBJECT_IMAGE2D, shp[1], shp[0], 1, 1, 0, 0, 0, 0, None)
      m = cl.clCreateImage(ctx, flags, ctypes.byref(ImageFormat(CL_RGBA, CL_FLOAT)), ctypes.byref(desc),
                           a.ctypes.data, ctypes.byref(err))
      _check(err.value, "clCreateImage")
    else:
      m = cl.clCreateBuffer(ctx, flags, max(a.nbytes, 1), a.ctypes.data, ctypes.byref(err))
      _check(err.value, "clCreateBuffer")
    mems.append(vp(m))
  for i, m in enumerate(mems): _check(cl.clSetKernelArg(k, i, 8, ctypes.byref(m)), f"clSetKernelArg({i})")
  for j, v in enumerate(vals):
    cv = ctypes.c_int32(v)
    _check(cl.clSetKernelArg(k, len(mems) + j, 4, ctypes.byref(cv)), f"clSetKernelArg({len(mems) + j})")
  lsz = tuple(spec.local_size or (1, 1, 1))
  gsz = tuple(g * l for g, l in zip(spec.global_size, lsz))
  _check(cl.clEnqueueNDRangeKernel(q, k, 3, None, (sz * 3)(*gsz), (sz * 3)(*lsz), 0, None, None),
         "clEnqueueNDRangeKernel")
  for slot, m in zip(spec.globals, mems):
    a = bufs[slot]
    if (shp := shapes.get(slot)) is not None:
      origin, region = (sz * 3)(0, 0, 0), (sz * 3)(shp[1], shp[0], 1)
      _check(cl.clEnqueueReadImage(q, m, 1, origin, region, 0, 0, a.ctypes.data, 0, None, None), "clEnqueueReadImage")
    else:
      _check(cl.clEnqueueReadBuffer(q, m, 1, 0, a.nbytes, a.ctypes.data, 0, None, None), "clEnqueueReadBuffer")
  _check(cl.clFinish(q), "clFinish")
  for m in mems: cl.clReleaseMemObject(m)


def replay(calls: list[Any], uploads: dict[Any, np.ndarray] | None = None) -> dict[Any, np.ndarray]:
  """Run the engine calls captured (tiny_tensor.engine.capture) while realizing on a NULL OpenCL device, on PoCL:
  numpy arrays stand for the NULL Buffers (starting from `uploads`, data written straight into them), a copy from
  another device takes that device's data, a kernel runs its OpenCL program on the arrays. Returns {Buffer: array}
  (in place, so later calls see earlier results)."""
  arrs: dict[Any, np.ndarray] = {b: a.copy() for b, a in (uploads or {}).items()}

  def arr(b: Any) -> np.ndarray:
    if b not in arrs: arrs[b] = np.zeros(b.size, np.dtype(b.dtype.fmt))
    return arrs[b]
  for c in calls:
    if c.kind == "copy":
      dst, src = c.bufs
      data = arrs[src] if src in arrs else np.frombuffer(src.as_buffer(), np.dtype(src.dtype.fmt))
      arr(dst)[:] = data.reshape(-1)[:dst.size]
    elif c.kind == "kernel":
      slots = list(c.spec.globals)
      bufs: list[Any] = [None] * (max(slots) + 1)
      for slot, b in zip(slots, c.bufs): bufs[slot] = arr(b)
      run(c.spec, bufs, tuple(c.var_vals[v.arg[0]] for v in c.spec.vars))
    else:  # a view shares its base's memory from a byte offset
      view, base = c.bufs
      raw = arr(base).view(np.uint8)[c.offset:c.offset + view.size * view.dtype.itemsize]
      arrs[view] = raw.view(np.dtype(view.dtype.fmt))
  return arrs
