"""The mock a630's "OpenCL compiler": OpenCL C -> a program binary in the Adreno layout (`tiny_runtime_qcom.adreno`)
whose shader image carries the kernel's OpenCL source instead of a6xx machine code.

`MockAdrenoCompiler.compile(src)` builds the source on the mock's OpenCL CPU platform first (so a bad kernel fails
here with PoCL's build log, as a real build would with Qualcomm's), then lays out a binary the way the Qualcomm
compiler's are laid out: a register descriptor, a kernel descriptor with the argument records (each buffer address
or value at an offset in the const file; image arguments as textures or UAVs), an immediate-constant record, and the
shader image. The mock GPU (`mock/gpu.py`) reads the image back from the memory a dispatch loaded it from:
`IMAGE_MAGIC`, then JSON with the source, the argument table and the register footprint the dispatch must have been
programmed with -- so the driver's parsing of the binary and its state loads are checked end to end.
"""
from __future__ import annotations

import json
import re
import struct
import zlib
from typing import Any

from tiny_uop.device import CompileError, Compiler

from tiny_runtime_qcom import adreno
from tiny_runtime_qcom.opencl import BuildError

IMAGE_MAGIC = b"TINY-MOCK-A6XX\0\0"
A630_LIMITS = {"max_workgroup_size": 1024, "shared_max": 32768}  # Adreno 630's CL_DEVICE_* limits
LOCAL_ARRAY = re.compile(r"__local\s+(\w+)\s+\w+\[(\d+)\];")
TYPE_BYTES = {"float": 4, "int": 4, "uint": 4, "half": 2, "ushort": 2, "short": 2, "char": 1, "uchar": 1,
              "double": 8, "long": 8, "ulong": 8, "bool": 1}


def shared_bytes(src: str) -> int:
  """Bytes of `__local` arrays the kernel declares."""
  total = 0
  for t, n in LOCAL_ARRAY.findall(src):
    base = re.match(r"([a-z]+?)(\d*)$", t)
    scalar, width = (base.group(1), int(base.group(2) or 1)) if base else (t, 1)
    total += TYPE_BYTES.get(scalar, 4) * width * int(n)
  return total


def shader_image(src: str, info: adreno.KernelInfo, args: list[dict[str, Any]], regs: dict[str, int],
                 imm: list[tuple[int, int, int]]) -> bytes:
  """The mock shader image: magic, then JSON the mock GPU runs (source, arguments, expected registers)."""
  body = json.dumps({"name": info.name, "src": src, "args": args, "regs": regs, "imm": imm}).encode()
  return IMAGE_MAGIC + struct.pack("<I", len(body)) + body


def write_binary(name: str, image: bytes, args: list[tuple[int, int]], regs: dict[str, int],
                 consts: list[tuple[int, int, int]]) -> bytes:
  """A program binary in the Adreno layout (offsets in `tiny_runtime_qcom.adreno`): `args` are (kind, const-file
  byte offset), `consts` (value, byte offset, bytes)."""
  reg_off, kd_off = 0x200, 0x220
  kd = bytearray(adreno.KD_NAME) + name.encode()
  kd += b"\0" * (-len(kd) % 4) + b"\0" * (8 * regs["samplers"])
  for kind, off in args:
    kd += struct.pack("<8I", adreno.ARG_RECORD, 0, 0, off // 4, 0, 0, 0, kind)
  kd += b"\0" * adreno.ARG_RECORD  # a record of length 0 ends them
  struct.pack_into("<5I", kd, adreno.KD_PC_OFFSET, 0, regs["pvtmem"], 0, 0, 0)
  struct.pack_into("<II", kd, adreno.KD_SHMEM, regs["shmem"], regs["samplers"])
  struct.pack_into("<I", kd, adreno.KD_BRANCHSTACK, 2 * regs["branchstack"])
  const_off = kd_off + len(kd)
  crecs = b"".join(struct.pack("<IIIIIII", value, 0, 0, 0, off // size, 0, 1 if size == 4 else 0) + b"\0" * 12
                   for value, off, size in consts)
  img_off = const_off + len(crecs)
  hdr = bytearray(reg_off)
  struct.pack_into("<I", hdr, adreno.HDR_REG_DESC, reg_off)
  struct.pack_into("<II", hdr, adreno.HDR_CONST_OFF, const_off, len(consts))
  struct.pack_into("<I", hdr, adreno.HDR_IMAGE_OFF, img_off)
  struct.pack_into("<I", hdr, adreno.HDR_IMAGE_SIZE, len(image))
  struct.pack_into("<I", hdr, adreno.HDR_KERNEL_DESC, kd_off)
  reg = bytearray(kd_off - reg_off)
  struct.pack_into("<II", reg, adreno.REG_FULL, regs["fregs"], regs["hregs"])
  return bytes(hdr + reg + kd + crecs + image)


class MockAdrenoCompiler(Compiler):
  """The mock's compiler (see the module docstring); `extensions` are those of the OpenCL CPU platform that runs the
  kernels (PoCL: no cl_khr_fp16, so half is storage-only), `limits` an Adreno 630's."""
  limits = A630_LIMITS

  def __init__(self, gpu: Any):
    self.gpu = gpu
    self.extensions = gpu.runner.ctx.extensions
    super().__init__("qcom_mock_a630_v2")

  def compile(self, src: str) -> bytes:
    try: info = adreno.KernelInfo.of_source(src)
    except ValueError as e: raise CompileError(f"{e}\n--- source ---\n{src}") from e
    try: self.gpu.runner.program(src, info.name)
    except BuildError as e: raise CompileError(str(e)) from e
    # the const file: an immediate at 0 (a checksum of the source the mock GPU checks), then each argument 8-aligned
    imm = [(zlib.crc32(src.encode()), 0, 4)]
    args, table, off = [], [], 16
    tex = uav = 0
    for kind, h, w in info.args:
      if kind in ("buf", "val"):
        off = (off + 7) // 8 * 8
        args.append((adreno.ARG_CONST, off))
        table.append({"kind": kind, "off": off})
        off += 8 if kind == "buf" else 4
      else:
        args.append((adreno.ARG_TEX if kind == "tex" else adreno.ARG_UAV, 0))
        table.append({"kind": kind, "index": tex if kind == "tex" else uav, "h": h, "w": w})
        tex, uav = tex + (kind == "tex"), uav + (kind == "uav")
    # a register footprint that depends on the kernel, so a driver that misreads the binary programs wrong values;
    # small enough (full + half/2 <= 12 registers) that the register file allows 1024-work-item groups, as the
    # renderer's limits promise
    regs = {"fregs": 4 + len(info.args) % 5, "hregs": 2 + len(src) % 5, "branchstack": src.count("for (") % 60,
            "shmem": shared_bytes(src), "pvtmem": 0, "samplers": 1 if "sampler_t" in src else 0}
    image = shader_image(src, info, table, regs, imm)
    return adreno.pack_lib(info, write_binary(info.name, image, args, regs, imm))

  def disassemble(self, lib: bytes) -> str:
    info, blob = adreno.unpack_lib(lib)
    img = adreno.AdrenoBinary.parse(blob, info.name).image
    return json.loads(img[len(IMAGE_MAGIC) + 4:])["src"]
