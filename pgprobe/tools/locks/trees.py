"""Who blocked whom over a window: the sampled blocking trees, weighed by the exact waits.

The SQL sampler (pgprobe.pgstats.locks) sees, a few times a second, each waiter and the pids
ahead of it (pg_blocking_pids), rooted at the blockers that wait on nothing. Over a window a
waiter is placed under the root (and the pid it waited behind) it was seen under most often,
and weighs what the kernel measured for it: its exact Lock seconds (records.LockWait). A
waiter the samples never caught (a wait shorter than the sampling interval) has no root:
its seconds are counted apart (`unsampled`), never dropped. Pure functions, no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pgprobe.pgstats.locks import Sample, Session, blocking_tree
from pgprobe.tools.locks.records import LockWait


@dataclass
class Tree:
    """A root blocker over the window and the waiters behind it."""

    root: int
    session: Session | None  # the root's pg_stat_activity at its last sample
    behind: dict[int, int] = field(default_factory=dict)  # waiter -> the pid it waited behind
    waited_ns: dict[int, int] = field(default_factory=dict)  # waiter -> its exact Lock ns

    @property
    def total_ns(self) -> int:
        return sum(self.waited_ns.values())

    def depth_first(self) -> list[tuple[int, int]]:
        """(pid, depth): the root (0), then its waiters depth first, each right under the
        pid it waited behind. A waiter whose pid ahead is in no row of this tree (placed in
        another tree by its own samples), or in a loop of waiters behind each other, is
        under the root."""
        kids: dict[int, list[int]] = {}
        for pid, ahead in self.behind.items():
            kids.setdefault(ahead if ahead in self.behind else self.root, []).append(pid)
        out, seen = [(self.root, 0)], set()
        stack = [(pid, 1) for pid in sorted(kids.get(self.root, []), reverse=True)]
        while stack:
            pid, depth = stack.pop()
            if pid not in seen:
                seen.add(pid)
                out.append((pid, depth))
                stack.extend((k, depth + 1) for k in sorted(kids.get(pid, []), reverse=True))
        return out + [(pid, 1) for pid in sorted(set(self.behind) - seen)]


@dataclass
class Trees:
    trees: list[Tree]
    sessions: dict[int, Session]  # every pid seen in a wait, at its last sample
    unsampled_ns: int  # exact Lock time of waiters no sample caught
    unsampled_pids: list[int]
    samples: int  # samples that read pg_locks (someone was waiting)


def window_trees(samples: Iterable[Sample], waits: Iterable[LockWait]) -> Trees:
    votes: dict[int, Counter[tuple[int, int]]] = defaultdict(Counter)  # waiter -> (root, parent)
    sessions: dict[int, Session] = {}
    read = 0
    for sample in samples:
        if sample.waiters:
            read += 1
        sessions.update(sample.sessions)
        for node in blocking_tree(sample):
            for pid, parent in node.edges():
                votes[pid][(node.pid, parent)] += 1
    exact: dict[int, int] = defaultdict(int)
    for w in waits:
        exact[w.pid] += w.ns
    trees: dict[int, Tree] = {}
    for pid, seen in votes.items():
        (root, parent), _ = seen.most_common(1)[0]
        tree = trees.setdefault(root, Tree(root, sessions.get(root)))
        tree.behind[pid] = parent
        tree.waited_ns[pid] = exact.get(pid, 0)
    unsampled = sorted(pid for pid, ns in exact.items() if pid not in votes and ns > 0)
    ordered = sorted(trees.values(), key=lambda t: (-t.total_ns, -len(t.behind), t.root))
    return Trees(ordered, sessions, sum(exact[p] for p in unsampled), unsampled, read)


def as_json(trees: Trees, lock_of: dict[int, tuple[str, str]]) -> dict[str, object]:
    """meta.blocking: the trees, roots first; lock_of: waiter -> (its lock, mode wanted)."""

    def session(pid: int) -> dict[str, object]:
        s = trees.sessions.get(pid)
        if s is None:
            return {"pid": pid}
        return {"pid": pid, "state": s.state, "xact_age_s": s.xact_age_s,
                "application_name": s.application_name, "client_addr": s.client_addr,
                "backend_type": s.backend_type, "query_id": s.query_id,
                "query": s.query}  # fmt: skip

    return {
        "trees": [
            {"root": session(t.root), "waited_us": round(t.total_ns / 1000, 3),
             "waiters": [{**session(pid), "behind": t.behind[pid],
                          "lock": lock_of.get(pid, ("", ""))[0],
                          "mode": lock_of.get(pid, ("", ""))[1],
                          "waited_us": round(t.waited_ns[pid] / 1000, 3)}
                         for pid, _depth in t.depth_first()[1:]]}
            for t in trees.trees
        ],
        "unsampled_us": round(trees.unsampled_ns / 1000, 3),
        "unsampled_pids": trees.unsampled_pids,
        "samples_with_waiters": trees.samples,
    }  # fmt: skip
