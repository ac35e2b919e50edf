// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The BPF multiply peak: how many 64-bit multiplies per second the JIT-compiled code of this
 * machine can issue, the floor under every kernel here (each of which needs one multiply per
 * one, two or four products). Six independent chains, c_j <- c_j * x, so that the multiplies
 * overlap (a 64-bit multiply takes three cycles and issues one per cycle on current x86 cores);
 * the chains' xor comes back so that the work cannot be skipped, and src/kernel/floor.rs
 * checks it against its twin, (j + 1) * x^(2 n) mod 2^64. */
#include "common.h"

/* A GPL-compatible licence: the arena kfuncs and BPF helpers used here are GPL-only. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Iterations per run: 12 multiplies each, 48 M per run (about 20 ms), far below can_loop's
 * budget of 8 M iterations. */
#define MUL_PEAK_ITERS_MAX 4000000

struct mul_peak_args {
	u64 x;     /* in: the multiplier */
	u32 iters; /* in: iterations of twelve multiplies, <= MUL_PEAK_ITERS_MAX */
	u32 pad;
	u64 out;   /* out: c_0 ^ ... ^ c_5 */
};

/* Each chain twice: twelve multiplies, no loads, no spills (nine registers with x, i, n). */
#define MUL12                                                                             \
	"%[c0] *= %[x]\n\t%[c1] *= %[x]\n\t%[c2] *= %[x]\n\t%[c3] *= %[x]\n\t"            \
	"%[c4] *= %[x]\n\t%[c5] *= %[x]\n\t%[c0] *= %[x]\n\t%[c1] *= %[x]\n\t"            \
	"%[c2] *= %[x]\n\t%[c3] *= %[x]\n\t%[c4] *= %[x]\n\t%[c5] *= %[x]"

SEC("syscall")
int mul_peak(struct mul_peak_args *a)
{
	u64 x = a->x, c0 = 1, c1 = 2, c2 = 3, c3 = 4, c4 = 5, c5 = 6;
	u32 n = a->iters, i;

	if (n > MUL_PEAK_ITERS_MAX)
		return 1;
	for (i = 0; i < n && can_loop; i++)
		asm volatile(MUL12
			     : [c0] "+r"(c0), [c1] "+r"(c1), [c2] "+r"(c2), [c3] "+r"(c3),
			       [c4] "+r"(c4), [c5] "+r"(c5)
			     : [x] "r"(x));
	if (i < n)
		return 2; /* can_loop's budget ran out: not the work asked for */
	a->out = c0 ^ c1 ^ c2 ^ c3 ^ c4 ^ c5;
	return 0;
}
