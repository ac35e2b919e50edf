// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* Capability probe, run when a model is opened: proves that this process can load a
 * SEC("syscall") program, run it with test_run, call bpf_loop and use a BPF arena. */
#include "common.h"

/* A GPL-compatible licence: the arena kfuncs and BPF helpers used here are GPL-only. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

QB_ARENA(probe_arena); /* one page */

struct probe_args {
	u64 buf;   /* in: arena address of 64 u32 written by user space */
	u32 n;     /* in: how many to sum (<= 64) */
	u32 pad;
	s64 loop;  /* out: bpf_loop's return value (iterations or -errno) */
	u64 sum;   /* out: sum of buf[0..n] */
};

struct probe_ctx {
	const u32 __arena *buf;
	u64 sum;
};

static long add_one(u64 i, struct probe_ctx *c)
{
	if (i >= 64)
		return 1;
	c->sum += c->buf[i];
	return 0;
}

SEC("syscall")
int probe(struct probe_args *a)
{
	struct probe_ctx c = { .buf = ARENA_PTR(const u32, a->buf), .sum = 0 };
	long r;

	USE_ARENA(probe_arena);
	r = bpf_loop(a->n, add_one, &c, 0);
	a->loop = (int)r; /* bpf_loop's error is a u32: sign-extend it */
	a->sum = c.sum;
	return 0;
}
