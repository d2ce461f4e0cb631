"""The lowering pipeline's structure: linear order, loops, accumulators, threads, GPU dims, expander, names."""
from __future__ import annotations

import numpy as np

import re

import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Renderer
from tiny_uop.uop import AxisType

from tiny_codegen import get_program, to_program
from tiny_codegen.lower import lower
from tiny_codegen.lower.linearize import LinearizeError, linearize
from tiny_codegen.program import ProgramInfo, kernel_name, spec_from_program
from tiny_codegen.renderer.cstyle import ClangRenderer
from tiny_codegen.renderer.llvmir import LLVMRenderer


def P(slot: int, size: int, dt=dtypes.float) -> UOp: return UOp(Ops.PARAM, dt.ptr(size), arg=slot)


def cpu(threads: int = 1, min_work: int = 0) -> LLVMRenderer:
  r = LLVMRenderer()
  r.threads, r.thread_min_work = threads, min_work
  return r


class FakeGPU(Renderer):
  """A GPU-style renderer (has_local) that renders nothing: for testing the dims pass."""
  device = "FAKEGPU"
  has_local = True
  global_max = (1 << 20, 1024, 1024)
  local_max = (256, 256, 64)


def check_linear(uops: list[UOp]) -> None:
  """Sources come first; loops are balanced; every node sits inside the loops of all ranges it depends on."""
  seen: set[UOp] = set()
  open_loops: list[UOp] = []
  for u in uops:
    for s in u.src: assert s in seen, f"{u.op} before its source {s.op}"
    if u.op is Ops.END:
      assert open_loops and open_loops[-1] is u.src[-1], "END closes a loop that is not the innermost open one"
      open_loops.pop()
    elif u.op is Ops.RANGE: open_loops.append(u)
    elif u.op is not Ops.SINK:
      assert all(r in open_loops for r in u.ranges if r.op is Ops.RANGE), f"{u.op} outside one of its loops"
    seen.add(u)
  assert not open_loops and uops[-1].op is Ops.SINK


def matvec(n: int = 4, k: int = 8) -> UOp:
  c, a, b = P(0, n), P(1, n * k), P(2, k)
  i, j = UOp.range(n, 0), UOp.range(k, 1, AxisType.REDUCE)
  return c.index(i).store((a.index(i * k + j).load() * b.index(j).load()).reduce(j) + 1.0).sink(arg=KernelInfo())


def test_linear_order_of_reduce_kernel():
  uops = lower(matvec(), cpu(), optimize=False).uops
  check_linear(uops)
  ops = [u.op for u in uops]
  assert ops.count(Ops.RANGE) == 2 and ops.count(Ops.END) == 2 and ops.count(Ops.DEFINE_REG) == 1
  # accumulator init between the two loop openings, final read after the inner END
  r0, r1 = [i for i, u in enumerate(uops) if u.op is Ops.RANGE]
  e1 = next(i for i, u in enumerate(uops) if u.op is Ops.END)
  stores = [i for i, u in enumerate(uops) if u.op is Ops.STORE]
  assert r0 < stores[0] < r1 and stores[1] < e1 < stores[2]


def test_loop_invariant_load_is_hoisted():
  # b[i] only depends on the outer loop: it is loaded outside the reduce loop
  c, a, b = P(0, 4), P(1, 32), P(2, 4)
  i, j = UOp.range(4, 0), UOp.range(8, 1, AxisType.REDUCE)
  ast = c.index(i).store((a.index(i * 8 + j).load() * b.index(i).load()).reduce(j)).sink(arg=KernelInfo())
  uops = lower(ast, cpu(), optimize=False).uops
  check_linear(uops)
  ld_b = next(k for k, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].src[0] is b)
  r1 = next(k for k, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[1] is AxisType.REDUCE)
  assert ld_b < r1


def test_linearize_rejects_unclosed_and_double_closed_ranges():
  c = P(0, 4)
  i = UOp.range(4, 0)
  st = c.index(i).store(UOp.const(dtypes.float, 1.0))
  with pytest.raises(LinearizeError, match="never closed"): linearize(UOp.sink(st))
  with pytest.raises(LinearizeError, match="two ENDs"):
    linearize(UOp.sink(UOp(Ops.END, src=(st, i)), UOp(Ops.END, src=(UOp(Ops.GROUP, src=(st,)), i))))


def test_loop_bound_used_only_by_its_range_comes_before_it():
  # a size-1 reduce inside a loop: its bound CONST 1 has no other user, and sits after the outer RANGE in graph order.
  # It was placed after the loops, so the C renderer printed `Ridx1 < ;` (found by test_crosscheck's random kernels)
  out, inp = P(0, 2, dtypes.int32), P(1, 2, dtypes.int32)
  r0, r1 = UOp.range(2, 0), UOp.range(1, 1, AxisType.REDUCE)
  ast = UOp.sink(out.index(r0).store(inp.index(r0 + r1).load().reduce(r1, arg=Ops.ADD)), arg=KernelInfo())
  low = lower(ast, ClangRenderer())
  check_linear(low.uops)
  assert "Ridx1 < 1;" in get_program(ast, ClangRenderer()).src


def test_threads_split_outer_loop():
  ast = matvec(n=10)
  low = lower(ast, cpu(threads=4), optimize=False)
  check_linear(low.uops)
  assert low.dims.global_size == (4, 1, 1)
  sp = [u for u in low.uops if u.op is Ops.SPECIAL]
  assert len(sp) == 1 and sp[0].arg == "core_id" and sp[0].src[0].arg == 4
  assert lower(matvec(n=2), cpu(threads=4), optimize=False).dims.global_size == (2, 1, 1)
  # too little work for threads: one thread, no core_id use
  small = lower(ast, cpu(threads=4, min_work=1 << 20), optimize=False)
  assert small.dims.global_size == (1, 1, 1) and not any(u.op is Ops.SPECIAL for u in small.uops)


def test_gpu_dims_become_special():
  low = lower(matvec(n=6), FakeGPU(), optimize=False)
  check_linear(low.uops)
  sp = [u for u in low.uops if u.op is Ops.SPECIAL]
  assert [u.arg for u in sp] == ["gidx0"] and low.dims.global_size == (6, 1, 1)
  assert [u.arg[1] for u in low.uops if u.op is Ops.RANGE] == [AxisType.REDUCE]
  # GLOBAL and LOCAL axes from the optimizer: gidx0 is the innermost global axis
  c = P(0, 64)
  g0, g1, l0 = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(2, 1, AxisType.GLOBAL), UOp.range(8, 2, AxisType.LOCAL)
  ast = c.index(g0 * 16 + g1 * 8 + l0).store(UOp.const(dtypes.float, 2.0)).sink(arg=KernelInfo())
  low = lower(ast, FakeGPU(), optimize=False)
  assert low.dims.global_size == (2, 4, 1) and low.dims.local_size == (8, 1, 1)
  assert sorted(u.arg for u in low.uops if u.op is Ops.SPECIAL) == ["gidx0", "gidx1", "lidx0"]
  assert not any(u.op is Ops.RANGE for u in low.uops)
  # a LOOP axis next to a LOCAL one (LOCAL split of an output axis) is a global dim too
  o, l1 = UOp.range(4, 0), UOp.range(4, 1, AxisType.LOCAL)
  low = lower(c.index(o * 4 + l1).store(UOp.const(dtypes.float, 1.0)).sink(arg=KernelInfo()), FakeGPU(), optimize=False)
  assert low.dims.global_size == (4, 1, 1) and low.dims.local_size == (4, 1, 1)


def test_expander_upcast_store_and_unroll_reduce():
  c, a = P(0, 8), P(1, 32)
  i0, iu = UOp.range(2, 0), UOp.range(4, 1, AxisType.UPCAST)
  ku = UOp.range(4, 2, AxisType.UNROLL)
  i = i0 * 4 + iu
  ast = c.index(i).store(a.index(i * 4 + ku).load().reduce(ku)).sink(arg=KernelInfo())
  ren = ClangRenderer()  # scalar lanes (the LLVM renderer vectorizes an UPCAST axis: see below)
  ren.threads = 1
  uops = lower(ast, ren, optimize=False).uops
  check_linear(uops)
  assert [u.arg[0] for u in uops if u.op is Ops.RANGE] == [0]  # only the plain loop is left
  assert sum(u.op is Ops.STORE for u in uops) == 4 and sum(u.op is Ops.LOAD for u in uops) == 16
  assert not any(u.op is Ops.DEFINE_REG for u in uops)  # a reduce over only UNROLL lanes needs no accumulator


def test_expander_vectorizes_an_upcast_axis_on_llvm():
  # c[i0*8+iu] = sum_k a[k*16 + i0*8 + iu] * b[k]: iu (8 lanes) walks a and c contiguously -> one <8 x float> load of
  # a per k, b[k] broadcast, a vector accumulator and one vector store; a load with stride 4 in iu is one load of 32
  # (29 spanned, all in the buffer by the index's bounds) and a shuffle of every 4th, one with stride 5 is gathered
  c, a, b = P(0, 16), P(1, 64), P(2, 4)
  i0, iu, k = UOp.range(2, 0), UOp.range(8, 1, AxisType.UPCAST), UOp.range(4, 2, AxisType.REDUCE)
  i = i0 * 8 + iu
  val = (a.index(k * 16 + i).load() * b.index(k).load()).reduce(k) + a.index(iu * 4 + i0).load() + \
    a.index(iu * 5 + i0).load()
  uops = lower(c.index(i).store(val).sink(arg=KernelInfo()), cpu(), optimize=False).uops
  check_linear(uops)
  f8 = dtypes.float.vec(8)
  assert [u.src[1].dtype for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM] == [f8]
  loads = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
  dts = [u.dtype for u in loads]
  assert dts.count(f8) == 1 and dts.count(dtypes.float) == 1 + 8  # a's row; b[k] and the stride-5 gather
  wide = [u for u in loads if u.dtype == dtypes.float.vec(32)]
  assert len(wide) == 1 and len(wide[0].src[0].src) == 2  # in bounds: no mask
  assert [u.arg for u in uops if u.op is Ops.GEP and u.src[0] is wide[0]] == [tuple(range(0, 29, 4))]
  assert any(u.op is Ops.DEFINE_REG and u.dtype.base == f8 for u in uops)


def test_bf16_lowered_through_float():
  c, a = P(0, 4, dtypes.bfloat16), P(1, 4, dtypes.bfloat16)
  i = UOp.range(4, 0)
  ast = c.index(i).store(a.index(i).load() + a.index(i).load()).sink(arg=KernelInfo())
  uops = lower(ast, cpu(), optimize=False).uops
  assert not any(u.dtype.scalar() == dtypes.bfloat16 or getattr(u.dtype, "base", None) == dtypes.bfloat16 for u in uops)
  assert any(u.op is Ops.ADD and u.dtype == dtypes.float32 for u in uops)


def test_unsupported_reduce_op_names_valid_ones():
  c, a = P(0, 1), P(1, 4)
  j = UOp.range(4, 0, AxisType.REDUCE)
  ast = c.index(UOp.const(dtypes.index, 0)).store(a.index(j).load().reduce(j, arg=Ops.SUB)).sink(arg=KernelInfo())
  with pytest.raises(ValueError, match="valid: ADD, MUL, MAX"): lower(ast, cpu(), optimize=False)


def test_kernel_names():
  # another test in this process may have named a different r_4_8 kernel first: then this one is r_4_8n<k>
  assert re.fullmatch(r"r_4_8(n\d+)?", kernel_name(matvec(4, 8)))
  c = P(0, 12)
  i = UOp.range(12, 0)
  e1 = c.index(i).store(UOp.const(dtypes.float, 1.0)).sink(arg=KernelInfo())
  e2 = c.index(i).store(UOp.const(dtypes.float, 2.0)).sink(arg=KernelInfo())
  n1, n2 = kernel_name(e1), kernel_name(e2)
  assert n1.startswith("E_12") and n2.startswith("E_12") and n1 != n2 and kernel_name(e1) == n1
  assert kernel_name(e1.replace(arg=KernelInfo("my kernel!"))) == "my_kernel_"
  assert kernel_name(e1.replace(arg=KernelInfo("3x3"))) == "k_3x3"


def test_to_program_and_spec():
  ast = matvec(4, 8)
  r = cpu(threads=2)
  with Context(NOOPT=1): prg = to_program(ast, r)
  assert prg.op is Ops.PROGRAM and [s.op for s in prg.src] == [Ops.SINK, Ops.DEVICE, Ops.LINEAR, Ops.SOURCE, Ops.BINARY]
  assert prg.src[0] is ast and prg.src[1].arg == "CPU" and isinstance(prg.arg, ProgramInfo)
  spec = spec_from_program(prg)
  assert spec.name == prg.arg.name and spec.src == prg.src[3].arg and spec.lib == prg.src[4].arg
  assert spec.lib[:4] == b"\x7fELF" and spec.globals == [0, 1, 2] and spec.outs == [0] and spec.ins == [1, 2]
  assert spec.global_size == (2, 1, 1) and spec.uops is not None and spec.uops[-1].op is Ops.SINK
  with Context(NOOPT=1): assert get_program(ast, r).src == spec.src  # cached


def test_debug_prints_source(capsys):
  c = P(0, 5)
  i = UOp.range(5, 0)
  ast = c.index(i).store(i.cast(dtypes.float) * 3.0).sink(arg=KernelInfo("debug_me"))
  with Context(DEBUG=4, NOOPT=1): get_program(ast, ClangRenderer())
  assert "void debug_me(float* restrict data0, int core_id)" in capsys.readouterr().out
  with Context(DEBUG=6, NOOPT=1): lower(ast, ClangRenderer())
  out = capsys.readouterr().out
  assert "kernel AST" in out and "RANGE" in out and "after expander" not in out
  with Context(DEBUG=7, NOOPT=1): lower(ast, ClangRenderer())
  out = capsys.readouterr().out
  assert "after expander" in out and "after reduce" in out


def _at_dims_stage(ast: UOp, ren: Renderer) -> UOp:
  """The kernel as the dims stage (which decides threads) sees it: expanded, reduces lowered, unoptimized."""
  from tiny_codegen.lower import STAGES, Dims
  sink, dims = ast, Dims()
  for name, fn in STAGES:
    if name == "dims": return sink
    sink = fn(sink, ren, dims)
  raise AssertionError("no dims stage")


def _ew(n: int, dt=dtypes.float) -> UOp:
  out, a, b = P(0, n, dt), P(1, n, dt), P(2, n, dt)
  r = UOp.range(n, 0)
  return out.index(r).store(a.index(r).load() + b.index(r).load()).sink(arg=KernelInfo())


def test_kernel_cost_counts_bytes_and_ops():
  """a+b: 3 global accesses of 4 bytes and one ADD per element; uint8: 1 byte each. A reduce's cost scales with its
  loop: per extra (i, j) iteration a's 4 bytes, MUL, accumulate and index math (b[j], which depends on j only, is
  counted per j: a value counts the iterations of the loops it depends on)."""
  from tiny_codegen.lower.dims import kernel_cost
  ren = cpu(threads=2)
  assert kernel_cost(_at_dims_stage(_ew(1000), ren)) == 13 * 1000
  assert kernel_cost(_at_dims_stage(_ew(1000, dtypes.uint8), ren)) == 4 * 1000
  c1, c2 = (kernel_cost(_at_dims_stage(matvec(n=16, k=k), ren)) for k in (64, 128))
  assert 16 * 64 * 8 <= c2 - c1 <= 16 * 64 * 16


def test_thread_decision_is_cost_based():
  """With the CPU renderer's default `thread_min_work` (sized for a replay's ~0.1 µs handoff: a few µs of work): a
  small a+b runs on one thread, a big one on all; many cheap iterations (uint8 a+b over 50k, which an iteration count
  would have split) stay on one thread; few outer iterations carrying much work (4 rows of 256K-element sums) are
  split, and so is an a+b over 32K floats (13 units an element: ~425K, a few µs), but not one over 16K."""
  from tiny_codegen.renderer import CPURenderer
  def shares(ast: UOp) -> int:
    r = LLVMRenderer()
    r.threads = 2
    assert r.thread_min_work == CPURenderer.thread_min_work
    return lower(ast, r, optimize=False).dims.global_size[0]
  assert shares(_ew(4096)) == 1
  assert shares(_ew(1 << 20)) == 2
  assert shares(_ew(50_000, dtypes.uint8)) == 1
  assert shares(_ew(200_000, dtypes.uint8)) == 2
  assert shares(_ew(16384)) == 1 and shares(_ew(32768)) == 2
  many = cpu(threads=16, min_work=1 << 18)  # 16 cores: no share under half the minimum (425984 // 131072 = 3)
  assert lower(_ew(32768), many, optimize=False).dims.global_size == (3, 1, 1)
  assert lower(_ew(1 << 20), many, optimize=False).dims.global_size == (16, 1, 1)
  assert shares(matvec(n=4, k=1 << 18)) == 2
  assert shares(matvec(n=4, k=1 << 20)) == 4  # past `balance_min_work`: 4 per thread, at most one per row
  assert shares(matvec(n=4, k=1 << 10)) == 1


def test_split_program_carries_its_cost():
  """A split kernel's PROGRAM carries its `kernel_cost` (`ProgramInfo.cost`, `spec.cost`, `Dims.cost`): the runtime's
  Python launch path runs the shares of one cheaper than its own minimum inline. An unsplit kernel carries 0; an
  optimizer's THREAD axis carries the cost of the whole kernel too."""
  from tiny_codegen import get_program
  from tiny_codegen.lower.dims import kernel_cost
  r = cpu(threads=2, min_work=1 << 18)
  low = lower(_ew(32768), r, optimize=False)
  assert low.dims.global_size == (2, 1, 1) and low.dims.cost == 13 * 32768  # 3 x 4 bytes + one ADD an element
  spec = get_program(_ew(32768), r)
  assert spec.global_size == (2, 1, 1) and spec.cost >= r.thread_min_work
  assert get_program(_ew(1024), r).cost == 0 and get_program(_ew(1024), r).global_size == (1, 1, 1)
  out, a, b = P(0, 4096), P(1, 4096), P(2, 4096)
  t, i = UOp.range(4, 0, AxisType.THREAD), UOp.range(1024, 1)
  idx = t * 1024 + i
  ast = out.index(idx).store(a.index(idx).load() + b.index(idx).load()).sink(arg=KernelInfo())
  low = lower(ast, cpu(threads=2, min_work=1 << 30), optimize=False)
  assert low.dims.global_size == (4, 1, 1) and low.dims.cost == kernel_cost(ast) > 13 * 4096 - 1


def test_big_kernels_launch_shares_per_thread():
  """A kernel costing at least `balance_min_work` launches `shares_per_thread` shares per thread, for the pool's
  threads to claim as they come free; a cheaper one a share per thread. No share is empty: with N outer iterations
  there are ceil(N / chunk) shares. Every share's chunk is computed exactly once (the numbers, launched share by
  share and on concurrent threads)."""
  import importlib
  from tiny_codegen import get_program
  from tiny_codegen.renderer import CPURenderer
  kr = importlib.import_module("kernel_runner")
  assert CPURenderer.balance_min_work >= CPURenderer.thread_min_work and CPURenderer.shares_per_thread > 1
  def ren() -> LLVMRenderer:
    r = cpu(threads=2)
    r.balance_min_work, r.shares_per_thread = 1 << 16, 4
    return r
  rng = np.random.default_rng(3)
  for n, k, want in ((64, 2048, 8), (64, 16, 2), (10, 8192, 5), (3, 1 << 15, 3)):
    spec = get_program(matvec(n=n, k=k), ren())
    assert spec.global_size == (want, 1, 1), (n, k, spec.global_size)
    a, b = rng.standard_normal(n * k, dtype=np.float32), rng.standard_normal(k, dtype=np.float32)
    want_c = a.reshape(n, k).astype(np.float64) @ b.astype(np.float64) + 1.0
    for threaded in (False, True):
      c = np.full(n, np.nan, np.float32)
      kr.run(spec, [c, a, b], threaded=threaded)
      np.testing.assert_allclose(c, want_c, rtol=1e-4, atol=1e-3)
  off = ren()
  off.balance_min_work = 0  # 0 turns balancing off
  assert get_program(matvec(n=64, k=2048), off).global_size == (2, 1, 1)


def _rowsums(n: int, m: int, k: int) -> UOp:
  """c[i, j] = sum_l a[i, j, l]: two store loops (i outer, j inner) around a reduce."""
  c, a = P(0, n * m), P(1, n * m * k)
  i, j, l = UOp.range(n, 0), UOp.range(m, 1), UOp.range(k, 2, AxisType.REDUCE)
  return c.index(i * m + j).store(a.index((i * m + j) * k + l).load().reduce(l)).sink(arg=KernelInfo())


def test_uneven_outer_split_shares_the_next_loop():
  """3 outer iterations on 2 threads would be shares of 2 and 1 (one thread idle a third of the time): each outer
  iteration's next loop is split in 2 as well, 6 equal shares, claimed 3 per thread. Share s covers outer iteration
  s // 2 and half s % 2 of the next loop (a ragged last half when its bound is odd); every element is written once,
  with the right sum, run share by share and on concurrent threads. Even splits, and those whose next loop can't be
  split evenly, keep one share per thread."""
  import ctypes
  import importlib
  from tiny_codegen import get_program
  kr = importlib.import_module("kernel_runner")
  rng = np.random.default_rng(5)
  for n, m, want in ((3, 16, 6), (3, 7, 6), (5, 16, 10), (4, 16, 2), (3, 1, 2), (9, 16, 2)):
    spec = get_program(_rowsums(n, m, 64), cpu(threads=2))
    assert spec.global_size == (want, 1, 1), (n, m, spec.global_size)
    a = rng.standard_normal(n * m * 64, dtype=np.float32)
    for threaded in (False, True):
      c = np.full(n * m, np.nan, np.float32)
      kr.run(spec, [c, a], threaded=threaded)
      np.testing.assert_allclose(c, a.reshape(n * m, 64).astype(np.float64).sum(1), rtol=1e-4, atol=1e-4)
    if want == 2 * n:  # which share wrote what: share s, alone, writes row s // 2's half s % 2
      fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(kr.load_fn(spec.name, spec.lib))
      half = -(-m // 2)
      for s in range(want):
        c = np.full(n * m, np.nan, np.float32)
        fn(*[[c, a][slot].ctypes.data for slot in spec.globals], s)
        lo = (s // 2) * m + (s % 2) * half
        assert np.flatnonzero(~np.isnan(c)).tolist() == list(range(lo, min(lo + half, (s // 2 + 1) * m))), (n, m, s)
