"""clog-reads --by query and --query-id: which statement each SLRU read happened under.

The scripts read the reading backend's own status entry at each read (st_state and
st_query_id, where pgprobe/tools/bystatement.py says) and count the reads by (state,
id) in @qreads beside @reads, whose shape and totals stay as they are: the totals and
the pg_stat_slru cross-check are of every read. Here: the options refused, the texts
sampled through the capture, and a snapshot's rows per statement (--by query) or one
statement's records per backend (--query-id alone).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pgprobe import engines
from pgprobe.discover import Targets
from pgprobe.engines.base import Snapshot
from pgprobe.errors import EXIT_ENV, EXIT_USAGE, PgprobeError
from pgprobe.tools import bystatement, common
from pgprobe.tools.clog_reads.records import (
    ReadRecord,
    StatementRow,
    add_texts,
    query_reads,
    statement_records,
    statement_rows,
)


def check(ns: argparse.Namespace) -> bool:
    """Whether the statement is read; the combinations it cannot go with, refused."""
    if not bystatement.wanted(ns):
        return False
    option = "--by query" if ns.by == "query" else "--query-id"
    if ns.trace:
        raise PgprobeError(f"{option} and --trace cannot be combined: the trace lines carry "
                           "no statement", EXIT_USAGE)  # fmt: skip
    if ns.stacks and ns.query_id is not None:
        raise PgprobeError("--query-id and --stacks cannot be combined: the stacks are not "
                           "kept per statement (--by query --stacks shows them all)",
                           EXIT_USAGE)  # fmt: skip
    if getattr(ns, "engine", "auto") == "dtrace":
        raise PgprobeError(f"{option} needs bpftrace: d/clog_reads.d does not read the "
                           "backends' statements", EXIT_USAGE)  # fmt: skip
    return True


def where(ns: argparse.Namespace, targets: Targets) -> list[int]:
    """The scripts' ENTRY STATE_OFF QID_OFF on this server, or a one-line refusal."""
    if engines.choose(getattr(ns, "engine", "auto")) == "dtrace":  # only DTrace here
        raise PgprobeError(f"{'--by query' if ns.by == 'query' else '--query-id'} needs "
                           "bpftrace: d/clog_reads.d does not read the backends' statements",
                           EXIT_ENV)  # fmt: skip
    return bystatement.where(targets).script_args()


def start_texts(ns: argparse.Namespace, targets: Targets) -> bystatement.Texts:
    """The statements' texts, sampled through the capture; the no-ids note said once."""
    texts = bystatement.texts_for(targets, ns)
    texts.start()
    if texts.note:
        common.warn(texts.note, "note")
    return texts


def rows(
    texts: bystatement.Texts,
    snapshot: Snapshot,
    ns: argparse.Namespace,
    targets: Targets,
    files: bool,
    keep: Callable[[int], bool],
) -> tuple[list[ReadRecord] | None, list[StatementRow] | None]:
    """--by query: (None, the rows per statement and SLRU); --query-id alone: (that
    statement's records per pid and SLRU, None). files: the syscall source's keys."""
    major, query_id = targets.cluster.major, ns.query_id
    reads = [q for q in query_reads(snapshot, files) if keep(q.pid)]
    if ns.by != "query":
        assert query_id is not None
        return statement_records(reads, major, query_id), None
    shown = statement_rows(reads, major, query_id)
    if snapshot.final:
        texts.finish(r.part.query_id for r in shown if r.part.query_id is not None)
    elif texts.sampler is not None:
        texts.by_id.update(texts.sampler.by_id)  # an interval's: the texts seen so far
    add_texts(shown, texts.by_id if texts.read else {})
    return None, shown
