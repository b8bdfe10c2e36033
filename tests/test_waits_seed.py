"""The compiled time model's seed (pgprobe.tools.waits.compiled): real cluster, real BPF.

The object sees a process from its first switch-out after the attach; pgprobe seeds the
time before that from /proc and the process's memory, right after the attach, where the
object made no entry yet. A backend that wakes and sleeps again between the window's start
and the attach began a sleep no one saw: its time must not all go to "asleep since before
the capture" until its next wakeup (the serve duty cycle met it in the checkpointer: 0.11 s
of a 1 s part), only the moment before the seed. Forced here: a query answered in that gap.
"""

from __future__ import annotations

import time

import pytest

from pgprobe import discover, proc, waitevents
from pgprobe.engines import libbpf
from pgprobe.engines.base import Snapshot
from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import compiled, probe, records
from pgprobe.waitevents import address, backend_state

pytestmark = pytest.mark.integration

DURATION_S = 1.0


def test_a_sleep_begun_before_the_attach_is_named_from_the_seed(
    build_cluster: PgCluster, tracing: None
) -> None:
    assert compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf"
    targets = discover.discover(
        discover.ConnOptions(host=str(build_cluster.root), port=build_cluster.port,
                             user="postgres"),
        discover.Filters(),
    )  # fmt: skip
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    with build_cluster.connect() as conn:
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        capture = compiled.capture(probe.script_args(targets, where, None), DURATION_S)
        start_window = capture.on_attach
        assert start_window is not None
        slept_again: list[int] = []

        def answer_before_the_attach(obj: libbpf.BpfObject) -> None:
            start_window(obj)
            before = proc.sched_counters(pid)
            conn.execute("SELECT 1")  # wakes the backend; it sleeps again in ClientRead
            time.sleep(0.01)
            after = proc.sched_counters(pid)
            assert before is not None and after is not None
            slept_again.append(after.sleeps - before.sleeps)

        capture.on_attach = answer_before_the_attach
        snapshots = [e for e in capture.events() if isinstance(e, Snapshot)]
    assert slept_again and slept_again[0] >= 1, "the backend did not sleep again before the attach"
    (mine,) = [p for p in records.records(snapshots[-1], [pid], lambda _: True) if p.pid == pid]
    idle = backend_state.with_state(cluster.major, waitevents.CLIENT_READ, "idle")
    named = mine.wait_ns.get(idle, 0) + mine.wait_ns.get(waitevents.CLIENT_READ, 0)
    unknown = mine.wait_ns.get(waitevents.BEFORE_CAPTURE, 0)
    print(f"wall {mine.wall_ns / 1e6:.1f} ms: ClientRead {named / 1e6:.1f} ms, "
          f"unknown {unknown / 1e6:.3f} ms, cpu {mine.cpu_ns / 1e6:.3f} ms")  # fmt: skip
    assert mine.wall_ns >= DURATION_S * 0.9e9
    # The unseen part: from the window's start to the seed (the query, 10 ms, the attach).
    assert unknown <= 0.05 * mine.wall_ns, mine.wait_ns
    assert named >= 0.85 * mine.wall_ns, mine.wait_ns
