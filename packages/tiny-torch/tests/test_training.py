"""Whole training runs on `tiny` against the same runs on torch's CPU: losses and parameters within 1e-3."""
import copy

import pytest
import torch
import torch.nn as nn

import tiny_torch  # noqa: F401  (registers the tiny device)


class ConvNet(nn.Module):
  """conv-BN-relu, max pool, conv-BN-relu, linear (the convs have no bias: BatchNorm cancels it, and Adam would
  amplify the ~0 gradient a bias gets into noise)."""

  def __init__(self) -> None:
    super().__init__()
    self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    self.bn1 = nn.BatchNorm2d(8)
    self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
    self.bn2 = nn.BatchNorm2d(8)
    self.fc = nn.Linear(8 * 4 * 4, 5)

  def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 3, 8, 8)
    x = torch.relu(self.bn1(self.conv1(x)))
    x = nn.functional.max_pool2d(x, 2)  # (B, 8, 4, 4)
    x = torch.relu(self.bn2(self.conv2(x)))
    return self.fc(x.flatten(1))


def _train(model: nn.Module, opt_fn, xs, ys, device: str, steps: int) -> tuple[list[float], nn.Module]:
  model = model.to(device)
  opt = opt_fn(model.parameters())
  losses = []
  for i in range(steps):
    x, y = xs[i].to(device), ys[i].to(device)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
  return losses, model


def _compare(m_cpu: nn.Module, m_tiny: nn.Module) -> None:
  for (n, a), (_, b) in zip(m_cpu.state_dict().items(), m_tiny.state_dict().items()):
    assert b.device.type == "tiny", n
    torch.testing.assert_close(b.cpu().to(a.dtype), a, atol=1e-3, rtol=1e-3, msg=lambda m, n=n: f"{n}: {m}")


def test_convnet_batchnorm_adam() -> None:
  torch.manual_seed(0)
  model = ConvNet()
  xs = [torch.randn(4, 3, 8, 8) for _ in range(3)]
  ys = [torch.randint(0, 5, (4,)) for _ in range(3)]
  ref_losses, ref = _train(copy.deepcopy(model), lambda p: torch.optim.Adam(p, lr=1e-2), xs, ys, "cpu", 3)
  losses, got = _train(copy.deepcopy(model), lambda p: torch.optim.Adam(p, lr=1e-2), xs, ys, "tiny", 3)
  assert losses == pytest.approx(ref_losses, abs=1e-3)
  _compare(ref, got)  # weights, BatchNorm running stats and num_batches_tracked


class Encoder(nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.emb = nn.Embedding(11, 16)
    self.layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    self.head = nn.Linear(16, 11)

  def forward(self, tok: torch.Tensor) -> torch.Tensor:
    return self.head(self.layer(self.emb(tok))).flatten(0, 1)


def test_transformer_encoder_sgd() -> None:
  torch.manual_seed(1)
  model = Encoder()
  toks = [torch.randint(0, 11, (2, 5)) for _ in range(3)]
  targets = [torch.randint(0, 11, (10,)) for _ in range(3)]
  sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
  ref_losses, ref = _train(copy.deepcopy(model), sgd, toks, targets, "cpu", 3)
  losses, got = _train(copy.deepcopy(model), sgd, toks, targets, "tiny", 3)
  assert losses == pytest.approx(ref_losses, abs=1e-3)
  _compare(ref, got)


@pytest.mark.parametrize("make", [lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
                                  lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5),
                                  lambda p: torch.optim.Adagrad(p, lr=1e-1),
                                  lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, foreach=False)],
                         ids=["AdamW", "RMSprop", "Adagrad", "Adam-amsgrad-forloop"])
def test_optimizers_match_cpu(make) -> None:
  torch.manual_seed(2)
  model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
  xs, ys = [torch.randn(5, 6) for _ in range(3)], [torch.randint(0, 3, (5,)) for _ in range(3)]
  ref_losses, ref = _train(copy.deepcopy(model), make, xs, ys, "cpu", 3)
  losses, got = _train(copy.deepcopy(model), make, xs, ys, "tiny", 3)
  assert losses == pytest.approx(ref_losses, abs=1e-4)
  _compare(ref, got)
