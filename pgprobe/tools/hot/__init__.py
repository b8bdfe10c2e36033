"""`pgprobe hot`: the functions the targets spend their CPU in (hotuser, for PostgreSQL).

The same capture as `pgprobe flame` (bpf/profile.bt through
pgprobe.tools.profiling), turned into a table of functions: by self samples
(the function was on CPU itself: the innermost frame) and by total samples
(the function was anywhere in the stack: it or its callees were on CPU).
A function that appears several times in one stack (recursion) counts once
for that sample, so total_pct never exceeds 100. ``--lib`` groups by module
(the server binary, each library, the kernel with --kernel).

JSON rows (``--json``; keys are stable), sorted like the table (``--sort``):

  function        the function (rows by function only); unresolved frames of a
                  stripped file are ``module+0x<function start>``
                  (``postgres+0x2f70b0``), stacks the kernel could not walk
                  ``[unknown]``; kernel functions without FlameGraph's ``_[k]``
  module          basename of the file the function is in (``postgres``,
                  ``libc.so.6``, ``plpgsql.so``), ``[kernel.kallsyms]``,
                  ``[jit]`` (generated code), ``[truncated]`` (the
                  ``[truncated: why]`` frame of a cut stack), ``[unknown]``
  self_samples    samples in which this function was the innermost frame
  self_pct        self_samples x 100 / all samples of the targets
  total_samples   samples in which the function was anywhere in the stack
  total_pct       total_samples x 100 / all samples of the targets

``meta`` holds the capture facts of every tool plus ``hz``, ``samples``,
``samples_taken``, ``lost_samples``, ``sampled_pids``,
``unresolved_frames_pct``, ``server_unresolved_frames_pct`` and
``server_symbols`` (see pgprobe.tools.profiling).

Caveat of frame-pointer stacks (``--unwind fp``): a leaf function that sets up
no frame (such as ``hash_bytes`` or libc's ``memcpy`` on Debian's build) hides
its caller, whose samples then go to the caller's caller; ``--unwind dwarf``
shows it.

Modules: ``records`` (self and total samples per function or module: the rows),
``view`` (the table), ``command`` (options and the run). What is asked of the probe lives in
pgprobe.tools.profiling, shared with ``pgprobe flame``.
"""

from pgprobe.tools.hot.command import add_parser, run
from pgprobe.tools.hot.records import NAME, HotRow, hot_rows

__all__ = ["NAME", "HotRow", "add_parser", "hot_rows", "run"]
