"""The CUDA device's driver code on MOCK+CUDA: memory, copies, launches, events, peer copies, TinyJit replays, and
the errors the driver reports (which the mock must produce as the real libcuda does)."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_uop.plugins import Device
from tiny_runtime_nv import cuda, cuda_api
from tiny_runtime_nv.cuda import CUDAError, ffi
from tiny_runtime_nv.mock.libcuda import mock_libcuda

PTX = """.version 7.8
.target sm_90
.address_size 64
.visible .entry axpy(.param .u64 data0, .param .u64 data1, .param .s32 var_n)
{
.reg .pred %p<2>; .reg .b32 %r<6>; .reg .f32 %f<4>; .reg .b64 %rd<8>;
ld.param.u64 %rd0, [data0]; ld.param.u64 %rd1, [data1]; ld.param.s32 %r0, [var_n];
mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ntid.x; mov.u32 %r3, %tid.x; mad.lo.s32 %r4, %r1, %r2, %r3;
setp.ge.s32 %p0, %r4, %r0; @%p0 bra $L_end;
mul.wide.s32 %rd2, %r4, 4; add.s64 %rd3, %rd0, %rd2; add.s64 %rd4, %rd1, %rd2;
ld.global.f32 %f0, [%rd4]; mul.rn.f32 %f1, %f0, 0f40000000; add.rn.f32 %f2, %f1, 0f3F800000; st.global.f32 [%rd3], %f2;
$L_end: ret;
}
"""


@pytest.fixture(scope="module")
def dev():
  return Device["MOCK+CUDA"]


def _buf(dev, arr: np.ndarray):
  b = dev.allocator.alloc(arr.nbytes)
  dev.allocator._copyin(b, memoryview(arr).cast("B"))
  return b


def _read(dev, b, n) -> np.ndarray:
  out = np.zeros(n, np.float32)
  dev.allocator._copyout(memoryview(out).cast("B"), b)
  return out


def test_device_info(dev):
  assert dev.arch == "sm_90" and "H200" in dev.name
  assert dev.attribute(cuda_api.ATTR_MULTIPROCESSOR_COUNT) == 132


def test_launch_copy_and_timing(dev):
  x = np.arange(100, dtype=np.float32)
  bx, by = _buf(dev, x), _buf(dev, np.zeros(100, np.float32))
  prg = dev.get_program("axpy", PTX.encode())
  t = prg(by, bx, global_size=(4, 1, 1), local_size=(32, 1, 1), vals=(100,), wait=True)
  assert isinstance(t, float) and t >= 0
  np.testing.assert_array_equal(_read(dev, by, 100), x * 2 + 1)
  bz = dev.allocator.alloc(400)
  dev.allocator._transfer(bz, by, 400)
  np.testing.assert_array_equal(_read(dev, bz, 100), x * 2 + 1)


def test_peer_copy_between_devices(dev):
  other = Device["MOCK+CUDA:1"]
  assert other.ctx != dev.ctx
  src = _buf(dev, np.arange(64, dtype=np.float32))
  dst = other.allocator.alloc(256)
  other.allocator.peer_copy(dst, dev, src, 256)
  np.testing.assert_array_equal(_read(other, dst, 64), np.arange(64, dtype=np.float32))


def test_tensor_to_another_gpu_is_a_peer_copy(dev, monkeypatch):
  """`Tensor.to` between two CUDA devices (eager, and replayed by TinyJit) is cuMemcpyPeer: the source is never read
  by the host."""
  from tiny_tensor import Tensor, TinyJit
  src_name, dst_name = dev.device, "MOCK+CUDA:1"
  a = np.random.default_rng(5).standard_normal((6, 17)).astype(np.float32)
  calls, real_out = [], cuda.CUDAAllocator._copyout
  real_peer = cuda.CUDAAllocator._peer_copy
  monkeypatch.setattr(cuda.CUDAAllocator, "_peer_copy",
                      lambda self, *args: (calls.append(args[2]), real_peer(self, *args)))

  def copyout(self, dest, src):
    if self.dev is dev: pytest.fail("a GPU-to-GPU copy read the source GPU's memory on the host")
    return real_out(self, dest, src)
  monkeypatch.setattr(cuda.CUDAAllocator, "_copyout", copyout)
  np.testing.assert_allclose((Tensor(a, device=src_name).to(dst_name) - 1).numpy(), a - 1, rtol=1e-6)
  step = TinyJit(lambda t: (t.to(dst_name) * 3).realize())
  for i in range(4):
    np.testing.assert_allclose(step(Tensor(a + i, device=src_name).realize()).numpy(), (a + i) * 3, rtol=1e-6)
  assert calls and calls[0] == a.nbytes and len(calls) >= 5


def test_driver_rejects_bad_calls(dev):
  drv, lib = dev.drv, mock_libcuda()
  with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_VALUE"): drv.call("cuMemFree_v2", 0x1234)
  b = dev.allocator.alloc(64)
  host = ffi.new("char[128]")
  with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_VALUE"):  # past the end of the 4 KiB allocation
    drv.call("cuMemcpyHtoDAsync_v2", b.ptr + 4096 - 64, host, 128, ffi.NULL)
  prg = dev.get_program("axpy", PTX.encode())
  args = prg.launch_args(cuda.pack_args([b.ptr, b.ptr], [1]))
  with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_VALUE"):  # 1025 threads per block
    drv.call("cuLaunchKernel", prg.fn, 1, 1, 1, 1025, 1, 1, 0, ffi.NULL, ffi.NULL, args[2])
  short = prg.launch_args(cuda.pack_args([b.ptr], []))
  with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_VALUE"):  # the kernel takes 20 bytes of parameters
    drv.call("cuLaunchKernel", prg.fn, 1, 1, 1, 1, 1, 1, 0, ffi.NULL, ffi.NULL, short[2])
  with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_HANDLE"):
    drv.call("cuLaunchKernel", ffi.cast("CUfunction", 0x999999), 1, 1, 1, 1, 1, 1, 0, ffi.NULL, ffi.NULL, args[2])
  mod = ffi.new("CUmodule *")
  with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_IMAGE"):
    drv.call("cuModuleLoadData", mod, ffi.new("char[]", b"not a module"))
  with pytest.raises(CUDAError, match="CUDA_ERROR_NOT_FOUND"): dev.get_program("nope", PTX.encode())
  assert lib.launches > 0


def test_fault_is_sticky_on_its_context():
  dev = Device["MOCK+CUDA:1"]
  drv = dev.drv
  prg = dev.get_program("axpy", PTX.encode())
  ctx = ffi.new("CUcontext *")
  drv.call("cuCtxCreate_v2", ctx, 0, dev.cu_device)  # a fresh context (now current): the device's own stays healthy
  try:
    img = ffi.new("char[]", PTX.encode())
    mod, fn = ffi.new("CUmodule *"), ffi.new("CUfunction *")
    drv.call("cuModuleLoadData", mod, img)
    drv.call("cuModuleGetFunction", fn, mod[0], b"axpy")
    args = prg.launch_args(cuda.pack_args([0x10, 0x10], [1]))  # unmapped addresses
    with pytest.raises(CUDAError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
      drv.call("cuLaunchKernel", fn[0], 1, 1, 1, 1, 1, 1, 0, ffi.NULL, ffi.NULL, args[2])
    with pytest.raises(CUDAError, match="CUDA_ERROR_ILLEGAL_ADDRESS"): drv.call("cuCtxSynchronize")
  finally:
    drv.call("cuCtxDestroy_v2", ctx[0])
  dev.synchronize()  # the device's own context is untouched


def test_tinyjit_replays_through_cuda_graph():
  from tiny_tensor import Tensor, TinyJit
  from tiny_runtime_nv.cuda import CUDAGraph
  f = TinyJit(lambda a, b: ((a + b) * 2).relu().realize())
  rng = np.random.default_rng(0)
  for i in range(5):
    an, bn = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    out = f(Tensor(an, device="MOCK+CUDA"), Tensor(bn, device="MOCK+CUDA")).numpy()
    np.testing.assert_allclose(out, np.maximum((an + bn) * 2, 0), rtol=1e-6)
    if i == 2: builds = CUDAGraph.builds
  assert CUDAGraph.builds == builds  # replays reuse the graph built after the capture
