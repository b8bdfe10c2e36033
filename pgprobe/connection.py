"""Connecting to PostgreSQL as psql does, read-only.

psql's connection forms (-h/-p/-U/-d, where -d may be a connection string or a URI),
libpq's defaults (PG* environment, .pgpass), and pgprobe's session settings: every
transaction read-only, a statement timeout, application_name 'pgprobe' (so that the
session is known, and left out of the targets). A failure is one line, never libpq's
multi-line detail.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any

from pgprobe.errors import EXIT_CONNECT, EXIT_USAGE, PgprobeError

APPLICATION_NAME = "pgprobe"


@dataclass(frozen=True)
class ConnOptions:
    """psql-like connection options; None means libpq's default (PG* env, .pgpass)."""

    host: str | None = None
    port: int | None = None
    user: str | None = None
    # As psql's -d: a database name, or a "key=value ..." connection string, or a URI.
    dbname: str | None = None

    def conninfo(self) -> str:
        """The libpq connection string, with pgprobe's read-only session settings.

        As in psql, --dbname is a connection string when it contains "=" or starts
        with postgresql:// or postgres://, and then its values win over -h/-p/-U
        (libpq expands it in dbname's place, after host, port and user).
        """
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params: dict[str, Any] = {
            key: value
            for key, value in (("host", self.host), ("port", self.port), ("user", self.user))
            if value is not None
        }
        if self.dbname and is_connection_string(self.dbname):
            try:
                params.update(conninfo_to_dict(self.dbname))
            except psycopg.ProgrammingError as exc:
                raise PgprobeError(
                    f"--dbname is not a valid connection string or URI: {_first_line(exc)}",
                    EXIT_USAGE,
                ) from None
        elif self.dbname:
            params["dbname"] = self.dbname
        # Never write: every transaction of this session is read-only (the user's own
        # options, if any, come first; ours win).
        ours = "-c default_transaction_read_only=on -c statement_timeout=10s"
        params["options"] = f"{params['options']} {ours}" if params.get("options") else ours
        params["application_name"] = APPLICATION_NAME
        params.setdefault("connect_timeout", 10)
        return make_conninfo("", **params)


def is_connection_string(text: str) -> bool:
    """psql's rule (recognized_connection_string): a URI prefix, or an "=" anywhere."""
    return text.startswith(("postgresql://", "postgres://")) or "=" in text


def connect(opts: ConnOptions) -> Any:
    """An autocommit, read-only psycopg connection, or a one-line PgprobeError."""
    return connect_conninfo(opts.conninfo())


def _first_line(exc: BaseException) -> str:
    """libpq's message without its multi-line detail (it never contains a password)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    # psycopg prefixes "connection failed: connection to server ... failed:"; keep the reason.
    text = lines[0] if lines else type(exc).__name__
    for line in lines[1:]:
        if not line.startswith(("DETAIL", "HINT")):
            text = f"{text} {line}"
    return text


def connect_conninfo(conninfo: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.Error as exc:
        reason = _first_line(exc)
        raise PgprobeError(
            f"cannot connect to PostgreSQL: {reason}{_role_hint(reason, conninfo)}", EXIT_CONNECT
        ) from None


def _role_hint(reason: str, conninfo: str) -> str:
    """Under sudo, libpq's default user is root, which is rarely a role: say how to name one.
    Only when no user was given (-U, --dbname's user=, PGUSER)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        user = pwd.getpwuid(os.geteuid()).pw_name  # libpq's default user
    except KeyError:
        return ""
    if f'role "{user}" does not exist' not in reason:
        return ""
    if conninfo_to_dict(conninfo).get("user") or os.environ.get("PGUSER"):
        return ""
    return " (run with -U postgres, or set PGUSER)"
