"""A bounded HTTP/1.1 server: what serve's endpoints run on (issue 30, row 4).

http.server's ThreadingHTTPServer gave every connection a thread with no timeout and
no cap, and its accept loop spun at a full CPU when accept() failed for want of file
descriptors: 70 clients sending half a request under a file limit of 64 starved the
scrapes. Here one thread (serve_forever) owns the listening socket and every
connection waiting for a request, in a selector; a connection whose request head
(request line and headers) is complete goes to a fixed pool of POOL handler threads,
and back to the selector after the reply when the client keeps it alive. So:

- a client that sends half a request costs one file descriptor, no thread; it is
  closed HEAD_TIMEOUT_S after it connected (a deadline, not per read: a byte a second
  does not keep it open), an idle keep-alive connection after IDLE_TIMEOUT_S;
- at most ``cap`` connections are open (half of what the soft file limit leaves past
  the agent's own RESERVED_FDS, MIN_CONNECTIONS to MAX_CONNECTIONS): past it, the
  connection that has waited longest for its request is closed (slow clients go
  first; a scraper sends its request at once and is served); when every one is busy
  with a request, the new one is closed at once;
- accept() failing for want of file descriptors (EMFILE, ENFILE) closes the
  connection that has waited longest, or when none waits, stops accepting for a
  moment (BACKOFF_S, doubling): new connections wait in the kernel's backlog;
- a handler writes with a timeout (WRITE_TIMEOUT_S): a client that does not read
  holds no thread for good.
TLS handshakes run in the selector thread, non-blocking, under the head's deadline.
Every connection closed early is counted (``dropped``, by reason) and the first of
each reason said in one line.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import re
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

POOL = 4
MAX_CONNECTIONS = 64
MIN_CONNECTIONS = 8  # a scraper, its retries and a few slow clients, whatever the limit
# The agent's own descriptors, kept from its HTTP clients: the captures run in its process
# (the compiled objects' maps, programs, links and perf events: 45-49 measured with the time
# model, CPU samples and SLRU reads up; a file limit of 64 leaves MIN_CONNECTIONS).
RESERVED_FDS = 48
HEAD_TIMEOUT_S = 5.0
# Prometheus keeps its connection between scrapes (every 15 s by default)
IDLE_TIMEOUT_S = 60.0
WRITE_TIMEOUT_S = 10.0
MAX_HEAD = 16 * 1024
BACKLOG = 128
BACKOFF_S = (0.05, 1.0)
ACCEPTS_PER_WAKE = 16
OUT_OF_FDS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# accept() errors of one client that gave up or was refused: the next one may do
CLIENT_GONE = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN, errno.EHOSTUNREACH}
HEAD_END = re.compile(rb"\r?\n\r?\n")
# the listener and the selector's wake-up pair in the selector's data
LISTENER, WAKE = "listener", "wake"


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    peer: Any
    deadline: float
    waiting_since: float
    handshaking: bool = False
    busy: bool = False
    requests: int = 0
    buf: bytearray = field(default_factory=bytearray)


# Serves one request head on a connection (blocking, in a pool thread); True: keep it open.
Handle = Callable[[Connection, bytes], bool]


def connection_cap() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, (soft - RESERVED_FDS) // 2))


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, as Prometheus exporters read ADDR:PORT: "" and "::" are every
    address, IPv4 and IPv6 (dual stack; IPv4 only on a host without IPv6)."""
    if host in ("", "::") and socket.has_dualstack_ipv6():
        return socket.create_server(
            ("::", port), family=socket.AF_INET6, backlog=BACKLOG, dualstack_ipv6=True
        )
    if host == "":
        host = "0.0.0.0"
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise OSError(exc.errno, exc.strerror) from None
    return socket.create_server(address, family=family, backlog=BACKLOG)


class Server:
    def __init__(
        self,
        sock: socket.socket,
        handle: Handle,
        say: Callable[[str], None],
        tls: ssl.SSLContext | None = None,
        cap: int | None = None,
    ) -> None:
        self.listener, self.handle, self.say, self.tls = sock, handle, say, tls
        self.cap = cap or connection_cap()
        self.server_address = sock.getsockname()
        self.dropped: Counter[str] = Counter()  # connections closed early, by reason
        self.accept_pauses = 0
        self._conns: dict[socket.socket, Connection] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._returned: queue.SimpleQueue[tuple[Connection, bool]] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[tuple[Connection, bytes] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._paused_until = 0.0
        self._backoff = BACKOFF_S[0]
        self._said: set[str] = set()
        self._started = False
        sock.setblocking(False)
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(sock, selectors.EVENT_READ, LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, WAKE)
        self._pool = [
            threading.Thread(target=self._work, name=f"http-{i}", daemon=True) for i in range(POOL)
        ]

    # -- the selector thread

    def serve_forever(self) -> None:
        self._started = True
        for t in self._pool:
            t.start()
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(self._timeout()):
                    try:
                        self._event(key.data)
                    except Exception as exc:  # a bug: said, and the loop serves on
                        self._say_once("bug", f"internal error in the HTTP loop: {exc!r}")
                self._expire()
        finally:
            self._done.set()

    def _event(self, data: Any) -> None:
        if data is LISTENER:
            self._accept()
        elif data is WAKE:
            self._take_back()
        elif isinstance(data, Connection) and self._conns.get(data.sock) is data:
            self._readable(data)  # (not closed by an earlier event of the same batch)

    def _timeout(self) -> float:
        waiting = [c.deadline for c in self._conns.values() if not c.busy]
        if self._paused_until:
            waiting.append(self._paused_until)
        return max(0.0, min(waiting, default=time.monotonic() + 1.0) - time.monotonic())

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, peer = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in CLIENT_GONE:
                    continue
                if exc.errno in OUT_OF_FDS and self._evict("fd_limit"):
                    continue
                self._pause(exc)
                return
            self._backoff = BACKOFF_S[0]
            if len(self._conns) >= self.cap and not self._evict("cap"):
                self._drop_new(sock)
                continue
            self._add(sock, peer)

    def _add(self, sock: socket.socket, peer: Any) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = time.monotonic()
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                self.dropped["tls"] += 1
                self._say_once("tls", f"a TLS connection failed at once ({exc})")
                return
        conn = Connection(sock, peer, now + HEAD_TIMEOUT_S, now, handshaking=self.tls is not None)
        self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _readable(self, conn: Connection) -> None:
        if conn.handshaking and not self._handshake(conn):
            return
        try:
            while True:
                chunk = conn.sock.recv(MAX_HEAD)
                if not chunk:
                    self._close(conn)  # the client went away
                    return
                if not conn.buf and not conn.busy:  # a keep-alive client's next request
                    conn.deadline = min(conn.deadline, time.monotonic() + HEAD_TIMEOUT_S)
                conn.buf += chunk
                if not isinstance(conn.sock, ssl.SSLSocket) or not conn.sock.pending():
                    break
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except OSError:
            self._close(conn)
            return
        self._dispatch(conn)

    def _handshake(self, conn: Connection) -> bool:
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return False
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return False
        except (ssl.SSLError, OSError) as exc:
            why = getattr(exc, "reason", None) or exc.strerror or type(exc).__name__
            self._drop(conn, "tls", f"a TLS handshake failed ({why})")
            return False
        conn.handshaking = False
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        return True

    def _dispatch(self, conn: Connection) -> None:
        found = HEAD_END.search(conn.buf)
        if found is None:
            if len(conn.buf) > MAX_HEAD:
                self._drop(conn, "too_large", f"a request head passed {MAX_HEAD // 1024} KiB")
            return
        head = bytes(conn.buf[: found.end()])
        del conn.buf[: found.end()]
        conn.busy = True
        conn.requests += 1
        self._sel.unregister(conn.sock)
        self._jobs.put((conn, head))

    def _take_back(self) -> None:
        """Connections the pool is done with: closed, or waiting for their next request."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        while not self._returned.empty():
            conn, keep = self._returned.get()
            if not keep or self._stop.is_set():
                self._close(conn)
                continue
            conn.busy = False
            conn.deadline = time.monotonic() + (HEAD_TIMEOUT_S if conn.buf else IDLE_TIMEOUT_S)
            conn.waiting_since = time.monotonic()
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            self._dispatch(conn)  # a pipelined request may be there already

    def _expire(self) -> None:
        now = time.monotonic()
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self._sel.register(self.listener, selectors.EVENT_READ, LISTENER)
        for conn in [c for c in self._conns.values() if not c.busy and c.deadline <= now]:
            if conn.requests and not conn.buf:
                self._close(conn)  # an idle keep-alive connection: as HTTP does
            else:
                why = f"a client sent no complete request within {HEAD_TIMEOUT_S:.0f} s"
                self._drop(conn, "read_timeout", why)

    def _evict(self, reason: str) -> bool:
        """Close the connection that has waited longest for its request, if any."""
        waiting = [c for c in self._conns.values() if not c.busy]
        if not waiting:
            return False
        if reason == "cap":
            why = (f"{self.cap} connections were open (the cap: half the file limit left past "
                   f"the agent's own {RESERVED_FDS}, {MIN_CONNECTIONS} to {MAX_CONNECTIONS}): "
                   "closed the one that waited longest for its request")  # fmt: skip
        else:
            why = self._out_of_fds() + ": closed the connection that waited longest for its request"
        self._drop(min(waiting, key=lambda c: c.waiting_since), reason, why)
        return True

    def _drop_new(self, sock: socket.socket) -> None:
        sock.close()
        self.dropped["cap"] += 1
        self._say_once("cap_busy", f"{self.cap} connections were open, each busy with a "
                       "request (the cap): closed a new one at once")  # fmt: skip

    def _pause(self, exc: OSError) -> None:
        """Stop accepting for a moment: retrying at once would spin (the listener stays
        readable while the kernel holds connections we cannot take)."""
        self._sel.unregister(self.listener)
        self._paused_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_S[1])
        self.accept_pauses += 1
        why = f"accept() failed ({exc.strerror or exc})"
        if exc.errno in OUT_OF_FDS:
            why = f"{self._out_of_fds()} and no connection waits"
        self._say_once("pause", f"{why}: accepting paused for up to {BACKOFF_S[1]:.0f} s at a "
                       "time (new clients wait in the kernel's queue); "
                       "pgprobe_http_accept_pauses_total counts it")  # fmt: skip

    def _out_of_fds(self) -> str:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return f"out of file descriptors (soft limit {soft})"

    def _drop(self, conn: Connection, reason: str, why: str) -> None:
        self._close(conn)
        self.dropped[reason] += 1
        self._say_once(reason, f"{why}; further ones are counted in "
                       f'pgprobe_http_connections_dropped_total{{reason="{reason}"}}')  # fmt: skip

    def _close(self, conn: Connection) -> None:
        if self._conns.pop(conn.sock, None) is not None and not conn.busy:
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(f"http: {message}")

    # -- the pool

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, head = job
            keep = False
            try:
                conn.sock.settimeout(WRITE_TIMEOUT_S)
                keep = self.handle(conn, head)
                conn.sock.setblocking(False)
            except OSError:
                pass  # the client went away or stopped reading: closed below
            except Exception as exc:  # a bug: said, and the thread serves on
                self._say_once("bug", f"internal error answering a request: {exc!r}")
            self._returned.put((conn, keep))
            # BlockingIOError: a wake-up is pending already; OSError: the server is closed
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

    # -- the owner's side

    def shutdown(self) -> None:
        """Stop serving_forever (from another thread) and wait for it."""
        self._stop.set()
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"\0")
        if self._started:
            self._done.wait()
        for _ in self._pool:
            self._jobs.put(None)

    def server_close(self) -> None:
        for conn in list(self._conns.values()):
            conn.sock.close()
        self._conns.clear()
        self._sel.close()
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()
