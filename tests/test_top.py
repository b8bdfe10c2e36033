"""`pgprobe top` in a real terminal (tmux: send-keys, capture-pane) against a loaded
throwaway cluster, and its --batch JSON lines, every figure against a truth of its own:
a pg_sleep session is ~1 s per second of Timeout:PgSleep; a CPU burner's CPU in a window
is its /proc/PID/schedstat growth over the same seconds (sampled every few ms by the
test, on the client's clock); three --batch windows follow each other without a gap and
add up to the span the client saw them in; a migration queue (a reader idle in its
transaction, an ALTER TABLE behind it, a SELECT behind the ALTER) is a blocking tree on the
screen and in the JSON, placed as the test's own pg_blocking_pids() says, each waiter's
seconds its own account (test_locks' timed()); on a PL/pgSQL loop's details page, `c`
samples its CPU functions: its samples are its schedstat CPU times the rate. Run once (not
per build): the screen does not depend on the server's version, and the time model's
numbers are checked per build by tests/test_waits*.py and tests/test_locks.py. Kept in
one, long because one terminal scene holds it together: the tmux pane, the loaded cluster
and its sessions serve every test."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import CHECKOUT, need, run_pgprobe, until
from test_locks import TIMED

from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import compiled

SESSION = "pgprobe-top-test"


@pytest.fixture
def ready(tracing: None) -> None:
    need(shutil.which("tmux") is not None, "tmux is not installed")
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o is not built")


class Load:
    """Sessions that keep busy until closed: each its own connection and pid."""

    def __init__(self, pg: PgCluster) -> None:
        self.pg = pg
        self.pids: dict[str, int] = {}
        self.threads: list[threading.Thread] = []

    def start(self, name: str, sql: str) -> int:
        conn = self.pg.connect(application_name=name)
        self.pids[name] = int(conn.info.backend_pid)

        def run() -> None:
            with conn, conn.cursor() as cur:
                try:
                    cur.execute("SET statement_timeout = '90s'")
                    cur.execute(sql)
                except psycopg.Error:
                    pass  # cancelled at the end

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        return self.pids[name]

    def stop(self) -> None:
        for pid in self.pids.values():
            self.pg.sql(f"SELECT pg_cancel_backend({pid})")
        for thread in self.threads:
            thread.join(timeout=10)


@pytest.fixture
def load(cluster: PgCluster) -> Iterator[Load]:
    sessions = Load(cluster)
    yield sessions
    sessions.stop()


def cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


class CpuClock:
    """A process's CPU time (schedstat) every few ms, on the client's clock."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.points: list[tuple[float, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.003):
            try:
                self.points.append((time.time(), cpu_ns(self.pid)))
            except OSError:
                return  # gone: the test is over

    def at(self, when: float) -> float:
        """CPU ns at `when`, between the two samples around it."""
        for (t0, c0), (t1, c1) in zip(self.points, self.points[1:], strict=False):
            if t0 <= when <= t1:
                return c0 + (c1 - c0) * (when - t0) / (t1 - t0)
        raise AssertionError(f"no samples around {when}")


class Screen:
    """pgprobe top in a tmux pane of its own."""

    def __init__(self, args: list[str], width: int = 80, height: int = 24) -> None:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        cmd = " ".join([sys.executable, "-m", "pgprobe", "top", *args])
        shell = f"cd {CHECKOUT} && {cmd}; echo EXITED $?; sleep 60"
        subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "-x", str(width),
                        "-y", str(height), shell], check=True)  # fmt: skip
        subprocess.run(["tmux", "set-option", "-t", SESSION, "window-size", "manual"],
                       check=True)  # fmt: skip

    def text(self) -> list[str]:
        out = subprocess.run(["tmux", "capture-pane", "-p", "-t", SESSION],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return out.split("\n")

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", SESSION, *keys], check=True)

    def wait(self, ok: Callable[[list[str]], bool], what: str, timeout: float = 30) -> list[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            lines = self.text()
            if ok(lines):
                return lines
            time.sleep(0.1)
        raise AssertionError(f"{what}: not on the screen in {timeout} s:\n" + "\n".join(lines))

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


TITLE = re.compile(r"window (\d+\.\d{3}) s to (\d\d):(\d\d):(\d\d)\.(\d{3})")


def window(lines: list[str]) -> tuple[float, float] | None:
    """The screen's window: (its length, its end on the client's clock)."""
    found = TITLE.search(lines[0])
    if not found:
        return None
    length, h, m, s, ms = found.groups()
    now = time.localtime()
    end = time.mktime((now.tm_year, now.tm_mon, now.tm_mday, int(h), int(m), int(s), 0, 0, -1))
    return float(length), end + int(ms) / 1000


def cell(lines: list[str], header: str, first: str) -> str:
    """The cell under a right-aligned header, in the row that starts with `first`."""
    head = next(line for line in lines[4:] if header in line)  # the table's, not the bar's
    end = head.index(header) + len(header)
    row = next(line for line in lines if line.split()[:1] == [first])
    return row[:end].split()[-1]


def legend(lines: list[str]) -> dict[str, float]:
    text = " ".join(lines[1:5])
    return {name: float(v) for name, v in re.findall(r"(CPU|runq|other) (\d+\.\d\d)", text)}


def test_top_screen_follows_the_load_and_the_keys(cluster: PgCluster, ready: None,
                                                  load: Load) -> None:  # fmt: skip
    sleeper = load.start("top-sleeper", "SELECT pg_sleep(80)")
    screen = Screen([*cluster.conn_args, "--interval", "1", "--view", "waits"])
    try:
        # Only the sleeper: ~1 session of Timeout:PgSleep, next to no CPU.
        lines = screen.wait(lambda t: "Timeout:PgSleep" in "\n".join(t), "the pg_sleep row")
        lines = screen.wait(lambda t: window(t) is not None and window(t)[0] > 0.9  # type: ignore[index]
                            and "Timeout:PgSleep" in "\n".join(t), "a whole window")  # fmt: skip
        length, _ = window(lines)  # type: ignore[misc]
        seconds = float(cell(lines, "SECONDS", "Timeout:PgSleep"))
        assert abs(seconds - length) <= 0.01 * length, (seconds, length, lines)
        assert 0.98 <= float(cell(lines, "AAS", "Timeout:PgSleep")) <= 1.02, lines
        before = legend(lines)
        assert before["CPU"] + before["runq"] < 0.3 and before["other"] >= 0.98, lines

        # A CPU burner: the header's split and the rows follow; its CPU is schedstat's.
        burner = load.start("top-burner", "DO $$BEGIN LOOP END LOOP; END$$")
        clock = CpuClock(burner)
        screen.keys("2")  # backends
        lines = screen.wait(lambda t: any(ln.split()[:1] == [str(burner)] for ln in t)
                            and legend(t).get("CPU", 0) + legend(t).get("runq", 0) > 0.8
                            and "XACT s" in "\n".join(t), "the burner's row")  # fmt: skip

        def sampled(t: list[str]) -> bool:  # a window all within the client's samples
            seen = window(t)
            return seen is not None and seen[1] - seen[0] > clock.points[0][0]

        lines = screen.wait(sampled, "a window of the burner's")
        for _ in range(3):  # three windows in a row, each against schedstat
            seen = window(lines)
            assert seen is not None
            length, end = seen
            time.sleep(max(0.0, end + 0.05 - time.time()))
            truth = (clock.at(end) - clock.at(end - length)) / 1e9
            shown = float(cell(lines, "CPU s", str(burner)))
            assert abs(shown - truth) <= 0.05 * truth, (shown, truth, lines)
            lines = screen.wait(lambda t, e=end: (window(t) or (0, e))[1] > e + 0.5, "next")
        clock.done.set()

        # Sort: CPU first, the burner on top; r reverses.
        screen.keys(">")
        lines = screen.wait(lambda t: "sort: CPU ▼" in "\n".join(t), "sort by CPU")
        first_row = next(i for i, ln in enumerate(lines) if "PID" in ln) + 1
        assert lines[first_row].split()[0] == str(burner), lines
        screen.keys("r")
        screen.wait(lambda t: "sort: CPU ▲" in "\n".join(t), "ascending")
        screen.keys("r")

        # Filter: only the sleeper's row.
        screen.keys("/", *"top-sleeper", "Enter")
        lines = screen.wait(lambda t: "filter: top-sleeper" in "\n".join(t), "the filter")
        pids = {ln.split()[0] for ln in lines[6:] if ln.split()[:1] and ln.split()[0].isdigit()}
        assert pids == {str(sleeper)}, lines

        # Enter: the row's time model and statement; Enter again: back.
        screen.keys("Enter")
        lines = screen.wait(lambda t: f"pid {sleeper}:" in "\n".join(t), "the details")
        assert "SELECT pg_sleep(80)" in "\n".join(lines) and "other" in "\n".join(lines)
        screen.keys("Enter", "/", "Escape")
        screen.wait(lambda t: "filter:" not in "\n".join(t), "the filter dropped")

        # Pause: the window stays; Space again and it moves on.
        screen.keys("Space")
        lines = screen.wait(lambda t: "PAUSED" in t[0], "paused")
        paused = window(lines)
        time.sleep(2.5)
        assert window(screen.text()) == paused
        screen.keys("Space")
        screen.wait(lambda t: window(t) != paused and "PAUSED" not in t[0], "running again")

        # + and -: the refresh interval; the views a key each.
        screen.keys("+")
        screen.wait(lambda t: "refresh 2 s" in t[-1] or "refresh 2 s" in "\n".join(t), "+")
        for key, header in (("1", "QUERY"), ("3", "WAIT EVENT"), ("4", "MODE WANTED")):
            screen.keys(key)
            screen.wait(lambda t, h=header: any(h in ln for ln in t[5:9]), f"view {key}")

        # A larger terminal is used whole; q quits.
        def resized(t: list[str]) -> bool:
            if len(t) >= 32 and "q quit" in t[31]:
                return True
            subprocess.run(["tmux", "resize-window", "-t", SESSION, "-x", "120", "-y", "32"],
                           check=True)  # fmt: skip
            return False

        screen.wait(resized, "the resized screen")
        screen.keys("q")
        screen.wait(lambda t: "EXITED 0" in "\n".join(t), "the exit")
    finally:
        screen.close()


def test_top_batch_json_windows_add_up(cluster: PgCluster, ready: None, load: Load) -> None:
    sleeper = load.start("top-sleeper", "SELECT pg_sleep(60)")
    began = time.time()
    done = run_pgprobe(["top", *cluster.conn_args, "--batch", "3", "--json", "--interval", "1"])
    ended = time.time()
    assert done.returncode == 0, done.stderr
    docs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(docs) == 3, done.stdout[:2000]
    edges = [d["meta"]["window_unix_s"] for d in docs]
    assert began < edges[0][0] and edges[-1][1] < ended, (began, edges, ended)
    for (_, end), (start, _) in zip(edges, edges[1:], strict=False):
        assert abs(start - end) < 0.002, edges  # no gap, no overlap between refreshes
    total = sum(d["meta"]["window_s"] for d in docs)
    assert abs(total - (edges[-1][1] - edges[0][0])) < 0.005, (total, edges)
    for doc in docs:
        meta = doc["meta"]
        assert 0.8 <= meta["window_s"] <= 1.5, meta
        classes = sum(meta["seconds_by_class"].values())
        assert classes <= meta["process_seconds"] + 0.001, meta
        assert classes >= 0.99 * meta["process_seconds"], meta
        row = next(r for r in doc["rows"] if r["view"] == "backends" and r["pid"] == sleeper)
        assert abs(row["wall_us"] / 1e6 - meta["window_s"]) < 0.002, (row, meta)
        assert abs(row["other_us"] / 1e6 - meta["window_s"]) <= 0.01 * meta["window_s"], row
        waits = {r["event"]: r for r in doc["rows"] if r["view"] == "waits"}
        assert abs(waits["Timeout:PgSleep"]["total_us"] / 1e6 - meta["window_s"]) < 0.01, waits
        assert doc["tool"] == "top" and meta["cpus"] >= 1


def test_top_raises_the_usual_file_limit_for_its_schedstat_files(
    cluster: PgCluster, ready: None, load: Load
) -> None:
    """Under the usual soft limit of 1,024 files, top keeps a /proc/PID/schedstat open for
    384 backends only (its reads of the others cost ~40 % more with 1,000 backends): it
    raises the soft limit within the hard one, and keeps one open per backend."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    need(hard == resource.RLIM_INFINITY or hard > 1024, f"a hard file limit of {hard}")
    wanted = 16384 if hard == resource.RLIM_INFINITY else min(hard, 16384)
    sleeper = load.start("top-files", "SELECT pg_sleep(60)")
    child = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "top", *cluster.conn_args, "--batch", "4",
         "--json", "--interval", "1"], cwd=CHECKOUT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard)),
    )  # fmt: skip
    seen: tuple[int, set[int]] = (0, set())
    try:
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                limits = Path(f"/proc/{child.pid}/limits").read_text()
                found = re.search(r"Max open files\s+(\d+)", limits)
                assert found is not None, limits
                soft = int(found.group(1))
                fds = Path(f"/proc/{child.pid}/fd")
                opened = {int(m.group(1)) for fd in fds.iterdir()
                          if (m := re.fullmatch(r"/proc/(\d+)/schedstat",
                                                os.readlink(fd)))}  # fmt: skip
                if opened:
                    seen = (soft, opened)
            time.sleep(0.2)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    soft, opened = seen
    assert soft == wanted, (soft, wanted)
    assert sleeper in opened and cluster.postmaster_pid in opened, (sleeper, opened)


CPU_HEAD = re.compile(r"CPU functions of pid (\d+) \((\d+) Hz for (\d+) s, by self samples\): "
                      r"([\d,]+) samples")  # fmt: skip


def test_top_cpu_functions_of_a_backend(cluster: PgCluster, ready: None, load: Load) -> None:
    """Enter, then c: a low-rate CPU sample of the row's backend (top.cpu). A PL/pgSQL loop
    burns the CPU: its samples are its schedstat CPU over those seconds x the rate (+-15 %,
    as flame's: the capture's edges are not on the screen), and the function on top, by self
    samples, is in plpgsql.so."""
    need(shutil.which("bpftrace") is not None, "bpftrace is not installed")
    burner = load.start("top-cpu-burner", "DO $$BEGIN LOOP END LOOP; END$$")
    clock = CpuClock(burner)
    screen = Screen([*cluster.conn_args, "--interval", "1", "--view", "backends"], width=100)
    try:
        screen.wait(lambda t: any(ln.split()[:1] == [str(burner)] for ln in t), "the burner")
        screen.keys("/", *"top-cpu-burner", "Enter")
        screen.wait(lambda t: "filter: top-cpu-burner" in "\n".join(t), "the filter")
        screen.keys("Enter")
        screen.wait(lambda t: f"c: the CPU functions of pid {burner}" in "\n".join(t), "the hint")
        asked = time.time()
        screen.keys("c")
        screen.wait(lambda t: "sampling..." in "\n".join(t), "the sample under way")
        lines = screen.wait(lambda t: CPU_HEAD.search("\n".join(t)) is not None, "the result",
                            timeout=60)  # fmt: skip
        done = time.time()
        clock.done.set()
        found = CPU_HEAD.search("\n".join(lines))
        assert found is not None
        pid, hz, seconds, samples = (int(g.replace(",", "")) for g in found.groups())
        rate = (clock.at(done - 0.1) - clock.at(asked)) / 1e9 / (done - 0.1 - asked)
        expected = rate * seconds * hz
        print(f"samples {samples}, expected {expected:.0f} (CPU {rate:.3f} of a second)")
        assert pid == burner and abs(samples - expected) <= 0.15 * expected + 3, lines
        first = lines[next(i for i, ln in enumerate(lines) if CPU_HEAD.search(ln)) + 1]
        assert re.match(r"\s+\d+\.\d %  .+  \(plpgsql\.so\)$", first.rstrip()), lines
        screen.keys("q")
        screen.wait(lambda t: "EXITED 0" in "\n".join(t), "the exit")
    finally:
        clock.done.set()
        screen.close()


class JsonLines:
    """`pgprobe top --json` running, its documents read as they come (stderr kept)."""

    def __init__(self, args: list[str]) -> None:
        argv = [sys.executable, "-m", "pgprobe", "top", *args, "--json"]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, cwd=CHECKOUT)  # fmt: skip
        self.docs: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self.readers = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._errors, daemon=True)]  # fmt: skip
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.endswith("\n"):  # a whole document (not one cut by the end)
                self.docs.append(json.loads(line))

    def _errors(self) -> None:
        assert self.process.stderr is not None
        self.stderr.extend(self.process.stderr)

    def wait(self, ok: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            assert self.process.poll() is None, "".join(self.stderr)
            return next((d for d in list(self.docs) if ok(d)), None)

        return until(found, what, 60)  # type: ignore[no-any-return]

    def stop(self) -> str:
        """Ctrl-C: the last window printed; stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)
        for reader in self.readers:
            reader.join(timeout=10)
        return "".join(self.stderr)


def placed(doc: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """A document's waiters: pid -> (its root blocker, the pid it waited behind)."""
    return {w["pid"]: (t["root"]["pid"], w["behind"])
            for t in doc["meta"]["blocking"]["trees"] for w in t["waiters"]}  # fmt: skip


def expected_trees(blockers: dict[int, list[int]]) -> dict[int, tuple[int, int]]:
    """pg_blocking_pids() as trees: each waiter under the root blocker (one that waits on
    nothing) at the end of its chain, behind its blocker nearest that root."""

    def chain(pid: int) -> list[int]:  # pid, a blocker of it, ..., the root
        out = [pid]
        while out[-1] in blockers and len(out) <= len(blockers):
            out.append(min(blockers[out[-1]], key=lambda b: len(chain(b))))
        return out

    return {pid: (chain(pid)[-1], min(blockers[pid], key=lambda b: len(chain(b))))
            for pid in blockers}  # fmt: skip


def test_top_blocking_tree_of_a_migration_queue(cluster: PgCluster, ready: None) -> None:
    """A idle in its transaction after reading q; B's ALTER TABLE q waits behind A; C's
    SELECT behind B. The locks view's tree and --json's meta.blocking name A the root, B
    and C where the test's own pg_blocking_pids() put them; each waiter's seconds over the
    windows are its own account of the statement (wall less CPU less runqueue, read by the
    server around it: test_locks' timed()) within 2 %."""
    cluster.sql("DROP TABLE IF EXISTS top_queue")
    cluster.sql("CREATE TABLE top_queue (id int PRIMARY KEY, v int)")
    cluster.sql("INSERT INTO top_queue SELECT g, 0 FROM generate_series(1, 100) g")
    cluster.sql(TIMED.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
    watcher, holder = cluster.connect(), cluster.connect(application_name="top-holder")
    truth: dict[int, float] = {}
    threads: list[threading.Thread] = []

    def waiter(sql: str) -> int:
        conn = cluster.connect()
        pid = int(conn.info.backend_pid)

        def run() -> None:
            with conn:
                row = conn.execute("SELECT * FROM timed(%s)", (sql,)).fetchone()
            assert row is not None
            wall, cpu, runq = (int(str(v)) for v in row)
            truth[pid] = (wall - cpu - runq) / 1e9  # off CPU and not runnable

        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()
        until(lambda: watcher.execute("SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted",
                                      (pid,)).fetchone(), f"{sql} queued")  # fmt: skip
        return pid

    top = JsonLines([*cluster.conn_args, "--interval", "1"])
    screen = Screen([*cluster.conn_args, "--interval", "1", "--view", "locks"])
    try:
        top.wait(lambda d: True, "a first window")  # attached: the waits are all inside
        screen.wait(lambda t: window(t) is not None, "a first window on the screen")
        a = int(holder.info.backend_pid)
        holder.execute("BEGIN")
        holder.execute("SELECT * FROM top_queue LIMIT 1")
        b = waiter("ALTER TABLE top_queue ADD COLUMN x int")
        top.wait(lambda d: b in placed(d), "B in a tree")  # B sampled before C queues
        c = waiter("SELECT count(*) FROM top_queue")
        top.wait(lambda d: c in placed(d), "C in a tree")
        rows: list[tuple[Any, ...]] = watcher.execute(
            "SELECT pid, pg_blocking_pids(pid) FROM unnest(%s::int[]) pid", ([b, c],)
        ).fetchall()
        expected = expected_trees({int(pid): list(pids) for pid, pids in rows})
        print(f"A {a}, B {b}, C {c}: pg_blocking_pids {rows}, trees {expected}")
        assert {pid: root for pid, (root, _) in expected.items()} == {b: a, c: a}, rows

        # the locks view: A's row, B under it, C under B (or A), indented by its depth
        def tree_on_screen(lines: list[str]) -> bool:
            pids = [ln.split()[:2] for ln in lines]
            return [str(a)] in [p[:1] for p in pids] and ["└", str(c)] in pids

        lines = screen.wait(tree_on_screen, "the blocking tree")
        print("\n".join(lines))
        at = {p: next(i for i, ln in enumerate(lines) if re.match(rf"\s*(└ )?{p}\b", ln)
                      and "MODE WANTED" not in ln) for p in (a, b, c)}  # fmt: skip
        assert at[a] < at[b] < at[c], lines
        root = lines[at[a]]
        assert root.split()[0] == str(a) and "idle in transaction" in root, lines
        assert "SELECT * FROM top_queue" in root, lines
        margin = len(root) - len(root.lstrip())
        depth = {p: (len(lines[at[p]]) - len(lines[at[p]].lstrip()) - margin) // 2
                 for p in (b, c)}  # fmt: skip
        assert depth == {b: 1, c: 2 if expected[c][1] == b else 1}, lines
        screen.keys("Enter")  # the longest-waited lock's details: its waiters' places
        lines = screen.wait(lambda t: f"pid {b} " in "\n".join(t), "the lock's details")
        assert f"behind {a} (root blocker {a})" in "\n".join(lines), lines
        screen.keys("Enter")
        # A commits as a refresh is printed: the waits end within ms, in a window that the
        # next sample (0.5 s apart) most often does not see: kept where they were before
        shown = len(top.docs)
        until(lambda: len(top.docs) > shown, "a refresh", 10)
        committed = time.time()
        holder.execute("COMMIT")
        for thread in threads:
            thread.join(timeout=60)
        over = time.time()
        top.wait(lambda d: d["meta"]["window_unix_s"][0] > over, "a window after the waits")
    finally:
        stderr = top.stop()
        screen.close()
        holder.close()
        watcher.close()
    assert top.process.returncode == 0, stderr
    assert set(truth) == {b, c}, truth
    # While A held its transaction, every window's trees are the expected ones, A idle in it
    before = [d for d in top.docs if d["meta"]["window_unix_s"][1] < committed and placed(d)]
    assert before, [d["meta"]["blocking"] for d in top.docs]
    for doc in before:
        blocking = doc["meta"]["blocking"]
        assert placed(doc) == {p: expected[p] for p in placed(doc)}, (blocking, expected)
        root = blocking["trees"][0]["root"]
        assert (root["pid"], root["state"]) == (a, "idle in transaction"), blocking
        assert root["query"] == "SELECT * FROM top_queue LIMIT 1", blocking
    # Each waiter's seconds, window by window, add up to its own account
    for pid in (b, c):
        windows = [w["waited_us"] for d in top.docs for t in d["meta"]["blocking"]["trees"]
                   for w in t["waiters"] if w["pid"] == pid]  # fmt: skip
        unsampled = [d["meta"]["blocking"] for d in top.docs
                     if pid in d["meta"]["blocking"]["unsampled_pids"]]  # fmt: skip
        assert all(u["unsampled_pids"] == [pid] for u in unsampled), unsampled
        total = (sum(windows) + sum(u["unsampled_us"] for u in unsampled)) / 1e6
        line = (
            f"waiter {pid}: {total:.4f} s over {len(windows)} windows (+{len(unsampled)} "
            f"unsampled), truth {truth[pid]:.4f} s"
        )
        print(line)
        assert total == pytest.approx(truth[pid], rel=0.02), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--once", "--batch", "2"], "--once is --batch 1"),
        (["--interval", "0"], "must be between 1 and 3600 seconds"),
        (["-d", "1", "--interval", "5"], "longer than the duration"),
    ],
)
def test_top_bad_options_are_one_line(args: list[str], message: str) -> None:
    done = run_pgprobe(["top", *args])
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
