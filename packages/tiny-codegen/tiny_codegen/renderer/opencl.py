"""OpenCL C renderer (`OpenCLRenderer`): linear UOps -> an OpenCL C 2.0 kernel.

The kernel is `__kernel void name(__global T0* restrict data0, ..., const int var0, ...)`: buffers by PARAM slot,
then DEFINE_VARs in name order (docs/PIPELINE.md §4, GPU-style). `SPECIAL` gidx{i}/lidx{i} are `get_group_id(i)` /
`get_local_id(i)`: the launch is `spec.global_size` work-groups of `spec.local_size` work-items. DEFINE_LOCAL is a
`__local` array, BARRIER `barrier(CLK_LOCAL_MEM_FENCE)`. Vectors are OpenCL's `float4` etc. half needs
`cl_khr_fp16` (the pragma is emitted when half appears), double `cl_khr_fp64`; bool buffers are `uchar` in memory
(OpenCL forbids `bool` in kernel arguments); bfloat16 goes through float32 (lowering's `bf16_to_float`).
`OpenCLHalfStorageRenderer` keeps half in memory only, for devices without cl_khr_fp16. `FP_CONTRACT OFF`: a*b+c
is never fused. Transcendentals are OpenCL's builtins (`exp2`, `log2`, `sin`, `sqrt`: within a few ulp, the spec's
limits).

Images (Adreno-style `dtypes.imagef/imageh((height, width, 4))` PARAMs): a `read_only`/`write_only image2d_t`
argument; INDEX takes an int2 (x, y) texel coordinate, LOAD is `read_imagef/h` (float4/half4, nearest, clamped;
a gated load yields 0) and STORE `write_imagef/h`. With images on -- `IMAGE>=1`, or the arch "image"
(`NULL:OPENCL:image`) -- lowering (`tiny_codegen.lower.image`, run as this renderer's `extra_matcher`) reads every
kernel's read-only float32 buffers (a multiple of 4 floats) as `imagef((h, w, 4))` params; the runtime makes those
params images of the buffers it launches with (see `image_params_of`). The mode is part of `arch` ("...:image"), so
program caches keyed on the renderer's arch keep the two apart.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

from tiny_uop.device import Renderer
from tiny_uop.helpers import IMAGE
from tiny_uop.dtype import INVERSE_DTYPES_DICT, AddrSpace, DType, ImageDType, PtrDType, dtypes, round_float
from tiny_uop.uop import Ops, UOp

from tiny_codegen.compiler.opencl import OpenCLCompiler
from tiny_codegen.lower.image import pm_images, pm_images_pitch64
from tiny_codegen.renderer import CWriter, SourceExprs, count_uses, kernel_params, var_args

_CL_TYPES = {"bool": "bool", "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort", "int32": "int",
             "uint32": "uint", "int64": "long", "uint64": "ulong", "float16": "half", "float32": "float",
             "float64": "double"}
_VEC_SIZES = (2, 3, 4, 8, 16)


def _fmax(s: Sequence[str]) -> str:
  """numpy's maximum: a NaN operand gives NaN (a+b), and of two equal zeros +0 wins (-0 + +0 = +0). The operands are
  variables (see `_multi_use`), so repeating them costs nothing."""
  a, b = s
  return f"((({a}!={a})|({b}!={b}))?({a}+{b}):(({a}>{b})?{a}:(({b}>{a})?{b}:(({a}==0)?({a}+{b}):{a}))))"


def _fn(name: str) -> Callable[[Sequence[str], DType], str]: return lambda s, dt: f"{name}({', '.join(s)})"


CL_CODE: dict[Ops, Callable[[Sequence[str], DType], str]] = {
  Ops.ADD: lambda s, dt: f"({s[0]}+{s[1]})" if dt.scalar() != dtypes.bool else f"({s[0]}|{s[1]})",
  Ops.SUB: lambda s, dt: f"({s[0]}-{s[1]})" if dt.scalar() != dtypes.bool else f"({s[0]}!={s[1]})",
  Ops.MUL: lambda s, dt: f"({s[0]}*{s[1]})" if dt.scalar() != dtypes.bool else f"({s[0]}&{s[1]})",
  Ops.FDIV: lambda s, dt: f"({s[0]}/{s[1]})", Ops.CDIV: lambda s, dt: f"({s[0]}/{s[1]})",
  Ops.CMOD: lambda s, dt: f"fmod({s[0]}, {s[1]})" if dtypes.is_float(dt) else f"({s[0]}%{s[1]})",
  Ops.SHL: lambda s, dt: f"({s[0]}<<{s[1]})",
  Ops.SHR: lambda s, dt: f"({s[0]}>>{s[1]})",
  Ops.CMPLT: lambda s, dt: f"({s[0]}<{s[1]})", Ops.CMPNE: lambda s, dt: f"({s[0]}!={s[1]})",
  Ops.CMPEQ: lambda s, dt: f"({s[0]}=={s[1]})",
  Ops.AND: lambda s, dt: f"({s[0]}&{s[1]})", Ops.OR: lambda s, dt: f"({s[0]}|{s[1]})",
  Ops.XOR: lambda s, dt: f"({s[0]}^{s[1]})",
  Ops.MAX: lambda s, dt: _fmax(s) if dtypes.is_float(dt) else f"(({s[0]}>{s[1]})?{s[0]}:{s[1]})",
  Ops.NEG: lambda s, dt: f"(!{s[0]})" if dt.scalar() == dtypes.bool else f"(-{s[0]})",
  Ops.RECIPROCAL: lambda s, dt: f"(1/{s[0]})",
  Ops.WHERE: lambda s, dt: f"({s[0]}?{s[1]}:{s[2]})", Ops.MULACC: lambda s, dt: f"(({s[0]}*{s[1]})+{s[2]})",
  Ops.EXP2: _fn("exp2"), Ops.LOG2: _fn("log2"), Ops.SIN: _fn("sin"), Ops.SQRT: _fn("sqrt"),
  Ops.TRUNC: _fn("trunc"), Ops.POW: _fn("pow"),
}


# half <-> float for storage-only half, in integer and float ALU ops only (IEEE 754 binary16, round to nearest even,
# subnormals, inf; a NaN keeps its top 10 payload bits, quiet or signaling, so a half's bits survive _f2h(_h2f(h)), as a
# BITCAST needs; one whose payload is only in the low 13 bits becomes the quiet NaN): taking the address of a private
# (vload_half/vstore_half on `&b`) makes PoCL keep every such value in memory per work-item, and its work-group
# compiler then takes minutes on a big unrolled kernel
_ROUND_HALF = (
  "float _h2f(ushort h) { uint s = (uint)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;\n"
  "  if (e == 0x1f) return as_float(s | 0x7f800000u | (m << 13));\n"
  "  if (e != 0) return as_float(s | ((e + 112) << 23) | (m << 13));\n"
  "  return copysign((float)m * 5.9604644775390625e-08f, as_float(s | 0x3f800000u)); }\n"
  "ushort _f2h(float x) { uint u = as_uint(x), s = (u >> 16) & 0x8000, a = u & 0x7fffffffu;\n"
  "  if (a > 0x7f800000u) { uint m = (a >> 13) & 0x3ff; return (ushort)(s | 0x7c00 | (m ? m : 0x200)); }\n"
  "  if (a >= 0x477ff000u) return (ushort)(s | 0x7c00);\n"
  "  if (a >= 0x38800000u) return (ushort)(s | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));\n"
  "  return (ushort)(s | (uint)rint(as_float(a) * 16777216.0f)); }\n"
  "float _rh(float x) { return _h2f(_f2h(x)); }\n")


def _multi_use(u: UOp) -> bool:
  """Ops whose rendering repeats an operand (MAX: `_fmax`, and an int's `(a>b)?a:b`; float -> uint64). An operand
  left inline would be spelled twice, so a chain of n MAXes (an unrolled argmax) would render 2**n copies of its
  first operand: a 16-wide one was a 2 MB kernel whose nested branches overflowed PoCL's work-group compiler stack."""
  if u.op is Ops.MAX: return True
  return u.op is Ops.CAST and u.dtype == dtypes.uint64 and dtypes.is_float(u.src[0].dtype)


class OpenCLRenderer(Renderer):
  """OpenCL C for any OpenCL 2.0 device (PoCL, Adreno, ...); see the module docstring."""
  device = "CL"
  has_local = True
  has_shared = True
  supports_float4 = True
  global_max = (0x7FFFFFFF, 65535, 65535)
  local_max = (256, 256, 256)
  shared_max = 32768
  bf16_through_float = True
  half_storage_only = False  # a device without cl_khr_fp16: half lives in memory only, math runs in float (see below)
  code_for_op = CL_CODE
  compiler_cls = OpenCLCompiler

  def __init__(self, arch: str = ""):
    self._images = "image" in arch.split(":")
    super().__init__(":".join(a for a in arch.split(":") if a != "image"))

  @property
  def arch(self) -> str:
    """The device arch, with ":image" appended while images are on (so caches keyed on it keep modes apart)."""
    return self._arch + (":image" if self.images else "") if self._arch else ("image" if self.images else "")

  @arch.setter
  def arch(self, v: str) -> None: self._arch = v

  @property
  def images(self) -> bool:
    """Whether kernels read their read-only float32 buffers as images (`IMAGE>=1` or the arch "image")."""
    return self._images or IMAGE >= 1

  @property
  def extra_matcher(self) -> Any:
    """The lowering rules this renderer adds: the image params pass while images are on."""
    return pm_images if self.images else None

  def supported_dtypes(self) -> tuple[DType, ...]:
    return tuple(d for d in dtypes.all if d not in (dtypes.bfloat16, *dtypes.fp8s))

  def render_dtype(self, dt: DType, mem: bool = False) -> str:
    """The OpenCL C type of `dt`; `mem`: the in-memory type (bool is `uchar` in buffers)."""
    if isinstance(dt, PtrDType):
      space = {AddrSpace.GLOBAL: "__global ", AddrSpace.LOCAL: "__local ", AddrSpace.REG: ""}[dt.addrspace]
      return f"{space}{self.render_dtype(dt.base, mem=dt.addrspace is AddrSpace.GLOBAL)}*"
    sc = dt.scalar()
    if self.half_storage_only and sc == dtypes.float16:  # half values (and REG/LOCAL arrays) are float; in global
      if mem: return "ushort" if dt.count == 1 else f"ushort{dt.count}"  # memory, its bits as ushort
      return "float" if dt.count == 1 else f"float{dt.count}"
    if (nm := INVERSE_DTYPES_DICT.get(sc.name)) not in _CL_TYPES:
      raise TypeError(f"OpenCL renderer has no type for {sc}; valid: {', '.join(_CL_TYPES)}")
    base = "uchar" if mem and sc == dtypes.bool else _CL_TYPES[nm]
    if dt.count == 1: return base
    if dt.count not in _VEC_SIZES: raise TypeError(f"OpenCL has no {dt.count}-wide vectors; valid: {_VEC_SIZES}")
    return f"{base}{dt.count}"

  def render_const(self, x: object, dt: DType) -> str:
    """An OpenCL C literal of value `x` in scalar type `dt`."""
    sc = dt.scalar()
    if dtypes.is_float(sc):
      fx = round_float(float(x), sc)  # type: ignore[arg-type]
      if math.isnan(fx): ret = "NAN"
      elif math.isinf(fx): ret = ("-" if fx < 0 else "") + "INFINITY"
      else: ret = f"{fx!r}" + ("f" if sc != dtypes.float64 else "")
      if self.half_storage_only and sc == dtypes.float16: return ret + "f" if ret[-1].isdigit() else ret
      return f"(({self.render_dtype(sc)}){ret})" if sc != dtypes.float32 else ret
    if sc == dtypes.bool: return "true" if x else "false"
    xi = int(x)  # type: ignore[call-overload,unused-ignore]
    if sc == dtypes.int64: return f"{xi}L" if xi != -2**63 else "(-9223372036854775807L-1)"
    if sc == dtypes.uint64: return f"{xi}uL"
    if sc == dtypes.uint32: return f"{xi}u"
    if sc == dtypes.int32: return str(xi) if xi != -2**31 else "(-2147483647-1)"
    return f"(({self.render_dtype(sc)}){xi})"

  def render_cast(self, x: str, src: DType, dst: DType) -> str:
    """A conversion; float -> int follows tiny_uop.dtype.float_to_int (x86's results): through int32 (uint32: long),
    uint64 through long below 2**63. `x` is a variable when it is repeated (see `_multi_use`)."""
    if dst.count > 1: return f"convert_{self.render_dtype(dst)}({x})"
    t = self.render_dtype(dst)
    if dtypes.is_float(src) and dtypes.is_int(dst):
      if dst == dtypes.uint64:  # 2**64 and above (inf): 0
        return f"(({x})>=18446744073709551616.0?0ul:(({x})>=9223372036854775808.0?(ulong)({x}):(ulong)(long)({x})))"
      if dst.itemsize <= 4: return f"(({t})({'long' if dst == dtypes.uint32 else 'int'})({x}))"
    return f"(({t})({x}))"

  def _half_val(self, dt: DType) -> bool:
    return self.half_storage_only and not isinstance(dt, PtrDType) and dt.scalar() == dtypes.float16

  def _half_mem(self, idx: UOp) -> bool:
    """An INDEX into a global half buffer while half is storage-only (its bits are converted by `_h2f`/`_f2h`)."""
    if not self.half_storage_only or idx.op is not Ops.INDEX: return False
    p = idx.src[0].dtype
    return isinstance(p, PtrDType) and not isinstance(p, ImageDType) and p.addrspace is AddrSpace.GLOBAL and \
      p.base.scalar() == dtypes.float16

  def _round_half(self, expr: str, dt: DType) -> str:
    """`expr` (float math) rounded to the nearest half, as half arithmetic would give (float has enough bits that
    + - * / sqrt round once)."""
    if dt.count != 1: raise NotImplementedError(f"OpenCL storage-only half: no vector half math ({dt})")
    return f"_rh({expr})"

  def render(self, uops: list[UOp]) -> str:
    """OpenCL C source of the kernel `uops` (ending in a SINK whose arg is a KernelInfo carrying the name)."""
    name = getattr(uops[-1].arg, "name", "kernel")
    params, dvars = kernel_params(uops)
    stored = {u.src[0].src[0] for u in uops if u.op is Ops.STORE and u.src[0].op is Ops.INDEX}
    args = [f"{'write_only' if p in stored else 'read_only'} image2d_t data{p.arg}" if isinstance(p.dtype, ImageDType)
            else f"{self.render_dtype(p.dtype)} restrict data{p.arg}" for p in params]
    args += var_args(dvars, "const int")
    images: dict[UOp, tuple[str, str]] = {}  # image INDEX -> (image, int2 coordinate)
    w = CWriter(self.render_dtype)
    r, gates = w.r, w.gates
    uses = count_uses(uops, _multi_use)  # repeated operands must be variables
    scalars = {u.dtype.scalar() for u in uops} | {u.dtype.base.scalar() for u in uops if isinstance(u.dtype, PtrDType)}
    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      s = SourceExprs(r, u)
      if op is Ops.INDEX and isinstance(src[0].dtype, ImageDType):
        if src[1].dtype != dtypes.int32.vec(2): raise TypeError(f"image INDEX needs an int2 (x, y), got {src[1].dtype}")
        images[u] = (s[0], s[1])
        if len(src) > 2: gates[u] = s[2]
      elif w.common(u, s): continue
      elif op is Ops.SPECIAL:
        if u.arg[:4] not in ("gidx", "lidx"): raise NotImplementedError(f"OpenCL renderer has no index {u.arg!r}")
        r[u] = u.arg
        w.emit(f"int {u.arg} = get_{'group' if u.arg[0] == 'g' else 'local'}_id({u.arg[4:]}); /* {s[0]} */")
      elif op is Ops.CONST: r[u] = self.render_const(u.arg, dt)
      elif op is Ops.VCONST:
        r[u] = f"(({self.render_dtype(dt)})({','.join(self.render_const(x, dt) for x in u.arg)}))"
      elif op in (Ops.DEFINE_REG, Ops.DEFINE_LOCAL):
        assert isinstance(dt, PtrDType)
        r[u] = w.fresh("acc" if op is Ops.DEFINE_REG else "temp")
        base = self.render_dtype(dt.base, mem=not (self.half_storage_only and dt.base.scalar() == dtypes.float16))
        w.emit(f"{'__local ' if op is Ops.DEFINE_LOCAL else ''}{base} {r[u]}[{dt.size}];")
      elif op is Ops.BARRIER: w.emit("barrier(CLK_LOCAL_MEM_FENCE);")
      elif op is Ops.LOAD and src[0] in images:
        img, coord = images[src[0]]
        suf = "h" if src[0].src[0].dtype.base == dtypes.float16 else "f"
        ld = f"read_image{suf}({img}, smp, {coord})"
        if src[0] in gates: ld = f"({gates[src[0]]}?{ld}:({self.render_dtype(dt)})(0))"
        w.assign(u, ld, self.render_dtype(dt), "val")
      elif op is Ops.STORE and src[0] in images:
        img, coord = images[src[0]]
        suf = "h" if src[0].src[0].dtype.base == dtypes.float16 else "f"
        w.store(src[0], f"write_image{suf}({img}, {coord}, {s[1]});")
      elif op is Ops.LOAD and self._half_mem(src[0]):
        if dt.count != 1: raise NotImplementedError(f"OpenCL storage-only half: no vector load of {dt}")
        ld = f"_h2f(*{s[0]})"
        if src[0] in gates: ld = f"({gates[src[0]]}?{ld}:0.0f)"
        w.assign(u, ld, "float", "val")
      elif op is Ops.STORE and self._half_mem(src[0]):
        if src[1].dtype.count != 1: raise NotImplementedError(f"OpenCL storage-only half: no vector store of {dt}")
        w.store(src[0], f"*{s[0]} = _f2h({s[1]});")
      elif op is Ops.LOAD:
        ptr = s[0] if dt.count == 1 else f"(({self.render_dtype(src[0].dtype).replace('*', '')}{dt.count}*){s[0]})"
        ld = f"(*{ptr})"
        if dt.scalar() == dtypes.bool: ld = f"({ld}!=0)"
        zero = self.render_const(0, dt) if dt.count == 1 else f"({self.render_dtype(dt)})(0)"
        if src[0] in gates: ld = f"({gates[src[0]]}?{ld}:{zero})"
        w.assign(u, ld, self.render_dtype(dt), "val")
      elif op is Ops.STORE:
        vdt = src[1].dtype
        ptr = s[0] if vdt.count == 1 else f"(({self.render_dtype(src[0].dtype).replace('*', '')}{vdt.count}*){s[0]})"
        w.store(src[0], f"*{ptr} = {s[1]};")
      elif op is Ops.CAST:
        expr = self.render_cast(s[0], src[0].dtype, dt)
        if self._half_val(dt): expr = self._round_half(f"({self.render_dtype(dt)})({s[0]})", dt)
        w.assign(u, expr, self.render_dtype(dt), "cast", uses.get(u, 0) == 1)
      elif op is Ops.BITCAST and (self._half_val(dt) or self._half_val(src[0].dtype)):
        if dt.count != 1:
          raise NotImplementedError(f"OpenCL storage-only half: no vector bitcast {src[0].dtype} -> {dt}")
        if self._half_val(dt):  # the 16 bits, as a half; cast first: ushort|ushort (C's promotion) is an int
          w.assign(u, f"_h2f(as_ushort((ushort)({s[0]})))", "float", "cast")
        else: w.assign(u, f"as_{self.render_dtype(dt)}(_f2h({s[0]}))", self.render_dtype(dt), "cast")  # exact: a half
      elif op is Ops.BITCAST:  # the operand cast to its own type first: C's promotion makes ushort+ushort an int
        w.assign(u, f"as_{self.render_dtype(dt)}(({self.render_dtype(src[0].dtype)})({s[0]}))", self.render_dtype(dt),
                 "cast")
      elif op is Ops.VECTORIZE: w.assign(u, f"({self.render_dtype(dt)})({','.join(s)})", self.render_dtype(dt), "vec")
      elif op is Ops.GEP and dt.count > 1:  # the expander's strided loads are CPU-only (vectorize_upcast)
        raise NotImplementedError(f"OpenCL renderer has no shuffle of lanes {u.arg} (GEP to {dt})")
      elif op is Ops.GEP: r[u] = f"{s[0]}.s{u.arg[0] if isinstance(u.arg, tuple) else u.arg:x}"
      elif op is Ops.WMMA: raise NotImplementedError("OpenCL renderer has no tensor cores (WMMA)")
      elif op in self.code_for_op:
        sdt = src[-1].dtype if op is Ops.WHERE else src[0].dtype
        expr = self.code_for_op[op](s, sdt)
        if self._half_val(dt) and op not in (Ops.WHERE, Ops.MAX, Ops.NEG): expr = self._round_half(expr, dt)
        w.assign(u, expr, self.render_dtype(dt), "alu", uses.get(u, 0) == 1)  # used once: written where used
      else: raise NotImplementedError(f"OpenCL renderer can't render {op} ({dt}); supported ALU ops: "
                                      f"{', '.join(o.name for o in self.code_for_op)}")
    prefix = "#pragma OPENCL FP_CONTRACT OFF\n"  # IEEE in source order, like the CPU renderers (no a*b+c -> fma)
    if dtypes.float16 in scalars and not self.half_storage_only:
      prefix += "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
    if dtypes.float16 in scalars and self.half_storage_only: prefix += _ROUND_HALF
    if dtypes.float64 in scalars: prefix += "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    if any(u.op is Ops.LOAD and u.src[0] in images for u in uops):
      prefix += "__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;\n"
    for p in params:  # what a runtime needs to make each image param from its buffer (see IMAGE_LINE)
      if isinstance(p.dtype, ImageDType): prefix += f"/* image data{p.arg} {p.dtype.shape[0]}x{p.dtype.shape[1]} */\n"
    return f"{prefix}__kernel void {name}({', '.join(args)}) {{\n" + "\n".join(w.lines) + "\n}\n"


class OpenCLHalfStorageRenderer(OpenCLRenderer):
  """OpenCL C for devices without `cl_khr_fp16` (PoCL on CPUs): half buffers are `ushort` bits converted with
  integer/float ALU helpers (`_h2f`, `_f2h`: IEEE binary16, round to nearest even), and half math runs in float, each
  result rounded to half (as half arithmetic gives: float has the bits for + - * / sqrt to round once). Vector half
  loads/stores aren't supported here (lowering makes scalar ones)."""
  half_storage_only = True


class QCOMRenderer(OpenCLRenderer):
  """OpenCL C for Adreno GPUs (the `QCOM` device, whose OpenCL compiler builds it): `OpenCLRenderer`, except that with
  images on, an image's rows are a multiple of 4 RGBA float texels (64 bytes: the a6xx texture descriptor's pitch
  alignment, so the QCOM runtime can describe the buffer itself as the image)."""
  device = "QCOM"

  @property
  def extra_matcher(self) -> Any:
    """The image params pass with 64-byte aligned rows while images are on."""
    return pm_images_pitch64 if self.images else None


class QCOMHalfStorageRenderer(QCOMRenderer):
  """`QCOMRenderer` for an OpenCL compiler without `cl_khr_fp16` (MOCK+QCOM executes on PoCL): half in memory only,
  as `OpenCLHalfStorageRenderer`."""
  half_storage_only = True


IMAGE_LINE = re.compile(r"^/\* image data(\d+) (\d+)x(\d+) \*/$", re.M)


def image_params_of_source(src: str) -> dict[int, tuple[int, int, int]]:
  """PARAM slot -> (h, w, 4) of the image params of rendered OpenCL C (the `/* image dataN HxW */` lines), for
  runtimes that load a program from its source alone."""
  return {int(m.group(1)): (int(m.group(2)), int(m.group(3)), 4) for m in IMAGE_LINE.finditer(src)}


def image_params_of(uops: list[UOp] | None) -> dict[int, tuple[int, ...]]:
  """PARAM slot -> image shape (h, w, 4) of a lowered kernel's image params (what the runtime must pass as images)."""
  return {u.arg: u.dtype.shape for u in uops or () if u.op is Ops.PARAM and isinstance(u.dtype, ImageDType)}
