"""The end of every --help: real invocations, each with what it answers (as bcc's tools do).

EXAMPLES maps a command ("" for pgprobe itself) to its "examples:" block; START_HERE is the
first thing to run, shown by `pgprobe --help` and by `pgprobe` alone. Each example must parse
(tests/test_cli_help.py parses every line, `sudo`, `pgprobe` and any redirection left out);
no figure that a measurement gave goes here: the costs are in docs/<command>.md.
"""

from __future__ import annotations

Example = tuple[str, str]  # (the command line, what it answers)

START: list[Example] = [
    ("sudo pgprobe doctor", "can this machine trace? each failed check with its fix"),
    ("sudo pgprobe triage -U postgres", "everything over 30 s, as one HTML report"),
]

HOST_NOTE = "In a command, -h is the server host (as in psql): its help is --help."

_EXAMPLES: dict[str, list[Example]] = {
    "": [
        ("sudo pgprobe waits -U postgres", "where the backends' time goes, by wait event"),
        ("sudo pgprobe flame -U postgres > cpu.svg", "a CPU flame graph of the cluster"),
        ("sudo pgprobe hot -U postgres --pid 4242", "the functions one backend spends CPU in"),
        ("sudo pgprobe lwlocks -U postgres --by pid", "which LWLocks are waited on, by whom"),
        ("sudo pgprobe backends -U postgres", "the processes pgprobe would trace"),
    ],
    "lwlocks": [
        ("sudo pgprobe lwlocks -U postgres", "which LWLocks the cluster waits on (10 s)"),
        ("sudo pgprobe lwlocks -U postgres -d 30 --by pid", "... and which backends wait"),
        ("sudo pgprobe lwlocks -U postgres -d 60 --interval 5", "a fresh table every 5 s"),
        ("sudo pgprobe lwlocks -U postgres --source usdt", "each wait timed by the probes"),
        ("sudo pgprobe lwlocks -U postgres --by query", "... and in which statements"),
    ],
    "clog-reads": [
        ("sudo pgprobe clog-reads -U postgres", "which backends read pg_xact pages from disk"),
        ("sudo pgprobe clog-reads -U postgres --slru all", "every SLRU, beside pg_stat_slru"),
        ("sudo pgprobe clog-reads -U postgres --stacks", "the code paths whose reads miss"),
        (
            "sudo pgprobe clog-reads -U postgres --format folded -o reads.folded",
            "those paths, for pgprobe flame --from",
        ),
        (
            "sudo pgprobe clog-reads -U postgres --source syscalls --trace --pid 4242",
            "every read of one backend: file, offset, latency",
        ),
    ],
    "waits": [
        ("sudo pgprobe waits -U postgres", "on CPU, waiting for a CPU, each wait event (10 s)"),
        ("sudo pgprobe waits -U postgres --by pid", "one time model per backend"),
        ("sudo pgprobe waits -U postgres --by query", "... per statement (query id)"),
        ("sudo pgprobe waits -U postgres --pid 4242 -d 30", "where one slow backend's time goes"),
        ("sudo pgprobe waits -U postgres -d 60 --interval 5", "a fresh table every 5 s"),
        (
            "sudo pgprobe waits -U postgres --stacks -o offcpu.svg",
            "an off-CPU flame graph rooted at the wait events",
        ),
    ],
    "locks": [
        ("sudo pgprobe locks -U postgres", "which locks the sessions waited on (10 s)"),
        ("sudo pgprobe locks -U postgres --by pid", "... one row per waiter"),
        ("sudo pgprobe locks -U postgres -d 30 --json", "30 s, as JSON"),
    ],
    "queries": [
        ("sudo pgprobe queries -U postgres", "the statements the time goes to (10 s)"),
        ("sudo pgprobe queries -U postgres --event Lock:transactionid", "... waiting on rows"),
        ("sudo pgprobe queries -U postgres --query-id 4242", "one statement's time model"),
        ("sudo pgprobe queries -U postgres --no-text --json", "ids and numbers only, as JSON"),
    ],
    "backends": [
        ("sudo pgprobe backends -U postgres", "every process pgprobe would trace"),
        ("sudo pgprobe backends -U postgres --application myapp", "what a filter selects"),
        (
            "sudo pgprobe backends -h /var/run/postgresql -p 5433 -U postgres --json",
            "another cluster's processes, as JSON",
        ),
    ],
    "doctor": [
        ("sudo pgprobe doctor", "can this machine trace? each failed check with its fix"),
        ("sudo pgprobe doctor -U postgres -p 5433", "... and the cluster on port 5433"),
        ("sudo pgprobe doctor --json | jq .meta.ready", "ready or not, for a script"),
    ],
    "flame": [
        ("sudo pgprobe flame -U postgres > cpu.svg", "a CPU flame graph of the cluster (10 s)"),
        ("sudo pgprobe flame -U postgres --pid 4242 -d 30 -o cpu.svg", "one backend, 30 s"),
        ("sudo pgprobe flame -U postgres --by query -o cpu.svg", "each stack under its statement"),
        ("sudo pgprobe flame -U postgres --format folded -o cpu.folded", "folded stacks"),
        ("sudo pgprobe flame -U postgres -o cpu.pb.gz", "pprof: go tool pprof, Pyroscope, Parca"),
        ("pgprobe flame --from cpu.folded -o cpu.svg", "render a folded file (no root needed)"),
    ],
    "hot": [
        ("sudo pgprobe hot -U postgres", "the functions the cluster spends its CPU in (10 s)"),
        ("sudo pgprobe hot -U postgres --pid 4242 -d 30", "... one backend's, over 30 s"),
        ("sudo pgprobe hot -U postgres --sort total --top 10", "the 10 most often on the stack"),
        ("sudo pgprobe hot -U postgres --lib --kernel", "CPU per library, the kernel's too"),
        ("sudo pgprobe hot -U postgres --by query --top 5", "each statement's top 5 functions"),
    ],
    "triage": [
        ("sudo pgprobe triage -U postgres", "everything over 30 s, as an HTML report here"),
        ("sudo pgprobe triage -U postgres -d 60 -o slow.html", "a minute, to a chosen file"),
        ("sudo pgprobe triage -U postgres --database shop", "only one database's backends"),
        (
            "sudo pgprobe triage -U postgres -o t.html --json > triage.json",
            "the report's findings and data as JSON too",
        ),
    ],
    "top": [
        ("sudo pgprobe top -U postgres", "the live view: DB time by class, statements, ..."),
        ("sudo pgprobe top -U postgres --interval 1 --view backends", "per backend, each second"),
        ("sudo pgprobe top -U postgres --database shop", "only one database's backends"),
        ("sudo pgprobe top -U postgres --once", "one window as text, as top -b -n 1"),
        ("sudo pgprobe top -U postgres --batch 3 --json", "three windows, a JSON line each"),
    ],
    "serve": [
        ("sudo pgprobe serve -U postgres", "/metrics and a pprof profile on 127.0.0.1:9433"),
        (
            "sudo pgprobe serve -U postgres --listen :9433 --web-config web.yml",
            "every address, with TLS and basic auth",
        ),
        ("sudo pgprobe serve -U postgres --window 30 -F 49", "longer windows, more samples"),
        ("sudo pgprobe serve -U postgres --lwlock-source usdt", "exact LWLock waits and modes"),
    ],
}

LONG = 52  # a longer command line has its comment under it


def block(title: str, examples: list[Example]) -> str:
    """'title:' and the lines, a comment beside each (under it when the line is long)."""
    column = max(len(command) for command, _ in examples if len(command) <= LONG) + 2
    lines = [f"{title}:"]
    for command, what in examples:
        if len(command) <= LONG:
            lines.append(f"  {command.ljust(column)}# {what}")
        else:
            lines += [f"  {command}", f"  {'':{column}}# {what}"]
    return "\n".join(lines)


EXAMPLES: dict[str, str] = {name: block("examples", ex) for name, ex in _EXAMPLES.items()}
START_HERE = block("start here", START)
TOP_EPILOG = f"{START_HERE}\n\n{HOST_NOTE}\n\n{EXAMPLES['']}"
