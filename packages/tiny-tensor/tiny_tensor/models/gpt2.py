"""GPT-2 (Radford et al. 2019) in Hugging Face's layout: `wte`, `wpe`, `h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2,
mlp.c_fc, mlp.c_proj}` (Conv1D weights stored (in, out)), `ln_f`; the LM head is tied to `wte`.

`GPT2.from_pretrained(path)` loads a local Hugging Face checkpoint folder (config.json + model.safetensors; keys may
carry a `transformer.` prefix) without downloading anything.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tiny_tensor import nn
from tiny_tensor.nn.state import load_state_dict, safe_load
from tiny_tensor.tensor import Tensor

__all__ = ["GPT2", "GPT2Config"]


def _int_shape(t: Tensor) -> tuple[int, ...]:
  """A loaded weight's shape (concrete: a file's tensors have no symbolic dims)."""
  ints = tuple(s for s in t.shape if isinstance(s, int))
  if len(ints) != t.ndim: raise ValueError(f"a loaded weight has the symbolic shape {t.shape}")
  return ints


@dataclass(frozen=True)
class GPT2Config:
  """n_embd, n_layer, n_head, vocab_size, n_positions, layer_norm_epsilon (config.json's names)."""
  vocab_size: int = 50257
  n_positions: int = 1024
  n_embd: int = 768
  n_layer: int = 12
  n_head: int = 12
  layer_norm_epsilon: float = 1e-5

  @staticmethod
  def from_json(d: dict[str, Any]) -> GPT2Config:
    return GPT2Config(**{k: d[k] for k in GPT2Config.__dataclass_fields__ if k in d})


class Conv1D:
  """Hugging Face's Conv1D: y = x @ weight + bias, weight (in, out)."""

  def __init__(self, nin: int, nout: int):
    self.weight = Tensor.normal(nin, nout, std=0.02)
    self.bias = Tensor.zeros(nout)

  def __call__(self, x: Tensor) -> Tensor: return x @ self.weight + self.bias


class Block:
  def __init__(self, c: GPT2Config):
    self.n_head = c.n_head
    self.ln_1, self.ln_2 = nn.LayerNorm(c.n_embd, c.layer_norm_epsilon), nn.LayerNorm(c.n_embd, c.layer_norm_epsilon)
    self.attn = {"c_attn": Conv1D(c.n_embd, 3 * c.n_embd), "c_proj": Conv1D(c.n_embd, c.n_embd)}
    self.mlp = {"c_fc": Conv1D(c.n_embd, 4 * c.n_embd), "c_proj": Conv1D(4 * c.n_embd, c.n_embd)}

  def __call__(self, x: Tensor) -> Tensor:
    b, t, d = x.shape
    qkv = self.attn["c_attn"](self.ln_1(x)).reshape(b, t, 3, self.n_head, d // self.n_head)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
    x = x + self.attn["c_proj"](a)
    return x + self.mlp["c_proj"](self.mlp["c_fc"](self.ln_2(x)).gelu())


class GPT2:
  """`GPT2(config)(tokens (B, T) int) -> logits (B, T, vocab)`."""

  def __init__(self, config: GPT2Config | None = None):
    c = self.config = config or GPT2Config()
    self.wte = nn.Embedding(c.vocab_size, c.n_embd)
    self.wpe = nn.Embedding(c.n_positions, c.n_embd)
    self.h = [Block(c) for _ in range(c.n_layer)]
    self.ln_f = nn.LayerNorm(c.n_embd, c.layer_norm_epsilon)

  def __call__(self, tokens: Tensor) -> Tensor:
    t = tokens.shape[1]
    if t > self.config.n_positions: raise ValueError(f"{t} tokens exceed n_positions={self.config.n_positions}")
    pos = Tensor.arange(t, device=tokens.device).reshape(1, t)
    x = self.wte(tokens) + self.wpe(pos)
    for blk in self.h: x = blk(x)
    return self.ln_f(x) @ self.wte.weight.T

  @staticmethod
  def from_pretrained(path: str | os.PathLike) -> GPT2:
    """A GPT-2 from a local Hugging Face folder (config.json, model.safetensors) or a .safetensors file (then the
    config is inferred from the weight shapes and the head count must be the default 12 unless config.json exists)."""
    p = os.fspath(path)
    folder = p if os.path.isdir(p) else os.path.dirname(p)
    st = os.path.join(p, "model.safetensors") if os.path.isdir(p) else p
    if not os.path.exists(st): raise FileNotFoundError(f"no model.safetensors in {p}")
    cfg_path = os.path.join(folder, "config.json")
    sd = {k.removeprefix("transformer."): v for k, v in safe_load(st).items()}
    sd = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "lm_head.weight"}
    if os.path.exists(cfg_path):
      with open(cfg_path) as f: cfg = GPT2Config.from_json(json.load(f))
    else:
      (v, d), (n_pos, _) = _int_shape(sd["wte.weight"]), _int_shape(sd["wpe.weight"])
      cfg = GPT2Config(vocab_size=v, n_positions=n_pos, n_embd=d,
                       n_layer=len({k.split(".")[1] for k in sd if k.startswith("h.")}))
    model = GPT2(cfg)
    load_state_dict(model, sd)
    return model
