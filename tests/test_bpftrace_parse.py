"""The bpftrace engine's parsing, on a recorded real run, and the lwlocks maths on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgprobe.discover import Backend, Cluster, Targets
from pgprobe.engines.base import Line, Log2Hist, MapSpec, RunInfo, Snapshot, Stats
from pgprobe.engines.bpftrace import _OutputParser, parse_map, split_key
from pgprobe.tools import lwlocks

FIXTURES = Path(__file__).parent / "fixtures" / "bpftrace"
SPECS = {f"@{m.name}": m for m in lwlocks.MAPS}


def parse_file(path: Path) -> tuple[list[Snapshot | Line], RunInfo]:
    info = RunInfo()
    parser = _OutputParser(SPECS, info)
    events: list[Snapshot | Line] = []
    for raw in path.read_bytes().splitlines():
        events.extend(parser.feed(raw))
    events.extend(parser.finish())
    return events, info


def test_recorded_interval_run_splits_into_snapshots() -> None:
    # `bpftrace -k -f json lwlock_wait.bt BINARY PM 1 2`, Ctrl-C after 5 s under pgbench -c 8
    events, info = parse_file(FIXTURES / "lwlock_wait_by_pid_interval.jsonl")
    snaps = [e for e in events if isinstance(e, Snapshot)]
    assert info.probes_attached == 8
    assert len(snaps) == 3  # two 2-second intervals, then what was left at exit
    assert [s.final for s in snaps] == [False, False, True]
    assert all(s.label.count(":") == 2 for s in snaps)  # HH:MM:SS markers
    first = snaps[0]
    stats = first.get("wait_stats")
    assert stats and all(isinstance(v, Stats) for v in stats.values())
    for key, value in stats.items():
        pid, tranche, mode = key
        assert isinstance(pid, int) and pid > 0
        assert isinstance(tranche, str) and tranche
        assert mode in ("Exclusive", "Shared", "WaitUntilFree")
        hist = first.get("wait_ns")[key]
        assert isinstance(hist, Log2Hist) and isinstance(value, Stats)
        assert hist.count == value.count  # the histogram holds every wait
        assert first.get("wait_max_ns")[key] <= value.total


def test_records_and_rows_from_the_recording() -> None:
    events, _ = parse_file(FIXTURES / "lwlock_wait_by_pid_interval.jsonl")
    snap = next(e for e in events if isinstance(e, Snapshot))
    recs = lwlocks.records(snap)
    cluster = Cluster(postmaster_pid=1, binary="/x", version_num=150018, version="15.18",
                      data_directory=None)  # fmt: skip
    targets = Targets(cluster, [], whole_cluster=True)
    merged = lwlocks.rows(recs, targets, by_pid=False)
    assert sum(r.waits for r in merged) == sum(r.waits for r in recs)
    assert sum(r.total_ns for r in merged) == sum(r.total_ns for r in recs)
    assert len({(r.tranche, r.mode) for r in merged}) == len(merged)
    assert abs(sum(r.share for r in merged) - 1) < 1e-9
    for row in merged:
        data = row.as_json()
        assert data["p50_us"] <= data["p95_us"] <= data["p99_us"] <= data["max_us"]
        assert row.hist.count == row.waits


def test_rows_for_a_subset_keep_only_the_target_pids() -> None:
    events, _ = parse_file(FIXTURES / "lwlock_wait_by_pid_interval.jsonl")
    snap = next(e for e in events if isinstance(e, Snapshot))
    recs = lwlocks.records(snap)
    some_pid = recs[0].pid
    cluster = Cluster(postmaster_pid=1, binary="/x", version_num=150018, version="15.18",
                      data_directory=None, backends=[Backend(pid=some_pid,
                      backend_type="client backend", application_name="pgbench")])  # fmt: skip
    targets = Targets(cluster, [some_pid], whole_cluster=False)
    by_pid = lwlocks.rows(recs, targets, by_pid=True)
    assert by_pid and {r.pid for r in by_pid} == {some_pid}
    assert {r.application_name for r in by_pid} == {"pgbench"}
    assert sum(r.waits for r in by_pid) == sum(r.waits for r in recs if r.pid == some_pid)


def test_the_second_buffer_of_a_windowed_script_reads_as_its_map() -> None:
    # the same, recorded with two buffers (bpf/lwlock_wait.bt's interval probe): Ctrl-C
    # after 7 s of pgbench -c 8; the windows alternate between @wait_stats and @wait_stats_b
    events, _ = parse_file(FIXTURES / "lwlock_wait_by_pid_interval_two_buffers.jsonl")
    snaps = [e for e in events if isinstance(e, Snapshot)]
    assert len(snaps) == 4  # three 2-second windows, then what was left at exit
    for snap in snaps:
        assert not any(name.endswith("_b") for name in snap.maps)
        stats, hists = snap.get("wait_stats"), snap.get("wait_ns")
        assert stats and stats.keys() == hists.keys()
        assert all(hists[k].count == v.count for k, v in stats.items())  # type: ignore[union-attr]


def test_a_map_and_its_twin_in_one_snapshot_are_one_map() -> None:
    specs = {"@wait_stats": MapSpec("wait_stats", ("str",)),
             "@wait_max_ns": MapSpec("wait_max_ns", ("str",), combine="max")}  # fmt: skip
    parser = _OutputParser(specs, RunInfo())
    for raw in (
        b'{"type": "time", "data": "10:00:00\n"}',
        b'{"type": "stats", "data": {"@wait_stats": {"a": {"count": 2, "average": 5, "total": 10},'
        b' "b": {"count": 1, "average": 4, "total": 4}}}}',
        b'{"type": "map", "data": {"@wait_max_ns_b": {"a": 9}}}',
        b'{"type": "stats", "data": {"@wait_stats_b": {"a": {"count": 1, "average": 7, '
        b'"total": 7}}}}',
        b'{"type": "map", "data": {"@wait_max_ns": {"a": 6, "b": 4}}}',
        b'{"type": "map", "data": {"@other_b": {"a": 1}}}',  # no such map: kept as printed
    ):
        list(parser.feed(raw))
    (snap,) = parser.finish()
    assert isinstance(snap, Snapshot)
    assert snap.get("wait_stats") == {("a",): Stats(3, 17), ("b",): Stats(1, 4)}
    assert snap.get("wait_max_ns") == {("a",): 9, ("b",): 4}
    assert set(snap.maps) == {"wait_stats", "wait_max_ns", "other_b"}


@pytest.mark.parametrize(
    ("raw", "kinds", "expected"),
    [
        ("0,WALWrite,Exclusive", ("int", "str", "str"), (0, "WALWrite", "Exclusive")),
        # an extension's tranche name with a comma stays whole
        ("42,my,ext,Shared", ("int", "str", "str"), (42, "my,ext", "Shared")),
        ("7", ("int",), (7,)),
    ],
)
def test_split_key(raw: str, kinds: tuple[str, ...], expected: tuple[object, ...]) -> None:
    assert split_key(raw, kinds) == expected  # type: ignore[arg-type]


def test_keyless_maps_and_special_buckets() -> None:
    assert parse_map("map", 5, None) == {(): 5}
    assert parse_map("stats", {"count": 2, "average": 3, "total": 6}, None) == {(): Stats(2, 6)}
    hist = parse_map("hist", [{"max": -1, "count": 1}, {"min": 0, "max": 0, "count": 2}], None)
    (value,) = hist.values()
    assert isinstance(value, Log2Hist)
    assert value.buckets[0][0] < 0 and value.buckets[0][1] == -1
    assert value.count == 3


def test_printf_lines_may_arrive_in_pieces() -> None:
    parser = _OutputParser({}, RunInfo())
    out = list(parser.feed(b'{"type": "printf", "data": "a\\tb\\nc"}'))
    out += list(parser.feed(b'{"type": "printf", "data": "d\\n"}'))
    assert [e.text for e in out if isinstance(e, Line)] == ["a\tb", "cd"]


def test_losses_are_counted() -> None:
    info = RunInfo()
    parser = _OutputParser({}, info)
    for raw in (
        b'{"type": "lost_events", "data": {"events": 12}}',
        b'{"type": "helper_error", "helper": "map_update_elem", "retcode": -7}',
        b'{"type": "helper_error", "helper": "map_update_elem", "retcode": -7}',
    ):
        list(parser.feed(raw))
    assert info.lost_events == 12
    assert info.failed_map_updates == 2


# bpftrace keeps distinct keys that print the same: two stack ids of identical frames
# (seen on PostgreSQL 14-18 without frame pointers), or strings with different bytes
# after their end. The JSON then holds one key twice; every entry must count.
DUPLICATE_STACKS = (
    b'{"type": "map", "data": {"@stacks": {"8261,\\n    0x55a229d947a1\\n": 3, '
    b'"8261,\\n    0x55a229d947a2\\n": 1, "8261,\\n    0x55a229d947a1\\n": 4}}}'
)


def test_duplicate_keys_are_summed() -> None:
    from pgprobe.engines.base import MapSpec

    info = RunInfo()
    parser = _OutputParser({"@stacks": MapSpec("stacks", ("int", "stack"))}, info)
    list(parser.feed(DUPLICATE_STACKS))
    (snap,) = list(parser.finish())
    stacks = snap.get("stacks")
    assert stacks == {(8261, (0x55A229D947A1,)): 7, (8261, (0x55A229D947A2,)): 1}
    assert sum(v for v in stacks.values() if isinstance(v, int)) == 8
    assert info.warnings == []


def test_duplicate_keys_combine_as_their_aggregation() -> None:
    from pgprobe.engines.base import MapSpec

    specs = {f"@{m.name}": m for m in lwlocks.MAPS}
    parser = _OutputParser(specs, RunInfo())
    lines = (
        '{"type": "map", "data": {"@wait_max_ns": {"K": 50, "K": 70}}}',
        '{"type": "stats", "data": {"@wait_stats": {"K": {"count": 2, "average": 5, '
        '"total": 10}, "K": {"count": 1, "average": 4, "total": 4}}}}',
        '{"type": "hist", "data": {"@wait_ns": {"K": [{"min": 4, "max": 7, "count": 1}], '
        '"K": [{"min": 4, "max": 7, "count": 2}, {"min": 8, "max": 15, "count": 1}]}}}',
    )
    for raw in (line.replace("K", "0,WALWrite,Exclusive") for line in lines):
        list(parser.feed(raw.encode()))
    (snap,) = list(parser.finish())
    k = (0, "WALWrite", "Exclusive")
    assert snap.get("wait_max_ns")[k] == 70  # max(), not a sum
    assert snap.get("wait_stats")[k] == Stats(3, 14)
    assert snap.get("wait_ns")[k] == Log2Hist(((4, 7, 3), (8, 15, 1)))
    assert MapSpec("x", ()).combine == "sum"


def test_live_marker_is_the_start_not_a_line() -> None:
    info = RunInfo()
    parser = _OutputParser({}, info, live_marker=True)
    out = list(parser.feed(b'{"type": "attached_probes", "data": {"probes": 22}}'))
    assert info.probes_attached == 0  # bpftrace says so before it attaches
    out += list(parser.feed(b'{"type": "printf", "data": "@@live\\n"}'))
    assert info.probes_attached == 22 and out == []


def test_how_a_tracer_ended_is_said() -> None:
    from pgprobe.engines.runner import describe_exit

    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(-11) == "was killed by signal 11 (SIGSEGV)"
    assert describe_exit(1) == "exited with status 1"
