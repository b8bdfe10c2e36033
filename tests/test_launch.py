"""pgprobe's entry point raises pgprobe and its session's autogroup for a one-shot command
and puts the autogroup back at the end, at a capture's SIGTERM and at a SIGTERM outside a
capture (pgprobe.launch, pgprobe.priority). Real processes, real autogroups: each run is
a session of its own (start_new_session), with a shell as its leader that reads the
session's autogroup after pgprobe has gone.

Where a new session gets no autogroup (a kernel without CONFIG_SCHED_AUTOGROUP; an empty
/proc/self/autogroup), pgprobe can only raise its own nice: the tests then check that, and
that nothing else is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import CHECKOUT, bpftrace_child, need

from pgprobe import launch, priority
from pgprobe.sandbox import PgCluster


def test_one_shot_commands_are_raised_serve_and_help_are_not() -> None:
    assert launch.wants_priority(["lwlocks", "-d", "1"])
    assert launch.wants_priority(["flame", "--pid", "42"])
    assert not launch.wants_priority(["serve", "--listen", "127.0.0.1:9187"])
    assert not launch.wants_priority(["--help"])
    assert not launch.wants_priority([])


def new_session_autogroup() -> int | None:
    """The autogroup nice of a session started from here: 0, or None without autogroups.
    Asked of a new session, not of this process: a process that never began a session
    (under some CI runners and containers) has none, while its new sessions may."""
    shown = subprocess.run(
        ["cat", "/proc/self/autogroup"], capture_output=True, text=True, start_new_session=True
    ).stdout.split()
    return int(shown[-1]) if shown else None


SESSION_NICE_AFTER = new_session_autogroup()


def in_own_session(command: str) -> subprocess.Popen[str]:
    """sh (the session's leader) runs command, then prints its exit status and the
    session's autogroup nice (if it has an autogroup), which outlives command."""
    need(os.geteuid() == 0, "needs root to raise a priority")
    need(priority.NICE != 0, "PGPROBE_TRACER_NICE=0: nothing is raised")
    script = f'{command}; echo "rc=$?"; cat /proc/self/autogroup'
    return subprocess.Popen(
        ["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=CHECKOUT, start_new_session=True,
    )  # fmt: skip


def python_child(shell: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{shell.pid}/task/{shell.pid}/children") as f:
            kids = [int(p) for p in f.read().split()]
        if kids:
            return kids[0]
        time.sleep(0.02)
    pytest.fail("the shell started nothing")


def wait_raised(pid: int) -> None:
    """The process at NICE, and its autogroup too where it has one."""
    raised_group = priority.NICE if SESSION_NICE_AFTER is not None else None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        group = priority.autogroup_nice(pid)
        if group == raised_group and os.getpriority(os.PRIO_PROCESS, pid) == priority.NICE:
            return
        time.sleep(0.02)
    pytest.fail(f"not raised: autogroup {priority.autogroup_nice(pid)}")


def session_end(shell: subprocess.Popen[str]) -> tuple[str, int | None]:
    """The command's exit status and the session's autogroup nice (None: no autogroup)."""
    out, err = shell.communicate(timeout=120)
    lines = out.splitlines()
    rc = next(ln for ln in lines if ln.startswith("rc="))
    group = [ln for ln in lines if ln.startswith("/autogroup-")]
    return rc, int(group[-1].split()[-1]) if group else None


def test_a_capture_raises_its_session_and_puts_it_back(cluster: PgCluster, tracing: None) -> None:
    args = " ".join(cluster.conn_args)
    shell = in_own_session(f"{sys.executable} -m pgprobe lwlocks {args} -d 2 >/dev/null")
    pid = python_child(shell)
    wait_raised(pid)
    rc, nice = session_end(shell)
    assert rc == "rc=0" and nice == SESSION_NICE_AFTER


def test_sigterm_in_a_capture_puts_the_session_back(cluster: PgCluster, tracing: None) -> None:
    # the script, not the compiled object: a bpftrace child to wait for
    args = " ".join(["--source", "usdt", "--engine", "bpftrace", *cluster.conn_args])
    shell = in_own_session(f"{sys.executable} -m pgprobe lwlocks {args} -d 60 >/dev/null")
    pid = python_child(shell)
    wait_raised(pid)
    deadline = time.monotonic() + 60
    while bpftrace_child(pid) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # attached: the capture's own handler has SIGTERM now
    os.kill(pid, signal.SIGTERM)
    rc, nice = session_end(shell)
    # the capture ended as by Ctrl-C, and printed
    assert rc == "rc=0" and nice == SESSION_NICE_AFTER


def test_sigterm_outside_a_capture_puts_the_session_back_and_still_kills() -> None:
    """A SIGTERM as soon as the raise is seen (before the handler is in, were it not held)
    still puts the session back."""
    code = (
        "import signal, time; from pgprobe import launch; "
        "launch.raise_guarded((signal.SIGTERM,), True); time.sleep(60)"
    )
    shell = in_own_session(f"{sys.executable} -c '{code}'")
    pid = python_child(shell)
    wait_raised(pid)
    os.kill(pid, signal.SIGTERM)
    rc, nice = session_end(shell)
    assert rc == "rc=143" and nice == SESSION_NICE_AFTER  # killed by SIGTERM (128 + 15), as before


def test_a_session_raised_already_is_left_as_it_is() -> None:
    """Two pgprobes in one session: the second finds it raised, and does not put it back.
    Without an autogroup both leave it alone (None), and each still raises its process."""
    code = (
        "from pgprobe import priority; "
        "first = priority.raise_own(); second = priority.raise_own(); "
        "second(); print(priority.autogroup_nice()); first(); print(priority.autogroup_nice()); "
        "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"
    )
    shell = in_own_session(f"{sys.executable} -c '{code}'")
    out, err = shell.communicate(timeout=60)
    lines = out.split()
    if SESSION_NICE_AFTER is None:
        assert lines[:3] == ["None", "None", str(priority.NICE)], (out, err)
    else:
        assert lines[:3] == [str(priority.NICE), "0", str(priority.NICE)], (out, err)
