"""The DTrace engine's parsing, on fixtures written to DTrace's documented output format.

The fixtures under tests/fixtures/dtrace/ are what the d/ scripts print
(printa lines, quantize tables, ustack blocks), in the style of the DTrace
outputs PostgreSQL people have posted since 2007: LWLock wait tables, hotuser
counts, user stacks through SimpleLruReadPage, hex-only frames of a backend
that exited. They were written, not recorded: no DTrace runs here (see
test_dtrace_format.py for the writer and the layout it follows).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgprobe import stacks
from pgprobe.discover import Cluster, Targets
from pgprobe.engines.base import (
    Event,
    Line,
    Log2Hist,
    MapSpec,
    NamedStack,
    RunInfo,
    Snapshot,
    Stats,
)
from pgprobe.engines.dtrace import (
    DtraceOutput,
    classify_stderr,
    explain_failure,
    parse_ustack_aggregation,
    quantize_buckets,
)
from pgprobe.errors import EXIT_ENV, EXIT_TRACER
from pgprobe.symbolize import folded_names
from pgprobe.tools import lwlocks

FIXTURES = Path(__file__).parent / "fixtures" / "dtrace"

CLOG_SPECS = (
    MapSpec("read_stats", ("int", "str")),
    MapSpec("read_bytes", ("int", "str")),
    MapSpec("read_max_ns", ("int", "str")),
    MapSpec("read_ns", ("int", "str")),
    MapSpec("open_errors", ("int", "str")),
    MapSpec("read_stacks", ("int", "stack")),
)
PROFILE_SPECS = (
    MapSpec("samples", ()),
    MapSpec("stacks", ("int", "stack")),
    MapSpec("kstacks", ("int", "stack", "stack")),
)


def parse_text(text: str, specs: tuple[MapSpec, ...]) -> tuple[list[Event], RunInfo]:
    info = RunInfo()
    parser = DtraceOutput({s.name: s for s in specs}, info)
    events: list[Event] = []
    for line in text.splitlines():
        events.extend(parser.feed(line))
    events.extend(parser.finish())
    return events, info


def parse_fixture(name: str, specs: tuple[MapSpec, ...]) -> tuple[list[Event], RunInfo]:
    return parse_text((FIXTURES / name).read_text(), specs)


def snapshots(events: list[Event]) -> list[Snapshot]:
    return [e for e in events if isinstance(e, Snapshot)]


# -- quantize ---------------------------------------------------------------------------------


def test_quantize_rows_map_to_bpftrace_buckets() -> None:
    rows = [(0, 2), (1, 1), (2, 3), (4, 0), (8, 5)]
    expected = ((0, 0, 2), (1, 1, 1), (2, 3, 3), (4, 7, 0), (8, 15, 5))
    assert quantize_buckets(rows).buckets == expected


def test_quantize_drops_the_zero_rows_around_the_data_and_keeps_those_between() -> None:
    rows = [(512, 0), (1024, 4), (2048, 0), (4096, 0), (8192, 1), (16384, 0)]
    hist = quantize_buckets(rows)
    assert hist.buckets == ((1024, 2047, 4), (2048, 4095, 0), (4096, 8191, 0), (8192, 16383, 1))
    assert hist.count == 5


def test_quantize_negative_rows_become_bpftraces_single_negative_bucket() -> None:
    hist = quantize_buckets([(-4, 1), (-2, 2), (-1, 3), (0, 0), (1, 4), (2, 0)])
    assert hist.buckets[0] == (-(2**63), -1, 6)
    assert hist.buckets[1:] == ((0, 0, 0), (1, 1, 4))


def test_quantize_refuses_rows_that_are_not_powers_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        quantize_buckets([(1000, 3)])  # an lquantize()/llquantize() row


# -- lwlock_wait.d ----------------------------------------------------------------------------


def test_lwlock_whole_cluster_table() -> None:
    events, info = parse_fixture("lwlock_wait.out", lwlocks.MAPS)
    assert info.probes_attached == 1
    (snap,) = snapshots(events)
    assert snap.final and snap.label == "23:44:27"
    stats = snap.get("wait_stats")
    assert len(stats) == 11
    top = (0, "WALWrite", "Exclusive")
    assert stats[top] == Stats(count=1677, total=116711187)
    assert snap.get("wait_max_ns")[top] == 1074123
    for key, value in stats.items():
        assert isinstance(value, Stats)
        pid, tranche, mode = key
        assert pid == 0 and isinstance(tranche, str)
        assert mode in ("Exclusive", "Shared", "WaitUntilFree")
        hist = snap.get("wait_ns")[key]
        assert isinstance(hist, Log2Hist)
        assert hist.count == value.count  # the histogram holds every wait
        maximum = snap.get("wait_max_ns")[key]
        assert isinstance(maximum, int)
        assert hist.buckets[-1][0] <= maximum <= hist.buckets[-1][1]
        assert hist.buckets[0][2] and hist.buckets[-1][2]  # no zero rows at the ends
    assert not [e for e in events if isinstance(e, Line)]


def test_lwlock_interval_by_pid_splits_into_snapshots() -> None:
    events, _ = parse_fixture("lwlock_wait_by_pid_interval.out", lwlocks.MAPS)
    snaps = snapshots(events)
    assert [s.label for s in snaps] == ["23:44:19", "23:44:21", "23:44:22"]
    assert [s.final for s in snaps] == [False, False, True]
    pids = {k[0] for s in snaps for k in s.get("wait_stats")}
    assert pids == {15710, 15711, 15713, 15716, 15717}
    assert {k[0] for k in snaps[-1].get("wait_stats")} == {15710, 15711}
    for snap in snaps:
        assert (
            set(snap.get("wait_stats")) == set(snap.get("wait_ns")) == set(snap.get("wait_max_ns"))
        )


def test_lwlock_records_and_rows_as_with_bpftrace() -> None:
    events, _ = parse_fixture("lwlock_wait.out", lwlocks.MAPS)
    (snap,) = snapshots(events)
    recs = lwlocks.records(snap)
    cluster = Cluster(postmaster_pid=1, binary="/x", version_num=150018, version="15.18",
                      data_directory=None)  # fmt: skip
    rows = lwlocks.rows(recs, Targets(cluster, [], whole_cluster=True), by_pid=False)
    assert rows[0].tranche == "WALWrite" and rows[0].mode == "Exclusive"
    assert [r.total_ns for r in rows] == sorted((r.total_ns for r in rows), reverse=True)
    for row in rows:
        data = row.as_json()
        assert 0 <= data["p50_us"] <= data["p95_us"] <= data["p99_us"] <= data["max_us"]


# -- tolerance: what the documentation leaves open -----------------------------------------


def test_histogram_header_on_the_record_line_and_no_blank_lines() -> None:
    # If %@d printed no newline of its own before the table.
    text = (
        "@@snapshot\t2026 Nov 21 10:00:01\n"
        "@wait_ns\t0\tWALWrite\tExclusive           value  ------------- Distribution"
        " ------------- count    \n"
        "            1024 |                                         0        \n"
        "            2048 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@ 2        \n"
        "            4096 |                                         0        \n"
        "@wait_max_ns\t0\tWALWrite\tExclusive\t3000\n"
    )
    events, _ = parse_text(text, lwlocks.MAPS)
    (snap,) = snapshots(events)
    assert snap.get("wait_ns") == {(0, "WALWrite", "Exclusive"): Log2Hist(((2048, 4095, 2),))}
    assert snap.get("wait_max_ns") == {(0, "WALWrite", "Exclusive"): 3000}
    assert snap.label == "10:00:01"


def test_stack_starting_on_the_record_line() -> None:
    # If %k printed no newline before the first frame.
    text = (
        "@@snapshot\t2026 Nov 21 10:00:01\n"
        "@stacks\t4242\t7              postgres`ExecScan+0x8c\n"
        "              postgres`main+0x2e3\n"
        "@samples\t7\n"
    )
    events, _ = parse_text(text, PROFILE_SPECS)
    (snap,) = snapshots(events)
    stack = NamedStack(("postgres`ExecScan+0x8c", "postgres`main+0x2e3"))
    assert snap.get("stacks") == {(4242, stack): 7}
    assert snap.get("samples") == {(): 7}


def test_stats_with_a_missing_half_is_said() -> None:
    text = "@@snapshot\t2026 Nov 21 10:00:01\n@wait_stats:count\t0\tWALWrite\tShared\t4\n"
    events, info = parse_text(text, lwlocks.MAPS)
    (snap,) = snapshots(events)
    assert snap.get("wait_stats") == {(0, "WALWrite", "Shared"): Stats(4, 0)}
    assert any("only one of count/total" in w for w in info.warnings)


def test_a_map_the_tool_did_not_declare_still_parses() -> None:
    text = "@@snapshot\t2026 Nov 21 10:00:01\n@open_errors\t31\tpg_xact/0009\t2\n"
    events, _ = parse_text(text, ())
    (snap,) = snapshots(events)
    assert snap.get("open_errors") == {("31", "pg_xact/0009"): 2}


# -- clog_reads.d -----------------------------------------------------------------------------


def test_clog_reads_stacks_through_simplelrureadpage() -> None:
    events, _ = parse_fixture("clog_reads_stacks.out", CLOG_SPECS)
    (snap,) = snapshots(events)
    stats = snap.get("read_stats")
    assert stats[(28544, "pg_xact/0001")] == Stats(48, stats[(28544, "pg_xact/0001")].total)  # type: ignore[union-attr]
    for key, value in stats.items():
        assert isinstance(value, Stats)
        assert snap.get("read_bytes")[key] == 8192 * value.count
        hist = snap.get("read_ns")[key]
        assert isinstance(hist, Log2Hist) and hist.count == value.count
    read_stacks = snap.get("read_stacks")
    assert sum(v for v in read_stacks.values() if isinstance(v, int)) == sum(
        v.count for v in stats.values() if isinstance(v, Stats)
    )
    slru = [k for k in read_stacks if any("SimpleLruReadPage+" in f for f in k[1].frames)]  # type: ignore[union-attr]
    assert len(slru) == 3
    exited = [k for k in read_stacks if k[0] == 28551]
    (key,) = exited
    stack = key[1]
    assert isinstance(stack, NamedStack)
    frames = stack.symbolized()
    assert all(not f.resolved and f.name == "[unknown]" for f in frames)
    assert frames[0].offset == 0xFFFFFD7FFF26A8EA  # kept for display (Frame.label)


def test_clog_reads_trace_mode_gives_lines_then_the_totals() -> None:
    events, _ = parse_fixture("clog_reads_trace.out", CLOG_SPECS)
    lines = [e.text for e in events if isinstance(e, Line)]
    assert lines[0] == "TIME_NS\tPID\tFILE\tOFFSET\tBYTES\tLAT_NS"
    rows = [ln.split("\t") for ln in lines[1:]]
    assert len(rows) == 6 and all(len(r) == 6 for r in rows)
    (snap,) = snapshots(events)
    stats = snap.get("read_stats")
    assert sum(v.count for v in stats.values() if isinstance(v, Stats)) == len(rows)
    by_file: dict[str, int] = {}
    for r in rows:
        by_file[r[2]] = by_file.get(r[2], 0) + int(r[5])
    assert {k[1]: v.total for k, v in stats.items() if isinstance(v, Stats)} == by_file
    assert snap.get("read_stacks") == {}


# -- profile.d --------------------------------------------------------------------------------


def test_profile_hotuser_counts_and_folded_stacks() -> None:
    events, _ = parse_fixture("profile_hotuser.out", PROFILE_SPECS)
    (snap,) = snapshots(events)
    counts = snap.get("stacks")
    (samples,) = snap.get("samples").values()
    assert samples == sum(v for v in counts.values() if isinstance(v, int)) == 4694
    folded: dict[str, int] = {}
    for (pid, stack), n in counts.items():
        assert isinstance(pid, int) and isinstance(stack, NamedStack) and isinstance(n, int)
        line = stacks.fold(folded_names(stack.symbolized(), main="postgres"))
        folded[line] = folded.get(line, 0) + n
    hot = max(folded, key=lambda s: folded[s])
    # two sample sites inside hash_bytes_extended fold into one frame
    assert folded[hot] == 1893 + 702
    assert hot.startswith("_start;main;PostmasterMain;ServerLoop;PostgresMain;exec_simple_query")
    assert hot.endswith(";hashtext;hash_bytes_extended")
    assert any("libc.so.1`memcpy" in s for s in folded)  # other modules keep theirs
    assert folded["[unknown];[unknown];[unknown];[unknown];[unknown]"] == 41  # exited


def test_profile_kernel_and_user_stacks() -> None:
    events, _ = parse_fixture("profile_kstacks.out", PROFILE_SPECS)
    (snap,) = snapshots(events)
    kstacks = snap.get("kstacks")
    assert sum(v for v in kstacks.values() if isinstance(v, int)) == 101
    user_mode = [k for k in kstacks if isinstance(k[1], NamedStack) and not k[1].frames]
    assert len(user_mode) == 1 and kstacks[user_mode[0]] == 95
    for _pid, kstack, ustack in kstacks:
        assert isinstance(kstack, NamedStack) and isinstance(ustack, NamedStack)
        assert all(f.name.endswith("_[k]") for f in kstack.symbolized(kernel=True))
        assert all(not f.startswith(("unix`", "genunix`")) for f in ustack.frames)
    paging = next(k for k in kstacks if len(k[1].frames) == 4)  # type: ignore[union-attr]
    names = [f.name for f in paging[1].symbolized(kernel=True)]  # type: ignore[union-attr]
    assert names == ["page_fault_[k]", "as_fault_[k]", "pagefault_[k]", "trap_[k]"]


# -- frames -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "module", "resolved", "offset"),
    [
        ("postgres`SimpleLruReadPage+0x1b4", "SimpleLruReadPage", "postgres", True, 0x1B4),
        ("postgres`main", "main", "postgres", True, 0),
        ("libc.so.1`__pread+0xa", "__pread", "libc.so.1", True, 0xA),
        ("libsystem_kernel.dylib`__pread+0xa", "__pread", "libsystem_kernel.dylib", True, 10),
        ("postgres`0x5607a7f47aa0", "postgres`0x5607a7f47aa0", "postgres", False, 0),
        ("0x8f3c21", "[unknown]", "[unknown]", False, 0x8F3C21),
        (
            "libstdc++.so.6`std::string::append(char const*)+0x1c",
            "std::string::append(char const*)",
            "libstdc++.so.6",
            True,
            0x1C,
        ),  # fmt: skip
        ("postgres`a+b+0x10", "a+b", "postgres", True, 0x10),
    ],
)
def test_frame_text_forms(text: str, name: str, module: str, resolved: bool, offset: int) -> None:
    (frame,) = NamedStack((text,)).symbolized()
    assert (frame.name, frame.module, frame.resolved, frame.offset) == (
        name,
        module,
        resolved,
        offset,
    )


def test_folding_strips_offsets_and_reverses() -> None:
    stack = NamedStack(("libc.so.1`__pread+0xa", "postgres`SlruPhysicalReadPage+0xa5",
                        "postgres`SimpleLruReadPage+0x1b4", "postgres`main+0x2e3"))  # fmt: skip
    assert stacks.fold(folded_names(stack.symbolized(), main="postgres")) == (
        "main;SimpleLruReadPage;SlruPhysicalReadPage;libc.so.1`__pread"
    )
    assert stacks.fold([f.folded for f in stack.symbolized()]) == (
        "main;SimpleLruReadPage;SlruPhysicalReadPage;__pread"
    )


def test_default_ustack_aggregation_output() -> None:
    # `dtrace -n 'syscall::pread:entry /execname == "postgres"/ { @[ustack()] = count(); }'`
    counts = parse_ustack_aggregation((FIXTURES / "ustack_default_slru.out").read_text())
    assert sorted(counts.values()) == [4, 7, 17, 52]
    slru = {s: n for s, n in counts.items() if "postgres`SimpleLruReadPage+0x1b4" in s.frames}
    assert sorted(slru.values()) == [4, 52]
    for stack in counts:
        assert stack.frames[0] in ("libc.so.1`__pread+0xa", "0xfffffd7fff26a8ea")


# -- stderr -----------------------------------------------------------------------------------


def test_drops_and_probe_errors_are_counted() -> None:
    report = classify_stderr((FIXTURES / "drops.stderr").read_text().splitlines())
    assert report.lost_events == 12 + 3 + 7 + 2  # principal buffer + dynamic variable drops
    assert report.failed_map_updates == 5  # aggregation drops
    assert report.probe_errors == 2
    assert report.problems == []
    (warning,) = report.warnings()
    assert warning.startswith("2 errors in probe actions") and "invalid address" in warning


@pytest.mark.parametrize(
    ("fixture", "code", "needles"),
    [
        ("privileges.stderr", EXIT_ENV, ("additional privileges", "root", "dtrace_proc")),
        ("no_provider.stderr", EXIT_ENV, ("does not match any probes", "--enable-dtrace")),
        ("macos_sip.stderr", EXIT_ENV, ("--enable-dtrace", "csrutil enable --without dtrace")),
        ("freebsd_no_device.stderr", EXIT_ENV, ("device not available", "kldload dtraceall")),
    ],
)
def test_failures_are_explained_in_one_line(
    fixture: str, code: int, needles: tuple[str, ...]
) -> None:
    report = classify_stderr((FIXTURES / fixture).read_text().splitlines())
    error = explain_failure(report)
    assert error.exit_code == code
    assert "\n" not in error.message
    for needle in needles:
        assert needle in error.message, (needle, error.message)


def test_unknown_failure_is_a_tracer_error() -> None:
    line = "dtrace: failed to compile script x.d: line 3: syntax error near '}'"
    report = classify_stderr([line])
    error = explain_failure(report)
    assert error.exit_code == EXIT_TRACER
    assert "syntax error" in error.message


def test_records_out_of_layout_are_left_out_and_said() -> None:
    text = (
        "@@snapshot\t2026 Nov 21 10:00:01\n"
        "@wait_max_ns\t0\tWALWrite\tExclusive\tlots\n"  # not a number
        "@wait_max_ns\t0\tWALWrite\n"  # too few key fields
        "@kstacks\t4242\t3\n"  # two stacks expected, one given
        "              postgres`main+0x2e3\n"
        "@wait_max_ns\t0\tWALInsert\tExclusive\t900\n"
    )
    events, info = parse_text(text, (*lwlocks.MAPS, *PROFILE_SPECS))
    (snap,) = snapshots(events)
    assert snap.get("wait_max_ns") == {(0, "WALInsert", "Exclusive"): 900}
    assert snap.get("kstacks") == {}
    (warning,) = info.warnings
    assert warning.startswith("3 records of dtrace's output not understood")
    assert "lots" in warning
