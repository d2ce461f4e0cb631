"""ELF64 as NVIDIA cubins use it: sections by name, symbols, and appending a section.

Layouts are the System V gABI's (`Elf64_Ehdr`, `Elf64_Shdr`, `Elf64_Sym`, little-endian). `add_section` writes a
non-allocated section after the existing data and a new section header table (the loader ignores sections it does
not know; the mock drivers read the kernel's PTX from one, see `tiny_runtime_nv.mock.compiler`).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")   # e_ident .. e_shstrndx (64 bytes)
SHDR = struct.Struct("<IIQQQQIIQQ")         # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link,
                                           # sh_info, sh_addralign, sh_entsize (64 bytes)
SYM = struct.Struct("<IBBHQQ")              # st_name, st_info, st_other, st_shndx, st_value, st_size (24 bytes)
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS = 1, 2, 3, 8


class ELFError(ValueError):
  """Bytes that are not a little-endian ELF64 file (or a malformed one)."""


@dataclass(frozen=True)
class Section:
  """One section: name, type, flags, file offset, size, link, info, alignment."""
  name: str
  type: int
  flags: int
  offset: int
  size: int
  link: int
  info: int
  align: int


@dataclass(frozen=True)
class Symbol:
  """One symbol: name, st_info, section index, value, size."""
  name: str
  info: int
  shndx: int
  value: int
  size: int


class ELF:
  """A parsed ELF64 image: `sections` (in order), `section(name)`, `data(name)`, `symbols`."""

  def __init__(self, blob: bytes):
    if blob[:4] != b"\x7fELF" or len(blob) < EHDR.size or blob[4] != 2 or blob[5] != 1:
      raise ELFError(f"not a little-endian ELF64 image (starts {bytes(blob[:6])!r})")
    self.blob = bytes(blob)
    h = EHDR.unpack_from(blob)
    self.machine, self.flags, self.abi_version = h[2], h[7], blob[8]   # e_ident[EI_ABIVERSION] is byte 8
    shoff, shentsize, shnum, shstrndx = h[6], h[11], h[12], h[13]
    if shentsize != SHDR.size or shoff + shnum * SHDR.size > len(blob):
      raise ELFError(f"section header table at {shoff:#x} ({shnum} x {shentsize}) is outside the image")
    raw = [SHDR.unpack_from(blob, shoff + i * SHDR.size) for i in range(shnum)]
    strtab = raw[shstrndx]

    def name_at(tab: tuple, off: int) -> str:
      start = tab[4] + off
      return self.blob[start:self.blob.index(b"\0", start)].decode()
    self.sections = [Section(name_at(strtab, r[0]), r[1], r[2], r[4], r[5], r[6], r[7], r[8]) for r in raw]
    self.by_name = {s.name: i for i, s in enumerate(self.sections)}
    self.symbols: list[Symbol] = []
    for s in self.sections:
      if s.type == SHT_SYMTAB:
        names = self.sections[s.link]
        for i in range(s.size // SYM.size):
          n, info, _, shndx, value, size = SYM.unpack_from(self.blob, s.offset + i * SYM.size)
          nm = self.blob[names.offset + n:self.blob.index(b"\0", names.offset + n)].decode()
          self.symbols.append(Symbol(nm, info, shndx, value, size))

  def section(self, name: str) -> Section | None: return self.sections[i] if (i := self.by_name.get(name)) else None

  def data(self, name: str) -> bytes:
    """The bytes of section `name` (empty for NOBITS); ELFError when there is no such section."""
    s = self.section(name)
    if s is None: raise ELFError(f"no section {name!r}; sections: {', '.join(x.name for x in self.sections if x.name)}")
    return b"" if s.type == SHT_NOBITS else self.blob[s.offset:s.offset + s.size]


def add_section(blob: bytes, name: str, data: bytes) -> bytes:
  """`blob` with one more non-allocated PROGBITS section `name` holding `data` (a new .shstrtab copy and section
  header table are appended; existing offsets don't move)."""
  elf = ELF(blob)
  h = list(EHDR.unpack_from(blob))
  shoff, shnum, shstrndx = h[6], h[12], h[13]
  raw = [list(SHDR.unpack_from(blob, shoff + i * SHDR.size)) for i in range(shnum)]
  old_str = elf.blob[raw[shstrndx][4]:raw[shstrndx][4] + raw[shstrndx][5]]
  out = bytearray(blob)
  data_off = len(out)
  out += data
  str_off = len(out)
  new_str = old_str + name.encode() + b"\0"
  out += new_str
  raw[shstrndx][4], raw[shstrndx][5] = str_off, len(new_str)
  raw.append([len(old_str), SHT_PROGBITS, 0, 0, data_off, len(data), 0, 0, 1, 0])
  while len(out) % 8: out += b"\0"
  h[6], h[12] = len(out), shnum + 1
  for r in raw: out += SHDR.pack(*r)
  out[:EHDR.size] = EHDR.pack(*h)
  return bytes(out)
