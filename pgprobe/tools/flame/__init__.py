"""`pgprobe flame`: a CPU flame graph of PostgreSQL backends (bpf/profile.bt).

Samples the on-CPU stacks of the targets at -F HZ for -d seconds, names the
frames in Python (pgprobe.symbolize: backends that exit during the capture
are still named, a stripped server's static functions show as
``postgres+0x<function start>``), folds them (one function is one frame) and
writes one of:

- ``svg`` (default): a self-contained interactive flame graph
  (pgprobe.render.flamegraph), to stdout or ``-o FILE``; the subtitle says
  duration, Hz, pids, samples, lost samples and the share of unresolved frames;
- ``folded``: FlameGraph folded stacks (``--folded``), for flamegraph.pl,
  inferno or speedscope;
- ``speedscope``: speedscope's JSON, one profile per backend with --per-backend;
- ``pprof``: a gzipped profile.proto (``-o cpu.pb.gz`` implies it) for
  ``go tool pprof``, Pyroscope or Parca (pgprobe.tools.pprof_export);
- ``--json``: one document ``{"tool": "flame", "meta": {...}, "rows": [...]}``,
  one row per (pid, stack): ``pid``, ``backend_type``, ``application_name``,
  ``stack`` (folded, root first, without a backend frame) and ``samples``.

``--per-backend`` roots each stack at a frame naming the backend
(``pid 4242: client backend (pgbench)``). ``--from FILE`` renders a folded file
(from pgprobe, perf + stackcollapse, or bpftrace output) without tracing, so
without root.

Modules: ``records`` (the JSON rows of a capture), ``view`` (a capture or a folded file as
SVG, folded stacks or speedscope), ``output`` (where the output goes: checked before a long
capture, written at the end), ``command`` (options, the run, and --from: reading the file
and saying what in it was not a stack). What is asked of the probe lives in
pgprobe.tools.profiling, shared with ``pgprobe hot``.
"""

from pgprobe.tools.flame.command import add_parser, run
from pgprobe.tools.flame.records import FlameRow, flame_rows, json_rows
from pgprobe.tools.flame.view import NAME, default_title, module_classifier

__all__ = [
    "NAME",
    "FlameRow",
    "add_parser",
    "default_title",
    "flame_rows",
    "json_rows",
    "module_classifier",
    "run",
]
