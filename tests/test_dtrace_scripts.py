"""Static checks of every d/*.d script: what can be checked without a DTrace to compile them.

- the text is well formed: comments and strings closed, braces, parentheses
  and brackets balanced; it splits into clauses (probe descriptions, an
  optional /predicate/, a { body });
- every probe exists: postgresql provider probes are in the probe list of
  the installed PostgreSQL server (its USDT notes, and `bpftrace -l`, with
  __ written -), the others are among the few the scripts may use;
- macros: only $1..$N (N = the parameters in the header's USAGE line, the
  same names and order as the bpf twin's), each one referenced (DTrace
  refuses an argument the program does not use), $$N only for a path; no
  $target or other macro variables (pgprobe passes no -p);
- the header follows bpf/'s convention, and the output keeps the layout the
  engine parses: @@attached in BEGIN, @@snapshot before the aggregations in
  the interval clause and in END, every printa() with a format string that
  starts with an @tag naming a map of the bpf twin, one key conversion per
  key field, quantize tables and stacks where the parser expects them, and
  every aggregation printed in both places and truncated after an interval.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import CHECKOUT, IN_CI, need

from pgprobe import usdt
from pgprobe.sandbox import pg_bindir

D_DIR = CHECKOUT / "d"
BPF_DIR = CHECKOUT / "bpf"
SCRIPTS = sorted(D_DIR.glob("*.d"))

OTHER_PROBES = {
    "dtrace:::BEGIN",
    "dtrace:::END",
    "tick-1sec",
    "profile-$1",
    "syscall::read:entry",
    "syscall::read:return",
    "syscall::readv:entry",
    "syscall::readv:return",
    "syscall::pread*:entry",
    "syscall::pread*:return",
    "sched:::off-cpu",
    "sched:::on-cpu",
    "sched:::wakeup",
    "proc:::create",
    "proc:::exit",
}
# Maps of the bpf twin that the D script does not print, and why (said in its header;
# waits: no @first_runs, so sleeps begun before the capture stay unknown on DTrace).
# --by query's maps: the statement read at each read or sample is bpftrace's only so far
# (pgprobe refuses --by query with DTrace in one line).
NOT_IN_D = {"clog_reads": {"open_errors", "qreads"}, "waits": {"task", "first_runs"},
            "profile": {"qstacks", "qkstacks"}}  # fmt: skip
PATH_PARAMS = {"BINARY"}
# A global variable's declaration at top level (D needs one for an associative
# array read, in a predicate, before any assignment): "uint64_t name[int];".
DECLARATION = re.compile(r"^\s*(?:\w+\s+)+\**\w+(?:\[[\w ,]*\])?;\s*$")


@dataclass
class Clause:
    probes: list[str]
    predicate: str
    body: str


@dataclass
class Script:
    path: Path
    text: str
    code: str  # comments blanked out, strings kept
    pragmas: list[str] = field(default_factory=list)
    declarations: list[str] = field(default_factory=list)  # top-level "TYPE name[KEY];"
    clauses: list[Clause] = field(default_factory=list)

    def clauses_of(self, probe_prefix: str) -> list[Clause]:
        return [c for c in self.clauses if any(p.startswith(probe_prefix) for p in c.probes)]


def strip_comments(text: str) -> str:
    """Blank out /* */ comments (keeping newlines); fail on unclosed comments or strings."""
    out = []
    i = 0
    while i < len(text):
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            assert end >= 0, f"unclosed comment at offset {i}"
            out.append(re.sub(r"[^\n]", " ", text[i : end + 2]))
            i = end + 2
        elif text[i] == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                assert text[j] != "\n", f"unclosed string at offset {i}"
                j += 2 if text[j] == "\\" else 1
            assert j < len(text), f"unclosed string at offset {i}"
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def without_strings(code: str) -> str:
    return re.sub(r'"(\\.|[^"\\])*"', '""', code)


def parse(path: Path) -> Script:
    text = path.read_text()
    code = strip_comments(text)
    bare = without_strings(code)
    pairs = {"}": "{", ")": "(", "]": "["}
    stack: list[str] = []
    for ch in bare:
        if ch in "{([":
            stack.append(ch)
        elif ch in pairs:
            assert stack and stack[-1] == pairs[ch], f"{path.name}: unbalanced {ch}"
            stack.pop()
    assert not stack, f"{path.name}: unclosed {stack}"

    script = Script(path, text, code)
    lines = []
    for line in code.splitlines():
        if line.startswith("#pragma"):
            script.pragmas.append(line.split(None, 3)[3].strip())  # "#pragma D option X"
        elif DECLARATION.match(line):
            script.declarations.append(line.strip())
        elif not line.startswith("#!"):
            lines.append(line)
    rest = "\n".join(lines)
    # top level: HEADER { BODY } ...
    pos = 0
    while rest[pos:].strip():
        open_at = rest.index("{", pos)
        depth, j = 0, open_at
        while True:
            if rest[j] == "{":
                depth += 1
            elif rest[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            elif rest[j] == '"':
                j = rest.index('"', j + 1)
            j += 1
        header, body = rest[pos:open_at].strip(), rest[open_at + 1 : j]
        probes_text, slash, predicate = header.partition("/")
        if slash:
            assert predicate.rstrip().endswith("/"), f"{path.name}: predicate not closed: {header}"
            predicate = predicate.rstrip()[:-1]
        probes = [p.strip() for p in probes_text.split(",") if p.strip()]
        assert probes, f"{path.name}: a clause without probe descriptions: {header!r}"
        script.clauses.append(Clause(probes, predicate.strip(), body))
        pos = j + 1
    return script


def usage_params(text: str, ext: str) -> list[str]:
    """Parameter names of the header's USAGE line (and its indented continuation lines),
    brackets removed."""
    m = re.search(rf"USAGE: \S+ (?:-qs )?\S+\.{ext}(.*(?:\n \* {{4,}}[A-Z\[].*)*)", text)
    assert m, f"no USAGE line for .{ext}"
    return re.findall(r"[A-Z][A-Z_]+", m.group(1))


def bpf_twin(script: Script) -> Path:
    return BPF_DIR / (script.path.stem + ".bt")


def bpf_printed_maps(path: Path) -> set[str]:
    """The maps a bpftrace script prints; a map's "_b" twin (its second buffer) is that map."""
    printed = set(re.findall(r"print\(@(\w+)\)", path.read_text()))
    return {m for m in printed if not (m.endswith("_b") and m[:-2] in printed)}


def printa_calls(body: str) -> list[tuple[str, str]]:
    """(format, aggregation) of each printa() in a body."""
    calls = re.findall(r'printa\(\s*"((?:\\.|[^"\\])*)"\s*,\s*@(\w+)\s*\)', body)
    assert len(calls) == body.count("printa("), f"a printa() without a format string: {body}"
    return calls


def aggregations(script: Script) -> dict[str, tuple[int, str]]:
    """@name -> (number of key fields, aggregating function) from the assignments."""
    found: dict[str, tuple[int, str]] = {}
    bare = without_strings(script.code)
    for m in re.finditer(r"@(\w+)(\[(.*?)\])?\s*=\s*(\w+)\(", bare):
        keys = m.group(3)
        arity = 0 if keys is None else len(_top_level_split(keys))
        found[m.group(1)] = (arity, m.group(4))
    return found


def _top_level_split(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch in "(["
        depth -= ch in ")]"
        cur += ch
    return [*parts, cur]


@pytest.fixture(scope="module")
def postgres_probes() -> set[str]:
    """The postgresql provider's probe names, as DTrace writes them (- for __)."""
    try:
        binary = pg_bindir() / "postgres"
    except (OSError, RuntimeError, ValueError):
        binary = Path("/nonexistent")
    need(binary.exists(), "no PostgreSQL server installed to read its probe list from")
    names = {n for p, n in usdt.probe_names(str(binary)) if p == usdt.PROVIDER}
    need(bool(names), f"{binary} was built without --enable-dtrace")
    return {n.replace("__", "-") for n in names}


# bpf scripts without a D twin, and why.
BPF_ONLY_SCRIPTS = {
    # A uprobe on pgstat_count_slru_page_read: DTrace for Linux's pid provider cannot
    # grab the backends (d/clog_reads.d's header); with DTrace clog-reads uses syscalls.
    "clog_reads_uprobe",
    "clog_reads_uprobe_stacks",  # its twin with stacks
    # waits --stacks: bpftrace only (the tool refuses --engine dtrace with --stacks).
    "waits_stacks",
}


def test_there_is_a_d_script_per_bpf_script() -> None:
    bpf = {p.stem for p in BPF_DIR.glob("*.bt")} - BPF_ONLY_SCRIPTS
    assert {p.stem for p in SCRIPTS} == bpf


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_well_formed_clauses(path: Path) -> None:
    script = parse(path)
    assert script.clauses
    for clause in script.clauses:
        for statement in without_strings(clause.body).split(";"):
            assert "{" not in statement, f"{path.name}: nested blocks (if/else) are not portable"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_probes_exist(path: Path, postgres_probes: set[str]) -> None:
    for clause in parse(path).clauses:
        for probe in clause.probes:
            if probe.startswith("postgresql"):
                provider, _, _, name = probe.split(":")
                assert provider == "postgresql*", f"{probe}: use postgresql* and a pid predicate"
                assert name in postgres_probes, f"{path.name}: no such probe {probe}"
            else:
                assert probe in OTHER_PROBES, f"{path.name}: unexpected probe {probe}"


def test_postgres_probe_names_agree_with_bpftrace(postgres_probes: set[str]) -> None:
    """The same list as `bpftrace -l 'usdt:BINARY:*'` gives (with __ -> -)."""
    have = os.geteuid() == 0 and shutil.which("bpftrace") is not None
    need(have, "needs root and bpftrace to list the probes")
    binary = pg_bindir() / "postgres"
    out = subprocess.run(
        ["bpftrace", "-l", f"usdt:{binary}:*"], capture_output=True, text=True, timeout=60
    ).stdout
    listed = {ln.rsplit(":", 1)[1].replace("__", "-") for ln in out.split() if ":postgresql:" in ln}
    assert listed == postgres_probes
    assert {"lwlock-wait-start", "lwlock-wait-done"} <= listed


# Parameters of a bpf script that its D twin does without, and why (the D script takes
# the others in the same order).
BPF_ONLY_PARAMS = {
    # bpftrace 0.17 stops its syscall tracepoints at SIGINT, a second or more before END
    # under load, so clog_reads.bt counts up to pgprobe's own SIGINT; DTrace runs END
    # with its probes still enabled, so END closes clog_reads.d's window in time.
    "clog_reads": ["STOPPER_PID", "ENTRY", "STATE_OFF", "QID_OFF"],
    "profile": ["ENTRY", "STATE_OFF", "QID_OFF"],  # --by query: bpftrace only
    # waits.bt reads task_struct fields at offsets from the kernel's BTF (bpftrace 0.17
    # spends ~1 s compiling curtask->field); waits.d reads curthread's fields by name.
    "waits": [
        "SUM_OFF",
        "PREV_OFF",
        "FLAGS_OFF",
        "PARENT_OFF",
        "TGID_OFF",
        "PCOUNT_OFF",
        "START_OFF",
    ],
}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_macros_are_the_parameters_of_the_bpf_twin(path: Path) -> None:
    script = parse(path)
    params = usage_params(script.text, "d")
    twin = usage_params(bpf_twin(script).read_text(), "bt")
    bpf_only = BPF_ONLY_PARAMS.get(path.stem, [])
    assert set(bpf_only) <= set(twin), f"{bpf_only} not in the bpf twin's USAGE"
    assert params == [p for p in twin if p not in bpf_only], "same list as bpf/"
    code = without_strings(script.code)
    used = {int(n) for n in re.findall(r"\$\$?(\d+)", code)}
    assert used == set(range(1, len(params) + 1)), "every parameter referenced, no other"
    for n in {int(n) for n in re.findall(r"\$\$(\d+)", code)}:
        assert params[n - 1] in PATH_PARAMS, f"$${n} ({params[n - 1]}) is not a path"
    for n in {int(n) for n in re.findall(r"(?<!\$)\$(\d+)", code)}:
        assert params[n - 1] not in PATH_PARAMS, f"${n} is a path: use $${n}"
    assert not re.findall(r"\$[A-Za-z_]", code), "no $target or other macro variables"
    assert "defaultargs" in script.pragmas and "quiet" in script.pragmas


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_header_convention(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#!/usr/sbin/dtrace -qs\n/*\n")
    head = text[: text.index("*/")]
    assert f" * {path.name} - " in head
    for section in ("USAGE:", "REQUIREMENTS:", "OUTPUT", "OVERHEAD:", "EXAMPLE:"):
        assert f" * {section}" in head, f"{path.name}: no {section} section"
    assert "Part of pgprobe" in head
    assert f"samples/{path.stem}_d_example.txt" in head


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_output_layout(path: Path) -> None:
    script = parse(path)
    aggs = aggregations(script)
    assert aggs, "the scripts aggregate"
    (begin,) = [c for c in script.clauses_of("dtrace:::BEGIN") if not c.predicate]
    assert re.search(r'printf\("@@attached\\t' + re.escape(path.name), begin.body)
    (end,) = script.clauses_of("dtrace:::END")
    ticks = [c for c in script.clauses_of("tick-1sec") if "printa(" in c.body]
    (interval,) = ticks
    twin_maps = bpf_printed_maps(bpf_twin(script))
    tags: set[str] = set()
    for clause in (interval, end):
        body = clause.body
        assert body.index('"@@snapshot\\t%Y\\n", walltimestamp') < body.index("printa(")
        printed = {agg for _, agg in printa_calls(body)}
        assert printed == set(aggs), f"every aggregation printed: {set(aggs) - printed}"
        for fmt, agg in printa_calls(body):
            arity, func = aggs[agg]
            tag = fmt.split("\\t", 1)[0]
            assert re.fullmatch(r"@\w+(:count|:total)?", tag), fmt
            tags.add(tag[1:].split(":")[0])
            conversions = re.findall(r"%(@?)[-\d]*([a-zA-Z])", fmt)
            keys = [c for at, c in conversions if not at]
            assert len(keys) == arity, f"{fmt}: {len(keys)} conversions for {arity} key fields"
            assert [c for at, c in conversions if at] == ["d"], fmt
            if func == "quantize":
                assert "\\n%@d\\n" in fmt and fmt.index("%@d") > fmt.rfind("%s"), fmt
            elif "k" in keys:
                assert keys[0] == "d" and set(keys[1:]) == {"k"} and "%@d%k" in fmt, fmt
                assert fmt.count("%k") == 1 or "\\n--%k" in fmt, "stacks separated by --"
            else:
                assert fmt.endswith("\\t%@d\\n"), fmt
            if tag.endswith((":count", ":total")):
                assert func == ("count" if tag.endswith(":count") else "sum"), fmt
    # waits.d's prints are cumulative (pgprobe takes a window as the difference of two).
    for agg in aggs:
        truncated = f"trunc(@{agg});" in interval.body
        assert truncated != (path.stem == "waits"), f"@{agg}: truncated after an interval?"
    # Scalars kept in variables are printed with printf (exact at the clause, unlike printa).
    for clause in (interval, end):
        tags |= set(re.findall(r'printf\("@(\w+)\\t%d\\n", \w+\)', clause.body))
    assert tags == twin_maps - NOT_IN_D.get(path.stem, set()), "the bpf twin's map names"


def test_ci_reads_the_probe_list() -> None:
    """Under CI the probe checks above must not have been skipped."""
    if IN_CI:
        assert (pg_bindir() / "postgres").exists()
