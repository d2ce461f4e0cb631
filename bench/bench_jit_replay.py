"""Host cost of TinyJit replays on the CPU (issue #39).

- `chain`: a jitted function of N tiny dependent kernels (N = 1, 10, 100; 16 floats each): best µs per replay over
  rounds of `BENCH_JIT_REPLAY_CALLS` replays (default 200), and µs per kernel.
- `models`: bench_models' tiny GPT-2 and mobilenet_v3_small through `OnnxRunner(jit=True)`: median ms of one
  inference (`BENCH_MODELS_RUNS`, default 10), and the sum of its kernels' times (each kernel launched alone with
  `wait=True`, on a `JIT=2` capture of the same model): the rest is host cost (Python, ctypes, pool wake-ups).

Each figure is printed with the CPU graph (`CPUGraph`, default) and without (`JIT=2`: kernel by kernel, the replay
before the graph existed). Run: `python bench/bench_jit_replay.py [chain] [models]` (default both); `run()` (for
`bench/run.py`) gives the chain rows only.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("DEV", "CPU")


def chain(n: int) -> tuple[Any, Any]:
  """A jitted function of `n` dependent kernels (each `.contiguous()` ends one) and its input."""
  from tiny_tensor import Tensor, TinyJit

  @TinyJit
  def f(x: Tensor) -> Tensor:
    for _ in range(n): x = (x * 1.0001 + 1).contiguous()
    return x
  return f, Tensor(np.ones(16, np.float32)).realize()


def replay_us(f: Any, x: Any, calls: int, rounds: int = 3) -> float:
  """Best µs per replay of the captured jitted chain `f` on `x` (the input stays the same buffer)."""
  best = float("inf")
  for _ in range(rounds):
    st = time.perf_counter()
    for _ in range(calls): f(x)
    best = min(best, (time.perf_counter() - st) / calls)
  return best * 1e6


def bench_chain(calls: int = int(os.environ.get("BENCH_JIT_REPLAY_CALLS", "200"))) -> dict[int, dict[int, float]]:
  """{N: {JIT level: best µs per replay}} for N = 1, 10, 100 kernels, with (1) and without (2) the CPU graph, timed
  in turns."""
  from tiny_uop.helpers import Context
  out: dict[int, dict[int, float]] = {}
  for n in (1, 10, 100):
    fs = {}
    for jit in (1, 2):
      with Context(JIT=jit):  # the replay plan (graph or not) is made at the capture
        f, x = fs[jit] = chain(n)
        for _ in range(3): f(x)  # run, capture, first replay
      assert f.captured.kernel_count == n, f"the chain has {f.captured.kernel_count} kernels, expected {n}"
    best = out[n] = {jit: float("inf") for jit in fs}
    for _ in range(3):
      for jit in fs: best[jit] = min(best[jit], replay_us(*fs[jit], calls))
  return out


def run() -> dict[str, dict[str, Any]]:
  """bench/run.py's rows: µs per replay of the N-kernel chains, `tiny` (the CPU graph) next to `tiny_no_graph`."""
  return {f"jit replay, {n} tiny kernels (us)": {"tiny": r[1], "tiny_no_graph": r[2], "unit": "us", "better": "lower"}
          for n, r in bench_chain().items()}


def kernel_ms(runner: Any, feeds: dict[str, np.ndarray]) -> tuple[float, int]:
  """(ms, kernels): the sum of the kernel times of one replay of `runner` (a JIT=2 capture), each launched alone."""
  import tiny_tensor.jit as jit
  total, count, orig = [0.0], [0], jit._KernelCall.run

  def timed(self: Any, dyn: list, var_vals: dict[str, int]) -> None:
    args = [dyn[r]._buf if isinstance(r, int) else a for r, a in zip(self.refs, self.args)]
    gs, ls = self.launch(var_vals)
    total[0] += self.prg(*args, global_size=gs, local_size=ls, vals=tuple(var_vals.get(n, v) for n, v in self.vars),
                         wait=True)
    count[0] += 1
  jit._KernelCall.run = timed  # type: ignore[method-assign]
  try:
    best = float("inf")
    for _ in range(5):
      total[0], count[0] = 0.0, 0
      runner(feeds)["y"].numpy()
      best = min(best, total[0])
  finally: jit._KernelCall.run = orig  # type: ignore[method-assign]
  return best * 1e3, count[0]


def bench_models(names: tuple[str, ...] = ("gpt2_tiny", "mobilenet_v3_small")) -> None:
  """Print each model's jit inference ms with and without the graph, and its kernels' summed time."""
  import tempfile

  sys.path.insert(0, os.path.dirname(__file__))
  import bench_models as bm
  from tiny_tensor.nn.onnx import OnnxRunner
  from tiny_uop.helpers import Context
  for name in names:
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, f"{name}.onnx")
      _, feeds = bm.export_model(name, path)
      runners = {}
      for level in (1, 2):
        with Context(JIT=level):
          runners[level] = OnnxRunner(path, jit=True)
          outs = [runners[level](feeds)["y"].numpy() for _ in range(3)]
      np.testing.assert_allclose(outs[-1], runners[1](feeds)["y"].numpy(), rtol=1e-5, atol=1e-5)
    ms = {lv: float("inf") for lv in runners}
    for _ in range(3):  # in turns (graph, no graph, ...), the best median of each
      for lv, r in runners.items(): ms[lv] = min(ms[lv], bm._median_ms(lambda r=r, f=feeds: r(f)["y"].numpy(), bm.RUNS))
    k_ms, k_n = kernel_ms(runners[2], feeds)
    for lv in (1, 2):
      print(f"{name:20s} JIT={lv}: {ms[lv]:7.2f} ms/inference; kernels {k_n}: {k_ms:6.2f} ms; "
            f"not kernel time: {ms[lv] - k_ms:6.2f} ms ({(ms[lv] - k_ms) / ms[lv]:.0%})")


if __name__ == "__main__":
  what = sys.argv[1:] or ["chain", "models"]
  if "chain" in what:
    for n, r in bench_chain().items():
      for jit, us in r.items(): print(f"chain N={n:4d} JIT={jit}: {us:9.1f} us/replay  {us / n:7.2f} us/kernel")
  if "models" in what: bench_models()
