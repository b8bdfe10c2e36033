"""The agent's HTTP endpoints: /metrics (Prometheus text format) and the last CPU profile.

- ``/metrics``: prometheus_client's exposition of metrics.TotalsCollector;
- ``/debug/pprof/profile``: the last window's CPU profile, gzipped profile.proto
  (the path Go's net/http/pprof uses, which Parca and Pyroscope scrape; their
  ``?seconds=N`` is ignored: the profile is always the last finished window,
  see the ``X-Pgprobe-Window-End`` header); 503 until a first window ended;
- ``/``: a short index.

GET only; nothing is written anywhere. They run on httpd.Server (bounded: a pool of
handler threads, timeouts, a connection cap); with --web-config (webconfig.py) over
TLS and behind basic auth, every path alike (401 with WWW-Authenticate).
"""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from pgprobe.tools.serve import httpd
from pgprobe.tools.serve.agent import say
from pgprobe.tools.serve.webconfig import WebConfig

PROFILE_PATH = "/debug/pprof/profile"
INDEX = (
    "pgprobe serve\n\n"
    "/metrics               Prometheus metrics (LWLock waits, SLRU reads, CPU samples)\n"
    f"{PROFILE_PATH}  the last window's CPU profile (pprof)\n"
)
REASONS = ("cap", "fd_limit", "read_timeout", "too_large", "tls")


class SocketWriter(io.BufferedIOBase):
    """The handler's wfile: straight to the socket (sendall, under its write timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sock.sendall(data)
        return len(data)


class Handler(BaseHTTPRequestHandler):
    """One request, whose head the server has read: http.server's parsing and replies."""

    protocol_version = "HTTP/1.1"  # keep-alive: a scraper reuses its connection
    server_version = "pgprobe"

    def __init__(self, conn: httpd.Connection, head: bytes, app: App) -> None:
        # Not socketserver's __init__: one request, from a head already read.
        self.app = app
        self.connection = self.request = conn.sock
        self.client_address = conn.peer
        self.rfile = io.BytesIO(head)
        self.wfile = SocketWriter(conn.sock)
        self.close_connection = True
        self.handle_one_request()
        headers = getattr(self, "headers", None)  # None: no request line came
        if headers is not None and (
            headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in headers
        ):
            self.close_connection = True  # a body: not read, so the connection ends here

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        users = self.app.web.users if self.app.web else None
        if users is not None and not users.allowed(self.headers.get("Authorization")):
            with self.app.lock:  # the pool's threads count together
                self.app.unauthorized += 1
            body = b"unauthorized\n"
            self.reply(401, "text/plain", body, {"WWW-Authenticate": 'Basic realm="pgprobe"'})
            return
        path = urlsplit(self.path).path
        if path == "/metrics":
            self.reply(200, CONTENT_TYPE_LATEST, generate_latest(self.app.registry))
        elif path == PROFILE_PATH:
            data, window_end = self.app.profile()
            if not data:
                self.reply(503, "text/plain", b"no CPU window has ended yet\n")
            else:
                headers = {
                    "X-Pgprobe-Window-End": f"{window_end:.3f}",
                    "Content-Disposition": 'attachment; filename="profile.pb.gz"',
                }
                self.reply(200, "application/octet-stream", data, headers)
        elif path == "/":
            self.reply(200, "text/plain; charset=utf-8", INDEX.encode())
        else:
            self.reply(404, "text/plain", b"not found\n")

    def reply(
        self, code: int, ctype: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        extra = self.app.web.headers if self.app.web else {}
        for key, value in {**extra, **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # a scrape every few seconds is not news; what is, the server counts


class App:
    """What the handlers serve, and what they count."""

    def __init__(
        self,
        registry: CollectorRegistry,
        profile: Callable[[], tuple[bytes, float]],
        web: WebConfig | None,
    ) -> None:
        self.registry, self.profile, self.web = registry, profile, web
        self.unauthorized = 0
        self.lock = threading.Lock()

    def handle(self, conn: httpd.Connection, head: bytes) -> bool:
        return not Handler(conn, head, self).close_connection


class HttpCollector(Collector):
    """The HTTP server's own counters (metrics.py's docstring lists them)."""

    def __init__(self, server: httpd.Server, app: App) -> None:
        self.server, self.app = server, app

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "pgprobe_http_connections_dropped",
            "connections closed before their request was served",
            labels=["reason"],
        )
        for reason in REASONS:
            dropped.add_metric([reason], self.server.dropped[reason])
        yield dropped
        yield CounterMetricFamily("pgprobe_http_accept_pauses",
                                  "times accepting paused: out of file descriptors",
                                  value=self.server.accept_pauses)  # fmt: skip
        yield CounterMetricFamily("pgprobe_http_unauthorized_requests",
                                  "requests refused with 401 (basic auth)",
                                  value=self.app.unauthorized)  # fmt: skip


def make_server(
    host: str,
    port: int,
    registry: CollectorRegistry,
    profile: Callable[[], tuple[bytes, float]],
    web: WebConfig | None = None,
) -> httpd.Server:
    """A bound server (not yet serving): raises OSError when the address is taken."""
    app = App(registry, profile, web)
    server = httpd.Server(
        httpd.listen(host, port), app.handle, say, tls=web.tls if web is not None else None
    )
    registry.register(HttpCollector(server, app))
    return server


def serve_in_background(server: httpd.Server) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return thread
