"""The trace reader: a VIZ trace file (format in `tiny_tensor.viz.recorder`) as Python objects, checked as it is read.

>>> t = load("trace.jsonl")                                           # doctest: +SKIP
>>> [k.name for k in t.kernels], [s.name for s in t.kernels[0].steps] # doctest: +SKIP
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tiny_tensor.viz.recorder import FORMAT, VERSION


class TraceError(ValueError):
  """A file that is not a VIZ trace, or a broken one: the message names the file and the line."""


@dataclass(frozen=True)
class Node:
  """One UOp of the trace: op name, dtype text, arg text, source node ids, tag text (None: no tag)."""
  op: str
  dtype: str
  arg: str
  src: tuple[int, ...]
  tag: str | None = None


@dataclass(frozen=True)
class Rule:
  """A rewrite rule: its function, where it is written ("file.py:line") and its pattern."""
  fn: str
  where: str
  pattern: str


@dataclass
class Step:
  """One step of a context: a graph_rewrite ("rewrite"), a lowering stage ("stage"), "schedule" or "linearize"."""
  id: int
  ctx: int
  name: str
  before: int
  after: int | None
  depth: int
  rules: list[tuple[int, int]]  # (rule id, times it fired)
  ms: float
  kind: str

  @property
  def changed(self) -> bool:
    """Whether the graph after differs from the graph before."""
    return self.after != self.before


@dataclass
class Context:
  """A schedule, a kernel, or "other" (rewrites outside both), with its steps in the order they started."""
  id: int
  kind: str
  name: str
  parent: int | None
  info: dict[str, Any]
  steps: list[Step] = field(default_factory=list)

  @property
  def source(self) -> str | None:
    """A kernel's final source (None for other contexts, or when compiling it raised)."""
    return self.info.get("source")


@dataclass(frozen=True)
class Launch:
  """A kernel launch: device, kernel name, start (ms since recording began), duration (ms)."""
  device: str
  name: str
  start_ms: float
  ms: float


@dataclass
class Trace:
  """A whole trace: the nodes by id, the rules, the contexts with their steps, the launches."""
  path: str
  header: dict[str, Any]
  nodes: dict[int, Node]
  rules: dict[int, Rule]
  contexts: dict[int, Context]
  launches: list[Launch]

  @property
  def schedules(self) -> list[Context]: return [c for c in self.contexts.values() if c.kind == "schedule"]
  @property
  def kernels(self) -> list[Context]: return [c for c in self.contexts.values() if c.kind == "kernel"]

  def kernel(self, name: str) -> Context:
    """The kernel context named `name` (the first one when it was compiled for several devices)."""
    for k in self.kernels:
      if k.name == name: return k
    raise KeyError(f"no kernel {name!r} in {self.path}; kernels: {[k.name for k in self.kernels]}")

  def graph(self, root: int) -> list[int]:
    """The node ids of the graph under `root`, sources before users (iterative)."""
    out: dict[int, None] = {}
    stack: list[tuple[int, bool]] = [(root, False)]
    while stack:
      n, ready = stack.pop()
      if n in out: continue
      if ready: out[n] = None
      else:
        stack.append((n, True))
        stack.extend((s, False) for s in self.nodes[n].src if s not in out)
    return list(out)


def _fail(path: str, lineno: int, msg: str) -> TraceError:
  return TraceError(f"{path}:{lineno}: {msg}")


def load(path: str) -> Trace:
  """Read and check the trace at `path`; a TraceError names the first bad line."""
  nodes: dict[int, Node] = {}
  rules: dict[int, Rule] = {}
  contexts: dict[int, Context] = {}
  steps: list[Step] = []
  launches: list[Launch] = []
  header: dict[str, Any] | None = None
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip(): continue
      try: rec = json.loads(line)
      except json.JSONDecodeError as e: raise _fail(path, lineno, f"not JSON ({e.msg})") from e
      if not isinstance(rec, list) or not rec: raise _fail(path, lineno, f"a record is a JSON array, got {line[:60]!r}")
      kind = rec[0]
      if header is None:
        if kind != FORMAT: raise _fail(path, lineno, f"not a VIZ trace: the first line must start with {FORMAT!r}")
        if rec[1] != VERSION: raise _fail(path, lineno, f"trace format version {rec[1]}, this reader knows {VERSION}")
        header = rec[2]
        continue
      try:
        if kind == "n":
          _, i, op, dtype, arg, src, tag = rec
          missing = [s for s in src if s not in nodes]
          if missing: raise _fail(path, lineno, f"node {i} refers to nodes {missing} not defined before it")
          nodes[i] = Node(op, dtype, arg, tuple(src), tag)
        elif kind == "r":
          _, i, fn, where, pattern = rec
          rules[i] = Rule(fn, where, pattern)
        elif kind == "s":
          _, i, cid, name, before, after, depth, fired, ms, skind = rec
          for n in (before, after):
            if n is not None and n not in nodes: raise _fail(path, lineno, f"step {i} refers to undefined node {n}")
          for r, _c in fired:
            if r not in rules: raise _fail(path, lineno, f"step {i} refers to undefined rule {r}")
          steps.append(Step(i, cid, name, before, after, depth, [(r, c) for r, c in fired], ms, skind))
        elif kind == "c":
          _, i, ckind, name, parent, info = rec
          contexts[i] = Context(i, ckind, name, parent, info)
        elif kind == "l":
          _, device, name, start, ms = rec
          launches.append(Launch(device, name, start, ms))
        else: raise _fail(path, lineno, f"unknown record type {kind!r} (known: n, r, s, c, l)")
      except ValueError as e:  # a record with the wrong number of fields
        if isinstance(e, TraceError): raise
        raise _fail(path, lineno, f"bad {kind!r} record: {e}") from e
  if header is None: raise TraceError(f"{path}: empty file, not a VIZ trace")
  for s in sorted(steps, key=lambda s: s.id):
    if s.ctx not in contexts:  # the program stopped inside it (killed, or still running when the file was read)
      contexts[s.ctx] = Context(s.ctx, "unfinished", f"context {s.ctx} (did not finish)", None, {})
    contexts[s.ctx].steps.append(s)
  ordered = dict(sorted(contexts.items()))
  return Trace(path, header, nodes, rules, ordered, launches)
