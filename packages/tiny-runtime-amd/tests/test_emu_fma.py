"""RDNA3 emulator: fused multiply-adds round once (v_fma_f32, v_fmac_f32, v_fmamk/fmaak, v_dual_fmac, v_fma_f64),
checked against exact rational arithmetic rounded to nearest-even, including a triple where computing in double and
rounding again to float32 gives the wrong answer."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from tiny_runtime_amd.emu.encode import V, Code, vop2, vop3, vopd

from tiny_runtime_amd.emu.rdna3 import EXEC_LO, Emulator, Wave

M32 = 0xFFFFFFFF
rng = np.random.default_rng(5)


def run(*parts, vgpr=None) -> Wave:
  code, w = Code(*parts), Wave()
  for k, vs in (vgpr or {}).items(): w.vgpr[k] = [int(v) for v in vs]
  w.sgpr[EXEC_LO] = M32
  Emulator().run(w, code.addr)
  return w


def exact_f32(a, b, c) -> np.float32:
  """a*b+c rounded once to float32 (nearest, ties to even), from exact rationals."""
  fr = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
  r = np.float32(float(fr))
  cands = [np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))]
  return min(cands, key=lambda x: (abs(Fraction(float(x)) - fr), int(np.array(x).view(np.uint32)) & 1))


# exact = 1 + 2^-24 + 2^-56: just above the float32 midpoint between 1 and 1 + 2^-23, so the fused result is
# 1 + 2^-23; in double it is the midpoint itself, which then rounds to even (1.0)
HARD = (np.float32(-(2.0**-24) * (1 + 2.0**-16)), np.float32(1 - 2.0**-16), np.float32(1 + 2.0**-23))


def operands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  a, b = rng.standard_normal((2, 32)).astype(np.float32)
  c = (rng.standard_normal(32) * 4).astype(np.float32)
  a[0], b[0], c[0] = HARD
  return a, b, c


def bits(x) -> list[int]: return [int(v) for v in np.asarray(x, np.float32).view(np.uint32)]
def floats(r) -> np.ndarray: return np.array(r, dtype=np.uint32).view(np.float32)


def test_the_hard_case_is_hard():
  a, b, c = HARD
  assert np.float32(float(a) * float(b) + float(c)) != exact_f32(a, b, c) == np.float32(1 + 2.0**-23)


def test_fma_fmac_dual_fmac_round_once():
  a, b, c = operands()
  want = np.array([exact_f32(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
  w = run(vop3(0x213, 3, V(0), V(1), V(2)), vop2(43, 2, V(0), 1), vopd(0, 8, 4, 5, V(0), 1, V(2), 0),
          vgpr={0: bits(a), 1: bits(b), 2: bits(c), 4: bits(c)})
  for r in (3, 2, 4):  # v_fma_f32, v_fmac_f32 (v2 += a*b), v_dual_fmac_f32 (v4 += a*b)
    np.testing.assert_array_equal(floats(w.vgpr[r]), want)


def test_fmamk_fmaak_use_the_literal():
  a, b, _ = operands()
  k = np.float32(1 + 2.0**-23)
  w = run(vop2(44, 2, V(0), 1), bits([k]), vop2(45, 3, V(0), 1), bits([k]), vgpr={0: bits(a), 1: bits(b)})
  np.testing.assert_array_equal(floats(w.vgpr[2]), [exact_f32(x, k, y) for x, y in zip(a, b)])  # a*K + b
  np.testing.assert_array_equal(floats(w.vgpr[3]), [exact_f32(x, y, k) for x, y in zip(a, b)])  # a*b + K


def test_fma_f64_is_fused():
  a, b, c = 1 + 2.0**-30, 1 - 2.0**-30, -1.0  # a*b = 1 - 2^-60: only a fused multiply-add keeps the -2^-60
  def pair(x): return [int(np.array(x).view(np.uint64)) & M32] * 32, [int(np.array(x).view(np.uint64)) >> 32] * 32
  (a0, a1), (b0, b1), (c0, c1) = pair(a), pair(b), pair(c)
  w = run(vop3(0x214, 6, V(0), V(2), V(4)), vgpr={0: a0, 1: a1, 2: b0, 3: b1, 4: c0, 5: c1})
  got = np.array([w.vgpr[6][0] | (w.vgpr[7][0] << 32)], np.uint64).view(np.float64)[0]
  assert got == -(2.0**-60) and a * b + c == 0.0
