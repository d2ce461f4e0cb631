"""Our polynomial exp2/log2/sin (tiny_codegen.lower.transcendental) compiled and run: ulp error vs numpy in float64."""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes

from tiny_codegen import get_program
from tiny_codegen.renderer.llvmir import LLVMRenderer

import kernel_runner as kr



class NoLdexpRenderer(LLVMRenderer):
  """The host's LLVM renderer without LDEXP: exp2 scales by exponent bits, as on a CPU without AVX-512."""
  ldexp_ops = ()


MODES = [pytest.param(dtypes.float32, True, id="f32_via_f64"), pytest.param(dtypes.float32, False, id="f32"),
         pytest.param(dtypes.float64, False, id="f64")]
RENDERERS = [pytest.param(LLVMRenderer, id="host"), pytest.param(NoLdexpRenderer, id="no_ldexp")]
NP = {dtypes.float32: np.float32, dtypes.float64: np.float64}


def run_all(x: np.ndarray, dt, via_f64: bool, R: type = LLVMRenderer) -> list[np.ndarray]:
  """exp2, log2 and sin of x with the decompositions (no libm)."""
  n = len(x)
  c0, c1, c2, a = [UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(4)]
  i = UOp.range(n, 0)
  v = a.index(i).load()
  ast = UOp.sink(c0.index(i).store(v.exp2()), c1.index(i).store(v.log2()), c2.index(i).store(v.sin()),
                 arg=KernelInfo(f"transc_{dt.name}_{via_f64}_{n}"))
  r = R()
  r.decompose_ops, r.transcendental_via_f64, r.threads = (Ops.EXP2, Ops.LOG2, Ops.SIN), via_f64, 1
  with Context(NOOPT=1): spec = get_program(ast, r)
  assert not any(f in spec.src for f in ("llvm.exp2", "llvm.log2", "llvm.sin", "exp2f", "log2f", "sinf"))
  outs = [np.zeros(n, NP[dt]) for _ in range(3)]
  kr.run(spec, [*outs, x.astype(NP[dt])])
  return outs


def ulp_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Distance in units in the last place between same-dtype float arrays (monotone integer mapping)."""
  it = np.int32 if a.dtype == np.float32 else np.int64
  def key(v: np.ndarray) -> np.ndarray:
    i = v.view(it).astype(np.int64) if it is np.int32 else v.view(it).astype(object)
    return np.where(i < 0, -(i & ~(1 << (8 * a.itemsize - 1))), i)
  return np.abs(key(a) - key(b)).astype(np.float64)


def reference(fn, x: np.ndarray, dt) -> np.ndarray:
  with np.errstate(all="ignore"): return fn(x.astype(np.float64)).astype(NP[dt])  # f64 then rounded: ~correct


@pytest.mark.parametrize("dt,via_f64", MODES)
@pytest.mark.parametrize("R", RENDERERS)
def test_ulp_error_at_most_one(dt, via_f64, R):
  rng = np.random.default_rng(1)
  lim = 6000 if dt == dtypes.float32 else 1e6
  x = np.concatenate([rng.uniform(-160, 130, 3000), np.exp(rng.uniform(-85, 85, 3000)), rng.standard_normal(2000),
                      rng.uniform(-lim, lim, 2000), rng.uniform(0.5, 2.0, 2000)]).astype(NP[dt])
  if dt == dtypes.float64: x = np.concatenate([x, rng.uniform(-1070, 1020, 2000)])
  for name, out, fn in zip(("exp2", "log2", "sin"), run_all(x, dt, via_f64, R), (np.exp2, np.log2, np.sin)):
    ref = reference(fn, x, dt)
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref), err_msg=name)
    d = ulp_dist(out[ok], ref[ok])
    assert d.max() <= 1, f"{name}: {d.max()} ulp at x={x[ok][d.argmax()]!r}"


@pytest.mark.parametrize("dt,via_f64", MODES)
@pytest.mark.parametrize("R", RENDERERS)
def test_special_values(dt, via_f64, R):
  tiny = np.finfo(NP[dt]).smallest_subnormal
  x = np.array([np.inf, -np.inf, np.nan, 0.0, 1.0, -1.0, tiny, 3 * tiny, 2.0 ** -140, 1e30, 0.5, 2.0, -200, 2000],
               NP[dt])
  e, l, s = run_all(x, dt, via_f64, R)
  for out, ref in ((e, reference(np.exp2, x, dt)), (l, reference(np.log2, x, dt))):
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(out[~fin & ~np.isnan(ref)], ref[~fin & ~np.isnan(ref)])  # +-inf exactly
    assert ulp_dist(out[fin], ref[fin]).max() <= 1
  assert np.isnan(s[:3]).all() and s[3] == 0 and abs(s[4] - np.sin(1.0)) < 1e-6


def test_huge_sin_arguments_are_exact():
  """Arguments far beyond Cody-Waite's range (the old reduction returned numbers unrelated to sin) within 1 ulp."""
  x = np.array([1e10, -3e20, 5e30, 1e5, 3e7], np.float32)
  s = run_all(x, dtypes.float32, False)[2]
  assert ulp_dist(s, reference(np.sin, x, dtypes.float32)).max() <= 1


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_c_renderer_runs_the_decompositions(dt):
  """The same decompositions rendered as C (bitcasts, shifts, int64 math) agree with numpy within 1 ulp."""
  from tiny_codegen.renderer.cstyle import ClangRenderer
  x = np.random.default_rng(2).uniform(-100, 100, 500).astype(NP[dt])
  for out, fn in zip(run_all(x, dt, False, ClangRenderer), (np.exp2, np.log2, np.sin)):
    ref = reference(fn, x, dt)
    ok = ~np.isnan(ref)
    assert np.isnan(out[~ok]).all() and ulp_dist(out[ok], ref[ok]).max() <= 1


def test_llvm_cpu_decomposes_exp2_and_log2_into_vector_code():
  """The default LLVM CPU renderer decomposes EXP2 and LOG2 before the expander: an upcast kernel computes them in
  native vectors (no libm call per lane), within 1 ulp of numpy; SIN keeps libm (accurate at any argument)."""
  from tiny_codegen.compiler.llvm import LLVMCompiler
  from tiny_codegen.opt.kernel import Opt, OptOps
  assert set(LLVMRenderer.decompose_ops) == {Ops.EXP2, Ops.LOG2} and not LLVMRenderer.transcendental_via_f64
  n = 1024
  c0, c1, c2, a = [UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(4)]
  i = UOp.range(n, 0)
  v = a.index(i).load()
  ast = UOp.sink(c0.index(i).store(v.exp2()), c1.index(i).store(v.log2()), c2.index(i).store(v.sin()),
                 arg=KernelInfo("transc_vec", opts_to_apply=(Opt(OptOps.UPCAST, 0, 16),)))
  r = LLVMRenderer()
  r.threads = 1
  spec = get_program(ast, r)
  assert not any(f in spec.src for f in ("llvm.exp2", "llvm.log2")) and "llvm.sin" in spec.src
  ir = LLVMCompiler().optimized_ir(spec.src)
  assert "exp2f" not in ir and "log2f" not in ir and "<16 x i32>" in ir, ir  # the exponent bits, as a vector
  x = np.random.default_rng(3).uniform(-100, 100, n).astype(np.float32)
  x[:8] = [0.0, -0.0, 1e-40, np.inf, -np.inf, np.nan, 88.7, -150.0]
  outs = [np.zeros(n, np.float32) for _ in range(3)]
  kr.run(spec, [*outs, x])
  for out, fn in zip(outs, (np.exp2, np.log2, np.sin)):
    ref = reference(fn, x, dtypes.float32)
    nan = np.isnan(ref)
    assert np.isnan(out[nan]).all() and ulp_dist(out[~nan], ref[~nan]).max() <= 1


def test_via_f64_per_op():
  """`transcendental_via_f64` as a tuple: only those ops of `decompose_ops` evaluate float32 through float64."""
  n = 64
  c0, c1, a = [UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(3)]
  i = UOp.range(n, 0)
  v = a.index(i).load()
  r = LLVMRenderer()
  r.decompose_ops, r.threads = (Ops.EXP2, Ops.SIN), 1
  srcs = {}
  for via in ((), (Ops.SIN,), (Ops.EXP2,)):
    r.transcendental_via_f64 = via
    for name, f in (("exp2", v.exp2()), ("sin", v.sin())):
      ast = UOp.sink(c0.index(i).store(f), arg=KernelInfo(f"via_{name}_{len(via)}_{via[:1]}"))
      with Context(NOOPT=1): srcs[(name, via)] = get_program(ast, r).src
  assert "double" not in srcs[("exp2", ())] and "double" not in srcs[("sin", ())]
  assert "double" not in srcs[("exp2", (Ops.SIN,))] and "double" in srcs[("sin", (Ops.SIN,))]
  assert "double" in srcs[("exp2", (Ops.EXP2,))] and "double" not in srcs[("sin", (Ops.EXP2,))]
  x = np.linspace(-30, 30, n).astype(np.float32)
  for via in ((), (Ops.SIN,)):
    out = np.zeros(n, np.float32)
    r.transcendental_via_f64 = via
    spec = get_program(UOp.sink(c0.index(i).store(v.sin()), arg=KernelInfo(f"via_run_{len(via)}")), r)
    kr.run(spec, [out, np.zeros(n, np.float32), x])
    assert ulp_dist(out, reference(np.sin, x, dtypes.float32)).max() <= 1


def _near_pio2_multiples(dt, ks) -> np.ndarray:
  """The floats of `dt` nearest k*pi/2 for integers k (computed in 60-digit decimal): the hardest sin arguments."""
  import decimal
  ctx = decimal.Context(prec=60)
  pio2 = ctx.divide(decimal.Decimal("3.14159265358979323846264338327950288419716939937510582097494"), 2)
  return np.array([float(ctx.multiply(decimal.Decimal(int(k)), pio2)) for k in ks]).astype(NP[dt])


def _full_range_args(dt) -> np.ndarray:
  """Log-spaced magnitudes from the smallest subnormal to the format's max, both signs, and multiples of pi/2."""
  rng = np.random.default_rng(7)
  fi = np.finfo(NP[dt])
  mags = np.exp(rng.uniform(np.log(float(fi.smallest_subnormal)), np.log(float(fi.max)), 6000))
  mags = np.concatenate([mags, 10.0 ** np.arange(-3, int(np.log10(float(fi.max))) + 1), [float(fi.max)],
                         rng.uniform(6000, 2e5, 1000)])
  x = (mags * rng.choice([-1.0, 1.0], len(mags))).astype(NP[dt])
  ks = np.concatenate([np.arange(1, 200), 2.0 ** rng.uniform(10, 120 if dt == dtypes.float32 else 1000, 400)])
  return np.concatenate([x, _near_pio2_multiples(dt, ks), -_near_pio2_multiples(dt, ks[:50])])


@pytest.mark.parametrize("dt,via_f64", MODES)
def test_sin_full_range_within_one_ulp(dt, via_f64):
  """sin over every finite magnitude (log-spaced up to the format's max, and the floats nearest k*pi/2 for huge k)
  within 1 ulp of numpy's float64 sin rounded to the format: the reduction must be exact at any argument."""
  x = _full_range_args(dt)
  s = run_all(x, dt, via_f64)[2]
  ref = reference(np.sin, x, dt)
  d = ulp_dist(s, ref)
  assert d.max() <= 1, f"{int((d > 1).sum())} of {len(x)} beyond 1 ulp; worst {d.max()} ulp at x={x[d.argmax()]!r}"


@pytest.mark.parametrize("dt,via_f64", MODES)
def test_sin_special_values_and_signed_zero(dt, via_f64):
  """sin(+-inf) and sin(nan) are nan, sin(-0.0) is -0.0 (sign kept), sin of a subnormal is itself."""
  tiny = np.finfo(NP[dt]).smallest_subnormal
  x = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, tiny, -3 * tiny, np.finfo(NP[dt]).max, -np.finfo(NP[dt]).max],
               NP[dt])
  s = run_all(x, dt, via_f64)[2]
  assert np.isnan(s[:3]).all()
  assert np.signbit(s[3]) and s[3] == 0 and not np.signbit(s[4]) and s[4] == 0
  np.testing.assert_array_equal(s[5:7], x[5:7])
  assert ulp_dist(s[7:], reference(np.sin, x[7:], dt)).max() <= 1


def test_two_over_pi_limbs_match_mpmath():
  """The Payne-Hanek table (2/pi's bits from Machin's formula in integers) against mpmath's 2/pi."""
  import mpmath
  from tiny_codegen.lower.transcendental import _LIMB, _two_over_pi_words
  n = 60
  with mpmath.workprec(_LIMB * n + 64):
    want = int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** (_LIMB * n)))
  got = 0
  for w in _two_over_pi_words(n): got = (got << _LIMB) | w
  assert got == want


def _closest_approach(mant: int, smin: int, smax: int) -> float:
  """A lower bound on min |M * 2**s * 2/pi - k| over significands M < 2**(mant+1), integers k != 0 and s in
  [smin, smax]: for each s the best rational approximations (continued-fraction convergents p/q, q < 2**(mant+1))
  of frac(2**s * 2/pi) give the smallest distance any M reaches."""
  import fractions
  import math
  import mpmath
  bits = 1200
  with mpmath.workprec(bits + 64): two_pi = int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** bits))
  worst = 1.0
  for s in range(smin, smax + 1):
    if s >= 0: a = fractions.Fraction((two_pi << s) % (1 << bits), 1 << bits)  # frac(2**s * 2/pi)
    else: a = fractions.Fraction(two_pi, 1 << (bits - s))
    p0, q0, p1, q1, y = 0, 1, 1, 0, a
    while True:
      ai = math.floor(y)
      p0, q0, p1, q1 = p1, q1, ai * p1 + p0, ai * q1 + q0
      if q1 >= 1 << (mant + 1): break
      if p1 != 0: worst = min(worst, float(abs(q1 * a - p1)))
      if y == ai: break
      y = 1 / (y - ai)
  return worst


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_payne_hanek_limbs_cover_the_closest_approach(dt):
  """The reduction's absolute error (2**(mantissa+3) / 2**(limb bits), in units of pi/2) stays 2**-(mantissa+6)
  below the smallest nonzero |x*2/pi - k| any float of the format reaches, so r keeps its significand and guard bits."""
  import math
  from tiny_codegen.lower.transcendental import _FMT, _LIMB, _PH
  _, mant, bias, *_ = _FMT[dt]
  pad, n = _PH[dt]
  assert pad * _LIMB >= mant + 3  # the window of the smallest reduced |x| (1/2) starts inside the zero words
  closest = _closest_approach(mant, -mant - 2, bias - mant)
  assert math.log2(closest) > -(mant + 11)  # the known worst cases: about 2**-29.9 (float32), 2**-61.5 (float64)
  assert (mant + 3) - _LIMB * n <= math.log2(closest) - (mant + 6)


def _exp2_log2_args(dt) -> tuple[np.ndarray, np.ndarray]:
  """exp2: every exponent from below the smallest subnormal result to past overflow (and the boundaries' neighbours);
  log2: log-spaced over every positive float, subnormals included, and 1's neighbours."""
  f = NP[dt]
  fi = np.finfo(f)
  rng = np.random.default_rng(5)
  lo, hi = -(fi.maxexp + fi.nmant + 3), fi.maxexp + 2  # -152..130 (float32), -1079..1026 (float64)
  e = np.concatenate([rng.uniform(lo, hi, 3000), np.arange(lo, hi, 0.25)]).astype(f)
  edges = np.array([fi.maxexp, -(fi.maxexp - 2), -(fi.maxexp + fi.nmant - 2), -(fi.maxexp + fi.nmant - 1),
                    -(fi.maxexp + fi.nmant - 1) - 0.5, -(fi.maxexp + fi.nmant)], f)
  e = np.concatenate([e, edges, np.nextafter(edges, f(np.inf)), np.nextafter(edges, f(-np.inf)), [-0.0, 0.0]]).astype(f)
  tiny = float(fi.smallest_subnormal)
  x = np.exp(rng.uniform(np.log(tiny), np.log(float(fi.max)), 4000)).astype(f)
  one = f(1.0)
  near1 = [np.nextafter(one, f(2)), np.nextafter(one, f(0)), np.nextafter(np.nextafter(one, f(0)), f(0))]
  x = np.concatenate([x, near1, [fi.max, tiny, 3 * tiny, float(fi.tiny), float(fi.tiny) * (1 - fi.epsneg)]]).astype(f)
  return e, x


@pytest.mark.parametrize("dt,via_f64", MODES)
@pytest.mark.parametrize("R", RENDERERS)
def test_exp2_log2_full_range(dt, via_f64, R):
  """exp2 within 1 ulp from subnormal results through overflow (inf exactly, 0 exactly where the true value rounds
  to 0, exp2(-0.0) = 1); log2 within 1 ulp of every positive float, log2(1 +- ulp) included."""
  e, x = _exp2_log2_args(dt)
  ex = run_all(e, dt, via_f64, R)[0]
  ref = reference(np.exp2, e, dt)
  assert not (bad := np.isinf(ex) != np.isinf(ref)).any(), f"exp2 overflow differs at {e[bad]}"
  assert not (bad := (ex == 0) != (ref == 0)).any(), f"exp2 underflow differs at {e[bad]}"
  d = ulp_dist(ex, ref)
  assert d.max() <= 1, f"exp2: worst {d.max()} ulp at {e[d.argmax()]!r}"
  lg = run_all(x, dt, via_f64)[1]
  d = ulp_dist(lg, reference(np.log2, x, dt))
  assert d.max() <= 1, f"log2: worst {d.max()} ulp at {x[d.argmax()]!r}"
  sp = np.array([-0.0, 0.0, -1.0, -np.inf, np.inf, np.nan, 1.0], NP[dt])
  ls = run_all(sp, dt, via_f64)[1]
  assert ls[0] == -np.inf and ls[1] == -np.inf and np.isnan(ls[2:4]).all() and ls[4] == np.inf and np.isnan(ls[5])
  assert ls[6] == 0 and not np.signbit(ls[6])


_FE_UNDERFLOW = {"x86_64": 0x10, "aarch64": 0x8}  # <fenv.h> FE_UNDERFLOW: glibc bits/fenv.h of each architecture


@pytest.mark.skipif(os.uname().machine not in _FE_UNDERFLOW, reason="FE_UNDERFLOW's value is known for x86_64/aarch64")
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
@pytest.mark.parametrize("R", RENDERERS)
def test_exp2_of_arguments_that_round_to_zero_never_underflows(dt, R):
  """exp2(x) for x far below the least subnormal is +0 without an underflowing multiply: on x86 each one takes a
  microcode assist (a masked softmax's exp of -1e9 scores ran ~14x slower than of ordinary ones)."""
  libm = ctypes.CDLL(ctypes.util.find_library("m"))
  flag = _FE_UNDERFLOW[os.uname().machine]
  x = np.array([-1e4, -np.inf, -1e30, float(-np.finfo(NP[dt]).nmant - np.finfo(NP[dt]).maxexp - 5)] * 8, NP[dt])
  libm.feclearexcept(flag)
  e, _, _ = run_all(x, dt, False, R)
  raised = libm.fetestexcept(flag)
  np.testing.assert_array_equal(e, np.zeros_like(x))
  assert not np.signbit(e).any()
  assert raised == 0, "an exp2 that rounds to +0 still multiplied into the underflow range"


def test_llvm_loop_vectorizer_uses_the_machines_vector_width():
  """An elementwise exp2 with no upcast is left to LLVM's loop vectorizer, which on an AVX-512 CPU would use 256-bit
  vectors (LLVM's x86 tuning prefers them there): the kernel carries the machine's register width as its
  `prefer-vector-width`, so the optimized loop runs on the machine's full vectors (16 float32 lanes of a zmm, 8 of a
  ymm), and still agrees with numpy within 1 ulp."""
  from tiny_codegen.compiler.llvm import LLVMCompiler
  n = 4096
  c0, a = [UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(2)]
  i = UOp.range(n, 0)
  ast = UOp.sink(c0.index(i).store(a.index(i).load().exp2()), arg=KernelInfo("exp2_loop", opts_to_apply=()))
  r = LLVMRenderer()
  r.threads = 1
  spec = get_program(ast, r)
  bits = 8 * r.vector_registers[1]
  assert bits and f'"prefer-vector-width"="{bits}"' in spec.src
  ir = LLVMCompiler().optimized_ir(spec.src)
  assert f"<{bits // 32} x float>" in ir and f"<{bits // 64} x float>" not in ir, ir
  x = np.random.default_rng(4).uniform(-160, 130, n).astype(np.float32)
  out = np.zeros(n, np.float32)
  kr.run(spec, [out, x])
  assert ulp_dist(out, reference(np.exp2, x, dtypes.float32)).max() <= 1


def test_llvm_exp2_polynomial_is_fused_multiply_adds():
  """On the LLVM CPU renderer (`fused_mulacc`) exp2's polynomial is a chain of `llvm.fma` (one instruction and one
  rounding a step, where an fmul + fadd pair was) and n = round(x) comes from the shifter's low bits (no trunc, no
  float -> int convert): still within 1 ulp of numpy, exact at integers (powers of two) and right at the ties
  (x = k + 1/2, rounded to even: f = +-1/2 either way), NaN/inf/underflow as C's exp2. The C renderer keeps its
  unfused arithmetic."""
  from tiny_codegen.opt.kernel import Opt, OptOps
  from tiny_codegen.renderer.cstyle import ClangRenderer
  from tiny_codegen.lower.transcendental import _FMT
  assert LLVMRenderer.fused_mulacc and not ClangRenderer.fused_mulacc
  n = 1024
  c0, a = [UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(2)]
  i = UOp.range(n, 0)
  ast = UOp.sink(c0.index(i).store(a.index(i).load().exp2()),
                 arg=KernelInfo("exp2_fma", opts_to_apply=(Opt(OptOps.UPCAST, 0, 16),)))
  r = LLVMRenderer()
  r.threads = 1
  spec = get_program(ast, r)
  deg = _FMT[dtypes.float32][3]
  assert spec.src.count("call <16 x float> @llvm.fma.v16f32(") == deg, spec.src
  assert "llvm.trunc" not in spec.src and "fptosi" not in spec.src, spec.src
  x = np.random.default_rng(5).uniform(-160, 140, n).astype(np.float32)
  ties = np.arange(-150, 129, dtype=np.float32)
  x[:len(ties)], x[len(ties):2 * len(ties)] = ties, ties + 0.5
  x[-12:] = [0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 128.0, 127.99999, -149.0, -149.5, -150.0]
  out = np.zeros(n, np.float32)
  kr.run(spec, [out, x])
  ref = reference(np.exp2, x, dtypes.float32)
  np.testing.assert_array_equal(out[:len(ties)], ref[:len(ties)])  # exact powers of two, subnormals included
  nan = np.isnan(ref)
  assert np.isnan(out[nan]).all() and ulp_dist(out[~nan], ref[~nan]).max() <= 1



@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
@pytest.mark.parametrize("R", RENDERERS)
def test_exp2_absorbed_by_a_constant_sum(dt, R):
  """`c + exp2(x)` with |c| >= 1 (sigmoid's denominator) computes exp2 of max(x, -(mant+2)) without the underflow and
  subnormal lanes (`pm_absorbed_exp2`): bit for bit c + the full exp2 rounded (every exp2 below 2**-(mant+2) rounds
  away in the sum), NaN/inf as before; the generated source has no 2**-64 subnormal scaling, which a plain exp2
  (and a sum with |c| < 1, where small results still count) keeps."""
  from tiny_codegen.lower.transcendental import _FMT
  n = 2048
  from tiny_codegen.renderer.llvmir import lconst
  mant, scale = _FMT[dt][1], lconst(2.0 ** -64, dt)
  cs = (1.0, -1.0, 3.0, 0.5)
  outs_p = [UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(len(cs) + 1)]
  a = UOp(Ops.PARAM, dt.ptr(n), arg=len(cs) + 1)
  i = UOp.range(n, 0)
  v = a.index(i).load()
  stores = [o.index(i).store(v.exp2() + UOp.const(dt, c)) for o, c in zip(outs_p, cs)]
  r = R()
  r.threads = 1
  spec = get_program(UOp.sink(*stores, outs_p[-1].index(i).store(v.exp2()), arg=KernelInfo(f"exp2_sum_{dt.name}")), r)
  def alone(c: float | None) -> str:
    e = v.exp2() if c is None else v.exp2() + UOp.const(dt, c)
    return get_program(UOp.sink(outs_p[0].index(i).store(e), arg=KernelInfo(f"exp2_one_{dt.name}_{c}")), r).src
  plain, one, half = alone(None), alone(1.0), alone(0.5)
  if dt in r.ldexp_ops:  # LDEXP scales subnormal results itself: the plain exp2 keeps only its underflow select
    assert "scalef" in plain and scale not in plain + half + one and one.count("select") < plain.count("select"), one
  else:
    assert scale in plain and scale in half and scale not in one, one
    assert one.count("fcmp") < plain.count("fcmp") and one.count("select") < plain.count("select"), one
  rng = np.random.default_rng(7)
  hi = 1100 if dt == dtypes.float64 else 140
  x = np.concatenate([rng.uniform(-hi, hi, n - 64), np.arange(-mant - 6, -mant + 2, 0.25)[:48],
                      [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 127.9, 128.0, -149.5, -mant - 2, -mant - 2.5,
                       -mant - 1.5, 1e-30, 5.0, -5.0]]).astype(NP[dt])[:n]
  outs = [np.zeros(n, NP[dt]) for _ in range(len(cs) + 1)]
  kr.run(spec, [*outs, x])
  with np.errstate(all="ignore"):
    for c, out in zip(cs, outs[:-1]):
      want = (outs[-1] + NP[dt](c)).astype(NP[dt])  # the full exp2, then the sum rounded once
      np.testing.assert_array_equal(out, want, err_msg=f"c={c}")


def test_scalef_only_on_avx512_targets():
  """LDEXP (`vscalefps`) is rendered for float32 where the target has AVX512F and AVX512VL (the 128/256-bit forms the
  widened narrow vectors use), and the exp2 decomposition only emits it for a renderer that lists the dtype."""
  from tiny_codegen.renderer.llvmir import scalef_lanes
  assert scalef_lanes("x86_64-unknown-linux-gnu", "+avx2,+fma,+avx512f,+avx512vl,+avx512dq") == 16
  assert scalef_lanes("x86_64-unknown-linux-gnu", "+avx2,+fma,-avx512f") == 0
  assert scalef_lanes("x86_64-unknown-linux-gnu", "+avx512f,-avx512vl") == 0
  assert scalef_lanes("aarch64-unknown-linux-gnu", "+neon,+avx512f,+avx512vl") == 0
  from tiny_codegen.renderer.cstyle import ClangRenderer
  assert not getattr(ClangRenderer(), "ldexp_ops", ()) and NoLdexpRenderer().ldexp_ops == ()


@pytest.mark.parametrize("upcast", [0, 3, 8, 16, 32])
def test_exp2_ldexp_vectors_match_the_exponent_bit_path(upcast):
  """exp2 of float32 scaled by LDEXP (one `vscalefps`, a vector widened to 4/8/16 lanes, or two 16-lane halves; a
  scalar loop as `llvm.ldexp`, which LLVM's loop vectorizer widens) is bit for bit the exponent-bit path's result
  (both round once), over the whole range: subnormal results, the overflow edge, +-inf, NaN, +-0. On a host
  without AVX-512 both sides are the exponent-bit path (no `scalef` in the source)."""
  from tiny_codegen.opt.kernel import Opt, OptOps
  n = 96 * 32
  c0, c1, a = [UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(3)]
  i = UOp.range(n, 0)
  v = a.index(i).load()
  opts = (Opt(OptOps.UPCAST, 0, upcast),) if upcast else ()
  srcs, outs = [], []
  x = np.random.default_rng(11).uniform(-160, 140, n).astype(np.float32)
  x[:40] = [0.0, -0.0, np.inf, -np.inf, np.nan, 128.0, 127.99999, 127.5, 127.49999, -126.0, -126.5, -149.0, -149.5,
            -150.0, -150.5, -151.0, -152.0, -1e30, 1e30, 1e-40, -1e-40, 0.5, -0.5, 1.0, -1.0, 1e-7, -1e-7, 3.3, 64.0,
            -64.0, -125.9, -126.1, -148.99, -149.01, 100.25, -100.25, 2.0 ** -24, -(2.0 ** -24), 88.0, -88.0]
  for R in (LLVMRenderer, NoLdexpRenderer):
    r = R()
    r.threads = 1
    ast = UOp.sink(c0.index(i).store(v.exp2()), c1.index(i).store(UOp.const(dtypes.float32, 1.0) + v.exp2()),
                   arg=KernelInfo(f"exp2_up{upcast}_{len(srcs)}", opts_to_apply=opts))
    spec = get_program(ast, r)
    srcs.append(spec.src)
    o = [np.zeros(n, np.float32), np.zeros(n, np.float32)]
    kr.run(spec, [*o, x])
    outs.append(o)
  assert ("scalef" in srcs[0] or "ldexp" in srcs[0]) == bool(LLVMRenderer().ldexp_ops), srcs[0]
  assert "scalef" not in srcs[1] and "ldexp" not in srcs[1], srcs[1]
  for got, want in zip(outs[0], outs[1]): np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
  ref = reference(np.exp2, x, dtypes.float32)
  nan = np.isnan(ref)
  assert np.isnan(outs[0][0][nan]).all() and ulp_dist(outs[0][0][~nan], ref[~nan]).max() <= 1
