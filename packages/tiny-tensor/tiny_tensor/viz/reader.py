"""The trace reader: a VIZ trace file (format in `tiny_tensor.viz.recorder`) as Python objects, checked as it is read.

>>> t = load("trace.jsonl")                                           # doctest: +SKIP
>>> [k.name for k in t.kernels], [s.name for s in t.kernels[0].steps] # doctest: +SKIP
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

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


# what each field of a record must be (the format: tiny_tensor.viz.recorder): a checker per field and its description
def _int(x: Any) -> bool: return type(x) is int
def _nat(x: Any) -> bool: return type(x) is int and x >= 0
def _opt_nat(x: Any) -> bool: return x is None or _nat(x)
def _str(x: Any) -> bool: return type(x) is str
def _opt_str(x: Any) -> bool: return x is None or type(x) is str
def _num(x: Any) -> bool: return type(x) in (int, float) and x == x and abs(x) != float("inf")
def _ids(x: Any) -> bool: return type(x) is list and all(_nat(i) for i in x)
def _pair(x: Any) -> bool: return type(x) is list and len(x) == 2 and _nat(x[0]) and _nat(x[1])
def _fired(x: Any) -> bool: return type(x) is list and all(_pair(p) for p in x)
def _dict(x: Any) -> bool: return type(x) is dict


_NAT, _STR = (_nat, "an id (an integer >= 0)"), (_str, "a string")
_OPT_NAT, _NUM = (_opt_nat, "an id or null"), (_num, "a finite number")
RECORDS: dict[str, tuple[tuple[str, tuple[Callable[[Any], bool], str]], ...]] = {
  "n": (("id", _NAT), ("op", _STR), ("dtype", _STR), ("arg", _STR), ("src", (_ids, "a list of node ids")),
        ("tag", (_opt_str, "a string or null"))),
  "r": (("id", _NAT), ("function", _STR), ("where", _STR), ("pattern", _STR)),
  "s": (("id", _NAT), ("ctx", _NAT), ("name", _STR), ("before", _NAT), ("after", _OPT_NAT),
        ("depth", (_nat, "an integer >= 0")), ("rules", (_fired, "a list of [rule id, count] pairs")), ("ms", _NUM),
        ("kind", _STR)),
  "c": (("id", _NAT), ("kind", _STR), ("name", _STR), ("parent", _OPT_NAT), ("info", (_dict, "a JSON object"))),
  "l": (("device", _STR), ("name", _STR), ("start_ms", _NUM), ("ms", _NUM)),
}
# the keys of a context's info the reader and the page use, and what each must be
INFO: dict[str, tuple[Callable[[Any], bool], str]] = {
  "source": (_opt_str, "a string or null"), "device": _STR, "renderer": _STR, "error": _STR, "ast": _NAT,
  "kernels": (_ids, "a list of node ids"), "calls": (_nat, "an integer >= 0"), "uops": (_nat, "an integer >= 0"),
  "outputs": (_nat, "an integer >= 0"), "ms": _NUM}


def _check(path: str, lineno: int, rec: list, kind: str) -> None:
  """Raise a TraceError naming the first field of record `rec` (type `kind`) that is not what the format says."""
  fields = RECORDS[kind]
  if len(rec) != len(fields) + 1:
    names = ", ".join(f for f, _ in fields)
    raise _fail(path, lineno, f"a {kind!r} record has {len(fields) + 1} items ({kind!r}, {names}), got {len(rec)}")
  for (name, (ok, what)), value in zip(fields, rec[1:]):
    if not ok(value): raise _fail(path, lineno, f"{kind!r} record: {name} must be {what}, got {_short(value)}")
  if kind == "c":
    for key, (ok, what) in INFO.items():
      if key in rec[5] and not ok(rec[5][key]):
        raise _fail(path, lineno, f"'c' record: info[{key!r}] must be {what}, got {_short(rec[5][key])}")


def _short(value: Any) -> str:
  text = json.dumps(value)
  return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _parse_line(path: str, lineno: int, raw: bytes) -> Any:
  try: text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    where = f"byte {raw[e.start]:#04x} at column {e.start + 1}"
    raise _fail(path, lineno, f"not UTF-8 ({where}); a trace is UTF-8 JSON") from e
  try: return json.loads(text)
  except json.JSONDecodeError as e: raise _fail(path, lineno, f"not JSON ({e.msg})") from e
  except RecursionError as e: raise _fail(path, lineno, "JSON nested too deeply for a trace record") from e


def _header(path: str, lineno: int, rec: Any) -> dict[str, Any]:
  if not isinstance(rec, list) or not rec or rec[0] != FORMAT:
    raise _fail(path, lineno, f"not a VIZ trace: the first line must be [{FORMAT!r}, {VERSION}, {{...}}]")
  if len(rec) != 3: raise _fail(path, lineno, f"the header is [{FORMAT!r}, version, {{...}}], got {len(rec)} items")
  if type(rec[1]) is not int or rec[1] != VERSION:
    raise _fail(path, lineno, f"trace format version {json.dumps(rec[1])[:60]}, this reader knows version {VERSION} "
                              "(an integer)")
  if not isinstance(rec[2], dict): raise _fail(path, lineno, f"the header's third item must be a JSON object, got "
                                                       f"{_short(rec[2])}")
  return rec[2]


def load(path: str) -> Trace:
  """Read and check the trace at `path`: every record against the format (`tiny_tensor.viz.recorder`), every id it
  refers to defined before it. A TraceError (a ValueError) names the first bad line and what was expected there."""
  nodes: dict[int, Node] = {}
  rules: dict[int, Rule] = {}
  contexts: dict[int, Context] = {}
  steps: list[Step] = []
  launches: list[Launch] = []
  header: dict[str, Any] | None = None
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, 1):
      if not raw.strip(): continue
      rec = _parse_line(path, lineno, raw)
      if header is None:
        header = _header(path, lineno, rec)
        continue
      if not isinstance(rec, list) or not rec:
        raise _fail(path, lineno, f"a record is a non-empty JSON array, got {_short(rec)}")
      kind = rec[0]
      if not isinstance(kind, str) or kind not in RECORDS:
        what = repr(kind) if isinstance(kind, str) else _short(kind)
        raise _fail(path, lineno, f"unknown record type {what[:60]} (known: n, r, s, c, l)")
      _check(path, lineno, rec, kind)
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
        if "ast" in info and info["ast"] not in nodes:
          raise _fail(path, lineno, f"context {i}: info['ast'] refers to undefined node {info['ast']}")
        contexts[i] = Context(i, ckind, name, parent, info)
      else:
        _, device, name, start, ms = rec
        launches.append(Launch(device, name, start, ms))
  if header is None: raise TraceError(f"{path}: empty file, not a VIZ trace")
  for s in sorted(steps, key=lambda s: s.id):
    if s.ctx not in contexts:  # the program stopped inside it (killed, or still running when the file was read)
      contexts[s.ctx] = Context(s.ctx, "unfinished", f"context {s.ctx} (did not finish)", None, {})
    contexts[s.ctx].steps.append(s)
  ordered = dict(sorted(contexts.items()))
  return Trace(path, header, nodes, rules, ordered, launches)
