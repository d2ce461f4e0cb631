"""Vision Transformer (Dosovitskiy et al. 2020) in torchvision's layout: `conv_proj` (patches), `class_token`,
`encoder.pos_embedding`, `encoder.layers.encoder_layer_N` (pre-norm: `ln_1`, `self_attention` with packed
`in_proj_weight`/`in_proj_bias` and `out_proj`, `ln_2`, `mlp.0`/`mlp.3` with GELU), `encoder.ln`, `heads.head`."""
from __future__ import annotations

import math

from typing import TypedDict

from tiny_tensor import nn
from tiny_tensor.tensor import Tensor

__all__ = ["ViT", "vit_b_16"]


class MultiheadAttention:
  """torch.nn.MultiheadAttention's parameters (batch-first use): q, k, v from one packed projection."""

  def __init__(self, dim: int, heads: int):
    self.heads = heads
    self.in_proj_weight = Tensor.glorot_uniform(3 * dim, dim)
    self.in_proj_bias = Tensor.zeros(3 * dim)
    self.out_proj = nn.Linear(dim, dim)

  def __call__(self, x: Tensor) -> Tensor:
    b, t, d = x.shape
    qkv = x.linear(self.in_proj_weight.T, self.in_proj_bias).reshape(b, t, 3, self.heads, d // self.heads)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))          # (B, H, T, hd)
    out = q.scaled_dot_product_attention(k, v).transpose(1, 2).reshape(b, t, d)
    return self.out_proj(out)


class EncoderBlock:
  def __init__(self, dim: int, heads: int, mlp_dim: int):
    self.ln_1, self.ln_2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
    self.self_attention = MultiheadAttention(dim, heads)
    self.mlp = {"0": nn.Linear(dim, mlp_dim), "3": nn.Linear(mlp_dim, dim)}

  def __call__(self, x: Tensor) -> Tensor:
    x = x + self.self_attention(self.ln_1(x))
    h = self.mlp["0"](self.ln_2(x))
    return x + self.mlp["3"](0.5 * h * (1 + (h * math.sqrt(0.5)).erf()))  # exact GELU, as torchvision's ViT


class _Encoder(TypedDict):
  """ViT's `encoder`, a dict so that the state dict's names are torchvision's (`encoder.layers.encoder_layer_0...`)."""
  pos_embedding: Tensor
  layers: dict[str, EncoderBlock]
  ln: nn.LayerNorm


class ViT:
  """`ViT(image_size, patch_size, num_layers, num_heads, hidden_dim, mlp_dim, num_classes=1000)`."""

  def __init__(self, image_size: int = 224, patch_size: int = 16, num_layers: int = 12, num_heads: int = 12,
               hidden_dim: int = 768, mlp_dim: int = 3072, num_classes: int = 1000):
    if image_size % patch_size: raise ValueError(f"image_size {image_size} must be a multiple of patch {patch_size}")
    self.patch = patch_size
    self.conv_proj = nn.Conv2d(3, hidden_dim, patch_size, patch_size)
    self.class_token = Tensor.zeros(1, 1, hidden_dim)
    n = (image_size // patch_size) ** 2 + 1
    self.encoder: _Encoder = {"pos_embedding": Tensor.normal(1, n, hidden_dim, std=0.02),
                    "layers": {f"encoder_layer_{i}": EncoderBlock(hidden_dim, num_heads, mlp_dim)
                               for i in range(num_layers)},
                    "ln": nn.LayerNorm(hidden_dim, eps=1e-6)}
    self.heads = {"head": nn.Linear(hidden_dim, num_classes)}

  def __call__(self, x: Tensor) -> Tensor:
    b = x.shape[0]
    x = self.conv_proj(x).flatten(2).transpose(1, 2)                      # (B, patches, D)
    x = self.class_token.expand(b, 1, x.shape[-1]).cat(x, dim=1) + self.encoder["pos_embedding"]
    for blk in self.encoder["layers"].values(): x = blk(x)
    return self.heads["head"](self.encoder["ln"](x)[:, 0])


def vit_b_16(num_classes: int = 1000) -> ViT: return ViT(224, 16, 12, 12, 768, 3072, num_classes)
