"""Recording hooks for tracing tools (tiny-tensor's VIZ): what the compiler did, as it did it.

tiny-uop imports nothing outside the standard library and knows nothing of the tools that trace it. It exposes one
slot, `RECORDER`, which a tool fills with a `Recorder` (`install`). While it is None (the default) each hook below
costs one global lookup and one comparison:

- `graph_rewrite` (tiny_uop.pattern) hands every call to `record_rewrite`: the recorder sees its name, the graph
  before and after, and how often each rule fired (counted by `CountingMatcher`, a view of the same matcher);
- `@traced("schedule")` on tiny-codegen's `create_schedule` and `@traced("kernel")` on `to_program` hand each call
  to `Recorder.context` (the tensor graph -> the CALLs; a kernel AST -> its PROGRAM and final source);
- `Recorder.stage` is called by the lowering pipeline after each of its stages (tiny_codegen.lower);
- `Recorder.launch` is called by tiny-tensor's engine and TinyJit after each kernel launch.

A recorder must not raise from a hook for its own reasons: its errors would surface in the program traced.

>>> from tiny_uop import UOp, PatternMatcher, UPat, graph_rewrite
>>> class Names(Recorder):
...   def __init__(self): self.seen = []
...   def rewrite_begin(self, name, sink): self.seen.append(name)
>>> old = install(Names())
>>> graph_rewrite(UOp.variable("n", 0, 9) + 0, PatternMatcher([(UPat.var("x") + 0, lambda x: x)]), name="fold").render()
'n'
>>> install(old).seen
['fold']
"""
from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
  from tiny_uop.pattern import PatternMatcher, UPat
  from tiny_uop.uop import Ops, UOp

__all__ = ["Recorder", "RECORDER", "install", "traced", "record_rewrite", "CountingMatcher", "rule_location"]

F = TypeVar("F", bound=Callable[..., Any])
Rule = tuple["UPat", Callable]  # a rule of a PatternMatcher: (pattern, function)


class Recorder:
  """What a tracing tool implements. Every method here does nothing (or just runs the work), so a subclass
  overrides only what it records. Hooks run on the thread that does the work."""

  def rewrite_begin(self, name: str, sink: UOp) -> Any:
    """A `graph_rewrite` named `name` starts on `sink`; the value returned comes back to `rewrite_end`."""
    return None

  def rewrite_end(self, token: Any, result: UOp | None, fired: dict[Rule, int], seconds: float) -> None:
    """The rewrite started by `rewrite_begin` (its `token`) ended: `result` is the new graph (None: it raised),
    `fired` counts the times each rule `(UPat, fn)` replaced a node."""

  def context(self, kind: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Run `fn(*args, **kwargs)`, a unit of work of `kind` ("schedule", "kernel"), and return its result; the
    rewrites that happen inside belong to it."""
    return fn(*args, **kwargs)

  def stage(self, name: str, before: UOp, after: UOp) -> None:
    """A pipeline stage `name` (not necessarily one graph_rewrite) turned `before` into `after`."""

  def launch(self, device: str, name: str, start_s: float, seconds: float) -> None:
    """Kernel `name` was launched on `device` at `start_s` (time.perf_counter()) and took `seconds`."""


RECORDER: Recorder | None = None


def install(recorder: Recorder | None) -> Recorder | None:
  """Make `recorder` the active one (None: stop recording); returns the one it replaces."""
  global RECORDER
  if recorder is not None and not isinstance(recorder, Recorder):
    raise TypeError(f"install needs a tiny_uop.trace.Recorder (or None), got {type(recorder).__name__}")
  old, RECORDER = RECORDER, recorder
  return old


def traced(kind: str) -> Callable[[F], F]:
  """Decorator: calls of the function are units of work of `kind` that the active recorder sees
  (`Recorder.context`); without a recorder the function runs as it is, after one check."""
  def deco(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      if RECORDER is None: return fn(*args, **kwargs)
      return RECORDER.context(kind, fn, args, kwargs)
    return wrapper  # type: ignore[return-value]
  return deco


# ***** counting the rules that fire *****
class CountingMatcher:
  """A view of a `PatternMatcher` that applies its rules in the same order and counts, per rule, how often one
  replaced a node (`fired`). It has the two things `graph_rewrite` uses: `rewrite(uop, ctx)` and `name`."""

  def __init__(self, pm: PatternMatcher, fired: dict[Rule, int] | None = None):
    self.pm, self.name = pm, pm.name
    self.fired: dict[Rule, int] = {} if fired is None else fired
    self.table = _rule_table(pm)

  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    """The replacement the first matching rule gives (counted), or None."""
    for rule, key in self.table.get(uop.op, ()):
      if (ret := rule(uop, ctx)) is not None:
        self.fired[key] = self.fired.get(key, 0) + 1
        return ret
    return None


# per matcher, by op: (rule(uop, ctx) -> replacement or None, (UPat, fn)) in the matcher's order; built once
_tables: weakref.WeakKeyDictionary[Any, dict[Ops, tuple[tuple[Callable, Rule], ...]]] = weakref.WeakKeyDictionary()


def _rule_table(pm: PatternMatcher) -> dict[Ops, tuple[tuple[Callable, Rule], ...]]:
  if (table := _tables.get(pm)) is not None: return table
  from tiny_uop.pattern import _wants_ctx
  by_op: dict[Ops, list[tuple[Callable, Rule]]] = {}
  for p, fn in pm.patterns:
    rule = _as_rule(p, fn, _wants_ctx(fn))
    for op in dict.fromkeys(p.op or ()): by_op.setdefault(op, []).append((rule, (p, fn)))
  _tables[pm] = table = {op: tuple(rules) for op, rules in by_op.items()}
  return table


def _as_rule(p: UPat, fn: Callable, wants_ctx: bool) -> Callable:
  """`rule(uop, ctx)`: fn's replacement on the first match of p that gives one (not uop itself), else None."""
  compiled = getattr(p, "_compiled", None)  # the matcher's own compiled rule, when it has one: same result, faster
  if compiled and fn in compiled: return compiled[fn][0]

  def interpreted(u: UOp, ctx: Any) -> UOp | None:
    for m in p.match(u, {}):
      ret = fn(ctx, **m) if wants_ctx else fn(**m)
      if ret is not None and ret is not u: return ret
    return None
  return interpreted


def record_rewrite(run: Callable[..., dict[UOp, UOp]], sink: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool,
                   name: str | None, bpm: PatternMatcher | None) -> dict[UOp, UOp]:
  """`run(sink, pm, ctx, bottom_up, name, bpm)` (graph_rewrite's worker) with counting matchers, told to the
  active recorder (`rewrite_begin`/`rewrite_end`); returns what `run` returns (old node -> new node)."""
  import time
  rec = RECORDER
  if rec is None: return run(sink, pm, ctx, bottom_up, name, bpm)
  cpm = CountingMatcher(pm)
  cbpm = CountingMatcher(bpm, cpm.fired) if bpm is not None else None
  token = rec.rewrite_begin(name or pm.name or "graph_rewrite", sink)
  st = time.perf_counter()
  try: out = run(sink, cpm, ctx, bottom_up, name, cbpm)
  except BaseException:
    rec.rewrite_end(token, None, cpm.fired, time.perf_counter() - st)
    raise
  rec.rewrite_end(token, out[sink], cpm.fired, time.perf_counter() - st)
  return out


def rule_location(rule: Rule) -> tuple[str, str]:
  """(function name, "file.py:line") of a rule's function, for people reading a trace."""
  fn = rule[1]
  code = getattr(fn, "__code__", None) or getattr(getattr(fn, "func", None), "__code__", None)
  where = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}" if code is not None else "?"
  return getattr(fn, "__qualname__", None) or repr(fn), where
