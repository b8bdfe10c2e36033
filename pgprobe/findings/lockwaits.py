"""Lock waits: which lock a finding's Lock time was on, from the time model's `locks`.

`pgprobe triage` keys each Lock sleep of the exact time model by the lock the backend was
queued on, where the compiled time model runs (pgprobe locks' rows, in
``waits.locks.rows``). A finding about Lock wait events names the lock with the largest
part of that time, and the root blocker whose tree held most of it (``waits.locks.blocking``,
the SQL sampler's trees), as a DBA acts on it: "64 % of it on public.accounts
(AccessExclusiveLock wanted, 40 sessions) behind pid 4242 (idle in transaction,
transaction open 192 s: `SELECT ...`)".
"""

from __future__ import annotations

from typing import Any

from pgprobe.findings import fmt, statements
from pgprobe.findings.base import Doc
from pgprobe.literal import one_line


def lock_rows(doc: Doc) -> list[dict[str, Any]]:
    waits = doc.get("waits") if isinstance(doc.get("waits"), dict) else None
    locks = (waits or {}).get("locks")
    rows = locks.get("rows") if isinstance(locks, dict) else None
    return [r for r in rows or [] if isinstance(r, dict)]


def top_lock(doc: Doc, events: set[tuple[str, str]], total_s: float) -> str:
    """ "; {pct} of it on {lock} ({mode} wanted, N sessions)" for the lock with the most of
    total_s among these Lock events (a Lock event is named by its lock's type), else ""."""
    types = {event for wtype, event in events if wtype == "Lock"}
    rows = [r for r in lock_rows(doc) if r.get("locktype") in types]
    best = max(rows, key=lambda r: float(r.get("total_us") or 0), default=None)
    seconds = float(best.get("total_us") or 0) / 1e6 if best else 0.0
    if best is None or total_s <= 0 or seconds <= 0:
        return ""
    waiters = len(best.get("waiters") or [])
    sessions = f"{waiters} session{'s' if waiters != 1 else ''}"
    return (f"; {fmt.pct(100 * min(seconds / total_s, 1.0))} of it on {best.get('lock')} "
            f"({best.get('mode')} wanted, {sessions}){_behind(doc, best)}")  # fmt: skip


def _behind(doc: Doc, lock: dict[str, Any]) -> str:
    """ " behind pid R (its state, transaction open N s: `its statement`)": the
    root blocker whose tree held most of this lock's waiters' time, else ""."""
    waits = doc.get("waits") if isinstance(doc.get("waits"), dict) else None
    locks = (waits or {}).get("locks")
    blocking = locks.get("blocking") if isinstance(locks, dict) else None
    trees = blocking.get("trees") if isinstance(blocking, dict) else None
    mine = {w.get("pid") for w in lock.get("waiters") or [] if isinstance(w, dict)}

    def on_it(tree: dict[str, Any]) -> float:
        return sum(float(w.get("waited_us") or 0) for w in tree.get("waiters") or []
                   if isinstance(w, dict) and w.get("pid") in mine)  # fmt: skip

    best = max((t for t in trees or [] if isinstance(t, dict)), key=on_it, default=None)
    if best is None or on_it(best) <= 0:
        return ""
    root: dict[str, Any] = best["root"] if isinstance(best.get("root"), dict) else {}
    state = str(root.get("state") or "gone")
    age = root.get("xact_age_s")
    since = f", transaction open {fmt.secs(float(age))}" if age is not None else ""
    text = one_line(str(root.get("query") or ""), statements.TEXT_CHARS)
    return f" behind pid {root.get('pid')} ({state}{since}{f': `{text}`' if text else ''})"
