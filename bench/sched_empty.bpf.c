// SPDX-License-Identifier: GPL-2.0
/*
 * sched_empty.bpf.c - an empty program on the raw BTF tracepoint sched_switch: the floor
 *                     of bpf/waits.bpf.c's cost (the tracepoint's dispatch to a program,
 *                     nothing in it), attached the same way, for bench/toggle.py.
 *
 * USAGE: not run by hand: bench/toggle.py builds it (scripts/build-bpf) and attaches it
 *   in turn with bpf/build/waits.bpf.o and with nothing.
 *
 * EXAMPLE:
 *   # .venv/bin/python -m bench.toggle --minutes 10
 */

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

typedef _Bool bool;
struct task_struct;

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	return 0;
}
