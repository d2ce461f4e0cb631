"""Tensor creation: constants built lazily from CONST + movement ops (`full`, `arange`, `eye`), buffers (`empty`) and
counter-based random numbers (threefry2x32, reproducible for a seed on every device).

`CreationMixin` is one of `Tensor`'s bases; use these as `Tensor.zeros(2, 3)`, `Tensor.rand(4)`, ...

Typing: each method opens with `if TYPE_CHECKING: assert isinstance(self, Tensor)`, which narrows `self` to
`Tensor` for mypy and IDEs at no run-time cost, so a body is checked against Tensor's own signatures (a Protocol
or stub base would restate them all, and still not be a `Tensor` where one is passed or returned).
"""
from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tiny_uop.dtype import dtypes, to_dtype
from tiny_uop.helpers import ceildiv, prod
from tiny_tensor import engine
from tiny_tensor.helpers import _canonical_device, _check_shape, argfix

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor

__all__ = ["CreationMixin"]

_rng_index: dict[tuple[str, int], Tensor] = {}  # (device, n) -> a realized uint32 buffer 0..n-1
_rng_lock = threading.RLock()  # the seed and the per-device draw counters: one draw at a time advances them


class CreationMixin:
  """Constructors and random numbers of `Tensor` (classmethods, called as `Tensor.ones(3)`)."""
  __slots__ = ()
  _seed: ClassVar[int] = 0
  _rng_counters: ClassVar[dict[str, Tensor]] = {}  # per device: how many random words were drawn (on the device)

  @classmethod
  def empty(cls, *shape: Any, device: str | None = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """An uninitialized tensor of `shape`."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    shp = _check_shape(argfix(*shape))
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    buf = engine.buffer_from_bytes(_canonical_device(device), prod(shp), dt, None)
    return cls(buf.reshape(shp), requires_grad=kwargs.get("requires_grad"))

  @classmethod
  def full(cls, shape: Any, fill_value: Any, **kwargs: Any) -> Tensor:
    """A constant tensor of `shape` filled with `fill_value` (a lazy constant that folds into its users)."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    shp = _check_shape(argfix(shape))
    rg = kwargs.pop("requires_grad", None)  # the full tensor is the leaf (not the scalar it is expanded from)
    return cls(fill_value, **kwargs).reshape((1,) * len(shp)).expand(shp).requires_grad_(rg)

  @classmethod
  def zeros(cls, *shape: Any, **kwargs: Any) -> Tensor:
    """A tensor of zeros: `Tensor.zeros(2, 3)`."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    return cls.full(argfix(*shape), 0.0, **{"dtype": dtypes.default_float, **kwargs})

  @classmethod
  def ones(cls, *shape: Any, **kwargs: Any) -> Tensor:
    """A tensor of ones: `Tensor.ones(2, 3)`."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    return cls.full(argfix(*shape), 1.0, **{"dtype": dtypes.default_float, **kwargs})

  def full_like(self, fill_value: Any, **kwargs: Any) -> Tensor:
    """A constant tensor of this one's shape (and dtype and device unless given). A Python int that this int dtype
    can't hold is an error (an explicit `dtype=` wraps it, as `Tensor(x, dtype=...)` does)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    dt = self.dtype
    if "dtype" not in kwargs and type(fill_value) is int and dtypes.is_int(dt) and \
       not dtypes.min(dt) <= fill_value <= dtypes.max(dt):
      raise ValueError(f"full_like: Python int {fill_value} is out of range for the tensor's dtype {dt!r}, which holds "
                       f"[{dtypes.min(dt)}, {dtypes.max(dt)}]; pass dtype= (e.g. dtypes.int64)")
    return type(self).full(self.shape, fill_value, **{"dtype": dt, "device": self.device, **kwargs})

  def empty_like(self, **kwargs: Any) -> Tensor:
    """An uninitialized tensor of this one's shape (and dtype and device unless given)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return type(self).empty(self.shape, **{"dtype": self.dtype, "device": self.device, **kwargs})

  def zeros_like(self, **kwargs: Any) -> Tensor:
    """Zeros of this shape (dtype and device unless given)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return self.full_like(0, **kwargs)
  def ones_like(self, **kwargs: Any) -> Tensor:
    """Ones of this shape (dtype and device unless given)."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return self.full_like(1, **kwargs)

  @classmethod
  def _arange_idx(cls, n: int, device: str | None) -> Tensor:
    """int32 [1, 2, ..., n] built from constants: an upper-triangular mask (pad+reshape) summed over its rows."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    if n == 0: return cls.zeros(0, dtype=dtypes.int32, device=device)
    if n > 4096:  # keep the triangle small (its flat size is ~2*n*n): [1..n] = (row*b + [1..b]) over rows of b
      b = math.isqrt(n - 1) + 1
      rows = cls._arange_idx(ceildiv(n, b), device) - 1
      return (rows.reshape(-1, 1) * b + cls._arange_idx(b, device).reshape(1, b)).flatten()[:n]
    ones = cls.full((n,), 1, dtype=dtypes.int32, device=device).pad((0, n))         # (2n,): n ones then n zeros
    tri = ones.reshape(1, 2 * n).expand(n, 2 * n).reshape(2 * n * n)[:n * (2 * n - 1)]  # row i is shifted by i
    return tri.reshape(n, 2 * n - 1)[:, :n].sum(0)                                       # tri[i, j] = (j >= i)

  @classmethod
  def arange(cls, start: Any, stop: Any = None, step: Any = 1, **kwargs: Any) -> Tensor:
    """`[start, start+step, ...)` up to `stop` (exclusive), lazily from constants.

    >>> Tensor.arange(5).tolist(), Tensor.arange(1, 2, 0.25).tolist()
    ([0, 1, 2, 3, 4], [1.0, 1.25, 1.5, 1.75])
    """
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange: step must not be 0")
    all_int = not any(isinstance(x, float) for x in (start, stop, step))
    # exact for ints: a float quotient loses the count past 2**53
    n = max(0, -((start - stop) // step) if all_int else math.ceil((stop - start) / step))
    lo, hi = sorted((start, start + (n - 1) * step)) if n else (start, start)
    # an int range default_int can't hold picks int64 (uint64 past it), as tinygrad and torch do
    dt = to_dtype(kwargs.pop("dtype", dtypes.int_for(lo, hi) if all_int else dtypes.default_float))
    if n and (lo < dt.min or dt.max < hi):
      raise ValueError(f"arange [{start}, {stop}) is not representable in dtype {dt}")
    idx = cls._arange_idx(n, kwargs.pop("device", None))
    if dtypes.is_float(dt): ret = (idx.cast(dt) - 1) * step + start
    elif dtypes.min(dtypes.int32) <= min(lo, step) and max(hi, step) <= dtypes.max(dtypes.int32):
      ret = ((idx - 1) * step + start).cast(dt)  # int32 index math, then the dtype
    else: ret = (idx.cast(dt) - 1) * step + start  # values past int32: the math in the wide dtype itself
    return ret.requires_grad_(kwargs.get("requires_grad"))

  @classmethod
  def linspace(cls, start: Any, stop: Any, steps: int, **kwargs: Any) -> Tensor:
    """`steps` evenly spaced values from start to stop (inclusive).

    >>> Tensor.linspace(0, 1, 3).tolist()
    [0.0, 0.5, 1.0]
    """
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    # a count must be an int (as torch; tinygrad 0.14 computes a float count's ceil-many values)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
      raise TypeError(f"linspace: steps must be an int (the number of values), got {type(steps).__name__} {steps!r}")
    if (steps := int(steps)) < 0: raise ValueError(f"linspace: steps must be >= 0, got {steps}")
    dt = to_dtype(kwargs.pop("dtype", dtypes.default_float))
    if dt == dtypes.bool: raise ValueError("linspace: dtype bool is not supported; valid: an int or float dtype")
    if steps == 1: return cls([start], dtype=dt, **kwargs)
    delta = (stop - start) / max(steps - 1, 1)
    return (start + cls.arange(steps, dtype=dtypes.float32, **kwargs) * delta).cast(dt)

  @classmethod
  def eye(cls, n: int, m: int | None = None, **kwargs: Any) -> Tensor:
    """The n x m identity matrix, lazily from constants (pad+reshape).

    >>> Tensor.eye(2, 3).tolist()
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    """
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    if n < 0 or (m is not None and m < 0): raise ValueError(f"eye: sizes must be >= 0, got n={n}, m={m}")
    m = n if m is None else m
    dt = to_dtype(kwargs.pop("dtype", dtypes.default_float))
    x = cls.full((n, 1), 1, dtype=dt, **kwargs).pad((0, n)).flatten()[:n * n].reshape(n, n)  # 1 where i == j
    return x[:, :m] if m <= n else x.pad((0, m - n))

  # ***** random (counter-based threefry) *****
  @classmethod
  def manual_seed(cls, seed: int = 0) -> None:
    """Set the seed of the random functions (and restart their counters)."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    with _rng_lock:
      cls._seed = int(seed)
      cls._rng_counters.clear()

  @staticmethod
  def _threefry2x32(x0: Tensor, x1: Tensor, k0: int, k1: int) -> tuple[Tensor, Tensor]:
    """threefry2x32-20 (Random123) of the uint32 counter words (x0, x1) under key (k0, k1), from uint32 ALU ops.

    Bit-exact with `tiny_uop.alu.threefry2x32` (the reference semantics of Ops.THREEFRY). TODO: emit Ops.THREEFRY
    instead once every renderer decomposes it; this form only needs 32-bit add/xor/shift.
    """
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):
      for r in ((13, 15, 26, 6), (17, 29, 16, 24))[i % 2]:
        x0 = x0 + x1
        x1 = ((x1 << r) | (x1 >> (32 - r))) ^ x0
      x0 = x0 + ks[(i + 1) % 3]
      x1 = x1 + ((ks[(i + 2) % 3] + i + 1) & 0xffffffff)
    return x0, x1

  @classmethod
  def _random_bits(cls, num: int, device: str) -> Tensor:
    """`num` random uint32 words: threefry2x32 of counters (c + i, c + i + n/2) under the key (seed low, seed high).

    The counter c lives in a device buffer and advances by an ASSIGN, so a TinyJit replay draws new numbers each call
    (like tinygrad). The advance and this draw's start are computed at once (one small kernel, captured by a TinyJit
    like any other): a lazy counter update shared by the draws of several threads could be taken into a graph one
    thread builds while another realizes it, and so run twice (a draw skipped, another repeated).
    """
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    half = ceildiv(num, 2)
    with engine.lock, _rng_lock:  # threads: each draw advances the counter past the previous one (never the same start)
      if (ctr := cls._rng_counters.get(device)) is None:
        ctr = cls._rng_counters[device] = cls(np.zeros(1, np.uint32), device=device, requires_grad=False)
      start = (ctr.assign(ctr + num) - num).contiguous()  # the counter before this draw
      start.realize(ctr)
    if (idx := _rng_index.get((device, half))) is None:  # 0..half-1 as a realized buffer: O(n), nothing to fold
      if len(_rng_index) > 64: _rng_index.clear()
      idx = _rng_index[(device, half)] = cls(np.arange(half, dtype=np.uint32), device=device, requires_grad=False)
    counts0 = idx + start
    counts1 = counts0 + half
    seed = cls._seed & 0xffffffffffffffff
    lo, hi = cls._threefry2x32(counts0, counts1, seed & 0xffffffff, seed >> 32)
    return lo.cat(hi)[:num]

  @classmethod
  def rand(cls, *shape: Any, device: str | None = None, dtype: Any = None, contiguous: bool = True,
           **kwargs: Any) -> Tensor:
    """Uniform random numbers in [0, 1), reproducible for a seed on every device."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dtypes.is_float(dt): raise ValueError(f"rand needs a float dtype, got {dt}")
    shp = _check_shape(argfix(*shape))
    dev = _canonical_device(device)
    if prod(shp) == 0: return cls.zeros(shp, device=dev, dtype=dt, **kwargs)
    bits = cls._random_bits(prod(shp), dev)
    # 23 random mantissa bits under exponent 0 give a float32 in [1, 2)
    out = ((bits >> 9) | 0x3f800000).bitcast(dtypes.float32) - 1.0
    out = out.reshape(shp).cast(dt)
    out.requires_grad = kwargs.get("requires_grad")
    return out.contiguous() if contiguous else out

  def rand_like(self, **kwargs: Any) -> Tensor:
    """Uniform [0, 1) random numbers of this shape."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return type(self).rand(self.shape, **{"device": self.device, "dtype": self.dtype, **kwargs})

  @classmethod
  def randn(cls, *shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
    """Standard normal random numbers (Box-Muller)."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    src = cls.rand((2, *argfix(*shape)), dtype=dtypes.float32, **kwargs)
    ret = (src[0] * (2 * math.pi)).cos() * ((1 - src[1]).log() * -2).sqrt()
    ret = ret.cast(to_dtype(dtype) if dtype is not None else dtypes.default_float)
    ret.requires_grad = requires_grad
    return ret

  def randn_like(self, **kwargs: Any) -> Tensor:
    """Standard normal random numbers of this shape."""
    if TYPE_CHECKING: assert isinstance(self, Tensor)
    return type(self).randn(self.shape, **{"device": self.device, "dtype": self.dtype, **kwargs})

  @classmethod
  def randint(cls, *shape: Any, low: int = 0, high: int = 10, dtype: Any = dtypes.int32, **kwargs: Any) -> Tensor:
    """Random integers in [low, high)."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    if not isinstance(low, int) or not isinstance(high, int) or low >= high:
      raise ValueError(f"randint: need ints low < high, got low={low!r}, high={high!r}")
    dt = to_dtype(dtype)
    if not dtypes.is_int(dt): raise TypeError(f"randint needs an int dtype, got {dt}")
    return (cls.rand(*shape, **kwargs) * (high - low)).floor().cast(dt) + low

  @classmethod
  def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Tensor:
    """Normal random numbers with `mean` and `std`."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    rg = kwargs.pop("requires_grad", None)
    return (std * cls.randn(*shape, **kwargs) + mean).requires_grad_(rg)

  @classmethod
  def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = None, **kwargs: Any) -> Tensor:
    """Uniform random numbers in [low, high)."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    rg = kwargs.pop("requires_grad", None)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    return (((high - low) * cls.rand(*shape, **kwargs)).cast(dt) + low).requires_grad_(rg)

  @classmethod
  def scaled_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
    """Uniform in [-1, 1) scaled by 1/sqrt(numel)."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    return cls.uniform(*shape, low=-1.0, high=1.0, **kwargs).mul(prod(argfix(*shape)) ** -0.5)

  @classmethod
  def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
    """Glorot (Xavier) uniform initialization."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    shp = argfix(*shape)
    return cls.uniform(*shp, low=-1.0, high=1.0, **kwargs).mul((6 / (shp[0] + prod(shp[1:]))) ** 0.5)

  @classmethod
  def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
    """Kaiming (He) uniform initialization."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    shp = argfix(*shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shp[1:]))
    return cls.uniform(*shp, low=-bound, high=bound, **kwargs)

  @classmethod
  def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
    """Kaiming (He) normal initialization."""
    if TYPE_CHECKING: assert issubclass(cls, Tensor)
    shp = argfix(*shape)
    std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shp[1:]))
    return cls.normal(*shp, mean=0.0, std=std, **kwargs)
