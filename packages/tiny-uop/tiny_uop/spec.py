"""Spec: which UOps may appear at each stage of the pipeline, and `type_verify` to check a graph against it.

A spec is a `PatternMatcher` whose rules return True (the node is fine) or False / a string saying what is wrong.
A node no rule matches is an op that is not allowed at that stage. The stages (docs/PIPELINE.md):

  tensor_spec    the tensor graph (§1): BUFFER, CONST, movement ops, elementwise ops, REDUCE_AXIS, COPY, ASSIGN, ...
  kernel_spec    the kernel AST the scheduler hands to codegen (§3): SINK of STOREs over INDEX(PARAM), RANGE, REDUCE
  program_spec   the linear uops a renderer gets (§4): no REDUCE, loops as RANGE/END, SPECIAL, DEFINE_REG, IF, ...

`maybe_verify(sink, spec, stage)` verifies only when the `SPEC` flag is set: passes call it between stages.

>>> from tiny_uop import UOp, dtypes
>>> type_verify(UOp.variable("n", 1, 8) + 1, kernel_spec)   # fine: returns None
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from tiny_uop.dtype import AddrSpace, DType, ImageDType, PtrDType, dtypes
from tiny_uop.helpers import SPEC
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import AxisType, GroupOp, KernelInfo, Ops, UOp, pretty_print

__all__ = ["SpecError", "kernel_spec", "maybe_verify", "program_spec", "tensor_spec", "type_verify", "verify"]


class SpecError(TypeError):
  """A UOp graph breaks the spec of its stage; the message names the node, the spec and the rule."""


Result = bool | str  # True: fine; False or a reason: bad


# ***** shared checks *****
def _is_value(dt: DType) -> bool: return dt is not dtypes.void and not isinstance(dt, PtrDType)


def _const_arg_ok(x: UOp) -> Result:
  dt, arg = x.dtype.scalar(), x.arg
  if not _is_value(x.dtype): return f"a constant needs a value dtype, got {x.dtype!r}"
  if dtypes.is_float(dt):
    return isinstance(arg, float) or f"float constant holds {type(arg).__name__} {arg!r}; use dtypes.as_const"
  if dtypes.is_int(dt):
    if isinstance(arg, bool) or not isinstance(arg, int):
      return f"int constant holds {type(arg).__name__} {arg!r}; use dtypes.as_const"
    return dtypes.min(dt) <= arg <= dtypes.max(dt) or f"constant {arg} is out of range of {x.dtype!r}"
  return isinstance(arg, bool) or f"bool constant holds {type(arg).__name__} {arg!r}"


def _vconst_ok(x: UOp) -> Result:
  if not isinstance(x.arg, tuple) or len(x.arg) != x.dtype.count:
    return f"VCONST of {x.dtype!r} needs a tuple of {x.dtype.count} values, got {x.arg!r}"
  return all(_const_arg_ok(UOp(Ops.CONST, x.dtype.scalar(), arg=a)) is True for a in x.arg) or \
    f"VCONST values {x.arg!r} don't fit {x.dtype!r}"


def _define_var_ok(x: UOp) -> Result:
  if x.src: return "DEFINE_VAR has no sources"
  if not dtypes.is_int(x.dtype): return f"a variable is an integer, got {x.dtype!r}"
  a = x.arg
  if not (isinstance(a, tuple) and len(a) == 3 and isinstance(a[0], str) and isinstance(a[1], int) and
          isinstance(a[2], int) and a[1] <= a[2]):
    return f"DEFINE_VAR arg must be (name, min, max) with min <= max, got {a!r}"
  return True


def _bind_ok(x: UOp) -> Result:
  if len(x.src) != 2 or x.src[0].op is not Ops.DEFINE_VAR or x.src[1].op is not Ops.CONST:
    return "BIND is BIND(DEFINE_VAR, CONST)"
  v, c = x.src
  if not v.arg[1] <= c.arg <= v.arg[2]: return f"bound value {c.arg} outside [{v.arg[1]}, {v.arg[2]}] of {v.arg[0]!r}"
  return x.dtype is v.dtype or f"BIND dtype {x.dtype!r} != variable dtype {v.dtype!r}"


_FLOAT_ONLY = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.FDIV, Ops.LDEXP}
_INT_ONLY = {Ops.SHL, Ops.SHR}
_BITWISE = {Ops.XOR, Ops.OR, Ops.AND}
_NSRC = {**{o: 1 for o in GroupOp.Unary}, **{o: 2 for o in GroupOp.Binary}, **{o: 3 for o in GroupOp.Ternary}}


def _alu_ok(x: UOp) -> Result:
  """Types of an ALU op: operands match the result (comparisons give bool, WHERE takes a bool condition)."""
  op, dt, src = x.op, x.dtype, x.src
  if len(src) != _NSRC[op]: return f"{op} takes {_NSRC[op]} sources, got {len(src)}"
  if not _is_value(dt): return f"{op} can't produce {dt!r}"
  if any(not _is_value(s.dtype) for s in src): return f"{op} on non-values {[s.dtype for s in src]}"
  if op in GroupOp.Comparison:
    if dt.scalar() is not dtypes.bool or dt.count != src[0].dtype.count:
      return f"{op} of {src[0].dtype!r} gives {dtypes.bool.vec(src[0].dtype.count)!r}, not {dt!r}"
    return src[0].dtype is src[1].dtype or f"{op} compares different dtypes {src[0].dtype!r} and {src[1].dtype!r}"
  if op is Ops.WHERE:
    if src[0].dtype.scalar() is not dtypes.bool: return f"WHERE condition is {src[0].dtype!r}, not bool"
    return (src[1].dtype is dt and src[2].dtype is dt) or \
      f"WHERE branches {src[1].dtype!r}, {src[2].dtype!r} must both be {dt!r}"
  if op is Ops.THREEFRY:
    return all(d is dtypes.uint64 for d in (dt, src[0].dtype, src[1].dtype)) or "THREEFRY is uint64 x uint64 -> uint64"
  if op in _INT_ONLY:
    if not dtypes.is_int(dt): return f"{op} needs an integer dtype, got {dt!r}"
    if src[0].dtype is not dt: return f"{op} value is {src[0].dtype!r}, result {dt!r}"
    return src[1].dtype in (dt, dtypes.uint32) or f"{op} count is {src[1].dtype!r}; valid: {dt!r} or dtypes.uint32"
  if op in _FLOAT_ONLY and not dtypes.is_float(dt): return f"{op} needs a float dtype, got {dt!r}"
  if op in _BITWISE and not (dtypes.is_int(dt) or dtypes.is_bool(dt)): return f"{op} needs int or bool, got {dt!r}"
  bad = [s.dtype for s in src if s.dtype is not dt]
  return not bad or f"{op} of {dt!r} has sources of dtype {bad}"


def _cast_ok(x: UOp) -> Result:
  if len(x.src) != 1: return f"{x.op} takes one source"
  s = x.src[0].dtype
  if not _is_value(x.dtype) or not _is_value(s): return f"{x.op} between non-values {s!r} -> {x.dtype!r}"
  if x.op is Ops.CAST and s.count != x.dtype.count: return f"CAST changes the vector width {s!r} -> {x.dtype!r}"
  return True


def _bitcast_same_size(x: UOp) -> Result:
  if (r := _cast_ok(x)) is not True: return r
  s = x.src[0].dtype
  return s.itemsize == x.dtype.itemsize or f"BITCAST {s!r} ({s.itemsize} bytes) -> {x.dtype!r} ({x.dtype.itemsize})"


def _shape_ok(x: UOp) -> Result:
  try: x.shape  # noqa: B018 -- computing the shape validates movement args and elementwise shapes
  except (ValueError, TypeError) as e: return f"bad shape: {e}"
  return True


def _all(*checks: Callable[[UOp], Result]) -> Callable[..., Result]:
  def both(x: UOp) -> Result:
    for c in checks:
      if (r := c(x)) is not True: return r
    return True
  both.__name__ = "+".join(c.__name__ for c in checks)
  return both


def _vectorize_ok(x: UOp) -> Result:
  if len(x.src) != x.dtype.count or x.dtype.count < 2:
    return f"VECTORIZE to {x.dtype!r} needs {x.dtype.count} (>= 2) sources, got {len(x.src)}"
  bad = [s.dtype for s in x.src if s.dtype is not x.dtype.scalar()]
  return not bad or f"VECTORIZE to {x.dtype!r} of sources {bad}"


def _gep_ok(x: UOp) -> Result:
  if len(x.src) != 1 or not isinstance(x.arg, tuple) or not all(isinstance(i, int) for i in x.arg):
    return f"GEP is GEP(vector, arg=tuple of lanes), got arg {x.arg!r}"
  n, s = x.src[0].dtype.count, x.src[0].dtype
  if any(not 0 <= i < n for i in x.arg): return f"GEP lanes {x.arg} out of range of {s!r}"
  return x.dtype is s.scalar().vec(len(x.arg)) or f"GEP {x.arg} of {s!r} gives {s.scalar().vec(len(x.arg))!r}"


def _range_ok(x: UOp) -> Result:
  if len(x.src) != 1 or x.src[0].dtype is not x.dtype: return f"RANGE is RANGE(bound of {x.dtype!r})"
  if not dtypes.is_int(x.dtype): return f"RANGE is an integer, got {x.dtype!r}"
  a = x.arg
  if not (isinstance(a, tuple) and len(a) >= 2 and isinstance(a[0], int) and isinstance(a[1], AxisType)):
    return f"RANGE arg must be (axis_id, AxisType), got {a!r}"
  return True


def _param_ok(x: UOp) -> Result:
  if not isinstance(x.dtype, PtrDType): return f"PARAM is a pointer, got {x.dtype!r}"
  return (isinstance(x.arg, int) and x.arg >= 0) or f"PARAM arg is its slot (int >= 0), got {x.arg!r}"


def _index_ok(x: UOp, bufs: tuple[Ops, ...]) -> Result:
  if len(x.src) not in (2, 3): return f"INDEX is INDEX(buffer, idx[, valid]), got {len(x.src)} sources"
  buf, idx = x.src[0], x.src[1]
  if buf.op not in bufs: return f"INDEX into {buf.op}; valid: {', '.join(o.name for o in bufs)}"
  if not isinstance(buf.dtype, PtrDType): return f"INDEX into a non-pointer {buf.dtype!r}"
  if not dtypes.is_int(idx.dtype): return f"INDEX idx is {idx.dtype!r}, not an integer"
  # (a vector of bools: the lane masks of a masked vector access, docs/PIPELINE.md §3)
  if len(x.src) == 3 and x.src[2].dtype.scalar() is not dtypes.bool:
    return f"INDEX valid is {x.src[2].dtype!r}, not bool"
  return isinstance(x.dtype, PtrDType) and x.dtype.base is buf.dtype.base or \
    f"INDEX gives {x.dtype!r}; expected a pointer to {buf.dtype.base!r}"


def _load_ok(x: UOp) -> Result:
  if not x.src or x.src[0].op is not Ops.INDEX: return "LOAD is LOAD(INDEX, *ordering deps)"
  base = x.src[0].dtype.base if isinstance(x.src[0].dtype, PtrDType) else x.src[0].dtype
  return x.dtype.scalar() is base.scalar() or f"LOAD of {x.dtype!r} from a pointer to {base!r}"


def _store_ok(x: UOp) -> Result:
  if len(x.src) < 2 or x.src[0].op is not Ops.INDEX: return "STORE is STORE(INDEX, value, *ordering deps)"
  if x.dtype is not dtypes.void: return f"STORE is a statement (dtypes.void), got {x.dtype!r}"
  ptr, val = x.src[0].dtype, x.src[1].dtype
  base = ptr.base if isinstance(ptr, PtrDType) else ptr
  return val.scalar() is base.scalar() or f"STORE of {val!r} into a pointer to {base!r}"


def _end_ok(x: UOp) -> Result:
  if len(x.src) < 2 or any(r.op is not Ops.RANGE for r in x.src[1:]): return "END is END(body, *RANGEs)"
  return x.dtype is dtypes.void or f"END is a statement, got {x.dtype!r}"


def _reduce_ok(x: UOp) -> Result:
  if not x.src or any(r.op is not Ops.RANGE for r in x.src[1:]): return "REDUCE is REDUCE(value, *RANGEs)"
  if x.arg not in (Ops.ADD, Ops.MUL, Ops.MAX): return f"REDUCE arg is {x.arg!r}; valid: Ops.ADD, Ops.MUL, Ops.MAX"
  return x.src[0].dtype is x.dtype or f"REDUCE of {x.src[0].dtype!r} gives {x.dtype!r}"


def _void(x: UOp) -> Result: return x.dtype is dtypes.void or f"{x.op} is a statement (dtypes.void), got {x.dtype!r}"


def _no_src(x: UOp) -> Result: return not x.src or f"{x.op} has no sources, got {len(x.src)}"


def _special_ok(x: UOp) -> Result:
  if not isinstance(x.arg, str): return f"SPECIAL arg is its name ('gidx0', 'lidx0', 'core_id'), got {x.arg!r}"
  if not dtypes.is_int(x.dtype): return f"SPECIAL is an integer, got {x.dtype!r}"
  return (len(x.src) == 1 and dtypes.is_int(x.src[0].dtype)) or "SPECIAL is SPECIAL(bound)"


def _define_mem_ok(space: AddrSpace) -> Callable[[UOp], Result]:
  def define_mem(x: UOp) -> Result:
    if not isinstance(x.dtype, PtrDType) or x.dtype.addrspace is not space:
      return f"{x.op} is a pointer in AddrSpace.{space.name}, got {x.dtype!r}"
    return x.dtype.size > 0 or f"{x.op} needs a size, got {x.dtype!r}"
  define_mem.__name__ = f"define_{space.name.lower()}"
  return define_mem


_SHARED = [
  (UPat(Ops.VCONST, name="x"), _vconst_ok),
  (UPat(Ops.DEFINE_VAR, name="x"), _define_var_ok),
  (UPat(Ops.BIND, name="x"), _bind_ok),
  (UPat(GroupOp.ALU, name="x"), _alu_ok),
  (UPat(Ops.CAST, name="x"), _cast_ok),
]

# ***** tensor graph (PIPELINE.md §1) *****


def _tensor_const_ok(x: UOp) -> Result:
  if x.src and (len(x.src) != 1 or x.src[0].op is not Ops.DEVICE): return "graph CONST is CONST(src=(DEVICE,))"
  return _const_arg_ok(x)


def _buffer_ok(x: UOp) -> Result:
  if len(x.src) != 2 or x.src[0].op is not Ops.UNIQUE or x.src[1].op is not Ops.DEVICE:
    return "BUFFER is BUFFER(UNIQUE, DEVICE, arg=size)"
  if not _is_value(x.dtype) and not isinstance(x.dtype, ImageDType): return f"BUFFER of {x.dtype!r}"
  return (isinstance(x.arg, int) and x.arg >= 0) or isinstance(x.arg, UOp) or f"BUFFER size {x.arg!r}"


def _device_ok(x: UOp) -> Result:
  if x.src: return "DEVICE has no sources"
  ok = isinstance(x.arg, str) or (isinstance(x.arg, tuple) and all(isinstance(d, str) for d in x.arg))
  return ok or f"DEVICE arg is a device name (or a tuple of them), got {x.arg!r}"


def _same_dtype_as_src0(x: UOp) -> Result:
  if not x.src: return f"{x.op} needs a source"
  return x.dtype is x.src[0].dtype or f"{x.op} of {x.src[0].dtype!r} must keep it, got {x.dtype!r}"


def _movement_ok(x: UOp) -> Result:
  if len(x.src) != 1: return f"{x.op} takes one source (symbolic sizes live in its arg)"
  return isinstance(x.arg, tuple) or f"{x.op} arg must be a tuple, got {x.arg!r}"


def _reduce_axis_ok(x: UOp) -> Result:
  a = x.arg
  if len(x.src) != 1 or not (isinstance(a, tuple) and len(a) == 2 and isinstance(a[1], tuple)):
    return f"REDUCE_AXIS is REDUCE_AXIS(x, arg=(op, axes)), got arg {a!r}"
  return a[0] in (Ops.ADD, Ops.MUL, Ops.MAX) or f"REDUCE_AXIS op is {a[0]!r}; valid: Ops.ADD, Ops.MUL, Ops.MAX"


def _copy_ok(x: UOp) -> Result:
  return (len(x.src) == 2 and x.src[1].op is Ops.DEVICE) or "COPY is COPY(x, DEVICE)"


def _assign_ok(x: UOp) -> Result:
  if len(x.src) < 2: return "ASSIGN is ASSIGN(target, value)"
  return x.src[1].dtype is x.dtype or f"ASSIGN of a {x.src[1].dtype!r} value to a {x.dtype!r} target"


def _tensor_bitcast_ok(x: UOp) -> Result: return _cast_ok(x)  # sizes may differ: the last dim rescales


tensor_spec = PatternMatcher([
  (UPat(Ops.SINK, name="x"), _void),
  (UPat(Ops.DEVICE, name="x"), _device_ok),
  (UPat(Ops.UNIQUE, name="x"), lambda x: (isinstance(x.arg, int) and not x.src) or "UNIQUE is UNIQUE(arg=int)"),
  (UPat(Ops.BUFFER, name="x"), _buffer_ok),
  (UPat(Ops.CONST, name="x"), _tensor_const_ok),
  (UPat(Ops.DEFINE_VAR, name="x"), _define_var_ok),
  (UPat(Ops.BIND, name="x"), _bind_ok),
  (UPat(GroupOp.Movement, name="x"), _all(_movement_ok, _same_dtype_as_src0, _shape_ok)),
  (UPat(GroupOp.ALU, name="x"), _all(_alu_ok, _shape_ok)),
  (UPat(Ops.CAST, name="x"), _all(_cast_ok, _shape_ok)),
  (UPat(Ops.BITCAST, name="x"), _all(_tensor_bitcast_ok, _shape_ok)),
  (UPat(Ops.REDUCE_AXIS, name="x"), _all(_reduce_axis_ok, _same_dtype_as_src0, _shape_ok)),
  (UPat((Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH), name="x"),
   _all(lambda x: len(x.src) == 1 or f"{x.op} takes one source", _same_dtype_as_src0)),
  (UPat(Ops.COPY, name="x"), _all(_copy_ok, _same_dtype_as_src0)),
  (UPat(Ops.ASSIGN, name="x"), _all(_assign_ok, _same_dtype_as_src0, _shape_ok)),
], name="tensor_spec")
"""The tensor graph (PIPELINE.md §1): what tiny-tensor builds and the scheduler takes."""


def _wmma_ok(x: UOp) -> Result:
  """WMMA(a, b, c): a tensor-core multiply-accumulate of per-lane vector fragments, c and the result alike."""
  if len(x.src) != 3: return f"WMMA is WMMA(a, b, c), got {len(x.src)} sources"
  if x.src[2].dtype != x.dtype: return f"WMMA's accumulator {x.src[2].dtype!r} differs from its result {x.dtype!r}"
  a, b = x.src[0].dtype, x.src[1].dtype
  return a.scalar() == b.scalar() or f"WMMA's A and B types differ: {a!r} vs {b!r}"


# ***** kernel AST (PIPELINE.md §3) *****


def _kernel_sink_ok(x: UOp) -> Result:
  if not isinstance(x.arg, KernelInfo): return f"a kernel's SINK carries a KernelInfo, got {x.arg!r}"
  bad = [s.op for s in x.src if s.op not in (Ops.STORE, Ops.END, Ops.GROUP)]
  return not bad or f"a kernel's SINK holds STOREs (or their ENDs), got {bad}"


kernel_spec = PatternMatcher([
  (UPat(Ops.SINK, name="x"), _kernel_sink_ok),
  (UPat(Ops.CONST, name="x"), _all(_no_src, _const_arg_ok)),
  *_SHARED,
  (UPat(Ops.BITCAST, name="x"), _bitcast_same_size),
  (UPat(Ops.PARAM, name="x"), _param_ok),
  (UPat(Ops.INDEX, name="x"), lambda x: _index_ok(x, (Ops.PARAM, Ops.DEFINE_LOCAL, Ops.DEFINE_REG))),
  (UPat(Ops.LOAD, name="x"), _load_ok),
  (UPat(Ops.STORE, name="x"), _store_ok),
  (UPat(Ops.END, name="x"), _end_ok),
  (UPat(Ops.GROUP, name="x"), _void),
  (UPat(Ops.RANGE, name="x"), _range_ok),
  (UPat(Ops.REDUCE, name="x"), _reduce_ok),
  (UPat(Ops.VECTORIZE, name="x"), _vectorize_ok),
  (UPat(Ops.GEP, name="x"), _gep_ok),
  (UPat(Ops.WMMA, name="x"), _wmma_ok),
], name="kernel_spec")
"""The kernel AST (PIPELINE.md §3): a SINK of STOREs into INDEX(PARAM) over RANGEs, with LOADs and REDUCEs."""

# ***** linear program (PIPELINE.md §4) *****
program_spec = PatternMatcher([
  (UPat(Ops.SINK, name="x"), _void),
  (UPat(Ops.CONST, name="x"), _all(_no_src, _const_arg_ok)),
  *_SHARED,
  (UPat(Ops.BITCAST, name="x"), _bitcast_same_size),
  (UPat(Ops.PARAM, name="x"), _param_ok),
  (UPat(Ops.SPECIAL, name="x"), _special_ok),
  (UPat(Ops.DEFINE_REG, name="x"), _all(_no_src, _define_mem_ok(AddrSpace.REG))),
  (UPat(Ops.DEFINE_LOCAL, name="x"), _all(_no_src, _define_mem_ok(AddrSpace.LOCAL))),
  (UPat(Ops.INDEX, name="x"), lambda x: _index_ok(x, (Ops.PARAM, Ops.DEFINE_LOCAL, Ops.DEFINE_REG, Ops.AFTER))),
  (UPat(Ops.LOAD, name="x"), _load_ok),
  (UPat(Ops.STORE, name="x"), _store_ok),
  (UPat(Ops.RANGE, name="x"), _range_ok),
  (UPat(Ops.END, name="x"), _end_ok),
  (UPat(Ops.IF, name="x"), lambda x: (len(x.src) >= 1 and x.src[0].dtype is dtypes.bool) or "IF is IF(bool, ...)"),
  (UPat(Ops.ENDIF, name="x"), lambda x: (len(x.src) >= 1 and x.src[0].op is Ops.IF) or "ENDIF is ENDIF(IF)"),
  (UPat((Ops.BARRIER, Ops.GROUP, Ops.NOOP), name="x"), _void),
  (UPat(Ops.AFTER, name="x"), _same_dtype_as_src0),
  (UPat(Ops.VECTORIZE, name="x"), _vectorize_ok),
  (UPat(Ops.GEP, name="x"), _gep_ok),
  (UPat(Ops.WMMA, name="x"), _wmma_ok),
  (UPat((Ops.CUSTOM, Ops.CUSTOMI), name="x"), lambda x: isinstance(x.arg, str) or f"{x.op} arg is target code"),
], name="program_spec")
"""The linear program (PIPELINE.md §4): what renderers take, in execution order."""


# ***** verification *****
def _decide(u: UOp, pm: PatternMatcher) -> tuple[Any, Callable | None]:
  """The first matching rule's verdict on `u` and that rule's function (None, None: no rule matched)."""
  src_ops = {s.op for s in u.src}
  for p, fn, early_reject, wants_ctx in pm.pdict.get(u.op, ()):
    if not early_reject <= src_ops: continue
    for m in p.match(u, {}):
      ret = fn(None, **m) if wants_ctx else fn(**m)
      if ret is not None: return ret, fn
  return None, None


def verify(u: UOp, pm: PatternMatcher) -> Result | None:
  """`pm`'s verdict on one node: True (fine), False or a reason (bad), None (no rule: the op isn't allowed)."""
  return pm.rewrite(u)  # type: ignore[return-value]  # a spec's rules return verdicts, not UOps


def _where(fn: Callable) -> str:
  try: return f"{fn.__name__} ({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
  except (OSError, TypeError): return getattr(fn, "__name__", repr(fn))


def _node_text(u: UOp, max_lines: int = 12) -> str:
  lines = pretty_print(u).splitlines() if u.src else [pretty_print(u)]
  if len(lines) > max_lines: lines = [f"... {len(lines) - max_lines + 1} nodes above ..."] + lines[-max_lines + 1:]
  return "\n".join("    " + ln for ln in lines)


def type_verify(uops: list[UOp] | UOp, spec: PatternMatcher, stage: str | None = None) -> None:
  """Check every node (of a graph, or of a linear list) against `spec`; raise SpecError naming the first bad one.

  A list must also be in dependency order: each node's sources appear before it.
  """
  name = stage or spec.name or "spec"
  linear = not isinstance(uops, UOp)
  nodes: list[UOp] = list(uops.toposort()) if isinstance(uops, UOp) else list(uops)
  seen: set[UOp] = set()
  for i, u in enumerate(nodes):
    if linear:
      if (missing := [s for s in u.src if s not in seen]):
        raise SpecError(f"{name}: uop {i} ({u.op}) uses {len(missing)} source(s) that don't come before it "
                        f"({', '.join(str(s.op) for s in missing)}); a linear program lists sources first:\n"
                        f"{_node_text(u)}")
      seen.add(u)
    ret = verify(u, spec)
    if ret is True: continue
    where = f"uop {i} " if linear else ""
    if ret is None:
      allowed = ", ".join(sorted(o.name for o in spec.pdict))
      raise SpecError(f"{name}: {where}{u.op} is not allowed at this stage (allowed: {allowed}):\n{_node_text(u)}")
    verdict, fn = _decide(u, spec)
    reason = verdict if isinstance(verdict, str) else "the rule returned False"
    rule = _where(fn) if fn is not None else "?"
    raise SpecError(f"{name}: {where}{u.op} {u.dtype!r} fails rule {rule}: {reason}\n{_node_text(u)}")


def maybe_verify(sink: UOp | list[UOp], spec: PatternMatcher, stage_name: str) -> None:
  """`type_verify(sink, spec)` when the SPEC flag is set (`SPEC=1` or `Context(SPEC=1)`); otherwise nothing."""
  if SPEC: type_verify(sink, spec, stage_name)
