"""RDNA3 emulator float32 ALU against numpy on random lanes with hypothesis, special values included (NaN, +-inf,
+-0, subnormals): add/sub/mul round like IEEE float32 (numpy), min/max follow the ISA (a NaN operand yields the other,
-0 < +0), fma rounds once (exact rationals)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_runtime_amd.emu.encode import V, Code, vop2, vop3

from tiny_runtime_amd.emu.rdna3 import EXEC_LO, Emulator, Wave

M32 = 0xFFFFFFFF
lanes = st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True), min_size=32,
                 max_size=32)


def run(*parts, vgpr) -> Wave:
  code, w = Code(*parts), Wave()
  for k, vs in vgpr.items(): w.vgpr[k] = [int(v) for v in vs]
  w.sgpr[EXEC_LO] = M32
  Emulator().run(w, code.addr)
  return w


def same(got: np.ndarray, want: np.ndarray) -> bool:
  """Equal bit patterns, except that any NaN matches any NaN."""
  nan = np.isnan(got) & np.isnan(want)
  return bool(((got.view(np.uint32) == want.view(np.uint32)) | nan).all())


def ref_min(a: float, b: float, is_max: bool) -> float:
  if a != a: return b
  if b != b: return a
  if a == b: return (a if np.signbit(a) != is_max else b) if np.signbit(a) != np.signbit(b) else a
  return max(a, b) if is_max else min(a, b)


def ref_fma(a: float, b: float, c: float) -> np.float32:
  """a*b+c rounded once to float32 (nearest, ties to even); specials and exact zeros as float64 arithmetic has them."""
  if not all(np.isfinite([a, b, c])): return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
  fr = Fraction(a) * Fraction(b) + Fraction(c)
  if fr == 0: return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
  if abs(fr) >= 2**128 - 2**103: return np.float32(np.copysign(np.inf, float(fr)))  # past the rounding boundary
  r = np.float32(float(fr))
  cands = [x for x in (np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))) if np.isfinite(x)]
  return min(cands, key=lambda x: (abs(Fraction(float(x)) - fr), int(np.array(x).view(np.uint32)) & 1))


@settings(max_examples=60, deadline=None)
@given(lanes, lanes, lanes)
def test_float32_alu_matches_ieee(xs, ys, zs):
  x, y, z = (np.array(v, dtype=np.float32) for v in (xs, ys, zs))
  w = run(vop2(3, 3, V(0), 1), vop2(4, 4, V(0), 1), vop2(8, 5, V(0), 1), vop2(15, 6, V(0), 1), vop2(16, 7, V(0), 1),
          vop3(0x213, 8, V(0), V(1), V(2)),
          vgpr={0: x.view(np.uint32), 1: y.view(np.uint32), 2: z.view(np.uint32)})
  got = {r: np.array(w.vgpr[r], dtype=np.uint32).view(np.float32) for r in range(3, 9)}
  with np.errstate(all="ignore"):
    assert same(got[3], x + y) and same(got[4], x - y) and same(got[5], x * y)
    assert same(got[6], np.array([ref_min(a, b, False) for a, b in zip(x, y)], np.float32))
    assert same(got[7], np.array([ref_min(a, b, True) for a, b in zip(x, y)], np.float32))
    assert same(got[8], np.array([ref_fma(float(a), float(b), float(c)) for a, b, c in zip(x, y, z)], np.float32))
