"""PTX renderer (`PTXRenderer`): linear UOps -> NVIDIA PTX assembly for sm_70 and newer (device NV/CUDA).

The kernel is `.visible .entry name(.param .u64 data0, ..., .param .s32 var_<name>, ...)`: buffer pointers by PARAM
slot, then DEFINE_VARs in name order, `<name>` as `var_ident` spells it (docs/PIPELINE.md §4, GPU-style).
`SPECIAL` gidx{i} is `%ctaid.{x,y,z}`, lidx{i} `%tid.{x,y,z}`; launch `spec.global_size` blocks of
`spec.local_size` threads.

Values live in virtual registers: `%p` predicates (bool), `%rs` 16 bits (int8/int16/half; 8-bit values are kept
sign/zero-extended in 16 bits), `%r` 32-bit ints, `%f` float, `%rd` 64-bit ints and addresses, `%fd` double. A
vector value is a list of scalar registers (`ld.global.v4.f32 {..}` when a LOAD/STORE is a vector). Constants are
moved into registers in the prologue (so loops that run zero times can't leave them unset). Accumulators
(DEFINE_REG, scalar or vector elements) are registers; DEFINE_LOCAL is a `.shared` array addressed with 32-bit
offsets; BARRIER is `bar.sync 0`.
Gated loads are predicated (`@%p ld`) after zeroing the destination; gated stores are predicated.

Arithmetic is IEEE with explicit rounding (`add.rn`, `mul.rn`: never contracted into FMA, like the CPU renderers),
`div.rn`, `sqrt.rn`, `rcp.rn`. Where PTX differs from tiny_uop.alu's reference semantics the renderer adds the
fix-ups: float MAX propagates NaN with max(-0, +0) = +0, float CMOD (PTX has no fmod) is lowered to
`tiny_codegen.lower.decomp.exact_fmod` (`exact_fmod = False`), float -> int casts wrap as x86 does instead of
saturating. EXP2/LOG2 on float32 use the SFU (`ex2.approx.f32`, `lg2.approx.f32`: about 2 ulp); half computes them
in float32; double and SIN use tiny's polynomial decompositions (`lower/transcendental.py`).
bfloat16 goes through float32 (so bf16 WMMA fragments are uint16 bits). Tensor cores: `mma.sync.aligned.m16n8k16`
(half/bf16 in, float out) on sm_80+ and `m16n8k8` (half) on sm_75, declared in `tensor_cores`; a WMMA UOp renders to
one `mma.sync`. `gpu_math_matcher` (shared with the LLVM-based GPU renderers) folds `acc + WMMA(a, b, 0)` into
`WMMA(a, b, acc)`, so the TC opt's accumulator is the mma's C operand.
"""
from __future__ import annotations

import math
from typing import Any
import struct

from tiny_uop.device import Renderer, TensorCore
from tiny_uop.dtype import AddrSpace, DType, PtrDType, dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import Ops, UOp

from tiny_codegen.compiler.ptx import PTXCompiler
from tiny_codegen.lower import transcendental
from tiny_codegen.renderer import ValueNames, kernel_params, var_ident

# dtype -> (PTX instruction type, register class)
_TYPES: dict[DType, tuple[str, str]] = {
  dtypes.bool: ("pred", "p"), dtypes.int8: ("s16", "rs"), dtypes.uint8: ("u16", "rs"), dtypes.int16: ("s16", "rs"),
  dtypes.uint16: ("u16", "rs"), dtypes.int32: ("s32", "r"), dtypes.uint32: ("u32", "r"), dtypes.int64: ("s64", "rd"),
  dtypes.uint64: ("u64", "rd"), dtypes.float16: ("f16", "rs"), dtypes.float32: ("f32", "f"),
  dtypes.float64: ("f64", "fd"),
}
_REG_DECL = {"p": "pred", "rs": "b16", "r": "b32", "f": "f32", "rd": "b64", "fd": "f64"}
# in-memory type of a scalar for ld/st
_MEM = {dtypes.bool: "u8", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.float16: "b16"}
# the oldest PTX ISA version that knows each target (PTX ISA "Release Notes"); m16n8k8 mma needs 6.5
_PTX_VERSION = {70: "6.0", 72: "6.1", 75: "6.5", 80: "7.0", 86: "7.1", 87: "7.4", 89: "7.8", 90: "7.8", 100: "8.6",
                101: "8.6", 103: "8.8", 110: "9.0", 120: "8.7", 121: "8.8"}


def ptx_type(dt: DType) -> str:
  """The PTX instruction type of scalar `dt` (`f32`, `s32`, `pred`, ...)."""
  if (t := _TYPES.get(dt.scalar())) is None:
    raise TypeError(f"PTX renderer has no type for {dt.scalar()}; valid: {', '.join(d.name for d in _TYPES)}")
  return t[0]


def _bits(dt: DType) -> int: return 16 if dt.itemsize == 1 else dt.itemsize * 8


def ptx_imm(x: object, dt: DType) -> str:
  """A PTX immediate of value `x` in scalar `dt` (floats as exact hex: `0f3F800000`, `0d...`; half as bits)."""
  sc = dt.scalar()
  if sc == dtypes.bool: return "1" if x else "0"
  if dtypes.is_int(sc):
    v = int(x)  # type: ignore[call-overload]
    return str(v & ((1 << _bits(sc)) - 1)) if dtypes.is_unsigned(sc) else str(v)
  fx = float(x)  # type: ignore[arg-type]
  if sc == dtypes.float16:
    try: return f"0x{struct.unpack('<H', struct.pack('<e', fx))[0]:04X}"
    except OverflowError: return "0xFC00" if fx < 0 else "0x7C00"
  if sc == dtypes.float32:
    if math.isnan(fx): return "0f7FC00000"
    try: return f"0f{struct.unpack('<I', struct.pack('<f', fx))[0]:08X}"
    except OverflowError: return "0fFF800000" if fx < 0 else "0f7F800000"
  return f"0d{struct.unpack('<Q', struct.pack('<d', fx))[0]:016X}"


def _decomp_f64(u: UOp) -> UOp | None:
  """EXP2/LOG2 on double: the SFU only has float32, so use tiny's float64 polynomials."""
  if u.dtype != dtypes.float64: return None
  return (transcendental.exp2 if u.op is Ops.EXP2 else transcendental.log2)(u.src[0])


def _pow(u: UOp) -> UOp: return (u.src[1] * u.src[0].log2()).exp2()  # pow(a, b) = exp2(b*log2(a)) for a > 0


def _is_zero(u: UOp) -> bool:
  if u.op is Ops.CONST: return u.arg == 0
  return u.op is Ops.VECTORIZE and all(s.op is Ops.CONST and s.arg == 0 for s in u.src)


def _wmma_acc(u: UOp) -> UOp | None:
  """acc + WMMA(a, b, 0) -> WMMA(a, b, acc): the tensor core adds the accumulator itself (the TC opt's vector REDUCE
  over the outer k lowers to that ADD)."""
  for x, w in (u.src, u.src[::-1]):
    if w.op is Ops.WMMA and _is_zero(w.src[2]) and x.dtype == w.dtype: return w.replace(src=(*w.src[:2], x))
  return None


gpu_math_matcher = PatternMatcher([
  (UPat((Ops.EXP2, Ops.LOG2), name="u"), _decomp_f64),
  (UPat(Ops.POW, name="u"), _pow),
  (UPat(Ops.ADD, name="u"), _wmma_acc),
], name="gpu_math")


def _sm(arch: str) -> int:
  try: return int(arch.removeprefix("sm_").rstrip("a"))
  except ValueError:
    raise ValueError(f"PTX arch {arch!r} is not an sm_XX name; valid e.g. sm_75, sm_80, sm_86, sm_89, sm_90") from None


class NVRenderer(Renderer):
  """What every renderer for NVIDIA GPUs shares: the hardware's grid/block/shared-memory limits and the GPU math
  rules (PTX here, NVPTX through LLVM)."""
  device = "NV"
  has_local = True
  has_shared = True
  supports_float4 = True
  global_max = (0x7FFFFFFF, 65535, 65535)
  local_max = (1024, 1024, 64)
  shared_max = 49152
  bf16_through_float = True
  transcendental_via_f64 = False
  exact_fmod = False  # PTX has no fmod instruction; `rem` is integer only
  extra_matcher = gpu_math_matcher


class PTXRenderer(NVRenderer):
  """PTX for NVIDIA GPUs (arch `sm_XX`, default sm_90); see the module docstring."""
  decompose_ops = (Ops.SIN,)
  compiler_cls = PTXCompiler

  def __init__(self, arch: str = ""):
    self.sm = _sm(arch or "sm_90")
    if self.sm < 70: raise ValueError(f"PTX arch {arch!r} is older than sm_70; valid: sm_70 and newer")
    arch = arch or "sm_90"
    if self.sm >= 80:
      self.tensor_cores = [TensorCore((8, 16, 16), dt, dtypes.float32, 32, (8, 4, 4), ("mma.m16n8k16",))
                           for dt in (dtypes.float16, dtypes.bfloat16)]
    elif self.sm >= 75:
      self.tensor_cores = [TensorCore((8, 16, 8), dtypes.float16, dtypes.float32, 32, (4, 2, 4), ("mma.m16n8k8",))]
    else: self.tensor_cores = []
    super().__init__(arch)

  def make_compiler(self) -> PTXCompiler: return PTXCompiler(self.arch or "sm_90")

  def supported_dtypes(self) -> tuple[DType, ...]: return tuple(_TYPES)

  @property
  def ptx_version(self) -> str: return _PTX_VERSION.get(self.sm, "7.8" if self.sm < 100 else "9.0")

  def render(self, uops: list[UOp]) -> str:
    """PTX of the kernel `uops` (ending in a SINK whose arg is a KernelInfo carrying the name)."""
    return _PTXEmitter(self, uops).render()


class _PTXEmitter:
  def __init__(self, ren: PTXRenderer, uops: list[UOp]):
    self.ren, self.uops = ren, uops
    self.counts: dict[str, int] = {}
    self.r: dict[UOp, list[str]] = ValueNames()  # a missing value is a RenderError naming the UOp
    self.addr: dict[UOp, tuple[str, Any, str | None]] = {}  # INDEX -> (state space, address register(s), gate)
    self.lines: list[str] = []
    self.prologue: list[str] = []
    self.shared: list[str] = []
    self.labels = 0

  def reg(self, cls: str) -> str:
    n = self.counts.get(cls, 0)
    self.counts[cls] = n + 1
    return f"%{cls}{n}"

  def sreg(self, dt: DType) -> str: return self.reg(_TYPES[dt.scalar()][1])
  def emit(self, line: str) -> None: self.lines.append("\t" + line)

  def label(self, prefix: str) -> str:
    self.labels += 1
    return f"$L_{prefix}{self.labels}"

  # ***** ALU *****
  def to_f32(self, x: str) -> str:
    out = self.reg("f")
    self.emit(f"cvt.f32.f16 {out}, {x};")
    return out

  def from_f32(self, x: str) -> str:
    out = self.reg("rs")
    self.emit(f"cvt.rn.f16.f32 {out}, {x};")
    return out

  def alu(self, op: Ops, dt: DType, sdt: DType, a: list[str]) -> str:
    """One scalar ALU op: result dtype `dt`, operand dtype `sdt` (the value operands' dtype)."""
    t = ptx_type(sdt)
    sc = sdt.scalar()
    isf, isb = dtypes.is_float(sc), sc == dtypes.bool
    if sc == dtypes.float16 and op in (Ops.FDIV, Ops.RECIPROCAL, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.SIN, Ops.TRUNC):
      res = self.alu(op, dtypes.float32, dtypes.float32, [self.to_f32(x) for x in a])  # half math via float32
      return self.from_f32(res)
    out = self.sreg(dt)
    bt = f"b{_bits(sc)}"
    if op is Ops.WHERE:
      if dt.scalar() == dtypes.bool:
        t1, t2 = self.reg("p"), self.reg("p")
        self.emit(f"and.pred {t1}, {a[0]}, {a[1]};")
        self.emit(f"not.pred {t2}, {a[0]};")
        self.emit(f"and.pred {t2}, {t2}, {a[2]};")
        self.emit(f"or.pred {out}, {t1}, {t2};")
      else: self.emit(f"selp.{'b16' if _bits(sc) == 16 else t} {out}, {a[1]}, {a[2]}, {a[0]};")
      return out
    if isb:
      if op in (Ops.ADD, Ops.OR, Ops.MAX): self.emit(f"or.pred {out}, {a[0]}, {a[1]};")
      elif op in (Ops.MUL, Ops.AND): self.emit(f"and.pred {out}, {a[0]}, {a[1]};")
      elif op in (Ops.XOR, Ops.CMPNE, Ops.SUB): self.emit(f"xor.pred {out}, {a[0]}, {a[1]};")
      elif op is Ops.CMPEQ:
        self.emit(f"xor.pred {out}, {a[0]}, {a[1]};")
        self.emit(f"not.pred {out}, {out};")
      elif op is Ops.CMPLT:  # a < b  <=>  !a & b
        self.emit(f"not.pred {out}, {a[0]};")
        self.emit(f"and.pred {out}, {out}, {a[1]};")
      elif op is Ops.NEG: self.emit(f"not.pred {out}, {a[0]};")
      else: raise NotImplementedError(f"PTX renderer can't render {op} on bool")
      return out
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      cmp = {Ops.CMPLT: "lt", Ops.CMPNE: "neu" if isf else "ne", Ops.CMPEQ: "eq"}[op]
      self.emit(f"setp.{cmp}.{t} {out}, {a[0]}, {a[1]};")
      return out
    sel = "b16" if _bits(sc) == 16 else t
    if op is Ops.MAX:  # ints: (a > b) ? a : b
      p = self.reg("p")
      self.emit(f"setp.gt.{t} {p}, {a[0]}, {a[1]};")
      self.emit(f"selp.{sel} {out}, {a[0]}, {a[1]}, {p};")
      if isf:  # as numpy's maximum: equal values -> a & b (max(-0, +0) = +0), a NaN operand -> NaN (a + b)
        p2, z, n = self.reg("p"), self.sreg(sc), self.sreg(sc)
        self.emit(f"setp.eq.{t} {p2}, {a[0]}, {a[1]};")
        self.emit(f"and.b{_bits(sc)} {z}, {a[0]}, {a[1]};")
        self.emit(f"selp.{sel} {out}, {z}, {out}, {p2};")
        self.emit(f"setp.nan.{t} {p2}, {a[0]}, {a[1]};")
        self.emit(f"add.rn.{t} {n}, {a[0]}, {a[1]};")
        self.emit(f"selp.{sel} {out}, {n}, {out}, {p2};")
      return out
    if isf:
      if op is Ops.ADD: self.emit(f"add.rn.{t} {out}, {a[0]}, {a[1]};")
      elif op is Ops.SUB: self.emit(f"sub.rn.{t} {out}, {a[0]}, {a[1]};")
      elif op is Ops.MUL: self.emit(f"mul.rn.{t} {out}, {a[0]}, {a[1]};")
      elif op is Ops.FDIV: self.emit(f"div.rn.{t} {out}, {a[0]}, {a[1]};")
      elif op is Ops.NEG: self.emit(f"neg.{t} {out}, {a[0]};")
      elif op is Ops.RECIPROCAL: self.emit(f"rcp.rn.{t} {out}, {a[0]};")
      elif op is Ops.SQRT: self.emit(f"sqrt.rn.{t} {out}, {a[0]};")
      elif op is Ops.TRUNC: self.emit(f"cvt.rzi.{t}.{t} {out}, {a[0]};")
      elif op is Ops.EXP2 and sc == dtypes.float32: self.emit(f"ex2.approx.f32 {out}, {a[0]};")
      elif op is Ops.LOG2 and sc == dtypes.float32: self.emit(f"lg2.approx.f32 {out}, {a[0]};")
      elif op is Ops.MULACC: self.emit(f"fma.rn.{t} {out}, {a[0]}, {a[1]}, {a[2]};")
      else: raise NotImplementedError(f"PTX renderer can't render {op} on {sc}")
      return out
    if op in (Ops.SHL, Ops.SHR):
      amt = a[1]
      if _bits(sc) != 32:  # the shift amount is always a u32 operand
        amt = self.reg("r")
        self.emit(f"cvt.u32.{t} {amt}, {a[1]};")
      inst = "shl.b" + str(_bits(sc)) if op is Ops.SHL else f"shr.{t}"
      self.emit(f"{inst} {out}, {a[0]}, {amt};")
    elif op in (Ops.AND, Ops.OR, Ops.XOR): self.emit(f"{op.name.lower()}.{bt} {out}, {a[0]}, {a[1]};")
    elif op in (Ops.ADD, Ops.SUB): self.emit(f"{op.name.lower()}.{t} {out}, {a[0]}, {a[1]};")
    elif op is Ops.MUL: self.emit(f"mul.lo.{t} {out}, {a[0]}, {a[1]};")
    elif op is Ops.CDIV: self.emit(f"div.{t} {out}, {a[0]}, {a[1]};")
    elif op is Ops.CMOD: self.emit(f"rem.{t} {out}, {a[0]}, {a[1]};")
    elif op is Ops.NEG: self.emit(f"neg.{t} {out}, {a[0]};")
    elif op is Ops.MULACC: self.emit(f"mad.lo.{t} {out}, {a[0]}, {a[1]}, {a[2]};")
    else: raise NotImplementedError(f"PTX renderer can't render {op} on {sc}")
    if sc.itemsize == 1:  # keep 8-bit values extended in their 16-bit register (wraps like the 8-bit type)
      self.emit(f"cvt.{t}.{t[0]}8 {out}, {out};")
    return out

  def cast(self, x: str, src: DType, dst: DType) -> str:
    s, d = src.scalar(), dst.scalar()
    if s == d: return x
    out = self.sreg(d)
    ts, td = ptx_type(s), ptx_type(d)
    if d == dtypes.bool:
      self.emit(f"setp.{'neu' if dtypes.is_float(s) else 'ne'}.{ts} {out}, {x}, {ptx_imm(0, s)};")
    elif s == dtypes.bool:
      self.emit(f"selp.{'b16' if _bits(d) == 16 else td} {out}, {ptx_imm(1, d)}, {ptx_imm(0, d)}, {x};")
    elif dtypes.is_float(s) and dtypes.is_float(d):
      self.emit(f"cvt{'.rn' if d.itemsize < s.itemsize else ''}.{td}.{ts} {out}, {x};")
    elif dtypes.is_float(s): return self.float_to_int(x, s, d)
    elif dtypes.is_float(d): self.emit(f"cvt.rn.{td}.{ts} {out}, {x};")
    elif d.itemsize == 1: self.emit(f"cvt.{td}.{td[0]}8 {out}, {x};" if s.itemsize <= 2 else
                                     f"cvt.{td[0]}8.{ts} {out}, {x};")
    elif _bits(d) == _bits(s): self.emit(f"mov.b{_bits(d)} {out}, {x};")
    else: self.emit(f"cvt.{td}.{ts} {out}, {x};")
    return out

  def float_to_int(self, x: str, s: DType, d: DType) -> str:
    """float -> int as tiny_uop.dtype.float_to_int (x86's results): truncate through int32 (uint32 and 64-bit types:
    int64), an out-of-range value or NaN becoming the intermediate's minimum, then wrap; uint64 values >= 2**63 convert
    unsigned. (PTX's cvt alone would saturate.)"""
    ts = ptx_type(s)
    bits = 63 if d.itemsize == 8 or d == dtypes.uint32 else 31
    it = "s64" if bits == 63 else "s32"
    mid, p, q = self.reg("rd" if bits == 63 else "r"), self.reg("p"), self.reg("p")
    self.emit(f"cvt.rzi.{it}.{ts} {mid}, {x};")
    self.emit(f"setp.gt.{ts} {p}, {x}, {ptx_imm(-(2.0 ** bits) - 1.0, s)};")  # both false for NaN
    self.emit(f"setp.lt.{ts} {q}, {x}, {ptx_imm(2.0 ** bits, s)};")
    self.emit(f"and.pred {p}, {p}, {q};")
    self.emit(f"selp.{it} {mid}, {mid}, {-(1 << bits)}, {p};")
    if d == dtypes.uint64:
      big, hi = self.reg("rd"), self.reg("p")
      self.emit(f"cvt.rzi.u64.{ts} {big}, {x};")
      self.emit(f"setp.lt.{ts} {q}, {x}, {ptx_imm(2.0 ** 64, s)};")  # 2**64 and above (inf): 0
      self.emit(f"selp.b64 {big}, {big}, 0, {q};")
      self.emit(f"setp.ge.{ts} {hi}, {x}, {ptx_imm(2.0 ** 63, s)};")
      self.emit(f"selp.b64 {mid}, {big}, {mid}, {hi};")
    return self.cast(mid, dtypes.int64 if bits == 63 else dtypes.int32, d)

  # ***** memory *****
  def index(self, u: UOp) -> None:
    buf, idx = u.src[0], u.src[1]
    gate = self.r[u.src[2]][0] if len(u.src) > 2 else None
    pdt = buf.dtype
    assert isinstance(pdt, PtrDType)
    size = pdt.base.scalar().itemsize
    if pdt.addrspace is AddrSpace.REG:
      if idx.op is not Ops.CONST: raise NotImplementedError("PTX renderer: accumulators need constant indices")
      n = pdt.base.count  # a vector accumulator element is `n` registers
      self.addr[u] = ("reg", self.r[buf][int(idx.arg) * n:(int(idx.arg) + 1) * n], gate)
      return
    i = self.r[idx][0]
    if pdt.addrspace is AddrSpace.LOCAL:
      out = self.reg("r")
      self.emit(f"mad.lo.s32 {out}, {i}, {size}, {self.r[buf][0]};")
      self.addr[u] = ("shared", out, gate)
      return
    off, out = self.reg("rd"), self.reg("rd")
    if idx.dtype.itemsize == 8: self.emit(f"mul.lo.s64 {off}, {i}, {size};")
    else: self.emit(f"mul.wide.s32 {off}, {i}, {size};")
    self.emit(f"add.s64 {out}, {self.r[buf][0]}, {off};")
    self.addr[u] = ("global", out, gate)

  def load(self, u: UOp) -> None:
    space, addr, gate = self.addr[u.src[0]]
    dt = u.dtype
    if space == "reg":
      self.r[u] = [self.sreg(dt.scalar()) for _ in addr]
      for out, a in zip(self.r[u], addr):
        self.emit(f"mov.{'pred' if dt == dtypes.bool else 'b' + str(_bits(dt.scalar()))} {out}, {a};")
      return
    sc = dt.scalar()
    outs = [self.sreg(sc) for _ in range(dt.count)]
    dsts = [self.reg("rs") for _ in outs] if sc == dtypes.bool else outs
    pre = ""
    if gate is not None:
      zero = ptx_imm(0, sc) if sc != dtypes.bool else "0"
      for o in dsts: self.emit(f"mov.b{16 if sc == dtypes.bool else _bits(sc)} {o}, {zero};")
      pre = f"@{gate} "
    vec = f".v{dt.count}" if dt.count > 1 else ""
    dst = "{" + ", ".join(dsts) + "}" if dt.count > 1 else dsts[0]
    self.emit(f"{pre}ld.{space}{vec}.{_MEM.get(sc, ptx_type(sc))} {dst}, [{addr}];")
    if sc == dtypes.bool:
      for o, d in zip(outs, dsts): self.emit(f"setp.ne.u16 {o}, {d}, 0;")
    self.r[u] = outs

  def store(self, u: UOp) -> None:
    space, addr, gate = self.addr[u.src[0]]
    val, vdt = self.r[u.src[1]], u.src[1].dtype
    pre = f"@{gate} " if gate is not None else ""
    if space == "reg":
      for a, v in zip(addr, val if len(val) == len(addr) else val * len(addr)):
        self.emit(f"{pre}mov.{'pred' if vdt == dtypes.bool else 'b' + str(_bits(vdt.scalar()))} {a}, {v};")
      return
    sc = vdt.scalar()
    if sc == dtypes.bool:
      conv = [self.reg("rs") for _ in val]
      for c, v in zip(conv, val): self.emit(f"selp.b16 {c}, 1, 0, {v};")
      val = conv
    vec = f".v{vdt.count}" if vdt.count > 1 else ""
    src = "{" + ", ".join(val) + "}" if vdt.count > 1 else val[0]
    self.emit(f"{pre}st.{space}{vec}.{_MEM.get(sc, ptx_type(sc))} [{addr}], {src};")

  def wmma(self, u: UOp) -> None:
    """WMMA(a, b, c): one warp-wide `mma.sync` (A row-major, B column-major); see the module docstring."""
    a, b, c = (self.r[s] for s in u.src)
    din = u.src[0].dtype.scalar()
    if din not in (dtypes.float16, dtypes.uint16) or u.dtype.scalar() != dtypes.float32:
      raise NotImplementedError(f"PTX WMMA supports half/bf16 inputs with float accumulators, got {u.src[0].dtype}")
    k = 16 if len(a) == 8 else 8
    if (len(a), len(b), len(c)) not in ((8, 4, 4), (4, 2, 4)):
      raise ValueError(f"PTX WMMA operands must be 8/4/4 (m16n8k16) or 4/2/4 (m16n8k8) wide, "
                       f"got {len(a)}/{len(b)}/{len(c)}")
    tin = "f16" if din == dtypes.float16 else "bf16"  # bf16 fragments arrive as their uint16 bits

    def pack(regs: list[str]) -> list[str]:
      out = []
      for i in range(0, len(regs), 2):
        p = self.reg("r")
        self.emit(f"mov.b32 {p}, {{{regs[i]}, {regs[i + 1]}}};")
        out.append(p)
      return out

    pa, pb = pack(a), pack(b)
    d = [self.reg("f") for _ in c]
    self.emit(f"mma.sync.aligned.m16n8k{k}.row.col.f32.{tin}.{tin}.f32 {{{', '.join(d)}}}, {{{', '.join(pa)}}}, "
              f"{{{', '.join(pb)}}}, {{{', '.join(c)}}};")
    self.r[u] = d

  # ***** the kernel *****
  def render(self) -> str:
    uops = self.uops
    name = getattr(uops[-1].arg, "name", "kernel")
    params, dvars = kernel_params(uops)
    args = [f"\t.param .u64 data{p.arg}" for p in params]
    seen: set[str] = set()
    for dv in dvars:
      if dv.arg[0] not in seen: args.append(f"\t.param .s32 var_{var_ident(dv.arg[0])}")
      seen.add(dv.arg[0])
    loops: dict[UOp, tuple[str, str]] = {}
    ifs: dict[UOp, str] = {}
    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      if op is Ops.PARAM:
        raw, reg = self.reg("rd"), self.reg("rd")
        self.prologue += [f"\tld.param.u64 {raw}, [data{u.arg}];", f"\tcvta.to.global.u64 {reg}, {raw};"]
        self.r[u] = [reg]
      elif op is Ops.DEFINE_VAR:
        reg = self.reg("r")
        self.prologue.append(f"\tld.param.s32 {reg}, [var_{var_ident(u.arg[0])}];")
        self.r[u] = [reg]
      elif op is Ops.SPECIAL:
        if u.arg[:4] not in ("gidx", "lidx"): raise NotImplementedError(f"PTX renderer has no index {u.arg!r}")
        reg = self.reg("r")
        self.prologue.append(f"\tmov.u32 {reg}, %{'ctaid' if u.arg[0] == 'g' else 'tid'}.{'xyz'[int(u.arg[4:])]};")
        self.r[u] = [reg]
      elif op in (Ops.CONST, Ops.VCONST):
        vals = u.arg if op is Ops.VCONST else (u.arg,) * dt.count
        regs = []
        for v in vals:
          reg = self.sreg(dt)
          sc = dt.scalar()
          if sc == dtypes.bool: self.prologue.append(f"\tsetp.ne.u32 {reg}, {1 if v else 0}, 0;")
          else: self.prologue.append(f"\tmov.{'b16' if _bits(sc) == 16 else ptx_type(sc)} {reg}, {ptx_imm(v, sc)};")
          regs.append(reg)
        self.r[u] = regs
      elif op is Ops.DEFINE_REG:
        assert isinstance(dt, PtrDType)
        self.r[u] = [self.sreg(dt.base.scalar()) for _ in range(dt.size * dt.base.count)]
      elif op is Ops.DEFINE_LOCAL:
        assert isinstance(dt, PtrDType)
        sym = f"temp{len(self.shared)}"
        self.shared.append(f"\t.shared .align 16 .b8 {sym}[{dt.size * dt.base.scalar().itemsize}];")
        reg = self.reg("r")
        self.prologue.append(f"\tmov.u32 {reg}, {sym};")
        self.r[u] = [reg]
      elif op is Ops.RANGE:  # an s32 counter, or s64 in a kernel over more than 2**31-1 elements
        wide = dt == dtypes.int64
        reg, p = self.reg("rd" if wide else "r"), self.reg("p")
        top, done = self.label("loop"), self.label("done")
        loops[u] = (top, done)
        self.emit(f"mov.{'u64' if wide else 'u32'} {reg}, 0;")
        self.lines.append(f"{top}:")
        self.emit(f"setp.ge.{'s64' if wide else 's32'} {p}, {reg}, {self.r[src[0]][0]};")
        self.emit(f"@{p} bra {done};")
        self.r[u] = [reg]
      elif op is Ops.END:
        rng = src[-1]
        top, done = loops[rng]
        self.emit(f"add.{'s64' if rng.dtype == dtypes.int64 else 's32'} {self.r[rng][0]}, {self.r[rng][0]}, 1;")
        self.emit(f"bra {top};")
        self.lines.append(f"{done}:")
      elif op is Ops.IF:
        ifs[u] = self.label("endif")
        self.emit(f"@!{self.r[src[0]][0]} bra {ifs[u]};")
      elif op is Ops.ENDIF: self.lines.append(f"{ifs[src[0]]}:")
      elif op is Ops.BARRIER: self.emit("bar.sync 0;")
      elif op is Ops.INDEX: self.index(u)
      elif op is Ops.LOAD: self.load(u)
      elif op is Ops.STORE: self.store(u)
      elif op in (Ops.GROUP, Ops.SINK, Ops.NOOP): pass
      elif op is Ops.AFTER: self.r[u] = self.r[src[0]]
      elif op is Ops.CAST: self.r[u] = [self.cast(x, src[0].dtype, dt) for x in self.r[src[0]]]
      elif op is Ops.BITCAST:
        if dt.itemsize != src[0].dtype.itemsize:
          raise TypeError(f"BITCAST {src[0].dtype} -> {dt} changes the size")
        out = self.sreg(dt)
        if dt.itemsize == 1:  # 8-bit values live extended in 16-bit registers (no mov.b8): re-extend the low byte as dt
          self.emit(f"cvt.{ptx_type(dt)}.{ptx_type(dt)[0]}8 {out}, {self.r[src[0]][0]};")
        else: self.emit(f"mov.b{dt.itemsize * 8} {out}, {self.r[src[0]][0]};")
        self.r[u] = [out]
      elif op is Ops.VECTORIZE: self.r[u] = [self.r[s][0] for s in src]
      elif op is Ops.GEP:
        idxs = u.arg if isinstance(u.arg, tuple) else (u.arg,)
        self.r[u] = [self.r[src[0]][i] for i in idxs]
      elif op is Ops.WMMA: self.wmma(u)
      elif op in (Ops.WHERE, Ops.NEG, Ops.RECIPROCAL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.MULACC, Ops.ADD,
                  Ops.SUB, Ops.MUL, Ops.FDIV, Ops.CDIV, Ops.CMOD, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR,
                  Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC):
        sdt = src[-1].dtype if op is Ops.WHERE else src[0].dtype
        self.r[u] = [self.alu(op, dt.scalar(), sdt.scalar(), [self.r[s][i if len(self.r[s]) > 1 else 0] for s in src])
                     for i in range(dt.count)]
      else: raise NotImplementedError(f"PTX renderer can't render {op} ({dt})")
    decls = [f"\t.reg .{_REG_DECL[c]} %{c}<{n}>;" for c, n in sorted(self.counts.items())]
    head: list[str] = [f".version {self.ren.ptx_version}", f".target {self.ren.arch or 'sm_90'}", ".address_size 64",
                       "", f".visible .entry {name}(", ",\n".join(args), ")", "{"]
    return "\n".join(head + decls + self.shared + self.prologue + self.lines + ["\tret;", "}", ""])
