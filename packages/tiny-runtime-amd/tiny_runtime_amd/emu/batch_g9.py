"""CDNA3 (GFX9) formats of the batched engine: the G9* formats `cdna3.decode9` produces for what GFX9 does
differently from RDNA3 (see cdna3.py). Each computes what `cdna3.CDNA3Emulator`'s handler computes; the rest (16-bit
ops, SDWA, packed float32, MFMA, MODE register writes) runs through the per-wave fallback."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tiny_runtime_amd.emu.batch import Batch, LaneMask
from tiny_runtime_amd.emu.batch_ops import (I32, I64, SREGS, U32, U64, Op, Slow, compare32, compiles, fallback,
                                            lanemap, put, sreader, sreader64, vreader)
from tiny_runtime_amd.emu.isa import EXEC_LO, INLINE_F32, LITERAL, MASK32, NULL, VOP3_EXTRA, vopc_compare
from tiny_runtime_amd.emu.state import Inst


@compiles("G9NOP")
def c_g9nop(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  return lambda b: nxt  # cache write-back/invalidate: memory is coherent here


def _v64(code: int, inst: Inst) -> Callable[[Batch], Any]:
  """A 64-bit integer operand as cdna3's col64 reads it: a VGPR pair, or a 64-bit scalar (no float constants)."""
  if code >= 256:
    r = code - 256
    return lambda b: b.V[r].astype(U64) | (b.V[r + 1].astype(U64) << U64(32))
  if code in INLINE_F32 or code == LITERAL: raise Slow
  s = sreader64(code, inst)

  def rd(b: Batch) -> Any:
    x = s(b)
    return U64(x) if type(x) is int else np.repeat(np.asarray(x).astype(U64), b.W)
  return rd


def _put64(b: Batch, d: int, r: Any) -> None:
  put(b, d, (r & U64(MASK32)).astype(U32))
  put(b, d + 1, (r >> U64(32)).astype(U32))


@compiles("G9VOP3")
def c_g9vop3(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """v_lshl_add_u64, v_mbcnt_lo/hi_u32_b32, and the VOP3-only ops of cdna3.VOP3_EXTRA (lane by lane)."""
  f, op, d = inst.f, inst.op, inst.f["vdst"]
  if f["abs"] or f["neg"] or f["clamp"] or f["omod"] or f["opsel"]: raise Slow
  if op == 520:  # D = (S0 << S1[2:0]) + S2, 64-bit
    a, sh, c = _v64(f["src0"], inst), vreader(f["src1"], inst), _v64(f["src2"], inst)
    def lshl_add(b: Batch) -> int:
      _put64(b, d, (a(b) << (np.asarray(sh(b), U64) & U64(7))) + c(b))
      return nxt
    return lshl_add
  if op in (652, 653):  # popcount(S0 & the mask bits of the lanes below this one) + S1
    a, c = vreader(f["src0"], inst), vreader(f["src1"], inst)
    def mbcnt(b: Batch) -> int:
      below = (U64(1) << (np.arange(b.L, dtype=U64) % U64(b.W))) - U64(1)  # lane i: the bits of lanes 0..i-1
      m = (below & U64(MASK32)) if op == 652 else (below >> U64(32))
      put(b, d, (np.bitwise_count(np.asarray(a(b), U32) & m.astype(U32)).astype(U32) + c(b)).astype(U32))
      return nxt
    return mbcnt
  return lanemap(VOP3_EXTRA[inst.name], [vreader(f[f"src{i}"], inst) for i in range(3)], d, nxt)


@compiles("G9VOPC")
def c_g9vopc(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """V_CMP/V_CMPX (e32: to VCC, e64: to an SGPR pair); V_CMPX also writes EXEC (GFX9 writes both). 32-bit compares
  on columns, with |x| / -x on float operands; class compares lane by lane."""
  f, rop = inst.f, inst.op
  if rop < 0 or f["clamp"] or f["omod"] or f["opsel"]: raise Slow
  base = rop & 0x7F
  sdst, cmpx = f["sdst"], bool(rop & 0x80)
  srcs = [vreader(f[f"src{i}"], inst) for i in range(2)]
  cmp = compare32(base)
  if cmp is not None:
    fn, flt = cmp
    if flt:
      srcs = [_fmod(rd, f["abs"] >> i & 1, f["neg"] >> i & 1) for i, rd in enumerate(srcs)]
      fn = (lambda g: lambda x, y: g(np.asarray(x).view(np.float32), np.asarray(y).view(np.float32)))(fn)
  elif base == 0x7E:  # class_f32: per lane (src0 takes |x| / -x)
    _, lane_fn = vopc_compare(rop)
    srcs[0] = _fmod(srcs[0], f["abs"] & 1, f["neg"] & 1)
    def fn(x: Any, y: Any) -> Any:
      xs, ys = np.broadcast_arrays(np.asarray(x, U32), np.asarray(y, U32))
      return np.array(list(map(lane_fn, xs.tolist(), ys.tolist())), dtype=bool).reshape(xs.shape)
  else: raise Slow
  a, c = srcs

  def run(b: Batch) -> int:
    r = fn(a(b), c(b))
    if not r.shape: r = np.full(b.L, bool(r))
    if b.mw is not True: r = r & b.mw
    b.set_mask(sdst, r)
    if cmpx: b.set_mask(EXEC_LO, r)
    return nxt
  return run


def _fmod(rd: Callable[[Batch], Any], absv: int, neg: int) -> Callable[[Batch], Any]:
  if not (absv or neg): return rd
  am, nm = U32(0x7FFFFFFF if absv else MASK32), U32(0x80000000 if neg else 0)
  return lambda b: (np.asarray(rd(b), U32) & am) ^ nm


_SAVEEXEC64: dict[int, Callable[[Any, Any], Any]] = {
  32: lambda s, e: s & e, 33: lambda s, e: s | e, 34: lambda s, e: s ^ e, 35: lambda s, e: s & ~e,
  36: lambda s, e: s | ~e, 37: lambda s, e: ~(s & e), 38: lambda s, e: ~(s | e), 39: lambda s, e: ~(s ^ e),
  51: lambda s, e: ~s & e, 52: lambda s, e: ~s | e}


@compiles("G9SOP1")
def c_g9sop1(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """s_*_saveexec_b64 on lanes: sdst = EXEC; EXEC = fn(src, EXEC); SCC = EXEC != 0."""
  op, d, c = inst.op, inst.f["sdst"], inst.f["ssrc0"]
  if op not in _SAVEEXEC64 or d == NULL or not (c < 106 or c in (106, EXEC_LO)) or not (d < 106 or d == 106):
    raise Slow
  fn, slow = _SAVEEXEC64[op], fallback(emu, inst, pc, nxt)

  def run(b: Batch) -> int:
    if b.wm is not None or b.W != 64: return slow(b)
    old = b.S[EXEC_LO], b.S[EXEC_LO + 1]
    src, ex = b.mask_lanes(c), b.mask_lanes(EXEC_LO)
    src = np.ones(b.L, bool) if src is True else src
    ex = np.ones(b.L, bool) if ex is True else ex
    new = fn(src, ex)
    b.S[d], b.S[d + 1] = old
    b.S[EXEC_LO], b.S[EXEC_LO + 1] = LaneMask(new, 0), LaneMask(new, 1)
    b.refresh_mask()
    b.set_scc(new.reshape(b.N, b.W).any(axis=1).astype(I64) if b.N > 1 else int(new.any()))
    return nxt
  return run


@compiles("G9MOV64")
def c_g9mov64(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """v_mov_b64: a VGPR pair from a VGPR pair, an SGPR pair or an inline constant (a float one as a double)."""
  f = inst.f
  if f["abs"] or f["neg"] or f["clamp"] or f["omod"] or f["src0"] == LITERAL: raise Slow
  code, d = f["src0"], f["vdst"]
  if code >= 256:  # a VGPR pair: two column copies, ordered so an overlapping source is read before it is written
    r = code - 256
    order = ((1, 0) if d > r else (0, 1))

    def mov_pair(b: Batch) -> int:
      for i in order: put(b, d + i, b.V[r + i])
      return nxt
    return mov_pair
  if code in INLINE_F32:
    from tiny_runtime_amd.emu.isa import INLINE_F64
    v = U64(INLINE_F64[code])
    rd: Callable[[Batch], Any] = lambda b: v  # noqa: E731
  else: rd = _v64(code, inst)

  def run(b: Batch) -> int:
    _put64(b, d, rd(b))
    return nxt
  return run


__all__ = ["c_g9nop", "c_g9vop3", "c_g9vopc", "c_g9sop1", "c_g9mov64", "I32", "SREGS", "sreader"]
