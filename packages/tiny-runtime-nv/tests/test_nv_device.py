"""The NV driver end to end on MOCK+NV (GPU 0: an H200, Hopper classes; GPU 1: an A100, Ampere classes): RM objects
and UVM mappings it creates, copies through the copy engine, QMD launches of real ptxas cubins checked against the
cubin's facts, faults the device survives and reports, and what the mock rejects (a wrong method, a misaligned
semaphore, a QMD field out of range, an unsupported driver)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tiny_codegen import get_program
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device

from tiny_runtime_nv import push, rm
from tiny_runtime_nv.cubin import load_kernel_info
from tiny_runtime_nv.push import NVComputeQueue, NVCopyQueue

DEVS = ["MOCK+NV", "MOCK+NV:1"]


def _driver():
  from tiny_runtime_nv.mock.rm import driver
  return driver()


def _add_kernel(dev, n=256, name="E_add"):
  c, a, b = [UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i in range(3)]
  i = UOp.range(n, 0)
  spec = get_program(c.index(i).store(a.index(i).load() + b.index(i).load()).sink(arg=KernelInfo(name)), dev.renderer)
  return spec, dev.get_program(spec.name, spec.lib)


def _bufs(dev_name, *arrays):
  return [Buffer(dev_name, a.size, dtypes.float).copyin(memoryview(a)) for a in arrays]


@pytest.mark.parametrize("name", DEVS)
def test_device_picks_the_gpus_classes_and_arch(name):
  dev = Device[name]
  hopper = name == "MOCK+NV"
  assert dev.arch == ("sm_90" if hopper else "sm_80")
  assert dev.compute_class == (rm.HOPPER_COMPUTE_A if hopper else rm.AMPERE_COMPUTE_A)
  assert dev.gpfifo_class == (rm.HOPPER_CHANNEL_GPFIFO_A if hopper else rm.AMPERE_CHANNEL_GPFIFO_A)
  assert dev.dma_class == (rm.HOPPER_DMA_COPY_A if hopper else rm.AMPERE_DMA_COPY_A)
  d = _driver()
  # every channel and its engine objects are RM objects of the right classes, under a scheduled channel group
  for fifo, engine in ((dev.compute_fifo, dev.compute_class), (dev.copy_fifo, dev.dma_class)):
    ch = d.objects[fifo.handle]
    assert ch.cls == dev.gpfifo_class and d.objects[ch.parent].data["scheduled"]
    assert engine in d.gpus[ch.gpu].channels[fifo.handle].engines
  # buffers: GPU VA == CPU VA, mapped through UVM
  buf = dev.allocator.alloc(1000)
  assert buf.va_addr in d.mapped and d.mapped[buf.va_addr][0] == 4096 and buf.va_addr in d.ranges
  dev.allocator.free(buf, 1000)


@pytest.mark.parametrize("name", DEVS)
def test_copies_through_the_copy_engine(name):
  dev = Device[name]
  x = (np.arange(3 << 18, dtype=np.float32) * 0.5)  # 3 MiB: more than one 2 MiB staging batch
  a, b = _bufs(name, x, np.zeros_like(x))
  before = {h: c.get for h, c in _driver().gpus[int(name.endswith(":1"))].channels.items()}
  dev.allocator._transfer(b._buf, a._buf, x.nbytes)
  np.testing.assert_array_equal(b.numpy(), x)
  after = _driver().gpus[int(name.endswith(":1"))].channels
  assert after[dev.copy_fifo.handle].get != before[dev.copy_fifo.handle]  # the copy channel did the work


@pytest.mark.parametrize("name", DEVS)
def test_launch_runs_the_real_cubin_and_the_qmd_carries_its_facts(name):
  dev = Device[name]
  spec, prg = _add_kernel(dev)
  info = load_kernel_info(spec.lib, spec.name)   # the ptxas cubin's .nv.info
  assert info.arch == dev.arch and info.registers > 0 and info.param_size == 3 * 8
  xs = [np.arange(256, dtype=np.float32), np.full(256, 0.25, np.float32)]
  ins = _bufs(name, *xs)
  out = _bufs(name, np.zeros(256, np.float32))[0]
  prg(out._buf, *[b._buf for b in ins], global_size=spec.global_size, local_size=spec.local_size, wait=True)
  np.testing.assert_array_equal(out.numpy(), xs[0] + xs[1])
  q = _driver().gpus[int(name.endswith(":1"))].last_qmd
  assert q["version"] == (4 if name == "MOCK+NV" else 3)  # Hopper's compute class reads QMD 04_00, Ampere's 03_00
  assert q["program"] == prg.image.va_addr + info.text_offset
  assert q["registers"] == info.registers and q["shared"] == prg.shared_size >= info.shared_size
  assert q["grid"] == tuple(spec.global_size) and q["block"] == tuple(spec.local_size)
  assert q["sass_version"] == (0x90 if name == "MOCK+NV" else 0x80)
  cb0, size = q["cb0"]
  assert size >= info.param_offset + info.param_size
  params = ctypes.string_at(cb0 + info.param_offset, 24)
  assert np.frombuffer(params, np.uint64).tolist() == [out._buf.va_addr, ins[0]._buf.va_addr, ins[1]._buf.va_addr]


def test_a_faulting_kernel_is_reported_and_the_device_keeps_working():
  dev = Device["MOCK+NV"]
  spec, prg = _add_kernel(dev, name="E_fault")
  a, b = _bufs("MOCK+NV", np.ones(256, np.float32), np.ones(256, np.float32))
  with pytest.raises(RuntimeError, match=r"compute channel reported error 31 .*fault: ld.global of 4 bytes at 0x1000"):
    prg(a._buf, b._buf, type(b._buf)(0x1000, 1024), global_size=spec.global_size, local_size=spec.local_size,
        wait=True)
  out = _bufs("MOCK+NV", np.zeros(256, np.float32))[0]
  prg(out._buf, a._buf, b._buf, global_size=spec.global_size, local_size=spec.local_size, wait=True)
  np.testing.assert_array_equal(out.numpy(), np.full(256, 2, np.float32))


def _rejected(dev, q, match):
  q.submit(dev)
  with pytest.raises(RuntimeError, match=match): dev.progress()
  dev.progress()  # reported once: the channel goes on
  dev.synchronize()


def test_mock_rejects_an_unknown_method():
  dev = Device["MOCK+NV"]
  _rejected(dev, NVComputeQueue().m(0x1234, 7), r"error 13.*unknown method 0x1234 for compute class 0xcbc0")
  _rejected(dev, NVCopyQueue().m(0x1234, 7), r"unknown method 0x1234 for copy class 0xc8b5")
  _rejected(dev, NVComputeQueue().m(push.INVALIDATE_SHADER_CACHES_NO_WFI, 1 << 7),
            r"compute method 0x1698 = 0x80: bits 0x80 outside its fields")
  _rejected(dev, NVComputeQueue().bind_object(rm.AMPERE_COMPUTE_A),
            r"SET_OBJECT of class 0xc6c0, which channel 0x[0-9a-f]+ has no object of")
  _rejected(dev, NVComputeQueue().q(push.method(6, 0x300, 1), 0), r"method 0x300 on subchannel 6, which no SET_OBJECT")


def test_mock_rejects_a_misaligned_or_unmapped_semaphore():
  dev = Device["MOCK+NV"]
  sig = dev.new_signal()
  _rejected(dev, NVComputeQueue().release(sig.addr + 4, 1), r"semaphore at 0x[0-9a-f]+ is not 8-byte aligned")
  _rejected(dev, NVComputeQueue().release(sig.addr + 8, 1, timestamp=True), r"not 16-byte aligned \(a timestamped")
  _rejected(dev, NVComputeQueue().release(0x1000, 1), r"error 31.*semaphore of 8 bytes at 0x1000 is not mapped")
  assert sig.value == 0


def test_ampere_semaphore_addresses_have_40_bits():
  dev = Device["MOCK+NV:1"]
  _rejected(dev, NVComputeQueue().release(1 << 41, 1), r"bits outside SEM_ADDR_LO \(31:2\) / SEM_ADDR_HI \(7:0\)")


def _launch_qmd(dev, prg, spec, out, ins, **override):
  base = dev.kernargs_alloc(prg.args_layout(3, 0).size)
  prg.fill_args(base, [out._buf.va_addr] + [b._buf.va_addr for b in ins], [])
  prg.fill_launch(base, spec.global_size, spec.local_size)
  qmd, ver = base + prg.cb0_size, prg.qmd_version
  if override:
    q = push.QMD(ctypes.string_at(qmd, ver.size), ver)
    for k, v in override.items(): q[ver.registers if k == "REGISTERS" else k] = v
    ctypes.memmove(qmd, bytes(q), ver.size)
  return NVComputeQueue().launch(qmd)


def test_mock_rejects_qmd_fields_out_of_range():
  dev = Device["MOCK+NV"]
  spec, prg = _add_kernel(dev, name="E_qmd")
  ins = _bufs("MOCK+NV", np.ones(256, np.float32), np.ones(256, np.float32))
  out = _bufs("MOCK+NV", np.zeros(256, np.float32))[0]
  regs = prg.info.registers
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, REGISTERS=regs - 1),
            rf"uses {regs} registers; the QMD gives {regs - 1}")
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, CTA_THREAD_DIMENSION2=65), r"z <= 64")
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, QMD_MINOR_VERSION=1), r"QMD version 4\.1")
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, QMD_TYPE=3), r"QMD_TYPE 3: the mock runs GRID_CTA")
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, SHARED_MEMORY_SIZE=250 << 10), r"SHARED_MEMORY_SIZE 256000")
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, CONSTANT_BUFFER_SIZE_SHIFTED4_0=1),
            r"constant buffer 0 of 16 bytes")
  # a bit set outside every field the mock implements (QMD 04_00 RELEASE_ENABLE(0), bit 320)
  base = dev.kernargs_alloc(prg.args_layout(3, 0).size)
  prg.fill_args(base, [out._buf.va_addr] + [b._buf.va_addr for b in ins], [])
  prg.fill_launch(base, spec.global_size, spec.local_size)
  ctypes.c_uint32.from_address(base + prg.cb0_size + 40).value |= 1
  _rejected(dev, NVComputeQueue().launch(base + prg.cb0_size), r"QMD bits set outside the fields .* at bit 320")
  assert out.numpy().tolist() == [0.0] * 256  # nothing ran


def test_mock_rejects_what_the_hardware_and_driver_tables_forbid():
  """One case per launch-rule family, each with its source (mock/gpu.py cites them): the SM version nibbles
  (SASS_VERSION), the block limits of the CUDA guide's technical specifications, the shared-memory carveout encoding
  (Mesa gv100_sm_config_smem_size: KiB / 4 + 1) and the SM's carveout maximum, and constant bank 0's driver area
  (the shared and local windows at bytes 0x18 and 0x20)."""
  dev = Device["MOCK+NV"]  # an H200: sm_90, 227 KB of shared memory a block
  spec, prg = _add_kernel(dev, name="E_rules")
  ins = _bufs("MOCK+NV", np.ones(256, np.float32), np.ones(256, np.float32))
  out = _bufs("MOCK+NV", np.zeros(256, np.float32))[0]
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, SASS_VERSION=0x80), r"SASS_VERSION 0x80; this GPU runs 0x90")
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, CTA_THREAD_DIMENSION0=1025), r"<= 1024 threads")
  # 8 KiB of shared memory in a carveout of target 2 (4 KiB): too small; a max of 63 (248 KiB): beyond the SM
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, SHARED_MEMORY_SIZE=8192, MIN_SM_CONFIG_SHARED_MEM_SIZE=1,
                             TARGET_SM_CONFIG_SHARED_MEM_SIZE=2), r"carveout min 1 <= target 2 <= max")
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, MAX_SM_CONFIG_SHARED_MEM_SIZE=63), r"carveout .* max 63")
  base = dev.kernargs_alloc(prg.args_layout(3, 0).size)
  prg.fill_args(base, [out._buf.va_addr] + [b._buf.va_addr for b in ins], [])
  prg.fill_launch(base, spec.global_size, spec.local_size)
  ctypes.c_uint64.from_address(base + 0x18).value ^= 0x1000  # the shared window, moved
  _rejected(dev, NVComputeQueue().launch(base + prg.cb0_size), r"constant bank 0 holds windows")
  assert out.numpy().tolist() == [0.0] * 256  # nothing ran


def test_an_unsupported_driver_is_a_clear_error(monkeypatch):
  from tiny_runtime_nv.device import NVDevice
  from tiny_runtime_nv.mock import rm as mrm
  monkeypatch.setattr(mrm, "VERSION", "610.12.3")
  with pytest.raises(RuntimeError, match=r"NVIDIA driver 610\.12\.3 is not supported.*570\.x, 580\.x"):
    NVDevice("MOCK+NV")


def test_no_gpu_reasons():
  from tiny_runtime_nv.rm import RMIface
  from tiny_uop.hcq import FileIOInterface

  class NoDriver(FileIOInterface):
    @staticmethod
    def exists(path): return False

  class NoUVM(FileIOInterface):
    @staticmethod
    def exists(path): return path == rm.NVIDIACTL
    @staticmethod
    def access(path, mode): return True

  class NoPermission(FileIOInterface):
    @staticmethod
    def exists(path): return True
    @staticmethod
    def access(path, mode): return False
  with pytest.raises(RuntimeError, match=r"no NVIDIA GPU \(/dev/nvidiactl missing"): RMIface(NoDriver)
  with pytest.raises(RuntimeError, match=r"/dev/nvidia-uvm missing: the nvidia-uvm module"): RMIface(NoUVM)
  with pytest.raises(RuntimeError, match=r"/dev/nvidiactl is not readable and writable"): RMIface(NoPermission)


def test_rm_refuses_bad_calls_with_their_status():
  dev = Device["MOCK+NV"]
  r = dev.rm
  with pytest.raises(rm.RMError, match=r"class 0x1234 .* failed: NV_ERR_INVALID_CLASS"):
    r.alloc(dev.handles.device, 0x1234)
  with pytest.raises(rm.RMError, match=r"NV_ERR_INVALID_CLASS"):  # the H200 has no Ampere compute class
    r.alloc(dev.compute_fifo.handle, rm.AMPERE_COMPUTE_A)
  with pytest.raises(rm.RMError, match=r"NV_ERR_INVALID_OBJECT_PARENT"):
    r.alloc(dev.handles.device, rm.HOPPER_COMPUTE_A)
  with pytest.raises(rm.RMError, match=r"UVM_CREATE_EXTERNAL_RANGE failed: NV_ERR_INVALID_ADDRESS"):
    r.uvm(rm.UVM_CREATE_EXTERNAL_RANGE, base=dev.kernargs.va_addr, length=0x1000)  # overlaps a range
  with Context(DEV="MOCK+NV"):
    assert Device["MOCK+NV"] is dev  # the device still works: the failed calls left its state alone
  spec, prg = _add_kernel(dev, name="E_after")
  ins = _bufs("MOCK+NV", np.ones(256, np.float32), np.ones(256, np.float32))
  out = _bufs("MOCK+NV", np.zeros(256, np.float32))[0]
  prg(out._buf, *[b._buf for b in ins], global_size=spec.global_size, local_size=spec.local_size, wait=True)
  assert out.numpy().tolist() == [2.0] * 256


def test_the_drivers_jit_builds_cubins_the_nv_device_runs():
  # a machine with the NVIDIA driver but no ptxas: cubins come from libcuda's JIT linker (here the mock libcuda's)
  from tiny_runtime_nv.cuda import Driver
  from tiny_runtime_nv.jit import DriverJITCompiler
  from tiny_runtime_nv.mock.compiler import with_ptx
  from tiny_runtime_nv.mock.libcuda import mock_libcuda
  from tiny_uop.device import CompileError
  dev = Device["MOCK+NV"]
  spec, _ = _add_kernel(dev, name="E_jit")
  jit = DriverJITCompiler("sm_90", Driver(mock_libcuda()))
  lib = jit.compile(spec.src)
  info = load_kernel_info(lib, "E_jit")
  assert info.arch == "sm_90" and [p.size for p in info.params] == [8, 8, 8]
  prg = dev.get_program("E_jit", with_ptx(lib, spec.src))  # the mock GPU runs the PTX kept beside the cubin
  ins = _bufs("MOCK+NV", np.arange(256, dtype=np.float32), np.full(256, 3, np.float32))
  out = _bufs("MOCK+NV", np.zeros(256, np.float32))[0]
  prg(out._buf, *[b._buf for b in ins], global_size=spec.global_size, local_size=spec.local_size, wait=True)
  np.testing.assert_array_equal(out.numpy(), np.arange(256, dtype=np.float32) + 3)
  with pytest.raises(CompileError, match="the driver's JIT rejected the PTX for sm_90: cuLinkAddData_v2 failed: "
                                         "CUDA_ERROR_INVALID_PTX"):
    jit.compile("not ptx")


def test_host_memory_is_allocated_on_the_gpus_own_file():
  # NV_ESC_RM_ALLOC_MEMORY (OS-descriptor host memory: the command queue, signals, the FIFOs' error notifiers) is an
  # "actual device" escape (escape.c RmIoctl, NV_ACTUAL_DEVICE_ONLY): on /dev/nvidiactl RM fails it with EINVAL
  dev = Device["MOCK+NV"]
  d = _driver()
  sent: list[tuple[str, int]] = []
  orig = d.escape
  def spy(fd, nr, size, buf):
    sent.append((d.files[fd][0], nr))
    return orig(fd, nr, size, buf)
  d.escape = spy
  try: buf = dev.mem.alloc(0x2000, host=True)
  finally: del d.escape
  assert (f"/dev/nvidia{dev.handles.minor}", rm.ESC_RM_ALLOC_MEMORY) in sent
  assert all(path == rm.NVIDIACTL for path, nr in sent if nr != rm.ESC_RM_ALLOC_MEMORY)
  ctypes.memmove(buf.va_addr, b"\x2a" * 16, 16)  # our own pages, visible at the GPU address
  assert d.mems[buf.meta.handle].kind == "os" and d.mems[buf.meta.handle].backing == buf.va_addr
  dev.mem.free(buf)


def test_mock_rejects_escapes_on_the_wrong_file_like_rm():
  from tiny_runtime_nv.mock.rm import ESCAPE_FILES
  dev = Device["MOCK+NV"]
  r = dev.rm
  # the rule table covers every escape the driver sends
  assert set(ESCAPE_FILES) == set(rm.ESCAPES) | {rm.ESC_CARD_INFO}
  args = r._new("nv_ioctl_nvos02_parameters_with_fd", {"fd": -1})
  p = args.params
  p.hRoot, p.hObjectParent, p.hObjectNew, p.hClass = r.root, dev.handles.device, 0xCAFE0F00, \
    rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
  with pytest.raises(rm.RMError, match=r"RM alloc of OS memory: ioctl failed: EINVAL"):
    r.escape(r.ctl, rm.ESC_RM_ALLOC_MEMORY, args, "RM alloc of OS memory")
  ctl_only = r._new("NVOS54_PARAMETERS", {"hClient": r.root, "hObject": r.root})
  with pytest.raises(rm.RMError, match=r"ioctl failed: EINVAL"):  # RM_CONTROL is NV_CTL_DEVICE_ONLY
    r.escape(dev.gpu_fd, rm.ESC_RM_CONTROL, ctl_only, "RM control")
  cards = r.ffi.new(f"nv_ioctl_card_info_t[{rm.MAX_CARDS}]")
  with pytest.raises(OSError) as e:  # nv.c nvidia_ioctl: NV_ESC_CARD_INFO is NV_CTL_DEVICE_ONLY
    dev.gpu_fd.ioctl(rm.escape_number(rm.ESC_CARD_INFO, r.ffi.sizeof(cards)), r.ffi.buffer(cards))
  assert e.value.errno == 22
  assert 0xCAFE0F00 not in _driver().objects


@pytest.mark.parametrize("name", DEVS)
def test_each_compute_class_gets_its_qmd_version_and_the_mock_rejects_the_other(name):
  """HOPPER_COMPUTE_A reads QMD 04_00 (clcbc0qmd.h; Mesa NVK's Hopper launches), the Ampere/Ada classes 03_00: the
  driver builds the class's version, and the mock refuses a QMD of the other version on that class (the old driver
  launched 03_00 on Hopper)."""
  dev = Device[name]
  hopper = name == "MOCK+NV"
  spec, prg = _add_kernel(dev, name="E_qmdver")
  assert prg.qmd_version is (push.QMD_04_00 if hopper else push.QMD_03_00)
  assert push.qmd_of_class(rm.HOPPER_COMPUTE_A).major == 4 and push.qmd_of_class(rm.AMPERE_COMPUTE_A).major == 3
  with pytest.raises(ValueError, match=r"compute class 0x1234 has no known QMD version"): push.qmd_of_class(0x1234)
  ins = _bufs(name, np.ones(256, np.float32), np.ones(256, np.float32))
  out = _bufs(name, np.zeros(256, np.float32))[0]
  other = 3 if hopper else 4
  _rejected(dev, _launch_qmd(dev, prg, spec, out, ins, QMD_MAJOR_VERSION=other),
            rf"QMD version {other}\.x on compute class {dev.compute_class:#x}, which reads QMD {7 - other}\.0")
  assert out.numpy().tolist() == [0.0] * 256  # nothing ran
  q = push.QMD(version=push.QMD_04_00)
  q.set_cb0(0x12_3456_7840)
  assert (q["CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_0"], q.cb0()) == (0x12_3456_7840 >> 6 & 0xFFFFFFFF, 0x12_3456_7840)
  with pytest.raises(ValueError, match="not 64-aligned"): q.set_cb0(0x1020)


LAUNCH_SIZE_PTX = """.version 7.8
.target {arch}
.address_size 64
.visible .entry k_dims(.param .u64 out)
{{
  .reg .b64 %rd<3>; .reg .b32 %r<7>;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %ntid.x; mov.u32 %r2, %ntid.y; mov.u32 %r3, %ntid.z;
  mov.u32 %r4, %nctaid.x; mov.u32 %r5, %nctaid.y; mov.u32 %r6, %nctaid.z;
  st.global.u32 [%rd2], %r1; st.global.u32 [%rd2+4], %r2; st.global.u32 [%rd2+8], %r3;
  st.global.u32 [%rd2+12], %r4; st.global.u32 [%rd2+16], %r5; st.global.u32 [%rd2+20], %r6;
  ret;
}}
"""


@pytest.mark.parametrize("dev_name", DEVS)
def test_launch_sizes_reach_constant_bank_0(dev_name):
  """ptxas-compiled code reads %ntid and %nctaid from constant bank 0 bytes 0x0-0x14 (tests/test_nv_cubin.py
  test_cbank0_driver_area_is_what_ptxas_code_reads), so the driver writes the launch there, as the QMD has it; the
  mock refuses a kernel that reads them when the bank holds other numbers. The answer is the launch itself."""
  from tiny_codegen.compiler.ptx import PTXCompiler

  from tiny_runtime_nv.mock.compiler import with_ptx
  dev = Device[dev_name]
  src = LAUNCH_SIZE_PTX.format(arch=dev.arch)
  prg = dev.get_program("k_dims", with_ptx(PTXCompiler(dev.arch, use_ptxas=True).compile(src), src))
  out = Buffer(dev_name, 8, dtypes.uint32).copyin(memoryview(np.zeros(8, np.uint32)))
  prg(out._buf, global_size=(3, 2, 5), local_size=(4, 2, 1), wait=True)
  assert out.numpy().tolist() == [4, 2, 1, 3, 2, 5, 0, 0]
  base = dev.kernargs_alloc(prg.args_layout(1, 0).size)
  prg.fill_args(base, [out._buf.va_addr], [])
  prg.fill_launch(base, (3, 2, 5), (4, 2, 1))
  ctypes.c_uint32.from_address(base + 0xC).value = 7  # %nctaid.x no longer the grid's
  _rejected(dev, NVComputeQueue().launch(base + prg.cb0_size), r"reads %ntid/%nctaid; constant bank 0 bytes 0x0-0x14")


def test_launch_fields_are_what_fill_launch_writes():
  """HCQ2 patches symbolic launch sizes through `launch_fields`: written bit by bit into a region, they must give
  the bytes `fill_launch` writes -- the QMD's grid and block, and constant bank 0's %ntid/%nctaid words."""
  dev = Device["MOCK+NV"]
  _, prg = _add_kernel(dev, name="E_fields")
  size = prg.args_layout(3, 0).size
  raw = (ctypes.c_uint8 * (size + 64))()
  base = (ctypes.addressof(raw) + 63) // 64 * 64  # constant bank 0 is 64-byte aligned
  prg.fill_args(base, [0x1000, 0x2000, 0x3000], [])
  prg.fill_launch(base, (3, 2, 5), (4, 2, 1))
  filled = ctypes.string_at(base, size)
  prg.fill_args(base, [0x1000, 0x2000, 0x3000], [])  # the same region afresh (the QMD holds its address)
  for bit, nbits, val in prg.launch_fields((3, 2, 5), (4, 2, 1)):
    word = ctypes.c_uint32.from_address(base + bit // 32 * 4)
    mask = ((1 << nbits) - 1) << (bit % 32)
    word.value = (word.value & ~mask) | ((val << (bit % 32)) & mask)
  assert ctypes.string_at(base, size) == filled
  assert filled[:24] == b"".join(v.to_bytes(4, "little") for v in (4, 2, 1, 3, 2, 5))
