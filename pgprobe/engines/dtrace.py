"""The DTrace engine (illumos, Solaris, FreeBSD, macOS): run d/<tool>.d, parse its printa text.

Running: ``dtrace -q -s d/<tool>.d ARG1 ARG2 ...`` with exactly the positional
parameters the bpftrace engine gives bpf/<tool>.bt (integers, and paths pgprobe
resolved itself), which the script reads as macro arguments ($1, $2, ...; a
path as $$1). Nothing is spliced into a script. No -p: the postgresql provider
is per process (postgresql<PID>); the scripts enable ``postgresql*`` with a
pid/ppid predicate, which also takes in backends forked during the capture.
The capture ends at the end of the duration or on Ctrl-C / SIGTERM: dtrace gets
SIGINT, runs the END clause (which prints the aggregations) and exits.

Output layout (every d/ script prints only this; see each script's header).
Lines, fields separated by tabs::

    @@attached <TAB> <script> [...]       BEGIN: every probe is enabled
    @@snapshot <TAB> <%Y walltimestamp>   opens a snapshot (interval or END)
    @<map> <TAB> <key>... <TAB> <value>   count()/sum()/max() via printa %@d
    @<map>:count <TAB> <key>... <TAB> <n>     the two halves of one Stats
    @<map>:total <TAB> <key>... <TAB> <sum>   (bpftrace's stats()): count(), sum()
    @<map> <TAB> <key>...                 then DTrace's quantize table (%@d):
                                              value  --- Distribution --- count
                                                 1024 |@@@@@@        12
    @<map> <TAB> <scalar keys> <TAB> <count>  then the stack frames (%k), one
                                          a line, indented; several stack
                                          fields are separated by a line "--"
    anything else                         a Line (trace modes: printf lines)

Records become exactly what the bpftrace engine gives for the same script:
the same map names and key tuples (fields typed by the tool's MapSpec),
Stats(count, total), int, and Log2Hist with bpftrace's buckets: DTrace's
quantize rows are power-of-two low bounds, mapped to (low, high) = (0, 0),
(1, 1), (2, 3), (4, 7), ...; the zero rows DTrace prints around the data are
dropped and the zero rows between kept (as bpftrace's JSON has them); negative
rows are summed into bpftrace's one negative bucket. Stack fields are
NamedStack (frames already named by DTrace) where bpftrace gives raw
addresses: see engines.base.KeyKind.

Losses and errors come on stderr: "dtrace: N drops on CPU M" (principal
buffer: lost events), "N aggregation drops on CPU M" (failed map updates),
"N dynamic variable drops" (thread-local state lost: events not timed, lost
events), "error on enabled probe ID ..." (an action faulted: a warning with a
count). Failures before BEGIN are explained in one line (privileges, a server
built without --enable-dtrace, macOS System Integrity Protection, FreeBSD
without the dtrace modules).

Also here, for DTrace output captured by hand: parse_ustack_aggregation()
reads the default output of ``@[ustack()] = count()`` (stack blocks, each
followed by its count), as FlameGraph's stackcollapse.pl does.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pgprobe.engines.base import (
    Event,
    Key,
    KeyKind,
    KeyValue,
    Line,
    Log2Hist,
    MapSpec,
    NamedStack,
    RunInfo,
    Snapshot,
    Stats,
    TickCallback,
)
from pgprobe.engines.bpftrace import validate_args
from pgprobe.engines.runner import TracerProcess
from pgprobe.errors import EXIT_ENV, EXIT_TRACER, PgprobeError
from pgprobe.scripts import script_path

# Where DTrace lives when it is not on a non-root user's PATH.
DTRACE_PATHS = ("/usr/sbin/dtrace", "/usr/bin/dtrace", "/sbin/dtrace")

Arg = int | Path


# -- finding DTrace and the right to use it ------------------------------------------------


def find_dtrace() -> str:
    """The dtrace executable: $PGPROBE_DTRACE, else PATH, else /usr/sbin/dtrace."""
    configured = os.environ.get("PGPROBE_DTRACE")
    found = configured if configured and os.access(configured, os.X_OK) else None
    found = found or shutil.which("dtrace")
    found = found or next((p for p in DTRACE_PATHS if os.access(p, os.X_OK)), None)
    if not found:
        raise PgprobeError(
            "dtrace not found: DTrace comes with illumos, Solaris, FreeBSD and macOS "
            "(on Linux use --engine bpftrace; or set PGPROBE_DTRACE to its path)",
            EXIT_ENV,
        )
    return found


def dtrace_version(dtrace: str) -> str:
    """What `dtrace -V` says ("Sun D 1.13"); refuses a `dtrace` that is not DTrace.

    systemtap-sdt-dev installs a /usr/bin/dtrace on Linux that only generates
    USDT headers: it must not be mistaken for the tracer.
    """
    try:
        done = subprocess.run([dtrace, "-V"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PgprobeError(f"cannot run {dtrace} -V: {exc}", EXIT_ENV) from None
    said = (done.stdout + done.stderr).strip()
    match = re.search(r"Sun D [0-9][0-9.]*", said)
    if not match:
        first = said.splitlines()[0] if said else "nothing"
        raise PgprobeError(
            f"{dtrace} is not DTrace (`dtrace -V` said: {first}); on Linux, systemtap's "
            "dtrace only generates probe headers: use --engine bpftrace",
            EXIT_ENV,
        )
    return match.group(0)


def _solaris_privileges() -> set[str]:
    """The effective privileges of this process on illumos/Solaris (ppriv)."""
    try:
        out = subprocess.run(
            ["ppriv", str(os.getpid())], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    for line in out.splitlines():
        label, _, privs = line.strip().partition(":")
        if label == "E":
            return {p.strip() for p in privs.split(",")}
    return set()


def require_privileges() -> None:
    """Root, or on illumos/Solaris the dtrace_proc and dtrace_user privileges."""
    if os.geteuid() == 0:
        return
    if platform.system() == "SunOS":
        have = _solaris_privileges()
        if "all" in have or {"dtrace_proc", "dtrace_user"} <= have:
            return
        raise PgprobeError(
            "DTrace needs root, or the dtrace_proc and dtrace_user privileges "
            "(usermod -K defaultpriv=basic,dtrace_proc,dtrace_user USER): "
            "run `pfexec pgprobe ...` or `sudo pgprobe ...`",
            EXIT_ENV,
        )
    raise PgprobeError("DTrace needs root: run `sudo pgprobe ...`", EXIT_ENV)


def preflight() -> None:
    """Fail early, in one line, when DTrace cannot run here."""
    require_privileges()
    dtrace_version(find_dtrace())


# -- stderr: losses, warnings, failures -----------------------------------------------------

_DROPS = re.compile(r"dtrace: (\d+) (aggregation |dynamic variable |speculative )?drops?\b")
_PROBE_ERROR = re.compile(r"dtrace: error on enabled probe ID")
_MATCHED = re.compile(r"matched (\d+) probes?")
_SIP = "system integrity protection is on"

MACOS_SIP_HINT = (
    "macOS System Integrity Protection restricts DTrace: in Recovery, run "
    "`csrutil enable --without dtrace` (or disable SIP), then retry"
)
NO_PROVIDER_HINT = (
    "no postgresql provider: the PostgreSQL server was built without --enable-dtrace "
    "(FreeBSD's packages are: rebuild databases/postgresqlNN-server with the DTRACE "
    "option), or none of its processes was running"
)


@dataclass
class StderrReport:
    """What dtrace said on stderr, sorted into losses, warnings and problems."""

    lost_events: int = 0
    failed_map_updates: int = 0
    probe_errors: int = 0
    first_probe_error: str = ""
    sip: bool = False
    matched: int = 0
    problems: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        out = []
        if self.probe_errors:
            out.append(
                f"{self.probe_errors} errors in probe actions (events not counted), "
                f"first: {self.first_probe_error}"
            )
        if self.sip:
            out.append("macOS System Integrity Protection is on: some probes may be missing")
        return out + self.problems


def classify_stderr(lines: Iterable[str]) -> StderrReport:
    report = StderrReport()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if m := _DROPS.search(line):
            kind = m.group(2) or ""
            if kind == "aggregation ":
                report.failed_map_updates += int(m.group(1))
            else:
                report.lost_events += int(m.group(1))
        elif _PROBE_ERROR.search(line):
            report.probe_errors += 1
            report.first_probe_error = report.first_probe_error or line.removeprefix("dtrace: ")
        elif _SIP in line:
            report.sip = True
        elif (m := _MATCHED.search(line)) and "script" in line:
            report.matched += int(m.group(1))
        else:
            report.problems.append(line)
    return report


def explain_failure(report: StderrReport) -> PgprobeError:
    """One line for a dtrace that failed before its probes were enabled."""
    text = (report.problems or ["dtrace exited without a word"])[0].removeprefix("dtrace: ")
    lowered = text.lower()
    sip = f"; {MACOS_SIP_HINT}" if report.sip else ""
    if "additional privileges" in lowered or "permission denied" in lowered:
        return PgprobeError(
            f"DTrace refused: {text}: run as root (illumos/Solaris: or with the "
            f"dtrace_proc and dtrace_user privileges){sip}",
            EXIT_ENV,
        )
    if "does not match any probes" in lowered and "postgresql" in lowered:
        return PgprobeError(f"DTrace: {text}: {NO_PROVIDER_HINT}{sip}", EXIT_ENV)
    if "device not available" in lowered or "failed to initialize dtrace" in lowered:
        hint = (
            ": load the DTrace modules with `kldload dtraceall`"
            if platform.system() == "FreeBSD" or "device" in lowered
            else ""
        )
        return PgprobeError(f"DTrace could not start: {text}{hint}{sip}", EXIT_ENV)
    return PgprobeError(f"dtrace failed: {text}{sip}", EXIT_TRACER)


# -- the output layout -----------------------------------------------------------------------

_NEG_INF = -(2**63)
_HIST_ROW = re.compile(r"^\s*(-?\d+)\s+\|[@|\s]*?\s(\d+)\s*$")
_HIST_HEADER = re.compile(r"\bvalue\s+-+\s*Distribution\s*-+\s+count\b")
_LABEL_TIME = re.compile(r"\b(\d\d:\d\d:\d\d)\b")


def quantize_buckets(rows: Sequence[tuple[int, int]]) -> Log2Hist:
    """DTrace quantize() rows (low bound, count) -> a Log2Hist shaped like bpftrace's.

    Rows are 0, 1, 2, 4, 8, ... (and -1, -2, -4, ... for negative values).
    Leading and trailing zero rows are dropped, zero rows in between are
    kept; negative rows become one (-2**63, -1) bucket, bpftrace's.
    """
    negative = 0
    buckets: list[tuple[int, int, int]] = []
    for value, count in rows:
        if value < 0:
            if -value & (-value - 1):
                raise ValueError(f"not a quantize() row: {value}")
            negative += count
        elif value == 0:
            buckets.append((0, 0, count))
        elif value & (value - 1):
            raise ValueError(f"not a quantize() row (not a power of two): {value}")
        else:
            buckets.append((value, 2 * value - 1, count))
    if negative:
        buckets.insert(0, (_NEG_INF, -1, negative))
    while buckets and buckets[0][2] == 0:
        buckets.pop(0)
    while buckets and buckets[-1][2] == 0:
        buckets.pop()
    return Log2Hist(tuple(buckets))


def _convert(text: str, kind: KeyKind | None) -> KeyValue:
    if kind == "int":
        return int(text.strip())
    return text


@dataclass
class _Hist:
    name: str
    key: Key
    rows: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Stacks:
    name: str
    key: Key  # the scalar fields
    value: int
    stacks: list[list[str]] = field(default_factory=lambda: [[]])


class DtraceOutput:
    """The d/ scripts' output lines -> Snapshots and Lines (see the module docstring)."""

    def __init__(self, specs: dict[str, MapSpec], info: RunInfo) -> None:
        self.specs = specs
        self.info = info
        self.current: Snapshot | None = None
        self.pending: _Hist | _Stacks | None = None
        self.halves: dict[str, dict[Key, list[int | None]]] = {}
        self.unparsed = 0  # records not in the layout: said once, at the end
        self.first_unparsed = ""

    # feeding ---------------------------------------------------------------------------

    def feed(self, line: str) -> Iterator[Event]:
        line = line.rstrip("\r\n")
        if isinstance(self.pending, _Hist) and self._hist_line(self.pending, line):
            return
        if isinstance(self.pending, _Stacks) and self._stack_line(self.pending, line):
            return
        self._close_pending_or_warn()
        if not line.strip():
            return  # the blank lines %@d and %k leave around tables and stacks
        if line.startswith("@@"):
            yield from self._control(line)
        elif line.startswith("@"):
            try:
                self._record(line)
            except ValueError as exc:
                self._not_understood(line, exc)
        else:
            yield Line(line)

    def finish(self) -> Iterator[Event]:
        self._close_pending_or_warn()
        if self.unparsed:
            self.info.warnings.append(
                f"{self.unparsed} records of dtrace's output not understood (left out), "
                f"first: {self.first_unparsed}"
            )
            self.unparsed = 0
        if self.current is not None:
            self._close_halves()
            self.current.final = True
            yield self.current
            self.current = None

    # control lines ----------------------------------------------------------------------

    def _control(self, line: str) -> Iterator[Event]:
        tag, _, rest = line.partition("\t")
        if tag == "@@attached":
            self.info.probes_attached = max(self.info.probes_attached, 1)
        elif tag == "@@snapshot":
            if self.current is not None:
                self._close_halves()
                yield self.current
            found = _LABEL_TIME.search(rest)
            self.current = Snapshot(label=found.group(1) if found else rest.strip())
        else:
            self.info.warnings.append(f"unknown control line from the D script: {line[:200]}")

    # records ----------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        if self.current is None:  # records before any marker: still keep them
            self.current = Snapshot()
        return self.current

    def _record(self, line: str) -> None:
        header = _HIST_HEADER.search(line)
        if header:  # a quantize table printed with no newline before its header
            line = line[: header.start()].rstrip()
        tag, *fields = line.split("\t")
        name, _, half = tag[1:].partition(":")
        spec = self.specs.get(name)
        kinds: tuple[KeyKind, ...] | None = spec.key if spec else None
        if kinds is not None and "stack" in kinds:
            self.pending = self._stack_record(name, kinds, fields)
            return
        if kinds is None:  # a map the tool did not declare: text keys, value last
            has_value = bool(fields) and fields[-1].strip().lstrip("-").isdigit()
            text: KeyKind = "str"
            kinds = (text,) * (len(fields) - 1 if has_value else len(fields))
        n = len(kinds)
        key = tuple(_convert(f, k) for f, k in zip(fields[:n], kinds, strict=False))
        if len(key) != n:
            raise ValueError(f"record {line!r} has fewer than {n} key fields")
        tail = fields[n:]
        if not tail:
            self.pending = _Hist(name, key)
            return
        if len(tail) != 1:
            raise ValueError(f"record {line!r} has more than {n} key fields and a value")
        value = int(tail[0].strip())
        if half in ("count", "total"):
            slot = self.halves.setdefault(name, {}).setdefault(key, [None, None])
            slot[0 if half == "count" else 1] = value
        elif half:
            raise ValueError(f"unknown record kind {tag!r}")
        else:
            self._snapshot().maps.setdefault(name, {})[key] = value

    def _stack_record(self, name: str, kinds: tuple[KeyKind, ...], fields: list[str]) -> _Stacks:
        first = kinds.index("stack")
        if any(k != "stack" for k in kinds[first:]):
            raise ValueError(f"map {name}: stack fields must come last in the key")
        scalar_kinds = kinds[:first]
        if len(fields) < first + 1:
            raise ValueError(f"stack record of {name} without a count: {fields!r}")
        key = tuple(_convert(f, k) for f, k in zip(fields[:first], scalar_kinds, strict=True))
        # The count, and perhaps the first frame if %k printed no leading newline.
        count_text, _, frame = "\t".join(fields[first:]).strip().partition(" ")
        record = _Stacks(name, key, int(count_text))
        if frame.strip():
            record.stacks[0].append(frame.strip())
        return record

    def _hist_line(self, hist: _Hist, line: str) -> bool:
        if not line.strip() or _HIST_HEADER.search(line):
            return True
        row = _HIST_ROW.match(line)
        if not row:
            return False
        hist.rows.append((int(row.group(1)), int(row.group(2))))
        return True

    def _stack_line(self, record: _Stacks, line: str) -> bool:
        text = line.strip()
        if not text:
            return True
        if text.startswith("--"):
            record.stacks.append([])
            text = text[2:].strip()
            if text:
                record.stacks[-1].append(text)
            return True
        if line[0] in " \t":
            record.stacks[-1].append(text)
            return True
        return False

    def _not_understood(self, text: str, exc: ValueError) -> None:
        self.unparsed += 1
        self.first_unparsed = self.first_unparsed or f"{text[:120]!r} ({exc})"

    def _close_pending_or_warn(self) -> None:
        name = self.pending.name if self.pending is not None else ""
        try:
            self._close_pending()
        except ValueError as exc:
            self._not_understood(f"@{name}", exc)

    def _close_pending(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            return
        maps = self._snapshot().maps.setdefault(pending.name, {})
        if isinstance(pending, _Hist):
            maps[pending.key] = quantize_buckets(pending.rows)
            return
        spec = self.specs[pending.name]
        wanted = spec.key.count("stack")
        stacks = pending.stacks
        if len(stacks) != wanted:
            raise ValueError(
                f"stack record of {pending.name} has {len(stacks)} stacks, expected {wanted}"
            )
        key = pending.key + tuple(NamedStack(tuple(s)) for s in stacks)
        maps[key] = pending.value

    def _close_halves(self) -> None:
        if not self.halves:
            return
        snapshot = self._snapshot()
        for name, entries in self.halves.items():
            target = snapshot.maps.setdefault(name, {})
            for key, (count, total) in entries.items():
                if count is None or total is None:
                    self.info.warnings.append(
                        f"{name}: only one of count/total printed for {key!r}"
                    )
                target[key] = Stats(count=count or 0, total=total or 0)
        self.halves = {}


# -- hand-captured DTrace output -------------------------------------------------------------


def parse_ustack_aggregation(text: str) -> dict[NamedStack, int]:
    """The default output of ``@[ustack()] = count()`` -> {stack: count}.

    DTrace prints each key stack as indented frame lines, then the count on a
    line of its own; blank lines separate the entries. Lines before the first
    stack (a "dtrace: script ... matched" line, a header) are ignored.
    Repeated stacks (several printa or aggregations) add up.
    """
    out: dict[NamedStack, int] = {}
    frames: list[str] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped:
            continue
        if stripped.isdigit() and frames:
            stack = NamedStack(tuple(frames))
            out[stack] = out.get(stack, 0) + int(stripped)
            frames = []
        elif raw[:1] in (" ", "\t") and not stripped.isdigit():
            frames.append(stripped)
        else:
            frames = []  # not part of a stack block
    return out


# -- running ---------------------------------------------------------------------------------


# After SIGINT, how long dtrace may take to run END and print (naming thousands of
# user stacks through libproc can take a while) before it is killed. It gets SIGINT
# once: dtrace(1M) takes a second one as impatience and quits without END's output.
STOP_KILL_S = 60.0


class DtraceCapture:
    """One run of a D script; iterate `events()` for snapshots and lines."""

    def __init__(
        self,
        script: str,
        args: Sequence[Arg],
        specs: Sequence[MapSpec],
        duration: float | None,
        env: dict[str, str] | None = None,
        on_tick: TickCallback | None = None,
    ) -> None:
        dtrace = find_dtrace()
        self.script = script_path("d", script)
        self.specs = {s.name: s for s in specs}
        self.on_tick = on_tick
        self.info = RunInfo(engine="dtrace", engine_version=dtrace_version(dtrace))
        self.process = TracerProcess(
            "dtrace",
            [dtrace, "-q", "-s", str(self.script), *validate_args(args)],
            {**os.environ, **(env or {})},
            duration,
            self.info,
            resend_sigint=False,
            kill_after_s=STOP_KILL_S,
        )

    def request_stop(self) -> None:
        self.process.request_stop()

    def events(self) -> Iterator[Event]:
        self.process.on_tick = self.on_tick
        parser = DtraceOutput(self.specs, self.info)
        yield from self.process.run(lambda raw: parser.feed(raw.decode(errors="replace")))
        self._check_exit(self.process.returncode or 0)
        yield from parser.finish()

    def _check_exit(self, returncode: int) -> None:
        report = classify_stderr(self.process.stderr)
        self.info.lost_events += report.lost_events
        self.info.failed_map_updates += report.failed_map_updates
        if report.matched:
            self.info.probes_attached = report.matched
        if not self.info.probes_attached:
            raise explain_failure(report)
        self.info.warnings.extend(report.warnings())
        if returncode not in (0, -signal.SIGINT):
            self.info.warnings.append(f"dtrace exited with status {returncode}")
