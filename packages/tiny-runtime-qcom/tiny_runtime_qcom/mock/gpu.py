"""The mock a630's shader cores: a dispatch's kernel run on an OpenCL CPU platform (PoCL) with its arguments rebuilt
from the decoded state.

`Runner.dispatch(d)` takes a `Dispatch` (what the command processor decoded: the shader image, the const file, the
texture / UAV / sampler descriptors, the launch) and runs the OpenCL source the image carries: each buffer argument is
a `cl_mem` over the host memory at the address the const file holds (the mock's GPU memory is host memory at the same
address; CL_MEM_USE_HOST_PTR, so writes land in place), each value the const file's int32, each texture an OpenCL
image made from its descriptor (format, width, height, pitch, base address), each UAV an image written back through
its descriptor, and the kernel's `sampler_t` replaced by what the sampler descriptor says. A wrong descriptor gives
wrong numbers (or a rejection), so tests against numpy check the encoding end to end.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from tiny_runtime_qcom import a6xx
from tiny_runtime_qcom.mock.compiler import IMAGE_MAGIC
from tiny_runtime_qcom.opencl import CL_FLOAT, CL_HALF_FLOAT, CL_MAP_READ, CL_MAP_WRITE, CL_MEM_COPY_HOST_PTR, \
  CL_MEM_OBJECT_IMAGE2D, CL_MEM_READ_ONLY, CL_MEM_READ_WRITE, CL_MEM_USE_HOST_PTR, CL_MEM_WRITE_ONLY, CL_RGBA, \
  Context, check, ffi, load

# PoCL builds unoptimized: its compile time, not the tiny kernels' run time, is what the mock's users wait for (the
# front end and the work-group compiler dominate; results are the same IEEE operations, FP_CONTRACT OFF)
BUILD_OPTIONS = "-cl-std=CL2.0 -w -cl-opt-disable"
CL_FORMATS = {a6xx.FMT6_32_32_32_32_FLOAT: CL_FLOAT, a6xx.FMT6_16_16_16_16_FLOAT: CL_HALF_FLOAT}
SAMPLER_LINE = re.compile(r"__constant sampler_t (\w+) = ([^;]*);")
CL_ADDRESS = {a6xx.TEX_CLAMP_TO_BORDER: "CLK_ADDRESS_CLAMP", 1: "CLK_ADDRESS_CLAMP_TO_EDGE", 0: "CLK_ADDRESS_REPEAT",
              2: "CLK_ADDRESS_MIRRORED_REPEAT"}
CL_FILTER = {a6xx.TEX_NEAREST: "CLK_FILTER_NEAREST", 1: "CLK_FILTER_LINEAR"}


class GPUFault(RuntimeError):
  """The mock GPU rejected a command stream or a dispatch (what real hardware would fault on or misexecute)."""


@dataclass
class Dispatch:
  """A decoded dispatch: the shader image, const file bytes, descriptors, launch sizes, and `check_range(addr, n)`
  (raises GPUFault unless [addr, addr+n) is GPU memory) / `alloc_end(addr)` (end of the allocation holding addr)."""
  image: dict[str, Any]
  consts: bytes
  textures: list[list[int]]
  uavs: list[list[int]]
  samplers: list[list[int]]
  global_size: tuple[int, int, int]
  local_size: tuple[int, int, int]
  alloc_end: Callable[[int], int]
  stats: dict[str, int] = field(default_factory=dict)


def parse_image(raw: bytes) -> dict[str, Any]:
  """The mock shader image (see mock/compiler.py); GPUFault when the bytes loaded as the shader are something else."""
  if not raw.startswith(IMAGE_MAGIC):
    raise GPUFault(f"the shader loaded for this dispatch is not a mock a6xx image (starts {raw[:16]!r}): the "
                   "SP_CS_BASE / CP_LOAD_STATE6 shader address or size is wrong")
  n = struct.unpack_from("<I", raw, len(IMAGE_MAGIC))[0]
  if len(IMAGE_MAGIC) + 4 + n > len(raw):
    raise GPUFault(f"the shader image is cut short: {len(raw)} bytes loaded, it needs {len(IMAGE_MAGIC) + 4 + n} "
                   "(SP_CS_INSTR_SIZE / CP_LOAD_STATE6 NUM_UNIT too small)")
  return json.loads(raw[len(IMAGE_MAGIC) + 4:len(IMAGE_MAGIC) + 4 + n])


def decode_tex(d: list[int], what: str, storage: bool = False) -> a6xx.TexDesc:
  """A6XX_TEX_CONST -> TexDesc, rejecting what the mock (and a linear 2D RGBA image) doesn't allow. A texture's
  swizzle must be XYZW (the mock doesn't reorder channels); a `storage` image (UAV) has none."""
  fmt = (d[0] >> 22) & 0xFF
  if d[0] & 3: raise GPUFault(f"{what}: TILE_MODE {d[0] & 3}; tiny's images are linear (TILE6_LINEAR)")
  swiz = [(d[0] >> s) & 7 for s in (4, 7, 10, 13)]
  if swiz != ([0] * 4 if storage else [a6xx.TEX_X, a6xx.TEX_Y, a6xx.TEX_Z, a6xx.TEX_W]):
    raise GPUFault(f"{what}: swizzle {swiz}, expected {'none' if storage else 'XYZW'}")
  if fmt not in CL_FORMATS: raise GPUFault(f"{what}: format {fmt:#x}; the mock knows {list(map(hex, CL_FORMATS))}")
  width, height = d[1] & 0x7FFF, (d[1] >> 15) & 0x7FFF
  typ, pitch, align = d[2] >> 29, (d[2] >> 7) & 0x3FFFFF, d[2] & 0xF
  if typ != a6xx.A6XX_TEX_2D: raise GPUFault(f"{what}: TYPE {typ}, expected A6XX_TEX_2D ({a6xx.A6XX_TEX_2D})")
  if d[4] & 0x1F: raise GPUFault(f"{what}: BASE_LO {d[4]:#x} has address bits 4:0 set (the base is 32-byte aligned)")
  if pitch % a6xx.PITCH_ALIGN or pitch % (64 << align):
    raise GPUFault(f"{what}: PITCH {pitch} bytes with PITCHALIGN {align}: the pitch must be a multiple of "
                   f"{64 << align} bytes")
  if pitch < width * a6xx.FORMAT_BYTES[fmt]: raise GPUFault(f"{what}: PITCH {pitch} < WIDTH {width} x texel bytes")
  if not width or not height: raise GPUFault(f"{what}: a {width}x{height} texture")
  return a6xx.TexDesc(fmt, width, height, pitch, d[4] | (d[5] & 0x1FFFF) << 32)


class Runner:
  """Runs dispatches on the first PoCL platform (its programs built once per source)."""

  def __init__(self) -> None:
    cl = load()
    names = []
    for i in range(len(cl.platforms())):
      ctx = Context(cl, i)
      if "portable computing language" in ctx.platform_name.lower() or "pocl" in ctx.platform_name.lower(): break
      names.append(ctx.platform_name)
    else: raise RuntimeError(f"MOCK+QCOM runs kernels on PoCL, and the OpenCL platforms here are {names}: "
                             "pip install pocl-binary-distribution")
    self.ctx, self.cl = ctx, cl
    self.programs: dict[tuple[str, str], tuple[Any, Any]] = {}

  def program(self, src: str, name: str) -> Any:
    """The built kernel `name` of `src` (BuildError with the log when it doesn't build)."""
    if (p := self.programs.get((src, name))) is None:
      p = self.programs[(src, name)] = self.ctx.build(src, name, BUILD_OPTIONS)
    return p[1]

  def _image(self, desc: a6xx.TexDesc, flags: int, copy: bool, end: int) -> Any:
    need = desc.pitch * (desc.height - 1) + desc.width * a6xx.FORMAT_BYTES[desc.fmt]
    if desc.base + need > end:
      raise GPUFault(f"image {desc.width}x{desc.height} (pitch {desc.pitch}) at {desc.base:#x} runs past its GPU "
                     f"allocation (ends {end:#x})")
    fmt = ffi.new("cl_image_format*", {"image_channel_order": CL_RGBA, "image_channel_data_type": CL_FORMATS[desc.fmt]})
    cd = ffi.new("cl_image_desc*", {"image_type": CL_MEM_OBJECT_IMAGE2D, "image_width": desc.width,
                                    "image_height": desc.height, "image_depth": 1, "image_array_size": 1,
                                    "image_row_pitch": desc.pitch if copy else 0})
    err = ffi.new("cl_int*")
    img = self.cl.clCreateImage(self.ctx.ctx, flags | (CL_MEM_COPY_HOST_PTR if copy else 0), fmt, cd,
                                ffi.cast("void*", desc.base) if copy else ffi.NULL, err)
    check(err[0], f"clCreateImage({desc})")
    return img

  def dispatch(self, d: Dispatch) -> None:
    """Run one decoded dispatch (see the module docstring)."""
    img, cl, q = d.image, self.cl, self.ctx.queue
    src = img["src"]
    if d.samplers:  # the kernel's sampler is what the sampler descriptor says
      src = SAMPLER_LINE.sub(lambda m: f"__constant sampler_t {m.group(1)} = {sampler_flags(d.samplers[0])};", src)
    kernel = self.program(src, img["name"])
    mems, bufs, uavs = [], [], []
    arg = ffi.new("cl_mem*")
    cv = ffi.new("cl_int*")
    try:
      for i, a in enumerate(img["args"]):
        if a["kind"] == "val":
          cv[0] = struct.unpack_from("<i", d.consts, a["off"])[0]
          check(cl.clSetKernelArg(kernel, i, 4, cv), f"clSetKernelArg({i})")
          continue
        if a["kind"] == "buf":
          addr = struct.unpack_from("<Q", d.consts, a["off"])[0]
          end = d.alloc_end(addr)
          err = ffi.new("cl_int*")
          mem = cl.clCreateBuffer(self.ctx.ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, max(end - addr, 1),
                                  ffi.cast("void*", addr), err)
          check(err[0], "clCreateBuffer(CL_MEM_USE_HOST_PTR)")
          bufs.append((mem, end - addr))
        elif a["kind"] == "tex":
          desc = decode_tex(d.textures[a["index"]], f"texture {a['index']}")
          if (desc.height, desc.width) != (a["h"], a["w"]):
            raise GPUFault(f"texture {a['index']} is {desc.width}x{desc.height}; the kernel reads {a['w']}x{a['h']}")
          mem = self._image(desc, CL_MEM_READ_ONLY, True, d.alloc_end(desc.base))
        else:
          desc = decode_tex(d.uavs[a["index"]], f"UAV {a['index']}", storage=True)
          mem = self._image(desc, CL_MEM_WRITE_ONLY, False, d.alloc_end(desc.base))
          uavs.append((mem, desc))
        mems.append(mem)
        arg[0] = mem
        check(cl.clSetKernelArg(kernel, i, ffi.sizeof("cl_mem"), arg), f"clSetKernelArg({i})")
      gsz = ffi.new("size_t[3]", list(d.global_size))
      lsz = ffi.new("size_t[3]", list(d.local_size))
      check(cl.clEnqueueNDRangeKernel(q, kernel, 3, ffi.NULL, gsz, lsz, 0, ffi.NULL, ffi.NULL),
            "clEnqueueNDRangeKernel")
      for mem, desc in uavs:  # a storage image's texels land in memory through its descriptor
        origin, region = ffi.new("size_t[3]", [0, 0, 0]), ffi.new("size_t[3]", [desc.width, desc.height, 1])
        check(cl.clEnqueueReadImage(q, mem, 1, origin, region, desc.pitch, 0, ffi.cast("void*", desc.base), 0,
                                    ffi.NULL, ffi.NULL), "clEnqueueReadImage")
      err = ffi.new("cl_int*")
      for mem, n in bufs:  # map/unmap: USE_HOST_PTR memory is up to date once mapped (OpenCL 2.0 5.2.2)
        p = cl.clEnqueueMapBuffer(q, mem, 1, CL_MAP_READ | CL_MAP_WRITE, 0, max(n, 1), 0, ffi.NULL, ffi.NULL, err)
        check(err[0], "clEnqueueMapBuffer")
        check(cl.clEnqueueUnmapMemObject(q, mem, p, 0, ffi.NULL, ffi.NULL), "clEnqueueUnmapMemObject")
      self.ctx.finish()
    finally:
      for m in mems: cl.clReleaseMemObject(m)


def sampler_flags(s: list[int]) -> str:
  """OpenCL sampler flags of an A6XX_TEX_SAMP (GPUFault for what OpenCL's samplers can't express)."""
  mag, mn = (s[0] >> 1) & 3, (s[0] >> 3) & 3
  wraps = {(s[0] >> 5) & 7, (s[0] >> 8) & 7, (s[0] >> 11) & 7}
  if mag != mn or mag not in CL_FILTER: raise GPUFault(f"sampler: XY_MAG {mag} / XY_MIN {mn}; OpenCL needs one filter")
  if len(wraps) != 1 or (wrap := wraps.pop()) not in CL_ADDRESS:
    raise GPUFault(f"sampler: WRAP_S/T/R {[(s[0] >> b) & 7 for b in (5, 8, 11)]}; OpenCL needs one address mode")
  unnorm = bool(s[1] & a6xx.TEX_SAMP_1_UNNORM_COORDS)
  if unnorm and CL_ADDRESS[wrap] in ("CLK_ADDRESS_REPEAT", "CLK_ADDRESS_MIRRORED_REPEAT"):
    raise GPUFault("sampler: unnormalized coordinates with a repeat wrap mode (not allowed)")
  coords = "CLK_NORMALIZED_COORDS_FALSE" if unnorm else "CLK_NORMALIZED_COORDS_TRUE"
  return f"{coords} | {CL_ADDRESS[wrap]} | {CL_FILTER[mag]}"
