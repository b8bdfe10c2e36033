"""Bounded label values for the wait events pgprobe has no name for (issue 30, row 7).

pgprobe.waitevents names a wait_event_info that no table knows by its numbers
(``class#N``, ``event#N``, ``tranche#N``): right for a one-shot tool's table, not for
an agent's series. Code in a backend can publish any 32-bit value before it sleeps,
and each would become a label set kept for good, in Prometheus and in the agent's
memory. serve folds them as they are added to its totals (records.Totals.names):

- the first KEEP_UNKNOWN distinct unknown events of each wait_event_type keep their
  name (an extension's LWLock tranches, ``tranche#92``, are few and worth seeing);
- later ones become wait_event "other" of their type (and tranche "other" in the
  LWLock metrics, which the same events feed);
- an unknown class (``class#N``: no PostgreSQL has it) becomes type and event "other".

The first fold is said in one line; pgprobe_wait_events_folded_total counts the
distinct codes folded (up to MAX_COUNTED). The one-shot tools are unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

UNKNOWN = re.compile(r"(?:class|event|tranche)#\d+")
OTHER = "other"
KEEP_UNKNOWN = 8
MAX_COUNTED = 4096  # distinct folded codes remembered for the count (bounded too)
LWLOCK = "LWLock"


class Folder:
    """The label values serve keeps for a wait event or a tranche (records.Totals has one;
    `say`, set by the agent, hears of the first fold)."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.say = say
        self.kept: dict[str, set[str]] = {}  # wait_event_type (a known class): names kept
        self.folded: set[tuple[str, str]] = set()

    def event(self, wait_type: str, wait_event: str) -> tuple[str, str]:
        if UNKNOWN.fullmatch(wait_type):
            return self._fold(wait_type, wait_event, (OTHER, OTHER))
        if not UNKNOWN.fullmatch(wait_event):
            return wait_type, wait_event
        kept = self.kept.setdefault(wait_type, set())
        if wait_event in kept or len(kept) < KEEP_UNKNOWN:
            kept.add(wait_event)
            return wait_type, wait_event
        return self._fold(wait_type, wait_event, (wait_type, OTHER))

    def tranche(self, tranche: str) -> str:
        return self.event(LWLOCK, tranche)[1]

    def _fold(self, wait_type: str, wait_event: str, into: tuple[str, str]) -> tuple[str, str]:
        if not self.folded and self.say is not None:
            self.say(f"wait events pgprobe has no name for ({wait_type}:{wait_event} first): "
                     f"beyond {KEEP_UNKNOWN} per wait_event_type they are folded into "
                     f'wait_event="{OTHER}"; pgprobe_wait_events_folded_total counts '
                     "them")  # fmt: skip
        if len(self.folded) < MAX_COUNTED:
            self.folded.add((wait_type, wait_event))
        return into

    @property
    def count(self) -> int:
        return len(self.folded)
