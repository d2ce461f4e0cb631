"""Our loader for the ELF relocatable objects the LLVM compiler emits on x86-64: each kernel in one mapping.

Why not MCJIT: its memory manager maps a kernel's code and its constant pool separately, each near the previous
block of its kind. When a multi-GB buffer splits the address space the two can land more than 2 GB apart, and the
small code model's 32-bit PC-relative relocations (``R_X86_64_PC32`` from ``.text`` to ``.rodata.cst*``) overflow:
llvmlite aborts the process on RuntimeDyld's ``isInt<32>(RealOffset)`` assertion (without assertions the kernel
would read whatever lies at the wrapped address).

Here a kernel is one anonymous mapping (`LoadedObject`), laid out as::

    [ .text sections | call stubs ]          read + execute
    [ .rodata* sections | GOT ]              read only
    [ .data sections | .bss | COMMON ]       read + write

so every PC-relative displacement inside a kernel is smaller than the kernel. Functions the object calls in this
process (libm's ``sinf``, ...) are reached through a 16-byte stub in the code (``jmp *0(%rip)`` followed by the
8-byte address), symbols it addresses through the GOT get an 8-byte GOT entry: both reach any address.

Checked before anything is mapped: ELF64 little-endian, ``ET_REL``, ``EM_X86_64``; every header, section and
symbol inside the file; every undefined symbol resolves in this process (else `UnresolvedSymbolError` naming all of
them); the image is at most `MAX_IMAGE` bytes. Checked while relocating (an error unmaps the image): every
relocation type is one of `RELOCS` (else `ObjectLoadError` naming it and the supported ones), inside its section,
and its value fits its field (else `ObjectLoadError`, never a silent wrap). Unwind tables (``.eh_frame``) and notes
are not loaded: kernels are ``nounwind`` and nothing would register them. Constructors (``.init_array``) and
thread-local data are refused.

Sources: the ELF structures and constants from the System V gABI (``elf.h``); the x86-64 relocation types, their
numbers and formulas from the System V AMD64 psABI (§4.4, "Relocation Types"); the stub's ``FF 25 disp32`` encoding
(``JMP r/m64``, opcode FF /4, ModRM 0x25: RIP-relative) from the Intel SDM vol. 2, "JMP".
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import struct
import weakref
from collections.abc import Callable

# ***** ELF constants (System V gABI, elf.h) *****
ET_REL = 1
EM_X86_64 = 62
SHT_PROGBITS, SHT_SYMTAB, SHT_RELA, SHT_NOTE, SHT_NOBITS, SHT_REL = 1, 2, 4, 7, 8, 9
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY = 14, 15, 16
SHT_X86_64_UNWIND = 0x70000001  # psABI: .eh_frame on x86-64
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHN_UNDEF, SHN_LORESERVE, SHN_ABS, SHN_COMMON = 0, 0xFF00, 0xFFF1, 0xFFF2
STB_LOCAL = 0
STT_SECTION, STT_TLS, STT_GNU_IFUNC = 3, 6, 10

# ***** x86-64 relocation types (System V AMD64 psABI §4.4.1) *****
R_X86_64_NONE, R_X86_64_64, R_X86_64_PC32, R_X86_64_PLT32 = 0, 1, 2, 4
R_X86_64_GOTPCREL, R_X86_64_32, R_X86_64_32S, R_X86_64_PC64 = 9, 10, 11, 24
R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX = 41, 42
RELOC_NAMES = {R_X86_64_NONE: "R_X86_64_NONE", R_X86_64_64: "R_X86_64_64", R_X86_64_PC32: "R_X86_64_PC32",
               R_X86_64_PLT32: "R_X86_64_PLT32", R_X86_64_GOTPCREL: "R_X86_64_GOTPCREL", R_X86_64_32: "R_X86_64_32",
               R_X86_64_32S: "R_X86_64_32S", R_X86_64_PC64: "R_X86_64_PC64",
               R_X86_64_GOTPCRELX: "R_X86_64_GOTPCRELX", R_X86_64_REX_GOTPCRELX: "R_X86_64_REX_GOTPCRELX"}
GOT_RELOCS = (R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX)
# type -> (field's struct format, its bytes, PC-relative). Values (psABI): S + A, or S + A - P when PC-relative; S is
# the stub for a PLT32 call into this process (L) and the symbol's GOT entry for the GOTPCREL family (G + GOT).
# The 32-bit fields are checked: a value that doesn't fit is an error, never a wrap.
RELOCS = {R_X86_64_64: ("<Q", 8, False), R_X86_64_PC32: ("<i", 4, True), R_X86_64_PLT32: ("<i", 4, True),
          R_X86_64_GOTPCREL: ("<i", 4, True), R_X86_64_32: ("<I", 4, False), R_X86_64_32S: ("<i", 4, False),
          R_X86_64_PC64: ("<q", 8, True), R_X86_64_GOTPCRELX: ("<i", 4, True),
          R_X86_64_REX_GOTPCRELX: ("<i", 4, True)}
# the stub: jmp *0(%rip) (FF 25 00000000), the 8-byte target right after it, two int3 (CC) of padding
STUB_SIZE, STUB_HEAD = 16, b"\xff\x25\x00\x00\x00\x00"
PAGE = mmap.PAGESIZE
MAX_IMAGE = 256 << 20  # bytes: a kernel is a few KB; a bigger image is a malformed (or hostile) object
_EHDR, _SHDR, _SYM, _RELA = struct.Struct("<16sHHIQQQIHHHHHH"), struct.Struct("<IIQQQQIIQQ"), \
  struct.Struct("<IBBHQQ"), struct.Struct("<QQq")


class ObjectLoadError(ValueError):
  """An object file this loader can't place: not an x86-64 relocatable ELF, a malformed one, a relocation type it
  doesn't know, or a value that doesn't fit its field."""


class UnresolvedSymbolError(RuntimeError):
  """A kernel's object file calls a function this process can't provide (the JIT would jump to address 0)."""


def _align(x: int, a: int) -> int: return -(-x // a) * a if a > 1 else x


# ***** finding symbols in this process *****
@functools.cache
def _process_handles() -> tuple[ctypes.CDLL, ...]:
  """dlopen handles searched for undefined symbols: the process's global scope, then libm (which an embedding
  program may not have loaded globally)."""
  handles = [ctypes.CDLL(None)]
  if (libm := ctypes.util.find_library("m")) is not None: handles.append(ctypes.CDLL(libm))
  return tuple(handles)


@functools.cache
def process_symbol(name: str) -> int:
  """The address of function or variable `name` in this process (dlsym over `_process_handles`), 0 if none."""
  for h in _process_handles():
    try: return ctypes.cast(h[name], ctypes.c_void_p).value or 0
    except AttributeError: continue
  return 0


# ***** anonymous memory through libc (mmap/mprotect/munmap: POSIX) *****
@functools.cache
def _libc() -> ctypes.CDLL:
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_int, ctypes.c_long]
  libc.mprotect.restype, libc.mprotect.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  libc.munmap.restype, libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
  return libc


def _map(size: int) -> int:
  addr = _libc().mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
  if addr is None or addr == ctypes.c_void_p(-1).value:
    raise MemoryError(f"mmap of {size} bytes for a kernel failed: {_errno()}")
  return addr


def _protect(addr: int, size: int, prot: int) -> None:
  if size and _libc().mprotect(addr, size, prot) != 0: raise OSError(f"mprotect of a kernel's pages failed: {_errno()}")


def _errno() -> str:
  e = ctypes.get_errno()
  return f"{os.strerror(e)} (errno {e})"


def _unmap(addr: int, size: int) -> None: _libc().munmap(addr, size)


# ***** parsing *****
class _Section:
  __slots__ = ("index", "name", "type", "flags", "offset", "size", "link", "info", "align", "entsize", "addr")

  def __init__(self, index: int, fields: tuple[int, ...], names: bytes, what: str):
    self.index = index
    (name_off, self.type, self.flags, _, self.offset, self.size, self.link, self.info, self.align,
     self.entsize) = fields
    self.name = _cstr(names, name_off, what)
    self.addr = -1  # offset in the image once placed; -1: not loaded


def _cstr(table: bytes, off: int, what: str) -> str:
  """The NUL-terminated name at `off` in a string table."""
  end = table.find(b"\0", off)
  if off >= len(table) or end < 0:
    raise ObjectLoadError(f"{what}: a name at offset {off} runs outside its string table")
  return table[off:end].decode(errors="replace")


def _parse(obj: bytes, what: str) -> tuple[list[_Section], list[tuple[int, int, int, int, int]], bytes]:
  """Sections, symbols (name offset, info, shndx, value, size) and the symbol string table of an x86-64 relocatable
  object; every header checked against the file's size."""
  if len(obj) < _EHDR.size or obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
    raise ObjectLoadError(f"{what}: not a 64-bit little-endian ELF file (starts {bytes(obj[:6])!r})")
  hdr = _EHDR.unpack_from(obj, 0)
  e_type, e_machine, shoff, shentsize, shnum, shstrndx = hdr[1], hdr[2], hdr[6], hdr[11], hdr[12], hdr[13]
  if e_type != ET_REL or e_machine != EM_X86_64:
    raise ObjectLoadError(f"{what}: ELF type {e_type} machine {e_machine}; this loader takes x86-64 relocatable "
                          f"objects (type {ET_REL}, machine {EM_X86_64})")
  if shentsize != _SHDR.size or shoff + shnum * shentsize > len(obj) or not 0 < shstrndx < shnum:
    raise ObjectLoadError(f"{what}: section header table (offset {shoff}, {shnum} x {shentsize} bytes, names in "
                          f"section {shstrndx}) doesn't fit the file's {len(obj)} bytes")
  raw = list(_SHDR.iter_unpack(obj[shoff:shoff + shnum * shentsize]))
  for i, (_, sh_type, _, _, off, size, _, _, align, _) in enumerate(raw):
    if sh_type != SHT_NOBITS and off + size > len(obj):
      raise ObjectLoadError(f"{what}: section {i} ({off}+{size} bytes) is outside the file's {len(obj)} bytes")
    if align & (align - 1): raise ObjectLoadError(f"{what}: section {i} alignment {align} isn't a power of 2")
  names = obj[raw[shstrndx][4]:raw[shstrndx][4] + raw[shstrndx][5]]
  secs = [_Section(i, f, names, what) for i, f in enumerate(raw)]
  symtabs = [s for s in secs if s.type == SHT_SYMTAB]
  if len(symtabs) != 1: raise ObjectLoadError(f"{what}: {len(symtabs)} symbol tables; an object has one")
  st = symtabs[0]
  if st.entsize != _SYM.size or not 0 < st.link < shnum:
    raise ObjectLoadError(f"{what}: symbol table entry size {st.entsize} (want {_SYM.size}) or string table "
                          f"{st.link} is invalid")
  syms = [(n, info, shndx, value, size) for n, info, _, shndx, value, size in
          _SYM.iter_unpack(obj[st.offset:st.offset + st.size - st.size % _SYM.size])]
  strs = secs[st.link]
  return secs, syms, obj[strs.offset:strs.offset + strs.size]


def _section_kind(s: _Section, what: str) -> str | None:
  """Where an allocated section goes: 'text', 'ro', 'rw'; None when it isn't loaded (unwind tables, notes)."""
  if not s.flags & SHF_ALLOC: return None
  if s.name == ".eh_frame" or s.type in (SHT_X86_64_UNWIND, SHT_NOTE): return None
  if s.flags & SHF_TLS: raise ObjectLoadError(f"{what}: section {s.name!r} is thread-local; kernels can't use TLS")
  if s.type in (SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY):
    raise ObjectLoadError(f"{what}: section {s.name!r} holds constructors/destructors, which this loader doesn't run")
  if s.type not in (SHT_PROGBITS, SHT_NOBITS):
    raise ObjectLoadError(f"{what}: allocated section {s.name!r} has type {s.type:#x}; loadable: PROGBITS, NOBITS")
  if s.align > PAGE: raise ObjectLoadError(f"{what}: section {s.name!r} wants {s.align}-byte alignment (> a page)")
  return "text" if s.flags & SHF_EXECINSTR else "rw" if s.flags & SHF_WRITE else "ro"


# ***** loading *****
class LoadedObject:
  """One relocatable object placed in one mapping: its code (read+execute), read-only data and GOT (read), writable
  data (read+write). `symbol(name)` is the address of a global it defines; the mapping is unmapped when this object
  is garbage collected (keep it as long as its code may run), or by `close()`.

  Steps: parse and check the headers; resolve every undefined symbol (all missing ones named in one
  `UnresolvedSymbolError`); lay out the three parts, with room for a stub per undefined symbol and a GOT entry per
  symbol; map; copy the sections into an image and apply each relocation (a stub or GOT entry made on first use);
  write the image; make the code read+execute and the constants read-only. An error after the mapping unmaps it."""

  def __init__(self, obj: bytes, what: str = "object", resolve: Callable[[str], int] = process_symbol):
    secs, syms, strs = _parse(obj, what)
    kinds = [_section_kind(s, what) for s in secs]
    # -- every undefined symbol resolved in this process, before anything is mapped
    external: dict[int, int] = {}
    missing = []
    for i, (name_off, info, shndx, _, _) in enumerate(syms):
      if info & 0xF in (STT_TLS, STT_GNU_IFUNC):
        kind = "thread-local" if info & 0xF == STT_TLS else "an IFUNC"
        raise ObjectLoadError(f"{what}: symbol {_cstr(strs, name_off, what)!r} is {kind}; this loader supports neither")
      if i == 0 or shndx != SHN_UNDEF: continue
      if (addr := resolve(name := _cstr(strs, name_off, what))) == 0: missing.append(name)
      external[i] = addr
    if missing:
      raise UnresolvedSymbolError(f"{what} calls {', '.join(map(repr, missing))}, which this process can't resolve (a "
                                  "runtime-library helper the compiler emitted); the kernel is not run")
    # -- layout: text + stubs | rodata + GOT | data + bss + COMMON, each part starting on a page
    off, parts, common = 0, {}, {}
    for kind in ("text", "ro", "rw"):
      start = off
      for s in sorted((s for s in secs if kinds[s.index] == kind), key=lambda s: s.type == SHT_NOBITS):
        off = s.addr = _align(off, s.align)
        off += s.size
      if kind == "text":
        stub_base = off = _align(off, STUB_SIZE)
        off += STUB_SIZE * len(external)
      elif kind == "ro":
        got_base = off = _align(off, 8)
        off += 8 * len(syms)
      else:
        for k, (_, _, shndx, value, size) in enumerate(syms):
          if shndx == SHN_COMMON:  # st_value is the alignment (gABI)
            off = common[k] = _align(off, max(value, 1))
            off += size
      parts[kind] = (start, off)
      off = _align(off, PAGE)
    self.size = max(off, PAGE)
    if self.size > MAX_IMAGE:
      raise ObjectLoadError(f"{what}: the loaded image would take {self.size} bytes; the limit is {MAX_IMAGE}")
    # -- map, relocate, write, protect
    self.base = _map(self.size)
    self._finalizer = weakref.finalize(self, _unmap, self.base, self.size)
    self._finalizer.atexit = False  # at exit the process goes with its mappings; a thread may still be in the code
    try: self._relocate(obj, what, secs, kinds, syms, strs, external, common, stub_base, got_base, parts)
    except BaseException:
      self._finalizer()
      raise

  def _relocate(self, obj: bytes, what: str, secs: list[_Section], kinds: list[str | None],
                syms: list[tuple[int, int, int, int, int]], strs: bytes, external: dict[int, int],
                common: dict[int, int], stub_base: int, got_base: int, parts: dict[str, tuple[int, int]]) -> None:
    base, nsecs = self.base, len(secs)
    symtab = next(s.index for s in secs if s.type == SHT_SYMTAB)
    img = bytearray(self.size)
    for s in secs:
      if s.addr >= 0 and s.type != SHT_NOBITS: img[s.addr:s.addr + s.size] = obj[s.offset:s.offset + s.size]
    S: dict[int, int] = dict(external)  # symbol index -> address
    G: dict[int, int] = {}  # symbol index -> its GOT entry's address (G + GOT)
    L: dict[int, int] = {}  # undefined symbol index -> its stub's address (what a PLT32 call reaches)

    def sym_addr(i: int) -> int:
      if (a := S.get(i)) is not None: return a
      name_off, _, shndx, value, _ = syms[i]
      if shndx == SHN_ABS: a = value
      elif shndx == SHN_COMMON: a = base + common[i]
      elif 0 < shndx < nsecs and secs[shndx].addr >= 0: a = base + secs[shndx].addr + value
      else: raise ObjectLoadError(f"{what}: symbol {_cstr(strs, name_off, what)!r} is in section {shndx}, which isn't "
                                  "loaded")
      S[i] = a
      return a

    pack = struct.pack_into
    for rel in secs:
      if rel.type not in (SHT_RELA, SHT_REL): continue
      if rel.type == SHT_REL or rel.entsize != _RELA.size or not 0 < rel.info < nsecs or rel.link != symtab:
        raise ObjectLoadError(f"{what}: relocation section {rel.name!r} isn't RELA with {_RELA.size}-byte entries for "
                              f"a section (sh_info {rel.info}) and the symbol table (sh_link {rel.link})")
      if kinds[rel.info] is None: continue  # relocations of a section that isn't loaded (.eh_frame)
      target = secs[rel.info]
      tbase, tsize = target.addr, target.size
      for off, info, add in _RELA.iter_unpack(obj[rel.offset:rel.offset + rel.size - rel.size % _RELA.size]):
        rtype, symi = info & 0xFFFFFFFF, info >> 32
        if (how := RELOCS.get(rtype)) is None:
          if rtype == R_X86_64_NONE: continue
          raise ObjectLoadError(f"{what}: relocation type {rtype} at {target.name}+{off:#x} is not supported; "
                                f"supported: {', '.join(RELOC_NAMES.values())}")
        fmt, width, pcrel = how
        if symi >= len(syms) or off + width > tsize:
          raise ObjectLoadError(f"{what}: {RELOC_NAMES[rtype]} at {target.name}+{off:#x} (symbol {symi}) is outside "
                                f"the section ({tsize} bytes) or the symbol table ({len(syms)} symbols)")
        if rtype in GOT_RELOCS:
          if (sv := G.get(symi)) is None:
            sv = G[symi] = base + got_base + 8 * len(G)
            pack("<Q", img, sv - base, sym_addr(symi))
        elif rtype == R_X86_64_PLT32 and symi in external:
          if (sv := L.get(symi)) is None:
            sv = L[symi] = base + stub_base + STUB_SIZE * len(L)
            img[sv - base:sv - base + STUB_SIZE] = STUB_HEAD + struct.pack("<Q", external[symi]) + b"\xcc\xcc"
        else: sv = sym_addr(symi)
        at = tbase + off
        value = sv + add - (base + at) if pcrel else sv + add
        try: pack(fmt, img, at, value & 0xFFFFFFFFFFFFFFFF if width == 8 and not pcrel else value)
        except struct.error:
          raise ObjectLoadError(f"{what}: {RELOC_NAMES[rtype]} at {target.name}+{off:#x} against symbol "
                                f"{_cstr(strs, syms[symi][0], what) or symi!r}: {value:#x} doesn't fit its "
                                f"{8 * width}-bit field") from None
    ctypes.memmove(base, (ctypes.c_char * self.size).from_buffer(img), self.size)
    (t0, t1), (r0, r1) = parts["text"], parts["ro"]
    _protect(base + t0, _align(t1, PAGE) - t0, mmap.PROT_READ | mmap.PROT_EXEC)
    _protect(base + r0, _align(r1, PAGE) - r0, mmap.PROT_READ)
    self.sections = {s.name: base + s.addr for s in secs if s.addr >= 0}  # where each loaded section went
    self.stubs = {_cstr(strs, syms[i][0], what): a for i, a in L.items()}  # the stub each called function got
    self.symbols = {_cstr(strs, name_off, what): sym_addr(i) for i, (name_off, info, shndx, _, _) in enumerate(syms)
                    if name_off and info >> 4 != STB_LOCAL and shndx != SHN_UNDEF
                    and (shndx in (SHN_ABS, SHN_COMMON) or (shndx < nsecs and secs[shndx].addr >= 0))}

  def symbol(self, name: str) -> int:
    """The address of global `name` defined by the object, 0 if it defines none."""
    return self.symbols.get(name, 0)

  def close(self) -> None:
    """Unmap now (only when no thread can still run its code)."""
    self._finalizer()
