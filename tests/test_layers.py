"""pgprobe's import graph: no cycles, and imports point one way through the layers.

The graph is read from the source with ast (nothing is imported, so no import side effects):
every ``import pgprobe...`` and ``from pgprobe... import x`` anywhere in a module, inside
functions and ``if TYPE_CHECKING:`` blocks too, is an edge to the module it names
(``from a import b`` names ``a.b`` when that is a module, else ``a``).

Layers, lowest first (a module may import its own layer and the layers below it):

    base      shared helpers that know nothing of the layers above (errors, /proc, stacks
              and frame names, symbolization, literal: names shown as text)
    probes    what finds and describes the probe scripts (bpf/, d/) and a binary's probes
    engines   run a tracer and parse its output into records
    tools     what to measure and what comes back: tools/<tool>/probe.py and records.py,
              discovery of targets, the SQL cross-checks (pgstats)
    findings  the rules over a triage document
    render    tables, flame graphs, the HTML report, tools/<tool>/view.py
    cli       the command line: cli.py, tools/<tool>/command.py, test and benchmark helpers
              (sandbox)

and, besides the order, renderers and findings know nothing of probes or engines. A
package's ``__init__`` may re-export its own modules whatever their layer (a tool package
re-exports its command for cli.py and its records for other tools; it is in the "tools"
layer, and its code lives in the modules, which are checked).

A tool draws on the terminal only in its view.py: views are in the "render" layer, so they
may use render.table (and their tool's records and tools.common), never the engines; every
other module of a tool package (probe, records, doctor's checks by area, ...) is in the
"tools" layer, so an import of render.table or findings there fails. KNOWN_EXCEPTIONS is
empty since issue 12 split the last single-file tool (triage); an exception listed there
that no longer occurs fails the test too, so that the list only shrinks.
"""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

from helpers import CHECKOUT

PACKAGE = CHECKOUT / "pgprobe"

LAYERS = ("base", "probes", "engines", "tools", "findings", "render", "cli")

# Module name patterns -> layer; the first match wins (fnmatch: "*" also matches dots).
MODULE_LAYERS: tuple[tuple[str, str], ...] = (
    ("pgprobe", "base"),
    ("pgprobe.errors", "base"),
    ("pgprobe.proc", "base"),
    ("pgprobe.timings", "base"),  # PGPROBE_TIMINGS phase marks, for every layer
    ("pgprobe.priority", "base"),  # PGPROBE_TRACER_NICE, for the tracers and pgprobe itself
    ("pgprobe.stacks", "base"),
    ("pgprobe.outfile", "base"),  # result files written whole (temp file, rename), for every layer
    ("pgprobe.safefile", "base"),  # files others can write, read as data with limits
    ("pgprobe.serverbinary", "base"),  # is a file a PostgreSQL server, which version: as data
    ("pgprobe.symbolize", "base"),
    ("pgprobe.symbolize.*", "base"),
    ("pgprobe.pgversions", "base"),
    ("pgprobe.literal", "base"),  # names shown as text: every layer prints with it
    ("pgprobe.scripts", "probes"),
    ("pgprobe.usdt", "probes"),
    ("pgprobe.kernelbtf", "probes"),  # task_struct offsets for waits.bt, from the kernel's BTF
    ("pgprobe.waitevents", "probes"),
    ("pgprobe.waitevents.*", "probes"),
    ("pgprobe.engines", "engines"),
    ("pgprobe.engines.*", "engines"),
    ("pgprobe.histogram", "engines"),  # percentiles of the engines' Log2Hist
    ("pgprobe.unwind", "engines"),
    ("pgprobe.unwind.*", "engines"),
    ("pgprobe.discover", "tools"),
    ("pgprobe.connection", "tools"),
    ("pgprobe.localserver", "tools"),
    ("pgprobe.pgstats", "tools"),
    ("pgprobe.pgstats.*", "tools"),
    ("pgprobe.pgbuilds", "tools"),
    ("pgprobe.tools", "tools"),
    ("pgprobe.tools.*.view", "render"),
    ("pgprobe.tools.*.command", "cli"),
    ("pgprobe.tools.pprof_export", "render"),  # tool results as pprof files, for several tools
    ("pgprobe.tools.serve.metrics", "render"),  # serve's "view": Prometheus metric families
    ("pgprobe.tools.serve.agent", "cli"),  # serve's run: supervision of a never-ending capture
    ("pgprobe.tools.serve.http", "cli"),  # serve's endpoints
    ("pgprobe.tools.*.probe", "tools"),
    ("pgprobe.tools.*.records", "tools"),
    ("pgprobe.tools.common", "tools"),
    ("pgprobe.tools.profiling", "tools"),
    ("pgprobe.tools.*", "tools"),  # tool packages, their other modules, single-file tools
    ("pgprobe.findings", "findings"),
    ("pgprobe.findings.*", "findings"),
    ("pgprobe.render", "render"),
    ("pgprobe.render.*", "render"),
    ("pgprobe.cli", "cli"),
    ("pgprobe.__main__", "cli"),
    ("pgprobe.launch", "cli"),
    ("pgprobe.helptext", "cli"),  # the examples and "start here" that end each --help
    ("pgprobe.sandbox", "cli"),
)

# (importer layer, imported layer) pairs refused whatever the order says.
NEVER = {
    ("render", "probes"),  # renderers know nothing of probes
    ("render", "engines"),
    ("findings", "probes"),  # findings read a triage document, not tracer output
    ("findings", "engines"),
}

# Imports against the layers that exist today, each to go when its module is split.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__.py)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(CHECKOUT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.split(".")[0] == "pgprobe")
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(name, is_package, node)
                if target.split(".")[0] != "pgprobe":
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if sub in mods else target)
        edges.discard(name)
        graph[name] = edges
    return graph


def layer_of(module: str) -> str | None:
    return next((layer for pattern, layer in MODULE_LAYERS if fnmatchcase(module, pattern)), None)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    out = set()
    for src, targets in graph.items():
        src_layer = layer_of(src)
        for dst in targets:
            if src in packages and dst.startswith(src + "."):
                continue  # a package re-exporting its own modules
            dst_layer = layer_of(dst)
            assert src_layer and dst_layer, (src, dst)
            upward = LAYERS.index(dst_layer) > LAYERS.index(src_layer)
            if upward or (src_layer, dst_layer) in NEVER:
                out.add((src, dst))
    return out


def test_every_module_has_a_layer() -> None:
    missing = [m for m in modules() if layer_of(m) is None]
    assert not missing, f"add these modules to MODULE_LAYERS in {__file__}: {missing}"


def test_every_import_names_a_module_of_the_package() -> None:
    mods = modules()
    unknown = {(s, d) for s, ds in import_graph().items() for d in ds if d not in mods}
    assert not unknown, f"imports of modules that do not exist: {sorted(unknown)}"


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "modules importing each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_follow_the_layers() -> None:
    found = violations(import_graph())
    new = sorted(found - KNOWN_EXCEPTIONS)
    assert not new, "imports against the layers (see this file's docstring): " + ", ".join(
        f"{s} -> {d}" for s, d in new
    )


def test_known_exceptions_still_exist() -> None:
    """A fixed exception is removed from the list, so that the list only shrinks."""
    gone = sorted(KNOWN_EXCEPTIONS - violations(import_graph()))
    assert not gone, f"no longer violations, remove them from KNOWN_EXCEPTIONS: {gone}"


def test_the_checker_sees_cycles_and_violations() -> None:
    """The checks themselves, on a made-up graph."""
    graph = {
        "pgprobe.findings.a": {"pgprobe.render.x"},  # upward
        "pgprobe.render.x": {"pgprobe.findings.a", "pgprobe.engines.base"},  # cycle; NEVER
        "pgprobe.engines.base": set(),
    }
    assert cycles(graph) == [["pgprobe.findings.a", "pgprobe.render.x"]]
    assert violations(graph) == {
        ("pgprobe.findings.a", "pgprobe.render.x"),
        ("pgprobe.render.x", "pgprobe.engines.base"),
    }
