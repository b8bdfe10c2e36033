"""Scripts run by hand beside pgprobe, as a test's truth: bpf/waits.bt with bpftrace,
d/waits.d with DTrace, started with the parameters their headers say, read until they say
they are attached, stopped for their maps; and the rows of those maps the tests read."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

from helpers import CHECKOUT, WAITS_BT_SHARE, until

from pgprobe import kernelbtf
from pgprobe.engines import sigqueue
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.waitevents import address, backend_state, lockwait, statement

# a row of the scripts' @unseen: kind, tid (d/waits.d prints tab-separated columns)
UNSEEN_ROW = re.compile(r"@unseen(?:\[|\t)\d+(?:, |\t)(\d+)(?:\]: |\t)\d+$")
# The scripts by hand lose events on this shared 2-CPU machine as pgprobe's bpftrace time
# model does (helpers.WAITS_BT), and say so in @unseen
SCRIPT_LOST_SHARE = WAITS_BT_SHARE
# a row of bpf/waits.bt's (and d/waits.d's) lock maps: tid, mode, type, field1-4
SCRIPT_ROW = re.compile(r"@lock_(ns|waits|max)(?:\[|\t)(\d+(?:(?:, |\t)\d+){6})(?:\]: |\t)(\d+)$")
ScriptLocks = dict[int, dict[tuple[int, ...], dict[str, int]]]


def major_of(pg: PgCluster) -> int:
    return int(pg.sql("SHOW server_version_num")[0][0]) // 10000


def by_hand_args(pg: PgCluster, binary: Path) -> list[str]:
    """waits.d's parameters (waits.bt's, less the task_struct offsets), as the headers say:
    MyBEEntry's address and st_state's offset, the lock dimension's (MyProc's address,
    offsetof(PGPROC, waitLock)) and the query dimension's (offsetof(PgBackendStatus,
    st_query_id))."""
    major = major_of(pg)
    where = address.find(pg.postmaster_pid, str(binary))
    found = lockwait.find(where, major)
    state = backend_state.find(where, major)
    assert found is not None and state is not None
    return [str(pg.postmaster_pid), str(where.address), "0", "0", str(state.address),
            str(state.offset), str(found.proc), str(found.wait_lock_offset),
            str(statement.QUERY_ID_OFFSET[major])]  # fmt: skip


class ByHand:
    """A script run by hand, until it says it is attached (live); stop() its lock maps.

    answer: the line a bpftrace script ends its answer with (SIGURG, sent as sigqueue does):
    stop() asks for the answer first and keeps what came up to it. The maps Ctrl-C prints
    come after bpftrace 0.17 detached its probes one at a time (50-150 ms here), and a
    scheduler script sees wakeups without their switches then (bpf/waits.bt, "USAGE")."""

    def __init__(self, argv: list[str], live: str, env: dict[str, str] | None = None,
                 answer: str | None = None) -> None:  # fmt: skip
        self.answer = answer
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env)  # fmt: skip
        # both pipes drained: DTrace says each copyin() that faults (a process tearing its
        # memory down) on stderr, and blocks once the pipe is full
        self.lines: list[str] = []
        self.errors: list[str] = []
        pipes = ((self.process.stdout, self.lines), (self.process.stderr, self.errors))
        self.readers = [threading.Thread(target=self._read, args=pipe) for pipe in pipes]
        for reader in self.readers:
            reader.start()
        attached = lambda: any(ln.startswith(live) for ln in self.lines)  # noqa: E731
        until(lambda: attached() or self.process.poll() is not None, f"{argv[:2]} attached", 120)
        assert attached(), self.errors[-20:]

    @classmethod
    def waits_bt(cls, pg: PgCluster, build: PgBuild) -> ByHand:
        first = by_hand_args(pg, build.postgres)
        argv = ["bpftrace", str(CHECKOUT / "bpf" / "waits.bt"), *first[:6],
                *map(str, kernelbtf.task_offsets().as_args()), *first[6:]]  # fmt: skip
        return cls(argv, "@@live", {**os.environ, "BPFTRACE_MAP_KEYS_MAX": "65536"}, "@@answer")

    @staticmethod
    def _read(pipe: IO[str] | None, into: list[str]) -> None:
        assert pipe is not None
        into.extend(line.rstrip("\n") for line in pipe)

    def stop(self) -> list[str]:
        answered = len(self.lines)
        if self.answer is not None:
            sigqueue.send(self.process.pid, signal.SIGURG)
            said = lambda: self.answer in self.lines[answered:]  # noqa: E731
            until(lambda: said() or self.process.poll() is not None, "the answer", 60)
            assert said(), f"{self.process.args[:2]} ended without its answer: {self.errors[-5:]}"
            answered = self.lines.index(self.answer, answered) + 1
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # bpftrace 0.17 hangs past its SIGINT now and then under load (CIs: 4ad0792,
            # e08a3d3): killed, not left attached to every context switch of the machine
            # under the tests that follow. With its answer in hand the truth is kept.
            self.process.kill()
            self.process.wait(timeout=60)
            said = self.errors[-5:]
            if self.answer is None:
                raise AssertionError(f"{self.process.args[:2]} did not end within 60 s of "
                                     f"SIGINT: killed; stderr {said}") from None  # fmt: skip
            print(f"{self.process.args[:2]} did not end within 60 s of SIGINT, after its "
                  f"answer: killed; stderr {said}")  # fmt: skip
        for reader in self.readers:
            reader.join(timeout=120)
        return self.lines[:answered] if self.answer is not None else self.lines


def script_locks(lines: list[str]) -> ScriptLocks:
    """tid -> (mode, type, field1-4) -> {"ns", "waits", "max"}: the last print of each."""
    out: ScriptLocks = {}
    for line in lines:
        m = SCRIPT_ROW.match(line)
        if m:
            tid, *key = (int(v) for v in re.split(r", |\t", m.group(2)))
            out.setdefault(tid, {}).setdefault(tuple(key), {})[m.group(1)] = int(m.group(3))
    return out


def script_lost(lines: list[str]) -> set[int]:
    """The tids of a script's @unseen (events it can tell it never saw: their time is
    lost, or moved from the runqueue to a sleep), from any of its prints."""
    return {int(m.group(1)) for m in map(UNSEEN_ROW.match, lines) if m}
