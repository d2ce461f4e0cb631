"""Run LLaMA-family language models (llama, qwen2, qwen3, gemma, gemma2, gemma3) from GGUF files:
`python -m tiny_tensor.llm --model FILE.gguf`. Other architectures, and files with tensors their architecture
doesn't use, are refused with a ValueError that names them.

>>> from tiny_tensor.llm import LLM                                  # doctest: +SKIP
>>> llm = LLM.load("model.gguf")                                     # doctest: +SKIP
>>> for piece in llm.generate("Once upon a time", max_tokens=20): print(piece, end="")  # doctest: +SKIP

- `gguf`: our GGUF reader/writer (quantized tensors stay raw GGML blocks) and numpy codecs of the block formats;
- `quants`: the block formats decoded with Tensor ops (Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K, F16, BF16);
- `tokenizer`: SentencePiece-style and GPT-2-style BPE tokenizers from the GGUF metadata;
- `model`: the transformer (RMSNorm, RoPE, GQA, gated feed-forward; per architecture q/k norms, rope_freqs,
  soft-capping, sliding windows: `model.ARCHS`) with a KV cache and a TinyJit-ed decode step whose position is a
  symbolic Variable;
- `serve`: a local OpenAI-style HTTP server (`--serve`) with a small chat page.
"""
from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np

from tiny_tensor.llm.gguf import read_gguf
from tiny_tensor.llm.model import Config, Transformer
from tiny_tensor.llm.tokenizer import Tokenizer

__all__ = ["LLM", "Config", "Transformer", "Tokenizer", "chat_prompt"]


def chat_prompt(messages: list[dict[str, str]], template: str | None) -> str:
  """The prompt text for chat `messages` ({"role", "content"}), in the format the model's chat template uses:
  ChatML (`<|im_start|>`), Llama 3 (`<|start_header_id|>`), Llama 2 (`[INST]`) or, without a template, plain
  "Role: content" lines. (The Jinja template itself is not executed: these are recognized by their markers.)"""
  t = template or ""
  if "<|im_start|>" in t:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"
  if "<|start_header_id|>" in t:
    return "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in messages) \
      + "<|start_header_id|>assistant<|end_header_id|>\n\n"
  if "[INST]" in t:
    out, sys_msg = "", ""
    for m in messages:
      if m["role"] == "system": sys_msg = f"<<SYS>>\n{m['content']}\n<</SYS>>\n\n"
      elif m["role"] == "user": out += f"[INST] {sys_msg}{m['content']} [/INST]"; sys_msg = ""  # noqa: E702
      else: out += f" {m['content']} "
    return out
  return "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"


class LLM:
  """A loaded model: tokenizer + transformer + sampling. `generate` yields text pieces as tokens are decoded."""

  def __init__(self, model: Transformer, tokenizer: Tokenizer, kv: dict[str, Any], name: str = "model"):
    self.model, self.tokenizer, self.kv, self.name = model, tokenizer, kv, name
    self.pos = 0  # tokens in the KV cache
    self.cached: list[int] = []

  @staticmethod
  def load(path: str | os.PathLike, device: str | None = None, max_context: int | None = 4096) -> LLM:
    """Read a GGUF file (into private memory, once: later changes to the file don't reach the model), build the
    tokenizer and the transformer on `device`. The metadata and every tensor are checked first: an unimplemented
    architecture, a bad hyperparameter, or an unknown, missing or misshapen tensor is a ValueError naming it."""
    kv, ts = read_gguf(path)
    cfg = Config.from_gguf(kv, max_context)
    tok = Tokenizer.from_gguf(kv)
    if tok.vocab_size < cfg.vocab_size:  # the model could pick an id that has no text
      raise ValueError(f"the model has {cfg.vocab_size} token embeddings but tokenizer.ggml.tokens lists only "
                       f"{tok.vocab_size} tokens; every id the model can produce needs a token")
    return LLM(Transformer(cfg, ts, device), tok, kv, os.path.basename(os.fspath(path)))

  def reset(self) -> None:
    """Forget the context (the KV cache is overwritten from position 0 on)."""
    self.pos, self.cached = 0, []

  def _feed(self, tokens: list[int]) -> np.ndarray:
    """Logits after feeding `tokens`, reusing the cached prefix when the new context starts with it."""
    common = 0
    while common < min(len(self.cached), len(tokens) - 1) and self.cached[common] == tokens[common]: common += 1
    rest = tokens[common:]
    # one new token after a cached prefix: the jitted decode step; else the jitted prefill chunks over the new tokens
    logits = self.model.decode(rest[0], common) if len(rest) == 1 and common else self.model.prefill(rest, common)
    self.pos, self.cached = len(tokens), list(tokens)
    return logits.numpy()

  def generate_ids(self, prompt_ids: list[int], max_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                   seed: int | None = None, stop_ids: tuple[int, ...] | None = None) -> Iterator[int]:
    """Token ids sampled after `prompt_ids` (greedy at temperature 0), up to `max_tokens` or an end token."""
    if not prompt_ids: raise ValueError("generate needs at least one prompt token")
    rng = np.random.default_rng(seed)
    stops = set(stop_ids if stop_ids is not None else ([self.tokenizer.eos_id] if self.tokenizer.eos_id is not None
                                                       else []))
    logits = self._feed(list(prompt_ids))
    for _ in range(max_tokens):
      tok = self.sample(logits, temperature, top_k, rng)
      if tok in stops: return
      yield tok
      if self.pos >= self.model.cfg.max_context: return
      logits = self.model.decode(tok, self.pos).numpy()
      self.pos += 1
      self.cached.append(tok)

  @staticmethod
  def sample(logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator) -> int:
    """argmax at temperature 0; else a draw from softmax(logits / temperature), over the top_k when top_k > 0."""
    if temperature <= 0: return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k > 0:
      kth = np.partition(z, -top_k)[-top_k]
      z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))

  def generate(self, prompt: str, max_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
               seed: int | None = None) -> Iterator[str]:
    """Text pieces generated after `prompt`, streamed as soon as they form whole UTF-8 characters."""
    ids: list[int] = []
    sent = 0
    for tok in self.generate_ids(self.tokenizer.encode(prompt), max_tokens, temperature, top_k, seed):
      ids.append(tok)
      data = self.tokenizer.decode_bytes(ids, strip_space=False)
      text = data.decode("utf-8", errors="ignore") if _complete(data) else data[:_cut(data)].decode("utf-8", "ignore")
      if len(text) > sent:
        yield text[sent:]
        sent = len(text)

  def chat(self, messages: list[dict[str, str]], **kw: Any) -> Iterator[str]:
    """Text pieces of the assistant's reply to chat `messages`."""
    return self.generate(chat_prompt(messages, self.kv.get("tokenizer.chat_template")), **kw)


def _complete(data: bytes) -> bool:
  try:
    data.decode("utf-8")
    return True
  except UnicodeDecodeError: return False


def _cut(data: bytes) -> int:
  """Length of the prefix of `data` that ends on a whole UTF-8 character."""
  for back in range(1, 4):
    if len(data) >= back and data[-back] & 0xC0 == 0xC0: return len(data) - back
  return len(data)
