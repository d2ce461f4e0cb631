"""Autograd over the UOp graph: one gradient rule per op, as a PatternMatcher (`pm_gradient`).

A rule gets `ctx`, the gradient flowing into the node (same shape and dtype as the node), and returns a tuple with one
gradient (or None) per source. `compute_gradient` walks the graph from the root back to the targets.

A composite op may give its result node a gradient of its own with `custom_gradient(out, inputs, fn)`: the walk then
calls `fn(ctx)` for that node's inputs instead of differentiating the nodes inside it (conv2d's input gradient is a
plain transposed convolution, not the scatter that differentiating its sliding windows would give).
"""
from __future__ import annotations

import math
import weakref
from typing import Callable

from tiny_uop.dtype import dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import GroupOp, Ops, UOp, sint
from tiny_uop.helpers import argsort

__all__ = ["pm_gradient", "compute_gradient", "custom_gradient"]

GradFn = Callable[[UOp, UOp], tuple[UOp | None, ...]]
# node -> (its inputs, fn(ctx, node) -> one gradient (or None) per input); weak: forgotten with the graph, so `fn`
# must not hold the node itself (it gets it as an argument)
_custom: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], GradFn]] = weakref.WeakKeyDictionary()


def _local_gradient(node: UOp, ctx: UOp) -> tuple[UOp | None, ...] | None:
  """What `pm_gradient`'s rule for `node` gives: one gradient (or None) per source, or None when no rule matches.
  (Its rules return tuples, which `PatternMatcher.rewrite`'s signature, written for rules giving a UOp, can't say.)"""
  ret: object = pm_gradient.rewrite(node, ctx=ctx)
  if ret is None or isinstance(ret, tuple): return ret
  raise TypeError(f"the gradient rule for {node.op} gave a {type(ret).__name__}, not one gradient per source (a tuple)")


def custom_gradient(out: UOp, inputs: tuple[UOp, ...], fn: GradFn) -> UOp:
  """Make the gradient of `out` with respect to `inputs` `fn(ctx, out)` (one per input, None: no gradient); returns
  `out`. `fn` may call `compute_gradient(out, ctx, targets, custom=False)` to differentiate `out`'s own graph."""
  _custom[out] = (inputs, fn)
  return out


def _shape(u: UOp) -> tuple[sint, ...]:
  """The shape of `u`, a graph-level node (every node autograd differentiates has one)."""
  if (shape := u.shape) is None: raise ValueError(f"a {u.op} with no shape (a kernel-level node) has no gradient")
  return shape


def _reduce_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
  x, (op, axes) = ret.src[0], ret.arg
  shape = _shape(x)
  if op is Ops.ADD: return (ctx.expand(shape),)
  if op is Ops.MAX:  # the gradient is shared equally between the elements equal to the max (like torch's amax)
    is_max = x.eq(ret.expand(shape)).cast(ctx.dtype)
    return (is_max / is_max.r(Ops.ADD, axes).expand(shape) * ctx.expand(shape),)
  if op is Ops.MUL: return ((ctx * ret).expand(shape) / x,)
  return (None,)


def _max_grad(ctx: UOp, ret: UOp) -> tuple[UOp, UOp]:
  x, y = ret.src
  half = ctx * 0.5
  zero = ctx.const_like(0)
  tie = x.eq(y)
  return ((y < x).where(ctx, tie.where(half, zero)), (x < y).where(ctx, tie.where(half, zero)))


def _expand_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  x = ret.src[0]
  axes = tuple(i for i, (s, n) in enumerate(zip(_shape(x), _shape(ret))) if s != n)
  return (ctx.r(Ops.ADD, axes) if axes else ctx,)


def _pad_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  return (ctx.shrink(tuple((b, s + b) for s, (b, _) in zip(_shape(ret.src[0]), ret.arg))),)


def _shrink_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
  return (ctx.pad(tuple((b, s - e) for s, (b, e) in zip(_shape(ret.src[0]), ret.arg))),)


# cos of a node as Tensor.cos builds it (sin(pi/2 - x) rounds pi/2 - x to x's ulp: wrong at large x). Tensor.cos is
# defined above this module (nnops), so tensor.py passes it in with `set_cos` when it defines Tensor.
_COS: list[Callable[[UOp], UOp]] = []


def set_cos(fn: Callable[[UOp], UOp]) -> None:
  """Give the SIN rule its cosine: `fn(x)` is the node of cos(x) (tensor.py passes `Tensor(x).cos().uop`)."""
  _COS[:] = [fn]


def _cos(x: UOp) -> UOp:
  """cos x for d sin x; `set_cos` must have been called (importing tiny_tensor.tensor does)."""
  if not _COS: raise RuntimeError("the gradient of sin needs Tensor.cos: import tiny_tensor.tensor first (set_cos)")
  return _COS[0](x)


pm_gradient = PatternMatcher([
  (UPat(Ops.CAST, name="ret"), lambda ctx, ret: (ctx.cast(ret.src[0].dtype),)),
  (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (-ctx * ret * ret,)),                  # d(1/x) = -1/x^2
  (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (_cos(ret.src[0]) * ctx,)),                # d sin x = cos x
  (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (ret.src[0] * math.log(2)),)),       # d log2 x = 1/(x ln2)
  (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ret * ctx * math.log(2),)),                # d 2^x = 2^x ln2
  (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (ret * 2),)),                        # d sqrt x = 1/(2 sqrt x)
  (UPat(Ops.TRUNC, name="ret"), lambda ctx, ret: (ctx.const_like(0),)),                     # piecewise constant
  (UPat((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.BITCAST, Ops.ASSIGN, Ops.DETACH)), lambda: (None, None)),
  (UPat(Ops.NEG), lambda ctx: (-ctx,)),
  (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),
  (UPat(Ops.SUB), lambda ctx: (ctx, -ctx)),
  (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ret.src[1] * ctx, ret.src[0] * ctx)),
  (UPat(Ops.FDIV, name="ret"), lambda ctx, ret: (ctx / ret.src[1], -ctx * ret.src[0] / (ret.src[1] * ret.src[1]))),
  (UPat(Ops.MAX, name="ret"), _max_grad),
  (UPat(Ops.WHERE, name="ret"), lambda ctx, ret: (None, ret.src[0].where(ctx, ctx.const_like(0)),
                                                   ret.src[0].where(ctx.const_like(0), ctx))),
  (UPat(Ops.REDUCE_AXIS, name="ret"), _reduce_grad),
  (UPat(Ops.CONTIGUOUS), lambda ctx: (ctx,)),
  (UPat(Ops.CONTIGUOUS_BACKWARD), lambda ctx: (ctx.contiguous(),)),
  (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (ctx.reshape(ret.src[0].shape),)),
  (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (ctx.permute(tuple(argsort(ret.arg))),)),
  (UPat(Ops.EXPAND, name="ret"), _expand_grad),
  (UPat(Ops.PAD, name="ret"), _pad_grad),
  (UPat(Ops.SHRINK, name="ret"), _shrink_grad),
  (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip(ret.arg),)),
  (UPat(Ops.COPY, name="ret"), lambda ctx, ret: (ctx.copy_to_device(ret.src[0].device), None)),
], name="gradient")

_NO_GRAD_WALK = {Ops.DETACH, Ops.ASSIGN}


def _path_to_targets(root: UOp, targets: set[UOp]) -> list[UOp]:
  """The nodes of root's graph that lie on a path to some target (sources before users), not crossing DETACH."""
  on_path: dict[UOp, bool] = {}
  for u in root.toposort(gate=lambda u: u.op not in _NO_GRAD_WALK):
    on_path[u] = u in targets or any(on_path.get(s, False) for s in u.src)
  return [u for u, p in on_path.items() if p]


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp], custom: bool = True,
                     stop: set[UOp] | frozenset = frozenset()) -> dict[UOp, UOp]:
  """d(root)/d(target) for each target reachable from root, with `root_grad` as the incoming gradient. `custom=False`:
  the root's own `custom_gradient` is not used (its graph is differentiated). Gradients don't flow on past the nodes
  in `stop` (a sharded tensor's shards, one of which may be a copy of another)."""
  grads: dict[UOp, UOp] = {root: root_grad}
  for node in reversed(_path_to_targets(root, targets)):
    if node not in grads or (node in stop and node is not root): continue
    if (cg := _custom.get(node)) is not None and (custom or node is not root):
      for src, g in zip(cg[0], cg[1](grads[node], node)):
        if g is not None: grads[src] = grads[src] + g if src in grads else g
      continue
    if (local := _local_gradient(node, grads[node])) is None:
      if node.op in GroupOp.ALU or node.op in GroupOp.Movement or node.op is Ops.REDUCE_AXIS:
        raise NotImplementedError(f"no gradient rule for {node.op}")
      continue
    for src, g in zip(node.src, local):
      # an int/bool value is piecewise constant in its float inputs (a cast to int, a comparison, argmax): no
      # gradient flows into it, and none on through the bool/int ops beneath (AND, OR, ...) that have no rule
      if g is None or not dtypes.is_float(src.dtype): continue
      grads[src] = grads[src] + g if src in grads else g
  return {t: grads[t] for t in targets if t in grads}
