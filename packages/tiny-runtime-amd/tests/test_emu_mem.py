"""RDNA3 emulator, memory families beyond plain loads/stores: SCRATCH (per-lane private memory), FLAT/GLOBAL atomics and
DS atomics with and without returned values, ds_permute/ds_bpermute/ds_swizzle. Expected values from the ISA's
documented atomic semantics, computed here with Python ints / numpy."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_runtime_amd.emu.encode import Code, ds, glob, scratch

from tiny_runtime_amd.emu.rdna3 import EXEC_LO, NULL, Emulator, UnsupportedInstruction, Wave

M32 = 0xFFFFFFFF
rng = np.random.default_rng(3)


def run(*parts, vgpr=None, sgpr=None, exec_mask=M32, scratch_size=None, lds=None) -> Wave:
  code, w = Code(*parts), Wave(scratch_size=scratch_size, lds=lds if lds is not None else bytearray())
  for k, vs in (vgpr or {}).items(): w.vgpr[k] = [int(v) for v in vs]
  for k, v in (sgpr or {}).items(): w.sgpr[k] = v
  w.sgpr[EXEC_LO] = exec_mask
  Emulator().run(w, code.addr)
  return w


def test_scratch_encoding_matches_llvm_mc():
  # bytes from `llvm-mc-15 --arch=amdgcn --mcpu=gfx1100 --show-encoding`
  def words(bs): return [int.from_bytes(bytes(bs[i:i + 4]), "little") for i in (0, 4)]
  assert scratch(20, vdst=1, addr=2) == words([0x00, 0x00, 0x51, 0xdc, 0x02, 0x00, 0xfc, 0x01])
  assert scratch(20, vdst=1, addr=2, saddr=2, offset=16) == words([0x10, 0x00, 0x51, 0xdc, 0x02, 0x00, 0x82, 0x01])
  assert scratch(26, addr=2, data=1, offset=-4) == words([0xfc, 0x1f, 0x69, 0xdc, 0x02, 0x01, 0xfc, 0x00])
  assert scratch(29, saddr=3, data=4, offset=64) == words([0x40, 0x00, 0x75, 0xdc, 0x00, 0x04, 0x03, 0x00])


def test_scratch_is_private_per_lane():
  vals = rng.integers(0, 2**32, (4, 32))
  # every lane stores 4 dwords at the same private offsets (b128 via s2 + 16), then reads them back in pieces
  w = run(scratch(29, saddr=2, data=4, offset=16), scratch(20, vdst=10, addr=0, offset=12),  # v0 = 8: reads 20
          scratch(21, vdst=11, offset=24), scratch(26, addr=1, data=4), scratch(17, vdst=13, addr=1),
          scratch(34, vdst=14, addr=1, offset=3),  # load_d16_hi_i8 of the top byte of what lane stored at v1
          vgpr={0: [8] * 32, 1: [4 * i for i in range(32)], **{4 + j: vals[j] for j in range(4)}, 14: [0x7777] * 32},
          sgpr={2: 0})
  assert w.vgpr[10] == [int(v) for v in vals[1]]
  assert w.vgpr[11] == [int(v) for v in vals[2]] and w.vgpr[12] == [int(v) for v in vals[3]]
  sx8 = lambda v: (v & 0xFF) - (256 if v & 0x80 else 0)
  assert w.vgpr[13] == [sx8(int(v)) & M32 for v in vals[0]]
  assert w.vgpr[14] == [((sx8(int(v) >> 24) & 0xFFFF) << 16) | 0x7777 for v in vals[0]]
  assert all(len(w.private(ln).buf) >= 4 * ln + 4 for ln in range(32))  # grown on demand: no size given


def test_scratch_bounds_come_from_the_dispatch():
  run(scratch(26, addr=0, data=1), vgpr={0: [60] * 32}, scratch_size=64)
  with pytest.raises(RuntimeError, match="outside the lane's 64 private bytes"):
    run(scratch(26, addr=0, data=1), vgpr={0: [61] * 32}, scratch_size=64)


KINDS = {53: lambda o, d: o + d, 54: lambda o, d: o - d, 55: lambda o, d: max(o - d, 0),
         56: lambda o, d: min(sx(o), sx(d)), 57: min, 58: lambda o, d: max(sx(o), sx(d)), 59: max,
         60: lambda o, d: o & d, 61: lambda o, d: o | d, 62: lambda o, d: o ^ d, 51: lambda o, d: d,
         63: lambda o, d: 0 if o >= d else o + 1, 64: lambda o, d: d if o == 0 or o > d else o - 1}
def sx(v: int) -> int: return v - (1 << 32) if v >> 31 else v


@pytest.mark.parametrize("op", sorted(KINDS))
def test_global_atomics_32(op):
  mem = rng.integers(0, 2**32, 32, dtype=np.uint64).astype(np.uint32)
  data = rng.integers(0, 2**32, 32, dtype=np.uint64).astype(np.uint32)
  if op in (63, 64): data[:8], mem[:8] = mem[:8], np.arange(8)  # inc/dec: hit the wrap cases too
  old = mem.copy()
  a = mem.ctypes.data
  w = run(glob(op, vdst=3, addr=0, saddr=2, data=1, glc=1), vgpr={0: [4 * i for i in range(32)], 1: data},
          sgpr={2: a & M32, 3: a >> 32}, exec_mask=0x7FFFFFFF)
  want = [KINDS[op](int(o), int(d)) & M32 for o, d in zip(old, data)]
  assert mem[:31].tolist() == want[:31] and mem[31] == old[31]  # lane 31 is off
  assert w.vgpr[3][:31] == [int(v) for v in old[:31]]  # GLC returns the value before the op


def test_global_atomic_cmpswap_float_add_and_64bit():
  mem = np.array([5, 6] * 16, dtype=np.uint32)
  a = mem.ctypes.data
  # cmpswap: data = new (v1), compare (v2): swaps only where memory holds 5
  w = run(glob(52, vdst=3, addr=0, saddr=2, data=1, glc=1), vgpr={0: [4 * i for i in range(32)], 1: [9] * 32,
                                                                   2: [5] * 32}, sgpr={2: a & M32, 3: a >> 32})
  assert mem.tolist() == [9, 6] * 16 and w.vgpr[3] == [5, 6] * 16
  f = np.zeros(1, dtype=np.float32)
  add = rng.standard_normal(32).astype(np.float32)
  fa = f.ctypes.data
  run(glob(86, addr=0, saddr=2, data=1), vgpr={0: [0] * 32, 1: add.view(np.uint32)}, sgpr={2: fa & M32, 3: fa >> 32})
  want = np.float32(0)
  for x in add: want = np.float32(want + x)  # one lane after another, each a float32 add
  assert f[0] == want
  m64 = np.array([2**40 + 7] * 32, dtype=np.uint64)
  ma = m64.ctypes.data
  w = run(glob(67, vdst=4, addr=0, saddr=2, data=1, glc=1),
          vgpr={0: [8 * i for i in range(32)], 1: [M32] * 32, 2: [1] * 32}, sgpr={2: ma & M32, 3: ma >> 32})
  assert m64.tolist() == [2**40 + 7 + 2**33 - 1] * 32 and w.vgpr[4] == [7] * 32 and w.vgpr[5] == [256] * 32


def test_atomic_contention_returns_distinct_old_values():
  mem = np.zeros(1, dtype=np.uint32)
  a = mem.ctypes.data
  w = run(glob(53, vdst=3, addr=0, saddr=2, data=1, glc=1), vgpr={0: [0] * 32, 1: [1] * 32},
          sgpr={2: a & M32, 3: a >> 32})
  assert mem[0] == 32 and sorted(w.vgpr[3]) == list(range(32))
  flat = np.zeros(1, dtype=np.uint32)
  fa = flat.ctypes.data  # flat_atomic_add_u32 with a 64-bit VGPR address (segment 0)
  run(glob(53, vdst=3, addr=0, data=2, seg=0), vgpr={0: [fa & M32] * 32, 1: [fa >> 32] * 32, 2: [3] * 32})
  assert flat[0] == 96


def test_ds_atomics():
  lds = bytearray(256)
  init = rng.integers(0, 2**32, 32)
  for i, v in enumerate(init): lds[4 * i:4 * i + 4] = int(v).to_bytes(4, "little")
  data = rng.integers(0, 2**32, 32)
  w = run(ds(32, addr=0, data0=1, vdst=3), ds(6, addr=0, data0=1), ds(48, addr=0, data0=2, data1=4, vdst=5),
          vgpr={0: [4 * i for i in range(32)], 1: data, 2: [77] * 32, 4: [0] * 32}, lds=lds)
  added = [(int(a) + int(d)) & M32 for a, d in zip(init, data)]
  maxed = [max(sx(a), sx(int(d))) & M32 for a, d in zip(added, data)]
  assert w.vgpr[3] == [int(v) for v in init]  # ds_add_rtn_u32 returned the old values
  assert w.vgpr[5] == maxed  # ds_cmpstore_rtn_b32 returns the old value ...
  after = [int.from_bytes(lds[4 * i:4 * i + 4], "little") for i in range(32)]
  assert after == [77 if m == 0 else m for m in maxed]  # ... and stores 77 only where it was 0
  lds = bytearray(4)
  run(ds(21, addr=0, data0=1), vgpr={0: [0] * 32, 1: np.full(32, 0.5, np.float32).view(np.uint32)}, lds=lds)
  assert np.frombuffer(lds, np.float32)[0] == 16.0  # ds_add_f32 from every lane


def test_ds_permutes():
  src = [100 + i for i in range(32)]
  idx = [4 * ((i * 7) % 32) for i in range(32)]
  w = run(ds(179, addr=0, data0=1, vdst=2), ds(178, addr=0, data0=1, vdst=3), ds(53, addr=1, vdst=4, offset0=0x1F,
                                                                                     offset1=0x40),
          ds(53, addr=1, vdst=5, offset0=0b00011011, offset1=0x80), vgpr={0: idx, 1: src})
  assert w.vgpr[2] == [src[(i * 7) % 32] for i in range(32)]  # bpermute: read lane addr/4
  want = [0] * 32
  for i in range(32): want[(i * 7) % 32] = src[i]
  assert w.vgpr[3] == want  # permute: write to lane addr/4
  assert w.vgpr[4] == [src[i ^ 16] for i in range(32)]  # swizzle(SWAP,16): xor mask 16
  assert w.vgpr[5] == [src[(i & ~3) | (3 - (i & 3))] for i in range(32)]  # quad perm [3,2,1,0]
  w = run(ds(179, addr=0, data0=1, vdst=2), vgpr={0: [0] * 32, 1: src}, exec_mask=0xFFFFFFFE)
  assert w.vgpr[2][1:] == [0] * 31  # reading an inactive lane gives 0


def test_unknown_memory_opcodes_name_the_encoding():
  with pytest.raises(UnsupportedInstruction, match="FLAT opcode 120"): run(glob(120, addr=0, saddr=NULL))
  with pytest.raises(UnsupportedInstruction, match="DS opcode 250"): run(ds(250), lds=bytearray(64))


SCRATCH_IR = """target triple = "amdgcn-amd-amdhsa"
declare i32 @llvm.amdgcn.workitem.id.x()
define amdgpu_kernel void @k(ptr addrspace(1) %out, ptr addrspace(1) %in) {
entry:
  %arr = alloca [64 x float], align 4, addrspace(5)
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  br label %fill
fill:
  %i = phi i32 [0, %entry], [%i1, %fill]
  %p = getelementptr inbounds float, ptr addrspace(1) %in, i32 %i
  %v = load float, ptr addrspace(1) %p
  %t = fmul float %v, 2.0
  %q = getelementptr inbounds [64 x float], ptr addrspace(5) %arr, i32 0, i32 %i
  store volatile float %t, ptr addrspace(5) %q
  %i1 = add i32 %i, 1
  %c = icmp ult i32 %i1, 64
  br i1 %c, label %fill, label %done
done:
  %j = and i32 %tid, 63
  %r = getelementptr inbounds [64 x float], ptr addrspace(5) %arr, i32 0, i32 %j
  %rv = load volatile float, ptr addrspace(5) %r
  %o = getelementptr inbounds float, ptr addrspace(1) %out, i32 %tid
  store float %rv, ptr addrspace(1) %o
  ret void
}
"""


def test_compiled_private_array_runs_with_the_descriptors_scratch_size():
  """A kernel whose private array LLVM puts in scratch (scratch_store/scratch_load with a VGPR offset), run straight
  from the code object with the kernel descriptor's private_segment_fixed_size per lane."""
  import ctypes

  from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, find_ld_lld
  if find_ld_lld() is None: pytest.skip("ld.lld not installed")
  from tiny_runtime_amd.elf import ELF
  elf = ELF.parse(AMDGPUCompiler("gfx1100").compile(SCRATCH_IR))
  _, off, kd = elf.kernel()
  assert kd.private_segment_fixed_size >= 256
  img = elf.image()
  code = (ctypes.c_uint8 * (len(img) + 64)).from_buffer_copy(img + bytes(64))
  inp, out = rng.standard_normal(64).astype(np.float32), np.zeros(32, np.float32)
  args = (ctypes.c_uint64 * 2)(out.ctypes.data, inp.ctypes.data)
  w = Wave(scratch_size=kd.private_segment_fixed_size)
  w.sgpr[0], w.sgpr[1] = ctypes.addressof(args) & M32, ctypes.addressof(args) >> 32
  w.vgpr[0], w.sgpr[EXEC_LO] = list(range(32)), M32
  Emulator().run(w, ctypes.addressof(code) + off + kd.kernel_code_entry_byte_offset)
  np.testing.assert_array_equal(out, inp[:32] * 2)
  assert len(w.private(5).buf) == kd.private_segment_fixed_size


def test_private_array_kernel_on_mock_amd():
  """The same kernel launched through MOCK+AMD: the mock's dispatch sizes each lane's private memory
  (Wave.scratch_size from COMPUTE_TMPRING_SIZE), two waves of a 64-item group each keep their own arrays."""
  from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, find_ld_lld
  if find_ld_lld() is None: pytest.skip("ld.lld not installed")
  from tiny_uop import dtypes
  from tiny_uop.device import Buffer
  from tiny_uop.plugins import Device
  lib = AMDGPUCompiler("gfx1100").compile(SCRATCH_IR)
  inp = rng.standard_normal(64).astype(np.float32)
  out, src = Buffer("MOCK+AMD", 64, dtypes.float), Buffer("MOCK+AMD", 64, dtypes.float)
  src.copyin(memoryview(inp))
  prg = Device["MOCK+AMD"].get_program("k", lib)
  prg(out._buf, src._buf, global_size=(1, 1, 1), local_size=(64, 1, 1), vals=(), wait=True)
  np.testing.assert_array_equal(np.frombuffer(out.as_buffer(), np.float32), inp * 2)


def test_ds_d16_and_stride64_b64():
  lds = bytearray(2048)
  # v1 = 0xABCD_1234 + lane: ds_store_b16_d16_hi writes 0xABCD at 4*lane, ds_store_b8_d16_hi 0xCD at 256+lane
  w = run(ds(161, addr=0, data0=1), ds(160, addr=2, data0=1), ds(166, addr=0, vdst=3), ds(167, addr=0, vdst=4),
          ds(165, addr=2, vdst=5), ds(164, addr=2, vdst=6),
          ds(79, addr=7, data0=8, data1=10, offset1=1), ds(120, addr=7, vdst=12, offset1=1),
          vgpr={0: [4 * i for i in range(32)], 1: [0xABCD_1234 + i for i in range(32)], 2: [256 + i for i in range(32)],
                3: [0x7777_0000] * 32, 4: [0x0000_5555] * 32, 5: [0] * 32, 6: [0xFFFF_0000] * 32,
                7: [8 * i for i in range(32)], 8: [1] * 32, 9: [2] * 32, 10: [3] * 32, 11: [4] * 32}, lds=lds)
  assert w.vgpr[3] == [0x7777_ABCD] * 32 and w.vgpr[4] == [0xABCD_5555] * 32  # d16 low / d16_hi keep the other half
  assert w.vgpr[5] == [0xFFCD_0000] * 32 and w.vgpr[6] == [0xFFFF_FFCD] * 32  # i8 sign-extends 0xCD into the half
  # stride64 b64: data0 at addr, data1 at addr + 1 * 64 * 8; loaded back as two b64 into v12..v15
  assert [w.vgpr[12 + i][0] for i in range(4)] == [1, 2, 3, 4]
