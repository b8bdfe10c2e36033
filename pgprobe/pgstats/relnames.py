"""Names for the OIDs a lock read by the probe carries: databases (a shared catalog, any
session reads it) and relations (pg_class is per database: only the session's own
database's can be named; a relation of another database keeps its OID). Quoted as the SQL
sampler quotes them (pgprobe.pgstats.locks), whose LockTarget.label() names both. One
read-only query each, with the OIDs as parameters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pgprobe import discover

_DATABASES = "SELECT oid::bigint, datname FROM pg_database WHERE oid = ANY(%s::oid[])"
_RELATIONS = """
SELECT c.oid::bigint, quote_ident(n.nspname) || '.' || quote_ident(c.relname)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = ANY(%s::oid[])
"""
_HERE = "SELECT oid::bigint FROM pg_database WHERE datname = current_database()"


@dataclass
class RelationNames:
    """Database and relation names by OID, as read once from the server."""

    here: int = 0  # the session's database OID
    databases: dict[int, str] = field(default_factory=dict)
    relations: dict[int, str] = field(default_factory=dict)  # oid -> schema.name, quoted
    asked_dbs: set[int] = field(default_factory=set)
    asked_rels: set[int] = field(default_factory=set)

    def covers(self, databases: Iterable[int], relations: Iterable[int]) -> bool:
        """Whether these OIDs were all asked for already (named or not: a relation of
        another database never is)."""
        return set(databases) <= self.asked_dbs and set(relations) <= self.asked_rels

    def update(self, more: RelationNames) -> None:
        self.here = more.here or self.here
        self.databases.update(more.databases)
        self.relations.update(more.relations)
        self.asked_dbs |= more.asked_dbs
        self.asked_rels |= more.asked_rels

    def relname(self, oid: int) -> str | None:
        """schema.name of a relation of the session's database (None: not found)."""
        return self.relations.get(oid)


def read(conn: Any, databases: Iterable[int], relations: Iterable[int]) -> RelationNames:
    """The names of these OIDs (relations of the session's database only)."""
    out = RelationNames()
    with conn.cursor() as cur:
        cur.execute(_HERE)
        row = cur.fetchone()
        out.here = int(row[0]) if row else 0
        dbs = sorted({int(d) for d in databases} | {out.here})
        cur.execute(_DATABASES, (dbs,))
        out.databases = {int(oid): str(name) for oid, name in cur.fetchall()}
        rels = sorted({int(r) for r in relations})
        out.asked_dbs, out.asked_rels = set(dbs), set(rels)
        if rels:
            cur.execute(_RELATIONS, (rels,))
            out.relations = {int(oid): str(name) for oid, name in cur.fetchall()}
    return out


def read_conninfo(
    conninfo: str | None, databases: Iterable[int], relations: Iterable[int]
) -> RelationNames:
    """read() on a session of its own (no names, OIDs only, without a connection)."""
    if conninfo is None:
        return RelationNames()
    with discover.connect_conninfo(conninfo) as conn:
        return read(conn, databases, relations)
