"""Time to answer: PGPROBE_TIMINGS marks, the lazy command line, the cheap start-up paths
(frame-pointer check, maps parsing) and bench/answer.py on a real cluster.

No timing is asserted (the machine is shared): the marks are checked for order and
consistency, the fast paths against the slow ones they replace.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from bench import answer
from pgprobe import cli, priority, proc, timings
from pgprobe.engines import bpftrace, runner
from pgprobe.engines.base import MapSpec, RunInfo, Snapshot
from pgprobe.symbolize import Symbolizer, parse_maps
from pgprobe.symbolize.dynsym import defined_symbol
from pgprobe.symbolize.maps import _MAPS_RE
from pgprobe.unwind import fpcheck
from tests.helpers import CHECKOUT, run_pgprobe

FOLDED = "postgres;main;PostmasterMain;ServerLoop 7\npostgres;main;exec_simple_query 3\n"


def test_timings_marks_in_order_on_a_real_run(tmp_path: Path) -> None:
    folded = tmp_path / "in.folded"
    folded.write_text(FOLDED)
    done = run_pgprobe(
        ["flame", "--from", str(folded), "-o", str(tmp_path / "out.svg")],
        env={"PGPROBE_TIMINGS": "1"},
    )
    assert done.returncode == 0, done.stderr
    marks = timings.parse(done.stderr)
    assert [m[0] for m in marks] == ["imports", "done"]
    walls = [m[1] for m in marks]
    cpus = [m[2] for m in marks]
    assert 0 < walls[0] <= walls[1] and 0 < cpus[0] <= cpus[1]
    # Without the variable: no mark at all.
    quiet = run_pgprobe(["flame", "--from", str(folded), "-o", str(tmp_path / "q.svg")])
    assert quiet.returncode == 0 and timings.PREFIX not in quiet.stderr


def test_parse_ignores_other_stderr_lines() -> None:
    text = "pgprobe: warning: x\npgprobe: timing discovery 0.5000 0.1000\n"
    assert timings.parse(text) == [("discovery", 0.5, 0.1)]


def test_one_command_imports_only_its_module() -> None:
    code = (
        "import sys; from pgprobe import cli; cli.build_parser('lwlocks'); "
        "print(sorted(m for m in sys.modules if m.startswith(('pgprobe.tools', 'prometheus'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pgprobe.tools.lwlocks" in out.stdout
    for other in ("pgprobe.tools.serve", "prometheus_client", "pgprobe.tools.triage"):
        assert other not in out.stdout


def test_whole_parser_still_knows_every_command() -> None:
    choices = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(choices) == set(cli.COMMANDS)
    only = cli.build_parser("flame")._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(only) == {"flame"}


def test_unknown_command_is_a_one_line_usage_error() -> None:
    done = run_pgprobe(["flames"])
    assert done.returncode == 2 and "invalid choice" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _share_with_pyelftools(path: str, sample: int = 400) -> float | None:
    """The reference: pyelftools Symbol objects and the whole .text (the old, slow way)."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        if elf["e_machine"] != "EM_X86_64":
            return None
        text, dynsym = elf.get_section_by_name(".text"), elf.get_section_by_name(".dynsym")
        if text is None or dynsym is None:
            return None
        data, base = text.data(), text["sh_addr"]
        funcs = [
            s["st_value"] for s in dynsym.iter_symbols()  # type: ignore[attr-defined]
            if s["st_info"]["type"] == "STT_FUNC" and s["st_value"] and s["st_size"] > 16
        ][:sample]  # fmt: skip
    starts = [data[a - base : a - base + 8] for a in funcs if 0 <= a - base < len(data)]
    if not starts:
        return None
    return sum(1 for s in starts if s.startswith(fpcheck.PROLOGUES)) / len(starts)


def test_frame_pointer_share_matches_pyelftools_on_mapped_files() -> None:
    with open("/proc/self/maps") as f:
        paths = {m.path for m in parse_maps(f.read()) if m.kind == "file" and "x" in m.perms}
    paths |= {"/usr/lib/postgresql/15/bin/postgres", sys.executable}
    checked = 0
    for path in sorted(p for p in paths if Path(p).exists()):
        fpcheck.frame_pointer_share.cache_clear()
        assert fpcheck.frame_pointer_share(path) == _share_with_pyelftools(path), path
        checked += 1
    assert checked >= 3


def test_frame_pointer_share_of_what_is_not_a_whole_x86_64_elf_is_none(tmp_path: Path) -> None:
    server = Path("/usr/lib/postgresql/15/bin/postgres").read_bytes()
    cases = {
        "text": b"#!/bin/sh\necho not an ELF\n",
        "empty": b"",
        "header only": server[:64],  # its section headers beyond the end
        "cut short": server[: len(server) // 2],
        "32-bit": server[:4] + b"\x01" + server[5:4096],
        "big-endian": server[:5] + b"\x02" + server[6:4096],
    }
    for name, data in cases.items():
        path = tmp_path / name.replace(" ", "-")
        path.write_bytes(data)
        fpcheck.frame_pointer_share.cache_clear()
        share = fpcheck.frame_pointer_share(str(path))
        if name == "cut short":  # .text may still be in the half read: judged or None
            assert share is None or 0 <= share <= 1
        else:
            assert share is None, name


def test_parse_maps_matches_the_regex_line_by_line() -> None:
    with open("/proc/self/maps") as f:
        text = f.read()
    parsed = parse_maps(text + "not a maps line\n")
    lines = [ln for ln in text.splitlines() if _MAPS_RE.match(ln)]
    assert len(parsed) == len(lines) > 5
    for m, line in zip(parsed, lines, strict=True):
        start, end = line.split()[0].split("-")
        assert (m.start, m.end) == (int(start, 16), int(end, 16))
        assert line.rstrip().endswith(m.path + (" (deleted)" if m.deleted else ""))


def test_identical_maps_are_parsed_once(tmp_path: Path) -> None:
    with open("/proc/self/maps") as f:
        text = f.read()
    for pid in (101, 102):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "maps").write_text(text)
    sym = Symbolizer(kallsyms=False, proc=str(tmp_path))
    assert sym.snapshot(101) and sym.snapshot(102)
    assert (
        sym._maps[101].mappings
        == sym._maps[102].mappings
        == sorted(parse_maps(text), key=lambda m: m.start)
    )
    assert len(sym._parsed) == 1


@pytest.mark.once
def test_answer_bench_times_a_real_run(tracing: None) -> None:
    # the script (the compiled object has no answer probe: its window ends at its read)
    results = answer.measure(None, ["clog-reads-bpftrace"], answer.Backends(idle=3), repeat=1)
    (run,) = results
    assert run["exit"] == 0, run["stderr"]
    names = [p["phase"] for p in run["phases"]]
    # clog_reads.bt answers while attached: bpftrace is killed after its answer, not awaited.
    for phase in ("imports", "discovery", "bpftrace-attached", "bpftrace-answered", "done"):
        assert phase in names
    assert names.index("bpftrace-attached") < names.index("bpftrace-signalled")
    # Each phase is the difference of consecutive marks: they add up to the last mark.
    total = sum(p["wall_s"] for p in run["phases"])
    assert total == pytest.approx(run["phases"][-1]["at_s"], abs=0.01)
    signalled = run["phases"][names.index("bpftrace-signalled")]["wall_s"]
    assert signalled >= answer.DURATION_S - 0.01  # the -d 1 window itself
    assert "clog-reads" in answer.summarize(results)


# -- one symbol of .dynsym without pyelftools' Symbol objects --------------------------------


def _defined_with_pyelftools(path: str, tables: tuple[str, ...]) -> dict[str, int]:
    """The reference: pyelftools' Symbol objects (the old, slow way), first defined wins."""
    out: dict[str, int] = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for table in tables:
            section = elf.get_section_by_name(table)
            if not isinstance(section, SymbolTableSection):
                continue
            for sym in section.iter_symbols():
                if sym["st_shndx"] != "SHN_UNDEF":
                    out.setdefault(sym.name, int(sym["st_value"]))
    return out


def test_defined_symbol_matches_pyelftools() -> None:
    server = "/usr/lib/postgresql/15/bin/postgres"
    with open("/proc/self/maps") as f:
        libc = sorted({m.path for m in parse_maps(f.read()) if m.path.endswith("libc.so.6")})
    names = ["pgstat_count_slru_page_read", "my_wait_event_info", "palloc", "main", "malloc",
             "no_such_symbol_here", "printf", "PyObject_Free"]  # fmt: skip
    for path in [server, sys.executable, *libc]:
        for tables in ((".dynsym",), (".dynsym", ".symtab")):
            expected = _defined_with_pyelftools(path, tables)
            # Every 97th defined name too: .dynstr shares string tails, so a name may be
            # found only inside a longer one, where its symbol's st_name points.
            for name in names + sorted(expected)[::97]:
                found = defined_symbol(path, name, tables)
                assert found == expected.get(name), (path, name, tables)


# -- bpftrace captures that answer while attached ------------------------------------------


def test_every_answering_script_has_the_probe_and_its_pid() -> None:
    scripts = sorted((CHECKOUT / "bpf").glob("*.bt"))
    answering = [p for p in scripts if bpftrace.ANSWER_MARKER_PRINTF in p.read_text()]
    names = {p.name for p in answering}
    assert {"lwlock_wait.bt", "clog_reads.bt", "clog_reads_uprobe.bt", "profile.bt",
            "waits.bt"} <= names  # fmt: skip
    for path in answering:
        text = path.read_text()
        assert bpftrace.ANSWER_PROBE in text, path
        begin = re.search(r"^BEGIN\n\{(.*?)^\}", text, re.S | re.M)
        assert begin is not None and "@self = pid;" in begin.group(1), path
        probe = text[text.index(bpftrace.ANSWER_PROBE) :]
        body = probe[: probe.index("\n}\n")]
        # It stops the counting first, then prints a time line, its maps, and the marker last;
        # or, waits.bt, it notes when it prints (its maps are running totals, which the
        # reader cuts at @now_ns, as for its interval prints).
        first = body.split("{", 1)[1].strip().splitlines()[0]
        stops = r"@(live = 2|stopped = 1|guard_stopped = 1);"
        assert re.fullmatch(stops if path.name != "waits.bt" else "@now_ns = nsecs;", first), path
        assert body.rstrip().endswith(bpftrace.ANSWER_MARKER_PRINTF + ";"), path


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = proc.read_info(pid)
        if info is None:
            return True
        time.sleep(0.05)
    return False


def test_a_capture_answers_and_its_tracer_is_not_awaited(tracing: None) -> None:
    """profile.bt for 1 s: the maps come from the answer probe; bpftrace is killed after."""
    specs = [MapSpec("samples", ()), MapSpec("stacks", ("int", "stack"))]
    capture = bpftrace.BpftraceCapture("profile.bt", [99, 0, os.getpid(), 0, 0], specs, 1.0,
                                       env={"BPFTRACE_NO_USER_SYMBOLS": "1"})  # fmt: skip
    assert capture.process.answer is not None
    niceness: list[tuple[str, int, str]] = []  # (phase, the tracer's nice, its autogroup)

    def tick(info: RunInfo, remaining: float | None) -> None:
        pid = capture.process.pid
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            group = Path(f"/proc/{pid}/autogroup").read_text().split()[-1]
        except OSError:
            return
        phase = "start" if remaining is None else "answer" if info.stopped_counting else "count"
        niceness.append((phase, int(stat[16]), group))

    capture.on_tick = tick
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # this process is sampled: keep it on the CPU
        pass
    events = []
    for event in capture.events():
        events.append(event)
    final = [e for e in events if isinstance(e, Snapshot) and e.final]
    assert len(final) == 1 and final[0].label  # the answer's time() line opened it
    assert capture.process._answered and capture.process.returncode == 0
    assert capture.info.stopped_counting and capture.info.ended_early is None
    assert capture.info.duration_seconds >= 1.0
    assert capture.process.pid is not None and _gone(capture.process.pid)
    # Raised while it started and answered, as anything else while it counted.
    raised = (priority.NICE, str(priority.NICE))
    assert {(n, g) for phase, n, g in niceness if phase != "count"} <= {raised}, niceness
    assert {(n, g) for phase, n, g in niceness if phase == "count"} == {(0, "0")}, niceness


def test_tracer_nice_from_the_environment() -> None:
    nice = priority.configured_nice
    assert nice(None) == nice("") == priority.DEFAULT_NICE
    assert nice("0") == 0 and nice("-5") == -5
    assert nice("-99") == -20 and nice("abc") == -10


def test_no_answer_in_time_falls_back_to_sigint(
    tracing: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer marker that never comes: SIGINT after ANSWER_TIMEOUT_S, END's maps kept."""
    script = tmp_path / "count.bt"
    script.write_text(
        'BEGIN { @self = pid; printf("@@live\\n"); }\n'
        "interval:ms:10 /!@stopped/ { @ticks = count(); }\n"
        f"{bpftrace.ANSWER_PROBE}\n"
        "{ @stopped = 1; }\n"
        'END { clear(@self); clear(@stopped); time("%H:%M:%S\\n"); }\n'
    )
    monkeypatch.setattr(runner, "ANSWER_TIMEOUT_S", 0.3)
    info = RunInfo(engine="bpftrace")
    parser = bpftrace._OutputParser({"@ticks": MapSpec("ticks", ())}, info, live_marker=True)
    process = runner.TracerProcess(
        "bpftrace",
        [bpftrace.find_bpftrace(), "-f", "json", str(script)],
        dict(os.environ),
        0.5,
        info,
        benign_stderr=bpftrace.BENIGN_STDERR,
        answer=runner.Answer(signal.SIGURG, lambda raw: False),
    )
    events = [*process.run(parser.feed), *parser.finish()]
    assert not process._answered and process.returncode == 0
    (final,) = [e for e in events if isinstance(e, Snapshot) and e.final]
    ticks = final.get("ticks")[()]
    # Counting stopped at the SIGURG (0.5 s of 10 ms ticks), not at the SIGINT 0.3 s later.
    assert isinstance(ticks, int) and 20 <= ticks <= 60, ticks
