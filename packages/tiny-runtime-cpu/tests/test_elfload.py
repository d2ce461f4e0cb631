"""The x86-64 object loader (`tiny_runtime_cpu.elfload`): each kernel in one mapping, so its code reaches its
constants wherever the address space is split; calls into this process through stubs; errors that name what's wrong.

The kernels are LLVM IR compiled by tiny-codegen's `LLVMCompiler` (the CPU device's compiler), chosen so that together
they use every relocation type our kernels produce (checked with pyelftools): constants (``R_X86_64_PC32`` into
``.rodata.cst*``), libm calls (``R_X86_64_PLT32`` to stubs), globals (``R_X86_64_REX_GOTPCRELX`` through the GOT)
and a table of pointers (``R_X86_64_64`` in ``.data``). Results are checked against numpy.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import mmap
import platform
import random
import struct
import subprocess
import sys

import numpy as np
import pytest

from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.plugins import Device

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux",
                                reason="the ELF loader is for x86-64 Linux (other machines link with MCJIT)")

N = 64
CONST_IR = """
define void @{name}(ptr noalias %out, ptr noalias %inp, i32 %core) nounwind {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i2, %loop]
  %p = getelementptr float, ptr %inp, i64 %i
  %x = load float, ptr %p
  %y = fmul float %x, {c}
  %z = fadd float %y, {d}
  %q = getelementptr float, ptr %out, i64 %i
  store float %z, ptr %q
  %i2 = add i64 %i, 1
  %done = icmp eq i64 %i2, {n}
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
"""
LIBM_IR = """
declare float @llvm.sin.f32(float)
declare float @llvm.exp2.f32(float)
define void @{name}(ptr noalias %out, ptr noalias %inp, i32 %core) nounwind {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i2, %loop]
  %p = getelementptr float, ptr %inp, i64 %i
  %x = load float, ptr %p
  %s = call float @llvm.sin.f32(float %x)
  %h = fmul float %x, {c}
  %e = call float @llvm.exp2.f32(float %h)
  %z = fadd float %s, %e
  %q = getelementptr float, ptr %out, i64 %i
  store float %z, ptr %q
  %i2 = add i64 %i, 1
  %done = icmp eq i64 %i2, {n}
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
"""
# a counter reached through the GOT and through a table of absolute pointers (R_X86_64_64 in .data)
GLOBALS_IR = """
@{name}_count = global i64 0
@{name}_tab = global [2 x ptr] [ptr @{name}_count, ptr @{name}_count]
define void @{name}(ptr noalias %out, ptr noalias %inp, i32 %core) nounwind {{
  %slot = getelementptr [2 x ptr], ptr @{name}_tab, i64 0, i64 1
  %p = load ptr, ptr %slot
  %c = load i64, ptr %p
  %c2 = add i64 %c, {step}
  store i64 %c2, ptr @{name}_count
  %f = sitofp i64 %c2 to float
  store float %f, ptr %out
  ret void
}}
"""


def compile_ir(src: str) -> bytes:
  from tiny_codegen.compiler.llvm import LLVMCompiler
  return LLVMCompiler().compile(src)


def kernels(tag: str, k: int = 0) -> list[tuple[str, bytes, object]]:
  """(name, object, expected(x) or a step) for one kernel of each kind; constants differ with `k`."""
  c, d = float(np.float32(1.5 + k / 64)), float(np.float32(0.25 + k / 128))
  h = float(np.float32(0.5 + k / 256))
  return [(f"{tag}_c{k}", compile_ir(CONST_IR.format(name=f"{tag}_c{k}", c=c, d=d, n=N)),
           lambda x: x * np.float32(c) + np.float32(d)),
          (f"{tag}_m{k}", compile_ir(LIBM_IR.format(name=f"{tag}_m{k}", c=h, n=N)),
           lambda x: np.sin(x) + np.exp2(x * np.float32(h))),
          (f"{tag}_g{k}", compile_ir(GLOBALS_IR.format(name=f"{tag}_g{k}", step=k + 1)), k + 1)]


class Runner:
  """Buffers for the test kernels and a check of one loaded kernel against numpy."""

  def __init__(self) -> None:
    self.x = np.linspace(-2, 2, N, dtype=np.float32)
    self.inp, self.out = Buffer("CPU", N, dtypes.float32).allocate(), Buffer("CPU", N, dtypes.float32).allocate()
    self.inp.copyin(memoryview(self.x))

  def check(self, prg, want) -> None:
    if isinstance(want, int):  # the globals kernel: a counter that grows by `want` per launch
      for launch in (1, 2, 3):
        prg(self.out._buf, self.inp._buf)
        assert self.out.numpy()[0] == want * launch, f"{prg.name}: launch {launch}"
      return
    prg(self.out._buf, self.inp._buf)
    np.testing.assert_allclose(self.out.numpy(), want(self.x), rtol=2e-6, atol=2e-6, err_msg=prg.name)


def reloc_types(obj: bytes) -> set[str]:
  from elftools.elf.elffile import ELFFile
  from elftools.elf.relocation import RelocationSection
  e = ELFFile(io.BytesIO(obj))
  from elftools.elf.enums import ENUM_RELOC_TYPE_x64
  names = {v: k for k, v in ENUM_RELOC_TYPE_x64.items() if isinstance(v, int)}
  return {names.get(r["r_info_type"], str(r["r_info_type"])) for s in e.iter_sections()
          if isinstance(s, RelocationSection) for r in s.iter_relocations()}


def maps() -> list[tuple[int, int, str, str]]:
  """(start, end, permissions, name) of every mapping of this process."""
  out = []
  with open("/proc/self/maps") as f:
    for line in f:
      parts = line.split()
      lo, hi = (int(v, 16) for v in parts[0].split("-"))
      out.append((lo, hi, parts[1], parts[5] if len(parts) > 5 else ""))
  return out


# ***** facts checked against pyelftools (the ELF gABI and x86-64 psABI constants, not typed by hand there) *****
def test_constants_match_pyelftools():
  from elftools.elf.constants import SH_FLAGS
  from elftools.elf.enums import (ENUM_E_MACHINE, ENUM_E_TYPE, ENUM_RELOC_TYPE_x64, ENUM_SH_TYPE_AMD64,
                                  ENUM_SH_TYPE_BASE, ENUM_ST_INFO_TYPE, ENUM_ST_SHNDX)
  from tiny_runtime_cpu import elfload as E
  assert (E.ET_REL, E.EM_X86_64) == (ENUM_E_TYPE["ET_REL"], ENUM_E_MACHINE["EM_X86_64"])
  for name in ("SHT_PROGBITS", "SHT_SYMTAB", "SHT_RELA", "SHT_NOTE", "SHT_NOBITS", "SHT_REL", "SHT_INIT_ARRAY",
               "SHT_FINI_ARRAY", "SHT_PREINIT_ARRAY"):
    assert getattr(E, name) == ENUM_SH_TYPE_BASE[name], name
  assert E.SHT_X86_64_UNWIND == ENUM_SH_TYPE_AMD64["SHT_AMD64_UNWIND"]
  for name in ("SHF_WRITE", "SHF_ALLOC", "SHF_EXECINSTR", "SHF_TLS"): assert getattr(E, name) == getattr(SH_FLAGS, name)
  for name in ("SHN_UNDEF", "SHN_ABS", "SHN_COMMON"): assert getattr(E, name) == ENUM_ST_SHNDX[name], name
  assert (E.STT_SECTION, E.STT_TLS) == (ENUM_ST_INFO_TYPE["STT_SECTION"], ENUM_ST_INFO_TYPE["STT_TLS"])
  # every relocation type the loader applies, by number and name (pyelftools has no R_X86_64_GOTPCRELX, 41: psABI)
  for num, name in E.RELOC_NAMES.items():
    if name != "R_X86_64_GOTPCRELX": assert ENUM_RELOC_TYPE_x64[name] == num, name
  assert set(E.RELOCS) | {E.R_X86_64_NONE} == set(E.RELOC_NAMES)


# ***** loading and running *****
def test_kernels_use_every_relocation_kind_and_run():
  ks = kernels("use")
  used = set().union(*(reloc_types(obj) for _, obj, _ in ks))
  # the kernels exercise what our compiler emits: if LLVM changes its choices, this says so
  assert {"R_X86_64_PC32", "R_X86_64_PLT32", "R_X86_64_64"} <= used and used & {"R_X86_64_REX_GOTPCRELX", "41",
                                                                               "R_X86_64_GOTPCREL"}, used
  dev, run = Device["CPU"], Runner()
  for name, obj, want in ks: run.check(dev.get_program(name, obj), want)


def test_one_mapping_per_kernel_with_its_protections():
  from tiny_runtime_cpu.elfload import PAGE, LoadedObject
  name, obj, _ = kernels("prot")[2]  # the globals kernel: code, a GOT, writable data
  img = LoadedObject(obj, name)
  lo, hi = img.base, img.base + img.size
  for sym in (name, f"{name}_count", f"{name}_tab"): assert lo <= img.symbol(sym) < hi, sym
  assert img.symbol("no_such_symbol") == 0
  perms = [(max(a, lo), min(b, hi), p) for a, b, p, _ in maps() if a < hi and b > lo]
  assert perms[0][0] == lo and perms[-1][1] == hi and all(x[1] == y[0] for x, y in zip(perms, perms[1:])), perms
  kinds = [p[:3] for _, _, p in perms]
  assert kinds == ["r-x", "r--", "rw-"], kinds  # code, then constants + GOT, then data: never writable and executable
  assert (img.symbol(name) - lo) < PAGE <= img.symbol(f"{name}_count") - lo
  img.close()
  assert not [m for m in maps() if m[0] < hi and m[1] > lo]  # unmapped


def test_image_is_unmapped_when_dropped():
  from tiny_runtime_cpu.elfload import LoadedObject
  name, obj, _ = kernels("drop")[0]
  img = LoadedObject(obj, name)
  lo = img.base
  assert any(a <= lo < b for a, b, _, _ in maps())
  del img
  gc.collect()
  assert not any(a <= lo < b for a, b, _, _ in maps())


def _far_map(size: int) -> int:
  """A mapping at 16 TiB: terabytes from libm and from every buffer, so only stubs and the GOT can reach them."""
  from tiny_runtime_cpu import elfload
  libc = elfload._libc()
  for hint in range(1 << 44, (1 << 44) + (1 << 36), 1 << 32):
    addr = libc.mmap(hint, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr == hint: return addr
    libc.munmap(addr, size)
  raise AssertionError("no free address near 16 TiB")


def test_kernel_terabytes_from_libm_calls_it_through_stubs(monkeypatch):
  from tiny_runtime_cpu import elfload
  monkeypatch.setattr(elfload, "_map", _far_map)
  dev, run = Device["CPU"], Runner()
  sinf = elfload.process_symbol("sinf")
  for name, obj, want in kernels("far"):
    prg = dev.get_program(name, obj)
    assert abs(prg.addr - sinf) > 1 << 40 and abs(prg.addr - run.inp._buf.addr) > 1 << 40
    run.check(prg, want)


# ***** the bug: a multi-GB allocation between kernel loads (issue #17's 2.2 GB buffer) *****
PROT_NONE, MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0, 0x4000, 0x100000  # Linux <bits/mman-linux.h>, <linux/mman.h>


@contextlib.contextmanager
def split_address_space(size: int = 3 << 30):
  """Reserve `size` bytes of address space (PROT_NONE: no memory is used) and every free gap above it, so mappings
  made earlier stay above the reservation and new ones land below it: what a live multi-GB buffer does to the
  kernels loaded before and after it, made certain. Everything is unmapped at the end."""
  from tiny_runtime_cpu import elfload
  libc = elfload._libc()
  flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
  big = libc.mmap(None, size, PROT_NONE, flags, -1, 0)
  assert big not in (None, ctypes.c_void_p(-1).value)
  held = [(big, size)]
  try:
    special = ("[stack]", "[vvar]", "[vdso]", "[vsyscall]", "[vvar_vclock]")
    ms = sorted(m for m in maps() if m[3] not in special)
    for (_, end, _, _), (nxt, _, _, _) in zip(ms, ms[1:]):
      if end >= big + size and nxt > end:
        got = libc.mmap(end, nxt - end, PROT_NONE, flags | MAP_FIXED_NOREPLACE, -1, 0)
        if got not in (None, ctypes.c_void_p(-1).value): held.append((got, nxt - end))
    yield big
  finally:
    for addr, n in held: libc.munmap(addr, n)


def test_kernels_loaded_across_a_split_address_space():
  """MCJIT aborted the process here (RuntimeDyldELF: Assertion `isInt<32>(RealOffset)' failed): a kernel's code
  below a 3 GB block and its constant pool above it. Each kernel is now one mapping: all of them run right."""
  dev, run = Device["CPU"], Runner()
  before = [(dev.get_program(name, obj), want) for name, obj, want in kernels("split", 0)]
  later = [kernels("split", k) for k in range(1, 4)]  # compiled before the split: only loading happens inside it
  with split_address_space() as big:
    after = [(dev.get_program(name, obj), want) for ks in later for name, obj, want in ks]
    # the split is real: kernels loaded before are above the 3 GB block, those loaded inside it below
    assert all(p.addr > big + (3 << 30) for p, _ in before) and all(p.addr < big for p, _ in after)
    for prg, want in before + after: run.check(prg, want)


def test_clang_shared_objects_across_a_split_address_space(tmp_path):
  """CPU:CLANG's shared objects don't share the problem: the dynamic loader maps each as one span (PIC, with a PLT
  and GOT for calls into libm)."""
  from tiny_codegen.compiler.clang import ClangCompiler
  src = ("#include <math.h>\nvoid {name}(float* restrict out, const float* restrict in, int core_id) {{\n"
         "  for (int i = 0; i < {n}; i++) out[i] = sinf(in[i]) * {c}f + 0.25f;\n}}\n")
  cc = ClangCompiler()
  libs = {k: cc.compile(src.format(name=f"so{k}", n=N, c=1.5 + k)) for k in range(2)}
  dev, run = Device["CPU"], Runner()
  first = dev.get_program("so0", libs[0])
  with split_address_space() as big:
    second = dev.get_program("so1", libs[1])
    assert first.addr > big + (3 << 30) and second.addr < big
    for k, prg in enumerate((first, second)):
      run.check(prg, lambda x, k=k: np.sin(x) * np.float32(1.5 + k) + np.float32(0.25))


# ***** errors *****
def test_unresolved_symbols_are_all_named_and_nothing_is_mapped(monkeypatch):
  from tiny_runtime_cpu import elfload
  from tiny_runtime_cpu.cpu import UnresolvedSymbolError
  ir = ("declare void @tiny_missing_a()\ndeclare float @tiny_missing_b(float)\n"
        "define void @k(ptr %p) {\n  call void @tiny_missing_a()\n  %x = call float @tiny_missing_b(float 1.0)\n"
        "  store float %x, ptr %p\n  ret void\n}\n")
  monkeypatch.setattr(elfload, "_map", lambda size: pytest.fail("mapped before the symbols were checked"))
  with pytest.raises(UnresolvedSymbolError, match="kernel 'k' calls 'tiny_missing_a', 'tiny_missing_b', which this "
                                                  "process can't resolve"):
    elfload.LoadedObject(compile_ir(ir), "kernel 'k'")


def _patch_first_reloc(obj: bytes, rtype: int) -> bytes:
  """`obj` with its first relocation's type set to `rtype`."""
  from elftools.elf.elffile import ELFFile
  e = ELFFile(io.BytesIO(obj))
  rela = next(s for s in e.iter_sections() if s["sh_type"] == "SHT_RELA" and s["sh_size"])
  out = bytearray(obj)
  at = rela["sh_offset"] + 8  # Elf64_Rela: r_offset (8 bytes), then r_info: type in the low 32 bits
  struct.pack_into("<I", out, at, rtype)
  return bytes(out)


def test_unknown_relocation_type_is_an_error_naming_it(monkeypatch):
  from tiny_runtime_cpu import elfload
  name, obj, _ = kernels("rel")[0]
  unmapped = []
  real_unmap = elfload._unmap
  monkeypatch.setattr(elfload, "_unmap", lambda a, n: (unmapped.append(a), real_unmap(a, n)))
  with pytest.raises(elfload.ObjectLoadError, match=r"relocation type 25 at \.text\+0x[0-9a-f]+ is not supported; "
                                                    r"supported: R_X86_64_NONE, R_X86_64_64, R_X86_64_PC32"):
    elfload.LoadedObject(_patch_first_reloc(obj, 25), name)  # R_X86_64_GOTOFF64: the large code model's
  assert len(unmapped) == 1  # the mapping made for it is gone


def test_a_relocation_that_does_not_fit_is_an_error():
  """A hidden external global is reached PC-relative (32 bits): placed 1 TiB away it can't be, and the loader
  says so instead of wrapping the displacement."""
  from tiny_runtime_cpu import elfload
  ir = ("@ext = external hidden global i32\ndefine void @k(ptr %p) {\n  %v = load i32, ptr @ext\n"
        "  store i32 %v, ptr %p\n  ret void\n}\n")
  obj = compile_ir(ir)
  assert "R_X86_64_PC32" in reloc_types(obj)
  with pytest.raises(elfload.ObjectLoadError, match=r"R_X86_64_PC32 at \.text\+0x[0-9a-f]+ against symbol 'ext': "
                                                    r"-?0x[0-9a-f]+ doesn't fit its 32-bit field"):
    elfload.LoadedObject(obj, "kernel 'k'", resolve=lambda name: 1 << 40)
  # within reach it loads, and the code reads it: a variable next to the kernel, in a page of its own mapping
  cell = elfload._map(4096)
  try:
    ctypes.c_int32.from_address(cell).value = 12345
    img = elfload.LoadedObject(obj, "kernel 'k'", resolve=lambda name: cell)
    if abs(img.base - cell) < 1 << 31:
      out = ctypes.c_int32(0)
      ctypes.CFUNCTYPE(None, ctypes.c_void_p)(img.symbol("k"))(ctypes.addressof(out))
      assert out.value == 12345
  finally: elfload._unmap(cell, 4096)


def test_other_objects_are_refused_clearly():
  from tiny_runtime_cpu.elfload import LoadedObject, ObjectLoadError
  name, obj, _ = kernels("bad")[0]
  with pytest.raises(ObjectLoadError, match="not a 64-bit little-endian ELF file"): LoadedObject(b"\x7fELF\x01\x01")
  aarch64 = bytearray(obj)
  struct.pack_into("<H", aarch64, 18, 183)  # EM_AARCH64
  with pytest.raises(ObjectLoadError, match="ELF type 1 machine 183; this loader takes x86-64 relocatable objects"):
    LoadedObject(bytes(aarch64))
  with pytest.raises(ObjectLoadError, match="section header table"): LoadedObject(obj[:len(obj) // 2])


def test_malformed_objects_never_crash():
  """Seeded mutations of real objects (header fields, section headers, symbols, relocations) and truncations: each
  loads or raises ObjectLoadError/UnresolvedSymbolError, never another exception (nothing is run)."""
  from tiny_runtime_cpu.elfload import LoadedObject, ObjectLoadError, UnresolvedSymbolError
  rng = random.Random(18)
  objs = [obj for _, obj, _ in kernels("fuzz")]
  outcomes = {"loaded": 0, "refused": 0}
  for i in range(400):
    obj = bytearray(rng.choice(objs))
    if i % 10 == 0: obj = obj[:rng.randrange(len(obj))]
    else:
      shoff = struct.unpack_from("<Q", obj, 0x28)[0]
      for _ in range(rng.randint(1, 4)):  # aim at the structures: the ELF header, section headers, then anywhere
        region = rng.choice([(0, 64), (shoff, len(obj)), (64, len(obj))])
        at = rng.randrange(*region) if region[0] < region[1] else 0
        obj[at] = rng.randrange(256)
    try:
      img = LoadedObject(bytes(obj), f"mutant {i}", resolve=lambda name: 0x1000 if name.isidentifier() else 0)
      img.close()
      outcomes["loaded"] += 1
    except (ObjectLoadError, UnresolvedSymbolError): outcomes["refused"] += 1
  assert outcomes["loaded"] and outcomes["refused"], outcomes


def test_mcjit_fallback_still_links():
  """Machines other than x86-64 link with MCJIT (there llvmlite's memory manager keeps an object's sections
  together): the class still loads and runs kernels here."""
  from tiny_runtime_cpu.cpu import MCJIT
  jit, run = MCJIT(), Runner()
  for name, obj, want in kernels("mcjit"):
    addr, _ = jit.load(name, obj)

    class Prg:
      def __init__(self, addr, name):
        self.fn, self.name = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(addr), name

      def __call__(self, out, inp): self.fn(out.addr, inp.addr, 0)
    run.check(Prg(addr, name), want)


def test_loader_choice_is_explicit_and_a_refusal_never_falls_back(monkeypatch):
  """`object_loader`: an x86-64 object goes to our loader, another machine's (aarch64) to MCJIT, ``CPU_LOADER``
  overrides either way and rejects other values. A refused object is an `ObjectLoadError` naming the problem and the
  ``CPU_LOADER=MCJIT`` escape, and MCJIT is never tried behind it."""
  from tiny_uop.helpers import Context
  from tiny_runtime_cpu import cpu
  from tiny_runtime_cpu.elfload import ObjectLoadError
  dev, run = Device["CPU"], Runner()
  (name, obj, want), (mname, mobj, mwant), (bname, bobj, _) = kernels("choice")
  aarch64 = obj[:18] + struct.pack("<H", 183) + obj[20:]  # e_machine EM_AARCH64 (gABI)
  assert cpu.object_loader(obj) == "elf" and cpu.object_loader(aarch64) == "mcjit"
  with Context(CPU_LOADER="MCJIT"): assert cpu.object_loader(obj) == "mcjit"
  with Context(CPU_LOADER="elf"): assert cpu.object_loader(aarch64) == "elf"
  with Context(CPU_LOADER="orc"), pytest.raises(ValueError, match="CPU_LOADER='orc': valid are '' .*, ELF and MCJIT"):
    cpu.object_loader(obj)
  prg = dev.get_program(name, obj)
  assert prg.loader == "elf" and prg._image.symbol(name) == prg.addr
  run.check(prg, want)
  with Context(CPU_LOADER="MCJIT"): prg = dev.get_program(mname, mobj)  # the escape hatch links and runs
  assert prg.loader == "mcjit" and not hasattr(prg, "_image")
  run.check(prg, mwant)
  with Context(CPU_LOADER="ELF"), pytest.raises(ObjectLoadError, match="machine 183; this loader takes x86-64"):
    dev.get_program("choice_arm", aarch64)

  class Tried(Exception): pass
  def jit_load(*args): raise Tried()
  monkeypatch.setattr(dev.jit, "load", jit_load)
  with pytest.raises(Tried): dev.get_program("choice_arm", aarch64)  # another machine's object: MCJIT's
  with pytest.raises(ObjectLoadError, match=r"relocation type 25 at \.text\+0x[0-9a-f]+ is not supported; .*"
                                            r"\(CPU_LOADER=MCJIT links LLVM objects with llvmlite's MCJIT instead"):
    dev.get_program(bname, _patch_first_reloc(bobj, 25))


# ***** issue #17's scene for real: a 2.2 GB buffer alive in this process while new kernels load *****
BIG = 2**31 + 64
BIG_IR = """
define void @big_poke(ptr %buf, i32 %core) nounwind {
  %a = getelementptr i8, ptr %buf, i64 2147483653
  store i8 7, ptr %a
  %b = getelementptr i8, ptr %buf, i64 2147483645
  store i8 9, ptr %b
  ret void
}
define void @big_inc(ptr noalias %buf, i32 %core) nounwind {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i2, %loop]
  %p = getelementptr i8, ptr %buf, i64 %i
  %x = load i8, ptr %p
  %y = add i8 %x, 1
  store i8 %y, ptr %p
  %i2 = add i64 %i, 1
  %done = icmp eq i64 %i2, {n}
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
define void @big_sum(ptr noalias %out, ptr noalias %buf, i32 %core) nounwind {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i2, %loop]
  %acc = phi i64 [0, %entry], [%acc2, %loop]
  %p = getelementptr i8, ptr %buf, i64 %i
  %x = load i8, ptr %p
  %w = zext i8 %x to i64
  %acc2 = add i64 %acc, %w
  %i2 = add i64 %i, 1
  %done = icmp eq i64 %i2, {n}
  br i1 %done, label %exit, label %loop
exit:
  store i64 %acc2, ptr %out
  ret void
}
"""


def _rss() -> int:
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * mmap.PAGESIZE


@pytest.mark.bigmem
def test_kernels_load_and_run_next_to_a_2_2_gb_buffer():
  """In this process (no subprocess): a 2**31+64-byte buffer is written and read past index 2**31, then a dozen new
  kernels (constants, libm calls, globals) load and run while it is alive; freed afterwards (the allocator's cache
  too), so the rest of the suite doesn't carry 2.2 GB."""
  dev, run = Device["CPU"], Runner()
  lib = compile_ir(BIG_IR.replace("{n}", str(BIG)))
  later = [kernels("big", k) for k in range(1, 5)]
  rss0 = _rss()
  buf = Buffer("CPU", BIG, dtypes.uint8).allocate()
  total = Buffer("CPU", 1, dtypes.int64).allocate()
  try:
    poke, inc, add = (dev.get_program(n, lib) for n in ("big_poke", "big_inc", "big_sum"))
    poke(buf._buf)
    inc(buf._buf)
    mv = buf._buf.mv  # zero-copy: reads just these bytes
    assert bytes(mv[2**31 - 4:2**31 + 8]) == bytes([1, 10, 1, 1, 1, 1, 1, 1, 1, 8, 1, 1])
    assert mv[0] == 1 and mv[BIG - 1] == 1
    del mv
    add(total._buf, buf._buf)
    assert total.numpy()[0] == BIG + 7 + 9
    for ks in later:
      for name, obj, want in ks: run.check(dev.get_program(name, obj), want)
  finally:
    del buf
    dev.allocator.free_cache()
    gc.collect()
  assert _rss() < rss0 + (256 << 20), "the 2.2 GB block was not returned"


# ***** the relocations against an independent linker *****
def test_relocations_agree_with_ld_lld(tmp_path):
  """LLVM's linker, told to put every section where our loader put it (a linker script) and each called function at
  the stub our loader made for it, must write the same bytes at every PC-relative and absolute relocation; for
  the GOT relocations, both must load the same address through their GOT entries."""
  from elftools.elf.elffile import ELFFile
  from elftools.elf.relocation import RelocationSection
  from tiny_uop.tools import find_tool, tool_status
  from tiny_runtime_cpu.elfload import GOT_RELOCS, LoadedObject
  lld = find_tool("ld.lld")
  assert lld is not None, tool_status("ld.lld")
  irs = [CONST_IR.format(name="x_c", c=1.5, d=0.25, n=N), LIBM_IR.format(name="x_m", c=0.5, n=N),
         GLOBALS_IR.format(name="x_g", step=3)]
  decls = {line for ir in irs for line in ir.splitlines() if line.startswith("declare")}
  obj = compile_ir("\n".join(decls) + "\n" + "\n".join("\n".join(ln for ln in ir.splitlines()
                                                                  if not ln.startswith("declare")) for ir in irs))
  img = LoadedObject(obj, "kernels x")
  (tmp_path / "k.o").write_bytes(obj)
  script = "SECTIONS {\n" + "".join(f"  {n} {a:#x} : {{ *({n}) }}\n" for n, a in img.sections.items()) + \
           "  /DISCARD/ : { *(.eh_frame) }\n}\n"
  (tmp_path / "k.ld").write_text(script)
  defsyms = [f"--defsym={name}={addr:#x}" for name, addr in img.stubs.items()]
  assert {"sinf", "exp2f"} <= set(img.stubs)
  # -O0: constants stay where the object put them (lld otherwise dedups .rodata.cst* pieces, reordering them);
  # --no-relax: GOT loads stay GOT loads (lld would rewrite them into LEAs)
  subprocess.run([*lld, "-O0", "--no-relax", "-static", "-e", "x_c", "-T", str(tmp_path / "k.ld"), *defsyms,
                  str(tmp_path / "k.o"), "-o", str(tmp_path / "k")], check=True, capture_output=True)
  linked = ELFFile(open(tmp_path / "k", "rb"))
  theirs = {s.name: (s["sh_addr"], s.data()) for s in linked.iter_sections() if s["sh_addr"]}
  def lld_read(addr: int, n: int) -> bytes:
    for a, data in theirs.values():
      if a <= addr < a + len(data): return data[addr - a:addr - a + n]
    raise AssertionError(f"{addr:#x} is in no section ld.lld wrote")
  src = ELFFile(io.BytesIO(obj))
  checked = {}
  for rs in src.iter_sections():
    if not isinstance(rs, RelocationSection) or src.get_section(rs["sh_info"]).name not in img.sections: continue
    target = src.get_section(rs["sh_info"]).name
    assert theirs[target][0] == img.sections[target]  # ld.lld put it where we did
    for r in rs.iter_relocations():
      rtype, P = r["r_info_type"], img.sections[target] + r["r_offset"]
      if rtype in GOT_RELOCS:  # through the GOT: the entry each points to holds the same address
        ours = struct.unpack("<i", ctypes.string_at(P, 4))[0] + P - r["r_addend"]
        them = struct.unpack("<i", lld_read(P, 4))[0] + P - r["r_addend"]
        assert ctypes.string_at(ours, 8) == lld_read(them, 8), f"GOT relocation at {target}+{r['r_offset']:#x}"
      else:
        width = 8 if rtype in (1, 24) else 4
        assert ctypes.string_at(P, width) == lld_read(P, width), f"type {rtype} at {target}+{r['r_offset']:#x}"
      checked[rtype] = checked.get(rtype, 0) + 1
  assert {1, 2, 4} <= set(checked) and set(checked) & set(GOT_RELOCS), checked
  img.close()
