"""Dynamic shapes under `torch.compile(backend="tiny")`: one TinyJit capture for every size of the dynamic dims.

With `dynamic=True` (or once Dynamo marks a dim dynamic) AOTAutograd's graph takes the sizes of the dynamic dims as
SymInt placeholders (Python ints at run time) and its tensor placeholders have SymInt dims. `SymbolicGraph` runs
such a graph directly on tiny Tensors whose dynamic dims are tiny `Variable`s, so TinyJit captures kernels over
symbolic sizes once and replays them for any size:

1. `SymbolicGraph.plan(gm, example_inputs)` decides at compile time whether the graph can run symbolically: every
   SymInt placeholder is one size symbol, every dynamic dim of a tensor input is exactly one of them, every op is in
   `SYMBOLIC_OPS` (tiny Tensor code known to take symbolic dims), a view, a reshaping view whose sizes are sums and
   products of the symbols, or SymInt arithmetic. Otherwise it returns None with the reason (logged at debug level;
   `CompiledGraph.symbolic_fallback` keeps it) and the graph falls back to a capture per size. An output that is an
   input or a view of one (a training graph's saved input, a weight's transpose) is made outside the jit from the
   call's concrete input (a replay can't return an input); a SymInt output (a size saved for backward) is the call's
   int.
2. A call binds each symbol to `Variable(name, 1, bound)`, `bound` the size's power-of-two bucket (at least
   `MIN_BOUND`): sizes of one bucket share one capture (a kernel's buffers are allocated for the bound, so a bucket
   bound is less than twice the largest size in it, past MIN_BOUND); a larger size opens a new bucket, a new capture.
3. Each tensor input is copied into a buffer of the bound's size and viewed with the symbolic shape; the graph runs
   node by node on tiny Tensors (`SYMBOLIC_OPS`, views as tiny movement ops, SymInt arithmetic on Variables); each
   output is made contiguous and realized, and after the jit call viewed back at the call's concrete shape (its
   dims are the graph's SymInt expressions evaluated at the call's sizes).
"""
from __future__ import annotations

import logging
import math
import operator
from typing import Any, Callable

import torch
from tiny_tensor import Tensor, TinyJit, engine
from tiny_uop import UOp, Variable

from tiny_torch import backend as B

log = logging.getLogger("tiny_torch.dynamo")
MIN_BOUND = 16  # the smallest bucket: sizes 1..16 share a capture

aten, prims = torch.ops.aten, torch.ops.prims


def _shape(s: Any) -> tuple:
  return tuple(s)  # (ints and Variables)


# views and shape ops, as tiny movement ops (they take symbolic sizes)
_VIEWS: dict[Any, Callable[..., Tensor]] = {
  prims.view_of.default: lambda x: x,
  aten.alias.default: lambda x: x,
  aten.detach.default: lambda x: x,
  prims.transpose.default: lambda x, perm: x.permute(*perm),
  aten.permute.default: lambda x, perm: x.permute(*perm),
  aten.t.default: lambda x: x.permute(1, 0) if x.ndim == 2 else x,
  aten.transpose.int: lambda x, a, b: x.transpose(a, b),
  aten.view.default: lambda x, s: x.reshape(_shape(s)),
  aten._unsafe_view.default: lambda x, s: x.reshape(_shape(s)),
  aten.reshape.default: lambda x, s: x.reshape(_shape(s)),
  aten.expand.default: lambda x, s, implicit=False: x.expand(_shape(s)),
  aten.unsqueeze.default: lambda x, d: x.unsqueeze(d),
}

# compute ops whose tiny_torch implementation (tiny_torch.ops.OPS) takes symbolic dims (tested in
# tests/test_dynamic.py); anything else falls back to a capture per size
SYMBOLIC_OPS = {aten.addmm.default, aten.mm.default, aten.bmm.default, aten.relu.default, aten.add.Tensor,
                aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten._softmax.default, aten.exp.default,
                aten.tanh.default, aten.sigmoid.default, aten.neg.default, aten.clone.default, aten.sum.dim_IntList,
                aten.gelu.default, aten.rsqrt.default, aten.sqrt.default, aten.mean.dim, aten.amax.default,
                prims.broadcast_in_dim.default, prims.var.default, prims.sum.default, prims.amax.default,
                prims.add.default, prims.sub.default, prims.mul.default, prims.div.default, prims.exp.default,
                aten.le.Scalar, aten.gt.Scalar, aten.where.self, aten.threshold_backward.default}

# reshaping views whose result is best read from the node's (symbolic) output shape: the SymInt expressions of
# its dims become expressions over the bound Variables
_RESHAPES = {prims.collapse_view.default, prims.split_dim.default, aten.as_strided.default}


def _as_strided_is_reshape(node: torch.fx.Node) -> bool:
  """Whether `as_strided(x, size, stride, 0)` only reshapes: x contiguous from offset 0, the same number of elements,
  contiguous strides for `size` (what a backward's bias gradient does)."""
  x, out = node.args[0].meta.get("val"), node.meta.get("val")
  if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor): return False
  return (x.is_contiguous() and x.storage_offset() == 0 and out.storage_offset() == 0 and
          x.numel() == out.numel() and out.is_contiguous())

_SYM_ARITH = {operator.add, operator.sub, operator.mul, operator.floordiv}


def _sym_of(x: Any) -> Any:
  """The sympy expression of a SymInt (None for a plain int)."""
  return x.node.expr if isinstance(x, torch.SymInt) else None


def _input_view_chain(o: Any) -> list | None:
  """[placeholder, view nodes...] when output node `o` is a tensor input or views of one whose other arguments are
  constants or inputs (sizes), else None."""
  chain = []
  while isinstance(o, torch.fx.Node) and o.op == "call_function" and o.target in _VIEWS:
    if any(n.op != "placeholder" for n in o.all_input_nodes[1:]): return None
    chain.append(o)
    o = o.args[0]
  if not (isinstance(o, torch.fx.Node) and o.op == "placeholder" and isinstance(o.meta.get("val"), torch.Tensor)):
    return None
  return [o] + chain[::-1]


def _expr_ok(d: Any, known: set) -> bool:
  """Whether `_as_uop` can write SymInt/int `d`: integers, the known size symbols, sums and products of them."""
  if not isinstance(d, torch.SymInt): return True
  stack = [d.node.expr]
  while stack:
    e = stack.pop()
    if not (e.is_Integer or (e.is_Symbol and e in known) or e.is_Add or e.is_Mul): return False
    stack.extend(e.args)
  return True


def _as_uop(d: Any, bound: dict) -> Any:
  """A SymInt dim as an int or an expression over the bound Variables (sums and products of sizes; anything else is
  a NotImplementedError naming it)."""
  if not isinstance(d, torch.SymInt): return int(d)
  stack, order = [d.node.expr], []  # post-order walk of the sympy expression, without recursion
  while stack:
    e = stack.pop()
    order.append(e)
    stack.extend(e.args)
  vals: dict[Any, Any] = {}
  for e in reversed(order):
    if e.is_Integer: vals[e] = int(e)
    elif e.is_Symbol and e in bound: vals[e] = bound[e]
    elif e.is_Add or e.is_Mul:
      parts = [vals[x] for x in e.args]
      acc = parts[0]
      for p in parts[1:]: acc = acc + p if e.is_Add else acc * p
      vals[e] = acc
    else: raise NotImplementedError(f"tiny_torch: the symbolic size {d} has no tiny expression")  # (plan() checks)
  return vals[d.node.expr]


def bucket(n: int) -> int:
  """The Variable bound for size n: the power of two >= n, at least MIN_BOUND."""
  return max(MIN_BOUND, 1 << max(int(n) - 1, 0).bit_length())


def _buffer_of(t: Tensor) -> UOp:
  """The BUFFER of a realized contiguous tiny Tensor (what the symbolic views are cut from)."""
  view = engine.buffer_view(t.uop)
  if view is None: raise RuntimeError(f"tiny_torch internal error: expected a realized buffer, got a {t.uop.op} graph")
  return view[0]


class SymbolicGraph:
  """One aten graph run over tiny Variables for its dynamic dims (see the module docstring)."""

  def __init__(self, gm: torch.fx.GraphModule, syms: dict[int, Any], dims: dict[int, tuple],
               outs: list[tuple | list | int | None]) -> None:
    self.gm = gm
    self.syms = syms  # placeholder position -> sympy symbol (the SymInt inputs)
    self.dims = dims  # placeholder position -> per dim: an int or a sympy symbol (the tensor inputs)
    # per output: its dims as ints or sympy expressions, or the view chain from the input it is, or the position of
    # the SymInt input it is, or None
    self.outs = outs
    self.places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    self.names = {s: f"tiny_dyn_{k}" for k, s in enumerate(syms.values())}
    self.captures: dict[tuple, TinyJit] = {}  # bucket per symbol -> its TinyJit (tests count them)
    self._bound: dict[Any, Any] = {}  # symbol -> its bound Variable, for the call being run

  @staticmethod
  def plan(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> tuple[SymbolicGraph | None, str]:
    """(a SymbolicGraph, "") when the graph can run over Variables, else (None, why not)."""
    syms = {i: _sym_of(x) for i, x in enumerate(example_inputs) if isinstance(x, torch.SymInt)}
    if not syms: return None, "no dynamic sizes"
    if not all(e is not None and e.is_Symbol for e in syms.values()):
      return None, "a SymInt input is an expression, not one size"
    known = set(syms.values())
    dims: dict[int, tuple] = {}
    for i, x in enumerate(example_inputs):
      if isinstance(x, torch.Tensor):
        d = tuple(_sym_of(s) if isinstance(s, torch.SymInt) else int(s) for s in x.shape)
        if any(not isinstance(s, int) and s not in known for s in d):
          return None, f"input {i}'s dims {tuple(x.shape)} are not each one SymInt input"
        dims[i] = d
      elif not isinstance(x, torch.SymInt): return None, f"input {i} is a {type(x).__name__}"
    for node in gm.graph.nodes:
      if node.op != "call_function": continue
      t = node.target
      if t is aten.as_strided.default and not _as_strided_is_reshape(node):
        return None, f"{node.name}: as_strided that is not a reshape"
      if t is aten.scalar_tensor.default: continue
      if t in _RESHAPES and not all(_expr_ok(d, known) for d in node.meta["val"].shape):
        return None, f"{t}'s output shape {tuple(node.meta['val'].shape)} is not sums and products of sizes"
      if t in _VIEWS or t in SYMBOLIC_OPS or t in _SYM_ARITH or t in _RESHAPES or t is aten.sym_size.int: continue
      return None, f"op {t} has no symbolic-shape support in tiny_torch"
    (ret,) = [n for n in gm.graph.nodes if n.op == "output"]
    outs: list[tuple | list | int | None] = []
    for o in ret.args[0]:
      if o is None:  # (a backward graph's gradient of an input that needs none)
        outs.append(None)
        continue
      chain = _input_view_chain(o)
      if chain is not None:  # the input itself or a view of it: made from the concrete input at call time
        outs.append(chain)
        continue
      if isinstance(o, torch.fx.Node) and o.op == "placeholder" and isinstance(o.meta.get("val"), torch.SymInt):
        outs.append([n for n in gm.graph.nodes if n.op == "placeholder"].index(o))  # a size saved for backward
        continue
      if not isinstance(o, torch.fx.Node) or not isinstance(o.meta.get("val"), torch.Tensor):
        return None, f"output {o} is not a tensor"
      base = o
      while base.op == "call_function" and base.target in _VIEWS: base = base.args[0]
      if base.op == "placeholder": return None, f"output {o} is a view of an input with computed view arguments"
      outs.append(tuple(_sym_of(s) if isinstance(s, torch.SymInt) else int(s) for s in o.meta["val"].shape))
    return SymbolicGraph(gm, syms, dims, outs), ""

  def _run(self, *args: Any) -> tuple[Tensor, ...]:
    """The graph over symbolic tiny Tensors (what TinyJit captures): its outputs contiguous and realized."""
    from tiny_torch import ops
    env: dict[Any, Any] = {}
    pos = 0
    res: tuple[Tensor, ...] = ()
    for node in self.gm.graph.nodes:
      if node.op == "placeholder":
        env[node] = args[pos]
        pos += 1
      elif node.op == "call_function":
        a, kw = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        t = node.target
        if t in _VIEWS: env[node] = _VIEWS[t](*a, **kw)
        elif t in _RESHAPES: env[node] = a[0].reshape(tuple(_as_uop(d, self._bound) for d in node.meta["val"].shape))
        elif t is aten.sym_size.int: env[node] = a[0].shape[a[1]]
        elif t is aten.scalar_tensor.default:
          dev = kw.get("device")
          env[node] = Tensor.full((), a[0], dtype=B.TORCH_TO_TINY[node.meta["val"].dtype],
                                  device=B.tiny_device_name(dev.index if isinstance(dev, torch.device) else 0))
        elif t in _SYM_ARITH: env[node] = t(*a)
        else:
          want = B.TORCH_TO_TINY[node.meta["val"].dtype]
          if t in ops.PROMOTE: a = tuple(x.cast(want) if isinstance(x, Tensor) and x.dtype != want else x for x in a)
          out = ops.OPS[t](*a, **kw)
          env[node] = out.cast(want) if out.dtype != want else out
      elif node.op == "output":
        res = tuple(env[o].contiguous() for o in node.args[0]
                    if o is not None and o.op != "placeholder" and _input_view_chain(o) is None)
      else: raise NotImplementedError(f"tiny_torch: fx node {node.op} in a symbolic graph")
    Tensor.realize(*res)
    return res

  def __call__(self, args: tuple) -> list[Tensor | int | None]:
    """Run on concrete inputs (tiny Tensors and the sizes as ints): the outputs at the call's concrete shapes (an
    input size saved for backward as that int, a gradient the graph does not compute as None)."""
    values = {s: int(args[i]) for i, s in self.syms.items()}
    key = tuple(bucket(values[s]) for s in self.syms.values())
    bound = {s: Variable(self.names[s], 1, b).bind(values[s]) for s, b in zip(self.syms.values(), key)}
    jargs: list[Any] = []
    for i, a in enumerate(args):
      if i in self.syms: jargs.append(bound[self.syms[i]])
      else: jargs.append(self._symbolic_input(a, self.dims[i], bound, dict(zip(self.syms.values(), key))))
    self._bound = bound  # (read by _run while it is captured)
    jit = self.captures.get(key)
    if jit is None:
      log.debug("tiny_torch: new symbolic TinyJit capture for size bounds %s", key)
      jit = self.captures[key] = TinyJit(self._run)
    computed = iter(jit(*jargs))
    return [o if o is None else args[o] if isinstance(o, int) else self._input_view(o, args) if isinstance(o, list)
            else self._concrete(next(computed), o, values) for o in self.outs]

  def _input_view(self, chain: list, args: tuple) -> Tensor:
    """An output that is a view of an input: the view ops of `chain` on the call's concrete input."""
    env = {p: args[i] for i, p in enumerate(self.places)}
    x = env[chain[0]]
    for node in chain[1:]:
      a, kw = torch.fx.node.map_arg((node.args[1:], node.kwargs), lambda n: env[n])
      x = _VIEWS[node.target](x, *a, **kw)
    return x

  @staticmethod
  def _symbolic_input(t: Tensor, dims: tuple, bound: dict, bounds: dict) -> Tensor:
    """`t` copied into a buffer sized for the bounds, viewed with its dynamic dims as bound Variables."""
    full = tuple(d if isinstance(d, int) else bounds[d] for d in dims)
    padded = t.pad(tuple((0, f - s) for f, s in zip(full, t.shape))).contiguous().realize()
    buf = _buffer_of(padded)
    sym = tuple(d if isinstance(d, int) else bound[d] for d in dims)
    n = math.prod(full)
    view = buf.shrink(((0, n),)).reshape(full) if int(buf.arg) != n else buf.reshape(full)  # (a BUFFER's arg: size)
    return Tensor.from_uop(view.shrink(tuple((0, s) for s in sym)))

  @staticmethod
  def _concrete(o: Tensor, shape: tuple, values: dict) -> Tensor:
    """A realized contiguous symbolic-shaped output as a tiny Tensor of the call's concrete shape."""
    dims = tuple(d if isinstance(d, int) else int(d.xreplace(values)) for d in shape)
    buf = _buffer_of(o)
    return Tensor.from_uop(buf).shrink(((0, math.prod(dims)),)).reshape(dims)
