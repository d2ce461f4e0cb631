"""Training step of a small GPT (d=128, 4 heads, T=64, batch 4, vocab 256, AdamW), 2 and 12 layers, side by side
with tinygrad (TinyJit, its CPU backend) and torch (eager, CPU).

Rows per model size:
1. the first two steps (step 1 runs and compiles everything, step 2 is TinyJit's capture), seconds from a cold start:
   each implementation runs in a fresh process with its compile caches off (`CACHELEVEL=0`), after imports and model
   setup. Targets: 2-layer tiny <= 0.25x tinygrad's; 12-layer tiny <= 30 s;
2. a steady (replayed) step, the median of `BENCH_GPT_STEPS` (default 5), ms. Target: tiny >= 3x faster than tinygrad;
3. kernels per step (a replayed step). Target: tiny <= tinygrad.
Wall-clock seconds; each process also reports its CPU seconds (process and children: tinygrad compiles with clang
subprocesses), printed after the table, which on a machine shared with other work is the steadier figure.

`python bench/bench_gpt.py` prints the rows; `run()` returns them. `BENCH_GPT_LAYERS` (default "2,12") picks sizes;
`python bench/bench_gpt.py --impl tiny --layers 2` runs one measurement and prints it as JSON (what `run()` calls).
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU

D, HEADS, T, B, V = 128, 4, 64, 4, 256
STEPS = int(os.environ.get("BENCH_GPT_STEPS", 5))
LAYERS = [int(x) for x in os.environ.get("BENCH_GPT_LAYERS", "2,12").split(",") if x]


def _data() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  return rng.integers(0, V, (B, T)).astype(np.int32), rng.integers(0, V, (B, T)).astype(np.int32)


def _cpu() -> float:
  ch = resource.getrusage(resource.RUSAGE_CHILDREN)
  return time.process_time() + ch.ru_utime + ch.ru_stime


def _measure(step: Callable[[], None], kernels: Callable[[], int]) -> dict[str, float]:
  """First two steps (s, wall and CPU), then the median steady step (ms) and the kernels of one steady step."""
  w0, c0 = time.perf_counter(), _cpu()
  step()
  step()
  first2, first2_cpu = time.perf_counter() - w0, _cpu() - c0
  step()  # the first replay
  times = []
  for _ in range(STEPS):
    st = time.perf_counter()
    step()
    times.append(time.perf_counter() - st)
  return {"first2": first2, "first2_cpu": first2_cpu, "steady_ms": sorted(times)[len(times) // 2] * 1e3,
          "kernels": kernels()}


# ***** tiny *****
def tiny_gpt(layers: int) -> dict[str, float]:
  from tiny_tensor import Tensor, TinyJit, nn
  from tiny_tensor.engine import GlobalCounters
  from tiny_tensor.nn.state import get_parameters

  class Block:
    def __init__(self) -> None:
      self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
      self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
      self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def __call__(self, x: Tensor) -> Tensor:
      q, k, v = self.qkv(self.ln1(x)).reshape(B, T, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)  # (B, H, T, hd)
      x = x + self.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, D))
      return x + self.fc2(self.fc1(self.ln2(x)).gelu())

  class GPT:
    def __init__(self) -> None:
      self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
      self.blocks = [Block() for _ in range(layers)]
      self.lnf, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def __call__(self, idx: Tensor) -> Tensor:
      x = self.wte(idx) + self.wpe(Tensor.arange(T).reshape(1, T))
      for b in self.blocks: x = b(x)
      return self.head(self.lnf(x))

  Tensor.manual_seed(0)
  model = GPT()
  opt = nn.optim.AdamW(get_parameters(model), lr=1e-3)
  xs, ys = _data()
  x, y = Tensor(xs).realize(), Tensor(ys).realize()

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()

  def kernels() -> int:
    GlobalCounters.reset()
    step(x, y)
    return GlobalCounters.kernel_count
  return _measure(lambda: step(x, y), kernels)


# ***** tinygrad (the same model in its API) *****
def tinygrad_gpt(layers: int) -> dict[str, float]:
  from tinygrad import Device, GlobalCounters, Tensor, TinyJit, nn  # type: ignore[import-not-found]
  from tinygrad.helpers import Context  # type: ignore[import-not-found]

  class Block:
    def __init__(self) -> None:
      self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
      self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
      self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def __call__(self, x: Any) -> Any:
      q, k, v = self.qkv(self.ln1(x)).reshape(B, T, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
      x = x + self.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, D))
      return x + self.fc2(self.fc1(self.ln2(x)).gelu())

  class GPT:
    def __init__(self) -> None:
      self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
      self.blocks = [Block() for _ in range(layers)]
      self.lnf, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def __call__(self, idx: Any) -> Any:
      x = self.wte(idx) + self.wpe(Tensor.arange(T).reshape(1, T))
      for b in self.blocks: x = b(x)
      return self.head(self.lnf(x))

  Tensor.manual_seed(0)
  model = GPT()
  opt = nn.optim.AdamW(nn.state.get_parameters(model), lr=1e-3)
  xs, ys = _data()
  x, y = Tensor(xs).realize(), Tensor(ys).realize()
  dev = Device[Device.DEFAULT]  # its CPU queue runs kernels asynchronously: time until they are done

  @TinyJit
  def step(x: Any, y: Any) -> Any:
    with Context(TRAINING=1):  # 0.14 has no Tensor.train
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      return loss.realize(*opt.schedule_step())

  def kernels() -> int:
    GlobalCounters.reset()
    step(x, y)
    dev.synchronize()
    return GlobalCounters.kernel_count
  return _measure(lambda: (step(x, y), dev.synchronize()), kernels)


# ***** torch (eager) *****
def torch_gpt(layers: int) -> dict[str, float]:
  import torch
  tnn, F = torch.nn, torch.nn.functional

  class Block(tnn.Module):
    def __init__(self) -> None:
      super().__init__()
      self.ln1, self.ln2 = tnn.LayerNorm(D), tnn.LayerNorm(D)
      self.qkv, self.proj = tnn.Linear(D, 3 * D), tnn.Linear(D, D)
      self.fc1, self.fc2 = tnn.Linear(D, 4 * D), tnn.Linear(4 * D, D)

    def forward(self, x: Any) -> Any:
      q, k, v = self.qkv(self.ln1(x)).reshape(B, T, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
      x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D))
      return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

  class GPT(tnn.Module):
    def __init__(self) -> None:
      super().__init__()
      self.wte, self.wpe = tnn.Embedding(V, D), tnn.Embedding(T, D)
      self.blocks = tnn.ModuleList([Block() for _ in range(layers)])
      self.lnf, self.head = tnn.LayerNorm(D), tnn.Linear(D, V)

    def forward(self, idx: Any) -> Any:
      x = self.wte(idx) + self.wpe(torch.arange(T).reshape(1, T))
      for b in self.blocks: x = b(x)
      return self.head(self.lnf(x))

  torch.manual_seed(0)
  model = GPT()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
  xs, ys = _data()
  x, y = torch.from_numpy(xs).long(), torch.from_numpy(ys).long()

  def step() -> None:
    opt.zero_grad()
    F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)).backward()
    opt.step()
  ret = _measure(step, lambda: 0)
  del ret["kernels"]
  return ret


IMPLS = {"tiny": tiny_gpt, "tinygrad": tinygrad_gpt, "torch": torch_gpt}


def _measure_in_subprocess(impl: str, layers: int) -> dict[str, float] | None:
  """One measurement in a fresh process (cold: no compiled kernel cached in memory or, with CACHELEVEL=0, on disk);
  None when the implementation isn't installed."""
  env = {**os.environ, "CACHELEVEL": "0", "DEV": os.environ.get("DEV", "CPU")}
  proc = subprocess.run([sys.executable, __file__, "--impl", impl, "--layers", str(layers)], env=env,
                        capture_output=True, text=True)
  if proc.returncode != 0:
    if "ModuleNotFoundError" in proc.stderr or "ImportError" in proc.stderr: return None
    raise RuntimeError(f"bench_gpt {impl} {layers} layers failed:\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def run() -> dict[str, dict[str, Any]]:
  rows: dict[str, dict[str, Any]] = {}
  cpu_notes = []
  for layers in LAYERS:
    first: dict[str, Any] = {"unit": "s", "better": "lower",
                             "target": "tiny <= 0.25x tinygrad" if layers == 2 else "tiny <= 30 s"}
    steady: dict[str, Any] = {"unit": "ms", "better": "lower", "target": "tiny >= 3x faster than tinygrad"}
    kern: dict[str, Any] = {"unit": "", "better": "lower", "target": "tiny <= tinygrad"}
    for impl in IMPLS:
      if (m := _measure_in_subprocess(impl, layers)) is None: continue
      first[impl], steady[impl] = m["first2"], m["steady_ms"]
      if "kernels" in m: kern[impl] = m["kernels"]
      cpu_notes.append(f"{layers}-layer {impl}: first two steps {m['first2_cpu']:.1f} s CPU")
    rows[f"GPT {layers}L: first two steps"] = first
    rows[f"GPT {layers}L: steady step"] = steady
    rows[f"GPT {layers}L: kernels per step"] = kern
  print("  (" + "; ".join(cpu_notes) + ")")
  return rows


if __name__ == "__main__":
  if "--impl" in sys.argv:
    impl, layers = sys.argv[sys.argv.index("--impl") + 1], int(sys.argv[sys.argv.index("--layers") + 1])
    print(json.dumps(IMPLS[impl](layers)))
  else:
    for case, row in run().items(): print(case, row)
