"""The execution engine: turns tensor graphs into running kernels (docs/PIPELINE.md §6).

`realize(uops)` schedules everything not yet realized (`tiny_codegen.schedule.create_schedule`), then runs the CALLs
in order: kernels are compiled once per `(ast, renderer, codegen flags)` with `tiny_codegen.get_program` (the flags:
`tiny_codegen.program.CODEGEN_FLAGS`, e.g. NOOPT, BEAM, CHECK_OOB) and loaded on their device;
COPYs go through host memory, or device to device between GPUs of one backend that can (`copy_buffer`); SLICEs make
zero-copy views. It returns the scheduler's `becomes` map, which `Tensor.realize` applies to every live tensor.

Eager replay (the hot path of `(a + 1).realize()` in a loop): a schedule of kernels only, without variables, that gives
buffers to the roots alone is recorded in its schedule-cache entry (`_Replay`); a later realize whose graph has the
same structure (`tiny_codegen.schedule.cached_template`, nothing exposed) runs those kernels on its inputs and fresh
output buffers without building the schedule, counting them as `_run_kernel` does. `replay_root(u)` is that for one
tensor: it returns the new buffer view itself (`Tensor.realize`'s hot path takes the new Buffer pending
instead, and makes the view with `pending_view` when it is read). A record holds, per kernel, the program's
launcher (`Program.launcher` where a runtime has one: the CPU's binds the ctypes call once) and its argument slots;
per new buffer, the attributes a `Buffer` starts with. A replay is dropped (the next realize schedules and records
again) when a device's renderer or a codegen flag changed since it was recorded. A VIZ recorder, a capture and
DEBUG>=1 see every schedule and kernel, so while one is active every realize is scheduled.

The engine also owns the BUFFER-UOp -> `tiny_uop.device.Buffer` registry (kept on the node: a buffer is freed when no
graph refers to its BUFFER node any more; `register_buffer` puts an existing Buffer behind a BUFFER UOp) and
`GlobalCounters`.

Capture (used by TinyJit): inside `with capture(on_call, on_host_read):` every CALL the engine runs is reported, after
it ran, to `on_call` as a `CapturedCall` (what ran, on which Buffers, with which sizes and variable values), and every
read of device data into host memory other than the engine's own COPYs is reported to `on_host_read(buf)` before it
happens (raise there to refuse it). Captures nest: each active one is told, innermost last.

Threads: a capture sees only what its own thread runs (capture state is per thread). `realize` holds `lock` (one
re-entrant lock for the engine) from scheduling to the last kernel, so concurrent realizes of graphs that share
nodes (an RNG counter, a parameter) run one after the other and each sees the other's results; `Tensor.realize`
takes the same lock around finding the shared nodes and pointing live tensors at the new buffers. Every other use of a
device the engine makes holds it too: filling a new buffer from host data, reading one back (`Tensor.numpy`), a
TinyJit replay (a GPU's command queues and signals are driven by one thread at a time; on the CPU a kernel's shares
still run on the thread pool). The program cache is bounded (`PROGRAM_CACHE_MAX`, least recently used first out) and
locked; `GlobalCounters` may miss increments made at the same moment by two threads.
"""
from __future__ import annotations

import contextlib
import functools
import numbers
import operator
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Literal

from tiny_uop import trace as _trace
from tiny_uop.device import Buffer
from tiny_uop.dtype import DType
from tiny_uop.helpers import DEBUG, JIT, ContextVar, del_errors
from tiny_uop.uop import GroupOp, Ops, UOp
from tiny_uop.plugins import Device

__all__ = ["GlobalCounters", "realize", "get_buffer", "register_buffer", "buffer_from_bytes", "is_realized",
           "buffer_view", "run_schedule", "CapturedCall", "capture", "replay_root", "Recorded", "realize_recorded",
           "replay_recorded"]


# The counters' values, in one list that the engine's hot paths add to: a class attribute write (`GlobalCounters.x +=
# 1`) invalidates the class's attribute cache, ~400 machine instructions each and six per eager op; `GlobalCounters.x`
# reads and writes these through its metaclass.
_KERNELS, _OPS, _MEM, _TIME, _MEM_USED = range(5)
_counts: list[Any] = [0, 0, 0, 0.0, 0]


def _counter(i: int, doc: str) -> property:
  """A metaclass property for `GlobalCounters` reading and writing `_counts[i]`."""
  def get(cls: type) -> Any: return _counts[i]
  def put(cls: type, v: Any) -> None: _counts[i] = v
  return property(get, put, doc=doc)


class _CountersMeta(type):
  """`GlobalCounters`'s class attributes, kept in `_counts` (read and written as plain class attributes)."""
  global_ops = _counter(_OPS, "FLOPs run")
  global_mem = _counter(_MEM, "bytes moved")
  time_sum_s = _counter(_TIME, "seconds spent in kernels")
  kernel_count = _counter(_KERNELS, "kernels run")
  mem_used = _counter(_MEM_USED, "bytes of buffers the engine holds allocated now (not reset)")


class GlobalCounters(metaclass=_CountersMeta):
  """Counters of the work the engine did: kernels run, FLOPs, bytes moved, time spent (reset with `reset()`).

  >>> from tiny_tensor import Tensor
  >>> GlobalCounters.reset(); _ = (Tensor([1.0, 2.0]) + 1).realize(); GlobalCounters.kernel_count
  1
  """
  global_ops: ClassVar[int]
  global_mem: ClassVar[int]
  time_sum_s: ClassVar[float]
  kernel_count: ClassVar[int]
  mem_used: ClassVar[int]  # bytes of buffers the engine holds allocated now (not reset)

  @staticmethod
  def reset() -> None:
    """Zero the counters of work done (global_ops, global_mem, time_sum_s, kernel_count); mem_used stays."""
    _counts[_KERNELS], _counts[_OPS], _counts[_MEM], _counts[_TIME] = 0, 0, 0, 0.0


# ***** the buffer registry *****
# The Buffer behind a BUFFER UOp is kept on the node itself (`u._cache["buffer"]`): it lives exactly as long as some
# graph refers to the node (nodes are freed by reference counting), and finding it is one dict lookup on the eager hot
# path (a WeakKeyDictionary made a weak reference per lookup). A Buffer never refers back to its node.
class _EngineBuffer(Buffer):
  """A Buffer the engine created for a BUFFER UOp: counted in `GlobalCounters.mem_used` while it exists."""
  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    nbytes = self.size * self.dtype.itemsize  # (nbytes without its property: this is the eager hot path's free)
    _counts[_MEM_USED] -= nbytes
    if self._opaque is not None and self.options is None and self._base is None and \
       (dev := Device._opened.get(self.device)) is not None:  # a plain buffer: what Buffer.__del__ does, in one frame
      dev.allocator.free(self._opaque, nbytes, None)
      self._opaque = None
    else: super().__del__(_errors)


# ops read on the eager hot path, as module constants (on Python 3.11 each `Ops.X` read costs ~0.1 us: see tiny_uop.uop)
_BUFFER, _RESHAPE, _DEVICE = Ops.BUFFER, Ops.RESHAPE, Ops.DEVICE


def _buffer_device(u: UOp) -> str:
  d = u.src[1].arg if len(u.src) > 1 and u.src[1].op is _DEVICE else u.device
  if not isinstance(d, str): raise TypeError(f"BUFFER has no single device: {d!r}")
  return d


_buffers_lock = threading.Lock()


def get_buffer(u: UOp) -> Buffer:
  """The `Buffer` behind a BUFFER UOp, created (not yet allocated) on first use (once, whichever thread asks)."""
  if (b := u._cache.get("buffer")) is not None: return b
  if u.op is not _BUFFER: raise TypeError(f"get_buffer needs a BUFFER UOp, got {u.op}")
  with _buffers_lock:
    if (b := u._cache.get("buffer")) is None:
      b = u._cache["buffer"] = _EngineBuffer(_buffer_device(u), u.arg, u.dtype)
      _counts[_MEM_USED] += b.nbytes
  return b


def register_buffer(u: UOp, buf: Buffer) -> UOp:
  """Make the existing `buf` the Buffer behind the BUFFER UOp `u` (e.g. a loaded weight, a replayed jit output).

  `u` must be a BUFFER of the same size and dtype that no Buffer is registered for yet (a new `UOp.new_buffer`);
  returns `u`. The registry holds `buf` as long as some graph refers to `u`.
  """
  if u.op is not Ops.BUFFER: raise TypeError(f"register_buffer needs a BUFFER UOp, got {u.op}")
  if u.arg != buf.size or u.dtype != buf.dtype:
    raise ValueError(f"register_buffer: BUFFER of {u.arg} x {u.dtype} can't hold {buf!r} ({buf.size} x {buf.dtype})")
  if (old := u._cache.get("buffer")) is not None and old is not buf:
    raise ValueError(f"register_buffer: {u} already has a Buffer ({old!r}); make a new BUFFER UOp for {buf!r}")
  u._cache["buffer"] = buf
  return u


def buffer_from_bytes(device: str, size: int, dtype: DType, data: bytes | memoryview | None) -> UOp:
  """A new BUFFER UOp of `size` elements on `device`, allocated now and filled with `data` (if given)."""
  u = UOp.new_buffer(device, size, dtype)
  with lock:
    buf = get_buffer(u).ensure_allocated()
    if data is not None and size: buf.copyin(memoryview(data))
  return u


def copy_into(u: UOp, arr: Any) -> None:
  """Overwrite realized buffer `u` (a BUFFER or a RESHAPE of one: see buffer_view) with the bytes of C-contiguous
  host array `arr`, whose size in bytes must equal the buffer's (Buffer.copyin checks; the device's copy-in waits
  until its kernels are done with the buffer)."""
  view = buffer_view(u)
  if view is None: raise ValueError(f"copy_into needs a realized buffer, got a {u.op} UOp")
  with lock:
    buf = get_buffer(view[0]).ensure_allocated()
    if buf.nbytes: buf.copyin(memoryview(arr).cast("B"))


def buffer_view(u: UOp) -> tuple[UOp, tuple] | None:
  """(BUFFER, shape) when `u` is a realized buffer (the BUFFER itself or a RESHAPE of it), else None."""
  if u.op is Ops.BUFFER: return u, (u.arg,)
  if u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER: return u.src[0], u.shape  # type: ignore[return-value]
  return None


def is_realized(u: UOp) -> bool:
  """Whether `u` is a realized buffer (what `buffer_view` accepts), without computing its shape."""
  return u.op is _BUFFER or (u.op is _RESHAPE and u.src[0].op is _BUFFER)


# ***** capture *****
@dataclass(frozen=True)
class CapturedCall:
  """One CALL the engine ran, as reported to the `capture` callbacks.

  kind: "kernel", "copy" or "slice".
  bufs: kernel: the Buffers in the program's argument order (what `prg` was called with); copy: (dst, src);
    slice: (view, base) (the view shares base's memory from `offset` bytes in).
  device: the device it ran on (kernel, slice: the output's; copy: the destination's).
  spec, prg: kernel only: the `ProgramSpec` and the loaded program (called as `prg(*[b._buf for b in bufs],
    global_size=, local_size=, vals=)`).
  global_size, local_size: kernel only, as in the spec (may hold symbolic dims, resolved with `var_vals`).
  var_vals: kernel only: the value of each of the program's variables (`spec.vars`, by name) in this run.
  ops, mem: kernel only: the FLOPs and bytes counted into `GlobalCounters` for it.
  offset: slice only: the byte offset of the view into its base.
  """
  kind: Literal["kernel", "copy", "slice"]
  bufs: tuple[Buffer, ...]
  device: str
  spec: Any = field(default=None, repr=False)
  prg: Any = field(default=None, repr=False)
  global_size: tuple | None = None
  local_size: tuple | None = None
  var_vals: dict[str, int] = field(default_factory=dict)
  ops: int = 0
  mem: int = 0
  offset: int = 0


lock = threading.RLock()
"""The engine lock: held while a graph is scheduled and run (see the module docstring)."""


class _ThreadState(threading.local):
  """Per thread: the active captures ((on_call, on_host_read or None), innermost last; the runners check
  `if _tls.captures:`, a no-op when empty) and how deep the engine itself is in a host read of device data (a COPY:
  not reported)."""
  def __init__(self) -> None:
    self.captures: list[tuple[Callable[[CapturedCall], None], Callable[[Buffer], None] | None]] = []
    self.engine_reads = 0


_tls = _ThreadState()
_hook_users = [0]  # captures active in any thread: the host-read hook is installed while > 0
_hook_lock = threading.Lock()


def _host_read(buf: Buffer) -> None:
  if _tls.engine_reads: return
  for _, on_read in list(_tls.captures):
    if on_read is not None: on_read(buf)


def _report(call: CapturedCall) -> None:
  for on_call, _ in list(_tls.captures): on_call(call)


@contextlib.contextmanager
def capture(on_call: Callable[[CapturedCall], None],
            on_host_read: Callable[[Buffer], None] | None = None) -> Iterator[None]:
  """Report what the engine runs while the block runs (see the module doc and `CapturedCall`).

  `on_call(call)` is called after each kernel, COPY and SLICE ran; `on_host_read(buf)` before each read of device
  data into host memory (`Tensor.numpy()`, `.item()`, `.tolist()`, `Buffer.as_buffer`/`copyout`) except the engine's
  own COPYs. An exception raised by either callback propagates out of the engine call that triggered it.

  >>> from tiny_tensor import Tensor
  >>> calls = []
  >>> x = Tensor([1.0, 2.0]).realize()
  >>> with capture(calls.append): _ = (x * 3).realize()
  >>> [(c.kind, len(c.bufs)) for c in calls]
  [('kernel', 2)]
  """
  entry = (on_call, on_host_read)
  with _hook_lock:
    if _hook_users[0] == 0: Buffer.host_read_hooks.append(_host_read)
    _hook_users[0] += 1
  _tls.captures.append(entry)
  try: yield
  finally:
    _tls.captures.remove(entry)
    with _hook_lock:
      _hook_users[0] -= 1
      if _hook_users[0] == 0 and _host_read in Buffer.host_read_hooks: Buffer.host_read_hooks.remove(_host_read)


def capturing() -> bool:
  """Whether a capture is active in this thread (see `capture`)."""
  return bool(_tls.captures)


# ***** running *****
PROGRAM_CACHE_MAX = 4096
"""Compiled-and-loaded programs kept (by kernel AST, renderer, device and the codegen flags' values); the least
recently used go first."""
_program_cache: OrderedDict[tuple[UOp, type, str, str, tuple], tuple[Any, Any]] = OrderedDict()
_program_lock = threading.Lock()


@functools.cache
def _codegen_flag_vars() -> tuple:
  from tiny_codegen.program import CODEGEN_FLAGS  # imported on first use, as the compiler is
  return CODEGEN_FLAGS


_VALUE = operator.attrgetter("value")


# (ContextVar.version when read, the flags' values then): recomputed only after some flag was written
_flags_memo: list[tuple[int, tuple]] = [(-1, ())]


def _codegen_flags() -> tuple:
  """`tiny_codegen.program.codegen_flags()`: the values of the flags that change what a kernel compiles to. Kept
  while no flag is written (`ContextVar.version`: a `Context` or a `.value =` takes effect at the next call)."""
  if (m := _flags_memo[0])[0] == ContextVar.version: return m[1]
  ver = ContextVar.version  # read before the values: a write meanwhile leaves a newer version, so a recompute
  vals = tuple(map(_VALUE, _codegen_flag_vars()))
  _flags_memo[0] = (ver, vals)
  return vals


def estimate_ops(ast: UOp) -> int:
  """FLOPs of a kernel AST: each ALU op (REDUCE: one per element) of the stored values, times the iterations of the
  ranges it depends on; index arithmetic (under INDEX) is not counted."""
  ops = 0
  stores = [u for u in ast.toposort() if u.op is Ops.STORE]
  values = UOp.sink(*[st.src[1] for st in stores]) if stores else ast
  for u in values.toposort(gate=lambda n: n.op is not Ops.INDEX):
    if u.op not in GroupOp.ALU and u.op is not Ops.REDUCE: continue
    n = 2 if u.op is Ops.MULACC else 1
    for r in (u.src[0].ranges if u.op is Ops.REDUCE else u.ranges):
      b = r.src[0]
      n *= b.arg if b.op is Ops.CONST and isinstance(b.arg, int) else 1
    ops += n
  return ops


def _get_runner(ast: UOp, device: str) -> tuple[Any, Any]:
  """(ProgramSpec, loaded Program) for a kernel AST on a device, compiled once per (ast, renderer class, arch, values
  of the codegen flags: `tiny_codegen.program.CODEGEN_FLAGS`) and loaded once per device (two devices may share a
  renderer, never a loaded program)."""
  # hot path: the registry's opened devices by canonical name (Device[...] canonicalizes first, ~20 us)
  dev = Device._opened.get(device) or Device[device]
  renderer = dev.renderer
  key = (ast, type(renderer), getattr(renderer, "arch", ""), device, _codegen_flags())
  with _program_lock:
    if (ret := _program_cache.get(key)) is not None:
      _program_cache.move_to_end(key)
      return ret
  from tiny_codegen import get_program
  # outside the lock: two threads may compile one kernel; both get a good program. DEBUG>=4 prints its source there,
  # once per compile
  spec = get_program(ast, renderer)
  if getattr(spec, "estimates", None) is None: spec.estimates = {"ops": estimate_ops(ast)}
  # a split CPU kernel's cost goes with it: the runtime decides how its Python path launches it
  ret = (spec, dev.get_program(spec.name, spec.lib, cost=spec.cost)
         if spec.cost else dev.get_program(spec.name, spec.lib))
  with _program_lock:
    ret = _program_cache.setdefault(key, ret)
    while len(_program_cache) > PROGRAM_CACHE_MAX: _program_cache.popitem(last=False)
  return ret


def _est(spec: Any, name: str) -> int:
  """A program's estimate `name` ("ops", "mem") as an int: 0 when it has none, or when it is symbolic (it depends on
  variables only bound at run time). Any other kind of value is a bug of whoever made the spec: a TypeError."""
  est = getattr(spec, "estimates", None)
  v = getattr(est, name, None) if est is not None else None
  if v is None and isinstance(est, dict): v = est.get(name)
  if v is None: return 0
  if isinstance(v, UOp): return int(v.arg) if v.op is Ops.CONST else 0  # a symbolic estimate is not counted
  if isinstance(v, (numbers.Integral, float)) and not isinstance(v, bool): return int(v)
  raise TypeError(f"kernel {getattr(spec, 'name', '?')}: estimate {name!r} is {v!r} ({type(v).__name__}); "
                  "expected an int, a float or a UOp")


def _run_kernel(ast: UOp, bufs: tuple[UOp, ...], var_vals: dict[str, int]) -> None:
  device = _buffer_device(bufs[0])
  spec, prg = _get_runner(ast, device)
  buffers = [get_buffer(b).ensure_allocated() for b in bufs]
  slots = spec.globals if spec.globals else range(len(buffers))
  if spec.vars:
    try: vals = tuple(var_vals[v.arg[0]] for v in spec.vars)
    except KeyError as e: raise RuntimeError(f"kernel {spec.name} needs Variable {e} but no value is bound") from e
  else: vals = ()
  st = time.perf_counter()
  et = prg(*[buffers[i]._buf for i in slots], global_size=spec.global_size, local_size=spec.local_size, vals=vals,
           wait=DEBUG >= 2)
  wall = time.perf_counter() - st
  t = et if et is not None else wall
  est = spec.estimates
  if est.__class__ is dict:  # what _get_runner sets: {"ops": n} (hot path: no getattr chain)
    ops, mem = est.get("ops", 0), est.get("mem", 0) or sum([b.nbytes for b in buffers])
  else: ops, mem = _est(spec, "ops"), _est(spec, "mem") or sum(b.nbytes for b in buffers)
  _counts[_KERNELS] += 1
  _counts[_OPS] += ops
  _counts[_MEM] += mem
  _counts[_TIME] += t
  if _trace.RECORDER is not None: _trace.RECORDER.launch(device, spec.name, st, t)  # VIZ
  if DEBUG >= 2:  # running totals: kernel number, time so far
    print(f"*** {device:8s} {GlobalCounters.kernel_count:4d} {spec.name:32s} {t*1e6:9.2f} us  "
          f"{ops/max(t, 1e-9)*1e-9:8.2f} GFLOPS  {mem/max(t, 1e-9)*1e-9:8.2f} GB/s  "
          f"total {GlobalCounters.time_sum_s*1e3:9.3f} ms")
  if _tls.captures:
    _report(CapturedCall("kernel", tuple(buffers[i] for i in slots), device, spec, prg, spec.global_size,
                         spec.local_size, {v.arg[0]: x for v, x in zip(spec.vars, vals)}, ops, mem))


def copy_buffer(dst: Buffer, src: Buffer) -> None:
  """`dst` <- `src` (equal sizes). Between two devices of one backend whose allocator has `_peer_copy` (docs/PLUGINS.md:
  AMD's SDMA over a peer mapping, CUDA's cuMemcpyPeer) device to device; otherwise through host memory."""
  if dst.nbytes != src.nbytes: raise RuntimeError(f"COPY of {src} into {dst}: sizes differ")
  if not dst.nbytes: return
  dst.ensure_allocated()
  src.ensure_allocated()
  alloc = dst.allocator
  if dst.device != src.device and type(alloc) is type(src.allocator) and hasattr(alloc, "_peer_copy"):
    alloc._peer_copy(dst._opaque, src._opaque, dst.nbytes, Device[src.device])
    return
  _tls.engine_reads += 1
  try: dst.copyin(src.as_buffer())
  finally: _tls.engine_reads -= 1


def _run_copy(bufs: tuple[UOp, ...]) -> None:
  dst, src = get_buffer(bufs[0]).ensure_allocated(), get_buffer(bufs[1]).ensure_allocated()
  st = time.perf_counter()
  copy_buffer(dst, src)
  _counts[_MEM] += dst.nbytes
  if DEBUG >= 2:
    print(f"*** {dst.device:8s} copy {dst.nbytes:8d} bytes from {src.device:8s} {(time.perf_counter()-st)*1e6:9.2f} us")
  if _tls.captures: _report(CapturedCall("copy", (dst, src), dst.device))


def _run_slice(bufs: tuple[UOp, ...], offset: int) -> None:
  if not ((old := bufs[0]._cache.get("buffer")) is not None and old.is_allocated):
    bufs[0]._cache["buffer"] = get_buffer(bufs[1]).view(bufs[0].arg, bufs[0].dtype, offset)
  if _tls.captures:
    view = bufs[0]._cache["buffer"]
    _report(CapturedCall("slice", (view, get_buffer(bufs[1])), view.device, offset=offset))


def run_schedule(calls: list[UOp], var_vals: dict[str, int]) -> None:
  """Run a list of CALLs in order (kernels, COPY, SLICE)."""
  for call in calls:
    ast, bufs = call.src[0], call.src[1:]
    if ast.op is Ops.SINK: _run_kernel(ast, bufs, var_vals)
    elif ast.op is Ops.COPY: _run_copy(bufs)
    elif ast.op is Ops.SLICE: _run_slice(bufs, ast.arg or 0)
    else: raise RuntimeError(f"the engine can't run a CALL of {ast.op}")


# ***** eager replay *****
REPLAY_MAX_NODES = 64
"""A realize whose graph has at most this many nodes not seen before tries the replay of its cached schedule."""


@dataclass(frozen=True)
class _Replay:
  """A cached schedule as the engine runs it again without building it (kept in the schedule cache entry's `runtime`
  slot, see `tiny_codegen.schedule.cached_template`): kernels only, no variables. Buffer slots: 0..len(inputs)-1 are
  the graph's inputs in the entry's order, then the buffers the schedule makes (`new`: device, size, dtype, bytes, and
  the opened device to allocate it on before the first kernel runs, or None when no kernel uses it, and the
  interned DEVICE node the new BUFFERs read: kept here, so a replay does not build it again), fresh BUFFER
  UOps each run, as `create_schedule` makes them."""
  new: tuple[tuple[str, int, DType, int, Any, UOp], ...]
  # per kernel: (launch, its arguments from the slots (`operator.itemgetter`, a tuple), FLOPs, bytes)
  kernels: tuple[tuple[Callable[..., Any], Callable[[list], tuple], int, int], ...]
  used: tuple[int, ...]  # the input slots the kernels use (allocated before the first kernel runs)
  outs: tuple[tuple[int, tuple | None], ...]  # per root: its buffer slot, and the shape it is reshaped to (or None)
  devices: tuple[tuple[str, Any, Any], ...]  # (name, opened device, its renderer) when recorded: replays check them
  flags: tuple  # the codegen flags' values the programs were compiled under (`codegen_flags()`): replays check them
  # per new buffer: the attributes of a `Buffer(device, size, dtype)` not yet allocated (copied into each new one:
  # what its constructor sets, without running it on the hot path)
  protos: tuple[dict[str, Any], ...]
  # per new buffer, what a replay reads to make it, in one tuple (the hot path: no zip of `new` and `protos`): (size,
  # dtype, bytes, the opened device's `allocator.alloc` or None (no kernel uses it), DEVICE node, the Buffer's
  # attributes)
  plan: tuple[tuple[int, DType, int, Callable[..., Any] | None, UOp, dict[str, Any]], ...] = ()
  # [the `ContextVar.version` at the last full check that passed]: while it stands, no flag was written and no
  # renderer set (`tiny_uop.helpers.config_changed`), so a replay checks only that its devices are still open
  checked: list[int] = field(default_factory=lambda: [-1])


def _slots_getter(args: tuple[int, ...]) -> Callable[[list], tuple]:
  """`lambda slots: tuple(slots[i] for i in args)`, in C (`operator.itemgetter`; one index gives a 1-tuple too)."""
  if len(args) == 1:
    get1 = operator.itemgetter(args[0])
    return lambda slots: (get1(slots),)
  return operator.itemgetter(*args)


def _launcher(spec: Any, prg: Any, nbufs: int) -> Callable[..., Any]:
  """A function of a kernel's `nbufs` opaque buffers (in argument order) that launches it without waiting and returns
  what the program returns (seconds or None): the program's own `launcher` when it has one (the CPU's decides the
  argument conversion once), else a call with the spec's sizes and no variables."""
  gs, ls = spec.global_size, spec.local_size
  if (make := getattr(prg, "launcher", None)) is not None and (fn := make(nbufs, gs, ls)) is not None: return fn
  return lambda *bufs: prg(*bufs, global_size=gs, local_size=ls, vals=(), wait=False)


def _call_slots(sched: Any) -> tuple[dict[UOp, int], list[list[int]], list[tuple[str, int, DType]]]:
  """The buffer slots of a schedule's calls: each BUFFER's slot (the inputs' first, in `sched.inputs` order, then
  the new ones as the calls first use them), each call's slots in its source order, and the new buffers' (device,
  size, dtype)."""
  slot = {b: i for i, b in enumerate(sched.inputs)}
  new: list[tuple[str, int, DType]] = []
  per_call = []
  for c in sched.calls:
    call_slots = []
    for b in c.src[1:]:
      if b not in slot:
        slot[b] = len(slot)
        new.append((_buffer_device(b), b.arg, b.dtype))
      call_slots.append(slot[b])
    per_call.append(call_slots)
  return slot, per_call, new


def _make_replay(sched: Any, todo: list[UOp], inner: bool = False) -> _Replay | None:
  """The replay of a schedule just run for `todo` (nothing exposed), or None when it has a COPY/SLICE, variables, or
  gives buffers to other nodes than the roots (`inner=True`: other nodes' buffers are allowed, made fresh by each
  replay and dropped with it: for roots whose graph nobody else holds, see `Recorded`)."""
  if sched.var_vals or not (set(todo) <= set(sched.becomes) if inner else set(sched.becomes) == set(todo)): return None
  if any(c.src[0].op is not Ops.SINK for c in sched.calls): return None
  slot, per_call, new = _call_slots(sched)
  kernels, devices = [], {}
  flags = _codegen_flags()
  for c, call_slots in zip(sched.calls, per_call):
    device = _buffer_device(c.src[1])
    spec, prg = _get_runner(c.src[0], device)
    if spec.vars: return None
    dev = Device._opened.get(device) or Device[device]
    devices[device] = (device, dev, dev.renderer)
    args = tuple(call_slots[i] for i in (spec.globals if spec.globals else range(len(call_slots))))
    mem = _est(spec, "mem") or sum(b.arg * b.dtype.itemsize for b in c.src[1:])
    kernels.append((_launcher(spec, prg, len(args)), args, _est(spec, "ops"), mem, dev))
  outs = []
  for r in todo:
    v = sched.becomes[r]
    b = v.src[0] if v.op is Ops.RESHAPE else v
    if b.op is not Ops.BUFFER or b not in slot or (v is not b and v.src[0] is not b): return None
    shape = r.shape  # the root's own shape (a 0-d root's buffer view may be 1-d): replays give exactly that view
    if shape is None or not all(isinstance(s, int) for s in shape): return None
    outs.append((slot[b], None if shape == (b.arg,) else shape))
  used = sorted({i for k in kernels for i in k[1]})
  n_in = len(sched.inputs)
  opened = {name: dev for name, dev, _ in devices.values()}
  new_bufs = tuple((d, n, dt, n * dt.itemsize, opened[d] if n_in + j in used else None, UOp(_DEVICE, arg=d))
                   for j, (d, n, dt) in enumerate(new))
  protos = tuple(dict(vars(Buffer(d, n, dt))) for d, n, dt in new)
  plan = tuple((n, dt, nbytes, None if dev is None else dev.allocator.alloc, dnode, proto)
               for (_, n, dt, nbytes, dev, dnode), proto in zip(new_bufs, protos))
  return _Replay(new_bufs, tuple((k[0], _slots_getter(k[1]), k[2], k[3]) for k in kernels),
                 tuple(i for i in used if i < n_in), tuple(outs), tuple(devices.values()), flags, protos, plan)


_find_template: list[Callable[..., Any] | None] = [None]  # tiny_codegen's cached_template, once imported


def _load_find_template() -> Callable[..., Any]:
  from tiny_codegen.schedule import cached_template  # imported on first use, as the scheduler is
  _find_template[0] = cached_template
  return cached_template


def _replay_launch(roots: tuple[UOp, ...]) -> tuple[_Replay, list[UOp], list[Any]] | None:
  """Run the recorded replay of `roots` (nothing exposed): what `create_schedule` + `run_schedule` would do (new
  output buffers, the same kernels, GlobalCounters) without building the schedule; its record, the graph's input
  BUFFERs and, per new buffer (`_Replay.plan`), its allocated `_EngineBuffer` (None when no kernel uses it). The
  new buffers get no BUFFER nodes here (`_replay_run` makes them; the eager hot path defers them, `pending_view`).
  None (nothing ran) when there is no replay for it, or when something must see the schedule being built or each
  kernel (VIZ, a capture, DEBUG)."""
  if _trace.RECORDER is not None or _tls.captures or DEBUG.value >= 1: return None
  if (found := (_find_template[0] or _load_find_template())(roots, REPLAY_MAX_NODES)) is None: return None
  tmpl, inputs = found
  if (rp := tmpl.runtime) is None or rp is False: return None
  if rp.checked[0] == ContextVar.version:  # `_still_valid(rp)` for a record checked since the last flag write
    opened = Device._opened
    for name, dev, _ in rp.devices:
      if opened.get(name) is not dev: break  # closed
    else: return rp, inputs, _launch(rp, inputs)
  if not _still_valid(rp):
    tmpl.runtime = None  # recorded again after the next scheduled run
    return None
  return rp, inputs, _launch(rp, inputs)


def _still_valid(rp: _Replay) -> bool:
  """Whether recorded replay `rp` still runs what a schedule would: its devices open with the same renderers, and the
  codegen flags as they were (e.g. `with Context(NOOPT=1)` compiles the programs otherwise). A pass is remembered
  (`_Replay.checked`) until the next flag write or renderer change."""
  ver = ContextVar.version  # read before the checks: a write meanwhile leaves a newer version, so a full check again
  opened = Device._opened
  for name, dev, renderer in rp.devices:
    if (d := opened.get(name)) is not dev or d.renderer is not renderer: return False  # closed, or a new renderer
  if _codegen_flags() != rp.flags: return False
  rp.checked[0] = ver
  return True


def _launch(rp: _Replay, inputs: list[UOp]) -> list[Any]:
  """Run recorded replay `rp` on the graph's input BUFFERs `inputs` (its checks passed): per new buffer, its
  allocated `_EngineBuffer` (None when no kernel uses it). See `_replay_launch`."""
  opaque, new = _slot_opaques(rp, inputs)
  for launch, args_of, ops, mem in rp.kernels:  # as _run_kernel with DEBUG=0, no recorder and no capture
    st = time.perf_counter()
    et = launch(*args_of(opaque))
    t = et if et is not None else time.perf_counter() - st
    _counts[_KERNELS] += 1
    _counts[_OPS] += ops
    _counts[_MEM] += mem
    _counts[_TIME] += t
  return new


def _slot_opaques(rp: _Replay, inputs: list[UOp]) -> tuple[list[Any], list[Any]]:
  """The opaque device buffer of every slot of replay `rp` that a kernel uses (None for the others), the new ones
  allocated, and per new buffer its `_EngineBuffer` (None when no kernel uses it)."""
  # the device buffers: the inputs' Buffers live on their BUFFER nodes; new ones are made here
  n_in = len(inputs)
  opaque: list[Any] = [None] * (n_in + len(rp.plan))
  for i in rp.used:
    if (ib := inputs[i]._cache.get("buffer")) is None or ib._opaque is None:
      ib = get_buffer(inputs[i]).ensure_allocated()
    opaque[i] = ib._opaque
  new: list[Any] = []
  for _n, _dt, nbytes, alloc, _dnode, proto in rp.plan:
    # allocated now if a kernel uses it: what get_buffer and Buffer.allocate do, for a buffer no other thread sees
    if alloc is None:
      new.append(None)
      continue
    buf = object.__new__(_EngineBuffer)
    buf.__dict__ = proto.copy()  # (its attributes at once: a copy of the recorded dict, not a fill of a new one)
    buf._opaque = opaque[n_in + len(new)] = alloc(nbytes, None)
    new.append(buf)
    _counts[_MEM_USED] += nbytes
  return opaque, new


def _replay_run(roots: tuple[UOp, ...]) -> tuple[_Replay, list[UOp]] | None:
  """`_replay_launch(roots)` with a fresh BUFFER node for each new buffer: its record and every buffer slot's
  BUFFER (the new ones' Buffers registered on them); None when nothing ran."""
  if (got := _replay_launch(roots)) is None: return None
  return got[0], _slot_buffers(*got)


def _slot_buffers(rp: _Replay, inputs: list[UOp], new: list[Any]) -> list[UOp]:
  """Every buffer slot's BUFFER after a replay of `rp` launched: the inputs', then a fresh BUFFER node per new buffer
  with its Buffer (`_launch`'s) registered on it."""
  bufs = list(inputs)
  new_buffer_on = UOp.new_buffer_on
  for (n, dt, _, _, dnode, _), buf in zip(rp.plan, new):
    bufs.append(b := new_buffer_on(dnode, n, dt))
    if buf is not None: b._cache["buffer"] = buf
  return bufs


def _root_views(rp: _Replay, bufs: list[UOp]) -> list[UOp]:
  """Each root's realized view after a replay of `rp` whose buffer slots are `bufs` (`_slot_buffers`)."""
  return [bufs[i] if shape is None else _view(bufs[i], shape) for i, shape in rp.outs]


def _replay(todo: list[UOp]) -> dict[UOp, UOp] | None:
  """Realize `todo` (nothing exposed) by replaying its cached schedule (`_replay_run`): the `becomes` map, or None."""
  if (got := _replay_run(tuple(todo))) is None: return None
  return dict(zip(todo, _root_views(*got)))


@dataclass(frozen=True)
class Recorded:
  """The schedule of fixed graphs `roots`, recorded by `realize_recorded` so that `replay_recorded` runs it again on
  whatever their input buffers hold then, without scheduling or walking the graphs (an eager `OnnxRunner`'s repeated
  calls: one graph per input signature over the same input buffers). The holder must be the only one to hold the
  roots' graphs: buffers the schedule gave to inner nodes are made fresh by each replay and dropped with it. When
  every kernel runs on one device whose graph class takes them (`Compiled.graph`, PIPELINE.md §7; not under
  `JIT=2`), `graph` runs them all in one call, every buffer patched in per replay (on the CPU: one native call, the
  thread pool woken once, not per kernel); `totals` is what the kernels add to `GlobalCounters` (kernels, ops,
  bytes). A holder replays it from one thread at a time (`replay_recorded` holds the engine lock)."""
  roots: tuple[UOp, ...]
  replay: _Replay
  inputs: list[UOp]  # the graphs' input BUFFERs, in the replay's slot order
  graph: Any = None
  totals: tuple[int, int, int] = (0, 0, 0)


class _GraphKernel:
  """A recorded kernel as a device graph takes it (PIPELINE.md §7): its program, each argument an index into the
  replay's buffer slots, fixed sizes, no variables."""
  __slots__ = ("prg", "bufs", "vars", "global_size", "local_size", "static_launch")

  def __init__(self, prg: Any, bufs: list[int], global_size: tuple[int, ...], local_size: tuple[int, ...] | None):
    self.prg, self.bufs, self.global_size, self.local_size = prg, bufs, global_size, local_size
    self.vars: tuple = ()
    self.static_launch = True

  def launch(self, var_vals: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    return self.global_size, self.local_size


def _record_graph(sched: Any) -> Any:
  """The device graph of a recorded schedule's kernels (see `Recorded`), or None."""
  if JIT.value >= 2 or not sched.calls: return None
  devices = {_buffer_device(c.src[1]) for c in sched.calls}
  if len(devices) != 1: return None
  device = devices.pop()
  dev = Device._opened.get(device) or Device[device]
  if (cls := getattr(dev, "graph", None)) is None: return None
  supports = getattr(cls, "supports", None)
  kernels = []
  for c, call_slots in zip(sched.calls, _call_slots(sched)[1]):
    spec, prg = _get_runner(c.src[0], device)
    args = [call_slots[i] for i in (spec.globals if spec.globals else range(len(call_slots)))]
    gs = tuple(spec.global_size) if spec.global_size is not None else (1, 1, 1)
    k = _GraphKernel(prg, args, gs, tuple(spec.local_size) if spec.local_size is not None else None)
    if supports is not None and not supports(dev, k): return None
    kernels.append(k)
  return cls(dev, kernels)


def realize_recorded(uops: list[UOp]) -> tuple[dict[UOp, UOp], Recorded | None]:
  """Realize graphs `uops` (none realized yet, nothing exposed) as `realize` does; also their recorded schedule
  (`Recorded`), or None when it can't be replayed (a COPY or SLICE, variables, a root that is one of its inputs)."""
  if any(is_realized(u) for u in uops): raise ValueError("realize_recorded needs graphs not realized yet")
  with lock:
    sched = plan(uops)
    calls = list(sched.calls)
    before = _totals() if DEBUG >= 1 else None
    run_schedule(calls, dict(getattr(sched, "var_vals", {}) or {}))
    if before is not None: _print_realize(calls, before)
    rp = _make_replay(sched, uops, inner=True)
    if rp is None or any(i < len(sched.inputs) for i, _ in rp.outs): return dict(sched.becomes), None
    totals = (len(rp.kernels), sum(k[2] for k in rp.kernels), sum(k[3] for k in rp.kernels))
    return dict(sched.becomes), Recorded(tuple(uops), rp, list(sched.inputs), _record_graph(sched), totals)


def replay_recorded(rec: Recorded) -> list[UOp]:
  """Realize `rec.roots` again: each one's view of its fresh buffer, in order. The recorded kernels run on the input
  buffers as they are now, counted as `realize` counts them; while a VIZ recorder, a capture or DEBUG>=1 is active,
  or when a device's renderer or a codegen flag changed since the recording, the roots are scheduled as `realize`
  schedules them (the same results)."""
  with lock:
    if _trace.RECORDER is None and not _tls.captures and DEBUG.value < 1 and _still_valid(rec.replay):
      if rec.graph is None: new = _launch(rec.replay, rec.inputs)
      else:
        opaque, new = _slot_opaques(rec.replay, rec.inputs)
        st = time.perf_counter()
        rec.graph(opaque, {})
        _counts[_TIME] += time.perf_counter() - st
        k, ops, mem = rec.totals
        _counts[_KERNELS] += k
        _counts[_OPS] += ops
        _counts[_MEM] += mem
      return _root_views(rec.replay, _slot_buffers(rec.replay, rec.inputs, new))
    becomes = realize(list(rec.roots), replay=False)
    return [becomes[r] for r in rec.roots]


def replay_root(u: UOp) -> UOp | None:
  """Realize the one graph `u` (not a buffer yet; no other live graph shares its nodes) by replaying its cached
  schedule, as `realize([u])[u]` would: its realized buffer view; None when it has no replay (nothing ran: the caller
  realizes it). The eager hot path of `Tensor.realize` (`(a + 1).realize()`): one kernel launch, no schedule built,
  no graph walked."""
  with lock:
    if (got := _replay_root_locked(u)) is None: return None
    return got[0] if got[1] is None else pending_view(got[1])


Pending = tuple  # (Buffer, DEVICE node, size, dtype, shape or None): see `_replay_root_locked`


def _replay_root_locked(u: UOp) -> tuple[UOp | None, Pending | None] | None:
  """`replay_root(u)` for a caller that holds `lock` already (`Tensor.realize`: taking the re-entrant lock again
  costs ~0.2 us of the eager hot path), with the result's nodes not made yet when its buffer is a new one:
  (view, None) when the root's buffer is an input (one the kernel wrote in place, as an assign's), else
  (None, pending): the replay's new `_EngineBuffer` and what its view is made of, for `pending_view` to make
  when someone reads the node (an eagerly realized result that is dropped unread never interns its UNIQUE, BUFFER
  and RESHAPE nodes: ~3 us of the eager hot path). The pending Buffer belongs to whoever holds the tuple: dropping
  it frees the memory, as dropping the BUFFER node would."""
  if (got := _replay_launch((u,))) is None: return None
  rp, inputs, new = got
  i, shape = rp.outs[0]
  if i < (n_in := len(inputs)):
    b = inputs[i]
    return (b if shape is None else _view(b, shape)), None
  n, dt, _, _, dnode, _ = rp.plan[i - n_in]
  if (buf := new[i - n_in]) is None:  # (no kernel wrote it: a BUFFER node, its Buffer made when first used)
    b = UOp.new_buffer_on(dnode, n, dt)
    return (b if shape is None else _view(b, shape)), None
  return None, (buf, dnode, n, dt, shape)


def pending_view(p: Pending) -> UOp:
  """The buffer view of a replay's pending result (`_replay_root_locked`): a fresh BUFFER node over the recorded
  DEVICE node, the pending Buffer registered on it, reshaped to the root's shape. Made once per result by its
  owner (Tensor keeps the view it returns)."""
  buf, dnode, n, dt, shape = p
  b = UOp.new_buffer_on(dnode, n, dt)
  b._cache["buffer"] = buf
  if shape is None: return b
  v = UOp(_RESHAPE, dt, (b,), shape)  # _view, inlined (new_buffer_on set the device)
  if "shape" not in (c := v._cache): c["shape"], c["device"] = shape, dnode.arg
  return v


def _view(b: UOp, shape: tuple[int, ...]) -> UOp:
  """`b.reshape(shape)` for a new BUFFER `b` and a shape of its size that a recorded schedule validated: the node with
  its shape and device set at once (UOp.reshape would validate the shape again, ~2 us of the eager hot path)."""
  v = UOp(_RESHAPE, b.dtype, (b,), shape)
  if "shape" not in (c := v._cache): c["shape"], c["device"] = shape, b.device
  return v


def plan(uops: list[UOp], expose: Iterable[UOp] = ()) -> Any:
  """The schedule that `realize(uops, expose)` would run (the scheduler caches it by graph structure, so realizing
  the same graphs afterwards doesn't schedule again). Under the engine lock, like a realize's scheduling."""
  from tiny_codegen.schedule import create_schedule
  with lock: return create_schedule(UOp.sink(*[u for u in uops if not is_realized(u)]), expose)


def realize(uops: list[UOp], expose: Iterable[UOp] = (), replay: bool = True) -> dict[UOp, UOp]:
  """Realize every graph in `uops` that is not a buffer yet; returns the scheduler's `becomes` map (which also
  covers the nodes of `expose` that got a buffer on the way: values other live graphs still use). `replay=False`:
  don't look for a recorded replay (the caller's `replay_root` of these graphs just found none)."""
  todo = [u for u in uops if not is_realized(u)]
  if not todo: return {}
  with lock:
    if replay and not expose and (becomes := _replay(todo)) is not None: return becomes
    sched = plan(todo, expose)
    calls = list(sched.calls)
    before = _totals() if DEBUG >= 1 else None
    run_schedule(calls, dict(getattr(sched, "var_vals", {}) or {}))
    if before is not None: _print_realize(calls, before)
    if not expose and (tmpl := getattr(sched, "template", None)) is not None and tmpl.runtime is None:
      tmpl.runtime = _make_replay(sched, todo) or False  # False: this schedule is not replayed
  return dict(sched.becomes)


def _totals() -> tuple[int, int, int, float]:
  return (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum_s)


def _print_realize(calls: list[UOp], before: tuple[int, int, int, float]) -> None:
  """DEBUG>=1: one line per realize: what ran, its time and rate, then the totals since GlobalCounters.reset()."""
  k, ops, mem, t = (a - b for a, b in zip(_totals(), before))
  copies = sum(c.src[0].op is Ops.COPY for c in calls)
  tot = _totals()
  print(f"realize: {k} kernels, {copies} copies, {t*1e3:.3f} ms, {ops/max(t, 1e-9)*1e-9:.2f} GFLOPS, "
        f"{mem/max(t, 1e-9)*1e-9:.2f} GB/s | total: {tot[0]} kernels, {tot[3]*1e3:.3f} ms, {tot[1]*1e-9:.3f} GFLOP, "
        f"{tot[2]*1e-6:.3f} MB")
