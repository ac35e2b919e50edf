// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The memory layer's selftest (mem.h), built twice like every object that shares memory: over
 * the arena (mem.bpf.o) and over array maps (mem_array.bpf.o). User space fills the memory, hands
 * over addresses, and compares what the program read, wrote and refused with what it expects
 * (kernel/memory.rs): each address's u64, a 64-byte span's u32 sum, and a store that must land
 * on exactly the bytes user space addressed. */
#include "mem.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

QB_MEM(mem);

#define MEM_PROBES 8
#define MEM_SPAN 64 /* bytes summed through one QB_SPAN */
#define MEM_VECS 2
#define MEM_VEC_MAX (1 << 20)

struct mem_args {
	u64 addr[MEM_PROBES]; /* in: addresses (any value: outside the map is refused) */
	u32 n;                /* in: how many of addr to use (<= MEM_PROBES) */
	u32 pad;
	u64 flip;             /* in: each u64 read is stored back XORed with this */
	u64 val[MEM_PROBES];  /* out: the u64 QB_LD read at addr[i] (0 when refused) */
	u64 sum[MEM_PROBES];  /* out: sum of the 16 u32 of the span at addr[i] (0 when refused) */
	s32 ld[MEM_PROBES];   /* out: QB_LD's answer (0 read, -1 refused) */
	s32 st[MEM_PROBES];   /* out: QB_ST's answer */
	s32 span[MEM_PROBES]; /* out: 1 when QB_SPAN gave the 64 bytes, 0 when it refused */
	u32 pad2;
	u64 vec[MEM_VECS];    /* in: vectors of u32, walked with QB_EACH and QB_IX */
	u32 vec_n[MEM_VECS];  /* in: their lengths (<= MEM_VEC_MAX) */
	s32 vec_ok[MEM_VECS]; /* out: 1 walked, 0 refused by QB_VEC, -1 by QB_EACH */
	u64 vec_sum[MEM_VECS]; /* out: the sum of the vector's u32, each then stored as 3x + 1 */
};

/* One step of a vector walk: the state QB_EACH hands every step. */
struct mem_walk {
	QB_VEC_T(u32) v;
	u64 sum;
};

static __always_inline int mem_walk_step(struct mem_walk *c, u32 i)
{
	u32 x = QB_IX(u32, c->v, i);

	c->sum += x;
	QB_IX(u32, c->v, i) = x * 3 + 1;
	return 0;
}
QB_EACH_FN(mem_walk_step, struct mem_walk)

/* The ctx, copied: clang's indexing would move the ctx pointer, and 6.1's verifier refuses the
 * stack writes at a variable offset that a copy on the stack would take. */
static struct mem_args a;

SEC("syscall")
int mem_selftest(struct mem_args *ctx)
{
	u32 n;

	a = *ctx;
	n = a.n;
	QB_MEM_USE(mem);
	if (n > MEM_PROBES)
		return -1;
	/* unrolled: 6.1's verifier cannot bound an index whose loop ends at the unknown n */
#pragma unroll
	for (u32 i = 0; i < MEM_PROBES; i++) {
		u64 at = a.addr[i], v = 0, s = 0;
		const u32 QB *p;

		if (i >= n)
			break;
		a.ld[i] = QB_LD(u64, mem, at, &v);
		a.val[i] = v;
		a.st[i] = a.ld[i] ? -1 : QB_ST(u64, mem, at, v ^ a.flip);
		p = QB_SPAN(const u32, mem, at, MEM_SPAN);
		a.span[i] = p != NULL;
		if (p)
			for (u32 j = 0; j < MEM_SPAN / 4; j++)
				s += p[j];
		a.sum[i] = s;
	}
#pragma unroll
	for (u32 k = 0; k < MEM_VECS; k++) {
		struct mem_walk c = { QB_VEC(u32, mem, a.vec[k], a.vec_n[k]), 0 };

		if (a.vec_n[k] > MEM_VEC_MAX)
			return -1;
		a.vec_ok[k] = 0;
		if (QB_VEC_OK(c.v))
			a.vec_ok[k] = QB_EACH(mem_walk_step, a.vec_n[k], &c) ? -1 : 1;
		a.vec_sum[k] = c.sum;
	}
	*ctx = a;
	return 0;
}
