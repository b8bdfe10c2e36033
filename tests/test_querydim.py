"""querydim.charges' shortcut for a process that has not run since its entry's `since`:
the general split (_add_run) adds nothing then, whatever the entry and the statement now;
and the split of an open run that ended a statement at its idle report. Pure functions:
no cluster."""

from __future__ import annotations

import random

from pgprobe.tools.waits import querydim
from pgprobe.tools.waits.querydim import FIELDS, MARK_FIELDS, Open
from pgprobe.waitevents import statement

RODATA = {"pg_clock_ns": 946_684_800 * 10**9, "idle_states": 0b110, "active_state": 1}
NOW_NS = 10**15  # a monotonic read moment


def entry(rng: random.Random, marked: bool) -> tuple[int, ...]:
    """Query fields (no slot in use), marks (mk_ns 0 unless marked), the pid."""
    fields = [rng.randrange(1, 2**20) for _ in range(FIELDS)]
    fields[querydim._SLOTS_AT :] = [0] * (FIELDS - querydim._SLOTS_AT)
    marks = [rng.randrange(1, 2**20) for _ in range(MARK_FIELDS)]
    marks[0] = NOW_NS - rng.randrange(1, 10**10) if marked else 0
    marks[5] = marks[0] - rng.randrange(0, 10**9) if marked else 0  # the first mark's time
    return (*fields, *marks, 4242)


def statements_now(rng: random.Random, q: tuple[int, ...]) -> list[statement.Read | None]:
    """None, the same change count as the entry's, and statements begun since, long ago."""
    started = (NOW_NS + RODATA["pg_clock_ns"]) // 1000
    return [
        None,
        statement.Read(q[2], 1, 7),
        statement.Read(q[2] + 2, 1, rng.randrange(1, 2**63), started - 5_000),
        statement.Read(q[2] + 2, 2, 9, started - 10**9),
    ]


def test_a_process_asleep_all_along_adds_only_its_sleep() -> None:
    rng = random.Random(7)
    for _ in range(200):
        q = entry(rng, marked=False)
        slept = rng.randrange(0, 10**10)
        for asleep_in in (None, 0x0600_0000, 0x0500_0003):
            open_ = Open(0, 0, 0, slept, asleep_in, 0x0600_0000, NOW_NS, rng.randrange(10**9))
            for now in statements_now(rng, q):
                out: querydim.Charges = {}
                querydim._add_run(out, 4242, q, open_, now, RODATA)
                assert out == {}, (q[:3], open_, now)
                want = querydim.totals(4242, q)
                if asleep_in is not None and slept:
                    key = (4242, querydim.WAIT, q[0], asleep_in, q[1])
                    want[key] = want.get(key, 0) + slept
                assert querydim.charges(4242, q, open_, now, RODATA) == want
                # the shortcut of a process steady since the read before: the same
                alone = querydim.sleep_alone(4242, q, open_)
                assert (alone is None) == (asleep_in is None)
                if alone is not None:
                    out = {}
                    querydim.add_asleep(out, querydim.totals(4242, q), alone, slept)
                    assert out == want


def test_a_mark_or_a_run_is_split() -> None:
    """The shortcut's condition is not idle talk: a run, or a mark, adds to the charges."""
    rng = random.Random(11)
    q = entry(rng, marked=False)
    ran = Open(2_000_000, 500_000, 0, 0, None, 0, NOW_NS, 0)
    out: querydim.Charges = {}
    querydim._add_run(out, 4242, q, ran, None, RODATA)
    assert sum(out.values()) == 2_500_000
    assert querydim.sleep_alone(4242, q, ran) is None
    marked = entry(rng, marked=True)
    asleep = Open(0, 0, 0, 10**9, 0x0600_0000, 0, NOW_NS, 0)
    now = statements_now(rng, marked)[2]
    out = {}
    querydim._add_run(out, 4242, marked, asleep, now, RODATA)
    assert any(k[2] == statement.SPANNED for k in out), out
    assert querydim.sleep_alone(4242, marked, asleep) is None


def test_a_run_that_ended_a_statement_leaves_the_time_after_its_idle_report() -> None:
    """An open run in which a statement ended (idle now, reports made): its time after the
    idle report (st_state_start_timestamp) is the idle state's, the rest the statement's
    (active); a report before the run's start leaves at most the run's CPU, one after the
    read (clocks apart) nothing."""
    rng = random.Random(13)
    q = entry(rng, marked=False)
    ran = Open(300_000, 0, 0, 0, None, 0, NOW_NS, 0)
    now_us = (NOW_NS + RODATA["pg_clock_ns"]) // 1000
    for reported_us_ago, idle_ns in ((100, 100_000), (0, 0), (10_000, 300_000), (-50, 0)):
        now = statement.Read(q[2] + 2, 2, 77, now_us - 400, now_us - reported_us_ago)
        out: querydim.Charges = {}
        querydim._add_run(out, 4242, q, ran, now, RODATA)
        statement_key = (4242, querydim.CPU, 1, 0, 77)  # active: RODATA's active_state
        idle_key = (4242, querydim.CPU, 2, 0, 0)
        assert out.get(idle_key, 0) == idle_ns, (reported_us_ago, out)
        assert out.get(statement_key, 0) == 300_000 - idle_ns, (reported_us_ago, out)
