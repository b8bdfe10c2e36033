"""The client backends' exact time model, read from a triage document (``doc["waits"]``).

``time_model(doc)`` gives each line of the model (on CPU, runqueue, each wait event, idle,
unknown) with its share of the active time and, beside it, the share pg_stat_activity's
sampling saw of the same wait event (the cross-check); None when the document has no time
model. Client:ClientRead is split by the backend's state then (``state``): idle is idle
time, idle in transaction (a session that holds its locks and snapshot while its client
thinks) and active ClientRead are active time, each a line of its own; the sampling counts
only state 'active' backends, so it has no share to set beside idle in transaction.
``by_class(model)`` groups the active time by wait class (on CPU, runqueue, IO, Lock,
LWLock, ..., other): the picture at the top of the report and the summary's line.
``db_share(doc, which)`` is the share of the active time (DB time) in the components
``which`` selects: the ``share`` of a finding that explains them (None: no time model, or
too little active time to share out).
Used by the wait-event rules (pgprobe.findings.waits), the report and the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgprobe.findings.base import Doc
from pgprobe.findings.document import as_number, doc_meta, section, section_rows


@dataclass(frozen=True)
class Component:
    """One line of the client backends' time model, beside what the sampling saw of it."""

    category: str  # on CPU, runqueue, wait, idle, unknown, not accounted
    wait_event_type: str
    wait_event: str
    seconds: float
    active_pct: float | None  # share of the active time (None: idle, unknown)
    sleeps: int
    sampled_pct: float | None  # share of pg_stat_activity's samples of active backends
    samples: int
    state: str = ""  # Client:ClientRead only: the backend's state (idle in transaction, ...)

    @property
    def name(self) -> str:
        if self.wait_event_type in ("", "CPU"):
            return self.wait_event
        name = f"{self.wait_event_type}:{self.wait_event}"
        return f"{name} ({self.state})" if self.state else name


@dataclass(frozen=True)
class TimeModel:
    """The exact time model of the client backends over the window (doc["waits"])."""

    window_s: float
    active_s: float
    idle_s: float
    backend_s: float  # the client backends' wall time, summed
    components: list[Component]
    samples: int  # pg_stat_activity samples of active backends (0: no sampling)

    @property
    def cpu_s(self) -> float:
        return sum(c.seconds for c in self.components if c.category in ("on CPU", "runqueue"))


def _sampled(doc: Doc) -> dict[str, float]:
    act = section(doc, "activity")
    profile = act.get("wait_profile") if act else None
    out: dict[str, float] = {}
    for p in profile if isinstance(profile, list) else []:
        if isinstance(p, dict):
            wtype, event = str(p.get("wait_event_type") or ""), str(p.get("wait_event") or "")
            key = "CPU" if wtype in ("CPU", "") else f"{wtype}:{event}"
            out[key] = out.get(key, 0.0) + as_number(p.get("samples"))
    return out


def time_model(doc: Doc) -> TimeModel | None:
    """The client backends' exact time model, with the sampled share beside each line."""
    sec = section(doc, "waits")
    if sec is None:
        return None
    meta = sec.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    rows = section_rows(doc, "waits")
    active = sum(as_number(r.get("total_us")) for r in rows if _is_active(r)) / 1e6
    sampled = _sampled(doc)
    n = sum(sampled.values())
    parts = []
    for r in rows:
        seconds = as_number(r.get("total_us")) / 1e6
        category = str(r.get("category") or "")
        if not seconds and category not in ("on CPU",):
            continue
        wtype, event = str(r.get("wait_event_type") or ""), str(r.get("wait_event") or "")
        key = "CPU" if wtype == "CPU" else f"{wtype}:{event}"
        first_cpu = category == "on CPU"  # the samples' "CPU" is on CPU + runqueue: shown once
        state = str(r.get("state") or "")
        # The samples are of state 'active' backends: none of idle in transaction.
        compared = (category == "wait" and state in ("", "active")) or first_cpu
        count = sampled.get(key, 0.0) if compared else 0.0
        parts.append(
            Component(
                category,
                wtype,
                event,
                seconds,
                100 * seconds / active if active and _is_active(r) else None,
                int(as_number(r.get("sleeps"))),
                100 * count / n if n and compared else None,
                int(count),
                state,
            )
        )
    idle = sum(c.seconds for c in parts if c.category == "idle")
    return TimeModel(
        window_s=as_number(meta.get("window_s")) or as_number(doc_meta(doc).get("duration_s")),
        active_s=active,
        idle_s=idle,
        backend_s=as_number(meta.get("client_seconds")),
        components=parts,
        samples=int(n),
    )


def _is_active(row: dict[str, Any]) -> bool:
    return row.get("category") in ("on CPU", "runqueue", "wait")


# Under half a backend-second of active time, shares of it say nothing (findings.waits).
MIN_ACTIVE_S = 0.5


def db_share(doc: Doc, which: Callable[[Component], bool]) -> float | None:
    """Percent of the client backends' active time in the components `which` selects."""
    model = time_model(doc)
    if model is None or model.active_s < MIN_ACTIVE_S:
        return None
    seconds = sum(c.seconds for c in model.components if c.active_pct is not None and which(c))
    return min(100.0, 100 * seconds / model.active_s)


# The wait classes of the active time, in the order they are drawn; the wait event types
# not named here (Extension, no wait event set, ...) are "other". Idle time (Client:ClientRead
# between transactions, Activity:*) is no class of it: it is not DB time.
CLASSES = ("on CPU", "runqueue", "IO", "Lock", "LWLock", "BufferPin", "IPC", "Client",
           "Timeout", "other")  # fmt: skip


def wait_class(c: Component) -> str:
    """The class of an active component: on CPU, runqueue, its wait event type, or other."""
    if c.category in ("on CPU", "runqueue"):
        return c.category
    return c.wait_event_type if c.wait_event_type in CLASSES else "other"


def by_class(model: TimeModel) -> list[tuple[str, float, float]]:
    """(class, seconds, percent of active time) of each class with time, in CLASSES order."""
    seconds = dict.fromkeys(CLASSES, 0.0)
    for c in model.components:
        if c.active_pct is not None:
            seconds[wait_class(c)] += c.seconds
    total = model.active_s
    return [(k, v, 100 * v / total) for k, v in seconds.items() if v > 0 and total > 0]
