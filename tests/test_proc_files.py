"""proc.SchedstatFiles (top's /proc/PID/schedstat kept open) against the file read anew:
real child processes, no PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pgprobe import proc

BURN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_kept_file_reads_what_the_path_reads_and_follows_a_running_process() -> None:
    files = proc.SchedstatFiles(limit=8)
    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        time.sleep(0.2)
        first = files.read(burner.pid)
        time.sleep(0.3)
        kept, fresh = files.read(burner.pid), proc.schedstat(burner.pid)
        assert first is not None and kept is not None and fresh is not None
        assert kept[0] > first[0] + 100_000_000  # on CPU meanwhile: not a stale read
        assert kept[0] <= fresh[0] and fresh[0] - kept[0] < 50_000_000  # read just before
    finally:
        burner.kill()
        burner.wait()
    # the process gone (reaped): the kept descriptor says so, and is closed
    before = open_fds()
    assert files.read(burner.pid) is None
    assert open_fds() == before - 1
    files.close()


def test_past_its_limit_it_reads_the_path_and_keeps_nothing_open() -> None:
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        files = proc.SchedstatFiles(limit=1)
        before = open_fds()
        reads = [files.read(p.pid) for p in sleepers]
        assert reads == [proc.schedstat(p.pid) for p in sleepers]
        assert open_fds() == before + 1
        files.keep_only({sleepers[1].pid})  # the first one's closed
        assert open_fds() == before
        files.close()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
