// SPDX-License-Identifier: GPL-2.0
/*
 * profile.bpf.c - bpf/profile.bt's CPU sampler, compiled: the on-CPU stacks of a
 *                 PostgreSQL cluster's processes, sampled HZ times a second per CPU.
 *
 * The same samples as the script (its filter, its stacks, its statement read); what
 * differs is where they are counted. The script counts (pid, stack) keys in the kernel,
 * with stack ids from a stack map of 131,072 buckets (128 MiB of kernel memory, a new
 * stack refused when its bucket holds another). Here each sample of a target is one
 * record in a ring buffer (its pid, its statement, its frames), and pgprobe counts them
 * (pgprobe/tools/profiling/compiled.py): no stack map, nothing refused by a collision, and
 * a full ring buffer is counted (scalar LOST), never silent.
 *
 * Attach point: a perf event per CPU (software cpu-clock, HZ a second), opened by pgprobe
 * (pgprobe/engines/libbpf.py's attach_perf_events) and given to this program.
 *
 * USAGE: not run by hand: scripts/build-bpf compiles it into bpf/build/profile.bpf.o, and
 *   `pgprobe flame`, `hot` (and top's CPU functions) load it with the system's libbpf when
 *   it is built and loads here, else run bpf/profile.bt (the form to read and run by hand).
 *   Its parameters are profile.bt's $2, $3, $4, $6-$8 as `const volatile` globals below.
 *
 * EXAMPLE:
 *   # scripts/build-bpf && pgprobe flame -d 5 --unwind fp > out.svg
 *
 * Part of pgprobe.
 */

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "ours.h"
#include "scalars.h"


char LICENSE[] SEC("license") = "GPL";

/* profile.bt's positional parameters ($2 postmaster, $3 only_pid: ours.h) */
const volatile __u32 kernel_stacks = 0;	/* $4: kernel stacks too */
const volatile __u64 be_addr = 0;	/* $6: &MyBEEntry (0: no statement read) */
const volatile __u64 state_off = 0;	/* $7: offsetof(PgBackendStatus, st_state) */
const volatile __u64 qid_off = 0;	/* $8: offsetof(PgBackendStatus, st_query_id) */

#define MAX_FRAMES 127	/* the kernel's default kernel.perf_event_max_stack, as the script */

/*
 * One sample. The user frames come first: without kernel stacks a record ends after its
 * own user frames (most stacks are far shorter than 127 frames).
 */
struct sample {
	__u32 pid;
	__u32 state;		/* st_state (0: no status entry, or not read) */
	__s64 query_id;		/* st_query_id, signed as pg_stat_statements shows it */
	__u32 ubytes;		/* bytes of user frames (0: the walk failed) */
	__u32 kbytes;		/* bytes of kernel frames (0: user mode, or not asked) */
	__u64 ustack[MAX_FRAMES];
	__u64 kstack[MAX_FRAMES];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);	/* 8 MiB: ~1 s of 10 kHz on 2 CPUs, drained every 0.2 s */
} samples SEC(".maps");

/* a sample is built here, not on the 512-byte stack */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample);
} scratch SEC(".maps");

/* scalars: SAMPLED (every sample of a target), LOST (no room in the ring buffer) */
#define SAMPLED 0
#define LOST 1
SCALARS(2);

SEC("perf_event")
int on_sample(struct bpf_perf_event_data *ctx)
{
	if (!ours(bpf_get_current_pid_tgid() >> 32))
		return 0;
	__u32 zero = 0;
	struct sample *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;
	BUMP(SAMPLED);
	s->pid = bpf_get_current_pid_tgid() >> 32;
	s->state = 0;
	s->query_id = 0;
	if (be_addr) {
		/* the statement the backend runs: its status entry, as pg_stat_activity shows it */
		__u64 entry = 0;
		if (!bpf_probe_read_user(&entry, sizeof(entry), (void *)be_addr) && entry) {
			__u32 st = 0;
			__s64 q = 0;
			bpf_probe_read_user(&st, sizeof(st), (void *)(entry + state_off));
			bpf_probe_read_user(&q, sizeof(q), (void *)(entry + qid_off));
			s->state = st & 0xff;
			s->query_id = q;
		}
	}
	long u = bpf_get_stack(ctx, s->ustack, sizeof(s->ustack), BPF_F_USER_STACK);
	s->ubytes = u > 0 ? u : 0;
	s->kbytes = 0;
	__u64 size = sizeof(*s);
	if (kernel_stacks) {
		long k = bpf_get_stack(ctx, s->kstack, sizeof(s->kstack), 0);
		s->kbytes = k > 0 ? k : 0;
	} else {
		size = __builtin_offsetof(struct sample, ustack) + (s->ubytes & 0x3ff);
		if (size > sizeof(*s))
			size = sizeof(*s);
	}
	if (bpf_ringbuf_output(&samples, s, size, 0))
		BUMP(LOST);
	return 0;
}
