"""Regressions of issue #18 in the CPU runtime: an object with an unresolved symbol is an error naming it (MCJIT used
to finalize anyway and the kernel jumped to address 0), the ELF symbol reader behind that check, and devices that
refuse an interface they don't have (DEV=MOCK+CPU)."""
import io
import subprocess

import pytest

from tiny_uop.plugins import Device
from tiny_uop.tools import find_tool
from tiny_runtime_cpu.cpu import UnresolvedSymbolError, elf_undefined_symbols

IR = """
declare void @tiny_no_such_function_xyz(float)
declare float @llvm.sin.f32(float)
declare float @llvm.exp2.f32(float)
@table = global [2 x float] zeroinitializer
define void @{name}(ptr %p, float %x) {{
  call void @tiny_no_such_function_xyz(float %x)
  %s = call float @llvm.sin.f32(float %x)
  %e = call float @llvm.exp2.f32(float %s)
  store float %e, ptr %p
  store float %s, ptr @table
  ret void
}}
"""


def _obj(name: str, ir: str = IR) -> bytes:
  from tiny_codegen.compiler.llvm import LLVMCompiler
  return LLVMCompiler().compile(ir.format(name=name))


def test_elf_undefined_symbols_lists_what_the_loader_must_find():
  obj = _obj("k_syms")
  assert sorted(elf_undefined_symbols(obj)) == ["exp2f", "sinf", "tiny_no_such_function_xyz"]
  # a defined function or global is not undefined; a kernel with no calls needs nothing
  plain = _obj("k_plain", "define void @{name}(ptr %p) {{\n  store float 1.0, ptr %p\n  ret void\n}}\n")
  assert elf_undefined_symbols(plain) == []
  with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
    elf_undefined_symbols(b"\x7fELF\x01\x01" + bytes(64))


def test_elf_undefined_symbols_agree_with_pyelftools():
  """Cross-check with an independent ELF reader (pyelftools, a test dependency; binutils' nm is not on every
  machine): the undefined, named symbols of the symbol table."""
  from elftools.elf.elffile import ELFFile
  obj = _obj("k_nm")
  symtab = ELFFile(io.BytesIO(obj)).get_section_by_name(".symtab")
  want = [s.name for s in symtab.iter_symbols() if s.name and s["st_shndx"] == "SHN_UNDEF"]
  assert sorted(elf_undefined_symbols(obj)) == sorted(want) and len(want) == 3


def test_unresolved_symbol_is_an_error_naming_it():
  dev = Device["CPU"]
  with pytest.raises(UnresolvedSymbolError, match="kernel 'k_unres' calls 'tiny_no_such_function_xyz', which this "
                                                  "process can't resolve"):
    dev.get_program("k_unres", _obj("k_unres"))
  # libm's functions resolve: a kernel that only needs them loads
  ok = _obj("k_libm", IR.replace("  call void @tiny_no_such_function_xyz(float %x)\n", ""))
  assert dev.get_program("k_libm", ok).addr != 0


@pytest.mark.skipif(find_tool("cc") is None, reason="a shared object needs a C compiler: no C compiler (pip install "
                    "ziglang)")
def test_unresolved_symbol_in_a_shared_object(tmp_path):
  src = "extern void tiny_no_such_function_xyz(void);\nvoid k_so(void) { tiny_no_such_function_xyz(); }\n"
  cc = find_tool("cc")
  assert cc is not None
  subprocess.run([*cc, "-shared", "-fPIC", "-x", "c", "-", "-o", str(tmp_path / "k.so")], input=src.encode(),
                 check=True)
  with pytest.raises(UnresolvedSymbolError, match="kernel 'k_so' can't be loaded: undefined symbol: "
                                                  "tiny_no_such_function_xyz"):
    Device["CPU"].get_program("k_so", (tmp_path / "k.so").read_bytes())


@pytest.mark.parametrize("name", ["MOCK+CPU", "MOCK+PYTHON", "MOCK+NULL", "FOO+CPU:1"])
def test_cpu_devices_refuse_an_interface(name):
  from tiny_runtime_cpu.cpu import CPUDevice
  from tiny_runtime_cpu.null import NullDevice
  from tiny_runtime_cpu.python import PythonDevice
  cls = {"CPU": CPUDevice, "PYTHON": PythonDevice, "NULL": NullDevice}[name.split("+")[1].split(":")[0]]
  iface = name.split("+")[0]
  with pytest.raises(RuntimeError, match=rf"unknown interface '{iface}' for .*; valid: none \(the real driver\)"):
    cls(name)
