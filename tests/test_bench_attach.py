"""When the bench opens a traced window: pgprobe's own timing marks on stderr
(bench/overhead._timing_marks). Pure: a file, no tracer, no timing."""

from __future__ import annotations

from pathlib import Path

from bench.overhead import _timing_marks


def test_no_marks_means_the_fallback(tmp_path: Path) -> None:
    err = tmp_path / "tool.err"
    assert _timing_marks(err) is None  # not written yet
    err.write_text("pgprobe: warning: something\n")
    assert _timing_marks(err) is None


def test_marks_count_tracers_spawned_and_attached(tmp_path: Path) -> None:
    err = tmp_path / "tool.err"
    err.write_text(
        "pgprobe: timing imports 0.2100 0.1900\n"
        "pgprobe: timing bpftrace-spawned 0.4000 0.3000\n"
        "pgprobe: warning: 30 % of the frames are unresolved\n"
    )
    assert _timing_marks(err) == (1, 0)
    with err.open("a") as f:
        f.write("pgprobe: timing bpftrace-attached 1.1000 0.3100\n")
        f.write("pgprobe: timing perf-spawned 1.2000 0.3200\n")
    assert _timing_marks(err) == (2, 1)
    with err.open("a") as f:
        f.write("pgprobe: timing perf-attached 1.5000 0.3300\n")
    assert _timing_marks(err) == (2, 2)
