"""Dynamic shapes under torch.compile(backend="tiny"): one TinyJit capture over tiny Variables serves every size (of
a bucket), against eager torch on the CPU; graphs with ops that can't take symbolic sizes capture per size."""
import logging

import torch
import torch.nn as nn

import tiny_torch  # noqa: F401  (registers the backend)
from tiny_torch import dynamo, symbolic


def _fresh() -> None:
  torch._dynamo.reset()
  dynamo.CompiledGraph.instances.clear()


def _graphs() -> list[dynamo.CompiledGraph]:
  return list(dynamo.CompiledGraph.instances)


def _mlp() -> nn.Module:
  torch.manual_seed(0)
  return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
  return ((q @ k.transpose(-1, -2)) / 2.0).softmax(-1) @ v


def test_mlp_over_batch_sizes_one_capture() -> None:
  _fresh()
  model = _mlp().eval()
  f = torch.compile(model, backend="tiny", dynamic=True)
  with torch.no_grad():
    for bs in (3, 7, 5, 3):
      x = torch.randn(bs, 4)
      torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
  (g,) = _graphs()
  assert g.symbolic is not None, g.symbolic_fallback
  assert [j.cnt for j in g.symbolic.captures.values()] == [4]  # one TinyJit: run, capture, 2 replays


def test_attention_over_sequence_lengths_one_capture() -> None:
  _fresh()
  f = torch.compile(_attention, backend="tiny", dynamic=True)
  for s in (3, 9, 6, 12):
    q, k, v = (torch.randn(2, s, 4) for _ in range(3))
    torch.testing.assert_close(f(q, k, v), _attention(q, k, v), atol=1e-5, rtol=1e-5)
  (g,) = _graphs()
  assert g.symbolic is not None and len(g.symbolic.captures) == 1
  assert list(g.symbolic.captures.values())[0].cnt == 4


def test_automatic_dynamic_after_second_size() -> None:
  """Without dynamic=True Dynamo recompiles with a dynamic batch dim at the second size: that graph is symbolic."""
  _fresh()
  model = _mlp().eval()
  f = torch.compile(model, backend="tiny")
  with torch.no_grad():
    for bs in (2, 3, 5, 6, 9):
      x = torch.randn(bs, 4)
      torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
  sym = [g for g in _graphs() if g.symbolic is not None]
  assert len(sym) == 1 and len(sym[0].symbolic.captures) == 1 and list(sym[0].symbolic.captures.values())[0].cnt == 4


def test_larger_size_opens_a_new_bucket() -> None:
  _fresh()
  f = torch.compile(_attention, backend="tiny", dynamic=True)
  for s in (3, 5, 40):
    q, k, v = (torch.randn(2, s, 4) for _ in range(3))
    torch.testing.assert_close(f(q, k, v), _attention(q, k, v), atol=1e-5, rtol=1e-5)
  (g,) = _graphs()
  assert sorted(g.symbolic.captures) == [(16, 16, 16), (16, 64, 16)]
  assert symbolic.bucket(40) == 64 and symbolic.bucket(1) == symbolic.MIN_BOUND


def test_unsupported_op_falls_back_to_a_capture_per_size(caplog) -> None:
  _fresh()

  def f(x: torch.Tensor) -> torch.Tensor: return torch.cumsum(x, 0) * 2

  cf = torch.compile(f, backend="tiny", dynamic=True)
  with caplog.at_level(logging.DEBUG, logger="tiny_torch.dynamo"):
    for n in (3, 5, 7, 3, 5, 7):
      x = torch.randn(n, 4)
      torch.testing.assert_close(cf(x), f(x), atol=1e-5, rtol=1e-5)
  (g,) = _graphs()
  assert g.symbolic is None and "cumsum" in g.symbolic_fallback
  assert "falls back to a TinyJit capture per size" in caplog.text
  assert len(g.jits) == 3  # one per size (each size's first call runs eagerly): the fallback, counted


def test_training_step_with_dynamic_batch_matches_eager() -> None:
  _fresh()
  ref = _mlp()
  got = torch.compile(_mlp(), backend="tiny", dynamic=True)
  opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
  opt_g = torch.optim.SGD(got.parameters(), lr=0.1)
  for bs in (3, 6, 4):
    x, y = torch.randn(bs, 4), torch.randn(bs, 3)
    for m, opt in ((ref, opt_r), (got, opt_g)):
      opt.zero_grad()
      nn.functional.mse_loss(m(x), y).backward()
      opt.step()
  for a, b in zip(ref.parameters(), got.parameters()):
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
  fw = [g for g in _graphs() if g.n_user is not None]
  bw = [g for g in _graphs() if g.n_user is None]
  # the forward (its saved input returned as itself) and the backward (relu's mask, the bias gradient's as_strided
  # that only reshapes, None gradients) run over Variables
  for g in fw + bw:
    assert g.symbolic is not None, g.symbolic_fallback
    assert [j.cnt for j in g.symbolic.captures.values()] == [3]
  assert len(fw) == 1 and len(bw) == 1


def test_sum_over_the_dynamic_dim() -> None:
  _fresh()

  def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor: return (x * w).sum(0) + x.sum(1).sum(0)

  cf = torch.compile(f, backend="tiny", dynamic=True)
  w = torch.randn(4)
  for n in (3, 6, 11):
    x = torch.randn(n, 4)
    torch.testing.assert_close(cf(x, w), f(x, w), atol=1e-5, rtol=1e-5)
  (g,) = _graphs()
  assert g.symbolic is not None and len(g.symbolic.captures) == 1


class _Block(nn.Module):
  """A pre-norm transformer block (one head): LayerNorm, attention, GELU MLP, residuals."""

  def __init__(self) -> None:
    super().__init__()
    self.ln, self.q, self.k, self.v = nn.LayerNorm(8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
    self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    h = self.ln(x)
    x = x + _attention(self.q(h), self.k(h) * 2 ** -0.5 * 2.0, self.v(h))
    return x + self.mlp(self.ln(x))


def test_transformer_block_over_sequence_lengths_one_capture() -> None:
  _fresh()
  torch.manual_seed(0)
  model = _Block().eval()
  f = torch.compile(model, backend="tiny", dynamic=True)
  with torch.no_grad():
    for s in (3, 6, 9, 4):
      x = torch.randn(2, s, 8)
      torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
  (g,) = _graphs()
  assert g.symbolic is not None, g.symbolic_fallback
  assert [j.cnt for j in g.symbolic.captures.values()] == [4]
