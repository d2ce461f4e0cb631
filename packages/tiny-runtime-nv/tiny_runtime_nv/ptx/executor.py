"""Running a compiled PTX kernel: every thread of many blocks at once, as numpy lane columns.

A launch of `grid` blocks of `block` threads runs in chunks of whole blocks (at most `MAX_LANES` lanes each; lane =
block-in-chunk * threads-per-block + linear thread id, so a warp is 32 consecutive lanes). All lanes of a chunk step
through the instruction list together. Divergence uses per-lane program counters: while the lanes agree there is
one pc; after a branch that splits them, each step runs the instruction at the smallest pc among live lanes for the
lanes standing there (so lanes that left a loop wait at its exit until the others get there, and they reconverge),
and the pcs merge again once all live lanes stand at the same instruction. `bar.sync` must be reached by every live
thread of a block at once (a barrier in divergent code is an error, as it would hang or be undefined on a GPU); all
memory effects before it are already visible. Shared memory is per block, local memory per thread.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from tiny_runtime_nv.ptx.blocks import block_at
from tiny_runtime_nv.ptx.compile import BRA, LOCAL_WINDOW, OP, RET, SHARED_WINDOW, WINDOW_SIZE, Compiler, Inst
from tiny_runtime_nv.ptx.memory import GPUFault, Memory
from tiny_runtime_nv.ptx.parse import Entry, parse_entry

MAX_LANES = 1 << 15
BLOCKS = True  # straight runs of instructions compiled into one function each (blocks.py); False: every instruction
               # through its closure (the reference the blocks are tested against)
_NONE: Any = object()
# CUDA compute 7.0+
LIMITS: dict[str, Any] = {"block": (1024, 1024, 64), "threads": 1024, "grid": (0x7FFFFFFF, 65535, 65535)}


class Kernel:
  """One `.entry` of a PTX module, parsed and compiled once. `launch` runs it."""

  def __init__(self, ptx: str, name: str):
    self.entry: Entry = parse_entry(ptx, name)
    self.name = name
    comp = Compiler(self.entry)
    self.insts: list[Inst] = comp.compile()
    self.reg_dtype = comp.reg_dtype
    self.specials = comp.specials
    self.params = self.entry.params
    self.param_size = self.entry.param_size
    self.shared_size = self.entry.shared_size
    self.local_size = self.entry.local_size
    self.launches = 0

  def pack_params(self, values: list[int]) -> bytes:
    """The parameter buffer for `values` (one per parameter, in order: addresses and ints)."""
    if len(values) != len(self.params):
      raise ValueError(f"kernel {self.name} takes {len(self.params)} parameters, got {len(values)}")
    buf = bytearray(max(self.param_size, 1))
    for p, v in zip(self.params, values):
      buf[p.offset:p.offset + p.size] = (int(v) & ((1 << (8 * p.size)) - 1)).to_bytes(p.size, "little")
    return bytes(buf)

  def launch(self, mem: Memory, params: bytes, grid: tuple[int, ...], block: tuple[int, ...],
             dynamic_shared: int = 0) -> None:
    """Run `grid` blocks of `block` threads; `params` is the parameter buffer (`pack_params`, or constant bank 0's
    parameter area). Raises ValueError for launch sizes out of range, GPUFault for bad memory accesses."""
    grid, block = (tuple(grid) + (1, 1, 1))[:3], (tuple(block) + (1, 1, 1))[:3]
    for what, dims, lim in (("grid", grid, LIMITS["grid"]), ("block", block, LIMITS["block"])):
      for ax, (d, mx) in enumerate(zip(dims, lim)):
        if not 1 <= d <= mx: raise ValueError(f"{self.name}: {what} dim {'xyz'[ax]} = {d}; valid 1..{mx}")
    threads = block[0] * block[1] * block[2]
    if threads > LIMITS["threads"]:
      raise ValueError(f"{self.name}: {threads} threads per block ({block}); at most {LIMITS['threads']}")
    if len(params) < self.param_size:
      raise ValueError(f"{self.name}: parameter buffer of {len(params)} bytes, the kernel reads {self.param_size}")
    self.launches += 1
    nblocks = grid[0] * grid[1] * grid[2]
    per = max(1, MAX_LANES // threads)
    with np.errstate(all="ignore"):  # float overflow/NaN/div-by-zero are values on a GPU, not warnings
      for b0 in range(0, nblocks, per):
        _run_chunk(self, Lanes(self, mem, params, grid, block, b0, min(per, nblocks - b0), dynamic_shared))


class Lanes:
  """The state of one chunk of blocks: registers (one lane column each), shared and local memory."""

  def __init__(self, k: Kernel, mem: Memory, params: bytes, grid: tuple[int, ...], block: tuple[int, ...],
               first_block: int, nblocks: int, dynamic_shared: int):
    T = block[0] * block[1] * block[2]
    self.L = L = T * nblocks
    self.at = 0  # the instruction a compiled block is running (for fault messages)
    self.block_threads, self.nblocks = T, nblocks
    self.mem, self.params = mem, params
    zeros: dict[Any, np.ndarray] = {}
    self.R: list[Any] = []
    for dt in k.reg_dtype:
      if dt not in zeros: zeros[dt] = np.zeros(L, dt)
      self.R.append(zeros[dt])
    self.shared_bytes = k.shared_size + dynamic_shared
    self.shared_stride = (self.shared_bytes + 15) & ~15
    self.shared = np.zeros(self.shared_stride * nblocks, np.uint8)
    self.local_stride = (k.local_size + 15) & ~15
    self.local = np.zeros(self.local_stride * L, np.uint8) if k.local_size else None
    lane = np.arange(L, dtype=np.uint32)
    t, blk = lane % np.uint32(T), lane // np.uint32(T)
    self.sh_base = blk.astype(np.uint64) * np.uint64(self.shared_stride)
    self.lc_base = lane.astype(np.uint64) * np.uint64(self.local_stride)
    if k.specials:
      b = blk + np.uint32(first_block)
      vals = {"%tid.x": t % block[0], "%tid.y": (t // block[0]) % block[1], "%tid.z": t // (block[0] * block[1]),
              "%ctaid.x": b % grid[0], "%ctaid.y": (b // grid[0]) % grid[1], "%ctaid.z": b // (grid[0] * grid[1]),
              "%laneid": t % 32, "%warpid": t // 32}
      for name, idx in k.specials.items():
        if name in vals: self.R[idx] = vals[name].astype(np.uint32)
        else:  # %ntid.*, %nctaid.*
          dims = block if name.startswith("%ntid") else grid
          self.R[idx] = np.full(L, dims["xyz".index(name[-1])], np.uint32)

  # memory: `addrs` and `m` select the active lanes (addrs already restricted to them)
  def _space_view(self, space: str, addrs: np.ndarray, m: Any, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 memory, byte offsets) for shared or local accesses, bounds-checked."""
    if space == "shared":
      base, arr, size = self.sh_base, self.shared, self.shared_bytes
    else:
      if self.local is None: raise GPUFault("local memory access in a kernel that declares no .local memory")
      base, arr, size = self.lc_base, self.local, self.local_stride
    if len(addrs) and int(addrs.max()) + nbytes > size:
      bad = int(addrs.max())
      raise GPUFault(f"{space} memory access of {nbytes} bytes at offset {bad:#x} is outside the {size} bytes")
    if nbytes > 1 and (addrs & np.uint64(nbytes - 1)).any():
      raise GPUFault(f"misaligned {space} access of {nbytes} bytes")
    return arr, addrs + (base if m is None else base[m])

  def _split_generic(self, addrs: np.ndarray) -> np.ndarray:
    """0 global, 1 shared window, 2 local window: which space each generic address falls into."""
    out = np.zeros(len(addrs), np.int8)
    out[(addrs >= np.uint64(SHARED_WINDOW)) & (addrs < np.uint64(SHARED_WINDOW + WINDOW_SIZE))] = 1
    out[(addrs >= np.uint64(LOCAL_WINDOW)) & (addrs < np.uint64(LOCAL_WINDOW + WINDOW_SIZE))] = 2
    return out

  def load(self, space: str, addrs: np.ndarray, dt: np.dtype, n: int, m: Any) -> np.ndarray:
    if space in ("global", "const"): return self.mem.gather(addrs, dt, n, f"ld.{space}")
    if space == "generic":
      if not len(addrs) or int(addrs.max()) < LOCAL_WINDOW: return self.mem.gather(addrs, dt, n, "ld")
      return self._generic(addrs, m, lambda sp, a, mm: self.load(sp, a, dt, n, mm), (len(addrs), n), dt)
    arr, off = self._space_view(space, addrs, m, dt.itemsize * n)
    idx = off.astype(np.intp)
    cols = idx[:, None] + np.arange(n * dt.itemsize)
    return np.ascontiguousarray(arr[cols]).view(dt).reshape(len(addrs), n)

  def store(self, space: str, addrs: np.ndarray, vals: np.ndarray, m: Any) -> None:
    if space == "global": return self.mem.scatter(addrs, vals, "st.global")
    if space == "generic":
      if not len(addrs) or int(addrs.max()) < LOCAL_WINDOW: return self.mem.scatter(addrs, vals, "st")
      which = self._split_generic(addrs)
      for w, sp in enumerate(("global", "shared", "local")):
        sel = which == w
        if not sel.any(): continue
        a = addrs[sel] - np.uint64((0, SHARED_WINDOW, LOCAL_WINDOW)[w])
        self.store(sp, a, vals[sel], _submask(m, sel, self.L))
      return None
    n = vals.shape[1] * vals.dtype.itemsize
    arr, off = self._space_view(space, addrs, m, n)
    arr[off.astype(np.intp)[:, None] + np.arange(n)] = np.ascontiguousarray(vals).view(np.uint8).reshape(len(addrs), n)
    return None

  def _generic(self, addrs: np.ndarray, m: Any, fn: Any, shape: tuple[int, int], dt: np.dtype) -> np.ndarray:
    out = np.zeros(shape, dt)
    which = self._split_generic(addrs)
    for w, sp in enumerate(("global", "shared", "local")):
      sel = which == w
      if sel.any(): out[sel] = fn(sp, addrs[sel] - np.uint64((0, SHARED_WINDOW, LOCAL_WINDOW)[w]),
                                  _submask(m, sel, self.L))
    return out

  def atomic(self, space: str, op: str, addrs: np.ndarray, b: np.ndarray, c: Any, dt: np.dtype, m: Any) -> np.ndarray:
    """Atomic read-modify-write per active lane, in lane order where addresses repeat; returns the old values."""
    if space == "generic":
      if len(addrs) and int(addrs.max()) >= LOCAL_WINDOW:
        raise NotImplementedError("PTX executor: generic atomics on shared/local addresses")
      space = "global"
    if space == "shared":
      arr, off = self._space_view("shared", addrs, m, dt.itemsize)
      view, key = arr.view(dt), off
      get = lambda sel: view[(off[sel] // np.uint64(dt.itemsize)).astype(np.intp)]  # noqa: E731
      def put(sel: np.ndarray, v: np.ndarray) -> None: view[(off[sel] // np.uint64(dt.itemsize)).astype(np.intp)] = v
    elif space == "global":
      key = addrs
      get = lambda sel: self.mem.gather(addrs[sel], dt, 1, "atom")[:, 0]  # noqa: E731
      def put(sel: np.ndarray, v: np.ndarray) -> None: self.mem.scatter(addrs[sel], v[:, None], "atom")
    else: raise NotImplementedError(f"PTX executor: atomics on {space} memory")
    old = np.zeros(len(addrs), dt)
    if not len(addrs): return old
    order = np.argsort(key, kind="stable")
    sk = key[order]
    first = np.r_[0, np.nonzero(sk[1:] != sk[:-1])[0] + 1]
    rank = np.empty(len(sk), np.intp)
    rank[order] = np.arange(len(sk)) - np.repeat(first, np.diff(np.r_[first, len(sk)]))
    for r in range(int(rank.max()) + 1):  # one round per repeat of an address: unique addresses within a round
      sel = rank == r
      cur = get(sel)
      old[sel] = cur
      put(sel, _atom_op(op, cur, b[sel], None if c is None else c[sel], dt))
    return old


def _submask(m: Any, sel: np.ndarray, L: int) -> np.ndarray:
  """A lane mask for the active lanes (mask `m`, None: all) picked by `sel` (indexed over the active lanes)."""
  full = np.zeros(L, bool)
  idx = np.arange(L) if m is None else np.nonzero(m)[0]
  full[idx[sel]] = True
  return full


def _atom_op(op: str, old: np.ndarray, b: np.ndarray, c: Any, dt: np.dtype) -> np.ndarray:
  with np.errstate(all="ignore"):
    if op == "add": return (old + b).astype(dt)
    if op == "min": return np.fmin(old, b) if dt.kind == "f" else np.minimum(old, b)
    if op == "max": return np.fmax(old, b) if dt.kind == "f" else np.maximum(old, b)
    if op == "exch": return b.astype(dt)
    if op == "cas": return np.where(old == b, c, old).astype(dt)
    if op == "and": return old & b
    if op == "or": return old | b
    if op == "xor": return old ^ b
    if op == "inc": return np.where(old >= b, dt.type(0), old + dt.type(1)).astype(dt)
    if op == "dec": return np.where((old == 0) | (old > b), b, old - dt.type(1)).astype(dt)
  raise NotImplementedError(f"PTX executor: atom.{op}")


def _barrier_check(k: Kernel, c: Lanes, mask: Any, alive: Any, inst: Inst) -> None:
  """Every live thread of each block that reached the barrier must be at it together."""
  live = np.ones(c.L, bool) if alive is None else alive
  if mask is None or (mask == live).all(): return
  m2, a2 = mask.reshape(c.nblocks, c.block_threads), live.reshape(c.nblocks, c.block_threads)
  bad = m2.any(axis=1) & (m2 != a2).any(axis=1)
  if bad.any():
    b = int(np.nonzero(bad)[0][0])
    raise RuntimeError(f"{k.name}: `{inst.text}` reached by {int(m2[b].sum())} of the {int(a2[b].sum())} live "
                       f"threads of a block (a barrier in divergent code)")


def _run_chunk(k: Kernel, c: Lanes) -> None:
  insts, R, L = k.insts, c.R, c.L
  n = len(insts)
  pc = 0
  alive: Any = None      # None: every lane is live
  lane_pc: Any = None    # None: converged at `pc`
  big = np.int64(1 << 40)
  blocks = k.__dict__.setdefault("blocks", {}) if BLOCKS else {}
  while True:
    if lane_pc is None:
      if pc >= n: return
      mask = alive
      if (blk := blocks.get(pc, _NONE)) is _NONE: blk = block_at(k, pc) if BLOCKS else None
      if blk is not None:  # a straight run of unpredicated instructions, compiled into one function (blocks.py)
        try: pc = blk[0](c, mask)
        except GPUFault as e: raise GPUFault(f"{k.name}: {e} (at `{insts[c.at].text}`)") from None
        continue
    else:
      pcs = lane_pc if alive is None else np.where(alive, lane_pc, big)
      pc = int(pcs.min())
      if pc >= n: return
      mask = pcs == pc
      if mask.all() or (alive is not None and (mask == alive).all()):
        lane_pc, mask = None, alive
    inst = insts[pc]
    em = mask
    if inst.pred is not None:
      pv = R[inst.pred]
      if inst.neg: pv = ~pv
      em = pv if mask is None else (pv & mask)
    kind = inst.kind
    if kind == OP:
      if em is None or em.any():
        try: inst.fn(c, em)  # type: ignore[misc]
        except (GPUFault, NotImplementedError, RuntimeError) as e:
          if isinstance(e, GPUFault): raise GPUFault(f"{k.name}: {e} (at `{inst.text}`)") from None
          raise
      nxt_taken = nxt = pc + 1
    elif kind == BRA:
      nxt_taken, nxt = inst.target, pc + 1
    elif kind == RET:
      if em is None:
        if lane_pc is None: return
        alive = ~mask if alive is None else alive & ~mask
      else:
        alive = ~em if alive is None else alive & ~em
      if not alive.any(): return
      nxt_taken = nxt = pc + 1
    else:  # BAR
      _barrier_check(k, c, em, alive, inst)
      nxt_taken = nxt = pc + 1
    # advance the pcs of the lanes that executed
    if lane_pc is None:
      if kind != BRA or em is None: pc = nxt_taken if kind == BRA else nxt
      else:
        live = em if alive is None else em | ~alive
        if live.all(): pc = nxt_taken
        elif not (em if alive is None else em & alive).any(): pc = nxt
        else:
          lane_pc = np.full(L, nxt, np.int64)
          lane_pc[em] = nxt_taken
    else:
      if kind == BRA and em is not None:
        lane_pc[mask & em] = nxt_taken
        lane_pc[mask & ~em] = nxt
      else: lane_pc[mask] = nxt_taken if kind == BRA else nxt


_CACHE: dict[tuple[str, str], Kernel] = {}


def load_kernel(ptx: str, name: str) -> Kernel:
  """The compiled kernel `name` of `ptx`, parsed and compiled once per (module text, name)."""
  key = (hashlib.sha256(ptx.encode()).hexdigest(), name)
  if (kern := _CACHE.get(key)) is None:
    if len(_CACHE) > 4096: _CACHE.clear()
    kern = _CACHE[key] = Kernel(ptx, name)
  return kern
