"""Test helpers for the LLM: a small random-weight LLaMA-style GGUF written with our writer, and an independent
numpy forward pass of the same network (full causal attention over the whole sequence, no cache)."""
from __future__ import annotations

from typing import Any

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


# ***** transformers models written to GGUF the way llama.cpp's converter writes them *****
# The reference for the architectures: a tiny random transformers model (no download), its weights written with the
# `gguf` package under llama.cpp's tensor names (with the converter's q/k row permutation for `llama` and its 1 + w
# for Gemma norms), and its logits computed by transformers on the values the file holds (quantized ones dequantized
# by the `gguf` package).
HF_CASES = {  # name: (transformers config class, GGUF architecture, config arguments)
  "llama": ("LlamaConfig", "llama", {}),
  "llama3_rope": ("LlamaConfig", "llama", {"rope_parameters": {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8}}),
  "qwen2": ("Qwen2Config", "qwen2", {}),
  "qwen3": ("Qwen3Config", "qwen3", {"head_dim": 32}),
  "gemma": ("GemmaConfig", "gemma", {"head_dim": 16, "hidden_activation": "gelu_pytorch_tanh"}),
  "gemma2": ("Gemma2Config", "gemma2", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4,
                                        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                        "hidden_activation": "gelu_pytorch_tanh"}),
  "gemma3": ("Gemma3TextConfig", "gemma3", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4,
                                            "layer_types": ["sliding_attention", "full_attention"],
                                            "rope_parameters": {
                                              "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                 "rope_theta": 1000000.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
}
_HF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
             "post_feedforward_layernorm": "post_ffw_norm"}


def hf_model(case: str, dim: int = 64, hidden: int = 96, n_heads: int = 4, n_kv: int = 2, seed: int = 0,
             **over: Any) -> Any:
  """A 2-layer transformers causal LM of `case` (HF_CASES; `over` overrides its config arguments) with random
  weights drawn from `seed`, in float64."""
  import torch
  import transformers
  cls, arch, extra = HF_CASES[case]
  cfg = getattr(transformers, cls)(vocab_size=len(vocab()[0]), hidden_size=dim, intermediate_size=hidden,
                                   num_hidden_layers=2, num_attention_heads=n_heads, num_key_value_heads=n_kv,
                                   max_position_embeddings=64, rms_norm_eps=1e-6 if arch.startswith("gemma") else 1e-5,
                                   tie_word_embeddings=arch.startswith("gemma"), attn_implementation="eager",
                                   **{**extra, **over})
  model = getattr(transformers, cls.replace("TextConfig", "ForCausalLM").replace("Config", "ForCausalLM"))(cfg)
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
      if name.endswith("norm.weight"): p.copy_(r * 0.1 if arch.startswith("gemma") else 1 + r * 0.1)  # gemma: 1 + w
      elif "embed_tokens" in name: p.copy_(r * (0.1 if arch.startswith("gemma") else 0.5))
      else: p.copy_(r / np.sqrt(p.shape[-1]))
  return model.double().eval()


def _llama3_rope_factors(rp: dict[str, Any], head_dim: int) -> np.ndarray:
  """The per-dimension frequency divisors llama.cpp's converter writes to `rope_freqs.weight` for rope_type llama3."""
  freqs = 1.0 / (rp["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim))
  old, lo, hi, factor = rp["original_max_position_embeddings"], rp["low_freq_factor"], rp["high_freq_factor"], \
    rp["factor"]
  out = []
  for f in freqs:
    wavelen = 2 * np.pi / f
    if wavelen < old / hi: out.append(1.0)
    elif wavelen > old / lo: out.append(factor)
    else:
      smooth = (old / wavelen - lo) / (hi - lo)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.array(out, np.float32)


def write_hf_gguf(model: Any, case: str, path: str, qtype: Any = None) -> None:
  """Write `model` to a GGUF file with the `gguf` package; its matrices as `qtype` (a gguf.GGMLQuantizationType,
  F32 when None; rows that aren't whole blocks stay Q8_0 or F32, as llama.cpp does). The model's weights are replaced
  by the values the file holds (dequantized with the `gguf` package), so it is the reference for the file."""
  import gguf
  import torch
  from tiny_tensor.llm.gguf import quantize as our_quantize
  Q = gguf.GGMLQuantizationType
  _, arch, _ = HF_CASES[case]
  c = model.config
  hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
  w = gguf.GGUFWriter(path, arch)
  w.add_context_length(64)
  w.add_embedding_length(c.hidden_size)
  w.add_block_count(c.num_hidden_layers)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_key_length(hd)
  w.add_value_length(hd)
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  rp = c.rope_parameters
  if arch == "gemma3":
    w.add_rope_freq_base(rp["full_attention"]["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(rp["full_attention"]["factor"])
    w.add_uint32(f"{arch}.attention.sliding_window_pattern", 2)  # llama.cpp reads 6 when absent
  else: w.add_rope_freq_base(rp["rope_theta"])
  if arch in ("gemma2", "gemma3"): w.add_sliding_window(c.sliding_window)
  if arch == "gemma2":
    w.add_attn_logit_softcapping(c.attn_logit_softcapping)
    w.add_final_logit_softcapping(c.final_logit_softcapping)
  toks, scores, types = vocab()
  w.add_tokenizer_model("llama")
  w.add_token_list(toks)
  w.add_token_scores(scores)
  w.add_token_types(types)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  if arch == "llama" and rp.get("rope_type") == "llama3":
    w.add_tensor("rope_freqs.weight", _llama3_rope_factors(rp, hd))
  state = dict(model.named_parameters())
  for name, p in state.items():
    if name == "lm_head.weight" and c.tie_word_embeddings: continue
    if name == "model.embed_tokens.weight": gname = "token_embd.weight"
    elif name == "model.norm.weight": gname = "output_norm.weight"
    elif name == "lm_head.weight": gname = "output.weight"
    else:
      _, _, i, rest = name.split(".", 3)
      base, kind = rest.rsplit(".", 1)
      if base == "post_attention_layernorm": base = "post_attention_norm" if arch in ("gemma2", "gemma3") \
        else "ffn_norm"
      gname = f"blk.{i}.{_HF_NAMES.get(base, base)}.{kind}"
    a = p.detach().numpy().astype(np.float32)
    if p.ndim == 1:  # norms and biases stay float32; Gemma's norms are stored as 1 + w (the converter adds 1)
      w.add_tensor(gname, a + 1 if arch.startswith("gemma") and gname.endswith("norm.weight") else a)
      continue
    t = qtype or Q.F32
    for fallback in (t, Q.Q8_0, Q.F32):
      t = fallback
      if a.shape[-1] % gguf.GGML_QUANT_SIZES[t][0] == 0: break
    if t == Q.F32: raw, deq = a, a
    else:
      raw = gguf.quants.quantize(a, t) if t in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1) else \
        np.frombuffer(our_quantize(a, t), np.uint8).reshape(a.shape[0], -1)  # the gguf package has no K-quantizer
      deq = gguf.quants.dequantize(raw, t)
    with torch.no_grad(): p.copy_(torch.from_numpy(deq.astype(np.float64)))
    if arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):  # the converter's row permutation
      heads = c.num_attention_heads if gname.endswith("attn_q.weight") else c.num_key_value_heads
      raw = raw[np.arange(a.shape[0]).reshape(heads, 2, -1).swapaxes(1, 2).reshape(-1)]
    w.add_tensor(gname, np.ascontiguousarray(raw), raw_dtype=None if t == Q.F32 else t)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def hf_logits(model: Any, tokens: list[int]) -> np.ndarray:
  """transformers' logits (len(tokens), vocab) for `tokens`, float64."""
  import torch
  with torch.no_grad(): return model(torch.tensor([tokens])).logits[0].numpy()
