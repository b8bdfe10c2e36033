"""`pgprobe serve`'s HTTP side against hostile clients and backends (issue 30, rows 4, 7, 10).

- row 4: the HTTP server in a process of its own with a file limit of 64: 70 clients
  that send half a request; a scrape still answers within 2 s, the process's CPU stays
  under 20 % of one CPU, the cap is said once, the half-open clients are closed at
  the read deadline (a byte every half second does not extend it); with every file
  descriptor taken, the accept loop backs off (says it once) and serves again after;
  the real `pgprobe serve` against a throwaway cluster under the same attack;
- row 10: --listen [::1]:PORT, [::]:PORT, :PORT (every address, IPv4 and IPv6), the
  real command on [::1]; a bad value is one line, exit 2;
- --web-config: TLS with a certificate made here (openssl), client certificates,
  basic auth (right, wrong, missing), bad files refused in one line;
- row 7: a backend publishing many distinct unknown wait_event_info values (written
  into its PGPROC while it sleeps in pg_sleep, woken by SIGURG so that it sleeps
  again in each): the real agent's series stay bounded, "other" holds the rest.

Long because it holds every case of the three rows, each against a real server.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import CHECKOUT, need, run_pgprobe
from test_serve import scrape, stop_agent, wait_for

from pgprobe.sandbox import PgCluster, free_port

HALF = b"GET /metrics HTTP/1.1\r\nHost: pgprobe\r\n"  # no blank line: never complete
# The server alone, as serve builds it (http.make_server), with `hog`/`free` on stdin to
# take every file descriptor of its process and give them back.
SERVER = """
import resource, sys
soft = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from prometheus_client import CollectorRegistry, Counter
from pgprobe.tools.serve import http
registry = CollectorRegistry()
Counter("pgprobe_test_scrapes", "a series to find", registry=registry).inc()
server = http.make_server(sys.argv[1], 0, registry, lambda: (b"", 0.0))
print(server.server_address[1], flush=True)
http.serve_in_background(server)
held = []
for line in sys.stdin:
    if line.strip() == "hog":
        try:
            while True:
                held.append(open("/dev/null"))
        except OSError:
            pass
    else:
        for f in held:
            f.close()
        held.clear()
    print(len(held), flush=True)
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_ns(pid: int) -> int:
    """Time the process's threads ran or waited for a CPU (schedstat): a thread that
    spins is runnable all along, however busy the machine is with other work."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += sum(int(v) for v in (task / "schedstat").read_text().split()[:2])
    return total


def load(pid: int, seconds: float = 1.0) -> tuple[float, float]:
    """(CPU, running or runnable) of the process over `seconds`, in CPUs."""
    cpu, busy = cpu_seconds(pid), busy_ns(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu) / seconds, (busy_ns(pid) - busy) / 1e9 / seconds


def half_open(host: str, port: int, n: int) -> list[socket.socket]:
    """n clients that send half a request and wait (those the kernel took within 0.5 s)."""
    out = []
    for _ in range(n):
        try:
            sock = socket.create_connection((host, port), timeout=0.5)
            sock.sendall(HALF)
            out.append(sock)
        except OSError:
            pass  # the backlog is full (a server that stopped accepting)
    return out


def timed_scrape(url: str, timeout: float = 5.0, **kwargs: Any) -> tuple[float, str]:
    """(seconds, body) of one GET; (inf, the error) when it failed."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout, **kwargs) as reply:
            return time.monotonic() - start, reply.read().decode()
    except OSError as exc:
        return float("inf"), repr(exc)


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def agent_on(cluster: PgCluster, listen: str, *args: str, nofile: int = 0) -> subprocess.Popen[str]:
    """The real `pgprobe serve` on the cluster, with that file limit (0: as it is)."""
    limit = (
        (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    )
    return subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "serve", *cluster.conn_args, "--listen", listen, *args],
        stderr=subprocess.PIPE, text=True, cwd=CHECKOUT, preexec_fn=limit,
    )  # fmt: skip


@pytest.fixture
def server() -> Iterator[Any]:
    """start(host, soft_limit) -> (port, process): serve's HTTP server in its own process."""
    started: list[subprocess.Popen[str]] = []

    def start(host: str = "127.0.0.1", soft: int = 64) -> tuple[int, subprocess.Popen[str]]:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, host, str(soft)], cwd=CHECKOUT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip().isdigit(), proc.communicate()[1]
        return int(line), proc

    yield start
    for proc in started:
        proc.kill()
        proc.communicate()


def stderr_of(proc: subprocess.Popen[str]) -> str:
    proc.kill()
    err = proc.communicate()[1]
    print(err)
    return err


# -- row 4: half-open clients, a file limit ----------------------------------------------------


def test_half_open_clients_do_not_starve_a_scrape(server: Any) -> None:
    port, proc = server("127.0.0.1", 64)
    clients = half_open("127.0.0.1", port, 70)
    try:
        time.sleep(0.5)
        cpu, busy = load(proc.pid)
        took, body = timed_scrape(f"http://127.0.0.1:{port}/metrics")
        print(f"{len(clients)} half-open clients: scrape {took:.3f} s, server CPU {cpu:.0%} "
              f"(running or runnable {busy:.0%})")  # fmt: skip
        assert took < 2.0 and "pgprobe_test_scrapes_total 1.0" in body, body
        assert cpu < 0.2 and busy < 0.2
        assert 'pgprobe_http_connections_dropped_total{reason="cap"}' in body
        # Every half-open client is closed by the read deadline (5 s after it connected).
        assert all(closed_by_server(c, 7.0) for c in clients)
    finally:
        for c in clients:
            c.close()
    err = stderr_of(proc)
    assert err.count("connections were open") == 1, err  # said once, then counted
    assert err.count("no complete request within 5 s") == 1, err
    assert "Traceback" not in err


def test_a_byte_at_a_time_does_not_keep_a_connection_open(server: Any) -> None:
    port, proc = server("127.0.0.1", 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        start = time.monotonic()
        sock.settimeout(0.5)
        closed_after = None
        for byte in HALF * 10:
            try:
                sock.send(bytes([byte]))
                if sock.recv(1) == b"":
                    closed_after = time.monotonic() - start
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - start
                break
    print(f"closed after {closed_after} s")
    assert closed_after is not None and 4.5 <= closed_after <= 7.0
    stderr_of(proc)


def test_keep_alive_then_closed_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scraper's connection serves several requests, and is closed once idle."""
    import http.client

    from prometheus_client import CollectorRegistry

    from pgprobe.tools.serve import http as serve_http
    from pgprobe.tools.serve import httpd

    monkeypatch.setattr(httpd, "IDLE_TIMEOUT_S", 1.0)
    server = serve_http.make_server("127.0.0.1", 0, CollectorRegistry(), lambda: (b"", 0.0))
    serve_http.serve_in_background(server)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        for _ in range(3):
            conn.request("GET", "/metrics")
            assert conn.getresponse().read()
        assert conn.sock is not None and closed_by_server(conn.sock, 3.0)
        conn.close()
    finally:
        server.shutdown()
        server.server_close()


def test_out_of_file_descriptors_backs_off_says_it_once_and_serves_again(server: Any) -> None:
    port, proc = server("127.0.0.1", 64)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("hog\n")
    proc.stdin.flush()
    assert int(proc.stdout.readline()) > 0  # every descriptor of the process taken
    replies: list[float] = []

    def scrape_once() -> None:
        replies.append(timed_scrape(f"http://127.0.0.1:{port}/metrics", timeout=30)[0])

    waiting = [threading.Thread(target=scrape_once) for _ in range(5)]
    for t in waiting:
        t.start()
    time.sleep(1.0)  # the server cannot accept them: they wait in the kernel's queue
    cpu, busy = load(proc.pid, 2.0)
    proc.stdin.write("free\n")
    proc.stdin.flush()
    proc.stdout.readline()
    for t in waiting:
        t.join(30)
    print(f"out of descriptors: CPU {cpu:.0%} (running or runnable {busy:.0%}); the waiting "
          f"scrapes answered in {replies}")  # fmt: skip
    assert cpu < 0.2 and busy < 0.2
    assert len(replies) == 5 and max(replies) < 6.0, replies
    err = stderr_of(proc)
    assert err.count("out of file descriptors") == 1, err


@pytest.mark.integration
def test_real_serve_under_half_open_clients_and_a_file_limit(
    cluster: PgCluster, tracing: None
) -> None:
    port = free_port()
    agent = agent_on(cluster, f"127.0.0.1:{port}", "--window", "1", nofile=64)
    up = [f'pgprobe_capture_up{{source="{s}"}}' for s in ("waits", "cpu", "slru")]
    try:
        wait_for("every capture up", lambda: all(scrape(port).get(k) == 1 for k in up), 60)
        clients = half_open("127.0.0.1", port, 70)
        time.sleep(0.5)
        cpu, busy = load(agent.pid, 2.0)
        took, body = timed_scrape(f"http://127.0.0.1:{port}/metrics")
        print(f"real serve, {len(clients)} half-open clients: scrape {took:.3f} s, CPU {cpu:.0%} "
              f"(running or runnable {busy:.0%})")  # fmt: skip
        assert took < 2.0 and 'pgprobe_capture_up{source="waits"} 1.0' in body, body
        assert cpu < 0.2 and busy < 0.2
        for c in clients:
            c.close()
    finally:
        err = stop_agent(agent)
    assert err.count("connections were open") == 1, err


# -- row 10: IPv6, every address -----------------------------------------------------------------


@pytest.mark.parametrize("host", ["::1", "::", ""])
def test_ipv6_and_every_address(server: Any, host: str) -> None:
    port, proc = server(host, 1024)
    reach = ["::1"] if host == "::1" else ["::1", "127.0.0.1"]  # dual stack: both
    for ip in reach:
        shown = f"[{ip}]" if ":" in ip else ip
        took, body = timed_scrape(f"http://{shown}:{port}/metrics")
        assert "pgprobe_test_scrapes_total" in body, (ip, body)
    stderr_of(proc)


@pytest.mark.parametrize("listen", ["::1:9433", "[nohost]:9433", "[1.2.3.4]:9433"])
def test_bad_ipv6_listen_is_one_line(listen: str) -> None:
    done = run_pgprobe(["serve", "--listen", listen])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "not ADDR:PORT" in done.stderr


@pytest.mark.integration
def test_real_serve_listens_on_ipv6_loopback(cluster: PgCluster, tracing: None) -> None:
    port = free_port()
    agent = agent_on(cluster, f"[::1]:{port}", "--window", "1")
    try:
        found = wait_for("/metrics on [::1]", lambda: timed_scrape(
            f"http://[::1]:{port}/metrics")[1].count("pgprobe_server_up 1.0"), 60)  # fmt: skip
        assert found
    finally:
        err = stop_agent(agent)
    assert f"serving http://[::1]:{port}/metrics" in err


# -- --web-config: TLS, client certificates, basic auth --------------------------------------


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1, ::1 and localhost, a client certificate."""
    need(subprocess.run(["which", "openssl"], capture_output=True).returncode == 0,
         "the openssl command is not installed")  # fmt: skip
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", d / "ca.key", "-out", d / "ca.pem", "-days", "1",
            "-subj", "/CN=pgprobe test CA")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n")
    for name in ("server", "client"):
        openssl("req", *ec, "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr",
                "-subj", f"/CN=pgprobe test {name}")  # fmt: skip
        openssl("x509", "-req", "-in", d / f"{name}.csr", "-CA", d / "ca.pem", "-CAkey",
                d / "ca.key", "-CAcreateserial", "-out", d / f"{name}.pem", "-days", "1",
                "-extfile", d / "san.ext")  # fmt: skip
        (d / f"{name}.key").chmod(0o600)
    return d


def web_config(pki: Path, text: str) -> str:
    path = pki / f"web-{abs(hash(text))}.yml"
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def bcrypt_hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(6)).decode()


@pytest.fixture
def web_server(pki: Path) -> Iterator[Any]:
    """start(config text) -> port: serve's HTTP server with that --web-config, in this process."""
    from prometheus_client import CollectorRegistry, Counter

    from pgprobe.tools.serve import http, webconfig

    servers: list[Any] = []

    def start(text: str) -> int:
        registry = CollectorRegistry()
        Counter("pgprobe_test_scrapes", "a series to find", registry=registry).inc()
        web = webconfig.load(web_config(pki, text))
        server = http.make_server("127.0.0.1", 0, registry, lambda: (b"", 0.0), web)
        http.serve_in_background(server)
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(url: str, auth: str | None = None, **kwargs: Any) -> tuple[int, dict[str, str], str]:
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10,
                                    **kwargs) as reply:  # fmt: skip
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_tls_and_basic_auth(pki: Path, web_server: Any) -> None:
    port = web_server(
        f"tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
        f"basic_auth_users:\n  alice: {bcrypt_hash('s3cret')}\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    trust = ssl.create_default_context(cafile=pki / "ca.pem")
    url = f"https://127.0.0.1:{port}/metrics"
    for auth in (None, "alice:wrong", "mallory:s3cret", "alice:"):
        code, headers, _ = get(url, auth, context=trust)
        assert code == 401 and headers["WWW-Authenticate"].startswith("Basic"), (auth, code)
    code, headers, body = get(url, "alice:s3cret", context=trust)
    assert code == 200 and "pgprobe_test_scrapes_total 1.0" in body
    assert headers["X-Frame-Options"] == "deny"
    assert "pgprobe_http_unauthorized_requests_total 4.0" in body
    # Plain HTTP on the TLS port: refused at once, not left hanging.
    took, error = timed_scrape(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert took == float("inf") and "Timeout" not in error, error
    _, _, body = get(url, "alice:s3cret", context=trust)
    assert 'pgprobe_http_connections_dropped_total{reason="tls"} 1.0' in body


def test_client_certificates(pki: Path, web_server: Any) -> None:
    port = web_server(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
        "  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n"
    )
    url = f"https://127.0.0.1:{port}/metrics"
    anonymous = ssl.create_default_context(cafile=pki / "ca.pem")
    took, error = timed_scrape(url, context=anonymous)
    assert took == float("inf") and "Timeout" not in error, error
    known = ssl.create_default_context(cafile=pki / "ca.pem")
    known.load_cert_chain(pki / "client.pem", pki / "client.key")
    code, _, body = get(url, context=known)
    assert code == 200 and "pgprobe_test_scrapes_total" in body


BAD_CONFIGS = {
    "missing": (None, "cannot read it"),
    "no key": ("tls_server_config:\n  cert_file: server.pem\n", "needs cert_file and key_file"),
    "open key": ("tls_server_config:\n  cert_file: server.pem\n  key_file: open.key\n",
                 "group or world access"),
    "unknown key": ("basic_auth_user:\n  alice: x\n", "unknown key 'basic_auth_user'"),
    "rate limit": ("rate_limit:\n  interval: 1s\n  burst: 2\n", "not supported"),
    "plain password": ("basic_auth_users:\n  alice: s3cret\n", "not a bcrypt hash"),
    "twice": ("basic_auth_users:\n  a: $2y$10$x\n  a: $2y$10$y\n", "duplicate key 'a'"),
    "not yaml": ("basic_auth_users: [\n", "line 2"),
    "ca alone": ("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
                 "  client_ca_file: ca.pem\n", "go together"),
    "writable": ("basic_auth_users: {}\n", "writable by others"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_bad_web_config_is_one_line(pki: Path, case: str) -> None:
    text, expected = BAD_CONFIGS[case]
    path = web_config(pki, text) if text is not None else str(pki / "absent.yml")
    (pki / "open.key").write_bytes((pki / "server.key").read_bytes())
    (pki / "open.key").chmod(0o644)
    if case == "writable":
        os.chmod(path, 0o666)
    done = run_pgprobe(["serve", "--web-config", path])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert expected in done.stderr and "--web-config" in done.stderr, done.stderr


# -- row 7: unknown wait event codes -----------------------------------------------------------


def test_unknown_wait_events_fold_into_a_bounded_set_of_series() -> None:
    """Windows of waits.bt's maps named by the time model's code (waits records), added
    as the agent adds them, exposed by serve's collector."""
    from prometheus_client import CollectorRegistry, generate_latest

    from pgprobe.engines.base import Snapshot
    from pgprobe.tools import lwlocks
    from pgprobe.tools.serve import metrics, records
    from pgprobe.tools.waits import records as waits_records

    said: list[str] = []
    totals = records.Totals()
    totals.names.say = said.append
    timeout = [(9 << 24) | (0x8000 + i) for i in range(200)]  # PostgreSQL 15: class Timeout
    classes = [(c << 24) | 5 for c in range(0xE0, 0xF0)]  # no such class
    tranches = [(1 << 24) | (0x9000 + i) for i in range(50)]
    weis = [*timeout, *classes, *tranches, (9 << 24) | 0]  # and BaseBackupThrottle, known
    window = {"window_ns": {(): 0}, "now_ns": {(): 10**9},
              "wait_ns": {(7, wei): 1000 for wei in weis}}  # fmt: skip
    snapshot = Snapshot(maps=window)
    for _ in range(2):  # two windows of the same codes: no new series
        procs = waits_records.records(snapshot, [], lambda pid: True)
        records.add_time_model(totals, waits_records.rows(
            procs, 15, True, lambda pid: ("client backend", "")))  # fmt: skip
        records.add_lwlock_records(totals, lwlocks.sleep_records(snapshot, 15, clipped=True))
    registry = CollectorRegistry()
    registry.register(metrics.TotalsCollector(lambda: (totals, {})))
    text = generate_latest(registry).decode()
    waits = dict(re.findall(r"pgprobe_wait_seconds_total\{(.*?)\} (\S+)", text))
    label = re.compile(r'wait_event="(.*?)",wait_event_type="(.*?)"')
    events = [found.groups() for k in waits if (found := label.search(k))]
    print(sorted(events))
    assert sum(1 for e, t in events if t == "Timeout" and e.startswith("event#")) == 8
    assert ("other", "Timeout") in events and ("other", "other") in events
    assert ("BaseBackupThrottle", "Timeout") in events
    assert len(events) == 8 + 1 + 1 + 8 + 1 + 1  # Timeout, other, LWLock (tranches), known
    assert abs(sum(map(float, waits.values())) - 2 * len(weis) * 1000 / 1e9) < 1e-12
    tranche_labels = set(re.findall(r'pgprobe_lwlock_waits_total\{mode="unknown",tranche="(.*?)"',
                                    text))  # fmt: skip
    assert len(tranche_labels) == 9 and "other" in tranche_labels
    folded = (200 - 8) + len(classes) + (50 - 8)
    assert f"pgprobe_wait_events_folded_total {folded}.0" in text
    assert len(totals.wait_ns) == len(events) and len(totals.lwlock_hist) == 9  # memory too
    assert len(said) == 1 and "folded" in said[0], said


@pytest.mark.integration
def test_a_backend_publishing_random_wait_events_gives_bounded_series(
    cluster: PgCluster, tracing: None
) -> None:
    from pgprobe.waitevents import address

    port = free_port()
    agent = agent_on(cluster, f"127.0.0.1:{port}", "--window", "1", "--waits-duty", "1")
    conn = cluster.connect()
    pid = conn.info.backend_pid

    def sleep() -> None:
        with contextlib.suppress(psycopg.errors.QueryCanceled):  # at the test's end
            conn.execute("SELECT pg_sleep(60)")

    sleeper = threading.Thread(target=sleep)
    windows = 'pgprobe_capture_windows_total{source="waits"}'
    try:
        wait_for("the time model", lambda: scrape(port).get(windows, 0) >= 1, 60)
        sleeper.start()
        asleep = f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event = 'PgSleep'"
        wait_for("the backend in pg_sleep", lambda: cluster.sql(asleep), 10)
        binary = str(Path(f"/proc/{cluster.postmaster_pid}/exe").resolve())
        where = address.find(cluster.postmaster_pid, binary)
        pointer, original = address.read_current(pid, where)
        codes = [(9 << 24) | (0x8000 + i) for i in range(30)]  # Timeout: no such event
        codes += [(c << 24) | 5 for c in range(0xE0, 0xE4)]  # no such class
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            for code in codes:  # each: a sleep of ~50 ms in that event
                mem.seek(pointer)
                mem.write(code.to_bytes(4, "little"))
                os.kill(pid, signal.SIGURG)  # the latch's wake-up: it sleeps again at once
                time.sleep(0.05)
            mem.seek(pointer)
            mem.write(original.to_bytes(4, "little"))
            os.kill(pid, signal.SIGURG)
        folded = "pgprobe_wait_events_folded_total"
        wait_for("the folded codes", lambda: scrape(port).get(folded, 0) >= len(codes) - 8, 30)
        series = [k for k in scrape(port) if k.startswith("pgprobe_wait_seconds_total{")
                  and 'backend_type="client backend"' in k]  # fmt: skip
        print("\n".join(sorted(series)))
        unknown = [k for k in series if re.search(r'wait_event="(event|class)#', k)]
        assert len(unknown) <= 8, unknown
        assert any('wait_event="other",wait_event_type="Timeout"' in k for k in series)
        assert any('wait_event="other",wait_event_type="other"' in k for k in series)
    finally:
        conn.cancel()
        sleeper.join(30)
        conn.close()
        err = stop_agent(agent)
    assert err.count("wait events pgprobe has no name for") == 1, err
