"""DTrace for Linux's formats and pgprobe's per-platform choices, without running DTrace.

The fixtures tests/fixtures/dtrace/linux_*.out are real outputs of the d/
scripts in DTrace for Linux 2.0.7 (recorded with samples/*_d_example.txt):
frames at column 0, "@@end" after END's output. tests/test_dtrace_live.py
runs the scripts themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgprobe.engines.base import Line, Log2Hist, NamedStack, RunInfo, Snapshot, Stats
from pgprobe.engines.dtrace import DtraceOutput, is_frame, parse_ustack_aggregation, perpid
from pgprobe.engines.dtrace.platform import _VERSION
from pgprobe.errors import PgprobeError
from pgprobe.tools import clog_reads, lwlocks, profiling

FIXTURES = Path(__file__).parent / "fixtures" / "dtrace"


def parse(name: str, specs: tuple[object, ...]) -> tuple[list[Snapshot], list[Line], RunInfo]:
    info = RunInfo(engine="dtrace")
    parser = DtraceOutput({s.name: s for s in specs}, info)  # type: ignore[attr-defined]
    events = []
    for line in (FIXTURES / name).read_text().splitlines():
        events.extend(parser.feed(line))
    events.extend(parser.finish())
    assert parser.complete
    snapshots = [e for e in events if isinstance(e, Snapshot)]
    lines = [e for e in events if isinstance(e, Line)]
    return snapshots, lines, info


def test_profile_stacks_at_column_0() -> None:
    (final,), lines, info = parse("linux_profile.out", profiling.MAPS)
    assert not lines and not info.warnings and info.probes_attached == 1
    stacks = final.get("stacks")
    assert sum(stacks.values()) == 40  # 40 records of one sample each
    keys = list(stacks)
    assert all(isinstance(k[1], NamedStack) and k[0] == 17588 for k in keys)
    lengths = sorted(len(k[1].frames) for k in keys)  # type: ignore[union-attr]
    assert lengths[0] >= 1 and lengths[-1] >= 10  # one-frame (libcrypto) and full stacks
    frames = {f for k in keys for f in k[1].frames}  # type: ignore[union-attr]
    assert "postgres`md5_text+0x54" in frames and "postgres`main+0x216" in frames
    assert final.get("samples")[()] == 1207


def test_clog_reads_stacks_and_histogram() -> None:
    (final,), _, info = parse("linux_clog_reads_stacks.out", clog_reads.MAPS)
    assert not info.warnings
    key = (11888, "pg_xact/0000")
    stats = final.get("read_stats")[key]
    assert isinstance(stats, Stats) and stats.count == 24
    assert final.get("read_bytes")[key] == 24 * 8192
    hist = final.get("read_ns")[key]
    assert isinstance(hist, Log2Hist) and sum(c for _, _, c in hist.buckets) == 24
    (((pid, stack), count),) = final.get("read_stacks").items()
    assert (pid, count) == (11888, 24)
    assert isinstance(stack, NamedStack)
    assert stack.frames[:2] == ("libc.so.6`pread+0x13", "postgres`SimpleLruReadPage+0xf6")


def test_lwlock_wait_records() -> None:
    (final,), _, info = parse("linux_lwlock_wait.out", lwlocks.MAPS)
    assert not info.warnings
    rows = {(r.tranche, r.mode): r.waits for r in lwlocks.records(final)}
    assert rows[("LockManager", "Exclusive")] == 174
    assert rows[("WALWrite", "Exclusive")] == 2


@pytest.mark.parametrize(
    "text, frame",
    [
        ("postgres`ExecScan+0x8c", True),
        ("libc.so.6`0x7f55a2a4724a", True),
        ("0x7fffbf7ff62a", True),
        ("libcrypto.so.3`MD5_Update", True),
        ("1234\t5678\tpg_xact/0000\t0\t8192\t1200", False),  # a clog_reads trace line
        ("@stacks\t17588\t1", False),
        ("--", False),
    ],
)
def test_frames_by_shape(text: str, frame: bool) -> None:
    assert is_frame(text) is frame


def test_hand_captured_stacks_at_column_0() -> None:
    text = "libc.so.6`pread+0x13\npostgres`SimpleLruReadPage+0xf6\n\n  7\n\n0x7f0\n  2\n"
    got = parse_ustack_aggregation(text)
    assert got == {
        NamedStack(("libc.so.6`pread+0x13", "postgres`SimpleLruReadPage+0xf6")): 7,
        NamedStack(("0x7f0",)): 2,
    }


@pytest.mark.parametrize(
    "said, version",
    [
        ("dtrace: Sun D 1.13", "Sun D 1.13"),
        ("dtrace: D 2.0.7", "D 2.0.7"),
        ("Usage: dtrace [--help] [-h | -G] [-C [-I<Path>]]", None),  # systemtap's
    ],
)
def test_versions(said: str, version: str | None) -> None:
    found = _VERSION.search(said)
    assert (found.group(0) if found else None) == version


def test_per_pid_descriptions() -> None:
    script = "postgresql*:::lwlock-wait-start\n/pid/\n{}\npostgresql*:::lwlock-wait-done\n{}"
    assert perpid.uses_usdt(script)
    out = perpid.per_pid(script, [12, 7])
    assert out.startswith("postgresql7:::lwlock-wait-start,\npostgresql12:::lwlock-wait-start\n")
    assert "postgresql7:::lwlock-wait-done,\npostgresql12:::lwlock-wait-done\n{}" in out
    assert "*" not in out
    with pytest.raises(PgprobeError, match="no running process has the postgresql"):
        perpid.per_pid(script, [])


def test_platform_libraries_define_the_same_inlines() -> None:
    d = Path(__file__).resolve().parent.parent / "d" / "lib"
    names = {}
    for platform in ("linux", "fds"):
        text = (d / platform / "pgprobe_fd.d").read_text()
        names[platform] = {
            line.split("[")[0].split()[-1]
            for line in text.splitlines()
            if line.startswith("inline string")
        }
    assert (
        names["linux"]
        == names["fds"]
        == {
            "pgprobe_fd_dir",
            "pgprobe_fd_parent",
            "pgprobe_fd_name",
        }
    )
