"""The agent's HTTP endpoints: /metrics (Prometheus text format) and the last CPU profile.

- ``/metrics``: prometheus_client's exposition of metrics.TotalsCollector;
- ``/debug/pprof/profile``: the last window's CPU profile, gzipped profile.proto
  (the path Go's net/http/pprof uses, which Parca and Pyroscope scrape; their
  ``?seconds=N`` is ignored: the profile is always the last finished window,
  see the ``X-Pgprobe-Window-End`` header); 503 until a first window ended;
- ``/``: a short index.

GET only; nothing is written anywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

PROFILE_PATH = "/debug/pprof/profile"
INDEX = (
    "pgprobe serve\n\n"
    "/metrics               Prometheus metrics (LWLock waits, SLRU reads, CPU samples)\n"
    f"{PROFILE_PATH}  the last window's CPU profile (pprof)\n"
)


def make_server(
    host: str,
    port: int,
    registry: CollectorRegistry,
    profile: Callable[[], tuple[bytes, float]],
) -> ThreadingHTTPServer:
    """A bound server (not yet serving): raises OSError when the address is taken."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "pgprobe"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlsplit(self.path).path
            if path == "/metrics":
                self.reply(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == PROFILE_PATH:
                data, window_end = profile()
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
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # a scrape every few seconds is not news

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return thread
