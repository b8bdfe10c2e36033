"""Issue 30, rows 5, 6 and 8: tracer output, result files and DWARF data, tried for real.

- Row 5: a tracer line of 16 and 64 MB (bpftrace prints each map as one line) is read in
  time linear in its size, by the real runner from a real process, and reaches the parser
  whole (the quadratic re-split took 3.7 s of CPU at 16 MB, 59 s at 64 MB).
- Row 6: a result on a full disk (/dev/full, stdout on /dev/full, a real tmpfs filled up)
  is one line and exit 7, never a traceback, "bad options" or "internal error", and leaves
  no half file (an old file stays whole); -o onto a symlink replaces the link and leaves
  what it pointed to alone; triage's report (query texts) is 0600.
- Row 8: DWARF capture data has a cap: reached (a small one, set through
  PGPROBE_DWARF_CAP_MIB) during a real capture, it is said in one line and what was kept
  is unwound and shown; reading perf.data does not hold every stack copy at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import test_unwind
from helpers import CHECKOUT, need, run_pgprobe

from pgprobe.engines.base import Event, MapSpec, RunInfo, Snapshot
from pgprobe.engines.bpftrace import _OutputParser
from pgprobe.engines.runner import TracerProcess
from pgprobe.errors import EXIT_OUTPUT
from pgprobe.sandbox import PgCluster
from pgprobe.unwind import perfdata

FULL = "No space left on device"

# -- row 5: a huge tracer line ------------------------------------------------------------------


def run_tracer(child: str, feed_lines: list[int], info: RunInfo) -> float:
    """Run `python -c child` as the tracer through the real runner: pgprobe's CPU seconds."""

    def feed(raw: bytes) -> Iterable[Event]:
        if raw == b"ready":
            info.probes_attached = 1
        feed_lines.append(len(raw))
        return ()

    tracer = TracerProcess("fake", [sys.executable, "-c", child], dict(os.environ), None, info)
    cpu = time.process_time()
    for _ in tracer.run(feed):
        pass
    return time.process_time() - cpu


@pytest.mark.parametrize(("mib", "cpu_bound_s"), [(16, 1.5), (64, 5.0)])
def test_a_huge_tracer_line_is_read_in_linear_time(mib: int, cpu_bound_s: float) -> None:
    """Before: 3.7 s of CPU for 16 MB and 59 s for 64 MB (quadratic); now 0.06 and 0.21 s."""
    size = mib << 20
    child = (
        "import sys; w = sys.stdout.buffer.write; w(b'ready\\n'); "
        f"w(b'@m: ' + b'x' * {size} + b'\\n'); w(b'end\\n')"
    )
    lengths: list[int] = []
    used = run_tracer(child, lengths, RunInfo())
    assert lengths == [5, 4 + size, 3]  # whole: not cut, nothing dropped
    assert used < cpu_bound_s, f"{used:.2f} s of CPU for a {mib} MB line"


def test_a_16_mb_map_line_reaches_the_snapshot_whole() -> None:
    """bpftrace's own JSON: one map of 16 MB, parsed by the real parser, every key kept."""
    keys = 16 * 1024
    child = (
        "import json, sys; w = sys.stdout.buffer.write\n"
        "w(json.dumps({'type': 'attached_probes', 'data': {'probes': 1}}).encode() + b'\\n')\n"
        "w(json.dumps({'type': 'time', 'data': '12:00:00'}).encode() + b'\\n')\n"
        f"m = {{'@stacks': {{f'{{i}}' + 'f' * 1000: 1 for i in range({keys})}}}}\n"
        "w(json.dumps({'type': 'map', 'data': m}).encode() + b'\\n')\n"
    )
    info = RunInfo()
    parser = _OutputParser({"@stacks": MapSpec("stacks", ("str",))}, info)
    tracer = TracerProcess("fake", [sys.executable, "-c", child], dict(os.environ), None, info)
    cpu = time.process_time()
    events = [*tracer.run(parser.feed), *parser.finish()]
    used = time.process_time() - cpu
    finals = [e for e in events if isinstance(e, Snapshot) and e.final]
    assert len(finals) == 1 and len(finals[0].get("stacks")) == keys
    assert used < 1.5, f"{used:.2f} s of CPU"  # before: 3.3 s; now 0.2 s


# -- row 6: results on a full disk, through links, private reports -------------------------------


def folded_input(path: Path, stacks: int = 3000) -> Path:
    """A folded file whose SVG is far larger than 64 KiB."""
    path.write_text("".join(f"main;work_{i};leaf_{i % 7} {i + 1}\n" for i in range(stacks)))
    return path


def one_line(done: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    for bad in ("Traceback", "Exception ignored", "internal error", "see pgprobe"):
        assert bad not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@contextlib.contextmanager
def small_tmpfs(where: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs at where, mounted for the block, to be filled by the test."""
    need(os.geteuid() == 0, "needs root to mount a tmpfs")
    need(shutil.which("mount") is not None, "no mount command")
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    need(done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> None:
    """Write a filler file until the filesystem says it is full."""
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.strerror == FULL, exc


def test_flame_onto_a_full_tmpfs_leaves_no_half_file(tmp_path: Path) -> None:
    source = folded_input(tmp_path / "in.folded")
    with small_tmpfs(tmp_path / "full") as full:
        old = full / "old.svg"
        old.write_text("the previous graph\n")
        fill(full)
        # Replacing a file: it stays whole, as it was.
        done = run_pgprobe(["flame", "--from", str(source), "-o", str(old)], timeout=60)
        one_line(done, EXIT_OUTPUT, f"cannot write {old}: {FULL}", "unchanged")
        assert old.read_text() == "the previous graph\n"
        # A new file: none is left, nor any temp file.
        new = full / "new.svg"
        done = run_pgprobe(["flame", "--from", str(source), "-o", str(new)], timeout=60)
        one_line(done, EXIT_OUTPUT, f"cannot write {new}: {FULL}", "no file was left")
        assert sorted(p.name for p in full.iterdir()) == ["filler", "old.svg"]


def test_flame_from_a_file_onto_dev_full(tmp_path: Path) -> None:
    """Before: exit 2, 'bad options'."""
    source = folded_input(tmp_path / "in.folded")
    done = run_pgprobe(["flame", "--from", str(source), "-o", "/dev/full"], timeout=60)
    one_line(done, EXIT_OUTPUT, f"pgprobe: cannot write /dev/full: {FULL}")
    done = run_pgprobe(["flame", "--from", str(source), "-o", "/dev/null"], timeout=60)
    assert done.returncode == 0 and os.path.exists("/dev/null"), done.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)  # written in place, not replaced


def test_an_output_that_cannot_be_written_is_said_before_the_work(tmp_path: Path) -> None:
    """A missing or read-only directory: exit 7 as at the end, not 2 ("bad options")."""
    source = folded_input(tmp_path / "in.folded", stacks=10)
    done = run_pgprobe(["flame", "--from", str(source), "-o", "/nonexistent/dir/out.svg"])
    one_line(done, EXIT_OUTPUT, "-o /nonexistent/dir/out.svg: cannot write in /nonexistent/dir")
    with small_tmpfs(tmp_path / "ro") as read_only:
        subprocess.run(["mount", "-o", "remount,ro", str(read_only)], check=True)
        done = run_pgprobe(["flame", "--from", str(source), "-o", str(read_only / "x.svg")])
        one_line(done, EXIT_OUTPUT, "a read-only file system")


def test_output_onto_a_symlink_replaces_the_link(tmp_path: Path) -> None:
    source = folded_input(tmp_path / "in.folded", stacks=10)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "cpu.svg"
    link.symlink_to(victim)
    done = run_pgprobe(["flame", "--from", str(source), "-o", str(link)], timeout=60)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_text().startswith("<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.svg", "in.folded", "victim"]


def pgprobe_to_dev_full(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`pgprobe ARGS > /dev/full`."""
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "pgprobe", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=timeout,
                              cwd=CHECKOUT)  # fmt: skip


STDOUT_FULL = f"pgprobe: cannot write to stdout: {FULL}: the output is incomplete"


def test_flame_capture_onto_dev_full(cluster: PgCluster, tracing: None) -> None:
    """Before: exit 2 ('bad options') after the capture."""
    done = run_pgprobe(["flame", *cluster.conn_args, "-d", "1", "-o", "/dev/full"])
    assert one_line(done, EXIT_OUTPUT) == f"pgprobe: cannot write /dev/full: {FULL}"


def test_waits_json_onto_a_full_stdout(cluster: PgCluster, tracing: None) -> None:
    """Before: 'internal error: OSError' (exit 1)."""
    done = pgprobe_to_dev_full(["waits", *cluster.conn_args, "-d", "1", "--json"])
    assert one_line(done, EXIT_OUTPUT) == STDOUT_FULL


def test_a_table_onto_a_full_stdout(cluster: PgCluster) -> None:
    """A table printed without a flush of its own: the failure is said, not left to exit."""
    need(os.geteuid() == 0, "backends reads other users' processes")
    done = pgprobe_to_dev_full(["backends", *cluster.conn_args])
    assert one_line(done, EXIT_OUTPUT) == STDOUT_FULL


def test_triage_report_is_private_and_replaces_a_link(
    cluster: PgCluster, tracing: None, tmp_path: Path
) -> None:
    """The report holds query texts: 0600, whatever the umask; a link at -o is replaced."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    report = tmp_path / "report.html"
    report.symlink_to(victim)
    done = run_pgprobe(["triage", *cluster.conn_args, "-d", "1", "-o", str(report)], timeout=180)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    assert not report.is_symlink()
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    assert "<html" in report.read_text()


# -- row 8: the DWARF capture's cap ----------------------------------------------------------

# test_unwind's: a backend busy in md5 for 120 s, past its JIT compile.
busy_backend = contextlib.contextmanager(test_unwind.busy_backend)


def test_dwarf_capture_stops_at_its_cap_and_shows_what_it_kept(cluster: PgCluster) -> None:
    need(os.geteuid() == 0, "perf -a needs root")
    need(shutil.which("perf") is not None, "perf is not installed (linux-perf)")
    cap_mib = 2
    with busy_backend(cluster) as pid:
        started = time.monotonic()
        done = run_pgprobe(
            ["flame", *cluster.conn_args, "--pid", str(pid), "--unwind", "dwarf", "-d", "20",
             "--json"],
            env={"PGPROBE_DWARF_CAP_MIB": str(cap_mib)},
        )  # fmt: skip
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stderr.splitlines() if "DWARF stacks" in ln]
    assert len(said) == 1, done.stderr
    assert said[0].startswith("pgprobe: warning: stopped collecting DWARF stacks after ")
    assert f"the cap of {cap_mib} MiB" in said[0] and "what was kept is shown" in said[0]
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    meta = doc["meta"]
    assert any("the cap of" in w for w in meta["warnings"])
    assert meta["duration_s"] < 15 and took < 19, (meta["duration_s"], took)
    # perf stops at its first write past the cap; its ring buffers' contents come with it.
    assert meta["perf_data_bytes"] <= (cap_mib << 20) + (os.cpu_count() or 1) * (16 << 20)
    # What was kept is unwound and shown: the busy backend's samples, whole stacks.
    assert meta["samples"] > 0 and doc["rows"]
    assert {r["pid"] for r in doc["rows"]} == {pid}
    frames = {f for r in doc["rows"] for f in r["stack"].split(";")}
    assert any("md5" in f or "ExecInterpExpr" in f for f in frames), sorted(frames)[:20]


def test_reading_perf_data_does_not_hold_every_stack(tmp_path: Path) -> None:
    """A real perf.data of thousands of stack copies read with a small heap (before: every
    sample's copy held in one list, 96 MB of heap for a 227 MB file)."""
    need(os.geteuid() == 0, "perf needs root (or perf_event_paranoid)")
    perf = shutil.which("perf")
    need(perf is not None, "perf is not installed (linux-perf)")
    assert perf is not None
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    data = tmp_path / "perf.data"
    try:
        subprocess.run(
            [perf, "record", "-q", "-e", "cpu-clock", "-c", "250000", "--call-graph",
             "dwarf,16384", "-o", str(data), "-p", str(busy.pid), "--", "sleep", "3"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    finally:
        busy.send_signal(signal.SIGKILL)
        busy.wait()
    held = 0

    def each(sample: perfdata.Sample) -> None:
        nonlocal held
        held += len(sample.stack)

    tracemalloc.start()
    try:
        found = perfdata.read(str(data), [busy.pid], each)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.kept > 1000 and held > 4 << 20, (found.kept, held)
    assert peak < held / 4, f"{peak / 2**20:.1f} MiB of heap for {held / 2**20:.1f} MiB of stacks"
