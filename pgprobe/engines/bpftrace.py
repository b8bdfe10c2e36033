"""The bpftrace engine: run bpf/<tool>.bt with -f json and turn its output into records.

Long because one idea spans it (~415 lines): bpftrace's JSON output, from the live
marker to the answer probe's end marker, parsed into the maps every tool reads.

Only validated values reach bpftrace: integers, and paths pgprobe resolved itself,
passed as positional parameters ($1, $2, ...). Scripts are never edited or
spliced. The capture ends at the end of the duration or on Ctrl-C / SIGTERM:
bpftrace gets SIGINT, prints its maps, and those are still reported.

A script with an answer probe (ANSWER_PROBE below) ends faster: pgprobe sends
bpftrace SIGURG (with sigqueue, engines/sigqueue.py), which bpftrace ignores but
the script's probe on that system call sees: it stops counting there, prints its result maps and
"@@answer"; pgprobe then sends SIGINT and goes on while bpftrace ends
(runner.Answer), instead of waiting for it to detach every probe before END.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pgprobe import histogram
from pgprobe.engines.base import (
    AggValue,
    Event,
    Key,
    KeyKind,
    KeyValue,
    Line,
    Log2Hist,
    MapSpec,
    RunInfo,
    Snapshot,
    Stats,
    TickCallback,
)
from pgprobe.engines.runner import Answer, TracerProcess
from pgprobe.errors import EXIT_ENV, EXIT_INTERRUPTED, EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.scripts import script_path
from pgprobe.stacks import parse_bpftrace_stack

# bpftrace prints this at every start where RLIMIT_MEMLOCK cannot be raised (containers,
# recent kernels that account BPF memory to the cgroup instead): it is not a failure.
BENIGN_STDERR = ("couldn't set RLIMIT_MEMLOCK",)
TRACEFS = Path("/sys/kernel/tracing")
DEBUGFS = Path("/sys/kernel/debug")

Arg = int | Path


def find_bpftrace() -> str:
    """The bpftrace executable: $PGPROBE_BPFTRACE, else the one on PATH."""
    configured = os.environ.get("PGPROBE_BPFTRACE")
    found = configured if configured and os.access(configured, os.X_OK) else None
    found = found or shutil.which("bpftrace")
    if not found:
        raise PgprobeError(
            "bpftrace not found: install it with `apt-get install bpftrace` "
            "(or set PGPROBE_BPFTRACE to its path)",
            EXIT_ENV,
        )
    return found


@functools.lru_cache(maxsize=4)
def bpftrace_version(bpftrace: str) -> str:
    try:
        out = subprocess.run(
            [bpftrace, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().removeprefix("bpftrace ").strip() or "unknown"


def require_root() -> None:
    if os.geteuid() != 0:
        raise PgprobeError(
            "tracing needs root (or CAP_BPF and CAP_PERFMON): run `sudo pgprobe ...`", EXIT_ENV
        )


def ensure_tracefs() -> list[str]:
    """Mount tracefs/debugfs when missing (uprobe detach and tracepoints use them).

    Returns warnings for what could not be mounted, with the command to do it.
    """
    warnings = []
    for path, fstype, source in ((TRACEFS, "tracefs", "nodev"), (DEBUGFS, "debugfs", "none")):
        marker = path / ("uprobe_events" if fstype == "tracefs" else "tracing")
        if marker.exists() or not path.is_dir():
            continue
        done = subprocess.run(
            ["mount", "-t", fstype, source, str(path)], capture_output=True, text=True
        )
        if done.returncode != 0:
            warnings.append(
                f"{fstype} is not mounted and could not be mounted "
                f"(`mount -t {fstype} {source} {path}`): {done.stderr.strip()}"
            )
    return warnings


def validate_args(args: Sequence[Arg]) -> list[str]:
    """Positional parameters as argv strings: ints, or existing absolute paths."""
    out = []
    for arg in args:
        if isinstance(arg, bool) or not isinstance(arg, (int, Path)):
            raise TypeError(f"probe parameters are ints or Paths, not {arg!r}")
        if isinstance(arg, Path):
            text = str(arg)
            # ':' would split bpftrace's attach point; whitespace has no place in our paths.
            if not arg.is_absolute() or not arg.exists() or re.search(r"[\s:\"'\\]", text):
                raise PgprobeError(f"unusable path for a probe: {text!r}", EXIT_USAGE)
            out.append(text)
        else:
            out.append(str(int(arg)))
    return out


class BpftraceCapture:
    """One run of a bpftrace script; iterate `events()` for snapshots and lines."""

    def __init__(
        self,
        script: str,
        args: Sequence[Arg],
        specs: Sequence[MapSpec],
        duration: float | None,
        env: dict[str, str] | None = None,
        on_tick: TickCallback | None = None,
    ) -> None:
        bpftrace = find_bpftrace()
        self.script = script_path("bpf", script)
        self.specs = {f"@{s.name}": s for s in specs}
        self.on_tick = on_tick
        # Called as each `time` message arrives: a window's end (its maps follow), before
        # the previous snapshot is handed over (that happens only then).
        self.on_time: Callable[[], None] | None = None
        self.info = RunInfo(engine="bpftrace")
        # `bpftrace --version` takes 0.2-0.4 s of wall clock (LLVM's libraries load): it
        # runs beside the capture, and the version is filled in when the capture ends.
        self._version = threading.Thread(target=bpftrace_version, args=(bpftrace,), daemon=True)
        self._bpftrace = bpftrace
        # A script that prints LIVE_MARKER from BEGIN (after every probe is attached)
        # is live from then on; bpftrace's own attached_probes comes before it attaches.
        text = self.script.read_text()
        self.live_marker = LIVE_MARKER_PRINTF in text
        answers = ANSWER_MARKER_PRINTF in text and ANSWER_PROBE in text
        self.process = TracerProcess(
            "bpftrace",
            [bpftrace, "-f", "json", "-k", str(self.script), *validate_args(args)],
            {**os.environ, **(env or {})},
            duration,
            self.info,
            benign_stderr=BENIGN_STDERR,
            ends_output=_ends_output,
            answer=Answer(signal.SIGURG, _is_answer_marker) if answers else None,
        )

    def request_stop(self) -> None:
        self.process.request_stop()

    def events(self) -> Iterator[Event]:
        self.info.warnings.extend(ensure_tracefs())
        self.process.on_tick = self.on_tick
        parser = _OutputParser(self.specs, self.info, self.live_marker, self.on_time)
        self._version.start()
        try:
            yield from self.process.run(parser.feed)
        finally:
            self._version.join()
            self.info.engine_version = bpftrace_version(self._bpftrace)
        yield from parser.finish()
        self._check_exit(self.process.returncode or 0, self.process.stderr)

    def _check_exit(self, returncode: int, stderr: list[str]) -> None:
        lost = sum(int(m.group(1)) for ln in stderr if (m := _LOST.search(ln)))
        self.info.lost_events += lost
        problems = [ln for ln in stderr if not _LOST.search(ln)]
        if returncode == 0 or (self.info.probes_attached and returncode == -signal.SIGINT):
            self.info.warnings.extend(problems)
            return
        if not self.info.probes_attached:
            if self.info.interrupted:
                raise PgprobeError("interrupted before the probes were attached", EXIT_INTERRUPTED)
            raise PgprobeError(f"bpftrace failed: {explain(problems)}", EXIT_TRACER)
        if self.info.ended_early is None:  # the runner says how, when it can
            self.info.warnings.append(f"bpftrace exited with status {returncode}")
        self.info.warnings.extend(problems)


def _ends_output(raw: bytes) -> bool:
    """After SIGINT: END's time marker or a map means bpftrace is printing its results.

    (Trace lines, printf, may still be flowing from before the signal.)
    """
    return raw.startswith((b'{"type": "time"', b'{"type": "map"', b'{"type": "hist"',
                           b'{"type": "stats"'))  # fmt: skip


_LOST = re.compile(r"Lost (\d+) events")
# The line a script prints from BEGIN: every probe is attached and counting.
LIVE_MARKER = "@@live"
LIVE_MARKER_PRINTF = f'printf("{LIVE_MARKER}\\n")'
# A script's answer probe: on SIGURG sent to bpftrace (which ignores that signal; @self
# is bpftrace's pid, set in BEGIN), it stops counting, prints its result maps after a
# time() line, then this marker. Its first line, as every script that has one writes it:
ANSWER_PROBE = (
    "tracepoint:syscalls:sys_enter_rt_sigqueueinfo\n/args->pid == @self && args->sig == 23/"
)
ANSWER_MARKER = "@@answer"
ANSWER_MARKER_PRINTF = f'printf("{ANSWER_MARKER}\\n")'
_ANSWER_LINE = json.dumps({"type": "printf", "data": ANSWER_MARKER + "\n"}).encode()


def _is_answer_marker(raw: bytes) -> bool:
    return raw.strip() == _ANSWER_LINE


def explain(stderr_lines: list[str]) -> str:
    """The most useful line of bpftrace's complaint, with a hint for known causes."""
    errors = [ln for ln in stderr_lines if "ERROR" in ln] or stderr_lines or ["no output"]
    text = errors[0].replace("ERROR:", "").strip()
    if "Operation not permitted" in text or "permission" in text.lower():
        text += " (run as root)"
    return text


class _OutputParser:
    """bpftrace -f json messages -> Snapshots and Lines.

    A `time` message opens a snapshot (the scripts print one before each set of
    maps, and in END before bpftrace prints the maps left at exit).
    """

    def __init__(
        self,
        specs: dict[str, MapSpec],
        info: RunInfo,
        live_marker: bool = False,
        on_time: Callable[[], None] | None = None,
    ) -> None:
        self.specs = specs
        self.on_time = on_time
        self.info = info
        self.current: Snapshot | None = None
        self.partial_line = ""
        self.live_marker = live_marker
        self.attached = 0  # what attached_probes said, until the live marker confirms it
        self.twinned: set[str] = set()  # maps of this snapshot whose "_b" twin was printed

    def feed(self, raw: bytes) -> Iterator[Event]:
        raw = raw.strip()
        if not raw:
            return
        try:
            msg = json.loads(raw, object_pairs_hook=_keep_repeated)
        except json.JSONDecodeError:
            self.info.warnings.append(raw.decode(errors="replace")[:200])
            return
        kind, data = msg.get("type"), msg.get("data")
        if kind == "attached_probes":
            self.attached = int(data["probes"])
            if not self.live_marker:
                self.info.probes_attached = self.attached
        elif kind == "time":
            if self.on_time is not None:
                self.on_time()
            if self.current is not None:
                yield self.current
            self.current = Snapshot(label=str(data).strip())
            self.twinned.clear()
        elif kind == "printf":
            yield from self._lines(str(data))
        elif kind in ("map", "hist", "stats"):
            self._add_maps(kind, data)
        elif kind == "lost_events":
            self.info.lost_events += int(data.get("events", 0))
        elif kind == "helper_error":
            if msg.get("helper") == "map_update_elem":
                self.info.failed_map_updates += 1
            else:
                self.info.warnings.append(f"bpf helper {msg.get('helper')} failed")

    def finish(self) -> Iterator[Event]:
        if self.partial_line:
            yield Line(self.partial_line)
            self.partial_line = ""
        if self.current is not None:
            self.current.final = True
            yield self.current
            self.current = None

    def _lines(self, text: str) -> Iterator[Line]:
        text = self.partial_line + text
        *complete, self.partial_line = text.split("\n")
        for line in complete:
            if line == LIVE_MARKER:
                self.info.probes_attached = self.attached or 1
            elif line != ANSWER_MARKER:
                yield Line(line)

    def _add_maps(self, kind: str, data: dict[str, Any]) -> None:
        if self.current is None:
            self.current = Snapshot()
        for printed, body in data.items():
            name = twin_of(printed, self.specs)
            spec = self.specs.get(name)
            key_kinds = spec.key if spec else None
            combine = spec.combine if spec else "sum"
            parsed = parse_map(kind, body, key_kinds, combine)
            if name != printed or name in self.twinned:
                # a map and its twin in one snapshot (an answer, the maps left at exit): one map
                self.twinned.add(name)
                for key, value in self.current.maps.get(name.lstrip("@"), {}).items():
                    both = combine_values(value, parsed[key], combine) if key in parsed else value
                    parsed[key] = both
            self.current.maps[name.lstrip("@")] = parsed


TWIN_SUFFIX = "_b"


def twin_of(name: str, specs: dict[str, MapSpec]) -> str:
    """The map a printed map stands for: itself or, for a "_b" twin (the second buffer
    of a windowed script: bpf/clog_reads.bt's interval probe), the map it doubles."""
    base = name.removesuffix(TWIN_SUFFIX)
    return base if base != name and base in specs and name not in specs else name


class _Repeated(list[Any]):
    """The values of a key that one JSON object holds more than once."""


def _keep_repeated(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object_pairs_hook: a repeated key keeps all its values (json keeps the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key not in out:
            out[key] = value
        elif isinstance(out[key], _Repeated):
            out[key].append(value)
        else:
            out[key] = _Repeated([out[key], value])
    return out


def parse_map(
    kind: str, body: Any, key_kinds: tuple[KeyKind, ...] | None, combine: str = "sum"
) -> dict[Key, AggValue]:
    """One map of bpftrace's JSON into {typed key tuple: value}.

    Entries whose keys print the same are one row: their values are combined
    (summed, or the max / min for max() / min() maps), so no count is dropped.
    """
    if _is_keyless(kind, body):
        return {(): parse_value(kind, body)}
    out: dict[Key, AggValue] = {}
    for raw, value in body.items():
        key = split_key(raw, key_kinds)
        values = value if isinstance(value, _Repeated) else [value]
        for one in values:
            parsed = parse_value(kind, one)
            out[key] = combine_values(out[key], parsed, combine) if key in out else parsed
    return out


def combine_values(a: AggValue, b: AggValue, combine: str) -> AggValue:
    """Two values of one aggregation that belong to the same printed key."""
    if combine == "last":
        return b
    if isinstance(a, Stats) and isinstance(b, Stats):
        return Stats(a.count + b.count, a.total + b.total)
    if isinstance(a, Log2Hist) and isinstance(b, Log2Hist):
        return histogram.merge((a, b))
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b) if combine == "max" else min(a, b) if combine == "min" else a + b
    raise ValueError(f"cannot combine {a!r} and {b!r}")


def _is_keyless(kind: str, body: Any) -> bool:
    if kind == "hist":
        return isinstance(body, list)
    if kind == "stats":
        return (
            isinstance(body, dict)
            and set(body) == {"count", "average", "total"}
            and all(isinstance(v, int) for v in body.values())
        )
    return not isinstance(body, dict)


def parse_value(kind: str, value: Any) -> AggValue:
    if kind == "stats":
        return Stats(count=int(value["count"]), total=int(value["total"]))
    if kind == "hist":
        return Log2Hist(tuple(_bucket(b) for b in value))
    if isinstance(value, list):  # a tuple value
        return tuple(int(v) for v in value)
    return int(value)


_NEG_INF = -(2**63)
_POS_INF = 2**64 - 1


def _bucket(b: dict[str, int]) -> tuple[int, int, int]:
    # bpftrace leaves out "min" for the negative bucket and "max" for the last one.
    return (int(b.get("min", _NEG_INF)), int(b.get("max", _POS_INF)), int(b["count"]))


def split_key(raw: str, kinds: tuple[KeyKind, ...] | None) -> Key:
    """'1234,WALWrite,Exclusive' -> (1234, 'WALWrite', 'Exclusive') per the declared kinds.

    bpftrace joins key fields with commas; a text or stack field may itself hold
    commas, so the first such field takes whatever the fixed fields leave over.
    """
    if not kinds:
        return (raw,)
    parts = raw.split(",")
    free = next((i for i, k in enumerate(kinds) if k in ("str", "stack")), None)
    if free is not None and len(parts) > len(kinds):
        tail = len(kinds) - free - 1
        middle = ",".join(parts[free : len(parts) - tail])
        parts = [*parts[:free], middle, *parts[len(parts) - tail :]]
    if len(parts) != len(kinds):
        raise ValueError(f"map key {raw!r} does not have {len(kinds)} fields")
    return tuple(_convert(text, kind) for text, kind in zip(parts, kinds, strict=True))


def _convert(text: str, kind: KeyKind) -> KeyValue:
    if kind == "int":
        return int(text)
    if kind == "stack":
        return parse_bpftrace_stack(text)
    return text
