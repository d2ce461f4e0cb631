"""Math ops composed from core Tensor ops: inverse trigonometry, copysign/fmod/logaddexp, closeness tests,
data-dependent selection (nonzero, masked_select), bitcasts between item sizes, Newton-Schulz and QR, and the small
shape helpers of tinygrad's Tensor (pad_to, shrink_to, max_shape).

Like nnops', the ops are the methods of a mixin, `MathOpsMixin`, one of `Tensor`'s bases. Ops whose composed graph
would differentiate badly (a polynomial approximation, a formula that hits inf * 0) get their exact derivative
through `with_gradient`.

Typing: each method opens with `if TYPE_CHECKING: assert isinstance(self, Tensor)`, which narrows `self` to
`Tensor` for mypy and IDEs at no run-time cost, so a body is checked against Tensor's own signatures (a Protocol
or stub base would restate them all, and still not be a `Tensor` where one is passed or returned).

>>> from tiny_tensor import Tensor
>>> round(Tensor([1.0]).atan().item(), 6), Tensor([3, -3]).fmod(2).tolist()
(0.785398, [1, -1])
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tiny_uop.dtype import DType, dtypes
from tiny_uop.helpers import polyN, prod
from tiny_uop.uop import Ops

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor

__all__ = ["MathOpsMixin"]


def float_fmod(a: Tensor, b: Tensor) -> Tensor:
  """C's `fmod` of floats (the sign of a): the IR's float CMOD, exact for every pair (`a - trunc(a/b)*b` was wrong
  once |a/b| passed 2**mantissa). Half precision through float32. Gradients: 1 for a, -trunc(a/b) for b."""
  from tiny_tensor.gradient import custom_gradient
  if a.dtype.itemsize < 4: return float_fmod(a.float(), b.float()).cast(a.dtype)
  r = a._wrap(a.uop.alu(Ops.CMOD, b.uop), b)
  au, bu, qu = a.uop, b.uop, ((a - r) / b).uop
  custom_gradient(r.uop, (au, bu), lambda ctx, _: (ctx, -(qu.detach()) * ctx))
  return r


def with_gradient(out: Tensor, inputs: Sequence[Tensor], fn: Callable[..., Sequence[Tensor | None]]) -> Tensor:
  """Give `out` the gradient `fn(grad_out, out, *inputs)` (one Tensor or None per input) instead of differentiating
  its graph; returns `out`. `fn` gets fresh Tensors over the nodes and must not hold Tensors itself: a Tensor's .grad
  may lead back to `out`, which would keep the registration alive forever (a thin layer over `custom_gradient`)."""
  from tiny_tensor.gradient import custom_gradient
  T, uops, shapes = type(out), tuple(i.uop for i in inputs), tuple(i.shape for i in inputs)
  def grads(ctx: Any, node: Any) -> tuple:
    gs = fn(T.from_uop(ctx), T.from_uop(node), *[T.from_uop(u) for u in uops])
    return tuple(None if g is None else g._broadcast_to(s).cast(u.dtype).uop for g, u, s in zip(gs, uops, shapes))
  custom_gradient(out.uop, uops, grads)
  return out


def _abs(x: Tensor) -> Tensor:
  """|x| that keeps +-inf (inf, not inf * sign + inf * 0)."""
  return (x < 0).where(-x, x)


# ***** inverse trigonometry (Abramowitz & Stegun, Handbook of Mathematical Functions, 4.4.46 and 4.4.49) *****

# acos(x) = sqrt(1 - x) * P(x) for 0 <= x <= 1, |error| <= 2e-8 (A&S 4.4.46; coefficients highest power first)
_ACOS = [-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874, -0.2145988016,
         1.5707963050]
# atan(x) = x * Q(x^2) for 0 <= x <= 1, |error| <= 2e-8 (A&S 4.4.49)
_ATAN = [0.0028662257, -0.0161657367, 0.0429096138, -0.0752896400, 0.1065626393, -0.1420889944, 0.1999355085,
         -0.3333314528, 1.0]


# ***** elementwise *****


# ***** data-dependent selection *****


def _compact(flat_mask: Tensor, size: int) -> Tensor:
  """For each k < size, the flat index of the k-th True in `flat_mask` (1-D), or -1 past the last True."""
  T = type(flat_mask)
  pos = flat_mask.cast(dtypes.int32).cumsum(0) - 1  # rank of each True
  hit = flat_mask.reshape(1, -1) & (pos.reshape(1, -1) == T.arange(size, device=flat_mask.device).reshape(-1, 1))
  n = flat_mask.shape[0]
  idx = T.arange(n, device=flat_mask.device).reshape(1, -1)
  return hit.any(1).where(hit.where(idx, 0).sum(1, dtype=dtypes.int32), -1)


def _count(mask: Tensor, size: int | None) -> int:
  if size is not None:
    if not isinstance(size, int) or size < 0: raise ValueError(f"size={size!r} must be a non-negative int or None")
    return size
  return int(mask.cast(dtypes.int32).sum().item())  # data-dependent: realizes the mask


# ***** shapes *****


def _max_shape(self) -> tuple[int, ...]:
  """The shape with every symbolic dim replaced by its maximum."""
  return tuple(s if isinstance(s, int) else int(s.vmax) for s in self.shape)


# ***** linear algebra *****


# ***** bitcast between item sizes *****


def _uint(n: int) -> DType:
  return {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[n]


def bitcast_sized(x: Tensor, dt: DType) -> Tensor:
  """The bytes of `x` read as `dt` of another item size (little-endian, like numpy's `view`): the last dim scales by
  the size ratio. Built from same-size bitcasts and shifts of unsigned ints, so every device runs it."""
  a, b = x.dtype.itemsize, dt.itemsize
  u = x.bitcast(_uint(a))
  if a > b:  # split each item into a // b little-endian parts
    k = a // b
    parts = [(u >> (8 * b * i)) if i else u for i in range(k)]
    mask = (1 << (8 * b)) - 1
    small = type(x).stack(*[(p & mask).cast(_uint(b)) for p in parts], dim=-1)
    return small.reshape(*x.shape[:-1], x.shape[-1] * k).bitcast(dt)
  k = b // a
  wide = u.reshape(*x.shape[:-1], x.shape[-1] // k, k).cast(_uint(b))
  lanes = wide.split(1, dim=-1)
  acc = lanes[0].squeeze(-1)
  for i in range(1, k): acc = acc | (lanes[i].squeeze(-1) << (8 * a * i))
  return acc.bitcast(dt)


class MathOpsMixin:
  """The composed math ops of `Tensor` (one of its bases): `x.atan()`, `x.isclose(y)`, `x.qr()`."""
  __slots__ = ()

  def acos(self) -> Tensor:
    """Inverse cosine in [0, pi]; NaN outside [-1, 1].

    >>> from tiny_tensor import Tensor
    >>> [round(v, 5) for v in Tensor([1.0, 0.0, -1.0]).acos().tolist()]
    [0.0, 1.5708, 3.14159]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    x = self._float()
    a = _abs(x)
    r = (1 - a).sqrt() * polyN(a, _ACOS)
    out = (x < 0).where(math.pi - r, r)
    return with_gradient(out, (x,), lambda g, _, x: (-g * (1 - x * x).rsqrt(),))  # d acos = -1/sqrt(1-x^2)

  def asin(self) -> Tensor:
    """Inverse sine in [-pi/2, pi/2]; NaN outside [-1, 1].

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([1.0]).asin().item(), 5)
    1.5708
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    x = self._float()
    a = _abs(x)
    r = math.pi / 2 - (1 - a).sqrt() * polyN(a, _ACOS)
    out = (x < 0).where(-r, r)
    return with_gradient(out, (x,), lambda g, _, x: (g * (1 - x * x).rsqrt(),))  # d asin = 1/sqrt(1-x^2)

  def atan(self) -> Tensor:
    """Inverse tangent in (-pi/2, pi/2) (atan(+-inf) = +-pi/2).

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([-1.0]).atan().item(), 5)
    -0.7854
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    x = self._float()
    a = _abs(x)
    big = a > 1
    t = big.where(a.reciprocal(), a)  # atan(a) = pi/2 - atan(1/a) for a > 1
    r = t * polyN(t * t, _ATAN)
    r = big.where(math.pi / 2 - r, r)
    out = (x < 0).where(-r, r)
    return with_gradient(out, (x,), lambda g, _, x: (g / (1 + x * x),))  # d atan = 1/(1+x^2)

  def log10(self) -> Tensor:
    """Base-10 logarithm.

    >>> from tiny_tensor import Tensor
    >>> Tensor([100.0]).log10().item()
    2.0
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return self.log2() * math.log10(2)

  def copysign(self, other: Any) -> Tensor:
    """|self| with the sign of `other` (-0.0 counts as negative), like numpy and torch.

    >>> from tiny_tensor import Tensor
    >>> Tensor([1.0, 2.0]).copysign(Tensor([-0.0, 3.0])).tolist()
    [-1.0, 2.0]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    a, b = self._float()._broadcasted(other)
    a, b = a._float(), b._float()
    mag = _abs(a)
    return ((b < 0) | (b.reciprocal() < 0)).where(-mag, mag)

  def fmod(self, x: Any) -> Tensor:
    """C remainder of self / x: the sign follows the dividend (`%` follows the divisor).

    >>> from tiny_tensor import Tensor
    >>> Tensor([-7, 7]).fmod(3).tolist(), Tensor([-7.5]).fmod(2).tolist()
    ([-1, 1], [-1.5])
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    a, b = self._broadcasted(x)
    if not dtypes.is_float(a.dtype): return a - a.div(b, rounding_mode="trunc") * b
    return float_fmod(a, b)

  def logaddexp(self, other: Any) -> Tensor:
    """log(exp(self) + exp(other)), computed stably (-inf and -inf give -inf).

    >>> from tiny_tensor import Tensor
    >>> round(Tensor([0.0]).logaddexp(0.0).item(), 5)
    0.69315
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    a, b = self._float()._broadcasted(other)
    a, b = a._float(), b._float()
    m = a.maximum(b).detach()
    m = m.isinf().where(0, m)
    return ((a - m).exp() + (b - m).exp()).log() + m

  def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|self - other| <= atol + rtol * |other| elementwise (equal infinities are close; NaNs only with equal_nan).

    >>> from tiny_tensor import Tensor
    >>> Tensor([1.0, 1.1, float('nan')]).isclose(Tensor([1.0 + 1e-9, 1.0, float('nan')])).tolist()
    [True, False, False]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    a, b = self._broadcasted(other)
    if not dtypes.is_float(a.dtype): a, b = a._float(), b._float()
    diff = a - b
    close = (a == b) | (_abs(diff) <= atol + rtol * _abs(b))
    close = close & a.isfinite() & b.isfinite() | (a == b)
    return close | (a.isnan() & b.isnan()) if equal_nan else close

  def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """True when every element is `isclose` (realizes).

    >>> from tiny_tensor import Tensor
    >>> Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7]))
    True
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

  def nonzero(self, size: int | None = None, fill_value: Any = 0) -> Tensor:
    """Indices of the nonzero elements, shape (n, ndim) int32, in row-major order. `size=N` gives exactly N rows
    (padded with `fill_value` or truncated) without reading the data; `size=None` reads how many there are.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1, 0], [0, 2]]).nonzero().tolist()
    [[0, 0], [1, 1]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    mask = self.flatten().ne(0) if self.ndim else self.reshape(1).ne(0)
    n = _count(mask, size)
    flat = _compact(mask, n)
    strides = [prod(self.shape[i + 1:]) for i in range(self.ndim)]
    cols = [(flat // st) % sh for st, sh in zip(strides, self.shape)] if self.ndim else []
    T = type(self)
    out = T.stack(*cols, dim=1) if cols else T.zeros(n, 0, dtype=dtypes.int32, device=self.device)
    return (flat < 0).reshape(-1, 1).where(fill_value, out).cast(dtypes.int32) if cols else out

  def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
    """The elements of `self` where the bool `mask` (broadcast to self's shape) is True, as a 1-D tensor. `size=N`
    gives exactly N elements (padded with `fill_value`) without reading the data.

    >>> from tiny_tensor import Tensor
    >>> Tensor([[1, 2], [3, 4]]).masked_select(Tensor([[True, False], [False, True]])).tolist()
    [1, 4]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if mask.dtype != dtypes.bool: raise TypeError(f"masked_select needs a bool mask, got {mask.dtype}")
    m = mask._broadcast_to(self.shape).flatten()
    x = self.flatten()
    n = _count(m, size)
    flat = _compact(m, n)
    picked = (flat.reshape(-1, 1) == type(self).arange(x.shape[0], device=self.device).reshape(1, -1))
    vals = picked.where(x.reshape(1, -1), 0).sum(1, dtype=self.dtype) if self.dtype != dtypes.bool else \
      (picked & x.reshape(1, -1)).any(1)
    return (flat < 0).where(fill_value, vals).cast(self.dtype)

  def pad_to(self, shape: Any, *args: Any, value: Any = 0) -> Tensor:
    """Pad at the end of each dim up to `shape` (None keeps a dim).

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2]).pad_to(4).tolist()
    [1, 2, 0, 0]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    from tiny_tensor.helpers import argfix
    new = argfix(shape, *args)
    if len(new) != self.ndim: raise ValueError(f"pad_to {new} needs one size per dim of {self.shape}")
    pads = tuple((0, 0 if n is None else n - s) for s, n in zip(self.shape, new))
    if any(isinstance(a, int) and a < 0 for _, a in pads):
      raise ValueError(f"pad_to {new} is smaller than {self.shape}")
    return self._pad_raw(pads, value)

  def shrink_to(self, shape: Any, *args: Any) -> Tensor:
    """Keep the first `shape[i]` elements of each dim (None keeps a dim).

    >>> from tiny_tensor import Tensor
    >>> Tensor([1, 2, 3]).shrink_to(2).tolist()
    [1, 2]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    from tiny_tensor.helpers import argfix
    new = argfix(shape, *args)
    if len(new) != self.ndim: raise ValueError(f"shrink_to {new} needs one size per dim of {self.shape}")
    return self.shrink(tuple(None if n is None else (0, n) for n in new))

  def const_like(self, b: Any) -> Tensor:
    """A constant with this tensor's shape, dtype and device."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return self.full_like(b)

  def usum(self, *xs: Any) -> Tensor:
    """self + x1 + x2 + ... (or for bool tensors)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    from tiny_tensor.helpers import argfix
    return functools.reduce(lambda a, b: a | b if a.dtype == dtypes.bool else a + b, argfix(*xs), self)

  def uprod(self, *xs: Any) -> Tensor:
    """self * x1 * x2 * ... (and for bool tensors)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    from tiny_tensor.helpers import argfix
    return functools.reduce(lambda a, b: a & b if a.dtype == dtypes.bool else a * b, argfix(*xs), self)

  def max_numel(self) -> int:
    """The number of elements with every symbolic dim at its maximum."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return prod(self.max_shape)

  def newton_schulz(self, steps: int, params: Sequence[float], eps: float = 1.0e-7) -> Tensor:
    """`steps` Newton-Schulz iterations of the odd polynomial with coefficients `params` on the last two dims, after
    scaling by the Frobenius norm: X <- sum_i params[i] * (X X^T)^i X (Muon's orthogonalization).

    >>> from tiny_tensor import Tensor
    >>> Tensor([[3.0, 0.0], [0.0, 1.0]]).newton_schulz(10, (1.5, -0.5)).round().tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if self.ndim < 2: raise ValueError(f"newton_schulz needs at least 2 dims, got shape {self.shape}")
    if self.shape[-2] > self.shape[-1]:
      return self.transpose(-2, -1).newton_schulz(steps, params, eps).transpose(-2, -1)
    g = self / (self.square().sum(axis=(-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
      gram = g @ g.transpose(-2, -1)
      term, acc = g, g * params[0]
      for p in params[1:]:
        term = gram @ term
        acc = acc + p * term
      g = acc
    return g

  def qr(self) -> tuple[Tensor, Tensor]:
    """QR decomposition of the last two dims (m, n) by Householder reflections: Q (m, m) orthogonal, R (m, n) upper
    triangular, Q @ R = self. Signs follow LAPACK's (R's diagonal may be negative), as numpy and torch.

    >>> from tiny_tensor import Tensor
    >>> q, r = Tensor([[3.0, 1.0], [4.0, 2.0]]).qr()
    >>> [round(v, 4) for v in (q @ r).flatten().tolist()]
    [3.0, 1.0, 4.0, 2.0]
    """
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    if self.ndim < 2: raise ValueError(f"qr needs at least 2 dims, got shape {self.shape}")
    T = type(self)
    m, n = int(self.shape[-2]), int(self.shape[-1])
    batch = tuple(self.shape[:-2])
    r = self._float()
    q = T.eye(m, dtype=r.dtype, device=self.device).reshape((1,) * len(batch) + (m, m)).expand(*batch, m, m)
    rows = T.arange(m, device=self.device).reshape(-1, 1)
    for k in range(min(m - 1, n)):
      col = r[..., :, k:k + 1]  # (..., m, 1)
      x = (rows >= k).where(col, 0)
      xk = r[..., k:k + 1, k:k + 1]
      norm = x.square().sum(-2, keepdim=True).sqrt()
      alpha = -norm.copysign(xk)  # reflect onto -sign(x_k) * |x| e_k (no cancellation)
      v = x - (rows == k).where(alpha, 0)
      vv = v.square().sum(-2, keepdim=True)
      beta = (vv > 0).where(2 / (vv > 0).where(vv, 1), 0)  # a zero column needs no reflection
      r = r - v @ (beta * (v.transpose(-2, -1) @ r))
      q = q - (q @ v) @ (beta * v.transpose(-2, -1))
    return q, r
