"""Rewriting: `UPat` describes a subgraph, `PatternMatcher` holds `(UPat, fn)` rules, `graph_rewrite` applies them.

A rule's `fn` receives the captured nodes as keyword arguments (and `ctx` first when its first parameter is named
`ctx`); it returns a replacement UOp, or None for "no match". Matchers compose with `+`.

`graph_rewrite(sink, pm, ctx, bottom_up=False, name=)` rewrites to a fixed point without Python recursion.
"""
from __future__ import annotations

import gc
import inspect
import itertools
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

from tiny_uop import trace as _trace
from tiny_uop.dtype import DType, dtypes
from tiny_uop.helpers import DEBUG, TRACK_MATCH_STATS
from tiny_uop.uop import GroupOp, Ops, UOp


class UPat:
  """A pattern over UOps.

  op: an Ops, a set/tuple of them, or None (any); dtype: a DType, tuple of them, or None;
  src: None (any), a tuple (in order), a list (any permutation), or a single UPat (every source, any count);
  arg: required arg (None: any); name: capture the matched node under this name;
  allow_any_len: the tuple `src` only needs to match a prefix.
  """
  __slots__ = ("op", "dtype", "arg", "name", "src", "allow_any_len", "_any_src", "_perm", "early_reject", "custom",
               "_compiled")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
               src: UPat | Sequence[UPat] | None = None, arg: Any = None, name: str | None = None,
               allow_any_len: bool = False, custom: Callable[[UOp], bool] | None = None):
    self.op: tuple[Ops, ...] | None = None if op is None else ((op,) if isinstance(op, Ops) else tuple(op))
    self.dtype: tuple[DType, ...] | None = \
      None if dtype is None else ((dtype,) if isinstance(dtype, DType) else tuple(dtype))
    self.arg, self.name, self.allow_any_len, self.custom = arg, name, allow_any_len, custom
    self._any_src: UPat | None = src if isinstance(src, UPat) else None
    self._perm = isinstance(src, list)
    self.src: tuple[UPat, ...] | None = None if src is None or isinstance(src, UPat) else tuple(src)
    # ops that must appear in the direct sources: a cheap pre-check
    self.early_reject = frozenset(s.op[0] for s in (self.src or ()) if s.op is not None and len(s.op) == 1)
    self._compiled: dict[Callable, tuple[Callable, bool]] | None = None  # fn -> (compiled rule, wants ctx)

  @staticmethod
  def any(*pats: UPat) -> UPatAny: return UPatAny(pats)

  @staticmethod
  def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
    """Any node, captured as `name`."""
    return UPat(dtype=dtype, name=name)

  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None, vec: bool = True) -> UPat:
    """A constant (or a vector constant when `vec`), captured as `name`."""
    return UPat((Ops.CONST, Ops.VCONST) if vec else Ops.CONST, dtype, name=name)

  @staticmethod
  def const(dtype: DType | Iterable[DType] | None, b: Any) -> UPat:
    """The constant `b`."""
    return UPat(Ops.CONST, dtype, arg=b)

  def named(self, name: str) -> UPat:
    ret = UPat.__new__(UPat)
    for s in UPat.__slots__: setattr(ret, s, getattr(self, s))
    ret.name, ret._compiled = name, None
    return ret

  # node-building syntax, so rules read like the code they match
  def alu(self, op: Ops, *src: Any) -> UPat:
    srcs = [self, *(s if isinstance(s, UPat) else UPat.const(None, s) for s in src)]
    dt = dtypes.bool if op in GroupOp.Comparison else None
    return UPat(op, dt, srcs if op in GroupOp.Commutative else tuple(srcs))
  def __add__(self, x: Any) -> UPat: return self.alu(Ops.ADD, x)
  def __radd__(self, x: Any) -> UPat: return self.alu(Ops.ADD, x)
  def __sub__(self, x: Any) -> UPat: return self.alu(Ops.SUB, x)
  def __mul__(self, x: Any) -> UPat: return self.alu(Ops.MUL, x)
  def __rmul__(self, x: Any) -> UPat: return self.alu(Ops.MUL, x)
  def __floordiv__(self, x: Any) -> UPat: return self.alu(Ops.CDIV, x)
  def __mod__(self, x: Any) -> UPat: return self.alu(Ops.CMOD, x)
  def __truediv__(self, x: Any) -> UPat: return self.alu(Ops.FDIV, x)
  def __lt__(self, x: Any) -> UPat: return self.alu(Ops.CMPLT, x)
  def __neg__(self) -> UPat: return self.alu(Ops.NEG)
  def __and__(self, x: Any) -> UPat: return self.alu(Ops.AND, x)
  def __or__(self, x: Any) -> UPat: return self.alu(Ops.OR, x)
  def __xor__(self, x: Any) -> UPat: return self.alu(Ops.XOR, x)
  def __lshift__(self, x: Any) -> UPat: return self.alu(Ops.SHL, x)
  def __rshift__(self, x: Any) -> UPat: return self.alu(Ops.SHR, x)
  def ne(self, x: Any) -> UPat: return self.alu(Ops.CMPNE, x)
  def eq(self, x: Any) -> UPat: return self.alu(Ops.CMPEQ, x)
  def maximum(self, x: Any) -> UPat: return self.alu(Ops.MAX, x)
  def where(self, x: Any, y: Any) -> UPat: return self.alu(Ops.WHERE, x, y)
  def cast(self, dtype: DType | None = None, name: str | None = None) -> UPat:
    return UPat(Ops.CAST, dtype, (self,), name=name)
  def reciprocal(self) -> UPat: return self.alu(Ops.RECIPROCAL)
  def load(self, *src: UPat, **kwargs: Any) -> UPat: return UPat(Ops.LOAD, src=(self, *src), **kwargs)
  def index(self, idx: UPat, valid: UPat | None = None, **kwargs: Any) -> UPat:
    return UPat(Ops.INDEX, src=(self, idx) if valid is None else (self, idx, valid), **kwargs)
  def store(self, val: UPat, **kwargs: Any) -> UPat: return UPat(Ops.STORE, dtypes.void, (self, val), **kwargs)

  def __repr__(self) -> str:
    parts = [f"op={self.op}" if self.op else "", f"dtype={self.dtype}" if self.dtype else "",
             f"arg={self.arg!r}" if self.arg is not None else "", f"name={self.name!r}" if self.name else ""]
    src = self._any_src if self._any_src is not None else self.src
    if src is not None: parts.append(f"src={src!r}")
    return f"UPat({', '.join(p for p in parts if p)})"

  # ***** matching *****
  def match(self, uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    """Every way this pattern matches `uop`, each as a dict of captures (extending `store`)."""
    if (self.op is not None and uop.op not in self.op) or (self.dtype is not None and uop.dtype not in self.dtype
       and uop.dtype.scalar() not in self.dtype) or (self.arg is not None and self.arg != uop.arg):
      return []
    if self.custom is not None and not self.custom(uop): return []
    if self.name is not None:
      if (prev := store.get(self.name)) is not None:
        if prev is not uop: return []
      else: store = {**store, self.name: uop}
    if self._any_src is not None:
      stores = [store]
      for s in uop.src:
        stores = [ns for st in stores for ns in self._any_src.match(s, st)]
        if not stores: return []
      return stores
    if self.src is None: return [store]
    n = len(self.src)
    if len(uop.src) != n and not (self.allow_any_len and len(uop.src) >= n): return []
    orders: Iterable[Sequence[UPat]] = itertools.permutations(self.src) if self._perm else (self.src,)
    out: list[dict[str, UOp]] = []
    for order in orders:
      stores = [store]
      for p, s in zip(order, uop.src):
        stores = [ns for st in stores for ns in p.match(s, st)]
        if not stores: break
      out.extend(stores)
    return out


class UPatAny(UPat):
  """Matches when any of its alternatives match."""
  __slots__ = ("alts",)

  def __init__(self, alts: Sequence[UPat]):
    super().__init__()
    self.alts = tuple(alts)
    ops = [a.op for a in alts]
    self.op = None if any(o is None for o in ops) else tuple(set(o for os in ops for o in os))  # type: ignore[union-attr]

  def match(self, uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    return [m for a in self.alts for m in a.match(uop, store)]


def _wants_ctx(fn: Callable) -> bool:
  try: params = list(inspect.signature(fn).parameters)
  except (TypeError, ValueError): return False
  return bool(params) and params[0] == "ctx"


match_stats: dict[UPat, list] = defaultdict(lambda: [0, 0, 0.0, 0.0])  # matches, attempts, match time, total time


# ***** rule compilation *****
# Each (UPat, fn) rule becomes one generated Python function `rule(u, ctx) -> UOp | None`: the pattern tree unrolled
# into nested `if`s over local variables, permutations as `for` loops, captures passed to `fn` as keyword arguments.
# No per-call dicts or lists; a failed check falls through to the next permutation or to `return None`.

def _compilable(p: UPat) -> bool:
  if isinstance(p, UPatAny) or p._any_src is not None: return False
  return all(_compilable(s) for s in p.src or ())


class _RuleCompiler:
  def __init__(self) -> None:
    self.glob: dict[str, Any] = {}
    self.nvar = 0

  def const(self, obj: Any) -> str:
    name = f"_k{len(self.glob)}"
    self.glob[name] = obj
    return name

  def var(self) -> str:
    self.nvar += 1
    return f"v{self.nvar}"

  def emit(self, p: UPat, v: str, bound: dict[str, str], ind: int, rest: list[tuple[UPat, str]],
           inner: Callable[[dict[str, str], int], list[str]]) -> list[str]:
    """Lines matching `p` against variable `v`, then the patterns in `rest`, then `inner`."""
    conds: list[str] = []
    if p.op is not None:
      conds.append(f"{v}.op is {self.const(p.op[0])}" if len(p.op) == 1 else f"{v}.op in {self.const(frozenset(p.op))}")
    if p.dtype is not None:
      dts = self.const(p.dtype)
      conds.append(f"({v}.dtype in {dts} or {v}.dtype.scalar() in {dts})")
    if p.arg is not None: conds.append(f"{v}.arg == {self.const(p.arg)}")
    if p.custom is not None: conds.append(f"{self.const(p.custom)}({v})")
    if p.name is not None:
      if p.name in bound: conds.append(f"{v} is {bound[p.name]}")
      else: bound = {**bound, p.name: v}
    lines: list[str] = []
    if p.src is not None:
      n = len(p.src)
      conds.append(f"len({v}.src) {'>=' if p.allow_any_len else '=='} {n}")
    pad = " " * ind
    if conds:
      lines.append(f"{pad}if {' and '.join(conds)}:")
      ind += 1
      pad = " " * ind
    todo = list(rest)
    if p.src is not None and len(p.src):
      names = [self.var() for _ in p.src]
      tgt = ", ".join(names) + ("," if len(names) == 1 else "")
      if p._perm and len(p.src) > 1:
        if len(p.src) == 2 and not p.allow_any_len:
          lines.append(f"{pad}for {tgt} in (({v}.src[0], {v}.src[1]), ({v}.src[1], {v}.src[0])):")
        else:
          lines.append(f"{pad}for {tgt} in {self.const(itertools.permutations)}({v}.src[:{len(p.src)}]):")
        ind += 1
        pad = " " * ind
      else:
        lines.append(f"{pad}{tgt} = {v}.src" + ("" if not p.allow_any_len else f"[:{len(p.src)}]"))
      todo = list(zip(p.src, names)) + todo
    if todo:
      (np_, nv), *more = todo
      lines += self.emit(np_, nv, bound, ind, more, inner)
    else: lines += inner(bound, ind)
    return lines


def _compile_rule(p: UPat, fn: Callable, wants_ctx: bool) -> Callable[[UOp, Any], UOp | None]:
  """A fast function `rule(u, ctx)` equivalent to trying `fn` on every match of `p` (see `_RuleCompiler`)."""
  if isinstance(p, UPatAny) and all(_compilable(a) for a in p.alts): alts: tuple[UPat, ...] = p.alts
  elif _compilable(p): alts = (p,)
  else:  # rare shapes (any-count sources, nested alternatives): the interpreter
    def interpreted(u: UOp, ctx: Any) -> UOp | None:
      for m in p.match(u, {}):
        ret = fn(ctx, **m) if wants_ctx else fn(**m)
        if ret is not None and ret is not u: return ret
      return None
    return interpreted
  rc = _RuleCompiler()
  fname = rc.const(fn)

  def inner(bound: dict[str, str], ind: int) -> list[str]:
    args = ", ".join(["ctx"] * wants_ctx + [f"{k}={v}" for k, v in bound.items()])
    pad = " " * ind
    return [f"{pad}ret = {fname}({args})", f"{pad}if ret is not None and ret is not u: return ret"]
  body: list[str] = []
  for a in alts: body += rc.emit(a, "u", {}, 1, [], inner)
  src = "def rule(u, ctx):\n" + "\n".join(body) + "\n return None\n"
  code = compile(src, f"<rule {getattr(fn, '__qualname__', fn)}>", "exec")
  exec(code, rc.glob)  # noqa: S102 -- our own generated matcher source, built from the UPat tree
  ret = rc.glob["rule"]
  ret.__doc__ = src
  return ret


class PatternMatcher:
  """An ordered list of `(UPat, fn)` rules, indexed by op. `pm.rewrite(uop, ctx)` applies the first that matches.

  Each rule is compiled to a Python function (see `_compile_rule`); `TRACK_MATCH_STATS=1` uses the interpreter
  (`UPat.match`) and counts matches per rule instead.
  """

  def __init__(self, patterns: Sequence[tuple[UPat, Callable]], name: str | None = None):
    self.patterns = list(patterns)
    self.name = name
    self.pdict: dict[Ops, list[tuple[UPat, Callable, frozenset, bool]]] = defaultdict(list)
    compiled: dict[Ops, list[Callable]] = defaultdict(list)
    for p, fn in self.patterns:
      if p.op is None: raise ValueError(f"a rule's top pattern must name its op(s) (the matcher indexes by op): {p}")
      if p._compiled is None: p._compiled = {}
      if (cached := p._compiled.get(fn)) is None:  # compiled once per (pattern, fn): `pm1 + pm2` stays cheap
        wants_ctx = _wants_ctx(fn)
        cached = p._compiled[fn] = (_compile_rule(p, fn, wants_ctx), wants_ctx)
      rule = cached[0]
      entry = (p, fn, p.early_reject, cached[1])
      for uop in dict.fromkeys(p.op):
        self.pdict[uop].append(entry)
        compiled[uop].append(rule)
    self.cdict: dict[Ops, tuple[Callable, ...]] = {k: tuple(v) for k, v in compiled.items()}
    # (op, dtype) -> the compiled rules whose top pattern admits that dtype, built on first use: a float ADD never
    # calls the rules written for index math (`UPat(Ops.ADD, dtype=ints)`), it doesn't even see them
    self._tops: dict[Ops, tuple[tuple[DType, ...] | None, ...]] = \
      {k: tuple(e[0].dtype for e in v) for k, v in self.pdict.items()}
    self._dispatch: dict[tuple[Ops, DType], tuple[Callable, ...]] = {}

  def _rules_for(self, op: Ops, dtype: DType) -> tuple[Callable, ...]:
    rules = self.cdict.get(op, ())
    tops = self._tops.get(op, ())
    ret = self._dispatch[(op, dtype)] = tuple(r for r, dts in zip(rules, tops)
                                              if dts is None or dtype in dts or dtype.scalar() in dts)
    return ret

  def __add__(self, more: PatternMatcher) -> PatternMatcher:
    name = f"{self.name}+{more.name}" if self.name or more.name else None
    return PatternMatcher(self.patterns + more.patterns, name=name)

  def __len__(self) -> int: return len(self.patterns)

  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    """The replacement the first matching rule gives, or None."""
    if TRACK_MATCH_STATS.value: return self._rewrite_tracked(uop, ctx)
    if (rules := self._dispatch.get((uop.op, uop.dtype))) is None: rules = self._rules_for(uop.op, uop.dtype)
    for rule in rules:
      if (ret := rule(uop, ctx)) is not None: return ret
    return None

  def _rewrite_tracked(self, uop: UOp, ctx: Any = None) -> UOp | None:
    rules = self.pdict.get(uop.op)
    if rules is None: return None
    src_ops = {s.op for s in uop.src}
    for p, fn, early_reject, wants_ctx in rules:
      if not early_reject <= src_ops: continue
      st = time.perf_counter()
      for match in p.match(uop, {}):
        ret = fn(ctx, **match) if wants_ctx else fn(**match)
        if ret is not None and ret is not uop:
          match_stats[p][0] += 1
          match_stats[p][2] += time.perf_counter() - st
          return ret
      match_stats[p][1] += 1
      match_stats[p][3] += time.perf_counter() - st
    return None


class RewriteNotReady(Exception):
  pass


def _fixed_point(pm: PatternMatcher, n: UOp, ctx: Any, limit: int = 1000) -> UOp:
  for _ in range(limit):
    nn = pm.rewrite(n, ctx)
    if nn is None: return n
    n = nn
  raise RuntimeError(f"rewrite of {n.op} did not reach a fixed point in {limit} steps (rules loop?)")


def graph_rewrite(sink: UOp, pm: PatternMatcher, ctx: Any = None, bottom_up: bool = False, name: str | None = None,
                  bpm: PatternMatcher | None = None) -> UOp:
  """Rewrite the graph under `sink` with `pm` to a fixed point.

  Default: a node's sources are rewritten first, then the node, and any replacement is rewritten again.
  `bottom_up=True` tries rules on a node before its sources (and again on the result). `bpm` adds rules applied on
  the way down while `pm` runs on the way up. Iterative: no recursion limit on deep graphs.
  """
  return _rewrite_nogc(sink, pm, ctx, bottom_up, name, bpm)[sink]


def graph_rewrite_map(sink: UOp, pm: PatternMatcher, ctx: Any = None, bottom_up: bool = False,
                      name: str | None = None) -> dict[UOp, UOp]:
  """Like graph_rewrite, but returns what each node under `sink` that the rewrite visited became."""
  return _rewrite_nogc(sink, pm, ctx, bottom_up, name, None)


def _rewrite_nogc(sink: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool, name: str | None,
                  bpm: PatternMatcher | None) -> dict[UOp, UOp]:
  if _trace.RECORDER is not None: return _trace.record_rewrite(_rewrite_untraced, sink, pm, ctx, bottom_up, name, bpm)
  return _rewrite_untraced(sink, pm, ctx, bottom_up, name, bpm)


def _rewrite_untraced(sink: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool, name: str | None,
                      bpm: PatternMatcher | None) -> dict[UOp, UOp]:
  # the cyclic GC would repeatedly scan every live node while a rewrite allocates many; UOps form no cycles
  if not gc.isenabled(): return _rewrite(sink, pm, ctx, bottom_up, name, bpm)
  gc.disable()
  try: return _rewrite(sink, pm, ctx, bottom_up, name, bpm)
  finally: gc.enable()


def _rewrite(sink: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool, name: str | None,
             bpm: PatternMatcher | None) -> dict[UOp, UOp]:
  if bottom_up: bpm, pm_up = pm, None
  else: pm_up = pm
  t0 = time.perf_counter() if DEBUG >= 6 else 0.0
  replace: dict[UOp, UOp] = {}
  # stack entries: (node, stage, value); stage 0 = visit, 1 = sources done, 2 = link result. A node shared by several
  # users may be pushed more than once; the first visit finishes it (LIFO) and later ones see it in `replace`.
  stack: list[tuple[UOp, int, UOp]] = [(sink, 0, sink)]
  push, pop, getr = stack.append, stack.pop, replace.__getitem__
  in_progress: set[UOp] = set()  # visited, result not known yet: meeting one again is a cycle
  while stack:
    n, stage, new_n = pop()
    if stage == 0:
      if n in replace: continue
      if n in in_progress:
        raise RuntimeError(f"graph_rewrite {name or pm.name}: a rule made {n.op} depend on itself (rules loop?)")
      in_progress.add(n)
      if bpm is not None:
        new_n = _fixed_point(bpm, n, ctx)
        if new_n is not n and new_n in replace:
          replace[n] = replace[new_n]
          in_progress.discard(n)
          continue
      push((n, 1, new_n))
      for s in reversed(new_n.src):
        if s not in replace: push((s, 0, s))
    elif stage == 1:
      src = new_n.src
      try: new_src = tuple(map(getr, src))
      except KeyError as e:
        raise RuntimeError(f"graph_rewrite {name or pm.name}: a rule made {new_n.op} depend on itself (cycle)") from e
      if new_src == src:
        if pm_up is None or (nxt := pm_up.rewrite(new_n, ctx)) is None:
          replace[n] = new_n
          in_progress.discard(n)
          continue
      else:
        nxt = new_n.replace(src=new_src)
      if (done := replace.get(nxt)) is not None:
        replace[n] = done
        in_progress.discard(n)
        continue
      push((n, 2, nxt))
      push((nxt, 0, nxt))
    else:
      replace[n] = replace[new_n]
      in_progress.discard(n)
  if DEBUG >= 6 and name: print(f"rewrite {name}: {(time.perf_counter() - t0) * 1e3:.2f} ms")
  return replace


def _sub(ctx: dict[UOp, UOp], x: UOp) -> UOp | None: return ctx.get(x)


_substitute = PatternMatcher([(UPat(tuple(Ops), name="x"), _sub)], name="substitute")


def track_rewrites(fn: Callable) -> Callable:
  """Decorator kept for API compatibility with tracing tools; tiny traces by pass name with DEBUG."""
  return fn


def print_match_stats() -> None:
  """Rules by time spent, with match counts (TRACK_MATCH_STATS=1)."""
  for p, (m, a, mt, tt) in sorted(match_stats.items(), key=lambda kv: -kv[1][3]):
    print(f"{m:7d} / {a:7d} {mt * 1e3:9.2f} / {tt * 1e3:9.2f} ms  {p}")
