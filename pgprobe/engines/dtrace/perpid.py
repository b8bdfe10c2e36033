"""DTrace for Linux: PostgreSQL's USDT probes, enabled per pid.

PostgreSQL's probes are systemtap-style ELF notes (.note.stapsdt). DTrace for
Linux (2.0) enables those only for a given pid: ``postgresql12345:::``, no
wildcard (its user guide, "Stapsdt Provider"). Its probe for a pid is a
uprobe on the binary's file whose BPF program checks the pid against the
pids compiled in at start: a backend forked later is not seen.

So on Linux pgprobe rewrites every ``postgresql*:::NAME`` probe description
of a d/ script into one description per process that runs a binary with the
postgresql provider when dtrace starts (the script's pid/ppid predicates still
choose the cluster, as with the wildcard), runs dtrace with -Z (a process may
exit before dtrace enables its probes), and counts, at the end, the server
processes that started meanwhile and were not traced. The pids are integers
read from /proc; no other text enters the script.

-Z does not cover a process that exits between the listing and dtrace's
grab of it (an autovacuum worker, a client that disconnects): dtrace 2.0.7
then fails to compile ("failed to grab process N"; measured: a backend closed
0.5 s after the listing fails every start). The capture starts dtrace again
without that pid (`ungrabbed_pid`, capture.py), a bounded number of times.

Limits: backends that connect during the capture are not traced (pgbench
-C, a pooler opening connections); use the bpftrace engine for those, or
start the capture once the connections are up. Re-running dtrace to take
them in was not done: each start costs 5-15 s of compiling here, during
which nothing is traced.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pgprobe import proc, usdt
from pgprobe.errors import EXIT_ENV, PgprobeError

_WILDCARD = re.compile(r"\b" + usdt.PROVIDER + r"\*(:::[A-Za-z0-9_-]+)")
_GRAB_FAILED = re.compile(r"failed to grab process (\d+)")


def uses_usdt(script_text: str) -> bool:
    return bool(_WILDCARD.search(script_text))


def provider_pids(cluster_pid: int | None = None) -> set[int]:
    """Running processes whose binary has the postgresql USDT provider.

    cluster_pid: only that postmaster and its children (DTrace for Linux takes
    about a second per process to enable here: 49 server processes of other
    clusters on this machine did not attach within a minute).
    """
    found = set()
    if cluster_pid is not None:
        candidates = [cluster_pid, *proc.children(cluster_pid)]
    else:
        candidates = [int(e.name) for e in proc.PROC.iterdir() if e.name.isdigit()]
    for pid in candidates:
        info = proc.read_info(pid)
        if info is None or info.exe is None or not proc.is_postgres(info):
            continue
        binary = info.exe.removesuffix(" (deleted)")
        try:
            if any(p == usdt.PROVIDER for p, _ in usdt.probe_names(binary)):
                found.add(info.pid)
        except PgprobeError:
            continue  # an unreadable binary: not one we can trace either
    return found


def per_pid(script_text: str, pids: Iterable[int]) -> str:
    """Each ``postgresql*:::NAME`` -> ``postgresql<P1>:::NAME, postgresql<P2>:::NAME, ...``."""
    ordered = sorted({int(p) for p in pids})
    if not ordered:
        raise PgprobeError(
            "DTrace for Linux: no running process has the postgresql USDT provider "
            "(a server built with --enable-dtrace must be running)",
            EXIT_ENV,
        )

    def expand(match: re.Match[str]) -> str:
        return ",\n".join(f"{usdt.PROVIDER}{pid}{match.group(1)}" for pid in ordered)

    return _WILDCARD.sub(expand, script_text)


def ungrabbed_pid(stderr: Iterable[str]) -> int | None:
    """The pid of dtrace's "failed to grab process N" compile error, if that is what it said."""
    for line in stderr:
        if m := _GRAB_FAILED.search(line):
            return int(m.group(1))
    return None


def write_script(script: Path, pids: Iterable[int]) -> Path:
    """The script with per-pid probe descriptions, in a temporary file (the caller removes it)."""
    text = per_pid(script.read_text(), pids)
    with tempfile.NamedTemporaryFile(
        "w", prefix=f"pgprobe-{script.stem}-", suffix=".d", delete=False
    ) as out:
        out.write(text)
    return Path(out.name)


UNTRACED_SHOWN = 3  # pids named in the note; the count covers them all


def untraced_note(known: set[int], cluster_pid: int | None) -> str | None:
    """One line for the server processes that started during the capture (not traced).

    known: the pids listed at start (traced, or already reported as not). It
    names the first few new ones (pid and process title: an autovacuum worker,
    a new client's backend) so a DBA can tell whether the ones that matter
    were traced.
    """
    new = sorted(provider_pids(cluster_pid) - known)
    if not new:
        return None
    shown = []
    for pid in new[:UNTRACED_SHOWN]:
        info = proc.read_info(pid)
        title = info.cmdline.removeprefix("postgres: ") if info is not None else "exited"
        shown.append(f"pid {pid} {title}")
    more = f", {len(new) - UNTRACED_SHOWN} more" if len(new) > UNTRACED_SHOWN else ""
    return (
        f"DTrace for Linux: {len(new)} PostgreSQL processes started during the capture and "
        f"were not traced ({'; '.join(shown)}{more}; USDT probes are enabled per pid, at "
        "start; at least this many: those that also exited are not counted); use --engine "
        "bpftrace to include them"
    )
