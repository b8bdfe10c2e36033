"""--dbname as psql takes it: a database name, a key=value connection string, or a URI."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from helpers import run_pgprobe

from pgprobe.discover import ConnOptions, is_connection_string
from pgprobe.errors import EXIT_CONNECT, EXIT_USAGE, PgprobeError
from pgprobe.sandbox import PgCluster


def parsed(opts: ConnOptions) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    return {k: str(v) for k, v in conninfo_to_dict(opts.conninfo()).items()}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres", False),
        ("my db", False),
        ("dbname=postgres", True),
        ("host=/tmp port=5432", True),
        ("postgresql://localhost/db", True),
        ("postgres://u@h:5/db", True),
        ("postgresqlfoo", False),
    ],
)
def test_what_psql_calls_a_connection_string(text: str, expected: bool) -> None:
    assert is_connection_string(text) is expected


def test_plain_database_name() -> None:
    got = parsed(ConnOptions(host="/run/pg", port=5433, user="alice", dbname="sales"))
    assert (got["host"], got["port"], got["user"], got["dbname"]) == ("/run/pg", "5433", "alice",
                                                                      "sales")  # fmt: skip


def test_database_name_with_spaces_and_quotes() -> None:
    assert parsed(ConnOptions(dbname="it's my db"))["dbname"] == "it's my db"


def test_key_value_string_wins_over_options_as_in_psql() -> None:
    got = parsed(ConnOptions(host="/a", port=1, dbname="host=/b dbname=other sslmode=disable"))
    assert (got["host"], got["port"], got["dbname"], got["sslmode"]) == ("/b", "1", "other",
                                                                         "disable")  # fmt: skip


def test_uri() -> None:
    got = parsed(ConnOptions(user="x", dbname="postgresql://bob@db.example:6543/inventory"))
    assert (got["host"], got["port"], got["user"], got["dbname"]) == (
        "db.example", "6543", "bob", "inventory"
    )  # fmt: skip


def test_session_stays_read_only_whatever_the_string_says() -> None:
    got = parsed(ConnOptions(dbname="dbname=x options='-c work_mem=1MB' application_name=me"))
    assert got["options"].startswith("-c work_mem=1MB")
    assert got["options"].endswith("-c default_transaction_read_only=on -c statement_timeout=10s")
    assert got["application_name"] == "pgprobe"


def test_bad_connection_string_is_a_usage_error() -> None:
    with pytest.raises(PgprobeError) as caught:
        ConnOptions(dbname="nosuchkey=1").conninfo()
    assert caught.value.exit_code == EXIT_USAGE
    assert "--dbname is not a valid connection string" in caught.value.message


def test_bad_connection_string_from_the_command_line() -> None:
    done = run_pgprobe(["backends", "--dbname", "nosuchkey=1"])
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


# -- a real server ---------------------------------------------------------------------------


def _backends(pg: PgCluster, *conn: str) -> tuple[int, str, str]:
    done = run_pgprobe(["backends", "--json", *conn])
    return done.returncode, done.stdout, done.stderr


def test_plain_name_and_uri_connect(cluster: PgCluster, tracing: None) -> None:
    """The commonest forms reach the named database (a missing one is named in the error)."""
    cluster.sql("DROP DATABASE IF EXISTS probe_target")
    cluster.sql("CREATE DATABASE probe_target")
    try:
        host = ["-h", str(cluster.root), "-p", str(cluster.port), "-U", "postgres"]
        code, out, err = _backends(cluster, *host, "--dbname", "probe_target")
        assert code == 0, err
        assert json.loads(out)["tool"] == "backends"
        code, _, err = _backends(cluster, *host, "--dbname", "no_such_db")
        assert code == EXIT_CONNECT and 'database "no_such_db" does not exist' in err, err

        uri = f"postgresql://postgres@/probe_target?host={quote(str(cluster.root))}&port={cluster.port}"
        code, out, err = _backends(cluster, "--dbname", uri)
        assert code == 0, err
        code, _, err = _backends(cluster, "--dbname", uri.replace("probe_target", "no_such_db"))
        assert code == EXIT_CONNECT and 'database "no_such_db" does not exist' in err, err

        dsn = f"host={cluster.root} port={cluster.port} user=postgres dbname=probe_target"
        code, _, err = _backends(cluster, "--dbname", dsn)
        assert code == 0, err
    finally:
        cluster.sql("DROP DATABASE IF EXISTS probe_target")
