"""Two GPUs: `MOCK+AMD:0` and `MOCK+AMD:1` (two gfx1100 nodes of one mock KFD process), a tensor moved between them
and computed on each, and device-to-device copies on the destination's SDMA engine over a peer mapping."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_codegen.compiler.amdgpu import find_ld_lld
from tiny_runtime_amd.mock.driver import GPUPageFault, driver
from tiny_runtime_amd.sdma import AMDCopyQueue
from tiny_uop import dtypes
from tiny_uop.device import Buffer
from tiny_uop.plugins import Device

D0, D1 = "MOCK+AMD", "MOCK+AMD:1"


def test_two_mocked_gpus_are_two_devices():
  d0, d1 = Device[D0], Device[D1]
  assert d0 is Device["MOCK+AMD:0"] and d0 is not d1
  assert d0.iface.node.gpu_id != d1.iface.node.gpu_id and d0.arch == d1.arch == "gfx1100"
  assert d0.iface.proc is d1.iface.proc  # one KFD process: one /dev/kfd, one event page
  ev_page = d0.iface.proc.event_page
  assert ev_page is not None and set(ev_page.meta.gpu_ids) >= {d0.iface.node.gpu_id, d1.iface.node.gpu_id}
  assert d0.event.event_id != d1.event.event_id
  with pytest.raises(Exception, match="AMD:4 does not exist; this machine has 4 AMD GPU"): Device["MOCK+AMD:4"]


@pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
def test_a_tensor_moved_to_gpu1_computed_there_and_back_is_right():
  from tiny_tensor import Tensor
  gpus = driver().gpus
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal((24, 8)).astype(np.float32)
  x0 = Tensor(a, device=D0).realize()
  before = [g.dispatches for g in gpus]
  x1 = x0.to(D1)
  y1 = ((x1 * 2 + 1) @ Tensor(b, device=D1)).relu().realize()
  Device[D1].synchronize()  # the mock GPUs run when the host waits
  assert y1.device == D1 and gpus[1].dispatches > before[1] and gpus[0].dispatches == before[0]
  back = (y1.to(D0) - 3).realize()
  out = back.numpy()
  assert back.device == D0 and gpus[0].dispatches > before[0]
  np.testing.assert_allclose(out, np.maximum((a * 2 + 1) @ b, 0) - 3, rtol=1e-5, atol=1e-5)


def test_peer_copy_on_the_destination_sdma_over_a_peer_mapping():
  d0, d1 = Device[D0], Device[D1]
  g0, g1 = d0.iface.node.gpu_id, d1.iface.node.gpu_id
  data = np.random.default_rng(3).integers(0, 255, 3 * 4096 + 40, dtype=np.uint8)
  src, dst = Buffer(D0, data.size, dtypes.uint8).copyin(memoryview(data)), Buffer(D1, data.size, dtypes.uint8)
  dst.ensure_allocated()
  copies = [g.copies for g in driver().gpus]
  assert src._buf.meta.gpu_ids == [g0]
  d1.allocator._transfer(dst._buf, src._buf, data.size, src_dev=d0)
  assert src._buf.meta.gpu_ids == [g0, g1]  # MAP_MEMORY_TO_GPU with both ids: GPU 1 reaches GPU 0's memory
  d1.synchronize()
  assert driver().gpus[1].copies == copies[1] + 1 and driver().gpus[0].copies == copies[0]  # GPU 1's SDMA ran it
  np.testing.assert_array_equal(dst.numpy(), data)
  # GPU 0's timeline went past the copy too: its work after it (here a host copy) sees the copy done
  d0.synchronize()
  assert d0.timeline_signal.value == d0.timeline_value - 1
  back = np.empty_like(data)
  d0.allocator._transfer(src._buf, dst._buf, data.size, src_dev=d1)  # and the other way round
  src.copyout(memoryview(back))
  np.testing.assert_array_equal(back, data)
  with pytest.raises(ValueError, match="not an AMD device"): d1.allocator._transfer(dst._buf, src._buf, 4, src_dev=1)


def test_without_the_peer_mapping_the_copying_gpu_faults():
  d0, d1 = Device[D0], Device[D1]
  lonely = d0.iface.alloc(0x1000)  # mapped into GPU 0 only
  target = d1.iface.alloc(0x1000)
  q = AMDCopyQueue().wait(d1.timeline_signal, d1.timeline_value - 1).copy(target.va_addr, lonely.va_addr, 64)
  q.signal(d1.timeline_signal, d1.next_timeline()).submit(d1)
  with pytest.raises(GPUPageFault, match=f"on gpu {d1.iface.node.gpu_id:#x}.*SDMA copy read of 64 bytes"):
    d1.synchronize()
  d1.synchronize()  # the faulting copy was skipped; the signal after it ran
  d0.iface.free(lonely)
  d1.iface.free(target)


@pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
def test_tensor_to_another_gpu_copies_device_to_device(monkeypatch):
  """`Tensor.to` between two AMD GPUs (the engine's COPY, also replayed by TinyJit) runs on the destination's SDMA
  over a peer mapping: the source's memory is never read by the host."""
  from tiny_runtime_amd.device import AMDAllocator
  from tiny_tensor import Tensor, TinyJit
  rng = np.random.default_rng(3)
  a = rng.standard_normal((8, 33)).astype(np.float32)
  x0 = Tensor(a, device=D0).realize()
  Device[D0].synchronize()
  copies = []
  real = AMDAllocator._peer_copy
  monkeypatch.setattr(AMDAllocator, "_peer_copy", lambda self, *args: (copies.append(args[2]), real(self, *args)))
  real_out = AMDAllocator._copyout

  def copyout(self, dest, src):
    if self.dev is Device[D0]: pytest.fail("a GPU-to-GPU copy read the source GPU's memory on the host")
    return real_out(self, dest, src)
  monkeypatch.setattr(AMDAllocator, "_copyout", copyout)
  np.testing.assert_allclose((x0.to(D1) + 1).numpy(), a + 1, rtol=1e-6)
  step = TinyJit(lambda t: (t.to(D1) * 2).realize())
  for i in range(4):  # capture, then replays: each output read before the next call reuses its buffer
    np.testing.assert_allclose(step(Tensor(a + i, device=D0).realize()).numpy(), (a + i) * 2, rtol=1e-6)
  assert copies and copies[0] == a.nbytes and len(copies) >= 5  # one eager, four through the jit
