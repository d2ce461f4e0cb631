"""gates_to_bounds on hand-built kernels: strided padded windows and random affine gates, run on the CPU and compared
with numpy evaluations of the same masked sums."""
from __future__ import annotations

import random

import numpy as np
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes

from tiny_codegen.lower.bounds import gates_to_bounds
from test_opt import run


def strided_window_ast(H: int, S: int, P: int, K: int) -> tuple[UOp, int]:
  """out[y] = sum_ky pad(x, P)[S*y + ky] * w[ky], the padding written as the gate 0 <= S*y + ky - P < H."""
  OH = (H + 2 * P - K) // S + 1
  o, x, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((OH, H, K)))
  y, ky = UOp.range(OH, 0), UOp.range(K, 1, AxisType.REDUCE)
  idx = S * y + ky - P
  val = (x.index(idx, (idx >= 0) & (idx < H)).load() * w.index(ky).load()).reduce(ky, arg=Ops.ADD)
  return o.index(y).store(val).sink(arg=KernelInfo(opts_to_apply=())), OH


def test_gate_that_never_narrows_keeps_its_loop() -> None:
  """The crash: 3*y + ky >= 0 always holds, the narrowed length simplifies to K and the RANGE interns to itself."""
  ast, _ = strided_window_ast(10, 3, 0, 3)
  out = gates_to_bounds(ast)  # raised "replacing Ops.RANGE leads back to itself (cycle)"
  reds = [u for u in out.toposort() if u.op is Ops.REDUCE]
  assert len(reds) == 1 and reds[0].src[1].op is Ops.RANGE and reds[0].src[1].src[0].arg == 3


@pytest.mark.parametrize("S", [1, 2, 3, 4])
@pytest.mark.parametrize("P", [0, 1, 2])
@pytest.mark.parametrize("K", [1, 2, 3, 5])
def test_strided_padded_window_matches_numpy(S: int, P: int, K: int) -> None:
  H = 10
  rng = np.random.default_rng(S * 100 + P * 10 + K)
  xs, ws = rng.standard_normal(H).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  ast, OH = strided_window_ast(H, S, P, K)
  out = run(ast, "CPU", [xs, ws], OH)
  xp = np.pad(xs, P)
  ref = np.array([sum(xp[S * yy + k] * ws[k] for k in range(K)) for yy in range(OH)], dtype=np.float32)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_random_affine_gates_match_numpy() -> None:
  """out[y] = sum_k where(lo <= a*y + b*k + c < hi, x[y*K + k], 0) (and the same as a gated load) for random small
  a, b, c, ranges and bounds: unit-stride gates become loop bounds, the others stay gates; both must sum the same."""
  rnd = random.Random(1234)
  for case in range(24):
    Y, K = rnd.randint(1, 7), rnd.randint(1, 7)
    a, b, c = rnd.randint(-3, 3), rnd.choice([-2, -1, 0, 1, 1, 1, 2]), rnd.randint(-6, 6)
    lo, hi = rnd.randint(-4, 4), rnd.randint(-2, 9)
    o, x = UOp(Ops.PARAM, dtypes.float.ptr(Y), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(Y * K), arg=1)
    y, k = UOp.range(Y, 0), UOp.range(K, 1, AxisType.REDUCE)
    e = a * y + b * k + c
    gate = (e >= lo) & (e < hi)
    term = gate.where(x.index(y * K + k).load(), 0.0) if case % 2 else x.index(y * K + k, gate).load()
    ast = o.index(y).store(term.reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo(opts_to_apply=()))
    xs = np.random.default_rng(case).standard_normal(Y * K).astype(np.float32)
    yy, kk = np.meshgrid(np.arange(Y), np.arange(K), indexing="ij")
    ev = a * yy + b * kk + c
    ref = np.where((ev >= lo) & (ev < hi), xs.reshape(Y, K), 0).sum(axis=1)
    out = run(ast, "CPU", [xs], Y)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=f"{case=} {Y=} {K=} {a=} {b=} {c=} {lo=} {hi=}")
