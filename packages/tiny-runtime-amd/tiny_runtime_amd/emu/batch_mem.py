"""Memory instructions of the batched engine: FLAT/GLOBAL loads and stores through numpy views of mapped memory,
LDS (DS) loads and stores, the cache-invalidate MUBUF no-ops."""
from __future__ import annotations

from typing import Any

import numpy as np

from tiny_runtime_amd.emu import isa as r3
from tiny_runtime_amd.emu.batch import Batch, host_span
from tiny_runtime_amd.emu.batch_ops import (I32, I64, U32, Op, Slow, compiles,
                                            fallback, sreader)
from tiny_runtime_amd.emu.isa import MASK32, NULL
from tiny_runtime_amd.emu.state import Inst, Memory


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


@compiles("FLAT")
def c_flat(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """FLAT (segment 0) and GLOBAL (segment 2) loads and stores: the active lanes' 64-bit addresses, one region of
  memory holding them all (else the per-wave path), dword accesses through a uint32 view when aligned, bytes
  otherwise; stores in lane order (a later lane's bytes win)."""
  f, op, seg = inst.f, inst.op, inst.f["seg"]
  if seg == 1: return _scratch(emu, inst, pc, nxt)
  if seg not in (0, 2): raise Slow
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
  else: raise Slow
  vd, data = f["vdst"], f["data"]
  cache: list[Any] = []
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
        stacked = np.stack([V[data + i] if act is None else V[data + i][act] for i in range(n)], axis=1)
        u8[idx] = stacked.view(np.uint8).reshape(len(a), nb)
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


def _scratch(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  """SCRATCH (FLAT segment 1) loads and stores on the batch's private byte columns: lane l's 32-bit offset is VGPR
  (when SVE) + SGPR (unless off) + offset; an access past the lane's bytes goes the per-wave way (which raises)."""
  f, op = inst.f, inst.op
  if op in r3.GLOBAL_LOADS:
    n, signed, bits = r3.GLOBAL_LOADS[op]
    kind, nb = ("dw", 4 * n) if bits == 32 else ("sub", bits // 8)
  elif op in r3.GLOBAL_STORES:
    n, bits = r3.GLOBAL_STORES[op]
    kind, nb, signed = ("st", 4 * n, False) if bits == 32 else ("stsub", bits // 8, False)
  else: raise Slow  # d16 forms and anything else: per wave
  slow = fallback(emu, inst, pc, nxt)
  va, sve, sa, off, vd, data = f["addr"], f["sve"], f["saddr"], f["offset"], f["vdst"], f["data"]
  sread = sreader(sa, inst) if sa != NULL else None

  def run(b: Batch) -> int:
    if not b.priv_ok: return slow(b)
    V, size = b.V, b.scratch_size or 0
    act = None if b.mw is True else b.act()
    lanes = np.arange(b.L, dtype=np.int64) if act is None else act.astype(np.int64)
    a = np.full(len(lanes), off, np.int64)
    if sve: a += V[va] if act is None else V[va][act]
    if sread is not None:
      sv = sread(b)
      a += sv if type(sv) is int else np.repeat(np.asarray(sv, np.int64), b.W)[lanes]
    a &= MASK32
    if not len(a): return nxt
    if int(a.max()) + nb > size: return slow(b)
    a += lanes * size
    mem = b.priv()
    if kind in ("dw", "st") and size % 4 == 0 and not (int(np.bitwise_or.reduce(a)) & 3):
      m32 = mem.view(U32)
      w = a >> 2
      if kind == "dw":
        for i in range(n): _put_act(b, vd + i, act, m32[w + i])
      else:
        for i in range(n): m32[w + i] = V[data + i] if act is None else V[data + i][act]  # lanes never overlap
      return nxt
    idx = a[:, None] + np.arange(nb)
    if kind == "dw":
      vals = np.ascontiguousarray(mem[idx]).view(U32)
      for i in range(n): _put_act(b, vd + i, act, vals[:, i])
    elif kind == "st":
      mem[idx] = np.stack([V[data + i] if act is None else V[data + i][act] for i in range(n)], axis=1) \
        .view(np.uint8).reshape(len(a), nb)
    elif kind == "sub":
      v = mem[a].astype(U32) if nb == 1 else (mem[a].astype(U32) | (mem[a + 1].astype(U32) << U32(8)))
      if signed: v = ((v << U32(32 - bits)).view(I32) >> I32(32 - bits)).view(U32)
      _put_act(b, vd, act, v)
    else:
      src = V[data] if act is None else V[data][act]
      mem[idx] = np.stack([src & U32(0xFF), (src >> U32(8)) & U32(0xFF)], axis=1)[:, :nb].astype(np.uint8)
    return nxt
  return run


def _put_act(b: Batch, d: int, act: Any, vals: Any) -> None:
  if act is None: b.V[d][:] = vals
  else: b.V[d][act] = vals


@compiles("DS")
def c_ds(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  op = inst.op
  if op not in r3.DS_OPS: raise Slow
  _, kind, bits, stride = r3.DS_OPS[op]
  nbytes = abs(bits) // 8
  if nbytes % 4: raise Slow
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


@compiles("MUBUF")
def c_mubuf(emu: Any, inst: Inst, pc: int, nxt: int) -> Op:
  if inst.op in (43, 44): return lambda b: nxt  # cache invalidates: no-ops here
  raise Slow
