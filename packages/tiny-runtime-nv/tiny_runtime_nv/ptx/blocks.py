"""Straight-line runs of PTX instructions compiled into one Python function each, for the executor's converged path.

A run is the longest sequence of unpredicated non-branch instructions from a pc. Its function does, statement by
statement, what the instruction closures (compile.py) do, without their call layers: an instruction whose closure is
`w(c, f(*sources), m)` (`.spec`: the ALU ops, mov, cvt, cvta.global, selp) becomes one line, its sources read as
the closure's readers read them (`.src`) and its result converted to the register's type as the writer converts it
(the result type is found once by calling `f` on empty columns of the source types: numpy's result type does not
depend on the values); an instruction without `.spec` (memory, setp, atomics, mma, ...) is a call to its closure.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tiny_runtime_nv.ptx.compile import OP, OPERATORS, _same
from tiny_runtime_nv.ptx.values import as_type, fit

Block = tuple[Callable[[Any, Any], int], int]


def block_at(k: Any, pc: int) -> Block | None:
  """The compiled run of instructions of kernel `k` starting at `pc` ((fn(lanes, mask) -> next pc, end)), built once;
  None when the instruction at pc is a branch, barrier, return or predicated."""
  blocks = k.__dict__.setdefault("blocks", {})
  if pc in blocks: return blocks[pc]
  insts, end = k.insts, pc
  while end < len(insts) and insts[end].kind == OP and insts[end].pred is None: end += 1
  blocks[pc] = None if end == pc else (_compile(k, pc, end), end)
  return blocks[pc]


def _compile(k: Any, start: int, end: int) -> Callable[[Any, Any], int]:
  ns: dict[str, Any] = {"np": np}
  lines = ["def block(c, m):", "  R = c.R"]
  for pc in range(start, end):
    fn = k.insts[pc].fn
    code = _inline(pc, fn.spec, ns, getattr(fn, "wrapping", False)) if hasattr(fn, "spec") else None
    if code is None:  # the closure itself; c.at names the instruction if it faults
      ns[f"F{pc}"] = fn
      lines += [f"  c.at = {pc}", f"  F{pc}(c, m)"]
    else: lines += code
  lines.append(f"  return {end}")
  exec(compile("\n".join(lines), f"<ptx {k.name} {start}..{end}>", "exec"), ns)  # noqa: S102 (our own code)
  return ns["block"]


def _inline(pc: int, spec: tuple[Callable[..., Any], list[Any], Any], ns: dict[str, Any],
            wrapping: bool) -> list[str] | None:
  """The lines doing `w(c, f(*srcs), m)` inline, or None when that can't be written ahead of time. A `wrapping` op
  (integer add/sub/mul.lo) whose register operands all have the destination's integer type is computed in that type:
  the same bits, without the signed views."""
  f, srcs, w = spec
  d, rdt = w.dst
  if wrapping and rdt.kind in "iu": srcs = _retyped(srcs, rdt) or srcs
  args, probe, regs = [], [], False
  for j, s in enumerate(srcs):
    meta = getattr(s, "src", None)
    if meta is None: return None
    if meta[0] == "imm":
      ns[f"K{pc}_{j}"] = meta[1]
      args.append(f"K{pc}_{j}")
      probe.append(meta[1])
      continue
    _, i, how, dt, _ = meta
    regs = True
    if how == "same": args.append(f"R[{i}]")
    elif how == "not": args.append(f"~R[{i}]")
    else:
      ns[f"D{pc}_{j}"] = dt
      args.append(f"R[{i}].view(D{pc}_{j})" if how == "view" else f"AS{pc}(R[{i}], D{pc}_{j})")
      ns[f"AS{pc}"] = as_type
    probe.append(np.zeros(0, dt))
  try:
    with np.errstate(all="ignore"): r = f(*probe)
  except (ValueError, TypeError, IndexError, ArithmeticError, NotImplementedError):
    return None  # not writable ahead of time: the instruction runs as its closure (which computes the same thing)
  ns[f"F{pc}"] = f
  if not regs:  # every source a constant: the value is known now; one column of it per lane count
    v0 = as_type(fit(np.asarray(r), rdt), rdt)
    ns[f"C{pc}"] = _const_column(v0)
    value = f"C{pc}(c.L)"
  else:
    if type(r) is not np.ndarray or r.ndim != 1: return None
    m0 = srcs[0].src
    if f is _same and m0[0] == "reg" and m0[2] in ("same", "view") and m0[4] == rdt:  # a move: the bits as they are
      return [f"  v = R[{m0[1]}]", f"  R[{d}] = v if m is None else np.where(m, v, R[{d}])"]
    if f is _same: expr = args[0]
    elif f in OPERATORS and len(args) == 2: expr = f"({args[0]} {OPERATORS[f]} {args[1]})"
    else: expr = f"F{pc}({', '.join(args)})"
    if r.dtype == rdt: value = expr
    elif r.dtype.itemsize == rdt.itemsize and np.bool_ not in (r.dtype, rdt):
      ns[f"W{pc}"] = rdt
      value = f"{expr}.view(W{pc})"
    else:
      ns[f"CV{pc}"] = lambda v, rdt=rdt: as_type(fit(v, rdt), rdt)
      value = f"CV{pc}({expr})"
  return [f"  v = {value}", f"  R[{d}] = v if m is None else np.where(m, v, R[{d}])"]


class _Retyped:
  """A reader as `_inline` should read it, in another type (`src` like a compile.py reader's)."""
  def __init__(self, src: Any): self.src = src


def _retyped(srcs: list[Any], rdt: np.dtype) -> list[Any] | None:
  """The readers of a wrapping op read as the destination's integer type `rdt`, when that changes no bit of the
  result: every register operand a register of type `rdt` (read as it is or through a same-size integer view), every
  immediate a same-size integer (its bits as `rdt`). None when some operand is otherwise."""
  out: list[Any] = []
  for s in srcs:
    meta = getattr(s, "src", None)
    if meta is None: return None
    if meta[0] == "imm":
      v = meta[1]
      if not (isinstance(v, np.integer) and v.dtype.itemsize == rdt.itemsize): return None
      out.append(_Retyped(("imm", np.array(v).view(rdt)[()])))
      continue
    _, i, how, dt, reg_dt = meta
    if reg_dt != rdt or how not in ("same", "view") or dt.kind not in "iu": return None
    out.append(_Retyped(("reg", i, "same", rdt, rdt)))
  return out


def _const_column(v0: np.ndarray) -> Callable[[int], np.ndarray]:
  """L -> the value v0 in every one of L lanes (a read-only broadcast, as the writer makes it), made once per L."""
  cols: dict[int, np.ndarray] = {}

  def col(L: int) -> np.ndarray:
    if (c := cols.get(L)) is None: c = cols[L] = np.broadcast_to(v0, (L,))
    return c
  return col


__all__ = ["block_at", "Block"]
