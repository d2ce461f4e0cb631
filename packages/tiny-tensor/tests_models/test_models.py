"""tiny_tensor.models against PyTorch: the same structure written here in torch (torchvision is not a dependency),
random weights copied over by name, the forward passes compared."""
import json

import numpy as np
import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as F

from tiny_tensor import Tensor
from tiny_tensor.models import GPT2, MobileNetV2, ViT, resnet18, resnet50
from tiny_tensor.models.gpt2 import GPT2Config
from tiny_tensor.models.mobilenet import _make_divisible
from tiny_tensor.nn.state import get_state_dict, load_state_dict, safe_save


# ***** torch reference modules (torchvision's / Hugging Face's layouts, written here) *****
class TBasic(tnn.Module):
  expansion = 1

  def __init__(self, cin, planes, stride):
    super().__init__()
    self.conv1, self.bn1 = tnn.Conv2d(cin, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes)
    self.conv2, self.bn2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False), tnn.BatchNorm2d(planes)
    self.downsample = tnn.Sequential(tnn.Conv2d(cin, planes, 1, stride, bias=False), tnn.BatchNorm2d(planes)) \
      if stride != 1 or cin != planes else tnn.Sequential()

  def forward(self, x):
    return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + self.downsample(x))


class TBottle(tnn.Module):
  expansion = 4

  def __init__(self, cin, planes, stride):
    super().__init__()
    self.conv1, self.bn1 = tnn.Conv2d(cin, planes, 1, bias=False), tnn.BatchNorm2d(planes)
    self.conv2, self.bn2 = tnn.Conv2d(planes, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes)
    self.conv3, self.bn3 = tnn.Conv2d(planes, planes * 4, 1, bias=False), tnn.BatchNorm2d(planes * 4)
    self.downsample = tnn.Sequential(tnn.Conv2d(cin, planes * 4, 1, stride, bias=False), tnn.BatchNorm2d(planes * 4)) \
      if stride != 1 or cin != planes * 4 else tnn.Sequential()

  def forward(self, x):
    out = F.relu(self.bn1(self.conv1(x)))
    out = F.relu(self.bn2(self.conv2(out)))
    return F.relu(self.bn3(self.conv3(out)) + self.downsample(x))


class TResNet(tnn.Module):
  def __init__(self, block, layers, num_classes, width):
    super().__init__()
    self.conv1, self.bn1 = tnn.Conv2d(3, width, 7, 2, 3, bias=False), tnn.BatchNorm2d(width)
    cin = width
    for i, n in enumerate(layers):
      blocks = []
      for j in range(n):
        blocks.append(block(cin, width * 2 ** i, 2 if j == 0 and i > 0 else 1))
        cin = width * 2 ** i * block.expansion
      setattr(self, f"layer{i + 1}", tnn.Sequential(*blocks))
    self.fc = tnn.Linear(cin, num_classes)

  def forward(self, x):
    x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
    for i in range(4): x = getattr(self, f"layer{i + 1}")(x)
    return self.fc(x.mean((2, 3)))


class TConvBN(tnn.Sequential):
  def __init__(self, cin, cout, k=3, stride=1, groups=1, act=True):
    mods = [tnn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), tnn.BatchNorm2d(cout)]
    super().__init__(*(mods + ([tnn.ReLU6()] if act else [])))


class TInverted(tnn.Module):
  def __init__(self, cin, cout, stride, t):
    super().__init__()
    hidden = cin * t
    self.use_res = stride == 1 and cin == cout
    layers = [TConvBN(cin, hidden, 1)] if t != 1 else []
    layers += [TConvBN(hidden, hidden, 3, stride, hidden), tnn.Conv2d(hidden, cout, 1, bias=False),
               tnn.BatchNorm2d(cout)]
    self.conv = tnn.Sequential(*layers)

  def forward(self, x): return x + self.conv(x) if self.use_res else self.conv(x)


class TMobileNetV2(tnn.Module):
  def __init__(self, num_classes, width_mult, settings, last_channel):
    super().__init__()
    cin = _make_divisible(32 * width_mult)
    last = _make_divisible(last_channel * max(1.0, width_mult))
    feats = [TConvBN(3, cin, 3, 2)]
    for t, c, n, s in settings:
      cout = _make_divisible(c * width_mult)
      for i in range(n):
        feats.append(TInverted(cin, cout, s if i == 0 else 1, t))
        cin = cout
    feats.append(TConvBN(cin, last, 1))
    self.features = tnn.Sequential(*feats)
    self.classifier = tnn.Sequential(tnn.Dropout(0.2), tnn.Linear(last, num_classes))

  def forward(self, x): return self.classifier(self.features(x).mean((2, 3)))


class TEncoderBlock(tnn.Module):
  def __init__(self, dim, heads, mlp):
    super().__init__()
    self.ln_1, self.ln_2 = tnn.LayerNorm(dim, eps=1e-6), tnn.LayerNorm(dim, eps=1e-6)
    self.self_attention = tnn.MultiheadAttention(dim, heads, batch_first=True)
    self.mlp = tnn.Sequential(tnn.Linear(dim, mlp), tnn.GELU(), tnn.Dropout(0.0), tnn.Linear(mlp, dim))

  def forward(self, x):
    h = self.ln_1(x)
    x = x + self.self_attention(h, h, h, need_weights=False)[0]
    return x + self.mlp(self.ln_2(x))


class TViT(tnn.Module):
  def __init__(self, image, patch, layers, heads, dim, mlp, num_classes):
    super().__init__()
    self.conv_proj = tnn.Conv2d(3, dim, patch, patch)
    self.class_token = tnn.Parameter(torch.randn(1, 1, dim))
    self.encoder = tnn.Module()
    self.encoder.pos_embedding = tnn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim))
    self.encoder.layers = tnn.Sequential(*[TEncoderBlock(dim, heads, mlp) for _ in range(layers)])
    self.encoder.layers = tnn.ModuleDict({f"encoder_layer_{i}": m for i, m in enumerate(self.encoder.layers)})
    self.encoder.ln = tnn.LayerNorm(dim, eps=1e-6)
    self.heads = tnn.Module()
    self.heads.head = tnn.Linear(dim, num_classes)

  def forward(self, x):
    x = self.conv_proj(x).flatten(2).transpose(1, 2)
    x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1) + self.encoder.pos_embedding
    for m in self.encoder.layers.values(): x = m(x)
    return self.heads.head(self.encoder.ln(x)[:, 0])


class TGPT2(tnn.Module):
  """Hugging Face GPT-2's computation: Conv1D weights (in, out), the tanh GELU ("gelu_new")."""

  def __init__(self, c):
    super().__init__()
    self.c = c
    self.wte, self.wpe = tnn.Embedding(c.vocab_size, c.n_embd), tnn.Embedding(c.n_positions, c.n_embd)
    self.h = tnn.ModuleList()
    for _ in range(c.n_layer):
      b = tnn.Module()
      b.ln_1, b.ln_2 = tnn.LayerNorm(c.n_embd), tnn.LayerNorm(c.n_embd)
      b.attn, b.mlp = tnn.Module(), tnn.Module()
      for mod, name, shape in ((b.attn, "c_attn", (c.n_embd, 3 * c.n_embd)), (b.attn, "c_proj", (c.n_embd, c.n_embd)),
                               (b.mlp, "c_fc", (c.n_embd, 4 * c.n_embd)), (b.mlp, "c_proj", (4 * c.n_embd, c.n_embd))):
        m = tnn.Module()
        m.weight, m.bias = tnn.Parameter(torch.randn(*shape) * 0.05), tnn.Parameter(torch.randn(shape[1]) * 0.05)
        setattr(mod, name, m)
      self.h.append(b)
    self.ln_f = tnn.LayerNorm(c.n_embd)

  def forward(self, tok):
    t = tok.shape[1]
    x = self.wte(tok) + self.wpe(torch.arange(t))
    for b in self.h:
      h = b.ln_1(x)
      qkv = h @ b.attn.c_attn.weight + b.attn.c_attn.bias
      q, k, v = qkv.view(*qkv.shape[:2], 3, self.c.n_head, -1).permute(2, 0, 3, 1, 4)
      a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
      x = x + a @ b.attn.c_proj.weight + b.attn.c_proj.bias
      h = F.gelu(b.ln_2(x) @ b.mlp.c_fc.weight + b.mlp.c_fc.bias, approximate="tanh")  # HF gelu_new
      x = x + h @ b.mlp.c_proj.weight + b.mlp.c_proj.bias
    return self.ln_f(x) @ self.wte.weight.T


# ***** helpers *****
def _randomize(tm):
  """Random weights and BatchNorm statistics, so eval-mode BN is not the identity."""
  g = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in tm.named_parameters(): p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim > 1 else 0.1)
                                                  + (1.0 if name.endswith("weight") and p.ndim == 1 else 0.0))
    for m in tm.modules():
      if isinstance(m, tnn.BatchNorm2d):
        m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
        m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
  return tm.eval()


def _copy(tm, model):
  sd = {k: Tensor(v.detach().numpy().copy()) for k, v in tm.state_dict().items()}
  want = set(get_state_dict(model))
  load_state_dict(model, {k: v for k, v in sd.items() if k in want}, strict=False)
  missing = want - set(sd)
  assert not missing, f"tiny parameters with no torch counterpart: {sorted(missing)[:5]}"


def _check(tm, model, x, rtol=1e-3, atol=1e-3):
  with torch.no_grad(): want = tm(torch.from_numpy(x)).numpy()
  got = model(Tensor(x)).numpy()
  np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("kind", ["resnet18", "resnet50"])
def test_resnet_matches_torch(kind):
  block, layers = (TBasic, [2, 2, 2, 2]) if kind == "resnet18" else (TBottle, [3, 4, 6, 3])
  width = 8 if kind == "resnet18" else 4  # the real block structure at a small width keeps the test fast
  tm = _randomize(TResNet(block, layers, 10, width))
  model = (resnet18 if kind == "resnet18" else resnet50)(num_classes=10, width=width)
  assert len(get_state_dict(model)) == len([k for k in tm.state_dict() if not k.endswith("num_batches_tracked")]) + \
    sum(1 for k in tm.state_dict() if k.endswith("num_batches_tracked"))
  _copy(tm, model)
  _check(tm, model, np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))


def test_mobilenet_v2_matches_torch():
  settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2)]
  tm = _randomize(TMobileNetV2(10, 0.5, settings, 64))
  model = MobileNetV2(10, 0.5, settings, 64)
  _copy(tm, model)
  _check(tm, model, np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32))


def test_vit_matches_torch():
  tm = _randomize(TViT(32, 8, 2, 4, 32, 64, 10))
  model = ViT(32, 8, 2, 4, 32, 64, 10)
  sd = tm.state_dict()
  assert set(get_state_dict(model)) == {k for k in sd if "mlp.2" not in k}
  _copy(tm, model)
  _check(tm, model, np.random.default_rng(2).standard_normal((2, 3, 32, 32)).astype(np.float32))


def test_gpt2_from_local_hf_folder_matches_torch(tmp_path):
  c = GPT2Config(vocab_size=97, n_positions=32, n_embd=48, n_layer=2, n_head=4)
  torch.manual_seed(0)
  tm = TGPT2(c).eval()
  # a Hugging Face-style folder: config.json and model.safetensors with the "transformer." prefix and the causal
  # mask buffers HF checkpoints carry
  sd = {f"transformer.{k}": Tensor(v.detach().numpy().copy()) for k, v in tm.state_dict().items()}
  sd["transformer.h.0.attn.bias"] = Tensor(np.tril(np.ones((1, 1, 32, 32), np.float32)))
  safe_save(sd, tmp_path / "model.safetensors")
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **c.__dict__}))
  model = GPT2.from_pretrained(tmp_path)
  tok = np.random.default_rng(3).integers(0, 97, (2, 11)).astype(np.int32)
  with torch.no_grad(): want = tm(torch.from_numpy(tok).long()).numpy()
  np.testing.assert_allclose(model(Tensor(tok)).numpy(), want, rtol=1e-4, atol=1e-4)
  with pytest.raises(FileNotFoundError): GPT2.from_pretrained(tmp_path / "nope")
