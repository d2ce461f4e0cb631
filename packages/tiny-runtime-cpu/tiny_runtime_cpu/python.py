"""The PYTHON device: an interpreter of linear UOps with GPU semantics — the living definition of the IR.

A launch runs ``global_size`` workgroups of ``local_size`` threads. Threads run in lock-step, like a warp: each UOp
is executed for every thread of a batch of whole workgroups before the next UOp, so a BARRIER is always satisfied
and a workgroup's local memory (DEFINE_LOCAL) is shared by its threads. Divergent control flow (IF, loops whose
bound differs between threads, gates) is handled with a per-thread active mask. ALU results come from
`tiny_uop.alu.exec_alu`, the reference semantics every backend must match bit for bit.

Values: a scalar is a list with one entry per thread; a vector is a list of lanes, each such a list; a pointer is a
`Ptr`. Memory is typed on access: device buffers through memoryview casts (or bit conversions for float16,
bfloat16 and fp8), local memory and registers as Python lists. Every access is bounds-checked.

Slow on purpose: keep launches small (thousands of threads, not millions).
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

from tiny_uop.device import Compiled, Program
from tiny_uop.dtype import DType, bits_to_float, dtypes, float_to_bits
from tiny_uop.helpers import prod
from tiny_uop.target import Target
from tiny_uop.uop import GroupOp, Ops, UOp

from tiny_runtime_cpu.memory import HostAllocator, HostMem

MAX_BATCH_THREADS = 4096  # threads interpreted together (whole workgroups); bounds the interpreter's memory
_CASTABLE = set("?bBhHiIqQfd")


class PythonExecError(RuntimeError):
  """A PYTHON program did something undefined: out-of-bounds access, unknown op, ..."""


# ***** memory *****
class Memory:
  """Typed elements over bytes (a device buffer) or a Python list (local memory, registers)."""
  __slots__ = ("read", "write", "size", "dtype", "what")

  def __init__(self, dtype: DType, size: int, read: Callable[[int], Any], write: Callable[[int, Any], None], what: str):
    self.dtype, self.size, self.read, self.write, self.what = dtype, size, read, write, what

  @staticmethod
  def of_bytes(mv: memoryview, dtype: DType, what: str) -> Memory:
    size = mv.nbytes // dtype.itemsize
    mv = mv[:size * dtype.itemsize]
    if dtype.fmt in _CASTABLE:
      cmv = mv.cast(dtype.fmt)  # type: ignore[call-overload]
      if dtype == dtypes.bool:
        return Memory(dtype, size, cmv.__getitem__, lambda i, v: cmv.__setitem__(i, bool(v)), what)
      return Memory(dtype, size, cmv.__getitem__, cmv.__setitem__, what)
    if dtype in (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s):
      bits = mv.cast("H" if dtype.itemsize == 2 else "B")
      return Memory(dtype, size, lambda i: bits_to_float(bits[i], dtype),
                    lambda i, v: bits.__setitem__(i, float_to_bits(v, dtype)), what)
    raise PythonExecError(f"PYTHON device can't access {what} as {dtype}")

  @staticmethod
  def of_list(dtype: DType, size: int, what: str) -> Memory:
    zero = dtypes.as_const(0, dtype.scalar())
    data = [zero] * size
    return Memory(dtype, size, data.__getitem__, data.__setitem__, what)

  def check(self, i: int) -> int:
    if not 0 <= i < self.size:
      raise PythonExecError(f"out-of-bounds access: element {i} of {self.what} ({self.size} x {self.dtype})")
    return i

  def check_all(self, idxs: list[int]) -> None:
    if idxs and (min(idxs) < 0 or max(idxs) >= self.size): self.check(min(idxs) if min(idxs) < 0 else max(idxs))


class Ptr:
  """A pointer per thread: `mems[t]` (one Memory shared by all threads when `shared`) and element indices per lane
  (`lanes[k][t]`; one lane for a scalar pointer). `gate[t]` False: the access does not happen."""
  __slots__ = ("mems", "lanes", "gate", "shared")

  def __init__(self, mems: list[Memory], lanes: list[list[int]], gate: list[bool] | None = None,
               shared: Memory | None = None):
    self.mems, self.lanes, self.gate, self.shared = mems, lanes, gate, shared


# ***** the interpreter *****
@functools.cache
def _alu_fn(op: Ops, dtype: DType) -> Callable:
  """The reference function of `op` on scalar `dtype` (`tiny_uop.alu`), raising its clear error when undefined."""
  from tiny_uop.alu import exec_alu, python_alu
  if (fn := python_alu.get(dtype, {}).get(op)) is None: return lambda *a: exec_alu(op, dtype, a)
  return fn


def _lanes(v: Any, dt: DType) -> list[list[Any]]:
  return v if dt.count > 1 else [v]


class _Loop:
  __slots__ = ("start", "end", "saved", "bound")

  def __init__(self, start: int, end: int, saved: list[bool], bound: list[int]):
    self.start, self.end, self.saved, self.bound = start, end, saved, bound


def _match_blocks(uops: list[UOp]) -> tuple[dict[int, int], list[tuple[int, UOp]]]:
  """Instruction list with END expanded to one entry per closed range (innermost first), and for each RANGE/IF the
  index of the instruction after its END/ENDIF."""
  prog: list[tuple[int, UOp]] = []   # (uop index, uop); END entries carry the RANGE they close as the uop
  pos = {u: i for i, u in enumerate(uops)}
  for i, u in enumerate(uops):
    if u.op is Ops.END:
      rngs = sorted((s for s in u.src if s.op is Ops.RANGE), key=lambda r: -pos[r])
      for r in rngs: prog.append((-1, r))
    else: prog.append((i, u))
  jump: dict[int, int] = {}
  open_at: dict[UOp, int] = {}
  for k, (i, u) in enumerate(prog):
    if i >= 0 and u.op in (Ops.RANGE, Ops.IF): open_at[u] = k
    elif i < 0: jump[open_at[u]] = k + 1
    elif u.op is Ops.ENDIF: jump[open_at[u.src[0]]] = k + 1
  return jump, prog


def run_uops(uops: list[UOp], bufs: list[memoryview], vals: tuple[int, ...], global_size: tuple[int, ...],
             local_size: tuple[int, ...]) -> None:
  """Run a linear program over the whole grid, a batch of whole workgroups at a time."""
  gsz = (tuple(global_size) + (1, 1, 1))[:3]
  lsz = (tuple(local_size) + (1, 1, 1))[:3]
  nwg, nloc = prod(gsz), prod(lsz)
  per = max(1, MAX_BATCH_THREADS // nloc)
  slots = sorted({u.arg for u in uops if u.op is Ops.PARAM})
  if len(slots) != len(bufs):
    raise PythonExecError(f"program uses {len(slots)} buffers (slots {slots}), got {len(bufs)}")
  names = sorted({u.arg[0] for u in uops if u.op is Ops.DEFINE_VAR})  # values come in name order (ProgramSpec.vars)
  if len(names) != len(vals):
    raise PythonExecError(f"program has {len(names)} variables {names}, got {len(vals)} values")
  dvars = [u for u in uops if u.op is Ops.DEFINE_VAR]
  byname = dict(zip(names, vals))
  mems: dict[UOp, Memory] = {}
  for u in uops:
    if u.op is Ops.PARAM and u not in mems:
      mems[u] = Memory.of_bytes(bufs[slots.index(u.arg)], u.dtype.base, f"buffer data{u.arg}")
  jump, prog = _match_blocks(uops)
  ctx = (prog, jump, mems, {v: byname[v.arg[0]] for v in dvars}, gsz, lsz)
  for first in range(0, nwg, per): _run_batch(ctx, range(first, min(nwg, first + per)))


def _run_batch(ctx: tuple, wgs: range) -> None:
  prog, jump, mems, varvals, gsz, lsz = ctx
  nloc = prod(lsz)
  T = len(wgs) * nloc
  gdiv = ((1, gsz[0]), (gsz[0], gsz[1]), (gsz[0] * gsz[1], gsz[2]))  # (divisor, size) of each dim, dim 0 fastest
  ldiv = ((1, lsz[0]), (lsz[0], lsz[1]), (lsz[0] * lsz[1], lsz[2]))
  gid = [[(w // d) % s for w in wgs for _ in range(nloc)] for d, s in gdiv]
  lid = [[(t // d) % s for _ in wgs for t in range(nloc)] for d, s in ldiv]
  wg_of = [k for k in range(len(wgs)) for _ in range(nloc)]
  values: dict[UOp, Any] = {}
  active = [True] * T
  all_on = True
  stack: list[Any] = []
  pc = 0
  while pc < len(prog):
    i, u = prog[pc]
    pc += 1
    op, dt = u.op, u.dtype
    if i < 0:  # END of loop u
      loop = stack[-1]
      values[u] = r = [x + 1 if a else x for x, a in zip(values[u], active)]  # a new list: values are never mutated
      still = [a and r[t] < loop.bound[t] for t, a in enumerate(active)]
      if any(still):
        active, all_on = still, all(still)
        pc = loop.start
      else:
        stack.pop()
        active = loop.saved
        all_on = all(active)
      continue
    src: list[Any] = [values.get(s) for s in u.src]
    if op is Ops.RANGE:
      bound = src[0]
      values[u] = [0] * T
      inside = [a and 0 < b for a, b in zip(active, bound)]
      if any(inside):
        stack.append(_Loop(pc, jump[pc - 1], active, bound))
        active, all_on = inside, all(inside)
      else: pc = jump[pc - 1]
    elif op is Ops.IF:
      inside = [a and bool(c) for a, c in zip(active, src[0])]
      if any(inside):
        stack.append(active)
        active, all_on = inside, all(inside)
      else: pc = jump[pc - 1]
    elif op is Ops.ENDIF:
      active = stack.pop()
      all_on = all(active)
    elif op in (Ops.BARRIER, Ops.SINK, Ops.NOOP, Ops.GROUP): pass  # lock-step: barriers always hold
    elif op is Ops.CONST: values[u] = [u.arg] * T if dt.count == 1 else [[u.arg] * T for _ in range(dt.count)]
    elif op is Ops.VCONST: values[u] = [[a] * T for a in u.arg]
    elif op is Ops.DEFINE_VAR: values[u] = [varvals[u]] * T
    elif op is Ops.SPECIAL: values[u] = _special(u.arg, gid, lid, lsz, T)
    elif op is Ops.PARAM: values[u] = Ptr([mems[u]] * T, [[0] * T], shared=mems[u])
    elif op is Ops.DEFINE_LOCAL and u not in values:  # memory is defined once, even where the UOp sits in a loop
      locs = [Memory.of_list(dt.base, dt.size, f"local memory {u.arg}") for _ in wgs]
      values[u] = Ptr([locs[w] for w in wg_of], [[0] * T])
    elif op is Ops.DEFINE_REG and u not in values:
      values[u] = Ptr([Memory.of_list(dt.base, dt.size, f"register {u.arg}") for _ in range(T)], [[0] * T])
    elif op in (Ops.DEFINE_LOCAL, Ops.DEFINE_REG): pass
    elif op is Ops.AFTER: values[u] = src[0]
    elif op is Ops.INDEX: values[u] = _index(u, src, T)
    elif op is Ops.LOAD:
      values[u] = _keep_inactive(values.get(u), _load(u, src, active, all_on, T), active, all_on, dt)
    elif op is Ops.STORE: _store(u, src, active, all_on, T)
    elif op is Ops.VECTORIZE: values[u] = [s for s in src]
    elif op is Ops.CAT: values[u] = [lane for s, x in zip(u.src, src) for lane in _lanes(x, s.dtype)]
    elif op is Ops.GEP:
      lanes = _lanes(src[0], u.src[0].dtype)
      sel = [lanes[k] for k in (u.arg if isinstance(u.arg, tuple) else (u.arg,))]
      values[u] = sel[0] if len(sel) == 1 and dt.count == 1 else sel
    elif op in (Ops.CAST, Ops.BITCAST) and isinstance(src[0], Ptr): values[u] = src[0]  # a pointer's type: the
      # width of an access comes from the LOAD/STORE dtype
    elif op is Ops.PTRCAT:
      ptrs: list[Ptr] = src
      if any(p.mems is not ptrs[0].mems and p.mems != ptrs[0].mems for p in ptrs):
        raise PythonExecError("PTRCAT of pointers into different memories")
      gates = [p.gate for p in ptrs if p.gate is not None]
      gate = [all(g) for g in zip(*gates)] if gates else None
      values[u] = Ptr(ptrs[0].mems, [lane for p in ptrs for lane in p.lanes], gate, ptrs[0].shared)
    elif op is Ops.BITCAST: values[u] = _bitcast(u, src[0], T)
    elif op in GroupOp.ALU or op is Ops.CAST:
      values[u] = _keep_inactive(values.get(u), _alu_op(u, src, active, all_on, T), active, all_on, dt)
    else: raise PythonExecError(f"PYTHON device can't execute {op} (dtype {dt}, arg {u.arg!r})")


def _keep_inactive(prev: Any, new: Any, active: list[bool], all_on: bool, dt: DType) -> Any:
  """Inside a loop, threads that already left it keep the value they computed last (like a register would)."""
  if all_on or prev is None: return new
  if dt.count == 1: return [n if a else p for n, p, a in zip(new, prev, active)]
  return [[n if a else p for n, p, a in zip(nl, pl, active)] for nl, pl in zip(new, prev)]


def _special(name: str, gid: list[list[int]], lid: list[list[int]], lsz: tuple[int, ...], T: int) -> list[int]:
  d = int(name[-1])
  if name.startswith("gidx"): return gid[d]
  if name.startswith("lidx"): return lid[d]
  if name.startswith("idx"): return [g * lsz[d] + lo for g, lo in zip(gid[d], lid[d])]
  if name == "core_id": return gid[0]
  raise PythonExecError(f"unknown SPECIAL {name!r}; valid: gidx0-2, lidx0-2, idx0-2")


def _index(u: UOp, src: list[Any], T: int) -> Ptr:
  base: Ptr = src[0]
  idx = _lanes(src[1], u.src[1].dtype)
  lanes = [[b + i for b, i in zip(base.lanes[0], lane)] for lane in idx]
  gate = base.gate
  if len(src) > 2 and u.src[2].dtype.scalar() == dtypes.bool:
    g = src[2] if u.src[2].dtype.count == 1 else [all(x) for x in zip(*src[2])]
    gate = g if gate is None else [a and b for a, b in zip(gate, g)]
  return Ptr(base.mems, lanes, gate, base.shared)


def _addresses(ptr: Ptr, count: int) -> list[list[int]]:
  """Element indices per lane of a `count`-wide access: consecutive from a scalar pointer, else one per lane."""
  if len(ptr.lanes) == count: return ptr.lanes
  if len(ptr.lanes) == 1: return [[i + k for i in ptr.lanes[0]] for k in range(count)]
  raise PythonExecError(f"access of {count} lanes through a pointer of {len(ptr.lanes)} lanes")


def _load(u: UOp, src: list[Any], active: list[bool], all_on: bool, T: int) -> Any:
  ptr: Ptr = src[0]
  dt = u.dtype
  zero = dtypes.as_const(0, dt.scalar())
  out = []
  for lane in _addresses(ptr, dt.count):  # sources after the pointer only order the load; a gated-off load is 0
    if (m := ptr.shared) is not None and ptr.gate is None and all_on:  # fast path: one buffer, every thread
      m.check_all(lane)
      out.append(list(map(m.read, lane)))
      continue
    col = []
    for t in range(T):
      if active[t] and (ptr.gate is None or ptr.gate[t]):
        m = ptr.mems[t]
        col.append(m.read(m.check(lane[t])))
      else: col.append(zero)
    out.append(col)
  return out if dt.count > 1 else out[0]


def _store(u: UOp, src: list[Any], active: list[bool], all_on: bool, T: int) -> None:
  ptr: Ptr = src[0]
  vdt = u.src[1].dtype
  gate = ptr.gate
  if len(src) > 2 and u.src[2].dtype == dtypes.bool:
    gate = src[2] if gate is None else [a and b for a, b in zip(gate, src[2])]
  addrs = _addresses(ptr, vdt.count)
  for lane, vals in zip(addrs, _lanes(src[1], vdt)):
    if (m := ptr.shared) is not None and gate is None and all_on:  # fast path: one buffer, every thread
      m.check_all(lane)
      for i, v in zip(lane, vals): m.write(i, v)
      continue
    for t in range(T):
      if active[t] and (gate is None or gate[t]):
        m = ptr.mems[t]
        m.write(m.check(lane[t]), vals[t])


def _alu_op(u: UOp, src: list[Any], active: list[bool], all_on: bool, T: int) -> Any:
  dt = u.dtype
  sdt = dt.scalar()
  fn = _alu_fn(u.op, sdt)
  srcs = [_lanes(x, s.dtype) for s, x in zip(u.src, src)]
  out = []
  for k in range(dt.count):
    cols = [s[k] if len(s) > 1 else s[0] for s in srcs]
    if all_on: out.append(list(map(fn, *cols)))
    else:  # inactive threads compute nothing (their operands may be garbage)
      zero = dtypes.as_const(0, sdt)
      out.append([fn(*a) if on else zero for on, *a in zip(active, *cols)])
  return out if dt.count > 1 else out[0]


def _bitcast(u: UOp, x: Any, T: int) -> Any:
  from tiny_uop.alu import exec_alu
  sdt, dt = u.src[0].dtype, u.dtype
  if sdt.count > 1: per = [exec_alu(Ops.BITCAST, dt, (tuple(lane[t] for lane in x),), sdt) for t in range(T)]
  else: per = [exec_alu(Ops.BITCAST, dt, (v,), sdt) for v in x]
  return [list(lane) for lane in zip(*per)] if dt.count > 1 else per


# ***** the device *****
class PythonProgram(Program):
  """A parsed PYTHON program; calling it interprets the UOps over the grid."""

  def __init__(self, device: Compiled, name: str, lib: bytes, **kwargs: Any):
    from tiny_codegen.renderer.python import parse
    super().__init__(device, name, lib)
    self.uops = parse(lib)

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    st = time.perf_counter()
    mvs = [b.mv if isinstance(b, HostMem) else memoryview(b).cast("B") for b in bufs]
    run_uops(self.uops, mvs, tuple(vals), tuple(global_size or (1, 1, 1)), tuple(local_size or (1, 1, 1)))
    return time.perf_counter() - st if wait else None


class PythonDevice(Compiled):
  """``Device["PYTHON"]``: host memory, the PYTHON renderer, and the interpreter."""

  def __init__(self, device: str = "PYTHON"):
    Target.parse(device).check_interface(valid=(None,))  # no MOCK (or other) interface: not a driver
    from tiny_codegen.renderer.python import PythonRenderer
    super().__init__(device, HostAllocator(), [PythonRenderer], PythonProgram)

