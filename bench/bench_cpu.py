"""CPU device: elementwise `a+b` and `a.sum()` on 16M float32, the launch overhead of a cached tiny kernel (also as 2
thread-pool shares against 1, wall and process CPU time: `python bench/bench_cpu.py shares` prints just those), and the
time to load a compiled kernel (our ELF loader vs llvmlite's MCJIT, which tiny used before, on the same objects).

`tiny` (and `tiny_clang`): kernel ASTs (docs/PIPELINE.md §3) compiled by tiny-codegen and launched through the
device API (`Device["CPU"].get_program(...)(*bufs, global_size=...)`) into ready buffers; `tiny_tensor`: the same
through `Tensor` (scheduling, allocation, engine). Side by side with numpy and tinygrad when installed.
What each `a+b` column pays for besides the kernel: `numpy` allocates its result, a fresh 64 MB mapping (glibc maps
blocks this big anew each time) whose pages fault in, zeroed, as numpy writes them; `numpy_out` writes into a ready
buffer (like `tiny`); `tiny_tensor` gets the previous result's buffer back from the allocator's cache of freed
blocks (already faulted in: what a program's steady state sees); `tiny_tensor_fresh` empties that cache before each
call, so its output is a fresh mapping faulted in by the kernel's threads (like `numpy`).
`tiny`'s `a.sum()` is two hand-built kernel ASTs: per-row partial sums over (rows, n/rows), then the sum of the
partials; `tiny_tensor`'s is the scheduler's split of a big reduce (64 groups on the threads, 16-lane vector
accumulators, then the sum of the partials). Targets (issue #23): tiny_tensor's `a+b` <= 0.5x and `sum` <= 0.8x
numpy's time. `python bench/bench_cpu.py` prints the table; `run()` returns it for bench/run.py.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, also when this file is loaded by path
from settle import settle, warm_up  # noqa: E402

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU: with an OpenCL ICD installed (PoCL)
                                    # tinygrad would otherwise pick CL

N = 16 * 1024 * 1024
REPS = 7
LOADS = 200  # objects loaded per loader for the load-time rows


def best_ms(fn: Callable[[], Any], reps: int = REPS) -> float:
  """Best wall time of `reps` calls, in ms (`settle()`, then `warm_up(fn)` first)."""
  settle()
  warm_up(fn)
  times = []
  for _ in range(reps):
    st = time.perf_counter()
    fn()
    times.append(time.perf_counter() - st)
  return min(times) * 1e3


# ***** tiny: kernel ASTs through codegen and the CPU device *****
def _asts(n: int, rows: int) -> dict[str, Any]:
  from tiny_uop.dtype import dtypes
  from tiny_uop.uop import AxisType, KernelInfo, Ops, UOp
  f32 = dtypes.float32
  out, a, b = (UOp(Ops.PARAM, f32.ptr(n), arg=i) for i in range(3))
  r = UOp.range(n, 0)
  add = UOp.sink(out.index(r).store(a.index(r).load() + b.index(r).load()), arg=KernelInfo("bench_add"))
  cols = n // rows
  part, src = UOp(Ops.PARAM, f32.ptr(rows), arg=0), UOp(Ops.PARAM, f32.ptr(n), arg=1)
  r0, r1 = UOp.range(rows, 0), UOp.range(cols, 1, AxisType.REDUCE)
  partial = UOp.sink(part.index(r0).store(src.index(r0 * cols + r1).load().reduce(r1, arg=Ops.ADD)),
                     arg=KernelInfo("bench_sum_partial"))
  total, parts = UOp(Ops.PARAM, f32.ptr(1), arg=0), UOp(Ops.PARAM, f32.ptr(rows), arg=1)
  r2 = UOp.range(rows, 0, AxisType.REDUCE)
  final = UOp.sink(total.index(UOp.const(dtypes.index, 0)).store(parts.index(r2).load().reduce(r2, arg=Ops.ADD)),
                   arg=KernelInfo("bench_sum_final"))
  one, x = UOp(Ops.PARAM, f32.ptr(1), arg=0), UOp(Ops.PARAM, f32.ptr(1), arg=1)
  z = UOp.const(dtypes.index, 0)
  tiny_kernel = UOp.sink(one.index(z).store(x.index(z).load() + 1.0), arg=KernelInfo("bench_tiny"))
  return {"add": add, "partial": partial, "final": final, "tiny": tiny_kernel}


class TinyCPU:
  """The benchmark kernels compiled for one CPU renderer, with their buffers."""

  def __init__(self, renderer_name: str, a: np.ndarray, b: np.ndarray, rows: int = 1024):
    from tiny_codegen import get_program
    from tiny_uop.device import Buffer
    from tiny_uop.dtype import dtypes
    from tiny_uop.helpers import Context
    from tiny_uop.plugins import Device
    self.dev = Device["CPU"]
    with Context(DEV=f"CPU:{renderer_name}"): renderer = self.dev.renderer
    n = a.size
    self.specs = {k: get_program(ast, renderer) for k, ast in _asts(n, rows).items()}
    self.prgs = {k: self.dev.get_program(s.name, s.lib) for k, s in self.specs.items()}
    f32 = dtypes.float32
    self.a, self.b = (Buffer("CPU", n, f32).copyin(memoryview(x)) for x in (a, b))
    self.out, self.parts, self.total = Buffer("CPU", n, f32), Buffer("CPU", rows, f32), Buffer("CPU", 1, f32)
    self.one, self.x = Buffer("CPU", 1, f32), Buffer("CPU", 1, f32).copyin(memoryview(np.ones(1, np.float32)))

  def launch(self, key: str, *bufs: Any) -> None:
    spec = self.specs[key]
    self.prgs[key](*[bufs[g]._buf for g in spec.globals], global_size=spec.global_size, local_size=spec.local_size)

  def add(self) -> None: self.launch("add", self.out, self.a, self.b)

  def sum(self) -> None:
    self.launch("partial", self.parts, self.a)
    self.launch("final", self.total, self.parts)

  def tiny(self) -> None: self.launch("tiny", self.one, self.x)


def launch_overhead_us(fn: Callable[[], None], n: int = 20000) -> float:
  """Median per-call time of `fn` in µs over batches of calls."""
  for _ in range(1000): fn()
  batches = []
  for _ in range(5):
    st = time.perf_counter()
    for _ in range(n // 5): fn()
    batches.append((time.perf_counter() - st) / (n // 5) * 1e6)
  return statistics.median(batches)


def launch_shares(n: int = 4000, reps: int = 5) -> dict[str, float]:
  """A cached tiny kernel launched as 1 share (inline) and as 2 shares (the pool's helper thread woken for one):
  median wall µs and process CPU µs (all threads) per launch over `reps` batches of `n` launches. The kernel's own
  work is a few ns, so the 2-share figures are the thread pool's cost per launch."""
  t = TinyCPU("LLVM", np.zeros(16, np.float32), np.zeros(16, np.float32), rows=4)
  spec, prg = t.specs["tiny"], t.prgs["tiny"]
  args = [(t.one, t.x)[g]._buf for g in spec.globals]
  out: dict[str, float] = {}
  for label, gs in (("1share", (1, 1, 1)), ("2shares", (2, 1, 1))):
    for _ in range(200): prg(*args, global_size=gs)
    walls, cpus = [], []
    for _ in range(reps):
      st, sc = time.perf_counter(), time.process_time()
      for _ in range(n): prg(*args, global_size=gs)
      walls.append((time.perf_counter() - st) / n * 1e6)
      cpus.append((time.process_time() - sc) / n * 1e6)
    out[f"tiny_{label}"], out[f"tiny_{label}_cpu"] = statistics.median(walls), statistics.median(cpus)
    got = float(t.one.numpy()[0])
    assert got == 2.0, f"the tiny kernel launched as {label} wrote {got}, not 1 + 1"
  return out


def load_times(n: int | None = None) -> dict[str, dict[str, float]]:
  """Median µs to load one compiled small kernel (`exp2(a*1.5+0.25)` over 1024 floats: constants and a libm call)
  until it can be called, with tiny's loader (`tiny_runtime_cpu.elfload`, x86-64) and with MCJIT, on the same `n`
  objects (distinct names: MCJIT would otherwise open an engine per object); and the median ms to compile one.
  The first kernel each loader loads is run and checked against numpy."""
  import ctypes
  import platform

  from tiny_codegen import get_program
  from tiny_codegen.compiler.llvm import LLVMCompiler
  from tiny_uop.dtype import dtypes
  from tiny_uop.helpers import Context
  from tiny_uop.plugins import Device
  from tiny_uop.uop import KernelInfo, Ops, UOp
  from tiny_runtime_cpu.cpu import MCJIT
  f32 = dtypes.float32
  out, a = UOp(Ops.PARAM, f32.ptr(1024), arg=0), UOp(Ops.PARAM, f32.ptr(1024), arg=1)
  r = UOp.range(1024, 0)
  ast = UOp.sink(out.index(r).store((a.index(r).load() * 1.5 + 0.25).exp2()), arg=KernelInfo("bench_load"))
  with Context(DEV="CPU:LLVM"): src = get_program(ast, Device["CPU"].renderer).src
  comp, compile_s, objs = LLVMCompiler(), [], []
  for i in range(LOADS if n is None else n):
    st = time.perf_counter()
    objs.append((f"bench_load_{i}", comp.compile(src.replace("@bench_load(", f"@bench_load_{i}("))))
    compile_s.append(time.perf_counter() - st)
  loaders: dict[str, Callable[[str, bytes], Any]] = {}  # (name, object) -> (kept alive, address of the function)
  if platform.machine() in ("x86_64", "AMD64"):
    from tiny_runtime_cpu.elfload import LoadedObject
    loaders["tiny"] = lambda name, obj: ((img := LoadedObject(obj, name)), img.symbol(name))
  jit = MCJIT()
  jit.load("bench_load_warm", comp.compile(src.replace("@bench_load(", "@bench_load_warm(")))  # its engine made
  loaders["tiny_mcjit"] = lambda name, obj: (None, jit.load(name, obj)[0])
  x = np.linspace(-1, 1, 1024, dtype=np.float32)
  res: dict[str, dict[str, float]] = {"load": {}, "compile": {"tiny": statistics.median(compile_s) * 1e3}}
  for label, load in loaders.items():
    keep, times = [], []
    for name, obj in objs:
      st = time.perf_counter()
      keep.append(load(name, obj))
      times.append(time.perf_counter() - st)
    res["load"][label] = statistics.median(times) * 1e6
    y = np.zeros_like(x)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(keep[0][1])
    fn(y.ctypes.data, x.ctypes.data, 0)
    if not np.allclose(y, np.exp2(x * 1.5 + 0.25), rtol=1e-6): raise AssertionError(f"{label}: loaded kernel is wrong")
  return res


# ***** tiny_tensor (the whole stack: Tensor -> schedule -> codegen -> CPU), when installed *****
def _tiny_tensor(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
  try:
    from tiny_tensor import Tensor
  except ImportError: return {}
  from tiny_uop.plugins import Device
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  if not np.array_equal((ta + tb).numpy(), a + b): raise AssertionError("tiny_tensor a+b is wrong")
  res = {"add": best_ms(lambda: (ta + tb).realize()), "sum": best_ms(lambda: ta.sum().realize())}
  alloc, fresh = Device["CPU"].allocator, []
  for _ in range(REPS):
    alloc.free_cache()  # unmaps the freed blocks: the next output is a fresh mapping
    st = time.perf_counter()
    (ta + tb).realize()
    fresh.append(time.perf_counter() - st)
  return {**res, "add_fresh": min(fresh) * 1e3}


# ***** tinygrad, when installed *****
def _tinygrad(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
  try:
    from tinygrad import Tensor  # type: ignore[import-not-found]
  except ImportError: return {}
  if shutil.which("clang") is None: return {}  # its CPU device compiles with clang (the column is left out)
  from tinygrad import Device as TGDevice  # type: ignore[import-not-found]
  dev = TGDevice[TGDevice.DEFAULT]  # its CPU queue runs kernels asynchronously: time until they are done
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  return {"add": best_ms(lambda: ((ta + tb).realize(), dev.synchronize())),
          "sum": best_ms(lambda: (ta.sum().realize(), dev.synchronize()))}


def run() -> dict[str, dict[str, Any]]:
  """Cases: add and sum (ms, lower is better) and launch overhead (µs), per implementation."""
  rng = np.random.default_rng(0)
  a, b = rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)
  out_np = np.empty_like(a)
  res: dict[str, dict[str, Any]] = {
    "a+b 16M float32": {"unit": "ms", "better": "lower", "target": "tiny_tensor <= 0.5x numpy"},
    "a.sum() 16M float32": {"unit": "ms", "better": "lower", "target": "tiny_tensor <= 0.8x numpy"},
    "launch overhead, cached tiny kernel": {"unit": "us", "better": "lower", "target": "<= 20 us"},
    "launch of a tiny kernel, 1 vs 2 shares (wall, process CPU)": {"unit": "us", "better": "lower",
                                                                    "target": "2 shares within a few us of 1"},
    "load a compiled small kernel": {"unit": "us", "better": "lower", "target": "<= MCJIT's (tiny_mcjit)"},
    "compile a small kernel (LLVM -O2)": {"unit": "ms", "better": "lower", "target": "reference for the load row"},
  }
  for rname, label in (("LLVM", "tiny"), ("CLANG", "tiny_clang")):
    try: t = TinyCPU(rname, a, b)
    except Exception as e:  # noqa: BLE001 -- e.g. no clang: report the others
      print(f"tiny CPU:{rname} unavailable: {type(e).__name__}: {e}", file=sys.stderr)
      continue
    t.add()
    assert np.array_equal(t.out.numpy(), a + b), f"CPU:{rname} a+b is wrong"
    t.sum()
    got, want = float(t.total.numpy()[0]), float(a.astype(np.float64).sum())
    assert abs(got - want) <= 1e-4 * abs(want), f"CPU:{rname} sum {got} vs {want}"
    res["a+b 16M float32"][label] = best_ms(t.add)
    res["a.sum() 16M float32"][label] = best_ms(t.sum)
    res["launch overhead, cached tiny kernel"][label] = launch_overhead_us(t.tiny)
  res["launch of a tiny kernel, 1 vs 2 shares (wall, process CPU)"].update(launch_shares())
  loads = load_times()
  res["load a compiled small kernel"].update(loads["load"])
  res["compile a small kernel (LLVM -O2)"].update(loads["compile"])
  res["a+b 16M float32"]["numpy"] = best_ms(lambda: a + b)               # allocates its output, like a Tensor op
  res["a+b 16M float32"]["numpy_out"] = best_ms(lambda: np.add(a, b, out=out_np))  # into a ready buffer, like tiny
  res["a.sum() 16M float32"]["numpy"] = best_ms(lambda: a.sum())
  for label, fn in (("tiny_tensor", _tiny_tensor), ("tinygrad", _tinygrad)):
    try: got = fn(a, b)
    except Exception as e:  # noqa: BLE001 -- one broken implementation must not hide the others
      print(f"{label} unavailable: {type(e).__name__}: {e}", file=sys.stderr)
      continue
    for case, v in got.items():
      row = res["a.sum() 16M float32" if case == "sum" else "a+b 16M float32"]
      row[label + ("_fresh" if "fresh" in case else "")] = v
  return res


if __name__ == "__main__":
  if sys.argv[1:] == ["shares"]:  # just the 1- vs 2-share launch rows (a few seconds)
    print("  ".join(f"{k}={v:.3g}us" for k, v in launch_shares().items()))
    sys.exit(0)
  for case, row in run().items():
    unit = row.get("unit", "")
    cells = "  ".join(f"{k}={v:.3g}{unit}" for k, v in row.items() if isinstance(v, float))
    print(f"{case:40s} {cells}   [target: {row.get('target', '')}]")
