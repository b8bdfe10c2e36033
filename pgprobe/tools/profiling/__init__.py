"""CPU profiles of PostgreSQL processes: what `pgprobe flame` and `pgprobe hot` share.

The package: ``options`` (-F, --kernel, --unwind), ``sampling`` (the
capture: snapshots, new backends, bpftrace or perf), ``naming`` (stack maps
to a Profile, cut stacks marked), ``result`` (Profile and its warnings). The
stack walking itself lives in pgprobe.unwind.

One pipeline, used by both commands:

1. Targets from discovery (``--pid`` and the filters, as every tool).
2. ``/proc/PID/maps`` snapshots of the postmaster (the fallback for pids that have
   none: backends are forked from it) and of every target, before the capture
   starts; in whole-cluster mode also of the postmaster's children that appear
   while the capture runs (a scan of /proc every half second or so, from the
   capture's tick), so that backends that come and go during the capture keep
   the libraries they loaded themselves.
3. ``--unwind`` (pgprobe.unwind.choose): ``fp`` runs ``bpf/profile.bt``
   (below); ``dwarf`` runs ``perf record --call-graph dwarf`` and unwinds the
   copied stacks itself (pgprobe.unwind.capture.PerfCapture), yielding the
   same maps. Otherwise:
   ``bpf/profile.bt`` (``profile:hz``) through ``common.capture()`` with
   ``BPFTRACE_NO_USER_SYMBOLS=1``: counts per (pid, [kernel stack,] user stack)
   of raw addresses, and ``@samples``, every sample taken.
4. The addresses named by ``pgprobe.symbolize.Symbolizer``, into a ``Profile``:
   one ``StackCount`` (pid, frames innermost first, samples) per distinct stack.

``Profile.folded()`` gives FlameGraph folded stacks (offsets stripped: one
function is one frame; unresolved frames keep their ``module+0xSTART`` label,
one per function start), optionally rooted at a frame naming the backend
(``backend_frame``); ``Profile.meta()`` the capture facts for ``--json``;
``Profile.facts()`` the same facts for a flame graph's subtitle.

Losses: ``lost_samples`` is ``@samples`` minus the samples the stack map holds
(over every process the script sampled, before pgprobe keeps only the
targets); a sample whose key could not be stored is both counted in
``@samples`` and reported by bpftrace as a failed map update, so the larger of
the two is the loss, never their sum. A sample can also keep its count but
lose its stack: the kernel's stack map refuses a stack whose hash bucket holds
another one (``get_stackid`` -EEXIST; bpftrace's map has no room for
replacement), and a process that is exiting has no user stack left
(-EFAULT). Those samples show as ``[unknown]`` and are counted as
``samples_without_stack``. bpftrace -k reports every failing ``get_stackid``
(with ``--kernel``, one -EFAULT per sample taken in user mode, which has no
kernel stack: not a loss) and prints "failed to look up stack id" for the
refused ones; pgprobe replaces those messages by the one count that matters.
"""

from pgprobe.tools.profiling.naming import name_stacks, plain_name
from pgprobe.tools.profiling.options import (
    DEFAULT_DURATION_S,
    DEFAULT_HZ,
    MAPS,
    MAX_HZ,
    MAX_MAP_KEYS,
    MIN_MAP_KEYS,
    SCRIPT,
    UNRESOLVED_WARN_PCT,
    add_hz_alias,
    add_profile_arguments,
    add_unwind_argument,
    hz_value,
)
from pgprobe.tools.profiling.result import (
    UNKNOWN_FRAME,
    Profile,
    StackCount,
    owning_package,
    truncation_warning,
    unresolved_warning,
)
from pgprobe.tools.profiling.sampling import (
    ChildWatcher,
    ProfileRun,
    check_server,
    choose_unwind,
    collect,
    map_keys,
    print_warnings,
    sampler,
    script_args,
    start,
)

__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_HZ",
    "MAPS",
    "MAX_HZ",
    "MAX_MAP_KEYS",
    "MIN_MAP_KEYS",
    "SCRIPT",
    "UNKNOWN_FRAME",
    "UNRESOLVED_WARN_PCT",
    "ChildWatcher",
    "Profile",
    "ProfileRun",
    "StackCount",
    "add_hz_alias",
    "add_profile_arguments",
    "add_unwind_argument",
    "check_server",
    "choose_unwind",
    "collect",
    "hz_value",
    "map_keys",
    "name_stacks",
    "owning_package",
    "plain_name",
    "print_warnings",
    "sampler",
    "script_args",
    "start",
    "truncation_warning",
    "unresolved_warning",
]
