"""A local OpenAI-style HTTP server for an `LLM` (standard library only): `python -m tiny_tensor.llm --serve`.

Endpoints (loopback only by default):
- `GET /v1/models`: the loaded model;
- `POST /v1/completions` {"prompt", "max_tokens", "temperature", "top_k", "seed", "stream"};
- `POST /v1/chat/completions` {"messages": [{"role", "content"}], ...same options};
- `GET /`: a small chat page that streams from /v1/chat/completions.
`"stream": true` answers with server-sent events (`data: {json}` chunks, then `data: [DONE]`), as OpenAI's API does.
Requests are served one at a time (one model, one KV cache).
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

__all__ = ["make_server", "CHAT_PAGE"]

CHAT_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>tiny chat</title>
<style>body{font-family:sans-serif;max-width:760px;margin:2em auto}#log div{margin:.5em 0;white-space:pre-wrap}
.user{color:#225}.assistant{color:#252}textarea{width:100%;height:4em}</style></head><body>
<h3>tiny chat &mdash; <span id="model"></span></h3><div id="log"></div>
<textarea id="msg" placeholder="Say something (Enter sends)"></textarea>
<script>
const log = document.getElementById("log"), msg = document.getElementById("msg"), history = [];
fetch("/v1/models").then(r => r.json()).then(j => document.getElementById("model").textContent = j.data[0].id);
function line(role, text) { const d = document.createElement("div"); d.className = role; d.textContent = text;
  log.appendChild(d); return d; }
msg.addEventListener("keydown", async e => {
  if (e.key !== "Enter" || e.shiftKey) return;
  e.preventDefault(); const text = msg.value.trim(); if (!text) return; msg.value = "";
  history.push({role: "user", content: text}); line("user", "> " + text); const out = line("assistant", "");
  const r = await fetch("/v1/chat/completions", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({messages: history, stream: true, max_tokens: 256})});
  const reader = r.body.getReader(), dec = new TextDecoder(); let buf = "", reply = "";
  for (;;) { const {done, value} = await reader.read(); if (done) break; buf += dec.decode(value, {stream: true});
    let i; while ((i = buf.indexOf("\\n\\n")) >= 0) { const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const d = JSON.parse(ev.slice(6)).choices[0].delta.content || ""; reply += d; out.textContent = reply; } }
  history.push({role: "assistant", content: reply});
});
</script></body></html>"""


def _options(body: dict[str, Any]) -> dict[str, Any]:
  def num(k: str, default: Any, kind: type) -> Any:
    v = body.get(k, default)
    if v is None: return default
    if not isinstance(v, (int, float)) or isinstance(v, bool): raise ValueError(f"{k!r} must be a number, got {v!r}")
    return kind(v)
  opts = {"max_tokens": num("max_tokens", 128, int), "temperature": num("temperature", 0.0, float),
          "top_k": num("top_k", 0, int), "seed": body.get("seed")}
  if opts["max_tokens"] < 1: raise ValueError(f"'max_tokens' must be >= 1, got {opts['max_tokens']}")
  return opts


def make_server(llm: Any, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
  """An HTTP server (not started: call `serve_forever()`) answering for `llm`; port 0 picks a free port."""
  lock = threading.Lock()

  class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None: pass

    def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
      data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
      self.send_response(code)
      self.send_header("Content-Type", ctype)
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def _error(self, code: int, msg: str) -> None:
      self._send(code, {"error": {"message": msg, "type": "invalid_request_error" if code == 400 else "error"}})

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
      if self.path in ("/", "/index.html"): return self._send(200, CHAT_PAGE, "text/html; charset=utf-8")
      if self.path == "/v1/models":
        return self._send(200, {"object": "list", "data": [{"id": llm.name, "object": "model", "owned_by": "tiny"}]})
      self._error(404, f"no route GET {self.path}; routes: /, /v1/models, POST /v1/completions, /v1/chat/completions")

    def do_POST(self) -> None:  # noqa: N802
      if self.path not in ("/v1/completions", "/v1/chat/completions"):
        return self._error(404, f"no route POST {self.path}; routes: /v1/completions, /v1/chat/completions")
      try:
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n) or b"{}")
        if not isinstance(body, dict): raise ValueError("the request body must be a JSON object")
        opts = _options(body)
        chat = self.path.endswith("chat/completions")
        if chat:
          msgs = body.get("messages")
          ok = isinstance(msgs, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs)
          if not ok:
            raise ValueError("'messages' must be a list of {\"role\", \"content\"} objects")
        elif not isinstance(body.get("prompt"), str): raise ValueError("'prompt' must be a string")
      except (ValueError, json.JSONDecodeError) as e: return self._error(400, str(e))
      rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:12]}", int(time.time())
      with lock:
        pieces = llm.chat(body["messages"], **opts) if chat else llm.generate(body["prompt"], **opts)
        if body.get("stream"): self._stream(pieces, rid, created, chat)
        else:
          text = "".join(pieces)
          choice = {"index": 0, "finish_reason": "stop",
                    **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
          self._send(200, {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                           "model": llm.name, "choices": [choice]})

    def _stream(self, pieces: Iterator[str], rid: str, created: int, chat: bool) -> None:
      self.send_response(200)
      self.send_header("Content-Type", "text/event-stream")
      self.send_header("Cache-Control", "no-cache")
      self.send_header("Connection", "close")
      self.end_headers()
      obj = "chat.completion.chunk" if chat else "text_completion"
      def event(piece: str | None) -> None:
        fin = None if piece is not None else "stop"
        ch = {"index": 0, "finish_reason": fin, **({"delta": {"content": piece} if piece is not None else {}} if chat
                                                   else {"text": piece or ""})}
        chunk = {"id": rid, "object": obj, "created": created, "model": llm.name, "choices": [ch]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
      for p in pieces: event(p)
      event(None)
      self.wfile.write(b"data: [DONE]\n\n")
      self.wfile.flush()
      self.close_connection = True

  return ThreadingHTTPServer((host, port), Handler)
