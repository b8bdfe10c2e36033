"""What every tracing tool does the same way: options, checks, capture, meta, output."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pgprobe import discover, engines, timings
from pgprobe.discover import Targets
from pgprobe.engines import bpftrace
from pgprobe.engines.base import Capture, Line, MapSpec, RunInfo, Snapshot
from pgprobe.errors import EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.literal import literal

MAX_DURATION_S = 24 * 3600
N = TypeVar("N", int, float)


def bounded(
    kind: Callable[[str], N],
    low: N,
    high: N | None = None,
    *,
    unit: str = "",
    low_open: bool = False,
) -> Callable[[str], N]:
    """An argparse type: a number (int or float) from low to high, saying what it must be.

    low_open: low itself is refused ("greater than 0"). The messages name the unit:
    "not a number of seconds: 'x'", "must be between 1 and 999 Hz: 1000".
    """
    noun = "whole number" if kind is int else "number"
    of_unit = f" of {unit}" if unit else ""
    in_unit = f" {unit}" if unit else ""
    lo, hi = _plain(low), _plain(high)
    if high is None:
        rule = f"greater than {lo}" if low_open else f"{lo} or more"
    elif low_open:
        rule = f"more than {lo} and at most {hi}{in_unit}"
    else:
        rule = f"between {lo} and {hi}{in_unit}"

    def value(text: str) -> N:
        try:
            number = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {noun}{of_unit}: {text!r}") from None
        # Written as "within" so that a float NaN (never within) is refused too.
        above_low = low < number if low_open else low <= number
        if not (above_low and (high is None or number <= high)):
            raise argparse.ArgumentTypeError(f"must be {rule}: {text}")
        return number

    return value


def _plain(number: float | None) -> str:
    """86400.0 as 86400: a bound said as the user would type it."""
    return str(int(number)) if isinstance(number, float) and number.is_integer() else str(number)


positive_int = bounded(int, 0, low_open=True)
_seconds = bounded(float, 0.0, float(MAX_DURATION_S), unit="seconds", low_open=True)


def duration_value(text: str) -> float:
    """-d SECONDS; a word there is psql's habit (-d DBNAME), said so."""
    try:
        return _seconds(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}{_duration_hint(text)}") from None


def _duration_hint(text: str) -> str:
    if re.fullmatch(r"[0-9.]+\s*[A-Za-z]+", text.strip()):  # 10s, 5min
        return " (seconds, as a plain number: -d 30)"
    if re.fullmatch(r"[^\s\d.+-][^\s]*", text):
        return f" (-d is the duration in pgprobe; the database is --dbname {text})"
    return ""


def pid_value(text: str) -> int:
    value = positive_int(text)
    if value > 2**22:  # PID_MAX_LIMIT on 64-bit Linux
        raise argparse.ArgumentTypeError(f"not a valid pid: {text}")
    return value


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection (as psql; PG* variables and .pgpass apply)")
    group.add_argument("-h", "--host", help="server host or socket directory")
    group.add_argument("-p", "--port", type=positive_int, help="server port")
    group.add_argument("-U", "--username", help="database user")
    # -d is the duration in every pgprobe tool, so the database name is long-only.
    group.add_argument(
        "--dbname",
        metavar="DBNAME",
        help="a database name, a key=value connection string or a postgresql:// URI (as psql)",
    )


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("targets (default: every process of the cluster)")
    group.add_argument(
        "--pid", type=pid_value, action="append", default=[], help="a backend pid (repeatable)"
    )
    group.add_argument(
        "--backend-type", action="append", default=[], help="e.g. 'client backend', 'walwriter'"
    )
    group.add_argument("--database", action="append", default=[], help="backends of a database")
    group.add_argument("--user", action="append", default=[], help="backends of a user")
    group.add_argument(
        "--application", action="append", default=[], help="backends with this application_name"
    )


def add_capture_arguments(parser: argparse.ArgumentParser, default_duration: float) -> None:
    parser.add_argument(
        "-d",
        "--duration",
        type=duration_value,
        default=default_duration,
        metavar="SECONDS",
        help=f"how long to trace (default {default_duration:g}); Ctrl-C ends early",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--engine",
        choices=["auto", "bpftrace", "dtrace"],
        default="auto",
        help="tracer (auto: on Linux the compiled objects where built, else bpftrace; dtrace "
        "on illumos, Solaris, FreeBSD, macOS; bpftrace: the scripts)",
    )


def add_tracing_arguments(parser: argparse.ArgumentParser, default_duration: float) -> None:
    """What every tracing command takes: connection, targets, duration, --json."""
    add_connection_arguments(parser)
    add_target_arguments(parser)
    add_capture_arguments(parser, default_duration)


def check_interval(ns: argparse.Namespace) -> None:
    """--interval N must fit in the duration (a capture prints a table every N seconds)."""
    if ns.interval and ns.interval > ns.duration:
        raise PgprobeError(
            f"--interval {ns.interval} is longer than the duration ({ns.duration:g} s)",
            EXIT_USAGE,
        )


def conn_options(ns: argparse.Namespace) -> discover.ConnOptions:
    return discover.ConnOptions(host=ns.host, port=ns.port, user=ns.username, dbname=ns.dbname)


def filters(ns: argparse.Namespace) -> discover.Filters:
    return discover.Filters(
        pids=tuple(ns.pid),
        backend_types=tuple(ns.backend_type),
        databases=tuple(ns.database),
        users=tuple(ns.user),
        applications=tuple(ns.application),
    )


def prepare(
    ns: argparse.Namespace,
    check_server: Callable[[Targets], None],
    compiled: str | tuple[str, ...] | None = None,
) -> Targets:
    """Everything that must hold before tracing, cheapest and most telling first. compiled:
    the object (or each part's) that does the capture where it loads (then bpftrace is not
    needed)."""
    tracer = True
    if compiled is not None:  # imported here: libbpf's ctypes and pyelftools, only then
        from pgprobe.engines import compiled as objects

        names = (compiled,) if isinstance(compiled, str) else compiled
        tracer = objects.tracer_needed(ns, names)
    engines.preflight(getattr(ns, "engine", "auto"), tracer)
    timings.mark("preflight")
    targets = discover.discover(conn_options(ns), filters(ns))
    timings.mark("discovery")
    check_server(targets)
    timings.mark("server-checks")
    return targets


def capture(
    ns: argparse.Namespace,
    script: str,
    args: Sequence[int | Path],
    specs: Sequence[MapSpec],
    env: dict[str, str] | None = None,
    cluster_pid: int | None = None,
) -> Capture:
    """Run probe script `script` (a name without extension: bpf/<script>.bt, d/<script>.d).

    Both engines take the same positional parameters and yield the same records.
    cluster_pid: the postmaster, for DTrace for Linux's per-pid USDT probes.
    """
    engine = engines.choose(getattr(ns, "engine", "auto"))
    if engine == "dtrace":
        from pgprobe.engines import dtrace

        return dtrace.DtraceCapture(
            f"{script}.d", args, specs, duration=ns.duration, cluster_pid=cluster_pid
        )
    return bpftrace.BpftraceCapture(f"{script}.bt", args, specs, duration=ns.duration, env=env)


def snapshots(
    running: Capture,
    ns: argparse.Namespace,
    what: str,
    on_live: Callable[[], None] | None = None,
) -> Iterator[tuple[Snapshot, RunInfo]]:
    """The capture's snapshots, with a countdown on a terminal's stderr meanwhile.
    on_live: called once, as soon as the probes are all attached (a tick says so)."""
    delivered = False
    with Countdown(what, ns.duration) as countdown:
        pending = [on_live] if on_live is not None else []

        def tick(info: RunInfo, remaining: float | None) -> None:
            if pending and info.probes_attached:
                pending.pop()()
            countdown.tick(info, remaining)

        running.on_tick = tick
        for event in running.events():
            if isinstance(event, Snapshot):
                delivered = True
                with countdown.paused():
                    yield event, running.info
            elif isinstance(event, Line):
                with countdown.paused():
                    print(literal(event.text), flush=True)
    if not delivered:
        raise nothing_kept(running.info)


def nothing_kept(info: RunInfo) -> PgprobeError:
    """The tracer gave back no results: why, in one line (exit code 6)."""
    engine = info.engine or "the tracer"
    reason = info.ended_early or f"{engine} ended without printing its maps"
    return PgprobeError(f"{reason}: nothing was collected", EXIT_TRACER)


class Countdown:
    """A rich progress bar on stderr while collecting; nothing when not a terminal."""

    def __init__(self, what: str, duration: float) -> None:
        self.what = what
        self.duration = duration
        self.progress: Any = None
        self.task: Any = None

    def __enter__(self) -> Countdown:
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self.progress = Progress(
                TextColumn("{task.description}", markup=False),  # text, never markup
                BarColumn(),
                TextColumn("{task.fields[left]}", markup=False),
                console=Console(stderr=True),
                transient=True,
            )
            self.task = self.progress.add_task(
                f"attaching probes for {self.what}...", total=self.duration, left=""
            )
            self.progress.start()
        return self

    def tick(self, info: RunInfo, remaining: float | None) -> None:
        if self.progress is None or remaining is None:
            return
        self.progress.update(
            self.task,
            description=f"collecting {self.what}",
            completed=self.duration - remaining,
            left=f"{remaining:4.0f} s left (Ctrl-C to stop early)",
        )

    def paused(self) -> _Paused:
        return _Paused(self.progress)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


class _Paused:
    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def __enter__(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.start()


def refresh_if_needed(targets: Targets, needed: bool) -> None:
    """Names for backends that appeared during the capture (from pg_stat_activity)."""
    if needed:
        discover.refresh_backends(targets.cluster)


def meta(targets: Targets, info: RunInfo, snapshot: Snapshot, **extra: Any) -> dict[str, Any]:
    cluster = targets.cluster
    data: dict[str, Any] = {
        "duration_s": round(info.duration_seconds, 3),
        "engine": info.engine,
        "engine_version": info.engine_version,
        "target": "cluster" if targets.whole_cluster else "pids",
        "pids": targets.pids,
        "postmaster_pid": cluster.postmaster_pid,
        "postgres_version": cluster.version,
        "postgres_version_num": cluster.version_num,
        "server_binary": cluster.binary,
        "data_directory": cluster.data_directory,
        "lost_events": info.lost_events,
        "failed_map_updates": info.failed_map_updates,
        "interrupted": info.interrupted,
        "final": snapshot.final,
        "snapshot_time": snapshot.label,
        "attach_s": round(info.attach_seconds, 3),
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "warnings": list(info.warnings),
        # The tracer died: what it printed before is here, and no more.
        "partial": info.partial,
        "tracer_ended_early": info.ended_early,
    }
    data.update({k: v for k, v in extra.items() if v is not None})
    return data


def wall_clock(*monotonic_ns: int) -> list[float]:
    """Moments of the kernel's monotonic clock (the window's edges) as Unix times, to hold
    beside a server log or a client's clock (the offset read now: the clocks move alike)."""
    offset = time.time_ns() - time.monotonic_ns()
    return [round((ns + offset) / 1e9, 6) for ns in monotonic_ns]


def print_json(tool: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print(json.dumps({"tool": tool, "meta": meta, "rows": rows}), flush=True)


def title(what: str, meta: dict[str, Any]) -> str:
    who = (
        "whole cluster"
        if meta["target"] == "cluster"
        else "pids " + ", ".join(str(p) for p in meta["pids"])
    )
    when = f" at {meta['snapshot_time']}" if meta.get("interval") else ""
    stop = ", interrupted" if meta["interrupted"] else ""
    if meta.get("partial"):
        stop += ", PARTIAL (the tracer died: see the warning)"
    return (
        f"{what}{when}: {who} (postmaster {meta['postmaster_pid']}, PostgreSQL "
        f"{meta['postgres_version'].split()[0]}), {meta['duration_s']:.1f} s traced{stop}"
    )


def print_losses(info: RunInfo) -> None:
    """Every loss is said (on stderr, so piped tables stay clean); the tracer's own words
    (warnings, why it ended) can quote names, so they are shown as text."""
    if info.ended_early:
        warn(f"{info.ended_early}: what it printed before is shown, marked partial")
    if info.lost_events:
        warn(f"{info.lost_events} events lost")
    if info.failed_map_updates:
        warn(f"{info.failed_map_updates} updates refused by full BPF maps (counts are low)")
    if info.missed_runs:
        warn(
            f"the kernel skipped {info.missed_runs} runs of the probes "
            "(another BPF program was running on that CPU): those events are lost"
        )
    for warning in info.warnings:
        warn(warning)


def warn(text: str, kind: str = "warning") -> None:
    """``pgprobe: warning: TEXT`` on stderr, one line, names in it shown as text."""
    print(literal(f"pgprobe: {kind}: {text}"), file=sys.stderr, flush=True)
