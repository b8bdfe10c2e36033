"""Names of generated code from /tmp/perf-PID.map (the convention of perf, bcc, bpftrace).

A JIT that wants profilers to name its code writes one line per function,
``START SIZE name`` (hex start and size), to /tmp/perf-PID.map: JVMs (with
``jcmd PID Compiler.perfmap`` or ``-XX:+DumpPerfMapAtExit``, perf-map-agent),
V8/Node (``--perf-basic-prof``), LuaJIT. PostgreSQL's own LLVM JIT does not:
``jit_profiling_support`` writes perf's jitdump files (~/.debug/jit/...), which
``perf inject --jit`` reads and pgprobe does not. Executable anonymous memory
that no map names is shown as ``[jit]``.

Any local user can create /tmp/perf-PID.map for any pid, so a map is read as untrusted
data (pgprobe.safefile): a regular file only, not through a symlink, owned by the
process's user or root, at most MAX_BYTES; a map refused is skipped, and `skipped` says
which and why.
"""

from __future__ import annotations

import bisect
import os

from pgprobe import safefile
from pgprobe.symbolize.frames import Frame

JIT = "[jit]"
# A JVM's map of a large application is a few MiB; more is not a perf map worth reading.
MAX_BYTES = 16 * 2**20


class _PerfMap:
    def __init__(self, rows: list[tuple[int, int, str]]) -> None:
        rows.sort()
        self.starts = [r[0] for r in rows]
        self.ends = [r[0] + r[1] for r in rows]
        self.names = [r[2] for r in rows]

    def lookup(self, addr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.ends[i]:
            return self.names[i], addr - self.starts[i]
        return None


def parse_perf_map(text: str) -> list[tuple[int, int, str]]:
    """(start, size, name) rows of a perf map; malformed lines are skipped."""
    rows: list[tuple[int, int, str]] = []
    for line in text.splitlines():
        parts = line.strip().split(None, 2)
        if len(parts) != 3:
            continue
        try:
            rows.append((int(parts[0], 16), int(parts[1], 16), parts[2]))
        except ValueError:
            continue
    return rows


class PerfMaps:
    """/tmp/perf-PID.map of each pid, read once per pid (None: the pid has none)."""

    def __init__(self, tmp: str = "/tmp") -> None:
        self.tmp = tmp
        self._maps: dict[int, _PerfMap | None] = {}
        self.skipped: dict[str, str] = {}  # path -> why it was not read

    def _load(self, pid: int, proc: str) -> _PerfMap | None:
        owners = safefile.process_owners(pid, proc)
        seen: set[tuple[int, int]] = set()
        for path in (f"{self.tmp}/perf-{pid}.map", f"{proc}/{pid}/root/tmp/perf-{pid}.map"):
            try:
                st = os.lstat(path)  # outside a container both paths are one file: once
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                data = safefile.read_limited(path, MAX_BYTES, owners)
            except safefile.Untrusted as exc:
                self.skipped[path] = str(exc)
                continue
            except OSError:
                continue
            return _PerfMap(parse_perf_map(data.decode("utf-8", errors="replace")))
        return None

    def named(self, pid: int, addr: int, proc: str = "/proc") -> Frame | None:
        """addr's frame from pid's perf map alone (None: no map, or addr in none of its
        rows): for code in no mapping read, JIT code freed since it was sampled."""
        if pid not in self._maps:
            self._maps[pid] = self._load(pid, proc)
        pm = self._maps[pid]
        hit = pm.lookup(addr) if pm is not None else None
        if hit is None:
            return None
        name, offset = hit
        return Frame(name, os.path.basename(f"perf-{pid}.map"), True, offset)

    def frame(self, pid: int, addr: int, region_start: int, proc: str = "/proc") -> Frame:
        """A frame for addr in pid's executable anonymous memory starting at region_start."""
        named = self.named(pid, addr, proc)
        return named if named is not None else Frame(JIT, JIT, False, addr - region_start)
