"""AMDGPU LLVM IR -> HSA code object (an ELF shared object the ROCm/KFD loader accepts), in-process with llvmlite.

`AMDGPUCompiler(arch)`: parse and verify the IR, optimize (-O2 new pass manager), emit a relocatable object for
`amdgcn-amd-amdhsa` / `arch` with llvmlite's AMDGPU backend (which writes the kernel descriptor `name.kd` in
`.rodata` and the AMDGPU msgpack metadata note), then link it into a shared object (`ET_DYN`):
- `linker="tiny"` (default): `link_code_object` below, our own linker for the single-object case (no tools needed);
- `linker="lld"`: `ld.lld -shared` (`$LD_LLD` overrides the path; `apt-get install lld` or `pip install ziglang`),
  for comparison.
`$AMD_LINKER` picks the default. Code object v4 (see renderer/amdgpu.py). `read_metadata(lib)` decodes the
metadata note with our small msgpack reader; `msgpack_pack` writes msgpack. `disassemble` uses llvm-objdump.
"""
from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import tempfile
from typing import Any

from tiny_uop.device import CompileError, Compiler
from tiny_uop.tools import find_tool

from tiny_codegen.compiler.llvm import llvm_lock, optimize_module

TRIPLE = "amdgcn-amd-amdhsa"


@functools.cache
def _llvm() -> Any:
  import llvmlite.binding as llvm
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  return llvm


@functools.cache
def _target_machine(arch: str, opt: int) -> Any:
  llvm = _llvm()
  try: target = llvm.Target.from_triple(TRIPLE)
  except RuntimeError as e: raise CompileError(f"this llvmlite has no AMDGPU target: {e}") from e
  return target.create_target_machine(cpu=arch, features="", opt=opt, reloc="pic", codemodel="default")


def amdgpu_datalayout(arch: str = "gfx1100") -> str:
  """LLVM's data layout for amdgcn-amd-amdhsa (allocas in addrspace 5, LDS pointers 32 bits)."""
  return str(_target_machine(arch, 2).target_data)


def find_ld_lld() -> list[str] | None:
  """The command line of ld.lld: $LD_LLD, else ld.lld on PATH (also versioned names such as ld.lld-15), else
  ``zig ld.lld`` from the ziglang package, else None (`tiny_uop.tools.find_tool`)."""
  return find_tool("ld.lld")


class AMDGPUCompiler(Compiler):
  """LLVM IR text -> HSA code object bytes for `arch` (see the module docstring)."""

  def __init__(self, arch: str = "gfx1100", opt: int = 2, linker: str | None = None):
    self.arch, self.opt = arch, opt
    self.linker = (linker or os.environ.get("AMD_LINKER") or "tiny").lower()
    if self.linker not in ("tiny", "lld"): raise ValueError(f"AMD linker {self.linker!r} is unknown; valid: tiny, lld")
    self.ld_lld = find_ld_lld()
    lld = " ".join(self.ld_lld) if self.ld_lld and self.linker == "lld" else ""
    super().__init__(f"amdgpu_{arch}_O{opt}_{self.linker}_{lld}")

  def compile_object(self, src: str) -> bytes:
    """The relocatable ELF object (`ET_REL`) for `src`, before linking."""
    return self._emit(src, asm=False)  # type: ignore[return-value]

  def assembly(self, src: str) -> str:
    """The GCN/RDNA assembly (with the `.amdhsa_kernel` directives and YAML metadata) LLVM makes from `src`."""
    return self._emit(src, asm=True)  # type: ignore[return-value]

  def _emit(self, src: str, asm: bool) -> bytes | str:
    tm = _target_machine(self.arch, self.opt)
    with llvm_lock:
      mod = optimize_module(src, tm, TRIPLE, "AMDGPU ", self.opt)
      try: return str(tm.emit_assembly(mod)) if asm else bytes(tm.emit_object(mod))
      except RuntimeError as e:
        raise CompileError(f"AMDGPU backend failed for {self.arch}: {e}\n--- source ---\n{src}") from e

  def link(self, obj: bytes) -> bytes:
    """The code object for a relocatable object, with this compiler's linker."""
    return link_code_object(obj) if self.linker == "tiny" else self.link_lld(obj)

  def link_lld(self, obj: bytes) -> bytes:
    """`ld.lld -shared` of a relocatable object: the code object the HSA loader maps."""
    if self.ld_lld is None:
      raise CompileError("ld.lld is not installed (apt-get install lld, or pip install ziglang); can't link the "
                         "code object")
    with tempfile.TemporaryDirectory(prefix="tiny_amdgpu_") as d:
      o, so = os.path.join(d, "kernel.o"), os.path.join(d, "kernel.hsaco")
      with open(o, "wb") as f: f.write(obj)
      proc = subprocess.run([*self.ld_lld, "-shared", "--no-undefined", o, "-o", so], capture_output=True)
      if proc.returncode != 0:
        raise CompileError(f"ld.lld failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace')}")
      with open(so, "rb") as f: return f.read()

  def compile(self, src: str) -> bytes:
    """IR -> relocatable object -> linked code object."""
    return self.link(self.compile_object(src))

  def disassemble(self, lib: bytes) -> str:
    """llvm-objdump -d of the code object (when llvm-objdump is installed)."""
    if (tool := shutil.which("llvm-objdump")) is None: raise RuntimeError("llvm-objdump is not installed")
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
      f.write(lib)
      f.flush()
      cmd = [tool, "-d", f"--mcpu={self.arch}", f.name]
      return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


# ***** our own linker: relocatable AMDGPU object -> HSA code object (ELF shared object) *****
# ELF constants (System V gABI; AMDGPU specifics from LLVM's AMDGPUUsage "ELF Code Object")
ET_REL, ET_DYN, EM_AMDGPU = 1, 3, 224
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_HASH, SHT_DYNAMIC, SHT_NOTE, SHT_DYNSYM = 1, 2, 3, 4, 5, 6, 7, 11
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
PT_LOAD, PT_DYNAMIC, PT_NOTE, PT_PHDR = 1, 2, 4, 6
PF_X, PF_W, PF_R = 1, 2, 4
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 4, 5, 6, 10, 11
R_AMDGPU_NONE, R_AMDGPU_ABS32_LO, R_AMDGPU_ABS32_HI, R_AMDGPU_ABS64, R_AMDGPU_REL32, R_AMDGPU_REL64 = 0, 1, 2, 3, 4, 5
R_AMDGPU_ABS32, R_AMDGPU_REL32_LO, R_AMDGPU_REL32_HI = 6, 10, 11
PAGE = 0x1000


def _align(x: int, a: int) -> int: return (x + a - 1) // a * a if a > 1 else x


def _elf_hash(name: bytes) -> int:
  """The System V ELF symbol hash (gABI)."""
  h = 0
  for c in name:
    h = ((h << 4) + c) & 0xFFFFFFFF
    g = h & 0xF0000000
    if g: h ^= g >> 24
    h &= ~g & 0xFFFFFFFF
  return h


class ElfSection:
  """One section of a parsed ELF64 file."""
  __slots__ = ("name", "type", "flags", "addr", "offset", "size", "link", "info", "align", "entsize", "data")

  def __init__(self, name: str, fields: tuple, data: bytes):
    _, self.type, self.flags, self.addr, self.offset, self.size, self.link, self.info, self.align, self.entsize = fields
    self.name, self.data = name, data


def parse_elf(lib: bytes) -> tuple[tuple, list[ElfSection]]:
  """(ELF header fields, sections) of a little-endian ELF64 file; raise ValueError naming what is wrong."""
  if lib[:4] != b"\x7fELF" or lib[4] != 2 or lib[5] != 1:
    raise ValueError(f"not a little-endian ELF64 file (starts {bytes(lib[:8])!r})")
  hdr = struct.unpack_from("<16sHHIQQQIHHHHHH", lib, 0)
  shoff, shentsize, shnum, shstrndx = hdr[6], hdr[11], hdr[12], hdr[13]
  raw = [struct.unpack_from("<IIQQQQIIQQ", lib, shoff + i * shentsize) for i in range(shnum)]
  strtab = raw[shstrndx]
  names = lib[strtab[4]:strtab[4] + strtab[5]]
  secs = []
  for f in raw:
    name = names[f[0]:names.index(b"\0", f[0])].decode()
    secs.append(ElfSection(name, f, b"" if f[1] == 8 else bytes(lib[f[4]:f[4] + f[5]])))  # SHT_NOBITS has no data
  return hdr, secs


def _symbols(secs: list[ElfSection]) -> list[tuple[str, int, int, int, int, int]]:
  """(name, info, other, shndx, value, size) of every symbol in the SYMTAB section."""
  symtab = next((s for s in secs if s.type == SHT_SYMTAB), None)
  if symtab is None: return []
  strs = secs[symtab.link].data
  out = []
  for i in range(symtab.size // 24):
    st_name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", symtab.data, i * 24)
    out.append((strs[st_name:strs.index(b"\0", st_name)].decode(), info, other, shndx, value, size))
  return out


def link_code_object(obj: bytes) -> bytes:
  """Link one relocatable AMDGPU object (as LLVM emits it) into an HSA code object: an `ET_DYN` ELF with a read-only
  segment (the metadata `.note`, `.dynsym`/`.hash`/`.dynstr` exporting the kernels and their `.kd` descriptors,
  `.rodata` with the descriptors), an executable segment (`.text`) and a writable `.dynamic`; relocations resolved
  (the descriptor's `kernel_code_entry_byte_offset` is an `R_AMDGPU_REL64` to the kernel). Like `ld.lld -shared`
  for the single-object, no-imports case our kernels produce."""
  hdr, secs = parse_elf(obj)
  if hdr[1] != ET_REL or hdr[2] != EM_AMDGPU:
    raise ValueError(f"link_code_object needs an AMDGPU relocatable object (type 1, machine 224), got type {hdr[1]} "
                     f"machine {hdr[2]}")
  syms = _symbols(secs)
  keep = {".note": (SHT_NOTE, SHF_ALLOC), ".rodata": (SHT_PROGBITS, SHF_ALLOC),
          ".text": (SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR)}
  unknown = [s.name for s in secs if s.flags & SHF_ALLOC and s.size and s.name not in keep]
  if unknown: raise ValueError(f"link_code_object can't place sections {unknown}; supported: {', '.join(keep)}")
  by_name = {s.name: (i, s) for i, s in enumerate(secs)}
  exports = [s for s in syms if s[1] >> 4 == 1 and s[3] != 0]  # STB_GLOBAL, defined
  # -- read-only segment: headers, note, dynsym, hash, dynstr, rodata
  nph = 6
  off = 64 + nph * 56
  layout: dict[str, int] = {}
  note = by_name.get(".note", (0, None))[1]
  if note is not None:
    off = layout[".note"] = _align(off, 4)
    off += note.size
  dynstr = b"\0" + b"".join(s[0].encode() + b"\0" for s in exports)
  off = layout[".dynsym"] = _align(off, 8)
  off += 24 * (len(exports) + 1)
  nbucket = max(1, len(exports))
  off = layout[".hash"] = _align(off, 4)
  off += 4 * (2 + nbucket + len(exports) + 1)
  layout[".dynstr"] = off
  off += len(dynstr)
  rodata = by_name.get(".rodata", (0, None))[1]
  if rodata is not None:
    off = layout[".rodata"] = _align(off, max(rodata.align, 1))
    off += rodata.size
  ro_end = off
  text = by_name[".text"][1]
  text_off = layout[".text"] = _align(ro_end, PAGE)  # file offset == virtual address everywhere
  text_end = text_off + text.size
  dyn_off = layout[".dynamic"] = _align(text_end, PAGE)
  dynamic_n = 6
  dyn_end = dyn_off + 16 * dynamic_n
  # -- section data with relocations applied
  data = {n: bytearray(by_name[n][1].data) for n in (".note", ".rodata", ".text") if n in by_name}
  sec_addr = {by_name[n][0]: layout[n] for n in data}
  for rel in (s for s in secs if s.type == SHT_RELA):
    target = secs[rel.info].name
    if target not in data: continue
    for k in range(rel.size // 24):
      r_off, r_info, addend = struct.unpack_from("<QQq", rel.data, k * 24)
      sym = syms[r_info >> 32]
      S = sec_addr.get(sym[3], 0) + sym[4] if sym[3] not in (0, 0xFFF1) else sym[4]  # SHN_ABS keeps its value
      P = layout[target] + r_off
      rtype = r_info & 0xFFFFFFFF
      rel_v, abs_v, buf = S + addend - P, S + addend, data[target]
      if rtype == R_AMDGPU_REL64: struct.pack_into("<q", buf, r_off, rel_v)
      elif rtype == R_AMDGPU_ABS64: struct.pack_into("<Q", buf, r_off, abs_v)
      elif rtype in (R_AMDGPU_REL32, R_AMDGPU_REL32_LO): struct.pack_into("<I", buf, r_off, rel_v & 0xFFFFFFFF)
      elif rtype == R_AMDGPU_REL32_HI: struct.pack_into("<I", buf, r_off, (rel_v >> 32) & 0xFFFFFFFF)
      elif rtype in (R_AMDGPU_ABS32, R_AMDGPU_ABS32_LO): struct.pack_into("<I", buf, r_off, abs_v & 0xFFFFFFFF)
      elif rtype == R_AMDGPU_ABS32_HI: struct.pack_into("<I", buf, r_off, (abs_v >> 32) & 0xFFFFFFFF)
      elif rtype != R_AMDGPU_NONE:
        raise ValueError(f"link_code_object: relocation type {rtype} against {sym[0]!r} is not supported; supported: "
                         "R_AMDGPU_ABS32/ABS32_LO/ABS32_HI/ABS64/REL32/REL32_LO/REL32_HI/REL64")
  # -- output section indices: 1 .note 2 .dynsym 3 .hash 4 .dynstr 5 .rodata 6 .text 7 .dynamic 8 .shstrtab
  out_names = [n for n in (".note", ".dynsym", ".hash", ".dynstr", ".rodata", ".text", ".dynamic") if n in layout]
  out_index = {n: i + 1 for i, n in enumerate(out_names)}
  dynsym = bytearray(24)
  name_off = 1
  for name, info, other, shndx, value, size in exports:
    sec_name = secs[shndx].name
    if sec_name not in out_index: raise ValueError(f"symbol {name!r} is in section {sec_name!r}, which isn't linked")
    dynsym += struct.pack("<IBBHQQ", name_off, info, other, out_index[sec_name], layout[sec_name] + value, size)
    name_off += len(name.encode()) + 1
  buckets, chains = [0] * nbucket, [0] * (len(exports) + 1)
  for i, s in enumerate(exports, 1):  # chain symbol i behind the bucket's previous head
    b = _elf_hash(s[0].encode()) % nbucket
    chains[i], buckets[b] = buckets[b], i
  hash_sec = struct.pack(f"<II{nbucket}I{len(chains)}I", nbucket, len(chains), *buckets, *chains)
  dynamic = struct.pack("<12q", DT_HASH, layout[".hash"], DT_STRTAB, layout[".dynstr"], DT_SYMTAB, layout[".dynsym"],
                        DT_STRSZ, len(dynstr), DT_SYMENT, 24, DT_NULL, 0)
  contents = {".note": bytes(data.get(".note", b"")), ".dynsym": bytes(dynsym), ".hash": hash_sec, ".dynstr": dynstr,
              ".rodata": bytes(data.get(".rodata", b"")), ".text": bytes(data[".text"]), ".dynamic": dynamic}
  shstrtab = b"\0" + b"".join(n.encode() + b"\0" for n in [*out_names, ".shstrtab"])
  shstr_off = dyn_end
  shoff = _align(shstr_off + len(shstrtab), 8)
  out = bytearray(shoff + 64 * (len(out_names) + 2))
  for n in out_names: out[layout[n]:layout[n] + len(contents[n])] = contents[n]
  out[shstr_off:shstr_off + len(shstrtab)] = shstrtab
  # -- headers
  ident = bytes(obj[:16])
  struct.pack_into("<16sHHIQQQIHHHHHH", out, 0, ident, ET_DYN, EM_AMDGPU, 1, 0, 64, shoff, hdr[7], 64, 56, nph, 64,
                   len(out_names) + 2, len(out_names) + 1)
  phdrs = [(PT_PHDR, PF_R, 64, 64, nph * 56, 8), (PT_LOAD, PF_R, 0, 0, ro_end, PAGE),
           (PT_LOAD, PF_R | PF_X, text_off, text_off, text.size, PAGE),
           (PT_LOAD, PF_R | PF_W, dyn_off, dyn_off, dyn_end - dyn_off, PAGE),
           (PT_DYNAMIC, PF_R | PF_W, dyn_off, dyn_off, dyn_end - dyn_off, 8),
           (PT_NOTE, PF_R, layout.get(".note", 0), layout.get(".note", 0), len(contents[".note"]), 4)]
  for i, (pt, fl, o, va, sz, al) in enumerate(phdrs):
    struct.pack_into("<IIQQQQQQ", out, 64 + i * 56, pt, fl, o, va, va, sz, sz, al)
  shdr = {".note": (SHT_NOTE, SHF_ALLOC, 0, 0, 4, 0),
          ".dynsym": (SHT_DYNSYM, SHF_ALLOC, out_index[".dynstr"], 1, 8, 24),
          ".hash": (SHT_HASH, SHF_ALLOC, out_index[".dynsym"], 0, 4, 4), ".dynstr": (SHT_STRTAB, SHF_ALLOC, 0, 0, 1, 0),
          ".rodata": (SHT_PROGBITS, SHF_ALLOC, 0, 0, rodata.align if rodata is not None else 1, 0),
          ".text": (SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, 0, 0, max(text.align, 1), 0),
          ".dynamic": (SHT_DYNAMIC, SHF_ALLOC | SHF_WRITE, out_index[".dynstr"], 0, 8, 16)}
  for i, n in enumerate(out_names, 1):
    st, fl, link, info, al, es = shdr[n]
    struct.pack_into("<IIQQQQIIQQ", out, shoff + i * 64, shstrtab.index(n.encode() + b"\0"), st, fl, layout[n],
                     layout[n], len(contents[n]), link, info, al, es)
  struct.pack_into("<IIQQQQIIQQ", out, shoff + (len(out_names) + 1) * 64, shstrtab.index(b".shstrtab\0"), SHT_STRTAB,
                   0, 0, shstr_off, len(shstrtab), 0, 0, 1, 0)
  return bytes(out)


# ***** msgpack (the AMDGPU metadata note's encoding): a small reader and writer *****
def msgpack_unpack(b: bytes) -> Any:
  """Decode one msgpack value (nil, bool, ints, floats, str, bin, array, map: what AMDGPU metadata uses)."""
  val, _ = _unpack(b, 0)
  return val


def _unpack(b: bytes, i: int) -> tuple[Any, int]:
  t = b[i]
  if t <= 0x7F: return t, i + 1
  if t >= 0xE0: return t - 0x100, i + 1
  if 0x80 <= t <= 0x8F: return _unpack_map(b, i + 1, t & 0x0F)
  if 0x90 <= t <= 0x9F: return _unpack_array(b, i + 1, t & 0x0F)
  if 0xA0 <= t <= 0xBF: return b[i + 1:i + 1 + (t & 0x1F)].decode(), i + 1 + (t & 0x1F)
  if t == 0xC0: return None, i + 1
  if t in (0xC2, 0xC3): return t == 0xC3, i + 1
  fixed = {0xCA: "<f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i",
           0xD3: ">q"}
  if t in fixed:
    fmt = ">f" if t == 0xCA else fixed[t]
    return struct.unpack_from(fmt, b, i + 1)[0], i + 1 + struct.calcsize(fmt)
  lens = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I", 0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xDC: ">H", 0xDD: ">I", 0xDE: ">H",
          0xDF: ">I"}
  if t in lens:
    n = struct.unpack_from(lens[t], b, i + 1)[0]
    j = i + 1 + struct.calcsize(lens[t])
    if t in (0xD9, 0xDA, 0xDB): return b[j:j + n].decode(), j + n
    if t in (0xC4, 0xC5, 0xC6): return bytes(b[j:j + n]), j + n
    return _unpack_array(b, j, n) if t in (0xDC, 0xDD) else _unpack_map(b, j, n)
  raise ValueError(f"msgpack type byte {t:#x} at offset {i} is not supported")


def _unpack_array(b: bytes, i: int, n: int) -> tuple[list, int]:
  out = []
  for _ in range(n):
    v, i = _unpack(b, i)
    out.append(v)
  return out, i


def _unpack_map(b: bytes, i: int, n: int) -> tuple[dict, int]:
  out = {}
  for _ in range(n):
    k, i = _unpack(b, i)
    v, i = _unpack(b, i)
    out[k] = v
  return out, i


def msgpack_pack(v: Any) -> bytes:
  """Encode nil/bool/int/float/str/bytes/list/dict as msgpack, in the smallest forms (as LLVM writes them)."""
  if v is None: return b"\xc0"
  if isinstance(v, bool): return b"\xc3" if v else b"\xc2"
  if isinstance(v, int):
    if 0 <= v <= 0x7F: return bytes([v])
    if -32 <= v < 0: return bytes([v & 0xFF])
    for lo, hi, tag, fmt in ((0, 0xFF, 0xCC, ">B"), (0, 0xFFFF, 0xCD, ">H"), (0, 0xFFFFFFFF, 0xCE, ">I"),
                             (0, 2**64 - 1, 0xCF, ">Q"), (-128, 127, 0xD0, ">b"), (-2**15, 2**15 - 1, 0xD1, ">h"),
                             (-2**31, 2**31 - 1, 0xD2, ">i"), (-2**63, 2**63 - 1, 0xD3, ">q")):
      if lo <= v <= hi: return bytes([tag]) + struct.pack(fmt, v)
    raise ValueError(f"msgpack can't hold the integer {v}")
  if isinstance(v, float): return b"\xcb" + struct.pack(">d", v)
  if isinstance(v, str):
    e = v.encode()
    if len(e) < 32: return bytes([0xA0 | len(e)]) + e
    return (b"\xd9" + struct.pack(">B", len(e)) if len(e) < 256 else b"\xda" + struct.pack(">H", len(e))) + e
  if isinstance(v, (bytes, bytearray)): return b"\xc4" + struct.pack(">B", len(v)) + bytes(v)
  if isinstance(v, (list, tuple)):
    head = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))
    return head + b"".join(msgpack_pack(x) for x in v)
  if isinstance(v, dict):
    head = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
    return head + b"".join(msgpack_pack(k) + msgpack_pack(x) for k, x in v.items())
  raise TypeError(f"msgpack can't encode {type(v).__name__}; valid: None, bool, int, float, str, bytes, list, dict")


NT_AMDGPU_METADATA = 32


def read_metadata(lib: bytes) -> dict:
  """The AMDGPU metadata (`amdhsa.kernels`, `amdhsa.version`, ...) from a code object's or object's `.note`."""
  _, secs = parse_elf(lib)
  for s in secs:
    if s.type != SHT_NOTE: continue
    i = 0
    while i + 12 <= len(s.data):
      namesz, descsz, ntype = struct.unpack_from("<III", s.data, i)
      name = s.data[i + 12:i + 12 + namesz].rstrip(b"\0")
      desc_at = i + 12 + _align(namesz, 4)
      if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA: return msgpack_unpack(s.data[desc_at:desc_at + descsz])
      i = desc_at + _align(descsz, 4)
  raise ValueError("no AMDGPU metadata note (NT_AMDGPU_METADATA) in this ELF file")
