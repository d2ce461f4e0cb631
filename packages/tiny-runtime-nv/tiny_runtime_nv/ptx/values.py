"""PTX types as numpy dtypes, register reads and writes of lane columns, and the float rounding helpers.

A register holds one numpy array per kernel lane column (shape `(lanes,)`): its declared width (`.b16` -> uint16,
`.f32` -> float32, `.pred` -> bool). An instruction reads it as its own type (`view` for the same width, the low bits
for a narrower type) and a write of another width is extended or truncated as `ld`/`cvt` into a wider register do
(PTX ISA "Operand Size Exceeding Instruction-Type Size": sign-extend for signed types, zero-extend otherwise).
"""
from __future__ import annotations

from typing import Any

import numpy as np

# PTX fundamental types (PTX ISA §5.2.1); bf16 is stored as its 16 bits
NP: dict[str, np.dtype] = {t: np.dtype(d) for t, d in {
  "pred": np.bool_, "b8": np.uint8, "u8": np.uint8, "s8": np.int8, "b16": np.uint16, "u16": np.uint16,
  "s16": np.int16, "f16": np.float16, "bf16": np.uint16, "b32": np.uint32, "u32": np.uint32, "s32": np.int32,
  "f32": np.float32, "b64": np.uint64, "u64": np.uint64, "s64": np.int64, "f64": np.float64,
  "f16x2": np.uint32, "bf16x2": np.uint32}.items()}
UNSIGNED: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                                 8: np.dtype(np.uint64)}
SIGNED: dict[int, np.dtype] = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32),
                               8: np.dtype(np.int64)}
FLOATS = ("f16", "f32", "f64")


def np_type(t: str) -> np.dtype:
  """The numpy dtype of PTX type `t` (`f32`, `s32`, `b64`, ...); an unknown type raises naming it."""
  if (d := NP.get(t)) is None: raise NotImplementedError(f"PTX executor: unknown type .{t}")
  return d


def as_type(x: Any, dt: np.dtype) -> Any:
  """Register bits `x` (array or numpy scalar) read as `dt`: the same bits when the widths agree, the low bits of a
  wider register, or the value extended from a narrower one."""
  if x.dtype == dt: return x
  if dt == np.bool_: return x != 0
  if x.dtype == np.bool_: return x.astype(dt)
  xs, ds = x.dtype.itemsize, dt.itemsize
  if xs == ds: return x.view(dt)
  if xs > ds: return x.view(UNSIGNED[xs]).astype(UNSIGNED[ds]).view(dt)
  src = x if x.dtype.kind in "iu" else x.view(UNSIGNED[xs])
  return src.astype(SIGNED[ds] if src.dtype.kind == "i" else UNSIGNED[ds]).view(dt)


def fit(x: Any, dt: np.dtype) -> Any:
  """A value written into a register declared `dt`: same width -> the bits as they are; else extended (signed
  values sign-extend) or truncated to the register's width."""
  if x.dtype.itemsize == dt.itemsize or dt == np.bool_ or x.dtype == np.bool_: return x
  return as_type(x, UNSIGNED[dt.itemsize]) if x.dtype.itemsize > dt.itemsize else as_type(x, SIGNED[dt.itemsize]
                                                                                             if x.dtype.kind == "i"
                                                                                             else UNSIGNED[dt.itemsize])


def ftz(x: np.ndarray) -> np.ndarray:
  """`.ftz`: subnormal float32 values become zero of the same sign."""
  return np.where(np.abs(x) < np.float32(1.1754944e-38), np.copysign(np.float32(0), x), x).astype(x.dtype)


def round_odd_to_f32(p: np.ndarray, c: np.ndarray) -> np.ndarray:
  """float32(p + c) rounded once, for float64 `p` (an exact float32 product) and `c`: the float64 sum rounded to
  odd (its last bit set when inexact), then to float32, is the correctly rounded sum (53 >= 24 + 2 bits)."""
  with np.errstate(all="ignore"):
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)  # TwoSum: p + c == s + e exactly
    bits = s.view(np.uint64)
    inexact = (e != 0) & np.isfinite(s) & ((bits & np.uint64(1)) == 0)
    if inexact.any():
      toward = np.sign(e) == np.sign(s)
      bits = np.where(inexact, np.where(toward, bits + np.uint64(1), bits - np.uint64(1)), bits)
      s = bits.view(np.float64)
    return s.astype(np.float32)


def fma64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """a * b + c in float64 with the product kept exact (Dekker's TwoProduct); the final sum of the three parts is
  correctly rounded except in rare double-rounding ties."""
  with np.errstate(all="ignore"):
    p = a * b
    split = np.float64(134217729.0)  # 2**27 + 1 (Veltkamp)

    def halves(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
      big = np.abs(x) > 2.0 ** 995  # split * x would overflow (inf - inf: NaN): split x * 2**-54, scale back exactly
      xs = np.where(big, x * 2.0 ** -54, x)
      t = split * xs
      hi = t - (t - xs)
      return np.where(big, hi * 2.0 ** 54, hi), np.where(big, (xs - hi) * 2.0 ** 54, xs - hi)
    ah, al = halves(a)
    bh, bl = halves(b)
    pe = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    s = p + c
    bb = s - p
    se = (p - (s - bb)) + (c - bb)
    out = s + (se + pe)
    return np.where(np.isfinite(p) & np.isfinite(c), out, p + c)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
  """bfloat16 bits -> float32 (exact: the top 16 bits of the float32)."""
  return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
  """float32 -> bfloat16 bits, round to nearest even; NaN stays NaN (0x7FFF, the canonical bf16 NaN)."""
  b = np.asarray(x, np.float32).view(np.uint32)
  r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
  return np.where(np.isnan(x), np.uint16(0x7FFF), r)
