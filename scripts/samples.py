"""samples/pgprobe-*.txt, .html, .svg: every command, run now, on the demo's load.

Run as root: `sudo .venv/bin/python scripts/samples.py [--pg 15-debian]`. It starts the
demo's throwaway cluster (scripts/demo.py: pg_xact thrashing under two pgbench loads), runs
each command below against it with PGHOST and PGPORT set (so the command lines in the samples
are the ones a user types), and writes each sample as: what the command answers, how to read
the output, the command line(s), then the output exactly as printed (stdout and stderr, in
order), and docs/img/report.png from the triage report. tests/test_cli_help.py parses
every command line of every sample.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from demo import CHECKOUT, thrashing_cluster

from pgprobe import pgbuilds

SAMPLES = CHECKOUT / "samples"
PGPROBE = [sys.executable, "-m", "pgprobe"]


@dataclass(frozen=True)
class Sample:
    name: str  # samples/pgprobe-NAME.txt
    answers: str
    reading: str
    commands: tuple[tuple[str, ...], ...]


SAMPLES_TO_RUN = (
    Sample("doctor", "whether every pgprobe tool can run on this machine, and the fix if not.",
           "one row per check; WARN and FAIL rows say what is missing and how to add it. The "
           "last line is the verdict (exit 0: ready; 1: some tool cannot run).",
           (("doctor", "-U", "postgres"),)),
    Sample("backends", "which processes pgprobe would trace (discovery, no tracing).",
           "one row per process of the cluster, as pg_stat_activity shows it; the title names "
           "the postmaster, the data directory and the server binary the probes attach to.",
           (("backends", "-U", "postgres"),)),
    Sample("waits", "where the time of every process of the cluster goes, exactly.",
           "the rows add up to the process-seconds in the title. 'on CPU' and 'runqueue' "
           "(runnable, waiting for a CPU) come from the scheduler; each wait event is charged "
           "the time the process slept in it. 'idle' rows are sessions waiting for their client "
           "outside a transaction and background processes at rest: not DB time.",
           (("waits", "-U", "postgres", "-d", "5"),)),
    Sample("lwlocks", "which LWLocks the backends wait on, how often and how long.",
           "one row per tranche and mode; SHARE is the tranche's part of all LWLock wait time. "
           "By default each LWLock sleep and the runqueue time after it (RUNQ), from the "
           "scheduler, at no cost per wait; --source usdt times every wait with PostgreSQL's "
           "probes and stops (and says so) above its guard's rate.",
           (("lwlocks", "-U", "postgres", "-d", "5"),
            ("lwlocks", "-U", "postgres", "-d", "5", "--source", "usdt"))),
    Sample("clog-reads", "which backends read pg_xact (clog) pages from disk, how often.",
           "READS are the physical reads the probe saw, per backend; the totals sit beside "
           "pg_stat_slru over the same window (BLKS_HIT, BLKS_READ): a low HIT % with many "
           "READS is a thrashing SLRU.",
           (("clog-reads", "-U", "postgres", "-d", "5"),)),
    Sample("hot", "where the CPU goes, as a table of functions.",
           "SELF is samples in the function itself, TOTAL with its callees; postgres+0x... is a "
           "static function of a stripped server (install the debug symbols to name it).",
           (("hot", "-U", "postgres", "-d", "5", "--top", "15"),)),
    Sample("flame", "where the CPU goes, as an interactive SVG flame graph.",
           "open pgprobe-flame.svg in a browser: width is CPU time, click to zoom, Ctrl-F to "
           "search. The lines below are what pgprobe said while writing it.",
           (("flame", "-U", "postgres", "-d", "5", "-o", "pgprobe-flame.svg"),
            ("waits", "-U", "postgres", "-d", "5", "--stacks", "-o", "pgprobe-waits-offcpu.svg"))),
    Sample("triage", "everything above over one window, as findings and an HTML report.",
           "findings are ranked by their share of DB time, each with its next step first; "
           "pgprobe-triage.html holds the picture of the time model, the evidence and the tables.",
           (("triage", "-U", "postgres", "-d", "15", "-o", "pgprobe-triage.html"),)),
)  # fmt: skip


def run_sample(sample: Sample, env: dict[str, str], build: str) -> None:
    lines = [f"# pgprobe {sample.name}: {sample.answers}",
             f"# How to read it: {sample.reading}",
             f"# Run by scripts/samples.py on {build}, under the demo's load (pgbench -c 8 "
             "TPC-B-like + 8 clients looking up old transactions; 4 pg_xact buffers), 2 CPUs.",
             ""]  # fmt: skip
    for argv in sample.commands:
        lines.append(f"$ sudo {shlex.join(['pgprobe', *argv])}")
        done = subprocess.run([*PGPROBE, *argv], env=env, cwd=SAMPLES, text=True, timeout=300,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        lines += [*done.stdout.rstrip("\n").splitlines(), ""]
        print(f"{sample.name}: {shlex.join(argv)}: exit {done.returncode}", flush=True)
    (SAMPLES / f"pgprobe-{sample.name}.txt").write_text("\n".join(lines))


def run_serve(env: dict[str, str], build: str) -> None:
    """serve for two windows, then one scrape of /metrics (its pgprobe_ series only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["serve", "-U", "postgres", "--window", "5", "--listen", f"127.0.0.1:{port}"]
    server = subprocess.Popen([*PGPROBE, *argv], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        time.sleep(14)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            metrics = r.read().decode()
    finally:
        server.terminate()
        said, _ = server.communicate(timeout=60)
    shown = [line for line in metrics.splitlines() if line.startswith("pgprobe_")]
    lines = ["# pgprobe serve: an agent that keeps low-cost captures running and serves them to "
             "Prometheus (/metrics) and pprof (/debug/pprof/profile).",
             "# How to read it: counters of seconds per wait event, LWLock tranche and SLRU, "
             "and the capture's own health (observed seconds, losses); rate() them in PromQL. "
             "Only the pgprobe_ series of one scrape are shown, not their HELP and TYPE lines.",
             f"# Run by scripts/samples.py on {build}, under the demo's load, 2 CPUs.",
             "", f"$ sudo {shlex.join(['pgprobe', *argv])} &", *said.splitlines(),
             f"$ curl -s http://127.0.0.1:{port}/metrics | grep ^pgprobe_", *shown, ""]  # fmt: skip
    (SAMPLES / "pgprobe-serve.txt").write_text("\n".join(lines))
    print(f"serve: {len(shown)} series", flush=True)


def screenshot_report() -> None:
    """docs/img/report.png, the README's picture: the top of the sample report in Chromium."""
    html = SAMPLES / "pgprobe-triage.html"
    shot = CHECKOUT / "docs" / "img" / "report.png"
    subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", "--window-size=1280,860", f"--screenshot={shot}",
                    html.as_uri()], check=True, capture_output=True, timeout=120)  # fmt: skip
    print(f"picture: {shot}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg", default="15-debian", help="the PostgreSQL build (default Debian's)")
    parser.add_argument("--only", action="append", default=[], help="just these samples")
    args = parser.parse_args()
    (build,) = pgbuilds.select(args.pg)
    chosen = [s for s in SAMPLES_TO_RUN if not args.only or s.name in args.only]
    with thrashing_cluster(build, 900) as pg:
        env = {**os.environ, "PGHOST": str(pg.root), "PGPORT": str(pg.port)}
        described = build.describe()
        for sample in chosen:
            run_sample(sample, env, described)
        if not args.only or "serve" in args.only:
            run_serve(env, described)
    if not args.only or "triage" in args.only:
        screenshot_report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
