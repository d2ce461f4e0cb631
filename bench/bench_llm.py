"""LLM decode throughput and first-token latency: a ~100M-parameter random LLaMA-style model (dim 768, 12 layers, 12
heads, 4 KV heads, SwiGLU 2048, vocab 16000) written as ONE GGUF file per weight type (F32, Q8_0, Q4_K: every matrix
in that type, norms F32), and that same file run by tiny's `tiny_tensor.llm` (TinyJit-ed decode step with the KV
cache at a symbolic position, prefill in jitted chunks) and by llama.cpp (`llama-cpp-python`); the F32 network also by
torch (eager, torch.no_grad, its own KV cache), with its default threads and with one.

llama.cpp runs greedy on the same prompt ids (no BOS added) with n_threads = tiny's CPU thread count (`CPU_THREADS`,
else the cores this process may use), in a subprocess of the interpreter `LLAMA_CPP_PYTHON` names (default: this
one), so it can live in its own virtual environment; where it can't be imported its column is missing, as torch's
is. Greedy tokens are compared: tiny and llama.cpp must agree on F32 (a disagreement is reported, not raised, since
near-ties of a random model's logits can flip an argmax); quantized runs may diverge after some tokens (llama.cpp
quantizes the activations to 8 bits for its Q8_0/Q4_K dot products), reported as the count of leading tokens that
agree.

Reported: decode tokens/s (higher is better), first-token latency of a 32-token prompt with kernels already compiled
(lower is better), tiny's cold first token (compiling included). `python bench/bench_llm.py` runs it alone;
`LLM_BENCH_TOKENS` sets how many tokens are decoded (default 32), `LLM_BENCH_LAYERS` cuts the model to fewer layers
(default 12), `LLM_BENCH_QUANTS` picks the weight types (default "F32,Q8_0,Q4_K").
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

DIM, HEADS, KV_HEADS, HIDDEN, VOCAB, CTX = 768, 12, 4, 2048, 16000, 256
LAYERS = int(os.environ.get("LLM_BENCH_LAYERS", "12"))
PROMPT = 32
PROMPT_IDS = [(7 * i + 300) % VOCAB for i in range(PROMPT)]  # plain tokens (not the byte or control ids)


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


def _write_gguf(ws: dict[str, np.ndarray], quant: str, path: str) -> None:
  """The model as a GGUF file both libraries load, written with the `gguf` package (llama.cpp wants its
  hyperparameters as the uint32/float32 keys that package types them as): llama metadata, a SentencePiece-style
  vocabulary (control tokens, 256 byte tokens, plain pieces), every matrix stored as `quant` blocks made by tiny's
  `quantize` (norms F32)."""
  import gguf
  from tiny_tensor.llm.gguf import GGMLType, quantize
  toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
  toks += [f"\u2581t{i}" for i in range(VOCAB - len(toks))]
  w = gguf.GGUFWriter(path, "llama")
  w.add_name("bench-llm")
  w.add_context_length(CTX)
  w.add_embedding_length(DIM)
  w.add_block_count(LAYERS)
  w.add_feed_forward_length(HIDDEN)
  w.add_head_count(HEADS)
  w.add_head_count_kv(KV_HEADS)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_rope_freq_base(10000.0)
  w.add_rope_dimension_count(DIM // HEADS)
  w.add_tokenizer_model("llama")
  w.add_token_list(toks)
  w.add_token_scores([0.0] * VOCAB)
  w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259))
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_unk_token_id(0)
  for name, v in ws.items():
    if v.ndim == 1 or quant == "F32": w.add_tensor(name, v)
    else:  # the blocks as a (rows, bytes per row) uint8 array: the package derives the element shape from it
      raw = np.frombuffer(quantize(v, GGMLType[quant]), np.uint8).reshape(v.shape[0], -1)
      w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[quant])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def tiny_threads() -> int:
  """The threads tiny's CPU kernels use: CPU_THREADS when set, else the cores this process may use."""
  from tiny_uop.helpers import CPU_THREADS
  from tiny_runtime_cpu.threads import default_threads
  return default_threads(int(CPU_THREADS.value))


def _tiny(path: str, n: int) -> dict[str, Any]:
  from tiny_tensor.llm import LLM
  m = LLM.load(path, max_context=CTX).model
  st = time.perf_counter()
  m.prefill(PROMPT_IDS).numpy()
  cold = time.perf_counter() - st
  for _ in range(2): tok = int(np.argmax(m.prefill(PROMPT_IDS).numpy()))  # capture, first replay
  for i in range(3): tok = int(np.argmax(m.decode(tok, PROMPT + i).numpy()))  # eager, capture, first replay
  st = time.perf_counter()
  tok = int(np.argmax(m.prefill(PROMPT_IDS).numpy()))
  first = time.perf_counter() - st
  toks = [tok]
  st = time.perf_counter()
  for i in range(n):
    tok = int(np.argmax(m.decode(tok, PROMPT + i).numpy()))
    toks.append(tok)
  return {"tps": n / (time.perf_counter() - st), "first": first, "cold": cold, "tokens": toks}


# run in a subprocess (argv: model path, tokens to decode, threads, prompt ids as JSON): prints one JSON line
_LLAMA_SCRIPT = r"""
import json, sys, time
import numpy as np
try:
  from llama_cpp import Llama
except ImportError:
  sys.exit(3)
path, n, threads, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
if sys.argv[5] == "no-extra-buffers":  # no weight repacking (AMX / repacked Q4 layouts)
  import llama_cpp.llama_cpp as lc
  default_params = lc.llama_model_default_params
  def no_extra():
    p = default_params()
    p.use_extra_bufts = False
    return p
  lc.llama_model_default_params = no_extra
llm = Llama(model_path=path, n_ctx=256, n_batch=len(prompt), n_threads=threads, n_threads_batch=threads,
            verbose=False)
nv = llm.n_vocab()
def last():  # the logits of the batch's last token (the only row computed without logits_all)
  return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(nv,))))
def run(n):
  llm.reset()
  st = time.perf_counter()
  llm.eval(prompt)
  tok = last()
  first = time.perf_counter() - st
  toks = [tok]
  st = time.perf_counter()
  for _ in range(n):
    llm.eval([tok])
    tok = last()
    toks.append(tok)
  return first, n / (time.perf_counter() - st), toks
run(3)  # warm-up
first, tps, toks = run(n)
print(json.dumps({"first": first, "tps": tps, "tokens": toks}))
"""


def _llama_cpp(path: str, n: int, threads: int) -> dict[str, Any] | None:
  """llama.cpp's figures on the GGUF file at `path`, or None when llama_cpp can't be imported (or failed: the
  error is printed, the other columns stay). A build with GGML_NATIVE on a CPU that lists AMX can die of SIGILL
  in its repacked (AMX) quantized matmuls where the kernel or VM doesn't grant AMX tiles: it is then run again
  without extra buffer types (`use_extra_bufts = False`), and the row says so."""
  py = os.environ.get("LLAMA_CPP_PYTHON", sys.executable)
  args = [py, "-c", _LLAMA_SCRIPT, path, str(n), str(threads), json.dumps(PROMPT_IDS)]
  r = subprocess.run(args + ["default"], capture_output=True, text=True)
  if r.returncode == -signal.SIGILL:
    print("bench_llm: llama.cpp died of SIGILL (AMX?); running it without extra buffer types", file=sys.stderr)
    r = subprocess.run(args + ["no-extra-buffers"], capture_output=True, text=True)
    if r.returncode == 0: return {**json.loads(r.stdout.strip().splitlines()[-1]), "no_extra_buffers": True}
  if r.returncode == 3: return None
  if r.returncode != 0:
    print(f"bench_llm: llama.cpp failed (exit {r.returncode}): {r.stderr[-2000:]}", file=sys.stderr)
    return None
  return json.loads(r.stdout.strip().splitlines()[-1])


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

  with torch.no_grad():
    tok = int(forward(PROMPT_IDS, 0).argmax())
    for i in range(3): tok = int(forward([tok], PROMPT + i).argmax())
    st = time.perf_counter()
    tok = int(forward(PROMPT_IDS, 0).argmax())
    first = time.perf_counter() - st
    toks = [tok]
    st = time.perf_counter()
    for i in range(n):
      tok = int(forward([tok], PROMPT + i).argmax())
      toks.append(tok)
    tps = n / (time.perf_counter() - st)
  return {"tps": tps, "first": first, "tokens": toks}


def _agree(a: list[int], b: list[int]) -> int:
  """How many leading greedy tokens two runs share."""
  k = 0
  while k < min(len(a), len(b)) and a[k] == b[k]: k += 1
  return k


def run() -> dict[str, dict[str, float | str]]:
  n = int(os.environ.get("LLM_BENCH_TOKENS", "32"))
  quants = os.environ.get("LLM_BENCH_QUANTS", "F32,Q8_0,Q4_K").split(",")
  ws = _weights()
  params = sum(v.size for v in ws.values())
  threads = tiny_threads()
  rows: dict[str, dict[str, float | str]] = {}
  agree: dict[str, float | str] = {"unit": f" of {n + 1}", "better": "higher",
                                   "target": f"F32: all {n + 1} (tiny vs llama.cpp)"}
  with tempfile.TemporaryDirectory() as d:
    for quant in quants:
      path = os.path.join(d, f"bench-{quant}.gguf")
      _write_gguf(ws, quant, path)
      tiny, lcpp = _tiny(path, n), _llama_cpp(path, n, threads)
      tps: dict[str, float | str] = {"tiny": tiny["tps"], "unit": " tok/s", "better": "higher",
                                     "target": f">= llama.cpp; {params / 1e6:.0f}M params, {LAYERS} layers, "
                                               f"{threads} threads"}
      first: dict[str, float | str] = {"tiny": tiny["first"] * 1e3, "unit": " ms", "better": "lower",
                                       "target": f"<= llama.cpp; {PROMPT}-token prompt, compiled"}
      if lcpp is not None:
        tps["llama.cpp"], first["llama.cpp"] = lcpp["tps"], lcpp["first"] * 1e3
        if lcpp.get("no_extra_buffers"): tps["target"] = str(tps["target"]) + "; llama.cpp without AMX/repacking"
        agree[quant] = _agree(tiny["tokens"], lcpp["tokens"])
        if quant == "F32" and agree[quant] != n + 1:
          print(f"bench_llm: F32 greedy tokens differ from llama.cpp's after {agree[quant]}: tiny {tiny['tokens']}, "
                f"llama.cpp {lcpp['tokens']}", file=sys.stderr)
      if quant == "F32":
        for name, th in (("torch", None), ("torch 1 thread", 1)):
          if (tr := _torch(ws, n, th)) is not None:
            tps[name], first[name] = tr["tps"], tr["first"] * 1e3
            if th is None: agree["F32 torch"] = _agree(tiny["tokens"], tr["tokens"])
        rows["llm first token (cold, compiling), F32"] = {"tiny": tiny["cold"] * 1e3, "unit": " ms", "better": "lower"}
      rows[f"llm decode, {quant}"], rows[f"llm first token, {quant}"] = tps, first
  if len(agree) > 3: rows["llm greedy tokens agreeing with tiny's"] = agree
  return rows


if __name__ == "__main__":
  for case, row in run().items(): print(f"{case:44s} {row}")
