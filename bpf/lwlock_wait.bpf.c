// SPDX-License-Identifier: GPL-2.0
/*
 * lwlock_wait.bpf.c - bpf/lwlock_wait.bt compiled: every LWLock wait timed by PostgreSQL's
 *                     own probes, per tranche and mode (and per pid when asked).
 *
 * The USDT probes lwlock__wait__start and lwlock__wait__done (PostgreSQL 13+ built with
 * --enable-dtrace), attached by libbpf's USDT support: the same fires, filter, keys and
 * figures as the script (count, total, max and a log2 histogram of each wait in ns, the
 * waits that started and never ended, every fire counted for the guard), in a program
 * pgprobe loads itself: no bpftrace process, its probes in within milliseconds.
 *
 * USAGE: not run by hand: scripts/build-bpf compiles it into bpf/build/lwlock_wait.bpf.o,
 *   and `pgprobe lwlocks --source usdt` (triage on 13 too) loads it with the system's
 *   libbpf when it is built and loads here, else runs bpf/lwlock_wait.bt (the form to
 *   read and run by hand). The script's $2, $3 and $5 are `const volatile` globals here;
 *   its interval and guard are pgprobe's work (pgprobe/tools/lwlocks/compiled.py): it
 *   flips `scalars[BUF]` at each window (two buffers, as the script's maps and their _b
 *   twins) and sets `scalars[STOPPED]` when the guard stops the capture.
 *
 * MAPS: @waits (pid or 0, mode, buffer, CPU, tranche) -> count, total, max, hist: per CPU
 *   (the key's cpu), so that a wait's max is never raced by another CPU's; pgprobe adds
 *   the CPUs up. scalars: FIRES, WAITS, UNFINISHED (per buffer), REFUSED, BUF, STOPPED.
 *
 * EXAMPLE:
 *   # scripts/build-bpf && pgprobe lwlocks --source usdt -d 10
 *
 * Part of pgprobe.
 */

#include <stdbool.h>	/* usdt.bpf.h's */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/usdt.bpf.h>

#include "ours.h"
#include "scalars.h"
#include "hist.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 by_pid = 0;	/* $3: key every wait by its pid too (else pid 0) */

#define TRANCHE_MAX 64	/* bytes of the tranche's name: bpftrace's str() default */

struct wait_key {
	__u32 pid;
	__u32 mode;	/* LWLockMode: 0 Exclusive, 1 Shared, 2 WaitUntilFree */
	__u32 buf;
	__u32 cpu;
	char tranche[TRANCHE_MAX];
};

struct wait_val {
	__u64 count, total, max;
	__u64 hist[HIST_SLOTS];	/* slot 0: 0 ns; slot k: 2^(k-1) .. 2^k - 1 */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct wait_key);
	__type(value, struct wait_val);
} waits SEC(".maps");

/* tid -> the start of its wait under way */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} started SEC(".maps");

/* a zeroed value to make an entry from (a struct wait_val is too big for the stack) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wait_val);
} empty SEC(".maps");

#define FIRES 0		/* the targets' fires: starts, and dones of a start seen */
#define WAITS 1		/* the dones counted */
#define UNFINISHED 2	/* 2 + buffer: a start whose thread's last wait never ended here */
#define REFUSED 4	/* a map full */
#define BUF 5		/* the buffer the dones count into (pgprobe flips it) */
#define STOPPED 6	/* the guard stopped the capture: nothing more is recorded */
SCALARS(7);

static __always_inline __u64 scalar(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&scalars, &which);
	return v ? *v : 0;
}

/* Before on_wait_start in the object: attached first, so no wait starts without it. */
SEC("usdt")
int BPF_USDT(on_wait_done, void *tranche, int mode)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, zero = 0;
	__u64 *t0 = bpf_map_lookup_elem(&started, &tid);

	if (!t0 || scalar(STOPPED))
		return 0;
	__u64 ns = bpf_ktime_get_ns() - *t0;
	bpf_map_delete_elem(&started, &tid);
	BUMP(FIRES);
	BUMP(WAITS);
	struct wait_key k = {};
	k.pid = by_pid ? (__u32)(id >> 32) : 0;
	k.mode = (__u32)mode;
	k.buf = scalar(BUF) & 1;
	k.cpu = bpf_get_smp_processor_id();
	bpf_probe_read_user_str(k.tranche, sizeof(k.tranche), tranche);
	struct wait_val *v = bpf_map_lookup_elem(&waits, &k);
	if (!v) {
		struct wait_val *blank = bpf_map_lookup_elem(&empty, &zero);
		if (blank)
			bpf_map_update_elem(&waits, &k, blank, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&waits, &k);
		if (!v) {
			BUMP(REFUSED);
			return 0;
		}
	}
	/* atomic adds: another task preempting this one on its CPU may add to the same key */
	__sync_fetch_and_add(&v->count, 1);
	__sync_fetch_and_add(&v->total, ns);
	__sync_fetch_and_add(&v->hist[log2_slot(ns)], 1);
	if (ns > v->max)
		v->max = ns;
	return 0;
}

SEC("usdt")
int BPF_USDT(on_wait_start, void *tranche, int mode)
{
	__u64 id = bpf_get_current_pid_tgid(), now = bpf_ktime_get_ns();
	__u32 tid = (__u32)id;

	if (!ours(id >> 32) || scalar(STOPPED))
		return 0;
	BUMP(FIRES);
	if (bpf_map_lookup_elem(&started, &tid))
		BUMP(UNFINISHED + (scalar(BUF) & 1));
	if (bpf_map_update_elem(&started, &tid, &now, BPF_ANY))
		BUMP(REFUSED);
	return 0;
}
