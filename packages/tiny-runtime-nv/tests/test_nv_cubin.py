"""The NV device's cubin reader against NVIDIA's own tools: kernels assembled by ptxas (the `nvidia-cuda-nvcc` wheel)
are read by `cubin.load_kernel_info` and dumped by cuobjdump (the `nvidia-cuda-cuobjdump` wheel, a test dependency);
the attribute ids, formats and values (registers, parameter bank offset and size, each parameter's ordinal, offset
and size), the shared-memory size and the target must agree. The target is read from e_flags by ELF ABI version (7:
bits 7:0, ptxas <= 12 and the driver's JIT; 8: bits 15:8, ptxas 13): `data/ptxas12_sm_80.cubin` is ptxas 12.9.86's
output for `data/ptxas12_sm_80.ptx` (nvidia-cuda-nvcc-cu12 wheel, `ptxas -arch=sm_80`), kept because the test
environment has ptxas 13 only."""
from __future__ import annotations

import glob
import os
import pathlib
import re
import struct
import subprocess
import sysconfig

import numpy as np
import pytest

from tiny_codegen.compiler.ptx import PTXCompiler, find_ptxas
from tiny_uop import dtypes
from tiny_uop.device import Buffer
from tiny_uop.plugins import Device

from tiny_runtime_nv import cubin
from tiny_runtime_nv.elf import ELF
from tiny_runtime_nv.mock.compiler import with_ptx

PTX = """.version 7.8
.target {arch}
.address_size 64
.visible .entry k_{n}(.param .u64 out, .param .u64 inp, .param .s32 n, .param .u64 more, .param .s32 m) {{
  .reg .b32 %r<8>; .reg .b64 %rd<8>; .reg .f32 %f<4>; .reg .pred %p<2>;
  .shared .align 16 .b8 smem[{shared}];
  ld.param.u64 %rd0, [out]; ld.param.u64 %rd1, [inp]; ld.param.s32 %r1, [n]; mov.u32 %r0, %tid.x;
  setp.ge.s32 %p0, %r0, %r1; @%p0 bra DONE;
  mul.wide.u32 %rd2, %r0, 4; add.s64 %rd3, %rd1, %rd2; ld.global.f32 %f0, [%rd3];
  mov.u32 %r2, smem; shl.b32 %r3, %r0, 2; add.u32 %r4, %r2, %r3; st.shared.f32 [%r4], %f0; bar.sync 0;
  ld.shared.f32 %f1, [%r4]; add.f32 %f2, %f1, %f0; add.s64 %rd4, %rd0, %rd2; st.global.f32 [%rd4], %f2;
DONE: ret; }}
"""


def find_cuobjdump() -> str | None:
  """cuobjdump from the `nvidia-cuda-cuobjdump` wheel (or PATH)."""
  site = sysconfig.get_paths()["purelib"]
  for c in (*sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump"))),
            *sorted(glob.glob(os.path.join(site, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump"))), "cuobjdump"):
    if os.path.isfile(c) and os.access(c, os.X_OK): return c
  return None


def _dump(lib: bytes, tmp_path) -> str:
  path = tmp_path / "k.cubin"
  path.write_bytes(lib)
  tool = find_cuobjdump()
  assert tool is not None, "cuobjdump missing: the nvidia-cuda-cuobjdump wheel is a test dependency (noxfile)"
  return subprocess.run([tool, "-elf", str(path)], capture_output=True, text=True, check=True).stdout


def _attributes(dump: str, section: str) -> list[tuple[str, str, str]]:
  """(attribute name, format, value text) of one `.nv.info*` section as cuobjdump prints it."""
  m = re.search(rf"^{re.escape(section)}\n(.*?)(?:\n\n\n|\Z)", dump, re.S | re.M)
  assert m, f"cuobjdump printed no {section}"
  return re.findall(r"Attribute:\t([^\n]+)\n\tFormat:\t(\S+)(?:\n\tValue:\t)?(.*?)(?=\n\t<0x|\Z)", m.group(1), re.S)


@pytest.mark.parametrize("arch, shared", [("sm_90", 64), ("sm_80", 1000), ("sm_86", 16)])
def test_cubin_facts_match_cuobjdump(arch, shared, tmp_path):
  assert find_ptxas() is not None, "ptxas missing: the nvidia-cuda-nvcc wheel is a test dependency (noxfile)"
  n = f"{arch}_{shared}"
  lib = PTXCompiler(arch, use_ptxas=True).compile(PTX.format(arch=arch, n=n, shared=shared))
  info = cubin.load_kernel_info(lib, f"k_{n}")
  dump = _dump(lib, tmp_path)
  assert f"sm={arch[3:]}" in dump and info.arch == arch
  fmt = {"EIFMT_NVAL": cubin.EIFMT_NVAL, "EIFMT_BVAL": cubin.EIFMT_BVAL, "EIFMT_HVAL": cubin.EIFMT_HVAL,
         "EIFMT_SVAL": cubin.EIFMT_SVAL}
  ids = {"EIATTR_PARAM_CBANK": cubin.EIATTR_PARAM_CBANK, "EIATTR_FRAME_SIZE": cubin.EIATTR_FRAME_SIZE,
         "EIATTR_MIN_STACK_SIZE": cubin.EIATTR_MIN_STACK_SIZE, "EIATTR_KPARAM_INFO": cubin.EIATTR_KPARAM_INFO,
         "EIATTR_CBANK_PARAM_SIZE": cubin.EIATTR_CBANK_PARAM_SIZE, "EIATTR_MAXREG_COUNT": cubin.EIATTR_MAXREG_COUNT,
         "EIATTR_REGCOUNT": cubin.EIATTR_REGCOUNT}
  from tiny_runtime_nv.elf import ELF
  elf = ELF(lib)
  for section in (".nv.info", f".nv.info.k_{n}"):
    theirs = _attributes(dump, section)
    ours = cubin._attributes(elf.data(section))
    assert len(ours) == len(theirs), section
    for (f, a, _), (name, tfmt, _) in zip(ours, theirs):
      assert f == fmt[tfmt], (section, name)
      if name in ids: assert a == ids[name], name
    seen = {name for name, _, _ in theirs}
    if section == ".nv.info": assert {"EIATTR_REGCOUNT", "EIATTR_MIN_STACK_SIZE"} <= seen
    else: assert {"EIATTR_KPARAM_INFO", "EIATTR_PARAM_CBANK", "EIATTR_CBANK_PARAM_SIZE"} <= seen
  values = {name: v for name, _, v in _attributes(dump, ".nv.info")}
  assert int(re.search(r"register count: (\d+)", values["EIATTR_REGCOUNT"]).group(1)) == info.registers
  assert int(re.search(r"min stack size: (0x[0-9a-f]+)", values["EIATTR_MIN_STACK_SIZE"]).group(1), 16) == \
    info.local_size
  kernel = _attributes(dump, f".nv.info.k_{n}")
  params = [tuple(int(x, 16) for x in re.search(r"Ordinal : (0x\w+)\tOffset  : (0x\w+)\tSize    : (0x\w+)", v).groups())
            for name, _, v in kernel if name == "EIATTR_KPARAM_INFO"]
  assert sorted(params) == [(p.ordinal, p.offset, p.size) for p in info.params]
  assert [p.size for p in info.params] == [8, 8, 4, 8, 4]
  cbank = next(v for name, _, v in kernel if name == "EIATTR_PARAM_CBANK")
  packed = int(re.match(r"\s*0x\w+ (0x\w+)", cbank).group(1), 16)  # cuobjdump: symbol, then size << 16 | offset
  assert (packed & 0xFFFF, packed >> 16) == (info.param_offset, info.param_size) and info.param_size == 0x24
  shared_sec = re.search(rf"^\s+\w+\s+\w+\s+(\w+)\s+0\s+\w+\s+NOBITS\s+\w+\s+\w+\s+\w+ \.nv\.shared\.k_{n}$", dump,
                         re.M)
  assert shared_sec and int(shared_sec.group(1), 16) == info.shared_size >= shared


def test_a_kernel_that_is_not_there_and_bytes_that_are_no_cubin():
  lib = PTXCompiler("sm_90", use_ptxas=True).compile(PTX.format(arch="sm_90", n="x", shared=4))
  with pytest.raises(cubin.CubinError, match=r"no kernel 'nope'; it has \['k_x'\]"): cubin.load_kernel_info(lib, "nope")
  with pytest.raises(cubin.CubinError, match="not a cubin"): cubin.load_kernel_info(b".version 7.8", "k_x")


DATA = pathlib.Path(__file__).parent / "data"


def _with_header(lib: bytes, abi: int, flags: int) -> bytes:
  """`lib` with e_ident[EI_ABIVERSION] = `abi` and e_flags = `flags` (ELF64: e_flags at byte 0x30)."""
  b = bytearray(lib)
  b[8] = abi
  struct.pack_into("<I", b, 0x30, flags)
  return bytes(b)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90"])
def test_the_target_is_read_by_elf_abi_version(arch):
  sm = int(arch[3:])
  lib = PTXCompiler(arch, use_ptxas=True).compile(PTX.format(arch=arch, n="abi", shared=4))
  # ptxas 13 writes ABI 8, the SM in bits 15:8
  assert lib[8] == cubin.ELFABIVERSION_CUDA_V2 and (struct.unpack_from("<I", lib, 0x30)[0] >> 8) & 0xFF == sm
  assert cubin.load_kernel_info(lib, "k_abi").arch == arch
  # the same cubin with an ABI 7 header as ptxas 12 writes it: SM in bits 7:0 and again in the virtual-SM field
  # 23:16, EF_CUDA_TEXMODE_UNIFIED 0x100 | EF_CUDA_64BIT_ADDRESS 0x400 in bits 15:8 (0x005a055a for sm_90)
  old = _with_header(lib, cubin.ELFABIVERSION_CUDA_V1, sm << 16 | 0x500 | sm)
  assert cubin.load_kernel_info(old, "k_abi").arch == arch
  assert cubin.cubin_arch(7, 0x005A055A) == cubin.cubin_arch(8, 0x06005A04) == "sm_90"
  with pytest.raises(cubin.CubinError, match=r"cubin ELF ABI version 9 is unknown; known are 7 .* and 8"):
    cubin.load_kernel_info(_with_header(lib, 9, 0x06005A04), "k_abi")


def test_a_ptxas_12_cubin_loads_and_runs_on_its_gpu():
  lib, src = (DATA / "ptxas12_sm_80.cubin").read_bytes(), (DATA / "ptxas12_sm_80.ptx").read_text()
  assert lib[8] == cubin.ELFABIVERSION_CUDA_V1 and struct.unpack_from("<I", lib, 0x30)[0] == 0x00500550
  info = cubin.load_kernel_info(lib, "k_x")
  assert info.arch == "sm_80" and [p.size for p in info.params] == [8, 8, 4]
  # ptxas 13 on the same PTX: the same parameter facts (the reader agrees across ABI versions)
  new = cubin.load_kernel_info(PTXCompiler("sm_80", use_ptxas=True).compile(src), "k_x")
  assert (new.arch, new.params, new.param_offset, new.param_size) == \
    (info.arch, info.params, info.param_offset, info.param_size)
  dev = Device["MOCK+NV:1"]  # the mock A100 (sm_80); the mock GPU executes the PTX kept beside the cubin
  prg = dev.get_program("k_x", with_ptx(lib, src))
  x = np.arange(100, dtype=np.float32) - 7
  inp = Buffer("MOCK+NV:1", 128, dtypes.float).copyin(memoryview(np.concatenate([x, np.ones(28, np.float32)])))
  out = Buffer("MOCK+NV:1", 128, dtypes.float).copyin(memoryview(np.zeros(128, np.float32)))
  prg(out._buf, inp._buf, global_size=(1, 1, 1), local_size=(128, 1, 1), vals=(100,), wait=True)
  np.testing.assert_array_equal(out.numpy(), np.concatenate([x * 2, np.zeros(28, np.float32)]))


# A kernel that reads its block and grid size, converts a shared and a local address to generic ones and calls a
# recursive function (which needs a stack): what ptxas-compiled code reads from constant bank 0's driver area.
DRIVER_AREA_PTX = """.version 7.8
.target {arch}
.address_size 64
.func (.param .b32 r) f(.param .b32 a)
{{
  .reg .b32 %r<6>; .reg .b64 %rd<4>; .reg .pred %p<2>;
  .local .align 4 .b8 arr[64];
  ld.param.u32 %r1, [a];
  mov.u64 %rd1, arr; mul.wide.u32 %rd2, %r1, 4; add.s64 %rd3, %rd1, %rd2;
  st.local.u32 [%rd3], %r1; ld.local.u32 %r2, [arr+8];
  setp.eq.u32 %p1, %r1, 0;
  @%p1 bra DONE;
  sub.u32 %r3, %r1, 1;
  {{ .param .b32 a2; st.param.b32 [a2], %r3; .param .b32 r2; call (r2), f, (a2); ld.param.b32 %r4, [r2]; }}
  add.u32 %r2, %r2, %r4;
DONE:
  st.param.b32 [r], %r2;
  ret;
}}
.visible .entry k(.param .u64 out, .param .u32 n)
{{
  .reg .b64 %rd<12>; .reg .b32 %r<12>;
  .local .align 4 .b8 larr[64];
  .shared .align 4 .b8 sh[64];
  ld.param.u64 %rd1, [out]; ld.param.u32 %r1, [n];
  mov.u64 %rd2, larr; cvta.local.u64 %rd3, %rd2; mov.u64 %rd4, sh; cvta.shared.u64 %rd5, %rd4;
  mul.wide.u32 %rd6, %r1, 4; add.s64 %rd7, %rd3, %rd6; st.u32 [%rd7], %r1; add.s64 %rd8, %rd5, %rd6;
  st.u32 [%rd8], %r1; bar.sync 0; ld.u32 %r2, [%rd3+4]; ld.u32 %r3, [%rd5+8];
  mov.u32 %r4, %ntid.x; mov.u32 %r5, %ntid.y; mov.u32 %r6, %ntid.z;
  mov.u32 %r7, %nctaid.x; mov.u32 %r8, %nctaid.y; mov.u32 %r9, %nctaid.z;
  add.s32 %r2, %r2, %r3; add.s32 %r2, %r2, %r4; add.s32 %r2, %r2, %r5; add.s32 %r2, %r2, %r6;
  add.s32 %r2, %r2, %r7; add.s32 %r2, %r2, %r8; add.s32 %r2, %r2, %r9;
  {{ .param .b32 a; st.param.b32 [a], %r2; .param .b32 r; call (r), f, (a); ld.param.b32 %r10, [r]; }}
  cvta.to.global.u64 %rd9, %rd1;
  st.global.u32 [%rd9], %r10;
  ret;
}}
"""


def _cbank_reads(lib: bytes, kernel: str) -> list[tuple[int, int, int]]:
  """(bank, byte offset, destination register) of every instruction of `kernel` with a constant-bank operand, from
  the Volta+ 128-bit SASS encoding: operand form bits 11:9 = 3 or 5 (a c[bank][offset] operand), the offset in bits
  53:38, the bank in bits 58:54, the destination register in bits 23:16. The parameters' offset that cuobjdump
  gives (EIATTR_PARAM_CBANK, test above) shows up among them, which checks this reading of the encoding."""
  text = ELF(lib).data(f".text.{kernel}")
  out = []
  for i in range(0, len(text), 16):
    lo = struct.unpack_from("<Q", text, i)[0]
    if (lo >> 9) & 7 in (3, 5): out.append(((lo >> 54) & 0x1F, (lo >> 38) & 0xFFFF, (lo >> 16) & 0xFF))
  return out


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cbank0_driver_area_is_what_ptxas_code_reads(arch):
  """NVIDIA's ptxas is the independent source for constant bank 0's driver area (NVIDIA documents no layout): the
  code it emits reads %ntid.x/y/z at bytes 0x0/0x4/0x8, %nctaid.x/y/z at 0xc/0x10/0x14, the shared and local window
  bases for cvta.shared/cvta.local at 0x18/0x20 (sm_80; sm_90 only the local one), and loads the stack pointer R1
  from 0x28 first thing -- the offsets the driver fills (device.py CB0_*) and the mock checks."""
  from tiny_runtime_nv import device
  lib = PTXCompiler(arch, use_ptxas=True).compile(DRIVER_AREA_PTX.format(arch=arch))
  info = cubin.load_kernel_info(lib, "k")
  reads = _cbank_reads(lib, "k")
  offsets = {off for bank, off, _ in reads if bank == 0}
  assert info.param_offset in offsets and info.param_offset + 8 in offsets  # `out` and `n`: the decoding is right
  assert {device.CB0_NTID + 4 * i for i in range(3)} | {device.CB0_NCTAID + 4 * i for i in range(3)} <= offsets
  assert device.CB0_LOCAL_WINDOW in offsets
  # sm_80 code reads the shared window base there too; sm_90 code does not read it from the bank (it has no read of
  # byte 0x18 at all), so on Hopper that word is only what the driver writes
  assert (device.CB0_SHARED_WINDOW in offsets) == (arch == "sm_80")
  assert reads[0] == (0, device.CB0_UNKNOWN, 1)  # R1 = c[0x0][0x28]: the stack pointer's start
