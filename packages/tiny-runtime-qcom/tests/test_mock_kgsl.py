"""The mock KGSL and its command processor reject what the hardware rejects: every malformed packet below is submitted
through the real driver's path (GPU_COMMAND of an IB in GPU memory) and faults with a message naming what is wrong;
the device keeps working afterwards. Also: KGSL ioctls check their arguments, and the decoder names registers."""
from __future__ import annotations

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
  with pytest.raises(GPUFault, match="page fault"): k.submit(0x1000, 4)
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
