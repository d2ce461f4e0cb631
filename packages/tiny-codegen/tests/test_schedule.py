"""Scheduler tests: kernel counts for the programs of issue #4, and results equal to numpy.

Graphs are built with UOp methods; kernels are executed by the numpy reference evaluator in test_schedule_ref.py and
compared with a direct numpy evaluation of the same tensor graph.
"""
from __future__ import annotations

import numpy as np
import pytest

from tiny_uop import AxisType, Ops, UOp, Variable, dtypes
from tiny_uop.helpers import prod

from tiny_codegen.schedule import ScheduleResult, clear_schedule_cache, create_schedule, memory_plan
from tiny_codegen.schedule import schedule as schedule_mod

import test_schedule_ref as ref

RNG = np.random.default_rng(0)


def tensor(*shape: int, dtype=dtypes.float32, device: str = "CPU") -> tuple[UOp, UOp, np.ndarray]:
  """A realized input: (BUFFER, BUFFER.reshape(shape), its random value)."""
  b = UOp.new_buffer(device, prod(shape), dtype)
  if dtype == dtypes.bool: val = RNG.random(shape) < 0.5
  elif dtypes.is_int(dtype): val = RNG.integers(-5, 6, shape).astype(ref.np_dtype(dtype))
  else: val = RNG.standard_normal(shape).astype(ref.np_dtype(dtype))
  return b, b.reshape(shape), val


def n_kernels(sched: ScheduleResult) -> int: return sum(1 for c in sched.calls if c.src[0].op is Ops.SINK)


def check(outs: list[UOp], inputs: dict[UOp, np.ndarray], rtol: float = 1e-5) -> ScheduleResult:
  """Schedule `outs`, run the schedule with the reference evaluator, compare every output with numpy."""
  sched = create_schedule(UOp.sink(*outs))
  env = ref.run_schedule(sched, inputs)
  for o in outs:
    np.testing.assert_allclose(ref.realized_value(sched, env, o), ref.eval_graph(o, inputs), rtol=rtol, atol=1e-5)
  return sched


def fconst(v: float, shape: tuple[int, ...]) -> UOp: return UOp.const(dtypes.float32, v, "CPU", shape)


def matmul(x: UOp, w: UOp) -> UOp:
  (n, k), (_, m) = x.shape, w.shape
  xe = x.reshape((n, 1, k)).expand((n, m, k))
  we = w.permute((1, 0)).reshape((1, m, k)).expand((n, m, k))
  return (xe * we).r(Ops.ADD, (2,)).reshape((n, m))


def cumsum_last(x: UOp) -> UOp:
  """Cumulative sum over the last axis as tinygrad builds it: pad, triangular window (expand/reshape/shrink), sum."""
  *lead, n = x.shape
  L = 2 * n - 1
  y = x.pad(tuple((0, 0) for _ in lead) + ((n - 1, 0),))                                      # (..., L)
  y = y.reshape((*lead, 1, L)).expand((*lead, n + 1, L)).reshape((*lead, (n + 1) * L))
  y = y.shrink(tuple((0, s) for s in lead) + ((0, n * (L + 1)),)).reshape((*lead, n, L + 1))
  y = y.shrink(tuple((0, s) for s in lead) + ((0, n), (0, n)))                                # w[..., i, j] = y[i+j]
  return y.r(Ops.ADD, (len(lead) + 1,)).reshape((*lead, n))


def arange(n: int) -> UOp: return cumsum_last(fconst(1.0, (n,))) - fconst(1.0, (n,))


def eye(n: int) -> UOp:
  """tinygrad's eye: ones(n,1) padded to (n, n+1), flattened, the first n*n taken, reshaped."""
  return fconst(1.0, (n, 1)).pad(((0, 0), (0, n))).reshape((n * (n + 1),)).shrink(((0, n * n),)).reshape((n, n))


def softmax(x: UOp) -> UOp:
  m = x.r(Ops.MAX, (1,)).expand(x.shape)
  e = ((x - m) * fconst(1.4426950408889634, x.shape)).exp2()
  return e / e.r(Ops.ADD, (1,)).expand(x.shape)


def layernorm(x: UOp, eps: float = 1e-5) -> UOp:
  n = x.shape[1]
  mean = x.r(Ops.ADD, (1,)).expand(x.shape) * fconst(1 / n, x.shape)
  xc = x - mean
  var = (xc * xc).r(Ops.ADD, (1,)).expand(x.shape) * fconst(1 / n, x.shape)
  return xc * (var + fconst(eps, x.shape)).sqrt().reciprocal()


# ***** kernel counts (issue #4 table) *****
def test_elementwise_chain_one_kernel():
  (ab, a, av), (bb, b, bv) = tensor(4, 5), tensor(4, 5)
  out = (((a + b) * a - fconst(2.0, (4, 5))).maximum(b) / (b * b + fconst(1.0, (4, 5)))).exp2()
  assert n_kernels(check([out], {ab: av, bb: bv})) == 1


def test_sum_one_kernel():
  (ab, a, av), (bb, b, bv) = tensor(4, 5), tensor(4, 5)
  assert n_kernels(check([(a + b).r(Ops.ADD, (0, 1))], {ab: av, bb: bv})) == 1
  assert n_kernels(check([(a * b).r(Ops.ADD, (1,))], {ab: av, bb: bv})) == 1


def test_matmul_bias_relu_one_kernel():
  (xb, x, xv), (wb, w, wv), (bb, bias, bv) = tensor(3, 4), tensor(4, 5), tensor(5)
  out = (matmul(x, w) + bias.reshape((1, 5)).expand((3, 5))).maximum(fconst(0.0, (3, 5)))
  sched = check([out], {xb: xv, wb: wv, bb: bv})
  assert n_kernels(sched) == 1
  np.testing.assert_allclose(ref.realized_value(sched, ref.run_schedule(sched, {xb: xv, wb: wv, bb: bv}), out),
                             np.maximum(xv @ wv + bv, 0), rtol=1e-5, atol=1e-5)


def test_movement_one_kernel():
  ab, a, av = tensor(4, 6)
  outs = [a.permute((1, 0)).contiguous(), a.flip((True, False)) + a, a.pad(((1, 1), (2, 2))) * fconst(2.0, (6, 10))]
  for out in outs:
    assert n_kernels(check([out], {ab: av})) == 1


def test_slice_of_buffer_is_zero_kernels():
  ab, a, av = tensor(4, 5)
  out = a.shrink(((1, 3), (0, 5)))
  sched = check([out], {ab: av})
  assert n_kernels(sched) == 0
  assert [c.src[0].op for c in sched.calls] == [Ops.SLICE] and sched.calls[0].src[0].arg == 5 * 4
  assert sched.calls[0].src[2] is ab and sched.becomes[out].shape == (2, 5)


def test_contiguous_of_realized_is_free():
  ab, a, av = tensor(4, 5)
  sched = check([a.contiguous(), a.reshape((20,)).contiguous()], {ab: av})
  assert sched.calls == []
  assert sched.becomes[a.contiguous()].src[0] is ab


def test_arange_and_eye_fold_into_consumer():
  ab, a, av = tensor(6, 6)
  out1 = a + arange(6).reshape((1, 6)).expand((6, 6))
  out2 = a * eye(6)
  sched = check([out1], {ab: av})
  assert n_kernels(sched) == 1
  np.testing.assert_allclose(ref.realized_value(sched, ref.run_schedule(sched, {ab: av}), out1), av + np.arange(6))
  assert not any(u.op is Ops.REDUCE for u in sched.calls[0].src[0].toposort())  # the arange loop folded away
  sched = check([out2], {ab: av})
  assert n_kernels(sched) == 1
  np.testing.assert_allclose(ref.realized_value(sched, ref.run_schedule(sched, {ab: av}), out2), av * np.eye(6))


@pytest.mark.parametrize("n", [1, 2, 5])
def test_cumsum_of_padded_constant_folds(n):
  ab, a, av = tensor(n + 3)
  out = cumsum_last(fconst(3.0, (n,)).pad(((2, 1),))) * a
  sched = check([out], {ab: av})
  assert n_kernels(sched) == 1 and not any(u.op is Ops.REDUCE for u in sched.calls[0].src[0].toposort())


@pytest.mark.parametrize("fn", [softmax, layernorm])
def test_softmax_layernorm_two_kernels(fn):
  xb, x, xv = tensor(4, 7)
  sched = check([fn(x)], {xb: xv})
  assert n_kernels(sched) == 2
  # the first kernel computes both reduces (max then sum / mean then variance) and stores both
  assert len(sched.calls[0].src[0].src) == 2 and all(s.op is Ops.STORE for s in sched.calls[0].src[0].src)


def test_merge_needs_the_same_index():
  # the sum reads the max transposed (at another row than its own): no shared kernel, still right
  xb, x, xv = tensor(5, 5)
  m = x.r(Ops.MAX, (1,))
  out = (x + m.reshape((1, 5)).expand((5, 5))).r(Ops.ADD, (1,))
  sched = check([out], {xb: xv})
  assert n_kernels(sched) == 2 and all(len(c.src[0].src) == 1 for c in sched.calls)


def test_merge_would_cycle():
  # w reads the max and the sum reads w and the max: storing the max from the sum's kernel would be a cycle
  xb, x, xv = tensor(4, 6)
  m = x.r(Ops.MAX, (1,))
  w = (x - m.expand((4, 6))).contiguous()
  out = (w * m.expand((4, 6))).r(Ops.ADD, (1,))
  check([out, w], {xb: xv})


def test_cumsum_one_kernel():
  ab, a, av = tensor(3, 5)
  out = cumsum_last(a)
  sched = check([out], {ab: av})
  assert n_kernels(sched) == 1
  np.testing.assert_allclose(ref.realized_value(sched, ref.run_schedule(sched, {ab: av}), out), np.cumsum(av, 1),
                             rtol=1e-5, atol=1e-5)


# ***** realization decisions *****
def test_reduce_used_twice_is_realized_once():
  ab, a, av = tensor(4, 5)
  s = a.r(Ops.ADD, (1,))
  o1, o2 = s + fconst(1.0, (4, 1)), s * fconst(2.0, (4, 1))
  sched = check([o1, o2], {ab: av})
  reduces = [c for c in sched.calls if any(u.op is Ops.REDUCE for u in c.src[0].toposort())]
  # the reduce once, then both outputs (same shape) from one kernel with two STOREs
  assert len(reduces) == 1 and n_kernels(sched) == 2 and len(sched.calls[1].src[0].src) == 2


def test_shared_elementwise_is_recomputed():
  (ab, a, av), (bb, b, bv) = tensor(4, 5), tensor(4, 5)
  e = (a + b).exp2()
  sched = check([e * a, e - b], {ab: av, bb: bv})
  assert n_kernels(sched) == 1 and len(sched.calls[0].src[0].src) == 2  # one kernel storing both
  sched = check([e * a, (e - b).r(Ops.ADD, (1,))], {ab: av, bb: bv})
  assert n_kernels(sched) == 2  # different shapes: e is recomputed in each kernel, never stored


def test_detach_and_contiguous_backward_are_removed():
  ab, a, av = tensor(3, 3)
  out = UOp(Ops.CONTIGUOUS_BACKWARD, dtypes.float32, ((a + a).detach(),)) * a
  assert n_kernels(check([out], {ab: av})) == 1


def test_contiguous_splits_kernels():
  ab, a, av = tensor(3, 3)
  mid = (a * a).contiguous()
  sched = check([mid + a, mid], {ab: av})
  assert n_kernels(sched) == 2
  # the kernel reading `mid` runs after the one writing it
  out_mid = sched.becomes[mid].src[0]
  assert sched.calls[0].src[1] is out_mid and out_mid in sched.calls[1].src[2:]


def test_reshape_that_does_not_line_up():
  ab, a, av = tensor(6, 4)
  out = a.permute((1, 0)).reshape((3, 8)).flip((False, True)).reshape((2, 12)).permute((1, 0)) * fconst(3.0, (12, 2))
  assert n_kernels(check([out], {ab: av})) == 1


def test_int_and_bool_dtypes():
  (ab, a, av), (bb, b, bv) = tensor(4, 5, dtype=dtypes.int32), tensor(4, 5, dtype=dtypes.int32)
  out = (a < b).where(a * b, a - b).r(Ops.MAX, (0,))
  assert n_kernels(check([out], {ab: av, bb: bv})) == 1


def test_reduce_of_reduce_fuses():
  ab, a, av = tensor(3, 4, 5)
  out = a.r(Ops.ADD, (2,)).exp2().r(Ops.MAX, (1,))
  assert n_kernels(check([out], {ab: av})) == 1


def test_pad_of_unsafe_op_reads_zero():
  ab, a, av = tensor(3, 3)
  out = a.exp2().pad(((1, 1), (1, 1))).r(Ops.ADD, (1,))
  assert n_kernels(check([out], {ab: av})) == 1


def test_outputs_of_equal_shape_share_a_kernel_unless_dependent():
  (ab, a, av), (bb, b, bv) = tensor(3, 4), tensor(3, 4)
  sched = check([a + b, a * b, (a - b).exp2()], {ab: av, bb: bv})
  assert n_kernels(sched) == 1 and len(sched.calls[0].src[0].src) == 3
  first = (a + b).contiguous()
  sched = check([first, first * a], {ab: av, bb: bv})  # the second reads the first: two kernels, in order
  assert n_kernels(sched) == 2


# ***** ASSIGN, COPY and ordering *****
def test_assign_writes_target_after_reads():
  (ab, a, av), (bb, b, bv) = tensor(4, 4), tensor(4, 4)
  read_old = (a * fconst(2.0, (4, 4)) + b).contiguous()
  asg = a.assign(a + b)
  sched = create_schedule(UOp.sink(asg, read_old))
  assert n_kernels(sched) == 2
  env = ref.run_schedule(sched, {ab: av, bb: bv})
  np.testing.assert_allclose(env[ab].reshape(4, 4), av + bv, rtol=1e-6)
  np.testing.assert_allclose(ref.realized_value(sched, env, read_old), av * 2 + bv, rtol=1e-6)
  assert sched.becomes[asg].src[0] is ab
  assign_call = next(c for c in sched.calls if c.src[1] is ab)
  assert sched.calls.index(assign_call) == 1  # write after the read


def test_assign_then_read_new_value():
  ab, a, av = tensor(4, 4)
  asg = a.assign(a * fconst(3.0, (4, 4)))
  after = (asg + fconst(1.0, (4, 4))).contiguous()
  sched = create_schedule(UOp.sink(after))
  env = ref.run_schedule(sched, {ab: av})
  assert n_kernels(sched) == 2
  np.testing.assert_allclose(ref.realized_value(sched, env, after), av * 3 + 1, rtol=1e-6)


def test_assign_into_a_slice():
  ab, a, av = tensor(4, 4)
  bb, b, bv = tensor(2, 4)
  asg = a.shrink(((1, 3), (0, 4))).assign(b * fconst(2.0, (2, 4)))
  sched = create_schedule(UOp.sink(asg))
  env = ref.run_schedule(sched, {ab: av, bb: bv})
  expect = av.copy()
  expect[1:3] = bv * 2
  np.testing.assert_allclose(env[ab].reshape(4, 4), expect, rtol=1e-6)


@pytest.mark.parametrize("view", ["T", "flip"])
def test_assign_reading_target_elsewhere_goes_through_a_temporary(view):
  ab, a, av = tensor(4, 4)
  src = a.permute((1, 0)) if view == "T" else a.flip((True, True))
  sched = create_schedule(UOp.sink(a.assign(src + fconst(1.0, (4, 4)))))
  env = ref.run_schedule(sched, {ab: av})
  np.testing.assert_allclose(env[ab].reshape(4, 4), (av.T if view == "T" else av[::-1, ::-1]) + 1, rtol=1e-6)
  assert n_kernels(sched) == 2
  assert n_kernels(create_schedule(UOp.sink(a.assign(a * fconst(2.0, (4, 4)))))) == 1  # same element: in place


def test_copy_to_another_device():
  ab, a, av = tensor(3, 4)
  out = (a + a).copy_to_device("PYTHON")
  sched = check([out], {ab: av})
  assert [c.src[0].op for c in sched.calls] == [Ops.SINK, Ops.COPY]
  assert sched.becomes[out].src[0].src[1].arg == "PYTHON"
  sched = check([a.copy_to_device("PYTHON")], {ab: av})
  assert [c.src[0].op for c in sched.calls] == [Ops.COPY] and sched.calls[0].src[2] is ab


def test_kernel_across_devices_is_an_error():
  (_, a, _), (_, b, _) = tensor(3, 3), tensor(3, 3, device="PYTHON")
  with pytest.raises(ValueError, match="several devices"):
    create_schedule(UOp.sink(a + b))


# ***** symbolic shapes *****
def test_symbolic_shape_one_kernel_serves_all_values():
  clear_schedule_cache()
  n = Variable("n", 1, 10)
  ab = UOp.new_buffer("CPU", 40, dtypes.float32)
  av = RNG.standard_normal(40).astype(np.float32)
  for val in (3, 7):
    x = ab.reshape((10, 4)).shrink(((0, n.bind(val)), (0, 4)))
    out = x * fconst(2.0, (1, 1)).expand(x.shape) + x
    sched = create_schedule(UOp.sink(out))
    assert sched.var_vals == {"n": val} and n_kernels(sched) == 1
    ast = sched.calls[0].src[0]
    assert any(u.op is Ops.DEFINE_VAR for u in ast.toposort())
    env = ref.run_schedule(sched, {ab: av})
    got = env[sched.becomes[out].src[0]][:val * 4].reshape(val, 4)
    np.testing.assert_allclose(got, av[:val * 4].reshape(val, 4) * 3, rtol=1e-6)
  assert len(schedule_mod._cache) == 1  # the second value reused the first schedule


# ***** cache and memory planner *****
def test_cache_reuses_structure_with_new_buffers():
  clear_schedule_cache()
  outs = []
  for _ in range(2):
    (ab, a, av), (bb, b, bv) = tensor(4, 5), tensor(4, 5)
    out = softmax(a * b)
    outs.append(out)
    sched = check([out], {ab: av, bb: bv})
    assert any(ab in c.src for c in sched.calls) and any(bb in c.src for c in sched.calls)
  assert len(schedule_mod._cache) == 1


def test_memory_planner_reuses_dead_intermediates():
  ab, a, av = tensor(8, 8)
  x = a
  for _ in range(4):  # each step's reduce is broadcast and each step is contiguous: buffers die a step later
    x = (x - x.r(Ops.MAX, (1,)).expand((8, 8))).exp2().contiguous()
  sched = check([x], {ab: av})
  bufs = {b for c in sched.calls for b in c.src[1:]}
  assert n_kernels(sched) == 8
  # the 4 reduce buffers (8 floats each) are dead after the step that reads them: all share one; the contiguous
  # steps are in `becomes` (the caller may hold them), so they keep their own buffers
  assert len({b for b in bufs if b.arg == 8}) == 1 and len({b for b in bufs if b.arg == 64}) == 5


def test_memory_plan_unit():
  def buf(n: int) -> UOp: return UOp.new_buffer("CPU", n, dtypes.float32)
  inp, t1, t2, t3, out = buf(4), buf(4), buf(4), buf(4), buf(4)
  k = UOp(Ops.SINK)
  calls = [UOp(Ops.CALL, src=(k, t1, inp)), UOp(Ops.CALL, src=(k, t2, t1)), UOp(Ops.CALL, src=(k, t3, t2)),
           UOp(Ops.CALL, src=(k, out, t3))]
  plan = memory_plan(calls, keep={inp, out})
  assert plan == {t3: t1}  # t1 is dead after call 1; t2 is read by call 2 while t3 is written there
  assert memory_plan(calls, keep={inp, out, t1, t2, t3}) == {}


# ***** folding sums of masked constants (arange) *****
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tiny_codegen.schedule.indexing import collapse_count  # noqa: E402


@settings(max_examples=200)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(0, 6), st.integers(2, 12), st.integers(-13, 13),
       st.integers(-3, 14), st.sampled_from(["mod", "lt", "gt", "both"]))
def test_collapse_count_matches_the_loop(n, nj, c, m, k, t, kind):
  j, r = UOp.range(nj, 0), UOp.range(n, 1, AxisType.REDUCE)
  x = j + c
  if kind == "mod": cond = ((x + r * k) % m) < t
  elif kind == "lt": cond = (r + x) < t
  elif kind == "gt": cond = UOp.const(dtypes.index, t) < (x + r)
  else: cond = ((r + x) < t) & (UOp.const(dtypes.index, c) < (r + j))
  one, zero = UOp.const(dtypes.float32, 2.0), UOp.const(dtypes.float32, 0.0)
  inner = cond.where(one, zero)
  folded = collapse_count(inner, r)
  assume(folded is not None)
  assert r not in folded.toposort()
  out_p = UOp(Ops.PARAM, dtypes.float32.ptr(nj), arg=0)
  want, got = np.zeros(nj, np.float32), np.zeros(nj, np.float32)
  ref.eval_kernel(UOp.sink(out_p.index(j).store(inner.reduce(r, arg=Ops.ADD))), [want])
  ref.eval_kernel(UOp.sink(out_p.index(j).store(folded)), [got])
  np.testing.assert_equal(got, want)


def test_stencil_chain_is_cut_instead_of_recomputed_exponentially():
  ab, a, av = tensor(32)
  x = a
  for _ in range(8):  # x[i-1] + x[i+1] eight times: 2^8 index variants of the input if nothing were realized
    x = x.pad(((1, 1),)).shrink(((0, 32),)) + x.pad(((1, 1),)).shrink(((2, 34),))
  sched = check([x], {ab: av})
  assert 1 < n_kernels(sched) <= 8
  assert max(len(c.src[0].toposort()) for c in sched.calls) < 2000


def test_optimizer_like_assigns_share_a_kernel():
  # m <- 0.9 m + g; v <- 0.99 v + g*g; p <- p - m_new / (sqrt(v_new) + 1): one kernel storing m, v and p
  (mb, m, mv), (vb, v, vv), (pb, p, pv), (gb, g, gv) = tensor(3, 4), tensor(3, 4), tensor(3, 4), tensor(3, 4)
  vv = np.abs(vv)
  f = fconst
  m_new = m.assign(m * f(0.9, (3, 4)) + g)
  v_new = v.assign(v * f(0.99, (3, 4)) + g * g)
  p_new = p.assign(p - m_new / (v_new.sqrt() + f(1.0, (3, 4))))
  read_old_m = (m * f(2.0, (3, 4))).contiguous()  # must run before m is overwritten
  sched = create_schedule(UOp.sink(p_new, m_new, v_new, read_old_m))
  env = ref.run_schedule(sched, {mb: mv, vb: vv, pb: pv, gb: gv})
  em, ev = mv * np.float32(0.9) + gv, vv * np.float32(0.99) + gv * gv
  np.testing.assert_allclose(env[mb].reshape(3, 4), em, rtol=1e-6)
  np.testing.assert_allclose(env[vb].reshape(3, 4), ev, rtol=1e-6)
  np.testing.assert_allclose(env[pb].reshape(3, 4), pv - em / (np.sqrt(ev) + 1), rtol=1e-5)
  np.testing.assert_allclose(ref.realized_value(sched, env, read_old_m), mv * 2, rtol=1e-6)
  assert n_kernels(sched) == 2
  multi = next(c for c in sched.calls if len(c.src[0].src) == 3)
  assert set(multi.src[1:4]) == {mb, vb, pb} and sched.calls.index(multi) == 1


def test_swap_and_old_with_new_value():
  (ab, a, av), (bb, b, bv) = tensor(2, 3), tensor(2, 3)
  sched = create_schedule(UOp.sink(a.assign(b), b.assign(a)))  # a swap: both reads before both writes
  env = ref.run_schedule(sched, {ab: av, bb: bv})
  np.testing.assert_equal(env[ab].reshape(2, 3), bv)
  np.testing.assert_equal(env[bb].reshape(2, 3), av)
  asg = a.assign(a * fconst(3.0, (2, 3)))
  both = (a + asg).contiguous()  # the old and the new value of a in one kernel: the old one is read from a copy
  sched = create_schedule(UOp.sink(asg, both))
  env = ref.run_schedule(sched, {ab: av, bb: bv})
  np.testing.assert_allclose(ref.realized_value(sched, env, both), av + av * 3, rtol=1e-6)
  np.testing.assert_allclose(env[ab].reshape(2, 3), av * 3, rtol=1e-6)


def test_reading_a_version_between_two_assigns_is_a_clear_error():
  ab, a, _ = tensor(2, 3)
  a1 = a.assign(a * fconst(2.0, (2, 3)))
  a2 = a1.assign(a1 + fconst(1.0, (2, 3)))
  with pytest.raises(RuntimeError, match="between two ASSIGNs"):
    create_schedule(UOp.sink(a2, (a1 * a2).contiguous()))


def test_elementwise_read_through_a_window_gets_its_own_kernel():
  # a*b read by a windowed reduce (cumsum's pad/expand/shrink window) would be recomputed once per window position:
  # big enough, it is realized first; small, it stays inlined
  big = [tensor(64, 256) for _ in range(2)]
  sched = check([cumsum_last(big[0][1] * big[1][1])], {b: v for b, _, v in big}, rtol=1e-4)
  assert n_kernels(sched) == 2
  assert schedule_mod.WINDOW_MIN_SIZE <= 64 * 256 and schedule_mod.WINDOW_MIN_BUFFERS <= 2
  small = [tensor(4, 8) for _ in range(2)]
  assert n_kernels(check([cumsum_last(small[0][1] * small[1][1])], {b: v for b, _, v in small})) == 1
  one = tensor(64, 256)  # one buffer: cheap to recompute, inlined
  assert n_kernels(check([cumsum_last(one[1] * one[1])], {one[0]: one[2]}, rtol=1e-4)) == 1


def test_small_value_under_a_wide_broadcast_gets_its_own_kernel():
  # a+b of 32x64 (under WINDOW_MIN_SIZE) read by a matmul to 1024 columns: fused, each column block would recompute
  # it (efficientnet's residual sums before a 1x1 conv to 6x the channels); 2048 x 1024 evaluations reach
  # WINDOW_MIN_EVALS, so it is stored. Under a narrow broadcast (16 columns), or as a matrix-vector product's vector
  # (one row: the outputs no more than the broadcast), it stays fused
  assert 32 * 64 < schedule_mod.WINDOW_MIN_SIZE and 32 * 64 * 1024 >= schedule_mod.WINDOW_MIN_EVALS > 32 * 64 * 16
  for rows, k, cols, kernels in ((32, 64, 1024, 2), (32, 64, 16, 1), (1, 2048, 768, 1)):
    a, b, w = tensor(rows, k), tensor(rows, k), tensor(k, cols)
    sched = check([matmul(a[1] + b[1], w[1])], {a[0]: a[2], b[0]: b[2], w[0]: w[2]}, rtol=1e-3)  # sums of 2048
    assert n_kernels(sched) == kernels, (rows, k, cols, n_kernels(sched))


def test_split_index_outermost_has_no_mod():
  # where the element is valid the linear index is in range, so the outermost index is just lin // stride; the
  # `% size` it would need only for masked (padded) positions would cost a division per load
  from tiny_codegen.schedule.indexing import iconst, split_index
  r = UOp.range(48, 0)
  lin = r - iconst(5)  # as after a pad: negative at the start, where a mask hides it
  outer, mid, inner = split_index(lin, (iconst(2), iconst(4), iconst(5)))
  assert not any(u.op is Ops.CMOD for u in outer.toposort()) and any(u.op is Ops.CMOD for u in inner.toposort())
  for v in range(5, 45):  # the valid positions: lin in [0, 40)
    got = [int(x.substitute({r: UOp.const(r.dtype, v)}).simplify().arg) for x in (outer, mid, inner)]
    assert got == list(np.unravel_index(v - 5, (2, 4, 5))), (v, got)
