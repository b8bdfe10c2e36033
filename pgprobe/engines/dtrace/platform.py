"""Which DTrace this is, where it is, and whether we may run it.

Two families behave differently enough to matter to pgprobe:

- illumos, Solaris, FreeBSD, macOS: the original DTrace (`dtrace -V`: "Sun D
  1.13"). USDT providers match with a wildcard (``postgresql*``), new processes
  included; fds[] names a file descriptor's path.
- Linux: Oracle's DTrace 2 ("dtrace: D 2.0.7"), BPF-based. PostgreSQL's probes
  are systemtap-style ELF notes, which it enables per pid only
  (``postgresql<PID>``, no wildcard); fds[].fi_dirname is "." (d_path() is a
  stub), so files are named from the dentry; its stacks print at column 0.
  scripts/setup-dtrace installs it, with a launcher, under
  /var/lib/pgprobe/dtrace.

systemtap-sdt-dev also installs a `dtrace` on Linux that only generates probe
headers: it is refused.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pgprobe.errors import EXIT_ENV, PgprobeError
from pgprobe.scripts import script_path

# Where DTrace lives when it is not on a non-root user's PATH; the last is the
# launcher scripts/setup-dtrace writes (DTrace for Linux).
SETUP_LAUNCHER = "/var/lib/pgprobe/dtrace/bin/dtrace"
DTRACE_PATHS = ("/usr/sbin/dtrace", "/usr/bin/dtrace", "/sbin/dtrace", SETUP_LAUNCHER)

_VERSION = re.compile(r"Sun D [0-9][0-9.]*|\bD [0-9]+\.[0-9][0-9.]*")


@dataclass(frozen=True)
class Dtrace:
    """A DTrace found here: its path, what `dtrace -V` said, and its family."""

    path: str
    version: str  # "Sun D 1.13", "D 2.0.7"
    linux: bool  # Oracle's DTrace for Linux: per-pid USDT, dentry file names

    @property
    def library_dir(self) -> Path:
        """The per-platform D library of the d/ scripts (dtrace -L): see d/lib/."""
        return script_path("d", f"lib/{'linux' if self.linux else 'fds'}/pgprobe_fd.d").parent


def _candidates() -> list[str]:
    configured = os.environ.get("PGPROBE_DTRACE")
    # As told, or else the first real one: never another one silently.
    found = [configured] if configured else [shutil.which("dtrace") or "", *DTRACE_PATHS]
    return list(dict.fromkeys(p for p in found if p and os.access(p, os.X_OK)))


def find_dtrace() -> Dtrace:
    """$PGPROBE_DTRACE, else the first real DTrace on PATH, in DTRACE_PATHS."""
    candidates = _candidates()
    if not candidates:
        configured = os.environ.get("PGPROBE_DTRACE")
        said = f" (PGPROBE_DTRACE={configured} is not executable)" if configured else ""
        raise PgprobeError(
            f"dtrace not found{said}: DTrace comes with illumos, Solaris, FreeBSD and macOS; "
            "on Linux run scripts/setup-dtrace (DTrace for Linux) or use --engine bpftrace",
            EXIT_ENV,
        )
    refusal: PgprobeError | None = None
    for path in candidates:
        try:
            version = dtrace_version(path)
        except PgprobeError as exc:
            refusal = refusal or exc
            continue
        linux = version.startswith("D ") and platform.system() == "Linux"
        return Dtrace(path, version, linux)
    assert refusal is not None
    raise refusal


def dtrace_version(dtrace: str) -> str:
    """What `dtrace -V` says ("Sun D 1.13", "D 2.0.7"); refuses a `dtrace` that is not DTrace.

    systemtap-sdt-dev installs a /usr/bin/dtrace on Linux that only generates
    USDT headers: it must not be mistaken for the tracer.
    """
    try:
        done = subprocess.run([dtrace, "-V"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PgprobeError(f"cannot run {dtrace} -V: {exc}", EXIT_ENV) from None
    said = (done.stdout + done.stderr).strip()
    match = _VERSION.search(said)
    if not match:
        first = said.splitlines()[0] if said else "nothing"
        raise PgprobeError(
            f"{dtrace} is not DTrace (`dtrace -V` said: {first}); on Linux, systemtap's "
            "dtrace only generates probe headers: run scripts/setup-dtrace for DTrace for "
            "Linux, or use --engine bpftrace",
            EXIT_ENV,
        )
    return match.group(0)


def _solaris_privileges() -> set[str]:
    """The effective privileges of this process on illumos/Solaris (ppriv)."""
    try:
        out = subprocess.run(
            ["ppriv", str(os.getpid())], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    for line in out.splitlines():
        label, _, privs = line.strip().partition(":")
        if label == "E":
            return {p.strip() for p in privs.split(",")}
    return set()


def require_privileges() -> None:
    """Root, or on illumos/Solaris the dtrace_proc and dtrace_user privileges."""
    if os.geteuid() == 0:
        return
    if platform.system() == "SunOS":
        have = _solaris_privileges()
        if "all" in have or {"dtrace_proc", "dtrace_user"} <= have:
            return
        raise PgprobeError(
            "DTrace needs root, or the dtrace_proc and dtrace_user privileges "
            "(usermod -K defaultpriv=basic,dtrace_proc,dtrace_user USER): "
            "run `pfexec pgprobe ...` or `sudo pgprobe ...`",
            EXIT_ENV,
        )
    raise PgprobeError("DTrace needs root: run `sudo pgprobe ...`", EXIT_ENV)


def preflight() -> None:
    """Fail early, in one line, when DTrace cannot run here."""
    require_privileges()
    find_dtrace()
