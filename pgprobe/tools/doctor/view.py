"""How `pgprobe doctor` looks on a terminal: one line per check, then the verdict."""

from __future__ import annotations

from pgprobe.literal import literal
from pgprobe.render import table
from pgprobe.tools.doctor.records import Check, verdict

COLUMNS = [
    table.Column("status", "STATUS"),
    table.Column("check", "CHECK"),
    table.Column("detail", "DETAIL"),
    table.Column("fix", "FIX"),
]


def show(checks: list[Check], blocked: list[str], partial: dict[str, str]) -> None:
    rows = [
        {"status": c.status.upper(), "check": c.check, "detail": c.detail, "fix": c.fix}
        for c in checks
    ]
    table.render("pgprobe doctor", COLUMNS, rows)
    print(literal(verdict(blocked, partial)))  # its reasons can quote paths and the server
