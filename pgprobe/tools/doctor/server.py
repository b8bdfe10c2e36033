"""`pgprobe doctor`'s checks of the server: the connection, the binary, the version.

The binary's USDT probes, other tools' uprobes on their sites, frame pointers and
symbols; the PostgreSQL version; the wait event address that `pgprobe waits` reads.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

from pgprobe import discover, localserver, proc, safefile, usdt
from pgprobe.errors import PgprobeError
from pgprobe.tools.doctor.records import Check
from pgprobe.unwind import fpcheck
from pgprobe.waitevents import address, backend_state


def find_cluster(opts: discover.ConnOptions) -> tuple[discover.Cluster | None, Check]:
    try:
        conn = discover.connect(opts)
    except PgprobeError as exc:
        return None, Check(
            "connection", "fail", exc.message,
            "give -h/-p/-U as for psql; tools still run with --pid without a connection",
        )  # fmt: skip
    with conn:
        privileged = _can_read_all_stats(conn)
        try:
            cluster = discover.from_connection(conn)
        except PgprobeError as exc:
            return None, Check("connection", "fail", exc.message)
    detail = f"connected; postmaster {cluster.postmaster_pid}, {cluster.data_directory}"
    if privileged:
        return cluster, Check("connection", "ok", detail + "; may read every backend's query")
    return cluster, Check(
        "connection", "warn", detail + "; other users' query text is hidden",
        "connect as a superuser or a member of pg_read_all_stats",
    )  # fmt: skip


def _can_read_all_stats(conn: Any) -> bool:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')"
            " FROM pg_roles WHERE rolname = current_user"
        )
        row = cur.fetchone()
    return bool(row and row[0])


def default_binary() -> str | None:
    """Without a connection: a running postmaster's binary (proved one: a process merely
    named postgres is not), else the newest installed."""
    for pid in localserver.running_postmasters():
        info = proc.read_info(pid)
        if info is not None and info.exe:
            return info.exe.removesuffix(" (deleted)")
    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return installed[-1] if installed else None


def check_binary(binary: str | None) -> list[Check]:
    if binary is None or not Path(binary).exists():
        return [Check("server binary", "fail", "no PostgreSQL server binary found",
                      "start the server, or connect with -h/-p/-U")]  # fmt: skip
    checks = [Check("server binary", "ok", binary)]
    names = usdt.probe_names(binary)
    if (usdt.PROVIDER, "lwlock__wait__start") in names:
        checks.append(Check("usdt probes", "ok", f"{len(names)} USDT probes (--enable-dtrace)"))
    else:
        checks.append(
            Check("usdt probes", "warn", "built without --enable-dtrace (no lwlock__wait__start)",
                  "install a build with probes (Debian, Ubuntu and PGDG packages have them)")
        )  # fmt: skip
    checks.append(_foreign_uprobes_check(binary, names))
    checks.append(_frame_pointer_check(binary))
    checks.append(_symbols_check(binary))
    return checks


def _foreign_uprobes_check(binary: str, names: frozenset[tuple[str, str]]) -> Check:
    """Uprobes of other tools on the server's USDT sites (uprobe_events): they block ours."""
    ours = tuple(sorted(name for provider, name in names if provider == usdt.PROVIDER))
    found = usdt.foreign_uprobes(binary, ours)
    if not found:
        return Check("other uprobes", "ok", "none on the server's USDT probe sites")
    fixes = sorted({f.describe().rpartition("remove it: ")[2] for f in found})
    return Check(
        "other uprobes",
        "warn",
        f"{len(found)} other uprobes on the server's USDT sites: "
        + "; ".join(f"{f.event} on {f.site.name} at 0x{f.site.offset:x}" for f in found)
        + " (while in use, the kernel refuses pgprobe's probes there: events are missed)",
        "; ".join(fixes),
    )


def _frame_pointer_check(binary: str) -> Check:
    share = frame_pointer_share(binary)
    if share is None:
        return Check("frame pointers", "warn", "could not inspect the binary")
    pct = f"{100 * share:.0f} % of exported functions start with push %rbp; mov %rsp,%rbp"
    if share >= fpcheck.HAS_FRAME_POINTERS:
        return Check("frame pointers", "ok", f"likely ({pct})")
    return Check(
        "frame pointers", "warn", f"probably omitted ({pct}): CPU stacks will be short",
        "a build with -fno-omit-frame-pointer gives whole stacks in flame graphs",
    )  # fmt: skip


def frame_pointer_share(binary: str) -> float | None:
    """Share of exported x86-64 functions whose prologue saves the frame pointer."""
    return fpcheck.frame_pointer_share(binary)


def _symbols_check(binary: str) -> Check:
    from pgprobe.symbolize import ElfImage

    try:
        with safefile.open_regular(binary, follow=True) as f:
            kind = ElfImage(f, binary, "/usr/lib/debug").symbols
    except OSError as exc:
        return Check("symbols", "warn", f"cannot read {binary}: {exc}")
    if kind == "symtab" or kind.startswith("debug file"):
        return Check("symbols", "ok", f"full symbols ({kind})")
    return Check(
        "symbols", "warn",
        "stripped (only .dynsym): static functions show as postgres+0x... in flame graphs",
        "install the server's debug symbols (e.g. postgresql-15-dbgsym from debian-debug)",
    )  # fmt: skip


def check_version(cluster: discover.Cluster | None, binary: str | None) -> Check:
    if cluster is not None:
        num, version = cluster.version_num, cluster.version
    elif binary is not None:
        try:
            num, version = discover.binary_version(binary)
        except PgprobeError as exc:
            return Check("postgresql version", "warn", exc.message)
    else:
        return Check("postgresql version", "fail", "no server found")
    if num and num < 130000:
        return Check("postgresql version", "fail", f"{version}: lwlocks needs 13 or later",
                     "upgrade; clog-reads and flame work on older servers")  # fmt: skip
    return Check("postgresql version", "ok", version)


def check_wait_event_address(cluster: discover.Cluster | None) -> Check:
    """What pgprobe waits reads: *my_wait_event_info, here from the postmaster's memory."""
    name = "wait event address"
    if cluster is None:
        return Check(name, "warn", "no running server to read it from")
    if cluster.version_num and cluster.version_num < address.MIN_MAJOR * 10000:
        return Check(name, "fail", f"{cluster.version}: waits needs {address.MIN_MAJOR} or later "
                     f"(no {address.SYMBOL})")  # fmt: skip
    pm = cluster.postmaster_pid
    try:
        where = address.find(pm, cluster.binary)
        pointer, value = address.read_current(pm, where)
    except PgprobeError as exc:
        return Check(name, "fail", exc.message)
    except OSError as exc:
        return Check(name, "fail", f"cannot read /proc/{pm}/mem: {exc.strerror}", "run as root")
    return Check(name, "ok", f"{address.SYMBOL} found at 0x{where.address:x}, "
                 f"read 0x{pointer:x} -> 0x{value:08x} (postmaster {pm})")  # fmt: skip


def check_backend_state_address(cluster: discover.Cluster | None) -> Check:
    """What pgprobe waits reads at a ClientRead switch-out: MyBEEntry->st_state (idle, or
    idle in transaction), here from a client backend's memory when there is one."""
    name = "backend state address"
    if cluster is None:
        return Check(name, "warn", "no running server to read it from")
    pm = cluster.postmaster_pid
    try:
        where = address.find(pm, cluster.binary)
    except PgprobeError as exc:
        return Check(name, "fail", exc.message)
    state_at = backend_state.find(where, cluster.major)
    if state_at is None:
        why = backend_state.why_unknown(where, cluster.major)
        return Check(name, "warn", why, "waits counts Client:ClientRead as 'unknown' state")
    found = (
        f"{backend_state.SYMBOL} found at 0x{state_at.address:x}, st_state at +{state_at.offset}"
    )
    clients = [b.pid for b in cluster.backends
               if b.backend_type == "client backend" and b.pid != cluster.own_pid]  # fmt: skip
    for pid in clients:
        try:
            entry, raw = backend_state.read_raw(pid, state_at)
        except OSError:
            continue  # gone since discovery: try the next one
        names = backend_state.STATE_NAMES.get(cluster.major, ())
        state = names[raw] if entry and raw < len(names) else backend_state.UNKNOWN
        return Check(name, "ok", f"{found}; read '{state}' in backend {pid}")
    return Check(name, "ok", f"{found} (no other client backend to read it in)")
