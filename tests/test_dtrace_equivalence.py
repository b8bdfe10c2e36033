"""Both engines give the same records: a real bpftrace run, written out as DTrace prints it.

No DTrace runs here, so the equivalence is shown the other way round: a real
bpftrace run of bpf/<tool>.bt on a real workload gives snapshots; the writer
in test_dtrace_format.py prints them in the layout the twin d/<tool>.d
prints (printa lines, quantize tables, ustack frames as DTrace names them);
the DTrace engine's parser must give back the very same records (map names,
key tuples, Stats, int, Log2Hist buckets), hence the same rows, table and
JSON. For stacks, bpftrace's raw addresses named by pgprobe's symbolizer and
DTrace's named frames must give the same frames and the same folded stacks.

What this cannot show: that a real dtrace prints exactly this text. That
rests on the Dynamic Tracing Guide's description of printa, quantize and
ustack output, which the writer follows (see docs/dtrace.md).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import slru_workload
from helpers import run_pgprobe
from test_dtrace_engine import FakeDtrace, install_fake_dtrace
from test_dtrace_format import CLOG_READS, LWLOCK_WAIT, PROFILE, frame_text, render_run

from pgprobe import discover, stacks
from pgprobe.engines.base import (
    AggValue,
    Event,
    Key,
    Log2Hist,
    MapSpec,
    NamedStack,
    RunInfo,
    Snapshot,
    Stats,
)
from pgprobe.engines.bpftrace import BpftraceCapture
from pgprobe.engines.dtrace import DtraceOutput
from pgprobe.sandbox import PgCluster
from pgprobe.symbolize import UNKNOWN, Frame, Symbolizer, folded_names
from pgprobe.tools import lwlocks

pytestmark = pytest.mark.integration

PROFILE_SPECS = (
    MapSpec("samples", ()),
    MapSpec("stacks", ("int", "stack")),
    MapSpec("kstacks", ("int", "stack", "stack")),
)


def run_bpftrace(
    script: str, args: list[int | Path], specs: tuple[MapSpec, ...], seconds: float, **env: str
) -> list[Snapshot]:
    capture = BpftraceCapture(script, args, specs, duration=seconds, env=env)
    return [e for e in capture.events() if isinstance(e, Snapshot)]


def parse_d(text: str, specs: tuple[MapSpec, ...]) -> list[Snapshot]:
    parser = DtraceOutput({s.name: s for s in specs}, RunInfo())
    events: list[Event] = []
    for line in text.splitlines():
        events.extend(parser.feed(line))
    events.extend(parser.finish())
    return [e for e in events if isinstance(e, Snapshot)]


@pytest.fixture(scope="module")
def load(cluster: PgCluster, tracing: None) -> Iterator[PgCluster]:
    """pgbench -c 8: LWLock waits within seconds (as in test_lwlocks)."""
    bench = cluster.pgbench("-c", "8", "-j", "2", "-T", "600")
    time.sleep(1.5)
    assert bench.poll() is None, bench.communicate()[0]
    yield cluster
    bench.terminate()
    bench.communicate(timeout=30)


# -- lwlocks ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lwlock_run(load: PgCluster) -> list[Snapshot]:
    targets = discover.discover(
        discover.ConnOptions(host=str(load.root), port=load.port, user="postgres"),
        discover.Filters(),
    )
    args = lwlocks.script_args(targets, by_pid=True, interval=1)
    snaps = run_bpftrace("lwlock_wait.bt", args, lwlocks.MAPS, 3.5)
    assert len(snaps) >= 3 and any(s.get("wait_stats") for s in snaps)
    return snaps


def counted(maps: dict[Key, AggValue]) -> dict[Key, AggValue]:
    """A map's values with its histograms' empty buckets left out.

    A Log2Hist may hold them or not (engines.base): bpftrace prints those between the
    first and last used bucket, DTrace's quantize too, but a sum of two histograms of
    one key (histogram.merge) keeps only the used ones. They say nothing, so the
    engines agree when their counts per bucket do.
    """
    return {
        key: Log2Hist(tuple(b for b in v.buckets if b[2])) if isinstance(v, Log2Hist) else v
        for key, v in maps.items()
    }


def test_lwlock_records_are_the_same(lwlock_run: list[Snapshot]) -> None:
    text = render_run(lwlock_run, LWLOCK_WAIT, "lwlock_wait.d")
    parsed = parse_d(text, lwlocks.MAPS)
    assert [s.label for s in parsed] == [s.label for s in lwlock_run]
    assert [s.final for s in parsed] == [s.final for s in lwlock_run]
    for mine, real in zip(parsed, lwlock_run, strict=True):
        for spec in lwlocks.MAPS:
            assert counted(mine.get(spec.name)) == counted(real.get(spec.name)), spec.name
        # the same records; printa() prints in value order, bpftrace in its own
        assert used_buckets(lwlocks.records(mine)) == used_buckets(lwlocks.records(real))


def used_buckets(recs: list[lwlocks.WaitRecord]) -> list[lwlocks.WaitRecord]:
    """Records in a stable order, their histograms without empty buckets (see counted():
    a key in both of a window's buffers is merged, which keeps only the used ones; CI saw
    DTrace's zero rows between 2 us and 256 us against such a merge)."""
    out = [replace(r, hist=Log2Hist(tuple(b for b in r.hist.buckets if b[2]))) for r in recs]
    return sorted(out, key=repr)


def _shape(value: Any) -> Any:
    """The keys and value types of a JSON document, without the values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return sorted({json.dumps(_shape(v), sort_keys=True) for v in value})
    return type(value).__name__


def test_lwlocks_json_from_both_engines(
    load: PgCluster, lwlock_run: list[Snapshot], tmp_path: Path
) -> None:
    """The same rows from the same data, and the same JSON shape as a live bpftrace run."""
    fake_dtrace: FakeDtrace = install_fake_dtrace(tmp_path)
    recorded = tmp_path / "lwlock_wait_from_bpftrace.out"
    final = lwlock_run[-1]
    biggest = max(lwlock_run, key=lambda s: len(s.get("wait_stats")))
    biggest = Snapshot(label=final.label, final=True, maps=biggest.maps)
    recorded.write_text(render_run([biggest], LWLOCK_WAIT, "lwlock_wait.d"))
    env = fake_dtrace.env(output=str(recorded))
    via_d = run_pgprobe(
        [
            "lwlocks",
            "--source",
            "usdt",
            "--max-events-per-sec",
            "0",
            *load.conn_args,
            "--engine",
            "dtrace",
            "--by",
            "pid",
            "-d",
            "1",
            "--json",
        ],
        env=env,
    )
    assert via_d.returncode == 0, via_d.stderr
    d_doc = json.loads(via_d.stdout)
    targets = discover.discover(
        discover.ConnOptions(host=str(load.root), port=load.port, user="postgres"),
        discover.Filters(),
    )
    expected = lwlocks.rows(lwlocks.records(biggest), targets, by_pid=True)
    strip = ("backend_type", "application_name")
    assert [{k: v for k, v in r.items() if k not in strip} for r in d_doc["rows"]] == [
        {k: v for k, v in r.as_json().items() if k not in strip} for r in expected
    ]
    via_bpf = run_pgprobe(
        [
            "lwlocks",
            "--source",
            "usdt",
            "--max-events-per-sec",
            "0",
            *load.conn_args,
            "--by",
            "pid",
            "-d",
            "2",
            "--json",
        ]
    )
    assert via_bpf.returncode == 0, via_bpf.stderr
    b_doc = json.loads(via_bpf.stdout)
    assert b_doc["rows"] and d_doc["rows"]
    assert _shape(d_doc["rows"]) == _shape(b_doc["rows"])
    assert set(d_doc["meta"]) == set(b_doc["meta"])
    for key in d_doc["meta"]:
        if key != "engine_version":
            assert type(d_doc["meta"][key]) is type(b_doc["meta"][key]), key


# -- stacks -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busy_backend(cluster: PgCluster, tracing: None) -> Iterator[int]:
    """A backend burning CPU in a query (hashtext over a series), its pid."""
    pid_box: list[int] = []
    done = threading.Event()

    def work() -> None:
        with cluster.connect() as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pid_box.append(int(str(row[0])))
            conn.execute("SET jit = off")
            while not done.is_set():
                conn.execute("SELECT sum(hashtext(i::text)) FROM generate_series(1, 3000000) i")

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    for _ in range(100):
        if pid_box:
            break
        time.sleep(0.05)
    assert pid_box
    yield pid_box[0]
    done.set()
    worker.join(timeout=60)


def dtrace_frame_text(frame: Frame, address: int) -> str:
    """What DTrace prints for a frame pgprobe's symbolizer named from `address`.

    A frame with no symbol (a static function of a stripped server) is
    ``module`0xADDRESS`` in DTrace, the address itself, where pgprobe names it
    by the start of its function (``postgres+0x3ee3c0``).
    """
    if frame.resolved:
        return frame_text(frame)
    return f"0x{address:x}" if frame.module == UNKNOWN else f"{frame.module}`0x{address:x}"


def comparable(frames: list[Frame]) -> str:
    """A folded line where an unresolved frame only says its module (see above)."""
    names = folded_names(frames, main="postgres")
    return stacks.fold(
        [
            n if f.resolved else f"[{f.module} unresolved]"
            for n, f in zip(names, frames, strict=True)
        ]
    )


def test_profile_stacks_fold_the_same(cluster: PgCluster, busy_backend: int) -> None:
    pid = busy_backend
    symbolizer = Symbolizer(kallsyms=False)
    symbolizer.set_fallback(cluster.postmaster_pid)
    symbolizer.snapshot(pid)
    (snap,) = run_bpftrace(
        "profile.bt",
        [99, cluster.postmaster_pid, pid, 0, 0],
        PROFILE_SPECS,
        2.5,
        BPFTRACE_NO_USER_SYMBOLS="1",
    )
    raw = snap.get("stacks")
    assert raw, "a busy backend is sampled"
    # What DTrace would have printed: the same stacks, named in the process.
    d_stacks: dict[Key, AggValue] = {}
    frames_of: dict[NamedStack, list[Frame]] = {}
    for (spid, addrs), count in raw.items():
        assert isinstance(spid, int) and isinstance(addrs, tuple) and isinstance(count, int)
        frames = symbolizer.user_frames(spid, addrs, count)
        texts = (dtrace_frame_text(f, a) for f, a in zip(frames, addrs, strict=True))
        stack = NamedStack(tuple(texts))
        frames_of[stack] = frames
        d_stacks[(spid, stack)] = count
    as_d = Snapshot(label=snap.label, final=True, maps={"samples": snap.get("samples")})
    as_d.maps["stacks"] = d_stacks
    (parsed,) = parse_d(render_run([as_d], PROFILE, "profile.d", "99"), PROFILE_SPECS)
    assert parsed.get("samples") == snap.get("samples")
    assert parsed.get("stacks") == d_stacks
    folded_b: dict[str, int] = {}
    folded_d: dict[str, int] = {}
    for (_spid, parsed_stack), count in parsed.get("stacks").items():
        assert isinstance(parsed_stack, NamedStack) and isinstance(count, int)
        mine, real = parsed_stack.symbolized(), frames_of[parsed_stack]
        assert len(mine) == len(real)
        for m, r in zip(mine, real, strict=True):
            assert (m.resolved, m.module) == (r.resolved, r.module)
            if r.resolved:
                assert (m.name, m.offset) == (r.name, r.offset)
        folded_d[comparable(mine)] = folded_d.get(comparable(mine), 0) + count
        folded_b[comparable(real)] = folded_b.get(comparable(real), 0) + count
    assert folded_d == folded_b
    assert any("PostgresMain" in line for line in folded_d), "the server's frames are named"


# -- clog reads -------------------------------------------------------------------------------

CLOG_SPECS = (
    MapSpec("read_stats", ("int", "str")),
    MapSpec("read_bytes", ("int", "str")),
    MapSpec("read_max_ns", ("int", "str")),
    MapSpec("read_ns", ("int", "str")),
    MapSpec("open_errors", ("int", "str")),
    MapSpec("read_stacks", ("int", "stack")),
)


@pytest.fixture(scope="module")
def slru_cluster(tracing: None) -> Iterator[PgCluster]:
    """A cluster with 4 pg_xact buffers, quiet: every lookup of an old xid reads a page."""
    with PgCluster(settings=slru_workload.CLUSTER_SETTINGS, name="pgprobe-dslru") as pg:
        yield pg


def test_clog_reads_records_are_the_same(slru_cluster: PgCluster) -> None:
    pg = slru_cluster
    with pg.connect() as conn:
        first, last = slru_workload.burn_xids(conn, slru_workload.xact_burn_size(conn))
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(str(row[0]))
        symbolizer = Symbolizer(kallsyms=False)
        symbolizer.set_fallback(pg.postmaster_pid)
        symbolizer.snapshot(pid)
        capture = BpftraceCapture(
            "clog_reads.bt",
            [pg.postmaster_pid, 1, 1, pid, 0],  # pg_xact, MODE 1 (stacks), this backend
            CLOG_SPECS,
            duration=5,
            env={"BPFTRACE_NO_USER_SYMBOLS": "1", "BPFTRACE_STRLEN": "32"},
        )
        looked_up: list[int] = []

        def provoke() -> None:
            while not capture.info.probes_attached:
                time.sleep(0.05)
            time.sleep(2)  # bpftrace says "attached" before the last probe is
            looked_up.extend(slru_workload.provoke_xact_reads(conn, first, last))

        worker = threading.Thread(target=provoke)
        worker.start()
        (snap,) = [e for e in capture.events() if isinstance(e, Snapshot)]
        worker.join(timeout=60)
    reads = sum(v.count for v in snap.get("read_stats").values() if isinstance(v, Stats))
    assert looked_up and reads == len(looked_up)
    # What DTrace would print for the same reads: the stacks named in the process.
    as_d = Snapshot(label=snap.label, final=True)
    for spec in CLOG_SPECS[:-1]:
        if snap.get(spec.name):
            as_d.maps[spec.name] = snap.get(spec.name)
    named: dict[Key, AggValue] = {}
    for (spid, addrs), count in snap.get("read_stacks").items():
        assert isinstance(spid, int) and isinstance(addrs, tuple) and isinstance(count, int)
        frames = symbolizer.user_frames(spid, addrs, count)
        texts = (dtrace_frame_text(f, a) for f, a in zip(frames, addrs, strict=True))
        key = (spid, NamedStack(tuple(texts)))
        named[key] = int(str(named.get(key, 0))) + count
    as_d.maps["read_stacks"] = named
    (parsed,) = parse_d(render_run([as_d], CLOG_READS, "clog_reads.d"), CLOG_SPECS)
    for spec in CLOG_SPECS[:-1]:
        assert counted(parsed.get(spec.name)) == counted(snap.get(spec.name)), spec.name
    assert parsed.get("read_stacks") == named
    assert sum(v for v in named.values() if isinstance(v, int)) == reads
    slru_frames = [
        f.name
        for (_, stack) in parsed.get("read_stacks")
        if isinstance(stack, NamedStack)
        for f in stack.symbolized()
    ]
    assert "SimpleLruReadPage" in slru_frames and "TransactionIdGetStatus" in slru_frames
