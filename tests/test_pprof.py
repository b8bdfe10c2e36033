"""pprof profiles (pgprobe.render.pprof, --format pprof), read back by the real `go tool pprof`.

The truth for a capture is `pgprobe hot`'s table of the same capture: one
capture (profiling.collect, as `pgprobe hot` runs it) gives both the hot rows
and the pprof file, and `go tool pprof -top` must show the same functions with
the same flat (= hot's self) and cumulative (= hot's total) sample counts and
the same total. Files written by the CLI (`flame -o x.pb.gz`, `clog-reads
--pprof`) are checked against their own other outputs (the flame graph's
sample count; pg_stat_slru's blks_read delta).
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import CHECKOUT, need, run_pgprobe
from slru_workload import XACT
from test_clog_reads import Workload, start, stop, workload  # noqa: F401  (fixture)
from test_flame import HOT, backend, busy  # noqa: F401  (fixtures)

from pgprobe import cli
from pgprobe.render import pprof
from pgprobe.sandbox import PgCluster
from pgprobe.tools import hot, pprof_export, profiling

GO = shutil.which("go") or "/usr/local/go/bin/go"
PROTO = "pgprobe/render/pprof_proto/profile.proto"


# -- go tool pprof ---------------------------------------------------------------------------


def go_pprof(*args: str) -> str:
    need(os.path.exists(GO), "Go is not installed (go tool pprof reads the profiles)")
    done = subprocess.run(
        [GO, "tool", "pprof", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GOTOOLCHAIN": "local", "HOME": os.environ.get("HOME", "/root")},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


TOP_LINE = re.compile(r"^\s*(\d+)(?:ns)?\s+\S+%\s+\S+%\s+(\d+)(?:ns)?\s+\S+%\s+(.+?)\s*$")


def pprof_top(path: Path, sample_index: str) -> tuple[int, Counter[str], Counter[str]]:
    """(total, flat per function, cum per function) from `go tool pprof -top`."""
    # -unit=ns: CPU time in whole nanoseconds, not scaled to "1.51s".
    out = go_pprof("-top", f"-sample_index={sample_index}", "-unit=ns", "-nodecount=1000000",
                   "-nodefraction=0", "-edgefraction=0", str(path))  # fmt: skip
    total = int(re.search(r"of (\d+)(?:ns)? total", out).group(1))  # type: ignore[union-attr]
    flat: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    for line in out.splitlines():
        m = TOP_LINE.match(line)
        if m:
            flat[m.group(3)] += int(m.group(1))
            cum[m.group(3)] += int(m.group(2))
    return total, flat, cum


def raw_totals(path: Path) -> tuple[list[str], list[int], Counter[str]]:
    """(sample type header, value sums, pid label per sample) from `go tool pprof -raw`."""
    out = go_pprof("-raw", str(path))
    lines = out.splitlines()
    head = lines.index("Samples:") + 1
    types = lines[head].split()
    sums = [0] * len(types)
    pids: Counter[str] = Counter()
    for line in lines[head + 1 : lines.index("Locations")]:
        values, colon, _ = line.partition(":")
        if colon and values.strip() and all(v.isdigit() for v in values.split()):
            for i, v in enumerate(values.split()):
                sums[i] += int(v)
        else:
            pids.update(re.findall(r"\bpid:\[(\d+)\]", line))
    return types, sums, pids


# -- the schema and the renderer -------------------------------------------------------------


def test_generated_module_matches_the_proto(tmp_path: Path) -> None:
    # a pinned test dependency (pyproject.toml): scripts/setup installs it
    need(importlib.util.find_spec("grpc_tools") is not None, "grpcio-tools is not installed")
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", PROTO],
        capture_output=True, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("profile_pb2.py", "profile_pb2.pyi"):
        fresh = (tmp_path / PROTO).parent / name
        committed = CHECKOUT / PROTO.replace("profile.proto", name)
        assert fresh.read_bytes() == committed.read_bytes(), f"regenerate {committed}"


def test_build_fills_the_tables_the_format_asks_for() -> None:
    f = pprof.Frame
    samples = [
        pprof.Sample((f("leaf", "postgres"), f("main", "postgres")), (3, 30), {"pid": "7"}),
        pprof.Sample((f("read", "libc.so.6"), f("main", "postgres")), (2, 20), {"pid": "8"}),
        pprof.Sample((f("main", "postgres"),), (1, 10), {"pid": "8", "application_name": ""}),
    ]
    types = (pprof_export.SAMPLES, pprof_export.CPU_NS)
    built = pprof.build(samples, types, default_type="cpu", main_module="libc.so.6")
    profile = pprof.read(pprof.render(built))
    strings = list(profile.string_table)
    assert strings[0] == "" and len(set(strings)) == len(strings)
    assert [strings[m.filename] for m in profile.mapping] == ["libc.so.6", "postgres"]
    assert all(m.has_functions for m in profile.mapping)
    assert [strings[fn.name] for fn in profile.function] == ["leaf", "main", "read"]
    assert [list(s.value) for s in profile.sample] == [[3, 30], [2, 20], [1, 10]]
    assert [list(s.location_id) for s in profile.sample] == [[1, 2], [3, 2], [2]]
    assert strings[profile.default_sample_type] == "cpu"
    # An empty label says nothing and is left out.
    assert [[strings[lb.key] for lb in s.label] for s in profile.sample] == [["pid"]] * 3
    # The same profile gives the same bytes (no timestamp in the gzip header).
    assert pprof.render(built) == pprof.render(built)
    assert gzip.decompress(pprof.render(built)) == built.SerializeToString()
    with pytest.raises(ValueError, match="2 sample types"):
        pprof.build([pprof.Sample((f("x"),), (1,))], types)
    with pytest.raises(ValueError, match="not a sample type"):
        pprof.build([], types, default_type="reads")


@pytest.mark.parametrize(
    "name, frame",
    [
        ("libc.so.6`__libc_pread", pprof.Frame("__libc_pread", "libc.so.6")),
        ("postgres+0x2f70b0", pprof.Frame("postgres+0x2f70b0", "postgres")),
        ("[unknown]", pprof.Frame("[unknown]", "[unknown]")),
        ("SimpleLruReadPage", pprof.Frame("SimpleLruReadPage", "postgres")),
    ],
)
def test_folded_names_back_to_functions_and_modules(name: str, frame: pprof.Frame) -> None:
    assert pprof_export.frame_of(name, "postgres") == frame


FOLDED = """\
main;PostgresMain;exec_simple_query;ExecScan;hash_bytes 70
main;PostgresMain;exec_simple_query;ExecScan 20
main;PostgresMain;exec_simple_query;ExecScan;ExecScan 5
main;PostgresMain;WaitEventSetWait;epoll_wait 5
"""


def test_flame_from_a_folded_file_to_pprof_by_extension(tmp_path: Path) -> None:
    (tmp_path / "cpu.folded").write_text(FOLDED)
    out = tmp_path / "cpu.pb.gz"
    done = run_pgprobe(["flame", "--from", str(tmp_path / "cpu.folded"), "-o", str(out)],
                       unprivileged=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    total, flat, cum = pprof_top(out, "samples")
    assert total == 100
    assert +flat == {"hash_bytes": 70, "ExecScan": 25, "epoll_wait": 5}
    # Cumulative counts a recursive function once per sample.
    assert cum["ExecScan"] == 95 and cum["main"] == 100 and cum["hash_bytes"] == 70
    # Refused before anything is done: a directory that is not there (exit 7, an output
    # that cannot be written).
    tty = run_pgprobe(["flame", "--from", str(tmp_path / "cpu.folded"), "--format", "pprof",
                       "-o", str(tmp_path / "no" / "x.pb.gz")])  # fmt: skip
    assert tty.returncode == 7 and tty.stderr.count("\n") == 1, tty.stderr


# -- captures --------------------------------------------------------------------------------


@pytest.mark.integration
def test_cpu_profile_agrees_with_pgprobe_hot(cluster: PgCluster, busy: int, tmp_path: Path) -> None:  # noqa: F811
    ns = cli.build_parser().parse_args(
        ["hot", *cluster.conn_args, "--pid", str(busy), "-d", "3", "-F", "199", "--kernel"]
    )
    profile = profiling.collect(ns)  # one capture, as `pgprobe hot` takes it
    rows = hot.hot_rows(profile.stacks, by_module=False)
    path = tmp_path / "cpu.pb.gz"
    pprof_export.write(str(path), pprof_export.cpu_profile(profile))

    total, flat, cum = pprof_top(path, "samples")
    print(go_pprof("-top", "-nodecount=12", str(path)))
    print("\n".join(f"{r.self_samples:6} {r.total_samples:6}  {r.function}" for r in rows[:12]))
    assert total == profile.samples > 50
    hot_self: Counter[str] = Counter()
    hot_total: Counter[str] = Counter()
    for r in rows:
        hot_self[r.function or ""] += r.self_samples
        hot_total[r.function or ""] += r.total_samples
    assert +flat == +hot_self
    assert cum == hot_total
    assert (rows[0].function, max(flat, key=lambda k: flat[k])) == (HOT, HOT)
    # The nanoseconds are the samples at the sampling period, and the period is said.
    types, sums, pids = raw_totals(path)
    assert types == ["samples/count", "cpu/nanoseconds[dflt]"]
    assert sums == [profile.samples, profile.samples * round(1e9 / 199)]
    assert set(pids) == {str(busy)}
    ns_total, _, _ = pprof_top(path, "cpu")
    assert ns_total == sums[1]


@pytest.mark.integration
def test_flame_writes_pprof_with_labels(cluster: PgCluster, busy: int, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "cpu.pb.gz"
    done = run_pgprobe(["flame", *cluster.conn_args, "--pid", str(busy), "-d", "2", "-o",
                        str(path)])  # fmt: skip
    assert done.returncode == 0, done.stderr
    raw = go_pprof("-raw", str(path))
    samples = int(re.search(r"pgprobe: samples: ([\d,]+)", raw).group(1).replace(",", ""))  # type: ignore[union-attr]
    types, sums, pids = raw_totals(path)
    assert sums[0] == samples > 0
    assert set(pids) == {str(busy)}
    assert "backend_type:[client backend]" in raw
    assert "PeriodType: cpu nanoseconds" in raw and "Period: 10101010" in raw


@pytest.mark.integration
@pytest.mark.once  # stacks: builds without frame pointers give only the pread leaf (issue 15)
def test_clog_reads_pprof_counts_the_reads(workload: Workload, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "reads.pb.gz"
    probe = start(workload, "--pid", str(workload.pid), "--pprof", str(path))
    delta = workload.run(subtrans=False)
    stop(probe)
    types, sums, pids = raw_totals(path)
    reads = delta[XACT][1]
    assert types == ["reads/count[dflt]"] and sums == [reads] and reads > 0
    assert set(pids) == {str(workload.pid)}
    _, _, cum = pprof_top(path, "reads")
    assert cum["SimpleLruReadPage"] == reads and cum["TransactionIdGetStatus"] == reads
    assert "application_name:[slru-workload]" in go_pprof("-raw", str(path))
