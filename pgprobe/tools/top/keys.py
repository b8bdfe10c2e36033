"""The keys typed at `pgprobe top`'s terminal, read without waiting: the terminal in
cbreak mode (each key at once, no echo; Ctrl-C still a signal), put back as it was at
the end. Arrow keys and Enter come as state.UP, DOWN, ENTER; a lone Esc as ESC."""

from __future__ import annotations

import os
import select
import termios
import tty
from types import TracebackType
from typing import Any

from pgprobe.tools.top.state import BACKSPACE, DOWN, ENTER, ESC, TAB, UP

SEQUENCES = {"\x1b[A": UP, "\x1bOA": UP, "\x1b[B": DOWN, "\x1bOB": DOWN}
SINGLE = {"\r": ENTER, "\n": ENTER, "\x7f": BACKSPACE, "\x08": BACKSPACE, "\t": TAB, "\x1b": ESC}


class KeyReader:
    """`with KeyReader(fd) as keys: keys.read()` -> the keys typed since the last read."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._saved: list[Any] | None = None

    def __enter__(self) -> KeyReader:
        self._saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def read(self) -> list[str]:
        data = ""
        while select.select([self.fd], [], [], 0)[0]:
            chunk = os.read(self.fd, 256)
            if not chunk:
                break
            data += chunk.decode(errors="replace")
        return split(data)


def split(data: str) -> list[str]:
    """Typed text into keys: escape sequences whole, the rest one character each."""
    out, i = [], 0
    while i < len(data):
        seq = next((s for s in SEQUENCES if data.startswith(s, i)), None)
        if seq is not None:
            out.append(SEQUENCES[seq])
            i += len(seq)
        elif data[i] == "\x1b" and data.startswith("[", i + 1):  # another sequence: skipped
            j = i + 2
            while j < len(data) and not data[j].isalpha() and data[j] != "~":
                j += 1
            i = j + 1
        else:
            out.append(SINGLE.get(data[i], data[i]))
            i += 1
    return out
