"""A load of short sessions, and each backend's true lifetime from the server's own log.

Most applications without a pooler open and close connections all the time. ChurnLoad runs,
until stopped, on a cluster started with CHURN_SETTINGS:

- a holder: per connection, a transaction that locks row 1 and holds it 1.5 s;
- a waiter: per connection, an UPDATE of row 1 (blocked behind the holder);
- a sleeper: per connection, pg_sleep(0.05) twenty times;
- churners: a new connection every 50-200 ms, living 0.05-2 s (pg_sleep or SELECT 1);
- pgbench -c 4 -R 400 (its connections live throughout).

lifetimes(log) reads the truth: log_connections' "connection received" and
log_disconnections' "disconnection" lines, with their pids and millisecond timestamps. A
backend's log lines come right after its fork and right before its exit.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgprobe.sandbox import PgCluster

CHURN_SETTINGS = {
    "log_connections": "on",
    "log_disconnections": "on",
    "log_line_prefix": "'%m [%p] '",
    "log_timezone": "'UTC'",
    "autovacuum": "off",  # its workers come and go unlogged: not part of this load
    "max_parallel_workers_per_gather": "0",
    "max_connections": "100",
}
# No sleep of this load is longer: the holder's pg_sleep(1.5), a waiter queued behind it.
LONGEST_SLEEP_S = 2.0
_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC \[(\d+)\] LOG:  "
    r"(connection received|disconnection)"
)


class ChurnLoad:
    def __init__(self, pg: PgCluster, seed: int = 31) -> None:
        self.pg = pg
        self.random = random.Random(seed)
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.pgbench: subprocess.Popen[str] | None = None
        self.errors: list[str] = []

    def __enter__(self) -> ChurnLoad:
        self.pg.sql("CREATE TABLE IF NOT EXISTS churn (id int PRIMARY KEY, v int)")
        self.pg.sql("INSERT INTO churn VALUES (1, 0) ON CONFLICT DO NOTHING")
        init = self.pg.pgbench("-i", "-s", "1", "-q")
        init.communicate(timeout=120)
        self.pgbench = self.pg.pgbench("-c", "4", "-j", "2", "-R", "400", "-T", "600")
        for loop in (self._holder, self._waiter, self._sleeper, self._churner, self._churner):
            self._spawn(loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=30)
        if self.pgbench is not None:
            self.pgbench.terminate()
            self.pgbench.communicate(timeout=60)

    def _spawn(self, loop: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                loop()
            except Exception as exc:  # noqa: BLE001 - said by the test, not lost
                self.errors.append(f"{loop.__name__}: {exc}")

        t = threading.Thread(target=guarded, daemon=True)
        t.start()
        self.threads.append(t)

    def _session(self, body: Callable[[Any], None], name: str) -> None:
        with psycopg.connect(self.pg.conninfo, autocommit=True, application_name=name) as conn:
            body(conn)

    def _holder(self) -> None:
        def hold(conn: Any) -> None:
            with conn.transaction():
                conn.execute("SELECT v FROM churn WHERE id = 1 FOR UPDATE")
                conn.execute("SELECT pg_sleep(1.5)")

        while not self.stop_event.is_set():
            self._session(hold, "churn_holder")

    def _waiter(self) -> None:
        while not self.stop_event.is_set():
            self._session(lambda c: c.execute("UPDATE churn SET v = v + 1 WHERE id = 1"),
                          "churn_waiter")  # fmt: skip
            time.sleep(0.02)

    def _sleeper(self) -> None:
        def naps(conn: Any) -> None:
            for _ in range(20):
                conn.execute("SELECT pg_sleep(0.05)")

        while not self.stop_event.is_set():
            self._session(naps, "churn_sleeper")

    def _churner(self) -> None:
        while not self.stop_event.wait(self.random.uniform(0.05, 0.2)):
            life = self.random.uniform(0.05, 2.0)
            busy = self.random.random() < 0.5
            self._spawn(lambda life=life, busy=busy: self._short(life, busy))  # type: ignore[misc]
            self.threads = [t for t in self.threads if t.is_alive()]

    def _short(self, life: float, busy: bool) -> None:
        def live(conn: Any) -> None:
            end = time.monotonic() + life
            while (left := end - time.monotonic()) > 0:
                conn.execute("SELECT 1" if busy else f"SELECT pg_sleep({min(left, 0.3):.3f})")

        self._session(live, "churn_short")


class KernelLifetimes:
    """Each child of the postmaster's fork and exit, as the kernel's tracepoints say, from a
    bpftrace one-liner of its own (not pgprobe's code): sched_process_fork of the
    postmaster's children, sched_process_exit of their main threads; times in Unix seconds.
    """

    def __init__(self, postmaster: int) -> None:
        self.program = (
            f"tracepoint:sched:sched_process_fork /args->parent_pid == {postmaster}/ "
            '{ printf("F %d %lld\\n", args->child_pid, nsecs); } '
            f"tracepoint:sched:sched_process_exit /pid == tid && "
            f"curtask->real_parent->tgid == {postmaster}/ "
            '{ printf("X %d %lld\\n", pid, nsecs); }'
        )
        self.child: subprocess.Popen[str] | None = None
        self.forks: dict[int, float] = {}
        self.exits: dict[int, float] = {}

    def __enter__(self) -> KernelLifetimes:
        self.child = subprocess.Popen(["bpftrace", "-e", self.program], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        assert self.child.stdout is not None
        first = self.child.stdout.readline()  # "Attaching 2 probes...": attached
        assert first.startswith("Attaching"), first
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.child is not None
        offset = (time.time_ns() - time.monotonic_ns()) / 1e9  # nsecs: the monotonic clock
        self.child.send_signal(signal.SIGINT)
        out, _ = self.child.communicate(timeout=60)
        for line in out.splitlines():
            kind, pid, ns = (line.split() + ["", "", ""])[:3]
            if kind in ("F", "X") and pid.isdigit() and ns.isdigit():
                into = self.forks if kind == "F" else self.exits
                into[int(pid)] = int(ns) / 1e9 + offset

    def edges(self, pid: int, start: float, end: float) -> str:
        """Where pid's fork and exit fall against [start, end], in ms (for messages)."""
        fork, exit_ = self.forks.get(pid), self.exits.get(pid)
        born = f"born {1e3 * (fork - start):+.1f} ms" if fork is not None else "born before"
        gone = f"exit {1e3 * (exit_ - end):+.1f} ms" if exit_ is not None else "alive"
        return f"{born} from the start, {gone} from the end"

    def changed(self, pid: int, start: float, end: float) -> bool:
        """Whether pid was born or ended within [start, end]."""
        return any(
            start <= t <= end for t in (self.forks.get(pid, -1.0), self.exits.get(pid, -1.0))
        )

    def inside(self, pid: int, start: float, end: float) -> float:
        """Seconds of pid's life inside [start, end] (born before, or alive after: the edge)."""
        return max(
            0.0,
            min(self.exits.get(pid, math.inf), end) - max(self.forks.get(pid, -math.inf), start),
        )


def lifetimes(log: str) -> dict[int, list[tuple[float, float]]]:
    """pid -> its backends' (start, end) in Unix seconds from the server log, oldest first;
    end is +inf for one still running (a pid number may be used again)."""
    out: dict[int, list[tuple[float, float]]] = {}
    for line in log.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        when = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f")
        at = when.replace(tzinfo=dt.timezone.utc).timestamp()
        pid = int(match.group(2))
        lives = out.setdefault(pid, [])
        if match.group(3) == "connection received":
            lives.append((at, math.inf))
        elif lives and lives[-1][1] == math.inf:
            lives[-1] = (lives[-1][0], at)
    return out


def inside(lives: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of these lifetimes inside [start, end]."""
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in lives)
