"""Files that someone else may control, read as data with limits.

pgprobe runs as root, and some files it reads live where others can write: any local user
can create /tmp/perf-PID.map for any pid (as a FIFO, a symlink to /dev/zero, a sparse file
of gigabytes); a data directory belongs to the postgres user; a library's path may have
been replaced since the process mapped it. Such a file is opened here:

- never through a symlink at its last component (O_NOFOLLOW), never blocking (O_NONBLOCK:
  a FIFO's open returns at once), and then only if it is a regular file (fstat);
- where the caller says whose it may be, only if it has one of those owners;
- read up to a size limit, refused whole beyond it.

A refusal is an Untrusted error whose text says what was skipped and why, in a few words,
for the one line the caller prints.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from typing import BinaryIO

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class Untrusted(OSError):
    """A file refused: not regular, not of an expected owner, or too large. str() is the
    reason, e.g. "/tmp/perf-42.map: a FIFO, not a regular file"."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    path: str, owners: Collection[int] | None = None, follow: bool = False
) -> BinaryIO:
    """`path` opened for reading if it is a regular file (of one of `owners`, when given).

    follow: a symlink at the last component is followed (for /proc's magic links such as
    /proc/PID/exe and map_files, which lead to the very file a process runs or maps, and
    for links kept by root, such as /usr/lib/debug/.build-id). Raises Untrusted when
    refused, OSError (ENOENT, ...) when it cannot be opened at all.
    """
    try:
        fd = os.open(path, _FLAGS & ~os.O_NOFOLLOW if follow else _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: the last component is a symlink
            raise Untrusted(f"{path}: a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{path}: {_kind(st.st_mode)}, not a regular file")
        if owners is not None and st.st_uid not in owners:
            raise Untrusted(f"{path}: owned by uid {st.st_uid}, not by the process's user")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str, limit: int, owners: Collection[int] | None = None) -> bytes:
    """The whole of a regular file of at most `limit` bytes (see open_regular); a larger
    one (by its size, or by what a read finds: it may grow) is refused whole."""
    with open_regular(path, owners) as f:
        check_size(f, limit, path)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Untrusted(f"{path}: over the limit of {_mib(limit)}")
    return data


def check_size(f: BinaryIO, limit: int, path: str) -> None:
    """Refuses an open file larger than `limit` bytes (Untrusted)."""
    size = os.fstat(f.fileno()).st_size
    if size > limit:
        raise Untrusted(f"{path}: {_mib(size)}, over the limit of {_mib(limit)}")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size} bytes"


def process_owners(pid: int, proc: str = "/proc") -> frozenset[int]:
    """Whose files a process's own files may be: its real and effective user, and root.

    Empty when the process is gone (nothing then passes an owner check)."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    real, effective = line.split()[1:3]
                    return frozenset({0, int(real), int(effective)})
    except (OSError, ValueError):
        pass
    return frozenset()
