"""What the NV device needs to launch a kernel from a cubin (an NVIDIA ELF64 from ptxas): where its code is, how many
registers and how much shared and local memory it uses, and where its parameters live in constant bank 0.

A cubin keeps per-kernel facts in `.nv.info.<kernel>` and per-module facts in `.nv.info`, as a list of attributes:
a byte format (EIFMT_NVAL 1, EIFMT_BVAL 2, EIFMT_HVAL 3: a 16-bit value in the size field, EIFMT_SVAL 4: `size`
bytes follow), a byte attribute id (EIATTR_*), a 16-bit size. The ids and payloads used here, as NVIDIA's cuobjdump
names and prints them (`cuobjdump -elf`; `tests/test_nv_cubin.py` checks this parser against cuobjdump's output):
EIATTR_PARAM_CBANK 0x0a (symbol of `.nv.constant0.<kernel>`, u16 offset, u16 size of the parameters in bank 0),
EIATTR_FRAME_SIZE 0x11, EIATTR_MIN_STACK_SIZE 0x12 (symbol, u32 bytes), EIATTR_KPARAM_INFO 0x17 (u32 index,
u16 ordinal, u16 offset, u32 flags with the size in bits 31:18), EIATTR_CBANK_PARAM_SIZE 0x19 (HVAL),
EIATTR_MAXREG_COUNT 0x1b (HVAL), EIATTR_REGCOUNT 0x2f (symbol, u32 registers). Shared memory is the size of the
NOBITS section `.nv.shared.<kernel>`.

The target SM (major * 10 + minor) is in e_flags, where depends on the ELF ABI version (e_ident[EI_ABIVERSION]), as
LLVM's `ELFObjectFileBase::getNVPTXCPUName` and `llvm/BinaryFormat/ELF.h` read it: ABI 7 (ELFABIVERSION_CUDA_V1:
ptxas up to CUDA 12, the driver's JIT) keeps it in bits 7:0 (EF_CUDA_SM, e.g. 0x005a055a for sm_90), ABI 8
(ELFABIVERSION_CUDA_V2: ptxas 13) in bits 15:8 (EF_CUDA_SM_MASK 0xff00, EF_CUDA_SM_OFFSET 8, e.g. 0x06005a04).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from tiny_runtime_nv.elf import ELF, SHT_NOBITS, ELFError

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_PARAM_CBANK, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE, EIATTR_KPARAM_INFO = 0x0A, 0x11, 0x12, 0x17
EIATTR_CBANK_PARAM_SIZE, EIATTR_MAXREG_COUNT, EIATTR_REGCOUNT = 0x19, 0x1B, 0x2F
SHF_ALLOC = 0x2
SHT_REL, SHT_RELA = 9, 4
EM_CUDA = 190
ELFABIVERSION_CUDA_V1, ELFABIVERSION_CUDA_V2 = 7, 8
EF_CUDA_SM, EF_CUDA_SM_MASK, EF_CUDA_SM_OFFSET = 0xFF, 0xFF00, 8


class CubinError(ValueError):
  """A cubin the NV device can't load (not a CUDA ELF, no such kernel, missing facts, relocations)."""


@dataclass(frozen=True)
class Param:
  """One kernel parameter from EIATTR_KPARAM_INFO: its ordinal, byte offset in the parameter area, size."""
  ordinal: int
  offset: int
  size: int


@dataclass(frozen=True)
class KernelInfo:
  """Launch facts of one kernel of a cubin; offsets are byte offsets into the cubin as it is."""
  name: str
  arch: str                 # "sm_90"
  text_offset: int          # the kernel's code (`.text.<name>`)
  text_size: int
  registers: int
  shared_size: int          # static shared memory (`.nv.shared.<name>`)
  local_size: int           # per-thread stack (EIATTR_MIN_STACK_SIZE, else FRAME_SIZE)
  param_offset: int         # where the parameters start in constant bank 0
  param_size: int
  cbank0_size: int          # `.nv.constant0.<name>`: the driver's area, then the parameters
  params: tuple[Param, ...]


def _attributes(data: bytes) -> list[tuple[int, int, bytes | int]]:
  """(format, attribute, payload bytes or 16-bit value) of an `.nv.info` section."""
  out: list[tuple[int, int, bytes | int]] = []
  off = 0
  while off < len(data):
    if off + 4 > len(data): raise CubinError(f".nv.info: truncated attribute header at {off}")
    fmt, attr, size = struct.unpack_from("<BBH", data, off)
    if fmt == EIFMT_SVAL:
      if off + 4 + size > len(data): raise CubinError(f".nv.info: attribute {attr:#x} of {size} bytes is truncated")
      out.append((fmt, attr, data[off + 4:off + 4 + size]))
      off += 4 + size
    elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
      out.append((fmt, attr, size))
      off += 4
    else: raise CubinError(f".nv.info: unknown attribute format {fmt} at byte {off}")
  return out


def cubin_arch(abi_version: int, e_flags: int) -> str:
  """The target ("sm_90") of a cubin with ELF ABI version `abi_version` and `e_flags`; CubinError for an ABI
  version this reader does not know."""
  if abi_version == ELFABIVERSION_CUDA_V1: sm = e_flags & EF_CUDA_SM
  elif abi_version == ELFABIVERSION_CUDA_V2: sm = (e_flags & EF_CUDA_SM_MASK) >> EF_CUDA_SM_OFFSET
  else:
    raise CubinError(f"cubin ELF ABI version {abi_version} is unknown; known are {ELFABIVERSION_CUDA_V1} (ptxas "
                     f"<= CUDA 12, the driver's JIT) and {ELFABIVERSION_CUDA_V2} (ptxas 13)")
  return f"sm_{sm}"


def load_kernel_info(lib: bytes, name: str) -> KernelInfo:
  """Read kernel `name`'s launch facts from cubin `lib` (CubinError when they aren't there)."""
  try: elf = ELF(lib)
  except ELFError as e: raise CubinError(f"not a cubin: {e}") from e
  if elf.machine != EM_CUDA: raise CubinError(f"ELF machine {elf.machine}, not EM_CUDA ({EM_CUDA})")
  arch = cubin_arch(elf.abi_version, elf.flags)
  for s in elf.sections:
    if s.type in (SHT_REL, SHT_RELA) and s.size and s.info and elf.sections[s.info].flags & SHF_ALLOC:
      raise CubinError(f"cubin has relocations ({s.name}) against loaded section {elf.sections[s.info].name}: the NV "
                       "loader does not apply relocations (kernels using global device variables)")
  text = elf.section(f".text.{name}")
  if text is None:
    kernels = [s.name[6:] for s in elf.sections if s.name.startswith(".text.")]
    raise CubinError(f"cubin has no kernel {name!r}; it has {kernels}")
  if text.align and text.offset % text.align:
    raise CubinError(f".text.{name} at file offset {text.offset:#x} is not {text.align}-byte aligned")
  sym_index = {sym.name: i for i, sym in enumerate(elf.symbols)}
  me = sym_index.get(name)
  regs = frame = stack = None
  for fmt, attr, val in _attributes(elf.data(".nv.info")) if elf.section(".nv.info") else []:
    if fmt == EIFMT_SVAL and isinstance(val, bytes) and len(val) == 8:
      sym, v = struct.unpack("<II", val)
      if sym != me: continue
      if attr == EIATTR_REGCOUNT: regs = v
      elif attr == EIATTR_FRAME_SIZE: frame = v
      elif attr == EIATTR_MIN_STACK_SIZE: stack = v
  cbank = None
  params: list[Param] = []
  for _, attr, val in _attributes(elf.data(f".nv.info.{name}")):
    if attr == EIATTR_PARAM_CBANK and isinstance(val, bytes):
      _, off, size = struct.unpack("<IHH", val)
      cbank = (off, size)
    elif attr == EIATTR_KPARAM_INFO and isinstance(val, bytes):
      _, ordinal, off, flags = struct.unpack("<IHHI", val)
      params.append(Param(ordinal, off, flags >> 18))
  if regs is None: raise CubinError(f"cubin: no EIATTR_REGCOUNT for kernel {name}")
  if cbank is None: raise CubinError(f"cubin: no EIATTR_PARAM_CBANK for kernel {name}")
  shared = elf.section(f".nv.shared.{name}")
  c0 = elf.section(f".nv.constant0.{name}")
  if c0 is None: raise CubinError(f"cubin: no .nv.constant0.{name}")
  if shared is not None and shared.type != SHT_NOBITS: raise CubinError(f".nv.shared.{name} is not NOBITS")
  return KernelInfo(name, arch, text.offset, text.size, regs,
                    shared.size if shared is not None else 0, stack if stack is not None else (frame or 0),
                    cbank[0], cbank[1], c0.size, tuple(sorted(params, key=lambda p: p.ordinal)))
