"""The AMD code-object toolchain: our linker, the msgpack metadata reader/writer, and compile errors."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import CompileError

from tiny_codegen.compiler.amdgpu import (NT_AMDGPU_METADATA, AMDGPUCompiler, link_code_object, msgpack_pack,
                                          msgpack_unpack, parse_elf, read_metadata)
from tiny_codegen.lower import lower
from tiny_codegen.renderer.amdgpu import AMDGPURenderer


def kernel_ir(nvars: int = 1) -> str:
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(64), arg=0), UOp(Ops.PARAM, dtypes.half.ptr(64), arg=1)
  i = UOp.range(64, 0)
  v = a.index(i).load().cast(dtypes.float)
  for k in range(nvars): v = v * UOp.variable(f"v{k}", 1, 8).cast(dtypes.float)
  r = AMDGPURenderer("gfx1100")
  return r.render(lower(c.index(i).store(v).sink(arg=KernelInfo("scale")), r, optimize=False).uops)


def test_metadata_describes_kernel_arguments():
  md = read_metadata(AMDGPUCompiler("gfx1100").compile(kernel_ir(nvars=2)))
  (k,) = md["amdhsa.kernels"]
  assert k[".name"] == "scale" and k[".symbol"] == "scale.kd" and md["amdhsa.target"] == "amdgcn-amd-amdhsa--gfx1100"
  assert [(a[".name"], a[".offset"], a[".size"], a[".value_kind"]) for a in k[".args"]][:4] == [
    ("data0", 0, 8, "global_buffer"), ("data1", 8, 8, "global_buffer"), ("var.v0", 16, 4, "by_value"),
    ("var.v1", 20, 4, "by_value")]
  assert k[".kernarg_segment_size"] >= 24 and k[".wavefront_size"] == 32 and k[".group_segment_fixed_size"] == 0


def test_msgpack_writer_reproduces_llvms_note_bytes():
  _, secs = parse_elf(AMDGPUCompiler("gfx1100").compile_object(kernel_ir()))
  note = next(s.data for s in secs if s.name == ".note")
  namesz, descsz, ntype = struct.unpack_from("<III", note, 0)
  assert ntype == NT_AMDGPU_METADATA and note[12:12 + namesz] == b"AMDGPU\0"
  desc = note[12 + (namesz + 3) // 4 * 4:][:descsz]
  assert msgpack_pack(msgpack_unpack(desc)) == desc  # byte for byte: same smallest encodings as LLVM's writer


values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) |
                      st.text(max_size=300) | st.binary(max_size=40),
                      lambda inner: st.lists(inner, max_size=20) |
                      st.dictionaries(st.text(max_size=8), inner, max_size=20),
                      max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(values)
def test_msgpack_round_trip(v):
  assert msgpack_unpack(msgpack_pack(v)) == v


def test_msgpack_known_encodings():  # msgpack spec examples
  assert msgpack_pack({"a": [1, -1, 300]}) == b"\x81\xa1a\x93\x01\xff\xcd\x01\x2c"
  assert msgpack_pack(True) == b"\xc3" and msgpack_pack(None) == b"\xc0" and msgpack_pack(-33) == b"\xd0\xdf"
  with pytest.raises(TypeError, match="can't encode set"): msgpack_pack({1})


def test_linker_output_is_loadable_layout():
  lib = AMDGPUCompiler("gfx1100").compile(kernel_ir())
  hdr, secs = parse_elf(lib)
  assert hdr[1] == 3 and hdr[2] == 224 and hdr[0][7] == 64 and hdr[0][8] == 2  # ET_DYN, AMDGPU, HSA ABI, code object v4
  phoff, phnum = hdr[5], hdr[10]
  loads = [struct.unpack_from("<IIQQQQQQ", lib, phoff + 56 * i) for i in range(phnum)]
  for p_type, _, off, va, _, filesz, memsz, align in loads:
    if p_type == 1: assert off % align == va % align and filesz == memsz  # mappable as is
  text = next(s for s in secs if s.name == ".text")
  assert any(p[0] == 1 and p[1] & 1 and p[3] <= text.addr < p[3] + p[5] for p in loads)  # code in an executable LOAD


def test_linker_rejects_non_amdgpu_objects():
  from tiny_codegen.compiler.llvm import LLVMCompiler
  host_obj = LLVMCompiler().compile("define void @f() {\n  ret void\n}\n")
  with pytest.raises(ValueError, match="AMDGPU relocatable object"): link_code_object(host_obj)
  with pytest.raises(ValueError, match="not a little-endian ELF64"): link_code_object(b"hello world, not elf")


def test_bad_ir_and_linker_name_raise():
  with pytest.raises(CompileError, match="invalid AMDGPU LLVM IR"): AMDGPUCompiler().compile("define nonsense")
  with pytest.raises(ValueError, match="valid: tiny, lld"): AMDGPUCompiler(linker="gold")
