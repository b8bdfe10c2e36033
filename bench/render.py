"""Render throughput: 50,000 unique folded stacks (~5 M samples) to an SVG flame graph.

Three ways, each as fresh processes (median of several runs, wall time from start to exit,
peak RSS from wait4):

- the real command, `python -m pgprobe flame --from FILE -o out.svg` (the budget);
- `render_svg(Path)` in one process (`python -m bench.render --inprocess FILE`), timed
  with perf_counter around the call (plus writing the file), interpreter and import
  excluded: the first call, and the median of the repeats;
- inferno-flamegraph (the Rust port of flamegraph.pl) on the same file, when installed.

The input comes from the shared generator, as docs/flamegraph-render.md measured it:
`python3 gen_folded.py --seed 42 -o folded_50k.txt`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import common

GENERATOR_ENV = "PGPROBE_GEN_FOLDED"


def find_generator() -> Path | None:
    """gen_folded.py: $PGPROBE_GEN_FOLDED, ../shared/bench/ beside the checkout, /work/shared."""
    candidates = [
        os.environ.get(GENERATOR_ENV, ""),
        str(common.REPO.parent / "shared" / "bench" / "gen_folded.py"),
        "/work/shared/bench/gen_folded.py",
    ]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


@dataclass
class Timed:
    """Runs of one way of rendering: wall seconds and peak RSS (MiB) per run."""

    walls: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def wall(self) -> float | None:
        return common.median(self.walls)

    @property
    def peak_rss(self) -> float | None:
        return max(self.rss) if self.rss else None


@dataclass
class RenderResult:
    input: str = ""
    stacks: int = 0
    samples: int = 0
    input_mib: float = 0.0
    command: Timed = field(default_factory=Timed)
    svg_mib: float = 0.0
    inprocess_first_s: float | None = None
    inprocess_median_s: float | None = None
    inprocess_rss_mib: float | None = None
    inferno: Timed | None = None
    inferno_note: str = ""
    notes: list[str] = field(default_factory=list)


def make_input(generator: Path, workdir: Path) -> Path:
    path = workdir / "folded_50k.txt"
    subprocess.run(
        [sys.executable, str(generator), "--seed", "42", "-o", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def _count(path: Path) -> tuple[int, int]:
    stacks = samples = 0
    with open(path) as f:
        for line in f:
            head, _, count = line.rstrip().rpartition(" ")
            if head:
                stacks += 1
                samples += int(count)
    return stacks, samples


def run(workdir: Path, runs: int) -> RenderResult:
    result = RenderResult()
    generator = find_generator()
    if generator is None:
        result.notes.append(
            f"render benchmark skipped: gen_folded.py not found (set ${GENERATOR_ENV})"
        )
        return result
    folded = make_input(generator, workdir)
    result.input = f"gen_folded.py --seed 42 ({generator})"
    result.stacks, result.samples = _count(folded)
    result.input_mib = folded.stat().st_size / 2**20
    svg = workdir / "out.svg"
    command = [sys.executable, "-m", "pgprobe", "flame", "--from", str(folded), "-o", str(svg)]
    for _ in range(runs):
        done = common.run_measured(command)
        result.command.walls.append(done.wall_s)
        result.command.rss.append(done.maxrss_kib / common.KIB_PER_MIB)
        result.command.cpu.append(done.cpu_s)
    result.svg_mib = svg.stat().st_size / 2**20
    inproc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.render",
            "--inprocess",
            str(folded),
            "--repeat",
            str(runs),
            "-o",
            str(svg),
        ],  # fmt: skip
        check=True,
        capture_output=True,
        text=True,
        cwd=common.RUN_DIR,
    )
    data = json.loads(inproc.stdout)
    result.inprocess_first_s = data["times_s"][0]
    result.inprocess_median_s = common.median(data["times_s"])
    result.inprocess_rss_mib = data["maxrss_kib"] / common.KIB_PER_MIB
    inferno = common.find_inferno()
    if inferno is None:
        result.inferno_note = "inferno-flamegraph is not installed (cargo install inferno)"
        return result
    result.inferno = Timed()
    result.inferno_note = common.inferno_version()
    for _ in range(runs):
        with open(workdir / "inferno.svg", "wb") as out:
            done = common.run_measured([inferno, str(folded)], stdout=out)
        result.inferno.walls.append(done.wall_s)
        result.inferno.rss.append(done.maxrss_kib / common.KIB_PER_MIB)
        result.inferno.cpu.append(done.cpu_s)
    return result


def _inprocess(path: Path, repeat: int, output: Path) -> None:
    from pgprobe.render.flamegraph import render_svg

    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        output.write_text(render_svg(path), encoding="utf-8")
        times.append(time.perf_counter() - t0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"times_s": times, "maxrss_kib": usage.ru_maxrss}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inprocess", type=Path, required=True, help="folded file")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("-o", "--output", type=Path, default=Path("/dev/null"))
    args = parser.parse_args()
    _inprocess(args.inprocess, args.repeat, args.output)


if __name__ == "__main__":
    main()
