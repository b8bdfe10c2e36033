// SPDX-License-Identifier: GPL-2.0
/*
 * clog_reads.bpf.c - bpf/clog_reads_uprobe.bt compiled: SLRU pages read from disk, per
 *                    PostgreSQL process and SLRU, counted where the server counts them.
 *
 * A uprobe on pgstat_count_slru_page_read(int slru_idx), which the server calls for each
 * SLRU page it reads from disk (pg_stat_slru's blks_read): the same fires, filter and maps
 * as the script, in a program pgprobe loads itself (no bpftrace process; its uprobes and
 * maps ready in milliseconds). The index is the SLRU's row in the server's pg_stat_slru;
 * pgprobe names it (pgprobe/tools/clog_reads/probe.py). The stacks of the reads stay in
 * bpf/clog_reads_uprobe_stacks.bt (`clog-reads --stacks`).
 *
 * USAGE: not run by hand: scripts/build-bpf compiles it into bpf/build/clog_reads.bpf.o,
 *   and `pgprobe clog-reads` (its default source; triage and serve too) loads it with the
 *   system's libbpf when it is built and loads here, else runs bpf/clog_reads_uprobe.bt
 *   (the form to read and run by hand). Its parameters are the script's $2-$4 and $7-$9
 *   as `const volatile` globals below; pgprobe attaches the program to the server binary.
 *
 * EXAMPLE:
 *   # scripts/build-bpf && pgprobe clog-reads -d 10
 *
 * Part of pgprobe.
 */

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "ours.h"
#include "scalars.h"

char LICENSE[] SEC("license") = "GPL";

/* clog_reads_uprobe.bt's positional parameters ($2 postmaster, $4 only_pid: ours.h) */
const volatile __u64 index_mask = 0;	/* $3: bit i: count SLRU row i (0: every SLRU) */
const volatile __u64 be_addr = 0;	/* $7: &MyBEEntry (0: no statement read) */
const volatile __u64 state_off = 0;	/* $8: offsetof(PgBackendStatus, st_state) */
const volatile __u64 qid_off = 0;	/* $9: offsetof(PgBackendStatus, st_query_id) */

struct read_key {
	__u32 pid;
	__u32 index;
};

struct query_key {
	__u32 pid;
	__u32 index;
	__u32 state;
	__u32 pad;
	__s64 query_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct read_key);
	__type(value, __u64);
} reads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct query_key);
	__type(value, __u64);
} qreads SEC(".maps");

/* scalars: FIRES (every fire, counted or not: each costs a trap), REFUSED (a map full) */
#define FIRES 0
#define REFUSED 1
SCALARS(2);

static void count(void *map, void *key)
{
	__u64 one = 1, *n = bpf_map_lookup_elem(map, key);

	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	if (!bpf_map_update_elem(map, key, &one, BPF_NOEXIST))
		return;
	n = bpf_map_lookup_elem(map, key);	/* made meanwhile on another CPU? */
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		BUMP(REFUSED);	/* the map is full */
}

SEC("uprobe")
int BPF_KPROBE(on_slru_read, int slru_idx)
{
	BUMP(FIRES);
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!ours(tgid))
		return 0;
	if (index_mask && (slru_idx < 0 || slru_idx >= 64 || !((index_mask >> slru_idx) & 1)))
		return 0;
	struct read_key key = { tgid, slru_idx };
	count(&reads, &key);
	if (be_addr) {
		/* the statement this backend runs: the probe fires in the backend itself */
		struct query_key q = { tgid, slru_idx, 0, 0, 0 };
		__u64 entry = 0;
		if (!bpf_probe_read_user(&entry, sizeof(entry), (void *)be_addr) && entry) {
			bpf_probe_read_user(&q.state, sizeof(q.state), (void *)(entry + state_off));
			bpf_probe_read_user(&q.query_id, sizeof(q.query_id), (void *)(entry + qid_off));
			q.state &= 0xff;
		}
		count(&qreads, &q);
	}
	return 0;
}
