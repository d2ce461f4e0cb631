"""Test helper: run an OpenCL C ProgramSpec on numpy arrays through the CL device's OpenCL (PoCL on CPU).

`available()` says why not when there is no OpenCL platform; `run(spec, bufs, vals)` launches
`spec.global_size` work-groups of `spec.local_size` work-items and copies every buffer back into `bufs`. Params the
kernel declares as images (`dtypes.imagef((h, w, 4))`, IMAGE=1) are passed as RGBA float images made from the
arrays' floats in order (h x w texels).
The OpenCL bindings (cffi), context and program builds are the `CL` device's (tiny_runtime_qcom); this runner only adds
launches on numpy arrays (image params read back too, for hand-built image-writing kernels). Tests import it by name
(conftest.py puts this folder on sys.path).
"""
from __future__ import annotations

from typing import Any

import numpy as np


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
  from tiny_runtime_qcom.cl import image_desc
  from tiny_runtime_qcom.opencl import CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE, check, ffi
  dev = _device()
  cl, ctx = dev.cl, dev.ctx
  k = build(spec.src, spec.name)
  err = ffi.new("cl_int*")
  mems = []
  shapes = image_shapes(spec, bufs)
  for slot in spec.globals:
    a = bufs[slot]
    flags = CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR
    if (shp := shapes.get(slot)) is not None:  # an RGBA float image of (height, width, 4), the array's floats in order
      assert a.flags.c_contiguous and a.size == shp[0] * shp[1] * 4, (slot, a.shape, shp)
      fmt, desc = image_desc(shp[0], shp[1])
      m = cl.clCreateImage(ctx.ctx, flags, fmt, desc, ffi.from_buffer(a), err)
      check(err[0], "clCreateImage")
    else:
      m = cl.clCreateBuffer(ctx.ctx, flags, max(a.nbytes, 1), ffi.from_buffer(a) if a.nbytes else ffi.NULL, err)
      check(err[0], "clCreateBuffer")
    mems.append(m)
  for i, m in enumerate(mems): check(cl.clSetKernelArg(k, i, ffi.sizeof("cl_mem"), ffi.new("cl_mem*", m)),
                                     f"clSetKernelArg({i})")
  for j, v in enumerate(vals):
    check(cl.clSetKernelArg(k, len(mems) + j, 4, ffi.new("cl_int*", v)), f"clSetKernelArg({len(mems) + j})")
  lsz = tuple(spec.local_size or (1, 1, 1))
  gsz = tuple(g * l for g, l in zip(spec.global_size, lsz))
  check(cl.clEnqueueNDRangeKernel(ctx.queue, k, 3, ffi.NULL, ffi.new("size_t[3]", list(gsz)),
                                  ffi.new("size_t[3]", list(lsz)), 0, ffi.NULL, ffi.NULL), "clEnqueueNDRangeKernel")
  for slot, m in zip(spec.globals, mems):
    a = bufs[slot]
    if (shp := shapes.get(slot)) is not None:
      origin, region = ffi.new("size_t[3]", [0, 0, 0]), ffi.new("size_t[3]", [shp[1], shp[0], 1])
      check(cl.clEnqueueReadImage(ctx.queue, m, 1, origin, region, 0, 0, ffi.from_buffer(a), 0, ffi.NULL, ffi.NULL),
            "clEnqueueReadImage")
    elif a.nbytes:
      check(cl.clEnqueueReadBuffer(ctx.queue, m, 1, 0, a.nbytes, ffi.from_buffer(a), 0, ffi.NULL, ffi.NULL),
            "clEnqueueReadBuffer")
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
