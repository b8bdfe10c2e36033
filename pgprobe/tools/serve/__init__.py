"""`pgprobe serve`: a long-running agent for one cluster, exposing Prometheus metrics and pprof."""

from pgprobe.tools.serve.command import add_parser, run

__all__ = ["add_parser", "run"]
