"""AMDDevice end to end: kernels compiled by the AMDGPU renderer run through the real driver code (PM4 + SDMA queues,
signals, kernargs) on `MOCK+AMD`, and on `AMD` when this machine has /dev/kfd (skipped otherwise)."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from tiny_codegen import get_program
from tiny_codegen.compiler.amdgpu import find_ld_lld
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.hcq import HCQAllocator
from tiny_uop.plugins import Device
from tiny_uop.uop import AxisType

_no_kfd = pytest.mark.skipif(not os.path.exists("/dev/kfd"), reason="no /dev/kfd: no AMD GPU on this machine")
DEVICES = ["MOCK+AMD", pytest.param("AMD", marks=_no_kfd)]
pytestmark = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")


def elementwise(name: str, n: int, dt, fn) -> UOp:
  c, a, b = [UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(3)]
  i = UOp.range(n, 0)
  return c.index(i).store(fn(a.index(i).load(), b.index(i).load())).sink(arg=KernelInfo(name))


def run_kernel(dev_name: str, ast: UOp, *inputs: np.ndarray, out_dtype=np.float32, out_size: int | None = None):
  dev = Device[dev_name]
  spec = get_program(ast, dev.renderer)
  dt = {np.float32: dtypes.float, np.int32: dtypes.int}
  bufs = [Buffer(dev_name, out_size or inputs[0].size, dt[out_dtype])]
  for x in inputs: bufs.append(Buffer(dev_name, x.size, dt[x.dtype.type]).copyin(memoryview(np.ascontiguousarray(x))))
  prg = dev.get_program(spec.name, spec.lib)
  t = prg(*[b._buf for b in bufs], global_size=spec.global_size, local_size=spec.local_size,
          vals=tuple(), wait=True)
  return bufs[0].numpy(), t


@pytest.mark.parametrize("dev", DEVICES)
def test_elementwise_float_matches_numpy(dev):
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal(200).astype(np.float32), rng.standard_normal(200).astype(np.float32)
  out, t = run_kernel(dev, elementwise("E_200", 200, dtypes.float, lambda x, y: x * y + x), a, b)
  np.testing.assert_array_equal(out, a * b + a)
  assert t is not None and t >= 0


@pytest.mark.parametrize("dev", DEVICES)
def test_elementwise_int_and_transcendental(dev):
  rng = np.random.default_rng(2)
  a, b = rng.integers(-1000, 1000, 96).astype(np.int32), rng.integers(1, 50, 96).astype(np.int32)
  out, _ = run_kernel(dev, elementwise("E_int", 96, dtypes.int, lambda x, y: (x * y) // y + (x & y)), a, b,
                      out_dtype=np.int32)
  np.testing.assert_array_equal(out, a + (a & b))
  x, y = rng.uniform(0.1, 4, 64).astype(np.float32), rng.uniform(-3, 3, 64).astype(np.float32)
  out, _ = run_kernel(dev, elementwise("E_tr", 64, dtypes.float, lambda p, q: p.sqrt() + q.exp2() / p), x, y)
  np.testing.assert_allclose(out, np.sqrt(x) + np.exp2(y) / x, rtol=2e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_reduce_kernel_with_a_loop(dev):
  a = np.random.default_rng(3).standard_normal((8, 37)).astype(np.float32)
  out_p, in_p = UOp(Ops.PARAM, dtypes.float.ptr(8), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(8 * 37), arg=1)
  i, r = UOp.range(8, 0), UOp.range(37, 1, AxisType.REDUCE)
  red = UOp(Ops.REDUCE, dtypes.float, (in_p.index(i * 37 + r).load(), r), Ops.ADD)
  ast = out_p.index(i).store(red).sink(arg=KernelInfo("r_8_37"))
  out, _ = run_kernel(dev, ast, a.reshape(-1), out_size=8)
  np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_kernels_are_ordered_by_the_timeline_and_copies_round_trip():
  dev = Device["MOCK+AMD"]
  ast = elementwise("E_64", 64, dtypes.float, lambda x, y: x + y)
  spec = get_program(ast, dev.renderer)
  prg = dev.get_program(spec.name, spec.lib)
  a = np.arange(64, dtype=np.float32)
  ba, bb = Buffer("MOCK+AMD", 64, dtypes.float).copyin(memoryview(a)), Buffer("MOCK+AMD", 64, dtypes.float)
  for _ in range(3):  # b = a + a; a = b + b ... queued back to back, no host sync in between
    prg(bb._buf, ba._buf, ba._buf, global_size=spec.global_size, local_size=spec.local_size)
    prg(ba._buf, bb._buf, bb._buf, global_size=spec.global_size, local_size=spec.local_size)
  np.testing.assert_array_equal(ba.numpy(), a * 64)
  # copies bigger than the staging buffer, and device-to-device
  alloc = HCQAllocator(dev, batch_size=0x1000)
  big = np.random.default_rng(4).integers(0, 255, 0x3010, dtype=np.uint8)
  x, y = alloc.alloc(big.nbytes), alloc.alloc(big.nbytes)
  alloc._copyin(x, memoryview(big))
  alloc._transfer(y, x, big.nbytes)
  back = bytearray(big.nbytes)
  alloc._copyout(memoryview(back), y)
  assert bytes(back) == big.tobytes()


def test_mock_dispatch_counts_and_unsupported_code_errors():
  from tiny_runtime_amd.mock.driver import driver
  dev = Device["MOCK+AMD"]
  before = driver().dispatches
  out, _ = run_kernel("MOCK+AMD", elementwise("E_16", 16, dtypes.float, lambda x, y: x.maximum(y)),
                      np.arange(16, dtype=np.float32), np.full(16, 7.5, np.float32))
  np.testing.assert_array_equal(out, np.maximum(np.arange(16), 7.5).astype(np.float32))
  assert driver().dispatches == before + 1
  assert dev.arch == "gfx1100" and dev.renderer.arch == "gfx1100"


def test_a_faulting_kernel_raises_and_the_device_keeps_working():
  from tiny_runtime_amd.emu.encode import endpgm, glob
  from tiny_runtime_amd.mock.driver import GPUPageFault
  from tiny_runtime_amd.pm4 import AMDComputeQueue
  dev = Device["MOCK+AMD"]
  code = dev.iface.alloc(0x1000, host=True)
  words = glob(20, vdst=1, addr=0, saddr=0) + endpgm() + [0] * 8  # load from s[0:1] + v0: s[0:1] = user data 0x10
  code.host_view()[:4 * len(words)] = struct.pack(f"<{len(words)}I", *words)

  class Faulty:  # the attributes AMDComputeQueue.exec reads from a program
    entry_addr, rsrc1, rsrc2, rsrc3, tmpring_size = code.va_addr, 1 << 20, 2 << 1, 0, 0  # RSRC1.PRIV: see AMDProgram
    def user_data(self, args): return [0x10, 0]
    def scratch(self): return None
  q = AMDComputeQueue().wait(dev.timeline_signal, dev.timeline_value - 1).memory_barrier() \
    .exec(Faulty(), 0, (1, 1, 1), (32, 1, 1))
  q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  with pytest.raises(GPUPageFault, match="read of 4 bytes at 0x10"): dev.synchronize()
  out, _ = run_kernel("MOCK+AMD", elementwise("E_8", 8, dtypes.float, lambda x, y: x + y),
                      np.ones(8, np.float32), np.ones(8, np.float32))
  assert out.tolist() == [2.0] * 8
  dev.iface.free(code)


def shared_reverse(n: int, groups: int) -> UOp:
  """out[g*n + l] = in[g*n + n-1-l] through an LDS tile and a barrier (n work-items per group: n/32 waves)."""
  from tiny_uop.dtype import AddrSpace
  d0, d1 = UOp(Ops.PARAM, dtypes.float.ptr(groups * n), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(groups * n), arg=1)
  cn = UOp.const(dtypes.int32, n)
  g = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, groups),), "gidx0")
  lid = UOp(Ops.SPECIAL, dtypes.int32, (cn,), "lidx0")
  tmp = UOp(Ops.DEFINE_LOCAL, dtypes.float.ptr(n, AddrSpace.LOCAL), arg=0)
  gi = g * cn + lid
  bar = UOp(Ops.BARRIER, dtypes.void, (tmp.index(lid).store(d1.index(gi).load()),))
  ld = UOp(Ops.LOAD, dtypes.float, (tmp.index(UOp.const(dtypes.int32, n - 1) - lid), bar))
  return UOp(Ops.SINK, dtypes.void, (d0.index(gi).store(ld),), KernelInfo("shared_reverse"))


@pytest.mark.parametrize("dev", DEVICES)
def test_lds_and_barrier_across_waves(dev):
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  d = Device[dev]
  n, groups = 96, 3  # three waves per work-group: each reads what another wave wrote before the barrier
  lib = d.renderer.make_compiler().compile(AMDGPURenderer(d.arch).render(list(shared_reverse(n, groups).toposort())))
  x = np.arange(n * groups, dtype=np.float32)
  out, inp = Buffer(dev, n * groups, dtypes.float), Buffer(dev, n * groups, dtypes.float).copyin(memoryview(x))
  d.get_program("shared_reverse", lib)(out._buf, inp._buf, global_size=(groups, 1, 1), local_size=(n, 1, 1), wait=True)
  np.testing.assert_array_equal(out.numpy(), x.reshape(groups, n)[:, ::-1].reshape(-1))


def _scratch_kernel(n: int) -> str:
  """LLVM IR: copy in[0..n) into a private array (scratch), then out[tid] = private[tid % n]."""
  return f'''
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @scr{n}(ptr addrspace(1) %out, ptr addrspace(1) %in) {{
entry:
  %arr = alloca [{n} x float], align 4, addrspace(5)
  %lid = call i32 @llvm.amdgcn.workitem.id.x()
  %gid = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %gid, 32
  %tid = add i32 %base, %lid
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%i1, %loop]
  %p = getelementptr float, ptr addrspace(1) %in, i32 %i
  %v = load float, ptr addrspace(1) %p
  %q = getelementptr [{n} x float], ptr addrspace(5) %arr, i32 0, i32 %i
  store volatile float %v, ptr addrspace(5) %q
  %i1 = add i32 %i, 1
  %c = icmp ult i32 %i1, {n}
  br i1 %c, label %loop, label %done
done:
  %idx = urem i32 %tid, {n}
  %r = getelementptr [{n} x float], ptr addrspace(5) %arr, i32 0, i32 %idx
  %x = load volatile float, ptr addrspace(5) %r
  %o = getelementptr float, ptr addrspace(1) %out, i32 %tid
  store float %x, ptr addrspace(1) %o
  ret void
}}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
'''


def test_scratch_kernels_grow_the_scratch_buffer_and_run(monkeypatch):
  from tiny_codegen.compiler.amdgpu import AMDGPUCompiler
  from tiny_runtime_amd import pm4
  from tiny_runtime_amd.mock.driver import driver
  dev = Device["MOCK+AMD"]
  emu, seen = driver().emu, []
  real_run_launch = emu.run_launch
  monkeypatch.setattr(emu, "run_launch", lambda entry, launch: (seen.append([launch.scratch_size] * launch.n_waves),
                                                                real_run_launch(entry, launch))[1])
  comp = AMDGPUCompiler(dev.arch)
  rng = np.random.default_rng(5)
  engines = dev.iface.node.shader_engines  # gfx1100: 12 shader arrays, 2 per engine
  per_se = dev.iface.node.cu_count // engines * 32  # TMPRING_SIZE.WAVES: one engine's wave slots (16 CUs x 32)
  assert (engines, per_se) == (6, 512)
  for n in (40, 72, 100):
    prg = dev.get_program(f"scr{n}", comp.compile(_scratch_kernel(n)))
    assert prg.private_size >= 4 * n
    wave = (prg.private_size * 32 + 255) // 256 * 256
    assert dev.scratch_wave_bytes >= wave and dev.scratch_buf.size >= engines * per_se * dev.scratch_wave_bytes
    assert dev.tmpring_size == per_se | (dev.scratch_wave_bytes // 256) << 12
    x = rng.standard_normal(n).astype(np.float32)
    bin_, bout = Buffer("MOCK+AMD", n, dtypes.float).copyin(memoryview(x)), Buffer("MOCK+AMD", 96, dtypes.float)
    prg(bout._buf, bin_._buf, global_size=(3, 1, 1), local_size=(32, 1, 1), wait=True)
    np.testing.assert_array_equal(bout.numpy(), x[np.arange(96) % n])
    assert seen[-1] == [dev.scratch_wave_bytes // 32] * 3  # each of the 3 waves got each lane's private size
    regs = driver().queues[dev.compute_ring.queue_id].regs
    assert regs[pm4.COMPUTE_TMPRING_SIZE] == dev.tmpring_size
    assert regs[pm4.COMPUTE_DISPATCH_SCRATCH_BASE_LO] == (dev.scratch_buf.va_addr >> 8) & 0xFFFFFFFF
  assert len(dev._old_scratch) >= 1  # it grew, and kept the smaller buffers that earlier command buffers refer to


@pytest.mark.parametrize("arch", [None, "gfx942"])
def test_copy_queue_signals_reach_the_host(arch):
  """The copy queue's fences must be uncached (SDMA v6: MTYPE 3, as amdgpu): a cached fence sits in the GPU's L2 and
  the host waiting for the signal (or KFD reading the event mailbox) never sees it."""
  from tiny_uop.helpers import Context
  name = "MOCK+AMD" if arch is None else "MOCK+AMD:LLVM:gfx942"
  with Context(DEV=name):
    dev = Device[name]
    sig = dev.new_signal()
    dev.hw_copy_queue_t().signal(sig, 0x1_0000_0005).submit(dev)
    sig.wait(0x1_0000_0005, timeout_ms=2000)
    src = np.arange(64, dtype=np.float32)
    buf = Buffer(name, 64, dtypes.float).copyin(memoryview(src))  # through the SDMA queue, waited on by the host
    np.testing.assert_array_equal(buf.numpy(), src)
