"""`pgprobe serve`: a long-running agent for one cluster, exposing Prometheus metrics and pprof.

The tool shape of issue 12, for a tool that never ends:

- ``probe.py``: the sources (the other tools' probe scripts run in rolling windows);
- ``records.py``: the running totals the windows add up to (pure, bounded);
- ``metrics.py``: how they are shown: Prometheus metric families (its "view");
- ``timemodel.py``: one window of waits.bt as pgprobe waits' rows, per process, named;
- ``agent.py``: the supervision (threads, restarts, the server going away);
- ``http.py``: the endpoints, on ``httpd.py``'s bounded server (``webconfig.py``: TLS and
  basic auth); ``fold.py``: unknown wait event codes folded into bounded labels;
- ``command.py``: the CLI glue.
"""

from pgprobe.tools.serve.command import add_parser, run

__all__ = ["add_parser", "run"]
