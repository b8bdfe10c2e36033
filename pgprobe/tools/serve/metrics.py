"""The agent's totals as Prometheus metric families (prometheus_client), for /metrics.

Names and labels (stable; the README's Fleet section and contrib/'s dashboard use them):

  pgprobe_wait_seconds_total{wait_event_type,wait_event,backend_type,state}
                                                       time off CPU per wait event (the time
                                                       model of pgprobe waits); state: active
                                                       (waiting for a resource), idle (Activity,
                                                       ClientRead: waiting for work) or unknown
                                                       (asleep since before the capture); for
                                                       ClientRead the backend's state as
                                                       pg_stat_activity names it: idle, active,
                                                       idle in transaction (aborted), unknown;
                                                       backend_type "(exited)": came and went
                                                       within a window, before it was named
  pgprobe_wait_sleeps_total{same labels}               sleeps in that event that ended
  pgprobe_oncpu_seconds_total{backend_type}            time on CPU
  pgprobe_runqueue_seconds_total{backend_type}         runnable, waiting for a CPU
  pgprobe_process_seconds_total{backend_type}          wall time of the processes modelled (on CPU
                                                       + runqueue + waits + a rest near 0)
  pgprobe_lwlock_wait_seconds_total{tranche,mode}      time spent waiting for LWLocks; mode
                                                       "unknown": from the time model (the
                                                       default, --lwlock-source sched): each
                                                       sleep and the runqueue time after it;
                                                       Exclusive, Shared: from the USDT probes
                                                       (--lwlock-source usdt)
  pgprobe_lwlock_waits_total{tranche,mode}             LWLock waits (sched: sleeps)
  pgprobe_lwlock_wait_duration_seconds{tranche}        histogram of single waits (log2 buckets)
  pgprobe_slru_reads_total{slru}                       SLRU pages read from the files
  pgprobe_slru_read_seconds_total{slru}                time in those reads
  pgprobe_statement_seconds_total{query_id,part}       with --statements N: DB time of the N
                                                       statements with the most since the
                                                       agent began (query_id as
                                                       pg_stat_statements.queryid); part: cpu,
                                                       runqueue or the wait_event_type waited
                                                       in; the same time model as the wait
                                                       metrics (and --waits-duty)
  pgprobe_statements_seconds_total{kind,part}          the same for all: kind statement, idle
                                                       in transaction, no query id, outside
                                                       statements
  pgprobe_cpu_samples_total{backend_type}              on-CPU samples of the cluster's processes
                                                       ("unknown": came and went between two
                                                       looks at /proc, 5 s apart)
  pgprobe_cpu_samples_without_stack_total              of those, samples without a user stack:
                                                       the kernel's stack map refused it (full or
                                                       a collision) or the task was exiting
  pgprobe_cpu_sampling_hz                              the sampling rate (samples / Hz = CPU s)
  pgprobe_capture_up{source}                           1 while the source's probes are attached
  pgprobe_capture_available{source}                    0 when this server cannot feed the source
  pgprobe_capture_windows_total{source}                windows folded in (bpftrace prints
                                                       nothing for a window without events)
  pgprobe_capture_restarts_total{source}               tracer restarts after it ended by itself
  pgprobe_capture_observed_seconds_total{source}       time its probes counted: the windows'
                                                       length, but for the time model (and the
                                                       LWLock metrics it feeds) only the part
                                                       of each window it ran (--waits-duty):
                                                       rate(pgprobe_wait_seconds_total) / rate(
                                                       this) is the processes in that wait on
                                                       average (as rate() is with duty 1)
  pgprobe_capture_lost_events_total{source}            events the tracer said it lost
  pgprobe_capture_failed_map_updates_total{source}     updates refused by full BPF maps
  pgprobe_capture_last_window_end_timestamp_seconds{source}, ..._last_window_seconds{source}
  pgprobe_server_up, pgprobe_server_restarts_total     the PostgreSQL server, as the agent sees it
  pgprobe_window_seconds                               the configured window
  pgprobe_wait_events_folded_total                     distinct wait event codes pgprobe has
                                                       no name for, folded into wait_event (and
                                                       tranche) "other" (fold.py: past the
                                                       first 8 per wait_event_type; an unknown
                                                       class is wait_event_type "other" too)
  pgprobe_http_connections_dropped_total{reason}       HTTP connections closed before their
                                                       request was served (httpd.py): cap (too
                                                       many open), fd_limit (out of file
                                                       descriptors), read_timeout (no complete
                                                       request in 5 s), too_large, tls
  pgprobe_http_accept_pauses_total                     times accepting paused (out of fds)
  pgprobe_http_unauthorized_requests_total             requests refused with 401 (basic auth)

source is waits, lwlock, slru or cpu (probe.SOURCES). prometheus_client's process_* metrics
(resident memory, CPU seconds of the agent itself, not of its tracers) come along.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pgprobe.tools.serve.records import HIST_MAX_POW, HIST_MIN_POW, Totals, top_statements


def histogram_buckets(counts: dict[int, int]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets from counts per power of two (see records.py)."""
    out: list[tuple[str, float]] = []
    running = 0
    for power in range(HIST_MIN_POW, HIST_MAX_POW + 1):
        running += counts.get(power, 0)
        out.append((repr(2**power / 1e9), float(running)))
    running += counts.get(HIST_MAX_POW + 1, 0)
    out.append(("+Inf", float(running)))
    return out


class TotalsCollector(Collector):
    """Reads the agent's totals under its lock at every scrape (the families are built
    under it: the agent's threads add keys meanwhile; the text is formatted after)."""

    def __init__(
        self,
        snapshot: Callable[[], tuple[Totals, dict[str, Any]]],
        lock: contextlib.AbstractContextManager[Any] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.lock = lock or contextlib.nullcontext()

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            families = list(self.families())
        yield from families

    def families(self) -> Iterator[Metric]:
        totals, extra = self.snapshot()
        yield from time_model_families(totals)
        yield from statement_families(totals)
        yield from lwlock_families(totals)
        yield from slru_families(totals)
        yield from cpu_families(totals)
        yield from source_families(totals)
        up = GaugeMetricFamily("pgprobe_server_up", "1 when the agent reaches the server")
        up.add_metric([], 1.0 if extra.get("server_up") else 0.0)
        yield up
        yield CounterMetricFamily(
            "pgprobe_server_restarts",
            "times the server came back with a new postmaster",
            value=totals.server_restarts,
        )
        yield GaugeMetricFamily(
            "pgprobe_window_seconds", "length of one capture window", value=extra.get("window", 0)
        )
        yield CounterMetricFamily(
            "pgprobe_wait_events_folded",
            'distinct unknown wait event codes folded into wait_event="other"',
            value=totals.names.count,
        )


def time_model_families(totals: Totals) -> Iterator[Metric]:
    labels = ["wait_event_type", "wait_event", "backend_type", "state"]
    seconds = CounterMetricFamily(
        "pgprobe_wait_seconds", "time off CPU per wait event", labels=labels
    )
    sleeps = CounterMetricFamily(
        "pgprobe_wait_sleeps", "sleeps per wait event that ended", labels=labels
    )
    for key, ns in sorted(totals.wait_ns.items()):
        seconds.add_metric(list(key), ns / 1e9)
        sleeps.add_metric(list(key), totals.wait_sleeps[key])
    yield from (seconds, sleeps)
    for name, doc, counts in (
        ("pgprobe_oncpu_seconds", "time on CPU", totals.oncpu_ns),
        ("pgprobe_runqueue_seconds", "time runnable, waiting for a CPU", totals.runqueue_ns),
        ("pgprobe_process_seconds", "wall time of the processes modelled", totals.process_ns),
    ):
        family = CounterMetricFamily(name, doc, labels=["backend_type"])
        for btype, ns in sorted(counts.items()):
            family.add_metric([btype], ns / 1e9)
        yield family


def statement_families(totals: Totals) -> Iterator[Metric]:
    """--statements N: the top N statements' series (none without it)."""
    if not totals.statements_shown:
        return
    top = CounterMetricFamily("pgprobe_statement_seconds", "DB time of a statement, by part",
                              labels=["query_id", "part"])  # fmt: skip
    for qid, parts in top_statements(totals):
        for part, ns in sorted(parts.items()):
            top.add_metric([str(qid), part], ns / 1e9)
    every = CounterMetricFamily("pgprobe_statements_seconds",
                                "DB time of every statement, by kind and part",
                                labels=["kind", "part"])  # fmt: skip
    for (kind, part), ns in sorted(totals.statement_kind_ns.items()):
        every.add_metric([kind, part], ns / 1e9)
    yield from (top, every)


def lwlock_families(totals: Totals) -> Iterator[Metric]:
    seconds = CounterMetricFamily(
        "pgprobe_lwlock_wait_seconds", "time spent waiting for LWLocks", labels=["tranche", "mode"]
    )
    waits = CounterMetricFamily("pgprobe_lwlock_waits", "LWLock waits", labels=["tranche", "mode"])
    for (tranche, mode), ns in sorted(totals.lwlock_wait_ns.items()):
        seconds.add_metric([tranche, mode], ns / 1e9)
        waits.add_metric([tranche, mode], totals.lwlock_waits[tranche, mode])
    hist = HistogramMetricFamily(
        "pgprobe_lwlock_wait_duration_seconds", "single LWLock waits", labels=["tranche"]
    )
    for tranche, counts in sorted(totals.lwlock_hist.items()):
        ns = sum(v for (t, _), v in totals.lwlock_wait_ns.items() if t == tranche)
        hist.add_metric([tranche], histogram_buckets(counts), sum_value=ns / 1e9)
    yield from (seconds, waits, hist)


def slru_families(totals: Totals) -> Iterator[Metric]:
    reads = CounterMetricFamily(
        "pgprobe_slru_reads", "SLRU pages read from their files", labels=["slru"]
    )
    seconds = CounterMetricFamily(
        "pgprobe_slru_read_seconds", "time in SLRU page reads", labels=["slru"]
    )
    for slru, n in sorted(totals.slru_reads.items()):
        reads.add_metric([slru], n)
        seconds.add_metric([slru], totals.slru_read_ns[slru] / 1e9)
    yield from (reads, seconds)


def cpu_families(totals: Totals) -> Iterator[Metric]:
    samples = CounterMetricFamily(
        "pgprobe_cpu_samples", "on-CPU samples of the cluster's processes", labels=["backend_type"]
    )
    for kind, n in sorted(totals.cpu_samples.items()):
        samples.add_metric([kind], n)
    yield samples
    yield CounterMetricFamily(
        "pgprobe_cpu_samples_without_stack",
        "samples whose user stack the kernel's stack map refused, or of an exiting task",
        value=totals.cpu_samples_without_stack,
    )
    yield GaugeMetricFamily("pgprobe_cpu_sampling_hz", "CPU samples per second per CPU",
                            value=totals.cpu_hz)  # fmt: skip


def source_families(totals: Totals) -> Iterator[Metric]:
    def family(kind: type, name: str, doc: str, value: Callable[[Any], float]) -> Metric:
        out = kind(name, doc, labels=["source"])
        for source, state in sorted(totals.sources.items()):
            out.add_metric([source], value(state))
        return out  # type: ignore[no-any-return]

    g, c = GaugeMetricFamily, CounterMetricFamily
    yield family(g, "pgprobe_capture_up", "1 while the probes are attached", lambda s: s.up)
    yield family(g, "pgprobe_capture_available", "0 when this server cannot feed the source",
                 lambda s: not s.unavailable)  # fmt: skip
    yield family(c, "pgprobe_capture_windows", "windows folded in", lambda s: s.windows)
    yield family(c, "pgprobe_capture_restarts", "tracer restarts", lambda s: s.restarts)
    yield family(c, "pgprobe_capture_observed_seconds", "time the probes counted",
                 lambda s: s.observed_s)  # fmt: skip
    yield family(c, "pgprobe_capture_lost_events", "events the tracer lost",
                 lambda s: s.lost_events)  # fmt: skip
    yield family(c, "pgprobe_capture_failed_map_updates", "updates refused by full BPF maps",
                 lambda s: s.failed_map_updates)  # fmt: skip
    yield family(g, "pgprobe_capture_last_window_end_timestamp_seconds",
                 "when the last window ended", lambda s: s.last_window_end)  # fmt: skip
    yield family(g, "pgprobe_capture_last_window_seconds", "length of the last window",
                 lambda s: s.last_window_s)  # fmt: skip
