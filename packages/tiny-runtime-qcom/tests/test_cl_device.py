"""The CL device on whatever OpenCL platform is installed (PoCL on CPU: the system's, or the PyPI wheel's through our
own ICD dispatch): buffers, kernels from the OpenCL renderer with the GPU heuristic's workgroup reductions, build logs
in compile errors, device limits, and `IMAGE=1` models whose conv/matmul weights and activations are read as images --
all against numpy. PoCL is a test dependency (pocl-binary-distribution), so nothing here skips."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import Context, dtypes
from tiny_uop.device import Buffer


@pytest.fixture(scope="module")
def dev() -> object:
  from tiny_uop.plugins import Device
  return Device["CL"]


rng = np.random.default_rng(5)


def test_buffers_copy_and_view(dev):
  a = np.arange(64, dtype=np.float32)
  b = Buffer("CL", 64, dtypes.float32).ensure_allocated().copyin(memoryview(a))
  out = np.zeros(64, np.float32)
  b.copyout(memoryview(out))
  np.testing.assert_array_equal(out, a)
  align = dev.base_align  # type: ignore[attr-defined]
  if align % 4 == 0 and align // 4 < 64:  # a view at the first aligned offset reads the base's data from there
    v = b.view(64 - align // 4, dtypes.float32, align)
    got = np.zeros(64 - align // 4, np.float32)
    v.ensure_allocated().copyout(memoryview(got))
    np.testing.assert_array_equal(got, a[align // 4:])
  u = b.view(8, dtypes.float32, 4 * 3).ensure_allocated()  # unaligned (PoCL: 128-byte alignment): a copy
  got8 = np.zeros(8, np.float32)
  u.copyout(memoryview(got8))
  np.testing.assert_array_equal(got8, a[3:11])
  with pytest.raises(ValueError, match="outside"): b.view(8, dtypes.float32, 4 * 60).ensure_allocated()


def test_renderer_capabilities_are_the_devices(dev):
  r = dev.renderer  # type: ignore[attr-defined]
  caps = dev.caps  # type: ignore[attr-defined]
  assert caps["max_workgroup_size"] >= 1 and len(caps["local_max"]) == 3 and caps["shared_max"] > 0
  assert (r.max_workgroup_size, r.local_max, r.shared_max) == (caps["max_workgroup_size"], caps["local_max"],
                                                               caps["shared_max"])


def test_build_log_is_in_the_compile_error(dev):
  from tiny_runtime_qcom.cl import CLProgram
  from tiny_uop.device import CompileError
  with pytest.raises(CompileError, match=r"(?s)error.*undeclared_thing.*--- source ---"):
    CLProgram(dev, "k", b"__kernel void k(__global float* a) { a[0] = undeclared_thing; }")


def test_pypi_pocl_runs_through_the_icd_dispatch_table():
  """PoCL from PyPI exports only ICD entry points: loaded with our dispatch-table loader it builds and runs a kernel."""
  import numpy as np
  from tiny_runtime_qcom import opencl as o
  path = o.pypi_pocl()
  assert path is not None, "pocl-binary-distribution (a test dependency) is not installed"
  cl = o.load_icd(path)
  ctx = o.Context(cl)
  assert "Portable Computing Language" in ctx.platform_name and cl.how.startswith("icd ")
  _, k = ctx.build("__kernel void k(__global float* a) { int i = get_global_id(0); a[i] = a[i] * 2.0f + i; }", "k")
  x = np.arange(64, dtype=np.float32)
  err = o.ffi.new("cl_int*")
  mem = cl.clCreateBuffer(ctx.ctx, o.CL_MEM_READ_WRITE | o.CL_MEM_COPY_HOST_PTR, x.nbytes, o.ffi.from_buffer(x), err)
  o.check(err[0], "clCreateBuffer")
  o.check(cl.clSetKernelArg(k, 0, o.ffi.sizeof("cl_mem"), o.ffi.new("cl_mem*", mem)), "clSetKernelArg")
  o.check(cl.clEnqueueNDRangeKernel(ctx.queue, k, 1, o.ffi.NULL, o.ffi.new("size_t[1]", [64]), o.ffi.NULL, 0,
                                    o.ffi.NULL, o.ffi.NULL), "clEnqueueNDRangeKernel")
  out = np.zeros(64, np.float32)
  o.check(cl.clEnqueueReadBuffer(ctx.queue, mem, 1, 0, out.nbytes, o.ffi.from_buffer(out), 0, o.ffi.NULL, o.ffi.NULL),
          "clEnqueueReadBuffer")
  np.testing.assert_array_equal(out, x * 2 + np.arange(64))
  cl.clReleaseMemObject(mem)


def test_tensor_math_on_cl(dev):
  tt = pytest.importorskip("tiny_tensor")
  a, b = rng.standard_normal((4, 512)).astype(np.float32), rng.standard_normal((512, 8)).astype(np.float32)
  ta, tb = tt.Tensor(a, device="CL"), tt.Tensor(b, device="CL")
  np.testing.assert_allclose((ta * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)
  np.testing.assert_allclose(ta.sum(1).numpy(), a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)  # a GROUPTOP
  np.testing.assert_allclose(ta.softmax(1).numpy(), _softmax(a), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose((ta @ tb).numpy(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_half_on_cl(dev):
  """half tensors work whether or not the device has cl_khr_fp16 (without it: storage-only half, math in float)."""
  tt = pytest.importorskip("tiny_tensor")
  a = rng.standard_normal(37).astype(np.float16)
  t = tt.Tensor(a, device="CL")
  np.testing.assert_array_equal((t * t + 1).numpy(), a * a + np.float16(1))
  np.testing.assert_array_equal(t.cast(tt.dtypes.float32).numpy(), a.astype(np.float32))
  np.testing.assert_allclose(t.sum().numpy(), a.astype(np.float32).sum(), rtol=2e-3)


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


def _np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
  x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", win, w) + b[None, :, None, None]


def _np_pool(x: np.ndarray) -> np.ndarray:
  n, c, h, w = x.shape
  return x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max((3, 5))


@pytest.mark.parametrize("image", [0, 1])
def test_convnet_forward_on_cl(dev, image):
  """conv(pad 1) -> relu -> pool -> conv -> relu -> pool -> linear; with IMAGE=1 every kernel reads its float inputs
  (weights, activations) as images."""
  tt = pytest.importorskip("tiny_tensor")
  from tiny_tensor import engine
  shapes = {"x": (2, 3, 10, 10), "w1": (8, 3, 3, 3), "b1": (8,), "w2": (16, 8, 3, 3), "b2": (16,), "wl": (10, 16),
            "bl": (10,)}
  d = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
  calls: list = []
  with Context(IMAGE=image), engine.capture(calls.append):
    t = {k: tt.Tensor(v, device="CL") for k, v in d.items()}
    h = t["x"].conv2d(t["w1"], t["b1"], padding=1).relu().max_pool2d()
    h = h.conv2d(t["w2"], t["b2"]).relu().max_pool2d()
    out = h.flatten(1).linear(t["wl"].T, t["bl"]).numpy()
  srcs = [c.spec.src for c in calls if c.kind == "kernel"]
  assert srcs and all(("read_imagef" in s) == bool(image) for s in srcs)
  x = d["x"].astype(np.float64)
  h64 = _np_pool(np.maximum(_np_conv(x, d["w1"], d["b1"], 1), 0))
  h64 = _np_pool(np.maximum(_np_conv(h64, d["w2"], d["b2"], 0), 0))
  ref = h64.reshape(2, -1) @ d["wl"].T.astype(np.float64) + d["bl"]
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_program_binaries_come_from_the_device_compiler():
  """The QCOM compiler's path on any OpenCL: build, then CL_PROGRAM_SIZES/BINARIES give the device's binary; a device
  that is not an Adreno is refused with the reason (its binaries aren't a6xx code)."""
  from tiny_runtime_qcom.compiler import AdrenoCompiler
  from tiny_runtime_qcom.opencl import Context
  ctx = Context()
  prg, _ = ctx.build("__kernel void k(__global float* a) { a[get_global_id(0)] *= 2.0f; }", None)
  blob = ctx.binary(prg)
  assert len(blob) > 64 and blob != b"\0" * len(blob)
  ctx.cl.clReleaseProgram(prg)
  with pytest.raises(RuntimeError, match="not an Adreno GPU"): AdrenoCompiler("a630", ctx)


def test_cl_device_runs_on_pypi_pocl_alone():
  """What a machine without an ICD loader gets: the CL device on the PyPI PoCL (forced with TINY_OPENCL_ICD)."""
  import os
  import subprocess
  import sys
  from tiny_runtime_qcom.opencl import pypi_pocl
  path = pypi_pocl()
  assert path is not None, "pocl-binary-distribution (a test dependency) is not installed"
  code = ("from tiny_tensor import Tensor; from tiny_uop.plugins import Device\n"
          "print(Device['CL'].cl.how); print((Tensor([1.0, 2.0, 3.0], device='CL') * 2 + 1).tolist())")
  env = {**{k: v for k, v in os.environ.items() if k not in ("DEV", "TINY_PLUGINS")}, "TINY_OPENCL_ICD": path}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
  assert out.splitlines() == [f"icd {path}", "[3.0, 5.0, 7.0]"]
