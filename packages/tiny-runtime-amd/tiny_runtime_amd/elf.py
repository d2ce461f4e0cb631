"""Code objects: ELF64 parsing (sections, symbols, PT_LOAD image) and the HSA kernel descriptor (`<name>.kd`).

Layouts: the ELF-64 specification (Elf64_Ehdr/Shdr/Sym/Phdr) and LLVM's AMDGPUUsage "Kernel Descriptor" table
(`amdhsa::kernel_descriptor_t`, 64 bytes).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelDescriptor:
  """The fields of an HSA kernel descriptor the dispatcher needs."""
  group_segment_fixed_size: int
  private_segment_fixed_size: int
  kernarg_size: int
  kernel_code_entry_byte_offset: int  # from the descriptor's own address
  rsrc3: int
  rsrc1: int
  rsrc2: int
  kernel_code_properties: int

  @staticmethod
  def parse(b: bytes) -> KernelDescriptor:
    if len(b) < 64: raise ValueError(f"a kernel descriptor is 64 bytes, got {len(b)}")
    g, p, k = struct.unpack_from("<III", b, 0)
    entry, = struct.unpack_from("<q", b, 16)
    r3, r1, r2 = struct.unpack_from("<III", b, 44)
    props, = struct.unpack_from("<H", b, 56)
    return KernelDescriptor(g, p, k, entry, r3, r1, r2, props)

  # kernel_code_properties bits: which user SGPRs the kernel expects, in this order
  USER_SGPRS = (("private_segment_buffer", 4), ("dispatch_ptr", 2), ("queue_ptr", 2), ("kernarg_segment_ptr", 2),
                ("dispatch_id", 2), ("flat_scratch_init", 2), ("private_segment_size", 1))

  def user_sgprs(self) -> list[tuple[str, int]]:
    """The enabled user SGPR groups in order: (name, count)."""
    return [(n, c) for i, (n, c) in enumerate(self.USER_SGPRS) if self.kernel_code_properties >> i & 1]

  @property
  def wave32(self) -> bool: return bool(self.kernel_code_properties >> 10 & 1)


@dataclass
class ELF:
  """An ELF64 little-endian image: sections by name, symbols by name (value, size, section index), PT_LOADs."""
  data: bytes
  sections: dict[str, tuple[int, int, int, int]]  # name -> (addr, offset, size, type)
  symbols: dict[str, tuple[int, int, int]]
  loads: list[tuple[int, int, int, int]]          # (vaddr, offset, filesz, memsz)
  etype: int

  @staticmethod
  def parse(data: bytes) -> ELF:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
      raise ValueError(f"not a little-endian ELF64 file (starts {data[:6]!r})")
    etype, = struct.unpack_from("<H", data, 16)
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
    shdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    def cstr(off: int) -> str: return data[off:data.index(b"\0", off)].decode()
    strbase = shdrs[shstrndx][4] if shnum else 0
    sections = {cstr(strbase + s[0]): (s[3], s[4], s[5], s[1]) for s in shdrs}
    symbols: dict[str, tuple[int, int, int]] = {}
    for s in shdrs:
      if s[1] not in (2, 11): continue  # SHT_SYMTAB, SHT_DYNSYM
      strtab = shdrs[s[6]][4]
      for j in range(s[5] // 24):
        name_off, _info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", data, s[4] + j * 24)
        if name_off: symbols.setdefault(cstr(strtab + name_off), (value, size, shndx))
    loads = []
    for i in range(phnum):
      ptype, _, off, vaddr, _, filesz, memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
      if ptype == 1: loads.append((vaddr, off, filesz, memsz))
    return ELF(data, sections, symbols, loads, etype)

  def image(self) -> bytes:
    """The bytes to place at the load base: PT_LOAD segments at their vaddrs (a relocatable object: the file)."""
    if not self.loads: return self.data
    out = bytearray(max(v + m for v, _, _, m in self.loads))
    for v, o, fs, _ in self.loads: out[v:v + fs] = self.data[o:o + fs]
    return bytes(out)

  def kernel(self, name: str | None = None) -> tuple[str, int, KernelDescriptor]:
    """(name, descriptor offset in the image, descriptor) of kernel `name` (the only one when None)."""
    kds = [s[:-3] for s in self.symbols if s.endswith(".kd")]
    if name is None:
      if len(kds) != 1: raise ValueError(f"code object has kernels {kds}; name one")
      name = kds[0]
    if name not in kds: raise ValueError(f"no kernel {name!r} in code object; it has {kds}")
    value, _, shndx = self.symbols[name + ".kd"]
    # linked (PT_LOADs): the value is the address in the image; relocatable: relative to its section in the file
    off = value if self.loads else value + self._section_offset(shndx)
    return name, off, KernelDescriptor.parse(self.image()[off:off + 64])

  def _section_offset(self, shndx: int) -> int:
    shoff, = struct.unpack_from("<Q", self.data, 0x28)
    shentsize, = struct.unpack_from("<H", self.data, 0x3A)
    return struct.unpack_from("<IIQQQQIIQQ", self.data, shoff + shndx * shentsize)[4]
