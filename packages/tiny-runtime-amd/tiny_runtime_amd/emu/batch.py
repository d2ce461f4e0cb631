"""Batched execution for the RDNA3/CDNA3 emulators: many waves in lockstep, every VGPR one numpy column.

The per-wave interpreter (`rdna3.Emulator.steps_until_barrier`) pays Python's dispatch cost once per instruction and
wave, on lists of 32 ints. Here the waves of a dispatch (every work-group, or a chunk of them) run together: a VGPR is
one uint32 column of N waves x W lanes, an SGPR is one Python int when every wave holds the same value (the common
case: kernel arguments, loop counters) or an int64 array of N per-wave values, and each instruction is decoded once
per code object into a closure (`batch_ops.compile_inst`) that does its work on whole columns.

Semantics are the per-wave interpreter's, bit for bit (tests/test_emu_batch.py runs kernels and random instruction
streams on both), with one documented freedom: when both operands of a float op are NaN, which operand's payload the
result carries is not fixed (the reference itself is not consistent there). Instructions without a column
implementation run through `fallback`: the per-wave handler of `rdna3.Emulator` (or `cdna3.CDNA3Emulator`) on a `Wave`
loaded from and stored back to the batch, one participating wave after the other (the reference's wave order).

Control flow: scalar branches are per wave. While every live wave stands at the same pc the batch runs that
instruction for all of them; after a branch that splits them, each step runs the lowest pc among live waves for the
waves standing there (so they meet again where their paths join), and a wave that reaches s_endpgm leaves. Lanes of
waves that don't take part in a step, and lanes masked off by EXEC, are never written. s_barrier needs nothing: the
waves of a work-group are in the same batch and the lowest-pc-first order keeps a wave at a barrier until the waves
behind it arrive.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tiny_runtime_amd.emu.isa import EXEC_LO, MASK32, NULL
from tiny_runtime_amd.emu.state import Inst, Wave, Wave64

END, SPLIT = -1, -2  # what an op returns besides the next pc: the waves end / per-wave next pcs are in `Batch.npc`
MAX_LANES = 1 << 16  # a dispatch runs in batches of whole work-groups of at most this many lanes
PRIVATE_LIMIT = 1 << 28  # private memory of a batch kept as columns up to this many bytes (else per-wave memory)


class LaneMask:
  """An SGPR (or one half of an SGPR pair, for wave64) written by a vector op: one bool per lane of the batch, kept as
  lanes until a scalar op reads its value (`Batch.sval`), so VOPC -> v_cndmask and carry chains stay in lane form."""
  __slots__ = ("lanes", "half", "vals")

  def __init__(self, lanes: np.ndarray, half: int = 0):
    self.lanes, self.half = lanes, half
    self.vals: np.ndarray | None = None


class VRegs(dict):
  """The batch's VGPRs: register -> uint32 column of every lane, allocated (zeros) when first touched; 256..259 are
  the per-wave interpreter's hidden operands (DPP, SDWA)."""

  def __init__(self, lanes: int):
    super().__init__()
    self.lanes = lanes

  def __missing__(self, r: int) -> np.ndarray:
    if not (0 <= r <= 259 or r >= 512): raise IndexError(f"VGPR {r} is outside v0..v255")  # 512+: temporaries
    v = self[r] = np.zeros(self.lanes, np.uint32)
    return v


class FRegs(dict):
  """float32 views of the VGPR columns (the same memory)."""

  def __init__(self, v: VRegs):
    super().__init__()
    self.v = v

  def __missing__(self, r: int) -> np.ndarray:
    f = self[r] = self.v[r].view(np.float32)
    return f


@dataclass
class Launch:
  """What the dispatcher puts into the waves of a batch: `n_waves` waves of `lanes` lanes, `group_waves` consecutive
  waves per work-group. `sgpr`: initial SGPRs (an int for every wave, or an int64 array of one value per wave);
  `vgpr`: initial VGPR columns (uint32, n_waves * lanes); `exec`: EXEC per wave (uint64 array); `lds_bytes` per
  work-group; `scratch_size`: each lane's private bytes (None: grown on demand, see rdna3.PrivateMemory)."""
  n_waves: int
  lanes: int
  group_waves: int
  exec: np.ndarray
  sgpr: dict[int, Any] = field(default_factory=dict)
  vgpr: dict[int, np.ndarray] = field(default_factory=dict)
  lds_bytes: int = 0
  scratch_size: int | None = None


class Batch:
  """The state of N waves of W lanes running in lockstep (see the module docstring)."""

  def __init__(self, emu: Any, code_addr: int, launch: Launch):
    self.emu, self.code_addr = emu, code_addr
    self.N, self.W = N, W = launch.n_waves, launch.lanes
    self.L = N * W
    self.group_waves = launch.group_waves
    self.V = VRegs(self.L)
    self.F = FRegs(self.V)
    self.S: list[Any] = [0] * 128
    for r, v in launch.sgpr.items(): self.S[r] = v if type(v) is int else _norm(v, N)
    for r, col in launch.vgpr.items(): self.V[r][:] = col
    self.scc: Any = 0
    self.wm: np.ndarray | None = None  # the waves taking part in this step (None: all of them)
    self.npc: Any = None               # per-wave next pcs of an op that returned SPLIT
    groups = max(1, N // max(1, launch.group_waves))
    self.lds_bytes = launch.lds_bytes
    self.lds_buf = bytearray(groups * launch.lds_bytes)
    self.lds = np.frombuffer(self.lds_buf, np.uint8) if self.lds_buf else np.zeros(0, np.uint8)
    self._lds_base: np.ndarray | None = None
    self.scratch_size = launch.scratch_size
    self.carriers: list[Wave | None] = [None] * N  # per-wave `Wave`s for fallbacks (they keep scratch memory)
    # private memory as one column of bytes per lane (scratch ops on columns): only with a size from the dispatch,
    # and when no per-wave fallback holds private bytes of its own (run_waves with pre-filled waves)
    self.priv_ok = launch.scratch_size is not None and self.L * launch.scratch_size <= PRIVATE_LIMIT
    self._priv: np.ndarray | None = None
    self._tiles: dict[int, np.ndarray] = {}
    ex = launch.exec
    if W == 32: self.S[EXEC_LO] = _norm(ex.astype(np.int64), N)
    else:
      self.S[EXEC_LO] = _norm((ex & np.uint64(MASK32)).astype(np.int64), N)
      self.S[EXEC_LO + 1] = _norm((ex >> np.uint64(32)).astype(np.int64), N)
    self.mw: Any = True
    self._act: Any = None
    self.refresh_mask()

  # ***** lane masks *****
  def tile(self, bits: int) -> np.ndarray:
    """The lanes of one wave mask `bits`, repeated for every wave."""
    if (t := self._tiles.get(bits)) is None:
      one = ((bits >> np.arange(self.W, dtype=np.uint64)) & np.uint64(1)).astype(bool)
      t = self._tiles[bits] = np.tile(one, self.N)
    return t

  def expand(self, vals: np.ndarray) -> np.ndarray:
    """Per-wave masks (N values) -> lanes."""
    v = np.asarray(vals).astype(np.uint64)
    return ((v[:, None] >> np.arange(self.W, dtype=np.uint64)) & np.uint64(1)).astype(bool).reshape(self.L)

  def mask_lanes(self, code: int) -> Any:
    """The lane mask in SGPR `code` (the pair code, code+1 for wave64): True when every lane of every wave is set,
    else a bool column."""
    lo = self.S[code]
    if self.W == 32:
      if type(lo) is int: return True if lo == MASK32 else self.tile(lo)
      if type(lo) is LaneMask and lo.half == 0: return lo.lanes
      return self.expand(self.sval(code))
    hi = self.S[code + 1]
    if type(lo) is LaneMask and type(hi) is LaneMask and lo.lanes is hi.lanes and lo.half == 0 and hi.half == 1:
      return lo.lanes
    a, b = self.sval(code), self.sval(code + 1)
    if type(a) is int and type(b) is int:
      v = a | (b << 32)
      return True if v == (1 << 64) - 1 else self.tile(v)
    return self.expand(np.asarray(a, np.int64).astype(np.uint64) | (np.asarray(b, np.int64).astype(np.uint64) << 32))

  def wave_lanes(self, wm: np.ndarray) -> np.ndarray: return np.repeat(wm, self.W)

  def refresh_mask(self) -> None:
    """Recompute `mw`, the lanes a vector op writes: EXEC's lanes of the waves taking part."""
    ex = self.mask_lanes(EXEC_LO)
    if self.wm is not None:
      wl = self.wave_lanes(self.wm)
      ex = wl if ex is True else ex & wl
    self.mw, self._act = ex, None

  def act(self) -> Any:
    """The indices of the lanes in `mw` (a slice for all lanes)."""
    if self._act is None: self._act = slice(None) if self.mw is True else np.flatnonzero(self.mw)
    return self._act

  def set_mask(self, d: int, lanes: np.ndarray) -> None:
    """Write a lane mask result into SGPR `d` (the pair d, d+1 for wave64); waves not taking part keep theirs."""
    if self.wm is not None:
      old = self.mask_lanes(d) if d != NULL else False
      lanes = np.where(self.wave_lanes(self.wm), lanes, old)
    if self.W == 32:
      if d != NULL: self.S[d] = LaneMask(lanes, 0)
    else:
      if d != NULL: self.S[d] = LaneMask(lanes, 0)
      self.S[d + 1] = LaneMask(lanes, 1)  # wmask writes code+1 even when code is NULL (it is M0 then)
    if d in (EXEC_LO, EXEC_LO + 1) or (self.W == 64 and d + 1 == EXEC_LO): self.refresh_mask()

  # ***** scalars *****
  def sval(self, code: int) -> Any:
    """SGPR `code`'s value: an int, or an int64 array of per-wave values."""
    v = self.S[code]
    if type(v) is LaneMask:
      col = self.lm_vals(v)
      return int(col[0]) if self.N == 1 else col
    return v

  def lm_vals(self, v: LaneMask) -> np.ndarray:
    """The per-wave 32-bit values of a LaneMask (its half of each wave's mask)."""
    if v.vals is None:
      packed = np.packbits(v.lanes.reshape(self.N, self.W), axis=1, bitorder="little")
      v.vals = np.ascontiguousarray(packed).view("<u4").astype(np.int64)
    return v.vals[:, v.half]

  def sset(self, d: int, v: Any) -> None:
    """Write a scalar result (int or per-wave array, already within 32 bits) into SGPR `d`."""
    if d == NULL: return
    if self.wm is not None: v = np.where(self.wm, v, self.sval(d)).astype(np.int64)
    self.S[d] = v if type(v) is int else _norm(v, self.N)
    if d == EXEC_LO or (d == EXEC_LO + 1 and self.W == 64): self.refresh_mask()

  def set_scc(self, v: Any) -> None:
    if self.wm is not None: v = np.where(self.wm, v, self.scc).astype(np.int64)
    self.scc = v if type(v) is int else _norm(v, self.N)

  def lanes_u32(self, v: Any) -> Any:
    """A scalar operand as a lane column: a numpy uint32 scalar, or per-wave values repeated over their lanes."""
    if type(v) is int: return np.uint32(v)
    return np.repeat(np.asarray(v).astype(np.uint32), self.W)

  def exec_any(self) -> Any:
    """Per wave: is any lane of EXEC set (an int for all waves alike, else a bool array)."""
    m = self.mask_lanes(EXEC_LO)
    if m is True: return 1
    return m.reshape(self.N, self.W).any(axis=1)

  def mask_nonzero(self, code: int) -> Any:
    """Per wave: is SGPR `code` (a pair for wave64) nonzero."""
    m = self.mask_lanes(code)
    if m is True: return 1
    r = m.reshape(self.N, self.W).any(axis=1)
    return int(r[0]) if self.N == 1 else r

  def priv(self) -> np.ndarray:
    """Every lane's private bytes: lane l's are [l * scratch_size, (l + 1) * scratch_size) (zeros at first, as a
    PrivateMemory's)."""
    if self._priv is None: self._priv = np.zeros(self.L * (self.scratch_size or 0), np.uint8)
    return self._priv

  # ***** LDS *****
  def lds_base(self) -> np.ndarray:
    """Each lane's work-group offset into the batch's LDS bytes."""
    if self._lds_base is None:
      g = np.arange(self.N, dtype=np.int64) // max(1, self.group_waves)
      self._lds_base = np.repeat(g * self.lds_bytes, self.W)
    return self._lds_base

  # ***** fallback: the per-wave interpreter's handler on one wave at a time *****
  def carrier(self, i: int, sgpr: list[int] | None = None) -> Wave:
    """Wave i as a `Wave` (created once; it keeps the wave's private memory), loaded from the batch (`sgpr`: its
    SGPR values when the caller has them)."""
    w = self.carriers[i]
    if w is None:
      w = self.carriers[i] = (Wave() if self.W == 32 else Wave64())
      w.code_addr, w.scratch_size = self.code_addr, self.scratch_size
      g = i // max(1, self.group_waves)
      w.lds = memoryview(self.lds_buf)[g * self.lds_bytes:(g + 1) * self.lds_bytes]  # type: ignore[assignment]
    w.sgpr = sgpr if sgpr is not None else [self._wave_val(v, i) for v in self.S]
    sc = self.scc
    w.scc = sc if type(sc) is int else int(sc[i])
    w.vgpr = _VProxy(self, i)  # type: ignore[assignment]
    return w

  def _wave_val(self, v: Any, i: int) -> int:
    if type(v) is int: return v
    if type(v) is LaneMask: return int(self.lm_vals(v)[i])
    return int(v[i])

  def run_per_wave(self, fn: Callable[[Wave], Any], pc: int) -> list[tuple[int, Any]]:
    """Run `fn(wave)` on each wave taking part, in wave order, syncing state in and out; returns (wave, result)."""
    waves = range(self.N) if self.wm is None else np.flatnonzero(self.wm).tolist()
    out: list[tuple[int, Any]] = []
    sg_changes: dict[int, dict[int, int]] = {}
    scc_changes: dict[int, int] = {}
    svals = [self.sval(r) for r in range(len(self.S))]  # per-wave values as int64 arrays, the rest ints
    per_wave = [r for r, v in enumerate(svals) if isinstance(v, np.ndarray)]
    for i in waves:
      sg = list(svals)
      for r in per_wave: sg[r] = int(svals[r][i])
      w = self.carrier(i, sg)
      w.pc = pc
      before, scc0 = list(sg), w.scc
      try: r = fn(w)
      finally:
        vp: Any = w.vgpr
        lo = i * self.W
        for reg, vals in vp.items():
          if vals is not vp.orig.get(reg) or vals != vp.snap.get(reg):
            self.V[reg][lo:lo + self.W] = np.array(vals, dtype=np.uint64).astype(np.uint32)
        for reg, (a, b) in enumerate(zip(before, w.sgpr)):
          if a != b: sg_changes.setdefault(reg, {})[i] = b & MASK32
        if w.scc != scc0: scc_changes[i] = w.scc
      out.append((i, r))
    wm, self.wm = self.wm, None  # the changes are per wave already
    try:
      for reg, ch in sg_changes.items():
        if self.N == 1: self.sset(reg, ch[0])
        else:
          col = np.array(np.broadcast_to(self.sval(reg), (self.N,)), dtype=np.int64)
          for i, v in ch.items(): col[i] = v
          self.sset(reg, col)
      if scc_changes:
        if self.N == 1: self.scc = scc_changes[0]
        else:
          col = np.array(np.broadcast_to(self.scc, (self.N,)), dtype=np.int64)
          for i, v in scc_changes.items(): col[i] = v
          self.scc = _norm(col, self.N)
    finally: self.wm = wm
    self.refresh_mask()
    return out


class _VProxy(dict):
  """One wave's view of the batch VGPRs for a per-wave handler: a register is copied out as a list when first read
  and written back after the handler (see Batch.run_per_wave)."""

  def __init__(self, b: Batch, i: int):
    super().__init__()
    self.b, self.lo = b, i * b.W
    self.orig: dict[int, list[int]] = {}
    self.snap: dict[int, list[int]] = {}

  def __missing__(self, r: int) -> list[int]:
    if not 0 <= r <= 259: raise IndexError(f"VGPR {r} is outside v0..v255")
    vals = self.b.V[r][self.lo:self.lo + self.b.W].tolist()
    self[r] = self.orig[r] = vals
    self.snap[r] = list(vals)
    return vals


def _norm(v: Any, n: int) -> Any:
  """A per-wave array as stored: an int when there is one wave, else int64."""
  a = np.asarray(v)
  if n == 1: return int(a.reshape(-1)[0])
  return a.astype(np.int64, copy=False) if a.shape == (n,) else np.broadcast_to(a, (n,)).astype(np.int64)


def host_span(addr: int, n: int) -> np.ndarray:
  """A writable uint8 view of n bytes of host memory at `addr`."""
  return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr))


__all__ = ["Batch", "Launch", "LaneMask", "END", "SPLIT", "MAX_LANES",
           "host_span", "Inst"]
