"""Kernel binaries for QCOM: the Adreno OpenCL program binary, and tiny's container around it.

The QCOM compiler builds OpenCL C with the device's own OpenCL compiler and takes the program binary it made
(`clGetProgramInfo(CL_PROGRAM_BINARIES)`). That binary is Qualcomm's, undocumented; the offsets this module reads are
those the Qualcomm driver's binaries have been seen to use (public reverse engineering: tinygrad's `ops_qcom.py`;
tests/test_truth.py parses the mock's binaries with tinygrad's own parser as an independent check):

- header u32s: +0x34 register-descriptor offset (+0x14 full registers, +0x18 half registers), +0xac/+0xb0 offset and
  count of the immediate-constant records, +0xc0 shader image offset, +0x100 its size in bytes, +0x110 the kernel
  descriptor's offset;
- kernel descriptor: +0xc4 program counter offset, +0xc8 private memory bytes per work-item, +0xd8 local (shared)
  memory bytes, +0xdc sampler count, +0x108 branch stack depth x 2, +0x158 the kernel name, then (4-byte aligned) 8
  bytes per sampler, then one 32-byte record per kernel argument (u32 length, ..., +12 const-file offset in dwords,
  ..., +28 kind: 0 value/pointer in the const file, 1 texture, 2 UAV), a record of length 0 ending them;
- immediate constants: 40-byte records up to the shader image (+0 value, +16 const-file offset in units of its
  size, +24 1 for 32-bit, 0 for 16-bit).

tiny's container (`pack_lib`/`unpack_lib`) adds what the binary doesn't say but the runtime needs: the kernel name and
each image argument's shape, taken from the rendered source (`/* image dataN HxW */`).
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field

# header and kernel-descriptor offsets (see the module docstring)
HDR_REG_DESC, HDR_CONST_OFF, HDR_CONST_COUNT, HDR_IMAGE_OFF, HDR_IMAGE_SIZE, HDR_KERNEL_DESC = \
  0x34, 0xAC, 0xB0, 0xC0, 0x100, 0x110
REG_FULL, REG_HALF = 0x14, 0x18
KD_PC_OFFSET, KD_PVTMEM, KD_SHMEM, KD_SAMPLERS, KD_BRANCHSTACK, KD_NAME = 0xC4, 0xC8, 0xD8, 0xDC, 0x108, 0x158
ARG_RECORD, CONST_RECORD = 32, 40
ARG_CONST, ARG_TEX, ARG_UAV = 0, 1, 2
MAGIC = b"TINYQCOM"


def _u32(b: bytes, off: int, what: str) -> int:
  if off < 0 or off + 4 > len(b): raise ValueError(f"Adreno binary of {len(b)} bytes: {what} at {off:#x} is outside it")
  return struct.unpack_from("<I", b, off)[0]


@dataclass(frozen=True)
class Arg:
  """One kernel argument: `kind` (ARG_CONST/TEX/UAV) and, for ARG_CONST, its byte offset in the const file."""
  kind: int
  const_off: int


@dataclass(frozen=True)
class AdrenoBinary:
  """What the runtime needs from an Adreno OpenCL program binary (see the module docstring)."""
  image: bytes
  fregs: int
  hregs: int
  pc_offset: int
  pvtmem: int
  shmem: int
  samplers: int
  branchstack: int
  args: tuple[Arg, ...]
  consts: tuple[tuple[int, int, int], ...] = field(default=())  # (value, byte offset, bytes)

  @staticmethod
  def parse(b: bytes, name: str) -> AdrenoBinary:
    """Parse a program binary of kernel `name` (ValueError naming the field when it doesn't fit the binary)."""
    img_off, img_size = _u32(b, HDR_IMAGE_OFF, "image offset"), _u32(b, HDR_IMAGE_SIZE, "image size")
    if img_off + img_size > len(b) or img_size == 0:
      raise ValueError(f"Adreno binary of {len(b)} bytes: shader image [{img_off:#x}, +{img_size:#x}) is outside it")
    reg, kd = _u32(b, HDR_REG_DESC, "register descriptor offset"), _u32(b, HDR_KERNEL_DESC, "kernel descriptor offset")
    samplers = _u32(b, kd + KD_SAMPLERS, "sampler count")
    got = b[kd + KD_NAME:kd + KD_NAME + len(name)].decode(errors="replace")
    if got != name: raise ValueError(f"Adreno binary names its kernel {got!r}, not {name!r}")
    off = (kd + KD_NAME + len(name) + 3) // 4 * 4 + 8 * samplers
    args = []
    while (length := _u32(b, off, "argument record")) != 0:
      args.append(Arg(_u32(b, off + 28, "argument kind"), 4 * _u32(b, off + 12, "argument offset")))
      off += length
    consts = []
    if _u32(b, HDR_CONST_COUNT, "constant count"):
      c = _u32(b, HDR_CONST_OFF, "constant records offset")
      while c + CONST_RECORD <= img_off:
        value, units = _u32(b, c, "constant"), _u32(b, c + 16, "constant offset")
        is32 = _u32(b, c + 24, "constant size")
        size = 2 << is32
        consts.append((value & ((1 << 8 * size) - 1), units * size, size))
        c += CONST_RECORD
    return AdrenoBinary(b[img_off:img_off + img_size], _u32(b, reg + REG_FULL, "full registers"),
                        _u32(b, reg + REG_HALF, "half registers"), _u32(b, kd + KD_PC_OFFSET, "pc offset"),
                        _u32(b, kd + KD_PVTMEM, "private memory"), _u32(b, kd + KD_SHMEM, "local memory"), samplers,
                        _u32(b, kd + KD_BRANCHSTACK, "branch stack") // 2, tuple(args), tuple(consts))


# ***** tiny's container *****
KERNEL_SIG = re.compile(r"__kernel\s+void\s+(\w+)\s*\((.*?)\)\s*\{", re.S)
IMAGE_LINE = re.compile(r"^/\* image data(\d+) (\d+)x(\d+) \*/$", re.M)


@dataclass(frozen=True)
class KernelInfo:
  """From rendered OpenCL C: the kernel name and, per argument position, ('buf' | 'val' | 'tex' | 'uav', h, w) -- h
  and w (texels) for image arguments, from the `/* image dataN HxW */` lines."""
  name: str
  args: tuple[tuple[str, int, int], ...]

  @staticmethod
  def of_source(src: str) -> KernelInfo:
    m = KERNEL_SIG.search(src)
    if m is None: raise ValueError("OpenCL C without a `__kernel void name(...)` definition")
    shapes = {int(x.group(1)): (int(x.group(2)), int(x.group(3))) for x in IMAGE_LINE.finditer(src)}
    args = []
    for a in (a.strip() for a in m.group(2).split(",") if a.strip()):
      slot = re.search(r"\bdata(\d+)\s*$", a)
      if "image2d_t" in a:
        if slot is None or int(slot.group(1)) not in shapes:
          raise ValueError(f"image argument {a!r} has no `/* image dataN HxW */` line giving its shape")
        args.append(("uav" if "write_only" in a else "tex", *shapes[int(slot.group(1))]))
      else: args.append(("buf" if "*" in a else "val", 0, 0))
    return KernelInfo(m.group(1), tuple(args))


def pack_lib(info: KernelInfo, binary: bytes) -> bytes:
  """tiny's QCOM program: magic, the kernel info as JSON, then the device's program binary."""
  meta = json.dumps({"name": info.name, "args": [list(a) for a in info.args]}).encode()
  return MAGIC + struct.pack("<I", len(meta)) + meta + binary


def unpack_lib(lib: bytes) -> tuple[KernelInfo, bytes]:
  """(kernel info, program binary) of `pack_lib`'s output; ValueError for anything else."""
  if not lib.startswith(MAGIC):
    raise ValueError(f"not a QCOM program (starts {lib[:8]!r}, expected {MAGIC!r}): compile it with the QCOM device's "
                     "compiler (Device['QCOM'].renderer.compiler)")
  n = struct.unpack_from("<I", lib, len(MAGIC))[0]
  meta = json.loads(lib[len(MAGIC) + 4:len(MAGIC) + 4 + n])
  return KernelInfo(meta["name"], tuple(tuple(a) for a in meta["args"])), lib[len(MAGIC) + 4 + n:]
