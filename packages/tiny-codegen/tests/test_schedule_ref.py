"""Two independent numpy references for the scheduler tests (and their own tests).

- `eval_graph`: evaluates a tensor graph directly with numpy (reshape, transpose, pad, ...), never looking at kernels.
- `run_schedule`: executes a schedule's CALLs, evaluating each kernel AST with numpy broadcasting: every RANGE gets its
  own numpy axis, a REDUCE reduces over its ranges' axes, LOAD/STORE index flat buffers (out-of-bounds is an error).
Other scheduler tests import this file by path (pytest runs with --import-mode=importlib).
"""
from __future__ import annotations

import numpy as np

from tiny_uop import AxisType, Ops, UOp, dtypes
from tiny_uop.dtype import DType


def np_dtype(dt: DType) -> np.dtype:
  if dt == dtypes.bool: return np.dtype(np.bool_)
  return np.dtype(dt.fmt)


def _cdiv(a, b):
  q = np.abs(a) // np.maximum(np.abs(b), 1)
  return np.where(b == 0, 0, np.where((a < 0) != (b < 0), -q, q))


ALU = {
  Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b,
  Ops.FDIV: lambda a, b: a / b, Ops.CDIV: _cdiv, Ops.CMOD: lambda a, b: a - _cdiv(a, b) * b,
  Ops.MAX: np.maximum, Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b, Ops.CMPEQ: lambda a, b: a == b,
  Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
  Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b, Ops.POW: np.power,
  Ops.NEG: lambda a: -a if a.dtype != np.bool_ else ~a, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin,
  Ops.SQRT: np.sqrt, Ops.RECIPROCAL: lambda a: 1 / a, Ops.TRUNC: np.trunc,
  Ops.WHERE: np.where, Ops.MULACC: lambda a, b, c: a * b + c,
}


def _alu(u: UOp, vals: list[np.ndarray]) -> np.ndarray:
  with np.errstate(all="ignore"):
    if u.op is Ops.CAST: return np.asarray(vals[0]).astype(np_dtype(u.dtype))
    if u.op is Ops.BITCAST: return np.asarray(vals[0]).view(np_dtype(u.dtype))
    return np.asarray(ALU[u.op](*vals)).astype(np_dtype(u.dtype))


def _sint(x, var_vals):
  return x if isinstance(x, int) else x.sym_infer(var_vals)


def eval_graph(node: UOp, inputs: dict[UOp, np.ndarray], var_vals: dict[str, int] | None = None) -> np.ndarray:
  """The value of a tensor-graph node, computed with numpy operations on whole arrays."""
  var_vals = var_vals or {}
  vals: dict[UOp, np.ndarray] = {}
  for u in node.toposort():
    s = [vals.get(x) for x in u.src]
    si = lambda t: tuple(_sint(x, var_vals) for x in t)  # noqa: E731
    if u.op is Ops.BUFFER: v = inputs[u].reshape(-1)
    elif u.op is Ops.CONST: v = np.array(u.arg, dtype=np_dtype(u.dtype))
    elif u.op is Ops.BIND: v = np.array(u.src[1].arg, dtype=np_dtype(u.dtype))
    elif u.op in (Ops.DEVICE, Ops.UNIQUE, Ops.DEFINE_VAR): v = None
    elif u.op is Ops.RESHAPE: v = s[0].reshape(si(u.arg))
    elif u.op is Ops.PERMUTE: v = s[0].transpose(u.arg)
    elif u.op is Ops.EXPAND: v = np.broadcast_to(s[0], si(u.arg))
    elif u.op is Ops.PAD: v = np.pad(s[0], [si(p) for p in u.arg])
    elif u.op is Ops.SHRINK: v = s[0][tuple(slice(*si(p)) for p in u.arg)]
    elif u.op is Ops.FLIP: v = np.flip(s[0], [i for i, f in enumerate(u.arg) if f]) if any(u.arg) else s[0]
    elif u.op is Ops.REDUCE_AXIS:
      fn = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum}[u.arg[0]]
      v = fn.reduce(s[0], axis=u.arg[1], keepdims=True).astype(s[0].dtype)
    elif u.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.COPY): v = s[0]
    elif u.op is Ops.ASSIGN: v = s[1]
    elif u.op is Ops.SINK: v = None
    else: v = _alu(u, s)
    vals[u] = v
  return np.ascontiguousarray(vals[node])


def eval_kernel(ast: UOp, bufs: list[np.ndarray], var_vals: dict[str, int] | None = None) -> None:
  """Run a kernel AST (a SINK of STOREs) on flat numpy buffers given in PARAM-slot order, in place."""
  var_vals = var_vals or {}
  nodes = list(ast.toposort())
  rngs = [u for u in nodes if u.op is Ops.RANGE]
  pos = {r: i for i, r in enumerate(rngs)}
  sizes: dict[UOp, int] = {}
  vals: dict[UOp, object] = {}
  nd = len(rngs)
  for u in nodes:
    s = [vals.get(x) for x in u.src]
    if u.op is Ops.CONST: v = np.array(u.arg, dtype=np_dtype(u.dtype))
    elif u.op is Ops.DEFINE_VAR: v = np.array(var_vals[u.arg[0]], dtype=np.int64)
    elif u.op is Ops.RANGE:
      n = int(s[0])
      sizes[u] = n
      v = np.arange(n).reshape([n if i == pos[u] else 1 for i in range(nd)])
    elif u.op is Ops.PARAM:
      assert u.dtype.size >= bufs[u.arg].size, f"PARAM {u.arg} is {u.dtype}, the buffer has {bufs[u.arg].size}"
      v = bufs[u.arg]
    elif u.op is Ops.INDEX: v = (s[0], np.asarray(s[1]), np.asarray(s[2]) if len(s) > 2 else None)
    elif u.op is Ops.LOAD:
      buf, idx, valid = s[0]
      if valid is None: valid = np.ones((), bool)
      idx, valid = np.broadcast_arrays(idx, valid)
      safe = np.where(valid, idx, 0)
      assert ((safe >= 0) & (safe < buf.size)).all(), f"out of bounds read: {safe.min()}..{safe.max()} of {buf.size}"
      v = np.where(valid, buf[safe], np.zeros((), buf.dtype))
    elif u.op is Ops.REDUCE:
      axes = tuple(pos[r] for r in u.src[1:])
      shp = [1] * nd
      x = np.asarray(s[0])
      x = x.reshape((1,) * (nd - x.ndim) + x.shape)
      for a, r in zip(axes, u.src[1:]): shp[a] = sizes[r]
      x = np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shp)))
      fn = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum}[u.arg]
      v = fn.reduce(x, axis=axes, keepdims=True).astype(x.dtype)
    elif u.op is Ops.STORE:
      buf, idx, valid = s[0]
      val = np.asarray(s[1])
      shp = np.broadcast_shapes(idx.shape, val.shape, *([valid.shape] if valid is not None else []),
                                tuple(sizes[r] if r.arg[1] is not AxisType.REDUCE else 1 for r in rngs) or ())
      idx, val = np.broadcast_to(idx, shp).reshape(-1), np.broadcast_to(val, shp).reshape(-1)
      if valid is not None:
        m = np.broadcast_to(valid, shp).reshape(-1)
        idx, val = idx[m], val[m]
      assert ((idx >= 0) & (idx < buf.size)).all(), f"out of bounds write: {idx.min()}..{idx.max()} of {buf.size}"
      buf[idx] = val
      v = None
    elif u.op is Ops.SINK: v = None
    else: v = _alu(u, [np.asarray(x) for x in s])
    if u.op is not Ops.PARAM and isinstance(v, np.ndarray) and v.ndim and v.ndim < nd:
      v = v.reshape((1,) * (nd - v.ndim) + v.shape)
    vals[u] = v


def run_schedule(sched, inputs: dict[UOp, np.ndarray]) -> dict[UOp, np.ndarray]:
  """Execute every CALL of a schedule on numpy buffers; returns the buffer environment (BUFFER uop -> flat array).
  New buffers start filled with garbage, so a kernel that reads memory nobody wrote shows up."""
  env: dict[UOp, np.ndarray] = {b: np.ascontiguousarray(a).reshape(-1).copy() for b, a in inputs.items()}

  def get(b: UOp) -> np.ndarray:
    if b not in env:
      dt = np_dtype(b.dtype)
      env[b] = np.full(b.arg, 77 if dt != np.bool_ else True, dtype=dt)
    return env[b]
  for c in sched.calls:
    ast, bufs = c.src[0], c.src[1:]
    if ast.op is Ops.SLICE:
      base = get(bufs[1])
      off = ast.arg // base.dtype.itemsize
      env[bufs[0]] = base[off:off + bufs[0].arg]
    elif ast.op is Ops.COPY: get(bufs[0])[:] = get(bufs[1])
    else: eval_kernel(ast, [get(b) for b in bufs], sched.var_vals)
  return env


def realized_value(sched, env: dict[UOp, np.ndarray], node: UOp) -> np.ndarray:
  """The numpy value a schedule gave `node` (through `becomes`)."""
  rep = sched.becomes[node]
  return eval_graph(rep, env, sched.var_vals)


# ***** tests of the references themselves *****
def test_eval_kernel_reduce_and_pad():
  # out[i] = sum_j (j < 2 ? in[i*2+j] : 0) for a (3, 4) output... built by hand
  out_p, in_p = UOp(Ops.PARAM, dtypes.float32.ptr(3), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(6), arg=1)
  i, j = UOp.range(3, 0), UOp.range(3, 1, AxisType.REDUCE)
  valid = j < 2
  val = in_p.index(i * 2 + j, valid).load().reduce(j, arg=Ops.ADD)
  ast = UOp.sink(out_p.index(i).store(val))
  a, o = np.arange(6, dtype=np.float32), np.zeros(3, np.float32)
  eval_kernel(ast, [o, a])
  np.testing.assert_equal(o, a.reshape(3, 2).sum(1))


def test_eval_graph_movement():
  b = UOp.new_buffer("CPU", 6, dtypes.float32)
  x = b.reshape((2, 3)).permute((1, 0)).pad(((1, 0), (0, 1))).flip((True, False)).shrink(((1, 4), (0, 2)))
  a = np.arange(6, dtype=np.float32)
  ref = np.flip(np.pad(a.reshape(2, 3).T, ((1, 0), (0, 1))), 0)[1:4, 0:2]
  np.testing.assert_equal(eval_graph(x, {b: a}), ref)
