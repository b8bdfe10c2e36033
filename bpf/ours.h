/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ours.h - which processes a compiled object counts: the cluster's (its postmaster and the
 *          postmaster's children), or one process, by the `const volatile` globals pgprobe
 *          sets before the load (the scripts' POSTMASTER_PID and ONLY_PID parameters).
 *          For objects whose programs run in the process they count (a sample, a uprobe);
 *          waits.bpf.c, which judges another task at each switch, has its own.
 * Part of pgprobe.
 */
#ifndef PGPROBE_OURS_H
#define PGPROBE_OURS_H

typedef int pid_t;

struct task_struct {
	pid_t pid;
	pid_t tgid;
	struct task_struct *real_parent;
} __attribute__((preserve_access_index));

const volatile pid_t postmaster = 0;	/* the postmaster and its children */
const volatile pid_t only_pid = 0;	/* only this pid (0: all) */

/* whether the current process is one to count; tgid: its pid */
static __always_inline _Bool ours(pid_t tgid)
{
	if (only_pid)
		return tgid == only_pid;
	if (tgid == postmaster)
		return 1;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	return BPF_CORE_READ(task, real_parent, tgid) == postmaster;
}

#endif
