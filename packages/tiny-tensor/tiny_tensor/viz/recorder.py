"""The trace writer: a `tiny_uop.trace.Recorder` that writes what it is told to a JSON-lines file.

The format (version 1), one JSON array per line, the first item saying what the line is:

  ["tiny-viz", 1, {"argv": [...], "pid": n, "time": unix_seconds}]      the header, first line
  ["n", id, op, dtype, arg, [src ids], tag]                              a UOp (after its sources), written once
  ["r", id, function, "file.py:line", pattern]                           a rewrite rule, written once
  ["s", id, ctx, name, before, after, depth, [[rule, count], ...], ms, kind]
        a step of context `ctx`: `kind` "rewrite" (one graph_rewrite; `depth` > 0 when called from inside another),
        "stage" (a lowering stage), "schedule" (tensor graph -> LINEAR of CALLs) or "linearize"; before/after are
        node ids (after is null when the rewrite raised); ids number steps in the order they started
  ["c", id, kind, name, parent, info]                                    a context (schedule, kernel, other), written
        when it ends (its steps come before it); info: kernel {"device", "renderer", "source", "ast"}; schedule
        {"calls", "kernels": [ast ids]}; "error" when it raised
  ["l", device, name, start_ms, duration_ms]                            a kernel launch (engine or TinyJit replay)

Graphs are stored once: a node is written the first time any step refers to it and later steps refer to it by id, so
the steps of a pipeline, which share most of their nodes, cost only the nodes they add. The writer holds nodes weakly
(recording never keeps a graph or its buffers alive); a node freed and built again is written again. Walks are
iterative.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import weakref
from typing import IO, Any, Callable

from tiny_uop import trace
from tiny_uop.dtype import DType
from tiny_uop.uop import Ops, UOp

FORMAT = "tiny-viz"
VERSION = 1
ARG_MAX = 300  # characters of an arg's text kept in the trace


def fmt_dtype(dt: DType, _cache: dict[DType, str] = {}) -> str:  # noqa: B006 -- a cache: DTypes are interned
  """`float32`, `int.vec(4)`, `float32.ptr(16)`: a dtype without the `dtypes.` prefix."""
  if (s := _cache.get(dt)) is None: s = _cache[dt] = repr(dt).replace("dtypes.", "")
  return s


def fmt_arg(x: Any, limit: int = ARG_MAX) -> str:
  """A node's arg as short text: constants and tuples as Python writes them, UOps inside (symbolic sizes) by op."""
  if x is None: return ""
  if isinstance(x, UOp): s = _uop_label(x)
  elif isinstance(x, Ops): s = x.name
  elif isinstance(x, tuple) and any(isinstance(y, (UOp, tuple)) for y in x): s = _tuple_text(x)
  else: s = repr(x)
  return s if len(s) <= limit else s[:limit - 3] + "..."


def _uop_label(u: UOp) -> str:
  if u.op is Ops.DEFINE_VAR and isinstance(u.arg, tuple): return str(u.arg[0])
  if u.op is Ops.CONST: return repr(u.arg)
  return u.op.name


def _tuple_text(x: tuple) -> str:
  """Nested tuples (an arg is a small Python value, not a graph) with an explicit stack instead of recursion."""
  out: list[str] = []
  stack: list[tuple[bool, Any]] = [(False, x)]  # (is literal text, item)
  while stack:
    literal, item = stack.pop()
    if literal: out.append(item)
    elif isinstance(item, tuple):
      parts: list[tuple[bool, Any]] = [(True, "(")]
      for i, y in enumerate(item): parts += [(True, ", "), (False, y)] if i else [(False, y)]
      parts.append((True, ",)" if len(item) == 1 else ")"))
      stack.extend(reversed(parts))
    elif isinstance(item, UOp): out.append(_uop_label(item))
    elif isinstance(item, Ops): out.append(item.name)
    else: out.append(repr(item))
  return "".join(out)


class VizRecorder(trace.Recorder):
  """Writes schedules, kernels, their rewrite steps and launches to `path` (see the module doc for the format).

  Thread-safe: writes are serialized; the context and rewrite stacks are per thread.
  """

  def __init__(self, path: str):
    self.path = path
    self.f: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 -- closed by close()
    self.lock = threading.RLock()
    self.t0 = time.perf_counter()
    # node ids, held weakly: recording must not keep a program's graphs (and so its buffers) alive; a node that died and
    # is built again is written again under a new id
    self.ids: weakref.WeakKeyDictionary[UOp, int] = weakref.WeakKeyDictionary()
    self.n_nodes = 0
    self.rule_ids: dict[Any, int] = {}
    self.n_steps = self.n_ctx = self.n_launches = 0
    self.kernels: dict[tuple[int, str], str] = {}  # (ast id, device) -> kernel name, recorded once
    self.counts = {"schedule": 0, "kernel": 0, "other": 0}
    self.other_ctx: int | None = None  # the context of rewrites outside any schedule or kernel
    self.last: dict[int, UOp] = {}  # context id -> the graph its latest top-level step made
    self.local = threading.local()
    self.closed = False
    self._write([FORMAT, VERSION, {"argv": list(sys.argv), "pid": os.getpid(), "time": time.time()}])

  # ***** writing *****
  def _write(self, rec: list) -> None:
    self.f.write(json.dumps(rec, separators=(",", ":"), default=str))
    self.f.write("\n")

  def node(self, root: UOp) -> int:
    """The id of `root`, writing it and every source not written yet (sources first; iterative)."""
    ids = self.ids
    if (i := ids.get(root)) is not None: return i
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
      n, ready = stack.pop()
      if n in ids: continue
      if not ready:
        stack.append((n, True))
        stack.extend((s, False) for s in n.src if s not in ids)
        continue
      i = ids[n] = self.n_nodes
      self.n_nodes += 1
      self._write(["n", i, n.op.name, fmt_dtype(n.dtype), fmt_arg(n.arg), [ids[s] for s in n.src],
                   None if n.tag is None else fmt_arg(n.tag)])
    return ids[root]

  def _rule(self, rule: Any) -> int:
    if (i := self.rule_ids.get(rule)) is None:
      i = self.rule_ids[rule] = len(self.rule_ids)
      fn, where = trace.rule_location(rule)
      pat = repr(rule[0])
      self._write(["r", i, fn, where, pat if len(pat) <= 200 else pat[:197] + "..."])
    return i

  # ***** per-thread state *****
  def _stacks(self) -> tuple[list[int], list[int]]:
    """(open contexts, open rewrites' step ids) of this thread."""
    loc = self.local
    if not hasattr(loc, "ctx"): loc.ctx, loc.rw = [], []
    return loc.ctx, loc.rw

  def _current_ctx(self) -> int:
    ctx, _ = self._stacks()
    if ctx: return ctx[-1]
    if self.other_ctx is None:  # rewrites outside schedules and kernels (tensor-level simplification, ...)
      with self.lock:
        self.other_ctx = self.n_ctx
        self.n_ctx += 1
        self.counts["other"] += 1
        self._write(["c", self.other_ctx, "other", "rewrites outside schedules and kernels", None, {}])
    return self.other_ctx

  def _ms(self, t: float) -> float: return round((t - self.t0) * 1e3, 4)

  # ***** the Recorder hooks *****
  def rewrite_begin(self, name: str, sink: UOp) -> Any:
    if self.closed: return None
    _, rw = self._stacks()
    with self.lock:
      sid = self.n_steps
      self.n_steps += 1
    rw.append(sid)
    return (sid, self._current_ctx(), name, sink, len(rw) - 1)

  def rewrite_end(self, token: Any, result: UOp | None, fired: dict, seconds: float) -> None:
    if token is None: return
    sid, cid, name, sink, depth = token
    _, rw = self._stacks()
    if rw and rw[-1] == sid: rw.pop()
    if self.closed: return
    with self.lock:
      before = self.node(sink)
      after = self.node(result) if result is not None else None
      rules = sorted(([self._rule(r), c] for r, c in fired.items()), key=lambda rc: -rc[1])
      if depth == 0 and result is not None and cid != self.other_ctx: self.last[cid] = result
      self._write(["s", sid, cid, name, before, after, depth, rules, round(seconds * 1e3, 4), "rewrite"])

  def _step(self, cid: int, name: str, before: UOp, after: UOp, kind: str, seconds: float = 0.0) -> None:
    with self.lock:
      sid = self.n_steps
      self.n_steps += 1
      _, rw = self._stacks()
      self._write(["s", sid, cid, name, self.node(before), self.node(after), len(rw), [], round(seconds * 1e3, 4),
                   kind])

  def stage(self, name: str, before: UOp, after: UOp) -> None:
    if self.closed: return
    self._step(cid := self._current_ctx(), name, before, after, "stage")
    self.last[cid] = after

  def launch(self, device: str, name: str, start_s: float, seconds: float) -> None:
    if self.closed: return
    with self.lock:
      self.n_launches += 1
      self._write(["l", device, name, self._ms(start_s), round(seconds * 1e3, 6)])

  def context(self, kind: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
    if self.closed or kind not in ("schedule", "kernel"): return fn(*args, **kwargs)
    ctx, _ = self._stacks()
    with self.lock:
      cid = self.n_ctx
      self.n_ctx += 1
      steps_before = self.n_steps
    parent = ctx[-1] if ctx else None
    ctx.append(cid)
    st = time.perf_counter()
    try: result = fn(*args, **kwargs)
    except BaseException as e:
      ctx.pop()
      self._end_context(cid, kind, parent, args, None, {"error": f"{type(e).__name__}: {e}"}, st)
      raise
    ctx.pop()
    if kind == "kernel" and self.n_steps == steps_before and self._known_kernel(args):
      return result  # a compile-cache hit of a kernel already in the trace: nothing new to show
    self._end_context(cid, kind, parent, args, result, {}, st)
    return result

  def _known_kernel(self, args: tuple) -> bool:
    ast, renderer = args[0], args[1]
    return (self.ids.get(ast, -1), getattr(renderer, "device", "?")) in self.kernels

  def _end_context(self, cid: int, kind: str, parent: int | None, args: tuple, result: Any, info: dict,
                   st: float) -> None:
    if self.closed: return
    info["ms"] = round((time.perf_counter() - st) * 1e3, 4)
    with self.lock:
      self.counts[kind] += 1
      if kind == "schedule": name = self._end_schedule(cid, args, result, info)
      else: name = self._end_kernel(cid, args, result, info)
      self._write(["c", cid, kind, name, parent, info])
      self.last.pop(cid, None)
      if parent is None: self.f.flush()

  def _end_schedule(self, cid: int, args: tuple, result: Any, info: dict) -> str:
    sink: UOp = args[0]
    name = f"schedule {self.counts['schedule']}"
    if result is None: return name
    calls = list(result.calls)
    kernels = [c.src[0] for c in calls if c.src[0].op is Ops.SINK]
    self._step(cid, "schedule", sink, UOp(Ops.LINEAR, src=tuple(calls)), "schedule", info["ms"] / 1e3)
    info["calls"], info["kernels"] = len(calls), [self.node(k) for k in kernels]
    info["outputs"] = len(sink.src)
    return f"{name}: {len(kernels)} kernel{'s' * (len(kernels) != 1)}, {len(calls)} call{'s' * (len(calls) != 1)}"

  def _end_kernel(self, cid: int, args: tuple, result: Any, info: dict) -> str:
    ast, renderer = args[0], args[1]
    from tiny_codegen.program import kernel_name
    name = kernel_name(ast)
    device = getattr(renderer, "device", "?")
    info.update(device=device, renderer=type(renderer).__name__, ast=self.node(ast))
    if result is not None and result.op is Ops.PROGRAM:
      name = getattr(result.arg, "name", name)
      _, _, linear, source, _ = result.src
      info["source"] = source.arg
      info["uops"] = len(linear.src)
      self._step(cid, "linearize", self.last.get(cid, ast), linear, "linearize")
    self.kernels[(info["ast"], device)] = name
    return name

  def close(self) -> None:
    """Stop recording into the file (later hooks are ignored) and close it."""
    with self.lock:
      if self.closed: return
      self.closed = True
      self.f.close()
