"""Run one bpftrace script bare, as a child of this process, for a bench row of its own
(the kind "bpftrace" in bench/configs.py).

The bench finds a tool's tracer among the children of what it started, and ends a
window with SIGINT to that process: here it is passed on to bpftrace, whose exit
status is this one's. With a postmaster's pid, the script gets $1 = that pid and
$2 = the address of my_wait_event_info in it (as bpf/waits.bt does).

USAGE: python -m bench.bare SCRIPT [POSTMASTER_PID]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from pgprobe.tools.waits import probe
from pgprobe.waitevents import address


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m bench.bare SCRIPT [POSTMASTER_PID]", file=sys.stderr)
        return 2
    params: list[str] = []
    if len(argv) == 2:
        pm = int(argv[1])
        where = address.find(pm, os.readlink(f"/proc/{pm}/exe"))
        params = [str(pm), str(where.address)]
    env = {**os.environ, **probe.ENV}  # waits.bt's map size: @task has a key per task
    child = subprocess.Popen(["bpftrace", argv[0], *params], stdin=subprocess.DEVNULL, env=env)
    signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
