"""A tracer's stdout cut into lines, in time linear in its size whatever the lines' length.

bpftrace prints each map as one line: a whole-cluster flame of ten minutes on a
many-CPU host prints one of hundreds of MB. Re-splitting the whole pending text at
each 64 KiB read made such a line quadratic (16 MB: 3.7 s of CPU; 256 MB: ~15 min);
here each byte is searched for a newline once and copied at most twice (into the
partial line, then out as that line).

A line is not cut at any length: it is one printed map, which the tracer's own
limits bound (BPFTRACE_MAP_KEYS_MAX, which pgprobe sets, and the string size), and
cutting it would lose the capture's result.
"""

from __future__ import annotations


class LineSplitter:
    """push(chunk) -> the lines it completes (without their b"\\n"); rest() at the end."""

    def __init__(self) -> None:
        self._partial = bytearray()  # the line under way (appends are amortized O(1))

    def push(self, chunk: bytes) -> list[bytes]:
        *complete, rest = chunk.split(b"\n")  # the new bytes only
        if complete and self._partial:
            self._partial += complete[0]
            complete[0] = bytes(self._partial)
            self._partial.clear()
        self._partial += rest
        return complete

    def rest(self) -> bytes:
        """The last line when the stream did not end with a newline."""
        out = bytes(self._partial)
        self._partial.clear()
        return out
