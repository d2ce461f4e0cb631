"""The kernel optimizer: opts keep results identical, illegal opts fail clearly, heuristics block matmuls."""
from __future__ import annotations

import itertools
import random
import shutil
from typing import Any

import numpy as np
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.machine import fma_chains, machine_of
from tiny_codegen.opt import KernelOptError, Opt, OptOps, apply_opts, optimize_kernel


def matmul_ast(M: int, N: int, K: int, opts: tuple | None = None) -> UOp:
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((M * N, M * K, K * N)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo(opts_to_apply=opts))


def run(ast: UOp, device: str, inputs: list[np.ndarray], out_size: int) -> np.ndarray:
  dev = Device[device]
  spec = get_program(ast, dev.renderer)
  bufs = [Buffer(device, out_size, dtypes.float).allocate()] + \
    [Buffer(device, x.size, dtypes.float, initial_value=x.tobytes()) for x in inputs]
  prg = dev.get_program(spec.name, spec.lib)
  prg(*[bufs[s]._buf for s in spec.globals], global_size=spec.global_size, local_size=spec.local_size, vals=(),
      wait=True)
  return np.frombuffer(bufs[0].as_buffer(), dtype=np.float32)


MM_OPTS = [
  (),
  (Opt(OptOps.UPCAST, 1, 4),),
  (Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 2)),
  (Opt(OptOps.UNROLL, 0, 4),),
  (Opt(OptOps.UNROLL, 0, 0),),
  (Opt(OptOps.UPCAST, 0, 0), Opt(OptOps.UNROLL, 0, 2)),
  (Opt(OptOps.PADTO, 0, 16),),
]


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("opts", MM_OPTS, ids=[str(i) for i in range(len(MM_OPTS))])
def test_matmul_opts_keep_results(device: str, opts: tuple) -> None:
  M, N, K = 12, 8, 8
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  out = run(matmul_ast(M, N, K, opts), device, [a, b], M * N).reshape(M, N)
  np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def fuzz_ast(M: int, N: int, K: int, b_transposed: bool, pad: int, opts: tuple) -> UOp:
  """c = a @ b (+ a masked read of a padded a), with b stored transposed or not: movement as index math."""
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((M * N, M * K, K * N)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  bidx = j * K + k if b_transposed else k * N + j
  prod = a.index(i * K + k).load() * b.index(bidx).load()
  if pad:  # a padded by `pad` zero rows at the top: read a[i-pad] where valid
    prod = prod + a.index((i - pad) * K + k, (i >= pad)).load()
  return c.index(i * N + j).store(prod.reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo(opts_to_apply=opts))


def _ref(a: np.ndarray, b: np.ndarray, b_transposed: bool, pad: int) -> np.ndarray:
  out = a @ (b.T if b_transposed else b)
  if pad: out = out + np.pad(a, ((pad, 0), (0, 0)))[:a.shape[0]].sum(axis=1, keepdims=True)
  return out


@pytest.mark.parametrize("dev", ["CPU:LLVM", "CPU:CLANG", "PYTHON"])
def test_random_legal_opts_fuzz(dev: str) -> None:
  """Random kernels (shapes, transposed operand, padded read) with random legal opt sequences give numpy's numbers
  through every lowering pass, on both CPU renderers and the PYTHON interpreter."""
  from tiny_uop.helpers import Context
  rnd = random.Random(1)
  rng = np.random.default_rng(1)
  tried = 0
  with Context(DEV=dev):
    device = dev.split(":")[0]
    ren = Device[device].renderer
    for _ in range(10 if device == "PYTHON" else 14):
      M, N, K = rnd.choice([4, 6, 8, 12]), rnd.choice([4, 8, 16]), rnd.choice([2, 4, 8])
      bt, pad = rnd.random() < 0.5, rnd.choice([0, 0, 1, 2])
      opts: list[Opt] = []
      for _ in range(rnd.randint(1, 3)):
        op = rnd.choice([OptOps.UPCAST, OptOps.UNROLL, OptOps.PADTO])
        cand = Opt(op, rnd.randint(0, 1), rnd.choice([0, 2, 4, 3]))
        try: apply_opts(fuzz_ast(M, N, K, bt, pad, ()), ren, (*opts, cand))
        except KernelOptError: continue
        opts.append(cand)
      a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
      bin_ = np.ascontiguousarray(b.T) if bt else b
      out = run(fuzz_ast(M, N, K, bt, pad, tuple(opts)), device, [a, bin_], M * N).reshape(M, N)
      np.testing.assert_allclose(out, _ref(a, bin_, bt, pad), rtol=1e-4, atol=1e-4, err_msg=f"{dev} opts {opts}")
      tried += bool(opts)
  assert tried >= 5


@pytest.mark.parametrize("opt, msg", [
  (Opt(OptOps.UPCAST, 0, 5), "not divisible by 5"),
  (Opt(OptOps.UPCAST, 7, 2), "axis 7 doesn't exist"),
  (Opt(OptOps.UNROLL, 0, 1), "amount must be an int > 1"),
  (Opt(OptOps.LOCAL, 0, 2), "no local"),
  (Opt(OptOps.GROUP, 0, 2), "no local"),
  (Opt(OptOps.TC, 0, 0), "tensor cores"),
  (Opt(OptOps.PADTO, 0, 4), "already a multiple"),
])
def test_illegal_opts_fail_clearly(opt: Opt, msg: str) -> None:
  ast = matmul_ast(8, 8, 8)
  with pytest.raises(KernelOptError, match=msg):
    apply_opts(ast, Device["CPU"].renderer, (opt,))


def test_unroll_needs_reduce_axis_and_upcast_limit() -> None:
  ren = Device["CPU"].renderer
  with pytest.raises(KernelOptError, match="axis 1 doesn't exist"):
    apply_opts(matmul_ast(8, 8, 8), ren, (Opt(OptOps.UNROLL, 1, 2),))
  with pytest.raises(KernelOptError, match="exceeds the limit of 1024"):
    apply_opts(matmul_ast(64, 64, 8), ren, (Opt(OptOps.UPCAST, 0, 0), Opt(OptOps.UPCAST, 0, 0)))


def test_heuristics_register_block_matmul(vector_registers) -> None:
  vector_registers(32, 64)  # AVX-512 (AVX2's narrower block: below)
  ast = optimize_kernel(matmul_ast(64, 64, 64), Device["CPU"].renderer)
  applied = ast.arg.applied_opts
  assert applied[:2] == (Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8)), applied  # 16 lanes x 8 rows
  types = [u.arg[1] for u in ast.toposort() if u.op is Ops.RANGE]
  assert types.count(AxisType.UPCAST) in (2, 3) and AxisType.REDUCE in types  # 3: widened (vector registers)


@pytest.mark.parametrize("M, N, K, regs, lanes, rows, extra, axis", [
  (64, 64, 64, (32, 64), 16, 8, 2, 1),   # AVX-512: 8 rows x 2 zmm accumulators (16: half the 32 registers)
  (64, 96, 32, (32, 64), 16, 8, 2, 1),   # 96 = 16 x 6: 8 x 3 would take 24 registers
  (4, 128, 32, (32, 64), 16, 4, 4, 0),   # only 4 rows (upcast whole: the row axis is gone, B's is output axis 0): 4 x 4
  (64, 64, 64, (16, 32), 8, 4, 2, 1),    # AVX2: 4 rows x 2 ymm (8 of the 16; 8 rows x 16 lanes spilled), no K unroll
  (64, 64, 64, (0, 0), 16, 8, 1, 1),     # unknown register file: the plain 8 x 16 block
])
def test_heuristics_matmul_block_widens_to_the_vector_registers(vector_registers, M, N, K, regs, lanes, rows, extra,
                                                                axis) -> None:
  vector_registers(*regs)
  ren = Device["CPU"].renderer
  opt = optimize_kernel(matmul_ast(M, N, K), ren)
  want = (Opt(OptOps.UPCAST, 1, lanes), Opt(OptOps.UPCAST, 0, rows)) + \
    ((Opt(OptOps.UPCAST, axis, extra),) if extra > 1 else ())
  assert opt.arg.applied_opts == want, opt.arg.applied_opts
  src = get_program(opt, ren).src
  accs = rows * extra
  assert src.count(f"alloca [1 x <{lanes} x float>]") == accs, src  # that many vector accumulators
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  np.testing.assert_allclose(run(opt, "CPU", [a, b], M * N).reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)


def test_heuristics_half_matmul_widens_float_accumulators(vector_registers) -> None:
  # half inputs multiplied and summed in float (what tiny_tensor's dot builds): an accumulator of 16 float lanes is
  # one zmm, as for a float matmul
  vector_registers(32, 64)
  M, N, K = 32, 64, 48
  c = UOp(Ops.PARAM, dtypes.float.ptr(M * N), arg=0)
  a, b = (UOp(Ops.PARAM, dtypes.half.ptr(n), arg=i) for i, n in ((1, M * K), (2, K * N)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  prod = a.index(i * K + k).load().cast(dtypes.float) * b.index(k * N + j).load().cast(dtypes.float)
  ast = c.index(i * N + j).store(prod.reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo())
  ren = Device["CPU"].renderer
  opt = optimize_kernel(ast, ren)
  assert opt.arg.applied_opts == (Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 2))
  spec = get_program(opt, ren)
  assert spec.src.count("alloca [1 x <16 x float>]") == 16, spec.src
  rng = np.random.default_rng(8)
  ah, bh = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
  dev = Device["CPU"]
  bufs = [Buffer("CPU", M * N, dtypes.float).allocate(), Buffer("CPU", M * K, dtypes.half, initial_value=ah.tobytes()),
          Buffer("CPU", K * N, dtypes.half, initial_value=bh.tobytes())]
  dev.get_program(spec.name, spec.lib)(*[bufs[s]._buf for s in spec.globals], global_size=spec.global_size,
                                        local_size=spec.local_size, vals=(), wait=True)
  got = np.frombuffer(bufs[0].as_buffer(), dtype=np.float32).reshape(M, N)
  np.testing.assert_allclose(got, ah.astype(np.float64) @ bh.astype(np.float64), rtol=1e-5, atol=1e-4)


def packed_matmul_ast(M: int, N: int, K: int, P: int) -> UOp:
  """C = A @ B with B packed into (N // P, K, P) panels, as tiny_tensor's dot builds it where `gemm_panel` says so:
  the output's (m, n // P, n % P) axes arrive merged, so B's index takes n's div/mod by the panel."""
  c = UOp(Ops.PARAM, dtypes.float.ptr(M * N), arg=0)
  a, b = UOp(Ops.PARAM, dtypes.float.ptr(M * K), arg=1), UOp(Ops.PARAM, dtypes.float.ptr(K * N), arg=2)
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  prod = a.index(i * K + k).load() * b.index((j // P) * (K * P) + k * P + j % P).load()
  return c.index(i * N + j).store(prod.reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo())


@pytest.mark.parametrize("P, want", [
  (16, (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 2))),  # a panel: 4 rows x 2 ymm
  (12, (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 8))),  # 12 isn't whole vectors: not a gemm block
])
def test_heuristics_packed_matmul_gets_the_gemm_block(vector_registers, P: int, want: tuple) -> None:
  # AVX2: B packed in panels of two vectors is walked by the same 4 x 2 x 8 block as a plain matmul, whose div/mod by
  # the panel the block's whole vectors make affine; a div/mod by anything else keeps the non-gemm block
  vector_registers(16, 32)
  M, N, K = 32, 96, 24
  ren = Device["CPU"].renderer
  opt = optimize_kernel(packed_matmul_ast(M, N, K, P), ren)
  assert opt.arg.applied_opts == want, opt.arg.applied_opts
  rng = np.random.default_rng(9)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  packed = np.ascontiguousarray(b.reshape(K, N // P, P).transpose(1, 0, 2))
  np.testing.assert_allclose(run(opt, "CPU", [a, packed], M * N).reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)


def test_tile_nests_its_loop_inside_the_other_output_loops() -> None:
  # TILE(0, 4) on a 64-row matmul: rows (16 tiles) -> columns -> 4 rows of a tile -> K; the results stay a @ b
  M, N, K = 64, 48, 24
  ren = Device["CPU"].renderer
  opt = apply_opts(matmul_ast(M, N, K), ren, (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.TILE, 0, 4)))
  spec = get_program(opt, ren)
  assert spec.uops is not None
  bounds = [u.src[0].arg for u in spec.uops if u.op is Ops.RANGE and u.src[0].op is Ops.CONST]
  threads = spec.global_size[0]  # the outermost loop (the 16 row tiles) is split across the CPU threads
  assert bounds == ([16 // threads] if threads > 1 else [16]) + [6, 4, 24], (bounds, threads)
  rng = np.random.default_rng(10)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  np.testing.assert_allclose(run(opt, "CPU", [a, b], M * N).reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)


def test_tile_is_refused_where_it_cant_apply() -> None:
  ren = Device["CPU"].renderer
  with pytest.raises(KernelOptError, match="not divisible by 5"):
    apply_opts(matmul_ast(64, 48, 24), ren, (Opt(OptOps.TILE, 0, 5),))
  with pytest.raises(KernelOptError, match="already UPCAST"):
    apply_opts(matmul_ast(64, 48, 24), ren, (Opt(OptOps.UPCAST, 1, 0), Opt(OptOps.TILE, 1, 2)))

  class GPU(type(ren)):  # type: ignore[misc]
    has_local = True
  with pytest.raises(KernelOptError, match="TILE nests CPU loops"):
    apply_opts(matmul_ast(64, 48, 24), GPU(), (Opt(OptOps.TILE, 0, 4),))


@pytest.mark.parametrize("n, regs, tile", [
  # the fixture's machine (`Machine.default`): a 1 MB L2, 32 MB of L3 over 8 cores (a 4 MB share): B past the L2 is
  # tiled (`tile_min_bytes`), in tiles of half the L3 share of A (`tile_bytes`: 2 MB)
  (2048, (16, 32), 64),   # AVX2, B of 16 MB: tiles of 64 blocks of 4 rows of 8 KB (2 MB of A)
  (1024, (16, 32), 128),  # B of 4 MB, past the L2: 128 blocks of 4 rows of 4 KB (2 MB of A)
  (2048, (32, 64), 32),   # AVX-512: 32 blocks of 8 rows (2 MB of A)
  (1024, (32, 64), 64),   # 64 blocks of 8 rows of 4 KB (2 MB), the most that leaves each of 2 threads a tile
  (512, (32, 64), 0),     # B of 1 MB stays in the L2: no tile
])
def test_heuristics_tile_the_rows_of_a_big_matmul(vector_registers, n: int, regs: tuple, tile: int) -> None:
  vector_registers(*regs)
  applied = optimize_kernel(matmul_ast(n, n, n), Device["CPU"].renderer).arg.applied_opts
  tiles = [o for o in applied if o.op is OptOps.TILE]
  assert tiles == ([Opt(OptOps.TILE, 0, tile)] if tile else []), applied


class _Regs:
  def __init__(self, regs: int, width: int) -> None:
    from tiny_codegen.machine import Machine
    self.vector_registers = (regs, width)
    self.machine = Machine.default(vector_bytes=width, vector_registers=regs)  # 1 MB L2, 32 MB L3 over 8 cores


@pytest.mark.parametrize("regs, m, k, n, itemsize, strided, want", [
  ((16, 32), 1024, 1024, 1024, 4, False, 16),   # AVX2, 1024^2 float32: 16-column panels (two ymm)
  ((16, 32), 64, 512, 512, 4, False, 16),       # B of 1 MB (the L2), 64 rows: the smallest packed
  ((16, 32), 63, 1024, 1024, 4, False, 0),      # too few rows to pay for the copy (decode's matrix-vector products)
  ((16, 32), 1024, 256, 256, 4, False, 0),      # B of 256 KB stays in L2 in place
  ((16, 32), 1024, 1024, 1000, 4, False, 0),    # columns not a whole number of panels
  ((16, 32), 1024, 65536, 16, 4, False, 0),     # one panel: B already is one
  ((16, 32), 64, 32768, 64, 4, False, 0),       # four panels (rows 256 bytes apart): a long-K product splits its K
  ((16, 32), 64, 4096, 256, 4, False, 16),      # 256 columns (1 KB rows): packed
  ((16, 32), 1024, 1024, 1024, 8, False, 0),    # float64: not packed
  ((32, 64), 1024, 1024, 1024, 4, False, 32),   # AVX-512: B of 4 MB, 32-column panels (two zmm)
  ((32, 64), 1024, 256, 1024, 4, False, 0),     # 1 MB, under 2 L2s: its 8-row block keeps up reading B in place
  ((32, 64), 1024, 512, 1024, 4, False, 32),    # 2 MB fills two L2s: packed (`pack_min_bytes`)
  ((32, 64), 1024, 256, 256, 4, True, 32),      # transposed B (K contiguous), 512+ rows: packed from 256 KB
  ((32, 64), 256, 128, 512, 4, True, 0),        # ... with 256 rows (a small GPT's projection) the copy doesn't pay
  ((32, 64), 64, 512, 512, 4, True, 32),        # ... from 1 MB it does at 64 rows
  ((32, 64), 1024, 128, 128, 4, True, 0),       # 64 KB transposed: the copy costs more than the gathers
  ((32, 64), 64, 32768, 64, 4, True, 32),       # transposed, two panels: packed (in place every vector a gather)
  ((32, 64), 4096, 1024, 32, 4, True, 0),       # transposed, one panel
  ((16, 32), 4096, 2048, 32, 4, True, 16),      # AVX2: 32 columns are two of its panels
  ((16, 16), 1024, 1024, 1024, 4, False, 0),    # SSE: not packed
  ((0, 0), 1024, 1024, 1024, 4, True, 0),       # register file unknown
])
def test_gemm_panel(regs: tuple, m: int, k: int, n: int, itemsize: int, strided: bool, want: int) -> None:
  from tiny_codegen.opt.heuristic import gemm_panel
  assert gemm_panel(_Regs(*regs), m, k, n, itemsize, strided) == want  # type: ignore[arg-type]


def test_heuristics_conv_window_kernel_not_widened(vector_registers) -> None:
  # a conv's sliding-window row keeps `_vector_block`'s blocking (conv heuristics are tuned on their own)
  vector_registers(32, 64)
  opt = optimize_kernel(conv1d_ast(16, 4, 32, 3), Device["CPU"].renderer)
  assert opt.arg.applied_opts == (Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 1, 0)), \
    opt.arg.applied_opts


@pytest.mark.parametrize("triple, features, want", [
  ("x86_64-unknown-linux-gnu", "+avx,+avx2,+avx512f,+fma", (32, 64)),
  ("x86_64-unknown-linux-gnu", "+avx,+avx2,-avx512f,+fma", (16, 32)),
  ("x86_64-unknown-linux-gnu", "+sse2,-avx", (16, 16)),
  ("aarch64-unknown-linux-gnu", "+neon", (32, 16)),
  ("riscv64-unknown-linux-gnu", "+v", (0, 0)),
])
def test_vector_registers_from_target_features(triple: str, features: str, want: tuple) -> None:
  from tiny_codegen.renderer.llvmir import _vector_registers
  assert _vector_registers(triple, features) == want


def conv1d_ast(CO: int, CI: int, W: int, KW: int) -> UOp:
  """out[co, x] = sum_{ci, k} inp[ci, x + k] * w[co, ci, k] (a valid 1-D convolution)."""
  IW = W + KW - 1
  out, inp, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((CO * W, CI * IW, CO * CI * KW)))
  co, x = UOp.range(CO, 0), UOp.range(W, 1)
  ci, k = UOp.range(CI, 2, AxisType.REDUCE), UOp.range(KW, 3, AxisType.REDUCE)
  val = (inp.index(ci * IW + x + k).load() * w.index(co * CI * KW + ci * KW + k).load()).reduce(ci, k, arg=Ops.ADD)
  return out.index(co * W + x).store(val).sink(arg=KernelInfo())


def test_heuristics_conv_blocks_channels_and_unrolls_filter(vector_registers) -> None:
  vector_registers(32, 64)  # AVX-512 (AVX2: test_heuristics_conv_blocks_fit_avx2_registers)
  ren = Device["CPU"].renderer
  ast = conv1d_ast(16, 4, 20, 5)
  opt = optimize_kernel(ast, ren)
  applied = opt.arg.applied_opts
  # the store-contiguous width as one native vector (20 -> 10 lanes: its widest divisor up to 16), the output
  # channels (each reuses the input vector), the 5-wide filter whole
  assert applied == (Opt(OptOps.UPCAST, 1, 10), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 1, 0)), applied
  src = get_program(opt, ren).src  # the 10 lanes are vector loads, FMAs and stores, not scalar copies
  assert "load <10 x float>" in src and "store <10 x float>" in src, src
  rng = np.random.default_rng(3)
  inp, w = rng.standard_normal((4, 24)).astype(np.float32), rng.standard_normal((16, 4, 5)).astype(np.float32)
  want = np.stack([sum(np.convolve(inp[ci], w[co, ci][::-1], "valid") for ci in range(4)) for co in range(16)])
  np.testing.assert_allclose(run(opt, "CPU", [inp.ravel(), w.ravel()], 16 * 20).reshape(16, 20), want, rtol=1e-4,
                             atol=1e-4)


def test_heuristics_window_axis_not_blocked_first() -> None:
  # out[c, y, x] = sum_k inp[y + k, x] * w[c, k]: the short contiguous row x is blocked whole; then y, sliding over
  # the rows with k, would copy the inp loads per lane, so the channel axis is blocked although y is the inner one
  out, inp, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((4 * 4 * 3, 6 * 3, 4 * 3)))
  c, y, x, k = UOp.range(4, 0), UOp.range(4, 1), UOp.range(3, 2), UOp.range(3, 3, AxisType.REDUCE)
  val = (inp.index((y + k) * 3 + x).load() * w.index(c * 3 + k).load()).reduce(k, arg=Ops.ADD)
  ast = out.index(c * 12 + y * 3 + x).store(val).sink(arg=KernelInfo())
  opt = optimize_kernel(ast, Device["CPU"].renderer)
  assert opt.arg.applied_opts[:2] == (Opt(OptOps.UPCAST, 2, 3), Opt(OptOps.UPCAST, 0, 4)), opt.arg.applied_opts
  rng = np.random.default_rng(4)
  inp, w = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
  want = np.einsum("ykx,ck->cyx", np.stack([inp[i:i + 3] for i in range(4)]), w)
  np.testing.assert_allclose(run(opt, "CPU", [inp.ravel(), w.ravel()], 48).reshape(4, 4, 3), want, rtol=1e-4, atol=1e-4)


def test_heuristics_matrix_vector_shares_the_vector_across_four_rows() -> None:
  # y[j] = sum_k x[k] * W[j, k]: W is read once (no register blocking), but four rows at a time share each load of x
  # and keep four independent accumulators; the contiguous reduce is then unrolled
  N, K = 64, 96
  y, x, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((N, K, N * K)))
  j, k = UOp.range(N, 0), UOp.range(K, 1, AxisType.REDUCE)
  ast = y.index(j).store((x.index(k).load() * w.index(j * K + k).load()).reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo())
  ren = Device["CPU"].renderer
  opt = optimize_kernel(ast, ren)
  if ren.vectorize_upcast:  # native vectors: no row lanes, K unrolled into lane accumulators (`_dot_products`)
    assert opt.arg.applied_opts == (Opt(OptOps.UNROLL, 0, 16),), opt.arg.applied_opts
  else:
    assert opt.arg.applied_opts[0] == Opt(OptOps.UPCAST, 0, 4), opt.arg.applied_opts
    assert any(o.op is OptOps.UNROLL for o in opt.arg.applied_opts), opt.arg.applied_opts
  rng = np.random.default_rng(5)
  xv, wv = rng.standard_normal(K).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
  np.testing.assert_allclose(run(opt, "CPU", [xv, wv.ravel()], N), wv @ xv, rtol=1e-4, atol=1e-4)


def test_heuristics_unroll_plain_sum() -> None:
  out, x = UOp(Ops.PARAM, dtypes.float.ptr(1), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(4096), arg=1)
  r = UOp.range(4096, 0, AxisType.REDUCE)
  ast = out.index(UOp.const(dtypes.index, 0)).store(x.index(r).load().reduce(r, arg=Ops.ADD)).sink(arg=KernelInfo())
  opt = optimize_kernel(ast, Device["CPU"].renderer)
  assert opt.arg.applied_opts and opt.arg.applied_opts[0].op is OptOps.UNROLL
  data = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
  got = run(ast, "CPU", [data], 1)[0]
  assert abs(got - data.astype(np.float64).sum()) < 1e-2


def test_opts_are_recorded_and_not_reapplied() -> None:
  ren = Device["CPU"].renderer
  once = apply_opts(matmul_ast(8, 8, 8), ren, (Opt(OptOps.UPCAST, 0, 2),))
  assert once.arg.applied_opts == (Opt(OptOps.UPCAST, 0, 2),)
  assert optimize_kernel(once, ren) is once


_ = itertools


def test_beam_search_finds_legal_opts_that_keep_results() -> None:
  from tiny_codegen.opt.search import beam_search
  from tiny_uop.helpers import Context
  ren = Device["CPU"].renderer
  ast = matmul_ast(16, 16, 4)
  with Context(BEAM=0):
    opts = beam_search(ast, ren, 2, compile=get_program)
  tuned = apply_opts(ast, ren, opts)  # raises if the search returned an illegal sequence
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((4, 16)).astype(np.float32)
  np.testing.assert_allclose(run(tuned, "CPU", [a, b], 256).reshape(16, 16), a @ b, rtol=1e-5, atol=1e-5)
  assert beam_search(ast, ren, 2, compile=get_program) == opts  # the second search is answered from the disk cache


def test_beam_env_compiles_through_the_search(tmp_path, monkeypatch) -> None:
  # BEAM=1 as a user sets it: compiling a kernel searches once (timing the candidates compiles them, which must not
  # start another search), and the program it gives computes the same numbers
  from tiny_uop.helpers import Context
  monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path))
  rng = np.random.default_rng(4)
  a, b = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
  with Context(BEAM=1): got = run(matmul_ast(16, 8, 4), "CPU", [a, b], 128)
  np.testing.assert_allclose(got.reshape(16, 8), a @ b, rtol=1e-5, atol=1e-5)


def test_heuristics_upcast_elementwise_transposes_and_padding_on_llvm() -> None:
  # LLVM's loop vectorizer gives up on a transpose (strided loads) or gated loads: the heuristic makes the lanes
  # explicit along the store's contiguous axis; a plain elementwise kernel is left to the loop vectorizer
  ren = Device["CPU"].renderer
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(512), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(512), arg=1)
  i, j = UOp.range(16, 0), UOp.range(32, 1)
  transpose = c.index(i * 32 + j).store(a.index(j * 16 + i).load() * 2.0).sink(arg=KernelInfo("E_16_32"))
  # a transpose: first the axis its load walks contiguously (`_transpose_block`), to the store axis' 8 lanes, so the
  # gathers become 8 vector loads of 8 for every 8 x 8 block
  assert optimize_kernel(transpose, ren).arg.applied_opts == (Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 8))
  if "define void" in (src := get_program(transpose, ren).src): assert "load <8 x float>" in src, src
  gated = c.index(i * 32 + j).store(a.index(i * 32 + j - 1, j > 0).load() + 1.0).sink(arg=KernelInfo("E_pad"))
  assert optimize_kernel(gated, ren).arg.applied_opts == (Opt(OptOps.UPCAST, 1, 8),)
  plain = c.index(i * 32 + j).store(a.index(i * 32 + j).load() + 1.0).sink(arg=KernelInfo("E_plain"))
  assert optimize_kernel(plain, ren).arg.applied_opts == ()
  x = np.arange(512, dtype=np.float32)
  np.testing.assert_array_equal(run(transpose, "CPU", [x], 512), (x.reshape(32, 16).T * 2).ravel())
  want = np.concatenate([[0.0], x[:-1]]).reshape(16, 32)
  want[:, 0] = 0
  np.testing.assert_array_equal(run(gated, "CPU", [x], 512), (want + 1).ravel())


def test_workgroup_size_limit_names_the_renderers_limit() -> None:
  # a renderer may allow fewer threads per workgroup than its per-dim local_max (max_workgroup_size)
  from tiny_codegen.renderer.opencl import OpenCLRenderer
  ren = OpenCLRenderer()
  ren.max_workgroup_size = 64
  ast = matmul_ast(16, 16, 8)
  apply_opts(ast, ren, (Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 8)))
  with pytest.raises(KernelOptError, match="128 threads per workgroup exceeds the renderer's limit 64"):
    apply_opts(ast, ren, (Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 16)))
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  assert AMDGPURenderer("gfx90a").warp_size == 64 and AMDGPURenderer("gfx1100").warp_size == 32


def test_heuristics_vector_accumulators_for_a_column_sum() -> None:
  # a streaming reduce over a strided axis (a column sum): the contiguous output axis becomes 16 independent
  # accumulators fed by one contiguous load per step (a <16 x float> vector on LLVM) instead of strided scalars
  ren = Device["CPU"].renderer
  out, x = UOp(Ops.PARAM, dtypes.float.ptr(64), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(512 * 64), arg=1)
  j, r = UOp.range(64, 0), UOp.range(512, 1, AxisType.REDUCE)
  ast = out.index(j).store(x.index(r * 64 + j).load().reduce(r, arg=Ops.ADD)).sink(arg=KernelInfo("r_colsum"))
  opt = optimize_kernel(ast, ren)
  # ... widened to all 64 columns (4 vectors: each step loads 256 contiguous bytes of one row)
  assert opt.arg.applied_opts == (Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 4)), opt.arg.applied_opts
  assert "<16 x float>" in get_program(ast, ren).src
  data = np.random.default_rng(5).standard_normal((512, 64)).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [data.ravel()], 64), data.astype(np.float64).sum(0), rtol=1e-4, atol=1e-4)
  # a row sum (the reduce axis contiguous) keeps the reduce unroll instead
  row = out.index(j).store(x.index(j * 512 + r).load().reduce(r, arg=Ops.ADD)).sink(arg=KernelInfo("r_rowsum"))
  assert [o.op for o in optimize_kernel(row, ren).arg.applied_opts] == [OptOps.UNROLL]


@pytest.mark.parametrize("dt, op", [(dtypes.float32, Ops.MAX), (dtypes.int32, Ops.ADD), (dtypes.int32, Ops.MAX)])
def test_unrolled_row_reduce_is_left_to_the_slp_vectorizer(dt, op) -> None:
  """A row max (or an integer row sum) unrolled into 16 per-lane accumulators: the reduce loop carries LLVM's
  `llvm.loop.vectorize.enable false` (clang: its pragma), so the loop vectorizer, which may reorder these reductions,
  doesn't vectorize the loop across its iterations with strided gathers; the SLP vectorizer packs the 16 contiguous
  lanes into vector loads instead (a 4096² row max ran 11.3 ms the first way, 2.1 ms the second)."""
  from tiny_codegen.compiler.clang import ClangCompiler, _is_clang
  from tiny_codegen.compiler.llvm import LLVMCompiler
  from tiny_codegen.renderer import lane_accumulator_loops
  from tiny_uop.tools import find_tool
  from tiny_codegen.renderer.cstyle import ClangRenderer
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  ren = LLVMRenderer()
  rows, cols = 64, 512
  out, x = UOp(Ops.PARAM, dt.ptr(rows), arg=0), UOp(Ops.PARAM, dt.ptr(rows * cols), arg=1)
  j, r = UOp.range(rows, 0), UOp.range(cols, 1, AxisType.REDUCE)
  ast = out.index(j).store(x.index(j * cols + r).load().reduce(r, arg=op)).sink(arg=KernelInfo("r_rowred"))
  opt = optimize_kernel(ast, ren)
  assert Opt(OptOps.UNROLL, 0, 16) in opt.arg.applied_opts, opt.arg.applied_opts
  src = get_program(ast, ren).src
  assert '!{!"llvm.loop.vectorize.enable", i1 false}' in src and ", !llvm.loop !2" in src, src
  ir = LLVMCompiler().optimized_ir(src)
  assert "gather" not in ir and "<16 x " in ir, ir
  # the outer (output) loop and a reduce with one accumulator keep the loop vectorizer
  uops = get_program(ast, ren).uops
  assert uops is not None and [u.arg[1] for u in lane_accumulator_loops(uops)] == [AxisType.REDUCE]
  one = out.index(j).store(x.index(j * cols + r).load().reduce(r, arg=op)).sink(
    arg=KernelInfo("r_rowred1", opts_to_apply=()))
  one_uops = get_program(one, ren).uops
  assert one_uops is not None and not lane_accumulator_loops(one_uops)
  # clang gets the pragma, whatever `cc` is on this machine; gcc (which has no such pragma) gets the plain loop
  clang = find_tool("clang")
  if clang is None: pytest.skip("clang not installed (pip install ziglang)")
  cren = ClangRenderer()
  cren.compiler = ClangCompiler(clang)
  cspec = get_program(ast, cren)
  assert cspec.src.count("#pragma clang loop vectorize(disable)") == 1 and \
    "#pragma clang loop vectorize(disable)\n    for (int Ridx" in cspec.src, cspec.src
  specs = [get_program(ast, ren), cspec]
  if (gcc := shutil.which("gcc")) is not None and not _is_clang([gcc]):
    gren = ClangRenderer()
    gren.compiler = ClangCompiler(gcc)
    specs.append(gspec := get_program(ast, gren))
    assert "#pragma" not in gspec.src and "for (int Ridx" in gspec.src, gspec.src
  rng = np.random.default_rng(7)
  data = (rng.standard_normal((rows, cols)) * 100).astype(dt.fmt)
  want = data.max(1) if op is Ops.MAX else data.sum(1, dtype=np.int32)
  dev = Device["CPU"]
  for spec in specs:  # the CPU device loads each one's binary (an object or a shared library)
    bufs = [Buffer("CPU", rows, dt).allocate(), Buffer("CPU", rows * cols, dt, initial_value=data.tobytes())]
    dev.get_program(spec.name, spec.lib)(*[bufs[g]._buf for g in spec.globals], global_size=spec.global_size,
                                         local_size=spec.local_size, wait=True)
    np.testing.assert_array_equal(np.frombuffer(bufs[0].as_buffer(), dtype=dt.fmt), want)


def conv2d_ast(B: int, CO: int, CI: int, H: int, W: int, K: int, channels_last: bool = False) -> UOp:
  """out[b, co, y, x] = sum_{ci, ky, kx} inp[b, ci, y + ky, x + kx] * w[co, ci, ky, kx] (a valid NCHW convolution,
  its ranges as the scheduler builds them: output b, co, y, x; reduce ci, ky, kx); `channels_last`: the weight read
  as w[ci, ky, kx, co], as tiny_tensor's conv2d copies it."""
  OH, OW = H - K + 1, W - K + 1
  sizes = (B * CO * OH * OW, B * CI * H * W, CO * CI * K * K)
  out, inp, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate(sizes))
  b, co, y, x = (UOp.range(n, i) for i, n in enumerate((B, CO, OH, OW)))
  ci, ky, kx = (UOp.range(n, 4 + i, AxisType.REDUCE) for i, n in enumerate((CI, K, K)))
  widx = ci * (K * K * CO) + ky * (K * CO) + kx * CO + co if channels_last else co * (CI * K * K) + ci * (K * K) + \
    ky * K + kx
  val = (inp.index(b * (CI * H * W) + ci * (H * W) + (y + ky) * W + x + kx).load() *
         w.index(widx).load()).reduce(ci, ky, kx, arg=Ops.ADD)
  return out.index(b * (CO * OH * OW) + co * (OH * OW) + y * OW + x).store(val).sink(arg=KernelInfo())


@pytest.mark.parametrize("W, lanes", [(12, 10), (8, 6), (22, 10), (18, 16)])
def test_heuristics_conv2d_row_is_one_vector_of_its_widest_divisor(vector_registers, W: int, lanes: int) -> None:
  # the output row (W - 2 wide for a 3x3 filter) is the native vector (16 or 8 lanes when they divide it, else its
  # widest divisor up to 16: 10 -> 10, 6 -> 6, 20 -> 10), 8 output channels share each input vector, the filter row
  # is unrolled whole; results against numpy. AVX-512's register file (AVX2's: below)
  vector_registers(32, 64)
  ren = Device["CPU"].renderer
  assert ren.vectorize_upcast, f"the CPU default renderer is expected to be LLVM, got {type(ren).__name__}"
  B, CO, CI, H, K = 2, 16, 3, 7, 3
  ast = conv2d_ast(B, CO, CI, H, W, K)
  opt = optimize_kernel(ast, ren)
  assert opt.arg.applied_opts == (Opt(OptOps.UPCAST, 3, lanes), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 2, 0)), \
    opt.arg.applied_opts
  src = get_program(opt, ren).src
  assert f"load <{lanes} x float>" in src and f"store <{lanes} x float>" in src, src
  rng = np.random.default_rng(7)
  inp = rng.standard_normal((B, CI, H, W)).astype(np.float32)
  w = rng.standard_normal((CO, CI, K, K)).astype(np.float32)
  OH, OW = H - K + 1, W - K + 1
  win = np.stack([[inp[:, :, ky:ky + OH, kx:kx + OW] for kx in range(K)] for ky in range(K)])  # ky kx b ci y x
  want = np.einsum("pqbiyx,oipq->boyx", win.astype(np.float64), w.astype(np.float64))
  got = run(opt, "CPU", [inp.ravel(), w.ravel()], B * CO * OH * OW).reshape(B, CO, OH, OW)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _vector_store(src: str, n: int) -> bool:
  """Whether LLVM source `src` stores an n-lane float vector: plainly, or (an odd n where the target masks in one
  instruction: `odd_lanes`) as one masked store of the next form's lanes under the mask of its first n."""
  from tiny_codegen.renderer.llvmir import masked_widths, odd_lanes
  comp = Device["CPU"].renderer.compiler
  if not (w := odd_lanes(masked_widths(comp.triple, comp.features), dtypes.float.vec(n))):
    return f"store <{n} x float>" in src
  mask = "<" + ", ".join(["i1 true"] * n + ["i1 false"] * (w - n)) + ">"
  return f"call void @llvm.masked.store.v{w}f32.p0(<{w} x float>" in src and f"<{w} x i1> {mask})" in src


@pytest.mark.parametrize("lanes", [5, 6, 7, 12])
def test_odd_width_vector_upcast_keeps_results(lanes: int) -> None:
  # an UPCAST of any width from 4 to 16 lanes becomes one native vector on LLVM (widened by LLVM to a register):
  # a gated, shifted load and a contiguous store over it
  ren = Device["CPU"].renderer
  assert ren.vectorize_upcast, f"the CPU default renderer is expected to be LLVM, got {type(ren).__name__}"
  R, C = 3, lanes * 4
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(R * C), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(R * C), arg=1)
  i, j = UOp.range(R, 0), UOp.range(C, 1)
  ast = c.index(i * C + j).store(a.index(i * C + j).load() * 3.0 + a.index(i * C + j - 1, j > 0).load()) \
    .sink(arg=KernelInfo(opts_to_apply=(Opt(OptOps.UPCAST, 1, lanes),)))
  src = get_program(ast, ren).src
  assert _vector_store(src, lanes), src
  x = np.random.default_rng(8).standard_normal((R, C)).astype(np.float32)
  want = x * 3.0 + np.concatenate([np.zeros((R, 1), np.float32), x[:, :-1]], axis=1)
  np.testing.assert_allclose(run(ast, "CPU", [x.ravel()], R * C).reshape(R, C), want, rtol=1e-6, atol=1e-6)
  # with no load contiguous along it (a padding: only the gated, shifted load) an odd width stays scalar lanes (a
  # vector of gathers is slower); 4/8/16 lanes are still vectors
  pad = c.index(i * C + j).store(a.index(i * C + j - 1, j > 0).load() + 1.0)
  for n in (lanes, 4):
    src = get_program(pad.sink(arg=KernelInfo(opts_to_apply=(Opt(OptOps.UPCAST, 1, n),))), ren).src
    assert _vector_store(src, n) == (n == 4), src
  got = run(pad.sink(arg=KernelInfo(opts_to_apply=(Opt(OptOps.UPCAST, 1, lanes),))), "CPU", [x.ravel()], R * C)
  want = np.concatenate([np.zeros((R, 1), np.float32), x[:, :-1]], axis=1) + 1.0
  np.testing.assert_array_equal(got.reshape(R, C), want)


def test_block_amounts_prefer_the_widest_divisor_to_two() -> None:
  from tiny_codegen.opt.heuristic import _block_amounts
  assert _block_amounts(10, 8) == (8, 4, 5, 2)  # tried in order: 5 divides 10 (was 2, leaving a 2 x 2 block)
  assert _block_amounts(6, 8) == (6, 8, 4, 2) and _block_amounts(24, 8)[0] == 8
  assert _block_amounts(20, 8)[:2] == (8, 4)  # 4 first: the next axis still gets 2 (4 x 2 = 8 accumulators)
  assert _block_amounts(10, 2) == (2,) and _block_amounts(3, 2) == (2,)  # room for 2 more: 3 can't be blocked


def test_channels_last_conv_on_a_10_wide_row_blocks_5_pixels(vector_registers) -> None:
  # the weight read channels-last (w[ci, ky, kx, co]): the vector is 16 output channels, reused across the pixels of
  # the 10-wide output row, 5 of which are blocked (8 and 4 don't divide 10; 2 x 2 left the FMA chains too few);
  # results vs numpy. AVX-512's register file (AVX2's: below)
  vector_registers(32, 64)
  ren = Device["CPU"].renderer
  assert ren.vectorize_upcast, f"the CPU default renderer is expected to be LLVM, got {type(ren).__name__}"
  B, CO, CI, H, W, K = 2, 32, 4, 12, 12, 3
  OH, OW = H - K + 1, W - K + 1
  opt = optimize_kernel(conv2d_ast(B, CO, CI, H, W, K, channels_last=True), ren)
  # and the 32 channels as two vectors (`_widen_conv_channels`: 2 x 5 accumulators fit half of AVX-512's registers)
  assert opt.arg.applied_opts == (Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 3, 5), Opt(OptOps.UPCAST, 1, 2),
                                  Opt(OptOps.UNROLL, 2, 0)), opt.arg.applied_opts
  assert "load <16 x float>" in get_program(opt, ren).src
  rng = np.random.default_rng(9)
  xs = rng.standard_normal((B, CI, H, W)).astype(np.float32)
  ws = rng.standard_normal((CI, K, K, CO)).astype(np.float32)
  win = np.stack([[xs[:, :, ky:ky + OH, kx:kx + OW] for kx in range(K)] for ky in range(K)])  # ky kx b ci y x
  want = np.einsum("pqbiyx,ipqo->boyx", win.astype(np.float64), ws.astype(np.float64))
  got = run(opt, "CPU", [xs.ravel(), ws.ravel()], B * CO * OH * OW).reshape(B, CO, OH, OW)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("args, want", [
  # NCHW weights, a 20-wide output row: 10 lanes take two ymm registers, so 4 channels (8 registers), not 8
  ((2, 16, 4, 7, 24, 5, False), ((3, 10), (1, 4))),
  # channels-last: the vector is one register of 8 channels (not 16 in two), blocked by 4 pixels x 2 rows; by 5
  # pixels of a 10-wide row; 6 of a 6-wide one, whole
  ((2, 32, 4, 8, 24, 5, True), ((1, 8), (3, 4), (2, 2))),
  ((2, 32, 4, 12, 12, 3, True), ((1, 8), (3, 5))),
  ((2, 32, 4, 8, 8, 3, True), ((1, 8), (3, 6))),
])
def test_heuristics_conv_blocks_fit_avx2_registers(vector_registers, args, want) -> None:
  """AVX2 (16 ymm): a conv's accumulators take at most half the registers (`ACC_REGISTER_SHARE`), counting one that
  spans two registers twice; AVX-512's blocks spilled there (the MNIST step's 5x5 conv: 119 stack accesses in its
  loop, 37 -> 56 GFLOPS on one znver3 thread). Results vs numpy."""
  vector_registers(16, 32)
  ren = Device["CPU"].renderer
  B, CO, CI, H, W, K, cl = args
  opt = optimize_kernel(conv2d_ast(*args), ren)
  assert opt.arg.applied_opts == tuple(Opt(OptOps.UPCAST, a, n) for a, n in want) + (Opt(OptOps.UNROLL, 2, 0),), \
    opt.arg.applied_opts
  OH, OW = H - K + 1, W - K + 1
  rng = np.random.default_rng(11)
  xs = rng.standard_normal((B, CI, H, W)).astype(np.float32)
  ws = rng.standard_normal((CI, K, K, CO) if cl else (CO, CI, K, K)).astype(np.float32)
  win = np.stack([[xs[:, :, ky:ky + OH, kx:kx + OW] for kx in range(K)] for ky in range(K)])  # ky kx b ci y x
  want_out = np.einsum("pqbiyx,ipqo->boyx" if cl else "pqbiyx,oipq->boyx", win.astype(np.float64),
                       ws.astype(np.float64))
  got = run(opt, "CPU", [xs.ravel(), ws.ravel()], B * CO * OH * OW).reshape(B, CO, OH, OW)
  np.testing.assert_allclose(got, want_out, rtol=1e-4, atol=1e-4)


def test_unroll_budget_is_per_vector_on_a_vectorizing_renderer() -> None:
  """A row sum of exp2 (a softmax's denominator) over 1M+ elements: on LLVM, whose unrolled lanes become vectors, the
  reduce unrolls by 16 (its exp2 is decomposed into vector ALU code); on C, whose lanes stay scalars, the exp2 body is
  over the budget."""
  from tiny_codegen.renderer.cstyle import ClangRenderer
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  from tiny_codegen.opt.heuristic_common import VECTOR_UNROLL_MIN_ITERS
  def expsum(rows: int, cols: int) -> UOp:
    out, x = UOp(Ops.PARAM, dtypes.float.ptr(rows), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(rows * cols), arg=1)
    j, r = UOp.range(rows, 0), UOp.range(cols, 1, AxisType.REDUCE)
    return out.index(j).store(x.index(j * cols + r).load().exp2().reduce(r, arg=Ops.ADD)).sink(
      arg=KernelInfo(f"r_expsum_{rows}"))
  unrolled = lambda ast, ren: [o for o in optimize_kernel(ast, ren).arg.applied_opts if o.op is OptOps.UNROLL]
  big = expsum(VECTOR_UNROLL_MIN_ITERS // 256, 256)
  assert unrolled(big, LLVMRenderer()) == [Opt(OptOps.UNROLL, 0, 16)] and not unrolled(big, ClangRenderer())
  # a small kernel's few µs of work would not repay compiling 16 lanes of exp2
  rows, cols = 32, 256
  ast = expsum(rows, cols)
  assert not unrolled(ast, LLVMRenderer())
  data = np.random.default_rng(9).uniform(-4, 4, (rows, cols)).astype(np.float32)
  got = run(ast, "CPU", [data.ravel()], rows)
  np.testing.assert_allclose(got, np.exp2(data.astype(np.float64)).sum(1), rtol=2e-6)


@pytest.mark.parametrize("k, lanes", [(2048, 8), (768, 16)])
def test_register_block_keeps_aliased_rows_under_the_l1_ways(k, lanes) -> None:
  """x @ W.T (nn.Linear's layout: both operands contiguous along K): the output axis over W's rows is blocked 16 wide
  when W's rows are 3 KB apart, but 8 wide when they are 8 KB apart (a multiple of 4 KB: every row in the same L1
  sets), where 16 x 8 rows ran 2.2-3.1 ms and 8 x 8 0.97-1.6 ms."""
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  m, n = 32, 64
  out = UOp(Ops.PARAM, dtypes.float.ptr(m * n), arg=0)
  x, w = UOp(Ops.PARAM, dtypes.float.ptr(m * k), arg=1), UOp(Ops.PARAM, dtypes.float.ptr(n * k), arg=2)
  t, o, r = UOp.range(m, 0), UOp.range(n, 1), UOp.range(k, 2, AxisType.REDUCE)
  prod_ = x.index(t * k + r).load() * w.index(o * k + r).load()
  ast = out.index(t * n + o).store(prod_.reduce(r, arg=Ops.ADD)).sink(arg=KernelInfo(f"r_linear_{k}"))
  opts = optimize_kernel(ast, LLVMRenderer()).arg.applied_opts
  assert opts[0] == Opt(OptOps.UPCAST, 1, lanes), opts
  rng = np.random.default_rng(11)
  xs, ws = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
  np.testing.assert_allclose(run(ast, "CPU", [xs.ravel(), ws.ravel()], m * n), (xs @ ws.T).ravel(), rtol=1e-4,
                             atol=1e-3)


def depthwise_ast(C: int, H: int, W: int, K: int, S: int = 1) -> UOp:
  """out[c, y, x] = sum_{ky, kx} inp[c, S*y + ky - P, S*x + kx - P] * w[ky, kx, c], P = K // 2 (a depthwise conv with
  stride S and 'same' padding, the padding as gated loads, the weight channels-last as tiny_tensor's conv2d copies
  it; ranges as the scheduler builds them: output c, y, x; reduce ky, kx; the output (H/S, W/S))."""
  P, OH, OW = K // 2, H // S, W // S
  out, inp, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((C * OH * OW, C * H * W, K * K * C)))
  c, y, x = (UOp.range(n, i) for i, n in enumerate((C, OH, OW)))
  ky, kx = (UOp.range(K, 3 + i, AxisType.REDUCE) for i in range(2))
  iy, ix = y * S + ky - P, x * S + kx - P
  valid = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
  val = (inp.index(c * (H * W) + iy * W + ix, valid).load() * w.index(ky * (K * C) + kx * C + c).load()) \
    .reduce(ky, kx, arg=Ops.ADD)
  return out.index(c * (OH * OW) + y * OW + x).store(val).sink(arg=KernelInfo())


@pytest.mark.parametrize("regs, W, S, lanes, ch", [((32, 64), 14, 1, 14, 6), ((32, 64), 7, 1, 7, 6),
                                                   ((32, 64), 32, 1, 16, 3), ((16, 32), 32, 1, 8, 3),
                                                   ((16, 32), 14, 1, 14, 3), ((32, 64), 17, 1, 0, 0),
                                                   ((32, 64), 14, 2, 7, 6), ((32, 64), 32, 2, 16, 6),
                                                   ((32, 64), 34, 2, 0, 0), ((32, 64), 56, 1, 14, 3),
                                                   ((32, 64), 40, 1, 10, 3), ((32, 64), 64, 2, 16, 3)])
def test_depthwise_conv_row_is_one_vector(vector_registers, regs: tuple[int, int], W: int, S: int, lanes: int,
                                          ch: int) -> None:
  # a depthwise conv shares no operand across channels (no register block) and reads each window element once per
  # tap: its output row, which the input's window walks contiguously (or every other element: stride 2), is one
  # native vector (its widest divisor up to 16: a 14-wide row whole, a 56-wide one 14 lanes (not 8), a 40-wide one
  # 10; a 32-wide one 16 lanes on AVX-512, one 8-lane register on AVX2; a prime 17 (also 34 at stride 2): scalar),
  # the filter row unrolled; results against torch. A
  # stride-2 row's taps are wide loads and shuffles (the expander's strided lanes).
  # A whole row then gets `ch` channels (`_window_channels`: the largest divisor of 6 up to fma_chains, 8,
  # within half the registers: AVX2's 14 lanes take 2 ymm each, 16 / 2 / 2 = 4 -> 3), which the expander makes the
  # vector where the channels-last taps score above the row (stride 1, and a 7-lane stride-2 row), else the row
  # stays the vector, one a channel (a 16-lane stride-2 row: its taps wide loads and shuffles). A row split in
  # several vectors (32 as 2 x 16, AVX2's 4 x 8, 56 as 4 x 14, 40 as 4 x 10, 64 at stride 2 as 2 x 16) gets 3
  # (`SPLIT_ROW_CHANNELS`: fewer than the expander's narrowest vector), so its vector stays the row: 3 vector
  # accumulators, each channel its own chain
  pytest.importorskip("torch")
  vector_registers(*regs)
  ren = Device["CPU"].renderer
  assert ren.vectorize_upcast, f"the CPU default renderer is expected to be LLVM, got {type(ren).__name__}"
  C, H, K = 6, 6, 5
  opt = optimize_kernel(depthwise_ast(C, H, W, K, S), ren)
  want_opts = ((Opt(OptOps.UPCAST, 2, lanes),) if lanes else ()) + ((Opt(OptOps.UPCAST, 0, ch),) if ch else ()) + \
    (Opt(OptOps.UNROLL, 1, 0),)
  assert opt.arg.applied_opts == want_opts, opt.arg.applied_opts
  src = get_program(opt, ren).src
  # with channels, either is the vector: AVX-512's 8 channels (the taps' contiguous load), AVX2's 14-lane row
  if lanes and S == 1: assert f"store <{lanes} x float>" in src or (ch and f"<{ch} x float>" in src), src
  if lanes and lanes < W // S:  # a split row: the row is the vector, 3 accumulators of it, no channel vector
    assert src.count(f"alloca [1 x <{lanes} x float>]") == ch and f"<{ch} x float>" not in src, src
  if lanes >= 8 and S == 2: assert "shufflevector" in src, src  # the taps: wide loads and shuffles
  _check_depthwise(opt, C, H, W, K, S, 3)


def _check_depthwise(opt: Any, C: int, H: int, W: int, K: int, S: int, seed: int) -> None:
  """Run the optimized `depthwise_ast(C, H, W, K, S)` on the CPU against torch's grouped conv (padding K // 2)."""
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(seed)
  inp = rng.standard_normal((C, H, W)).astype(np.float32)
  w = rng.standard_normal((C, 1, K, K)).astype(np.float32)
  w_cl = np.ascontiguousarray(w[:, 0].transpose(1, 2, 0))
  want = torch.nn.functional.conv2d(torch.from_numpy(inp)[None], torch.from_numpy(w), groups=C, padding=K // 2,
                                    stride=S)[0]
  got = run(opt, "CPU", [inp.ravel(), w_cl.ravel()], C * (H // S) * (W // S)).reshape(C, H // S, W // S)
  np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("W, S, lanes", [(14, 1, 14), (7, 1, 7), (14, 2, 7), (28, 2, 14)])
@pytest.mark.parametrize("K", [3, 5])
def test_whole_row_channels_by_filter_taps(vector_registers, W: int, S: int, lanes: int, K: int) -> None:
  # a whole row (`_window_vector`) with a filter row of GATHER_TAPS_MIN taps or more (5x5) makes its channels the
  # vector (6 on AVX-512: each pixel an accumulator, its input gathered a lane at a time); with fewer (3x3) the row
  # stays the vector, SPLIT_ROW_CHANNELS (3) channels of it, each tap one vector load, nothing gathered; results
  # against torch
  from tiny_codegen.opt.heuristic import GATHER_TAPS_MIN, SPLIT_ROW_CHANNELS
  pytest.importorskip("torch")
  vector_registers(32, 64)
  ren = Device["CPU"].renderer
  C, H = 6, 6
  opt = optimize_kernel(depthwise_ast(C, H, W, K, S), ren)
  ch = 6 if K >= GATHER_TAPS_MIN else SPLIT_ROW_CHANNELS
  assert opt.arg.applied_opts == (Opt(OptOps.UPCAST, 2, lanes), Opt(OptOps.UPCAST, 0, ch), Opt(OptOps.UNROLL, 1, 0)), \
    opt.arg.applied_opts
  src = get_program(opt, ren).src
  if K < GATHER_TAPS_MIN:  # the row the vector: one accumulator of it a channel, no channel vector
    assert src.count(f"alloca [1 x <{lanes} x float>]") == ch and f"<{ch} x float>" not in src, src
  elif S == 1: assert f"<{ch} x float>" in src, src  # (at stride 2 the expander may keep the row the vector)
  _check_depthwise(opt, C, H, W, K, S, K + W)


def padded_conv2d_ast(CO: int, CI: int, H: int, W: int, K: int) -> UOp:
  """out[co, y, x] = sum_{ci, ky, kx} inp[ci, y + ky - P, x + kx - P] * w[ci, ky, kx, co], P = K // 2 (a 'same'
  conv, batch 1, the padding as gated loads and the weight channels-last, as an ONNX Conv reaches the kernel)."""
  P = K // 2
  out, inp, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((CO * H * W, CI * H * W,
                                                                                     CI * K * K * CO)))
  co, y, x = (UOp.range(n, i) for i, n in enumerate((CO, H, W)))
  ci, ky, kx = (UOp.range(n, 3 + i, AxisType.REDUCE) for i, n in enumerate((CI, K, K)))
  iy, ix = y + ky - P, x + kx - P
  valid = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
  val = (inp.index(ci * (H * W) + iy * W + ix, valid).load() *
         w.index(ci * (K * K * CO) + ky * (K * CO) + kx * CO + co).load()).reduce(ci, ky, kx, arg=Ops.ADD)
  return out.index(co * (H * W) + y * W + x).store(val).sink(arg=KernelInfo())


@pytest.mark.parametrize("regs, W, CO, want", [
  # resnet18's 28x28 maps: 7 pixels, not 4 pixels x 2 rows; then a second vector of channels (2 x 7 accumulators)
  ((32, 64), 28, 32, ((0, 16), (2, 7), (0, 2))),
  ((32, 64), 56, 32, ((0, 16), (2, 8), (0, 2))),
  ((32, 64), 14, 64, ((0, 16), (2, 7), (0, 2))),
  ((32, 64), 14, 48, ((0, 16), (2, 7))),  # 3 vectors of channels: 2 doesn't divide them
  ((16, 32), 28, 32, ((0, 8), (2, 7))),   # AVX2: one ymm of 8 channels, the same 7 pixels (2 x 7 > 8 of 16 ymm)
  ((16, 32), 4, 32, ((0, 8), (2, 4), (0, 2))),  # a 4-wide row: 2 x 4 accumulators fit AVX2's share
])
def test_padded_conv_blocks_one_window_axis(vector_registers, regs: tuple[int, int], W: int, CO: int,
                                            want: tuple) -> None:
  """A padded conv (channels-last weight, so a vector of output channels) blocks only its output row's pixels, by
  their widest divisor that fits the accumulators, not rows as well: a second padded window axis' lanes each carry
  their own padding gates (`_padded_window`; resnet18's 128 -> 128 3x3 on 28x28, one AVX-512 thread: 4 pixels x 2
  rows 62 GFLOPS, 7 pixels 120); then the channels by a second vector where the accumulators fit half the
  registers (`_widen_conv_channels`: 16 x 7 -> 32 x 7, 2166 -> 1893-1955 us there). Results against torch."""
  vector_registers(*regs)
  CI, H, K = 4, 6, 3
  ast = padded_conv2d_ast(CO, CI, H, W, K)
  opt = optimize_kernel(ast, Device["CPU"].renderer)
  assert opt.arg.applied_opts == tuple(Opt(OptOps.UPCAST, a, n) for a, n in want) + (Opt(OptOps.UNROLL, 2, 0),), \
    opt.arg.applied_opts
  _check_padded_conv(opt, CO, CI, H, W, K, seed=12)


def _check_padded_conv(opt, CO: int, CI: int, H: int, W: int, K: int, seed: int) -> None:
  """Run the optimized `padded_conv2d_ast` kernel `opt` (channels-last weights) against torch's conv2d."""
  import torch
  rng = np.random.default_rng(seed)
  xs = rng.standard_normal((CI, H, W)).astype(np.float32)
  ws = rng.standard_normal((CO, CI, K, K)).astype(np.float32)
  got = run(opt, "CPU", [xs.ravel(), ws.transpose(1, 2, 3, 0).ravel()], CO * H * W).reshape(CO, H, W)
  want_out = torch.nn.functional.conv2d(torch.from_numpy(xs)[None], torch.from_numpy(ws), padding=K // 2)[0]
  np.testing.assert_allclose(got, want_out.numpy(), rtol=1e-4, atol=1e-4)


def _fadds_of_products(src: str) -> int:
  """How many `fadd`s of the LLVM IR `src` add two `fmul` results (a product summed with a product, not into an
  accumulator)."""
  import re
  muls = set(re.findall(r"(%\w+) = fmul", src))
  return sum(a in muls and b in muls for a, b in re.findall(r"= fadd \w* ?<?[^%]*(%\w+), (%\w+)", src))


@pytest.mark.parametrize("regs, W, chained", [((32, 64), 28, True), ((16, 32), 28, False)])
def test_conv_filter_row_lanes_chain_into_the_accumulators(vector_registers, regs: tuple[int, int], W: int,
                                                           chained: bool) -> None:
  """A conv's unrolled filter row (3 taps) is added to each accumulator tap by tap, acc + t0 + t1 + t2, so every tap
  is one FMA into it (`lower_reduces`' chains), where acc + (t0 + t1 + t2) took a MUL, two FMAs and an ADD per 3
  taps: resnet18's 3x3 convs, one AVX-512 thread, 2046-2154 -> 1474-1510 us. Only with accumulators enough for the
  FMA ports (`Machine.fma_units` x FMA_LATENCY = 8): AVX2's 8 channels x 7 pixels block has 7, whose chains would
  then be three FMAs deep an iteration. Results against torch."""
  vector_registers(*regs)
  CO, CI, H, K = 32, 4, 5, 3
  opt = optimize_kernel(padded_conv2d_ast(CO, CI, H, W, K), Device["CPU"].renderer)
  assert Opt(OptOps.UNROLL, 2, 0) in opt.arg.applied_opts, opt.arg.applied_opts
  src = get_program(opt, Device["CPU"].renderer).src
  assert (_fadds_of_products(src) == 0) == chained, src
  _check_padded_conv(opt, CO, CI, H, W, K, seed=15)


@pytest.mark.parametrize("CI, widened", [(4, True), (16, False), (32, True)])
def test_conv_channels_widened_unless_that_spills_its_weight_strip_from_l1(vector_registers, CI: int,
                                                                            widened: bool) -> None:
  """The second vector of output channels (`_widen_conv_channels`) is left off where the weight strip a register
  block reads over its reduce fits half the L1d and twice it would not (the pinned machine's 32 KB L1d: 16 input
  channels x 9 taps x 16 channels x 4 bytes = 9 KB, 18 KB widened; a split reduce's chunk of resnet18's 512 -> 512
  conv ran 14% slower widened). 4 input channels (2 KB -> 4 KB) and 32 (18 KB, past half already) are widened.
  Results against torch."""
  vector_registers(32, 64)
  CO, H, W, K = 32, 5, 14, 3
  opt = optimize_kernel(padded_conv2d_ast(CO, CI, H, W, K), Device["CPU"].renderer)
  want = ((0, 16), (2, 7)) + (((0, 2),) if widened else ())
  assert opt.arg.applied_opts == tuple(Opt(OptOps.UPCAST, a, n) for a, n in want) + (Opt(OptOps.UNROLL, 2, 0),), \
    opt.arg.applied_opts
  _check_padded_conv(opt, CO, CI, H, W, K, seed=14)


@pytest.mark.parametrize("regs, W, lanes", [((32, 64), 112, 16), ((32, 64), 56, 14), ((32, 64), 28, 14),
                                            ((16, 32), 56, 8), ((16, 32), 28, 7), ((32, 64), 3, 0)])
def test_elementwise_sigmoid_is_one_native_vector(vector_registers, regs: tuple[int, int], W: int, lanes: int) -> None:
  """A standalone sigmoid (efficientnet_b0's SiLU halves): its exp2 is one vector register of lanes along the row
  (the row's widest divisor up to the register's lanes: 16 floats on AVX-512, 8 on AVX2; none under 4), where
  LLVM's loop vectorizer left a scalar remainder per row; a relu beside it keeps no opts (vectorized by LLVM).
  Results vs torch."""
  import torch
  vector_registers(*regs)
  C = 3
  out, inp = (UOp(Ops.PARAM, dtypes.float.ptr(C * W), arg=i) for i in range(2))
  c, x = UOp.range(C, 0), UOp.range(W, 1)
  v = inp.index(c * W + x).load()
  sig = ((v * -1.4426950408889634).exp2() + 1.0).reciprocal()
  opt = optimize_kernel(out.index(c * W + x).store(sig).sink(arg=KernelInfo()), Device["CPU"].renderer)
  assert opt.arg.applied_opts == ((Opt(OptOps.UPCAST, 1, lanes),) if lanes else ()), opt.arg.applied_opts
  relu = optimize_kernel(out.index(c * W + x).store(v.maximum(0.0)).sink(arg=KernelInfo()), Device["CPU"].renderer)
  assert relu.arg.applied_opts == (), relu.arg.applied_opts
  xs = np.random.default_rng(13).uniform(-20, 20, (C, W)).astype(np.float32)
  np.testing.assert_allclose(run(opt, "CPU", [xs.ravel()], C * W).reshape(C, W),
                             torch.from_numpy(xs).sigmoid().numpy(), rtol=1e-5, atol=1e-6)


def gemm_bias_ast(m: int, n: int, k: int, trans_b: bool, bias: bool = True) -> UOp:
  """out[i, j] = sum_k x[i, k] * W[., .] (+ b[j]): an ONNX Gemm with its bias, W (n, k) with `trans_b` else (k, n)."""
  out, x, w, b = (UOp(Ops.PARAM, dtypes.float.ptr(s), arg=a) for a, s in enumerate((m * n, m * k, n * k, n)))
  i, j, r = UOp.range(m, 0), UOp.range(n, 1), UOp.range(k, 2, AxisType.REDUCE)
  wv = w.index(j * k + r).load() if trans_b else w.index(r * n + j).load()
  val = (x.index(i * k + r).load() * wv).reduce(r, arg=Ops.ADD)
  if bias: val = val + b.index(j).load()
  return out.index(i * n + j).store(val).sink(arg=KernelInfo())


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("n,k", [(37, 48), (1000, 64), (37, 51)])
@pytest.mark.parametrize("trans_b", [True, False])
def test_heuristics_small_m_gemm_with_bias(m: int, n: int, k: int, trans_b: bool) -> None:
  # a CNN's classifier head (issue #39): a few rows times W plus a bias. With W (N, K) (Gemm transB) and K a multiple
  # of the vector, the bias (loaded after the reduce) must not keep the product from `_dot_products`' K lanes: it had
  # sent it to four gathered lanes of N, 2x slower than the same product without its bias
  ren = Device["CPU"].renderer
  opt = optimize_kernel(gemm_bias_ast(m, n, k, trans_b), ren)
  want_opts = optimize_kernel(gemm_bias_ast(m, n, k, trans_b, bias=False), ren).arg.applied_opts  # no bias
  if trans_b and ren.vectorize_upcast and not any(o.op is OptOps.UPCAST for o in want_opts):  # K's lanes alone
    assert opt.arg.applied_opts == want_opts, (opt.arg.applied_opts, want_opts)
  rng = np.random.default_rng(m * 7 + n + k)
  xs, bs = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  ws = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
  want = xs.astype(np.float64) @ (ws.T if trans_b else ws).astype(np.float64) + bs
  got = run(opt, "CPU", [xs.ravel(), ws.ravel(), bs], m * n).reshape(m, n)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

def max_pool_ast(C: int, H: int, W: int, K: int, S: int) -> UOp:
  """out[c, y, x] = max_{ky, kx} inp[c, S*y + ky - P, S*x + kx - P], P = K // 2, -inf where the window leaves the
  input (a max pool with padding as tiny_tensor's pool reaches the kernel: gated loads, the fill as their else;
  output ((H + 2P - K) // S + 1, likewise for W))."""
  P, OH, OW = K // 2, (H + 2 * (K // 2) - K) // S + 1, (W + 2 * (K // 2) - K) // S + 1
  out, inp = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((C * OH * OW, C * H * W)))
  c, y, x = (UOp.range(n, i) for i, n in enumerate((C, OH, OW)))
  ky, kx = (UOp.range(K, 3 + i, AxisType.REDUCE) for i in range(2))
  iy, ix = y * S + ky - P, x * S + kx - P
  valid = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
  val = valid.where(inp.index(c * (H * W) + iy * W + ix, valid).load(), float("-inf")).reduce(ky, kx, arg=Ops.MAX)
  return out.index(c * (OH * OW) + y * OW + x).store(val).sink(arg=KernelInfo())


@pytest.mark.parametrize("W, S, lanes", [(56, 1, 14), (112, 2, 14), (28, 2, 14), (29, 2, 15)])
def test_max_pool_stride2_row_is_a_window_vector(vector_registers, W: int, S: int, lanes: int) -> None:
  # a max pool's stride-2 output row is a window vector like a stride-1 one: each tap one wide load (masked at the
  # padding) and a shuffle of every other element (it stayed scalar while those lanes were gathered one by one, 3.8x
  # slower than the rolled window). Values against torch, NaN and -inf inputs included (a NaN in a window wins, as
  # torch's), the last row's last vector ending at the input's end (W = 29). Its output rows are then blocked by the
  # largest divisor up to the machine's `fma_chains` (each row one zmm accumulator here: 32 registers, half of them
  # for accumulators), and the whole window unrolled (`_pool_rows`: 9 output rows at stride 1 -> 3, 5 at 2 -> 5)
  torch = pytest.importorskip("torch")
  vector_registers(32, 64)
  ren = Device["CPU"].renderer
  C, H, K = 3, 9, 3
  opt = optimize_kernel(max_pool_ast(C, H, W, K, S), ren)
  OH, chains = (H + 2 * (K // 2) - K) // S + 1, min(fma_chains(machine_of(ren)), 16)
  rows = next(a for a in range(min(OH, chains), 0, -1) if OH % a == 0)
  want_opts = (Opt(OptOps.UPCAST, 2, lanes), *([Opt(OptOps.UPCAST, 1, rows)] if rows > 1 else []),
               Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.UNROLL, 0, 0))
  assert opt.arg.applied_opts == want_opts, (opt.arg.applied_opts, want_opts)
  rng = np.random.default_rng(5)
  inp = rng.standard_normal((C, H, W)).astype(np.float32)
  inp[0, 2, 3], inp[1, 4, 0], inp[2, :, W - 1] = np.nan, -np.inf, -np.inf
  want = torch.nn.functional.max_pool2d(torch.from_numpy(inp)[None], K, S, padding=K // 2)[0].numpy()
  got = run(opt, "CPU", [inp.ravel()], want.size).reshape(want.shape)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("regs, CO, W, want", [
  # AVX-512: 16 pixels of the 112-wide row x 8 output channels (was 2 x 16 channels x 8 pixels, stored transposed)
  ((32, 64), 96, 112, ((3, 16), (1, 8))),
  # AVX2: 8 pixels x 4 channels, then the row's vector widened by 2 (8 accumulators: half of its 16 ymm)
  ((16, 32), 32, 32, ((3, 8), (1, 4), (3, 2))),
])
def test_pointwise_conv_vector_is_the_stored_row(vector_registers, regs: tuple[int, int], CO: int, W: int,
                                                 want: tuple) -> None:
  """A 1x1 conv on NCHW maps with its weight channels-last: both operands walk an output axis contiguously (the input
  the pixels, the weight the output channels). The vector is the output row the store walks (`_store_vector_axis`),
  so each accumulator is one contiguous vector store (no transposing shuffles in the epilogue); results vs numpy."""
  vector_registers(*regs)
  ren = Device["CPU"].renderer
  B, CI, H = 1, 16, 2
  out, inp, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((B * CO * H * W, B * CI * H * W,
                                                                                    CI * CO)))
  b, co, y, x = (UOp.range(n, i) for i, n in enumerate((B, CO, H, W)))
  ci = UOp.range(CI, 4, AxisType.REDUCE)
  val = (inp.index(b * (CI * H * W) + ci * (H * W) + y * W + x).load() * w.index(ci * CO + co).load()).reduce(ci,
                                                                                                    arg=Ops.ADD)
  ast = out.index(b * (CO * H * W) + co * (H * W) + y * W + x).store(val).sink(arg=KernelInfo())
  opt = optimize_kernel(ast, ren)
  assert opt.arg.applied_opts[:len(want)] == tuple(Opt(OptOps.UPCAST, a, n) for a, n in want), opt.arg.applied_opts
  lanes = want[0][1]
  src = get_program(opt, ren).src
  assert f"store <{lanes} x float>" in src and "shufflevector" not in src, src
  rng = np.random.default_rng(13)
  xs = rng.standard_normal((B, CI, H, W)).astype(np.float32)
  ws = rng.standard_normal((CI, CO)).astype(np.float32)
  want_out = np.einsum("bihw,io->bohw", xs.astype(np.float64), ws.astype(np.float64))
  got = run(opt, "CPU", [xs.ravel(), ws.ravel()], B * CO * H * W).reshape(B, CO, H, W)
  np.testing.assert_allclose(got, want_out, rtol=1e-4, atol=1e-4)
