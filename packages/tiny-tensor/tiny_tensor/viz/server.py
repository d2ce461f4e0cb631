"""The VIZ web server: the page (static files in `tiny_tensor/viz/static`) and the trace, with `http.server`.

Routes: `/` the page, `/viz.js` and `/viz.css` its code and style, `/trace.jsonl` the trace file as it is on disk
(the page parses it). Binds 127.0.0.1 unless told otherwise: a trace holds the program's source and graphs.
"""
from __future__ import annotations

import errno
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import urlsplit

STATIC = {"/": ("index.html", "text/html; charset=utf-8"), "/index.html": ("index.html", "text/html; charset=utf-8"),
          "/viz.js": ("viz.js", "text/javascript; charset=utf-8"), "/viz.css": ("viz.css", "text/css; charset=utf-8")}


def static_file(name: str) -> bytes:
  """The bytes of a file shipped in `tiny_tensor/viz/static`."""
  return resources.files("tiny_tensor.viz").joinpath("static", name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
  trace_path = ""  # set on a subclass per server
  quiet = True

  def do_GET(self) -> None:  # noqa: N802 -- the name http.server calls
    path = urlsplit(self.path).path
    if path in STATIC:
      name, ctype = STATIC[path]
      self._send(static_file(name), ctype)
    elif path == "/trace.jsonl":
      with open(self.trace_path, "rb") as f: self._send(f.read(), "application/x-ndjson; charset=utf-8")
    elif path == "/favicon.ico": self._send(b"", "image/x-icon", HTTPStatus.NO_CONTENT)
    else: self._send(f"not found: {path}; the page is at /\n".encode(), "text/plain", HTTPStatus.NOT_FOUND)

  def _send(self, body: bytes, ctype: str, status: HTTPStatus = HTTPStatus.OK) -> None:
    self.send_response(status)
    self.send_header("Content-Type", ctype)
    self.send_header("Content-Length", str(len(body)))
    self.send_header("Cache-Control", "no-store")
    self.end_headers()
    if body and self.command != "HEAD": self.wfile.write(body)

  do_HEAD = do_GET  # noqa: N815

  def log_message(self, format: str, *args: object) -> None:  # noqa: A002 -- http.server's signature
    if not self.quiet: super().log_message(format, *args)


def make_server(trace_path: str, port: int = 8000, host: str = "127.0.0.1", quiet: bool = True) -> ThreadingHTTPServer:
  """A server (not started) for the page and the trace at `trace_path`; port 0 picks a free port
  (`server.server_address[1]` tells which). Raises OSError naming the port when it is taken."""
  handler = type("VizHandler", (_Handler,), {"trace_path": trace_path, "quiet": quiet})
  try: return ThreadingHTTPServer((host, port), handler)
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      raise OSError(e.errno, f"port {port} on {host} is in use; pick another with --port N (0: any free port)") from e
    raise


def serve_in_thread(trace_path: str, port: int = 0, host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, str]:
  """Serve in a daemon thread; returns (server, its URL). Stop it with `server.shutdown()`."""
  srv = make_server(trace_path, port, host)
  threading.Thread(target=srv.serve_forever, daemon=True, name="tiny-viz").start()
  return srv, f"http://{host}:{srv.server_address[1]}/"


def serve_forever(trace_path: str, port: int = 8000, host: str = "127.0.0.1", any_port: bool = True) -> None:
  """Serve until Ctrl-C, printing the URL. `any_port`: when `port` is taken, take a free one instead."""
  try: srv = make_server(trace_path, port, host)
  except OSError as e:
    if not (any_port and e.errno == errno.EADDRINUSE): raise
    srv = make_server(trace_path, 0, host)
  url = f"http://{host}:{srv.server_address[1]}/"
  print(f"VIZ: serving {trace_path} at {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
  try: srv.serve_forever()
  except KeyboardInterrupt: pass
  finally: srv.server_close()
