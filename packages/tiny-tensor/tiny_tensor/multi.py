"""Multi-device tensors: one value split over several devices (`Tensor.shard`), and the collectives between them.

A sharded tensor's UOp is `MULTI(*shards, arg=axis)`: shard i lives on devices[i]; `axis` is the dim it is split
along (equal parts), or None for a full copy on every device (replicated). Its shape is the whole value's and its
device the tuple of devices.

Every op on a MULTI is lowered at once, when the Tensor is built (`lower`): the new node becomes a MULTI of per-device
nodes, so below the top MULTI a tensor's graph is plain single-device graphs that the scheduler runs as usual (COPYs
between devices included). The rules:
- elementwise ops run per shard; operands split differently are first brought to one layout (a replicated operand is
  shrunk to each shard's part; two different axes go through an all-gather);
- movement ops run per shard with the split axis moved (permute), kept (reshape when the split dim maps onto one new
  dim), or, when they cut across the split (pad/shrink/flip on it, other reshapes), after an all-gather;
- a reduction over the split axis reduces each shard, then all-reduces (ring or naive) into a replicated result;
- a COPY to one device gathers the shards there; an ASSIGN writes each shard in place.

Autograd (`gradient`) differentiates the per-device graphs: a replicated root from its first copy, a split root shard
by shard; the gradient of a replicated leaf is all-reduced (data-parallel training), a split leaf's stays split.

>>> from tiny_tensor import Tensor
>>> x = Tensor.arange(8).reshape(4, 2).float().shard(("CPU:0", "CPU:1"), axis=0)
>>> x.device, (x * 2).sum().item()  # CPU:0 is the CPU's canonical name
(('CPU', 'CPU:1'), 56.0)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Sequence

from tiny_uop.dtype import dtypes
from tiny_uop.helpers import RING, prod
from tiny_uop.uop import GroupOp, Ops, UOp, sint
from tiny_tensor.gradient import compute_gradient

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor

__all__ = ["lower", "shard_uop", "allreduce", "gradient", "is_multi"]

_PER_SHARD = GroupOp.Elementwise | {Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD}


def is_multi(u: UOp) -> bool: return u.op is Ops.MULTI


def _shape(u: UOp) -> tuple[sint, ...]:
  """The shape of `u`, a graph-level node (every node this module lowers has one)."""
  if (shape := u.shape) is None: raise ValueError(f"a multi-device {u.op} node has no shape")
  return shape


def _device(u: UOp) -> str:
  """The one device of `u`, a shard (a per-device node)."""
  if not isinstance(dev := u.device, str): raise ValueError(f"a shard's {u.op} is on {dev!r}, not on one device")
  return dev


def _int_size(n: sint, what: str) -> int:
  """`n` as an int: split axes and collective buffers have concrete sizes."""
  if not isinstance(n, int): raise ValueError(f"{what} has the symbolic size {n.render()}; shard concrete sizes only")
  return n


def _devices(m: UOp) -> tuple[str, ...]: return tuple(_device(s) for s in m.src)


def _bounds(n: int, k: int) -> list[tuple[int, int]]:
  return [(i * (n // k), (i + 1) * (n // k)) for i in range(k)]


def shard_uop(u: UOp, devices: Sequence[str], axis: int | None) -> UOp:
  """MULTI of `u` (a single-device value) split along `axis` over `devices` (None: copied to each).

  Raises ValueError for no devices, an axis `u` doesn't have (a 0-d value has none: replicate it with axis=None) and
  a dim that doesn't split evenly."""
  if len(devices) == 0: raise ValueError("can't shard over no devices: devices is empty; give one or more devices")
  shape = _shape(u)
  if axis is not None and not 0 <= axis < len(shape):
    valid = "none (a 0-d tensor has no dim to split; use axis=None to copy it to each device)" if not shape else \
      f"0..{len(shape) - 1} (or negative from the end)"
    raise ValueError(f"can't shard along axis {axis}: the tensor has shape {shape}; valid axes: {valid}")
  spans: list[tuple[int, int] | None] = [None] * len(devices)
  if axis is not None:
    n = shape[axis]
    if not isinstance(n, int) or n % len(devices):
      raise ValueError(f"can't shard dim {axis} of size {n} evenly over {len(devices)} devices {tuple(devices)}")
    spans = list(_bounds(n, len(devices)))
  shards = []
  for d, span in zip(devices, spans):
    part = u if span is None else u.shrink(tuple(span if i == axis else (0, s) for i, s in enumerate(shape)))
    shards.append(part if part.device == d else part.copy_to_device(d))
  return UOp(Ops.MULTI, u.dtype, tuple(shards), axis)


# ***** collectives (on lists of per-device UOps) *****


def _combine(op: Ops, a: UOp, b: UOp) -> UOp:
  if a.dtype == dtypes.bool and op is Ops.ADD: op = Ops.OR
  return a.alu(op, b)


def _allgather(shards: list[UOp], axis: int) -> list[UOp]:
  """Every device gets the whole value: each shard copied over and padded into place, then summed (or-ed)."""
  sizes = [_int_size(_shape(s)[axis], f"an all-gather's axis {axis}") for s in shards]
  total, out = sum(sizes), []
  for dst in shards:
    parts, start = [], 0
    for s, sz in zip(shards, sizes):
      part = s if s.device == dst.device else s.copy_to_device(_device(dst))
      pads = tuple((start, total - start - sz) if i == axis else (0, 0) for i in range(len(_shape(s))))
      parts.append(part.pad(pads))
      start += sz
    acc = parts[0]
    for part in parts[1:]: acc = _combine(Ops.ADD, acc, part)
    out.append(acc)
  return out


def _allreduce_naive(shards: list[UOp], op: Ops) -> list[UOp]:
  """Each device combines every other device's copy with its own."""
  out = []
  for dst in shards:
    acc = dst
    for s in shards:
      if s is not dst: acc = _combine(op, acc, s.copy_to_device(_device(dst)))
    out.append(acc)
  return out


def _allreduce_ring(shards: list[UOp], op: Ops) -> list[UOp]:
  """Reduce-scatter around the ring (chunk c is combined device after device, ending on device c), then every
  device collects the reduced chunks: each link carries 2 (n-1)/n of the data instead of (n-1) times all of it."""
  n, shape = len(shards), _shape(shards[0])
  numel = _int_size(prod(shape), "an all-reduce's buffer")
  csz = -(-numel // n)
  flat = [s.reshape((numel,)).pad(((0, csz * n - numel),)) for s in shards]
  chunks = [[f.shrink(((c * csz, (c + 1) * csz),)) for c in range(n)] for f in flat]  # [device][chunk]
  reduced = []
  for c in range(n):
    at = (c + 1) % n
    acc = chunks[at][c]
    for step in range(1, n):
      nxt = (c + 1 + step) % n
      acc = _combine(op, acc.copy_to_device(_device(shards[nxt])), chunks[nxt][c])
    reduced.append(acc)  # on device c
  out = []
  for d in range(n):
    parts = [r if c == d else r.copy_to_device(_device(shards[d])) for c, r in enumerate(reduced)]
    whole = None
    for c, p in enumerate(parts):
      p = p.pad(((c * csz, (n - 1 - c) * csz),))
      whole = p if whole is None else _combine(Ops.ADD, whole, p)
    assert whole is not None
    out.append(whole.shrink(((0, numel),)).reshape(shape))
  return out


def _allreduce(shards: list[UOp], op: Ops, mode: str | None = None) -> list[UOp]:
  mode = mode or ("ring" if len(shards) > 2 and RING else "naive")
  if mode not in ("ring", "naive"): raise ValueError(f"allreduce mode {mode!r}; valid: 'ring', 'naive'")
  return _allreduce_ring(shards, op) if mode == "ring" else _allreduce_naive(shards, op)


def allreduce(t: Tensor, op: Literal["sum", "max", "prod"] = "sum", mode: str | None = None) -> Tensor:
  """The elementwise `op` of a tensor's shards, on every device (a replicated tensor of one shard's shape).
  `mode`: "ring" or "naive" (default: ring for more than 2 devices, `RING=0` turns it off)."""
  if not is_multi(t.uop): raise ValueError(f"allreduce needs a multi-device tensor, got one on {t.device}")
  ops = {"sum": Ops.ADD, "max": Ops.MAX, "prod": Ops.MUL}
  if op not in ops: raise ValueError(f"allreduce op {op!r}; valid: {sorted(ops)}")
  return type(t)(UOp(Ops.MULTI, t.dtype, tuple(_allreduce(list(t.uop.src), ops[op], mode)), None))


# ***** lowering one op on MULTI sources *****


def _to_axis(m: UOp, axis: int | None) -> list[UOp]:
  """The shards of MULTI `m` laid out along `axis` (None: replicated)."""
  if m.arg == axis: return list(m.src)
  full = list(m.src) if m.arg is None else _allgather(list(m.src), m.arg)
  if axis is None: return full
  n = _int_size(_shape(full[0])[axis], f"a split axis {axis}")
  return [f.shrink(tuple(b if i == axis else (0, s) for i, s in enumerate(_shape(f))))
          for f, b in zip(full, _bounds(n, len(full)))]


def _reshape_axis(old: tuple, new: tuple, axis: int, k: int) -> int | None:
  """The dim of `new` that a reshape maps a split `axis` of `old` onto without crossing shards, or None."""
  pre, inner = prod(old[:axis]), prod(old[axis + 1:])
  for j in range(len(new)):
    if prod(new[:j]) == pre and new[j] % k == 0 and (old[axis] // k * inner) % prod(new[j + 1:]) == 0 and \
       (new[j] // k) * prod(new[j + 1:]) == old[axis] // k * inner:
      return j
  return None


def _lower_node(n: UOp, srcs: list[Any]) -> UOp:
  """`n` with MULTI (or passthrough) sources `srcs` as a MULTI of per-device nodes."""
  multis = [s for s in srcs if isinstance(s, UOp) and is_multi(s)]
  if n.op is Ops.CONST:
    return UOp(Ops.MULTI, n.dtype, tuple(UOp.const(n.dtype, n.arg, d) for d in n.src[0].arg), None)
  m = multis[0]
  k, devs = len(m.src), _devices(m)
  if any(_devices(x) != devs for x in multis):
    raise RuntimeError(f"{n.op}: operands are on different device sets {[_devices(x) for x in multis]}")
  def per_shard(axis: int | None, args: list[Any] | None = None, out_axis: Any = "same") -> UOp:
    """n on each shard, its MULTI sources laid out along `axis`; the result is split along `out_axis`."""
    cols = [(_to_axis(s, axis) if isinstance(s, UOp) and is_multi(s) else [s] * k) for s in srcs]
    out = tuple(UOp(n.op, n.dtype, tuple(c[i] for c in cols), n.arg if args is None else args[i]) for i in range(k))
    return UOp(Ops.MULTI, n.dtype, out, axis if out_axis == "same" else out_axis)
  if n.op in _PER_SHARD or n.op is Ops.ASSIGN:
    axis = m.arg if n.op is Ops.ASSIGN else next((x.arg for x in multis if x.arg is not None), None)
    return per_shard(axis)
  if n.op is Ops.COPY:
    dev = n.src[1].arg
    if not isinstance(dev, str): raise RuntimeError(f"copy of a multi-device tensor to {dev}: use shard()")
    full = _to_axis(m, None) if m.arg is None else _allgather(list(m.src), m.arg)
    return full[0].copy_to_device(dev) if full[0].device != dev else full[0]
  ax = m.arg
  if n.op is Ops.REDUCE_AXIS:
    red = per_shard(ax)  # reduced axes stay (size 1): the split axis keeps its place
    if ax is None or ax not in n.arg[1]: return red
    return UOp(Ops.MULTI, n.dtype, tuple(_allreduce(list(red.src), n.arg[0])), None)
  if ax is None: return per_shard(None)
  if n.op is Ops.PERMUTE: return per_shard(ax, out_axis=n.arg.index(ax))
  shard_len = _shape(m.src[0])[ax]
  if n.op is Ops.EXPAND:
    return per_shard(ax, [tuple(shard_len if i == ax else s for i, s in enumerate(n.arg))] * k)
  if n.op is Ops.RESHAPE:
    if (j := _reshape_axis(_shape(m), n.arg, ax, k)) is not None:
      return per_shard(ax, [tuple(s // k if i == j else s for i, s in enumerate(n.arg))] * k, out_axis=j)
  elif n.op is Ops.SHRINK and n.arg[ax] == (0, _shape(m)[ax]):
    return per_shard(ax, [tuple((0, shard_len) if i == ax else a for i, a in enumerate(n.arg))] * k)
  elif (n.op is Ops.PAD and n.arg[ax] == (0, 0)) or (n.op is Ops.FLIP and not n.arg[ax]): return per_shard(ax)
  # the op cuts across the split: work on full copies
  return per_shard(None)


def lower(u: UOp) -> UOp:
  """`u` (a tensor-graph node on a tuple of devices, over MULTI sources) as one MULTI of per-device graphs."""
  memo: dict[UOp, Any] = {}
  gate = lambda x: not is_multi(x) and (isinstance(x.device, tuple) or x is u)  # noqa: E731
  for n in u.toposort(gate=gate):
    if is_multi(n) or n.op is Ops.DEVICE or (n is not u and not isinstance(n.device, tuple)): memo[n] = n
    elif n.op is Ops.BUFFER: raise RuntimeError(f"a buffer on several devices {n.device}: make one, then shard() it")
    else: memo[n] = _lower_node(n, [memo.get(s, s) for s in n.src])
  return memo[u]


# ***** autograd *****


def gradient(root: Tensor, targets: Sequence[Tensor], grad: Tensor, expand: Any) -> list[Tensor | None]:
  """d(root)/d(target) for multi-device (or plain) tensors; `expand(uop, keep)` looks through realized tensors."""
  T = type(root)
  keep = {s for t in targets for s in (t.uop.src if is_multi(t.uop) else (t.uop,))}
  r, g = root.uop, grad.uop
  if is_multi(r):
    gs = _to_axis(g, r.arg) if is_multi(g) else [g] * len(r.src)
    roots = [(r.src[0], gs[0])] if r.arg is None else list(zip(r.src, gs))
  else: roots = [(r, g)]
  acc: dict[UOp, UOp] = {}
  for ru, gu in roots:
    for k, v in compute_gradient(expand(ru, keep), gu.cast(ru.dtype), keep, stop=keep).items():
      acc[k] = acc[k] + v if k in acc else v
  out: list[Tensor | None] = []
  for t in targets:
    if not is_multi(t.uop):
      out.append(T._new(acc[t.uop]) if t.uop in acc else None)
      continue
    if not any(s in acc for s in t.uop.src):
      out.append(None)
      continue
    parts = [acc.get(s, s.const_like(0)) for s in t.uop.src]
    if t.uop.arg is None: parts = _allreduce(parts, Ops.ADD)  # a replicated leaf: every copy's gradient, summed
    out.append(T._new(UOp(Ops.MULTI, t.dtype, tuple(parts), t.uop.arg)))
  return out
