"""`tiny_codegen.matvec_ir`: the prefetching float32 matvec kernel against numpy (odd shapes, 1-3 row shares, K's
tail after the unrolled loop), its prefetch distance from the machine model, the registered AST `tiny_tensor.llm`
hands it, and the fallback where it doesn't run (CHECK_OOB, another renderer, a K its vectors don't divide)."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from tiny_codegen import matvec_ir
from tiny_codegen.compiler.llvm import LLVMCompiler


@pytest.mark.parametrize("o, k, threads, lanes, unroll, rows", [(8, 32, 1, 16, 2, 1), (7, 48, 1, 16, 2, 1),
                                                                (13, 80, 1, 8, 3, 1), (12, 96, 3, 16, 2, 4),
                                                                (6, 16, 2, 16, 4, 1), (10, 24, 2, 8, 1, 2),
                                                                (256, 768, 2, 16, 2, 1), (256, 768, 2, 16, 2, 4)])
def test_kernel_matches_numpy(o: int, k: int, threads: int, lanes: int, unroll: int, rows: int) -> None:
  from kernel_runner import load_fn
  rng = np.random.default_rng(o * 1000 + k)
  w, x = rng.standard_normal((o, k), dtype=np.float32), rng.standard_normal(k, dtype=np.float32)
  out = np.full(o, np.nan, np.float32)
  order = ("w", "out", "x") if threads == 2 else ("out", "w", "x")
  src = matvec_ir.f32_matvec_ir(o, k, threads, name="f32mv", lanes=lanes, unroll=unroll, ahead=256, order=order,
                                rows=rows)
  assert src.count(f"call <{lanes} x float> @llvm.fma") >= matvec_ir.group_rows(o // threads, rows) * unroll
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int32)(load_fn("f32mv", LLVMCompiler().compile(src)))
  ptrs = {"out": out.ctypes.data, "w": w.ctypes.data, "x": x.ctypes.data}
  for core in range(threads): fn(*[ptrs[a] for a in order], core)
  exact = w.astype(np.float64) @ x.astype(np.float64)
  bound = (k + 8) * 2.0 ** -23 * (np.abs(w).astype(np.float64) @ np.abs(x).astype(np.float64))
  assert np.all(np.abs(out - exact) <= bound), float(np.max(np.abs(out - exact) - bound))


@pytest.mark.parametrize("o, k, threads, rows", [(8, 64, 1, 4), (6, 48, 3, 2), (5, 32, 1, 1)])
def test_ir_prefetches_every_line_of_a_step_ahead(o: int, k: int, threads: int, rows: int) -> None:
  """Each row prefetches the lines its K step reads, `ahead` bytes further on (a decode step streams its weights:
  without it the 2048x768 kernel ran 380-703 us, with half the L1d ahead 336-476; bench/README.md, issue #39)."""
  src = matvec_ir.f32_matvec_ir(o, k, threads, lanes=16, unroll=2, ahead=1024, rows=4)
  got = sorted(int(m) for m in re.findall(r"getelementptr i8, ptr %wb0, i64 (\d+)", src))
  assert got == [1024, 1024 + 64]  # 2 vectors of 16 floats: two lines a step
  assert src.count("call void @llvm.prefetch.p0(") == rows * 2
  assert "@llvm.prefetch.p0(" not in matvec_ir.f32_matvec_ir(o, k, threads, ahead=0).split("define")[1]


def test_rows_run_one_stream_unless_asked() -> None:
  """One row a K loop (`ROWS`: a thread's rows read as one stream), `rows` where asked, fewer where a share doesn't
  divide."""
  assert matvec_ir.ROWS == 1 and matvec_ir.group_rows(2048) == 1
  assert [matvec_ir.group_rows(p, 4) for p in (8, 6, 5, 3)] == [4, 3, 1, 3]
  src = matvec_ir.f32_matvec_ir(8, 32, 1, lanes=16, unroll=2, ahead=0)
  assert src.count("call <16 x float> @llvm.fma") == 2 and "%rp1" not in src  # one row, two accumulators


def test_distance_and_accumulators_from_the_machine() -> None:
  assert matvec_ir.prefetch_ahead(48 * 1024, 12, 64, 128) == 4096  # Sapphire Rapids: one way of 48 KB x 12
  assert matvec_ir.prefetch_ahead(32 * 1024, 8, 64, 1024) == 4096  # Zen 4: 32 KB x 8
  assert matvec_ir.prefetch_ahead(64 * 1024, 4, 64, 512) == 16384  # a 4-way L1d: a way spans more sets
  assert matvec_ir.prefetch_ahead(6000, 3, 64, 128) == 1984         # whole lines
  assert matvec_ir.prefetch_ahead(1024, 8, 64, 512) == 512          # never under one K step
  assert matvec_ir.accumulators(8, 32, 4) == 2                      # 8 FMA chains over 4 rows
  assert matvec_ir.accumulators(4, 16, 4) == 1
  assert matvec_ir.accumulators(8, 8, 4) == 1                       # within half the registers


@pytest.mark.parametrize("args, kw, msg", [((6, 32, 4), {}, r"O=6 rows must split evenly over threads=4"),
                                           ((8, 40), {}, r"an 8x40 weight with 16-float vectors"),
                                           ((0, 32), {}, r"O must be a positive int, got 0"),
                                           ((8, 32), {"unroll": 0}, r"unroll must be positive, got 0"),
                                           ((8, 32), {"order": ("out", "w")}, r"must name out, w, x once")])
def test_bad_shapes_are_clear_errors(args: tuple, kw: dict, msg: str) -> None:
  with pytest.raises(ValueError, match=msg): matvec_ir.f32_matvec_ir(*args, **kw)


def test_register_kernel_errors() -> None:
  from tiny_uop import Ops as TOps
  from tiny_uop import UOp
  from tiny_uop.dtype import dtypes
  with pytest.raises(ValueError, match=r"needs a kernel AST \(SINK\)"):
    matvec_ir.register_kernel(UOp.const(dtypes.float32, 1.0), 4, 4, ("out", "w", "x"))
  sink = UOp(TOps.SINK, dtypes.void, ())
  with pytest.raises(ValueError, match=r"order \('out', 'x'\) must name out, w, x once"):
    matvec_ir.register_kernel(sink, 4, 4, ("out", "x"))
  assert matvec_ir.registered_kernel(sink) is None


def _ast(o: int, k: int) -> object:
  from tiny_tensor import Tensor
  from tiny_tensor.llm.quants import f32_matvec
  from tiny_uop import Ops as TOps
  out = f32_matvec(Tensor.empty(o, k).realize(), Tensor.empty(k).realize())
  assert out is not None
  return [c.src[0] for c in out.schedule().calls if c.src[0].op is TOps.SINK][-1]


def test_registered_ast_runs_the_kernel_and_falls_back_under_check_oob(monkeypatch: pytest.MonkeyPatch) -> None:
  """`tiny_tensor.llm.quants.f32_matvec` registers its AST; the LLVM CPU's program is this kernel, and with
  CHECK_OOB on (the kernel has no bounds checks) the same AST is lowered as usual."""
  from tiny_codegen import program
  from tiny_codegen.program import to_program
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  from tiny_uop.helpers import CHECK_OOB
  ast = _ast(24, 64)
  assert matvec_ir.registered_kernel(ast) is not None and matvec_ir.registered_kernel(ast)[:2] == (24, 64)
  assert "@llvm.prefetch.p0(" in to_program(ast, LLVMRenderer()).src[3].arg  # type: ignore[arg-type]
  monkeypatch.setattr(CHECK_OOB, "value", 1)
  assert program._f32_matvec_program(ast, "r", LLVMRenderer()) is None


@pytest.mark.parametrize("o, k", [(24, 256), (48, 768), (16, 80)])
def test_program_streams_with_one_fma_units_chains(o: int, k: int) -> None:
  """The registered AST's program has `FMA_LATENCY` accumulators a row (one FMA unit's chains: the weights stream in
  one vector an FMA, `accumulators`), not `fma_chains` (both units'), the machine model's lanes; K's vectors past
  the last whole step (K=80) in the tail. Run through `tiny_tensor.llm.quants.f32_matvec`: numpy's numbers."""
  from tiny_codegen.machine import FMA_LATENCY
  from tiny_codegen.program import to_program
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  from tiny_tensor import Tensor
  from tiny_tensor.llm.quants import f32_matvec
  ren = LLVMRenderer()
  regs, vbytes = ren.vector_registers
  lanes = vbytes // 4
  if not regs or k % lanes: pytest.skip("this renderer has no vector registers for the kernel")
  unroll = matvec_ir.accumulators(FMA_LATENCY, regs, 1)
  assert unroll == min(FMA_LATENCY, max(1, regs // 2))
  src = to_program(_ast(o, k), ren).src[3].arg
  fmas = src.count(f"call <{lanes} x float> @llvm.fma")  # a row a group (ROWS = 1): the step's, then the tail's
  assert fmas == unroll + (k % (unroll * lanes)) // lanes, src
  rng = np.random.default_rng(3)
  w, x = rng.standard_normal((o, k)).astype(np.float32), rng.standard_normal(k).astype(np.float32)
  y = f32_matvec(Tensor(w), Tensor(x))
  assert y is not None
  np.testing.assert_allclose(y.numpy(), w.astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
