"""A LLaMA-family transformer (RMSNorm, RoPE, grouped-query attention, SwiGLU feed-forward) over GGUF weights.

Weights keep their GGUF type: a float weight is a float Tensor, a quantized one a uint8 Tensor of raw blocks that
`QLinear` decodes with `llm.quants.dequantize` inside the matmul's graph. Names and conventions are llama.cpp's:
`token_embd`, `blk.N.attn_{norm,q,k,v,output}`, `blk.N.ffn_{norm,gate,up,down}`, `output_norm`, `output` (tied to
`token_embd` when absent); a weight's numpy shape is (out, in). RoPE rotates adjacent pairs for `llama` (the GGUF
converter permutes q/k rows for it) and the two halves of each head for NEOX-style architectures (`qwen2`, ...).

Decoding: one token at a time through `Transformer.step`, a TinyJit-ed function whose position is a bound
`Variable`: the KV cache is written by an assign into its one-row window at that position (a kernel that writes
n_kv * head_dim elements, whatever the context) and read through a symbolic shrink, so the same captured kernels
serve every position (`Transformer.decode`). The prompt goes through `forward` once, unjitted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiny_uop import Variable
from tiny_uop.dtype import dtypes
from tiny_tensor.jit import TinyJit
from tiny_tensor.llm.gguf import BLOCK, GGMLType, GGUFTensor
from tiny_tensor.llm.quants import SUPPORTED, dequantize
from tiny_tensor.tensor import Tensor

__all__ = ["Config", "Transformer", "QLinear", "NEOX_ARCHS"]

NEOX_ARCHS = ("qwen2", "qwen3", "phi3", "stablelm", "gptneox", "olmo2")


@dataclass(frozen=True)
class Config:
  """Hyperparameters, read from GGUF metadata `{arch}.*` keys by `Config.from_gguf`."""
  arch: str
  dim: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  hidden_dim: int
  vocab_size: int
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  max_context: int = 2048
  head_dim: int = 0

  @property
  def hd(self) -> int: return self.head_dim or self.dim // self.n_heads

  @staticmethod
  def from_gguf(kv: dict[str, Any], max_context: int | None = None) -> Config:
    arch = kv.get("general.architecture")
    if arch is None: raise ValueError("GGUF metadata has no general.architecture")
    def get(k: str, default: Any = None) -> Any:
      v = kv.get(f"{arch}.{k}", default)
      if v is None: raise ValueError(f"GGUF metadata has no {arch}.{k}, which a {arch} model needs")
      return v
    n_heads = int(get("attention.head_count"))
    ctx = int(get("context_length", 2048))
    vocab = kv.get(f"{arch}.vocab_size") or len(kv.get("tokenizer.ggml.tokens", [])) or None
    if vocab is None: raise ValueError(f"GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    dim = int(get("embedding_length"))
    return Config(arch=arch, dim=dim, n_layers=int(get("block_count")), n_heads=n_heads,
                  n_kv_heads=int(get("attention.head_count_kv", n_heads)), hidden_dim=int(get("feed_forward_length")),
                  vocab_size=int(vocab), norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
                  rope_theta=float(get("rope.freq_base", 10000.0)),
                  max_context=min(ctx, max_context) if max_context else ctx,
                  head_dim=int(kv.get(f"{arch}.attention.key_length", 0)) or dim // n_heads)


class QLinear:
  """y = x @ W.T for a weight W (out, in) stored as GGML blocks (a uint8 Tensor), decoded in the consuming kernel."""

  def __init__(self, raw: Tensor, ggml_type: GGMLType, shape: tuple[int, int]):
    self.raw, self.ggml_type, self.shape = raw, GGMLType(ggml_type), tuple(shape)

  def weight(self) -> Tensor:
    """The weight as a lazy float32 graph over the raw blocks."""
    return dequantize(self.raw, self.ggml_type, self.shape)

  def __call__(self, x: Tensor) -> Tensor: return x @ self.weight().T


class Linear:
  """y = x @ W.T for a float weight W (out, in)."""

  def __init__(self, w: Tensor): self.w = w
  def __call__(self, x: Tensor) -> Tensor: return x @ self.w.T


def _weight(t: GGUFTensor, device: str | None, float_dtype: Any = dtypes.float32) -> Any:
  """A GGUF tensor as a layer weight on the device: float types as float Tensors, quantized ones as raw blocks."""
  if t.ggml_type not in SUPPORTED:
    raise ValueError(f"tensor {t.name!r} has ggml type {t.ggml_type.name}; supported: {[s.name for s in SUPPORTED]}")
  if t.ggml_type == GGMLType.F32: return Tensor(np.ascontiguousarray(t.raw).view(np.float32).reshape(t.shape),
                                                device=device).cast(float_dtype).contiguous().realize()
  if t.ggml_type == GGMLType.F16: return Tensor(np.ascontiguousarray(t.raw).view(np.float16).reshape(t.shape),
                                                device=device).cast(float_dtype).contiguous().realize()
  raw = Tensor(np.ascontiguousarray(t.blocks()), device=device).realize()
  return QLinear(raw, t.ggml_type, t.shape) if len(t.shape) == 2 else dequantize(raw, t.ggml_type, t.shape)


def _linear(t: GGUFTensor, device: str | None, float_dtype: Any) -> Any:
  w = _weight(t, device, float_dtype)
  return w if isinstance(w, QLinear) else Linear(w)


def _vector(t: GGUFTensor, device: str | None) -> Tensor:
  return Tensor(t.numpy().astype(np.float32), device=device).realize()


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
  """x / sqrt(mean(x^2) + eps) * w over the last dim."""
  return x * (x * x).mean(-1, keepdim=True).add(eps).rsqrt() * w


def rope(x: Tensor, cos: Tensor, sin: Tensor, neox: bool) -> Tensor:
  """Rotate (B, T, H, D) by angles cos/sin (T, D/2): adjacent pairs (2i, 2i+1), or halves (i, i + D/2) for NEOX."""
  b, t, h, d = x.shape
  c, s = cos.reshape(1, t, 1, d // 2), sin.reshape(1, t, 1, d // 2)
  if neox:
    x1, x2 = x.shrink((None, None, None, (0, d // 2))), x.shrink((None, None, None, (d // 2, d)))
    return (x1 * c - x2 * s).cat(x2 * c + x1 * s, dim=-1)
  xp = x.reshape(b, t, h, d // 2, 2)
  x1, x2 = xp.shrink((None,) * 4 + ((0, 1),)).reshape(b, t, h, d // 2), xp.shrink((None,) * 4 + ((1, 2),)).reshape(
    b, t, h, d // 2)
  return (x1 * c - x2 * s).unsqueeze(-1).cat((x2 * c + x1 * s).unsqueeze(-1), dim=-1).reshape(b, t, h, d)


class Block:
  """One transformer layer with its KV cache (max_context, n_kv_heads, head_dim) for keys and for values."""

  def __init__(self, cfg: Config, ts: dict[str, GGUFTensor], i: int, device: str | None, float_dtype: Any):
    p = f"blk.{i}."
    self.cfg = cfg
    self.attn_norm = _vector(ts[p + "attn_norm.weight"], device)
    self.ffn_norm = _vector(ts[p + "ffn_norm.weight"], device)
    self.wq, self.wk, self.wv = (_linear(ts[p + f"attn_{n}.weight"], device, float_dtype) for n in "qkv")
    self.wo = _linear(ts[p + "attn_output.weight"], device, float_dtype)
    self.bq, self.bk, self.bv = (_vector(ts[p + f"attn_{n}.bias"], device) if p + f"attn_{n}.bias" in ts else None
                                 for n in "qkv")
    self.w_gate, self.w_up = _linear(ts[p + "ffn_gate.weight"], device, float_dtype), \
      _linear(ts[p + "ffn_up.weight"], device, float_dtype)
    self.w_down = _linear(ts[p + "ffn_down.weight"], device, float_dtype)
    shape = (cfg.max_context, cfg.n_kv_heads, cfg.hd)
    self.cache_k = Tensor.zeros(*shape, device=device).contiguous().realize()
    self.cache_v = Tensor.zeros(*shape, device=device).contiguous().realize()

  def _write_cache(self, k: Tensor, v: Tensor, start_pos: Any, t: int) -> None:
    """Store k, v (t, n_kv, hd) at positions start_pos.. of the caches, in place: an assign into the window of each
    cache (at a bound Variable offset under TinyJit) writes only its t rows."""
    self.cache_k.shrink(((start_pos, start_pos + t), None, None)).assign(k.cast(self.cache_k.dtype))
    self.cache_v.shrink(((start_pos, start_pos + t), None, None)).assign(v.cast(self.cache_v.dtype))

  def __call__(self, x: Tensor, start_pos: Any, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
    cfg = self.cfg
    b, t, _ = x.shape
    # normalized activations go to a buffer first (.contiguous()): fused into a matmul, the norm's reduction would be
    # recomputed for every output element
    h = rms_norm(x, self.attn_norm, cfg.norm_eps).contiguous()
    # each projection in its own buffer: RoPE reads two elements of it, and a kernel holding two matmul reductions
    # (one per element) is one the optimizer leaves unoptimized
    q, k, v = self.wq(h).contiguous(), self.wk(h).contiguous(), self.wv(h)
    if self.bq is not None: q, k, v = q + self.bq, k + self.bk, v + self.bv
    q = q.reshape(b, t, cfg.n_heads, cfg.hd)
    k = k.reshape(b, t, cfg.n_kv_heads, cfg.hd)
    neox = cfg.arch in NEOX_ARCHS
    q, k = rope(q, cos, sin, neox), rope(k, cos, sin, neox)
    self._write_cache(k.reshape(t, cfg.n_kv_heads, cfg.hd), v.reshape(t, cfg.n_kv_heads, cfg.hd), start_pos, t)
    end = start_pos + t
    keys = self.cache_k.shrink(((0, end), None, None))                      # (L, n_kv, hd)
    vals = self.cache_v.shrink(((0, end), None, None))
    rep = cfg.n_heads // cfg.n_kv_heads
    L = keys.shape[0]
    keys = keys.permute(1, 0, 2).reshape(cfg.n_kv_heads, 1, L, cfg.hd).expand(cfg.n_kv_heads, rep, L, cfg.hd) \
      .reshape(cfg.n_heads, L, cfg.hd)
    vals = vals.permute(1, 0, 2).reshape(cfg.n_kv_heads, 1, L, cfg.hd).expand(cfg.n_kv_heads, rep, L, cfg.hd) \
      .reshape(cfg.n_heads, L, cfg.hd)
    qh = q.reshape(t, cfg.n_heads, cfg.hd).permute(1, 0, 2)                 # (H, t, hd)
    scores = (qh @ keys.transpose(1, 2)) * (1.0 / math.sqrt(cfg.hd))        # (H, t, L)
    if mask is not None: scores = scores + mask
    attn = (scores.softmax(-1) @ vals).permute(1, 0, 2).reshape(b, t, cfg.n_heads * cfg.hd)
    x = x + self.wo(attn.contiguous())
    h = rms_norm(x, self.ffn_norm, cfg.norm_eps).contiguous()
    # gate and up in their own buffers, for the same reason (and the optimizer also leaves a matmul whose result feeds
    # silu of another buffer unoptimized): then one small elementwise kernel makes silu(gate) * up
    return x + self.w_down((self.w_gate(h).contiguous().silu() * self.w_up(h).contiguous()).contiguous())


class Transformer:
  """The model: `Transformer(cfg, tensors, device)`; `forward(emb_raw, start_pos)` -> logits of the last position.

  The token embedding stays in host memory (a memory-mapped GGUF tensor): the rows of the tokens fed are gathered on
  the host and decoded on the device (`embed_rows`), so the embedding table never moves whole.
  """

  def __init__(self, cfg: Config, ts: dict[str, GGUFTensor], device: str | None = None,
               float_dtype: Any = dtypes.float32):
    self.cfg, self.device = cfg, device
    need = ["token_embd.weight", "output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(cfg.n_layers) for n in (
      "attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    if missing := [n for n in need if n not in ts]:
      raise ValueError(f"the GGUF file lacks {len(missing)} tensor(s) a {cfg.arch} model needs: {missing[:8]}"
                       f"{' ...' if len(missing) > 8 else ''} (is it a LLaMA-family model?)")
    emb = ts["token_embd.weight"]
    if emb.shape != (cfg.vocab_size, cfg.dim):
      raise ValueError(f"token_embd.weight has shape {emb.shape}, expected ({cfg.vocab_size}, {cfg.dim})")
    self.emb, self.emb_type = emb.blocks().reshape(cfg.vocab_size, -1), emb.ggml_type
    self.layers = [Block(cfg, ts, i, device, float_dtype) for i in range(cfg.n_layers)]
    self.norm = _vector(ts["output_norm.weight"], device)
    self.output = _linear(ts.get("output.weight", emb), device, float_dtype)
    hd = cfg.hd
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    ang = np.outer(np.arange(cfg.max_context), freqs)
    self.cos = Tensor(np.cos(ang).astype(np.float32), device=device).realize()
    self.sin = Tensor(np.sin(ang).astype(np.float32), device=device).realize()
    self.step = TinyJit(self._decode_step)
    self.pos_var = Variable("start_pos", 1, cfg.max_context - 1)

  def embed_rows(self, tokens: list[int]) -> Tensor:
    """The raw embedding rows of `tokens` (host gather), as a (T, row bytes) uint8 Tensor on the device."""
    bad = [t for t in tokens if not 0 <= t < self.cfg.vocab_size]
    if bad: raise ValueError(f"token ids {bad} are out of the vocabulary [0, {self.cfg.vocab_size})")
    return Tensor(np.ascontiguousarray(self.emb[np.asarray(tokens, dtype=np.int64)]), device=self.device)

  def _embed(self, rows: Tensor) -> Tensor:
    t = rows.shape[0]
    be, bb = BLOCK[self.emb_type]
    return dequantize(rows.reshape(-1, bb), self.emb_type, (1, t, self.cfg.dim))

  def forward(self, rows: Tensor, start_pos: Any) -> Tensor:
    """Logits (vocab,) of the last of the T tokens whose embedding rows are `rows`, at positions start_pos.. (an int,
    or a bound Variable when T is 1); the KV caches are updated."""
    t = rows.shape[0]
    x = self._embed(rows)
    cos = self.cos.shrink(((start_pos, start_pos + t), None))
    sin = self.sin.shrink(((start_pos, start_pos + t), None))
    mask = None
    if t > 1:
      sp = int(start_pos)
      causal = np.triu(np.full((t, sp + t), -np.inf, np.float32), sp + 1)
      mask = Tensor(causal, device=self.device).reshape(1, t, sp + t)
    for layer in self.layers: x = layer(x, start_pos, cos, sin, mask)
    x = rms_norm(x.shrink((None, (t - 1, t), None)), self.norm, self.cfg.norm_eps).contiguous()
    return self.output(x).reshape(self.cfg.vocab_size)

  def _decode_step(self, rows: Tensor, start_pos: Any) -> Tensor:
    return self.forward(rows, start_pos).realize()

  def decode(self, token: int, pos: int) -> Tensor:
    """Logits after feeding one token at position `pos` (>= 1) through the TinyJit-ed step."""
    if not 1 <= pos < self.cfg.max_context:
      raise ValueError(f"position {pos} is outside [1, {self.cfg.max_context}) (the context is full)")
    return self.step(self.embed_rows([token]), self.pos_var.bind(pos))

  def prefill(self, tokens: list[int], start_pos: int = 0) -> Tensor:
    """Logits after feeding `tokens` at positions start_pos.. in one (unjitted) pass."""
    if start_pos + len(tokens) > self.cfg.max_context:
      raise ValueError(f"{len(tokens)} tokens at position {start_pos} don't fit the context of {self.cfg.max_context}")
    return self.forward(self.embed_rows(tokens), start_pos).realize()
