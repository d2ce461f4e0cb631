"""The LLM server and the VIZ server against hostile clients, over real sockets on 127.0.0.1 with raw bytes: slow and
partial requests (time limits), bad Content-Length, request smuggling (a request hidden in a body, chunked bodies),
bad fields (a 4xx JSON error in OpenAI's format before any generation), the bounded queue (503), and a fuzz of the
request parser (every answer a well-formed HTTP response, never a dropped connection or a hang).

The LLM is a stand-in (a real GPT-2 byte-level tokenizer; it "generates" its prompt's tokens back, so the expected
text is the prompt's first max_tokens bytes): generation itself is checked against numpy in tests_models/test_llm.py.
"""
from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tiny_tensor.httpd import Limits
from tiny_tensor.llm import Tokenizer
from tiny_tensor.llm.serve import ServeLimits, make_server
from tiny_tensor.llm.tokenizer import _bytes_to_unicode
from tiny_tensor.viz.server import serve_in_thread

# Device-independent (sockets, parsing, the page's script): they run in the CPU session only; the nox sessions on other
# devices (tiny-tensor@MOCK+AMD, ...) would repeat them unchanged.
pytestmark = pytest.mark.dev_session("CPU")
FAST = Limits(header_timeout=0.4, body_timeout=0.4, write_timeout=2.0, max_body=16384, max_connections=64)
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) [^\r\n]*\r\n")


class EchoLLM:
  """Stands in for `tiny_tensor.llm.LLM`: its replies are its prompt's tokens, one per step; `gate` can hold it."""

  def __init__(self, ctx: int = 64):
    b2u = _bytes_to_unicode()
    self.tokenizer = Tokenizer("gpt2", [b2u[b] for b in range(256)], add_bos=False)
    self.name, self.kv = "echo", {}
    self.model = SimpleNamespace(cfg=SimpleNamespace(max_context=ctx, vocab_size=256))
    self.gate: threading.Event | None = None
    self.started = threading.Event()
    self.calls: list[dict[str, Any]] = []

  def generate_ids(self, ids: list[int], max_tokens: int, temperature: float, top_k: int, seed: int | None):
    self.calls.append({"ids": list(ids), "max_tokens": max_tokens, "temperature": temperature, "top_k": top_k,
                       "seed": seed})
    self.started.set()
    if self.gate is not None: self.gate.wait(10)
    yield from ids[:max_tokens]


@pytest.fixture
def llm_server():
  servers = []

  def start(limits: ServeLimits = ServeLimits(http=FAST), llm: EchoLLM | None = None):
    llm = llm or EchoLLM()
    srv = make_server(llm, "127.0.0.1", 0, limits)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    servers.append(srv)
    return srv.server_address[1], llm
  yield start
  for srv in servers:
    srv.shutdown()
    srv.server_close()


def exchange(port: int, data: bytes, wait: float = 3.0, pause: float = 0.0,
             head: bool = False) -> tuple[list[tuple[int, dict, bytes]], bool]:
  """Send `data` (after `pause` s) on a new connection; read until the server closes it or `wait` s pass. Returns the
  responses (status, headers, body; `head`: answers to HEAD, without bodies) and whether the server closed it."""
  with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
    if pause: time.sleep(pause)
    s.sendall(data)
    buf, closed, end = b"", False, time.monotonic() + wait
    while time.monotonic() < end:
      s.settimeout(max(0.01, end - time.monotonic()))
      try: chunk = s.recv(65536)
      except TimeoutError: break
      except ConnectionResetError:  # closed with unread input left: still closed, after what we got
        closed = True
        break
      if not chunk:
        closed = True
        break
      buf += chunk
  return parse_responses(buf, head), closed


def parse_responses(buf: bytes, head: bool = False) -> list[tuple[int, dict, bytes]]:
  """The HTTP responses in `buf`, each checked to be well formed (a status line, headers, a Content-Length body or,
  for a stream, the rest)."""
  out = []
  while buf:
    m = STATUS.match(buf)
    assert m, f"not an HTTP response: {buf[:200]!r}"
    head_end = buf.index(b"\r\n\r\n")
    headers = {}
    for line in buf[m.end():head_end].split(b"\r\n"):
      if not line: continue
      k, v = line.decode("latin-1").split(":", 1)
      headers[k.strip().lower()] = v.strip()
    rest = buf[head_end + 4:]
    if 100 <= int(m.group(1)) < 200:  # an interim response (100 Continue): no body, the real one follows
      buf = rest
      continue
    if head: body, buf = b"", rest  # the answer to HEAD has the headers of a GET, no body
    elif "content-length" in headers:
      n = int(headers["content-length"])
      assert len(rest) >= n, f"a body cut short: {n} announced, {len(rest)} sent"
      body, buf = rest[:n], rest[n:]
    else:
      assert headers.get("content-type") == "text/event-stream", headers
      body, buf = rest, b""
    out.append((int(m.group(1)), headers, body))
  return out


def post(path: str, body: bytes | str, extra: str = "") -> bytes:
  body = body.encode() if isinstance(body, str) else body
  return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
          f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def one_error(port: int, data: bytes, status: int, **kw: Any) -> dict:
  """`data` gets exactly one response, an error `status` in OpenAI's format, and the connection closes."""
  t0 = time.monotonic()
  rs, closed = exchange(port, data, **kw)
  assert [r[0] for r in rs] == [status], rs
  code, headers, body = rs[0]
  err = json.loads(body)["error"]
  assert set(err) == {"message", "type", "param", "code"} and err["message"], err
  assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
  assert closed and headers.get("connection") == "close", "no keep-alive after an error"
  assert time.monotonic() - t0 < 2.5
  return err


# ***** time limits and Content-Length *****
def test_short_body_and_partial_request_line_time_out(llm_server):
  port, _ = llm_server()
  err = one_error(port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}", 408)
  assert "body" in err["message"]
  err = one_error(port, b"GET /v1/mod", 408)
  assert "request line and headers" in err["message"]
  one_error(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n", 408)  # headers never end


def test_partial_request_pipelined_after_a_good_one_gets_408(llm_server):
  port, _ = llm_server()
  rs, closed = exchange(port, b"GET /v1/models HTTP/1.1\r\n\r\nGET /v1/mo")
  assert [r[0] for r in rs] == [200, 408] and closed


def test_slow_client_cannot_hold_a_thread_by_trickling(llm_server):
  port, _ = llm_server()
  with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
    t0, got = time.monotonic(), b""
    for ch in b"GET /v1/models HTTP/1.1\r\nX-Slow: " + b"a" * 40:  # a byte every 50 ms: 2.4 s, the limit is 0.4 s
      try: s.sendall(bytes([ch]))
      except (BrokenPipeError, ConnectionResetError): break
      time.sleep(0.05)
      if time.monotonic() - t0 > 1.5: break
    s.settimeout(2)
    while (chunk := s.recv(4096)): got += chunk
  assert parse_responses(got)[0][0] == 408 and time.monotonic() - t0 < 2.5


def test_held_connections_time_out_and_do_not_block_others(llm_server):
  port, _ = llm_server()
  held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
  try:
    for i, s in enumerate(held): s.sendall([b"GET /v1/mod", post("/v1/completions", "{}")[:-1], b"POST / HTTP/1.1\r\n"
                                            b"Content-Length: 100\r\n\r\nab"][i % 3])
    t0 = time.monotonic()
    rs, _ = exchange(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert rs[0][0] == 200 and json.loads(rs[0][2])["data"][0]["id"] == "echo" and time.monotonic() - t0 < 0.3
    for s in held:  # each gets its 408 and is closed within the limit
      s.settimeout(2)
      data = b""
      while (chunk := s.recv(4096)): data += chunk
      assert parse_responses(data)[0][0] == 408
  finally:
    for s in held: s.close()


def test_connection_cap_answers_503(llm_server):
  port, _ = llm_server(ServeLimits(http=Limits(header_timeout=2, body_timeout=2, max_connections=3)))
  held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
  try:
    time.sleep(0.1)
    err = one_error(port, b"GET /v1/models HTTP/1.1\r\n\r\n", 503)
    assert "maximum of 3 connections" in err["message"] and err["code"] == "server_busy"
  finally:
    for s in held: s.close()
  time.sleep(0.2)
  rs, _ = exchange(port, b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
  assert rs[0][0] == 200


@pytest.mark.parametrize("headers, status, words", [
  ("Content-Length: -1\r\n", 400, "whole number of bytes"),
  ("Content-Length: abc\r\n", 400, "'abc'"),
  ("Content-Length: 1e3\r\n", 400, "'1e3'"),
  ("Content-Length: 5\r\nContent-Length: 6\r\n", 400, "conflicting"),
  ("", 411, "needs a Content-Length"),
  ("Content-Length: 1000000000000\r\n", 413, "1000000000000 bytes"),
  ("Content-Length: 16385\r\n", 413, "at most 16384"),
  ("Transfer-Encoding: chunked\r\n", 411, "chunked is not supported"),
  ("Transfer-Encoding: gzip\r\nContent-Length: 2\r\n", 501, "'gzip' is not supported"),
])
def test_bad_content_length_is_a_4xx_json_error(llm_server, headers, status, words):
  port, llm = llm_server()
  err = one_error(port, f"POST /v1/completions HTTP/1.1\r\n{headers}\r\n{{}}".encode(), status)
  assert words in err["message"] and not llm.calls


@pytest.mark.parametrize("line, status", [(b"GET /v1/models\r\n", 400), (b"GET /v1/models HTTP/2.0\r\n", 505),
                                          (b"GET http://x/v1/models HTTP/1.1\r\n", 400), (b"\x00\xff junk\r\n", 400),
                                          (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n", 414),
                                          (b"DELETE /v1/models HTTP/1.1\r\n", 405)])
def test_bad_request_lines(llm_server, line, status):
  port, _ = llm_server()
  one_error(port, line + b"Host: x\r\n\r\n", status)


def test_too_many_or_too_long_headers(llm_server):
  port, _ = llm_server()
  one_error(port, b"GET /v1/models HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431)
  one_error(port, b"GET /v1/models HTTP/1.1\r\nX: " + b"y" * 70000 + b"\r\n\r\n", 431)


# ***** request smuggling *****
def test_request_hidden_in_a_body_is_never_answered(llm_server):
  port, _ = llm_server()
  hidden = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
  one_error(port, post("/nope", hidden), 404)  # 404, then nothing: the body was read as a body
  one_error(port, post("/v1/completions", hidden), 400)
  # chunked: refused whole, the connection closed (the chunk is not read as a request)
  chunk = b"%x\r\n%s\r\n0\r\n\r\n" % (len(hidden), hidden)
  one_error(port, b"POST /nope HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk, 411)
  # a GET with a body: the body is consumed, the next request on the connection is the real next one
  get_body = b"GET /v1/models HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(hidden), hidden)
  rs, _ = exchange(port, get_body + b"GET /nope HTTP/1.1\r\n\r\n")
  assert [r[0] for r in rs] == [200, 404]


@pytest.mark.parametrize("header", [b"Content-Length : %d", b"Content-Length:%d\r\n folded", b"bad line\r\nX: %d",
                                    b": %d"])
def test_malformed_header_lines_are_refused(llm_server, header):
  # the standard library's parser stops at such a line and ignores the rest: a Content-Length there would be
  # ignored and the body read as the next request
  port, _ = llm_server()
  hidden = b"GET /v1/models HTTP/1.1\r\n\r\n"
  line = header % len(hidden) if b"%d" in header else header
  err = one_error(port, b"GET /nope HTTP/1.1\r\n" + line + b"\r\n\r\n" + hidden, 400)
  assert "malformed header line" in err["message"]


def test_keep_alive_pipelining_answers_each_request_once(llm_server):
  port, llm = llm_server()
  req = post("/v1/completions", json.dumps({"prompt": "hello there", "max_tokens": 5}))
  rs, _ = exchange(port, req + req + b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
  assert [r[0] for r in rs] == [200, 200, 200]
  assert [json.loads(r[2])["choices"][0]["text"] for r in rs[:2]] == ["hello", "hello"]
  assert json.loads(rs[0][2])["choices"][0]["finish_reason"] == "length"


# ***** fields: every bad request a 400 naming the field, before any generation *****
@pytest.mark.parametrize("body, param, words", [
  (b'{"prompt": "x", "max_tokens": Infinity}', None, "Infinity is not a JSON number"),
  (b'{"prompt": "x", "max_tokens": 1e400}', "max_tokens", "integer from 1 to 64"),
  (b'{"prompt": "x", "max_tokens": 2.5}', "max_tokens", "got a number"),
  (b'{"prompt": "x", "max_tokens": 0}', "max_tokens", "got 0"),
  (b'{"prompt": "x", "max_tokens": true}', "max_tokens", "got a boolean"),
  (b'{"prompt": "x", "temperature": NaN}', None, "NaN is not a JSON number"),
  (b'{"prompt": "x", "temperature": -1}', "temperature", "from 0 to 2"),
  (b'{"prompt": "x", "top_k": 1000000}', "top_k", "from 0 to 256"),
  (b'{"prompt": "x", "seed": "abc"}', "seed", "got a string"),
  (b'{"prompt": "x", "seed": -1}', "seed", "from 0 to"),
  (b'{"prompt": "x", "stream": "yes"}', "stream", "true or false"),
  (b'{"prompt": "\\ud800"}', "prompt", "surrogate"),
  (b'{"prompt": 5}', "prompt", "must be a string"),
  (b'{"prompt": ""}', "prompt", "empty"),
  (b'{"prompt": "' + b"y" * 65 + b'", "stream": true}', "prompt", "65 tokens; the model's context holds 64"),
  (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", None, "not valid JSON"),
  (b'[' * 5000 + b']' * 5000, None, "nests 5000 levels"),
  (b'{"prompt": "x", "n": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]}', None, "nests 19 levels"),
  (b'"just a string"', None, "must be a JSON object"),
  (b'{"prompt": "\xff"}', None, "not UTF-8"),
  (b'{"prompt": "x"', None, "not valid JSON"),
  (b"", None, "no body"),
])
def test_bad_completion_fields(llm_server, body, param, words):
  port, llm = llm_server()
  err = one_error(port, post("/v1/completions", body), 400)
  assert words in err["message"] and err["param"] == param, err
  assert not llm.calls  # nothing generated, no stream started


@pytest.mark.parametrize("messages, param, words", [
  ([{"role": 5, "content": "hi"}], "messages[0].role", "must be a string, got an integer"),
  ([{"role": "wizard", "content": "hi"}], "messages[0].role", "one of ['system', 'user', 'assistant']"),
  ([{"role": "user", "content": None}], "messages[0].content", "must be a string, got null"),
  ([{"role": "user"}], "messages[0].content", "must be a string"),
  (["hi"], "messages", "'messages[0]' must be an object"),
  ([], "messages", "got 0 items"),
  ("hi", "messages", "got a string"),
  ([{"role": "user", "content": "z" * 70}], "messages", "the model's context holds 64"),
])
def test_bad_chat_fields(llm_server, messages, param, words):
  port, llm = llm_server()
  err = one_error(port, post("/v1/chat/completions", json.dumps({"messages": messages, "stream": True})), 400)
  assert words in err["message"] and err["param"] == param, err
  assert not llm.calls


def test_prompt_bytes_limit(llm_server):
  port, llm = llm_server(ServeLimits(http=FAST, max_prompt_bytes=100))
  err = one_error(port, post("/v1/completions", json.dumps({"prompt": "é" * 60})), 400)
  assert "120 bytes" in err["message"] and "at most 100" in err["message"] and not llm.calls


def test_valid_options_reach_the_model_and_stream(llm_server):
  port, llm = llm_server()
  body = {"prompt": "ab ✓", "max_tokens": 64, "temperature": 1.5, "top_k": 3, "seed": 2**62, "stream": True}
  rs, closed = exchange(port, post("/v1/completions", json.dumps(body)))
  assert rs[0][0] == 200 and closed
  events = [e[6:] for e in rs[0][2].decode().split("\n\n") if e.startswith("data: ")]
  assert events[-1] == "[DONE]" and "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == "ab ✓"
  assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"
  want_ids = list("ab ✓".encode())  # byte-level BPE with no merges: a token per byte, in byte order of the vocab
  assert llm.calls == [{"ids": want_ids, "max_tokens": 64, "temperature": 1.5, "top_k": 3, "seed": 2**62}]


def test_generation_time_limit_stops_with_length(llm_server):
  class SlowLLM(EchoLLM):
    def generate_ids(self, ids, max_tokens, temperature, top_k, seed):
      for t in super().generate_ids(ids, max_tokens, temperature, top_k, seed):
        time.sleep(0.05)
        yield t
  port, _ = llm_server(ServeLimits(http=FAST, max_seconds=0.3), SlowLLM())
  rs, _ = exchange(port, post("/v1/completions", json.dumps({"prompt": "abcdefghijklmnopqrstuvwxyz" * 2})))
  choice = json.loads(rs[0][2])["choices"][0]
  assert rs[0][0] == 200 and choice["finish_reason"] == "length"
  assert 1 <= len(choice["text"]) <= 12 and "abcdefghijklmnopqrstuvwxyz".startswith(choice["text"])


# ***** the queue *****
def test_bounded_queue_answers_503_when_full(llm_server):
  llm = EchoLLM()
  llm.gate = threading.Event()
  port, _ = llm_server(ServeLimits(http=Limits(header_timeout=2, body_timeout=2, write_timeout=5), queue=1,
                                   queue_wait=0.5), llm)
  req = post("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}))
  results: dict[str, Any] = {}
  first = threading.Thread(target=lambda: results.setdefault("a", exchange(port, req, wait=8)))
  first.start()
  assert llm.started.wait(5)  # the first request is generating (held by the gate)
  second = threading.Thread(target=lambda: results.setdefault("b", exchange(port, req, wait=8)))
  second.start()
  time.sleep(0.15)  # the second waits in the queue
  err = one_error(port, req, 503)  # the third finds the queue full: at once
  assert "1 requests are already waiting" in err["message"] and err["code"] == "server_busy"
  second.join(5)
  (rs, _), = [results["b"]]
  assert rs[0][0] == 503 and "no turn within 0.5 s" in json.loads(rs[0][2])["error"]["message"]
  llm.gate.set()
  first.join(5)
  rs, _ = results["a"]
  assert rs[0][0] == 200 and json.loads(rs[0][2])["choices"][0]["text"] == "hi"


# ***** the VIZ server shares the strict handling *****
def test_viz_server_timeouts_and_smuggling(tmp_path):
  p = tmp_path / "t.jsonl"
  p.write_text('["tiny-viz", 1, {}]\n')
  srv, url = serve_in_thread(str(p), limits=FAST)
  port = srv.server_address[1]
  try:
    one_error(port, b"GET /trace.jsonl HTTP/1.1\r\nContent-Length: 100\r\n\r\nab", 408)
    one_error(port, b"GET /viz.j", 408)
    one_error(port, b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400)
    one_error(port, b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405)
    hidden = b"GET /trace.jsonl HTTP/1.1\r\n\r\n"
    rs, _ = exchange(port, b"GET /nope HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(hidden), hidden))
    assert [r[0] for r in rs] == [404]
    rs, _ = exchange(port, b"HEAD / HTTP/1.1\r\nConnection: close\r\n\r\n", head=True)
    assert rs[0][0] == 200 and rs[0][2] == b"" and "script-src 'self'" in rs[0][1]["content-security-policy"]
  finally:
    srv.shutdown()
    srv.server_close()


# ***** fuzz: mutated valid requests *****
def _mutations(rng: random.Random, req: bytes) -> bytes:
  b = bytearray(req)
  for _ in range(rng.randint(1, 3)):
    op, i = rng.randrange(7), rng.randrange(len(b) + 1)
    if op == 0 and len(b) > 1: del b[i % len(b)]
    elif op == 1: b[i:i] = bytes([rng.choice(b" \r\n:\x00\xff{}\"\\0-9aZ")])
    elif op == 2 and len(b) > 1: b[i % len(b)] = rng.randrange(256)
    elif op == 3: del b[i:]  # cut short
    elif op == 4:
      j = bytes(b).find(b"\r\n") + 2
      b[j:j] = rng.choice([b"Content-Length: 7\r\n", b"Transfer-Encoding: chunked\r\n", b"Content-Length: -3\r\n",
                           b"Expect: 100-continue\r\n", b"Connection: keep-alive\r\n", b"X" * 300 + b": y\r\n"])
    elif op == 5: b += rng.choice([b"GET /v1/models HTTP/1.1\r\n\r\n", b"\r\n", b"0\r\n\r\n", b"garbage"])
    else: b = bytearray(bytes(b).replace(b"1.1", rng.choice([b"1.0", b"2.0", b"0.9", b"1.1 x"]), 1))
  return bytes(b)


def test_fuzz_request_parser(llm_server):
  port, _ = llm_server(ServeLimits(http=Limits(header_timeout=0.25, body_timeout=0.25, write_timeout=2)))
  valid = [b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
           post("/v1/completions", json.dumps({"prompt": "hi there", "max_tokens": 3}), "Connection: close\r\n"),
           post("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "yo"}], "stream": True}),
                "Connection: close\r\n")]
  rng, t0, seen = random.Random(36), time.monotonic(), set()
  for _ in range(80):
    req = _mutations(rng, rng.choice(valid))
    rs, closed = exchange(port, req, wait=2.0)
    assert rs, f"no response to {req[:120]!r}"  # never a dropped connection (parse_responses checked the form)
    for code, _, body in rs:
      seen.add(code)
      assert 200 <= code < 300 or 400 <= code < 500 or code in (501, 503, 505), (code, req[:120])
      if code >= 400: assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    assert closed, req  # never a hang: after an error, or when a kept-alive connection idles, the server closes it
  assert time.monotonic() - t0 < 60 and {200, 400} <= seen, seen
