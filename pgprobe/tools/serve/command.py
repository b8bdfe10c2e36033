"""`pgprobe serve`: CLI glue. Options, listen, run the agent until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector

from pgprobe import engines
from pgprobe.engines import compiled as objects
from pgprobe.engines import runner
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import common, profiling
from pgprobe.tools.clog_reads import compiled as slru_compiled
from pgprobe.tools.profiling import compiled as profile_compiled
from pgprobe.tools.serve import http, webconfig
from pgprobe.tools.serve.agent import Agent, say
from pgprobe.tools.serve.metrics import TotalsCollector
from pgprobe.tools.waits import compiled as waits_compiled

NAME = "serve"
DEFAULT_LISTEN = "127.0.0.1:9433"  # beside postgres_exporter's 9187; free in Prometheus' list
DEFAULT_WINDOW_S = 10
DEFAULT_HZ = 19  # low: about 2 % of the samples flame takes by default
MAX_WINDOW_S = 3600
# The time model runs this fraction of each window (a part at a random moment in it): its
# cost is per context switch, about 2 % of a 2-CPU machine under pgbench -c 8 when it runs
# all the time (docs/benchmarks.md), so an agent that never stops runs it a fifth of the time.
DEFAULT_WAITS_DUTY = 0.2
MAX_STATEMENTS = 500  # --statements: series per statement (x parts) stay bounded
# For the tracers (children inherit it): glibc gives freed heap back at once and keeps one
# malloc arena. bpftrace frees most of what compiling the script took (LLVM, BTF) but
# glibc kept it: 6-9 MiB less anonymous memory per tracer (docs/benchmarks.md, soak).
TRACER_MALLOC = "glibc.malloc.trim_threshold=0:glibc.malloc.arena_max=1"


def listen_value(text: str) -> tuple[str, int]:
    """ADDR:PORT as Prometheus exporters read it: [::1]:9433 (an IPv6 address in
    brackets), :9433 or [::]:9433 (every address, IPv4 and IPv6), a name or an IPv4
    address. The host "" stands for every address."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"not ADDR:PORT: {text!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not ADDR:PORT: {text!r} (not an IPv6 address in the brackets)"
            ) from None
        return host[1:-1], int(port)
    if not host or host.replace(".", "").replace("-", "").isalnum():
        return host, int(port)
    hint = " (an IPv6 address goes in brackets: [::1]:9433)" if ":" in host else ""
    raise argparse.ArgumentTypeError(f"not ADDR:PORT: {text!r}{hint}")


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host or '[::]'}:{port}"


def served(host: str, port: int, web: webconfig.WebConfig | None) -> str:
    """The URL served, and how it is protected (the bound host: "" is "::" or "0.0.0.0")."""
    scheme = "https" if web is not None and web.tls is not None else "http"
    out = f"{scheme}://{address(host, port)}/metrics"
    if web is not None and web.users is not None:
        return f"{out} (basic auth)"
    if web is None and not ipaddress.ip_address(host.split("%")[0]).is_loopback:
        out += " (to every host that can reach it: see --web-config)"
    return out


window_value = common.bounded(int, 1, MAX_WINDOW_S, unit="seconds")
duty_value = common.bounded(float, 0.05, 1.0)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="agent: Prometheus /metrics and a pprof CPU profile of one cluster, continuously",
        description="Keep low-cost captures running on one cluster in rolling windows (the time "
        "model of pgprobe waits, LWLock waits, SLRU reads, CPU samples) and serve them: "
        "/metrics for Prometheus, "
        f"{http.PROFILE_PATH} (pprof) for Parca or Pyroscope. Stops on SIGTERM.",
    )
    common.add_connection_arguments(parser)
    parser.add_argument(
        "--listen",
        type=listen_value,
        default=listen_value(DEFAULT_LISTEN),
        metavar="ADDR:PORT",
        help=f"where to serve HTTP (default {DEFAULT_LISTEN}: this host only); [::1]:9433 for "
        "IPv6; :9433 or [::]:9433 every address, IPv4 and IPv6, as exporters mean it. Nothing "
        "but --web-config protects it: see it, or put a reverse proxy in front",
    )
    parser.add_argument(
        "--web-config",
        metavar="FILE",
        help="TLS and basic auth: a Prometheus exporter-toolkit web config (tls_server_config: "
        "cert_file, key_file, client_ca_file, client_auth_type; basic_auth_users: bcrypt "
        "hashes), read once at start; a bad file is refused in one line",
    )
    parser.add_argument(
        "--window",
        type=window_value,
        default=DEFAULT_WINDOW_S,
        metavar="SECONDS",
        help=f"length of a capture window (default {DEFAULT_WINDOW_S})",
    )
    parser.add_argument(
        "-F",
        "--frequency",
        dest="hz",
        type=profiling.hz_value,
        default=DEFAULT_HZ,
        metavar="HZ",
        help=f"CPU samples per second per CPU (default {DEFAULT_HZ})",
    )
    profiling.add_hz_alias(parser)
    parser.add_argument(
        "--waits-duty",
        type=duty_value,
        default=DEFAULT_WAITS_DUTY,
        metavar="FRACTION",
        help="the share of each window the time model runs, at a random moment in it (default "
        f"{DEFAULT_WAITS_DUTY}; 1: all the time, exact totals). Its counters hold the seconds "
        "it saw; pgprobe_capture_observed_seconds_total says how long it looked",
    )
    parser.add_argument(
        "--lwlock-source",
        choices=["sched", "usdt"],
        default="sched",
        help="where the LWLock metrics come from: sched (default) the time model's LWLock "
        "sleeps and the runqueue time after each, at no cost of their own (mode unknown); "
        "usdt the server's "
        "USDT probes, exact waits with their mode, at a cost per wait (--enable-dtrace "
        "builds; see docs/serve.md)",
    )
    parser.add_argument(
        "--statements",
        type=common.bounded(int, 0, MAX_STATEMENTS),
        default=0,
        metavar="N",
        help="also the DB time of the N statements with the most (series per query id and "
        f"part; 0, the default: none; at most {MAX_STATEMENTS}): the time model keyed by "
        "statement, at its cost (docs/queries.md); PostgreSQL 14+, the compiled time model",
    )
    parser.add_argument(
        "--engine", choices=["auto", "bpftrace"], default="auto", help="tracer (bpftrace only)"
    )
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    ns.duration = None  # captures run until stopped
    # an option's value, so before the checks of the machine (as argparse's errors are)
    web = webconfig.load(ns.web_config) if ns.web_config else None
    # root, and bpftrace where a part has no object to run: said in one line before anything
    parts = (waits_compiled.OBJECT, profile_compiled.OBJECT, slru_compiled.OBJECT)
    engines.preflight(ns.engine, objects.tracer_needed(ns, parts))
    os.environ.setdefault("GLIBC_TUNABLES", TRACER_MALLOC)  # read by new processes only
    agent = Agent(ns)
    agent.totals.names.say = say  # the first wait event folded into "other" is said
    registry = CollectorRegistry(auto_describe=True)

    def totals() -> tuple[Any, dict[str, Any]]:
        # Under the agent's lock (the collector holds it): a copy would cost more.
        return agent.totals, {"server_up": agent.server_up, "window": agent.window}

    registry.register(TotalsCollector(totals, agent.lock))
    # process_resident_memory_bytes, process_cpu_seconds_total ...: the agent's own cost.
    ProcessCollector(registry=registry)
    host, port = ns.listen
    try:
        server = http.make_server(host, port, registry, agent.pprof_bytes, web)
    except OSError as exc:
        message = f"cannot listen on {address(host, port)}: {exc.strerror or exc}"
        raise PgprobeError(message, EXIT_USAGE) from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: agent.stop())
    http.serve_in_background(server)
    say(f"serving {served(server.server_address[0], server.server_address[1], web)}")
    try:
        agent.run()
    finally:
        server.shutdown()
        server.server_close()
        # Every tracer gone when the agent is (a tracer may still be detaching its probes).
        runner.wait_for_finishing_tracers()
    say("stopped")
    return 0
