"""Higher-level Tensor ops, composed only from core Tensor ops: convolution, pooling, interpolation, einsum,
normalization, dropout, attention, losses, sorting, cumulative ops, gather/scatter, triangular masks, windows and
diagonals, einops-style rearrange, and sampling (multinomial, randperm).

The ops are the methods of `NNOpsMixin`, one of `Tensor`'s bases, each with tinygrad's method signature (`einsum`
is static, `randperm` a classmethod). Nothing here adds a UOp or touches numpy: each op is a graph of
movement, elementwise and reduce ops, so autograd differentiates it and the scheduler fuses it like any other.

Constants (`arange`, `ones`, `rand`) are created through `type(self)` on `self.device`, so the ops work on any
device and this module needs `Tensor` only for type hints.

Typing: each method opens with `if TYPE_CHECKING: assert isinstance(self, Tensor)`, which narrows `self` to
`Tensor` for mypy and IDEs at no run-time cost, so a body is checked against Tensor's own signatures (a Protocol
or stub base would restate them all, and still not be a `Tensor` where one is passed or returned).

>>> from tiny_tensor import Tensor
>>> Tensor([[1., 2.], [3., 4.]]).cumsum(1).tolist()
[[1.0, 3.0], [3.0, 7.0]]
"""
from __future__ import annotations

import functools
import math
import string
import weakref
from typing import TYPE_CHECKING, Any, Iterable, Literal, Sequence, overload

from tiny_uop.dtype import DType, dtypes, least_upper_dtype
from tiny_uop.helpers import WINO
from tiny_uop.uop import Ops
from tiny_tensor.helpers import ArgumentError, DTypeArgumentError

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor
  from tiny_uop.uop import UOp, sint

ReductionStr = Literal["mean", "sum", "none"]

__all__ = ["NNOpsMixin"]

# ***** small helpers (shapes are tuples of ints here: `_int_shape` turns a symbolic one into a clear error) *****


def _int_dim(s: sint, what: str) -> int:
  """`s` as an int; a symbolic size (a bound Variable's) raises a TypeError naming `what` needs a concrete one."""
  if isinstance(s, int): return s
  raise TypeError(f"{what} needs a concrete size, got the symbolic {s.render()}; symbolic sizes (bound Variables) "
                  "are supported by elementwise, reduce and movement ops, not by this one")


def _int_shape(x: Tensor, what: str, start: int = 0) -> tuple[int, ...]:
  """`x.shape[start:]` as ints, for ops that compute with those sizes (windows, masks, scans, sorting networks): a
  symbolic one raises a TypeError naming the op and the shape, instead of failing deep inside on a UOp comparison.
  The dims before `start` may stay symbolic."""
  dims = x.shape[start:]
  ints = tuple(s for s in dims if isinstance(s, int))
  if len(ints) != len(dims):
    raise TypeError(f"{what} needs concrete sizes in dims {start % max(x.ndim, 1)}.. of shape {_shape_str(x.shape)}; "
                    "symbolic sizes (bound Variables) are supported by elementwise, reduce and movement ops, not here")
  return ints


def _shape_str(shape: tuple[sint, ...]) -> str:
  """A shape with its symbolic dims rendered as their expressions: `(6, i)`."""
  dims = [str(s) if isinstance(s, int) else s.render() for s in shape]
  return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _resolve_dim(x: Tensor, dim: int, extra: int = 0) -> int:
  """`dim` as a non-negative axis of `x` (with `extra` more axes allowed, as for unsqueeze)."""
  n = x.ndim + extra
  if not isinstance(dim, int) or not -max(n, 1) <= dim < max(n, 1):
    lo, hi = -max(n, 1), max(n, 1) - 1
    raise IndexError(f"dim {dim!r} is out of range for a tensor of shape {x.shape}; valid: [{lo}, {hi}]")
  return dim + n if dim < 0 else dim


def _all_ints(xs: Iterable[Any]) -> bool: return all(isinstance(v, int) for v in xs)


def _ints(x: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
  """An int repeated `n` times, or a sequence of exactly `n` ints."""
  if isinstance(x, int): return (x,) * n
  t = tuple(x)
  if len(t) != n or not all(isinstance(v, int) for v in t):
    raise ValueError(f"{what}={x!r} must be an int or a sequence of {n} ints")
  return t


def _grouped_pads(padding: int | Sequence[int], n: int) -> tuple[tuple[int, int], ...]:
  """Padding for `n` spatial dims as ((before, after), ...) in dimension order.

  Accepts an int, one int per dim (`(pad_h, pad_w)`), or torch's flat form, last dim first
  (`(left, right, top, bottom)`)."""
  if isinstance(padding, int): return ((padding, padding),) * n
  p = tuple(padding) if isinstance(padding, (tuple, list)) else ()
  if not all(isinstance(v, int) for v in p): p = ()
  if len(p) == n: return tuple((v, v) for v in p)
  if len(p) == 2 * n: return tuple((p[2 * i], p[2 * i + 1]) for i in reversed(range(n)))
  raise ValueError(f"padding={padding!r} must be an int or a sequence of {n} or {2 * n} ints for {n} spatial dims")


def _pad(x: Tensor, pads: Iterable[tuple[int, int]], value: Any = 0.0) -> Tensor:
  """Constant-pad every dim of `x` by `pads` (one (before, after) per dim); negative amounts crop."""
  pads = tuple(pads)
  if any(b < 0 or a < 0 for b, a in pads):
    x = x.shrink(tuple((max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pads, x.shape)))
    pads = tuple((max(b, 0), max(a, 0)) for b, a in pads)
  if all(b == 0 and a == 0 for b, a in pads): return x
  return x.pad(pads, value=value)


def _shrink_axis(x: Tensor, axis: int, start: sint, end: sint) -> Tensor:
  """`x` cropped to [start, end) along `axis` (symbolic bounds are fine: a shrink takes them)."""
  return x.shrink(tuple((start, end) if d == axis else (0, s) for d, s in enumerate(x.shape)))


def _repeat(x: Tensor, reps: Sequence[int]) -> Tensor:
  """Tile `x` `reps[d]` times along each dim d (a broadcast, never a copy until realized)."""
  if all(r == 1 for r in reps): return x
  pairs = [(1, s) for s in x.shape]
  x = x.reshape(tuple(v for p in pairs for v in p))
  x = x.expand(tuple(v for r, s in zip(reps, x.shape[1::2]) for v in (r, s)))
  return x.reshape(tuple(r * s for r, s in zip(reps, x.shape[1::2])))


def _arange(like: Tensor, start: int, stop: int | None = None, step: int = 1, dtype: DType | None = None) -> Tensor:
  kw = {} if dtype is None else {"dtype": dtype}
  return type(like).arange(start, stop, step, device=like.device, **kw)


def _ones(like: Tensor, shape: Sequence[sint], dtype: DType | None = None) -> Tensor:
  return type(like).ones(*shape, dtype=dtype if dtype is not None else dtypes.default_float, device=like.device)


def _one_hot_bool(index: Tensor, n: int) -> Tensor:
  """`index[..., None] == arange(n)`: bool, one more (last) axis of size `n`."""
  return index.unsqueeze(-1).eq(_arange(index, n))


def _pool(x: Tensor, k_: Sequence[int], s_: Sequence[int], d_: Sequence[int]) -> Tensor:
  """Sliding windows over the last len(k_) dims: (..., *i_) -> (..., *o_, *k_), o = ceil((i - d*(k-1)) / s).

  Only movement ops: no data is copied until a consumer is realized, so a conv or pool fuses into one kernel.
  """
  nk = len(k_)
  if x.ndim < nk: raise ValueError(f"can't pool a tensor of shape {x.shape} with a {nk}-d kernel {tuple(k_)}")
  nb, i_ = x.ndim - nk, _int_shape(x, "a sliding window (conv, pooling, cumulative op)", x.ndim - nk)
  for k, s, d, i in zip(k_, s_, d_, i_):
    if k < 1 or s < 1 or d < 1:
      raise ValueError(f"kernel {tuple(k_)}, stride {tuple(s_)} and dilation {tuple(d_)} must all be >= 1")
    if d * (k - 1) + 1 > i:
      raise ValueError(f"kernel {tuple(k_)} with dilation {tuple(d_)} is larger than the (padded) input {i_}")
  o_ = [-(-(i - d * (k - 1)) // s) for i, d, k, s in zip(i_, d_, k_, s_)]
  batch = tuple(x.shape[:nb])
  if all(d == 1 and k <= s for k, s, d in zip(k_, s_, d_)):
    # windows don't overlap: resize each dim to o*s, split it into (o, s) and keep the first k of each s
    x = _pad(x, ((0, 0),) * nb + tuple((0, o * s - i) for o, s, i in zip(o_, s_, i_)))
    x = x.reshape(batch + tuple(v for o, s in zip(o_, s_) for v in (o, s)))
    x = x.shrink(tuple((0, v) for v in batch) + tuple(r for o, k in zip(o_, k_) for r in ((0, o), (0, k))))
    return x.permute(*range(nb), *[nb + 2 * j for j in range(nk)], *[nb + 2 * j + 1 for j in range(nk)])
  # overlapping windows: tile each dim R times, then view the tiles as rows of length L = i*f + d. As L = d (mod i),
  # row a starts a*d further into x, so rows[a, o*s] = x[o*s + a*d] (it never wraps: (o-1)*s + (k-1)*d < i).
  f_ = [max(1, -(-(o * s - d) // i)) for o, s, i, d in zip(o_, s_, i_, d_)]
  L_ = [i * f + d for i, f, d in zip(i_, f_, d_)]
  x = _repeat(x, (1,) * nb + tuple(-(-(k * L) // i) for k, L, i in zip(k_, L_, i_)))
  x = x.shrink(tuple((0, v) for v in batch) + tuple((0, k * L) for k, L in zip(k_, L_)))
  x = x.reshape(batch + tuple(v for k, L in zip(k_, L_) for v in (k, L)))
  x = x.shrink(tuple((0, v) for v in batch) + tuple(r for k, o, s in zip(k_, o_, s_) for r in ((0, k), (0, o * s))))
  x = x.reshape(batch + tuple(v for k, o, s in zip(k_, o_, s_) for v in (k, o, s)))
  x = x.shrink(tuple((0, v) for v in batch) + tuple(r for k, o in zip(k_, o_) for r in ((0, k), (0, o), (0, 1))))
  x = x.reshape(batch + tuple(v for k, o in zip(k_, o_) for v in (k, o)))
  return x.permute(*range(nb), *[nb + 2 * j + 1 for j in range(nk)], *[nb + 2 * j for j in range(nk)])


# ***** convolution *****


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, groups: int, stride: Any, dilation: Any,
          pads: tuple[tuple[int, int], ...], dtype: Any = None, weight_channel_last: bool = False) -> Tensor:
  bs, (cout, cin), HW = x.shape[0], weight.shape[:2], _int_shape(weight, "a convolution's weight", 2)
  nd = len(HW)
  s_, d_ = _ints(stride, nd, "stride"), _ints(dilation, nd, "dilation")
  win = _pool(_pad(x, ((0, 0), (0, 0)) + pads), HW, s_, d_)  # (bs, cin_, *oyx, *HW)
  oyx, rcout = tuple(win.shape[2:2 + nd]), cout // groups
  win = win.reshape(bs, groups, cin, 1, *oyx, *HW).expand(bs, groups, cin, rcout, *oyx, *HW)
  win = win.permute(0, 1, 3, *range(4, 4 + nd), 2, *range(4 + nd, 4 + 2 * nd))  # (bs, groups, rcout, *oyx, cin, *HW)
  if weight_channel_last and weight.uop not in _PREPARED: weight = conv_weight_channels_last(weight)
  prod_ = win * weight.reshape(1, groups, rcout, *[1] * nd, cin, *HW)
  axes = tuple(range(-1 - nd, 0))
  ret = (prod_.sum(axes) if dtype is None else prod_.sum(axes, dtype=dtype)).reshape(bs, cout, *oyx)
  out = ret if bias is None else ret + bias.reshape(1, cout, *[1] * nd)
  if dtype is None:
    # (a bias of a wider dtype promotes the sum: its gradient is then autograd's, the conv's own gradients the ret's)
    if out.dtype == ret.dtype: _conv_gradient(out, x, weight, bias, groups, s_, d_, pads)
    else: _conv_gradient(ret, x, weight, None, groups, s_, d_, pads)
  return out


_PREPARED: weakref.WeakSet[UOp] = weakref.WeakSet()
"""The weights `conv_weight_channels_last(..., realize=True)` returned (their UOps): conv2d reads them as they are."""


def conv_weight_channels_last(weight: Tensor, realize: bool = False, panel: int = 0) -> Tensor:
  """The layout `conv2d` reads its weight (Cout, Cin/groups, *kernel) in: a view of that shape over a contiguous
  (Cin/groups, *kernel, Cout) copy, so the conv's weight loads are contiguous across output channels (one vector of
  output channels per filter tap, reused across the pixels blocked around it: a 20-wide row as a vector fills 10 of
  16 lanes, 32 channels fill them all; a 5x5 conv on 20x20 maps ran 1.5x faster on the CPU). `panel` P (dividing
  Cout): over a (Cout/P, Cin/groups, *kernel, P) copy instead, each vector's strip of taps contiguous (for a weight
  bigger than the L2: `tiny_codegen.opt.heuristic.conv_weight_panel`). `realize`: the copy is made now, and conv2d
  reads the returned view as it is, so a caller that keeps a fixed weight (an ONNX initializer) prepares it once
  instead of copying it in every call.

  >>> from tiny_tensor import Tensor
  >>> from tiny_tensor.engine import GlobalCounters
  >>> w = conv_weight_channels_last(Tensor.ones(4, 2, 3, 3), realize=True)
  >>> x = Tensor.ones(1, 2, 5, 5).contiguous().realize()
  >>> GlobalCounters.reset(); _ = x.conv2d(w).realize(); GlobalCounters.kernel_count
  1
  """
  nd = weight.ndim - 2
  cout = weight.shape[0]
  if panel:
    if not isinstance(cout, int) or cout % panel: raise ValueError(f"panel={panel} must divide Cout={cout}")
    packed = weight.reshape(cout // panel, panel, *weight.shape[1:]).permute(0, *range(2, 3 + nd), 1).contiguous()
    if realize: packed = packed.realize()
    out = packed.permute(0, nd + 2, *range(1, nd + 2)).reshape(weight.shape)
  else:
    cl = weight.permute(*range(1, 2 + nd), 0).contiguous()
    out = (cl.realize() if realize else cl).permute(nd + 1, *range(nd + 1))
  if realize: _PREPARED.add(out.uop)
  return out


def _conv_gradient(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, groups: int, s_: tuple[int, ...],
                   d_: tuple[int, ...], pads: tuple[tuple[int, int], ...]) -> None:
  """Give the conv `out` = conv(x, weight) (+ bias) its own gradients: the input's is the transposed convolution of
  the incoming gradient with the same weight (a plain conv of the padded gradient with the flipped weight when stride
  is 1). Differentiating the sliding windows instead would scatter each output's gradient back through div/mod index
  math, computing mostly zeros for large kernels. The weight gradient is the window sum autograd gives, over a
  channels-last copy of the incoming gradient; the bias's is that copy's sum over (batch, pixels)."""
  from tiny_tensor.gradient import compute_gradient, custom_gradient
  T, xu, wu = type(x), x.uop, weight.uop
  bu = bias.uop if bias is not None else None
  kk, o_ = _int_shape(weight, "a convolution's weight", 2), _int_shape(out, "a convolution", 2)
  padded = [i + pb + pa for i, (pb, pa) in zip(_int_shape(x, "a convolution", 2), pads)]
  # the rows past the last window's end (stride > 1) get no gradient: output_padding restores the padded size
  extra = [p - ((o - 1) * s + d * (k - 1) + 1) for p, o, s, d, k in zip(padded, o_, s_, d_, kk)]

  def grads(ctx: UOp, ou: UOp) -> tuple[UOp | None, ...]:
    # the transposed conv, its input padded into a buffer first: each gradient element is read once per weight tap,
    # so it isn't recomputed inside the conv's loop. Only the last dim's padding is stored (the conv's row loads stay
    # plain vectors); the other dims' padding is a view, whose gated rows the codegen skips by narrowing the filter
    # loops (lower/bounds.py) instead of multiplying padding by the weight (a 5x5 filter on a 20x20 map: 17% of taps)
    g = _zero_stuff(T.from_uop(ctx), s_)
    gpad = tuple(((k - 1) * d, (k - 1) * d + e) for k, d, e in zip(kk, d_, extra))
    g = _pad(_pad(g, ((0, 0),) * (1 + len(kk)) + gpad[-1:]).contiguous(), ((0, 0), (0, 0)) + gpad[:-1] + ((0, 0),))
    # its weight too is read channels-last (the forward's input channels as the vector lanes, where a 24-wide output
    # row filled 12 of 16: the MNIST step's 5x5 input gradient on 24x24 maps ran 1.4x faster; a 3x3 one on 10x10
    # maps, 5 pixels blocked around the channel vector, 1.6x)
    gx = _conv(g, _transposed_weight(T.from_uop(wu), groups), None, groups, 1, d_, ((0, 0),) * len(kk),
               weight_channel_last=True)
    gx = _pad(gx, ((0, 0), (0, 0)) + tuple((-pb, -pa) for pb, pa in pads))
    # the weight gradient sums window * gradient over (batch, pixels): with the gradient channel-last (a copy) its
    # loads are contiguous across output channels, a vector reused across input channels and filter taps
    nd = len(kk)
    g_cl = T.from_uop(ctx).permute(0, *range(2, 2 + nd), 1).contiguous().permute(0, 1 + nd, *range(1, 1 + nd))
    # stop at the input: its graph may hold this same weight (one weight in a chain of convs), whose gradient there
    # is the earlier conv's to give (through gx), not this one's
    gw = compute_gradient(ou, g_cl.uop, {wu}, custom=False, stop={xu} if bu is None else {xu, bu}).get(wu)
    if bu is None: return gx.uop, gw
    # the bias's gradient sums that same copy (one read of the gradient, contiguous channel vectors) instead of the
    # incoming gradient, which is a fused expression (a ReLU's or BatchNorm's backward) of two or more maps: the
    # MNIST step's 128x32x24x24 conv bias read 18.9 MB through per-image partials, now 9.4 MB
    gb = g_cl.sum(tuple(i for i in range(g_cl.ndim) if i != 1))
    return gx.uop, gw, gb.cast(bu.dtype).reshape(bu.shape).uop
  custom_gradient(out.uop, (xu, wu) if bu is None else (xu, wu, bu), grads)


def _check_conv(x: Tensor, weight: Tensor, groups: int, transposed: bool) -> None:
  if weight.ndim < 3 or x.ndim != weight.ndim:
    raise ValueError(f"input of shape {x.shape} and weight of shape {weight.shape} must both be (N, C, *spatial) with "
                     "the same number of spatial dims (at least 1)")
  if not isinstance(groups, int) or groups < 1: raise ValueError(f"groups={groups!r} must be a positive int")
  if transposed:
    if weight.shape[0] != x.shape[1] or x.shape[1] % groups:
      raise ValueError(f"input has {x.shape[1]} channels but transposed weight {weight.shape} expects "
                       f"{weight.shape[0]} (and it must be divisible by groups={groups})")
  elif weight.shape[1] * groups != x.shape[1] or weight.shape[0] % groups:
    raise ValueError(f"input has {x.shape[1]} channels but weight {weight.shape} with groups={groups} expects "
                     f"{weight.shape[1] * groups}; weight.shape[0]={weight.shape[0]} must be divisible by groups")


def _transposed_weight(weight: Tensor, groups: int) -> Tensor:
  """(Cin, Cout/g, *k) -> (Cout, Cin/g, *k) spatially flipped: the conv weight that scatters each input over its
  window (a transposed conv's weight as a conv's, and a conv's weight for its input gradient)."""
  HW, nd = tuple(weight.shape[2:]), weight.ndim - 2
  cin, rcout = weight.shape[:2]
  w = weight.reshape(groups, cin // groups, rcout, *HW).permute(0, 2, 1, *range(3, 3 + nd))
  return w.flip(tuple(range(3, 3 + nd))).reshape(groups * rcout, cin // groups, *HW)


def _zero_stuff(x: Tensor, s_: Sequence[int]) -> Tensor:
  """s-1 zeros between neighbouring elements of each spatial dim: (i) -> (i, 1) -> pad (i, s) -> (i*s) -> crop."""
  if all(s == 1 for s in s_): return x
  bs, c, sp = x.shape[0], x.shape[1], tuple(x.shape[2:])
  x = x.reshape(bs, c, *[v for i in sp for v in (i, 1)])
  x = _pad(x, ((0, 0), (0, 0)) + tuple(p for s in s_ for p in ((0, 0), (0, s - 1))))
  return _pad(x.reshape(bs, c, *[i * s for i, s in zip(sp, s_)]), ((0, 0), (0, 0)) + tuple((0, 1 - s) for s in s_))


# ***** pooling *****


def _pool_args(x: Tensor, kernel_size: Any, stride: Any, dilation: Any, padding: Any):
  k_ = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
  nd = len(k_)
  if nd == 0 or x.ndim < nd: raise ValueError(f"kernel_size={kernel_size!r} doesn't fit a tensor of shape {x.shape}")
  s_ = _ints(stride if stride is not None else k_, nd, "stride")
  return k_, s_, _ints(dilation, nd, "dilation"), _grouped_pads(padding, nd)


def _ceil_extra(i_: Sequence[int], k_, s_, d_, pads) -> tuple[int, ...]:
  """Extra padding after each dim that ceil_mode needs (torch's rule: the last window starts inside the input or
  the left padding)."""
  extra = []
  for i, k, s, d, (pb, pa) in zip(i_, k_, s_, d_, pads):
    span = d * (k - 1) + 1
    o = -(-(i + pb + pa - span) // s) + 1
    if (o - 1) * s >= i + pb: o -= 1
    extra.append(max(0, (o - 1) * s + span - (i + pb + pa)))
  return tuple(extra)


# ***** resampling *****


def _select(x: Tensor, axis: int, index: Tensor, n: int) -> Tensor:
  """x[..., index, ...] along `axis` for a 1-D int `index` with values in [0, n)."""
  xt = x.transpose(axis, -1).unsqueeze(-2)                       # (..., 1, n)
  out = _one_hot_bool(index, n).where(xt, 0).sum(-1).cast(x.dtype)  # (..., len(index))
  return out.transpose(axis, -1)


# ***** einsum *****


def _einsum(formula: str, *operands: Any, dtype: Any = None) -> Tensor:
  """Einstein summation, as torch.einsum: `Tensor.einsum("ij,jk->ik", a, b)`.

  Supports implicit output (`"ij,jk"`), `...` broadcasting, repeated letters within one operand (diagonals), and
  size-1 broadcasting between operands. `dtype` is the accumulation dtype.

  >>> from tiny_tensor import Tensor
  >>> Tensor.einsum("ij,ij->", Tensor([[1, 2], [3, 4]]), Tensor([[5, 6], [7, 8]])).item()
  70
  """
  xs = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
  formula = formula.replace(" ", "")
  lhs, arrow, rhs = formula.partition("->")
  terms = lhs.split(",")
  if len(terms) != len(xs):
    raise ValueError(f"einsum {formula!r} names {len(terms)} operands but {len(xs)} were given")
  for t, x in zip(terms, xs):
    body = t.replace("...", "")
    if not all(c in string.ascii_letters for c in body) or t.count("...") > 1 or "." in body:
      # a RuntimeError in tinygrad 0.14 and torch
      raise ArgumentError(f"einsum term {t!r} may contain only letters and at most one '...'")
    if ("..." in t and x.ndim < len(body)) or ("..." not in t and x.ndim != len(body)):
      raise ArgumentError(f"einsum term {t!r} doesn't match an operand of shape {x.shape}")
  ell = ""
  if "..." in formula:
    free = [c for c in string.ascii_letters if c not in formula]
    n_ell = max((x.ndim - len(t) + 3 for t, x in zip(terms, xs) if "..." in t), default=0)
    ell = "".join(free[:n_ell])
    terms = [t.replace("...", ell[n_ell - (x.ndim - len(t) + 3):]) if "..." in t else t for t, x in zip(terms, xs)]
  if arrow:
    if rhs.count("...") > 1 or "." in rhs.replace("...", ""):
      raise ArgumentError(f"einsum output {rhs!r} may hold '...' only once")
    # an output '...' with no '...' in the inputs stands for no dims (as torch and tinygrad 0.14)
    rhs = rhs.replace("...", ell)
  else:
    letters = "".join(terms)
    rhs = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
  if len(set(rhs)) != len(rhs) or any(c not in "".join(terms) for c in rhs) or not all(c.isalpha() for c in rhs):
    raise ArgumentError(f"einsum output {rhs!r} must name distinct letters that appear in the inputs {terms}")
  # take the diagonal for a letter repeated within one operand
  for n_, (t, x) in enumerate(zip(terms, xs)):
    while (c := next((c for c in t if t.count(c) > 1), None)) is not None:
      j, k = t.index(c), t.index(c, t.index(c) + 1)
      n = x.shape[j]
      if x.shape[k] != n:
        raise ValueError(f"einsum letter {c!r} repeats in {t!r} over dims of sizes {n} and {x.shape[k]}")
      rest = [d for d in range(x.ndim) if d not in (j, k)]
      rest_shape = tuple(x.shape[d] for d in rest)
      # (.., n, n) -> (.., n*n) -> pad to (.., n*(n+1)) -> (.., n, n+1): column 0 of row a is element (a, a)
      x = x.permute(tuple(rest) + (j, k)).reshape(rest_shape + (n * n,))
      x = _pad(x, ((0, 0),) * len(rest) + ((0, n),)).reshape(rest_shape + (n, n + 1))
      x = _shrink_axis(x, x.ndim - 1, 0, 1).reshape(rest_shape + (n,))
      t = "".join(t[d] for d in rest) + c
    terms[n_], xs[n_] = t, x
  sizes: dict[str, int] = {}
  for t, x in zip(terms, xs):
    for c, s in zip(t, x.shape):
      if sizes.get(c, 1) not in (1, s) and s != 1:
        raise ArgumentError(f"einsum letter {c!r} has sizes {sizes[c]} and {s}")  # tinygrad 0.14: a RuntimeError
      sizes[c] = s if sizes.get(c, 1) == 1 else sizes[c]
  alpha = sorted(sizes)
  aligned = [(x.permute(tuple(t.index(c) for c in sorted(t))) if t else x)
             .reshape(tuple(x.shape[t.index(c)] if c in t else 1 for c in alpha)) for t, x in zip(terms, xs)]
  ret = functools.reduce(lambda a, b: a * b, aligned)
  red = tuple(i for i, c in enumerate(alpha) if c not in rhs)
  if red: ret = ret.sum(red) if dtype is None else ret.sum(red, dtype=dtype)
  elif dtype is not None: ret = ret.cast(dtype)
  kept = [c for c in alpha if c in rhs]
  return ret.permute(tuple(kept.index(c) for c in rhs)) if kept else ret


# ***** normalization, dropout, attention *****


def _training(x: Tensor) -> bool:
  if getattr(type(x), "training", False): return True
  from tiny_uop import helpers
  return bool(getattr(helpers, "TRAINING", False))


def _repeat_heads(t: Tensor, n: int) -> Tensor:
  """(..., H, S, D) -> (..., H*n, S, D), each head repeated n times in place (repeat_interleave on dim -3)."""
  if n == 1: return t
  *b, h, s, d = t.shape
  return t.unsqueeze(-3).expand(*b, h, n, s, d).reshape(*b, h * n, s, d)


# ***** losses *****


def _reduce_loss(x: Tensor, reduction: str) -> Tensor:
  if reduction == "none": return x
  if reduction == "sum": return x.sum()
  if reduction == "mean": return x.mean()
  raise ValueError(f"reduction={reduction!r} must be one of 'mean', 'sum', 'none'")


def _logsigmoid(x: Tensor) -> Tensor:
  """log(sigmoid(x)) = -softplus(-x), stable for large |x| and with the derivative sigmoid(-x) everywhere (0.5 at 0)."""
  return -(-x).softplus()


# ***** sorting *****


_SORT_KEY_INTS = {dtypes.float16: dtypes.int16, dtypes.bfloat16: dtypes.int16, dtypes.float32: dtypes.int32,
                  dtypes.float64: dtypes.int64}


def _float_sort_key(x: Tensor) -> Tensor:
  """Ints that order like the floats of `x`, NaN last (above +inf, as numpy sorts and torch's topk ranks it), -0.0
  equal to 0.0: the bits of a non-negative float order like ints; a negative one's magnitude bits are flipped."""
  it = _SORT_KEY_INTS[x.dtype]
  b = x.isnan().where(math.nan, x.eq(0).where(0.0, x)).bitcast(it)
  return (b < 0).where(b ^ int(dtypes.max(it)), b)


def float_divmod(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
  """(a // b, a % b) for floats as Python, numpy and torch define them, from C's `fmod` (the IR's float CMOD, exact
  for every pair: `fmod` has no rounding) as numpy's `npy_divmod` does: the remainder moved by b where its sign
  differs from b's, a zero remainder signed as b, the quotient (a - fmod) / b less one then, rounded to the nearest
  integer below, a zero quotient signed as a/b, b == 0 giving a/b and NaN. Composing `a - floor(a/b)*b` instead was
  wrong once |a/b| passed 2**mantissa (1.8e19 % 0.7 gave -3.5e11 in float32): the fuzzer's seed 33227. Half
  precision goes through float32 (its fmod is exact there and fits back). Gradients: the quotient's is 0, the
  remainder's 1 for a and -(a // b) for b."""
  from tiny_tensor.gradient import custom_gradient
  if a.dtype.itemsize < 4:
    q, r = float_divmod(a.float(), b.float())
    return q.cast(a.dtype), r.cast(a.dtype)
  m = a._wrap(a.uop.alu(Ops.CMOD, b.uop), b)
  moved = m.ne(0) & ((m < 0) != (b < 0))  # fmod has a's sign, % has b's
  r = moved.where(m + b, m)
  r = r.eq(0).where((b < 0).where(-0.0, 0.0), r)
  div = (a - m) / b  # an integer up to rounding
  div = moved.where(div - 1, div)
  fl = div.floor()
  fl = (div - fl > 0.5).where(fl + 1, fl)
  q = b.eq(0).where(a / b, div.eq(0).where((a / b) * 0.0, fl))  # a zero quotient has the sign of a/b
  au, bu, qu = a.uop, b.uop, q.uop
  custom_gradient(q.uop, (au, bu), lambda ctx, _: (None, None))
  custom_gradient(r.uop, (au, bu), lambda ctx, _: (ctx, -(qu.detach()) * ctx))
  return q, r


def _tri_mask(x: Tensor, diagonal: int, upper: bool) -> Tensor:
  if x.ndim < 2: raise ValueError(f"tril/triu need at least 2 dims, got shape {x.shape}")
  r, c = _int_shape(x, "tril/triu", -2)
  rows, cols = _arange(x, r).unsqueeze(1) + diagonal, _arange(x, c)
  return rows <= cols if upper else rows >= cols


def _zero_of(x: Tensor) -> bool | int:
  """The zero that keeps `x`'s dtype in `where` (a Python 0 would promote a bool tensor to int32)."""
  return False if x.dtype == dtypes.bool else 0


# ***** cumulative ops *****

_CUM_OPS = "a cumulative op (cumsum, cumprod, cummax) along its axis"
_CUM_SPLIT = 256  # above 2*_CUM_SPLIT elements, scan in chunks: O(n*SPLIT) work instead of O(n^2)


def _cum_window(x: Tensor, op: str) -> Tensor:
  """Inclusive scan along the last axis: pad n-1 identities in front, take the n windows of n, reduce each."""
  n = _int_shape(x, _CUM_OPS, -1)[0]
  ident = {"sum": 0, "prod": 1, "max": x.dtype.min}[op]
  win = _pool(_pad(x, ((0, 0),) * (x.ndim - 1) + ((n - 1, 0),), ident), (n,), (1,), (1,))
  return getattr(win, op)(-1)


def _cumulative(x: Tensor, axis: int, op: str) -> Tensor:
  if x.ndim == 0 or 0 in x.shape: return x.cast(x.sum().dtype) if op == "sum" else x
  axis = _resolve_dim(x, axis)
  t = x.transpose(axis, -1)
  n = _int_shape(t, _CUM_OPS, -1)[0]
  if n <= 2 * _CUM_SPLIT: return _cum_window(t, op).transpose(axis, -1)
  # two levels: scan inside chunks, then add (multiply, max) the scan of the chunks' totals, shifted by one chunk
  ident = {"sum": 0, "prod": 1, "max": x.dtype.min}[op]
  pad = -n % _CUM_SPLIT
  chunks = _pad(t, ((0, 0),) * (t.ndim - 1) + ((pad, 0),), ident).reshape(*t.shape[:-1], -1, _CUM_SPLIT)
  inner = _cum_window(chunks, op)
  totals = _shrink_axis(inner, inner.ndim - 1, _CUM_SPLIT - 1, _CUM_SPLIT).squeeze(-1)
  before = _pad(_cum_window(totals, op), ((0, 0),) * (totals.ndim - 1) + ((1, -1),), ident).unsqueeze(-1)
  both = inner + before if op == "sum" else inner * before if op == "prod" else inner.maximum(before)
  out = both.reshape(*t.shape[:-1], n + pad)
  return _shrink_axis(out, out.ndim - 1, pad, n + pad).transpose(axis, -1)


# ***** indexing-like ops *****


def _pre_scatter(self, dim: int, index: Tensor, src: Tensor) -> tuple[int, Tensor, Tensor]:
  """src and a bool mask laid out as (*self.shape, index.shape[dim]): mask[..t..,q] = index[..q..] == t."""
  dim = _resolve_dim(self, dim)
  if not index.ndim == self.ndim == src.ndim:
    raise ValueError(f"self {self.shape}, index {index.shape} and src {src.shape} must have the same number of dims")
  if not dtypes.is_int(index.dtype):  # a RuntimeError in tinygrad 0.14 and torch
    raise DTypeArgumentError(f"index must be an integer tensor, got {index.dtype}")
  if any((d != dim and i > s) or i > r for d, (s, i, r) in enumerate(zip(self.shape, index.shape, src.shape))):
    raise ValueError(f"index {index.shape} must be no larger than src {src.shape}, and than self {self.shape} "
                     f"outside dim {dim}")
  if self.dtype != src.dtype: raise TypeError(f"self ({self.dtype}) and src ({src.dtype}) must have the same dtype")
  n = self.shape[dim]
  src = src.shrink(tuple((0, i) for i in index.shape))
  src = src.unsqueeze(-1).expand(*index.shape, n).transpose(-1, dim)  # (..., n at dim, ..., q)
  mask = _one_hot_bool(index, n).transpose(-1, dim)
  pads = tuple((0, s - i) if d != dim else (0, 0) for d, (s, i) in enumerate(zip(self.shape, index.shape))) + ((0, 0),)
  return dim, _pad(src, pads, 0), _pad(mask, pads, False)


# ***** windows, diagonals, grids, einops-style rearrange *****


def _rearrange_side(side: str, formula: str) -> list[list[str]]:
  """'b (h w) c' -> [['b'], ['h', 'w'], ['c']]; '1' and '()' are an empty group (a unit dim)."""
  groups: list[list[str]] = []
  cur: list[str] | None = None
  for tok in side.replace("(", " ( ").replace(")", " ) ").split():
    if tok == "(":
      if cur is not None: raise ValueError(f"rearrange {formula!r}: nested parentheses")
      cur = []
    elif tok == ")":
      if cur is None: raise ValueError(f"rearrange {formula!r}: unbalanced parentheses")
      groups.append(cur)
      cur = None
    elif tok == "1":
      if cur is None: groups.append([])
    elif tok == "..." or tok.isidentifier():
      if cur is None: groups.append([tok])
      else: cur.append(tok)
    else: raise ValueError(f"rearrange {formula!r}: bad axis name {tok!r}")
  if cur is not None: raise ValueError(f"rearrange {formula!r}: unbalanced parentheses")
  return groups


class NNOpsMixin:
  """The higher-level ops of `Tensor` (one of its bases): `x.conv2d(w)`, `x.sort()`, `Tensor.einsum(...)`."""
  __slots__ = ()

  def _pad_dims(self, pads: Iterable[tuple[int, int]], value: Any = 0.0) -> Tensor:
    """`_pad` as a method, for modules nnops imports (winograd): they reach it without importing nnops back."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return _pad(self, pads, value)
  def _windows(self, k_: Sequence[int], s_: Sequence[int], d_: Sequence[int]) -> Tensor:
    """`_pool` (sliding windows) as a method, for the same modules."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return _pool(self, k_, s_, d_)

  def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: Any = 1,
             dilation: Any = 1, padding: int | Sequence[int] = 0, dtype: Any = None) -> Tensor:
    """Convolution (cross-correlation, like torch) of `self` (N, Cin, *spatial) with `weight`
    (Cout, Cin/groups, *kernel).

    Any number of spatial dims (1-d, 2-d, 3-d, ...). `padding` is an int, one int per spatial dim, or torch's flat
    form `(left, right, top, bottom, ...)` (negative values crop), or torch's "valid" / "same". `dtype` is the
    accumulation dtype.

    >>> from tiny_tensor import Tensor
    >>> Tensor.arange(9).reshape(1, 1, 3, 3).float().conv2d(Tensor.ones(1, 1, 2, 2)).tolist()
    [[[[8.0, 12.0], [20.0, 24.0]]]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    _check_conv(self, weight, groups, transposed=False)
    nd = weight.ndim - 2
    if isinstance(padding, str):  # torch's "valid" (none) and "same" (output size = input size; any odd pad goes after)
      if padding not in ("valid", "same"): raise ValueError(f"padding={padding!r} must be 'valid', 'same' or ints")
      if padding == "same" and any(s != 1 for s in _ints(stride, nd, "stride")):
        raise ValueError(f"padding='same' needs stride 1, got stride={stride!r}")
      span = [d * (k - 1) if padding == "same" else 0
              for d, k in zip(_ints(dilation, nd, "dilation"), weight.shape[2:])]
      pads = tuple((t // 2, t - t // 2) for t in span)
    else: pads = _grouped_pads(padding, nd)
    if WINO and dtype is None and groups == 1 and tuple(weight.shape[2:]) == (3, 3) and _all_ints(self.shape[2:]) and \
       _ints(stride, nd, "stride") == (1, 1) and _ints(dilation, nd, "dilation") == (1, 1):
      from tiny_tensor.winograd import winograd_conv  # tinygrad's WINO=1: F(4x4, 3x3) for every such conv
      return winograd_conv(self, weight, bias, pads, 4)
    return _conv(self, weight, bias, groups, stride, dilation, pads, dtype, weight_channel_last=True)

  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: Any = 1,
                       dilation: Any = 1, padding: int | Sequence[int] = 0, output_padding: Any = 0) -> Tensor:
    """Transposed convolution of `self` (N, Cin, *spatial) with `weight` (Cin, Cout/groups, *kernel), any spatial rank.

    Output size per dim: (i-1)*stride - pad_before - pad_after + dilation*(k-1) + output_padding + 1.

    >>> from tiny_tensor import Tensor
    >>> Tensor.ones(1, 1, 2, 2).conv_transpose2d(Tensor.ones(1, 1, 2, 2)).tolist()
    [[[[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    _check_conv(self, weight, groups, transposed=True)
    HW, nd = _int_shape(weight, "conv_transpose2d's weight", 2), weight.ndim - 2
    s_, d_ = _ints(stride, nd, "stride"), _ints(dilation, nd, "dilation")
    op_ = _ints(output_padding, nd, "output_padding")
    if any(s < 1 for s in s_) or any(d < 1 for d in d_): raise ValueError(f"stride {s_} and dilation {d_} must be >= 1")
    if any(not 0 <= o < max(s, d) for o, s, d in zip(op_, s_, d_)):
      raise ValueError(f"output_padding {op_} must be >= 0 and smaller than stride {s_} or dilation {d_}")
    pads = _grouped_pads(padding, nd)
    x = _zero_stuff(self, s_)
    conv_pads = tuple(((k - 1) * d - pb, (k - 1) * d - pa + o) for k, d, (pb, pa), o in zip(HW, d_, pads, op_))
    return _conv(x, _transposed_weight(weight, groups), bias, groups, 1, d_, conv_pads)

  def avg_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                 padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """Average pooling over the last len(kernel_size) dims (any number of them, not only 2).

    `padding` as in conv2d. `ceil_mode` rounds the output size up; `count_include_pad=False` divides by the number of
    input (not padding) elements in each window.

    >>> from tiny_tensor import Tensor
    >>> Tensor.arange(16).reshape(1, 1, 4, 4).float().avg_pool2d().tolist()
    [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    k_, s_, d_, pads = _pool_args(self, kernel_size, stride, dilation, padding)
    nd, nb = len(k_), self.ndim - len(k_)
    i_ = _int_shape(self, "avg_pool2d over its pooled dims", nb)
    extra = _ceil_extra(i_, k_, s_, d_, pads) if ceil_mode else (0,) * nd
    axes = tuple(range(-nd, 0))
    full = tuple((pb, pa + e) for (pb, pa), e in zip(pads, extra))
    win = _pool(_pad(self, ((0, 0),) * nb + full), k_, s_, d_)
    if count_include_pad and not ceil_mode: return win.mean(axes)
    # divisor: how many counted cells each window covers (padding counts unless count_include_pad=False; the ceil_mode
    # extension never counts)
    ones = _ones(self, i_)
    if count_include_pad: ones = _pad(ones, pads, 1.0)
    cnt = _pool(_pad(ones, ((0, e) for e in extra) if count_include_pad else full), k_, s_, d_).sum(axes)
    return win.sum(axes) / cnt

  # (the overloads tell type checkers and IDEs that only return_indices=True gives a pair)
  @overload
  def max_pool2d(self, kernel_size: Any = ..., stride: Any = ..., dilation: Any = ...,
                 padding: int | Sequence[int] = ..., ceil_mode: bool = ...,
                 return_indices: Literal[False] = ...) -> Tensor: ...
  @overload
  def max_pool2d(self, kernel_size: Any = ..., stride: Any = ..., dilation: Any = ...,
                 padding: int | Sequence[int] = ..., ceil_mode: bool = ..., *,
                 return_indices: Literal[True]) -> tuple[Tensor, Tensor]: ...
  @overload
  def max_pool2d(self, kernel_size: Any = ..., stride: Any = ..., dilation: Any = ...,
                 padding: int | Sequence[int] = ..., ceil_mode: bool = ...,
                 return_indices: bool = ...) -> Tensor | tuple[Tensor, Tensor]: ...
  def max_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                 padding: int | Sequence[int] = 0, ceil_mode: bool = False,
                 return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max pooling over the last len(kernel_size) dims; padding reads as the dtype's minimum.

    With `return_indices=True` also returns, for each output, the flat index (int32) of its maximum within the input's
    spatial dims (the first one on ties), as torch does.

    >>> from tiny_tensor import Tensor
    >>> Tensor.arange(16).reshape(1, 1, 4, 4).max_pool2d().tolist()
    [[[[5, 7], [13, 15]]]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    k_, s_, d_, pads = _pool_args(self, kernel_size, stride, dilation, padding)
    nd, nb = len(k_), self.ndim - len(k_)
    i_ = _int_shape(self, "max_pool2d over its pooled dims", nb)
    extra = _ceil_extra(i_, k_, s_, d_, pads) if ceil_mode else (0,) * nd
    full = tuple((pb, pa + e) for (pb, pa), e in zip(pads, extra))
    axes = tuple(range(-nd, 0))
    win = _pool(_pad(self, ((0, 0),) * nb + full, self.dtype.min), k_, s_, d_)
    out = win.max(axes)
    if not return_indices: return out
    # count positions down from n so that max() picks the first maximum; padding gets the smallest int
    n = math.prod(i_)
    rev = _pool(_pad(_arange(self, n, 0, -1, dtype=dtypes.int32).reshape(*i_), full, dtypes.int32.min), k_, s_, d_)
    idx = win.eq(out.reshape(*out.shape, *[1] * nd)).where(rev, 0).max(axes)
    return out, (n - idx).cast(dtypes.int32)

  def max_unpool2d(self, indices: Tensor, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                   padding: int | Sequence[int] = 0, output_size: Sequence[int] | None = None) -> Tensor:
    """Partial inverse of max_pool2d: puts each value of `self` (N, C, *spatial) at its flat `indices`, zeros elsewhere.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[[[5., 7.]]]]).max_unpool2d(Tensor([[[[1, 3]]]]), kernel_size=(1, 2)).tolist()
    [[[[0.0, 5.0, 0.0, 7.0]]]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    bs, c, sp = self.shape[0], self.shape[1], _int_shape(self, "max_unpool2d", 2)
    if tuple(indices.shape) != tuple(self.shape):
      raise ValueError(f"indices of shape {indices.shape} must have the shape of the pooled values {self.shape}")
    if output_size is None:
      k_ = _ints(kernel_size, len(sp), "kernel_size")
      s_, d_ = _ints(stride if stride is not None else k_, len(sp), "stride"), _ints(dilation, len(sp), "dilation")
      pads = _grouped_pads(padding, len(sp))
      out_ = tuple((i - 1) * s - pb - pa + d * (k - 1) + 1 for i, k, s, d, (pb, pa) in zip(sp, k_, s_, d_, pads))
    else: out_ = tuple(output_size)[-len(sp):]
    n, m = math.prod(out_), math.prod(sp)
    hot = _one_hot_bool(indices.reshape(bs, c, m), n)  # (bs, c, m, n)
    return hot.where(self.reshape(bs, c, m, 1), 0).sum(2).cast(self.dtype).reshape(bs, c, *out_)

  def interpolate(self, size: Sequence[int], mode: str = "linear", align_corners: bool = False) -> Tensor:
    """Resample the last len(size) dims to `size`; dims before them are batch dims.

    `mode` is "linear" (bilinear/trilinear for 2/3 dims), "nearest" or "nearest-exact"; coordinates follow torch
    (`align_corners` only for linear). The result has `self`'s dtype.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1., 2.]]).interpolate(size=(4,)).tolist()
    [[1.0, 1.25, 1.75, 2.0]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if not isinstance(size, (tuple, list)) or not all(isinstance(s, int) and s > 0 for s in size) \
       or not 0 < len(size) <= self.ndim:
      raise ValueError(f"size={size!r} must be a tuple of 1 to {self.ndim} positive ints")
    if mode not in ("linear", "nearest", "nearest-exact"):
      raise ValueError(f"mode={mode!r} is not supported; valid: 'linear', 'nearest', 'nearest-exact'")
    if align_corners and mode != "linear": raise ValueError(f"align_corners=True needs mode='linear', got {mode!r}")
    x, first = self, self.ndim - len(size)
    sizes_in = _int_shape(self, "interpolate over its resized dims", first)
    for axis, out, inp in zip(range(first, self.ndim), size, sizes_in):
      if mode == "linear":
        # source coordinate num/den, exactly: align_corners -> dst*(in-1)/(out-1), else (dst+0.5)*in/out - 0.5
        arr = _arange(self, out)
        if align_corners: num, den = arr * (inp - 1), max(out - 1, 1)
        else: num, den = (arr * 2 + 1) * inp - out, 2 * out
        num = num.maximum(0).minimum((inp - 1) * den)
        low, high = num // den, ((num + den - 1) // den)
        frac = ((num - low * den).cast(dtypes.float32) / den).unsqueeze(1)
        # one weighted reduce per axis: out[o] = sum_i x[i] * w[o, i], reading only the two neighbours of o (so an
        # inf elsewhere in the row doesn't turn 0*inf into nan)
        hot_lo, hot_hi = _one_hot_bool(low, inp), _one_hot_bool(high, inp)       # (out, in)
        w = hot_lo.where(1 - frac, 0) + hot_hi.where(frac, 0)
        xt = x.transpose(axis, -1).unsqueeze(-2)                               # (..., 1, in)
        x = (hot_lo | hot_hi).where(xt * w, 0).sum(-1).transpose(axis, -1)
      else:
        pos = _arange(self, out, dtype=dtypes.float32)
        if mode == "nearest-exact": pos = pos + 0.5
        x = _select(x, axis, (pos * (inp / out)).cast(dtypes.int32).minimum(inp - 1), inp)
    return x.cast(self.dtype)
  einsum = staticmethod(_einsum)
  einsum.__doc__ = _einsum.__doc__

  def layernorm(self, axis: int | tuple[int, ...] = -1, eps: float = 1e-5) -> Tensor:
    """Normalize to zero mean and unit variance over `axis` (no affine part; see nn.LayerNorm).

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1., 3.]]).layernorm().tolist()  # doctest: +ELLIPSIS
    [[-0.99..., 0.99...]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    y = self - self.mean(axis, keepdim=True)
    return y * (y * y).mean(axis, keepdim=True).add(eps).rsqrt()

  def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                axis: int | tuple[int, ...] = 1) -> Tensor:
    """(self - mean) * weight * invstd + bias, with the 1-d parameters laid along `axis` (the channel dim).

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1., 2.], [3., 4.]]).batchnorm(None, None, Tensor([1., 2.]), Tensor([1., 0.5])).tolist()
    [[0.0, 0.0], [2.0, 1.0]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(_resolve_dim(self, a) for a in axes)
    shape = tuple(s if d in axes else 1 for d, s in enumerate(self.shape))
    x = self - mean.reshape(shape)
    if weight is not None: x = x * weight.reshape(shape)
    x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
    return x + bias.reshape(shape) if bias is not None else x

  def dropout(self, p: float = 0.5) -> Tensor:
    """Zero each element with probability `p` and scale the rest by 1/(1-p); only when `Tensor.training` is set.

    >>> from tiny_tensor import Tensor
    >>> Tensor([1., 2.]).dropout(0.5).tolist()  # not training: unchanged
    [1.0, 2.0]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if not 0 <= p <= 1: raise ValueError(f"dropout probability p={p!r} must be in [0, 1]")
    if not _training(self) or p == 0: return self
    if p == 1: return self.zeros_like()
    keep = type(self).rand(*self.shape, device=self.device, dtype=dtypes.default_float) >= p
    return keep.where(self, 0) / (1.0 - p)

  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                   dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
    """softmax(self @ key^T / sqrt(d) + mask) @ value; query `self` (..., L, d), key (..., S, d), value (..., S, dv).

    A bool `attn_mask` marks the positions to attend; a float one is added. `is_causal` masks the future (top-left
    aligned, as torch). `enable_gqa` repeats key/value heads (dim -3) to match the query's.

    >>> from tiny_tensor import Tensor
    >>> q = Tensor.ones(1, 2, 4)
    >>> q.scaled_dot_product_attention(q, Tensor([[[1., 2, 3, 4], [5, 6, 7, 8]]])).tolist()
    [[[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if self.ndim < 2 or key.ndim < 2 or value.ndim < 2:
      raise ValueError(f"query {self.shape}, key {key.shape} and value {value.shape} must have at least 2 dims")
    if self.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:  # tinygrad 0.14 and torch: RuntimeError
      raise ArgumentError(f"query {self.shape} and key {key.shape} must share the last dim, key and value "
                          f"{value.shape} the sequence dim (-2)")
    if enable_gqa:
      key, value = (_repeat_heads(t, _int_dim(self.shape[-3] // t.shape[-3], "enable_gqa's head ratio"))
                    for t in (key, value))
    acc = least_upper_dtype(self.dtype, key.dtype, dtypes.float32)
    qk = self.cast(acc).matmul(key.cast(acc).transpose(-2, -1)) / math.sqrt(self.shape[-1])
    if is_causal:
      # tinygrad 0.14 and torch refuse both (a RuntimeError there): which mask would win is ambiguous
      if attn_mask is not None: raise ArgumentError("attn_mask must be None when is_causal=True (pass one of them)")
      attn_mask = _tri_mask(qk, 0, upper=False)
    if attn_mask is not None:
      if attn_mask.dtype == dtypes.bool: attn_mask = attn_mask.where(0, -math.inf)
      qk = qk + attn_mask
    return qk.softmax(-1).cast(self.dtype).dropout(dropout_p) @ value

  def binary_crossentropy(self, Y: Tensor, reduction: ReductionStr = "mean") -> Tensor:
    """Binary cross-entropy between probabilities `self` and targets `Y`: -(Y*log(p) + (1-Y)*log(1-p)).

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([0.1, 0.9, 0.2]).binary_crossentropy(Tensor([0., 1., 0.])).item(), 4)
    0.1446
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return _reduce_loss(-Y * self.log() - (1 - Y) * (1 - self).log(), reduction)

  def binary_crossentropy_logits(self, Y: Tensor, reduction: ReductionStr = "mean",
                                 pos_weight: Tensor | None = None) -> Tensor:
    """Binary cross-entropy on logits `self` (stable, like torch's BCEWithLogitsLoss), optional `pos_weight`.

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([-1., 2., -3.]).binary_crossentropy_logits(Tensor([0., 1., 0.])).item(), 4)
    0.1629
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    pos = _logsigmoid(self) * Y
    if pos_weight is not None: pos = pos * pos_weight
    return _reduce_loss(-(pos + (1 - Y) * _logsigmoid(-self)), reduction)

  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: ReductionStr = "mean") -> Tensor:
    """Cross-entropy of logits `self` (..., C) against integer labels `Y` (...); the class axis is the last one.

    Labels equal to `ignore_index` don't count (with the default -1 every row counts, and a -1 label matches no class).
    `label_smoothing` mixes in the mean log-probability; "mean" divides by the number of counted labels.

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([[-1., 2., -3.], [1., -2., 3.]]).sparse_categorical_crossentropy(Tensor([1, 2])).item(), 4)
    0.0939
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"label_smoothing={label_smoothing!r} must be in [0, 1]")
    if tuple(Y.shape) != tuple(self.shape[:-1]):
      raise ValueError(f"labels of shape {Y.shape} must match the logits' shape {self.shape} without the class axis")
    log_probs = self.log_softmax(-1)
    counted = Y.ne(ignore_index) if ignore_index != -1 else _ones(Y, Y.shape, dtypes.bool)
    n = _int_dim(self.shape[-1], "sparse_categorical_crossentropy's class count")
    picked = (_one_hot_bool(Y, n) & counted.unsqueeze(-1)).where(log_probs, 0).sum(-1)
    unreduced = (1 - label_smoothing) * picked + label_smoothing * counted.where(log_probs.mean(-1), 0)
    if reduction == "mean": return -unreduced.sum() / counted.sum()
    return -_reduce_loss(unreduced, reduction)

  def cross_entropy(self, Y: Tensor, reduction: ReductionStr = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of logits `self` (N, C, ...) or (C,) against class indices or class probabilities `Y`.

    As torch.nn.functional.cross_entropy: the class axis is 1 (0 for 1-d logits).

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([[-1., 2., -3.], [1., -2., 3.]]).cross_entropy(Tensor([1, 2])).item(), 4)
    0.0939
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"label_smoothing={label_smoothing!r} must be in [0, 1]")
    cdim = 0 if self.ndim == 1 else 1
    n = self.shape[cdim]
    if tuple(self.shape) != tuple(Y.shape):
      if tuple(Y.shape) != tuple(s for d, s in enumerate(self.shape) if d != cdim):
        # an (N, 1) target is refused, as tinygrad 0.14 and torch do (their RuntimeError): class indices are (N,)
        raise ArgumentError(f"target of shape {Y.shape} must be the logits' shape {self.shape} (class probabilities) "
                            f"or it without dim {cdim} (class indices)")
      k = _int_dim(n, "cross_entropy's class count (with class indices)")
      hot = Y.unsqueeze(cdim).eq(_arange(Y, k).reshape(k, *[1] * (self.ndim - cdim - 1)))
      Y = hot.where(1.0 - label_smoothing + label_smoothing / k, label_smoothing / k)
    elif label_smoothing: Y = Y * (1 - label_smoothing) + label_smoothing / n
    return _reduce_loss(-(self.log_softmax(cdim) * Y).sum(cdim), reduction)

  def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
               reduction: ReductionStr = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities `self` (N, C, ...) at labels `Y` (N, ...), optional class `weight`.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[-1., -2.], [-3., -4.]]).nll_loss(Tensor([1, 0])).item()
    2.5
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if self.ndim < 2 or tuple(Y.shape) != (self.shape[0], *self.shape[2:]):
      raise ValueError(f"log-probs {self.shape} must be (N, C, ...) and labels {Y.shape} (N, ...)")
    if weight is None: w = _ones(Y, Y.shape, self.dtype)
    else: w = _select(weight, 0, Y.flatten(), _int_dim(self.shape[1], "nll_loss's class count")).reshape(Y.shape)
    if ignore_index is not None: w = Y.ne(ignore_index).where(w, 0)
    nll = -self.gather(1, Y.unsqueeze(1)).squeeze(1) * w  # an out-of-range label (ignore_index) picks 0
    return nll.sum() / w.sum() if reduction == "mean" else _reduce_loss(nll, reduction)

  def one_hot(self, num_classes: int) -> Tensor:
    """One-hot encoding of integer `self` along a new last axis (int32 0/1) of `num_classes` classes; a value outside
    [0, num_classes) gives a row of zeros. As tinygrad 0.14, `num_classes` is required (torch's -1, "infer it from the
    data", is refused: it would read the tensor back).

    >>> from tiny_tensor import Tensor
    >>> Tensor([0, 2]).one_hot(3).tolist()
    [[1, 0, 0], [0, 0, 1]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if not dtypes.is_int(self.dtype): raise DTypeArgumentError(f"one_hot needs an integer tensor, got {self.dtype}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 0:
      raise ValueError(f"num_classes={num_classes!r} must be a non-negative int (the class count)")
    return _one_hot_bool(self, num_classes).where(1, 0).cast(dtypes.int32)

  def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """Sort along `dim` with a bitonic network; returns (values, int32 indices). Equal values keep their order; NaNs
    sort after +inf (first when `descending`), -0.0 equals 0.0.

    >>> from tiny_tensor import Tensor
    >>> v, i = Tensor([3., 1., 2., 1.]).sort()
    >>> v.tolist(), i.tolist()
    ([1.0, 1.0, 2.0, 3.0], [1, 3, 2, 0])
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if self.ndim == 0: return self, self.zeros_like(dtype=dtypes.int32)
    dim = _resolve_dim(self, dim)
    n = _int_dim(self.shape[dim], "sort along its dim")
    if n <= 1: return self, self.zeros_like(dtype=dtypes.int32)
    if self.dtype in _SORT_KEY_INTS:  # floats sort by an int key: NaN compares unequal even to itself
      idx = _float_sort_key(self).sort(dim, descending)[1]
      return self.gather(dim, idx), idx
    stages = (n - 1).bit_length()
    shp = tuple(self.shape)
    # pad to 2**stages with values that sort last, then view the axis as `stages` binary digits (most significant first)
    x = _pad(self, tuple((0, (1 << stages) - n) if d == dim else (0, 0) for d in range(self.ndim)),
             self.dtype.min if descending else self.dtype.max)
    x = x.reshape(*shp[:dim], *(2,) * stages, *shp[dim + 1:])
    def bit_axis(b: int) -> int: return dim + stages - 1 - b
    for k in range(1, stages + 1):        # merge bitonic runs into sorted runs of 2**k
      if k < stages:  # a run sorts up or down by bit k of its position (up where it is 0, for ascending order)
        up = _arange(self, 2).eq(int(descending)).reshape(*[2 if d == bit_axis(k) else 1 for d in range(x.ndim)])
      for j in range(k - 1, -1, -1):     # compare-and-swap partners 2**j apart
        ax = bit_axis(j)
        lo, hi = _shrink_axis(x, ax, 0, 1), _shrink_axis(x, ax, 1, 2)
        small, big = lo.minimum(hi), lo.maximum(hi)
        if k < stages: first, second = up.where(small, big), up.where(big, small)
        else: first, second = (big, small) if descending else (small, big)
        x = first.cat(second, dim=ax).contiguous()
    x = _shrink_axis(x.reshape(*shp[:dim], 1 << stages, *shp[dim + 1:]), dim, 0, n)
    # indices: the r-th copy of a value in the output is the r-th copy of it in the input
    b_le_a = (_arange(self, n).unsqueeze(1) >= _arange(self, n)).reshape(n, n, *[1] * (self.ndim - dim - 1))
    def occurrence(t: Tensor) -> Tensor:  # [..a..] = #{b <= a : t[b] == t[a]}
      return (t.unsqueeze(dim + 1).eq(t.unsqueeze(dim)) & b_le_a).sum(dim + 1)
    same = x.unsqueeze(dim + 1).eq(self.unsqueeze(dim)) \
      & occurrence(x).unsqueeze(dim + 1).eq(occurrence(self).unsqueeze(dim))
    pos = _arange(self, n).reshape(n, *[1] * (self.ndim - dim - 1))
    return x, same.where(pos, 0).sum(dim + 1).cast(dtypes.int32)

  def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
    """The indices that sort `self` along `dim` (stable).

    >>> from tiny_tensor import Tensor
    >>> Tensor([2, 3, 1]).argsort().tolist()
    [2, 0, 1]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return self.sort(dim, descending)[1]

  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
    """The `k` largest (or smallest) values along `dim` and their int32 indices, in sorted order.

    `sorted_=False` allows any order; this returns them sorted either way.

    >>> from tiny_tensor import Tensor
    >>> v, i = Tensor([1., 5., 3.]).topk(2)
    >>> v.tolist(), i.tolist()
    ([5.0, 3.0], [1, 2])
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    dim = _resolve_dim(self, dim)
    n = self.shape[dim] if self.ndim else 1
    if not isinstance(k, int) or not 0 <= k <= n:
      raise ValueError(f"k={k!r} must be in [0, {n}] for dim {dim} of {self.shape}")
    v, i = self.sort(dim, descending=largest)
    if self.ndim == 0: return v, i
    return _shrink_axis(v, dim, 0, k), _shrink_axis(i, dim, 0, k)

  def cos(self) -> Tensor:
    """Cosine, accurate for large arguments too (`sin(pi/2 - x)` rounds `pi/2 - x` to x's ulp: `cos(3e7)` was 0.16).

    |x| <= 1 (and beyond max/4, where 2x overflows): 1 - 2 sin(x/2)**2, which stays near 1; else sin(2x) / (2 sin x):
    2x and x are exact, and sin is accurate relative to its value even near its zeros. Half precision goes through
    float32. The gradient is -sin(x) (differentiating the formula would cancel badly near multiples of pi).

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([3e7], device="CPU").cos().item(), 4)  # libm's sin: accurate at any argument
    -0.2654
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    from tiny_tensor.gradient import custom_gradient
    x = self._float()
    if x.dtype.itemsize < 4: return x.cast(dtypes.float32).cos().cast(x.dtype)
    ax = x.abs()
    e, m = dtypes.finfo(x.dtype)
    near = (ax <= 1) | (ax > (2 - 2.0 ** -m) * 2.0 ** (2 ** (e - 1) - 1) / 4)  # a quarter of the largest finite value
    half = (x * 0.5).sin()
    xs = near.where(1.0, x)  # the ratio's argument where it is used; 1 elsewhere (no 0/0, no inf)
    out = near.where(1.0 - 2.0 * half * half, (xs * 2.0).sin() / (xs.sin() * 2.0))
    xu = x.uop
    custom_gradient(out.uop, (xu,), lambda ctx, _: (-(xu.sin()) * ctx,))
    return out

  def triu(self, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (j - i >= diagonal); the rest is zero.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1, 2], [3, 4]]).triu().tolist()
    [[1, 2], [0, 4]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return _tri_mask(self, diagonal, upper=True).where(self, _zero_of(self))

  def tril(self, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (j - i <= diagonal); the rest is zero.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1, 2], [3, 4]]).tril().tolist()
    [[1, 0], [3, 4]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return _tri_mask(self, diagonal, upper=False).where(self, _zero_of(self))

  def cumsum(self, axis: int = 0) -> Tensor:
    """Cumulative sum along `axis` (one fused kernel: a triangular window summed, no Python loop).

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2, 3]).cumsum().tolist()
    [1, 3, 6]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return _cumulative(self, axis, "sum")

  def cumprod(self, axis: int) -> Tensor:
    """Cumulative product along `axis`.

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2, 3]).cumprod(0).tolist()
    [1, 2, 6]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return _cumulative(self, axis, "prod")

  def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """Cumulative max along `axis` and the int32 index where each running max first occurred (tinygrad's rule).

    >>> from tiny_tensor import Tensor
    >>> v, i = Tensor([0, 2, 1, 2, 3]).cummax(0)
    >>> v.tolist(), i.tolist()
    ([0, 2, 2, 2, 3], [0, 1, 1, 1, 4])
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    values = _cumulative(self, axis, "max")
    if self.ndim == 0 or 0 in self.shape: return values, self.zeros_like(dtype=dtypes.int32)
    axis = _resolve_dim(self, axis)
    n = _int_dim(self.shape[axis], "cummax along its axis")
    xt, vt = self.transpose(axis, -1), values.transpose(axis, -1)
    # [.., i, j]: x[j] reached the running max at i, for j <= i; the smallest such j wins (counted down from n)
    seen = xt.unsqueeze(-2).eq(vt.unsqueeze(-1)) & (_arange(self, n).unsqueeze(1) >= _arange(self, n))
    first = n - seen.where(_arange(self, n, 0, -1), 0).max(-1)
    return values, first.cast(dtypes.int32).transpose(axis, -1)

  def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """Cumulative min along `axis` and the int32 index where each running min first occurred.

    >>> from tiny_tensor import Tensor
    >>> Tensor([3, 1, 2]).cummin(0)[0].tolist()
    [3, 1, 1]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    def flip(t: Tensor) -> Tensor:  # an order-reversing bijection of the dtype
      return t.logical_not() if t.dtype == dtypes.bool else ~t if dtypes.is_int(t.dtype) else -t
    values, idx = flip(self).cummax(axis)
    return flip(values), idx

  def logcumsumexp(self, axis: int = 0) -> Tensor:
    """log(cumsum(exp(self))) along `axis`, stable for large values.

    >>> from tiny_tensor import Tensor
    >>> [round(v, 4) for v in Tensor([0., 0., 0.]).logcumsumexp().tolist()]
    [0.0, 0.6931, 1.0986]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if self.ndim == 0: return self
    axis = _resolve_dim(self, axis)
    x = self.transpose(axis, -1)
    n = _int_dim(x.shape[-1], "logcumsumexp along its axis")
    m = x.cummax(-1)[0].detach()  # running max, a constant for autograd
    below = _arange(self, n).unsqueeze(1) >= _arange(self, n)       # [i, j]: j <= i
    terms = below.where(x.unsqueeze(-2) - m.unsqueeze(-1), -math.inf).exp()
    return (terms.sum(-1).log() + m).transpose(-1, axis)

  def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """Rotate elements along `dims` by `shifts` (wrapping around); with `dims=None`, over the flattened tensor.

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2, 3, 4]).roll(1).tolist()
    [4, 1, 2, 3]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if dims is None:
      if not isinstance(shifts, int) and len(shifts) != 1:  # tinygrad 0.14 and torch: a RuntimeError
        raise ArgumentError(f"shifts={shifts!r} must be one int when dims is None (it rolls the flattened tensor)")
      if not isinstance(shifts, int): shifts = shifts[0]
      return (self.reshape(-1) if self.ndim != 1 else self).roll(shifts, 0).reshape(self.shape)
    dims_ = (dims,) if isinstance(dims, int) else tuple(dims)
    shifts_ = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    if len(dims_) != len(shifts_):
      raise ArgumentError(f"shifts {shifts!r} and dims {dims!r} must have the same length")
    total: dict[int, int] = {}
    for d, s in zip(dims_, shifts_): total[_resolve_dim(self, d)] = total.get(_resolve_dim(self, d), 0) + s
    if self.ndim == 0 or 0 in self.shape: return self
    x = _repeat(self, [2 if d in total else 1 for d in range(self.ndim)])
    return x.shrink(tuple((n - total[d] % n, 2 * n - total[d] % n) if d in total else (0, n)
                          for d, n in enumerate(self.shape)))

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[i][j][k] = self[index[i][j][k]][j][k] (for dim=0): pick along `dim` at integer `index` (same ndim as self).

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[0, 0], [1, 0]])).tolist()
    [[1, 1], [4, 3]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if index.ndim != self.ndim:  # a RuntimeError in tinygrad 0.14 and torch
      raise ArgumentError(f"index of shape {index.shape} must have the {self.ndim} dims of {self.shape}")
    if not dtypes.is_int(index.dtype):  # a RuntimeError in tinygrad 0.14 and torch
      raise DTypeArgumentError(f"index must be an integer tensor, got {index.dtype}")
    dim = _resolve_dim(self, dim)
    if any(i > s for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != dim):
      raise ValueError(f"index of shape {index.shape} is larger than self {self.shape} outside dim {dim}")
    n = _int_dim(self.shape[dim], "gather along its dim")
    x = self.shrink(tuple((0, n) if d == dim else (0, i) for d, i in enumerate(index.shape)))
    x = x.unsqueeze(-1).transpose(-1, dim)  # (..., 1 at dim, ..., n)
    return _one_hot_bool(index, n).where(x, 0).sum(-1).cast(self.dtype)

  def scatter(self, dim: int, index: Tensor, src: Tensor | float | int | bool,
              reduce: Literal["multiply", "add"] | None = None) -> Tensor:
    """Write `src` into a copy of `self` at `index` along `dim` (the last write wins on repeated indices).

    `src` may be a scalar. `reduce="add"`/`"multiply"` combines instead (see scatter_reduce).

    >>> from tiny_tensor import Tensor
    >>> Tensor.zeros(3).scatter(0, Tensor([2, 0]), Tensor([5., 7.])).tolist()
    [7.0, 0.0, 5.0]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if reduce not in (None, "add", "multiply"): raise ValueError(f"reduce={reduce!r} must be None, 'add' or 'multiply'")
    if isinstance(src, (int, float, bool)):
      src = type(self).full(tuple(index.shape), src, dtype=self.dtype, device=self.device)
    if reduce is not None: return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
    _, src, mask = _pre_scatter(self, dim, index, src)
    q = _int_dim(mask.shape[-1], "scatter's index along its dim")
    last = mask.where(_arange(self, 1, q + 1), 0).max(-1)  # 1 + the last q writing each place, 0 where none writes
    chosen = last.unsqueeze(-1).eq(_arange(self, 1, q + 1))
    return (last > 0).where(chosen.where(src, 0).sum(-1).cast(self.dtype), self)

  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor,
                     reduce: Literal["sum", "prod", "mean", "amax", "amin"], include_self: bool = True) -> Tensor:
    """Combine `src` into `self` at `index` along `dim` with `reduce` ("sum", "prod", "mean", "amax", "amin").

    With `include_self=False`, the places that receive values start from the reduction's identity instead of `self`.

    >>> from tiny_tensor import Tensor
    >>> Tensor([1., 1.]).scatter_reduce(0, Tensor([0, 0, 1]), Tensor([2., 3., 4.]), "sum").tolist()
    [6.0, 5.0]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise ValueError(f"reduce={reduce!r} must be one of 'sum', 'prod', 'mean', 'amax', 'amin'")
    _, src, mask = _pre_scatter(self, dim, index, src)
    hit = mask.any(-1)
    def base(ident: Any) -> Tensor | Any: return self if include_self else hit.where(ident, self)
    if reduce == "sum": return mask.where(src, 0).sum(-1).cast(self.dtype) + base(0)
    if reduce == "prod": return mask.where(src, 1).prod(-1).cast(self.dtype) * base(1)
    if reduce == "amax": return mask.where(src, self.dtype.min).max(-1).maximum(base(self.dtype.min))
    if reduce == "amin": return mask.where(src, self.dtype.max).min(-1).minimum(base(self.dtype.max))
    count = mask.where(1, 0).sum(-1) + (1 if include_self else hit.where(0, 1))
    total = mask.where(src, 0).sum(-1).cast(self.dtype) + base(0)
    return (total / count).floor().cast(self.dtype) if dtypes.is_int(self.dtype) else total / count

  def masked_fill(self, mask: Tensor, value: Tensor | float | int | bool) -> Tensor:
    """`value` where `mask` is True, else `self` (broadcasting).

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2, 3]).masked_fill(Tensor([True, False, True]), 0).tolist()
    [0, 2, 0]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return mask.where(value, self)

  def pad2d(self, padding: Sequence[int], value: float = 0.0) -> Tensor:
    """Constant-pad the last len(padding)//2 dims, torch-style flat `(left, right, top, bottom, ...)`; negatives crop.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1, 2]]).pad2d((1, 0, 0, 1)).tolist()
    [[0, 1, 2], [0, 0, 0]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    p = tuple(padding)
    if len(p) % 2 or len(p) // 2 > self.ndim:
      raise ValueError(f"padding={padding!r} must hold (before, after) pairs for at most {self.ndim} dims")
    nd = len(p) // 2
    return _pad(self, ((0, 0),) * (self.ndim - nd) + _grouped_pads(p, nd), value)

  def unfold(self, dim: int, size: int, step: int) -> Tensor:
    """Windows of `size` elements every `step` along `dim`: that dim becomes the window count, a new last dim the
    window.

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2, 3, 4, 5]).unfold(0, 2, 2).tolist()
    [[1, 2], [3, 4]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    dim = _resolve_dim(self, dim)
    # bad sizes raise a RuntimeError in tinygrad 0.14 and torch: ArgumentError is one (and a ValueError)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
      raise ArgumentError(f"step={step!r} must be a positive int")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= self.shape[dim]:
      raise ArgumentError(f"size={size!r} must be in [0, {self.shape[dim]}] (dim {dim} of {self.shape})")
    if size == 0:  # as torch: (n - 0) // step + 1 empty windows
      n_win = (self.shape[dim] - size) // step + 1
      empty = self.unsqueeze(-1).shrink(tuple((0, s) for s in self.shape) + ((0, 0),))  # (..., 0): no elements
      return empty.reshape(self.shape[:dim] + (n_win,) + self.shape[dim + 1:] + (0,))
    order = tuple(d for d in range(self.ndim) if d != dim) + (dim,)
    win = _pool(self.permute(order), (size,), (step,), (1,))            # (..others, n_windows, size)
    back = [order.index(d) for d in range(self.ndim)]
    return win.permute(tuple(back) + (self.ndim,))

  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of dims (dim1, dim2) as a new last dim (`offset` > 0 above the main one, < 0 below), like torch.

    >>> from tiny_tensor import Tensor
    >>> Tensor.arange(9).reshape(3, 3).diagonal(1).tolist()
    [1, 5]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    d1, d2 = _resolve_dim(self, dim1), _resolve_dim(self, dim2)
    if d1 == d2:  # a RuntimeError in tinygrad 0.14 and torch
      raise ArgumentError(f"dim1={dim1} and dim2={dim2} name the same dim of {self.shape}; pick two different dims")
    rest = [d for d in range(self.ndim) if d not in (d1, d2)]
    x = self.permute(tuple(rest) + (d1, d2))
    r, c = _int_shape(x, "diagonal over its two dims", -2)
    r0, c0 = min(max(-offset, 0), r), min(max(offset, 0), c)
    n = max(0, min(r - r0, c - c0))
    lead = tuple(x.shape[:-2])
    x = x.shrink(tuple((0, s) for s in lead) + ((r0, r0 + n), (c0, c0 + n)))
    if n == 0: return x.reshape(lead + (0,))
    # (.., n, n) -> (.., n*n) -> pad to (.., n*(n+1)) -> (.., n, n+1): column 0 of row a is element (a, a)
    x = _pad(x.reshape(lead + (n * n,)), ((0, 0),) * len(lead) + ((0, n),)).reshape(lead + (n, n + 1))
    return _shrink_axis(x, x.ndim - 1, 0, 1).reshape(lead + (n,))

  def diag(self) -> Tensor:
    """A square matrix with the 1-d `self` on its diagonal.

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2]).diag().tolist()
    [[1, 0], [0, 2]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if self.ndim != 1: raise ValueError(f"diag needs a 1-d tensor, got shape {self.shape}")
    n = _int_dim(self.shape[0], "diag")
    if n == 0: return self.reshape(0, 0)
    # row a = (x_a, n zeros); flattened, x_a lands at a*(n+1): the diagonal of an (n, n) view
    flat = _pad(self.unsqueeze(-1), ((0, 0), (0, n))).reshape(n * (n + 1))
    return flat.shrink(((0, n * n),)).reshape(n, n)

  def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids from 0-d or 1-d tensors, as torch.meshgrid ("ij": matrix indexing, "xy": first two dims
    swapped); a 0-d tensor counts as one element.

    >>> from tiny_tensor import Tensor
    >>> [t.tolist() for t in Tensor([1, 2]).meshgrid(Tensor([3, 4, 5]))]
    [[[1, 1, 1], [2, 2, 2]], [[3, 4, 5], [3, 4, 5]]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if indexing not in ("ij", "xy"): raise ArgumentError(f"indexing={indexing!r} must be 'ij' or 'xy'")
    ts = (self, *args)
    if any(t.ndim > 1 for t in ts):  # torch refuses these (tinygrad 0.14 flattens them)
      raise ArgumentError(f"meshgrid needs 0-d or 1-d tensors, got shapes {[t.shape for t in ts]}")
    ts = tuple(t.reshape(1) if t.ndim == 0 else t for t in ts)
    axes = list(range(len(ts)))
    if indexing == "xy" and len(ts) > 1: axes[0], axes[1] = 1, 0
    shape: list[sint] = [0] * len(ts)
    for t, a in zip(ts, axes): shape[a] = t.shape[0]
    return tuple(t.reshape(tuple(t.shape[0] if d == a else 1 for d in range(len(ts)))).expand(tuple(shape))
                 for t, a in zip(ts, axes))

  def rearrange(self, formula: str, **sizes: int) -> Tensor:
    """einops-style reshape/permute: `x.rearrange("b (h w) c -> b c h w", h=4)`. Groups in () split or merge dims,
    `1` is a unit dim, `...` stands for the dims not named; give the sizes a split can't infer.

    >>> from tiny_tensor import Tensor
    >>> Tensor.arange(6).reshape(2, 3).rearrange("a b -> b a").tolist()
    [[0, 3], [1, 4], [2, 5]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if formula.count("->") != 1: raise ValueError(f"rearrange {formula!r} needs exactly one '->'")
    lhs_s, rhs_s = formula.split("->")
    lhs, rhs = _rearrange_side(lhs_s, formula), _rearrange_side(rhs_s, formula)
    if lhs.count(["..."]) > 1 or rhs.count(["..."]) > 1:
      raise ValueError(f"rearrange {formula!r}: '...' twice on a side")
    if ["..."] not in lhs and len(lhs) != self.ndim:
      raise ValueError(f"rearrange {formula!r}: the left side names {len(lhs)} dims, the tensor has shape {self.shape}")
    if ["..."] in lhs:
      n_ell = self.ndim - len(lhs) + 1
      if n_ell < 0: raise ValueError(f"rearrange {formula!r} names more dims than the tensor's shape {self.shape}")
      def expand_ell(side: list[list[str]]) -> list[list[str]]:
        out: list[list[str]] = []
        for g in side: out += [[f"...{i}"] for i in range(n_ell)] if g == ["..."] else [g]
        return out
      lhs, rhs = expand_ell(lhs), expand_ell(rhs)
    names_l, names_r = [n for g in lhs for n in g], [n for g in rhs for n in g]
    if "..." in names_l + names_r or sorted(names_l) != sorted(names_r) or len(set(names_l)) != len(names_l):
      raise ValueError(f"rearrange {formula!r}: both sides must name the same axes, each once "
                       "(and '...' not inside ())")
    for k in sizes:
      if k not in names_l: raise ValueError(f"rearrange {formula!r}: size given for unknown axis {k!r}")
    # the size of every named axis, from the input's shape and the given sizes
    size: dict[str, int] = {}
    for g, s in zip(lhs, _int_shape(self, "rearrange")):
      known = [sizes[n] for n in g if n in sizes]
      unknown = [n for n in g if n not in sizes]
      if len(unknown) > 1 or (not unknown and math.prod(known) != s) or (unknown and s % max(math.prod(known), 1)):
        raise ValueError(f"rearrange {formula!r}: can't split a dim of size {s} into {g} with sizes {sizes}")
      for n in g: size[n] = sizes[n] if n in sizes else s // max(math.prod(known), 1)
    x = self.reshape(tuple(size[n] for n in names_l))
    x = x.permute(tuple(names_l.index(n) for n in names_r))
    return x.reshape(tuple(math.prod(size[n] for n in g) for g in rhs))

  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """self / max(||self||_p over `dim`, eps), as torch.nn.functional.normalize.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[3., 4.]]).normalize().tolist()
    [[0.6000000238418579, 0.800000011920929]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if p == 0: return self / self.ne(0).sum(dim, keepdim=True).maximum(eps)
    a = self.abs()
    if p > 0:  # |x|**p with torch's 0 gradient at x = 0 (pow's slope there is inf for p < 1, and times sign(0) NaN)
      nz = a > 0
      a = nz.where(nz.where(a, 1.0).pow(p), 0.0)
    else: a = a.pow(p)
    s = a.sum(dim, keepdim=True)
    # the norm s**(1/p) is above eps where s > eps**p for p > 0, where s < eps**p for p < 0 (s**(1/p) decreases); else
    # it is clamped to eps, with pow(1/p)'s infinite slope at 0 kept out of the gradient. eps**p past float range: inf
    log_thr = p * math.log(eps) if eps > 0 else (-math.inf if p > 0 else math.inf)
    thr = math.inf if log_thr > 700 else eps ** p
    big = s > thr if p > 0 else s < thr
    return self / big.where(big.where(s, 1.0).pow(1 / p), eps)

  def softmin(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """softmax(-self) along `axis`.

    >>> from tiny_tensor import Tensor
    >>> [round(v, 4) for v in Tensor([1., 2.]).softmin().tolist()]
    [0.7311, 0.2689]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return (-self).softmax(axis, dtype) if dtype is not None else (-self).softmax(axis)

  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """Sample `num_samples` int32 indices per row of the non-negative weights `self` (1-d or 2-d).

    With replacement: inverse-CDF sampling; without: the Efraimidis-Spirakis keys log(u)/w, top `num_samples`.

    >>> from tiny_tensor import Tensor
    >>> Tensor([0., 0., 1.]).multinomial(2, replacement=True).tolist()
    [2, 2]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if not 1 <= self.ndim <= 2: raise ValueError(f"multinomial needs 1-d or 2-d weights, got shape {self.shape}")
    if not isinstance(num_samples, int) or num_samples < 1:
      raise ValueError(f"num_samples={num_samples!r} must be a positive int")
    w = self.unsqueeze(0) if self.ndim == 1 else self
    rows, n = w.shape
    if not replacement and num_samples > n:
      raise ValueError(f"can't draw {num_samples} samples without replacement from {n} categories")
    if replacement or num_samples == 1:
      cw = w.cumsum(1).cast(dtypes.float32)
      cdf = cw / _shrink_axis(cw, 1, n - 1, n)
      u = type(self).rand(num_samples, rows, 1, device=self.device, dtype=dtypes.float32)
      idx = (u >= cdf).sum(2).minimum(n - 1).permute(1, 0)  # the first category whose cdf passes u
    else:
      keys = type(self).rand(rows, n, device=self.device, dtype=dtypes.float32).log() / w.cast(dtypes.float32)
      idx = keys.topk(num_samples, 1)[1]
    return (idx.squeeze(0) if self.ndim == 1 else idx).cast(dtypes.int32)

  @classmethod
  def randperm(cls, n: int, device: str | None = None, dtype: DType = dtypes.int32,
               **kwargs: Any) -> Tensor:
    """A random permutation of 0..n-1: `Tensor.randperm(5)`.

    >>> from tiny_tensor import Tensor
    >>> sorted(Tensor.randperm(5).tolist())
    [0, 1, 2, 3, 4]
    """
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    if not isinstance(n, int) or n < 0: raise ValueError(f"randperm n={n!r} must be a non-negative int")
    return cls.rand(n, device=device, **kwargs).argsort().cast(dtype)
