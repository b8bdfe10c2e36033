"""Where a compiled object does not load, the tool runs its bpftrace script and says why in
one line, in meta.warnings and on stderr (pgprobe.engines.compiled.object_or_script).

The object is made unloadable for one run only: in a private mount namespace a file that is
no BPF object is mounted over the checkout's bpf/build/<object>; the checkout is untouched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CHECKOUT, need

from pgprobe.sandbox import PgCluster

CASES = [
    (["waits", "-d", "1"], "waits.bpf.o", "ran bpf/waits.bt, costlier per context switch"),
    (
        ["flame", "--unwind", "fp", "-d", "1", "-o", "/dev/null"],
        "profile.bpf.o",
        "ran bpf/profile.bt",
    ),
    (["clog-reads", "-d", "1"], "clog_reads.bpf.o", "ran bpf/clog_reads_uprobe.bt"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("args", "obj", "instead"), CASES, ids=[c[1] for c in CASES])
def test_an_object_that_does_not_load_gives_the_script_said_once(
    cluster: PgCluster, tracing: None, tmp_path: Path, args: list[str], obj: str, instead: str
) -> None:
    need(shutil.which("unshare") is not None, "unshare (util-linux) is not installed")
    path = CHECKOUT / "bpf" / "build" / obj
    need(path.is_file(), f"bpf/build/{obj} is not built (scripts/build-bpf)")
    damaged = tmp_path / obj
    damaged.write_bytes(b"not a BPF object\n")
    mount = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'

    def run(*more: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh",
             str(damaged), str(path), sys.executable, "-m", "pgprobe", *args, *more,
             *cluster.conn_args],
            capture_output=True, text=True, timeout=120, cwd=CHECKOUT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    meta = json.loads(run("--json").stdout)["meta"]
    assert path.read_bytes()[:4] == b"\x7fELF"  # outside the namespace: the object, untouched
    assert meta["engine"] == "bpftrace", meta
    said = [w for w in meta["warnings"] if w.startswith(f"bpf/build/{obj} did not load here (")]
    assert len(said) == 1 and said[0].endswith(f"): {instead}"), meta["warnings"]
    # the table's run: the same line on stderr, once
    shown = run().stderr.splitlines()
    assert shown.count(f"pgprobe: warning: {said[0]}") == 1, shown
