"""Vector lanes on a symbolic axis with a masked tail (issue #39; docs/PIPELINE.md §3): attention's scores over a
dynamic sequence, `C[h, i, j] = sum_d A[h, i, d] * B[h, d, j]` with i and j both of symbolic bound s and B's rows s
apart, upcast along j with a masked tail (`Kernel._split_tail`). On the LLVM CPU renderer the expander makes the keys
one vector of lanes: B read with `llvm.masked.load` at the unclamped index and C written with `llvm.masked.store`,
where the scalar form gathered every lane. Checked against numpy at sizes with tails of 1 and of lanes - 1, and with
CHECK_OOB on buffers exactly as large as each size needs (a masked-off lane must not touch memory past them)."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.opt import Opt, OptOps

H, D = 2, 16


def scores_ast(s: int, opts: tuple | None, name: str) -> UOp:
  """C[h, i, j] = sum_d A[h, i, d] * B[h, d, j] over a Variable sequence in [1, 64], buffers sized for exactly `s`."""
  v = UOp.variable("s", 1, 64)
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=k) for k, n in enumerate((H * s * s, H * s * D, H * D * s)))
  h, i, j, d = UOp.range(H, 0), UOp.range(v, 1), UOp.range(v, 2), UOp.range(D, 3, AxisType.REDUCE)
  val = (a.index((h * v + i) * D + d).load() * b.index((h * D + d) * v + j).load()).reduce(d, arg=Ops.ADD)
  return c.index((h * v + i) * v + j).store(val).sink(arg=KernelInfo(name, opts_to_apply=opts))


def run_scores(s: int, opts: tuple | None, name: str) -> tuple[np.ndarray, np.ndarray, str]:
  """(tiny's C, numpy's, the kernel's source): compiled and run with CHECK_OOB on the CPU device."""
  from tiny_uop.device import Buffer
  rng = np.random.default_rng(s)
  A, B = rng.standard_normal((H, s, D)).astype(np.float32), rng.standard_normal((H, D, s)).astype(np.float32)
  dev = Device["CPU"]
  with Context(CHECK_OOB=1):
    spec = get_program(scores_ast(s, opts, name), dev.renderer)
    prg = dev.get_program(spec.name, spec.lib)
    bufs = [Buffer("CPU", n, dtypes.float32).ensure_allocated() for n in (H * s * s, A.size, B.size)]
    bufs[1].copyin(memoryview(A.tobytes()))
    bufs[2].copyin(memoryview(B.tobytes()))
    gs = tuple(x if isinstance(x, int) else int(x.substitute({x.variables()[0]: UOp.const(dtypes.int32, s)})
                                                   .simplify().arg) for x in spec.global_size) \
      if spec.global_size is not None else None
    prg(*[b._buf for b in bufs], global_size=gs, local_size=spec.local_size, vals=(s,))
  res = bytearray(H * s * s * 4)
  bufs[0].copyout(memoryview(res))
  return np.frombuffer(res, np.float32).reshape(H, s, s), A @ B, spec.src


def _llvm() -> None:
  if type(Device["CPU"].renderer).__name__ != "LLVMRenderer": pytest.skip("masked vectors are the LLVM renderer's")


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("s", [1, 7, 8, 9, 15, 17, 23])
def test_masked_key_vectors_match_numpy_in_bounds(lanes: int, s: int) -> None:
  _llvm()
  opts = (Opt(OptOps.UPCAST, 2, lanes), Opt(OptOps.UPCAST, 1, 4))
  got, want, src = run_scores(s, opts, f"scores_{lanes}_{s}")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert f"@llvm.masked.load.v{lanes}f32" in src and f"@llvm.masked.store.v{lanes}f32" in src


@pytest.mark.parametrize("s", [1, 5, 12, 31])
def test_heuristic_scores_match_numpy_in_bounds(s: int) -> None:
  _llvm()
  got, want, src = run_scores(s, None, f"scores_h_{s}")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert "@llvm.masked.load.v" in src  # the keys are a vector, not gathered lane by lane


@pytest.mark.parametrize("regs", [(32, 64), (16, 32)])
def test_scores_keys_get_one_register_of_lanes(vector_registers, regs: tuple) -> None:
  # the keys' axis (symbolic, [1, 64]: representative size 8) is the store's and B's contiguous axis, so its masked
  # tail is one masked vector: it gets a whole register of lanes (16 floats on AVX-512, 8 on AVX2), not at most 8
  _llvm()
  vector_registers(*regs)
  from tiny_codegen.opt import optimize_kernel
  opts = optimize_kernel(scores_ast(24, None, f"scores_regs_{regs[1]}"), Device["CPU"].renderer).arg.applied_opts
  assert opts[0] == Opt(OptOps.UPCAST, 2, regs[1] // 4), opts
  got, want, src = run_scores(24, opts, f"scores_regs_run_{regs[1]}")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert f"@llvm.masked.load.v{regs[1] // 4}f32" in src


def pv_ast(H: int, S: int, D: int) -> UOp:
  """Attention's P @ V with the softmax's normalization fused in: C[h, i, d] = sum_j E[h, i, j] * (1 / Z[h, i]) *
  V[h, j, d] (E the exponentials, Z their row sums)."""
  sizes = (H * S * D, H * S * S, H * S, H * S * D)
  c, e, z, v = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=k) for k, n in enumerate(sizes))
  h, i, d, j = UOp.range(H, 0), UOp.range(S, 1), UOp.range(D, 2), UOp.range(S, 3, AxisType.REDUCE)
  p = e.index((h * S + i) * S + j).load() * z.index(h * S + i).load().reciprocal()
  val = (p * v.index((h * S + j) * D + d).load()).reduce(j, arg=Ops.ADD)
  return c.index((h * S + i) * D + d).store(val).sink(arg=KernelInfo("pv_fused"))


@pytest.mark.parametrize("regs", [(32, 64), (16, 32)])
def test_fused_softmax_pv_gets_whole_value_rows(vector_registers, regs: tuple) -> None:
  # the normalized probability is computed once per (row pair, key) and broadcast over V's whole row (4 vectors),
  # not gathered as a vector across the rows (where the 1/sum is contiguous) and recomputed per 8 columns
  import kernel_runner as kr
  from tiny_codegen.opt import optimize_kernel
  _llvm()
  vector_registers(*regs)
  lanes = regs[1] // 4
  H, S, D = 2, 16, 4 * lanes
  ren = Device["CPU"].renderer
  opts = optimize_kernel(pv_ast(H, S, D), ren).arg.applied_opts
  assert opts == (Opt(OptOps.UPCAST, 2, lanes), Opt(OptOps.UPCAST, 2, 4), Opt(OptOps.UPCAST, 1, 2)), opts
  rng = np.random.default_rng(9)
  E, Z = rng.random((H, S, S)).astype(np.float32), rng.random((H, S)).astype(np.float32) + 0.5
  V = rng.standard_normal((H, S, D)).astype(np.float32)
  C = np.zeros((H, S, D), np.float32)
  kr.run(get_program(pv_ast(H, S, D), ren), [C, E, Z, V])
  np.testing.assert_allclose(C, (E / Z[..., None]) @ V, rtol=1e-5, atol=1e-5)
