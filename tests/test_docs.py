"""The docs as a reader in a hurry meets them: a short README, each thing said once.

- The README is the front door: at most ~300 lines, the install within its first 60, the
  first `doctor` and `triage` within its first 100.
- Every figure the README states (a number with a unit or a %) is stated the same way in a
  page of docs/ (where it is measured or explained) or in one of its generated tables, so the
  front door cannot drift from the reference.
- No sentence or table row of prose lives in two files (README.md, CONTRIBUTING.md, docs/):
  a section copied into a second file goes stale there (the `duplicates` tool reads code, not
  Markdown, so this test is the check). Code blocks may repeat: examples are meant to.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from helpers import CHECKOUT

README = CHECKOUT / "README.md"
DOC_FILES = [README, CHECKOUT / "CONTRIBUTING.md", *sorted((CHECKOUT / "docs").rglob("*.md"))]
# A figure: an optional "~", a number, a unit. "-d 15" is an option, not a figure (no unit).
FIGURE = re.compile(r"~?\d[\d,.]*(?:–\d[\d,.]*)? ?(?:%|µs|ms/s|ms|s\b|Hz|MiB|GiB|KiB|MB|KB)")
SHORTEST_REPEAT = 90  # characters: shorter sentences ("Reference: ...") may recur


def prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_readme_is_short_with_install_doctor_and_triage_first() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, len(lines)

    def first(pattern: str) -> int:
        return next(n for n, line in enumerate(lines, 1) if re.search(pattern, line))

    assert first(r"^## Install") <= 60
    assert first(r"pgprobe doctor") <= 100
    assert first(r"pgprobe triage") <= 100


def test_every_readme_figure_is_stated_the_same_way_in_docs() -> None:
    docs = flat("\n".join(p.read_text() for p in DOC_FILES[1:]))
    figures = set(FIGURE.findall(flat(prose(README.read_text()))))
    assert figures, "no figure found: the pattern is broken"
    missing = sorted(f for f in figures if f not in docs)
    assert not missing, f"README figures that no page of docs/ states the same way: {missing}"


def sentences(text: str) -> list[str]:
    """Sentences and table rows of prose, whitespace folded; generated tables left out."""
    text = re.sub(r"<!-- (\S+):begin.*?<!-- \1:end -->", "", prose(text), flags=re.S)
    found = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith("|"):
            rows = [flat(r) for r in block.splitlines() if not re.match(r"^\|[\s|:-]+\|$", r)]
            found += rows
        else:
            found += [s for s in re.split(r"(?<=[.:;])\s+", flat(block))]
    return [s for s in found if len(s) >= SHORTEST_REPEAT]


def test_no_sentence_lives_in_two_files() -> None:
    where: dict[str, set[Path]] = defaultdict(set)
    for path in DOC_FILES:
        for sentence in sentences(path.read_text()):
            where[sentence].add(path.relative_to(CHECKOUT))
    repeated = {s: sorted(map(str, p)) for s, p in where.items() if len(p) > 1}
    assert not repeated, "said in two files (keep it in one, link from the other):\n" + "\n".join(
        f"{files}: {s[:160]}" for s, files in sorted(repeated.items())
    )


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_and_anchor_exists() -> None:
    broken = []
    for path in DOC_FILES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, frag = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}: {target}")
            elif frag and dest.suffix == ".md":
                heads = re.findall(r"^#+ (.*)$", prose(dest.read_text()), flags=re.M)
                if frag not in {anchor(h) for h in heads}:
                    broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, broken
