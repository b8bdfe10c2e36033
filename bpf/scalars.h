/* SPDX-License-Identifier: GPL-2.0 */
/*
 * scalars.h - the `scalars` map of pgprobe's compiled objects: an array of N __u64 that
 *             pgprobe reads by index (a window's start, counts of what was refused or lost).
 * Part of pgprobe.
 */
#ifndef PGPROBE_SCALARS_H
#define PGPROBE_SCALARS_H

#define SCALARS(N)                              \
	struct {                                \
		__uint(type, BPF_MAP_TYPE_ARRAY); \
		__uint(max_entries, N);         \
		__type(key, __u32);             \
		__type(value, __u64);           \
	} scalars SEC(".maps")

/* one more in scalars[which] (after SCALARS(N) declared the map) */
#define BUMP(which)                                                 \
	do {                                                        \
		__u32 _slot = (which);                              \
		__u64 *_n = bpf_map_lookup_elem(&scalars, &_slot);  \
		if (_n)                                             \
			__sync_fetch_and_add(_n, 1);                \
	} while (0)

#endif
