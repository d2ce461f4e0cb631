"""The execution engine: turns tensor graphs into running kernels (docs/PIPELINE.md §6).

`realize(uops)` schedules everything not yet realized (`tiny_codegen.schedule.create_schedule`), then runs the CALLs
in order: kernels are compiled once per `(ast, renderer)` with `tiny_codegen.get_program` and loaded on their device;
COPYs go through host memory; SLICEs make zero-copy views. It returns the scheduler's `becomes` map, which
`Tensor.realize` applies to every live tensor.

The engine also owns the BUFFER-UOp -> `tiny_uop.device.Buffer` registry (weak-keyed: a buffer is freed when no graph
refers to its BUFFER node any more) and `GlobalCounters`.
"""
from __future__ import annotations

import time
import weakref
from typing import Any, ClassVar

from tiny_uop.device import Buffer
from tiny_uop.dtype import DType
from tiny_uop.helpers import DEBUG
from tiny_uop.uop import GroupOp, Ops, UOp
from tiny_uop.plugins import Device

__all__ = ["GlobalCounters", "realize", "get_buffer", "buffer_from_bytes", "is_realized", "buffer_view", "run_schedule"]


class GlobalCounters:
  """Counters of the work the engine did: kernels run, FLOPs, bytes moved, time spent (reset with `reset()`).

  >>> from tiny_tensor import Tensor
  >>> GlobalCounters.reset(); _ = (Tensor([1.0, 2.0]) + 1).realize(); GlobalCounters.kernel_count
  1
  """
  global_ops: ClassVar[int] = 0
  global_mem: ClassVar[int] = 0
  time_sum_s: ClassVar[float] = 0.0
  kernel_count: ClassVar[int] = 0
  mem_used: ClassVar[int] = 0  # bytes of buffers the engine holds allocated now (not reset)

  @staticmethod
  def reset() -> None:
    """Zero the counters of work done (global_ops, global_mem, time_sum_s, kernel_count); mem_used stays."""
    GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum_s = 0, 0, 0.0
    GlobalCounters.kernel_count = 0


# ***** the buffer registry *****
_buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()


def _mem_freed(nbytes: int) -> None: GlobalCounters.mem_used -= nbytes


def _track(buf: Buffer) -> Buffer:
  if buf._base is None:
    GlobalCounters.mem_used += buf.nbytes
    weakref.finalize(buf, _mem_freed, buf.nbytes)
  return buf


def _buffer_device(u: UOp) -> str:
  d = u.src[1].arg if len(u.src) > 1 and u.src[1].op is Ops.DEVICE else u.device
  if not isinstance(d, str): raise TypeError(f"BUFFER has no single device: {d!r}")
  return d


def get_buffer(u: UOp) -> Buffer:
  """The `Buffer` behind a BUFFER UOp, created (not yet allocated) on first use."""
  if u.op is not Ops.BUFFER: raise TypeError(f"get_buffer needs a BUFFER UOp, got {u.op}")
  if (b := _buffers.get(u)) is None: b = _buffers[u] = _track(Buffer(_buffer_device(u), u.arg, u.dtype))
  return b


def buffer_from_bytes(device: str, size: int, dtype: DType, data: bytes | memoryview | None) -> UOp:
  """A new BUFFER UOp of `size` elements on `device`, allocated now and filled with `data` (if given)."""
  u = UOp.new_buffer(device, size, dtype)
  buf = get_buffer(u).ensure_allocated()
  if data is not None and size: buf.copyin(memoryview(data))
  return u


def buffer_view(u: UOp) -> tuple[UOp, tuple] | None:
  """(BUFFER, shape) when `u` is a realized buffer (the BUFFER itself or a RESHAPE of it), else None."""
  if u.op is Ops.BUFFER: return u, (u.arg,)
  if u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER: return u.src[0], u.shape  # type: ignore[return-value]
  return None


def is_realized(u: UOp) -> bool: return buffer_view(u) is not None


# ***** running *****
_program_cache: dict[tuple[UOp, type, str], tuple[Any, Any]] = {}


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
  """(ProgramSpec, loaded Program) for a kernel AST on a device, compiled once per (ast, renderer class, arch)."""
  # hot path: the registry's opened devices by canonical name (Device[...] canonicalizes first, ~20 us)
  dev = Device._opened.get(device) or Device[device]
  renderer = dev.renderer
  key = (ast, type(renderer), getattr(renderer, "arch", ""))
  if (ret := _program_cache.get(key)) is None:
    from tiny_codegen import get_program
    spec = get_program(ast, renderer)
    if DEBUG >= 4: print(f"*** {spec.name} on {device}:\n{spec.src}")
    if getattr(spec, "estimates", None) is None:
      try: spec.estimates = {"ops": estimate_ops(ast)}
      except Exception:  # an AST the estimator doesn't understand only loses the FLOP count  # noqa: S110
        pass
    ret = _program_cache[key] = (spec, dev.get_program(spec.name, spec.lib))
  return ret


def _est(spec: Any, name: str) -> int:
  est = getattr(spec, "estimates", None)
  v = getattr(est, name, None) if est is not None else None
  if v is None and isinstance(est, dict): v = est.get(name)
  try: return int(v) if v is not None else 0
  except TypeError: return 0  # a symbolic estimate


def _run_kernel(ast: UOp, bufs: tuple[UOp, ...], var_vals: dict[str, int]) -> None:
  device = _buffer_device(bufs[0])
  spec, prg = _get_runner(ast, device)
  buffers = [get_buffer(b).ensure_allocated() for b in bufs]
  slots = spec.globals if spec.globals else list(range(len(buffers)))
  try: vals = tuple(var_vals[v.arg[0]] for v in spec.vars)
  except KeyError as e: raise RuntimeError(f"kernel {spec.name} needs Variable {e} but no value is bound") from e
  st = time.perf_counter()
  et = prg(*[buffers[i]._buf for i in slots], global_size=spec.global_size, local_size=spec.local_size, vals=vals,
           wait=DEBUG >= 2)
  wall = time.perf_counter() - st
  t = et if et is not None else wall
  ops, mem = _est(spec, "ops"), _est(spec, "mem") or sum(b.nbytes for b in buffers)
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += ops
  GlobalCounters.global_mem += mem
  GlobalCounters.time_sum_s += t
  if DEBUG >= 2:
    print(f"*** {device:8s} {GlobalCounters.kernel_count:4d} {spec.name:32s} {t*1e6:9.2f} us  "
          f"{ops/max(t, 1e-9)*1e-9:8.2f} GFLOPS  {mem/max(t, 1e-9)*1e-9:8.2f} GB/s")


def _run_copy(bufs: tuple[UOp, ...]) -> None:
  dst, src = get_buffer(bufs[0]).ensure_allocated(), get_buffer(bufs[1]).ensure_allocated()
  st = time.perf_counter()
  if dst.nbytes != src.nbytes: raise RuntimeError(f"COPY of {src} into {dst}: sizes differ")
  if dst.nbytes: dst.copyin(src.as_buffer())
  GlobalCounters.global_mem += dst.nbytes
  if DEBUG >= 2:
    print(f"*** {dst.device:8s} copy {dst.nbytes:8d} bytes from {src.device:8s} {(time.perf_counter()-st)*1e6:9.2f} us")


def _run_slice(bufs: tuple[UOp, ...], offset: int) -> None:
  if bufs[0] in _buffers and _buffers[bufs[0]].is_allocated: return
  base = get_buffer(bufs[1])
  _buffers[bufs[0]] = base.view(bufs[0].arg, bufs[0].dtype, offset)


def run_schedule(calls: list[UOp], var_vals: dict[str, int]) -> None:
  """Run a list of CALLs in order (kernels, COPY, SLICE)."""
  for call in calls:
    ast, bufs = call.src[0], call.src[1:]
    if ast.op is Ops.SINK: _run_kernel(ast, bufs, var_vals)
    elif ast.op is Ops.COPY: _run_copy(bufs)
    elif ast.op is Ops.SLICE: _run_slice(bufs, ast.arg or 0)
    else: raise RuntimeError(f"the engine can't run a CALL of {ast.op}")


def realize(uops: list[UOp]) -> dict[UOp, UOp]:
  """Realize every graph in `uops` that is not a buffer yet; returns the scheduler's `becomes` map."""
  todo = [u for u in uops if not is_realized(u)]
  if not todo: return {}
  from tiny_codegen.schedule import create_schedule
  sched = create_schedule(UOp.sink(*todo))
  calls = list(sched.calls)
  run_schedule(calls, dict(getattr(sched, "var_vals", {}) or {}))
  return dict(sched.becomes)
