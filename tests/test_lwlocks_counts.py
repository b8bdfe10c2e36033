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
from helpers import CHECKOUT, bpf_link_fds, need, start_bpftrace_json, until
from test_lwlocks import NO_GUARD
from test_waits import wait_attached

from pgprobe import usdt
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


def attached(probe: subprocess.Popen[str], binary: str, engine: str) -> None:
    """Until pgprobe's object holds a link at every site of the two probes (libbpf attaches
    the done probe's first), or its bpftrace has attached."""
    if engine == "bpftrace":
        wait_attached(probe)
        return
    sites = [s for s in usdt.probe_sites(binary) if s.name.startswith("lwlock__wait__")]
    until(lambda: probe.poll() is not None or bpf_link_fds(probe.pid) >= len(sites),
          "the object's links at every site")  # fmt: skip
    assert probe.poll() is None, probe.communicate()


@pytest.mark.parametrize("engine", ["libbpf", "bpftrace"])
def test_usdt_waits_per_tranche_equal_an_independent_counter(
    cluster: PgCluster,
    tracing: None,
    pg_build: PgBuild,
    tested_on: Callable[[str, str], None],
    engine: str,
) -> None:
    """The compiled object (bpf/lwlock_wait.bpf.c) and the script, each against the counter."""
    need(pg_build.has_usdt, f"{pg_build.id} has no USDT probes: nothing to count")
    counter = start_bpftrace_json(COUNTER, str(pg_build.postgres), str(cluster.postmaster_pid))
    probe = None
    asked = ["--engine", "bpftrace"] if engine == "bpftrace" else []
    try:
        probe = subprocess.Popen(
            [sys.executable, "-m", "pgprobe", "lwlocks", "--source", "usdt", *NO_GUARD,
             *cluster.conn_args, "-d", "300", "--json", *asked],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
        )  # fmt: skip
        attached(probe, str(pg_build.postgres), engine)
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
    assert doc["meta"]["source"] == "usdt" and doc["meta"]["engine"] == engine, doc["meta"]
    got: Counter[str] = Counter()
    for row in doc["rows"]:
        got[row["tranche"]] += row["waits"]
    truth = counted(counter_out)
    print(f"pgprobe {dict(got)}\ncounter {dict(truth)}")
    assert sum(truth.values()) >= 300, truth  # a load with LWLock waits to count
    assert got == truth
    if engine == "libbpf":
        tested_on("lwlocks", "waits per tranche = an independent USDT counter")
