"""Scheduling time of a ResNet-18 forward + backward graph (batch 2, 64x64 images), tiny vs tinygrad when installed,
and the time to realize a 10,000-op chain (`y = y + 1.0` 10,000 times, then `.numpy()`: build, schedule, compile,
run; checked against numpy). Target for the chain: under a minute.

`run()` returns {case: {implementation: seconds, "unit": "s"}} for bench/run.py; `python bench/bench_schedule.py` prints
it. Measured: building the graph is not counted; the first schedule (empty cache) and a repeat of the same structure
with new buffers (what a training step costs after the first one).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("DEV", "CPU")  # tiny and tinygrad both on the CPU: with an OpenCL ICD installed (PoCL)
                                    # tinygrad would otherwise pick CL


def resnet18_step(Tensor: Any, batch: int = 2, size: int = 64, classes: int = 10) -> tuple[Any, list[Any]]:
  """The loss of one ResNet-18 step and the parameters (with gradients requested); works with tiny and tinygrad."""
  rng = np.random.default_rng(0)
  params: list[Any] = []

  def p(*shape: int) -> Any:
    t = Tensor(rng.standard_normal(shape).astype(np.float32) * 0.05)
    if hasattr(t, "requires_grad_"): t.requires_grad_()  # tinygrad 0.14 has no flag: backward reaches every param
    params.append(t)
    return t

  def bn(x: Any, c: int) -> Any:
    w, b = p(c), p(c)
    mean = x.mean(axis=(0, 2, 3), keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(axis=(0, 2, 3), keepdim=True)
    return xc * (var + 1e-5).rsqrt() * w.reshape(1, c, 1, 1) + b.reshape(1, c, 1, 1)

  def block(x: Any, cin: int, cout: int, stride: int) -> Any:
    out = bn(x.conv2d(p(cout, cin, 3, 3), stride=stride, padding=1), cout).relu()
    out = bn(out.conv2d(p(cout, cout, 3, 3), padding=1), cout)
    short = x if stride == 1 and cin == cout else bn(x.conv2d(p(cout, cin, 1, 1), stride=stride), cout)
    return (out + short).relu()

  x = Tensor(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
  x = bn(x.conv2d(p(64, 3, 7, 7), stride=2, padding=3), 64).relu().max_pool2d(kernel_size=(2, 2))
  cin = 64
  for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
    x = block(block(x, cin, cout, stride), cout, cout, 1)
    cin = cout
  logits = x.mean(axis=(2, 3)) @ p(512, classes) + p(classes)
  y = Tensor(np.eye(classes, dtype=np.float32)[rng.integers(0, classes, batch)])
  loss = -(logits.log_softmax(-1) * y).sum(-1).mean()
  loss.backward()
  return loss, [t.grad for t in params]


def _time_tiny() -> dict[str, float]:
  from tiny_tensor import Tensor
  from tiny_uop import Ops, UOp
  from tiny_codegen.schedule import clear_schedule_cache, create_schedule
  out: dict[str, float] = {}
  loss, grads = resnet18_step(Tensor)
  sink = UOp.sink(loss.uop, *[g.uop for g in grads])
  clear_schedule_cache()
  t0 = time.perf_counter()
  sched = create_schedule(sink)
  out["first"] = time.perf_counter() - t0
  out["kernels"] = float(sum(c.src[0].op is Ops.SINK for c in sched.calls))
  out["nodes"] = float(len(sink.toposort()))
  loss2, grads2 = resnet18_step(Tensor)  # same structure, new buffers
  sink2 = UOp.sink(loss2.uop, *[g.uop for g in grads2])
  t0 = time.perf_counter()
  create_schedule(sink2)
  out["cached"] = time.perf_counter() - t0
  return out


def _time_tinygrad() -> dict[str, float] | None:
  try:
    from tinygrad import Tensor  # type: ignore[import-not-found]
  except ImportError:
    return None
  out: dict[str, float] = {}
  loss, grads = resnet18_step(Tensor)
  schedule = getattr(Tensor, "schedule_linear", None) or Tensor.schedule
  t0 = time.perf_counter()
  sched = schedule(loss, *grads)
  out["first"] = time.perf_counter() - t0
  items = list(sched.src) if hasattr(sched, "src") else list(sched)
  out["kernels"] = float(sum(1 for c in items if getattr(getattr(c, "src", [None])[0], "op", None) is not None
                             and c.src[0].op.name == "SINK") or len(items))
  loss2, grads2 = resnet18_step(Tensor)
  t0 = time.perf_counter()
  schedule(loss2, *grads2)
  out["cached"] = time.perf_counter() - t0
  return out


CHAIN = 10_000


def _chain_seconds(Tensor: Any) -> float:
  """Seconds to build and realize a CHAIN-op chain of `+ 1.0` (from scratch, caches as they are)."""
  x = np.arange(8, dtype=np.float32)
  t0 = time.perf_counter()
  y = Tensor(x)
  for _ in range(CHAIN): y = y + 1.0
  got = y.numpy()
  dt = time.perf_counter() - t0
  if not np.array_equal(got, x + CHAIN): raise AssertionError(f"the {CHAIN}-op chain computed {got}")
  return dt


def run() -> dict[str, dict[str, Any]]:
  """ResNet-18 forward+backward: scheduling seconds (first and repeated) and kernel count, tiny vs tinygrad; the
  10,000-op chain's seconds."""
  from tiny_tensor import Tensor as TinyTensor
  chain: dict[str, Any] = {"tiny": _chain_seconds(TinyTensor), "unit": "s", "better": "lower",
                           "target": "tiny < 60 s"}
  try:
    from tinygrad import Tensor as TgTensor  # type: ignore[import-not-found]
  except ImportError: pass
  else: chain["tinygrad"] = _chain_seconds(TgTensor)
  tiny = _time_tiny()
  tg = _time_tinygrad()
  rows: dict[str, dict[str, Any]] = {}
  for case, unit, better in [("first", "s", "lower"), ("cached", "s", "lower"), ("kernels", "", "lower")]:
    row: dict[str, Any] = {"tiny": tiny[case], "unit": unit, "better": better}
    if tg is not None: row["tinygrad"] = tg[case]
    rows[f"resnet18 fwd+bwd schedule: {case}"] = row
  rows["resnet18 fwd+bwd graph nodes"] = {"tiny": tiny["nodes"], "unit": "", "better": "none"}
  rows[f"{CHAIN}-op chain: build + realize"] = chain
  return rows


if __name__ == "__main__":
  for k, v in run().items(): print(f"{k:45s} {v}")
  sys.exit(0)
