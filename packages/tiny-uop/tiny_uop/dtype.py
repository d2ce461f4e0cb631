"""Data types: scalars, vectors (`dt.vec(n)`), pointers (`dt.ptr(size, addrspace)`) and Adreno image types.

The promotion lattice follows tinygrad's: `least_upper_dtype(a, b)` is the smallest type both promote to.
"""
from __future__ import annotations

import builtins  # class dtypes shadows bool and int
import functools
import math
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, Literal

from tiny_uop.helpers import DEFAULT_FLOAT, DEFAULT_INT, ContextVar

ConstType = float | int | bool


class AddrSpace(IntEnum):
  """Where a pointer points."""
  GLOBAL = 0
  LOCAL = 1
  REG = 2


@dataclass(frozen=True, eq=False)
class DType:
  """A scalar or vector type. Interned: compare with `==` (identity)."""
  priority: int   # position in the promotion order
  itemsize: int   # bytes of one element (of the whole vector for vectors)
  name: str
  fmt: str | None  # struct/numpy format character, None where there is none
  count: int       # vector width, 1 for scalars
  _scalar: DType | None = None

  @staticmethod
  @functools.cache
  def new(priority: int, itemsize: int, name: str, fmt: str | None) -> DType:
    return DType(priority, itemsize, name, fmt, 1, None)

  def __repr__(self) -> str:
    return f"dtypes.{INVERSE_DTYPES_DICT[self.scalar().name]}" + (f".vec({self.count})" if self.count > 1 else "")
  def __reduce__(self) -> Any: return (_dtype_from_repr, (self.scalar().name, self.count))
  def __lt__(self, o: DType) -> bool:
    return (self.priority, self.itemsize, self.name, self.count) < (o.priority, o.itemsize, o.name, o.count)
  # `==` is identity, as object's; spelled out because a class with a Python `__lt__` sends `==` through the slow
  # generic path (object's __eq__, NotImplemented, the reflected one, then identity: ~5x the cost of this)
  def __eq__(self, o: object) -> builtins.bool: return self is o if isinstance(o, DType) else NotImplemented
  def __ne__(self, o: object) -> builtins.bool: return self is not o if isinstance(o, DType) else NotImplemented
  __hash__ = object.__hash__

  @property
  def base(self) -> DType: return self
  @property
  def vcount(self) -> int: return self.count

  @functools.cache  # noqa: B019 -- DTypes are interned and immortal
  def vec(self, sz: int) -> DType:
    """This scalar type as a vector of `sz` lanes."""
    if self.count != 1 and sz != 1: raise ValueError(f"can't vectorize {self} (already a vector) to {sz}")
    if sz == 1 or self == dtypes.void: return self
    return DType(self.priority, self.itemsize * sz, f"{INVERSE_DTYPES_DICT[self.name]}{sz}", None, sz, self)

  def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
    """A pointer to `size` elements of this type in `addrspace`."""
    return PtrDType.new(self, size, addrspace)

  def scalar(self) -> DType: return self._scalar if self._scalar is not None else self

  @property
  def min(self) -> ConstType: return dtypes.min(self)
  @property
  def max(self) -> ConstType: return dtypes.max(self)


@dataclass(frozen=True, eq=False)
class PtrDType(DType):
  """A pointer: `base` is the pointee, `size` the number of elements (-1 unknown), `v` the pointer's vector width."""
  _base: DType | None = None
  addrspace: AddrSpace = AddrSpace.GLOBAL
  v: int = 1
  size: int = -1

  @staticmethod
  def new(base: DType, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL, v: int = 1) -> PtrDType:  # type: ignore[override]
    """The one PtrDType for these fields (interned however the arguments are spelled)."""
    return _new_ptr(base, size, AddrSpace(addrspace), v)

  @property
  def base(self) -> DType: return self._base if self._base is not None else self
  @property
  def vcount(self) -> int: return self.v

  def vec(self, sz: int) -> DType:  # type: ignore[override]
    if self.v != 1 and sz != 1: raise ValueError(f"can't vectorize pointer {self} to {sz}")
    return self if sz == 1 else PtrDType.new(self.base, self.size, self.addrspace, sz)

  def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
    raise TypeError(f"can't make a pointer to pointer {self}")

  def scalar(self) -> PtrDType: return PtrDType.new(self.base, self.size, self.addrspace) if self.v > 1 else self

  def __repr__(self) -> str:
    s = f"{self.base!r}.ptr({self.size}" + (f", {self.addrspace!r}" if self.addrspace != AddrSpace.GLOBAL else "") + ")"
    return s + (f".vec({self.v})" if self.v != 1 else "")
  def __reduce__(self) -> Any: return (PtrDType.new, (self.base, self.size, self.addrspace, self.v))


@functools.cache
def _new_ptr(base: DType, size: int, addrspace: AddrSpace, v: int) -> PtrDType:
  return PtrDType(base.priority, base.itemsize, base.name, base.fmt, base.count, None, base, addrspace, v, size)


@dataclass(frozen=True, eq=False)
class ImageDType(PtrDType):
  """An Adreno texture: `shape` is (height, width, 4)."""
  shape: tuple[int, ...] = ()

  @staticmethod
  @functools.cache
  def new_image(base: DType, shape: tuple[int, ...]) -> ImageDType:
    return _new_image(base, tuple(shape))

  def __repr__(self) -> str: return f"dtypes.image{'h' if self.base == dtypes.half else 'f'}({self.shape})"
  def __reduce__(self) -> Any: return (ImageDType.new_image, (self.base, self.shape))


@functools.cache
def _new_image(base: DType, shape: tuple[int, ...]) -> ImageDType:
  return ImageDType(100, 4, "image", None, 1, None, base, AddrSpace.GLOBAL, 1, math.prod(shape), shape)


def _dtype_from_repr(name: str, count: int) -> DType:
  return getattr(dtypes, INVERSE_DTYPES_DICT[name]).vec(count)


class _DTypesMeta(type):
  """`dtypes.default_float` / `dtypes.default_int` are the DEFAULT_FLOAT / DEFAULT_INT flags (the environment,
  `Context(DEFAULT_FLOAT="float16")`), as tinygrad's are; assigning a dtype (or its name) sets the flag."""

  @property
  def default_float(cls) -> DType:
    v = DEFAULT_FLOAT.value
    return v if v.__class__ is DType else _resolve_default(DEFAULT_FLOAT.key, v, "float")  # (a hot path)
  @default_float.setter
  def default_float(cls, dt: Any) -> None: _set_default(DEFAULT_FLOAT, dt, "float")

  @property
  def default_int(cls) -> DType:
    v = DEFAULT_INT.value
    return v if v.__class__ is DType else _resolve_default(DEFAULT_INT.key, v, "int")
  @default_int.setter
  def default_int(cls, dt: Any) -> None: _set_default(DEFAULT_INT, dt, "int")


def _set_default(flag: ContextVar, dt: Any, kind: str) -> None:
  _resolve_default(flag.key, dt, kind)  # a bad value raises before the flag changes
  flag.value = dt


@functools.cache  # a name resolves once (dtypes.default_float is read on every tensor op)
def _resolve_default(key: str, v: Any, kind: str) -> DType:
  """The dtype DEFAULT_FLOAT/DEFAULT_INT value `v` (a DType or its name) names; a ValueError naming the valid ones."""
  is_kind = dtypes.is_float if kind == "float" else dtypes.is_int
  dt = v if isinstance(v, DType) else DTYPES_DICT.get(v.lower()) if isinstance(v, str) else None
  if dt is None or not is_kind(dt):
    valid = ", ".join(sorted(k for k, d in DTYPES_DICT.items() if is_kind(d)))
    raise ValueError(f"{key}={v!r} is not {'a float' if kind == 'float' else 'an int'} dtype; valid: {valid}")
  return dt


class dtypes(metaclass=_DTypesMeta):
  """The namespace of all dtypes and helpers about them."""
  void: Final[DType] = DType.new(-1, 0, "void", None)
  bool: Final[DType] = DType.new(0, 1, "bool", "?")
  int8: Final[DType] = DType.new(1, 1, "signed char", "b")
  uint8: Final[DType] = DType.new(2, 1, "unsigned char", "B")
  int16: Final[DType] = DType.new(3, 2, "short", "h")
  uint16: Final[DType] = DType.new(4, 2, "unsigned short", "H")
  int32: Final[DType] = DType.new(5, 4, "int", "i")
  uint32: Final[DType] = DType.new(6, 4, "unsigned int", "I")
  int64: Final[DType] = DType.new(7, 8, "long", "q")
  uint64: Final[DType] = DType.new(8, 8, "unsigned long", "Q")
  fp8e4m3: Final[DType] = DType.new(9, 1, "float8_e4m3", None)
  fp8e5m2: Final[DType] = DType.new(10, 1, "float8_e5m2", None)
  # AMD's (MI300) fp8s: "fnuz" = finite (no inf), one NaN (0x80), no negative zero; exponent bias one more
  fp8e4m3fnuz: Final[DType] = DType.new(9, 1, "float8_e4m3fnuz", None)
  fp8e5m2fnuz: Final[DType] = DType.new(10, 1, "float8_e5m2fnuz", None)
  float16: Final[DType] = DType.new(11, 2, "half", "e")
  bfloat16: Final[DType] = DType.new(12, 2, "__bf16", None)
  float32: Final[DType] = DType.new(13, 4, "float", "f")
  float64: Final[DType] = DType.new(14, 8, "double", "d")

  # aliases
  half = float16
  float = float32
  double = float64
  uchar = uint8
  ushort = uint16
  uint = uint32
  ulong = uint64
  char = int8
  short = int16
  int = int32
  long = int64
  # the index type of kernels: int32 unless a buffer needs more
  index = int32


  floats: tuple[DType, ...] = ()
  uints: tuple[DType, ...] = ()
  sints: tuple[DType, ...] = ()
  ints: tuple[DType, ...] = ()
  fp8s: tuple[DType, ...] = ()
  fp8_ocp: tuple[DType, ...] = ()
  fp8_fnuz: tuple[DType, ...] = ()
  all: tuple[DType, ...] = ()

  @staticmethod
  def imageh(shp: tuple[builtins.int, ...]) -> ImageDType: return ImageDType.new_image(dtypes.float16, shp)
  @staticmethod
  def imagef(shp: tuple[builtins.int, ...]) -> ImageDType: return ImageDType.new_image(dtypes.float32, shp)

  @staticmethod
  def is_float(x: DType) -> builtins.bool:
    """Whether `x` (or its lanes' type) is a floating point type; Adreno images count as float."""
    # frozensets, not the tuples: a miss in a tuple compares with every member; `x._scalar or x` is `x.scalar()` for
    # every type whose answer can be True (a pointer's scalar() is a pointer, never a member)
    return (x._scalar or x) in _FLOATS or isinstance(x, ImageDType)
  @staticmethod
  def is_int(x: DType) -> builtins.bool:
    """Whether `x` (or its lanes' type) is a signed or unsigned integer type (bool is not)."""
    return (x._scalar or x) in _INTS
  @staticmethod
  def is_unsigned(x: DType) -> builtins.bool:
    """Whether `x` (or its lanes' type) is an unsigned integer type."""
    return (x._scalar or x) in _UINTS
  @staticmethod
  def is_bool(x: DType) -> builtins.bool: return (x._scalar or x) is dtypes.bool

  @staticmethod
  def from_py(x: Any) -> DType:
    """The dtype a Python value (or nested list of them) defaults to: bool, an int type or `default_float`.

    A list takes the highest of its items' kinds (an empty list is `default_float`): `[1, 2.0]` is a float. Ints are
    `default_int` when every one fits it, else int64, else uint64 (all >= 0); ints no 64-bit type holds together
    (`[2**64]`, `[-1, 2**63]`) are a ValueError, never a silent wrap.
    """
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.int_for(x, x)
    if isinstance(x, float): return dtypes.default_float
    if not isinstance(x, (list, tuple)):
      raise TypeError(f"can't infer a dtype from {type(x).__name__} value {x!r}; valid: bool, int, float or lists")
    kind, lo, hi, stack = 0, 0, 0, [x]  # kind: 0 nothing, 1 bool, 2 int, 3 float; iterative: lists nest deep
    while stack:
      for xi in stack.pop():
        if isinstance(xi, bool): kind = max(kind, 1)
        elif isinstance(xi, int): kind, lo, hi = max(kind, 2), min(lo, xi), max(hi, xi)
        elif isinstance(xi, float): kind = 3
        elif isinstance(xi, (list, tuple)): stack.append(xi)
        else: raise TypeError(f"can't infer a dtype from {type(xi).__name__} value {xi!r}; valid: bool, int, float or "
                              "lists")
    return {0: dtypes.default_float, 1: dtypes.bool, 2: dtypes.int_for(lo, hi), 3: dtypes.default_float}[kind]

  @staticmethod
  def int_for(lo: builtins.int, hi: builtins.int) -> DType:
    """The int dtype Python ints in [lo, hi] get: `default_int` if it holds them, else int64, else uint64."""
    for dt in (dtypes.default_int, dtypes.int64, dtypes.uint64):
      if dtypes.min(dt) <= lo and hi <= dtypes.max(dt): return dt
    bad = hi if hi > dtypes.max(dtypes.uint64) or lo >= 0 else lo
    what = "and " + str(hi if bad == lo else lo) + " together" if lo < 0 and hi > dtypes.max(dtypes.int64) else ""
    raise ValueError(f"Python int {bad} {what} doesn't fit a tensor dtype: int64 holds [-2**63, 2**63-1], uint64 "
                     "[0, 2**64-1]".replace("  ", " "))

  @staticmethod
  def as_const(val: Any, dtype: DType) -> ConstType:
    """`val` as the Python value of a `dtype` constant: ints wrap (two's complement), floats round to the dtype
    (NaN becomes the one `math.nan` object, so equal constants intern to one UOp), bools are bools.

    A float converted to an int dtype follows CAST's semantics (truncation toward zero; see `tiny_uop.alu`).
    """
    if isinstance(val, tuple): return tuple(dtypes.as_const(x, dtype) for x in val)  # type: ignore[return-value]
    if hasattr(val, "op"): return val  # a symbolic UOp
    sd = dtype.scalar()
    if dtypes.is_int(sd):
      if isinstance(val, float): return float_to_int(val, sd)
      return truncate_int(int(val), sd)
    if dtypes.is_float(sd):
      f = round_float(float(val), sd)
      return math.nan if f != f else f
    return bool(val)

  @staticmethod
  @functools.cache
  def min(dtype: DType) -> ConstType:
    if dtypes.is_int(dtype): return 0 if dtypes.is_unsigned(dtype) else -2**(dtype.scalar().itemsize * 8 - 1)
    return -math.inf if dtypes.is_float(dtype) else False

  @staticmethod
  @functools.cache
  def max(dtype: DType) -> ConstType:
    if dtypes.is_int(dtype): return 2**(dtype.scalar().itemsize * 8 - (0 if dtypes.is_unsigned(dtype) else 1)) - 1
    return math.inf if dtypes.is_float(dtype) else True

  @staticmethod
  def finfo(dtype: DType) -> tuple[builtins.int, builtins.int]:
    """(exponent bits, mantissa bits) of a float type; a ValueError (as in tinygrad) for any other dtype."""
    if not dtypes.is_float(dtype) or isinstance(dtype, ImageDType):
      raise ValueError(f"{dtype} is not a floating point type; finfo is for {', '.join(map(repr, dtypes.floats))}")
    return FLOAT_BITS[dtype.scalar()]

  @staticmethod
  def fields() -> dict[str, DType]: return DTYPES_DICT


FLOAT_BITS: dict[DType, tuple[int, int]] = {
  dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23), dtypes.float64: (11, 52),
  dtypes.fp8e4m3: (4, 3), dtypes.fp8e5m2: (5, 2), dtypes.fp8e4m3fnuz: (4, 3), dtypes.fp8e5m2fnuz: (5, 2)}

dtypes.fp8_ocp = (dtypes.fp8e4m3, dtypes.fp8e5m2)
dtypes.fp8_fnuz = (dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz)
dtypes.fp8s = dtypes.fp8_ocp + dtypes.fp8_fnuz
dtypes.floats = (*dtypes.fp8s, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
dtypes.uints = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
dtypes.sints = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
dtypes.ints = tuple(sorted(dtypes.uints + dtypes.sints))
dtypes.all = (dtypes.bool, *dtypes.ints, *dtypes.floats)
# membership sets behind dtypes.is_float / is_int / is_unsigned (the tuples above keep their documented order)
_FLOATS, _INTS, _UINTS = frozenset(dtypes.floats), frozenset(dtypes.ints), frozenset(dtypes.uints)

DTYPES_DICT: dict[str, DType] = {
  k: v for k, v in dtypes.__dict__.items() if isinstance(v, DType) and not k.startswith(("default", "void", "index"))}
# the environment's DEFAULT_FLOAT/DEFAULT_INT names, checked now (as tinygrad does at import) and held as DTypes: the
# fast path of `dtypes.default_float`
DEFAULT_FLOAT.value, DEFAULT_INT.value = dtypes.default_float, dtypes.default_int
INVERSE_DTYPES_DICT: dict[str, str] = {**{v.name: k for k, v in DTYPES_DICT.items() if k not in (
  "half", "float", "double", "uchar", "ushort", "uint", "ulong", "char", "short", "int", "long")}, "void": "void"}


def to_dtype(x: Any) -> DType:
  """A DType from a DType, a name ('float32', 'half') or a numpy dtype/type."""
  if isinstance(x, DType): return x
  if isinstance(x, str):
    if x in DTYPES_DICT: return DTYPES_DICT[x]
    raise ValueError(f"unknown dtype {x!r}; valid names: {', '.join(sorted(DTYPES_DICT))}")
  if hasattr(x, "dtype") or hasattr(x, "itemsize") or isinstance(x, type):
    return from_numpy(x)
  raise TypeError(f"can't make a dtype from {x!r}")


# promotion lattice: each type lists the types it promotes to directly. `_WEAK_FLOAT` is a node of the lattice only
# (tinygrad's "weakfloat"): mixing int64/uint64 with an int it can't hold lands there, and that means default_float.
_WEAK_FLOAT: Final[DType] = DType(8, 800, "weakfloat", None, 1)  # sorts after uint64, before every float
_PROMO: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
  dtypes.int32: (dtypes.int64,), dtypes.int64: (_WEAK_FLOAT,), dtypes.uint8: (dtypes.int16, dtypes.uint16),
  dtypes.uint16: (dtypes.int32, dtypes.uint32), dtypes.uint32: (dtypes.int64, dtypes.uint64),
  dtypes.uint64: (_WEAK_FLOAT,), _WEAK_FLOAT: dtypes.fp8s,
  **{d: (dtypes.float16, dtypes.bfloat16) for d in dtypes.fp8s},
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,),
  dtypes.float64: ()}


@functools.cache
def _get_recursive_parents(dtype: DType) -> frozenset[DType]:
  if dtype not in _PROMO:
    raise TypeError(f"{dtype!r} has no place in the promotion lattice; valid: scalar dtypes bool, ints and floats")
  return frozenset({dtype}).union(*[_get_recursive_parents(d) for d in _PROMO[dtype]])


def least_upper_dtype(*ds: DType) -> DType:
  """The smallest dtype every one of `ds` promotes to (tinygrad's lattice; vectors promote by their scalar type).

  >>> least_upper_dtype(dtypes.int8, dtypes.uint8)
  dtypes.int16
  >>> least_upper_dtype(dtypes.int64, dtypes.uint64)  # no int holds both: the default float
  dtypes.float32
  """
  ret = _least_upper(*ds)
  return dtypes.default_float if ret is _WEAK_FLOAT else ret  # resolved per call: default_float may change


@functools.cache
def _least_upper(*ds: DType) -> DType:
  images = [d for d in ds if isinstance(d, ImageDType)]
  if images: return images[0]
  if not ds: raise TypeError("least_upper_dtype needs at least one dtype")
  return min(frozenset.intersection(*[_get_recursive_parents(d.scalar()) for d in ds]))


def least_upper_float(dt: DType) -> DType:
  return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.default_float)


def sum_acc_dtype(dt: DType) -> DType:
  """The accumulator type `sum` uses: unsigned→uint32+, signed/bool→int32+, floats as they are but at least float32."""
  if dtypes.is_unsigned(dt): return least_upper_dtype(dt, dtypes.uint32)
  if dtypes.is_int(dt) or dt == dtypes.bool: return least_upper_dtype(dt, dtypes.int32)
  return least_upper_dtype(dt, dtypes.float32)


def truncate_int(x: int, dtype: DType) -> int:
  """Wrap an int to the range of an integer dtype (two's complement)."""
  bits = dtype.scalar().itemsize * 8
  x &= (1 << bits) - 1
  return x - (1 << bits) if not dtypes.is_unsigned(dtype) and x >= 1 << (bits - 1) else x


# ***** float rounding to narrow formats (bit-exact, round to nearest even, from the exact double value) *****
def float_to_bits(x: float, dtype: DType) -> int:
  """The bit pattern of float `x` rounded to `dtype` (float16, bfloat16, float32, float64 or an fp8).

  Every format rounds once, to nearest even, from the exact value of `x`. Overflow: float16/bfloat16/float32 give
  inf; the fp8s saturate finite values to their largest finite value (as tinygrad and CUDA's satfinite mode do);
  fp8e4m3 (the "fn" variant: no inf) turns +-inf into NaN. NaNs keep their sign bit, except in the fnuz fp8s, whose
  one NaN (0x80, also what +-inf become) has none and which have no negative zero (-0.0 and values rounding to
  zero are 0x00), as in tinygrad and ml_dtypes.
  """
  sd = dtype.scalar()
  if sd is dtypes.float64: return struct.unpack("<Q", struct.pack("<d", x))[0]
  if sd is dtypes.float32: return struct.unpack("<I", struct.pack("<f", _f32(x)))[0]
  if sd is dtypes.float16: return struct.unpack("<H", struct.pack("<e", _f16(x)))[0]
  if sd is dtypes.bfloat16 or sd in dtypes.fp8s: return _pack_small(float(x), sd)
  raise TypeError(f"float_to_bits: {dtype} is not a float dtype; valid: {', '.join(map(repr, dtypes.floats))}")


def bits_to_float(b: int, dtype: DType) -> float:
  """The float value of bit pattern `b` in `dtype`."""
  sd = dtype.scalar()
  if sd is dtypes.float64: return struct.unpack("<d", struct.pack("<Q", b & 0xffffffffffffffff))[0]
  if sd is dtypes.float32: return struct.unpack("<f", struct.pack("<I", b & 0xffffffff))[0]
  if sd is dtypes.float16: return struct.unpack("<e", struct.pack("<H", b & 0xffff))[0]
  if sd is dtypes.bfloat16: return struct.unpack("<f", struct.pack("<I", (b & 0xffff) << 16))[0]
  if sd in dtypes.fp8s: return _FP8_DECODE[sd][b & 0xff]
  raise TypeError(f"bits_to_float: {dtype} is not a float dtype; valid: {', '.join(map(repr, dtypes.floats))}")


_S_F32, _S_F16 = struct.Struct("<f"), struct.Struct("<e")


def _f32(x: float) -> float:
  try: return _S_F32.unpack(_S_F32.pack(x))[0]
  except OverflowError: return math.copysign(math.inf, x)


def _f16(x: float) -> float:
  try: return _S_F16.unpack(_S_F16.pack(x))[0]
  except OverflowError: return math.copysign(math.inf, x)


def round_float(x: float, dtype: DType) -> float:
  """`x` rounded to the nearest value representable in float `dtype` (see `float_to_bits` for overflow and NaN)."""
  sd = dtype.scalar()
  if sd is dtypes.float64: return float(x)
  if sd is dtypes.float32: return _f32(x)
  if sd is dtypes.float16: return _f16(x)
  return bits_to_float(float_to_bits(x, sd), sd)


# (exponent bits, mantissa bits, exponent bias, largest unbiased exponent of a finite value, saturate?)
_SMALL_FLOATS: dict[DType, tuple[int, int, int, int, bool]] = {
  dtypes.bfloat16: (8, 7, 127, 127, False), dtypes.fp8e5m2: (5, 2, 15, 15, True), dtypes.fp8e4m3: (4, 3, 7, 8, True),
  dtypes.fp8e4m3fnuz: (4, 3, 8, 7, True), dtypes.fp8e5m2fnuz: (5, 2, 16, 15, True)}


def _pack_small(x: float, dtype: DType) -> int:
  if dtype in dtypes.fp8_fnuz:
    if x != x or abs(x) == math.inf: return 0x80  # the one NaN
    b = _pack_small_finite(x, dtype)
    return 0 if b & 0x7f == 0 else b  # no negative zero
  return _pack_small_finite(x, dtype)


def _pack_small_finite(x: float, dtype: DType) -> int:
  e_bits, m_bits, bias, emax, saturate = _SMALL_FLOATS[dtype]
  sign = (1 << (e_bits + m_bits)) if math.copysign(1.0, x) < 0 else 0
  exp_all = ((1 << e_bits) - 1) << m_bits
  nan = sign | exp_all | (1 << m_bits) - 1 if dtype is dtypes.fp8e4m3 else sign | exp_all | 1 << (m_bits - 1)
  if x != x: return nan
  ax = abs(x)
  if ax == math.inf: return nan if dtype is dtypes.fp8e4m3 else sign | exp_all
  if ax == 0.0: return sign
  max_finite = ((1 << (m_bits + 1)) - 1 - (1 if dtype is dtypes.fp8e4m3 else 0)) * 2.0 ** (emax - m_bits)
  q = max(math.frexp(ax)[1] - 1, 1 - bias)  # exponent of the leading bit, clamped to the subnormal range
  n = round(math.ldexp(ax, m_bits - q))     # exact scaling; Python's round() is round-half-even
  if n == 1 << (m_bits + 1): n, q = n >> 1, q + 1
  if n * 2.0 ** (q - m_bits) > max_finite:
    if saturate: return sign | _pack_small_finite(max_finite, dtype)
    return sign | exp_all
  if n < 1 << m_bits: return sign | n  # subnormal (or zero after rounding)
  return sign | (q + bias) << m_bits | (n - (1 << m_bits))


def _unpack_fp8(b: int, dtype: DType) -> float:
  e_bits, m_bits, bias, _, _ = _SMALL_FLOATS[dtype]
  sign = -1.0 if b & 0x80 else 1.0
  exp, man = (b >> m_bits) & ((1 << e_bits) - 1), b & ((1 << m_bits) - 1)
  if dtype in dtypes.fp8_fnuz:
    if b == 0x80: return math.nan  # fnuz: no infinities, no negative zero: 0x80 is the one NaN
  elif dtype is dtypes.fp8e4m3:
    if exp == 0xf and man == 0x7: return math.nan  # e4m3fn: no infinities, one NaN pattern (0x7f/0xff)
  elif exp == (1 << e_bits) - 1: return sign * math.inf if man == 0 else math.nan
  if exp == 0: return sign * man * 2.0 ** (1 - bias - m_bits)
  return sign * (1 + man / (1 << m_bits)) * 2.0 ** (exp - bias)


_FP8_DECODE: dict[DType, tuple[float, ...]] = {dt: tuple(_unpack_fp8(b, dt) for b in range(256)) for dt in dtypes.fp8s}


# ***** conversions between ints and floats (CAST semantics, shared by `as_const` and `tiny_uop.alu`) *****
def float_to_int(x: float, dtype: DType) -> int:
  """CAST of float `x` to integer `dtype`: truncation toward zero, then two's-complement wrap.

  Out-of-range values, +-inf and NaN follow what x86 code (and numpy there) gives: types up to 32 bits (except
  uint32) convert through an int32 and uint32/int64 through an int64, an out-of-range value becoming the
  intermediate's minimum (0x80...0) before the wrap, so `300.0 -> int8` is 44 and `1e10 -> int32` is -2**31;
  uint64 converts values >= 2**63 through `x - 2**63`.
  """
  sd = dtype.scalar()
  if sd is dtypes.uint64:
    if x >= 9223372036854775808.0:  # False for NaN
      t = _trunc_in(x - 9223372036854775808.0, 63)
      return 0 if t is None else t + 9223372036854775808
    t = _trunc_in(x, 63)
    return 9223372036854775808 if t is None else t & 0xffffffffffffffff
  bits = 63 if sd.itemsize == 8 or sd is dtypes.uint32 else 31
  t = _trunc_in(x, bits)
  return truncate_int(-(1 << bits) if t is None else t, sd)


def _trunc_in(x: float, bits: int) -> int | None:
  """trunc(x) when it fits a signed (bits+1)-bit int, else None (also for inf and NaN)."""
  if not -(2.0 ** bits) - 1.0 < x < 2.0 ** bits: return None
  return int(x)


def int_to_float(x: int, dtype: DType) -> float:
  """CAST of integer `x` to float `dtype`, rounded once to nearest even (no double rounding through float64)."""
  sd = dtype.scalar()
  if sd is dtypes.float64 or -(1 << 24) <= x <= 1 << 24: return round_float(float(x), sd)
  mbits = FLOAT_BITS[sd][1] + 1  # significant bits
  ax, shift = abs(x), abs(x).bit_length() - mbits
  if shift > 0:  # keep mbits significant bits, round to nearest even on the rest
    q, r = ax >> shift, ax & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1): q += 1
    ax = q << shift
  try: f = float(ax)
  except OverflowError: f = math.inf
  return round_float(-f if x < 0 else f, sd)


# ***** numpy interop (numpy imported lazily: tiny-uop has no dependencies) *****
_NP_NAMES: dict[DType, str] = {
  dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8", dtypes.int16: "int16", dtypes.uint16: "uint16",
  dtypes.int32: "int32", dtypes.uint32: "uint32", dtypes.int64: "int64", dtypes.uint64: "uint64",
  dtypes.float16: "float16", dtypes.float32: "float32", dtypes.float64: "float64"}


# numpy dtypes that the ml_dtypes package adds (bfloat16, fp8s, int4, ...), by name: the ones tiny has map to them,
# bit for bit; the narrower ones tiny lacks widen to the smallest computable tiny dtype that holds every value exactly
_ML_DTYPES: dict[str, DType] = {"bfloat16": dtypes.bfloat16, "float8_e4m3fn": dtypes.fp8e4m3,
                                "float8_e5m2": dtypes.fp8e5m2, "float8_e4m3fnuz": dtypes.fp8e4m3fnuz,
                                "float8_e5m2fnuz": dtypes.fp8e5m2fnuz}
_ML_WIDEN: dict[str, DType] = {
  "int4": dtypes.int8, "int2": dtypes.int8, "uint4": dtypes.uint8, "uint2": dtypes.uint8,
  "float4_e2m1fn": dtypes.float16, "float6_e2m3fn": dtypes.float16, "float6_e3m2fn": dtypes.float16,
  "float8_e4m3": dtypes.float16, "float8_e3m4": dtypes.float16, "float8_e4m3b11fnuz": dtypes.float16,
  "float8_e8m0fnu": dtypes.float32}
_ML_NAMES: dict[DType, str] = {v: k for k, v in _ML_DTYPES.items()}


def ml_dtypes_name(dtype: DType) -> str | None:
  """The name of the ml_dtypes numpy type with `dtype`'s exact bits (bfloat16 and the fp8s), or None."""
  return _ML_NAMES.get(dtype.scalar())


def narrow_bits_to_float32(bits: Any, dtype: DType) -> Any:
  """A numpy array of bfloat16/fp8 bit patterns (uint16/uint8) decoded to float32, exactly (NaNs stay NaN)."""
  import numpy as np
  sd = dtype.scalar()
  if sd is dtypes.bfloat16: return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)
  if sd in dtypes.fp8s:  # the sign from bit 7 (the table's NaNs have none; the fnuz NaN 0x80 is -NaN, as ml_dtypes)
    b = np.asarray(bits, np.uint8)
    return np.copysign(np.array(_FP8_DECODE[sd], np.float32)[b], np.where(b & 0x80, -1.0, 1.0)).astype(np.float32)
  raise TypeError(f"narrow_bits_to_float32: {dtype} is not bfloat16 or an fp8; valid: bfloat16, "
                  f"{', '.join(map(repr, dtypes.fp8s))}")


def float_to_narrow_bits(values: Any, dtype: DType) -> Any:
  """A numpy array of floats rounded to bfloat16/fp8 bit patterns (uint16/uint8), each once, as `float_to_bits` does
  (round to nearest even; fp8s saturate finite overflow, as tinygrad does)."""
  import numpy as np
  sd = dtype.scalar()
  if sd is not dtypes.bfloat16 and sd not in dtypes.fp8s:
    raise TypeError(f"float_to_narrow_bits: {dtype} is not bfloat16 or an fp8; valid: bfloat16, "
                    f"{', '.join(map(repr, dtypes.fp8s))}")
  enc = np.frompyfunc(lambda v: float_to_bits(float(v), sd), 1, 1)
  with np.errstate(invalid="ignore"):  # comparisons of NaN inputs in float_to_bits set the FPU's invalid flag
    bits = enc(np.asarray(values, np.float64))
  return bits.astype(np.uint16 if sd is dtypes.bfloat16 else np.uint8)


def to_numpy(dtype: DType) -> Any:
  """The numpy dtype holding `dtype` values; bfloat16 and fp8 (which numpy lacks) raise a clear TypeError."""
  import numpy as np
  if dtype.scalar() not in _NP_NAMES: raise TypeError(f"numpy has no dtype for {dtype}")
  return np.dtype(_NP_NAMES[dtype.scalar()])


def from_numpy(npdtype: Any) -> DType:
  """The DType of a numpy dtype (or scalar type). ml_dtypes' types (see `_ML_DTYPES`) map to bfloat16 and the fp8s
  bit for bit; its narrower types tiny lacks (int4, uint2, float4_e2m1fn, fnuz fp8s, ...) to the smallest tiny dtype
  that holds every value exactly (int8, uint8, float16; float32 for float8_e8m0fnu)."""
  import numpy as np
  name = np.dtype(npdtype).name
  for k, v in _NP_NAMES.items():
    if v == name: return k
  if (dt := _ML_DTYPES.get(name, _ML_WIDEN.get(name))) is not None: return dt
  raise TypeError(f"numpy dtype {name!r} has no tiny dtype; supported: {', '.join(sorted(_NP_NAMES.values()))} and "
                  f"ml_dtypes' {', '.join(sorted({**_ML_DTYPES, **_ML_WIDEN}))}")


Fmt = Literal["?", "b", "B", "h", "H", "i", "I", "q", "Q", "e", "f", "d"]
