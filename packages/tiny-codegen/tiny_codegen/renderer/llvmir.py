"""LLVM IR renderer (`LLVMRenderer`): linear UOps -> textual LLVM IR for the host, compiled in-process by llvmlite.

The kernel is `define void @name(ptr noalias %data0, ..., i32 %var0, ..., i32 %core_id)` (`%core_id` carries its
`range` when the kernel is split across threads). Loops are a header block with a phi, accumulators are `alloca`s
(promoted to registers by the optimizer), gated loads read a safe address and select 0, gated stores branch; an
access gated by a vector of lane masks (the expander's masked tail) is an `llvm.masked.load`/`llvm.masked.store`,
which touches no memory in a masked-off lane; so is a plain vector access of an odd lane count (14 floats) where the
target masks in one instruction (`odd_lanes`: AVX-512), of the next form's lanes under a constant mask. No fast-math
flags: results match IEEE evaluation in source order.
Transcendentals are LLVM intrinsics (`llvm.exp2.f32`, ...), which become libm calls the loader resolves.
"""
from __future__ import annotations

import functools
import math
import struct
from typing import Any

from tiny_uop.dtype import ConstType, DType, PtrDType, dtypes, round_float
from tiny_uop.helpers import CHECK_OOB
from tiny_uop.uop import AXIS_LETTER, Ops, UOp

from tiny_codegen.compiler.llvm import LLVMCompiler
from tiny_codegen.machine import Machine, host_machine
from tiny_codegen.renderer import (CPURenderer, RenderError, ValueNames, kernel_params, lane_accumulator_loops,
                                   nontemporal_store, oob_checks, var_ident)

_INTR = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc", Ops.POW: "pow"}
_ALU_OPS = {*_INTR, Ops.WHERE, Ops.NEG, Ops.RECIPROCAL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.MULACC, Ops.ADD,
            Ops.LDEXP, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.CDIV, Ops.CMOD, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR}
_FLOAT_ORDER = {dtypes.float16: 0, dtypes.bfloat16: 0, dtypes.float32: 1, dtypes.float64: 2}


def _core_id_range(uops: list[UOp]) -> str:
  """The `range(i32 0, n)` parameter attribute (LangRef: Parameter Attributes) of `%core_id` in a kernel split over n
  threads: the runtime calls it with core_id in [0, n) only (PIPELINE.md §4). Without it an index such as
  `core_id*2048 + i*64 + k` may wrap in i32 as far as LLVM knows, so the 16 lanes `+ 0 .. + 15` of an unrolled
  reduce are not provably contiguous after widening to 64 bits and the vectorizers load them with a gather (a
  per-channel sum over (N, H, W) ran ~10x slower split across two threads than on one)."""
  for u in uops:
    if u.op is Ops.SPECIAL and u.arg == "core_id" and u.src[0].op is Ops.CONST and int(u.src[0].arg) >= 1:
      return f" range(i32 0, {int(u.src[0].arg)})"
  return ""


def ltype(dt: DType, mem: bool = False) -> str:
  """The LLVM type of `dt`; `mem` gives the in-memory type (bool is i8 in memory, i1 in registers)."""
  if isinstance(dt, PtrDType): return "ptr"
  sc = dt.scalar()
  if sc == dtypes.bool: base = "i8" if mem else "i1"
  elif dtypes.is_int(sc): base = f"i{sc.itemsize * 8}"
  elif sc == dtypes.float16: base = "half"
  elif sc == dtypes.bfloat16: base = "bfloat"
  elif sc == dtypes.float32: base = "float"
  elif sc == dtypes.float64: base = "double"
  elif sc == dtypes.void: base = "void"
  else: raise TypeError(f"LLVM renderer has no type for {sc}; valid: bool, ints, half, float, double")
  return base if dt.count == 1 else f"<{dt.count} x {base}>"


def _mangle(dt: DType, mem: bool = False) -> str:
  """The overloaded-intrinsic suffix of type `dt` (`mem`: as stored, bools as i8): f32, v16f32, v8i32, v16i8, ..."""
  sc = ltype(dt.scalar(), mem=mem)
  return (f"v{dt.count}" if dt.count > 1 else "") + {"half": "f16", "float": "f32", "double": "f64",
                                                      "bfloat": "bf16"}.get(sc, sc)


def lconst(x: object, dt: DType) -> str:
  """An LLVM literal of value `x` in scalar type `dt` (floats as exact hex)."""
  sc = dt.scalar()
  if sc == dtypes.bool: return "true" if x else "false"
  if dtypes.is_int(sc): return str(int(x))  # type: ignore[call-overload]
  fx = float(x)  # type: ignore[arg-type]
  if sc == dtypes.float16:
    try: bits = struct.unpack("<H", struct.pack("<e", fx))[0]
    except OverflowError: bits = 0xfc00 if fx < 0 else 0x7c00
    return f"0xH{bits:04X}"
  if sc == dtypes.float32:
    if not math.isnan(fx) and not math.isinf(fx):
      try: fx = struct.unpack("<f", struct.pack("<f", fx))[0]
      except OverflowError: fx = math.copysign(math.inf, fx)
    if math.isnan(fx): return "0x7FF8000000000000"
  return f"0x{struct.unpack('<Q', struct.pack('<d', fx))[0]:016X}"


class LLVMRenderer(CPURenderer):
  """LLVM IR for the host CPU; see the module docstring."""
  compiler_cls = LLVMCompiler
  bf16_through_float = True
  vectorize_upcast = True  # the expander turns one UPCAST axis per store into native vectors
  decompose_ops = (Ops.EXP2, Ops.LOG2)
  """tiny's polynomials (lower/transcendental.py, <= 1 ulp in float32) instead of libm: decomposed before the
  expander, they vectorize with the kernel, where LLVM calls libm's scalar exp2f once per lane of a vector (no vector
  math library is linked). 16M float32 on the 2-core znver4: exp 19.2 -> 7.7-8.0 ms (numpy 13.5), log 17.7 -> 12-13
  (12.3), sigmoid 21.2 -> 8-15 (numpy 44). SIN stays libm's: it is accurate at any argument (a float32 cos(3e38)),
  our reduction only below ~1e7 even through float64."""
  transcendental_via_f64 = False
  fused_mulacc = True  # llvm.fma: every x86-64 with FMA3 and AArch64 has it in one instruction

  def make_compiler(self) -> LLVMCompiler: return LLVMCompiler()

  @property
  def ldexp_ops(self) -> tuple[DType, ...]:
    """The dtypes LDEXP renders for (as `vscalefps`, `scalef_lanes`), which the exp2 decomposition then scales
    with (lower/transcendental.py): float32 on AVX-512 targets, none elsewhere. A property of the compiler's
    target, as `vector_registers`."""
    return (dtypes.float32,) if scalef_lanes(getattr(self.compiler, "triple", ""),
                                             getattr(self.compiler, "features", "")) else ()

  @property
  def machine(self) -> Machine:
    """The machine model the CPU heuristics derive their blocking from (`tiny_codegen.machine.host_machine`: this
    host's caches and vector registers, `TINY_MACHINE` overrides applied). A property, not an instance setting, so
    BEAM's cache key (the renderer's instance settings and the compiler's identity) is unchanged."""
    return host_machine()

  @property
  def vector_registers(self) -> tuple[int, int]:
    """(how many vector registers, bytes each) for the heuristics' register blocking, from the machine model
    (`machine`), never more than the compiler's target has (`_vector_registers` of its triple and features: what the
    code is compiled for); (0, 0) when unknown."""
    m = self.machine
    target = _vector_registers(getattr(self.compiler, "triple", ""), getattr(self.compiler, "features", ""))
    if not m.vector_registers or not m.vector_bytes: return target
    if not target[0]: return m.vector_registers, m.vector_bytes
    return min(m.vector_registers, target[0]), min(m.vector_bytes, target[1])

  def supported_dtypes(self) -> tuple[DType, ...]:
    return tuple(d for d in dtypes.all if d not in (dtypes.bfloat16, *dtypes.fp8s))

  def render(self, uops: list[UOp]) -> str:
    """LLVM IR of the kernel `uops` (ending in a SINK whose arg is a KernelInfo carrying the name)."""
    return _LLVMEmitter(uops, contract=True, check_oob=bool(CHECK_OOB.value), stream=self, loop_hints=True,
                        fence_int_to_float=True, vector_bits=8 * self.vector_registers[1],
                        range_max=range_widths(getattr(self.compiler, "triple", ""),
                                               getattr(self.compiler, "features", "")),
                        masked_widths=masked_widths(getattr(self.compiler, "triple", ""),
                                                    getattr(self.compiler, "features", ""))).render()


@functools.cache
def _vector_registers(triple: str, features: str) -> tuple[int, int]:
  """(count, bytes) of the vector registers LLVM's target has: x86-64: 32 zmm of 64 bytes with AVX-512F, else 16 ymm
  of 32 with AVX, else 16 xmm of 16 (Intel SDM vol. 1, the AVX-512 and AVX register chapters); AArch64: 32 V
  registers of 16 bytes (Arm ARM, the SIMD&FP register file); (0, 0) for others."""
  feats = set(features.split(","))
  if triple.startswith(("x86_64", "amd64")):
    if "+avx512f" in feats: return 32, 64
    return (16, 32) if "+avx" in feats else (16, 16)
  if triple.startswith(("aarch64", "arm64")): return 32, 16
  return 0, 0


RANGE_MAX_SIGNED = 0b0101
"""`vrangeps`/`vrangepd`'s imm8 for IEEE maximum (Intel SDM vol. 2, VRANGEPS): bits 1:0 = 01, the larger value;
bits 3:2 = 01, the sign from the comparison, so of -0 and +0 it is +0. It is IEEE maxNum, though: a quiet NaN operand
loses to the other (measured on Zen 4: range(1, NaN) = 1), so MAX's float contract (NaN propagates, as numpy's
maximum and `llvm.maximum`) takes a NaN select after it (`fcmp uno` and a masked add: three vector ops a max). x86
lowers `llvm.maximum` as vmaxps (which returns its second operand when either is NaN, and for two zeros) plus sign
blends and the NaN select: six (a 3x3 max pool's nine taps are most of its work)."""


@functools.cache
def _avx512_widths(triple: str, features: str, base: str) -> tuple[int, ...]:
  """The vector bit widths of an AVX-512 instruction family whose 512-bit form needs feature `base` (e.g.
  "+avx512dq"): with AVX512VL also the 128- and 256-bit forms; () off x86-64 or without `base`."""
  feats = set(features.split(","))
  if not triple.startswith(("x86_64", "amd64")) or base not in feats: return ()
  return (128, 256, 512) if "+avx512vl" in feats else (512,)


def range_widths(triple: str, features: str) -> tuple[int, ...]:
  """The vector bit widths `vrangeps`/`vrangepd` exist in on LLVM's target: AVX512DQ has the 512-bit form, with
  AVX512VL also the 128- and 256-bit ones; () off x86-64 or without AVX512DQ (MAX stays `llvm.maximum`)."""
  return _avx512_widths(triple, features, "+avx512dq")


@functools.cache
def scalef_lanes(triple: str, features: str) -> int:
  """The float32 lanes of the widest `vscalefps` on LLVM's target (Intel SDM vol. 2, VSCALEFPS: AVX512F has the
  512-bit form, AVX512VL the 128- and 256-bit ones, which `scalef_of` then needs for a narrower vector): 16 with
  both, 0 otherwise (off x86-64, or no LDEXP: the exp2 decomposition keeps its exponent-bit arithmetic)."""
  feats = set(features.split(","))
  return 16 if triple.startswith(("x86_64", "amd64")) and {"+avx512f", "+avx512vl"} <= feats else 0


@functools.cache
def masked_widths(triple: str, features: str) -> tuple[int, ...]:
  """The vector bit widths in which a load or store of 32- or 64-bit elements under a lane mask is one instruction
  on LLVM's target (Intel SDM vol. 2, MOVUPS/VMOVDQU32 with an opmask: AVX512F's 512-bit form, AVX512VL's 128- and
  256-bit ones); () off x86-64 or without AVX512F. A vector of a lane count that is not a power of two is accessed in
  the narrowest of them as one masked access (`odd_lanes`), where LLVM splits a plain one into power-of-two pieces."""
  return _avx512_widths(triple, features, "+avx512f")


def odd_lanes(widths: tuple[int, ...], dt: DType) -> int:
  """The lanes of the narrowest masked access (`widths`, bits: `masked_widths`) that holds the vector `dt` when `dt`
  has 3 or more lanes, not a power of two, of 4- or 8-byte elements; 0 otherwise (it stays a plain load or store).
  LLVM legalizes a plain 14-lane float32 load as 8 + 4 + 2 lanes (three loads, two inserts) and a 14-lane store as
  three stores and two extracts; one zero-masking `vmovups` of 16 lanes reads the same 14 and touches nothing past
  them (a depthwise conv's 56-wide row as 4 x 14 lanes: each unpadded tap and each store)."""
  n, size = dt.count, dt.scalar().itemsize
  if n < 3 or n & (n - 1) == 0 or size not in (4, 8) or dt.scalar() == dtypes.bool: return 0
  return next((w // (8 * size) for w in widths if w // (8 * size) > n), 0)


def _in_memory(idx: UOp) -> bool:
  """Whether INDEX `idx` addresses a kernel's buffer (a PARAM), not a register accumulator (a DEFINE_REG's `alloca`,
  which the optimizer promotes to registers only while every access to it is a plain load or store)."""
  return idx.op is Ops.INDEX and idx.src[0].op is Ops.PARAM


def range_lanes(widths: tuple[int, ...], dt: DType) -> int:
  """The lanes of the narrowest `vrange` form (`widths`, bits) that holds the float32/float64 vector `dt`; 0 when
  none does (a scalar, a wider vector, another dtype, or no form on the target)."""
  if dt.count < 2 or dt.scalar() not in (dtypes.float32, dtypes.float64): return 0
  return next((lanes for w in widths if (lanes := w // (8 * dt.scalar().itemsize)) >= dt.count), 0)


def no_signed_wrap(u: UOp) -> bool:
  """Whether the signed integer ADD/SUB/MUL `u` provably never wraps: the exact results over its sources' value
  ranges (`vmin`/`vmax`, sound with wrapping included) all fit its type. Such an op is rendered `nsw`, which lets
  LLVM see that `sext(i + 1) == sext(i) + 1` in an i32 index: without it, the loads at i, i+1, ... of a buffer
  (a quantized weight's bytes) stay separate scalar loads instead of merging into one vector load."""
  if u.op not in (Ops.ADD, Ops.SUB, Ops.MUL) or len(u.src) != 2: return False
  dt = u.dtype.scalar()
  if not dtypes.is_int(dt) or dtypes.is_unsigned(dt) or dt == dtypes.bool: return False
  (a0, a1), (b0, b1) = ((s.vmin, s.vmax) for s in u.src)
  ends: tuple[ConstType, ...]
  if u.op is Ops.ADD: ends = (a0 + b0, a1 + b1)
  elif u.op is Ops.SUB: ends = (a0 - b1, a1 - b0)
  else: ends = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
  return dtypes.min(dt) <= min(ends) and max(ends) <= dtypes.max(dt)


def accumulations(uops: list[UOp]) -> set[UOp]:
  """The float ADDs that sum into a register accumulator (a reduce's update: acc + (p0 + p1 + ...)) and the MULs
  feeding them: the products-and-sums LLVM may fuse into FMAs (`contract`). Only reductions, whose summation order is
  unspecified anyway; elementwise a*b+c keeps its two roundings."""
  out: set[UOp] = set()
  for u in uops:
    if u.op is not Ops.STORE or u.src[0].op is not Ops.INDEX or u.src[0].src[0].op is not Ops.DEFINE_REG: continue
    stack = [u.src[1]]
    while stack:
      x = stack.pop()
      if x in out or not dtypes.is_float(x.dtype) or x.op not in (Ops.ADD, Ops.MUL): continue
      out.add(x)
      if x.op is Ops.ADD: stack.extend(x.src)
  return out


class _LLVMEmitter:
  def __init__(self, uops: list[UOp], contract: bool = False, check_oob: bool = False, stream: Any = None,
               loop_hints: bool = False, fence_int_to_float: bool = False, vector_bits: int = 0,
               range_max: tuple[int, ...] = (), masked_widths: tuple[int, ...] = ()):
    self.uops = uops
    self.masked_widths = masked_widths  # where an odd-lane plain access is one masked one (`odd_lanes`)
    self.range_max = range_max  # the `vrange` widths a float vector MAX renders as (`range_widths`); (): llvm.maximum
    # the vector width LLVM's loop and SLP vectorizers should use (a function attribute): the machine's registers.
    # LLVM's x86 tuning prefers 256 bits on AVX-512 CPUs (Skylake-X's frequency drop), so a loop it vectorizes
    # itself (an elementwise exp, sigmoid, tanh) ran on half the lanes tiny's own vectors use; 0: LLVM's default
    self.vector_bits = vector_bits
    self.fence_int_to_float = fence_int_to_float  # the host CPU's module: see `cast`
    self.name = getattr(uops[-1].arg, "name", "kernel") if uops else "kernel"
    self.oob = oob_checks(uops) if check_oob else {}
    self.contract = accumulations(uops) if contract else set()
    self.r: dict[UOp, str] = ValueNames()
    self.gates: dict[UOp, str] = {}
    self.masks: dict[UOp, str] = {}  # INDEX -> its vector of lane masks (`masked_index`)
    self.lines: list[str] = []
    self.allocas: list[str] = []
    self.decls: set[str] = set()
    self.n = 0
    self.loops: dict[UOp, int] = {}
    self.stream = stream  # the renderer whose streaming-store rule applies (`nontemporal_store`); None: never stream
    self.streamed = False  # whether any store streamed (the kernel then ends with a fence)
    # `loop_hints` (the host CPU's module, whose metadata this emitter writes): the loops the loop vectorizer must
    # leave alone (`lane_accumulator_loops`); their latches carry !llvm.loop metadata turning it off
    self.no_loop_vectorize = lane_accumulator_loops(uops) if loop_hints else set()
    self.loop_meta: list[int] = []  # the metadata ids of those loops

  def tmp(self) -> str:
    self.n += 1
    return f"%t{self.n}"

  def emit(self, line: str) -> None: self.lines.append("  " + line)

  def val(self, u: UOp) -> str:
    if u.op is Ops.CONST and u.dtype.count > 1:  # a vector of one value (a vector accumulator's identity)
      return "<" + ", ".join([f"{ltype(u.dtype.scalar())} {lconst(u.arg, u.dtype)}"] * u.dtype.count) + ">"
    if u.op is Ops.CONST: return lconst(u.arg, u.dtype)
    if u.op is Ops.VCONST:
      return "<" + ", ".join(f"{ltype(u.dtype.scalar())} {lconst(x, u.dtype)}" for x in u.arg) + ">"
    if not (ret := self.r.get(u)):  # used before it is defined, or an op with no value: never print an empty operand
      what = "an empty" if u in self.r else "no"
      raise RenderError(f"LLVM IR: {u.op.name} {u.dtype} arg={u.arg!r} is used but has {what} value yet: it must be "
                        "rendered before its users (lowering or renderer bug)")
    return ret

  def typed(self, u: UOp) -> str: return f"{ltype(u.dtype)} {self.val(u)}"

  def intrinsic(self, name: str, dt: DType, args: list[str]) -> str:
    t = ltype(dt)
    fn = f"llvm.{name}.{_mangle(dt)}"
    self.decls.add(f"declare {t} @{fn}({', '.join([t] * len(args))})")
    out = self.tmp()
    self.emit(f"{out} = call {t} @{fn}({', '.join(f'{t} {a}' for a in args)})")
    return out

  def range_max_of(self, dt: DType, lanes: int, args: list[str]) -> str:
    """max(a, b) of a float vector as one AVX-512DQ `vrangeps`/`vrangepd` (`range_lanes`): the vector widened to the
    instruction's `lanes` with poison lanes, the range op, the low lanes taken back."""
    n, st = dt.count, ltype(dt.scalar())
    wt, bits = f"<{lanes} x {st}>", lanes * dt.scalar().itemsize * 8
    fn = f"llvm.x86.avx512.mask.range.{'ps' if st == 'float' else 'pd'}.{bits}"
    tail = ", i32 4" if bits == 512 else ""  # the 512-bit form's rounding operand: 4, the current direction
    self.decls.add(f"declare {wt} @{fn}({wt}, {wt}, i32, {wt}, i{max(8, lanes)}{', i32' if tail else ''})")
    args = [self.widen(x, dt, lanes) for x in args]
    rng = self.op(f"call {wt} @{fn}({wt} {args[0]}, {wt} {args[1]}, i32 {RANGE_MAX_SIGNED}, {wt} poison, "
                  f"i{max(8, lanes)} -1{tail})")
    # vrange is maxNum (a quiet NaN operand loses to the other): where either is NaN, a + b (a NaN) instead
    uno, nan = self.op(f"fcmp uno {wt} {args[0]}, {args[1]}"), self.op(f"fadd {wt} {args[0]}, {args[1]}")
    out = self.op(f"select <{lanes} x i1> {uno}, {wt} {nan}, {wt} {rng}")
    return out if n == lanes else self.lanes_of(out, dt.scalar().vec(lanes), 0, n)

  def scalef_of(self, dt: DType, a: str, b: str) -> str:
    """LDEXP(a, b) of float32 (alu.py: a * 2**b, b integer-valued, rounded once) as `vscalefps`: a vector of up to
    16 lanes widened with poison lanes to the narrowest 128/256/512-bit form and the low lanes taken back; a wider
    vector in 16-lane pieces, concatenated; a scalar as `llvm.ldexp` of b converted to int32."""
    n = dt.count
    if n > 16:
      parts = [self.scalef_of(dtypes.float32.vec(min(16, n - i)), *(self.lanes_of(x, dt, i, min(16, n - i))
                                                                     for x in (a, b))) for i in range(0, n, 16)]
      out = parts[0]
      for i, p in zip(range(16, n, 16), parts[1:]):
        out = self.concat(out, dtypes.float32.vec(i), p, dtypes.float32.vec(min(16, n - i)))
      return out
    if n == 1:  # llvm.ldexp: LLVM's loop vectorizer widens it (a target intrinsic it would not), x86 then vscalefps
      self.decls.add("declare float @llvm.ldexp.f32.i32(float, i32)")
      return self.op(f"call float @llvm.ldexp.f32.i32(float {a}, i32 {self.op(f'fptosi float {b} to i32')})")
    lanes = next(w for w in (4, 8, 16) if w >= n)
    wt, fn = f"<{lanes} x float>", f"llvm.x86.avx512.mask.scalef.ps.{lanes * 32}"
    tail = ", i32 4" if lanes == 16 else ""  # the 512-bit form's rounding operand: 4, the current direction
    self.decls.add(f"declare {wt} @{fn}({wt}, {wt}, {wt}, i{max(8, lanes)}{', i32' if tail else ''})")
    a, b = self.widen(a, dt, lanes), self.widen(b, dt, lanes)
    out = self.op(f"call {wt} @{fn}({wt} {a}, {wt} {b}, {wt} poison, i{max(8, lanes)} -1{tail})")
    return out if n == lanes else self.lanes_of(out, dtypes.float32.vec(lanes), 0, n)

  def widen(self, x: str, dt: DType, lanes: int) -> str:
    """The vector x of type dt as `lanes` lanes (at least dt.count), the lanes past dt.count poison."""
    if dt.count == lanes: return x
    idx = "<" + ", ".join([f"i32 {i}" for i in range(dt.count)] + ["i32 poison"] * (lanes - dt.count)) + ">"
    return self.op(f"shufflevector {ltype(dt)} {x}, {ltype(dt)} poison, <{lanes} x i32> {idx}")

  def lanes_of(self, x: str, dt: DType, start: int, n: int) -> str:
    """Lanes start .. start+n-1 of the vector x of type dt, as a vector of n."""
    idx = "<" + ", ".join(f"i32 {i}" for i in range(start, start + n)) + ">"
    return self.op(f"shufflevector {ltype(dt)} {x}, {ltype(dt)} poison, <{n} x i32> {idx}")

  def concat(self, x: str, xt: DType, y: str, yt: DType) -> str:
    """The vector x followed by y (same scalar type)."""
    y = self.widen(y, yt, xt.count)  # shufflevector takes equal widths: y widened with poison lanes first
    idx = "<" + ", ".join(f"i32 {i}" for i in range(xt.count + yt.count)) + ">"
    return self.op(f"shufflevector {ltype(xt)} {x}, {ltype(xt)} {y}, <{xt.count + yt.count} x i32> {idx}")

  def first_lanes(self, n: int, w: int) -> str:
    """The constant mask `<w x i1>` whose first n lanes are on (`odd_lanes`' access), with its type."""
    return f"<{w} x i1> <" + ", ".join(["i1 true"] * n + ["i1 false"] * (w - n)) + ">"

  def splat(self, lit: str, dt: DType) -> str:
    """The literal `lit` of scalar type dt.scalar(), as a vector of dt.count lanes when dt is a vector."""
    return lit if dt.count == 1 else "<" + ", ".join([f"{ltype(dt.scalar())} {lit}"] * dt.count) + ">"

  def op(self, text: str) -> str:
    out = self.tmp()
    self.emit(f"{out} = {text}")
    return out

  def float_to_int(self, x: str, src: DType, dst: DType) -> str:
    """float -> int as tiny_uop.dtype.float_to_int defines it, never an out-of-range fptosi/fptoui (LLVM poison:
    it may narrow the conversion, and AVX-512's vcvttsd2usi gives 2**64-1 where x86's cvttsd2si gives 0x80..0):
    through int32 (uint32, int64: int64) -- an out-of-range value becomes that type's minimum -- then wrapped to
    dst; uint64 converts x >= 2**63 as x - 2**63 (+2**63; out of range: 0)."""
    n, ts = src.count, ltype(src)
    bits = 63 if dst.scalar().itemsize == 8 or dst.scalar() == dtypes.uint32 else 31
    mid = (dtypes.int64 if bits == 63 else dtypes.int32).vec(n)
    tm, tb = ltype(mid), ltype(dtypes.bool.vec(n))

    def c(v: float) -> str: return self.splat(lconst(v, src), src)

    # -2**bits <= v < 2**bits (False for NaN); the bounds are exact powers of 2, or +-inf where the format's range
    # ends first (half): then every finite value is in range and only the infinities are not
    lo_cmp = "oge" if math.isfinite(round_float(2.0 ** bits, src)) else "ogt"

    def in_range(v: str) -> str:
      ge = self.op(f"fcmp {lo_cmp} {ts} {v}, {c(-2.0 ** bits)}")
      lt = self.op(f"fcmp olt {ts} {v}, {c(2.0 ** bits)}")
      return self.op(f"and {tb} {ge}, {lt}")

    def trunc_or(v: str, ok: str, fallback: int) -> str:  # fptosi of v where ok (of 0.0 elsewhere), else fallback
      safe = self.op(f"select {tb} {ok}, {ts} {v}, {ts} {c(0.0)}")
      conv = self.op(f"fptosi {ts} {safe} to {tm}")
      return self.op(f"select {tb} {ok}, {tm} {conv}, {tm} {self.splat(str(fallback), mid)}")
    lo = trunc_or(x, in_range(x), -2 ** bits)
    if dst.scalar() == dtypes.uint64:
      big = self.op(f"fcmp oge {ts} {x}, {c(2.0 ** 63)}")
      xm = self.op(f"fsub {ts} {x}, {c(2.0 ** 63)}")
      hi = trunc_or(xm, self.op(f"and {tb} {big}, {in_range(xm)}"), -2 ** 63)  # + 2**63 below: out of range -> 0
      hi = self.op(f"xor {tm} {hi}, {self.splat(str(-2 ** 63), mid)}")
      return self.op(f"select {tb} {big}, {tm} {hi}, {tm} {lo}")
    return lo if tm == ltype(dst) else self.op(f"trunc {tm} {lo} to {ltype(dst)}")

  def double_to_half(self, x: str, src: DType, dst: DType) -> str:
    """float64 -> float16 rounded once (no `__truncdfhf2` call, which the JIT can't resolve): float64 -> float32
    rounded to odd (truncate, then set the last bit when inexact), then float32 -> float16 to nearest even; float32
    keeps 13 more bits than half, so the two steps round like one."""
    n, ts = src.count, ltype(src)
    tf, ti, tb = ltype(dtypes.float32.vec(n)), ltype(dtypes.int32.vec(n)), ltype(dtypes.bool.vec(n))
    f = self.op(f"fptrunc {ts} {x} to {tf}")
    back = self.op(f"fpext {tf} {f} to {ts}")
    inexact = self.op(f"fcmp one {ts} {back}, {x}")  # NaN: false, kept as it is
    gt = self.op(f"fcmp ogt {ts} {back}, {x}")
    neg = self.op(f"fcmp olt {ts} {x}, {self.splat(lconst(0.0, src), src)}")
    away = self.op(f"and {tb} {inexact}, {self.op(f'xor {tb} {gt}, {neg}')}")  # rounded away from zero: |back| > |x|
    bits = self.op(f"bitcast {tf} {f} to {ti}")
    down = self.op(f"sub {ti} {bits}, {self.op(f'zext {tb} {away} to {ti}')}")  # truncated toward zero
    odd = self.op(f"or {ti} {down}, {self.op(f'zext {tb} {inexact} to {ti}')}")
    return self.op(f"fptrunc {tf} {self.op(f'bitcast {ti} {odd} to {tf}')} to {ltype(dst)}")

  def cast(self, x: str, src: DType, dst: DType) -> str:
    """Value `x` of type `src` converted to `dst` (tiny_uop.alu's CAST semantics; to bool means != 0).

    bool -> float16/32/64 is `select x, 1.0, 0.0`, not `uitofp`: LLVM 22's x86 backend with AVX-512 miscompiles
    `select mask, (uitofp <N x i1> b) / d, 0` when lanes of b are known false and `mask` is a splat ANDed with a
    constant: it drops the constant from the mask (it takes those lanes of the quotient for zero, but 0/0 is NaN), so
    a gated-off lane's NaN leaks into the result. The pattern is what an upcast kernel whose lanes are partly padding
    computes (a max-pool's gradient: `(x == max) / count * grad` with count 0 in the pad lanes; issue #38). The
    select is the same value and no slower (one masked blend instead of a mask-to-int and a convert). An int vector
    -> float (`sitofp`/`uitofp`, same bug: its known-0 lanes) goes through `llvm.arithmetic.fence` on the host CPU
    (`fence_int_to_float`), which the backend doesn't look through and which compiles to nothing."""
    s, d = src.scalar(), dst.scalar()
    ts, td = ltype(src), ltype(dst)
    if ts == td: return x
    if dtypes.is_float(s) and dtypes.is_int(d): return self.float_to_int(x, src, dst)
    if s == dtypes.float64 and d == dtypes.float16: return self.double_to_half(x, src, dst)
    out = self.tmp()
    if d == dtypes.bool:
      if dtypes.is_float(s): self.emit(f"{out} = fcmp une {ts} {x}, zeroinitializer")
      else: self.emit(f"{out} = icmp ne {ts} {x}, zeroinitializer")
    elif s == dtypes.bool and d in _FLOAT_ORDER and d != dtypes.bfloat16:  # see the docstring
      self.emit(f"{out} = select {ts} {x}, {td} {self.splat(lconst(1.0, d), dst)}, {td} zeroinitializer")
    elif s == dtypes.bool: self.emit(f"{out} = {'uitofp' if dtypes.is_float(d) else 'zext'} {ts} {x} to {td}")
    elif dtypes.is_float(s) and dtypes.is_float(d):
      self.emit(f"{out} = {'fpext' if _FLOAT_ORDER[d] > _FLOAT_ORDER[s] else 'fptrunc'} {ts} {x} to {td}")
    elif dtypes.is_float(d):
      self.emit(f"{out} = {'uitofp' if dtypes.is_unsigned(s) else 'sitofp'} {ts} {x} to {td}")
      if self.fence_int_to_float and dst.count > 1 and d in _FLOAT_ORDER and d != dtypes.bfloat16:  # see the docstring
        return self.intrinsic("arithmetic.fence", dst, [out])
    elif d.itemsize < s.itemsize: self.emit(f"{out} = trunc {ts} {x} to {td}")
    else: self.emit(f"{out} = {'zext' if dtypes.is_unsigned(s) else 'sext'} {ts} {x} to {td}")
    return out

  def alu(self, u: UOp) -> str:
    op, src = u.op, u.src
    sdt = src[-1].dtype if op is Ops.WHERE else src[0].dtype
    t = ltype(sdt)
    a = [self.val(s) for s in src]
    isf, isu, isb = dtypes.is_float(sdt), dtypes.is_unsigned(sdt), sdt.scalar() == dtypes.bool
    out = self.tmp()
    if op is Ops.WHERE: self.emit(f"{out} = select {ltype(src[0].dtype)} {a[0]}, {t} {a[1]}, {t} {a[2]}")
    elif op in _INTR: return self.intrinsic(_INTR[op], sdt, a)
    elif op is Ops.NEG:
      if isb: self.emit(f"{out} = xor {t} {a[0]}, {'true' if sdt.count == 1 else 'splat (i1 true)'}")
      elif isf: self.emit(f"{out} = fneg {t} {a[0]}")
      else: self.emit(f"{out} = sub {t} zeroinitializer, {a[0]}")
    elif op is Ops.LDEXP and sdt.scalar() == dtypes.float32: return self.scalef_of(sdt, a[0], a[1])
    elif op is Ops.RECIPROCAL:
      one = f"splat ({ltype(sdt.scalar())} 1.0)" if sdt.count > 1 else "1.0"
      self.emit(f"{out} = fdiv {t} {one}, {a[0]}")
    elif op is Ops.MAX and isf and (lanes := range_lanes(self.range_max, sdt)): return self.range_max_of(sdt, lanes, a)
    elif op is Ops.MAX and isf: return self.intrinsic("maximum", sdt, a)  # NaN propagates, max(-0, +0) = +0
    elif op is Ops.MAX:
      cmp = self.tmp()
      self.emit(f"{cmp} = {'fcmp ogt' if isf else ('icmp ugt' if isu or isb else 'icmp sgt')} {t} {a[0]}, {a[1]}")
      self.emit(f"{out} = select {ltype(dtypes.bool.vec(sdt.count))} {cmp}, {t} {a[0]}, {t} {a[1]}")
    elif op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      if isf: pred = {Ops.CMPLT: "fcmp olt", Ops.CMPNE: "fcmp une", Ops.CMPEQ: "fcmp oeq"}[op]
      else: pred = {Ops.CMPLT: "icmp ult" if isu or isb else "icmp slt", Ops.CMPNE: "icmp ne", Ops.CMPEQ: "icmp eq"}[op]
      self.emit(f"{out} = {pred} {t} {a[0]}, {a[1]}")
    elif op is Ops.MULACC and isf and u.arg == "fma": return self.intrinsic("fma", sdt, a)  # one rounding
    elif op is Ops.MULACC:
      m = self.tmp()
      self.emit(f"{m} = {'fmul' if isf else 'mul'} {t} {a[0]}, {a[1]}")
      self.emit(f"{out} = {'fadd' if isf else 'add'} {t} {m}, {a[2]}")
    else:
      if isf: inst = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv", Ops.CMOD: "frem"}.get(op)
      elif isb:
        inst = {Ops.ADD: "or", Ops.MUL: "and", Ops.SUB: "xor", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}.get(op)
      else:
        inst = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.CDIV: "udiv" if isu else "sdiv",
                Ops.CMOD: "urem" if isu else "srem", Ops.SHL: "shl", Ops.SHR: "lshr" if isu else "ashr",
                Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}.get(op)
      if inst is None: raise NotImplementedError(f"LLVM renderer can't render {op} on {sdt}")
      if isf and u in self.contract: inst += " contract"
      elif no_signed_wrap(u): inst += " nsw"
      self.emit(f"{out} = {inst} {t} {a[0]}, {a[1]}")
    return out

  def align(self, dt: DType) -> str:
    """A vector load/store through a buffer pointer is only element-aligned (the expander's vectors start anywhere)."""
    return f", align {dt.scalar().itemsize}" if dt.count > 1 else ""

  def ptr_ty(self, dt: DType) -> str:
    """The LLVM type of a pointer to `dt` (one address space on the host; GPU targets override this)."""
    return "ptr"

  def loop_or_memory_op(self, u: UOp) -> None:
    """RANGE opens a loop, END closes it; INDEX (gated: a safe index where invalid) and LOAD (gated: 0 where
    invalid) — spelled the same on every LLVM-based target but for the pointer type."""
    op, dt, src = u.op, u.dtype, u.src
    if op is Ops.RANGE:
      i = self.loops[u] = len(self.loops)
      lbl, rv = f"loop{i}", f"%{AXIS_LETTER.get(u.arg[1], 'r')}idx{u.arg[0]}"
      self.r[u] = rv
      self.emit(f"br label %{lbl}.pre")
      self.lines.append(f"{lbl}.pre:")
      self.emit(f"br label %{lbl}.head")
      self.lines.append(f"{lbl}.head:")
      it = ltype(dt)  # i32, or i64 in a kernel over more than 2**31-1 elements
      self.emit(f"{rv} = phi {it} [ 0, %{lbl}.pre ], [ {rv}.next, %{lbl}.latch ]")
      self.emit(f"{rv}.cmp = icmp slt {it} {rv}, {self.val(src[0])}")
      self.emit(f"br i1 {rv}.cmp, label %{lbl}.body, label %{lbl}.exit")
      self.lines.append(f"{lbl}.body:")
    elif op is Ops.END:
      rng = src[-1]
      lbl, rv = f"loop{self.loops[rng]}", self.r[rng]
      self.emit(f"br label %{lbl}.latch")
      self.lines.append(f"{lbl}.latch:")
      self.emit(f"{rv}.next = add nsw {ltype(rng.dtype)} {rv}, 1")
      if rng in self.no_loop_vectorize:  # LangRef: 'llvm.loop.vectorize.enable' metadata
        self.loop_meta.append(k := 2 + len(self.loop_meta))  # !0 is !nontemporal's, !1 the shared property
        self.emit(f"br label %{lbl}.head, !llvm.loop !{k}")
      else: self.emit(f"br label %{lbl}.head")
      self.lines.append(f"{lbl}.exit:")
    elif op is Ops.INDEX:
      idx, it = self.val(src[1]), ltype(src[1].dtype)
      if len(src) > 2 and src[2].dtype.count > 1: return self.masked_index(u, idx, it)
      if u in self.oob: self.bounds_check(u, idx, it)
      if u in self.gates or len(src) > 2:
        if u not in self.gates: self.gates[u] = self.val(src[2])
        safe = self.tmp()
        self.emit(f"{safe} = select i1 {self.gates[u]}, {it} {idx}, {it} 0")
        idx = safe
      out = self.tmp()
      base = src[0].dtype.base if isinstance(src[0].dtype, PtrDType) else dt
      self.emit(f"{out} = getelementptr inbounds {ltype(base, mem=True)}, {self.ptr_ty(src[0].dtype)} "
                f"{self.val(src[0])}, {it} {idx}")
      self.r[u] = out
    elif op is Ops.LOAD:
      out = self.tmp()
      if src[0] in self.masks:  # LangRef: llvm.masked.load (masked-off lanes read no memory, give the passthru 0)
        t, fn = ltype(dt, mem=True), f"llvm.masked.load.{_mangle(dt, mem=True)}.p0"
        self.decls.add(f"declare {t} @{fn}(ptr, i32, <{dt.count} x i1>, {t})")
        self.emit(f"{out} = call {t} @{fn}(ptr {self.val(src[0])}, i32 {dt.scalar().itemsize}, "
                  f"<{dt.count} x i1> {self.masks[src[0]]}, {t} zeroinitializer)")
      elif (w := odd_lanes(self.masked_widths, dt)) and _in_memory(src[0]):  # one masked access, not pieces
        wdt = dt.scalar().vec(w)
        wt, fn = ltype(wdt, mem=True), f"llvm.masked.load.{_mangle(wdt, mem=True)}.p0"
        self.decls.add(f"declare {wt} @{fn}(ptr, i32, <{w} x i1>, {wt})")
        wide = self.op(f"call {wt} @{fn}(ptr {self.val(src[0])}, i32 {dt.scalar().itemsize}, "
                       f"{self.first_lanes(dt.count, w)}, {wt} poison)")
        out = self.lanes_of(wide, wdt, 0, dt.count)
      else:
        self.emit(f"{out} = load {ltype(dt, mem=True)}, {self.ptr_ty(src[0].dtype)} {self.val(src[0])}{self.align(dt)}")
      if dt.scalar() == dtypes.bool:
        b = self.tmp()
        self.emit(f"{b} = icmp ne {ltype(dt, mem=True)} {out}, zeroinitializer")
        out = b
      if src[0] in self.gates:
        g = self.tmp()
        self.emit(f"{g} = select i1 {self.gates[src[0]]}, {ltype(dt)} {out}, {ltype(dt)} zeroinitializer")
        out = g
      self.r[u] = out

  def streaming_store(self, v: str, vdt: DType, ptr_uop: UOp) -> None:
    """A whole-cache-line vector store past the cache (`renderer.nontemporal_store`) when its address is aligned to
    the line at run time (a buffer view can start anywhere), else a plain store: x86 lowers a `!nontemporal` vector
    store without that alignment to scalar streaming stores, and LLVM may assume the `align` it is given."""
    ptr, t, line = self.val(ptr_uop), ltype(vdt, mem=True), vdt.itemsize
    k = self.n = self.n + 1
    low = self.op(f"and i64 {self.op(f'ptrtoint ptr {ptr} to i64')}, {line - 1}")
    self.emit(f"br i1 {self.op(f'icmp eq i64 {low}, 0')}, label %nt{k}.line, label %nt{k}.plain")
    self.lines.append(f"nt{k}.line:")
    self.emit(f"store {t} {v}, ptr {ptr}, align {line}, !nontemporal !0")
    self.emit(f"br label %nt{k}.done")
    self.lines.append(f"nt{k}.plain:")
    self.emit(f"store {t} {v}, ptr {ptr}{self.align(vdt)}")
    self.emit(f"br label %nt{k}.done")
    self.lines.append(f"nt{k}.done:")
    self.streamed = True

  def masked_index(self, u: UOp, idx: str, it: str) -> None:
    """An INDEX whose gate is a vector of n bools (the expander's masked vector access: a symbolic axis's tail,
    PIPELINE.md §3): the address of lane 0, no `inbounds` (lane 0 itself may be masked off) and no safe-index select
    (the LOAD/STORE through it is an `llvm.masked.*` call that touches only the lanes the mask lets through). Under
    CHECK_OOB each lane is checked: a lane the mask lets through outside [0, size) records its access and is masked
    off."""
    src, n = u.src, u.src[2].dtype.count
    mask = self.val(src[2])
    if u in self.oob:
      chk = self.oob[u]
      lanes = self.op(f"add <{n} x {it}> {self.splat_value(idx, it, n)}, <{', '.join(f'{it} {k}' for k in range(n))}>")
      lo = self.op(f"icmp sge <{n} x {it}> {lanes}, zeroinitializer")
      hi = self.op(f"icmp slt <{n} x {it}> {lanes}, {self.splat_value(str(chk.size), it, n)}")
      ok = self.op(f"and <{n} x i1> {lo}, {hi}")
      out = self.op(f"xor <{n} x i1> {ok}, {self.splat_value('true', 'i1', n)}")
      bad_lanes = self.op(f"and <{n} x i1> {mask}, {out}")
      self.decls.add(f"declare i1 @llvm.vector.reduce.or.v{n}i1(<{n} x i1>)")
      bad = self.op(f"call i1 @llvm.vector.reduce.or.v{n}i1(<{n} x i1> {bad_lanes})")
      rec = self.op(f"select i1 {bad}, ptr @{self.name}_oob, ptr @{self.name}_oob_scratch")
      idx64 = idx if it == "i64" else self.op(f"sext {it} {idx} to i64")
      for k, v in enumerate((str(chk.kind), str(chk.slot), idx64, str(chk.size))):
        self.emit(f"store i64 {v}, ptr {self.op(f'getelementptr i64, ptr {rec}, i32 {k}')}")
      mask = self.op(f"and <{n} x i1> {mask}, {ok}")
    self.masks[u] = mask
    base = src[0].dtype.base if isinstance(src[0].dtype, PtrDType) else u.dtype
    self.r[u] = self.op(f"getelementptr {ltype(base, mem=True)}, {self.ptr_ty(src[0].dtype)} {self.val(src[0])}, "
                        f"{it} {idx}")

  def splat_value(self, v: str, t: str, n: int) -> str:
    """A vector of `n` lanes of LLVM type `t`, each the value `v` (a literal or a register)."""
    one = self.op(f"insertelement <{n} x {t}> poison, {t} {v}, i32 0")
    return self.op(f"shufflevector <{n} x {t}> {one}, <{n} x {t}> poison, <{n} x i32> zeroinitializer")

  def bounds_check(self, u: UOp, idx: str, it: str) -> None:
    """CHECK_OOB (see `renderer.OOBCheck`): the access through INDEX `u` happens only where it is in bounds; an
    out-of-bounds one (where its gate is true) writes the kernel's record instead (else a scratch copy of it). `it` is
    the index's LLVM type (i32, or i64 in a kernel indexed in 64 bits)."""
    chk = self.oob[u]
    lo, hi = self.op(f"icmp sge {it} {idx}, 0"), self.op(f"icmp slt {it} {idx}, {chk.size - chk.width + 1}")
    ok = self.op(f"and i1 {lo}, {hi}")
    gate = self.val(u.src[2]) if len(u.src) > 2 else "true"
    bad = self.op(f"and i1 {gate}, {self.op(f'xor i1 {ok}, true')}")
    rec = self.op(f"select i1 {bad}, ptr @{self.name}_oob, ptr @{self.name}_oob_scratch")
    idx64 = idx if it == "i64" else self.op(f"sext {it} {idx} to i64")
    for k, v in enumerate((str(chk.kind), str(chk.slot), idx64, str(chk.size))):
      self.emit(f"store i64 {v}, ptr {self.op(f'getelementptr i64, ptr {rec}, i32 {k}')}")
    self.gates[u] = self.op(f"and i1 {gate}, {ok}")

  def value_op(self, u: UOp) -> bool:
    """Render the ops every LLVM-based target spells the same (casts, vectors, ALU); False if `u` is not one."""
    op, dt, src = u.op, u.dtype, u.src
    if op in (Ops.GROUP, Ops.SINK, Ops.NOOP): return True
    if op is Ops.AFTER: self.r[u] = self.val(src[0])
    elif op is Ops.CAST: self.r[u] = self.cast(self.val(src[0]), src[0].dtype, dt)
    elif op is Ops.BITCAST:
      out = self.tmp()
      self.emit(f"{out} = bitcast {self.typed(src[0])} to {ltype(dt)}")
      self.r[u] = out
    elif op is Ops.VECTORIZE:
      cur = "poison"
      for i, s in enumerate(src):
        nxt = self.tmp()
        self.emit(f"{nxt} = insertelement {ltype(dt)} {cur}, {self.typed(s)}, i32 {i}")
        cur = nxt
      self.r[u] = cur
    elif op is Ops.GEP and dt.count > 1:  # several lanes: a shuffle (the expander's strided load keeps every s-th)
      t, lanes = ltype(src[0].dtype), ", ".join(f"i32 {k}" for k in u.arg)
      self.r[u] = self.op(f"shufflevector {t} {self.val(src[0])}, {t} poison, <{dt.count} x i32> <{lanes}>")
    elif op is Ops.GEP:
      out = self.tmp()
      self.emit(f"{out} = extractelement {self.typed(src[0])}, i32 {u.arg[0] if isinstance(u.arg, tuple) else u.arg}")
      self.r[u] = out
    elif op in _ALU_OPS: self.r[u] = self.alu(u)
    else: return False
    return True

  def render(self) -> str:
    uops = self.uops
    name = getattr(uops[-1].arg, "name", "kernel")
    params, dvars = kernel_params(uops)
    args = [f"ptr noalias %data{p.arg}" for p in params]
    seen: set[str] = set()
    for dv in dvars:
      if dv.arg[0] not in seen: args.append(f"i32 %var.{var_ident(dv.arg[0])}")
      seen.add(dv.arg[0])
    args.append(f"i32{_core_id_range(uops)} %core_id")
    block = "entry"
    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      if op is Ops.PARAM: self.r[u] = f"%data{u.arg}"
      elif op is Ops.DEFINE_VAR: self.r[u] = f"%var.{var_ident(u.arg[0])}"  # prefixed: no clash with temporaries
      elif op is Ops.SPECIAL:
        if u.arg != "core_id": raise NotImplementedError(f"LLVM CPU renderer has no GPU index {u.arg!r}")
        self.r[u] = "%core_id"
      elif op in (Ops.CONST, Ops.VCONST): pass
      elif op is Ops.DEFINE_REG:
        assert isinstance(dt, PtrDType)
        self.r[u] = f"%acc{u.arg}"
        self.allocas.append(f"  %acc{u.arg} = alloca [{dt.size} x {ltype(dt.base, mem=True)}]")
      elif op in (Ops.RANGE, Ops.END, Ops.INDEX, Ops.LOAD): self.loop_or_memory_op(u)
      elif op is Ops.STORE:
        v: str = self.val(src[1])
        vdt = src[1].dtype
        if vdt.scalar() == dtypes.bool:
          z = self.tmp()
          self.emit(f"{z} = zext {ltype(vdt)} {v} to {ltype(vdt, mem=True)}")
          v = z
        if src[0] in self.masks:  # LangRef: llvm.masked.store (masked-off lanes write nothing)
          t, fn = ltype(vdt, mem=True), f"llvm.masked.store.{_mangle(vdt, mem=True)}.p0"
          self.decls.add(f"declare void @{fn}({t}, ptr, i32, <{vdt.count} x i1>)")
          self.emit(f"call void @{fn}({t} {v}, ptr {self.val(src[0])}, i32 {vdt.scalar().itemsize}, "
                    f"<{vdt.count} x i1> {self.masks[src[0]]})")
        elif src[0] in self.gates:
          k = self.n = self.n + 1
          self.emit(f"br i1 {self.gates[src[0]]}, label %st{k}.do, label %st{k}.skip")
          self.lines.append(f"st{k}.do:")
          self.emit(f"store {ltype(vdt, mem=True)} {v}, ptr {self.val(src[0])}{self.align(vdt)}")
          self.emit(f"br label %st{k}.skip")
          self.lines.append(f"st{k}.skip:")
        elif self.stream is not None and nontemporal_store(self.stream, u): self.streaming_store(v, vdt, src[0])
        elif (w := odd_lanes(self.masked_widths, vdt)) and _in_memory(src[0]):  # one masked store (`odd_lanes`)
          wdt = vdt.scalar().vec(w)
          t, fn = ltype(wdt, mem=True), f"llvm.masked.store.{_mangle(wdt, mem=True)}.p0"
          self.decls.add(f"declare void @{fn}({t}, ptr, i32, <{w} x i1>)")
          wide = self.widen(v, vdt, w)
          self.emit(f"call void @{fn}({t} {wide}, ptr {self.val(src[0])}, i32 {vdt.scalar().itemsize}, "
                    f"{self.first_lanes(vdt.count, w)})")
        else: self.emit(f"store {ltype(vdt, mem=True)} {v}, ptr {self.val(src[0])}{self.align(vdt)}")
      elif not self.value_op(u): raise NotImplementedError(f"LLVM renderer can't render {op} ({dt})")
    _ = block
    if self.streamed:  # streaming stores are weakly ordered: drain them before the kernel returns and a thread reads
      self.emit("fence seq_cst")
    body = "\n".join(self.lines)
    decls = "".join(d + "\n" for d in sorted(self.decls))
    if self.oob:  # the CHECK_OOB record the runtime reads after a launch, and the scratch in-bounds accesses write
      decls += f"@{name}_oob = global [4 x i64] zeroinitializer\n@{name}_oob_scratch = internal global [4 x i64] " \
               "zeroinitializer\n"
    meta = "!0 = !{i32 1}\n" if self.streamed else ""  # the !nontemporal marker (LLVM LangRef: `store`)
    if self.loop_meta:
      meta += '!1 = !{!"llvm.loop.vectorize.enable", i1 false}\n'
      meta += "".join(f"!{k} = distinct !{{!{k}, !1}}\n" for k in self.loop_meta)
    attrs = f' "prefer-vector-width"="{self.vector_bits}"' if self.vector_bits else ""
    if attrs: meta += f"attributes #0 = {{ nounwind{attrs} }}\n"
    return (f"{decls}define void @{name}({', '.join(args)}) {'#0' if attrs else 'nounwind'} {{\nentry:\n" +
            "".join(a + "\n" for a in self.allocas) + body + "\n  ret void\n}\n" + meta)
