"""Neural-network layers with tinygrad's constructor signatures and initializations (PyTorch's, where tinygrad
follows it).

A layer is a plain object whose Tensor attributes are its weights; `nn.state.get_parameters(model)` finds them.

>>> from tiny_tensor import Tensor, nn
>>> lin = nn.Linear(3, 4)
>>> lin(Tensor.ones(2, 3)).shape
(2, 4)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tiny_uop.dtype import dtypes
from tiny_uop.helpers import prod
from tiny_uop.uop import UOp

from tiny_tensor.gradient import custom_gradient
from tiny_tensor.tensor import Tensor
from tiny_tensor.nn import lr_scheduler, optim, state  # noqa: F401  (nn.optim, nn.state as in tinygrad)

__all__ = ["BatchNorm", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
           "Embedding", "GroupNorm", "InstanceNorm", "LayerNorm", "LayerNorm2d", "LSTMCell", "Linear", "RMSNorm",
           "lr_scheduler", "optim", "state"]


def _tuple(x: int | tuple[int, ...], n: int) -> tuple[int, ...]:
  return (x,) * n if isinstance(x, int) else tuple(x)


def _buffer(value: float, shape: tuple[int, ...], dtype: Any = dtypes.float32) -> Tensor:
  """A realized, non-trainable tensor (running statistics): a buffer that `assign` updates in place."""
  from tiny_uop.dtype import to_numpy
  return Tensor(np.full(shape, value, dtype=to_numpy(dtype)), dtype=dtype, requires_grad=False)


def _param(value: float, *shape: int) -> Tensor:
  """A trainable tensor filled with `value` (norm weights and biases) in a buffer of its own: a lazy `Tensor.ones`
  is the same graph node as every equal constant, so backward could not give it a gradient of its own."""
  return Tensor(np.full(shape, value, dtype=np.float32), dtype=dtypes.default_float)


class BatchNorm:
  """Batch normalization over the channel axis (1) of a (N, C, ...) input, with running statistics.

  In training mode (`Tensor.training`, e.g. `with Tensor.train():`) it normalizes with the batch statistics and
  updates `running_mean`/`running_var` (assigns an optimizer's `step` realizes: they are its buffers); in eval mode it
  uses the running statistics.

  >>> from tiny_tensor import Tensor, nn
  >>> nn.BatchNorm(3)(Tensor.ones(2, 3, 4, 4)).shape
  (2, 3, 4, 4)
  """

  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
               momentum: float = 0.1):
    self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
    self.weight: Tensor | None = _param(1.0, sz) if affine else None
    self.bias: Tensor | None = _param(0.0, sz) if affine else None
    self.num_batches_tracked = _buffer(0, (), dtypes.int64)  # torch's and tinygrad's dtype: long
    if track_running_stats: self.running_mean, self.running_var = _buffer(0.0, (sz,)), _buffer(1.0, (sz,))

  def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, variance) over every axis but the channel: the batch's in training, the running ones in eval."""
    shape_mask = [1, -1, *([1] * (x.ndim - 2))]
    if self.track_running_stats and not Tensor.training: return self.running_mean, self.running_var.reshape(shape_mask)
    axes = tuple(a for a in range(x.ndim) if a != 1)
    batch_mean = x.mean(axis=axes)
    y = x - batch_mean.detach().reshape(shape_mask)  # d(var)/d(mean) = 0
    return batch_mean, (y * y).mean(axis=axes)

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2: raise ValueError(f"BatchNorm needs a (N, C, ...) input, got shape {x.shape}")
    batch_mean, batch_var = self.calc_stats(x)
    if self.track_running_stats and Tensor.training:
      n = int(prod(x.shape)) // int(x.shape[1])
      unbiased = batch_var.detach() * (n / max(n - 1, 1))
      self.running_mean.assign((1 - self.momentum) * self.running_mean + self.momentum * batch_mean.detach())
      self.running_var.assign((1 - self.momentum) * self.running_var + self.momentum * unbiased)
      self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    invstd = batch_var.reshape(-1).add(self.eps).rsqrt()
    out = x.batchnorm(self.weight, self.bias, batch_mean.reshape(-1), invstd)
    if (not self.track_running_stats or Tensor.training) and all(isinstance(d, int) for d in x.shape):
      _batchnorm_gradient(out, x, self.weight, self.bias, batch_mean, invstd)
    return out


def _batchnorm_gradient(out: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
                        invstd: Tensor) -> None:
  """Give batch-statistics BatchNorm's output `out` its gradients in closed form (with g the incoming gradient,
  xhat = (x - mean) * invstd and sums over every axis but the channel's, n elements each): bias sum(g), weight
  sum(g * xhat), input weight * invstd * (g - sum(g)/n - xhat * sum(g * xhat)/n). Autograd through the mean and the
  variance gave the same in more passes over the map (the gradient through the variance's square and the mean's
  broadcast each a reduction of its own): the MNIST step's two BatchNorms' backward 14 -> 10 kernels, the 128x32x20x20
  one's 4.6 -> 3.2 ms on one thread. The formula is a graph of x (mean and invstd not detached: they are the
  forward's nodes), so a gradient of these gradients goes through the batch statistics, as torch's does."""
  axes = tuple(a for a in range(x.ndim) if a != 1)
  shape = [1, -1, *([1] * (x.ndim - 2))]
  n = prod(int(d) for d in x.shape) // int(x.shape[1])
  # the closure keeps nodes, not Tensors: a Tensor it held would stay a live lazy tensor as long as `out`'s node
  # lives, walked by every later realize (and seen sharing its constants with unrelated graphs)
  xu, mu, iu = x.uop, mean.uop, invstd.uop
  wu, bu = (weight.uop if weight is not None else None), (bias.uop if bias is not None else None)
  inputs = tuple(t.uop for t in (x, weight, bias) if t is not None)

  def grads(ctx: UOp, _: UOp) -> tuple[UOp | None, ...]:
    g, m, istd = Tensor.from_uop(ctx), Tensor.from_uop(mu).reshape(shape), Tensor.from_uop(iu).reshape(shape)
    xhat = (Tensor.from_uop(xu) - m) * istd
    gb, gw = g.sum(axes), (g * xhat).sum(axes)
    scale = istd if wu is None else istd * Tensor.from_uop(wu).reshape(shape)
    gx = scale * (g - (gb / n).reshape(shape) - xhat * (gw / n).reshape(shape))
    res: list[UOp | None] = [gx.cast(xu.dtype).uop]
    res += [gs.cast(u.dtype).reshape(u.shape).uop for gs, u in ((gw, wu), (gb, bu)) if u is not None]
    return tuple(res)
  custom_gradient(out.uop, inputs, grads)


BatchNorm2d = BatchNorm3d = BatchNorm


class Conv2d:
  """2-D (or n-D, from `kernel_size`'s length) convolution, PyTorch's layout: weight (out, in/groups, *kernel).

  `padding` is an int, a tuple, or 'same' (stride 1). Weights and bias are uniform in ±1/sqrt(in*prod(kernel)).

  >>> from tiny_tensor import Tensor, nn
  >>> nn.Conv2d(1, 4, 3)(Tensor.ones(1, 1, 5, 5)).shape
  (1, 4, 3, 3)
  """

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: Any = 1,
               padding: int | tuple[int, ...] | str = 0, dilation: Any = 1, groups: int = 1, bias: bool = True):
    self.kernel_size = _tuple(kernel_size, 2)
    if isinstance(padding, str):
      if padding.lower() != "same": raise ValueError(f"invalid padding {padding!r}: only 'same' (or ints) is valid")
      if stride != 1: raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
      dil = _tuple(dilation, len(self.kernel_size))
      pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dil[::-1], self.kernel_size[::-1])]
      padding = tuple(p for pair in pads for p in pair)
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"in_channels={in_channels} and out_channels={out_channels} must divide by groups={groups}")
    self.stride, self.dilation, self.groups, self.padding = stride, dilation, groups, padding
    scale = 1 / math.sqrt(in_channels * prod(self.kernel_size))
    self.weight = Tensor.uniform(out_channels, in_channels // groups, *self.kernel_size, low=-scale, high=scale)
    self.bias: Tensor | None = Tensor.uniform(out_channels, low=-scale, high=scale) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


def Conv1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int | str = 0,
           dilation: int = 1, groups: int = 1, bias: bool = True) -> Conv2d:
  """1-D convolution over (N, C, L): a `Conv2d` with a one-element kernel size."""
  return Conv2d(in_channels, out_channels, (kernel_size,), stride, padding, dilation, groups, bias)


class ConvTranspose2d(Conv2d):
  """Transposed 2-D convolution, weight (in, out/groups, *kernel) as in PyTorch.

  >>> from tiny_tensor import Tensor, nn
  >>> nn.ConvTranspose2d(1, 2, 3, stride=2)(Tensor.ones(1, 1, 4, 4)).shape
  (1, 2, 9, 9)
  """

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: Any = 1,
               padding: Any = 0, output_padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True):
    super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
    scale = 1 / math.sqrt(in_channels * prod(self.kernel_size))
    self.weight = Tensor.uniform(in_channels, out_channels // groups, *self.kernel_size, low=-scale, high=scale)
    self.output_padding = output_padding

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding,
                              self.output_padding)


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                    output_padding: int = 0, dilation: int = 1, groups: int = 1, bias: bool = True) -> ConvTranspose2d:
  """Transposed 1-D convolution over (N, C, L)."""
  return ConvTranspose2d(in_channels, out_channels, (kernel_size,), stride, padding, output_padding, dilation, groups,
                         bias)


class Linear:
  """y = x @ weight.T + bias, weight (out, in); weight and bias uniform in ±1/sqrt(in_features).

  >>> from tiny_tensor import Tensor, nn
  >>> nn.Linear(3, 2)(Tensor.ones(4, 3)).shape
  (4, 2)
  """

  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    bound = 1 / math.sqrt(in_features)
    self.weight = Tensor.uniform(out_features, in_features, low=-bound, high=bound)
    self.bias: Tensor | None = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor: return x.linear(self.weight.transpose(), self.bias)


def _affine_channels(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
  if weight is None or bias is None: return x
  shape = (1, -1, *[1] * (x.ndim - 2))
  return x * weight.reshape(shape) + bias.reshape(shape)


class GroupNorm:
  """Group normalization: channels split into `num_groups`, each normalized over its channels and spatial dims.

  >>> from tiny_tensor import Tensor, nn
  >>> nn.GroupNorm(2, 4)(Tensor.rand(2, 4, 3)).shape
  (2, 4, 3)
  """

  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_channels % num_groups:
      raise ValueError(f"num_channels={num_channels} must divide by num_groups={num_groups}")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight: Tensor | None = _param(1.0, num_channels) if affine else None
    self.bias: Tensor | None = _param(0.0, num_channels) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
    return _affine_channels(y, self.weight, self.bias)


class InstanceNorm:
  """Instance normalization: each (sample, channel) normalized over its spatial dims."""

  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
    self.num_features, self.eps = num_features, eps
    self.weight: Tensor | None = _param(1.0, num_features) if affine else None
    self.bias: Tensor | None = _param(0.0, num_features) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    y = x.reshape(x.shape[0], self.num_features, -1).layernorm(eps=self.eps).reshape(x.shape)
    return _affine_channels(y, self.weight, self.bias)


class LayerNorm:
  """Layer normalization over the last `len(normalized_shape)` dims, with an elementwise affine part.

  >>> from tiny_tensor import Tensor, nn
  >>> nn.LayerNorm(3)(Tensor.rand(2, 3)).shape
  (2, 3)
  """

  def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True):
    self.normalized_shape: tuple[int, ...] = _tuple(normalized_shape, 1)
    self.axis, self.eps = tuple(-1 - i for i in range(len(self.normalized_shape))), eps
    self.weight: Tensor | None = _param(1.0, *self.normalized_shape) if elementwise_affine else None
    self.bias: Tensor | None = _param(0.0, *self.normalized_shape) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if tuple(x.shape[-len(self.normalized_shape):]) != self.normalized_shape:
      raise ValueError(f"LayerNorm{self.normalized_shape}: the last dims of input shape {x.shape} must match")
    y = x.layernorm(eps=self.eps, axis=self.axis)
    if self.weight is None or self.bias is None: return y
    return y * self.weight + self.bias


class LayerNorm2d(LayerNorm):
  """LayerNorm over the channel dim of a (N, C, H, W) input."""

  def __call__(self, x: Tensor) -> Tensor: return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RMSNorm:
  """x / sqrt(mean(x^2) + eps) over the last dim (computed in float32), times `weight`.

  >>> from tiny_tensor import Tensor, nn
  >>> nn.RMSNorm(2)(Tensor([[3.0, 4.0]])).shape
  (1, 2)
  """

  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
    self.eps = eps
    self.weight: Tensor | None = _param(1.0, dim) if elementwise_affine else None

  def _norm(self, x: Tensor) -> Tensor: return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()

  def __call__(self, x: Tensor) -> Tensor:
    y = self._norm(x.float()).cast(x.dtype)
    return y if self.weight is None else y * self.weight


class Embedding:
  """A lookup table of `vocab_size` vectors of `embed_size` (glorot-uniform); indexes with an integer tensor.

  >>> from tiny_tensor import Tensor, nn, dtypes
  >>> nn.Embedding(10, 3)(Tensor([[1, 2]], dtype=dtypes.int32)).shape
  (1, 2, 3)
  """

  def __init__(self, vocab_size: int, embed_size: int):
    self.vocab_sz, self.embed_sz = vocab_size, embed_size
    self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

  def __call__(self, idx: Tensor) -> Tensor:
    if not dtypes.is_int(idx.dtype): raise TypeError(f"Embedding needs an integer index tensor, got {idx.dtype}")
    arange = Tensor.arange(self.vocab_sz, device=idx.device)  # one-hot select: (..., vocab, 1) x (vocab, embed)
    return (arange == idx.unsqueeze(-1)).unsqueeze(-1).where(self.weight, 0).sum(-2)


class LSTMCell:
  """One LSTM step: `(h, c) = cell(x, (h, c))`; gates ordered (input, forget, cell, output) as in PyTorch.

  >>> from tiny_tensor import Tensor, nn
  >>> h, c = nn.LSTMCell(3, 4)(Tensor.ones(2, 3))
  >>> h.shape, c.shape
  ((2, 4), (2, 4))
  """

  def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
    stdv = 1.0 / math.sqrt(hidden_size)
    self.weight_ih = Tensor.uniform(hidden_size * 4, input_size, low=-stdv, high=stdv)
    self.weight_hh = Tensor.uniform(hidden_size * 4, hidden_size, low=-stdv, high=stdv)
    self.bias_ih: Tensor | None = _param(0.0, hidden_size * 4) if bias else None
    self.bias_hh: Tensor | None = _param(0.0, hidden_size * 4) if bias else None

  def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    if hc is None: hc = (Tensor.zeros(x.shape[0], self.weight_hh.shape[1], dtype=x.dtype, device=x.device),) * 2
    gates = x.linear(self.weight_ih.T, self.bias_ih) + hc[0].linear(self.weight_hh.T, self.bias_hh)
    i, f, g, o = gates.chunk(4, dim=1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    new_c = f * hc[1] + i * g
    return o * new_c.tanh(), new_c
