"""LLM decode throughput: a ~100M-parameter random LLaMA-style model (dim 768, 12 layers, 12 heads, 4 KV heads,
SwiGLU 2048, vocab 16000), tiny's `tiny_tensor.llm` (TinyJit-ed decode step, KV cache at a symbolic position) side
by side with the same network in torch (eager, torch.no_grad, its own KV cache) on the same CPU, both float32.

torch runs with its default threads and, as a second column, with one thread (tiny's CPU kernels use
`CPU_THREADS` threads, by default one per core).
Reported: decode tokens/s (higher is better), first-token latency of a 32-token prompt with kernels already compiled
(lower is better), and tiny's cold first token (compiling included); and tiny's decode with the weights stored as Q8_0
and as Q4_K blocks that the matvec kernels decode in registers (one kernel per weight, reading its packed bytes:
with fewer bytes per token than f32, both should decode faster). `python bench/bench_llm.py` runs it alone;
`LLM_BENCH_TOKENS` sets how many tokens are decoded (default 32).
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

DIM, LAYERS, HEADS, KV_HEADS, HIDDEN, VOCAB, CTX = 768, 12, 12, 4, 2048, 16000, 256
PROMPT = 32


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  hd = DIM // HEADS
  shapes = {"token_embd.weight": (VOCAB, DIM), "output_norm.weight": (DIM,), "output.weight": (VOCAB, DIM)}
  for i in range(LAYERS):
    p = f"blk.{i}."
    shapes.update({p + "attn_norm.weight": (DIM,), p + "ffn_norm.weight": (DIM,), p + "attn_q.weight": (DIM, DIM),
                   p + "attn_k.weight": (KV_HEADS * hd, DIM), p + "attn_v.weight": (KV_HEADS * hd, DIM),
                   p + "attn_output.weight": (DIM, DIM), p + "ffn_gate.weight": (HIDDEN, DIM),
                   p + "ffn_up.weight": (HIDDEN, DIM), p + "ffn_down.weight": (DIM, HIDDEN)})
  return {k: (np.ones(s, np.float32) if len(s) == 1 else
              (rng.standard_normal(s, dtype=np.float32) / np.float32(np.sqrt(s[-1])))).astype(np.float32)
          for k, s in shapes.items()}


def _tiny(ws: dict[str, np.ndarray], n: int, quant: str = "F32") -> dict[str, float]:
  from tiny_tensor.llm.gguf import GGMLType, GGUFTensor, quantize
  from tiny_tensor.llm.model import Config, Transformer
  def stored(k: str, v: np.ndarray) -> GGUFTensor:
    t = GGMLType[quant] if v.ndim == 2 else GGMLType.F32
    return GGUFTensor(k, v.shape, t, np.frombuffer(quantize(v, t), np.uint8))
  ts = {k: stored(k, v) for k, v in ws.items()}
  cfg = Config("llama", DIM, LAYERS, HEADS, KV_HEADS, HIDDEN, VOCAB, max_context=CTX)
  m = Transformer(cfg, ts)
  prompt = list(range(3, 3 + PROMPT))
  st = time.perf_counter()
  tok = int(np.argmax(m.prefill(prompt).numpy()))
  cold = time.perf_counter() - st
  for i in range(3): tok = int(np.argmax(m.decode(tok, PROMPT + i).numpy()))  # eager, capture, first replay
  st = time.perf_counter()
  tok = int(np.argmax(m.prefill(prompt).numpy()))
  first = time.perf_counter() - st
  st = time.perf_counter()
  for i in range(n): tok = int(np.argmax(m.decode(tok, PROMPT + i).numpy()))
  return {"tps": n / (time.perf_counter() - st), "first": first, "cold": cold}


def _torch(ws: dict[str, np.ndarray], n: int, threads: int | None = None) -> dict[str, float] | None:
  try:
    import torch
  except ImportError: return None
  old_threads = torch.get_num_threads()
  if threads is not None: torch.set_num_threads(threads)
  try: return _torch_run(torch, ws, n)
  finally: torch.set_num_threads(old_threads)


def _torch_run(torch: Any, ws: dict[str, np.ndarray], n: int) -> dict[str, float]:
  w = {k: torch.from_numpy(v) for k, v in ws.items()}
  hd, rep = DIM // HEADS, HEADS // KV_HEADS
  freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
  ang = torch.outer(torch.arange(CTX, dtype=torch.float64), freqs)
  cos, sin = ang.cos().float(), ang.sin().float()
  cache = [(torch.zeros(CTX, KV_HEADS, hd), torch.zeros(CTX, KV_HEADS, hd)) for _ in range(LAYERS)]

  def norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor: return x * torch.rsqrt(x.pow(2).mean(-1, True) + 1e-5) * g

  def rope(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # adjacent pairs, (T, H, hd)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)

  def forward(tokens: list[int], sp: int) -> torch.Tensor:
    t = len(tokens)
    x = w["token_embd.weight"][tokens]
    c, s = cos[sp:sp + t, None], sin[sp:sp + t, None]
    mask = torch.full((t, sp + t), float("-inf")).triu(sp + 1) if t > 1 else None
    for i in range(LAYERS):
      p = f"blk.{i}."
      h = norm(x, w[p + "attn_norm.weight"])
      q = rope((h @ w[p + "attn_q.weight"].T).view(t, HEADS, hd), c, s)
      k = rope((h @ w[p + "attn_k.weight"].T).view(t, KV_HEADS, hd), c, s)
      v = (h @ w[p + "attn_v.weight"].T).view(t, KV_HEADS, hd)
      ck, cv = cache[i]
      ck[sp:sp + t], cv[sp:sp + t] = k, v
      keys = ck[:sp + t].repeat_interleave(rep, 1).transpose(0, 1)
      vals = cv[:sp + t].repeat_interleave(rep, 1).transpose(0, 1)
      att = (q.transpose(0, 1) @ keys.transpose(1, 2)) / hd ** 0.5
      if mask is not None: att = att + mask
      x = x + (att.softmax(-1) @ vals).transpose(0, 1).reshape(t, DIM) @ w[p + "attn_output.weight"].T
      h = norm(x, w[p + "ffn_norm.weight"])
      x = x + (torch.nn.functional.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) \
        @ w[p + "ffn_down.weight"].T
    return norm(x[-1], w["output_norm.weight"]) @ w["output.weight"].T

  prompt = list(range(3, 3 + PROMPT))
  with torch.no_grad():
    tok = int(forward(prompt, 0).argmax())
    for i in range(3): tok = int(forward([tok], PROMPT + i).argmax())
    st = time.perf_counter()
    tok = int(forward(prompt, 0).argmax())
    first = time.perf_counter() - st
    st = time.perf_counter()
    for i in range(n): tok = int(forward([tok], PROMPT + i).argmax())
    tps = n / (time.perf_counter() - st)
  return {"tps": tps, "first": first}


def run() -> dict[str, dict[str, float | str]]:
  n = int(os.environ.get("LLM_BENCH_TOKENS", "32"))
  ws = _weights()
  params = sum(v.size for v in ws.values())
  tiny = _tiny(ws, n)
  th, th1 = _torch(ws, n), _torch(ws, n, threads=1)
  q8, q4k = _tiny(ws, n, "Q8_0"), _tiny(ws, n, "Q4_K")
  tps: dict[str, float | str] = {"tiny": tiny["tps"], "unit": " tok/s", "better": "higher",
                                 "target": f">= torch; {params / 1e6:.0f}M params, f32"}
  first: dict[str, float | str] = {"tiny": tiny["first"] * 1e3, "unit": " ms", "better": "lower",
                                   "target": f"{PROMPT}-token prompt, compiled"}
  if th is not None: tps["torch"], first["torch"] = th["tps"], th["first"] * 1e3
  if th1 is not None: tps["torch 1 thread"], first["torch 1 thread"] = th1["tps"], th1["first"] * 1e3
  quant = {f"llm decode, {name} weights (decoded in the matvecs)": {"tiny": r["tps"], "unit": " tok/s",
                                                                   "better": "higher", "target": "> tiny f32"}
           for name, r in (("Q8_0", q8), ("Q4_K", q4k))}
  return {"llm decode": tps, **quant,
          "llm first token": first,
          "llm first token (cold, compiling)": {"tiny": tiny["cold"] * 1e3, "unit": " ms", "better": "lower"}}


if __name__ == "__main__":
  for case, row in run().items(): print(f"{case:36s} {row}")
