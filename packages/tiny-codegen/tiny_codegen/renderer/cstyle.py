"""C renderer (`ClangRenderer`): linear UOps -> C for clang or gcc, compiled to a shared object.

The kernel is `void name(T0* restrict data0, ..., int var0, ..., int core_id)`. Values become local variables
(`alu3`, `val0`), loops `for (int Lidx0 = 0; ...)`, accumulators `float acc0[1]`. Transcendentals call the
compiler's libm builtins; half is `__fp16` (clang) or `_Float16` (gcc); bfloat16 is lowered through float32.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from tiny_uop.dtype import DType, PtrDType, dtypes, round_float
from tiny_uop.helpers import CHECK_OOB
from tiny_uop.uop import Ops, UOp

from tiny_codegen.compiler.clang import ClangCompiler
from tiny_codegen.renderer import (CPURenderer, CWriter, OOBCheck, SourceExprs, count_uses, kernel_params,
                                   lane_accumulator_loops, oob_checks, var_args)


def _fsuf(dt: DType) -> str: return "f" if dt.scalar() in (dtypes.float32, dtypes.float16, dtypes.bfloat16) else ""


def _math(fn: str) -> Callable[[Sequence[str], DType], str]:
  def render(s: Sequence[str], dt: DType) -> str:
    if dt.scalar() == dtypes.float16: return f"(__builtin_{fn}f((float){s[0]}))"
    return f"__builtin_{fn}{_fsuf(dt)}({s[0]})"
  return render


def _max(s: Sequence[str], dt: DType) -> str:
  if not dtypes.is_float(dt): return f"(({s[0]}>{s[1]})?{s[0]}:{s[1]})"
  # as numpy's maximum: NaN propagates (a+b is NaN), and of two equal zeros +0 wins (-0 + +0 = +0)
  a, b = s
  return f"((({a}!={a})|({b}!={b}))?({a}+{b}):(({a}>{b})?{a}:(({b}>{a})?{b}:(({a}==0)?({a}+{b}):{a}))))"


def _mod(s: Sequence[str], dt: DType) -> str:
  if dtypes.is_float(dt): return f"__builtin_fmod{_fsuf(dt)}({s[0]}, {s[1]})"
  return f"({s[0]}%{s[1]})"


def _neg(s: Sequence[str], dt: DType) -> str: return f"(!{s[0]})" if dt == dtypes.bool else f"(-{s[0]})"


def _pow(s: Sequence[str], dt: DType) -> str:
  if dt.scalar() == dtypes.float16: return f"(__builtin_powf((float){s[0]}, (float){s[1]}))"
  return f"__builtin_pow{_fsuf(dt)}({s[0]}, {s[1]})"


def _shr(s: Sequence[str], dt: DType) -> str: return f"({s[0]}>>{s[1]})"


BASE_CODE: dict[Ops, Callable[[Sequence[str], DType], str]] = {
  Ops.ADD: lambda s, dt: f"({s[0]}+{s[1]})", Ops.SUB: lambda s, dt: f"({s[0]}-{s[1]})",
  Ops.MUL: lambda s, dt: f"({s[0]}*{s[1]})", Ops.FDIV: lambda s, dt: f"({s[0]}/{s[1]})",
  Ops.CDIV: lambda s, dt: f"({s[0]}/{s[1]})", Ops.CMOD: _mod,
  Ops.SHL: lambda s, dt: f"({s[0]}<<{s[1]})", Ops.SHR: _shr,
  Ops.CMPLT: lambda s, dt: f"({s[0]}<{s[1]})", Ops.CMPNE: lambda s, dt: f"({s[0]}!={s[1]})",
  Ops.CMPEQ: lambda s, dt: f"({s[0]}=={s[1]})",
  Ops.AND: lambda s, dt: f"({s[0]}&{s[1]})", Ops.OR: lambda s, dt: f"({s[0]}|{s[1]})",
  Ops.XOR: lambda s, dt: f"({s[0]}^{s[1]})",
  Ops.MAX: _max, Ops.NEG: _neg, Ops.RECIPROCAL: lambda s, dt: f"(1/{s[0]})",
  Ops.WHERE: lambda s, dt: f"({s[0]}?{s[1]}:{s[2]})", Ops.MULACC: lambda s, dt: f"(({s[0]}*{s[1]})+{s[2]})",
  Ops.EXP2: _math("exp2"), Ops.LOG2: _math("log2"), Ops.SIN: _math("sin"), Ops.SQRT: _math("sqrt"),
  Ops.TRUNC: _math("trunc"), Ops.POW: _pow,
}


# values of these types can be written inline: C evaluates them at their own width (narrower ones are promoted to
# int/float, so they must be stored to a variable to round or wrap after every op)
_INLINE_DTYPES = {dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float32, dtypes.float64}


# CAST semantics the C language leaves undefined (tiny_uop.alu defines them), as helpers a kernel includes when used.
# float -> int: through int32 (uint32, int64: int64), an out-of-range value (inf, NaN) becoming that type's minimum,
# then wrapped; uint64: x >= 2**63 as x - 2**63 (+2**63; out of range: 0). double -> half: no `__truncdfhf2` call
# (clang 14 and libgcc disagree on its ABI): double -> float rounded to odd (truncated, last bit set when inexact),
# then float -> half to nearest even; float keeps 13 more bits than half, so the two steps round like one.
_CAST_HELPERS = {
  "tiny_f2i32": "static inline int tiny_f2i32(double x) { return (x >= -0x1p31 && x < 0x1p31) ? (int)x : "
                "(-0x7fffffff-1); }",
  "tiny_f2i64": "static inline long long tiny_f2i64(double x) { return (x >= -0x1p63 && x < 0x1p63) ? (long long)x "
                ": (-0x7fffffffffffffffll-1); }",
  "tiny_f2u64": "static inline unsigned long long tiny_f2u64(double x) { if (x >= 0x1p63) return x - 0x1p63 < 0x1p63 "
                "? (unsigned long long)(long long)(x - 0x1p63) + 0x8000000000000000ull : 0ull; "
                "return (x >= -0x1p63 && x < 0x1p63) ? (unsigned long long)(long long)x : 0x8000000000000000ull; }",
  "tiny_d2f_odd": "static inline float tiny_d2f_odd(double x) { float f = (float)x; if (x == x && (double)f != x) { "
                  "unsigned int u; __builtin_memcpy(&u, &f, 4); u -= (((double)f > x) != (x < 0)); u |= 1u; "
                  "__builtin_memcpy(&f, &u, 4); } return f; }",
}


def _bounds_check(w: CWriter, u: UOp, s: Sequence[str], chk: OOBCheck, name: str) -> None:
  """CHECK_OOB: the access through INDEX `u` happens only where it is in bounds (its gate gets the test); an
  out-of-bounds one (where its gate is true) writes the kernel's record instead."""
  ok = f"({s[1]}>=0&&{s[1]}<={chk.size - chk.width})"
  gate = w.gates.get(u, "1")
  w.emit(f"if ({gate}&&!{ok}) {{ {name}_oob[0]={chk.kind}; {name}_oob[1]={chk.slot}; {name}_oob[2]=(long long)"
         f"({s[1]}); {name}_oob[3]={chk.size}; }}")
  w.gates[u] = f"({gate}&&{ok})"


def _cast_helper(src: DType, dst: DType) -> str | None:
  """The `_CAST_HELPERS` function a CAST from `src` to `dst` goes through, if any."""
  s, d = src.scalar(), dst.scalar()
  if dtypes.is_float(s) and dtypes.is_int(d):
    return "tiny_f2u64" if d == dtypes.uint64 else "tiny_f2i64" if d in (dtypes.int64, dtypes.uint32) else "tiny_f2i32"
  return "tiny_d2f_odd" if s == dtypes.float64 and d == dtypes.float16 else None


class ClangRenderer(CPURenderer):
  """C source for the host CPU (clang preferred, gcc fallback); see the module docstring."""
  code_for_op = BASE_CODE
  compiler_cls = ClangCompiler
  bf16_through_float = True

  def make_compiler(self) -> ClangCompiler: return ClangCompiler()

  @property
  def half_type(self) -> str: return "__fp16" if getattr(self.compiler, "is_clang", True) else "_Float16"

  def supported_dtypes(self) -> tuple[DType, ...]:
    return tuple(d for d in dtypes.all if d not in (dtypes.bfloat16, *dtypes.fp8s))

  def render_dtype(self, dt: DType) -> str:
    """The C type of `dt` (vectors as clang/gcc vector extensions, pointers as `T*`)."""
    if isinstance(dt, PtrDType): return self.render_dtype(dt.base) + "*"
    sc = dt.scalar()
    if sc == dtypes.bool: base = "_Bool"
    elif sc == dtypes.float16: base = self.half_type
    elif sc in dtypes.fp8s or sc == dtypes.bfloat16: raise TypeError(f"C renderer can't hold {sc} values directly")
    elif sc == dtypes.int64: base = "long long"
    elif sc == dtypes.uint64: base = "unsigned long long"
    else: base = sc.name
    return base if dt.count == 1 else f"{base.replace(' ', '_')}{dt.count}"

  def render_const(self, x: object, dt: DType) -> str:
    """A C literal of value `x` in type `dt`; negative ones parenthesized (`a-(-1)`, never `a--1`)."""
    ret = self._const(x, dt)
    return f"({ret})" if ret.startswith("-") else ret

  def _const(self, x: object, dt: DType) -> str:
    sc = dt.scalar()
    if dtypes.is_float(sc):
      fx = round_float(float(x), sc if sc != dtypes.bfloat16 else dtypes.float32)  # type: ignore[arg-type]
      suf = "f" if sc != dtypes.float64 else ""
      if math.isnan(fx): ret = f"__builtin_nan{suf}(\"\")"
      elif math.isinf(fx): ret = ("-" if fx < 0 else "") + f"__builtin_inf{suf}()"
      else: ret = f"{fx!r}{suf}"  # shortest repr: parses back to exactly this value (it is already rounded to dt)
      return f"(({self.render_dtype(sc)}){ret})" if sc == dtypes.float16 else ret
    if sc == dtypes.bool: return "1" if x else "0"
    xi = int(x)  # type: ignore[call-overload,unused-ignore]
    if sc == dtypes.int64: return f"{xi}ll" if xi != -2**63 else "(-9223372036854775807ll-1)"
    if sc == dtypes.uint64: return f"{xi}ull"
    if sc == dtypes.uint32: return f"{xi}u"
    if sc == dtypes.int32 and xi == -2**31: return "(-2147483647-1)"
    return str(xi) if sc in (dtypes.int32,) else f"(({self.render_dtype(sc)}){xi})"

  def render(self, uops: list[UOp]) -> str:
    """C source of the kernel `uops` (ending in a SINK whose arg is a KernelInfo carrying the name)."""
    name = getattr(uops[-1].arg, "name", "kernel")
    params, dvars = kernel_params(uops)
    args = [f"{self.render_dtype(p.dtype)} restrict data{p.arg}" for p in params] + var_args(dvars, "int")
    args.append("int core_id")
    w = CWriter(self.render_dtype)
    if getattr(self.compiler, "is_clang", True): w.no_loop_vectorize = lane_accumulator_loops(uops)  # gcc: no pragma
    r = w.r
    # a BITCAST takes its source's address; MAX writes each operand twice: both need a variable
    uses = count_uses(uops, lambda u: u.op in (Ops.BITCAST, Ops.MAX))
    vecs: list[DType] = []
    helpers: set[str] = set()
    oob = oob_checks(uops) if CHECK_OOB else {}
    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      s = SourceExprs(r, u)
      if dt.count > 1 and not isinstance(dt, PtrDType) and dt not in vecs: vecs.append(dt)
      if op in (Ops.IF, Ops.ENDIF): raise NotImplementedError(f"C renderer has no {op} (CPU kernels have no IFs)")
      if w.common(u, s):
        if u in oob: _bounds_check(w, u, s, oob[u], name)
        continue
      if op is Ops.SPECIAL:
        if u.arg != "core_id": raise NotImplementedError(f"C renderer has no GPU index {u.arg!r}")
        r[u] = "core_id"
      elif op is Ops.CONST: r[u] = self.render_const(u.arg, dt)
      elif op is Ops.VCONST:
        r[u] = f"(({self.render_dtype(dt)}){{{','.join(self.render_const(x, dt) for x in u.arg)}}})"
      elif op is Ops.DEFINE_REG:
        assert isinstance(dt, PtrDType)
        r[u] = w.fresh("acc")
        w.emit(f"{self.render_dtype(dt.base)} {r[u]}[{dt.size}];")
      elif op is Ops.LOAD:
        ld = f"(*{s[0]})"
        if src[0] in w.gates: ld = f"({w.gates[src[0]]}?{ld}:{self.render_const(0, dt)})"
        w.assign(u, ld, self.render_dtype(dt), "val")
      elif op is Ops.STORE: w.store(src[0], f"*{s[0]} = {s[1]};")
      elif op is Ops.CAST:
        if (helper := _cast_helper(src[0].dtype, dt)) is not None:
          helpers.add(helper)
          expr = f"(({self.render_dtype(dt)}){helper}({s[0]}))"
        else: expr = f"(({self.render_dtype(dt)})({s[0]}))"
        w.assign(u, expr, self.render_dtype(dt), "cast", uses.get(u, 0) == 1 and dt in _INLINE_DTYPES)
      elif op is Ops.BITCAST:
        r[u] = w.fresh("cast")
        w.emit(f"{self.render_dtype(dt)} {r[u]}; __builtin_memcpy(&{r[u]}, &{s[0]}, sizeof({r[u]}));")
      elif op is Ops.VECTORIZE: w.assign(u, f"({self.render_dtype(dt)}){{{','.join(s)}}}", self.render_dtype(dt), "vec")
      elif op is Ops.GEP and dt.count > 1:  # the expander's strided loads: LLVM only (vectorize_upcast), never here
        raise NotImplementedError(f"C renderer has no shuffle of lanes {u.arg} (GEP to {dt})")
      elif op is Ops.GEP: r[u] = f"{s[0]}[{u.arg[0] if isinstance(u.arg, tuple) else u.arg}]"
      elif op in self.code_for_op:
        sdt = src[-1].dtype if op is Ops.WHERE else src[0].dtype
        # a value used once is written where it is used
        w.assign(u, self.code_for_op[op](s, sdt), self.render_dtype(dt), "alu",
                 uses.get(u, 0) == 1 and dt in _INLINE_DTYPES)
      else: raise NotImplementedError(f"C renderer can't render {op} ({dt}); supported ALU ops: "
                                      f"{', '.join(o.name for o in self.code_for_op)}")
    typedefs = []
    for vd in vecs:
      sc = self.render_dtype(vd.scalar())
      typedefs.append(f"typedef {sc} {self.render_dtype(vd)} __attribute__((vector_size({vd.itemsize})));")
    prefix = "".join(t + "\n" for t in typedefs)
    prefix += "".join(_CAST_HELPERS[h] + "\n" for h in sorted(helpers))
    if oob: prefix += f"long long {name}_oob[4];\n"  # the CHECK_OOB record (renderer.OOBCheck)
    return f"{prefix}void {name}({', '.join(args)}) {{\n" + "\n".join(w.lines) + "\n}\n"
