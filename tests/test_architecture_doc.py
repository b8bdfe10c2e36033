"""docs/architecture.md names every module of the package, and only modules that exist.

The page is where a newcomer looks for "which file does X"; a module added without a line
there, or a line left behind by a module that moved, makes it lie. Templates are covered by
the page's ``templates/*.html``; ``__init__.py`` files by their package's line.
"""

from __future__ import annotations

import re

from helpers import CHECKOUT

PACKAGE = CHECKOUT / "pgprobe"
PAGE = CHECKOUT / "docs" / "architecture.md"


def modules() -> list[str]:
    """Every .py, .js and .css file of the package, relative to pgprobe/."""
    return [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*"))
        if path.suffix in (".py", ".js", ".css")
        and path.name != "__init__.py"
        and "__pycache__" not in path.parts
    ]


def test_every_module_is_named_on_the_page() -> None:
    page = PAGE.read_text()

    def named(module: str) -> bool:
        name = module.rsplit("/", 1)[-1]
        return name in page or f"`{name.rsplit('.', 1)[0]}`" in page  # "areas: `locks`, ..."

    missing = [m for m in modules() if not named(m)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_every_module_the_page_names_exists() -> None:
    # The page also names test files (the walkthrough's tests/test_buffers.py is an example).
    names = {m.rsplit("/", 1)[-1] for m in modules()}
    names |= {p.name for p in (CHECKOUT / "tests").glob("*.py")} | {"test_buffers.py"}
    named = set(re.findall(r"`(?:[\w/]+/)?(\w+\.(?:py|js|css))`", PAGE.read_text()))
    gone = sorted(n for n in named - names if n != "__init__.py")
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"
