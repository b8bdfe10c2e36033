"""`pgprobe flame --from FILE` on bad input, through the real CLI (issue 11).

Lines that are not `frames count` are counted and said on stderr in one line (how many, the
first one's number) and left out; a file with no stack at all is a one-line error, exit 2;
binary or undecodable bytes never end in a traceback. The dialects the renderer reads keep
working without a word. No tracing, so no root: pgprobe runs in a user namespace.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import CHECKOUT, run_pgprobe

from pgprobe.errors import EXIT_USAGE

SVG = "{http://www.w3.org/2000/svg}"

GOOD = "main;PostgresMain;ExecScan 40\nmain;PostgresMain;hash_bytes 55\nmain;pq_getbyte 7\n"
GOOD_TOTAL = 40 + 55 + 7


def svg_total(svg: str) -> int:
    """Samples of the root frame ("all"), read back from the SVG."""
    for g in ET.fromstring(svg).iter(SVG + "g"):
        if g.get("class") == "f" and g.get("data-d") == "0":
            return int(g.get("data-n", "-1"))
    return 0


def subtitle(svg: str) -> str:
    for t in ET.fromstring(svg).iter(SVG + "text"):
        if t.get("class") == "st":
            return t.text or ""
    return ""


def flame_from(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_pgprobe(["flame", "--from", str(path), *args], unprivileged=True, timeout=60)


def flame_stdin(data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "pgprobe", "flame", "--from", "-", *args],
        input=data,
        capture_output=True,
        cwd=CHECKOUT,
        timeout=60,
    )


def one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pgprobe: "), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    return lines[0]


def random_bytes(n: int, lo: int = 0, hi: int = 256, seed: int = 11) -> bytes:
    rnd = random.Random(seed)
    return bytes(rnd.randrange(lo, hi) for _ in range(n))


def test_random_bytes_are_refused_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "random.bin"
    src.write_bytes(random_bytes(64 * 1024))
    out = tmp_path / "out.svg"
    done = flame_from(src, "-o", str(out))
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "binary" in one_line_error(done.stderr) and str(src) in done.stderr
    assert done.stdout == "" and not out.exists()

    piped = flame_stdin(src.read_bytes(), "--folded")
    assert piped.returncode == EXIT_USAGE
    assert "stdin is binary" in one_line_error(piped.stderr.decode()) and piped.stdout == b""


def test_undecodable_bytes_without_a_stack_are_a_usage_error(tmp_path: Path) -> None:
    # no NUL, not UTF-8 (bytes 0x80-0xff), cut into lines: text of nothing
    data = b"\n".join(random_bytes(200, 0x80, 0x100, seed=n) for n in range(20))
    src = tmp_path / "latin.bin"
    src.write_bytes(data)
    for fmt in ("svg", "folded", "speedscope"):
        done = flame_from(src, "--format", fmt)
        assert done.returncode == EXIT_USAGE, (fmt, done.stderr)
        line = one_line_error(done.stderr)
        assert "no folded stacks" in line and "20 lines are not" in line, line
        assert "the first is line 1" in line and done.stdout == ""
    piped = flame_stdin(data)
    assert piped.returncode == EXIT_USAGE
    assert "no folded stacks in stdin" in one_line_error(piped.stderr.decode())


def test_a_file_of_malformed_lines_is_a_usage_error(tmp_path: Path) -> None:
    src = tmp_path / "notes.txt"
    src.write_text("# what I ran\n\nselect 1;\nExecScan\n 42\nmain;f -3\nmain;g many\n")
    done = flame_from(src)
    assert done.returncode == EXIT_USAGE, done.stderr
    line = one_line_error(done.stderr)
    # 5 bad lines (the comment and the blank line are fine), the first on line 3
    assert "5 lines are not" in line and "the first is line 3" in line, line
    assert done.stdout == ""


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n", "main;f 0\n"])
def test_nothing_to_draw_is_a_usage_error(tmp_path: Path, content: str) -> None:
    src = tmp_path / "empty.folded"
    src.write_text(content)
    done = flame_from(src)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "no samples in" in one_line_error(done.stderr) and done.stdout == ""


def test_malformed_lines_among_good_ones_are_counted_and_left_out(tmp_path: Path) -> None:
    lines = GOOD.splitlines()
    bad = ["garbage here", "\x01\x02", "main;ExecScan NaN", "12"]
    text = "\n".join([lines[0], bad[0], lines[1], bad[1], bad[2], lines[2], bad[3]]) + "\n"
    src = tmp_path / "mixed.folded"
    src.write_text(text)
    out = tmp_path / "mixed.svg"
    done = flame_from(src, "-o", str(out))
    assert done.returncode == 0, done.stderr
    warning = one_line_error(done.stderr)
    assert warning.startswith("pgprobe: warning: ")
    assert "4 lines are not" in warning and "the first is line 2" in warning, warning
    svg = out.read_text()
    assert svg_total(svg) == GOOD_TOTAL
    assert "lines skipped: 4" in subtitle(svg)

    folded = flame_from(src, "--folded")
    assert folded.returncode == 0 and "4 lines are not" in one_line_error(folded.stderr)
    assert sum(int(x.rsplit(" ", 1)[1]) for x in folded.stdout.splitlines()) == GOOD_TOTAL

    speedscope = flame_stdin(text.encode(), "--format", "speedscope")
    assert speedscope.returncode == 0
    assert "stdin: 4 lines are not" in one_line_error(speedscope.stderr.decode())
    assert sum(json.loads(speedscope.stdout)["profiles"][0]["weights"]) == GOOD_TOTAL


def test_one_bad_line_is_said_in_the_singular(tmp_path: Path) -> None:
    src = tmp_path / "one.folded"
    src.write_text(GOOD + "oops\n")
    done = flame_from(src, "--folded")
    assert done.returncode == 0
    assert "1 line is not" in one_line_error(done.stderr) and "line 4" in done.stderr


def test_undecodable_bytes_in_a_frame_name_are_kept(tmp_path: Path) -> None:
    src = tmp_path / "latin1.folded"
    src.write_bytes(GOOD.encode() + b"main;caf\xe9_scan 3\n")
    done = flame_from(src)
    assert done.returncode == 0 and done.stderr == ""
    assert svg_total(done.stdout) == GOOD_TOTAL + 3
    assert "caf\ufffd_scan (3 samples" in done.stdout


def test_byte_order_marks_are_understood(tmp_path: Path) -> None:
    for encoding in ("utf-8-sig", "utf-16"):  # as some editors and shells on Windows write
        src = tmp_path / f"{encoding}.folded"
        src.write_bytes(GOOD.encode(encoding))
        done = flame_from(src, "--folded")
        assert done.returncode == 0 and done.stderr == "", (encoding, done.stderr)
        assert done.stdout.splitlines()[0] == "main;PostgresMain;hash_bytes 55"


DIALECTS = {
    # FlameGraph folded with the usual noise: comments, CRLF, tabs, decimal counts
    "flamegraph.folded": (
        "# pgprobe flame --folded\r\n\r\nmain;ExecScan+0x1a 40\r\nmain;ExecScan+26\t2\r\n"
        "main;hash_bytes 54.6\r\n",
        97,
    ),
    # stackcollapse-perf.pl --all: kernel, JIT and inlined annotations
    "perf.folded": (
        "postgres;PostgresMain;pread64;entry_SYSCALL_64_[k];vfs_read_[k] 9\n"
        "postgres;llvm_jit_fn_[j] 3\npostgres;hash_bytes_[i] 5\n",
        17,
    ),
    # bpftrace, one map entry per line
    "bpftrace_oneline.txt": ("Attaching 1 probe...\n@[main;f;g]: 10\n@cpu[main;h]: 4\n", 14),
    # bpftrace's own stack maps: leaf first, ustack(perf) lines, a comm key
    "bpftrace_stacks.txt": (
        "Attaching 1 probe...\n\n@[\n    ExecScan+26\n    PostgresMain+1200\n    main+50\n]: 7\n"
        "@[postgres, \n\t55d1a0 hash_bytes+0x1a (/usr/lib/postgresql/15/bin/postgres)\n"
        "\t55d0ff PostgresMain+0x40 (/usr/lib/postgresql/15/bin/postgres)\n]: 5\n",
        12,
    ),
}


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_accepted_dialects_render_without_a_word(tmp_path: Path, name: str) -> None:
    text, total = DIALECTS[name]
    src = tmp_path / name
    src.write_bytes(text.encode())
    done = flame_from(src)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert svg_total(done.stdout) == total
    folded = flame_from(src, "--folded")
    assert folded.returncode == 0 and folded.stderr == ""
    assert sum(int(x.rsplit(" ", 1)[1]) for x in folded.stdout.splitlines()) == total
