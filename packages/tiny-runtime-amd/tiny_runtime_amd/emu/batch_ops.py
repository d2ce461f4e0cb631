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

from tiny_runtime_amd.emu import rdna3 as r3
from tiny_runtime_amd.emu.batch import END, SPLIT, Batch, LaneMask, host_span
from tiny_runtime_amd.emu.rdna3 import (EXEC_LO, INLINE_F32, LITERAL, M0, MASK32, NULL, SCC_SRC, VCC_HI, VCC_LO, Inst,
                                        Memory, UnsupportedInstruction)

U32, I32, F32, U64, I64, F64 = np.uint32, np.int32, np.float32, np.uint64, np.int64, np.float64
_SREGS = frozenset([*range(106), VCC_LO, VCC_HI, M0, EXEC_LO, EXEC_LO + 1])
_QNAN32 = np.uint32(0x7FC00000)


class _Slow(Exception):
  """No column implementation for this instruction or operand form: the per-wave fallback runs it."""


Op = Callable[[Batch], int]


def compile_inst(emu: Any, inst: Inst, pc: int) -> Op:
  """The op that runs `inst` (at byte offset `pc`) on a batch."""
  nxt = pc + inst.size
  comp = _COMPILERS.get(inst.fmt)
  if comp is not None and "dpp" not in inst.f:
    try: return comp(emu, inst, pc, nxt)
    except _Slow: pass
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
  if code in _SREGS: return lambda b: b.sval(code)
  if code == SCC_SRC: return lambda b: b.scc
  raise _Slow


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
  raise _Slow


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


def _col_list(v: Any, act: Any, b: Batch) -> list[int]:
  if isinstance(v, np.ndarray) and v.ndim: return v[act].tolist()
  n = b.L if b.mw is True else len(act)
  return [int(v)] * n


# ***** scalar ALU *****
def _i32(v: Any) -> Any: return ((v & MASK32) ^ 0x80000000) - 0x80000000


def _bit(x: Any) -> Any:
  """A comparison result as SCC: 0/1, or per-wave int64."""
  if isinstance(x, np.ndarray): return x.astype(I64)
  return int(x)


def _any(x: Any) -> bool: return type(x) is not int


def _min(a: Any, b: Any) -> Any: return np.minimum(a, b) if _any(a) or _any(b) else min(a, b)
def _max(a: Any, b: Any) -> Any: return np.maximum(a, b) if _any(a) or _any(b) else max(a, b)
def _where(c: Any, a: Any, b: Any) -> Any: return np.where(c, a, b).astype(I64) if _any(c) else (a if c else b)


def _u64mul_hi(a: Any, b: Any) -> Any:
  if not (_any(a) or _any(b)): return (a * b) >> 32
  return ((np.asarray(a, I64).astype(U64) * np.asarray(b, I64).astype(U64)) >> U64(32)).astype(I64)


# SOP2 op -> (fn(a, b) -> unbounded result, scc(a, b, r) or None: SCC unchanged)
_SOP2: dict[int, tuple[Callable[[Any, Any], Any], Callable[[Any, Any, Any], Any] | None]] = {
  0: (lambda a, b: a + b, lambda a, b, r: r >> 32),
  1: (lambda a, b: a - b, lambda a, b, r: _bit(b > a)),
  2: (lambda a, b: _i32(a) + _i32(b), lambda a, b, r: _bit(r != _i32(r))),
  3: (lambda a, b: _i32(a) - _i32(b), lambda a, b, r: _bit(r != _i32(r))),
  8: (lambda a, b: (a << (b & 31)) & MASK32, lambda a, b, r: _bit(r != 0)),
  10: (lambda a, b: a >> (b & 31), lambda a, b, r: _bit(r != 0)),
  12: (lambda a, b: _i32(a) >> (b & 31), lambda a, b, r: _bit((r & MASK32) != 0)),
  18: (lambda a, b: _min(_i32(a), _i32(b)), lambda a, b, r: _bit(r == _i32(a))),
  19: (_min, lambda a, b, r: _bit(r == a)),
  20: (lambda a, b: _max(_i32(a), _i32(b)), lambda a, b, r: _bit(r == _i32(a))),
  21: (_max, lambda a, b, r: _bit(r == a)),
  22: (lambda a, b: a & b, lambda a, b, r: _bit(r != 0)),
  24: (lambda a, b: a | b, lambda a, b, r: _bit(r != 0)),
  26: (lambda a, b: a ^ b, lambda a, b, r: _bit(r != 0)),
  28: (lambda a, b: ~(a & b) & MASK32, lambda a, b, r: _bit(r != 0)),
  30: (lambda a, b: ~(a | b) & MASK32, lambda a, b, r: _bit(r != 0)),
  32: (lambda a, b: ~(a ^ b) & MASK32, lambda a, b, r: _bit(r != 0)),
  34: (lambda a, b: a & ~b & MASK32, lambda a, b, r: _bit(r != 0)),
  36: (lambda a, b: (a | ~b) & MASK32, lambda a, b, r: _bit(r != 0)),
  44: (lambda a, b: _i32(a) * _i32(b), None),
  45: (_u64mul_hi, None),
  **{13 + n: ((lambda a, b, n=n: (a << n) + b), (lambda a, b, r: _bit(r > MASK32))) for n in (1, 2, 3, 4)},
  42: (lambda a, b: (((1 << (a & 31)) - 1) << (b & 31)) & MASK32, None),
  50: (lambda a, b: (a & 0xFFFF) | ((b & 0xFFFF) << 16), None),
  51: (lambda a, b: (a & 0xFFFF) | (b & 0xFFFF0000), None),
  52: (lambda a, b: (a >> 16) | (b & 0xFFFF0000), None),
}
_LANE_BITWISE = {22: np.logical_and, 24: np.logical_or, 26: np.logical_xor,
                 34: lambda a, b: a & ~b, 36: lambda a, b: a | ~b}  # SOP2 b32 ops done on lane masks
_LANE_BITWISE64 = {23: 22, 25: 24, 27: 26, 35: 34, 37: 36}     # b64 twins (wave64 masks)


def c_sop2(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op, d, c0, c1 = inst.op, inst.f["sdst"], inst.f["ssrc0"], inst.f["ssrc1"]
  if op in _LANE_BITWISE: return _lanewise(d, c0, c1, _LANE_BITWISE[op], False, _sop2_scalar(emu, inst, nxt), nxt)
  if op in _LANE_BITWISE64:
    return _lanewise(d, c0, c1, _LANE_BITWISE[_LANE_BITWISE64[op]], True, _sop2_b64(emu, inst, nxt), nxt)
  if op in _SOP2: return _sop2_scalar(emu, inst, nxt)
  if op in (4, 5):  # s_addc_u32 / s_subb_u32
    a, bb = sreader(c0, inst), sreader(c1, inst)
    def addc(b: Batch) -> int:
      x, y, c = a(b), bb(b), b.scc
      r = x + y + c if op == 4 else x - y - c
      b.sset(d, r & MASK32)
      b.set_scc(r >> 32 if op == 4 else _bit(r < 0))
      return nxt
    return addc
  if op == 48:  # s_cselect_b32
    a, bb = sreader(c0, inst), sreader(c1, inst)
    def csel(b: Batch) -> int:
      b.sset(d, _where(b.scc, a(b), bb(b)))
      return nxt
    return csel
  if op == 38:  # s_bfe_u32 (per-wave widths go the per-wave way)
    a, bb = sreader(c0, inst), sreader(c1, inst)
    slow = fallback(emu, inst, pc, nxt)
    def bfe(b: Batch) -> int:
      x, y = a(b), bb(b)
      if _any(x) or _any(y): return slow(b)
      r = (x >> (y & 31)) & ((1 << ((y >> 16) & 0x7F)) - 1)
      b.sset(d, r & MASK32)
      b.set_scc(int(r != 0))
      return nxt
    return bfe
  if op in (9, 11, 13, 49): return _sop2_b64(emu, inst, nxt)
  raise _Slow


def _sop2_scalar(emu: Any, inst: Inst, nxt: int) -> Op:
  op, d = inst.op, inst.f["sdst"]
  fn, sccf = _SOP2[op]
  a, bb = sreader(inst.f["ssrc0"], inst), sreader(inst.f["ssrc1"], inst)

  def run(b: Batch) -> int:
    x, y = a(b), bb(b)
    r = fn(x, y)
    if sccf is not None: b.set_scc(sccf(x, y, r))
    b.sset(d, r & MASK32)
    return nxt
  return run


def _per_wave_fallback(emu: Any, inst: Inst, nxt: int, b: Batch) -> int:
  return fallback(emu, inst, nxt - inst.size, nxt)(b)


def _sop2_b64(emu: Any, inst: Inst, nxt: int) -> Op:
  op, d = inst.op, inst.f["sdst"]
  a = sreader64(inst.f["ssrc0"], inst)
  shift = op in (9, 11, 13)
  bb = sreader(inst.f["ssrc1"], inst) if shift else sreader64(inst.f["ssrc1"], inst)
  m64 = (1 << 64) - 1

  def run(b: Batch) -> int:
    x, y = a(b), bb(b)
    if _any(x) or _any(y) or type(b.scc) is not int and op == 49: return _per_wave_fallback(emu, inst, nxt, b)
    if op == 9: r = (x << (y & 63)) & m64
    elif op == 11: r = x >> (y & 63)
    elif op == 13: r = (r3.sext(x, 64) >> (y & 63)) & m64
    elif op == 23: r = x & y
    elif op == 25: r = x | y
    elif op == 27: r = x ^ y
    elif op == 35: r = x & ~y & m64
    elif op == 37: r = (x | (~y & m64)) & m64
    else: r = x if b.scc else y
    b.sset(d, r & MASK32)
    if d != NULL: b.sset(d + 1, r >> 32)
    if op != 49: b.set_scc(int(r != 0))
    return nxt
  return run


def _lanewise(d: int, c0: int, c1: int, lane_op: Callable[[Any, Any], Any], wide: bool, scalar: Op, nxt: int) -> Op:
  """A bitwise SOP2 whose operands are lane masks (EXEC, VCC, compare results): computed on lanes (b32 ops on wave32,
  b64 ops on wave64 pairs), the result stays a LaneMask. Other operands go the scalar way."""
  regs = c0 in _SREGS and c1 in _SREGS and d != NULL and c0 not in (VCC_HI, EXEC_LO + 1) and \
    c1 not in (VCC_HI, EXEC_LO + 1)

  def run(b: Batch) -> int:
    S = b.S
    if not regs or b.wm is not None or (b.W == 64) != wide or not (type(S[c0]) is LaneMask or type(S[c1]) is LaneMask):
      return scalar(b)
    x, y = b.mask_lanes(c0), b.mask_lanes(c1)
    x = np.ones(b.L, bool) if x is True else x
    y = np.ones(b.L, bool) if y is True else y
    r = lane_op(x, y)
    b.set_mask(d, r)
    b.set_scc(_bit(r.reshape(b.N, b.W).any(axis=1)) if b.N > 1 else int(r.any()))
    return nxt
  return run


def c_sop1(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op, d, c = inst.op, inst.f["sdst"], inst.f["ssrc0"]
  if op == 0:  # s_mov_b32 (a LaneMask moves as it is)
    if c in _SREGS and d != NULL and d not in (EXEC_LO, EXEC_LO + 1):
      def mov_reg(b: Batch) -> int:
        v = b.S[c]
        if b.wm is None: b.S[d] = v
        else: b.sset(d, b.sval(c))
        return nxt
      return mov_reg
    rd = sreader(c, inst)
    def mov(b: Batch) -> int:
      b.sset(d, rd(b))
      return nxt
    return mov
  if op == 1:  # s_mov_b64
    if c in _SREGS and d not in (NULL, EXEC_LO, EXEC_LO - 1, EXEC_LO + 1) and c not in (VCC_HI, EXEC_LO + 1):
      def mov64(b: Batch) -> int:
        if b.wm is None: b.S[d], b.S[d + 1] = b.S[c], b.S[c + 1]
        else:
          b.sset(d, b.sval(c))
          b.sset(d + 1, b.sval(c + 1))
        return nxt
      return mov64
    rd64 = sreader64(c, inst)
    def movc(b: Batch) -> int:
      v = rd64(b)
      if _any(v): return _per_wave_fallback(emu, inst, nxt, b)
      b.sset(d, v & MASK32)
      b.sset(d + 1, v >> 32)
      return nxt
    return movc
  if op in r3.SAVEEXEC: return _saveexec32(emu, inst, nxt)
  if op == 30:  # s_not_b32
    rd = sreader(c, inst)
    def snot(b: Batch) -> int:
      v = ~rd(b) & MASK32
      b.sset(d, v)
      b.set_scc(_bit(v != 0))
      return nxt
    return snot
  raise _Slow


_SAVEEXEC_LANES: dict[int, Callable[[Any, Any], Any]] = {
  32: lambda s, e: s & e, 34: lambda s, e: s | e, 36: lambda s, e: s ^ e, 38: lambda s, e: ~(s & e),
  40: lambda s, e: ~(s | e), 42: lambda s, e: ~(s ^ e), 44: lambda s, e: ~s & e, 46: lambda s, e: ~s | e,
  48: lambda s, e: s & ~e, 50: lambda s, e: s | ~e}


def _saveexec32(emu: Any, inst: Inst, nxt: int) -> Op:
  """s_*_saveexec_b32 (wave32): sdst = EXEC; EXEC = fn(src, EXEC); SCC = EXEC != 0, computed on lanes."""
  op, d, c = inst.op, inst.f["sdst"], inst.f["ssrc0"]
  fn = _SAVEEXEC_LANES[op]
  slow = fallback(emu, inst, nxt - inst.size, nxt)
  if c not in _SREGS: return slow

  def run(b: Batch) -> int:
    if b.wm is not None or b.W != 32: return slow(b)
    old = b.S[EXEC_LO]
    src, ex = b.mask_lanes(c), b.mask_lanes(EXEC_LO)
    src = np.ones(b.L, bool) if src is True else src
    ex = np.ones(b.L, bool) if ex is True else ex
    new = fn(src, ex)
    b.S[EXEC_LO] = LaneMask(new, 0)
    b.refresh_mask()
    if d != NULL: b.S[d] = old if d != EXEC_LO else b.S[d]
    b.set_scc(_bit(new.reshape(b.N, b.W).any(axis=1)) if b.N > 1 else int(new.any()))
    return nxt
  return run


def c_sopk(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op, d, raw = inst.op, inst.f["sdst"], inst.f["simm16"]
  k = r3.sext(raw, 16)
  if 23 <= op <= 26: return lambda b: nxt  # waitcnts: memory is synchronous here
  if op == 0:
    def movk(b: Batch) -> int:
      b.sset(d, k & MASK32)
      return nxt
    return movk
  if 3 <= op <= 14:
    signed = op <= 8
    cmp = _SOPC_FN[(op - 3) % 6]
    imm = k if signed else raw
    def cmpk(b: Batch) -> int:
      v = b.sval(d)
      b.set_scc(_bit(cmp(_i32(v) if signed else v, imm)))
      return nxt
    return cmpk
  if op in (15, 16):  # s_addk_i32 / s_mulk_i32 (SCC unchanged, as the reference has it)
    def addk(b: Batch) -> int:
      v = _i32(b.sval(d))
      b.sset(d, (v + k if op == 15 else v * k) & MASK32)
      return nxt
    return addk
  raise _Slow


_SOPC_FN: list[Callable[[Any, Any], Any]] = [lambda a, b: a == b, lambda a, b: a != b, lambda a, b: a > b,
                                             lambda a, b: a >= b, lambda a, b: a < b, lambda a, b: a <= b]


def c_sopc(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op = inst.op
  if op >= 12: raise _Slow
  a, bb = sreader(inst.f["ssrc0"], inst), sreader(inst.f["ssrc1"], inst)
  fn = _SOPC_FN[op % 6]
  signed = op < 6

  def run(b: Batch) -> int:
    x, y = a(b), bb(b)
    b.set_scc(_bit(fn(_i32(x), _i32(y)) if signed else fn(x, y)))
    return nxt
  return run


def c_sopp(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op, imm = inst.op, inst.f["simm16"]
  if op == 48: return lambda b: END
  if op in (0, 3, 4, 5, 7, 8, 9, 18, 31, 53, 54, 61) or (op == 17 and imm == 0): return lambda b: nxt
  target = nxt + r3.sext(imm, 16) * 4
  if op == 32: return lambda b: target
  if op not in (33, 34, 35, 36, 37, 38): raise _Slow

  def branch(b: Batch) -> int:
    if op in (33, 34): c = b.scc if op == 34 else (1 - b.scc)
    elif op in (35, 36):
      nz = b.mask_nonzero(VCC_LO)
      c = nz if op == 36 else 1 - _bit(nz)
    else:
      nz = b.exec_any()
      c = nz if op == 38 else 1 - _bit(nz)
    if type(c) is int or isinstance(c, (bool, np.bool_)): return target if c else nxt
    c = np.asarray(c, bool)
    part = c if b.wm is None else c[b.wm]
    if part.all(): return target
    if not part.any(): return nxt
    b.npc = np.where(c, target, nxt)
    return SPLIT
  return branch


def c_smem(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  if inst.op not in r3.SMEM_LOADS: raise _Slow
  f, n = inst.f, r3.SMEM_LOADS[inst.op]
  sb, sd, off, so = f["sbase"], f["sdata"], f["offset"], f["soffset"]
  slow = fallback(emu, inst, pc, nxt)

  def run(b: Batch) -> int:
    lo, hi = b.sval(sb), b.sval(sb + 1)
    o = off + (b.sval(so) if so != NULL else 0)
    if _any(lo) or _any(hi) or _any(o):
      addr: Any = ((np.asarray(lo, I64).astype(U64) | (np.asarray(hi, I64).astype(U64) << U64(32)))
                   + np.asarray(o, I64).astype(U64)) & ~U64(3)
      addr = np.broadcast_to(addr, (b.N,))
      uniq = np.unique(np.asarray(addr)) if b.wm is None else np.unique(np.asarray(addr)[b.wm])
      if len(uniq) > 1: return slow(b)
      addr = int(uniq[0])
    else: addr = ((lo | (hi << 32)) + o) & ~3
    vals = np.frombuffer(emu.mem.read(addr, 4 * n), dtype="<u4")
    for i in range(n): b.sset(sd + i, int(vals[i]))
    return nxt
  return run


# ***** vector ALU *****
def _f2(kind: int) -> Callable[[Any, Any], np.ndarray]:
  """VOP2 float32 ops by column (operand order chosen so a NaN result's payload follows the reference)."""
  if kind == 3: return lambda x, y: np.add(y, x)
  if kind == 4: return lambda x, y: np.subtract(x, y)
  if kind == 5: return lambda x, y: np.subtract(y, x)
  if kind == 8: return lambda x, y: np.multiply(y, x)
  if kind == 15: return fmin32
  if kind == 16: return fmax32
  raise _Slow


def _i2(op: int) -> Callable[[Any, Any], Any]:
  """VOP2 integer ops by column (uint32 in, uint32 out)."""
  if op == 37: return lambda x, y: np.add(x, y, dtype=U32)
  if op == 38: return lambda x, y: np.subtract(x, y, dtype=U32)
  if op == 39: return lambda x, y: np.subtract(y, x, dtype=U32)
  if op == 24: return lambda x, y: np.left_shift(y, x & U32(31), dtype=U32)
  if op == 25: return lambda x, y: np.right_shift(y, x & U32(31), dtype=U32)
  if op == 26: return lambda x, y: np.right_shift(np.asarray(y).view(I32), np.asarray(x & U32(31), I32)).view(U32)
  if op == 27: return lambda x, y: np.bitwise_and(x, y, dtype=U32)
  if op == 28: return lambda x, y: np.bitwise_or(x, y, dtype=U32)
  if op == 29: return lambda x, y: np.bitwise_xor(x, y, dtype=U32)
  if op == 9: return lambda x, y: np.multiply(_s24(x), _s24(y), dtype=I32).view(U32)
  if op == 10: return lambda x, y: (np.multiply(_s24(x), _s24(y), dtype=I64) >> 32).astype(U32)
  if op == 11: return lambda x, y: np.multiply(x & U32(0xFFFFFF), y & U32(0xFFFFFF), dtype=U32)
  if op == 12: return lambda x, y: (np.multiply(x & U32(0xFFFFFF), y & U32(0xFFFFFF), dtype=U64) >> U64(32)).astype(U32)
  if op == 17: return lambda x, y: np.minimum(np.asarray(x).view(I32), np.asarray(y).view(I32)).view(U32)
  if op == 18: return lambda x, y: np.maximum(np.asarray(x).view(I32), np.asarray(y).view(I32)).view(U32)
  if op == 19: return lambda x, y: np.minimum(x, y, dtype=U32)
  if op == 20: return lambda x, y: np.maximum(x, y, dtype=U32)
  raise _Slow


def _s24(x: Any) -> Any: return (np.asarray(x, U32) << U32(8)).view(I32) >> I32(8)


_F2_OPS = (3, 4, 5, 8, 15, 16)
_I2_OPS = (37, 38, 39, 24, 25, 26, 27, 28, 29, 9, 10, 11, 12, 17, 18, 19, 20)


def _binop(fn: Callable[[Any, Any], Any], a: Callable[[Batch], Any], c: Callable[[Batch], Any], d: int, flt: bool,
           nxt: int) -> Op:
  if flt:
    def runf(b: Batch) -> int:
      r = fn(a(b), c(b))
      if b.mw is True: b.F[d][:] = r
      else: np.copyto(b.F[d], r, where=b.mw)
      return nxt
    return runf

  def runi(b: Batch) -> int:
    r = fn(a(b), c(b))
    if b.mw is True: b.V[d][:] = r
    else: np.copyto(b.V[d], r, where=b.mw, casting="unsafe")
    return nxt
  return runi


def _fast_f2(kind: int, a: Callable[[Batch], Any], c: Callable[[Batch], Any], d: int, nxt: int) -> Op:
  """add/sub/mul f32 straight into the destination column when every lane is active."""
  ufunc, swap = {3: (np.add, True), 4: (np.subtract, False), 5: (np.subtract, True), 8: (np.multiply, True)}[kind]
  if swap:
    def run_s(b: Batch) -> int:
      if b.mw is True: ufunc(c(b), a(b), b.F[d])
      else: np.copyto(b.F[d], ufunc(c(b), a(b)), where=b.mw)
      return nxt
    return run_s

  def run(b: Batch) -> int:
    if b.mw is True: ufunc(a(b), c(b), b.F[d])
    else: np.copyto(b.F[d], ufunc(a(b), c(b)), where=b.mw)
    return nxt
  return run


def _cndmask(a: Callable[[Batch], Any], c: Callable[[Batch], Any], mcode: int, d: int, nxt: int) -> Op:
  def run(b: Batch) -> int:
    m = b.mask_lanes(mcode)
    r = c(b) if m is True else np.where(m, c(b), a(b))
    put(b, d, r)
    return nxt
  return run


def _fma_op(a: Callable[[Batch], Any], bb: Callable[[Batch], Any], c: Callable[[Batch], Any], d: int, nxt: int) -> Op:
  def run(b: Batch) -> int:
    putf(b, d, fma32(a(b), bb(b), c(b)))
    return nxt
  return run


def addsub(x: Any, y: Any, cin: Any, sub: bool) -> tuple[Any, Any]:
  """x + y + cin / x - y - cin on uint32 columns (cin: None or a bool column) -> (uint32 result, carry/borrow out)."""
  x = np.asarray(x, U32)
  if sub:
    r = np.subtract(x, y, dtype=U32)
    c = x < y
    if cin is not None:
      c = c | (r < cin)
      r = np.subtract(r, cin, dtype=U32)
    return r, c
  r = np.add(x, y, dtype=U32)
  c = r < x
  if cin is not None:
    r = np.add(r, cin, dtype=U32)
    c = c | (r < cin)
  return r, c


def _lanes(b: Batch, v: Any) -> np.ndarray:
  """A result that may be a 0-d value (all operands scalar) as a full column."""
  return v if v.shape else np.full(b.L, v)


def _carry_vop2(op: int, a: Callable[[Batch], Any], c: Callable[[Batch], Any], d: int, nxt: int) -> Op:
  """v_add/sub/subrev_co_ci_u32 (e32): carry in and out through VCC; VCC keeps its bits of lanes off in EXEC."""
  def run(b: Batch) -> int:
    vcc = b.mask_lanes(VCC_LO)
    cin = np.ones(b.L, bool) if vcc is True else vcc
    x, y = (c(b), a(b)) if op == 34 else (a(b), c(b))
    r, carry = addsub(x, y, cin, op != 32)
    put(b, d, r)
    b.set_mask(VCC_LO, _lanes(b, carry) if b.mw is True else np.where(b.mw, carry, cin))
    return nxt
  return run


def c_vop2(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  f, op = inst.f, inst.op
  d, s0, s1 = f["vdst"], f["src0"], 256 + f["vsrc1"]
  if op in (3, 4, 5, 8): return _fast_f2(op, freader(s0, inst), freader(s1, inst), d, nxt)
  if op in _F2_OPS: return _binop(_f2(op), freader(s0, inst), freader(s1, inst), d, True, nxt)
  if op in _I2_OPS: return _binop(_i2(op), vreader(s0, inst), vreader(s1, inst), d, False, nxt)
  if op == 1: return _cndmask(vreader(s0, inst), vreader(s1, inst), VCC_LO, d, nxt)
  if op == 43: return _fma_op(freader(s0, inst), freader(s1, inst), freader(256 + d, inst), d, nxt)
  if op in (44, 45):
    k = np.array(inst.literal or 0, U32).view(F32)[()]
    kf = lambda b: k  # noqa: E731
    a, c = freader(s0, inst), freader(s1, inst)
    return _fma_op(a, kf, c, d, nxt) if op == 44 else _fma_op(a, c, kf, d, nxt)
  if op in (32, 33, 34): return _carry_vop2(op, vreader(s0, inst), vreader(s1, inst), d, nxt)
  if op in r3.VOP2 and op not in r3.VOP2_16:
    return lanemap(r3.VOP2[op][1], [vreader(s0, inst), vreader(s1, inst)], d, nxt)
  raise _Slow


def c_vop1(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  f, op = inst.f, inst.op
  d, s0 = f["vdst"], f["src0"]
  if op == 2: return _readfirstlane(vreader(s0, inst), d, nxt)
  return _vop1(op, vreader(s0, inst), d, nxt)


def _vop1(op: int, rd: Callable[[Batch], Any], d: int, nxt: int) -> Op:
  if op == 1:
    def mov(b: Batch) -> int:
      put(b, d, rd(b))
      return nxt
    return mov
  fn: Callable[[Any], Any] | None = {
    55: lambda x: ~np.asarray(x, U32),
    5: lambda x: np.asarray(x, U32).view(I32).astype(F32).view(U32),
    6: lambda x: np.asarray(x, U32).astype(F32).view(U32),
    42: lambda x: np.divide(F32(1), np.asarray(x, U32).view(F32)).view(U32),
    43: lambda x: np.divide(F32(1), np.asarray(x, U32).view(F32)).view(U32),
    51: lambda x: sqrt32(np.asarray(x, U32).view(F32)).view(U32),
  }.get(op)
  if fn is not None:
    def run(b: Batch) -> int:
      put(b, d, fn(rd(b)))
      return nxt
    return run
  if op in r3.VOP1: return lanemap(r3.VOP1[op][1], [rd], d, nxt)
  raise _Slow


def _readfirstlane(rd: Callable[[Batch], Any], d: int, nxt: int) -> Op:
  """v_readfirstlane_b32: per wave, the first active lane's value (lane 0 when none is active) into an SGPR."""
  def run(b: Batch) -> int:
    v = rd(b)
    if not (isinstance(v, np.ndarray) and v.ndim):
      b.sset(d, int(v))
      return nxt
    ex = b.mask_lanes(EXEC_LO)
    first = np.zeros(b.N, np.int64) if ex is True else ex.reshape(b.N, b.W).argmax(axis=1)
    vals = v[np.arange(b.N) * b.W + first].astype(I64)
    b.sset(d, int(vals[0]) if b.N == 1 else vals)
    return nxt
  return run


def _vopc_write(b: Batch, r: Any, cmpx: bool, sdst: int) -> None:
  """A compare's lanes as a mask: lanes off in EXEC (and of waves not taking part) give 0."""
  r = np.broadcast_to(r, (b.L,)) if np.ndim(r) == 0 else r
  if b.mw is not True: r = r & b.mw
  b.set_mask(EXEC_LO if cmpx else sdst, r)


def c_vopc(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op = inst.op
  base = op & 0x7F
  cmp = compare32(base)
  if cmp is None: raise _Slow
  fn, flt = cmp
  rdr = freader if flt else vreader
  a, c = rdr(inst.f["src0"], inst), rdr(256 + inst.f["vsrc1"], inst)
  cmpx = bool(op & 0x80)

  def run(b: Batch) -> int:
    _vopc_write(b, fn(a(b), c(b)), cmpx, VCC_LO)
    return nxt
  return run


def c_vopd(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """VOPD: both halves read their sources before either writes. Halves that don't read the other's destination run
  one after the other straight into their registers (ordered so the first write can't reach the second's sources);
  else each goes to a temporary column first."""
  f, k = inst.f, inst.literal or 0
  hx = (f["opx"], f["src0x"], 256 + f["vsrcx1"], f["vdstx"])
  hy = (f["opy"], f["src0y"], 256 + f["vsrcy1"], f["vdsty"])
  reads = lambda h: {h[1], h[2]} | ({256 + h[3]} if h[0] == 0 else set())  # noqa: E731
  x_hits_y, y_hits_x = 256 + hx[3] in reads(hy), 256 + hy[3] in reads(hx)
  if not x_hits_y: first, second = hx, hy
  elif not y_hits_x: first, second = hy, hx
  else:
    ox, oy = _vopd_half(*hx, k, inst, _TMP), _vopd_half(*hy, k, inst, _TMP + 1)
    dx, dy = hx[3], hy[3]
    def via_tmp(b: Batch) -> int:
      ox(b)
      oy(b)
      put(b, dx, b.V[_TMP])
      put(b, dy, b.V[_TMP + 1])
      return nxt
    return via_tmp
  o1, o2 = _vopd_half(*first, k, inst), _vopd_half(*second, k, inst)

  def run(b: Batch) -> int:
    o1(b)
    o2(b)
    return nxt
  return run


_TMP = 512  # the batch's temporary columns (VRegs accepts 512 and up)


def _vopd_half(op: int, s0: int, s1: int, d: int, k: int, inst: Inst, out: int | None = None) -> Op:
  """One VOPD half as an op writing VGPR `out` (default: its destination `d`)."""
  o = d if out is None else out
  kf = np.array(k, U32).view(F32)[()]
  if op == 8: return _vop1(1, vreader(s0, inst), o, 0)
  if op == 0: return _fma_op(freader(s0, inst), freader(s1, inst), freader(256 + d, inst), o, 0)
  if op == 1: return _fma_op(freader(s0, inst), freader(s1, inst), lambda b: kf, o, 0)
  if op == 2: return _fma_op(freader(s0, inst), lambda b: kf, freader(s1, inst), o, 0)
  if op == 9: return _cndmask(vreader(s0, inst), vreader(s1, inst), VCC_LO, o, 0)
  if op in (3, 4, 5, 6): return _fast_f2(r3.VOPD_FLOAT[op], freader(s0, inst), freader(s1, inst), o, 0)
  if op in (10, 11): return _binop(_f2(r3.VOPD_FLOAT[op]), freader(s0, inst), freader(s1, inst), o, True, 0)
  if op in (16, 17, 18): return _binop(_i2(r3._VOPD_TO_VOP2[op]), vreader(s0, inst), vreader(s1, inst), o, False, 0)
  if op == 7: return lanemap(r3.VOP2[7][1], [vreader(s0, inst), vreader(s1, inst)], o, 0)
  raise _Slow


# VOP3 opcodes whose abs/neg modifiers the reference accepts (see rdna3.Emulator.vop3)
def _mods_ok(op: int) -> bool:
  return op in (0x101, 0x213, 0x227, 0x237, 0x2FC, 0x31C) or 0x100 + 3 <= op <= 0x100 + 16 or op < 0x100


def c_vop3(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  f, op = dict(inst.f), inst.op
  if op in r3.VOP3SD: f.update(abs=0, opsel=0, clamp=0)
  if f["omod"] or f["clamp"] or f["opsel"]: raise _Slow
  if op in r3.VOP3_16 or op in (0x136, 0x25D, 0x25B, 0x25C, 0x1EA, 0x1EB, 0x311, 0x12F): raise _Slow
  if op < 0x100 and (0x30 <= op & 0x7F < 0x40 or op & 0x7F < 0x10 or op & 0x7F == 0x7D): raise _Slow
  d = f["vdst"]

  def src(i: int) -> Callable[[Batch], Any]:
    return modded(vreader(f[f"src{i}"], inst), f["abs"] >> i & 1, f["neg"] >> i & 1)
  if op < 0x100:  # VOPC promoted: the mask to an SGPR (v_cmpx: to EXEC only)
    cmp = compare32(op & 0x7F)
    if cmp is None: raise _Slow
    fn, flt = cmp
    a, c = src(0), src(1)
    if flt: a, c = fview(a), fview(c)
    cmpx = bool(op & 0x80)
    def vopc(b: Batch) -> int:
      _vopc_write(b, fn(a(b), c(b)), cmpx, d)
      return nxt
    return vopc
  if (f["abs"] or f["neg"]) and not _mods_ok(op): raise _Slow
  if op in (0x213, 0x237): return _fma_op(fview(src(0)), fview(src(1)), fview(src(2)), d, nxt)
  if op == 0x101:
    if f["src2"] not in _SREGS: raise _Slow
    return _cndmask(src(0), src(1), f["src2"], d, nxt)
  if 0x100 <= op < 0x180 and op not in r3.VOP3SD:
    o = op - 0x100
    if o in (3, 4, 5, 8): return _fast_f2(o, fview(src(0)), fview(src(1)), d, nxt)
    if o in _F2_OPS: return _binop(_f2(o), fview(src(0)), fview(src(1)), d, True, nxt)
    if o in _I2_OPS: return _binop(_i2(o), src(0), src(1), d, False, nxt)
    if o == 43: return _fma_op(fview(src(0)), fview(src(1)), freader(256 + d, inst), d, nxt)
    if o in r3.VOP2 and o not in r3.VOP2_16: return lanemap(r3.VOP2[o][1], [src(0), src(1)], d, nxt)
    raise _Slow
  if 0x180 <= op < 0x200:
    o = op - 0x180
    if o not in r3.VOP1 or o in r3.VOP1_F64: raise _Slow
    return _vop1(o, src(0), d, nxt)
  if op in _VOP3_NATIVE: return _tri(_VOP3_NATIVE[op], src(0), src(1), src(2), d, nxt)
  if op in r3.VOP3: return lanemap(r3.VOP3[op][1], [src(0), src(1), src(2)], d, nxt)
  if op == 0x360 and f["src0"] >= 256: return _readlane(f["src0"] - 256, sreader(f["src1"], inst), d, nxt)
  if op == 0x2FC: return _div_scale(src(0), d, f["sdst"], nxt)
  if op in (0x120, 0x121, 0x122, r3.VOP3_ADD_CO_U32, r3.VOP3_SUB_CO_U32):
    if op < 0x200 and f["src2"] not in _SREGS: raise _Slow
    return _carry_vop3(op, src(0), src(1), f["src2"], d, f["sdst"], nxt)
  if op == r3.VOP3_MAD_U64_U32: return _mad_u64(src(0), src(1), f["src2"], inst, d, f["sdst"], nxt)
  if op in (r3.VOP3_LSHLREV_B64, 0x33D, 0x33E): return _shift64(op, src(0), f["src1"], inst, d, nxt)
  raise _Slow


def _tri(fn: Callable[..., Any], a: Callable[[Batch], Any], b_: Callable[[Batch], Any], c: Callable[[Batch], Any],
         d: int, nxt: int) -> Op:
  def run(b: Batch) -> int:
    put(b, d, fn(np.asarray(a(b), U32), np.asarray(b_(b), U32), np.asarray(c(b), U32)))
    return nxt
  return run


def _bfe_u(a: Any, o: Any, w: Any) -> Any:
  w = np.asarray(w & U32(31), U64)
  return ((np.asarray(a, U64) >> np.asarray(o & U32(31), U64)) & ((U64(1) << w) - U64(1))).astype(U32)


def _bfe_i(a: Any, o: Any, w: Any) -> Any:
  w = np.asarray(w & U32(31), I64)
  v = np.asarray(a, I64) >> np.asarray(o & U32(31), I64)
  sh = np.where(w == 0, 0, 64 - w)
  r = (v << sh) >> sh
  return np.where(w == 0, 0, r).astype(U32)


_VOP3_NATIVE: dict[int, Callable[[Any, Any, Any], Any]] = {
  0x255: lambda a, b, c: a + b + c,                                    # v_add3_u32
  0x246: lambda a, b, c: (a << (b & U32(31))) + c,                     # v_lshl_add_u32
  0x247: lambda a, b, c: (a + b) << (c & U32(31)),                     # v_add_lshl_u32
  0x256: lambda a, b, c: (a << (b & U32(31))) | c,                     # v_lshl_or_b32
  0x257: lambda a, b, c: (a & b) | c, 0x258: lambda a, b, c: a | b | c,
  0x245: lambda a, b, c: (a ^ b) + c,                                  # v_xad_u32
  0x212: lambda a, b, c: (a & b) | (~a & c),                           # v_bfi_b32
  0x210: _bfe_u, 0x211: _bfe_i,
  0x216: lambda a, b, c: (((a.astype(U64) << U64(32)) | b) >> (c & U32(31)).astype(U64)).astype(U32),  # alignbit
  0x20B: lambda a, b, c: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)) + c,  # v_mad_u32_u24
  0x20A: lambda a, b, c: (_s24(a) * _s24(b)).view(U32) + c,            # v_mad_i32_i24
  0x32C: lambda a, b, c: a * b,                                        # v_mul_lo_u32
  0x32D: lambda a, b, c: ((a.astype(U64) * b) >> U64(32)).astype(U32),  # v_mul_hi_u32
  0x32E: lambda a, b, c: ((a.view(I32).astype(I64) * b.view(I32)) >> 32).astype(U32),  # v_mul_hi_i32
  0x21B: lambda a, b, c: np.minimum(np.minimum(a, b), c), 0x21E: lambda a, b, c: np.maximum(np.maximum(a, b), c),
  0x21A: lambda a, b, c: np.minimum(np.minimum(a.view(I32), b.view(I32)), c.view(I32)).view(U32),
  0x21D: lambda a, b, c: np.maximum(np.maximum(a.view(I32), b.view(I32)), c.view(I32)).view(U32),
}


def _readlane(r: int, sel: Callable[[Batch], Any], d: int, nxt: int) -> Op:
  def run(b: Batch) -> int:
    s = sel(b)
    idx = np.arange(b.N, dtype=np.int64) * b.W + (np.asarray(s, I64) & (b.W - 1))
    vals = b.V[r][idx].astype(I64)
    b.sset(d, int(vals[0]) if b.N == 1 else vals)
    return nxt
  return run


def _div_scale(a: Callable[[Batch], Any], d: int, sdst: int, nxt: int) -> Op:
  """v_div_scale_f32: D = S0 (float32 inputs need no rescaling in the reference's double math), the mask 0."""
  def run(b: Batch) -> int:
    put(b, d, a(b))
    b.set_mask(sdst, np.zeros(b.L, bool))
    return nxt
  return run


def _carry_vop3(op: int, a: Callable[[Batch], Any], c: Callable[[Batch], Any], cin_code: int, d: int, sdst: int,
                nxt: int) -> Op:
  """v_add/sub/subrev_co_ci_u32_e64 (carry in from src2's SGPR) and v_add/sub_co_u32: the carry mask to sdst (lanes
  off in EXEC give 0)."""
  sub, rev = op in (0x121, 0x122, r3.VOP3_SUB_CO_U32), op == 0x122

  def run(b: Batch) -> int:
    cin = None
    if op < 0x200:
      m = b.mask_lanes(cin_code)
      cin = np.ones(b.L, bool) if m is True else m
    x, y = (c(b), a(b)) if rev else (a(b), c(b))
    r, carry = addsub(x, y, cin, sub)
    put(b, d, r)
    carry = _lanes(b, carry)
    b.set_mask(sdst, carry if b.mw is True else carry & b.mw)
    return nxt
  return run


def _mad_u64(a: Callable[[Batch], Any], c: Callable[[Batch], Any], code2: int, inst: Inst, d: int, sdst: int,
             nxt: int) -> Op:
  """v_mad_u64_u32: D(64) = S0 * S1 + S2(64), the carry mask 0."""
  if code2 >= 256:
    r2 = code2 - 256
    z = lambda b: b.V[r2].astype(U64) | (b.V[r2 + 1].astype(U64) << U64(32))  # noqa: E731
  elif code2 in INLINE_F32: raise _Slow
  else:
    s64 = sreader64(code2, inst)
    def z(b: Batch) -> Any:
      v = s64(b)
      return U64(v) if type(v) is int else np.repeat(v, b.W)

  def run(b: Batch) -> int:
    r = np.asarray(a(b), U64) * np.asarray(c(b), U64) + z(b)
    put(b, d, (r & U64(MASK32)).astype(U32))
    put(b, d + 1, (r >> U64(32)).astype(U32))
    b.set_mask(sdst, np.zeros(b.L, bool))
    return nxt
  return run


def _shift64(op: int, sh: Callable[[Batch], Any], code1: int, inst: Inst, d: int, nxt: int) -> Op:
  if code1 < 256: raise _Slow
  r1 = code1 - 256

  def run(b: Batch) -> int:
    v = b.V[r1].astype(U64) | (b.V[r1 + 1].astype(U64) << U64(32))
    s = (np.asarray(sh(b), U64) & U64(63))
    if op == r3.VOP3_LSHLREV_B64: r = v << s
    elif op == 0x33D: r = v >> s
    else: r = (v.view(I64) >> s.astype(I64)).view(U64)
    put(b, d, (r & U64(MASK32)).astype(U32))
    put(b, d + 1, (r >> U64(32)).astype(U32))
    return nxt
  return run


# ***** memory *****
def region(emu: Any, lo: int, hi: int, cache: list[Any]) -> tuple[int, np.ndarray, np.ndarray | None] | None:
  """(start, uint8 view, uint32 view or None) of memory holding [lo, hi), or None (the per-wave path then runs the
  access and reports any fault). The emulator's memory decides through its `region` method (the mock's: one mapped
  allocation); plain host memory (rdna3.Memory) is viewed as it is, as only the bytes the lanes address are touched,
  exactly those the per-wave path touches. `cache` holds the op's last region."""
  if cache and cache[0] <= lo and hi <= cache[1] and cache[4] == getattr(emu.mem, "generation", 0):
    return cache[2]
  find = getattr(emu.mem, "region", None)
  if find is not None:
    r = find(lo)
    if r is None or hi > r[1]: return None
    start, end, u8 = r
  elif type(emu.mem) is Memory:
    start, end = lo & ~4095, (hi + 4095) & ~4095
    u8 = host_span(start, end - start)
  else: return None
  res = (start, u8, u8[:len(u8) & ~3].view(U32) if start % 4 == 0 else None)
  cache[:] = [start, end, res, None, getattr(emu.mem, "generation", 0)]
  return res


_AR = [np.arange(n, dtype=np.intp) for n in range(5)]


def c_flat(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """FLAT (segment 0) and GLOBAL (segment 2) loads and stores: the active lanes' 64-bit addresses, one region of
  memory holding them all (else the per-wave path), dword accesses through a uint32 view when aligned, bytes
  otherwise; stores in lane order (a later lane's bytes win)."""
  f, op, seg = inst.f, inst.op, inst.f["seg"]
  if seg not in (0, 2): raise _Slow
  slow = fallback(emu, inst, pc, nxt)
  va, off = f["addr"], f["offset"]
  sa = f["saddr"] if seg == 2 and f["saddr"] not in (NULL, 0x7F) else None
  signed, bits, sh = False, 32, 0
  if op in r3.GLOBAL_LOADS:
    n, signed, bits = r3.GLOBAL_LOADS[op]
    kind, nb = ("dw", 4 * n) if bits == 32 else ("sub", bits // 8)
  elif op in r3.GLOBAL_D16:
    bits, signed, sh = r3.GLOBAL_D16[op]
    n, kind, nb = 1, "d16", bits // 8
  elif op in r3.GLOBAL_STORES:
    n, bits = r3.GLOBAL_STORES[op]
    kind, nb = ("st", 4 * n) if bits == 32 else ("stsub", bits // 8)
  elif op in (36, 37): n, bits, kind, nb = 1, 8 * (op - 35), "sthi", op - 35
  else: raise _Slow
  vd, data, cache = f["vdst"], f["data"], []
  dword = kind in ("dw", "st")
  ar = _AR[n]
  top = (1 << 63) - nb

  def run(b: Batch) -> int:
    V = b.V
    act = None if b.mw is True else b.act()
    lo32 = V[va] if act is None else V[va][act]
    if not len(lo32): return nxt
    if sa is not None:
      base = b.sval(sa) | (b.sval(sa + 1) << 32)
      a = lo32.astype(np.intp)
      if type(base) is int:
        if not 0 <= base + off < top: return slow(b)
        a += base + off
      else:
        col = np.repeat(np.asarray(base, np.intp), b.W)
        a += (col if act is None else col[act]) + off
    else:
      hi32 = V[va + 1] if act is None else V[va + 1][act]
      a = hi32.astype(np.intp)
      a <<= 32
      a |= lo32
      if off: a += off
    mn, mx = int(a.min()), int(a.max())
    if mn < 0 or mx > top: return slow(b)  # past 2**63: leave the wrap-around to the per-wave path
    reg = region(emu, mn, mx + nb, cache)
    if reg is None: return slow(b)
    start, u8, u32 = reg
    a -= start
    if dword and u32 is not None and not (int(np.bitwise_or.reduce(a)) & 3):
      a >>= 2
      if kind == "dw":
        for i in range(n):
          w = a if i == 0 else a + i
          if act is None: V[vd + i][:] = u32[w]
          else: V[vd + i][act] = u32[w]
      elif n == 1: u32[a] = V[data] if act is None else V[data][act]
      else:
        cols = [V[data + i] if act is None else V[data + i][act] for i in range(n)]
        u32[a[:, None] + ar] = np.stack(cols, axis=1)
      return nxt
    if dword:  # unaligned: byte by byte
      idx = a[:, None] + np.arange(nb)
      if kind == "dw":
        vals = np.ascontiguousarray(u8[idx]).view(U32)  # (lanes, n)
        for i in range(n): _put_act(b, vd + i, act, vals[:, i])
      else:
        cols = np.stack([V[data + i] if act is None else V[data + i][act] for i in range(n)], axis=1)
        u8[idx] = cols.view(np.uint8).reshape(len(a), nb)
      return nxt
    if kind in ("sub", "d16"):
      v = u8[a].astype(U32) if nb == 1 else (u8[a].astype(U32) | (u8[a + 1].astype(U32) << U32(8)))
      if signed: v = ((v << U32(32 - bits)).view(I32) >> I32(32 - bits)).view(U32)
      if kind == "sub": _put_act(b, vd, act, v)
      else:
        old = V[vd] if act is None else V[vd][act]
        keep = U32(~(0xFFFF << sh) & MASK32)
        _put_act(b, vd, act, (old & keep) | ((v & U32(0xFFFF)) << U32(sh)))
      return nxt
    src = V[data] if act is None else V[data][act]
    if kind == "sthi": src = src >> U32(16)
    if nb == 1: u8[a] = (src & U32(0xFF)).astype(np.uint8)
    else: u8[a[:, None] + _AR[2]] = np.stack([src & U32(0xFF), (src >> U32(8)) & U32(0xFF)], axis=1).astype(np.uint8)
    return nxt
  return run


def _put_act(b: Batch, d: int, act: Any, vals: Any) -> None:
  if act is None: b.V[d][:] = vals
  else: b.V[d][act] = vals


def c_ds(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op = inst.op
  if op not in r3.DS_OPS: raise _Slow
  _, kind, bits, stride = r3.DS_OPS[op]
  nbytes = abs(bits) // 8
  if nbytes % 4: raise _Slow
  f, n = inst.f, nbytes // 4
  slow = fallback(emu, inst, pc, nxt)
  offs = [f["offset1"] << 8 | f["offset0"]] if kind in ("st", "ld") else [f["offset0"] * stride, f["offset1"] * stride]
  ar, vd = f["addr"], f["vdst"]
  datas = [f["data0"], f["data1"]][:len(offs)]

  def run(b: Batch) -> int:
    act = b.act()
    base = b.V[ar][act].astype(I64)
    if not len(base): return nxt
    cols = [(base + o) & MASK32 for o in offs]
    lb = b.lds_bytes
    for c in cols:
      if int(c.max()) + nbytes > lb or (c & 3).any(): return slow(b)
    gb = b.lds_base()[act]
    lds32 = b.lds[:(len(b.lds) // 4) * 4].view(U32)
    if kind.startswith("ld"):
      for j, c in enumerate(cols):
        w = (gb + c) >> 2
        for i in range(n): b.V[vd + j * n + i][act] = lds32[w + i]
      return nxt
    # stores: lane after lane, each lane's accesses in order (later lanes win)
    idx = np.stack([((gb + c) >> 2)[:, None] + np.arange(n) for c in cols], axis=1).reshape(-1)
    vals = np.stack([np.stack([b.V[dr + i][act] for i in range(n)], axis=1) for dr in datas], axis=1).reshape(-1)
    lds32[idx] = vals
    return nxt
  return run


def c_mubuf(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  if inst.op in (43, 44): return lambda b: nxt  # cache invalidates: no-ops here
  raise _Slow


_COMPILERS: dict[str, Callable[[Any, Inst, int, int], Op]] = {
  "SOP1": c_sop1, "SOP2": c_sop2, "SOPK": c_sopk, "SOPC": c_sopc, "SOPP": c_sopp, "SMEM": c_smem, "VOP1": c_vop1,
  "VOP2": c_vop2, "VOPC": c_vopc, "VOPD": c_vopd, "VOP3": c_vop3, "FLAT": c_flat, "DS": c_ds, "MUBUF": c_mubuf}

__all__ = ["compile_inst", "fallback", "fma32", "fmin32", "fmax32", "UnsupportedInstruction"]
