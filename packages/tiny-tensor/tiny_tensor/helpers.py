"""Small helpers shared by the Tensor modules: device names, shape arguments, broadcasting."""
from __future__ import annotations

from typing import Any

from tiny_uop.plugins import Device
from tiny_uop.uop import GroupOp, Ops, UOp, sint
from tiny_tensor import engine
from tiny_tensor.progress import tqdm, trange  # noqa: F401  (tinygrad keeps its progress bar in helpers)

__all__ = ["ArgumentError", "BroadcastError", "DTypeArgumentError", "argfix", "tqdm", "trange"]


class ArgumentError(ValueError, RuntimeError):
  """An op's argument is invalid (a shape, dim, size or mode it cannot take).

  A ValueError, and also a RuntimeError: the type tinygrad 0.14 (and torch) raise for the same call, so code written
  against either library catches it.
  """


class BroadcastError(ValueError, IndexError):
  """Shapes that do not broadcast together: a ValueError (as numpy raises), and an IndexError as tinygrad 0.14 does."""


class DTypeArgumentError(TypeError, RuntimeError):
  """An op got a tensor of a dtype it does not take; a TypeError, and a RuntimeError as tinygrad 0.14 raises."""

_device_cache: dict[tuple[str | None, str], str] = {}


def _canonical_device(device: Any) -> Any:
  """The canonical name of `device` (or of the default device); an unknown device raises an error naming it. A tuple
  of devices (a sharded tensor's) gives a tuple of canonical names."""
  if isinstance(device, (tuple, list)): return tuple(_canonical_device(d) for d in device)
  from tiny_uop.helpers import DEV
  key = (device, str(DEV.value))
  if (d := _device_cache.get(key)) is not None: return d
  if device is None: d = Device.DEFAULT
  else:
    if not isinstance(device, str):
      raise TypeError(f"device must be a str like 'CPU', got {type(device).__name__} {device!r}")
    d = Device.canonicalize(device)
    Device.plugin(d)  # raises UnknownDeviceError naming the device and what is installed
  _device_cache[key] = d
  return d


def argfix(*x: Any) -> tuple:
  """`f(1, 2)` and `f((1, 2))` both give (1, 2)."""
  if x and isinstance(x[0], (tuple, list)):
    if len(x) != 1: raise ValueError(f"bad arguments {x}: pass a shape as a tuple or as separate ints, not both")
    return tuple(x[0])
  return tuple(x)


def _broadcast_shape(*shapes: tuple[sint, ...]) -> tuple[sint, ...]:
  n = max((len(s) for s in shapes), default=0)
  padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
  out: list[sint] = []
  for dims in zip(*padded):
    non1 = {d for d in dims if not (isinstance(d, int) and d == 1)}
    if len(non1) > 1:
      raise BroadcastError(f"cannot broadcast shapes {', '.join(str(tuple(s)) for s in shapes)}: "
                           f"sizes {sorted(non1, key=str)} differ in one dimension")
    out.append(non1.pop() if non1 else 1)
  return tuple(out)


def _check_shape(shape: tuple) -> tuple:
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, UOp)) or (isinstance(s, int) and s < 0):
      raise ValueError(f"invalid shape {shape}: dims must be non-negative ints")
  return shape


def _view_base(u: UOp) -> str | None:
  """The movement op name if `u` is a pure movement view (other than a plain reshape) of a realized buffer."""
  top, n = u, u
  while n.op in GroupOp.Movement: n = n.src[0]
  if n.op is Ops.BUFFER and top is not n and not engine.is_realized(top): return top.op.name
  return None


def _assign_view(u: UOp) -> tuple[UOp, str | None] | None:
  """(BUFFER, None) if `u` is a view an ASSIGN can write in place: movement ops (reshape, permute, shrink with
  symbolic starts too, flip) over a realized buffer; (BUFFER, op name) when the chain holds an op that has no
  one-to-one place in the buffer (EXPAND, PAD); None when `u` is not a movement view of a realized buffer."""
  n, bad = u, None
  while n.op in GroupOp.Movement and not engine.is_realized(n):
    if n.op in (Ops.EXPAND, Ops.PAD): bad = n.op.name
    n = n.src[0]
  if n is u or not engine.is_realized(n): return None
  return (engine.buffer_view(n) or (n, ()))[0], bad


def _view_bottom(u: UOp) -> UOp:
  """The node under the movement ops and DETACHes on top of `u` (what a view made of them reads)."""
  while u.op in GroupOp.Movement or u.op is Ops.DETACH: u = u.src[0]
  return u


def _writable_view(u: UOp) -> UOp | None:
  """`u` with the DETACHes of its chain dropped, when `u` is a view (movement ops and DETACHes) of a realized buffer
  that is not itself realized: a setitem into it writes through to the buffer (DETACH only cuts gradients: torch's
  and tinygrad's `t.detach()` shares t's storage). None otherwise."""
  chain: list[UOp] = []
  n = u
  while not engine.is_realized(n) and (n.op in GroupOp.Movement or n.op is Ops.DETACH):
    if n.op is not Ops.DETACH: chain.append(n)
    n = n.src[0]
  if n is u or not engine.is_realized(n): return None
  for m in reversed(chain): n = m.replace(src=(n, *m.src[1:]))  # rebuilt bottom up, without the DETACHes
  return n


def _base_buffer(u: UOp) -> UOp | None:
  """The BUFFER under the movement ops of `u`, if any."""
  while u.op in GroupOp.Movement: u = u.src[0]
  return u if u.op is Ops.BUFFER else None
