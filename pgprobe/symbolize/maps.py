"""/proc/PID/maps: one process's mappings, parsed."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int  # file offset of `start`
    inode: int
    path: str  # without " (deleted)"
    deleted: bool

    @property
    def kind(self) -> str:
        if self.inode and self.path.startswith("/"):
            return "file"
        if self.path.startswith("[stack"):
            return "[stack]"
        if self.path in ("[heap]", "[vdso]", "[vsyscall]", "[vvar]"):
            return self.path
        return "[anon]"

    @property
    def module(self) -> str:
        k = self.kind
        return os.path.basename(self.path) if k == "file" else k


_MAPS_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s+(\S+)\s+([0-9a-f]+)\s+\S+\s+(\d+)\s*(.*)$")


def parse_maps(text: str) -> list[Mapping]:
    """Parse the text of /proc/PID/maps."""
    return [m for line in text.splitlines() if (m := _parse_line(line)) is not None]


# Backends are forked from the postmaster: most lines of their maps are the same, and a
# line parsed once is not parsed again (1,000 backends: 250,000 lines, ~300 distinct).
@functools.lru_cache(maxsize=8192)
def _parse_line(line: str) -> Mapping | None:
    m = _MAPS_RE.match(line)
    if not m:
        return None
    path = m.group(6)
    deleted = path.endswith(" (deleted)")
    if deleted:
        path = path[: -len(" (deleted)")]
    return Mapping(
        start=int(m.group(1), 16),
        end=int(m.group(2), 16),
        perms=m.group(3),
        offset=int(m.group(4), 16),
        inode=int(m.group(5)),
        path=path,
        deleted=deleted,
    )


# --------------------------------------------------------------------------
