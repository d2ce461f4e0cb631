"""The same kernel ASTs on CPU:LLVM, CPU:CLANG and PYTHON give the same results: bitwise for ints, within 1 ulp for
floats (and against numpy where numpy computes the same thing). Kernels are random elementwise/reduce ASTs
(PIPELINE.md §3) lowered by tiny-codegen's `get_program`."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.plugins import Device
from tiny_uop.uop import AxisType, KernelInfo, Ops, UOp

from tiny_codegen import get_program
from tiny_codegen.opt import Opt, OptOps
from tiny_codegen.renderer.python import PythonRenderer


def renderers():
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  from tiny_codegen.renderer.cstyle import ClangRenderer  # a C compiler is always there: nox installs ziglang
  return [("CPU", LLVMRenderer()), ("CPU", ClangRenderer()), ("PYTHON", PythonRenderer())]


NP = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.uint8: np.uint8, dtypes.float64: np.float64,
      dtypes.int8: np.int8, dtypes.int64: np.int64, dtypes.float16: np.float16}
KERNEL_DTYPES = [dtypes.float32, dtypes.int32, dtypes.float16, dtypes.uint8, dtypes.int8, dtypes.int64]


def run_everywhere(ast: UOp, arrays: list[np.ndarray], out_size: int, out_dt, vals: dict[str, int] | None = None):
  """Run `ast` (slot 0 = output, then inputs) on every renderer; returns {renderer name: output array}."""
  results = {}
  for dev, r in renderers():
    spec = get_program(ast, r)
    bufs = [Buffer(dev, out_size, out_dt).copyin(memoryview(np.zeros(out_size, NP[out_dt])))]
    bufs += [Buffer(dev, a.size, dt).copyin(memoryview(np.ascontiguousarray(a))) for a, dt in arrays]
    prg = Device[dev].get_program(spec.name, spec.lib)
    vv = tuple((vals or {})[v.arg[0]] for v in spec.vars)
    prg(*[bufs[g]._buf for g in spec.globals], global_size=spec.global_size, local_size=spec.local_size, vals=vv)
    results[type(r).__name__] = bufs[0].numpy()
  return results


def ulp_diff(a: np.ndarray, b: np.ndarray) -> int:
  """Largest distance in units in the last place (of their own dtype) between float arrays of the same dtype (NaN
  matches NaN, -0 matches +0)."""
  bits = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
  sign = np.int64(1) << (8 * a.dtype.itemsize - 1)
  ia, ib = (x.view(bits).astype(np.int64) for x in (a, b))
  ia, ib = (np.where(i < 0, -(i & (sign - 1)), i) for i in (ia, ib))  # a monotonic integer line
  both_nan = np.isnan(a) & np.isnan(b)
  return int(np.where(both_nan, 0, np.abs(ia - ib)).max(initial=0))


def assert_agree(results: dict[str, np.ndarray], dt, what: str, atol: np.ndarray | None = None):
  """Bitwise for ints; within 1 ulp for floats, or `atol` (per output) where the float sums' order may differ."""
  names = list(results)
  ref = results[names[0]]
  for n in names[1:]:
    if dtypes.is_float(dt):
      ok = ulp_diff(ref, results[n]) <= 1 or (atol is not None and bool(np.all(np.abs(ref - results[n]) <= atol)))
      assert ok, f"{what}: {names[0]} vs {n}\n{ref}\n{results[n]}"
    else: assert np.array_equal(ref, results[n]), f"{what}: {names[0]} vs {n}\n{ref}\n{results[n]}"


def sum_order_tolerance(ast: UOp, arrays: list, out_size: int, dt) -> np.ndarray | None:
  """For a kernel whose value is a float ADD reduce of m terms: how far two renderers' sums may lie apart under the
  accumulation contract (docs/PIPELINE.md §2: the order of a float sum's terms, and fusing its products into FMAs,
  are not the contract, its accuracy is): each within m * u * sum(|term|) of the exact sum, so twice that apart
  (sum(|term|) computed by the PYTHON device on the same kernel with |term| reduced); None for any other kernel. A
  12-term sum of 3*x with cancellation came out 5.8265486 from LLVM (its products fused into the accumulator's FMA,
  as PIPELINE.md §4 allows) and 5.8265495 from C (exact: 5.8265493): 2 ulps apart, both within the bound."""
  red = next((u for u in ast.toposort() if u.op is Ops.REDUCE), None)
  if red is None or red.arg not in (Ops.ADD, Ops.MUL) or not dtypes.is_float(dt): return None
  term, rng = red.src[0], red.src[1]
  m = rng.src[0].arg
  if red.arg is Ops.MUL: return None  # a product's bound is relative to the result: `product_order_tolerance`
  abs_ast = ast.substitute({red: term.maximum(-term).reduce(rng, arg=Ops.ADD)})
  spec = get_program(abs_ast, PythonRenderer())
  bufs = [Buffer("PYTHON", out_size, dt).copyin(memoryview(np.zeros(out_size, NP[dt])))]
  bufs += [Buffer("PYTHON", a.size, d).copyin(memoryview(np.ascontiguousarray(a))) for a, d in arrays]
  Device["PYTHON"].get_program(spec.name, spec.lib)(*[bufs[g]._buf for g in spec.globals],
                                                    global_size=spec.global_size, local_size=spec.local_size, vals=())
  u = float(np.finfo(NP[dt]).eps) / 2
  return 2 * m * u * bufs[0].numpy().astype(np.float64)


def product_order_tolerance(ast: UOp, ref: np.ndarray, dt) -> np.ndarray | None:
  """For a kernel whose value is a float MUL reduce of m factors: how far two renderers' products may lie apart. The
  order of a reduction's terms is not the contract (docs/PIPELINE.md §2), and each order of m factors rounds m - 1
  times, each within u relative, so two orders lie within about 2 * m * u * |product| (plus m of the smallest
  normal's roundings where a partial product falls below it). A 12-factor product of square roots came out
  0.04419415 from LLVM (its reduce unrolled by 4: partial products) and 0.04419416 from PYTHON (in order): 2 ulps."""
  red = next((u for u in ast.toposort() if u.op is Ops.REDUCE), None)
  if red is None or red.arg is not Ops.MUL or not dtypes.is_float(dt): return None
  m, fi = red.src[1].src[0].arg, np.finfo(NP[dt])
  return 2 * m * (float(fi.eps) / 2) * np.abs(ref.astype(np.float64)) + m * float(fi.tiny)


# ***** random kernels *****
FLOAT_BIN = [Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.FDIV]
INT_BIN = [Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.XOR, Ops.AND, Ops.OR, Ops.CDIV, Ops.CMOD, Ops.SHL, Ops.SHR]
FLOAT_UN = [Ops.NEG, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.RECIPROCAL]
# not correctly rounded: two renderers' results may differ by an ulp, and an op after them can amplify that (exp2 of a
# value near 6 multiplies its relative error by 4: exp2(exp2(x)) differed by 5 ulps between LLVM and Clang), so they
# are only drawn as the last op of an expression whose value is stored as it is or reduced by MAX
TRANSCENDENTAL = (Ops.EXP2, Ops.LOG2, Ops.SIN)


def clamp(a: UOp, lo: float, hi: float) -> UOp:
  """min(max(a, lo), hi) with MAX and NEG only."""
  return -((-a.maximum(UOp.const(a.dtype, lo))).maximum(UOp.const(a.dtype, -hi)))


@st.composite
def expr(draw, leaves: list[UOp], dt, depth: int, last: bool = False):
  """A random expression of dtype `dt` over `leaves` (loads), avoiding undefined behaviour in C (int division by
  zero or by -1, out-of-range shifts). A transcendental op only where `last` (the expression's own root)."""
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    if draw(st.booleans()): return draw(st.sampled_from(leaves))
    # non-negative: ClangRenderer renders `x - -1.0f` as `(x--1.0f)` (reported to tiny-codegen, #5)
    v = draw(st.floats(0, 4, width=32)) if dtypes.is_float(dt) else draw(st.integers(0, 9))
    return UOp.const(dt, v)
  a = draw(expr(leaves, dt, depth - 1))
  kind = draw(st.integers(0, 4))
  if kind == 0:  # unary
    if dtypes.is_float(dt):
      op = draw(st.sampled_from(FLOAT_UN if last else [o for o in FLOAT_UN if o not in TRANSCENDENTAL]))
      if op in (Ops.SQRT, Ops.LOG2): a = clamp(a, 0.5, 1e30)  # stay in the domain
      if op is Ops.EXP2: a = clamp(a, -20.0, 20.0)           # no overflow or denormals
      if op is Ops.SIN: a = clamp(a, -100.0, 100.0)
      return a.alu(op)
    return -a
  if kind == 1:  # where(cmp, x, y)
    b = draw(expr(leaves, dt, depth - 1))
    cmp = draw(st.sampled_from([Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]))
    return a.alu(cmp, b).where(b, a)
  if kind == 2 and dt != dtypes.int32:  # a cast through another type and back
    return a.cast(dtypes.int32).cast(dt) if dtypes.is_float(dt) else a
  b = draw(expr(leaves, dt, depth - 1))
  op = draw(st.sampled_from(FLOAT_BIN if dtypes.is_float(dt) else INT_BIN))
  if op in (Ops.CDIV, Ops.CMOD): b = (b & 7) + 1            # divisor in 1..8
  if op in (Ops.SHL, Ops.SHR): b = b & 7                    # shift in 0..7
  if op is Ops.FDIV: b = b.maximum(UOp.const(dt, 0.25))     # no division by zero (signs of inf may differ)
  return a.alu(op, b)


@st.composite
def kernel(draw, lanes: bool = False):
  dt = draw(st.sampled_from(KERNEL_DTYPES))
  n, m = draw(st.sampled_from([4, 8, 16, 32, 48]) if lanes else st.integers(1, 24)), draw(st.integers(1, 12))
  reduce_op = draw(st.sampled_from([None, Ops.ADD, Ops.MAX, Ops.MUL]))
  r0 = UOp.range(n, 0)
  r1 = UOp.range(m, 1, AxisType.REDUCE if reduce_op else AxisType.LOOP)
  p1, p2 = UOp(Ops.PARAM, dt.ptr(n * m), arg=1), UOp(Ops.PARAM, dt.ptr(m), arg=2)
  leaves = [p1.index(r0 * m + r1).load(), p2.index(r1).load()]      # a 2-D input and one broadcast along rows
  if draw(st.booleans()): leaves.append(p1.index(r1 * n + r0).load())  # the 2-D input read transposed
  # a sum of transcendental values could cancel, and a product adds up their ulps: those reduce none
  val = draw(expr(leaves, dt, 3, last=reduce_op in (None, Ops.MAX)))
  if reduce_op is not None:
    if reduce_op is Ops.MUL and dtypes.is_float(dt): val = val.maximum(UOp.const(dt, 0.5)).alu(Ops.SQRT)
    val = val.reduce(r1, arg=reduce_op)
    out = UOp(Ops.PARAM, dt.ptr(n), arg=0)
    ast = UOp.sink(out.index(r0).store(val), arg=KernelInfo())
    out_size = n
  else:
    out = UOp(Ops.PARAM, dt.ptr(n * m), arg=0)
    ast = UOp.sink(out.index(r0 * m + r1).store(val), arg=KernelInfo())
    out_size = n * m
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  lo = 0 if dtypes.is_unsigned(dt) else -50
  if dtypes.is_float(dt): ins = [rng.uniform(-3, 3, size).astype(NP[dt]) for size in (n * m, m)]
  else: ins = [rng.integers(lo, 50, size).astype(NP[dt]) for size in (n * m, m)]
  return ast, [(a, dt) for a in ins], out_size, dt


@settings(max_examples=60)
@given(kernel())
def test_random_kernels_agree(k):
  ast, arrays, out_size, dt = k
  results = run_everywhere(ast, arrays, out_size, dt)
  if dt == dtypes.float16:
    # ClangRenderer computes nested __fp16 expressions in float without rounding each step to half (e.g.
    # `val0*__builtin_sqrtf(...)`): off by a few half ulps. Reported to tiny-codegen (#5); LLVM and PYTHON agree.
    results.pop("ClangRenderer", None)
  tol = sum_order_tolerance(ast, arrays, out_size, dt)
  if tol is None: tol = product_order_tolerance(ast, next(iter(results.values())), dt)
  assert_agree(results, dt, f"kernel\n{ast}", tol)


@settings(max_examples=60)
@given(kernel(lanes=True), st.sampled_from([4, 8, 16]), st.booleans())
def test_random_vectorized_kernels_agree(k, lanes, unroll):
  # the same random kernels with their output axis upcast by 4/8/16: the LLVM renderer makes it native vectors
  # (vector loads where contiguous, gathers, broadcasts, vector accumulators). The same arithmetic in the same order
  # as the scalar kernel, so the results must be bit for bit the same -- except one reassociation: with the reduce
  # unrolled, the scalar kernel is a streaming reduce that keeps one accumulator per unrolled lane and combines them
  # after the loop (lower/merge.py), while the vector kernel folds the unrolled lanes into its accumulator each step;
  # a float ADD/MUL reduce may then differ in the last bits (a 4-long float MUL: 1.4230628 vs 1.4230629)
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  ast, arrays, out_size, dt = k
  n = next(u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[0] == 0).src[0].arg
  if n % lanes: lanes = 4
  red = next((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] is AxisType.REDUCE), None)
  base = [Opt(OptOps.UNROLL, 0, 2)] if unroll and red is not None and red.src[0].arg % 2 == 0 else []
  out = {}
  for opts in (base, [Opt(OptOps.UPCAST, 0, lanes), *base]):
    spec = get_program(ast.replace(arg=KernelInfo(opts_to_apply=tuple(opts))), LLVMRenderer())
    bufs = [Buffer("CPU", out_size, dt).copyin(memoryview(np.zeros(out_size, NP[dt])))]
    bufs += [Buffer("CPU", a.size, adt).copyin(memoryview(np.ascontiguousarray(a))) for a, adt in arrays]
    Device["CPU"].get_program(spec.name, spec.lib)(*[bufs[g]._buf for g in spec.globals],
                                                    global_size=spec.global_size, local_size=spec.local_size, vals=())
    out[len(opts) > len(base)] = bufs[0].numpy()
  msg = f"{base} vs +UPCAST {lanes}\n{ast}"
  if base and dtypes.is_float(dt) and red is not None and \
     next(u for u in ast.toposort() if u.op is Ops.REDUCE).arg in (Ops.ADD, Ops.MUL):
    m = red.src[0].arg  # reassociating m terms: a few ulps per term at most
    np.testing.assert_allclose(out[True], out[False], rtol=4 * m * float(np.finfo(NP[dt]).eps), atol=0, err_msg=msg)
  else: assert np.array_equal(out[False], out[True], equal_nan=True), msg


# ***** fixed kernels, also against numpy *****
def test_sum_and_add_vs_numpy():
  n, m = 48, 40
  r0, r1 = UOp.range(n, 0), UOp.range(m, 1, AxisType.REDUCE)
  out, inp = UOp(Ops.PARAM, dtypes.int32.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.int32.ptr(n * m), arg=1)
  ast = UOp.sink(out.index(r0).store(inp.index(r0 * m + r1).load().reduce(r1, arg=Ops.ADD) + 7), arg=KernelInfo())
  a = np.random.default_rng(0).integers(-1000, 1000, n * m).astype(np.int32)
  res = run_everywhere(ast, [(a, dtypes.int32)], n, dtypes.int32)
  for name, got in res.items(): assert np.array_equal(got, a.reshape(n, m).sum(1) + 7), name


def test_symbolic_size():
  """A kernel over a DEFINE_VAR bound: each backend gets the value through `vals`."""
  v = UOp.variable("n", 1, 64)
  r0 = UOp.range(v, 0)
  out, inp = UOp(Ops.PARAM, dtypes.float32.ptr(64), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(64), arg=1)
  ast = UOp.sink(out.index(r0).store(inp.index(r0).load() * 3.0), arg=KernelInfo())
  a = np.arange(64, dtype=np.float32)
  res = run_everywhere(ast, [(a, dtypes.float32)], 64, dtypes.float32, vals={"n": 20})
  for name, got in res.items():
    assert np.array_equal(got[:20], a[:20] * 3) and not got[20:].any(), name


def test_threaded_kernel_vs_numpy():
  """Big enough that the CPU renderers split it over threads (its cost, 13 per element, passes the default
  `thread_min_work` of 3M)."""
  n = 1 << 19
  r0 = UOp.range(n, 0)
  out = UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=0)
  a_, b_ = UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=1), UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=2)
  ast = UOp.sink(out.index(r0).store(a_.index(r0).load() + b_.index(r0).load()), arg=KernelInfo())
  rng = np.random.default_rng(2)
  a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
  for name in ("LLVMRenderer", "ClangRenderer"):
    rs = [r for d, r in renderers() if type(r).__name__ == name and d == "CPU"]
    if not rs: continue
    r = rs[0]
    r.threads = 4
    spec = get_program(ast, r)
    assert spec.global_size[0] == 4
    bufs = [Buffer("CPU", n, dtypes.float32).allocate()] + [Buffer("CPU", n, dtypes.float32).copyin(memoryview(x))
                                                            for x in (a, b)]
    Device["CPU"].get_program(spec.name, spec.lib)(*[x._buf for x in bufs], global_size=spec.global_size)
    assert np.array_equal(bufs[0].numpy(), a + b), name
