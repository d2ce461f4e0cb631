"""Streaming (non-temporal) stores on the CPU: a big elementwise output is written one whole cache line at a time
past the cache (`CPURenderer.nontemporal_min_bytes`, `renderer.nontemporal_store`); results stay exact, also into an
output that isn't aligned to a line (the kernel checks at run time and stores normally there)."""
from __future__ import annotations

import numpy as np
import pytest
from kernel_runner import run
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.opt import Kernel, Opt, OptOps, hand_coded_optimizations
from tiny_codegen.renderer.llvmir import LLVMRenderer

N = 4096


def renderer(least: int) -> LLVMRenderer:
  r = LLVMRenderer()
  r.threads = 2
  r.thread_min_work = 0
  r.nontemporal_min_bytes = least  # small, so the test's buffers can be
  return r


def add_ast(n: int, dt: DType, name: str = "stream_add") -> UOp:
  out, a, b = (UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(3))
  r = UOp.range(n, 0)
  return out.index(r).store(a.index(r).load() + b.index(r).load()).sink(arg=KernelInfo(name))


NP = {dtypes.float32: np.float32, dtypes.float64: np.float64, dtypes.int32: np.int32}
DTS = [dtypes.float32, dtypes.float64, dtypes.int32]


@pytest.mark.parametrize("dt", DTS, ids=str)
def test_big_elementwise_store_is_one_streamed_cache_line(dt: DType) -> None:
  ren = renderer(N * dt.itemsize)
  lanes = 64 // dt.itemsize
  k = hand_coded_optimizations(Kernel(add_ast(N, dt), ren))
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, lanes)]
  src = get_program(add_ast(N, dt, f"stream_add_{dt.name}"), ren).src
  vt = f"<{lanes} x {'float' if dt == dtypes.float32 else 'double' if dt == dtypes.float64 else 'i32'}>"
  assert f"store {vt} %" in src and ", align 64, !nontemporal !0" in src
  assert src.count("!nontemporal") == 1 and "!0 = !{i32 1}" in src
  assert "fence seq_cst" in src  # drained before the kernel returns
  assert "and i64" in src and ", 63" in src  # the alignment test


def test_byte_lines_are_not_upcast() -> None:
  """A line of uint8 is 64 lanes, more than the expander makes one vector: no upcast (scalar copies would only
  slow LLVM's own vectorizer), nothing streamed."""
  ren = renderer(4)
  assert hand_coded_optimizations(Kernel(add_ast(N, dtypes.uint8), ren)).applied_opts == []
  assert "nontemporal" not in get_program(add_ast(N, dtypes.uint8, "stream_u8"), ren).src


def test_small_output_and_reduce_are_not_streamed() -> None:
  ren = renderer(N * 4 + 4)  # one byte more than the output: below the threshold
  assert hand_coded_optimizations(Kernel(add_ast(N, dtypes.float32), ren)).applied_opts == []
  src = get_program(add_ast(N, dtypes.float32, "stream_small"), ren).src
  assert "nontemporal" not in src and "fence" not in src
  # a reduce's output (row sums of a big input into a big output): the reduce heuristics decide, nothing streams
  # unless its store happens to be a whole line; here each store is one scalar
  out, a = UOp(Ops.PARAM, dtypes.float32.ptr(N), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(N * 8), arg=1)
  i, j = UOp.range(N, 0), UOp.range(8, 1, AxisType.REDUCE)
  ast = out.index(i).store(a.index(i * 8 + j).load().reduce(j, arg=Ops.ADD)).sink(arg=KernelInfo("stream_rowsum"))
  src = get_program(ast, renderer(4)).src
  assert "nontemporal" not in src


def test_gated_store_is_not_streamed() -> None:
  out, a = UOp(Ops.PARAM, dtypes.float32.ptr(N), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(N), arg=1)
  r = UOp.range(N, 0)
  ast = out.index(r, r < N - 3).store(a.index(r).load() * 2.0).sink(arg=KernelInfo("stream_gated", (Opt(
    OptOps.UPCAST, 0, 16),)))
  assert "nontemporal" not in get_program(ast, renderer(4)).src


@pytest.mark.parametrize("offset", [0, 1, 5], ids=lambda o: f"offset{o}")
@pytest.mark.parametrize("dt", DTS, ids=str)
def test_streamed_results_exact_aligned_or_not(dt: DType, offset: int) -> None:
  """The output starts `offset` elements into a 64-byte aligned block: 0 streams every line, others take the plain
  path at run time; the two threads each write their half."""
  spec = get_program(add_ast(N, dt, f"stream_exact_{dt.name}"), renderer(N * dt.itemsize))
  assert "!nontemporal" in spec.src and spec.global_size[0] == 2
  rng = np.random.default_rng(offset)
  npdt = NP[dt]
  a = (rng.random(N) * 100).astype(npdt)
  b = (rng.random(N) * 100).astype(npdt)
  block = np.zeros(N + 64 + offset, npdt)
  start = (-block.ctypes.data % 64) // block.itemsize + offset
  out = block[start:start + N]
  assert (out.ctypes.data % 64 == 0) == (offset == 0)
  run(spec, [out, a, b], threaded=True)
  np.testing.assert_array_equal(out, a + b)
  assert not block[:start].any() and not block[start + N:].any()  # nothing written outside the output
