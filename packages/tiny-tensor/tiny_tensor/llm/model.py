"""LLaMA-family transformers (RMSNorm, RoPE, grouped-query attention, gated feed-forward) over GGUF weights.

Architectures (`general.architecture`) are a table, `ARCHS`: each names how it differs from LLaMA (RoPE style,
activation, embedding scale, per-head q/k norms, post-norms, logit soft-capping, sliding-window layers) and which
tensors it has. A file whose architecture is not in the table, or that holds a tensor the architecture doesn't use,
is refused by name: nothing is run as the wrong model.

Weights keep their GGUF type: a float weight is a float Tensor, a quantized one a uint8 Tensor of raw blocks that
`QLinear` decodes with `llm.quants.dequantize` inside the matmul's graph. Names and conventions are llama.cpp's:
`token_embd`, `blk.N.attn_{norm,q,k,v,output}`, `blk.N.ffn_{norm,gate,up,down}`, `output_norm`, `output` (tied to
`token_embd` when absent); a weight's numpy shape is (out, in). RoPE rotates adjacent pairs for `llama` (the GGUF
converter permutes q/k rows for it) and the two halves of each head for NEOX-style architectures (`qwen2`, `gemma`,
...). Gemma's RMSNorm scales by (1 + w): llama.cpp's converter stores 1 + w in the file, so every norm here is x * w.

Decoding: one token at a time through `Transformer.step`, a TinyJit-ed function whose position is a bound
`Variable`: the KV cache is written by an assign into its one-row window at that position (a kernel that writes
n_kv * head_dim elements, whatever the context) and read through a symbolic shrink, so the same captured kernels
serve every position (`Transformer.decode`). A float32 weight's one-token product runs as `quants.f32_matvec`'s
kernel on the LLVM CPU (`tiny_codegen.matvec_ir`: the weight rows prefetched, a decode step being a memory stream).

int8 activations: on a CPU whose machine model lists AVX512-VNNI (+VL) or AVX-VNNI (`quants.int8_dot_products`), a
one-token matvec over a Q8_0 or Q4_K weight quantizes its input to int8 as llama.cpp does, Q8_0's per block of 32,
Q4_K's per super-block of 256 (its Q8_K) (scale max|x| / 127, values rounded to nearest, ties to even where
llama.cpp rounds them away from zero; one kernel per input, shared by the weights that read it) and multiplies the
weight's int8 values (Q4_K: its nibbles) by it (`tiny_codegen.x86_vnni`): Q8_0 per 32-block an exact int32 sum on
`vpdpbusd` times both scales in float32; Q4_K per super-block the nibble products (`vpmaddubsw`) times the 6-bit
sub-block scales summed in int32 (`vpdpwssd`), minus the mins times the activations' sums per 32, then d and dmin
times the activations' scale in float32. The numbers move by the activations' rounding: about 0.5% rms of a
matvec's output per 32, 0.5-0.8% per 256, a few 1e-3 of the logits of a small random model (tests:
`test_quant_matvec.py`, `test_int8_activations_match_transformers_greedy`); llama.cpp's quantized decode has the same
kind of error. Elsewhere, and
for prefill chunks and the other types, the weight is decoded to float32 as before.

Prefill: the prompt goes through a second TinyJit-ed function, `Transformer.chunk_step`, in chunks of a fixed
`prefill_chunk` tokens (`prefill_chunk_size`: from the model's widest activation and the host's L2), at a bound start
position `prefill_pos` and with the row whose logits are returned a bound `prefill_last`: the last chunk is padded
with token 0, whose keys and values land in cache rows past the prompt that no real query sees (causal mask) and that
the next token's write replaces. One capture serves every chunk of every prompt; a chunk that would run past the
context (the padding included) goes through `forward` unjitted. Before the first multi-token prefill the layer weights
that a chunk would decode or pack again on every call get a copy laid out as the chunk's matmul reads it
(`DenseWeight`), when the copies fit `dense_budget`: a quantized weight's in bfloat16 where the CPU has a bfloat16
kernel for the product (`prefill_bf16_kernel`: AMX tiles, else AVX512-BF16's `vdpbf16ps`; float32 elsewhere and for
float weights), so a chunk's products over quantized weights round the
weights and the chunk's activations to bfloat16 (relative 2**-9; llama.cpp rounds them to 8 bits).

Attention is grouped: the n_heads / n_kv_heads query heads of a KV head are one row block against that head's cache,
read as a strided view (never expanded to every query head: merged with the symbolic length, that expansion made
each key load an integer division).
"""
from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tiny_uop import Variable
from tiny_uop.dtype import dtypes
from tiny_uop.uop import sint
from tiny_tensor import engine
from tiny_tensor.jit import TinyJit
from tiny_tensor.llm.gguf import BLOCK, GGMLType, GGUFTensor
from tiny_tensor.llm.quants import (SUPPORTED, dequantize, f32_matvec, int8_dot_products, q4_k_matvec,
                                   q8_0_matvec, quantize_q8_act)
from tiny_tensor.tensor import Tensor

__all__ = ["Config", "Transformer", "QLinear", "ArchSpec", "ARCHS", "NEOX_ARCHS", "prefill_chunk_size"]

_BIAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class ArchSpec:
  """How one GGUF architecture differs from LLaMA, and the per-block tensors (`blk.N.<name>`) it has."""
  neox: bool = False                 # RoPE on the two halves of each head (else adjacent pairs)
  act: str = "silu"                  # the gate's activation: "silu" or "gelu_tanh"
  embed_scale: bool = False          # embeddings times sqrt(embedding_length) (Gemma)
  post_norms: bool = False           # RMSNorm of the attention and feed-forward outputs before each residual add
  swa_every: int = 0                 # with a sliding window, every swa_every-th layer is global, the others slide
  swa_rope_base: float = 0.0         # RoPE base of the sliding layers when the file names none (0: the global one)
  # block counts of the models whose scores scale by 1/sqrt(embedding_length / head_count), not 1/sqrt(head_dim): the
  # 27B Gemma 2 (46 blocks) and Gemma 3 (62) were trained with query_pre_attn_scalar = 144, which their GGUF files
  # don't hold; llama.cpp picks the scale by block count the same way
  dim_scale_blocks: tuple[int, ...] = ()
  block: tuple[str, ...] = field(default=tuple(n + ".weight" for n in _BLOCK))  # required per block
  optional: tuple[str, ...] = ()     # allowed per block

  @property
  def qk_norm(self) -> bool:
    """Whether q and k get a per-head RMSNorm before RoPE (Qwen3, Gemma 3)."""
    return "attn_q_norm.weight" in self.block


_QK_NORM = ("attn_q_norm.weight", "attn_k_norm.weight")
_POST = ("post_attention_norm.weight", "post_ffw_norm.weight")
_LLAMA_BLOCK = tuple(n + ".weight" for n in _BLOCK)
ARCHS: dict[str, ArchSpec] = {
  "llama": ArchSpec(optional=_BIAS),
  "qwen2": ArchSpec(neox=True, optional=_BIAS),
  "qwen3": ArchSpec(neox=True, block=_LLAMA_BLOCK + _QK_NORM),
  "gemma": ArchSpec(neox=True, act="gelu_tanh", embed_scale=True),
  "gemma2": ArchSpec(neox=True, act="gelu_tanh", embed_scale=True, post_norms=True, swa_every=2,
                     dim_scale_blocks=(46,), block=_LLAMA_BLOCK + _POST),
  "gemma3": ArchSpec(neox=True, act="gelu_tanh", embed_scale=True, post_norms=True, swa_every=6,
                     swa_rope_base=10000.0, dim_scale_blocks=(62,), block=_LLAMA_BLOCK + _POST + _QK_NORM),
}
NEOX_ARCHS = tuple(a for a, s in ARCHS.items() if s.neox)
# tensors outside the blocks: required, and optional ones (`output` is tied to `token_embd` when absent; `rope_freqs`
# holds Llama 3.1-style per-dimension frequency divisors)
_GLOBAL = ("token_embd.weight", "output_norm.weight")
_GLOBAL_OPTIONAL = ("output.weight", "rope_freqs.weight")


def _count(kv: dict[str, Any], key: str, default: Any = None) -> int:
  """A positive integer hyperparameter from the GGUF metadata."""
  v = kv.get(key, default)
  if v is None: raise ValueError(f"GGUF metadata has no {key}, which the model needs")
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
    raise ValueError(f"GGUF metadata {key} = {v!r} ({type(v).__name__}); expected a positive integer")
  if v <= 0: raise ValueError(f"GGUF metadata {key} = {v}; expected a positive integer")
  return int(v)


def _positive(kv: dict[str, Any], key: str, default: float) -> float:
  """A positive finite float hyperparameter from the GGUF metadata (`default` when absent)."""
  v = kv.get(key, default)
  if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 < v < math.inf:
    raise ValueError(f"GGUF metadata {key} = {v!r}; expected a positive finite number")
  return float(v)


@dataclass(frozen=True)
class Config:
  """Hyperparameters, read from GGUF metadata `{arch}.*` keys by `Config.from_gguf`; checked when built."""
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
  rope_scale: float = 1.0             # linear RoPE scaling: positions are divided by it (not on sliding layers)
  rope_theta_swa: float = 0.0         # RoPE base of the sliding-window layers (0: rope_theta)
  sliding_window: int = 0             # keys older than this many positions are masked on sliding layers (0: none)
  attn_softcap: float = 0.0           # scores -> c * tanh(scores / c) (Gemma 2), 0: none
  final_softcap: float = 0.0          # logits -> c * tanh(logits / c) (Gemma 2), 0: none
  attn_scale: float = 0.0             # the scores' scale (0: 1 / sqrt(head_dim))
  swa_period: int = 0                 # every swa_period-th layer is global, the others slide (0: the architecture's)
  swa_layers: tuple[bool, ...] = ()   # or which layers slide, one flag per layer (a file's pattern array)

  def __post_init__(self) -> None:
    if self.arch not in ARCHS:
      raise ValueError(f"architecture {self.arch!r} is not implemented; implemented: {sorted(ARCHS)}")
    for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "vocab_size", "max_context"):
      v = getattr(self, k)
      if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"Config.{k} = {v!r}; expected a positive integer")
    for k in ("norm_eps", "rope_theta", "rope_scale"):
      if not 0 < getattr(self, k) < math.inf: raise ValueError(f"Config.{k} = {getattr(self, k)}; expected > 0")
    for k in ("head_dim", "rope_theta_swa", "sliding_window", "attn_softcap", "final_softcap", "attn_scale"):
      if not 0 <= getattr(self, k) < math.inf: raise ValueError(f"Config.{k} = {getattr(self, k)}; expected >= 0")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"head_count {self.n_heads} is not a multiple of head_count_kv {self.n_kv_heads}")
    if not self.head_dim and self.dim % self.n_heads:
      raise ValueError(f"embedding_length {self.dim} is not a multiple of head_count {self.n_heads} "
                       "(and the file has no attention.key_length)")
    if self.swa_layers and len(self.swa_layers) != self.n_layers:
      raise ValueError(f"sliding_window_pattern has {len(self.swa_layers)} flags for {self.n_layers} layers")
    if self.hd % 2: raise ValueError(f"head dimension {self.hd} is odd; RoPE rotates pairs")

  @property
  def spec(self) -> ArchSpec: return ARCHS[self.arch]

  @property
  def hd(self) -> int: return self.head_dim or self.dim // self.n_heads

  @property
  def scale(self) -> float:
    """The attention scores' scale: attention.scale from the file, else 1/sqrt(head_dim) (1/sqrt(dim / heads) for
    the architectures' models listed in `ArchSpec.dim_scale_blocks`)."""
    if self.attn_scale: return self.attn_scale
    return 1.0 / math.sqrt(self.dim // self.n_heads if self.n_layers in self.spec.dim_scale_blocks else self.hd)

  def sliding(self, layer: int) -> bool:
    """Whether `layer` attends only to the last `sliding_window` positions."""
    if not self.sliding_window: return False
    if self.swa_layers: return bool(self.swa_layers[layer])
    period = self.swa_period or self.spec.swa_every
    return bool(period and (layer + 1) % period)

  @staticmethod
  def from_gguf(kv: dict[str, Any], max_context: int | None = None) -> Config:
    """The hyperparameters of a GGUF file's metadata, checked (ValueError naming the bad key and value)."""
    arch = kv.get("general.architecture")
    if arch is None: raise ValueError("GGUF metadata has no general.architecture")
    if arch not in ARCHS:
      raise ValueError(f"GGUF architecture {arch!r} is not implemented; implemented: {sorted(ARCHS)}")
    spec = ARCHS[arch]
    n_heads = _count(kv, f"{arch}.attention.head_count")
    ctx = _count(kv, f"{arch}.context_length", 2048)
    if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                    or max_context <= 0):
      raise ValueError(f"max_context = {max_context!r}; expected a positive integer or None")
    if f"{arch}.vocab_size" in kv: vocab = _count(kv, f"{arch}.vocab_size")
    elif kv.get("tokenizer.ggml.tokens"): vocab = len(kv["tokenizer.ggml.tokens"])
    else: raise ValueError(f"GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    scaling = kv.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
      raise ValueError(f"GGUF {arch}.rope.scaling.type = {scaling!r} is not implemented; implemented: none, linear")
    window = _count(kv, f"{arch}.attention.sliding_window") if spec.swa_every and \
      f"{arch}.attention.sliding_window" in kv else 0
    pattern = kv.get(f"{arch}.attention.sliding_window_pattern", 0) if window else 0
    if isinstance(pattern, list) and not all(isinstance(f, bool) for f in pattern) or \
       not isinstance(pattern, list) and (isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 0):
      raise ValueError(f"GGUF {arch}.attention.sliding_window_pattern = {pattern!r}; expected a positive integer "
                       "(every N-th layer global) or one bool per layer (true: sliding)")
    return Config(arch=arch, dim=_count(kv, f"{arch}.embedding_length"), n_layers=_count(kv, f"{arch}.block_count"),
                  n_heads=n_heads, n_kv_heads=_count(kv, f"{arch}.attention.head_count_kv", n_heads),
                  hidden_dim=_count(kv, f"{arch}.feed_forward_length"), vocab_size=vocab,
                  norm_eps=_positive(kv, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
                  rope_theta=_positive(kv, f"{arch}.rope.freq_base", 10000.0),
                  max_context=min(ctx, max_context) if max_context else ctx,
                  head_dim=_count(kv, f"{arch}.attention.key_length", 0) if f"{arch}.attention.key_length" in kv
                  else 0,
                  rope_scale=_positive(kv, f"{arch}.rope.scaling.factor", 1.0) if scaling == "linear" else 1.0,
                  rope_theta_swa=_positive(kv, f"{arch}.rope.freq_base_swa", spec.swa_rope_base or 1.0)
                  if spec.swa_rope_base or f"{arch}.rope.freq_base_swa" in kv else 0.0,
                  sliding_window=window, swa_period=pattern if isinstance(pattern, int) else 0,
                  swa_layers=tuple(pattern) if isinstance(pattern, list) else (),
                  attn_softcap=_positive(kv, f"{arch}.attn_logit_softcapping", 1.0)
                  if f"{arch}.attn_logit_softcapping" in kv else 0.0,
                  final_softcap=_positive(kv, f"{arch}.final_logit_softcapping", 1.0)
                  if f"{arch}.final_logit_softcapping" in kv else 0.0,
                  attn_scale=_positive(kv, f"{arch}.attention.scale", 1.0) if f"{arch}.attention.scale" in kv else 0.0)


def expected_shapes(cfg: Config, names: list[str]) -> dict[str, tuple[int, ...]]:
  """The shape (numpy order) each tensor of `names` must have under `cfg`."""
  d, hd, q, kv = cfg.dim, cfg.hd, cfg.n_heads * cfg.hd, cfg.n_kv_heads * cfg.hd
  per_block = {"attn_norm.weight": (d,), "ffn_norm.weight": (d,), "post_attention_norm.weight": (d,),
               "post_ffw_norm.weight": (d,), "attn_q.weight": (q, d), "attn_k.weight": (kv, d),
               "attn_v.weight": (kv, d), "attn_output.weight": (d, q), "attn_q.bias": (q,), "attn_k.bias": (kv,),
               "attn_v.bias": (kv,), "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
               "ffn_gate.weight": (cfg.hidden_dim, d), "ffn_up.weight": (cfg.hidden_dim, d),
               "ffn_down.weight": (d, cfg.hidden_dim)}
  glob = {"token_embd.weight": (cfg.vocab_size, d), "output.weight": (cfg.vocab_size, d), "output_norm.weight": (d,),
          "rope_freqs.weight": (hd // 2,)}
  return {n: glob[n] if n in glob else per_block[n.split(".", 2)[2]] for n in names}


_BLK = re.compile(r"blk\.(\d+)\.(.+)")


def check_tensors(cfg: Config, ts: dict[str, GGUFTensor]) -> None:
  """Every tensor of the file is one `cfg.arch` uses, every one it needs is there, each with its expected shape;
  else ValueError naming the tensors (and, for a shape, the shape found and the one expected)."""
  spec = cfg.spec
  if cfg.n_layers > len(ts):  # checked before listing the names a block needs: each block needs its own tensors
    raise ValueError(f"{cfg.arch}.block_count = {cfg.n_layers}, but the file holds only {len(ts)} tensors")
  per_block = set(spec.block) | set(spec.optional)
  unknown = []
  for name in ts:
    m = _BLK.fullmatch(name)
    if m is None: known = name in _GLOBAL or name in _GLOBAL_OPTIONAL
    else: known = m.group(2) in per_block and m.group(1) == str(int(m.group(1))) and int(m.group(1)) < cfg.n_layers
    if not known: unknown.append(name)
  if unknown:
    raise ValueError(f"the GGUF file has {len(unknown)} tensor(s) a {cfg.arch} model doesn't use: {unknown[:8]}"
                     f"{' ...' if len(unknown) > 8 else ''} (with {cfg.n_layers} blocks, each of "
                     f"{sorted(per_block)}); running without them would give wrong results")
  need = list(_GLOBAL) + [f"blk.{i}.{n}" for i in range(cfg.n_layers) for n in spec.block]
  if missing := [n for n in need if n not in ts]:
    raise ValueError(f"the GGUF file lacks {len(missing)} tensor(s) a {cfg.arch} model needs: {missing[:8]}"
                     f"{' ...' if len(missing) > 8 else ''}")
  for name, want in expected_shapes(cfg, list(ts)).items():
    if tuple(ts[name].shape) != want:
      raise ValueError(f"tensor {name!r} has shape {tuple(ts[name].shape)}, expected {want} for {cfg.arch} with "
                       f"embedding_length {cfg.dim}, {cfg.n_heads} heads ({cfg.n_kv_heads} kv) of {cfg.hd}, "
                       f"feed_forward_length {cfg.hidden_dim}, vocab {cfg.vocab_size}")


class QLinear:
  """y = x @ W.T for a weight W (out, in) stored as GGML blocks (a uint8 Tensor), decoded in the consuming kernel."""

  def __init__(self, raw: Tensor, ggml_type: GGMLType, shape: tuple[int, int]):
    self.raw, self.ggml_type, self.shape = raw, GGMLType(ggml_type), tuple(shape)
    self.dense: DenseWeight | None = None  # the weight decoded once for multi-row calls (`Transformer.prefill`)

  def weight(self) -> Tensor:
    """The weight as a lazy float32 graph over the raw blocks."""
    return dequantize(self.raw, self.ggml_type, self.shape)

  def __call__(self, x: Tensor) -> Tensor:
    """x (..., in) @ W.T: one token decodes W inside the matvec; several (a prefill chunk) decode it once into a
    float buffer that an f32 matmul reads (fused into the matmul, every block was decoded again for every token)."""
    o, k = self.shape
    if math.prod(x.shape[:-1]) != 1:
      return self.dense(x) if self.dense is not None else x @ self.weight().contiguous().T
    if self.ggml_type == GGMLType.Q8_0 and k % 32 == 0 and int8_dot_products(x.device):
      # llama.cpp's int8 activations (one quantizing kernel per x, shared by the weights that read it) and the
      # VNNI kernel: 2048x768 one thread 150-230 -> 70-80 us (bench/README.md, "int8 decode matvecs on vpdpbusd")
      xq, xd = quantize_q8_act(x.reshape(k))
      return q8_0_matvec(self.raw, xq, xd, o).reshape(*x.shape[:-1], o)
    if self.ggml_type == GGMLType.Q4_K and k % 256 == 0 and int8_dot_products(x.device):
      # int8 activations with one scale per super-block (llama.cpp's Q8_K), so the kernel applies the sub-block
      # scales in int32: nibbles x int8 on vpmaddubsw, x scale on vpdpwssd (bench/README.md, "wt-llm (session 10)")
      xq, xd = quantize_q8_act(x.reshape(k), 256)
      if (y := q4_k_matvec(self.raw, xq, xd, o)) is not None: return y.reshape(*x.shape[:-1], o)
    g = _MATVEC_GROUP.get(self.ggml_type)
    if g is None or k % g: return x @ self.weight().T
    # one token: the reduction as (k / g groups) x g, one REDUCE over both axes (same sum, grouped)
    w = self.weight().reshape(o, k // g, g)
    return (x.reshape(*x.shape[:-1], 1, k // g, g) * w).sum((-2, -1))


# The matvec of these K-quants reduces over (K/64 groups) x 64: the inner loop then covers two 32-element sub-blocks
# whose nibbles share 32 bytes, and the sub-blocks' scale/min decoding (6-bit fields, f16 d and dmin) moves out of it;
# with one flat reduction it was redone for every 16 lanes. 2048x768 on a loaded 2-core Xeon (AVX-512, one thread,
# best CPU time of 7x20): Q4_K 468-498 -> 237 us (Q8_0: 132), Q6_K 520 -> 395 us. Q5_K (656 -> 621) and Q8_0 /
# the 32-element formats (132 -> 141) gain nothing and keep the flat reduction.
_MATVEC_GROUP = {GGMLType.Q4_K: 64, GGMLType.Q6_K: 64}


class Linear:
  """y = x @ W.T for a float weight W (out, in)."""

  def __init__(self, w: Tensor):
    self.w = w
    self.dense: DenseWeight | None = None  # W in the matmul's panels for multi-row calls (`Transformer.prefill`)

  def __call__(self, x: Tensor) -> Tensor:
    """x (..., in) @ W.T: one token's float32 product as `quants.f32_matvec`'s kernel where it runs (each weight row
    prefetched), several (a prefill chunk) from the kept panels (`dense`) where there are some."""
    if math.prod(x.shape[:-1]) != 1: return self.dense(x) if self.dense is not None else x @ self.w.T
    if self.w.dtype == dtypes.float32 and x.dtype == dtypes.float32 and F32_MATVEC and \
       (y := f32_matvec(self.w, x.reshape(x.shape[-1]))) is not None:
      return y.reshape(*x.shape[:-1], self.w.shape[0])
    return x @ self.w.T


F32_MATVEC = os.environ.get("TINY_LLM_F32_MATVEC", "1") != "0"
"""Whether one-token float32 products run as `quants.f32_matvec`'s prefetching kernel (where it runs): off
(`TINY_LLM_F32_MATVEC=0`) they are lowered as `x @ W.T`, for before/after timings."""


class DenseWeight:
  """A weight W (out, in) kept for the multi-row products of prefill chunks (`x @ W.T`, x (..., rows, in)), laid out
  once as the matmul reads it: a quantized weight (`amx=True`) on a CPU with a bfloat16 kernel for the chunk's
  product (`prefill_bf16_kernel`, `kernel`), as W.T in bfloat16: on AMX tiles in `tiny_codegen.x86_amx`'s tile panels
  (`packed`: the kernel reads them in place, where per call it packed 32 columns of W.T's rows, 4 KB apart, into its
  stack: 2048x768 one thread 612 -> 264 us), for `tiny_codegen.x86_bf16`'s `vdpbf16ps` kernel (no AMX, AVX512-BF16)
  as W.T itself, (in, out) contiguous, the B that kernel reads; else in the column panels (out // P, in, P) of the CPU's
  float32 matmul (`_prefill_panel`), else as W itself, contiguous.

  A 32-token chunk of the bench LLM (4 layers, one thread) spent 60% of its kernel time decoding every Q4_K weight
  to float32 and packing it into panels again, chunk after chunk (issue #39); llama.cpp multiplies the blocks
  directly. Built from a QLinear's decoded weight, this trades memory (`dense_budget`) for it. The float32 copies
  (100 MB for that model) then came from memory on every chunk: 22-24 ms of CPU a chunk against 13-15 ms for its
  kernels run alone; the bfloat16 ones on AMX (half the bytes, the tile kernel's compute) 14 ms."""

  def __init__(self, w: Tensor, rows: int, amx: bool = False):
    """`w`: the (out, in) float weight (a lazy graph, such as a QLinear's decoding, is fine: it is realized here, into
    a buffer of its own first: decoded straight into the panels, the transposed writes ran 4-5x slower); `rows`: the
    rows of x a call has; `amx`: the bfloat16 layout where `prefill_bf16_kernel` names a kernel for this shape."""
    self.out, self.inp = (int(d) for d in w.shape)
    self.rows = rows
    self.kernel = prefill_bf16_kernel(w.device, rows, self.out, self.inp) if amx else None
    self.bf16 = self.kernel is not None
    self.panel = 0 if self.bf16 else _prefill_panel(w, rows)
    w = w.contiguous().realize()
    self.packed = self.kernel == "amx" and _register_packed_b(rows, self.out, self.inp)
    if self.bf16: wt = w.T.cast(dtypes.bfloat16)                          # (in, out): the tile kernel's B
    if self.packed:  # in the tile kernel's panels (N/32, 2, K/2, 16, 2): the kernel reads them in place
      from tiny_codegen.x86_amx import pack_b
      shape, to_panels, _ = pack_b(self.inp, self.out)
      wt = wt.reshape(*shape).permute(*to_panels)
    elif self.bf16: pass
    else: wt = w.T.reshape(self.inp, self.out // self.panel, self.panel).permute(1, 0, 2) if self.panel else w
    self.w = wt.contiguous().realize()

  def __call__(self, x: Tensor) -> Tensor:
    """x (..., in) @ W.T -> (..., out), reading the kept layout in place."""
    lead = x.shape[:-1]
    if self.bf16 and math.prod(lead) == self.rows:
      # x rounded to bfloat16 in a buffer of its own (the tile kernel reads A from one), float32 sums
      xb = x.reshape(self.rows, self.inp).cast(dtypes.bfloat16).contiguous()
      return xb.dot(self._b(), dtype=dtypes.float32).reshape(*lead, self.out)
    if self.bf16: return x @ self._b().float()
    if not self.panel: return x @ self.w.T
    return (x.reshape(*lead, 1, self.inp, 1) * self.w).sum(-2).reshape(*lead, self.out)


  def _b(self) -> Tensor:
    """The bfloat16 (in, out) B of the tile kernel: the kept weight, or a view of its panels (`packed`)."""
    return _panels_as_b(self.w, self.inp, self.out) if self.packed else self.w


def _panels_as_b(panels: Tensor, k: int, n: int) -> Tensor:
  """The (K, N) B that `x86_amx.pack_b`'s panels (N/32, 2, K/2, 16, 2) hold, as a view of them."""
  from tiny_codegen.x86_amx import pack_b
  _, _, back = pack_b(k, n)
  return panels.permute(*back).reshape(k, n)


@functools.cache
def _register_packed_b(rows: int, out: int, inp: int) -> bool:
  """Schedule a chunk's (rows, inp) bfloat16 activations times a weight's panels (`_panels_as_b`) over placeholders
  once and register the kernel AST with `tiny_codegen.x86_amx` (`register_packed_b`), so the tile kernel reads the
  panels in place: True when registered; False where the scheduler makes another kernel of it or orders its PARAMs
  otherwise (then `DenseWeight` keeps W.T, which the kernel packs per call)."""
  from tiny_codegen import x86_amx
  from tiny_uop.uop import Ops
  xb = Tensor.empty(rows, inp, dtype=dtypes.bfloat16, device="CPU")
  pw = Tensor.empty(out // x86_amx.BLOCK, 2, inp // 2, x86_amx.TILE_ROWS, 2, dtype=dtypes.bfloat16, device="CPU")
  calls = [c for c in xb.dot(_panels_as_b(pw, inp, out), dtype=dtypes.float32).schedule().calls
           if c.src[0].op is Ops.SINK]
  if len(calls) != 1 or len(calls[0].src) != 4: return False
  bufs = {u: name for name, t in (("a", xb), ("b", pw)) for u in t.uop.toposort() if u.op is Ops.BUFFER}
  if tuple(bufs.get(b, "out") for b in calls[0].src[1:]) != ("out", "a", "b"): return False
  params = sorted((u for u in calls[0].src[0].toposort() if u.op is Ops.PARAM), key=lambda u: u.arg)
  if [p.arg for p in params] != [0, 1, 2]: return False
  x86_amx.register_packed_b(calls[0].src[0], rows, out, inp)
  return True


PREFILL_AMX = True
"""Whether prefill chunks may multiply quantized weights in bfloat16 on the CPU's bfloat16 kernel
(`prefill_bf16_kernel`: AMX tiles or `vdpbf16ps`); False keeps their float32 copies (tests that hold the prefill to a
float64 reference to 1e-4 turn it off)."""


def prefill_bf16_kernel(device: Any, rows: int, out: int, inp: int) -> str | None:
  """Which bfloat16 kernel takes a prefill chunk's (rows, inp) @ (inp, out) product over a quantized weight
  (`DenseWeight`): "amx" where the AMX tiles run (`prefill_amx`), else "avx512_bf16" where `tiny_codegen.x86_bf16`'s
  `vdpbf16ps` kernel does on this machine (`x86_bf16.plan` for the shape over the renderer's threads, `usable`: the
  machine model lists AVX512-BF16, the probe ran it, no AMX tiles), on the CPU device with the LLVM renderer; None:
  the float32 copies. Both kernels add exact products of the bfloat16-rounded weight and activations in float32, so
  the logits move by the same rounding (relative 2**-9 each) on either; on Zen 4 `vdpbf16ps` does 2x the flops of
  the float32 GEMM's FMAs and the copy is half the bytes."""
  if device != "CPU": return None
  if prefill_amx(device, rows, out, inp): return "amx"
  from tiny_codegen import x86_bf16
  from tiny_uop.plugins import Device
  return "avx512_bf16" if x86_bf16.for_renderer(Device["CPU"].renderer, rows, out, inp) is not None else None


def prefill_amx(device: Any, rows: int, out: int, inp: int) -> bool:
  """Whether a prefill chunk's (rows, inp) @ (inp, out) product over a quantized weight runs on AMX tiles in
  bfloat16 (`DenseWeight`): the CPU device with the LLVM renderer, a process allowed tile state
  (`x86_amx.request_tile_state`) and a shape the tile kernel takes (`x86_amx.fits`). The logits then move by the
  bfloat16 rounding of the weight and of the chunk's activations (relative 2**-9 each, less than llama.cpp's 8-bit
  activations for the same products)."""
  if device != "CPU": return False
  from tiny_codegen import x86_amx
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  from tiny_uop.plugins import Device
  return isinstance(Device["CPU"].renderer, LLVMRenderer) and x86_amx.fits(rows, out, inp) and \
    x86_amx.request_tile_state()


def _prefill_panel(w: Tensor, rows: int) -> int:
  """The panel width P of `DenseWeight`'s float32 layout for `rows` x (out, in) @ W.T on w's device (0: W as it is):
  what `Tensor.dot` packs a transposed right operand into for that product (the CPU's heuristic, from its machine
  model), and two vectors of columns where that heuristic reads W in place because a per-call copy wouldn't pay for
  itself (W under the L2: the k/v projections, 256 x 768): here the copy is made once, and in place the chunk's
  product gathered W's columns K floats apart (one thread, 4-layer Q4_K chunk: the 8 k/v products 2.1 -> 0.6 ms).
  Those panels from `PANEL_MIN_ROWS` rows: a property of the product, not of a cache or register file. Under the
  heuristic's packing rows, x @ W.T in place is one dot product over K per row and output, each row reading all of W
  again; the panel product reads W once per call for all rows. With one row both read W once (Xeon 6/207, one thread,
  CPU time: 2048x768 295 vs 296 us; two rows 577 vs 295, four 765 vs 301, eight 923 vs 379; 256x768 two rows 44 vs
  20 us), so the old `rows >= 8` (one AVX-512 register block) left 2-7-row chunks reading W per row."""
  from tiny_uop.plugins import Device
  if not isinstance(w.device, str): return 0
  renderer = Device[w.device].renderer
  if not hasattr(renderer, "vector_registers"): return 0
  from tiny_codegen.opt.heuristic import gemm_panel
  out, inp = (int(d) for d in w.shape)
  if (p := gemm_panel(renderer, rows, inp, out, w.dtype.itemsize, strided=True)): return p
  regs, width = renderer.vector_registers
  p = 2 * width // w.dtype.itemsize if regs and width >= 32 and w.dtype.itemsize == 4 else 0
  return p if p and out % p == 0 and out >= 2 * p and rows >= PANEL_MIN_ROWS else 0


PANEL_MIN_ROWS = 2
"""Rows of x from which `_prefill_panel` lays a weight out in panels where the matmul heuristic would read it in
place: two, the first count at which the in-place product reads W more than once (once per row)."""


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


def rope_tables(cfg: Config, theta: float, scale: float, factors: np.ndarray | None,
                device: str | None) -> tuple[Tensor, Tensor]:
  """cos and sin (max_context, head_dim/2) of angle pos / scale * theta^(-2i/d) / factors[i]."""
  hd = cfg.hd
  freqs = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
  if factors is not None: freqs = freqs / factors.astype(np.float64)
  ang = np.outer(np.arange(cfg.max_context) / scale, freqs)
  return (Tensor(np.cos(ang).astype(np.float32), device=device).realize(),
          Tensor(np.sin(ang).astype(np.float32), device=device).realize())


class Block:
  """One transformer layer with its KV cache (max_context, n_kv_heads, head_dim) for keys and for values."""

  def __init__(self, cfg: Config, ts: dict[str, GGUFTensor], i: int, device: str | None, float_dtype: Any):
    p = f"blk.{i}."
    self.cfg, self.spec, self.sliding = cfg, cfg.spec, cfg.sliding(i)
    self.attn_norm = _vector(ts[p + "attn_norm.weight"], device)
    self.ffn_norm = _vector(ts[p + "ffn_norm.weight"], device)
    self.wq, self.wk, self.wv = (_linear(ts[p + f"attn_{n}.weight"], device, float_dtype) for n in "qkv")
    self.wo = _linear(ts[p + "attn_output.weight"], device, float_dtype)
    self.bq, self.bk, self.bv = (_vector(ts[p + f"attn_{n}.bias"], device) if p + f"attn_{n}.bias" in ts else None
                                 for n in "qkv")
    self.q_norm, self.k_norm = ((_vector(ts[p + f"attn_{n}_norm.weight"], device) if self.spec.qk_norm else None)
                                for n in "qk")
    self.post_attn_norm, self.post_ffw_norm = ((_vector(ts[p + n], device) if self.spec.post_norms else None)
                                               for n in _POST)
    self.w_gate, self.w_up = _linear(ts[p + "ffn_gate.weight"], device, float_dtype), \
      _linear(ts[p + "ffn_up.weight"], device, float_dtype)
    self.w_down = _linear(ts[p + "ffn_down.weight"], device, float_dtype)
    shape = (cfg.max_context, cfg.n_kv_heads, cfg.hd)
    self.cache_k = Tensor.zeros(*shape, device=device).contiguous().realize()
    self.cache_v = Tensor.zeros(*shape, device=device).contiguous().realize()

  def _write_cache(self, k: Tensor, v: Tensor, start_pos: Any, t: sint) -> None:
    """Store k, v (t, n_kv, hd) at positions start_pos.. of the caches, in place: an assign into the window of each
    cache (at a bound Variable offset under TinyJit) writes only its t rows."""
    self.cache_k.shrink(((start_pos, start_pos + t), None, None)).assign(k.cast(self.cache_k.dtype))
    self.cache_v.shrink(((start_pos, start_pos + t), None, None)).assign(v.cast(self.cache_v.dtype))

  def _attention(self, h: Tensor, start_pos: Any, rot: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
    """Grouped-query attention of the normed input h (B, T, dim) over the cache, after writing this step's k, v."""
    cfg = self.cfg
    b, t, _ = h.shape
    # each projection in its own buffer: RoPE reads two elements of it, and a kernel holding two matmul reductions
    # (one per element) is one the optimizer leaves unoptimized; v's too: fused into the cache write, a chunk's
    # product was no kernel the AMX tiles or the matmul heuristics take (a 32-token Q4_K chunk: 0.13 ms a layer)
    q, k, v = self.wq(h).contiguous(), self.wk(h).contiguous(), self.wv(h).contiguous()
    if self.bq is not None: q = q + self.bq
    if self.bk is not None: k = k + self.bk
    if self.bv is not None: v = v + self.bv
    q = q.reshape(b, t, cfg.n_heads, cfg.hd)
    k = k.reshape(b, t, cfg.n_kv_heads, cfg.hd)
    if self.q_norm is not None and self.k_norm is not None:  # per-head RMSNorm of q and k (set together), before RoPE
      q, k = rms_norm(q, self.q_norm, cfg.norm_eps), rms_norm(k, self.k_norm, cfg.norm_eps)
    q, k = rope(q, rot[0], rot[1], self.spec.neox), rope(k, rot[0], rot[1], self.spec.neox)
    self._write_cache(k.reshape(t, cfg.n_kv_heads, cfg.hd), v.reshape(t, cfg.n_kv_heads, cfg.hd), start_pos, t)
    end = start_pos + t
    keys = self.cache_k.shrink(((0, end), None, None))                      # (L, n_kv, hd)
    vals = self.cache_v.shrink(((0, end), None, None))
    rep = cfg.n_heads // cfg.n_kv_heads
    # grouped: the rep query heads of a KV head are one (rep, t) row block against that head's keys, so the cache
    # is read as a strided view. Expanding the keys to n_heads and merging (n_kv, rep) made every key load an integer
    # division and modulo by the symbolic length (the decode step's scores kernel ran at 0.05 GFLOPS: 160 us a layer)
    keys = keys.permute(1, 2, 0).reshape(cfg.n_kv_heads, 1, cfg.hd, keys.shape[0])   # (n_kv, 1, hd, L)
    vals = vals.permute(1, 0, 2).reshape(cfg.n_kv_heads, 1, vals.shape[0], cfg.hd)   # (n_kv, 1, L, hd)
    # the rotated queries in a buffer: fused into the scores kernel, RoPE's gated loads ran again for every key
    qh = q.reshape(t, cfg.n_kv_heads, rep, cfg.hd).permute(1, 2, 0, 3).contiguous()   # (n_kv, rep, t, hd)
    scores = (qh @ keys) * cfg.scale                                        # (n_kv, rep, t, L)
    if cfg.attn_softcap: scores = (scores * (1.0 / cfg.attn_softcap)).tanh() * cfg.attn_softcap
    if mask is not None: scores = scores + mask
    probs = scores.softmax(-1)
    # several queries over a symbolic number of keys (a prefill chunk): the probabilities go to a buffer; fused into
    # the probs @ vals kernel, every exp was recomputed for each of the head_dim outputs (a 32-token F32 chunk of one
    # layer spent 11-14 ms there, one thread)
    if t > 1: probs = probs.contiguous()
    pv = probs @ vals                                                       # (n_kv, rep, t, hd)
    # a chunk's product in its own layout, then the heads' permute as a copy: written straight into (t, n_heads * hd),
    # its reduce over the symbolic length was one the optimizer left slow (a 32-token Q4_K chunk, one thread: 231 us a
    # layer; 15 us for the product and 8 for the copy now)
    if t > 1: pv = pv.contiguous()
    return pv.reshape(cfg.n_heads, t, cfg.hd).permute(1, 0, 2).reshape(b, t, cfg.n_heads * cfg.hd)

  def __call__(self, x: Tensor, start_pos: Any, rot: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
    cfg = self.cfg
    # normalized activations go to a buffer first (.contiguous()): fused into a matmul, the norm's reduction would be
    # recomputed for every output element
    h = rms_norm(x, self.attn_norm, cfg.norm_eps).contiguous()
    out = self.wo(self._attention(h, start_pos, rot, mask).contiguous())
    if self.post_attn_norm is not None: out = rms_norm(out, self.post_attn_norm, cfg.norm_eps)
    x = x + out
    h = rms_norm(x, self.ffn_norm, cfg.norm_eps).contiguous()
    # gate and up in their own buffers, for the same reason (and the optimizer also leaves a matmul whose result feeds
    # silu of another buffer unoptimized): then one small elementwise kernel makes act(gate) * up
    gate = self.w_gate(h).contiguous()
    gate = gate.gelu("tanh") if self.spec.act == "gelu_tanh" else gate.silu()
    out = self.w_down((gate * self.w_up(h).contiguous()).contiguous())
    if self.post_ffw_norm is not None: out = rms_norm(out, self.post_ffw_norm, cfg.norm_eps)
    return x + out


class Transformer:
  """The model: `Transformer(cfg, tensors, device)`; `forward(emb_raw, start_pos)` -> logits of the last position.

  The tensors are checked first (`check_tensors`): each one the architecture uses, with its shape, and none other.
  The token embedding stays in host memory (a GGUF tensor read into memory): the rows of the tokens fed are gathered on
  the host and decoded on the device (`embed_rows`), so the embedding table never moves whole.
  """

  def __init__(self, cfg: Config, ts: dict[str, GGUFTensor], device: str | None = None,
               float_dtype: Any = dtypes.float32, prefill_chunk: int | None = None):
    check_tensors(cfg, ts)
    self.cfg, self.device = cfg, device
    emb = ts["token_embd.weight"]
    self.emb, self.emb_type = emb.blocks().reshape(cfg.vocab_size, -1), emb.ggml_type
    self.layers = [Block(cfg, ts, i, device, float_dtype) for i in range(cfg.n_layers)]
    self.norm = _vector(ts["output_norm.weight"], device)
    self.output = _linear(ts.get("output.weight", emb), device, float_dtype)
    factors = ts["rope_freqs.weight"].numpy() if "rope_freqs.weight" in ts else None
    if factors is not None and not (np.isfinite(factors).all() and (factors > 0).all()):
      raise ValueError(f"rope_freqs.weight holds non-positive or non-finite factors: {factors}")
    self.rot = rope_tables(cfg, cfg.rope_theta, cfg.rope_scale, factors, device)
    # sliding layers rotate with their own base and without the linear scaling (Gemma 3's local layers)
    self.rot_swa = rope_tables(cfg, cfg.rope_theta_swa, 1.0, factors, device) if cfg.rope_theta_swa else self.rot
    if cfg.sliding_window:
      # window[j] masks key k for the query at p where j = max_context - 1 - p + k, so the query's row is a shrink
      # at a (symbolic) offset: -inf where p - k >= sliding_window
      j = np.arange(cfg.max_context)
      self.window = Tensor(np.where(j <= cfg.max_context - 1 - cfg.sliding_window, -np.inf, 0).astype(np.float32),
                           device=device).realize()
    self.step = TinyJit(self._decode_step)
    self.pos_var = Variable("start_pos", 1, cfg.max_context - 1)
    self.chunk = prefill_chunk_size(cfg) if prefill_chunk is None else prefill_chunk
    if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or not 1 <= self.chunk <= cfg.max_context:
      raise ValueError(f"prefill_chunk = {self.chunk!r}; expected an int in [1, max_context = {cfg.max_context}]")
    self.chunk_step = TinyJit(self._chunk_step)
    self.chunk_pos = Variable("prefill_pos", 0, cfg.max_context - self.chunk)
    self.chunk_last = Variable("prefill_last", 0, self.chunk - 1)
    self._chunk_masks: tuple[Tensor, Tensor | None] | None = None  # made on the first chunked prefill
    self._dense_checked = False  # whether the first multi-token prefill decided on the QLinears' dense copies
    # decode's input: one embedding row, its buffer refilled each token (the step's input stays the same Tensor), and
    # the position Variable bound once per position
    self._row: Tensor | None = None
    self._bound: dict[int, Any] = {}

  def embed_rows(self, tokens: list[int]) -> Tensor:
    """The raw embedding rows of `tokens` (host gather), as a (T, row bytes) uint8 Tensor on the device."""
    bad = [t for t in tokens if not 0 <= t < self.cfg.vocab_size]
    if bad: raise ValueError(f"token ids {bad} are out of the vocabulary [0, {self.cfg.vocab_size})")
    return Tensor(np.ascontiguousarray(self.emb[np.asarray(tokens, dtype=np.int64)]), device=self.device)

  def _embed(self, rows: Tensor) -> Tensor:
    t = rows.shape[0]
    be, bb = BLOCK[self.emb_type]
    x = dequantize(rows.reshape(-1, bb), self.emb_type, (1, t, self.cfg.dim))
    return x * math.sqrt(self.cfg.dim) if self.cfg.spec.embed_scale else x

  def _masks(self, t: int, start_pos: Any) -> tuple[Tensor | None, Tensor | None]:
    """The additive masks (1, t, start_pos + t) of the full-attention and of the sliding layers."""
    cfg = self.cfg
    if t == 1:  # one query at start_pos sees every cached key; a sliding layer only the last sliding_window
      if not cfg.sliding_window: return None, None
      row = self.window.shrink(((cfg.max_context - 1 - start_pos, cfg.max_context),))   # (start_pos + 1,)
      return None, row.unsqueeze(0).unsqueeze(0)
    if not isinstance(start_pos, int): return self._symbolic_masks(t, start_pos)
    sp = start_pos
    dist = (sp + np.arange(t))[:, None] - np.arange(sp + t)[None, :]       # query position - key position
    causal = np.where(dist < 0, -np.inf, 0).astype(np.float32)
    full = Tensor(causal, device=self.device).reshape(1, t, sp + t)
    if not cfg.sliding_window: return full, None
    swa = np.where((dist < 0) | (dist >= cfg.sliding_window), -np.inf, 0).astype(np.float32)
    return full, Tensor(swa, device=self.device).reshape(1, t, sp + t)

  def _symbolic_masks(self, t: int, start_pos: Any) -> tuple[Tensor, Tensor | None]:
    """The masks (1, t, start_pos + t) of a chunk of t = `self.chunk` queries at a symbolic start: shrinks at offset
    max_context - start_pos of tables (t, max_context + t) made once, where column j is key j - max_context +
    start_pos, so query i is at distance i + max_context - j from it."""
    if self._chunk_masks is None:
      ctx, sw = self.cfg.max_context, self.cfg.sliding_window
      dist = np.arange(t)[:, None] + ctx - np.arange(ctx + t)[None, :]
      tables = [Tensor(np.where(bad, -np.inf, 0).astype(np.float32), device=self.device).realize()
                for bad in ([dist < 0] + ([(dist < 0) | (dist >= sw)] if sw else []))]
      self._chunk_masks = (tables[0], tables[1] if sw else None)
    ctx = self.cfg.max_context
    full_table, swa_table = self._chunk_masks
    cols = (None, (ctx - start_pos, ctx + t))
    return (full_table.shrink(cols).unsqueeze(0),
            swa_table.shrink(cols).unsqueeze(0) if swa_table is not None else None)

  def forward(self, rows: Tensor, start_pos: Any, last: Any = None) -> Tensor:
    """Logits (vocab,) of the `last`-th (default: the last) of the T tokens whose embedding rows are `rows`, at
    positions start_pos.. (an int, or a bound Variable when T is 1 or `self.chunk`); the KV caches are updated."""
    if not isinstance(t := rows.shape[0], int): raise TypeError(f"forward needs a concrete token count: {t.render()}")
    if last is None: last = t - 1
    x = self._embed(rows)
    rot, rot_swa = ((c.shrink(((start_pos, start_pos + t), None)), s.shrink(((start_pos, start_pos + t), None)))
                    for c, s in (self.rot, self.rot_swa))
    mask, mask_swa = self._masks(t, start_pos)
    for layer in self.layers:
      x = layer(x, start_pos, rot_swa, mask_swa) if layer.sliding else layer(x, start_pos, rot, mask)
    x = rms_norm(x.shrink((None, (last, last + 1), None)), self.norm, self.cfg.norm_eps).contiguous()
    logits = self.output(x).reshape(self.cfg.vocab_size)
    if self.cfg.final_softcap: logits = (logits * (1.0 / self.cfg.final_softcap)).tanh() * self.cfg.final_softcap
    return logits

  def _decode_step(self, rows: Tensor, start_pos: Any) -> Tensor:
    return self.forward(rows, start_pos).realize()

  def decode(self, token: int, pos: int) -> Tensor:
    """Logits after feeding one token at position `pos` (>= 1) through the TinyJit-ed step."""
    if not 1 <= pos < self.cfg.max_context:
      raise ValueError(f"position {pos} is outside [1, {self.cfg.max_context}) (the context is full)")
    if not 0 <= token < self.cfg.vocab_size:
      raise ValueError(f"token id {token} is out of the vocabulary [0, {self.cfg.vocab_size})")
    # per token only the row's bytes are copied in: no new buffer, Tensor or bound Variable (~0.1 ms of Python a
    # token, cold after a replay has streamed the weights through the caches)
    if self._row is None: self._row = self.embed_rows([token]).realize()
    else: engine.copy_into(self._row.uop, self.emb[token:token + 1])
    if (bound := self._bound.get(pos)) is None: bound = self._bound[pos] = self.pos_var.bind(pos)
    return self.step(self._row, bound)

  def _chunk_step(self, rows: Tensor, start_pos: Any, last: Any) -> Tensor:
    return self.forward(rows, start_pos, last).realize()

  def prefill(self, tokens: list[int], start_pos: int = 0) -> Tensor:
    """Logits after feeding `tokens` at positions start_pos.., in jitted chunks of `self.chunk` tokens (the last one
    padded); a lone token after position 0 takes the decode step, and a chunk that would run past the context one
    unjitted pass. The returned Tensor is overwritten by the next prefill."""
    if isinstance(start_pos, bool) or not isinstance(start_pos, int) or start_pos < 0:
      raise ValueError(f"start_pos = {start_pos!r}; expected an int >= 0")
    if not tokens: raise ValueError("prefill needs at least one token")
    if start_pos + len(tokens) > self.cfg.max_context:
      raise ValueError(f"{len(tokens)} tokens at position {start_pos} don't fit the context of {self.cfg.max_context}")
    if len(tokens) > 1: self._keep_dense_weights()
    done, c = 0, self.chunk
    while True:
      sp, take = start_pos + done, min(c, len(tokens) - done)
      if take == 1 and sp >= 1: logits = self.decode(tokens[done], sp)
      elif sp + c > self.cfg.max_context: return self.forward(self.embed_rows(tokens[done:]), sp).realize()
      else:
        rows = self.embed_rows(tokens[done:done + take] + [0] * (c - take))
        logits = self.chunk_step(rows, self.chunk_pos.bind(sp), self.chunk_last.bind(take - 1))
      done += take
      if done == len(tokens): return logits


  def _keep_dense_weights(self) -> None:
    """Once, before the first multi-token prefill (so no TinyJit capture sees the per-call path): give the layer
    weights a `DenseWeight` for the prefill's chunks when all of them fit `dense_budget` (none otherwise): every
    quantized one (decoded to float32), and every float one the chunk's matmul would pack into panels."""
    if self._dense_checked: return
    self._dense_checked = True
    todo: list[tuple[QLinear | Linear, Tensor]] = []
    for layer in self.layers:
      for lin in (layer.wq, layer.wk, layer.wv, layer.wo, layer.w_gate, layer.w_up, layer.w_down):
        if isinstance(lin, QLinear): todo.append((lin, lin.weight()))
        elif isinstance(lin, Linear) and _prefill_panel(lin.w, self.chunk): todo.append((lin, lin.w))
    need = sum(w.dtype.itemsize * math.prod(w.shape) for _, w in todo)
    if not todo or need > dense_budget(todo[0][1].device): return
    for lin, w in todo: lin.dense = DenseWeight(w, self.chunk, amx=isinstance(lin, QLinear) and PREFILL_AMX)


def dense_budget(device: Any) -> int:
  """Bytes the prefill's float32 copies of quantized weights (`DenseWeight`) may take on `device`: half the host
  memory available now on a CPU device (a 7B-parameter Q4_K model's 28 GB of copies won't be made on a 32 GB host;
  the 100M-parameter bench model's 0.4 GB will); 0 elsewhere (a GPU's free memory isn't known here), where every
  chunk decodes the blocks again."""
  if not isinstance(device, str) or device.split(":")[0] != "CPU": return 0
  names = getattr(os, "sysconf_names", {})
  if "SC_AVPHYS_PAGES" not in names or "SC_PAGE_SIZE" not in names: return 0  # a host that doesn't say: no copies
  return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


def prefill_chunk_size(cfg: Config) -> int:
  """Tokens per jitted prefill chunk: the largest power of two up to 32 whose widest activation (chunk x
  max(hidden_dim, dim) floats) fits half the host's L2, so a chunk's feed-forward stays in cache; at least 8 (and at
  most max_context). 32 tokens make the matmuls wide enough to reuse each weight byte 32 times."""
  from tiny_codegen.machine import host_machine
  l2 = host_machine().l2
  chunk = 32
  while chunk > 8 and chunk * max(cfg.hidden_dim, cfg.dim) * 4 > l2 // 2: chunk //= 2
  return min(chunk, cfg.max_context)
