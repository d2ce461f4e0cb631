"""Per-kernel profile of an ONNX model's TinyJit replay next to onnxruntime's own per-node profile (issue #39).

Both on one thread (`CPU_THREADS=1` is set here; onnxruntime with `intra_op_num_threads=1`), the model built and
exported as `bench_models.py` does (random weights, batch 1, `BENCH_MODELS_IMAGE` pixels). tiny: the jit's capture
replayed once normally, then each of its kernels run alone with a wait, the least of 5 (us), with its GFLOPS (the
FLOPs `GlobalCounters` counts for it); onnxruntime: `SessionOptions.enable_profiling`, each node's least kernel time
over 10 runs. Printed: the sums, then both lists in graph order, then the time per kind (tiny: E (elementwise) /
r (reduce: convs, pools, Gemm) kernels; onnxruntime: per op type), so the gaps can be ranked by the ms they lose.

`python bench/profile_models.py resnet18 [mobilenet_v3_small ...]` (needs onnx, onnxruntime and torch).
`CPU_THREADS=2 python bench/profile_models.py --threads mobilenet_v3_small`: each kernel on one thread vs the pool, its
share count and each share's time (`thread_split`).
`python bench/profile_models.py --sequence mobilenet_v3_small`: each kernel timed in the replay's sequence (the TSC
read around its native call inside one replay, many replays back to back) next to the same kernel alone (run again
right after itself: its data hot), with its output's and weights' sizes, so what a kernel loses to the cache state
the previous kernels leave is seen per kernel (`sequence_times`, x86-64).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

os.environ.setdefault("CPU_THREADS", "1")
os.environ.setdefault("DEV", "CPU")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import bench_models as bm  # noqa: E402
from tiny_runtime_cpu.graph import ENTRY_IR, INLINE_IR  # noqa: E402 -- the runner loop's blocks, shared


def ort_nodes(path: str, feeds: dict[str, np.ndarray], runs: int = 10) -> list[tuple[float, str, str]]:
  """onnxruntime's per-node profile on one thread: [(least us, op type, node name)] in graph order."""
  import onnxruntime as ort
  so = ort.SessionOptions()
  so.intra_op_num_threads = so.inter_op_num_threads = 1
  so.enable_profiling = True
  so.profile_file_prefix = os.path.join(os.path.dirname(path), "ort_profile")
  sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
  for _ in range(runs): sess.run(None, feeds)
  with open(sess.end_profiling()) as f: events = json.load(f)
  nodes: dict[str, tuple[float, str]] = {}
  for e in events:
    if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"): continue
    name = e["name"][:-len("_kernel_time")]
    prev = nodes.get(name)
    nodes[name] = (min(e["dur"], prev[0]) if prev else e["dur"], e["args"].get("op_name", "?"))
  return [(us, op, name) for name, (us, op) in nodes.items()]


@contextlib.contextmanager
def replays_seen() -> Iterator[dict[str, Any]]:
  """Within the block, every TinyJit replay records its capture, input buffers and Variable values in the dict
  yielded (`cj`, `inputs`, `var_vals`: what `kernel_runs` needs to run its kernels alone)."""
  from tiny_tensor import jit as jitmod
  seen: dict[str, Any] = {}
  plain_call = jitmod.CapturedJit.__call__

  def spy(self: Any, inputs: list, var_vals: dict[str, int]) -> Any:
    seen.update(cj=self, inputs=list(inputs), var_vals=var_vals)
    return plain_call(self, inputs, var_vals)
  jitmod.CapturedJit.__call__ = spy  # type: ignore[method-assign]
  try: yield seen
  finally: jitmod.CapturedJit.__call__ = plain_call  # type: ignore[method-assign]


def kernel_runs(seen: dict[str, Any]) -> Iterator[tuple[Any, Callable[[], Any]]]:
  """Each kernel call of the last replay `replays_seen` recorded, in replay order, with a function that runs it
  alone on that replay's buffers and waits for it."""
  from tiny_tensor import jit as jitmod
  for c in seen["cj"].calls:
    if not isinstance(c, jitmod._KernelCall): continue
    args = c.args.copy()
    for i, slot in c.dyn: args[i] = seen["inputs"][slot]._buf
    vals = tuple(seen["var_vals"].get(n, v) for n, v in c.vars)
    gs, ls = c.launch(seen["var_vals"])

    def run(c: Any = c, args: list = args, gs: Any = gs, ls: Any = ls, vals: tuple = vals) -> Any:
      return c.prg(*args, global_size=gs, local_size=ls, vals=vals, wait=True)  # (bound now: the loop moves on)
    yield c, run


def tiny_kernels(path: str, feeds: dict[str, np.ndarray], want: np.ndarray) -> tuple[list[tuple[float, str, float]],
                                                                                     float]:
  """Each kernel of the jitted runner's replay run alone: ([(least us of 5, name, GFLOPS)] in replay order, the
  least ms of 10 whole jitted calls). The output is checked against onnxruntime's first."""
  from tiny_tensor.nn.onnx import OnnxRunner
  runner = OnnxRunner(path, jit=True)
  with replays_seen() as seen:
    for _ in range(3): out = runner(feeds)["y"].numpy()
  bm._close("profile", "jit", out, want)
  whole = min(_seconds(lambda: runner(feeds)["y"].numpy()) for _ in range(10)) * 1e3
  rows = []
  for c, run in kernel_runs(seen):
    best = min(_seconds(run) for _ in range(5))
    rows.append((best * 1e6, c.name, c.ops / best / 1e9))
  return rows, whole


def kernel_graphs(seen: dict[str, Any]) -> Iterator[tuple[Any, Any, int, Any, list[int]]]:
  """For each kernel of a replay `replays_seen` recorded: (the call, its one-kernel `CPUGraph` with this replay's
  inputs patched in, its share count, its ctypes function, the argument addresses and values `fxn(*addrs, core_id)`
  runs one share with)."""
  from tiny_runtime_cpu.cpu import HostMem
  from tiny_runtime_cpu.graph import CPUGraph
  from tiny_uop.plugins import Device
  inputs, vv = [t._buf for t in seen["inputs"]], seen["var_vals"]
  for c, _ in kernel_runs(seen):
    g = CPUGraph(Device["CPU"], [c])
    g(inputs, vv)  # patches this replay's input addresses into its argument blocks
    n, args = int(g.table[3]), list(c.args)
    for i, slot in c.dyn: args[i] = inputs[slot]
    vals = [vv.get(k, v) for k, v in c.vars]
    yield c, g, n, c.prg._fxn(len(args), len(vals)), [b.addr if isinstance(b, HostMem) else b for b in args] + vals


def thread_split(path: str, feeds: dict[str, np.ndarray], runs: int = 30) -> list[tuple[str, int, float, float,
                                                                                          list[float]]]:
  """Each kernel of the jitted runner's replay on one thread and on the pool (the process's `CPU_THREADS`, so run
  with `CPU_THREADS=2`): [(name, shares, one thread us, pool us, [each share alone, us])]. One thread: the kernel's
  shares in turn, natively (its one-kernel `CPUGraph` replay without a pool), least `time.thread_time` of `runs`; the
  pool: the same replay on the pool, least wall of `runs`; each share: one ctypes call with its `core_id`, least wall
  of `runs` (how even the split is). The three in turns, so a burst of load hits them alike."""
  from tiny_tensor.nn.onnx import OnnxRunner
  runner = OnnxRunner(path, jit=True)
  with replays_seen() as seen:
    for _ in range(3): runner(feeds)["y"].numpy()
  inputs, vv, rows = [t._buf for t in seen["inputs"]], seen["var_vals"], []
  for c, g, n, fxn, addrs in kernel_graphs(seen):
    one, pool, shares = float("inf"), float("inf"), [float("inf")] * n
    for _ in range(runs):
      st = time.thread_time()
      g.runner(g.table_addr, g.count, None, 0, None)
      one = min(one, time.thread_time() - st)
      pool = min(pool, _seconds(functools.partial(g, inputs, vv)))
      for i in range(n): shares[i] = min(shares[i], _seconds(functools.partial(fxn, *addrs, i)))
    rows.append((c.name, n, one * 1e6, pool * 1e6, [x * 1e6 for x in shares]))
  return rows


def print_thread_split(name: str) -> None:
  """Print `thread_split` for model `name` (see it) with the sums."""
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{name}.onnx")
    _, feeds = bm.export_model(name, path)
    rows = thread_split(path, feeds)
  one, pool, split = sum(r[2] for r in rows), sum(r[3] for r in rows), sum(r[1] > 1 for r in rows)
  print(f"== {name}: {len(rows)} kernels, CPU_THREADS={os.environ['CPU_THREADS']}, one thread {one:.0f} us, pool "
        f"{pool:.0f} us, {split} split | load {os.getloadavg()[0]:.1f}")
  for kname, n, one, pool, sh in rows:
    print(f"  {kname:32s} {n:3d} shares {one:7.1f} {pool:7.1f} us {one / pool:5.2f}x  each "
          + " ".join(f"{x:.1f}" for x in sh[:8]) + (" ..." if n > 8 else ""))


TIMED_RUNNER_IR = """declare i64 @llvm.readcyclecounter()
define void @tiny_graph_time(ptr %table, i64 %count, ptr %times) nounwind {
entry:
  %any = icmp ugt i64 %count, 0
  br i1 %any, label %kernel, label %out
kernel:
""" + ENTRY_IR + """  %t0 = call i64 @llvm.readcyclecounter()
  br label %inline
""" + INLINE_IR + """next:
  %t1 = call i64 @llvm.readcyclecounter()
  %d = sub i64 %t1, %t0
  %ptm = getelementptr i64, ptr %times, i64 %i
  store i64 %d, ptr %ptm, align 8
  %inext = add i64 %i, 1
  %more = icmp ult i64 %inext, %count
  br i1 %more, label %kernel, label %out
out:
  ret void
}
define i64 @tiny_tsc() nounwind {
  %t = call i64 @llvm.readcyclecounter()
  ret i64 %t
}
"""
"""`CPUGraph`'s replay loop (graph.RUNNER_IR's inline path: every share on this thread) with the TSC read before and
after each kernel into `times` (ticks), and `tiny_tsc` to calibrate the ticks against `perf_counter_ns`."""


def sequence_times(seen: dict[str, Any], reps: int = 40, alone_runs: int = 7) -> list[tuple[Any, float, float, float]]:
  """Each kernel of the replay `replays_seen` recorded: (the call, least us alone, least and median us in sequence).
  One `CPUGraph` table of all the kernels (this replay's inputs patched in) is run `reps` times by `TIMED_RUNNER_IR`
  (one thread, no sleep between kernels or replays: the cache state each kernel meets is the real replay's); alone:
  the kernel's one-entry table run `alone_runs` times in a row (its data as hot as it gets)."""
  import ctypes
  import statistics
  from tiny_codegen.machine import host_machine
  from tiny_runtime_cpu.graph import CPUGraph, ENTRY_WORDS
  from tiny_uop.plugins import Device
  if host_machine().arch != "x86_64": raise RuntimeError("sequence_times reads the TSC: x86-64 only")
  dev = Device["CPU"]
  timed = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)(
    dev.native_load("tiny_graph_time", TIMED_RUNNER_IR))
  tsc = ctypes.CFUNCTYPE(ctypes.c_int64)(dev.native_load("tiny_tsc", TIMED_RUNNER_IR))
  t0, n0 = tsc(), time.perf_counter_ns()
  time.sleep(0.05)
  us_per_tick = (time.perf_counter_ns() - n0) / (tsc() - t0) / 1e3
  calls = [c for c, _ in kernel_runs(seen)]
  g = CPUGraph(dev, calls)
  g([t._buf for t in seen["inputs"]], seen["var_vals"])  # patches the inputs in (and runs it once)
  ticks = (ctypes.c_int64 * max(1, g.count))()
  seq: list[list[float]] = [[] for _ in calls]
  for _ in range(reps):
    timed(g.table_addr, g.count, ctypes.addressof(ticks))
    for i in range(g.count): seq[i].append(ticks[i] * us_per_tick)
  rows = []
  for i, c in enumerate(calls):
    alone = float("inf")
    for _ in range(alone_runs):
      timed(g.table_addr + ENTRY_WORDS * 8 * i, 1, ctypes.addressof(ticks))
      alone = min(alone, ticks[0] * us_per_tick)
    rows.append((c, alone, min(seq[i]), statistics.median(seq[i])))
  return rows


def print_sequence(name: str) -> None:
  """Print `sequence_times` for model `name` (see it): per kernel alone / in sequence (least, median) us, the
  difference, its output's KB and the KB of what it reads that no kernel of the replay writes (weights)."""
  from tiny_tensor.nn.onnx import OnnxRunner
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{name}.onnx")
    _, feeds = bm.export_model(name, path)
    runner = OnnxRunner(path, jit=True)
    with replays_seen() as seen:
      for _ in range(3): runner(feeds)["y"].numpy()
    rows = sequence_times(seen)
  written = {c.refs[j].base for c, *_ in rows for j in (c.rw[1] if c.rw else ()) if not isinstance(c.refs[j], int)}
  alone, smin, smed = (sum(r[k] for r in rows) / 1e3 for k in (1, 2, 3))
  print(f"== {name}: {len(rows)} kernels, one thread: alone {alone:.2f} ms, in sequence {smin:.2f} ms (least) "
        f"{smed:.2f} ms (median) | load {os.getloadavg()[0]:.1f}")
  print("-- (alone, in sequence least, median, median - alone: us; output, weights: KB)")
  for c, a, mn, md in rows:
    outs = [c.refs[j] for j in (c.rw[1] if c.rw else ())]
    wts = [r for r in c.refs if not isinstance(r, int) and r.base not in written]
    print(f"  {c.name:30s} {a:8.1f} {mn:8.1f} {md:8.1f} {md - a:+7.1f}  out {sum(o.nbytes for o in outs) / 1024:7.0f}"
          f"  w {sum(w.nbytes for w in wts) / 1024:7.0f}")


def _seconds(fn: Any) -> float:
  st = time.perf_counter()
  fn()
  return time.perf_counter() - st


def profile(name: str) -> None:
  """Print model `name`'s per-kernel and per-node profiles (see the module docstring)."""
  import onnxruntime as ort
  import torch
  torch.set_num_threads(1)
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{name}.onnx")
    _, feeds = bm.export_model(name, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    ort_ms = min(_seconds(lambda: sess.run(None, feeds)) for _ in range(20)) * 1e3
    nodes = ort_nodes(path, feeds)
    kernels, jit_ms = tiny_kernels(path, feeds, want)
  print(f"== {name}: {len(kernels)} kernels, sum {sum(k[0] for k in kernels) / 1e3:.2f} ms, jit {jit_ms:.2f} ms | "
        f"onnxruntime (1 thread) {ort_ms:.2f} ms, its nodes' sum {sum(n[0] for n in nodes) / 1e3:.2f} ms | "
        f"load {os.getloadavg()[0]:.1f}")
  print("-- tiny kernels (us, name, GFLOPS)")
  for us, kname, gf in kernels: print(f"  {us:8.0f}  {kname:30s} {gf:7.1f}")
  print("-- onnxruntime nodes (us, op, name)")
  for us, op, nname in nodes: print(f"  {us:8.0f}  {op:18s} {nname}")
  by_kind: collections.Counter[str] = collections.Counter()
  for us, kname, _ in kernels: by_kind[kname.split("_")[0]] += us
  by_op: collections.Counter[str] = collections.Counter()
  for us, op, _ in nodes: by_op[op] += us
  print("-- per kind (ms): tiny", {k: round(v / 1e3, 2) for k, v in by_kind.most_common()},
        "| onnxruntime", {k: round(v / 1e3, 2) for k, v in by_op.most_common()})


if __name__ == "__main__":
  if sys.argv[1:2] == ["--sequence"]:  # python bench/profile_models.py --sequence efficientnet_b0
    for m in sys.argv[2:] or ["resnet18", "mobilenet_v3_small", "efficientnet_b0"]: print_sequence(m)
  elif sys.argv[1:2] == ["--threads"]:  # CPU_THREADS=2 python bench/profile_models.py --threads mobilenet_v3_small
    for m in sys.argv[2:] or ["mobilenet_v3_small", "efficientnet_b0"]: print_thread_split(m)
  else:
    for m in sys.argv[1:] or ["resnet18", "mobilenet_v3_small", "efficientnet_b0"]: profile(m)
