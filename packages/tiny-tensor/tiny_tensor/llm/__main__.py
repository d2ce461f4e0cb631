"""`python -m tiny_tensor.llm --model FILE.gguf [--prompt TEXT | --serve]`: generate text from a GGUF model.

Without --prompt (and without --serve) it reads prompts from stdin, one per line. --serve starts the OpenAI-style
server on 127.0.0.1 (see tiny_tensor.llm.serve).
"""
from __future__ import annotations

import argparse
import sys
import time

from tiny_tensor.llm import LLM


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m tiny_tensor.llm", description=__doc__.splitlines()[0])
  ap.add_argument("--model", required=True, help="a GGUF file (LLaMA-family: llama, mistral, qwen2, ...)")
  ap.add_argument("--prompt", help="generate after this text (else read prompts from stdin)")
  ap.add_argument("--max-tokens", type=int, default=128)
  ap.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (deterministic)")
  ap.add_argument("--top-k", type=int, default=0)
  ap.add_argument("--seed", type=int, default=None)
  ap.add_argument("--max-context", type=int, default=4096, help="KV cache length (capped by the model's)")
  ap.add_argument("--device", default=None)
  ap.add_argument("--serve", action="store_true", help="serve an OpenAI-style API and a chat page")
  ap.add_argument("--host", default="127.0.0.1")
  ap.add_argument("--port", type=int, default=8000)
  ap.add_argument("--timing", action="store_true", help="print first-token latency and tokens/s to stderr")
  a = ap.parse_args(argv)
  try: llm = LLM.load(a.model, a.device, a.max_context)
  except (OSError, ValueError) as e:
    print(f"error: can't load {a.model}: {e}", file=sys.stderr)
    return 2
  if a.serve:
    from tiny_tensor.llm.serve import make_server
    srv = make_server(llm, a.host, a.port)
    print(f"serving {llm.name} on http://{a.host}:{srv.server_address[1]}/ (OpenAI-style API under /v1)", flush=True)
    try: srv.serve_forever()
    except KeyboardInterrupt: pass
    return 0
  prompts = [a.prompt] if a.prompt is not None else (line.rstrip("\n") for line in sys.stdin)
  for prompt in prompts:
    st, first, n = time.perf_counter(), None, 0
    for piece in llm.generate(prompt, a.max_tokens, a.temperature, a.top_k, a.seed):
      if first is None: first = time.perf_counter() - st
      n += 1
      print(piece, end="", flush=True)
    print(flush=True)
    if a.timing and first is not None:
      dt = time.perf_counter() - st - first
      print(f"first token {first * 1e3:.0f} ms, {max(n - 1, 0) / dt if dt > 0 else 0:.1f} tok/s", file=sys.stderr)
  return 0


if __name__ == "__main__":
  from tiny_uop.plugins.cli import run_main
  sys.exit(run_main(main, "python -m tiny_tensor.llm"))
