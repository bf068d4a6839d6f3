"""HTTP calls whose cost the operator, not the server, decides.

Every call the operator makes to Prometheus or a Pushgateway runs on one of its few workers. A
client's per-read timeout does not bound a request: a server that drips a byte every 2 s held a
`requests` GET with timeout=3 for 25 s and more. So each call here has a total deadline (a watchdog
shuts the socket down when it passes, whatever the call is waiting for), a cap on the bytes it
reads, follows no redirect, and fails with an `HttpError` whose message is rltune's own (what was
asked, the status code, what it means): never the server's words, which a status or an event
would otherwise carry to a tenant.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlencode, urlsplit

MiB = 1 << 20
DEFAULT_MAX_BYTES = 16 * MiB  # a 200-step trial's series are ~1.5 MB of JSON


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes


class HttpError(RuntimeError):
    """A call that failed; `str()` is safe to show a tenant (no server text in it)."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


_MEANING = {
    400: "refused the request as malformed",
    401: "wants credentials rltune does not have",
    403: "refused rltune's credentials",
    404: "has no such API (is this the right kind of server?)",
    405: "does not allow this method",
    413: "refused the request as too large",
    422: "could not process the request",
    429: "is rate-limiting rltune",
    500: "failed internally",
    502: "is behind a gateway that failed",
    503: "is unavailable",
    504: "is behind a gateway that timed out",
}


def meaning(status: int) -> str:
    """What an HTTP status says, in rltune's words."""
    if status in _MEANING:
        return _MEANING[status]
    if 300 <= status < 400:
        return "redirected (rltune follows no redirect)"
    return "answered with an error" if status >= 400 else "answered"


def _why(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "refused the connection"
    if isinstance(e, socket.gaierror):
        return "has a host name that does not resolve"
    if isinstance(e, ssl.SSLError):
        return "failed the TLS handshake (check the CA bundle)"
    if isinstance(e, http.client.HTTPException):
        return "answered something that is not HTTP"
    return "could not be reached"


def request(
    method: str,
    url: str,
    *,
    params: Optional[dict[str, str]] = None,
    headers: Optional[dict[str, str]] = None,
    ca_file: Optional[str] = None,
    deadline: float = 10.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    what: str = "the server",
) -> Reply:
    """`method url?params`, done within `deadline` seconds and `max_bytes` of body, or HttpError.
    Any status is returned as a Reply (the caller decides what an error status means)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise HttpError(f"{what}: not an http(s) URL")
    path = (u.path or "/") + ("?" + urlencode(params) if params else "")
    deadline = max(0.05, deadline)
    if u.scheme == "https":
        ctx = ssl.create_default_context(cafile=ca_file)
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            u.hostname, u.port, timeout=deadline, context=ctx
        )
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=deadline)
    fired = threading.Event()

    def watchdog() -> None:
        fired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked read or write at once
            except OSError:
                pass

    timer = threading.Timer(deadline, watchdog)
    timer.daemon = True
    t0 = time.monotonic()
    timer.start()
    resp: Optional[http.client.HTTPResponse] = None
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        chunks, n = [], 0
        while True:
            if fired.is_set() or time.monotonic() - t0 > deadline:
                raise TimeoutError
            b = resp.read1(64 * 1024)
            if not b:
                break
            n += len(b)
            if n > max_bytes:
                size = f"{max_bytes / MiB:g} MiB" if max_bytes >= MiB else f"{max_bytes:,} bytes"
                raise HttpError(f"{what} answered more than {size}; the answer was dropped")
            chunks.append(b)
        if fired.is_set():
            raise TimeoutError
        return Reply(resp.status, b"".join(chunks))
    except HttpError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:
        if fired.is_set() or isinstance(e, TimeoutError) or time.monotonic() - t0 >= deadline:
            raise HttpError(f"{what} did not answer within {deadline:g} s") from None
        raise HttpError(f"{what} {_why(e)}") from None
    finally:
        timer.cancel()
        if resp is not None:
            resp.close()  # its file holds the socket open past conn.close()
        conn.close()
