"""Vector ALU of the batched engine (VOP1, VOP2, VOP3, VOPC, VOPD) on whole lane columns, with the per-wave
interpreter's exact results (see batch_ops)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tiny_runtime_amd.emu import isa as r3
from tiny_runtime_amd.emu.batch import Batch
from tiny_runtime_amd.emu.batch_ops import (F32, I32, I64, SREGS, U32, U64, Op, Slow, compare32, compiles,
                                            fma32, fmax32, fmin32, freader, fview, lanemap, lanemap64, modded,
                                            put, putf, sqrt32, sreader, sreader64, vreader, vreader64)
from tiny_runtime_amd.emu.isa import EXEC_LO, INLINE_F32, MASK32, VCC_LO, vopc_compare
from tiny_runtime_amd.emu.state import Inst


# ***** vector ALU *****
def _f2(kind: int) -> Callable[[Any, Any], np.ndarray]:
  """VOP2 float32 ops by column (operand order chosen so a NaN result's payload follows the reference)."""
  if kind == 3: return lambda x, y: np.add(y, x)
  if kind == 4: return lambda x, y: np.subtract(x, y)
  if kind == 5: return lambda x, y: np.subtract(y, x)
  if kind == 8: return lambda x, y: np.multiply(y, x)
  if kind == 15: return fmin32
  if kind == 16: return fmax32
  raise Slow


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
  raise Slow


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


@compiles("VOP2")
def c_vop2(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  f, op = inst.f, inst.op
  d, s0, s1 = f["vdst"], f["src0"], 256 + f["vsrc1"]
  if op in (3, 4, 5, 8): return _fast_f2(op, freader(s0, inst), freader(s1, inst), d, nxt)
  if op in r3.VOP2_16:  # 16-bit: halves by register bit 7
    _, _, fp, fn = r3.VOP3_16[r3.VOP2_16[op]]
    return _op16(fn, [col16(s0, inst, fp), col16(s1, inst, fp)], d & 0x7F, d >> 7, nxt)
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
  raise Slow


@compiles("VOP1")
def c_vop1(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  f, op = inst.f, inst.op
  d, s0 = f["vdst"], f["src0"]
  if op == 2: return _readfirstlane(vreader(s0, inst), d, nxt)
  if op == 28: return _op16(lambda x: x, [col16(s0, inst, False)], d & 0x7F, d >> 7, nxt)  # v_mov_b16
  if op in r3.VOP1_16:
    _, _, fp, fn = r3.VOP3_16[r3.VOP1_16[op]]
    return _op16(fn, [col16(s0, inst, fp)], d & 0x7F, d >> 7, nxt)
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
  raise Slow


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


@compiles("VOPC")
def c_vopc(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op = inst.op
  base = op & 0x7F
  cmp = compare32(base)
  if cmp is None:
    if 0x30 <= base < 0x40 or base < 0x10 or base == 0x7D:  # 16-bit: VGPR halves by register bit 7
      fp16 = base < 0x10 or base == 0x7D
      srcs = [col16(inst.f["src0"], inst, fp16), col16(256 + inst.f["vsrc1"], inst, fp16)]
      return _cmp_lanes(vopc_compare(op)[1], srcs, bool(op & 0x80), VCC_LO, nxt)
    if 0x20 <= base < 0x30 or 0x50 <= base < 0x60:  # 64-bit: VGPR / SGPR pairs
      fp = base < 0x30
      srcs = [vreader64(inst.f["src0"], inst, fp), vreader64(256 + inst.f["vsrc1"], inst, fp)]
      return _cmp_lanes(vopc_compare(op)[1], srcs, bool(op & 0x80), VCC_LO, nxt)
    raise Slow
  fn, flt = cmp
  rdr = freader if flt else vreader
  a, c = rdr(inst.f["src0"], inst), rdr(256 + inst.f["vsrc1"], inst)
  cmpx = bool(op & 0x80)

  def run(b: Batch) -> int:
    _vopc_write(b, fn(a(b), c(b)), cmpx, VCC_LO)
    return nxt
  return run


@compiles("VOPD")
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
  raise Slow


# VOP3 opcodes whose abs/neg modifiers the reference accepts (see rdna3.Emulator.vop3)
# ***** 16-bit ops (true16: a VGPR half) and compares lane by lane, with the tables' own functions *****
def col16(code: int, inst: Inst, fp: bool) -> Callable[[Batch], Any]:
  """A 16-bit operand as rdna3.Emulator.col16 reads it: a VGPR half (v.l / v.h by bit 7 of the register) or a
  scalar's low 16 bits (float inline constants as halves for float ops)."""
  if code >= 256:
    r, sh = (code - 256) & 0x7F, U32(16 * ((code - 256) >> 7))
    return lambda b: (b.V[r] >> sh) & U32(0xFFFF)
  if fp and code in INLINE_F32:
    h = U32(r3._f16_bits(r3.f32(INLINE_F32[code])))
    return lambda b: h
  s = sreader(code, inst)
  return lambda b: b.lanes_u32(s(b)) & U32(0xFFFF)


def _vals(v: Any, act: Any, b: Batch) -> list[int]:
  if isinstance(v, np.ndarray) and v.ndim: return v[act].tolist()
  return [int(v)] * (b.L if b.mw is True else len(act))


def _op16(fn: Callable[..., int], srcs: list[Callable[[Batch], Any]], reg: int, hi: int, nxt: int) -> Op:
  """A 16-bit op of the tables on the active lanes (rdna3.vec_f16: float ops through whole columns of halves), the
  result into the low (hi = 0) or high half of VGPR `reg`, the other half kept."""
  sh, keep = U32(16 * hi), U32(~(0xFFFF << (16 * hi)) & MASK32)

  def run(b: Batch) -> int:
    act = b.act()
    res = np.array(r3.vec_f16(fn, *(_vals(s(b), act, b) for s in srcs)), dtype=U64).astype(U32)
    vd = b.V[reg]
    vd[act] = (vd[act] & keep) | ((res & U32(0xFFFF)) << sh)
    return nxt
  return run


def _cmp_lanes(fn: Callable[[int, int], bool], srcs: list[Callable[[Batch], Any]], cmpx: bool, d: int,
               nxt: int) -> Op:
  """A compare with the table's per-lane predicate on the active lanes: the mask to SGPR d (v_cmpx: to EXEC)."""
  def run(b: Batch) -> int:
    act = b.act()
    bits = np.fromiter(map(fn, *(_vals(s(b), act, b) for s in srcs)), dtype=bool)
    r = np.zeros(b.L, bool)
    r[act] = bits
    b.set_mask(EXEC_LO if cmpx else d, r)
    return nxt
  return run


def _vop3_16(inst: Inst, f: dict[str, int], nxt: int) -> Op:
  """16-bit VOP3 ops and compares (rdna3.Emulator.vop3_16): op_sel bit i picks the high half of source i, bit 3 the
  destination's half; |x| / -x act on float halves."""
  op = inst.op
  if f["omod"] or f["clamp"] or op in (0x25D, 0x136): raise Slow
  fp = r3.VOP3_16[op][2] if op in r3.VOP3_16 else (op & 0x7F < 0x10 or op & 0x7F == 0x7D)

  def src(i: int) -> Callable[[Batch], Any]:
    code, sh = f[f"src{i}"], U32(16 * (f["opsel"] >> i & 1))
    if fp and code in INLINE_F32:
      h = U32(r3._f16_bits(r3.f32(INLINE_F32[code])))
      rd: Callable[[Batch], Any] = lambda b: h  # noqa: E731
    else:
      v = vreader(code, inst)
      rd = lambda b: (v(b) >> sh) & U32(0xFFFF)  # noqa: E731
    if fp and (f["abs"] >> i & 1 or f["neg"] >> i & 1):
      am, nm = U32(0x7FFF if f["abs"] >> i & 1 else 0xFFFF), U32(0x8000 if f["neg"] >> i & 1 else 0)
      return lambda b: (rd(b) & am) ^ nm
    return rd
  if op < 0x100:
    _, cmp = r3.vopc_compare(op)
    return _cmp_lanes(cmp, [src(0), src(1)], bool(op & 0x80), f["vdst"], nxt)
  _, n, _, fn = r3.VOP3_16[op]
  return _op16(fn, [src(i) for i in range(n)], f["vdst"], f["opsel"] >> 3 & 1, nxt)


def _mods_ok(op: int) -> bool:
  return op in (0x101, 0x213, 0x227, 0x237, 0x2FC, 0x31C) or 0x100 + 3 <= op <= 0x100 + 16 or op < 0x100


@compiles("VOP3")
def c_vop3(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  f, op = dict(inst.f), inst.op
  if op in r3.VOP3SD: f.update(abs=0, opsel=0, clamp=0)
  if op in r3.VOP3_16 or (op < 0x100 and (0x30 <= op & 0x7F < 0x40 or op & 0x7F < 0x10 or op & 0x7F == 0x7D)):
    return _vop3_16(inst, f, nxt)
  if f["omod"] or f["clamp"] or f["opsel"]: raise Slow
  if op in (0x136, 0x25D, 0x25B, 0x25C, 0x1EA, 0x1EB, 0x311, 0x12F): raise Slow
  d = f["vdst"]

  def src(i: int) -> Callable[[Batch], Any]:
    return modded(vreader(f[f"src{i}"], inst), f["abs"] >> i & 1, f["neg"] >> i & 1)
  if op < 0x100:  # VOPC promoted: the mask to an SGPR (v_cmpx: to EXEC only)
    cmp = compare32(op & 0x7F)
    base = op & 0x7F
    if cmp is None and (0x20 <= base < 0x30 or 0x50 <= base < 0x60):  # 64-bit operands
      if 0x20 <= base < 0x30:
        srcs = [_mod64(vreader64(f[f"src{i}"], inst, True), f["abs"] >> i & 1, f["neg"] >> i & 1) for i in range(2)]
      else: srcs = [vreader64(f[f"src{i}"], inst, False) for i in range(2)]
      return _cmp_lanes(vopc_compare(op)[1], srcs, bool(op & 0x80), d, nxt)
    if cmp is None: raise Slow
    fn, flt = cmp
    a, c = src(0), src(1)
    if flt: a, c = fview(a), fview(c)
    cmpx = bool(op & 0x80)
    def vopc(b: Batch) -> int:
      _vopc_write(b, fn(a(b), c(b)), cmpx, d)
      return nxt
    return vopc
  if op in r3.VOP3_F64:
    n = 3 if op in (0x214, 0x228) else 2
    srcs = [_mod64(vreader64(f[f"src{i}"], inst, True), f["abs"] >> i & 1, f["neg"] >> i & 1) for i in range(n)]
    return lanemap64(r3.VOP3_F64[op][1], srcs, d, True, nxt)
  if (f["abs"] or f["neg"]) and not _mods_ok(op): raise Slow
  if op in (0x213, 0x237): return _fma_op(fview(src(0)), fview(src(1)), fview(src(2)), d, nxt)
  if op == 0x101:
    if f["src2"] not in SREGS: raise Slow
    return _cndmask(src(0), src(1), f["src2"], d, nxt)
  if 0x100 <= op < 0x180 and op not in r3.VOP3SD:
    o = op - 0x100
    if o in (3, 4, 5, 8): return _fast_f2(o, fview(src(0)), fview(src(1)), d, nxt)
    if o in _F2_OPS: return _binop(_f2(o), fview(src(0)), fview(src(1)), d, True, nxt)
    if o in _I2_OPS: return _binop(_i2(o), src(0), src(1), d, False, nxt)
    if o == 43: return _fma_op(fview(src(0)), fview(src(1)), freader(256 + d, inst), d, nxt)
    if o in r3.VOP2 and o not in r3.VOP2_16: return lanemap(r3.VOP2[o][1], [src(0), src(1)], d, nxt)
    raise Slow
  if 0x180 <= op < 0x200:
    o = op - 0x180
    if o not in r3.VOP1 or o in r3.VOP1_F64: raise Slow
    return _vop1(o, src(0), d, nxt)
  if op in _VOP3_NATIVE: return _tri(_VOP3_NATIVE[op], src(0), src(1), src(2), d, nxt)
  if op in r3.VOP3: return lanemap(r3.VOP3[op][1], [src(0), src(1), src(2)], d, nxt)
  if op == 0x360 and f["src0"] >= 256: return _readlane(f["src0"] - 256, sreader(f["src1"], inst), d, nxt)
  if op == 0x361: return _writelane(sreader(f["src0"], inst), sreader(f["src1"], inst), d, nxt)

  if op == 0x2FC: return _div_scale(src(0), d, f["sdst"], nxt)
  if op in (0x120, 0x121, 0x122, r3.VOP3_ADD_CO_U32, r3.VOP3_SUB_CO_U32):
    if op < 0x200 and f["src2"] not in SREGS: raise Slow
    return _carry_vop3(op, src(0), src(1), f["src2"], d, f["sdst"], nxt)
  if op == r3.VOP3_MAD_U64_U32: return _mad_u64(src(0), src(1), f["src2"], inst, d, f["sdst"], nxt)
  if op in (r3.VOP3_LSHLREV_B64, 0x33D, 0x33E): return _shift64(op, src(0), f["src1"], inst, d, nxt)
  raise Slow


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


def _mod64(rd: Callable[[Batch], Any], absv: int, neg: int) -> Callable[[Batch], Any]:
  """VOP3 |x| / -x on a float64 pattern operand (bit 63)."""
  if not (absv or neg): return rd
  am, nm = U64((1 << 63) - 1 if absv else (1 << 64) - 1), U64(1 << 63 if neg else 0)
  return lambda b: (rd(b) & am) ^ nm


def _writelane(val: Callable[[Batch], Any], sel: Callable[[Batch], Any], d: int, nxt: int) -> Op:
  """v_writelane_b32: per wave, one lane (the selector & lanes-1) of VGPR d gets a scalar, whatever EXEC says."""
  def run(b: Batch) -> int:
    waves = np.arange(b.N, dtype=np.int64)
    idx = waves * b.W + (np.broadcast_to(np.asarray(sel(b), I64), (b.N,)) & (b.W - 1))
    v = np.broadcast_to(np.asarray(val(b), I64), (b.N,))
    if b.wm is not None: idx, v = idx[b.wm], v[b.wm]
    b.V[d][idx] = v.astype(U32)
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
  """v_mad_u64_u32: D(64) = S0 * S1 + S2(64), the carry out of the 65-bit sum to sdst."""
  if code2 >= 256:
    r2 = code2 - 256
    z = lambda b: b.V[r2].astype(U64) | (b.V[r2 + 1].astype(U64) << U64(32))  # noqa: E731
  elif code2 in INLINE_F32: raise Slow
  else:
    s64 = sreader64(code2, inst)
    def z(b: Batch) -> Any:
      v = s64(b)
      return U64(v) if type(v) is int else np.repeat(v, b.W)

  def run(b: Batch) -> int:
    addend = z(b)
    r = np.asarray(a(b), U64) * np.asarray(c(b), U64) + addend  # the product is < 2**64: the add alone carries
    put(b, d, (r & U64(MASK32)).astype(U32))
    put(b, d + 1, (r >> U64(32)).astype(U32))
    b.set_mask(sdst, np.broadcast_to(r < addend, (b.L,)).copy())
    return nxt
  return run


def _shift64(op: int, sh: Callable[[Batch], Any], code1: int, inst: Inst, d: int, nxt: int) -> Op:
  if code1 < 256: raise Slow
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
