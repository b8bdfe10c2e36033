"""`pgprobe lwlocks --source usdt`'s counts against an independent counter of the same probes.

The counter is the test's own bpftrace program on PostgreSQL's `lwlock__wait__start` and
`__done` probes (the cluster's processes only), attached before pgprobe and stopped after
it. Between them a bounded load (pgbench -t: a fixed number of transactions) begins and
ends while nothing waits on an LWLock, so both see every wait of the load, whole: per
tranche, pgprobe's WAITS equal the waits the counter saw end, exactly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from helpers import CHECKOUT, need, start_bpftrace_json, until
from test_lwlocks import NO_GUARD
from test_waits import wait_attached

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = [pytest.mark.integration, pytest.mark.once]

# $1: the server binary, $2: the postmaster. A wait is counted where it ends (__done, as
# lwlock_wait.bt counts it); one begun before the counter attached is left out (@start).
COUNTER = """
BEGIN { printf("live\\n"); }
usdt:$1:postgresql:lwlock__wait__start /pid == $2 || curtask->real_parent->tgid == $2/ {
  @start[tid] = 1; @tranche[tid] = str(arg0);
}
usdt:$1:postgresql:lwlock__wait__done /@start[tid]/ {
  @waits[@tranche[tid]] = count(); delete(@start[tid]); delete(@tranche[tid]);
}
END { clear(@start); clear(@tranche); }
"""


def counted(text: str) -> Counter[str]:
    """The counter's @waits per tranche, from bpftrace's JSON lines."""
    out: Counter[str] = Counter()
    for doc in (json.loads(line) for line in text.splitlines() if line.strip()):
        if doc["type"] == "map" and "@waits" in doc["data"]:
            out.update(doc["data"]["@waits"])
    return out


def test_usdt_waits_per_tranche_equal_an_independent_counter(
    cluster: PgCluster, tracing: None, pg_build: PgBuild, tested_on: Callable[[str, str], None]
) -> None:
    need(pg_build.has_usdt, f"{pg_build.id} has no USDT probes: nothing to count")
    counter = start_bpftrace_json(COUNTER, str(pg_build.postgres), str(cluster.postmaster_pid))
    probe = None
    try:
        probe = subprocess.Popen(
            [sys.executable, "-m", "pgprobe", "lwlocks", "--source", "usdt", *NO_GUARD,
             *cluster.conn_args, "-d", "300", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
        )  # fmt: skip
        wait_attached(probe)
        bench = cluster.pgbench("-c", "8", "-j", "2", "-t", "600", "-n")
        out, _ = bench.communicate(timeout=300)
        assert bench.returncode == 0, out
        gone = "SELECT 1 FROM pg_stat_activity WHERE application_name = 'pgbench'"
        until(lambda: not cluster.sql(gone), "pgbench's backends gone")
        probe.send_signal(signal.SIGINT)
        probe_out, probe_err = probe.communicate(timeout=60)
        assert probe.returncode == 0, probe_err
        counter.send_signal(signal.SIGINT)
        counter_out, counter_err = counter.communicate(timeout=60)
        assert counter.returncode == 0, counter_err
    finally:
        for process in (probe, counter):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    doc: dict[str, Any] = json.loads(probe_out)
    assert doc["meta"]["source"] == "usdt", doc["meta"]
    got: Counter[str] = Counter()
    for row in doc["rows"]:
        got[row["tranche"]] += row["waits"]
    truth = counted(counter_out)
    print(f"pgprobe {dict(got)}\ncounter {dict(truth)}")
    assert sum(truth.values()) >= 300, truth  # a load with LWLock waits to count
    assert got == truth
    tested_on("lwlocks", "waits per tranche = an independent USDT counter")
