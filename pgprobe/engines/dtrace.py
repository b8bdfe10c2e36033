"""The DTrace engine (illumos, Solaris, FreeBSD, macOS): not written yet."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from pgprobe.engines.base import Event, MapSpec, RunInfo, TickCallback
from pgprobe.errors import EXIT_ENV, PgprobeError


def preflight() -> None:
    raise PgprobeError("the DTrace engine is not available yet", EXIT_ENV)


class DtraceCapture:
    def __init__(
        self,
        script: str,
        args: Sequence[int | Path],
        specs: Sequence[MapSpec],
        duration: float | None,
    ) -> None:
        self.info = RunInfo(engine="dtrace")
        self.on_tick: TickCallback | None = None
        preflight()

    def events(self) -> Iterator[Event]:
        preflight()
        return iter(())
