"""BEAM search: seeded with the heuristics' opts (so it can't end up with something it measured slower), its disk
cache keyed exactly (shapes, dtypes, renderers, thread counts, beam width tell searches apart; a kernel's name
doesn't), buffers that are really in memory, and programs that compute what numpy does. No time is asserted."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.dtype import DType
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.opt import apply_opts
from tiny_codegen.opt.search import ACTIONS, _buffers_for, _Timer, beam_candidates, beam_search, cache_key, \
  heuristic_opts, timing_device
from tiny_codegen.renderer.cstyle import ClangRenderer
from tiny_codegen.renderer.llvmir import LLVMRenderer


def add_ast(n: int, dt: DType = dtypes.float32, name: str = "beam_add") -> UOp:
  out, a, b = (UOp(Ops.PARAM, dt.ptr(n), arg=i) for i in range(3))
  r = UOp.range(n, 0)
  return out.index(r).store(a.index(r).load() + b.index(r).load()).sink(arg=KernelInfo(name))


def matmul_ast(M: int, N: int, K: int, name: str = "beam_mm") -> UOp:
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((M * N, M * K, K * N)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo(name))


def sum_ast(n: int) -> UOp:
  out, a = UOp(Ops.PARAM, dtypes.float.ptr(1), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(n), arg=1)
  r = UOp.range(n, 0, AxisType.REDUCE)
  return out.index(UOp.const(dtypes.index, 0)).store(a.index(r).load().reduce(r, arg=Ops.ADD)).sink(
    arg=KernelInfo("beam_sum"))


def run(ast: UOp, inputs: list[np.ndarray], out: np.ndarray) -> np.ndarray:
  dev = Device["CPU"]
  spec = get_program(ast, dev.renderer)
  bufs = [Buffer("CPU", out.size, dtypes.float32).allocate()] + \
    [Buffer("CPU", x.size, dtypes.float32, initial_value=x.tobytes()) for x in inputs]
  dev.get_program(spec.name, spec.lib)(*[bufs[s]._buf for s in spec.globals], global_size=spec.global_size,
                                        local_size=spec.local_size, wait=True)
  return np.frombuffer(bufs[0].as_buffer(), dtype=np.float32).reshape(out.shape)


@pytest.mark.parametrize("ast", [matmul_ast(16, 16, 8), add_ast(1 << 12), sum_ast(1 << 12)], ids=["mm", "add", "sum"])
def test_heuristic_opts_are_candidates_and_the_choice_was_timed(ast: UOp) -> None:
  ren = Device["CPU"].renderer
  heur = heuristic_opts(ast, ren)
  timed, chosen = beam_candidates(ast, ren, 2, compile=get_program)
  opts = [o for o, _ in timed]
  assert opts[0] == () and heur in opts[:2]  # both seeds timed first (one, when the heuristics apply nothing)
  assert chosen in opts and len(set(opts)) == len(opts) and all(t > 0 for _, t in timed)
  assert len(opts) > 2  # it did grow candidates
  apply_opts(ast, ren, chosen)  # legal (raises otherwise)


def _rss() -> int:
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="needs Linux's /proc for the RSS")
def test_search_buffers_are_written() -> None:
  """A never-written host mapping reads as the kernel's shared zero page (always in cache: a 16M-float a+b timed 3x
  too fast): the search writes its buffers, so they take real memory (the resident set grows by them)."""
  n = (1 << 20) + 48  # an odd size: no block of it is waiting in the allocator's cache
  before = _rss()
  bufs = _buffers_for(add_ast(n), "CPU")
  grown = _rss() - before
  assert len(bufs) == 3 and all(b.nbytes == 4 * n for b in bufs)
  assert grown >= 0.9 * 3 * 4 * n, f"resident set grew by {grown} bytes for {3 * 4 * n} bytes of buffers"
  assert all(bytes(b.as_buffer()[-64:]) == bytes(64) for b in bufs)


def test_cache_key_tells_apart_what_it_must() -> None:
  llvm = LLVMRenderer()
  base = cache_key(add_ast(1024), llvm, 2)
  assert base is not None and base == cache_key(add_ast(1024), llvm, 2)
  assert base == cache_key(add_ast(1024, name="another_name"), llvm, 2)  # the name is not the kernel
  others = {
    "shape": cache_key(add_ast(2048), llvm, 2),
    "dtype": cache_key(add_ast(1024, dtypes.float64), llvm, 2),
    "width": cache_key(add_ast(1024), llvm, 3),
    "renderer": cache_key(add_ast(1024), ClangRenderer(), 2),
    "kernel": cache_key(matmul_ast(32, 32, 32), llvm, 2),
  }
  threads = LLVMRenderer()
  threads.threads = llvm.threads + 1
  others["threads"] = cache_key(add_ast(1024), threads, 2)
  # a class default (what a new release may change) is in the key as much as an instance's setting
  for name in ("thread_min_work", "balance_min_work", "shares_per_thread"):
    assert name not in vars(LLVMRenderer)  # inherited, so deleting the override below restores it
    setattr(LLVMRenderer, name, getattr(LLVMRenderer, name) + 1)  # on LLVMRenderer: CPURenderer's value shadowed
    try: others[f"class {name}"] = cache_key(add_ast(1024), llvm, 2)
    finally: delattr(LLVMRenderer, name)
  assert cache_key(add_ast(1024), llvm, 2) == base
  arch = LLVMRenderer("znver4" if llvm.arch != "znver4" else "skylake")
  others["arch"] = cache_key(add_ast(1024), arch, 2)
  locals_off = add_ast(1024)
  others["dont_use_locals"] = cache_key(locals_off.replace(arg=KernelInfo("beam_add", None, (), True)), llvm, 2)
  assert base not in others.values() and len(set(others.values())) == len(others), others
  # the compiler's identity (triple, CPU, features) is in the key
  other_cpu = LLVMRenderer()
  other_cpu.compiler.cachekey = llvm.compiler.cachekey.replace(llvm.compiler.cpu, "another-cpu")
  assert cache_key(add_ast(1024), other_cpu, 2) != base
  # and without an identity (a compiler made with CACHELEVEL=0) nothing is cached
  other_cpu.compiler.cachekey = None
  assert cache_key(add_ast(1024), other_cpu, 2) is None
  assert len(ACTIONS) == len(set(ACTIONS))


def test_cache_key_tells_a_mock_device_from_the_real_one() -> None:
  """Timings through MOCK+AMD's emulator say nothing about a real AMD GPU of the same arch."""
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  ren = AMDGPURenderer("gfx1100")
  with Context(DEV="AMD:LLVM:gfx1100"): real, real_dev = cache_key(add_ast(1024), ren, 2), timing_device(ren)
  with Context(DEV="MOCK+AMD:LLVM:gfx1100"): mock, mock_dev = cache_key(add_ast(1024), ren, 2), timing_device(ren)
  assert real is not None and mock is not None and real != mock
  assert (real_dev, mock_dev) == ("AMD", "MOCK+AMD")  # where the candidates are timed
  with Context(DEV="CPU"): assert timing_device(ren) == "AMD" and timing_device(LLVMRenderer()) == "CPU"


def test_beam_search_is_cached_per_key(tmp_path, monkeypatch) -> None:
  monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path))
  ren = Device["CPU"].renderer
  ast = add_ast(1 << 12, name="beam_cached")
  first = beam_search(ast, ren, 1, compile=get_program)
  import tiny_codegen.opt.search as search

  def no_search(*a, **k): raise AssertionError("searched again")
  monkeypatch.setattr(search, "beam_candidates", no_search)
  assert beam_search(ast.replace(arg=KernelInfo("renamed")), ren, 1, compile=get_program) == first
  with pytest.raises(AssertionError, match="searched again"): beam_search(add_ast(1 << 13), ren, 1, compile=get_program)


def test_timer_times_exactly_the_opts_given() -> None:
  ren = Device["CPU"].renderer
  ast = matmul_ast(16, 16, 8)
  t = _Timer(ast, ren, get_program)
  heur = heuristic_opts(ast, ren)
  assert t.time(heur) > 0 and t.time(()) > 0
  def src(spec): return spec.src.replace(f"{spec.name}(", "K(")  # names are made unique per process
  assert heur and src(t.programs[heur][3]) == src(get_program(apply_opts(ast, ren, heur), ren))
  plain = ast.replace(arg=KernelInfo("beam_mm", opts_to_apply=()))  # no opts (None would mean: the heuristics')
  assert src(t.programs[()][3]) == src(get_program(plain, ren)) != src(t.programs[heur][3])


def test_beam_results_match_numpy(tmp_path, monkeypatch) -> None:
  monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path))
  rng = np.random.default_rng(5)
  a, b = rng.standard_normal(1 << 12).astype(np.float32), rng.standard_normal(1 << 12).astype(np.float32)
  m, n = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((8, 16)).astype(np.float32)
  with Context(BEAM=1):
    np.testing.assert_array_equal(run(add_ast(1 << 12, name="beam_exact_add"), [a, b], np.empty(1 << 12)), a + b)
    got = run(matmul_ast(16, 16, 8, "beam_exact_mm"), [m, n], np.empty((16, 16)))
    np.testing.assert_allclose(got, m @ n, rtol=1e-5, atol=1e-5)
    s = run(sum_ast(1 << 12), [a], np.empty(1))
    np.testing.assert_allclose(s[0], a.astype(np.float64).sum(), rtol=1e-5)


def test_search_starts_from_the_ast_the_optimizer_sees() -> None:
  # a sum over two nested reduce ranges walked as one contiguous run: lowering merges them into one range before the
  # optimizer, so opts name that one range. The heuristics' seed, the candidates and their programs must all start
  # from the merged AST (the bench's 16M sum() had opts chosen on two ranges, which didn't apply when compiled)
  out, a = UOp(Ops.PARAM, dtypes.float.ptr(1), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(4096), arg=1)
  r0, r1 = UOp.range(32, 0, AxisType.REDUCE), UOp.range(128, 1, AxisType.REDUCE)
  ast = out.index(UOp.const(dtypes.index, 0)).store(a.index(r0 * 128 + r1).load().reduce(r0, r1, arg=Ops.ADD)).sink(
    arg=KernelInfo("beam_nested_sum"))
  ren = Device["CPU"].renderer
  heur = heuristic_opts(ast, ren)
  assert heur and all(o.axis == 0 for o in heur), heur  # the merged kernel has one reduce axis
  timed, chosen = beam_candidates(ast, ren, 1, compile=get_program)
  assert heur in [o for o, _ in timed] and chosen in [o for o, _ in timed]
  x = np.random.default_rng(6).standard_normal(4096).astype(np.float32)
  got = run(ast.replace(arg=KernelInfo("beam_nested_sum", opts_to_apply=chosen)), [x], np.empty(1))
  np.testing.assert_allclose(got[0], x.astype(np.float64).sum(), rtol=1e-4, atol=1e-4)
