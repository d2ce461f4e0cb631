"""1024x1024 float32 matmul throughput, and the compile latency of one kernel.

1. GFLOPS of `a @ b` (1024^3, float32) through `Tensor` with the hand-coded optimizations (no BEAM), the best call
   of 3 rounds in which the libraries take turns (each: a pause, a warm-up, 5 calls); side by side with numpy, torch
   (CPU, default threads) and tinygrad when importable.
   Target: tiny >= 0.9x numpy (issue #23); sizes other than 1024 as arguments (below).
2. GFLOPS of the same product in bfloat16 (float32 sums, a bfloat16 result) through `Tensor`, beside torch's bfloat16
   matmul (oneDNN: AMX or AVX512-BF16 where the CPU runs them), in turns likewise; the sizes of 1. that 32 divides.
   Target (issue #39): tiny >= 1.0x torch.
3. ms to schedule + lower + render + compile a fused elementwise+reduce kernel (`((a * b + c).exp2() * k).sum(1)`
   on 64x64), median of several, with the disk cache off (`CACHELEVEL=0`). Each repetition uses a different
   constant `k`, so every one is a new kernel (no in-memory cache hit either). Target: <= 30 ms.

4. Skinny products (issue #39): (M x K) @ (K x N) float32 for M in `SKINNY_ROWS` (decode's 1 row, a few, a 32-token
   prefill chunk, a 64-token ONNX sequence) and (K, N) from the LLM bench model (768, 2048) and a tiny transformer
   (128, 512) (`SKINNY_KN`), and the LLM's through nn.Linear's layout (`x @ w.T`, `LINEAR_ROWS` x `LINEAR_KN`),
   tiny vs numpy vs torch in turns as in 1. Their GFLOPS are whole calls: a product of a
   few MFLOP takes tens of us, so tiny's per-call dispatch (~0.2 ms on the loaded VM) weighs there; "tiny jit" runs
   the same product through `TinyJit` (the kernel and a replay, as an LLM's or ONNX model's jitted step runs it).
   With no arguments the script prints them after 1.-3.; `--skinny` prints only these rows.
   Target: tiny >= 0.9x the faster of numpy and torch.

`python bench/bench_matmul.py [N ...]` prints the rows (N: the matmul sizes, 1024 by default; e.g. `1024 4096`; with
`BEAM=n` tiny uses BEAM's winners, e.g. those `python -m tiny_tensor.tune` cached) and the CPU's name and machine
model (`tiny_codegen.machine`: the heuristics' cache thresholds derive from it); `run()` returns them for
bench/run.py. Target (issue #39): 1024^2 and 4096^2 >= 0.9x the faster of numpy and torch.
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
from settle import time_in_turns  # noqa: E402

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU: with an OpenCL ICD installed (PoCL)
                                    # tinygrad would otherwise pick CL

N = 1024
REPS = 5
ROUNDS = 3


def _gflops_in_turns(fns: dict[str, Callable[[], Any]], n: int = N) -> dict[str, float]:
  """GFLOPS of each library's best call, the libraries timed in turns (`settle.time_in_turns`: `ROUNDS` rounds of
  `settle()`, `warm_up`, `REPS` calls). Best of one library's 5 calls in a row read 101 GFLOPS for tiny where numpy's
  5, taken a second later, read 190 (the same code at 192-205 in turns); in turns a slow spell hits both."""
  flop = 2 * n ** 3
  return {name: flop / min(t) / 1e9 for name, t in time_in_turns(fns, ROUNDS, REPS).items()}


def _inputs(n: int = N, m: int | None = None, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Random float32 (m x k) and (k x n) operands; `m` and `k` default to `n` (a square product)."""
  rng = np.random.default_rng(0)
  m, k = n if m is None else m, n if k is None else k
  return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


SKINNY_ROWS = (1, 8, 32, 64)
SKINNY_KN = ((768, 768), (768, 2048), (2048, 768), (128, 512), (512, 128))
LINEAR_ROWS = (8, 32)  # the LLM's (K, N) also through nn.Linear's layout, x @ w.T (w: N x K)
LINEAR_KN = ((768, 768), (768, 2048), (2048, 768))


def skinny_fns(m: int, k: int, n: int, linear: bool = False) -> dict[str, Callable[[], Any]]:
  """The (m x k) @ (k x n) float32 product of each library (tiny, tiny through TinyJit, numpy, torch when importable),
  tiny's checked against numpy first; `linear`: B is the transposed view of a contiguous (n x k) weight."""
  from tiny_tensor import Tensor, TinyJit
  a, b = _inputs(n, m, k)
  if linear: b = np.ascontiguousarray(b.T).T
  ta, tb = Tensor(a).realize(), (Tensor(np.ascontiguousarray(b.T)).realize().T if linear else Tensor(b).realize())
  want = a @ b
  if not np.allclose((ta @ tb).numpy(), want, rtol=1e-3, atol=1e-3 * np.sqrt(k)):
    raise AssertionError(f"tiny {m}x{k}x{n} matmul is wrong")
  jitted = TinyJit(lambda x, y: (x @ y).realize())
  for _ in range(3): got = jitted(ta, tb)  # capture, then replay
  if not np.allclose(got.numpy(), want, rtol=1e-3, atol=1e-3 * np.sqrt(k)):
    raise AssertionError(f"tiny jit {m}x{k}x{n} matmul is wrong")
  fns: dict[str, Callable[[], Any]] = {"tiny": lambda: (ta @ tb).realize(), "tiny jit": lambda: jitted(ta, tb),
                                       "numpy": lambda: a @ b}
  try:
    import torch
    xa, xb = torch.from_numpy(a), torch.from_numpy(b)
    fns["torch"] = lambda: xa @ xb
  except ImportError: pass
  return fns


def run_skinny(rows: tuple[int, ...] = SKINNY_ROWS, kn: tuple[tuple[int, int], ...] = SKINNY_KN
               ) -> dict[str, dict[str, Any]]:
  """One row per (M, (K, N)): GFLOPS of tiny, tiny jit, numpy, torch (in turns), and tiny's ratio to the faster of
  numpy and torch ("ratio": plain calls; "jit ratio": through TinyJit)."""
  out: dict[str, dict[str, Any]] = {}
  for k, n in kn:
    for m in rows:
      out[f"matmul {m}x{k} @ {k}x{n} float32, no BEAM"] = _skinny_row(skinny_fns(m, k, n), 2 * m * k * n)
  for k, n in LINEAR_KN:
    for m in LINEAR_ROWS:
      out[f"matmul {m}x{k} @ ({n}x{k}).T float32, no BEAM"] = _skinny_row(skinny_fns(m, k, n, True), 2 * m * k * n)
  return out


def _skinny_row(fns: dict[str, Callable[[], Any]], flop: int) -> dict[str, Any]:
  row: dict[str, Any] = {"unit": "GFLOPS", "better": "higher", "target": "tiny >= 0.9x the faster of numpy, torch"}
  got = {name: flop / min(t) / 1e9 for name, t in time_in_turns(fns, ROUNDS, REPS).items()}
  row.update(got)
  best = max(v for name, v in got.items() if name in ("numpy", "torch"))
  row["ratio"], row["jit ratio"] = got["tiny"] / best, got["tiny jit"] / best
  return row


def cpu_name() -> str:
  """The CPU's model name and family/model from /proc/cpuinfo (bench figures name the CPU they came from)."""
  info: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, val = line.partition(":")
        info.setdefault(key.strip(), val.strip())
  except OSError: return "unknown CPU"
  return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')})"


def tiny_matmul(n: int = N) -> Callable[[], Any]:
  from tiny_tensor import Tensor
  a, b = _inputs(n)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  got = (ta @ tb).numpy()
  if not np.allclose(got, a @ b, rtol=1e-3, atol=1e-2): raise AssertionError("tiny matmul is wrong")
  return lambda: (ta @ tb).realize()


def numpy_matmul(n: int = N) -> Callable[[], Any]:
  a, b = _inputs(n)
  return lambda: a @ b


def torch_matmul(n: int = N) -> Callable[[], Any]:
  import torch
  a, b = (torch.from_numpy(x) for x in _inputs(n))
  return lambda: a @ b


def tiny_matmul_bf16(n: int = N) -> Callable[[], Any]:
  from tiny_tensor import Tensor, dtypes
  a, b = _inputs(n)
  ta, tb = Tensor(a).cast(dtypes.bfloat16).realize(), Tensor(b).cast(dtypes.bfloat16).realize()
  got = (ta @ tb).float().numpy()
  want = _bf16(a) @ _bf16(b)  # bfloat16 inputs, float32 sums, one rounding: bfloat16's step at the largest value
  if not np.allclose(got, want, rtol=0, atol=2 ** -7 * float(np.abs(want).max())):
    raise AssertionError("tiny bfloat16 matmul is wrong")
  return lambda: (ta @ tb).realize()


def _bf16(x: np.ndarray) -> np.ndarray:
  """float32 -> the nearest bfloat16 values (ties to even), as float32."""
  bits = x.view(np.uint32).astype(np.uint64)
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def torch_matmul_bf16(n: int = N) -> Callable[[], Any]:
  import torch
  a, b = (torch.from_numpy(x).bfloat16() for x in _inputs(n))
  return lambda: a @ b


def tinygrad_matmul(n: int = N) -> Callable[[], Any]:
  from tinygrad import Device, Tensor  # type: ignore[import-not-found]
  dev = Device[Device.DEFAULT]  # its CPU queue runs kernels asynchronously: time until they are done
  ta, tb = (Tensor(x).realize() for x in _inputs(n))
  return lambda: ((ta @ tb).realize(), dev.synchronize())


def tiny_compile_ms(reps: int = 15) -> float:
  """Median ms of schedule + lower + render + compile for a new fused elementwise+reduce kernel."""
  from tiny_codegen import get_program
  from tiny_codegen.schedule import create_schedule
  from tiny_tensor import Tensor
  from tiny_uop.helpers import Context
  from tiny_uop.plugins import Device
  from tiny_uop.uop import UOp
  renderer = Device["CPU"].renderer
  a, b, c = (Tensor.empty(64, 64) for _ in range(3))
  times = []
  with Context(CACHELEVEL=0):
    for i in range(reps + 1):
      out = ((a * b + c).exp2() * (1.0 + i / 1024)).sum(1)
      st = time.perf_counter()
      sched = create_schedule(UOp.sink(out.uop))
      for call in sched.kernels: get_program(call.src[0], renderer)
      if i: times.append(time.perf_counter() - st)  # the first one also warms imports
      if len(sched.kernels) != 1: raise AssertionError(f"expected one fused kernel, got {len(sched.kernels)}")
  return statistics.median(times) * 1e3


def run(sizes: tuple[int, ...] = (N,), compile_latency: bool = True,
        libs: tuple[str, ...] = ("torch", "tinygrad"), bf16_sizes: tuple[int, ...] = (N,)) -> dict[str, dict[str, Any]]:
  """The rows: one float32 matmul row per size in `sizes` (tiny, numpy and those of `libs` importable), a bfloat16
  one (tiny and torch) per size in `bf16_sizes`, then the compile latency when `compile_latency`."""
  out: dict[str, dict[str, Any]] = {}
  makers = {"torch": torch_matmul, "tinygrad": tinygrad_matmul}
  for n in sizes:
    mm: dict[str, Any] = {"unit": "GFLOPS", "better": "higher", "target": "tiny >= 0.9x the faster of numpy, torch"}
    fns = {"tiny": tiny_matmul(n), "numpy": numpy_matmul(n)}
    for name in libs:
      # tinygrad's CPU device compiles with clang: without it on PATH its column says so instead of failing the bench
      if name == "tinygrad" and shutil.which("clang") is None:
        mm[name] = "n/a (its CPU device compiles with clang: not on PATH)"
        continue
      try: fns[name] = makers[name](n)
      except ImportError: pass
    mm.update(_gflops_in_turns(fns, n))
    out[f"matmul {n}x{n} float32, no BEAM"] = mm
  for n in bf16_sizes:
    row: dict[str, Any] = {"unit": "GFLOPS", "better": "higher", "target": "tiny >= 1.0x torch (issue #39)"}
    fns = {"tiny": tiny_matmul_bf16(n)}
    try: fns["torch"] = torch_matmul_bf16(n)
    except ImportError: pass
    row.update(_gflops_in_turns(fns, n))
    out[f"matmul {n}x{n} bfloat16 (float32 sums), no BEAM"] = row
  if compile_latency:
    comp: dict[str, Any] = {"unit": "ms", "better": "lower", "target": "tiny <= 30 ms median"}
    comp["tiny"] = tiny_compile_ms()
    out["compile latency, elementwise+reduce, CACHELEVEL=0"] = comp
  return out


if __name__ == "__main__":
  import importlib
  import importlib.util
  skinny = "--skinny" in sys.argv[1:]
  sizes = tuple(int(a) for a in sys.argv[1:] if a != "--skinny")
  skinny = skinny or not sizes  # no arguments: 1024 and the skinny rows
  sizes = sizes or (() if "--skinny" in sys.argv[1:] else (N,))
  has_model = importlib.util.find_spec("tiny_codegen.machine") is not None  # a checkout from before the model: none
  print(cpu_name(), importlib.import_module("tiny_codegen.machine").host_machine() if has_model else "")
  # the compile latency is the no-BEAM path's (with BEAM set, CACHELEVEL=0 would search every new kernel)
  latency = sizes == (N,) and not int(os.environ.get("BEAM", "0") or 0)
  bf16 = tuple(n for n in sizes if n % 32 == 0)  # the AMX tile kernel's sizes (others: the float32 kernel)
  rows = run(sizes, compile_latency=latency, libs=("torch",), bf16_sizes=bf16) if sizes else {}
  for case, r in {**rows, **(run_skinny() if skinny else {})}.items():
    print(case, "  ".join(f"{k}={v:.{2 if 'ratio' in k else 1}f}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in r.items() if k not in ("unit", "better", "target")))
  sys.exit(0)
