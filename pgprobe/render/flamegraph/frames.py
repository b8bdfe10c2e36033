"""Frame names: the module a frame is in (its colour and legend entry).

``strip_offset`` (one function, one frame: ``ExecScan+0x1a`` -> ``ExecScan``, while
``postgres+0x4a2f10`` and other bare addresses stay apart) lives with the stack code in
pgprobe.stacks, where findings use it too; it is re-exported here for the renderer's API.

``classify_frame`` returns one of ``MODULE_LABELS``: ``kernel`` (a ``_[k]``/``_[kernel]``
annotation, or a DTrace kernel module such as ``genunix`func``), ``libc`` (libc, ld-linux,
libpthread, libm, ...; from ``libc.so.6`func`` or ``libc.so.6+0x..``), ``lib`` (any other
library or extension, ``libfoo.so+0x1a2``, ``pg_stat_statements.so`func``, and perf's JIT
``_[j]`` frames), ``unresolved`` (``[unknown]``, bare addresses, ``postgres+0x..``) and
``postgres`` (everything else: a plain symbol name is taken to be the server's).
"""

from __future__ import annotations

import re

from pgprobe.stacks import EXE_NAMES, strip_offset
from pgprobe.stacks import OFFSET_RE as _OFFSET_RE
from pgprobe.stacks import is_address_base as _is_address_base

__all__ = ["EXE_NAMES", "MODULE_LABELS", "classify_frame", "strip_offset"]

#: Built-in module names (what ``classify_frame`` returns) and their legend labels, in
#: legend order.
MODULE_LABELS: dict[str, str] = {
    "postgres": "postgres",
    "kernel": "kernel",
    "libc": "libc / ld.so",
    "lib": "other libraries / extensions",
    "unresolved": "unresolved",
}

_ANNOT_RE = re.compile(r"_\[([a-z]+)\]$")
_LIBC_PREFIXES = (
    "libc.",
    "libc-",
    "ld-linux",
    "ld64.",
    "ld.so",
    "libpthread",
    "libm.",
    "libm-",
    "libdl",
    "librt",
    "libresolv",
    "libcrypt.",
)
_KERNEL_MODULES = frozenset({"vmlinux", "kernel", "genunix", "unix", "[kernel.kallsyms]"})


def _module_kind(module: str) -> str:
    name = module.rpartition("/")[2]
    if name in _KERNEL_MODULES:
        return "kernel"
    if name.startswith(_LIBC_PREFIXES):
        return "libc"
    if name in EXE_NAMES or name.startswith("postgres"):
        return "postgres"
    return "lib"


def classify_frame(frame: str) -> str:
    """The module a frame belongs to: one of the keys of ``MODULE_LABELS``."""
    m = _ANNOT_RE.search(frame)
    if m is not None:
        ann = m.group(1)
        if ann in ("k", "kernel"):
            return "kernel"
        if ann == "j":
            return "lib"
        frame = frame[: m.start()]
    if not frame or frame[0] == "[" or frame.startswith(("0x", "0X")):
        return "unresolved"
    module, tick, func = frame.rpartition("`")
    if tick:
        if not func or func[0] == "[" or func.startswith(("0x", "0X")):
            return "unresolved"
        return _module_kind(module)
    om = _OFFSET_RE.match(frame)
    if om is not None:
        base = om.group("base")
        if "/" in base or ".so" in base:
            return _module_kind(base)
        if _is_address_base(base, EXE_NAMES):
            return "unresolved"
    return "postgres"
