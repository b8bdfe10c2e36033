#!/usr/sbin/dtrace -qs
/*
 * waits.d - where each PostgreSQL process's time goes, exactly: on CPU,
 *           waiting for a CPU, and off CPU in each wait event (14+)
 *           (DTrace; the twin of bpf/waits.bt).
 *
 * The scheduler says when a thread leaves a CPU and which one gets it
 * (sched:::off-cpu: curthread leaves, args[0]/args[1] come in) and when a
 * sleeping thread is made runnable again (sched:::wakeup). At every
 * off-cpu of a PostgreSQL process that goes to sleep this script reads, from
 * the process's own memory, the wait event it published: *my_wait_event_info
 * (copyin of the pointer, then of the uint32 it points at), the value
 * pg_stat_activity shows as wait_event_type/wait_event. Each sleep is charged
 * to that value. No pid provider, no USDT: any 14+ build, stripped or not.
 *
 * USAGE: dtrace -qs waits.d POSTMASTER_PID ADDR [INTERVAL_S] [ONLY_PID] [BE_ADDR STATE_OFF]
 *        [PROC_ADDR WAIT_LOCK_OFF [QID_OFF]]
 *   The positional parameters of bpf/waits.bt (pgprobe passes the same list
 *   to both engines), as D macro arguments:
 *   POSTMASTER_PID  $1: trace the postmaster and its children
 *   ADDR            $2: address of the global my_wait_event_info in the
 *                   postmaster (symbol value + load base of the binary; the
 *                   same in every backend): see bpf/waits.bt; pgprobe computes it
 *   INTERVAL_S      $3: print the aggregations every N seconds (0: only at
 *                   exit), never truncated: each print is cumulative since the
 *                   start and pgprobe takes a window as the difference of two
 *                   consecutive prints (as with bpf/waits.bt)
 *   ONLY_PID        $4: trace this pid only (0: the whole cluster)
 *   BE_ADDR         $5: address of the global MyBEEntry (0: not read)
 *   STATE_OFF       $6: offsetof(PgBackendStatus, st_state): at a switch-out
 *                   in Client:ClientRead, st_state (pg_stat_activity's state:
 *                   idle, idle in transaction, ...) goes in bits 16-23 of the
 *                   wait_event_info, as in bpf/waits.bt (0: not known)
 *   PROC_ADDR       $7: address of the global MyProc (0: Lock sleeps are not read
 *                   for their lock)
 *   WAIT_LOCK_OFF   $8: offsetof(PGPROC, waitLock) (112 in 14-18): at a switch-out
 *                   in a Lock:* wait event, the LOCKTAG of the lock it queues on, the
 *                   mode it wants and when its wait began, as in bpf/waits.bt
 *   QID_OFF         $9: offsetof(PgBackendStatus, st_query_id) (424 in 14-18; BE_ADDR
 *                   needed): each interval also keyed by the statement, as in
 *                   bpf/waits.bt (@query_ns)
 *   Omitted parameters are 0 (#pragma D option defaultargs).
 *   Ctrl-C (SIGINT) ends the capture: the END clause prints the aggregations.
 *
 * WHAT IS NOT THE SAME AS bpf/waits.bt:
 *   - no @task: D cannot walk an associative array, so the intervals still
 *     open when the maps are printed (a backend idle in ClientRead at the
 *     end, a sleep that spans an interval boundary) are not charged until
 *     they end; pgprobe shows that time as not accounted. Each interval is
 *     charged whole when it ends.
 *   - preempted or asleep is read from curthread->__state at off-cpu (0:
 *     runnable, i.e. preempted or yielded; kernels 5.14+ name it __state);
 *     bpf/waits.bt uses sched_switch's prev_state, which also counts a task
 *     preempted just after it set a sleeping state as runnable.
 *   - @window_ns and @now_ns are printed with printf from variables (the
 *     clause's own timestamp), not from aggregations: printa() and trunc()
 *     act on the consumer's copy of the aggregations, read at its own pace
 *     (aggrate, 10 Hz here), so an aggregation set in the same clause was
 *     printed with its new value (window 0 s). With INTERVAL_S the cut
 *     between two windows is therefore within about 0.1 s of @now_ns, not
 *     exactly at it (nothing is lost: the prints are cumulative).
 *   - a task's owner (postmaster child) is decided from pid/ppid at each
 *     probe rather than once, and at sched:::wakeup from args[1] (psinfo_t).
 *   - no @first_runs (the run count at a first switch-out): a sleep that
 *     began before the capture and ended in it stays "asleep since before
 *     capture" (bpf/waits.bt names it when the run count proves it).
 *
 * REQUIREMENTS: DTrace with the sched and proc providers; verified live on
 *   Oracle's DTrace for Linux 2.0.7 (scripts/setup-dtrace). Root.
 *   curthread->__state is Linux's task_struct field: on illumos/FreeBSD/macOS
 *   this script does not compile as is (not tried there).
 *
 * OUTPUT (the tab-separated layout pgprobe's DTrace engine parses; the map
 *   names, keys and units of bpf/waits.bt, times in ns, tid = pid):
 *   @@attached <TAB> waits.d <TAB> POSTMASTER_PID    BEGIN: all probes enabled
 *   @@snapshot <TAB> 2026 Nov 23 03:20:19            before each set of maps
 *   @window_ns <TAB> NS          when this window began (timestamp)
 *   @now_ns <TAB> NS             when the maps were printed
 *   @cpu_ns <TAB> TID <TAB> NS   time on CPU
 *   @runq_ns <TAB> TID <TAB> HOW <TAB> NS   runnable, waiting for a CPU (2
 *                                preempted or yielded, 3 woken, not yet running,
 *                                4 runnable since before the capture as far as seen)
 *   @wait_ns <TAB> TID <TAB> WEI <TAB> NS   off CPU per wait_event_info (0 none
 *                                set, 1 not readable, 2 asleep since before the
 *                                capture)
 *   @wait_hist <TAB> TID <TAB> WEI, then DTrace's quantize table of the sleeps
 *   @born_ns / @exit_ns <TAB> TID <TAB> NS   fork by the postmaster / exit
 *   @unseen <TAB> KIND <TAB> TID <TAB> N   1 an off-cpu of a task not on CPU, or a wakeup
 *                                of a runnable one (a switch-in missed), 2 a
 *                                switch-in of a sleeping task (its wakeup missed),
 *                                3 a switch-in of a task on CPU (its off-cpu
 *                                missed), 4 a break in a CPU's chain of switches
 *   @gap_ns <TAB> NS             total length of those breaks
 *   @lock_ns <TAB> TID <TAB> MODE <TAB> TYPE <TAB> FIELD1 <TAB> FIELD2 <TAB> FIELD3 <TAB> FIELD4 <TAB> NS
 *                                time asleep in Lock:* wait events per lock (its
 *                                LOCKTAG) and mode wanted (PROC_ADDR given; see
 *                                bpf/waits.bt's header for the fields)
 *   @lock_waits, @lock_max <TAB> the same key <TAB> N   waits (the sleeps of one
 *                                acquisition), and the longest one's ns
 *   @query_ns <TAB> TID <TAB> KIND <TAB> STATE <TAB> WEI <TAB> QUERY_ID <TAB> NS
 *                                (QID_OFF given) each interval by the backend's state
 *                                and statement: KIND 1 on CPU, 2 runqueue after a
 *                                preemption, 3 after a wakeup (WEI: the sleep's), 4
 *                                asleep in WEI (see bpf/waits.bt's header)
 *   @@end                        END printed everything
 *
 * OVERHEAD: off-cpu and wakeup fire for every thread of the machine;
 *   a foreign thread costs the pid/ppid comparisons (and at wakeup one
 *   associative-array lookup). An own sleep costs two copyin()s; with
 *   PROC_ADDR, a Lock sleep six more; with QID_OFF, every off-cpu three more.
 *
 * EXAMPLE:
 *   # dtrace -qs d/waits.d $(head -1 $PGDATA/postmaster.pid) 94823514324680
 *   @@attached	waits.d	6894
 *   ^C
 *   @@snapshot	2026 Nov 23 03:16:29
 *   @wait_ns	6904	150994946	2002024508      (0x09000002: Timeout:PgSleep, 15)
 *   [...]
 *   (a real run, DTrace for Linux 2.0.7: samples/waits_d_example.txt)
 *   With PROC_ADDR and WAIT_LOCK_OFF, a SELECT queued 1.94 s behind a table lock
 *   (AccessShareLock on relation 16384 of database 5; samples/waits_locks_example.txt):
 *   @lock_ns	18101	1	0	5	16384	0	0	1938828210
 *   With QID_OFF, SELECT pg_sleep(0.2) five times (samples/waits_queries_example.txt):
 *   @query_ns	3547	4	2	150994946	2920803561901199087	1006095620
 *
 * Part of pgprobe (pgprobe waits --engine dtrace runs this script).
 */

#pragma D option quiet
#pragma D option defaultargs
#pragma D option switchrate=10hz
#pragma D option aggrate=10hz
#pragma D option dynvarsize=32m

/*
 * Per thread (global arrays keyed by tid; 0 deletes an entry):
 *   ws_state: 1 on CPU, 2 runnable (preempted), 3 runnable (woken), 4 asleep,
 *             5 ours, woken during the capture before any switch-in was seen
 *   ws_since: since when (timestamp); ws_wei: the wait event of a sleep
 *   ws_exiting: proc:::exit seen, its last off-cpu follows
 *   state 7: lost track of (its CPU's events stopped being seen): not charged
 *   ws_lastnext, ws_lasttime: per CPU, the thread switched in last, and when
 */

int ws_state[int];
uint64_t ws_since[int];
uint64_t ws_wei[int];
int ws_exiting[int];
int ws_lastnext[int];
/*
 * The lock dimension (PROC_ADDR given), per thread: ws_lk0/1 (the LOCKTAG as two words),
 * ws_lkmode, ws_lkstart: the lock the Lock sleep under way waits for; ws_w0/1, ws_wmode,
 * ws_wstart, ws_wns: the wait under way (its first sleep's lock, mode, start) and its
 * sleeps' ns so far.
 */
uint64_t ws_lk0[int];
uint64_t ws_lk1[int];
int ws_lkmode[int];
uint64_t ws_lkstart[int];
uint64_t ws_w0[int];
uint64_t ws_w1[int];
int ws_wmode[int];
uint64_t ws_wstart[int];
uint64_t ws_wns[int];
/*
 * The query dimension (QID_OFF given), per thread: the backend's state and statement read
 * at its last off-cpu (ws_qstate, ws_qid), and the wait event of its last sleep (ws_qwei:
 * the runqueue time after its wakeup goes with it).
 */
uint32_t ws_qstate[int];
uint64_t ws_qid[int];
uint64_t ws_qwei[int];
uint64_t ws_lasttime[int];
uint64_t ws_window;
uint64_t ws_now;
int ws_ticks;

dtrace:::BEGIN
{
	ws_ticks = 0;
	ws_window = timestamp;
	printf("@@attached\twaits.d\t%d\n", $1);
}

/* ---- the thread that leaves its CPU (curthread) ---- */

sched:::off-cpu
{
	this->now = timestamp;
	this->ours = $4 ? pid == $4 : (pid == $1 || ppid == $1);
	this->ran = (uint64_t)0;	/* the part of the run that ends here charged to @cpu_ns */
	this->qbe = (uint64_t)0;
	this->st = this->ours ? ws_state[tid] : 0;
	this->t0 = this->ours ? ws_since[tid] : 0;
}

/*
 * A CPU's switches form a chain (each leaving thread came in at the CPU's last
 * switch). A break: the probes did not run on this CPU for a while (a BPF guard
 * held, as in bpf/waits.bt). The thread last switched in here left at an unknown
 * time: lost track of (7), its interval is not charged.
 */
sched:::off-cpu
{
	this->ln = ws_lastnext[cpu];
	this->lt = ws_lasttime[cpu];
}

sched:::off-cpu
/this->lt != 0 && this->ln != tid/
{
	@unseen[4, this->ln] = count();
	@gap_ns = sum(this->now - this->lt);
}

sched:::off-cpu
/this->lt != 0 && this->ln != tid && this->ln != 0 && ws_state[this->ln] == 1 &&
 ws_since[this->ln] == this->lt/
{
	ws_state[this->ln] = 7;
}

/*
 * The kernel's own count of this run's CPU time (since its switch-in; steal and
 * IRQ time left out). A span that should be one run but is much longer hides
 * events never seen: a switch-out and a switch-in (off CPU in between), or a
 * switch-in after the capture began. Then only this run is charged (exact), as
 * in bpf/waits.bt.
 */
sched:::off-cpu
/this->ours/
{
	this->run = curthread->se.sum_exec_runtime - curthread->se.prev_sum_exec_runtime;
	this->span = this->st == 1 ? this->now - this->t0 : this->now - ws_window;
	/*
	 * not for an exiting thread (PF_EXITING): leaving its autogroup restarts that count;
	 * nor a first run: every PostgreSQL child calls setsid() as it starts (a new autogroup)
	 */
	this->missed = (this->st <= 1 || this->st == 5) && !(curthread->flags & 0x4) &&
	    curthread->sched_info.pcount > 1 && this->span > this->run + 250000 + this->span / 16;
}

sched:::off-cpu
/this->ours && this->st == 1/
{
	@cpu_ns[tid] = sum(this->missed ? this->run : this->span);
	this->ran = this->missed ? this->run : this->span;
}

sched:::off-cpu
/this->ours && this->st == 1 && this->missed/
{
	@unseen[1, tid] = count();
}

sched:::off-cpu
/this->ours && (this->st == 0 || this->st == 5)/
{
	/*
	 * No switch-in seen: on CPU since before the capture (5: woken while it still
	 * ran), unless the kernel says this run began later (missed, below).
	 */
	@cpu_ns[tid] = sum(this->missed ? this->run : this->span);
	this->ran = this->missed ? this->run : this->span;
}

sched:::off-cpu
/this->ours && this->st == 5 && this->missed/
{
	/* asleep from the window start to the wakeup seen, runnable from then to this run */
	@wait_ns[tid, 2] = sum(this->t0 - ws_window);
	@runq_ns[tid, 3] = sum(this->now - this->run > this->t0 ? this->now - this->run - this->t0 : 0);
}

sched:::off-cpu
/this->ours && this->st == 0 && this->missed/
{
	/* its wakeup and switch-in unseen: off CPU until this run, all of it to the sleep */
	@unseen[2, tid] = count();
	@wait_ns[tid, 2] = sum(this->span - this->run);
}

sched:::off-cpu
/this->ours && this->st >= 2 && this->st <= 4/
{
	/* its switch-in was not seen: that interval is lost */
	@unseen[1, tid] = count();
}

/*
 * QID_OFF: the statement. The run that ends here goes to the backend's state and query
 * id read now, and what follows (a sleep, a wait for a CPU) to them too, when it ends. A
 * process's last run (its exit: the memory is gone) to none (0, 0).
 */
sched:::off-cpu
/this->ours && $9 != 0 && $5 != 0 && !ws_exiting[tid]/
{
	this->qbe = *(uint64_t *)copyin($5, 8);
}

sched:::off-cpu
/this->qbe != 0/
{
	ws_qstate[tid] = *(uint32_t *)copyin(this->qbe + $6, 4);
	ws_qid[tid] = *(uint64_t *)copyin(this->qbe + $9, 8);
}

sched:::off-cpu
/this->ours && $9 != 0 && $5 != 0 && this->qbe == 0/
{
	ws_qstate[tid] = 0;
	ws_qid[tid] = 0;
}

sched:::off-cpu
/this->ours && $9 != 0 && $5 != 0 && this->ran > 0/
{
	@query_ns[tid, 1, ws_qstate[tid], (uint64_t)0, (int64_t)ws_qid[tid]] = sum(this->ran);
}

sched:::off-cpu
/this->ours && $9 != 0 && ws_exiting[tid]/
{
	ws_qwei[tid] = 0;
}

sched:::off-cpu
/this->ours && ws_exiting[tid]/
{
	/* its end: after proc:::exit a backend still runs (its memory torn down) */
	@exit_ns[tid] = max(this->now);
	ws_state[tid] = 0;
	ws_since[tid] = 0;
	ws_wei[tid] = 0;
	ws_exiting[tid] = 0;
	this->ours = 0;
}

sched:::off-cpu
/this->ours && curthread->__state == 0/
{
	ws_state[tid] = 2;
	ws_since[tid] = this->now;
	ws_wei[tid] = 0;
}

sched:::off-cpu
/this->ours && curthread->__state != 0/
{
	ws_state[tid] = 4;
	ws_since[tid] = this->now;
	ws_wei[tid] = 1;	/* until read below: a failed copyin leaves "not readable" */
	this->p = *(uint64_t *)copyin($2, 8);
	this->be = (uint64_t)0;	/* typed: a clause-local takes its first type */
	this->proc = (uint64_t)0;
	this->lock = (uint64_t)0;
}

sched:::off-cpu
/this->ours && curthread->__state != 0 && this->p != 0/
{
	ws_wei[tid] = *(uint32_t *)copyin(this->p, 4);
}

sched:::off-cpu
/this->ours && curthread->__state != 0 && this->p != 0 && ws_wei[tid] == 0x06000000 && $5 != 0/
{
	/* Client:ClientRead: idle or idle in transaction? MyBEEntry->st_state (BE_ADDR) */
	this->be = *(uint64_t *)copyin($5, 8);
}

sched:::off-cpu
/this->ours && curthread->__state != 0 && this->be != 0/
{
	ws_wei[tid] |= (*(uint32_t *)copyin(this->be + $6, 4) & 0xff) << 16;
}

/*
 * A Lock:* sleep: the lock it queues on (MyProc->waitLock's LOCKTAG, 16 bytes as two
 * words), the mode it wants and when its wait began (waitLockMode, waitStart).
 */
sched:::off-cpu
/this->ours && curthread->__state != 0 && this->p != 0 && (ws_wei[tid] >> 24) == 3 && $7 != 0/
{
	this->proc = *(uint64_t *)copyin($7, 8);
}

sched:::off-cpu
/this->proc != 0/
{
	this->lock = *(uint64_t *)copyin(this->proc + $8, 8);
}

sched:::off-cpu
/this->lock != 0/
{
	ws_lk0[tid] = *(uint64_t *)copyin(this->lock, 8);
	ws_lk1[tid] = *(uint64_t *)copyin(this->lock + 8, 8);
	ws_lkmode[tid] = *(int *)copyin(this->proc + $8 + 16, 4);
	ws_lkstart[tid] = *(uint64_t *)copyin(this->proc + $8 + 24, 8);
}

/* ---- a sleeping thread becomes runnable (curthread is the waker) ---- */

sched:::wakeup
{
	this->w = args[0]->pr_lwpid;
	this->ws = ws_state[this->w];
	this->lkw = 0;	/* a Lock sleep's thread, charged to its lock below */
}

sched:::wakeup
/this->ws == 4/
{
	this->now = timestamp;
	this->t0 = ws_since[this->w];
	this->wei = ws_wei[this->w];
	@wait_ns[this->w, this->wei] = sum(this->now - this->t0);
	@wait_hist[this->w, this->wei] = quantize(this->now - this->t0);
	this->lkw = (this->wei >> 24) == 3 ? this->w : 0;
	this->slept = this->now - this->t0;
	ws_state[this->w] = 3;
	ws_since[this->w] = this->now;
	ws_wei[this->w] = 0;
}

sched:::wakeup
/this->ws == 4 && $9 != 0 && $5 != 0/
{
	@query_ns[this->w, 4, ws_qstate[this->w], this->wei, (int64_t)ws_qid[this->w]] = sum(this->slept);
	ws_qwei[this->w] = this->wei;
}

sched:::wakeup
/this->ws == 2 || this->ws == 3/
{
	@unseen[1, this->w] = count();
}

sched:::wakeup
/this->ws == 2 || this->ws == 3 || this->ws == 7/
{
	/*
	 * Woken while runnable (2, 3: it ran and slept unseen) or lost track of (7):
	 * that interval is not charged.
	 */
	ws_state[this->w] = 3;
	ws_since[this->w] = timestamp;
	ws_wei[this->w] = 0;
}

sched:::wakeup
/this->ws == 0 && ($4 ? args[1]->pr_pid == $4 : (args[1]->pr_pid == $1 || args[1]->pr_ppid == $1))/
{
	/* ours, asleep since before the capture */
	ws_state[this->w] = 5;
	ws_since[this->w] = timestamp;
}

/*
 * ---- the thread that gets the CPU: off-cpu's args[0] and args[1] (DTrace for
 * Linux's sched:::on-cpu fires, but not with the incoming thread as curthread,
 * so the switch-in is taken here, as bpf/waits.bt takes both halves of
 * sched_switch in one probe) ----
 */

sched:::off-cpu
{
	this->n = args[0]->pr_lwpid;
	this->nst = ws_state[this->n];
	this->lkw = 0;
}

sched:::off-cpu
/this->nst == 0 && this->n != 0/
{
	this->nours = $4 ? args[1]->pr_pid == $4 :
	    (args[1]->pr_pid == $1 || args[1]->pr_ppid == $1);
}

sched:::off-cpu
/this->nst != 0 || (this->n != 0 && this->nours)/
{
	this->n0 = ws_since[this->n];
	this->from = this->n0;
}

sched:::off-cpu
/this->nst == 1/
{
	/* switched in while on CPU: its switch-out was not seen (the interval is not charged) */
	@unseen[3, this->n] = count();
}

sched:::off-cpu
/this->nst == 2 || this->nst == 3/
{
	@runq_ns[this->n, this->nst] = sum(this->now - this->from);
}

sched:::off-cpu
/(this->nst == 2 || this->nst == 3) && $9 != 0 && $5 != 0/
{
	@query_ns[this->n, this->nst, ws_qstate[this->n],
	    this->nst == 3 ? ws_qwei[this->n] : (uint64_t)0, (int64_t)ws_qid[this->n]] = sum(this->now - this->from);
}

sched:::off-cpu
/this->nst == 4 && $9 != 0 && $5 != 0/
{
	@query_ns[this->n, 4, ws_qstate[this->n], ws_wei[this->n], (int64_t)ws_qid[this->n]] =
	    sum(this->now - this->from);
}

sched:::off-cpu
/this->nst == 4/
{
	/* no wakeup seen: the whole time off CPU goes to the wait event */
	@unseen[2, this->n] = count();
	@wait_ns[this->n, ws_wei[this->n]] = sum(this->now - this->from);
	@wait_hist[this->n, ws_wei[this->n]] = quantize(this->now - this->n0);
	this->lkw = (ws_wei[this->n] >> 24) == 3 ? this->n : 0;
	this->slept = this->now - this->from;
}

sched:::off-cpu
/this->nst == 5 && this->n0 > ws_window/
{
	/* asleep since the window start (event unknown), then runnable */
	@wait_ns[this->n, 2] = sum(this->n0 - ws_window);
}

sched:::off-cpu
/this->nst == 5/
{
	@runq_ns[this->n, 3] = sum(this->now - this->from);
}

sched:::off-cpu
/this->nst == 0 && this->n != 0 && this->nours/
{
	/* runnable since before the capture, as far as seen (kind 4, as bpf/waits.bt) */
	@runq_ns[this->n, 4] = sum(this->now - ws_window);
}

sched:::off-cpu
/this->nst != 0 || (this->n != 0 && this->nours)/
{
	ws_state[this->n] = 1;
	ws_since[this->n] = this->now;
	ws_wei[this->n] = 0;
}

sched:::off-cpu
{
	ws_lastnext[cpu] = this->n;
	ws_lasttime[cpu] = this->now;
}

/*
 * A Lock sleep ended (at its wakeup, or at a switch-in when the wakeup was not seen):
 * charged to its lock and mode. One wait is the sleeps of one acquisition: the same
 * lock, mode and start (a start not set yet, 0, matches any).
 */
sched:::wakeup, sched:::off-cpu
/this->lkw != 0 && $7 != 0 && (ws_lk0[this->lkw] != 0 || ws_lk1[this->lkw] != 0)/
{
	this->k0 = ws_lk0[this->lkw];
	this->k1 = ws_lk1[this->lkw];
	this->km = ws_lkmode[this->lkw];
	this->ks = ws_lkstart[this->lkw];
	this->same = ws_wns[this->lkw] > 0 && ws_w0[this->lkw] == this->k0 &&
	    ws_w1[this->lkw] == this->k1 && ws_wmode[this->lkw] == this->km &&
	    (ws_wstart[this->lkw] == 0 || this->ks == 0 || ws_wstart[this->lkw] == this->ks);
	this->waited = (this->same ? ws_wns[this->lkw] : 0) + this->slept;
	/* the LOCKTAG: field1-4 (uint32 x3, uint16), its type (uint8) */
	this->type = (this->k1 >> 48) & 0xff;
	this->f1 = this->k0 & 0xffffffff;
	this->f2 = this->k0 >> 32;
	this->f3 = this->k1 & 0xffffffff;
	this->f4 = (this->k1 >> 32) & 0xffff;
	@lock_ns[this->lkw, this->km, this->type, this->f1, this->f2, this->f3, this->f4] =
	    sum(this->slept);
	@lock_max[this->lkw, this->km, this->type, this->f1, this->f2, this->f3, this->f4] =
	    max(this->waited);
	ws_wstart[this->lkw] = this->ks != 0 ? this->ks : this->same ? ws_wstart[this->lkw] : 0;
	ws_w0[this->lkw] = this->k0;
	ws_w1[this->lkw] = this->k1;
	ws_wmode[this->lkw] = this->km;
	ws_wns[this->lkw] = this->waited;
}

sched:::wakeup, sched:::off-cpu
/this->lkw != 0 && $7 != 0 && (ws_lk0[this->lkw] != 0 || ws_lk1[this->lkw] != 0) && !this->same/
{
	@lock_waits[this->lkw, this->km, this->type, this->f1, this->f2, this->f3, this->f4] =
	    count();
}

sched:::wakeup, sched:::off-cpu
/this->lkw != 0 && $7 != 0/
{
	ws_lk0[this->lkw] = 0;
	ws_lk1[this->lkw] = 0;
	ws_lkmode[this->lkw] = 0;
	ws_lkstart[this->lkw] = 0;
}

/* ---- births and deaths ---- */

proc:::create
/pid == $1 && $4 == 0/
{
	/* a child of the postmaster is ours from birth: runnable (woken) now */
	this->c = args[0]->pr_pid;
	@born_ns[this->c] = max(timestamp);
	ws_state[this->c] = 3;
	ws_since[this->c] = timestamp;
}

proc:::exit
/($4 ? pid == $4 : (pid == $1 || ppid == $1)) &&
 ((ws_state[tid] >= 1 && ws_state[tid] <= 4) || ws_state[tid] == 7)/
{
	@exit_ns[tid] = max(timestamp);
}

proc:::exit
/$4 ? pid == $4 : (pid == $1 || ppid == $1)/
{
	ws_exiting[tid] = 1;
}

proc:::exit
/$7 != 0 && ($4 ? pid == $4 : (pid == $1 || ppid == $1))/
{
	ws_w0[tid] = 0;
	ws_w1[tid] = 0;
	ws_wmode[tid] = 0;
	ws_wstart[tid] = 0;
	ws_wns[tid] = 0;
}

/* ---- printing ---- */

tick-1sec
/$3 > 0/
{
	ws_ticks++;
}

tick-1sec
/$3 > 0 && ws_ticks >= $3/
{
	ws_ticks = 0;
	ws_now = timestamp;
	printf("@@snapshot\t%Y\n", walltimestamp);
	printf("@window_ns\t%d\n", ws_window);
	printf("@now_ns\t%d\n", ws_now);
	printa("@cpu_ns\t%d\t%@d\n", @cpu_ns);
	printa("@runq_ns\t%d\t%d\t%@d\n", @runq_ns);
	printa("@wait_ns\t%d\t%d\t%@d\n", @wait_ns);
	printa("@wait_hist\t%d\t%d\n%@d\n", @wait_hist);
	printa("@born_ns\t%d\t%@d\n", @born_ns);
	printa("@exit_ns\t%d\t%@d\n", @exit_ns);
	printa("@unseen\t%d\t%d\t%@d\n", @unseen);
	printa("@gap_ns\t%@d\n", @gap_ns);
	printa("@lock_ns\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%@d\n", @lock_ns);
	printa("@lock_waits\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%@d\n", @lock_waits);
	printa("@lock_max\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%@d\n", @lock_max);
	printa("@query_ns\t%d\t%d\t%u\t%u\t%d\t%@d\n", @query_ns);
}

dtrace:::END
{
	printf("@@snapshot\t%Y\n", walltimestamp);
	printf("@window_ns\t%d\n", ws_window);
	printf("@now_ns\t%d\n", timestamp);
	printa("@cpu_ns\t%d\t%@d\n", @cpu_ns);
	printa("@runq_ns\t%d\t%d\t%@d\n", @runq_ns);
	printa("@wait_ns\t%d\t%d\t%@d\n", @wait_ns);
	printa("@wait_hist\t%d\t%d\n%@d\n", @wait_hist);
	printa("@born_ns\t%d\t%@d\n", @born_ns);
	printa("@exit_ns\t%d\t%@d\n", @exit_ns);
	printa("@unseen\t%d\t%d\t%@d\n", @unseen);
	printa("@gap_ns\t%@d\n", @gap_ns);
	printa("@lock_ns\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%@d\n", @lock_ns);
	printa("@lock_waits\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%@d\n", @lock_waits);
	printa("@lock_max\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%@d\n", @lock_max);
	printa("@query_ns\t%d\t%d\t%u\t%u\t%d\t%@d\n", @query_ns);
	printf("@@end\n");
}
