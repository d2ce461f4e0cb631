"""Scalar ALU, SOPP (branches) and SMEM of the batched engine: SGPRs are ints when every wave holds the same value,
else int64 arrays of per-wave values; lane masks (EXEC, VCC, compare results) stay lanes (`batch.LaneMask`) through
the bitwise ops that combine them."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tiny_runtime_amd.emu import isa as r3
from tiny_runtime_amd.emu.batch import END, SPLIT, Batch, LaneMask
from tiny_runtime_amd.emu.batch_ops import (I64, SREGS, U64, Op, Slow, compiles,
                                            fallback, sreader, sreader64)
from tiny_runtime_amd.emu.isa import EXEC_LO, MASK32, NULL, VCC_HI, VCC_LO
from tiny_runtime_amd.emu.state import Inst


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
def _lshl_add(n: int) -> Callable[[Any, Any], Any]:
  """s_lshl<n>_add_u32 before the wrap: (a << n) + b."""
  return lambda a, b: (a << n) + b


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
  46: (lambda a, b: (_i32(a) * _i32(b)) >> 32, None),
  45: (_u64mul_hi, None),
  **{13 + n: (_lshl_add(n), lambda a, b, r: _bit(r > MASK32)) for n in (1, 2, 3, 4)},
  42: (lambda a, b: (((1 << (a & 31)) - 1) << (b & 31)) & MASK32, None),
  50: (lambda a, b: (a & 0xFFFF) | ((b & 0xFFFF) << 16), None),
  51: (lambda a, b: (a & 0xFFFF) | (b & 0xFFFF0000), None),
  52: (lambda a, b: (a >> 16) | (b & 0xFFFF0000), None),
}
# SOP2 b32 ops done on lane masks
_LANE_BITWISE: dict[int, Callable[[Any, Any], Any]] = {22: np.logical_and, 24: np.logical_or, 26: np.logical_xor,
                                                     34: lambda a, b: a & ~b, 36: lambda a, b: a | ~b}
_LANE_BITWISE64 = {23: 22, 25: 24, 27: 26, 35: 34, 37: 36}     # b64 twins (wave64 masks)


@compiles("SOP2")
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
  if op == 39:  # s_bfe_i32 (per-wave widths go the per-wave way)
    a, bb = sreader(c0, inst), sreader(c1, inst)
    slow = fallback(emu, inst, pc, nxt)
    def bfe_i(b: Batch) -> int:
      x, y = a(b), bb(b)
      if _any(x) or _any(y): return slow(b)
      r = r3._bfe_i32(x, y & 31, (y >> 16) & 0x7F)
      b.sset(d, r)
      b.set_scc(int(r != 0))
      return nxt
    return bfe_i
  raise Slow


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
  """64-bit SOP2 ops on SGPR pairs (ints, or uint64 per-wave values): shifts, bitwise ops, s_cselect_b64."""
  op, d = inst.op, inst.f["sdst"]
  a = sreader64(inst.f["ssrc0"], inst)
  shift = op in (9, 11, 13)
  bb = sreader(inst.f["ssrc1"], inst) if shift else sreader64(inst.f["ssrc1"], inst)
  m64 = (1 << 64) - 1

  def run(b: Batch) -> int:
    x, y = a(b), bb(b)
    if _any(x) or _any(y) or (op == 49 and _any(b.scc)):
      r: Any = _b64_cols(op, x, y, b.scc)
      b.sset(d, (r & U64(MASK32)).astype(I64))
      if d != NULL: b.sset(d + 1, (r >> U64(32)).astype(I64))
      if op != 49: b.set_scc((r != 0).astype(I64))
      return nxt
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


def _u64(v: Any) -> Any:
  return np.asarray(v, U64) if type(v) is int else np.asarray(v).astype(U64)


def _b64_cols(op: int, x: Any, y: Any, scc: Any) -> np.ndarray:
  """The 64-bit SOP2 ops on per-wave values (uint64 arrays; a shift amount or scc may be per wave)."""
  x = _u64(x)
  if op in (9, 11, 13):
    sh = np.asarray(np.asarray(y, I64) & 63).astype(U64)
    if op == 9: return np.left_shift(x, sh)
    if op == 11: return np.right_shift(x, sh)
    return np.right_shift(x.view(I64), sh.astype(I64)).view(U64)
  y = _u64(y)
  if op == 23: return x & y
  if op == 25: return x | y
  if op == 27: return x ^ y
  if op == 35: return x & ~y
  if op == 37: return x | ~y
  return np.where(np.asarray(scc) != 0, x, y).astype(U64)


def _lanewise(d: int, c0: int, c1: int, lane_op: Callable[[Any, Any], Any], wide: bool, scalar: Op, nxt: int) -> Op:
  """A bitwise SOP2 whose operands are lane masks (EXEC, VCC, compare results): computed on lanes (b32 ops on wave32,
  b64 ops on wave64 pairs), the result stays a LaneMask. Other operands go the scalar way."""
  regs = c0 in SREGS and c1 in SREGS and d != NULL and c0 not in (VCC_HI, EXEC_LO + 1) and \
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


@compiles("SOP1")
def c_sop1(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op, d, c = inst.op, inst.f["sdst"], inst.f["ssrc0"]
  if op == 0:  # s_mov_b32 (a LaneMask moves as it is)
    if c in SREGS and d != NULL and d not in (EXEC_LO, EXEC_LO + 1):
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
    if c in SREGS and d not in (NULL, EXEC_LO, EXEC_LO - 1, EXEC_LO + 1) and c not in (VCC_HI, EXEC_LO + 1):
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
  if op in (14, 15):  # s_sext_i32_i8 / s_sext_i32_i16
    rd, sign = sreader(c, inst), 0x80 if op == 14 else 0x8000
    def sext(b: Batch) -> int:
      b.sset(d, (((rd(b) & (2 * sign - 1)) ^ sign) - sign) & MASK32)
      return nxt
    return sext
  if op == 30:  # s_not_b32
    rd = sreader(c, inst)
    def snot(b: Batch) -> int:
      v = ~rd(b) & MASK32
      b.sset(d, v)
      b.set_scc(_bit(v != 0))
      return nxt
    return snot
  raise Slow


_SAVEEXEC_LANES: dict[int, Callable[[Any, Any], Any]] = {
  32: lambda s, e: s & e, 34: lambda s, e: s | e, 36: lambda s, e: s ^ e, 38: lambda s, e: ~(s & e),
  40: lambda s, e: ~(s | e), 42: lambda s, e: ~(s ^ e), 44: lambda s, e: ~s & e, 46: lambda s, e: ~s | e,
  48: lambda s, e: s & ~e, 50: lambda s, e: s | ~e}


def _saveexec32(emu: Any, inst: Inst, nxt: int) -> Op:
  """s_*_saveexec_b32 (wave32): sdst = EXEC; EXEC = fn(src, EXEC); SCC = EXEC != 0, computed on lanes."""
  op, d, c = inst.op, inst.f["sdst"], inst.f["ssrc0"]
  fn = _SAVEEXEC_LANES[op]
  slow = fallback(emu, inst, nxt - inst.size, nxt)
  if c not in SREGS: return slow

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


@compiles("SOPK")
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
  raise Slow


_SOPC_FN: list[Callable[[Any, Any], Any]] = [lambda a, b: a == b, lambda a, b: a != b, lambda a, b: a > b,
                                             lambda a, b: a >= b, lambda a, b: a < b, lambda a, b: a <= b]


@compiles("SOPC")
def c_sopc(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op = inst.op
  if op in (16, 17):  # s_cmp_eq_u64 / s_cmp_lg_u64 on SGPR pairs
    x64, y64 = sreader64(inst.f["ssrc0"], inst), sreader64(inst.f["ssrc1"], inst)
    def cmp64(b: Batch) -> int:
      x, y = x64(b), y64(b)
      eq = x == y if not (_any(x) or _any(y)) else np.asarray(_u64(x) == _u64(y))
      b.set_scc(_bit(eq if op == 16 else ~eq if isinstance(eq, np.ndarray) else not eq))
      return nxt
    return cmp64
  if op >= 12: raise Slow
  a, bb = sreader(inst.f["ssrc0"], inst), sreader(inst.f["ssrc1"], inst)
  fn = _SOPC_FN[op % 6]
  signed = op < 6

  def run(b: Batch) -> int:
    x, y = a(b), bb(b)
    b.set_scc(_bit(fn(_i32(x), _i32(y)) if signed else fn(x, y)))
    return nxt
  return run


@compiles("SOPP")
def c_sopp(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op, imm = inst.op, inst.f["simm16"]
  if op == 48: return lambda b: END
  if op in (0, 3, 4, 5, 7, 8, 9, 18, 31, 53, 54, 61) or (op == 17 and imm == 0): return lambda b: nxt
  target = nxt + r3.sext(imm, 16) * 4
  if op == 32: return lambda b: target
  if op not in (33, 34, 35, 36, 37, 38): raise Slow

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


@compiles("SMEM")
def c_smem(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """s_load_b32..b512: one read when every wave loads the same address, else one read per distinct address."""
  if inst.op not in r3.SMEM_LOADS: raise Slow
  f, n = inst.f, r3.SMEM_LOADS[inst.op]
  sb, sd, off, so = f["sbase"], f["sdata"], f["offset"], f["soffset"]

  def run(b: Batch) -> int:
    lo, hi = b.sval(sb), b.sval(sb + 1)
    o = off + (b.sval(so) if so != NULL else 0)
    if not (_any(lo) or _any(hi) or _any(o)):
      vals = np.frombuffer(emu.mem.read(((lo | (hi << 32)) + o) & ~3, 4 * n), dtype="<u4")
      for i in range(n): b.sset(sd + i, int(vals[i]))
      return nxt
    addr = ((_u64(lo) | (_u64(hi) << U64(32))) + np.asarray(o, I64).astype(U64)) & ~U64(3)
    addr = np.broadcast_to(addr, (b.N,))
    part = addr if b.wm is None else addr[b.wm]
    uniq, inv = np.unique(part, return_inverse=True)
    rows = np.stack([np.frombuffer(emu.mem.read(int(a), 4 * n), dtype="<u4") for a in uniq]).astype(I64)
    full = np.zeros((b.N, n), I64)
    if b.wm is None: full[:] = rows[inv]
    else: full[b.wm] = rows[inv]
    for i in range(n): b.sset(sd + i, full[:, i])
    return nxt
  return run
