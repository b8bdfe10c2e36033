// SPDX-License-Identifier: GPL-2.0
/*
 * waits.bpf.c - where each PostgreSQL process's time goes, exactly (on CPU, waiting for a
 *               CPU, off CPU in each wait event): bpf/waits.bt's time model, compiled, at
 *               a fraction of the script's cost per context switch.
 *
 * The same time model and the same output maps as bpf/waits.bt (records.py reads both);
 * the way it is measured differs. The kernel already counts, per task, its time on CPU
 * (se.sum_exec_runtime), its time waiting in a runqueue (sched_info.run_delay) and its
 * sleeps (nvcsw): /proc/PID/schedstat and voluntary_ctxt_switches. So this object runs
 * only when a process of the cluster goes to sleep (a switch-out that is not a
 * preemption), and there:
 *   - reads the wait event the process published (my_wait_event_info) for the sleep it
 *     begins, with the kernel's counters and the time: one task-local entry;
 *   - closes the interval since its last sleep began: time since then, less the on-CPU
 *     and runqueue time the counters grew by, is that sleep's length, charged to its
 *     wait event (running totals in the entry; @wait_ns when the event changes).
 * A preemption only notes the runqueue total once per interval, which splits the
 * runqueue time into "woken, not yet running" (before it) and "preempted" (after it).
 * Nothing runs at a switch-in or a wakeup: no per-CPU chain to keep, no events that can
 * be lost between two programs; a sleep whose switch-out the kernel did not run this
 * program for shows as a voluntary switch not seen (nvcsw grew by more than one): its
 * time is not charged, and pgprobe says so. pgprobe reads the maps itself and charges
 * the interval still open at the read from /proc/PID/schedstat the same way
 * (pgprobe/tools/waits/compiled.py), and writes each process's counters into its entry
 * right after the probes attach (the seed), where this program made none yet: a process
 * that went to sleep before its seed was written takes its counters at the window's start
 * from @start, written before the attach.
 *
 * Attach points: raw BTF tracepoints (tp_btf/sched_switch, ...): the program gets the
 * kernel's own arguments, with no perf record filled for it (the classic tracepoints'
 * ~350 ns per switch on our AMD host, which bpftrace 0.17 cannot avoid), and
 * task_struct fields are plain loads (CO-RE relocated to the running kernel). The query
 * dimension adds a uprobe on the server's proc_exit(), attached only when it is asked for
 * (pgprobe/tools/waits/compiled.py's QUERY_PROGRAMS).
 *
 * USAGE: not run by hand: scripts/build-bpf compiles it (clang -target bpf) into
 *   bpf/build/waits.bpf.o, and `pgprobe waits` (and triage, lwlocks' fallback, serve)
 *   loads it with the system's libbpf when it is built and loads here, else runs
 *   bpf/waits.bt (the form to read and run by hand). Its parameters are waits.bt's
 *   $1, $2, $4, $5, $6 as `const volatile` globals below, set by pgprobe before load.
 *
 * EXAMPLE:
 *   # scripts/build-bpf && pgprobe waits -d 5
 *   (a real run: samples/waits_libbpf_example.txt)
 *
 * Part of pgprobe.
 */

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "scalars.h"
#include "hist.h"

typedef _Bool bool;
#define true 1
#define false 0
typedef int pid_t;

char LICENSE[] SEC("license") = "GPL";

/* The fields read, CO-RE relocated to the running kernel's struct layout. */
struct rq {
	__u64 clock;
} __attribute__((preserve_access_index));

struct cfs_rq {
	struct rq *rq;
} __attribute__((preserve_access_index));

struct sched_entity {
	__u64 sum_exec_runtime;
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));

struct sched_info {
	unsigned long long run_delay;
	unsigned long long last_arrival;
} __attribute__((preserve_access_index));

struct task_struct {
	int exit_state;
	__u64 start_time;	/* its fork, on the monotonic clock (bpf_ktime_get_ns's) */
	pid_t pid;
	pid_t tgid;
	struct task_struct *real_parent;
	unsigned long nvcsw;
	struct sched_entity se;
	struct sched_info sched_info;
} __attribute__((preserve_access_index));

/* waits.bt's positional parameters */
const volatile pid_t postmaster = 0;	/* $1 */
const volatile __u64 wei_addr = 0;	/* $2: &my_wait_event_info in the postmaster */
const volatile pid_t only_pid = 0;	/* $4 */
const volatile __u64 be_addr = 0;	/* $5: &MyBEEntry (0: not read) */
const volatile __u64 state_off = 0;	/* $6: offsetof(PgBackendStatus, st_state) */
/*
 * What my_wait_event_info holds in the postmaster: &local_my_wait_event_info, where a
 * process points it until it has a PGPROC (0: unknown, nothing cached; below).
 */
const volatile __u64 local_wei = 0;
/*
 * The query dimension (pgprobe queries, waits --by query; 0: off, nothing more is read):
 * query_span bytes of the backend's PgBackendStatus are read at each switch-out into a
 * sleep, in one read (a read costs the same whatever its size): st_changecount at 0,
 * st_state at state_off, st_activity_raw at raw_off, st_query_id at qid_off.
 * idle_states: bit s set for the states between statements (idle, idle in transaction
 * and its aborted form); active_state: "active" in this major's BackendState.
 * text_hash: statements without an id (compute_query_id off) keyed by a hash of the first
 * TEXT_MAX bytes of their text, digits left out (pgprobe/tools/queries/textkey.py).
 */
const volatile __u64 query_span = 0;
const volatile __u64 qid_off = 0;
const volatile __u64 raw_off = 0;
const volatile __u64 idle_states = 0;
const volatile __u64 active_state = 0;
/*
 * "idle" in this major's BackendState (0: not given): a ClientRead in it waits between
 * transactions, no statement's time (records.py leaves it out): keyed without the last
 * statement's id, one key for all of them, where keyed by statement each would move
 * the running totals (a select-only mix of 300 statements: one more slot search and map
 * update per switch-out).
 */
const volatile __u64 idle_state = 0;
const volatile __u64 text_hash = 0;
/*
 * Runs that span statements: st_activity_start_timestamp (act_off; PostgreSQL's clock,
 * microseconds since 2000) turned into this program's (monotonic) clock with pg_clock_ns
 * (realtime - monotonic - the 2000 epoch, measured by pgprobe at the load). The part of a
 * run (since its last mark: mark()) before its last statement began, past SPAN_MIN_NS,
 * may have run an earlier statement whose end neither a switch-out nor a mark saw (a
 * multi-statement string, a pipeline): counted (Q_SPANNED), still charged to the last
 * statement, since that part also holds the preemptions and the steal before the last
 * statement began (an upper bound of the time charged to the wrong statement).
 */
const volatile __u64 act_off = 0;
const volatile __u64 pg_clock_ns = 0;
/*
 * The end of a statement within a run: st_state_start_timestamp (state_at_off; the same
 * clock), written when the backend reported idle (or idle in transaction) after it. The
 * part of the run after that report (the protocol's send of the result, the read that
 * finds no next message, a preemption by the client the result woke) is not the
 * statement's, as pg_stat_activity shows it: it is keyed by that state alone, id 0, time
 * between statements (keyed by the statement too, TPC-B's ~20 keys a backend grew to ~27
 * of the entry's 32 slots: on_switch took ~500 ns more a switch, its slots taken over).
 * after_report(); 0: not read, the whole run is the statement's.
 */
const volatile __u64 state_at_off = 0;
/*
 * The lock dimension (pgprobe/tools/waits/lockdim.py): at a switch-out into a sleep of the
 * Lock class, the lock the backend is queued on (MyProc->waitLock's LOCKTAG), the mode it
 * wants and when its wait began (waitLockMode, waitStart); each lock wait's sleeps are
 * charged to @lock_ns[tid, lock, mode]. proc_addr: &MyProc; wait_lock_off:
 * offsetof(PGPROC, waitLock), where struct proc_wait's fields follow (14-18); 0: off.
 */
const volatile __u64 proc_addr = 0;
const volatile __u64 wait_lock_off = 0;
/*
 * The mode of an LWLock wait (pgprobe/waitevents/lwmode.py): at a switch-out into a sleep
 * of the LWLock class, MyProc->lwWaitMode (proc_addr: &MyProc) + 1 in bits 16-23 of the
 * sleep's wait event (LWLock events use bits 0-15), 0: not read. lwmode_off: its offset
 * in PGPROC (0: off).
 */
const volatile __u64 lwmode_off = 0;

#define EXIT_ZOMBIE_OR_DEAD 0x30
#define WAIT_CLASS_LOCK 0x03	/* wait_event_info >> 24 of every Lock:* event */
#define WAIT_CLASS_LWLOCK 0x01	/* ... of every LWLock:* event */
#define MAX_TASKS 65536
#define BEFORE_CAPTURE 2	/* waits.bt's "asleep since before the capture" event */
#define SPAN_MAX 512	/* bytes of PgBackendStatus read at most (432 in 14-18) */
#define TEXT_MAX 128
#define MAX_QUERY_KEYS 262144
/*
 * @query_ns's pairs of kinds (RUN: on CPU and preempted; SLEEP: a sleep and the runqueue
 * time right after it), and its state's flags beside BackendState (bits 0-7)
 */
enum { PAIR_RUN = 1, PAIR_SLEEP = 2 };
#define Q_TEXT 0x100	/* the id is a hash of the statement's text (no query id) */
#define Q_NO_ENTRY 0x200	/* no status entry read (none yet, or its memory gone) */
#define Q_SPANNED 0x400	/* a run's part before its last statement began (id 0) */
#define QSLOTS 32	/* keys per task (TPC-B: ~20 per backend) */
#define SPAN_MIN_NS 1000000	/* below: reading the message (up to ~0.3 ms measured on a VM under load) */

/*
 * What a process was doing at its entry's `since` (records.py's numbers where they
 * share a meaning):
 *   STARTED: not asleep (forked then; the time to its first sleep is the counters');
 *   ASLEEP: its switch-out into a sleep in wait event `a`, seen by this program;
 *   SEEDED_ASLEEP, SEEDED_RUNNING: pgprobe's seed, made right after the attach where
 *   this program made no entry yet, as of the window's start (or, after a sleep begun
 *   unseen before the attach, of its read): asleep in `a` (BEFORE_CAPTURE when it
 *   could not be read) with no run since, or not asleep.
 */
enum { STARTED = 1, ASLEEP = 4, SEEDED_ASLEEP = 10, SEEDED_RUNNING = 11 };

/*
 * A slot of the task's cache of totals by key: pair RUN (a: on CPU, b: preempted; wei 0)
 * or SLEEP (a: asleep in wei, b: woken, not yet running), in pair_state's bits 16-31,
 * the statement's state and flags in bits 0-15. Empty: pair_state 0.
 */
struct qslot {
	__u32 pair_state, wei;
	__u64 id, a, b;
};
struct task_state {
	__u64 since;	/* the moment of the state: a switch-out, the seed or the fork */
	__u64 state;
	__u64 a;	/* the wait event it slept in from `since` */
	__u64 rd_p;	/* run_delay + 1 at its first preemption since `since` (0: none) */
	__u64 cpu, runq2, runq3, wei, wait;	/* running totals: waits.bt's @task fields 4-8 */
	__u64 cpu0, rd0, nv0;	/* the kernel's counters at `since` */
	__u64 wei_ptr, be_ptr;	/* my_wait_event_info's and MyBEEntry's values, once set */
	/*
	 * The log2 histogram of the sleeps in `wei` since it became the running total's
	 * event (slot k: 2^(k-1) <= ns < 2^k; the last slot holds all longer), moved to
	 * @wait_hist with the total: a hash map update per sleep cost ~70 of ~240 ns per
	 * switch under pgbench -S (docs/benchmarks.md); the entry is in cache already.
	 */
	__u64 hist_used;	/* bit k set: hist[k] is not 0 (a flush stops at the last one) */
	__u64 hist[HIST_SLOTS];
	/*
	 * The query dimension. qa_*: the statement read at `since` (the sleep's), with the
	 * status entry's change count then. Running totals, moved to @query_ns when their
	 * key changes (as `wei`'s): r_* the runs (on CPU, preempted) of statement
	 * (r_state, r_id); s_* the sleeps in s_wei and the runqueue time right after them
	 * (woken, not yet running) of statement (s_state, s_id).
	 */
	__u64 qa_state, qa_id, cc0;
	__u64 r_state, r_id, r_cpu, r_rq2;
	__u64 s_state, s_id, s_wei, s_wait, s_rq3;
	__u64 span;	/* running total of Q_SPANNED time (to @query_ns at the exit) */
	/*
	 * Between statements (after_report(), and what follows a mark): on CPU and preempted
	 * in b_state, id 0. A running total of its own: with r_*, the key changed twice a
	 * switch-out (the statement's part, then this), a slot search each.
	 */
	__u64 b_state, b_cpu, b_rq2;
	/*
	 * The running totals' earlier keys (slot_add): a hash map update per change of
	 * statement cost ~900 ns per switch-out under pgbench TPC-B, which changes statement
	 * at almost every one (docs/benchmarks.md); the entry is in cache already.
	 */
	__u64 q_next;	/* moves of slots' totals to @query_ns so far (a slot taken over; the exit) */
	struct qslot slots[QSLOTS];
	__u64 slept_p;	/* first_sleep() at its first preemption since `since` (0: none) */
	/*
	 * Marks (mark()): the backend preempted between statements (one ended: it reported
	 * since). mk_*: the last mark since `since` (mk_ns 0: none), the statement that ended
	 * there (its key) and the change count; f_*: the first, whose part (from the run's
	 * start, known at the switch-out) is charged then; mk_cpu, mk_pre: what marks charged
	 * since `since` (the parts between two marks).
	 */
	__u64 mk_ns, mk_rd, mk_cc, mk_state, mk_id;
	__u64 f_ns, f_rd, f_state, f_id, f_act;
	__u64 mk_cpu, mk_pre;
	/*
	 * The lock dimension: MyProc's value once set; lk: the lock the sleep begun at
	 * `since` waits for (lk_ok); w: the lock wait under way (its first sleep's lock, mode
	 * and start) and its sleeps so far, moved to @lock_ns when another wait's first sleep
	 * is charged or at the exit (one map update per wait, not per sleep: a wait sleeps
	 * again at each deadlock check and each spurious wakeup)
	 */
	__u64 proc_ptr;
	struct lock_id {
		__u64 tag0, tag1, mode, start;
	} lk;
	__u64 lk_ok;
	struct lock_id w;
	__u64 w_ns, w_sleeps;
	/*
	 * The runqueue time right after the sleeps in `wei` (woken, not yet running: its wait
	 * event still set, as pg_stat_activity shows it): part of runq3, moved with `wait`
	 */
	__u64 wait_rq;
};
/* PGPROC from waitLock on (14-18): the lock, the PROCLOCK, the mode wanted, the wait's start */
struct proc_wait {
	__u64 lock, proclock;
	__s32 mode;
	__u32 pad;
	__u64 start;	/* TimestampTz; 0 until set (after the deadlock timer is armed) */
};
struct lock_key {
	__u32 tid, mode;
	__u64 tag0, tag1;	/* the LOCKTAG's 16 bytes */
};
struct lock_val {
	__u64 ns, sleeps, waits, max_ns;	/* max_ns: the longest wait's sleeps */
};
/* A statement read at a switch-out: the status entry's change count, state, id. */
struct query {
	__u64 cc, state, id, act;	/* act: st_activity_start_timestamp (us since 2000) */
	__u64 at;	/* st_state_start_timestamp (us since 2000; 0: not read) */
	bool ok;
};
struct query_key {
	__u32 tid, pair_state;	/* as a slot's: pair << 16 | state and its flags */
	__u32 wei, pad;
	__u64 id;
};
struct pair_ns {
	__u64 a, b;	/* RUN: on CPU, preempted; SLEEP: asleep, woken (a slot's) */
};
struct tid_u32 {
	__u32 tid, n;
};
struct hist_key {
	__u32 tid, wei, slot, pad;
};

#define HASH(name, k, v) \
	struct { \
		__uint(type, BPF_MAP_TYPE_HASH); \
		__uint(max_entries, MAX_TASKS); \
		__type(key, k); \
		__type(value, v); \
	} name SEC(".maps")

/* @task: in the task itself (task local storage), freed with it: no lookup by pid */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_state);
} task SEC(".maps");

HASH(cpu_ns, __u32, __u64);
HASH(runq_ns, struct tid_u32, __u64);	/* (tid, how: 2 preempted, 3 woken) */
HASH(wait_ns, struct tid_u32, struct pair_ns);	/* (tid, wei) -> asleep, woken after */
HASH(wait_hist, struct hist_key, __u64);	/* (tid, wei, log2 slot) -> sleeps */
HASH(born_ns, __u32, __u64);
HASH(exit_ns, __u32, __u64);
HASH(unseen, struct tid_u32, __u64);	/* (kind 3: switch-outs not seen, tid) */
/*
 * (tid, pair, state, wei, statement id) -> the pair's two ns totals: the time model per
 * statement (a pair of kinds per key: one map update where two kinds move together)
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_QUERY_KEYS);
	__type(key, struct query_key);
	__type(value, struct pair_ns);
} query_ns SEC(".maps");

/* (tid, mode, lock) -> its waits' sleeps: the lock dimension (wait_lock_off set) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_QUERY_KEYS);
	__type(key, struct lock_key);
	__type(value, struct lock_val);
} lock_ns SEC(".maps");

/*
 * tid -> the statement read at its proc_exit(), for its final run (its memory is gone at
 * its final switch-out). A hash map, not the task's storage: a task storage call here can
 * make the next one on this CPU fail (the storage's per-CPU busy guard).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TASKS);
	__type(key, __u32);
	__type(value, struct query);
} exit_query SEC(".maps");

/* Room for one read of the status entry and of a statement's text, per CPU. */
struct scratch {
	__u8 entry[SPAN_MAX + 8];
	__u8 text[TEXT_MAX];
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/*
 * @start: each process's counters at the window's start and whether it was asleep
 * then (SEEDED_ASLEEP, the event not read, or SEEDED_RUNNING), written by pgprobe before
 * the attach; read only at a process's first switch-out, when it has no entry yet.
 */
struct start_state {
	__u64 cpu0, rd0, nv0, state;
};
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_TASKS);
	__type(key, __u32);
	__type(value, struct start_state);
} start SEC(".maps");

/*
 * [0] window_ns: when the capture began (pgprobe writes it before the seed);
 * [1] map updates refused (a map full), said by pgprobe
 */
enum { WINDOW_NS, REFUSED };
SCALARS(2);

static __always_inline bool ours(struct task_struct *t)
{
	if (only_pid)
		return t->tgid == only_pid;
	return t->tgid == postmaster || t->real_parent->tgid == postmaster;
}

static __always_inline void refused(void)
{
	__u32 i = REFUSED;
	__u64 *v = bpf_map_lookup_elem(&scalars, &i);
	if (v)
		__sync_fetch_and_add(v, 1);
}

/* sum(): add to a counter, created at 0 when missing */
static __always_inline void add(void *map, void *key, __u64 delta)
{
	__u64 *v = bpf_map_lookup_elem(map, key);
	if (!v) {
		__u64 zero = 0;
		bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(map, key);
		if (!v) {
			refused();	/* map full */
			return;
		}
	}
	__sync_fetch_and_add(v, delta);
}

static __always_inline void add2(void *map, __u32 a, __u32 b, __u64 delta)
{
	struct tid_u32 k = { a, b };
	add(map, &k, delta);
}

/* add a pair of totals, created at (0, 0) when missing */
static __always_inline void add_pair(void *map, void *key, __u64 a, __u64 b)
{
	struct pair_ns *v = bpf_map_lookup_elem(map, key);
	if (!v) {
		struct pair_ns zero = { 0, 0 };
		bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(map, key);
		if (!v) {
			refused();	/* map full */
			return;
		}
	}
	__sync_fetch_and_add(&v->a, a);
	__sync_fetch_and_add(&v->b, b);
}

static __always_inline void set(void *map, __u32 tid, __u64 value)
{
	if (bpf_map_update_elem(map, &tid, &value, BPF_ANY))
		refused();
}

/* The log2 slot of v (0 for 0; k for 2^(k-1) <= v < 2^k), as bpftrace's hist() */
/* The running total of `wei` (time and sleeps) to @wait_ns and @wait_hist: its event changes. */
static __always_inline void flush(struct task_state *t, __u32 tid)
{
	if (t->wait > 0 || t->wait_rq > 0) {
		struct tid_u32 k = { tid, (__u32)t->wei };
		add_pair(&wait_ns, &k, t->wait, t->wait_rq);
	}
	t->wait = t->wait_rq = 0;
	__u64 used = t->hist_used;
	for (__u32 slot = 0; slot < HIST_SLOTS && used; slot++, used >>= 1) {
		if (used & 1) {
			struct hist_key k = { tid, (__u32)t->wei, slot, 0 };
			add(&wait_hist, &k, t->hist[slot]);
			t->hist[slot] = 0;
		}
	}
	t->hist_used = 0;
}

/*
 * The wait event the process published: *my_wait_event_info. A read of user memory costs
 * 65-190 ns (bpf_probe_read_user; by host, docs/benchmarks.md), so the pointers, which a process sets once (to its
 * PGPROC's field, to its PgBackendStatus), are kept in its state once they hold those:
 * one read per sleep instead of two (four for ClientRead). After a backend released its
 * PGPROC at exit, a sleep still reads that slot (0, "no wait event", unless reused).
 * Read at the switch-out: the program runs in the sleeping process, whose memory it is.
 */
static __always_inline __u64 entry_of(struct task_state *t)
{
	__u64 be = t->be_ptr;

	if (!be && !bpf_probe_read_user(&be, sizeof(be), (void *)be_addr) && be && local_wei)
		t->be_ptr = be;
	return be;
}

/*
 * The statement of a process at its switch-out (the query dimension): one read of its
 * status entry (written only by itself, never while it sleeps: no torn read). ok is
 * false where it has none (the postmaster; a process before pgstat_beinit, after its
 * exit released its memory). Without a query id, with text_hash, the id is a hash of
 * the statement's first TEXT_MAX bytes (FNV-1a 64, ASCII digits left out: pgbench's
 * literals do not split a statement), flagged Q_TEXT. A global function: verified once,
 * on its own (its loop), not at each of its callers (inlined, the verifier's paths
 * through on_switch passed its limit of a million instructions).
 */
__noinline int read_query(__u64 be, struct query *q)
{
	__u32 zero = 0;
	if (!q)
		return 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);
	__u64 span = query_span;

	q->ok = false;
	q->act = 0;
	q->at = 0;
	q->cc = 0;
	q->state = Q_NO_ENTRY;
	q->id = 0;
	if (!s || !be || span > SPAN_MAX || span < 8)
		return 0;
	if (bpf_probe_read_user(s->entry, span, (void *)be))
		return 0;
	q->ok = true;
	q->cc = *(__u32 *)s->entry;
	q->state = *(__u32 *)(s->entry + (state_off & (SPAN_MAX - 4))) & 0xff;
	q->id = *(__u64 *)(s->entry + (qid_off & (SPAN_MAX - 8)));
	q->act = act_off ? *(__u64 *)(s->entry + (act_off & (SPAN_MAX - 8))) : 0;
	q->at = state_at_off ? *(__u64 *)(s->entry + (state_at_off & (SPAN_MAX - 8))) : 0;
	if (q->id || !text_hash || q->state == 0)
		return 0;
	__u64 raw = *(__u64 *)(s->entry + (raw_off & (SPAN_MAX - 8)));
	if (!raw || bpf_probe_read_user_str(s->text, TEXT_MAX, (void *)raw) <= 0)
		return 0;
	__u64 h = 14695981039346656037ULL;
	for (__u32 i = 0; i < TEXT_MAX; i++) {
		__u8 c = s->text[i];
		if (!c)
			break;
		if (c >= '0' && c <= '9')
			continue;
		h = (h ^ c) * 1099511628211ULL;
	}
	q->id = h;
	q->state |= Q_TEXT;
	return 0;
}

/* A slot's totals to @query_ns: it is taken over, or its task exits. */
static __noinline void evict(struct qslot *q, __u32 tid)
{
	if (!q->a && !q->b)
		return;
	struct query_key k = { tid, q->pair_state, q->wei, 0, q->id };
	add_pair(&query_ns, &k, q->a, q->b);
}

/*
 * A running total whose key changes, to its slot: the one of its key, else the first
 * empty one, probed from the key's own place (open addressing: slots are never emptied,
 * only taken over, so a key is always found before an empty slot), else, all taken, the
 * key's own place, whose totals go to @query_ns first. A global function: verified once,
 * on its own (its loop).
 */
__noinline int slot_add(struct task_state *t, __u32 tid, struct qslot *add)
{
	if (!t || !add)
		return 0;
	__u32 home = (__u32)(add->id ^ (add->id >> 32)) * 0x9e3779b1u ^ add->pair_state ^ add->wei;
	home ^= home >> 16;
	for (__u32 i = 0; i < QSLOTS; i++) {
		struct qslot *q = &t->slots[(home + i) & (QSLOTS - 1)];
		if (q->pair_state == add->pair_state && q->wei == add->wei && q->id == add->id) {
			q->a += add->a;
			q->b += add->b;
			return 0;
		}
		if (!q->pair_state) {
			*q = *add;
			return 0;
		}
	}
	struct qslot *q = &t->slots[home & (QSLOTS - 1)];
	evict(q, tid);
	t->q_next++;
	*q = *add;
	return 0;
}

static __always_inline void to_slot(struct task_state *t, __u32 tid, __u32 pair, __u64 state,
				    __u64 wei, __u64 id, __u64 a, __u64 b)
{
	struct qslot add = { pair << 16 | ((__u32)state & 0xffff), (__u32)wei, id, a, b };
	slot_add(t, tid, &add);
}

/* The running totals of the query dimension to their slots (their key changes). */
static __always_inline void flush_runs(struct task_state *t, __u32 tid)
{
	if (t->r_cpu || t->r_rq2)
		to_slot(t, tid, PAIR_RUN, t->r_state, 0, t->r_id, t->r_cpu, t->r_rq2);
	t->r_cpu = t->r_rq2 = 0;
}

static __always_inline void flush_sleeps(struct task_state *t, __u32 tid)
{
	if (t->s_wait || t->s_rq3)
		to_slot(t, tid, PAIR_SLEEP, t->s_state, t->s_wei, t->s_id, t->s_wait, t->s_rq3);
	t->s_wait = t->s_rq3 = 0;
}

/* Whether q shows a statement ended since base_cc: idle (or in a transaction), reports made. */
static __always_inline bool ended(struct query *q, __u64 base_cc)
{
	__u64 raw = q->state & 0xff;
	return q->ok && q->cc != base_cc && raw < 64 && ((idle_states >> raw) & 1);
}

/*
 * The statement a run belongs to, from what was read at its end (q) and at its start
 * (base: the sleep before it, or the last mark): nothing reported since (the change count unchanged: woken for
 * something else than a statement, or within one), the statement of the sleep; a
 * statement that ended in it (idle now, reports made), that statement, active; else
 * the one read now.
 */
static __always_inline void run_key(__u64 base_state, __u64 base_id, __u64 base_cc,
				    struct query *q, __u64 *state, __u64 *id)
{
	*state = base_state;
	*id = base_id;
	if (!q->ok || q->cc == base_cc)
		return;
	*state = ended(q, base_cc) ? (q->state & ~0xffULL) | active_state : q->state;
	*id = q->id;
}

static __always_inline void charge_run(struct task_state *t, __u32 tid, __u64 state, __u64 id,
				       __u64 cpu, __u64 preempted)
{
	if (!cpu && !preempted)
		return;
	if (t->r_state != state || t->r_id != id) {
		flush_runs(t, tid);
		t->r_state = state;
		t->r_id = id;
	}
	t->r_cpu += cpu;
	t->r_rq2 += preempted;
}

static __always_inline void flush_between(struct task_state *t, __u32 tid)
{
	if (t->b_cpu || t->b_rq2)
		to_slot(t, tid, PAIR_RUN, t->b_state, 0, 0, t->b_cpu, t->b_rq2);
	t->b_cpu = t->b_rq2 = 0;
}

static __always_inline void charge_between(struct task_state *t, __u32 tid, __u64 state,
					   __u64 cpu, __u64 preempted)
{
	if (!cpu && !preempted)
		return;
	if (t->b_state != state) {
		flush_between(t, tid);
		t->b_state = state;
	}
	t->b_cpu += cpu;
	t->b_rq2 += preempted;
}

static __always_inline void charge_sleep(struct task_state *t, __u32 tid, __u64 wei,
					 __u64 slept, __u64 woken)
{
	if (!slept && !woken)
		return;
	__u64 id = t->qa_id;
	if (idle_state && (wei & 0xff00ffff) == 0x06000000 && ((wei >> 16) & 0xff) == idle_state)
		id = 0;	/* ClientRead between transactions: see idle_state */
	if (t->s_state != t->qa_state || t->s_id != id || t->s_wei != wei) {
		flush_sleeps(t, tid);
		t->s_state = t->qa_state;
		t->s_id = id;
		t->s_wei = wei;
	}
	t->s_wait += slept;
	t->s_rq3 += woken;
}

/*
 * The lock a sleep in a Lock wait event waits for, into lk (false: not readable, or
 * not queued on one): *MyProc (kept once set), then two reads, only at these sleeps.
 */
static __always_inline __u64 my_proc(struct task_state *t)
{
	__u64 p = t->proc_ptr;

	if (!p && !bpf_probe_read_user(&p, sizeof(p), (void *)proc_addr) && p)
		t->proc_ptr = p;
	return p;
}

static __always_inline bool read_lock(struct task_state *t, struct lock_id *lk)
{
	__u64 p = my_proc(t);
	struct proc_wait f;

	if (!p)
		return false;
	if (bpf_probe_read_user(&f, sizeof(f), (void *)(p + wait_lock_off)) || !f.lock)
		return false;
	if (bpf_probe_read_user(&lk->tag0, 2 * sizeof(__u64), (void *)f.lock))
		return false;
	lk->mode = (__u32)f.mode;
	lk->start = f.start;
	return true;
}

/* The lock wait under way to @lock_ns: another one begins, or the process ends. */
static __always_inline void flush_lock(struct task_state *t, __u32 tid)
{
	if (!t->w_sleeps)
		return;
	struct lock_key k = { tid, (__u32)t->w.mode, t->w.tag0, t->w.tag1 };
	struct lock_val *v = bpf_map_lookup_elem(&lock_ns, &k);
	if (!v) {
		struct lock_val zero = {};
		bpf_map_update_elem(&lock_ns, &k, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&lock_ns, &k);
		if (!v) {
			refused();	/* map full */
			return;
		}
	}
	/* only this task writes its keys: plain adds (pgprobe reads, never writes) */
	v->ns += t->w_ns;
	v->sleeps += t->w_sleeps;
	v->waits += 1;
	if (t->w_ns > v->max_ns)
		v->max_ns = t->w_ns;
	t->w_ns = 0;
	t->w_sleeps = 0;
}

/*
 * A sleep of `slept` ns in `wei` ends: charged to its lock when it waited for one. The same
 * wait when the lock, the mode and the wait's start are the wait under way's (a start
 * not set yet, 0, matches any: the same lock and mode, one after the other).
 */
static __always_inline void charge_lock(struct task_state *t, __u32 tid, __u64 wei,
					__u64 slept)
{
	if (!t->lk_ok || wei != t->a)
		return;	/* no lock read, or a sleep begun before the capture */
	struct lock_id *a = &t->lk, *w = &t->w;
	bool same = t->w_sleeps && a->tag0 == w->tag0 && a->tag1 == w->tag1 &&
		    a->mode == w->mode && (!a->start || !w->start || a->start == w->start);
	if (!same) {
		flush_lock(t, tid);
		t->w = t->lk;
	}
	if (!w->start)
		w->start = a->start;
	t->w_ns += slept;
	t->w_sleeps += 1;
}

/* An LWLock sleep's wait event with the mode waited for (lwmode_off), else as it is */
static __always_inline __u64 with_mode(struct task_state *t, __u64 wei)
{
	__u8 mode = 0;
	__u64 p;

	if (!lwmode_off || (wei >> 24) != WAIT_CLASS_LWLOCK || (wei & 0x00ff0000))
		return wei;
	p = my_proc(t);
	if (!p || bpf_probe_read_user(&mode, sizeof(mode), (void *)(p + lwmode_off)) || mode > 2)
		return wei;
	return wei | (__u64)(mode + 1) << 16;
}

/* *my_wait_event_info into wei (false: not readable) */
static __always_inline bool raw_wait_event(struct task_state *t, __u32 *wei)
{
	__u64 p = t->wei_ptr;

	if (!p) {
		if (bpf_probe_read_user(&p, sizeof(p), (void *)wei_addr) || !p)
			return false;
		if (local_wei && p != local_wei)
			t->wei_ptr = p;
	}
	return !bpf_probe_read_user(wei, sizeof(*wei), (void *)p);
}

/* The wait event the sleep begun is charged with: wei (ok: it was read), with st_state */
static __always_inline __u64 read_wait_event(struct task_state *t, struct query *q, bool ok,
					     __u32 wei)
{
	__u64 be = 0;
	__u32 st = 0;

	if (!ok)
		return 1;
	if (wei == 0x06000000 && be_addr) {
		/* Client:ClientRead: the backend's st_state in bits 16-23 (waits.bt) */
		if (q->ok)
			return wei | ((q->state & 0xff) << 16);	/* read with the statement */
		be = entry_of(t);
		if (be && !bpf_probe_read_user(&st, sizeof(st), (void *)(be + state_off)))
			return wei | ((__u64)(st & 0xff) << 16);
	}
	return wei;
}

/*
 * The part of a run (`len` ns from `from`) before the statement read at its end began
 * (act: st_activity_start_timestamp; the monotonic clock through pg_clock_ns), past
 * SPAN_MIN_NS: an earlier statement with no sleep and no mark between (Q_SPANNED).
 * Counted, not moved: see SPAN_MIN_NS.
 */
static __always_inline __u64 spanned(__u64 act, __u64 from, __u64 len)
{
	if (!act || !pg_clock_ns)
		return 0;
	__u64 began = act * 1000 - pg_clock_ns;
	if (began <= from || began - from <= SPAN_MIN_NS)
		return 0;
	return began - from < len ? began - from : len;
}

/*
 * A part of a run that ends at `end` in which a statement ended (q: idle, reports made):
 * its time after the backend reported idle, at most `cpu` (no preemption follows that
 * report in the part: it would have been a mark, which ends a part).
 */
static __always_inline __u64 after_report(struct query *q, __u64 end, __u64 cpu)
{
	if (!q->at || !pg_clock_ns || q->at * 1000 <= pg_clock_ns)
		return 0;
	__u64 at = q->at * 1000 - pg_clock_ns, after = end > at ? end - at : 0;
	return after < cpu ? after : cpu;
}

/*
 * The interval from the entry's `since` to now, on the kernel's counters: on CPU and in
 * a runqueue (before the first preemption: woken, not yet running; after it: preempted),
 * and the rest asleep: the sleep begun at `since`, in `a`. nv: the process's voluntary
 * switches now, this one's included; known: first_sleep(). pgprobe's compiled.py closes an open
 * interval the same way at a read (with slept_p when the entry has it); keep the
 * two alike.
 */
/* close_interval's scalars: a global function takes five arguments at most. */
struct closing {
	__u64 now, cpu, rd, nv, known, tail;
	__u32 tid;
};

/*
 * A global function: verified once, on its own, not at each of its paths through
 * on_switch (inlined, it was most of the verifier's ~0.34 s of CPU at each load).
 */
__noinline int close_interval(struct task_state *t, struct closing *c, struct query *q)
{
	if (!t || !c || !q)
		return 0;
	__u32 tid = c->tid;
	__u64 now = c->now, cpu = c->cpu, rd = c->rd, nv = c->nv, known = c->known;
	__u64 tail = c->tail;
	__u64 span = now > t->since ? now - t->since : 0, dcpu = cpu - t->cpu0;
	__u64 dq = rd - t->rd0, woken, slept, sleeps = nv - t->nv0, wei = t->a;

	if (tail) {
		/*
		 * The counters grew after `now`, the process's end (on_exit): `tail` ns on CPU
		 * or runnable while the kernel tore it down. Not its time: from its CPU first,
		 * the rest from its runqueue time (a split the counters cannot tell).
		 */
		__u64 cut = tail < dcpu ? tail : dcpu;
		dcpu -= cut;
		tail -= cut;
		dq -= tail < dq ? tail : dq;
	}
	if (known && span > dq + known - 1 && span - dq - (known - 1) > dcpu)
		dcpu = span - dq - (known - 1);	/* its runs' wall time (first_sleep) */
	if (dcpu > span)
		dcpu = span;
	if (dq > span - dcpu)
		dq = span - dcpu;
	woken = t->rd_p && t->rd_p - 1 - t->rd0 < dq ? t->rd_p - 1 - t->rd0 : dq;
	slept = span - dcpu - dq;
	t->cpu += dcpu;
	t->runq3 += woken;
	t->runq2 += dq - woken;
	if (query_span) {
		/*
		 * The run to the statement it ran (run_key); the runqueue time right after the
		 * wakeup to the sleep it ends (as pg_stat_activity shows it: its wait event still
		 * set, a ClientRead's state still idle); the sleep below to the statement read
		 * when it began.
		 */
		__u64 rs, rid, run = dcpu + dq - woken, from = now - run, cpu_l = dcpu;
		__u64 pre_l = dq - woken;
		if (t->mk_ns) {
			/* split at marks: the first's part now, those between marks charged */
			__u64 w1 = t->f_ns > from ? t->f_ns - from : 0, q1 = t->f_rd - t->rd0;
			w1 = w1 < run ? w1 : run;
			q1 = q1 > woken ? q1 - woken : 0;
			q1 = q1 < w1 ? q1 : w1;
			q1 = q1 < pre_l ? q1 : pre_l;
			__u64 c1 = w1 - q1 < cpu_l ? w1 - q1 : cpu_l;
			charge_run(t, tid, t->f_state, t->f_id, c1, q1);
			t->span += spanned(t->f_act, from, w1);
			cpu_l -= c1;
			pre_l -= q1;
			cpu_l = cpu_l > t->mk_cpu ? cpu_l - t->mk_cpu : 0;
			pre_l = pre_l > t->mk_pre ? pre_l - t->mk_pre : 0;
			from = t->mk_ns;
			run_key(t->mk_state, t->mk_id, t->mk_cc, q, &rs, &rid);
			if (q->ok && q->cc != t->mk_cc)
				t->span += spanned(q->act, from, now > from ? now - from : 0);
		} else {
			run_key(t->qa_state, t->qa_id, t->cc0, q, &rs, &rid);
			if (q->ok && q->cc != t->cc0)
				t->span += spanned(q->act, from, run);
		}
		__u64 idle = ended(q, t->mk_ns ? t->mk_cc : t->cc0) ? after_report(q, now, cpu_l) : 0;
		if (t->mk_ns && !(q->ok && q->cc != t->mk_cc))
			charge_between(t, tid, rs, cpu_l, pre_l);	/* all after the mark */
		else
			charge_run(t, tid, rs, rid, cpu_l - idle, pre_l);
		charge_between(t, tid, q->state, idle, 0);
		charge_sleep(t, tid, t->a, 0, woken);
	}
	if (t->state == SEEDED_ASLEEP || t->state == SEEDED_RUNNING) {
		/*
		 * Its first sleep seen since the seed. Slept in `a` if asleep then and no other
		 * sleep began since (one this program missed); else unknown, begun before.
		 */
		if (sleeps != 1 || t->state == SEEDED_RUNNING) {
			if (sleeps == 1)
				return 0;	/* running at the seed: the clocks' difference */
			wei = BEFORE_CAPTURE;
		}
	} else if (sleeps != 1) {
		/* a sleep not seen (the kernel skipped this program): not charged, said */
		if (sleeps > 1)
			add2(&unseen, 3, tid, sleeps - 1);
		return 0;
	} else if (t->state != ASLEEP) {
		return 0;	/* forked: no sleep before this one */
	}
	if (!slept)
		return 0;
	/* to the running total of the last wait event; to the maps when it changes */
	if (t->wei != wei)
		flush(t, tid);
	t->wait += slept;
	t->wait_rq += woken;
	t->wei = wei;
	if (query_span)
		charge_sleep(t, tid, wei, slept, 0);
	if (wait_lock_off)
		charge_lock(t, tid, wei, slept);
	if (t->state == ASLEEP) {	/* a whole sleep, seen from its start: with its woken part */
		__u32 slot = log2_slot(slept + woken);
		t->hist[slot]++;
		t->hist_used |= 1ULL << slot;
	}
	return 0;
}

/*
 * The sleep begun at `since`, measured at the switch-out that ends the first run after
 * it (the first preemption's, else the sleep's own): the time since `since` less that
 * run's wall time (last_arrival to now, on the runqueue's clock) and the wait for a CPU
 * before it (run_delay's growth, rd), +1; 0 when the run was not seen from its start.
 * What is left of the interval past the sleep and the runqueue waits is on CPU:
 * sum_exec_runtime leaves out what the hypervisor took (steal) and, with IRQ time
 * accounting, interrupts, but the process was on its CPU then all the same (waits.bt's
 * clock and pg_stat_statements' count it), and that time must not go to the sleep.
 */
static __always_inline __u64 first_sleep(struct task_state *t, struct task_struct *p,
					 __u64 now, __u64 rd)
{
	if (t->state != ASLEEP && t->state != STARTED)
		return 0;
	__u64 arrived = p->sched_info.last_arrival;
	__u64 clock = p->se.cfs_rq->rq->clock;	/* this CPU's, updated for this switch */
	if (!arrived || clock <= arrived)
		return 0;
	__u64 before = clock - arrived + (rd > t->rd0 ? rd - t->rd0 : 0);
	__u64 span = now > t->since ? now - t->since : 0;
	return span > before ? span - before + 1 : 1;
}

/*
 * A backend preempted (or yielding) between statements, having reported since its last
 * sleep or mark (its change count moved; idle or idle in transaction now): a statement
 * ended in this run, a mark. A run that spans statements with no sleep between them (the
 * client's next message already there when the backend asks for it: 3 statements in 4
 * under pgbench TPC-B on 2 CPUs, the backend preempted by the client its result woke) is
 * split at these marks: the part since the last mark (wall time; runqueue time from
 * run_delay) to the statement that ended now; the part before the first mark at the
 * switch-out, which knows where the run began. Statements run with neither a sleep nor a
 * preemption between them stay in one part, counted (Q_SPANNED). A preemption within a
 * statement marks nothing: its run goes on to the statement's end.
 */
static __always_inline void mark(struct task_state *t, __u32 tid, __u64 rd)
{
	struct query q;
	read_query(entry_of(t), &q);
	if (!ended(&q, t->mk_ns ? t->mk_cc : t->cc0))
		return;	/* nothing reported since, or within a statement */
	__u64 now = bpf_ktime_get_ns(), state, id;
	if (t->mk_ns) {
		run_key(t->mk_state, t->mk_id, t->mk_cc, &q, &state, &id);
		__u64 wall = now > t->mk_ns ? now - t->mk_ns : 0;
		__u64 pre = rd > t->mk_rd ? rd - t->mk_rd : 0;
		pre = pre < wall ? pre : wall;
		__u64 idle = after_report(&q, now, wall - pre);
		charge_run(t, tid, state, id, wall - pre - idle, pre);
		charge_between(t, tid, q.state, idle, 0);
		t->span += spanned(q.act, t->mk_ns, wall);
		t->mk_cpu += wall - pre;
		t->mk_pre += pre;
	} else {
		run_key(t->qa_state, t->qa_id, t->cc0, &q, &state, &id);
		/*
		 * The first part, from the run's start (known at the switch-out), ends at the
		 * idle report; what follows it to here is charged now, as the marks' parts are.
		 */
		__u64 idle = after_report(&q, now, now > t->since ? now - t->since : 0);
		charge_between(t, tid, q.state, idle, 0);
		t->mk_cpu = idle;
		t->f_ns = now - idle;
		t->f_rd = rd;
		t->f_state = state;
		t->f_id = id;
		t->f_act = q.act;
	}
	t->mk_ns = now;
	t->mk_rd = rd;
	t->mk_cc = q.cc;
	/* what follows the mark, while nothing more is reported: between statements */
	t->mk_state = q.state;
	t->mk_id = 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	if (prev->pid == 0 || !ours(prev))
		return 0;	/* most switches of a busy machine: not a process of ours */
	struct task_state *t = bpf_task_storage_get(&task, prev, 0, 0);

	if (preempt || prev_state == 0) {
		/*
		 * Preempted (or yielding): still runnable, its wait for a CPU is in run_delay.
		 * Only the first one since `since` matters for the split; a sleep aborted by a
		 * pending signal also comes here, counted as a voluntary switch: not a sleep.
		 */
		if (t) {
			__u64 rd = prev->sched_info.run_delay;
			if (!t->rd_p) {
				t->rd_p = rd + 1;
				t->slept_p = first_sleep(t, prev, bpf_ktime_get_ns(), rd);
			}
			if (!preempt)
				t->nv0 = prev->nvcsw;
			if (query_span && be_addr)
				mark(t, prev->pid, rd);
		}
		return 0;
	}

	__u64 now = bpf_ktime_get_ns(), cpu = prev->se.sum_exec_runtime;
	__u64 rd = prev->sched_info.run_delay, nv = prev->nvcsw;
	__u32 tid = prev->pid;
	__u64 end = now;	/* of its life: its exit (on_exit) for its final switch-out */
	bool dead = prev->exit_state & EXIT_ZOMBIE_OR_DEAD;

	if (dead) {
		__u64 *exited = bpf_map_lookup_elem(&exit_ns, &tid);
		if (exited && *exited <= now)
			end = *exited;
		else
			set(&exit_ns, tid, now);	/* its exit not seen (attached since) */
	}
	struct query q = { 0, Q_NO_ENTRY, 0, 0, 0, false };
	__u32 wei = 0;
	bool wei_read = false, wei_ok = false;
	/* one call of close_interval for the three ways in (below) */
	bool closing = false;
	__u64 known = 0;
	if (t) {
		if (query_span && !dead) {
			wei_ok = raw_wait_event(t, &wei);
			wei_read = true;
			read_query(be_addr ? entry_of(t) : 0, &q);
		}
		if (query_span && dead) {
			/* its memory is gone: the statement read at its proc_exit() */
			struct query *x = bpf_map_lookup_elem(&exit_query, &tid);
			if (x) {
				q = *x;
				bpf_map_delete_elem(&exit_query, &tid);
			}
		}
		known = t->rd_p ? t->slept_p : first_sleep(t, prev, now, rd);
		closing = true;
	} else {
		/*
		 * Not seeded yet, its fork not seen: from @start (counters at the window's
		 * start); born after the window's start but before the attach, from its birth
		 * (task->start_time, the monotonic clock; a new task's counters start at 0);
		 * else from here.
		 */
		t = bpf_task_storage_get(&task, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!t) {
			refused();
			return 0;
		}
		if (query_span && !dead)
			read_query(be_addr ? entry_of(t) : 0, &q);
		struct start_state *s = bpf_map_lookup_elem(&start, &tid);
		__u32 w = WINDOW_NS;
		__u64 *window = bpf_map_lookup_elem(&scalars, &w);
		__u64 born = prev->start_time;
		if (s && window && *window && *window < now) {
			t->since = *window;
			t->state = s->state;
			t->a = BEFORE_CAPTURE;
			t->cpu0 = s->cpu0;
			t->rd0 = s->rd0;
			t->nv0 = s->nv0;
			closing = true;
		} else if (window && *window && *window < born && born < now && !only_pid) {
			set(&born_ns, tid, born);
			t->since = born;
			t->state = STARTED;
			closing = true;
		}
	}
	if (closing) {
		struct closing c = { end, cpu, rd, nv, known, now - end, tid };
		close_interval(t, &c, &q);
	}
	if (dead) {
		/* its final switch-out: running totals to the maps (its end is in @exit_ns) */
		add(&cpu_ns, &tid, t->cpu);
		add2(&runq_ns, tid, 2, t->runq2);
		add2(&runq_ns, tid, 3, t->runq3);
		flush(t, tid);
		if (wait_lock_off)
			flush_lock(t, tid);
		if (query_span) {
			flush_runs(t, tid);
			flush_sleeps(t, tid);
			flush_between(t, tid);
			for (__u32 i = 0; i < QSLOTS; i++)
				evict(&t->slots[i], tid);
			if (t->span) {
				struct qslot spanned = { PAIR_RUN << 16 | Q_SPANNED, 0, 0, t->span, 0 };
				evict(&spanned, tid);
			}
		}
		bpf_task_storage_delete(&task, prev);
		return 0;
	}
	t->since = now;
	t->state = ASLEEP;
	if (!wei_read)
		wei_ok = raw_wait_event(t, &wei);
	t->a = with_mode(t, read_wait_event(t, &q, wei_ok, wei));
	t->lk_ok = wait_lock_off && (t->a >> 24) == WAIT_CLASS_LOCK && read_lock(t, &t->lk);
	t->qa_state = q.state;
	t->qa_id = q.id;
	t->cc0 = q.cc;
	t->rd_p = 0;
	t->slept_p = 0;
	t->mk_ns = t->mk_cpu = t->mk_pre = 0;
	t->cpu0 = cpu;
	t->rd0 = rd;
	t->nv0 = nv;
	return 0;
}

/*
 * A process's end: sched_process_exit, when do_exit has released its memory. It still
 * runs until its final switch-out (files, its parent told: 1-30 ms measured under a
 * churn of connections), which is the kernel's work, no more the process's: on_switch
 * leaves it out. Only once: a task's threads are not ours (PostgreSQL has none).
 */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	if (p->pid == p->tgid && ours(p))
		set(&exit_ns, p->pid, bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	/* A child of the postmaster is ours from birth: its counters start here. */
	if (parent->pid == postmaster && only_pid == 0) {
		__u64 now = bpf_ktime_get_ns();
		struct task_state *n = bpf_task_storage_get(&task, child, 0,
							    BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!n) {
			refused();
			return 0;
		}
		n->since = now;
		n->state = STARTED;
		n->cpu0 = child->se.sum_exec_runtime;
		n->rd0 = child->sched_info.run_delay;
		n->nv0 = child->nvcsw;
		set(&born_ns, child->pid, now);
	}
	return 0;
}

/*
 * The query dimension's exit program: the entry of a process of ours whose status entry's
 * address is known (NULL: none, or the dimension is off).
 */
static __always_inline struct task_state *query_task(struct task_struct *p)
{
	if (!query_span || !ours(p))
		return NULL;
	struct task_state *t = bpf_task_storage_get(&task, p, 0, 0);
	/*
	 * The entry's address is kept at a switch-out into a sleep; a backend that has not
	 * slept since it set it (one that never waits for its client: all it ran then went to
	 * no statement, the CI's flaky burner) reads it here, in its own context.
	 */
	return t && (t->be_ptr || entry_of(t)) ? t : NULL;
}

/*
 * A backend's exit (proc_exit(), a uprobe: it runs in the server's processes only, where a
 * system call tracepoint would slow every system call of the host): its memory is still
 * there, not at its final switch-out, where its last run is charged: the statement read
 * here, for that run (a backend that reads its client's Terminate with no sleep after its
 * last statement). A process that ends without proc_exit() (killed; _exit() at an
 * immediate shutdown) has its last run charged as if it had reported nothing.
 */
SEC("uprobe")
int on_proc_exit(void *ctx)
{
	struct task_struct *p = bpf_get_current_task_btf();
	struct task_state *t = query_task(p);
	if (!t)
		return 0;
	__u32 tid = p->pid;
	struct query q;
	read_query(t->be_ptr, &q);
	if (q.ok)
		bpf_map_update_elem(&exit_query, &tid, &q, BPF_ANY);
	/*
	 * Its slots' totals to @query_ns now, while its entry is sure to be there: its final
	 * switch-out then moves only what its last runs add (a task storage call can fail
	 * there, under the storage's per-CPU busy guard, and the entry goes with the task).
	 */
	for (__u32 i = 0; i < QSLOTS; i++) {
		evict(&t->slots[i], tid);
		t->slots[i].a = t->slots[i].b = 0;
	}
	t->q_next++;
	return 0;
}
