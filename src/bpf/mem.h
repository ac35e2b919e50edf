// SPDX-License-Identifier: MIT OR GPL-2.0-only
/* The memory layer: how a program reaches the memory it shares with user space, in one of two
 * builds of the same source (docs/plans/array-layer.md, issue 35).
 *
 * - The arena build (default): one BPF arena map (Linux >= 6.9). An address is a user-space
 *   address of the arena's mmap, and a pointer to it is an __arena pointer: every access works,
 *   a page never touched reads 0.
 * - The array build (-DQB_ARRAY_LAYER, -mcpu=v3: what Linux 6.1's verifier takes): one
 *   BPF_MAP_TYPE_ARRAY with BPF_F_MMAPABLE whose elements of 2^qb_mem_shift bytes user space
 *   mmaps contiguously at qb_mem_base. An address is still a user-space address of that mmap
 *   (so plans, twins and ctx structs hold the same integers in both builds); a program turns it
 *   into (element, offset) with one lookup, and an access that would cross an element's end,
 *   or lie outside the map, is refused (NULL / nonzero), never wrapped. User space lays out
 *   every buffer the programs index so that it does not cross an element (kernel/memory.rs).
 *
 * The primitives, the same in both builds:
 *   QB                   the qualifier of a pointer into the shared memory
 *   QB_MEM(map)          declares the shared-memory map
 *   QB_MEM_USE(map)      ties a program to it (the arena build needs the reference)
 *   QB_SPAN(T, map, a, room)  a T pointer to the `room` bytes at address a (room a constant,
 *                        at most one element), or NULL in the array build when they cross an
 *                        element's end or lie outside the map; never NULL in the arena build
 *   QB_SPAN_OK(p)        whether a QB_SPAN pointer may be used: p != NULL in the array build, 1 in
 *                        the arena build (no test: a branch in a walked loop's exit costs the
 *                        verifier once per iteration)
 *   QB_LD(T, map, a, dst)     *dst = the T at a: 0, or -1 (dst untouched) where QB_SPAN is NULL
 *   QB_ST(T, map, a, v)       the T at a = v: 0, or -1 (nothing written) likewise
 *   QB_VEC_T(T) v = QB_VEC(T, map, a, n)   a vector of n T at address a, for QB_IX; QB_VEC_OK(v)
 *                        is 0 in the array build when the n T cross an element's end or lie
 *                        outside the map (checked once, before any access), 1 otherwise
 *   QB_IX(T, v, i)       element i (< n) of the vector, an lvalue. The array build masks the
 *                        offset into the element, which is what the verifier proves in bounds;
 *                        for i < n it changes nothing
 *   QB_AT(T, v, off, bytes)   a T pointer to the `bytes` bytes (a constant) at byte off of the
 *                        vector, for a piece (a block of columns) that the walk reads or writes
 *                        through fixed offsets; the array build clamps it inside the element,
 *                        which for a piece of a checked vector changes nothing
 *   QB_CAST(p)           before asm reads through p: the arena build's cast to an arena pointer
 *   QB_SX32(r)           asm text that sign-extends operand r from 32 bits (movsx in the arena
 *                        build, cpu v4; two shifts in the array build)
 *   QB_EACH_FN(fn, T) and QB_EACH(fn, n, c)   runs `static __always_inline int fn(T *c, u32 i)`
 *                        for i = 0 .. n-1 until it returns nonzero: a can_loop loop in the
 *                        arena build, bpf_loop (Linux 5.17) in the array build, which has no
 *                        may_goto or open-coded iterators. QB_EACH_FN defines the array build's
 *                        callback and goes after fn. QB_EACH gives 0, or -1 when the array
 *                        build's bpf_loop refused n
 */
#pragma once
#include "common.h"

#ifndef QB_ARRAY_LAYER

#define QB __arena
#define QB_MEM(map) QB_ARENA(map)
#define QB_MEM_USE(map) USE_ARENA(map)
#define QB_SPAN(T, map, a, room) ARENA_PTR(T, a)
#define QB_SPAN_OK(p) 1

#define QB_VEC_T(T) T QB *
#define QB_VEC(T, map, a, n) ARENA_PTR(T, a)
#define QB_VEC_OK(v) 1
#define QB_IX(T, v, i) (((T QB *)(v))[i])

/* QB_SX32(r): asm that sign-extends operand r from 32 bits (movsx: cpu v4, Linux 6.6) */
#define QB_SX32(r) "%[" #r "] = (s32)%[" #r "]"
#define QB_AT(T, v, off, bytes) ((T QB *)((char QB *)(v) + (off)))
#define QB_CAST(p) ARENA_CAST(p)

#define QB_EACH_FN(fn, T)
#define QB_EACH(fn, n, c)                                                                   \
	({                                                                                  \
		for (u32 i_ = 0; i_ < (n) && can_loop; i_++)                               \
			if (fn((c), i_))                                                    \
				break;                                                      \
		0;                                                                          \
	})

#else /* QB_ARRAY_LAYER */

#define QB
/* Set by user space before load (then frozen, so the verifier knows them as constants): where
 * element 0 is mapped, and log2 of the element size (the map's value_size). */
const volatile u64 qb_mem_base = 0;
const volatile u32 qb_mem_shift = 12;

/* The map's value_size and max_entries are set by user space before load; no BTF value type, as
 * its size is not known here. */
#define QB_MEM(map)                                                                         \
	struct {                                                                            \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                           \
		__uint(map_flags, BPF_F_MMAPABLE);                                          \
		__uint(key_size, sizeof(u32));                                              \
		__uint(value_size, 4096);                                                   \
		__uint(max_entries, 1);                                                     \
	} map SEC(".maps")
#define QB_MEM_USE(map) ((void)0)

/* A vector: its element's memory (NULL when refused) and its offset inside it. */
struct qb_vec {
	char *e;
	u64 in;
};

/* The vector of `bytes` bytes at address a, or e = NULL when it crosses an element's end or lies
 * outside the map (bytes is at most 2^63: the sum below cannot wrap). */
static __always_inline struct qb_vec qb_vec(void *map, u64 a, u64 bytes)
{
	u64 size = 1ull << qb_mem_shift;
	u64 off = a - qb_mem_base;
	struct qb_vec v = { NULL, off & (size - 1) };
	u32 key;

	if ((off >> qb_mem_shift) > 0xffffffffull || bytes > size || v.in > size - bytes)
		return v;
	key = off >> qb_mem_shift;
	v.e = bpf_map_lookup_elem(map, &key);
	return v;
}

/* The `room` bytes at user address a, inside one element of `map`, or NULL (room a constant:
 * the vector's check against element size - room is what lets the verifier prove every access
 * through the pointer within [0, room)). */
static __always_inline void *qb_span(void *map, u64 a, u64 room)
{
	struct qb_vec v = qb_vec(map, a, room);

	return v.e ? v.e + v.in : NULL;
}

#define QB_SPAN(T, map, a, room) ((T *)qb_span(&(map), (u64)(a), (room)))
#define QB_SPAN_OK(p) ((p) != NULL)

#define QB_VEC_T(T) struct qb_vec
#define QB_VEC(T, map, a, n) qb_vec(&(map), (u64)(a), (u64)(n) * sizeof(T))
#define QB_VEC_OK(v) ((v).e != NULL)
/* the mask keeps a T-aligned offset inside the element: vectors start T-aligned (user space
 * places them on pages), so for i < n it is the offset itself */
#define QB_IX(T, v, i)                                                                      \
	(*(T *)((v).e + (((v).in + (u64)(i) * sizeof(T)) & ((1ull << qb_mem_shift) - sizeof(T)))))

/* The `bytes` bytes at byte `off` of vector v, `bytes` a constant: clamped to end in v's element,
 * which changes nothing for a piece of a checked vector and lets the verifier prove it. */
static __always_inline void *qb_at(struct qb_vec v, u64 off, u64 bytes)
{
	u64 o = v.in + off, last = (1ull << qb_mem_shift) - bytes;

	return v.e + (o < last ? o : last);
}

#define QB_AT(T, v, off, bytes) ((T *)qb_at((v), (off), (bytes)))
#define QB_CAST(p) ((void)0)

/* 6.1 has no movsx: two shifts */
#define QB_SX32(r) "%[" #r "] <<= 32\n\t%[" #r "] s>>= 32"

/* the callback returns 0 or 1, as the verifier demands: the empty asm hides from clang what it
 * knows of fn's result (a global function's 0 or 1 is, to the verifier, any value) */
#define QB_EACH_FN(fn, T)                                                                   \
	static int fn##_cb(u64 i, void *c)                                                  \
	{                                                                                   \
		int r_ = fn((T *)c, (u32)i);                                                \
		asm volatile("" : "+r"(r_));                                                \
		return r_ != 0;                                                             \
	}
#define QB_EACH(fn, n, c) (bpf_loop((n), fn##_cb, (c), 0) < 0 ? -1 : 0)

#endif /* QB_ARRAY_LAYER */

/* One checked access: `what` runs on p_, a T pointer to `a`, when `a` holds a whole T; 0 then,
 * -1 when it does not (nothing read or written). */
#define QB_DO(T, map, a, what)                                                              \
	({                                                                                  \
		T QB *p_ = QB_SPAN(T, map, a, sizeof(T));                                   \
		int r_ = -1;                                                                \
		if (p_) {                                                                   \
			what;                                                               \
			r_ = 0;                                                             \
		}                                                                           \
		r_;                                                                         \
	})

#define QB_LD(T, map, a, dst) QB_DO(T, map, a, *(dst) = *p_)
#define QB_ST(T, map, a, v) QB_DO(T, map, a, *p_ = (v))
