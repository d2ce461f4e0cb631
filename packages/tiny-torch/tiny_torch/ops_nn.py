"""The aten ops of indexing, linear algebra and nn layers, and the ops that see TinyTensors themselves (copies between
devices, `.item()`, random numbers drawn on the CPU, `*_scatter`), registered into `tiny_torch.ops`' tables (see
its docstring for what a registered function gets and returns)."""
from __future__ import annotations

import math
from typing import Any, Callable, Literal

import numpy as np
import torch
from tiny_tensor import Tensor, dtypes

from tiny_torch import _core as B
from tiny_torch._table import RESULT, SPECIAL, op, special

aten = torch.ops.aten


# ***** indexing *****

def _norm_indices(x: Tensor, indices: list[Any]) -> list[Tensor | None]:
  """Index tensors for torch's `indices` (None = the whole dim): bool masks become their nonzero positions (a host
  read, as torch's CPU kernel does), negative positions wrap."""
  out: list[Tensor | None] = []
  d = 0
  for ix in indices:
    if ix is None:
      out.append(None)
      d += 1
    elif ix.dtype == dtypes.bool:
      nz = np.nonzero(ix.numpy())
      for a in nz:
        out.append(Tensor(a.astype(np.int32), device=x.device))
      d += ix.ndim
    else:
      ix = ix.cast(dtypes.int32)
      out.append((ix < 0).where(ix + x.shape[d], ix))
      d += 1
  return out + [None] * (x.ndim - len(out))


def _flat_plan(x: Tensor, idx: list[Tensor | None]) -> tuple[Tensor, Tensor, tuple[int, ...], list[int], bool]:
  """(x with the indexed dims first, flattened into one; the linear positions (N,); the broadcast index shape;
  the indexed dims; whether they are adjacent, which keeps the result's index dims in place)."""
  given = [(i, t) for i, t in enumerate(idx) if t is not None]
  if not given: raise ValueError("index: expected at least one index tensor, got none")
  dims = [i for i, _ in given]
  rest = [i for i in range(x.ndim) if i not in dims]
  bshape = tuple(int(n) for n in np.broadcast_shapes(*[tuple(int(n) for n in t.shape) for _, t in given]))
  lin: Tensor | None = None
  for d, t in given:
    t = t.reshape((1,) * (len(bshape) - t.ndim) + tuple(t.shape)).expand(bshape)
    lin = t if lin is None else lin * x.shape[d] + t
  assert lin is not None  # (given is not empty)
  xp = x.permute(*dims, *rest).reshape(math.prod(x.shape[d] for d in dims), *[x.shape[r] for r in rest])
  adjacent = dims == list(range(dims[0], dims[-1] + 1))
  return xp, lin.reshape(math.prod(bshape)), bshape, dims, adjacent


@op(aten.index.Tensor, meta=False)
def _index(x: Tensor, indices: list[Any]) -> Tensor:
  idx = _norm_indices(x, list(indices))
  xp, lin, bshape, dims, adjacent = _flat_plan(x, idx)
  rest_shape = tuple(xp.shape[1:])
  g = xp.gather(0, lin.reshape(-1, *([1] * len(rest_shape))).expand(lin.shape[0], *rest_shape)) if rest_shape \
    else xp.gather(0, lin)
  out = g.reshape(*bshape, *rest_shape)
  if adjacent and dims[0] > 0:  # the index dims stay where the indexed dims were
    nb, before = len(bshape), dims[0]
    out = out.permute(*range(nb, nb + before), *range(nb), *range(nb + before, out.ndim))
  return out


@op(aten.index_put.default, meta=False)
def _index_put(x: Tensor, indices: list[Any], values: Tensor | Any, accumulate: bool = False) -> Tensor:
  idx = _norm_indices(x, list(indices))
  xp, lin, bshape, dims, adjacent = _flat_plan(x, idx)
  rest_shape = tuple(xp.shape[1:])
  if not isinstance(values, Tensor): values = Tensor.full((), values, dtype=x.dtype, device=x.device)
  values = values.cast(x.dtype)
  nb = len(bshape)
  if adjacent and dims[0] > 0:  # values come shaped like x[indices]: move the index dims to the front
    before = dims[0]
    vshape = tuple(rest_shape[:before]) + bshape + tuple(rest_shape[before:])
    values = values.reshape((1,) * (len(vshape) - values.ndim) + tuple(values.shape)).expand(vshape)
    values = values.permute(*range(before, before + nb), *range(before), *range(before + nb, len(vshape)))
  vshape = bshape + rest_shape
  v = values.reshape((1,) * (len(vshape) - values.ndim) + tuple(values.shape)).expand(vshape)
  v = v.reshape(lin.shape[0], *rest_shape)
  ix = lin.reshape(-1, *([1] * len(rest_shape))).expand(lin.shape[0], *rest_shape)
  out = xp.scatter_reduce(0, ix, v, "sum") if accumulate else xp.scatter(0, ix, v)
  rest = [i for i in range(x.ndim) if i not in dims]
  out = out.reshape(*[x.shape[d] for d in dims], *rest_shape)
  order = dims + rest
  return out.permute(*sorted(range(x.ndim), key=lambda k: order[k]))


@op(aten.index_select.default)
def _index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
  if x.ndim == 0: return x.contiguous()  # torch keeps a 0-dim input 0-dim
  dim %= x.ndim
  out = _index(x, [None] * dim + [index.reshape(-1)])
  return out.reshape(()) if x.ndim == 1 and index.ndim == 0 else out


@op(aten.gather.default)
def _gather(x: Tensor, dim: int, index: Tensor, sparse_grad: bool = False) -> Tensor:
  if x.ndim == 0: return x
  index = index.cast(dtypes.int32)
  return x.gather(dim % x.ndim, (index < 0).where(index + x.shape[dim], index))


@op(aten.scatter.src, aten.scatter.value)
def _scatter(x: Tensor, dim: int, index: Tensor, src: Any) -> Tensor:
  if isinstance(src, Tensor): src = src.cast(x.dtype)
  return x.scatter(dim % max(x.ndim, 1), index.cast(dtypes.int32), src)


@op(aten.scatter_add.default)
def _scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
  return x.scatter_reduce(dim % max(x.ndim, 1), index.cast(dtypes.int32), src.cast(x.dtype), "sum")


@op(aten.scatter_reduce.two)
def _scatter_reduce(x: Tensor, dim: int, index: Tensor, src: Tensor,
                    reduce: Literal["sum", "prod", "mean", "amax", "amin"], include_self: bool = True) -> Tensor:
  return x.scatter_reduce(dim % max(x.ndim, 1), index.cast(dtypes.int32), src.cast(x.dtype), reduce,
                          include_self=include_self)


@op(aten.sort.default)
def _sort(x: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
  if x.ndim == 0: return x, Tensor.zeros((), dtype=dtypes.int32, device=x.device)
  return x.sort(dim, descending=descending)


@op(aten.sort.stable)
def _sort_stable(x: Tensor, stable: Any = None, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
  return _sort(x, dim, descending)


@op(aten.topk.default)
def _topk(x: Tensor, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> tuple[Tensor, Tensor]:  # noqa: A002 -- torch's argument name
  if x.ndim == 0: return x, Tensor.zeros((), dtype=dtypes.int32, device=x.device)
  return x.topk(k, dim, largest=largest)


@op(aten.nonzero.default, meta=False)
def _nonzero(x: Tensor) -> Tensor:
  nz = np.stack(np.nonzero(x.numpy().reshape(x.shape)), axis=1) if x.ndim else np.zeros((int(x.item() != 0), 0))
  return Tensor(nz.astype(np.int64), device=x.device) if nz.size else Tensor.zeros(*nz.shape, dtype=dtypes.int64,
                                                                                   device=x.device)


@op(aten.masked_select.default, meta=False)
def _masked_select(x: Tensor, mask: Tensor) -> Tensor:
  shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(mask.shape)))
  m = mask.cast(dtypes.bool).expand(shape).numpy().reshape(-1)
  pos = np.nonzero(m)[0].astype(np.int32)
  flat = x.expand(shape).reshape(-1)
  return flat[Tensor(pos, device=x.device)] if pos.size else Tensor.zeros(0, dtype=x.dtype, device=x.device)


# ***** linear algebra and nn *****

@op(aten.mm.default, aten.bmm.default, promote=RESULT)
def _mm(a: Tensor, b: Tensor) -> Tensor: return a @ b


@op(aten.dot.default, aten.vdot.default, promote=RESULT)
def _dot(a: Tensor, b: Tensor) -> Tensor: return (a * b).sum()


@op(aten.mv.default, promote=RESULT)
def _mv(a: Tensor, b: Tensor) -> Tensor: return a @ b


@op(aten.addmm.default)
def _addmm(x: Tensor, m1: Tensor, m2: Tensor, beta: Any = 1, alpha: Any = 1) -> Tensor:
  prod = m1 @ m2
  if alpha != 1: prod = prod * alpha
  if beta == 0: return prod
  return (x if beta == 1 else x * beta) + prod


@op(aten._softmax.default)
def _softmax(x: Tensor, dim: int, half_to_float: bool) -> Tensor:
  return (x.cast(dtypes.float32) if half_to_float else x).softmax(dim) if x.ndim else x * 0 + 1


@op(aten._log_softmax.default)
def _log_softmax(x: Tensor, dim: int, half_to_float: bool) -> Tensor:
  return (x.cast(dtypes.float32) if half_to_float else x).log_softmax(dim) if x.ndim else x * 0


def _conv(x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any, dilation: Any, transposed: bool,
          output_padding: Any, groups: int) -> Tensor:
  if transposed:
    return x.conv_transpose2d(w, b, groups=groups, stride=list(stride), dilation=list(dilation),
                              padding=list(padding), output_padding=list(output_padding))
  return x.conv2d(w, b, groups=groups, stride=list(stride), dilation=list(dilation), padding=list(padding))


@op(aten.convolution.default, promote=RESULT)
def _convolution(x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any, dilation: Any, transposed: bool,
                 output_padding: Any, groups: int) -> Tensor:
  return _conv(x, w, b, stride, padding, dilation, transposed, output_padding, groups)


def _grads_of(fn: Callable[..., Tensor], grad: Tensor, inputs: list[Tensor | None],
              mask: list[bool]) -> tuple[Tensor | None, ...]:
  """The gradients of fn(*inputs) with output gradient `grad`, for the inputs `mask` asks for, by tiny's autograd
  over fresh leaves (so a backward op is the derivative of the same tiny code as its forward)."""
  leaves = [None if t is None else t.detach().contiguous().requires_grad_(True) for t in inputs]
  out = fn(*leaves)
  want = [lf for lf, m in zip(leaves, mask) if m and lf is not None]
  got = iter(out.gradient(*want, gradient=grad) if want else [])
  return tuple(next(got) if m and lf is not None else None for lf, m in zip(leaves, mask))


def _grad_of(fn: Callable[[Tensor], Tensor], grad: Tensor, x: Tensor) -> Tensor:
  """The gradient of fn(x) for its one input `x` (see _grads_of)."""
  (g,) = _grads_of(fn, grad, [x], [True])
  if g is None: raise RuntimeError("tiny_torch internal error: tiny's autograd gave no gradient for a required input")
  return g


@op(aten.convolution_backward.default)
def _convolution_backward(grad: Tensor, x: Tensor, w: Tensor, bias_sizes: Any, stride: Any, padding: Any,
                          dilation: Any, transposed: bool, output_padding: Any, groups: int,
                          output_mask: Any) -> tuple[Any, ...]:
  gx, gw = _grads_of(lambda a, b: _conv(a, b, None, stride, padding, dilation, transposed, output_padding, groups),
                     grad, [x, w], list(output_mask[:2]))
  gb = grad.sum(tuple(i for i in range(grad.ndim) if i != 1)) if output_mask[2] else None
  return gx, gw, gb


@op(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(x: Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                             ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
  return x.max_pool2d(tuple(kernel_size), tuple(stride) or None, _pair(dilation), _pair(padding), ceil_mode,
                      return_indices=True)


def _pair(v: Any) -> Any: return tuple(v) if isinstance(v, (list, tuple)) else v


@op(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(grad: Tensor, x: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                         ceil_mode: bool, indices: Tensor) -> Tensor:
  def fwd(a: Tensor) -> Tensor:
    return a.max_pool2d(tuple(kernel_size), tuple(stride) or None, _pair(dilation), _pair(padding), ceil_mode)
  return _grad_of(fwd, grad, x)


def _avg(a: Tensor, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool, count_include_pad: bool,
         divisor_override: Any) -> Tensor:
  if divisor_override is not None:
    raise NotImplementedError(f"avg_pool2d: divisor_override={divisor_override} is not supported on the tiny device")
  return a.avg_pool2d(tuple(kernel_size), tuple(stride) or None, 1, _pair(padding), ceil_mode, count_include_pad)


@op(aten.avg_pool2d.default)
def _avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
                count_include_pad: bool = True, divisor_override: Any = None) -> Tensor:
  return _avg(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@op(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(grad: Tensor, x: Tensor, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                         count_include_pad: bool, divisor_override: Any) -> Tensor:
  return _grad_of(lambda a: _avg(a, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
                  grad, x)


# ***** ops that see the TinyTensors themselves *****

def _target_index(device: Any, default: int) -> int:
  return default if device is None else (torch.device(device).index or 0)


@special(aten._to_copy.default)
def _to_copy(x: torch.Tensor, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
             non_blocking: bool = False, memory_format: Any = None) -> torch.Tensor:
  dt = dtype or x.dtype
  if device is not None and torch.device(device).type == "cpu": return B.to_cpu(x).to(dt)
  if device is not None and torch.device(device).type != B.BACKEND:
    return B.to_cpu(x).to(device=device, dtype=dt)
  t = B.read(x)
  idx = _target_index(device, x.device.index or 0)
  if idx != (x.device.index or 0): t = t.to(B.tiny_device_name(idx))
  return B.wrap(t.cast(B.to_tiny_dtype(dt)).contiguous(), dt)


@special(aten.copy_.default)
def _copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
  if isinstance(dst, B.TinyTensor):
    if tuple(np.broadcast_shapes(tuple(src.shape), tuple(dst.shape))) != tuple(dst.shape):
      raise RuntimeError(f"The size of tensor a ({tuple(dst.shape)}) must match the size of tensor b "
                         f"({tuple(src.shape)}) for copy_")
    val = B.read(src) if isinstance(src, B.TinyTensor) else B.read(B.from_torch(src, dst.device.index or 0))
    B.write(dst, val)
  else:
    dst.copy_(B.to_cpu(src))
  return dst


@special(aten._copy_from.default)
def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
  return _copy_(dst, src)


@special(aten._copy_from_and_resize.default)
def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
  """Copy `src` into `dst`, first resizing `dst` to `src`'s shape when they differ (no warning: torch gives none)."""
  if isinstance(dst, B.TinyTensor) and tuple(dst.shape) != tuple(src.shape): B.resize(dst, tuple(src.shape))
  elif not isinstance(dst, B.TinyTensor) and tuple(dst.shape) != tuple(src.shape): dst.resize_(tuple(src.shape))
  return _copy_(dst, src)


@special(aten._local_scalar_dense.default)
def _item(x: torch.Tensor) -> Any: return B.to_cpu(x).item()


@special(aten.equal.default)
def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
  return a.shape == b.shape and bool(torch.equal(B.to_cpu(a), B.to_cpu(b) if isinstance(b, B.TinyTensor) else b))


@special(aten.lift_fresh.default, aten.lift.default)
def _lift(x: torch.Tensor) -> torch.Tensor: return x


@special(aten.is_pinned.default)
def _is_pinned(x: torch.Tensor, device: Any = None) -> bool: return False


@special(aten._fused_sdp_choice.default)
def _sdp_choice(*args: Any, **kwargs: Any) -> int:
  """The math attention (written with aten ops) rather than a fused kernel tiny does not have."""
  return int(torch.nn.attention.SDPBackend.MATH.value) if hasattr(torch.nn, "attention") else 0


@special(aten.resize_.default)
def _resize_(x: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
  """torch's resize_: same storage and offset, new sizes, contiguous strides, the storage grown when too small."""
  return B.resize(x, size, memory_format)


@special(aten.resize_as_.default)
def _resize_as_(x: torch.Tensor, other: torch.Tensor, memory_format: Any = None) -> torch.Tensor:
  """torch's resize_as_: resize_ to `other`'s sizes."""
  return B.resize(x, tuple(other.shape), memory_format)


# random numbers: drawn by torch on the CPU (its generator, so torch.manual_seed reproduces CPU runs), then copied
_RANDOM_INPLACE = [aten.normal_.default, aten.uniform_.default, aten.bernoulli_.float, aten.bernoulli_.Tensor,
                   aten.random_.default, getattr(aten.random_, "from"), aten.random_.to, aten.exponential_.default,
                   aten.geometric_.default, aten.log_normal_.default, aten.cauchy_.default]


def _random_inplace(func: Any) -> Callable[..., torch.Tensor]:
  def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    cpu = torch.empty(tuple(x.shape), dtype=x.dtype)
    args = tuple(B.to_cpu(a) if isinstance(a, B.TinyTensor) else a for a in args)
    func(cpu, *args, **kwargs)
    B.write(x, B.read(B.from_torch(cpu, x.device.index or 0)))
    return x
  return run


for _f in _RANDOM_INPLACE: SPECIAL[_f] = _random_inplace(_f)

_RANDOM_FUNCTIONAL = [aten.bernoulli.default, aten.bernoulli.p, aten.normal.Tensor_float, aten.normal.float_Tensor,
                      aten.normal.Tensor_Tensor, aten.multinomial.default, aten.poisson.default,
                      aten.rand_like.default, aten.randn_like.default, aten.randint_like.default,
                      aten.randint_like.low_dtype]


def _random_functional(func: Any) -> Callable[..., Any]:
  def run(*args: Any, **kwargs: Any) -> Any:
    index = next((a.device.index or 0 for a in args if isinstance(a, B.TinyTensor)), 0)
    kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    out = func(*tree_to_cpu(args), **tree_to_cpu(kwargs))
    return B.from_torch(out, index)
  return run


def tree_to_cpu(tree: Any) -> Any:
  """A pytree with each TinyTensor replaced by a CPU copy."""
  from torch.utils._pytree import tree_map
  return tree_map(lambda a: B.to_cpu(a) if isinstance(a, B.TinyTensor) else a, tree)


for _f in _RANDOM_FUNCTIONAL: SPECIAL[_f] = _random_functional(_f)


def _scatter_into_view(view_op: Any) -> Callable[..., torch.Tensor]:
  """`foo_scatter(x, src, *args)`: a copy of x with `src` written into its `foo(*args)` view."""
  def run(x: torch.Tensor, src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    out = B.wrap(B.read(x).contiguous())
    view = B.dispatch(view_op, (out, *args), kwargs)
    if tuple(view.shape) != tuple(src.shape):
      raise RuntimeError(f"{view_op}: expected src to have a size equal to the slice of self. src size = "
                         f"{list(src.shape)}, slice size = {list(view.shape)}")
    B.write(view, B.read(src) if isinstance(src, B.TinyTensor) else B.read(B.from_torch(src)))
    return out
  return run


SPECIAL[aten.slice_scatter.default] = _scatter_into_view(aten.slice.Tensor)
SPECIAL[aten.select_scatter.default] = _scatter_into_view(aten.select.int)
SPECIAL[aten.diagonal_scatter.default] = _scatter_into_view(aten.diagonal.default)
SPECIAL[aten.as_strided_scatter.default] = _scatter_into_view(aten.as_strided.default)
