"""The IR: `Ops`, `GroupOp` and `UOp`, the immutable hash-consed node every stage of tiny works on.

A UOp has five fields:
  op     which operation (an `Ops` member)
  dtype  the type of the value it produces (`dtypes.void` for statements such as STORE)
  src    the operand UOps, a tuple
  arg    a hashable, op-specific argument (a constant's value, a movement op's new shape, a RANGE's axis id, ...)
  tag    free metadata for passes; part of the identity

Building the same node twice returns the same object, so `is`/`==` are identity and graphs share structure.
Interning is thread-safe and lock-free: a new node is inserted with one `setdefault`, a dead one removed only while
dead (see `UOpMetaClass`), so two threads building the same node get one object.
Derived properties (`shape`, `device`, `vmin`/`vmax`, `ranges`) are computed once and cached on the node (`_cache`,
where later stages keep per-node facts too: the scheduler's normalized form, the tensor engine's Buffer behind a
BUFFER node); nothing cached on a node refers back to it (a node's toposort is computed on every call, never stored:
a stored one would make every node a reference cycle, and a chain of n nodes hold n**2/2 entries), so dropping a graph
frees it at once, without the cyclic GC.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import math
import weakref
# deletes a dict entry only if its value is a dead weakref, in one step (CPython's WeakValueDictionary relies on it)
from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]
from dataclasses import dataclass
from enum import Enum, IntEnum, auto
from typing import Any, Callable, Iterator, Sequence

from tiny_uop.dtype import (FLOAT_BITS, AddrSpace, ConstType, DType, PtrDType, dtypes, least_upper_dtype,
                            truncate_int)
from tiny_uop.helpers import all_int, prod


class FastEnum(IntEnum):
  """An IntEnum whose str() is just the name; comparisons and hashing are int-fast."""
  def __str__(self) -> str: return Enum.__str__(self)
  def __repr__(self) -> str: return f"{type(self).__name__}.{self.name}"
  @staticmethod
  def _generate_next_value_(_: str, __: int, ___: int, last_values: list[int]) -> int: return 1 + max([0, *last_values])


class Ops(FastEnum):
  """Every operation of the IR (see docs/ARCHITECTURE.md §4)."""
  # sources
  CONST = auto(); VCONST = auto(); BUFFER = auto(); PARAM = auto(); DEFINE_VAR = auto(); BIND = auto()  # noqa: E702
  UNIQUE = auto(); DEVICE = auto()  # noqa: E702
  # movement (graph level only)
  RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()  # noqa: E702
  # unary ALU
  CAST = auto(); BITCAST = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto()  # noqa: E702
  RECIPROCAL = auto(); NEG = auto(); TRUNC = auto()  # noqa: E702
  # binary ALU
  ADD = auto(); MUL = auto(); SUB = auto(); FDIV = auto(); CDIV = auto(); CMOD = auto(); SHL = auto()  # noqa: E702
  SHR = auto(); MAX = auto(); CMPLT = auto(); CMPNE = auto(); CMPEQ = auto(); XOR = auto(); OR = auto()  # noqa: E702
  AND = auto(); POW = auto(); THREEFRY = auto(); LDEXP = auto()  # noqa: E702
  # ternary ALU
  WHERE = auto(); MULACC = auto()  # noqa: E702
  # reduce
  REDUCE = auto(); REDUCE_AXIS = auto()  # noqa: E702
  # memory
  INDEX = auto(); LOAD = auto(); STORE = auto(); DEFINE_LOCAL = auto(); DEFINE_REG = auto()  # noqa: E702
  # vectors
  VECTORIZE = auto(); GEP = auto(); CAT = auto(); PTRCAT = auto(); WMMA = auto(); UNROLL = auto()  # noqa: E702
  CONTRACT = auto()
  # control
  RANGE = auto(); END = auto(); IF = auto(); ENDIF = auto(); BARRIER = auto(); SPECIAL = auto()  # noqa: E702
  SINK = auto(); AFTER = auto(); GROUP = auto(); NOOP = auto()  # noqa: E702
  # scheduling
  CONTIGUOUS = auto(); CONTIGUOUS_BACKWARD = auto(); DETACH = auto(); COPY = auto(); ASSIGN = auto()  # noqa: E702
  SLICE = auto(); KERNEL = auto(); CALL = auto(); LINEAR = auto()  # noqa: E702
  # programs
  PROGRAM = auto(); SOURCE = auto(); BINARY = auto()  # noqa: E702
  # custom
  CUSTOM = auto(); CUSTOMI = auto()  # noqa: E702
  # multi-device (tensor graph only): MULTI(*shards, arg=axis) is one value split along `axis` over the shards'
  # devices (arg None: a copy on each); its shape is the whole value's, its device the tuple of the shards' devices
  MULTI = auto()
  # HCQ command streams (tiny_uop.hcq2, docs/PIPELINE.md §9): a JIT replay lowered to hardware queues by rewrites
  QUEUE = auto(); EXEC = auto(); XFER = auto(); WAIT = auto(); SIGNAL = auto(); MEMBAR = auto()  # noqa: E702
  INDIRECT = auto(); PACKET = auto(); ADDR = auto(); KERNARGS = auto(); CMDBUF = auto(); PATCH = auto()  # noqa: E702
  SUBMIT = auto()


class GroupOp:
  """Named sets of ops."""
  Unary = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC}
  Binary = {Ops.ADD, Ops.MUL, Ops.SUB, Ops.FDIV, Ops.CDIV, Ops.CMOD, Ops.SHL, Ops.SHR, Ops.MAX, Ops.CMPLT,
            Ops.CMPNE, Ops.CMPEQ, Ops.XOR, Ops.OR, Ops.AND, Ops.POW, Ops.THREEFRY, Ops.LDEXP}
  Ternary = {Ops.WHERE, Ops.MULACC}
  ALU = Unary | Binary | Ternary
  Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
  Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
  Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.XOR, Ops.AND, Ops.OR}
  Associative = {Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX}
  Idempotent = {Ops.OR, Ops.AND, Ops.MAX}
  Comparison = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
  # ops that may not be unsafe to pad: f(0) != 0
  UnsafePad = {Ops.RECIPROCAL, Ops.LOG2, Ops.EXP2, Ops.FDIV, Ops.POW, Ops.CMPEQ, Ops.CMPLT}
  Buffer = {Ops.LOAD, Ops.STORE, Ops.CONST, Ops.DEFINE_VAR}
  Defines = {Ops.PARAM, Ops.DEFINE_LOCAL, Ops.DEFINE_REG}
  Irreducible = {Ops.CONST, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.RANGE}


# Hot-path op constants. Python 3.11's EnumType defines `__getattr__`, so each read of `Ops.X` goes through a slow
# attribute hook (a method-wrapper made and called: ~0.1 us, ten times a global's read); the paths every eager op
# takes (node creation, shape and device inference, `new_buffer`) read these module constants instead.
_BUFFER, _UNIQUE, _DEVICE, _VCONST, _BITCAST = Ops.BUFFER, Ops.UNIQUE, Ops.DEVICE, Ops.VCONST, Ops.BITCAST
_NO_SHAPE_SRC = frozenset({Ops.DEVICE, Ops.UNIQUE})  # sources that carry no shape (an elementwise op's DEVICE, ...)
_DEVICE_SETTERS = frozenset({Ops.DEVICE, Ops.COPY, Ops.MULTI})  # ops whose device is not their first source's
_SHAPE_AS_SOURCES = frozenset(GroupOp.Elementwise | {Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH, Ops.COPY,
                                                     Ops.ASSIGN})  # shape: the sources' common shape
_MOVEMENT = frozenset(GroupOp.Movement)


class AxisType(FastEnum):
  """What the optimizer decided a kernel loop range becomes."""
  GLOBAL = auto(); LOCAL = auto(); LOOP = auto(); REDUCE = auto(); GROUP_REDUCE = auto()  # noqa: E702
  UPCAST = auto(); UNROLL = auto(); THREAD = auto()  # noqa: E702


AXIS_LETTER = {AxisType.GLOBAL: "g", AxisType.LOCAL: "l", AxisType.LOOP: "L", AxisType.REDUCE: "R",
               AxisType.GROUP_REDUCE: "G", AxisType.UPCAST: "u", AxisType.UNROLL: "r", AxisType.THREAD: "t"}


@dataclass(frozen=True)
class KernelInfo:
  """The arg of a kernel's SINK: its name and the opts to apply (None: let the optimizer choose)."""
  name: str = "kernel"
  opts_to_apply: tuple | None = None
  applied_opts: tuple = ()
  dont_use_locals: bool = False


# python semantics of binary operators on UOps: `//` and `%` are C-style (truncating), like the IR's CDIV/CMOD
def _cdiv(a: int, b: int) -> int: return abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) if b != 0 else 0
def _cmod(a: int, b: int) -> int: return a - _cdiv(a, b) * b if b != 0 else 0


def _const_key(x: Any) -> Any:
  """How a constant value is told apart in the interning key: -0.0 from 0.0 (equal, but not the same constant), 1 from
  1.0 and True (equal too), and every NaN the same (NaN != NaN would make each folded NaN a new node)."""
  if x.__class__ is float: return (math.nan if x != x else x, math.copysign(1.0, x))
  return (x, x.__class__) if x.__class__ in (int, bool) else x


class _NodeRef(weakref.ref):
  """The interning table's weak reference to a node, carrying the node's key (so its callback finds the entry without
  a closure per node)."""
  __slots__ = ("key",)
  key: tuple


class UOpMetaClass(type):
  """Interns UOps: `ucache` maps a node's key (its five fields, constants told apart by `_const_key`) to a weak
  reference to the one live node with that key. Lock-free, and thread-safe by two rules, each one atomic step under
  the GIL: an entry is only ever added with `setdefault` (it runs no Python code once the key is hashed), and only
  ever removed by `_remove_dead_weakref` (deletes the entry only if its reference is dead). So a live entry is never
  overwritten or dropped, and two threads building the same node get one object."""
  ucache: dict[tuple, _NodeRef] = {}
  remove_dead = staticmethod(_remove_dead_weakref)
  """Held by the class: at interpreter shutdown the module's global `_remove_dead_weakref` may already be None."""

  @classmethod
  def drop_entry(mcs, ref: _NodeRef) -> None:
    """Weakref callback of an interned node: forget its cache entry -- only if that entry is dead. A node can die (its
    weakref cleared) before its callback runs (garbage collection of a cycle); an equal node built in between owns
    the entry now, and deleting it would let a third equal node be built: two "equal" nodes, not one. A bound
    classmethod, not a module function: callbacks still run at interpreter shutdown, after the module's globals are
    cleared, and the bound class keeps the table reachable."""
    mcs.remove_dead(mcs.ucache, ref.key)

  def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None,
               tag: Any = None) -> UOp:
    # constants that compare equal but differ (-0.0 and 0.0, 1 and 1.0) must stay different nodes, NaNs one node;
    # a VCONST's lanes likewise
    karg: Any
    if arg.__class__ is float: karg = (math.nan if arg != arg else arg, math.copysign(1.0, arg))
    elif arg.__class__ in (int, bool): karg = (arg, arg.__class__)
    elif arg.__class__ is tuple and op is _VCONST: karg = tuple(_const_key(x) for x in arg)
    else: karg = arg
    key = (op, dtype, src, karg, tag)
    ucache = UOpMetaClass.ucache
    if (wret := ucache.get(key)) is not None and (ret := wret()) is not None: return ret
    # UOp.__init__ inlined (every new node of every stage comes through here)
    created: UOp = object.__new__(cls)  # type: ignore[arg-type]
    created.op, created.dtype, created.src, created.arg, created.tag, created._cache = op, dtype, src, arg, tag, {}
    ref = _NodeRef(created, _DROP_ENTRY)
    ref.key = key
    while (wret := ucache.setdefault(key, ref)) is not ref:
      if (ret := wret()) is not None: return ret  # another thread built it meanwhile: that one (ours is dropped)
      # a dead entry whose callback has not run yet: remove it (only if still dead) and try again
      _remove_dead_weakref(ucache, key)
    return created


_DROP_ENTRY = UOpMetaClass.drop_entry  # one bound method for every node's weakref (not a new one per node)
_INTERN = UOpMetaClass.__call__  # `UOp(...)` without the metaclass call slot, for hot builders


class UOp(metaclass=UOpMetaClass):
  """One node of the IR. Immutable and interned; see the module docstring for the fields."""
  __slots__ = ("op", "dtype", "src", "arg", "tag", "__weakref__", "_cache")

  def __init__(self, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None, tag: Any = None):
    self.op, self.dtype, self.src, self.arg, self.tag = op, dtype, src, arg, tag
    self._cache: dict[str, Any] = {}

  def __reduce__(self) -> Any: return (UOp, (self.op, self.dtype, self.src, self.arg, self.tag))

  def replace(self, **kwargs: Any) -> UOp:
    """This node with some fields changed; returns `self` when nothing changes."""
    new = (kwargs.pop("op", self.op), kwargs.pop("dtype", self.dtype), kwargs.pop("src", self.src),
           kwargs.pop("arg", self.arg), kwargs.pop("tag", self.tag))
    if kwargs: raise TypeError(f"UOp.replace got unknown fields {list(kwargs)}; valid: op, dtype, src, arg, tag")
    if new[0] is self.op and new[1] is self.dtype and new[2] == self.src and new[3] is self.arg and new[4] is self.tag:
      return self
    return UOp(*new)

  # ***** graph walking *****
  def toposort(self, gate: Callable[[UOp], bool] | None = None) -> dict[UOp, None]:
    """Every node reachable from here, sources before users (iterative: deep graphs are fine). `gate(node)` False
    stops the walk at that node (it is left out). Linear in the graph's size, computed on every call (never stored
    on the node: see the module docstring), so a caller that needs it twice keeps it."""
    out: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      node, visited = stack.pop()
      if node in out: continue
      if not visited:
        if gate is None or gate(node):
          stack.append((node, True))
          for s in reversed(node.src):
            if s not in out: stack.append((s, False))
      else: out[node] = None
    return out

  def sink(self, *srcs: UOp, **kwargs: Any) -> UOp: return UOp(Ops.SINK, dtypes.void, (self, *srcs), **kwargs)

  def substitute(self, dvars: dict[UOp, UOp], name: str | None = None) -> UOp:
    """Replace nodes by others everywhere below (and including) this one; a replacement is itself substituted (as a
    bottom-up `graph_rewrite` would). One iterative walk that rebuilds only what changes (no rule dispatch); `name`
    is kept for callers that label their passes. A replacement that leads back to the node it replaces is an error."""
    if not dvars: return self
    out: dict[UOp, UOp] = {}
    busy: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(self, False)]
    get, push, pop = dvars.get, stack.append, stack.pop
    while stack:
      n, done = pop()
      if done:
        busy.discard(n)
        if (m := get(n)) is not None and m is not n: out[n] = out[m]
        else:
          src = n.src
          new_src = tuple([out[x] for x in src])
          out[n] = n if new_src == src else n.replace(src=new_src)
        continue
      if n in out: continue
      if n in busy: raise RuntimeError(f"substitute {name or ''}: replacing {n.op} leads back to itself (cycle)")
      busy.add(n)
      push((n, True))
      if (m := get(n)) is not None and m is not n:
        if m not in out: push((m, False))
      else:
        for x in n.src:
          if x not in out: push((x, False))
    return out[self]

  @property
  def ranges(self) -> dict[UOp, None]:
    """The RANGE nodes this value depends on and that are still open (not closed by a REDUCE/END below it).
    Cached per node, filled for the nodes below in one pass; a RANGE's own `{self}` is made on each call (stored, it
    would be a reference cycle). Treat the result as read-only: nodes with the same ranges share one dict."""
    if self.op is Ops.RANGE: return {self: None}
    if (ret := self._cache.get("ranges")) is not None: return ret
    for node in self.toposort(gate=lambda n: n.op is Ops.RANGE or "ranges" not in n._cache):
      if node.op is Ops.RANGE or "ranges" in node._cache: continue
      if node.op in (Ops.REDUCE, Ops.END):
        closed = set(node.src[1:])
        r = {k: None for s in node.src[:1] for k in _ranges_of(s) if k not in closed}
      else:
        r = _EMPTY_RANGES
        for s in node.src:
          sr = _ranges_of(s)
          if not sr or sr is r: continue
          if not r: r = sr  # one source's ranges: shared, not copied
          elif not sr.keys() <= r.keys(): r = {**r, **sr}
      node._cache["ranges"] = r
    return self._cache["ranges"]

  # ***** shape and device (graph level) *****
  @property
  def shape(self) -> tuple[sint, ...] | None:
    """The shape of a graph-level (tensor) value; None for kernel-level nodes."""
    if "shape" in (c := self._cache): return c["shape"]
    for s in self.src:  # a new node over known ones (every eager op): no walk (a loop: no generator on this path)
      if "shape" not in (sc := s._cache):
        for ss in s.src:  # ... or over new ones over known ones (`x.cast(a).cast(b)`): one level more, no walk
          if "shape" not in ss._cache: break
        else:
          sc["shape"] = _compute_shape(s)
          continue
        break
    else:
      ret = c["shape"] = _compute_shape(self)
      return ret
    for node in self.toposort(gate=lambda n: "shape" not in n._cache):
      if "shape" not in node._cache: node._cache["shape"] = _compute_shape(node)
    return self._cache["shape"]

  @property
  def size(self) -> sint: return prod(self.shape) if self.shape is not None else 1

  @property
  def ndim(self) -> int: return len(self.shape) if self.shape is not None else 0

  @property
  def device(self) -> str | tuple[str, ...] | None:
    """The device a graph-level value lives on (from its DEVICE sources)."""
    if "device" in (c := self._cache): return c["device"]
    if self.op not in _DEVICE_SETTERS:  # over known sources: the first device among them, no walk
      d = None
      for s in self.src:
        if "device" not in (sc := s._cache):
          if s.op in _DEVICE_SETTERS: break
          # a new source over known ones (`(x * 2).cast(...)`): its device the same way, one level more, no walk
          sd = None
          for ss in s.src:
            if "device" not in (ssc := ss._cache): break
            if sd is None: sd = ssc["device"]
          else:
            sc["device"] = sd
            if d is None: d = sd
            continue
          break
        if d is None: d = sc["device"]
      else:
        c["device"] = d
        return d
    for node in self.toposort(gate=lambda n: "device" not in n._cache):
      if "device" in node._cache: continue
      if node.op is Ops.DEVICE: d = node.arg
      elif node.op is Ops.COPY: d = node.src[1].arg
      elif node.op is Ops.MULTI: d = tuple(s._cache["device"] for s in node.src)
      else: d = next((s._cache["device"] for s in node.src if s._cache.get("device") is not None), None)
      node._cache["device"] = d
    return self._cache["device"]

  # ***** value range *****
  @property
  def vmin(self) -> ConstType: return self._min_max[0]
  @property
  def vmax(self) -> ConstType: return self._min_max[1]

  @property
  def _min_max(self) -> tuple[ConstType, ConstType]:
    if (ret := self._cache.get("mm")) is not None: return ret
    for node in self.toposort(gate=lambda n: "mm" not in n._cache):
      if "mm" not in node._cache: node._cache["mm"] = _compute_min_max(node)
    return self._cache["mm"]

  @property
  def vrange(self) -> tuple[ConstType, ConstType]: return self._min_max

  # ***** constructors *****
  @staticmethod
  def const(dtype: DType, b: Any, device: str | None = None, shape: tuple[sint, ...] | None = None) -> UOp:
    """A constant. With `device`, a graph-level constant of `shape` (scalar broadcast); without, a kernel constant."""
    if isinstance(b, UOp): return b.unbind()[0] if b.op is Ops.BIND else b
    if isinstance(b, tuple) and len(set(b)) == 1: b = b[0]
    if isinstance(b, tuple):
      return UOp(Ops.VCONST, dtype.scalar().vec(len(b)), arg=tuple(dtypes.as_const(x, dtype) for x in b))
    ret = UOp(Ops.CONST, dtype, arg=dtypes.as_const(b, dtype), src=(UOp(Ops.DEVICE, arg=device),) if device else ())
    if shape is not None:
      ret = ret.reshape((1,) * len(shape)).expand(shape) if shape else ret
    return ret

  def const_like(self, b: Any) -> UOp:
    """A constant of this node's dtype (and, for graph values, its device and shape)."""
    if self.shape is not None and self._device_of() is not None:
      return UOp.const(self.dtype, b, self._device_of(), self.shape)
    return UOp.const(self.dtype, b)

  def _device_of(self) -> str | None:
    d = self.device
    return d if isinstance(d, str) else None

  @staticmethod
  def variable(name: str, min_val: ConstType, max_val: ConstType, dtype: DType = dtypes.index) -> UOp:
    """A symbolic integer `name` in [min_val, max_val]."""
    if not isinstance(min_val, int) or not isinstance(max_val, int) or min_val > max_val:
      raise ValueError(f"Variable {name!r}: bounds must be ints with min <= max, got [{min_val}, {max_val}]")
    if not dtypes.is_int(dtype):
      raise TypeError(f"Variable {name!r}: dtype {dtype!r} is not an integer dtype; valid: {dtypes.ints}")
    lo, hi = int(dtypes.min(dtype)), int(dtypes.max(dtype))
    if min_val < lo or max_val > hi:
      raise ValueError(f"Variable {name!r}: bounds [{min_val}, {max_val}] don't fit its dtype {dtype!r}, which holds "
                       f"[{lo}, {hi}]; pass a wider dtype (dtype=dtypes.int64)")
    return UOp(Ops.DEFINE_VAR, dtype, arg=(name, min_val, max_val))

  @staticmethod
  def range(end: sint, axis_id: int, axis_type: AxisType = AxisType.LOOP, dtype: DType = dtypes.index) -> UOp:
    """A loop index in [0, end). A constant `end` beyond `dtype` is an error, never a wrapped bound: a range over
    more than 2**31-1 elements needs `dtype=dtypes.int64`."""
    if isinstance(end, int) and not dtypes.min(dtype) <= end <= dtypes.max(dtype):
      raise ValueError(f"range bound {end} doesn't fit {dtype!r} (at most {dtypes.max(dtype)}); use a wider index "
                       "dtype (dtypes.int64)")
    return UOp(Ops.RANGE, dtype, (sint_to_uop(end, dtype),), (axis_id, axis_type))

  @staticmethod
  def new_buffer(device: str, size: int, dtype: DType, num: int | None = None) -> UOp:
    """A graph-level buffer of `size` elements; `num` (default: a fresh number) makes it unique."""
    return UOp.new_buffer_on(_INTERN(UOp, _DEVICE, dtypes.void, (), device), size, dtype, num)

  @staticmethod
  def new_buffer_on(dnode: UOp, size: int, dtype: DType, num: int | None = None) -> UOp:
    """`new_buffer` on an interned DEVICE node the caller keeps (the engine's replay: interning the device again
    costs ~0.7 us a buffer)."""
    if num is None: num = next(_unique_counter)
    # the interning function called directly, not through the type's call slot (positional arguments: a keyword one
    # costs ~0.1 us): every eager op's output buffer comes through here
    ret = _INTERN(UOp, _BUFFER, dtype, (_INTERN(UOp, _UNIQUE, dtypes.void, (), num), dnode), size)
    # what `shape` and `device` would compute, set now: on a fresh node they would walk (its UNIQUE has neither)
    if "device" not in ret._cache: ret._cache["shape"], ret._cache["device"] = (size,), dnode.arg
    return ret

  @staticmethod
  def unique() -> UOp:
    """A fresh UNIQUE node: makes otherwise equal nodes distinct."""
    return UOp(Ops.UNIQUE, arg=next(_unique_counter))

  def bind(self, val: int) -> UOp:
    """Bind a DEFINE_VAR to a value within its bounds."""
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"bind needs a DEFINE_VAR, got {self.op}")
    if not self.arg[1] <= val <= self.arg[2]:
      raise ValueError(f"value {val} is out of bounds for Variable {self.arg[0]!r} in [{self.arg[1]}, {self.arg[2]}]")
    return UOp(Ops.BIND, self.dtype, (self, self.const_like(val)))

  def unbind(self) -> tuple[UOp, int]:
    if self.op is not Ops.BIND: raise TypeError(f"unbind needs a BIND, got {self.op}")
    return self.src[0], self.src[1].arg

  @property
  def expr(self) -> str:
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"expr is for DEFINE_VAR, got {self.op}")
    return self.arg[0]

  # ***** ALU building *****
  def alu(self, op: Ops, *src: Any) -> UOp:
    """`op` over this node and `src` (Python scalars become constants). Operands of different scalar dtypes (an int
    variable and a float constant: `1.5 + v`) are cast to their `least_upper_dtype` first, so the node is well
    typed; shift counts, WHERE's condition and THREEFRY keep theirs."""
    srcs = (self, *(self._ufix(s) for s in src))
    if len(srcs) > 1 and op not in _OWN_OPERAND_DTYPES:
      vals = srcs[1:] if op is Ops.WHERE else srcs
      if len({s.dtype.scalar() for s in vals}) > 1:
        to = least_upper_dtype(*(s.dtype.scalar() for s in vals))
        vals = tuple(s.cast(to.vec(s.dtype.count)) for s in vals)
        srcs = (srcs[0], *vals) if op is Ops.WHERE else vals
    if op in GroupOp.Comparison: out_dtype = dtypes.bool.vec(srcs[0].dtype.count)
    elif op in (Ops.SHL, Ops.SHR): out_dtype = srcs[0].dtype  # the value's type, whatever the count's
    elif op is Ops.THREEFRY: out_dtype = dtypes.uint64
    else: out_dtype = srcs[-1].dtype
    return UOp(op, out_dtype, srcs)

  def _ufix(self, x: Any) -> UOp:
    if isinstance(x, UOp): return x
    dt = self.dtype
    if isinstance(x, float) and not dtypes.is_float(dt): dt = dtypes.default_float
    return self.const_like(x) if dt is self.dtype else UOp.const(dt, x)

  def cast(self, dtype: DType) -> UOp:
    """This value converted to `dtype` (no-op when it already is)."""
    if self.dtype == dtype: return self
    return UOp(Ops.CAST, dtype, (self,))

  def bitcast(self, dtype: DType) -> UOp: return UOp(Ops.BITCAST, dtype, (self,))

  def where(self, x: Any, y: Any) -> UOp:
    """`x` where this condition is true, else `y`."""
    if isinstance(x, UOp): xu = x
    elif isinstance(y, UOp): xu = y.const_like(x)
    else:  # both Python scalars: a constant of x's own dtype (not the bool condition's: 0.5 isn't True)
      dev = self._device_of() if self.shape is not None else None
      xu = UOp.const(dtypes.from_py(x), x, dev, self.shape if dev is not None else None)
    yu = y if isinstance(y, UOp) else xu.const_like(y)
    if xu.dtype != yu.dtype: raise TypeError(f"where: branches have different dtypes {xu.dtype} and {yu.dtype}")
    return UOp(Ops.WHERE, xu.dtype, (self, xu, yu))

  def maximum(self, x: Any) -> UOp: return self.alu(Ops.MAX, x)
  def minimum(self, x: Any) -> UOp: return -(-self).maximum(-self._ufix(x))
  def reciprocal(self) -> UOp: return self.alu(Ops.RECIPROCAL)
  def sqrt(self) -> UOp: return self.alu(Ops.SQRT)
  def exp2(self) -> UOp: return self.alu(Ops.EXP2)
  def log2(self) -> UOp: return self.alu(Ops.LOG2)
  def sin(self) -> UOp: return self.alu(Ops.SIN)
  def trunc(self) -> UOp: return self.alu(Ops.TRUNC)
  def ne(self, x: Any) -> UOp: return self.alu(Ops.CMPNE, x)
  def eq(self, x: Any) -> UOp: return self.alu(Ops.CMPEQ, x)
  def logical_not(self) -> UOp: return self.ne(True)
  def pow(self, x: Any) -> UOp: return self.alu(Ops.POW, x)

  def __neg__(self) -> UOp: return self.alu(Ops.NEG) if self.dtype != dtypes.bool else self.logical_not()
  def __add__(self, x: Any) -> UOp: return self.alu(Ops.ADD, x)
  def __radd__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.ADD, self)
  def __sub__(self, x: Any) -> UOp: return self.alu(Ops.SUB, x)
  def __rsub__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.SUB, self)
  def __mul__(self, x: Any) -> UOp: return self.alu(Ops.MUL, x)
  def __rmul__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.MUL, self)
  def __floordiv__(self, x: Any) -> UOp: return self.alu(Ops.CDIV, x)
  def __rfloordiv__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.CDIV, self)
  def __truediv__(self, x: Any) -> UOp: return self.alu(Ops.FDIV, x)
  def __rtruediv__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.FDIV, self)
  def __mod__(self, x: Any) -> UOp: return self.alu(Ops.CMOD, x)
  def __rmod__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.CMOD, self)
  def __lt__(self, x: Any) -> UOp: return self.alu(Ops.CMPLT, x)
  def __gt__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.CMPLT, self)
  def __ge__(self, x: Any) -> UOp: return (self < x).logical_not()
  def __le__(self, x: Any) -> UOp: return (self > x).logical_not()
  def __and__(self, x: Any) -> UOp: return self.alu(Ops.AND, x)
  def __rand__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.AND, self)
  def __or__(self, x: Any) -> UOp: return self.alu(Ops.OR, x)
  def __ror__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.OR, self)
  def __xor__(self, x: Any) -> UOp: return self.alu(Ops.XOR, x)
  def __rxor__(self, x: Any) -> UOp: return self._ufix(x).alu(Ops.XOR, self)
  def __lshift__(self, x: Any) -> UOp: return self.alu(Ops.SHL, x)
  def __rshift__(self, x: Any) -> UOp: return self.alu(Ops.SHR, x)
  def __invert__(self) -> UOp: return self.logical_not() if self.dtype == dtypes.bool else self ^ -1
  # UOps are interned: equality is identity. Use .eq()/.ne() to build comparisons. Spelled out (not object's): with a
  # Python __lt__ on the class, object's == takes the slow generic path (NotImplemented both ways, then identity)
  def __eq__(self, x: object) -> bool: return self is x if isinstance(x, UOp) else NotImplemented
  def __ne__(self, x: object) -> bool: return self is not x if isinstance(x, UOp) else NotImplemented
  __hash__ = object.__hash__

  def __bool__(self) -> bool:
    raise TypeError(f"the truth value of a UOp is ambiguous: {self.render()}; compare with .vmin/.vmax or simplify "
                    "first")

  def __index__(self) -> int:
    if self.op is Ops.CONST: return int(self.arg)
    raise TypeError(f"{self.render()} is symbolic, not an int")

  # ***** movement (graph level) *****
  def reshape(self, arg: tuple[sint, ...]) -> UOp:
    return self if self.shape == tuple(arg) else self._mop(Ops.RESHAPE, tuple(arg))

  def permute(self, arg: tuple[int, ...]) -> UOp:
    return self if tuple(arg) == tuple(range(len(arg))) else self._mop(Ops.PERMUTE, tuple(arg))

  def expand(self, arg: tuple[sint, ...]) -> UOp:
    return self if self.shape == tuple(arg) else self._mop(Ops.EXPAND, tuple(arg))

  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
    return self if all(b == 0 and a == 0 for b, a in arg) else self._mop(Ops.PAD, tuple(tuple(x) for x in arg))
  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
    if self.shape is not None and all(b == 0 and e == s for (b, e), s in zip(arg, self.shape)): return self
    return self._mop(Ops.SHRINK, tuple(tuple(x) for x in arg))
  def flip(self, arg: tuple[bool, ...]) -> UOp: return self if not any(arg) else self._mop(Ops.FLIP, tuple(arg))

  def _mop(self, op: Ops, arg: Any) -> UOp:
    ret = UOp(op, self.dtype, (self,), arg)
    ret.shape  # validate eagerly: a bad movement op fails where it was written  # noqa: B018
    return ret

  def r(self, op: Ops, axis: tuple[int, ...]) -> UOp:
    """Graph-level reduce of `axis` with `op` (ADD, MUL or MAX); reduced dims stay as size 1."""
    return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, tuple(sorted(axis))))

  def contiguous(self) -> UOp: return UOp(Ops.CONTIGUOUS, self.dtype, (self,))
  def detach(self) -> UOp: return UOp(Ops.DETACH, self.dtype, (self,))
  def copy_to_device(self, device: str) -> UOp: return UOp(Ops.COPY, self.dtype, (self, UOp(Ops.DEVICE, arg=device)))
  def assign(self, x: UOp) -> UOp: return UOp(Ops.ASSIGN, self.dtype, (self, x))

  # ***** kernel-level memory *****
  def index(self, idx: UOp, valid: UOp | None = None) -> UOp:
    """A pointer to element `idx` of buffer `self` (PARAM/DEFINE_LOCAL/DEFINE_REG); `valid` gates the access."""
    return UOp(Ops.INDEX, self.dtype, (self, idx) if valid is None else (self, idx, valid))

  def load(self, *src: UOp, dtype: DType | None = None) -> UOp:
    if dtype is None: dtype = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
    return UOp(Ops.LOAD, dtype, (self, *src))

  def store(self, val: UOp, *src: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (self, val, *src))
  def end(self, *rngs: UOp) -> UOp: return UOp(Ops.END, dtypes.void, (self, *rngs))
  def reduce(self, *rngs: UOp, arg: Ops = Ops.ADD) -> UOp: return UOp(Ops.REDUCE, self.dtype, (self, *rngs), arg)

  # ***** symbolic *****
  def simplify(self) -> UOp:
    """This expression through the symbolic simplifier."""
    from tiny_uop.symbolic import simplify
    return simplify(self)

  def ssimplify(self) -> sint:
    """Simplified, as an int when it folds to a constant."""
    ret = self.simplify()
    return ret.arg if ret.op is Ops.CONST else ret

  def sym_infer(self, var_vals: dict[str, int]) -> int:
    """Evaluate a symbolic integer expression with the variables' values (by name)."""
    return sym_eval(self, var_vals)

  @property
  def vars(self) -> list[UOp]:
    return [x for x in self.toposort() if x.op is Ops.DEFINE_VAR]

  def variables(self) -> list[UOp]:
    return sorted({x.src[0] if x.op is Ops.BIND else x for x in self.toposort() if x.op in (Ops.DEFINE_VAR, Ops.BIND)},
                  key=lambda v: v.arg)

  # ***** printing *****
  def render(self, simplify: bool = False) -> str:
    """The expression as readable infix text: `((gidx0*4)+lidx1)`."""
    return render_expr(self.simplify() if simplify else self)

  def __repr__(self) -> str: return pretty_print(self)


_OWN_OPERAND_DTYPES = {Ops.SHL, Ops.SHR, Ops.THREEFRY}  # ops whose operands have dtypes of their own (alu keeps them)
_EMPTY_RANGES: dict[UOp, None] = {}


def _ranges_of(u: UOp) -> dict[UOp, None]:
  return {u: None} if u.op is Ops.RANGE else u._cache["ranges"]


_unique_counter = itertools.count()
sint = int | UOp
"""A size that may be symbolic."""


def Variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.index) -> UOp:
  """A symbolic integer for shapes: `Variable("n", 1, 64)`."""
  return UOp.variable(name, min_val, max_val, dtype)


def sint_to_uop(x: sint, dtype: DType = dtypes.index) -> UOp:
  return x if isinstance(x, UOp) else UOp.const(dtype, x)


def ssimplify(x: sint) -> sint: return x.ssimplify() if isinstance(x, UOp) else x


def smax(*lst: Any) -> sint:
  lst2 = lst[0] if len(lst) == 1 and isinstance(lst[0], (list, tuple)) else lst
  def _max2(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int): return max(a, b)
    return sint_to_uop(a).maximum(b).ssimplify()
  return functools.reduce(_max2, lst2)


def resolve(x: Any, default: bool = True) -> bool:
  """Turn a possibly symbolic boolean into a Python bool: the definite answer when the range decides it, else
  `default`."""
  if not isinstance(x, UOp): return bool(x)
  if x.dtype != dtypes.bool: raise TypeError(f"resolve needs a bool expression, got {x.dtype}: {x.render()}")
  sx = x.simplify()
  return bool(sx.vmin) if sx.vmin == sx.vmax else default


def sym_eval(x: sint, var_vals: dict[str, int]) -> Any:
  """Evaluate `x` with variables given by name (an int passes through)."""
  if not isinstance(x, UOp): return x
  from tiny_uop.alu import exec_alu
  vals: dict[UOp, Any] = {}
  for n in x.toposort():
    if n.op is Ops.CONST: vals[n] = n.arg
    elif n.op is Ops.DEFINE_VAR:
      if n.arg[0] not in var_vals: raise KeyError(f"no value for Variable {n.arg[0]!r}; given: {sorted(var_vals)}")
      vals[n] = var_vals[n.arg[0]]
    elif n.op is Ops.BIND: vals[n] = vals[n.src[1]]
    elif n.op in GroupOp.ALU or n.op is Ops.CAST: vals[n] = exec_alu(n.op, n.dtype, tuple(vals[s] for s in n.src))
    else: raise TypeError(f"can't evaluate {n.op} in a symbolic expression")
  return vals[x]


# ***** shape inference *****
def _compute_shape(u: UOp) -> tuple[sint, ...] | None:
  op = u.op
  if op in _SHAPE_AS_SOURCES:  # first: every eager op comes through here (module constants: see _BUFFER)
    first = None
    for x in u.src:  # every source with a shape has the same one (a loop, no generator)
      if x.op in _NO_SHAPE_SRC or (xs := x._cache["shape"]) is None: continue
      if first is None: first = xs
      elif xs != first:
        shapes = [x._cache["shape"] for x in u.src if x.op not in _NO_SHAPE_SRC]
        shapes = [x for x in shapes if x is not None]
        raise ValueError(f"{op} sources have different shapes {shapes}; broadcast them first")
    if first is None: return None
    if op is _BITCAST and u.dtype.itemsize != u.src[0].dtype.itemsize and first:
      return (*first[:-1], first[-1] * u.src[0].dtype.itemsize // u.dtype.itemsize)
    return first
  if op in _MOVEMENT:
    if (ps := u.src[0]._cache["shape"]) is None:
      raise ValueError(f"{op} needs a source with a shape, got {u.src[0].op}")
    return _movement_shape(op, ps, u.arg)
  if op is _BUFFER: return (u.arg,)
  if op is Ops.CONST: return () if u.src else None
  if op in (Ops.DEFINE_VAR, Ops.BIND): return () if op is Ops.BIND or u.src else None
  if op in _NO_SHAPE_SRC or not u.src: return None
  ps = u.src[0]._cache["shape"]
  if op is Ops.MULTI:  # the shards' shapes, summed along the split axis
    if u.arg is None: return ps
    return tuple(sum(x._cache["shape"][i] for x in u.src) if i == u.arg else d for i, d in enumerate(ps))
  if op is Ops.REDUCE_AXIS:
    if ps is None: return None
    _, axes = u.arg
    if any(not 0 <= a < len(ps) for a in axes): raise ValueError(f"reduce axes {axes} out of range for shape {ps}")
    return tuple(1 if i in axes else s for i, s in enumerate(ps))
  return None


_INT_ONLY = {int}


def _movement_shape(op: Ops, ps: tuple[sint, ...], arg: Any) -> tuple[sint, ...]:
  if op is Ops.RESHAPE:
    if {*map(type, arg), *map(type, ps)} == _INT_ONLY:  # hot path: static shapes (no generator frames)
      if arg and min(arg) < 0: raise ValueError(f"reshape to {arg}: negative dimension")
      if math.prod(ps) != math.prod(arg):
        raise ValueError(f"can't reshape {ps} (size {math.prod(ps)}) to {arg} (size {math.prod(arg)})")
      return tuple(arg)
    if any(isinstance(s, int) and s < 0 for s in arg): raise ValueError(f"reshape to {arg}: negative dimension")
    if all_int(ps) and all_int(arg) and prod(ps) != prod(arg):
      raise ValueError(f"can't reshape {ps} (size {prod(ps)}) to {arg} (size {prod(arg)})")
    return tuple(arg)
  if op is Ops.PERMUTE:
    if sorted(arg) != list(range(len(ps))):
      raise ValueError(f"permute order {arg} is not a permutation of {len(ps)} axes")
    return tuple(ps[i] for i in arg)
  if op is Ops.EXPAND:
    if len(arg) != len(ps) or any(p != a and p != 1 for p, a in zip(ps, arg)):
      raise ValueError(f"can't expand {ps} to {arg}: only size-1 dimensions expand")
    return tuple(arg)
  if op is Ops.PAD:
    if len(arg) != len(ps): raise ValueError(f"pad {arg} has {len(arg)} pairs for shape {ps} of {len(ps)} dims")
    return tuple(s + b + a for s, (b, a) in zip(ps, arg))
  if op is Ops.SHRINK:
    if len(arg) != len(ps): raise ValueError(f"shrink {arg} has {len(arg)} pairs for shape {ps} of {len(ps)} dims")
    for s, (b, e) in zip(ps, arg):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise ValueError(f"shrink {arg} out of bounds for shape {ps}")
    return tuple(ssimplify(e - b) for b, e in arg)
  if op is Ops.FLIP:
    if len(arg) != len(ps): raise ValueError(f"flip {arg} has {len(arg)} flags for shape {ps}")
    return ps
  raise AssertionError(op)


# ***** value range analysis *****
def _compute_min_max(u: UOp) -> tuple[ConstType, ConstType]:
  """A sound [vmin, vmax] of `u` from its sources' ranges (the value, wrapping included, always lies inside).

  Floats: a range narrower than the dtype's whole [-inf, inf] also promises the value is never NaN; the whole range
  means "unknown, NaN included". A NaN bound (a NaN constant, or one computed from it) is never kept: it becomes the
  whole range, since Python's min/max and comparisons with NaN give order-dependent or always-false answers that
  would fold `where(c, nan, x) > 0` or `x**0.7 > 1` to a wrong constant.
  """
  lo, hi = _node_min_max(u)
  if lo != lo or hi != hi: return (dtypes.min(u.dtype), dtypes.max(u.dtype))  # a NaN bound: unknown
  return (lo, hi)


def _node_min_max(u: UOp) -> tuple[ConstType, ConstType]:
  dt = u.dtype
  if u.op is Ops.CONST: return (u.arg, u.arg) if not isinstance(u.arg, UOp) else u.arg._min_max
  if u.op is Ops.VCONST: return (min(u.arg), max(u.arg))
  if u.op is Ops.DEFINE_VAR: return (u.arg[1], u.arg[2])
  if u.op is Ops.BIND: return u.src[0]._min_max
  if u.op is Ops.RANGE: return (0, (u.src[0]._cache["mm"][1] - 1))
  if u.op is Ops.SPECIAL: return (0, u.src[0]._cache["mm"][1] - 1) if u.src else (0, dtypes.max(dt))
  if u.op in (Ops.VECTORIZE, Ops.CAT) and u.src:
    return min(s._cache["mm"][0] for s in u.src), max(s._cache["mm"][1] for s in u.src)
  if u.op is Ops.GEP: return u.src[0]._cache["mm"]
  if dt.scalar() == dtypes.bool and u.op not in _BOOL_RANGE_OPS: return (False, True)
  if u.op in GroupOp.ALU or u.op is Ops.CAST:
    mm = [s._cache["mm"] for s in u.src]
    ret = _alu_range(u.op, dt, mm, u)
    if ret is not None: return ret
  return (dtypes.min(dt), dtypes.max(dt))


_BOOL_RANGE_OPS = GroupOp.Comparison | {Ops.AND, Ops.OR, Ops.WHERE, Ops.XOR, Ops.CAST}


def _alu_range(op: Ops, dt: DType, mm: list[tuple[Any, Any]], u: UOp) -> tuple[Any, Any] | None:
  """The range of `op` over operand ranges `mm`, or None for "anything the dtype holds"."""
  if op is Ops.CAST: return _cast_range(dt, u.src[0].dtype, *mm[0])
  if op is Ops.WHERE:
    (c0, c1), (x0, x1), (y0, y1) = mm
    if c0 == c1 and isinstance(c0, bool): return (x0, x1) if c0 else (y0, y1)  # a decided condition picks one side
    return (min(x0, y0), max(x1, y1))
  if not dtypes.is_int(dt) and dt != dtypes.bool and op not in GroupOp.Comparison: return None
  lim_lo, lim_hi = dtypes.min(dt), dtypes.max(dt)

  def fits(lo: Any, hi: Any) -> tuple[Any, Any] | None:  # the exact result range, if it can't wrap
    return (lo, hi) if lim_lo <= lo <= hi <= lim_hi else None
  if op is Ops.NEG: return fits(-mm[0][1], -mm[0][0])
  if op in GroupOp.Comparison: return _cmp_range(op, mm[0], mm[1])
  if op is Ops.MULACC:
    prods = [x * y for x in mm[0] for y in mm[1]]
    return fits(min(prods) + mm[2][0], max(prods) + mm[2][1])
  if len(mm) != 2: return None
  (a0, a1), (b0, b1) = mm
  if dt == dtypes.bool:
    if op is Ops.AND: return (bool(a0 and b0), bool(a1 and b1))
    if op is Ops.OR: return (bool(a0 or b0), bool(a1 or b1))
    if op is Ops.XOR: return (False, True) if a0 != a1 or b0 != b1 else (a0 != b0, a0 != b0)
    return None
  if op is Ops.ADD: return fits(a0 + b0, a1 + b1)
  if op is Ops.SUB: return fits(a0 - b1, a1 - b0)
  if op is Ops.MUL:
    prods = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
    return fits(min(prods), max(prods))
  if op is Ops.MAX: return (max(a0, b0), max(a1, b1))
  if op is Ops.CDIV:
    if b0 > 0 or b1 < 0:  # divisor range excludes 0: trunc(a/b) is monotone in each, extremes at the corners
      qs = [_cdiv(a, b) for a in (a0, a1) for b in (b0, b1)]
      return fits(min(qs), max(qs))
    return None
  if op is Ops.CMOD: return _cmod_range(a0, a1, b0, b1)
  bits = 8 * dt.itemsize
  if op is Ops.AND and a0 >= 0 and b0 >= 0: return (0, min(a1, b1))
  # shift counts are taken modulo the bit width (exec_alu): only counts known to be in [0, bits) are analysed
  if op is Ops.SHL and b0 == b1 and 0 <= b0 < bits and a0 >= 0: return fits(a0 << b0, a1 << b0)
  if op is Ops.SHR and 0 <= b0 and b1 < bits and a0 >= 0: return (a0 >> b1, a1 >> b0)
  return None


def _cmp_range(op: Ops, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[bool, bool]:
  # sound for floats: a possibly-NaN operand has the range [-inf, inf] (see _compute_min_max), which can't be
  # disjoint from another range nor a single point, so only "always false" folds of </== (true for NaN too) remain
  (a0, a1), (b0, b1) = a, b
  if op is Ops.CMPLT: return (bool(a1 < b0), bool(a0 < b1))  # always true only if a1 < b0
  disjoint, same_point = a1 < b0 or b1 < a0, a0 == a1 == b0 == b1
  if op is Ops.CMPNE: return (True, True) if disjoint else (False, False) if same_point else (False, True)
  return (False, False) if disjoint else (True, True) if same_point else (False, True)  # CMPEQ


def _cmod_range(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int] | None:
  # C: the result has the dividend's sign and |a % b| < |b|; a % b == a when |a| < |b|
  if b1 < 0: b0, b1 = -b1, -b0
  elif b0 <= 0: return None  # the divisor may be 0 (x % 0 is 0) or change sign: no tighter bound than below
  hi_abs = b1 - 1
  if a0 >= 0: return (a0, a1) if a1 < b0 else (0, min(a1, hi_abs))
  if a1 <= 0: return (a0, a1) if -a0 < b0 else (max(a0, -hi_abs), 0)
  return (max(a0, -hi_abs), min(a1, hi_abs))


def _cast_range(dt: DType, src_dt: DType, lo: Any, hi: Any) -> tuple[Any, Any] | None:
  if isinstance(lo, float) and (math.isnan(lo) or math.isnan(hi)): return None
  if dt.scalar() == dtypes.bool:
    if lo == hi: return (bool(lo), bool(lo))
    return (True, True) if lo > 0 or hi < 0 else (False, True)
  if dtypes.is_int(dt):
    if isinstance(lo, float):  # float -> int truncates toward zero (when in range)
      if not (math.isfinite(lo) and math.isfinite(hi)): return None
      lo, hi = math.trunc(lo), math.trunc(hi)
    return (int(lo), int(hi)) if dtypes.min(dt) <= lo and hi <= dtypes.max(dt) else None
  if dtypes.is_float(dt) and dt.scalar() in FLOAT_BITS:
    if dtypes.is_float(src_dt): return (lo, hi) if dt.itemsize > src_dt.itemsize or dt == src_dt else None
    exact = 2 ** (FLOAT_BITS[dt.scalar()][1] + 1)  # int -> float is exact up to 2**(mantissa+1), then it rounds
    if not isinstance(lo, float) and -exact <= lo and hi <= exact: return (float(lo), float(hi))
  return None


# ***** printing *****
_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.CDIV: "//", Ops.CMOD: "%", Ops.FDIV: "/", Ops.CMPLT: "<",
          Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}


def render_expr(root: UOp) -> str:
  """Infix text of an expression, iteratively (deep expressions are fine)."""
  txt: dict[UOp, str] = {}
  for u in root.toposort():
    s = [txt.get(x, "?") for x in u.src]
    if u.op is Ops.CONST: t = str(u.arg)
    elif u.op is Ops.DEFINE_VAR: t = u.arg[0]
    elif u.op is Ops.BIND: t = s[0]
    elif u.op is Ops.RANGE:
      t = f"r{AXIS_LETTER.get(u.arg[1], '')}{u.arg[0]}" if isinstance(u.arg, tuple) else f"ridx{u.arg}"
    elif u.op is Ops.SPECIAL: t = str(u.arg)
    elif u.op in _INFIX and len(s) == 2: t = f"({s[0]}{_INFIX[u.op]}{s[1]})"
    elif u.op is Ops.NEG: t = f"(-{s[0]})"
    elif u.op is Ops.MAX: t = f"max({s[0]}, {s[1]})"
    elif u.op is Ops.WHERE: t = f"({s[1]} if {s[0]} else {s[2]})"
    elif u.op is Ops.CAST: t = f"({u.dtype!r})({s[0]})"
    elif u.op is Ops.LOAD: t = f"load({s[0]})"
    elif u.op is Ops.INDEX: t = f"{s[0]}[{s[1]}]" + (f"<{s[2]}>" if len(s) > 2 else "")
    elif u.op is Ops.PARAM: t = f"data{u.arg}"
    else: t = f"{u.op.name.lower()}({', '.join(s)})" if s else u.op.name.lower()
    txt[u] = t
  return txt[root]


def pretty_print(root: UOp, max_lines: int = 400) -> str:
  """A graph as numbered lines, shared nodes printed once: `%3 = ADD dtypes.int (%1, %2) arg=None`."""
  nodes = list(root.toposort())
  if len(nodes) == 1:
    tag = f", tag={root.tag!r}" if root.tag is not None else ""
    return f"UOp({root.op}, {root.dtype!r}, arg={root.arg!r}{tag}, src=({', '.join(repr(s) for s in root.src)}))"
  ids = {u: i for i, u in enumerate(nodes)}
  lines = [f"%{ids[u]} = {u.op.name} {u.dtype!r} ({', '.join(f'%{ids[s]}' for s in u.src)})" +
           (f" arg={u.arg!r}" if u.arg is not None else "") + (f" tag={u.tag!r}" if u.tag is not None else "")
           for u in nodes]
  if len(lines) > max_lines:
    lines = lines[:max_lines // 2] + [f"... {len(lines) - max_lines} lines ..."] + lines[-max_lines // 2:]
  return "\n".join(lines)


def _arg_text(a: Any) -> str:
  """An arg as exact text for hashing: UOps inside it by their own structure key, floats by repr (-0.0, nan)."""
  if isinstance(a, UOp): return f"UOp:{structure_key(a)}"
  if isinstance(a, tuple): return "(" + ",".join(_arg_text(x) for x in a) + ")"
  return f"{type(a).__name__}:{a!r}"


def structure_key(root: UOp) -> str:
  """A content hash (sha256, hex) of the whole graph under `root`: every node's op, dtype, arg, tag and sources, in
  structure (not a printout, which cuts big graphs in the middle). Equal graphs have equal keys; graphs that differ
  anywhere differ in key (up to sha256 collisions). Computed on each call, linear in the graph."""
  digest: dict[UOp, bytes] = {}
  for n in root.toposort():
    h = hashlib.sha256(f"{n.op.name}|{n.dtype!r}|{_arg_text(n.arg)}|{_arg_text(n.tag)}|{len(n.src)}".encode())
    for s in n.src: h.update(digest[s])
    digest[n] = h.digest()
  return digest[root].hex()


def print_uops(uops: Sequence[UOp]) -> str:
  """A linear program, one line per UOp."""
  ids = {u: i for i, u in enumerate(uops)}
  return "\n".join(f"{i:4d} {u.op.name:14s} {u.dtype!r:30s} {[ids.get(s, '-') for s in u.src]!s:20s} {u.arg!r}"
                   for i, u in enumerate(uops))


def all_nodes(roots: Sequence[UOp]) -> Iterator[UOp]:
  return iter(UOp(Ops.SINK, src=tuple(roots)).toposort())


_ = (math, AddrSpace, truncate_int)  # re-exported for convenience
