"""Strict HTTP/1.1 on the standard library's `http.server`: the base of the LLM server and the VIZ server.

What a handler built on `StrictHandler` guarantees, against slow, malformed and hostile clients:
1. Time limits per phase, not per read: the request line and headers must arrive within `Limits.header_timeout`
   seconds in all, the body within `Limits.body_timeout` (a client sending a byte a second holds no thread); each send
   of the response may take `Limits.write_timeout`. A client that is too slow gets 408 and the connection closes.
2. Bodies by `Content-Length` only: decimal digits, the same in every Content-Length header, at most `Limits.max_body`
   bytes (413 above); a POST without one gets 411. `Transfer-Encoding` is refused (411 for chunked: "send
   Content-Length"; 501 for any other coding). The whole body is read before the handler runs (`self.body`), so no
   byte of a body is ever read as the next request (no request smuggling).
3. Request line `METHOD /target HTTP/1.x` only (no HTTP/0.9, no absolute targets), at most 8 KiB; headers within
   http.client's limits (100 lines of 64 KiB, else 431).
4. Errors are JSON in OpenAI's error format, `{"error": {"message", "type", "param", "code"}}`, and the connection
   closes after every 4xx/5xx response: no keep-alive after an error. A bug in a handler is a logged 500, never a
   dropped connection.
5. `StrictHTTPServer` serves at most `Limits.max_connections` connections at once; one more gets 503 and is closed.
"""
from __future__ import annotations

import io
import json
import re
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Limits", "StrictHandler", "StrictHTTPServer", "error_body"]

MAX_REQUEST_LINE = 8192
_REQUEST_LINE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (/[\x21-\x7e]*) (HTTP/\d+\.\d+)")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")


@dataclass(frozen=True)
class Limits:
  """What one connection may take: seconds per phase, body bytes, connections served at once."""
  header_timeout: float = 10.0  # request line + headers, in all
  body_timeout: float = 30.0  # the body, in all
  write_timeout: float = 30.0  # each send of the response (a client that stops reading)
  max_body: int = 1 << 20
  max_connections: int = 64


def error_body(code: int, message: str, param: str | None = None, err_code: str | None = None) -> bytes:
  """The JSON of an error response in OpenAI's format; `type` follows the status (4xx: the request, 5xx: the server)."""
  kind = "invalid_request_error" if 400 <= code < 500 else "server_error"
  if err_code is None: err_code = HTTPStatus(code).phrase.lower().replace(" ", "_").replace("-", "_")
  return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": err_code}}).encode()


class _DeadlineReader(io.RawIOBase):
  """The read side of a socket under one deadline for a whole phase: each recv waits at most the time left."""

  def __init__(self, sock: socket.socket):
    self.sock = sock
    self.deadline: float | None = None

  def readable(self) -> bool: return True

  def readinto(self, buf: Any) -> int:
    if self.deadline is not None:
      left = self.deadline - time.monotonic()
      if left <= 0: raise TimeoutError("the time for this part of the request ran out")
      self.sock.settimeout(left)
    return self.sock.recv_into(buf)


class StrictHandler(BaseHTTPRequestHandler):
  """A request handler with the guarantees in this module's docstring. Subclasses write `do_GET`/`do_POST`/..., read
  the request body from `self.body` and answer with `send_body` / `send_json` / `send_json_error`."""
  protocol_version = "HTTP/1.1"
  limits = Limits()
  extra_headers: tuple[tuple[str, str], ...] = (("X-Content-Type-Options", "nosniff"),)
  body_methods = ("POST", "PUT", "PATCH")
  quiet = True

  def setup(self) -> None:
    super().setup()
    self._reader = _DeadlineReader(self.connection)
    self._in = io.BufferedReader(self._reader, 1 << 16)  # typed as what it is: rfile is declared BufferedIOBase
    self.rfile = self._in
    self.body = b""

  # ***** one request: line, headers, body, then the handler *****
  def handle_one_request(self) -> None:
    """Read one whole request within the time limits, then dispatch it; answer errors as JSON and close."""
    self.close_connection, self._responded, self._reading, self._started = True, False, True, False
    self.command, self.path, self.requestline, self.request_version = "", "", "", "HTTP/1.1"
    self.body = b""
    self._reader.deadline = time.monotonic() + self.limits.header_timeout
    try:
      if not self._read_head() or not self._read_body(): return
      self._reading, self._reader.deadline = False, None
      self.connection.settimeout(self.limits.write_timeout)
      handler = getattr(self, f"do_{self.command}", None)
      if handler is None:
        allowed = ", ".join(sorted(m[3:] for m in dir(self) if m.startswith("do_")))
        self.send_json_error(405, f"method {self.command} is not allowed; allowed: {allowed}",
                             headers={"Allow": allowed})
      else: handler()
      self.wfile.flush()
    except TimeoutError:
      self.close_connection = True
      if self._reading and self._started and not self._responded:  # (an idle kept-alive connection just closes)
        self.connection.settimeout(self.limits.write_timeout)
        phase = "body" if self.headers_read else "request line and headers"
        self.send_json_error(408, f"the request's {phase} did not arrive in time "
                                  f"({self.limits.header_timeout:g} s for the line and headers, "
                                  f"{self.limits.body_timeout:g} s for the body)")
    except ConnectionError:  # the client left (reset, broken pipe): nobody to answer
      self.close_connection = True
    except Exception:  # a bug in a handler: log it and answer 500 rather than drop the connection
      self.close_connection = True
      self.log_error("%s", traceback.format_exc())
      if not self._responded: self.send_json_error(500, "internal error while answering this request (logged)")

  headers_read = False

  def _read_head(self) -> bool:
    self.headers_read = False
    if not self._in.peek(1): return False  # the client closed the connection between requests
    self._started = True  # a byte of this request is here (maybe pipelined behind the last one): it gets an answer
    line = self.rfile.readline(MAX_REQUEST_LINE + 1)
    if len(line) > MAX_REQUEST_LINE:
      self.send_json_error(414, f"the request line is longer than {MAX_REQUEST_LINE} bytes")
      return False
    if not line.endswith(b"\n"): return False  # the connection closed in the middle of the request line
    self.raw_requestline = line
    text = line.decode("iso-8859-1").rstrip("\r\n")
    self.requestline = text
    m = _REQUEST_LINE.fullmatch(text)
    if m is None:
      self.send_json_error(400, f"bad request line {text[:100]!r}: expected 'METHOD /path HTTP/1.1'")
      return False
    if m.group(3) not in ("HTTP/1.0", "HTTP/1.1"):
      self.send_json_error(505, f"HTTP version {m.group(3)!r} is not supported; use HTTP/1.1 or HTTP/1.0")
      return False
    if not self.parse_request(): return False  # headers: the standard library's parser (it answered the error)
    if (bad := self._malformed_header()) is not None:
      self.send_json_error(400, f"malformed header line {bad[:100]!r}: expected 'Name: value' (no space before the "
                                "colon, no folded lines)")
      return False
    self.headers_read = True
    return True

  def _malformed_header(self) -> str | None:
    """The first header line the standard library's lenient parser did not take as a header, or None. It stops at
    such a line (`Content-Length : 5`) and takes the rest for a body: the headers after it, a Content-Length among
    them, would be ignored, and a body read as the next request."""
    rest = self.headers.get_payload()
    if isinstance(rest, str) and rest: return rest.split("\n", 1)[0].rstrip("\r")
    if self.headers.defects: return str(self.headers.defects[0])
    for k, v in self.headers.items():
      if "\n" in v: return f"{k}: {v}"
    return None

  def handle_expect_100(self) -> bool:
    """`Expect: 100-continue`: go on only when the announced body is acceptable (else the error, not 100)."""
    return self._body_length() is not None and super().handle_expect_100()

  def _body_length(self) -> int | None:
    """The body's length from the headers, or None after answering why it is not acceptable."""
    if (codings := self.headers.get_all("Transfer-Encoding")):
      if any("chunked" in c.lower() for c in codings):
        self.send_json_error(411, "Transfer-Encoding: chunked is not supported; send the body with Content-Length")
      else: self.send_json_error(501, f"Transfer-Encoding {', '.join(codings)[:100]!r} is not supported; send the "
                                      "body with Content-Length")
      return None
    values = [v.strip() for v in self.headers.get_all("Content-Length") or []]
    if not values:
      if self.command in self.body_methods:
        self.send_json_error(411, f"a {self.command} needs a Content-Length header (the body's size in bytes)")
        return None
      return 0
    if len(set(values)) > 1:
      self.send_json_error(400, f"conflicting Content-Length headers: {values[:4]}")
      return None
    if not _CONTENT_LENGTH.fullmatch(values[0]):
      self.send_json_error(400, f"Content-Length must be a whole number of bytes from 0 to {self.limits.max_body}, "
                                f"got {values[0][:40]!r}")
      return None
    n = int(values[0])
    if n > self.limits.max_body:
      self.send_json_error(413, f"the body is {n} bytes; this server accepts at most {self.limits.max_body}")
      return None
    return n

  def _read_body(self) -> bool:
    n = self._body_length()
    if n is None: return False
    if n:
      self._reader.deadline = time.monotonic() + self.limits.body_timeout
      self.body = self.rfile.read(n)
      if len(self.body) < n:  # the client closed its side early
        self.send_json_error(400, f"the body ended after {len(self.body)} of the {n} bytes Content-Length announced")
        return False
    return True

  # ***** answering *****
  def send_response(self, code: int, message: str | None = None) -> None:
    """The status line and the headers every response carries; after an error the connection closes."""
    super().send_response(code, message)
    self._responded = True
    for k, v in self.extra_headers: self.send_header(k, v)
    if code >= 400: self.send_header("Connection", "close")  # http.server then closes after this response

  def send_body(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
    """A whole response: status, Content-Type, Content-Length, `headers`, the body (not for HEAD)."""
    self.send_response(code)
    self.send_header("Content-Type", ctype)
    self.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items(): self.send_header(k, v)
    self.end_headers()
    if body and self.command != "HEAD": self.wfile.write(body)

  def send_json(self, code: int, obj: Any) -> None:
    """`obj` as a JSON response."""
    self.send_body(code, json.dumps(obj).encode(), "application/json")

  def send_json_error(self, code: int, message: str, param: str | None = None, err_code: str | None = None,
                      headers: dict[str, str] | None = None) -> None:
    """An error response in OpenAI's format (see `error_body`); the connection closes after it."""
    self.close_connection = True
    self.send_body(code, error_body(code, message, param, err_code), "application/json", headers)

  def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
    """The standard library's error path (header parsing, Expect) answered as JSON too."""
    text = message or HTTPStatus(code).phrase
    self.send_json_error(code, f"{text}: {explain}" if explain else text)

  def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- http.server's signature
    """Quiet unless the server was made with `quiet=False`; errors (log_error) always go to stderr."""
    if not self.quiet: super().log_message(format, *args)

  def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
    """Errors go to stderr even when the handler is quiet."""
    sys.stderr.write(f"{self.address_string()} - {format % args}\n")


class StrictHTTPServer(ThreadingHTTPServer):
  """A thread per connection, at most `handler.limits.max_connections` at once (one more is answered 503 and
  closed); threads are daemons, so stopping the server does not wait for a client."""
  daemon_threads = True
  request_queue_size = 128  # listen backlog (socketserver's 5 drops a burst of connections' first packets)

  def __init__(self, address: tuple[str, int], handler: type[StrictHandler]):
    self.limits = handler.limits
    self.slots = threading.BoundedSemaphore(handler.limits.max_connections)
    super().__init__(address, handler)

  def process_request(self, request: Any, client_address: Any) -> None:
    """Serve `request` in a thread if a slot is free, else answer 503 and close it."""
    if not self.slots.acquire(blocking=False):
      n = self.limits.max_connections
      body = error_body(503, f"the server is serving its maximum of {n} connections; retry later", None, "server_busy")
      head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n" \
             "Connection: close\r\nRetry-After: 1\r\n\r\n"
      request.settimeout(1.0)
      try: request.sendall(head.encode() + body)
      except OSError as e: sys.stderr.write(f"refusing {client_address}: {e}\n")  # it is closed below all the same
      self.shutdown_request(request)
      return
    super().process_request(request, client_address)

  def process_request_thread(self, request: Any, client_address: Any) -> None:
    """Serve one connection, then free its slot."""
    try: super().process_request_thread(request, client_address)
    finally: self.slots.release()
