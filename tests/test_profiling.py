"""pgprobe.tools.profiling and hot's arithmetic on written records (no tracing)."""

from __future__ import annotations

from pathlib import Path

from pgprobe.discover import Backend, Cluster, Targets
from pgprobe.engines.base import NamedStack, RunInfo, Snapshot
from pgprobe.symbolize import Frame, Symbolizer
from pgprobe.tools import hot, profiling

BINARY = "/usr/lib/postgresql/15/bin/postgres"


def targets(pids: list[int], whole: bool = False) -> Targets:
    cluster = Cluster(
        postmaster_pid=4000,
        binary=BINARY,
        version_num=150018,
        version="15.18",
        data_directory=None,
        own_pid=4999,
    )
    return Targets(cluster, pids, whole_cluster=whole)


def named(*frames: str) -> NamedStack:
    return NamedStack(tuple(frames))


def profile_of(snapshot: Snapshot, tg: Targets, kernel: bool = False) -> profiling.Profile:
    backends = {4001: Backend(4001, "client backend", application_name="app")}
    return profiling.name_stacks(
        tg, RunInfo(), snapshot, Symbolizer(kallsyms=False), 99, kernel, backends
    )


def test_named_stacks_fold_filter_and_count_losses() -> None:
    user = named("postgres`hash_bytes+0x3a", "postgres`0x5e8a90", "libc.so.1`_start+0x10")
    snapshot = Snapshot(
        final=True,
        maps={
            "kstacks": {
                (4001, named("genunix`read+0x1"), user): 5,
                (4001, named(), user): 3,
                (4002, named(), user): 4,  # not a target
                (4999, named(), user): 1,  # pgprobe's own backend
                (4001, named(), named()): 1,  # the stack was refused
            },
            "samples": {(): 16},
        },
    )
    p = profile_of(snapshot, targets([4001]), kernel=True)
    assert p.samples == 9 and p.pids == [4001]
    assert p.samples_taken == 16 and p.samples_stored == 14 and p.lost_samples == 2
    assert p.samples_without_stack == 1
    assert p.folded() == {
        "libc.so.1`_start;postgres`0x5e8a90;hash_bytes;read_[k]": 5,
        "libc.so.1`_start;postgres`0x5e8a90;hash_bytes": 3,
        "[unknown]": 1,
    }
    per = p.folded(per_backend=True)
    assert set(per) == {f"pid 4001: client backend (app);{s}" for s in p.folded()}
    # two postgres frames in each of 8 samples, one of them unresolved: half
    assert round(p.server_unresolved_pct, 1) == 50.0
    assert p.facts()["lost"] == "2" and p.facts()["samples"] == "9"
    assert p.meta()["lost_samples"] == 2
    assert any("no user stack" in w for w in p.warnings())


def test_hot_counts_recursion_once_and_groups_by_module() -> None:
    def fr(name: str, module: str = "postgres") -> Frame:
        return Frame(name, module, True)

    stacks = [
        # innermost first: main -> ExecInterpExpr -> ExecInterpExpr (recursion) -> hash_bytes
        profiling.StackCount(
            1, (fr("hash_bytes"), fr("ExecInterpExpr"), fr("ExecInterpExpr"), fr("main")), 6
        ),
        profiling.StackCount(1, (fr("memcpy", "libc.so.6"), fr("ExecInterpExpr"), fr("main")), 3),
        profiling.StackCount(2, (), 1),  # no stack at all
    ]
    rows = {r.function: r for r in hot.hot_rows(stacks, by_module=False)}
    assert rows["hash_bytes"].self_samples == 6 and rows["hash_bytes"].total_samples == 6
    assert rows["ExecInterpExpr"].self_samples == 0
    assert rows["ExecInterpExpr"].total_samples == 9  # not 15: once per sample
    assert rows["[unknown]"].self_samples == 1
    assert rows["main"].as_json()["total_pct"] == 90.0
    ordered = hot.hot_rows(stacks, by_module=False)
    assert [r.function for r in ordered[:3]] == ["hash_bytes", "memcpy", "[unknown]"]
    by_total = hot.hot_rows(stacks, by_module=False, sort="total")
    assert by_total[0].function in ("ExecInterpExpr", "main")
    libs = hot.hot_rows(stacks, by_module=True)
    assert [(r.module, r.self_samples, r.total_samples) for r in libs] == [
        ("postgres", 6, 9),
        ("libc.so.6", 3, 3),
        ("[unknown]", 1, 1),
    ]
    assert "function" not in libs[0].as_json()


def test_script_args_and_map_size() -> None:
    assert profiling.script_args(targets([4001]), 99, False) == [99, 4000, 4001, 0, 0]
    assert profiling.script_args(targets([4001, 4002]), 49, True) == [49, 4000, 0, 1, 0]
    assert profiling.script_args(targets([4001], whole=True), 99, False)[2] == 0
    assert profiling.map_keys(60, 99, cpus=2) >= 60 * 99 * 2
    assert profiling.map_keys(1, 1, cpus=1) == profiling.MIN_MAP_KEYS
    assert profiling.map_keys(86400, 10_000, cpus=64) == profiling.MAX_MAP_KEYS


def test_unresolved_warning_names_the_fix() -> None:
    snapshot = Snapshot(maps={"stacks": {(4001, named("postgres`0x10", "main")): 4}})
    p = profile_of(snapshot, targets([4001]))
    p.server_symbols = "dynsym"
    line = profiling.unresolved_warning(p)
    assert "% of the frames in postgres are unresolved" in line
    assert "dbgsym" in line and BINARY in line
    if Path("/var/lib/dpkg").is_dir() and Path(BINARY).exists():
        assert "postgresql-15-dbgsym" in line


def test_stripped_warning_names_each_file_and_its_package() -> None:
    """Frames shown as module+0x... in files without .symtab: their share of all frames,
    per file, and the -dbgsym package of each (dpkg -S)."""
    snapshot = Snapshot(maps={"stacks": {(4001, named("postgres`0x10", "main")): 4}})
    p = profile_of(snapshot, targets([4001]))
    p.resolved_frames, p.unresolved_frames = 60, 40
    p.stripped_frames = {"postgres": 30, "libcrypto.so.3": 10}
    crypto = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
    p.stripped_paths = {"postgres": BINARY, "libcrypto.so.3": crypto}
    assert p.stripped_pct() == {"postgres": 30.0, "libcrypto.so.3": 10.0}
    line = next(w for w in p.warnings() if "stripped files" in w)
    assert line.startswith("40 % of frames are static functions of stripped files")
    assert "(postgres 30 %, libcrypto.so.3 10 %)" in line
    if Path("/var/lib/dpkg").is_dir() and Path(BINARY).exists() and Path(crypto).exists():
        assert "install postgresql-15-dbgsym, libssl3-dbgsym" in line
        assert p.meta()["debug_packages"] == ["postgresql-15-dbgsym", "libssl3-dbgsym"]
