"""Column implementations of RDNA3 instructions for the batched engine (`batch.py`).

`compile_inst(emu, inst, pc)` turns a decoded instruction into `op(b) -> next pc` (or END / SPLIT) over a `Batch`:
operands are read as whole columns (a VGPR, a scalar as a numpy scalar or repeated per wave), results are written
into the lanes `b.mw` selects. Every implementation here computes what the per-wave handler of `rdna3.Emulator`
computes (the same float rounding, -0, NaN rules; the module docstrings of rdna3.py cite the ISA); what has no column
implementation, or an operand form not handled here, runs through `fallback` (the per-wave handler itself), and
pure per-lane functions of the opcode tables run as `lanemap` (the table's own function, lane by lane).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tiny_runtime_amd.emu import isa as r3
from tiny_runtime_amd.emu.batch import SPLIT, Batch
from tiny_runtime_amd.emu.isa import EXEC_LO, INLINE_F32, LITERAL, M0, MASK32, NULL, SCC_SRC, VCC_HI, VCC_LO
from tiny_runtime_amd.emu.state import Inst

U32, I32, F32, U64, I64, F64 = np.uint32, np.int32, np.float32, np.uint64, np.int64, np.float64
SREGS = frozenset([*range(106), VCC_LO, VCC_HI, M0, EXEC_LO, EXEC_LO + 1])
_QNAN32 = np.uint32(0x7FC00000)


class Slow(Exception):
  """No column implementation for this instruction or operand form: the per-wave fallback runs it."""


Op = Callable[[Batch], int]


COMPILERS: dict[str, Callable[[Any, Inst, int, int], Op]] = {}  # format -> compiler (batch_*; engine imports)


def compiles(*fmts: str) -> Callable[[Callable[[Any, Inst, int, int], Op]], Callable[[Any, Inst, int, int], Op]]:
  """Register a compiler `fn(emu, inst, pc, nxt) -> op` (raising _Slow for forms it leaves to the fallback)."""
  def reg(fn: Callable[[Any, Inst, int, int], Op]) -> Callable[[Any, Inst, int, int], Op]:
    for f in fmts: COMPILERS[f] = fn
    return fn
  return reg


def compile_inst(emu: Any, inst: Inst, pc: int) -> Op:
  """The op that runs `inst` (at byte offset `pc`) on a batch."""
  nxt = pc + inst.size
  comp = COMPILERS.get(inst.fmt)
  if comp is not None and "dpp" not in inst.f:
    try: return comp(emu, inst, pc, nxt)
    except Slow: pass
  return fallback(emu, inst, pc, nxt)


def fallback(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """Run the per-wave interpreter's handler for `inst` on each wave taking part (see Batch.run_per_wave)."""
  if inst.fmt == "SOPP":
    def step(w: Any) -> Any: return emu.sopp(w, inst, nxt)
  else:
    def step(w: Any) -> Any:
      h = emu.dpp if "dpp" in inst.f else getattr(emu, inst.fmt.lower())
      r = h(w, inst)
      return nxt if r is None else r

  def op(b: Batch) -> int:
    res = b.run_per_wave(step, pc)
    first = res[0][1]
    if all(r == first for _, r in res): return first
    npc = np.full(b.N, nxt, np.int64)
    for i, r in res: npc[i] = r
    b.npc = npc
    return SPLIT
  return op


# ***** operands *****
def sconst(code: int, inst: Inst) -> int | None:
  """The value of a scalar operand that is a constant (inline or literal), else None."""
  if code == NULL: return 0
  if 128 <= code <= 192: return code - 128
  if 193 <= code <= 208: return (-(code - 192)) & MASK32
  if code in INLINE_F32: return INLINE_F32[code]
  if code == LITERAL: return inst.literal or 0
  return None


def sreader(code: int, inst: Inst) -> Callable[[Batch], Any]:
  """A 32-bit scalar operand (rdna3.Emulator.sread): an int or per-wave int64 values."""
  c = sconst(code, inst)
  if c is not None: return lambda b: c
  if code in SREGS: return lambda b: b.sval(code)
  if code == SCC_SRC: return lambda b: b.scc
  raise Slow


def sreader64(code: int, inst: Inst) -> Callable[[Batch], Any]:
  """A 64-bit scalar operand (an SGPR pair or an inline integer): an int or uint64 per-wave values."""
  if code < 106 or code in (VCC_LO, EXEC_LO):
    def rd(b: Batch) -> Any:
      lo, hi = b.sval(code), b.sval(code + 1)
      if type(lo) is int and type(hi) is int: return lo | (hi << 32)
      return np.asarray(lo, I64).astype(U64) | (np.asarray(hi, I64).astype(U64) << U64(32))
    return rd
  if 128 <= code <= 208:
    v = code - 128 if code <= 192 else (-(code - 192)) & ((1 << 64) - 1)
    return lambda b: v
  raise Slow


def vreader(code: int, inst: Inst) -> Callable[[Batch], Any]:
  """A 32-bit vector operand as a lane column (uint32), or a numpy uint32 scalar."""
  if code >= 256:
    r = code - 256
    return lambda b: b.V[r]
  c = sconst(code, inst)
  if c is not None:
    u = U32(c)
    return lambda b: u
  s = sreader(code, inst)
  return lambda b: b.lanes_u32(s(b))


def freader(code: int, inst: Inst) -> Callable[[Batch], Any]:
  """A float32 vector operand (the same bits as `vreader`, viewed as float32)."""
  if code >= 256:
    r = code - 256
    return lambda b: b.F[r]
  c = sconst(code, inst)
  if c is not None:
    x = np.array(c, U32).view(F32)[()]
    return lambda b: x
  if code in SREGS:  # an SGPR: a float32 scalar when every wave holds the same value, else its waves' lanes
    def sgpr(b: Batch) -> Any:
      v = b.sval(code)
      return U32(v).view(F32) if type(v) is int else b.lanes_u32(v).view(F32)
    return sgpr
  s = sreader(code, inst)
  return lambda b: np.asarray(b.lanes_u32(s(b))).view(F32)


def modded(rd: Callable[[Batch], Any], absv: int, neg: int) -> Callable[[Batch], Any]:
  """VOP3 |x| / -x on a 32-bit float pattern operand."""
  if not (absv or neg): return rd
  am, nm = U32(0x7FFFFFFF if absv else MASK32), U32(0x80000000 if neg else 0)
  return lambda b: (rd(b) & am) ^ nm


def fview(rd: Callable[[Batch], Any]) -> Callable[[Batch], Any]:
  return lambda b: np.asarray(rd(b)).view(F32)


def put(b: Batch, d: int, res: Any) -> None:
  """Write a uint32 result column (or scalar) into VGPR d's active lanes."""
  if b.mw is True: b.V[d][:] = res
  else: np.copyto(b.V[d], res, where=b.mw, casting="unsafe")


def putf(b: Batch, d: int, res: Any) -> None:
  if b.mw is True: b.F[d][:] = res
  else: np.copyto(b.F[d], res, where=b.mw, casting="unsafe")


# ***** float helpers: exactly the per-wave interpreter's results *****
def fma32(a: Any, b: Any, c: Any) -> np.ndarray:
  """rdna3._fma on float32 columns: a*b (exact in float64) + c, the float64 sum rounded to odd, then to float32."""
  p = np.multiply(a, b, dtype=F64)
  c64 = np.asarray(c, F64)
  s = p + c64
  bb = s - p
  e = (p - (s - bb)) + (c64 - bb)
  bits = s.view(U64)
  fix = (e != 0) & ((bits & U64(1)) == 0) & np.isfinite(s)
  if fix.any():
    up = (e > 0) == (s > 0)
    bits = np.where(fix, np.where(up, bits + U64(1), bits - U64(1)), bits)
    s = bits.view(F64)
  return s.astype(F32)


def _quiet(r: np.ndarray) -> np.ndarray:
  """A NaN passed through float64 comes back quiet: set the quiet bit of NaN lanes."""
  nan = np.isnan(r)
  if nan.any():
    r = r.copy()
    r.view(U32)[nan] |= U32(0x400000)
  return r


def fmin32(a: Any, b: Any) -> np.ndarray:
  """rdna3._fmin: a NaN operand yields the other; -0 < +0."""
  a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
  take_b = np.isnan(a) | (~np.isnan(b) & ((b < a) | ((a == b) & np.signbit(b))))
  return _quiet(np.where(take_b, b, a))


def fmax32(a: Any, b: Any) -> np.ndarray:
  """rdna3._fmax: a NaN operand yields the other; +0 > -0."""
  a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
  take_b = np.isnan(a) | (~np.isnan(b) & ((b > a) | ((a == b) & ~np.signbit(b))))
  return _quiet(np.where(take_b, b, a))


def sqrt32(x: Any) -> np.ndarray:
  """rdna3._sqrt in float32: NaN input or x < 0 gives the canonical quiet NaN."""
  x = np.asarray(x, F32)
  r = np.sqrt(x)
  bad = np.isnan(x) | (x < 0)
  if bad.any(): r = np.where(bad, _QNAN32.view(F32), r)
  return r


_F32_CMP: dict[int, Callable[[Any, Any], Any]] = {
  0x11: np.less, 0x12: np.equal, 0x13: np.less_equal, 0x14: np.greater, 0x15: lambda x, y: (x < y) | (x > y),
  0x16: np.greater_equal, 0x17: lambda x, y: ~(np.isnan(x) | np.isnan(y)), 0x18: lambda x, y: np.isnan(x) | np.isnan(y),
  0x19: lambda x, y: ~(x >= y), 0x1A: lambda x, y: ~((x < y) | (x > y)), 0x1B: lambda x, y: ~(x > y),
  0x1C: lambda x, y: ~(x <= y), 0x1D: lambda x, y: ~(x == y), 0x1E: lambda x, y: ~(x < y)}
_INT_CMP: list[Callable[[Any, Any], Any] | None] = [None, np.less, np.equal, np.less_equal, np.greater, np.not_equal,
                                                     np.greater_equal, None]


def compare32(base: int) -> tuple[Callable[[Any, Any], Any], bool] | None:
  """(predicate on columns, operands are float32) for a 32-bit VOPC compare `base` (op & 0x7F), or None."""
  if 0x10 <= base < 0x20:
    if base in (0x10, 0x1F): return (lambda x, y, t=base == 0x1F: np.full(np.broadcast(x, y).shape, t)), True
    return _F32_CMP[base], True
  if 0x40 <= base < 0x50:
    k = base & 7
    if k in (0, 7): return (lambda x, y, t=k == 7: np.full(np.broadcast(x, y).shape, t)), False
    fn = _INT_CMP[k]
    assert fn is not None
    if base < 0x48: return (lambda x, y, f=fn: f(np.asarray(x).view(I32), np.asarray(y).view(I32))), False
    return fn, False
  return None


# ***** lane maps: a per-lane table function on the active lanes *****
def lanemap(fn: Callable[..., int], srcs: list[Callable[[Batch], Any]], d: int, nxt: int) -> Op:
  """Apply a 32-bit per-lane function (one of rdna3's opcode tables) to the active lanes."""
  def op(b: Batch) -> int:
    act = b.act()
    cols = [_col_list(s(b), act, b) for s in srcs]
    res = list(map(fn, *cols))
    if b.mw is True: b.V[d][:] = np.array(res, dtype=U64).astype(U32)
    else: b.V[d][act] = np.array(res, dtype=U64).astype(U32)
    return nxt
  return op


def vreader64(code: int, inst: Inst, fp: bool) -> Callable[[Batch], Any]:
  """A 64-bit vector operand (rdna3.Emulator.vsrc64): a VGPR pair as a uint64 column, an inline double (fp), a
  literal as the high half of a double (fp), or a 64-bit scalar (an SGPR pair or an inline integer)."""
  if code >= 256:
    r = code - 256
    return lambda b: b.V[r].astype(U64) | (b.V[r + 1].astype(U64) << U64(32))
  if fp and code in r3.INLINE_F64:
    v = U64(r3.INLINE_F64[code])
    return lambda b: v
  if fp and code == LITERAL:
    v = U64((inst.literal or 0) << 32)
    return lambda b: v
  if code == LITERAL or code in INLINE_F32: raise Slow
  s = sreader64(code, inst)

  def rd(b: Batch) -> Any:
    x = s(b)
    return U64(x) if type(x) is int else np.repeat(np.asarray(x).astype(U64), b.W)
  return rd


def lanemap64(fn: Callable[..., int], srcs: list[Callable[[Batch], Any]], d: int, d64: bool, nxt: int) -> Op:
  """Apply a per-lane function of 64-bit operands (the float64 tables) to the active lanes; the result is a VGPR
  pair (d64) or one VGPR."""
  def op(b: Batch) -> int:
    act = b.act()
    cols = [_col_list(s(b), act, b) for s in srcs]
    res = np.array(list(map(fn, *cols)), dtype=U64)
    if d64:
      b.V[d][act] = (res & U64(MASK32)).astype(U32)
      b.V[d + 1][act] = (res >> U64(32)).astype(U32)
    else: b.V[d][act] = res.astype(U32)
    return nxt
  return op


def _col_list(v: Any, act: Any, b: Batch) -> list[int]:
  if isinstance(v, np.ndarray) and v.ndim: return v[act].tolist()
  n = b.L if b.mw is True else len(act)
  return [int(v)] * n


__all__ = ["COMPILERS", "compiles", "compile_inst", "fallback", "Slow", "Op", "sconst", "sreader", "sreader64",
           "vreader", "freader", "modded", "fview", "put", "putf", "fma32", "fmin32", "fmax32", "sqrt32", "compare32",
           "lanemap", "lanemap64", "vreader64", "U32", "I32", "F32", "U64", "I64", "F64", "SREGS"]
