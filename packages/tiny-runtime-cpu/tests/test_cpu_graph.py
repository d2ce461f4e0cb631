"""`CPUGraph` (the CPU device's TinyJit graph, docs/PIPELINE.md §7) run directly on compiled kernels: a chain of
dependent kernels split over several shares gives numpy's results with new input buffers per replay, in one native
call per replay, on the pool and inline."""
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tiny_uop import AxisType, KernelInfo, Ops, UOp
from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.plugins import Device
from tiny_runtime_cpu.graph import CPUGraph


def _axpy(n: int, name: str) -> UOp:
  out, a, b = (UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(3))
  r = UOp.range(n, 0)
  return out.index(r).store(a.index(r).load() * 3.0 + b.index(r).load()).sink(arg=KernelInfo(name))


def _col_sums(rows: int, cols: int, name: str) -> UOp:
  # out[c] = sum_r x[r*cols + c]: share c reads elements that every share of a row-split producer wrote
  out, x = UOp(Ops.PARAM, dtypes.float32.ptr(cols), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(rows * cols), arg=1)
  c, r = UOp.range(cols, 0), UOp.range(rows, 1, AxisType.REDUCE)
  return out.index(c).store(x.index(r * cols + c).load().reduce(r, arg=Ops.ADD)).sink(arg=KernelInfo(name))


def _kernel(ast: UOp, threads: int, bufs: list[Any]) -> SimpleNamespace:
  """A compiled kernel as TinyJit's `_KernelCall` hands it to a graph: `bufs` per program argument (a HostMem, or an
  int: the replay input's index)."""
  from tiny_codegen import get_program
  dev = Device["CPU:LLVM"]
  ren = type(dev.renderer)()
  ren.threads, ren.thread_min_work = threads, 0
  spec = get_program(ast, ren)
  gs = tuple(spec.global_size)
  return SimpleNamespace(prg=dev.get_program(spec.name, spec.lib), bufs=[bufs[s] for s in spec.globals], vars=(),
                         global_size=gs, local_size=None, static_launch=True, launch=lambda vv: (gs, None))


_KEEP: list[Buffer] = []  # the Buffers whose memory the tests use (freed ones would be reused by the next)


def _host(a: np.ndarray) -> Any:
  _KEEP.append(Buffer("CPU", a.size, dtypes.float32, initial_value=a.astype(np.float32).tobytes()).ensure_allocated())
  return _KEEP[-1]._buf


def _read(m: Any, n: int) -> np.ndarray: return np.frombuffer(m.mv, np.float32, n).copy()


@pytest.mark.parametrize("threads", [1, 3])
def test_graph_chain_of_split_kernels_matches_numpy_in_one_native_call(threads: int) -> None:
  rows, cols = 64, 48
  n = rows * cols
  dev = Device["CPU"]
  t, y, z = (_host(np.zeros(k)) for k in (n, cols, cols))
  # t = a*3 + b (inputs 0, 1: new buffers each replay); y = column sums of t; z = y*3 + c (input 2)
  ks = [_kernel(_axpy(n, f"g_axpy_{threads}"), threads, [t, 0, 1]),
        _kernel(_col_sums(rows, cols, f"g_cols_{threads}"), threads, [y, t]),
        _kernel(_axpy(cols, f"g_axpy2_{threads}"), threads, [z, y, 2])]
  assert all(k.global_size[0] == threads for k in ks)
  g = CPUGraph(dev, ks)
  rng = np.random.default_rng(threads)
  for _ in range(4):
    a, b, c = (rng.standard_normal(k).astype(np.float32) for k in (n, n, cols))
    before = CPUGraph.native_calls
    g([_host(a), _host(b), _host(c)], {})
    assert CPUGraph.native_calls == before + 1
    want_y = (a * np.float32(3) + b).reshape(rows, cols).sum(0)
    np.testing.assert_allclose(_read(y, cols), want_y, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_read(z, cols), _read(y, cols) * np.float32(3) + c, rtol=1e-6)


def test_graph_while_another_thread_holds_the_pool_launches_kernel_by_kernel() -> None:
  n = 999
  dev = Device["CPU"]
  t, u = _host(np.zeros(n)), _host(np.zeros(n))
  ks = [_kernel(_axpy(n, "g_busy_1"), 3, [t, 0, 1]), _kernel(_axpy(n, "g_busy_2"), 3, [u, t, 0])]
  g = CPUGraph(dev, ks)
  g([_host(np.zeros(n)), _host(np.zeros(n))], {})  # starts the pool's helpers (and its native dispatch)
  a, b = np.arange(n, dtype=np.float32), np.full(n, 0.25, np.float32)
  pooled = dev.pool.native is not None  # CPU_THREADS=1: no helpers, no dispatch block to wait for
  before = CPUGraph.native_calls
  with dev.pool._native_lock: g([_host(a), _host(b)], {})  # as if another Python thread's launch ran
  assert CPUGraph.native_calls == before + (0 if pooled else 1)
  np.testing.assert_allclose(_read(u, n), (a * np.float32(3) + b) * np.float32(3) + a, rtol=1e-6)


def test_graph_reports_an_out_of_bounds_read_of_a_check_oob_kernel() -> None:
  from tiny_uop.helpers import Context
  from tiny_runtime_cpu.cpu import OutOfBoundsError
  n = 16
  out, inp = UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=1)
  r = UOp.range(n, 0)
  ast = out.index(r).store(inp.index(r + 2).load() * 2.0).sink(arg=KernelInfo("g_oob_read"))
  y = _host(np.zeros(n))
  with Context(CHECK_OOB=1): k = _kernel(ast, 1, [y, 0])
  g = CPUGraph(Device["CPU"], [k])
  a = np.arange(n, dtype=np.float32)
  want = rf"kernel 'g_oob_read' read element 1[67] of buffer data1, which holds {n}"
  with pytest.raises(OutOfBoundsError, match=want): g([_host(a)], {})
  np.testing.assert_array_equal(_read(y, n)[:n - 2], a[2:] * 2)  # the in-bounds elements were written


def test_graph_refuses_what_is_not_a_cpu_kernel() -> None:
  copy = SimpleNamespace(bufs=[0, 1], nbytes=16)
  assert not CPUGraph.supports(Device["CPU"], copy)
  with pytest.raises(ValueError, match="CPU kernels only"): CPUGraph(Device["CPU"], [SimpleNamespace(prg=None)])


def test_reserved_generations_stay_in_range_and_fresh() -> None:
  # a graph's launch k uses generation first + k: all must be in 1..GEN_MAX and differ from the last one published
  from tiny_runtime_cpu.threads import GEN_MAX, ThreadPool
  pool = ThreadPool(0)
  last = 0
  for start, count in ((0, 1), (5, 10), (GEN_MAX - 3, 3), (GEN_MAX - 3, 4), (GEN_MAX - 1, 100), (GEN_MAX, 1)):
    pool._gen = last = start
    first = pool._reserve(count)
    gens = range(first, first + count)
    assert 1 <= gens[0] and gens[-1] <= GEN_MAX and last not in gens and pool._gen == gens[-1]


def test_replay_hands_split_kernels_to_the_helper() -> None:
  """A replay launches split kernels on the pool's native dispatch, where a helper runs shares of them: the pool's
  count of shares its helpers ran (`NativePool.helper_shares`) grows. The replays go on (for up to 20 s, not a count
  of them: a replay here is ~0.1 ms) until it does: on a loaded machine (CI's other test worker on the second core)
  the helper's CPU may be taken for a while, and then the launching thread runs every share."""
  dev = Device["CPU"]
  if dev.pool.workers == 0: pytest.skip("CPU_THREADS=1: a pool without helpers")
  rows, cols = 256, 512
  n = rows * cols
  t, y = _host(np.zeros(n)), _host(np.zeros(cols))
  ks = [_kernel(_axpy(n, "h_axpy"), 2, [t, 0, 1]), _kernel(_col_sums(rows, cols, "h_cols"), 2, [y, t])]
  assert [k.global_size[0] for k in ks] == [2, 2]
  g = CPUGraph(dev, ks)
  rng = np.random.default_rng(9)
  a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
  ha, hb = _host(a), _host(b)
  g([ha, hb], {})
  assert dev.pool.native is not None
  before, replays, until = dev.pool.native.helper_shares, 0, time.perf_counter() + 20.0
  while dev.pool.native.helper_shares == before and time.perf_counter() < until:
    g([ha, hb], {})
    replays += 1
  assert dev.pool.native.helper_shares > before, replays
  np.testing.assert_allclose(_read(y, cols), (a * np.float32(3) + b).reshape(rows, cols).sum(0), rtol=1e-4, atol=1e-3)
