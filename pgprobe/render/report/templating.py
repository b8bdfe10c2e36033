"""The report's Jinja2 environment: templates and stylesheets shipped as package data.

Escaping: autoescaping is on, and every ``{{ value }}`` goes through ``esc`` (the
environment's ``finalize``): control and bidi characters written visibly as ``\\xNN`` /
``\\uNNNN`` (pgprobe.literal; tab and newline kept: query texts are several lines), so
that the saved file holds none (they are invalid in HTML, and an ESC is still an ESC when
someone cats the file), HTML-escaped, quotes too, and ``://`` written as ``&#58;//`` so
that the file holds no literal URL anywhere (the browser shows the text unchanged). Only
``Markup`` passes as it is: what a template or macro rendered (already escaped), pgprobe's
own stylesheets and the flame graph SVG pgprobe drew. Query texts, application names,
frame names and warnings are plain strings, so they are always escaped.

Templates live in ``templates/`` (the page, one file per section, ``macros.html`` for
tables and notes, ``timeline.svg``); stylesheets in ``assets/``. Both are read through
importlib.resources, so an installed wheel finds them as a checkout does.
"""

from __future__ import annotations

import functools
import html
import threading
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

from pgprobe.literal import literal_lines

__all__ = ["Markup", "asset", "esc", "render"]


def esc(value: Any) -> str:
    """Any value as HTML text: shown as text (control characters visible), HTML-escaped
    (quotes too), with '://' as '&#58;//': no literal URL survives."""
    return html.escape(literal_lines(str(value)), quote=True).replace("://", "&#58;//")


def _finalize(value: Any) -> Markup:
    return value if isinstance(value, Markup) else Markup(esc(value))


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pgprobe.render.report", "templates"),
        autoescape=True,
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


# the thread compiling every template while a capture runs (warm()), joined before a render
_warming: list[threading.Thread] = []


def warm() -> None:
    """Compile every template in the background, once: Jinja2 compiles each from source at
    its first use (70-120 ms of CPU for all, docs/benchmarks.md), which triage's window, a
    second or more of waiting, pays for instead of its end."""
    if not _warming:
        _warming.append(threading.Thread(target=_compile_all, name="templates", daemon=True))
        _warming[0].start()


def _compile_all() -> None:
    env = _environment()
    for name in env.list_templates():
        try:
            env.get_template(name)
        except Exception:  # noqa: BLE001 - compiled again by the render, which says it
            continue


def asset(name: str) -> Markup:
    """A stylesheet of assets/, read now (pgprobe's own file: trusted, not escaped)."""
    path = resources.files("pgprobe.render.report").joinpath("assets").joinpath(name)
    return Markup(path.read_text(encoding="utf-8").rstrip())


def render(template: str, **context: Any) -> str:
    """Render templates/<template> with `context`."""
    for thread in _warming:
        thread.join()
    return _environment().get_template(template).render(**context)
