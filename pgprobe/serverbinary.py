"""Whether a file is a PostgreSQL server binary, and its version: read as data, never run.

pgprobe runs as root and finds binaries through /proc, where any local user can put a
process named "postgres" whose file is theirs (and can replace that file by a script
after it started). So a binary is never executed to learn anything: it is opened as data
(pgprobe.safefile: a regular file, never blocking) and read with pyelftools.

- A server binary exports PostgresMain (.dynsym: the backend is linked with
  --export-dynamic, stripped or not, on every supported major).
- Its version is the text `postgres --version` would print, which the binary holds in
  .rodata as PG_BACKEND_VERSIONSTR: "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n".

Results are cached per file (device, inode, size, mtime): every backend of a cluster runs
the same file.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from pgprobe import safefile
from pgprobe.symbolize.dynsym import defined_in

MARKER_SYMBOL = "PostgresMain"
_VERSION = re.compile(rb"postgres \(PostgreSQL\) ([^\n\0]{1,200})[\n\0]")
MAX_RODATA = 64 * 2**20  # postgres's .rodata is ~2 MiB


@dataclass(frozen=True)
class ServerBinary:
    version_num: int  # e.g. 150018; 0 when the binary holds no version text
    version: str  # e.g. "15.18 (Debian 15.18-0+deb12u1)"


class NotServer(Exception):
    """Not a PostgreSQL server binary; str() says why in a few words."""


def read(path: str) -> ServerBinary:
    """The server binary at `path` (a path, or /proc/PID/exe: the file a process runs).

    Raises NotServer when it is not one, OSError when it cannot be read."""
    with safefile.open_regular(path, follow=True) as f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        found = _CACHE.get(key)
        if found is None:
            found = _CACHE[key] = _inspect(f)
    if isinstance(found, NotServer):
        raise found
    return found


_CACHE: dict[tuple[int, int, int, int], ServerBinary | NotServer] = {}


def _inspect(f: BinaryIO) -> ServerBinary | NotServer:
    try:
        elf = ELFFile(f)
        if defined_in(elf, MARKER_SYMBOL) is None:
            return NotServer(f"no {MARKER_SYMBOL} in its .dynsym")
        rodata = elf.get_section_by_name(".rodata")
        data = b""
        if rodata is not None and 0 < rodata["sh_size"] <= MAX_RODATA:
            data = rodata.data()
    except (ELFError, ValueError, struct.error, OSError) as exc:
        return NotServer(f"not a readable ELF file ({exc})")
    match = _VERSION.search(data)
    if match is None:
        return ServerBinary(0, "unknown")
    text = match.group(1).decode("utf-8", "replace").strip()
    return ServerBinary(*parse_version(text))


def of_process(pid: int) -> ServerBinary | None:
    """The server binary process `pid` runs, or None when it runs none (or is gone)."""
    try:
        return read(f"/proc/{pid}/exe")
    except (NotServer, OSError):
        return None


def parse_version(version: str) -> tuple[int, str]:
    """'15.18 (Debian ...)' -> (150018, version); '9.6.24' -> (90624, version)."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    if not match:
        return 0, version
    major, minor, patch = (int(g) if g else 0 for g in match.groups())
    if major >= 10:
        return major * 10000 + minor, version
    return major * 10000 + minor * 100 + patch, version
