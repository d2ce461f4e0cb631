"""Test helper: run an OpenCL C ProgramSpec on numpy arrays through libOpenCL (PoCL on CPU) with ctypes.

`available()` says why not when there is no OpenCL platform; `run(spec, bufs, vals)` launches
`spec.global_size` work-groups of `spec.local_size` work-items and copies every buffer back into `bufs`. Params the
kernel declares as images (`dtypes.imagef((h, w, 4))`, IMAGE=1) are passed as RGBA float images made from the
arrays' floats in order (h x w texels).
The OpenCL bindings, context and program builds are the `CL` device's (tiny_runtime_qcom.cl); this runner only adds
launches on numpy arrays (image params read back too, for hand-built image-writing kernels). Tests import it by name
(conftest.py puts this folder on sys.path).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

vp, sz = ctypes.c_void_p, ctypes.c_size_t
CL_MEM_READ_WRITE, CL_MEM_COPY_HOST_PTR = 1 << 0, 1 << 5


def _device() -> Any:
  from tiny_uop.plugins import Device
  return Device["CL"]


def extensions() -> str:
  """The device's CL_DEVICE_EXTENSIONS ("cl_khr_fp16 cl_khr_fp64 ...")."""
  return " ".join(sorted(_device().extensions))


def available() -> str | None:
  """None when an OpenCL device can run kernels, else the reason."""
  try: _device()
  except Exception as e:  # noqa: BLE001 -- any reason the CL device can't open is the reason to report
    return f"no OpenCL runtime: {e}"
  return None


def build(src: str, name: str) -> Any:
  """The kernel `name` of OpenCL C `src`, built for the CL device (CompileError with the build log on failure)."""
  from tiny_runtime_qcom.cl import CLProgram
  if (prg := _programs.get((src, name))) is None:
    prg = _programs[(src, name)] = CLProgram(_device(), name, src.encode())
  return prg.kernel


_programs: dict[tuple[str, str], Any] = {}  # built programs (a kernel lives as long as its program)


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
  from tiny_runtime_qcom.cl import CL_FLOAT, CL_MEM_OBJECT_IMAGE2D, CL_RGBA, ImageDesc, ImageFormat, check, libcl
  cl, dev = libcl(), _device()
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
      m = cl.clCreateImage(dev.ctx, flags, ctypes.byref(ImageFormat(CL_RGBA, CL_FLOAT)), ctypes.byref(desc),
                           a.ctypes.data, ctypes.byref(err))
      check(err.value, "clCreateImage")
    else:
      m = cl.clCreateBuffer(dev.ctx, flags, max(a.nbytes, 1), a.ctypes.data, ctypes.byref(err))
      check(err.value, "clCreateBuffer")
    mems.append(vp(m))
  for i, m in enumerate(mems): check(cl.clSetKernelArg(k, i, 8, ctypes.byref(m)), f"clSetKernelArg({i})")
  for j, v in enumerate(vals):
    cv = ctypes.c_int32(v)
    check(cl.clSetKernelArg(k, len(mems) + j, 4, ctypes.byref(cv)), f"clSetKernelArg({len(mems) + j})")
  lsz = tuple(spec.local_size or (1, 1, 1))
  gsz = tuple(g * l for g, l in zip(spec.global_size, lsz))
  check(cl.clEnqueueNDRangeKernel(dev.queue, k, 3, None, (sz * 3)(*gsz), (sz * 3)(*lsz), 0, None, None),
        "clEnqueueNDRangeKernel")
  for slot, m in zip(spec.globals, mems):
    a = bufs[slot]
    if (shp := shapes.get(slot)) is not None:
      origin, region = (sz * 3)(0, 0, 0), (sz * 3)(shp[1], shp[0], 1)
      check(cl.clEnqueueReadImage(dev.queue, m, 1, origin, region, 0, 0, a.ctypes.data, 0, None, None),
            "clEnqueueReadImage")
    else:
      check(cl.clEnqueueReadBuffer(dev.queue, m, 1, 0, a.nbytes, a.ctypes.data, 0, None, None), "clEnqueueReadBuffer")
  dev.synchronize()
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
