// SPDX-License-Identifier: GPL-2.0
/*
 * waits.bpf.c - bpf/waits.bt compiled: where each PostgreSQL process's time goes,
 *               exactly (on CPU, waiting for a CPU, off CPU in each wait event), at a
 *               fraction of the script's cost per context switch.
 *
 * The same model, the same maps and the same states as bpf/waits.bt (read its header
 * for what each map means); only the attach points and the way tasks are read differ:
 *   - raw BTF tracepoints (tp_btf/sched_switch, ...): the program gets the kernel's own
 *     arguments, with no perf record filled for it (the classic tracepoints' ~350 ns
 *     per switch on our AMD host, which bpftrace 0.17 cannot avoid);
 *   - task_struct fields are plain loads (BTF-typed pointers, CO-RE relocated to the
 *     running kernel), not a helper call each;
 *   - a task that is not the cluster's is recognised from its own fields at every event,
 *     so it never gets a map entry (waits.bt keeps a "not ours" entry per task, looked up
 *     at every switch);
 *   - map values are updated in place (one lookup; bpftrace writes the whole value back);
 *   - no sched_wakeup program: when a sleep ends (its switch-in), the time it then spent
 *     in a runqueue is the kernel's own count (sched_info: run_delay and last_queued,
 *     schedstat's second field), so the time off CPU splits between the wait event and
 *     the runqueue without a probe on every wakeup of the machine (end_sleep).
 * pgprobe reads the maps itself (pgprobe/engines/libbpf.py): no interval or answer
 * probe, and a window ends the moment pgprobe reads them.
 *
 * USAGE: not run by hand: scripts/build-bpf compiles it (clang -target bpf) into
 *   bpf/build/waits.bpf.o, and `pgprobe waits` (and triage, lwlocks' fallback, serve)
 *   loads it with the system's libbpf when it is built and loads here, else runs
 *   bpf/waits.bt (the form to read and run by hand). Its parameters are waits.bt's
 *   $1, $2, $4, $5, $6 as `const volatile` globals below, set by pgprobe before load.
 *
 * EXAMPLE:
 *   # scripts/build-bpf && pgprobe waits -d 5 --engine libbpf
 *   (a real run: samples/waits_libbpf_example.txt)
 *
 * Part of pgprobe.
 */

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

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
	__u64 prev_sum_exec_runtime;
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));

struct sched_info {
	unsigned long pcount;
	unsigned long long run_delay;
	unsigned long long last_queued;
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int flags;
	int exit_state;
	pid_t pid;
	pid_t tgid;
	struct task_struct *real_parent;
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

#define PF_EXITING 0x4
#define MAX_TASKS 65536

/*
 * @task states (waits.bt's numbers). Without a wakeup program WOKEN is a forked task's
 * only, and PENDING_WOKEN (woken from before the capture) is waits.bt's only.
 */
enum { UNKNOWN, ON_CPU, PREEMPTED, WOKEN, ASLEEP, PENDING_WOKEN, PENDING_ON_CPU,
       LOST_TRACK, PENDING_LOST_TRACK };

struct task_state {	/* waits.bt's @task tuple, field for field, then three of its own */
	__u64 since, state, a, b, cpu, runq2, runq3, wei, wait;
	__u64 wei_ptr, be_ptr;	/* my_wait_event_info's and MyBEEntry's values, once set */
	__u64 run_delay;	/* the kernel's runqueue total when it last went to sleep */
};
struct tid_u32 {
	__u32 tid, n;
};
struct hist_key {
	__u32 tid, wei, slot, pad;
};
struct cpu_last {
	__u64 tid, when;
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

/* kfuncs (Linux 6.2+): a task by pid, for the rare check of a CPU's chain of switches */
extern struct task_struct *bpf_task_from_pid(__s32 pid) __ksym;
extern void bpf_task_release(struct task_struct *p) __ksym;
HASH(cpu_ns, __u32, __u64);
HASH(runq_ns, struct tid_u32, __u64);	/* (tid, how) */
HASH(wait_ns, struct tid_u32, __u64);	/* (tid, wait_event_info) */
HASH(wait_hist, struct hist_key, __u64);	/* (tid, wei, log2 slot) -> sleeps */
HASH(born_ns, __u32, __u64);
HASH(exit_ns, __u32, __u64);
HASH(first_runs, __u32, __u64);
HASH(unseen, struct tid_u32, __u64);	/* (kind, tid) */

/*
 * [0] window_ns: when the capture began (pgprobe writes it before attaching);
 * [1] gap_ns (waits.bt's @gap_ns); [2] map updates refused (a map full), said by pgprobe;
 * [3] read_ns: when pgprobe last read the maps (it writes it first; see end_sleep)
 */
enum { WINDOW_NS, GAP_NS, REFUSED, READ_NS };
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} scalars SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_last);
} cpu_last SEC(".maps");

static __always_inline bool ours(struct task_struct *t)
{
	if (only_pid)
		return t->tgid == only_pid;
	return t->tgid == postmaster || t->real_parent->tgid == postmaster;
}

static __always_inline __u64 scalar(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&scalars, &i);
	return v ? *v : 0;
}

static __always_inline void refused(void)
{
	__u32 i = REFUSED;
	__u64 *v = bpf_map_lookup_elem(&scalars, &i);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline void create(struct task_struct *p, struct task_state *n)
{
	if (!bpf_task_storage_get(&task, p, n, BPF_LOCAL_STORAGE_GET_F_CREATE))
		refused();
}

static __always_inline void insert(void *map, void *key, void *value)
{
	if (bpf_map_update_elem(map, key, value, BPF_ANY))
		refused();
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

static __always_inline void set(void *map, __u32 tid, __u64 value)
{
	insert(map, &tid, &value);
}

/* hist(): the log2 slot of v (0 for 0; k for 2^(k-1) <= v < 2^k) */
static __always_inline void hist(__u32 tid, __u32 wei, __u64 v)
{
	__u32 slot = 0;
	if (v) {
		slot = 1;
		if (v >> 32) { v >>= 32; slot += 32; }
		if (v >> 16) { v >>= 16; slot += 16; }
		if (v >> 8) { v >>= 8; slot += 8; }
		if (v >> 4) { v >>= 4; slot += 4; }
		if (v >> 2) { v >>= 2; slot += 2; }
		if (v >> 1) { slot += 1; }
	}
	struct hist_key k = { tid, wei, slot, 0 };
	add(&wait_hist, &k, 1);
}

/*
 * Write a task's entry: in place when it exists (a hash update allocates and swaps an
 * element: ~600 ns on our AMD host against ~200 for the lookup), inserted when not.
 */
static __always_inline void put(struct task_struct *p, struct task_state *t, bool exists,
				__u64 since, __u64 state, __u64 a, __u64 b)
{
	if (exists) {
		t->since = since;
		t->state = state;
		t->a = a;
		t->b = b;
		return;
	}
	struct task_state n = { since, state, a, b, t->cpu, t->runq2, t->runq3, t->wei, t->wait,
				t->wei_ptr, t->be_ptr, t->run_delay };
	create(p, &n);
}

/*
 * The classic tracepoint's prev_state (__trace_sched_switch_state): the highest
 * TASK_REPORT bit of the task's state and exit state; TASK_REPORT_MAX (0x100) when
 * preempted. waits.bt's tests on it (& 0xff, & 0x30) then mean the same here.
 */
static __always_inline __u64 report_state(bool preempt, unsigned int state, struct task_struct *p)
{
	if (preempt)
		return 0x100;
	if (state == 0x402)	/* TASK_IDLE */
		return 0x80;
	if (state == 0x1000)	/* TASK_RTLOCK_WAIT */
		return 0x2;
	__u32 s = (state | p->exit_state) & 0x7f;
	__u32 top = 0;
	for (int bit = 6; bit >= 0; bit--) {
		if (s & (1u << bit)) {
			top = 1u << bit;
			break;
		}
	}
	return top;
}

/* The kernel's run length bounds what is charged on CPU (waits.bt, "The kernel's own count"). */
static __always_inline bool longer_than_run(__u64 span, __u64 run, struct task_struct *p)
{
	return span > run + 250000 + span / 16 && !(p->flags & PF_EXITING);
}

/* On CPU since the switch-in seen: that span, or the kernel's run when events were lost */
static __always_inline __u64 run_since(__u64 now, __u64 since, __u64 run, __u32 prev,
				       struct task_struct *p)
{
	__u64 span = now - since;

	if (longer_than_run(span, run, p)) {
		add2(&unseen, 1, prev, 1);
		return run;
	}
	return span;
}

/*
 * The wait event the process published: *my_wait_event_info. A read of user memory costs
 * ~190 ns here (bpf_probe_read_user), so the pointers, which a process sets once (to its
 * PGPROC's field, to its PgBackendStatus), are kept in its state once they hold those:
 * one read per sleep instead of two (four for ClientRead). After a backend released its
 * PGPROC at exit, a sleep still reads that slot (0, "no wait event", unless reused).
 */
static __always_inline __u64 read_wait_event(struct task_state *t)
{
	__u64 p = t->wei_ptr, be = t->be_ptr;
	__u32 wei = 0, st = 0;

	if (!p) {
		if (bpf_probe_read_user(&p, sizeof(p), (void *)wei_addr) || !p)
			return 1;
		if (local_wei && p != local_wei)
			t->wei_ptr = p;
	}
	if (bpf_probe_read_user(&wei, sizeof(wei), (void *)p))
		return 1;
	if (wei == 0x06000000 && be_addr) {
		/* Client:ClientRead: the backend's st_state in bits 16-23 (waits.bt) */
		if (!be && !bpf_probe_read_user(&be, sizeof(be), (void *)be_addr) && be &&
		    local_wei)
			t->be_ptr = be;
		if (be && !bpf_probe_read_user(&st, sizeof(st), (void *)(be + state_off)))
			return wei | ((__u64)(st & 0xff) << 16);
	}
	return wei;
}

static __always_inline void switch_out(__u64 now, __u32 prev, __u64 state, struct task_struct *p)
{
	struct task_state *t = bpf_task_storage_get(&task, p, 0, 0);
	struct task_state z = {};
	__u64 run = p->se.sum_exec_runtime - p->se.prev_sum_exec_runtime;
	__u64 span;

	if (!t)
		t = &z;	/* waits.bt: an absent key reads as zeros */
	__u64 oncpu = t->cpu;
	if (t->state == ON_CPU) {
		oncpu += run_since(now, t->since, run, prev, p);
	} else if (t->state == PENDING_ON_CPU || t->state == PENDING_LOST_TRACK) {
		if (t->state == PENDING_ON_CPU)
			oncpu += run_since(now, t->since, run, prev, p);
		if (t->a > 0 || t->b > 0)
			set(&first_runs, prev, p->sched_info.pcount);
		if (t->a > 0)
			add2(&wait_ns, prev, 2, t->a);
		add2(&runq_ns, prev, t->a > 0 ? 3 : 4, t->b);
	} else if (t->state == UNKNOWN && scalar(WINDOW_NS) > 0) {
		span = now - scalar(WINDOW_NS);
		if (longer_than_run(span, run, p)) {
			add2(&unseen, 2, prev, 1);
			add2(&wait_ns, prev, 2, span - run);
			set(&first_runs, prev, p->sched_info.pcount);
			span = run;
		}
		oncpu += span;
	} else if (t->state >= PREEMPTED && t->state <= ASLEEP) {
		add2(&unseen, 1, prev, 1);	/* its switch-in was lost: that interval is lost */
	}

	if (state & 0x30) {
		/* exiting: its end is this final switch-out; running totals to the maps */
		set(&exit_ns, prev, now);
		add(&cpu_ns, &prev, oncpu);
		add2(&runq_ns, prev, 2, t->runq2);
		add2(&runq_ns, prev, 3, t->runq3);
		if (t->wait > 0)
			add2(&wait_ns, prev, (__u32)t->wei, t->wait);
		bpf_task_storage_delete(&task, p);
		return;
	}
	t->cpu = oncpu;
	if (state & 0xff) {
		t->run_delay = p->sched_info.run_delay;
		put(p, t, t != &z, now, ASLEEP, read_wait_event(t), 0);
	} else
		put(p, t, t != &z, now, PREEMPTED, 0, 0);
}

/*
 * How long this task waited in a runqueue since its run_delay in n was read (since_known:
 * when it went to sleep, or pgprobe's seed) or, without that, since it was last queued:
 * what the kernel adds to its run_delay (the second field of /proc/PID/schedstat) when it
 * switches in, right after this tracepoint, plus what it added already (a task moved to
 * another CPU's queue gets its time on the first queue then). On the kernel's rq clock,
 * as schedstat.
 */
static __always_inline __u64 queued(struct task_struct *p, struct task_state *n, bool since_known)
{
	__u64 q = since_known ? p->sched_info.run_delay - n->run_delay : 0;
	__u64 last = p->sched_info.last_queued;

	if (last) {
		__u64 clock = p->se.cfs_rq->rq->clock;	/* this CPU's, updated for this switch */
		if (clock > last)
			q += clock - last;
	}
	return q;
}

/*
 * The end of a sleep: its time off CPU split between the wait event it slept in and the
 * runqueue after its wakeup, from the kernel's own count (queued()): no wakeup probe.
 * What pgprobe read as this wait event's (an open sleep is charged to it up to the read)
 * stays there, so that no total shrinks from one read to the next.
 */
static __always_inline void end_sleep(__u64 now, __u32 next, struct task_struct *nt,
				      struct task_state *n)
{
	__u64 off = now - n->since, q = queued(nt, n, true), read = scalar(READ_NS);
	__u64 runq, after_read = now > read ? now - read : 0;

	if (q > off)
		q = off;
	runq = read > n->since && q > after_read ? after_read : q;
	hist(next, (__u32)n->a, off - q);
	/* to the running total of the last wait event; to @wait_ns when it changes */
	__u64 pn = n->wait;
	if (pn > 0 && n->wei != n->a) {
		add2(&wait_ns, next, (__u32)n->wei, pn);
		pn = 0;
	}
	n->wait = pn + off - runq;
	n->wei = n->a;
	n->runq3 += runq;
}

static __always_inline void switch_in(__u64 now, __u32 next, struct task_struct *nt)
{
	struct task_state *n = bpf_task_storage_get(&task, nt, 0, 0);
	struct task_state z = {};
	bool exists = n != 0;

	if (!n)
		n = &z;
	switch (n->state) {
	case ON_CPU:
		add2(&unseen, 3, next, 1);	/* its switch-out was not seen */
		/* fallthrough */
	case LOST_TRACK:
		put(nt, n, exists, now, ON_CPU, 0, 0);
		break;
	case PENDING_LOST_TRACK:
		put(nt, n, exists, now, PENDING_ON_CPU, n->a, n->b);
		break;
	case PREEMPTED:
		n->runq2 += now - n->since;
		put(nt, n, exists, now, ON_CPU, 0, 0);
		break;
	case WOKEN:	/* forked: runnable since */
		n->runq3 += now - n->since;
		put(nt, n, exists, now, ON_CPU, 0, 0);
		break;
	case ASLEEP:
		end_sleep(now, next, nt, n);
		put(nt, n, exists, now, ON_CPU, 0, 0);
		break;
	case UNKNOWN: {
		/*
		 * Off CPU since before the capture: queued for queued() (runnable at its start
		 * if that is longer: @runq_ns's RUNNABLE_AT_START), asleep before. pgprobe
		 * seeded the entry of each process it found with its schedstat (b: run count
		 * + 1; run_delay): if it has not run since, its queued time counts from there,
		 * also a part spent on another CPU's queue before it was moved.
		 */
		__u64 w0 = scalar(WINDOW_NS), span = w0 > 0 ? now - w0 : 0;
		bool seeded = exists && n->b && n->b - 1 == nt->sched_info.pcount;
		__u64 q = queued(nt, n, seeded);
		if (q > span)
			q = span;
		put(nt, n, exists, now, PENDING_ON_CPU, span - q, q);
		break;
	}
	}
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u32 key = 0;
	bool prev_ours = prev->pid != 0 && ours(prev);
	bool next_ours = next->pid != 0 && ours(next);
	struct cpu_last *c = bpf_map_lookup_elem(&cpu_last, &key);

	if (!c || (!prev_ours && !next_ours && c->tid == 0))
		return 0;	/* most switches of a busy machine: none of ours, nothing to check */
	__u64 now = bpf_ktime_get_ns();

	/*
	 * A break in this CPU's chain of switches (waits.bt): the task of ours last switched
	 * in here is still "on CPU since when" while another task leaves the CPU.
	 */
	if (c->tid != 0 && c->tid != (__u64)prev->pid) {
		__u32 lt = c->tid;
		struct task_struct *lost = bpf_task_from_pid(lt);
		if (lost) {
			struct task_state *l = bpf_task_storage_get(&task, lost, 0, 0);
			if (l && l->since == c->when &&
			    (l->state == ON_CPU || l->state == PENDING_ON_CPU)) {
				add2(&unseen, 4, lt, 1);
				__u32 gi = GAP_NS;
				__u64 *gap = bpf_map_lookup_elem(&scalars, &gi);
				if (gap)
					__sync_fetch_and_add(gap, now - c->when);
				l->state = l->state == ON_CPU ? LOST_TRACK : PENDING_LOST_TRACK;
			}
			bpf_task_release(lost);
		}
		c->tid = 0;
		c->when = 0;
	} else if (c->tid != 0) {
		c->tid = 0;	/* its switch-out is this one: seen, nothing to check later */
		c->when = 0;
	}
	if (prev_ours)
		switch_out(now, prev->pid, report_state(preempt, prev_state, prev), prev);
	if (next_ours) {
		switch_in(now, next->pid, next);
		c->tid = next->pid;
		c->when = now;
	}
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	/* A child of the postmaster is ours from birth (a new task has no state yet). */
	if (parent->pid == postmaster && only_pid == 0) {
		__u64 now = bpf_ktime_get_ns();
		struct task_state n = { now, WOKEN };
		create(child, &n);
		set(&born_ns, child->pid, now);
	}
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	struct task_state *x = bpf_task_storage_get(&task, p, 0, 0);

	if (!x)
		return 0;
	if ((x->state >= ON_CPU && x->state <= ASLEEP) || x->state == LOST_TRACK)
		set(&exit_ns, p->pid, bpf_ktime_get_ns());
	else
		bpf_task_storage_delete(&task, p);
	return 0;
}
