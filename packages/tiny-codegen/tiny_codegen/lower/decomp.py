"""Decompositions: rewrite ops and dtypes a target lacks into ones it has.

`pm_gates`: gated INDEX/LOAD/STORE whose gate folded to a constant lose the gate (true) or the access (false: a
LOAD yields 0, a STORE disappears). `pm_decomp`: MULACC -> a*b+c (unfused, exact), BIND -> its DEFINE_VAR.
`bf16_to_float`: bfloat16 through float32 for renderers without bf16 arithmetic: loads and stores move the raw 16 bits
(as uint16), math runs in float32, and float32 -> bfloat16 rounds to nearest even (NaN stays NaN).
"""
from __future__ import annotations

from tiny_uop.dtype import PtrDType, dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import GroupOp, Ops, UOp


def _gated_load(idx: UOp, ld: UOp) -> UOp | None:
  if len(idx.src) != 3 or idx.src[2].op is not Ops.CONST: return None
  if idx.src[2].arg: return ld.replace(src=(idx.replace(src=idx.src[:2]), *ld.src[1:]))
  return UOp.const(ld.dtype, 0)  # an invalid read yields 0


def _gated_store(idx: UOp, st: UOp) -> UOp | None:
  if len(idx.src) != 3 or idx.src[2].op is not Ops.CONST: return None
  if idx.src[2].arg: return st.replace(src=(idx.replace(src=idx.src[:2]), *st.src[1:]))
  return UOp(Ops.GROUP)  # never valid: no store


pm_gates = PatternMatcher([
  # end(x, c) -> x: a loop the simplifier folded away (bound 1) needs no END
  (UPat(Ops.END, name="e"), lambda e: e.src[0] if e.src[-1].op is not Ops.RANGE else None),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="ld"), _gated_load),
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="st"), _gated_store),
], name="gates")

pm_decomp = PatternMatcher([
  # mulacc(a, b, c) -> a*b+c
  (UPat(Ops.MULACC, src=(UPat.var("a"), UPat.var("b"), UPat.var("c"))), lambda a, b, c: a * b + c),
  # bind(var, val) -> var: the value comes in as a kernel argument
  (UPat(Ops.BIND, src=(UPat(Ops.DEFINE_VAR, name="v"), UPat())), lambda v: v),
], name="decomp")


# ***** bfloat16 through float32 *****
def _bf16_to_f32(bits: UOp) -> UOp:
  """uint16 bfloat16 bits -> float32 (exact)."""
  return (bits.cast(dtypes.uint32) << 16).bitcast(dtypes.float32)


def _f32_to_bf16(x: UOp) -> UOp:
  """float32 -> uint16 bfloat16 bits, round to nearest even; NaN -> quiet NaN."""
  b = x.bitcast(dtypes.uint32)
  rounded = (b + (((b >> 16) & 1) + 0x7fff)) >> 16
  is_nan = x.ne(x)
  return is_nan.where(UOp.const(dtypes.uint32, 0x7fc0), rounded).cast(dtypes.uint16)


def bf16_to_float(sink: UOp) -> UOp:
  """Every bfloat16 value computed as float32 and stored as uint16 bits (see the module docstring)."""
  subs: dict[UOp, UOp] = {}
  for u in sink.toposort():
    new_src = tuple(subs.get(s, s) for s in u.src)
    nu = u.replace(src=new_src) if new_src != u.src else u
    dt = nu.dtype
    if isinstance(dt, PtrDType) and dt.base == dtypes.bfloat16:
      nu = nu.replace(dtype=dtypes.uint16.ptr(dt.size, dt.addrspace))
    elif u.op is Ops.LOAD and dt == dtypes.bfloat16:
      nu = _bf16_to_f32(nu.replace(dtype=dtypes.uint16))
    elif u.op is Ops.STORE and isinstance(u.src[0].dtype, PtrDType) and u.src[0].dtype.base == dtypes.bfloat16:
      nu = nu.replace(src=(nu.src[0], _f32_to_bf16(nu.src[1]), *nu.src[2:]))
    elif u.op is Ops.CONST and dt == dtypes.bfloat16:
      nu = UOp.const(dtypes.float32, u.arg)
    elif u.op is Ops.CAST and dt == dtypes.bfloat16:  # rounding to bf16 precision, kept in float32
      nu = _bf16_to_f32(_f32_to_bf16(nu.src[0].cast(dtypes.float32)))
    elif u.op is Ops.BITCAST and dt == dtypes.bfloat16:
      nu = _bf16_to_f32(nu.src[0].bitcast(dtypes.uint16))
    elif u.op is Ops.BITCAST and u.src[0].dtype == dtypes.bfloat16:
      nu = _f32_to_bf16(nu.src[0]).bitcast(dt)
    elif (u.op in GroupOp.ALU or u.op is Ops.CAST) and dt.scalar() == dtypes.bfloat16:
      nu = nu.replace(dtype=dtypes.float32)
    if nu is not u: subs[u] = nu
  return subs.get(sink, sink)
