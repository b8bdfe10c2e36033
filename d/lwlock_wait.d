#!/usr/sbin/dtrace -qs
/*
 * lwlock_wait.d - LWLock wait time per tranche and mode in PostgreSQL 11+
 *                 (DTrace; the twin of bpf/lwlock_wait.bt).
 *
 * Times every LWLock wait (postgresql provider, lwlock-wait-start ->
 * lwlock-wait-done, per thread) and aggregates in the kernel, per tranche and
 * mode (and per pid when asked): count and total, max, and a power-of-two
 * histogram (quantize) of the wait in ns. Tranche names are PostgreSQL's own,
 * the same as pg_stat_activity.wait_event for wait_event_type = 'LWLock'
 * (WALWrite, LockManager, BufferContent, ...). Same maps, keys and units as
 * bpf/lwlock_wait.bt, so pgprobe turns either into the same table.
 *
 * USAGE: dtrace -qs lwlock_wait.d BINARY [POSTMASTER_PID] [BY_PID] [INTERVAL_S] [ONLY_PID] [MAX_FIRES_S]
 *   The positional parameters of bpf/lwlock_wait.bt (pgprobe passes the same
 *   list to both engines), as D macro arguments:
 *   BINARY          $$1: not needed by DTrace (USDT providers are per process,
 *                   postgresql<PID>, and postgresql* matches every process
 *                   that has the probes); only printed in the first line. By
 *                   hand, pass any word ("-") to reach the next parameters.
 *   POSTMASTER_PID  $2: count only that cluster: the postmaster and its
 *                   children (0 or omitted: every process with the
 *                   postgresql provider, all clusters)
 *   BY_PID          $3: 1 keys every row by pid too (0: the pid field is 0)
 *   INTERVAL_S      $4: print and truncate the aggregations every N seconds
 *                   (0: only at exit)
 *   ONLY_PID        $5: count only this pid (0: all)
 *   MAX_FIRES_S     $6: the guard, as in bpf/lwlock_wait.bt: when the counted
 *                   fires (starts + dones) of the last second pass it, stop
 *                   recording, print "@@guard" (same fields) and exit(0),
 *                   which runs END; 0: no guard
 *   Omitted parameters are 0 (#pragma D option defaultargs). -p and $target
 *   are not used: postgresql$target would name one process only, and the
 *   backends forked during the capture would be missed; postgresql* with a
 *   pid/ppid predicate takes them in as they start (DTrace keeps the enabling
 *   and matches the provider of each new process).
 *   Ctrl-C (SIGINT) ends the capture: the END clause prints the aggregations.
 *
 * DTRACE FOR LINUX (Oracle's DTrace 2, scripts/setup-dtrace): it enables
 *   PostgreSQL's (systemtap-style) probes per pid only, postgresql<PID>, no
 *   wildcard: pgprobe rewrites each postgresql*:::NAME below into one
 *   description per running server process and runs dtrace -Z; backends
 *   forked after dtrace started are not traced (pgprobe counts them). By hand:
 *   sed "s/postgresql\*:::\([a-z-]*\)/postgresql$PID:::\1/" for one process.
 *
 * REQUIREMENTS: DTrace (illumos, Solaris, FreeBSD, macOS, Linux) and the privilege
 *   to trace other users' processes (root; on illumos/Solaris dtrace_proc +
 *   dtrace_user suffice); PostgreSQL built with --enable-dtrace (check:
 *   dtrace -ln 'postgresql*:::lwlock-wait-start' with the server running);
 *   FreeBSD's packages are built without it (port option DTRACE); macOS's
 *   System Integrity Protection must allow DTrace (csrutil enable --without
 *   dtrace).
 *
 * PROBE ARGUMENTS ACROSS VERSIONS (src/backend/utils/probes.d):
 *   8.3       lwlock-startwait(int lockid, int mode): other probe names
 *   8.4-9.3   lwlock-wait-start(LWLockId, LWLockMode): a lock number
 *   9.4-9.6   lwlock-wait-start(const char *tranche, int offset, LWLockMode):
 *             mode is arg2 (probes.d of 2016; 9.4's documentation: "arg0 is
 *             the LWLock's tranche, arg1 its offset within its tranche")
 *   10        not checked here (the offset went away in 10 or 11)
 *   11+       lwlock-wait-start(const char *tranche, LWLockMode): this script
 *   Supported: 11 and later. 11 and 12 name every individual lwlock (WALWrite,
 *   ProcArray, ...) "main"; from 13 the name is the wait event's name.
 *   pgprobe lwlocks refuses servers before 13 for that reason. Mode values:
 *   0 LW_EXCLUSIVE, 1 LW_SHARED, 2 LW_WAIT_UNTIL_FREE.
 *
 * OUTPUT (one stable, tab-separated layout that pgprobe's DTrace engine
 *   parses; readable by hand):
 *   @@attached <TAB> lwlock_wait.d <TAB> BINARY    BEGIN: all probes enabled
 *   @@snapshot <TAB> 2026 Nov 21 23:44:19          before each set of maps
 *   @wait_stats:count <TAB> PID <TAB> TRANCHE <TAB> MODE <TAB> WAITS
 *   @wait_stats:total <TAB> PID <TAB> TRANCHE <TAB> MODE <TAB> TOTAL_NS
 *   @wait_max_ns <TAB> PID <TAB> TRANCHE <TAB> MODE <TAB> MAX_NS
 *   @wait_ns <TAB> PID <TAB> TRANCHE <TAB> MODE, then DTrace's quantize table
 *           (value  ---- Distribution ---- count; value is a bucket's low
 *           bound, a power of two), then a blank line
 *   @@guard <TAB> CAPTURED_MS <TAB> FIRES_LAST_S <TAB> FIRES <TAB> WAITS
 *                                                  the guard stopped the capture
 *   @@end                                          END printed everything
 *   @wait_unfinished <TAB> N                       waits whose -done never fired
 *           (the thread's next wait started first), as in bpf/lwlock_wait.bt
 *   The :count and :total halves are bpftrace's stats() (count and total) of
 *   @wait_stats; PID is 0 unless BY_PID.
 *
 * OVERHEAD: two USDT probes per wait (a trap each, a few us); waits are the
 *   slow path of LWLockAcquire, so an uncontended server pays nothing. The
 *   copyinstr() of the tranche name is done once per wait, at -done.
 *
 * EXAMPLE:
 *   # dtrace -qs d/lwlock_wait.d - $(head -1 $PGDATA/postmaster.pid)
 *   @@attached	lwlock_wait.d	-
 *   ^C
 *   @@snapshot	2026 Nov 21 23:44:27
 *   @wait_stats:count	0	WALWrite	Exclusive	16773
 *   [...]
 *   (a real run, DTrace for Linux 2.0.7: samples/lwlock_wait_d_example.txt)
 *
 * Part of pgprobe (pgprobe lwlocks --engine dtrace runs this script).
 */

#pragma D option quiet
#pragma D option defaultargs
#pragma D option switchrate=10hz

self uint64_t lw_start;	/* read in a predicate before its first assignment */

dtrace:::BEGIN
{
	lw_ticks = 0;	/* seconds since the last interval print */
	lw_t0 = timestamp;	/* the guard's window starts here */
	lw_fires = 0;	/* the guard's counts (racy across CPUs: a bound, not a figure) */
	lw_fires_before = 0;
	lw_waits = 0;
	lw_stopped = 0;
	printf("@@attached\tlwlock_wait.d\t%s\n", $$1);
}

postgresql*:::lwlock-wait-start
/self->lw_start && ($2 == 0 || pid == $2 || ppid == $2) && ($5 == 0 || pid == $5) && !lw_stopped/
{
	@wait_unfinished = count();	/* the last wait of this thread never ended here */
}

postgresql*:::lwlock-wait-start
/($2 == 0 || pid == $2 || ppid == $2) && ($5 == 0 || pid == $5) && !lw_stopped/
{
	self->lw_start = timestamp;
	lw_fires++;
}

postgresql*:::lwlock-wait-done
/self->lw_start && !lw_stopped/
{
	this->ns = timestamp - self->lw_start;
	self->lw_start = 0;
	lw_fires++;
	lw_waits++;
	this->who = $3 ? pid : 0;
	this->tranche = copyinstr(arg0);
	this->mode = arg1 == 0 ? "Exclusive" : (arg1 == 1 ? "Shared" : "WaitUntilFree");
	@wait_count[this->who, this->tranche, this->mode] = count();
	@wait_total[this->who, this->tranche, this->mode] = sum(this->ns);
	@wait_max_ns[this->who, this->tranche, this->mode] = max(this->ns);
	@wait_ns[this->who, this->tranche, this->mode] = quantize(this->ns);
}

/* The guard (no if/else in portable D: one clause per branch). */
tick-1sec
/$6 > 0 && !lw_stopped/
{
	lw_last = lw_fires - lw_fires_before;
	lw_fires_before = lw_fires;
}

tick-1sec
/$6 > 0 && !lw_stopped && lw_last > $6/
{
	lw_stopped = 1;
	printf("@@guard\t%d\t%d\t%d\t%d\n", (timestamp - lw_t0) / 1000000, lw_last,
	    lw_fires, lw_waits);
	exit(0);
}

tick-1sec
/$4 > 0 && !lw_stopped/
{
	lw_ticks++;
}

tick-1sec
/$4 > 0 && lw_ticks >= $4 && !lw_stopped/
{
	lw_ticks = 0;
	printf("@@snapshot\t%Y\n", walltimestamp);
	printa("@wait_stats:count\t%d\t%s\t%s\t%@d\n", @wait_count);
	printa("@wait_stats:total\t%d\t%s\t%s\t%@d\n", @wait_total);
	printa("@wait_max_ns\t%d\t%s\t%s\t%@d\n", @wait_max_ns);
	printa("@wait_ns\t%d\t%s\t%s\n%@d\n", @wait_ns);
	printa("@wait_unfinished\t%@d\n", @wait_unfinished);
	trunc(@wait_count);
	trunc(@wait_total);
	trunc(@wait_max_ns);
	trunc(@wait_ns);
	trunc(@wait_unfinished);
}

dtrace:::END
{
	printf("@@snapshot\t%Y\n", walltimestamp);
	printa("@wait_stats:count\t%d\t%s\t%s\t%@d\n", @wait_count);
	printa("@wait_stats:total\t%d\t%s\t%s\t%@d\n", @wait_total);
	printa("@wait_max_ns\t%d\t%s\t%s\t%@d\n", @wait_max_ns);
	printa("@wait_ns\t%d\t%s\t%s\n%@d\n", @wait_ns);
	printa("@wait_unfinished\t%@d\n", @wait_unfinished);
	printf("@@end\n");
}
