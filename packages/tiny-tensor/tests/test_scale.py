"""Real-model scale: deep graphs, kernel counts of fused ops, and a transformer training step.

- a 10,000-op chain through the Tensor API realizes right (no recursion; the scheduler splits it every 512 ops);
- conv2d is one kernel; `(a@b).sum()` splits the matmul from the sum (a reduce of a reduce into few outputs) and
  matches numpy;
- a 2-layer GPT training step (AdamW) runs no more kernels than tinygrad 0.14.0 runs for the same model (measured
  with bench/bench_gpt.py's tinygrad twin: 226 at d=128; the bound is structural, so this runs a smaller one), and
  every LayerNorm keeps its own weight buffer.
Times are measured in bench/ (bench_gpt.py, bench_schedule.py), never asserted here. What is checked is the
scheduler's, whatever the device: these run on the CPU in every session (an emulated GPU would take minutes over the
GPT step).
"""
from __future__ import annotations

import numpy as np
import pytest
from tiny_tensor import Tensor, TinyJit, nn
from tiny_uop import Context
from tiny_tensor.engine import GlobalCounters, buffer_view
from tiny_tensor.nn.state import get_parameters


@pytest.fixture(autouse=True)
def _on_cpu():
  with Context(DEV="CPU"): yield


def test_10000_op_chain_realizes():
  x = np.arange(8, dtype=np.float32)
  y = Tensor(x)
  for _ in range(10_000): y = y + 1.0
  np.testing.assert_array_equal(y.numpy(), x + 10_000)


def test_deep_chain_of_mixed_ops_and_its_gradient():
  x = np.linspace(-1, 1, 16, dtype=np.float32)
  t = Tensor(x, requires_grad=True)
  y, ref, d = t, x.copy(), np.ones_like(x)
  for i in range(1500):
    if i % 3 == 0: y, ref, d = y * 0.999, ref * np.float32(0.999), d * 0.999
    elif i % 3 == 1: y, ref = y + 0.001, ref + np.float32(0.001)
    else: y, ref, d = y.maximum(-10.0), np.maximum(ref, np.float32(-10.0)), d
  y.sum().backward()
  np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(t.grad.numpy(), d, rtol=1e-4)


def test_conv2d_is_one_kernel_and_a_weight_copy():
  # the whole conv (windows, padding, products, sum) is one kernel; the weight is first copied output-channels-last
  # (a kernel over its 108 elements) so the conv's weight loads are contiguous across output channels
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((2, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  y = Tensor(x).realize().conv2d(Tensor(w).realize(), padding=1)
  sched = y.schedule()
  assert len(sched.kernels) == 2
  assert sorted(max(b.arg for b in c.src[1:]) for c in sched.calls) == [4 * 3 * 3 * 3, 2 * 4 * 9 * 9]
  import torch
  np.testing.assert_allclose(y.numpy(), torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy(),
                             rtol=1e-4, atol=1e-4)


def test_sum_of_matmul_splits_into_a_parallel_matmul_then_a_sum():
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((128, 256)).astype(np.float32)
  A, B = Tensor(a).realize(), Tensor(b).realize()
  s = (A @ B).sum()
  kernels = s.schedule().kernels
  assert len(kernels) == 2  # the matmul's 65536 outputs in parallel, then their sum
  matmul_ast = kernels[0].src[0]
  assert len([u for u in matmul_ast.toposort() if u.op.name == "STORE"]) == 1
  np.testing.assert_allclose(s.item(), (a.astype(np.float64) @ b).sum(), rtol=1e-4)
  # a small inner reduce still fuses: one kernel
  assert len((Tensor(a[:8, :8]).realize().sum(1)).sum().schedule().kernels) == 1


D, H, T, B, V, L = 32, 2, 16, 2, 64, 2


class _Block:
  def __init__(self) -> None:
    self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
    self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
    self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

  def __call__(self, x: Tensor) -> Tensor:
    q, k, v = self.qkv(self.ln1(x)).reshape(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
    x = x + self.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, D))
    return x + self.fc2(self.fc1(self.ln2(x)).gelu())


class _GPT:
  def __init__(self) -> None:
    self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
    self.blocks = [_Block() for _ in range(L)]
    self.lnf, self.head = nn.LayerNorm(D), nn.Linear(D, V)

  def __call__(self, idx: Tensor) -> Tensor:
    x = self.wte(idx) + self.wpe(Tensor.arange(T).reshape(1, T))
    for b in self.blocks: x = b(x)
    return self.head(self.lnf(x))


TINYGRAD_KERNELS_PER_STEP = 226  # tinygrad 0.14.0, the same 2-layer GPT step (bench/bench_gpt.py), DEV=CPU


def test_gpt_training_step_kernels_and_loss():
  Tensor.manual_seed(0)
  model = _GPT()
  opt = nn.optim.AdamW(get_parameters(model), lr=1e-2)
  weights = [buffer_view(b.ln1.weight.uop) for b in model.blocks] + [buffer_view(model.lnf.weight.uop)]
  assert all(w is not None for w in weights) and len({w[0] for w in weights}) == len(weights)  # own buffers
  rng = np.random.default_rng(0)
  X = Tensor(rng.integers(0, V, (B, T)).astype(np.int32))
  Y = Tensor(rng.integers(0, V, (B, T)).astype(np.int32))

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()
  losses, kernels = [], []
  for _ in range(4):
    GlobalCounters.reset()
    losses.append(step(X, Y).item())
    kernels.append(GlobalCounters.kernel_count)
  assert kernels[1] == kernels[2] == kernels[3] <= TINYGRAD_KERNELS_PER_STEP, kernels  # captured == replayed
  assert abs(losses[0] - np.log(V)) < 0.5 and losses[3] < losses[0] - 0.05, losses  # it learns


def test_engine_program_cache_is_bounded(monkeypatch):
  from tiny_tensor import engine
  monkeypatch.setattr(engine, "PROGRAM_CACHE_MAX", 3)
  x = Tensor(np.arange(5, dtype=np.float32)).realize()
  for k in range(6):  # six different kernels
    np.testing.assert_array_equal((x * (k + 2) + k).numpy(), np.arange(5, dtype=np.float32) * (k + 2) + k)
  assert len(engine._program_cache) <= 3
