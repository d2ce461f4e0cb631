"""The storage-only half conversions of the OpenCL renderers (`_h2f`, `_f2h`, `_rh`: what MOCK+QCOM and CL on PoCL
use for float16), run on PoCL against numpy: every one of the 65536 half bit patterns, and floats around every
rounding boundary, subnormals, overflow, infinities and NaN."""
from __future__ import annotations

import numpy as np

from tiny_codegen.renderer.opencl import _ROUND_HALF
from tiny_runtime_qcom.opencl import CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE, Context, check, ffi

SRC = _ROUND_HALF + """__kernel void conv(__global ushort* h, __global float* hf, __global float* x,
                   __global ushort* xh, __global float* xr) {
  int i = get_global_id(0);
  hf[i] = _h2f(h[i]); xh[i] = _f2h(x[i]); xr[i] = _rh(x[i]);
}
"""


def _run(h: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  ctx = Context()
  _, k = ctx.build(SRC, "conv")
  outs = [np.zeros(len(h), np.float32), np.zeros(len(x), np.uint16), np.zeros(len(x), np.float32)]
  arrays, mems, err = [h, outs[0], x, outs[1], outs[2]], [], ffi.new("cl_int*")
  for i, a in enumerate(arrays):
    mems.append(ctx.cl.clCreateBuffer(ctx.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, a.nbytes, ffi.from_buffer(a),
                                      err))
    check(err[0], "clCreateBuffer")
    check(ctx.cl.clSetKernelArg(k, i, ffi.sizeof("cl_mem"), ffi.new("cl_mem*", mems[-1])), "clSetKernelArg")
  check(ctx.cl.clEnqueueNDRangeKernel(ctx.queue, k, 1, ffi.NULL, ffi.new("size_t[1]", [len(h)]), ffi.NULL, 0, ffi.NULL,
                                      ffi.NULL), "clEnqueueNDRangeKernel")
  for a, m in zip(arrays[1:2] + arrays[3:], mems[1:2] + mems[3:]):
    check(ctx.cl.clEnqueueReadBuffer(ctx.queue, m, 1, 0, a.nbytes, ffi.from_buffer(a), 0, ffi.NULL, ffi.NULL), "read")
  for m in mems: ctx.cl.clReleaseMemObject(m)
  return outs[0], outs[1], outs[2]


def test_half_conversions_are_ieee():
  h = np.arange(1 << 16, dtype=np.uint16)
  # floats: every half, the midpoints between neighbours (ties to even), just either side of them, and the range edges
  hv = h.view(np.float16).astype(np.float32)
  fin = np.sort(hv[np.isfinite(hv)])
  mids = ((fin[:-1].astype(np.float64) + fin[1:]) / 2).astype(np.float32)
  x = np.concatenate([fin, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                      np.array([65504, 65519.99, 65520, 1e6, -1e6, 3e-8, 2.98e-8, 1e-30, -0.0, np.inf, -np.inf],
                               np.float32)]).astype(np.float32)
  n = len(h)
  x = np.concatenate([x, np.zeros(-len(x) % n, np.float32)])  # whole launches of n
  want = h.view(np.float16).astype(np.float32)
  nan = np.isnan(want)
  for row in x.reshape(-1, n):
    hf, xh, xr = _run(h, np.ascontiguousarray(row))
    np.testing.assert_array_equal(hf[~nan].view(np.uint32), want[~nan].view(np.uint32))  # exact, signed zeros too
    assert np.isnan(hf[nan]).all()
    with np.errstate(over="ignore"): ref = row.astype(np.float16)  # beyond 65520: inf, as IEEE rounding gives
    np.testing.assert_array_equal(xh, ref.view(np.uint16))
    np.testing.assert_array_equal(xr.view(np.uint32), ref.astype(np.float32).view(np.uint32))
  nan_bits = _run(np.array([0x7E00, 0xFC01], np.uint16), np.array([np.nan, -np.nan], np.float32))[1]
  assert ((nan_bits & 0x7C00) == 0x7C00).all() and (nan_bits & 0x3FF).all()
