"""What differs between PostgreSQL majors, in one place (13-18), for tools, findings and tests.

Each fact is a function of server_version_num (e.g. 170010), so that callers
ask "does this server have X / what is X called there" instead of comparing
version numbers themselves. Checked live on 14, 15, 16, 17 and 18 by the
per-build tests (tests/conftest.py).
"""

from __future__ import annotations

# pg_stat_slru row names: 17 renamed them (lower case, words). Directory -> (13-16, 17+).
_SLRU_NAMES = {
    "pg_xact": ("Xact", "transaction"),
    "pg_subtrans": ("Subtrans", "subtransaction"),
    "pg_multixact/offsets": ("MultiXactOffset", "multixact_offset"),
    "pg_multixact/members": ("MultiXactMember", "multixact_member"),
    "pg_commit_ts": ("CommitTs", "commit_timestamp"),
    "pg_serial": ("Serial", "serializable"),
    "pg_notify": ("Notify", "notify"),
}


def slru_stat_name(version_num: int, directory: str) -> str:
    """The pg_stat_slru row name of an SLRU directory on this server ("pg_xact" -> "Xact")."""
    old, new = _SLRU_NAMES[directory]
    return new if version_num >= 170000 else old


def has_pg_stat_io(version_num: int) -> bool:
    """pg_stat_io (16+): reads, writes, fsyncs per backend type, object and context."""
    return version_num >= 160000


def pg_stat_io_counts_bytes(version_num: int) -> bool:
    """18 replaced pg_stat_io.op_bytes with read_bytes, write_bytes, extend_bytes."""
    return version_num >= 180000


def has_pg_stat_checkpointer(version_num: int) -> bool:
    """17 moved the checkpoint counters out of pg_stat_bgwriter into pg_stat_checkpointer."""
    return version_num >= 170000


def has_io_workers(version_num: int) -> bool:
    """18's asynchronous I/O: with io_method=worker (the default), 'io worker' processes
    read data files on behalf of backends, which wait on IO:AioIoCompletion meanwhile."""
    return version_num >= 180000


def has_transaction_buffers(version_num: int) -> bool:
    """17 made the SLRU buffer counts settings (transaction_buffers, ...; minimum 16,
    in banks of 16); before, pg_xact had Min(128, Max(4, shared_buffers / 512))."""
    return version_num >= 170000


def same_wait_event(a: str, b: str) -> bool:
    """Wait event names compared across versions: 17 changed the case of many
    (IO:WALSync became IO:WalSync, IO:WALWrite IO:WalWrite), so compare without case."""
    return a.casefold() == b.casefold()


# IO wait events that mean "waiting for a data file page to be read": 18's asynchronous I/O
# adds AioIoCompletion (the backend waits while an io worker, or io_uring, reads for it).
_DATA_FILE_READ_EVENTS = frozenset({"datafileread", "datafileprefetch", "aioiocompletion"})


def is_data_file_read_wait(event: str) -> bool:
    """An IO wait event for data file reads (IO:DataFileRead; 18: IO:AioIoCompletion)."""
    return event.casefold() in _DATA_FILE_READ_EVENTS


def is_wal_io_wait(event: str) -> bool:
    """An IO wait event on WAL files: IO:WALSync before 17, IO:WalSync from 17."""
    return event.casefold().startswith("wal")


# Backend types that write dirty buffers in the background (pg_stat_io.backend_type).
BACKGROUND_WRITERS = frozenset({"checkpointer", "background writer"})
