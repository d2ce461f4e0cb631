"""HCQ2: TinyJit replays lowered to hardware command buffers by named UOp rewrites (docs/PIPELINE.md §9).

A batch of captured calls (the JIT's `LINEAR` of `CALL`s, built by `linear_of`) goes through the passes of
`PIPELINE`, in order, each a named `PatternMatcher` applied with `graph_rewrite` (`HCQ2=2` prints every stage):

   1. prepare    CALL -> EXEC (a kernel dispatch) or XFER (a copy-engine copy). Buffer addresses are UOps: CONST for
                 the buffers the graph keeps, PARAM(slot) for the replay's inputs; program values are DEFINE_VARs;
                 launch sizes are expressions over DEFINE_VARs (or CONSTs)
   2. split      LINEAR -> SINK of QUEUEs, one per engine of the device: EXECs on "compute", XFERs on "copy" (or on
                 "compute": `hcq2_copy_engine`, for GPUs without a copy queue)
   3. deps       what one queue must see of another's work becomes a SIGNAL on the producer's queue signal and a WAIT
                 on the consumer's; MEMBAR between dispatches and after a wait; the other queues' ends join on the
                 compute queue (the "join")
   4. timeline   each body QUEUE gets a kick QUEUE: wait for the device timeline, MEMBAR, run the body (INDIRECT),
                 and on the join, signal the timeline's next value: one increment per submit of the replay
   5. resets     the join body resets the queue signals to 0 once everything that waits for them has passed
   6. kernargs   every EXEC gets an argument region (`HCQProgram.args_layout`, 256-byte aligned) in one KERNARGS
                 buffer; its address is ADDR(KERNARGS) + offset
   7. lower      the device's own `pm_lower`: each queue op -> PACKET of dwords (UOps: CONSTs or expressions)
   8. bufferize  the body QUEUEs that run in place -> CMDBUFs in device memory; KERNARGS allocated; ADDR -> address
   9. patches    every dword and argument field that depends on a replay value (PARAM, DEFINE_VAR) -> PATCH
  10. resolve    constant folding; the constant dwords and argument fields are written into device memory once
  11. host       kick QUEUEs -> SUBMITs: host-side dword templates whose parameters are the timeline values
  12. callify    one generated Python function per graph: compute the parameters, write the PATCHes whose value
                 changed (after waiting for the last replay, which may still read them) and submit

A device brings only its encoder (`pm_lower`: queue op -> PACKET, reusing its packet builders) and its primitives:
signals (`new_signal`, `timeline_signal`, `next_timeline`), `hcq_submitter(engine)` (how dwords and bound command
buffers reach a queue: ring + doorbell, GPFIFO entries) and its programs' argument layout (`HCQProgram.args_layout`,
`fill_args`, `fill_launch`, `launch_fields`). Standard library only.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from tiny_uop.dtype import dtypes
from tiny_uop.helpers import HCQ2, del_errors
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite
from tiny_uop.uop import Ops, UOp, pretty_print

U64_MAX = (1 << 64) - 1
ENGINES = ("copy", "compute")  # submission order of a replay's kicks: the copy queue gets going first


# ***** args of the HCQ2 ops *****

@dataclass(frozen=True, eq=False)
class CallInfo:
  """The arg of an input CALL: the captured call (the device-graph contract's object) and what it reads and writes
  (`("in",)`: any input of the replay, `("mem", base address)`: a buffer the graph keeps)."""
  kind: str                   # "kernel" | "copy"
  call: Any
  reads: frozenset
  writes: frozenset
  def __repr__(self) -> str: return f"{self.kind}:{getattr(self.call, 'name', '')}"


@dataclass(frozen=True, eq=False)
class ExecArg:
  """The arg of EXEC(DEVICE, args_addr, g0, g1, g2, l0, l1, l2, *buffer addresses, *values)."""
  prg: Any
  name: str
  nbufs: int
  nvals: int
  reads: frozenset
  writes: frozenset
  def __repr__(self) -> str: return f"exec {self.name} bufs={self.nbufs} vals={self.nvals}"


@dataclass(frozen=True, eq=False)
class XferArg:
  """The arg of XFER(DEVICE, dst address, src address)."""
  nbytes: int
  reads: frozenset
  writes: frozenset
  def __repr__(self) -> str: return f"xfer {self.nbytes} bytes"


@dataclass(frozen=True)
class Mem:
  """Device memory a pass allocated: `va` (host-mapped at the same address), `size` bytes."""
  va: int
  size: int
  def __repr__(self) -> str: return f"mem({self.va:#x}, {self.size})"


@dataclass(frozen=True, eq=False)
class KernargsArg:
  """The arg of KERNARGS(DEVICE, *PATCH): the argument regions `(offset, EXEC)` and, once allocated, their memory."""
  size: int
  regions: tuple
  mem: Mem | None = None
  lifted: bool = False
  written: bool = False
  def __repr__(self) -> str: return f"kernargs {len(self.regions)} regions, {self.size} bytes, {self.mem}"


@dataclass(frozen=True, eq=False)
class CmdbufArg:
  """The arg of CMDBUF(*dwords): the command buffer's memory and its engine."""
  mem: Mem
  engine: str
  lifted: bool = False
  written: bool = False
  def __repr__(self) -> str: return f"cmdbuf {self.engine} {self.mem}"


@dataclass(frozen=True)
class PatchArg:
  """The arg of PATCH(value): where a replay writes `value` (`bits` wide at bit `shift` of the 32-bit words at `addr`;
  `signed`: an int32/int64 field). Its `what` names the value in error messages."""
  addr: int
  shift: int
  bits: int
  signed: bool = False
  what: str = ""
  def __repr__(self) -> str: return f"patch {self.addr:#x}+{self.shift}:{self.bits}{'s' if self.signed else ''}"


# ***** the pass context *****

@dataclass
class HCQ2Ctx:
  """What the passes share: the device, capture values of program variables, the launch hooks of kernels whose sizes
  are not UOps, the queue signals and the memory they allocated, and callify's namespace and function."""
  dev: Any
  defaults: dict[str, int] = field(default_factory=dict)
  hooks: list[tuple[Any, tuple[str, ...]]] = field(default_factory=list)
  signals: list[Any] = field(default_factory=list)
  allocs: list[Any] = field(default_factory=list)
  ns: dict[str, Any] = field(default_factory=dict)
  fn: Callable | None = None

  def alloc(self, size: int) -> Mem:
    buf = self.dev._gpu_alloc(max(size, 256), host=True)
    self.allocs.append(buf)
    return Mem(buf.va_addr, size)


def _u64(v: int) -> UOp: return UOp(Ops.CONST, dtypes.uint64, arg=v)
def _u32(v: int) -> UOp: return UOp(Ops.CONST, dtypes.uint32, arg=v)


def _dynamic(u: UOp) -> bool:
  """Does `u` change between replays (it depends on an input address or a variable)?"""
  return any(x.op in (Ops.PARAM, Ops.DEFINE_VAR) for x in u.toposort())


# ***** 0. the JIT's calls as a LINEAR of CALLs *****

def _resources(b: Any) -> tuple:
  return ("in",) if isinstance(b, int) else ("mem", (b.base or b).va_addr)


def _buf_uop(b: Any) -> UOp: return UOp(Ops.PARAM, dtypes.uint64, arg=b) if isinstance(b, int) else _u64(b.va_addr)


def linear_of(dev: Any, calls: Sequence[Any]) -> UOp:
  """The captured calls as `LINEAR(CALL(DEVICE, *buffer addresses, arg=CallInfo) ...)`.

  A kernel call follows the device-graph contract (docs/PIPELINE.md §7: `prg`, `bufs`, `vars`, `global_size`,
  `local_size`, `launch`); a copy has `bufs = [dst, src]` and `nbytes`. A buffer is an opaque device buffer or an int
  (the index of a replay input). A kernel is assumed to read and write each of its buffers."""
  out = []
  dnode = UOp(Ops.DEVICE, arg=dev.device)
  for c in calls:
    res = frozenset(_resources(b) for b in c.bufs)
    if getattr(c, "prg", None) is not None: info = CallInfo("kernel", c, res, res)
    else: info = CallInfo("copy", c, frozenset([_resources(c.bufs[1])]), frozenset([_resources(c.bufs[0])]))
    out.append(UOp(Ops.CALL, dtypes.void, (dnode, *(_buf_uop(b) for b in c.bufs)), info))
  return UOp(Ops.LINEAR, dtypes.void, tuple(out))


# ***** 1. prepare *****

def _launch_uops(ctx: HCQ2Ctx, k: Any, kid: int) -> tuple[UOp, ...]:
  """The 3 global and 3 local sizes as UOps; sizes that are neither ints nor UOps come from `k.launch` at replay."""
  gs = tuple(k.global_size) + (1,) * (3 - len(k.global_size))
  ls = tuple(k.local_size or ()) + (1,) * (3 - len(k.local_size or ()))
  if all(isinstance(d, (int, UOp)) for d in gs + ls):
    out = []
    for d in gs + ls:
      if isinstance(d, int): out.append(UOp(Ops.CONST, dtypes.index, arg=d))
      elif binds := {b: b.src[0] for b in d.toposort() if b.op is Ops.BIND}: out.append(d.substitute(binds))
      else: out.append(d)
    return tuple(out)
  names = tuple(f"launch{kid}.{w}{a}" for w in "gl" for a in range(3))
  ctx.hooks.append((k, names))
  return tuple(UOp(Ops.DEFINE_VAR, dtypes.index, arg=(n, 0, (1 << 31) - 1)) for n in names)


def _prepare_kernel(ctx: HCQ2Ctx, c: UOp) -> UOp:
  info: CallInfo = c.arg
  k = info.call
  vals = []
  for n, v in k.vars:
    if ctx.defaults.setdefault(n, v) != v:
      raise ValueError(f"variable {n!r} was captured with two values ({ctx.defaults[n]} and {v})")
    vals.append(UOp(Ops.DEFINE_VAR, dtypes.int64, arg=(n, -(1 << 63), (1 << 63) - 1)))
  launch = _launch_uops(ctx, k, len(ctx.hooks))
  arg = ExecArg(k.prg, getattr(k, "name", type(k.prg).__name__), len(c.src) - 1, len(vals), info.reads, info.writes)
  return UOp(Ops.EXEC, dtypes.void, (c.src[0], _u64(0), *launch, *c.src[1:], *vals), arg)


def _prepare_copy(c: UOp) -> UOp:
  info: CallInfo = c.arg
  return UOp(Ops.XFER, dtypes.void, c.src[:3], XferArg(info.call.nbytes, info.reads, info.writes))


def _prepare(ctx: HCQ2Ctx, c: UOp) -> UOp:
  if not isinstance(c.arg, CallInfo): raise ValueError(f"HCQ2 prepare: a CALL without CallInfo ({c.arg!r})")
  return _prepare_kernel(ctx, c) if c.arg.kind == "kernel" else _prepare_copy(c)


pm_prepare = PatternMatcher([(UPat(Ops.CALL, name="c"), _prepare)], name="hcq prepare")


# ***** 2. split into queues *****

def _split(ctx: HCQ2Ctx, lin: UOp) -> UOp:
  queues: dict[str, list[UOp]] = {}
  copy_engine = getattr(ctx.dev, "hcq2_copy_engine", "copy")  # "compute" on a GPU without a copy queue (Adreno)
  for i, op in enumerate(lin.src):
    queues.setdefault("compute" if op.op is Ops.EXEC else copy_engine, []).append(op.replace(tag=i))
  dnode = lin.src[0].src[0]
  return UOp(Ops.SINK, dtypes.void, tuple(UOp(Ops.QUEUE, dtypes.void, (dnode, *queues[e]), (e, "body"))
                                          for e in ENGINES if e in queues), "split")


pm_split = PatternMatcher([(UPat(Ops.LINEAR, src=UPat((Ops.EXEC, Ops.XFER)), name="lin"), _split)], name="hcq split")


# ***** 3. dependencies, barriers and signals *****

def _hazards(qs: list[UOp]) -> tuple[dict[tuple[int, int], dict[int, int]], list[set[int]]]:
  """Walking the ops in LINEAR order: which op of another queue each op must wait for (read after write, write after
  read or write), as `{(queue, op): {producer queue: producer op}}`, and per queue the ops after which it signals."""
  ops = sorted((op.tag, qi, j) for qi, q in enumerate(qs) for j, op in enumerate(q.src[1:]))
  last_write: dict[Any, tuple[int, int]] = {}
  readers: dict[Any, list[tuple[int, int]]] = {}
  waits: dict[tuple[int, int], dict[int, int]] = {}
  points: list[set[int]] = [set() for _ in qs]
  for _, qi, j in ops:
    op = qs[qi].src[1 + j]
    need: list[tuple[int, int]] = []
    for r in op.arg.reads:
      if r in last_write: need.append(last_write[r])
    for r in op.arg.writes:
      if r in last_write: need.append(last_write[r])
      need += readers.get(r, [])
    for pq, pj in need:
      if pq == qi: continue  # a queue runs its ops in order (with barriers between dispatches)
      w = waits.setdefault((qi, j), {})
      w[pq] = max(w.get(pq, -1), pj)  # waiting for the latest producer op covers the earlier ones
    for pq, pj in waits.get((qi, j), {}).items(): points[pq].add(pj)
    for r in op.arg.writes: last_write[r], readers[r] = (qi, j), []
    for r in op.arg.reads - op.arg.writes: readers.setdefault(r, []).append((qi, j))
  return waits, points


def _deps(ctx: HCQ2Ctx, sink: UOp) -> UOp:
  qs = list(sink.src)
  engines = [q.arg[0] for q in qs]
  waits, points = _hazards(qs)
  join = engines.index("compute") if "compute" in engines else 0
  for qi, q in enumerate(qs):
    if qi != join and len(q.src) > 1: points[qi].add(len(q.src) - 2)  # a queue's end: the join waits for it
  sigs = [ctx.dev.new_signal(0) if points[qi] else None for qi in range(len(qs))]
  ctx.signals += [s for s in sigs if s is not None]
  value = [{pj: n + 1 for n, pj in enumerate(sorted(points[qi]))} for qi in range(len(qs))]
  out = []
  for qi, q in enumerate(qs):
    eng, body, waited = engines[qi], [], [-1] * len(qs)
    seen_op = False
    for j, op in enumerate(q.src[1:]):
      pre = False
      for pq, pj in sorted(waits.get((qi, j), {}).items()):
        v = min(k for k in value[pq] if k >= pj)  # the first signal point at or after the producer op
        if v <= waited[pq]: continue
        body.append(UOp(Ops.WAIT, dtypes.void, (_u64(value[pq][v]),), (eng, sigs[pq])))
        waited[pq], pre = v, True
      if op.op is Ops.EXEC or eng == "compute":  # on a compute queue copies are ordered like dispatches
        if seen_op or pre: body.append(UOp(Ops.MEMBAR, dtypes.void, (), eng))
        seen_op = True
      body.append(op)
      if j in value[qi]: body.append(UOp(Ops.SIGNAL, dtypes.void, (_u64(value[qi][j]),), (eng, sigs[qi])))
    if qi == join:
      for pq in range(len(qs)):
        if pq != join and points[pq]:
          body.append(UOp(Ops.WAIT, dtypes.void, (_u64(len(points[pq])),), (eng, sigs[pq])))
    out.append(UOp(Ops.QUEUE, dtypes.void, (q.src[0], *body), (eng, "join" if qi == join else "body")))
  return UOp(Ops.SINK, dtypes.void, tuple(out), "deps")


pm_deps = PatternMatcher([(UPat(Ops.SINK, arg="split", name="sink"), _deps)], name="hcq deps")


# ***** 4. timeline *****

def timeline_vars(device: str) -> tuple[UOp, UOp]:
  """The replay's wait value (the device timeline's last value) and signal value (its next) for `device`."""
  return (UOp(Ops.DEFINE_VAR, dtypes.uint64, arg=(f"{device}:wait", 0, U64_MAX)),
          UOp(Ops.DEFINE_VAR, dtypes.uint64, arg=(f"{device}:signal", 0, U64_MAX)))


def _timeline(ctx: HCQ2Ctx, sink: UOp) -> UOp:
  tl = ctx.dev.timeline_signal
  wait_v, signal_v = timeline_vars(ctx.dev.device)
  kicks = []
  for q in sink.src:
    eng, role = q.arg
    cmds = [UOp(Ops.WAIT, dtypes.void, (wait_v,), (eng, tl)), UOp(Ops.MEMBAR, dtypes.void, (), eng),
            UOp(Ops.INDIRECT, dtypes.void, (q,), eng)]
    if role == "join": cmds.append(UOp(Ops.SIGNAL, dtypes.void, (signal_v,), (eng, tl)))
    kicks.append(UOp(Ops.QUEUE, dtypes.void, (q.src[0], *cmds), (eng, "kick")))
  return UOp(Ops.SINK, dtypes.void, tuple(kicks), "timeline")


pm_timeline = PatternMatcher([(UPat(Ops.SINK, arg="deps", name="sink"), _timeline)], name="hcq timeline")


# ***** 5. queue-signal resets *****

def _resets(ctx: HCQ2Ctx, q: UOp) -> UOp:
  eng = q.arg[0]
  resets = [UOp(Ops.SIGNAL, dtypes.void, (_u64(0),), (eng, s)) for s in ctx.signals]
  return q.replace(src=q.src + tuple(resets), arg=(eng, "body"))


pm_resets = PatternMatcher([(UPat(Ops.QUEUE, name="q", custom=lambda q: q.arg[1] == "join"), _resets)],
                           name="hcq resets")


# ***** 6. kernel-argument regions *****

def _region_size(e: UOp) -> int:
  return (e.arg.prg.args_layout(e.arg.nbufs, e.arg.nvals).size + 255) & ~255


def _kernargs(sink: UOp) -> UOp:
  execs = [u for u in sink.toposort() if u.op is Ops.EXEC]
  if not execs: return sink.replace(arg="kernargs")
  offs, total = [], 0
  for e in execs:
    offs.append(total)
    total += _region_size(e)
  ka = UOp(Ops.KERNARGS, dtypes.void, (execs[0].src[0],), KernargsArg(total, tuple(zip(offs, execs))))
  base = UOp(Ops.ADDR, dtypes.uint64, (ka,))
  # the address a dispatch takes: the region + its layout's args_offset (AMD: after the 64-byte dispatch packet)
  sub = {e: e.replace(src=(e.src[0], base + _u64(o + e.arg.prg.args_layout(e.arg.nbufs, e.arg.nvals).args_offset),
                           *e.src[2:])) for e, o in zip(execs, offs)}
  return UOp(Ops.SINK, dtypes.void, (*sink.substitute(sub).src, ka), "kernargs")


pm_kernargs = PatternMatcher([(UPat(Ops.SINK, arg="timeline", name="sink"), _kernargs)], name="hcq kernargs")


# ***** 7. the device's encoder: helpers for `pm_lower` *****

def packet(q: Any, name: str) -> UOp:
  """A PACKET of the dwords a device's `HWQueue` recorded (ints become uint32 CONSTs, UOps stay expressions)."""
  return UOp(Ops.PACKET, dtypes.void, tuple(_u32(d) if isinstance(d, int) else d for d in q._q), name)


def exec_parts(x: UOp) -> tuple[Any, UOp, tuple[UOp, ...], tuple[UOp, ...]]:
  """(program, argument-region address, global size, local size) of an EXEC, for a device's `pm_lower`."""
  return x.arg.prg, x.src[1], x.src[2:5], x.src[5:8]


def exec_packet(q: Any, x: UOp, name: str = "dispatch") -> UOp:
  """The PACKET of an EXEC as the device queue `q` records it: `q.exec(program, args address, global, local)`."""
  prg, args, gs, ls = exec_parts(x)
  return packet(q.exec(prg, args, gs, ls), f"{name} {x.arg.name}")


def indirect_packet(q: Any, x: UOp) -> UOp:
  """The PACKET of INDIRECT(body) as `q.indirect_buffer(address, dwords)` records it: the kick runs the body's command
  buffer in place."""
  return packet(q.indirect_buffer(addr_of(x.src[0]), body_dwords(x.src[0])), "indirect buffer")


def body_dwords(q: UOp) -> int:
  """How many dwords a lowered body QUEUE (a QUEUE of PACKETs) holds."""
  return sum(len(p.src) for p in q.src[1:])


def addr_of(x: UOp) -> UOp:
  """ADDR(x): the device address of a body QUEUE's command buffer (known once bufferized)."""
  return UOp(Ops.ADDR, dtypes.uint64, (x,))


def inline_body(x: UOp) -> UOp:
  """INDIRECT(body) as the body's dwords copied into the kick (engines that can't run a buffer in place)."""
  return UOp(Ops.PACKET, dtypes.void, tuple(d for p in x.src[0].src[1:] for d in p.src), "inline")


# ***** 8. bufferize *****

def _bufferize(ctx: HCQ2Ctx, sink: UOp) -> UOp:
  sub: dict[UOp, UOp] = {}
  mems: dict[UOp, Mem] = {}
  bufs: list[UOp] = []
  for u in sink.toposort():
    if u.op not in (Ops.ADDR, Ops.INDIRECT) or u.src[0].op not in (Ops.QUEUE, Ops.KERNARGS): continue
    x = u.src[0]
    if x not in mems:
      if x.op is Ops.QUEUE:
        mems[x] = ctx.alloc(4 * body_dwords(x))
        dwords = tuple(d for p in x.src[1:] for d in p.src)
        bufs.append(UOp(Ops.CMDBUF, dtypes.void, dwords, CmdbufArg(mems[x], x.arg[0])))
      else:
        mems[x] = ctx.alloc(x.arg.size)
        bufs.append(x.replace(arg=replace(x.arg, mem=mems[x])))
    if u.op is Ops.ADDR: sub[u] = _u64(mems[x].va)
    else: sub[u] = UOp(Ops.INDIRECT, dtypes.void, (_u64(mems[x].va), _u64(body_dwords(x))), u.arg)
  kicks = [k for k in sink.src if k.op is Ops.QUEUE]
  out = UOp(Ops.SINK, dtypes.void, (*kicks, *bufs), "bufferized")
  return out.substitute(sub) if sub else out


pm_bufferize = PatternMatcher([(UPat(Ops.SINK, arg="kernargs", name="sink"), _bufferize)], name="hcq bufferize")


# ***** 9. patches: what changes between replays *****

def _lift_cmdbuf(b: UOp) -> UOp | None:
  if b.arg.lifted: return None
  va = b.arg.mem.va
  src = tuple(UOp(Ops.PATCH, dtypes.void, (d,), PatchArg(va + 4 * i, 0, 32, False, f"{b.arg.engine} dword {i}"))
              if _dynamic(d) else d for i, d in enumerate(b.src))
  return b.replace(src=src, arg=replace(b.arg, lifted=True))


def _lift_kernargs(k: UOp) -> UOp | None:
  a: KernargsArg = k.arg
  if a.lifted or a.mem is None: return None
  patches = []
  for off, e in a.regions:
    prg, _, gs, ls = exec_parts(e)
    lay = prg.args_layout(e.arg.nbufs, e.arg.nvals)
    region = a.mem.va + off
    bufs = e.src[8:8 + e.arg.nbufs]
    vals = e.src[8 + e.arg.nbufs:]
    for i, (b, o) in enumerate(zip(bufs, lay.buf_offsets)):
      if _dynamic(b): patches.append(UOp(Ops.PATCH, dtypes.void, (b,), PatchArg(region + o, 0, 64, False,
                                                                              f"{e.arg.name} buffer {i}")))
    for v, o in zip(vals, lay.val_offsets):
      patches.append(UOp(Ops.PATCH, dtypes.void, (v,), PatchArg(region + o, 0, 32, True, f"{e.arg.name} {v.arg[0]}")))
    for bit, nbits, val in prg.launch_fields(gs, ls):
      if isinstance(val, UOp) and _dynamic(val):
        patches.append(UOp(Ops.PATCH, dtypes.void, (val,), PatchArg(region + bit // 32 * 4, bit % 32, nbits, False,
                                                                  f"{e.arg.name} launch size")))
  return k.replace(src=k.src[:1] + tuple(patches), arg=replace(a, lifted=True))


pm_patches = PatternMatcher([(UPat(Ops.CMDBUF, name="b"), _lift_cmdbuf),
                             (UPat(Ops.KERNARGS, name="k"), _lift_kernargs)], name="hcq patches")


# ***** 10. resolve what is constant *****

def _const_int(u: UOp, what: str) -> int:
  if u.op is not Ops.CONST: raise ValueError(f"HCQ2: {what} is not constant after folding: {u.render()}")
  return int(u.arg)


def _write_cmdbuf(b: UOp) -> UOp | None:
  a: CmdbufArg = b.arg
  if a.written or not a.lifted: return None
  words = (ctypes.c_uint32 * len(b.src)).from_address(a.mem.va)
  for i, d in enumerate(b.src):
    if d.op is Ops.PATCH: continue
    v = _const_int(d, f"{a.engine} command dword {i}")
    if not 0 <= v <= 0xFFFFFFFF: raise ValueError(f"{a.engine} command dword {i} = {v:#x} does not fit 32 bits")
    words[i] = v
  return b.replace(arg=replace(a, written=True))


def _capture_value(u: UOp, ctx: HCQ2Ctx) -> int:
  """A launch size at capture: a constant, or a symbolic size evaluated with the captured variable values. A size
  over a variable with no captured value (a launch hook's `launch<k>.<g|l><axis>`, or one every replay must give:
  `_need`) is patched by each replay before the kernel runs: 1 stands in. Anything else that can't be evaluated is
  an error (it used to be written as 1 too: a kernel launched with one workgroup)."""
  if u.op is Ops.CONST: return int(u.arg)
  if not {v.arg[0] for v in u.vars} <= ctx.defaults.keys(): return 1  # patched at replay (see the docstring)
  return int(u.sym_infer(ctx.defaults))


def _write_kernargs(ctx: HCQ2Ctx, k: UOp) -> UOp | None:
  a: KernargsArg = k.arg
  if a.written or not a.lifted or a.mem is None: return None
  for off, e in a.regions:
    prg, _, gs, ls = exec_parts(e)
    region = a.mem.va + off
    ctypes.memset(region, 0, _region_size(e))
    bufs = [int(b.arg) if b.op is Ops.CONST else 0 for b in e.src[8:8 + e.arg.nbufs]]
    vals = [ctx.defaults[v.arg[0]] for v in e.src[8 + e.arg.nbufs:]]
    prg.fill_args(region, bufs, vals)
    prg.fill_launch(region, *([_capture_value(d, ctx) for d in dims] for dims in (gs, ls)))
  return k.replace(arg=replace(a, written=True))


def _fold(x: UOp) -> UOp | None:
  from tiny_uop.symbolic import symbolic_simple
  return symbolic_simple.rewrite(x)


_ALU = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.CAST,
        Ops.NEG, Ops.WHERE, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)
pm_resolve = PatternMatcher([(UPat(_ALU, name="x"), _fold),
                             (UPat(Ops.CMDBUF, name="b"), _write_cmdbuf),
                             (UPat(Ops.KERNARGS, name="k"), _write_kernargs)], name="hcq resolve")


# ***** 11. parametrize the host buffers *****

def _host(q: UOp) -> UOp:
  parts: list[UOp] = []
  run: list[UOp] = []
  for c in q.src[1:]:
    if c.op is Ops.PACKET: run += c.src
    else:
      if c.op is not Ops.INDIRECT: raise ValueError(f"HCQ2: the kick queue still holds {c.op} after lowering")
      if run: parts.append(UOp(Ops.PACKET, dtypes.void, tuple(run), "host"))
      parts.append(c)
      run = []
  if run: parts.append(UOp(Ops.PACKET, dtypes.void, tuple(run), "host"))
  return UOp(Ops.SUBMIT, dtypes.void, tuple(parts), q.arg[0])


pm_host = PatternMatcher([(UPat(Ops.QUEUE, name="q", custom=lambda q: q.arg[1] == "kick"), _host)], name="hcq host")


# ***** 12. callify: one host call that patches and submits *****

_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<",
          Ops.SHR: ">>", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "=="}


def _cdiv(a: int, b: int) -> int: return abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) if b else 0
def _cmod(a: int, b: int) -> int: return a - _cdiv(a, b) * b if b else 0


class _Renderer:
  """Python source of expression UOps over the replay's locals (`p<slot>` input addresses, `v<n>` variables)."""

  def __init__(self) -> None:
    self.params: set[int] = set()
    self.vars: dict[str, str] = {}

  def var(self, name: str) -> str: return self.vars.setdefault(name, f"v{len(self.vars)}")

  def __call__(self, root: UOp) -> str:
    txt: dict[UOp, str] = {}
    for u in root.toposort():
      s = [txt[x] for x in u.src]
      if u.op is Ops.CONST: t = str(int(u.arg))
      elif u.op is Ops.PARAM:
        self.params.add(u.arg)
        t = f"p{u.arg}"
      elif u.op is Ops.DEFINE_VAR: t = self.var(u.arg[0])
      elif u.op in _INFIX: t = f"({s[0]}{_INFIX[u.op]}{s[1]})"
      elif u.op is Ops.CDIV: t = f"_cdiv({s[0]}, {s[1]})"
      elif u.op is Ops.CMOD: t = f"_cmod({s[0]}, {s[1]})"
      elif u.op is Ops.MAX: t = f"max({s[0]}, {s[1]})"
      elif u.op is Ops.NEG: t = f"(-{s[0]})"
      elif u.op is Ops.WHERE: t = f"({s[1]} if {s[0]} else {s[2]})"
      elif u.op is Ops.CAST: t = s[0]  # ints only: the field's range check catches a value that would wrap
      else: raise ValueError(f"HCQ2 can't evaluate {u.op} in a replay value: {u.render()}")
      txt[u] = t
    return txt[root]


def _field_range(p: PatchArg) -> tuple[int, int]:
  return (-(1 << (p.bits - 1)), (1 << (p.bits - 1)) - 1) if p.signed else (0, (1 << p.bits) - 1)


def _needs_check(u: UOp, lo: int, hi: int) -> bool:
  try: return not (lo <= int(u.vmin) and int(u.vmax) <= hi)
  except (TypeError, ValueError): return True


def _bad_value(what: str, v: int, lo: int, hi: int) -> None:
  raise ValueError(f"HCQ2 replay: {what} = {v} does not fit its field (valid {lo}..{hi})")


def _callify(ctx: HCQ2Ctx, sink: UOp) -> UOp:
  dev = ctx.dev
  r = _Renderer()
  ns: dict[str, Any] = {"_cdiv": _cdiv, "_cmod": _cmod, "_bad": _bad_value, "D": dev, "LAST": [0]}
  body: list[str] = []
  # device memory patches, grouped by value: one compare per distinct value
  groups: dict[UOp, list[tuple[PatchArg, str, Mem]]] = {}
  for bi, b in enumerate(x for x in sink.src if x.op in (Ops.CMDBUF, Ops.KERNARGS)):
    mem: Mem = b.arg.mem
    ns[f"B{bi}_32"] = (ctypes.c_uint32 * (mem.size // 4)).from_address(mem.va)
    ns[f"B{bi}_64"] = (ctypes.c_uint64 * (mem.size // 8)).from_address(mem.va)
    for pu in b.src:
      if pu.op is Ops.PATCH: groups.setdefault(pu.src[0], []).append((pu.arg, f"B{bi}", mem))
  ns["L"] = [None] * len(groups)
  for gi, (val, patches) in enumerate(groups.items()):
    body.append(f"  x = {r(val)}")
    body.append(f"  if x != L[{gi}]:")
    body.append("    if not W: W = _idle()")
    for p, _, _ in patches:
      lo, hi = _field_range(p)
      if _needs_check(val, lo, hi): body.append(f"    if not {lo} <= x <= {hi}: _bad({p.what!r}, x, {lo}, {hi})")
    body.append(f"    L[{gi}] = x")
    for p, bname, mem in patches:
      off = p.addr - mem.va
      if p.bits == 64 and p.shift == 0 and off % 8 == 0: body.append(f"    {bname}_64[{off // 8}] = x & {U64_MAX}")
      elif p.bits == 32 and p.shift == 0: body.append(f"    {bname}_32[{off // 4}] = x & 4294967295")
      elif p.shift + p.bits <= 32:
        mask = ((1 << p.bits) - 1) << p.shift
        body.append(f"    {bname}_32[{off // 4}] = ({bname}_32[{off // 4}] & {0xFFFFFFFF ^ mask}) | "
                    f"((x << {p.shift}) & {mask})")
      else: raise ValueError(f"HCQ2: a field of {p.bits} bits at bit {p.shift} crosses a 32-bit word ({p.what})")
  # the submissions: host dword templates with their parameters
  subs: list[str] = []
  for si, s in enumerate(x for x in sink.src if x.op is Ops.SUBMIT):
    ns[f"S{si}"] = dev.hcq_submitter(s.arg)
    parts = []
    for part in s.src:
      if part.op is Ops.INDIRECT: parts.append(f"({_const_int(part.src[0], 'a bound buffer')}, "
                                            f"{_const_int(part.src[1], 'its size')})")
      else:
        dws = []
        for d in part.src:
          t = r(d)
          if d.op is not Ops.CONST and _needs_check(d, 0, 0xFFFFFFFF): t = f"_c32({t})"
          dws.append(t)
        parts.append(f"[{', '.join(dws)}]")
    subs.append(f"  S{si}([{', '.join(parts)}])")
  ns["_c32"] = _c32
  head = ["def replay(inputs, vv):", "  W = False"]
  wait_name, signal_name = (v.arg[0] for v in timeline_vars(dev.device))
  # the timeline value is taken once every check passed: a replay that raises leaves no value nobody signals
  timeline = [f"  {r.var(signal_name)} = D.next_timeline()", f"  {r.var(wait_name)} = {r.var(signal_name)} - 1"] \
    if signal_name in r.vars or wait_name in r.vars else []
  head += [f"  p{i} = inputs[{i}].va_addr" for i in sorted(r.params)]
  for hi_, (k, names) in enumerate(ctx.hooks):
    ns[f"K{hi_}"] = k
    head.append(f"  h = _launch3(K{hi_}.launch(vv))")
    head += [f"  {r.var(n)} = h[{a}]" for a, n in enumerate(names)]
  ns["_launch3"] = _launch3
  for name, local in r.vars.items():
    if name in (wait_name, signal_name) or any(name in names for _, names in ctx.hooks): continue
    if name in ctx.defaults: head.append(f"  {local} = vv.get({name!r}, {ctx.defaults[name]})")
    else: head.append(f"  {local} = _need(vv, {name!r})")
  ns["_need"] = _need
  ns["_idle"] = lambda: _idle(dev, ns["LAST"])
  tail = [f"  LAST[0] = {r.var(signal_name)}"] if signal_name in r.vars else []
  src = "\n".join(head + body + timeline + subs + tail) + "\n"
  exec(compile(src, f"<hcq2 replay {dev.device}>", "exec"), ns)  # noqa: S102 -- our own generated replay
  ctx.ns, ctx.fn = ns, ns["replay"]
  return UOp(Ops.SOURCE, dtypes.void, (), src)


def _c32(v: int) -> int:
  if not 0 <= v <= 0xFFFFFFFF: raise ValueError(f"HCQ2 replay: a command dword = {v} does not fit 32 bits")
  return v


def _need(vv: dict[str, int], name: str) -> int:
  if name not in vv: raise KeyError(f"HCQ2 replay needs variable {name!r} (a launch size depends on it); given: "
                                    f"{sorted(vv)}")
  return vv[name]


def _launch3(gl: tuple) -> tuple[int, ...]:
  gs, ls = gl
  return (tuple(gs) + (1, 1, 1))[:3] + (tuple(ls or ()) + (1, 1, 1))[:3]


def _idle(dev: Any, last: list[int]) -> bool:
  """Wait until the last replay finished (it reads the argument regions and command buffers a patch rewrites)."""
  if last[0]: dev.timeline_signal.wait(last[0])
  return True


pm_callify = PatternMatcher([(UPat(Ops.SINK, arg="bufferized", name="sink"), _callify)], name="hcq callify")


# ***** the pipeline *****

def _lower(dev: Any) -> PatternMatcher:
  pm = getattr(dev, "pm_lower", None)
  if not isinstance(pm, PatternMatcher): raise RuntimeError(f"{dev.device} has no HCQ2 encoder (pm_lower)")
  return pm


PIPELINE: list[tuple[str, Callable[[Any], PatternMatcher]]] = [
  ("prepare", lambda dev: pm_prepare), ("split", lambda dev: pm_split), ("deps", lambda dev: pm_deps),
  ("timeline", lambda dev: pm_timeline), ("resets", lambda dev: pm_resets), ("kernargs", lambda dev: pm_kernargs),
  ("lower", _lower), ("bufferize", lambda dev: pm_bufferize), ("patches", lambda dev: pm_patches),
  ("resolve", lambda dev: pm_resolve), ("host", lambda dev: pm_host), ("callify", lambda dev: pm_callify),
]
_LEFT_AFTER_LOWER = (Ops.EXEC, Ops.XFER, Ops.WAIT, Ops.SIGNAL, Ops.MEMBAR)


def run_pipeline(dev: Any, linear: UOp, ctx: HCQ2Ctx | None = None,
                 keep: list[tuple[str, UOp]] | None = None) -> tuple[UOp, HCQ2Ctx]:
  """Run every pass of `PIPELINE` on `linear` (a LINEAR of CALLs); returns the final SOURCE and the context (whose
  `fn` is the replay). `keep` collects `(pass name, its output)`; `HCQ2=2` prints each."""
  ctx = ctx or HCQ2Ctx(dev)
  u = linear
  for name, pm_of in PIPELINE:
    pm = pm_of(dev)
    u = graph_rewrite(u, pm, ctx, name=f"hcq {name}")
    if name == "lower" and (left := {x.op for x in u.toposort() if x.op in _LEFT_AFTER_LOWER}):
      raise RuntimeError(f"{dev.device}'s pm_lower does not encode {sorted(o.name for o in left)}")
    if keep is not None: keep.append((name, u))
    if HCQ2.value >= 2:
      print(f"*** HCQ2 {dev.device} after {name}:\n" + (u.arg if u.op is Ops.SOURCE else pretty_print(u)))
  return u, ctx


class HCQ2Graph:
  """TinyJit's device graph on HCQ devices (docs/PIPELINE.md §7): `HCQ2Graph(dev, calls)` runs the pipeline once;
  `graph(inputs, var_vals)` is one call of the generated replay. `HCQ2Graph.builds` counts constructions; `source` is
  the replay's Python source."""
  builds = 0

  @staticmethod
  def supports(dev: Any, call: Any) -> bool:
    """Kernels of `HCQProgram`s; copies (`bufs = [dst, src]`, `nbytes`) between two buffers of this device."""
    from tiny_uop.hcq import HCQProgram
    if getattr(call, "prg", None) is not None: return isinstance(call.prg, HCQProgram)
    return getattr(call, "nbytes", 0) > 0

  def __init__(self, dev: Any, calls: Sequence[Any]):
    if not HCQ2.value: raise ValueError("HCQ2=0 asks for the imperative HCQGraph, which was removed: HCQ2 is TinyJit's "
                                        "graph on HCQ devices (JIT=2 replays kernel by kernel without graphs)")
    self.dev, self.calls = dev, list(calls)
    self.ctx = HCQ2Ctx(dev)
    final, _ = run_pipeline(dev, linear_of(dev, self.calls), self.ctx)
    self.source: str = final.arg
    self.replay: Callable = self.ctx.fn  # type: ignore[assignment]
    HCQ2Graph.builds += 1

  @property
  def last_signal(self) -> int: return self.ctx.ns["LAST"][0]

  def __call__(self, inputs: Sequence[Any], var_vals: dict[str, int] | None = None) -> None:
    self.replay(inputs, var_vals or {})

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    if getattr(self, "ctx", None) is None: return  # refused before it allocated anything (HCQ2=0)
    with _errors("HCQ2Graph.__del__ (freeing its buffers and signals)"):
      last = self.ctx.ns.get("LAST", [0])[0]
      for buf in self.ctx.allocs: self.dev.defer_free(buf, last)
      if self.ctx.signals and self.dev.timeline_signal.value >= last and hasattr(self.dev, "_free_signals"):
        self.dev._free_signals += [s.addr for s in self.ctx.signals]

