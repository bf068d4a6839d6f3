"""A threaded HTTP server on the loopback for the tests' fake endpoints (a metadata service, a slow
Prometheus proxy, a server that misbehaves): real sockets, so the client code under test runs as it
does against a real server."""

from __future__ import annotations

import http.server
import socketserver
import threading


class _Threaded(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class Quiet(http.server.BaseHTTPRequestHandler):
    """A request handler that does not log every request to stderr."""

    def log_message(self, *a):
        pass


class Loopback:
    """Serves `handler` (a BaseHTTPRequestHandler class) on 127.0.0.1 at a free port, at `url`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
        self.server = _Threaded(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
