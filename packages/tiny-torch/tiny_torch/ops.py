"""The aten ops the tiny device runs itself, as tiny Tensor code, keyed by `OpOverload` (registration next to
definition: `@op(aten.add.Tensor, promote=RESULT)` fills the table with the function under it).

A function in `OPS` gets its arguments unwrapped: TinyTensors as tiny Tensors (their values, read from the storage),
0-dim CPU tensors as Python scalars, everything else as torch passed it. It returns tiny Tensors (or tuples of them);
`backend.dispatch` casts them to the dtypes torch gives the op (from a meta run) and wraps them. `promote` casts the
tensor arguments first: RESULT to `torch.result_type` of the first two arguments (arithmetic and comparisons), OUT to
the op's output dtype (ops that make floats from ints: div, exp, ...).

Every aten op not listed here is decomposed (`DECOMPS`: torch's decomposition table, ops written with smaller aten
ops), or runs its CompositeImplicit decomposition; `SPECIAL` ops see the raw TinyTensors (copies between devices,
`.item()`, random numbers drawn on the CPU, `*_scatter` written through a view).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Literal

import numpy as np
import torch
from torch._decomp import decomposition_table
from tiny_tensor import Tensor, dtypes

from tiny_torch import _core as B
from tiny_torch._table import NO_META, OPS, OUT, PROMOTE, RAW_OUT, RESULT, SPECIAL, op, special

__all__ = ["DECOMPS", "NO_META", "OPS", "OUT", "PROMOTE", "RAW_OUT", "RESULT", "SPECIAL", "op", "special"]

aten = torch.ops.aten


def _axes(x: Tensor, dim: Any) -> tuple[int, ...]:
  if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0): return tuple(range(x.ndim))
  dims = dim if isinstance(dim, (list, tuple)) else [dim]
  return tuple(sorted({d % max(x.ndim, 1) for d in dims}))


def _tdt(dt: Any) -> Any: return B.to_tiny_dtype(dt)


def _float(x: Tensor) -> Tensor:
  return x if dtypes.is_float(x.dtype) else x.cast(dtypes.float32)


# ***** elementwise *****

_UNARY = {aten.abs.default: Tensor.abs, aten.neg.default: Tensor.neg, aten.exp.default: Tensor.exp,
          aten.exp2.default: Tensor.exp2, aten.log.default: Tensor.log, aten.log2.default: Tensor.log2,
          aten.sqrt.default: Tensor.sqrt, aten.rsqrt.default: Tensor.rsqrt, aten.sin.default: Tensor.sin,
          aten.cos.default: Tensor.cos, aten.tan.default: Tensor.tan, aten.sinh.default: Tensor.sinh,
          aten.cosh.default: Tensor.cosh, aten.tanh.default: Tensor.tanh, aten.asin.default: Tensor.asin,
          aten.acos.default: Tensor.acos, aten.atan.default: Tensor.atan, aten.asinh.default: Tensor.asinh,
          aten.acosh.default: Tensor.acosh, aten.atanh.default: Tensor.atanh, aten.sigmoid.default: Tensor.sigmoid,
          aten.erf.default: Tensor.erf, aten.floor.default: Tensor.floor, aten.ceil.default: Tensor.ceil,
          aten.trunc.default: Tensor.trunc, aten.sign.default: Tensor.sign, aten.reciprocal.default: Tensor.reciprocal,
          aten.relu.default: Tensor.relu, aten.silu.default: Tensor.silu, aten.log10.default: Tensor.log10,
          aten.mish.default: Tensor.mish, aten.hardswish.default: Tensor.hardswish,
          aten.hardsigmoid.default: Tensor.hardsigmoid}
for _f, _fn in _UNARY.items(): op(_f, promote=OUT)(lambda x, _fn=_fn: _fn(x))


@op(aten.round.default, promote=OUT)
def _round(x: Tensor) -> Tensor:
  """Half to even, as torch rounds."""
  if not dtypes.is_float(x.dtype): return x
  f = x.floor()
  d = x - f
  even = (f / 2).floor() * 2 == f
  return (d > 0.5).where(f + 1, (d < 0.5).where(f, even.where(f, f + 1)))


@op(aten.expm1.default, promote=OUT)
def _expm1(x: Tensor) -> Tensor:
  """exp(x)-1 without cancellation near 0: (u-1)*x/log(u) with u=exp(x) (Kahan's trick)."""
  u = x.exp()
  return (u == 1).where(x, (u - 1 == -1).where(-1.0, (u - 1) * x / u.log()))


@op(aten.log1p.default, promote=OUT)
def _log1p(x: Tensor) -> Tensor:
  """log(1+x) accurate near 0: log(u)*x/(u-1) with u=1+x (Goldberg)."""
  u = x + 1
  return (u == 1).where(x, u.log() * x / (u - 1))


@op(aten.gelu.default, promote=OUT)
def _gelu(x: Tensor, approximate: str = "none") -> Tensor:
  if approximate == "tanh": return x.gelu()
  if approximate != "none": raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
  return 0.5 * x * (1 + (x / math.sqrt(2)).erf())


@op(aten.logical_not.default)
def _logical_not(x: Tensor) -> Tensor: return x.cast(dtypes.bool).logical_not()


@op(aten.bitwise_not.default)
def _bitwise_not(x: Tensor) -> Tensor: return x.logical_not() if x.dtype == dtypes.bool else x.bitwise_not()


@op(aten.isnan.default)
def _isnan(x: Tensor) -> Tensor:
  return x.isnan() if dtypes.is_float(x.dtype) else Tensor.zeros_like(x).cast(dtypes.bool)


@op(aten.isinf.default)
def _isinf(x: Tensor) -> Tensor:
  return x.isinf() if dtypes.is_float(x.dtype) else Tensor.zeros_like(x).cast(dtypes.bool)


@op(aten.leaky_relu.default, promote=OUT)
def _leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor: return (x > 0).where(x, x * negative_slope)


@op(aten.hardtanh.default, promote=OUT)
def _hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor: return x.clip(min_val, max_val)


@op(aten.elu.default, promote=OUT)
def _elu(x: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Tensor:
  return (x > 0).where(x * scale, ((x * input_scale).exp() - 1) * (alpha * scale))


@op(aten.softplus.default, promote=OUT)
def _softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
  return (x * beta > threshold).where(x, ((x * beta).exp() + 1).log() / beta)


def _binary(fn: Callable[[Any, Any], Tensor], promote: str, *funcs: Any) -> None:
  op(*funcs, promote=promote)(lambda a, b, fn=fn: fn(a, b) if isinstance(a, Tensor) else fn(_scalar_like(a, b), b))


def _scalar_like(a: Any, like: Tensor) -> Tensor: return Tensor.full((), a, dtype=like.dtype, device=like.device)


@op(aten.add.Tensor, aten.add.Scalar, promote=RESULT)
def _add(a: Any, b: Any, alpha: Any = 1) -> Any:
  if not isinstance(a, Tensor): a = _scalar_like(a, b)
  return a + (b if alpha == 1 else b * alpha)


@op(aten.sub.Tensor, aten.sub.Scalar, promote=RESULT)
def _sub(a: Any, b: Any, alpha: Any = 1) -> Any:
  if not isinstance(a, Tensor): a = _scalar_like(a, b)
  return a - (b if alpha == 1 else b * alpha)


_binary(lambda a, b: a * b, RESULT, aten.mul.Tensor, aten.mul.Scalar)
_binary(lambda a, b: a.maximum(b), RESULT, aten.maximum.default)
_binary(lambda a, b: a.minimum(b), RESULT, aten.minimum.default)
_binary(lambda a, b: a == b, RESULT, aten.eq.Tensor, aten.eq.Scalar)
_binary(lambda a, b: a != b, RESULT, aten.ne.Tensor, aten.ne.Scalar)
_binary(lambda a, b: a < b, RESULT, aten.lt.Tensor, aten.lt.Scalar)
_binary(lambda a, b: a <= b, RESULT, aten.le.Tensor, aten.le.Scalar)
_binary(lambda a, b: a > b, RESULT, aten.gt.Tensor, aten.gt.Scalar)
_binary(lambda a, b: a >= b, RESULT, aten.ge.Tensor, aten.ge.Scalar)
_binary(lambda a, b: a.atan2(b) if hasattr(a, "atan2") else _atan2(a, b), OUT, aten.atan2.default)


def _bool(x: Any) -> Any: return x.cast(dtypes.bool) if isinstance(x, Tensor) else bool(x)


_binary(lambda a, b: _bool(a) & _bool(b), RESULT, aten.logical_and.default)
_binary(lambda a, b: _bool(a) | _bool(b), RESULT, aten.logical_or.default)
_binary(lambda a, b: _bool(a) ^ _bool(b), RESULT, aten.logical_xor.default)
_binary(lambda a, b: a & b, RESULT, aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)
_binary(lambda a, b: a | b, RESULT, aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)
_binary(lambda a, b: a ^ b, RESULT, aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)


def _atan2(y: Tensor, x: Tensor) -> Tensor:
  base = (y / x).atan()
  return (x > 0).where(base, (x < 0).where((y >= 0).where(base + math.pi, base - math.pi),
                                           (y > 0).where(math.pi / 2, (y < 0).where(-math.pi / 2, 0.0))))


@op(aten.div.Tensor, aten.div.Scalar, promote=OUT)
def _div(a: Any, b: Any) -> Any:
  if not isinstance(a, Tensor): a = _scalar_like(a, b)
  return a / b


@op(aten.div.Tensor_mode, aten.div.Scalar_mode, promote=RESULT)
def _div_mode(a: Any, b: Any, rounding_mode: str | None = None) -> Any:
  if not isinstance(a, Tensor): a = _scalar_like(a, b)
  if rounding_mode is None: return _float(a) / b
  if rounding_mode not in ("trunc", "floor"):
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")
  if dtypes.is_float(a.dtype): q = a / b
  else:
    q = _float(a) / (b if not isinstance(b, Tensor) else _float(b))
    return (q.trunc() if rounding_mode == "trunc" else q.floor()).cast(a.dtype)
  return q.trunc() if rounding_mode == "trunc" else q.floor()


@op(aten.remainder.Tensor, aten.remainder.Scalar, promote=RESULT)
def _remainder(a: Any, b: Any) -> Any:
  """Python's modulo: the sign of the divisor."""
  if not isinstance(a, Tensor): a = _scalar_like(a, b)
  if dtypes.is_float(a.dtype): return a - (a / b).floor() * b
  r = a.mod(b) if hasattr(a, "mod") else a % b
  return r


@op(aten.fmod.Tensor, aten.fmod.Scalar, promote=RESULT)
def _fmod(a: Any, b: Any) -> Any:
  """C's fmod: the sign of the dividend."""
  if dtypes.is_float(a.dtype): return a - (a / b).trunc() * b
  return a.fmod(b)


@op(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar, promote=RESULT)
def _pow(a: Any, b: Any) -> Any:
  if not isinstance(a, Tensor): a = _scalar_like(a, b)
  return a.pow(b)


@op(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cond: Tensor, a: Any, b: Any) -> Tensor:
  if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype != b.dtype:
    dt = B.TORCH_TO_TINY[torch.promote_types(B.TINY_TO_TORCH[a.dtype], B.TINY_TO_TORCH[b.dtype])]
    a, b = a.cast(dt), b.cast(dt)
  return cond.cast(dtypes.bool).where(a, b)


@op(aten.clamp.default, aten.clamp.Tensor, promote=OUT)
def _clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 -- torch's argument names
  if min is not None: x = x.maximum(min)
  if max is not None: x = x.minimum(max)
  return x


@op(aten.clamp_min.default, aten.clamp_min.Tensor, promote=OUT)
def _clamp_min(x: Tensor, m: Any) -> Tensor: return x.maximum(m)


@op(aten.clamp_max.default, aten.clamp_max.Tensor, promote=OUT)
def _clamp_max(x: Tensor, m: Any) -> Tensor: return x.minimum(m)


@op(aten.lerp.Scalar, aten.lerp.Tensor, promote=OUT)
def _lerp(a: Tensor, b: Tensor, w: Any) -> Tensor: return a + (b - a) * w


# ***** reductions *****

@op(aten.sum.default, aten.sum.dim_IntList)
def _sum(x: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
  if dtype is not None: x = x.cast(_tdt(dtype))
  elif x.dtype == dtypes.bool or (not dtypes.is_float(x.dtype)): x = x.cast(dtypes.int64)
  return x.sum(_axes(x, dim), keepdim=keepdim) if x.ndim else x


@op(aten.mean.default, aten.mean.dim)
def _mean(x: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
  if dtype is not None: x = x.cast(_tdt(dtype))
  return x.mean(_axes(x, dim), keepdim=keepdim) if x.ndim else x


@op(aten.prod.default, aten.prod.dim_int)
def _prod(x: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
  if dtype is not None: x = x.cast(_tdt(dtype))
  elif not dtypes.is_float(x.dtype): x = x.cast(dtypes.int64)
  return x.prod(_axes(x, dim), keepdim=keepdim) if x.ndim else x


@op(aten.amax.default)
def _amax(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
  return x.max(_axes(x, dim), keepdim=keepdim) if x.ndim else x


@op(aten.amin.default)
def _amin(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
  return x.min(_axes(x, dim), keepdim=keepdim) if x.ndim else x


@op(aten.max.default)
def _max_all(x: Tensor) -> Tensor:
  if x.numel() == 0: raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0.")
  return x.max()


@op(aten.min.default)
def _min_all(x: Tensor) -> Tensor:
  if x.numel() == 0: raise RuntimeError("min(): Expected reduction dim to be specified for input.numel() == 0.")
  return x.min()


def _arg(x: Tensor, dim: Any, keepdim: bool, largest: bool) -> Tensor:
  if x.ndim == 0: return Tensor.zeros((), dtype=dtypes.int32, device=x.device)
  if dim is None:
    r = (x.flatten().argmax() if largest else x.flatten().argmin())
    return r.reshape((1,) * x.ndim) if keepdim else r
  return x.argmax(dim, keepdim=keepdim) if largest else x.argmin(dim, keepdim=keepdim)


@op(aten.argmax.default)
def _argmax(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor: return _arg(x, dim, keepdim, True)


@op(aten.argmin.default)
def _argmin(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor: return _arg(x, dim, keepdim, False)


@op(aten.max.dim)
def _max_dim(x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
  if x.ndim == 0: return x, Tensor.zeros((), dtype=dtypes.int32, device=x.device)
  return x.max(dim, keepdim=keepdim), x.argmax(dim, keepdim=keepdim)


@op(aten.min.dim)
def _min_dim(x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
  if x.ndim == 0: return x, Tensor.zeros((), dtype=dtypes.int32, device=x.device)
  return x.min(dim, keepdim=keepdim), x.argmin(dim, keepdim=keepdim)


@op(aten.var.correction)
def _var(x: Tensor, dim: Any = None, correction: Any = None, keepdim: bool = False) -> Tensor:
  return x.var(_axes(x, dim), keepdim=keepdim, correction=1 if correction is None else correction)


@op(aten.any.default, aten.any.dim, aten.any.dims)
def _any(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
  return x.cast(dtypes.bool).any(_axes(x, dim), keepdim=keepdim) if x.ndim else x.cast(dtypes.bool)


@op(aten.all.default, aten.all.dim, aten.all.dims)
def _all(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
  return x.cast(dtypes.bool).all(_axes(x, dim), keepdim=keepdim) if x.ndim else x.cast(dtypes.bool)


@op(aten.cumsum.default)
def _cumsum(x: Tensor, dim: int, dtype: Any = None) -> Tensor:
  if dtype is not None: x = x.cast(_tdt(dtype))
  elif not dtypes.is_float(x.dtype): x = x.cast(dtypes.int64)
  return x.cumsum(dim % x.ndim) if x.ndim else x


@op(aten.cumprod.default)
def _cumprod(x: Tensor, dim: int, dtype: Any = None) -> Tensor:
  if dtype is not None: x = x.cast(_tdt(dtype))
  elif not dtypes.is_float(x.dtype): x = x.cast(dtypes.int64)
  return x.cumprod(dim % x.ndim) if x.ndim else x


# ***** data movement *****

@op(aten.clone.default, aten.lift_fresh_copy.default, aten.alias_copy.default)
def _clone(x: Tensor, memory_format: Any = None) -> Tensor: return x.contiguous()


@op(aten._unsafe_view.default, aten.view_copy.default, aten._reshape_copy.default)
def _unsafe_view(x: Tensor, size: Any) -> Tensor: return x.reshape(tuple(size))


@op(aten.cat.default)
def _cat(tensors: list[Tensor], dim: int = 0) -> Tensor:
  ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]  # torch skips legacy empty (0,) tensors
  if not ts: return tensors[0]
  dt = ts[0].dtype
  for t in ts[1:]:
    dt = B.TORCH_TO_TINY[torch.promote_types(B.TINY_TO_TORCH[dt], B.TINY_TO_TORCH[t.dtype])]
  ts = [t.cast(dt) for t in ts]
  return ts[0].cat(*ts[1:], dim=dim) if len(ts) > 1 else ts[0].contiguous()


@op(aten.constant_pad_nd.default)
def _constant_pad_nd(x: Tensor, pad: Any, value: Any = 0) -> Tensor:
  pads = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]
  full = [(0, 0)] * (x.ndim - len(pads)) + pads[::-1]
  if all(a >= 0 and b >= 0 for a, b in full): return x.pad(tuple(full), value=value)
  return x.pad2d(list(pad), value=value)


@op(aten.flip.default)
def _flip(x: Tensor, dims: Any) -> Tensor: return x.flip(_axes(x, dims)) if dims and x.ndim else x.contiguous()


@op(aten.roll.default)
def _roll(x: Tensor, shifts: Any, dims: Any = ()) -> Tensor:
  return x.roll(list(shifts), list(dims) if dims else None)


@op(aten.repeat.default)
def _repeat(x: Tensor, repeats: Any) -> Tensor: return x.repeat(tuple(repeats))


@op(aten.tril.default)
def _tril(x: Tensor, diagonal: int = 0) -> Tensor: return x.tril(diagonal)


@op(aten.triu.default)
def _triu(x: Tensor, diagonal: int = 0) -> Tensor: return x.triu(diagonal)


@op(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(x: Tensor, mask: Tensor, value: Any) -> Tensor:
  if isinstance(value, Tensor): value = value.cast(x.dtype)
  return mask.cast(dtypes.bool).where(value, x).cast(x.dtype)


@op(aten.fill.Scalar, aten.fill.Tensor)
def _fill(x: Tensor, value: Any) -> Tensor:
  if isinstance(value, Tensor): return value.cast(x.dtype).reshape(()).expand(x.shape).contiguous()
  return Tensor.full(x.shape, value, dtype=x.dtype, device=x.device).contiguous()


@op(aten.zero.default)
def _zero(x: Tensor) -> Tensor: return Tensor.zeros(*x.shape, dtype=x.dtype, device=x.device).contiguous()


def _like(x: Tensor, fill: Any, size: Any = None, dtype: Any = None, device: Any = None) -> Any:
  shape = tuple(x.shape) if size is None else tuple(size)
  dt = B.TINY_TO_TORCH[x.dtype] if dtype is None else dtype
  if device is not None and torch.device(device).type == "cpu": return torch.full(shape, fill, dtype=dt)
  dev = x.device if device is None else B.tiny_device_name(torch.device(device).index)
  return Tensor.full(shape, fill, dtype=_tdt(dt), device=dev).contiguous()


@op(aten.empty_like.default, aten.zeros_like.default)
def _zeros_like(x: Tensor, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
                memory_format: Any = None) -> Any: return _like(x, 0, dtype=dtype, device=device)


@op(aten.ones_like.default)
def _ones_like(x: Tensor, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
               memory_format: Any = None) -> Any: return _like(x, 1, dtype=dtype, device=device)


@op(aten.full_like.default)
def _full_like(x: Tensor, fill_value: Any, dtype: Any = None, layout: Any = None, device: Any = None,
               pin_memory: Any = None, memory_format: Any = None) -> Any:
  return _like(x, fill_value, dtype=dtype, device=device)


@op(aten.new_empty.default, aten.new_zeros.default)
def _new_zeros(x: Tensor, size: Any, dtype: Any = None, layout: Any = None, device: Any = None,
               pin_memory: Any = None) -> Any: return _like(x, 0, size, dtype, device)


@op(aten.new_ones.default)
def _new_ones(x: Tensor, size: Any, dtype: Any = None, layout: Any = None, device: Any = None,
              pin_memory: Any = None) -> Any: return _like(x, 1, size, dtype, device)


@op(aten.new_full.default)
def _new_full(x: Tensor, size: Any, fill_value: Any, dtype: Any = None, layout: Any = None, device: Any = None,
              pin_memory: Any = None) -> Any: return _like(x, fill_value, size, dtype, device)


@op(aten.new_empty_strided.default)
def _new_empty_strided(x: Tensor, size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                       pin_memory: Any = None) -> Any: return _like(x, 0, size, dtype, device)


# ***** the prims some decompositions (torch._refs) lower to *****
prims = torch.ops.prims


@op(prims.var.default)
def _prims_var(x: Tensor, dims: Any, correction: float, output_dtype: Any = None) -> Tensor:
  return x.var(_axes(x, dims), correction=correction)


@op(prims.sum.default)
def _prims_sum(x: Tensor, dims: Any, output_dtype: Any = None) -> Tensor: return x.sum(_axes(x, dims))


@op(prims.amax.default)
def _prims_amax(x: Tensor, dims: Any) -> Tensor: return x.max(_axes(x, dims))


@op(prims.amin.default)
def _prims_amin(x: Tensor, dims: Any) -> Tensor: return x.min(_axes(x, dims))


@op(prims.convert_element_type.default)
def _prims_convert(x: Tensor, dtype: Any) -> Tensor: return x.cast(_tdt(dtype))


@op(aten.var_mean.correction)
def _var_mean(x: Tensor, dim: Any = None, correction: Any = None, keepdim: bool = False) -> tuple[Tensor, Tensor]:
  ax = _axes(x, dim)
  return x.var(ax, keepdim=keepdim, correction=1 if correction is None else correction), x.mean(ax, keepdim=keepdim)


@op(aten.std.correction)
def _std(x: Tensor, dim: Any = None, correction: Any = None, keepdim: bool = False) -> Tensor:
  return x.std(_axes(x, dim), keepdim=keepdim, correction=1 if correction is None else correction)


@op(aten.std_mean.correction)
def _std_mean(x: Tensor, dim: Any = None, correction: Any = None, keepdim: bool = False) -> tuple[Tensor, Tensor]:
  ax = _axes(x, dim)
  return x.std(ax, keepdim=keepdim, correction=1 if correction is None else correction), x.mean(ax, keepdim=keepdim)


@op(prims.broadcast_in_dim.default)
def _prims_broadcast_in_dim(x: Tensor, shape: Any, broadcast_dimensions: Any) -> Tensor:
  """x's dims go to `broadcast_dimensions` of `shape`, the others are broadcast."""
  dims = list(broadcast_dimensions)
  full = [shape[i] if i not in dims else x.shape[dims.index(i)] for i in range(len(shape))]
  return x.reshape(tuple(full[i] if i in dims else 1 for i in range(len(shape)))).expand(tuple(shape))


def _prims_alias(name: str) -> None:
  """prims.<name> means what aten.<name> means for the elementwise ops: share its tiny implementation."""
  p, a = getattr(prims, name, None), getattr(aten, name, None)
  if p is None or a is None: return
  for ov in ("default", "Tensor"):
    if ov in a.overloads() and getattr(a, ov) in OPS:
      op(p.default, promote=PROMOTE.get(getattr(a, ov)))(OPS[getattr(a, ov)])
      return


for _n in ("add", "sub", "mul", "div", "neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos",
           "tan", "tanh", "sigmoid", "erf", "floor", "ceil", "trunc", "sign", "reciprocal", "maximum", "minimum",
           "eq", "ne", "lt", "le", "gt", "ge", "pow", "where", "bitwise_and", "bitwise_or", "bitwise_xor",
           "bitwise_not", "atan2", "fmod", "remainder", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
           "atanh", "log10", "log1p", "expm1", "round", "isnan", "clone", "cat"):
  _prims_alias(_n)


# ***** more elementwise math (what torch's refs lower these ops to) *****

def _both(name: str, pname: str | None = None) -> list[Any]:
  """aten.<name>.default and prims.<pname or name>.default, those that exist."""
  out = [getattr(aten, name).default] if hasattr(aten, name) else []
  p = getattr(prims, pname or name, None)
  return out + ([p.default] if p is not None else [])


@op(*_both("signbit"))
def _signbit(x: Tensor) -> Tensor:
  """x < 0, and -0.0 too (1/-0.0 is -inf)."""
  if not dtypes.is_float(x.dtype): return x < 0
  return (x < 0) | ((x == 0) & (x.reciprocal() < 0))


@op(*_both("fmax"), promote=RESULT)
def _fmax(a: Tensor, b: Tensor) -> Tensor:
  """max ignoring a NaN (NaN only when both are)."""
  if not isinstance(b, Tensor): b = _scalar_like(b, a)
  return a.isnan().where(b, b.isnan().where(a, a.maximum(b))) if dtypes.is_float(a.dtype) else a.maximum(b)


@op(*_both("fmin"), promote=RESULT)
def _fmin(a: Tensor, b: Tensor) -> Tensor:
  """min ignoring a NaN (NaN only when both are)."""
  if not isinstance(b, Tensor): b = _scalar_like(b, a)
  return a.isnan().where(b, b.isnan().where(a, a.minimum(b))) if dtypes.is_float(a.dtype) else a.minimum(b)


@op(*_both("hypot"), promote=RESULT)
def _hypot(a: Tensor, b: Tensor) -> Tensor:
  """sqrt(a^2 + b^2), scaled by max(|a|, |b|) so that it neither overflows nor underflows."""
  m = a.abs().maximum(b.abs())
  safe = (m == 0).where(1.0, m)
  return (m == 0).where(0.0, ((a / safe).square() + (b / safe).square()).sqrt() * m)


@op(*_both("erfc"), promote=OUT)
def _erfc(x: Tensor) -> Tensor: return 1 - x.erf()


@op(aten.angle.default, promote=OUT)
def _angle(x: Tensor) -> Tensor:
  """The argument of a real number: pi for negatives, 0 otherwise, NaN stays NaN."""
  return x.isnan().where(x, (x < 0).where(math.pi, 0.0)) if dtypes.is_float(x.dtype) else (x < 0).where(math.pi, 0.0)


# Lanczos approximation of the gamma function (g=7, 9 terms: the published coefficients)
_LANCZOS = [0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
            12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7]


def _lgamma_pos(z: Tensor) -> Tensor:
  """log|Gamma(z)| for z >= 0.5 (Lanczos)."""
  z = z - 1
  a = z * 0 + _LANCZOS[0]
  for i, c in enumerate(_LANCZOS[1:], start=1): a = a + c / (z + i)
  t = z + 7.5
  return 0.5 * math.log(2 * math.pi) + (z + 0.5) * t.log() - t + a.log()


@op(*_both("lgamma"), promote=OUT)
def _lgamma(x: Tensor) -> Tensor:
  """log|Gamma(x)|, with the reflection formula below 0.5; +inf at the poles (0, -1, -2, ...)."""
  small = x < 0.5
  refl = (math.pi / (x * math.pi).sin().abs()).log() - _lgamma_pos(small.where(1 - x, 1.0))
  pole = small & (x == x.floor())
  return pole.where(math.inf, small.where(refl, _lgamma_pos(small.where(1.0, x))))


@op(*_both("digamma"), promote=OUT)
def _digamma(x: Tensor) -> Tensor:
  """psi(x): the recurrence psi(x) = psi(x+1) - 1/x up to x >= 6, then the asymptotic series; reflection
  psi(x) = psi(1-x) - pi/tan(pi x) below 0; NaN at the poles 0, -1, -2, ... (-inf at 0 as torch gives)."""
  neg = x < 0
  y = neg.where(1 - x, x)
  acc = y * 0
  for _ in range(6):
    low = y < 6
    acc = acc - low.where(1 / y, 0.0)
    y = low.where(y + 1, y)
  inv = 1 / y
  inv2 = inv * inv
  series = y.log() - 0.5 * inv - inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 / 252))
  res = series + acc
  res = neg.where(res - math.pi / (x * math.pi).tan(), res)
  res = (x == 0).where(-math.inf, res)
  return (neg & (x == x.floor())).where(math.nan, res)


@op(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_legacy(x: Tensor, dim: int, index: Tensor, src: Any, reduce: str) -> Tensor:
  if reduce not in ("add", "multiply"):
    raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
  if isinstance(src, Tensor): src = src.cast(x.dtype)
  mode: Literal["add", "multiply"] = "add" if reduce == "add" else "multiply"
  return x.scatter(dim % max(x.ndim, 1), index.cast(dtypes.int32), src, reduce=mode)


@op(aten.masked_scatter.default, meta=False)
def _masked_scatter(x: Tensor, mask: Tensor, source: Tensor) -> Tensor:
  """The elements of `source`, in order, where `mask` (broadcast to x) is True (positions read to the host)."""
  shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(mask.shape)))
  m = mask.cast(dtypes.bool).expand(shape).numpy().reshape(-1)
  pos = np.nonzero(m)[0].astype(np.int32)
  flat = x.expand(shape).reshape(-1).contiguous()
  if not pos.size: return flat.reshape(shape)
  if pos.size > source.numel():
    raise RuntimeError(f"masked_scatter: expected source to have at least {pos.size} elements, got {source.numel()}")
  vals = source.reshape(-1).shrink(((0, pos.size),)).cast(x.dtype)
  return flat.scatter(0, Tensor(pos, device=x.device), vals).reshape(shape)


OPS[prims.where.default] = _where


from tiny_torch import ops_nn  # noqa: E402,F401  (indexing, nn and the raw ops: they register into the tables above)

# decompositions: torch's table minus what tiny runs itself
DECOMPS: dict[Any, Callable[..., Any]] = {k: v for k, v in decomposition_table.items()
                                          if isinstance(k, torch._ops.OpOverload) and k not in OPS and k not in SPECIAL}
