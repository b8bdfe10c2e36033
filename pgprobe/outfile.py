"""Writing results: whole or not at all, never through a link, private when they hold names.

pgprobe runs as root, often in a directory others can write (/tmp) and on a host whose
disk may be full when it is needed most. So every result file (-o, a clog-reads stack file,
triage's report) goes through write():

- no file or a regular file (or a symlink) at the target: the data goes to a temp file
  created exclusively (mkstemp: O_EXCL) in the target's directory, is flushed and
  fsync'd, then renamed over the target. A full disk or a crash leaves the old file (or
  none), never half of one; a symlink at the target is replaced, never followed.
- mode, on every write (the content is new whatever was there before): 0600 when the
  result holds names a database client chose (query texts, application, role and
  database names: private=True), else 0666 & ~umask as for any new file. The owner is
  whoever runs pgprobe: a file planted in /tmp gives its planter nothing.
- an existing target that is not a regular file (/dev/null, /dev/full, a FIFO): written
  in place, opened with O_NOFOLLOW and without O_CREAT.
- None or "-": stdout.

A failure is one line and EXIT_OUTPUT (7): "cannot write X: No space left on device", at
the end; check() says what it can before a long capture (a missing or read-only directory).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys

from pgprobe.errors import EXIT_OUTPUT, PgprobeError

# What a write says when the disk (or the quota, or the file size limit) is full: only
# writes fail so, which is how cli.main tells stdout's failure from a bug.
FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
PRIVATE_MODE = 0o600


def write(path: str | os.PathLike[str] | None, data: str | bytes, private: bool = False) -> None:
    """data to path (None or "-": stdout) as the module's docstring says."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path is None or str(path) == "-":
        _to_stdout(data)
        return
    name = str(path)
    try:
        st: os.stat_result | None = os.lstat(name)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _failed(name, exc) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise PgprobeError(f"cannot write {name}: it is a directory", EXIT_OUTPUT)
    special = st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode))
    if special and _in_place(name, raw):
        return
    _atomic(name, raw, PRIVATE_MODE if private else 0o666 & ~_umask(), existed=st is not None)


def check(path: str, option: str) -> None:
    """Fail before a long capture, not after it (EXIT_OUTPUT, as write() would)."""
    if path == "-":
        return
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = 0
    if stat.S_ISDIR(mode):
        raise PgprobeError(f"{option} {path}: is a directory", EXIT_OUTPUT)
    if mode and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        if not os.access(path, os.W_OK):  # a device or FIFO: written in place
            raise PgprobeError(f"{option} {path}: cannot write it", EXIT_OUTPUT)
        return
    parent = os.path.dirname(os.path.abspath(path))  # the link's own directory, not its target's
    if not os.path.isdir(parent):
        why = "no such directory"
    elif not os.access(parent, os.W_OK):
        read_only = os.statvfs(parent).f_flag & os.ST_RDONLY
        why = "a read-only file system" if read_only else "permission denied"
    else:
        return
    raise PgprobeError(f"{option} {path}: cannot write in {parent}: {why}", EXIT_OUTPUT)


def stdout_failed(exc: BaseException) -> str | None:
    """The line to say when exc is a full disk under stdout (`pgprobe ... > /dev/full`).

    Files say theirs through write(); an OSError of FULL reaching cli.main is stdout's.
    stdout is then pointed at /dev/null, so the interpreter's last flush does not fail
    again ("Exception ignored ... OSError") when pgprobe exits.
    """
    if not isinstance(exc, OSError) or exc.errno not in FULL:
        return None
    settle_stdout()
    return _stdout_line(exc)


def settle_stdout() -> None:
    """Flush stdout now; if that fails, drop what is left (the failure is said already)."""
    try:
        sys.stdout.flush()
    except OSError:
        silence_stdout()


def silence_stdout() -> None:
    """stdout pointed at /dev/null: what is left to print goes nowhere, without an error."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _to_stdout(data: str | bytes) -> None:
    try:
        if isinstance(data, str):
            sys.stdout.write(data)
            sys.stdout.flush()
        else:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
    except BrokenPipeError:
        raise  # `| head`: cli.main's quiet end
    except OSError as exc:
        silence_stdout()
        raise PgprobeError(_stdout_line(exc), EXIT_OUTPUT) from None


def _stdout_line(exc: OSError) -> str:
    return f"cannot write to stdout: {exc.strerror or exc}: the output is incomplete"


def _in_place(name: str, raw: bytes) -> bool:
    """Write a device or FIFO in place; False if it turned out a regular file meanwhile."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _failed(name, exc) from None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # replaced since the lstat: the atomic way
        _write_all(fd, raw)
    except OSError as exc:
        raise _failed(name, exc) from None
    finally:
        os.close(fd)
    return True


def _atomic(name: str, raw: bytes, mode: int, existed: bool) -> None:
    import tempfile  # here: cli.main imports this module, and every command pays its imports

    directory = os.path.dirname(os.path.abspath(name))
    base = os.path.basename(name)[:100]  # the temp name stays within NAME_MAX
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise _failed(name, exc) from None
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name)  # replaces a symlink itself, never what it points to
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            left = f"{name} is unchanged" if existed else "no file was left"
            raise _failed(name, exc, left) from None
        raise
    with contextlib.suppress(OSError):  # the rename itself, durable
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view) :]


def _failed(name: str, exc: OSError, left: str = "") -> PgprobeError:
    why = exc.strerror or str(exc)
    return PgprobeError(f"cannot write {name}: {why}" + (f" ({left})" if left else ""), EXIT_OUTPUT)


def _umask() -> int:
    """The process's umask, read without changing it (Linux 4.7+), else by setting it back."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            lines = f.read().splitlines()
        for line in lines:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


PPROF_SUFFIX = ".pb.gz"  # `-o cpu.pb.gz` means --format pprof (every tool with pprof output)


def wants_pprof(output: str | None) -> bool:
    """`-o cpu.pb.gz`: the file name asks for pprof."""
    return bool(output) and str(output).endswith(PPROF_SUFFIX)
