/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hist.h - the log2 histogram slots of pgprobe's compiled objects, as bpftrace's hist():
 *          slot 0 holds 0, slot k 2^(k-1) .. 2^k - 1, the last slot all longer.
 * Part of pgprobe.
 */
#ifndef PGPROBE_HIST_H
#define PGPROBE_HIST_H

#define HIST_SLOTS 48	/* 2^47 ns: 39 hours */

static __always_inline __u32 log2_slot(__u64 v)
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
	return slot < HIST_SLOTS ? slot : HIST_SLOTS - 1;
}

#endif
