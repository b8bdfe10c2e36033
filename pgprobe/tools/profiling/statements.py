"""--by query and --query-id for CPU samples (flame, hot): bpf/profile.bt reads the
sampled backend's statement at each sample (pgprobe.tools.bystatement); here each
(state, id) key becomes its part, named, and --query-id keeps one statement's samples.
Frame-pointer stacks only: perf's samples (--unwind dwarf) and DTrace's carry no query id.
"""

from __future__ import annotations

import argparse

from pgprobe import engines
from pgprobe.discover import Targets
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import bystatement, common
from pgprobe.tools.profiling.result import Profile
from pgprobe.tools.queries.records import IDLE_IN_XACT, STATEMENT
from pgprobe.waitevents.statement import StatementAddress


def where(ns: argparse.Namespace, targets: Targets) -> StatementAddress | None:
    """Where profile.bt reads the statement (None: not asked), or a one-line refusal."""
    if not bystatement.wanted(ns):
        return None
    if engines.choose(getattr(ns, "engine", "auto")) == "dtrace":
        raise PgprobeError("--by query and --query-id read the statement with bpftrace only "
                           "(d/profile.d reads none): drop --engine dtrace",
                           EXIT_USAGE)  # fmt: skip
    if getattr(ns, "unwind", "auto") == "dwarf":
        raise PgprobeError("--by query and --query-id need --unwind fp or auto: perf's "
                           "samples (dwarf) carry no query id", EXIT_USAGE)  # fmt: skip
    return bystatement.where(targets)


def unwind(mode: str, why: str) -> tuple[str, str]:
    """auto's choice when the statement is read: frame pointers, said when they lack."""
    if mode != "dwarf":
        return mode, why
    return "fp", (f"{why}; --by query samples with frame pointers all the same (perf's "
                  "samples carry no query id): stacks are cut where frames lack them")  # fmt: skip


def add_parts(profile: Profile) -> None:
    """Each (state, id) key of the profile's stacks as its part (serve: pprof's query_id)."""
    major = profile.targets.cluster.major
    for s in profile.stacks:
        if s.query is not None and s.query not in profile.parts:
            profile.parts[s.query] = bystatement.part(major, *s.query)


def apply(profile: Profile, ns: argparse.Namespace, texts: bystatement.Texts) -> None:
    """Name each part; drop the text sampler's own samples; keep --query-id's statement."""
    major = profile.targets.cluster.major
    own = texts.own_pid
    kept = []
    for s in profile.stacks:
        if s.pid == own and own:
            continue
        key = s.query or (0, 0)
        part = profile.parts.setdefault(key, bystatement.part(major, *key))
        if ns.query_id is not None and (part.kind != STATEMENT or part.query_id != ns.query_id):
            continue
        kept.append(s)
    profile.stacks = kept
    named = {p.query_id for p in profile.parts.values()
             if p.kind in (STATEMENT, IDLE_IN_XACT) and p.query_id is not None}  # fmt: skip
    texts.finish(named)
    profile.part_names = {k: texts.name(p) for k, p in profile.parts.items()}
    if texts.note:
        common.warn(texts.note)
    if texts.sampler is not None and texts.sampler.error:
        common.warn(f"statement texts from pg_stat_activity: {texts.sampler.error}")
