"""--by query in the sampling tools (flame, hot, clog-reads): where a probe reads each
backend's statement at the moment it samples, and each key it counted under, named.

A script reads, in the sampled process, ``*MyBEEntry`` (the address of the global, the same
in every backend: ``$ENTRY``), then ``st_state`` and ``st_query_id`` at their offsets, and
keys its count by (state, id) beside the pid (``0 0 0``: no read, the key is (0, 0)). The
rows follow `pgprobe queries`' rule, state first and id second (queries/records.row_key):
an active statement by its id, ``idle in transaction`` after the statement named, active
without an id, and the rest outside any statement (an idle session's stale id is no
statement's). A sample carries no history: the work a backend does after it reported idle
(sending the result, the statistics flush) is outside statements here, where `queries`
charges it to the statement that just ended.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pgprobe import discover
from pgprobe.discover import Targets
from pgprobe.errors import EXIT_ENV, EXIT_USAGE, PgprobeError
from pgprobe.literal import one_line
from pgprobe.pgstats import statements as pgss
from pgprobe.tools.queries.records import IDLE_IN_XACT, NO_ID, OUTSIDE, STATEMENT, row_key
from pgprobe.waitevents import address, statement

NO_READ = (0, 0, 0)  # a script's ENTRY STATE_OFF QID_OFF when no statement is read
TEXT_WIDTH = 100  # characters of a statement's text in its frame or row


def add_arguments(parser: argparse.ArgumentParser | Any, by: tuple[str, ...]) -> None:
    """--by (the choices the tool has besides query), --query-id and --no-text."""
    parser.add_argument(
        "--by",
        choices=[*by, "query"],
        help=(f"{by[0]}: one part per process; " if by else "")
        + "query: one part per statement (its query id, as pg_stat_statements shows it; "
        "PostgreSQL 14+)",
    )
    add_filters(parser)


def add_filters(parser: argparse.ArgumentParser | Any) -> None:
    """--query-id and --no-text (for a tool whose --by is its own)."""
    parser.add_argument("--query-id", type=int, metavar="ID",
                        help="keep only what one statement did (its query id)")  # fmt: skip
    parser.add_argument("--no-text", action="store_true",
                        help="with --by query: read no statement texts (ids only)")  # fmt: skip


def wanted(ns: argparse.Namespace) -> bool:
    """Whether this run reads the statement (--by query or --query-id)."""
    asked = getattr(ns, "by", None) == "query" or getattr(ns, "query_id", None) is not None
    if getattr(ns, "no_text", False) and not asked:
        raise PgprobeError("--no-text goes with --by query or --query-id", EXIT_USAGE)
    return asked


def where(targets: Targets) -> statement.StatementAddress:
    """Where the script reads the statement on this server, or a one-line refusal."""
    cluster = targets.cluster
    if not cluster.major:
        raise PgprobeError("--by query and --query-id need a connection to the server (its "
                           "version, the statements' texts): give -h/-p/-U",
                           EXIT_USAGE)  # fmt: skip
    if cluster.major < min(statement.QUERY_ID_OFFSET):
        raise PgprobeError(f"--by query needs PostgreSQL {min(statement.QUERY_ID_OFFSET)} or "
                           f"later (query ids); this server is {cluster.major}",
                           EXIT_ENV)  # fmt: skip
    found = statement.address_of(address.find(cluster.postmaster_pid, cluster.binary),
                                 cluster.major)  # fmt: skip
    if found is None:
        raise PgprobeError(f"--by query cannot read the backends' statements: {cluster.binary} "
                           "has no MyBEEntry, or this major's offsets are not known",
                           EXIT_ENV)  # fmt: skip
    return found


@dataclass(frozen=True)
class Part:
    """What a (state, id) key is: a statement, idle in transaction after one, or neither."""

    kind: str  # queries.records' STATEMENT, IDLE_IN_XACT, NO_ID or OUTSIDE
    query_id: int | None  # signed, as pg_stat_statements shows it


def part(major: int, state: int, query_id: int) -> Part:
    """The part a sample keyed (state, id) belongs to (the probe's id: unsigned or signed)."""
    kind, qid, _ = row_key(major, state & 0xFF, statement.unsigned(query_id))
    return Part(kind, qid)


@dataclass
class Texts:
    """Statement texts by query id: pg_stat_statements' at the end, else pg_stat_activity's
    sampled during the capture; and the ids note (no query ids on this server)."""

    conninfo: str | None
    read: bool = True
    by_id: dict[int, str] = field(default_factory=dict)
    note: str | None = None
    sampler: pgss.TextSampler | None = None

    def start(self) -> None:
        if self.conninfo is None:
            return
        with discover.connect_conninfo(self.conninfo) as conn:
            why = pgss.query_ids(conn).why_none()
        if why:
            self.note = (f"no query ids ({why}): statements show as '(active, no query id)'; "
                         f"to get ids: {pgss.FIX}")  # fmt: skip
        if self.read:
            self.sampler = pgss.TextSampler(self.conninfo)
            self.sampler.start()

    @property
    def own_pid(self) -> int:
        """The sampler's backend: pgprobe's own, never a target."""
        return self.sampler.own_pid if self.sampler is not None else 0

    def stop(self) -> None:
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.stop()

    def finish(self, ids: Iterable[int]) -> None:
        """Stop sampling; the texts of these ids (pg_stat_statements' first)."""
        self.stop()
        if self.sampler is not None:
            self.by_id.update(self.sampler.by_id)
        if self.read and self.conninfo is not None:
            with discover.connect_conninfo(self.conninfo) as conn:
                self.by_id.update(pgss.statement_texts(conn, sorted(set(ids))))

    def name(self, p: Part) -> str:
        """The part in one line: 'query 123: UPDATE ...', 'idle in transaction after ...'."""
        if p.kind == STATEMENT:
            return _with_text(f"query {p.query_id}", self.by_id.get(p.query_id or 0), self.read)
        if p.kind == IDLE_IN_XACT:
            return _with_text(f"idle in transaction after query {p.query_id}",
                              self.by_id.get(p.query_id or 0), self.read)  # fmt: skip
        if p.kind == NO_ID:
            return "(active, no query id)"
        return f"({OUTSIDE})"


def _with_text(head: str, text: str | None, read: bool) -> str:
    if not read:
        return head
    return f"{head}: {one_line(text or '(text not seen)', TEXT_WIDTH)}"


def texts_for(targets: Targets, ns: argparse.Namespace) -> Texts:
    """The texts' reader for a run (not started)."""
    return Texts(targets.cluster.conninfo, read=not getattr(ns, "no_text", False))
