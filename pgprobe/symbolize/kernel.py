"""Kernel addresses named from /proc/kallsyms."""

from __future__ import annotations

import bisect

from pgprobe.symbolize.frames import KERNEL_MODULE, KERNEL_SUFFIX, UNKNOWN, Frame


class KernelSymbols:
    """Text symbols of /proc/kallsyms (a symbol ends where the next starts)."""

    def __init__(self, path: str = "/proc/kallsyms") -> None:
        rows: list[tuple[int, str, str]] = []
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) < 3 or parts[1] not in ("t", "T", "w", "W"):
                        continue
                    addr = int(parts[0], 16)
                    if addr == 0:
                        continue
                    mod = parts[3].strip("[]") if len(parts) > 3 else ""
                    rows.append((addr, parts[2], mod))
        except OSError:
            rows = []
        rows.sort()
        self.available = bool(rows)  # False when not root (kptr_restrict) or unreadable
        self.starts = [r[0] for r in rows]
        self.names = [r[1] + KERNEL_SUFFIX for r in rows]
        self.modules = [f"[{r[2]}]" if r[2] else KERNEL_MODULE for r in rows]

    def lookup(self, addr: int) -> Frame:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0 or (i == len(self.starts) - 1 and addr - self.starts[i] > 0x100000):
            return Frame(UNKNOWN + KERNEL_SUFFIX, KERNEL_MODULE, False)
        return Frame(self.names[i], self.modules[i], True, addr - self.starts[i])
