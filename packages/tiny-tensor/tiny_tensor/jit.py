"""TinyJit: capture the kernels a function runs once, then replay them with new inputs and no Python scheduling.

>>> from tiny_tensor import Tensor, TinyJit
>>> @TinyJit
... def step(x: Tensor) -> Tensor: return (x * 2 + 1).realize()
>>> for i in range(4): out = step(Tensor([float(i)] * 3))  # call 1 runs, call 2 captures, calls 3+ replay
>>> out.tolist()
[7.0, 7.0, 7.0]

How it works (docs/ARCHITECTURE.md §5, step 7):
- call 1 runs the function eagerly (kernels compile, lazily created weights realize);
- call 2 runs it again while recording every CALL the engine executes: for a kernel its loaded program, the device
  buffers in argument order, launch sizes and symbolic variable names; for a COPY the two buffers; for a SLICE of an
  input the view it made. Buffers are recorded as objects, so intermediates stay allocated for the replays;
  after the capture `plan_memory` places intermediates whose lifetimes don't overlap in shared storage, each in the
  storage freed last (still in cache), and the rest is freed;
- later calls check that the inputs look the same (shape, dtype, device, which arguments are Tensors), swap the new
  inputs' device buffers into the recorded argument lists, and call the programs in order. On a device with a graph
  class (`Compiled.graph`: `HCQ2Graph` on AMD, NV and QCOM, `CPUGraph` on the CPU; PIPELINE.md §7, §9), each run of
  consecutive kernels is handed to it once after the capture; a replay calls the graph with the new input buffers and
  variable values, and it patches what changed in its prebuilt command buffers (the CPU: argument blocks) and submits
  them in one call (`JIT=2`: kernel by kernel instead).

Capture uses the engine's hook (`engine.capture(on_call, on_host_read)`, see `engine.CapturedCall`): `_EngineCapture`
turns each reported call into a replayable one and refuses host reads of device data.

What is detected (JitError), because a replay could not reproduce it:
- an input Tensor's shape, dtype or device, or the set/names of Tensor arguments, differ from the capture;
- a plain Python argument (int, float, bool, str, None, or tuples of them) differs from the capture: its value was
  baked into the kernels (use a Tensor or a bound `Variable` instead); a numpy array argument is refused outright;
- the function reads tensor data into Python while capturing (`.numpy()`, `.item()`, `.tolist()`): the value read
  would be stale on replay;
- the return value holds something other than Tensors (in tuples, lists, dicts) or None: it would be stale;
- a returned Tensor is a view of an input: the replay could not return a view of the new input (an input argument
  itself may be returned: a replay returns that call's argument, e.g. after `x[1] = v; return x`);
- the same buffer is passed as two inputs; the function ran no kernel at all; a TinyJit captures or replays inside
  another's capture (an inner jit still on its eager first call just runs, and is captured as part of the outer).
Not detected: other Python side effects (appending to a list, printing, mutating globals) run only on calls 1-2.

`JIT=0` (`Context(JIT=0)`) runs the function eagerly on every call. `jit.reset()` forgets the capture. A captured
jit pickles: its programs travel as binaries and its buffers (weights included) with their contents.

Threads: a TinyJit keeps its state (call count, capture, last inputs) per thread, so each thread that calls a shared
jit runs, captures and replays its own copy (its own intermediate and output buffers: one thread's replay never
overwrites what another's returned). What a capture records is only what its own thread runs. Buffers the function
updates in place (weights, optimizer state) are shared by the copies, as they are by the eager function. An
unpickled jit hands its one capture to every thread (their replays share its outputs). The per-thread state lives in
a `threading.local`, not in a table keyed by `threading.get_ident()`: an ident is reused by a later thread once its
thread ends, and that thread must start afresh rather than replay into the outputs the ended thread returned. A
thread's state is released when the thread ends (a server that runs each request in a new thread keeps no state for
finished ones); what the thread returned stays valid as long as it is referenced.
"""
from __future__ import annotations

from dataclasses import dataclass
import functools
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from tiny_uop import trace as _trace
from tiny_uop.device import Buffer
from tiny_uop.helpers import DEBUG, JIT, unwrap
from tiny_uop.uop import Ops, UOp

from tiny_tensor import engine
from tiny_tensor.engine import GlobalCounters
from tiny_tensor.live import _capturing

if TYPE_CHECKING:  # tensor.py imports this module: Tensor is looked up when first needed (_tensor_cls)
  from tiny_tensor.tensor import Tensor

__all__ = ["TinyJit", "JitError", "CapturedJit", "prune_calls"]

ReturnType = TypeVar("ReturnType")
_SIMPLE = (int, float, bool, str, type(None), bytes)



class JitError(Exception):
  """A TinyJit call that can't be captured or replayed faithfully (the message says what changed and how to fix it)."""


# ***** what a capture records *****
# a buffer reference is a `Buffer` (static: the same memory on every replay) or an int (dynamic slot: the i-th input,
# or a view made from one during the capture, re-made on every replay)
BufRef = Any


def _resolve_dim(d: Any, var_vals: dict[str, int]) -> int:
  return d if isinstance(d, int) else int(d.sym_infer(var_vals))


class _KernelCall:
  """One kernel launch: program, argument list (static opaque handles + dynamic slots to patch), sizes, variables.

  It is also what a device graph receives per kernel (the contract of `Compiled.graph`, docs/PIPELINE.md §7):
  `prg`, `bufs` (opaque buffer, or int: index into the replay's inputs), `vars` ((name, capture value) per program
  value), `global_size`, `local_size`, `static_launch`, `launch(var_vals)`.
  """
  __slots__ = ("prg", "name", "device", "refs", "args", "dyn", "global_size", "local_size", "vars", "ops", "mem",
               "static_launch", "bufs", "rw")

  def __init__(self, prg: Any, name: str, device: str, refs: list[BufRef], global_size: Any, local_size: Any,
               var_names: list[str], bound: dict[str, int], ops: int, mem: int):
    self.prg, self.name, self.device, self.refs = prg, name, device, refs
    self.global_size, self.local_size = tuple(global_size) if global_size is not None else (1, 1, 1), \
      (tuple(local_size) if local_size is not None else None)
    # (name, value at capture): a variable not passed to the jit keeps its capture-time value
    self.vars = tuple((n, bound[n]) for n in var_names)
    self.ops, self.mem = ops, mem
    self.static_launch = all(isinstance(d, int) for d in self.global_size + (self.local_size or ()))
    self.args = [r._buf if isinstance(r, Buffer) else None for r in refs]
    self.dyn = tuple((i, r) for i, r in enumerate(refs) if not isinstance(r, Buffer))
    self.bufs = [r if a is None else a for r, a in zip(refs, self.args)]
    # (read positions, written positions) in `refs`, for TinyJit(prune=True); None: unknown (never pruned)
    self.rw: tuple[tuple[int, ...], tuple[int, ...]] | None = None

  def launch(self, var_vals: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(global_size, local_size) with symbolic sizes resolved (a variable not given keeps its capture value)."""
    if self.static_launch: return self.global_size, self.local_size
    vv = {**dict(self.vars), **var_vals}
    gs = tuple(_resolve_dim(d, vv) for d in self.global_size)
    return gs, (tuple(_resolve_dim(d, vv) for d in self.local_size) if self.local_size is not None else None)

  def run(self, dyn: list[Buffer], var_vals: dict[str, int]) -> None:
    args = self.args
    if self.dyn:
      args = args.copy()
      for i, slot in self.dyn: args[i] = dyn[slot]._buf
    vals = tuple(var_vals.get(n, v) for n, v in self.vars) if self.vars else ()
    gs, ls = (self.global_size, self.local_size) if self.static_launch else self.launch(var_vals)
    self.prg(*args, global_size=gs, local_size=ls, vals=vals, wait=False)


class _GraphCall:
  """Consecutive kernels on one device replayed as one device graph (`Device[device].graph`), built once."""
  __slots__ = ("device", "kernels", "graph")

  def __init__(self, device: str, graph_cls: Any, kernels: list[_KernelCall]):
    from tiny_uop.plugins import Device
    self.device, self.kernels = device, kernels
    self.graph = graph_cls(Device[device], kernels)

  def run(self, dyn: list[Buffer], var_vals: dict[str, int]) -> None:
    self.graph([b._buf for b in dyn], var_vals)


class _CopyCall:
  """A COPY between buffers (e.g. an input moved to another device)."""
  __slots__ = ("dst", "src")

  def __init__(self, dst: BufRef, src: BufRef): self.dst, self.src = dst, src

  def run(self, dyn: list[Buffer], var_vals: dict[str, int]) -> None:
    dst = self.dst if isinstance(self.dst, Buffer) else dyn[self.dst]
    src = self.src if isinstance(self.src, Buffer) else dyn[self.src]
    engine.copy_buffer(dst, src)


class _SliceCall:
  """A zero-copy view of a dynamic buffer, re-made on every replay into dynamic slot `out`."""
  __slots__ = ("out", "src", "size", "dtype", "offset")

  def __init__(self, out: int, src: int, size: int, dtype: Any, offset: int):
    self.out, self.src, self.size, self.dtype, self.offset = out, src, size, dtype, offset

  def run(self, dyn: list[Buffer], var_vals: dict[str, int]) -> None:
    v = dyn[self.src].view(self.size, self.dtype, self.offset)
    if len(dyn) <= self.out: dyn.extend([None] * (self.out + 1 - len(dyn)))  # type: ignore[list-item]
    dyn[self.out] = v


def _buffer_of(u: UOp) -> Buffer | None:
  bv = engine.buffer_view(u)
  return engine.get_buffer(bv[0]) if bv is not None else None


class _EngineCapture:
  """Records what the engine runs while a function is captured, via `engine.capture` (see the module doc)."""

  def __init__(self, inputs: list[Buffer], var_vals: dict[str, int]):
    self.slots: dict[int, int] = {id(b): i for i, b in enumerate(inputs)}
    self.dyn_bufs: list[Buffer] = list(inputs)
    self.calls: list[Any] = []
    self.var_vals = var_vals

  def ref(self, b: Buffer) -> BufRef:
    s = self.slots.get(id(b))
    return s if s is not None else b

  def on_call(self, c: engine.CapturedCall) -> None:
    if c.kind == "kernel":
      spec = c.spec
      bound = {n: self.var_vals.get(n, v) for n, v in c.var_vals.items()}
      names = [v.arg[0] for v in spec.vars]
      kc = _KernelCall(c.prg, spec.name, c.device, [self.ref(b) for b in c.bufs], c.global_size, c.local_size,
                       names, {n: bound[n] for n in names}, c.ops, c.mem)
      slots = list(getattr(spec, "globals", None) or [])
      if len(slots) == len(c.bufs):  # argument i is PARAM slots[i]; the spec names the slots loaded and stored
        ins, outs = set(getattr(spec, "ins", ())), set(getattr(spec, "outs", ()))
        kc.rw = (tuple(i for i, sl in enumerate(slots) if sl in ins),
                 tuple(i for i, sl in enumerate(slots) if sl in outs))
      self.calls.append(kc)
    elif c.kind == "copy":
      dst, src = c.bufs
      if isinstance(self.ref(dst), int):
        raise JitError("the captured function copies into one of its inputs; assign to a non-input tensor instead")
      self.calls.append(_CopyCall(dst, self.ref(src)))
    elif c.kind == "slice":
      view, base = c.bufs
      if isinstance(s := self.ref(base), int):
        out = self.slots[id(view)] = len(self.dyn_bufs)
        self.dyn_bufs.append(view)
        self.calls.append(_SliceCall(out, s, view.size, view.dtype, c.offset))
    else: raise JitError(f"TinyJit can't capture an engine call of kind {c.kind!r} (valid: kernel, copy, slice)")

  @staticmethod
  def on_host_read(buf: Buffer) -> None:
    raise JitError("the function reads tensor data into Python (.numpy()/.item()/.tolist()) while TinyJit captures "
                   f"it ({buf!r}); that value would be stale on replay: return the Tensor instead, or run "
                   "this function without TinyJit")


def _buf_key(r: BufRef) -> tuple[str, int]:
  """What a reference aliases: an input slot, or a buffer's base allocation (views of one base alias each other)."""
  if not isinstance(r, Buffer): return ("dyn", r)
  return ("buf", id(r._base if r._base is not None else r))


def _reads_writes(c: Any) -> tuple[set, set] | None:
  """The buffers a recorded call reads and writes (as `_buf_key`s), None where unknown."""
  if isinstance(c, _CopyCall): return {_buf_key(c.src)}, {_buf_key(c.dst)}
  if isinstance(c, _KernelCall) and c.rw is not None:
    return {_buf_key(c.refs[i]) for i in c.rw[0]}, {_buf_key(c.refs[i]) for i in c.rw[1]}
  return None


def prune_calls(calls: list[Any]) -> list[Any]:
  """The calls a replay must run (TinyJit(prune=True)); the others already ran at capture and would recompute the same.

  A call is kept when it reads or writes an input (or a view of one), uses a symbolic variable (a bound Variable
  may change per call), reads a buffer it also writes (state updated in place, like `counter.assign(counter + 1)`),
  reads or writes a buffer a kept call writes, or when what it touches is unknown. The rest (weights' transforms,
  independent copies) depend only on buffers no replay changes: their outputs keep the values computed at capture,
  and buffers only they used are freed with them.
  """
  rws = [_reads_writes(c) for c in calls]
  keep = [isinstance(c, _SliceCall) or rw is None or bool(rw[0] & rw[1]) or
          any(k[0] == "dyn" for k in rw[0] | rw[1]) or bool(getattr(c, "vars", ())) for c, rw in zip(calls, rws)]
  changed = True
  while changed:  # a fixed point: what a kept call writes makes its readers (and other writers) kept
    changed = False
    kept_writes = set().union(*(rw[1] for rw, k in zip(rws, keep) if k and rw is not None))
    for i, rw in enumerate(rws):
      if not keep[i] and rw is not None and (rw[0] & kept_writes or rw[1] & kept_writes):
        keep[i] = changed = True
  return [c for c, k in zip(calls, keep) if k]


def _held_buffers() -> set[int]:
  """ids of the Buffers some live BUFFER node still refers to (a live Tensor, a returned value, a remembered graph):
  the memory planner must not share those."""
  held: set[int] = set()
  for ref in list(UOp.__class__.ucache.values()):  # type: ignore[attr-defined]
    if (u := ref()) is not None and u.op is Ops.BUFFER and (b := u._cache.get("buffer")) is not None: held.add(id(b))
  return held


def plan_memory(calls: list[Any]) -> list[Any]:
  """The calls with their intermediates placed in shared storage where their lifetimes don't overlap (tinygrad's JIT
  memory planning): the capture's working set is freed, and a replay writes each kernel's output into memory it
  touched last (still in cache), not into memory untouched since the previous replay (issue #39).

  An intermediate is a whole (not a view, not viewed) buffer that no live node refers to after the capture, that is
  not an input, and whose first use in the calls is a kernel's write (it holds nothing from before the call); it
  lives from that write to its last use (a later write may be partial: an assign to a slice, so the range is never
  split). Intermediates are placed in order of their first use, each into the free storage (same device, dtype and
  allocation options, at least its size; a larger one only where the allocator makes views, `_offset`) that was
  freed last, the smallest of those on a tie, or into its own buffer when none is free. A storage is free after the
  last use of the intermediate placed in it, so a kernel's output never shares memory with what it reads.
  """
  first: dict[int, int] = {}
  last: dict[int, int] = {}
  bufs: dict[int, Buffer] = {}
  excluded: set[int] = set()
  for i, c in enumerate(calls):
    refs = list(c.refs) if isinstance(c, _KernelCall) else [c.dst, c.src] if isinstance(c, _CopyCall) else []
    rw = c.rw if isinstance(c, _KernelCall) else None
    for pos, r in enumerate(refs):
      if not isinstance(r, Buffer): continue
      if r._base is not None:  # a view and its base are never planned
        excluded.update((id(r), id(r._base)))
        continue
      k = id(r)
      bufs[k] = r
      if k not in first:
        if not (rw is not None and pos in rw[1] and not any(refs[p] is r for p in rw[0])): excluded.add(k)
        first[k] = i
      last[k] = i
  held = _held_buffers()
  free: list[tuple[int, Buffer]] = []  # (last use, storage)
  remap: dict[int, Buffer] = {}
  for k in sorted((k for k in first if k not in excluded and k not in held), key=lambda k: first[k]):
    b = bufs[k]
    views = hasattr(b.allocator, "_offset")
    fits = [j for j, (end, st) in enumerate(free) if end < first[k] and st.device == b.device and st.dtype == b.dtype
            and st.options == b.options and (st.nbytes == b.nbytes or (views and st.nbytes > b.nbytes))]
    if not fits:
      free.append((last[k], b))
      continue
    j = min(fits, key=lambda j: (-free[j][0], free[j][1].nbytes))
    st = free[j][1]
    remap[k] = st if st.size == b.size else st.view(b.size, b.dtype, 0)
    free[j] = (last[k], st)
  if not remap: return calls

  def m(r: BufRef) -> BufRef: return remap.get(id(r), r) if isinstance(r, Buffer) else r
  out: list[Any] = []
  for c in calls:
    if isinstance(c, _KernelCall):
      nc = _KernelCall(c.prg, c.name, c.device, [m(r) for r in c.refs], c.global_size, c.local_size,
                       [n for n, _ in c.vars], dict(c.vars), c.ops, c.mem)
      nc.rw = c.rw
      out.append(nc)
    elif isinstance(c, _CopyCall): out.append(_CopyCall(m(c.dst), m(c.src)))
    else: out.append(c)
  return out


# ***** inputs *****
_TENSOR: list[type[Tensor]] = []


def _tensor_cls() -> type[Tensor]:
  if not _TENSOR:
    from tiny_tensor.tensor import Tensor
    _TENSOR.append(Tensor)
  return _TENSOR[0]


def _unbind_shape(shape: tuple, var_vals: dict[str, int]) -> tuple:
  """The shape with bound Variables replaced by their DEFINE_VAR (their values go to `var_vals`)."""
  out = []
  for d in shape:
    if isinstance(d, UOp):
      binds = [u for u in d.toposort() if u.op is Ops.BIND]
      for b in binds:
        v, val = b.unbind()
        var_vals[v.arg[0]] = val
      d = d.substitute({b: b.src[0] for b in binds}) if binds else d
    out.append(d)
  return tuple(out)


def _is_plain(a: Any) -> bool:
  return isinstance(a, _SIMPLE) or (isinstance(a, tuple) and all(isinstance(y, _SIMPLE) for y in a))


def _prepare(args: tuple, kwargs: dict) -> tuple[list[Buffer], list, list, dict[str, int], list]:
  """(input buffers, names, per-input (shape, dtype, device), variable values, plain-Python argument values).

  Tensors are found among the arguments and, shallowly, inside list/tuple/dict arguments (a model passed as an
  argument isn't searched: its tensors are part of the captured graph, not inputs). This runs on every replay: keep
  it lean.
  """
  Tensor = _TENSOR[0] if _TENSOR else _tensor_cls()
  named: list[tuple[Any, Any]] = list(enumerate(args))
  if kwargs: named += sorted(kwargs.items())
  tensors: list[Any] = []
  names: list[Any] = []
  plain: list[Any] = []
  var_vals: dict[str, int] = {}
  containers = []
  for name, a in named:
    if isinstance(a, Tensor): tensors.append(a); names.append(name)
    elif isinstance(a, UOp):
      if a.op is not Ops.BIND:
        raise JitError(f"TinyJit argument {name!r} is an unbound UOp {a}; pass a bound Variable "
                       "(Variable(...).bind(n))")
      v, val = a.unbind()
      var_vals[v.arg[0]] = val
      names.append((name, "var", v.arg[0]))
    elif _is_plain(a): plain.append((name, a))
    elif isinstance(a, (list, tuple, dict)): containers.append((name, a))
    elif type(a).__name__ == "ndarray" and type(a).__module__ == "numpy":
      raise JitError(f"TinyJit argument {name!r} is a numpy array: its values would be baked into the captured "
                     "kernels; pass a Tensor instead")
  for name, a in containers:
    for t in (a.values() if isinstance(a, dict) else a):
      if isinstance(t, Tensor) and not any(t is y for y in tensors): tensors.append(t); names.append((name, "item"))
  bufs: list[Buffer] = []
  info = []
  unrealized = [t for t in tensors if not all(map(engine.is_realized, _parts(t.uop)))]
  if unrealized: Tensor.realize(*unrealized)
  for t in tensors:
    # an input is a leaf of the captured function: autograd must not look through it into the graph it was realized
    # from (e.g. a sharded input's shrinks and copies of the first call's data), which a replay would not see
    if t._origin is not None: t._origin = None
    # a multi-device tensor is one input per shard (in device order); its layout (split axis) must stay the same
    for part in _parts(t.uop):
      bv = engine.buffer_view(part)
      b = engine.get_buffer(bv[0]) if bv is not None else None
      if b is None and part is t.uop: b = _buffer_of(t.contiguous().realize().uop)  # a lazy view: read a copy
      if b is None: raise JitError(f"TinyJit input {t} could not be realized into a buffer")
      bufs.append(b if b._opaque is not None else b.ensure_allocated())
    shape = t.uop.shape
    layout = t.uop.arg if t.uop.op is Ops.MULTI else "single"
    info.append((shape if all(type(d) is int for d in shape) else _unbind_shape(shape, var_vals), t.dtype, t.device,
                 layout))
  if len(bufs) > 1 and len({(id(b.base), b.offset) for b in bufs}) != len(bufs):
    raise JitError("the same tensor buffer is passed to TinyJit twice; pass it once (or .clone() one of them)")
  return bufs, names, info, var_vals, plain


def _parts(u: UOp) -> tuple[UOp, ...]:
  """The per-device graphs of a tensor's UOp: a MULTI's shards, else the UOp itself."""
  return u.src if u.op is Ops.MULTI else (u,)


def _ret_tensors(ret: Any) -> list[Any]:
  Tensor = _tensor_cls()
  out: list[Any] = []
  todo = [ret]
  while todo:
    x = todo.pop()
    if isinstance(x, Tensor): out.append(x)
    elif isinstance(x, (tuple, list)): todo.extend(x)
    elif isinstance(x, dict): todo.extend(x.values())
  return out


def _check_ret(ret: Any, path: str = "return value") -> None:
  Tensor = _tensor_cls()
  if ret is None or isinstance(ret, Tensor): return
  if isinstance(ret, (tuple, list)):
    for i, x in enumerate(ret): _check_ret(x, f"{path}[{i}]")
    return
  if isinstance(ret, dict):
    for k, x in ret.items(): _check_ret(x, f"{path}[{k!r}]")
    return
  raise JitError(f"TinyJit function's {path} is a {type(ret).__name__} ({ret!r:.60}), not a Tensor: a replay runs no "
                 "Python, so it would be stale; return a Tensor (and call .item() outside the jitted function)")


def _describe_change(names: list, info: list, new_names: list, new_info: list) -> str:
  if names != new_names:
    return f"the Tensor/Variable arguments changed: captured {names}, now {new_names}"
  for n, (a, b) in zip(names, zip(info, new_info)):
    if a != b:
      what = "shape" if a[0] != b[0] else "dtype" if a[1] != b[1] else "device" if a[2] != b[2] else "sharding axis"
      i = {"shape": 0, "dtype": 1, "device": 2, "sharding axis": 3}[what]
      return f"input {n!r} changed {what}: captured {a[i]}, now {b[i]}"
  return "inputs changed"


# ***** the captured graph *****
@dataclass(frozen=True)
class _RetArg:
  """In a captured return value: the input argument at this position (int) or keyword (str), returned as it is (a
  replay returns that call's argument)."""
  key: Any


def _ret_leaves(ret: Any) -> list[Any]:
  """The leaves of a return value (what is not a tuple, list or dict)."""
  out, todo = [], [ret]
  while todo:
    x = todo.pop()
    if isinstance(x, (tuple, list)): todo.extend(x)
    elif isinstance(x, dict): todo.extend(x.values())
    else: out.append(x)
  return out


def _ret_template(ret: Any, args: dict[int, _RetArg]) -> Any:
  """`ret` with the Tensors whose ids are in `args` replaced by their `_RetArg`."""
  if not args: return ret
  if isinstance(ret, (tuple, list)): return type(ret)(_ret_template(x, args) for x in ret)
  if isinstance(ret, dict): return {k: _ret_template(x, args) for k, x in ret.items()}
  return args.get(id(ret), ret)


class CapturedJit(Generic[ReturnType]):
  """The replayable result of a capture: the calls, the return value (Tensors the replays overwrite), input checks."""

  def __init__(self, calls: list[Any], ret: Any, names: list, info: list, plain: list, n_inputs: int):
    self.calls, self.ret, self.names, self.info, self.plain, self.n_inputs = calls, ret, names, info, plain, n_inputs
    self.has_ret_args = any(isinstance(x, _RetArg) for x in _ret_leaves(ret))
    self.kernel_count = sum(isinstance(c, _KernelCall) for c in calls)
    self.ops = sum(c.ops for c in calls if isinstance(c, _KernelCall))
    self.mem = sum(c.mem for c in calls if isinstance(c, _KernelCall))
    self.plan = self._plan(calls)

  @staticmethod
  def _plan(calls: list[Any]) -> list[Any]:
    """What a replay runs: the SLICEs first (they only make views of inputs), then the calls in order, with each run
    of consecutive kernels on a device that has a graph class (`Compiled.graph`) batched into one `_GraphCall`.
    `JIT=2` replays kernel by kernel."""
    plan: list[Any] = [c for c in calls if isinstance(c, _SliceCall)]
    if JIT.value >= 2: return plan + [c for c in calls if not isinstance(c, _SliceCall)]
    from tiny_uop.plugins import Device
    batch: list[_KernelCall] = []
    batch_cls: Any = None

    def flush() -> None:
      if batch: plan.append(_GraphCall(batch[0].device, batch_cls, batch.copy()))
      batch.clear()
    for c in calls:
      if isinstance(c, _SliceCall): continue
      graph_cls = getattr(Device[c.device], "graph", None) if isinstance(c, _KernelCall) else None
      if graph_cls is not None and getattr(graph_cls, "supports", lambda d, k: True)(Device[c.device], c):
        if batch and batch[0].device != c.device: flush()
        batch.append(c)
        batch_cls = graph_cls
      else:
        flush()
        plan.append(c)
    flush()
    return plan

  def __call__(self, inputs: list[Buffer], var_vals: dict[str, int]) -> ReturnType:
    dyn = list(inputs)
    with engine.lock:  # the devices' queues: one thread at a time (see tiny_tensor.engine)
      if DEBUG >= 2:
        for c in self.plan:
          c.run(dyn, var_vals)
          if isinstance(c, _KernelCall): print(f"*** JIT {c.device:8s} {c.name}")
          if isinstance(c, _GraphCall): print(f"*** JIT {c.device:8s} graph of {len(c.kernels)} kernels")
      elif _trace.RECORDER is not None: self._run_recorded(dyn, var_vals)  # VIZ: each launch, timed
      else:
        for c in self.plan: c.run(dyn, var_vals)
    GlobalCounters.kernel_count += self.kernel_count
    GlobalCounters.global_ops += self.ops
    GlobalCounters.global_mem += self.mem
    return self.ret

  def returned(self, ret: Any, args: tuple, kwargs: dict) -> Any:
    """`ret` (the captured return value) with each returned input argument (`_RetArg`) this call's argument."""
    if not self.has_ret_args: return ret
    if isinstance(ret, _RetArg): return args[ret.key] if isinstance(ret.key, int) else kwargs[ret.key]
    if isinstance(ret, (tuple, list)): return type(ret)(self.returned(x, args, kwargs) for x in ret)
    if isinstance(ret, dict): return {k: self.returned(x, args, kwargs) for k, x in ret.items()}
    return ret

  def _run_recorded(self, dyn: list[Buffer], var_vals: dict[str, int], plan: list[Any] | None = None) -> None:
    """Run `plan` (default: the replay's) with each launch timed into VIZ's recorder. A graph whose class sets
    `viz_per_kernel` (it can't time its kernels itself, e.g. `CPUGraph`) runs its kernels one by one instead."""
    for c in self.plan if plan is None else plan:
      if isinstance(c, _GraphCall) and getattr(c.graph, "viz_per_kernel", False):
        self._run_recorded(dyn, var_vals, c.kernels)  # one level: a graph's kernels are _KernelCalls
        continue
      st = time.perf_counter()
      c.run(dyn, var_vals)
      rec, t = _trace.RECORDER, time.perf_counter() - st
      if rec is None: continue
      if isinstance(c, _KernelCall): rec.launch(c.device, c.name, st, t)
      elif isinstance(c, _GraphCall): rec.launch(c.device, f"graph of {len(c.kernels)} kernel(s)", st, t)

  # pickling: programs as (device, name, lib), buffers with their contents, returned Tensors as buffer references
  def __getstate__(self) -> dict:
    Tensor = _tensor_cls()
    table: dict[int, int] = {}
    bufs: list[tuple] = []

    def bref(r: BufRef) -> tuple:
      if not isinstance(r, Buffer): return ("dyn", r)
      if id(r) not in table:
        base = bref(r._base)[1] if r._base is not None else None
        data = bytes(r.as_buffer()) if base is None and r.is_allocated else None
        table[id(r)] = len(bufs)
        bufs.append((r.device, r.size, r.dtype, r.offset, base, data))
      return ("buf", table[id(r)])

    def calls_state(c: Any) -> tuple:
      if isinstance(c, _KernelCall):
        return ("kernel", c.device, c.name, c.prg.lib, [bref(r) for r in c.refs], c.global_size, c.local_size,
                c.vars, c.ops, c.mem, int(getattr(c.prg, "cost", 0) or 0))
      if isinstance(c, _CopyCall): return ("copy", bref(c.dst), bref(c.src))
      return ("slice", c.out, c.src, c.size, c.dtype, c.offset)

    def ret_state(x: Any) -> Any:
      if isinstance(x, _RetArg): return ("arg", x.key)
      if isinstance(x, Tensor) and x.uop.op is Ops.MULTI:
        return ("multi", [(bref(_buffer_of(p)), tuple(unwrap(p.shape))) for p in x.uop.src], x.uop.arg)
      if isinstance(x, Tensor):
        b = _buffer_of(x.uop)
        return ("tensor", bref(b), tuple(x.shape))
      if isinstance(x, (tuple, list)): return (type(x).__name__, [ret_state(y) for y in x])
      if isinstance(x, dict): return ("dict", {k: ret_state(y) for k, y in x.items()})
      return ("value", x)

    calls = [calls_state(c) for c in self.calls]
    ret = ret_state(self.ret)
    return {"bufs": bufs, "calls": calls, "ret": ret, "names": self.names, "info": self.info, "plain": self.plain,
            "n_inputs": self.n_inputs}

  def __setstate__(self, st: dict) -> None:
    from tiny_uop.plugins import Device
    Tensor = _tensor_cls()
    bufs: list[Buffer] = []
    for device, size, dtype, offset, base, data in st["bufs"]:
      if base is not None: b = bufs[base].view(size, dtype, offset - bufs[base].offset)
      else:
        b = Buffer(device, size, dtype).ensure_allocated()
        if data is not None and size: b.copyin(memoryview(bytearray(data)))
      bufs.append(b)
    for b in bufs: b.ensure_allocated()

    def r(x: tuple) -> BufRef: return bufs[x[1]] if x[0] == "buf" else x[1]
    calls: list[Any] = []
    for c in st["calls"]:
      if c[0] == "kernel":
        _, device, name, lib, refs, gs, ls, vars_, ops, mem, *cost = c  # cost: the program's, for its launch path
        prg = Device[device].get_program(name, lib, cost=cost[0]) if cost and cost[0] else \
          Device[device].get_program(name, lib)
        calls.append(_KernelCall(prg, name, device, [r(x) for x in refs], gs, ls, [n for n, _ in vars_], dict(vars_),
                                 ops, mem))
      elif c[0] == "copy": calls.append(_CopyCall(r(c[1]), r(c[2])))
      else: calls.append(_SliceCall(*c[1:]))

    def ret_load(x: Any) -> Any:
      kind, v = x[0], x[1]
      if kind == "arg": return _RetArg(v)
      if kind == "tensor": return _tensor_from_buffer(Tensor, r(v), x[2])
      if kind == "multi":
        parts = tuple(_tensor_from_buffer(Tensor, r(b), shape).uop for b, shape in v)
        return Tensor(UOp(Ops.MULTI, parts[0].dtype, parts, x[2]))
      if kind in ("tuple", "list"): return (tuple if kind == "tuple" else list)(ret_load(y) for y in v)
      if kind == "dict": return {k: ret_load(y) for k, y in v.items()}
      return v
    ret = ret_load(st["ret"])
    self.__init__(calls, ret, st["names"], st["info"], st["plain"], st["n_inputs"])  # type: ignore[misc]


def _tensor_from_buffer(Tensor: type, buf: Buffer, shape: tuple) -> Any:
  """A Tensor backed by an existing `Buffer` (registers it in the engine's BUFFER-UOp registry)."""
  u = engine.register_buffer(UOp.new_buffer(buf.device, buf.size, buf.dtype), buf)
  return Tensor(u.reshape(shape) if tuple(shape) != (buf.size,) else u)


class _JitState:
  """One thread's view of a TinyJit: how many times it was called, its capture, its last replay's inputs."""
  __slots__ = ("cnt", "captured", "last", "gen", "__weakref__")

  def __init__(self, captured: CapturedJit | None, gen: int):
    self.cnt, self.captured = (0 if captured is None else 2), captured
    # the last replay's input UOps, their buffers and the Variables' values their shapes bind
    self.last: tuple[tuple[UOp, ...], list[Buffer], dict[str, int]] | None = None
    self.gen = gen  # the TinyJit's reset generation it was made in (a reset makes every thread's state stale)


class _ThreadStates(threading.local):
  """Per-thread slot for one TinyJit's `_JitState`; CPython drops a thread's slot when the thread ends."""
  state: _JitState | None = None


class TinyJit(Generic[ReturnType]):
  """Compile a function of Tensors once and replay its kernels afterwards (see the module documentation).

  Use as a decorator (`@TinyJit`) or call `TinyJit(fxn)`; methods work too (`__get__`). Call 1 runs eagerly, call 2
  captures, calls 3+ replay. The returned Tensors are the same objects on every replay, overwritten in place.

  `prune=True` (`@TinyJit(prune=True)` or `TinyJit(fxn, prune=True)`, as in tinygrad) drops from the replays the
  kernels and copies that depend on no input (`prune_calls`): they ran once at capture, their outputs keep those
  values and the buffers only they used are freed. Only for functions whose other reads don't change between calls
  (a weight updated outside the jit would be read stale by a pruned kernel).
  """

  def __new__(cls, fxn: Callable[..., ReturnType] | None = None, captured: CapturedJit | None = None,
              prune: bool = False) -> Any:
    if fxn is None and captured is None:  # `@TinyJit(prune=True)`: a decorator that makes the TinyJit
      return functools.partial(cls, captured=None, prune=prune)
    return super().__new__(cls)

  def __init__(self, fxn: Callable[..., ReturnType] | None = None, captured: CapturedJit | None = None,
               prune: bool = False):
    if fxn is None and captured is None: raise TypeError("TinyJit needs a function (or a CapturedJit)")
    if not isinstance(prune, bool): raise TypeError(f"TinyJit(prune=...) takes a bool, got {prune!r}")
    self.fxn, self._template, self.prune = fxn, captured, prune
    # each thread's state, in a threading.local (an ident can be reused by a later thread; a Thread object can outlive
    # its thread); `_live` sees them weakly, for `thread_states()`; `_gen` counts resets
    self._local = _ThreadStates()
    self._live: weakref.WeakSet[_JitState] = weakref.WeakSet()
    self._gen = 0
    if fxn is not None: functools.update_wrapper(self, fxn)

  def _state(self) -> _JitState:
    """This thread's state (made on its first call, and again on the first call after a `reset()`)."""
    if (st := self._local.state) is None or st.gen != self._gen:
      st = self._local.state = _JitState(self._template, self._gen)
      self._live.add(st)
    return st

  def thread_states(self) -> int:
    """How many threads' states this jit holds now (a thread's state is released when the thread ends)."""
    return sum(st.gen == self._gen for st in list(self._live))

  # the calling thread's state, as attributes
  cnt = property(lambda self: self._state().cnt, lambda self, v: setattr(self._state(), "cnt", v))
  captured = property(lambda self: self._state().captured, lambda self, v: setattr(self._state(), "captured", v))
  _last = property(lambda self: self._state().last, lambda self, v: setattr(self._state(), "last", v))

  def reset(self) -> None:
    """Forget the capture (every thread's): the next call runs eagerly again, the one after captures."""
    if self.fxn is None: raise JitError("this TinyJit was unpickled without its function; it can't be reset")
    self._gen += 1  # every thread's state is now stale: its next call makes a fresh one

  def __reduce__(self) -> Any:
    if self.captured is None: raise JitError("can't pickle a TinyJit before it captured (call it twice first)")
    return (TinyJit, (None, self.captured, self.prune))

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    return self if obj is None else functools.partial(self.__call__, obj)

  def _eager(self, args: tuple, kwargs: dict) -> ReturnType:
    if self.fxn is None: raise JitError("this TinyJit has no function to run eagerly (it was unpickled)")
    ret = self.fxn(*args, **kwargs)
    if (ts := [t for t in _ret_tensors(ret)]): _tensor_cls().realize(*ts)
    return ret

  def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
    # fast path of a replay with the very same input tensors as the last replay (same UOps, so the same buffers,
    # shapes, dtypes and devices): skip re-deriving and re-checking them
    st = self._state()
    if (last := st.last) is not None and not kwargs and not _capturing.jits and JIT.value and \
       len(args) == len(last[0]) and all(type(a) is _TENSOR[0] and a.uop is u for a, u in zip(args, last[0])):
      st.cnt += 1
      return st.captured.returned(st.captured(last[1], last[2]), args, kwargs)  # type: ignore[union-attr,misc]
    inputs, names, info, var_vals, plain = _prepare(args, kwargs)
    if not JIT.value or self.cnt == 0:
      ret = self._eager(args, kwargs)
    elif self.cnt == 1:
      ret = self._capture(args, kwargs, inputs, names, info, var_vals, plain)
    else:
      cj = self.captured
      assert cj is not None
      if _capturing.jits:
        raise JitError("a captured TinyJit was replayed while another TinyJit captures; the outer capture can't record "
                       "a replay (nested jits are not supported): call the inner function without TinyJit")
      if names != cj.names or info != cj.info:
        raise JitError(f"TinyJit: {_describe_change(cj.names, cj.info, names, info)}; the captured kernels only fit "
                       "the captured inputs (call .reset() to capture again, or use a bound Variable for a "
                       "varying size)")
      if plain != cj.plain:
        bad = [(a, b) for a, b in zip(cj.plain, plain) if a != b] or [(cj.plain, plain)]
        raise JitError(f"TinyJit: non-Tensor argument changed: captured {bad[0][0]}, now {bad[0][1]}; its value was "
                       "baked into the captured kernels (pass it as a Tensor or a bound Variable, or call .reset())")
      ret = cj.returned(cj(inputs, var_vals), args, kwargs)
      # (the Variables' values come from the inputs' bound shapes, so the same UOps bind the same values)
      if not kwargs and len(inputs) == len(args) and all(type(a) is _TENSOR[0] for a in args):
        self._last = (tuple(a.uop for a in args), inputs, var_vals)
    self.cnt += 1
    return ret

  def _capture(self, args: tuple, kwargs: dict, inputs: list[Buffer], names: list, info: list,
               var_vals: dict[str, int], plain: list) -> ReturnType:
    if self.fxn is None: raise JitError("this TinyJit has no function to capture")
    if _capturing.jits:
      raise JitError("a TinyJit was called while another TinyJit captures; nested jits are not supported")
    _capturing.jits.append(self)
    try:
      cap = _EngineCapture(inputs, var_vals)
      with engine.capture(cap.on_call, cap.on_host_read):
        ret = self._eager(args, kwargs)
    finally: _capturing.jits.clear()
    _check_ret(ret)
    # an input argument returned as it is (`x[1] = v; return x`): a replay returns that call's argument instead
    arg_keys = {id(a): k for k, a in (*enumerate(args), *kwargs.items()) if isinstance(a, _tensor_cls())}
    ret_args: dict[int, Any] = {}
    for t in _ret_tensors(ret):
      if not any((b := _buffer_of(p)) is not None and id(b) in cap.slots for p in _parts(t.uop)): continue
      if id(t) not in arg_keys:
        raise JitError("the TinyJit function returns a view of one of its inputs; a replay can't return a view of "
                       "the new input: return the input itself, or a computed tensor (e.g. x.clone())")
      ret_args[id(t)] = _RetArg(arg_keys[id(t)])
    if not any(isinstance(c, _KernelCall) for c in cap.calls):
      raise JitError("TinyJit captured no kernel: the function must compute (and realize or return) Tensors")
    calls = prune_calls(cap.calls) if self.prune else cap.calls
    if DEBUG >= 1 and self.prune: print(f"JIT pruned {len(cap.calls)} -> {len(calls)} calls")
    del cap  # (its call list holds the capture's whole working set)
    calls = plan_memory(calls)
    self.captured = CapturedJit(calls, _ret_template(ret, ret_args), names, info, plain, len(inputs))
    if DEBUG >= 1: print(f"JIT captured {self.captured.kernel_count} kernels with {len(inputs)} inputs")
    return ret
