"""pg_stat_activity sampled every second: how many backends were active, on what waits.

A wait-event profile like pg_wait_sampling's, with idle and client waits left out
since they are not the server's time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from pgprobe import discover
from pgprobe.errors import PgprobeError
from pgprobe.pgstats.counters import Counters, read_counters

# Wait event types that are not server work: a backend waiting for its client or
# idling in its main loop (Activity) says nothing about the server's trouble.
IDLE_WAIT_TYPES = ("Client", "Activity")


ACTIVITY_SQL = """
SELECT coalesce(wait_event_type, ''), coalesce(wait_event, ''), state
  FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
"""


class ActivitySampler(threading.Thread):
    """pg_stat_activity every `interval` seconds until stopped, on its own connection.

    With keep_counters, the cumulative counters are read at each sample too: if
    the server goes away (stopped, crashed, restarted), the last good reading
    still closes a window, cut at that moment (lost_at says when it went away).
    """

    def __init__(self, conninfo: str, interval: float = 1.0, keep_counters: bool = False) -> None:
        super().__init__(name="pg_stat_activity sampler", daemon=True)
        self.conninfo = conninfo
        self.interval = interval
        self.keep_counters = keep_counters
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None
        self.last_counters: Counters | None = None
        self.lost_at: float | None = None  # time.monotonic() when the session failed
        self._done = threading.Event()
        self._start = time.monotonic()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)

    def run(self) -> None:
        try:
            with discover.connect_conninfo(self.conninfo) as conn, conn.cursor() as cur:
                self._start = time.monotonic()
                while not self._done.is_set():
                    cur.execute(ACTIVITY_SQL)
                    self.samples.append(self._sample(cur.fetchall()))
                    if self.keep_counters:
                        self.last_counters = read_counters(conn)
                    self._done.wait(self.interval)
        except Exception as exc:  # the server may go away mid-capture: say so, keep the rest
            self.lost_at = time.monotonic()
            text = exc.message if isinstance(exc, PgprobeError) else first_line(exc)
            self.error = (
                f"activity: pg_stat_activity sampling stopped after "
                f"{self.lost_at - self._start:.1f} s: {text}"
            )

    def _sample(self, rows: list[tuple[str, str, str]]) -> dict[str, Any]:
        waits: Counter[str] = Counter()
        active = 0
        for wait_type, wait_event, state in rows:
            if state != "active":
                continue
            active += 1
            if wait_type in IDLE_WAIT_TYPES:
                continue
            waits[f"{wait_type}:{wait_event}" if wait_type else "CPU"] += 1
        return {
            "t": round(time.monotonic() - self._start, 3),
            "active": active,
            "total": len(rows),
            "waits": dict(waits),
        }

    def document(self) -> dict[str, Any]:
        """The `activity` section: the samples and the wait profile over them."""
        totals: Counter[str] = Counter()
        for sample in self.samples:
            totals.update(sample["waits"])
        all_waits = sum(totals.values())
        profile = []
        for name, count in totals.most_common():
            wait_type, _, event = name.partition(":")
            profile.append(
                {
                    "wait_event_type": wait_type,
                    "wait_event": event,
                    "samples": count,
                    "pct": round(100 * count / all_waits, 2) if all_waits else 0.0,
                }
            )
        doc: dict[str, Any] = {
            "interval_s": self.interval,
            "samples": self.samples,
            "wait_profile": profile,
        }
        if self.lost_at is not None:
            doc["cut_at_s"] = round(self.lost_at - self._start, 3)
        return doc


def first_line(exc: BaseException) -> str:
    """A psycopg error in one line (libpq's messages span several)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[:2]) if lines else type(exc).__name__
