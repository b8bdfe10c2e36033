#!/usr/sbin/dtrace -qs
/*
 * profile.d - sample the on-CPU stacks of PostgreSQL processes (DTrace
 *             "hotuser"; the twin of bpf/profile.bt).
 *
 * Samples every CPU HZ times a second (profile provider) and, when the
 * interrupted thread belongs to one of the target PostgreSQL processes, counts
 * its user stack (and, when asked, its kernel stack) in the kernel, per pid
 * and stack. DTrace names the frames itself when it prints them
 * (module`function+0xoffset, from the live process): a backend that exited
 * before the end of the capture keeps hex-only frames (0x...), which pgprobe
 * reports as unresolved. Only unique stacks and their counts are printed.
 *
 * USAGE: dtrace -qs profile.d HZ [POSTMASTER_PID] [ONLY_PID] [KSTACKS] [INTERVAL_S]
 *   The positional parameters of bpf/profile.bt, all used, as macros:
 *   HZ              $1: samples per second per CPU (997 or 99 are customary;
 *                   an odd rate avoids lock-step with timers). Required: it
 *                   is part of the probe name (profile-$1), and profile-0
 *                   does not exist.
 *   POSTMASTER_PID  $2: sample only that cluster: the postmaster and its
 *                   children (0 or omitted: every process whose execname is
 *                   "postgres")
 *   ONLY_PID        $3: sample only this pid (0: all)
 *   KSTACKS         $4: 1 also records kernel stacks (map @kstacks instead of
 *                   @stacks)
 *   INTERVAL_S      $5: print and truncate the aggregations every N seconds
 *                   (0: only at exit)
 *   Omitted parameters are 0 (#pragma D option defaultargs).
 *   Ctrl-C (SIGINT) ends the capture: the END clause prints the aggregations.
 *
 * REQUIREMENTS: DTrace with the profile provider (illumos, Solaris, FreeBSD,
 *   macOS, Linux); root (illumos/Solaris: dtrace_proc + dtrace_user, and
 *   dtrace_kernel for KSTACKS). User stacks are walked by frame pointer:
 *   build PostgreSQL with -fno-omit-frame-pointer, or stacks are cut short.
 *   On macOS, SIP must allow DTrace (csrutil enable --without dtrace).
 *
 * COLUMNS (counts of samples):
 *   @stacks[pid, ustack()]            KSTACKS = 0
 *   @kstacks[pid, stack(), ustack()]  KSTACKS = 1; the kernel stack is empty
 *                                     for samples taken in user mode
 *   @samples                          every sample taken of a target, to
 *                                     check the sum of the stacks against
 *   Stacks are innermost frame first, at most 127 user frames
 *   (ustackframes) and DTrace's default for kernel frames.
 *
 * OUTPUT (the layout pgprobe's DTrace engine parses, tab-separated):
 *   @@attached <TAB> profile.d <TAB> HZ           BEGIN: all probes enabled
 *   @@snapshot <TAB> 2026 Nov 21 23:44:19         before each set of maps
 *   @samples <TAB> COUNT
 *   @stacks <TAB> PID <TAB> COUNT, then the ustack() frames, one a line,
 *           indented (at column 0 in DTrace for Linux), as DTrace prints
 *           stacks (postgres`ExecScan+0x8c)
 *   @kstacks <TAB> PID <TAB> COUNT, then the stack() frames, a line "--",
 *           then the ustack() frames
 *   @@end                                         END printed everything
 *
 * OVERHEAD: one profile interrupt per CPU per 1/HZ s, whatever the CPU runs;
 *   a predicate test, and for targets a stack walk and an aggregation update.
 *   At 99 Hz well under 1 % of a CPU; at 997 Hz about ten times that.
 *
 * EXAMPLE:
 *   # dtrace -qs d/profile.d 997 $(head -1 $PGDATA/postmaster.pid)
 *   @@attached	profile.d	997
 *   ^C
 *   @@snapshot	2026 Nov 21 23:58:40
 *   @samples	4812
 *   @stacks	13123	19
 *                 postgres`hash_bytes_extended+0x3a
 *                 [...]
 *   (a real run, DTrace for Linux 2.0.7: samples/profile_d_example.txt)
 *
 * Part of pgprobe (pgprobe profile --engine dtrace runs this script).
 */

#pragma D option quiet
#pragma D option defaultargs
#pragma D option switchrate=10hz
#pragma D option ustackframes=127
/*
 * Room for the unique stacks: one entry is about 1 KB (127 frames). At 997 Hz
 * on 2 CPUs a busy backend gives ~2,000 samples a second, mostly distinct
 * stacks on a stripped server (one per sampled instruction of a static
 * function); DTrace for Linux's default dropped 2,973 of 3,276 samples in
 * 10 s. 64 MB holds about a minute of that; drops are reported.
 */
#pragma D option aggsize=64m

dtrace:::BEGIN
{
	pr_ticks = 0;	/* seconds since the last interval print */
	printf("@@attached\tprofile.d\t%d\n", $1);
}

profile-$1
/(($2 == 0 && execname == "postgres") || ($2 != 0 && (pid == $2 || ppid == $2))) &&
 ($3 == 0 || pid == $3) && $4 == 0/
{
	@samples = count();
	@stacks[pid, ustack()] = count();
}

profile-$1
/(($2 == 0 && execname == "postgres") || ($2 != 0 && (pid == $2 || ppid == $2))) &&
 ($3 == 0 || pid == $3) && $4 != 0/
{
	@samples = count();
	@kstacks[pid, stack(), ustack()] = count();
}

tick-1sec
/$5 > 0/
{
	pr_ticks++;
}

tick-1sec
/$5 > 0 && pr_ticks >= $5/
{
	pr_ticks = 0;
	printf("@@snapshot\t%Y\n", walltimestamp);
	printa("@samples\t%@d\n", @samples);
	printa("@stacks\t%d\t%@d%k\n", @stacks);
	printa("@kstacks\t%d\t%@d%k\n--%k\n", @kstacks);
	trunc(@samples);
	trunc(@stacks);
	trunc(@kstacks);
}

dtrace:::END
{
	printf("@@snapshot\t%Y\n", walltimestamp);
	printa("@samples\t%@d\n", @samples);
	printa("@stacks\t%d\t%@d%k\n", @stacks);
	printa("@kstacks\t%d\t%@d%k\n--%k\n", @kstacks);
	printf("@@end\n");
}
