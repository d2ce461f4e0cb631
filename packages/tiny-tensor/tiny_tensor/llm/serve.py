"""A local OpenAI-style HTTP server for an `LLM` (standard library only): `python -m tiny_tensor.llm --serve`.

Endpoints (loopback only by default):
- `GET /v1/models`: the loaded model;
- `POST /v1/completions` {"prompt", "max_tokens", "temperature", "top_k", "seed", "stream"};
- `POST /v1/chat/completions` {"messages": [{"role", "content"}], ...same options};
- `GET /`: a small chat page that streams from /v1/chat/completions (its script and style: /chat.js, /chat.css).
`"stream": true` answers with server-sent events (`data: {json}` chunks, then `data: [DONE]`), as OpenAI's API does.

Against hostile input:
1. HTTP is `tiny_tensor.httpd`'s: time limits per phase, a body limit, Content-Length only, JSON errors, no
   keep-alive after an error, a cap on connections.
2. Every field is checked (type and range) and the prompt is tokenized and measured against the context before
   generation starts: a bad request is a 400 in OpenAI's error format (`{"error": {"message", "type", "param",
   "code"}}`) naming the field and what is valid, and a stream never starts for one.
3. Requests generate one at a time (one model, one KV cache); `ServeLimits.queue` more may wait, each at most
   `ServeLimits.queue_wait` seconds; beyond that a request gets 503. One request generates for at most
   `ServeLimits.max_seconds` (then it stops with finish_reason "length"); prompts are at most
   `ServeLimits.max_prompt_bytes` bytes and the model's context in tokens, and are tokenized outside the queue.
"""
from __future__ import annotations

import codecs
import json
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tiny_tensor.httpd import Limits, StrictHandler, StrictHTTPServer
from tiny_tensor.llm import chat_prompt

__all__ = ["make_server", "ServeLimits", "RequestError", "CHAT_PAGE", "CHAT_JS", "CHAT_CSS"]

CHAT_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>tiny chat</title>
<link rel="stylesheet" href="chat.css"></head><body>
<h3>tiny chat &mdash; <span id="model"></span></h3><div id="log"></div>
<textarea id="msg" placeholder="Say something (Enter sends)"></textarea>
<script src="chat.js"></script></body></html>"""

CHAT_CSS = """body{font-family:sans-serif;max-width:760px;margin:2em auto}#log div{margin:.5em 0;white-space:pre-wrap}
.user{color:#225}.assistant{color:#252}.error{color:#a22}textarea{width:100%;height:4em}
"""

# the model's text goes into the page as text (textContent), never as HTML
CHAT_JS = """"use strict";
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
  if (!r.ok) {   // a 4xx/503: its message, as text
    const j = await r.json(); out.className = "error"; out.textContent = j.error.message; history.pop(); return; }
  const reader = r.body.getReader(), dec = new TextDecoder(); let buf = "", reply = "";
  for (;;) { const {done, value} = await reader.read(); if (done) break; buf += dec.decode(value, {stream: true});
    let i; while ((i = buf.indexOf("\\n\\n")) >= 0) { const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const d = JSON.parse(ev.slice(6)).choices[0].delta.content || ""; reply += d; out.textContent = reply; } }
  history.push({role: "assistant", content: reply});
});
"""

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; object-src 'none'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
ROLES = ("system", "user", "assistant")
MAX_JSON_DEPTH = 16  # a request is {"messages": [{...}]}: 3 levels; deeper is not a request
MAX_MESSAGES = 1024
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")


@dataclass(frozen=True)
class ServeLimits:
  """Limits of the LLM server: HTTP (`tiny_tensor.httpd.Limits`), prompt size, the queue, generation time."""
  http: Limits = Limits()
  max_prompt_bytes: int = 256 * 1024
  queue: int = 8  # requests that may wait while one generates
  queue_wait: float = 120.0  # seconds a request may wait for its turn
  max_seconds: float = 300.0  # seconds one request may generate


class RequestError(ValueError):
  """A bad request: `param` names the field (None: the request as a whole)."""

  def __init__(self, message: str, param: str | None = None):
    super().__init__(message)
    self.param = param


def _json_depth(data: bytes) -> int:
  """How deeply the arrays and objects of JSON text `data` nest (strings skipped), without parsing it."""
  depth = deepest = 0
  for m in _BRACKET.finditer(_STRING.sub(b"", data)):
    depth += 1 if m.group() in b"[{" else -1
    deepest = max(deepest, depth)
  return deepest


def _reject_constant(name: str) -> Any:
  raise RequestError(f"{name} is not a JSON number (JSON has no NaN or Infinity); send a finite number")


def parse_body(data: bytes) -> dict[str, Any]:
  """The request's JSON object, or a RequestError saying why the bytes are not one."""
  if not data: raise RequestError("the request has no body; send a JSON object")
  if (d := _json_depth(data)) > MAX_JSON_DEPTH:
    raise RequestError(f"the JSON nests {d} levels deep; a request nests at most {MAX_JSON_DEPTH}")
  try: text = data.decode("utf-8")
  except UnicodeDecodeError as e: raise RequestError(f"the body is not UTF-8 (byte {e.start})") from e
  try: body = json.loads(text, parse_constant=_reject_constant)
  except RequestError: raise
  except ValueError as e: raise RequestError(f"the body is not valid JSON: {str(e)[:200]}") from e  # also int limits
  if not isinstance(body, dict): raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
  return body


def _text(value: Any, param: str) -> str:
  if not isinstance(value, str): raise RequestError(f"'{param}' must be a string, got {_kind(value)}", param)
  if (m := _SURROGATE.search(value)):
    raise RequestError(f"'{param}' holds a lone UTF-16 surrogate (\\u{ord(m.group()):04x}) at character {m.start()}; "
                       "text must be valid Unicode", param)
  return value


def _kind(v: Any) -> str:
  return "null" if v is None else {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
                                   list: "an array", dict: "an object"}.get(type(v), type(v).__name__)


def _integer(body: dict, k: str, default: int, lo: int, hi: int) -> int:
  v = body.get(k)
  if v is None: return default
  if type(v) is not int: raise RequestError(f"'{k}' must be an integer from {lo} to {hi}, got {_kind(v)}", k)
  if not lo <= v <= hi: raise RequestError(f"'{k}' must be an integer from {lo} to {hi}, got {v}", k)
  return v


def _number(body: dict, k: str, default: float, lo: float, hi: float) -> float:
  v = body.get(k)
  if v is None: return default
  if type(v) not in (int, float) or not math.isfinite(v) or not lo <= v <= hi:
    raise RequestError(f"'{k}' must be a number from {lo:g} to {hi:g}, got {v if type(v) is float else _kind(v)}", k)
  return float(v)


def validate(body: dict[str, Any], chat: bool, llm: Any, limits: ServeLimits) -> tuple[list[int], dict[str, Any]]:
  """The prompt's token ids and the sampling options of request `body`, every field checked; else a RequestError
  naming the field and what is valid. The prompt must fit the context (prompt + generated tokens)."""
  ctx, vocab = llm.model.cfg.max_context, llm.model.cfg.vocab_size
  opts: dict[str, Any] = {"max_tokens": _integer(body, "max_tokens", 128, 1, ctx),
                          "temperature": _number(body, "temperature", 0.0, 0.0, 2.0),
                          "top_k": _integer(body, "top_k", 0, 0, vocab),
                          "seed": _integer(body, "seed", -1, 0, 2**63 - 1)}
  if opts["seed"] == -1: opts["seed"] = None
  if body.get("stream") is not None and type(body["stream"]) is not bool:
    raise RequestError(f"'stream' must be true or false, got {_kind(body['stream'])}", "stream")
  if body.get("model") is not None: _text(body["model"], "model")
  if chat:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not 1 <= len(msgs) <= MAX_MESSAGES:
      raise RequestError(f"'messages' must be an array of 1 to {MAX_MESSAGES} {{\"role\", \"content\"}} objects, got "
                         f"{_kind(msgs) if not isinstance(msgs, list) else f'{len(msgs)} items'}", "messages")
    for i, m in enumerate(msgs):
      if not isinstance(m, dict): raise RequestError(f"'messages[{i}]' must be an object, got {_kind(m)}", "messages")
      role = _text(m.get("role"), f"messages[{i}].role")
      if role not in ROLES: raise RequestError(f"'messages[{i}].role' must be one of {list(ROLES)}, got {role[:40]!r}",
                                               f"messages[{i}].role")
      _text(m.get("content"), f"messages[{i}].content")
    prompt, param = chat_prompt([{"role": m["role"], "content": m["content"]} for m in msgs],
                                llm.kv.get("tokenizer.chat_template")), "messages"
  else: prompt, param = _text(body.get("prompt"), "prompt"), "prompt"
  if (n := len(prompt.encode("utf-8"))) > limits.max_prompt_bytes:
    raise RequestError(f"the prompt is {n} bytes; this server takes at most {limits.max_prompt_bytes}", param)
  ids = llm.tokenizer.encode(prompt)
  if not ids: raise RequestError("the prompt is empty (no tokens); send some text", param)
  if len(ids) > ctx:
    raise RequestError(f"the prompt is {len(ids)} tokens; the model's context holds {ctx} (prompt and reply)", param)
  return ids, opts


class _Turns:
  """One request generates at a time; `queue` more may wait (each at most `wait` seconds), the rest get 503."""

  def __init__(self, queue: int, wait: float):
    self.slots, self.lock, self.queue, self.wait = threading.BoundedSemaphore(queue + 1), threading.Lock(), queue, wait

  def run(self, fn: Callable[[], None]) -> str | None:
    """Run `fn` on this request's turn; or return why it could not (the server is busy)."""
    if not self.slots.acquire(blocking=False):
      return f"the server is busy: {self.queue} requests are already waiting; retry later"
    try:
      if not self.lock.acquire(timeout=self.wait):
        return f"the server is busy: no turn within {self.wait:g} s; retry later"
      try: fn()
      finally: self.lock.release()
    finally: self.slots.release()
    return None


def _pieces(llm: Any, ids: list[int], opts: dict[str, Any], max_seconds: float, done: dict[str, str]) -> Iterator[str]:
  """Text pieces generated after prompt `ids`, each as soon as it is whole UTF-8; `done["reason"]` says why it ended:
  "stop" (an end token), "length" (max_tokens, the context, or the time limit)."""
  dec, n, end = codecs.getincrementaldecoder("utf-8")("ignore"), 0, time.monotonic() + max_seconds
  done["reason"] = "stop"
  for tok in llm.generate_ids(ids, **opts):
    n += 1
    if (text := dec.decode(llm.tokenizer.decode_bytes([tok], strip_space=False))): yield text
    if time.monotonic() > end: break
  if n >= opts["max_tokens"] or len(ids) + n >= llm.model.cfg.max_context or time.monotonic() > end:
    done["reason"] = "length"
  if (tail := dec.decode(b"", final=True)): yield tail


def make_server(llm: Any, host: str = "127.0.0.1", port: int = 8000, limits: ServeLimits | None = None,
                quiet: bool = True) -> StrictHTTPServer:
  """An HTTP server (not started: call `serve_forever()`) answering for `llm`; port 0 picks a free port."""
  lim = limits or ServeLimits()
  turns = _Turns(lim.queue, lim.queue_wait)

  class Handler(StrictHandler):
    limits = lim.http
    extra_headers = (("X-Content-Type-Options", "nosniff"), ("Content-Security-Policy", CSP))

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
      """The chat page, its script and style, the model list."""
      page = {"/": (CHAT_PAGE, "text/html"), "/index.html": (CHAT_PAGE, "text/html"),
              "/chat.js": (CHAT_JS, "text/javascript"), "/chat.css": (CHAT_CSS, "text/css")}
      if self.path in page:
        text, ctype = page[self.path]
        return self.send_body(200, text.encode(), f"{ctype}; charset=utf-8")
      if self.path == "/v1/models":
        model = {"id": llm.name, "object": "model", "owned_by": "tiny"}
        return self.send_json(200, {"object": "list", "data": [model]})
      self.send_json_error(404, f"no route GET {self.path[:200]}; routes: GET /, /v1/models; POST /v1/completions, "
                                "/v1/chat/completions", err_code="not_found")

    def do_POST(self) -> None:  # noqa: N802
      """A completion or a chat completion: the request checked whole, then generated on its turn."""
      if self.path not in ("/v1/completions", "/v1/chat/completions"):
        return self.send_json_error(404, f"no route POST {self.path[:200]}; routes: /v1/completions, "
                                         "/v1/chat/completions", err_code="not_found")
      chat = self.path.endswith("chat/completions")
      try:
        body = parse_body(self.body)
        ids, opts = validate(body, chat, llm, lim)
      except RequestError as e: return self.send_json_error(400, str(e), e.param, "invalid_value")
      rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:12]}", int(time.time())
      respond = self._stream if body.get("stream") else self._whole
      busy = turns.run(lambda: respond(ids, opts, rid, created, chat))
      if busy is not None: self.send_json_error(503, busy, None, "server_busy", headers={"Retry-After": "5"})

    def _whole(self, ids: list[int], opts: dict[str, Any], rid: str, created: int, chat: bool) -> None:
      done: dict[str, str] = {}
      text = "".join(_pieces(llm, ids, opts, lim.max_seconds, done))
      choice = {"index": 0, "finish_reason": done["reason"],
                **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
      self.send_json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                           "model": llm.name, "choices": [choice]})

    def _stream(self, ids: list[int], opts: dict[str, Any], rid: str, created: int, chat: bool) -> None:
      self.send_response(200)
      self.send_header("Content-Type", "text/event-stream")
      self.send_header("Cache-Control", "no-cache")
      self.send_header("Connection", "close")
      self.end_headers()
      obj = "chat.completion.chunk" if chat else "text_completion"
      def event(piece: str | None, reason: str | None) -> None:
        ch = {"index": 0, "finish_reason": reason, **({"delta": {"content": piece} if piece is not None else {}} if chat
                                                      else {"text": piece or ""})}
        chunk = {"id": rid, "object": obj, "created": created, "model": llm.name, "choices": [ch]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
      done: dict[str, str] = {}
      for p in _pieces(llm, ids, opts, lim.max_seconds, done): event(p, None)
      event(None, done["reason"])
      self.wfile.write(b"data: [DONE]\n\n")
      self.wfile.flush()
      self.close_connection = True

  Handler.quiet = quiet
  return StrictHTTPServer((host, port), Handler)
