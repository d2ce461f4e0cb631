"""Scheduling by ranges: turn one realized tensor-graph value into a kernel AST (a SINK of STOREs).

The walk starts at the value with one RANGE per output dimension and moves toward the inputs carrying one index
expression per dimension and a validity condition (docs/ARCHITECTURE.md §5, "Scheduling by ranges"):
PERMUTE permutes the indices, EXPAND indexes broadcast dimensions with 0, SHRINK adds the start, FLIP maps i to n-1-i,
PAD subtracts the before-pad and adds a validity condition (the padded value reads as 0), RESHAPE flattens to a linear
index and splits it by the source shape with `//` and `%`. A REDUCE_AXIS opens REDUCE ranges. A realized value (an
input BUFFER or another kernel's output) becomes `LOAD(INDEX(PARAM(slot), idx, valid))`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from tiny_uop.dtype import DType, dtypes
from tiny_uop.helpers import all_int
from tiny_uop.uop import AxisType, GroupOp, KernelInfo, Ops, UOp, sint

_simplify: Callable[[UOp], UOp] | None
try:  # the symbolic simplifier lives in tiny-uop; index math is correct without it, only less tidy
  from tiny_uop.symbolic import simplify as _simplify
except ImportError:  # pragma: no cover - depends on the tiny-uop version installed
  _simplify = None


def shape_of(u: UOp) -> tuple[sint, ...]:
  """The shape of a tensor-graph node (an error for kernel-level nodes, which have none)."""
  if (s := u.shape) is None: raise ValueError(f"{u.op} has no shape; the scheduler needs tensor-graph values")
  return s


_simplified: dict[UOp, UOp] = {}


def simplify_index(x: UOp) -> UOp:
  """Run an index or validity expression through the symbolic simplifier when tiny-uop has one (memoized, results
  included: the same index expressions recur in every kernel that reads a buffer the same way)."""
  if _simplify is None or x.op is Ops.CONST: return x
  if (ret := _simplified.get(x)) is not None: return ret
  if len(_simplified) > 1 << 17: _simplified.clear()
  ret = _simplified[x] = _simplify(x)
  _simplified[ret] = ret
  return ret


# ***** index arithmetic with the folds that keep common indices readable *****
@functools.lru_cache(maxsize=4096)
def iconst(v: int, dt: DType = dtypes.index) -> UOp:
  """An index constant of the kernel's index dtype (int32, or int64 in a kernel over more than 2**31-1 elements)."""
  return UOp.const(dt, v)

def _is_const(x: UOp, v: Any = None) -> bool: return x.op is Ops.CONST and (v is None or x.arg == v)

def iadd(a: UOp, b: UOp) -> UOp:
  if _is_const(a, 0): return b
  if _is_const(b, 0): return a
  if _is_const(a) and _is_const(b): return iconst(a.arg + b.arg, a.dtype)
  return a + b

def isub(a: UOp, b: UOp) -> UOp:
  if _is_const(b, 0): return a
  if _is_const(a) and _is_const(b): return iconst(a.arg - b.arg, a.dtype)
  return a - b

def imul(a: UOp, b: UOp) -> UOp:
  if _is_const(a, 0) or _is_const(b, 0): return iconst(0, a.dtype)
  if _is_const(a, 1): return b
  if _is_const(b, 1): return a
  if _is_const(a) and _is_const(b): return iconst(a.arg * b.arg, a.dtype)
  return a * b

def idiv(a: UOp, b: UOp) -> UOp:
  """Floor division of a non-negative index by a positive size."""
  if _is_const(b, 1): return a
  if _is_const(a) and _is_const(b): return iconst(a.arg // b.arg, a.dtype)
  if _is_const(b) and a.vmin >= 0 and a.vmax < b.arg: return iconst(0, a.dtype)  # 0 <= a < b -> a//b = 0
  if a.op is Ops.MUL and a.src[1] is b: return a.src[0]  # (x*b)//b -> x
  return a // b

def imod(a: UOp, b: UOp) -> UOp:
  """Remainder of a non-negative index by a positive size."""
  if _is_const(b, 1): return iconst(0, a.dtype)
  if _is_const(a) and _is_const(b): return iconst(a.arg % b.arg, a.dtype)
  if _is_const(b) and a.vmin >= 0 and a.vmax < b.arg: return a  # 0 <= a < b -> a%b = a
  return a % b

def iand(a: UOp | None, b: UOp | None) -> UOp | None:
  """Conjunction of validity conditions; None means always valid."""
  if a is None or _is_const(a, True): return b
  if b is None or _is_const(b, True): return a
  return a & b


def flatten_index(idx: tuple[UOp, ...], shape: tuple[UOp, ...]) -> UOp:
  """Linear (row-major) index of `idx` in `shape`."""
  dt = shape[0].dtype if shape else dtypes.index
  ret, stride = iconst(0, dt), iconst(1, dt)
  for i, s in reversed(list(zip(idx, shape))):
    ret = iadd(ret, imul(i, stride))
    stride = imul(stride, s)
  return ret


def split_index(lin: UOp, shape: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """The per-dimension indices of linear index `lin` in `shape`."""
  out, stride = [], iconst(1, lin.dtype)
  for i, s in enumerate(reversed(shape)):
    q = idiv(lin, stride)
    # the outermost index needs no `% s`: where the element is valid every index is in range, so lin < prod(shape);
    # it can leave the range only in a padded (masked) region, whose loads read a safe address. The mod would cost a
    # division per load (interval analysis can't see the mask, so it can't drop it)
    out.append(q if i == len(shape) - 1 else imod(q, s))
    stride = imul(stride, s)
  return tuple(reversed(out))


def _groups(new: list[tuple[int, sint]], old: list[tuple[int, sint]]) -> list[tuple[list[int], list[int]]] | None:
  """Pair runs of (non-1) dimensions with equal products: [(new dims, old dims), ...]; None if they don't line up."""
  if not (all_int(s for _, s in new) and all_int(s for _, s in old)): return None
  out: list[tuple[list[int], list[int]]] = []
  i = j = 0
  while i < len(new) and j < len(old):
    gn, go, pn, po = [new[i][0]], [old[j][0]], new[i][1], old[j][1]
    i, j = i + 1, j + 1
    while pn != po:
      if pn < po and i < len(new): gn.append(new[i][0]); pn *= new[i][1]; i += 1  # noqa: E702
      elif po < pn and j < len(old): go.append(old[j][0]); po *= old[j][1]; j += 1  # noqa: E702
      else: return None
    out.append((gn, go))
  return out if i == len(new) and j == len(old) else None


def reshape_index(idx: tuple[UOp, ...], new: tuple[sint, ...], old: tuple[sint, ...], ks: Callable[[sint], UOp]) \
    -> tuple[UOp, ...]:
  """Map indices over shape `new` to indices over shape `old` (same number of elements)."""
  sn = [(i, s) for i, s in enumerate(new) if not (isinstance(s, int) and s == 1)]
  so = [(j, s) for j, s in enumerate(old) if not (isinstance(s, int) and s == 1)]
  out = [ks(0)] * len(old)
  if [s for _, s in sn] == [s for _, s in so]:  # only size-1 dims added or removed
    for (i, _), (j, _) in zip(sn, so): out[j] = idx[i]
    return tuple(out)
  groups = _groups(sn, so)
  if groups is None: groups = [([i for i, _ in sn], [j for j, _ in so])]
  for gn, go in groups:
    lin = flatten_index(tuple(idx[i] for i in gn), tuple(ks(new[i]) for i in gn))
    for j, v in zip(go, split_index(lin, tuple(ks(old[j]) for j in go))): out[j] = v
  return tuple(out)


def _peel_sum(e: UOp, r: UOp, base: Callable[[UOp], Any]) -> tuple[Any, list[tuple[UOp, bool]]] | None:
  """Walk down the ADDs of `e` toward the one term that holds `r` (an explicit loop, no recursion): `base(term)` of
  the term where the walk stops and the other operands met on the way, outermost first (each with whether it was the
  right operand); None when the walk stops at a term `base` rejects (returns None) or `r` is in both operands."""
  path: list[tuple[UOp, bool]] = []
  while (found := base(e)) is None:
    if e.op is not Ops.ADD: return None
    a, b = e.src
    if r not in b.toposort(): path.append((b, True)); e = a  # noqa: E702
    elif r not in a.toposort(): path.append((a, False)); e = b  # noqa: E702
    else: return None
  return found, path


def _rebuild_sum(x: UOp, path: list[tuple[UOp, bool]]) -> UOp:
  """`x` put back in place of the term `_peel_sum` stopped at: the operands of `path` added around it."""
  for other, right in reversed(path): x = iadd(x, other) if right else iadd(other, x)
  return x


def _minus_range(e: UOp, r: UOp) -> UOp | None:
  """x when e == r + x with x independent of r, else None."""
  if (peeled := _peel_sum(e, r, lambda t: True if t is r else None)) is None: return None
  return _rebuild_sum(iconst(0, r.dtype), peeled[1])


def _affine(e: UOp, r: UOp) -> tuple[UOp, int] | None:
  """(x, k) when e == x + k*r with x independent of r and k an int, else None."""
  def coeff(t: UOp) -> int | None:  # k when the term t is k*r (r itself: 1)
    if t is r: return 1
    return t.src[1].arg if t.op is Ops.MUL and t.src[0] is r and _is_const(t.src[1]) else None
  if (peeled := _peel_sum(e, r, coeff)) is None: return None
  return _rebuild_sum(iconst(0, r.dtype), peeled[1]), peeled[0]


def _mod_intervals(c: UOp, r: UOp) -> list[tuple[UOp, UOp]] | None:
  """The r-intervals [start, end) where `((x + k*r) % m) < t` holds, for k = +-1 (mod m) and x + k*r >= 0 wrapping
  at most once over r's range (the triangle tiny-tensor builds arange from); None when the clause is not that."""
  if c.op is not Ops.CMPLT or c.src[0].op is not Ops.CMOD or not _is_const(c.src[1]) or not _is_const(c.src[0].src[1]):
    return None
  e, m, t, n = c.src[0].src[0], c.src[0].src[1].arg, c.src[1].arg, r.src[0]
  if m < 2 or not _is_const(n) or e.vmin < 0 or (aff := _affine(e, r)) is None or r in aff[0].toposort(): return None
  x, k = aff
  if k % m not in (1, m - 1): return None
  sgn = 1 if k % m == 1 else -1
  dmin, dmax = (x.vmin, x.vmax + n.arg - 1) if sgn == 1 else (x.vmin - n.arg + 1, x.vmax)
  if dmin < -m or dmax >= 2 * m: return None
  # d = x + sgn*r and (e % m) == (d mod m): d in [0,m) reads d, in [-m,0) reads d+m, in [m,2m) reads d-m
  out = []
  for d0, d1 in ((0, min(t, m)), (-m, min(t - m, 0)), (m, min(t + m, 2 * m))):
    if d1 <= d0: continue
    dt = r.dtype
    if sgn == 1: out.append((isub(iconst(d0, dt), x), isub(iconst(d1, dt), x)))  # r = d - x
    else:  # r = x - d
      out.append((iadd(isub(x, iconst(d1, dt)), iconst(1, dt)), iadd(isub(x, iconst(d0, dt)), iconst(1, dt))))
  return out


def collapse_count(inner: UOp, r: UOp) -> UOp | None:
  """sum over r in [0, n) of `cond.where(v, 0)` with v independent of r and cond a conjunction of `r + x < y`,
  `y < r + x` and at most one `((x + k*r) % m) < t` (see `_mod_intervals`): that is v * (number of r where cond
  holds), computed without a loop. This folds arange/cumsum-of-ones patterns (tensors built from constants) into index
  arithmetic."""
  conds, v = [], inner
  while v.op is Ops.WHERE and _is_const(v.src[2], 0): conds.append(v.src[0]); v = v.src[1]  # noqa: E702
  if not conds or r in v.toposort(): return None
  lo, hi = iconst(0, r.dtype), r.src[0]
  clauses, todo = [], conds
  while todo:
    c = todo.pop()
    if c.op is Ops.AND: todo.extend(c.src)
    else: clauses.append(c)
  pieces: list[tuple[UOp, UOp]] | None = None
  for c in clauses:
    if c.op is not Ops.CMPLT: return None
    a, b = c.src
    if (x := _minus_range(a, r)) is not None and r not in b.toposort(): hi = hi.minimum(isub(b, x))  # r < b - x
    elif (x := _minus_range(b, r)) is not None and r not in a.toposort():
      lo = lo.maximum(iadd(isub(a, x), iconst(1, r.dtype)))
    elif pieces is None and (pieces := _mod_intervals(c, r)) is not None: pass
    else: return None
  count = iconst(0, r.dtype)
  for start, end in pieces if pieces is not None else [(iconst(0, r.dtype), r.src[0])]:
    count = iadd(count, isub(end.minimum(hi), start.maximum(lo)).maximum(iconst(0, r.dtype)))
  count = simplify_index(count)
  return count.cast(v.dtype) if _is_const(v, 1) else v * count.cast(v.dtype)


RECOMPUTE_LIMIT = 32
"""A value read at more than this many different indices inside one kernel is realized into a buffer instead."""


@dataclass(frozen=True)
class NeedsBuffer:
  """Why a kernel was not built: `node` would be recomputed at more than RECOMPUTE_LIMIT different indices inside it
  (e.g. a chain of stencils). The caller gives `node` its own kernel first, then builds this one again."""
  node: UOp


@dataclass(frozen=True)
class NotMerged:
  """Why a multi-output kernel was not built: a value meant to be stored by it is not computed there at its output
  index (`reason` says which). The caller builds the values' kernels separately."""
  reason: str


class KernelBuilder:
  """Builds one kernel AST for one realized value.

  `buffer_of(u)` returns the BUFFER a realized node lives in (or None when `u` must be walked through);
  `on_read(u)` is told about every realized node the kernel reads.
  """
  def __init__(self, buffer_of: Callable[[UOp], UOp | None], ksint: Callable[[sint], UOp],
               costly: Callable[[UOp], bool] = lambda u: False):
    self.buffer_of, self.ks, self.costly = buffer_of, ksint, costly
    self.visits: dict[UOp, int] = {}
    self.params: dict[UOp, UOp] = {}   # BUFFER -> PARAM
    self.reads: list[UOp] = []         # realized nodes read (in order)
    self.axis = 0
    self.memo: dict[tuple, UOp] = {}
    self.has_reduce = False
    self.version: UOp | None = None    # the ASSIGN whose result is being read (None: buffers' original values)
    self.assigns_read: list[UOp] = []
    self.inline: set[UOp] = set()      # ASSIGNs this kernel performs itself (extra outputs)
    self.snapshots: dict[UOp, UOp] = {}  # BUFFER -> copy of its value before any ASSIGN (read instead of it)
    self.buffer_reads: list[tuple[UOp, UOp | None]] = []   # (BUFFER, version) pairs read
    self.needs: NeedsBuffer | None = None  # set when `build` stopped: the value to realize first

  def new_range(self, size: sint, axis_type: AxisType) -> UOp:
    self.axis += 1
    bound = self.ks(size)
    return UOp.range(bound, self.axis - 1, axis_type, bound.dtype)

  def param(self, buf: UOp) -> UOp:
    if (p := self.params.get(buf)) is None:
      size = buf.arg if isinstance(buf.arg, int) else int(self.ks(buf.arg).vmax)
      p = self.params[buf] = UOp(Ops.PARAM, buf.dtype.ptr(size), arg=len(self.params))
    return p

  def out_ranges(self, shape: tuple[sint, ...]) -> tuple[UOp, ...]:
    """One LOOP range per output dimension (size-1 dims are indexed by 0)."""
    return tuple(self.ks(0) if isinstance(s, int) and s == 1 else self.new_range(s, AxisType.LOOP) for s in shape)

  def load(self, buf: UOp, lin: UOp, valid: UOp | None) -> UOp:
    lin = simplify_index(lin)
    if valid is not None: valid = simplify_index(valid)
    if valid is not None and _is_const(valid, True): valid = None
    if valid is not None and _is_const(valid, False): return UOp.const(buf.dtype, 0)
    return self.param(buf).index(lin, valid).load()

  def build(self, root: UOp, idx: tuple[UOp, ...], valid: UOp | None = None) -> UOp | None:
    """The kernel expression of graph node `root` at index `idx` (only read where `valid`); None when a value would be
    recomputed at too many indices (`self.needs` then names it).

    Iterative: each visited (node, index) is a generator (`_steps`) that yields the (source, index, valid, version)
    it needs and receives that source's kernel expression; a driver loop with an explicit stack runs them, so a
    graph 10,000 ops deep costs no Python recursion."""
    return self._run((root, idx, valid, self.version))

  def _run(self, req: tuple) -> UOp | None:
    memo = self.memo
    if (ret := memo.get(req)) is not None: return ret
    if not self._visit(req[0]): return None
    stack: list[tuple[tuple, Any]] = [(req, self._steps(*req))]
    result: Any = None
    while stack:
      key, gen = stack[-1]
      try: sub = gen.send(result)
      except StopIteration as stop:
        stack.pop()
        result = memo[key] = stop.value
        continue
      if (result := memo.get(sub)) is None:
        if not self._visit(sub[0]): return None  # the unfinished generators are dropped with the stack
        stack.append((sub, self._steps(*sub)))
    return memo[req]

  def _visit(self, root: UOp) -> bool:
    """Count a visit of `root`; False (and `self.needs` set) when a costly value goes past RECOMPUTE_LIMIT visits."""
    if (n := self.visits.get(root, 0) + 1) > RECOMPUTE_LIMIT and self.costly(root) and self.buffer_of(root) is None:
      self.needs = NeedsBuffer(root)
      return False
    self.visits[root] = n
    return True

  def _steps(self, u: UOp, idx: tuple[UOp, ...], valid: UOp | None, version: UOp | None) -> Any:
    """A generator: yields (source, idx, valid, version) requests, returns the kernel expression of `u` at `idx`."""
    op = u.op
    if (buf := self.buffer_of(u)) is not None:
      self.reads.append(u)
      if u.op is Ops.BUFFER and version is None and u in self.snapshots: buf = self.snapshots[u]
      elif u.op is Ops.BUFFER: self.buffer_reads.append((u, version))
      shape = shape_of(u) if u.op is not Ops.BUFFER else (buf.arg,)
      return self.load(buf, flatten_index(idx, tuple(self.ks(s) for s in shape)), valid)
    if op is Ops.CONST: return UOp.const(u.dtype, u.arg)
    if op is Ops.BIND: return u.src[0]
    if op is Ops.DEFINE_VAR: return u
    if op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD): return (yield (u.src[0], idx, valid, version))
    if op is Ops.ASSIGN and u in self.inline:  # this kernel computes the assign (same element): use its value
      return (yield (u.src[1], idx, valid, version))
    if op is Ops.ASSIGN:  # reading an assign's result reads its target's buffer once the assign has run
      self.assigns_read.append(u)
      # through a chain of assigns, the outermost one is the version read
      return (yield (u.src[0], idx, valid, u if version is None else version))
    if op in GroupOp.Movement: return (yield from self._movement(u, idx, valid, version))
    if op is Ops.REDUCE_AXIS: return (yield from self._reduce(u, idx, valid, version))
    if op in GroupOp.Elementwise:
      if op is Ops.BITCAST and u.dtype.itemsize != u.src[0].dtype.itemsize:
        raise NotImplementedError(f"BITCAST between sizes ({u.src[0].dtype} -> {u.dtype}) is not supported yet")
      srcs = []
      for s in u.src: srcs.append((yield (s, idx, valid, version)))
      return UOp(op, u.dtype, tuple(srcs), u.arg)
    raise NotImplementedError(f"the scheduler can't index through {op} (shape {u.shape}); "
                              f"supported: movement, elementwise, REDUCE_AXIS, CONST, BUFFER, CONTIGUOUS, ASSIGN, COPY")

  def _movement(self, u: UOp, idx: tuple[UOp, ...], valid: UOp | None, version: UOp | None) -> Any:
    src, op, arg = u.src[0], u.op, u.arg
    ps = shape_of(src)
    if op is Ops.RESHAPE: return (yield (src, reshape_index(idx, shape_of(u), ps, self.ks), valid, version))
    if op is Ops.PERMUTE:
      new = [self.ks(0)] * len(ps)
      for i, o in enumerate(arg): new[o] = idx[i]
      return (yield (src, tuple(new), valid, version))
    if op is Ops.EXPAND:
      return (yield (src, tuple(self.ks(0) if isinstance(s, int) and s == 1 else i for i, s in zip(idx, ps)), valid,
                     version))
    if op is Ops.SHRINK: return (yield (src, tuple(iadd(i, self.ks(b)) for i, (b, _) in zip(idx, arg)), valid, version))
    if op is Ops.FLIP:
      return (yield (src, tuple(isub(isub(self.ks(s), self.ks(1)), i) if f else i for i, s, f in zip(idx, ps, arg)),
                     valid, version))
    # PAD: read the source inside, 0 outside
    cond: UOp | None = None
    new_idx = []
    for ix, sz, (b, _) in zip(idx, ps, arg):
      kb, ksz = self.ks(b), self.ks(sz)
      if not (isinstance(b, int) and b == 0) and not (ix.vmin >= _vmax(kb)):
        cond = iand(cond, isub(kb, self.ks(1)) < ix)
      hi = iadd(kb, ksz)
      if not ix.vmax < _vmin(hi): cond = iand(cond, ix < hi)
      new_idx.append(isub(ix, kb))
    if cond is None: return (yield (src, tuple(new_idx), valid, version))
    cond = simplify_index(cond)
    inner = yield (src, tuple(new_idx), simplify_index(cond if valid is None else valid & cond), version)
    return cond.where(inner, UOp.const(u.dtype, 0))

  def _reduce(self, u: UOp, idx: tuple[UOp, ...], valid: UOp | None, version: UOp | None) -> Any:
    rop, axes = u.arg
    src = u.src[0]
    sshape = shape_of(src)
    new_idx, rngs = list(idx), []
    for a in axes:
      s = sshape[a]
      if isinstance(s, int) and s == 1:
        new_idx[a] = self.ks(0)
        continue
      new_idx[a] = r = self.new_range(s, AxisType.REDUCE)
      rngs.append(r)
    inner = yield (src, tuple(new_idx), valid, version)
    if not rngs: return inner
    if rop is Ops.ADD and len(rngs) == 1 and (folded := collapse_count(inner, rngs[0])) is not None: return folded
    self.has_reduce = True
    return inner.reduce(*rngs, arg=rop)

  def kernel(self, value: UOp, out_buf: UOp, shape: tuple[sint, ...], out_view: UOp | None = None,
             extra: tuple[tuple[UOp, UOp], ...] = (), also: tuple[tuple[UOp, UOp], ...] = ()) \
      -> UOp | NeedsBuffer | NotMerged:
    """The SINK storing `value` (of `shape`) into `out_buf` (through the movement ops of `out_view` when given).

    `extra` are (node, buffer) pairs of values of the same shape that this kernel computes anyway at its output index
    (a reduce feeding this one): each gets its own STORE; NotMerged when one is not computed at that index.
    `also` are (value, buffer) pairs of independent values of the same shape computed and stored by this kernel too.
    NeedsBuffer: a value would be recomputed at too many indices (nothing is stored; realize it first).
    """
    out_param = self.param(out_buf)
    for _, b in (*extra, *also): self.param(b)
    rngs = self.out_ranges(shape)
    if (val := self.build(value, rngs)) is None: return self._stopped()
    also_vals: list[tuple[UOp, UOp]] = []
    for v, b in also:
      if (aval := self.build(v, rngs)) is None: return self._stopped()
      also_vals.append((aval, b))
    if out_view is None:
      lin, valid = flatten_index(rngs, tuple(self.ks(s) for s in shape)), None
    else:
      lin, valid = self.store_index(out_view, rngs)
    lin = simplify_index(lin)
    target = out_param.index(lin) if valid is None else out_param.index(lin, simplify_index(valid))
    stores = [target.store(val)]
    for u, b in extra:
      if (uval := self.memo.get((u, rngs, None, None))) is None:
        return NotMerged(f"{u.op} is not computed at the output index of this kernel")
      stores.append(self.param(b).index(lin).store(uval))
    for aval, b in also_vals: stores.append(self.param(b).index(lin).store(aval))
    name = ("r_" if self.has_reduce else "E_") + "_".join(str(s) if isinstance(s, int) else "n" for s in shape)
    return UOp(Ops.SINK, dtypes.void, tuple(stores), arg=KernelInfo(name or "E"))

  def _stopped(self) -> NeedsBuffer:
    assert self.needs is not None, "build stopped without naming the value to realize"
    return self.needs

  def store_index(self, view: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, UOp | None]:
    """Linear index into the base buffer of a view (movement ops over a BUFFER or an ASSIGN) and its validity."""
    valid: UOp | None = None
    u = view
    while u.op is not Ops.BUFFER:
      if u.op is Ops.ASSIGN: u = u.src[0]; continue  # noqa: E702
      if u.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD): u = u.src[0]; continue  # noqa: E702
      if u.op not in GroupOp.Movement or u.op is Ops.EXPAND or u.op is Ops.PAD:
        raise NotImplementedError(f"can't assign through {u.op}: the target must be a view (reshape, permute, "
                                  f"shrink, flip) of a buffer")
      src = u.src[0]
      if u.op is Ops.RESHAPE: idx = reshape_index(idx, shape_of(u), shape_of(src), self.ks)
      elif u.op is Ops.PERMUTE:
        new = [self.ks(0)] * len(idx)
        for i, o in enumerate(u.arg): new[o] = idx[i]
        idx = tuple(new)
      elif u.op is Ops.SHRINK: idx = tuple(iadd(i, self.ks(b)) for i, (b, _) in zip(idx, u.arg))
      elif u.op is Ops.FLIP:
        idx = tuple(isub(isub(self.ks(s), self.ks(1)), i) if f else i for i, s, f in zip(idx, shape_of(src), u.arg))
      u = src
    return idx[0], valid


def _vmin(x: UOp) -> Any: return x.vmin
def _vmax(x: UOp) -> Any: return x.vmax

