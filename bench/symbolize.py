"""Symbolize throughput: 100,000 raw stacks of real addresses of a running backend.

As tests/test_symbolize.py's speed test does, but on the PostgreSQL server binary and
the C library mapped into a live backend: a pool of 3,000 distinct addresses (2,000
spread over the server's executable mapping, 1,000 over libc's), 100,000 stacks of 30
frames drawn from it with a fixed seed (3 million frames). Timed with perf_counter in
a fresh process (`python -m bench.symbolize --pid PID`), which prints JSON:

- ``first_s``: the first stack, which parses the ELF files (symbols, .eh_frame);
- ``cold_s``: all stacks with a fresh Symbolizer (the first stack included);
- ``warm_s``: all stacks again with the same Symbolizer (every address cached);
- peak RSS of the process, and the share of frames named.

The server binary of Debian's package is stripped to .dynsym: most of its
static functions come out as ``postgres+0x<function start>`` from .eh_frame, which is
the expensive path, so this is a fair worst case for the address lookups.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from bench import common

STACKS = 100_000
DEPTH = 30


@dataclass
class SymbolizeResult:
    stacks: int = 0
    frames: int = 0
    distinct: int = 0
    first_s: float = 0.0
    cold_s: float = 0.0
    warm_s: float = 0.0
    rss_mib: float = 0.0
    named_pct: float = 0.0
    modules: str = ""
    note: str = ""


def run(pid: int, stacks: int = STACKS) -> SymbolizeResult:
    done = subprocess.run(
        [sys.executable, "-m", "bench.symbolize", "--pid", str(pid), "--stacks", str(stacks)],
        capture_output=True,
        text=True,
        cwd=common.RUN_DIR,
    )
    if done.returncode != 0:
        return SymbolizeResult(note=f"symbolize benchmark failed: {done.stderr.strip()[-300:]}")
    return SymbolizeResult(**json.loads(done.stdout))


def _pool(pid: int, rng: random.Random) -> tuple[list[int], str]:
    from pgprobe.symbolize import parse_maps

    with open(f"/proc/{pid}/maps") as f:
        maps = parse_maps(f.read())
    exe = os.path.realpath(f"/proc/{pid}/exe")
    server = [m for m in maps if "x" in m.perms and m.path == exe]
    libc = [m for m in maps if "x" in m.perms and os.path.basename(m.path).startswith("libc.so")]
    if not server or not libc:
        raise SystemExit(f"pid {pid}: no executable mapping of {exe} or of libc")
    pool = []
    for maps_, n in ((server, 2000), (libc, 1000)):
        for _ in range(n):
            m = rng.choice(maps_)
            pool.append(rng.randrange(m.start, m.end))
    names = f"{os.path.basename(exe)}, {os.path.basename(libc[0].path)}"
    return pool, names


def _measure(pid: int, n: int) -> dict[str, object]:
    from pgprobe.symbolize import Symbolizer

    rng = random.Random(42)
    pool, modules = _pool(pid, rng)
    stacks = [tuple(rng.choices(pool, k=DEPTH)) for _ in range(n)]
    sym = Symbolizer(kallsyms=False)
    if not sym.snapshot(pid):
        raise SystemExit(f"cannot read /proc/{pid}/maps")
    t0 = time.perf_counter()
    named = 0
    sym.user_frames(pid, stacks[0])
    first = time.perf_counter() - t0
    for s in stacks[1:]:
        sym.user_frames(pid, s)
    cold = time.perf_counter() - t0
    t1 = time.perf_counter()
    for s in stacks:
        sym.user_frames(pid, s)
    warm = time.perf_counter() - t1
    for s in stacks[:1000]:
        named += sum(1 for f in sym.user_frames(pid, s) if f.resolved)
    return {
        "stacks": n,
        "frames": n * DEPTH,
        "distinct": len(set(pool)),
        "first_s": first,
        "cold_s": cold,
        "warm_s": warm,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / common.KIB_PER_MIB,
        "named_pct": 100 * named / (min(n, 1000) * DEPTH),
        "modules": modules,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pid", type=int, required=True, help="a live PostgreSQL backend")
    parser.add_argument("--stacks", type=int, default=STACKS)
    args = parser.parse_args()
    print(json.dumps(_measure(args.pid, args.stacks)))


if __name__ == "__main__":
    main()
