"""Tests of pgprobe.render.flamegraph: folded parsing, the SVG document, speedscope JSON.

Long because it holds every renderer test, grouped by section below.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest
from helpers import CHECKOUT

from pgprobe.render.flamegraph import (
    MODULE_LABELS,
    XPAD,
    StacksInput,
    classify_frame,
    parse_folded,
    read_folded,
    render_speedscope,
    render_svg,
    strip_offset,
)

NS = "{http://www.w3.org/2000/svg}"

HAND = """\
a;b;c 5
a;b 3
a;d 2
e 4
a;b;c 1
"""


@dataclass
class Frame:
    name: str
    tip: str
    d: int
    s: int
    n: int
    x: float
    w: float
    y: float
    fill: str
    label: str


def frames_of(svg: str) -> list[Frame]:
    """The drawn frames of a rendered SVG: name, depth, start, count, rect geometry, label."""
    root = ET.fromstring(svg)
    out: list[Frame] = []
    for g in root.iter(NS + "g"):
        if g.get("class") != "f":
            continue
        title = g.find(NS + "title")
        rect = g.find(NS + "rect")
        text = g.find(NS + "text")
        assert title is not None and rect is not None and text is not None
        tip = title.text or ""
        out.append(
            Frame(
                name=tip[: tip.rindex(" (")],
                tip=tip,
                d=int(g.get("data-d", "-1")),
                s=int(g.get("data-s", "-1")),
                n=int(g.get("data-n", "-1")),
                x=float(rect.get("x", "nan")),
                w=float(rect.get("width", "nan")),
                y=float(rect.get("y", "nan")),
                fill=rect.get("fill", ""),
                label=text.text or "",
            )
        )
    return out


def by_path(frames: list[Frame]) -> dict[tuple[str, ...], Frame]:
    """Index frames by their full path from the root, rebuilt from depth and sample ranges."""
    out: dict[tuple[str, ...], Frame] = {}
    paths: dict[tuple[int, int], tuple[str, ...]] = {}
    ordered = sorted(frames, key=lambda f: (f.d, f.s))
    for f in ordered:
        if f.d == 0:
            path: tuple[str, ...] = ()
        else:
            parent = next(
                p for p in ordered if p.d == f.d - 1 and p.s <= f.s and f.s + f.n <= p.s + p.n
            )
            path = paths[(parent.d, parent.s)] + (f.name,)
        paths[(f.d, f.s)] = path
        out[path] = f
    return out


# --------------------------------------------------------------------------------------------
# the SVG document


def test_svg_is_xml_and_root_holds_the_total() -> None:
    svg = render_svg(HAND, title="t", subtitle="10 s at 99 Hz")
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    frames = frames_of(svg)
    top = [f for f in frames if f.d == 0]
    assert len(top) == 1
    assert top[0].name == "all"
    assert top[0].n == 15
    assert "15 samples, 100.00%" in str(top[0].tip)
    assert top[0].w == pytest.approx(1200 - 2 * XPAD)


def test_inclusive_totals_positions_and_sorting() -> None:
    frames = by_path(frames_of(render_svg(HAND)))
    totals = {p: f.n for p, f in frames.items()}
    assert totals == {
        (): 15,
        ("a",): 11,
        ("a", "b"): 9,
        ("a", "b", "c"): 6,
        ("a", "d"): 2,
        ("e",): 4,
    }
    plotw = 1200 - 2 * XPAD
    for f in frames.values():
        assert f.w == pytest.approx(int(f.n) * plotw / 15, abs=0.01)
        assert f.x == pytest.approx(XPAD + int(f.s) * plotw / 15, abs=0.01)
    # siblings in name order, children start where their parent starts
    assert frames[("a",)].s == 0 and frames[("e",)].s == 11
    assert frames[("a", "b")].s == 0 and frames[("a", "d")].s == 9
    # deeper is higher up (root at the bottom)
    assert frames[("a", "b", "c")].y < frames[("a", "b")].y < frames[()].y


def test_identical_stacks_merge_whatever_the_input_form(tmp_path: Path) -> None:
    parsed = parse_folded(HAND)
    p = tmp_path / "in.folded"
    p.write_text(HAND)
    forms: list[object] = [
        HAND,
        HAND.splitlines(),
        p,
        parsed,
        list(parsed.items()),
        {";".join(k): v for k, v in parsed.items()},
        [(";".join(k), v) for k, v in parsed.items()],
    ]
    svgs = {render_svg(f) for f in forms}  # type: ignore[arg-type]
    assert len(svgs) == 1


def test_minwidth_omits_narrow_frames_but_parents_keep_totals() -> None:
    text = "a;big 100000\na;tiny;deeper 1\n"
    frames = by_path(frames_of(render_svg(text)))
    assert ("a", "tiny") not in frames and ("a", "tiny", "deeper") not in frames
    assert frames[("a",)].n == 100001
    assert frames[()].n == 100001
    everything = by_path(frames_of(render_svg(text, minwidth=0)))
    assert everything[("a", "tiny", "deeper")].n == 1
    # a large minwidth leaves only the wide frames
    wide = by_path(frames_of(render_svg("a 90\nb 10\n", minwidth=200)))
    assert set(wide) == {(), ("a",)}


@pytest.mark.parametrize("empty", ["", "\n# nothing\n", [], {}, "a;b 0\n"])
def test_empty_profile_renders(empty: object) -> None:
    svg = render_svg(empty, title="nothing here")  # type: ignore[arg-type]
    root = ET.fromstring(svg)
    assert frames_of(svg) == []
    texts = ["".join(t.itertext()) for t in root.iter(NS + "text")]
    assert "no samples" in texts
    assert "nothing here" in texts


def test_names_are_escaped() -> None:
    nasty = [
        "std::vector<int, std::allocator<int> >::operator[](unsigned long)",
        'say "hi" & <bye>',
        "it's",
        "ctl\x01char",
        "]]>",
    ]
    text = "".join(f"root;{n} {i + 1}\n" for i, n in enumerate(nasty))
    svg = render_svg(text, title="<T&'\">", subtitle='a<b & "c"', minwidth=0)
    root = ET.fromstring(svg)  # would raise on a bad escape
    names = {f.name for f in frames_of(svg)}
    for n in nasty:
        assert n.replace("\x01", "\\x01") in names  # shown as text (pgprobe.literal)
    texts = ["".join(t.itertext()) for t in root.iter(NS + "text")]
    assert "<T&'\">" in texts
    assert 'a<b & "c"' in texts
    # labels are cut before escaping, never inside an entity
    narrow = render_svg("x;" + "&" * 500 + " 1\n", width=300)
    assert ET.fromstring(narrow) is not None
    label = next(str(f.label) for f in frames_of(narrow) if f.d == 2)
    assert label.endswith("..") and set(label[:-2]) == {"&"}


def test_labels_truncated_to_fit() -> None:
    long = "a_rather_long_function_name_that_cannot_fit"
    frames = frames_of(render_svg(f"{long} 10\nshort 30\n", width=400))
    f = next(f for f in frames if f.name == long)
    label = str(f.label)
    assert label.endswith("..") and long.startswith(label[:-2])
    assert len(label) * 12 * 0.59 <= float(f.w)
    assert next(f for f in frames if f.name == "short").label == "short"


def test_self_contained() -> None:
    svg = render_svg(HAND)
    assert re.findall(r"https?://[^\s\"'<>]+", svg) == ["http://www.w3.org/2000/svg"]
    for token in ("href", "src=", "@import", "url(", "fetch(", "XMLHttpRequest"):
        assert token not in svg
    assert "<script>" in svg and "<style>" in svg


def test_page_code_is_package_data_inlined_verbatim() -> None:
    """flamegraph.css and flamegraph.js are read through importlib.resources (as from an
    installed wheel) and land in the SVG as they are, the script whole in its CDATA section."""
    package = resources.files("pgprobe.render.flamegraph")
    css = package.joinpath("flamegraph.css").read_text(encoding="utf-8")
    js = package.joinpath("flamegraph.js").read_text(encoding="utf-8")
    assert "function zoomTo(" in js and "#frames text" in css
    assert "]]>" not in js
    svg = render_svg(HAND)
    assert f"<style>\n{css}</style>" in svg
    assert svg.count("<![CDATA[") == 1 and f"\n{js}]]></script>" in svg


def test_wheel_carries_the_page_code(tmp_path: Path) -> None:
    """The wheel (as `pip wheel` builds it) holds the .css/.js beside the modules."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(CHECKOUT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("pgprobe-*.whl")
    package = resources.files("pgprobe.render.flamegraph")
    with zipfile.ZipFile(wheel) as zf:
        for name in ("flamegraph.css", "flamegraph.js"):
            shipped = zf.read(f"pgprobe/render/flamegraph/{name}")
            assert shipped == package.joinpath(name).read_bytes()


def test_colours_by_module_and_deterministic() -> None:
    text = (
        "postgres;PostgresMain;ExecScan;pread64_[k];vfs_read_[k] 5\n"
        "postgres;PostgresMain;libc.so.6`malloc 3\n"
        "postgres;PostgresMain;pg_stat_statements.so`pgss_ExecutorRun 2\n"
        "postgres;PostgresMain;[unknown] 1\n"
        "postgres;PostgresMain;postgres+0x4a2f10 1\n"
    )
    svg = render_svg(text)
    fills = {f.name: f.fill for f in frames_of(svg)}
    assert render_svg(text) == svg  # deterministic, no random colours
    assert all(re.fullmatch(r"#[0-9a-f]{6}", str(c)) for c in fills.values())
    # same name, same colour, in any profile
    other = {f.name: f.fill for f in frames_of(render_svg("x;ExecScan 7\n"))}
    assert other["ExecScan"] == fills["ExecScan"]
    legend = ET.fromstring(svg).find(f".//{NS}g[@id='legend']")
    assert legend is not None
    labels = [t.text for t in legend.iter(NS + "text")]
    assert labels == list(MODULE_LABELS.values())
    # a caller's classifier: its own module names, with palettes and legend entries
    svg2 = render_svg(text, module_of=lambda f: "core" if f.startswith("P") else "rest")
    legend2 = ET.fromstring(svg2).find(f".//{NS}g[@id='legend']")
    assert legend2 is not None
    assert [t.text for t in legend2.iter(NS + "text")] == ["core", "rest"]


def test_classify_frame() -> None:
    assert classify_frame("ExecScan") == "postgres"
    assert classify_frame("vfs_read_[k]") == "kernel"
    assert classify_frame("genunix`fop_read") == "kernel"
    assert classify_frame("libc.so.6`malloc") == "libc"
    assert classify_frame("ld-linux-x86-64.so.2+0x1234") == "libc"
    assert classify_frame("/usr/lib/x86_64-linux-gnu/libc.so.6+0x10") == "libc"
    assert classify_frame("libfoo.so+0x1a2") == "lib"
    assert classify_frame("pg_stat_statements.so`pgss_ExecutorRun") == "lib"
    assert classify_frame("evalexpr_0_1_[j]") == "lib"
    assert classify_frame("ExecScan_[i]") == "postgres"
    assert classify_frame("postgres`ExecScan") == "postgres"
    assert classify_frame("[unknown]") == "unresolved"
    assert classify_frame("0x7f12ab34") == "unresolved"
    assert classify_frame("postgres+0x4a2f10") == "unresolved"
    assert classify_frame("postgres`0x4a2f10") == "unresolved"


# --------------------------------------------------------------------------------------------
# offsets and parsing


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ("ExecScan+0x1a", "ExecScan"),
        ("ExecScan+26", "ExecScan"),
        ("vfs_read+0x5/0x1a0", "vfs_read"),
        ("vfs_read+0x5_[k]", "vfs_read_[k]"),
        ("postgres`ExecScan+0x1a", "postgres`ExecScan"),
        ("std::operator+", "std::operator+"),
        ("operator+(a, b)+0x10", "operator+(a, b)"),
        ("ExecScan", "ExecScan"),
        # no symbol: the address is all there is, keep it
        ("postgres+0x4a2f10", "postgres+0x4a2f10"),
        ("postmaster+0x10", "postmaster+0x10"),
        ("libfoo.so+0x1a2", "libfoo.so+0x1a2"),
        ("libc.so.6+0x2a1f0", "libc.so.6+0x2a1f0"),
        ("/usr/lib/plpgsql.so+0x99", "/usr/lib/plpgsql.so+0x99"),
        ("[unknown]+0x10", "[unknown]+0x10"),
        ("0x7f00+0x10", "0x7f00+0x10"),
        ("postgres`postgres+0x10", "postgres`postgres+0x10"),
    ],
)
def test_strip_offset(frame: str, expected: str) -> None:
    assert strip_offset(frame) == expected


def test_strip_offset_exe_names() -> None:
    assert strip_offset("pgbench+0x10") == "pgbench"
    assert strip_offset("pgbench+0x10", exe_names={"pgbench"}) == "pgbench+0x10"


def test_offsets_merge_functions_but_not_addresses() -> None:
    text = "a;f+0x1 1\na;f+0x2 2\na;f+17 4\na;postgres+0x10 8\na;postgres+0x20 16\n"
    frames = by_path(frames_of(render_svg(text, minwidth=0)))
    assert frames[("a", "f")].n == 7
    assert frames[("a", "postgres+0x10")].n == 8
    assert frames[("a", "postgres+0x20")].n == 16
    kept = parse_folded(text, strip_offsets=False)
    assert len(kept) == 5


def test_parse_folded_variants() -> None:
    text = (
        "# a comment\n"
        "\n"
        "a;b;c 5\r\n"
        "a;b;c\t2\n"  # tab
        "a;b;c    1\n"  # several spaces
        "  a;b 3  \n"  # surrounding blanks
        "a;b 1.6\n"  # decimal count, rounded
        "x;f+0x1a 4\n"  # perf offset stripped
        "k;vfs_read_[k] 2\n"
        "cpp;foo(int, char) 7\n"  # spaces inside a frame
        "@[a;b;c]: 10\n"  # bpftrace map, one line
        "@stacks[z]: 1\n"
        "not a stack\n"
        "noframes\n"
        " 9\n"
        "a;zero 0\n"
    )
    got = parse_folded(text)
    assert got == {
        ("a", "b", "c"): 18,
        ("a", "b"): 5,
        ("x", "f"): 4,
        ("k", "vfs_read_[k]"): 2,
        ("cpp", "foo(int, char)"): 7,
        ("z",): 1,
    }
    # lines, as from a file
    assert parse_folded(text.splitlines(keepends=True)) == got


def test_read_folded_counts_the_lines_it_skips() -> None:
    text = (
        "Attaching 2 probes...\n"  # bpftrace's banner: not a bad line
        "# comment\n"
        "\n"
        "a;b 3\n"
        "not a stack\n"  # line 5: the first bad one
        " 9\n"  # a count without frames
        "a;c -2\n"  # a negative count
        "a;zero 0\n"  # a stack that weighs nothing: fine
        "@count: 12\n"  # a bpftrace map that is not a stack
        "@[\n"  # line 10: never closed
        "    f+1\n"
    )
    profile = read_folded(text)
    assert profile.stacks() == parse_folded(text) == {("a", "b"): 3}
    assert profile.samples == 3
    assert (profile.skipped.lines, profile.skipped.first_line) == (5, 5)
    clean = read_folded("a;b 1\n@[\n  g\n]: 2\n")
    assert (clean.skipped.lines, clean.skipped.first_line) == (0, 0)
    # the renderer takes the profile itself, as it takes the text
    assert render_svg(profile) == render_svg(text)
    assert render_speedscope({"p": profile}) == render_speedscope({"p": text})


def test_parse_folded_bpftrace_multiline() -> None:
    text = """\
Attaching 1 probe...

@[
    ExecScan+26
    ExecSeqScan+14
    PostgresMain+1200
]: 5
@[
    ExecScan+40
    ExecSeqScan+14
    PostgresMain+1200
]: 2
@[postgres,
        7f12aa01b2c3 __libc_recv+0x1a (/usr/lib/x86_64-linux-gnu/libc.so.6)
        55d0c0a0b1c2 secure_read+0x40 (/usr/lib/postgresql/16/bin/postgres)
        55d0c0a0b1c3 [unknown] (/usr/lib/postgresql/16/bin/postgres)
]: 3
"""
    assert parse_folded(text) == {
        ("PostgresMain", "ExecSeqScan", "ExecScan"): 7,
        ("postgres", "[unknown]", "secure_read", "__libc_recv"): 3,
    }


def test_parse_folded_strict() -> None:
    assert parse_folded("a;b 1\n", strict=True) == {("a", "b"): 1}
    with pytest.raises(ValueError, match="line 2"):
        parse_folded("a;b 1\nnot a stack\n", strict=True)
    with pytest.raises(ValueError, match="unterminated"):
        parse_folded("@[\n  f+1\n", strict=True)


def test_parse_folded_interns_frames() -> None:
    got = parse_folded("x;common 1\ny;common 1\n")
    a, b = (k[1] for k in got)
    assert a is b


# --------------------------------------------------------------------------------------------
# speedscope


def check_speedscope(doc: dict[str, object]) -> None:
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    shared = doc["shared"]
    assert isinstance(shared, dict)
    frames = shared["frames"]
    assert isinstance(frames, list) and all(isinstance(f["name"], str) for f in frames)
    profiles = doc["profiles"]
    assert isinstance(profiles, list) and profiles
    assert 0 <= int(doc.get("activeProfileIndex", 0)) < len(profiles)  # type: ignore[call-overload]
    for p in profiles:
        assert p["type"] == "sampled"
        assert p["unit"] in ("none", "nanoseconds", "microseconds", "milliseconds", "seconds")
        assert isinstance(p["name"], str)
        assert len(p["samples"]) == len(p["weights"])
        for stack in p["samples"]:
            assert stack and all(0 <= i < len(frames) for i in stack)
        assert p["endValue"] - p["startValue"] == pytest.approx(sum(p["weights"]))


def test_speedscope_one_profile_per_backend() -> None:
    profiles: dict[str, StacksInput] = {
        "pid 101": HAND,
        "pid 202": {("a", "b"): 4, ("q",): 6},
    }
    doc = json.loads(render_speedscope(profiles, name="capture"))
    check_speedscope(doc)
    assert doc["name"] == "capture"
    assert [p["name"] for p in doc["profiles"]] == ["pid 101", "pid 202"]
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert len(names) == len(set(names))  # one shared table, no duplicates
    p1, p2 = doc["profiles"]
    assert sum(p1["weights"]) == 15 and sum(p2["weights"]) == 10
    pairs = zip(p1["samples"], p1["weights"], strict=True)
    stacks1 = {tuple(names[i] for i in s): w for s, w in pairs}
    assert stacks1 == {("a", "b", "c"): 6, ("a", "b"): 3, ("a", "d"): 2, ("e",): 4}
    stacks2 = {tuple(names[i] for i in s) for s in p2["samples"]}
    assert stacks2 == {("a", "b"), ("q",)}


def test_speedscope_seconds_with_hz() -> None:
    doc = json.loads(render_speedscope({"all": "a;b 99\nc 198\n"}, hz=99))
    check_speedscope(doc)
    (p,) = doc["profiles"]
    assert p["unit"] == "seconds"
    assert sum(p["weights"]) == pytest.approx(3.0)


def test_tree_matches_a_naive_merge_on_awkward_names() -> None:
    """The sorted-run tree builder against a plain dict-of-dicts merge, on random stacks whose
    names sort around the separator (space, '+', ':', '<', '=') and share prefixes."""
    rng = random.Random(1234)
    alphabet = ["a", "a ", "a+", "a:", "a<", "a<b>", "a=", "ab", "b", " ", "é", "a.b"]
    stacks: dict[tuple[str, ...], int] = {}
    for _ in range(400):
        st = tuple(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        stacks[st] = stacks.get(st, 0) + rng.randint(1, 50)
    naive: dict[tuple[str, ...], int] = {}
    for st, n in stacks.items():
        naive[()] = naive.get((), 0) + n
        for i in range(1, len(st) + 1):
            naive[st[:i]] = naive.get(st[:i], 0) + n
    frames = by_path(frames_of(render_svg(stacks, minwidth=0, strip_offsets=False)))
    assert {p: f.n for p, f in frames.items()} == naive
    # siblings are laid out in name order, without gaps or overlaps; a frame's own samples
    # (stacks ending there) come first, as the whole-line sort of flamegraph.pl puts them
    for p, f in frames.items():
        kids = sorted((k for k in frames if k[:-1] == p and len(k) == len(p) + 1), key=_sortkey)
        pos = f.s + f.n - sum(frames[k].n for k in kids)
        assert pos - f.s == stacks.get(p, 0)
        for k in kids:
            assert frames[k].s == pos
            pos += frames[k].n


def _sortkey(path: tuple[str, ...]) -> str:
    return path[-1] + ";"


def test_subtitle_mapping_and_unit() -> None:
    facts = {"duration": "10 s", "Hz": 99, "pids": "4242, 4243", "lost": 0, "unresolved": "1.2%"}
    svg = render_svg(HAND, subtitle=facts, unit="µs <wall>")
    root = ET.fromstring(svg)
    texts = ["".join(t.itertext()) for t in root.iter(NS + "text")]
    assert "duration: 10 s   Hz: 99   pids: 4242, 4243   lost: 0   unresolved: 1.2%" in texts
    top = next(f for f in frames_of(svg) if f.d == 0)
    assert top.tip == "all (15 µs <wall>, 100.00%)"
