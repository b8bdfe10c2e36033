"""What `pgprobe serve` asks the probes: the other tools' scripts, in rolling windows.

Each source is one probe script that the agent keeps running with its
INTERVAL_S parameter set to the window: bpftrace prints and clears its maps
every window, so each snapshot is the window's own counts (kernel memory stays
bounded by one window) and a counter is the sum of the windows. The scripts
keep two buffers (a map and its "_b" twin, bpf/clog_reads.bt's interval
probe): bpftrace prints and clears a window's maps later, in its own process,
and what the probes counted in between was lost with one buffer (5 of 148,920
SLRU reads over 3.5 s of windows, tests/test_serve.py).

- ``lwlock``: by default no script of its own: the time model's LWLock-class
  sleeps and the runqueue time after each (pgprobe lwlocks --source sched; mode
  unknown), at no
  cost beyond the time model's. ``--lwlock-source usdt``: bpf/lwlock_wait.bt
  (pgprobe lwlocks), exact waits with their mode, whole cluster, not by pid; needs
  the server's USDT probes (PostgreSQL 13+ built with --enable-dtrace) and costs a
  uprobe trap per wait (~17 us: 14 % of one CPU at 8,000 waits/s).
- ``slru``: bpf/clog_reads.bt (pgprobe clog-reads) in aggregate mode, every SLRU.
- ``cpu``: bpf/profile.bt (pgprobe flame/hot) at a low rate, user stacks named in
  Python as flame does (pgprobe.tools.profiling).
- ``waits``: bpf/waits.bt (pgprobe waits), the time model of every process of the
  cluster: on CPU, runqueue, off CPU per wait event (PostgreSQL 14+, any build).
  Compiled (bpf/waits.bpf.c), it runs only --waits-duty of each window (a fresh
  capture each time, at a random moment); bpf/waits.bt runs all the time.

A new source is one more ``Source`` here with its ``fold`` in records.py and its
families in metrics.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from pgprobe.discover import Targets
from pgprobe.engines.base import Capture
from pgprobe.errors import PgprobeError
from pgprobe.tools import bystatement, clog_reads, lwlocks, profiling
from pgprobe.tools.serve import recycle
from pgprobe.tools.waits import compiled as waits_compiled
from pgprobe.tools.waits import probe as waits_probe
from pgprobe.tools.waits import querydim
from pgprobe.waitevents import address, statement

LWLOCK, SLRU, CPU, WAITS = "lwlock", "slru", "cpu", "waits"
# waits.bt's maps hold (process, wait event) pairs of up to RECYCLE_AFTER_EXITED exited
# processes (about 5 each in the largest): 32,768 keys hold them.
MIN_WAITS_KEYS = 32768


@dataclass(frozen=True)
class Source:
    """One probe script the agent keeps running."""

    name: str
    what: str  # for messages
    check: Callable[[Targets], None]  # raises PgprobeError when the server cannot be traced so
    start: Callable[[argparse.Namespace, Targets, int], Capture]


def _lwlock(ns: argparse.Namespace, targets: Targets, window: int) -> Capture:
    return lwlocks.start(ns, targets, by_pid=False, interval=window)


def slru_names(targets: Targets) -> list[str]:
    """Every SLRU directory of this server's version (pg_xact, pg_subtrans, ...)."""
    return clog_reads.selected_slrus([("all",)], targets.cluster.major or 99)


def _slru(ns: argparse.Namespace, targets: Targets, window: int) -> Capture:
    return clog_reads.start(ns, targets, slru_names(targets), clog_reads.MODE_AGGREGATE, window)


def _cpu(ns: argparse.Namespace, targets: Targets, window: int) -> Capture:
    env = {
        "BPFTRACE_NO_USER_SYMBOLS": "1",
        "BPFTRACE_MAP_KEYS_MAX": str(profiling.map_keys(window, ns.hz)),
    }
    where = None
    if getattr(ns, "statements", 0):  # each sample's statement, for pprof's query_id label
        with contextlib.suppress(PgprobeError):
            where = bystatement.where(targets)
    args = profiling.script_args(targets, ns.hz, kernel=False, where=where)
    args[4] = window
    return profiling.sampler(ns, args, env, window)


def waits_map_keys() -> int:
    """BPFTRACE_MAP_KEYS_MAX for waits.bt: room for every task of the machine in @task,
    twice over, and for what the agent lets pile up before it recycles the tracer.

    Every map gets this many keys, preallocated (2.6 MiB of kernel memory per 32,768
    keys and map, 15 maps): waits' own 65,536 is for a machine of 30,000 tasks.
    """
    tasks = sum(len(os.listdir(f"/proc/{p}/task")) for p in os.listdir("/proc")
                if p.isdigit() and os.path.isdir(f"/proc/{p}/task"))  # fmt: skip
    need = 2 * (tasks + recycle.RECYCLE_AFTER_STALE)
    keys = MIN_WAITS_KEYS
    while keys < need and keys < int(waits_probe.ENV["BPFTRACE_MAP_KEYS_MAX"]):
        keys *= 2
    return keys


def _waits(ns: argparse.Namespace, targets: Targets, window: int) -> Capture:
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    args = waits_probe.script_args(targets, where, window)
    env = {**waits_probe.ENV, "BPFTRACE_MAP_KEYS_MAX": str(waits_map_keys())}
    query = statements_dimension(ns, targets, where)
    return waits_probe.capture(ns, args, env, duty=getattr(ns, "waits_duty", 1.0), query=query)


def statements_dimension(
    ns: argparse.Namespace, targets: Targets, where: address.WaitEventAddress
) -> querydim.Dimension | None:
    """--statements N: the time model keyed by query id too (the compiled object only; the
    agent said at start when it cannot, statements_unavailable)."""
    if not getattr(ns, "statements", 0) or waits_compiled.why_not(ns) is not None:
        return None
    found = statement.address_of(where, targets.cluster.major)  # `where` read once, here
    return querydim.Dimension(found, False, where.binary) if found is not None else None


def statements_unavailable(ns: argparse.Namespace, targets: Targets) -> str:
    """Why --statements cannot be fed here ("" when it can): the compiled object, and the
    same reasons as every --by query (bystatement.where)."""
    why = waits_compiled.why_not(ns)
    if why is not None:
        return f"the compiled time model: {why or 'not with --engine bpftrace'}"
    try:
        bystatement.where(targets)
    except PgprobeError as exc:
        return exc.message
    return ""


SOURCES = (
    Source(WAITS, "time model", waits_probe.check_server, _waits),
    Source(LWLOCK, "LWLock waits", lwlocks.check_server, _lwlock),
    Source(SLRU, "SLRU reads", clog_reads.check_server, _slru),
    Source(CPU, "CPU samples", profiling.check_server, _cpu),
)


def available(targets: Targets, lwlock_usdt: bool) -> tuple[list[Source], dict[str, str]]:
    """The sources this server can feed (LWLock's only with lwlock_usdt: otherwise the
    time model feeds it), and why each other one cannot."""
    ok: list[Source] = []
    missing: dict[str, str] = {}
    for source in SOURCES:
        if source.name == LWLOCK and not lwlock_usdt:
            continue
        try:
            source.check(targets)
        except PgprobeError as exc:
            missing[source.name] = exc.message
        else:
            ok.append(source)
    return ok, missing
