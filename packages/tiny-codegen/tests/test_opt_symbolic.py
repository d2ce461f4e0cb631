"""The CPU heuristics on kernels over a symbolic (Variable) bound (issue #39): a symbolic axis weighs as its
`representative_size`, so a matmul over a Variable batch gets the register block a fixed-size one gets (its rows
upcast with a masked tail, `Kernel._split_tail`), and the results match numpy for every value of the Variable."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.plugins import Device

import kernel_runner as kr
from tiny_codegen import get_program, to_program
from tiny_codegen.opt import Kernel, KernelOptError, Opt, OptOps, optimize_kernel
from tiny_codegen.opt.heuristic_common import representative_size


def matmul_ast(M: int | UOp, N: int, K: int, cap: int, opts: tuple | None = None) -> UOp:
  """(M x K) @ (K x N) into C, buffers sized for `cap` rows; M may be a Variable."""
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((cap * N, cap * K, K * N)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo(opts_to_apply=opts))


def check(ast: UOp, cap: int, N: int, K: int, values: tuple[int, ...]) -> None:
  """Run the compiled `ast` at each value of its Variable against numpy; rows past it must stay untouched."""
  spec = get_program(ast, Device["CPU"].renderer)
  rng = np.random.default_rng(3)
  for m in values:
    A, B = rng.standard_normal((cap, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    C = np.full((cap, N), 7.0, np.float32)
    kr.run(spec, [C, A, B], (m,))
    np.testing.assert_allclose(C[:m], A[:m] @ B, rtol=1e-4, atol=1e-4, err_msg=f"m={m}")
    assert (C[m:] == 7.0).all(), f"m={m}: the masked tail wrote past the bound"


@pytest.mark.parametrize("lo, hi, want", [(1, 64, 8), (16, 64, 32), (1, 1, 1), (4, 4, 4), (1, 512, 23)])
def test_representative_size_is_the_geometric_middle(lo: int, hi: int, want: int) -> None:
  r = UOp.range(UOp.variable("v", lo, hi), 0)
  assert representative_size(r) == want == round(np.sqrt(max(lo, 1) * hi))
  assert representative_size(UOp.range(12, 0)) == 12


@pytest.mark.parametrize("regs", [(32, 64), (16, 32)])
def test_symbolic_batch_matmul_gets_the_fixed_size_block(vector_registers, regs: tuple) -> None:
  # before: the symbolic rows counted 1, the kernel looked like a matrix-vector product (reuse 1): 4 lanes + unroll
  vector_registers(*regs)
  ren = Device["CPU"].renderer
  N, K, cap = 64, 32, 64
  m = UOp.variable("m", 16, cap)
  fixed = optimize_kernel(matmul_ast(32, N, K, cap), ren).arg.applied_opts  # 32: m's representative size
  sym = optimize_kernel(matmul_ast(m, N, K, cap), ren)
  assert sym.arg.applied_opts == fixed, (sym.arg.applied_opts, fixed)
  assert Opt(OptOps.UPCAST, 0, regs[0] // 4) in fixed  # the rows are blocked (8 on AVX-512, 4 on AVX2)
  check(sym, cap, N, K, (16, 17, 21, 40, 63, 64))
  # [1, 64] (representative 8): the same block, 8 rows masked down to 1
  sym1 = optimize_kernel(matmul_ast(UOp.variable("m", 1, cap), N, K, cap), ren)
  assert sym1.arg.applied_opts == sym.arg.applied_opts
  check(sym1, cap, N, K, (1, 2, 7, 9, 64))


@pytest.mark.parametrize("amt", [2, 5, 8])
def test_upcast_of_a_symbolic_axis_masks_its_tail(amt: int) -> None:
  cap, N, K = 24, 16, 12
  ast = matmul_ast(UOp.variable("m", 1, cap), N, K, cap, (Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, amt)))
  check(ast, cap, N, K, (1, amt - 1, amt, amt + 1, 2 * amt + 1, cap))


def test_symbolic_splits_that_cant_apply_say_why() -> None:
  ren = Device["CPU"].renderer
  m = UOp.variable("m", 1, 64)
  with pytest.raises(KernelOptError, match="the amount must be an explicit int > 1"):
    Kernel(matmul_ast(m, 16, 16, 64), ren).apply_opt(Opt(OptOps.UPCAST, 0, 0))
  s = UOp.variable("s", 1, 64)
  with pytest.raises(KernelOptError, match="only UPCAST of a LOOP/GLOBAL output axis splits a symbolic bound"):
    Kernel(matmul_ast(8, 16, s, 64), ren).apply_opt(Opt(OptOps.UNROLL, 0, 4))


def elementwise_ast(M: int | UOp, N: int, cap: int) -> UOp:
  """C = A * 2 + 1 over (M, N), buffers sized for `cap` rows; M may be a Variable."""
  c, a = (UOp(Ops.PARAM, dtypes.float.ptr(cap * N), arg=i) for i in range(2))
  i, j = UOp.range(M, 0), UOp.range(N, 1)
  return c.index(i * N + j).store(a.index(i * N + j).load() * 2.0 + 1.0).sink(arg=KernelInfo())


@pytest.mark.parametrize("lo, hi, rows", [(1, 128, 11), (64, 4096, 512)])
def test_threads_for_a_symbolic_bound_as_for_its_representative_size(lo: int, hi: int, rows: int) -> None:
  # a symbolic loop counted 2**16 iterations: every kernel over a sequence Variable was split across the threads,
  # each launch waking the helpers for a few microseconds of work (bert_tiny replayed 30-80x slower than fixed-size)
  R = type(Device["CPU"].renderer)
  ren = R()
  ren.threads = 4
  ren.thread_min_work = 1 << 17  # between the two cases' work (11 x 256 and 512 x 256 float32s read and written)
  N = 256
  fixed = get_program(elementwise_ast(rows, N, hi), ren).global_size
  spec = get_program(elementwise_ast(UOp.variable("m", lo, hi), N, hi), ren)
  assert spec.global_size == fixed and fixed[0] == (1 if rows < 64 else 4), (spec.global_size, fixed)
  rng = np.random.default_rng(5)
  for m in sorted({lo, lo + 1, rows, hi - 3, hi}):
    A, C = rng.standard_normal((hi, N)).astype(np.float32), np.zeros((hi, N), np.float32)
    kr.run(spec, [C, A], (m,))
    np.testing.assert_allclose(C[:m], A[:m] * 2 + 1, rtol=1e-6)
    assert (C[m:] == 0).all()


def scores_ast(S: int | UOp, D: int, cap: int) -> UOp:
  """Attention scores C[i, j] = sum_d Q[i, d] K[j, d] over S x S positions (S may be a Variable), rows `cap` apart."""
  c, q, k = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((cap * cap, cap * D, cap * D)))
  i, j, d = UOp.range(S, 0), UOp.range(S, 1), UOp.range(D, 2, AxisType.REDUCE)
  val = (q.index(i * D + d).load() * k.index(j * D + d).load()).reduce(d, arg=Ops.ADD)
  return c.index(i * cap + j).store(val).sink(arg=KernelInfo())


def test_symbolic_attention_scores_get_the_register_block() -> None:
  # both output axes symbolic and no load contiguous along either (K is contiguous along d): `_register_block`
  # blocks them as a fixed-size kernel's (64: 16 x 8), each by at most the representative size
  ren = Device["CPU"].renderer
  D, cap = 16, 40
  fixed = optimize_kernel(scores_ast(64, D, 64), ren).arg.applied_opts
  assert [(o.op, o.axis) for o in fixed] == [(OptOps.UPCAST, 1), (OptOps.UPCAST, 0)], fixed
  sym = optimize_kernel(scores_ast(UOp.variable("s", 1, cap), D, cap), ren)  # representative size 6
  # 4 x 4 (at most 6 each; a symbolic row is not a short one taken whole), 16 lanes: below BLOCK_NO_UNROLL_LANES,
  # so D is unrolled too, as for a fixed kernel of a 4 x 4 block
  assert sym.arg.applied_opts == (Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 16)), \
    sym.arg.applied_opts
  spec = get_program(sym, ren)
  rng = np.random.default_rng(4)
  for s in (1, 3, 4, 6, 9, 37, 40):
    Q, K = rng.standard_normal((cap, D)).astype(np.float32), rng.standard_normal((cap, D)).astype(np.float32)
    C = np.full((cap, cap), 7.0, np.float32)
    kr.run(spec, [C, Q, K], (s,))
    np.testing.assert_allclose(C[:s, :s], Q[:s] @ K[:s].T, rtol=1e-4, atol=1e-4, err_msg=f"s={s}")
    assert (C[s:] == 7.0).all() and (C[:, s:] == 7.0).all(), f"s={s}: the masked tail wrote past the bound"


def test_masked_tail_split_across_threads() -> None:
  # the outer range of a tail split (bound ceil(m / 8)) is what add_threads splits: each thread's share from the
  # runtime bound, the last block's rows masked in whichever thread holds it
  R = type(Device["CPU"].renderer)
  ren = R()
  ren.threads, ren.thread_min_work = 3, 0
  cap, N, K = 64, 32, 8
  ast = matmul_ast(UOp.variable("m", 1, cap), N, K, cap, (Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8)))
  spec = get_program(ast, ren)
  assert spec.global_size[0] == 3
  rng = np.random.default_rng(6)
  for m in (1, 7, 9, 17, 25, 63, 64):
    A, B = rng.standard_normal((cap, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    C = np.full((cap, N), 7.0, np.float32)
    kr.run(spec, [C, A, B], (m,), threaded=True)
    np.testing.assert_allclose(C[:m], A[:m] @ B, rtol=1e-4, atol=1e-4, err_msg=f"m={m}")
    assert (C[m:] == 7.0).all(), f"m={m}"


def test_masked_tail_gates_stores_and_clamps_loads() -> None:
  # before: every load through the split rows was gated too, and LLVM rematerialized the eight row masks inside the K
  # loop (the matmul over a symbolic batch ran 3x slower than a fixed one); now only the stores test the bound and
  # the loads read the last valid row past it: the K loop's loads carry no gate
  ren = Device["CPU"].renderer
  m = UOp.variable("m", 1, 64)
  ast = optimize_kernel(matmul_ast(m, 64, 32, 64), ren)
  assert any(o.op is OptOps.UPCAST and o.axis == 0 for o in ast.arg.applied_opts)  # the symbolic rows are split
  lin = to_program(ast, ren).src[2].src
  loaded = [u.src[0] for u in lin if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.PARAM]
  stored = [u.src[0] for u in lin if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]
  assert loaded and stored
  assert all(len(i.src) == 2 for i in loaded), "a load through the split rows is still gated"
  assert all(len(i.src) == 3 and i.src[2].op is Ops.CMPLT for i in stored), "a store past the bound is not gated"
  check(ast, 64, 64, 32, (1, 2, 7, 8, 9, 63, 64))
