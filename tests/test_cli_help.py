"""The command line's front door (issue 32): every --help ends with examples that parse,
one spelling per idea (the old ones hidden aliases), usage errors that name the command's
help, psql habits answered, and `pgprobe` alone says where to start.

No root, no cluster: help and parsing only (the connection hint with a stubbed libpq).
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shlex
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from helpers import CHECKOUT

from pgprobe import cli, connection
from pgprobe.errors import EXIT_CONNECT, PgprobeError

COMMANDS = list(cli.COMMANDS)
TRACING = ["lwlocks", "clog-reads", "waits", "flame", "hot", "triage"]
# A figure a measurement gave (a cost, a rate, a size), which help texts leave to the docs.
FIGURE = re.compile(r"~\s*\d|\d\s*(?:µs|us|ns|ms|%|KB|KiB|MB|MiB)\b|\d+\s*-\s*\d+\s*%")
# Old spelling -> the new one: both parse to the same namespace.
ALIASES = [
    (["flame", "--per-backend"], ["flame", "--by", "pid"]),
    (["flame", "--folded"], ["flame", "--format", "folded"]),
    (["flame", "--folded", "--format", "folded"], ["flame", "--format", "folded"]),
    (["flame", "--hz", "49"], ["flame", "-F", "49"]),
    (["flame", "--hz", "49"], ["flame", "--frequency", "49"]),
    (["hot", "--hz", "49"], ["hot", "-F", "49"]),
    (["triage", "--hz", "49"], ["triage", "--frequency", "49"]),
    (["triage", "-F", "49"], ["triage", "--frequency", "49"]),
    (["serve", "--hz", "7"], ["serve", "-F", "7"]),
    (["clog-reads", "--folded", "r.fold"], ["clog-reads", "--format", "folded", "-o", "r.fold"]),
    (["clog-reads", "--pprof", "r.pb.gz"], ["clog-reads", "--format", "pprof", "-o", "r.pb.gz"]),
]
HIDDEN = {"flame": ["--per-backend", "--folded", "--hz"], "hot": ["--hz"],
          "triage": ["--hz"], "serve": ["--hz"], "clog-reads": ["--folded", "--pprof"]}  # fmt: skip


def pgprobe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgprobe", *args], capture_output=True,
                          text=True, timeout=60, cwd=CHECKOUT)  # fmt: skip


def parse(words: list[str]) -> argparse.Namespace:
    """Through the whole parser; a SystemExit (a usage error, or help) fails the test."""
    try:
        return cli.build_parser().parse_args(words)
    except SystemExit as exc:
        pytest.fail(f"`pgprobe {' '.join(words)}` does not parse (exit {exc.code})")


def command_words(line: str) -> list[str]:
    """`sudo pgprobe flame -U postgres > cpu.svg  # what` -> [flame, -U, postgres]."""
    words = shlex.split(line, comments=True)
    if words[:1] == ["sudo"]:
        words = words[1:]
    assert words[:1] == ["pgprobe"], line
    words = words[1:]
    for i, word in enumerate(words):
        if word[:1] in (">", "|", "<", "&", ";") or word.startswith("2>"):
            return words[:i]
    return words


def examples_of(text: str) -> list[str]:
    """The command lines of the examples block, which must end the help."""
    lines = text.rstrip().splitlines()
    assert "examples:" in lines, text[-500:]
    start = len(lines) - 1 - lines[::-1].index("examples:")
    block = lines[start + 1 :]
    found = []
    for i, line in enumerate(block):
        assert line.startswith("  ") and line.strip(), f"not an example line: {line!r}"
        body = line.strip()
        if body.startswith("#"):  # the comment of a long line, under it
            continue
        beside = "  # " in line
        under = i + 1 < len(block) and block[i + 1].strip().startswith("# ")
        assert beside or under, f"an example without its comment: {line!r}"
        found.append(body)
    assert 3 <= len(found) <= 6, found
    return found


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """`pgprobe --help` ("") and `pgprobe CMD --help`, run as a user would."""
    out = {}
    for name in ["", *COMMANDS]:
        done = pgprobe(*([name] if name else []), "--help")
        assert done.returncode == 0, done.stderr
        out[name] = done.stdout
    return out


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_help_ends_with_examples_that_parse(helps: dict[str, str], name: str) -> None:
    for example in examples_of(helps[name]):
        words = command_words(example)
        assert words and words[0] in COMMANDS, example
        ns = parse(words)
        assert ns.command == words[0]


def test_top_help_says_where_to_start(helps: dict[str, str]) -> None:
    top = helps[""]
    assert "start here:" in top and "sudo pgprobe doctor" in top
    assert "-h is the server host" in top
    for name in COMMANDS:
        assert re.search(rf"^ +{name}\b", top, re.MULTILINE), name


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_help_has_no_measured_figures(helps: dict[str, str], name: str) -> None:
    found = [line for line in helps[name].splitlines() if FIGURE.search(line)]
    assert not found, found


@pytest.mark.parametrize(("old", "new"), ALIASES, ids=[" ".join(o) for o, _ in ALIASES])
def test_old_spellings_parse_as_the_new_ones(old: list[str], new: list[str]) -> None:
    assert vars(parse(old)) == vars(parse(new))


def test_old_spellings_are_out_of_the_help(helps: dict[str, str]) -> None:
    for name, options in HIDDEN.items():
        for option in options:
            assert not re.search(rf"{option}\b", helps[name]), (name, option)
    for name in ("flame", "hot", "triage", "serve"):
        assert "-F HZ, --frequency HZ" in helps[name], name
    for name in ("flame", "waits", "lwlocks"):
        assert "--by {pid,query}" in helps[name], name
    assert "--by {query}" in helps["hot"]


@pytest.mark.parametrize(
    "args",
    [
        ["flame", "--folded", "--format", "svg"],
        ["flame", "--format", "pprof", "--folded"],
        ["clog-reads", "--folded", "a.folded", "--pprof", "a.pb.gz"],
        ["clog-reads", "--pprof", "a.pb.gz", "--format", "folded"],
    ],
)
def test_old_and_new_spellings_that_disagree_are_refused(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(args)
    assert exc.value.code == 2


@pytest.mark.parametrize("name", COMMANDS)
def test_a_usage_error_names_the_commands_help(name: str) -> None:
    done = pgprobe(name, "--no-such-option")
    assert done.returncode == 2
    assert done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line
    assert line.startswith(f"pgprobe {name}: unrecognized arguments: --no-such-option")
    assert line.endswith(f"(see pgprobe {name} --help)")


@pytest.mark.parametrize("name", TRACING)
def test_d_with_a_database_name_says_what_d_is(name: str) -> None:
    done = pgprobe(name, "-d", "postgres")
    assert done.returncode == 2
    assert f"pgprobe {name}: argument -d/--duration" in done.stderr
    assert "(-d is the duration in pgprobe; the database is --dbname postgres)" in done.stderr
    assert f"(see pgprobe {name} --help)" in done.stderr


def test_d_with_a_unit_asks_for_seconds() -> None:
    done = pgprobe("waits", "-d", "10s")
    assert done.returncode == 2 and "-d 30" in done.stderr and "--dbname" not in done.stderr


def test_pgprobe_alone_says_where_to_start() -> None:
    done = pgprobe()
    assert done.returncode == 2
    assert done.stderr.startswith("usage: pgprobe")
    assert "start here:" in done.stderr and "sudo pgprobe triage -U postgres" in done.stderr
    for name in COMMANDS:
        assert f"  {name} " in done.stderr
    assert "error" not in done.stderr and "required" not in done.stderr


def test_question_mark_is_help() -> None:
    for args in (["-?"], ["waits", "-?"]):
        done = pgprobe(*args)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("usage: pgprobe")
        assert examples_of(done.stdout)


def test_top_level_h_is_help_with_a_note_and_h_host_first_is_a_hint() -> None:
    done = pgprobe("-h")
    assert done.returncode == 0 and "start here:" in done.stdout
    assert "-h is the server host" in done.stderr
    done = pgprobe("-h", "/tmp", "waits")
    assert done.returncode == 2
    assert "pgprobe waits -h /tmp" in done.stderr


def test_h_in_a_command_is_still_the_host() -> None:
    assert parse(["waits", "-h", "/tmp"]).host == "/tmp"


def test_a_bare_word_hints_at_dbname() -> None:
    done = pgprobe("waits", "postgres")
    assert done.returncode == 2
    assert "--dbname postgres" in done.stderr
    assert "(see pgprobe waits --help)" in done.stderr


def sample_commands() -> list[tuple[str, str]]:
    """Every `$ pgprobe ...`, `$ sudo pgprobe ...` and `# pgprobe ...` command of samples/
    (a `# pgprobe hot: real runs ...` line is prose, not a command)."""
    found = []
    for path in sorted((CHECKOUT / "samples").glob("*.txt")):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for prefix in ("$ sudo pgprobe ", "$ pgprobe ", "# pgprobe "):
                if line.startswith(prefix):
                    words = line[len(prefix) :].split()
                    prose = any(w.endswith((":", ";", ")")) for w in words) or (
                        len(words) > 1 and not words[1].startswith("-")
                    )
                    if words and words[0] in COMMANDS and not prose:
                        found.append((f"{path.name}:{number}", line))
    return found


def test_samples_have_commands() -> None:
    assert len(sample_commands()) >= 10


@pytest.mark.parametrize(("where", "line"), sample_commands(), ids=lambda v: str(v)[:60])
def test_sample_commands_parse(where: str, line: str) -> None:
    words = command_words(line.lstrip("$# "))
    # "-h ... -p ...": elided values; a port must still be a number.
    words = [("5432" if i and words[i - 1] in ("-p", "--port") else "x") if w == "..." else w
             for i, w in enumerate(words)]  # fmt: skip
    parse(words)


def _refuse(message: str) -> Any:
    def connect(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError(message)

    return connect


def test_a_missing_role_named_after_the_os_user_hints_at_dash_u(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = pwd.getpwuid(os.geteuid()).pw_name
    refused = f'connection failed: FATAL:  role "{user}" does not exist'
    monkeypatch.setattr(psycopg, "connect", _refuse(refused))
    monkeypatch.delenv("PGUSER", raising=False)
    with pytest.raises(PgprobeError) as exc:
        connection.connect(connection.ConnOptions(host="/tmp"))
    assert exc.value.exit_code == EXIT_CONNECT
    assert exc.value.message.endswith("(run with -U postgres, or set PGUSER)")
    # A user was named: the role is that user's, no hint.
    for opts in (connection.ConnOptions(user=user), connection.ConnOptions(dbname=f"user={user}")):
        with pytest.raises(PgprobeError) as exc:
            connection.connect(opts)
        assert "PGUSER" not in exc.value.message
    monkeypatch.setenv("PGUSER", user)
    with pytest.raises(PgprobeError) as exc:
        connection.connect(connection.ConnOptions())
    assert "PGUSER" not in exc.value.message


def doc_commands() -> list[tuple[str, str]]:
    """Every `sudo pgprobe ...` / `pgprobe ...` line in the code blocks of the README and
    docs/ (with or without a `$ ` prompt); synopsis lines (`[...]`, `|`) are not commands."""
    found = []
    pages = [CHECKOUT / "README.md", CHECKOUT / "CONTRIBUTING.md"]
    pages += sorted((CHECKOUT / "docs").rglob("*.md"))
    for path in pages:
        in_code = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
                continue
            text = line.strip().removeprefix("$ ")
            if (in_code or line.startswith("    ")) and text.startswith(
                ("pgprobe ", "sudo pgprobe ")
            ):
                words = text.removeprefix("sudo ").split()
                if len(words) > 1 and words[1] in COMMANDS and "[" not in text.split("#")[0]:
                    found.append((f"{path.name}:{number}", text))
    return found


def test_docs_have_commands() -> None:
    assert len(doc_commands()) >= 30


@pytest.mark.parametrize(("where", "line"), doc_commands(), ids=lambda v: str(v)[:60])
def test_doc_commands_parse(where: str, line: str) -> None:
    parse(command_words(line))
