"""Scheduled kernels compiled by tiny-codegen (LLVM IR via llvmlite) and run on numpy buffers, vs numpy."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_uop import Ops, UOp, Variable, dtypes

from tiny_codegen.schedule import create_schedule


import kernel_runner as kr  # noqa: E402
import test_schedule as T  # noqa: E402
import test_schedule_ref as ref  # noqa: E402

from tiny_codegen import get_program  # noqa: E402
from tiny_codegen.renderer.llvmir import LLVMRenderer  # noqa: E402


def run_compiled(sched, inputs: dict[UOp, np.ndarray]) -> dict[UOp, np.ndarray]:
  env: dict[UOp, np.ndarray] = {b: np.ascontiguousarray(a).reshape(-1).copy() for b, a in inputs.items()}

  def get(b: UOp) -> np.ndarray:
    if b not in env: env[b] = np.full(b.arg, 77, dtype=ref.np_dtype(b.dtype))
    return env[b]
  r = LLVMRenderer()
  for c in sched.calls:
    ast, bufs = c.src[0], c.src[1:]
    if ast.op is Ops.SLICE:
      base = get(bufs[1])
      env[bufs[0]] = base[ast.arg // base.dtype.itemsize:][:bufs[0].arg]
    elif ast.op is Ops.COPY: get(bufs[0])[:] = get(bufs[1])
    else:
      spec = get_program(ast, r)
      kr.run(spec, [get(b) for b in bufs], tuple(sched.var_vals[v.arg[0]] for v in spec.vars))
  return env


def _programs():
  (ab, a, av), (bb, b, bv), (wb, w, wv) = T.tensor(4, 6), T.tensor(4, 6), T.tensor(6, 3)
  ins = {ab: av, bb: bv, wb: wv}
  f = T.fconst
  return [
    ("chain", (((a + b) * a - f(2.0, (4, 6))).maximum(b)), ins),
    ("sum", (a * b).r(Ops.ADD, (1,)), ins),
    ("matmul_relu", (T.matmul(a, w)).maximum(f(0.0, (4, 3))), ins),
    ("transpose", a.permute((1, 0)).contiguous(), ins),
    ("flip_pad", a.flip((True, False)).pad(((1, 1), (2, 2))) * f(2.0, (6, 10)), ins),
    ("reshape_misaligned", a.permute((1, 0)).reshape((4, 6)).flip((False, True)) + b, ins),
    ("arange", a + T.arange(6).reshape((1, 6)).expand((4, 6)), ins),
    ("eye", a.shrink(((0, 4), (0, 4))) * T.eye(4), ins),
    ("softmax", T.softmax(a), ins),
    ("layernorm", T.layernorm(a), ins),
    ("cumsum", T.cumsum_last(a), ins),
  ]


@pytest.mark.parametrize("name", [p[0] for p in _programs()])
def test_compiled_schedule_matches_numpy(name):
  _, out, ins = next(p for p in _programs() if p[0] == name)
  sched = create_schedule(UOp.sink(out))
  env = run_compiled(sched, ins)
  np.testing.assert_allclose(ref.realized_value(sched, env, out), ref.eval_graph(out, ins), rtol=1e-4, atol=1e-5)


def test_compiled_symbolic_kernel():
  n = Variable("n", 1, 8)
  ab = UOp.new_buffer("CPU", 32, dtypes.float32)
  av = np.arange(32, dtype=np.float32)
  for val in (2, 5):
    x = ab.reshape((8, 4)).shrink(((0, n.bind(val)), (0, 4)))
    out = (x * x).r(Ops.ADD, (1,))
    sched = create_schedule(UOp.sink(out))
    env = run_compiled(sched, {ab: av})
    got = env[sched.becomes[out].src[0]][:val]
    np.testing.assert_allclose(got, (av.reshape(8, 4)[:val] ** 2).sum(1), rtol=1e-6)
