"""The VIZ web server: the page (static files in `tiny_tensor/viz/static`) and the trace, with `http.server`.

Routes: `/` the page, `/viz.js` and `/viz.css` its code and style, `/trace.jsonl` the trace file as it is on disk
(the page parses it). Binds 127.0.0.1 unless told otherwise: a trace holds the program's source and graphs. HTTP
handling (time limits, body limits, JSON errors) is `tiny_tensor.httpd`'s; every response carries a
Content-Security-Policy that lets the page run only viz.js, which inserts trace text as text, never as HTML.
"""
from __future__ import annotations

import errno
import sys
import threading
from http import HTTPStatus
from importlib import resources
from urllib.parse import urlsplit

from tiny_tensor.httpd import Limits, StrictHandler, StrictHTTPServer

STATIC = {"/": ("index.html", "text/html; charset=utf-8"), "/index.html": ("index.html", "text/html; charset=utf-8"),
          "/viz.js": ("viz.js", "text/javascript; charset=utf-8"), "/viz.css": ("viz.css", "text/css; charset=utf-8")}


def static_file(name: str) -> bytes:
  """The bytes of a file shipped in `tiny_tensor/viz/static`."""
  return resources.files("tiny_tensor.viz").joinpath("static", name).read_bytes()


# the page runs only its own script and style, loads only from this server, and cannot be framed
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class _Handler(StrictHandler):
  """The page's routes (module docstring), with `tiny_tensor.httpd`'s limits and JSON errors."""
  trace_path = ""  # set on a subclass per server
  extra_headers = (("X-Content-Type-Options", "nosniff"), ("Content-Security-Policy", CSP),
                   ("Cache-Control", "no-store"))

  def do_GET(self) -> None:  # noqa: N802 -- the name http.server calls
    """The page, its script and style, the trace file."""
    path = urlsplit(self.path).path
    if path in STATIC:
      name, ctype = STATIC[path]
      self.send_body(HTTPStatus.OK, static_file(name), ctype)
    elif path == "/trace.jsonl":
      with open(self.trace_path, "rb") as f: data = f.read()
      self.send_body(HTTPStatus.OK, data, "application/x-ndjson; charset=utf-8")
    elif path == "/favicon.ico": self.send_body(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
    else: self.send_json_error(HTTPStatus.NOT_FOUND, f"not found: {path[:200]}; the page is at /")

  do_HEAD = do_GET  # noqa: N815


def make_server(trace_path: str, port: int = 8000, host: str = "127.0.0.1", quiet: bool = True,
                limits: Limits | None = None) -> StrictHTTPServer:
  """A server (not started) for the page and the trace at `trace_path`; port 0 picks a free port
  (`server.server_address[1]` tells which); `limits`: time and size limits per connection (`tiny_tensor.httpd`).
  Raises OSError naming the port when it is taken."""
  handler = type("VizHandler", (_Handler,), {"trace_path": trace_path, "quiet": quiet, "limits": limits or Limits()})
  try: return StrictHTTPServer((host, port), handler)
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      raise OSError(e.errno, f"port {port} on {host} is in use; pick another with --port N (0: any free port)") from e
    raise


def serve_in_thread(trace_path: str, port: int = 0, host: str = "127.0.0.1",
                    limits: Limits | None = None) -> tuple[StrictHTTPServer, str]:
  """Serve in a daemon thread; returns (server, its URL). Stop it with `server.shutdown()`."""
  srv = make_server(trace_path, port, host, limits=limits)
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
