"""The report's lock waits: each Lock sleep of the exact time model charged to its lock
(triage's ``waits.locks``, pgprobe locks' rows)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgprobe.findings import as_number as num
from pgprobe.render.report.cells import Col, table
from pgprobe.render.report.sections import section

COLS = [
    Col("lock", "Lock", "code"),
    Col("locktype", "Type"),
    Col("mode", "Mode wanted"),
    Col("waiters", "Waiters", "int"),
    Col("waits", "Waits", "int"),
    Col("total_s", "Total s", "dec"),
    Col("max_s", "Longest s", "dec"),
]
TREE_COLS = [
    Col("pid", "Session", "code"),
    Col("state", "State"),
    Col("xact_s", "Transaction age s", "dec"),
    Col("waited_s", "Waited s", "dec"),
    Col("lock", "Lock", "code"),
    Col("mode", "Mode wanted"),
    Col("application_name", "Application"),
    Col("query", "Statement", "query"),
]
NOT_KEYED = (
    "the time model's Lock waits were not keyed by lock (it needs the compiled time model, "
    "bpf/build/waits.bpf.o, and PostgreSQL 14+)"
)


def _row(r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "lock": r.get("lock"),
        "locktype": r.get("locktype"),
        "mode": r.get("mode"),
        "waiters": len(r.get("waiters") or []),
        "waits": r.get("waits"),
        "total_s": num(r.get("total_us")) / 1e6,
        "max_s": num(r.get("max_us")) / 1e6,
    }


def _tree_rows(blocking: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each root blocker, then the waiters behind it (the pid each waited behind)."""
    out = []
    for tree in blocking.get("trees") or []:
        if not isinstance(tree, dict) or not isinstance(tree.get("root"), dict):
            continue
        root = tree["root"]
        waiters = [w for w in tree.get("waiters") or [] if isinstance(w, dict)]
        out.append({"pid": f"pid {root.get('pid')}", "state": root.get("state"),
                    "xact_s": root.get("xact_age_s"), "waited_s": num(tree.get("waited_us")) / 1e6,
                    "lock": f"root of {len(waiters)} waiting", "mode": "",
                    "application_name": root.get("application_name"),
                    "query": root.get("query")})  # fmt: skip
        for w in waiters:
            out.append({"pid": f"└ pid {w.get('pid')} behind {w.get('behind')}",
                        "state": w.get("state"), "xact_s": w.get("xact_age_s"),
                        "waited_s": num(w.get("waited_us")) / 1e6, "lock": w.get("lock"),
                        "mode": w.get("mode"), "application_name": w.get("application_name"),
                        "query": w.get("query")})  # fmt: skip
    return out


def locks_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    waits = section(doc, "waits")
    part = waits.get("locks") if waits is not None else None
    if not isinstance(part, dict):
        return {"unavailable": NOT_KEYED}
    rows = [r for r in part.get("rows") or [] if isinstance(r, dict)]
    blocking = part.get("blocking") if isinstance(part.get("blocking"), dict) else None
    return {
        "trees": table(
            TREE_COLS, _tree_rows(blocking), empty="no session waited behind another in the samples"
        )
        if blocking is not None
        else None,  # fmt: skip
        "unavailable": None,
        "total_s": f"{num(part.get('lock_wait_us')) / 1e6:,.3f}",
        "not_read_s": f"{num(part.get('lock_not_read_us')) / 1e6:,.3f}",
        "more": int(num(part.get("more_locks"))),
        "table": table(COLS, [_row(r) for r in rows], empty="no heavyweight lock waits"),
    }
