"""The six driver mistakes of issue #32, each fed to the mock that must catch it (issue: "a mock that accepts what the
kernel rejects is a bug"). Each test sends the mistaken call or packet -- built by hand, or by our driver with the old
bug put back with a monkeypatch -- asserts the mock refuses it or that its result is not visible where the hardware
would not make it visible, and that the correct form passes with the right numbers (numpy as the reference).

1. NV: NV_ESC_RM_ALLOC_MEMORY on /dev/nvidiactl (RM takes it on a per-GPU /dev/nvidiaN only).
2. NV: a cubin's SM read from the wrong e_flags field (ELF ABI 7: bits 7:0, ABI 8: bits 15:8).
3. AMD: an SDMA FENCE with MTYPE 0 (cached) on SDMA v5+/v6 (amdgpu's ring_emit_fence uses MTYPE 3, uncached).
4. QCOM: a CACHE_INVALIDATE without a write-back first / a dispatch whose results were never written back.
5. AMD: an MI300X node in SPX mode (eight XCCs) refused: the mock presents it and the driver runs there.
6. NV: QMD 03_00 launched on HOPPER_COMPUTE_A (it reads QMD 04_00).
The rule each mock applies cites its kernel/driver source where it is written (mock/rm.py ESCAPE_FILES,
mock/gpu.py cubin_sm and the QMD version check, amd mock/sdma.py MTYPE_UC and mock/gpu.py's FENCE, qcom mock/cp.py
UCHE and mock/driver.py's end-of-submission flush, amd mock/gfx9.py GFX9SPX and mock/driver.py CREATE_QUEUE).
"""
from __future__ import annotations

import ctypes
import importlib.util
import pathlib
import struct

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ***** NV *****
def _nv_kernel(dev, name: str):
  """c[i] = a[i] * 3 - 1 over 256 floats, compiled by the device's own compiler (ptxas): (spec, program)."""
  from tiny_codegen import get_program
  from tiny_uop import KernelInfo, Ops, UOp, dtypes
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(256), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(256), arg=1)
  i = UOp.range(256, 0)
  return get_program(c.index(i).store(a.index(i).load() * 3.0 - 1.0).sink(arg=KernelInfo(name)), dev.renderer)


def _nv_bufs(dev_name: str, *arrays: np.ndarray) -> list:
  from tiny_uop import dtypes
  from tiny_uop.device import Buffer
  return [Buffer(dev_name, a.size, dtypes.float).copyin(memoryview(a)) for a in arrays]


def _nv_qmd(dev, prg, spec, out, src) -> int:
  """The address of a QMD launching `prg` over `spec`'s sizes with out, src as its arguments (the driver's own)."""
  base = dev.kernargs_alloc(prg.args_layout(2, 0).size)
  prg.fill_args(base, [out._buf.va_addr, src._buf.va_addr], [])
  prg.fill_launch(base, spec.global_size, spec.local_size)
  return base + prg.cb0_size


def _nv_refused(dev, qmd: int, match: str) -> None:
  """Launch the QMD at `qmd` alone (no timeline signal after it): the mock GPU must refuse it, the channel error is
  reported (RuntimeError) and the device goes on working."""
  from tiny_runtime_nv.push import NVComputeQueue
  NVComputeQueue().launch(qmd).submit(dev)
  with pytest.raises(RuntimeError, match=match): dev.progress()
  dev.progress()
  dev.synchronize()


def test_1_nv_alloc_memory_on_nvidiactl_is_refused(monkeypatch):
  """escape.c RmIoctl: NV_ESC_RM_ALLOC_MEMORY is NV_ACTUAL_DEVICE_ONLY, so on the control file RM returns
  NV_ERR_INVALID_ARGUMENT and nvidia_ioctl fails the ioctl with EINVAL."""
  from tiny_uop.plugins import Device

  from tiny_runtime_nv import rm
  from tiny_runtime_nv.mock.rm import driver
  dev = Device["MOCK+NV"]
  before = set(driver().mems)
  monkeypatch.setattr(dev.mem, "gpu_file", dev.rm.ctl)  # the old driver: OS-descriptor memory on /dev/nvidiactl
  with pytest.raises(rm.RMError, match=r"RM alloc of OS memory: ioctl failed: EINVAL"):
    dev.mem.alloc(0x2000, host=True)
  assert set(driver().mems) == before  # nothing was allocated
  monkeypatch.undo()
  buf = dev.mem.alloc(0x2000, host=True)  # on /dev/nvidia0: accepted, our own pages at the GPU address
  try:
    assert driver().mems[buf.meta.handle].kind == "os" and driver().mems[buf.meta.handle].backing == buf.va_addr
  finally: dev.mem.free(buf)


def test_2_nv_cubin_sm_read_from_the_wrong_field_is_refused(monkeypatch):
  """ptxas 13 writes ELF ABI 8 with the SM in e_flags bits 15:8 (LLVM ELF.h EF_CUDA_SM_MASK). A driver reading bits
  7:0 for every ABI (the old bug) takes an sm_80 cubin whose bits 7:0 happen to say 0x5a for an sm_90 one; the mock GPU
  reads the SM by ABI version on its own and refuses to run sm_80 code on the H200."""
  from tiny_uop.plugins import Device

  from tiny_runtime_nv import cubin
  from tiny_runtime_nv.mock.gpu import cubin_sm
  hopper, ampere = Device["MOCK+NV"], Device["MOCK+NV:1"]
  spec80 = _nv_kernel(ampere, "sm80_axpb")
  lib = bytearray(spec80.lib)
  flags = struct.unpack_from("<I", lib, 0x30)[0]
  assert lib[8] == cubin.ELFABIVERSION_CUDA_V2 and (flags >> 8) & 0xFF == 80  # ptxas 13: ABI 8, sm_80 in 15:8
  struct.pack_into("<I", lib, 0x30, (flags & ~0xFF) | 90)
  assert cubin_sm(bytes(lib)) == 80 and cubin_sm(bytes(lib[:8]) + bytes([7]) + bytes(lib[9:])) == 90
  with pytest.raises(RuntimeError, match=r"compiled for sm_80; MOCK\+NV is sm_90"):  # today's driver refuses it
    hopper.get_program(spec80.name, bytes(lib))
  monkeypatch.setattr(cubin, "cubin_arch", lambda abi_version, e_flags: f"sm_{e_flags & 0xFF}")  # the old reading
  prg = hopper.get_program(spec80.name, bytes(lib))
  x = np.arange(256, dtype=np.float32)
  src, out = _nv_bufs("MOCK+NV", x, np.zeros(256, np.float32))
  _nv_refused(hopper, _nv_qmd(hopper, prg, spec80, out, src),
              r"cubin for sm_80 \(ELF ABI 8, e_flags 0x[0-9a-f]+\) on a sm_90 GPU")
  assert out.numpy().tolist() == [0.0] * 256  # nothing ran
  monkeypatch.undo()
  spec90 = _nv_kernel(hopper, "sm90_axpb")  # the correct form: an sm_90 cubin, read from bits 15:8
  assert cubin_sm(spec90.lib) == 90
  hopper.get_program(spec90.name, spec90.lib)(out._buf, src._buf, global_size=spec90.global_size,
                                              local_size=spec90.local_size, wait=True)
  np.testing.assert_array_equal(out.numpy(), x * 3 - 1)


def test_6_nv_qmd_03_00_on_hopper_is_refused():
  """HOPPER_COMPUTE_A reads QMD 04_00 (open-gpu-doc clcbc0qmd.h; Mesa NVK launches 04_00 on Hopper): the old driver's
  03_00 QMD is refused by the mock, the class's own version runs."""
  from tiny_uop.plugins import Device

  from tiny_runtime_nv import push, rm
  from tiny_runtime_nv.push import NVComputeQueue
  dev = Device["MOCK+NV"]
  assert dev.compute_class == rm.HOPPER_COMPUTE_A
  spec = _nv_kernel(dev, "qmd_axpb")
  prg = dev.get_program(spec.name, spec.lib)
  x = np.arange(256, dtype=np.float32)
  src, out = _nv_bufs("MOCK+NV", x, np.zeros(256, np.float32))
  qmd, ver = _nv_qmd(dev, prg, spec, out, src), prg.qmd_version
  assert ver is push.QMD_04_00
  good = ctypes.string_at(qmd, ver.size)
  q = push.QMD(good, ver)
  q["QMD_MAJOR_VERSION"] = 3  # the header word of a 03_00 QMD (its major version sits in the same bits 583:580)
  ctypes.memmove(qmd, bytes(q), ver.size)
  _nv_refused(dev, qmd, r"QMD version 3\.x on compute class 0xcbc0, which reads QMD 4\.0")
  assert out.numpy().tolist() == [0.0] * 256  # nothing ran
  ctypes.memmove(qmd, good, ver.size)
  NVComputeQueue().launch(qmd).signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  dev.synchronize()
  np.testing.assert_array_equal(out.numpy(), x * 3 - 1)


# ***** AMD *****
def _amd_harness():
  """packages/tiny-runtime-amd/tests/mock_harness.py (the one raw-queue helper for the AMD mock), loaded by path."""
  path = ROOT / "packages" / "tiny-runtime-amd" / "tests" / "mock_harness.py"
  spec = importlib.util.spec_from_file_location("amd_mock_harness", path)
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.Harness


def test_3_amd_cached_sdma_fence_is_not_visible_to_the_host(monkeypatch):
  """sdma_v5_0/5_2/6_0/7_0_ring_emit_fence put MTYPE 3 (UC) in the FENCE header: the value goes to memory. With MTYPE 0
  (the old driver) the write goes through the GPU's L2: the host's poll doesn't see it until an L2 write-back."""
  from tiny_runtime_amd import sdma
  from tiny_runtime_amd.pm4 import AMDComputeQueue
  from tiny_runtime_amd.sdma import AMDCopyQueue
  h = _amd_harness()()  # a fresh mock KFD of gfx1100s (SDMA v6)
  assert h.iface.node.arch == "gfx1100"
  sig = h.iface.alloc(0x1000, host=True, uncached=True)
  word = ctypes.c_uint32.from_address(sig.va_addr)
  monkeypatch.setattr(AMDCopyQueue, "fence_header", sdma.header(sdma.OP_FENCE))  # the old header: MTYPE 0
  h.sdma(AMDCopyQueue().fence(sig.va_addr, 7).resolved())
  assert word.value == 0 and h.gpu.l2_lines == {sig.va_addr: 7}  # in L2, not in memory: the host sees nothing
  h.pm4(AMDComputeQueue().acquire_mem().resolved())  # a GCR GL2 write-back is what makes it visible
  assert word.value == 7 and not h.gpu.l2_lines
  monkeypatch.undo()
  assert (AMDCopyQueue.fence_header >> sdma.FENCE_MTYPE_SHIFT) & 7 == sdma.MTYPE_UC == 3
  h.sdma(AMDCopyQueue().fence(sig.va_addr, 8).resolved())  # the driver's UC fence: visible at once
  assert word.value == 8 and not h.gpu.l2_lines


def test_5_amd_mi300x_in_spx_mode_is_presented_and_the_driver_runs_there(monkeypatch):
  """KFD's topology for an MI300X in SPX mode is one node over eight XCCs (num_xcc 8, 304 CUs); the mock presents it,
  our driver opens it and runs a kernel on its PM4 queue's one XCC (amdkfd "Add PM4 target XCC": queue_percentage bits
  15:8), and the mock refuses a PM4 queue on an XCC the node lacks. The old driver refused the node."""
  from tiny_codegen import get_program
  from tiny_uop import KernelInfo, Ops, UOp, dtypes

  from tiny_runtime_amd import device, kfd
  from tiny_runtime_amd.mock import driver
  from tiny_runtime_amd.mock.driver import MockFileIO, MockKFD
  drv = MockKFD(("gfx942_spx",))
  fio = type("SPXFileIO", (MockFileIO,), {"kfd_fn": staticmethod(lambda: drv)})
  monkeypatch.setattr(driver, "mock_fileio", lambda arch: fio)
  dev = device.AMDDevice("MOCK+AMD:LLVM:gfx942")
  assert (dev.arch, dev.iface.node.num_xcc, dev.iface.node.cu_count) == ("gfx942", 8, 8 * 38)
  n = 256
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(n), arg=1)
  i = UOp.range(n, 0)
  spec = get_program(c.index(i).store(a.index(i).load() * 3.0 - 1.0).sink(arg=KernelInfo("spx6_axpb")), dev.renderer)
  x = np.arange(n, dtype=np.float32) - 100
  src, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
  dev.allocator._copyin(src, memoryview(x).cast("B"))
  dev.get_program(spec.name, spec.lib)(out, src, global_size=spec.global_size, local_size=spec.local_size, wait=True)
  got = np.empty(n, np.float32)
  dev.allocator._copyout(memoryview(got).cast("B"), out)
  np.testing.assert_array_equal(got, x * 3 - 1)
  with pytest.raises(kfd.KFDError, match=r"PM4 target XCC 8 \(queue_percentage bits 15:8\); .* XCCs 0\.\.7"):
    dev.iface.create_queue(ring_base_address=dev.compute_ring.ring.va_addr, ring_size=0x1000,
                           queue_type=kfd.QUEUE_TYPE_COMPUTE, queue_percentage=100 | 8 << 8, queue_priority=7,
                           read_pointer_address=dev.compute_ring.ptrs.va_addr,
                           write_pointer_address=dev.compute_ring.ptrs.va_addr + 8)


# ***** QCOM *****
QCOM_SRC = """__kernel void axpb6(__global float* restrict data0, __global const float* restrict data1) {
  int i = get_group_id(0) * 64 + get_local_id(0);
  data0[i] = data1[i] * 3.0f - 1.0f;
}
"""


def test_4_qcom_results_stay_in_uche_without_a_write_back():
  """a6xx UCHE: a dispatch's writes are in the GPU's L2 until a CACHE_FLUSH_TS writes them back, and a CACHE_INVALIDATE
  drops dirty lines (Mesa turnip tu6_emit_flushes writes back before it invalidates; KGSL ends each submission with
  its own CACHE_FLUSH_TS). Run on the mock's command processor directly (no KGSL end-of-submission flush): a dispatch
  without the driver's write-back leaves memory unchanged, an invalidate then loses the results; the driver's exec
  (dispatch + CACHE_FLUSH_TS) makes them visible."""
  from tiny_uop import dtypes
  from tiny_uop.device import Buffer
  from tiny_uop.plugins import Device

  from tiny_runtime_qcom import a6xx
  from tiny_runtime_qcom.mock.driver import driver
  dev = Device["MOCK+QCOM"]
  dev.synchronize()
  prg = dev.get_program("axpb6", dev.renderer.compiler.compile(QCOM_SRC))
  x = np.arange(256, dtype=np.float32)
  src = Buffer("MOCK+QCOM", 256, dtypes.float32).ensure_allocated().copyin(memoryview(x))
  cp = driver().cp
  ib = dev.kgsl.alloc(0x4000)

  def run_on_cp(dwords: list[int]) -> None:
    (ctypes.c_uint32 * len(dwords)).from_address(ib.va_addr)[:] = dwords
    cp.run(ib.va_addr, len(dwords))

  def fresh_out() -> tuple[Buffer, int]:
    out = Buffer("MOCK+QCOM", 256, dtypes.float32).ensure_allocated().copyin(memoryview(np.full(256, 5, np.float32)))
    base = dev.kernargs_alloc(prg.layout.size)
    prg.fill_args(base, [out._buf.va_addr, src._buf.va_addr], ())
    return out, base

  def host_view(b: Buffer) -> np.ndarray: return np.frombuffer(ctypes.string_at(b._buf.va_addr, 1024), np.float32)

  wb = dev.hw_compute_queue_t().write_back()._q
  lost_before = cp.cache.lost
  try:
    out, base = fresh_out()
    full = dev.hw_compute_queue_t().exec(prg, base, (4, 1, 1), (64, 1, 1))._q
    assert full[-len(wb):] == wb  # the driver's exec ends with a write-back
    bare = full[:-len(wb)]
    run_on_cp(bare)  # the mistake: a dispatch, no write-back
    np.testing.assert_array_equal(host_view(out), np.full(256, 5, np.float32))  # not visible to the host
    assert cp.cache.dirty
    lost = cp.cache.lost
    run_on_cp([a6xx.pkt7(a6xx.CP_EVENT_WRITE, 1), a6xx.CACHE_INVALIDATE])  # invalidating without a write-back
    assert cp.cache.lost == lost + 1 and not cp.cache.dirty
    np.testing.assert_array_equal(host_view(out), np.full(256, 5, np.float32))  # the results are gone
    out, base = fresh_out()
    run_on_cp(dev.hw_compute_queue_t().exec(prg, base, (4, 1, 1), (64, 1, 1))._q)  # the correct form
    assert not cp.cache.dirty
    np.testing.assert_array_equal(host_view(out), x * 3 - 1)
  finally:
    cp.cache.flush()
    # the process's mock is shared: the lines lost on purpose here are not another test's (test_qcom_device counts
    # lost lines of the driver's own streams)
    cp.cache.lost = lost_before
    dev.kgsl.free(ib)
