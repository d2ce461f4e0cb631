"""Test helpers for the LLM: a small random-weight LLaMA-style GGUF written with our writer, and an independent
numpy forward pass of the same network (full causal attention over the whole sequence, no cache)."""
from __future__ import annotations

import numpy as np

from tiny_tensor.llm.gguf import BLOCK, GGMLType, dequantize, quantize, write_gguf

# a SentencePiece-style vocabulary: control tokens, byte fallback, characters and a few merges
CHARS = list("abcdefghijklmnopqrstuvwxyz")
PIECES = ["▁" + c for c in CHARS] + ["▁the", "▁a", "he", "th", "in", "er", "an", "▁th", "on", "re"]


def vocab() -> tuple[list[str], list[float], list[int]]:
  toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁"] + CHARS + PIECES
  scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-1.0] + [-2.0] * len(CHARS) + [-1.0 - 0.01 * i for i in range(len(PIECES))]
  types = [2, 3, 3] + [6] * 256 + [1] * (1 + len(CHARS) + len(PIECES))
  return toks, scores, types


def make_model(path: str, arch: str = "llama", dim: int = 64, n_layers: int = 2, n_heads: int = 4, n_kv: int = 2,
               hidden: int = 96, ctx: int = 64, wtype: GGMLType = GGMLType.F32, seed: int = 0,
               tied: bool = False, types: dict[str, GGMLType] | None = None) -> dict[str, np.ndarray]:
  """Write a random model; returns its weights as the float32 values the file holds (after quantization).
  `types` maps a name suffix ("attn_q.weight", "token_embd.weight", ...) to its type; other matrices get `wtype`."""
  rng = np.random.default_rng(seed)
  toks, scores, tok_types = vocab()
  hd = dim // n_heads
  shapes = {"token_embd.weight": (len(toks), dim), "output_norm.weight": (dim,)}
  if not tied: shapes["output.weight"] = (len(toks), dim)
  for i in range(n_layers):
    p = f"blk.{i}."
    shapes.update({p + "attn_norm.weight": (dim,), p + "ffn_norm.weight": (dim,), p + "attn_q.weight": (dim, dim),
                   p + "attn_k.weight": (n_kv * hd, dim), p + "attn_v.weight": (n_kv * hd, dim),
                   p + "attn_output.weight": (dim, dim), p + "ffn_gate.weight": (hidden, dim),
                   p + "ffn_up.weight": (hidden, dim), p + "ffn_down.weight": (dim, hidden)})
    if arch == "qwen2": shapes.update({p + "attn_q.bias": (dim,), p + "attn_k.bias": (n_kv * hd,),
                                       p + "attn_v.bias": (n_kv * hd,)})
  ws, types_of = {}, {}
  for k, s in shapes.items():
    if k.endswith("norm.weight"): ws[k] = (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)
    else:
      scale = 0.5 if k == "token_embd.weight" else 1 / np.sqrt(s[-1])
      ws[k] = (rng.standard_normal(s) * scale).astype(np.float32)
    if len(s) == 2:  # as llama.cpp does, rows that aren't whole blocks of the type fall back to Q8_0
      want = next((t for suf, t in (types or {}).items() if k.endswith(suf)), wtype)
      types_of[k] = want if s[-1] % BLOCK[want][0] == 0 else GGMLType.Q8_0
  kv = {"general.architecture": arch, "general.name": "tiny-test",
        f"{arch}.context_length": ctx, f"{arch}.embedding_length": dim, f"{arch}.block_count": n_layers,
        f"{arch}.feed_forward_length": hidden, f"{arch}.attention.head_count": n_heads,
        f"{arch}.attention.head_count_kv": n_kv, f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.rope.freq_base": 10000.0, "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": tok_types, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2}
  write_gguf(path, kv, ws, types_of)
  return {k: dequantize(np.frombuffer(quantize(v, types_of.get(k, GGMLType.F32)), np.uint8),
                        types_of.get(k, GGMLType.F32)).reshape(v.shape) for k, v in ws.items()}


def forward(ws: dict[str, np.ndarray], tokens: list[int], arch: str = "llama", n_heads: int = 4, n_kv: int = 2,
            eps: float = 1e-5, theta: float = 10000.0) -> np.ndarray:
  """Logits (len(tokens), vocab) of the model in float64 numpy."""
  w = {k: v.astype(np.float64) for k, v in ws.items()}
  x = w["token_embd.weight"][tokens]
  t, dim = x.shape
  hd = dim // n_heads
  n_layers = sum(1 for k in w if k.endswith("attn_q.weight"))
  ang = np.outer(np.arange(t), 1.0 / theta ** (np.arange(0, hd, 2) / hd))
  cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

  def norm(v: np.ndarray, g: np.ndarray) -> np.ndarray: return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

  def rope(v: np.ndarray) -> np.ndarray:  # (t, h, hd)
    if arch == "qwen2":
      a, b = v[..., :hd // 2], v[..., hd // 2:]
      return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    a, b = v[..., 0::2], v[..., 1::2]
    out = np.empty_like(v)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out

  for i in range(n_layers):
    p = f"blk.{i}."
    h = norm(x, w[p + "attn_norm.weight"])
    q, k, v = (h @ w[p + f"attn_{n}.weight"].T + w.get(p + f"attn_{n}.bias", 0) for n in "qkv")
    q, k, v = rope(q.reshape(t, n_heads, hd)), rope(k.reshape(t, n_kv, hd)), v.reshape(t, n_kv, hd)
    k, v = np.repeat(k, n_heads // n_kv, axis=1), np.repeat(v, n_heads // n_kv, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + np.triu(np.full((t, t), -np.inf), 1)
    p_ = np.exp(s - s.max(-1, keepdims=True))
    p_ /= p_.sum(-1, keepdims=True)
    x = x + np.einsum("hqk,khd->qhd", p_, v).reshape(t, dim) @ w[p + "attn_output.weight"].T
    h = norm(x, w[p + "ffn_norm.weight"])
    g = h @ w[p + "ffn_gate.weight"].T
    x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
  out = w.get("output.weight", w["token_embd.weight"])
  return norm(x, w["output_norm.weight"]) @ out.T
