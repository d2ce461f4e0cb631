"""The mock KGSL and its command processor reject what the hardware rejects: every malformed packet below is submitted
through the real driver's path (GPU_COMMAND of an IB in GPU memory) and faults with a message naming what is wrong;
the device keeps working afterwards. Also: KGSL ioctls check their arguments, and the decoder names registers."""
from __future__ import annotations

from typing import Any

import pytest
from tiny_uop.plugins import Device

from tiny_runtime_qcom import a6xx
from tiny_runtime_qcom.a6xx import pkt4, pkt7
from tiny_runtime_qcom.mock.cp import MalformedPacket, decode_header
from tiny_runtime_qcom.mock.driver import driver
from tiny_runtime_qcom.mock.gpu import GPUFault

DEV = "MOCK+QCOM"


@pytest.fixture(scope="module")
def dev():
  return Device[DEV]


def _submit(dev, dwords: list[int]) -> None:
  """Submit raw dwords and wait for them (the mock GPU runs at the wait)."""
  dev.submit_dwords(dwords)
  dev.kgsl.wait_timestamp(dev.kgsl.last_timestamp)


def _works(dev) -> None:
  from tiny_tensor import Tensor
  import numpy as np
  assert (Tensor(np.arange(8, dtype=np.float32), device=DEV) + 1).tolist() == list(range(1, 9))


@pytest.mark.parametrize("name, dwords, msg", [
  ("type-4 count parity", lambda s: [pkt4(a6xx.REG_SP_CS_CONFIG, 1) ^ (1 << 7), 0], "count parity"),
  ("type-4 register parity", lambda s: [pkt4(a6xx.REG_SP_CS_CONFIG, 1) ^ (1 << 27), 0], "register parity"),
  ("type-7 count parity", lambda s: [pkt7(a6xx.CP_WAIT_FOR_IDLE, 0) ^ (1 << 15)], "count parity"),
  ("type-7 opcode parity", lambda s: [pkt7(a6xx.CP_WAIT_FOR_IDLE, 0) ^ (1 << 23)], "opcode parity"),
  ("type-7 reserved bits", lambda s: [pkt7(a6xx.CP_WAIT_FOR_IDLE, 0) | (1 << 25)], "reserved bits 27:24"),
  ("a pm4 type-3 header", lambda s: [0xC0001000], "not a type-4 or type-7 packet"),
  ("unknown register", lambda s: [pkt4(0x8000, 1), 5], "register 0x8000"),
  ("unknown opcode", lambda s: [pkt7(0x7E, 0)], "opcode 0x7e"),
  ("packet past the IB", lambda s: [pkt7(a6xx.CP_NOP, 5), 0], "runs past the end"),
  ("short CP_EVENT_WRITE", lambda s: [pkt7(a6xx.CP_EVENT_WRITE, 2), a6xx.CACHE_FLUSH_TS, s & 0xFFFFFFFF], "expected 4"),
  ("unknown event", lambda s: [pkt7(a6xx.CP_EVENT_WRITE, 1), 0x3F], "event 63"),
  ("misaligned signal", lambda s: [pkt7(a6xx.CP_EVENT_WRITE, 4), a6xx.CACHE_FLUSH_TS, (s + 2) & 0xFFFFFFFF, s >> 32,
                                   1], "4-byte aligned"),
  ("unmapped signal", lambda s: [pkt7(a6xx.CP_EVENT_WRITE, 4), a6xx.CACHE_FLUSH_TS, 0x10, 0, 1], "page fault"),
  ("wait on register", lambda s: [pkt7(a6xx.CP_WAIT_REG_MEM, 6), a6xx.WRITE_GE, s & 0xFFFFFFFF, s >> 32, 0,
                                  0xFFFFFFFF, 1],
   "POLL_MEMORY"),
  ("wait that hangs", lambda s: [pkt7(a6xx.CP_WAIT_REG_MEM, 6), a6xx.WRITE_GE | a6xx.POLL_MEMORY << 4, s & 0xFFFFFFFF,
                                 s >> 32, 0xFFFFFFF0, 0xFFFFFFFF, 1], "would hang"),
  ("load state into a graphics block", lambda s: [pkt7(a6xx.CP_LOAD_STATE6_FRAG, 3),
                                                  a6xx.load_state6_0(a6xx.ST6_CONSTANTS, a6xx.SS6_INDIRECT, 4, 1),
                                                  s & 0xFFFFFFFF, s >> 32],
   "not compute state"),
  ("load state from a misaligned address", lambda s: [pkt7(a6xx.CP_LOAD_STATE6_FRAG, 3), a6xx.load_state6_0(
    a6xx.ST6_CONSTANTS, a6xx.SS6_INDIRECT, a6xx.SB6_CS_SHADER, 1), (s + 2) & 0xFFFFFFFF, s >> 32],
   "not 4-byte aligned"),
  ("dispatch without compute marker", lambda s: [pkt7(a6xx.CP_SET_MARKER, 1), 1, pkt7(a6xx.CP_RUN_OPENCL, 1), 0],
   "RM6_COMPUTE"),
  ("IB2 of zeros", lambda s: [pkt7(a6xx.CP_INDIRECT_BUFFER, 3), ((s & ~0xFFF) + 0x800) & 0xFFFFFFFF, s >> 32, 4],
   "bits 31:28 = 0"),
  ("always-on counter as 32 bits", lambda s: [pkt7(a6xx.CP_REG_TO_MEM, 3), a6xx.REG_CP_ALWAYS_ON_COUNTER | 1 << 18,
                                               s & 0xFFFFFFFF, s >> 32], "always-on counter"),
])
def test_malformed_packets_are_rejected(dev, name, dwords, msg):
  sig = dev.new_signal()
  rejected = driver().cp.stats["rejected"]
  with pytest.raises(GPUFault, match=msg):
    _submit(dev, dwords(sig.addr))
  assert driver().cp.stats["rejected"] == rejected + 1
  _works(dev)  # the faulting submission was retired; the device and its timeline go on


def test_nested_ib2_runs_but_ib3_is_rejected(dev):
  inner = dev._gpu_alloc(4096)
  sig = dev.new_signal()
  import ctypes
  ib2 = [pkt7(a6xx.CP_EVENT_WRITE, 4), a6xx.CACHE_FLUSH_TS, sig.addr & 0xFFFFFFFF, sig.addr >> 32, 77]
  (ctypes.c_uint32 * len(ib2)).from_address(inner.va_addr)[:] = ib2
  _submit(dev, [pkt7(a6xx.CP_INDIRECT_BUFFER, 3), inner.va_addr & 0xFFFFFFFF, inner.va_addr >> 32, len(ib2)])
  assert sig.value == 77
  ib3 = [pkt7(a6xx.CP_INDIRECT_BUFFER, 3), inner.va_addr & 0xFFFFFFFF, inner.va_addr >> 32, len(ib2)]
  (ctypes.c_uint32 * 4).from_address(inner.va_addr + 1024)[:] = ib3
  with pytest.raises(MalformedPacket, match="a6xx has no IB3"):
    _submit(dev, [pkt7(a6xx.CP_INDIRECT_BUFFER, 3), (inner.va_addr + 1024) & 0xFFFFFFFF, inner.va_addr >> 32, 4])
  dev._gpu_free(inner)


def test_dispatch_state_is_checked_against_the_binary(dev, monkeypatch):
  """A driver that programs a register footprint other than the binary's, a short const file, or a texture pitch
  that isn't 64-byte aligned is caught at the dispatch."""
  import numpy as np
  from tiny_tensor import Tensor
  from tiny_uop import Context
  x = np.arange(64, dtype=np.float32)
  monkeypatch.setattr(a6xx, "sp_cs_cntl_0", lambda t, h, f, b: h << 1 | (f + 1) << 7 | b << 14 | t << 20)
  with pytest.raises(MalformedPacket, match="footprint"): (Tensor(x, device=DEV) * 3).numpy()
  monkeypatch.undo()
  _works(dev)
  orig = a6xx.tex_const
  monkeypatch.setattr(a6xx, "tex_const", lambda d, storage=False: [w if i != 2 else w | (1 << 7)
                                                                   for i, w in enumerate(orig(d, storage))])
  with Context(IMAGE=1), pytest.raises(GPUFault, match="PITCH"):
    (Tensor(x, device=DEV).reshape(4, 16) @ Tensor(x, device=DEV).reshape(16, 4)).numpy()
  monkeypatch.undo()
  _works(dev)


def test_headers_decode_by_name():
  assert decode_header(pkt4(a6xx.REG_SP_CS_NDRANGE_0, 10), "t") == (4, a6xx.REG_SP_CS_NDRANGE_0, 10)
  assert decode_header(pkt7(a6xx.CP_LOAD_STATE6_FRAG, 3), "t") == (7, a6xx.CP_LOAD_STATE6_FRAG, 3)
  assert a6xx.REGISTERS[a6xx.REG_SP_CS_KERNEL_GROUP_X + 2] == "SP_CS_KERNEL_GROUP_Z"
  empty = a6xx.CP_TYPE4_PKT | a6xx.odd_parity_bit(0) << 7 | 0xA9B0 << 8 | a6xx.odd_parity_bit(0xA9B0) << 27
  with pytest.raises(MalformedPacket, match="writes no register"): decode_header(empty, "t")


def test_kgsl_ioctls_check_their_arguments(dev):
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  with pytest.raises(KGSLError, match="GPU_COMMAND.*EINVAL"):
    k.ioctl("GPU_COMMAND", cmdlist=0, cmdsize=7, numcmds=1, context_id=k.ctx)
  with pytest.raises(KGSLError, match="DRAWCTXT_CREATE"): k.ioctl("DRAWCTXT_CREATE", flags=1 << 31)
  with pytest.raises(KGSLError, match="GPUOBJ_ALLOC"): k.ioctl("GPUOBJ_ALLOC", size=100, flags=0, mmapsize=100)
  with pytest.raises(KGSLError, match="WAITTIMESTAMP"):
    k.ioctl("DEVICE_WAITTIMESTAMP_CTXTID", context_id=k.ctx, timestamp=k.last_timestamp + 5, timeout=10)
  # KGSL queues an IB at an unmapped address inside the process's GPU range (_verify_ib checks size and range, not
  # the mapping): the CP faults running it. 0x700000000 is KGSL's SVM base on a 64-bit process, never a mock object.
  ts = k.submit(0x700000000, 4)
  with pytest.raises(GPUFault, match="page fault"): k.wait_timestamp(ts)
  _works(dev)


def test_gpu_command_ib_outside_the_gpu_address_range_is_einval(dev):
  """adreno_dispatch.c _verify_ib -> kgsl_mmu.c kgsl_mmu_gpuaddr_in_range -> kgsl_iommu.c kgsl_iommu_addr_in_range:
  an IB at address 0, below KGSL_IOMMU_SVM_BASE32 (0x300000, the lowest range of a 64-bit process's pagetable) or past
  the last range is EINVAL at GPU_COMMAND, before anything is queued (no timestamp taken); the same IB at its object's
  address runs. Before the rule, these were queued and faulted only when waited for."""
  from tiny_runtime_qcom.kgsl import KGSLError
  from tiny_runtime_qcom.mock.driver import PT_RANGE
  k = dev.kgsl
  ib, sig = _ib_writing(dev, 77)
  queued = k.ioctl("CMDSTREAM_READTIMESTAMP_CTXTID", context_id=k.ctx, type=3).timestamp  # KGSL_TIMESTAMP_QUEUED
  for addr in (0, 0x1000, 0x2FFFFC, PT_RANGE[1], 1 << 63):
    with pytest.raises(KGSLError, match=f"GPU_COMMAND.*EINVAL.*{addr:#x} is outside"):
      k.submit(addr, 5)
  assert k.ioctl("CMDSTREAM_READTIMESTAMP_CTXTID", context_id=k.ctx, type=3).timestamp == queued
  sig.value = 0
  k.wait_timestamp(k.submit(ib.va_addr, 5))
  assert sig.value == 77
  dev._gpu_free(ib)
  _works(dev)


def test_gpuobj_alloc_and_context_flags_as_kgsl_decides(dev):
  """kgsl.c kgsl_ioctl_gpuobj_alloc / gpumem_alloc_entry: any size from 1 byte to UINT_MAX (rounded up to pages, the
  size and mmapsize written back), unknown flag bits dropped; adreno_drawctxt_create: unknown bits dropped, but a
  context without PREAMBLE and NO_GMEM_ALLOC is EINVAL (no legacy context switching)."""
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  obj = k.ioctl("GPUOBJ_ALLOC", size=100, flags=kgsl.MEMFLAGS_USE_CPU_MAP | 1 << 40, mmapsize=0)
  assert (obj.size, obj.mmapsize, obj.flags) == (0x1000, 0x1000, kgsl.MEMFLAGS_USE_CPU_MAP)
  k.ioctl("GPUOBJ_FREE", id=obj.id)
  for size in (0, 1 << 32):
    with pytest.raises(KGSLError, match="GPUOBJ_ALLOC.*EINVAL"):
      k.ioctl("GPUOBJ_ALLOC", size=size, flags=kgsl.MEMFLAGS_USE_CPU_MAP)
  with pytest.raises(KGSLError, match="DRAWCTXT_CREATE.*EINVAL"):
    k.ioctl("DRAWCTXT_CREATE", flags=kgsl.CONTEXT_PREAMBLE)  # NO_GMEM_ALLOC missing
  ctx = k.ioctl("DRAWCTXT_CREATE", flags=kgsl.CONTEXT_PREAMBLE | kgsl.CONTEXT_NO_GMEM_ALLOC | 1 << 31)
  assert ctx.flags == kgsl.CONTEXT_PREAMBLE | kgsl.CONTEXT_NO_GMEM_ALLOC
  k.ioctl("DRAWCTXT_DESTROY", drawctxt_id=ctx.drawctxt_id)
  _works(dev)


def test_gpu_command_without_commands_is_a_marker(dev):
  """kgsl.c _process_command_input: a GPU_COMMAND with no command objects (and no SYNC flag) is a marker, which
  retires with the context's next timestamp; more than KGSL_MAX_NUMIBS objects is EINVAL."""
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  before = k.last_timestamp
  m = k.ioctl("GPU_COMMAND", cmdlist=0, cmdsize=0, numcmds=0, context_id=k.ctx)
  assert m.timestamp == before + 1
  k.ioctl("DEVICE_WAITTIMESTAMP_CTXTID", context_id=k.ctx, timestamp=m.timestamp, timeout=10)
  ts = k.ioctl("CMDSTREAM_READTIMESTAMP_CTXTID", context_id=k.ctx, type=kgsl.TIMESTAMP_RETIRED)
  assert ts.timestamp == m.timestamp
  k.last_timestamp = m.timestamp
  with pytest.raises(KGSLError, match="GPU_COMMAND.*EINVAL"):
    k.ioctl("GPU_COMMAND", cmdlist=0, cmdsize=0, numcmds=100001, context_id=k.ctx)
  _works(dev)


def test_power_constraint_context_and_setproperty(dev):
  """tinygrad 0.14's driver, which runs on real a630s, creates its context with KGSL_CONTEXT_PWR_CONSTRAINT and sets
  KGSL_PROP_PWR_CONSTRAINT (PWRLEVEL, PWR_MAX) on it: msm_kgsl.h defines both (the flag 0x800, the property 0x12 with
  `struct kgsl_device_constraint`), so the mock accepts them; the struct is built here with the layout of tinygrad's
  header-generated `autogen/kgsl.py`, not ours. Bad constraints get EINVAL naming the valid values."""
  import ctypes

  import oracle

  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k, tk = dev.kgsl, oracle.kgsl()
  ctx = k.ioctl("DRAWCTXT_CREATE", flags=tk.KGSL_CONTEXT_PWR_CONSTRAINT | tk.KGSL_CONTEXT_PREAMBLE |
                tk.KGSL_CONTEXT_NO_GMEM_ALLOC).drawctxt_id

  def setprop(ctx_id: int, typ: int, level: int, size: int = 4, total: int | None = None) -> None:
    lvl = tk.struct_kgsl_device_constraint_pwrlevel(level=level)
    c = tk.struct_kgsl_device_constraint(type=typ, context_id=ctx_id, data=ctypes.addressof(lvl), size=size)
    k.ioctl("SETPROPERTY", type=tk.KGSL_PROP_PWR_CONSTRAINT, value=kgsl.ffi.cast("void*", ctypes.addressof(c)),
            sizebytes=ctypes.sizeof(c) if total is None else total)

  setprop(ctx, tk.KGSL_CONSTRAINT_PWRLEVEL, tk.KGSL_CONSTRAINT_PWR_MAX)
  assert driver().contexts[ctx]["pwr_constraint"] == tk.KGSL_CONSTRAINT_PWR_MAX
  setprop(ctx, tk.KGSL_CONSTRAINT_NONE, 0)
  assert driver().contexts[ctx]["pwr_constraint"] is None
  with pytest.raises(KGSLError, match="SETPROPERTY"): setprop(ctx, tk.KGSL_CONSTRAINT_PWRLEVEL, 2)
  with pytest.raises(KGSLError, match="SETPROPERTY"): setprop(ctx + 100, tk.KGSL_CONSTRAINT_PWRLEVEL, 1)
  with pytest.raises(KGSLError, match="SETPROPERTY"): setprop(ctx, tk.KGSL_CONSTRAINT_PWRLEVEL, 1, total=16)
  with pytest.raises(KGSLError, match="SETPROPERTY"): setprop(ctx, tk.KGSL_CONSTRAINT_PWRLEVEL, 1, size=8)
  k.ioctl("DRAWCTXT_DESTROY", drawctxt_id=ctx)
  _works(dev)


def test_const_config_constlen_zero_is_bounded_by_the_const_ram_mode(dev, monkeypatch):
  """SP_CS_CONST_CONFIG as tinygrad 0.14's a630 queue writes it (CONSTLEN 0 | ENABLED: its 256 overflows the 8-bit
  field) runs, bounded by SP_CS_CNTL_1.CONSTANTRAMMODE; a nonzero CONSTLEN below the loaded const file still faults."""
  import numpy as np
  from tiny_tensor import Tensor
  from tiny_runtime_qcom.mock import cp as mock_cp
  orig = mock_cp.CommandProcessor._regs
  x = np.linspace(-3, 3, 64, dtype=np.float32)

  def with_const_config(value: int):
    def regs(self, reg, vals, where):
      vals = tuple(value if reg + k == a6xx.REG_SP_CS_CONST_CONFIG else v for k, v in enumerate(vals))
      return orig(self, reg, vals, where)
    return regs

  monkeypatch.setattr(mock_cp.CommandProcessor, "_regs", with_const_config(a6xx.SP_CS_CONST_CONFIG_ENABLED))
  np.testing.assert_allclose((Tensor(x, device=DEV) * 3 - 1).numpy(), x * 3 - 1, rtol=1e-6)
  monkeypatch.setattr(mock_cp, "CONST_RAM_VEC4", (0, 0, 0, 0))  # a const RAM too small for any const file
  with pytest.raises(MalformedPacket, match="SP_CS_CONST_CONFIG"): (Tensor(x, device=DEV) * 5).numpy()
  monkeypatch.undo()
  _works(dev)


# ***** GPU_COMMAND lists, struct sizes and the other ioctls, as msm kgsl (sdm845's msm-4.9 kgsl) decides them *****
def _ib_writing(dev, value: int) -> tuple[Any, Any]:
  """A GPU object holding an IB that writes `value` to a fresh signal (CACHE_FLUSH_TS), and that signal."""
  import ctypes
  sig, ib = dev.new_signal(), dev._gpu_alloc(4096)
  dw = [pkt7(a6xx.CP_EVENT_WRITE, 4), a6xx.CACHE_FLUSH_TS, sig.addr & 0xFFFFFFFF, sig.addr >> 32, value]
  (ctypes.c_uint32 * len(dw)).from_address(ib.va_addr)[:] = dw
  return ib, sig


def _cmds(ibs: list[Any], stride: int = 32, flags: int = 1) -> Any:
  """`struct kgsl_command_object`s for `ibs` (5-dword IBs), laid out `stride` bytes apart (32: the struct's size)."""
  from tiny_runtime_qcom import kgsl
  buf = kgsl.ffi.new("char[]", stride * len(ibs) + 64)
  for i, ib in enumerate(ibs):
    o = kgsl.ffi.cast("struct kgsl_command_object*", kgsl.ffi.cast("char*", buf) + i * stride)
    o.gpuaddr, o.size, o.flags = ib.va_addr, 20, flags
  return buf


def _addr(cdata: Any) -> int:
  from tiny_runtime_qcom import kgsl
  return int(kgsl.ffi.cast("uintptr_t", cdata))


def test_gpu_command_lists_of_another_element_size(dev):
  """kgsl_drawobj.c kgsl_drawobj_cmd_add_cmdlist reads each command object with kgsl.h _copy_from_user(&obj, ptr,
  sizeof(obj), cmdsize): min(cmdsize, 32) bytes, the rest zero, and steps `ptr += sizeof(obj)` -- its own 32 bytes
  whatever cmdsize says. So a bigger cmdsize runs the objects laid out 32 bytes apart, a cmdsize that still covers
  the flags (28) runs them too, and one that ends before the flags (24) leaves them 0: EINVAL."""
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  (ib1, s1), (ib2, s2) = _ib_writing(dev, 11), _ib_writing(dev, 22)
  for cmdsize in (64, 28):
    s1.value, s2.value = 0, 0
    cmds = _cmds([ib1, ib2])
    t = k.ioctl("GPU_COMMAND", cmdlist=_addr(cmds), cmdsize=cmdsize, numcmds=2, context_id=k.ctx).timestamp
    k.wait_timestamp(t)
    k.last_timestamp = t
    assert (s1.value, s2.value) == (11, 22), cmdsize
  one = _cmds([ib1])  # kept alive until the ioctl has read it
  with pytest.raises(KGSLError, match="GPU_COMMAND.*EINVAL"):
    k.ioctl("GPU_COMMAND", cmdlist=_addr(one), cmdsize=24, numcmds=1, context_id=k.ctx)
  for ib in (ib1, ib2): dev._gpu_free(ib)
  _works(dev)


def test_gpu_command_flags_and_ib_checks(dev):
  """kgsl.c _process_command_input: the MARKER flag makes a marker whatever numcmds says, and
  kgsl_drawobj_cmd_add_cmdlist ignores a marker's commands (it retires with a timestamp, its IB never runs);
  a command object needs one of the CMDLIST flags, extra bits are kept; adreno_dispatch.c _verify_ib: 1 byte to
  0xFFFFF dwords at a 4-byte aligned address, the CP running size >> 2 dwords (a 22-byte IB is its 5 dwords)."""
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  ib, sig = _ib_writing(dev, 33)
  sig.value = 0
  marker_cmds = _cmds([ib])
  m = k.ioctl("GPU_COMMAND", flags=kgsl.DRAWOBJ_MARKER, cmdlist=_addr(marker_cmds), cmdsize=32, numcmds=1,
              context_id=k.ctx).timestamp
  k.wait_timestamp(m)
  k.last_timestamp = m
  assert sig.value == 0  # the marker's IB did not run
  cmds = _cmds([ib], flags=kgsl.CMDLIST_IB | 0x100)
  kgsl.ffi.cast("struct kgsl_command_object*", cmds).size = 22
  t = k.ioctl("GPU_COMMAND", cmdlist=_addr(cmds), cmdsize=32, numcmds=1, context_id=k.ctx).timestamp
  k.wait_timestamp(t)
  k.last_timestamp = t
  assert sig.value == 33
  for size, addr, flags in ((0, ib.va_addr, 1), (0x400000, ib.va_addr, 1), (20, ib.va_addr + 2, 1),
                            (20, ib.va_addr, 0x100)):
    bad = _cmds([ib], flags=flags)
    o = kgsl.ffi.cast("struct kgsl_command_object*", bad)
    o.size, o.gpuaddr = size, addr
    with pytest.raises(KGSLError, match="GPU_COMMAND.*EINVAL"):
      k.ioctl("GPU_COMMAND", cmdlist=_addr(bad), cmdsize=32, numcmds=1, context_id=k.ctx)
  dev._gpu_free(ib)
  _works(dev)


def test_gpu_command_object_list(dev):
  """kgsl_drawobj.c kgsl_drawobj_cmd_add_memlist: objlist entries (read like the command list) need
  KGSL_OBJLIST_MEMOBJ; they only tell KGSL which memory the commands use, so the commands run as without them;
  an objlist with a count but no pointer is EINVAL (_verify_input_list)."""
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  ib, sig = _ib_writing(dev, 44)
  sig.value = 0
  cmds, objs = _cmds([ib]), _cmds([ib], flags=kgsl.OBJLIST_MEMOBJ)
  t = k.ioctl("GPU_COMMAND", cmdlist=_addr(cmds), cmdsize=32, numcmds=1, objlist=_addr(objs), objsize=32,
              numobjs=1, context_id=k.ctx).timestamp
  k.wait_timestamp(t)
  k.last_timestamp = t
  assert sig.value == 44
  for objlist, numobjs, flags in ((_addr(objs), 1, kgsl.CMDLIST_IB), (0, 1, kgsl.OBJLIST_MEMOBJ)):
    kgsl.ffi.cast("struct kgsl_command_object*", objs).flags = flags
    with pytest.raises(KGSLError, match="GPU_COMMAND.*EINVAL"):
      k.ioctl("GPU_COMMAND", cmdlist=_addr(cmds), cmdsize=32, numcmds=1, objlist=objlist, objsize=32,
              numobjs=numobjs, context_id=k.ctx)
  dev._gpu_free(ib)
  _works(dev)


def test_gpu_command_sync_points(dev):
  """kgsl_drawobj.c kgsl_drawobj_sync_add_synclist / kgsl_drawobj_sync_add_sync / drawobj_add_sync_timestamp: a
  timestamp sync point holds a submission back until that context's timestamp retired, so waiting on it runs the
  other context first; its payload must be exactly `struct kgsl_cmd_syncpoint_timestamp`; an unknown context, or a
  future timestamp of the submitting context, is EINVAL; a sync-only submission gets timestamp 0 (_queue_syncobj)."""
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  flags = kgsl.CONTEXT_PREAMBLE | kgsl.CONTEXT_NO_GMEM_ALLOC
  other = k.ioctl("DRAWCTXT_CREATE", flags=flags).drawctxt_id
  (ib1, s1), (ib2, s2) = _ib_writing(dev, 55), _ib_writing(dev, 66)
  s1.value, s2.value = 0, 0
  c1, c2 = _cmds([ib1]), _cmds([ib2])
  t_other = k.ioctl("GPU_COMMAND", cmdlist=_addr(c1), cmdsize=32, numcmds=1, context_id=other).timestamp

  def syncs(ctx_id: int, ts: int, size: int = 8, typ: int = kgsl.CMD_SYNCPOINT_TYPE_TIMESTAMP) -> tuple[Any, Any]:
    pay = kgsl.ffi.new("struct kgsl_cmd_syncpoint_timestamp *", {"context_id": ctx_id, "timestamp": ts})
    sp = kgsl.ffi.new("struct kgsl_command_syncpoint *", {"priv": _addr(pay), "size": size, "type": typ})
    return sp, pay

  sp, pay = syncs(other, t_other)
  t = k.ioctl("GPU_COMMAND", cmdlist=_addr(c2), cmdsize=32, numcmds=1, synclist=_addr(sp), syncsize=24,
              numsyncs=1, context_id=k.ctx).timestamp
  k.wait_timestamp(t)  # only this context's timestamp is waited for ...
  k.last_timestamp = t
  assert (s1.value, s2.value) == (55, 66)  # ... and the other context's command ran before it
  sp, pay = syncs(other, t_other)
  assert k.ioctl("GPU_COMMAND", flags=kgsl.DRAWOBJ_SYNC, synclist=_addr(sp), syncsize=24, numsyncs=1,
                 context_id=k.ctx).timestamp == 0
  for bad in (syncs(other + 100, 1), syncs(k.ctx, t + 5), syncs(other, 1, size=12), syncs(other, 1, typ=7)):
    with pytest.raises(KGSLError, match="GPU_COMMAND.*EINVAL"):
      k.ioctl("GPU_COMMAND", flags=kgsl.DRAWOBJ_SYNC, synclist=_addr(bad[0]), syncsize=24, numsyncs=1,
              context_id=k.ctx)
  with pytest.raises(KGSLError, match="GPU_COMMAND.*EINVAL"):  # a sync list needs a pointer
    k.ioctl("GPU_COMMAND", flags=kgsl.DRAWOBJ_SYNC, synclist=0, syncsize=24, numsyncs=1, context_id=k.ctx)
  k.ioctl("DRAWCTXT_DESTROY", drawctxt_id=other)
  for ib in (ib1, ib2): dev._gpu_free(ib)
  _works(dev)


def test_ioctl_arguments_of_another_size_and_gpuobj_info(dev):
  """kgsl_ioctl.c kgsl_ioctl_helper finds the function by _IOC_NR alone and copies min(the caller's _IOC_SIZE, the
  kernel's) bytes in and out: a bigger struct works (its tail untouched), a smaller one reads as zero past its end
  (GPUOBJ_INFO of 8 bytes has id 0: EINVAL); an unknown number is ENOTTY. kgsl.c kgsl_ioctl_gpuobj_info writes
  gpuaddr, flags, size, va_len and va_addr = 0."""
  from tiny_uop.hcq import ioc

  from tiny_runtime_qcom import kgsl
  k = dev.kgsl
  buf = dev._gpu_alloc(8192)
  info = k.ioctl("GPUOBJ_INFO", id=buf.meta)
  flags = driver().obj_flags[buf.meta]
  assert (info.gpuaddr, info.size, info.va_len, info.va_addr, info.flags) == (buf.va_addr, 8192, 8192, 0, flags)
  big = kgsl.ffi.new("char[]", 64)
  kgsl.ffi.cast("struct kgsl_gpuobj_info*", big).id = buf.meta
  big[60] = b"\x5a"
  k.dev.ioctl(ioc(3, chr(kgsl.KGSL_IOC_TYPE), 0x47, 64), kgsl.ffi.buffer(big))
  assert kgsl.ffi.cast("struct kgsl_gpuobj_info*", big).gpuaddr == buf.va_addr and big[60] == b"\x5a"
  small = kgsl.ffi.new("char[]", 8)
  with pytest.raises(OSError) as e: k.dev.ioctl(ioc(3, chr(kgsl.KGSL_IOC_TYPE), 0x47, 8), kgsl.ffi.buffer(small))
  assert e.value.errno == 22
  with pytest.raises(OSError) as e: k.dev.ioctl(ioc(3, chr(kgsl.KGSL_IOC_TYPE), 0x7F, 8), kgsl.ffi.buffer(small))
  assert e.value.errno == 25
  dev._gpu_free(buf)


def test_gpuobj_free_on_a_timestamp(dev):
  """kgsl.c kgsl_ioctl_gpuobj_free with KGSL_GPUOBJ_FREE_ON_EVENT, type TIMESTAMP: the object stays until that
  context timestamp retires (gpumem_free_entry_on_timestamp), and its id is gone at once; context 0, another event
  type, or an unknown id is EINVAL."""
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  obj = k.ioctl("GPUOBJ_ALLOC", size=4096, flags=kgsl.MEMFLAGS_USE_CPU_MAP).id
  m = k.ioctl("GPU_COMMAND", cmdlist=0, cmdsize=0, numcmds=0, context_id=k.ctx).timestamp
  ev = kgsl.ffi.new("struct kgsl_gpu_event_timestamp *", {"context_id": k.ctx, "timestamp": m})
  for ctx_id, typ in ((0, kgsl.GPU_EVENT_TIMESTAMP), (k.ctx, 3)):
    ev.context_id = ctx_id
    with pytest.raises(KGSLError, match="GPUOBJ_FREE.*EINVAL"):
      k.ioctl("GPUOBJ_FREE", id=obj, flags=kgsl.GPUOBJ_FREE_ON_EVENT, type=typ, priv=_addr(ev), len=8)
  ev.context_id = k.ctx
  k.ioctl("GPUOBJ_FREE", id=obj, flags=kgsl.GPUOBJ_FREE_ON_EVENT, type=kgsl.GPU_EVENT_TIMESTAMP, priv=_addr(ev),
          len=8)
  assert obj in driver().objs  # still there: the marker has not retired
  with pytest.raises(KGSLError, match="GPUOBJ_FREE.*EINVAL"): k.ioctl("GPUOBJ_FREE", id=obj)
  k.wait_timestamp(m)
  k.last_timestamp = m
  assert obj not in driver().objs
  _works(dev)


def test_mmap_of_a_gpu_object_as_kgsl_decides(dev):
  """kgsl.c get_mmap_entry: a USE_CPU_MAP object is mapped whole (another length: ERANGE), an unknown id is EINVAL;
  _gpu_set_svm_region: a second mapping of an object that has its GPU address is EBUSY."""
  import errno

  from tiny_uop.hcq import MAP_SHARED, PROT_READ, PROT_WRITE

  from tiny_runtime_qcom import kgsl
  k = dev.kgsl
  obj = k.ioctl("GPUOBJ_ALLOC", size=8192, flags=kgsl.MEMFLAGS_USE_CPU_MAP).id
  for size, off, err in ((4096, obj, errno.ERANGE), (8192, obj + 1000, errno.EINVAL)):
    with pytest.raises(OSError) as e: k.dev.mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, off * kgsl.PAGE)
    assert e.value.errno == err
  addr = k.dev.mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, obj * kgsl.PAGE)
  with pytest.raises(OSError) as e: k.dev.mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, obj * kgsl.PAGE)
  assert e.value.errno == errno.EBUSY
  k.dev.munmap(addr, 8192)
  k.ioctl("GPUOBJ_FREE", id=obj)


def test_readtimestamp_types(dev):
  """kgsl.c kgsl_ioctl_cmdstream_readtimestamp_ctxtid / adreno.c adreno_readtimestamp: QUEUED is the context's last
  queued timestamp (the GPU need not have run it), CONSUMED and RETIRED what the GPU reached, any other type EINVAL."""
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  m = k.ioctl("GPU_COMMAND", cmdlist=0, cmdsize=0, numcmds=0, context_id=k.ctx).timestamp
  assert k.ioctl("CMDSTREAM_READTIMESTAMP_CTXTID", context_id=k.ctx, type=kgsl.TIMESTAMP_QUEUED).timestamp == m
  assert driver().contexts[k.ctx]["retired"] == m - 1  # reading QUEUED ran nothing
  assert k.ioctl("CMDSTREAM_READTIMESTAMP_CTXTID", context_id=k.ctx, type=kgsl.TIMESTAMP_CONSUMED).timestamp == m
  k.last_timestamp = m
  with pytest.raises(KGSLError, match="READTIMESTAMP.*EINVAL"):
    k.ioctl("CMDSTREAM_READTIMESTAMP_CTXTID", context_id=k.ctx, type=7)
  _works(dev)


def test_preamble_ibs_run_like_any_ib(dev):
  """sdm845's msm-4.9 kgsl: kgsl_drawobj_cmd_add_cmdlist takes CTXTSWITCH_PREAMBLE (0x2) and IB_PREAMBLE (0x4) as
  command flags, kgsl_drawobj_add_memobject keeps them in mem->flags with mem->priv = 0, and
  adreno_ringbuffer_submitcmd skips only an IB whose priv has MEMOBJ_PREAMBLE: both kinds run, in list order."""
  from tiny_runtime_qcom import kgsl
  k = dev.kgsl
  (ib1, s1), (ib2, s2), (ib3, s3) = _ib_writing(dev, 101), _ib_writing(dev, 102), _ib_writing(dev, 103)
  cmds = _cmds([ib1, ib2, ib3])
  for i, flags in enumerate((kgsl.CMDLIST_CTXTSWITCH_PREAMBLE, kgsl.CMDLIST_IB_PREAMBLE, kgsl.CMDLIST_IB)):
    kgsl.ffi.cast("struct kgsl_command_object*", kgsl.ffi.cast("char*", cmds) + 32 * i).flags = flags
  for _ in range(2):  # the second submission on the same context (no context switch) runs the preamble IB too
    s1.value, s2.value, s3.value = 0, 0, 0
    t = k.ioctl("GPU_COMMAND", cmdlist=_addr(cmds), cmdsize=32, numcmds=3, context_id=k.ctx).timestamp
    k.wait_timestamp(t)
    k.last_timestamp = t
    assert (s1.value, s2.value, s3.value) == (101, 102, 103)
  for ib in (ib1, ib2, ib3): dev._gpu_free(ib)
  _works(dev)


def test_fence_sync_points_need_a_sync_file(dev):
  """kgsl_drawobj_sync_add_sync: a FENCE sync point's payload is exactly `struct kgsl_cmd_syncpoint_fence` (4 bytes:
  the fd), else EINVAL; drawobj_add_sync_fence -> kgsl_sync_fence_async_wait: sync_file_get_fence of an fd that is
  not an open sync_file (-1, a regular file) is NULL: EINVAL, before anything is queued."""
  import ctypes
  import os
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  fd = os.open(os.devnull, os.O_RDONLY)
  try:
    for value, size, what in ((fd, 8, "8 bytes"), (-1, 4, "fd -1 is not"), (fd, 4, f"fd {fd} is not")):
      pay = ctypes.c_int32(value)
      sp = kgsl.ffi.new("struct kgsl_command_syncpoint *", {"priv": ctypes.addressof(pay), "size": size,
                                                             "type": kgsl.CMD_SYNCPOINT_TYPE_FENCE})
      with pytest.raises(KGSLError, match=f"GPU_COMMAND.*EINVAL.*{what}"):
        k.ioctl("GPU_COMMAND", flags=kgsl.DRAWOBJ_SYNC, synclist=_addr(sp), syncsize=24, numsyncs=1, context_id=k.ctx)
  finally: os.close(fd)
  _works(dev)


def test_gpuobj_free_on_a_fence_needs_a_sync_file(dev):
  """kgsl.c gpuobj_free_on_fence: the payload (`struct kgsl_gpu_event_fence`, the fd, read with _copy_from_user) must
  name a sync_file: a negative fd is EINVAL, and kgsl_sync_fence_async_wait on an fd that is not an open sync_file
  (a regular file) EINVAL too; the object stays, and frees normally afterwards."""
  import ctypes
  import os
  from tiny_runtime_qcom import kgsl
  from tiny_runtime_qcom.kgsl import KGSLError
  k = dev.kgsl
  obj = k.ioctl("GPUOBJ_ALLOC", size=4096, flags=kgsl.MEMFLAGS_USE_CPU_MAP).id
  fd = os.open(os.devnull, os.O_RDONLY)
  try:
    for value in (-1, fd):
      ev = ctypes.c_int32(value)
      with pytest.raises(KGSLError, match=f"GPUOBJ_FREE.*EINVAL.*fd {value} is not"):
        k.ioctl("GPUOBJ_FREE", id=obj, flags=kgsl.GPUOBJ_FREE_ON_EVENT, type=kgsl.GPU_EVENT_FENCE,
                priv=ctypes.addressof(ev), len=4)
      assert obj in driver().objs
  finally: os.close(fd)
  k.ioctl("GPUOBJ_FREE", id=obj)
  assert obj not in driver().objs
  _works(dev)
