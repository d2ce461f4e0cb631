"""torch.compile(backend="tiny") against eager torch: inference, a training step, graph breaks, the TinyJit replay."""
import copy

import pytest
import torch
import torch.nn as nn

import tiny_torch  # noqa: F401  (registers the backend)
from tiny_torch import dynamo


def _model() -> nn.Module:
  torch.manual_seed(0)
  return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))


def _graphs() -> list[dynamo.CompiledGraph]:
  return [g for g in dynamo.CompiledGraph.instances]


def test_compile_inference_matches_eager_and_replays() -> None:
  torch._dynamo.reset()
  dynamo.CompiledGraph.instances.clear()
  model = _model().eval()
  compiled = torch.compile(copy.deepcopy(model), backend="tiny")
  for _ in range(4):
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
  (g,) = _graphs()
  # call 1 eager (aliases noted), then the jit's calls: run, capture, replay
  assert g.jit and [j.cnt for j in g.jits.values()] == [3]


def test_compile_training_step_matches_eager() -> None:
  torch._dynamo.reset()
  model = _model()
  ref, got = copy.deepcopy(model), torch.compile(copy.deepcopy(model), backend="tiny")
  opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
  opt_got = torch.optim.SGD(got.parameters(), lr=0.1)
  for _ in range(3):
    x, y = torch.randn(4, 3, 4, 4), torch.randint(0, 3, (4,))
    losses = []
    for m, opt in ((ref, opt_ref), (got, opt_got)):
      opt.zero_grad()
      loss = nn.functional.cross_entropy(m(x), y)
      loss.backward()
      opt.step()
      losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 1e-4
  for (n, a), b in zip(ref.state_dict().items(), got.state_dict().values()):
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")  # BN running stats too


def test_compile_graph_break_falls_back() -> None:
  torch._dynamo.reset()
  dynamo.CompiledGraph.instances.clear()

  def f(x: torch.Tensor) -> torch.Tensor:
    y = (x * 2).sin()
    torch._dynamo.graph_break()  # the Python between graphs runs as usual
    return (y + 1).relu().sum(0)

  x = torch.randn(5, 3)
  torch.testing.assert_close(torch.compile(f, backend="tiny")(x), f(x))
  assert len(_graphs()) == 2


def test_compile_with_tiny_inputs_graph_breaks_to_eager_tiny() -> None:
  """Dynamo cannot trace the TinyTensor subclass: it graph-breaks and the ops run eagerly on tiny, correctly."""
  torch._dynamo.reset()
  f = torch.compile(lambda a, b: (a @ b).softmax(-1), backend="tiny")
  a, b = torch.randn(3, 4), torch.randn(4, 5)
  out = f(a.to("tiny"), b.to("tiny"))
  assert out.device.type == "tiny"
  torch.testing.assert_close(out.cpu(), (a @ b).softmax(-1))


def test_compile_new_shapes_recompile_or_rejit() -> None:
  """A new batch size: Dynamo recompiles (or passes the size as an int), and each signature gets its own capture."""
  torch._dynamo.reset()
  model = _model().eval()
  compiled = torch.compile(copy.deepcopy(model), backend="tiny")
  for bs in (2, 3, 2, 5, 3, 3):
    x = torch.randn(bs, 3, 4, 4)
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_compile_dropout_draws_anew_each_call() -> None:
  """A graph that draws random numbers is not replayed by TinyJit (the replay would repeat the first mask)."""
  torch._dynamo.reset()
  f = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True), backend="tiny")
  x = torch.ones(4000)
  masks = [f(x) != 0 for _ in range(4)]
  assert all(0.45 < m.float().mean().item() < 0.55 for m in masks)
  assert all(not torch.equal(masks[0], m) for m in masks[1:])
  assert set(f(x).unique().tolist()) <= {0.0, 2.0}


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace the builtin")
def test_compile_model_on_tiny_falls_back_to_eager_tiny_with_right_results() -> None:
  """torch.compile(model.to("tiny")): Dynamo can't trace TinyTensor (see dynamo.py's docstring for why), so no graph
  reaches the backend and the model runs eagerly on tiny: forward and a training step match the CPU."""
  torch._dynamo.reset()
  dynamo.CompiledGraph.instances.clear()
  ref = _model()
  got = torch.compile(copy.deepcopy(ref).to("tiny"), backend="tiny")
  opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
  opt_g = torch.optim.SGD(got.parameters(), lr=0.1)
  for _ in range(2):
    x, y = torch.randn(4, 3, 4, 4), torch.randint(0, 3, (4,))
    out_r, out_g = ref(x), got(x.to("tiny"))
    assert out_g.device.type == "tiny"
    torch.testing.assert_close(out_g.cpu(), out_r, atol=1e-5, rtol=1e-5)
    for _m, opt, out in ((ref, opt_r, out_r), (got, opt_g, out_g)):
      opt.zero_grad()
      nn.functional.cross_entropy(out, y.to(out.device)).backward()
      opt.step()
  for a, b in zip(ref.parameters(), got.parameters()):
    torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-4)
  assert not _graphs()  # nothing was compiled: the clean eager fallback
